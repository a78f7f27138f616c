// SPDX-License-Identifier: Apache-2.0 OR MIT
//! The in-buffer of [`crate::Op::TensorMapEncode`]: the arguments of `cuTensorMapEncodeTiled`,
//! `cuTensorMapEncodeIm2col`, `cuTensorMapEncodeIm2colWide` or `cuTensorMapReplaceAddress`,
//! which the host's driver turns into the 128-byte `CUtensorMap` that TMA instructions read (its
//! encoding is the driver's own). The global address is a device address, the same number in
//! the guest and on the host.
//!
//! Layout, little-endian: kind u32 @0, data type u32 @4, rank u32 @8, interleave u32 @12,
//! swizzle u32 @16, L2 promotion u32 @20, out-of-bounds fill u32 @24, channels per pixel u32
//! @28, pixels per column u32 @32, im2col wide mode u32 @36, global address u64 @40, global
//! dimensions [u64; 5] @48, global strides [u64; 4] @88, box dimensions [u32; 5] @120, element
//! strides [u32; 5] @140, pixel box lower corner [i32; 3] @160, upper corner [i32; 3] @172
//! (the wide form's two widths in element 0 of each), then the tensor map to change
//! ([u8; 128] @184, `TENSOR_MAP_REPLACE_ADDRESS` only).

/// Bytes of a `CUtensorMap`.
pub const TENSOR_MAP_SIZE: usize = 128;
/// Bytes of an encoded [`TensorMapRequest`].
pub const TENSOR_MAP_REQUEST_SIZE: usize = 184 + TENSOR_MAP_SIZE;
/// Most dimensions a tensor map has.
pub const TENSOR_MAP_MAX_RANK: u32 = 5;

/// `cuTensorMapEncodeTiled`.
pub const TENSOR_MAP_TILED: u32 = 0;
/// `cuTensorMapEncodeIm2col`.
pub const TENSOR_MAP_IM2COL: u32 = 1;
/// `cuTensorMapEncodeIm2colWide`.
pub const TENSOR_MAP_IM2COL_WIDE: u32 = 2;
/// `cuTensorMapReplaceAddress`.
pub const TENSOR_MAP_REPLACE_ADDRESS: u32 = 3;

/// One tensor map request. Fields a kind does not use are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapRequest {
    /// `TENSOR_MAP_*`.
    pub kind: u32,
    /// `CUtensorMapDataType`.
    pub data_type: u32,
    /// Dimensions, 1 to 5 (3 to 5 for im2col).
    pub rank: u32,
    /// `CUtensorMapInterleave`.
    pub interleave: u32,
    /// `CUtensorMapSwizzle`.
    pub swizzle: u32,
    /// `CUtensorMapL2promotion`.
    pub l2_promotion: u32,
    /// `CUtensorMapFloatOOBfill`.
    pub oob_fill: u32,
    /// Im2col: channels per pixel.
    pub channels_per_pixel: u32,
    /// Im2col: pixels per column.
    pub pixels_per_column: u32,
    /// Im2col wide: `CUtensorMapIm2ColWideMode`.
    pub wide_mode: u32,
    /// The tensor's device address.
    pub address: u64,
    /// Elements per dimension (`rank` used).
    pub global_dim: [u64; 5],
    /// Bytes between elements of dimensions 1.. (`rank - 1` used).
    pub global_strides: [u64; 4],
    /// Tiled: the box's elements per dimension.
    pub box_dim: [u32; 5],
    /// Elements stepped per dimension.
    pub element_strides: [u32; 5],
    /// Im2col: the pixel box's lower corner (`rank - 2` used; wide: its width in [0]).
    pub lower: [i32; 3],
    /// Im2col: its upper corner.
    pub upper: [i32; 3],
    /// Replace address: the tensor map to change.
    pub map: [u8; TENSOR_MAP_SIZE],
}

impl Default for TensorMapRequest {
    fn default() -> Self {
        Self {
            kind: 0,
            data_type: 0,
            rank: 0,
            interleave: 0,
            swizzle: 0,
            l2_promotion: 0,
            oob_fill: 0,
            channels_per_pixel: 0,
            pixels_per_column: 0,
            wide_mode: 0,
            address: 0,
            global_dim: [0; 5],
            global_strides: [0; 4],
            box_dim: [0; 5],
            element_strides: [0; 5],
            lower: [0; 3],
            upper: [0; 3],
            map: [0; TENSOR_MAP_SIZE],
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32
}

impl TensorMapRequest {
    /// The encoding.
    pub fn encode(&self) -> [u8; TENSOR_MAP_REQUEST_SIZE] {
        let mut b = [0u8; TENSOR_MAP_REQUEST_SIZE];
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        let words = [
            self.kind,
            self.data_type,
            self.rank,
            self.interleave,
            self.swizzle,
            self.l2_promotion,
            self.oob_fill,
            self.channels_per_pixel,
            self.pixels_per_column,
            self.wide_mode,
        ];
        for (i, w) in words.iter().enumerate() {
            put(4 * i, &w.to_le_bytes());
        }
        put(40, &self.address.to_le_bytes());
        for (i, v) in self.global_dim.iter().enumerate() {
            put(48 + 8 * i, &v.to_le_bytes());
        }
        for (i, v) in self.global_strides.iter().enumerate() {
            put(88 + 8 * i, &v.to_le_bytes());
        }
        for (i, v) in self.box_dim.iter().enumerate() {
            put(120 + 4 * i, &v.to_le_bytes());
        }
        for (i, v) in self.element_strides.iter().enumerate() {
            put(140 + 4 * i, &v.to_le_bytes());
        }
        for (i, v) in self.lower.iter().enumerate() {
            put(160 + 4 * i, &v.to_le_bytes());
        }
        for (i, v) in self.upper.iter().enumerate() {
            put(172 + 4 * i, &v.to_le_bytes());
        }
        put(184, &self.map);
        b
    }

    /// Decodes `b` (exactly `TENSOR_MAP_REQUEST_SIZE` bytes) and checks the kind and the rank
    /// (1 to 5; 3 to 5 for im2col, whose pixel box has `rank - 2` dimensions). The values
    /// themselves are the host driver's to check.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != TENSOR_MAP_REQUEST_SIZE {
            return None;
        }
        let mut r = Self {
            kind: u32_at(b, 0),
            data_type: u32_at(b, 4),
            rank: u32_at(b, 8),
            interleave: u32_at(b, 12),
            swizzle: u32_at(b, 16),
            l2_promotion: u32_at(b, 20),
            oob_fill: u32_at(b, 24),
            channels_per_pixel: u32_at(b, 28),
            pixels_per_column: u32_at(b, 32),
            wide_mode: u32_at(b, 36),
            address: u64_at(b, 40),
            ..Self::default()
        };
        for i in 0..5 {
            r.global_dim[i] = u64_at(b, 48 + 8 * i);
            r.box_dim[i] = u32_at(b, 120 + 4 * i);
            r.element_strides[i] = u32_at(b, 140 + 4 * i);
        }
        for i in 0..4 {
            r.global_strides[i] = u64_at(b, 88 + 8 * i);
        }
        for i in 0..3 {
            r.lower[i] = i32::from_le_bytes(u32_at(b, 160 + 4 * i).to_le_bytes());
            r.upper[i] = i32::from_le_bytes(u32_at(b, 172 + 4 * i).to_le_bytes());
        }
        r.map.copy_from_slice(&b[184..]);
        let ranks = match r.kind {
            TENSOR_MAP_TILED => 1..=TENSOR_MAP_MAX_RANK,
            TENSOR_MAP_IM2COL | TENSOR_MAP_IM2COL_WIDE => 3..=TENSOR_MAP_MAX_RANK,
            TENSOR_MAP_REPLACE_ADDRESS => 0..=TENSOR_MAP_MAX_RANK,
            _ => return None,
        };
        ranks.contains(&r.rank).then_some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_ranks_are_checked() {
        let mut r = TensorMapRequest {
            kind: TENSOR_MAP_IM2COL,
            data_type: 9,
            rank: 4,
            swizzle: 3,
            channels_per_pixel: 64,
            pixels_per_column: 128,
            address: 0x7f00_0000_0000,
            global_dim: [64, 32, 32, 8, 0],
            global_strides: [128, 4096, 131072, 0],
            element_strides: [1, 1, 1, 1, 0],
            lower: [-1, -1, 0],
            upper: [1, 1, 0],
            ..TensorMapRequest::default()
        };
        r.map[5] = 7;
        assert_eq!(TensorMapRequest::decode(&r.encode()), Some(r));
        assert_eq!(TensorMapRequest::decode(&r.encode()[..100]), None);
        let bad = |kind: u32, rank: u32| {
            let mut x = r;
            x.kind = kind;
            x.rank = rank;
            TensorMapRequest::decode(&x.encode())
        };
        assert_eq!(bad(TENSOR_MAP_IM2COL, 2), None);
        assert_eq!(bad(TENSOR_MAP_TILED, 6), None);
        assert_eq!(bad(TENSOR_MAP_TILED, 0), None);
        assert_eq!(bad(9, 2), None);
        assert!(bad(TENSOR_MAP_TILED, 1).is_some());
        assert!(bad(TENSOR_MAP_REPLACE_ADDRESS, 0).is_some());
    }
}

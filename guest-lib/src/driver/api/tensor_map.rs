//! Tensor maps on the driver face: `cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`,
//! `cuTensorMapEncodeIm2colWide` and `cuTensorMapReplaceAddress`. A tensor map is the 128-byte
//! descriptor Hopper's TMA instructions read (Triton, CUTLASS, cuDNN and FlashAttention make
//! them); its encoding is the driver's own, so the host's driver encodes it (`TensorMapEncode`)
//! and the guest writes it where the caller asked. The global address is a device address,
//! the same number in the guest and on the host; the map is then a plain kernel argument.

use core::ffi::{c_int, c_void};

use qcuda_proto::{
    tensor_map::{
        TensorMapRequest, TENSOR_MAP_IM2COL, TENSOR_MAP_IM2COL_WIDE, TENSOR_MAP_MAX_RANK,
        TENSOR_MAP_REPLACE_ADDRESS, TENSOR_MAP_SIZE, TENSOR_MAP_TILED,
    },
    Op,
};

use super::initialized;
use crate::{
    core::{runtime::runtime, transport::Call},
    driver::status::{DriverError, DrvResult},
    generated::driver_api as d,
};

const _: () = assert!(size_of::<d::CUtensorMap>() == TENSOR_MAP_SIZE);

/// The first `n` values of a caller's array (null with `n == 0` is an empty one).
///
/// # Safety
/// `p` must be null or readable for `n` values.
unsafe fn array<T: Copy + Default, const N: usize>(p: *const T, n: u32) -> DrvResult<[T; N]> {
    let mut out = [T::default(); N];
    let n = n as usize;
    if n > N {
        return Err(DriverError::INVALID_VALUE);
    }
    if n > 0 {
        if p.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        for (i, slot) in out.iter_mut().enumerate().take(n) {
            // SAFETY: `n` readable values (caller's contract).
            *slot = unsafe { p.add(i).read_unaligned() };
        }
    }
    Ok(out)
}

/// Has the host's driver encode `r`, and writes the map to `map`.
fn encode(map: *mut d::CUtensorMap, r: &TensorMapRequest) -> DrvResult<()> {
    if map.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    initialized()?;
    let rt = runtime()?;
    let mut out = [0u8; TENSOR_MAP_SIZE];
    let device = crate::core::runtime::context::current().map_or(0, |c| c.device);
    rt.session.submit(
        Call::new(Op::TensorMapEncode, device)
            .input(&r.encode())
            .output(&mut out),
    )?;
    // SAFETY: non-null, and writable for a CUtensorMap (API contract).
    unsafe { map.cast::<[u8; TENSOR_MAP_SIZE]>().write_unaligned(out) };
    Ok(())
}

/// The rank, checked against the arrays the request holds.
fn rank(rank: u32, min: u32) -> DrvResult<u32> {
    if (min..=TENSOR_MAP_MAX_RANK).contains(&rank) {
        Ok(rank)
    } else {
        Err(DriverError::INVALID_VALUE)
    }
}

driver_api! {
    /// `cuTensorMapEncodeTiled`.
    fn cuTensorMapEncodeTiled(
        tensorMap: *mut d::CUtensorMap,
        tensorDataType: d::CUtensorMapDataType,
        tensorRank: d::cuuint32_t,
        globalAddress: *mut c_void,
        globalDim: *const d::cuuint64_t,
        globalStrides: *const d::cuuint64_t,
        boxDim: *const d::cuuint32_t,
        elementStrides: *const d::cuuint32_t,
        interleave: d::CUtensorMapInterleave,
        swizzle: d::CUtensorMapSwizzle,
        l2Promotion: d::CUtensorMapL2promotion,
        oobFill: d::CUtensorMapFloatOOBfill,
    ) {
        let n = rank(tensorRank, 1)?;
        // SAFETY: the API's arrays, of `n` (strides: `n - 1`) values.
        let r = unsafe {
            TensorMapRequest {
                kind: TENSOR_MAP_TILED,
                data_type: tensorDataType,
                rank: n,
                interleave,
                swizzle,
                l2_promotion: l2Promotion,
                oob_fill: oobFill,
                address: globalAddress as u64,
                global_dim: array(globalDim, n)?,
                global_strides: array(globalStrides, n - 1)?,
                box_dim: array(boxDim, n)?,
                element_strides: array(elementStrides, n)?,
                ..TensorMapRequest::default()
            }
        };
        encode(tensorMap, &r)
    }

    /// `cuTensorMapEncodeIm2col`.
    fn cuTensorMapEncodeIm2col(
        tensorMap: *mut d::CUtensorMap,
        tensorDataType: d::CUtensorMapDataType,
        tensorRank: d::cuuint32_t,
        globalAddress: *mut c_void,
        globalDim: *const d::cuuint64_t,
        globalStrides: *const d::cuuint64_t,
        pixelBoxLowerCorner: *const c_int,
        pixelBoxUpperCorner: *const c_int,
        channelsPerPixel: d::cuuint32_t,
        pixelsPerColumn: d::cuuint32_t,
        elementStrides: *const d::cuuint32_t,
        interleave: d::CUtensorMapInterleave,
        swizzle: d::CUtensorMapSwizzle,
        l2Promotion: d::CUtensorMapL2promotion,
        oobFill: d::CUtensorMapFloatOOBfill,
    ) {
        let n = rank(tensorRank, 3)?;
        // SAFETY: the API's arrays, of `n` (strides: `n - 1`, corners: `n - 2`) values.
        let r = unsafe {
            TensorMapRequest {
                kind: TENSOR_MAP_IM2COL,
                data_type: tensorDataType,
                rank: n,
                interleave,
                swizzle,
                l2_promotion: l2Promotion,
                oob_fill: oobFill,
                channels_per_pixel: channelsPerPixel,
                pixels_per_column: pixelsPerColumn,
                address: globalAddress as u64,
                global_dim: array(globalDim, n)?,
                global_strides: array(globalStrides, n - 1)?,
                element_strides: array(elementStrides, n)?,
                lower: array(pixelBoxLowerCorner, n - 2)?,
                upper: array(pixelBoxUpperCorner, n - 2)?,
                ..TensorMapRequest::default()
            }
        };
        encode(tensorMap, &r)
    }

    /// `cuTensorMapEncodeIm2colWide`.
    fn cuTensorMapEncodeIm2colWide(
        tensorMap: *mut d::CUtensorMap,
        tensorDataType: d::CUtensorMapDataType,
        tensorRank: d::cuuint32_t,
        globalAddress: *mut c_void,
        globalDim: *const d::cuuint64_t,
        globalStrides: *const d::cuuint64_t,
        pixelBoxLowerCornerWidth: c_int,
        pixelBoxUpperCornerWidth: c_int,
        channelsPerPixel: d::cuuint32_t,
        pixelsPerColumn: d::cuuint32_t,
        elementStrides: *const d::cuuint32_t,
        interleave: d::CUtensorMapInterleave,
        mode: d::CUtensorMapIm2ColWideMode,
        swizzle: d::CUtensorMapSwizzle,
        l2Promotion: d::CUtensorMapL2promotion,
        oobFill: d::CUtensorMapFloatOOBfill,
    ) {
        let n = rank(tensorRank, 3)?;
        // SAFETY: the API's arrays, of `n` (strides: `n - 1`) values.
        let r = unsafe {
            TensorMapRequest {
                kind: TENSOR_MAP_IM2COL_WIDE,
                data_type: tensorDataType,
                rank: n,
                interleave,
                swizzle,
                l2_promotion: l2Promotion,
                oob_fill: oobFill,
                channels_per_pixel: channelsPerPixel,
                pixels_per_column: pixelsPerColumn,
                wide_mode: mode,
                address: globalAddress as u64,
                global_dim: array(globalDim, n)?,
                global_strides: array(globalStrides, n - 1)?,
                element_strides: array(elementStrides, n)?,
                lower: [pixelBoxLowerCornerWidth, 0, 0],
                upper: [pixelBoxUpperCornerWidth, 0, 0],
                ..TensorMapRequest::default()
            }
        };
        encode(tensorMap, &r)
    }

    /// `cuTensorMapReplaceAddress`: the same map over another global address.
    fn cuTensorMapReplaceAddress(tensorMap: *mut d::CUtensorMap, globalAddress: *mut c_void) {
        if tensorMap.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: a CUtensorMap the caller holds (API contract), 128 plain bytes.
        let map = unsafe { tensorMap.cast::<[u8; TENSOR_MAP_SIZE]>().read_unaligned() };
        let r = TensorMapRequest {
            kind: TENSOR_MAP_REPLACE_ADDRESS,
            address: globalAddress as u64,
            map,
            ..TensorMapRequest::default()
        };
        encode(tensorMap, &r)
    }
}

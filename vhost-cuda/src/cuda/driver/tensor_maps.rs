//! Tensor maps (`cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`,
//! `cuTensorMapEncodeIm2colWide`, `cuTensorMapReplaceAddress`): the 128-byte descriptors that
//! Hopper's TMA instructions read (Triton, CUTLASS, cuDNN and FlashAttention make them), whose
//! encoding is the driver's own. A pure encoding: no context, no memory is touched; the global
//! address is a device address, the same number in the guest. As a trait of its own
//! ([`TensorMapDriverApi`], a supertrait of `DriverApi`), with the real implementation over
//! cudarc's `sys` layer and the no-driver one (the fake's is in `fake.rs`).

use std::mem::MaybeUninit;

use cudarc::driver::sys;
use qcuda_proto::tensor_map::{
    TensorMapRequest, TENSOR_MAP_IM2COL, TENSOR_MAP_IM2COL_WIDE, TENSOR_MAP_REPLACE_ADDRESS,
    TENSOR_MAP_SIZE, TENSOR_MAP_TILED,
};

use super::{
    error::{check, CuError, CuResult},
    library::{CudaDriver, NoDriver},
};

/// The symbols [`TensorMapDriverApi`] calls (checked when the driver is loaded).
pub(crate) const TENSOR_MAP_SYMBOLS: &[&str] = &[
    "cuTensorMapEncodeIm2col",
    "cuTensorMapEncodeIm2colWide",
    "cuTensorMapEncodeTiled",
    "cuTensorMapReplaceAddress",
];

/// The tensor map calls the executor makes.
pub(crate) trait TensorMapDriverApi {
    /// The `CUtensorMap` of request `r` (the driver checks its values).
    fn tensor_map(&self, r: &TensorMapRequest) -> CuResult<[u8; TENSOR_MAP_SIZE]>;
}

/// `v` as a value of a C enum whose values run from 0 to `max`: INVALID_VALUE past it (a
/// value the header does not have must not become a Rust enum).
fn enum_value<T: Copy>(v: u32, max: u32) -> CuResult<T> {
    const { assert!(size_of::<T>() == 4) };
    if v > max {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: T is a `#[repr(u32)]` enum of cudarc's CUDA 13.0 header whose variants are
    // exactly 0..=max (checked by the callers' maxima), so `v` is one of them.
    Ok(unsafe { std::mem::transmute_copy::<u32, T>(&v) })
}

impl TensorMapDriverApi for CudaDriver {
    fn tensor_map(&self, r: &TensorMapRequest) -> CuResult<[u8; TENSOR_MAP_SIZE]> {
        let mut map = MaybeUninit::<sys::CUtensorMap>::zeroed();
        let address = usize::try_from(r.address).map_err(|_| CuError::INVALID_VALUE)?
            as *mut std::ffi::c_void;
        // SAFETY (every call below): symbols `load` found (TENSOR_MAP_SYMBOLS), through
        // cudarc's binding of their CUDA 13.0 prototype; the arrays are the request's own, as
        // long as the rank the driver reads (the rank was checked against them); `map` is a
        // local the driver writes 128 bytes into; the global address is only encoded.
        let result = match r.kind {
            // SAFETY: see above.
            TENSOR_MAP_TILED => check(unsafe {
                sys::cuTensorMapEncodeTiled(
                    map.as_mut_ptr(),
                    enum_value(r.data_type, 15)?,
                    r.rank,
                    address,
                    r.global_dim.as_ptr(),
                    r.global_strides.as_ptr(),
                    r.box_dim.as_ptr(),
                    r.element_strides.as_ptr(),
                    enum_value(r.interleave, 2)?,
                    enum_value(r.swizzle, 6)?,
                    enum_value(r.l2_promotion, 3)?,
                    enum_value(r.oob_fill, 1)?,
                )
            }),
            // SAFETY: see above.
            TENSOR_MAP_IM2COL => check(unsafe {
                sys::cuTensorMapEncodeIm2col(
                    map.as_mut_ptr(),
                    enum_value(r.data_type, 15)?,
                    r.rank,
                    address,
                    r.global_dim.as_ptr(),
                    r.global_strides.as_ptr(),
                    r.lower.as_ptr(),
                    r.upper.as_ptr(),
                    r.channels_per_pixel,
                    r.pixels_per_column,
                    r.element_strides.as_ptr(),
                    enum_value(r.interleave, 2)?,
                    enum_value(r.swizzle, 6)?,
                    enum_value(r.l2_promotion, 3)?,
                    enum_value(r.oob_fill, 1)?,
                )
            }),
            // SAFETY: see above.
            TENSOR_MAP_IM2COL_WIDE => check(unsafe {
                sys::cuTensorMapEncodeIm2colWide(
                    map.as_mut_ptr(),
                    enum_value(r.data_type, 15)?,
                    r.rank,
                    address,
                    r.global_dim.as_ptr(),
                    r.global_strides.as_ptr(),
                    r.lower[0],
                    r.upper[0],
                    r.channels_per_pixel,
                    r.pixels_per_column,
                    r.element_strides.as_ptr(),
                    enum_value(r.interleave, 2)?,
                    enum_value(r.wide_mode, 1)?,
                    enum_value(r.swizzle, 6)?,
                    enum_value(r.l2_promotion, 3)?,
                    enum_value(r.oob_fill, 1)?,
                )
            }),
            TENSOR_MAP_REPLACE_ADDRESS => {
                // SAFETY: the map is 128 plain bytes; `map` is a local of that size.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        r.map.as_ptr(),
                        map.as_mut_ptr().cast::<u8>(),
                        TENSOR_MAP_SIZE,
                    );
                }
                // SAFETY: see above; `map` holds the caller's map.
                check(unsafe { sys::cuTensorMapReplaceAddress(map.as_mut_ptr(), address) })
            }
            _ => Err(CuError::INVALID_VALUE),
        };
        result?;
        let mut out = [0u8; TENSOR_MAP_SIZE];
        // SAFETY: 128 initialised bytes (zeroed, then written by the driver).
        unsafe {
            std::ptr::copy_nonoverlapping(
                map.as_ptr().cast::<u8>(),
                out.as_mut_ptr(),
                TENSOR_MAP_SIZE,
            );
        }
        Ok(out)
    }
}

impl TensorMapDriverApi for NoDriver {
    fn tensor_map(&self, _: &TensorMapRequest) -> CuResult<[u8; TENSOR_MAP_SIZE]> {
        Err(CuError::NO_DEVICE)
    }
}

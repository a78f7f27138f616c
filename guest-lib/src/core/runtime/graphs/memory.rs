//! Graph memory of a device: trimming it and its attributes.

use core::ffi::c_void;

use qcuda_proto::Op;

use crate::core::{
    cuda_error::CudaResult,
    runtime::{current, non_null},
    transport::Call,
};

/// The body of `cudaDeviceGraphMemTrim` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaDeviceGraphMemTrim`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn device_graph_mem_trim(device: core::ffi::c_int) -> CudaResult<()> {
    let (rt, _) = current()?;
    let d = rt.devices.check(device)?;
    rt.session
        .submit(Call::new(Op::GraphMem, d).args(&[0, 0, 0]))?;
    Ok(())
}

/// The body of `cudaDeviceSetGraphMemAttribute` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaDeviceSetGraphMemAttribute`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn device_set_graph_mem_attribute(
    device: core::ffi::c_int,
    attr: crate::generated::cudaGraphMemAttributeType,
    value: *mut c_void,
) -> CudaResult<()> {
    non_null(value)?;
    let (rt, _) = current()?;
    let d = rt.devices.check(device)?;
    // SAFETY: a u64 (cuuint64_t), readable (API contract).
    let v = unsafe { value.cast::<u64>().read_unaligned() };
    rt.session
        .submit(Call::new(Op::GraphMem, d).args(&[2, u64::from(attr), v]))?;
    Ok(())
}

/// The body of `cudaDeviceGetGraphMemAttribute` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaDeviceGetGraphMemAttribute`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn device_get_graph_mem_attribute(
    device: core::ffi::c_int,
    attr: crate::generated::cudaGraphMemAttributeType,
    value: *mut c_void,
) -> CudaResult<()> {
    non_null(value)?;
    let (rt, _) = current()?;
    let d = rt.devices.check(device)?;
    let reply = rt
        .session
        .submit(Call::new(Op::GraphMem, d).args(&[1, u64::from(attr), 0]))?;
    // SAFETY: every attribute is a u64 (cuuint64_t), writable (API contract).
    unsafe { value.cast::<u64>().write_unaligned(reply.rets[0]) };
    Ok(())
}

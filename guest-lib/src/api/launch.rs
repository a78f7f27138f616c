//! Launching kernels: the `<<<>>>` protocol nvcc 13 emits (`__cudaPushCallConfiguration`,
//! `__cudaPopCallConfiguration`, `__cudaGetKernel`, `__cudaLaunchKernel[_ptsz]`), the public
//! `cudaLaunchKernel[_ptsz]` (legacy-launch builds and hand-written code; it accepts a host stub
//! or a `cudaKernel_t`), `cudaGetKernel` and `cudaFuncGetName`.

use core::ffi::{c_char, c_uint, c_void};

use super::write_out;
use crate::{
    call_config::{self, CallConfig},
    cuda_error::{CudaError, CudaResult},
    generated::{cudaKernel_t, cudaStream_t, dim3},
    launch,
    registry::KernelRecord,
    runtime::{non_null, registry, runtime},
};

/// `__cudaPushCallConfiguration(grid, block, smem, stream)`: returns `unsigned` 0 (a nonzero
/// value would make the caller skip the launch).
#[no_mangle]
pub extern "C" fn __cudaPushCallConfiguration(
    gridDim: dim3,
    blockDim: dim3,
    sharedMem: usize,
    stream: cudaStream_t,
) -> c_uint {
    call_config::push(CallConfig {
        grid: gridDim,
        block: blockDim,
        shared_mem: sharedMem,
        stream: stream as usize,
    });
    0
}

/// Launches the kernel record found by `find`.
///
/// # Safety
/// `args` as for `params::pack`.
unsafe fn launch_kernel(
    find: impl FnOnce(usize) -> Option<&'static KernelRecord>,
    func: usize,
    config: CallConfig,
    args: *mut *mut c_void,
) -> CudaResult<()> {
    let rt = runtime()?;
    let kernel = find(func).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    // SAFETY: forwarded contract: args[i] points at the i-th argument of this kernel.
    unsafe { launch::launch(rt, kernel, &config, args as *const *const c_void) }
}

fn config(grid: dim3, block: dim3, shared_mem: usize, stream: cudaStream_t) -> CallConfig {
    CallConfig {
        grid,
        block,
        shared_mem,
        stream: stream as usize,
    }
}

cuda_api! {
    /// `__cudaPopCallConfiguration`: hands the innermost `<<<>>>` configuration to the kernel
    /// stub; `cudaErrorMissingConfiguration` if none was pushed.
    fn __cudaPopCallConfiguration(
        gridDim: *mut dim3,
        blockDim: *mut dim3,
        sharedMem: *mut usize,
        stream: *mut c_void,
    ) {
        let c = call_config::pop().ok_or(CudaError::MISSING_CONFIGURATION)?;
        // SAFETY: nvcc's stub passes pointers to its locals of these types.
        unsafe {
            write_out(gridDim, c.grid)?;
            write_out(blockDim, c.block)?;
            write_out(sharedMem, c.shared_mem)?;
            write_out(stream.cast::<cudaStream_t>(), c.stream as cudaStream_t)
        }
    }

    /// `__cudaGetKernel(&handle, hostFun)`: the `cudaKernel_t` of a registered host stub.
    fn __cudaGetKernel(kernel: *mut cudaKernel_t, hostFun: *const c_void) {
        non_null(kernel)?;
        let k = registry().kernel_by_host(hostFun as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        // SAFETY: non-null and writable (the stub's static handle).
        unsafe { write_out(kernel, k.handle() as cudaKernel_t) }
    }

    /// `__cudaLaunchKernel`: launch by `cudaKernel_t`, fire-and-forget.
    fn __cudaLaunchKernel(
        kernel: cudaKernel_t,
        gridDim: dim3,
        blockDim: dim3,
        args: *mut *mut c_void,
        sharedMem: usize,
        stream: cudaStream_t,
    ) {
        let find = |h| registry().kernel_by_handle(h);
        // SAFETY: forwarded contract (nvcc's stub builds args for this kernel).
        unsafe { launch_kernel(find, kernel as usize, config(gridDim, blockDim, sharedMem, stream), args) }
    }

    /// `__cudaLaunchKernel` (per-thread default stream).
    fn __cudaLaunchKernel_ptsz(
        kernel: cudaKernel_t,
        gridDim: dim3,
        blockDim: dim3,
        args: *mut *mut c_void,
        sharedMem: usize,
        stream: cudaStream_t,
    ) {
        let find = |h| registry().kernel_by_handle(h);
        // SAFETY: forwarded contract.
        unsafe { launch_kernel(find, kernel as usize, config(gridDim, blockDim, sharedMem, stream), args) }
    }

    /// `cudaLaunchKernel(func, ...)`: `func` is a host stub or a `cudaKernel_t`.
    fn cudaLaunchKernel(
        func: *const c_void,
        gridDim: dim3,
        blockDim: dim3,
        args: *mut *mut c_void,
        sharedMem: usize,
        stream: cudaStream_t,
    ) {
        let find = |f| registry().kernel(f);
        // SAFETY: forwarded API contract.
        unsafe { launch_kernel(find, func as usize, config(gridDim, blockDim, sharedMem, stream), args) }
    }

    /// `cudaLaunchKernel` (per-thread default stream).
    fn cudaLaunchKernel_ptsz(
        func: *const c_void,
        gridDim: dim3,
        blockDim: dim3,
        args: *mut *mut c_void,
        sharedMem: usize,
        stream: cudaStream_t,
    ) {
        let find = |f| registry().kernel(f);
        // SAFETY: forwarded API contract.
        unsafe { launch_kernel(find, func as usize, config(gridDim, blockDim, sharedMem, stream), args) }
    }

    /// `cudaGetKernel`: the `cudaKernel_t` of a host stub.
    fn cudaGetKernel(kernelPtr: *mut cudaKernel_t, entryFuncAddr: *const c_void) {
        non_null(kernelPtr)?;
        let k = registry().kernel(entryFuncAddr as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(kernelPtr, k.handle() as cudaKernel_t) }
    }

    /// `cudaFuncGetName`: the kernel's (mangled) device name; the string lives as long as the
    /// process.
    fn cudaFuncGetName(name: *mut *const c_char, func: *const c_void) {
        non_null(name)?;
        let k = registry().kernel(func as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(name, k.name.as_ptr()) }
    }
}

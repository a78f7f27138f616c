//! Launching kernels: the `<<<>>>` protocol nvcc 13 emits (`__cudaPushCallConfiguration`,
//! `__cudaPopCallConfiguration`, `__cudaGetKernel`, `__cudaLaunchKernel[_ptsz]`), the public
//! `cudaLaunchKernel[_ptsz]` (legacy-launch builds and hand-written code; it accepts a host stub
//! or a `cudaKernel_t`), `cudaGetKernel` and `cudaFuncGetName`.

use crate::core::conv::{c_int_of, int_word};
use core::ffi::{c_char, c_int, c_uint, c_void};

use qcuda_proto::Op;

use super::write_out;
use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::launch::call_config::{self, CallConfig},
    core::modules::registry::KernelRecord,
    core::runtime::launch,
    core::runtime::{non_null, registry, runtime},
    core::transport::Call,
    generated::{
        cudaFuncAttribute, cudaFuncAttributeMax, cudaFuncAttributeMaxDynamicSharedMemorySize,
        cudaFuncAttributes, cudaKernel_t, cudaStream_t, dim3,
    },
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
    #[no_prototype = "hidden API: only nvcc's C++ crt headers declare it"]
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
    #[no_prototype = "hidden API: only nvcc's C++ crt headers declare it"]
    fn __cudaGetKernel(kernel: *mut cudaKernel_t, hostFun: *const c_void) {
        non_null(kernel)?;
        let k = registry().kernel_by_host(hostFun as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        // SAFETY: non-null and writable (the stub's static handle).
        unsafe { write_out(kernel, k.handle() as cudaKernel_t) }
    }

    /// `__cudaLaunchKernel`: launch by `cudaKernel_t`, fire-and-forget.
    #[per_thread(__cudaLaunchKernel_ptsz)]
    #[no_prototype = "hidden API: only nvcc's C++ crt headers declare it"]
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

    /// `cudaLaunchKernel(func, ...)`: `func` is a host stub or a `cudaKernel_t`.
    #[per_thread(cudaLaunchKernel_ptsz)]
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

/// `cudaLaunchCooperativeKernel[_ptsz]`: every block resident at once (grid-wide
/// synchronisation); the host's driver refuses grids that cannot be.
///
/// # Safety
/// `args` as for `params::pack`.
unsafe fn launch_cooperative(
    func: *const c_void,
    grid: dim3,
    block: dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: cudaStream_t,
) -> CudaResult<()> {
    let rt = runtime()?;
    let kernel = registry()
        .kernel(func as usize)
        .ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    // SAFETY: forwarded contract.
    unsafe {
        launch::launch_with(
            rt,
            kernel,
            &config(grid, block, shared_mem, stream),
            args as *const *const c_void,
            qcuda_proto::LAUNCH_COOPERATIVE,
            None,
        )
    }
}

/// The host's handle of kernel `func` (a host stub or a `cudaKernel_t`) on the current device,
/// loading its module if needed.
fn function_handle(
    func: *const c_void,
) -> CudaResult<(&'static crate::core::runtime::Runtime, u32, u64)> {
    let (rt, device) = crate::core::runtime::current()?;
    let kernel = registry()
        .kernel(func as usize)
        .ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    let resolved = crate::core::modules::kernel(&rt.session, kernel, device)?;
    Ok((rt, device, resolved.function))
}

fn occupancy(
    num_blocks: *mut c_int,
    func: *const c_void,
    block_size: c_int,
    shared: usize,
    flags: c_uint,
) -> CudaResult<()> {
    non_null(num_blocks)?;
    if flags > 1 {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, device, f) = function_handle(func)?;
    let reply = rt
        .session
        .submit(Call::new(Op::OccupancyMaxActiveBlocks, device).args(&[
            f,
            u64::try_from(block_size).map_err(|_| CudaError::INVALID_VALUE)?,
            shared as u64,
            u64::from(flags),
        ]))?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(num_blocks, c_int_of(reply.rets[0])) }
}

cuda_api! {
    /// `cudaFuncGetAttributes`: the driver's attributes of the kernel on the current device.
    fn cudaFuncGetAttributes(attr: *mut cudaFuncAttributes, func: *const c_void) {
        non_null(attr)?;
        let (rt, device, f) = function_handle(func)?;
        // CUfunction_attribute ids 0..=15, in order.
        let ids: Vec<u8> = (0i32..16).flat_map(i32::to_le_bytes).collect();
        let mut values = vec![0u8; ids.len()];
        rt.session.submit(
            Call::new(Op::FuncAttributes, device)
                .args(&[f])
                .input(&ids)
                .output(&mut values),
        )?;
        let v: Vec<c_int> = values
            .chunks_exact(4)
            .map(|b| c_int::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let size = |x: c_int| usize::try_from(x).unwrap_or(0);
        let a = cudaFuncAttributes {
            maxThreadsPerBlock: v[0],
            sharedSizeBytes: size(v[1]),
            constSizeBytes: size(v[2]),
            localSizeBytes: size(v[3]),
            numRegs: v[4],
            ptxVersion: v[5],
            binaryVersion: v[6],
            cacheModeCA: v[7],
            maxDynamicSharedSizeBytes: v[8],
            preferredShmemCarveout: v[9],
            clusterDimMustBeSet: v[10],
            requiredClusterWidth: v[11],
            requiredClusterHeight: v[12],
            requiredClusterDepth: v[13],
            nonPortableClusterSizeAllowed: v[14],
            clusterSchedulingPolicyPreference: v[15],
            ..Default::default()
        };
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(attr, a) }
    }

    /// `cudaFuncSetAttribute`: every `cudaFuncAttribute` (their ids are the driver's).
    fn cudaFuncSetAttribute(func: *const c_void, attr: cudaFuncAttribute, value: c_int) {
        if !(cudaFuncAttributeMaxDynamicSharedMemorySize..cudaFuncAttributeMax).contains(&attr) {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, device, f) = function_handle(func)?;
        rt.session.submit(
            Call::new(Op::FuncSetAttribute, device).args(&[f, u64::from(attr), int_word(value)]),
        )?;
        if attr == cudaFuncAttributeMaxDynamicSharedMemorySize {
            if let Some(k) = registry().kernel(func as usize) {
                k.max_dynamic_smem
                    .store(u32::try_from(value).unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// `cudaLaunchCooperativeKernel`.
    #[per_thread(cudaLaunchCooperativeKernel_ptsz)]
    fn cudaLaunchCooperativeKernel(
        func: *const c_void,
        gridDim: dim3,
        blockDim: dim3,
        args: *mut *mut c_void,
        sharedMem: usize,
        stream: cudaStream_t,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { launch_cooperative(func, gridDim, blockDim, args, sharedMem, stream) }
    }

    /// `cudaOccupancyMaxActiveBlocksPerMultiprocessor`.
    fn cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        numBlocks: *mut c_int,
        func: *const c_void,
        blockSize: c_int,
        dynamicSMemSize: usize,
    ) {
        occupancy(numBlocks, func, blockSize, dynamicSMemSize, 0)
    }

    /// `cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags` (`cudaOccupancyDefault` or
    /// `cudaOccupancyDisableCachingOverride`).
    fn cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        numBlocks: *mut c_int,
        func: *const c_void,
        blockSize: c_int,
        dynamicSMemSize: usize,
        flags: c_uint,
    ) {
        occupancy(numBlocks, func, blockSize, dynamicSMemSize, flags)
    }
}

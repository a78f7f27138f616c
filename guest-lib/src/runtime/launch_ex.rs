//! Launches with attributes and the rest of the launch tuning API: `cudaLaunchKernelExC[_ptsz]`
//! (every launch attribute the driver's `cuLaunchKernelEx` takes on a stream), the cluster
//! occupancy queries `cudaOccupancyMaxPotentialClusterSize` and `cudaOccupancyMaxActiveClusters`,
//! `cudaOccupancyAvailableDynamicSMemPerBlock`, cache preferences (`cudaFuncSetCacheConfig`,
//! `cudaDeviceSetCacheConfig`, `cudaDeviceGetCacheConfig`) and the deprecated shared memory bank
//! configuration, which CUDA documents as doing nothing on GPUs with a fixed bank size (every
//! GPU CUDA 13 supports: 4-byte banks).

use crate::core::conv::usize_of;
use core::ffi::{c_int, c_void};

use qcuda_proto::Op;

use super::write_out;
use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::launch::call_config::CallConfig,
    core::runtime::launch,
    core::runtime::{current, non_null, registry, runtime, Runtime},
    core::transport::Call,
    generated::{self as cu, cudaFuncCache, cudaLaunchConfig_t, cudaSharedMemConfig},
};

/// `cudaLaunchKernelExC[_ptsz]`.
///
/// # Safety
/// `config` and `args` as the API documents.
unsafe fn launch_ex(
    config: *const cudaLaunchConfig_t,
    func: *const c_void,
    args: *mut *mut c_void,
) -> CudaResult<()> {
    non_null(config)?;
    // SAFETY: non-null and readable (API contract).
    let c = unsafe { config.read_unaligned() };
    let rt = runtime()?;
    let kernel = registry()
        .kernel(func as usize)
        .ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    // SAFETY: forwarded contract.
    let attrs = unsafe { launch::wire_attrs(rt, &c) }?;
    let call = CallConfig {
        grid: c.gridDim,
        block: c.blockDim,
        shared_mem: c.dynamicSmemBytes,
        stream: c.stream as usize,
    };
    // No attributes: a plain launch.
    let attrs = (c.numAttrs > 0).then_some(attrs.as_slice());
    // SAFETY: forwarded contract.
    unsafe { launch::launch_with(rt, kernel, &call, args as *const *const c_void, 0, attrs) }
}

/// The host function of kernel `func` on the current device.
fn function(func: *const c_void) -> CudaResult<(&'static Runtime, u32, u64)> {
    let (rt, device) = current()?;
    let kernel = registry()
        .kernel(func as usize)
        .ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    let resolved = crate::core::modules::kernel(&rt.session, kernel, device)?;
    Ok((rt, device, resolved.function))
}

/// `cudaOccupancyMaxPotentialClusterSize` (`active` false) and
/// `cudaOccupancyMaxActiveClusters`.
///
/// # Safety
/// `config` as the API documents.
unsafe fn cluster_occupancy(
    out: *mut c_int,
    func: *const c_void,
    config: *const cudaLaunchConfig_t,
    active: bool,
) -> CudaResult<()> {
    non_null(out)?;
    non_null(config)?;
    // SAFETY: non-null and readable (API contract).
    let c = unsafe { config.read_unaligned() };
    let (rt, device, f) = function(func)?;
    // SAFETY: forwarded contract.
    let n = unsafe { launch::cluster_occupancy_of(rt, device, f, &c, active) }?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(out, n) }
}

use crate::core::runtime::devices::cache_config;

fn shared_mem_config(config: cudaSharedMemConfig) -> CudaResult<()> {
    if config <= cu::cudaSharedMemBankSizeEightByte {
        Ok(())
    } else {
        Err(CudaError::INVALID_VALUE)
    }
}

cuda_api! {
    /// `cudaLaunchKernelExC`: `func` is a host stub or a `cudaKernel_t`.
    #[per_thread(cudaLaunchKernelExC_ptsz)]
    fn cudaLaunchKernelExC(config: *const cudaLaunchConfig_t, func: *const c_void, args: *mut *mut c_void) {
        // SAFETY: forwarded API contract.
        unsafe { launch_ex(config, func, args) }
    }

    /// `cudaOccupancyMaxPotentialClusterSize`.
    fn cudaOccupancyMaxPotentialClusterSize(clusterSize: *mut c_int, func: *const c_void, launchConfig: *const cudaLaunchConfig_t) {
        // SAFETY: forwarded API contract.
        unsafe { cluster_occupancy(clusterSize, func, launchConfig, false) }
    }

    /// `cudaOccupancyMaxActiveClusters`.
    fn cudaOccupancyMaxActiveClusters(numClusters: *mut c_int, func: *const c_void, launchConfig: *const cudaLaunchConfig_t) {
        // SAFETY: forwarded API contract.
        unsafe { cluster_occupancy(numClusters, func, launchConfig, true) }
    }

    /// `cudaOccupancyAvailableDynamicSMemPerBlock`.
    fn cudaOccupancyAvailableDynamicSMemPerBlock(dynamicSmemSize: *mut usize, func: *const c_void, numBlocks: c_int, blockSize: c_int) {
        non_null(dynamicSmemSize)?;
        let (rt, device, f) = function(func)?;
        let blocks = u64::try_from(numBlocks).map_err(|_| CudaError::INVALID_VALUE)?;
        let block = u64::try_from(blockSize).map_err(|_| CudaError::INVALID_VALUE)?;
        let reply = rt.session.submit(
            Call::new(Op::OccupancyAvailableDynamicSMem, device).args(&[f, blocks, block]),
        )?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(dynamicSmemSize, usize_of(reply.rets[0])) }
    }

    /// `cudaFuncSetCacheConfig`.
    fn cudaFuncSetCacheConfig(func: *const c_void, cacheConfig: cudaFuncCache) {
        let config = cache_config(cacheConfig)?;
        let (rt, device, f) = function(func)?;
        rt.session.submit(Call::new(Op::FuncSetCacheConfig, device).args(&[f, config]))?;
        Ok(())
    }

    /// `cudaDeviceSetCacheConfig` (the current device's context).
    fn cudaDeviceSetCacheConfig(cacheConfig: cudaFuncCache) {
        crate::core::runtime::devices::set_cache_config(cacheConfig)
    }

    /// `cudaDeviceGetCacheConfig`.
    fn cudaDeviceGetCacheConfig(pCacheConfig: *mut cudaFuncCache) {
        non_null(pCacheConfig)?;
        let config = crate::core::runtime::devices::cache_config_of_current()?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pCacheConfig, config) }
    }

    /// `cudaDeviceSetSharedMemConfig` (deprecated): no effect on GPUs with a fixed bank size.
    fn cudaDeviceSetSharedMemConfig(config: cudaSharedMemConfig) {
        shared_mem_config(config)?;
        current()?;
        Ok(())
    }

    /// `cudaDeviceGetSharedMemConfig` (deprecated): the fixed 4-byte bank size.
    fn cudaDeviceGetSharedMemConfig(pConfig: *mut cudaSharedMemConfig) {
        non_null(pConfig)?;
        current()?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pConfig, cu::cudaSharedMemBankSizeFourByte) }
    }

    /// `cudaFuncSetSharedMemConfig` (deprecated): no effect on GPUs with a fixed bank size.
    fn cudaFuncSetSharedMemConfig(func: *const c_void, config: cudaSharedMemConfig) {
        shared_mem_config(config)?;
        function(func)?;
        Ok(())
    }
}

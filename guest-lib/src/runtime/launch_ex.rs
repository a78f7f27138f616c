//! Launches with attributes and the rest of the launch tuning API: `cudaLaunchKernelExC[_ptsz]`
//! (every launch attribute the driver's `cuLaunchKernelEx` takes on a stream), the cluster
//! occupancy queries `cudaOccupancyMaxPotentialClusterSize` and `cudaOccupancyMaxActiveClusters`,
//! `cudaOccupancyAvailableDynamicSMemPerBlock`, cache preferences (`cudaFuncSetCacheConfig`,
//! `cudaDeviceSetCacheConfig`, `cudaDeviceGetCacheConfig`) and the deprecated shared memory bank
//! configuration, which CUDA documents as doing nothing on GPUs with a fixed bank size (every
//! GPU CUDA 13 supports: 4-byte banks).

use crate::core::conv::{c_int_of, low_u32, usize_of};
use core::ffi::{c_int, c_void};

use qcuda_proto::{LaunchAttr, Op, MAX_LAUNCH_ATTRS};

use super::write_out;
use crate::{
    core::call_config::CallConfig,
    core::cuda_error::{CudaError, CudaResult},
    core::launch,
    core::runtime::{current, non_null, registry, runtime, Runtime},
    core::transport::Call,
    core::warnings::warn_once,
    generated::{
        self as cu, cudaFuncCache, cudaLaunchAttribute, cudaLaunchConfig_t, cudaSharedMemConfig,
    },
};

/// Reads the `i`th 32-bit word of a launch attribute's value union.
fn word(val: &[u8; 64], i: usize) -> u32 {
    u32::from_le_bytes([val[4 * i], val[4 * i + 1], val[4 * i + 2], val[4 * i + 3]])
}

fn dword(val: &[u8; 64], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&val[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The wire records of `config`'s attributes (one `Ignore` record when there are none, so the
/// op always carries its buffer). Unknown ids are `cudaErrorInvalidValue`, as the driver
/// answers; events must be the application's; the device-updatable node attribute belongs to
/// graphs, which qcuda does not support.
///
/// # Safety
/// `config.attrs` holds `config.numAttrs` attributes (API contract).
pub(crate) unsafe fn wire_attrs(rt: &Runtime, config: &cudaLaunchConfig_t) -> CudaResult<Vec<u8>> {
    let n = config.numAttrs as usize;
    if n > 0 && config.attrs.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    if n > MAX_LAUNCH_ATTRS {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut out = Vec::with_capacity(n.max(1) * qcuda_proto::LAUNCH_ATTR_SIZE);
    for i in 0..n {
        // SAFETY: `attrs` holds `n` attributes (caller's contract).
        let a: cudaLaunchAttribute = unsafe { config.attrs.add(i).read_unaligned() };
        // SAFETY: every bit pattern is a valid byte array; the union is 64 bytes.
        let val: [u8; 64] = unsafe { core::mem::transmute(a.val) };
        let mut rec = LaunchAttr {
            id: a.id,
            ..LaunchAttr::default()
        };
        match a.id {
            cu::cudaLaunchAttributeIgnore => {}
            cu::cudaLaunchAttributeCooperative
            | cu::cudaLaunchAttributeSynchronizationPolicy
            | cu::cudaLaunchAttributeClusterSchedulingPolicyPreference
            | cu::cudaLaunchAttributeProgrammaticStreamSerialization
            | cu::cudaLaunchAttributePriority
            | cu::cudaLaunchAttributeMemSyncDomain
            | cu::cudaLaunchAttributePreferredSharedMemoryCarveout
            | cu::cudaLaunchAttributeNvlinkUtilCentricScheduling => rec.v[0] = word(&val, 0),
            cu::cudaLaunchAttributeClusterDimension
            | cu::cudaLaunchAttributePreferredClusterDimension => {
                rec.v = [word(&val, 0), word(&val, 1), word(&val, 2)];
            }
            cu::cudaLaunchAttributeMemSyncDomainMap => {
                rec.v = [u32::from(val[0]), u32::from(val[1]), 0];
            }
            cu::cudaLaunchAttributeProgrammaticEvent
            | cu::cudaLaunchAttributeLaunchCompletionEvent => {
                let event = rt.events.info(usize_of(dword(&val, 0)))?;
                rec.w[0] = event.host;
                rec.v = [word(&val, 2), word(&val, 3), 0];
                if a.id == cu::cudaLaunchAttributeLaunchCompletionEvent {
                    rec.v[1] = 0;
                }
            }
            cu::cudaLaunchAttributeAccessPolicyWindow => {
                rec.w = [dword(&val, 0), dword(&val, 8)];
                rec.v = [word(&val, 4), word(&val, 5), word(&val, 6)];
            }
            cu::cudaLaunchAttributeDeviceUpdatableKernelNode => {
                warn_once!(
                    "cudaLaunchAttributeDeviceUpdatableKernelNode: graphs are not supported"
                );
                return Err(CudaError::NOT_SUPPORTED);
            }
            _ => return Err(CudaError::INVALID_VALUE),
        }
        out.extend_from_slice(&rec.encode());
    }
    if out.is_empty() {
        out.extend_from_slice(&LaunchAttr::default().encode());
    }
    Ok(out)
}

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
    let attrs = unsafe { wire_attrs(rt, &c) }?;
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
    let resolved = crate::core::modules::kernel(rt, kernel, device)?;
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
    let n = unsafe { cluster_occupancy_of(rt, device, f, &c, active) }?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(out, n) }
}

/// The cluster occupancy of host function `f` on `device` (`OccupancyCluster`): the most
/// clusters resident at once (`active`) or the largest cluster size. Shared with the driver
/// face's `cuOccupancyMaxActiveClusters`.
///
/// # Safety
/// `c.attrs` holds `c.numAttrs` attributes (API contract).
pub(crate) unsafe fn cluster_occupancy_of(
    rt: &Runtime,
    device: u32,
    f: u64,
    c: &cudaLaunchConfig_t,
    active: bool,
) -> CudaResult<c_int> {
    // SAFETY: forwarded contract.
    let attrs = unsafe { wire_attrs(rt, c) }?;
    let mut args = [0u64; 7];
    args[..6].copy_from_slice(&launch::wire_args(
        f,
        c.gridDim,
        c.blockDim,
        c.dynamicSmemBytes,
        0,
    ));
    args[6] = u64::from(active);
    let reply = rt.session.submit(
        Call::new(Op::OccupancyCluster, device)
            .args(&args)
            .input(&attrs),
    )?;
    Ok(c_int_of(reply.rets[0]))
}

fn cache_config(config: cudaFuncCache) -> CudaResult<u64> {
    if config <= cu::cudaFuncCachePreferEqual {
        Ok(u64::from(config))
    } else {
        Err(CudaError::INVALID_VALUE)
    }
}

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
        let config = cache_config(cacheConfig)?;
        let (rt, device) = current()?;
        rt.session.submit(Call::new(Op::DeviceSetCacheConfig, device).args(&[config]))?;
        Ok(())
    }

    /// `cudaDeviceGetCacheConfig`.
    fn cudaDeviceGetCacheConfig(pCacheConfig: *mut cudaFuncCache) {
        non_null(pCacheConfig)?;
        let (rt, device) = current()?;
        let reply = rt.session.submit(Call::new(Op::DeviceGetCacheConfig, device))?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pCacheConfig, low_u32(reply.rets[0]) as cudaFuncCache) }
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

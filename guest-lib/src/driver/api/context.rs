//! Contexts: primary contexts, created contexts, the per-thread stack, and the context-wide
//! settings (limits, cache configuration, stream priorities, synchronisation).

use core::ffi::{c_int, c_uint};

use super::{check_device, initialized, out, via_core};
use crate::core::runtime::context::{self, Context};
use crate::{
    core::runtime::devices as device_ops,
    core::runtime::{registry, runtime},
    core::transport::Call,
    driver::status::{DriverError, DrvResult},
    generated::driver_api as d,
};
use qcuda_proto::Op;

/// The context a handle names, or the current one for null where the API allows it.
fn context_or_current(ctx: d::CUcontext) -> DrvResult<&'static Context> {
    if ctx.is_null() {
        Ok(context::require_current()?)
    } else {
        Ok(context::lookup(ctx as usize)?)
    }
}

fn handle(ctx: &'static Context) -> d::CUcontext {
    ctx.handle() as d::CUcontext
}

/// The `CU_CTX_*` flags a context may be created with.
const CTX_FLAGS: c_uint = d::CU_CTX_SCHED_MASK
    | d::CU_CTX_MAP_HOST
    | d::CU_CTX_LMEM_RESIZE_TO_MAX
    | d::CU_CTX_COREDUMP_ENABLE
    | d::CU_CTX_USER_COREDUMP_ENABLE
    | d::CU_CTX_SYNC_MEMOPS;

/// `cuCtxEnablePeerAccess` (`enable` 1) and `cuCtxDisablePeerAccess` (0).
fn peer_access(peer: d::CUcontext, enable: u64, flags: c_uint) -> DrvResult<()> {
    initialized()?;
    let c = context::require_current()?;
    if peer.is_null() {
        return Err(DriverError::INVALID_HANDLE);
    }
    let p = context::lookup(peer as usize)?;
    if flags != 0 {
        return Err(DriverError::INVALID_VALUE);
    }
    let rt = runtime()?;
    rt.session
        .submit(Call::new(Op::PeerAccess, c.device).args(&[u64::from(p.device), enable, 0]))?;
    Ok(())
}

fn create(pctx: *mut d::CUcontext, flags: c_uint, dev: d::CUdevice) -> DrvResult<()> {
    let dv = check_device(dev)?;
    if pctx.is_null() || flags & !CTX_FLAGS != 0 {
        return Err(DriverError::INVALID_VALUE);
    }
    let ctx = context::create(dv, flags);
    // SAFETY: checked non-null.
    unsafe { pctx.write_unaligned(handle(ctx)) };
    Ok(())
}

driver_api! {
    /// `cuCtxCreate_v2`.
    #[no_prototype = "cuda.h maps cuCtxCreate to _v4"]
    fn cuCtxCreate_v2(pctx: *mut d::CUcontext, flags: c_uint, dev: d::CUdevice) {
        create(pctx, flags, dev)
    }

    /// `cuCtxCreate_v3`: with execution-affinity parameters, which qcuda does not offer.
    #[no_prototype = "cuda.h maps cuCtxCreate to _v4"]
    fn cuCtxCreate_v3(
        pctx: *mut d::CUcontext,
        paramsArray: *mut d::CUexecAffinityParam,
        numParams: c_int,
        flags: c_uint,
        dev: d::CUdevice
    ) {
        if numParams > 0 || !paramsArray.is_null() {
            return Err(DriverError::NOT_SUPPORTED);
        }
        create(pctx, flags, dev)
    }

    /// `cuCtxCreate_v4`: optional parameters (affinity, CIG) are not offered.
    fn cuCtxCreate_v4(
        pctx: *mut d::CUcontext,
        ctxCreateParams: *mut d::CUctxCreateParams,
        flags: c_uint,
        dev: d::CUdevice,
    ) {
        if !ctxCreateParams.is_null() {
            // SAFETY: non-null: the caller passes a parameter block.
            let p = unsafe { &*ctxCreateParams };
            if p.numExecAffinityParams > 0 || !p.cigParams.is_null() {
                return Err(DriverError::NOT_SUPPORTED);
            }
        }
        create(pctx, flags, dev)
    }

    /// `cuCtxDestroy_v2`: waits for the device, then the handle is gone.
    fn cuCtxDestroy_v2(ctx: d::CUcontext) {
        initialized()?;
        let c = context::lookup(ctx as usize)?;
        if c.primary {
            return Err(DriverError::INVALID_CONTEXT);
        }
        synchronize(c)?;
        Ok(context::destroy(c)?)
    }

    /// `cuCtxPushCurrent_v2`.
    fn cuCtxPushCurrent_v2(ctx: d::CUcontext) {
        initialized()?;
        context::push(context::lookup(ctx as usize)?);
        Ok(())
    }

    /// `cuCtxPopCurrent_v2`.
    fn cuCtxPopCurrent_v2(pctx: *mut d::CUcontext) {
        initialized()?;
        let c = context::pop()?;
        if !pctx.is_null() {
            // SAFETY: non-null: the caller wants the popped context.
            unsafe { pctx.write_unaligned(handle(c)) };
        }
        Ok(())
    }

    /// `cuCtxCreate` (the CUDA 3.1 symbol, the same arguments as `_v2`).
    #[no_prototype = "cuda.h maps it to _v4"]
    fn cuCtxCreate(pctx: *mut d::CUcontext, flags: c_uint, dev: d::CUdevice) {
        create(pctx, flags, dev)
    }

    /// `cuCtxDestroy` (the CUDA 3.1 symbol).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuCtxDestroy(ctx: d::CUcontext) {
        // SAFETY: same contract.
        DriverError::check(unsafe { cuCtxDestroy_v2(ctx) })
    }

    /// `cuCtxPushCurrent` (the CUDA 3.1 symbol).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuCtxPushCurrent(ctx: d::CUcontext) {
        // SAFETY: same contract.
        DriverError::check(unsafe { cuCtxPushCurrent_v2(ctx) })
    }

    /// `cuCtxPopCurrent` (the CUDA 3.1 symbol).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuCtxPopCurrent(pctx: *mut d::CUcontext) {
        // SAFETY: same contract.
        DriverError::check(unsafe { cuCtxPopCurrent_v2(pctx) })
    }

    /// `cuCtxSetCurrent` (null pops).
    fn cuCtxSetCurrent(ctx: d::CUcontext) {
        initialized()?;
        let c = if ctx.is_null() { None } else { Some(context::lookup(ctx as usize)?) };
        context::set_current(c);
        Ok(())
    }

    /// `cuCtxGetCurrent`: null when the thread has none.
    fn cuCtxGetCurrent(pctx: *mut d::CUcontext) {
        initialized()?;
        let c = context::current().map_or(std::ptr::null_mut(), handle);
        // SAFETY: caller's out-parameter.
        unsafe { out(pctx, c) }
    }

    /// `cuCtxGetDevice`.
    fn cuCtxGetDevice(device: *mut d::CUdevice) {
        initialized()?;
        let c = context::require_current()?;
        // SAFETY: caller's out-parameter.
        unsafe { out(device, c_int::try_from(c.device).unwrap_or(0)) }
    }

    /// `cuCtxGetDevice_v2`: of a given context (null: the current one).
    fn cuCtxGetDevice_v2(device: *mut d::CUdevice, ctx: d::CUcontext) {
        initialized()?;
        let c = context_or_current(ctx)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(device, c_int::try_from(c.device).unwrap_or(0)) }
    }

    /// `cuCtxGetFlags`.
    fn cuCtxGetFlags(flags: *mut c_uint) {
        initialized()?;
        let c = context::require_current()?;
        // SAFETY: caller's out-parameter.
        unsafe { out(flags, context::flags(c)) }
    }

    /// `cuCtxSetFlags`.
    fn cuCtxSetFlags(flags: c_uint) {
        initialized()?;
        if flags & !CTX_FLAGS != 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        context::set_flags(context::require_current()?, flags);
        Ok(())
    }

    /// `cuCtxGetId`.
    fn cuCtxGetId(ctx: d::CUcontext, ctxId: *mut ::core::ffi::c_ulonglong) {
        initialized()?;
        let c = context_or_current(ctx)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(ctxId, c.id) }
    }

    /// `cuCtxGetApiVersion`: 3020 for every context, the version the `_v2` context API began.
    fn cuCtxGetApiVersion(ctx: d::CUcontext, version: *mut c_uint) {
        initialized()?;
        context_or_current(ctx)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(version, 3020) }
    }

    /// `cuCtxSynchronize`.
    fn cuCtxSynchronize() {
        initialized()?;
        synchronize(context::require_current()?)
    }

    /// `cuCtxSynchronize_v2`: of a given context (null: the current one).
    fn cuCtxSynchronize_v2(ctx: d::CUcontext) {
        initialized()?;
        synchronize(context_or_current(ctx)?)
    }

    /// `cuProfilerStart`: with `QCUDA_PROFILE`, the host records this process's GPU timeline
    /// from now on (core/profile.rs); without, nothing happens and nothing is sent, as natively
    /// with no profiler attached (in a current context).
    #[no_prototype = "cudaProfiler.h is not among the headers bindgen reads"]
    fn cuProfilerStart() {
        initialized()?;
        context::require_current()?;
        runtime()?.session.profiler_start();
        Ok(())
    }

    /// `cuProfilerStop`: as `cuProfilerStart`; the recording so far is written.
    #[no_prototype = "cudaProfiler.h is not among the headers bindgen reads"]
    fn cuProfilerStop() {
        initialized()?;
        context::require_current()?;
        runtime()?.session.profiler_stop();
        Ok(())
    }

    /// `cuCtxGetLimit`: every `CUlimit`, the driver-only ones (shared memory size, CIG) too.
    fn cuCtxGetLimit(pvalue: *mut usize, limit: d::CUlimit) {
        initialized()?;
        let c = context::require_current()?;
        if pvalue.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let rt = runtime()?;
        if crate::driver::trace::enabled() {
            crate::driver::trace::log(format_args!("cuCtxGetLimit limit {limit}"));
        }
        let reply = rt
            .session
            .submit(Call::new(Op::DeviceGetLimit, c.device).args(&[u64::from(limit)]))?;
        // SAFETY: checked non-null.
        unsafe { pvalue.write_unaligned(crate::core::conv::usize_of(reply.rets[0])) };
        Ok(())
    }

    /// `cuCtxEnablePeerAccess`: the current context's device may reach the memory of the peer
    /// context's device. The host keeps one context per device for the process, so access is
    /// per device pair, as the runtime's `cudaDeviceEnablePeerAccess`.
    fn cuCtxEnablePeerAccess(peerContext: d::CUcontext, Flags: c_uint) {
        peer_access(peerContext, 1, Flags)
    }

    /// `cuCtxDisablePeerAccess`.
    fn cuCtxDisablePeerAccess(peerContext: d::CUcontext) {
        peer_access(peerContext, 0, 0)
    }

    /// `cuCtxSetLimit`.
    fn cuCtxSetLimit(limit: d::CUlimit, value: usize) {
        initialized()?;
        let c = context::require_current()?;
        let rt = runtime()?;
        rt.session.submit(
            Call::new(Op::DeviceSetLimit, c.device).args(&[u64::from(limit), value as u64]),
        )?;
        Ok(())
    }

    /// `cuCtxGetCacheConfig`.
    fn cuCtxGetCacheConfig(pconfig: *mut d::CUfunc_cache) {
        initialized()?;
        context::require_current()?;
        // CUfunc_cache and cudaFuncCache share their values.
        let config = via_core(device_ops::cache_config_of_current)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pconfig, config) }
    }

    /// `cuCtxSetCacheConfig`.
    fn cuCtxSetCacheConfig(config: d::CUfunc_cache) {
        initialized()?;
        context::require_current()?;
        via_core(|| device_ops::set_cache_config(config))
    }

    /// `cuCtxGetStreamPriorityRange`.
    fn cuCtxGetStreamPriorityRange(leastPriority: *mut c_int, greatestPriority: *mut c_int) {
        initialized()?;
        context::require_current()?;
        let (least, greatest) = via_core(crate::core::runtime::streams::priority_range)?;
        // Either pointer may be null.
        if !leastPriority.is_null() {
            // SAFETY: caller's out-parameter.
            unsafe { out(leastPriority, least) }?;
        }
        if !greatestPriority.is_null() {
            // SAFETY: caller's out-parameter.
            unsafe { out(greatestPriority, greatest) }?;
        }
        Ok(())
    }

    /// `cuCtxResetPersistingL2Cache`.
    fn cuCtxResetPersistingL2Cache() {
        initialized()?;
        context::require_current()?;
        via_core(device_ops::reset_persisting_l2)
    }

    /// `cuDevicePrimaryCtxRetain`.
    fn cuDevicePrimaryCtxRetain(pctx: *mut d::CUcontext, dev: d::CUdevice) {
        let dv = check_device(dev)?;
        if pctx.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let c = context::retain_primary(dv);
        // SAFETY: checked non-null.
        unsafe { pctx.write_unaligned(handle(c)) };
        Ok(())
    }

    /// `cuDevicePrimaryCtxRelease_v2`.
    fn cuDevicePrimaryCtxRelease_v2(dev: d::CUdevice) {
        Ok(context::release_primary(check_device(dev)?)?)
    }

    /// `cuDevicePrimaryCtxRelease` (pre-11.0 form).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuDevicePrimaryCtxRelease(dev: d::CUdevice) {
        Ok(context::release_primary(check_device(dev)?)?)
    }

    /// `cuDevicePrimaryCtxReset_v2`: frees everything the process has on the device, as
    /// `cudaDeviceReset` does, and runs the context's local-storage destructors.
    fn cuDevicePrimaryCtxReset_v2(dev: d::CUdevice) {
        let dv = check_device(dev)?;
        reset_primary(dv)
    }

    /// `cuDevicePrimaryCtxReset` (pre-11.0 form).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuDevicePrimaryCtxReset(dev: d::CUdevice) {
        let dv = check_device(dev)?;
        reset_primary(dv)
    }

    /// `cuDevicePrimaryCtxGetState`.
    fn cuDevicePrimaryCtxGetState(dev: d::CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let dv = check_device(dev)?;
        // SAFETY: caller's out-parameters.
        unsafe {
            out(flags, context::flags(context::primary(dv)))?;
            out(active, c_int::from(context::primary_active(dv)))
        }
    }

    /// `cuDevicePrimaryCtxSetFlags_v2`.
    fn cuDevicePrimaryCtxSetFlags_v2(dev: d::CUdevice, flags: c_uint) {
        let dv = check_device(dev)?;
        if flags & !CTX_FLAGS != 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        context::set_flags(context::primary(dv), flags);
        Ok(())
    }

    /// `cuDevicePrimaryCtxSetFlags` (pre-11.0 form).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuDevicePrimaryCtxSetFlags(dev: d::CUdevice, flags: c_uint) {
        // SAFETY: same contract.
        DriverError::check(unsafe { cuDevicePrimaryCtxSetFlags_v2(dev, flags) })
    }
}

/// Waits for all work of the context's device.
fn synchronize(c: &'static Context) -> DrvResult<()> {
    let saved = crate::core::devices::current();
    crate::core::devices::set_current(c.device);
    let result = via_core(device_ops::synchronize);
    crate::core::devices::set_current(saved);
    result
}

fn reset_primary(device: u32) -> DrvResult<()> {
    context::primary_reset(device);
    let rt = runtime()?;
    rt.reset_device(registry(), device)?;
    Ok(())
}

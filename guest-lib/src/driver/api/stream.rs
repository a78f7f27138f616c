//! Streams and events. A `CUstream` is the runtime face's `cudaStream_t` and a `CUevent` its
//! `cudaEvent_t`: one table of each per process, so a stream the application made through our
//! runtime works here (cuBLAS takes it through `cublasSetStream` and uses it through the
//! driver), and the other way round.

use core::ffi::{c_int, c_uint, c_void};

use super::{initialized, out, via_core};
use crate::core::runtime::context;
use crate::{
    core::runtime::events,
    core::runtime::runtime,
    core::runtime::streams,
    driver::status::{DriverError, DrvResult},
    generated::driver_api as d,
};

fn ready() -> DrvResult<()> {
    initialized()?;
    Ok(context::require_current().map(drop)?)
}

driver_api! {
    /// `cuStreamCreate` (`CU_STREAM_NON_BLOCKING` is `cudaStreamNonBlocking`).
    fn cuStreamCreate(phStream: *mut d::CUstream, Flags: c_uint) {
        ready()?;
        let h = via_core(|| streams::create(Flags, 0))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(phStream, h as d::CUstream) }
    }

    /// `cuStreamCreateWithPriority`.
    fn cuStreamCreateWithPriority(phStream: *mut d::CUstream, flags: c_uint, priority: c_int) {
        ready()?;
        let h = via_core(|| streams::create(flags, priority))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(phStream, h as d::CUstream) }
    }

    /// `cuStreamDestroy_v2`.
    fn cuStreamDestroy_v2(hStream: d::CUstream) {
        initialized()?;
        via_core(|| streams::destroy(hStream as usize))
    }

    /// `cuStreamDestroy` (pre-4.0 form).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuStreamDestroy(hStream: d::CUstream) {
        // SAFETY: same contract.
        DriverError::check(unsafe { cuStreamDestroy_v2(hStream) })
    }

    /// `cuStreamSynchronize`.
    #[per_thread(cuStreamSynchronize_ptsz)]
    fn cuStreamSynchronize(hStream: d::CUstream) {
        ready()?;
        via_core(|| streams::synchronize(hStream as usize))
    }

    /// `cuStreamAttachMemAsync`: which streams' work may touch a managed allocation (the
    /// runtime face's `cudaStreamAttachMemAsync`, with the driver's `CU_MEM_ATTACH_*` values,
    /// which are the runtime's).
    #[per_thread(cuStreamAttachMemAsync_ptsz)]
    fn cuStreamAttachMemAsync(hStream: d::CUstream, dptr: d::CUdeviceptr, length: usize, flags: c_uint) {
        ready()?;
        via_core(|| crate::core::runtime::managed::attach_mem(hStream as usize, crate::core::conv::usize_of(dptr), length, flags))
    }

    /// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while work is pending.
    #[per_thread(cuStreamQuery_ptsz)]
    fn cuStreamQuery(hStream: d::CUstream) {
        ready()?;
        via_core(|| streams::query(hStream as usize))
    }

    /// `cuStreamWaitEvent`.
    #[per_thread(cuStreamWaitEvent_ptsz)]
    fn cuStreamWaitEvent(hStream: d::CUstream, hEvent: d::CUevent, Flags: c_uint) {
        ready()?;
        via_core(|| streams::wait_event(hStream as usize, hEvent as usize, Flags))
    }

    /// `cuStreamGetFlags`.
    #[per_thread(cuStreamGetFlags_ptsz)]
    fn cuStreamGetFlags(hStream: d::CUstream, flags: *mut c_uint) {
        ready()?;
        let s = via_core(|| streams::info(hStream as usize))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(flags, s.flags) }
    }

    /// `cuStreamGetPriority`.
    #[per_thread(cuStreamGetPriority_ptsz)]
    fn cuStreamGetPriority(hStream: d::CUstream, priority: *mut c_int) {
        ready()?;
        let s = via_core(|| streams::info(hStream as usize))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(priority, s.priority) }
    }

    /// `cuStreamGetId`.
    #[per_thread(cuStreamGetId_ptsz)]
    fn cuStreamGetId(hStream: d::CUstream, streamId: *mut ::core::ffi::c_ulonglong) {
        ready()?;
        let id = via_core(|| streams::id(hStream as usize))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(streamId, id) }
    }

    /// `cuStreamGetDevice`.
    #[per_thread(cuStreamGetDevice_ptsz)]
    fn cuStreamGetDevice(hStream: d::CUstream, device: *mut d::CUdevice) {
        ready()?;
        let s = via_core(|| streams::info(hStream as usize))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(device, d::CUdevice::try_from(s.device).unwrap_or(d::CUdevice::MAX)) }
    }

    /// `cuStreamGetCtx`: the primary context of the stream's device (streams belong to the
    /// device's host context, which every guest context of that device shares).
    #[per_thread(cuStreamGetCtx_ptsz)]
    fn cuStreamGetCtx(hStream: d::CUstream, pctx: *mut d::CUcontext) {
        ready()?;
        let rt = runtime()?;
        let t = rt.streams.target(hStream as usize)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pctx, context::primary(t.device).handle() as d::CUcontext) }
    }

    /// `cuStreamAddCallback`.
    #[per_thread(cuStreamAddCallback_ptsz)]
    fn cuStreamAddCallback(hStream: d::CUstream, callback: d::CUstreamCallback, userData: *mut c_void, flags: c_uint) {
        ready()?;
        // SAFETY: the callback's CUresult parameter is the runtime's cudaError_t (an unsigned
        // int either way): the same C function type.
        let callback = unsafe {
            std::mem::transmute::<d::CUstreamCallback, crate::core::streams::host_fns::StreamCallback>(callback)
        };
        via_core(|| streams::add_callback(hStream as usize, callback, userData, flags))
    }

    /// `cuEventCreate` (`CU_EVENT_*` are the runtime's `cudaEvent*` flags).
    fn cuEventCreate(phEvent: *mut d::CUevent, Flags: c_uint) {
        ready()?;
        let h = via_core(|| events::create(Flags))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(phEvent, h as d::CUevent) }
    }

    /// `cuEventDestroy_v2`.
    fn cuEventDestroy_v2(hEvent: d::CUevent) {
        initialized()?;
        via_core(|| events::destroy(hEvent as usize))
    }

    /// `cuEventDestroy` (pre-4.0 form).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuEventDestroy(hEvent: d::CUevent) {
        // SAFETY: same contract.
        DriverError::check(unsafe { cuEventDestroy_v2(hEvent) })
    }

    /// `cuEventRecord`.
    #[per_thread(cuEventRecord_ptsz)]
    fn cuEventRecord(hEvent: d::CUevent, hStream: d::CUstream) {
        ready()?;
        via_core(|| events::record(hEvent as usize, hStream as usize, 0))
    }

    /// `cuEventRecordWithFlags`.
    #[per_thread(cuEventRecordWithFlags_ptsz)]
    fn cuEventRecordWithFlags(hEvent: d::CUevent, hStream: d::CUstream, flags: c_uint) {
        ready()?;
        via_core(|| events::record(hEvent as usize, hStream as usize, flags))
    }

    /// `cuEventSynchronize`.
    fn cuEventSynchronize(hEvent: d::CUevent) {
        initialized()?;
        via_core(|| events::synchronize(hEvent as usize))
    }

    /// `cuEventQuery`.
    fn cuEventQuery(hEvent: d::CUevent) {
        initialized()?;
        via_core(|| events::query(hEvent as usize))
    }

    /// `cuEventElapsedTime_v2`.
    fn cuEventElapsedTime_v2(pMilliseconds: *mut f32, hStart: d::CUevent, hEnd: d::CUevent) {
        initialized()?;
        let ms = via_core(|| events::elapsed_ms(hStart as usize, hEnd as usize))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pMilliseconds, ms) }
    }

    /// `cuEventElapsedTime` (pre-12.8 form, same meaning).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuEventElapsedTime(pMilliseconds: *mut f32, hStart: d::CUevent, hEnd: d::CUevent) {
        // SAFETY: same contract.
        DriverError::check(unsafe { cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd) })
    }
}

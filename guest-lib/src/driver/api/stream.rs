//! Streams and events. A `CUstream` is the runtime face's `cudaStream_t` and a `CUevent` its
//! `cudaEvent_t`: one table of each per process, so a stream the application made through our
//! runtime works here (cuBLAS takes it through `cublasSetStream` and uses it through the
//! driver), and the other way round.

use core::ffi::{c_int, c_uint, c_void};

use super::{initialized, out, via_runtime};
use crate::{
    core::runtime::runtime,
    driver::{
        context,
        status::{DriverError, DrvResult},
    },
    generated::driver_api as d,
    runtime::{events as rt_events, streams as rt_streams},
};

fn ready() -> DrvResult<()> {
    initialized()?;
    context::require_current().map(drop)
}

driver_api! {
    /// `cuStreamCreate` (`CU_STREAM_NON_BLOCKING` is `cudaStreamNonBlocking`).
    fn cuStreamCreate(phStream: *mut d::CUstream, Flags: c_uint) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamCreateWithFlags(phStream.cast(), Flags) })
    }

    /// `cuStreamCreateWithPriority`.
    fn cuStreamCreateWithPriority(phStream: *mut d::CUstream, flags: c_uint, priority: c_int) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe {
            rt_streams::cudaStreamCreateWithPriority(phStream.cast(), flags, priority)
        })
    }

    /// `cuStreamDestroy_v2`.
    fn cuStreamDestroy_v2(hStream: d::CUstream) {
        initialized()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamDestroy(hStream.cast()) })
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
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamSynchronize(hStream.cast()) })
    }

    /// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while work is pending.
    #[per_thread(cuStreamQuery_ptsz)]
    fn cuStreamQuery(hStream: d::CUstream) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamQuery(hStream.cast()) })
    }

    /// `cuStreamWaitEvent`.
    #[per_thread(cuStreamWaitEvent_ptsz)]
    fn cuStreamWaitEvent(hStream: d::CUstream, hEvent: d::CUevent, Flags: c_uint) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamWaitEvent(hStream.cast(), hEvent.cast(), Flags) })
    }

    /// `cuStreamGetFlags`.
    #[per_thread(cuStreamGetFlags_ptsz)]
    fn cuStreamGetFlags(hStream: d::CUstream, flags: *mut c_uint) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamGetFlags(hStream.cast(), flags) })
    }

    /// `cuStreamGetPriority`.
    #[per_thread(cuStreamGetPriority_ptsz)]
    fn cuStreamGetPriority(hStream: d::CUstream, priority: *mut c_int) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamGetPriority(hStream.cast(), priority) })
    }

    /// `cuStreamGetId`.
    #[per_thread(cuStreamGetId_ptsz)]
    fn cuStreamGetId(hStream: d::CUstream, streamId: *mut ::core::ffi::c_ulonglong) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamGetId(hStream.cast(), streamId.cast()) })
    }

    /// `cuStreamGetDevice`.
    #[per_thread(cuStreamGetDevice_ptsz)]
    fn cuStreamGetDevice(hStream: d::CUstream, device: *mut d::CUdevice) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_streams::cudaStreamGetDevice(hStream.cast(), device) })
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
        // SAFETY: forwarded contract; the callback's CUresult parameter is the runtime's
        // cudaError_t (an unsigned int either way).
        via_runtime(|| unsafe {
            rt_streams::cudaStreamAddCallback(hStream.cast(), std::mem::transmute::<d::CUstreamCallback, crate::core::host_fns::StreamCallback>(callback), userData, flags)
        })
    }

    /// `cuEventCreate` (`CU_EVENT_*` are the runtime's `cudaEvent*` flags).
    fn cuEventCreate(phEvent: *mut d::CUevent, Flags: c_uint) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_events::cudaEventCreateWithFlags(phEvent.cast(), Flags) })
    }

    /// `cuEventDestroy_v2`.
    fn cuEventDestroy_v2(hEvent: d::CUevent) {
        initialized()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_events::cudaEventDestroy(hEvent.cast()) })
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
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_events::cudaEventRecord(hEvent.cast(), hStream.cast()) })
    }

    /// `cuEventRecordWithFlags`.
    #[per_thread(cuEventRecordWithFlags_ptsz)]
    fn cuEventRecordWithFlags(hEvent: d::CUevent, hStream: d::CUstream, flags: c_uint) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe {
            rt_events::cudaEventRecordWithFlags(hEvent.cast(), hStream.cast(), flags)
        })
    }

    /// `cuEventSynchronize`.
    fn cuEventSynchronize(hEvent: d::CUevent) {
        initialized()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_events::cudaEventSynchronize(hEvent.cast()) })
    }

    /// `cuEventQuery`.
    fn cuEventQuery(hEvent: d::CUevent) {
        initialized()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_events::cudaEventQuery(hEvent.cast()) })
    }

    /// `cuEventElapsedTime_v2`.
    fn cuEventElapsedTime_v2(pMilliseconds: *mut f32, hStart: d::CUevent, hEnd: d::CUevent) {
        initialized()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe {
            rt_events::cudaEventElapsedTime(pMilliseconds, hStart.cast(), hEnd.cast())
        })
    }

    /// `cuEventElapsedTime` (pre-12.8 form, same meaning).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuEventElapsedTime(pMilliseconds: *mut f32, hStart: d::CUevent, hEnd: d::CUevent) {
        // SAFETY: same contract.
        DriverError::check(unsafe { cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd) })
    }
}

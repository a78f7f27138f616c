//! Events: create, record, synchronise, query, time, destroy.

use core::ffi::c_uint;

use super::write_out;
use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::runtime::{current, non_null},
    generated::{cudaEventRecordDefault, cudaEvent_t, cudaStream_t},
};

unsafe fn create(event: *mut cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    non_null(event)?;
    let (rt, d) = current()?;
    let h = rt.events.create(&rt.session, d, flags)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(event, h as cudaEvent_t) }
}

fn record(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint) -> CudaResult<()> {
    if flags != cudaEventRecordDefault {
        // cudaEventRecordExternal only matters under stream capture, which qcuda lacks.
        return Err(CudaError::NOT_SUPPORTED);
    }
    let (rt, _) = current()?;
    rt.events
        .record(&rt.session, &rt.streams, event as usize, stream as usize)
}

cuda_api! {
    /// `cudaEventCreate`.
    fn cudaEventCreate(event: *mut cudaEvent_t) {
        // SAFETY: forwarded API contract.
        unsafe { create(event, 0) }
    }

    /// `cudaEventCreateWithFlags`: `cudaEventInterprocess` is not supported.
    fn cudaEventCreateWithFlags(event: *mut cudaEvent_t, flags: c_uint) {
        // SAFETY: forwarded API contract.
        unsafe { create(event, flags) }
    }

    /// `cudaEventRecord` (fire-and-forget).
    #[per_thread(cudaEventRecord_ptsz)]
    fn cudaEventRecord(event: cudaEvent_t, stream: cudaStream_t) { record(event, stream, 0) }

    /// `cudaEventRecordWithFlags`: only `cudaEventRecordDefault`.
    #[per_thread(cudaEventRecordWithFlags_ptsz)]
    fn cudaEventRecordWithFlags(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint) {
        record(event, stream, flags)
    }

    /// `cudaEventSynchronize`.
    fn cudaEventSynchronize(event: cudaEvent_t) {
        let (rt, _) = current()?;
        rt.events.synchronize(&rt.session, event as usize)?;
        crate::core::managed_vars::after_sync(rt)
    }

    /// `cudaEventQuery`: `cudaErrorNotReady` while pending (not recorded as an error).
    fn cudaEventQuery(event: cudaEvent_t) {
        let (rt, _) = current()?;
        rt.events.query(&rt.session, event as usize)
    }

    /// `cudaEventElapsedTime`.
    fn cudaEventElapsedTime(ms: *mut f32, start: cudaEvent_t, end: cudaEvent_t) {
        non_null(ms)?;
        let (rt, _) = current()?;
        let t = rt.events.elapsed_ms(&rt.session, start as usize, end as usize)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(ms, t) }
    }

    /// `cudaEventDestroy`.
    fn cudaEventDestroy(event: cudaEvent_t) {
        let (rt, _) = current()?;
        rt.events.destroy(&rt.session, event as usize)
    }
}

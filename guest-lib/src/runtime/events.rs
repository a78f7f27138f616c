//! Events: create, record, synchronise, query, time, destroy.

use core::ffi::c_uint;

use super::write_out;
use crate::{
    core::cuda_error::CudaResult,
    core::runtime::events as ops,
    core::runtime::non_null,
    generated::{cudaEvent_t, cudaStream_t},
};

unsafe fn create(event: *mut cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    non_null(event)?;
    let h = ops::create(flags)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(event, h as cudaEvent_t) }
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
    fn cudaEventRecord(event: cudaEvent_t, stream: cudaStream_t) { ops::record(event as usize, stream as usize, 0) }

    /// `cudaEventRecordWithFlags`: only `cudaEventRecordDefault`.
    #[per_thread(cudaEventRecordWithFlags_ptsz)]
    fn cudaEventRecordWithFlags(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint) {
        ops::record(event as usize, stream as usize, flags)
    }

    /// `cudaEventSynchronize`.
    fn cudaEventSynchronize(event: cudaEvent_t) { ops::synchronize(event as usize) }

    /// `cudaEventQuery`: `cudaErrorNotReady` while pending (not recorded as an error).
    fn cudaEventQuery(event: cudaEvent_t) { ops::query(event as usize) }

    /// `cudaEventElapsedTime`.
    fn cudaEventElapsedTime(ms: *mut f32, start: cudaEvent_t, end: cudaEvent_t) {
        non_null(ms)?;
        let t = ops::elapsed_ms(start as usize, end as usize)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(ms, t) }
    }

    /// `cudaEventDestroy`.
    fn cudaEventDestroy(event: cudaEvent_t) { ops::destroy(event as usize) }
}

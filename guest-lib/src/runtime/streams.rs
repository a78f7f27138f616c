//! Streams: create, destroy, synchronise, query, wait for an event, and the read-only queries
//! answered from the guest's own records. The `_ptsz` exports are the per-thread-default-stream
//! spellings; qcuda sends that stream to the host's legacy stream (core/streams/mod.rs).

use crate::core::conv::int_of_u32;
use core::ffi::{c_int, c_uint, c_void};

use super::write_out;
use crate::{
    core::cuda_error::CudaResult,
    core::runtime::non_null,
    core::runtime::streams as ops,
    core::streams::host_fns::{HostFn, StreamCallback},
    generated::{cudaEvent_t, cudaStream_t},
};

unsafe fn create(stream: *mut cudaStream_t, flags: c_uint, priority: c_int) -> CudaResult<()> {
    non_null(stream)?;
    let h = ops::create(flags, priority)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(stream, h as cudaStream_t) }
}

cuda_api! {
    /// `cudaLaunchHostFunc` (see `host_fns`).
    #[per_thread(cudaLaunchHostFunc_ptsz)]
    fn cudaLaunchHostFunc(stream: cudaStream_t, fn_: HostFn, userData: *mut c_void) {
        ops::launch_host_func(stream as usize, fn_, userData)
    }

    /// `cudaStreamAddCallback` (see `host_fns`).
    #[per_thread(cudaStreamAddCallback_ptsz)]
    fn cudaStreamAddCallback(stream: cudaStream_t, callback: StreamCallback, userData: *mut c_void, flags: c_uint) {
        ops::add_callback(stream as usize, callback, userData, flags)
    }

    /// `cudaStreamAttachMemAsync` (see `attach_mem`).
    #[per_thread(cudaStreamAttachMemAsync_ptsz)]
    fn cudaStreamAttachMemAsync(stream: cudaStream_t, devPtr: *mut c_void, length: usize, flags: c_uint) {
        crate::core::runtime::managed::attach_mem(stream as usize, devPtr as usize, length, flags)
    }

    /// `cudaStreamCreate`.
    fn cudaStreamCreate(pStream: *mut cudaStream_t) {
        // SAFETY: forwarded API contract.
        unsafe { create(pStream, 0, 0) }
    }

    /// `cudaStreamCreateWithFlags`.
    fn cudaStreamCreateWithFlags(pStream: *mut cudaStream_t, flags: c_uint) {
        // SAFETY: forwarded API contract.
        unsafe { create(pStream, flags, 0) }
    }

    /// `cudaStreamCreateWithPriority`: the host clamps the priority to the device's range.
    fn cudaStreamCreateWithPriority(pStream: *mut cudaStream_t, flags: c_uint, priority: c_int) {
        // SAFETY: forwarded API contract.
        unsafe { create(pStream, flags, priority) }
    }

    /// `cudaStreamDestroy`.
    fn cudaStreamDestroy(stream: cudaStream_t) { ops::destroy(stream as usize) }

    /// `cudaStreamSynchronize`.
    #[per_thread(cudaStreamSynchronize_ptsz)]
    fn cudaStreamSynchronize(stream: cudaStream_t) { ops::synchronize(stream as usize) }

    /// `cudaStreamQuery`: `cudaErrorNotReady` while work is pending (not recorded as an error).
    #[per_thread(cudaStreamQuery_ptsz)]
    fn cudaStreamQuery(stream: cudaStream_t) { ops::query(stream as usize) }

    /// `cudaStreamWaitEvent` (fire-and-forget).
    #[per_thread(cudaStreamWaitEvent_ptsz)]
    fn cudaStreamWaitEvent(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint) {
        ops::wait_event(stream as usize, event as usize, flags)
    }

    /// `cudaStreamGetFlags`.
    #[per_thread(cudaStreamGetFlags_ptsz)]
    fn cudaStreamGetFlags(hStream: cudaStream_t, flags: *mut c_uint) {
        non_null(flags)?;
        let s = ops::info(hStream as usize)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(flags, s.flags) }
    }

    /// `cudaStreamGetPriority`: the stream's priority (clamped to the device's range at
    /// creation, as the driver does).
    #[per_thread(cudaStreamGetPriority_ptsz)]
    fn cudaStreamGetPriority(hStream: cudaStream_t, priority: *mut c_int) {
        non_null(priority)?;
        let s = ops::info(hStream as usize)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(priority, s.priority) }
    }

    /// `cudaStreamGetDevice`.
    #[per_thread(cudaStreamGetDevice_ptsz)]
    fn cudaStreamGetDevice(hStream: cudaStream_t, device: *mut c_int) {
        non_null(device)?;
        let s = ops::info(hStream as usize)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(device, int_of_u32(s.device)) }
    }

    /// `cudaStreamGetId`.
    #[per_thread(cudaStreamGetId_ptsz)]
    fn cudaStreamGetId(hStream: cudaStream_t, streamId: *mut u64) {
        non_null(streamId)?;
        let v = ops::id(hStream as usize)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(streamId, v) }
    }

    /// `cudaDeviceGetStreamPriorityRange`: the device's real range (either pointer may be
    /// null).
    fn cudaDeviceGetStreamPriorityRange(leastPriority: *mut c_int, greatestPriority: *mut c_int) {
        let (least, greatest) = ops::priority_range()?;
        if !leastPriority.is_null() {
            // SAFETY: non-null and writable (API contract).
            unsafe { write_out(leastPriority, least) }?;
        }
        if !greatestPriority.is_null() {
            // SAFETY: non-null and writable (API contract).
            unsafe { write_out(greatestPriority, greatest) }?;
        }
        Ok(())
    }

}

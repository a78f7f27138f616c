//! Streams: create, destroy, synchronise, query, wait for an event, and the read-only queries
//! answered from the guest's own records. The `_ptsz` exports are the per-thread-default-stream
//! spellings; qcuda sends that stream to the host's legacy stream (streams.rs at the crate root).

use crate::core::conv::{c_int_of, int_of_u32};
use core::ffi::{c_int, c_uint, c_void};

use super::write_out;
use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::host_fns::{self, HostCallback, HostFn, StreamCallback},
    core::host_memory::HostKind,
    core::runtime::{current, non_null, runtime},
    generated::{cudaEvent_t, cudaStream_t},
};

fn synchronize(stream: cudaStream_t) -> CudaResult<()> {
    let (rt, _) = current()?;
    rt.streams.synchronize(&rt.session, stream as usize)?;
    crate::core::managed_vars::after_sync(rt)
}

/// `cudaStreamAttachMemAsync`: which streams' work may touch a managed range while the CPU does.
/// qcuda's managed memory is guest RAM that the CPU and the GPU reach coherently at all times
/// (docs/ARCHITECTURE.md, "Host memory"), so every attachment already holds; the call checks its
/// arguments as CUDA does and changes nothing.
fn attach_mem(
    stream: cudaStream_t,
    ptr: *mut c_void,
    length: usize,
    flags: c_uint,
) -> CudaResult<()> {
    const GLOBAL: c_uint = 1;
    const HOST: c_uint = 2;
    const SINGLE: c_uint = 4;
    if flags != GLOBAL && flags != HOST && flags != SINGLE {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, _) = current()?;
    rt.streams.target(stream as usize)?;
    if flags == SINGLE && stream.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let a = rt
        .host_memory
        .find(ptr as usize)
        .filter(|a| a.kind == HostKind::Managed)
        .ok_or(CudaError::INVALID_VALUE)?;
    // Length 0 names the whole allocation, which `ptr` must then start.
    if (length == 0 && a.base != ptr as usize) || (length != 0 && length != a.size) {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(())
}

/// `cudaLaunchHostFunc`: `func(user_data)` runs in this process when the stream reaches it.
fn launch_host_func(stream: cudaStream_t, func: HostFn, user_data: *mut c_void) -> CudaResult<()> {
    let func = func.ok_or(CudaError::INVALID_VALUE)?;
    let rt = runtime()?;
    host_fns::launch(
        rt,
        stream as usize,
        HostCallback::Func {
            func,
            data: user_data as usize,
        },
    )
}

/// `cudaStreamAddCallback`: as a host function, called with the stream and `cudaSuccess` (a
/// stream whose context holds an error runs nothing, as CUDA documents). `flags` must be 0.
fn add_callback(
    stream: cudaStream_t,
    callback: StreamCallback,
    user_data: *mut c_void,
    flags: c_uint,
) -> CudaResult<()> {
    let func = callback.ok_or(CudaError::INVALID_VALUE)?;
    if flags != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let rt = runtime()?;
    host_fns::launch(
        rt,
        stream as usize,
        HostCallback::Stream {
            func,
            stream: stream as usize,
            data: user_data as usize,
        },
    )
}

fn query(stream: cudaStream_t) -> CudaResult<()> {
    let (rt, _) = current()?;
    rt.streams.query(&rt.session, stream as usize)
}

fn wait_event(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    let (rt, _) = current()?;
    rt.events.stream_wait(
        &rt.session,
        &rt.streams,
        stream as usize,
        event as usize,
        flags,
    )
}

unsafe fn get_flags(stream: cudaStream_t, flags: *mut c_uint) -> CudaResult<()> {
    non_null(flags)?;
    let (rt, _) = current()?;
    let s = rt.streams.info(stream as usize)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(flags, s.flags) }
}

unsafe fn get_priority(stream: cudaStream_t, priority: *mut c_int) -> CudaResult<()> {
    non_null(priority)?;
    let (rt, _) = current()?;
    let s = rt.streams.info(stream as usize)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(priority, s.priority) }
}

unsafe fn get_device(stream: cudaStream_t, device: *mut c_int) -> CudaResult<()> {
    non_null(device)?;
    let (rt, _) = current()?;
    let s = rt.streams.info(stream as usize)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(device, int_of_u32(s.device)) }
}

unsafe fn get_id(stream: cudaStream_t, id: *mut u64) -> CudaResult<()> {
    non_null(id)?;
    let (rt, _) = current()?;
    let v = rt.streams.id(&rt.session, stream as usize)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(id, v) }
}

unsafe fn create(stream: *mut cudaStream_t, flags: c_uint, priority: c_int) -> CudaResult<()> {
    non_null(stream)?;
    let (rt, d) = current()?;
    let h = rt.streams.create(&rt.session, d, flags, priority)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(stream, h as cudaStream_t) }
}

cuda_api! {
    /// `cudaLaunchHostFunc` (see `host_fns`).
    #[per_thread(cudaLaunchHostFunc_ptsz)]
    fn cudaLaunchHostFunc(stream: cudaStream_t, fn_: HostFn, userData: *mut c_void) {
        launch_host_func(stream, fn_, userData)
    }

    /// `cudaStreamAddCallback` (see `host_fns`).
    #[per_thread(cudaStreamAddCallback_ptsz)]
    fn cudaStreamAddCallback(stream: cudaStream_t, callback: StreamCallback, userData: *mut c_void, flags: c_uint) {
        add_callback(stream, callback, userData, flags)
    }

    /// `cudaStreamAttachMemAsync` (see `attach_mem`).
    #[per_thread(cudaStreamAttachMemAsync_ptsz)]
    fn cudaStreamAttachMemAsync(stream: cudaStream_t, devPtr: *mut c_void, length: usize, flags: c_uint) {
        attach_mem(stream, devPtr, length, flags)
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
    fn cudaStreamDestroy(stream: cudaStream_t) {
        let (rt, _) = current()?;
        rt.streams.destroy(&rt.session, stream as usize)?;
        // A capture of the stream ends with it.
        rt.session.captures.ended(stream as usize);
        Ok(())
    }

    /// `cudaStreamSynchronize`.
    #[per_thread(cudaStreamSynchronize_ptsz)]
    fn cudaStreamSynchronize(stream: cudaStream_t) { synchronize(stream) }

    /// `cudaStreamQuery`: `cudaErrorNotReady` while work is pending (not recorded as an error).
    #[per_thread(cudaStreamQuery_ptsz)]
    fn cudaStreamQuery(stream: cudaStream_t) { query(stream) }

    /// `cudaStreamWaitEvent` (fire-and-forget).
    #[per_thread(cudaStreamWaitEvent_ptsz)]
    fn cudaStreamWaitEvent(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint) {
        wait_event(stream, event, flags)
    }

    /// `cudaStreamGetFlags`.
    #[per_thread(cudaStreamGetFlags_ptsz)]
    fn cudaStreamGetFlags(hStream: cudaStream_t, flags: *mut c_uint) {
        // SAFETY: forwarded API contract.
        unsafe { get_flags(hStream, flags) }
    }

    /// `cudaStreamGetPriority`: the stream's priority (clamped to the device's range at
    /// creation, as the driver does).
    #[per_thread(cudaStreamGetPriority_ptsz)]
    fn cudaStreamGetPriority(hStream: cudaStream_t, priority: *mut c_int) {
        // SAFETY: forwarded API contract.
        unsafe { get_priority(hStream, priority) }
    }

    /// `cudaStreamGetDevice`.
    #[per_thread(cudaStreamGetDevice_ptsz)]
    fn cudaStreamGetDevice(hStream: cudaStream_t, device: *mut c_int) {
        // SAFETY: forwarded API contract.
        unsafe { get_device(hStream, device) }
    }

    /// `cudaStreamGetId`.
    #[per_thread(cudaStreamGetId_ptsz)]
    fn cudaStreamGetId(hStream: cudaStream_t, streamId: *mut u64) {
        // SAFETY: forwarded API contract.
        unsafe { get_id(hStream, streamId) }
    }

    /// `cudaDeviceGetStreamPriorityRange`: the device's real range (either pointer may be
    /// null).
    fn cudaDeviceGetStreamPriorityRange(leastPriority: *mut c_int, greatestPriority: *mut c_int) {
        let (rt, d) = current()?;
        let reply = rt
            .session
            .submit(crate::core::transport::Call::new(qcuda_proto::Op::StreamPriorityRange, d))?;
        if !leastPriority.is_null() {
            // SAFETY: non-null and writable (API contract).
            unsafe { write_out(leastPriority, c_int_of(reply.rets[0])) }?;
        }
        if !greatestPriority.is_null() {
            // SAFETY: non-null and writable (API contract).
            unsafe { write_out(greatestPriority, c_int_of(reply.rets[1])) }?;
        }
        Ok(())
    }

}

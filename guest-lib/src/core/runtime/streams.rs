//! The stream operations both API faces offer, on the calling thread's current device (its
//! current context's device for the driver face): each face checks and writes its
//! out-parameters and turns the error into its own status.

use core::ffi::c_void;

use qcuda_proto::Op;

use crate::core::{
    conv::c_int_of,
    cuda_error::{CudaError, CudaResult},
    runtime::{current, runtime, Runtime},
    streams::{
        host_fns::{HostCallback, HostFn, StreamCallback},
        StreamInfo,
    },
    transport::Call,
};

/// `cudaStreamCreateWithPriority`/`cuStreamCreateWithPriority`: the new stream's handle.
pub fn create(flags: u32, priority: i32) -> CudaResult<usize> {
    let (rt, d) = current()?;
    rt.streams.create(&rt.session, d, flags, priority)
}

/// `cudaStreamDestroy`: a capture of the stream ends with it.
pub fn destroy(stream: usize) -> CudaResult<()> {
    let (rt, _) = current()?;
    let host = rt.streams.target(stream).map(|t| t.wire);
    rt.streams.destroy(&rt.session, stream)?;
    if let Ok(host) = host {
        // What was attached to the stream alone is attached globally now.
        rt.host_memory.managed.forget_stream(host);
    }
    rt.session.captures.ended(stream);
    Ok(())
}

/// `cudaStreamSynchronize`: then managed variables read what the device wrote. With no
/// request made since a synchronisation that covered the stream succeeded, there is
/// nothing to wait for and no round trip is made (as an idle stream costs natively).
pub fn synchronize(stream: usize) -> CudaResult<()> {
    let (rt, _) = current()?;
    let t = rt.streams.target(stream)?;
    rt.session.check_sticky(t.device)?;
    if !rt.session.already_drained(t.device, Some(t.wire)) {
        let before = rt.session.requests_made();
        rt.streams.synchronize(&rt.session, stream)?;
        rt.session.drained(before, t.device, Some(t.wire));
    }
    crate::core::runtime::managed::after_sync(rt)
}

/// `cudaStreamQuery`: `cudaErrorNotReady` while work is pending. An answer of "done"
/// covers the stream as a synchronisation does (see `synchronize`), and a stream known to
/// be done is answered without a round trip.
pub fn query(stream: usize) -> CudaResult<()> {
    let (rt, _) = current()?;
    let t = rt.streams.target(stream)?;
    rt.session.check_sticky(t.device)?;
    if rt.session.already_drained(t.device, Some(t.wire)) {
        return Ok(());
    }
    let before = rt.session.requests_made();
    rt.streams.query(&rt.session, stream)?;
    rt.session.drained(before, t.device, Some(t.wire));
    Ok(())
}

/// `cudaStreamWaitEvent` (fire-and-forget).
pub fn wait_event(stream: usize, event: usize, flags: u32) -> CudaResult<()> {
    let (rt, _) = current()?;
    rt.events
        .stream_wait(&rt.session, &rt.streams, stream, event, flags)
}

/// The stream's record: creation flags, priority, device.
pub fn info(stream: usize) -> CudaResult<StreamInfo> {
    let (rt, _) = current()?;
    rt.streams.info(stream)
}

/// `cudaStreamGetId`.
pub fn id(stream: usize) -> CudaResult<u64> {
    let (rt, _) = current()?;
    rt.streams.id(&rt.session, stream)
}

/// `cudaDeviceGetStreamPriorityRange` of the current device: (least, greatest).
pub fn priority_range() -> CudaResult<(i32, i32)> {
    let (rt, d) = current()?;
    let reply = rt.session.submit(Call::new(Op::StreamPriorityRange, d))?;
    Ok((c_int_of(reply.rets[0]), c_int_of(reply.rets[1])))
}

/// `cudaLaunchHostFunc`: `func(user_data)` runs in this process when the stream reaches it.
pub fn launch_host_func(stream: usize, func: HostFn, user_data: *mut c_void) -> CudaResult<()> {
    let func = func.ok_or(CudaError::INVALID_VALUE)?;
    enqueue_host_fn(
        runtime()?,
        stream,
        HostCallback::Func {
            func,
            data: user_data as usize,
        },
    )
}

/// `cudaStreamAddCallback`: as a host function, called with the stream and `cudaSuccess` (a
/// stream whose context holds an error runs nothing, as CUDA documents). `flags` must be 0.
pub fn add_callback(
    stream: usize,
    callback: StreamCallback,
    user_data: *mut c_void,
    flags: u32,
) -> CudaResult<()> {
    let func = callback.ok_or(CudaError::INVALID_VALUE)?;
    if flags != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    enqueue_host_fn(
        runtime()?,
        stream,
        HostCallback::Stream {
            func,
            stream,
            data: user_data as usize,
        },
    )
}

/// Enqueues `callback` on stream `stream` (the application's handle) of the calling thread's
/// device.
fn enqueue_host_fn(rt: &'static Runtime, stream: usize, callback: HostCallback) -> CudaResult<()> {
    let target = rt.streams.target(stream)?;
    let key = rt.host_fns.register(&rt.session, callback, true)?;
    match rt
        .session
        .submit(Call::new(Op::LaunchHostFunc, target.device).args(&[target.wire, key]))
    {
        Ok(reply) => {
            if reply.rets[0] != 0 {
                // Captured into a graph: it runs each time the graph does.
                rt.host_fns.keep(key);
            }
            Ok(())
        }
        Err(e) => {
            rt.host_fns.forget(key);
            Err(e)
        }
    }
}

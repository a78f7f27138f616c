//! Streams: `cudaStream_t` handles and the stream ops.
//!
//! The default stream (`0`), `cudaStreamLegacy` and `cudaStreamPerThread` all go to the host as
//! its legacy stream (`0` on the wire). Mapping the per-thread default stream to the legacy
//! stream keeps every result correct; it only synchronises more than CUDA would.

use crate::core::conv::{c_int_of, int_word};
use qcuda_proto::Op;

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::devices,
    core::handles::HandleTable,
    core::session::Session,
    core::transport::Call,
    generated::cudaStreamNonBlocking,
};

/// `cudaStreamLegacy`.
pub const LEGACY: usize = 1;
/// `cudaStreamPerThread`.
pub const PER_THREAD: usize = 2;

/// A stream the application created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamInfo {
    /// The host's handle.
    pub host: u64,
    /// The device that was current at creation.
    pub device: u32,
    /// `cudaStreamDefault` or `cudaStreamNonBlocking`.
    pub flags: u32,
    /// The priority the stream got (the host clamps the one asked for to the device's range).
    pub priority: i32,
}

/// Where a stream argument sends work: the host's stream handle and the device it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTarget {
    /// The handle on the wire (0: legacy stream).
    pub wire: u64,
    /// The device ordinal for the request.
    pub device: u32,
}

/// The streams of this process.
#[derive(Debug, Default)]
pub struct Streams {
    table: HandleTable<StreamInfo>,
}

fn is_default(handle: usize) -> bool {
    matches!(handle, 0 | LEGACY | PER_THREAD)
}

impl Streams {
    /// `cudaStreamCreateWithPriority` on `device`.
    pub fn create(
        &self,
        session: &Session,
        device: u32,
        flags: u32,
        priority: i32,
    ) -> CudaResult<usize> {
        if flags & !cudaStreamNonBlocking != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let reply = session.submit(
            Call::new(Op::StreamCreate, device).args(&[u64::from(flags), int_word(priority)]),
        )?;
        Ok(self.table.insert(StreamInfo {
            host: reply.rets[0],
            device,
            flags,
            priority: c_int_of(reply.rets[1]),
        }))
    }

    /// `cudaStreamDestroy`.
    pub fn destroy(&self, session: &Session, handle: usize) -> CudaResult<()> {
        if is_default(handle) {
            return Err(CudaError::INVALID_RESOURCE_HANDLE);
        }
        let info = self
            .table
            .get(handle)
            .ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
        session.submit(Call::new(Op::StreamDestroy, info.device).args(&[info.host]))?;
        self.table.remove(handle);
        Ok(())
    }

    /// The record of a stream argument; the default streams read as flags 0, priority 0 on
    /// the current device.
    pub fn info(&self, handle: usize) -> CudaResult<StreamInfo> {
        if is_default(handle) {
            return Ok(StreamInfo {
                host: 0,
                device: devices::current(),
                flags: 0,
                priority: 0,
            });
        }
        self.table
            .get(handle)
            .ok_or(CudaError::INVALID_RESOURCE_HANDLE)
    }

    /// Where work submitted to `handle` goes.
    pub fn target(&self, handle: usize) -> CudaResult<StreamTarget> {
        let info = self.info(handle)?;
        Ok(StreamTarget {
            wire: info.host,
            device: info.device,
        })
    }

    /// `cudaStreamGetId`: the driver's id of the stream (the legacy stream's for the default
    /// streams).
    pub fn id(&self, session: &Session, handle: usize) -> CudaResult<u64> {
        let t = self.target(handle)?;
        let reply = session.submit(Call::new(Op::StreamGetId, t.device).args(&[t.wire]))?;
        Ok(reply.rets[0])
    }

    /// `cudaStreamSynchronize`.
    pub fn synchronize(&self, session: &Session, handle: usize) -> CudaResult<()> {
        let t = self.target(handle)?;
        session.submit(Call::new(Op::StreamSynchronize, t.device).args(&[t.wire]))?;
        Ok(())
    }

    /// `cudaStreamQuery`: `Ok` when idle, `cudaErrorNotReady` while work is pending.
    pub fn query(&self, session: &Session, handle: usize) -> CudaResult<()> {
        let t = self.target(handle)?;
        session.submit(Call::new(Op::StreamQuery, t.device).args(&[t.wire]))?;
        Ok(())
    }

    /// Forgets the streams of `device` (the host freed them in `DeviceReset`).
    pub fn forget_device(&self, device: u32) {
        self.table.retain(|s| s.device != device);
    }
}

/// The stream operations both API faces offer, on the calling thread's current device (its
/// current context's device for the driver face): each face checks and writes its
/// out-parameters and turns the error into its own status.
pub mod ops {
    use core::ffi::c_void;

    use qcuda_proto::Op;

    use crate::core::{
        conv::c_int_of,
        cuda_error::{CudaError, CudaResult},
        host_fns::{self, HostCallback, HostFn, StreamCallback},
        runtime::{current, runtime},
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
        rt.streams.destroy(&rt.session, stream)?;
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
        crate::core::managed_vars::after_sync(rt)
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
    pub fn info(stream: usize) -> CudaResult<super::StreamInfo> {
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
        host_fns::launch(
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
        host_fns::launch(
            runtime()?,
            stream,
            HostCallback::Stream {
                func,
                stream,
                data: user_data as usize,
            },
        )
    }
}

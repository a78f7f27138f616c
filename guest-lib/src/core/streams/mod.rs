//! Streams (this file: `cudaStream_t` handles), events (`events`: `cudaEvent_t` handles; an
//! event acts on a stream its caller gives it) and host functions (`host_fns`: the functions
//! streams and graph host nodes run in this process, and the thread that waits for them).
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
    core::transport::session::Session,
    core::transport::Call,
    generated::cudaStreamNonBlocking,
};

pub mod events;
pub mod host_fns;

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

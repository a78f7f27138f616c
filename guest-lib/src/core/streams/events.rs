//! Events: `cudaEvent_t` handles and the event ops. Recording an event and making a stream wait
//! for one are fire-and-forget; synchronising, querying and timing wait for the host.

use std::sync::{Mutex, PoisonError};

use crate::core::conv::low_u32;
use qcuda_proto::{Op, WaitMode};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::handles::HandleTable,
    core::streams::Streams,
    core::transport::session::Session,
    core::transport::Call,
    generated::{
        cudaEventBlockingSync, cudaEventDisableTiming, cudaEventInterprocess, cudaEventWaitDefault,
    },
};

/// An event the application created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventInfo {
    /// The host's handle.
    pub host: u64,
    /// The device that was current at creation.
    pub device: u32,
    /// `cudaEvent*` creation flags.
    pub flags: u32,
}

/// How many events are remembered as complete at once (see [`Events::known_complete`]).
const COMPLETE_KEPT: usize = 8;

/// The events of this process.
#[derive(Debug, Default)]
pub struct Events {
    table: HandleTable<EventInfo>,
    /// Events the host last said were complete: (handle, the session's request count then).
    complete: Mutex<Vec<(usize, u64)>>,
}

impl Events {
    /// `cudaEventCreateWithFlags` on `device`.
    pub fn create(&self, session: &Session, device: u32, flags: u32) -> CudaResult<usize> {
        if flags & !(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess) != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let reply = session.submit(Call::new(Op::EventCreate, device).args(&[u64::from(flags)]))?;
        Ok(self.table.insert(EventInfo {
            host: reply.rets[0],
            device,
            flags,
        }))
    }

    /// The record of `handle`.
    pub fn info(&self, handle: usize) -> CudaResult<EventInfo> {
        self.table
            .get(handle)
            .ok_or(CudaError::INVALID_RESOURCE_HANDLE)
    }

    /// `cudaEventDestroy`.
    pub fn destroy(&self, session: &Session, handle: usize) -> CudaResult<()> {
        let e = self.info(handle)?;
        session.submit(Call::new(Op::EventDestroy, e.device).args(&[e.host]))?;
        self.table.remove(handle);
        self.complete
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&(h, _)| h != handle);
        Ok(())
    }

    /// `cudaEventRecord` (fire-and-forget).
    pub fn record(
        &self,
        session: &Session,
        streams: &Streams,
        handle: usize,
        stream: usize,
    ) -> CudaResult<()> {
        let e = self.info(handle)?;
        let s = streams.target(stream)?;
        let call = Call::new(Op::EventRecord, e.device).args(&[e.host, s.wire]);
        // Another process may wait for an interprocess event as soon as this returns (it
        // learns of the record through a channel of the program's own): the record, and the
        // work before it, must be on the host by then, not in this process's batch.
        if e.flags & cudaEventInterprocess != 0 {
            session.submit(call)?;
        } else {
            session.submit(call.fire_and_forget())?;
        }
        Ok(())
    }

    /// The application's handle for an event the host opened from another process's
    /// interprocess event (core/runtime/ipc.rs), on `device`.
    pub fn adopt(&self, host: u64, device: u32) -> usize {
        self.table.insert(EventInfo {
            host,
            device,
            flags: cudaEventInterprocess | cudaEventDisableTiming,
        })
    }

    /// The application's handle of the event with host handle `host`.
    pub fn by_host(&self, host: u64) -> Option<usize> {
        self.table.find(|e| e.host == host)
    }

    /// Whether `handle` is known to be complete without asking: the host said so (a
    /// synchronisation or query of it succeeded) and this process made no request since, so
    /// the event was not recorded again, no graph re-recorded it and no earlier failure can be
    /// unreported. Natively such a query reads a completed flag; here it then makes no round
    /// trip. An interprocess event may be recorded by another process, so it is always asked,
    /// as is every event while a capture is under way (capture rules).
    fn known_complete(&self, session: &Session, handle: usize, e: &EventInfo) -> bool {
        if e.flags & cudaEventInterprocess != 0 || session.captures.active() {
            return false;
        }
        let now = session.requests_made();
        let complete = self.complete.lock().unwrap_or_else(PoisonError::into_inner);
        complete
            .iter()
            .any(|&(h, count)| h == handle && count == now)
    }

    /// The host said `handle` is complete, answering the request made after the session's
    /// request count was `before`.
    fn completed(&self, handle: usize, before: u64) {
        let mut complete = self.complete.lock().unwrap_or_else(PoisonError::into_inner);
        // The request count only grows: entries of an older count can never match again.
        let count = before + 1;
        complete.retain(|&(h, c)| h != handle && c == count);
        if complete.len() == COMPLETE_KEPT {
            complete.remove(0);
        }
        complete.push((handle, count));
    }

    /// `cudaEventSynchronize`.
    pub fn synchronize(&self, session: &Session, handle: usize) -> CudaResult<()> {
        let e = self.info(handle)?;
        if self.known_complete(session, handle, &e) {
            return session.check_sticky(e.device);
        }
        let mut call = Call::new(Op::EventSynchronize, e.device).args(&[e.host]);
        if e.flags & cudaEventBlockingSync != 0 {
            // The event asks its waiters to block, whatever the device's flags.
            call = call.wait_as(WaitMode::Block);
        }
        let before = session.requests_made();
        session.submit(call)?;
        self.completed(handle, before);
        Ok(())
    }

    /// `cudaEventQuery`: `Ok` when complete, `cudaErrorNotReady` while pending.
    pub fn query(&self, session: &Session, handle: usize) -> CudaResult<()> {
        let e = self.info(handle)?;
        if self.known_complete(session, handle, &e) {
            return session.check_sticky(e.device);
        }
        let before = session.requests_made();
        session.submit(Call::new(Op::EventQuery, e.device).args(&[e.host]))?;
        self.completed(handle, before);
        Ok(())
    }

    /// `cudaEventElapsedTime` in milliseconds.
    pub fn elapsed_ms(&self, session: &Session, start: usize, end: usize) -> CudaResult<f32> {
        let s = self.info(start)?;
        let e = self.info(end)?;
        let reply =
            session.submit(Call::new(Op::EventElapsedTime, s.device).args(&[s.host, e.host]))?;
        Ok(f32::from_bits(low_u32(reply.rets[0])))
    }

    /// `cudaStreamWaitEvent` (fire-and-forget).
    pub fn stream_wait(
        &self,
        session: &Session,
        streams: &Streams,
        stream: usize,
        handle: usize,
        flags: u32,
    ) -> CudaResult<()> {
        if flags != cudaEventWaitDefault {
            // cudaEventWaitExternal only matters under stream capture, which qcuda lacks.
            return Err(CudaError::NOT_SUPPORTED);
        }
        let e = self.info(handle)?;
        let s = streams.target(stream)?;
        session.submit(
            Call::new(Op::StreamWaitEvent, s.device)
                .args(&[s.wire, e.host, u64::from(flags)])
                .fire_and_forget(),
        )?;
        Ok(())
    }

    /// Forgets the events of `device` (the host freed them in `DeviceReset`).
    pub fn forget_device(&self, device: u32) {
        self.table.retain(|e| e.device != device);
    }
}

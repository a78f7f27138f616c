//! Stream capture, the guest's side: which captures this process has begun, by which thread
//! and in which mode, and each thread's capture mode (`cudaThreadExchangeStreamCaptureMode`).
//!
//! The host's driver does the capturing itself (vhost-cuda/src/cuda/session/graphs.rs), but one
//! worker thread serves every thread of the process, so the driver cannot tell guest threads
//! apart: the worker runs in the relaxed mode, and the per-thread rule of CUDA's global and
//! thread-local modes is applied here. A call that is potentially unsafe during capture
//! (`cudaMalloc`, host allocations and registrations, synchronous copies and memsets) fails with
//! `cudaErrorStreamCaptureUnsupported` when CUDA prohibits it for the calling thread:
//!
//! - a thread in relaxed mode may always make it;
//! - otherwise not while the thread itself has a capture under way that did not begin relaxed;
//! - and a thread in global mode not while any other thread has a global-mode capture.
//!
//! While any capture is under way, every request waits for its answer (no fire-and-forget), so
//! that a launch, copy or record refused during capture fails at its own call, as in CUDA.

use std::{
    cell::Cell,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, PoisonError,
    },
    thread::{self, ThreadId},
};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    generated::{cudaStreamCaptureMode, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Capture {
    /// The guest's stream handle.
    stream: usize,
    /// Its handle on the wire and its device.
    wire: u64,
    device: u32,
    thread: ThreadId,
    mode: cudaStreamCaptureMode,
}

thread_local! {
    static MODE: Cell<cudaStreamCaptureMode> = const { Cell::new(cudaStreamCaptureModeGlobal) };
}

/// Whether a capture mode value is one CUDA defines.
pub fn valid_mode(mode: cudaStreamCaptureMode) -> bool {
    // Global (0), thread-local (1), relaxed (2).
    mode <= cudaStreamCaptureModeRelaxed
}

/// `cudaThreadExchangeStreamCaptureMode`: sets the calling thread's mode, returns the old one.
pub fn exchange_mode(mode: cudaStreamCaptureMode) -> CudaResult<cudaStreamCaptureMode> {
    if !valid_mode(mode) {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(MODE.with(|m| m.replace(mode)))
}

/// The captures this process began and has not ended (kept in its `Session`).
#[derive(Debug, Default)]
pub struct Captures {
    list: Mutex<Vec<Capture>>,
    active: AtomicUsize,
}

impl Captures {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Capture>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// True while any capture this process began is under way.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed) != 0
    }

    /// Records that the calling thread began capturing `stream` in `mode` (the host accepted
    /// it).
    pub fn begun(&self, stream: usize, wire: u64, device: u32, mode: cudaStreamCaptureMode) {
        let mut c = self.lock();
        c.retain(|x| x.stream != stream);
        c.push(Capture {
            stream,
            wire,
            device,
            thread: thread::current().id(),
            mode,
        });
        self.active.store(c.len(), Ordering::Relaxed);
    }

    /// Checks that the calling thread may end the capture of `stream`: a capture that did not
    /// begin relaxed ends in the thread that began it (`cudaErrorStreamCaptureWrongThread`).
    pub fn check_end(&self, stream: usize) -> CudaResult<()> {
        let me = thread::current().id();
        match self.lock().iter().find(|x| x.stream == stream) {
            Some(x) if x.mode != cudaStreamCaptureModeRelaxed && x.thread != me => {
                Err(CudaError::STREAM_CAPTURE_WRONG_THREAD)
            }
            _ => Ok(()),
        }
    }

    /// Forgets the captures on `device` (`cudaDeviceReset` destroyed their streams).
    pub fn forget_device(&self, device: u32) {
        let mut c = self.lock();
        c.retain(|x| x.device != device);
        self.active.store(c.len(), Ordering::Relaxed);
    }

    /// Forgets the capture of `stream` (ended, failed, or its stream destroyed).
    pub fn ended(&self, stream: usize) {
        let mut c = self.lock();
        c.retain(|x| x.stream != stream);
        self.active.store(c.len(), Ordering::Relaxed);
    }

    /// Fails like `Session::check_unsafe_call`, without telling the host (tests).
    #[cfg(test)]
    fn check_local(&self) -> CudaResult<()> {
        if self.prohibiting().is_empty() {
            Ok(())
        } else {
            Err(CudaError::STREAM_CAPTURE_UNSUPPORTED)
        }
    }

    /// The captures that prohibit potentially unsafe calls of the calling thread now (see the
    /// module documentation), as (device, stream on the wire): `Session::check_unsafe_call`
    /// fails the call and invalidates them on the host, as CUDA invalidates them.
    pub fn prohibiting(&self) -> Vec<(u32, u64)> {
        if !self.active() {
            return Vec::new();
        }
        let mode = MODE.with(Cell::get);
        if mode == cudaStreamCaptureModeRelaxed {
            return Vec::new();
        }
        let me = thread::current().id();
        self.lock()
            .iter()
            .filter(|x| {
                if x.thread == me {
                    x.mode != cudaStreamCaptureModeRelaxed
                } else {
                    mode == cudaStreamCaptureModeGlobal && x.mode == cudaStreamCaptureModeGlobal
                }
            })
            .map(|x| (x.device, x.wire))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::cudaStreamCaptureModeThreadLocal;

    fn in_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        thread::scope(|s| s.spawn(f).join().unwrap())
    }

    #[test]
    fn the_modes_decide_who_may_make_unsafe_calls() {
        let c = Captures::default();
        c.check_local().unwrap();
        c.begun(1, 1, 0, cudaStreamCaptureModeGlobal);
        let refused = Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(c.check_local(), refused);
        // Another thread: refused in global mode, allowed in thread-local or relaxed mode.
        assert_eq!(in_thread(|| c.check_local()), refused);
        in_thread(|| {
            exchange_mode(cudaStreamCaptureModeThreadLocal).unwrap();
            c.check_local()
        })
        .unwrap();
        // Only the thread that began a global capture may end it.
        assert_eq!(
            in_thread(|| c.check_end(1)),
            Err(CudaError::STREAM_CAPTURE_WRONG_THREAD)
        );
        c.check_end(1).unwrap();
        c.ended(1);
        // A thread-local capture binds only its own thread.
        c.begun(2, 2, 0, cudaStreamCaptureModeThreadLocal);
        assert_eq!(c.check_local(), refused);
        in_thread(|| c.check_local()).unwrap();
        assert_eq!(
            exchange_mode(cudaStreamCaptureModeRelaxed),
            Ok(cudaStreamCaptureModeGlobal)
        );
        c.check_local().unwrap();
        exchange_mode(cudaStreamCaptureModeGlobal).unwrap();
        // Relaxed captures bind nobody, and may end anywhere.
        c.ended(2);
        c.begun(3, 3, 0, cudaStreamCaptureModeRelaxed);
        c.check_local().unwrap();
        in_thread(|| c.check_end(3)).unwrap();
        assert_eq!(exchange_mode(9), Err(CudaError::INVALID_VALUE));
    }
}

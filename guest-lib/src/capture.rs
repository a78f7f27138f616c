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
    cuda_error::{CudaError, CudaResult},
    generated::{cudaStreamCaptureMode, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Capture {
    /// The guest's stream handle.
    stream: usize,
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
    pub fn begun(&self, stream: usize, mode: cudaStreamCaptureMode) {
        let mut c = self.lock();
        c.retain(|x| x.stream != stream);
        c.push(Capture {
            stream,
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

    /// Forgets the capture of `stream` (ended, failed, or its stream destroyed).
    pub fn ended(&self, stream: usize) {
        let mut c = self.lock();
        c.retain(|x| x.stream != stream);
        self.active.store(c.len(), Ordering::Relaxed);
    }

    /// Fails with `cudaErrorStreamCaptureUnsupported` if CUDA prohibits potentially unsafe
    /// calls for the calling thread now (see the module documentation).
    pub fn check_unsafe_call(&self) -> CudaResult<()> {
        if !self.active() {
            return Ok(());
        }
        let mode = MODE.with(Cell::get);
        if mode == cudaStreamCaptureModeRelaxed {
            return Ok(());
        }
        let me = thread::current().id();
        let prohibited = self.lock().iter().any(|x| {
            if x.thread == me {
                x.mode != cudaStreamCaptureModeRelaxed
            } else {
                mode == cudaStreamCaptureModeGlobal && x.mode == cudaStreamCaptureModeGlobal
            }
        });
        if prohibited {
            Err(CudaError::STREAM_CAPTURE_UNSUPPORTED)
        } else {
            Ok(())
        }
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
        c.check_unsafe_call().unwrap();
        c.begun(1, cudaStreamCaptureModeGlobal);
        let refused = Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(c.check_unsafe_call(), refused);
        // Another thread: refused in global mode, allowed in thread-local or relaxed mode.
        assert_eq!(in_thread(|| c.check_unsafe_call()), refused);
        in_thread(|| {
            exchange_mode(cudaStreamCaptureModeThreadLocal).unwrap();
            c.check_unsafe_call()
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
        c.begun(2, cudaStreamCaptureModeThreadLocal);
        assert_eq!(c.check_unsafe_call(), refused);
        in_thread(|| c.check_unsafe_call()).unwrap();
        assert_eq!(
            exchange_mode(cudaStreamCaptureModeRelaxed),
            Ok(cudaStreamCaptureModeGlobal)
        );
        c.check_unsafe_call().unwrap();
        exchange_mode(cudaStreamCaptureModeGlobal).unwrap();
        // Relaxed captures bind nobody, and may end anywhere.
        c.ended(2);
        c.begun(3, cudaStreamCaptureModeRelaxed);
        c.check_unsafe_call().unwrap();
        in_thread(|| c.check_end(3)).unwrap();
        assert_eq!(exchange_mode(9), Err(CudaError::INVALID_VALUE));
    }
}

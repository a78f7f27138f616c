//! Host functions: `cudaLaunchHostFunc`, `cudaStreamAddCallback` and graph host nodes run the
//! application's function in this process, in stream order.
//!
//! Each function gets a key; the host's worker enqueues a stand-in with the driver that, when
//! the stream reaches it, announces the key and holds the stream (vhost-cuda's
//! `cuda/host_functions.rs`). This process runs one thread of its own, started with the first
//! host function, that asks the host with `HostFuncWait` for the next due function, runs it,
//! and with its next `HostFuncWait` tells the host that it returned, which lets the stream go
//! on. So work queued after a host function starts only once it has returned, as in CUDA.
//! The daemon answers `HostFuncWait` beside the process's other requests, so a
//! `cudaStreamSynchronize` waiting for the function in another thread does not block it.
//!
//! As CUDA documents, a host function must not call CUDA functions that enqueue work or wait
//! for it; one that does may wait forever here as it may with NVIDIA's runtime.

use std::{
    collections::HashMap,
    ffi::c_void,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, MutexGuard, OnceLock,
    },
    thread,
};

use qcuda_proto::Op;

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::transport::Call,
    core::transport::{session::Session, signal_mask::SignalsBlocked},
    core::warnings::warn_once,
    generated::{cudaError_t, cudaStream_t},
};

/// `cudaHostFn_t`.
pub type HostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;
/// `cudaStreamCallback_t`.
pub type StreamCallback =
    Option<unsafe extern "C" fn(stream: cudaStream_t, status: cudaError_t, user_data: *mut c_void)>;

/// What runs when a host function is due.
#[derive(Debug, Clone, Copy)]
pub enum HostCallback {
    /// `cudaLaunchHostFunc`, graph host nodes: `func(data)`.
    Func {
        /// The function.
        func: unsafe extern "C" fn(*mut c_void),
        /// Its argument.
        data: usize,
    },
    /// `cudaStreamAddCallback`: `func(stream, cudaSuccess, data)`.
    Stream {
        /// The callback.
        func: unsafe extern "C" fn(cudaStream_t, cudaError_t, *mut c_void),
        /// The stream it was added to, as the application named it.
        stream: usize,
        /// Its argument.
        data: usize,
    },
}

impl HostCallback {
    /// Runs it.
    ///
    /// # Safety
    /// The application's function and data, as it passed them to CUDA.
    unsafe fn run(self) {
        match self {
            // SAFETY: the caller's contract.
            Self::Func { func, data } => unsafe { func(data as *mut c_void) },
            // SAFETY: the caller's contract.
            Self::Stream { func, stream, data } => unsafe {
                func(stream as cudaStream_t, 0, data as *mut c_void);
            },
        }
    }
}

#[derive(Debug)]
struct Entry {
    callback: HostCallback,
    /// Forgotten after its run; otherwise kept until [`HostFns::forget`] (graph nodes).
    one_shot: bool,
}

/// This process's host functions (one set, in the runtime).
#[derive(Debug, Default)]
pub struct HostFns {
    table: Mutex<HashMap<u64, Entry>>,
    /// Graph host nodes (node handle) and the key of the function each runs.
    nodes: Mutex<HashMap<u64, u64>>,
    next_key: AtomicU64,
    /// The waiting thread, once started (or why it could not be).
    thread: OnceLock<CudaResult<()>>,
}

impl HostFns {
    fn table(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A key for `callback`, the waiting thread started (it asks `session` for due functions).
    /// `one_shot`: forgotten after one run.
    pub fn register(
        &'static self,
        session: &'static Session,
        callback: HostCallback,
        one_shot: bool,
    ) -> CudaResult<u64> {
        let started = self.thread.get_or_init(|| {
            thread::Builder::new()
                .name("qcuda-hostfn".into())
                .spawn(move || serve(session, self))
                .map(drop)
                .map_err(|_| CudaError::MEMORY_ALLOCATION)
        });
        (*started)?;
        let key = self.next_key.fetch_add(1, Ordering::Relaxed) + 1;
        self.table().insert(key, Entry { callback, one_shot });
        Ok(key)
    }

    /// Keeps `key` after its run (it became a graph node).
    pub fn keep(&self, key: u64) {
        if let Some(e) = self.table().get_mut(&key) {
            e.one_shot = false;
        }
    }

    /// Drops `key` (its launch failed, or its graph node is gone).
    pub fn forget(&self, key: u64) {
        self.table().remove(&key);
    }

    /// The callback of `key`, forgotten if it is one-shot.
    fn take(&self, key: u64) -> Option<HostCallback> {
        let mut t = self.table();
        let e = t.get(&key)?;
        let cb = e.callback;
        if e.one_shot {
            t.remove(&key);
        }
        Some(cb)
    }

    /// Records that graph node `node` runs the function of `key`.
    pub fn set_node(&self, node: u64, key: u64) {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node, key);
    }

    /// The function graph node `node` runs, if it is a host node this process made.
    pub fn node_callback(&self, node: u64) -> Option<HostCallback> {
        let key = *self
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)?;
        self.table().get(&key).map(|e| e.callback)
    }

    /// Registered keys (for tests).
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The waiting thread: runs due functions until the session ends.
fn serve(session: &Session, host_fns: &HostFns) {
    // Signals are for the application's threads; this one only waits on the device.
    let _blocked = SignalsBlocked::block();
    let mut released = 0u64;
    loop {
        let reply = match session.submit(Call::new(Op::HostFuncWait, 0).args(&[released])) {
            Ok(r) => r,
            Err(CudaError::CUDART_UNLOADING) => return,
            Err(e) => {
                warn_once!("host functions stop: waiting for the next one failed with {e:?}");
                return;
            }
        };
        let (key, seq) = (reply.rets[0], reply.rets[1]);
        match host_fns.take(key) {
            // SAFETY: the application's function and data, as it gave them to CUDA.
            Some(cb) => unsafe { cb.run() },
            None => warn_once!("host function {key} due but unknown; skipped"),
        }
        released = seq;
    }
}

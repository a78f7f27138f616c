//! What each session of a VM uses of the host ([`SessionAccount`], kept by its thread) and the
//! VM's totals, with the records the readers get ([`SessionView`], [`VmUsage`]); usage.rs
//! reads them off the table for each reader.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Instant,
};

use qcuda_proto::{SessionUsage, USAGE_CALLER, USAGE_FAILED, USAGE_GPU};

use super::locking::lock;
use crate::limits::{SlotUsage, WorkerUsage};

/// One session's accounting, shared by its thread (which updates it) and the table (which
/// reads it for snapshots).
#[derive(Debug)]
pub(super) struct SessionAccount {
    pub(super) id: u64,
    /// The guest pid the kernel module stamped (0 until a request carries one).
    pub(super) pid: AtomicU32,
    /// Its worker process's pid on the host, 0 while there is none.
    pub(super) worker_pid: Arc<AtomicU32>,
    /// The pid of the process holding its GPU contexts, where that is not `worker_pid` (the
    /// worker proper under its PID namespace's init), as `nvidia-smi` lists it; 0: none other.
    pub(super) gpu_pid: AtomicU32,
    pub(super) opened: Instant,
    /// The slot of its current worker, while it has one.
    pub(super) worker: Mutex<Option<SlotUsage>>,
    /// What its ended workers counted (memory: what the last one held when it ended; peak:
    /// the most of any).
    pub(super) ended: Mutex<WorkerUsage>,
    /// Its worker died; GPU ops fail until DeviceReset.
    pub(super) failed: AtomicBool,
    /// Closed: its counts have gone into the VM's totals (snapshots skip it).
    pub(super) closed: AtomicBool,
}

impl SessionAccount {
    pub(super) fn new(id: u64, pid: u32, worker_pid: Arc<AtomicU32>) -> Self {
        Self {
            id,
            pid: AtomicU32::new(pid),
            worker_pid,
            gpu_pid: AtomicU32::new(0),
            opened: Instant::now(),
            worker: Mutex::new(None),
            ended: Mutex::new(WorkerUsage::default()),
            failed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// Takes the guest pid of a request if none is known yet.
    pub(super) fn note_pid(&self, pid: u32) {
        // A load first: this runs for every request, and the pid is almost always known.
        if pid != 0 && self.pid.load(Ordering::Relaxed) == 0 {
            let _ = self
                .pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.pid.load(Ordering::Acquire)
    }

    /// The process holding the worker's GPU contexts (0: the worker process itself).
    pub(super) fn set_gpu_pid(&self, pid: u32) {
        self.gpu_pid.store(pid, Ordering::Release);
    }

    /// The pid the operator sees on the GPU (`nvidia-smi`), 0 while there is no worker.
    pub(super) fn reported_worker_pid(&self) -> u32 {
        match (
            self.worker_pid.load(Ordering::Acquire),
            self.gpu_pid.load(Ordering::Acquire),
        ) {
            (0, _) => 0,
            (w, 0) => w,
            (_, g) => g,
        }
    }

    /// Seconds since the session opened.
    pub(super) fn age_secs(&self) -> f64 {
        self.opened.elapsed().as_secs_f64()
    }

    /// A worker started, counting in `slot` (`None`: the VM has no accounting file).
    pub(super) fn worker_started(&self, slot: Option<SlotUsage>) {
        self.failed.store(false, Ordering::Release);
        *lock(&self.worker) = slot;
    }

    /// The worker is about to be ended: notes what it holds (its slot's bytes are cleared once
    /// it is reaped).
    pub(super) fn worker_ending(&self) {
        if let Some(slot) = lock(&self.worker).as_ref() {
            lock(&self.ended).memory = slot.read().memory;
        }
    }

    /// The worker was reaped: its final counts join the session's, and its slot is free.
    /// `failed`: it died unexpectedly.
    pub(super) fn worker_ended(&self, failed: bool) {
        if let Some(slot) = lock(&self.worker).take() {
            let last = slot.read();
            let mut e = lock(&self.ended);
            e.peak_memory = e.peak_memory.max(last.peak_memory);
            e.kernels = e.kernels.saturating_add(last.kernels);
            e.graph_launches = e.graph_launches.saturating_add(last.graph_launches);
            e.gpu_busy_ns = e.gpu_busy_ns.saturating_add(last.gpu_busy_ns);
            e.gpu_traced_ns = e.gpu_traced_ns.saturating_add(last.gpu_traced_ns);
        }
        self.failed.store(failed, Ordering::Release);
    }

    /// Its counts now: the current worker's and those of the ended ones.
    pub(super) fn totals(&self) -> WorkerUsage {
        let now = lock(&self.worker)
            .as_ref()
            .map(SlotUsage::read)
            .unwrap_or_default();
        let e = *lock(&self.ended);
        WorkerUsage {
            memory: now.memory,
            peak_memory: e.peak_memory.max(now.peak_memory),
            kernels: e.kernels.saturating_add(now.kernels),
            graph_launches: e.graph_launches.saturating_add(now.graph_launches),
            gpu_busy_ns: e.gpu_busy_ns.saturating_add(now.gpu_busy_ns),
            gpu_traced_ns: e.gpu_traced_ns.saturating_add(now.gpu_traced_ns),
        }
    }

    /// Bytes its current worker holds, or the last one held when it was ended: what the guest
    /// process left allocated when it went.
    pub(super) fn held_at_end(&self) -> u64 {
        match lock(&self.worker).as_ref() {
            Some(slot) => slot.read().memory,
            None => lock(&self.ended).memory,
        }
    }

    /// Marks the session closed; its final counts go into the VM's `totals`.
    pub(super) fn close_into(&self, totals: &VmTotals) -> WorkerUsage {
        self.closed.store(true, Ordering::Release);
        let t = self.totals();
        totals.ended_kernels.fetch_add(t.kernels, Ordering::AcqRel);
        totals
            .ended_graph_launches
            .fetch_add(t.graph_launches, Ordering::AcqRel);
        totals
            .ended_gpu_busy_ns
            .fetch_add(t.gpu_busy_ns, Ordering::AcqRel);
        totals
            .ended_gpu_traced_ns
            .fetch_add(t.gpu_traced_ns, Ordering::AcqRel);
        t
    }

    /// Its wire record; `caller`: the session that asks.
    pub(super) fn record(&self, caller: bool) -> SessionUsage {
        let t = self.totals();
        let mut flags = 0;
        if caller {
            flags |= USAGE_CALLER;
        }
        if self.worker_pid.load(Ordering::Acquire) != 0 {
            flags |= USAGE_GPU;
        }
        if self.failed.load(Ordering::Acquire) {
            flags |= USAGE_FAILED;
        }
        SessionUsage {
            session: self.id,
            pid: self.pid(),
            flags,
            memory: t.memory,
            peak_memory: t.peak_memory,
            kernels: t.kernels,
            graph_launches: t.graph_launches,
            age_ms: u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// A VM's counts over the sessions that have ended, since the connection began.
#[derive(Debug, Default)]
pub(super) struct VmTotals {
    pub(super) sessions_opened: AtomicU64,
    pub(super) ended_kernels: AtomicU64,
    pub(super) ended_graph_launches: AtomicU64,
    pub(super) ended_gpu_busy_ns: AtomicU64,
    pub(super) ended_gpu_traced_ns: AtomicU64,
    /// Worker processes of the VM's sessions reaped so far (a migration's source asks whether
    /// one ended while QEMU logged dirty pages).
    pub(super) workers_ended: AtomicU64,
}

/// One session in the host's view: its record and its worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionView {
    /// What the guest sees too.
    pub usage: SessionUsage,
    /// Its worker process on the host (what `nvidia-smi` on the host lists), 0 if none.
    pub worker_pid: u32,
    /// ns the GPU was busy with its work while a GPU timeline was recorded, and ns recorded
    /// (host only: the guest's record does not carry them).
    pub gpu_busy_ns: u64,
    /// See `gpu_busy_ns`.
    pub gpu_traced_ns: u64,
}

/// A VM's use of the host at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmUsage {
    /// The VM's label (its socket path).
    pub vm: String,
    /// Sessions open.
    pub sessions_open: usize,
    /// `--max-sessions` (or the built-in bound).
    pub max_sessions: usize,
    /// Bytes of device memory its sessions hold.
    pub memory: u64,
    /// `--max-gpu-memory`.
    pub memory_limit: Option<u64>,
    /// Kernels launched since the VM connected, by open and ended sessions.
    pub kernels: u64,
    /// Graphs launched since then.
    pub graph_launches: u64,
    /// Sessions opened since then.
    pub sessions_opened: u64,
    /// ns the GPU was busy with the VM's work while GPU timelines were recorded, since the VM
    /// connected (open and ended sessions).
    pub gpu_busy_ns: u64,
    /// ns of recording `gpu_busy_ns` was measured over (summed over sessions).
    pub gpu_traced_ns: u64,
    /// The open sessions, by session id.
    pub sessions: Vec<SessionView>,
}

/// Bytes for people: "0 B", "512 B", "4.0 KiB", "1.5 GiB" (`qcuda_proto::HumanBytes`).
pub fn bytes_text(b: u64) -> String {
    qcuda_proto::HumanBytes(b).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_for_people() {
        assert_eq!(bytes_text(0), "0 B");
        assert_eq!(bytes_text(1023), "1023 B");
        assert_eq!(bytes_text(4096), "4.0 KiB");
        assert_eq!(bytes_text(3 << 29), "1.5 GiB");
        assert_eq!(bytes_text(u64::MAX), "16384.0 PiB");
    }
}

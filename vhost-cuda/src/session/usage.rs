//! What each session of a VM uses of the host, and the VM's totals: device memory held (now
//! and at most), kernels and graphs launched, the guest process, how long it has been open.
//!
//! The counts come from the VM's accounting file (`limits.rs`), where each worker counts its
//! own allocations and launches; a [`SessionAccount`] follows the session's workers (a new one
//! starts after a reset) and keeps the counts of those that ended. Three readers: the guest's
//! `qcuda-smi` (`Op::VmUsage`, [`answer`]), the operator's `vhost-cuda --stats` ([`VmUsage`],
//! through `stats.rs`), and the session's close log line ([`SessionAccount::totals`]).

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Mutex, Weak,
    },
    time::Instant,
};

use qcuda_proto::{
    status, ResponseHeader, SessionUsage, SESSION_USAGE_SIZE, USAGE_CALLER, USAGE_FAILED, USAGE_GPU,
};

use super::table::{lock, Shared};
use crate::{
    guest_buffer::Request,
    limits::{SlotUsage, WorkerUsage},
};

/// One session's accounting, shared by its thread (which updates it) and the table (which
/// reads it for snapshots).
#[derive(Debug)]
pub(super) struct SessionAccount {
    id: u64,
    /// The guest pid the kernel module stamped (0 until a request carries one).
    pid: AtomicU32,
    /// Its worker process's pid on the host, 0 while there is none.
    pub(super) worker_pid: Arc<AtomicU32>,
    opened: Instant,
    /// The slot of its current worker, while it has one.
    worker: Mutex<Option<SlotUsage>>,
    /// What its ended workers counted (memory: what the last one held when it ended; peak:
    /// the most of any).
    ended: Mutex<WorkerUsage>,
    /// Its worker died; GPU ops fail until DeviceReset.
    failed: AtomicBool,
    /// Closed: its counts have gone into the VM's totals (snapshots skip it).
    closed: AtomicBool,
}

impl SessionAccount {
    pub(super) fn new(id: u64, pid: u32, worker_pid: Arc<AtomicU32>) -> Self {
        Self {
            id,
            pid: AtomicU32::new(pid),
            worker_pid,
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
        t
    }

    /// Its wire record; `caller`: the session that asks.
    fn record(&self, caller: bool) -> SessionUsage {
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
    ended_kernels: AtomicU64,
    ended_graph_launches: AtomicU64,
}

/// One session in the host's view: its record and its worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionView {
    /// What the guest sees too.
    pub usage: SessionUsage,
    /// Its worker process on the host (what `nvidia-smi` on the host lists), 0 if none.
    pub worker_pid: u32,
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
    /// The open sessions, by session id.
    pub sessions: Vec<SessionView>,
}

/// The open sessions' accounts, by session id.
fn accounts(shared: &Shared) -> Vec<Arc<SessionAccount>> {
    let mut a: Vec<_> = shared
        .threads()
        .values()
        .map(|h| h.account.clone())
        .filter(|a| !a.closed.load(Ordering::Acquire))
        .collect();
    a.sort_by_key(|a| a.id);
    a
}

/// The VM's usage now; `caller` flags that session's record.
pub(super) fn snapshot(shared: &Shared, caller: Option<u64>) -> VmUsage {
    let sessions: Vec<SessionView> = accounts(shared)
        .iter()
        .map(|a| SessionView {
            usage: a.record(Some(a.id) == caller),
            worker_pid: a.worker_pid.load(Ordering::Acquire),
        })
        .collect();
    let live = |f: fn(&SessionUsage) -> u64| {
        sessions
            .iter()
            .fold(0u64, |t, s| t.saturating_add(f(&s.usage)))
    };
    let t = &shared.totals;
    let (memory, memory_limit) = match &shared.gpu_memory {
        Ok(q) => (q.used(), q.limit()),
        Err(_) => (live(|s| s.memory), None),
    };
    VmUsage {
        vm: shared.label.clone(),
        sessions_open: shared.counters().open,
        max_sessions: shared.max_sessions,
        memory,
        memory_limit,
        kernels: t
            .ended_kernels
            .load(Ordering::Acquire)
            .saturating_add(live(|s| s.kernels)),
        graph_launches: t
            .ended_graph_launches
            .load(Ordering::Acquire)
            .saturating_add(live(|s| s.graph_launches)),
        sessions_opened: t.sessions_opened.load(Ordering::Acquire),
        sessions,
    }
}

/// `Op::VmUsage` from session `caller`: as many records as fit, and the VM's totals.
pub(super) fn answer(shared: &Shared, caller: u64, req: &Request) -> ResponseHeader {
    let Some(out) = req.outputs().first() else {
        return ResponseHeader::with_status(status::INVALID_VALUE);
    };
    let vm = snapshot(shared, Some(caller));
    let fit = out.len() / SESSION_USAGE_SIZE;
    // Only the records are written (the rest of the buffer is left as it is), so what the
    // daemon allocates is bounded by the sessions, not by the buffer the guest names.
    let mut bytes = Vec::with_capacity(fit.min(vm.sessions.len()) * SESSION_USAGE_SIZE);
    for s in vm.sessions.iter().take(fit) {
        bytes.extend_from_slice(&s.usage.encode());
    }
    if out.write_at(0, &bytes).is_err() {
        return ResponseHeader::with_status(status::INVALID_VALUE);
    }
    let mut resp = ResponseHeader::with_status(status::SUCCESS);
    resp.rets = [
        fit.min(vm.sessions.len()) as u64,
        vm.sessions.len() as u64,
        vm.memory,
        vm.memory_limit.unwrap_or(0),
        vm.max_sessions as u64,
        vm.kernels,
        vm.sessions_opened,
    ];
    resp
}

/// A VM's usage for readers outside the table (the stats socket), without keeping the
/// table alive: once the connection ends, there is nothing to read.
#[derive(Debug, Clone)]
pub struct UsageView(pub(super) Weak<Shared>);

impl UsageView {
    /// The VM's usage now, if its connection still exists.
    pub fn snapshot(&self) -> Option<VmUsage> {
        self.0.upgrade().map(|s| snapshot(&s, None))
    }

    /// The operator's pause (`pause` true) or resume of session `session` of this VM, or of
    /// every session (`None`): each session's thread takes it in turn with its requests (so
    /// the op in flight ends first) and answers once its worker has. Returns each session's
    /// answer (`worker::checkpoint_answer`); a session that does not answer within `timeout`
    /// is left out.
    pub fn checkpoint(
        &self,
        session: Option<u64>,
        pause: bool,
        timeout: std::time::Duration,
    ) -> Vec<(u64, qcuda_proto::ResponseHeader)> {
        let Some(shared) = self.0.upgrade() else {
            return Vec::new();
        };
        let asked: Vec<(u64, std::sync::mpsc::Receiver<qcuda_proto::ResponseHeader>)> = shared
            .threads()
            .iter()
            .filter(|(&id, _)| session.is_none_or(|s| s == id))
            .filter_map(|(&id, h)| {
                let (reply, rx) = std::sync::mpsc::channel();
                h.send_checkpoint(pause, reply).ok()?;
                Some((id, rx))
            })
            .collect();
        drop(shared);
        let deadline = std::time::Instant::now() + timeout;
        asked
            .into_iter()
            .filter_map(|(id, rx)| {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                rx.recv_timeout(left).ok().map(|r| (id, r))
            })
            .collect()
    }
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

//! What each session of a VM uses of the host, and the VM's totals: device memory held (now
//! and at most), kernels and graphs launched, the guest process, how long it has been open.
//!
//! The counts come from the VM's accounting file (`limits.rs`), where each worker counts its
//! own allocations and launches; a [`SessionAccount`] follows the session's workers (a new one
//! starts after a reset) and keeps the counts of those that ended. Three readers: the guest's
//! `qcuda-smi` (`Op::VmUsage`, [`answer`]), the operator's `vhost-cuda --stats` ([`VmUsage`],
//! through `stats.rs`), and the session's close log line ([`SessionAccount::totals`]).

use std::sync::{atomic::Ordering, Arc, Weak};

use qcuda_proto::{status, ResponseHeader, SessionUsage, SESSION_USAGE_SIZE};

use super::{
    account::{SessionAccount, SessionView, VmUsage},
    shared::Shared,
};
use crate::guest_buffer::Request;

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
        .map(|a| {
            let t = a.totals();
            SessionView {
                usage: a.record(Some(a.id) == caller),
                worker_pid: a.reported_worker_pid(),
                gpu_busy_ns: t.gpu_busy_ns,
                gpu_traced_ns: t.gpu_traced_ns,
            }
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
        gpu_busy_ns: t.ended_gpu_busy_ns.load(Ordering::Acquire).saturating_add(
            sessions
                .iter()
                .fold(0u64, |a, s| a.saturating_add(s.gpu_busy_ns)),
        ),
        gpu_traced_ns: t
            .ended_gpu_traced_ns
            .load(Ordering::Acquire)
            .saturating_add(
                sessions
                    .iter()
                    .fold(0u64, |a, s| a.saturating_add(s.gpu_traced_ns)),
            ),
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

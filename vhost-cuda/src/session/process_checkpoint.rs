//! CUDA's process checkpoint (`cuCheckpointProcessLock/Checkpoint/Restore/Unlock/GetState`)
//! of one guest process by another of the same VM, as NVIDIA's `cuda-checkpoint` does it.
//!
//! The caller's `ProcessCheckpoint` request names the target's session; the guest kernel module
//! stamped it after checking that the caller may act on that process (root, or the same user),
//! and the table of this VM holds only this VM's sessions, so no other VM can be named. The
//! request does not go through the caller's session queue: [`SessionTable::process_checkpoint`]
//! answers the queries (state, restore thread) at once from the target's handle, and hands the
//! transitions to the target's thread, which runs them between its own requests, as the
//! operator's pause and resume:
//!
//! ```text
//! RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED --unlock--> RUNNING
//! ```
//!
//! - lock: taken when the target's thread reaches it, so after the op it is running (a
//!   synchronisation, say) ends; from then on the target's requests wait in order, as CUDA calls
//!   of a locked process block. With a timeout, a lock not taken in time is answered
//!   `NOT_READY` and never taken (the process stays RUNNING), as CUDA documents.
//! - checkpoint: the worker's pause (quiesce, every allocation's bytes to host memory, the GPU
//!   memory released); restore: the worker's resume (the same addresses, the bytes back).
//! - unlock: the waiting requests run, in their order.
//!
//! An action in the wrong state is answered `ILLEGAL_STATE` and changes nothing. A worker lost
//! during a checkpoint or restore leaves the process FAILED, and its requests are answered (with
//! the lost worker's error) rather than held. While the operator has paused the session
//! (`vhost-cuda --pause`), the guest's actions wait with its requests.
//!
//! Neighbours: table.rs routes the op here, thread.rs runs the transitions.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
    time::Duration,
};

use qcuda_proto::{
    status, ResponseHeader, PROCESS_CHECKPOINT, PROCESS_GET_RESTORE_THREAD, PROCESS_GET_STATE,
    PROCESS_LOCK, PROCESS_RESTORE, PROCESS_STATE_CHECKPOINTED, PROCESS_STATE_FAILED,
    PROCESS_STATE_LOCKED, PROCESS_STATE_RUNNING, PROCESS_UNLOCK,
};
use tracing::{info, warn};

use super::table::{lock, Job, SessionTable};

/// A session's state under CUDA's process checkpoint (`CU_PROCESS_STATE_*`), read by
/// `cuCheckpointProcessGetState` without waiting for the session's thread.
#[derive(Debug)]
pub(super) struct ProcessState(AtomicU64);

impl Default for ProcessState {
    fn default() -> Self {
        Self(AtomicU64::new(PROCESS_STATE_RUNNING))
    }
}

impl ProcessState {
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    pub(super) fn set(&self, state: u64) {
        self.0.store(state, Ordering::Release);
    }

    /// Whether the process's own requests wait (LOCKED or CHECKPOINTED).
    pub(super) fn holds_requests(&self) -> bool {
        matches!(
            self.get(),
            PROCESS_STATE_LOCKED | PROCESS_STATE_CHECKPOINTED
        )
    }
}

/// A transition on its way to the target's thread. The caller's request is answered by
/// whoever takes it first: the target's thread (which then runs the action), or, for a lock
/// with a timeout, the timer (which answers `NOT_READY`, and the action never runs).
#[derive(Clone)]
pub(super) struct Transition {
    pub(super) action: u64,
    claim: Arc<(Mutex<Option<Box<Job>>>, Condvar)>,
}

impl Transition {
    fn new(action: u64, job: Box<Job>) -> Self {
        Self {
            action,
            claim: Arc::new((Mutex::new(Some(job)), Condvar::new())),
        }
    }

    /// The caller's request, unless the timer answered it already.
    pub(super) fn take(&self) -> Option<Box<Job>> {
        let job = lock(&self.claim.0).take();
        self.claim.1.notify_all();
        job
    }

    /// Answers `NOT_READY` if nobody has taken the request within `timeout`.
    fn expire_after(&self, timeout: Duration) {
        let (slot, cv) = &*self.claim;
        let waited = cv
            .wait_timeout_while(lock(slot), timeout, |job| job.is_some())
            .unwrap_or_else(|p| p.into_inner());
        let mut guard: MutexGuard<'_, _> = waited.0;
        if let Some(job) = guard.take() {
            drop(guard);
            job.finish(&ResponseHeader::with_status(status::NOT_READY));
        }
    }
}

/// Whether `action` is one of the transitions (not a query).
fn is_transition(action: u64) -> bool {
    matches!(
        action,
        PROCESS_LOCK | PROCESS_CHECKPOINT | PROCESS_RESTORE | PROCESS_UNLOCK
    )
}

impl SessionTable {
    /// `ProcessCheckpoint` from any session of this VM: args[0] = action, args[2] = the lock's
    /// timeout in ms, args[3] = the target's session, args[4] = the target's pid as its caller
    /// numbers it (both stamped by the guest kernel module).
    pub(super) fn process_checkpoint(&self, job: Job) {
        let args = job.request.header().args;
        let (action, timeout_ms, target) = (args[0], args[2], args[3]);
        if action != PROCESS_GET_STATE
            && action != PROCESS_GET_RESTORE_THREAD
            && !is_transition(action)
        {
            job.finish(&ResponseHeader::with_status(status::INVALID_VALUE));
            return;
        }
        let threads = self.shared.threads();
        let Some(handle) = threads.get(&target) else {
            drop(threads);
            // No such session of this VM: the process has not used CUDA (or has ended).
            job.finish(&ResponseHeader::with_status(status::INITIALIZATION_ERROR));
            return;
        };
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        match action {
            PROCESS_GET_STATE => {
                resp.rets[0] = handle.process.get();
            }
            // Nothing of the process takes part in a restore (the daemon restores the
            // worker), so any of its threads will do: its main thread, whose id is the pid.
            PROCESS_GET_RESTORE_THREAD => resp.rets[0] = args[4],
            _ => {
                let t = Transition::new(action, Box::new(job));
                if handle.send_transition(t.clone()).is_err() {
                    drop(threads);
                    if let Some(job) = t.take() {
                        job.finish(&ResponseHeader::with_status(status::INITIALIZATION_ERROR));
                    }
                    return;
                }
                drop(threads);
                if action == PROCESS_LOCK && timeout_ms != 0 {
                    let timer = t.clone();
                    let spawned = thread::Builder::new()
                        .name(format!("qcuda-lock{target}"))
                        .spawn(move || timer.expire_after(Duration::from_millis(timeout_ms)));
                    if let Err(e) = spawned {
                        // The lock then waits without a bound, as one without a timeout.
                        warn!(
                            vm = %self.shared.label,
                            "session {target}: cannot time the lock: {e}"
                        );
                    }
                }
                return;
            }
        }
        drop(threads);
        job.finish(&resp);
    }
}

/// What a transition does to the state, checked before anything runs: the new state, or the
/// error of an action in the wrong state.
pub(super) fn next_state(action: u64, state: u64) -> Result<u64, u32> {
    match (action, state) {
        (PROCESS_LOCK, PROCESS_STATE_RUNNING) => Ok(PROCESS_STATE_LOCKED),
        (PROCESS_CHECKPOINT, PROCESS_STATE_LOCKED) => Ok(PROCESS_STATE_CHECKPOINTED),
        (PROCESS_RESTORE, PROCESS_STATE_CHECKPOINTED) => Ok(PROCESS_STATE_LOCKED),
        (PROCESS_UNLOCK, PROCESS_STATE_LOCKED) => Ok(PROCESS_STATE_RUNNING),
        _ => Err(status::ILLEGAL_STATE),
    }
}

/// The log line of a transition done.
pub(super) fn log_transition(vm: &str, session: u64, action: u64, resp: &ResponseHeader) {
    let what = match action {
        PROCESS_LOCK => "locked",
        PROCESS_CHECKPOINT => "checkpointed",
        PROCESS_RESTORE => "restored",
        _ => "unlocked",
    };
    if action == PROCESS_CHECKPOINT || action == PROCESS_RESTORE {
        info!(
            vm = %vm,
            session,
            status = resp.status,
            bytes = resp.rets[0],
            ms = resp.rets[1] / 1_000_000,
            "{what} by cuCheckpointProcess (guest)"
        );
    } else {
        info!(vm = %vm, session, "{what} by cuCheckpointProcess (guest)");
    }
}

/// The state a failed checkpoint or restore leaves: FAILED once the worker is lost, else the
/// state before (the driver refused, nothing changed).
pub(super) fn after_failure(worker_lost: bool, before: u64) -> u64 {
    if worker_lost {
        PROCESS_STATE_FAILED
    } else {
        before
    }
}

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
//! Neighbours: table.rs routes the op to the target (`SessionTable::process_checkpoint`),
//! shared.rs carries a transition to it ([`Transition`](super::shared::Transition)), thread.rs
//! runs the transitions.

use std::sync::atomic::{AtomicU64, Ordering};

use qcuda_proto::{
    status, ResponseHeader, PROCESS_CHECKPOINT, PROCESS_LOCK, PROCESS_RESTORE,
    PROCESS_STATE_CHECKPOINTED, PROCESS_STATE_FAILED, PROCESS_STATE_LOCKED, PROCESS_STATE_RUNNING,
    PROCESS_UNLOCK,
};
use tracing::info;

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

/// Whether `action` is one of the transitions (not a query).
pub(super) fn is_transition(action: u64) -> bool {
    matches!(
        action,
        PROCESS_LOCK | PROCESS_CHECKPOINT | PROCESS_RESTORE | PROCESS_UNLOCK
    )
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

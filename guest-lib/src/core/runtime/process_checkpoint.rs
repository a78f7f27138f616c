//! CUDA's process checkpoint (`cuCheckpointProcess*`) of another guest process: one round trip
//! per action.
//!
//! Everything happens beyond this process: qcuda.ko resolves the pid, checks that this process
//! may act on it (root, or the same user) and names its session; vhost-cuda keeps the target's
//! state and runs the transitions between the target's own requests (a locked process's calls
//! wait there; a checkpoint moves its device memory to host memory and releases the GPU's; a
//! restore puts it back at the same addresses). So the target needs nothing of its own: its
//! calls simply wait while it is locked, as natively.

use qcuda_proto::Op;

use crate::core::{cuda_error::CudaResult, runtime::Runtime, transport::Call};

/// What is asked of the target (qcuda-proto's `PROCESS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessAction {
    /// Its `CU_PROCESS_STATE_*`.
    GetState,
    /// RUNNING -> LOCKED, waiting at most this many ms (0: without a bound).
    Lock { timeout_ms: u32 },
    /// LOCKED -> CHECKPOINTED.
    Checkpoint,
    /// CHECKPOINTED -> LOCKED.
    Restore,
    /// LOCKED -> RUNNING.
    Unlock,
    /// The id of its restore thread.
    GetRestoreThread,
}

impl ProcessAction {
    fn wire(self) -> (u64, u64) {
        match self {
            Self::GetState => (qcuda_proto::PROCESS_GET_STATE, 0),
            Self::Lock { timeout_ms } => (qcuda_proto::PROCESS_LOCK, u64::from(timeout_ms)),
            Self::Checkpoint => (qcuda_proto::PROCESS_CHECKPOINT, 0),
            Self::Restore => (qcuda_proto::PROCESS_RESTORE, 0),
            Self::Unlock => (qcuda_proto::PROCESS_UNLOCK, 0),
            Self::GetRestoreThread => (qcuda_proto::PROCESS_GET_RESTORE_THREAD, 0),
        }
    }
}

/// Does `action` to process `pid` (a positive pid of this guest, as this process numbers it).
/// The answer: the state (`GetState`), the thread id (`GetRestoreThread`), else 0.
pub fn process_checkpoint(rt: &Runtime, pid: i32, action: ProcessAction) -> CudaResult<u64> {
    let (code, timeout) = action.wire();
    let pid = u64::try_from(pid).map_err(|_| crate::core::cuda_error::CudaError::INVALID_VALUE)?;
    let reply = rt
        .session
        .submit(Call::new(Op::ProcessCheckpoint, 0).args(&[code, pid, timeout]))?;
    Ok(reply.rets[0])
}

//! CUDA's process checkpoint of another guest process: `cuCheckpointProcessLock`,
//! `Checkpoint`, `Restore`, `Unlock`, `GetState` and `GetRestoreThreadId`, as NVIDIA's
//! `cuda-checkpoint` calls them, over the core's one round trip
//! (core/runtime/process_checkpoint.rs).
//!
//! The optional argument structures are checked as the driver documents them (reserved fields
//! zero). A restore onto other GPUs (`gpuPairs` naming a different GPU) is not offered: the
//! daemon restores a process on the GPU it ran on, so only pairs that keep each GPU are taken.

use super::initialized;
use crate::{
    core::{
        runtime::process_checkpoint::{process_checkpoint, ProcessAction},
        runtime::runtime,
    },
    driver::status::{DriverError, DrvResult},
    generated::driver_api as d,
};

/// Does `action` to `pid` once the driver is initialised.
fn act(pid: i32, action: ProcessAction) -> DrvResult<u64> {
    initialized()?;
    if pid <= 0 {
        return Err(DriverError::INVALID_VALUE);
    }
    Ok(process_checkpoint(runtime()?, pid, action)?)
}

/// Fails with `CUDA_ERROR_INVALID_VALUE` unless every reserved word is zero.
fn reserved_zero(words: &[u64]) -> DrvResult<()> {
    if words.iter().all(|&w| w == 0) {
        Ok(())
    } else {
        Err(DriverError::INVALID_VALUE)
    }
}

driver_api! {
    /// `cuCheckpointProcessGetState`.
    fn cuCheckpointProcessGetState(pid: i32, state: *mut d::CUprocessState) {
        if state.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let s = act(pid, ProcessAction::GetState)?;
        let s = d::CUprocessState::try_from(s).map_err(|_| DriverError::UNKNOWN)?;
        // SAFETY: checked non-null; valid for writes by the API's contract.
        unsafe { state.write_unaligned(s) };
        Ok(())
    }

    /// `cuCheckpointProcessGetRestoreThreadId`.
    fn cuCheckpointProcessGetRestoreThreadId(pid: i32, tid: *mut i32) {
        if tid.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let t = act(pid, ProcessAction::GetRestoreThread)?;
        let t = i32::try_from(t).map_err(|_| DriverError::UNKNOWN)?;
        // SAFETY: checked non-null; valid for writes by the API's contract.
        unsafe { tid.write_unaligned(t) };
        Ok(())
    }

    /// `cuCheckpointProcessLock`: with `timeoutMs`, a lock not taken in time is
    /// `CUDA_ERROR_NOT_READY` and leaves the process running.
    fn cuCheckpointProcessLock(pid: i32, args: *mut d::CUcheckpointLockArgs) {
        // SAFETY: null or a valid structure, by the API's contract.
        let timeout_ms = match unsafe { args.as_ref() } {
            None => 0,
            Some(a) => {
                reserved_zero(&[u64::from(a.reserved0)])?;
                reserved_zero(&a.reserved1)?;
                a.timeoutMs
            }
        };
        act(pid, ProcessAction::Lock { timeout_ms }).map(drop)
    }

    /// `cuCheckpointProcessCheckpoint`.
    fn cuCheckpointProcessCheckpoint(pid: i32, args: *mut d::CUcheckpointCheckpointArgs) {
        // SAFETY: null or a valid structure, by the API's contract.
        if let Some(a) = unsafe { args.as_ref() } {
            reserved_zero(&a.reserved)?;
        }
        act(pid, ProcessAction::Checkpoint).map(drop)
    }

    /// `cuCheckpointProcessRestore`.
    fn cuCheckpointProcessRestore(pid: i32, args: *mut d::CUcheckpointRestoreArgs) {
        // SAFETY: null or a valid structure, by the API's contract.
        if let Some(a) = unsafe { args.as_ref() } {
            if a.reserved.iter().any(|&b| b != 0) || a.reserved1 != 0 {
                return Err(DriverError::INVALID_VALUE);
            }
            let n = a.gpuPairsCount as usize;
            if n > 0 {
                if a.gpuPairs.is_null() {
                    return Err(DriverError::INVALID_VALUE);
                }
                // SAFETY: `n` pairs at `gpuPairs`, by the API's contract.
                let pairs = unsafe { std::slice::from_raw_parts(a.gpuPairs, n) };
                if pairs.iter().any(|p| p.oldUuid.bytes != p.newUuid.bytes) {
                    crate::core::warnings::warn_once!(
                        "cuCheckpointProcessRestore restores a process on the GPU it ran on; \
                         remapping GPUs (gpuPairs) is not supported"
                    );
                    return Err(DriverError::NOT_SUPPORTED);
                }
            }
        }
        act(pid, ProcessAction::Restore).map(drop)
    }

    /// `cuCheckpointProcessUnlock`.
    fn cuCheckpointProcessUnlock(pid: i32, args: *mut d::CUcheckpointUnlockArgs) {
        // SAFETY: null or a valid structure, by the API's contract.
        if let Some(a) = unsafe { args.as_ref() } {
            reserved_zero(&a.reserved)?;
        }
        act(pid, ProcessAction::Unlock).map(drop)
    }
}

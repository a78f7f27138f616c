//! CUDA's process checkpoint of another process through the driver face
//! (`cuCheckpointProcess*`), against the test double's kernel module and host: what goes out,
//! the documented states and errors, and the checks made before anything goes out.

use super::*;
use crate::{
    driver::{
        api::{checkpoint::*, init::cuInit},
        status::DriverError,
    },
    generated::driver_api as d,
};
use qcuda_proto::{
    PROCESS_CHECKPOINT, PROCESS_LOCK, PROCESS_STATE_CHECKPOINTED, PROCESS_STATE_LOCKED,
    PROCESS_STATE_RUNNING,
};

fn check(r: d::CUresult) -> Result<(), DriverError> {
    DriverError::check(r)
}

fn state(pid: i32) -> Result<u64, DriverError> {
    let mut s: d::CUprocessState = 99;
    // SAFETY: a valid out-parameter.
    check(unsafe { cuCheckpointProcessGetState(pid, &raw mut s) })?;
    Ok(u64::from(s))
}

#[test]
fn another_process_is_locked_checkpointed_restored_and_unlocked_as_cuda_documents() {
    let fake = setup();
    // SAFETY: valid or null arguments throughout, as the API allows.
    unsafe {
        assert_eq!(check(cuInit(0)), Ok(()));
        // A process without CUDA.
        assert_eq!(state(77), Err(DriverError::NOT_INITIALIZED));
        fake.state().processes.insert(77, PROCESS_STATE_RUNNING);
        assert_eq!(state(77), Ok(PROCESS_STATE_RUNNING));
        assert_eq!(
            check(cuCheckpointProcessUnlock(77, std::ptr::null_mut())),
            Err(DriverError::ILLEGAL_STATE)
        );
        let mut lock = d::CUcheckpointLockArgs {
            timeoutMs: 250,
            reserved0: 0,
            reserved1: [0; 7],
        };
        assert_eq!(check(cuCheckpointProcessLock(77, &raw mut lock)), Ok(()));
        assert_eq!(
            fake.state().last_process_call,
            Some([PROCESS_LOCK, 77, 250])
        );
        assert_eq!(state(77), Ok(PROCESS_STATE_LOCKED));
        assert_eq!(
            check(cuCheckpointProcessCheckpoint(77, std::ptr::null_mut())),
            Ok(())
        );
        assert_eq!(state(77), Ok(PROCESS_STATE_CHECKPOINTED));
        let mut restore: d::CUcheckpointRestoreArgs = std::mem::zeroed();
        assert_eq!(
            check(cuCheckpointProcessRestore(77, &raw mut restore)),
            Ok(())
        );
        assert_eq!(state(77), Ok(PROCESS_STATE_LOCKED));
        assert_eq!(
            check(cuCheckpointProcessUnlock(77, std::ptr::null_mut())),
            Ok(())
        );
        assert_eq!(state(77), Ok(PROCESS_STATE_RUNNING));
        let mut tid = 0;
        assert_eq!(
            check(cuCheckpointProcessGetRestoreThreadId(77, &raw mut tid)),
            Ok(())
        );
        assert_eq!(tid, 77);

        // A lock not taken within its timeout.
        fake.state().processes.insert(78, PROCESS_STATE_RUNNING);
        fake.state().busy_processes.push(78);
        assert_eq!(
            check(cuCheckpointProcessLock(78, &raw mut lock)),
            Err(DriverError::NOT_READY)
        );
        assert_eq!(state(78), Ok(PROCESS_STATE_RUNNING));
    }
}

#[test]
fn bad_arguments_fail_before_anything_goes_out() {
    let fake = setup();
    // SAFETY: valid or null arguments throughout, as the API allows.
    unsafe {
        assert_eq!(check(cuInit(0)), Ok(()));
        fake.state().processes.insert(90, PROCESS_STATE_RUNNING);
        let sent = || fake.state().last_process_call;
        let invalid = Err(DriverError::INVALID_VALUE);
        assert_eq!(
            check(cuCheckpointProcessGetState(90, std::ptr::null_mut())),
            invalid
        );
        assert_eq!(
            check(cuCheckpointProcessGetRestoreThreadId(
                90,
                std::ptr::null_mut()
            )),
            invalid
        );
        assert_eq!(
            check(cuCheckpointProcessLock(0, std::ptr::null_mut())),
            invalid
        );
        assert_eq!(
            check(cuCheckpointProcessLock(-5, std::ptr::null_mut())),
            invalid
        );
        let mut lock = d::CUcheckpointLockArgs {
            timeoutMs: 0,
            reserved0: 1,
            reserved1: [0; 7],
        };
        assert_eq!(check(cuCheckpointProcessLock(90, &raw mut lock)), invalid);
        let mut ckpt = d::CUcheckpointCheckpointArgs { reserved: [0; 8] };
        ckpt.reserved[7] = 1;
        assert_eq!(
            check(cuCheckpointProcessCheckpoint(90, &raw mut ckpt)),
            invalid
        );
        let mut unlock = d::CUcheckpointUnlockArgs { reserved: [0; 8] };
        unlock.reserved[0] = 3;
        assert_eq!(
            check(cuCheckpointProcessUnlock(90, &raw mut unlock)),
            invalid
        );
        let mut restore: d::CUcheckpointRestoreArgs = std::mem::zeroed();
        restore.gpuPairsCount = 1;
        assert_eq!(
            check(cuCheckpointProcessRestore(90, &raw mut restore)),
            invalid
        );
        assert_eq!(sent(), None, "a refused call went out");

        // Restoring onto another GPU is not offered; keeping each GPU is.
        assert_eq!(
            check(cuCheckpointProcessLock(90, std::ptr::null_mut())),
            Ok(())
        );
        assert_eq!(
            check(cuCheckpointProcessCheckpoint(90, std::ptr::null_mut())),
            Ok(())
        );
        assert_eq!(sent(), Some([PROCESS_CHECKPOINT, 90, 0]));
        let mut pair: d::CUcheckpointGpuPair = std::mem::zeroed();
        pair.newUuid.bytes[0] = 1;
        restore.gpuPairs = &raw mut pair;
        assert_eq!(
            check(cuCheckpointProcessRestore(90, &raw mut restore)),
            Err(DriverError::NOT_SUPPORTED)
        );
        pair.newUuid.bytes[0] = 0;
        restore.gpuPairs = &raw mut pair;
        assert_eq!(
            check(cuCheckpointProcessRestore(90, &raw mut restore)),
            Ok(())
        );
        assert_eq!(
            check(cuCheckpointProcessUnlock(90, std::ptr::null_mut())),
            Ok(())
        );
    }
}

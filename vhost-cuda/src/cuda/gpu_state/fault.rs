//! Why an op failed ([`Fault`]) and what it answers ([`OpResult`], [`ok`], [`ok_rets`]); why a
//! state cannot be captured or restored ([`CheckpointError`]). Every file of the GPU state
//! speaks them.

use qcuda_proto::{status, ResponseHeader};
use thiserror::Error;

use crate::cuda::{driver::CuError, status::cuda_name};

/// Why an op failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// A status decided here (validation, unknown handle, sticky error).
    Status(u32),
    /// A driver call on guest device `dev` failed.
    Driver { dev: usize, err: CuError },
}

impl From<u32> for Fault {
    fn from(status: u32) -> Self {
        Fault::Status(status)
    }
}

pub(super) type OpResult = Result<ResponseHeader, Fault>;

/// A checked copy between two device addresses: destination, source, bytes.
pub(super) type DeviceCopy = (u64, u64, usize);

pub(super) fn ok() -> OpResult {
    Ok(ResponseHeader::with_status(status::SUCCESS))
}

pub(super) fn ok_rets(rets: &[u64]) -> OpResult {
    let mut r = ResponseHeader::with_status(status::SUCCESS);
    for (slot, v) in r.rets.iter_mut().zip(rets) {
        *slot = *v;
    }
    Ok(r)
}

/// Maps driver errors of calls on device `dev`.
pub(super) fn on(dev: usize) -> impl Fn(CuError) -> Fault {
    move |err| Fault::Driver { dev, err }
}

/// Why a state cannot be captured or restored.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CheckpointError {
    /// A stream capture is under way, or a managed allocation is being made (placed, its
    /// pages not mapped yet): try again once it has ended.
    #[error("a stream capture or a managed allocation is under way; try again when it has ended")]
    Busy,
    /// The state holds something the record cannot make again; nothing was changed.
    #[error("cannot be saved: {0}")]
    Unsupported(&'static str),
    /// A CUDA error (`cudaError_t`): a sticky error, or a driver call that failed.
    #[error("CUDA error {name} ({0})", name = cuda_name(*.0))]
    Cuda(u32),
    /// The saved state does not fit this worker (another session, address space or GPU
    /// count), or contradicts itself.
    #[error("the saved state does not fit: {0}")]
    Mismatch(String),
    /// Pause of a paused state, or resume of a running one.
    #[error("the state is {0}")]
    WrongPhase(&'static str),
}

impl From<Fault> for CheckpointError {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Status(s) => Self::Cuda(s),
            Fault::Driver { err, .. } => Self::Cuda(err.status()),
        }
    }
}

pub(super) fn to_usize(v: u64) -> Result<usize, Fault> {
    usize::try_from(v).map_err(|_| Fault::Status(status::INVALID_VALUE))
}

//! A vhost-user frontend in a host process: QEMU's part and qcuda.ko's, without either.
//!
//! It drives a running `vhost-cuda` over the real vhost-user protocol, as a VM does, so that the
//! daemon can be exercised and measured at native CPU speed:
//! - [`GuestVm`] is QEMU's part: the socket, the handshake, guest RAM in a memfd that the daemon
//!   maps (`SET_MEM_TABLE`), and the rings, kick and call eventfds of each queue.
//! - [`SplitRing`] is the driver's view of one split virtqueue in that RAM: descriptors, the
//!   avail ring with its kick decision, the used ring with its interrupt suppression
//!   (`VIRTIO_RING_F_EVENT_IDX`), as Linux's virtio_ring.c keeps them.
//! - [`RequestQueue`] is qcuda.ko's request queue (guest-kmod/device.rs, request.rs): a slot per
//!   request in flight, one indirect descriptor table per chain (header, bounce buffers,
//!   response), fire-and-forget requests nobody waits for, and the two ways a caller waits:
//!   polling the used ring, or sleeping until the call eventfd (the guest's interrupt) wakes
//!   it through an interrupt thread.
//!
//! The process tests (`tests/common`) and the `vhost-cuda-frontend-bench` binary use it. Nothing
//! here is part of the daemon's data path.

mod connection;
mod request_queue;
mod split_ring;

use std::{io, path::PathBuf, time::Duration};

pub use connection::{GuestVm, RING_AREA};
pub use request_queue::{QueueStats, QueueWait, Reply, RequestQueue, SLOT_BOUNCE, SLOT_BYTES};
pub use split_ring::{ring_layout, SplitRing};
use thiserror::Error as ThisError;

/// Errors of the frontend.
#[derive(Debug, ThisError)]
pub enum FrontendError {
    /// The daemon's socket could not be connected to.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: vhost::Error,
    },
    /// A vhost-user message of the handshake failed.
    #[error("vhost-user {step}: {source}")]
    Handshake {
        /// The message.
        step: &'static str,
        /// Why.
        source: vhost::Error,
    },
    /// The device does not offer what qcuda.ko needs.
    #[error("the device lacks {0}")]
    Missing(&'static str),
    /// Guest RAM could not be created or accessed.
    #[error("guest RAM: {0}")]
    Memory(String),
    /// An eventfd or another system call failed.
    #[error("{what}: {source}")]
    Io {
        /// The call.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
    /// A request that does not fit a slot's bounce memory or descriptor table.
    #[error("request too large: {0}")]
    TooLarge(String),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The device put a chain on the used ring that it was not given, or no valid response.
    #[error("device misbehaved: {0}")]
    Device(String),
}

impl FrontendError {
    fn memory(e: impl std::fmt::Display) -> Self {
        Self::Memory(e.to_string())
    }
}

/// Results of the frontend.
pub type Result<T> = std::result::Result<T, FrontendError>;

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
//! here is part of the daemon's data path. Files: `error.rs` (what fails), `split_ring.rs`,
//! `connection.rs` (the VM), `request_queue.rs` (the driver's queue over them).

mod connection;
mod error;
mod request_queue;
mod split_ring;

pub use connection::{DirtyLog, GuestVm, RING_AREA};
pub use error::{FrontendError, Result};
pub use request_queue::{QueueStats, QueueWait, Reply, RequestQueue, SLOT_BOUNCE, SLOT_BYTES};
pub use split_ring::{ring_layout, SplitRing};

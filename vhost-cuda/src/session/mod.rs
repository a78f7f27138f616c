//! Sessions: one thread per guest process in the daemon, and one worker process per guest
//! process that uses the GPU.
//!
//! A session is identified by the id the guest kernel module stamps on every request (one per
//! open file of `/dev/qcuda`). The [`SessionTable`] starts a session thread on a session's
//! first request; the thread runs the session's requests in arrival order, so a long op in one
//! process never blocks another. It writes each response into guest memory and completes the
//! chain through a [`ChainCompleter`], so chains of different sessions complete out of order.
//!
//! The thread answers `Hello`, `Echo`, `SessionClose` and the host queries (HostInfo,
//! DriverVersion, DeviceCount, DeviceInfo:
//! [`CudaHost::answer_query`](crate::cuda::CudaHost::answer_query)) itself, without any CUDA
//! context. Every other op runs in the session's worker process
//! ([`WorkerProcess`](crate::worker::WorkerProcess)), started on the first such op. All CUDA
//! contexts of one process share one GPU address space and one sticky error fails them all
//! (measured with driver 580), so only separate processes isolate guest processes from each other;
//! killing a worker also ends its kernels and frees all its GPU memory.
//!
//! A worker that dies unexpectedly fails the session: the op in flight and every later op that
//! needs the GPU are answered `cudaErrorLaunchFailure` with `RESP_FLAG_STICKY` (a sticky error
//! the guest library knows, so the guest program sees CUDA's own "reset or restart" state),
//! until `DeviceReset`, which then answers success and lets the next op start a new worker. A
//! `DeviceReset` after the worker reported a sticky error (`RESP_FLAG_STICKY`) likewise ends
//! the worker, so the program recovers for real.
//!
//! `SessionClose` ends the worker (closing its channel, SIGKILL after
//! [`CLOSE_WAIT`](crate::worker::CLOSE_WAIT)) and the thread. If an op is still running in the
//! worker when it arrives, its guest process is gone and nobody waits for the result, and the op
//! may never end (an endless kernel): the worker is killed at once. When the VM goes away
//! ([`SessionTable::close_all`]) every session is ended the same way, and queued requests are
//! dropped without touching the ring. All of that waiting happens on the session's own thread.
//!
//! `DriverReset` comes from a guest driver instance that has just bound to the device, before
//! it has any session: every session in the table belongs to an instance that went away without
//! closing its files (a guest reboot, an unbind), so they are all ended as on a disconnect. A
//! thread of its own waits for them (bounded by [`DRIVER_RESET_WAIT`]) and then answers how
//! many there were, so the vring thread and new sessions never wait for it.
//!
//! The table's lock only guards the map from session id to thread and is never held while an
//! op runs. This module knows nothing about vrings: the virtio edge supplies the completer.
//!
//! Files, along the data path: `table.rs` (the [`SessionTable`]: dispatch, close, close-all),
//! `thread.rs` (one session's thread: what it answers itself, driving its worker, failure and
//! reset), `driver_reset.rs` (`DriverReset`), `latency.rs` (`HostLatency`'s statistics),
//! `usage.rs` (what each session uses of the host: `VmUsage`, `vhost-cuda --stats`, the open
//! and close log lines), `process_checkpoint.rs` (CUDA's process checkpoint of one guest process
//! by another: `cuCheckpointProcessLock` ... `Unlock`).

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

mod driver_reset;
pub mod ipc_broker;
mod latency;
pub mod migration;
mod process_checkpoint;
mod table;
#[cfg(test)]
mod tests;
mod thread;
mod usage;

pub use table::SessionTable;
pub use usage::{bytes_text, SessionView, UsageView, VmUsage};

/// Most sessions one VM may have open at once. Each is a host thread, and a worker process if
/// it uses the GPU; a guest kernel that invents session ids must not be able to exhaust the
/// host. Requests of further sessions are answered with `cudaErrorMemoryAllocation`.
pub const MAX_SESSIONS: usize = 1024;

/// Most chains of one VM handed to sessions and not yet completed. A driver that follows the
/// virtio rules has at most one queue's worth (256) outstanding, since a chain stays in the ring
/// until it is answered; a hostile one can publish the same descriptor heads again and again,
/// and every copy would hold host memory until its session gets to it. Past this, chains are
/// answered `cudaErrorMemoryAllocation` at once (`DriverReset` excepted: a new driver instance
/// must always be able to clear what an old one left).
pub const MAX_IN_FLIGHT: usize = 4 * qcuda_proto::QUEUE_SIZE as usize;

/// How long `DriverReset` waits for the sessions it ends before answering anyway (they then finish
/// closing in the background). Well above a worker's own close bound
/// ([`CLOSE_WAIT`](crate::worker::CLOSE_WAIT)), and well below the guest module's wait for the
/// answer (30 s).
pub const DRIVER_RESET_WAIT: Duration = Duration::from_secs(10);

/// Sessions open in this process, over all VMs.
static OPEN_SESSIONS_TOTAL: AtomicUsize = AtomicUsize::new(0);

/// Sessions open in this process, over all sockets (VMs).
pub fn open_sessions_total() -> usize {
    OPEN_SESSIONS_TOTAL.load(Ordering::Acquire)
}

/// Puts a finished chain on the used ring. Implemented by the virtio edge; tests record calls.
pub trait ChainCompleter: Send + Sync {
    /// Completes the chain whose head descriptor is `head`, reporting `used_len` bytes written.
    fn complete(&self, head: u16, used_len: u32);
}

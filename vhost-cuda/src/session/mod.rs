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
//! Files, along the data path: `table.rs` (the [`SessionTable`]: dispatch, close, close-all,
//! the routing of CUDA's process checkpoint), `thread.rs` (one session's thread: what it
//! answers itself, driving its worker, failure and reset), `driver_reset.rs` (`DriverReset`),
//! `latency.rs` (`HostLatency`'s statistics), `usage.rs` (what the VM's sessions use of the
//! host, for `VmUsage` and `vhost-cuda --stats`), `process_checkpoint.rs` (CUDA's process
//! checkpoint of one guest process by another, `cuCheckpointProcessLock` ... `Unlock`: its
//! states and rules). Beneath them: `shared.rs` (the state the table's parts share: each
//! session's handle, its messages, a request on its way), `account.rs` (one session's
//! accounting and the records of what it uses), `limits.rs` (the bounds), `locking.rs`,
//! `migration.rs`, `ipc_broker.rs`.

mod account;
mod driver_reset;
pub mod handover;
pub mod ipc_broker;
mod latency;
mod limits;
mod locking;
pub mod migration;
pub mod migration_figures;
pub mod precopy;
mod process_checkpoint;
mod shared;
mod table;
#[cfg(test)]
mod tests;
mod thread;
mod usage;

pub use account::{bytes_text, SessionView, VmUsage};
pub use limits::{DRIVER_RESET_WAIT, MAX_IN_FLIGHT, MAX_SESSIONS};
pub use shared::ChainCompleter;
pub use table::SessionTable;
pub use thread::open_sessions_total;
pub use usage::UsageView;

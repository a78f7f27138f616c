//! How much one VM's sessions may hold, and how long a reset waits for them.

use std::time::Duration;

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

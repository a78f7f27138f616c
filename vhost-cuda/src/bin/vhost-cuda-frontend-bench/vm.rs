//! One VM of the benchmark: its guest RAM's layout and connecting it to the daemon.

use std::{sync::Arc, time::Duration};

use qcuda_proto::HOST_PAGE_SIZE;
use vhost_cuda::frontend::{GuestVm, RequestQueue, RING_AREA, SLOT_BYTES};

use crate::session::RowError;

/// Guest RAM of a VM: rings, the request slots, then (from [`PINNED_AT`]) the "pinned" memory
/// the copies use.
pub const PINNED_AT: u64 = 32 << 20;
const _: () = assert!(RING_AREA + 256 * SLOT_BYTES <= PINNED_AT);

/// Connects one VM with `extra` bytes of RAM above [`PINNED_AT`] and starts its queue.
pub fn connect(
    socket: &std::path::Path,
    extra: u64,
    timeout: Duration,
) -> Result<RequestQueue, RowError> {
    let ram = PINNED_AT + extra.next_multiple_of(HOST_PAGE_SIZE);
    let vm = GuestVm::connect(socket, usize::try_from(ram).unwrap_or(usize::MAX), timeout)?;
    Ok(RequestQueue::start(Arc::new(vm), RING_AREA)?)
}

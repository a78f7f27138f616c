//! Moving bytes between guest memory and device memory.
//!
//! Every host<->device copy of pageable memory goes through these two functions (host-mapped
//! memory never does: the driver copies it directly, see memory.rs). A copy of any size is cut
//! into `COPY_CHUNK` (8 MiB) requests, each well under the transport's `MAX_BUFFER_LEN`. Copies
//! of several chunks keep [`IN_FLIGHT`] chunks in flight, from as many threads, so that pinning
//! and describing the next chunk in the guest overlaps the host's copy of the current one. The
//! chunks cover disjoint ranges and all go to the same stream, and the call returns only when
//! every chunk is done, so the order in which they complete does not matter.

use crate::core::conv::usize_of;
use qcuda_proto::{Op, COPY_CHUNK};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::last_error,
    core::transport::session::Session,
    core::transport::Call,
};

const CHUNK: usize = usize_of(COPY_CHUNK);
/// Chunks of one copy in flight at once.
const IN_FLIGHT: usize = 4;

/// Runs `chunk(offset, len)` for every chunk of `len` bytes, [`IN_FLIGHT`] at a time, and
/// returns the first failure (after every chunk has finished).
fn for_each_chunk(
    len: usize,
    chunk: &(dyn Fn(usize, usize) -> CudaResult<()> + Sync),
) -> CudaResult<()> {
    let chunks = len.div_ceil(CHUNK);
    let lane = |first: usize| -> CudaResult<()> {
        let mut result = Ok(());
        for i in (first..chunks).step_by(IN_FLIGHT) {
            let at = i * CHUNK;
            if let Err(e) = chunk(at, CHUNK.min(len - at)) {
                result = result.and(Err(e));
            }
        }
        result
    };
    if chunks < 2 {
        return lane(0);
    }
    std::thread::scope(|scope| {
        let others: Vec<_> = (1..IN_FLIGHT.min(chunks))
            .map(|first| {
                // A reply may carry an earlier async failure, recorded as the last error of the
                // thread that got it: hand it to the caller's thread.
                scope.spawn(move || (lane(first), last_error::take()))
            })
            .collect();
        let mut result = lane(0);
        for o in others {
            let (r, deferred) = o.join().unwrap_or((Err(CudaError::UNKNOWN), 0));
            if let Some(e) = CudaError::from_code(deferred) {
                last_error::record(e);
            }
            result = result.and(r);
        }
        result
    })
}

/// Checks that `addr..addr + len` does not wrap around the device address space.
fn device_range(addr: u64, len: usize) -> CudaResult<()> {
    addr.checked_add(len as u64)
        .map(|_| ())
        .ok_or(CudaError::INVALID_VALUE)
}

/// Copies `len` bytes from guest memory at `src` to device address `dst`, in stream order on
/// `stream` (wire handle) of `device`, and returns once the host has taken the data.
///
/// # Safety
/// `src..src + len` must be readable for the duration of the call.
pub unsafe fn host_to_device(
    session: &Session,
    device: u32,
    dst: u64,
    src: *const u8,
    len: usize,
    stream: u64,
) -> CudaResult<()> {
    device_range(dst, len)?;
    let src = src as usize;
    for_each_chunk(len, &|done, n| {
        // SAFETY: `src + done .. src + done + n` lies inside the range the caller guarantees
        // readable until we return, and every chunk's call is finished before that.
        let call = unsafe {
            Call::new(Op::MemcpyHtoD, device)
                .args(&[dst + done as u64, stream])
                .input_raw((src as *const u8).add(done), n)
        };
        session.submit(call).map(|_| ())
    })
}

/// Copies `len` bytes from device address `src` to guest memory at `dst`, in stream order on
/// `stream` (wire handle) of `device`, and returns once the data has arrived.
///
/// # Safety
/// `dst..dst + len` must be writable, and not accessed by anyone else, for the duration of the
/// call.
pub unsafe fn device_to_host(
    session: &Session,
    device: u32,
    dst: *mut u8,
    src: u64,
    len: usize,
    stream: u64,
) -> CudaResult<()> {
    device_range(src, len)?;
    let dst = dst as usize;
    for_each_chunk(len, &|done, n| {
        // SAFETY: `dst + done .. dst + done + n` lies inside the range the caller guarantees
        // writable and unshared until we return; chunks are disjoint, and every chunk's call is
        // finished before that.
        let call = unsafe {
            Call::new(Op::MemcpyDtoH, device)
                .args(&[src + done as u64, stream])
                .output_raw((dst as *mut u8).add(done), n)
        };
        session.submit(call).map(|_| ())
    })
}

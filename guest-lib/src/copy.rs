//! Moving bytes between guest memory and device memory.
//!
//! Every host<->device copy goes through these two functions. A copy of any size is cut into
//! `COPY_CHUNK` (8 MiB) requests, each well under the transport's `MAX_BUFFER_LEN`; today the
//! chunks go one after another. This is the one place to pipeline them later (several chunks in
//! flight from a few threads, so the guest's copying and pinning overlaps the host's DMA).

use qcuda_proto::{Op, COPY_CHUNK};

use crate::{
    cuda_error::{CudaError, CudaResult},
    session::Session,
    transport::Call,
};

const CHUNK: usize = COPY_CHUNK as usize;

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
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        // SAFETY: `src + done .. src + done + n` lies inside the range the caller guarantees
        // readable until we return, and the call is finished before the next iteration.
        let call = unsafe {
            Call::new(Op::MemcpyHtoD, device)
                .args(&[dst + done as u64, stream])
                .input_raw(src.add(done), n)
        };
        session.submit(call)?;
        done += n;
    }
    Ok(())
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
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        // SAFETY: `dst + done .. dst + done + n` lies inside the range the caller guarantees
        // writable and unshared until we return; the call finishes before the next iteration.
        let call = unsafe {
            Call::new(Op::MemcpyDtoH, device)
                .args(&[src + done as u64, stream])
                .output_raw(dst.add(done), n)
        };
        session.submit(call)?;
        done += n;
    }
    Ok(())
}

//! Device `printf` output of a session, carried back to the guest process.
//!
//! The CUDA driver writes what kernels printed to the standard output of the process that runs
//! them, when a synchronisation flushes the device's printf buffer. In a session's worker that
//! standard output is captured ([`DeviceOutput::capture`], before the driver is loaded): fd 1
//! becomes an anonymous memory file opened for appending. After every request the worker tells
//! the guest whether output waits (`RESP_FLAG_OUTPUT`), and `Op::TakeOutput` hands it over,
//! oldest first; guest-lib writes it to the application's own `stdout`, so it appears where and
//! when a native program's would: at the synchronisation that flushed it.
//!
//! Output a guest never takes is bounded: beyond [`MAX_PENDING`] bytes it is dropped (with a
//! warning), so a guest cannot make the worker hold unbounded memory.

use std::{
    fs::File,
    os::{fd::AsRawFd, fd::FromRawFd, unix::fs::FileExt},
};

use qcuda_proto::{status, ResponseHeader, RESP_FLAG_OUTPUT};
use tracing::warn;

use crate::guest_buffer::Request;

/// Most bytes of untaken output kept (the driver's printf buffer is 1 MiB by default).
pub const MAX_PENDING: u64 = 16 << 20;

/// The captured standard output of this process.
#[derive(Debug, Default)]
pub struct DeviceOutput {
    /// The memory file on fd 1 (`None` if it could not be set up: output is then lost).
    file: Option<File>,
    /// Bytes of it already taken.
    taken: u64,
}

impl DeviceOutput {
    /// Replaces fd 1 with an appending memory file. Call it once, before the driver is loaded,
    /// in the worker process (whose stdout is otherwise `/dev/null`).
    pub fn capture() -> Self {
        match Self::memory_stdout() {
            Ok(file) => Self {
                file: Some(file),
                taken: 0,
            },
            Err(e) => {
                warn!("cannot capture device printf output: {e}");
                Self::default()
            }
        }
    }

    fn memory_stdout() -> std::io::Result<File> {
        // SAFETY: memfd_create with a NUL-terminated name returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"qcuda-device-output".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        // Every write lands at the end, whatever was truncated meanwhile (shared with fd 1).
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_APPEND) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Whatever C stdio buffered for the old stdout goes there first.
        flush_stdio();
        // SAFETY: dup2 of a descriptor we own onto fd 1, which this process only writes through.
        if unsafe { libc::dup2(file.as_raw_fd(), libc::STDOUT_FILENO) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(file)
    }

    /// Bytes written and not taken yet (after flushing C stdio, where the driver writes).
    fn pending(&mut self) -> u64 {
        let Some(file) = &self.file else {
            return 0;
        };
        flush_stdio();
        let size = file.metadata().map_or(0, |m| m.len());
        if size.saturating_sub(self.taken) > MAX_PENDING {
            warn!(
                bytes = size - self.taken,
                "device printf output nobody took: dropped"
            );
            self.reset();
            return 0;
        }
        size.saturating_sub(self.taken)
    }

    fn reset(&mut self) {
        if let Some(file) = &self.file {
            let _ = file.set_len(0);
        }
        self.taken = 0;
    }

    /// Marks `resp` if output waits.
    pub fn flag(&mut self, resp: &mut ResponseHeader) {
        if self.pending() > 0 {
            resp.flags |= RESP_FLAG_OUTPUT;
        }
    }

    /// `Op::TakeOutput`: the oldest waiting bytes into out-buffer 0.
    pub fn take(&mut self, req: &Request) -> ResponseHeader {
        let Some(out) = req.outputs().first() else {
            return ResponseHeader::with_status(status::INVALID_VALUE);
        };
        let pending = self.pending();
        // More than a usize can count is more than the buffer holds.
        let n = usize::try_from(pending).map_or(out.len(), |p| p.min(out.len()));
        let mut bytes = vec![0u8; n];
        if let Some(file) = &self.file {
            if n > 0 && file.read_exact_at(&mut bytes, self.taken).is_err() {
                return ResponseHeader::with_status(status::UNKNOWN);
            }
        }
        if out.write_at(0, &bytes).is_err() {
            return ResponseHeader::with_status(status::INVALID_VALUE);
        }
        self.taken += n as u64;
        if n as u64 == pending {
            // All taken: start the file over.
            self.reset();
        }
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        resp.rets[0] = n as u64;
        resp
    }
}

/// Flushes every C stdio stream of this process (the driver prints through them).
fn flush_stdio() {
    // SAFETY: fflush(NULL) flushes all open output streams; no pointer is dereferenced.
    unsafe { libc::fflush(std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use std::{io::Write, os::fd::FromRawFd, sync::Arc};

    use qcuda_proto::{Direction, Op, RequestHeader};
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::guest_buffer::{GuestBuffer, GuestRam};

    fn memfd() -> File {
        // SAFETY: memfd_create with a NUL-terminated name returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"qcuda-output-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor, ours alone; append mode as `capture` sets it.
        unsafe {
            libc::fcntl(fd, libc::F_SETFL, libc::O_APPEND);
            File::from_raw_fd(fd)
        }
    }

    fn take_request(mem: &Arc<GuestRam>, len: usize) -> Request {
        let mut header = RequestHeader::new(Op::TakeOutput);
        header.push_buffer(Direction::Out, len as u64).unwrap();
        let out = GuestBuffer::new(mem.clone(), [(GuestAddress(0x100), len)]).unwrap();
        Request::new(header, vec![], vec![out]).unwrap()
    }

    #[test]
    fn output_is_flagged_taken_in_order_and_bounded() {
        let mem = Arc::new(GuestRam::from_ranges(&[(GuestAddress(0), 0x10_000)]).unwrap());
        let mut writer = memfd();
        let mut out = DeviceOutput {
            file: Some(writer.try_clone().unwrap()),
            taken: 0,
        };
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        out.flag(&mut resp);
        assert_eq!(resp.flags & RESP_FLAG_OUTPUT, 0, "nothing printed yet");

        writer.write_all(b"hello, world\n").unwrap();
        out.flag(&mut resp);
        assert_ne!(resp.flags & RESP_FLAG_OUTPUT, 0);
        let r = out.take(&take_request(&mem, 5));
        assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 5));
        let mut got = [0u8; 13];
        mem.read_slice(&mut got[..5], GuestAddress(0x100)).unwrap();
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        out.flag(&mut resp);
        assert_ne!(resp.flags & RESP_FLAG_OUTPUT, 0, "more remains");
        let r = out.take(&take_request(&mem, 64));
        assert_eq!(r.rets[0], 8);
        mem.read_slice(&mut got[5..], GuestAddress(0x100)).unwrap();
        assert_eq!(&got, b"hello, world\n");
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        out.flag(&mut resp);
        assert_eq!(resp.flags & RESP_FLAG_OUTPUT, 0, "all taken");

        // Written after everything was taken (the file started over): still in order.
        writer.write_all(b"again\n").unwrap();
        let r = out.take(&take_request(&mem, 64));
        assert_eq!(r.rets[0], 6);
        mem.read_slice(&mut got[..6], GuestAddress(0x100)).unwrap();
        assert_eq!(&got[..6], b"again\n");

        // Output nobody takes is dropped past the bound.
        writer
            .write_all(&vec![b'x'; usize::try_from(MAX_PENDING).unwrap() + 1])
            .unwrap();
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        out.flag(&mut resp);
        assert_eq!(resp.flags & RESP_FLAG_OUTPUT, 0);
        assert_eq!(writer.metadata().unwrap().len(), 0);
        // Without a capture nothing is ever pending.
        let mut none = DeviceOutput::default();
        assert_eq!(none.take(&take_request(&mem, 8)).rets[0], 0);
    }
}

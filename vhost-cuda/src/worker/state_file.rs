//! A saved state on its way between a worker and a migration stream: an anonymous file
//! (memfd) and its length.
//!
//! The worker writes its saved state into the file and the daemon hands the file, not its
//! bytes, onwards: the source's daemon copies it into QEMU's pipe with the kernel's own copy
//! (`io::copy` on two files is `sendfile`/`splice` on Linux), and the destination's daemon
//! copies the pipe into a new file the same way and passes that file to the restoring worker.
//! So the daemon never holds a saved state (gigabytes with device memory) in its own memory,
//! and no copy of it is made in user space between the two workers (`handle.rs` sends the file
//! over the worker channel; `session/migration.rs` frames it in the stream).

use std::{
    fmt,
    fs::File,
    io::{self, Read, Seek, SeekFrom, Write},
    os::{fd::FromRawFd, unix::fs::FileExt},
    sync::Arc,
};

/// A saved state in an anonymous file, from offset 0 for [`len`](Self::len) bytes. Clones share
/// the file (reads and writes through it are positional, so they never disturb each other).
#[derive(Clone)]
pub struct StateFile {
    file: Arc<File>,
    len: u64,
}

impl StateFile {
    /// An empty anonymous file named `name` (for `/proc/PID/fd`).
    pub fn create(name: &std::ffi::CStr) -> io::Result<Self> {
        // SAFETY: `name` is a NUL-terminated string; the flags are valid.
        let fd = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `fd` was just created and nothing else owns it.
            file: Arc::new(unsafe { File::from_raw_fd(fd) }),
            len: 0,
        })
    }

    /// A file holding `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> io::Result<Self> {
        let mut f = Self::create(c"qcuda-state")?;
        f.file.write_all_at(bytes, 0)?;
        f.len = bytes.len() as u64;
        Ok(f)
    }

    /// The first `len` bytes of `file`, which a worker filled; refused if it holds fewer.
    pub fn filled(file: File, len: u64) -> io::Result<Self> {
        let size = file.metadata()?.len();
        if len > size {
            return Err(io::Error::other(format!(
                "the worker says {len} bytes, its file holds {size}"
            )));
        }
        Ok(Self {
            file: Arc::new(file),
            len,
        })
    }

    /// A file filled with exactly `len` bytes read from `input`, in the kernel where both are
    /// files (a pipe into a memfd: `splice`). The file grows only with what arrived, so a
    /// hostile length costs nothing before its bytes came; fewer bytes than `len` are an
    /// [`io::ErrorKind::UnexpectedEof`].
    pub fn read_from(input: &mut impl Read, len: u64) -> io::Result<Self> {
        let mut f = Self::create(c"qcuda-incoming-state")?;
        let got = {
            let mut out: &File = &f.file;
            io::copy(&mut input.by_ref().take(len), &mut out)?
        };
        if got != len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        f.len = len;
        Ok(f)
    }

    /// Copies the state into `out` (in the kernel where `out` is a file or pipe).
    pub fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        let mut src: &File = &self.file;
        src.seek(SeekFrom::Start(0))?;
        let sent = io::copy(&mut src.take(self.len), out)?;
        if sent != self.len {
            return Err(io::Error::other(format!(
                "saved state: {sent} of {} bytes sent",
                self.len
            )));
        }
        Ok(())
    }

    /// Seals the file (no writes, growing or shrinking from now on, by anyone): what a worker
    /// checks before it maps the file to restore from it (`child.rs`). Idempotent.
    pub fn seal(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let seals =
            libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS takes an int of seal flags and touches nothing of ours.
        if unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            let e = io::Error::last_os_error();
            // Sealed already (F_SEAL_SEAL refuses more seals): the seals it has are ours.
            if e.raw_os_error() != Some(libc::EPERM) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file, to pass to a worker.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Its bytes, read whole (tests and fuzzing: the daemon never does this).
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let n = usize::try_from(self.len).map_err(io::Error::other)?;
        let mut v = vec![0u8; n];
        self.file.read_exact_at(&mut v, 0)?;
        Ok(v)
    }
}

impl fmt::Debug for StateFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateFile({} bytes)", self.len)
    }
}

impl PartialEq for StateFile {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && (Arc::ptr_eq(&self.file, &other.file)
                || matches!((self.to_vec(), other.to_vec()), (Ok(a), Ok(b)) if a == b))
    }
}

impl Eq for StateFile {}

/// Pipe capacity asked for a migration's pipe: the most an unprivileged process gets by default
/// (`/proc/sys/fs/pipe-max-size`), 16 times the default 64 KiB, so each wake-up of the reader
/// moves 1 MiB.
const PIPE_SIZE: libc::c_int = 1 << 20;

/// Widens the pipe `fd` is an end of to [`PIPE_SIZE`], if it is a pipe and the kernel allows;
/// returns its capacity then (`None`: not a pipe, or unknown).
pub fn widen_pipe(fd: &impl std::os::fd::AsRawFd) -> Option<usize> {
    // SAFETY: F_SETPIPE_SZ takes an int and touches nothing of ours; on anything but a pipe
    // it fails with EBADF or EINVAL.
    let got = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE) };
    if got >= 0 {
        return usize::try_from(got).ok();
    }
    // SAFETY: as above, F_GETPIPE_SZ takes no argument.
    usize::try_from(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ) }).ok()
}

/// A read-only map of a sealed file: no one can change, grow or shrink it while mapped
/// (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK`, checked), so its bytes may be read as a
/// slice.
#[derive(Debug)]
pub struct SealedMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl SealedMap {
    const SEALS: libc::c_int = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK;

    /// Maps `file` whole, once its seals are checked.
    pub fn new(file: &File) -> io::Result<Self> {
        // SAFETY: F_GET_SEALS takes no argument and reads nothing of ours.
        let seals =
            unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(file), libc::F_GET_SEALS) };
        if seals < 0 || seals & Self::SEALS != Self::SEALS {
            return Err(io::Error::other("the state's file is not sealed"));
        }
        let len = usize::try_from(file.metadata()?.len()).map_err(io::Error::other)?;
        if len == 0 {
            return Ok(Self {
                ptr: std::ptr::null_mut(),
                len,
            });
        }
        // SAFETY: a fresh private read-only mapping of `len` bytes of a file we hold open;
        // the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(file),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { ptr, len })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes until drop; the file's seals (checked in
        // `new`) keep anyone from changing or shrinking them meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for SealedMap {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: `ptr` and `len` are the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_file_moves_through_a_pipe_whole_and_a_short_one_is_refused() {
        let bytes: Vec<u8> = (0..3_000_000u32)
            .map(|i| i.to_le_bytes()[0] ^ 0x5a)
            .collect();
        let f = StateFile::from_bytes(&bytes).unwrap();
        let (r, w) = std::io::pipe().unwrap();
        let sender = std::thread::spawn(move || {
            let mut w = io::BufWriter::new(w);
            f.write_to(&mut w).unwrap();
            w.flush().unwrap();
        });
        let mut r = io::BufReader::new(r);
        let got = StateFile::read_from(&mut r, bytes.len() as u64).unwrap();
        sender.join().unwrap();
        assert_eq!(got.to_vec().unwrap(), bytes);
        let err = StateFile::read_from(&mut &bytes[..10], 11).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}

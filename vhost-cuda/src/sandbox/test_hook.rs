//! Test double, compiled only with the `test-hooks` feature (`tests/sandbox.rs` turns it on; the
//! shipped binary never has it): makes a sandboxed worker try what a compromised one would,
//! so that the tests can show what the sandbox stops. The daemon side sends
//! `ToWorker::SandboxTestHook(Attempt::encode())`; the worker answers `Done` with the outcome
//! in the response's return values, or is killed by its seccomp filter.

use std::{ffi::CString, fs, io, os::unix::ffi::OsStrExt, path::PathBuf};

use qcuda_proto::{status, ResponseHeader};

/// What the worker tries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// open(2) a host path for reading: rets\[0\] = 0 if it opened, else the errno.
    OpenFile(PathBuf),
    /// socket(AF_INET) and a connect to 127.0.0.1:`port`: rets\[0\] = socket's errno (0 if it
    /// worked), rets\[1\] = connect's errno (0 if it connected, u64::MAX if not tried),
    /// rets\[2\] = network interfaces this worker sees (/proc/net/dev).
    Network(u16),
    /// A system call outside the worker's list (`ptrace(PTRACE_TRACEME)`): the filter kills it.
    ForbiddenSyscall,
    /// rets\[0\] = processes visible in /proc, rets\[1\] = CapEff, rets\[2\] = NoNewPrivs,
    /// rets\[3\] = Seccomp mode (2: filter), rets\[4\] = this process's pid as it sees it,
    /// rets\[5\] = 1 if pid 1 of its namespace is the namespace's init (`--pid-namespace-init`).
    Survey,
    /// What the driver does for an interprocess event, on `path` (in /dev/shm): remove a file
    /// of that name, create it exclusively, size it and map it shared, write `value` into it,
    /// unmap it: rets\[0\] = the first errno (0: all worked).
    ShmCreate(PathBuf, u64),
    /// Open `path` and map it shared, as an importer does: rets\[0\] = errno (0: mapped),
    /// rets\[1\] = the value at its start.
    ShmOpen(PathBuf),
}

impl Attempt {
    /// The message payload.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::OpenFile(p) => [&[1u8][..], p.as_os_str().as_bytes()].concat(),
            Self::Network(port) => [&[2u8][..], &port.to_le_bytes()].concat(),
            Self::ForbiddenSyscall => vec![3],
            Self::Survey => vec![4],
            Self::ShmCreate(p, v) => {
                [&[5u8][..], &v.to_le_bytes(), p.as_os_str().as_bytes()].concat()
            }
            Self::ShmOpen(p) => [&[6u8][..], p.as_os_str().as_bytes()].concat(),
        }
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let (&kind, rest) = b.split_first()?;
        Some(match kind {
            1 => Self::OpenFile(PathBuf::from(std::ffi::OsStr::from_bytes(rest))),
            2 => Self::Network(u16::from_le_bytes(rest.try_into().ok()?)),
            3 => Self::ForbiddenSyscall,
            4 => Self::Survey,
            5 => {
                let (v, p) = rest.split_at_checked(8)?;
                Self::ShmCreate(
                    PathBuf::from(std::ffi::OsStr::from_bytes(p)),
                    u64::from_le_bytes(v.try_into().ok()?),
                )
            }
            6 => Self::ShmOpen(PathBuf::from(std::ffi::OsStr::from_bytes(rest))),
            _ => return None,
        })
    }
}

fn errno_of(rc: libc::c_int) -> u64 {
    if rc >= 0 {
        return 0;
    }
    io::Error::last_os_error()
        .raw_os_error()
        .and_then(|e| u64::try_from(e).ok())
        .unwrap_or(u64::MAX)
}

fn status_field(name: &str) -> u64 {
    let s = fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim())
        .and_then(|v| u64::from_str_radix(v, if name == "CapEff:" { 16 } else { 10 }).ok())
        .unwrap_or(u64::MAX)
}

/// Runs `payload` in this worker.
pub fn attempt(payload: &[u8]) -> ResponseHeader {
    let mut resp = ResponseHeader::with_status(status::SUCCESS);
    let Some(attempt) = Attempt::decode(payload) else {
        return ResponseHeader::with_status(status::INVALID_VALUE);
    };
    match attempt {
        Attempt::OpenFile(path) => {
            let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
                return ResponseHeader::with_status(status::INVALID_VALUE);
            };
            // SAFETY: open of a NUL-terminated path; a descriptor it returns is closed below.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
            resp.rets[0] = errno_of(fd);
            if fd >= 0 {
                // SAFETY: close of the descriptor just opened.
                unsafe { libc::close(fd) };
            }
        }
        Attempt::Network(port) => {
            // SAFETY: socket(2) with constant arguments.
            let fd =
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
            resp.rets[0] = errno_of(fd);
            resp.rets[1] = u64::MAX;
            if fd >= 0 {
                let addr = libc::sockaddr_in {
                    sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2),
                    sin_port: port.to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
                    },
                    sin_zero: [0; 8],
                };
                let len = libc::socklen_t::try_from(std::mem::size_of_val(&addr)).unwrap_or(16);
                // SAFETY: connect with a sockaddr_in we own and its size.
                let rc = unsafe { libc::connect(fd, std::ptr::from_ref(&addr).cast(), len) };
                resp.rets[1] = errno_of(rc);
                // SAFETY: close of the socket just made.
                unsafe { libc::close(fd) };
            }
            let dev = fs::read_to_string("/proc/net/dev").unwrap_or_default();
            resp.rets[2] = dev.lines().skip(2).count() as u64;
        }
        Attempt::ForbiddenSyscall => {
            // SAFETY: ptrace(PTRACE_TRACEME) has no memory effects; the filter kills us first.
            let rc = unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
            // Only reached without a filter.
            resp.rets[0] = errno_of(i32::try_from(rc).unwrap_or(-1));
        }
        Attempt::ShmCreate(path, value) => {
            resp.rets[0] = shm_create(&path, value).err().unwrap_or(0);
        }
        Attempt::ShmOpen(path) => match shm_open(&path) {
            Ok(v) => resp.rets[1] = v,
            Err(e) => resp.rets[0] = e,
        },
        Attempt::Survey => {
            resp.rets[0] = fs::read_dir("/proc")
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_name().as_bytes().iter().all(u8::is_ascii_digit))
                        .count() as u64
                })
                .unwrap_or(u64::MAX);
            resp.rets[1] = status_field("CapEff:");
            resp.rets[2] = status_field("NoNewPrivs:");
            resp.rets[3] = status_field("Seccomp:");
            resp.rets[4] = u64::from(std::process::id());
            let init = fs::read("/proc/1/cmdline").unwrap_or_default();
            resp.rets[5] = u64::from(
                init.split(|&b| b == 0)
                    .any(|a| a == b"--pid-namespace-init"),
            );
        }
    }
    resp
}

const SHM_LEN: usize = 4096;
/// `SHM_LEN` as a file offset.
const SHM_OFF: libc::off_t = 4096;

fn last_errno() -> u64 {
    errno_of(-1)
}

/// Maps `fd` shared, `SHM_LEN` bytes.
fn map_shared(fd: libc::c_int) -> Result<*mut u64, u64> {
    // SAFETY: a fresh shared mapping of a file we hold open; unmapped by the caller.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SHM_LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_errno());
    }
    Ok(p.cast())
}

fn shm_create(path: &std::path::Path, value: u64) -> Result<(), u64> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| u64::MAX)?;
    // SAFETY: unlink of a NUL-terminated path (a missing file is fine), then open of it.
    let fd = unsafe {
        libc::unlink(c.as_ptr());
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: ftruncate of the descriptor just opened.
    let r = if unsafe { libc::ftruncate(fd, SHM_OFF) } == 0 {
        map_shared(fd).map(|p| {
            // SAFETY: `p` maps SHM_LEN writable bytes; then unmapped.
            unsafe {
                p.write_volatile(value);
                libc::munmap(p.cast(), SHM_LEN);
            }
        })
    } else {
        Err(last_errno())
    };
    // SAFETY: close of the descriptor just opened.
    unsafe { libc::close(fd) };
    r
}

fn shm_open(path: &std::path::Path) -> Result<u64, u64> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| u64::MAX)?;
    // SAFETY: open of a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last_errno());
    }
    let r = map_shared(fd).map(|p| {
        // SAFETY: `p` maps SHM_LEN readable bytes; then unmapped.
        unsafe {
            let v = p.read_volatile();
            libc::munmap(p.cast(), SHM_LEN);
            v
        }
    });
    // SAFETY: close of the descriptor just opened.
    unsafe { libc::close(fd) };
    r
}

//! Listening sockets handed over by systemd (socket activation, `sd_listen_fds(3)`).
//!
//! A socket unit (`vhost-cuda@.socket`) binds `/run/qcuda/<vm>.sock` itself and starts the
//! daemon on the first connection with the bound socket at fd 3 (and more at 4, 5, ...),
//! `LISTEN_FDS` saying how many and `LISTEN_PID` for which process. The daemon then serves
//! those sockets instead of binding its own (`lib.rs`, `Server::bind`). Such a socket is
//! systemd's: the daemon never unlinks its path, and a restarted daemon gets the same socket
//! again, with the connections QEMU made meanwhile waiting in its backlog.
//!
//! The variables are read once, before any thread starts, and removed, so the session workers
//! this process starts see neither them nor the sockets (which are made close-on-exec).

use std::{
    io,
    ops::Range,
    os::{
        fd::{FromRawFd, RawFd},
        unix::net::UnixListener,
    },
    path::PathBuf,
};

use thiserror::Error;

/// The first inherited fd (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// Most inherited sockets taken; more is a misconfigured socket unit.
const MAX_LISTEN_FDS: RawFd = 64;

/// Why the inherited sockets cannot be used.
#[derive(Debug, Error)]
pub enum ActivationError {
    /// `LISTEN_FDS` is not a count.
    #[error("LISTEN_FDS={0:?} is not a number of sockets between 1 and {MAX_LISTEN_FDS}")]
    BadCount(String),
    /// `LISTEN_PID` is not a pid.
    #[error("LISTEN_PID={0:?} is not a process id")]
    BadPid(String),
    /// An inherited fd is not what the daemon can serve.
    #[error(
        "inherited fd {0} is not a listening Unix stream socket (ListenStream= in the socket unit)"
    )]
    NotAUnixListener(RawFd),
    /// An inherited fd cannot be inspected or set up.
    #[error("inherited fd {fd}: {source}")]
    Fd {
        /// The fd.
        fd: RawFd,
        /// The error.
        source: io::Error,
    },
}

/// The fds systemd passed to the process `my_pid`, from the values of `LISTEN_PID` and
/// `LISTEN_FDS`; `None` when there are none, or they were meant for another process (a parent
/// that did not remove the variables).
pub fn passed_fds(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    my_pid: u32,
) -> Result<Option<Range<RawFd>>, ActivationError> {
    let (Some(pid), Some(count)) = (listen_pid, listen_fds) else {
        return Ok(None);
    };
    let pid: u32 = pid
        .trim()
        .parse()
        .map_err(|_| ActivationError::BadPid(pid.to_string()))?;
    if pid != my_pid {
        return Ok(None);
    }
    let n: RawFd = count
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=MAX_LISTEN_FDS).contains(n))
        .ok_or_else(|| ActivationError::BadCount(count.to_string()))?;
    Ok(Some(LISTEN_FDS_START..LISTEN_FDS_START + n))
}

/// Reads and removes `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES`: the fds systemd passed
/// to this process, if any. Call before any thread starts (it changes the environment).
pub fn take_from_environment() -> Result<Option<Range<RawFd>>, ActivationError> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    passed_fds(pid.as_deref(), fds.as_deref(), std::process::id())
}

/// One inherited listening socket.
#[derive(Debug)]
pub struct InheritedSocket {
    /// The socket, now owned by this process.
    pub listener: UnixListener,
    /// The path it is bound to (`None` for an abstract or unnamed socket).
    pub path: Option<PathBuf>,
    /// The fd it came at.
    pub fd: RawFd,
}

fn sockopt(fd: RawFd, opt: libc::c_int) -> Result<libc::c_int, ActivationError> {
    let mut value: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(4);
    // SAFETY: getsockopt writes at most `len` bytes into `value`, which has that size; a bad
    // fd is reported as an error, not undefined behaviour.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&raw mut value).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        let source = io::Error::last_os_error();
        return Err(match source.raw_os_error() {
            Some(libc::ENOTSOCK) => ActivationError::NotAUnixListener(fd),
            _ => ActivationError::Fd { fd, source },
        });
    }
    Ok(value)
}

/// Takes ownership of the fds in `fds`, which systemd passed: each must be a listening Unix
/// stream socket. They become close-on-exec, so session workers do not inherit them.
pub fn adopt(fds: Range<RawFd>) -> Result<Vec<InheritedSocket>, ActivationError> {
    let mut sockets = Vec::new();
    for fd in fds {
        let unix_stream_listener = sockopt(fd, libc::SO_DOMAIN)? == libc::AF_UNIX
            && sockopt(fd, libc::SO_TYPE)? == libc::SOCK_STREAM
            && sockopt(fd, libc::SO_ACCEPTCONN)? == 1;
        if !unix_stream_listener {
            return Err(ActivationError::NotAUnixListener(fd));
        }
        // SAFETY: F_SETFD on an fd that getsockopt just accepted as an open socket.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            let source = io::Error::last_os_error();
            return Err(ActivationError::Fd { fd, source });
        }
        // SAFETY: the fd is an open listening socket that systemd passed to this process
        // (LISTEN_PID) for it to own; `passed_fds` yields each fd once and nothing else in
        // the process uses the range.
        let listener = unsafe { UnixListener::from_raw_fd(fd) };
        let path = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(PathBuf::from));
        sockets.push(InheritedSocket { listener, path, fd });
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, IntoRawFd};

    use super::*;

    #[test]
    fn variables_name_the_fds_for_this_process_only() {
        assert_eq!(passed_fds(None, None, 10).unwrap(), None);
        assert_eq!(passed_fds(Some("10"), None, 10).unwrap(), None);
        assert_eq!(passed_fds(None, Some("1"), 10).unwrap(), None);
        assert_eq!(passed_fds(Some("11"), Some("1"), 10).unwrap(), None);
        assert_eq!(passed_fds(Some("10"), Some("1"), 10).unwrap(), Some(3..4));
        assert_eq!(passed_fds(Some("10"), Some("3"), 10).unwrap(), Some(3..6));
        for bad in ["0", "-1", "x", "", "65"] {
            assert!(
                matches!(
                    passed_fds(Some("10"), Some(bad), 10),
                    Err(ActivationError::BadCount(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            passed_fds(Some("me"), Some("1"), 10),
            Err(ActivationError::BadPid(_))
        ));
    }

    #[test]
    fn only_listening_unix_stream_sockets_are_adopted() {
        let dir =
            std::env::temp_dir().join(format!("vhost-cuda-activation-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm0.sock");
        let fd = UnixListener::bind(&path).unwrap().into_raw_fd();
        let adopted = adopt(fd..fd + 1).unwrap();
        assert_eq!(adopted.len(), 1);
        assert_eq!(adopted[0].path.as_deref(), Some(path.as_path()));
        assert_eq!(adopted[0].listener.as_raw_fd(), fd);
        // SAFETY: F_GETFD on the fd the adopted listener owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);

        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = file.as_raw_fd();
        assert!(matches!(
            adopt(fd..fd + 1),
            Err(ActivationError::NotAUnixListener(_))
        ));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = a.as_raw_fd();
        assert!(matches!(
            adopt(fd..fd + 1),
            Err(ActivationError::NotAUnixListener(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

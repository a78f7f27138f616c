// SPDX-License-Identifier: Apache-2.0 OR MIT
//! Forked worker processes for the stress and kill tests. Each child opens `/dev/qcuda` itself,
//! so each is a session of its own, as separate applications in a guest would be.
//!
//! Fork, not spawn: the workers are this program's own functions, and the parent must be able
//! to SIGKILL a child at any moment, including in the middle of an ioctl.

use std::{
    fs::File,
    io::{self, Write},
    os::fd::FromRawFd,
    panic::{self, AssertUnwindSafe},
    thread,
    time::{Duration, Instant},
};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
}

impl std::fmt::Display for ChildEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(c) => write!(f, "exit code {c}"),
            Self::Signaled(s) => write!(f, "signal {s}"),
        }
    }
}

/// A forked child that has not been reaped yet.
#[derive(Debug)]
pub struct Child {
    pid: libc::pid_t,
    reaped: bool,
}

/// Forks a child that runs `work` and exits with its return value (101 if it panics). Must be
/// called while this process has a single thread: the child inherits no other threads, so any
/// lock another thread held would stay locked in it forever.
pub fn fork(work: impl FnOnce() -> i32) -> io::Result<Child> {
    // Whatever sits in the buffer now would otherwise be printed twice.
    io::stdout().flush()?;
    io::stderr().flush()?;
    // SAFETY: the caller guarantees a single-threaded process, so the child's copy of memory is
    // consistent (no lock held by a thread that does not exist in the child).
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // Children report through pipes, never stdout: its lock may have been held by
            // another thread at the fork (in unit tests, where the harness runs threads).
            let code = panic::catch_unwind(AssertUnwindSafe(work)).unwrap_or(101);
            // SAFETY: _exit ends the child without running the parent's atexit handlers or
            // destructors on the child's copy of the parent's state.
            unsafe { libc::_exit(code) }
        }
        pid => Ok(Child { pid, reaped: false }),
    }
}

impl Child {
    /// The child's process id.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Sends SIGKILL.
    pub fn kill(&self) -> io::Result<()> {
        // SAFETY: `pid` is our unreaped child, so the id cannot have been reused.
        if unsafe { libc::kill(self.pid, libc::SIGKILL) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reaps the child without waiting; None while it runs.
    pub fn try_wait(&mut self) -> io::Result<Option<ChildEnd>> {
        if self.reaped {
            return Err(io::Error::other("child already reaped"));
        }
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; `pid` is our child.
        let rc = unsafe { libc::waitpid(self.pid, &raw mut status, libc::WNOHANG) };
        match rc {
            -1 => Err(io::Error::last_os_error()),
            0 => Ok(None),
            _ => {
                self.reaped = true;
                Ok(Some(if libc::WIFSIGNALED(status) {
                    ChildEnd::Signaled(libc::WTERMSIG(status))
                } else {
                    ChildEnd::Exited(libc::WEXITSTATUS(status))
                }))
            }
        }
    }

    /// Waits up to `limit` for the child to end; None if it is still running then.
    pub fn wait_timeout(&mut self, limit: Duration) -> io::Result<Option<ChildEnd>> {
        let start = Instant::now();
        let mut nap = Duration::from_millis(1);
        loop {
            if let Some(end) = self.try_wait()? {
                return Ok(Some(end));
            }
            if start.elapsed() >= limit {
                return Ok(None);
            }
            thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(50));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Never leave a worker behind, e.g. when the parent gives up on a failure.
        if !self.reaped {
            let _ = self.kill();
            let _ = self.wait_timeout(Duration::from_secs(30));
        }
    }
}

/// A pipe from children to the parent, for their reports.
pub fn pipe() -> io::Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    // The test harness runs several threads, which `fork` forbids in general; these children
    // take no lock another thread could hold (no stdout, no shared state), so it is fine here.

    #[test]
    fn exit_codes_and_signals_are_reported() {
        let mut c = fork(|| 7).unwrap();
        assert_eq!(
            c.wait_timeout(Duration::from_secs(10)).unwrap(),
            Some(ChildEnd::Exited(7))
        );
        let mut c = fork(|| loop {
            // SAFETY: pause only blocks until a signal arrives.
            unsafe { libc::pause() };
        })
        .unwrap();
        assert_eq!(c.try_wait().unwrap(), None);
        c.kill().unwrap();
        assert_eq!(
            c.wait_timeout(Duration::from_secs(10)).unwrap(),
            Some(ChildEnd::Signaled(libc::SIGKILL))
        );
    }

    #[test]
    fn pipe_carries_a_report() {
        let (mut r, w) = pipe().unwrap();
        // The closure owns the write end; the parent's copy is dropped with it when fork
        // returns, so the read below ends when the child exits.
        let mut c = fork(move || {
            let mut w = &w;
            i32::from(w.write_all(b"ok 3 4\n").is_err())
        })
        .unwrap();
        assert_eq!(
            c.wait_timeout(Duration::from_secs(10)).unwrap(),
            Some(ChildEnd::Exited(0))
        );
        let mut text = String::new();
        r.read_to_string(&mut text).unwrap();
        assert_eq!(text, "ok 3 4\n");
    }
}

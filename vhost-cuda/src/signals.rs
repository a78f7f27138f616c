//! SIGINT and SIGTERM: a clean stop.
//!
//! Both signals are blocked in every thread (the mask is set before any thread starts and is
//! inherited, CUDA's own threads included) and taken synchronously by one thread with
//! sigwait(2), so no code runs in signal context. The first signal asks the server to stop
//! (listeners and connections are shut down, sessions closed, socket files removed); a second
//! one exits at once, after removing the socket files.

use std::{io, mem::MaybeUninit, path::PathBuf, thread};

use tracing::{info, warn};

/// The set of signals that stop the daemon.
#[derive(Clone, Copy)]
pub struct TerminationSignals(libc::sigset_t);

impl std::fmt::Debug for TerminationSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TerminationSignals(SIGINT, SIGTERM)")
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread and in every thread it starts later.
pub fn block() -> io::Result<TerminationSignals> {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given; sigaddset and pthread_sigmask only
    // read and write that initialised set (and the thread's own mask).
    let rc = unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGINT);
        libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: initialised by sigemptyset above.
    Ok(TerminationSignals(unsafe { set.assume_init() }))
}

fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

impl TerminationSignals {
    /// Waits for the next of the signals.
    fn wait(&self) -> libc::c_int {
        loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `self.0` is an initialised set of blocked signals and `sig` is a valid
            // place for the result.
            let rc = unsafe { libc::sigwait(&raw const self.0, &raw mut sig) };
            if rc == 0 {
                return sig;
            }
        }
    }

    /// Starts the thread that takes the signals: the first calls `stop`, the second removes
    /// `socket_paths` and exits with status 1.
    pub fn spawn_handler(
        self,
        socket_paths: Vec<PathBuf>,
        stop: impl FnOnce() + Send + 'static,
    ) -> io::Result<()> {
        thread::Builder::new()
            .name("qcuda-signals".into())
            .spawn(move || {
                let sig = self.wait();
                info!("{} received, shutting down", name(sig));
                stop();
                let sig = self.wait();
                warn!("{} received again, exiting now", name(sig));
                for p in &socket_paths {
                    let _ = std::fs::remove_file(p);
                }
                std::process::exit(1);
            })
            .map(|_| ())
    }
}

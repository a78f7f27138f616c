//! Keeping signals from interrupting a request that must not be sent twice.
//!
//! qcuda.ko waits interruptibly; a signal makes the ioctl return `EINTR` while the request may
//! or may not have run on the host (docs/guest.md, "Signals"). Idempotent requests are simply
//! sent again. For the others (allocations, launches, creating and destroying objects) the
//! calling thread blocks every signal it can for the length of the ioctl, so the wait is not
//! interrupted; pending signals are delivered as soon as the mask is restored. `SIGKILL` cannot
//! be blocked and ends the process (and with it the session), which is fine. Synchronous fault
//! signals stay unblocked so that a fault is never silently turned into a kill.

use std::mem::MaybeUninit;

/// While alive, the calling thread's asynchronous signals are blocked.
#[derive(Debug)]
pub struct SignalsBlocked {
    old: libc::sigset_t,
    active: bool,
}

impl SignalsBlocked {
    /// Blocks every blockable asynchronous signal of the calling thread.
    pub fn block() -> Self {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        let mut old = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigfillset initialises `set`; sigdelset and pthread_sigmask only read and write
        // the two sigset_t we own, and `old` is initialised by pthread_sigmask when it returns 0.
        unsafe {
            libc::sigfillset(set.as_mut_ptr());
            for sig in [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGFPE,
                libc::SIGILL,
                libc::SIGTRAP,
            ] {
                libc::sigdelset(set.as_mut_ptr(), sig);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), old.as_mut_ptr());
            if rc == 0 {
                Self {
                    old: old.assume_init(),
                    active: true,
                }
            } else {
                // Blocking failed (cannot happen with a valid set); the wait stays interruptible.
                Self {
                    old: std::mem::zeroed(),
                    active: false,
                }
            }
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        if self.active {
            // SAFETY: restores the mask saved by `block` on this same thread (the guard is not Send
            // because sigset_t is plain data, but it is only ever created and dropped inside
            // `Session::submit`, on the calling thread).
            unsafe {
                libc::pthread_sigmask(libc::SIG_SETMASK, &raw const self.old, std::ptr::null_mut())
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(sig: i32) -> bool {
        let mut cur = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: a null new set only reads the current mask into `cur`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), cur.as_mut_ptr());
            libc::sigismember(cur.as_ptr(), sig) == 1
        }
    }

    #[test]
    fn blocks_async_signals_and_restores_the_mask() {
        assert!(!blocked(libc::SIGINT));
        {
            let _g = SignalsBlocked::block();
            assert!(blocked(libc::SIGINT));
            assert!(blocked(libc::SIGALRM));
            assert!(!blocked(libc::SIGSEGV));
        }
        assert!(!blocked(libc::SIGINT));
    }
}

//! Bounded spinning before a blocking wait (`--hop-poll-us`).
//!
//! A request crosses two waits on its way from the vring thread to the GPU and back: the
//! session thread waits on its queue (`session/thread.rs`), and the daemon and the worker wait
//! on the socket between them (`worker/handle.rs`, `worker/child.rs`). Waking a thread that
//! sleeps there costs tens of µs on a virtualised host, several times the CUDA call itself.
//! A waiter that has just answered a request is likely to get the next one soon, so it first
//! checks without blocking for up to a budget, a host core spinning meanwhile, and only then
//! blocks exactly as before. A zero budget blocks at once: no extra check, no clock read.

use std::{
    hint::spin_loop,
    io,
    sync::mpsc::{Receiver, RecvError, TryRecvError},
    time::{Duration, Instant},
};

/// Non-blocking checks of a channel between two reads of the clock: a check is a few atomic
/// loads, so reading the clock every time would cost more than the checks.
const CHECKS_PER_CLOCK_READ: u32 = 64;

/// When a spin of `budget` that starts now ends; `None` for no spin at all.
fn deadline(budget: Duration) -> Option<Instant> {
    if budget.is_zero() {
        return None;
    }
    let now = Instant::now();
    // Only a budget far beyond any the command line allows (100 ms) fails to add: no spin.
    Some(now.checked_add(budget).unwrap_or(now))
}

/// `rx.recv()`, after checking `rx` without blocking for up to `budget`. The same messages in
/// the same order, and the same error once every sender is gone.
pub fn recv<T>(rx: &Receiver<T>, budget: Duration) -> Result<T, RecvError> {
    if let Some(end) = deadline(budget) {
        let mut until_clock = CHECKS_PER_CLOCK_READ;
        loop {
            match rx.try_recv() {
                Ok(msg) => return Ok(msg),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) => {}
            }
            spin_loop();
            until_clock -= 1;
            if until_clock == 0 {
                if Instant::now() >= end {
                    break;
                }
                until_clock = CHECKS_PER_CLOCK_READ;
            }
        }
    }
    rx.recv()
}

/// `poll(fds, 0)` again and again until an entry is ready or `budget` has passed. Returns
/// poll's count of ready entries, with their `revents` set; 0 when the budget ran out first
/// (at once for a zero budget, without a call). An interrupted poll counts as nothing ready.
pub fn poll(fds: &mut [libc::pollfd], budget: Duration) -> io::Result<usize> {
    let Some(end) = deadline(budget) else {
        return Ok(0);
    };
    let n = libc::nfds_t::try_from(fds.len())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    loop {
        // SAFETY: `fds` is a live, exclusively borrowed slice of `n` initialised pollfds; a
        // zero timeout makes the call return at once.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), n, 0) };
        match usize::try_from(rc) {
            Ok(0) => {}
            Ok(ready) => return Ok(ready),
            // Negative: an error.
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
        // A poll is a system call: reading the clock each time costs little beside it.
        if Instant::now() >= end {
            return Ok(0);
        }
        spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write,
        os::{fd::AsRawFd, unix::net::UnixStream},
        sync::mpsc,
        thread,
    };

    use super::*;

    fn pollin(fd: i32) -> libc::pollfd {
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }
    }

    #[test]
    fn recv_keeps_order_and_ends_with_the_senders() {
        for budget in [Duration::ZERO, Duration::from_micros(50), Duration::MAX] {
            let (tx, rx) = mpsc::channel();
            for i in 0..5 {
                tx.send(i).unwrap();
            }
            let late = thread::spawn(move || {
                thread::sleep(Duration::from_millis(20));
                tx.send(5).unwrap();
            });
            let got: Vec<i32> = (0..6).map(|_| recv(&rx, budget).unwrap()).collect();
            assert_eq!(got, [0, 1, 2, 3, 4, 5], "{budget:?}");
            late.join().unwrap();
            assert_eq!(recv(&rx, budget), Err(RecvError), "{budget:?}");
        }
    }

    #[test]
    fn recv_blocks_after_its_budget() {
        let (tx, rx) = mpsc::channel();
        let t = Instant::now();
        let late = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            tx.send(()).unwrap();
        });
        // Spins 1 ms, then blocks until the message comes.
        recv(&rx, Duration::from_millis(1)).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(50));
        late.join().unwrap();
    }

    #[test]
    fn poll_sees_ready_descriptors_and_gives_up_after_its_budget() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut fds = [pollin(b.as_raw_fd()), pollin(-1)];
        assert_eq!(poll(&mut fds, Duration::ZERO).unwrap(), 0);
        let t = Instant::now();
        assert_eq!(poll(&mut fds, Duration::from_millis(2)).unwrap(), 0);
        assert!(t.elapsed() >= Duration::from_millis(2));
        a.write_all(b"x").unwrap();
        assert_eq!(poll(&mut fds, Duration::from_millis(2)).unwrap(), 1);
        assert_ne!(fds[0].revents & libc::POLLIN, 0);
        assert_eq!(fds[1].revents, 0);
        // A zero budget checks nothing, even with a descriptor ready.
        assert_eq!(poll(&mut fds, Duration::ZERO).unwrap(), 0);
        // A peer that closes counts as ready: the read that follows sees the end.
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let mut fds = [pollin(b.as_raw_fd())];
        assert_eq!(poll(&mut fds, Duration::from_secs(5)).unwrap(), 1);
    }
}

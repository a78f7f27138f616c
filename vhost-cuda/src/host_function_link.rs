//! Host functions, daemon side: the meeting point of the guest's host-function thread and the
//! session's worker.
//!
//! The guest process runs one thread that asks `HostFuncWait` over and over. Such a request is
//! never queued behind the session's other requests (a `cudaStreamSynchronize` in the worker
//! may be waiting for the very function it asks for): [`HostFnLink::wait`] takes it straight
//! from the virtqueue thread. It passes the guest's "returned" of the previous function to the
//! worker, then answers at once with a function that is due, or parks until one is.
//!
//! The worker announces due functions on a socket pair of their own (`SOCK_SEQPACKET`, one
//! 16-byte record per message; see `cuda/host_functions.rs`), read here by one thread per
//! worker. Writes to the worker never block the virtqueue thread: a worker that does not read
//! (stopped, say) loses the release and keeps its own stream waiting, nothing else.

use std::{
    collections::VecDeque,
    io::{self, Read},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
    sync::{Arc, Mutex, MutexGuard},
    thread,
};

use qcuda_proto::{status, ResponseHeader};
use tracing::{debug, warn};

use crate::cuda::host_functions::{parse_record, record, RECORD};

/// Most `HostFuncWait` requests of one session parked at once (guest-lib uses one).
pub const MAX_WAITERS: usize = 64;
/// Most due functions kept for a session whose guest is not asking (the worker bounds how many
/// can be pending; this bounds the daemon's memory regardless).
pub const MAX_DUE: usize = 1 << 16;

/// A parked `HostFuncWait` request: answering it completes its chain.
pub trait Waiter: Send {
    /// Writes `resp` and completes the chain.
    fn answer(self: Box<Self>, resp: &ResponseHeader);
}

#[derive(Default)]
struct State {
    waiters: VecDeque<Box<dyn Waiter>>,
    /// (key, seq) announced by the worker and not yet handed to the guest.
    due: VecDeque<(u64, u64)>,
    /// The daemon's end of the current worker's link.
    to_worker: Option<UnixStream>,
    /// Counts links, so that a late record of a replaced worker is dropped.
    generation: u64,
    closed: bool,
}

/// One session's host-function link. See the module documentation.
#[derive(Default)]
pub struct HostFnLink {
    state: Mutex<State>,
}

impl std::fmt::Debug for HostFnLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state();
        f.debug_struct("HostFnLink")
            .field("waiters", &st.waiters.len())
            .field("due", &st.due.len())
            .field("linked", &st.to_worker.is_some())
            .field("closed", &st.closed)
            .finish()
    }
}

fn due_answer(key: u64, seq: u64) -> ResponseHeader {
    let mut r = ResponseHeader::with_status(status::SUCCESS);
    r.rets[0] = key;
    r.rets[1] = seq;
    r
}

/// A connected `SOCK_SEQPACKET` pair, close-on-exec.
pub fn socket_pair() -> io::Result<(UnixStream, UnixStream)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into the array it is given.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nobody else.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((UnixStream::from(a), UnixStream::from(b)))
}

impl HostFnLink {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A `HostFuncWait`: releases run `released` (0: none) in the worker, then answers with a
    /// due function, now or when one comes.
    pub fn wait(&self, released: u64, waiter: Box<dyn Waiter>) {
        let mut st = self.state();
        if st.closed {
            drop(st);
            waiter.answer(&ResponseHeader::with_status(status::CUDART_UNLOADING));
            return;
        }
        if released != 0 {
            if let Some(link) = &st.to_worker {
                send_nonblocking(link, &record(released, 0));
            }
        }
        if let Some((key, seq)) = st.due.pop_front() {
            drop(st);
            waiter.answer(&due_answer(key, seq));
        } else if st.waiters.len() >= MAX_WAITERS {
            drop(st);
            waiter.answer(&ResponseHeader::with_status(status::INVALID_VALUE));
        } else {
            st.waiters.push_back(waiter);
        }
    }

    /// A new worker: `link` is the daemon's end of its host-function socket. Starts the thread
    /// that reads its announcements.
    pub fn connect(self: &Arc<Self>, link: UnixStream) -> io::Result<()> {
        let reader = link.try_clone()?;
        let generation = {
            let mut st = self.state();
            st.generation += 1;
            st.due.clear();
            st.to_worker = Some(link);
            st.generation
        };
        let me = Arc::clone(self);
        thread::Builder::new()
            .name("qcuda-hostfn".into())
            .spawn(move || me.read_due(reader, generation))?;
        Ok(())
    }

    /// The worker is gone (ended or replaced): its announcements no longer hold.
    pub fn disconnect(&self) {
        let mut st = self.state();
        st.generation += 1;
        st.due.clear();
        st.to_worker = None;
    }

    /// The session ends: parked requests are answered `CUDART_UNLOADING` (or, if the VM's
    /// rings are gone, dropped unanswered), the worker's link is closed and later requests are
    /// answered at once.
    pub fn close(&self, answer: bool) {
        let waiters: Vec<Box<dyn Waiter>> = {
            let mut st = self.state();
            st.closed = true;
            st.to_worker = None;
            st.due.clear();
            st.waiters.drain(..).collect()
        };
        if answer {
            let resp = ResponseHeader::with_status(status::CUDART_UNLOADING);
            for w in waiters {
                w.answer(&resp);
            }
        }
    }

    /// Parked requests (for tests and diagnostics).
    pub fn parked(&self) -> usize {
        self.state().waiters.len()
    }

    fn read_due(&self, mut link: UnixStream, generation: u64) {
        let mut r = [0u8; RECORD];
        loop {
            match link.read(&mut r) {
                Ok(RECORD) => {}
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    warn!("host-function link: record of {n} bytes; link dropped");
                    break;
                }
            }
            let (key, seq) = parse_record(&r);
            let mut st = self.state();
            if st.generation != generation || st.closed {
                break;
            }
            if let Some(w) = st.waiters.pop_front() {
                drop(st);
                w.answer(&due_answer(key, seq));
            } else if st.due.len() < MAX_DUE {
                st.due.push_back((key, seq));
            } else {
                warn!(
                    key,
                    "host function due with {MAX_DUE} already waiting for the guest; dropped"
                );
            }
        }
        debug!("host-function link of a worker closed");
    }
}

/// Sends one record without blocking; a worker that does not read loses it.
fn send_nonblocking(link: &UnixStream, rec: &[u8; RECORD]) {
    // SAFETY: send reads `rec.len()` bytes from a live buffer on a descriptor we own.
    let n = unsafe {
        libc::send(
            link.as_raw_fd(),
            rec.as_ptr().cast(),
            rec.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if usize::try_from(n).ok() != Some(RECORD) {
        debug!(
            "host-function release not sent: {}",
            io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Write, sync::mpsc, time::Duration};

    use super::*;

    struct Probe(mpsc::Sender<ResponseHeader>);

    impl Waiter for Probe {
        fn answer(self: Box<Self>, resp: &ResponseHeader) {
            let _ = self.0.send(*resp);
        }
    }

    fn probe() -> (Box<dyn Waiter>, mpsc::Receiver<ResponseHeader>) {
        let (tx, rx) = mpsc::channel();
        (Box::new(Probe(tx)), rx)
    }

    #[test]
    fn a_parked_wait_gets_the_next_due_function_and_releases_go_to_the_worker() {
        let link = Arc::new(HostFnLink::default());
        let (daemon, mut worker) = socket_pair().unwrap();
        link.connect(daemon).unwrap();
        let (w, rx) = probe();
        link.wait(0, w);
        assert_eq!(link.parked(), 1);
        worker.write_all(&record(42, 7)).unwrap();
        let r = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.rets[0], r.rets[1]), (0, 42, 7));
        // Due before anyone asks: kept, handed to the next wait, which releases run 7.
        worker.write_all(&record(43, 8)).unwrap();
        thread::sleep(Duration::from_millis(50));
        let (w, rx) = probe();
        link.wait(7, w);
        let r = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((r.rets[0], r.rets[1]), (43, 8));
        let mut rel = [0u8; RECORD];
        worker.read_exact(&mut rel).unwrap();
        assert_eq!(parse_record(&rel), (7, 0));
    }

    #[test]
    fn close_answers_parked_waits_and_every_later_one() {
        let link = Arc::new(HostFnLink::default());
        let (w, rx) = probe();
        link.wait(0, w);
        link.close(true);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap().status,
            status::CUDART_UNLOADING
        );
        let (w, rx) = probe();
        link.wait(3, w);
        assert_eq!(rx.try_recv().unwrap().status, status::CUDART_UNLOADING);
    }

    #[test]
    fn waits_are_bounded_and_a_replaced_worker_is_not_heard() {
        let link = Arc::new(HostFnLink::default());
        let mut answers = Vec::new();
        for _ in 0..MAX_WAITERS + 1 {
            let (w, rx) = probe();
            link.wait(0, w);
            answers.push(rx);
        }
        assert_eq!(
            answers.last().unwrap().try_recv().unwrap().status,
            status::INVALID_VALUE
        );
        let (daemon, mut old) = socket_pair().unwrap();
        link.connect(daemon).unwrap();
        link.disconnect();
        old.write_all(&record(1, 1)).unwrap();
        thread::sleep(Duration::from_millis(50));
        assert_eq!(link.parked(), MAX_WAITERS);
        link.close(false);
        answers[0].try_recv().unwrap_err();
    }
}

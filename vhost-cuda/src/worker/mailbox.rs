//! The hop's fast path: a mailbox in shared memory between the daemon and one worker.
//!
//! Every request crosses the socket between a session thread and its worker twice (the request,
//! the answer). Even with both sides awake and spinning (`--hop-poll-us`), that is a send, polls
//! and two reads per direction, system calls that cost about 10 µs per round trip on a
//! virtualised GPU host (QCUDA_LATENCY's *hop* column, docs/perf). The mailbox is one sealed
//! memfd both map: a request slot the daemon writes and an answer slot the worker writes, each
//! published by a sequence number. A side that waits spins on the other's sequence number, so a
//! hop between two awake sides takes no system call.
//!
//! The socket stays for everything else and for sleepers: before a side blocks on the socket it
//! raises its `sleeping` flag and looks once more; a side that publishes looks at the other's
//! flag afterwards and, if it is raised, also sends a `Posted` frame to wake it. Both use
//! sequentially consistent order, so at least one of them sees the other: the sleeper finds the
//! post, or the poster sees the flag (a stale `Posted` is ignored). Messages that carry file
//! descriptors, and requests too long for the slot, go over the socket; a mailbox request
//! records how many frames the daemon had sent before it, and the worker reads those first, so
//! the worker sees every message in the order the daemon sent it.
//!
//! Trust: the worker may be compromised. The daemon reads an answer's length once, bounds it by
//! the slot, copies the bytes out before decoding them, and accepts only the sequence number it
//! expects; the memfd is sealed against shrinking, so no worker can make the daemon's mapping
//! fault. A worker that scribbles on the mailbox gets a garbled or missing answer, as it could
//! over the socket.

use std::{
    fs::File,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst},
};

use vm_memory::VolatileSlice;

/// Bytes of the control area (the sequence numbers and flags, each on its own cache line).
const CONTROL: usize = 4096;
/// The largest request body the mailbox carries; longer ones go over the socket.
pub const REQUEST_CAPACITY: usize = 128 << 10;
/// The largest answer body (answers are a response header and a count).
pub const ANSWER_CAPACITY: usize = 4096;
/// The memfd's size.
pub const SIZE: usize = CONTROL + REQUEST_CAPACITY + ANSWER_CAPACITY;

// Control area offsets: written by the daemon ...
const REQUEST_SEQ: usize = 0;
const REQUEST_LEN: usize = 8;
const REQUEST_AFTER: usize = 16;
const DAEMON_SLEEPING: usize = 64;
/// How many of the worker's answers the daemon has delivered to the guest (completed on the
/// ring): read by a worker that a restarted daemon adopts (`child.rs`, `ToWorker::Adopt`).
const DELIVERED: usize = 320;
// ... and by the worker.
const ANSWER_SEQ: usize = 128;
const ANSWER_LEN: usize = 136;
const WORKER_SLEEPING: usize = 192;

const REQUEST_AT: usize = CONTROL;
const ANSWER_AT: usize = CONTROL + REQUEST_CAPACITY;

/// A posted request: its sequence number, the socket frames the daemon sent before it, and its
/// body.
#[derive(Debug, PartialEq, Eq)]
pub struct Posted {
    /// The request's sequence number (1, 2, ...).
    pub seq: u64,
    /// Socket frames the daemon had sent when it posted this.
    pub after_frames: u64,
    /// The message body.
    pub body: Vec<u8>,
}

/// One side's mapping of a mailbox.
#[derive(Debug)]
pub struct Mailbox {
    base: NonNull<u8>,
}

// SAFETY: the mapping is shared memory reached only through atomics and volatile copies; it
// stays mapped for the life of the value.
unsafe impl Send for Mailbox {}
// SAFETY: as above.
unsafe impl Sync for Mailbox {}

impl Drop for Mailbox {
    fn drop(&mut self) {
        // SAFETY: `base` is the start of a live SIZE-byte mapping this value owns.
        unsafe { libc::munmap(self.base.as_ptr().cast(), SIZE) };
    }
}

impl Mailbox {
    /// A new mailbox (the daemon's side) and its memfd, sealed at its size, for the worker.
    pub fn create() -> io::Result<(Self, OwnedFd)> {
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe {
            libc::memfd_create(
                c"qcuda-hop".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        File::from(fd.try_clone()?).set_len(SIZE as u64)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS on a memfd made with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((Self::map(&fd)?, fd))
    }

    /// Maps a mailbox received from the daemon (the worker's side); it must be exactly
    /// [`SIZE`] bytes.
    pub fn open(file: &File) -> io::Result<Self> {
        if file.metadata()?.len() != SIZE as u64 {
            return Err(io::Error::from(io::ErrorKind::InvalidData));
        }
        Self::map(file)
    }

    fn map(fd: &impl AsRawFd) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of SIZE bytes of `fd`, which is at least that long; the
        // kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast())
            .map(|base| Self { base })
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "the mapping is page aligned and `off` a multiple of 8"
    )]
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the 8-aligned control offsets inside the mapping (page
        // aligned), which lives as long as `self`; the other side only uses it atomically.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "the mapping is page aligned and `off` a multiple of 8"
    )]
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `u64_at`.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() }
    }

    fn area(&self, at: usize, len: usize) -> VolatileSlice<'_> {
        debug_assert!(at + len <= SIZE);
        // SAFETY: `at..at + len` lies inside the mapping, which outlives the slice; the other
        // side may write it concurrently, which volatile accesses tolerate.
        unsafe { VolatileSlice::new(self.base.as_ptr().add(at), len) }
    }

    // --- the daemon's side ----------------------------------------------------------------

    /// Posts request `seq` (after `after_frames` socket frames). Returns `None` if the body is
    /// too long for the slot (send it over the socket instead), else whether the worker sleeps
    /// on the socket and must be sent a `Posted` frame.
    pub fn post_request(&self, seq: u64, after_frames: u64, body: &[u8]) -> Option<bool> {
        if body.len() > REQUEST_CAPACITY {
            return None;
        }
        self.area(REQUEST_AT, body.len()).copy_from(body);
        self.u64_at(REQUEST_LEN).store(body.len() as u64, SeqCst);
        self.u64_at(REQUEST_AFTER).store(after_frames, SeqCst);
        self.u64_at(REQUEST_SEQ).store(seq, SeqCst);
        Some(self.u32_at(WORKER_SLEEPING).load(SeqCst) != 0)
    }

    /// The answer numbered `seq`, if the worker posted it: its body, copied out (an answer
    /// longer than the slot is an error).
    pub fn take_answer(&self, seq: u64) -> Option<Result<Vec<u8>, ()>> {
        if self.u64_at(ANSWER_SEQ).load(SeqCst) != seq {
            return None;
        }
        let len = self.u64_at(ANSWER_LEN).load(SeqCst);
        let Some(len) = usize::try_from(len).ok().filter(|l| *l <= ANSWER_CAPACITY) else {
            return Some(Err(()));
        };
        let mut body = vec![0u8; len];
        self.area(ANSWER_AT, len).copy_to(&mut body[..]);
        Some(Ok(body))
    }

    /// Raises or lowers the daemon's `sleeping` flag.
    pub fn set_daemon_sleeping(&self, sleeping: bool) {
        self.u32_at(DAEMON_SLEEPING)
            .store(u32::from(sleeping), SeqCst);
    }

    /// Records that the answers up to number `n` reached the guest (their chains are
    /// completed). A worker adopted by a restarted daemon compares it with its own count to tell
    /// whether its last answer was lost with the old daemon.
    pub fn set_delivered(&self, n: u64) {
        self.u64_at(DELIVERED).store(n, SeqCst);
    }

    // --- the worker's side ----------------------------------------------------------------

    /// How many answers the daemon says reached the guest ([`Mailbox::set_delivered`]).
    pub fn delivered(&self) -> u64 {
        self.u64_at(DELIVERED).load(SeqCst)
    }

    /// The request after `last`, if the daemon posted it.
    pub fn take_request(&self, last: u64) -> Option<Posted> {
        let seq = self.u64_at(REQUEST_SEQ).load(SeqCst);
        if seq == last {
            return None;
        }
        let after_frames = self.u64_at(REQUEST_AFTER).load(SeqCst);
        // The daemon is trusted, but a bound costs nothing.
        let len = usize::try_from(self.u64_at(REQUEST_LEN).load(SeqCst))
            .unwrap_or(usize::MAX)
            .min(REQUEST_CAPACITY);
        let mut body = vec![0u8; len];
        self.area(REQUEST_AT, len).copy_to(&mut body[..]);
        Some(Posted {
            seq,
            after_frames,
            body,
        })
    }

    /// Posts answer `seq`. Returns `None` if it is too long for the slot (send it over the
    /// socket), else whether the daemon sleeps on the socket and must be sent a `Posted` frame.
    pub fn post_answer(&self, seq: u64, body: &[u8]) -> Option<bool> {
        if body.len() > ANSWER_CAPACITY {
            return None;
        }
        self.area(ANSWER_AT, body.len()).copy_from(body);
        self.u64_at(ANSWER_LEN).store(body.len() as u64, SeqCst);
        self.u64_at(ANSWER_SEQ).store(seq, SeqCst);
        Some(self.u32_at(DAEMON_SLEEPING).load(SeqCst) != 0)
    }

    /// Raises or lowers the worker's `sleeping` flag.
    pub fn set_worker_sleeping(&self, sleeping: bool) {
        self.u32_at(WORKER_SLEEPING)
            .store(u32::from(sleeping), SeqCst);
    }
}

#[cfg(test)]
impl Mailbox {
    /// Tests: a word of the control area no message uses, for a test's own handshake.
    const TEST_WORD: usize = 256;

    pub(crate) fn ack_for_test(&self, n: u64) {
        self.u64_at(Self::TEST_WORD).store(n, SeqCst);
    }

    pub(crate) fn acked_for_test(&self) -> u64 {
        self.u64_at(Self::TEST_WORD).load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Mailbox, Mailbox) {
        let (daemon, fd) = Mailbox::create().unwrap();
        let worker = Mailbox::open(&File::from(fd)).unwrap();
        (daemon, worker)
    }

    #[test]
    fn requests_and_answers_cross_with_their_order_and_flags() {
        let (d, w) = pair();
        assert_eq!(w.take_request(0), None);
        // The worker is awake: no kick needed.
        assert_eq!(d.post_request(1, 3, b"run one"), Some(false));
        let p = w.take_request(0).unwrap();
        assert_eq!(
            (p.seq, p.after_frames, &p.body[..]),
            (1, 3, &b"run one"[..])
        );
        assert_eq!(w.take_request(1), None);
        assert_eq!(d.take_answer(1), None);
        d.set_daemon_sleeping(true);
        assert_eq!(w.post_answer(1, b"done"), Some(true));
        assert_eq!(d.take_answer(1), Some(Ok(b"done".to_vec())));
        // A sleeping worker must be kicked.
        w.set_worker_sleeping(true);
        assert_eq!(d.post_request(2, 3, b"two"), Some(true));
        w.set_worker_sleeping(false);
        assert_eq!(w.take_request(1).unwrap().body, b"two");
    }

    #[test]
    fn long_bodies_are_refused_and_a_forged_length_is_an_error() {
        let (d, w) = pair();
        assert_eq!(d.post_request(1, 0, &vec![0; REQUEST_CAPACITY + 1]), None);
        assert_eq!(w.post_answer(1, &vec![0; ANSWER_CAPACITY + 1]), None);
        // A hostile worker announces more than the slot holds.
        w.u64_at(ANSWER_LEN).store(u64::MAX, SeqCst);
        w.u64_at(ANSWER_SEQ).store(7, SeqCst);
        assert_eq!(d.take_answer(7), Some(Err(())));
    }

    #[test]
    fn the_memfd_is_sealed_and_a_wrong_size_is_refused() {
        let (_d, fd) = Mailbox::create().unwrap();
        let f = File::from(fd);
        f.set_len(0).expect_err("a worker must not shrink it");
        let other = tempfile_of(100);
        Mailbox::open(&other).unwrap_err();
    }

    fn tempfile_of(len: u64) -> File {
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: just created, owned by nobody else.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }
}

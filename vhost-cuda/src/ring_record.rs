//! The request ring's record of chains in flight, for the daemon after a restart.
//!
//! When QEMU reconnects to a restarted daemon it gives it the ring with the avail index rolled
//! back to the used index: it delivers again every chain after the last one completed, in ring
//! order. Sessions complete their chains out of order, so that is wrong both ways: a chain that
//! was completed after an older one still running comes again (and its second completion names
//! a head the guest no longer has out: "id N is not a head"), and the older one, if it lies
//! before the used index, never comes. The daemon therefore keeps its own record, in a memfd that
//! it keeps in systemd's file-descriptor store beside its workers (`fd_store.rs`,
//! `qcuda-r.<vm>`): the ring's addresses, the next avail position it would take, and for each
//! descriptor head taken and not yet completed its avail position, or the used index its
//! completion takes while it is being completed. The next daemon, on the ring's first start,
//! takes exactly the chains in flight again (a worker answers one it already ran from its
//! record, `worker/child.rs`) and goes on at the recorded position; a completion that reached
//! the used ring before the crash (its used index is below the ring's) is not repeated.
//!
//! Each entry is one 64-bit word, written with one atomic store, so a crash leaves every entry
//! whole. The record applies only to the very ring it was written for: the same addresses, a
//! used index where the record left it, and an avail index at or past the recorded position. A
//! guest that rebooted meanwhile has a new ring (often at the same addresses, but counting from
//! zero again), and the record is dropped.

use std::{
    fs::File,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use qcuda_proto::QUEUE_SIZE;

/// "qcudaRR1".
const MAGIC: u64 = u64::from_le_bytes(*b"qcudaRR1");
const W_MAGIC: usize = 0;
const W_DESC: usize = 1;
const W_AVAIL: usize = 2;
const W_USED: usize = 3;
/// The next avail position the daemon would take.
const W_NEXT_AVAIL: usize = 4;
/// The used index after the last completion.
const W_USED_IDX: usize = 5;
const ENTRIES: usize = 8;
const WORDS: usize = ENTRIES + QUEUE_SIZE as usize;
const BYTES: usize = WORDS * 8;

/// An entry: state in bits 32..40, avail position in 16..32, used index in 0..16.
const TAKEN: u64 = 1;
const COMPLETING: u64 = 2;

fn entry(state: u64, pos: u16, used_at: u16) -> u64 {
    state << 32 | u64::from(pos) << 16 | u64::from(used_at)
}

fn unpack(e: u64) -> (u64, u16, u16) {
    let pos = u16::try_from((e >> 16) & 0xffff).unwrap_or(0);
    let used_at = u16::try_from(e & 0xffff).unwrap_or(0);
    ((e >> 32) & 0xff, pos, used_at)
}

/// The ring's addresses, as the frontend set them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAddrs {
    /// The descriptor table.
    pub desc: u64,
    /// The avail ring.
    pub avail: u64,
    /// The used ring.
    pub used: u64,
}

/// What a restarted daemon takes again: the chains in flight (avail position and head, oldest
/// first) and where to go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Chains taken and not completed, oldest first.
    pub in_flight: Vec<(u16, u16)>,
    /// The avail position to go on from.
    pub next_avail: u16,
}

/// The mapped record.
#[derive(Debug)]
pub struct RingRecord {
    file: File,
    words: NonNull<AtomicU64>,
}

// SAFETY: the mapping is shared memory used only through atomics; it lives as long as `self`.
unsafe impl Send for RingRecord {}
// SAFETY: as above.
unsafe impl Sync for RingRecord {}

impl Drop for RingRecord {
    fn drop(&mut self) {
        // SAFETY: `words` is a mapping of BYTES bytes made in `map`, unused past this point.
        unsafe { libc::munmap(self.words.as_ptr().cast(), BYTES) };
    }
}

impl RingRecord {
    /// A new, empty record.
    pub fn create() -> io::Result<Self> {
        // SAFETY: memfd_create with a NUL-terminated name returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"qcuda-ring-record".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(BYTES as u64)?;
        Self::map(file)
    }

    /// The record a previous daemon left (from the store).
    pub fn open(fd: OwnedFd) -> io::Result<Self> {
        let file = File::from(fd);
        if file.metadata()?.len() != BYTES as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "ring record of the wrong size",
            ));
        }
        Self::map(file)
    }

    fn map(file: File) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of the whole file; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let words = NonNull::new(p.cast::<AtomicU64>()).ok_or(io::ErrorKind::Other)?;
        Ok(Self { file, words })
    }

    /// The file's descriptor (to keep it for the next daemon).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < WORDS);
        // SAFETY: `i` is below WORDS, inside the mapping, which lives as long as `self`; the
        // words are only used atomically.
        unsafe { &*self.words.as_ptr().add(i) }
    }

    /// Starts recording for the ring at `addrs`, from avail position `next_avail` and used
    /// index `used_idx`, with nothing in flight.
    pub fn start(&self, addrs: RingAddrs, next_avail: u16, used_idx: u16) {
        self.word(W_MAGIC).store(0, Ordering::SeqCst);
        for i in ENTRIES..WORDS {
            self.word(i).store(0, Ordering::Relaxed);
        }
        self.word(W_DESC).store(addrs.desc, Ordering::Relaxed);
        self.word(W_AVAIL).store(addrs.avail, Ordering::Relaxed);
        self.word(W_USED).store(addrs.used, Ordering::Relaxed);
        self.word(W_NEXT_AVAIL)
            .store(u64::from(next_avail), Ordering::Relaxed);
        self.word(W_USED_IDX)
            .store(u64::from(used_idx), Ordering::Relaxed);
        self.word(W_MAGIC).store(MAGIC, Ordering::SeqCst);
    }

    /// Stops recording (the ring is not ours any more): nothing is taken again.
    pub fn stop(&self) {
        self.word(W_MAGIC).store(0, Ordering::SeqCst);
    }

    fn entry_word(&self, head: u16) -> Option<&AtomicU64> {
        (usize::from(head) < usize::from(QUEUE_SIZE))
            .then(|| self.word(ENTRIES + usize::from(head)))
    }

    /// The chain with `head` was taken at avail position `pos`.
    pub fn taken(&self, head: u16, pos: u16) {
        if let Some(w) = self.entry_word(head) {
            w.store(entry(TAKEN, pos, 0), Ordering::Release);
        }
    }

    /// The next avail position to take is `next`.
    pub fn advanced(&self, next: u16) {
        self.word(W_NEXT_AVAIL)
            .store(u64::from(next), Ordering::Release);
    }

    /// The chain with `head` is being completed at used index `used_at` (before the used ring
    /// is written).
    pub fn completing(&self, head: u16, used_at: u16) {
        if let Some(w) = self.entry_word(head) {
            let (_, pos, _) = unpack(w.load(Ordering::Acquire));
            w.store(entry(COMPLETING, pos, used_at), Ordering::Release);
        }
    }

    /// The chain with `head` is completed: the used index `used_idx` is published.
    pub fn completed(&self, head: u16, used_idx: u16) {
        if let Some(w) = self.entry_word(head) {
            w.store(0, Ordering::Release);
        }
        self.word(W_USED_IDX)
            .store(u64::from(used_idx), Ordering::Release);
    }

    /// What to take again on the ring at `addrs`, whose used and avail indices in guest memory
    /// are `used_idx` and `avail_idx` now; `None` when the record is not of this ring (never
    /// started, stopped, other addresses, or a ring that counts from elsewhere: a new one).
    pub fn recovery(&self, addrs: RingAddrs, used_idx: u16, avail_idx: u16) -> Option<Recovery> {
        if self.word(W_MAGIC).load(Ordering::SeqCst) != MAGIC
            || self.word(W_DESC).load(Ordering::Relaxed) != addrs.desc
            || self.word(W_AVAIL).load(Ordering::Relaxed) != addrs.avail
            || self.word(W_USED).load(Ordering::Relaxed) != addrs.used
        {
            return None;
        }
        let next_avail =
            u16::try_from(self.word(W_NEXT_AVAIL).load(Ordering::Acquire) & 0xffff).unwrap_or(0);
        let recorded_used =
            u16::try_from(self.word(W_USED_IDX).load(Ordering::Acquire) & 0xffff).unwrap_or(0);
        // The guest publishes forward only: its avail index is at or past what was taken.
        if avail_idx.wrapping_sub(next_avail) >= 0x8000 {
            return None;
        }
        // The used index is where the record left it, or one further for a completion under
        // way at the crash.
        let completing_at_end = (0..QUEUE_SIZE).any(|head| {
            self.entry_word(head).is_some_and(|w| {
                let (state, _, used_at) = unpack(w.load(Ordering::Acquire));
                state == COMPLETING && used_at == recorded_used
            })
        });
        if used_idx != recorded_used
            && !(completing_at_end && used_idx == recorded_used.wrapping_add(1))
        {
            return None;
        }
        let mut in_flight = Vec::new();
        for head in 0..QUEUE_SIZE {
            let Some(w) = self.entry_word(head) else {
                continue;
            };
            let (state, pos, used_at) = unpack(w.load(Ordering::Acquire));
            let published =
                state == COMPLETING && used_idx.wrapping_sub(used_at).wrapping_sub(1) < 0x8000;
            if state == TAKEN || (state == COMPLETING && !published) {
                in_flight.push((pos, head));
            }
        }
        // Oldest first: furthest behind the next position.
        in_flight.sort_by_key(|&(pos, _)| std::cmp::Reverse(next_avail.wrapping_sub(pos)));
        Some(Recovery {
            in_flight,
            next_avail,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING: RingAddrs = RingAddrs {
        desc: 0x1000,
        avail: 0x2000,
        used: 0x3000,
    };

    #[test]
    fn only_chains_not_completed_are_taken_again_oldest_first() {
        let r = RingRecord::create().unwrap();
        r.start(RING, 65530, 38);
        // Six chains across the wrap of the avail index.
        for (i, head) in [4u16, 9, 2, 7, 11, 5].iter().enumerate() {
            let pos = 65530u16.wrapping_add(u16::try_from(i).unwrap());
            r.taken(*head, pos);
            r.advanced(pos.wrapping_add(1));
        }
        // Out of order: 9 completed and published; 7 completed at used 41 (the ring's used
        // index is 41: not published yet); 11 at used 40 (published).
        r.completing(9, 38);
        r.completed(9, 39);
        r.completing(11, 39);
        r.completed(11, 40);
        r.completing(7, 40);
        // Crashed with 7's completion under way: the used index is 40 or 41.
        assert_eq!(
            r.recovery(RING, 41, 0).unwrap().in_flight,
            vec![(65530, 4), (65532, 2), (65535, 5)]
        );
        let rec = r.recovery(RING, 40, 0).unwrap();
        assert_eq!(rec.next_avail, 0);
        assert_eq!(
            rec.in_flight,
            vec![(65530, 4), (65532, 2), (65533, 7), (65535, 5)]
        );
        // Another ring, a new ring at the same addresses (counting from zero), or a stopped
        // record: nothing.
        assert_eq!(
            r.recovery(
                RingAddrs {
                    used: 0x4000,
                    ..RING
                },
                40,
                0
            ),
            None
        );
        assert_eq!(r.recovery(RING, 0, 0), None);
        assert_eq!(r.recovery(RING, 40, 65000), None);
        r.stop();
        assert_eq!(r.recovery(RING, 40, 0), None);
    }

    #[test]
    fn the_record_travels_in_its_file() {
        let r = RingRecord::create().unwrap();
        r.start(RING, 7, 7);
        r.taken(3, 7);
        r.advanced(8);
        let copy = RingRecord::open(OwnedFd::from(r.file.try_clone().unwrap())).unwrap();
        drop(r);
        let rec = copy.recovery(RING, 7, 8).unwrap();
        assert_eq!(rec.in_flight, vec![(7, 3)]);
        assert_eq!(rec.next_avail, 8);
        // A head beyond the ring is ignored, not a crash.
        copy.taken(QUEUE_SIZE, 8);
        copy.completing(QUEUE_SIZE + 3, 1);
        copy.completed(u16::MAX, 0);
    }
}

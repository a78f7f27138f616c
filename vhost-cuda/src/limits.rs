//! Per-VM limits and accounting: `--max-sessions`, `--max-gpu-memory`, and what each session
//! holds and launched.
//!
//! A VM's sessions run in separate worker processes, so what they use is counted where all of
//! them see it: a small shared file (a memfd) per vhost-user connection, one 64-bit word for
//! the limit and, per worker slot, words for the bytes of device memory that worker holds, the
//! most it held, and the kernels and graphs it launched. The daemon creates the file
//! ([`GpuMemoryQuota`]) whether or not a limit is set (without one the limit word is
//! `u64::MAX`), gives each worker a slot ([`SlotLease`]) and the file on [`QUOTA_FD`]; the
//! worker ([`QuotaSlot`]) adds to its own words before an allocation is kept and takes them
//! off when the allocation is freed or its context goes, and counts its launches. The daemon
//! reads the words for `qcuda-smi`, `vhost-cuda --stats` and its session log lines
//! ([`SlotUsage`]). Under a limit an allocation is admitted under a lock: a POSIX record lock
//! on the file (per process, so the kernel drops it when a worker dies holding it) plus a
//! mutex for the threads of one process; without one it is only counted. A worker's words are
//! written only by that worker; once the worker is reaped the daemon clears its bytes held, so
//! a killed worker's memory (which the driver frees at its exit) stops counting then, and
//! reads its final counts before the slot goes to another worker.
//!
//! A worker that lies about its words can only exceed its VM's limit or misreport itself,
//! which it could not do without the driver being taken over (see docs/SECURITY.md): it is a
//! limit for well-behaved workers of hostile guests, enforced by code the guest does not
//! control.

use std::{
    fs::File,
    io,
    os::fd::{AsRawFd, FromRawFd, RawFd},
    ptr::NonNull,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
};

/// The descriptor a worker finds the quota file on (next to the channel on 3).
pub const QUOTA_FD: RawFd = 4;

/// The limits of one VM (one vhost-user connection).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Most sessions (guest processes using /dev/qcuda) at once; `None`: only the built-in
    /// bound (`session::MAX_SESSIONS`).
    pub max_sessions: Option<usize>,
    /// Most bytes of device memory all sessions together may have allocated; `None`: no limit
    /// beyond the GPU's.
    pub max_gpu_memory: Option<u64>,
}

/// A libc `c_int` constant as the `c_short` of a `flock` field, checked when compiled.
#[expect(
    clippy::cast_possible_truncation,
    reason = "only for the consts below; the assertion rejects a value outside c_short"
)]
const fn flock_short(v: libc::c_int) -> libc::c_short {
    assert!(v >= libc::c_short::MIN as libc::c_int && v <= libc::c_short::MAX as libc::c_int);
    v as libc::c_short
}

/// `F_WRLCK` for `flock::l_type`.
const LOCK_WRITE: libc::c_short = flock_short(libc::F_WRLCK);
/// `F_UNLCK` for `flock::l_type`.
const LOCK_NONE: libc::c_short = flock_short(libc::F_UNLCK);
/// `SEEK_SET` for `flock::l_whence`.
const WHENCE_START: libc::c_short = flock_short(libc::SEEK_SET);

/// Words per slot: bytes held, the most bytes held, kernels launched, graphs launched, ns
/// the GPU was busy with the worker's work and ns of recording they were measured over (the
/// GPU timeline recorder, `cuda/trace/`).
const SLOT_WORDS: usize = 6;
/// A slot's words, by offset.
const HELD: usize = 0;
const PEAK: usize = 1;
const KERNELS: usize = 2;
const GRAPHS: usize = 3;
const GPU_BUSY: usize = 4;
const GPU_TRACED: usize = 5;
/// The file's last word: this layout ("QCUDAQ02"). A file without it (a daemon of another
/// layout made it) is not used.
const FORMAT: u64 = u64::from_le_bytes(*b"QCUDAQ02");

/// The limit word's value when there is no limit.
pub const NO_LIMIT: u64 = u64::MAX;

/// The mapped quota file: word 0 the limit, then [`SLOT_WORDS`] words per slot, then
/// [`FORMAT`].
struct QuotaMap {
    file: File,
    words: NonNull<AtomicU64>,
    len: usize,
    /// Serialises admissions among the threads of this process (record locks do not).
    lock: Mutex<()>,
}

// SAFETY: the mapping is shared memory accessed only through atomics, and lives as long as the
// map; nothing in it is tied to a thread.
unsafe impl Send for QuotaMap {}
// SAFETY: as above.
unsafe impl Sync for QuotaMap {}

impl std::fmt::Debug for QuotaMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaMap")
            .field("limit", &self.limit())
            .field("slots", &self.slots())
            .field("used", &self.used())
            .finish()
    }
}

impl Drop for QuotaMap {
    fn drop(&mut self) {
        // SAFETY: `words` is the start of a mapping of `len * 8` bytes made by `map`, and no
        // reference into it outlives the map.
        unsafe { libc::munmap(self.words.as_ptr().cast(), self.len * 8) };
    }
}

/// Holds the process's record lock on the quota file and the in-process mutex.
struct Admission<'a> {
    map: &'a QuotaMap,
    _guard: MutexGuard<'a, ()>,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        let _ = self.map.record_lock(LOCK_NONE);
    }
}

impl QuotaMap {
    /// Maps `file`; `fresh`: a file just made, which gets its format word here.
    fn map(file: File, fresh: bool) -> io::Result<Self> {
        let size = file.metadata()?.len();
        let len = usize::try_from(size / 8).map_err(|_| io::ErrorKind::InvalidData)?;
        if len < 2 + SLOT_WORDS || size % 8 != 0 || (len - 2) % SLOT_WORDS != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "quota file too small, or of another layout",
            ));
        }
        // SAFETY: a fresh shared mapping of the whole file; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * 8,
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
        let map = Self {
            file,
            words,
            len,
            lock: Mutex::new(()),
        };
        let format = map.word(len - 1);
        if fresh {
            format.store(FORMAT, Ordering::Release);
        } else if format.load(Ordering::Acquire) != FORMAT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "quota file of another layout (a daemon of another version made it)",
            ));
        }
        Ok(map)
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.len);
        // SAFETY: `i` is inside the mapping, which is page-aligned, so every word is aligned;
        // all access to it is atomic.
        unsafe { &*self.words.as_ptr().add(i) }
    }

    fn limit(&self) -> u64 {
        self.word(0).load(Ordering::Acquire)
    }

    fn slots(&self) -> usize {
        (self.len - 2) / SLOT_WORDS
    }

    /// Word `which` of slot `slot`.
    fn slot_word(&self, slot: usize, which: usize) -> &AtomicU64 {
        self.word(1 + slot * SLOT_WORDS + which)
    }

    fn used(&self) -> u64 {
        (0..self.slots()).fold(0u64, |t, i| {
            t.saturating_add(self.slot_word(i, HELD).load(Ordering::Acquire))
        })
    }

    fn record_lock(&self, kind: libc::c_short) -> io::Result<()> {
        // SAFETY: an all-zero flock is a valid value; the fields that matter are set below.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind;
        fl.l_whence = WHENCE_START;
        fl.l_start = 0;
        fl.l_len = 8;
        loop {
            // SAFETY: fcntl(F_SETLKW) reads the flock we pass; the descriptor is ours.
            if unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLKW, &fl) } == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn admit(&self) -> io::Result<Admission<'_>> {
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.record_lock(LOCK_WRITE)?;
        Ok(Admission {
            map: self,
            _guard: guard,
        })
    }
}

/// The daemon's side: one VM's quota file and its free slots.
#[derive(Debug)]
pub struct GpuMemoryQuota {
    map: Arc<QuotaMap>,
    taken: Arc<Mutex<Vec<bool>>>,
}

impl GpuMemoryQuota {
    /// A quota of `limit` bytes ([`NO_LIMIT`]: only counted) shared by at most `slots`
    /// workers at once.
    pub fn new(limit: u64, slots: usize) -> io::Result<Self> {
        // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
        let fd =
            unsafe { libc::memfd_create(c"qcuda-gpu-memory-quota".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(((slots.max(1) * SLOT_WORDS + 2) * 8) as u64)?;
        let map = QuotaMap::map(file, true)?;
        map.word(0).store(limit, Ordering::Release);
        Ok(Self {
            taken: Arc::new(Mutex::new(vec![false; map.slots()])),
            map: Arc::new(map),
        })
    }

    /// The accounting file a previous daemon made (kept across its restart in systemd's
    /// file-descriptor store, `crate::fd_store`): its slots' words stay as its workers wrote
    /// them, the limit word becomes `limit`. Slots are claimed with [`GpuMemoryQuota::claim`].
    pub fn from_file(file: File, limit: u64) -> io::Result<Self> {
        let map = QuotaMap::map(file, false)?;
        map.word(0).store(limit, Ordering::Release);
        Ok(Self {
            taken: Arc::new(Mutex::new(vec![false; map.slots()])),
            map: Arc::new(map),
        })
    }

    /// The file's descriptor (to keep it for the next daemon).
    pub fn fd(&self) -> RawFd {
        self.map.file.as_raw_fd()
    }

    /// Slot `index` for a worker that already uses it (one taken over after a restart): its
    /// words are left as they are. `None` if there is no such slot or it is taken.
    pub fn claim(&self, index: usize) -> Option<SlotLease> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let t = taken.get_mut(index)?;
        if *t {
            return None;
        }
        *t = true;
        Some(SlotLease {
            claim: Arc::new(SlotClaim {
                map: self.map.clone(),
                taken: self.taken.clone(),
                index,
            }),
        })
    }

    /// The limit in bytes; `None`: none.
    pub fn limit(&self) -> Option<u64> {
        Some(self.map.limit()).filter(|&l| l != NO_LIMIT)
    }

    /// Bytes the VM's workers have allocated now.
    pub fn used(&self) -> u64 {
        self.map.used()
    }

    /// A free slot for a new worker; `None` if every slot is taken.
    pub fn lease(&self) -> Option<SlotLease> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let index = taken.iter().position(|t| !t)?;
        taken[index] = true;
        for which in 0..SLOT_WORDS {
            self.map.slot_word(index, which).store(0, Ordering::Release);
        }
        Some(SlotLease {
            claim: Arc::new(SlotClaim {
                map: self.map.clone(),
                taken: self.taken.clone(),
                index,
            }),
        })
    }
}

/// A slot taken; it is free again when the last lease or usage of it is dropped.
#[derive(Debug)]
struct SlotClaim {
    map: Arc<QuotaMap>,
    taken: Arc<Mutex<Vec<bool>>>,
    index: usize,
}

impl Drop for SlotClaim {
    fn drop(&mut self) {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        taken[self.index] = false;
    }
}

/// A slot given to one worker. Dropping it (after the worker is reaped) clears the slot's
/// bytes held: the worker's memory no longer counts. Its other counts stay readable through
/// its [`SlotUsage`] until that is dropped too.
#[derive(Debug)]
pub struct SlotLease {
    claim: Arc<SlotClaim>,
}

impl SlotLease {
    /// The slot's index (`--gpu-memory-slot`).
    pub fn index(&self) -> usize {
        self.claim.index
    }

    /// The quota file, for the worker's [`QUOTA_FD`].
    pub fn fd(&self) -> RawFd {
        self.claim.map.file.as_raw_fd()
    }

    /// A reader of the slot's counts, which keeps the slot from being given to another worker
    /// while it lives.
    pub fn usage(&self) -> SlotUsage {
        SlotUsage {
            claim: self.claim.clone(),
        }
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        let c = &self.claim;
        c.map.slot_word(c.index, HELD).store(0, Ordering::Release);
    }
}

/// What one worker's slot says now.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WorkerUsage {
    /// Bytes of device memory held.
    pub memory: u64,
    /// The most bytes held at once.
    pub peak_memory: u64,
    /// Kernels launched.
    pub kernels: u64,
    /// Graphs launched.
    pub graph_launches: u64,
    /// ns the GPU was busy with the worker's work, while a GPU timeline was recorded.
    pub gpu_busy_ns: u64,
    /// ns of recording `gpu_busy_ns` was measured over.
    pub gpu_traced_ns: u64,
}

/// The daemon's reader of one worker's slot.
#[derive(Debug)]
pub struct SlotUsage {
    claim: Arc<SlotClaim>,
}

impl SlotUsage {
    /// The slot's counts now.
    pub fn read(&self) -> WorkerUsage {
        let word = |w| {
            self.claim
                .map
                .slot_word(self.claim.index, w)
                .load(Ordering::Acquire)
        };
        WorkerUsage {
            memory: word(HELD),
            peak_memory: word(PEAK),
            kernels: word(KERNELS),
            graph_launches: word(GRAPHS),
            gpu_busy_ns: word(GPU_BUSY),
            gpu_traced_ns: word(GPU_TRACED),
        }
    }
}

/// A worker's side: its slot of its VM's quota.
#[derive(Debug)]
pub struct QuotaSlot {
    map: QuotaMap,
    index: usize,
}

impl QuotaSlot {
    /// Maps the quota `file` and takes slot `index` of it.
    pub fn attach(file: File, index: usize) -> io::Result<Self> {
        let map = QuotaMap::map(file, false)?;
        if index >= map.slots() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {index} of {}", map.slots()),
            ));
        }
        Ok(Self { map, index })
    }

    /// The worker's quota from [`QUOTA_FD`].
    ///
    /// # Safety
    /// [`QUOTA_FD`] must be the quota file the daemon passed and owned by nobody else.
    pub unsafe fn from_inherited_fd(index: usize) -> io::Result<Self> {
        // SAFETY: the caller guarantees that the descriptor is the quota file and unowned.
        let file = unsafe { File::from_raw_fd(QUOTA_FD) };
        // Close-on-exec, like every other descriptor of the worker.
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(QUOTA_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
        Self::attach(file, index)
    }

    /// Whether `bytes` more would fit now (a cheap check before asking the driver; the
    /// allocation is admitted by [`QuotaSlot::reserve`]).
    pub fn fits(&self, bytes: u64) -> bool {
        let limit = self.map.limit();
        limit == NO_LIMIT
            || self
                .map
                .used()
                .checked_add(bytes)
                .is_some_and(|t| t <= limit)
    }

    /// Counts `bytes` more for this worker if the VM stays within its limit.
    pub fn reserve(&self, bytes: u64) -> bool {
        // Without a limit there is nothing to admit: only count.
        let _admission = if self.map.limit() == NO_LIMIT {
            None
        } else {
            let Ok(admission) = self.map.admit() else {
                return false;
            };
            if !self.fits(bytes) {
                return false;
            }
            Some(admission)
        };
        let held = self
            .map
            .slot_word(self.index, HELD)
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        self.map
            .slot_word(self.index, PEAK)
            .fetch_max(held, Ordering::AcqRel);
        true
    }

    /// Counts `bytes` less (an allocation freed).
    pub fn release(&self, bytes: u64) {
        let w = self.map.slot_word(self.index, HELD);
        let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(v.saturating_sub(bytes))
        });
    }

    /// Counts one kernel launch the driver accepted.
    pub fn count_kernel(&self) {
        self.map
            .slot_word(self.index, KERNELS)
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one graph launch the driver accepted.
    pub fn count_graph_launch(&self) {
        self.map
            .slot_word(self.index, GRAPHS)
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `busy` ns of GPU work over `traced` ns of recording (the GPU timeline).
    pub fn count_gpu_time(&self, busy: u64, traced: u64) {
        self.map
            .slot_word(self.index, GPU_BUSY)
            .fetch_add(busy, Ordering::Relaxed);
        self.map
            .slot_word(self.index, GPU_TRACED)
            .fetch_add(traced, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(fd: RawFd) -> File {
        // SAFETY: dup of an open descriptor returns a new one we own.
        let d = unsafe { libc::dup(fd) };
        assert!(d >= 0);
        // SAFETY: `d` is fresh.
        unsafe { File::from_raw_fd(d) }
    }

    #[test]
    fn workers_share_one_limit_and_a_lease_clears_its_slot() {
        let q = GpuMemoryQuota::new(1000, 4).unwrap();
        let (a, b) = (q.lease().unwrap(), q.lease().unwrap());
        let wa = QuotaSlot::attach(dup(a.fd()), a.index()).unwrap();
        let wb = QuotaSlot::attach(dup(b.fd()), b.index()).unwrap();
        assert!(wa.reserve(600));
        assert!(!wb.reserve(401));
        assert!(wb.fits(400) && wb.reserve(400));
        assert_eq!(q.used(), 1000);
        assert!(!wa.reserve(1));
        wb.release(100);
        assert!(wa.reserve(100));
        // Worker a "dies": its lease ends, its 700 bytes stop counting.
        drop(a);
        assert_eq!(q.used(), 300);
        assert!(wb.reserve(700));
        assert!(!wb.reserve(u64::MAX));
        wb.release(u64::MAX);
        assert_eq!(q.used(), 0);
    }

    #[test]
    fn without_a_limit_everything_is_counted_and_nothing_refused() {
        let q = GpuMemoryQuota::new(NO_LIMIT, 2).unwrap();
        assert_eq!(q.limit(), None);
        let lease = q.lease().unwrap();
        let usage = lease.usage();
        let w = QuotaSlot::attach(dup(lease.fd()), lease.index()).unwrap();
        assert!(w.reserve(1 << 40) && w.reserve(1 << 40));
        w.release(1 << 40);
        assert!(w.reserve(100));
        w.count_kernel();
        w.count_kernel();
        w.count_graph_launch();
        assert_eq!(q.used(), (1 << 40) + 100);
        let expect = WorkerUsage {
            memory: (1 << 40) + 100,
            peak_memory: 2 << 40,
            kernels: 2,
            graph_launches: 1,
            ..WorkerUsage::default()
        };
        assert_eq!(usage.read(), expect);
        // The worker is reaped: its memory stops counting, its other counts stay readable,
        // and its slot stays taken until the usage is dropped too.
        drop(lease);
        assert_eq!(q.used(), 0);
        assert_eq!(
            usage.read(),
            WorkerUsage {
                memory: 0,
                ..expect
            }
        );
        let other = q.lease().unwrap();
        assert!(q.lease().is_none());
        drop(usage);
        let again = q.lease().unwrap();
        assert_ne!(again.index(), other.index());
        assert_eq!(again.usage().read(), WorkerUsage::default());
    }

    #[test]
    fn slots_run_out_and_come_back() {
        let q = GpuMemoryQuota::new(1, 2).unwrap();
        let a = q.lease().unwrap();
        let _b = q.lease().unwrap();
        assert!(q.lease().is_none());
        let i = a.index();
        drop(a);
        assert_eq!(q.lease().unwrap().index(), i);
        QuotaSlot::attach(dup(_b.fd()), 2).unwrap_err();
    }
}

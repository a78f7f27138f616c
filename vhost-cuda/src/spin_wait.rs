//! Bounded spinning before a blocking wait (`--hop-poll-us`).
//!
//! A request crosses two waits on its way from the vring thread to the GPU and back: the
//! session thread waits on its queue (`session/thread.rs`), and the daemon and the worker wait
//! on the socket between them (`worker/handle.rs`, `worker/child.rs`). Waking a thread that
//! sleeps there costs tens of µs on a virtualised host, several times the CUDA call itself.
//! A waiter that has just answered a request is likely to get the next one soon, so it first
//! checks without blocking for up to a budget, a host core spinning meanwhile, and only then
//! blocks exactly as before. A zero budget blocks at once: no extra check, no clock read.
//!
//! Spinning is also bounded host-wide (`--spin-budget`): at most N threads spin at once, over
//! every vhost-cuda process of the host that joined the budget (daemons and their session
//! workers), so that many busy sessions don't take the cores that the guests' vCPUs need. A
//! thread that finds the budget spent blocks at once, as with a zero budget. The budget is a
//! table of slots in shared memory, each holding the moment its spin ends (CLOCK_MONOTONIC
//! ns): a slot whose moment has passed is free, so a process that dies while spinning leaks
//! nothing for longer than its spin. Where spin bounds itself over a loop of its own (the
//! request queue's `--poll-us`, `vhu_cuda.rs`), it takes a [`SpinSlot`] directly.

use std::{
    ffi::CString,
    hint::spin_loop,
    io,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{Receiver, RecvError, TryRecvError},
        OnceLock,
    },
    time::{Duration, Instant},
};

/// Slots of the shared table: the largest `--spin-budget`.
pub const MAX_SPIN_BUDGET: usize = 512;

/// The name of the host-wide table (POSIX shared memory, `/dev/shm/qcuda-spin-budget`).
const SHARED_NAME: &str = "/qcuda-spin-budget";

/// The budget this process joined; none (unbounded spinning) until [`join_host_budget`].
static BUDGET: OnceLock<SpinBudget> = OnceLock::new();

/// At most `limit` threads spinning at once, over everyone using the same `slots`.
#[derive(Debug)]
pub struct SpinBudget {
    slots: &'static [AtomicU64],
    limit: usize,
}

/// A slot of a [`SpinBudget`] taken until a moment; given back when dropped.
#[derive(Debug)]
pub struct SpinSlot {
    slot: &'static AtomicU64,
    until: u64,
}

/// CLOCK_MONOTONIC in ns: the same clock in every process of the host.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

fn saturating_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl SpinBudget {
    /// A budget of `limit` spinners over `slots` (only the first `limit` are used).
    pub fn new(slots: &'static [AtomicU64], limit: usize) -> Self {
        let limit = limit.min(slots.len());
        Self { slots, limit }
    }

    /// A budget of `limit` spinners for this process alone.
    pub fn private(limit: usize) -> Self {
        let slots: Vec<AtomicU64> = (0..limit.min(MAX_SPIN_BUDGET))
            .map(|_| AtomicU64::new(0))
            .collect();
        Self::new(Vec::leak(slots), limit)
    }

    /// The host-wide budget: the shared table, created if it is not there yet.
    pub fn host_wide(limit: usize) -> io::Result<Self> {
        Ok(Self::new(shared_table()?, limit))
    }

    /// Most threads spinning at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A slot for a spin of `len` from now, if one is free.
    pub fn try_take(&self, len: Duration) -> Option<SpinSlot> {
        let now = monotonic_ns();
        let until = now.saturating_add(saturating_ns(len)).max(1);
        for slot in &self.slots[..self.limit] {
            let held = slot.load(Ordering::Relaxed);
            if held <= now
                && slot
                    .compare_exchange(held, until, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return Some(SpinSlot { slot, until });
            }
        }
        None
    }
}

impl SpinSlot {
    /// Keeps the slot for a spin of `len` from now. False if it was lost meanwhile (this
    /// thread overran its own moment and another took the slot): stop spinning.
    pub fn extend(&mut self, len: Duration) -> bool {
        let until = monotonic_ns().saturating_add(saturating_ns(len)).max(1);
        match self
            .slot
            .compare_exchange(self.until, until, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => {
                self.until = until;
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        // Only if still ours: a slot that expired may have been taken by another spinner.
        let _ = self
            .slot
            .compare_exchange(self.until, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// Maps the host-wide slot table (`MAX_SPIN_BUDGET` slots), creating it if needed.
fn shared_table() -> io::Result<&'static [AtomicU64]> {
    const LEN: usize = MAX_SPIN_BUDGET * std::mem::size_of::<AtomicU64>();
    let name = CString::new(SHARED_NAME).map_err(io::Error::other)?;
    let len = libc::off_t::try_from(LEN).map_err(io::Error::other)?;
    // SAFETY: `name` is a valid C string; the flags and mode are plain values.
    let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // Zero-filled when created or grown; every process sets the same length.
    // SAFETY: `fd` is the descriptor just opened.
    let sized = unsafe { libc::ftruncate(fd, len) };
    let err = (sized != 0).then(io::Error::last_os_error);
    let map = if err.is_none() {
        // SAFETY: a new shared mapping of `LEN` bytes of `fd`, at an address of the kernel's
        // choosing; it is never unmapped (the table lives as long as the process).
        unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        }
    } else {
        libc::MAP_FAILED
    };
    let err = err.or_else(|| (map == libc::MAP_FAILED).then(io::Error::last_os_error));
    // SAFETY: `fd` is ours; the mapping keeps the memory.
    unsafe { libc::close(fd) };
    if let Some(e) = err {
        return Err(e);
    }
    // SAFETY: The mapping is `LEN` bytes, page-aligned, readable and writable, and lives for
    // the rest of the process; `AtomicU64` has the layout of `u64`, every bit pattern is
    // valid, and other processes touch it only through atomics too.
    Ok(unsafe { std::slice::from_raw_parts(map.cast::<AtomicU64>(), MAX_SPIN_BUDGET) })
}

/// Joins the host-wide budget of `limit` spinners (see the module's doc); where the shared
/// table cannot be had (another user's, no /dev/shm), a budget of this process alone, and the
/// error says why. Only the first call counts.
pub fn join_host_budget(limit: usize) -> io::Result<()> {
    let (budget, result) = match SpinBudget::host_wide(limit) {
        Ok(b) => (b, Ok(())),
        Err(e) => (SpinBudget::private(limit), Err(e)),
    };
    let _ = BUDGET.set(budget);
    result
}

/// A slot of the joined budget for a spin of `len`: always one (`Some(None)`) where the process
/// joined none, `None` when the budget is spent.
pub fn take_slot(len: Duration) -> Option<Option<SpinSlot>> {
    match BUDGET.get() {
        None => Some(None),
        Some(b) => b.try_take(len).map(Some),
    }
}

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
    let slot = if budget.is_zero() {
        None
    } else {
        take_slot(budget)
    };
    if let (Some(end), Some(_slot)) = (deadline(budget), slot) {
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

/// Calls `check` again and again until it gives `Some` or `budget` has passed (with a slot of
/// the host-wide budget; none free, or a zero budget: one call only). `check` should be cheap
/// (a few atomic loads); the clock is read every [`CHECKS_PER_CLOCK_READ`] calls.
pub fn spin_until<T>(budget: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    if let Some(found) = check() {
        return Some(found);
    }
    let end = deadline(budget)?;
    let _slot = take_slot(budget)?;
    let mut until_clock = CHECKS_PER_CLOCK_READ;
    loop {
        spin_loop();
        if let Some(found) = check() {
            return Some(found);
        }
        until_clock -= 1;
        if until_clock == 0 {
            if Instant::now() >= end {
                return None;
            }
            until_clock = CHECKS_PER_CLOCK_READ;
        }
    }
}

/// `poll(fds, 0)` again and again until an entry is ready or `budget` has passed. Returns
/// poll's count of ready entries, with their `revents` set; 0 when the budget ran out first
/// (at once for a zero budget, without a call). An interrupted poll counts as nothing ready.
pub fn poll(fds: &mut [libc::pollfd], budget: Duration) -> io::Result<usize> {
    let Some(end) = deadline(budget) else {
        return Ok(0);
    };
    let Some(_slot) = take_slot(budget) else {
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
    fn a_budget_lets_only_its_limit_spin_at_once() {
        let b = SpinBudget::private(2);
        let long = Duration::from_secs(60);
        let first = b.try_take(long).unwrap();
        let mut second = b.try_take(long).unwrap();
        assert!(b.try_take(long).is_none());
        drop(first);
        let third = b.try_take(long).unwrap();
        assert!(b.try_take(long).is_none());
        assert!(second.extend(long));
        drop((second, third));
        assert!(b.try_take(long).is_some());
        assert!(SpinBudget::private(0).try_take(long).is_none());
    }

    #[test]
    fn a_slot_frees_itself_when_its_spin_is_over() {
        // A holder that died, or overran: its slot is free after its moment.
        let b = SpinBudget::private(1);
        let stale = b.try_take(Duration::from_millis(2)).unwrap();
        assert!(b.try_take(Duration::from_secs(60)).is_none());
        thread::sleep(Duration::from_millis(5));
        let mut stale = std::mem::ManuallyDrop::new(stale);
        let fresh = b.try_take(Duration::from_secs(60)).unwrap();
        // The late holder neither keeps nor frees what is now another's.
        assert!(!stale.extend(Duration::from_secs(60)));
        // SAFETY: dropped once, here.
        unsafe { std::mem::ManuallyDrop::drop(&mut stale) };
        assert!(b.try_take(Duration::from_secs(60)).is_none());
        drop(fresh);
        assert!(b.try_take(Duration::from_secs(60)).is_some());
    }

    #[test]
    fn two_processes_share_the_host_table() {
        // Two mappings of the shared table are one table (a second process maps it the same
        // way). Uses a slot far up the table, which real budgets (a handful) do not reach.
        let (a, b) = (shared_table().unwrap(), shared_table().unwrap());
        assert_ne!(a.as_ptr(), b.as_ptr());
        // A slot of its own per test process, so that test runs side by side don't collide.
        let at = 256 + std::process::id() as usize % 256;
        let (a, b) = (SpinBudget::new(&a[at..], 1), SpinBudget::new(&b[at..], 1));
        let held = a.try_take(Duration::from_secs(60)).unwrap();
        assert!(b.try_take(Duration::from_secs(60)).is_none());
        drop(held);
        assert!(b.try_take(Duration::from_secs(60)).is_some());
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

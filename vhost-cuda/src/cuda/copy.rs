//! Copies between guest RAM and device memory.
//!
//! A guest buffer is a list of host runs (guest RAM is mapped into this process). Long runs are
//! copied by the driver straight from or to guest memory. Short runs, the common case when the
//! guest kernel module pinned a user buffer page by page, would cost one driver call each, so
//! they are gathered into (or scattered from) a pinned staging buffer of two halves: while the
//! DMA of one half runs, the CPU fills or drains the other. An event per half says when it is
//! free again. Every copy ends by synchronising its stream, so guest memory is never touched
//! after the op has answered.
//!
//! One CPU copies guest pages (4 KiB runs, scattered) at about 7 GB/s on the H100 host, which
//! made the worker the bottleneck of pageable copies (docs/perf). A half of at least
//! [`PARALLEL_MIN`] bytes is therefore gathered or scattered by up to [`COPY_THREADS`] threads
//! of a small pool, each taking an equal share of its bytes.

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use tracing::debug;
use vm_memory::VolatileSlice;

use super::driver::{CuError, CuResult, DriverApi, Event, Raw, Stream};
use crate::guest_buffer::{BufferError, GuestBuffer};

/// CU_EVENT_DISABLE_TIMING: the staging events only order, they never time.
const EVENT_DISABLE_TIMING: u32 = 2;

/// A contiguous stretch of host memory (inside guest RAM, or pinned staging).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostRun {
    /// Host address.
    pub(crate) addr: usize,
    /// Bytes.
    pub(crate) len: usize,
}

/// The host runs of `buf`, in buffer order.
///
/// The addresses stay valid while `buf` lives: it holds the memory map they point into.
pub(crate) fn host_runs(buf: &GuestBuffer) -> Result<Vec<HostRun>, BufferError> {
    let mut runs = Vec::with_capacity(buf.runs().len());
    buf.for_each_slice(0, buf.len(), |_, s| {
        runs.push(HostRun {
            addr: s.ptr_guard_mut().as_ptr() as usize,
            len: s.len(),
        });
        Ok::<(), ()>(())
    })?
    .map_err(|()| BufferError::OutOfBounds {
        offset: 0,
        len: buf.len(),
        size: buf.len(),
    })?;
    Ok(runs)
}

/// One step of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Copy `run` straight to or from device offset `dev_off`.
    Direct {
        /// The guest run.
        run: HostRun,
        /// Offset from the start of the device range.
        dev_off: u64,
    },
    /// Copy `len` bytes at device offset `dev_off` through one staging half; `segs` are the
    /// guest runs (or parts of runs) that make up those bytes, in order.
    Staged {
        /// Offset from the start of the device range.
        dev_off: u64,
        /// Bytes (at most the half size).
        len: usize,
        /// Where the bytes live in guest memory.
        segs: Vec<HostRun>,
    },
}

/// A copy of at most this many bytes, in at most [`SMALL_COPY_RUNS`] runs, goes straight
/// through the driver run by run: for a few bytes that costs one driver call, where the staging
/// buffer costs an event wait, a gather, a DMA of its own and an event record (a 4-byte copy
/// took the worker 21 µs that way on the H100 host, against 5.5 µs for the whole native call).
pub(crate) const SMALL_COPY: usize = 64 << 10;
/// See [`SMALL_COPY`]: a bounce buffer of qcuda.ko is one run.
pub(crate) const SMALL_COPY_RUNS: usize = 4;

/// A copy of at most this many bytes goes through the driver's pageable path even where its
/// guest RAM could be registered (`ram_registry.rs`): the driver moves a few bytes with the
/// command that copies them, where registered memory costs a DMA of its own (on the H100 host
/// the worker took 12.9 µs for a 4-byte copy to the device from registered guest RAM, against
/// 5.5 µs for the whole native `cudaMemcpy`).
pub(crate) const TINY_COPY: usize = 4096;

/// Whether a copy of `runs` is small enough to go direct whatever its runs' lengths.
pub(crate) fn is_small(runs: &[HostRun]) -> bool {
    runs.len() <= SMALL_COPY_RUNS && runs.iter().map(|r| r.len).sum::<usize>() <= SMALL_COPY
}

/// Splits a copy of `runs` into steps: runs of at least `direct_min` bytes go direct, the
/// others are packed into staged steps of at most `half` bytes. `half == 0` (no staging
/// buffer) sends everything direct.
pub(crate) fn plan(runs: &[HostRun], half: usize, direct_min: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut open: Option<(u64, usize, Vec<HostRun>)> = None;
    let mut pos = 0u64;
    for &run in runs {
        if half == 0 || run.len >= direct_min {
            if let Some((dev_off, len, segs)) = open.take() {
                steps.push(Step::Staged { dev_off, len, segs });
            }
            steps.push(Step::Direct { run, dev_off: pos });
            pos += run.len as u64;
            continue;
        }
        let mut rest = run;
        while rest.len > 0 {
            let (_, len, segs) = open.get_or_insert_with(|| (pos, 0, Vec::new()));
            let take = rest.len.min(half - *len);
            segs.push(HostRun {
                addr: rest.addr,
                len: take,
            });
            *len += take;
            pos += take as u64;
            rest.addr += take;
            rest.len -= take;
            if *len == half {
                if let Some((dev_off, len, segs)) = open.take() {
                    steps.push(Step::Staged { dev_off, len, segs });
                }
            }
        }
    }
    if let Some((dev_off, len, segs)) = open {
        steps.push(Step::Staged { dev_off, len, segs });
    }
    steps
}

/// The pinned staging buffer of one session on one device: two halves and an event each.
///
/// # Invariants
/// `base` points at `2 * half` bytes of pinned memory owned by the context that owns the
/// events. While `pending[i]`, a DMA may be using half `i`.
#[derive(Debug)]
pub(crate) struct Staging {
    base: Raw,
    half: usize,
    events: [Event; 2],
    pending: [bool; 2],
}

/// Why [`Staging::stream_device`] stopped: the driver, or the sink.
#[derive(Debug)]
pub(crate) enum SinkError<E> {
    /// A copy or an event failed.
    Cuda(CuError),
    /// The sink refused a chunk.
    Sink(E),
}

impl Staging {
    /// Allocates the buffer and its events in the current context. On failure whatever was
    /// made is left to the context (destroying it frees pinned memory and events alike).
    pub(crate) fn create(drv: &dyn DriverApi, half: usize) -> CuResult<Self> {
        let bytes = half.checked_mul(2).ok_or(CuError::INVALID_VALUE)?;
        let base = drv.mem_alloc_host(bytes)?;
        let events = [
            drv.event_create(EVENT_DISABLE_TIMING)?,
            drv.event_create(EVENT_DISABLE_TIMING)?,
        ];
        Ok(Self {
            base,
            half,
            events,
            pending: [false; 2],
        })
    }

    /// Bytes per half.
    pub(crate) fn half(&self) -> usize {
        self.half
    }

    fn half_ptr(&self, i: usize) -> *mut u8 {
        (self.base + i * self.half) as *mut u8
    }

    /// Waits until no DMA uses half `i`.
    fn wait(&mut self, drv: &dyn DriverApi, i: usize) -> CuResult<()> {
        if self.pending[i] {
            drv.event_synchronize(self.events[i])?;
            self.pending[i] = false;
        }
        Ok(())
    }

    /// Marks half `i` busy until the work queued so far on `stream` is done.
    fn mark(&mut self, drv: &dyn DriverApi, i: usize, stream: Stream) -> CuResult<()> {
        self.pending[i] = true;
        drv.event_record(self.events[i], stream)
    }

    /// The first `len` bytes of half `i`. Call only after `wait(i)`, so no DMA uses them.
    ///
    /// Volatile, like guest memory: pinned memory is also mapped into the session's GPU
    /// address space, so no Rust reference to it is ever made.
    fn half_slice(&mut self, i: usize, len: usize) -> VolatileSlice<'_> {
        // SAFETY: half `i` is `half` bytes of pinned memory owned by this staging buffer
        // (invariant) and `len` is capped at `half`; the slice borrows `self` mutably, so the
        // memory stays allocated while it lives.
        unsafe { VolatileSlice::new(self.half_ptr(i), len.min(self.half)) }
    }
}

impl Staging {
    /// Copies `out.len()` bytes of device memory at `src` into `out` through the two halves:
    /// the DMA of one chunk into a half runs while the previous chunk is copied out of the
    /// other (pinned memory copies at the link's speed; `out` may be pageable). Every DMA is
    /// waited for before this returns, also on an error.
    pub(crate) fn read_device(
        &mut self,
        drv: &dyn DriverApi,
        src: u64,
        out: &mut [u8],
        stream: Stream,
    ) -> CuResult<()> {
        let result = self.read_chunks(drv, src, out, stream);
        let drained = self.wait(drv, 0).and(self.wait(drv, 1));
        result.and(drained)
    }

    fn read_chunks(
        &mut self,
        drv: &dyn DriverApi,
        src: u64,
        out: &mut [u8],
        stream: Stream,
    ) -> CuResult<()> {
        let half = self.half.max(1);
        // The chunk in flight: (half, offset in `out`, length).
        let mut prev: Option<(usize, usize, usize)> = None;
        for (k, at) in (0..out.len()).step_by(half).enumerate() {
            let (i, len) = (k % 2, half.min(out.len() - at));
            self.wait(drv, i)?;
            // SAFETY: half `i` is `half` >= `len` bytes of pinned memory owned by `self`, no
            // DMA uses it (waited above), and it is not read until its event is waited for.
            unsafe { drv.memcpy_dtoh(self.half_ptr(i), src + at as u64, len, stream)? };
            self.mark(drv, i, stream)?;
            if let Some((j, pat, plen)) = prev {
                self.copy_out(drv, j, &mut out[pat..pat + plen])?;
            }
            prev = Some((i, at, len));
        }
        if let Some((j, pat, plen)) = prev {
            self.copy_out(drv, j, &mut out[pat..pat + plen])?;
        }
        Ok(())
    }

    /// Hands `len` bytes of device memory at `src` to `sink` chunk by chunk, through the two
    /// halves: the DMA of chunk n+1 into one half runs while `sink` takes chunk n from the
    /// other, straight out of pinned memory (a migration's saved state written into its file
    /// as it is read, never held whole). Every DMA is waited for before this returns, also on
    /// an error; `sink`'s first error ends it.
    pub(crate) fn stream_device<E>(
        &mut self,
        drv: &dyn DriverApi,
        src: u64,
        len: usize,
        stream: Stream,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), SinkError<E>> {
        let result = self.stream_chunks(drv, src, len, stream, sink);
        let drained = self
            .wait(drv, 0)
            .and(self.wait(drv, 1))
            .map_err(SinkError::Cuda);
        result.and(drained)
    }

    fn stream_chunks<E>(
        &mut self,
        drv: &dyn DriverApi,
        src: u64,
        len: usize,
        stream: Stream,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), SinkError<E>> {
        let half = self.half.max(1);
        let mut prev: Option<(usize, usize)> = None;
        for (k, at) in (0..len).step_by(half).enumerate() {
            let (i, n) = (k % 2, half.min(len - at));
            self.wait(drv, i).map_err(SinkError::Cuda)?;
            // SAFETY: half `i` is `half` >= `n` bytes of pinned memory owned by `self`, no DMA
            // uses it (waited above), and it is not read until its event is waited for.
            unsafe { drv.memcpy_dtoh(self.half_ptr(i), src + at as u64, n, stream) }
                .map_err(SinkError::Cuda)?;
            self.mark(drv, i, stream).map_err(SinkError::Cuda)?;
            if let Some((j, plen)) = prev {
                self.hand_out(drv, j, plen, sink)?;
            }
            prev = Some((i, n));
        }
        if let Some((j, plen)) = prev {
            self.hand_out(drv, j, plen, sink)?;
        }
        Ok(())
    }

    /// Waits for half `i`'s DMA, then hands its first `len` bytes to `sink`.
    fn hand_out<E>(
        &mut self,
        drv: &dyn DriverApi,
        i: usize,
        len: usize,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), SinkError<E>> {
        self.wait(drv, i).map_err(SinkError::Cuda)?;
        // SAFETY: half `i` is `half` >= `len` bytes of pinned memory owned by `self`; its DMA
        // has completed (waited above) and none is queued into it until `sink` returns, so
        // nothing writes it while the slice lives.
        let chunk = unsafe { std::slice::from_raw_parts(self.half_ptr(i), len.min(self.half)) };
        sink(chunk).map_err(SinkError::Sink)
    }

    /// Waits for half `i`'s DMA, then copies its first `out.len()` bytes into `out`.
    fn copy_out(&mut self, drv: &dyn DriverApi, i: usize, out: &mut [u8]) -> CuResult<()> {
        self.wait(drv, i)?;
        self.half_slice(i, out.len()).copy_to(out);
        Ok(())
    }

    /// Copies `bytes` to device memory at `dst` through the two halves: one chunk is copied
    /// into a half while the DMA of the previous one runs from the other. Every DMA is waited
    /// for before this returns, also on an error.
    pub(crate) fn write_device(
        &mut self,
        drv: &dyn DriverApi,
        dst: u64,
        bytes: &[u8],
        stream: Stream,
    ) -> CuResult<()> {
        let result = self.write_chunks(drv, dst, bytes, stream);
        let drained = self.wait(drv, 0).and(self.wait(drv, 1));
        result.and(drained)
    }

    fn write_chunks(
        &mut self,
        drv: &dyn DriverApi,
        dst: u64,
        bytes: &[u8],
        stream: Stream,
    ) -> CuResult<()> {
        let half = self.half.max(1);
        for (k, chunk) in bytes.chunks(half).enumerate() {
            let i = k % 2;
            self.wait(drv, i)?;
            self.half_slice(i, chunk.len()).copy_from(chunk);
            let at = (k * half) as u64;
            // SAFETY: half `i` holds `chunk.len()` bytes just written, and is not written
            // again until its event is waited for.
            unsafe { drv.memcpy_htod(dst + at, self.half_ptr(i), chunk.len(), stream)? };
            self.mark(drv, i, stream)?;
        }
        Ok(())
    }
}

/// Threads that gather or scatter one staging half at most.
pub(crate) const COPY_THREADS: usize = 4;
/// Halves smaller than this are copied by the calling thread alone; a thread's share is at
/// least a quarter of it.
pub(crate) const PARALLEL_MIN: usize = 1 << 20;

/// The copy threads, made at the first large copy; `None` if they cannot be made (then
/// every copy runs on the calling thread).
fn copy_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(COPY_THREADS)
            .thread_name(|i| format!("qcuda-copy-{i}"))
            .build()
            .map_err(|e| debug!(error = %e, "no copy threads; copying on one"))
            .ok()
    })
    .as_ref()
}

/// One piece of a gather or scatter: `len` bytes from `from` to `to`, host addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) len: usize,
}

/// The pieces that move the guest runs `segs` to or from the contiguous staging bytes at
/// `staging` (`to_staging`: gather), in order, after checking that they fit in `room` bytes.
fn pieces(segs: &[HostRun], staging: usize, room: usize, to_staging: bool) -> CuResult<Vec<Piece>> {
    let mut at = 0usize;
    let mut out = Vec::with_capacity(segs.len());
    for seg in segs {
        let end = at
            .checked_add(seg.len)
            .filter(|&e| e <= room)
            .ok_or(CuError::INVALID_VALUE)?;
        let (from, to) = if to_staging {
            (seg.addr, staging + at)
        } else {
            (staging + at, seg.addr)
        };
        out.push(Piece {
            from,
            to,
            len: seg.len,
        });
        at = end;
    }
    Ok(out)
}

/// Cuts `pieces` into `parts` lists of about equal bytes (pieces split where needed), in order.
pub(crate) fn split(pieces: &[Piece], parts: usize) -> Vec<Vec<Piece>> {
    let total: usize = pieces.iter().map(|p| p.len).sum();
    let parts = parts.max(1);
    let share = total.div_ceil(parts).max(1);
    let mut out: Vec<Vec<Piece>> = vec![Vec::new()];
    let mut room = share;
    for &p in pieces {
        let mut rest = p;
        while rest.len > 0 {
            if room == 0 {
                out.push(Vec::new());
                room = share;
            }
            let take = rest.len.min(room);
            if let Some(last) = out.last_mut() {
                last.push(Piece { len: take, ..rest });
            }
            rest.from += take;
            rest.to += take;
            rest.len -= take;
            room -= take;
        }
    }
    out
}

/// Copies every piece of `list`.
///
/// # Safety
/// Each piece's source must be readable and its destination writable for its length, no
/// destination may overlap a source, and destinations outside guest RAM must not overlap each
/// other or be written by anyone else meanwhile (a staging half no DMA uses).
unsafe fn copy_pieces(list: &[Piece]) {
    for p in list {
        // SAFETY: the caller's contract. Guest memory is shared with the guest, which may
        // change it meanwhile; like vm-memory's volatile slice copies, bytes are only moved,
        // never interpreted.
        unsafe { std::ptr::copy_nonoverlapping(p.from as *const u8, p.to as *mut u8, p.len) };
    }
}

/// Copies `pieces` (`total` bytes), in parallel when that is worth it.
///
/// # Safety
/// As for [`copy_pieces`].
unsafe fn copy_all(pieces: &[Piece], total: usize) {
    match copy_pool() {
        Some(pool) if total >= PARALLEL_MIN => {
            let parts = split(pieces, COPY_THREADS);
            pool.scope(|s| {
                for part in &parts {
                    // SAFETY: the parts are disjoint pieces of the caller's list, so its
                    // contract holds for each; the scope ends only when all are copied.
                    s.spawn(move |_| unsafe { copy_pieces(part) });
                }
            });
        }
        // SAFETY: the caller's contract.
        _ => unsafe { copy_pieces(pieces) },
    }
}

/// Copies the guest runs `segs` into `half`, in order.
fn gather(segs: &[HostRun], half: VolatileSlice<'_>) -> CuResult<()> {
    let base = half.ptr_guard_mut().as_ptr() as usize;
    let list = pieces(segs, base, half.len(), true)?;
    // SAFETY: the sources are runs of guest RAM from `host_runs`, mapped for as long as the
    // request that holds its buffer (which outlives every copy of the op); the destination is
    // the staging half, exclusively borrowed, with room checked by `pieces`; staging memory
    // is not guest memory, so they do not overlap.
    unsafe { copy_all(&list, half.len()) };
    Ok(())
}

/// Copies `half` out to the guest runs `segs`, in order.
fn scatter(half: VolatileSlice<'_>, segs: &[HostRun]) -> CuResult<()> {
    let base = half.ptr_guard_mut().as_ptr() as usize;
    let list = pieces(segs, base, half.len(), false)?;
    // SAFETY: as in `gather`, the other way round: the guest runs were offered for writing.
    // A guest may name one page twice; then two copy threads may write it at once, as its own
    // vCPUs may at any time: guest RAM is shared memory the host only moves bytes in, and
    // the outcome concerns only the guest's own bytes, never memory outside guest RAM.
    unsafe { copy_all(&list, half.len()) };
    Ok(())
}

fn device_addr(base: u64, off: u64) -> CuResult<u64> {
    base.checked_add(off).ok_or(CuError::INVALID_VALUE)
}

/// Ends a copy: synchronises `stream` (so no DMA touches guest memory after the op answers
/// and the staging halves are free) and returns the first error.
fn finish(
    drv: &dyn DriverApi,
    staging: Option<&mut Staging>,
    stream: Stream,
    body: CuResult<()>,
) -> CuResult<()> {
    let synced = drv.stream_synchronize(stream);
    if synced.is_ok() {
        if let Some(st) = staging {
            st.pending = [false; 2];
        }
    } else if body.is_ok() {
        debug!(error = ?synced, "copy finished but its stream did not synchronise");
    }
    body.and(synced)
}

/// Where one copy's time went, logged at debug level (`--log-level vhost_cuda::cuda::copy=debug`):
/// the CPU gathering or scattering staged steps, waiting for staging halves and the stream,
/// and the driver calls that queue the DMAs.
/// Off (no clock read at all) unless that level is enabled.
#[derive(Debug)]
struct Profile {
    started: Option<Instant>,
    cpu: Duration,
    waits: Duration,
    queue: Duration,
}

impl Profile {
    fn new() -> Self {
        Self {
            started: tracing::enabled!(tracing::Level::DEBUG).then(Instant::now),
            cpu: Duration::ZERO,
            waits: Duration::ZERO,
            queue: Duration::ZERO,
        }
    }

    /// Runs `f`, adding its time to the field `pick` chooses when profiling.
    fn time<T>(&mut self, pick: fn(&mut Self) -> &mut Duration, f: impl FnOnce() -> T) -> T {
        if self.started.is_none() {
            return f();
        }
        let t = Instant::now();
        let r = f();
        *pick(self) += t.elapsed();
        r
    }

    fn log(&self, what: &str, steps: &[Step]) {
        let Some(started) = self.started else { return };
        let bytes: usize = steps
            .iter()
            .map(|s| match s {
                Step::Direct { run, .. } => run.len,
                Step::Staged { len, .. } => *len,
            })
            .sum();
        debug!(
            what,
            bytes,
            steps = steps.len(),
            total_us = started.elapsed().as_micros(),
            cpu_us = self.cpu.as_micros(),
            waits_us = self.waits.as_micros(),
            queue_us = self.queue.as_micros(),
            "copy profile"
        );
    }
}

/// Host to device: copies the guest bytes described by `steps` to device address `dst`.
pub(crate) fn to_device(
    drv: &dyn DriverApi,
    mut staging: Option<&mut Staging>,
    dst: u64,
    steps: &[Step],
    stream: Stream,
) -> CuResult<()> {
    let mut p = Profile::new();
    let body = (|| {
        let mut next = 0usize;
        for step in steps {
            match step {
                Step::Direct { run, dev_off } => {
                    p.time(
                        |p| &mut p.queue,
                        // SAFETY: the run is guest RAM kept mapped by the request (see
                        // `gather`); the stream is synchronised before the op answers.
                        || unsafe {
                            drv.memcpy_htod(
                                device_addr(dst, *dev_off)?,
                                run.addr as *const u8,
                                run.len,
                                stream,
                            )
                        },
                    )?;
                }
                Step::Staged { dev_off, len, segs } => {
                    let st = staging.as_deref_mut().ok_or(CuError::INVALID_VALUE)?;
                    p.time(|p| &mut p.waits, || st.wait(drv, next))?;
                    p.time(|p| &mut p.cpu, || gather(segs, st.half_slice(next, *len)))?;
                    let src = st.half_ptr(next);
                    p.time(
                        |p| &mut p.queue,
                        // SAFETY: `src` is the staging half just filled; it stays untouched
                        // until its event (recorded next) completes.
                        || unsafe {
                            drv.memcpy_htod(device_addr(dst, *dev_off)?, src, *len, stream)
                        },
                    )?;
                    st.mark(drv, next, stream)?;
                    next ^= 1;
                }
            }
        }
        Ok(())
    })();
    let r = p.time(|p| &mut p.waits, || finish(drv, staging, stream, body));
    p.log("host to device", steps);
    r
}

/// Device to host: copies from device address `src` into the guest bytes described by
/// `steps`.
pub(crate) fn from_device(
    drv: &dyn DriverApi,
    mut staging: Option<&mut Staging>,
    src: u64,
    steps: &[Step],
    stream: Stream,
) -> CuResult<()> {
    let mut p = Profile::new();
    let body = (|| {
        // The staged step whose DMA is (or was) running in each half, waiting to be scattered.
        let mut inflight: [Option<&[HostRun]>; 2] = [None, None];
        let mut next = 0usize;
        let drain =
            |p: &mut Profile, st: &mut Staging, i: usize, segs: &[HostRun]| -> CuResult<()> {
                p.time(|p| &mut p.waits, || st.wait(drv, i))?;
                let total = segs.iter().map(|s| s.len).sum::<usize>();
                p.time(|p| &mut p.cpu, || scatter(st.half_slice(i, total), segs))
            };
        for step in steps {
            match step {
                Step::Direct { run, dev_off } => {
                    p.time(
                        |p| &mut p.queue,
                        // SAFETY: the run is guest RAM the guest offered for writing, kept
                        // mapped by the request; the stream is synchronised before the op
                        // answers.
                        || unsafe {
                            drv.memcpy_dtoh(
                                run.addr as *mut u8,
                                device_addr(src, *dev_off)?,
                                run.len,
                                stream,
                            )
                        },
                    )?;
                }
                Step::Staged { dev_off, len, segs } => {
                    let st = staging.as_deref_mut().ok_or(CuError::INVALID_VALUE)?;
                    if let Some(prev) = inflight[next].take() {
                        drain(&mut p, st, next, prev)?;
                    }
                    p.time(|p| &mut p.waits, || st.wait(drv, next))?;
                    let dst = st.half_ptr(next);
                    p.time(
                        |p| &mut p.queue,
                        // SAFETY: `dst` is a free staging half (waited); nothing reads it
                        // until its event, recorded next, completes.
                        || unsafe {
                            drv.memcpy_dtoh(dst, device_addr(src, *dev_off)?, *len, stream)
                        },
                    )?;
                    st.mark(drv, next, stream)?;
                    inflight[next] = Some(segs);
                    next ^= 1;
                }
            }
        }
        // The older half first; order does not matter for correctness.
        for i in [next, next ^ 1] {
            if let Some(segs) = inflight[i].take() {
                let st = staging.as_deref_mut().ok_or(CuError::INVALID_VALUE)?;
                drain(&mut p, st, i, segs)?;
            }
        }
        Ok(())
    })();
    let r = p.time(|p| &mut p.waits, || finish(drv, staging, stream, body));
    p.log("device to host", steps);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_memory_moves_through_both_staging_halves_in_chunks() {
        use crate::cuda::driver::{fake::FakeDriver, NULL_STREAM};
        let drv = FakeDriver::new(1);
        let gpu = drv.device_get(0).unwrap();
        let ctx = drv.ctx_create(gpu).unwrap();
        drv.ctx_set_current(ctx).unwrap();
        // 1000 bytes in halves of 48: 21 chunks, the last one partial.
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3).to_le_bytes()[0]).collect();
        let ptr = drv.mem_alloc(bytes.len()).unwrap();
        let mut staging = Staging::create(&drv, 48).unwrap();
        let (h, d) = (drv.calls("memcpy_htod"), drv.calls("memcpy_dtoh"));
        staging
            .write_device(&drv, ptr, &bytes, NULL_STREAM)
            .unwrap();
        assert_eq!(drv.peek(ptr, bytes.len()), Some(bytes.clone()));
        assert_eq!(drv.calls("memcpy_htod") - h, 21);
        let mut back = vec![0u8; bytes.len()];
        staging
            .read_device(&drv, ptr, &mut back, NULL_STREAM)
            .unwrap();
        assert_eq!(back, bytes);
        assert_eq!(drv.calls("memcpy_dtoh") - d, 21);
        // Nothing left in flight; a read of a part, and of nothing, work as well.
        assert_eq!(staging.pending, [false; 2]);
        let mut part = vec![0u8; 50];
        staging
            .read_device(&drv, ptr + 950, &mut part, NULL_STREAM)
            .unwrap();
        assert_eq!(part, bytes[950..]);
        staging
            .read_device(&drv, ptr, &mut [], NULL_STREAM)
            .unwrap();
        // A copy past the allocation fails, and leaves no DMA pending.
        let mut over = vec![0u8; 100];
        assert!(staging
            .read_device(&drv, ptr + 960, &mut over, NULL_STREAM)
            .is_err());
        assert_eq!(staging.pending, [false; 2]);
    }

    fn run(addr: usize, len: usize) -> HostRun {
        HostRun { addr, len }
    }

    fn total(steps: &[Step]) -> usize {
        steps
            .iter()
            .map(|s| match s {
                Step::Direct { run, .. } => run.len,
                Step::Staged { len, .. } => *len,
            })
            .sum()
    }

    #[test]
    fn long_runs_go_direct_short_runs_are_packed() {
        let runs = [
            run(0x1000, 10),
            run(0x3000, 10),
            run(0x9000, 100),
            run(0x5000, 30),
        ];
        let steps = plan(&runs, 16, 50);
        assert_eq!(
            steps,
            vec![
                Step::Staged {
                    dev_off: 0,
                    len: 16,
                    segs: vec![run(0x1000, 10), run(0x3000, 6)]
                },
                Step::Staged {
                    dev_off: 16,
                    len: 4,
                    segs: vec![run(0x3006, 4)]
                },
                Step::Direct {
                    run: run(0x9000, 100),
                    dev_off: 20
                },
                Step::Staged {
                    dev_off: 120,
                    len: 16,
                    segs: vec![run(0x5000, 16)]
                },
                Step::Staged {
                    dev_off: 136,
                    len: 14,
                    segs: vec![run(0x5010, 14)]
                },
            ]
        );
        assert_eq!(total(&steps), 150);
    }

    #[test]
    fn without_staging_everything_goes_direct() {
        let runs = [run(0x1000, 10), run(0x3000, 10)];
        let steps = plan(&runs, 0, 50);
        assert_eq!(
            steps,
            vec![
                Step::Direct {
                    run: run(0x1000, 10),
                    dev_off: 0
                },
                Step::Direct {
                    run: run(0x3000, 10),
                    dev_off: 10
                },
            ]
        );
        assert!(plan(&[], 16, 50).is_empty());
    }

    #[test]
    fn small_copies_are_a_few_runs_of_a_few_bytes() {
        assert!(is_small(&[run(0x1000, 4)]));
        assert!(is_small(&[run(0x1000, SMALL_COPY)]));
        assert!(!is_small(&[run(0x1000, SMALL_COPY + 1)]));
        let four: Vec<HostRun> = (0..4).map(|i| run(0x1000 * (i + 1), 16)).collect();
        assert!(is_small(&four));
        let five: Vec<HostRun> = (0..5).map(|i| run(0x1000 * (i + 1), 16)).collect();
        assert!(!is_small(&five));
    }

    #[test]
    fn staged_steps_are_contiguous_in_device_space() {
        let runs: Vec<HostRun> = (0..100)
            .map(|i| run(0x10000 * (i + 1), 7 + i % 5))
            .collect();
        let steps = plan(&runs, 64, 1 << 20);
        let mut pos = 0u64;
        for s in &steps {
            match s {
                Step::Staged { dev_off, len, segs } => {
                    assert_eq!(*dev_off, pos);
                    assert!(*len <= 64 && *len > 0);
                    assert_eq!(segs.iter().map(|s| s.len).sum::<usize>(), *len);
                    pos += *len as u64;
                }
                Step::Direct { .. } => unreachable!(),
            }
        }
        assert_eq!(
            usize::try_from(pos).unwrap(),
            runs.iter().map(|r| r.len).sum::<usize>()
        );
    }
}

#[cfg(test)]
mod parallel_tests {
    use super::*;

    fn piece(from: usize, to: usize, len: usize) -> Piece {
        Piece { from, to, len }
    }

    #[test]
    fn split_keeps_every_byte_in_order_in_equal_shares() {
        let list = [piece(0, 1000, 5), piece(100, 1005, 1), piece(200, 1006, 10)];
        let parts = split(&list, 4);
        assert_eq!(parts.len(), 4);
        let flat: Vec<Piece> = parts.iter().flatten().copied().collect();
        // Re-joined, the pieces cover the same bytes in the same order.
        let bytes = |l: &[Piece]| -> Vec<(usize, usize)> {
            l.iter()
                .flat_map(|p| (0..p.len).map(move |i| (p.from + i, p.to + i)))
                .collect()
        };
        assert_eq!(bytes(&flat), bytes(&list));
        let sizes: Vec<usize> = parts
            .iter()
            .map(|p| p.iter().map(|x| x.len).sum())
            .collect();
        assert_eq!(sizes, [4, 4, 4, 4]);
        assert_eq!(split(&[], 4).len(), 1);
        assert_eq!(split(&list, 1).len(), 1);
    }

    /// Scattered 4 KiB "guest" runs, in a shuffled order, `len` bytes in all.
    fn runs_in(guest: &mut [u8], len: usize) -> Vec<HostRun> {
        let base = guest.as_mut_ptr() as usize;
        let pages = guest.len() / 4096;
        let mut order: Vec<usize> = (0..pages).collect();
        // A fixed shuffle (LCG), so the runs are not in address order.
        let mut x = 12345u64;
        for i in (1..order.len()).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let j = usize::try_from(x >> 33).unwrap() % (i + 1);
            order.swap(i, j);
        }
        let mut left = len;
        order
            .into_iter()
            .take(len.div_ceil(4096))
            .map(|p| {
                let l = left.min(4096);
                left -= l;
                run_at(base + p * 4096, l)
            })
            .collect()
    }

    fn run_at(addr: usize, len: usize) -> HostRun {
        HostRun { addr, len }
    }

    #[test]
    fn large_halves_are_gathered_and_scattered_in_parallel_exactly() {
        for len in [PARALLEL_MIN - 4096, PARALLEL_MIN, 3 * PARALLEL_MIN + 123] {
            let mut guest: Vec<u8> = (0..len.next_multiple_of(4096) + 8192)
                .map(|i| u8::try_from(i * 7 % 251).unwrap())
                .collect();
            let runs = runs_in(&mut guest, len);
            let mut half = vec![0u8; len];
            gather(&runs, VolatileSlice::from(&mut half[..])).unwrap();
            let want: Vec<u8> = runs
                .iter()
                .flat_map(|r| {
                    let off = r.addr - guest.as_ptr() as usize;
                    guest[off..off + r.len].to_vec()
                })
                .collect();
            assert_eq!(half, want, "gather of {len}");

            // Back the other way, into a cleared guest.
            let before = guest.clone();
            let mut cleared = vec![0u8; guest.len()];
            let runs = {
                let shift = cleared.as_mut_ptr() as usize;
                runs.iter()
                    .map(|r| run_at(r.addr - guest.as_ptr() as usize + shift, r.len))
                    .collect::<Vec<_>>()
            };
            scatter(VolatileSlice::from(&mut half[..]), &runs).unwrap();
            for r in &runs {
                let off = r.addr - cleared.as_ptr() as usize;
                assert_eq!(
                    cleared[off..off + r.len],
                    before[off..off + r.len],
                    "scatter of {len}"
                );
            }
            // A half too small for its runs is refused.
            let mut small = vec![0u8; len - 1];
            assert!(gather(&runs, VolatileSlice::from(&mut small[..])).is_err());
        }
    }
}

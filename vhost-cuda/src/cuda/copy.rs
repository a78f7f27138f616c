//! Copies between guest RAM and device memory.
//!
//! A guest buffer is a list of host runs (guest RAM is mapped into this process). Long runs are
//! copied by the driver straight from or to guest memory. Short runs, the common case when the
//! guest kernel module pinned a user buffer page by page, would cost one driver call each, so
//! they are gathered into (or scattered from) a pinned staging buffer of two halves: while the
//! DMA of one half runs, the CPU fills or drains the other. An event per half says when it is
//! free again. Every copy ends by synchronising its stream, so guest memory is never touched
//! after the op has answered.

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

/// A run of guest memory as a volatile slice.
fn guest(seg: &HostRun) -> VolatileSlice<'_> {
    // SAFETY: `seg` is a run of guest RAM from `host_runs`, mapped for as long as the request
    // that holds its buffer, which outlives every copy of the op. Guest memory is shared with
    // the guest, hence volatile access (what vm-memory uses for guest memory).
    unsafe { VolatileSlice::new(seg.addr as *mut u8, seg.len) }
}

/// Copies the guest runs `segs` into `half`, in order.
fn gather(segs: &[HostRun], half: VolatileSlice<'_>) -> CuResult<()> {
    let mut at = 0usize;
    for seg in segs {
        let dst = half
            .subslice(at, seg.len)
            .map_err(|_| CuError::INVALID_VALUE)?;
        guest(seg).copy_to_volatile_slice(dst);
        at += seg.len;
    }
    Ok(())
}

/// Copies `half` out to the guest runs `segs`, in order.
fn scatter(half: VolatileSlice<'_>, segs: &[HostRun]) -> CuResult<()> {
    let mut at = 0usize;
    for seg in segs {
        let src = half
            .subslice(at, seg.len)
            .map_err(|_| CuError::INVALID_VALUE)?;
        src.copy_to_volatile_slice(guest(seg));
        at += seg.len;
    }
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

/// Host to device: copies the guest bytes described by `steps` to device address `dst`.
pub(crate) fn to_device(
    drv: &dyn DriverApi,
    mut staging: Option<&mut Staging>,
    dst: u64,
    steps: &[Step],
    stream: Stream,
) -> CuResult<()> {
    let body = (|| {
        let mut next = 0usize;
        for step in steps {
            match step {
                Step::Direct { run, dev_off } => {
                    // SAFETY: the run is guest RAM kept mapped by the request (see `gather`);
                    // the stream is synchronised before the op answers (`finish`).
                    unsafe {
                        drv.memcpy_htod(
                            device_addr(dst, *dev_off)?,
                            run.addr as *const u8,
                            run.len,
                            stream,
                        )
                    }?;
                }
                Step::Staged { dev_off, len, segs } => {
                    let st = staging.as_deref_mut().ok_or(CuError::INVALID_VALUE)?;
                    st.wait(drv, next)?;
                    gather(segs, st.half_slice(next, *len))?;
                    let src = st.half_ptr(next);
                    // SAFETY: `src` is the staging half just filled; it stays untouched until
                    // its event (recorded next) completes.
                    unsafe { drv.memcpy_htod(device_addr(dst, *dev_off)?, src, *len, stream) }?;
                    st.mark(drv, next, stream)?;
                    next ^= 1;
                }
            }
        }
        Ok(())
    })();
    finish(drv, staging, stream, body)
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
    let body = (|| {
        // The staged step whose DMA is (or was) running in each half, waiting to be scattered.
        let mut inflight: [Option<&[HostRun]>; 2] = [None, None];
        let mut next = 0usize;
        let drain = |st: &mut Staging, i: usize, segs: &[HostRun]| -> CuResult<()> {
            st.wait(drv, i)?;
            let total = segs.iter().map(|s| s.len).sum::<usize>();
            scatter(st.half_slice(i, total), segs)
        };
        for step in steps {
            match step {
                Step::Direct { run, dev_off } => {
                    // SAFETY: the run is guest RAM the guest offered for writing, kept mapped
                    // by the request; the stream is synchronised before the op answers.
                    unsafe {
                        drv.memcpy_dtoh(
                            run.addr as *mut u8,
                            device_addr(src, *dev_off)?,
                            run.len,
                            stream,
                        )
                    }?;
                }
                Step::Staged { dev_off, len, segs } => {
                    let st = staging.as_deref_mut().ok_or(CuError::INVALID_VALUE)?;
                    if let Some(prev) = inflight[next].take() {
                        drain(st, next, prev)?;
                    }
                    st.wait(drv, next)?;
                    let dst = st.half_ptr(next);
                    // SAFETY: `dst` is a free staging half (waited); nothing reads it until
                    // its event, recorded next, completes.
                    unsafe { drv.memcpy_dtoh(dst, device_addr(src, *dev_off)?, *len, stream) }?;
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
                drain(st, i, segs)?;
            }
        }
        Ok(())
    })();
    finish(drv, staging, stream, body)
}

#[cfg(test)]
mod tests {
    use super::*;

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

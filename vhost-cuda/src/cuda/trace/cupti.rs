//! CUPTI's activity API in the worker: the host driver's own record of every kernel, copy,
//! memset and synchronisation, with GPU timestamps, through cudarc's `cupti` bindings.
//!
//! libcupti is not part of the driver: it ships with the CUDA toolkit (`extras/CUPTI/lib64`)
//! and the `nvidia-cuda-cupti` wheel. [`load`] opens it by path before the worker's sandbox is
//! built (so that its file is bound into the worker's root with the driver's), once, when the
//! daemon runs with `--gpu-trace auto|cupti`; cudarc's loader then finds the library already
//! loaded under its soname. Nothing of CUPTI runs until a recording is armed: then
//! [`Cupti::open`] registers the buffer callbacks (once per process) and the clock, and
//! [`ActivitySource::enable`] the activity kinds.
//!
//! CUPTI hands full buffers to a callback on a thread of its own. The callback turns each
//! record into an [`Activity`] into a bounded list shared with the worker's thread, which takes
//! them at each collection; what does not fit is counted lost, as are the records CUPTI itself
//! drops for want of a buffer (the worker lends it at most [`MAX_BUFFERS`] of [`BUFFER_SIZE`]).
//! Timestamps are the worker's CLOCK_MONOTONIC: CUPTI is given that clock
//! (`cuptiActivityRegisterTimestampCallback`), or, where it refuses, the offset between its
//! clock and CLOCK_MONOTONIC is measured once.

use std::{
    alloc::Layout,
    collections::HashMap,
    ffi::{c_char, CStr, CString},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicI64, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard, OnceLock,
    },
};

use cudarc::cupti::sys::{self, CUptiResult, CUpti_ActivityKind as Kind};
use qcuda_proto::trace::sync_kind;
use tracing::{debug, warn};

use super::{
    activity::{Activity, ActivitySource, ActivitySpan},
    monotonic_ns,
};

/// Bytes of one buffer lent to CUPTI.
const BUFFER_SIZE: usize = 1 << 20;
/// Most buffers CUPTI holds at once (what it fills beyond that, it drops and counts).
const MAX_BUFFERS: usize = 32;
/// Most activities waiting for the worker to collect them.
const MAX_PENDING: usize = 1 << 20;

/// The activity kinds recorded. Graph launches show as their kernels, copies and memsets
/// (`CUPTI_ACTIVITY_KIND_GRAPH_TRACE` would replace those by one record per graph).
const KINDS: [Kind; 5] = [
    Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    Kind::CUPTI_ACTIVITY_KIND_MEMCPY,
    Kind::CUPTI_ACTIVITY_KIND_MEMSET,
    Kind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
    Kind::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
];

/// Where libcupti is looked for when no path is given: the toolkit's places, then the
/// dynamic loader's path.
const DEFAULT_PLACES: [&str; 4] = [
    "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
    "/usr/local/cuda/lib64/libcupti.so.13",
    "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13",
    "libcupti.so.13",
];

/// The library once [`load`] found it (its path), or why not.
static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Loads libcupti (`path`: the file, or a directory holding `libcupti.so.13`; `None`: the
/// default places), once per process; later calls return the first answer.
pub(crate) fn load(path: Option<&Path>) -> Result<PathBuf, String> {
    LOADED
        .get_or_init(|| {
            let candidates: Vec<PathBuf> = match path {
                Some(p) if p.is_dir() => vec![p.join("libcupti.so.13"), p.join("libcupti.so")],
                Some(p) => vec![p.to_path_buf()],
                None => DEFAULT_PLACES.iter().map(PathBuf::from).collect(),
            };
            let mut tried = Vec::new();
            for c in &candidates {
                let Ok(name) = CString::new(c.as_os_str().as_encoded_bytes()) else {
                    continue;
                };
                // SAFETY: dlopen of a NUL-terminated path; the handle is kept for the
                // process's life (cudarc's loader gets this library by its soname). Loading
                // runs libcupti's initialisers, which start nothing until it is called.
                let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
                if !h.is_null() {
                    // SAFETY: cudarc's check only tries to open the library by name.
                    if unsafe { sys::is_culib_present() } {
                        return Ok(c.clone());
                    }
                    tried.push(format!(
                        "{}: loaded, but not under the name libcupti.so.13",
                        c.display()
                    ));
                    continue;
                }
                // SAFETY: dlerror returns a thread-local C string or null.
                let why = unsafe { libc::dlerror() };
                let why = if why.is_null() {
                    "not found".to_string()
                } else {
                    // SAFETY: non-null from dlerror: a NUL-terminated string.
                    unsafe { CStr::from_ptr(why) }
                        .to_string_lossy()
                        .into_owned()
                };
                tried.push(why);
            }
            Err(format!("libcupti.so.13 not loaded ({})", tried.join("; ")))
        })
        .clone()
}

/// What the callbacks have taken out of CUPTI's buffers for the worker.
#[derive(Debug, Default)]
struct Pending {
    activities: Vec<Activity>,
    /// Activities that did not fit, and buffers CUPTI could not have.
    lost: u64,
    /// Kernel names by CUPTI's pointer (CUPTI keeps one copy of each name).
    names: HashMap<usize, Arc<str>>,
}

fn pending() -> MutexGuard<'static, Pending> {
    static P: OnceLock<Mutex<Pending>> = OnceLock::new();
    P.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Buffers lent to CUPTI now.
static LENT: AtomicUsize = AtomicUsize::new(0);
/// CLOCK_MONOTONIC minus CUPTI's clock, where CUPTI would not take ours.
static CLOCK_OFFSET: AtomicI64 = AtomicI64::new(0);

fn layout() -> Layout {
    // 1 MiB aligned to 8, as CUPTI asks (ACTIVITY_RECORD_ALIGNMENT).
    Layout::from_size_align(BUFFER_SIZE, 8).unwrap_or_else(|_| Layout::new::<u64>())
}

/// CUPTI asks for a buffer.
unsafe extern "C" fn buffer_requested(buf: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let lent = LENT.fetch_add(1, Ordering::AcqRel);
    let ptr = if lent < MAX_BUFFERS {
        // SAFETY: a layout of non-zero size.
        unsafe { std::alloc::alloc(layout()) }
    } else {
        std::ptr::null_mut()
    };
    if ptr.is_null() {
        LENT.fetch_sub(1, Ordering::AcqRel);
        pending().lost += 1;
    }
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *buf = ptr;
        *size = if ptr.is_null() { 0 } else { BUFFER_SIZE };
        *max = 0;
    }
}

/// CUPTI gives a buffer back, `valid` bytes of records in it.
unsafe extern "C" fn buffer_completed(
    _ctx: cudarc::driver::sys::CUcontext,
    _stream: u32,
    buf: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buf.is_null() {
        return;
    }
    {
        let mut p = pending();
        let mut rec: *mut sys::CUpti_Activity = std::ptr::null_mut();
        // SAFETY: `buf` is a buffer CUPTI filled with `valid` bytes of records; it walks it.
        while unsafe { sys::cuptiActivityGetNextRecord(buf, valid, &raw mut rec) }
            == CUptiResult::CUPTI_SUCCESS
        {
            // SAFETY: a record CUPTI returned, which starts with its kind.
            match unsafe { activity_of(rec, &mut p.names) } {
                Some(Taken::Activity(a)) if p.activities.len() < MAX_PENDING => {
                    p.activities.push(a);
                }
                // A full queue, or work a forced flush found running (no times).
                Some(Taken::Activity(_) | Taken::Incomplete) => p.lost += 1,
                None => {}
            }
        }
    }
    // SAFETY: allocated in `buffer_requested` with the same layout, given back once.
    unsafe { std::alloc::dealloc(buf, layout()) };
    LENT.fetch_sub(1, Ordering::AcqRel);
}

/// CLOCK_MONOTONIC for CUPTI's timestamps.
unsafe extern "C" fn timestamp() -> u64 {
    monotonic_ns()
}

fn mono(t: u64) -> u64 {
    t.saturating_add_signed(CLOCK_OFFSET.load(Ordering::Relaxed))
}

fn dim(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// What one CUPTI record gives.
enum Taken {
    Activity(Activity),
    /// A timed record of work that had not ended when a forced flush took its buffer: CUPTI
    /// leaves its times 0.
    Incomplete,
}

/// The activity of one CUPTI record (`None`: a kind not recorded).
///
/// # Safety
/// `rec` points to a whole record of the kind its first field names, as CUPTI 13 lays it out.
unsafe fn activity_of(
    rec: *const sys::CUpti_Activity,
    names: &mut HashMap<usize, Arc<str>>,
) -> Option<Taken> {
    // SAFETY: every record starts with its kind (the caller's promise).
    let kind = unsafe { (*rec).kind };
    let span = |device: u32, stream: u32, correlation: u32, start: u64, end: u64| ActivitySpan {
        device,
        stream: u64::from(stream),
        correlation,
        start: mono(start),
        end: mono(end).max(mono(start)),
    };
    // Times CUPTI did not have (a record a forced flush took before its work ended).
    let untimed = |start: u64, end: u64| start == 0 || end == 0 || end < start;
    Some(Taken::Activity(match kind {
        Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL | Kind::CUPTI_ACTIVITY_KIND_KERNEL => {
            // SAFETY: a kernel record (CUPTI 13's layout; later versions only append fields).
            let k = unsafe { std::ptr::read_unaligned(rec.cast::<sys::CUpti_ActivityKernel10>()) };
            if untimed(k.start, k.end) {
                return Some(Taken::Incomplete);
            }
            let name_ptr = k.name;
            let name = names
                .entry(name_ptr as usize)
                .or_insert_with(|| {
                    if name_ptr.is_null() {
                        Arc::from("(unnamed kernel)")
                    } else {
                        // SAFETY: CUPTI's name: a NUL-terminated string it keeps.
                        Arc::from(
                            unsafe { CStr::from_ptr(name_ptr.cast::<c_char>()) }.to_string_lossy(),
                        )
                    }
                })
                .clone();
            Activity::Kernel {
                at: span(k.deviceId, k.streamId, k.correlationId, k.start, k.end),
                name,
                grid: [dim(k.gridX), dim(k.gridY), dim(k.gridZ)],
                block: [dim(k.blockX), dim(k.blockY), dim(k.blockZ)],
                shared_mem: dim(k.dynamicSharedMemory),
            }
        }
        Kind::CUPTI_ACTIVITY_KIND_MEMCPY => {
            // SAFETY: a memcpy record.
            let m = unsafe { std::ptr::read_unaligned(rec.cast::<sys::CUpti_ActivityMemcpy6>()) };
            if untimed(m.start, m.end) {
                return Some(Taken::Incomplete);
            }
            Activity::Copy {
                at: span(m.deviceId, m.streamId, m.correlationId, m.start, m.end),
                kind: m.copyKind,
                bytes: m.bytes,
            }
        }
        Kind::CUPTI_ACTIVITY_KIND_MEMSET => {
            // SAFETY: a memset record.
            let m = unsafe { std::ptr::read_unaligned(rec.cast::<sys::CUpti_ActivityMemset4>()) };
            if untimed(m.start, m.end) {
                return Some(Taken::Incomplete);
            }
            Activity::Memset {
                at: span(m.deviceId, m.streamId, m.correlationId, m.start, m.end),
                bytes: m.bytes,
            }
        }
        Kind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => {
            // SAFETY: a synchronisation record.
            let s = unsafe {
                std::ptr::read_unaligned(rec.cast::<sys::CUpti_ActivitySynchronization2>())
            };
            if untimed(s.start, s.end) {
                return Some(Taken::Incomplete);
            }
            let kind = match s.type_ as u32 {
                1 => sync_kind::EVENT,
                2 => sync_kind::STREAM_WAIT_EVENT,
                3 => sync_kind::STREAM,
                4 => sync_kind::CONTEXT,
                _ => 0,
            };
            // The record names a context, not a device: device 0 unless the context says
            // otherwise (the recorder maps contexts it does not know to the first device).
            Activity::Sync {
                at: span(u32::MAX, s.streamId, s.correlationId, s.start, s.end),
                kind,
            }
        }
        Kind::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => {
            // SAFETY: an external correlation record.
            let e = unsafe {
                std::ptr::read_unaligned(rec.cast::<sys::CUpti_ActivityExternalCorrelation>())
            };
            Activity::Request {
                correlation: e.correlationId,
                id: e.externalId,
            }
        }
        _ => return None,
    }))
}

fn check(what: &str, r: CUptiResult) -> Result<(), String> {
    if r == CUptiResult::CUPTI_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

/// CUPTI's activity API as the recorder's source.
#[derive(Debug)]
pub(crate) struct Cupti {
    enabled: Vec<Kind>,
    /// Requests pushed as external correlation ids and not popped yet.
    pushed: u32,
}

impl Cupti {
    /// The source, once [`load`] succeeded: registers the callbacks and the clock (once per
    /// process).
    pub(crate) fn open() -> Result<Self, String> {
        static SET_UP: OnceLock<Result<(), String>> = OnceLock::new();
        match LOADED.get() {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.clone()),
            None => return Err("libcupti was not loaded at the worker's start".into()),
        }
        SET_UP
            .get_or_init(|| {
                // SAFETY: both callbacks match CUPTI's signatures and live for the process.
                check("cuptiActivityRegisterCallbacks", unsafe {
                    sys::cuptiActivityRegisterCallbacks(
                        Some(buffer_requested),
                        Some(buffer_completed),
                    )
                })?;
                // SAFETY: a callback of CUPTI's timestamp signature, for the process's life.
                let ours = unsafe { sys::cuptiActivityRegisterTimestampCallback(Some(timestamp)) };
                if ours != CUptiResult::CUPTI_SUCCESS {
                    let mut t = 0u64;
                    // SAFETY: one out-pointer.
                    let got = unsafe { sys::cuptiGetTimestamp(&raw mut t) };
                    if got == CUptiResult::CUPTI_SUCCESS {
                        let off = i128::from(monotonic_ns()) - i128::from(t);
                        CLOCK_OFFSET
                            .store(i64::try_from(off).unwrap_or_default(), Ordering::Relaxed);
                    }
                    debug!("CUPTI keeps its own clock ({ours:?}); offset measured");
                }
                Ok(())
            })
            .clone()?;
        Ok(Self {
            enabled: Vec::new(),
            pushed: 0,
        })
    }
}

impl ActivitySource for Cupti {
    fn enable(&mut self) -> Result<(), String> {
        for k in KINDS {
            // SAFETY: a kind of the enum; CUPTI is set up.
            let r = unsafe { sys::cuptiActivityEnable(k) };
            match r {
                CUptiResult::CUPTI_SUCCESS => self.enabled.push(k),
                // Synchronisation records are a convenience: without them the trace still has
                // the requests that waited.
                _ if k == Kind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => {
                    debug!("CUPTI: synchronisation records not available ({r:?})");
                }
                _ => {
                    self.disable();
                    return Err(format!("cuptiActivityEnable({k:?}): {r:?}"));
                }
            }
        }
        Ok(())
    }

    fn disable(&mut self) {
        for k in self.enabled.drain(..) {
            // SAFETY: a kind enabled above.
            let r = unsafe { sys::cuptiActivityDisable(k) };
            if r != CUptiResult::CUPTI_SUCCESS {
                warn!("cuptiActivityDisable({k:?}): {r:?}");
            }
        }
    }

    fn begin_request(&mut self, id: u64) {
        // SAFETY: plain values; CUPTI keeps a per-thread stack.
        let r = unsafe {
            sys::cuptiActivityPushExternalCorrelationId(
                sys::CUpti_ExternalCorrelationKind::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                id,
            )
        };
        if r == CUptiResult::CUPTI_SUCCESS {
            self.pushed += 1;
        }
    }

    fn end_request(&mut self) {
        if self.pushed == 0 {
            return;
        }
        let mut last = 0u64;
        // SAFETY: one out-pointer; pops what `begin_request` pushed on this thread.
        let _ = unsafe {
            sys::cuptiActivityPopExternalCorrelationId(
                sys::CUpti_ExternalCorrelationKind::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                &raw mut last,
            )
        };
        self.pushed -= 1;
    }

    fn collect(&mut self, forced: bool, sink: &mut dyn FnMut(Activity)) -> u64 {
        // 0: every buffer whose records are all complete, full or not. A forced flush
        // (CUPTI_ACTIVITY_FLAG_FLUSH_FORCED, 1) hands over the records of work still running
        // too, without times, and CUPTI never gives them again: taken as the recording went
        // (every HARVEST_EVERY), it cost a PyTorch trace on an H200 a share of its kernels,
        // which came with zero durations.
        // SAFETY: a flag value; the callbacks run on this thread or CUPTI's.
        let r = unsafe { sys::cuptiActivityFlushAll(u32::from(forced)) };
        if r != CUptiResult::CUPTI_SUCCESS {
            debug!("cuptiActivityFlushAll: {r:?}");
        }
        let (taken, lost) = {
            let mut p = pending();
            (
                std::mem::take(&mut p.activities),
                std::mem::take(&mut p.lost),
            )
        };
        for a in taken {
            sink(a);
        }
        lost
    }
}

impl Drop for Cupti {
    fn drop(&mut self) {
        while self.pushed > 0 {
            self.end_request();
        }
        self.disable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel record as CUPTI lays it out, with the given times.
    fn kernel(start: u64, end: u64) -> sys::CUpti_ActivityKernel10 {
        // SAFETY: the record is plain data (integers and pointers); all-zero is a valid value.
        let mut k: sys::CUpti_ActivityKernel10 = unsafe { std::mem::zeroed() };
        k.kind = Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k.start = start;
        k.end = end;
        (k.gridX, k.gridY, k.gridZ) = (4, 1, 1);
        (k.blockX, k.blockY, k.blockZ) = (128, 1, 1);
        k
    }

    #[test]
    fn a_record_without_times_is_incomplete_and_one_with_times_a_kernel() {
        let mut names = HashMap::new();
        for (start, end) in [(0, 0), (0, 500), (500, 0), (600, 500)] {
            let k = kernel(start, end);
            // SAFETY: a whole kernel record of the layout activity_of reads.
            let got = unsafe { activity_of((&raw const k).cast(), &mut names) };
            assert!(
                matches!(got, Some(Taken::Incomplete)),
                "times {start}..{end} are not a kernel's"
            );
        }
        let k = kernel(1_000, 4_000);
        // SAFETY: as above.
        let got = unsafe { activity_of((&raw const k).cast(), &mut names) };
        let Some(Taken::Activity(Activity::Kernel { at, grid, .. })) = got else {
            panic!("a timed kernel record is a kernel");
        };
        assert_eq!(at.end - at.start, 3_000);
        assert_eq!(grid, [4, 1, 1]);
    }
}

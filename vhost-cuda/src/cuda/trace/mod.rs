//! The GPU timeline recorder of a guest process (`Op::GpuTrace`, docs/profiling.md).
//!
//! While armed, the worker records every request as it arrived and left, and the GPU work it
//! issued with GPU timestamps: from CUPTI's activity API where the host has libcupti and the
//! daemon allows it (`cupti.rs`), else from CUDA events recorded around each op on its stream
//! (`gpu_state/trace.rs`). Records wait in a bounded ring ([`TraceRing`]) for the reader
//! (`qcuda-smi trace`, or guest-lib at `cudaProfilerStop` with `QCUDA_PROFILE`); a full ring
//! drops records and counts them, so a slow reader never holds GPU work up.
//!
//! Disarmed, the recorder does not exist: `GpuState::execute` checks one `Option` per request
//! and runs it as before.
//!
//! Neighbours: `activity.rs` (what a profiling interface delivers), `ring.rs` (the ring),
//! `cupti.rs` (CUPTI), `gpu_state/trace.rs` (the op, the event timer, the request records);
//! qcuda-proto's `trace` module is the wire format.

mod activity;
pub(crate) mod cupti;
mod ring;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

pub(crate) use activity::{Activity, ActivitySource, ActivitySpan};
use qcuda_proto::trace::{
    TraceRecord, TraceSpan, TRACE_MAX_NAME, TRACE_NAME_CHUNK, TRACE_RECORD_SIZE, TRACE_STATE_ARMED,
};
pub(crate) use ring::TraceRing;

/// How GPU work is timed (`vhost-cuda --gpu-trace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuTraceMode {
    /// CUPTI where libcupti loads, else CUDA events.
    #[default]
    Auto,
    /// CUPTI only (an arm fails where it cannot be used).
    Cupti,
    /// CUDA events around each op.
    Events,
    /// Requests only: no GPU times (nothing of CUPTI loaded, no events).
    Off,
}

impl GpuTraceMode {
    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cupti => "cupti",
            Self::Events => "events",
            Self::Off => "off",
        }
    }

    /// Whether a worker loads libcupti at its start.
    pub fn wants_cupti(self) -> bool {
        matches!(self, Self::Auto | Self::Cupti)
    }
}

impl std::fmt::Display for GpuTraceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for GpuTraceMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cupti" => Ok(Self::Cupti),
            "events" => Ok(Self::Events),
            "off" => Ok(Self::Off),
            _ => Err(format!("{s:?}: auto, cupti, events or off")),
        }
    }
}

/// How workers record GPU timelines: the mode and where libcupti is (`--gpu-trace`,
/// `--cupti`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuTraceSetup {
    /// How GPU work is timed.
    pub mode: GpuTraceMode,
    /// libcupti.so.13, or the directory holding it (`None`: the CUDA toolkit's places).
    pub cupti: Option<std::path::PathBuf>,
}

/// CLOCK_MONOTONIC in ns (the clock of every record).
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in ns since the epoch.
pub(crate) fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one valid out-pointer; the clocks exist on every Linux.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// Most distinct kernel names a recording keeps (the rest share id [`NAMES_FULL`]).
const MAX_NAMES: usize = 1 << 16;
/// The name id of kernels whose name did not fit the table.
const NAMES_FULL: u32 = 0;
/// Most API-call-to-request links kept while their GPU records are outstanding.
const MAX_LINKS: usize = 1 << 16;
/// How often an armed recorder takes what the profiling interface has (and counts busy time).
const HARVEST_EVERY: Duration = Duration::from_millis(250);

/// GPU time counted towards the busy fraction: the union of the work's intervals.
#[derive(Debug, Default)]
pub(crate) struct BusyMeter {
    /// The latest end counted so far.
    until: u64,
    /// Busy ns counted and not yet taken.
    fresh: u64,
}

impl BusyMeter {
    /// Counts `[start, end)`, less what was counted already (records come nearly in order).
    pub(crate) fn add(&mut self, start: u64, end: u64) {
        let from = start.max(self.until);
        if end > from {
            self.fresh += end - from;
        }
        self.until = self.until.max(end);
    }

    /// The busy ns counted since the last call.
    pub(crate) fn take(&mut self) -> u64 {
        std::mem::take(&mut self.fresh)
    }
}

/// One armed (or disarmed, not yet read) recording.
#[derive(Debug)]
pub(crate) struct Recorder {
    pub(crate) ring: TraceRing,
    armed: bool,
    /// `TRACE_STATE_*` of the GPU timing in use.
    pub(crate) timing: u64,
    /// When the window ends by itself.
    deadline: Option<Instant>,
    /// When the current stretch of recording began (CLOCK_MONOTONIC ns), while armed.
    armed_at: u64,
    /// ns recorded in stretches that ended.
    recorded: u64,
    next_seq: u64,
    /// The profiling interface, if GPU work is timed by one.
    pub(crate) source: Option<Box<dyn ActivitySource>>,
    names: HashMap<Arc<str>, u32>,
    /// Per name id: its name, and whether the reader has had it.
    name_list: Vec<(Arc<str>, bool)>,
    /// The interface's API-call ids to request sequence numbers.
    links: HashMap<u32, u64>,
    /// Guest ordinal of each host CUDA ordinal (index: the host's).
    guest_device: HashMap<u32, u16>,
    last_harvest: Instant,
    pub(crate) busy: BusyMeter,
    /// Busy and recorded ns not yet given to the VM's accounting.
    unreported_recorded: u64,
}

impl Recorder {
    /// A new recording into a ring of `capacity` records, stopping by itself after `window`;
    /// `devices` are the host ordinals of the guest's devices (index: the guest's), `source`
    /// the profiling interface (enabled here), `timing` the `TRACE_STATE_*` bit of the GPU
    /// timing.
    pub(crate) fn arm(
        capacity: usize,
        window: Option<Duration>,
        devices: &[u32],
        mut source: Option<Box<dyn ActivitySource>>,
        timing: u64,
    ) -> Result<Self, String> {
        if let Some(s) = &mut source {
            s.enable()?;
        }
        let now = Instant::now();
        Ok(Self {
            ring: TraceRing::new(capacity),
            armed: true,
            timing,
            deadline: window.map(|w| now + w),
            armed_at: monotonic_ns(),
            recorded: 0,
            next_seq: 1,
            source,
            names: HashMap::new(),
            // Id 0: names that did not fit.
            name_list: vec![(Arc::from("(kernel names table full)"), false)],
            links: HashMap::new(),
            guest_device: devices
                .iter()
                .enumerate()
                .map(|(g, &h)| (h, u16::try_from(g).unwrap_or(u16::MAX)))
                .collect(),
            last_harvest: now,
            busy: BusyMeter::default(),
            unreported_recorded: 0,
        })
    }

    /// Whether requests are being recorded; ends the window first if it is over.
    pub(crate) fn armed(&mut self) -> bool {
        if self.armed && self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.disarm();
        }
        self.armed
    }

    /// `TRACE_STATE_*` bits.
    pub(crate) fn state(&self) -> u64 {
        self.timing | if self.armed { TRACE_STATE_ARMED } else { 0 }
    }

    /// ns recorded since the arm.
    pub(crate) fn recorded_ns(&self) -> u64 {
        self.recorded
            + if self.armed {
                monotonic_ns().saturating_sub(self.armed_at)
            } else {
                0
            }
    }

    /// Stops recording; what was recorded stays to be read.
    pub(crate) fn disarm(&mut self) {
        if !self.armed {
            return;
        }
        self.harvest(true);
        if let Some(s) = &mut self.source {
            s.disable();
        }
        // What finished before the disable is still handed over.
        self.harvest(true);
        let now = monotonic_ns();
        let stretch = now.saturating_sub(self.armed_at);
        self.recorded += stretch;
        self.unreported_recorded += stretch;
        self.armed = false;
    }

    /// The next request's sequence number; the profiling interface links what it issues.
    pub(crate) fn begin_request(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(s) = &mut self.source {
            s.begin_request(seq);
        }
        seq
    }

    /// The request of [`Recorder::begin_request`] is answered. Now and then the profiling
    /// interface's records are taken: returns whether they were (the busy time is then due).
    pub(crate) fn end_request(&mut self) -> bool {
        if let Some(s) = &mut self.source {
            s.end_request();
        }
        if self.last_harvest.elapsed() >= HARVEST_EVERY {
            // Only complete records while the work goes on (a forced flush loses the rest).
            self.harvest(false);
            return true;
        }
        false
    }

    /// Adds a record; GPU work counts as busy time.
    pub(crate) fn push(&mut self, r: TraceRecord) {
        if r.is_gpu_work() {
            if let Some(s) = r.span() {
                self.busy.add(s.start, s.end);
            }
        }
        self.ring.push(r);
    }

    /// The guest ordinal of host CUDA ordinal `host` (0 if it is not one of the guest's).
    pub(crate) fn guest_device(&self, host: u32) -> u16 {
        self.guest_device.get(&host).copied().unwrap_or(0)
    }

    /// The id of kernel name `name`.
    pub(crate) fn name_id(&mut self, name: &Arc<str>) -> u32 {
        if let Some(&id) = self.names.get(name) {
            return id;
        }
        if self.name_list.len() >= MAX_NAMES {
            return NAMES_FULL;
        }
        let id = u32::try_from(self.name_list.len()).unwrap_or(NAMES_FULL);
        self.names.insert(Arc::clone(name), id);
        self.name_list.push((Arc::clone(name), false));
        id
    }

    /// Takes what the profiling interface has into the ring (`forced`: every buffer, at the
    /// end of a recording; otherwise those whose records are all complete).
    pub(crate) fn harvest(&mut self, forced: bool) {
        self.last_harvest = Instant::now();
        let Some(mut source) = self.source.take() else {
            return;
        };
        let mut got = Vec::new();
        let lost = source.collect(forced, &mut |a| got.push(a));
        self.source = Some(source);
        self.ring.lost(lost);
        for a in got {
            self.take_activity(a);
        }
    }

    fn span_of(&self, at: &ActivitySpan) -> TraceSpan {
        TraceSpan {
            device: self.guest_device(at.device),
            start: at.start,
            end: at.end.max(at.start),
            stream: at.stream,
            correlation: self.links.get(&at.correlation).copied().unwrap_or(0),
        }
    }

    fn take_activity(&mut self, a: Activity) {
        let rec = match a {
            Activity::Request { correlation, id } => {
                if self.links.len() >= MAX_LINKS {
                    self.links.clear();
                }
                self.links.insert(correlation, id);
                return;
            }
            Activity::Kernel {
                at,
                name,
                grid,
                block,
                shared_mem,
            } => TraceRecord::Kernel {
                span: self.span_of(&at),
                name: self.name_id(&name),
                grid,
                block: block.map(|b| u16::try_from(b).unwrap_or(u16::MAX)),
                shared_mem,
            },
            Activity::Copy { at, kind, bytes } => TraceRecord::Copy {
                span: self.span_of(&at),
                kind,
                bytes,
            },
            Activity::Memset { at, bytes } => TraceRecord::Memset {
                span: self.span_of(&at),
                bytes,
            },
            Activity::Sync { at, kind } => TraceRecord::Sync {
                span: self.span_of(&at),
                kind,
            },
        };
        self.push(rec);
    }

    /// Busy ns and recorded ns not yet given to the VM's accounting (`limits.rs`).
    pub(crate) fn take_accounting(&mut self) -> (u64, u64) {
        let recorded = std::mem::take(&mut self.unreported_recorded)
            + if self.armed {
                let now = monotonic_ns();
                let stretch = now.saturating_sub(self.armed_at);
                self.armed_at = now;
                self.recorded += stretch;
                stretch
            } else {
                0
            };
        (self.busy.take(), recorded)
    }

    /// Moves the oldest records into `out`, whole records only, at most `max` of them (name
    /// records of kernels the reader has not had first). Returns the records written.
    pub(crate) fn read(&mut self, out: &mut Vec<u8>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(front) = self.ring.front() else {
                break;
            };
            if let TraceRecord::Kernel { name, .. } = *front {
                if let Some((text, sent)) = self.name_list.get(name as usize) {
                    if !sent {
                        let len = text.len().min(TRACE_MAX_NAME);
                        let pieces = len.div_ceil(TRACE_NAME_CHUNK).max(1);
                        if n + pieces + 1 > max {
                            break;
                        }
                        TraceRecord::name_records(name, text.as_bytes(), |r| {
                            out.extend_from_slice(&r.encode());
                            n += 1;
                        });
                        if let Some(e) = self.name_list.get_mut(name as usize) {
                            e.1 = true;
                        }
                    }
                }
            }
            let Some(r) = self.ring.pop() else {
                break;
            };
            out.extend_from_slice(&r.encode());
            n += 1;
        }
        debug_assert_eq!(out.len() % TRACE_RECORD_SIZE, 0);
        n
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(s) = &mut self.source {
            s.disable();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use qcuda_proto::trace::TRACE_STATE_CUPTI;

    use super::*;

    /// A source that hands out what the test put in.
    #[derive(Debug, Default)]
    struct Scripted {
        queued: Arc<Mutex<Vec<Activity>>>,
        enabled: Arc<Mutex<bool>>,
        requests: Arc<Mutex<Vec<u64>>>,
    }

    impl ActivitySource for Scripted {
        fn enable(&mut self) -> Result<(), String> {
            *self.enabled.lock().unwrap() = true;
            Ok(())
        }
        fn disable(&mut self) {
            *self.enabled.lock().unwrap() = false;
        }
        fn begin_request(&mut self, id: u64) {
            self.requests.lock().unwrap().push(id);
        }
        fn end_request(&mut self) {}
        fn collect(&mut self, _flush: bool, sink: &mut dyn FnMut(Activity)) -> u64 {
            for a in self.queued.lock().unwrap().drain(..) {
                sink(a);
            }
            3
        }
    }

    fn at(device: u32, correlation: u32, start: u64, end: u64) -> ActivitySpan {
        ActivitySpan {
            device,
            stream: 13,
            correlation,
            start,
            end,
        }
    }

    fn decode(bytes: &[u8]) -> Vec<TraceRecord> {
        bytes
            .chunks_exact(TRACE_RECORD_SIZE)
            .map(|c| TraceRecord::decode(c).unwrap())
            .collect()
    }

    #[test]
    fn activities_become_linked_records_with_names_before_their_kernels() {
        let s = Scripted::default();
        let (queued, enabled) = (s.queued.clone(), s.enabled.clone());
        let mut r = Recorder::arm(16, None, &[5, 7], Some(Box::new(s)), TRACE_STATE_CUPTI).unwrap();
        assert!(*enabled.lock().unwrap());
        assert!(r.armed());
        assert_eq!(r.state(), TRACE_STATE_ARMED | TRACE_STATE_CUPTI);
        let seq = r.begin_request();
        assert_eq!(seq, 1);
        let name: Arc<str> =
            Arc::from("gemm_kernel_with_a_long_name_that_takes_more_than_one_record");
        queued.lock().unwrap().extend([
            Activity::Request {
                correlation: 77,
                id: seq,
            },
            Activity::Kernel {
                at: at(7, 77, 100, 300),
                name: name.clone(),
                grid: [4, 1, 1],
                block: [128, 1, 1],
                shared_mem: 0,
            },
            Activity::Kernel {
                at: at(7, 77, 200, 400),
                name,
                grid: [4, 1, 1],
                block: [128, 1, 1],
                shared_mem: 0,
            },
        ]);
        r.harvest(true);
        assert_eq!(r.ring.dropped(), 3, "the interface's losses count");
        // Busy is the union: 100..400.
        assert_eq!(r.busy.take(), 300);
        let mut out = Vec::new();
        assert_eq!(r.read(&mut out, 100), 4);
        let recs = decode(&out);
        assert!(matches!(
            recs[0],
            TraceRecord::Name {
                id: 1,
                offset: 0,
                ..
            }
        ));
        assert!(matches!(
            recs[1],
            TraceRecord::Name {
                id: 1,
                offset: 48,
                ..
            }
        ));
        let TraceRecord::Kernel { span, name, .. } = recs[2] else {
            panic!("{:?}", recs[2]);
        };
        assert_eq!((span.device, span.correlation, name), (1, 1, 1));
        // The name went with the first kernel only.
        assert!(matches!(recs[3], TraceRecord::Kernel { .. }));
        r.disarm();
        assert!(!*enabled.lock().unwrap());
        assert!(!r.armed());
    }

    #[test]
    fn a_read_never_splits_a_name_from_its_kernel() {
        let s = Scripted::default();
        let queued = s.queued.clone();
        let mut r = Recorder::arm(16, None, &[0], Some(Box::new(s)), TRACE_STATE_CUPTI).unwrap();
        queued.lock().unwrap().push(Activity::Kernel {
            at: at(0, 1, 1, 2),
            name: Arc::from("k".repeat(100)),
            grid: [1; 3],
            block: [1; 3],
            shared_mem: 0,
        });
        r.harvest(false);
        let mut out = Vec::new();
        // Three name pieces and the kernel do not fit in three records.
        assert_eq!(r.read(&mut out, 3), 0);
        assert_eq!(r.read(&mut out, 4), 4);
        assert_eq!(r.ring.len(), 0);
    }

    #[test]
    fn the_window_ends_the_recording_by_itself() {
        let mut r = Recorder::arm(4, Some(Duration::ZERO), &[0], None, 0).unwrap();
        assert!(!r.armed());
        let mut r = Recorder::arm(4, Some(Duration::from_secs(60)), &[0], None, 0).unwrap();
        assert!(r.armed());
        std::thread::sleep(Duration::from_millis(2));
        let (_, recorded) = r.take_accounting();
        assert!(recorded >= 2_000_000, "{recorded}");
        r.disarm();
        assert!(r.recorded_ns() >= recorded);
    }

    #[test]
    fn busy_time_is_the_union_of_the_work() {
        let mut b = BusyMeter::default();
        b.add(0, 10);
        b.add(5, 15);
        b.add(20, 30);
        b.add(25, 26);
        assert_eq!(b.take(), 25);
        assert_eq!(b.take(), 0);
        b.add(28, 40);
        assert_eq!(b.take(), 10);
    }
}

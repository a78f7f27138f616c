//! `Op::GpuTrace` and what a recording adds to each request (`cuda/trace/`): the request
//! records, the link between a request and the GPU work it issued, and, where no profiling
//! interface times the GPU work, the CUDA events around each op.
//!
//! The event timer: before a kernel launch, copy, memset or graph launch, an event is recorded
//! on the op's stream, and another after it; `cuEventElapsedTime` between a reference event
//! (recorded on a stream of the timer's own, whose host time was taken when it completed) and
//! each of them places the op on the worker's clock. It costs two `cuEventRecord` calls per op
//! (a few µs of the worker's time, nothing on the GPU) and a query per op when the records are
//! collected; the op's stream is not synchronised. Ops on a stream being captured are not
//! timed (an event there would become a graph node).

use std::collections::{HashMap, VecDeque};

use qcuda_proto::trace::{
    copy_kind, TraceRecord, TraceSpan, TRACE_ARM, TRACE_DEFAULT_RECORDS, TRACE_DISARM,
    TRACE_MAX_READ_RECORDS, TRACE_MAX_RECORDS, TRACE_MAX_WINDOW_MS, TRACE_READ, TRACE_RECORD_SIZE,
    TRACE_REQUEST_ASYNC, TRACE_REQUEST_IN_BATCH, TRACE_STATE_CUPTI, TRACE_STATE_EVENTS,
    TRACE_STATE_REQUESTS_ONLY, TRACE_STATUS,
};
use tracing::info;

use super::*;
use crate::cuda::trace::{cupti, monotonic_ns, realtime_ns, GpuTraceMode, Recorder};

/// Smallest out-buffer a `TRACE_READ` takes: room for the longest name and its kernel.
const MIN_READ_RECORDS: usize = 128;
/// Most ops timed by events and not yet collected; past it, ops go untimed (counted lost).
const MAX_PENDING_EVENTS: usize = 8192;
/// Most spare events kept per device.
const MAX_SPARE_EVENTS: usize = 1024;

/// The guest's stream handle of a request (0: the legacy stream or none).
fn stream_arg(op: Op, args: &[u64; 8]) -> u64 {
    match op {
        Op::MemcpyHtoD | Op::MemcpyDtoH | Op::GraphLaunch | Op::GraphUpload | Op::EventRecord => {
            args[1]
        }
        Op::MemcpyDtoD | Op::Memset | Op::MemcpyMapped => args[3],
        Op::LaunchKernel | Op::LaunchKernelEx | Op::MemcpyPeer => args[5],
        Op::Memset3D => args[7],
        Op::StreamSynchronize
        | Op::StreamQuery
        | Op::StreamWaitEvent
        | Op::Memcpy3D
        | Op::Memcpy3DHtoD
        | Op::Memcpy3DDtoH => args[0],
        _ => 0,
    }
}

fn ms_to_ns(ms: f32) -> i64 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "an elapsed time in ms of a recording, far inside i64 ns"
    )]
    let ns = (f64::from(ms) * 1e6).round() as i64;
    ns
}

impl GpuState {
    /// A request while a recording exists: recorded if it is armed.
    pub(super) fn execute_recorded(&mut self, req: &Request) -> ResponseHeader {
        let armed = req.op() != Op::GpuTrace && self.trace.as_mut().is_some_and(|t| t.rec.armed());
        if !armed {
            return self.execute_unrecorded(req);
        }
        let arrived = monotonic_ns();
        let (seq, batch) = match self.trace.as_mut() {
            Some(t) => {
                let seq = t.rec.begin_request();
                (seq, std::mem::replace(&mut t.current, seq))
            }
            None => return self.execute_unrecorded(req),
        };
        let timed = self.time_begin(req);
        let resp = self.execute_unrecorded(req);
        if let Some(t) = timed {
            self.time_end(t);
        }
        let harvest = match self.trace.as_mut() {
            Some(t) => {
                t.current = batch;
                t.rec.end_request()
            }
            None => false,
        };
        let h = req.header();
        let mut flags = if h.flags & FLAG_ASYNC != 0 {
            TRACE_REQUEST_ASYNC
        } else {
            0
        };
        if batch != 0 {
            flags |= TRACE_REQUEST_IN_BATCH;
        }
        let records = if req.op() == Op::Batch {
            u32::try_from(h.args[0]).unwrap_or(u32::MAX)
        } else {
            0
        };
        let record = TraceRecord::Request {
            span: TraceSpan {
                device: u16::try_from(h.device).unwrap_or(u16::MAX),
                start: arrived,
                end: monotonic_ns(),
                stream: stream_arg(req.op(), &h.args),
                correlation: seq,
            },
            op: req.op() as u32,
            flags,
            status: resp.status,
            records,
            batch,
        };
        if let Some(t) = self.trace.as_mut() {
            t.rec.push(record);
        }
        if harvest {
            self.collect_events(false);
            self.report_busy();
        }
        resp
    }

    /// A record of a batch: as if it had come alone.
    pub(super) fn execute_batched(&mut self, sub: &Request) -> ResponseHeader {
        if self.trace.is_some() {
            return self.execute_recorded(sub);
        }
        self.execute_unrecorded(sub)
    }

    /// `Op::GpuTrace`.
    pub(super) fn gpu_trace(&mut self, req: &Request) -> OpResult {
        let args = req.header().args;
        let mut written = 0u64;
        match args[0] {
            TRACE_STATUS => {}
            TRACE_ARM => self.trace_arm(args[2], args[5])?,
            TRACE_DISARM => self.trace_disarm(),
            TRACE_READ => written = self.trace_read(req)?,
            _ => return Err(status::INVALID_VALUE.into()),
        }
        let (state, held, dropped, recorded) = match self.trace.as_mut() {
            Some(t) => {
                let lost = t.events.as_ref().map_or(0, |e| e.lost);
                (
                    t.rec.state(),
                    t.rec.ring.len() as u64,
                    t.rec.ring.dropped() + lost,
                    t.rec.recorded_ns(),
                )
            }
            None => (0, 0, 0, 0),
        };
        ok_rets(&[
            state,
            written,
            held,
            dropped,
            monotonic_ns(),
            realtime_ns(),
            recorded,
        ])
    }

    fn trace_arm(&mut self, capacity: u64, window_ms: u64) -> Result<(), Fault> {
        let capacity = match capacity {
            0 => TRACE_DEFAULT_RECORDS,
            c if c <= TRACE_MAX_RECORDS => c,
            _ => return Err(status::INVALID_VALUE.into()),
        };
        if window_ms > TRACE_MAX_WINDOW_MS {
            return Err(status::INVALID_VALUE.into());
        }
        let window = (window_ms > 0).then(|| std::time::Duration::from_millis(window_ms));
        // A new recording replaces the old one (its unread records go).
        self.trace_disarm();
        self.trace = None;
        let mode = self.host.trace_mode();
        let mut timing = TRACE_STATE_REQUESTS_ONLY;
        let mut source = None;
        if mode.wants_cupti() {
            match self.drv.activity_source().map_or_else(
                || {
                    cupti::Cupti::open()
                        .map(|c| Box::new(c) as Box<dyn crate::cuda::trace::ActivitySource>)
                },
                Ok,
            ) {
                Ok(s) => {
                    source = Some(s);
                    timing = TRACE_STATE_CUPTI;
                }
                Err(e) if mode == GpuTraceMode::Cupti => {
                    warn!(
                        session = self.id,
                        "GPU trace refused: CUPTI cannot be used: {e}"
                    );
                    return Err(status::NOT_SUPPORTED.into());
                }
                Err(e) => {
                    info!(
                        session = self.id,
                        "GPU trace: CUPTI not used ({e}); timing with CUDA events"
                    );
                    timing = TRACE_STATE_EVENTS;
                }
            }
        } else if mode == GpuTraceMode::Events {
            timing = TRACE_STATE_EVENTS;
        }
        let devices: Vec<u32> = self.host.gpus.iter().map(|g| g.host_ordinal).collect();
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
        let rec = match Recorder::arm(capacity, window, &devices, source, timing) {
            Ok(r) => r,
            Err(e) => {
                warn!(session = self.id, "GPU trace refused: {e}");
                return Err(status::NOT_SUPPORTED.into());
            }
        };
        self.trace = Some(Box::new(Tracing {
            rec,
            events: (timing == TRACE_STATE_EVENTS).then(EventTimer::default),
            current: 0,
        }));
        Ok(())
    }

    /// Stops the recording, waits for the ops it timed, and gives its events back.
    pub(super) fn trace_disarm(&mut self) {
        let Some(t) = self.trace.as_mut() else {
            return;
        };
        t.rec.disarm();
        self.collect_events(true);
        self.report_busy();
        if let Some(mut timer) = self.trace.as_mut().and_then(|t| t.events.take()) {
            let lost = timer.lost;
            self.release_timer(&mut timer);
            if let Some(t) = self.trace.as_mut() {
                t.rec.ring.lost(lost);
            }
        }
    }

    fn trace_read(&mut self, req: &Request) -> Result<u64, Fault> {
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let len = out.len();
        let max = len / TRACE_RECORD_SIZE;
        if !len.is_multiple_of(TRACE_RECORD_SIZE) || max < MIN_READ_RECORDS {
            return Err(status::INVALID_VALUE.into());
        }
        let max = max.min(usize::try_from(TRACE_MAX_READ_RECORDS).unwrap_or(usize::MAX));
        if self.trace.as_mut().is_some_and(|t| t.rec.armed()) {
            if let Some(t) = self.trace.as_mut() {
                t.rec.harvest(true);
            }
            self.collect_events(false);
            self.report_busy();
        }
        let Some(t) = self.trace.as_mut() else {
            return Ok(0);
        };
        let mut bytes = Vec::with_capacity(max.min(t.rec.ring.len() + 256) * TRACE_RECORD_SIZE);
        let n = t.rec.read(&mut bytes, max);
        out.write_at(0, &bytes).map_err(|_| status::INVALID_VALUE)?;
        Ok(n as u64)
    }

    /// Gives the busy and recorded time not yet counted to the VM's accounting.
    fn report_busy(&mut self) {
        let Some(t) = self.trace.as_mut() else {
            return;
        };
        let (busy, recorded) = t.rec.take_accounting();
        if let Some(q) = self.host.memory_quota() {
            q.count_gpu_time(busy, recorded);
        }
    }

    /// Before an op that runs on the GPU, while timing with events: the start event, recorded
    /// on its stream.
    fn time_begin(&mut self, req: &Request) -> Option<Timed> {
        self.trace.as_ref()?.events.as_ref()?;
        let args = req.header().args;
        let op = req.op();
        let kernel = matches!(op, Op::LaunchKernel | Op::LaunchKernelEx);
        let dev = if kernel {
            self.functions.get(args[0])?.dev
        } else {
            self.device(req).ok()?
        };
        let empty = TraceSpan::default;
        let bytes_of = |b: Option<&GuestBuffer>| b.map_or(0, |b| b.len() as u64);
        let rec = match op {
            Op::LaunchKernel | Op::LaunchKernelEx => {
                let cfg = LaunchConfig::decode(&args).ok()?;
                let name: Arc<str> = Arc::from(self.functions.get(args[0])?.name.to_string_lossy());
                let name = self.trace.as_mut()?.rec.name_id(&name);
                TraceRecord::Kernel {
                    span: empty(),
                    name,
                    grid: cfg.grid,
                    block: cfg.block.map(|b| u16::try_from(b).unwrap_or(u16::MAX)),
                    shared_mem: cfg.shared_mem,
                }
            }
            Op::MemcpyHtoD => TraceRecord::Copy {
                span: empty(),
                kind: copy_kind::HTOD,
                bytes: bytes_of(req.inputs().first()),
            },
            Op::MemcpyDtoH => TraceRecord::Copy {
                span: empty(),
                kind: copy_kind::DTOH,
                bytes: bytes_of(req.outputs().first()),
            },
            Op::MemcpyDtoD | Op::MemcpyMapped => TraceRecord::Copy {
                span: empty(),
                kind: copy_kind::DTOD,
                bytes: args[2],
            },
            Op::MemcpyPeer => TraceRecord::Copy {
                span: empty(),
                kind: copy_kind::PTOP,
                bytes: args[4],
            },
            Op::Memset => TraceRecord::Memset {
                span: empty(),
                bytes: args[2].saturating_mul(args[4].max(1)),
            },
            Op::GraphLaunch => TraceRecord::Graph {
                span: empty(),
                graph: u32::try_from(args[0]).unwrap_or(u32::MAX),
            },
            _ => return None,
        };
        let handle = stream_arg(op, &args);
        let stream = self.stream_on(handle, dev).ok()?;
        self.bind(dev).ok()?;
        if self.is_capturing(stream) {
            return None;
        }
        let too_many = self
            .trace
            .as_ref()
            .and_then(|t| t.events.as_ref())
            .is_some_and(|e| e.pending.len() >= MAX_PENDING_EVENTS);
        if too_many {
            self.collect_events(false);
            let timer = self.trace.as_mut()?.events.as_mut()?;
            if timer.pending.len() >= MAX_PENDING_EVENTS {
                timer.lost += 1;
                return None;
            }
        }
        let reference = self.timer_reference(dev)?;
        let stream_id = self.timer_stream_id(dev, handle, stream);
        let start = self.timer_event(dev)?;
        let end = self.timer_event(dev)?;
        if self.drv.event_record(start, stream).is_err() {
            self.spare_events(dev, [start, end]);
            return None;
        }
        let mut rec = rec;
        set_span(&mut rec, |s| {
            s.device = u16::try_from(dev).unwrap_or(u16::MAX);
            s.stream = stream_id;
        });
        Some(Timed {
            dev,
            stream,
            start,
            end,
            reference,
            rec,
        })
    }

    /// After the op: its end event, on the same stream (the op bound its context again).
    fn time_end(&mut self, mut t: Timed) {
        let seq = self.trace.as_ref().map_or(0, |x| x.current);
        set_span(&mut t.rec, |s| s.correlation = seq);
        let recorded = self.bind(t.dev).is_ok() && self.drv.event_record(t.end, t.stream).is_ok();
        match self.trace.as_mut().and_then(|x| x.events.as_mut()) {
            Some(timer) if recorded => timer.pending.push_back(t),
            Some(timer) => {
                timer.lost += 1;
                timer
                    .spare
                    .entry(t.dev)
                    .or_default()
                    .extend([t.start, t.end]);
            }
            None => {}
        }
    }

    /// The driver's id of the guest's stream `handle` on `dev`, asked once.
    fn timer_stream_id(&mut self, dev: usize, handle: u64, stream: Stream) -> u64 {
        let known = self
            .trace
            .as_ref()
            .and_then(|t| t.events.as_ref())
            .and_then(|e| e.stream_ids.get(&(dev, handle)).copied());
        if let Some(id) = known {
            return id;
        }
        let id = self.drv.stream_id(stream).unwrap_or(handle);
        if let Some(e) = self.trace.as_mut().and_then(|t| t.events.as_mut()) {
            e.stream_ids.insert((dev, handle), id);
        }
        id
    }

    /// An event of `dev` (context bound) for timing, spare or new.
    fn timer_event(&mut self, dev: usize) -> Option<Event> {
        let spare = self
            .trace
            .as_mut()
            .and_then(|t| t.events.as_mut())
            .and_then(|e| e.spare.get_mut(&dev))
            .and_then(Vec::pop);
        match spare {
            Some(e) => Some(e),
            None => self.drv.event_create(0).ok(),
        }
    }

    fn spare_events(&mut self, dev: usize, events: [Event; 2]) {
        if let Some(e) = self.trace.as_mut().and_then(|t| t.events.as_mut()) {
            e.spare.entry(dev).or_default().extend(events);
        }
    }

    /// The reference of `dev` (context bound): made at the first op, and again whenever no
    /// op measured against the old one is pending (so elapsed times stay short and precise).
    fn timer_reference(&mut self, dev: usize) -> Option<(Event, u64)> {
        let timer = self.trace.as_ref()?.events.as_ref()?;
        if let Some(&(_, ev, at)) = timer.devices.get(&dev) {
            return Some((ev, at));
        }
        // A stream of its own, CU_STREAM_NON_BLOCKING (1): the legacy stream does not wait for it.
        let stream = self.drv.stream_create(1, 0).ok()?;
        let ev = self.drv.event_create(0).ok()?;
        let at = self.reference_now(stream, ev)?;
        self.trace
            .as_mut()?
            .events
            .as_mut()?
            .devices
            .insert(dev, (stream, ev, at));
        Some((ev, at))
    }

    /// Records `ev` on the idle `stream`, waits for it, and returns the host time it stands
    /// for.
    fn reference_now(&self, stream: Stream, ev: Event) -> Option<u64> {
        self.drv.event_record(ev, stream).ok()?;
        self.drv.event_synchronize(ev).ok()?;
        Some(monotonic_ns())
    }

    /// Turns every timed op whose end event completed into a record (`wait`: waits for all).
    fn collect_events(&mut self, wait: bool) {
        let Some(mut timer) = self.trace.as_mut().and_then(|t| t.events.take()) else {
            return;
        };
        let mut left = VecDeque::new();
        let mut done = Vec::new();
        while let Some(t) = timer.pending.pop_front() {
            if self.bind(t.dev).is_err() {
                timer.lost += 1;
                continue;
            }
            if wait {
                let _ = self.drv.event_synchronize(t.end);
            }
            match self.drv.event_query(t.end) {
                Ok(()) => {}
                Err(_) if !wait => {
                    left.push_back(t);
                    continue;
                }
                Err(_) => {
                    timer.lost += 1;
                    timer
                        .spare
                        .entry(t.dev)
                        .or_default()
                        .extend([t.start, t.end]);
                    continue;
                }
            }
            let (rev, at) = t.reference;
            let place = self.drv.event_elapsed(rev, t.start);
            let length = self.drv.event_elapsed(t.start, t.end);
            if let (Ok(p), Ok(l)) = (place, length) {
                let start = at.saturating_add_signed(ms_to_ns(p));
                let end = start.saturating_add_signed(ms_to_ns(l).max(0));
                let mut rec = t.rec;
                set_span(&mut rec, |s| {
                    s.start = start;
                    s.end = end;
                });
                done.push(rec);
            } else {
                timer.lost += 1;
            }
            let spare = timer.spare.entry(t.dev).or_default();
            if spare.len() < MAX_SPARE_EVENTS {
                spare.extend([t.start, t.end]);
            } else {
                let _ = self.drv.event_destroy(t.start);
                let _ = self.drv.event_destroy(t.end);
            }
        }
        timer.pending = left;
        // References with nothing pending against them are made anew at the next op.
        let busy: std::collections::HashSet<usize> = timer.pending.iter().map(|t| t.dev).collect();
        let stale: Vec<usize> = timer
            .devices
            .keys()
            .copied()
            .filter(|d| !busy.contains(d))
            .collect();
        for dev in stale {
            if let Some((stream, ev, _)) = timer.devices.get(&dev).copied() {
                if self.bind(dev).is_ok() {
                    if let Some(at) = self.reference_now(stream, ev) {
                        timer.devices.insert(dev, (stream, ev, at));
                    }
                }
            }
        }
        if let Some(t) = self.trace.as_mut() {
            for r in done {
                t.rec.push(r);
            }
            t.events = Some(timer);
        }
    }

    /// Destroys the timer's events and streams.
    fn release_timer(&mut self, timer: &mut EventTimer) {
        let mut by_dev: HashMap<usize, Vec<Event>> = std::mem::take(&mut timer.spare);
        for t in timer.pending.drain(..) {
            by_dev.entry(t.dev).or_default().extend([t.start, t.end]);
        }
        let devices: Vec<(usize, (Stream, Event, u64))> = timer.devices.drain().collect();
        for (dev, (_, ev, _)) in &devices {
            by_dev.entry(*dev).or_default().push(*ev);
        }
        for (dev, events) in by_dev {
            if self.bind(dev).is_err() {
                continue;
            }
            for e in events {
                let _ = self.drv.event_destroy(e);
            }
        }
        for (dev, (stream, _, _)) in devices {
            if self.bind(dev).is_ok() {
                let _ = self.drv.stream_destroy(stream);
            }
        }
    }
}

/// Changes the span of a timed record.
fn set_span(rec: &mut TraceRecord, f: impl FnOnce(&mut TraceSpan)) {
    match rec {
        TraceRecord::Request { span, .. }
        | TraceRecord::Kernel { span, .. }
        | TraceRecord::Copy { span, .. }
        | TraceRecord::Memset { span, .. }
        | TraceRecord::Sync { span, .. }
        | TraceRecord::Graph { span, .. } => f(span),
        TraceRecord::Name { .. } => {}
    }
}

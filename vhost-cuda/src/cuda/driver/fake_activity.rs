//! The fake driver's record of the GPU work it ran, standing in for CUPTI's activity API in
//! the unit tests: while a source is enabled, each launch, copy and memset it accepts becomes
//! an [`Activity`] with its kernel's name, its device and stream, and a made-up duration on the
//! real CLOCK_MONOTONIC (1 µs per KiB moved, 5 µs per kernel), linked to the request the
//! recorder had begun, as CUPTI's external correlation links them.

use std::sync::{Arc, Mutex, MutexGuard};

use qcuda_proto::trace::copy_kind;

use crate::cuda::trace::{monotonic_ns, Activity, ActivitySource, ActivitySpan};

/// What the fake driver has recorded.
#[derive(Debug, Default)]
pub(crate) struct FakeActivityLog {
    enabled: bool,
    /// The recorder's current request and the API-call id standing for it.
    request: Option<(u32, u64)>,
    next_call: u32,
    queued: Vec<Activity>,
    /// When the fake GPU is done with what it was given (work on it runs back to back).
    idle_at: u64,
    /// Enable calls so far (tests check that a disarmed recorder is not enabled).
    pub(crate) enables: usize,
}

/// The shared log, as the driver and its sources hold it.
pub(crate) type SharedLog = Arc<Mutex<FakeActivityLog>>;

pub(crate) fn lock(log: &SharedLog) -> MutexGuard<'_, FakeActivityLog> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the driver reports of one piece of work.
pub(crate) enum Work {
    Kernel {
        name: &'static str,
        grid: [u32; 3],
        block: [u32; 3],
    },
    Copy {
        kind: u8,
        bytes: u64,
    },
    Memset {
        bytes: u64,
    },
}

/// Notes `work` on `device`'s `stream` if a source is enabled.
pub(crate) fn note(log: &SharedLog, device: i32, stream: u64, work: Work) {
    let mut l = lock(log);
    if !l.enabled {
        return;
    }
    let took = match &work {
        Work::Kernel { .. } => 5_000,
        Work::Copy { bytes, .. } | Work::Memset { bytes } => 1_000 * bytes.div_ceil(1024).max(1),
    };
    let start = monotonic_ns().max(l.idle_at);
    let end = start + took;
    l.idle_at = end;
    let correlation = l.request.map_or(0, |(c, _)| c);
    let at = ActivitySpan {
        device: u32::try_from(device - 100).unwrap_or(0),
        stream,
        correlation,
        start,
        end,
    };
    let a = match work {
        Work::Kernel { name, grid, block } => Activity::Kernel {
            at,
            name: Arc::from(name),
            grid,
            block,
            shared_mem: 0,
        },
        Work::Copy { kind, bytes } => Activity::Copy { at, kind, bytes },
        Work::Memset { bytes } => Activity::Memset { at, bytes },
    };
    l.queued.push(a);
}

/// The copy kind of a `cuMemcpy` between two addresses of the fake device.
pub(crate) const DEVICE_COPY: u8 = copy_kind::DTOD;

/// A source over the fake driver's log.
#[derive(Debug)]
pub(crate) struct FakeSource(pub(crate) SharedLog);

impl ActivitySource for FakeSource {
    fn enable(&mut self) -> Result<(), String> {
        let mut l = lock(&self.0);
        l.enabled = true;
        l.enables += 1;
        Ok(())
    }

    fn disable(&mut self) {
        lock(&self.0).enabled = false;
    }

    fn begin_request(&mut self, id: u64) {
        let mut l = lock(&self.0);
        l.next_call += 1;
        let call = l.next_call;
        l.request = Some((call, id));
        l.queued.push(Activity::Request {
            correlation: call,
            id,
        });
    }

    fn end_request(&mut self) {
        lock(&self.0).request = None;
    }

    fn collect(&mut self, _flush: bool, sink: &mut dyn FnMut(Activity)) -> u64 {
        let taken = std::mem::take(&mut lock(&self.0).queued);
        for a in taken {
            sink(a);
        }
        0
    }
}

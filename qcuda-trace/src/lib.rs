// SPDX-License-Identifier: Apache-2.0 OR MIT
//! A guest process's GPU timeline as qcuda records it (`Op::GpuTrace`): the records a reader
//! gets from the host put together ([`Collector`], [`Trace`]), written as a Chrome/Perfetto
//! trace-event file (`chrome.rs`) and summed up for people (`summary.rs`).
//!
//! Readers: `qcuda-smi trace` and guest-lib at `cudaProfilerStop` (or exit) with
//! `QCUDA_PROFILE`. Times in the records are the host worker's CLOCK_MONOTONIC; a reader that
//! samples the host's clocks beside its own ([`ClockSample`]) can place them on the guest's
//! clocks too, which is how a trace is merged with one the guest made (docs/profiling.md).

mod chrome;
mod summary;

use std::collections::HashMap;

pub use chrome::chrome_json;
use qcuda_proto::trace::{
    HostClock, TraceRecord, TRACE_MAX_NAME, TRACE_RECORD_SIZE, TRACE_STATE_CUPTI,
    TRACE_STATE_EVENTS, TRACE_STATE_REQUESTS_ONLY,
};
pub use summary::{summary, KernelRow};

/// What a reader knows about the recording besides its records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceMeta {
    /// The guest process (its pid in the guest, 0 if not known) and its name.
    pub pid: u32,
    /// Its name (`/proc/PID/comm`), or empty.
    pub process: String,
    /// The host's `TRACE_STATE_*` bits of the recording.
    pub state: u64,
    /// Records the host lost (ring full, dropped by the GPU's profiling interface).
    pub lost: u64,
    /// ns the host recorded.
    pub recorded_ns: u64,
    /// The guest's clocks against the host's, if the reader sampled them.
    pub clocks: Option<ClockOffsets>,
}

impl TraceMeta {
    /// How GPU work was timed, for people.
    pub fn timing(&self) -> &'static str {
        if self.state & TRACE_STATE_CUPTI != 0 {
            "CUPTI"
        } else if self.state & TRACE_STATE_EVENTS != 0 {
            "CUDA events"
        } else if self.state & TRACE_STATE_REQUESTS_ONLY != 0 {
            "requests only"
        } else {
            "unknown"
        }
    }
}

/// One reading of the host's clocks beside the guest's: the guest's CLOCK_MONOTONIC and
/// CLOCK_REALTIME (ns) just before a `GpuTrace` request and just after its answer, and the
/// host worker's clocks in that answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockSample {
    /// Guest CLOCK_MONOTONIC before the request.
    pub guest_monotonic_before: u64,
    /// Guest CLOCK_MONOTONIC after the answer.
    pub guest_monotonic_after: u64,
    /// Guest CLOCK_REALTIME before the request.
    pub guest_realtime_before: u64,
    /// Guest CLOCK_REALTIME after the answer.
    pub guest_realtime_after: u64,
    /// The host's clocks in the answer.
    pub host: HostClock,
}

/// How to put a host time on the guest's clocks: guest clock = host CLOCK_MONOTONIC +
/// offset, within `error_ns` (half the round trip of the best sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockOffsets {
    /// Guest CLOCK_MONOTONIC minus host CLOCK_MONOTONIC, ns.
    pub monotonic_ns: i64,
    /// Guest CLOCK_REALTIME minus host CLOCK_MONOTONIC, ns.
    pub realtime_ns: i64,
    /// Half the round trip of the sample used: the most the offsets can be off by.
    pub error_ns: u64,
}

fn diff(a: u64, b: u64) -> i64 {
    i64::try_from(i128::from(a) - i128::from(b)).unwrap_or(0)
}

impl ClockOffsets {
    /// The offsets from the sample with the shortest round trip (the host's answer was taken
    /// at most half of it from the midpoint), as NTP picks its best sample.
    pub fn from_samples(samples: &[ClockSample]) -> Option<Self> {
        let best = samples
            .iter()
            .filter(|s| s.guest_monotonic_after >= s.guest_monotonic_before)
            .min_by_key(|s| s.guest_monotonic_after - s.guest_monotonic_before)?;
        let rtt = best.guest_monotonic_after - best.guest_monotonic_before;
        let mid_mono = best.guest_monotonic_before + rtt / 2;
        let mid_real = best.guest_realtime_before
            + best
                .guest_realtime_after
                .saturating_sub(best.guest_realtime_before)
                / 2;
        Some(Self {
            monotonic_ns: diff(mid_mono, best.host.monotonic_ns),
            realtime_ns: diff(mid_real, best.host.monotonic_ns),
            error_ns: rtt / 2,
        })
    }
}

/// A recording put together: its timed records in the order the host kept them, and the
/// kernel names they use.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Every record but the names.
    pub records: Vec<TraceRecord>,
    /// Kernel names by id (as the driver reports them: mangled C++ names).
    pub names: HashMap<u32, String>,
    /// What else is known.
    pub meta: TraceMeta,
}

impl Trace {
    /// The name of kernel id `id`, demangled where it is a C++ name.
    pub fn kernel_name(&self, id: u32) -> String {
        match self.names.get(&id) {
            Some(n) => demangle(n),
            None => format!("kernel #{id}"),
        }
    }

    /// The first start and the last end of every timed record, host ns (`None`: no record).
    pub fn span(&self) -> Option<(u64, u64)> {
        let mut spans = self.records.iter().filter_map(TraceRecord::span);
        let first = spans.next()?;
        Some(spans.fold((first.start, first.end), |(s, e), x| {
            (s.min(x.start), e.max(x.end))
        }))
    }
}

/// A C++ name for people (the name itself where it does not demangle).
pub fn demangle(name: &str) -> String {
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle().ok())
        .unwrap_or_else(|| name.to_string())
}

/// Puts records together as a reader gets them from one or more `TRACE_READ`s.
#[derive(Debug, Default)]
pub struct Collector {
    records: Vec<TraceRecord>,
    names: HashMap<u32, Vec<u8>>,
    /// Records that did not decode (a host of another version, or a broken one).
    pub refused: u64,
}

impl Collector {
    /// Adds the whole records of `bytes` (what one read returned).
    pub fn add(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks_exact(TRACE_RECORD_SIZE) {
            match TraceRecord::decode(chunk) {
                Ok(TraceRecord::Name {
                    id,
                    offset,
                    total,
                    len,
                    chunk,
                }) => {
                    let total = (total as usize).min(TRACE_MAX_NAME);
                    let name = self.names.entry(id).or_insert_with(|| vec![0; total]);
                    name.resize(total, 0);
                    let at = offset as usize;
                    let n = usize::from(len);
                    if let Some(dst) = name.get_mut(at..at + n) {
                        dst.copy_from_slice(&chunk[..n]);
                    }
                }
                Ok(r) => self.records.push(r),
                Err(_) => self.refused += 1,
            }
        }
    }

    /// Records so far (names not counted).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The trace.
    pub fn finish(self, meta: TraceMeta) -> Trace {
        Trace {
            records: self.records,
            names: self
                .names
                .into_iter()
                .map(|(id, b)| (id, String::from_utf8_lossy(&b).into_owned()))
                .collect(),
            meta,
        }
    }
}

/// The union of intervals (sorted here), ns.
pub fn union_ns(mut spans: Vec<(u64, u64)>) -> u64 {
    spans.sort_unstable();
    let mut total = 0u64;
    let mut until = 0u64;
    for (s, e) in spans {
        let from = s.max(until);
        if e > from {
            total += e - from;
        }
        until = until.max(e);
    }
    total
}

#[cfg(test)]
pub(crate) mod tests {
    use qcuda_proto::trace::{copy_kind, TraceSpan, TRACE_REQUEST_ASYNC};

    use super::*;

    pub(crate) fn span(start: u64, end: u64, stream: u64, correlation: u64) -> TraceSpan {
        TraceSpan {
            device: 0,
            start,
            end,
            stream,
            correlation,
        }
    }

    /// Two launches of one kernel and one of another, a copy, the requests behind them.
    pub(crate) fn sample() -> Trace {
        let mangled = "_Z4vaddPKfS0_Pfi";
        let mut c = Collector::default();
        let mut bytes = Vec::new();
        TraceRecord::name_records(1, mangled.as_bytes(), |r| bytes.extend(r.encode()));
        TraceRecord::name_records(2, b"gemm", |r| bytes.extend(r.encode()));
        let recs = [
            TraceRecord::Request {
                span: span(1_000, 3_000, 0, 1),
                op: qcuda_proto::Op::LaunchKernel as u32,
                flags: TRACE_REQUEST_ASYNC,
                status: 0,
                records: 0,
                batch: 0,
            },
            TraceRecord::Kernel {
                span: span(2_000, 12_000, 7, 1),
                name: 1,
                grid: [4, 1, 1],
                block: [256, 1, 1],
                shared_mem: 0,
            },
            TraceRecord::Kernel {
                span: span(12_000, 14_000, 7, 0),
                name: 1,
                grid: [4, 1, 1],
                block: [256, 1, 1],
                shared_mem: 0,
            },
            TraceRecord::Kernel {
                span: span(13_000, 43_000, 8, 0),
                name: 2,
                grid: [1, 1, 1],
                block: [32, 1, 1],
                shared_mem: 0,
            },
            TraceRecord::Copy {
                span: span(50_000, 60_000, 7, 0),
                kind: copy_kind::HTOD,
                bytes: 100_000,
            },
            TraceRecord::Request {
                span: span(45_000, 100_000, 0, 2),
                op: qcuda_proto::Op::StreamSynchronize as u32,
                flags: 0,
                status: 0,
                records: 0,
                batch: 0,
            },
        ];
        for r in recs {
            bytes.extend(r.encode());
        }
        c.add(&bytes);
        c.add(&[0xff; 64]);
        assert_eq!(c.refused, 1);
        c.finish(TraceMeta {
            pid: 812,
            process: "train".into(),
            state: TRACE_STATE_CUPTI,
            lost: 3,
            recorded_ns: 100_000,
            clocks: None,
        })
    }

    #[test]
    fn names_come_back_whole_and_demangled() {
        let t = sample();
        assert_eq!(t.names[&1], "_Z4vaddPKfS0_Pfi");
        assert_eq!(
            t.kernel_name(1),
            "vadd(float const*, float const*, float*, int)"
        );
        assert_eq!(t.kernel_name(2), "gemm");
        assert_eq!(t.kernel_name(9), "kernel #9");
        assert_eq!(t.span(), Some((1_000, 100_000)));
    }

    #[test]
    fn the_best_clock_sample_wins() {
        let host = HostClock {
            monotonic_ns: 5_000,
            realtime_ns: 0,
        };
        let samples = [
            ClockSample {
                guest_monotonic_before: 100_000,
                guest_monotonic_after: 140_000,
                guest_realtime_before: 1_000_000,
                guest_realtime_after: 1_040_000,
                host,
            },
            ClockSample {
                guest_monotonic_before: 200_000,
                guest_monotonic_after: 210_000,
                guest_realtime_before: 1_100_000,
                guest_realtime_after: 1_110_000,
                host,
            },
        ];
        let o = ClockOffsets::from_samples(&samples).unwrap();
        assert_eq!(o.error_ns, 5_000);
        assert_eq!(o.monotonic_ns, 205_000 - 5_000);
        assert_eq!(o.realtime_ns, 1_105_000 - 5_000);
        assert!(ClockOffsets::from_samples(&[]).is_none());
    }

    #[test]
    fn union_counts_overlaps_once() {
        assert_eq!(union_ns(vec![(10, 20), (0, 5), (15, 30), (40, 41)]), 26);
        assert_eq!(union_ns(vec![]), 0);
    }
}

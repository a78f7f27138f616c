// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `qcuda-smi trace`: a guest process's GPU timeline, recorded on the host where its GPU work
//! runs (`Op::GpuTrace`), written as a Chrome/Perfetto trace and summed up on the terminal; and
//! `qcuda-smi trace-merge`, which puts such a trace beside the CPU-side events of a trace the
//! guest made itself (torch.profiler's), on the guest's clock.
//!
//! Who may be traced is the kernel module's to say, as for CUDA's process checkpoint: the
//! caller's own processes, or any process of the VM for root; the host then only ever finds a
//! session of this VM (docs/SECURITY.md). The host keeps the records in a bounded ring; this
//! reads it twice a second while the window runs, so a busy program loses nothing unless it
//! makes more than the ring holds in half a second (`--records`).

use std::{
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use qcuda_proto::{
    ioctl::IoctlCall,
    status,
    trace::{
        HostClock, TRACE_ARM, TRACE_DISARM, TRACE_MAX_RECORDS, TRACE_READ, TRACE_RECORD_SIZE,
        TRACE_STATUS,
    },
    Direction, Op,
};
use qcuda_trace::{chrome_json, summary, ClockOffsets, ClockSample, Collector, TraceMeta};

use crate::device::{status_name, CallError, Device};

/// Records one read moves at most (4 MiB).
const READ_RECORDS: usize = 1 << 16;
/// How often the ring is emptied while recording.
const READ_EVERY: Duration = Duration::from_millis(500);
/// Longest window.
pub const MAX_SECONDS: u64 = 3600;

/// What `qcuda-smi trace` was asked.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// The guest process (its pid here).
    pub pid: u32,
    /// How long to record.
    pub seconds: u64,
    /// Where the trace goes (`None`: only the summary).
    pub output: Option<PathBuf>,
    /// The host's ring, in records (0: the host's default).
    pub records: u64,
}

/// One `GpuTrace` answer.
struct Answer {
    state: u64,
    written: usize,
    lost: u64,
    recorded_ns: u64,
    clock: ClockSample,
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one valid out-pointer; both clocks exist on Linux.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Why the host refused, for people.
fn refusal(pid: u32, e: &CallError) -> String {
    match e {
        CallError::Status(status::NOT_PERMITTED) => format!(
            "may not trace process {pid}: it is another user's (root may trace any process of \
             this VM)"
        ),
        CallError::Status(status::INVALID_VALUE) => {
            format!("no process {pid} here, or the host refused the request's sizes")
        }
        CallError::Status(status::INITIALIZATION_ERROR) => format!(
            "process {pid} has no qcuda session (it has not opened /dev/qcuda, or it ended)"
        ),
        CallError::Status(status::NOT_READY) => {
            format!("process {pid} has not used the GPU yet: nothing to record")
        }
        CallError::Status(status::NOT_SUPPORTED) => format!(
            "the host cannot record GPU timelines of process {pid} (vhost-cuda --gpu-trace cupti \
             without libcupti, or an older host): {}",
            status_name(status::NOT_SUPPORTED)
        ),
        e => format!("GPU trace of process {pid}: {e}"),
    }
}

/// One `GpuTrace` call for `pid` (`out`: the read buffer, for `TRACE_READ`).
fn call(
    dev: &Device,
    action: u64,
    pid: u32,
    records: u64,
    window_ms: u64,
    out: &mut [u8],
) -> Result<Answer, CallError> {
    let mut c = IoctlCall::new(Op::GpuTrace);
    c.args[..6].copy_from_slice(&[action, u64::from(pid), records, 0, 0, window_ms]);
    c.push(Direction::Out, out.as_mut_ptr() as u64, out.len() as u64)
        .map_err(|_| CallError::Ioctl(io::Error::other("the read buffer")))?;
    let before = (
        clock_ns(libc::CLOCK_MONOTONIC),
        clock_ns(libc::CLOCK_REALTIME),
    );
    // SAFETY: `out` is live and writable for its length until the call returns.
    unsafe { dev.call_checked(&mut c) }?;
    let after = (
        clock_ns(libc::CLOCK_MONOTONIC),
        clock_ns(libc::CLOCK_REALTIME),
    );
    let [state, written, _held, lost, mono, real, recorded] = c.rets;
    let written = usize::try_from(written)
        .ok()
        .filter(|&n| n * TRACE_RECORD_SIZE <= out.len())
        .ok_or_else(|| CallError::Ioctl(io::Error::other("the host wrote more than asked")))?;
    Ok(Answer {
        state,
        written,
        lost,
        recorded_ns: recorded,
        clock: ClockSample {
            guest_monotonic_before: before.0,
            guest_monotonic_after: after.0,
            guest_realtime_before: before.1,
            guest_realtime_after: after.1,
            host: HostClock {
                monotonic_ns: mono,
                realtime_ns: real,
            },
        },
    })
}

/// Reads what the host holds into `c`; returns the last answer.
fn drain(
    dev: &Device,
    pid: u32,
    buf: &mut [u8],
    c: &mut Collector,
    clocks: &mut Vec<ClockSample>,
) -> Result<Answer, CallError> {
    loop {
        let a = call(dev, TRACE_READ, pid, 0, 0, buf)?;
        clocks.push(a.clock);
        c.add(&buf[..a.written * TRACE_RECORD_SIZE]);
        if a.written < READ_RECORDS / 2 {
            return Ok(a);
        }
    }
}

/// The name of guest process `pid`.
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// `qcuda-smi trace`.
pub fn run(dev: &Device, o: &TraceOptions) -> Result<(), String> {
    if o.pid == 0 {
        return Err("--pid: a process id of this guest".into());
    }
    if o.seconds == 0 || o.seconds > MAX_SECONDS {
        return Err(format!("--seconds: 1 to {MAX_SECONDS}"));
    }
    if o.records > TRACE_MAX_RECORDS {
        return Err(format!("--records: at most {TRACE_MAX_RECORDS}"));
    }
    let mut buf = vec![0u8; READ_RECORDS * TRACE_RECORD_SIZE];
    let mut clocks = Vec::new();
    // The host ends the window itself a little after ours, should this process die.
    let window_ms = (o.seconds + 10) * 1000;
    let armed = call(dev, TRACE_ARM, o.pid, o.records, window_ms, &mut [0u8; 64])
        .map_err(|e| refusal(o.pid, &e))?;
    clocks.push(armed.clock);
    let mut c = Collector::default();
    let end = Instant::now() + Duration::from_secs(o.seconds);
    eprintln!(
        "qcuda-smi: recording process {} for {} s ...",
        o.pid, o.seconds
    );
    while Instant::now() < end {
        std::thread::sleep(READ_EVERY.min(end.saturating_duration_since(Instant::now())));
        drain(dev, o.pid, &mut buf, &mut c, &mut clocks).map_err(|e| refusal(o.pid, &e))?;
    }
    let stopped =
        call(dev, TRACE_DISARM, o.pid, 0, 0, &mut [0u8; 64]).map_err(|e| refusal(o.pid, &e))?;
    clocks.push(stopped.clock);
    let last = drain(dev, o.pid, &mut buf, &mut c, &mut clocks).map_err(|e| refusal(o.pid, &e))?;
    // Several samples: the shortest round trip places the host's clock best.
    for _ in 0..8 {
        if let Ok(a) = call(dev, TRACE_STATUS, o.pid, 0, 0, &mut [0u8; 64]) {
            clocks.push(a.clock);
        }
    }
    let refused = c.refused;
    let trace = c.finish(TraceMeta {
        pid: o.pid,
        process: process_name(o.pid),
        state: armed.state,
        lost: last.lost.max(stopped.lost),
        recorded_ns: last.recorded_ns.max(stopped.recorded_ns),
        clocks: ClockOffsets::from_samples(&clocks),
    });
    if refused > 0 {
        eprintln!("qcuda-smi: {refused} records from the host did not decode and were left out");
    }
    if let Some(path) = &o.output {
        std::fs::write(path, chrome_json(&trace))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!(
            "qcuda-smi: trace written to {} (open it in ui.perfetto.dev or chrome://tracing)",
            path.display()
        );
    }
    print!("{}", summary(&trace));
    Ok(())
}

/// `qcuda-smi trace-merge`: the events of `torch` (a Chrome trace the guest made, e.g.
/// torch.profiler's `export_chrome_trace`) with those of `qcuda` (`qcuda-smi trace -o` or
/// `QCUDA_PROFILE`), on `torch`'s time base, into `out`.
pub fn merge(torch: &Path, qcuda: &Path, out: &Path, clock: MergeClock) -> Result<(), String> {
    let read = |p: &Path| -> Result<serde_json::Value, String> {
        let text =
            std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", p.display()))
    };
    let mut t = read(torch)?;
    let q = read(qcuda)?;
    let merged = merge_values(&mut t, &q, clock)?;
    std::fs::write(out, serde_json::to_string(&t).map_err(|e| e.to_string())?)
        .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    eprintln!(
        "qcuda-smi: {merged} qcuda events merged into {} (host clock placed within ±{} µs)",
        out.display(),
        q["otherData"]["qcuda"]["clock_error_ns"]
            .as_u64()
            .map_or_else(|| "?".to_string(), |ns| (ns / 1000).to_string())
    );
    Ok(())
}

/// Which guest clock the other trace's timestamps are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MergeClock {
    /// CLOCK_REALTIME (torch.profiler's Kineto: µs since the epoch, or since its
    /// `baseTimeNanoseconds`).
    Realtime,
    /// CLOCK_MONOTONIC.
    Monotonic,
}

/// Process ids of merged qcuda events start here, clear of the guest's own.
const MERGED_PID_BASE: u64 = 1 << 40;

/// Appends `q`'s events to `t`'s, moved onto `t`'s time base; returns how many.
pub fn merge_values(
    t: &mut serde_json::Value,
    q: &serde_json::Value,
    clock: MergeClock,
) -> Result<usize, String> {
    let meta = &q["otherData"]["qcuda"];
    let base_host = meta["base_host_monotonic_ns"]
        .as_u64()
        .ok_or("the qcuda trace has no time base (otherData.qcuda.base_host_monotonic_ns)")?;
    let key = match clock {
        MergeClock::Realtime => "guest_realtime_offset_ns",
        MergeClock::Monotonic => "guest_monotonic_offset_ns",
    };
    let offset = meta[key].as_i64().ok_or(
        "the qcuda trace has no guest clock offsets (it was written without sampling the host's \
         clock: record it with qcuda-smi trace or QCUDA_PROFILE)",
    )?;
    // The other trace's ts are µs from its base (Kineto's baseTimeNanoseconds), else from 0.
    let other_base = t["baseTimeNanoseconds"].as_u64().unwrap_or(0);
    // ts_other (µs) = (host ns + offset - other_base) / 1000.
    let shift_ns = i128::from(base_host) + i128::from(offset) - i128::from(other_base);
    #[expect(clippy::cast_precision_loss, reason = "µs in a trace file are doubles")]
    let shift_us = shift_ns as f64 / 1000.0;
    let events = q["traceEvents"]
        .as_array()
        .ok_or("the qcuda trace has no traceEvents")?;
    let target = t
        .get_mut("traceEvents")
        .and_then(serde_json::Value::as_array_mut)
        .ok_or("the other trace has no traceEvents array")?;
    let mut n = 0;
    for e in events {
        let mut e = e.clone();
        if let Some(pid) = e["pid"].as_u64() {
            e["pid"] = (pid + MERGED_PID_BASE).into();
        }
        if let Some(ts) = e["ts"].as_f64() {
            e["ts"] = (ts + shift_us).into();
        }
        if e["ph"] == "M" && e["name"] == "process_name" {
            if let Some(name) = e["args"]["name"].as_str() {
                e["args"]["name"] = format!("qcuda: {name}").into();
            }
        }
        target.push(e);
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merged_events_land_on_the_other_traces_clock() {
        let mut torch = json!({
            "baseTimeNanoseconds": 1_700_000_000_000_000_000u64,
            "traceEvents": [{"ph": "X", "pid": 812, "tid": 812, "ts": 5.0, "dur": 1.0, "name": "aten::mm"}],
        });
        // Host monotonic 10 s = guest realtime 1_700_000_000.000_002 s.
        let q = json!({
            "traceEvents": [
                {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "guest process 812"}},
                {"ph": "X", "pid": 100, "tid": 7, "ts": 3.5, "dur": 2.0, "name": "gemm"},
            ],
            "otherData": {"qcuda": {
                "base_host_monotonic_ns": 10_000_000_000u64,
                "guest_realtime_offset_ns": 1_700_000_000_000_000_000i64 - 10_000_000_000 + 2_000,
                "guest_monotonic_offset_ns": 5,
                "clock_error_ns": 30_000,
            }},
        });
        assert_eq!(merge_values(&mut torch, &q, MergeClock::Realtime), Ok(2));
        let e = torch["traceEvents"].as_array().unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[2]["ts"].as_f64(), Some(5.5));
        assert_eq!(e[2]["pid"].as_u64(), Some(100 + MERGED_PID_BASE));
        assert_eq!(e[1]["args"]["name"], "qcuda: guest process 812");
        // Without offsets there is nothing to align on.
        let mut bare = json!({"traceEvents": []});
        let q2 = json!({"traceEvents": [], "otherData": {"qcuda": {"base_host_monotonic_ns": 1}}});
        merge_values(&mut bare, &q2, MergeClock::Monotonic).unwrap_err();
    }
}

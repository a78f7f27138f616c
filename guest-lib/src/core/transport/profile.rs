//! `QCUDA_PROFILE=FILE`: the process's GPU timeline, recorded on the host where its GPU work
//! runs (`Op::GpuTrace`), written to FILE as a Chrome/Perfetto trace (qcuda-trace).
//!
//! What is recorded: the whole run, from the first CUDA call to the exit, or, with
//! `QCUDA_PROFILE_RANGE=cudaProfilerApi` (Nsight Systems' name for it), only the regions
//! between `cudaProfilerStart`/`cuProfilerStart` and `cudaProfilerStop`/`cuProfilerStop`,
//! which programs already call around what they want profiled. Each stop reads what the host
//! recorded and writes the file again with everything so far, so the file is whole even if the
//! program never exits cleanly after it.
//!
//! Without `QCUDA_PROFILE` nothing here exists: the profiler calls send no request (a test
//! counts them), as natively they do nothing without a profiler attached.

use std::{path::PathBuf, sync::Mutex};

use qcuda_proto::{
    trace::{HostClock, TRACE_ARM, TRACE_DISARM, TRACE_READ, TRACE_RECORD_SIZE, TRACE_STATUS},
    Op,
};
use qcuda_trace::{chrome_json, ClockOffsets, ClockSample, Collector, TraceMeta};

use super::Call;
use crate::core::warnings::warn_once;

/// What a profile asks of the session it records for (session.rs): its `GpuTrace` requests
/// sent as they are, and the work batched so far sent first.
pub trait TraceChannel {
    /// Sends `call` (of `op`) at once; `Err` is the ioctl's errno.
    fn execute(&self, op: Op, call: &mut Call<'_>) -> Result<(), i32>;
    /// Sends the work batched so far.
    fn flush_batch(&self);
}

/// Records one read moves (1 MiB).
const READ_RECORDS: usize = 1 << 14;

/// Where and what to record.
#[derive(Debug)]
pub struct Profile {
    path: PathBuf,
    /// Only between the profiler API's start and stop.
    range_api: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    armed: bool,
    collector: Collector,
    clocks: Vec<ClockSample>,
    timing: u64,
    lost: u64,
    recorded_ns: u64,
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

impl Profile {
    /// From the environment: `QCUDA_PROFILE` names the file (unset or empty: no profile).
    pub fn from_env() -> Option<Self> {
        let path = std::env::var_os("QCUDA_PROFILE").filter(|p| !p.is_empty())?;
        let range_api = std::env::var("QCUDA_PROFILE_RANGE").is_ok_and(|v| v == "cudaProfilerApi");
        Some(Self::new(path.into(), range_api))
    }

    /// A profile into `path`; `range_api`: only between the profiler API's start and stop.
    pub fn new(path: PathBuf, range_api: bool) -> Self {
        Self {
            path,
            range_api,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One `GpuTrace` of this process; its answer's rets and the clocks around it.
    fn call(
        session: &impl TraceChannel,
        action: u64,
        out: &mut [u8],
    ) -> Option<([u64; 7], ClockSample)> {
        let before = (
            clock_ns(libc::CLOCK_MONOTONIC),
            clock_ns(libc::CLOCK_REALTIME),
        );
        let mut call = Call::new(Op::GpuTrace, 0).args(&[action]).output(out);
        call.wait_for_result();
        match session.execute(Op::GpuTrace, &mut call) {
            Ok(()) if call.reply().status == 0 => {}
            Ok(()) => {
                warn_once!(
                    "QCUDA_PROFILE: the host refused to record this process's GPU timeline \
                     (cudaError {}); nothing is recorded",
                    call.reply().status
                );
                return None;
            }
            Err(errno) => {
                warn_once!("QCUDA_PROFILE: GpuTrace failed (errno {errno}); nothing is recorded");
                return None;
            }
        }
        let after = (
            clock_ns(libc::CLOCK_MONOTONIC),
            clock_ns(libc::CLOCK_REALTIME),
        );
        let rets = call.reply().rets;
        Some((
            rets,
            ClockSample {
                guest_monotonic_before: before.0,
                guest_monotonic_after: after.0,
                guest_realtime_before: before.1,
                guest_realtime_after: after.1,
                host: HostClock {
                    monotonic_ns: rets[4],
                    realtime_ns: rets[5],
                },
            },
        ))
    }

    /// The session is open: a whole-run profile starts now.
    pub fn opened(&self, session: &impl TraceChannel) {
        if !self.range_api {
            self.start(session);
        }
    }

    /// `cudaProfilerStart`/`cuProfilerStart` (and the whole run's start).
    pub fn start(&self, session: &impl TraceChannel) {
        let mut st = self.lock();
        if st.armed {
            return;
        }
        let mut scratch = [0u8; 64];
        if let Some((rets, clock)) = Self::call(session, TRACE_ARM, &mut scratch) {
            st.armed = true;
            st.timing = rets[0];
            st.clocks.push(clock);
        }
    }

    /// `cudaProfilerStop`/`cuProfilerStop` (and the exit): reads what the host recorded and
    /// writes the file with every region so far.
    pub fn stop(&self, session: &impl TraceChannel) {
        let mut st = self.lock();
        if !st.armed {
            return;
        }
        st.armed = false;
        // The work issued so far is part of the region.
        session.flush_batch();
        let mut scratch = [0u8; 64];
        let Some((rets, clock)) = Self::call(session, TRACE_DISARM, &mut scratch) else {
            return;
        };
        st.clocks.push(clock);
        let mut buf = vec![0u8; READ_RECORDS * TRACE_RECORD_SIZE];
        while let Some((r, clock)) = Self::call(session, TRACE_READ, &mut buf) {
            st.clocks.push(clock);
            let n = usize::try_from(r[1]).unwrap_or(0).min(READ_RECORDS);
            st.collector.add(&buf[..n * TRACE_RECORD_SIZE]);
            if n == 0 {
                break;
            }
        }
        for _ in 0..4 {
            if let Some((_, clock)) = Self::call(session, TRACE_STATUS, &mut scratch) {
                st.clocks.push(clock);
            }
        }
        st.lost += rets[3];
        st.recorded_ns += rets[6];
        self.write(&mut st);
    }

    fn write(&self, st: &mut State) {
        let collector = std::mem::take(&mut st.collector);
        let trace = collector.finish(TraceMeta {
            pid: std::process::id(),
            process: std::fs::read_to_string("/proc/self/comm")
                .map(|s| s.trim_end().to_string())
                .unwrap_or_default(),
            state: st.timing,
            lost: st.lost,
            recorded_ns: st.recorded_ns,
            clocks: ClockOffsets::from_samples(&st.clocks),
        });
        if let Err(e) = std::fs::write(&self.path, chrome_json(&trace)) {
            warn_once!("QCUDA_PROFILE: cannot write {}: {e}", self.path.display());
        }
        // Kept for the next region: the file always holds every region so far.
        let mut again = Collector::default();
        let mut bytes = Vec::new();
        for (id, name) in &trace.names {
            qcuda_proto::trace::TraceRecord::name_records(*id, name.as_bytes(), |r| {
                bytes.extend_from_slice(&r.encode());
            });
        }
        for r in &trace.records {
            bytes.extend_from_slice(&r.encode());
        }
        again.add(&bytes);
        st.collector = again;
    }

    /// At exit: a region still open ends.
    pub fn exiting(&self, session: &impl TraceChannel) {
        self.stop(session);
    }
}

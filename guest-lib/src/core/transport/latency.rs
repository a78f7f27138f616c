//! Where a call's time goes, on request: with `QCUDA_LATENCY=1` in its environment, a program
//! prints at exit, per op, the mean time of its requests in guest-lib, in the ioctl, and the
//! host's share of that (`Op::HostLatency`: waiting for the session's thread, the hop to the
//! worker and back, the worker itself with its CUDA calls). The ioctl's remainder is the
//! transport: qcuda.ko, the virtqueue, the notification both ways and the wake-up.

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use qcuda_proto::{LatencyRecord, Op, LATENCY_RECORD_SIZE};

/// Sums for one op, guest side.
#[derive(Debug, Default, Clone, Copy)]
struct GuestSums {
    count: u64,
    /// In `Session::submit`, whole.
    submit: Duration,
    /// In the ioctl (0 for calls gathered into a batch).
    ioctl: Duration,
}

/// The guest's sums, per op; present only when `QCUDA_LATENCY=1`.
#[derive(Debug, Default)]
pub struct Latency {
    by_op: Mutex<BTreeMap<u32, GuestSums>>,
}

impl Latency {
    /// `Some` if the environment asks for the report.
    pub fn from_env() -> Option<Self> {
        std::env::var("QCUDA_LATENCY")
            .is_ok_and(|v| v == "1")
            .then(Self::default)
    }

    /// Adds one request of `op` that took `submit` in all, `ioctl` of it in the ioctl.
    pub fn record(&self, op: Op, submit: Duration, ioctl: Duration) {
        let mut m = self.by_op.lock().unwrap_or_else(|p| p.into_inner());
        let s = m.entry(op as u32).or_default();
        s.count += 1;
        s.submit += submit;
        s.ioctl += ioctl;
    }

    /// The report: one line per op, means in µs; `host` are the host's records.
    pub fn report(&self, host: &[LatencyRecord]) -> String {
        let m = self.by_op.lock().unwrap_or_else(|p| p.into_inner());
        let us = |d: f64| format!("{d:9.1}");
        let mut out = String::from(
            "qcuda latency per request (QCUDA_LATENCY=1), mean µs:\n\
             op                        count  guest-lib     ioctl transport     queue       hop    worker\n",
        );
        for (&op, g) in m.iter() {
            let n = g.count.max(1) as f64;
            let name = Op::from_u32(op).map_or_else(|| format!("{op:#x}"), |o| format!("{o:?}"));
            let ioctl = g.ioctl.as_secs_f64() * 1e6 / n;
            let lib = (g.submit.as_secs_f64() * 1e6 / n) - ioctl;
            let h = host.iter().find(|r| r.op == op);
            let (transport, queue, hop, worker) = match h {
                Some(r) if r.count > 0 && g.ioctl > Duration::ZERO => {
                    let hn = r.count as f64;
                    let per = |ns: u64| ns as f64 / 1e3 / hn;
                    (
                        us(ioctl - per(r.host_ns)),
                        us(per(r.queue_ns)),
                        us(per(r.hop_ns)),
                        us(per(r.worker_ns)),
                    )
                }
                _ => {
                    let dash = format!("{:>9}", "-");
                    (dash.clone(), dash.clone(), dash.clone(), dash)
                }
            };
            out.push_str(&format!(
                "{name:<24} {:>6} {} {} {} {} {} {}\n",
                g.count,
                us(lib),
                us(ioctl),
                transport,
                queue,
                hop,
                worker
            ));
        }
        out.push_str(
            "(guest-lib: in the runtime outside the ioctl; transport: the ioctl less the host's \
             time; Batch: a synchronising call that carried the gathered calls before it, which \
             are counted in their own rows with ioctl 0)\n",
        );
        out
    }
}

/// Decodes the host's `HostLatency` answer.
pub fn decode_host(bytes: &[u8], records: usize) -> Vec<LatencyRecord> {
    bytes
        .chunks_exact(LATENCY_RECORD_SIZE)
        .take(records)
        .filter_map(|c| LatencyRecord::decode(c).ok())
        .collect()
}

/// A timer for one request.
#[derive(Debug)]
pub struct Timer(Instant);

impl Timer {
    /// Starts now.
    pub fn start() -> Self {
        Self(Instant::now())
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

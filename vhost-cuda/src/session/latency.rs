//! `HostLatency`: where a session's requests spent their time on the host, per op.

use std::{collections::BTreeMap, time::Duration};

use qcuda_proto::{status, LatencyRecord, Op, ResponseHeader, LATENCY_RECORD_SIZE};

use crate::guest_buffer::Request;

/// Per-op sums of where a session's requests spent their time on the host.
#[derive(Debug, Default)]
pub(super) struct LatencyStats {
    by_op: BTreeMap<u32, LatencyRecord>,
}

pub(super) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl LatencyStats {
    pub(super) fn record(&mut self, op: Op, queue: u64, hop: (u64, u64), host: u64) {
        let r = self.by_op.entry(op as u32).or_insert(LatencyRecord {
            op: op as u32,
            ..LatencyRecord::default()
        });
        r.count += 1;
        r.queue_ns = r.queue_ns.saturating_add(queue);
        r.hop_ns = r.hop_ns.saturating_add(hop.0.saturating_sub(hop.1));
        r.worker_ns = r.worker_ns.saturating_add(hop.1);
        r.host_ns = r.host_ns.saturating_add(host);
    }

    /// `HostLatency`: the records, as many as fit.
    pub(super) fn answer(&self, req: &Request) -> ResponseHeader {
        let Some(out) = req.outputs().first() else {
            return ResponseHeader::with_status(status::INVALID_VALUE);
        };
        let fit = out.len() / LATENCY_RECORD_SIZE;
        let mut bytes = Vec::with_capacity(out.len());
        for r in self.by_op.values().take(fit) {
            bytes.extend_from_slice(&r.encode());
        }
        bytes.resize(out.len(), 0);
        if out.write_at(0, &bytes).is_err() {
            return ResponseHeader::with_status(status::INVALID_VALUE);
        }
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        resp.rets[0] = fit.min(self.by_op.len()) as u64;
        resp.rets[1] = self.by_op.len() as u64;
        resp
    }
}

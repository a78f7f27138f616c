//! The trace summed up for the terminal: the top kernels by total time (count, total, mean,
//! min, max), copy bandwidth per kind, and how busy the GPU was over the recording.

use std::{collections::BTreeMap, fmt::Write as _};

use qcuda_proto::trace::{copy_kind, TraceRecord, TRACE_REQUEST_ASYNC};

use crate::{union_ns, Trace};

/// Kernels shown in the table.
const TOP: usize = 15;
/// Widest name column.
const NAME_WIDTH: usize = 70;

/// One kernel (by name) over the recording, ns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRow {
    /// Its name, demangled.
    pub name: String,
    /// Launches recorded.
    pub count: u64,
    /// Total, least and most time, ns.
    pub total_ns: u64,
    /// Shortest.
    pub min_ns: u64,
    /// Longest.
    pub max_ns: u64,
}

impl KernelRow {
    /// Mean time, ns.
    pub fn mean_ns(&self) -> u64 {
        self.total_ns / self.count.max(1)
    }
}

/// Every kernel by total time, longest first.
pub fn kernel_rows(t: &Trace) -> Vec<KernelRow> {
    let mut by: BTreeMap<u32, KernelRow> = BTreeMap::new();
    for r in &t.records {
        if let TraceRecord::Kernel { span, name, .. } = r {
            let d = span.end - span.start;
            let e = by.entry(*name).or_insert_with(|| KernelRow {
                name: t.kernel_name(*name),
                count: 0,
                total_ns: 0,
                min_ns: u64::MAX,
                max_ns: 0,
            });
            e.count += 1;
            e.total_ns += d;
            e.min_ns = e.min_ns.min(d);
            e.max_ns = e.max_ns.max(d);
        }
    }
    let mut rows: Vec<KernelRow> = by.into_values().collect();
    rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
    rows
}

#[expect(clippy::cast_precision_loss, reason = "times for people")]
fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[expect(clippy::cast_precision_loss, reason = "times for people")]
fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

#[expect(clippy::cast_precision_loss, reason = "a fraction for people")]
fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

fn cut(name: &str) -> String {
    if name.chars().count() <= NAME_WIDTH {
        name.to_string()
    } else {
        let mut s: String = name.chars().take(NAME_WIDTH - 1).collect();
        s.push('…');
        s
    }
}

/// The summary, several lines.
pub fn summary(t: &Trace) -> String {
    let mut s = String::new();
    let m = &t.meta;
    let (first, last) = t.span().unwrap_or((0, 0));
    let window = m.recorded_ns.max(last - first);
    let who = if m.process.is_empty() {
        format!("pid {}", m.pid)
    } else {
        format!("pid {} ({})", m.pid, m.process)
    };
    let _ = writeln!(
        s,
        "qcuda trace of {who}: {:.3} s recorded, GPU times from {}, {} records, {} lost",
        ms(window) / 1e3,
        m.timing(),
        t.records.len(),
        m.lost
    );
    let mut kernels = Vec::new();
    let mut copies = Vec::new();
    let mut sets = Vec::new();
    let mut all = Vec::new();
    let mut by_kind: BTreeMap<u8, (u64, u64, u64)> = BTreeMap::new();
    let (mut memset_count, mut memset_bytes) = (0u64, 0u64);
    let (mut requests, mut waited, mut worker_ns) = (0u64, 0u64, 0u64);
    for r in &t.records {
        let Some(sp) = r.span() else { continue };
        let iv = (sp.start, sp.end);
        match r {
            TraceRecord::Kernel { .. } => kernels.push(iv),
            TraceRecord::Copy { kind, bytes, .. } => {
                copies.push(iv);
                let e = by_kind.entry(*kind).or_default();
                e.0 += 1;
                e.1 += bytes;
                e.2 += sp.end - sp.start;
            }
            TraceRecord::Memset { bytes, .. } => {
                sets.push(iv);
                memset_count += 1;
                memset_bytes += bytes;
            }
            TraceRecord::Graph { .. } => kernels.push(iv),
            TraceRecord::Request { flags, .. } => {
                requests += 1;
                if flags & TRACE_REQUEST_ASYNC == 0 {
                    waited += 1;
                }
                worker_ns += sp.end - sp.start;
            }
            _ => {}
        }
        if r.is_gpu_work() {
            all.push(iv);
        }
    }
    let busy = union_ns(all);
    let _ = writeln!(
        s,
        "GPU busy: {:.1}% of the recording ({:.3} ms; kernels {:.3} ms, copies {:.3} ms, \
         memsets {:.3} ms)",
        pct(busy, window),
        ms(busy),
        ms(union_ns(kernels)),
        ms(union_ns(copies)),
        ms(union_ns(sets))
    );
    let _ = writeln!(
        s,
        "requests: {requests} ({waited} waited for), {:.3} ms in the host worker",
        ms(worker_ns)
    );
    let rows = kernel_rows(t);
    if rows.is_empty() {
        let _ = writeln!(s, "no kernels recorded");
    } else {
        let _ = writeln!(
            s,
            "top kernels by total time ({} of {}):\n{:>11} {:>8} {:>11} {:>11} {:>11} {:>6}  name",
            rows.len().min(TOP),
            rows.len(),
            "total ms",
            "count",
            "mean us",
            "min us",
            "max us",
            "gpu %"
        );
        for r in rows.iter().take(TOP) {
            let _ = writeln!(
                s,
                "{:>11.3} {:>8} {:>11.3} {:>11.3} {:>11.3} {:>6.1}  {}",
                ms(r.total_ns),
                r.count,
                us(r.mean_ns()),
                us(r.min_ns),
                us(r.max_ns),
                pct(r.total_ns, window),
                cut(&r.name)
            );
        }
    }
    if !by_kind.is_empty() {
        let _ = writeln!(
            s,
            "copies:\n{:>6} {:>8} {:>14} {:>11} {:>9}",
            "kind", "count", "bytes", "total ms", "GB/s"
        );
        for (kind, (n, bytes, ns)) in by_kind {
            #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
            let rate = if ns > 0 {
                bytes as f64 / ns as f64
            } else {
                0.0
            };
            let _ = writeln!(
                s,
                "{:>6} {n:>8} {bytes:>14} {:>11.3} {rate:>9.2}",
                copy_kind::name(kind),
                ms(ns)
            );
        }
    }
    if memset_count > 0 {
        let _ = writeln!(s, "memsets: {memset_count}, {memset_bytes} bytes");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::sample;

    #[test]
    fn the_table_ranks_kernels_and_rates_copies() {
        let t = sample();
        let rows = kernel_rows(&t);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].name, "gemm");
        assert_eq!((rows[0].count, rows[0].total_ns), (1, 30_000));
        assert_eq!(rows[1].count, 2);
        assert_eq!(
            (
                rows[1].total_ns,
                rows[1].min_ns,
                rows[1].max_ns,
                rows[1].mean_ns()
            ),
            (12_000, 2_000, 10_000, 6_000)
        );
        let s = summary(&t);
        assert!(s.contains("GPU times from CUPTI, 6 records, 3 lost"), "{s}");
        // Busy: 2..43 µs of kernels and 50..60 µs of copy, over 100 µs recorded (99 µs of
        // records, the host's 100 µs the longer).
        assert!(s.contains("GPU busy: 51.0% of the recording"), "{s}");
        assert!(
            s.contains("HtoD        1         100000       0.010     10.00"),
            "{s}"
        );
        assert!(s.contains("requests: 2 (1 waited for)"), "{s}");
        let gemm = s.lines().position(|l| l.ends_with("  gemm")).unwrap();
        let vadd = s.lines().position(|l| l.contains("vadd(")).unwrap();
        assert!(gemm < vadd);
    }
}

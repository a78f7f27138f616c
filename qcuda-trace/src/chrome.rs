//! The trace as Chrome's trace-event JSON, which chrome://tracing and ui.perfetto.dev open.
//!
//! Layout: process 1 is the guest process as its host worker saw it, with its requests on
//! thread 1 (a batch's records nested in the batch) and, from CUPTI, the synchronisations the
//! worker waited in on thread 2; process 100 + N is GPU N, one thread per stream (the
//! driver's stream id). Every piece of work is a complete ("X") event, `ts` and `dur` in µs
//! from the first record, ordered by time on each track; a flow arrow ("s" to "f") goes from
//! each request to the GPU work it issued, whose `args.request` names it too. `otherData.qcuda`
//! carries the time base: the host CLOCK_MONOTONIC of ts 0 and, where the reader measured
//! them, the offsets that put it on the guest's clocks (docs/profiling.md).

use std::{collections::HashMap, fmt::Write as _};

use qcuda_proto::{
    trace::{copy_kind, sync_kind, TraceRecord, TRACE_REQUEST_ASYNC, TRACE_REQUEST_IN_BATCH},
    Op,
};

use crate::Trace;

/// Process id of the guest process's track in the trace.
pub const REQUEST_PID: u64 = 1;
/// Process id of GPU 0's track (GPU N is this + N).
pub const GPU_PID: u64 = 100;

/// `s` as a JSON string.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// ns as µs with three decimals (the trace format's unit).
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn op_name(op: u32) -> String {
    Op::from_u32(op).map_or_else(|| format!("op {op:#x}"), |o| format!("{o:?}"))
}

/// One event, and where it sorts.
struct Event {
    pid: u64,
    tid: u64,
    ts: u64,
    /// Longer first at the same start, so that enclosing slices come before what they hold.
    dur: u64,
    json: String,
}

/// The whole trace as one JSON object.
pub fn chrome_json(t: &Trace) -> String {
    let base = t.span().map_or(0, |(s, _)| s);
    let rel = |ns: u64| ns.saturating_sub(base);
    let mut events: Vec<Event> = Vec::new();
    let mut threads: HashMap<(u64, u64), String> = HashMap::new();
    // Where each request starts, for the flows to its GPU work.
    let requests: HashMap<u64, u64> = t
        .records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Request { span, .. } => Some((span.correlation, span.start)),
            _ => None,
        })
        .collect();
    let mut flows = Vec::new();
    for r in &t.records {
        let Some(s) = r.span() else { continue };
        let dur = s.end.saturating_sub(s.start);
        let (pid, tid, name, cat, args) = match r {
            TraceRecord::Request {
                op,
                flags,
                status,
                records,
                batch,
                ..
            } => {
                let mut a = format!(
                    "\"seq\":{},\"status\":{status},\"stream\":{},\"async\":{}",
                    s.correlation,
                    s.stream,
                    flags & TRACE_REQUEST_ASYNC != 0
                );
                if *records > 0 {
                    let _ = write!(a, ",\"records\":{records}");
                }
                if flags & TRACE_REQUEST_IN_BATCH != 0 {
                    let _ = write!(a, ",\"batch\":{batch}");
                }
                threads.insert((REQUEST_PID, 1), "requests (host worker)".into());
                (REQUEST_PID, 1, op_name(*op), "request", a)
            }
            TraceRecord::Sync { kind, .. } => {
                threads.insert((REQUEST_PID, 2), "synchronisations (host worker)".into());
                (
                    REQUEST_PID,
                    2,
                    sync_kind::name(*kind).to_string(),
                    "sync",
                    format!("\"request\":{},\"stream\":{}", s.correlation, s.stream),
                )
            }
            TraceRecord::Kernel {
                name,
                grid,
                block,
                shared_mem,
                ..
            } => {
                let mut a = format!(
                    "\"grid\":\"{}x{}x{}\",\"block\":\"{}x{}x{}\",\"shared_mem\":{shared_mem},\
                     \"request\":{}",
                    grid[0], grid[1], grid[2], block[0], block[1], block[2], s.correlation
                );
                if let Some(m) = t.names.get(name) {
                    let _ = write!(a, ",\"mangled\":{}", json_string(m));
                }
                (
                    GPU_PID + u64::from(s.device),
                    s.stream,
                    t.kernel_name(*name),
                    "kernel",
                    a,
                )
            }
            TraceRecord::Copy { kind, bytes, .. } => {
                #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
                let rate = if dur > 0 {
                    *bytes as f64 / dur as f64
                } else {
                    0.0
                };
                (
                    GPU_PID + u64::from(s.device),
                    s.stream,
                    format!("Memcpy {}", copy_kind::name(*kind)),
                    "memcpy",
                    format!(
                        "\"bytes\":{bytes},\"GB/s\":{rate:.3},\"request\":{}",
                        s.correlation
                    ),
                )
            }
            TraceRecord::Memset { bytes, .. } => (
                GPU_PID + u64::from(s.device),
                s.stream,
                "Memset".to_string(),
                "memset",
                format!("\"bytes\":{bytes},\"request\":{}", s.correlation),
            ),
            TraceRecord::Graph { graph, .. } => (
                GPU_PID + u64::from(s.device),
                s.stream,
                format!("Graph {graph}"),
                "graph",
                format!("\"request\":{}", s.correlation),
            ),
            TraceRecord::Name { .. } => continue,
        };
        if pid >= GPU_PID {
            threads
                .entry((pid, tid))
                .or_insert_with(|| format!("stream {tid}"));
            if let Some(&from) = requests.get(&s.correlation).filter(|_| s.correlation != 0) {
                flows.push((from, pid, tid, s.start));
            }
        }
        events.push(Event {
            pid,
            tid,
            ts: s.start,
            dur,
            json: format!(
                "{{\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"dur\":{},\"name\":{},\
                 \"cat\":\"{cat}\",\"args\":{{{args}}}}}",
                us(rel(s.start)),
                us(dur),
                json_string(&name)
            ),
        });
    }
    for (id, (from, pid, tid, at)) in flows.into_iter().enumerate() {
        let id = id + 1;
        events.push(Event {
            pid: REQUEST_PID,
            tid: 1,
            ts: from,
            dur: 0,
            json: format!(
                "{{\"ph\":\"s\",\"pid\":{REQUEST_PID},\"tid\":1,\"ts\":{},\"id\":{id},\
                 \"name\":\"issued\",\"cat\":\"flow\"}}",
                us(rel(from))
            ),
        });
        events.push(Event {
            pid,
            tid,
            ts: at,
            dur: 0,
            json: format!(
                "{{\"ph\":\"f\",\"bp\":\"e\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"id\":{id},\
                 \"name\":\"issued\",\"cat\":\"flow\"}}",
                us(rel(at))
            ),
        });
    }
    events.sort_by(|a, b| {
        (a.pid, a.tid, a.ts)
            .cmp(&(b.pid, b.tid, b.ts))
            .then(b.dur.cmp(&a.dur))
    });
    let m = &t.meta;
    let mut out = String::from("{\"traceEvents\":[\n");
    let process = if m.process.is_empty() {
        format!("guest process {} (host worker)", m.pid)
    } else {
        format!("guest process {} {} (host worker)", m.pid, m.process)
    };
    let mut meta = vec![format!(
        "{{\"ph\":\"M\",\"pid\":{REQUEST_PID},\"name\":\"process_name\",\"args\":{{\"name\":{}}}}}",
        json_string(&process)
    )];
    let mut gpus: Vec<u64> = threads
        .keys()
        .map(|k| k.0)
        .filter(|&p| p >= GPU_PID)
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    for p in gpus {
        meta.push(format!(
            "{{\"ph\":\"M\",\"pid\":{p},\"name\":\"process_name\",\"args\":{{\"name\":\"GPU {}\"}}}}",
            p - GPU_PID
        ));
    }
    let mut named: Vec<_> = threads.into_iter().collect();
    named.sort();
    for ((pid, tid), name) in named {
        meta.push(format!(
            "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
            json_string(&name)
        ));
    }
    let all: Vec<String> = meta
        .into_iter()
        .chain(events.into_iter().map(|e| e.json))
        .collect();
    out.push_str(&all.join(",\n"));
    let clocks = m.clocks.map_or_else(String::new, |c| {
        format!(
            ",\"guest_monotonic_offset_ns\":{},\"guest_realtime_offset_ns\":{},\"clock_error_ns\":{}",
            c.monotonic_ns, c.realtime_ns, c.error_ns
        )
    });
    let _ = write!(
        out,
        "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"qcuda\":{{\"version\":1,\"pid\":{},\
         \"process\":{},\"timing\":\"{}\",\"lost_records\":{},\"recorded_ns\":{},\
         \"base_host_monotonic_ns\":{base}{clocks}}}}}}}\n",
        m.pid,
        json_string(&m.process),
        m.timing(),
        m.lost,
        m.recorded_ns
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::sample;

    /// What a trace viewer needs of it: valid JSON, the fields of each phase, µs units,
    /// monotonic time on every track. Parsed with a small reader of its own (the crate has no
    /// JSON library): the format written is one event per line.
    #[test]
    fn the_trace_is_valid_json_viewers_read() {
        let t = sample();
        let j = chrome_json(&t);
        assert!(j.starts_with("{\"traceEvents\":[\n"));
        assert!(j.trim_end().ends_with('}'));
        let v: serde_json::Value = serde_json::from_str(&j).expect("valid JSON");
        assert!(v["traceEvents"].as_array().is_some_and(|e| e.len() == 13));
        assert_eq!(v["displayTimeUnit"], "ms");
        // Balanced braces and brackets outside strings.
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        for c in j.chars() {
            match (in_str, esc, c) {
                (true, true, _) => esc = false,
                (true, false, '\\') => esc = true,
                (true, false, '"') => in_str = false,
                (false, _, '"') => in_str = true,
                (false, _, '{' | '[') => depth += 1,
                (false, _, '}' | ']') => depth -= 1,
                _ => {}
            }
            assert!(depth >= 0);
        }
        assert_eq!(depth, 0);
        let lines: Vec<&str> = j.lines().filter(|l| l.starts_with("{\"ph\"")).collect();
        let field = |l: &str, k: &str| -> Option<String> {
            let at = l.find(&format!("\"{k}\":"))? + k.len() + 3;
            let rest = &l[at..];
            let end = rest.find([',', '}']).unwrap_or(rest.len());
            Some(rest[..end].trim_matches('"').to_string())
        };
        let mut last: HashMap<(String, String), f64> = HashMap::new();
        let (mut x, mut flows_s, mut flows_f, mut metadata) = (0, 0, 0, 0);
        for l in &lines {
            match field(l, "ph").unwrap().as_str() {
                "M" => metadata += 1,
                "X" => {
                    x += 1;
                    let ts: f64 = field(l, "ts").unwrap().parse().unwrap();
                    let dur: f64 = field(l, "dur").unwrap().parse().unwrap();
                    assert!(ts >= 0.0 && dur >= 0.0, "{l}");
                    assert!(field(l, "name").is_some() && field(l, "pid").is_some());
                    let key = (field(l, "pid").unwrap(), field(l, "tid").unwrap());
                    let prev = last.insert(key, ts).unwrap_or(0.0);
                    assert!(ts >= prev, "monotonic per track: {l}");
                }
                "s" => flows_s += 1,
                "f" => {
                    flows_f += 1;
                    assert_eq!(field(l, "bp").as_deref(), Some("e"));
                }
                p => panic!("phase {p}"),
            }
        }
        assert_eq!(x, 6);
        // The one kernel whose request is known has its flow.
        assert_eq!((flows_s, flows_f), (1, 1));
        // Processes: the guest's, GPU 0; threads: requests, streams 7 and 8.
        assert_eq!(metadata, 5);
        // µs: the first kernel starts 1 µs after the first request and lasts 10 µs.
        assert!(j.contains("\"ts\":1.000,\"dur\":10.000,\"name\":\"vadd(float const*, float const*, float*, int)\""));
        assert!(j.contains("\"mangled\":\"_Z4vaddPKfS0_Pfi\""));
        assert!(j.contains("\"base_host_monotonic_ns\":1000"));
        assert!(j.contains("\"lost_records\":3"));
        assert!(j.contains("\"GB/s\":10.000"));
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }
}

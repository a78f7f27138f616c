//! The GPU timeline recorder over the fake driver: what a recording holds, its bounds, the
//! event timer where no profiling interface is, and that nothing runs when none is armed.

use qcuda_proto::trace::{
    copy_kind, TraceRecord, TRACE_ARM, TRACE_DISARM, TRACE_MAX_RECORDS, TRACE_MAX_WINDOW_MS,
    TRACE_READ, TRACE_RECORD_SIZE, TRACE_REQUEST_IN_BATCH, TRACE_STATE_ARMED, TRACE_STATE_CUPTI,
    TRACE_STATE_EVENTS, TRACE_STATE_REQUESTS_ONLY, TRACE_STATUS,
};

use super::*;
use crate::cuda::trace::GpuTraceMode;

fn trace(s: &mut GpuState, action: u64, capacity: u64, window_ms: u64) -> ResponseHeader {
    s.execute(&req(
        Op::GpuTrace,
        0,
        &[action, 0, capacity, 1, 0, window_ms],
        vec![],
        vec![GuestBuffer::new(Arc::new(GuestRam::new()), []).unwrap()],
    ))
}

/// Reads every record (in reads of `records` records at most).
fn read_all(rig: &mut Rig, s: &mut GpuState, records: usize) -> Vec<TraceRecord> {
    let mut all = Vec::new();
    loop {
        let out = rig.out(records * TRACE_RECORD_SIZE);
        let r = s.execute(&req(
            Op::GpuTrace,
            0,
            &[TRACE_READ],
            vec![],
            vec![out.clone()],
        ));
        let n = usize::try_from(ok(r)[1]).unwrap();
        let bytes = out.to_vec().unwrap();
        all.extend(
            bytes[..n * TRACE_RECORD_SIZE]
                .chunks_exact(TRACE_RECORD_SIZE)
                .map(|c| TraceRecord::decode(c).unwrap()),
        );
        if n == 0 {
            return all;
        }
    }
}

/// vadd's function and three buffers of 100 floats, with a parameter block for them.
fn vadd(rig: &mut Rig, s: &mut GpuState) -> (u64, u64, GuestBuffer) {
    let m = load_module(rig, s);
    let f = ok(get_function(rig, s, m, "vadd", 64).0)[0];
    let (a, b, c) = (malloc(s, 400), malloc(s, 400), malloc(s, 400));
    let mut block = Vec::new();
    for p in [a, b, c] {
        block.extend_from_slice(&p.to_le_bytes());
    }
    block.extend_from_slice(&100i32.to_le_bytes());
    (f, a, rig.buf(&block))
}

fn name_of(records: &[TraceRecord], id: u32) -> String {
    let mut name = Vec::new();
    for r in records {
        if let TraceRecord::Name {
            id: i, len, chunk, ..
        } = r
        {
            if *i == id {
                name.extend_from_slice(&chunk[..usize::from(*len)]);
            }
        }
    }
    String::from_utf8(name).unwrap()
}

#[test]
fn a_recording_links_requests_to_their_kernels_and_copies() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let (f, a, block) = vadd(&mut rig, &mut s);
    let armed = ok(trace(&mut s, TRACE_ARM, 0, 0));
    assert_eq!(armed[0], TRACE_STATE_ARMED | TRACE_STATE_CUPTI);
    assert!(armed[4] > 0 && armed[5] > armed[4], "the clocks: {armed:?}");
    ok(htod(&mut rig, &mut s, a, &[7u8; 4000][..400], &[400]));
    let args = launch_args(f, [2, 1, 1], [64, 1, 1], 0);
    ok(s.execute(&fire_and_forget(req(
        Op::LaunchKernel,
        0,
        &args,
        vec![block],
        vec![],
    ))));
    let (r, _) = dtoh(&mut rig, &mut s, a, 400, &[400]);
    ok(r);
    let st = ok(trace(&mut s, TRACE_DISARM, 0, 0));
    assert_eq!(st[0], TRACE_STATE_CUPTI, "disarmed");
    assert_eq!(st[3], 0, "nothing lost");
    // Not recorded any more.
    malloc(&mut s, 64);
    let recs = read_all(&mut rig, &mut s, 128);
    let requests: Vec<(u32, u64, u64, u64)> = recs
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Request { span, op, .. } => {
                Some((*op, span.correlation, span.start, span.end))
            }
            _ => None,
        })
        .collect();
    let ops: Vec<u32> = requests.iter().map(|r| r.0).collect();
    assert_eq!(
        ops,
        [Op::MemcpyHtoD, Op::LaunchKernel, Op::MemcpyDtoH].map(|o| o as u32),
        "{recs:?}"
    );
    assert!(requests.iter().all(|r| r.2 <= r.3));
    assert!(requests.windows(2).all(|w| w[0].3 <= w[1].2), "in order");
    let seq_of = |op: Op| requests.iter().find(|r| r.0 == op as u32).unwrap().1;
    let kernel = recs
        .iter()
        .find_map(|r| match r {
            TraceRecord::Kernel {
                span,
                name,
                grid,
                block,
                ..
            } => Some((*span, *name, *grid, *block)),
            _ => None,
        })
        .expect("the kernel");
    assert_eq!(name_of(&recs, kernel.1), "vadd");
    assert_eq!(kernel.2, [2, 1, 1]);
    assert_eq!(kernel.3, [64, 1, 1]);
    assert_eq!(kernel.0.correlation, seq_of(Op::LaunchKernel));
    assert!(kernel.0.end > kernel.0.start);
    let copies: Vec<(u8, u64, u64)> = recs
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Copy { span, kind, bytes } => Some((*kind, *bytes, span.correlation)),
            _ => None,
        })
        .collect();
    assert_eq!(
        copies,
        [
            (copy_kind::HTOD, 400, seq_of(Op::MemcpyHtoD)),
            (copy_kind::DTOH, 400, seq_of(Op::MemcpyDtoH)),
        ]
    );
    // The name came before its kernel.
    let first_name = recs
        .iter()
        .position(|r| matches!(r, TraceRecord::Name { .. }))
        .unwrap();
    let first_kernel = recs
        .iter()
        .position(|r| matches!(r, TraceRecord::Kernel { .. }))
        .unwrap();
    assert!(first_name < first_kernel);
}

#[test]
fn records_of_a_batch_name_their_batch() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let dst = malloc(&mut s, 64);
    ok(trace(&mut s, TRACE_ARM, 0, 0));
    let bytes = batch_bytes(&[
        (Op::Memset, &[dst, 9, 64, 0], &[]),
        (Op::MemcpyDtoD, &[dst + 32, dst, 16, 0], &[]),
    ]);
    let b = rig.buf(&bytes);
    ok(s.execute(&req(Op::Batch, 0, &[2], vec![b], vec![])));
    let recs = read_all(&mut rig, &mut s, 128);
    let batch = recs
        .iter()
        .find_map(|r| match r {
            TraceRecord::Request {
                op, span, records, ..
            } if *op == Op::Batch as u32 => Some((span.correlation, *records)),
            _ => None,
        })
        .unwrap();
    assert_eq!(batch.1, 2);
    let inner: Vec<u32> = recs
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Request {
                op,
                flags,
                batch: b,
                ..
            } if flags & TRACE_REQUEST_IN_BATCH != 0 => {
                assert_eq!(*b, batch.0);
                Some(*op)
            }
            _ => None,
        })
        .collect();
    assert_eq!(inner, [Op::Memset as u32, Op::MemcpyDtoD as u32]);
    let memset = recs
        .iter()
        .find_map(|r| match r {
            TraceRecord::Memset { bytes, span } => Some((*bytes, span.correlation)),
            _ => None,
        })
        .unwrap();
    assert_eq!(memset.0, 64);
    assert_ne!(memset.1, batch.0, "linked to its own record of the batch");
}

#[test]
fn a_ring_nobody_reads_drops_and_counts() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    ok(trace(&mut s, TRACE_ARM, 4, 0));
    for _ in 0..20 {
        malloc(&mut s, 64);
    }
    let st = ok(trace(&mut s, TRACE_STATUS, 0, 0));
    assert_eq!(st[2], 4, "held");
    assert_eq!(st[3], 16, "dropped");
    // The oldest stay: the first four Mallocs.
    assert_eq!(read_all(&mut rig, &mut s, 128).len(), 4);
    // A new arm starts afresh.
    let st = ok(trace(&mut s, TRACE_ARM, 0, 0));
    assert_eq!((st[2], st[3]), (0, 0));
}

#[test]
fn hostile_arguments_are_refused() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let bad = status::INVALID_VALUE;
    assert_eq!(
        trace(&mut s, TRACE_ARM, TRACE_MAX_RECORDS + 1, 0).status,
        bad
    );
    assert_eq!(
        trace(&mut s, TRACE_ARM, 0, TRACE_MAX_WINDOW_MS + 1).status,
        bad
    );
    assert_eq!(trace(&mut s, 9, 0, 0).status, bad);
    ok(trace(&mut s, TRACE_ARM, 0, 0));
    // Too small for the longest name, or not whole records.
    for len in [0, 64, 127 * 64, 128 * 64 + 1] {
        let out = rig.out(len);
        let r = s.execute(&req(Op::GpuTrace, 0, &[TRACE_READ], vec![], vec![out]));
        assert_eq!(r.status, bad, "{len}");
    }
    // Nothing armed: status and reads answer empty.
    let mut other = rig.session();
    assert_eq!(ok(trace(&mut other, TRACE_STATUS, 0, 0))[..4], [0; 4]);
    assert!(read_all(&mut rig, &mut other, 128).is_empty());
    ok(trace(&mut other, TRACE_DISARM, 0, 0));
}

#[test]
fn events_time_ops_where_no_profiling_interface_is() {
    let mut rig = Rig::with_fake(FakeDriver::new(1).without_activity());
    rig.host.set_trace_mode(GpuTraceMode::Events);
    let mut s = rig.session();
    let (f, a, block) = vadd(&mut rig, &mut s);
    let st = ok(trace(&mut s, TRACE_ARM, 0, 0));
    assert_eq!(st[0], TRACE_STATE_ARMED | TRACE_STATE_EVENTS);
    let args = launch_args(f, [1, 1, 1], [32, 1, 1], 0);
    ok(s.execute(&req(Op::LaunchKernel, 0, &args, vec![block], vec![])));
    ok(run(&mut s, Op::Memset, &[a, 0, 100, 0, 4]));
    ok(trace(&mut s, TRACE_DISARM, 0, 0));
    let recs = read_all(&mut rig, &mut s, 128);
    let kernel = recs
        .iter()
        .find_map(|r| match r {
            TraceRecord::Kernel { span, name, .. } => Some((*span, *name)),
            _ => None,
        })
        .expect("a kernel timed by events");
    assert_eq!(name_of(&recs, kernel.1), "vadd");
    // The fake driver's cuEventElapsedTime is 2.5 ms.
    assert_eq!(kernel.0.end - kernel.0.start, 2_500_000);
    let memset = recs
        .iter()
        .find_map(|r| match r {
            TraceRecord::Memset { bytes, .. } => Some(*bytes),
            _ => None,
        })
        .unwrap();
    assert_eq!(memset, 400);
    // Every event and the timer's stream were given back.
    assert_eq!(
        rig.fake.calls("event_create"),
        rig.fake.calls("event_destroy")
    );
    assert_eq!(
        rig.fake.calls("stream_create"),
        rig.fake.calls("stream_destroy")
    );
}

#[test]
fn off_records_requests_only_and_nothing_runs_unarmed() {
    let mut rig = Rig::new(1);
    rig.host.set_trace_mode(GpuTraceMode::Off);
    let mut s = rig.session();
    malloc(&mut s, 64);
    assert_eq!(
        rig.fake.activity_enables(),
        0,
        "nothing armed: nothing enabled"
    );
    let st = ok(trace(&mut s, TRACE_ARM, 0, 0));
    assert_eq!(st[0], TRACE_STATE_ARMED | TRACE_STATE_REQUESTS_ONLY);
    assert_eq!(rig.fake.activity_enables(), 0);
    let a = malloc(&mut s, 64);
    ok(run(&mut s, Op::Memset, &[a, 0, 64, 0, 1]));
    let recs = read_all(&mut rig, &mut s, 128);
    assert_eq!(recs.len(), 2);
    assert!(recs
        .iter()
        .all(|r| matches!(r, TraceRecord::Request { .. })));
}

#[test]
fn the_window_ends_the_recording() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    ok(trace(&mut s, TRACE_ARM, 0, 1));
    std::thread::sleep(std::time::Duration::from_millis(5));
    malloc(&mut s, 64);
    let st = ok(trace(&mut s, TRACE_STATUS, 0, 0));
    assert_eq!(st[0] & TRACE_STATE_ARMED, 0);
    assert!(read_all(&mut rig, &mut s, 128).is_empty());
}

//! The worker's side of the daemon socket: frame bodies (`ToWorker::decode`,
//! `FromWorker::decode`), and for every `Run` the rebuild of the request against the worker's
//! own map of guest RAM (`worker::build_request`), whose buffers are then read and
//! written end to end. Also the reverse: a request built from fuzzer-chosen runs must be
//! refused unless every run lies in guest RAM and the runs add up to the header's lengths.
//! And the worker's rebuild of guest RAM itself: a memory table from the fuzzer over real
//! memfds (`shared_guest_ram::map_regions`), against which a request is then rebuilt.
#![no_main]

use std::{
    fs::File,
    os::fd::{AsRawFd, FromRawFd},
    sync::{Arc, OnceLock},
};

use libfuzzer_sys::fuzz_target;
use qcuda_proto::{Direction, Op, RequestHeader};
use vhost_cuda::{
    guest_buffer::GuestRam,
    worker::build_request,
    shared_guest_ram::map_regions,
    worker::message::{FromWorker, RegionSpec, RunRequest, Span, ToWorker},
};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

/// Four memfds of 64 KiB, made once; each map gets duplicates.
fn memfds() -> &'static [File] {
    static FILES: OnceLock<Vec<File>> = OnceLock::new();
    FILES.get_or_init(|| {
        (0..4)
            .map(|_| {
                // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
                let fd = unsafe { libc::memfd_create(c"fuzz-ram".as_ptr(), libc::MFD_CLOEXEC) };
                assert!(fd >= 0);
                // SAFETY: `fd` is fresh and ours.
                let f = unsafe { File::from_raw_fd(fd) };
                f.set_len(0x1_0000).unwrap();
                f
            })
            .collect()
    })
}

fn dup(f: &File) -> File {
    // SAFETY: dup of an open descriptor returns a new one we own.
    let fd = unsafe { libc::dup(f.as_raw_fd()) };
    assert!(fd >= 0);
    // SAFETY: as above.
    unsafe { File::from_raw_fd(fd) }
}

/// A memory table from the fuzzer, mapped as the worker maps the daemon's.
fn mapped_table(body: &[u8]) -> Option<(Arc<GuestRam>, Vec<RegionSpec>)> {
    let n = 1 + usize::from(body.first().copied().unwrap_or(0) % 4);
    let regions: Vec<RegionSpec> = (0..n)
        .map(|i| {
            let (a, b, c) = (u64_at(body, 1 + 3 * i), u64_at(body, 2 + 3 * i), u64_at(body, 3 + 3 * i));
            if a >> 63 == 0 {
                // Page-aligned and mostly plausible.
                RegionSpec { gpa: (a % 64) << 14, size: (1 + b % 16) << 12, file_offset: (c % 16) << 12 }
            } else {
                RegionSpec { gpa: a, size: b, file_offset: c }
            }
        })
        .collect();
    let files = memfds().iter().take(n).map(dup).collect();
    let mem = map_regions(&regions, files).ok()?;
    // What was mapped is what was asked for, and nothing overlaps.
    let mut spans: Vec<(u64, u64)> = mem.iter().map(|r| (r.start_addr().0, r.len())).collect();
    spans.sort();
    assert!(spans.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
    assert_eq!(spans.len(), regions.len());
    Some((Arc::new(mem), regions))
}

const SESSION: u64 = 7;
/// [0, 16K) and [16K, 32K) adjacent, [64K, 96K) after a gap.
const REGIONS: [(u64, usize); 3] = [(0, 0x4000), (0x4000, 0x4000), (0x1_0000, 0x8000)];

fn in_ram(gpa: u64, len: u64) -> bool {
    // A run may cross adjacent regions A and B; C stands alone.
    let end = match gpa.checked_add(len) {
        Some(e) => e,
        None => return false,
    };
    (end <= 0x8000) || (gpa >= 0x1_0000 && end <= 0x1_8000)
}

fn check(mem: &Arc<GuestRam>, run: &RunRequest) {
    let Ok(req) = build_request(SESSION, mem, run) else {
        return;
    };
    assert_eq!(req.header().session, SESSION);
    assert_eq!(req.op().shape(), (req.inputs().len(), req.outputs().len()));
    let lists = run.inputs.iter().chain(&run.outputs);
    for ((buf, desc), spans) in req.inputs().iter().chain(req.outputs()).zip(req.header().buffers()).zip(lists) {
        assert_eq!(buf.len() as u64, desc.len);
        for s in spans {
            assert!(s.len == 0 || in_ram(s.gpa, s.len), "run {s:?} outside guest RAM accepted");
        }
        let mut all = vec![0u8; buf.len()];
        buf.read_at(0, &mut all).unwrap();
        buf.write_at(0, &all).unwrap();
        assert!(buf.read_at(1, &mut all).is_err() || all.is_empty());
    }
}

fn u64_at(d: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    for (k, b) in w.iter_mut().enumerate() {
        *b = d.get(i * 8 + k).copied().unwrap_or(0);
    }
    u64::from_le_bytes(w)
}

fuzz_target!(|data: &[u8]| {
    let ranges: Vec<_> = REGIONS.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
    let mem = Arc::new(GuestRam::from_ranges(&ranges).unwrap());
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    if mode % 4 == 3 {
        // Guest RAM rebuilt from a fuzzed table, then a request rebuilt against it.
        let Some((ram, regions)) = mapped_table(body) else {
            return;
        };
        let rest = body.get(1 + 24 * regions.len().min(4)..).unwrap_or(&[]);
        if let Ok(ToWorker::Run(run)) = ToWorker::decode(rest) {
            let _ = build_request(SESSION, &ram, &run);
        }
        let mut h = RequestHeader::new(Op::Echo);
        h.session = SESSION;
        let r = regions[0];
        let len = u64_at(rest, 0) % 0x2_0000;
        let _ = h.push_buffer(Direction::In, len);
        let _ = h.push_buffer(Direction::Out, len);
        let run = RunRequest {
            header: h.encode(),
            inputs: vec![vec![Span { gpa: r.gpa, len }]],
            outputs: vec![vec![Span { gpa: r.gpa.wrapping_add(u64_at(rest, 1) % 0x1_0000), len }]],
        };
        if let Ok(req) = build_request(SESSION, &ram, &run) {
            let mut v = vec![0u8; req.inputs()[0].len()];
            req.inputs()[0].read_at(0, &mut v).unwrap();
            req.outputs()[0].write_at(0, &v).unwrap();
        }
        return;
    }
    match mode % 4 {
        // A raw frame body, as a broken or hostile daemon might send.
        0 => {
            if let Ok(msg) = ToWorker::decode(body) {
                assert_eq!(ToWorker::decode(&msg.encode().unwrap()).unwrap(), msg);
                if let ToWorker::Run(run) = &msg {
                    check(&mem, run);
                }
            }
            if let Ok(msg) = FromWorker::decode(body) {
                assert_eq!(FromWorker::decode(&msg.encode()).unwrap(), msg);
            }
        }
        // A valid header of a random op with fuzzer-chosen runs.
        _ => {
            let op = Op::ALL[usize::from(body.first().copied().unwrap_or(0)) % Op::ALL.len()];
            let mut h = RequestHeader::new(op);
            h.session = if mode & 0x80 != 0 { u64_at(body, 1) } else { SESSION };
            let (ins, outs) = op.shape();
            let mut next = 2;
            let mut lists = Vec::new();
            for i in 0..ins + outs {
                let n = (u64_at(body, next) % 4) as usize;
                next += 1;
                let spans: Vec<Span> = (0..n)
                    .map(|_| {
                        let gpa = u64_at(body, next);
                        let len = u64_at(body, next + 1);
                        next += 2;
                        // Mostly near guest RAM, sometimes anything.
                        if gpa >> 63 == 0 {
                            Span { gpa: gpa % 0x2_0000, len: len % 0x3000 }
                        } else {
                            Span { gpa, len }
                        }
                    })
                    .collect();
                let total = spans.iter().fold(0u64, |t, s| t.wrapping_add(s.len));
                let dir = if i < ins { Direction::In } else { Direction::Out };
                let _ = h.push_buffer(dir, if mode & 0x40 != 0 { total ^ 1 } else { total });
                lists.push(spans);
            }
            let outputs = lists.split_off(ins.min(lists.len()));
            let run = RunRequest { header: h.encode(), inputs: lists, outputs };
            check(&mem, &run);
            if let Ok(body) = ToWorker::Run(Box::new(run.clone())).encode() {
                match ToWorker::decode(&body).unwrap() {
                    ToWorker::Run(back) => assert_eq!(*back, run),
                    other => panic!("decoded as {other:?}"),
                }
            }
        }
    }
});

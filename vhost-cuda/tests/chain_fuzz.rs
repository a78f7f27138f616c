//! Seeded fuzz of the chain path: random descriptor tables (layouts, counts, lengths, flags,
//! next links, indirect tables, addresses in and outside guest RAM, overflowing ones) and
//! random or nearly-valid request headers go through the real parser and session table.
//!
//! Every case must complete exactly once, without a panic, and every byte of guest memory that
//! changed must lie inside a device-writable descriptor of that chain. A shadow copy of guest
//! memory catches any other write.
//!
//! `QCUDA_FUZZ_CASES` and `QCUDA_FUZZ_SEED` override the defaults.

use std::{
    sync::{Arc, Condvar, Mutex},
    time::Duration,
};

use qcuda_proto::{
    status, Checksum, Direction, Op, RequestHeader, ResponseHeader, MAX_CHAIN_SEGMENTS,
    REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE, VERSION,
};
use vhost_cuda::{
    chain,
    cuda::CudaHost,
    guest_buffer::GuestRam,
    session::{ChainCompleter, SessionTable},
    worker::WorkerCommand,
};
use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::{desc::split::Descriptor, desc::RawDescriptor, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

const QUEUE_LEN: u16 = 64;
const DESC_TABLE: u64 = 0x0;
const AVAIL: u64 = 0x400;
const USED: u64 = 0x600;
/// Region A [0, 32K) and B [32K, 64K) are adjacent; C lies after a gap and holds big
/// indirect tables.
const ARENA: (u64, u64) = (0x1000, 0x1_0000);
const REGION_C: (u64, u64) = (0x2_0000, 0x2_0000 + 0x1_1000);
const GAP: u64 = 0x1_8000;

/// splitmix64: small, seedable, good enough to drive a fuzzer.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }

    /// An index into something of `len` elements (the draw of `below`).
    fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap()
    }

    /// A random byte: the low byte of a word.
    #[expect(clippy::cast_possible_truncation, reason = "the low byte, on purpose")]
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    /// A random 32-bit value: the low half of a word.
    #[expect(clippy::cast_possible_truncation, reason = "the low half, on purpose")]
    fn word(&mut self) -> u32 {
        self.next() as u32
    }
}

/// A virtio descriptor flag as the descriptor's 16-bit field holds it.
fn flag(f: u32) -> u16 {
    u16::try_from(f).expect("virtio descriptor flags fit in 16 bits")
}

/// A test size or offset, which fits in the type asked for.
fn small<T: TryFrom<u64>>(v: u64) -> T {
    T::try_from(v).unwrap_or_else(|_| panic!("{v} does not fit"))
}

/// Guest memory plus a shadow copy of what it should hold.
struct Guest {
    mem: Arc<GuestRam>,
    shadow: Vec<(u64, Vec<u8>)>,
}

impl Guest {
    fn new() -> Self {
        let mem = Arc::new(
            GuestRam::from_ranges(&[
                (GuestAddress(0), 0x8000),
                (GuestAddress(0x8000), 0x8000),
                (GuestAddress(REGION_C.0), small(REGION_C.1 - REGION_C.0)),
            ])
            .unwrap(),
        );
        let shadow = mem
            .iter()
            .map(|r| (r.start_addr().0, vec![0u8; small(r.len())]))
            .collect();
        Self { mem, shadow }
    }

    /// A setup write by the test (the driver side): goes to memory and shadow alike.
    fn write(&mut self, addr: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.mem.write_slice(data, GuestAddress(addr)).unwrap();
        for (base, copy) in &mut self.shadow {
            let end = *base + copy.len() as u64;
            let (s, e) = (addr.max(*base), (addr + data.len() as u64).min(end));
            if s < e {
                copy[small(s - *base)..small(e - *base)]
                    .copy_from_slice(&data[small(s - addr)..small(e - addr)]);
            }
        }
    }

    fn region_bytes(&self, base: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(base)).unwrap();
        v
    }

    /// Every byte that differs from the shadow must lie in `allowed`; the shadow then takes
    /// the new contents.
    fn check_writes(&mut self, allowed: &[(u64, u64)], case: usize) {
        for (base, copy) in &mut self.shadow {
            let host = self.mem.get_host_address(GuestAddress(*base)).unwrap();
            // SAFETY: `host` maps the whole region (`copy.len()` bytes) for as long as `mem`
            // lives, and nothing writes guest memory now: the case's only chain has completed
            // and the workers are idle, waiting for the next request.
            let now = unsafe { std::slice::from_raw_parts(host, copy.len()) };
            if now == copy.as_slice() {
                continue;
            }
            // Compare in blocks (memcmp), then look at the bytes of differing blocks only.
            const BLOCK: usize = 256;
            for (i, (a, b)) in now.chunks(BLOCK).zip(copy.chunks(BLOCK)).enumerate() {
                if a == b {
                    continue;
                }
                for (off, _) in a.iter().zip(b).enumerate().filter(|(_, (x, y))| x != y) {
                    let gpa = *base + (i * BLOCK + off) as u64;
                    assert!(
                        allowed.iter().any(|&(s, l)| gpa >= s && gpa - s < l),
                        "case {case}: write at {gpa:#x} outside the writable descriptors \
                         {allowed:x?}"
                    );
                }
            }
            copy.copy_from_slice(now);
        }
    }
}

#[derive(Default)]
struct Recorder {
    done: Mutex<Vec<(u16, u32)>>,
    cv: Condvar,
}

impl ChainCompleter for Recorder {
    fn complete(&self, head: u16, used_len: u32) {
        self.done.lock().unwrap().push((head, used_len));
        self.cv.notify_all();
    }
}

impl Recorder {
    fn take_one(&self, case: usize) -> (u16, u32) {
        let d = self.done.lock().unwrap();
        let (mut d, timeout) = self
            .cv
            .wait_timeout_while(d, Duration::from_secs(20), |d| d.is_empty())
            .unwrap();
        assert!(!timeout.timed_out(), "case {case}: chain never completed");
        assert_eq!(d.len(), 1, "case {case}: completed more than once");
        d.pop().unwrap()
    }
}

fn raw(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags, next))
}

/// An address for a descriptor: mostly in the arena, sometimes anywhere bad.
fn address(rng: &mut Rng, len: u64) -> u64 {
    match rng.below(20) {
        0 => GAP + rng.below(0x1000),
        1 => 0x8000 - rng.below(0x40), // across the A/B boundary (fine)
        2 => 0x1_0000 - rng.below(0x40), // across the end of B (bad)
        3 => REGION_C.1 - rng.below(0x40), // across the end of C (bad)
        4 => u64::MAX - rng.below(0x100), // overflowing
        5 => 0x1_0000_0000 + rng.below(0x1000), // far beyond RAM
        6 => rng.range(REGION_C.0, REGION_C.1), // region C
        7 => rng.below(0x800),         // the queue's own memory
        _ => rng.range(
            ARENA.0,
            ARENA.1.saturating_sub(len.min(0x8000)).max(ARENA.0 + 1),
        ),
    }
}

fn length(rng: &mut Rng) -> u32 {
    match rng.below(10) {
        0 => 0,
        1 => rng.word(),
        2 => u32::MAX - small::<u32>(rng.below(4)),
        3 => small(REQUEST_HEADER_SIZE as u64),
        4 => small(RESPONSE_HEADER_SIZE as u64),
        _ => small(rng.below(0x1000)),
    }
}

/// Cuts `[addr, addr+len)` into 1..=max pieces at random points.
fn split(rng: &mut Rng, addr: u64, len: u64, max: u64, flags: u16) -> Vec<(u64, u32, u16)> {
    let pieces = rng.range(1, max + 1);
    let mut cuts: Vec<u64> = (1..pieces).map(|_| rng.below(len + 1)).collect();
    cuts.push(0);
    cuts.push(len);
    cuts.sort();
    cuts.windows(2)
        .map(|w| (addr + w[0], small(w[1] - w[0]), flags))
        .collect()
}

/// Ops of the valid requests: those the daemon answers without a worker process (so the fuzz
/// is fast, and safe on a machine with a GPU).
const OPS: [Op; 6] = [
    Op::Hello,
    Op::Echo,
    Op::SessionClose,
    Op::HostInfo,
    Op::DriverVersion,
    Op::DeviceCount,
];

struct Case {
    descs: Vec<(u64, u32, u16)>,
    /// For a well-formed Echo: where its input and output live, to check the copy.
    echo: Option<(Vec<u8>, u64, u64)>,
}

/// A nearly valid request, then mutated.
fn request_case(rng: &mut Rng, g: &mut Guest) -> Case {
    let op = OPS[rng.index(OPS.len())];
    let mut h = RequestHeader::new(op);
    h.session = rng.range(1, 6);
    h.args[0] = if rng.chance(95) {
        u64::from(VERSION)
    } else {
        rng.next()
    };
    let (ins, outs) = op.shape();
    let in_len = if ins > 0 { rng.below(0x1800) } else { 0 };
    let out_len = match (op, outs) {
        (Op::Echo, _) => in_len,
        (_, 0) => 0,
        _ => rng.below(0x1000),
    };
    if ins > 0 {
        h.push_buffer(Direction::In, in_len).unwrap();
    }
    if outs > 0 {
        h.push_buffer(Direction::Out, out_len).unwrap();
    }
    let input: Vec<u8> = (0..in_len).map(|_| rng.byte()).collect();
    let mut stream = h.encode().to_vec();
    stream.extend_from_slice(&input);
    if rng.chance(10) {
        // Corrupt one header byte.
        let i = rng.index(REQUEST_HEADER_SIZE);
        stream[i] = rng.byte();
    }
    let rlen = stream.len() as u64;
    let wlen = out_len + RESPONSE_HEADER_SIZE as u64;
    let ra = rng.range(ARENA.0, ARENA.1 - rlen);
    let wa = rng.range(ARENA.0, ARENA.1 - wlen);
    g.write(ra, &stream);
    let mut descs = split(rng, ra, rlen, 6, 0);
    descs.extend(split(rng, wa, wlen, 6, flag(VRING_DESC_F_WRITE)));
    let mut mutated = false;
    for _ in 0..rng.below(3) {
        if !rng.chance(40) {
            continue;
        }
        mutated = true;
        let i = rng.index(descs.len());
        match rng.below(6) {
            0 => descs[i].1 = length(rng),
            1 => descs[i].0 = address(rng, u64::from(descs[i].1)),
            2 => descs[i].2 ^= flag(VRING_DESC_F_WRITE),
            3 => {
                let j = rng.index(descs.len());
                descs.swap(i, j);
            }
            4 => {
                let len = length(rng);
                let d = (
                    address(rng, u64::from(len)),
                    len,
                    small::<u16>(rng.below(2)) * 2,
                );
                descs.insert(i, d);
            }
            _ => {
                descs.remove(i);
                if descs.is_empty() {
                    descs.push((ra, 1, 0));
                }
            }
        }
    }
    let echo = (op == Op::Echo && !mutated && stream[..REQUEST_HEADER_SIZE] == h.encode())
        .then(|| (input, wa, wa + out_len));
    Case { descs, echo }
}

/// Random descriptors with random flags and links.
fn chaos_case(rng: &mut Rng, g: &mut Guest) -> Case {
    let n = rng.range(1, 24);
    let mut descs = Vec::new();
    for _ in 0..n {
        let len = length(rng);
        let mut flags = 0u16;
        if rng.chance(50) {
            flags |= flag(VRING_DESC_F_WRITE);
        }
        if rng.chance(3) {
            flags |= flag(VRING_DESC_F_INDIRECT);
        }
        descs.push((address(rng, u64::from(len)), len, flags));
    }
    // Sometimes plant a valid-looking header where a readable descriptor points.
    if rng.chance(50) {
        if let Some(&(a, l, f)) = descs.first() {
            if f == 0 && l as usize >= REQUEST_HEADER_SIZE && a >= ARENA.0 && a < ARENA.1 - 0x100 {
                let mut h = RequestHeader::new(OPS[rng.index(OPS.len())]);
                h.session = rng.range(1, 6);
                g.write(a, &h.encode());
            }
        }
    }
    Case { descs, echo: None }
}

/// One indirect table in region C with `n` descriptors: a Hello header, padding, a response.
fn big_indirect_case(rng: &mut Rng, g: &mut Guest) -> Case {
    let n = [4094u64, 4095, 4096, 4097, 4200][rng.index(5)];
    let mut h = RequestHeader::new(Op::Hello);
    h.session = rng.range(1, 6);
    h.args[0] = u64::from(VERSION);
    g.write(ARENA.0, &h.encode());
    let table: Vec<u8> = (0..n)
        .flat_map(|i| {
            let (addr, len, flags) = match i {
                0 => (ARENA.0, small(REQUEST_HEADER_SIZE as u64), 0),
                i if i == n - 1 => (ARENA.0 + 0x1000, 64, flag(VRING_DESC_F_WRITE)),
                _ => (ARENA.0, 0, 0),
            };
            let next = if i == n - 1 {
                0
            } else {
                flag(VRING_DESC_F_NEXT)
            };
            let d = Descriptor::new(addr, len, flags | next, small(i + 1));
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&d.addr().0.to_le_bytes());
            b[8..12].copy_from_slice(&d.len().to_le_bytes());
            b[12..14].copy_from_slice(&d.flags().to_le_bytes());
            b[14..16].copy_from_slice(&d.next().to_le_bytes());
            b
        })
        .collect();
    g.write(REGION_C.0, &table);
    Case {
        descs: vec![(REGION_C.0, small(n * 16), flag(VRING_DESC_F_INDIRECT))],
        echo: None,
    }
}

#[test]
fn fuzzed_chains_never_panic_or_write_outside_their_writable_descriptors() {
    let cases: usize = std::env::var("QCUDA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seed: u64 = std::env::var("QCUDA_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_c0da);
    let mut rng = Rng(seed);
    let mut g = Guest::new();
    // Every op here is answered by the daemon itself, so no worker process starts and the
    // fuzz stays fast; the command is the real one all the same.
    let workers = WorkerCommand::program(env!("CARGO_BIN_EXE_vhost-cuda"), None, "warn");
    let table = SessionTable::new(CudaHost::probe(), workers, "fuzz");
    let rec = Arc::new(Recorder::default());
    let completer: Arc<dyn ChainCompleter> = rec.clone();
    let (mut accepted, mut echoes_checked, mut answered, mut silent) = (0, 0, 0, 0);

    for case in 0..cases {
        let c = match rng.below(100) {
            0 => big_indirect_case(&mut rng, &mut g),
            1..=25 => chaos_case(&mut rng, &mut g),
            _ => request_case(&mut rng, &mut g),
        };
        // The descriptor table: linear NEXT links, or now and then a random link.
        let mut bytes = Vec::new();
        let count = c.descs.len().min(usize::from(QUEUE_LEN));
        for (i, &(addr, len, flags)) in c.descs.iter().take(count).enumerate() {
            let mut flags = flags & !(flag(VRING_DESC_F_NEXT));
            let mut next: u16 = small(i as u64 + 1);
            if i + 1 < count {
                flags |= flag(VRING_DESC_F_NEXT);
            }
            if rng.chance(2) {
                flags |= flag(VRING_DESC_F_NEXT);
                next = small(rng.below(u64::from(QUEUE_LEN) + 4));
            }
            let d = raw(addr, len, flags, next);
            bytes.extend_from_slice(vm_memory::ByteValued::as_slice(&d));
        }
        g.write(DESC_TABLE, &bytes);
        // avail: flags 0, idx 1, ring[0] = head 0.
        g.write(AVAIL, &[0, 0, 1, 0, 0, 0]);

        let mut queue = Queue::new(QUEUE_LEN).unwrap();
        queue.set_size(QUEUE_LEN);
        queue.set_desc_table_address(Some(small(DESC_TABLE)), Some(0));
        queue.set_avail_ring_address(Some(small(AVAIL)), Some(0));
        queue.set_used_ring_address(Some(small(USED)), Some(0));
        queue.set_ready(true);
        let chain = queue
            .iter(g.mem.clone())
            .unwrap()
            .next()
            .expect("the avail ring holds one chain");
        let head = chain.head_index();
        let allowed: Vec<(u64, u64)> = chain
            .clone()
            .take(MAX_CHAIN_SEGMENTS)
            .filter(|d| d.is_write_only())
            .map(|d| (d.addr().0, u64::from(d.len())))
            .collect();
        let writable_total: u64 = allowed.iter().map(|a| a.1).sum();

        let valid = match chain::parse(&g.mem, chain) {
            Ok(parsed) => {
                table.dispatch(head, parsed, completer.clone());
                true
            }
            Err(rejected) => {
                completer.complete(head, rejected.answer());
                false
            }
        };
        accepted += usize::from(valid);
        let (done_head, used) = rec.take_one(case);
        assert_eq!(done_head, head);
        assert!(
            used == 0 || u64::from(used) == writable_total,
            "case {case}: used {used} of {writable_total} writable bytes"
        );
        if used == 0 {
            silent += 1;
        } else {
            answered += 1;
        }

        if let (true, Some((input, out_at, resp_at))) = (valid, &c.echo) {
            let resp = ResponseHeader::decode(&g.region_bytes(*resp_at, 64)).unwrap();
            assert_eq!(resp.status, status::SUCCESS, "case {case}");
            assert!(
                g.region_bytes(*out_at, input.len()) == *input,
                "case {case}: echo differs"
            );
            assert_eq!(resp.rets[0], Checksum::of(input), "case {case}");
            echoes_checked += 1;
        }
        g.check_writes(&allowed, case);
    }
    eprintln!(
        "{cases} cases (seed {seed:#x}): {accepted} valid requests ({echoes_checked} echoes \
         verified), {answered} answered, {silent} completed with used length 0; \
         {} sessions open",
        table.open_count()
    );
    assert!(
        accepted > cases / 10,
        "too few valid requests: the generator is off"
    );
    assert!(echoes_checked > cases / 50);
    for session in 1..6 {
        assert_eq!(table.worker_pid(session), None, "a worker was started");
    }
    assert!(table.wait_idle(Duration::from_secs(10)));
    table.close_all(Duration::from_secs(10));
    assert_eq!(table.open_count(), 0);
}

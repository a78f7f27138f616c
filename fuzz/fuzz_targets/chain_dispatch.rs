//! vhost-cuda's chain decoder and dispatcher: a sequence of descriptor chains (raw descriptor
//! tables with random bytes, or chains built around well-formed headers of random ops with
//! arguments drawn from earlier answers) goes through `chain::parse`, and every request that
//! parses is run as the daemon and its worker would run it: Hello and Echo
//! (`transport_ops`), the host queries (`CudaHost::answer_query`), and everything else on a
//! `GpuState` over the fake CUDA driver.
//!
//! Checked: nothing panics, every chain gets at most one response, and no byte of guest memory
//! outside the chain's device-writable descriptors changes.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use qcuda_proto::{Direction, Op, RequestHeader, MAX_ARGS, REQUEST_HEADER_SIZE, VERSION};
use vhost_cuda::{
    chain,
    cuda::{fuzzing::fake_host, GpuState},
    guest_buffer::GuestRam,
    transport_ops,
};
use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

/// Regions A [0, 16K) and B [16K, 32K) are adjacent; C lies after a gap.
const REGIONS: [(u64, usize); 3] = [(0, 0x4000), (0x4000, 0x4000), (0x1_0000, 0x8000)];
/// Where built chains put their readable part (A, running into B) and writable part (C).
const READ_AT: u64 = 0x800;
const WRITE_AT: u64 = 0x1_0000;
const MAX_BUF: usize = 0x1800;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |v, i| v | u64::from(self.u8()) << (8 * i))
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

struct Guest {
    mem: Arc<GuestRam>,
    shadow: Vec<Vec<u8>>,
}

impl Guest {
    fn new() -> Self {
        let ranges: Vec<_> = REGIONS.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
        let mem = Arc::new(GuestRam::from_ranges(&ranges).unwrap());
        let shadow = REGIONS.iter().map(|&(_, l)| vec![0u8; l]).collect();
        Self { mem, shadow }
    }

    /// A write by the driver side (the fuzzer): memory and shadow alike. Parts outside guest
    /// RAM are dropped.
    fn write(&mut self, addr: u64, data: &[u8]) {
        for (i, &(base, len)) in REGIONS.iter().enumerate() {
            let end = base + len as u64;
            let (s, e) = (addr.max(base), addr.saturating_add(data.len() as u64).min(end));
            if s < e {
                let src = &data[(s - addr) as usize..(e - addr) as usize];
                self.mem.write_slice(src, GuestAddress(s)).unwrap();
                self.shadow[i][(s - base) as usize..(e - base) as usize].copy_from_slice(src);
            }
        }
    }

    /// Every changed byte must lie in `allowed` (guest-physical ranges); the shadow then takes
    /// the new contents.
    fn check_writes(&mut self, allowed: &[(u64, u64)]) {
        for (i, region) in self.mem.iter().enumerate() {
            let base = region.start_addr().0;
            let mut now = vec![0u8; region.len() as usize];
            self.mem.read_slice(&mut now, GuestAddress(base)).unwrap();
            if now == self.shadow[i] {
                continue;
            }
            // Slice compares first (memcmp, not instrumented byte by byte), bytes only where a
            // block differs.
            for (k, (a, b)) in now.chunks(256).zip(self.shadow[i].chunks(256)).enumerate() {
                if a == b {
                    continue;
                }
                for (off, (x, y)) in a.iter().zip(b).enumerate() {
                    if x != y {
                        let gpa = base + (k * 256 + off) as u64;
                        assert!(
                            allowed.iter().any(|&(s, l)| gpa >= s && gpa - s < l),
                            "write outside the chain's writable descriptors at {gpa:#x}"
                        );
                    }
                }
            }
            self.shadow[i] = now;
        }
    }
}

/// An address: mostly inside guest RAM, sometimes at its edges, in the gap or far outside.
fn address(inp: &mut Input) -> u64 {
    match inp.u8() % 8 {
        0 => inp.u64(),
        1 => 0x8000 - u64::from(inp.u8()),
        2 => 0x1_8000 - u64::from(inp.u8()),
        3 => u64::MAX - u64::from(inp.u8()),
        _ => u64::from(inp.u16()) % 0x1_8000,
    }
}

/// A chain of random descriptors, with random bytes written to guest RAM first.
fn raw_chain(g: &mut Guest, inp: &mut Input) -> Vec<Descriptor> {
    for _ in 0..inp.u8() % 4 {
        let at = address(inp);
        let n = usize::from(inp.u8()) * 4;
        let bytes = inp.bytes(n).to_vec();
        g.write(at, &bytes);
    }
    (0..1 + inp.u8() % 12)
        .map(|_| {
            let flags = if inp.u8() & 1 != 0 { VRING_DESC_F_WRITE as u16 } else { 0 };
            let addr = address(inp);
            let len = match inp.u8() % 4 {
                0 => inp.u64() as u32,
                _ => u32::from(inp.u16()) % 0x2000,
            };
            Descriptor::new(addr, len, flags, 0)
        })
        .collect()
}

/// Splits `[at, at + len)` into one or two descriptors at a fuzzer-chosen point.
fn split(inp: &mut Input, at: u64, len: u64, flags: u16, out: &mut Vec<Descriptor>) {
    let cut = if len > 0 { u64::from(inp.u16()) % (len + 1) } else { 0 };
    for (a, l) in [(at, cut), (at + cut, len - cut)] {
        if l > 0 {
            out.push(Descriptor::new(a, l as u32, flags, 0));
        }
    }
}

/// A chain around a well-formed header of a random op, its buffers laid out as the header
/// says (with an occasional length off by one), its arguments drawn from earlier answers.
fn built_chain(g: &mut Guest, inp: &mut Input, seen: &[u64]) -> Vec<Descriptor> {
    let op = Op::ALL[usize::from(inp.u8()) % Op::ALL.len()];
    let mut h = RequestHeader::new(op);
    h.session = 1;
    h.device = match inp.u8() % 8 {
        0 => 1,
        1 => 2,
        2 => inp.u64() as u32,
        _ => 0,
    };
    h.flags = u16::from(inp.u8() & 1);
    for a in h.args.iter_mut().take(MAX_ARGS) {
        *a = match inp.u8() % 8 {
            0 | 1 if !seen.is_empty() => seen[usize::from(inp.u8()) % seen.len()],
            2 if !seen.is_empty() => {
                seen[usize::from(inp.u8()) % seen.len()].wrapping_add(u64::from(inp.u8()))
            }
            3 => inp.u64(),
            4 => u64::from(VERSION),
            _ => u64::from(inp.u8()),
        };
    }
    let (ins, outs) = op.shape();
    let mut payload = Vec::new();
    for _ in 0..ins {
        let n = usize::from(inp.u16()) % MAX_BUF;
        let start = payload.len();
        payload.extend_from_slice(inp.bytes(n));
        payload.resize(start + n, 0);
        let _ = h.push_buffer(Direction::In, n as u64);
    }
    let mut out_total = 0u64;
    for _ in 0..outs {
        let n = u64::from(inp.u16()) % MAX_BUF as u64;
        out_total += n;
        let _ = h.push_buffer(Direction::Out, n);
    }
    let mut stream = h.encode().to_vec();
    stream.extend_from_slice(&payload);
    g.write(READ_AT, &stream);
    let skew = match inp.u8() % 16 {
        0 => 1u64,
        1 => u64::MAX,
        _ => 0,
    };
    let mut descs = Vec::new();
    split(inp, READ_AT, (stream.len() as u64).wrapping_add(skew) & 0xffff, 0, &mut descs);
    let writable = out_total + 64;
    split(inp, WRITE_AT, writable.min(0x8000), VRING_DESC_F_WRITE as u16, &mut descs);
    debug_assert!(REQUEST_HEADER_SIZE + payload.len() < 0x8000 - READ_AT as usize);
    descs
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let mut g = Guest::new();
    let host = fake_host(2);
    let mut session = GpuState::open(&host, 1);
    // Handles, pointers and sizes the host answered, for later arguments.
    let mut seen: Vec<u64> = vec![0, 1];
    for _ in 0..24 {
        if inp.is_empty() {
            break;
        }
        let descs = if inp.u8() % 4 == 0 {
            raw_chain(&mut g, &mut inp)
        } else {
            built_chain(&mut g, &mut inp, &seen)
        };
        let allowed: Vec<(u64, u64)> = descs
            .iter()
            .filter(|d| d.is_write_only())
            .map(|d| (d.addr().0, u64::from(d.len())))
            .collect();
        let mem = g.mem.clone();
        match chain::parse(&mem, descs) {
            Ok(p) => {
                let req = &p.request;
                let resp = match req.op() {
                    Op::Hello => transport_ops::hello(&host, req, 1),
                    Op::Echo => transport_ops::echo(req),
                    _ => match host.answer_query(req) {
                        Some(r) => r,
                        None => session.execute(req),
                    },
                };
                let used = p.reply.write(&resp);
                assert!(used == 0 || used == p.reply.used_len());
                seen.extend(resp.rets.iter().copied().filter(|&r| r != 0));
                if seen.len() > 64 {
                    seen.drain(..32);
                }
            }
            Err(rejected) => {
                let _ = rejected.answer();
            }
        }
        g.check_writes(&allowed);
    }
    drop(session);
});

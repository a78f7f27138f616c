//! The CUDA executor on a real GPU: a whole flow through `GpuState::execute`, with guest
//! buffers over real guest memory (a `GuestMemoryMmap`), as a session's worker process drives
//! it, but with several sessions in this one process, to show what the driver does then.
//!
//! Without a CUDA driver and GPU the test prints `skipped: no GPU` and passes.

use std::sync::Arc;

use qcuda_proto::{
    status, Direction, GpuInfo, Op, ParamInfo, RequestHeader, ResponseHeader, FLAG_ASYNC,
    GPU_INFO_SIZE, RESP_FLAG_STICKY,
};
use vhost_cuda::{
    cuda::{precopy, CudaHost, GpuState},
    guest_buffer::{GuestBuffer, GuestRam, Request},
};
use vm_memory::{Bytes, GuestAddress};

#[path = "../src/cuda/test_kernels.rs"]
mod test_kernels;

use test_kernels::*;

const PAGE: usize = 4096;
const RAM: usize = 128 << 20;

/// Guest RAM with a bump allocator for buffers.
struct Guest {
    mem: Arc<GuestRam>,
    next: u64,
}

impl Guest {
    fn new() -> Self {
        Self {
            mem: Arc::new(GuestRam::from_ranges(&[(GuestAddress(0), RAM)]).unwrap()),
            next: PAGE as u64,
        }
    }

    fn alloc(&mut self, len: usize) -> GuestAddress {
        let at = self.next;
        self.next += (len as u64).div_ceil(PAGE as u64) * PAGE as u64;
        assert!(self.next <= RAM as u64, "test guest RAM exhausted");
        GuestAddress(at)
    }

    /// One contiguous run holding `data` (the large-run, direct copy path).
    fn contiguous(&mut self, data: &[u8]) -> GuestBuffer {
        let at = self.alloc(data.len());
        self.mem.write_slice(data, at).unwrap();
        GuestBuffer::new(self.mem.clone(), [(at, data.len())]).unwrap()
    }

    /// Page-sized runs in reverse page order, as pinned user pages arrive (the staged path).
    fn scattered(&mut self, data: &[u8]) -> GuestBuffer {
        let pages = data.len().div_ceil(PAGE);
        let base = self.alloc(pages * PAGE);
        let mut runs = Vec::new();
        for (i, chunk) in data.chunks(PAGE).enumerate() {
            let at = GuestAddress(base.0 + ((pages - 1 - i) * PAGE) as u64);
            self.mem.write_slice(chunk, at).unwrap();
            runs.push((at, chunk.len()));
        }
        GuestBuffer::new(self.mem.clone(), runs).unwrap()
    }

    fn zeroed(&mut self, len: usize, scattered: bool) -> GuestBuffer {
        let data = vec![0u8; len];
        if scattered {
            self.scattered(&data)
        } else {
            self.contiguous(&data)
        }
    }
}

fn request(op: Op, args: &[u64], inputs: Vec<GuestBuffer>, outputs: Vec<GuestBuffer>) -> Request {
    let mut header = RequestHeader::new(op);
    header.session = 1;
    header.args[..args.len()].copy_from_slice(args);
    for b in &inputs {
        header.push_buffer(Direction::In, b.len() as u64).unwrap();
    }
    for b in &outputs {
        header.push_buffer(Direction::Out, b.len() as u64).unwrap();
    }
    Request::new(header, inputs, outputs).unwrap()
}

#[track_caller]
fn ok(r: ResponseHeader) -> [u64; 7] {
    assert_eq!(r.status, status::SUCCESS, "{r:?}");
    assert_eq!(r.flags, 0, "{r:?}");
    r.rets
}

fn call(s: &mut GpuState, op: Op, args: &[u64]) -> ResponseHeader {
    s.execute(&request(op, args, vec![], vec![]))
}

fn free_memory(s: &mut GpuState) -> u64 {
    ok(call(s, Op::MemGetInfo, &[]))[0]
}

fn load(g: &mut Guest, s: &mut GpuState, image: &[u8]) -> u64 {
    let b = g.contiguous(image);
    ok(s.execute(&request(Op::ModuleLoad, &[], vec![b], vec![])))[0]
}

fn function(g: &mut Guest, s: &mut GpuState, module: u64, name: &str) -> (u64, Vec<(u32, u32)>) {
    let n = g.contiguous(name.as_bytes());
    let out = g.zeroed(64 * 8, false);
    let rets = ok(s.execute(&request(
        Op::ModuleGetFunction,
        &[module],
        vec![n],
        vec![out.clone()],
    )));
    let bytes = out.to_vec().unwrap();
    let params = bytes
        .chunks_exact(8)
        .take(usize::try_from(rets[1]).unwrap())
        .map(|c| {
            let p = ParamInfo::decode(c).unwrap();
            (p.offset, p.size)
        })
        .collect();
    (rets[0], params)
}

fn launch(
    g: &mut Guest,
    s: &mut GpuState,
    func: u64,
    grid: u32,
    block: u32,
    params: &[u8],
    stream: u64,
) -> ResponseHeader {
    let pack = |a: u32, b: u32| u64::from(a) | (u64::from(b) << 32);
    let args = [func, pack(grid, 1), pack(1, block), pack(1, 1), 0, stream];
    let pb = g.contiguous(params);
    let r = request(Op::LaunchKernel, &args, vec![pb], vec![]);
    let mut header = *r.header();
    header.flags = FLAG_ASYNC;
    s.execute(&Request::new(header, r.inputs().to_vec(), vec![]).unwrap())
}

fn htod(
    g: &mut Guest,
    s: &mut GpuState,
    dst: u64,
    data: &[u8],
    scattered: bool,
    stream: u64,
) -> ResponseHeader {
    let b = if scattered {
        g.scattered(data)
    } else {
        g.contiguous(data)
    };
    s.execute(&request(Op::MemcpyHtoD, &[dst, stream], vec![b], vec![]))
}

fn dtoh(
    g: &mut Guest,
    s: &mut GpuState,
    src: u64,
    len: usize,
    scattered: bool,
    stream: u64,
) -> (ResponseHeader, Vec<u8>) {
    let b = g.zeroed(len, scattered);
    let r = s.execute(&request(
        Op::MemcpyDtoH,
        &[src, stream],
        vec![],
        vec![b.clone()],
    ));
    (r, b.to_vec().unwrap())
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

#[test]
fn gpu_flow_through_the_executor() {
    let host = CudaHost::probe();
    if host.gpu_count() == 0 {
        if host.driver_version() != 0 {
            // A driver that gives no GPU (a stub libcuda on LD_LIBRARY_PATH, cuInit failing):
            // say so, so that a GPU machine does not pass this test silently.
            eprintln!(
                "note: CUDA driver {} present but no usable GPU (see the warning logged by \
                 CudaHost::probe)",
                host.driver_version()
            );
        }
        println!("skipped: no GPU");
        return;
    }
    let mut g = Guest::new();

    // HostInfo.
    let mut observer = GpuState::open(&host, 100);
    let out = g.zeroed(GPU_INFO_SIZE * 8, false);
    let rets = ok(observer.execute(&request(Op::HostInfo, &[], vec![], vec![out.clone()])));
    assert_eq!(rets[0], u64::from(host.gpu_count()));
    assert!(rets[1] >= 13000, "driver version {}", rets[1]);
    let info = GpuInfo::decode(&out.to_vec().unwrap()).unwrap();
    println!(
        "GPU 0: {} (cc {}.{}, {} SMs, {} MiB, PCI {:04x}:{:02x}:{:02x}), driver {}",
        String::from_utf8_lossy(info.name_bytes()),
        info.cc_major,
        info.cc_minor,
        info.multiprocessors,
        info.total_mem >> 20,
        info.pci_domain,
        info.pci_bus,
        info.pci_device,
        rets[1]
    );
    assert!(!info.name_bytes().is_empty() && info.total_mem > 0 && info.multiprocessors > 0);
    assert!(info.cc_major >= 9, "the test kernels are built for sm_90");
    assert_eq!(
        ok(call(&mut observer, Op::DeviceCount, &[]))[0],
        u64::from(host.gpu_count())
    );
    let free_before = free_memory(&mut observer);

    let mut s = GpuState::open(&host, 1);

    // Malloc, copies both ways, on both copy paths.
    let n = 1usize << 20;
    let bytes = n * 4;
    let (a, b, c) = (
        ok(call(&mut s, Op::Malloc, &[bytes as u64]))[0],
        ok(call(&mut s, Op::Malloc, &[bytes as u64]))[0],
        ok(call(&mut s, Op::Malloc, &[bytes as u64]))[0],
    );
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let ys: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.25).collect();
    ok(htod(&mut g, &mut s, a, &bytes_of(&xs), false, 0));
    ok(htod(&mut g, &mut s, b, &bytes_of(&ys), true, 0));
    let (r, back) = dtoh(&mut g, &mut s, b, bytes, false, 0);
    ok(r);
    assert_eq!(f32s(&back), ys, "scattered HtoD, contiguous DtoH");
    let free_during = free_memory(&mut observer);
    assert!(
        free_before.saturating_sub(free_during) >= 3 * bytes as u64,
        "{free_before} -> {free_during}"
    );

    // PTX module (JIT), parameter layout, launch, result.
    let m = load(&mut g, &mut s, VADD_PTX.as_bytes());
    let (vadd, params) = function(&mut g, &mut s, m, "vadd");
    assert_eq!(
        params,
        [(0, 8), (8, 8), (16, 8), (24, 4)],
        "3 pointers + an int"
    );
    let mut pb = Vec::new();
    for p in [a, b, c] {
        pb.extend_from_slice(&p.to_le_bytes());
    }
    pb.extend_from_slice(&i32::try_from(n).unwrap().to_le_bytes());
    ok(launch(
        &mut g,
        &mut s,
        vadd,
        u32::try_from(n / 256).unwrap(),
        256,
        &pb,
        0,
    ));
    ok(call(&mut s, Op::DeviceSynchronize, &[]));
    let (r, got) = dtoh(&mut g, &mut s, c, bytes, true, 0);
    ok(r);
    let want: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| x + y).collect();
    assert_eq!(f32s(&got), want, "vadd result");

    // Out-of-range and unknown pointers.
    let r = htod(&mut g, &mut s, c + bytes as u64 - 4, &[0; 8], false, 0);
    assert_eq!(r.status, status::INVALID_VALUE);
    let (r, _) = dtoh(&mut g, &mut s, 0x10, 16, false, 0);
    assert_eq!(r.status, status::INVALID_VALUE);
    assert_eq!(
        call(&mut s, Op::Free, &[c + 4]).status,
        status::INVALID_VALUE
    );

    // The same kernels from a cubin (ELF).
    let m_elf = load(&mut g, &mut s, &unhex(VADD_CUBIN_HEX));
    let (vadd_elf, params) = function(&mut g, &mut s, m_elf, "vadd");
    assert_eq!(params.len(), 4);
    ok(call(&mut s, Op::Memset, &[c, 0, bytes as u64, 0]));
    ok(launch(
        &mut g,
        &mut s,
        vadd_elf,
        u32::try_from(n / 256).unwrap(),
        256,
        &pb,
        0,
    ));
    let (r, got) = dtoh(&mut g, &mut s, c, bytes, false, 0);
    ok(r);
    assert_eq!(f32s(&got), want, "vadd from the cubin");

    // Fatbins as nvcc 13.0 writes them (compressed), globals, a templated kernel.
    for hex in [MIXED_FATBIN_HEX, MIXED_FATBIN_SIZE_HEX] {
        let mf = load(&mut g, &mut s, &unhex(hex));
        let (mixed, params) = function(&mut g, &mut s, mf, "mixed");
        assert_eq!(params, [(0, 8), (8, 1), (16, 8), (24, 4), (28, 2)]);
        let mut pb = vec![0u8; 30];
        pb[0..8].copy_from_slice(&c.to_le_bytes());
        pb[8] = 3;
        pb[16..24].copy_from_slice(&0.5f64.to_le_bytes());
        pb[24..28].copy_from_slice(&100i32.to_le_bytes());
        pb[28..30].copy_from_slice(&(-7i16).to_le_bytes());
        ok(launch(&mut g, &mut s, mixed, 1, 16, &pb, 0));
        let (r, got) = dtoh(&mut g, &mut s, c, 4, false, 0);
        ok(r);
        assert_eq!(f32s(&got), [96.5], "3 + 0.5 + 100 - 7");

        let name = g.contiguous(b"counter");
        let rets = ok(s.execute(&request(Op::ModuleGetGlobal, &[mf], vec![name], vec![])));
        let (counter, size) = (rets[0], rets[1]);
        assert_eq!(size, 64);
        let (r, got) = dtoh(&mut g, &mut s, counter, 64, false, 0);
        ok(r);
        let counts: Vec<i32> = got
            .chunks_exact(4)
            .map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        assert_eq!(counts, [1; 16], "16 threads, 16 counters");
        ok(htod(&mut g, &mut s, counter, &[0; 64], false, 0));
        assert_eq!(
            htod(&mut g, &mut s, counter, &[0; 65], false, 0).status,
            status::INVALID_VALUE
        );

        let (scale, params) = function(&mut g, &mut s, mf, SCALE_FLOAT);
        assert_eq!(params, [(0, 8), (8, 4), (12, 4)]);
        let mut pb = Vec::new();
        pb.extend_from_slice(&a.to_le_bytes());
        pb.extend_from_slice(&2.0f32.to_le_bytes());
        pb.extend_from_slice(&1000i32.to_le_bytes());
        ok(launch(&mut g, &mut s, scale, 4, 256, &pb, 0));
        let (r, got) = dtoh(&mut g, &mut s, a, 4000, true, 0);
        ok(r);
        let scaled: Vec<f32> = xs[..1000].iter().map(|x| x * 2.0).collect();
        assert_eq!(f32s(&got), scaled);
        ok(htod(&mut g, &mut s, a, &bytes_of(&xs[..1000]), false, 0));
        ok(call(&mut s, Op::ModuleUnload, &[mf]));
        assert_eq!(
            htod(&mut g, &mut s, counter, &[0; 4], false, 0).status,
            status::INVALID_VALUE
        );
    }

    // Streams and events: an async launch timed by events, async copies on the stream.
    let st = ok(call(&mut s, Op::StreamCreate, &[1, 0]))[0];
    let e1 = ok(call(&mut s, Op::EventCreate, &[0]))[0];
    let e2 = ok(call(&mut s, Op::EventCreate, &[0]))[0];
    ok(call(&mut s, Op::Memset, &[c, 0, bytes as u64, st]));
    ok(call(&mut s, Op::EventRecord, &[e1, st]));
    ok(launch(
        &mut g,
        &mut s,
        vadd,
        u32::try_from(n / 256).unwrap(),
        256,
        &pb,
        st,
    ));
    ok(call(&mut s, Op::EventRecord, &[e2, st]));
    ok(call(&mut s, Op::EventSynchronize, &[e2]));
    ok(call(&mut s, Op::EventQuery, &[e2]));
    let ms = ok(call(&mut s, Op::EventElapsedTime, &[e1, e2]))[0];
    let ms = f32::from_bits(u32::try_from(ms).unwrap());
    assert!((0.0..10_000.0).contains(&ms), "elapsed {ms} ms");
    ok(call(&mut s, Op::StreamQuery, &[st]));
    let (r, got) = dtoh(&mut g, &mut s, c, bytes, true, st);
    ok(r);
    assert_eq!(f32s(&got), want, "vadd on a stream");
    ok(htod(&mut g, &mut s, b, &bytes_of(&ys), true, st));
    ok(call(&mut s, Op::StreamWaitEvent, &[0, e2, 0]));
    ok(call(&mut s, Op::StreamSynchronize, &[st]));
    ok(call(&mut s, Op::MemcpyDtoD, &[c, b, bytes as u64, 0]));
    let (r, got) = dtoh(&mut g, &mut s, c, bytes, false, 0);
    ok(r);
    assert_eq!(f32s(&got), ys, "DtoD");
    ok(call(&mut s, Op::StreamDestroy, &[st]));
    ok(call(&mut s, Op::EventDestroy, &[e1]));
    ok(call(&mut s, Op::EventDestroy, &[e2]));
    assert_eq!(
        call(&mut s, Op::StreamQuery, &[st]).status,
        status::INVALID_RESOURCE_HANDLE
    );

    // Free, double free.
    for p in [a, b, c] {
        ok(call(&mut s, Op::Free, &[p]));
    }
    assert_eq!(call(&mut s, Op::Free, &[a]).status, status::INVALID_VALUE);

    // Dropping the sessions gives every byte back.
    let p = ok(call(&mut s, Op::Malloc, &[64 << 20]))[0];
    assert_ne!(p, 0);
    drop(s);
    let free_after = free_memory(&mut observer);
    println!("free memory: before {free_before}, during {free_during}, after {free_after}");
    assert!(
        free_after + (4 << 20) >= free_before,
        "leaked: {free_before} -> {free_after}"
    );

    // Endless kernels, kernel faults and what one session's kernel can do to another's memory
    // across worker processes: tests/worker_gpu.rs. Here, in one process, only what the driver
    // gives (docs/executor.md, "What the driver gives").

    // Observed, not asserted: the contexts of one process share one GPU address space, so a
    // kernel of one session can write memory of another (what only separate processes stop).
    let mut sa = GpuState::open(&host, 4);
    let mut sb = GpuState::open(&host, 5);
    let pa = ok(call(&mut sa, Op::Malloc, &[64]))[0];
    ok(call(&mut sa, Op::Memset, &[pa, 1, 64, 0]));
    let mb = load(&mut g, &mut sb, VADD_PTX.as_bytes());
    let (poke_b, _) = function(&mut g, &mut sb, mb, "poke");
    ok(launch(&mut g, &mut sb, poke_b, 1, 1, &pa.to_le_bytes(), 0));
    ok(call(&mut sb, Op::DeviceSynchronize, &[]));
    let (r, got) = dtoh(&mut g, &mut sa, pa, 4, false, 0);
    ok(r);
    println!(
        "note: a kernel of session 5 writing session 4's memory: {}",
        if got == 42i32.to_le_bytes() {
            "succeeded (one address space per process)"
        } else {
            "had no effect"
        }
    );
    drop(sa);
    drop(sb);

    precopy_on_the_gpu(&host);

    // Last, because it corrupts CUDA for the whole process: a sticky error. The faulting
    // session, every other session and every later one answer it with RESP_FLAG_STICKY.
    let mut f = GpuState::open(&host, 2);
    let mf = load(&mut g, &mut f, VADD_PTX.as_bytes());
    let (poke, _) = function(&mut g, &mut f, mf, "poke");
    ok(launch(
        &mut g,
        &mut f,
        poke,
        1,
        1,
        &0x10u64.to_le_bytes(),
        0,
    ));
    let r = call(&mut f, Op::DeviceSynchronize, &[]);
    println!("kernel writing to 0x10: status {}", r.status);
    assert!(
        [status::ILLEGAL_ADDRESS, status::LAUNCH_FAILURE].contains(&r.status),
        "{r:?}"
    );
    assert_eq!(r.flags, RESP_FLAG_STICKY);
    let sticky = r.status;
    assert_eq!(host.sticky_error(), Some(sticky));
    let r = call(&mut f, Op::Malloc, &[64]);
    assert_eq!((r.status, r.flags), (sticky, RESP_FLAG_STICKY));
    let r = call(&mut observer, Op::MemGetInfo, &[]);
    assert_eq!((r.status, r.flags), (sticky, RESP_FLAG_STICKY));
    let mut late = GpuState::open(&host, 6);
    let r = call(&mut late, Op::Malloc, &[64]);
    assert_eq!((r.status, r.flags), (sticky, RESP_FLAG_STICKY));
    let r = call(&mut late, Op::DeviceCount, &[]);
    assert_eq!((r.status, r.flags), (status::SUCCESS, RESP_FLAG_STICKY));
    let r = call(&mut f, Op::DeviceReset, &[]);
    assert_eq!((r.status, r.flags), (status::SUCCESS, RESP_FLAG_STICKY));
    // Sessions still close.
    drop(f);
    drop(late);
    drop(observer);
}

/// Random bytes (xorshift64*, seeded).
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        v.extend_from_slice(&seed.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Device-memory pre-copy on the GPU: the hash kernel computes the CPU reference's hashes
/// (random data of odd sizes and alignments, several ranges in one launch); a round sends
/// every chunk and the pass after it, hashed on the GPU, finds them all as sent (GPU and CPU
/// agree); the final save refers to them, and a restore from the round's log gives every
/// byte back.
fn precopy_on_the_gpu(host: &std::sync::Arc<CudaHost>) {
    const CHUNK: usize = 2 << 20;
    let mut g = Guest::new();
    let mut s = GpuState::open(host, 7);
    let len = 3 * CHUNK + 5;
    let data = random_bytes(len, 0x9e37_79b9_7f4a_7c15);
    let a = ok(call(&mut s, Op::Malloc, &[len as u64]))[0];
    ok(htod(&mut g, &mut s, a, &data, false, 0));
    let ranges = [
        (1, 0),
        (7, 1),
        (CHUNK, 0),
        (CHUNK - 3, 3),
        (CHUNK + 1, CHUNK - 1),
        (len, 0),
        (5, 3 * CHUNK),
        (0, 17),
    ];
    let asked: Vec<(u32, u64, u64)> = ranges
        .iter()
        .map(|&(n, at)| (0, a + at as u64, n as u64))
        .collect();
    let got = s.hash_chunks(&asked).expect("the kernel runs");
    for (&(n, at), h) in ranges.iter().zip(&got) {
        assert_eq!(*h, precopy::hash(&data[at..at + n]), "{n} bytes at +{at}");
    }
    println!(
        "pre-copy hash kernel: {} ranges as the CPU reference",
        got.len()
    );
    // One range alone, each odd size.
    for (n, at) in [(1, 0), (7, 0), (CHUNK, 0), (CHUNK - 3, 0)] {
        let h = s.hash_chunks(&[(0, a + at, n as u64)]).unwrap();
        assert_eq!(h[0], precopy::hash(&data[..n]), "{n} bytes alone");
    }

    let mut log = Vec::new();
    let f = s.precopy_round(64 << 20, 2, &mut log).unwrap();
    assert_eq!((f.chunks, f.bytes), (4, len as u64), "{f:?}");
    // Pass 2 (hashed on the GPU) found every chunk as sent (hashed on the CPU).
    assert_eq!((f.pending, f.pass), (0, 2), "{f:?}");
    assert_eq!(precopy::check_log(&log).unwrap().chunks, 4);
    let saved = s.save().unwrap();
    drop(s);
    let mut r = GpuState::restore_with_store(host, 7, &saved, Some(&log)).unwrap();
    let (resp, back) = dtoh(&mut g, &mut r, a, len, false, 0);
    ok(resp);
    assert!(back == data, "restored from the pre-copy store");
    println!(
        "pre-copy: {} bytes in 4 chunks restored from the store",
        len
    );
}

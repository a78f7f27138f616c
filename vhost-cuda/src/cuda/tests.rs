//! Session tests over the fake driver (every op, every check) and over no driver at all.

use std::sync::Arc;

use qcuda_proto::{
    status, Direction, GpuInfo, Op, ParamInfo, RequestHeader, ResponseHeader, FLAG_ASYNC,
    GPU_INFO_SIZE, MAX_ARGS, RESP_FLAG_STICKY,
};
use vm_memory::{Bytes, GuestAddress};

use super::{
    driver::fake::{FakeDriver, TOTAL_MEM},
    driver::DriverLoad,
    host::{CudaHost, Tuning},
    launch::LaunchConfig,
    module_image::tests::fatbin,
    GpuState, HostError,
};
use crate::guest_buffer::{GuestBuffer, GuestRam, Request};

#[path = "tests_arrays.rs"]
mod arrays;
#[path = "tests_vmm.rs"]
mod vmm;

const RAM: usize = 32 << 20;
const PTX: &[u8] = b".version 9.0\n.target sm_90\n.address_size 64\n";

/// Guest RAM, a fake driver and a host over it, with tiny staging so that every copy path is
/// taken by small buffers.
struct Rig {
    mem: Arc<GuestRam>,
    fake: Arc<FakeDriver>,
    host: Arc<CudaHost>,
    next: u64,
}

impl Rig {
    fn new(gpus: i32) -> Self {
        Self::with_fake(FakeDriver::new(gpus))
    }

    fn with_fake(fake: FakeDriver) -> Self {
        Self::with_staging(fake, 64)
    }

    /// A rig whose contexts' staging buffers have halves of `staging_half` bytes (64 above:
    /// too small to be used, so most copies go straight to the guest's pages).
    fn with_staging(fake: FakeDriver, staging_half: usize) -> Self {
        // File-backed, as QEMU's memfd is, so that HostMap can map it.
        // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"qcuda-exec-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(RAM as u64).unwrap();
        let mem = Arc::new(
            GuestRam::from_ranges_with_files([(
                GuestAddress(0),
                RAM,
                Some(vm_memory::FileOffset::new(file, 0)),
            )])
            .unwrap(),
        );
        let fake = Arc::new(fake);
        let tuning = Tuning {
            staging_half,
            direct_min: 100,
            max_registered_ram: 0,
            ..Tuning::default()
        };
        let host = Arc::new(CudaHost::from_driver(fake.clone(), 13000, None, tuning).unwrap());
        Self {
            mem,
            fake,
            host,
            next: 0x1000,
        }
    }

    fn session(&self) -> GpuState {
        GpuState::open(&self.host, 1)
    }

    /// A guest buffer holding `data`, split into runs of the given lengths (cycled) that lie
    /// at scattered, descending guest addresses.
    fn buf_runs(&mut self, data: &[u8], run_lens: &[usize]) -> GuestBuffer {
        let mut ranges = Vec::new();
        let mut at = 0usize;
        let mut i = 0usize;
        while at < data.len() {
            let n = run_lens[i % run_lens.len()].min(data.len() - at).max(1);
            ranges.push((at, n));
            at += n;
            i += 1;
        }
        // Place the runs in reverse order in guest RAM, with gaps between them.
        let mut placed = vec![GuestAddress(0); ranges.len()];
        for (k, &(off, n)) in ranges.iter().enumerate().rev() {
            let addr = GuestAddress(self.next);
            self.mem.write_slice(&data[off..off + n], addr).unwrap();
            placed[k] = addr;
            self.next += n as u64 + 96;
        }
        assert!(self.next < RAM as u64, "rig out of guest RAM");
        GuestBuffer::new(
            self.mem.clone(),
            ranges.iter().zip(&placed).map(|(&(_, n), &a)| (a, n)),
        )
        .unwrap()
    }

    /// A contiguous guest buffer holding `data`.
    fn buf(&mut self, data: &[u8]) -> GuestBuffer {
        let len = data.len().max(1);
        self.buf_runs(data, &[len])
    }

    /// A contiguous guest buffer of `len` bytes filled with 0xee.
    fn out(&mut self, len: usize) -> GuestBuffer {
        self.buf(&vec![0xee; len])
    }

    fn out_runs(&mut self, len: usize, run_lens: &[usize]) -> GuestBuffer {
        self.buf_runs(&vec![0xee; len], run_lens)
    }
}

/// A request for `op`. Buffers the op's shape has beyond those given are empty ones (the
/// edge-data buffers of the graph ops: default edges, no room for any).
fn req(
    op: Op,
    device: u32,
    args: &[u64],
    mut inputs: Vec<GuestBuffer>,
    mut outputs: Vec<GuestBuffer>,
) -> Request {
    let (ins, outs) = op.shape();
    let empty = || {
        let mem = Arc::new(GuestRam::from_ranges(&[(GuestAddress(0), 4096)]).unwrap());
        GuestBuffer::new(mem, []).unwrap()
    };
    while inputs.len() < ins {
        inputs.push(empty());
    }
    while outputs.len() < outs {
        outputs.push(empty());
    }
    let mut header = RequestHeader::new(op);
    header.device = device;
    header.session = 1;
    header.args[..args.len()].copy_from_slice(args);
    for b in &inputs {
        header.push_buffer(Direction::In, b.len() as u64).unwrap();
    }
    for b in &outputs {
        header.push_buffer(Direction::Out, b.len() as u64).unwrap();
    }
    Request::new(header, inputs, outputs).unwrap_or_else(|e| panic!("{op:?}: {e}"))
}

/// `r` with `FLAG_ASYNC` set.
fn fire_and_forget(r: Request) -> Request {
    let mut header = *r.header();
    header.flags = FLAG_ASYNC;
    Request::new(header, r.inputs().to_vec(), r.outputs().to_vec()).unwrap()
}

/// Runs `op` with no data: its buffers, if its shape has any, are empty.
fn run(s: &mut GpuState, op: Op, args: &[u64]) -> ResponseHeader {
    let (ins, outs) = op.shape();
    let empty = || {
        let mem = Arc::new(GuestRam::from_ranges(&[(GuestAddress(0), 4096)]).unwrap());
        GuestBuffer::new(mem, []).unwrap()
    };
    let inputs = (0..ins).map(|_| empty()).collect();
    let outputs = (0..outs).map(|_| empty()).collect();
    s.execute(&req(op, 0, args, inputs, outputs))
}

fn ok(r: ResponseHeader) -> [u64; 7] {
    assert_eq!(r.status, status::SUCCESS, "{r:?}");
    r.rets
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "test data: the low byte of i * 7 + 3, truncation intended"
)]
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// A signed argument as the guest library sends it: sign-extended into its 64-bit slot.
#[expect(
    clippy::cast_sign_loss,
    reason = "the wire carries a signed argument as its two's-complement bits"
)]
fn signed_arg(v: i64) -> u64 {
    v as u64
}

/// A C `int` in an unsigned 32-bit field, as the C API puts one there.
#[expect(
    clippy::cast_sign_loss,
    reason = "a C int reinterpreted as unsigned, as the C API defines it"
)]
fn int_bits(v: i32) -> u32 {
    v as u32
}

/// A C `int` result, from the low 32 bits of its 64-bit return slot.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "the wire carries an int result as its 32 bits in the low half of the slot"
)]
fn int_ret(v: u64) -> i32 {
    v as u32 as i32
}

fn malloc(s: &mut GpuState, size: u64) -> u64 {
    ok(run(s, Op::Malloc, &[size]))[0]
}

fn htod(rig: &mut Rig, s: &mut GpuState, dst: u64, data: &[u8], runs: &[usize]) -> ResponseHeader {
    let b = rig.buf_runs(data, runs);
    s.execute(&req(Op::MemcpyHtoD, 0, &[dst, 0], vec![b], vec![]))
}

fn dtoh(
    rig: &mut Rig,
    s: &mut GpuState,
    src: u64,
    len: usize,
    runs: &[usize],
) -> (ResponseHeader, Vec<u8>) {
    let b = rig.out_runs(len, runs);
    let r = s.execute(&req(Op::MemcpyDtoH, 0, &[src, 0], vec![], vec![b.clone()]));
    (r, b.to_vec().unwrap())
}

fn load_module(rig: &mut Rig, s: &mut GpuState) -> u64 {
    let img = rig.buf(PTX);
    ok(s.execute(&req(Op::ModuleLoad, 0, &[], vec![img], vec![])))[0]
}

fn get_function(
    rig: &mut Rig,
    s: &mut GpuState,
    module: u64,
    name: &str,
    out_len: usize,
) -> (ResponseHeader, Vec<ParamInfo>) {
    let n = rig.buf(name.as_bytes());
    let out = rig.out(out_len);
    let r = s.execute(&req(
        Op::ModuleGetFunction,
        0,
        &[module],
        vec![n],
        vec![out.clone()],
    ));
    let params = out
        .to_vec()
        .unwrap()
        .chunks_exact(8)
        .map(|c| ParamInfo::decode(c).unwrap())
        .collect();
    (r, params)
}

fn launch_args(func: u64, grid: [u32; 3], block: [u32; 3], stream: u64) -> [u64; MAX_ARGS] {
    let mut a = [0u64; MAX_ARGS];
    a[0] = func;
    a[1..5].copy_from_slice(
        &LaunchConfig {
            grid,
            block,
            shared_mem: 0,
        }
        .encode(),
    );
    a[5] = stream;
    a
}

#[test]
fn session_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<GpuState>();
    fn assert_sync<T: Send + Sync>() {}
    assert_sync::<CudaHost>();
}

#[test]
fn probe_never_panics_and_is_consistent() {
    let host = CudaHost::probe();
    if host.driver_version() == 0 {
        assert_eq!(host.gpu_count(), 0);
    }
    match CudaHost::with_gpu_filter(Some(1000)) {
        Ok(h) => assert_eq!(h.gpu_count(), 0),
        Err(HostError::NoSuchGpu { requested, .. }) => assert_eq!(requested, 1000),
    }
}

#[test]
fn no_driver_answers_every_op_without_panicking() {
    let host = Arc::new(CudaHost::without_driver());
    assert_eq!((host.gpu_count(), host.driver_version()), (0, 0));
    let mem = Arc::new(GuestRam::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let mut s = GpuState::open(&host, 9);
    for &op in Op::ALL {
        let (ins, outs) = op.shape();
        let b = |i: u64| GuestBuffer::new(mem.clone(), [(GuestAddress(i * 4096), 640)]).unwrap();
        let inputs: Vec<GuestBuffer> = (0..ins as u64).map(b).collect();
        let outputs: Vec<GuestBuffer> = (0..outs as u64).map(|i| b(i + 8)).collect();
        for device in [0, 1, u32::MAX] {
            let args = [1, 2, u64::MAX, 0, 4, 5, 6, 7];
            let r = fire_and_forget(req(op, device, &args, inputs.clone(), outputs.clone()));
            let resp = s.execute(&r);
            let want = match op {
                Op::HostInfo | Op::DriverVersion => status::SUCCESS,
                Op::Hello | Op::Echo | Op::SessionClose | Op::DriverReset => status::NOT_SUPPORTED,
                _ => status::NO_DEVICE,
            };
            assert_eq!(resp.status, want, "{op:?}");
            assert_eq!(resp.flags, 0);
            assert_eq!(resp.rets, [0; 7], "{op:?}");
        }
    }
}

#[test]
fn an_unusable_driver_answers_its_status() {
    let load = DriverLoad::Unusable {
        version: 12080,
        status: status::INSUFFICIENT_DRIVER,
    };
    let host = Arc::new(CudaHost::from_load(load, Some(0)).unwrap());
    assert_eq!((host.gpu_count(), host.driver_version()), (0, 12080));
    let mut s = GpuState::open(&host, 1);
    let r = run(&mut s, Op::DeviceCount, &[]);
    assert_eq!((r.status, r.rets[0]), (status::INSUFFICIENT_DRIVER, 0));
    assert_eq!(
        run(&mut s, Op::Malloc, &[16]).status,
        status::INSUFFICIENT_DRIVER
    );
    assert_eq!(ok(run(&mut s, Op::DriverVersion, &[]))[0], 12080);
}

#[test]
fn host_and_device_queries() {
    let mut rig = Rig::new(2);
    let mut s = rig.session();
    let out = rig.out(2 * GPU_INFO_SIZE + 10);
    let rets = ok(s.execute(&req(Op::HostInfo, 0, &[], vec![], vec![out.clone()])));
    assert_eq!(rets[..2], [2, 13000]);
    let bytes = out.to_vec().unwrap();
    let g1 = GpuInfo::decode(&bytes[GPU_INFO_SIZE..]).unwrap();
    assert_eq!(g1.name_bytes(), b"Fake GPU 1");
    assert_eq!((g1.cc_major, g1.cc_minor, g1.multiprocessors), (9, 0, 132));
    assert_eq!((g1.pci_bus, g1.total_mem), (0x1c, TOTAL_MEM));
    assert_eq!(bytes[2 * GPU_INFO_SIZE..], [0xee; 10]);
    // A buffer too small for one record: the count still comes back.
    let small = rig.out(100);
    let rets = ok(s.execute(&req(Op::HostInfo, 0, &[], vec![], vec![small.clone()])));
    assert_eq!(rets[0], 2);
    assert_eq!(small.to_vec().unwrap(), vec![0xee; 100]);

    assert_eq!(ok(run(&mut s, Op::DeviceCount, &[]))[0], 2);
    assert_eq!(ok(run(&mut s, Op::DriverVersion, &[]))[0], 13000);

    let out = rig.out(GPU_INFO_SIZE);
    ok(s.execute(&req(Op::DeviceInfo, 1, &[], vec![], vec![out.clone()])));
    assert_eq!(GpuInfo::decode(&out.to_vec().unwrap()).unwrap(), g1);
    let out = rig.out(GPU_INFO_SIZE);
    let r = s.execute(&req(Op::DeviceInfo, 2, &[], vec![], vec![out]));
    assert_eq!(r.status, status::INVALID_DEVICE);
    let out = rig.out(GPU_INFO_SIZE - 1);
    let r = s.execute(&req(Op::DeviceInfo, 0, &[], vec![], vec![out]));
    assert_eq!(r.status, status::INVALID_VALUE);

    let ids: Vec<u8> = [75i32, 76, 1, 16]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let (i, o) = (rig.buf(&ids), rig.out(16));
    ok(s.execute(&req(Op::DeviceAttributes, 1, &[], vec![i], vec![o.clone()])));
    let vals: Vec<i32> = o
        .to_vec()
        .unwrap()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(vals, [9, 0, 1024, 132]);
    let ids: Vec<u8> = [75i32, 9999].iter().flat_map(|v| v.to_le_bytes()).collect();
    let (i, o) = (rig.buf(&ids), rig.out(8));
    let r = s.execute(&req(Op::DeviceAttributes, 0, &[], vec![i], vec![o.clone()]));
    assert_eq!(r.status, status::INVALID_VALUE);
    assert_eq!(
        o.to_vec().unwrap(),
        vec![0xee; 8],
        "nothing written on failure"
    );
    let (i, o) = (rig.buf(&[0; 8]), rig.out(4));
    let r = s.execute(&req(Op::DeviceAttributes, 0, &[], vec![i], vec![o]));
    assert_eq!(r.status, status::INVALID_VALUE);
    let (i, o) = (rig.buf(&[0; 6]), rig.out(6));
    let r = s.execute(&req(Op::DeviceAttributes, 0, &[], vec![i], vec![o]));
    assert_eq!(r.status, status::INVALID_VALUE);

    // None of this needs a context.
    assert_eq!(rig.fake.calls("ctx_create"), 0);
}

#[test]
fn gpu_filter_exposes_one_gpu_as_device_zero() {
    let fake = Arc::new(FakeDriver::new(3));
    let host = CudaHost::from_driver(fake.clone(), 13000, Some(2), Tuning::default()).unwrap();
    assert_eq!(host.gpu_count(), 1);
    assert_eq!(host.gpu_info(0).unwrap().name_bytes(), b"Fake GPU 2");
    assert_eq!(host.gpus[0].host_ordinal, 2);
    assert!(host.gpu_info(1).is_none());
    let err = CudaHost::from_driver(fake, 13000, Some(3), Tuning::default()).unwrap_err();
    assert_eq!(
        err,
        HostError::NoSuchGpu {
            requested: 3,
            available: 3
        }
    );
}

#[test]
fn copies_round_trip_through_staging_and_direct_runs() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let ptr = malloc(&mut s, 1000);
    let data = pattern(1000);
    // Runs of 10, 30, 150 (direct), 7, 64, 200 (direct), 1, ... with a 64-byte staging half.
    ok(htod(
        &mut rig,
        &mut s,
        ptr,
        &data,
        &[10, 30, 150, 7, 64, 200, 1],
    ));
    assert_eq!(rig.fake.peek(ptr, 1000).unwrap(), data);
    for runs in [&[1000][..], &[3, 5, 120, 64, 65, 1], &[13], &[99, 100, 101]] {
        let (r, got) = dtoh(&mut rig, &mut s, ptr, 1000, runs);
        ok(r);
        assert_eq!(got, data, "{runs:?}");
    }
    // A window in the middle.
    let (r, got) = dtoh(&mut rig, &mut s, ptr + 100, 50, &[7]);
    ok(r);
    assert_eq!(got, data[100..150]);
    // One staging buffer per context, reused.
    assert_eq!(rig.fake.calls("mem_alloc_host"), 1);
    // On a stream of the session.
    let stream = ok(run(&mut s, Op::StreamCreate, &[1, 0]))[0];
    let b = rig.buf_runs(&data[..300], &[40]);
    ok(s.execute(&req(
        Op::MemcpyHtoD,
        0,
        &[ptr + 700, stream],
        vec![b],
        vec![],
    )));
    assert_eq!(rig.fake.peek(ptr + 700, 300).unwrap(), data[..300]);
    let b = rig.out_runs(300, &[33]);
    ok(s.execute(&req(
        Op::MemcpyDtoH,
        0,
        &[ptr + 700, stream],
        vec![],
        vec![b.clone()],
    )));
    assert_eq!(b.to_vec().unwrap(), data[..300]);
    // Every copy ended with a stream synchronisation.
    assert!(rig.fake.calls("stream_synchronize") >= 7);
    // Empty copies succeed without touching the driver.
    let before = rig.fake.calls("memcpy_htod");
    let empty = GuestBuffer::new(rig.mem.clone(), []).unwrap();
    ok(s.execute(&req(Op::MemcpyHtoD, 0, &[12345, 0], vec![empty], vec![])));
    assert_eq!(rig.fake.calls("memcpy_htod"), before);
}

#[test]
fn copies_go_direct_when_staging_cannot_be_allocated() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let ptr = malloc(&mut s, 500);
    rig.fake.fail_next("mem_alloc_host", 2);
    let data = pattern(500);
    ok(htod(&mut rig, &mut s, ptr, &data, &[7, 11]));
    let (r, got) = dtoh(&mut rig, &mut s, ptr, 500, &[5]);
    ok(r);
    assert_eq!(got, data);
    assert_eq!(rig.fake.calls("mem_alloc_host"), 1, "not retried");
}

#[test]
fn device_pointers_are_checked_against_the_session_allocations() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let a = malloc(&mut s, 256);
    let b = malloc(&mut s, 256);
    let bad = status::INVALID_VALUE;
    let data = pattern(100);
    assert_eq!(htod(&mut rig, &mut s, a + 200, &data, &[100]).status, bad);
    // Past the end of the last allocation (blocks of one size are neighbours, so the byte
    // after `a` may well be `b`'s first).
    let last = a.max(b);
    assert_eq!(
        htod(&mut rig, &mut s, last + 256, &data[..1], &[1]).status,
        bad
    );
    assert_eq!(htod(&mut rig, &mut s, 0x1234, &data, &[100]).status, bad);
    assert_eq!(
        htod(&mut rig, &mut s, u64::MAX - 10, &data, &[100]).status,
        bad
    );
    assert_eq!(dtoh(&mut rig, &mut s, a + 1, 256, &[256]).0.status, bad);
    ok(htod(&mut rig, &mut s, a + 156, &data, &[100]));

    ok(run(&mut s, Op::MemcpyDtoD, &[b, a, 256, 0]));
    assert_eq!(rig.fake.peek(b + 156, 100).unwrap(), data);
    assert_eq!(run(&mut s, Op::MemcpyDtoD, &[b, a + 1, 256, 0]).status, bad);
    assert_eq!(run(&mut s, Op::MemcpyDtoD, &[b + 1, a, 256, 0]).status, bad);
    assert_eq!(
        run(&mut s, Op::MemcpyDtoD, &[b, a, u64::MAX, 0]).status,
        bad
    );
    ok(run(&mut s, Op::MemcpyDtoD, &[0, 0, 0, 0]));

    ok(run(&mut s, Op::Memset, &[a, 0x1ab, 256, 0]));
    assert_eq!(rig.fake.peek(a, 256).unwrap(), vec![0xab; 256]);
    assert_eq!(run(&mut s, Op::Memset, &[a + 250, 0, 10, 0]).status, bad);
    assert_eq!(
        run(&mut s, Op::Memset, &[a, 0, 16, 777]).status,
        status::INVALID_RESOURCE_HANDLE
    );

    assert_eq!(run(&mut s, Op::Free, &[a + 1]).status, bad);
    ok(run(&mut s, Op::Free, &[a]));
    assert_eq!(run(&mut s, Op::Free, &[a]).status, bad);
    assert_eq!(htod(&mut rig, &mut s, a, &data, &[100]).status, bad);
    ok(run(&mut s, Op::Free, &[0]));
    assert_eq!(ok(run(&mut s, Op::Malloc, &[0]))[0], 0);
    assert_eq!(
        run(&mut s, Op::Malloc, &[TOTAL_MEM + 1]).status,
        status::MEMORY_ALLOCATION
    );
    let r = s.execute(&req(Op::Malloc, 1, &[16], vec![], vec![]));
    assert_eq!(r.status, status::INVALID_DEVICE);
    let r = s.execute(&req(Op::Malloc, u32::MAX, &[16], vec![], vec![]));
    assert_eq!(r.status, status::INVALID_DEVICE);

    // Another session cannot touch this session's memory.
    let mut other = rig.session();
    let r = other.execute(&req(Op::MemcpyDtoD, 0, &[b, b, 16, 0], vec![], vec![]));
    assert_eq!(r.status, bad);
    assert_eq!(run(&mut other, Op::Free, &[b]).status, bad);
}

#[test]
fn modules_functions_and_launches() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);

    let (r, params) = get_function(&mut rig, &mut s, m, "vadd", 40);
    let rets = ok(r);
    let f = rets[0];
    assert_eq!(rets[1], 4);
    let want = [(0, 8), (8, 8), (16, 8), (24, 4)].map(|(offset, size)| ParamInfo { offset, size });
    assert_eq!(params[..4], want);
    // Short output buffer: two records fit, the count is still 4, the rest is untouched.
    let (r, params) = get_function(&mut rig, &mut s, m, "vadd", 20);
    let rets = ok(r);
    assert_eq!((rets[0], rets[1]), (f, 4), "same function, same handle");
    assert_eq!(params[..2], want[..2]);
    assert_eq!(
        rig.fake.calls("function_param_info"),
        5,
        "layout asked once"
    );

    assert_eq!(
        get_function(&mut rig, &mut s, m, "nope", 8).0.status,
        status::SYMBOL_NOT_FOUND
    );
    assert_eq!(
        get_function(&mut rig, &mut s, m, "va\0dd", 8).0.status,
        status::INVALID_VALUE
    );
    assert_eq!(
        get_function(&mut rig, &mut s, m, &"x".repeat(4097), 8)
            .0
            .status,
        status::INVALID_VALUE
    );
    let empty = GuestBuffer::new(rig.mem.clone(), []).unwrap();
    let out = rig.out(8);
    let r = s.execute(&req(Op::ModuleGetFunction, 0, &[m], vec![empty], vec![out]));
    assert_eq!(r.status, status::INVALID_VALUE);
    assert_eq!(
        get_function(&mut rig, &mut s, 999, "vadd", 8).0.status,
        status::INVALID_RESOURCE_HANDLE
    );

    // A lazily loaded function: param info after cuFuncLoad.
    let (r, params) = get_function(&mut rig, &mut s, m, "lazy", 8);
    assert_eq!(ok(r)[1], 1);
    assert_eq!(params[0], ParamInfo { offset: 0, size: 1 });
    assert_eq!(rig.fake.calls("function_load"), 1);

    // c = a + b over 100 floats.
    let n = 100usize;
    let (a, b, c) = (
        malloc(&mut s, 400),
        malloc(&mut s, 400),
        malloc(&mut s, 400),
    );
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let ys: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    ok(htod(&mut rig, &mut s, a, &floats(&xs), &[400]));
    ok(htod(&mut rig, &mut s, b, &floats(&ys), &[17]));
    let mut block = Vec::new();
    for p in [a, b, c] {
        block.extend_from_slice(&p.to_le_bytes());
    }
    block.extend_from_slice(&i32::try_from(n).unwrap().to_le_bytes());
    let pb = rig.buf(&block);
    let args = launch_args(f, [1, 1, 1], [128, 1, 1], 0);
    let r = fire_and_forget(req(Op::LaunchKernel, 0, &args, vec![pb.clone()], vec![]));
    ok(s.execute(&r));
    let (r, got) = dtoh(&mut rig, &mut s, c, 400, &[400]);
    ok(r);
    let want: Vec<f32> = (0..n).map(|i| 1.5 * i as f32).collect();
    assert_eq!(got, floats(&want));

    // Parameter block too short or too long (a caller with the kernel's signature wrong), bad
    // geometry, bad handles.
    let short = rig.buf(&block[..27]);
    let r = s.execute(&req(Op::LaunchKernel, 0, &args, vec![short], vec![]));
    assert_eq!(r.status, status::INVALID_VALUE);
    let mut padded = block.clone();
    padded.extend_from_slice(&[0; 4]);
    let long = rig.buf(&padded);
    let r = s.execute(&req(Op::LaunchKernel, 0, &args, vec![long], vec![]));
    assert_eq!(r.status, status::INVALID_VALUE);
    for (grid, block_dim) in [
        ([1, 1, 1], [2048, 1, 1]),
        ([0, 1, 1], [1, 1, 1]),
        ([1, 65536, 1], [1, 1, 1]),
    ] {
        let a = launch_args(f, grid, block_dim, 0);
        let r = s.execute(&req(Op::LaunchKernel, 0, &a, vec![pb.clone()], vec![]));
        assert_eq!(r.status, status::INVALID_VALUE);
    }
    let mut big_smem = args;
    big_smem[4] = 1 << 33;
    let r = s.execute(&req(
        Op::LaunchKernel,
        0,
        &big_smem,
        vec![pb.clone()],
        vec![],
    ));
    assert_eq!(r.status, status::INVALID_VALUE);
    for bogus in [0, m, 12345] {
        let a = launch_args(bogus, [1, 1, 1], [1, 1, 1], 0);
        let r = s.execute(&req(Op::LaunchKernel, 0, &a, vec![pb.clone()], vec![]));
        assert_eq!(r.status, status::INVALID_RESOURCE_HANDLE);
    }
    let a = launch_args(f, [1, 1, 1], [1, 1, 1], 4242);
    let r = s.execute(&req(Op::LaunchKernel, 0, &a, vec![pb], vec![]));
    assert_eq!(r.status, status::INVALID_RESOURCE_HANDLE);
}

/// The VM's accounting (the quota file, here without a limit): a worker counts what it holds,
/// the most it held, and the launches the driver accepted, not the refused ones.
#[test]
fn attribute_and_occupancy_calls_load_the_function_before_its_first_launch() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    // Getting a function whose parameters the driver knows loads nothing.
    let f = ok(get_function(&mut rig, &mut s, m, "vadd", 64).0)[0];
    assert_eq!(rig.fake.calls("function_load"), 0);
    // The first attribute call loads it (cuFuncLoad), as natively; later ones do not again.
    let ids = rig.buf(&0i32.to_le_bytes());
    let out = rig.out(4);
    ok(s.execute(&req(
        Op::FuncAttributes,
        0,
        &[f],
        vec![ids.clone()],
        vec![out.clone()],
    )));
    assert_eq!(rig.fake.calls("function_load"), 1);
    ok(s.execute(&req(Op::FuncAttributes, 0, &[f], vec![ids], vec![out])));
    ok(run(&mut s, Op::OccupancyMaxActiveBlocks, &[f, 128, 0, 0]));
    assert_eq!(rig.fake.calls("function_load"), 1);

    // Each of the others loads a function not yet loaded: occupancy, setting an attribute.
    let g = ok(get_function(&mut rig, &mut s, m, "spin", 64).0)[0];
    ok(run(&mut s, Op::OccupancyMaxActiveBlocks, &[g, 128, 0, 0]));
    assert_eq!(rig.fake.calls("function_load"), 2);
    let m2 = load_module(&mut rig, &mut s);
    let h = ok(get_function(&mut rig, &mut s, m2, "vadd", 64).0)[0];
    ok(run(&mut s, Op::FuncSetAttribute, &[h, 8, 1024]));
    assert_eq!(rig.fake.calls("function_load"), 3);
}

#[test]
fn accounting_counts_memory_peak_and_accepted_launches() {
    use crate::limits::{GpuMemoryQuota, QuotaSlot, WorkerUsage, NO_LIMIT};
    use std::os::fd::FromRawFd;

    let mut rig = Rig::new(1);
    let quota = GpuMemoryQuota::new(NO_LIMIT, 2).unwrap();
    let lease = quota.lease().unwrap();
    // SAFETY: dup of an open descriptor returns a new one we own.
    let file = unsafe { std::fs::File::from_raw_fd(libc::dup(lease.fd())) };
    rig.host
        .set_memory_quota(QuotaSlot::attach(file, lease.index()).unwrap());
    let usage = lease.usage();
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let (r, _) = get_function(&mut rig, &mut s, m, "vadd", 64);
    let f = ok(r)[0];
    let (a, b, c) = (
        malloc(&mut s, 400),
        malloc(&mut s, 400),
        malloc(&mut s, 400),
    );
    let mut block = Vec::new();
    for p in [a, b, c] {
        block.extend_from_slice(&p.to_le_bytes());
    }
    block.extend_from_slice(&100i32.to_le_bytes());
    let pb = rig.buf(&block);
    let args = launch_args(f, [1, 1, 1], [128, 1, 1], 0);
    for _ in 0..2 {
        ok(s.execute(&req(Op::LaunchKernel, 0, &args, vec![pb.clone()], vec![])));
    }
    let bogus = launch_args(12345, [1, 1, 1], [1, 1, 1], 0);
    let r = s.execute(&req(Op::LaunchKernel, 0, &bogus, vec![pb], vec![]));
    assert_eq!(r.status, status::INVALID_RESOURCE_HANDLE);
    ok(run(&mut s, Op::Free, &[a]));
    assert_eq!(
        usage.read(),
        WorkerUsage {
            memory: 800,
            peak_memory: 1200,
            kernels: 2,
            graph_launches: 0,
            ..WorkerUsage::default()
        }
    );
    // The context goes, and with it the memory; the counts stay.
    drop(s);
    assert_eq!(usage.read().memory, 0);
    assert_eq!(usage.read().kernels, 2);
}

#[test]
fn module_images_are_checked_before_the_driver_sees_them() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    for (image, want) in [
        (b"garbage".to_vec(), status::INVALID_KERNEL_IMAGE),
        (
            fatbin(&[(2, 64, 100)])[..50].to_vec(),
            status::INVALID_KERNEL_IMAGE,
        ),
        (
            b"\x7fELF\x02\x01\x01".to_vec(),
            status::INVALID_KERNEL_IMAGE,
        ),
    ] {
        let b = rig.buf(&image);
        let r = s.execute(&req(Op::ModuleLoad, 0, &[], vec![b], vec![]));
        assert_eq!(r.status, want);
    }
    let empty = GuestBuffer::new(rig.mem.clone(), []).unwrap();
    let r = s.execute(&req(Op::ModuleLoad, 0, &[], vec![empty], vec![]));
    assert_eq!(r.status, status::INVALID_VALUE);
    assert_eq!(rig.fake.calls("module_load"), 0);
    // Valid shapes reach the driver, whose verdict is mapped.
    let b = rig.buf(&fatbin(&[(2, 64, 100), (1, 80, 40)]));
    ok(s.execute(&req(Op::ModuleLoad, 0, &[], vec![b], vec![])));
    rig.fake.fail_next("module_load", 218);
    let b = rig.buf(PTX);
    let r = s.execute(&req(Op::ModuleLoad, 0, &[], vec![b], vec![]));
    assert_eq!(r.status, status::INVALID_PTX);
    rig.fake.fail_next("module_load", 209);
    let b = rig.buf(PTX);
    let r = s.execute(&req(Op::ModuleLoad, 0, &[], vec![b], vec![]));
    assert_eq!(r.status, status::NO_KERNEL_IMAGE_FOR_DEVICE);
}

#[test]
fn globals_are_valid_ranges_until_their_module_is_unloaded() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let (f, _) = get_function(&mut rig, &mut s, m, "vadd", 0);
    let f = ok(f)[0];
    let name = rig.buf(b"g");
    let rets = ok(s.execute(&req(
        Op::ModuleGetGlobal,
        0,
        &[m],
        vec![name.clone()],
        vec![],
    )));
    let (g, size) = (rets[0], rets[1]);
    assert_eq!(size, 64);
    // Twice is fine (cudaMemcpyToSymbol looks it up each time).
    ok(s.execute(&req(Op::ModuleGetGlobal, 0, &[m], vec![name], vec![])));
    let data = pattern(64);
    ok(htod(&mut rig, &mut s, g, &data, &[64]));
    let (r, got) = dtoh(&mut rig, &mut s, g, 64, &[10]);
    ok(r);
    assert_eq!(got, data);
    assert_eq!(
        htod(&mut rig, &mut s, g, &pattern(65), &[65]).status,
        status::INVALID_VALUE
    );
    // A global is not freeable.
    assert_eq!(run(&mut s, Op::Free, &[g]).status, status::INVALID_VALUE);
    let nope = rig.buf(b"h");
    let r = s.execute(&req(Op::ModuleGetGlobal, 0, &[m], vec![nope], vec![]));
    assert_eq!(r.status, status::SYMBOL_NOT_FOUND);

    ok(run(&mut s, Op::ModuleUnload, &[m]));
    assert_eq!(
        htod(&mut rig, &mut s, g, &data, &[64]).status,
        status::INVALID_VALUE
    );
    let pb = rig.buf(&[0; 32]);
    let a = launch_args(f, [1, 1, 1], [1, 1, 1], 0);
    let r = s.execute(&req(Op::LaunchKernel, 0, &a, vec![pb], vec![]));
    assert_eq!(r.status, status::INVALID_RESOURCE_HANDLE);
    assert_eq!(
        run(&mut s, Op::ModuleUnload, &[m]).status,
        status::INVALID_RESOURCE_HANDLE
    );
}

#[test]
fn a_sticky_error_fails_every_session_from_then_on() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let mut other = rig.session();
    let q = malloc(&mut other, 64);
    let p = malloc(&mut s, 64);
    let m = load_module(&mut rig, &mut s);
    let (r, _) = get_function(&mut rig, &mut s, m, "fault", 8);
    let f = ok(r)[0];
    let pb = rig.buf(&8u64.to_le_bytes());
    let a = launch_args(f, [1, 1, 1], [1, 1, 1], 0);
    let r = s.execute(&req(Op::LaunchKernel, 0, &a, vec![pb], vec![]));
    assert_eq!(
        (r.status, r.flags),
        (status::SUCCESS, 0),
        "launch itself succeeds"
    );
    assert_eq!(rig.host.sticky_error(), None);

    let sticky = (status::ILLEGAL_ADDRESS, RESP_FLAG_STICKY);
    let r = run(&mut s, Op::DeviceSynchronize, &[]);
    assert_eq!((r.status, r.flags), sticky);
    assert_eq!(rig.host.sticky_error(), Some(status::ILLEGAL_ADDRESS));
    let calls = |rig: &Rig| (rig.fake.calls("mem_alloc"), rig.fake.calls("memset"));
    let before = calls(&rig);
    let r = run(&mut s, Op::Malloc, &[16]);
    assert_eq!((r.status, r.flags), sticky);
    let r = run(&mut s, Op::Free, &[p]);
    assert_eq!((r.status, r.flags), sticky);
    // Every other session too, old or new (as the real driver does), without driver calls.
    let r = other.execute(&req(Op::Memset, 0, &[q, 1, 64, 0], vec![], vec![]));
    assert_eq!((r.status, r.flags), sticky);
    let mut late = rig.session();
    let r = run(&mut late, Op::Malloc, &[16]);
    assert_eq!((r.status, r.flags), sticky);
    let r = run(&mut late, Op::DeviceSynchronize, &[]);
    assert_eq!((r.status, r.flags), sticky);
    assert_eq!(calls(&rig), before);
    assert_eq!(rig.fake.calls("ctx_create"), 2);
    // Ops that need no context still work, flagged.
    let out = rig.out(GPU_INFO_SIZE);
    let r = s.execute(&req(Op::DeviceInfo, 0, &[], vec![], vec![out]));
    assert_eq!((r.status, r.flags), (status::SUCCESS, RESP_FLAG_STICKY));
    let r = run(&mut s, Op::DeviceCount, &[]);
    assert_eq!((r.status, r.flags), (status::SUCCESS, RESP_FLAG_STICKY));

    // DeviceReset gives the context back; the error stays (it is the process's).
    let r = run(&mut s, Op::DeviceReset, &[]);
    assert_eq!((r.status, r.flags), (status::SUCCESS, RESP_FLAG_STICKY));
    assert_eq!(rig.fake.destroyed_contexts(), 1);
    assert_eq!(
        run(&mut s, Op::Malloc, &[16]).status,
        status::ILLEGAL_ADDRESS
    );
    // Sessions still close and free everything.
    drop(other);
    drop(late);
    drop(s);
    assert_eq!(rig.fake.live_contexts(), 0);
}

#[test]
fn a_warm_context_serves_the_first_use_of_its_gpu_once() {
    let rig = Rig::new(2);
    // A spare worker's warm-up: the context of guest device 0 made before any session.
    rig.host.warm_context(0).unwrap();
    assert_eq!(rig.fake.calls("ctx_create"), 1);
    // Device 0's first use takes it: no context is made; device 1's is made as always.
    let mut s = rig.session();
    let p = malloc(&mut s, 64);
    assert_ne!(p, 0);
    assert_eq!(rig.fake.calls("ctx_create"), 1);
    let r = s.execute(&req(Op::Malloc, 1, &[64], vec![], vec![]));
    assert_eq!(r.status, status::SUCCESS);
    assert_eq!(rig.fake.calls("ctx_create"), 2);
    // Taken once: a second session makes its own; every context goes with its session.
    let mut other = rig.session();
    let _ = malloc(&mut other, 64);
    assert_eq!(rig.fake.calls("ctx_create"), 3);
    drop(other);
    drop(s);
    assert_eq!(rig.fake.live_contexts(), 0);
    // Without the GPU there is nothing to warm.
    rig.host.warm_context(7).unwrap();
    assert_eq!(rig.fake.calls("ctx_create"), 3);
}

#[test]
fn streams_and_events() {
    let mut rig = Rig::new(2);
    let mut s = rig.session();
    // Waiting on the legacy stream of a device never used creates no context.
    ok(run(&mut s, Op::StreamSynchronize, &[0]));
    ok(run(&mut s, Op::StreamQuery, &[0]));
    assert_eq!(rig.fake.calls("ctx_create"), 0);

    let st = ok(run(&mut s, Op::StreamCreate, &[1, signed_arg(-1)]))[0];
    let st2 = ok(run(&mut s, Op::StreamCreate, &[0, 0xffff_ffff]))[0];
    assert!(st != 0 && st2 != 0 && st != st2);
    assert_eq!(
        run(&mut s, Op::StreamCreate, &[2, 0]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::StreamCreate, &[0, 1 << 40]).status,
        status::INVALID_VALUE
    );
    let e1 = ok(run(&mut s, Op::EventCreate, &[0]))[0];
    let e2 = ok(run(&mut s, Op::EventCreate, &[2]))[0];
    assert_eq!(
        run(&mut s, Op::EventCreate, &[8]).status,
        status::INVALID_VALUE
    );

    ok(run(&mut s, Op::EventRecord, &[e1, st]));
    let r = run(&mut s, Op::EventElapsedTime, &[e1, e2]);
    assert_eq!(
        r.status,
        status::INVALID_RESOURCE_HANDLE,
        "end not recorded"
    );
    ok(run(&mut s, Op::EventRecord, &[e2, 0]));
    let ms = ok(run(&mut s, Op::EventElapsedTime, &[e1, e2]))[0];
    assert_eq!(f32::from_bits(u32::try_from(ms).unwrap()), 2.5);
    ok(run(&mut s, Op::EventQuery, &[e1]));
    ok(run(&mut s, Op::EventSynchronize, &[e1]));
    ok(run(&mut s, Op::StreamWaitEvent, &[st, e1, 0]));
    ok(run(&mut s, Op::StreamWaitEvent, &[0, e1, 1]));
    assert_eq!(
        run(&mut s, Op::StreamWaitEvent, &[st, e1, 2]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::StreamWaitEvent, &[st, st, 0]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    assert_eq!(
        run(&mut s, Op::EventRecord, &[st, 0]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    ok(run(&mut s, Op::StreamSynchronize, &[st]));
    ok(run(&mut s, Op::StreamQuery, &[st]));

    // Work still running: NOT_READY, not sticky.
    let m = load_module(&mut rig, &mut s);
    let (r, _) = get_function(&mut rig, &mut s, m, "spin", 0);
    let spin = ok(r)[0];
    let empty = GuestBuffer::new(rig.mem.clone(), []).unwrap();
    let a = launch_args(spin, [1, 1, 1], [1, 1, 1], st);
    ok(s.execute(&req(Op::LaunchKernel, 0, &a, vec![empty], vec![])));
    let r = run(&mut s, Op::StreamQuery, &[st]);
    assert_eq!((r.status, r.flags), (status::NOT_READY, 0));
    ok(run(&mut s, Op::StreamQuery, &[st2]));

    // Objects of device 0 do not mix with device 1.
    let e_dev1 = ok(s.execute(&req(Op::EventCreate, 1, &[0], vec![], vec![])))[0];
    assert_eq!(
        run(&mut s, Op::EventRecord, &[e_dev1, st]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    ok(run(&mut s, Op::EventRecord, &[e_dev1, 0]));
    assert_eq!(
        run(&mut s, Op::EventElapsedTime, &[e1, e_dev1]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    // A memset, like a copy, may reach another device's memory and run on another device's
    // stream (unified addressing); a range no allocation holds is refused.
    let p1 = ok(s.execute(&req(Op::Malloc, 1, &[64], vec![], vec![])))[0];
    ok(s.execute(&req(Op::Memset, 1, &[p1, 0, 64, st, 1], vec![], vec![])));
    ok(run(&mut s, Op::Memset, &[p1, 0, 64, 0, 1]));
    assert_eq!(
        run(&mut s, Op::Memset, &[p1 + 8, 0, 64, 0, 1]).status,
        status::INVALID_VALUE
    );

    ok(run(&mut s, Op::StreamDestroy, &[st2]));
    assert_eq!(
        run(&mut s, Op::StreamDestroy, &[st2]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    assert_eq!(
        run(&mut s, Op::StreamDestroy, &[0]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    ok(run(&mut s, Op::EventDestroy, &[e2]));
    assert_eq!(
        run(&mut s, Op::EventQuery, &[e2]).status,
        status::INVALID_RESOURCE_HANDLE
    );

    // Dropping destroys both contexts at once, running kernel or not: the session is alone
    // in its worker process, which the daemon kills if cuCtxDestroy waits too long.
    drop(s);
    assert_eq!(rig.fake.live_contexts(), 0);
    assert_eq!(rig.fake.destroyed_contexts(), 2);
}

#[test]
fn stream_ordered_allocations_and_memory_pools() {
    let mut rig = Rig::new(2);
    let mut s = rig.session();
    let st = ok(run(&mut s, Op::StreamCreate, &[1, 0]))[0];
    let default = ok(run(&mut s, Op::DeviceGetDefaultMemPool, &[]))[0];
    assert_ne!(default, 0);
    // The same handle every time, and it is the current pool until another is set.
    assert_eq!(
        ok(run(&mut s, Op::DeviceGetDefaultMemPool, &[]))[0],
        default
    );
    assert_eq!(ok(run(&mut s, Op::DeviceGetMemPool, &[]))[0], default);
    let other = ok(s.execute(&req(Op::DeviceGetDefaultMemPool, 1, &[], vec![], vec![])))[0];
    assert_ne!(other, default);

    // An allocation in stream order is the session's memory: copies accept it.
    let p = ok(run(&mut s, Op::MallocAsync, &[1000, st, 0]))[0];
    assert_ne!(p, 0);
    let data = pattern(1000);
    ok(htod(&mut rig, &mut s, p, &data, &[300]));
    assert_eq!(dtoh(&mut rig, &mut s, p, 1000, &[7]).1, data);
    let used = |s: &mut GpuState, pool, attr| ok(run(s, Op::MemPoolGetAttribute, &[pool, attr]))[0];
    assert_eq!(used(&mut s, default, 7), 1000);
    assert_eq!(used(&mut s, default, 8), 1000);
    ok(run(&mut s, Op::FreeAsync, &[p, st]));
    // Gone from the table at once: later copies and frees are refused.
    assert_eq!(
        htod(&mut rig, &mut s, p, &data, &[300]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::FreeAsync, &[p, st]).status,
        status::INVALID_VALUE
    );
    assert_eq!(run(&mut s, Op::Free, &[p]).status, status::INVALID_VALUE);
    assert_eq!(used(&mut s, default, 7), 0);
    assert_eq!(used(&mut s, default, 8), 1000);
    // cudaMalloc memory freed in stream order (cuSPARSE's cusparseDestroyCsrilu02Info does):
    // taken as natively, though the driver's cuMemFreeAsync refuses a block of the range; then
    // gone like any freed allocation, and its block handed out again.
    let m = ok(run(&mut s, Op::Malloc, &[4096]))[0];
    ok(run(&mut s, Op::FreeAsync, &[m, st]));
    assert_eq!(run(&mut s, Op::Free, &[m]).status, status::INVALID_VALUE);
    assert_eq!(
        run(&mut s, Op::FreeAsync, &[m + 256, st]).status,
        status::INVALID_VALUE
    );
    assert_eq!(ok(run(&mut s, Op::Malloc, &[4096]))[0], m);
    ok(run(&mut s, Op::Free, &[m]));
    // The high watermark resets only to 0; current figures are read-only.
    assert_eq!(
        run(&mut s, Op::MemPoolSetAttribute, &[default, 8, 5]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::MemPoolSetAttribute, &[default, 7, 0]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::MemPoolSetAttribute, &[default, 8, 0]));
    assert_eq!(used(&mut s, default, 8), 0);
    ok(run(
        &mut s,
        Op::MemPoolSetAttribute,
        &[default, 4, u64::MAX],
    ));
    assert_eq!(used(&mut s, default, 4), u64::MAX);
    ok(run(&mut s, Op::MemPoolSetAttribute, &[default, 2, 7]));
    assert_eq!(used(&mut s, default, 2), 1);
    for bad in [0, 9, u64::MAX] {
        assert_eq!(
            run(&mut s, Op::MemPoolGetAttribute, &[default, bad]).status,
            status::INVALID_VALUE
        );
    }
    ok(run(&mut s, Op::MemPoolTrimTo, &[default, 0]));
    assert_eq!(used(&mut s, default, 5), 0);

    // cudaFree also frees stream-ordered memory.
    let q = ok(run(&mut s, Op::MallocAsync, &[64, 0, 0]))[0];
    ok(run(&mut s, Op::Free, &[q]));
    assert_eq!(rig.fake.pool_allocations(), 0);
    // Size 0 gives NULL, as cudaMalloc.
    assert_eq!(ok(run(&mut s, Op::MallocAsync, &[0, st, 0]))[0], 0);

    // A created pool: allocations from it explicitly, then as the device's current pool.
    let pool = ok(run(&mut s, Op::MemPoolCreate, &[0]))[0];
    assert!(pool != 0 && pool != default);
    let a = ok(run(&mut s, Op::MallocAsync, &[512, st, pool]))[0];
    assert_eq!(used(&mut s, pool, 7), 512);
    ok(run(&mut s, Op::DeviceSetMemPool, &[pool]));
    assert_eq!(ok(run(&mut s, Op::DeviceGetMemPool, &[]))[0], pool);
    let b = ok(run(&mut s, Op::MallocAsync, &[256, 0, 0]))[0];
    assert_eq!(used(&mut s, pool, 7), 768);
    assert_eq!(used(&mut s, default, 7), 0);
    // Another device's pool cannot be device 0's current pool.
    assert_eq!(
        run(&mut s, Op::DeviceSetMemPool, &[other]).status,
        status::INVALID_VALUE
    );
    // Default pools are never destroyed; unknown handles are refused.
    assert_eq!(
        run(&mut s, Op::MemPoolDestroy, &[default]).status,
        status::INVALID_VALUE
    );
    for bad in [0, st, 12345] {
        assert_eq!(
            run(&mut s, Op::MemPoolTrimTo, &[bad, 0]).status,
            status::INVALID_VALUE
        );
        assert_eq!(
            run(&mut s, Op::MallocAsync, &[8, 0, bad]).status,
            if bad == 0 {
                status::SUCCESS
            } else {
                status::INVALID_VALUE
            }
        );
    }
    // A stream of another session or device is refused.
    assert_eq!(
        run(&mut s, Op::MallocAsync, &[8, 999, 0]).status,
        status::INVALID_RESOURCE_HANDLE
    );

    // Access: the owner has read-write; peers are set by descriptor records.
    assert_eq!(ok(run(&mut s, Op::MemPoolGetAccess, &[pool, 0]))[0], 3);
    assert_eq!(ok(run(&mut s, Op::MemPoolGetAccess, &[pool, 1]))[0], 0);
    let descs: Vec<u8> = [1u32, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let d = rig.buf(&descs);
    ok(s.execute(&req(Op::MemPoolSetAccess, 0, &[pool], vec![d], vec![])));
    assert_eq!(ok(run(&mut s, Op::MemPoolGetAccess, &[pool, 1]))[0], 3);
    for bad in [[1u32, 2], [7, 3]] {
        let bytes: Vec<u8> = bad.iter().flat_map(|v| v.to_le_bytes()).collect();
        let d = rig.buf(&bytes);
        let r = s.execute(&req(Op::MemPoolSetAccess, 0, &[pool], vec![d], vec![]));
        assert_ne!(r.status, status::SUCCESS);
    }
    let d = rig.buf(&[0; 5]);
    assert_eq!(
        s.execute(&req(Op::MemPoolSetAccess, 0, &[pool], vec![d], vec![]))
            .status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::MemPoolGetAccess, &[pool, 9]).status,
        status::INVALID_DEVICE
    );

    // Destroying the current pool makes the default pool current again; its allocations stay
    // valid until freed.
    ok(run(&mut s, Op::MemPoolDestroy, &[pool]));
    assert_eq!(ok(run(&mut s, Op::DeviceGetMemPool, &[]))[0], default);
    assert_eq!(
        run(&mut s, Op::MemPoolDestroy, &[pool]).status,
        status::INVALID_VALUE
    );
    ok(htod(&mut rig, &mut s, a, &pattern(512), &[512]));
    ok(run(&mut s, Op::FreeAsync, &[a, st]));

    // A device reset frees what is left in stream order and the pools it created.
    let _kept = ok(run(&mut s, Op::MallocAsync, &[128, st, 0]))[0];
    let _created = ok(run(&mut s, Op::MemPoolCreate, &[0]))[0];
    assert!(rig.fake.pool_allocations() >= 2, "b and kept are live");
    ok(run(&mut s, Op::DeviceReset, &[]));
    assert_eq!(rig.fake.pool_allocations(), 0);
    assert_eq!(
        run(&mut s, Op::FreeAsync, &[b, 0]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::MemPoolTrimTo, &[default, 0]).status,
        status::INVALID_VALUE
    );
    // Only the two default pools remain (the driver's own, never destroyed).
    assert_eq!(rig.fake.live_pools(), 2);
    let again = ok(run(&mut s, Op::DeviceGetDefaultMemPool, &[]))[0];
    assert_ne!(again, default, "handles are not reused");
    drop(s);
    assert_eq!(rig.fake.pool_allocations(), 0);
}

#[test]
fn launches_with_attributes_cache_config_and_cluster_occupancy() {
    use qcuda_proto::LaunchAttr;
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let f = ok(get_function(&mut rig, &mut s, m, "lazy", 8).0)[0];
    let attrs = |rig: &mut Rig, list: &[LaunchAttr]| {
        let bytes: Vec<u8> = list.iter().flat_map(LaunchAttr::encode).collect();
        if bytes.is_empty() {
            GuestBuffer::new(rig.mem.clone(), []).unwrap()
        } else {
            rig.buf(&bytes)
        }
    };
    let cluster = |x| LaunchAttr {
        id: 4,
        v: [x, 1, 1],
        w: [0; 2],
    };
    let scalar = |id, v| LaunchAttr {
        id,
        v: [v, 0, 0],
        w: [0; 2],
    };
    let launch = |rig: &mut Rig, s: &mut GpuState, grid: u32, list: &[LaunchAttr]| {
        let block = rig.buf(&[7]);
        let a = attrs(rig, list);
        s.execute(&req(
            Op::LaunchKernelEx,
            0,
            &launch_args(f, [grid, 1, 1], [32, 1, 1], 0),
            vec![block, a],
            vec![],
        ))
    };
    ok(launch(
        &mut rig,
        &mut s,
        8,
        &[cluster(2), scalar(8, int_bits(-1)), scalar(2, 1)],
    ));
    assert_eq!(
        rig.fake.last_launch_attrs(),
        vec![(4, 2), (8, u32::MAX), (2, 1)]
    );
    ok(launch(&mut rig, &mut s, 8, &[]));
    // The driver checks the cluster against the grid.
    assert_eq!(
        launch(&mut rig, &mut s, 7, &[cluster(2)]).status,
        status::INVALID_VALUE
    );
    // Unknown ids, the graph-only node attribute, unknown events: refused before the driver.
    let before = rig.fake.calls("launch_ex");
    for bad in [scalar(15, 0), scalar(13, 1), scalar(99, 0)] {
        assert_eq!(
            launch(&mut rig, &mut s, 8, &[bad]).status,
            status::INVALID_VALUE
        );
    }
    let ev = LaunchAttr {
        id: 12,
        v: [0; 3],
        w: [4242, 0],
    };
    assert_eq!(
        launch(&mut rig, &mut s, 8, &[ev]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    assert_eq!(rig.fake.calls("launch_ex"), before);
    let e = ok(run(&mut s, Op::EventCreate, &[2]))[0];
    ok(launch(
        &mut rig,
        &mut s,
        8,
        &[LaunchAttr { w: [e, 0], ..ev }],
    ));
    // Record counts and lengths.
    let block = rig.buf(&[7]);
    let odd = rig.buf(&[0; 33]);
    let r = s.execute(&req(
        Op::LaunchKernelEx,
        0,
        &launch_args(f, [1, 1, 1], [1, 1, 1], 0),
        vec![block, odd],
        vec![],
    ));
    assert_eq!(r.status, status::INVALID_VALUE);
    let many = vec![scalar(0, 0); 33];
    assert_eq!(
        launch(&mut rig, &mut s, 8, &many).status,
        status::INVALID_VALUE
    );

    // Cluster occupancy and available dynamic shared memory.
    let a = attrs(&mut rig, &[cluster(4)]);
    let mut args = launch_args(f, [8, 1, 1], [128, 1, 1], 0);
    assert_eq!(
        ok(s.execute(&req(
            Op::OccupancyCluster,
            0,
            &args,
            vec![a.clone()],
            vec![]
        )))[0],
        8
    );
    args[6] = 1;
    assert_eq!(
        ok(s.execute(&req(
            Op::OccupancyCluster,
            0,
            &args,
            vec![a.clone()],
            vec![]
        )))[0],
        33
    );
    args[6] = 2;
    assert_eq!(
        s.execute(&req(Op::OccupancyCluster, 0, &args, vec![a], vec![]))
            .status,
        status::INVALID_VALUE
    );
    assert_eq!(
        ok(run(&mut s, Op::OccupancyAvailableDynamicSMem, &[f, 2, 256]))[0],
        114 * 1024
    );
    assert_eq!(
        run(
            &mut s,
            Op::OccupancyAvailableDynamicSMem,
            &[f, 1 << 40, 256]
        )
        .status,
        status::INVALID_VALUE
    );

    // Cache configuration of a function and of the context.
    ok(run(&mut s, Op::FuncSetCacheConfig, &[f, 1]));
    assert_eq!(
        run(&mut s, Op::FuncSetCacheConfig, &[f, 4]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::FuncSetCacheConfig, &[999, 1]).status,
        status::INVALID_DEVICE_FUNCTION
    );
    assert_eq!(ok(run(&mut s, Op::DeviceGetCacheConfig, &[]))[0], 0);
    ok(run(&mut s, Op::DeviceSetCacheConfig, &[2]));
    assert_eq!(ok(run(&mut s, Op::DeviceGetCacheConfig, &[]))[0], 2);
    assert_eq!(
        run(&mut s, Op::DeviceSetCacheConfig, &[9]).status,
        status::INVALID_VALUE
    );
}

#[test]
fn peers_access_and_copies_between_devices() {
    let mut rig = Rig::new(2);
    let mut s = rig.session();
    assert_eq!(ok(run(&mut s, Op::DeviceCanAccessPeer, &[0, 1]))[0], 1);
    assert_eq!(ok(run(&mut s, Op::DeviceCanAccessPeer, &[1, 1]))[0], 0);
    assert_eq!(
        run(&mut s, Op::DeviceCanAccessPeer, &[0, 2]).status,
        status::INVALID_DEVICE
    );
    assert_eq!(ok(run(&mut s, Op::DeviceP2PAttribute, &[2, 0, 1]))[0], 1);
    assert_eq!(
        run(&mut s, Op::DeviceP2PAttribute, &[2, 0, 0]).status,
        status::INVALID_DEVICE
    );
    assert_eq!(
        run(&mut s, Op::DeviceP2PAttribute, &[9, 0, 1]).status,
        status::INVALID_VALUE
    );

    ok(run(&mut s, Op::PeerAccess, &[1, 1, 0]));
    assert_eq!(
        run(&mut s, Op::PeerAccess, &[1, 1, 0]).status,
        704 // cudaErrorPeerAccessAlreadyEnabled
    );
    ok(run(&mut s, Op::PeerAccess, &[1, 0, 0]));
    assert_eq!(
        run(&mut s, Op::PeerAccess, &[1, 0, 0]).status,
        705 // cudaErrorPeerAccessNotEnabled
    );
    assert_eq!(
        run(&mut s, Op::PeerAccess, &[0, 1, 0]).status,
        status::PEER_ACCESS_UNSUPPORTED
    );
    assert_eq!(
        run(&mut s, Op::PeerAccess, &[1, 1, 4]).status,
        status::INVALID_VALUE
    );

    // A copy from device 1 to device 0, both ranges checked on their own devices.
    let a = malloc(&mut s, 256);
    let b = ok(s.execute(&req(Op::Malloc, 1, &[256], vec![], vec![])))[0];
    let data = pattern(256);
    let up = rig.buf(&data);
    ok(s.execute(&req(Op::MemcpyHtoD, 1, &[b, 0], vec![up], vec![])));
    ok(run(&mut s, Op::MemcpyPeer, &[a, 0, b, 1, 256, 0]));
    assert_eq!(dtoh(&mut rig, &mut s, a, 256, &[256]).1, data);
    // The source named on the wrong device, a range past the end, an unknown device.
    assert_eq!(
        run(&mut s, Op::MemcpyPeer, &[a, 0, b, 0, 256, 0]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::MemcpyPeer, &[a, 0, b, 1, 257, 0]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::MemcpyPeer, &[a, 0, b, 7, 16, 0]).status,
        status::INVALID_DEVICE
    );
    ok(run(&mut s, Op::MemcpyPeer, &[a, 0, b, 1, 0, 0]));

    // CUDA's rules across devices: a copy may go to a stream of another device than the
    // current one, and a stream may wait for another device's event (p2pBandwidthLatencyTest).
    let st1 = ok(s.execute(&req(Op::StreamCreate, 1, &[1, 0], vec![], vec![])))[0];
    let ev0 = ok(run(&mut s, Op::EventCreate, &[0]))[0];
    ok(run(&mut s, Op::EventRecord, &[ev0, 0]));
    ok(run(&mut s, Op::StreamWaitEvent, &[st1, ev0, 0]));
    ok(run(&mut s, Op::MemcpyPeer, &[a, 0, b, 1, 256, st1]));
    // Device 1's memory, written from device 0 on device 1's stream and on device 0's own.
    ok(s.execute(&req(
        Op::MemcpyHtoD,
        0,
        &[b, st1],
        vec![rig.buf(&data)],
        vec![],
    )));
    ok(s.execute(&req(
        Op::MemcpyHtoD,
        0,
        &[b, 0],
        vec![rig.buf(&data)],
        vec![],
    )));
    // An event may not be recorded on another device's stream, and a range no device holds
    // stays refused.
    assert_eq!(
        run(&mut s, Op::EventRecord, &[ev0, st1]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    assert_eq!(
        s.execute(&req(
            Op::MemcpyHtoD,
            0,
            &[b + 128, st1],
            vec![rig.buf(&data)],
            vec![]
        ))
        .status,
        status::INVALID_VALUE
    );
}

#[test]
fn stream_priorities_and_ids() {
    let rig = Rig::new(1);
    let mut s = rig.session();
    let r = ok(run(&mut s, Op::StreamPriorityRange, &[]));
    assert_eq!((int_ret(r[0]), int_ret(r[1])), (0, -5));
    // The driver clamps priorities into the range; the guest learns what the stream got.
    let hi = ok(run(&mut s, Op::StreamCreate, &[0, signed_arg(-100)]));
    assert_eq!(int_ret(hi[1]), -5);
    let lo = ok(run(&mut s, Op::StreamCreate, &[0, 7]));
    assert_eq!(int_ret(lo[1]), 0);
    let mid = ok(run(&mut s, Op::StreamCreate, &[1, signed_arg(-2)]));
    assert_eq!(int_ret(mid[1]), -2);
    let a = ok(run(&mut s, Op::StreamGetId, &[hi[0]]))[0];
    let b = ok(run(&mut s, Op::StreamGetId, &[lo[0]]))[0];
    let legacy = ok(run(&mut s, Op::StreamGetId, &[0]))[0];
    assert!(a != b && a != legacy && b != legacy);
    assert_eq!(
        run(&mut s, Op::StreamGetId, &[77]).status,
        status::INVALID_RESOURCE_HANDLE
    );
}

#[test]
fn dropping_a_session_gives_all_memory_back() {
    let mut rig = Rig::new(2);
    let mut s = rig.session();
    let mut observer = rig.session();
    let free_before = ok(run(&mut observer, Op::MemGetInfo, &[]))[0];
    assert_eq!(free_before, TOTAL_MEM);
    for _ in 0..5 {
        malloc(&mut s, 1 << 20);
    }
    ok(s.execute(&req(Op::Malloc, 1, &[4096], vec![], vec![])));
    load_module(&mut rig, &mut s);
    ok(run(&mut s, Op::StreamCreate, &[0, 0]));
    ok(run(&mut s, Op::EventCreate, &[0]));
    let p = malloc(&mut s, 100);
    ok(htod(&mut rig, &mut s, p, &pattern(100), &[3]));
    let free_during = ok(run(&mut observer, Op::MemGetInfo, &[]))[0];
    assert!(free_during <= TOTAL_MEM - (5 << 20));
    drop(s);
    assert_eq!(ok(run(&mut observer, Op::MemGetInfo, &[]))[0], free_before);
    assert_eq!(rig.fake.live_contexts(), 1);
    drop(observer);
    assert_eq!(rig.fake.live_contexts(), 0);
}

#[test]
fn driver_failures_map_to_runtime_codes() {
    let rig = Rig::new(1);
    let mut s = rig.session();
    rig.fake.fail_next("ctx_create", 2);
    assert_eq!(
        run(&mut s, Op::Malloc, &[16]).status,
        status::MEMORY_ALLOCATION
    );
    let p = malloc(&mut s, 16);
    // Free waits for the device first, as cuMemFree does; its failure fails the free.
    rig.fake.fail_next("ctx_synchronize", 400);
    assert_eq!(
        run(&mut s, Op::Free, &[p]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    // The allocation stays known after a failed free.
    ok(run(&mut s, Op::Free, &[p]));
    rig.fake.fail_next("stream_synchronize", 719);
    let r = run(&mut s, Op::StreamSynchronize, &[0]);
    assert_eq!(
        (r.status, r.flags),
        (status::LAUNCH_FAILURE, RESP_FLAG_STICKY)
    );
    assert_eq!(
        run(&mut s, Op::MemGetInfo, &[]).status,
        status::LAUNCH_FAILURE
    );
}

/// A small deterministic generator for the fuzz test.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    /// Uniform-ish in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }
    /// The low 32 bits of a draw.
    #[expect(clippy::cast_possible_truncation, reason = "the low half, on purpose")]
    fn next_u32(&mut self) -> u32 {
        self.next() as u32
    }
    /// The low 32 bits of a draw, as a signed value.
    #[expect(clippy::cast_possible_wrap, reason = "any 32 bits make a test int")]
    fn next_i32(&mut self) -> i32 {
        self.next_u32() as i32
    }
    /// The low byte of a draw.
    #[expect(clippy::cast_possible_truncation, reason = "the low byte, on purpose")]
    fn next_u8(&mut self) -> u8 {
        self.next() as u8
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }
}

#[test]
fn random_requests_never_panic_and_drop_cleans_up() {
    let mut rng = Lcg(0x5eed);
    let mut succeeded = std::collections::BTreeSet::new();
    // A fresh host per round: a sticky error (random launches make some) ends a host's use.
    // Enough rounds that every op named at the end succeeds at least once as Op::ALL grows.
    for round in 0..24 {
        let mut rig = Rig::new(2);
        let mut s = rig.session();
        let mut seen: Vec<u64> = vec![0, 1, u64::MAX, 8, 1 << 32];
        let (mut ptrs, mut funcs, mut mods): (Vec<u64>, Vec<u64>, Vec<u64>) = Default::default();
        let mut events: Vec<u64> = Vec::new();
        for _ in 0..1500 {
            let op = rng.pick(Op::ALL);
            let device = rng.pick(&[0u32, 0, 0, 1, 2, u32::MAX]);
            let mut args = [0u64; MAX_ARGS];
            for a in &mut args {
                let recent = seen[seen.len().saturating_sub(1 + rng.below(6))..].to_vec();
                *a = match rng.next() % 8 {
                    0 | 1 => rng.pick(&recent),
                    2 => rng.pick(&seen),
                    3 => rng.pick(&seen).wrapping_add(rng.next() % 512),
                    4 | 5 => 0,
                    6 => rng.next() % 300,
                    _ => rng.next(),
                };
            }
            // Half the time, arguments a well-behaved guest library would send.
            let plausible = rng.next().is_multiple_of(2);
            let mut block = Vec::new();
            let mut inputs = Vec::new();
            match op {
                Op::Malloc => args[0] = 1 + args[0] % 4096,
                Op::MallocAsync if plausible => {
                    args[0] = 1 + args[0] % 4096;
                    args[1] = 0;
                }
                Op::EventRecord if plausible && !events.is_empty() => {
                    args[0] = rng.pick(&events);
                    args[1] = 0;
                }
                Op::MemcpyHtoD | Op::MemcpyDtoH if plausible && !ptrs.is_empty() => {
                    args[0] = rng.pick(&ptrs) + rng.next() % 8;
                    args[1] = 0;
                }
                Op::ModuleGetFunction | Op::ModuleGetGlobal if plausible && !mods.is_empty() => {
                    args[0] = rng.pick(&mods);
                    let name: &[u8] = if op == Op::ModuleGetGlobal {
                        b"g"
                    } else {
                        rng.pick(&[&b"vadd"[..], b"fault", b"lazy", b"spin"])
                    };
                    inputs.push(rig.buf(name));
                }
                Op::LaunchKernel => {
                    let g = [1 + rng.next_u32() % 3, 1, 1];
                    args[1..5].copy_from_slice(
                        &LaunchConfig {
                            grid: g,
                            block: g,
                            shared_mem: 0,
                        }
                        .encode(),
                    );
                    if plausible && !funcs.is_empty() && !ptrs.is_empty() {
                        args[0] = rng.pick(&funcs);
                        args[5] = 0;
                        args[6] = rng.next() % 2;
                        for _ in 0..3 {
                            block.extend_from_slice(&rng.pick(&ptrs).to_le_bytes());
                        }
                        block.extend_from_slice(&(rng.next_i32() % 64).to_le_bytes());
                    }
                }
                _ => {}
            }
            let (ins, outs) = op.shape();
            if !block.is_empty() {
                inputs.push(rig.buf_runs(&block, &[1 + rng.below(40)]));
            }
            for _ in inputs.len()..ins {
                let len = rng.pick(&[0usize, 1, 5, 28, 32, 64, 200, 400]);
                let named = matches!(op, Op::ModuleGetFunction | Op::ModuleGetGlobal);
                let data = if op == Op::ModuleLoad && rng.next().is_multiple_of(2) {
                    PTX.to_vec()
                } else if rng.next().is_multiple_of(3) || (named && rng.next().is_multiple_of(2)) {
                    rng.pick(&[&b"vadd"[..], b"fault", b"g", b"lazy"]).to_vec()
                } else {
                    (0..len).map(|_| rng.next_u8()).collect()
                };
                inputs.push(if data.is_empty() {
                    GuestBuffer::new(rig.mem.clone(), []).unwrap()
                } else {
                    rig.buf_runs(&data, &[1 + rng.below(80)])
                });
            }
            let outputs = (0..outs)
                .map(|_| {
                    let len = rng.pick(&[1usize, 8, 64, 320, 400]);
                    rig.out_runs(len, &[1 + rng.below(80)])
                })
                .collect();
            let r = s.execute(&req(op, device, &args, inputs, outputs));
            if r.status == status::SUCCESS {
                succeeded.insert(format!("{op:?}"));
                match op {
                    Op::Malloc | Op::MallocAsync => ptrs.push(r.rets[0]),
                    Op::ModuleGetFunction => funcs.push(r.rets[0]),
                    Op::ModuleLoad => mods.push(r.rets[0]),
                    Op::EventCreate => events.push(r.rets[0]),
                    _ => {}
                }
            }
            for v in r.rets.iter().take(2) {
                if *v != 0 {
                    seen.push(*v);
                }
            }
            if rig.next > (RAM - (1 << 20)) as u64 {
                rig.next = 0x1000;
            }
        }
        drop(s);
        assert_eq!(rig.fake.live_contexts(), 0, "round {round}");
    }
    eprintln!("ops that succeeded at least once: {succeeded:?}");
    // The generator reaches deep into the executor, not just its argument checks.
    for op in [
        "Malloc",
        "MemcpyHtoD",
        "MemcpyDtoH",
        "ModuleLoad",
        "ModuleGetFunction",
        "ModuleGetGlobal",
        "LaunchKernel",
        "StreamCreate",
        "EventRecord",
    ] {
        assert!(succeeded.contains(op), "{op} never succeeded");
    }
}

#[test]
fn host_mapped_guest_memory_is_device_addressable_at_the_guest_address() {
    use qcuda_proto::{HostRun, HOST_WINDOW_BASE};
    assert!(super::reserve_window());
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let dptr = s.execute(&req(Op::Malloc, 0, &[4096], vec![], vec![])).rets[0];
    // Two guest pages, out of guest-physical order, mapped at one window address.
    let guest = HOST_WINDOW_BASE + 0x7100_0000;
    let table: Vec<u8> = [(0x20_0000u64, 0x1000u64), (0x10_0000, 0x1000)]
        .iter()
        .flat_map(|&(gpa, len)| HostRun { gpa, len }.encode())
        .collect();
    let map = |rig: &mut Rig, addr: u64| {
        let t = rig.buf(&table);
        req(Op::HostMap, 0, &[addr, 0x2000, 0], vec![t], vec![])
    };
    let r = s.execute(&map(&mut rig, guest));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, guest));
    rig.mem
        .write_slice(b"hello", GuestAddress(0x20_0000))
        .unwrap();
    // Guest page -> device, then device -> the second guest page: the driver's copies.
    let copy =
        |dst: u64, src: u64, n: u64| req(Op::MemcpyMapped, 0, &[dst, src, n, 0], vec![], vec![]);
    assert_eq!(s.execute(&copy(dptr, guest, 5)).status, status::SUCCESS);
    assert_eq!(rig.fake.peek(dptr, 5).unwrap(), b"hello");
    assert_eq!(
        s.execute(&copy(guest + 0x1000, dptr, 5)).status,
        status::SUCCESS
    );
    let mut back = [0u8; 5];
    rig.mem
        .read_slice(&mut back, GuestAddress(0x10_0000))
        .unwrap();
    assert_eq!(&back, b"hello");
    // Host-mapped memory is the session's memory for memsets too.
    let set = req(Op::Memset, 0, &[guest, 0x41, 3, 0], vec![], vec![]);
    assert_eq!(s.execute(&set).status, status::SUCCESS);
    rig.mem
        .read_slice(&mut back[..3], GuestAddress(0x20_0000))
        .unwrap();
    assert_eq!(&back[..3], b"AAA");
    // Past the mapping, overlapping it, bad run tables and unknown addresses are refused.
    assert_eq!(
        s.execute(&copy(dptr, guest + 0x1ff0, 0x20)).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        s.execute(&map(&mut rig, guest + 0x1000)).status,
        status::HOST_MEMORY_ALREADY_REGISTERED
    );
    let short = rig.buf(&table[..16]);
    let bad = req(
        Op::HostMap,
        0,
        &[guest + 0x10_0000, 0x2000, 0],
        vec![short],
        vec![],
    );
    assert_eq!(s.execute(&bad).status, status::INVALID_VALUE);
    let unmap = |addr: u64| req(Op::HostUnmap, 0, &[addr], vec![], vec![]);
    assert_eq!(
        s.execute(&unmap(guest + 0x1000)).status,
        status::HOST_MEMORY_NOT_REGISTERED
    );
    assert_eq!(s.execute(&unmap(guest)).status, status::SUCCESS);
    assert_eq!(rig.fake.registered(), 0);
    assert_eq!(
        s.execute(&copy(dptr, guest, 5)).status,
        status::INVALID_VALUE
    );
    // A mapping still there when the session ends goes with it.
    assert_eq!(s.execute(&map(&mut rig, guest)).status, status::SUCCESS);
    assert_eq!(rig.fake.registered(), 1);
    drop(s);
    assert_eq!(rig.fake.live_contexts(), 0);
}

/// Encodes a batch of (op, args, in-data) records.
fn batch_bytes(records: &[(Op, &[u64], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(op, args, data) in records {
        let mut rec = qcuda_proto::BatchRecord {
            op: op as u32,
            in_len: u32::try_from(data.len()).unwrap(),
            ..Default::default()
        };
        rec.args[..args.len()].copy_from_slice(args);
        out.extend_from_slice(&rec.encode());
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(8), 0);
    }
    out
}

#[test]
fn a_batch_runs_its_records_in_order_and_reports_the_first_failure() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let dst = malloc(&mut s, 64);
    // Two copies (the second overwrites part of the first), a memset, an event record: in order.
    let bytes = batch_bytes(&[
        (Op::MemcpyHtoD, &[dst, 0], &[1u8; 13]),
        (Op::MemcpyHtoD, &[dst + 4, 0], &[2u8; 3]),
        (Op::Memset, &[dst + 8, 9, 2, 0], &[]),
    ]);
    let b = rig.buf_runs(&bytes, &[50, 7, 300]);
    ok(s.execute(&req(Op::Batch, 0, &[3], vec![b], vec![])));
    let (r, got) = dtoh(&mut rig, &mut s, dst, 13, &[13]);
    ok(r);
    assert_eq!(got, [1, 1, 1, 1, 2, 2, 2, 1, 9, 9, 1, 1, 1]);

    // A failing record: the others still run, the first failure is the status.
    let bytes = batch_bytes(&[
        (Op::Memset, &[1u64 << 40, 5, 1, 0], &[]),
        (Op::Memset, &[dst, 7, 1, 0], &[]),
    ]);
    let b = rig.buf(&bytes);
    assert_eq!(
        s.execute(&req(Op::Batch, 0, &[2], vec![b], vec![])).status,
        status::INVALID_VALUE
    );
    assert_eq!(dtoh(&mut rig, &mut s, dst, 1, &[1]).1, [7]);

    // Ops that are not batchable, counts beyond the data, and truncated data are refused.
    for (bytes, count) in [
        (batch_bytes(&[(Op::Malloc, &[64], &[])]), 1),
        (batch_bytes(&[(Op::Memset, &[dst, 1, 1, 0], &[])]), 2),
        (
            batch_bytes(&[(Op::MemcpyHtoD, &[dst, 0], &[1u8; 8])])[..84].to_vec(),
            1,
        ),
        (batch_bytes(&[(Op::Memset, &[dst, 1, 1, 0], &[1u8; 8])]), 1),
    ] {
        let b = rig.buf(&bytes);
        assert_eq!(
            s.execute(&req(Op::Batch, 0, &[count], vec![b], vec![]))
                .status,
            status::INVALID_VALUE
        );
    }
}

#[test]
fn a_waited_batch_may_end_with_a_synchronising_call_that_answers_for_it() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let dst = malloc(&mut s, 64);
    // A failing record, a good one, then the synchronisation: it answers, and the failure
    // comes back as its deferred error.
    let bytes = batch_bytes(&[
        (Op::Memset, &[1u64 << 40, 5, 1, 0], &[]),
        (Op::Memset, &[dst, 7, 1, 0], &[]),
        (Op::StreamSynchronize, &[0], &[]),
    ]);
    let b = rig.buf(&bytes);
    let resp = s.execute(&req(Op::Batch, 0, &[3], vec![b], vec![]));
    assert_eq!(resp.status, status::SUCCESS);
    assert_eq!(resp.deferred_error(), status::INVALID_VALUE);
    assert_eq!(dtoh(&mut rig, &mut s, dst, 1, &[1]).1, [7]);

    // The tail's own failure is the status: an unknown event.
    let bytes = batch_bytes(&[
        (Op::Memset, &[dst, 3, 1, 0], &[]),
        (Op::EventQuery, &[0xdead], &[]),
    ]);
    let b = rig.buf(&bytes);
    let resp = s.execute(&req(Op::Batch, 0, &[2], vec![b], vec![]));
    assert_ne!(resp.status, status::SUCCESS);
    assert_eq!(resp.deferred_error(), status::SUCCESS);
    assert_eq!(dtoh(&mut rig, &mut s, dst, 1, &[1]).1, [3]);

    // A synchronising record anywhere but last, or in a fire-and-forget batch, is refused
    // before it runs.
    let bytes = batch_bytes(&[
        (Op::DeviceSynchronize, &[], &[]),
        (Op::Memset, &[dst, 4, 1, 0], &[]),
    ]);
    let b = rig.buf(&bytes);
    assert_eq!(
        s.execute(&req(Op::Batch, 0, &[2], vec![b], vec![])).status,
        status::INVALID_VALUE
    );
    let bytes = batch_bytes(&[
        (Op::Memset, &[dst, 5, 1, 0], &[]),
        (Op::DeviceSynchronize, &[], &[]),
    ]);
    let b = rig.buf(&bytes);
    assert_eq!(
        s.execute(&fire_and_forget(req(Op::Batch, 0, &[2], vec![b], vec![])))
            .status,
        status::INVALID_VALUE
    );
    assert_eq!(dtoh(&mut rig, &mut s, dst, 1, &[1]).1, [5]);
}

/// With guest RAM registered for DMA, long runs that cross block boundaries still copy
/// exactly (the driver refuses a range spanning two registrations), and the session's end
/// unregisters every block.
#[test]
fn long_runs_copy_through_registered_guest_ram() {
    let mut rig = Rig::new(1);
    let tuning = Tuning {
        staging_half: 64,
        direct_min: 100,
        max_registered_ram: usize::MAX,
        ..Tuning::default()
    };
    let host = Arc::new(CudaHost::from_driver(rig.fake.clone(), 13000, None, tuning).unwrap());
    let mut s = GpuState::open(&host, 1);
    let len = 12 << 20;
    let data: Vec<u8> = (0..len).map(|i| u8::try_from(i % 253).unwrap()).collect();
    let dst = malloc(&mut s, len as u64);
    // One long run and a few short ones, so both kinds of step are taken.
    ok(htod(&mut rig, &mut s, dst, &data, &[len - 300, 100, 200]));
    assert!(rig.fake.registered() >= 2, "the long run's blocks");
    let (r, back) = dtoh(&mut rig, &mut s, dst, len, &[7 << 20, 150, 5 << 20]);
    ok(r);
    assert!(back == data, "the bytes came back changed");
    // DeviceReset forgets the blocks with the context; the next copy registers again.
    ok(run(&mut s, Op::DeviceReset, &[]));
    assert_eq!(rig.fake.registered(), 0);
    let dst = malloc(&mut s, 1 << 20);
    ok(htod(&mut rig, &mut s, dst, &data[..1 << 20], &[1 << 20]));
    assert!(rig.fake.registered() >= 1);
    drop(s);
    assert_eq!(rig.fake.registered(), 0);
}

mod checkpoint;
mod frameworks;
mod graphs;
mod ipc;
mod managed;
mod precopy;
mod reserved_range;
mod saved_host_memory;
mod trace;

#[test]
fn stream_attributes_round_trip_and_only_stream_ids_are_taken() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let stream = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    let window = qcuda_proto::LaunchAttr {
        id: 1,
        v: [0.5f32.to_bits(), 2, 1],
        w: [0x7f00_0000_1000, 1 << 20],
    };
    let set = |rig: &mut Rig, s: &mut GpuState, a: qcuda_proto::LaunchAttr| {
        let b = rig.buf(&a.encode());
        s.execute(&req(Op::StreamSetAttribute, 0, &[stream], vec![b], vec![]))
    };
    ok(set(&mut rig, &mut s, window));
    let out = rig.out(qcuda_proto::LAUNCH_ATTR_SIZE);
    ok(s.execute(&req(
        Op::StreamGetAttribute,
        0,
        &[stream, 1],
        vec![],
        vec![out.clone()],
    )));
    assert_eq!(
        qcuda_proto::LaunchAttr::decode(&out.to_vec().unwrap()).unwrap(),
        window
    );
    // A launch-only attribute (cluster dimension) and an unknown one are refused.
    for id in [4, 99] {
        let a = qcuda_proto::LaunchAttr {
            id,
            ..Default::default()
        };
        assert_eq!(set(&mut rig, &mut s, a).status, status::INVALID_VALUE);
    }
    assert_eq!(
        s.execute(&req(
            Op::StreamGetAttribute,
            0,
            &[stream, 4],
            vec![],
            vec![out]
        ))
        .status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::CtxResetPersistingL2, &[]));
}

/// `--max-gpu-memory`: two workers of one VM (here two hosts over one driver, as two worker
/// processes are) share one quota; frees, `DeviceReset` and the end of a session give back.
#[test]
fn device_memory_of_a_vm_stays_within_its_quota() {
    use crate::limits::{GpuMemoryQuota, QuotaSlot};
    use std::os::fd::FromRawFd;

    let rig = Rig::new(1);
    let quota = GpuMemoryQuota::new(1000, 4).unwrap();
    let worker = |lease: &crate::limits::SlotLease| {
        // SAFETY: dup of an open descriptor returns a new one we own.
        let file = unsafe { std::fs::File::from_raw_fd(libc::dup(lease.fd())) };
        let tuning = Tuning {
            staging_half: 64,
            direct_min: 100,
            max_registered_ram: 0,
            ..Tuning::default()
        };
        let host = Arc::new(CudaHost::from_driver(rig.fake.clone(), 13000, None, tuning).unwrap());
        host.set_memory_quota(QuotaSlot::attach(file, lease.index()).unwrap());
        host
    };
    let (la, lb) = (quota.lease().unwrap(), quota.lease().unwrap());
    let (ha, hb) = (worker(&la), worker(&lb));
    let (mut a, mut b) = (GpuState::open(&ha, 1), GpuState::open(&hb, 2));
    let p = malloc(&mut a, 600);
    assert_eq!(
        run(&mut b, Op::Malloc, &[401]).status,
        status::MEMORY_ALLOCATION
    );
    // A refused allocation leaves nothing behind, on the device or in the count.
    assert_eq!(quota.used(), 600);
    let q = malloc(&mut b, 400);
    assert_eq!(
        run(&mut a, Op::Malloc, &[1]).status,
        status::MEMORY_ALLOCATION
    );
    ok(run(&mut a, Op::Free, &[p]));
    assert_eq!(quota.used(), 400);
    malloc(&mut a, 300);
    malloc(&mut a, 300);
    assert_eq!(quota.used(), 1000);
    // DeviceReset destroys a's context: its 600 bytes go back.
    ok(run(&mut a, Op::DeviceReset, &[]));
    assert_eq!(quota.used(), 400);
    // A session's end gives back the rest.
    let _ = q;
    drop(b);
    assert_eq!(quota.used(), 0);
    // Without a quota nothing is counted or refused (within the device's memory).
    let mut free = rig.session();
    malloc(&mut free, 4000);
    assert_eq!(quota.used(), 0);
    drop((la, lb));
}

/// The module images one session has loaded are bounded in bytes (the driver holds them in the
/// worker's memory); unloading gives room back.
#[test]
fn loaded_module_images_are_bounded_per_session() {
    let mut rig = Rig::new(1);
    let tuning = Tuning {
        staging_half: 64,
        direct_min: 100,
        max_registered_ram: 0,
        max_module_bytes: 2 * PTX.len() as u64,
    };
    rig.host = Arc::new(CudaHost::from_driver(rig.fake.clone(), 13000, None, tuning).unwrap());
    let mut s = rig.session();
    let a = load_module(&mut rig, &mut s);
    load_module(&mut rig, &mut s);
    let img = rig.buf(PTX);
    let r = s.execute(&req(Op::ModuleLoad, 0, &[], vec![img.clone()], vec![]));
    assert_eq!(r.status, status::MEMORY_ALLOCATION);
    ok(run(&mut s, Op::ModuleUnload, &[a]));
    ok(s.execute(&req(Op::ModuleLoad, 0, &[], vec![img], vec![])));
}

/// Found by fuzz/chain_dispatch: a `Malloc` of a size near 2^64 made the fake driver's
/// accounting overflow. Every size is an answer, as with the real driver.
#[test]
fn huge_allocations_are_refused_not_overflowed() {
    let rig = Rig::new(1);
    let mut s = rig.session();
    malloc(&mut s, 64);
    for size in [u64::MAX, u64::MAX - 255, 1 << 63, TOTAL_MEM + 1] {
        assert_eq!(
            run(&mut s, Op::Malloc, &[size]).status,
            status::MEMORY_ALLOCATION,
            "{size:#x}"
        );
    }
    malloc(&mut s, 64);
}

/// Found by fuzz/chain_dispatch: a mipmapped array whose levels add up to gigabytes made the
/// test double allocate them; it answers out of memory now, as a GPU would.
#[test]
fn huge_mipmapped_arrays_are_refused_not_allocated() {
    let rig = Rig::new(1);
    let mut s = rig.session();
    // 16384 x 16384 float4 with 15 levels (CU_AD_FORMAT_FLOAT = 0x20).
    let r = run(&mut s, Op::ArrayCreate, &[16384, 16384, 0, 0x20, 4, 0, 15]);
    assert_eq!(r.status, status::MEMORY_ALLOCATION);
}

/// Fuzz finding (chain_dispatch, a 9 s unit): a mipmapped array of 2^32 - 1 levels made the
/// test double create billions of 1 x 1 levels. The level count is clamped as CUDA documents,
/// to 1 + floor(log2(largest extent)), before any driver sees it.
#[test]
fn mipmap_level_counts_are_clamped() {
    let rig = Rig::new(1);
    let mut s = rig.session();
    let started = std::time::Instant::now();
    // 64 x 1, 1-channel 8-bit (CU_AD_FORMAT_UNSIGNED_INT8 = 1): at most 7 levels.
    let r = run(
        &mut s,
        Op::ArrayCreate,
        &[64, 1, 0, 1, 1, 0, u64::from(u32::MAX)],
    );
    assert_eq!(r.status, status::SUCCESS);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    let m = r.rets[0];
    // Level 6 (1 x 1) exists, level 7 does not.
    assert_eq!(
        run(&mut s, Op::MipmappedArrayLevel, &[m, 6]).status,
        status::SUCCESS
    );
    assert_ne!(
        run(&mut s, Op::MipmappedArrayLevel, &[m, 7]).status,
        status::SUCCESS
    );
}

/// A `Link` request's in-buffer.
fn link_buffer(options: &[(u32, u64)], inputs: &[(u32, &[u8], &[u8])]) -> Vec<u8> {
    use qcuda_proto::link::{encode_link, LinkInput, LinkOption};
    let options: Vec<LinkOption> = options
        .iter()
        .map(|&(id, value)| LinkOption { id, value })
        .collect();
    let inputs: Vec<LinkInput<'_>> = inputs
        .iter()
        .map(|&(kind, name, data)| LinkInput { kind, name, data })
        .collect();
    let mut out = Vec::new();
    encode_link(&options, &inputs, |b| out.extend_from_slice(b)).unwrap();
    out
}

#[test]
fn links_with_the_drivers_linker_and_loads_the_result() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let run_link = |rig: &mut Rig, s: &mut GpuState, bytes: &[u8], room: usize| {
        let input = rig.buf(bytes);
        let out = rig.out(room);
        let r = s.execute(&req(Op::Link, 0, &[], vec![input], vec![out.clone()]));
        (r, out.to_vec().unwrap())
    };
    // Two inputs and a value option: the image, then the info log.
    let bytes = link_buffer(
        &[(12, 1)],
        &[(1, b"a.ptx", b".version 9.0\n"), (1, b"b", b"//b\n")],
    );
    let (r, out) = run_link(&mut rig, &mut s, &bytes, 256);
    let rets = ok(r);
    assert_eq!(rets[3], 0, "linked");
    assert_eq!(&out[..18], b".version 9.0\n//b\n\0");
    let info = &out[18..18 + usize::try_from(rets[1]).unwrap()];
    assert_eq!(info, b"linked 2 inputs, 1 options");
    // The linked image loads as a module.
    let image = rig.buf(&out[..usize::try_from(rets[0]).unwrap()]);
    ok(s.execute(&req(Op::ModuleLoad, 0, &[], vec![image], vec![])));
    // Too little room: the lengths come back, nothing is written.
    let (r, out) = run_link(&mut rig, &mut s, &bytes, 4);
    assert_eq!(ok(r)[0], 18);
    assert_eq!(out, [0xee; 4], "untouched");
    // A link the driver refuses: its code and error log, not a failed request.
    let bad = link_buffer(&[], &[(1, b"k.ptx", b"bad ptx")]);
    let (r, out) = run_link(&mut rig, &mut s, &bad, 64);
    let rets = ok(r);
    assert_eq!(rets[3], 218, "CUDA_ERROR_INVALID_PTX");
    assert_eq!(&out[..usize::try_from(rets[2]).unwrap()], b"error in k.ptx");
    // Refused before the driver: a pointer option, an unknown input type, an empty input, a
    // NUL in a name, a damaged buffer.
    for bytes in [
        link_buffer(&[(17, 0x1000)], &[(1, b"a", b"x")]),
        link_buffer(&[], &[(6, b"a", b"x")]),
        link_buffer(&[], &[(1, b"a", b"")]),
        link_buffer(&[], &[(1, b"a\0b", b"x")]),
        bytes[..bytes.len() - 8].to_vec(),
    ] {
        let (r, _) = run_link(&mut rig, &mut s, &bytes, 64);
        assert_eq!(r.status, status::INVALID_VALUE);
    }
    assert_eq!(rig.fake.calls("link"), 3);
}

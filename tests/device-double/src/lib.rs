//! A test double of `/dev/qcuda` and the host behind it, for measuring guest-lib without a VM or
//! a GPU (scripts/driver-face-cost.sh). Preloaded (`LD_PRELOAD`), it takes over `open`, `ioctl`
//! and `mmap` of `/dev/qcuda` and answers each `IOCTL_CALL` in-process, as qcuda.ko and
//! vhost-cuda would for a simulated device: byte-array allocations, modules that contain every
//! kernel asked for (with no parameters), streams and events that are always complete, launches
//! that do nothing. Every other path and file descriptor goes to libc untouched.
//!
//! It is not a model of the host for correctness (guest-lib's unit tests have `FakeDevice` for
//! that): it answers just enough for NVIDIA's runtime and ours to run the benchmark's rows, and it
//! fails loudly (stderr, `CUDA_ERROR_NOT_SUPPORTED`) on any op it does not know, so a row that
//! needs one shows up instead of being measured wrong. Its own work happens inside its `ioctl`,
//! which the cost script subtracts: what remains is guest-lib's (and NVIDIA's runtime's) cost.
//!
//! `QCUDA_DOUBLE_TRACE=1`: one line on stderr per ioctl on the device (in a VM each is one trip
//! to the host): the op, its flags (the wait mode among them), device, calling thread, inline
//! arguments, buffers (`in:N@addr`, `out:N@addr`) and a batch's records; `IOCTL_HOST_MAP` and
//! `IOCTL_HOST_UNMAP` as `host-map`/`host-unmap` with their length. It shows the round trips
//! each operation makes, for comparing the faces (scripts/driver-face-cost.sh `--requests`).

#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "test double: it decodes what guest-lib encoded in the same process (the wire's 32-bit values in 64-bit words, C ints as their bit patterns, sizes of test allocations)"
)]

use std::{
    collections::BTreeMap,
    ffi::{c_char, c_int, c_ulong, c_void, CStr},
    sync::{
        atomic::{AtomicI32, Ordering},
        Mutex,
    },
};

use qcuda_proto::{
    ioctl::{HostMapCall, IoctlCall, DEVICE_PATH, IOCTL_CALL, IOCTL_HOST_MAP, IOCTL_HOST_UNMAP},
    status, BatchRecord, Direction, GpuInfo, Op, BATCH_RECORD_SIZE, BATCH_TAIL, VERSION,
};

/// The file descriptor handed out for `/dev/qcuda` (-1 while none is open).
static DEVICE_FD: AtomicI32 = AtomicI32::new(-1);

/// The simulated host.
static HOST: Mutex<Host> = Mutex::new(Host {
    memory: BTreeMap::new(),
    next_addr: 0x7f00_0000_0000,
    next_handle: 1,
});

#[derive(Debug)]
struct Host {
    /// Device allocations: address -> bytes.
    memory: BTreeMap<u64, Vec<u8>>,
    next_addr: u64,
    next_handle: u64,
}

impl Host {
    fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }

    fn alloc(&mut self, size: u64) -> u64 {
        let addr = self.next_addr;
        self.next_addr += size.max(1).next_multiple_of(512) + 512;
        self.memory.insert(addr, vec![0; size as usize]);
        addr
    }

    /// `addr..addr + len` inside one allocation.
    fn bytes(&mut self, addr: u64, len: u64) -> Result<&mut [u8], u32> {
        let (&base, bytes) = self
            .memory
            .range_mut(..=addr)
            .next_back()
            .ok_or(status::INVALID_VALUE)?;
        let at = (addr - base) as usize;
        bytes
            .get_mut(at..at + len as usize)
            .ok_or(status::INVALID_VALUE)
    }
}

/// An H200's answers for the attributes programs commonly read; every other attribute reads 0.
fn attribute(id: i32) -> i32 {
    match id {
        1..=3 => 1024,          // max threads per block, block x and y
        4 => 64,                // block z
        5 => i32::MAX,          // grid x
        6 | 7 => 65535,         // grid y, z
        8 => 48 << 10,          // shared memory per block
        9 => 64 << 10,          // constant memory
        10 => 32,               // warp size
        12 | 82 => 64 << 10,    // registers per block, per SM
        13 => 1_980_000,        // clock rate (kHz)
        16 => 132,              // multiprocessors
        19 => 1,                // can map host memory (qcuda_bench then sets cudaDeviceMapHost)
        40 | 41 | 83 | 89 => 1, // unified addressing, 64-bit, managed memory, concurrent managed
        75 => 9,                // compute capability major
        81 => 228 << 10,        // shared memory per SM
        97 => 227 << 10,        // shared memory per block, opt-in
        39 => 2048,             // max threads per SM
        _ => 0,
    }
}

/// One request (not a batch): its status and return values.
fn run(h: &mut Host, call: &IoctlCall, ins: &[&[u8]], outs: &mut [&mut [u8]]) -> (u32, [u64; 7]) {
    let mut rets = [0u64; 7];
    let args = &call.args;
    let Some(op) = Op::from_u32(call.op) else {
        return (status::NOT_SUPPORTED, rets);
    };
    let result: Result<(), u32> = (|| {
        match op {
            Op::Hello => rets[..3].copy_from_slice(&[u64::from(VERSION), 1, 13000]),
            Op::DeviceCount => rets[0] = 1,
            Op::DriverVersion => rets[0] = 13000,
            Op::DeviceInfo => {
                let mut g = GpuInfo::default();
                g.set_name(b"qcuda test double (H200)");
                g.uuid = [0x42; 16];
                g.total_mem = 140 << 30;
                g.cc_major = 9;
                g.multiprocessors = 132;
                g.pci_bus = 0x10;
                g.pcie_link = [5, 16, 5, 16];
                let b = g.encode();
                let out = outs.first_mut().ok_or(status::INVALID_VALUE)?;
                let n = out.len().min(b.len());
                out[..n].copy_from_slice(&b[..n]);
            }
            Op::DriverRelease => {
                let text = b"580.95.05";
                if let Some(out) = outs.first_mut().filter(|o| o.len() >= text.len()) {
                    out[..text.len()].copy_from_slice(text);
                }
                rets[0] = text.len() as u64;
            }
            Op::DeviceAttributes => {
                let (ids, out) = (ins.first().ok_or(status::INVALID_VALUE)?, &mut outs[0]);
                for (id, out) in ids.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
                    let id = i32::from_le_bytes([id[0], id[1], id[2], id[3]]);
                    out.copy_from_slice(&attribute(id).to_le_bytes());
                }
            }
            Op::MemGetInfo => rets[..2].copy_from_slice(&[139 << 30, 140 << 30]),
            Op::Malloc => rets[0] = h.alloc(args[0]),
            Op::Free => {
                if args[0] != 0 {
                    h.memory.remove(&args[0]).ok_or(status::INVALID_VALUE)?;
                }
            }
            Op::MemcpyHtoD => {
                let data = ins.first().ok_or(status::INVALID_VALUE)?;
                h.bytes(args[0], data.len() as u64)?.copy_from_slice(data);
            }
            Op::MemcpyDtoH => {
                let out = outs.first_mut().ok_or(status::INVALID_VALUE)?;
                out.copy_from_slice(h.bytes(args[0], out.len() as u64)?);
            }
            Op::Memset => {
                let len = args[2] * args[4].max(1);
                h.bytes(args[0], len)?.fill(args[1] as u8);
            }
            Op::ModuleLoad | Op::StreamCreate | Op::EventCreate => rets[0] = h.handle(),
            // Every kernel exists and takes no parameters.
            Op::ModuleGetFunction => rets[0] = h.handle(),
            Op::FuncAttributes => {
                for out in outs.iter_mut() {
                    out.fill(0);
                }
            }
            Op::DeviceGetLimit => rets[0] = if args[0] == 1 { 1 << 20 } else { 0 },
            Op::StreamPriorityRange => rets[..2].copy_from_slice(&[0, u64::from(-5i32 as u32)]),
            Op::DeviceGetDefaultMemPool => rets[0] = 1,
            // Libraries (cuBLAS at its handle's creation) size their kernels by these.
            Op::OccupancyAvailableDynamicSMem => rets[0] = 227 << 10,
            Op::OccupancyMaxActiveBlocks => rets[0] = 1,
            // Every global exists: 64 KiB of zeros each time it is asked for.
            Op::ModuleGetGlobal => rets[..2].copy_from_slice(&[h.alloc(64 << 10), 64 << 10]),
            // No stream is ever capturing; a stream's id is its handle.
            Op::StreamCaptureInfo => {}
            Op::StreamGetId => rets[0] = args[0] + 1,
            Op::OccupancyCluster => rets[0] = if args[6] == 1 { 16 } else { 8 },
            Op::TakeOutput | Op::HostLatency | Op::VmUsage => rets[0] = 0,
            Op::DeviceSynchronize
            | Op::StreamSynchronize
            | Op::EventSynchronize
            | Op::StreamQuery
            | Op::EventQuery
            | Op::EventRecord
            | Op::EventDestroy
            | Op::StreamDestroy
            | Op::StreamWaitEvent
            | Op::ModuleUnload
            | Op::LaunchKernel
            | Op::LaunchKernelEx
            | Op::FuncSetAttribute
            | Op::DeviceSetLimit
            | Op::SessionClose => {}
            _ => {
                eprintln!("qcuda device double: {op:?} is not simulated");
                return Err(status::NOT_SUPPORTED);
            }
        }
        Ok(())
    })();
    (result.err().unwrap_or(status::SUCCESS), rets)
}

/// Whether `QCUDA_DOUBLE_TRACE` asks for a line per ioctl.
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("QCUDA_DOUBLE_TRACE").is_some_and(|v| v != "0"))
}

/// The op's name, or its number where it has none.
fn op_name(op: u32) -> String {
    Op::from_u32(op).map_or_else(|| format!("op#{op}"), |op| format!("{op:?}"))
}

/// The trace line of one `IOCTL_CALL` (see the module's doc).
fn trace_call(call: &IoctlCall) {
    use std::fmt::Write;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let mut line = format!(
        "qcuda-double: {} flags={:#x} device={} tid={tid}",
        op_name(call.op),
        call.flags,
        call.device
    );
    let used = call.args.iter().rposition(|&a| a != 0).map_or(0, |i| i + 1);
    if used > 0 {
        let args: Vec<String> = call.args[..used]
            .iter()
            .map(|a| format!("{a:#x}"))
            .collect();
        let _ = write!(line, " args=[{}]", args.join(","));
    }
    for b in &call.bufs[..(call.nbufs as usize).min(call.bufs.len())] {
        let dir = if b.dir == Direction::In as u32 {
            "in"
        } else {
            "out"
        };
        let _ = write!(line, " {dir}:{}@{:#x}", b.len, b.addr);
    }
    if call.op == Op::Batch as u32 && call.nbufs > 0 {
        // SAFETY: as in `execute`: the batch's In buffer is valid for the ioctl.
        let ins = unsafe {
            std::slice::from_raw_parts(call.bufs[0].addr as *const u8, call.bufs[0].len as usize)
        };
        // Runs of one op with one in-data length as one entry, `op in:N *count`.
        let mut runs: Vec<(Op, u32, u64)> = Vec::new();
        let mut at = 0usize;
        for _ in 0..call.args[0] {
            let Ok((op, rec)) = BatchRecord::decode(&ins[at.min(ins.len())..]) else {
                break;
            };
            match runs.last_mut() {
                Some((o, n, count)) if *o == op && *n == rec.in_len => *count += 1,
                _ => runs.push((op, rec.in_len, 1)),
            }
            at += rec.footprint();
        }
        let runs: Vec<String> = runs
            .iter()
            .map(|(op, n, count)| match count {
                1 => format!("{op:?} in:{n}"),
                _ => format!("{op:?} in:{n} *{count}"),
            })
            .collect();
        let _ = write!(line, " [{}]", runs.join(", "));
    }
    eprintln!("{line}");
}

/// `IOCTL_CALL`: the request named by `call`, its buffers in this process.
fn execute(call: &mut IoctlCall) {
    if tracing() {
        trace_call(call);
    }
    let bufs = &call.bufs[..(call.nbufs as usize).min(call.bufs.len())];
    let ins: Vec<&[u8]> = bufs
        .iter()
        .filter(|b| b.dir == Direction::In as u32)
        // SAFETY: guest-lib's `Call` keeps every buffer it names valid for the ioctl, which
        // spans this function; In buffers are only read.
        .map(|b| unsafe { std::slice::from_raw_parts(b.addr as *const u8, b.len as usize) })
        .collect();
    let mut outs: Vec<&mut [u8]> = bufs
        .iter()
        .filter(|b| b.dir == Direction::Out as u32)
        // SAFETY: as above; Out buffers are exclusively ours to write until we return.
        .map(|b| unsafe { std::slice::from_raw_parts_mut(b.addr as *mut u8, b.len as usize) })
        .collect();
    let mut h = HOST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (st, rets) = if call.op == Op::Batch as u32 {
        // Each record as the fire-and-forget request it stands for; a tail answers for all.
        let mut answer = (status::SUCCESS, [0; 7]);
        let mut at = 0usize;
        for _ in 0..call.args[0] {
            let Ok((op, rec)) = BatchRecord::decode(&ins[0][at..]) else {
                answer = (status::INVALID_VALUE, [0; 7]);
                break;
            };
            let data = &ins[0][at + BATCH_RECORD_SIZE..][..rec.in_len as usize];
            let mut sub = IoctlCall::new(op);
            sub.device = rec.device;
            sub.args = rec.args;
            let (st, rets) = run(&mut h, &sub, &[data], &mut []);
            if BATCH_TAIL.contains(&op) {
                answer = (st, rets);
                break;
            }
            at += rec.footprint();
        }
        answer
    } else {
        run(&mut h, call, &ins, &mut outs)
    };
    call.status = st;
    call.resp_flags = 0;
    call.rets = rets;
}

fn is_device(path: *const c_char) -> bool {
    // SAFETY: open's path argument is a NUL-terminated string (or null, checked).
    !path.is_null() && unsafe { CStr::from_ptr(path) }.to_bytes() == DEVICE_PATH.as_bytes()
}

/// A descriptor that stands for the device: a memfd, so that `close`, `fstat` and `mmap`
/// (anonymous pages: the double's "pinned memory") work on it as on any file.
fn open_device() -> c_int {
    // SAFETY: a NUL-terminated name and valid flags.
    let fd = unsafe { libc::memfd_create(c"qcuda-device-double".as_ptr(), libc::MFD_CLOEXEC) };
    if fd >= 0 {
        DEVICE_FD.store(fd, Ordering::Relaxed);
    }
    fd
}

/// libc's own `name`, looked up once per call site.
macro_rules! next {
    ($name:literal, $ty:ty) => {{
        static NEXT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let f = *NEXT.get_or_init(|| {
            // SAFETY: a NUL-terminated symbol name; RTLD_NEXT is the object after this one.
            unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) as usize }
        });
        assert!(f != 0, concat!("qcuda device double: no libc ", $name));
        // SAFETY: `f` is libc's `$name`, whose C type is `$ty`.
        let f = unsafe { std::mem::transmute::<usize, $ty>(f) };
        f
    }};
}

type Open = unsafe extern "C" fn(*const c_char, c_int, libc::mode_t) -> c_int;

// The interposed libc functions. `open` and `ioctl` are variadic in C; on x86-64 (the only
// target of this double) a third fixed argument is passed exactly as the variadic one.

/// # Safety
/// As libc's `open`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    if is_device(path) {
        return open_device();
    }
    let next = next!("open", Open);
    // SAFETY: forwarding the caller's arguments to libc.
    unsafe { next(path, flags, mode) }
}

/// # Safety
/// As libc's `open64`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    if is_device(path) {
        return open_device();
    }
    let next = next!("open64", Open);
    // SAFETY: forwarding the caller's arguments to libc.
    unsafe { next(path, flags, mode) }
}

/// # Safety
/// As libc's `ioctl`.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if fd < 0 || fd != DEVICE_FD.load(Ordering::Relaxed) {
        let next = next!(
            "ioctl",
            unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int
        );
        // SAFETY: forwarding the caller's arguments to libc.
        return unsafe { next(fd, request, arg) };
    }
    if request == c_ulong::from(IOCTL_CALL) {
        // SAFETY: IOCTL_CALL's argument is an IoctlCall the caller owns for the call.
        execute(unsafe { &mut *arg.cast::<IoctlCall>() });
        0
    } else if request == c_ulong::from(IOCTL_HOST_MAP) || request == c_ulong::from(IOCTL_HOST_UNMAP)
    {
        // SAFETY: both take a HostMapCall the caller owns for the call.
        let call = unsafe { &mut *arg.cast::<HostMapCall>() };
        if tracing() {
            let what = if request == c_ulong::from(IOCTL_HOST_MAP) {
                "host-map"
            } else {
                "host-unmap"
            };
            eprintln!(
                "qcuda-double: {what} len={} flags={:#x}",
                call.len, call.flags
            );
        }
        // Pages of the double's own mmap are the "device" address, as inside the window.
        call.status = status::SUCCESS;
        call.dev_addr = call.addr;
        0
    } else {
        // SAFETY: errno is thread-local and always writable.
        unsafe { *libc::__errno_location() = libc::ENOTTY };
        -1
    }
}

/// # Safety
/// As libc's `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: libc::size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    type Mmap = unsafe extern "C" fn(
        *mut c_void,
        libc::size_t,
        c_int,
        c_int,
        c_int,
        libc::off_t,
    ) -> *mut c_void;
    let mmap: Mmap = next!("mmap", Mmap);
    if fd >= 0 && fd == DEVICE_FD.load(Ordering::Relaxed) {
        // The module's pages: anonymous memory at the place asked for.
        let flags = (flags & !libc::MAP_SHARED) | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: the caller's own mapping request, made anonymous.
        return unsafe { mmap(addr, len, prot, flags, -1, 0) };
    }
    // SAFETY: forwarding the caller's arguments to libc.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// As libc's `mmap64`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: libc::size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

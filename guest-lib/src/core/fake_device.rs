//! `FakeDevice`: an in-process test double for `/dev/qcuda` plus the host.
//!
//! It implements [`Transport`] by executing each call against a small simulated GPU: byte-array
//! allocations, modules that "contain" the kernels and globals a test declares, streams, events,
//! recorded launches, and the host's error rules (fire-and-forget failures reported at the next
//! synchronising op, sticky errors until `DeviceReset`). Every call is first checked with the
//! kernel module's own validation (`IoctlCall::decode`), so a malformed request fails the test.
//! Tests can also inject errnos and failures.

#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    reason = "test double: it decodes what guest-lib itself encoded in the same test process (the wire's 32-bit values in 64-bit words, C ints as their bit patterns, sizes of test allocations)"
)]

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use qcuda_proto::{
    ioctl::{HostMapCall, IoctlCall},
    status, BatchRecord, Direction, GpuInfo, Op, ParamInfo, WaitMode, BATCH_RECORD_SIZE,
    BATCH_TAIL, FLAG_ASYNC, RESP_DEFERRED_SHIFT, RESP_FLAG_STICKY, VERSION,
};

use crate::{
    core::runtime::{self, Runtime},
    core::transport::{Call, Transport},
};

/// A recorded kernel launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub function: u64,
    pub args: [u64; 6],
    pub params: Vec<u8>,
    pub fire_and_forget: bool,
}

/// One executed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    pub op: Op,
    pub device: u32,
    pub fire_and_forget: bool,
    pub in_len: u64,
    pub out_len: u64,
    /// How the caller waited (`CALL_WAIT_*`); a batch's records log the batch's.
    pub wait: WaitMode,
}

/// The simulated host.
#[derive(Debug, Default)]
pub struct FakeState {
    /// Other guest processes under CUDA's process checkpoint, as the kernel module and the
    /// host together answer for them (`Op::ProcessCheckpoint`): pid -> `PROCESS_STATE_*`. A
    /// pid not listed has no CUDA session.
    pub processes: HashMap<i32, u64>,
    /// Pids whose lock never gets taken in time (a long call under way there).
    pub busy_processes: Vec<i32>,
    /// The arguments of the last `ProcessCheckpoint`.
    pub last_process_call: Option<[u64; 3]>,
    pub devices: u32,
    pub driver_version: i32,
    /// Attribute values; ids below 150 not listed read as `id * 10`, except `unknown` ones.
    pub attributes: HashMap<i32, i32>,
    /// Attribute ids the fake driver does not know.
    pub unknown_attributes: Vec<i32>,
    pub memory: BTreeMap<u64, Vec<u8>>,
    /// Host-mapped guest ranges (`IOCTL_HOST_MAP`): address -> length. Their device address is
    /// their address, as on the real host inside the window.
    pub host_maps: BTreeMap<u64, u64>,
    /// Managed memory placed on the device whose guest pages came (`HOST_MAP_MANAGED`):
    /// address -> the device's bytes, which copies, memsets and `device_bytes` reach instead of
    /// the guest pages until `ManagedMigrate` carries them over, as on the real host.
    pub managed: BTreeMap<u64, Vec<u8>>,
    /// `ManagedPlace`: address -> (bytes the guest maps, bytes reserved, its pages came).
    pub placed: BTreeMap<u64, (u64, u64, bool)>,
    /// Addresses the next `ManagedPlace`s answer, before the fake's own (a test puts there
    /// addresses its process holds, as a host's driver may give).
    pub place_at: VecDeque<u64>,
    /// Honour the address offered to `ManagedPlace` (a driver that honours hints).
    pub honour_hint: bool,
    /// `ManagedMigrate` to the host moves nothing (work that may touch it still runs).
    pub managed_busy: bool,
    /// The `ManagedMigrate` requests: (address, direction, stream, scope).
    pub migrations: Vec<[u64; 4]>,
    next_addr: u64,
    pub modules: HashMap<u64, Vec<u8>>,
    /// Kernel node -> the launch attributes set on it.
    pub node_attributes: HashMap<u64, Vec<qcuda_proto::LaunchAttr>>,
    next_handle: u64,
    /// Kernels every module contains: name → parameter layout.
    pub kernels: HashMap<String, Vec<ParamInfo>>,
    functions: Vec<String>,
    /// Globals every module contains: name → device address (allocated in `memory`).
    pub globals: HashMap<String, u64>,
    pub launches: Vec<Launch>,
    /// Graphs and captures (fake_graphs.rs).
    pub graphs: crate::core::fake_graphs::FakeGraphs,
    pub log: Vec<Logged>,
    pub streams: Vec<u64>,
    /// Event handle → recorded "time" in ms, if recorded.
    pub events: HashMap<u64, Option<f32>>,
    clock: f32,
    /// errnos returned (instead of executing, except `EINPROGRESS`: after) by the next calls.
    pub errnos: VecDeque<i32>,
    /// The next call of this op fails with this status; the flag sets `RESP_FLAG_STICKY` on
    /// the reply (as the host does for every reply while the session holds a sticky error).
    pub fail_next: Option<(Op, u32, bool)>,
    /// A fire-and-forget failure waiting for the next synchronising op.
    pending: Option<(u32, bool)>,
    /// The context's sticky error.
    sticky: Option<u32>,
    /// Host functions due (key, seq), for `HostFuncWait`.
    pub host_due: VecDeque<(u64, u64)>,
    next_seq: u64,
    /// Sequence numbers the guest released, in order.
    pub host_released: Vec<u64>,
    /// A host function became due: wake `HostFuncWait`.
    host_due_signal: bool,
    /// The host's GPU timeline recorder (`Op::GpuTrace`): arms so far, whether armed, and
    /// whether a read of the recording is still to come.
    pub trace_arms: u64,
    pub trace_armed: bool,
    trace_unread: bool,
    /// `Batch` requests received.
    pub batches: u64,
    /// Requests received (ioctls), `HostFuncWait` aside.
    pub requests: u64,
    /// Arrays and texture/surface objects (fake_arrays.rs).
    pub arrays: crate::core::fake_arrays::FakeArrays,
    /// Memory pools: host handle -> (device, is a default pool).
    pub pools: HashMap<u64, (u32, bool)>,
    /// Device -> its current pool, when set.
    pub current_pools: HashMap<u32, u64>,
    /// (pool, attribute) -> value.
    pub pool_attrs: HashMap<(u64, u64), u64>,
    /// The last cache configuration set (function or device).
    pub cache_config: u32,
    /// The `LaunchAttr` records of the last `LaunchKernelEx` or `OccupancyCluster`.
    pub launch_attrs: Vec<u8>,
    /// VMM allocation handles: handle -> (device, size, handle types, references).
    pub vmm_handles: HashMap<u64, (u32, u64, u64, usize)>,
    /// VMM reservations: base -> size.
    pub vmm_reserved: BTreeMap<u64, u64>,
    /// VMM mappings: address -> (size, handle); their bytes are in `memory`.
    pub vmm_maps: BTreeMap<u64, (u64, u64)>,
    /// IPC exports: token -> (kind, device pointer or allocation handle, size).
    pub ipc_exports: HashMap<u64, (u64, u64, u64)>,
    /// Addresses `IpcImport` gave for legacy handles, not yet closed.
    pub ipc_opened: Vec<u64>,
    /// Pools created shareable as POSIX descriptors.
    pub shareable_pools: Vec<u64>,
    /// Pools imported through `IpcImport`.
    pub imported_pools: Vec<u64>,
    /// Events created interprocess without timing (exportable).
    pub ipc_events: Vec<u64>,
}

/// The fake's VMM granularity (2 MiB, as an H100's).
pub const VMM_GRANULARITY: u64 = 2 << 20;

/// The test double; share it with the runtime through `Arc`.
#[derive(Debug, Default)]
pub struct FakeDevice {
    state: Mutex<FakeState>,
    /// Signalled when a host function becomes due.
    host_due: Condvar,
}

/// Kernel name that makes a launch fail later with a sticky illegal address.
pub const FAULTING_KERNEL: &str = "_Z5faultv";

impl FakeDevice {
    /// A host with `devices` H100-like GPUs.
    pub fn new(devices: u32) -> Arc<Self> {
        let fake = Self::default();
        {
            let mut s = fake.state();
            s.devices = devices;
            s.driver_version = 13000;
            s.next_addr = 0x7f00_0000_0000;
            s.next_handle = 1;
            // Small handle values on purpose: the guest must not hand them out as cudaStream_t.
            for (attr, v) in [
                (1, 1024),
                (2, 1024),
                (3, 1024),
                (4, 64),
                (5, i32::MAX),
                (6, 65535),
                (7, 65535),
                (8, 49152),
                (10, 32),
                (16, 132),
                (19, 1),
                (41, 1),
                (75, 9),
                (76, 0),
                (83, 1),
                (97, 232_448),
                (102, 1),
            ] {
                s.attributes.insert(attr, v);
            }
        }
        Arc::new(fake)
    }

    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    /// Declares a kernel that every loaded module contains.
    pub fn add_kernel(&self, name: &str, params: &[(u32, u32)]) {
        let params = params
            .iter()
            .map(|&(offset, size)| ParamInfo { offset, size })
            .collect();
        self.state().kernels.insert(name.to_owned(), params);
    }

    /// Declares a global of `size` bytes that every loaded module contains.
    pub fn add_global(&self, name: &str, size: usize) -> u64 {
        let mut s = self.state();
        let addr = s.alloc(size as u64);
        s.globals.insert(name.to_owned(), addr);
        addr
    }

    /// The ops executed so far.
    pub fn ops(&self) -> Vec<Op> {
        self.state().log.iter().map(|l| l.op).collect()
    }

    /// A runtime connected to this fake, installed as the calling thread's runtime.
    pub fn install(self: &Arc<Self>) -> &'static Runtime {
        runtime::install(Runtime::connect(Box::new(self.clone()), false).unwrap())
    }
}

impl FakeState {
    fn alloc(&mut self, size: u64) -> u64 {
        let addr = self.next_addr;
        self.next_addr += size.max(1).next_multiple_of(256) + 256;
        self.memory.insert(addr, vec![0; size as usize]);
        addr
    }

    /// The VMM ops: checks what the host checks that the guest relies on.
    fn vmm(&mut self, op: Op, device: u32, args: &[u64], rets: &mut [u64]) -> Result<(), u32> {
        let g = VMM_GRANULARITY;
        match op {
            Op::MemGetGranularity => rets[0] = g,
            Op::MemCreate => {
                if args[0] == 0 || !args[0].is_multiple_of(g) || device >= self.devices {
                    return Err(status::INVALID_VALUE);
                }
                let h = self.handle();
                self.vmm_handles.insert(h, (device, args[0], args[1], 1));
                rets[0] = h;
            }
            Op::MemRelease => {
                let e = self
                    .vmm_handles
                    .get_mut(&args[0])
                    .ok_or(status::INVALID_VALUE)?;
                e.3 -= 1;
                if e.3 == 0 {
                    self.vmm_handles.remove(&args[0]);
                }
            }
            Op::MemAddressReserve => {
                let base = 0x6000_0000_0000 + self.vmm_reserved.len() as u64 * (1 << 36);
                self.vmm_reserved.insert(base, args[0]);
                rets[0] = base;
            }
            Op::MemAddressFree => {
                if self.vmm_reserved.get(&args[0]) != Some(&args[1]) {
                    return Err(status::INVALID_VALUE);
                }
                self.vmm_reserved.remove(&args[0]);
            }
            Op::MemMap => {
                let &(_, size, _, _) = self
                    .vmm_handles
                    .get(&args[3])
                    .ok_or(status::INVALID_VALUE)?;
                let inside = self
                    .vmm_reserved
                    .range(..=args[0])
                    .next_back()
                    .is_some_and(|(&b, &l)| args[0] + args[1] <= b + l);
                if !inside || args[2] + args[1] > size || self.vmm_maps.contains_key(&args[0]) {
                    return Err(status::INVALID_VALUE);
                }
                self.vmm_maps.insert(args[0], (args[1], args[3]));
                self.memory.insert(args[0], vec![0; args[1] as usize]);
            }
            Op::MemUnmap => {
                let end = args[0] + args[1];
                let gone: Vec<u64> = self.vmm_maps.range(args[0]..end).map(|(&a, _)| a).collect();
                if gone.is_empty() {
                    return Err(status::INVALID_VALUE);
                }
                for a in gone {
                    self.vmm_maps.remove(&a);
                    self.memory.remove(&a);
                }
            }
            Op::MemSetAccess => {
                self.vmm_maps.get(&args[0]).ok_or(status::INVALID_VALUE)?;
            }
            Op::MemGetAccess | Op::MemRetainHandle | Op::MemMappingRange => {
                let (&va, &(size, h)) = self
                    .vmm_maps
                    .range(..=args[0])
                    .next_back()
                    .filter(|(&va, &(size, _))| args[0] < va + size)
                    .ok_or(status::INVALID_VALUE)?;
                match op {
                    Op::MemGetAccess => rets[0] = 3,
                    // The mapping's handle, one reference more (as the host answers while the
                    // process still holds a handle of the allocation).
                    Op::MemRetainHandle => {
                        self.vmm_handles.get_mut(&h).ok_or(status::INVALID_VALUE)?.3 += 1;
                        rets[0] = h;
                    }
                    _ => rets[..2].copy_from_slice(&[va, size]),
                }
            }
            Op::MemHandleProperties => {
                let &(d, _, types, _) = self
                    .vmm_handles
                    .get(&args[0])
                    .ok_or(status::INVALID_VALUE)?;
                rets[..4].copy_from_slice(&[u64::from(d), types, 0, 0]);
            }
            _ => return Err(status::NOT_SUPPORTED),
        }
        Ok(())
    }

    /// For fake_arrays.rs: a new allocation.
    pub fn alloc_for_test(&mut self, size: u64) -> u64 {
        self.alloc(size)
    }

    /// For fake_arrays.rs: a new handle.
    pub fn handle_for_test(&mut self) -> u64 {
        self.handle()
    }

    /// For fake_arrays.rs: a device range, or INVALID_VALUE.
    pub fn device_bytes_checked(&mut self, addr: u64, len: u64) -> Result<&mut [u8], u32> {
        self.device_bytes(addr, len)
    }

    /// The host handle of `device`'s default pool.
    fn default_pool(&mut self, device: u32) -> u64 {
        if let Some((&h, _)) = self.pools.iter().find(|(_, &(d, def))| d == device && def) {
            return h;
        }
        let h = self.handle();
        self.pools.insert(h, (device, true));
        h
    }

    fn handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// The allocation holding `addr..addr + len`: (base, offset).
    fn range(&mut self, addr: u64, len: u64) -> Option<(u64, usize)> {
        let (&base, bytes) = self.memory.range(..=addr).next_back()?;
        let off = addr - base;
        (off + len <= bytes.len() as u64).then_some((base, off as usize))
    }

    /// Device memory (or a host-mapped range) for a test to read or change.
    pub fn device_bytes_for_test(&mut self, addr: u64, len: u64) -> &mut [u8] {
        self.device_bytes(addr, len).expect("a valid device range")
    }

    fn device_bytes(&mut self, addr: u64, len: u64) -> Result<&mut [u8], u32> {
        let placed = self
            .managed
            .range(..=addr)
            .next_back()
            .filter(|(&b, v)| addr + len <= b + v.len() as u64)
            .map(|(&b, _)| b);
        if let Some(b) = placed {
            let off = (addr - b) as usize;
            let v = self.managed.get_mut(&b).unwrap();
            return Ok(&mut v[off..off + len as usize]);
        }
        if let Some((&b, &l)) = self.host_maps.range(..=addr).next_back() {
            if addr + len <= b + l {
                // SAFETY: host-mapped ranges are live mappings of the test process (made by
                // `map_memory` or the test's own buffers) while they are in the table.
                return Ok(unsafe {
                    std::slice::from_raw_parts_mut(addr as *mut u8, len as usize)
                });
            }
        }
        let (base, off) = self.range(addr, len).ok_or(status::INVALID_VALUE)?;
        Ok(&mut self.memory.get_mut(&base).unwrap()[off..off + len as usize])
    }
}

impl Transport for Arc<FakeDevice> {
    /// Plain anonymous memory stands in for qcuda.ko's pages.
    fn map_memory(&self, addr: usize, len: usize) -> Result<(), i32> {
        // SAFETY: the caller owns the range (its reservation); MAP_FIXED replaces only it.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            Err(libc::ENOMEM)
        } else {
            Ok(())
        }
    }

    fn host_map(&self, call: &mut HostMapCall, unmap: bool) -> Result<(), i32> {
        let mut s = self.state();
        if let Some(errno) = s.errnos.pop_front() {
            return Err(errno);
        }
        HostMapCall::decode(&call.encode()).expect("guest-lib built a call the kernel refuses");
        let (addr, len) = (call.addr, call.len);
        call.status = if unmap {
            s.managed.remove(&addr);
            s.placed.remove(&addr);
            match s.host_maps.remove(&addr) {
                Some(_) => status::SUCCESS,
                None => status::HOST_MEMORY_NOT_REGISTERED,
            }
        } else if len == 0 {
            return Err(libc::EINVAL);
        } else if s
            .host_maps
            .range(..addr + len)
            .next_back()
            .is_some_and(|(&b, &l)| b + l > addr)
        {
            status::HOST_MEMORY_ALREADY_REGISTERED
        } else {
            let managed = call.flags & qcuda_proto::HOST_MAP_MANAGED != 0;
            match s.placed.get_mut(&addr) {
                // Only where ManagedPlace put device memory, of that length, once.
                Some((l, _, came)) if managed && *l == len && !*came => *came = true,
                _ if managed => {
                    call.status = status::INVALID_VALUE;
                    return Ok(());
                }
                _ => {}
            }
            s.host_maps.insert(addr, len);
            if managed {
                // SAFETY: the range was just mapped by `map_memory` for this call.
                let now = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
                s.managed.insert(addr, now.to_vec());
            }
            call.dev_addr = addr;
            status::SUCCESS
        };
        Ok(())
    }

    fn execute(&self, call: &mut Call<'_>) -> Result<(), i32> {
        if call.op() == Some(Op::HostFuncWait) {
            // Like the daemon: beside the other requests, waiting for as long as it takes.
            let mut s = self.state();
            let c = call.raw_mut();
            if c.args[0] != 0 {
                s.host_released.push(c.args[0]);
            }
            let (key, seq) = loop {
                if let Some(due) = s.host_due.pop_front() {
                    break due;
                }
                s = self.host_due.wait(s).unwrap();
            };
            c.status = status::SUCCESS;
            c.rets = [key, seq, 0, 0, 0, 0, 0];
            return Ok(());
        }
        let mut s = self.state();
        // EINPROGRESS, as from qcuda.ko: the request runs, its answer is lost.
        let lost_answer = match s.errnos.pop_front() {
            Some(libc::EINPROGRESS) => true,
            Some(errno) => return Err(errno),
            None => false,
        };
        s.requests += 1;
        let raw: IoctlCall = *call.raw();
        IoctlCall::decode(&raw.encode()).expect("guest-lib built a call the kernel refuses");
        let bufs = &raw.bufs[..raw.nbufs as usize];
        let ins: Vec<&[u8]> = bufs
            .iter()
            .filter(|b| b.dir == Direction::In as u32)
            // SAFETY: `Call` guarantees its buffers are valid for its lifetime, which spans
            // this call; In buffers are only read.
            .map(|b| unsafe { std::slice::from_raw_parts(b.addr as *const u8, b.len as usize) })
            .collect();
        let mut outs: Vec<&mut [u8]> = bufs
            .iter()
            .filter(|b| b.dir == Direction::Out as u32)
            // SAFETY: as above; Out buffers are exclusively ours to write until we return.
            .map(|b| unsafe { std::slice::from_raw_parts_mut(b.addr as *mut u8, b.len as usize) })
            .collect();
        let (status, flags, rets) = if raw.op == Op::Batch as u32 {
            // Like vhost-cuda: each record as the fire-and-forget request it stands for.
            s.batches += 1;
            let waited = raw.flags & u32::from(FLAG_ASYNC) == 0;
            let mut at = 0usize;
            let mut answer = (status::SUCCESS, 0, [0; 7]);
            for i in 0..raw.args[0] {
                let (op, rec) = BatchRecord::decode(&ins[0][at..]).expect("a valid batch record");
                let data = &ins[0][at + BATCH_RECORD_SIZE..][..rec.in_len as usize];
                let mut sub = IoctlCall::new(op);
                sub.device = rec.device;
                sub.args = rec.args;
                // A synchronising tail (only last, only in a waited batch) answers for it.
                if BATCH_TAIL.contains(&op) {
                    assert!(waited && i + 1 == raw.args[0], "a misplaced batch tail");
                    // It waits as the batch does.
                    sub.flags = raw.wait_mode().call_flags();
                    answer = execute_one(&mut s, &sub, &[], &mut []);
                    break;
                }
                sub.flags = u32::from(FLAG_ASYNC);
                if op.shape().0 == 1 {
                    sub.push(Direction::In, data.as_ptr() as u64, data.len() as u64)
                        .unwrap();
                }
                let subs: Vec<&[u8]> = if op.shape().0 == 1 {
                    vec![data]
                } else {
                    vec![]
                };
                execute_one(&mut s, &sub, &subs, &mut []);
                at += rec.footprint();
            }
            answer
        } else {
            execute_one(&mut s, &raw, &ins, &mut outs)
        };
        if std::mem::take(&mut s.host_due_signal) {
            self.host_due.notify_all();
        }
        if lost_answer {
            return Err(libc::EINPROGRESS);
        }
        let c = call.raw_mut();
        c.status = status;
        c.resp_flags = flags;
        c.rets = rets;
        Ok(())
    }
}

/// Logs and runs one request with the host's fire-and-forget rules: (status, flags, rets).
fn execute_one(
    s: &mut FakeState,
    raw: &IoctlCall,
    ins: &[&[u8]],
    outs: &mut [&mut [u8]],
) -> (u32, u32, [u64; 7]) {
    let op = Op::from_u32(raw.op).unwrap();
    let fire_and_forget = raw.flags & u32::from(FLAG_ASYNC) != 0;
    let bufs = &raw.bufs[..raw.nbufs as usize];
    let in_len = bufs
        .iter()
        .filter(|b| b.dir == Direction::In as u32)
        .map(|b| b.len)
        .sum();
    let out_len = bufs
        .iter()
        .filter(|b| b.dir == Direction::Out as u32)
        .map(|b| b.len)
        .sum();
    s.log.push(Logged {
        op,
        device: raw.device,
        fire_and_forget,
        in_len,
        out_len,
        wait: raw.wait_mode(),
    });
    let mut rets = [0u64; 7];
    let result = run(s, raw, ins, outs, &mut rets);
    if op == Op::LaunchHostFunc && result.is_ok() {
        s.host_due_signal = true;
    }
    let (mut st, mut sticky) = match result {
        Ok(()) => (status::SUCCESS, false),
        Err(code) => (code, s.sticky == Some(code)),
    };
    if st == status::SUCCESS {
        if let Some((fop, code, flag)) = s.fail_next {
            if fop == op {
                s.fail_next = None;
                (st, sticky) = (code, flag);
            }
        }
    }
    let mut deferred = 0;
    if fire_and_forget && st != status::SUCCESS {
        // Nobody reads this reply: like vhost-cuda, carry the failure in the next reply to
        // a waited-for op (RESP_DEFERRED_SHIFT).
        s.pending.get_or_insert((st, sticky));
        st = status::SUCCESS;
        sticky = false;
    } else if !fire_and_forget {
        if let Some((code, was_sticky)) = s.pending.take() {
            deferred = code;
            sticky |= was_sticky;
        }
    }
    let flags = (if sticky { RESP_FLAG_STICKY } else { 0 }) | (deferred << RESP_DEFERRED_SHIFT);
    (st, flags, rets)
}

fn run(
    s: &mut FakeState,
    raw: &IoctlCall,
    ins: &[&[u8]],
    outs: &mut [&mut [u8]],
    rets: &mut [u64; 7],
) -> Result<(), u32> {
    let (op, device, args) = (Op::from_u32(raw.op).unwrap(), raw.device, &raw.args);
    let fire_and_forget = raw.flags & u32::from(FLAG_ASYNC) != 0;
    let needs_context = crate::core::transport::session::needs_context(op);
    if needs_context {
        if let Some(code) = s.sticky {
            return Err(code);
        }
    }
    if !matches!(op, Op::Hello | Op::DeviceCount | Op::DriverVersion) && device >= s.devices {
        return Err(status::INVALID_DEVICE);
    }
    match op {
        Op::Hello => {
            *rets = [
                u64::from(VERSION),
                u64::from(s.devices),
                s.driver_version as u64,
                0,
                0,
                0,
                0,
            ];
        }
        Op::DeviceCount => rets[0] = u64::from(s.devices),
        Op::DriverVersion => rets[0] = s.driver_version as u64,
        Op::DeviceInfo => {
            let mut g = GpuInfo::default();
            g.set_name(format!("Fake H100 {device}").as_bytes());
            g.uuid = [device as u8; 16];
            g.total_mem = 80 << 30;
            g.cc_major = 9;
            g.multiprocessors = 132;
            g.pci_bus = 0x10 + device as i32;
            g.pcie_link = [4, 16, 5, 16];
            outs[0].copy_from_slice(&g.encode());
        }
        Op::DriverRelease => {
            let text = b"580.95.05";
            if text.len() <= outs[0].len() {
                outs[0][..text.len()].copy_from_slice(text);
            }
            rets[0] = text.len() as u64;
        }
        Op::DeviceAttributes => {
            for (id, out) in ins[0].chunks_exact(4).zip(outs[0].chunks_exact_mut(4)) {
                let id = i32::from_le_bytes(id.try_into().unwrap());
                let known = id < 150 && !s.unknown_attributes.contains(&id);
                let v = match s.attributes.get(&id) {
                    Some(v) => *v,
                    None if known => id * 10,
                    None => return Err(status::INVALID_VALUE),
                };
                out.copy_from_slice(&v.to_le_bytes());
            }
        }
        Op::DeviceSynchronize | Op::StreamSynchronize | Op::EventSynchronize => {}
        Op::DeviceReset => {
            s.sticky = None;
            s.pending = None;
            s.memory.clear();
            s.modules.clear();
            s.globals.clear();
            s.pools.retain(|_, (d, _)| *d != device);
            s.current_pools.remove(&device);
        }
        Op::MemGetInfo => {
            let used: u64 = s.memory.values().map(|m| m.len() as u64).sum();
            *rets = [(80 << 30) - used, 80 << 30, 0, 0, 0, 0, 0];
        }
        Op::Malloc => rets[0] = s.alloc(args[0]),
        Op::Free => {
            if args[0] != 0 && s.memory.remove(&args[0]).is_none() {
                return Err(status::INVALID_VALUE);
            }
        }
        Op::MemcpyHtoD => s
            .device_bytes(args[0], ins[0].len() as u64)?
            .copy_from_slice(ins[0]),
        Op::MemcpyDtoH => {
            let len = outs[0].len() as u64;
            outs[0].copy_from_slice(s.device_bytes(args[0], len)?);
        }
        Op::MemcpyDtoD => {
            let src = s.device_bytes(args[1], args[2])?.to_vec();
            s.device_bytes(args[0], args[2])?.copy_from_slice(&src);
        }
        Op::Memset => {
            let width = usize::try_from(args[4].max(1)).unwrap_or(1);
            let pattern = (args[1] as u32).to_le_bytes();
            let len = args[2] * width as u64;
            for chunk in s.device_bytes(args[0], len)?.chunks_exact_mut(width) {
                chunk.copy_from_slice(&pattern[..width]);
            }
        }
        Op::MemcpyMapped => {
            let src = s.device_bytes(args[1], args[2])?.to_vec();
            s.device_bytes(args[0], args[2])?.copy_from_slice(&src);
        }
        Op::ManagedPlace => {
            let (len, hint) = (args[0], args[1]);
            let align = qcuda_proto::MANAGED_ALIGN;
            if len == 0 || len % 4096 != 0 || hint % align != 0 {
                return Err(status::INVALID_VALUE);
            }
            let size = len.next_multiple_of(align);
            let at = if hint != 0 && s.honour_hint {
                hint
            } else if let Some(a) = s.place_at.pop_front() {
                a
            } else {
                // Addresses of the fake's own, apart for every fake of the test process.
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = NEXT.fetch_add(size + align, std::sync::atomic::Ordering::Relaxed);
                0x5e00_0000_0000 + n
            };
            s.placed.insert(at, (len, size, false));
            rets[..2].copy_from_slice(&[at, size]);
        }
        Op::ManagedUnplace => match s.placed.get(&args[0]) {
            Some(&(_, _, false)) => {
                s.placed.remove(&args[0]);
            }
            _ => return Err(status::INVALID_VALUE),
        },
        Op::ManagedMigrate => {
            let (base, dir) = (args[0], args[1]);
            s.migrations.push([args[0], args[1], args[2], args[3]]);
            if args[3] > 1 || (args[3] == 1 && args[2] == 0) {
                return Err(status::INVALID_VALUE);
            }
            if dir == qcuda_proto::MANAGED_TO_HOST && s.managed_busy {
                s.managed.get(&base).ok_or(status::INVALID_VALUE)?;
                rets[0] = 0;
                return Ok(());
            }
            let dev = s.managed.get_mut(&base).ok_or(status::INVALID_VALUE)?;
            // SAFETY: a managed range stays mapped (by `map_memory`) while it is in the table.
            let guest = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, dev.len()) };
            match dir {
                qcuda_proto::MANAGED_TO_DEVICE => dev.copy_from_slice(guest),
                qcuda_proto::MANAGED_TO_HOST => guest.copy_from_slice(dev),
                _ => return Err(status::INVALID_VALUE),
            }
            rets[0] = 1;
        }
        // Only qcuda.ko sends these.
        Op::HostMap | Op::HostUnmap => return Err(status::NOT_SUPPORTED),
        // The fake's kernels print nothing.
        Op::TakeOutput => rets[0] = 0,
        Op::DeviceGetLimit => rets[0] = if args[0] == 1 { 1 << 20 } else { 0 },
        Op::DeviceSetLimit => {}
        Op::FuncAttributes => {
            for (id, out) in ins[0].chunks_exact(4).zip(outs[0].chunks_exact_mut(4)) {
                let id = i32::from_le_bytes(id.try_into().unwrap());
                out.copy_from_slice(&(100 + id).to_le_bytes());
            }
        }
        Op::FuncSetAttribute => {}
        qcuda_proto::array_ops!() => crate::core::fake_arrays::run(s, op, args, ins, outs, rets)?,
        Op::OccupancyMaxActiveBlocks => rets[0] = 2048 / args[1].max(1),
        Op::ModuleLoad => {
            if ins[0].len() < 16 || ins[0][..4] != 0xBA55_ED50u32.to_le_bytes() {
                return Err(status::INVALID_KERNEL_IMAGE);
            }
            let h = s.handle();
            s.modules.insert(h, ins[0].to_vec());
            rets[0] = h;
        }
        Op::TensorMapEncode => {
            // A stand-in encoding: the address first, then kind, rank and data type.
            use qcuda_proto::tensor_map::{TensorMapRequest, TENSOR_MAP_REPLACE_ADDRESS};
            let r = TensorMapRequest::decode(ins[0]).ok_or(status::INVALID_VALUE)?;
            let mut map = if r.kind == TENSOR_MAP_REPLACE_ADDRESS {
                r.map
            } else {
                [0u8; 128]
            };
            if r.kind != TENSOR_MAP_REPLACE_ADDRESS {
                map[8..12].copy_from_slice(&r.kind.to_le_bytes());
                map[12..16].copy_from_slice(&r.rank.to_le_bytes());
                map[16..24].copy_from_slice(&r.global_dim[0].to_le_bytes());
            }
            map[..8].copy_from_slice(&r.address.to_le_bytes());
            outs[0][..128].copy_from_slice(&map);
        }
        Op::ModuleLoadLogged => {
            // The options must be a link request without inputs; the logs say what came.
            let options =
                qcuda_proto::link::LinkRequest::decode(ins[1]).ok_or(status::INVALID_VALUE)?;
            let (info, error, code) =
                if ins[0].len() < 16 || ins[0][..4] != 0xBA55_ED50u32.to_le_bytes() {
                    (
                        String::new(),
                        "fake JIT: not a module image".to_string(),
                        218,
                    )
                } else {
                    let h = s.handle();
                    s.modules.insert(h, ins[0].to_vec());
                    rets[0] = h;
                    (
                        format!("fake JIT: {} options", options.options().count()),
                        String::new(),
                        0,
                    )
                };
            let i = info.len().min(outs[0].len());
            outs[0][..i].copy_from_slice(&info.as_bytes()[..i]);
            let e = error.len().min(outs[0].len() - i);
            outs[0][i..i + e].copy_from_slice(&error.as_bytes()[..e]);
            rets[1] = i as u64;
            rets[2] = e as u64;
            rets[3] = code;
        }
        Op::ModuleUnload => {
            s.modules
                .remove(&args[0])
                .ok_or(status::INVALID_RESOURCE_HANDLE)?;
        }
        Op::ModuleGetFunction => {
            if !s.modules.contains_key(&args[0]) {
                return Err(status::INVALID_RESOURCE_HANDLE);
            }
            let name = String::from_utf8(ins[0].to_vec()).unwrap();
            let params = s
                .kernels
                .get(&name)
                .ok_or(status::INVALID_DEVICE_FUNCTION)?
                .clone();
            s.functions.push(name);
            rets[0] = s.functions.len() as u64;
            rets[1] = params.len() as u64;
            for (p, out) in params.iter().zip(outs[0].chunks_exact_mut(8)) {
                out.copy_from_slice(&p.encode());
            }
        }
        Op::Link => {
            // The test double's linker: the inputs' bytes one after another; an input that
            // starts with "bad" fails with CUDA_ERROR_INVALID_PTX and an error log.
            let r = qcuda_proto::link::LinkRequest::decode(ins[0]).ok_or(status::INVALID_VALUE)?;
            let mut image = Vec::new();
            let mut code = 0;
            let mut error = Vec::new();
            for i in r.inputs() {
                if i.data.starts_with(b"bad") {
                    code = 218;
                    error = format!("error in {}", String::from_utf8_lossy(i.name)).into_bytes();
                    image.clear();
                    break;
                }
                image.extend_from_slice(i.data);
            }
            let info = if code == 0 {
                format!("linked {}", r.input_count()).into_bytes()
            } else {
                Vec::new()
            };
            let all = [image, info, error];
            let total: usize = all.iter().map(Vec::len).sum();
            if total <= outs[0].len() {
                let mut at = 0;
                for part in &all {
                    outs[0][at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
            }
            for (r, part) in rets.iter_mut().zip(&all) {
                *r = part.len() as u64;
            }
            rets[3] = code;
        }
        Op::ModuleFunctionNames => {
            if !s.modules.contains_key(&args[0]) {
                return Err(status::INVALID_RESOURCE_HANDLE);
            }
            let mut names: Vec<&String> = s.kernels.keys().collect();
            names.sort();
            let bytes: Vec<u8> = names
                .iter()
                .flat_map(|n| n.bytes().chain(std::iter::once(0)))
                .collect();
            if bytes.len() <= outs[0].len() {
                outs[0][..bytes.len()].copy_from_slice(&bytes);
            }
            rets[0] = names.len() as u64;
            rets[1] = bytes.len() as u64;
        }
        Op::ModuleGetGlobal => {
            if !s.modules.contains_key(&args[0]) {
                return Err(status::INVALID_RESOURCE_HANDLE);
            }
            let name = String::from_utf8(ins[0].to_vec()).unwrap();
            let addr = *s.globals.get(&name).ok_or(status::SYMBOL_NOT_FOUND)?;
            rets[0] = addr;
            rets[1] = s.memory[&addr].len() as u64;
        }
        Op::DeviceCanAccessPeer => rets[0] = u64::from(args[0] != args[1]),
        Op::DeviceP2PAttribute => rets[0] = u64::from(args[0] == 2),
        Op::PeerAccess => {
            if args[0] >= u64::from(s.devices) || args[0] == u64::from(device) {
                return Err(status::INVALID_DEVICE);
            }
        }
        Op::MemcpyPeer => {
            let src = s.device_bytes(args[2], args[4])?.to_vec();
            s.device_bytes(args[0], args[4])?.copy_from_slice(&src);
        }
        Op::FuncSetCacheConfig | Op::DeviceSetCacheConfig => s.cache_config = args[0] as u32,
        Op::DeviceGetCacheConfig => rets[0] = u64::from(s.cache_config),
        Op::OccupancyCluster => {
            s.launch_attrs = ins[0].to_vec();
            rets[0] = if args[6] == 1 { 16 } else { 8 };
        }
        Op::OccupancyAvailableDynamicSMem => rets[0] = 1000 * args[1] + args[2],
        Op::LaunchKernel | Op::LaunchKernelEx => {
            if op == Op::LaunchKernelEx {
                s.launch_attrs = ins[1].to_vec();
            }
            let function = args[0];
            let name = s
                .functions
                .get((function as usize).wrapping_sub(1))
                .ok_or(status::INVALID_RESOURCE_HANDLE)?
                .clone();
            s.launches.push(Launch {
                function,
                args: args[..6].try_into().unwrap(),
                params: ins[0].to_vec(),
                fire_and_forget,
            });
            // A launch into a capturing stream is a kernel node of its graph.
            let node = s.handle();
            s.graphs
                .capture_work(args[5], qcuda_proto::graph::NODE_KERNEL, ins[0], node);
            if name == FAULTING_KERNEL {
                s.sticky = Some(status::ILLEGAL_ADDRESS);
                return Err(status::ILLEGAL_ADDRESS);
            }
        }
        Op::StreamCreate => {
            let h = s.handle();
            s.streams.push(h);
            rets[0] = h;
            // Clamped to the fake's range, (0, -5).
            rets[1] = u64::from((args[1] as u32 as i32).clamp(-5, 0) as u32);
        }
        Op::StreamPriorityRange => rets[..2].copy_from_slice(&[0, u64::from(-5i32 as u32)]),
        Op::StreamGetId => rets[0] = 1000 + args[0],
        Op::DeviceGetDefaultMemPool => rets[0] = s.default_pool(device),
        Op::DeviceGetMemPool => {
            rets[0] = match s.current_pools.get(&device) {
                Some(&p) => p,
                None => s.default_pool(device),
            }
        }
        Op::DeviceSetMemPool => match s.pools.get(&args[0]) {
            Some(&(d, _)) if d == device => {
                s.current_pools.insert(device, args[0]);
            }
            _ => return Err(status::INVALID_VALUE),
        },
        Op::MemPoolCreate => {
            if args[1] > qcuda_proto::POOL_HANDLE_POSIX_FD {
                return Err(status::INVALID_VALUE);
            }
            let h = s.handle();
            s.pools.insert(h, (device, false));
            if args[1] != 0 {
                s.shareable_pools.push(h);
            }
            rets[0] = h;
        }
        Op::MemPoolExportPointer => {
            let len = s.memory.get(&args[0]).ok_or(status::INVALID_VALUE)?.len();
            outs[0][..8].copy_from_slice(&args[0].to_le_bytes());
            outs[0][8..16].copy_from_slice(&(len as u64).to_le_bytes());
            outs[0][16..24].copy_from_slice(&0x5ca1_ab1e_u64.to_le_bytes());
        }
        Op::MemPoolImportPointer => {
            if !s.imported_pools.contains(&args[0]) {
                return Err(status::INVALID_VALUE);
            }
            let word = |i: usize| u64::from_le_bytes(ins[0][i..i + 8].try_into().unwrap());
            if word(16) != 0x5ca1_ab1e || !s.memory.contains_key(&word(0)) {
                return Err(status::INVALID_VALUE);
            }
            rets[..2].copy_from_slice(&[word(0), word(8)]);
        }
        Op::MemPoolDestroy => match s.pools.get(&args[0]) {
            Some(&(_, false)) => {
                s.pools.remove(&args[0]);
                s.current_pools.retain(|_, p| *p != args[0]);
            }
            _ => return Err(status::INVALID_VALUE),
        },
        qcuda_proto::vmm_ops!() => s.vmm(op, device, args, rets)?,
        Op::IpcExport => {
            let (kind, arg) = (args[0], args[1]);
            let size = match kind {
                qcuda_proto::IPC_KIND_MEMORY => {
                    let (&base, bytes) = s
                        .memory
                        .range(..=arg)
                        .next_back()
                        .filter(|(&b, v)| arg < b + v.len() as u64)
                        .ok_or(status::INVALID_VALUE)?;
                    (base, bytes.len() as u64)
                }
                qcuda_proto::IPC_KIND_EVENT => {
                    if !s.ipc_events.contains(&arg) {
                        return Err(status::INVALID_RESOURCE_HANDLE);
                    }
                    (arg, 0)
                }
                qcuda_proto::IPC_KIND_POOL => {
                    if !s.shareable_pools.contains(&arg) {
                        return Err(status::INVALID_VALUE);
                    }
                    (arg, 0)
                }
                qcuda_proto::IPC_KIND_VMM => {
                    let &(_, size, types, _) =
                        s.vmm_handles.get(&arg).ok_or(status::INVALID_VALUE)?;
                    if types == 0 {
                        return Err(status::INVALID_VALUE);
                    }
                    (arg, size)
                }
                _ => return Err(status::INVALID_VALUE),
            };
            let token = s.handle();
            s.ipc_exports.insert(token, (kind, size.0, size.1));
            rets[..3].copy_from_slice(&[token, 0x5eed ^ token, !token]);
        }
        Op::IpcImport => {
            let token = args[1];
            let &(kind, arg, size) = s.ipc_exports.get(&token).ok_or(status::INVALID_VALUE)?;
            if kind != args[0] || [args[2], args[3]] != [0x5eed ^ token, !token] {
                return Err(status::INVALID_VALUE);
            }
            if kind == qcuda_proto::IPC_KIND_EVENT {
                let h = s.handle();
                s.events.insert(h, None);
                rets[0] = h;
                return Ok(());
            }
            if kind == qcuda_proto::IPC_KIND_POOL {
                let h = s.handle();
                s.pools.insert(h, (device, false));
                s.imported_pools.push(h);
                rets[0] = h;
                return Ok(());
            }
            if kind == qcuda_proto::IPC_KIND_VMM {
                s.vmm_handles.get_mut(&arg).ok_or(status::INVALID_VALUE)?.3 += 1;
            } else {
                s.ipc_opened.push(arg);
            }
            rets[..2].copy_from_slice(&[arg, size]);
        }
        Op::IpcClose => {
            let at = s
                .ipc_opened
                .iter()
                .position(|&p| p == args[0])
                .ok_or(status::INVALID_VALUE)?;
            s.ipc_opened.remove(at);
        }
        Op::MemPoolSetAttribute => {
            s.pools.get(&args[0]).ok_or(status::INVALID_VALUE)?;
            s.pool_attrs.insert((args[0], args[1]), args[2]);
        }
        Op::MemPoolGetAttribute => {
            s.pools.get(&args[0]).ok_or(status::INVALID_VALUE)?;
            rets[0] = s.pool_attrs.get(&(args[0], args[1])).copied().unwrap_or(0);
        }
        Op::MemPoolTrimTo | Op::MemPoolSetAccess => {
            s.pools.get(&args[0]).ok_or(status::INVALID_VALUE)?;
        }
        Op::MemPoolGetAccess => {
            let &(d, _) = s.pools.get(&args[0]).ok_or(status::INVALID_VALUE)?;
            rets[0] = if u64::from(d) == args[1] { 3 } else { 0 };
        }
        Op::MallocAsync => {
            if args[2] != 0 && !s.pools.contains_key(&args[2]) {
                return Err(status::INVALID_VALUE);
            }
            rets[0] = if args[0] == 0 { 0 } else { s.alloc(args[0]) };
        }
        Op::FreeAsync => {
            s.memory.remove(&args[0]).ok_or(status::INVALID_VALUE)?;
        }
        Op::StreamDestroy => {
            let i = s.streams.iter().position(|&h| h == args[0]);
            s.streams.remove(i.ok_or(status::INVALID_RESOURCE_HANDLE)?);
        }
        Op::StreamQuery | Op::EventQuery => {}
        Op::LaunchHostFunc => {
            if args[0] != 0 && !s.streams.contains(&args[0]) {
                return Err(status::INVALID_RESOURCE_HANDLE);
            }
            s.next_seq += 1;
            let seq = s.next_seq;
            s.host_due.push_back((args[1], seq));
        }
        Op::HostFuncWait | Op::Batch => unreachable!("answered in execute"),
        Op::HostLatency => rets[0] = 0,
        // No records and nothing held: guest-lib never asks (qcuda-smi does).
        Op::VmUsage => rets[0] = 0,
        Op::StreamSetAttribute | Op::CtxResetPersistingL2 => {}
        Op::StreamGetAttribute => {
            let rec = qcuda_proto::LaunchAttr {
                id: args[1] as u32,
                ..Default::default()
            };
            outs[0][..qcuda_proto::LAUNCH_ATTR_SIZE].copy_from_slice(&rec.encode());
        }
        Op::GraphKernelNodeSetAttribute
        | Op::GraphKernelNodeGetAttribute
        | Op::GraphKernelNodeCopyAttributes => {
            let kernel = |s: &FakeState, n: u64| match s.graphs.nodes.get(&n) {
                Some(node) if node.ty == qcuda_proto::graph::NODE_KERNEL => Ok(()),
                _ => Err(status::INVALID_VALUE),
            };
            kernel(s, args[0])?;
            match op {
                Op::GraphKernelNodeSetAttribute => {
                    let a = qcuda_proto::LaunchAttr::decode(ins[0])
                        .map_err(|_| status::INVALID_VALUE)?;
                    let list = s.node_attributes.entry(args[0]).or_default();
                    list.retain(|x| x.id != a.id);
                    list.push(a);
                }
                Op::GraphKernelNodeGetAttribute => {
                    let rec = s
                        .node_attributes
                        .get(&args[0])
                        .and_then(|l| l.iter().find(|a| u64::from(a.id) == args[1]).copied())
                        .unwrap_or(qcuda_proto::LaunchAttr {
                            id: args[1] as u32,
                            ..Default::default()
                        });
                    outs[0][..qcuda_proto::LAUNCH_ATTR_SIZE].copy_from_slice(&rec.encode());
                }
                _ => {
                    kernel(s, args[1])?;
                    let from = s.node_attributes.get(&args[1]).cloned().unwrap_or_default();
                    s.node_attributes.insert(args[0], from);
                }
            }
        }
        qcuda_proto::graph_ops!() => {
            let h = s.handle();
            let streams = s.streams.clone();
            s.graphs.run(op, args, ins, outs, rets, h, &streams)?;
        }
        Op::StreamWaitEvent => {
            s.events
                .get(&args[1])
                .ok_or(status::INVALID_RESOURCE_HANDLE)?;
        }
        Op::EventCreate => {
            let h = s.handle();
            s.events.insert(h, None);
            if args[0] & 0x6 == 0x6 {
                s.ipc_events.push(h);
            }
            rets[0] = h;
        }
        Op::EventDestroy => {
            s.events
                .remove(&args[0])
                .ok_or(status::INVALID_RESOURCE_HANDLE)?;
        }
        Op::EventRecord => {
            s.clock += 1.5;
            let t = s.clock;
            *s.events
                .get_mut(&args[0])
                .ok_or(status::INVALID_RESOURCE_HANDLE)? = Some(t);
        }
        Op::EventElapsedTime => {
            let a = s.events.get(&args[0]).copied().flatten();
            let b = s.events.get(&args[1]).copied().flatten();
            let (Some(a), Some(b)) = (a, b) else {
                return Err(status::INVALID_RESOURCE_HANDLE);
            };
            rets[0] = u64::from((b - a).to_bits());
        }
        Op::ProcessCheckpoint => process_checkpoint(s, args, rets)?,
        Op::GpuTrace => gpu_trace(s, args, outs, rets)?,
        Op::Echo | Op::HostInfo | Op::SessionClose | Op::DriverReset => {
            return Err(status::NOT_SUPPORTED)
        }
    }
    Ok(())
}

/// The host's recorder, as vhost-cuda answers it: an arm starts a recording in which one
/// kernel ran, which one read returns (its name first).
fn gpu_trace(
    s: &mut FakeState,
    args: &[u64; 8],
    outs: &mut [&mut [u8]],
    rets: &mut [u64; 7],
) -> Result<(), u32> {
    use qcuda_proto::trace::{
        TraceRecord, TraceSpan, TRACE_ARM, TRACE_DISARM, TRACE_READ, TRACE_STATE_ARMED,
        TRACE_STATE_CUPTI, TRACE_STATUS,
    };
    let mut written = 0u64;
    match args[0] {
        TRACE_STATUS => {}
        TRACE_ARM => {
            s.trace_arms += 1;
            s.trace_armed = true;
            s.trace_unread = true;
        }
        TRACE_DISARM => s.trace_armed = false,
        TRACE_READ if s.trace_unread => {
            let out = outs.first_mut().ok_or(status::INVALID_VALUE)?;
            let mut bytes = Vec::new();
            TraceRecord::name_records(1, b"_Z6kernelv", |r| bytes.extend(r.encode()));
            let kernel = TraceRecord::Kernel {
                span: TraceSpan {
                    device: 0,
                    start: 1_000,
                    end: 9_000,
                    stream: 1,
                    correlation: 0,
                },
                name: 1,
                grid: [1, 1, 1],
                block: [32, 1, 1],
                shared_mem: 0,
            };
            bytes.extend(kernel.encode());
            if out.len() < bytes.len() {
                return Err(status::INVALID_VALUE);
            }
            out[..bytes.len()].copy_from_slice(&bytes);
            written = (bytes.len() / 64) as u64;
            s.trace_unread = false;
        }
        TRACE_READ => {}
        _ => return Err(status::INVALID_VALUE),
    }
    let state = TRACE_STATE_CUPTI | if s.trace_armed { TRACE_STATE_ARMED } else { 0 };
    *rets = [state, written, 0, 0, 2_000_000, 3_000_000, 10_000];
    Ok(())
}

/// CUDA's process checkpoint of another process, as qcuda.ko and vhost-cuda answer it.
fn process_checkpoint(s: &mut FakeState, args: &[u64; 8], rets: &mut [u64; 7]) -> Result<(), u32> {
    use qcuda_proto::{
        PROCESS_CHECKPOINT as CKPT, PROCESS_GET_RESTORE_THREAD, PROCESS_GET_STATE,
        PROCESS_LOCK as LOCK, PROCESS_RESTORE as RESTORE, PROCESS_STATE_CHECKPOINTED as C,
        PROCESS_STATE_LOCKED as L, PROCESS_STATE_RUNNING as R, PROCESS_UNLOCK as UNLOCK,
    };
    s.last_process_call = Some([args[0], args[1], args[2]]);
    let pid = i32::try_from(args[1]).map_err(|_| status::INVALID_VALUE)?;
    let state = s
        .processes
        .get_mut(&pid)
        .ok_or(status::INITIALIZATION_ERROR)?;
    match (args[0], *state) {
        (PROCESS_GET_STATE, st) => rets[0] = st,
        (PROCESS_GET_RESTORE_THREAD, _) => rets[0] = args[1],
        (LOCK, R) if s.busy_processes.contains(&pid) => return Err(status::NOT_READY),
        (LOCK, R) | (RESTORE, C) => *state = L,
        (CKPT, L) => *state = C,
        (UNLOCK, L) => *state = R,
        (LOCK | CKPT | RESTORE | UNLOCK, _) => return Err(status::ILLEGAL_STATE),
        _ => return Err(status::INVALID_VALUE),
    }
    Ok(())
}

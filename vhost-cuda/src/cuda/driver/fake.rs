//! A fake CUDA driver for unit tests: contexts, device memory as host vectors, a few kernels
//! that really compute, sticky faults, streams and events. It checks what a real driver
//! checks (current context, handles, device ranges), so the session logic above it is tested
//! end to end without a GPU.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    ffi::{c_void, CStr},
    sync::{Mutex, MutexGuard},
    thread::{self, ThreadId},
};

use super::{
    Context, CuError, CuResult, DriverApi, Event, Function, HostFn, LinkOutput, MemPool,
    MemsetWidth, Module, Raw, Stream,
};
use crate::cuda::launch::{attr, DriverLaunchAttr, LaunchConfig};

#[path = "fake_activity.rs"]
mod activity;
#[path = "fake_arrays.rs"]
mod arrays;
#[path = "fake_vmm.rs"]
mod vmm;

pub(crate) const TOTAL_MEM: u64 = 1 << 30;
const INVALID_VALUE: CuError = CuError(1);
const INVALID_CONTEXT: CuError = CuError(201);
const INVALID_HANDLE: CuError = CuError(400);
const NOT_FOUND: CuError = CuError(500);
const NOT_READY: CuError = CuError(600);
const ILLEGAL_ADDRESS: CuError = CuError(700);
const OUT_OF_MEMORY: CuError = CuError(2);

/// The kernels every fake module has: name and (offset, size) of each parameter.
pub(crate) const KERNELS: &[(&str, &[(usize, usize)])] = &[
    // void vadd(const float* a, const float* b, float* c, int n): c[i] = a[i] + b[i]
    ("vadd", &[(0, 8), (8, 8), (16, 8), (24, 4)]),
    // void fault(int* p): writes through a bad pointer -> sticky ILLEGAL_ADDRESS at the next
    // synchronisation
    ("fault", &[(0, 8)]),
    // void spin(): never finishes (its stream stays busy)
    ("spin", &[]),
    // void lazy(char c): its module is loaded lazily, so param info needs cuFuncLoad first
    ("lazy", &[(0, 1)]),
    // void qcuda_precopy_hash(const u64* ranges, unsigned count, u64* out): adds the chunk
    // hash of each (ptr, len) of `ranges` to its [u64; 2] of `out`, as the pre-copy kernel
    // does (cuda/precopy.rs), computed by the CPU reference
    ("qcuda_precopy_hash", &[(0, 8), (8, 4), (16, 8)]),
];

/// The global every fake module has.
pub(crate) const GLOBAL: (&str, u64) = ("g", 64);

#[derive(Debug, Default)]
pub(super) struct Ctx {
    dev: i32,
    sticky: Option<CuError>,
    /// Raised at the next synchronising call.
    pending_fault: Option<CuError>,
    mem: BTreeMap<u64, Vec<u8>>,
    next_addr: u64,
    host: HashMap<Raw, Vec<u8>>,
    modules: HashSet<Raw>,
    /// Module -> address of its global.
    globals: HashMap<Raw, u64>,
    streams: HashSet<Raw>,
    /// Streams (0: the NULL stream) running an endless kernel.
    busy: HashSet<Raw>,
    /// Event -> recorded.
    events: HashMap<Raw, bool>,
    loaded: HashSet<Raw>,
    /// cuCtxSetLimit values.
    limits: HashMap<u32, usize>,
    /// MAX_DYNAMIC_SHARED_SIZE_BYTES set per function.
    func_smem: HashMap<Raw, i32>,
    /// CUDA arrays: descriptor and bytes (fake_arrays.rs).
    arrays: HashMap<Raw, (super::array::ArrayDesc, Vec<u8>)>,
    /// Mipmapped arrays: their level arrays.
    mipmapped: HashMap<Raw, Vec<super::array::Array>>,
    /// Texture and surface objects alive: value -> what it views.
    objects: BTreeMap<u64, super::array::Resource>,
    /// Stream priorities (clamped to `PRIORITY_RANGE`).
    priorities: HashMap<Raw, i32>,
    /// cuCtxSetCacheConfig.
    cache_config: u32,
    /// Stream attributes set: (stream, id) -> value.
    stream_attrs: HashMap<(Raw, u32), [u8; 64]>,
    /// Graphs, their nodes, executable graphs and captures (fake_graphs.rs).
    pub(super) graphs: super::fake_graphs::FakeGraphs,
}

/// Cluster dimensions must divide the grid, as the driver checks.
fn check_cluster(cfg: &LaunchConfig, attrs: &[DriverLaunchAttr]) -> CuResult<()> {
    for a in attrs.iter().filter(|a| a.id == attr::CLUSTER_DIMENSION) {
        for i in 0..3 {
            let d = a.scalar(i);
            if d == 0 || !cfg.grid[i].is_multiple_of(d) {
                return Err(INVALID_VALUE);
            }
        }
    }
    Ok(())
}

/// The stream priority range the fake reports: (least, greatest), as an H100's.
pub(crate) const PRIORITY_RANGE: (i32, i32) = (0, -5);

/// A memory pool of the fake: usage figures as the driver keeps them.
#[derive(Debug, Default, Clone)]
pub(crate) struct FakePool {
    dev: i32,
    default: bool,
    /// Attributes 1..=4 (index = id - 1).
    settings: [u64; 4],
    used: u64,
    used_high: u64,
    reserved: u64,
    reserved_high: u64,
    /// Access granted to other devices.
    access: HashMap<i32, u32>,
    /// Created shareable as POSIX descriptors.
    shareable: bool,
    /// The pool it was imported from (another "process"'s): its pointers import here.
    origin: Option<Raw>,
}

#[derive(Debug, Default)]
struct State {
    next: Raw,
    /// The current context of each thread.
    current: HashMap<ThreadId, Raw>,
    contexts: HashMap<Raw, Ctx>,
    destroyed: usize,
    calls: HashMap<&'static str, usize>,
    /// Errors to return from the next call of a method.
    fail: HashMap<&'static str, CuError>,
    /// Registered host memory (process-wide, as `CU_MEMHOSTREGISTER_PORTABLE` makes it).
    registered: BTreeMap<u64, u64>,
    /// Memory pools (process-wide, as the driver's are).
    pools: HashMap<Raw, FakePool>,
    /// Device -> its default pool, once asked for.
    default_pools: HashMap<i32, Raw>,
    /// Device -> its current pool, when set.
    current_pools: HashMap<i32, Raw>,
    /// Stream-ordered allocations: pointer -> (pool, size).
    pool_allocs: HashMap<u64, (Raw, u64)>,
    /// (id, first value) of each attribute of the last cuLaunchKernelEx.
    last_launch_attrs: Vec<(u32, u32)>,
    /// Peer access enabled: (context, peer context).
    peers: HashSet<(Raw, Raw)>,
    /// Physical allocations, reservations and mappings (fake_vmm.rs).
    vmm: vmm::FakeVmm,
}

impl State {
    /// The calling thread's current context (0: none).
    fn cur(&self) -> Raw {
        self.current
            .get(&thread::current().id())
            .copied()
            .unwrap_or(0)
    }
}

/// The fake driver; `gpus` devices with CUdevice values 100, 101, ...
#[derive(Debug)]
pub(crate) struct FakeDriver {
    gpus: i32,
    state: Mutex<State>,
    /// Texture/surface object values (fake_arrays.rs).
    object_values: Mutex<arrays::ObjectValues>,
    /// What it ran, for the timeline recorder (fake_activity.rs); `None`: it reports nothing,
    /// so the recorder times with events.
    activity: Option<activity::SharedLog>,
    /// Most bytes of host memory the fake's own buffers (device memory, physical VMM
    /// allocations, arrays, pinned host memory) may hold together: beyond it an allocation
    /// answers out of memory, as a machine would. Unbounded unless set (the fuzz targets bound
    /// it, so that inputs allocating on every device at once stay inside the fuzzer's limit).
    ram_budget: u64,
}

impl FakeDriver {
    pub(crate) fn new(gpus: i32) -> Self {
        Self {
            gpus,
            state: Mutex::new(State {
                next: 0x1000,
                ..State::default()
            }),
            object_values: Mutex::default(),
            activity: Some(activity::SharedLog::default()),
            ram_budget: u64::MAX,
        }
    }

    /// The same driver with its buffers bounded to `bytes` of host memory in all.
    pub(crate) fn with_ram_budget(mut self, bytes: u64) -> Self {
        self.ram_budget = bytes;
        self
    }

    /// Bytes the fake's buffers hold in host memory.
    fn ram_used(st: &State) -> u64 {
        let contexts: u64 = st
            .contexts
            .values()
            .map(|c| {
                let mem: u64 = c.mem.values().map(|v| v.len() as u64).sum();
                let host: u64 = c.host.values().map(|v| v.len() as u64).sum();
                let arrays: u64 = c.arrays.values().map(|(_, v)| v.len() as u64).sum();
                mem + host + arrays
            })
            .sum();
        contexts + st.vmm.phys_bytes()
    }

    /// Out of memory when `size` more bytes would pass the host-memory budget.
    fn check_ram(&self, st: &State, size: usize) -> CuResult<()> {
        if Self::ram_used(st).saturating_add(size as u64) > self.ram_budget {
            return Err(OUT_OF_MEMORY);
        }
        Ok(())
    }

    /// A driver without a record of its work (the recorder then times ops with events).
    pub(crate) fn without_activity(mut self) -> Self {
        self.activity = None;
        self
    }

    /// How often a recorder enabled this driver's record of its work.
    pub(crate) fn activity_enables(&self) -> usize {
        self.activity
            .as_ref()
            .map_or(0, |a| activity::lock(a).enables)
    }

    /// Notes work for the recorder, if it records.
    fn note(&self, device: i32, stream: Stream, work: activity::Work) {
        if let Some(a) = &self.activity {
            activity::note(a, device, stream.raw() as u64 + 1, work);
        }
    }

    /// The device of the current context (the fake's `CUdevice`).
    fn current_device(&self) -> i32 {
        let st = self.st();
        let cur = st.cur();
        st.contexts.get(&cur).map_or(100, |c| c.dev)
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Contexts alive.
    pub(crate) fn live_contexts(&self) -> usize {
        self.st().contexts.len()
    }

    /// Contexts destroyed so far.
    pub(crate) fn destroyed_contexts(&self) -> usize {
        self.st().destroyed
    }

    /// How often method `name` was called.
    pub(crate) fn calls(&self, name: &'static str) -> usize {
        self.st().calls.get(name).copied().unwrap_or(0)
    }

    /// Host ranges registered now.
    pub(crate) fn registered(&self) -> usize {
        self.st().registered.len()
    }

    /// (id, first value) of each attribute of the last cuLaunchKernelEx.
    pub(crate) fn last_launch_attrs(&self) -> Vec<(u32, u32)> {
        self.st().last_launch_attrs.clone()
    }

    /// Memory pools alive (default pools included).
    pub(crate) fn live_pools(&self) -> usize {
        self.st().pools.len()
    }

    /// Stream-ordered allocations alive.
    pub(crate) fn pool_allocations(&self) -> usize {
        self.st().pool_allocs.len()
    }

    /// The default pool of `dev`, made on first use.
    fn default_pool_of(st: &mut State, dev: i32) -> Raw {
        if let Some(&p) = st.default_pools.get(&dev) {
            return p;
        }
        let p = fresh(&mut st.next);
        st.pools.insert(
            p,
            FakePool {
                dev,
                default: true,
                settings: [1, 1, 1, 0],
                ..FakePool::default()
            },
        );
        st.default_pools.insert(dev, p);
        p
    }

    /// Makes the next call of `name` fail with `err`.
    pub(crate) fn fail_next(&self, name: &'static str, err: u32) {
        self.st().fail.insert(name, CuError(err));
    }

    /// Reads device memory directly (for assertions).
    pub(crate) fn peek(&self, ptr: u64, len: usize) -> Option<Vec<u8>> {
        let st = self.st();
        st.contexts.values().find_map(|c| {
            let (base, v) = c.mem.range(..=ptr).next_back()?;
            let off = usize::try_from(ptr - base).ok()?;
            v.get(off..off.checked_add(len)?).map(<[u8]>::to_vec)
        })
    }

    /// Writes device memory directly, as a guest's kernel would behind the session's back (for
    /// tests). Returns whether the range was device memory of some context.
    pub(crate) fn poke(&self, ptr: u64, bytes: &[u8]) -> bool {
        let mut st = self.st();
        st.contexts.values_mut().any(|c| {
            slice_mut(c, ptr, bytes.len())
                .map(|s| s.copy_from_slice(bytes))
                .is_ok()
        })
    }

    /// Bytes allocated on device `dev` over all contexts.
    fn used(st: &State, dev: i32) -> u64 {
        st.contexts
            .values()
            .filter(|c| c.dev == dev)
            .map(|c| c.mem.values().map(|v| v.len() as u64).sum::<u64>())
            .sum()
    }

    /// Enters a call: counts it, applies injected failures, and returns the state.
    fn enter(&self, name: &'static str) -> CuResult<MutexGuard<'_, State>> {
        let mut st = self.st();
        *st.calls.entry(name).or_default() += 1;
        if let Some(e) = st.fail.remove(name) {
            return Err(e);
        }
        Ok(st)
    }

    /// Like the driver: a host range of a copy is either pageable or inside one registration;
    /// one that is partly registered, or spans two registrations, is refused.
    fn check_host_range(&self, ptr: u64, len: usize) -> CuResult<()> {
        let st = self.st();
        let end = ptr.saturating_add(len as u64);
        let touches = st.registered.iter().any(|(&b, &l)| b < end && ptr < b + l);
        if touches && host_slice(&st.registered, ptr, len).is_none() {
            return Err(INVALID_VALUE);
        }
        Ok(())
    }

    /// Runs `f` on the current context, which must exist and not be corrupted.
    /// As `with_ctx`, with the other contexts beside the current one (unified addressing).
    pub(super) fn with_ctx_uva<T>(
        &self,
        name: &'static str,
        f: impl FnOnce(&mut Ctx, &mut HashMap<Raw, Ctx>) -> CuResult<T>,
    ) -> CuResult<T> {
        let mut st = self.enter(name)?;
        let st = &mut *st;
        let cur = st.cur();
        let mut ctx = st.contexts.remove(&cur).ok_or(INVALID_CONTEXT)?;
        let result = match ctx.sticky {
            Some(e) => Err(e),
            None => f(&mut ctx, &mut st.contexts),
        };
        st.contexts.insert(cur, ctx);
        result
    }

    pub(super) fn with_ctx<T>(
        &self,
        name: &'static str,
        f: impl FnOnce(&mut Ctx, &mut Raw) -> CuResult<T>,
    ) -> CuResult<T> {
        let mut st = self.enter(name)?;
        let st = &mut *st;
        let cur = st.cur();
        let ctx = st.contexts.get_mut(&cur).ok_or(INVALID_CONTEXT)?;
        if let Some(e) = ctx.sticky {
            return Err(e);
        }
        f(ctx, &mut st.next)
    }

    /// A synchronising call: raises a pending fault.
    fn sync(&self, name: &'static str, stream: Option<Raw>) -> CuResult<()> {
        self.with_ctx(name, |c, _| {
            if let Some(s) = stream {
                if s != 0 && !c.streams.contains(&s) {
                    return Err(INVALID_HANDLE);
                }
                c.graphs.refuse_sync(s)?;
            }
            if let Some(e) = c.pending_fault.take() {
                c.sticky = Some(e);
                return Err(e);
            }
            Ok(())
        })
    }
}

/// Whether `ptr..ptr + len` lies in one allocation of `c`.
fn holds(c: &Ctx, ptr: u64, len: usize) -> bool {
    c.mem.range(..=ptr).next_back().is_some_and(|(base, v)| {
        usize::try_from(ptr - base)
            .ok()
            .and_then(|off| off.checked_add(len))
            .is_some_and(|end| end <= v.len())
    })
}

/// A device range by unified addressing: in the current context `c` or in any other, as
/// NVIDIA's driver reaches every context's memory from any of them.
pub(super) fn uva_slice_mut<'a>(
    c: &'a mut Ctx,
    others: &'a mut HashMap<Raw, Ctx>,
    ptr: u64,
    len: usize,
) -> CuResult<&'a mut [u8]> {
    if holds(c, ptr, len) {
        return slice_mut(c, ptr, len);
    }
    let other = others
        .values_mut()
        .find(|o| holds(o, ptr, len))
        .ok_or(INVALID_VALUE)?;
    slice_mut(other, ptr, len)
}

fn slice_mut(c: &mut Ctx, ptr: u64, len: usize) -> CuResult<&mut [u8]> {
    let (base, v) = c.mem.range_mut(..=ptr).next_back().ok_or(INVALID_VALUE)?;
    let off = usize::try_from(ptr - base).map_err(|_| INVALID_VALUE)?;
    let end = off.checked_add(len).ok_or(INVALID_VALUE)?;
    v.get_mut(off..end).ok_or(INVALID_VALUE)
}

/// The host pointer of a registered range holding `ptr..ptr + len`.
fn host_slice(registered: &BTreeMap<u64, u64>, ptr: u64, len: usize) -> Option<*mut u8> {
    let (&base, &l) = registered.range(..=ptr).next_back()?;
    (ptr.checked_add(len as u64)? <= base + l).then_some(ptr as *mut u8)
}

pub(super) fn check_stream(c: &Ctx, s: Raw) -> CuResult<()> {
    if s == 0 || c.streams.contains(&s) {
        Ok(())
    } else {
        Err(INVALID_HANDLE)
    }
}

fn fresh(next: &mut Raw) -> Raw {
    *next += 0x10;
    *next
}

/// The pre-copy kernel over `c`'s memory: for each of the `count` (ptr, len) pairs at
/// `ranges`, the CPU reference hash of its bytes added (mod 2^64) to the pair of u64 at `out`
/// (which the caller zeroed), as the kernel's atomics do. An address outside `c`'s memory is
/// the illegal address a real kernel would make.
fn precopy_hash(c: &mut Ctx, ranges: u64, count: u32, out: u64) -> CuResult<()> {
    let n = usize::try_from(count).map_err(|_| INVALID_VALUE)?;
    let table = slice_mut(c, ranges, n.checked_mul(16).ok_or(INVALID_VALUE)?)?.to_vec();
    let word = |b: &[u8], i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8 * i..8 * i + 8]);
        u64::from_le_bytes(w)
    };
    let mut sums = Vec::with_capacity(n);
    for r in 0..n {
        let (ptr, len) = (word(&table, 2 * r), word(&table, 2 * r + 1));
        let len = usize::try_from(len).map_err(|_| INVALID_VALUE)?;
        sums.push(crate::cuda::precopy::hash(slice_mut(c, ptr, len)?));
    }
    let o = slice_mut(c, out, n.checked_mul(16).ok_or(INVALID_VALUE)?)?;
    for (r, h) in sums.into_iter().enumerate() {
        for (lane, v) in h.into_iter().enumerate() {
            let at = 16 * r + 8 * lane;
            let mut w = [0u8; 8];
            w.copy_from_slice(&o[at..at + 8]);
            let sum = u64::from_le_bytes(w).wrapping_add(v);
            o[at..at + 8].copy_from_slice(&sum.to_le_bytes());
        }
    }
    Ok(())
}

/// Function handles encode (module, kernel index): module + 1 + index.
pub(super) fn kernel_of(c: &Ctx, func: Raw) -> CuResult<(Raw, usize)> {
    c.modules
        .iter()
        .find_map(|&m| {
            let i = func.checked_sub(m + 1)?;
            (i < KERNELS.len()).then_some((m, i))
        })
        .ok_or(INVALID_HANDLE)
}

impl DriverApi for FakeDriver {
    fn device_count(&self) -> CuResult<i32> {
        let _st = self.enter("device_count")?;
        Ok(self.gpus)
    }

    fn device_get(&self, ordinal: i32) -> CuResult<i32> {
        let _st = self.enter("device_get")?;
        if (0..self.gpus).contains(&ordinal) {
            Ok(100 + ordinal)
        } else {
            Err(CuError(101))
        }
    }

    fn device_name(&self, dev: i32) -> CuResult<Vec<u8>> {
        let _st = self.enter("device_name")?;
        Ok(format!("Fake GPU {}", dev - 100).into_bytes())
    }

    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "the fake's UUID is the low byte of its device handle (100 + ordinal), repeated"
    )]
    fn device_uuid(&self, dev: i32) -> CuResult<[u8; 16]> {
        let _st = self.enter("device_uuid")?;
        Ok([dev as u8; 16])
    }

    fn device_total_mem(&self, _: i32) -> CuResult<u64> {
        let _st = self.enter("device_total_mem")?;
        Ok(TOTAL_MEM)
    }

    fn device_attribute(&self, dev: i32, attr: i32) -> CuResult<i32> {
        let _st = self.enter("device_attribute")?;
        Ok(match attr {
            1 => 1024,
            2 | 3 => 1024,
            4 => 64,
            5 => i32::MAX,
            6 | 7 => 65535,
            16 => 132,
            33 => 0x1b + dev - 100,
            34 | 50 => 0,
            75 => 9,
            76 => 0,
            8..=147 => attr * 10,
            _ => return Err(INVALID_VALUE),
        })
    }

    fn ctx_create(&self, dev: i32) -> CuResult<Context> {
        let mut st = self.enter("ctx_create")?;
        let id = fresh(&mut st.next);
        let n = st.contexts.len() as u64 + st.destroyed as u64;
        st.contexts.insert(
            id,
            Ctx {
                dev,
                next_addr: 0x7f00_0000_0000 + (n << 32),
                ..Ctx::default()
            },
        );
        Ok(Context::from_raw(id))
    }

    fn ctx_destroy(&self, ctx: Context) -> CuResult<()> {
        let mut st = self.enter("ctx_destroy")?;
        let gone = st.contexts.remove(&ctx.raw()).ok_or(INVALID_CONTEXT)?;
        st.destroyed += 1;
        st.current.retain(|_, c| *c != ctx.raw());
        drop(st);
        // Its objects go with it: their values are free again.
        self.free_object_values(gone.objects.keys().copied());
        Ok(())
    }

    fn ctx_set_current(&self, ctx: Context) -> CuResult<()> {
        let mut st = self.enter("ctx_set_current")?;
        if !st.contexts.contains_key(&ctx.raw()) {
            return Err(INVALID_CONTEXT);
        }
        st.current.insert(thread::current().id(), ctx.raw());
        Ok(())
    }

    fn ctx_synchronize(&self) -> CuResult<()> {
        self.sync("ctx_synchronize", None)
    }

    fn ctx_get_limit(&self, limit: u32) -> CuResult<usize> {
        self.with_ctx("ctx_get_limit", |c, _| {
            if limit > 6 {
                return Err(INVALID_VALUE);
            }
            // The driver's defaults for the stack and the printf FIFO; 0 for the others.
            let default = [1024, 1 << 20, 8 << 20, 2, 2048, 32, 0][limit as usize];
            Ok(c.limits.get(&limit).copied().unwrap_or(default))
        })
    }

    fn ctx_set_limit(&self, limit: u32, value: usize) -> CuResult<()> {
        self.with_ctx("ctx_set_limit", |c, _| {
            if limit > 6 {
                return Err(INVALID_VALUE);
            }
            c.limits.insert(limit, value);
            Ok(())
        })
    }

    fn mem_get_info(&self) -> CuResult<(u64, u64)> {
        let st = self.enter("mem_get_info")?;
        let c = st.contexts.get(&st.cur()).ok_or(INVALID_CONTEXT)?;
        // Mapped VMM views count in `used` beside their physical allocation: never below 0.
        Ok((TOTAL_MEM.saturating_sub(Self::used(&st, c.dev)), TOTAL_MEM))
    }

    fn mem_alloc(&self, size: usize) -> CuResult<u64> {
        let mut st = self.enter("mem_alloc")?;
        let cur = st.cur();
        let dev = st.contexts.get(&cur).ok_or(INVALID_CONTEXT)?.dev;
        // As cuMemAlloc: any size, however large, is an answer (found by fuzz/chain_dispatch).
        if Self::used(&st, dev).saturating_add(size as u64) > TOTAL_MEM {
            return Err(OUT_OF_MEMORY);
        }
        self.check_ram(&st, size)?;
        let c = st.contexts.get_mut(&cur).ok_or(INVALID_CONTEXT)?;
        if let Some(e) = c.sticky {
            return Err(e);
        }
        let p = c.next_addr;
        // Leave a gap so adjacent allocations are not contiguous.
        c.next_addr += (size as u64).div_ceil(256) * 256 + 256;
        c.mem.insert(p, vec![0; size]);
        Ok(p)
    }

    fn mem_free(&self, ptr: u64) -> CuResult<()> {
        self.with_ctx("mem_free", |c, _| {
            c.mem.remove(&ptr).map(|_| ()).ok_or(INVALID_VALUE)
        })?;
        // cuMemFree also frees stream-ordered allocations (after synchronising).
        let mut st = self.st();
        if let Some((pool, size)) = st.pool_allocs.remove(&ptr) {
            if let Some(p) = st.pools.get_mut(&pool) {
                p.used -= size;
            }
        }
        Ok(())
    }

    fn mem_alloc_host(&self, size: usize) -> CuResult<Raw> {
        self.check_ram(&self.st(), size)?;
        self.with_ctx("mem_alloc_host", |c, _| {
            let v = vec![0u8; size];
            let p = v.as_ptr() as Raw;
            c.host.insert(p, v);
            Ok(p)
        })
    }

    unsafe fn memcpy_htod(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: Stream,
    ) -> CuResult<()> {
        self.check_host_range(src as u64, len)?;
        let r = self.with_ctx_uva("memcpy_htod", |c, others| {
            check_stream(c, stream.raw())?;
            let d = uva_slice_mut(c, others, dst, len)?;
            // SAFETY: the caller guarantees `src` is readable for `len` bytes.
            let s = unsafe { std::slice::from_raw_parts(src, len) };
            d.copy_from_slice(s);
            Ok(())
        });
        if r.is_ok() {
            self.note(
                self.current_device(),
                stream,
                activity::Work::Copy {
                    kind: qcuda_proto::trace::copy_kind::HTOD,
                    bytes: len as u64,
                },
            );
        }
        r
    }

    unsafe fn memcpy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Stream,
    ) -> CuResult<()> {
        self.check_host_range(dst as u64, len)?;
        let r = self.with_ctx_uva("memcpy_dtoh", |c, others| {
            check_stream(c, stream.raw())?;
            let s = uva_slice_mut(c, others, src, len)?;
            // SAFETY: the caller guarantees `dst` is writable for `len` bytes and not aliased.
            let d = unsafe { std::slice::from_raw_parts_mut(dst, len) };
            d.copy_from_slice(s);
            Ok(())
        });
        if r.is_ok() {
            self.note(
                self.current_device(),
                stream,
                activity::Work::Copy {
                    kind: qcuda_proto::trace::copy_kind::DTOH,
                    bytes: len as u64,
                },
            );
        }
        r
    }

    fn memcpy_dtod(&self, dst: u64, src: u64, len: usize, stream: Stream) -> CuResult<()> {
        let r = self.with_ctx("memcpy_dtod", |c, _| {
            check_stream(c, stream.raw())?;
            let data = slice_mut(c, src, len)?.to_vec();
            slice_mut(c, dst, len)?.copy_from_slice(&data);
            Ok(())
        });
        if r.is_ok() {
            self.note(
                self.current_device(),
                stream,
                activity::Work::Copy {
                    kind: activity::DEVICE_COPY,
                    bytes: len as u64,
                },
            );
        }
        r
    }

    fn memset(
        &self,
        dst: u64,
        value: u32,
        width: MemsetWidth,
        count: usize,
        stream: Stream,
    ) -> CuResult<()> {
        let registered = self.st().registered.clone();
        let w = usize::try_from(width.bytes()).unwrap_or(1);
        let len = count.checked_mul(w).ok_or(CuError::INVALID_VALUE)?;
        let pattern = value.to_le_bytes();
        let fill = |s: &mut [u8]| {
            for chunk in s.chunks_exact_mut(w) {
                chunk.copy_from_slice(&pattern[..w]);
            }
        };
        let r = self.with_ctx_uva("memset", |c, others| {
            check_stream(c, stream.raw())?;
            match host_slice(&registered, dst, len) {
                // SAFETY: registered ranges stay mapped while registered (method contract of
                // `mem_host_register`).
                Some(p) => fill(unsafe { std::slice::from_raw_parts_mut(p, len) }),
                None => fill(uva_slice_mut(c, others, dst, len)?),
            }
            Ok(())
        });
        if r.is_ok() {
            self.note(
                self.current_device(),
                stream,
                activity::Work::Memset { bytes: len as u64 },
            );
        }
        r
    }

    fn memcpy(&self, dst: u64, src: u64, len: usize, stream: Stream) -> CuResult<()> {
        let registered = self.st().registered.clone();
        let r = self.with_ctx_uva("memcpy", |c, others| {
            check_stream(c, stream.raw())?;
            let data = match host_slice(&registered, src, len) {
                Some(p) => {
                    // SAFETY: registered ranges stay mapped while registered (method contract
                    // of `mem_host_register`).
                    unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
                }
                None => uva_slice_mut(c, others, src, len)?.to_vec(),
            };
            match host_slice(&registered, dst, len) {
                // SAFETY: as above; `data` is a copy, so the ranges may overlap.
                Some(p) => unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, len) },
                None => uva_slice_mut(c, others, dst, len)?.copy_from_slice(&data),
            }
            Ok(())
        });
        if r.is_ok() {
            self.note(
                self.current_device(),
                stream,
                activity::Work::Copy {
                    kind: activity::DEVICE_COPY,
                    bytes: len as u64,
                },
            );
        }
        r
    }

    unsafe fn mem_host_register(&self, ptr: u64, len: usize, _read_only: bool) -> CuResult<()> {
        let mut st = self.enter("mem_host_register")?;
        let end = ptr.checked_add(len as u64).ok_or(INVALID_VALUE)?;
        if len == 0 || st.registered.iter().any(|(&b, &l)| b < end && ptr < b + l) {
            return Err(INVALID_VALUE);
        }
        st.registered.insert(ptr, len as u64);
        Ok(())
    }

    fn mem_host_unregister(&self, ptr: u64) -> CuResult<()> {
        let mut st = self.enter("mem_host_unregister")?;
        st.registered.remove(&ptr).map(|_| ()).ok_or(INVALID_VALUE)
    }

    fn mem_host_device_pointer(&self, ptr: u64) -> CuResult<u64> {
        let st = self.enter("mem_host_device_pointer")?;
        // Unified addressing: the device address is the host address.
        host_slice(&st.registered, ptr, 1)
            .map(|_| ptr)
            .ok_or(INVALID_VALUE)
    }

    fn module_load(&self, image: &[u8]) -> CuResult<Module> {
        self.with_ctx("module_load", |c, next| {
            if image.last() != Some(&0) {
                return Err(INVALID_VALUE);
            }
            // Room for the function handles (module + 1 + index) before the next id.
            let m = fresh(next);
            *next += KERNELS.len() + 1;
            c.modules.insert(m);
            // The module's global.
            let g = c.next_addr;
            c.next_addr += 0x1000;
            c.mem.insert(
                g,
                vec![0; usize::try_from(GLOBAL.1).expect("a 64-byte global")],
            );
            c.globals.insert(m, g);
            Ok(Module::from_raw(m))
        })
    }

    fn module_unload(&self, module: Module) -> CuResult<()> {
        self.with_ctx("module_unload", |c, _| {
            if !c.modules.remove(&module.raw()) {
                return Err(INVALID_HANDLE);
            }
            if let Some(g) = c.globals.remove(&module.raw()) {
                c.mem.remove(&g);
            }
            Ok(())
        })
    }

    fn module_function(&self, module: Module, name: &CStr) -> CuResult<Function> {
        self.with_ctx("module_function", |c, _| {
            if !c.modules.contains(&module.raw()) {
                return Err(INVALID_HANDLE);
            }
            let i = KERNELS
                .iter()
                .position(|(n, _)| n.as_bytes() == name.to_bytes())
                .ok_or(NOT_FOUND)?;
            Ok(Function::from_raw(module.raw() + 1 + i))
        })
    }

    fn module_function_names(&self, module: Module) -> CuResult<Vec<std::ffi::CString>> {
        self.with_ctx("module_function_names", |c, _| {
            if !c.modules.contains(&module.raw()) {
                return Err(INVALID_HANDLE);
            }
            Ok(KERNELS
                .iter()
                .map(|(n, _)| std::ffi::CString::new(*n).unwrap_or_default())
                .collect())
        })
    }

    /// The test double's linker: the image is the inputs' bytes one after another, ended by a
    /// NUL (so `module_load` takes it); an input whose bytes start with "bad" fails the link
    /// with `CUDA_ERROR_INVALID_PTX` and an error log naming it.
    fn link(
        &self,
        options: &[(u32, u64)],
        inputs: &[(u32, &CStr, &[u8])],
    ) -> Result<LinkOutput, (CuError, Vec<u8>)> {
        self.with_ctx("link", |_, _| Ok(()))
            .map_err(|e| (e, Vec::new()))?;
        let mut image = Vec::new();
        for (_, name, data) in inputs {
            if data.starts_with(b"bad") {
                let log = format!("error in {}", name.to_string_lossy());
                return Err((
                    CuError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_PTX as u32),
                    log.into_bytes(),
                ));
            }
            image.extend_from_slice(data);
        }
        image.push(0);
        Ok(LinkOutput {
            image,
            info_log: format!("linked {} inputs, {} options", inputs.len(), options.len())
                .into_bytes(),
            error_log: Vec::new(),
        })
    }

    fn module_global(&self, module: Module, name: &CStr) -> CuResult<(u64, u64)> {
        self.with_ctx("module_global", |c, _| {
            if !c.modules.contains(&module.raw()) {
                return Err(INVALID_HANDLE);
            }
            if name.to_bytes() != GLOBAL.0.as_bytes() {
                return Err(NOT_FOUND);
            }
            let g = c.globals.get(&module.raw()).ok_or(INVALID_HANDLE)?;
            Ok((*g, GLOBAL.1))
        })
    }

    fn function_load(&self, func: Function) -> CuResult<()> {
        self.with_ctx("function_load", |c, _| {
            kernel_of(c, func.raw())?;
            c.loaded.insert(func.raw());
            Ok(())
        })
    }

    fn function_param_info(&self, func: Function, index: usize) -> CuResult<(usize, usize)> {
        self.with_ctx("function_param_info", |c, _| {
            let (_, k) = kernel_of(c, func.raw())?;
            let (name, params) = KERNELS[k];
            if name == "lazy" && !c.loaded.contains(&func.raw()) {
                return Err(CuError::FUNCTION_NOT_LOADED);
            }
            params.get(index).copied().ok_or(INVALID_VALUE)
        })
    }

    unsafe fn launch_cooperative(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> CuResult<()> {
        *self.st().calls.entry("launch_cooperative").or_default() += 1;
        // SAFETY: forwarded contract.
        unsafe { self.launch(func, cfg, stream, params) }
    }

    unsafe fn launch_ex(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
        attrs: &[DriverLaunchAttr],
    ) -> CuResult<()> {
        {
            let mut st = self.enter("launch_ex")?;
            check_cluster(cfg, attrs)?;
            st.last_launch_attrs = attrs.iter().map(|a| (a.id, a.scalar(0))).collect();
        }
        // SAFETY: forwarded contract.
        unsafe { self.launch(func, cfg, stream, params) }
    }

    fn occupancy_cluster(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        attrs: &[DriverLaunchAttr],
        active: bool,
    ) -> CuResult<i32> {
        self.with_ctx("occupancy_cluster", |c, _| {
            kernel_of(c, func.raw())?;
            check_cluster(cfg, attrs)?;
            // A GPU of 132 multiprocessors and clusters of at most 8 (16 non-portable).
            let cluster = attrs
                .iter()
                .find(|a| a.id == attr::CLUSTER_DIMENSION)
                .map_or(1, |a| a.scalar(0) * a.scalar(1) * a.scalar(2));
            Ok(if active {
                // A cluster beyond any int is one the driver refuses.
                132 / i32::try_from(cluster.max(1)).map_err(|_| INVALID_VALUE)?
            } else {
                8
            })
        })
    }

    fn occupancy_available_smem(&self, func: Function, blocks: i32, block: i32) -> CuResult<usize> {
        self.with_ctx("occupancy_available_smem", |c, _| {
            kernel_of(c, func.raw())?;
            if blocks < 1 || !(1..=1024).contains(&block) {
                return Err(INVALID_VALUE);
            }
            Ok(228 * 1024 / usize::try_from(blocks).map_err(|_| INVALID_VALUE)?)
        })
    }

    fn device_can_access_peer(&self, dev: i32, peer: i32) -> CuResult<bool> {
        let _st = self.enter("device_can_access_peer")?;
        let gpus = 100..100 + self.gpus;
        if !gpus.contains(&dev) || !gpus.contains(&peer) {
            return Err(INVALID_VALUE);
        }
        Ok(dev != peer)
    }

    fn device_p2p_attribute(&self, attr: u32, src: i32, dst: i32) -> CuResult<i32> {
        let _st = self.enter("device_p2p_attribute")?;
        let gpus = 100..100 + self.gpus;
        if !gpus.contains(&src) || !gpus.contains(&dst) || src == dst {
            return Err(INVALID_VALUE);
        }
        match attr {
            1 => Ok(0),
            2..=4 => Ok(1),
            5 => Ok(0),
            _ => Err(INVALID_VALUE),
        }
    }

    fn ctx_peer_access(&self, peer: Context, enable: bool) -> CuResult<()> {
        let mut st = self.enter("ctx_peer_access")?;
        let cur = st.cur();
        let (a, b) = match (st.contexts.get(&cur), st.contexts.get(&peer.raw())) {
            (Some(a), Some(b)) => (a.dev, b.dev),
            _ => return Err(INVALID_CONTEXT),
        };
        if a == b {
            return Err(INVALID_VALUE);
        }
        let key = (cur, peer.raw());
        match (enable, st.peers.contains(&key)) {
            (true, true) => Err(CuError(704)),
            (false, false) => Err(CuError(705)),
            (true, false) => {
                st.peers.insert(key);
                Ok(())
            }
            (false, true) => {
                st.peers.remove(&key);
                Ok(())
            }
        }
    }

    fn memcpy_peer(
        &self,
        dst: u64,
        dst_ctx: Context,
        src: u64,
        src_ctx: Context,
        len: usize,
        stream: Stream,
    ) -> CuResult<()> {
        let mut st = self.enter("memcpy_peer")?;
        let cur = st.cur();
        check_stream(st.contexts.get(&cur).ok_or(INVALID_CONTEXT)?, stream.raw())?;
        let data = slice_mut(
            st.contexts.get_mut(&src_ctx.raw()).ok_or(INVALID_CONTEXT)?,
            src,
            len,
        )?
        .to_vec();
        slice_mut(
            st.contexts.get_mut(&dst_ctx.raw()).ok_or(INVALID_CONTEXT)?,
            dst,
            len,
        )?
        .copy_from_slice(&data);
        Ok(())
    }

    fn func_set_cache_config(&self, func: Function, config: u32) -> CuResult<()> {
        self.with_ctx("func_set_cache_config", |c, _| {
            kernel_of(c, func.raw())?;
            (config <= 3).then_some(()).ok_or(INVALID_VALUE)
        })
    }

    fn ctx_set_cache_config(&self, config: u32) -> CuResult<()> {
        self.with_ctx("ctx_set_cache_config", |c, _| {
            if config > 3 {
                return Err(INVALID_VALUE);
            }
            c.cache_config = config;
            Ok(())
        })
    }

    fn ctx_get_cache_config(&self) -> CuResult<u32> {
        self.with_ctx("ctx_get_cache_config", |c, _| Ok(c.cache_config))
    }

    fn func_attribute(&self, func: Function, attr: i32) -> CuResult<i32> {
        self.with_ctx("func_attribute", |c, _| {
            kernel_of(c, func.raw())?;
            match attr {
                0 => Ok(1024),
                4 => Ok(16),
                8 => Ok(c.func_smem.get(&func.raw()).copied().unwrap_or(48 * 1024)),
                1..=15 => Ok(0),
                _ => Err(INVALID_VALUE),
            }
        })
    }

    fn func_set_attribute(&self, func: Function, attr: i32, value: i32) -> CuResult<()> {
        self.with_ctx("func_set_attribute", |c, _| {
            kernel_of(c, func.raw())?;
            match attr {
                8 if (0..=227 * 1024).contains(&value) => {
                    c.func_smem.insert(func.raw(), value);
                    Ok(())
                }
                9 => Ok(()),
                _ => Err(INVALID_VALUE),
            }
        })
    }

    fn occupancy_max_active_blocks(
        &self,
        func: Function,
        block: i32,
        _shared: usize,
        _flags: u32,
    ) -> CuResult<i32> {
        self.with_ctx("occupancy_max_active_blocks", |c, _| {
            kernel_of(c, func.raw())?;
            if !(1..=1024).contains(&block) {
                return Err(INVALID_VALUE);
            }
            Ok(2048 / block)
        })
    }

    unsafe fn launch(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> CuResult<()> {
        let mut ran = None;
        let result = self.with_ctx("launch", |c, next| {
            check_stream(c, stream.raw())?;
            let (_, k) = kernel_of(c, func.raw())?;
            if c.graphs.capture(stream.raw(), 0, next) {
                return Ok(());
            }
            let (name, layout) = KERNELS[k];
            if params.len() != layout.len() || cfg.grid.contains(&0) {
                return Err(INVALID_VALUE);
            }
            ran = Some((name, c.dev));
            let read = |i: usize, size: usize| -> Vec<u8> {
                let p = params[i].cast::<u8>();
                // SAFETY: the caller guarantees each pointer is readable for its parameter's
                // size, and `size` is that size (from KERNELS).
                unsafe { std::slice::from_raw_parts(p, size) }.to_vec()
            };
            let u64_at = |i: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&read(i, 8));
                u64::from_le_bytes(w)
            };
            match name {
                "vadd" => {
                    let mut w = [0u8; 4];
                    w.copy_from_slice(&read(3, 4));
                    let n = usize::try_from(i32::from_le_bytes(w)).unwrap_or(0);
                    let (a, b, out) = (u64_at(0), u64_at(1), u64_at(2));
                    let bytes = n * 4;
                    let fault = |c: &mut Ctx| {
                        c.pending_fault = Some(ILLEGAL_ADDRESS);
                        Ok(())
                    };
                    let Ok(x) = slice_mut(c, a, bytes).map(|s| s.to_vec()) else {
                        return fault(c);
                    };
                    let Ok(y) = slice_mut(c, b, bytes).map(|s| s.to_vec()) else {
                        return fault(c);
                    };
                    let Ok(z) = slice_mut(c, out, bytes) else {
                        return fault(c);
                    };
                    for i in 0..n {
                        let f = |v: &[u8]| {
                            f32::from_le_bytes([v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]])
                        };
                        z[4 * i..4 * i + 4].copy_from_slice(&(f(&x) + f(&y)).to_le_bytes());
                    }
                }
                "qcuda_precopy_hash" => {
                    let mut w = [0u8; 4];
                    w.copy_from_slice(&read(1, 4));
                    if precopy_hash(c, u64_at(0), u32::from_le_bytes(w), u64_at(2)).is_err() {
                        c.pending_fault = Some(ILLEGAL_ADDRESS);
                    }
                }
                "fault" => c.pending_fault = Some(ILLEGAL_ADDRESS),
                "spin" => {
                    c.busy.insert(stream.raw());
                }
                _ => {}
            }
            Ok(())
        });
        if let (Ok(()), Some((name, dev))) = (&result, ran) {
            self.note(
                dev,
                stream,
                activity::Work::Kernel {
                    name,
                    grid: cfg.grid,
                    block: cfg.block,
                },
            );
        }
        result
    }

    fn stream_create(&self, flags: u32, priority: i32) -> CuResult<Stream> {
        self.with_ctx("stream_create", |c, next| {
            if flags > 1 {
                return Err(INVALID_VALUE);
            }
            let s = fresh(next);
            c.streams.insert(s);
            let (least, greatest) = PRIORITY_RANGE;
            c.priorities.insert(s, priority.clamp(greatest, least));
            Ok(Stream::from_raw(s))
        })
    }

    fn stream_priority_range(&self) -> CuResult<(i32, i32)> {
        self.with_ctx("stream_priority_range", |_, _| Ok(PRIORITY_RANGE))
    }

    fn stream_priority(&self, stream: Stream) -> CuResult<i32> {
        self.with_ctx("stream_priority", |c, _| {
            check_stream(c, stream.raw())?;
            Ok(c.priorities.get(&stream.raw()).copied().unwrap_or(0))
        })
    }

    fn stream_id(&self, stream: Stream) -> CuResult<u64> {
        self.with_ctx("stream_id", |c, _| {
            check_stream(c, stream.raw())?;
            Ok(stream.raw() as u64 + 1)
        })
    }

    fn mem_pool_default(&self, dev: i32) -> CuResult<MemPool> {
        let mut st = self.enter("mem_pool_default")?;
        if !(100..100 + self.gpus).contains(&dev) {
            return Err(INVALID_VALUE);
        }
        Ok(MemPool::from_raw(Self::default_pool_of(&mut st, dev)))
    }

    fn mem_pool_create(&self, dev: i32, _max_size: usize) -> CuResult<MemPool> {
        let mut st = self.enter("mem_pool_create")?;
        if !(100..100 + self.gpus).contains(&dev) {
            return Err(INVALID_VALUE);
        }
        let p = fresh(&mut st.next);
        st.pools.insert(
            p,
            FakePool {
                dev,
                settings: [1, 1, 1, 0],
                ..FakePool::default()
            },
        );
        Ok(MemPool::from_raw(p))
    }

    fn mem_pool_destroy(&self, pool: MemPool) -> CuResult<()> {
        let mut st = self.enter("mem_pool_destroy")?;
        match st.pools.get(&pool.raw()) {
            Some(p) if !p.default => {}
            _ => return Err(INVALID_VALUE),
        }
        st.pools.remove(&pool.raw());
        st.current_pools.retain(|_, p| *p != pool.raw());
        Ok(())
    }

    fn device_set_mem_pool(&self, dev: i32, pool: MemPool) -> CuResult<()> {
        let mut st = self.enter("device_set_mem_pool")?;
        match st.pools.get(&pool.raw()) {
            Some(p) if p.dev == dev => {}
            _ => return Err(INVALID_VALUE),
        }
        st.current_pools.insert(dev, pool.raw());
        Ok(())
    }

    fn mem_pool_set_attribute(&self, pool: MemPool, attr: u32, value: u64) -> CuResult<()> {
        let mut st = self.enter("mem_pool_set_attribute")?;
        let p = st.pools.get_mut(&pool.raw()).ok_or(INVALID_VALUE)?;
        match attr {
            1..=3 => p.settings[attr as usize - 1] = u64::from(value != 0),
            4 => p.settings[3] = value,
            6 if value == 0 => p.reserved_high = p.reserved,
            8 if value == 0 => p.used_high = p.used,
            _ => return Err(INVALID_VALUE),
        }
        Ok(())
    }

    fn mem_pool_get_attribute(&self, pool: MemPool, attr: u32) -> CuResult<u64> {
        let st = self.enter("mem_pool_get_attribute")?;
        let p = st.pools.get(&pool.raw()).ok_or(INVALID_VALUE)?;
        Ok(match attr {
            1..=4 => p.settings[attr as usize - 1],
            5 => p.reserved,
            6 => p.reserved_high,
            7 => p.used,
            8 => p.used_high,
            _ => return Err(INVALID_VALUE),
        })
    }

    fn mem_pool_trim_to(&self, pool: MemPool, keep: usize) -> CuResult<()> {
        let mut st = self.enter("mem_pool_trim_to")?;
        let p = st.pools.get_mut(&pool.raw()).ok_or(INVALID_VALUE)?;
        p.reserved = p.reserved.min((keep as u64).max(p.used));
        Ok(())
    }

    fn mem_pool_set_access(&self, pool: MemPool, access: &[(i32, u32)]) -> CuResult<()> {
        let mut st = self.enter("mem_pool_set_access")?;
        let gpus = 100..100 + self.gpus;
        let p = st.pools.get_mut(&pool.raw()).ok_or(INVALID_VALUE)?;
        for &(dev, flags) in access {
            // The owning device's access cannot be changed.
            if !gpus.contains(&dev) || (dev == p.dev && flags != 3) {
                return Err(INVALID_VALUE);
            }
            p.access.insert(dev, flags);
        }
        Ok(())
    }

    fn mem_pool_get_access(&self, pool: MemPool, dev: i32) -> CuResult<u32> {
        let st = self.enter("mem_pool_get_access")?;
        let p = st.pools.get(&pool.raw()).ok_or(INVALID_VALUE)?;
        if dev == p.dev {
            return Ok(3);
        }
        Ok(p.access.get(&dev).copied().unwrap_or(0))
    }

    fn mem_alloc_async(&self, size: usize, pool: Option<MemPool>, stream: Stream) -> CuResult<u64> {
        let mut st = self.enter("mem_alloc_async")?;
        let st = &mut *st;
        let cur = st.cur();
        let c = st.contexts.get(&cur).ok_or(INVALID_CONTEXT)?;
        if let Some(e) = c.sticky {
            return Err(e);
        }
        check_stream(c, stream.raw())?;
        let dev = c.dev;
        let pool = match pool {
            Some(p) => p.raw(),
            None => match st.current_pools.get(&dev) {
                Some(&p) => p,
                None => Self::default_pool_of(st, dev),
            },
        };
        if size == 0 || !st.pools.contains_key(&pool) {
            return Err(INVALID_VALUE);
        }
        if Self::used(st, dev) + size as u64 > TOTAL_MEM {
            return Err(OUT_OF_MEMORY);
        }
        self.check_ram(st, size)?;
        let c = st.contexts.get_mut(&cur).ok_or(INVALID_CONTEXT)?;
        let ptr = c.next_addr;
        c.next_addr += (size as u64).div_ceil(256) * 256 + 256;
        c.mem.insert(ptr, vec![0; size]);
        let p = st.pools.get_mut(&pool).ok_or(INVALID_VALUE)?;
        p.used += size as u64;
        p.used_high = p.used_high.max(p.used);
        p.reserved = p.reserved.max(p.used);
        p.reserved_high = p.reserved_high.max(p.reserved);
        st.pool_allocs.insert(ptr, (pool, size as u64));
        Ok(ptr)
    }

    fn mem_free_async(&self, ptr: u64, stream: Stream) -> CuResult<()> {
        let mut st = self.enter("mem_free_async")?;
        let st = &mut *st;
        let cur = st.cur();
        let c = st.contexts.get_mut(&cur).ok_or(INVALID_CONTEXT)?;
        check_stream(c, stream.raw())?;
        let (pool, size) = st.pool_allocs.remove(&ptr).ok_or(INVALID_VALUE)?;
        for c in st.contexts.values_mut() {
            c.mem.remove(&ptr);
        }
        if let Some(p) = st.pools.get_mut(&pool) {
            p.used -= size;
        }
        Ok(())
    }

    fn stream_destroy(&self, stream: Stream) -> CuResult<()> {
        self.with_ctx("stream_destroy", |c, _| {
            c.streams
                .remove(&stream.raw())
                .then_some(())
                .ok_or(INVALID_HANDLE)
        })
    }

    fn stream_synchronize(&self, stream: Stream) -> CuResult<()> {
        self.sync("stream_synchronize", Some(stream.raw()))
    }

    fn stream_query(&self, stream: Stream) -> CuResult<()> {
        self.with_ctx("stream_query", |c, _| {
            check_stream(c, stream.raw())?;
            c.graphs.refuse_sync(stream.raw())?;
            if c.busy.contains(&stream.raw()) {
                return Err(NOT_READY);
            }
            Ok(())
        })
    }

    fn stream_wait_event(&self, stream: Stream, event: Event, _: u32) -> CuResult<()> {
        // The event may belong to another context: that is how work is ordered across them.
        self.with_ctx_uva("stream_wait_event", |c, others| {
            check_stream(c, stream.raw())?;
            (c.events.contains_key(&event.raw())
                || others.values().any(|o| o.events.contains_key(&event.raw())))
            .then_some(())
            .ok_or(INVALID_HANDLE)
        })
    }

    fn event_create(&self, flags: u32) -> CuResult<Event> {
        self.with_ctx("event_create", |c, next| {
            if flags > 7 {
                return Err(INVALID_VALUE);
            }
            let e = fresh(next);
            c.events.insert(e, false);
            Ok(Event::from_raw(e))
        })
    }

    fn event_destroy(&self, event: Event) -> CuResult<()> {
        self.with_ctx("event_destroy", |c, _| {
            c.events
                .remove(&event.raw())
                .map(|_| ())
                .ok_or(INVALID_HANDLE)
        })
    }

    fn event_record(&self, event: Event, stream: Stream) -> CuResult<()> {
        self.with_ctx("event_record", |c, _| {
            check_stream(c, stream.raw())?;
            let e = c.events.get_mut(&event.raw()).ok_or(INVALID_HANDLE)?;
            *e = true;
            Ok(())
        })
    }

    fn event_synchronize(&self, event: Event) -> CuResult<()> {
        self.with_ctx("event_synchronize", |c, _| {
            c.events.get(&event.raw()).map(|_| ()).ok_or(INVALID_HANDLE)
        })
    }

    fn event_query(&self, event: Event) -> CuResult<()> {
        self.with_ctx("event_query", |c, _| {
            c.events.get(&event.raw()).map(|_| ()).ok_or(INVALID_HANDLE)
        })
    }

    fn event_elapsed(&self, start: Event, end: Event) -> CuResult<f32> {
        self.with_ctx("event_elapsed", |c, _| {
            match (c.events.get(&start.raw()), c.events.get(&end.raw())) {
                (Some(true), Some(true)) => Ok(2.5),
                _ => Err(INVALID_HANDLE),
            }
        })
    }

    fn stream_set_attribute(&self, stream: Stream, id: u32, value: &[u8; 64]) -> CuResult<()> {
        self.with_ctx("stream_set_attribute", |c, _| {
            check_stream(c, stream.raw())?;
            if ![1, 3, 8, 9, 10].contains(&id) {
                return Err(INVALID_VALUE);
            }
            c.stream_attrs.insert((stream.raw(), id), *value);
            Ok(())
        })
    }

    fn stream_get_attribute(&self, stream: Stream, id: u32) -> CuResult<[u8; 64]> {
        self.with_ctx("stream_get_attribute", |c, _| {
            check_stream(c, stream.raw())?;
            if ![1, 3, 8, 9, 10].contains(&id) {
                return Err(INVALID_VALUE);
            }
            Ok(c.stream_attrs
                .get(&(stream.raw(), id))
                .copied()
                .unwrap_or([0; 64]))
        })
    }

    fn ctx_reset_persisting_l2(&self) -> CuResult<()> {
        self.with_ctx("ctx_reset_persisting_l2", |_, _| Ok(()))
    }

    fn stream_is_capturing(&self, stream: Stream) -> CuResult<bool> {
        self.with_ctx("stream_is_capturing", |c, _| {
            check_stream(c, stream.raw()).map(|()| false)
        })
    }

    fn activity_source(&self) -> Option<Box<dyn crate::cuda::trace::ActivitySource>> {
        self.activity.as_ref().map(|a| {
            Box::new(activity::FakeSource(a.clone())) as Box<dyn crate::cuda::trace::ActivitySource>
        })
    }

    unsafe fn launch_host_func(
        &self,
        stream: Stream,
        func: HostFn,
        user_data: *mut c_void,
    ) -> CuResult<()> {
        self.with_ctx("launch_host_func", |c, _| check_stream(c, stream.raw()))?;
        // Like the driver: on a thread of its own.
        let data = user_data as usize;
        // SAFETY: the caller keeps `user_data` valid for `func` (our contract).
        thread::spawn(move || unsafe { func(data as *mut c_void) });
        Ok(())
    }
}

/// The fake's host facts: a driver version and a Gen5 x16 link (Gen4 x16 running), as a test
/// value of the kind the real host gives.
impl super::host_facts::HostFactsDriverApi for FakeDriver {
    fn driver_release(&self) -> Option<String> {
        Some("580.95.05".into())
    }

    fn pcie_link(&self, _: i32, _: i32, _: i32) -> [u8; 4] {
        [4, 16, 5, 16]
    }
}

/// The fake JIT: the module as `module_load` makes it, an info log naming what it was given, an
/// error log for an image it cannot load.
impl super::jit_logs::JitLogDriverApi for FakeDriver {
    fn module_load_logged(
        &self,
        image: &[u8],
        options: &[(u32, u64)],
    ) -> (CuResult<Module>, super::jit_logs::JitLogs) {
        // PTX with a ".bad" line stands for code the JIT refuses.
        let r = if image.windows(5).any(|w| w == b".bad\n") {
            Err(CuError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_PTX as u32,
            ))
        } else {
            DriverApi::module_load(self, image)
        };
        let mut logs = super::jit_logs::JitLogs::default();
        match r {
            Ok(_) => {
                logs.info = format!("fake JIT: {} bytes, {} options", image.len(), options.len())
                    .into_bytes();
            }
            Err(_) => logs.error = b"fake JIT: ptxas refused .bad".to_vec(),
        }
        (r, logs)
    }
}

/// The fake's tensor maps: a stand-in encoding (the kind, rank, data type and address in the
/// first words), checked the way the driver checks the rank and the alignment of the address.
impl super::tensor_maps::TensorMapDriverApi for FakeDriver {
    fn tensor_map(
        &self,
        r: &qcuda_proto::tensor_map::TensorMapRequest,
    ) -> CuResult<[u8; qcuda_proto::tensor_map::TENSOR_MAP_SIZE]> {
        use qcuda_proto::tensor_map::TENSOR_MAP_REPLACE_ADDRESS;
        if !r.address.is_multiple_of(16) || r.data_type > 15 {
            return Err(INVALID_VALUE);
        }
        let mut map = if r.kind == TENSOR_MAP_REPLACE_ADDRESS {
            r.map
        } else {
            let mut m = [0u8; 128];
            m[8..12].copy_from_slice(&r.kind.to_le_bytes());
            m[12..16].copy_from_slice(&r.rank.to_le_bytes());
            m[16..20].copy_from_slice(&r.data_type.to_le_bytes());
            m
        };
        map[..8].copy_from_slice(&r.address.to_le_bytes());
        Ok(map)
    }
}

//! The GPU state of one guest process, and the op handlers that act on it.
//!
//! A [`GpuState`] lives in its session's worker process (`crate::worker`), alone: the daemon
//! runs every session's executor in a process of its own. It owns one CUDA context per device
//! the guest process has used (created on first use, never the shared primary context), the
//! allocation table of each context, and the session-local handle tables for modules,
//! functions, streams and events. Every op binds its context to the calling thread first.
//! Dropping the state destroys its contexts, which frees everything they own.
//!
//! A sticky error (an illegal address, a failed launch, ...) corrupts the CUDA state of the
//! whole process, not just the context it happened in: measured with driver 580, every other
//! context of the process, and every context created afterwards, fails with the same error. So
//! the executor records it on the [`CudaHost`], and from then on every op that needs a context
//! answers that error with `RESP_FLAG_STICKY`, without calling into the corrupted driver. In a
//! worker process that is exactly this session; only a new process clears it, which is what
//! the daemon gives a session that asks for DeviceReset after a sticky error.
//!
//! Files, by concern: this one (the state, `execute` and the op dispatch), `contexts.rs`
//! (contexts, device-wide ops, teardown), `memory.rs` (Malloc/Free, range checks, host
//! mappings), `pools.rs` (memory pools, stream-ordered allocations), `copies.rs` (copies and
//! memsets), `modules.rs` (modules, functions, globals, launches), `streams.rs` (streams,
//! events, host functions), `batch.rs` (Batch), `arrays.rs` (pitched memory, arrays, texture
//! and surface objects), `graphs.rs` (graphs and stream capture), `precopy.rs` (a live
//! migration's pre-copy rounds), `vmm.rs` (virtual memory management: physical allocations,
//! reservations, mappings), `trace.rs` (the GPU timeline recorder's op, request records and
//! event timer). Beneath them all: `fault.rs` (why an op failed, what it answers) and
//! `tables.rs` (what the state holds of arrays, graphs, IPC, managed memory, reserved ranges,
//! VMM and a pause), which the op files act on.

use std::{ffi::CString, sync::Arc};

use qcuda_proto::{
    link::{LinkRequest, LINK_INPUT_TYPES},
    status, BatchRecord, Direction, LaunchAttr, Op, RequestHeader, ResponseHeader,
    BATCH_RECORD_SIZE, BATCH_TAIL, FLAG_ASYNC, HOST_MAP_FLAGS, HOST_MAP_MANAGED,
    HOST_MAP_READ_ONLY, LAUNCH_ATTR_SIZE, LAUNCH_COOPERATIVE, MAX_LAUNCH_ATTRS, PARAM_INFO_SIZE,
    RESP_FLAG_STICKY,
};
use tracing::{debug, warn};

use super::ram_registry::RamRegistry;

use super::saved_state::SavedState;
use super::{
    aligned_bytes::AlignedBytes,
    allocations::{AllocationTable, TableError},
    copy::{self, Staging},
    driver::{
        Context, CuError, DriverApi, Event, Function, MemPool, MemsetWidth, Module, Stream,
        NULL_STREAM,
    },
    handles::{HandleCounter, HandleTable},
    host::CudaHost,
    host_functions::{trampoline, HostFunctions, LinkAttacher},
    host_mappings::{self, HostMappings, MapError},
    launch::{DriverLaunchAttr, LaunchConfig, ParamLayout},
    module_image::ModuleImage,
    status::{cuda_name, is_sticky},
};
use crate::guest_buffer::{GuestBuffer, Request};

mod arrays;
mod batch;
mod checkpoint;
mod contexts;
mod copies;
mod fault;
mod graphs;
mod handover;
mod ipc;
mod jit_logs;
mod managed;
mod memory;
mod modules;
mod pools;
mod precopy;
mod saved_host_memory;
mod streams;
mod tables;
mod tensor_maps;
mod trace;
mod vmm;

pub use fault::CheckpointError;
use fault::{ok, ok_rets, on, to_usize, DeviceCopy, Fault, OpResult};
#[allow(clippy::wildcard_imports)] // the ops files (`use super::*`) work on every table
use tables::*;
pub use tables::{ExportedRun, IpcExported, SaveFigures};

/// The launch attribute ids a stream takes: access policy window, synchronisation policy,
/// priority, memory synchronisation domain map and domain.
const STREAM_ATTRIBUTES: [u32; 5] = [1, 3, 8, 9, 10];

/// Most modules a session may have loaded.
const MAX_MODULES: usize = 4096;
/// Most function handles a session may hold.
const MAX_FUNCTIONS: usize = 1 << 16;
/// Most streams a session may hold.
const MAX_STREAMS: usize = 1 << 14;
/// Most events a session may hold.
const MAX_EVENTS: usize = 1 << 16;
/// Most memory pools a session may hold (default pools included).
const MAX_POOLS: usize = 1024;
/// Most access descriptors one MemPoolSetAccess may carry.
const MAX_POOL_ACCESS: usize = 64;
/// The `cudaMemPoolAttr` ids (1..=8); 5 and 7 (current reserved and used memory) are read-only.
const POOL_ATTRS: std::ops::RangeInclusive<u64> = 1..=8;
/// Longest kernel or variable name.
const MAX_NAME_LEN: usize = 4096;
/// Most attributes one DeviceAttributes op may ask for.
const MAX_ATTRIBUTES: usize = 1024;
/// More parameters than any kernel can have (the parameter space is at most 32 764 bytes).
const MAX_PARAMS: usize = 32 * 1024;
/// cudaStreamNonBlocking.
const STREAM_NON_BLOCKING: u64 = 1;
/// cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess.
const EVENT_FLAGS: u64 = 0x7;
/// cudaEventWaitExternal.
const EVENT_WAIT_FLAGS: u64 = 0x1;

/// The attribute ops (DeviceAttributes, FuncAttributes): in-buffer 0 holds i32 ids, out-buffer 0
/// (the same length, at most `MAX_ATTRIBUTES` ids) receives `value(id)` for each.
fn attribute_table(req: &Request, mut value: impl FnMut(i32) -> Result<i32, Fault>) -> OpResult {
    let (Some(input), Some(out)) = (req.inputs().first(), req.outputs().first()) else {
        return Err(status::INVALID_VALUE.into());
    };
    let len = input.len();
    if len != out.len() || len % 4 != 0 || len / 4 > MAX_ATTRIBUTES {
        return Err(status::INVALID_VALUE.into());
    }
    let ids = input.to_vec().map_err(|_| status::INVALID_VALUE)?;
    let mut values = Vec::with_capacity(len);
    for id in ids.chunks_exact(4) {
        let v = value(i32::from_le_bytes([id[0], id[1], id[2], id[3]]))?;
        values.extend_from_slice(&v.to_le_bytes());
    }
    out.write_at(0, &values)
        .map_err(|_| status::INVALID_VALUE)?;
    ok()
}

/// The status a refused host mapping earns.
fn map_status(e: MapError) -> u32 {
    match e {
        MapError::Invalid => status::INVALID_VALUE,
        MapError::Overlap => status::HOST_MEMORY_ALREADY_REGISTERED,
        MapError::NoMemory => status::MEMORY_ALLOCATION,
        MapError::NotMapped => status::HOST_MEMORY_NOT_REGISTERED,
    }
}

/// Flag word `arg` of the guest if it has no bit outside `known`, else INVALID_VALUE.
fn flags_u32(arg: u64, known: u64) -> Result<u32, Fault> {
    if arg & !known != 0 {
        return Err(status::INVALID_VALUE.into());
    }
    u32::try_from(arg).map_err(|_| status::INVALID_VALUE.into())
}

/// A C `int` of the driver in a return slot, as the wire carries it ("i32 as u32"): its 32
/// bits, zero-extended.
fn int_ret(v: i32) -> u64 {
    u64::from(u32::from_ne_bytes(v.to_ne_bytes()))
}

/// A kernel or variable name from the guest: 1..=4096 bytes, no NUL.
fn symbol_name(buf: &GuestBuffer) -> Result<CString, Fault> {
    let len = buf.len();
    if len == 0 || len > MAX_NAME_LEN {
        return Err(status::INVALID_VALUE.into());
    }
    let bytes = buf.to_vec().map_err(|_| status::INVALID_VALUE)?;
    CString::new(bytes).map_err(|_| status::INVALID_VALUE.into())
}

/// Stream priority from args[1]: an `int` the guest may have sign-extended to 64 bits or not.
#[expect(
    clippy::cast_possible_wrap,
    reason = "both casts reinterpret the two's-complement bits of the guest's C int, \
              zero-extended (u32) or sign-extended (i64); anything else is refused"
)]
fn priority(arg: u64) -> Result<i32, Fault> {
    if let Ok(v) = u32::try_from(arg) {
        return Ok(v as i32);
    }
    i32::try_from(arg as i64).map_err(|_| status::INVALID_VALUE.into())
}

/// A `cudaFuncCache` value (0..=3).
fn cache_config(arg: u64) -> Result<u32, Fault> {
    u32::try_from(arg)
        .ok()
        .filter(|c| *c <= 3)
        .ok_or(Fault::Status(status::INVALID_VALUE))
}

/// The launch attributes of a buffer of `LaunchAttr` records (at most `MAX_LAUNCH_ATTRS`),
/// events mapped to the session's events on `dev`.
fn launch_attrs(
    buf: &GuestBuffer,
    events: &HandleTable<EventEntry>,
    dev: usize,
) -> Result<Vec<DriverLaunchAttr>, Fault> {
    let len = buf.len();
    if !len.is_multiple_of(LAUNCH_ATTR_SIZE) || len / LAUNCH_ATTR_SIZE > MAX_LAUNCH_ATTRS {
        return Err(status::INVALID_VALUE.into());
    }
    let bytes = buf.to_vec().map_err(|_| status::INVALID_VALUE)?;
    let event = |h: u64| {
        events
            .get(h)
            .filter(|e| e.dev == dev)
            .map(|e| e.raw.launch_attr_value())
    };
    bytes
        .chunks_exact(LAUNCH_ATTR_SIZE)
        .map(|rec| {
            let a = LaunchAttr::decode(rec).map_err(|_| status::INVALID_VALUE)?;
            DriverLaunchAttr::from_wire(&a, event).map_err(Fault::Status)
        })
        .collect()
}

/// The CUDA context of a session on one device, with what lives in it.
#[derive(Debug)]
struct DeviceContext {
    ctx: Context,
    memory: AllocationTable,
    staging: StagingState,
    /// The session's handle of the device's default memory pool, once asked for.
    default_pool: Option<u64>,
    /// The pool `DeviceSetMemPool` made current; `None`: the default pool.
    current_pool: Option<u64>,
    /// The session's reserved device range, which `Malloc` carves (memory.rs); `None`:
    /// allocations come from `cuMemAlloc`.
    range: Option<ReservedRange>,
    /// How the context was set up since its creation, for a restore (checkpoint.rs):
    /// `cuCtxSetLimit`s in the order set (one per limit), `cuCtxSetCacheConfig`, and the
    /// guest devices whose memory it reaches (peer access).
    limits: Vec<(u32, u64)>,
    cache_config: Option<u32>,
    peers: Vec<usize>,
    /// The stream and event managed memory's migrations use (managed.rs), made on first need.
    managed_sync: Option<ManagedSync>,
    /// The pre-copy kernel, its stream and buffers (precopy.rs), loaded on first need.
    precopy: Option<PrecopyDevice>,
}

#[derive(Debug)]
enum StagingState {
    NotYet,
    Ready(Staging),
    /// Allocation failed once; copies go direct from then on.
    Unavailable,
}

#[derive(Debug)]
struct ModuleEntry {
    dev: usize,
    raw: Module,
    /// Length of its image (counted against [`MAX_MODULE_BYTES`](super::host::MAX_MODULE_BYTES)).
    bytes: u64,
    /// The image, to load it again on a restore.
    image: Arc<[u8]>,
    /// The globals the guest looked up: name, address, size (their values are saved).
    globals: Vec<(CString, u64, u64)>,
}

#[derive(Debug)]
struct FunctionEntry {
    dev: usize,
    module: u64,
    raw: Function,
    layout: ParamLayout,
    /// Its kernel's name, and the settings made on it (`cuFuncSetCacheConfig`,
    /// `cuFuncSetAttribute`s, one per attribute), for a restore.
    name: CString,
    cache_config: Option<u32>,
    attributes: Vec<(i32, i32)>,
    /// Whether this session had the driver load it (`cuFuncLoad`) for an attribute or
    /// occupancy call: under lazy loading those load the function natively, so a first launch
    /// timed with events does not include the load.
    loaded: bool,
}

#[derive(Debug)]
struct StreamEntry {
    dev: usize,
    raw: Stream,
    /// How it was created and the attributes set on it (one per id), for a restore.
    flags: u32,
    priority: i32,
    attributes: Vec<(u32, [u8; 64])>,
}

#[derive(Debug)]
struct PoolEntry {
    dev: usize,
    raw: MemPool,
    /// The device's default pool (never destroyed by the session).
    default: bool,
    /// `max_size` it was created with (0: the default pool, or no limit).
    max_size: u64,
    /// Created shareable (POSIX file descriptors, for CUDA IPC).
    shareable: bool,
    /// Settable attributes (1..=4) the guest set: (attribute, value), the last value of each.
    settings: Vec<(u32, u64)>,
    /// Access the guest granted: (guest device ordinal, flags), the last flags of each.
    access: Vec<(u32, u32)>,
}

impl PoolEntry {
    fn new(dev: usize, raw: MemPool, default: bool, max_size: u64) -> Self {
        Self {
            dev,
            raw,
            default,
            max_size,
            shareable: false,
            settings: Vec::new(),
            access: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct EventEntry {
    dev: usize,
    raw: Event,
    /// Its creation flags, and whether it has been recorded (a restored one is recorded once
    /// more, so that it is complete as it was).
    flags: u32,
    recorded: bool,
}

/// The CUDA state of one guest process: contexts, allocations, modules, functions, streams
/// and events. Runs on one thread at a time (it is `Send`, not `Sync`).
pub struct GpuState {
    host: Arc<CudaHost>,
    drv: Arc<dyn DriverApi>,
    id: u64,
    /// Indexed by guest device ordinal.
    devices: Vec<Option<DeviceContext>>,
    ids: HandleCounter,
    modules: HandleTable<ModuleEntry>,
    functions: HandleTable<FunctionEntry>,
    streams: HandleTable<StreamEntry>,
    events: HandleTable<EventEntry>,
    pools: HandleTable<PoolEntry>,
    /// Guest memory mapped into this process and registered (`HostMap`).
    host_memory: HostMappings,
    /// Managed allocations placed on the device, by guest address (managed.rs).
    managed: std::collections::BTreeMap<u64, Placement>,
    /// Guest RAM as the worker last mapped it, and the restored host mappings waiting for
    /// it (saved_host_memory.rs).
    guest_ram: Option<Arc<crate::guest_buffer::GuestRam>>,
    waiting_host: Vec<Waiting>,
    /// Host functions: the link to the guest's host-function thread.
    host_functions: HostFunctions,
    /// Host-function calls captured into graphs: they may run as long as a graph lives, so
    /// they are freed with the session, after its contexts.
    captured_calls: Vec<usize>,
    /// Arrays, mipmapped arrays, texture and surface objects (arrays.rs).
    arrays: ArrayState,
    /// Graphs, their nodes and executable graphs (graphs.rs).
    graphs: GraphTables,
    /// Guest RAM registered for DMA of long copy runs (ram_registry.rs).
    ram: RamRegistry,
    /// Guest addresses of the host mappings registered read-only (a resume registers them
    /// again as they were).
    read_only_host: std::collections::HashSet<u64>,
    /// While paused (checkpoint.rs): the contents of the reserved ranges, whose GPU memory
    /// is given back; the next op resumes first.
    paused: Option<Vec<PausedRange>>,
    /// Physical allocations, reservations and mappings (gpu_state/vmm.rs).
    vmm: VmmTables,
    /// Memory of other processes of the VM opened through legacy IPC (gpu_state/ipc.rs).
    ipc: IpcImports,
    /// The GPU timeline recording, once one was armed (gpu_state/trace.rs); `None` costs each
    /// request one check.
    trace: Option<Box<Tracing>>,
    /// What pre-copy rounds sent, while a migration pre-copies (precopy.rs).
    precopy: Option<Box<super::precopy::Tracking>>,
}

impl std::fmt::Debug for GpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuState")
            .field("id", &self.id)
            .field("contexts", &self.devices.iter().flatten().count())
            .field("modules", &self.modules.len())
            .field("streams", &self.streams.len())
            .field("events", &self.events.len())
            .field("pools", &self.pools.len())
            .field("host_mappings", &self.host_memory.len())
            .field("graphs", &self.graphs.len())
            .finish()
    }
}

impl GpuState {
    /// A spare worker's state, opened before its session was known, is given it
    /// (`ToWorker::Bind`): the id its logs and saved states carry. Only before any request.
    pub fn assign_session(&mut self, id: u64) {
        self.id = id;
    }

    /// A new, empty session of `host` for guest process `id`. Its contexts are created on
    /// first use.
    pub fn open(host: &Arc<CudaHost>, id: u64) -> Self {
        let host = Arc::clone(host);
        let drv = Arc::clone(&host.driver);
        let devices = host.gpus.iter().map(|_| None).collect();
        Self {
            host,
            drv,
            id,
            devices,
            ids: HandleCounter::default(),
            modules: HandleTable::new(MAX_MODULES),
            functions: HandleTable::new(MAX_FUNCTIONS),
            streams: HandleTable::new(MAX_STREAMS),
            events: HandleTable::new(MAX_EVENTS),
            pools: HandleTable::new(MAX_POOLS),
            host_memory: HostMappings::default(),
            managed: std::collections::BTreeMap::new(),
            guest_ram: None,
            waiting_host: Vec::new(),
            host_functions: HostFunctions::default(),
            captured_calls: Vec::new(),
            arrays: ArrayState::default(),
            graphs: GraphTables::default(),
            ram: RamRegistry::default(),
            read_only_host: std::collections::HashSet::new(),
            paused: None,
            vmm: VmmTables::default(),
            ipc: IpcImports::default(),
            trace: None,
            precopy: None,
        }
    }

    /// Attaches the link host functions announce themselves on (it comes from the daemon,
    /// once, between requests).
    pub fn host_functions_attacher(&self) -> LinkAttacher {
        self.host_functions.attacher()
    }

    /// Executes one op and returns its response. Handles every op except Hello, Echo and the
    /// kernel module's SessionClose and DriverReset (answered cudaErrorNotSupported here). Never
    /// panics on any input.
    ///
    /// `FLAG_ASYNC` requests run like the others, in order, and report their real status.
    pub fn execute(&mut self, req: &Request) -> ResponseHeader {
        // While a GPU timeline is recorded (`Op::GpuTrace`); otherwise this one check is all a
        // recorder costs.
        if self.trace.is_some() {
            return self.execute_recorded(req);
        }
        self.execute_unrecorded(req)
    }

    /// [`GpuState::execute`] without the recorder.
    fn execute_unrecorded(&mut self, req: &Request) -> ResponseHeader {
        if self.paused.is_some() {
            // The guest goes on as if nothing had happened: its state comes back first.
            if let Err(e) = self.resume() {
                let s = match e {
                    CheckpointError::Cuda(s) => s,
                    _ => status::UNKNOWN,
                };
                return ResponseHeader::with_status(s);
            }
        }
        let mut resp = match self.dispatch(req) {
            Ok(r) => r,
            Err(Fault::Status(s)) => ResponseHeader::with_status(s),
            Err(Fault::Driver { dev, err }) => {
                ResponseHeader::with_status(self.driver_failed(req.op(), dev, err))
            }
        };
        if self.host.sticky_error().is_some() {
            resp.flags |= RESP_FLAG_STICKY;
        }
        resp
    }

    /// Maps a driver error and, if it is sticky, records it on the host (see the module doc).
    fn driver_failed(&mut self, op: Op, dev: usize, err: CuError) -> u32 {
        let s = err.status();
        if is_sticky(s) {
            warn!(session = self.id, ?op, dev, error = ?err, "sticky error");
            self.host.set_sticky_error(s);
        } else {
            debug!(session = self.id, ?op, dev, error = ?err, status = cuda_name(s), "driver call failed");
        }
        s
    }

    fn dispatch(&mut self, req: &Request) -> OpResult {
        let args = &req.header().args;
        if let Some(resp) = self.host.answer_query(req) {
            return Ok(resp);
        }
        match req.op() {
            Op::Hello | Op::Echo | Op::SessionClose | Op::DriverReset => {
                debug!(session = self.id, op = ?req.op(), "transport op reached the executor");
                return Err(status::NOT_SUPPORTED.into());
            }
            _ => {}
        }
        if let Some(s) = self.host.unavailable() {
            return Err(s.into());
        }
        match req.op() {
            Op::DeviceAttributes => self.device_attributes(req),
            Op::DeviceSynchronize => self.device_synchronize(req),
            Op::DeviceReset => {
                let dev = self.device(req)?;
                self.teardown(dev);
                ok()
            }
            Op::DeviceGetLimit | Op::DeviceSetLimit => self.limit(req),
            Op::MemGetInfo => {
                let dev = self.bind_new(req)?;
                let (free, total) = self.drv.mem_get_info().map_err(on(dev))?;
                ok_rets(&[free, total])
            }
            Op::Malloc => self.malloc(req),
            Op::Free => self.free(req),
            Op::MemcpyHtoD => self.memcpy_htod(req),
            Op::MemcpyDtoH => self.memcpy_dtoh(req),
            Op::MemcpyDtoD => self.memcpy_dtod(req),
            Op::Memset => self.memset(req),
            Op::MemcpyMapped => self.memcpy_mapped(req),
            Op::ManagedMigrate => self.managed_migrate(req),
            Op::ManagedPlace => self.managed_place(req),
            Op::ManagedUnplace => self.managed_unplace(args[0]),
            Op::HostMap => self.host_map(req),
            Op::HostUnmap => self.host_unmap(req),
            Op::ModuleLoad => self.module_load(req),
            Op::ModuleLoadLogged => self.module_load_logged(req),
            Op::TensorMapEncode => self.tensor_map_encode(req),
            Op::ModuleUnload => self.module_unload(args[0]),
            Op::ModuleGetFunction => self.module_get_function(req),
            Op::ModuleFunctionNames => self.module_function_names(req),
            Op::Link => self.link(req),
            Op::ModuleGetGlobal => self.module_get_global(req),
            Op::LaunchKernel | Op::LaunchKernelEx => self.launch_kernel(req),
            Op::OccupancyCluster => self.occupancy_cluster(req),
            Op::OccupancyAvailableDynamicSMem => {
                let (dev, raw) = self.loaded_function(args[0])?;
                let blocks = i32::try_from(args[1]).map_err(|_| status::INVALID_VALUE)?;
                let block = i32::try_from(args[2]).map_err(|_| status::INVALID_VALUE)?;
                let n = self
                    .drv
                    .occupancy_available_smem(raw, blocks, block)
                    .map_err(on(dev))?;
                ok_rets(&[n as u64])
            }
            Op::FuncSetCacheConfig => {
                let (dev, raw) = self.function(args[0])?;
                let config = cache_config(args[1])?;
                self.drv
                    .func_set_cache_config(raw, config)
                    .map_err(on(dev))?;
                if let Some(f) = self.functions.get_mut(args[0]) {
                    f.cache_config = Some(config);
                }
                ok()
            }
            Op::DeviceSetCacheConfig => {
                let config = cache_config(args[0])?;
                let dev = self.bind_new(req)?;
                self.drv.ctx_set_cache_config(config).map_err(on(dev))?;
                self.context(dev)?.cache_config = Some(config);
                ok()
            }
            Op::DeviceGetCacheConfig => {
                let dev = self.bind_new(req)?;
                let c = self.drv.ctx_get_cache_config().map_err(on(dev))?;
                ok_rets(&[u64::from(c)])
            }
            Op::FuncAttributes => self.func_attributes(req),
            Op::FuncSetAttribute => self.func_set_attribute(args),
            Op::OccupancyMaxActiveBlocks => self.occupancy(args),
            Op::StreamCreate => self.stream_create(req),
            Op::StreamDestroy => self.stream_destroy(args[0]),
            Op::StreamSynchronize | Op::StreamQuery => self.stream_wait(req),
            Op::StreamWaitEvent => self.stream_wait_event(req),
            Op::StreamPriorityRange => {
                let dev = self.bind_new(req)?;
                let (least, greatest) = self.drv.stream_priority_range().map_err(on(dev))?;
                ok_rets(&[int_ret(least), int_ret(greatest)])
            }
            Op::StreamGetId => {
                let dev = self.bind_new(req)?;
                let stream = self.stream_on(args[0], dev)?;
                let id = self.drv.stream_id(stream).map_err(on(dev))?;
                ok_rets(&[id])
            }
            Op::DeviceGetDefaultMemPool => {
                let dev = self.bind_new(req)?;
                ok_rets(&[self.default_pool(dev)?])
            }
            Op::DeviceGetMemPool => {
                let dev = self.bind_new(req)?;
                let current = self.context(dev)?.current_pool;
                match current {
                    Some(h) => ok_rets(&[h]),
                    None => ok_rets(&[self.default_pool(dev)?]),
                }
            }
            Op::DeviceSetMemPool => self.device_set_mem_pool(req),
            Op::MemPoolCreate => self.mem_pool_create(req),
            Op::MemPoolDestroy => self.mem_pool_destroy(args[0]),
            Op::MemPoolSetAttribute | Op::MemPoolGetAttribute => self.mem_pool_attribute(req),
            Op::MemPoolTrimTo => {
                let (dev, raw) = self.pool(args[0])?;
                self.drv
                    .mem_pool_trim_to(raw, to_usize(args[1])?)
                    .map_err(on(dev))?;
                ok()
            }
            Op::MemPoolSetAccess => self.mem_pool_set_access(req),
            Op::MemPoolGetAccess => {
                let (dev, raw) = self.pool(args[0])?;
                let gpu = self.gpu_of(args[1])?;
                let flags = self.drv.mem_pool_get_access(raw, gpu).map_err(on(dev))?;
                ok_rets(&[u64::from(flags)])
            }
            Op::DeviceCanAccessPeer => {
                let ((dev, a), b) = (self.gpu_index(args[0])?, self.gpu_of(args[1])?);
                // A device is not its own peer.
                let can = a != b && self.drv.device_can_access_peer(a, b).map_err(on(dev))?;
                ok_rets(&[u64::from(can)])
            }
            Op::DeviceP2PAttribute => {
                let attr = u32::try_from(args[0])
                    .ok()
                    .filter(|a| (1..=5).contains(a))
                    .ok_or(status::INVALID_VALUE)?;
                let ((src_dev, src), dst) = (self.gpu_index(args[1])?, self.gpu_of(args[2])?);
                if src == dst {
                    return Err(status::INVALID_DEVICE.into());
                }
                let v = self
                    .drv
                    .device_p2p_attribute(attr, src, dst)
                    .map_err(on(src_dev))?;
                ok_rets(&[int_ret(v)])
            }
            Op::PeerAccess => self.peer_access(req),
            Op::MemcpyPeer => self.memcpy_peer(req),
            Op::MallocAsync => self.malloc_async(req),
            Op::FreeAsync => self.free_async(req),
            Op::EventCreate => self.event_create(req),
            Op::EventDestroy => self.event_destroy(args[0]),
            Op::EventRecord => self.event_record(args),
            Op::EventSynchronize | Op::EventQuery => self.event_wait(req),
            Op::EventElapsedTime => self.event_elapsed(args),
            Op::LaunchHostFunc => self.launch_host_func(req),
            Op::StreamSetAttribute => self.stream_set_attribute(req),
            Op::StreamGetAttribute => self.stream_get_attribute(req),
            Op::CtxResetPersistingL2 => {
                let dev = self.bind_new(req)?;
                self.drv.ctx_reset_persisting_l2().map_err(on(dev))?;
                ok()
            }
            Op::Batch => self.batch(req),
            Op::GpuTrace => self.gpu_trace(req),
            qcuda_proto::vmm_ops!() => self.vmm_op(req),
            Op::IpcClose => self.ipc_close(req),
            Op::MemPoolExportPointer => self.pool_export_pointer(req),
            Op::MemPoolImportPointer => self.pool_import_pointer(req),
            // They carry a file descriptor: the daemon sends them as messages of their own
            // (`ipc_export`, `ipc_import`).
            Op::IpcExport | Op::IpcImport => Err(status::NOT_SUPPORTED.into()),
            Op::MallocPitch => self.malloc_pitch(req),
            Op::Memset3D => self.memset_3d(req),
            Op::Memcpy3D | Op::Memcpy3DHtoD | Op::Memcpy3DDtoH => self.memcpy_3d(req),
            Op::ArrayCreate => self.array_create(req),
            Op::ArrayDestroy => self.array_destroy(req),
            Op::MipmappedArrayLevel => self.mipmapped_level(req),
            Op::ArrayInfo => self.array_info(req),
            Op::TexObjectCreate => self.tex_object_create(req),
            Op::SurfObjectCreate => self.surf_object_create(req),
            Op::TexObjectDestroy | Op::SurfObjectDestroy => self.object_destroy(req),
            qcuda_proto::graph_ops!() => self.graph_op(req),
            Op::HostInfo
            | Op::DriverVersion
            | Op::DriverRelease
            | Op::DeviceCount
            | Op::DeviceInfo
            | Op::Hello
            | Op::Echo
            | Op::SessionClose
            | Op::DriverReset
            // The worker process answers it (device_output.rs).
            | Op::TakeOutput
            // The daemon answers it, outside the request order (host_functions.rs).
            | Op::HostFuncWait
            | Op::HostLatency
            | Op::VmUsage
            // The session table answers it (session/process_checkpoint.rs).
            | Op::ProcessCheckpoint => Err(status::NOT_SUPPORTED.into()),
        }
    }
}

impl Drop for GpuState {
    /// Frees everything the session owns on the GPU by destroying its contexts.
    fn drop(&mut self) {
        // Mappings first: their memory may be another context's.
        let drv = Arc::clone(&self.drv);
        let live = self.host.sticky_error().is_none();
        self.vmm.release_all(live.then_some(drv.as_ref()));
        let quota = self.host.memory_quota();
        self.ipc
            .release_all(live.then_some(drv.as_ref()), quota.as_deref());
        self.ram.release(self.drv.as_ref());
        for dev in 0..self.devices.len() {
            self.teardown(dev);
        }
        // Every context is gone, and with it every graph that could run these.
        for call in self.captured_calls.drain(..) {
            // SAFETY: from `HostFunctions::call`, freed once, and no driver can run it now.
            unsafe { HostFunctions::free(call as *mut std::ffi::c_void) };
        }
    }
}

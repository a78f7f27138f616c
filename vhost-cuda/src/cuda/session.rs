//! The CUDA state of one guest process, and the op handlers that act on it.
//!
//! A [`CudaSession`] lives in its session's worker process (`crate::worker`), alone: the
//! daemon runs every session's executor in a process of its own. It owns one CUDA context per
//! device the guest process has used (created on first use, never the shared primary context),
//! the allocation table of each context, and the session-local handle tables for modules,
//! functions, streams and events. Every op binds its context to the calling thread first.
//! Dropping the session destroys its contexts, which frees everything they own.
//!
//! A sticky error (an illegal address, a failed launch, ...) corrupts the CUDA state of the
//! whole process, not just the context it happened in: measured with driver 580, every other
//! context of the process, and every context created afterwards, fails with the same error. So
//! the executor records it on the [`CudaHost`], and from then on every op that needs a context
//! answers that error with `RESP_FLAG_STICKY`, without calling into the corrupted driver. In a
//! worker process that is exactly this session; only a new process clears it, which is what
//! the daemon gives a session that asks for DeviceReset after a sticky error.

use std::{ffi::CString, sync::Arc};

use qcuda_proto::{
    link::{LinkRequest, LINK_INPUT_TYPES},
    status, BatchRecord, Direction, LaunchAttr, Op, RequestHeader, ResponseHeader,
    BATCH_RECORD_SIZE, BATCH_TAIL, FLAG_ASYNC, HOST_MAP_FLAGS, HOST_MAP_READ_ONLY,
    LAUNCH_ATTR_SIZE, LAUNCH_COOPERATIVE, MAX_LAUNCH_ATTRS, PARAM_INFO_SIZE, RESP_FLAG_STICKY,
};
use tracing::{debug, warn};

use super::ram_registry::RamRegistry;

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

#[path = "session_arrays.rs"]
mod arrays;
mod graphs;
mod vmm;

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

/// Why an op failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// A status decided here (validation, unknown handle, sticky error).
    Status(u32),
    /// A driver call on guest device `dev` failed.
    Driver { dev: usize, err: CuError },
}

impl From<u32> for Fault {
    fn from(status: u32) -> Self {
        Fault::Status(status)
    }
}

type OpResult = Result<ResponseHeader, Fault>;

/// A checked copy between two device addresses: destination, source, bytes.
type DeviceCopy = (u64, u64, usize);

fn ok() -> OpResult {
    Ok(ResponseHeader::with_status(status::SUCCESS))
}

fn ok_rets(rets: &[u64]) -> OpResult {
    let mut r = ResponseHeader::with_status(status::SUCCESS);
    for (slot, v) in r.rets.iter_mut().zip(rets) {
        *slot = *v;
    }
    Ok(r)
}

/// Maps driver errors of calls on device `dev`.
fn on(dev: usize) -> impl Fn(CuError) -> Fault {
    move |err| Fault::Driver { dev, err }
}

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

fn to_usize(v: u64) -> Result<usize, Fault> {
    usize::try_from(v).map_err(|_| Fault::Status(status::INVALID_VALUE))
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
    let event = |h: u64| events.get(h).filter(|e| e.dev == dev).map(|e| e.raw);
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
}

#[derive(Debug)]
struct FunctionEntry {
    dev: usize,
    module: u64,
    raw: Function,
    layout: ParamLayout,
}

#[derive(Debug)]
struct StreamEntry {
    dev: usize,
    raw: Stream,
}

#[derive(Debug)]
struct PoolEntry {
    dev: usize,
    raw: MemPool,
    /// The device's default pool (never destroyed by the session).
    default: bool,
}

#[derive(Debug)]
struct EventEntry {
    dev: usize,
    raw: Event,
}

/// The CUDA state of one guest process: contexts, allocations, modules, functions, streams
/// and events. Runs on one thread at a time (it is `Send`, not `Sync`).
pub struct CudaSession {
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
    /// Host functions: the link to the guest's host-function thread.
    host_functions: HostFunctions,
    /// Host-function calls captured into graphs: they may run as long as a graph lives, so
    /// they are freed with the session, after its contexts.
    captured_calls: Vec<usize>,
    /// Arrays, mipmapped arrays, texture and surface objects (session_arrays.rs).
    arrays: arrays::ArrayState,
    /// Graphs, their nodes and executable graphs (session/graphs.rs).
    graphs: graphs::GraphTables,
    /// Guest RAM registered for DMA of long copy runs (ram_registry.rs).
    ram: RamRegistry,
    /// Physical allocations, reservations and mappings (session/vmm.rs).
    vmm: vmm::VmmTables,
}

impl std::fmt::Debug for CudaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSession")
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

impl CudaSession {
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
            host_functions: HostFunctions::default(),
            captured_calls: Vec::new(),
            arrays: arrays::ArrayState::default(),
            graphs: graphs::GraphTables::default(),
            ram: RamRegistry::default(),
            vmm: vmm::VmmTables::default(),
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
            Op::HostMap => self.host_map(req),
            Op::HostUnmap => self.host_unmap(req),
            Op::ModuleLoad => self.module_load(req),
            Op::ModuleUnload => self.module_unload(args[0]),
            Op::ModuleGetFunction => self.module_get_function(req),
            Op::ModuleFunctionNames => self.module_function_names(req),
            Op::Link => self.link(req),
            Op::ModuleGetGlobal => self.module_get_global(req),
            Op::LaunchKernel | Op::LaunchKernelEx => self.launch_kernel(req),
            Op::OccupancyCluster => self.occupancy_cluster(req),
            Op::OccupancyAvailableDynamicSMem => {
                let (dev, raw) = self.function(args[0])?;
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
                ok()
            }
            Op::DeviceSetCacheConfig => {
                let config = cache_config(args[0])?;
                let dev = self.bind_new(req)?;
                self.drv.ctx_set_cache_config(config).map_err(on(dev))?;
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
            qcuda_proto::vmm_ops!() => self.vmm_op(req),
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
            | Op::VmUsage => Err(status::NOT_SUPPORTED.into()),
        }
    }

    // ----- devices and contexts -------------------------------------------------------

    /// The guest device ordinal of the request, checked.
    fn device(&self, req: &Request) -> Result<usize, Fault> {
        let dev = req.header().device as usize;
        if dev < self.devices.len() {
            Ok(dev)
        } else {
            Err(status::INVALID_DEVICE.into())
        }
    }

    /// Binds the session's context on `dev` to this thread, creating it on first use. Fails
    /// with the sticky error once the driver state is corrupted.
    fn bind(&mut self, dev: usize) -> Result<&mut DeviceContext, Fault> {
        if let Some(s) = self.host.sticky_error() {
            return Err(s.into());
        }
        let slot = self
            .devices
            .get_mut(dev)
            .ok_or(Fault::Status(status::INVALID_DEVICE))?;
        if slot.is_none() {
            let gpu = self
                .host
                .gpus
                .get(dev)
                .ok_or(Fault::Status(status::INVALID_DEVICE))?;
            let ctx = self.drv.ctx_create(gpu.dev).map_err(on(dev))?;
            debug!(
                session = self.id,
                dev,
                gpu = gpu.host_ordinal,
                "context created"
            );
            *slot = Some(DeviceContext {
                ctx,
                memory: AllocationTable::with_quota(self.host.memory_quota()),
                staging: StagingState::NotYet,
                default_pool: None,
                current_pool: None,
            });
        }
        let c = slot.as_mut().ok_or(Fault::Status(status::UNKNOWN))?;
        self.drv.ctx_set_current(c.ctx).map_err(on(dev))?;
        Ok(c)
    }

    /// Binds the context of the request's device (creating it).
    fn bind_new(&mut self, req: &Request) -> Result<usize, Fault> {
        let dev = self.device(req)?;
        self.bind(dev)?;
        Ok(dev)
    }

    /// Binds the context on `dev` if the session has one; `false` if it has none (so there
    /// is no work of this session to wait for). Fails with the sticky error in any case.
    fn bind_existing(&mut self, dev: usize) -> Result<bool, Fault> {
        if let Some(s) = self.host.sticky_error() {
            return Err(s.into());
        }
        match self.devices.get(dev) {
            Some(Some(_)) => self.bind(dev).map(|_| true),
            Some(None) => Ok(false),
            None => Err(status::INVALID_DEVICE.into()),
        }
    }

    fn context(&mut self, dev: usize) -> Result<&mut DeviceContext, Fault> {
        self.devices
            .get_mut(dev)
            .and_then(Option::as_mut)
            .ok_or(Fault::Status(status::UNKNOWN))
    }

    fn device_attributes(&self, req: &Request) -> OpResult {
        let dev = self.device(req)?;
        let gpu = self.host.gpus.get(dev).ok_or(status::INVALID_DEVICE)?;
        attribute_table(req, |attr| match self.drv.device_attribute(gpu.dev, attr) {
            Ok(v) => Ok(v),
            Err(CuError::INVALID_VALUE) => Err(status::INVALID_VALUE.into()),
            Err(err) => Err(Fault::Driver { dev, err }),
        })
    }

    fn device_synchronize(&mut self, req: &Request) -> OpResult {
        let dev = self.device(req)?;
        if self.bind_existing(dev)? {
            self.drv.ctx_synchronize().map_err(on(dev))?;
        }
        ok()
    }

    /// Destroys the session's context on `dev` (if any) and forgets everything in it: what
    /// DeviceReset does, and what dropping the session does for each device. A sticky error
    /// stays (it belongs to the process).
    ///
    /// `cuCtxDestroy` frees the context's allocations, pinned staging memory, modules, streams
    /// and events, and waits for the kernels still running in the process. The session is alone
    /// in its worker process, so that wait stalls no other session; a daemon ending the session
    /// does not wait for it beyond a bound, it kills the worker (`crate::worker`).
    fn teardown(&mut self, dev: usize) {
        // Host mappings registered in this context go with it; their pages stay the guest's.
        for guest in self.host_memory.on_device(dev) {
            let drv = Arc::clone(&self.drv);
            let _ = self.host_memory.unmap(guest, |m| {
                let _ = drv.mem_host_unregister(m.local);
            });
        }
        // Executable graphs and graphs first, while their context still exists (with a
        // sticky error the driver is not called, and the context takes them along).
        let live = self.devices.get(dev).is_some_and(Option::is_some) && self.bind(dev).is_ok();
        // A context takes the registrations it made with it: forget them all (the next copy
        // registers what it needs again), so the registry never counts blocks the driver lost.
        if live {
            self.ram.release(self.drv.as_ref());
        }
        self.teardown_graphs(dev, live);
        self.release_pools(dev);
        let Some(c) = self.devices.get_mut(dev).and_then(Option::take) else {
            return;
        };
        match self.drv.ctx_destroy(c.ctx) {
            Ok(()) => debug!(session = self.id, dev, "context destroyed"),
            Err(e) => warn!(session = self.id, dev, error = ?e, "cuCtxDestroy failed"),
        }
        self.modules.retain(|m| m.dev != dev);
        self.functions.retain(|f| f.dev != dev);
        self.streams.retain(|s| s.dev != dev);
        self.events.retain(|e| e.dev != dev);
        self.arrays.forget_device(dev);
        self.pools.retain(|p| p.dev != dev);
    }

    /// Pool memory belongs to its pool, not to a context, so destroying the context does not
    /// free it: frees the session's stream-ordered allocations on `dev`, destroys the pools it
    /// created there, trims the default pool and makes it current again. Best effort (a
    /// corrupted context has nothing left to run, and the worker's exit frees the rest).
    fn release_pools(&mut self, dev: usize) {
        if self.host.sticky_error().is_some() || !matches!(self.devices.get(dev), Some(Some(_))) {
            return;
        }
        if self.bind(dev).is_err() {
            return;
        }
        let drv = Arc::clone(&self.drv);
        let Ok(c) = self.context(dev) else {
            return;
        };
        let pending = c.memory.stream_ordered();
        let touched = !pending.is_empty() || c.default_pool.is_some();
        for ptr in pending {
            let _ = drv.mem_free_async(ptr, NULL_STREAM);
            let _ = c.memory.remove_allocation(ptr);
        }
        let _ = drv.ctx_synchronize();
        let mut default = None;
        let mut created = Vec::new();
        self.pools.retain(|p| {
            if p.dev == dev {
                if p.default {
                    default = Some(p.raw);
                } else {
                    created.push(p.raw);
                }
            }
            true
        });
        let gpu = self.host.gpus.get(dev).map(|g| g.dev);
        if let (Some(raw), Some(gpu)) = (default, gpu) {
            let _ = drv.device_set_mem_pool(gpu, raw);
        }
        for raw in created {
            let _ = drv.mem_pool_destroy(raw);
        }
        if touched {
            if let Some(raw) = default {
                let _ = drv.mem_pool_trim_to(raw, 0);
            }
        }
    }

    /// The `CUdevice` of guest device ordinal `ordinal` (an argument, not the header's).
    fn gpu_of(&self, ordinal: u64) -> Result<i32, Fault> {
        self.gpu_index(ordinal).map(|(_, gpu)| gpu)
    }

    /// Guest device ordinal `ordinal` (an argument, not the header's) as an index, and its
    /// `CUdevice`.
    fn gpu_index(&self, ordinal: u64) -> Result<(usize, i32), Fault> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|d| Some((d, self.host.gpus.get(d)?.dev)))
            .ok_or(Fault::Status(status::INVALID_DEVICE))
    }

    // ----- several GPUs -----------------------------------------------------------------

    /// `PeerAccess`: the context on the request's device gains or loses access to the
    /// session's context on device args[0] (created if needed).
    fn peer_access(&mut self, req: &Request) -> OpResult {
        let [peer, enable, flags, ..] = req.header().args;
        let dev = self.device(req)?;
        let (peer, _) = self.gpu_index(peer)?;
        if flags != 0 || enable > 1 {
            return Err(status::INVALID_VALUE.into());
        }
        // As the runtime answers (measured: CUDA 13.0, driver 580, H100): a device and itself,
        // or a pair that cannot reach each other, is cudaErrorPeerAccessUnsupported.
        if peer == dev {
            return Err(status::PEER_ACCESS_UNSUPPORTED.into());
        }
        let (a, b) = (self.gpu_of(dev as u64)?, self.gpu_of(peer as u64)?);
        if enable == 1 && !self.drv.device_can_access_peer(a, b).map_err(on(dev))? {
            return Err(status::PEER_ACCESS_UNSUPPORTED.into());
        }
        let peer_ctx = self.bind(peer)?.ctx;
        self.bind(dev)?;
        self.drv
            .ctx_peer_access(peer_ctx, enable == 1)
            .map_err(on(dev))?;
        ok()
    }

    /// `MemcpyPeer`: both ranges checked on their own devices; `cuMemcpyPeerAsync` on the
    /// stream of the request's device.
    fn memcpy_peer(&mut self, req: &Request) -> OpResult {
        let [dst, dst_dev, src, src_dev, size, stream, ..] = req.header().args;
        let (dst_dev, _) = self.gpu_index(dst_dev)?;
        let (src_dev, _) = self.gpu_index(src_dev)?;
        let dst_ctx = self.bind(dst_dev)?.ctx;
        let src_ctx = self.bind(src_dev)?.ctx;
        // The copy may be issued to a stream of any device (p2pBandwidthLatencyTest does).
        let (dev, stream) = self.copy_stream(req, stream)?;
        if size == 0 {
            return ok();
        }
        self.check_range(dst_dev, dst, size)?;
        self.check_range(src_dev, src, size)?;
        self.drv
            .memcpy_peer(dst, dst_ctx, src, src_ctx, to_usize(size)?, stream)
            .map_err(on(dev))?;
        if req.header().flags & FLAG_ASYNC == 0 {
            self.drv.stream_synchronize(stream).map_err(on(dev))?;
        }
        ok()
    }

    // ----- memory pools -----------------------------------------------------------------

    /// The session's handle of the default pool of `dev` (context bound), made on first use.
    fn default_pool(&mut self, dev: usize) -> Result<u64, Fault> {
        if let Some(h) = self.context(dev)?.default_pool {
            return Ok(h);
        }
        let gpu = self.gpu_of(dev as u64)?;
        if !self.pools.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.mem_pool_default(gpu).map_err(on(dev))?;
        let h = self
            .pools
            .insert(
                &mut self.ids,
                PoolEntry {
                    dev,
                    raw,
                    default: true,
                },
            )
            .ok_or(status::MEMORY_ALLOCATION)?;
        self.context(dev)?.default_pool = Some(h);
        Ok(h)
    }

    /// A pool of the session, the context of its device bound.
    fn pool(&mut self, handle: u64) -> Result<(usize, MemPool), Fault> {
        let (dev, raw) = match self.pools.get(handle) {
            Some(p) => (p.dev, p.raw),
            None => return Err(status::INVALID_VALUE.into()),
        };
        self.bind(dev)?;
        Ok((dev, raw))
    }

    fn device_set_mem_pool(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let handle = req.header().args[0];
        let (pool_dev, raw, default) = match self.pools.get(handle) {
            Some(p) => (p.dev, p.raw, p.default),
            None => return Err(status::INVALID_VALUE.into()),
        };
        // A device's current pool must be one of its own.
        if pool_dev != dev {
            return Err(status::INVALID_VALUE.into());
        }
        let gpu = self.gpu_of(dev as u64)?;
        self.drv.device_set_mem_pool(gpu, raw).map_err(on(dev))?;
        self.context(dev)?.current_pool = (!default).then_some(handle);
        ok()
    }

    fn mem_pool_create(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let max_size = to_usize(req.header().args[0])?;
        let gpu = self.gpu_of(dev as u64)?;
        if !self.pools.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.mem_pool_create(gpu, max_size).map_err(on(dev))?;
        let entry = PoolEntry {
            dev,
            raw,
            default: false,
        };
        match self.pools.insert(&mut self.ids, entry) {
            Some(h) => ok_rets(&[h]),
            None => {
                let _ = self.drv.mem_pool_destroy(raw);
                Err(status::MEMORY_ALLOCATION.into())
            }
        }
    }

    fn mem_pool_destroy(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = self.pool(handle)?;
        if self.pools.get(handle).is_some_and(|p| p.default) {
            return Err(status::INVALID_VALUE.into());
        }
        // A destroyed current pool leaves its device with the default pool, as in CUDA.
        if self.context(dev)?.current_pool == Some(handle) {
            let default = self.default_pool(dev)?;
            if let Some(d) = self.pools.get(default).map(|p| p.raw) {
                let gpu = self.gpu_of(dev as u64)?;
                self.drv.device_set_mem_pool(gpu, d).map_err(on(dev))?;
            }
            self.context(dev)?.current_pool = None;
        }
        let result = self.drv.mem_pool_destroy(raw);
        self.pools.remove(handle);
        result.map_err(on(dev))?;
        ok()
    }

    fn mem_pool_attribute(&mut self, req: &Request) -> OpResult {
        let [handle, attr, value, ..] = req.header().args;
        let attr = u32::try_from(attr)
            .ok()
            .filter(|a| POOL_ATTRS.contains(&u64::from(*a)))
            .ok_or(status::INVALID_VALUE)?;
        let (dev, raw) = self.pool(handle)?;
        if req.op() == Op::MemPoolGetAttribute {
            let v = self
                .drv
                .mem_pool_get_attribute(raw, attr)
                .map_err(on(dev))?;
            return ok_rets(&[v]);
        }
        // Current reserved and used memory are read-only; the high watermarks may only be
        // reset (to 0).
        match attr {
            5 | 7 => return Err(status::INVALID_VALUE.into()),
            6 | 8 if value != 0 => return Err(status::INVALID_VALUE.into()),
            _ => {}
        }
        self.drv
            .mem_pool_set_attribute(raw, attr, value)
            .map_err(on(dev))?;
        ok()
    }

    fn mem_pool_set_access(&mut self, req: &Request) -> OpResult {
        let (dev, raw) = self.pool(req.header().args[0])?;
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        if !buf.len().is_multiple_of(8) || buf.len() / 8 > MAX_POOL_ACCESS {
            return Err(status::INVALID_VALUE.into());
        }
        let bytes = buf.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let mut access = Vec::with_capacity(bytes.len() / 8);
        for rec in bytes.chunks_exact(8) {
            let ordinal = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
            let flags = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
            if !matches!(flags, 0 | 1 | 3) {
                return Err(status::INVALID_VALUE.into());
            }
            let gpu = self
                .gpu_of(u64::from(ordinal))
                .map_err(|_| Fault::Status(status::INVALID_DEVICE))?;
            access.push((gpu, flags));
        }
        self.drv
            .mem_pool_set_access(raw, &access)
            .map_err(on(dev))?;
        ok()
    }

    /// `MallocAsync`: from the named pool, or the current pool of the stream's device. The
    /// allocation joins the table of the pool's device.
    fn malloc_async(&mut self, req: &Request) -> OpResult {
        let [size, stream, pool, ..] = req.header().args;
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(stream, dev)?;
        let (mem_dev, pool_raw) = if pool == 0 {
            let current = self.context(dev)?.current_pool;
            (dev, current.and_then(|h| self.pools.get(h)).map(|p| p.raw))
        } else {
            match self.pools.get(pool) {
                Some(p) => (p.dev, Some(p.raw)),
                None => return Err(status::INVALID_VALUE.into()),
            }
        };
        if size == 0 {
            // As cudaMalloc(&p, 0): success with a NULL pointer.
            return ok_rets(&[0]);
        }
        let bytes = to_usize(size)?;
        if mem_dev != dev {
            // The pool's device must have a context for the table the memory joins.
            self.bind(mem_dev)?;
            self.bind(dev)?;
        }
        if !self.context(mem_dev)?.memory.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let ptr = self
            .drv
            .mem_alloc_async(bytes, pool_raw, stream)
            .map_err(on(dev))?;
        let (drv, id) = (Arc::clone(&self.drv), self.id);
        let c = self.context(mem_dev)?;
        if let Err(e) = c.memory.insert_stream_ordered(ptr, size) {
            let _ = drv.mem_free_async(ptr, stream);
            if e == TableError::OverQuota {
                return Err(status::MEMORY_ALLOCATION.into());
            }
            warn!(
                session = id,
                dev,
                ptr,
                size,
                ?e,
                "driver returned an overlapping pool allocation"
            );
            return Err(status::UNKNOWN.into());
        }
        ok_rets(&[ptr])
    }

    /// `FreeAsync`: an allocation of the session on any device, freed in the stream's order.
    fn free_async(&mut self, req: &Request) -> OpResult {
        let [ptr, stream, ..] = req.header().args;
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(stream, dev)?;
        if ptr == 0 {
            return ok();
        }
        let owner = self
            .devices
            .iter()
            .position(|d| d.as_ref().is_some_and(|c| c.memory.is_allocation(ptr)));
        let Some(owner) = owner else {
            // A graph's allocation, freed outside the graph (see `free`).
            let graph_memory = self
                .devices
                .iter()
                .flatten()
                .any(|c| c.memory.is_graph_memory(ptr));
            if graph_memory {
                self.drv.mem_free_async(ptr, stream).map_err(on(dev))?;
                return ok();
            }
            return Err(status::INVALID_VALUE.into());
        };
        self.drv.mem_free_async(ptr, stream).map_err(on(dev))?;
        let _ = self.context(owner)?.memory.remove_allocation(ptr);
        ok()
    }

    /// `DeviceGetLimit` / `DeviceSetLimit`: `cuCtxGetLimit`/`SetLimit` in the session's context.
    fn limit(&mut self, req: &Request) -> OpResult {
        let [limit, value, ..] = req.header().args;
        let limit = u32::try_from(limit)
            .ok()
            // Every CUlimit of CUDA 13.0 (7-9 only the driver API names: shared memory size
            // and the CIG settings).
            .filter(|l| *l <= 9)
            .ok_or(status::UNSUPPORTED_LIMIT)?;
        let dev = self.bind_new(req)?;
        if req.op() == Op::DeviceSetLimit {
            self.drv
                .ctx_set_limit(limit, to_usize(value)?)
                .map_err(on(dev))?;
            return ok();
        }
        let v = self.drv.ctx_get_limit(limit).map_err(on(dev))?;
        ok_rets(&[v as u64])
    }

    // ----- memory -----------------------------------------------------------------------

    /// The stream for handle `handle` on `dev`: 0 is the legacy stream; others must be
    /// streams of this session on the same device.
    /// The device and stream a memory copy or memset runs on: a stream's own device (CUDA runs
    /// a copy issued to a stream of another device than the current one), or the current device
    /// and its null stream. Binds that device.
    fn copy_stream(&mut self, req: &Request, handle: u64) -> Result<(usize, Stream), Fault> {
        if handle == 0 {
            return Ok((self.bind_new(req)?, NULL_STREAM));
        }
        self.bound_stream(handle)
    }

    /// A session stream by handle (not the legacy stream) and its device, whose context it
    /// binds.
    fn bound_stream(&mut self, handle: u64) -> Result<(usize, Stream), Fault> {
        let (dev, raw) = self
            .streams
            .get(handle)
            .map(|s| (s.dev, s.raw))
            .ok_or(Fault::Status(status::INVALID_RESOURCE_HANDLE))?;
        self.bind(dev)?;
        Ok((dev, raw))
    }

    fn stream_on(&self, handle: u64, dev: usize) -> Result<Stream, Fault> {
        if handle == 0 {
            return Ok(NULL_STREAM);
        }
        match self.streams.get(handle) {
            Some(s) if s.dev == dev => Ok(s.raw),
            _ => Err(status::INVALID_RESOURCE_HANDLE.into()),
        }
    }

    fn malloc(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let size = req.header().args[0];
        if size == 0 {
            // cudaMalloc(&p, 0) succeeds with a NULL pointer.
            return ok_rets(&[0]);
        }
        let bytes = to_usize(size)?;
        let (drv, id) = (Arc::clone(&self.drv), self.id);
        let c = self.context(dev)?;
        if !c.memory.has_room() || !c.memory.quota_allows(size) {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let ptr = drv.mem_alloc(bytes).map_err(on(dev))?;
        if let Err(e) = c.memory.insert_allocation(ptr, size) {
            let _ = drv.mem_free(ptr);
            if e == TableError::OverQuota {
                // Another session of the VM took the rest meanwhile.
                return Err(status::MEMORY_ALLOCATION.into());
            }
            warn!(
                session = id,
                dev,
                ptr,
                size,
                ?e,
                "driver returned an overlapping allocation"
            );
            return Err(status::UNKNOWN.into());
        }
        ok_rets(&[ptr])
    }

    fn free(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let ptr = req.header().args[0];
        if ptr == 0 {
            return ok();
        }
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        if !c.memory.is_allocation(ptr) {
            // A graph's allocation (memory node) may be freed outside the graph, as CUDA
            // allows; the range stays the graph's, which allocates it again when it runs.
            if c.memory.is_graph_memory(ptr) {
                // cuMemFree refuses graph memory; the stream-ordered free on the legacy stream
                // takes it, and cudaFree returns once it is done.
                drv.mem_free_async(ptr, NULL_STREAM).map_err(on(dev))?;
                drv.ctx_synchronize().map_err(on(dev))?;
                return ok();
            }
            return Err(status::INVALID_VALUE.into());
        }
        drv.mem_free(ptr).map_err(on(dev))?;
        let _ = c.memory.remove_allocation(ptr);
        ok()
    }

    /// Checks that `[ptr, ptr + len)` is the session's memory on `dev`: device memory of its
    /// own, or guest memory it host-mapped (portable, so reachable from every device).
    /// `[ptr, ptr + len)` lies in one of the session's allocations on any of its devices
    /// (unified addressing lets the driver reach it from `dev`'s context, as NVIDIA's does for
    /// copies and memsets that name no device), or in host memory mapped for the device.
    fn check_range_any(&mut self, dev: usize, ptr: u64, len: u64) -> Result<(), Fault> {
        if self.check_range(dev, ptr, len).is_ok()
            || self
                .devices
                .iter()
                .flatten()
                .any(|c| c.memory.contains(ptr, len))
        {
            Ok(())
        } else {
            Err(status::INVALID_VALUE.into())
        }
    }

    fn check_range(&mut self, dev: usize, ptr: u64, len: u64) -> Result<(), Fault> {
        if self.context(dev)?.memory.contains(ptr, len)
            || self.host_memory.contains_device(ptr, len)
            || self.vmm.holds(ptr, len)
        {
            Ok(())
        } else {
            Err(status::INVALID_VALUE.into())
        }
    }

    /// `MemcpyMapped`: a copy between device-addressable ranges of the session (device memory
    /// or host-mapped guest memory), done by the driver in stream order. A waited-for request
    /// returns once the copy is complete, as `cudaMemcpy` does, unless its stream is capturing
    /// (the guest waits for every request during capture; the copy is captured, not run).
    fn memcpy_mapped(&mut self, req: &Request) -> OpResult {
        let Some((dev, stream, (dst, src, size))) = self.device_copy_setup(req)? else {
            return ok();
        };
        self.drv.memcpy(dst, src, size, stream).map_err(on(dev))?;
        if req.header().flags & FLAG_ASYNC == 0 && !self.is_capturing(stream) {
            self.drv.stream_synchronize(stream).map_err(on(dev))?;
        }
        ok()
    }

    /// `HostMap` (from qcuda.ko only): maps the guest runs of in-buffer 0 at guest address
    /// args[0] (args[1] bytes) and registers them in the context of the request's device.
    fn host_map(&mut self, req: &Request) -> OpResult {
        let [guest, len, flags, ..] = req.header().args;
        if flags & !HOST_MAP_FLAGS != 0 {
            return Err(status::INVALID_VALUE.into());
        }
        let table = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        host_mappings::check_range(guest, len).map_err(map_status)?;
        let bytes = table.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let runs = host_mappings::decode_runs(&bytes, len).map_err(map_status)?;
        let dev = self.bind_new(req)?;
        let drv = Arc::clone(&self.drv);
        let read_only = flags & HOST_MAP_READ_ONLY != 0;
        let mut failure = None;
        let mapped = self
            .host_memory
            .map(table.memory(), guest, len, &runs, dev, |local, len| {
                let size = usize::try_from(len).map_err(|_| MapError::Invalid)?;
                // SAFETY: `local..local + len` is mapped by the host-mapping table, which
                // unregisters it (`unmap`, `teardown`) before it unmaps it.
                if let Err(e) = unsafe { drv.mem_host_register(local, size, read_only) } {
                    failure = Some(e);
                    return Err(MapError::NoMemory);
                }
                drv.mem_host_device_pointer(local).map_err(|e| {
                    let _ = drv.mem_host_unregister(local);
                    failure = Some(e);
                    MapError::NoMemory
                })
            });
        match (mapped, failure) {
            (Ok(m), _) => ok_rets(&[m.dev_addr]),
            (Err(_), Some(err)) => Err(Fault::Driver { dev, err }),
            (Err(e), None) => Err(map_status(e).into()),
        }
    }

    /// Waits for the work the session has queued on device `dev` (bound), without disturbing
    /// a stream capture: while one of the session's streams is being captured (by another guest
    /// thread, say), `cuCtxSynchronize` would be illegal and would invalidate that capture, which
    /// CUDA does not do to a thread freeing host memory. Then every other stream of the session
    /// on the device, and the legacy stream unless it is tied to a capture, is waited for one by
    /// one; captured work has not run and needs no wait.
    fn wait_for_device_work(&self, dev: usize) {
        if !self.capture_under_way() {
            let _ = self.drv.ctx_synchronize();
            return;
        }
        for s in self.streams.values().filter(|s| s.dev == dev) {
            if !self.is_capturing(s.raw) {
                let _ = self.drv.stream_synchronize(s.raw);
            }
        }
        // The legacy stream waits for every blocking stream; while one of those is capturing,
        // asking about it fails (implicit capture) and it is left alone.
        if matches!(self.drv.stream_is_capturing(NULL_STREAM), Ok(false)) {
            let _ = self.drv.stream_synchronize(NULL_STREAM);
        }
    }

    /// `HostUnmap` (from qcuda.ko only): waits for the device's work (as `cudaFreeHost` and
    /// `cudaHostUnregister` do), unregisters and unmaps. The pages stay the guest's.
    fn host_unmap(&mut self, req: &Request) -> OpResult {
        let guest = req.header().args[0];
        let drv = Arc::clone(&self.drv);
        let devices: Vec<usize> = (0..self.devices.len()).collect();
        // Work still queued may read or write the memory: let it finish first. A failed or
        // corrupted context has nothing left running.
        if self.host.sticky_error().is_none() {
            for dev in devices {
                if matches!(self.devices.get(dev), Some(Some(_))) && self.bind(dev).is_ok() {
                    self.wait_for_device_work(dev);
                }
            }
        }
        let dev_ctx: Vec<Option<Context>> = self
            .devices
            .iter()
            .map(|d| d.as_ref().map(|c| c.ctx))
            .collect();
        self.host_memory
            .unmap(guest, |m| {
                if let Some(Some(ctx)) = dev_ctx.get(m.dev) {
                    if drv.ctx_set_current(*ctx).is_ok() {
                        let _ = drv.mem_host_unregister(m.local);
                    }
                }
            })
            .map_err(map_status)?;
        ok()
    }

    /// The staging buffer of `dev` if guest runs shorter than the direct threshold are to be
    /// copied; allocated on first need.
    fn staging_for<'c>(
        drv: &dyn DriverApi,
        c: &'c mut DeviceContext,
        half: usize,
        needed: bool,
    ) -> Option<&'c mut Staging> {
        if !needed {
            return None;
        }
        if matches!(c.staging, StagingState::NotYet) {
            c.staging = match Staging::create(drv, half) {
                Ok(s) => StagingState::Ready(s),
                Err(e) => {
                    debug!(error = ?e, "no pinned staging buffer; copying run by run");
                    StagingState::Unavailable
                }
            };
        }
        match &mut c.staging {
            StagingState::Ready(s) => Some(s),
            _ => None,
        }
    }

    /// Common part of HtoD and DtoH: binds, resolves the stream, checks the range, plans.
    fn copy_setup(
        &mut self,
        req: &Request,
        ptr: u64,
        stream: u64,
        buf: &GuestBuffer,
    ) -> Result<Option<(usize, Stream, Vec<copy::Step>)>, Fault> {
        let (dev, stream) = self.copy_stream(req, stream)?;
        if buf.is_empty() {
            return Ok(None);
        }
        self.check_range_any(dev, ptr, buf.len() as u64)?;
        let runs = copy::host_runs(buf).map_err(|_| status::INVALID_VALUE)?;
        let tuning = self.host.tuning;
        let small = copy::is_small(&runs);
        let needed = !small && runs.iter().any(|r| r.len < tuning.direct_min);
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        // Half 0 (no staging, as for small copies): every run direct (plan).
        let half =
            Self::staging_for(drv.as_ref(), c, tuning.staging_half, needed).map_or(0, |s| s.half());
        let steps = copy::plan(&runs, half, tuning.direct_min);
        let steps = if buf.len() <= copy::TINY_COPY {
            steps
        } else {
            self.ram.prepare(
                drv.as_ref(),
                buf.shared_memory(),
                steps,
                tuning.max_registered_ram,
            )
        };
        Ok(Some((dev, stream, steps)))
    }

    fn memcpy_htod(&mut self, req: &Request) -> OpResult {
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let dst = req.header().args[0];
        let Some((dev, stream, steps)) = self.copy_setup(req, dst, req.header().args[1], buf)?
        else {
            return ok();
        };
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        let staging = match &mut c.staging {
            StagingState::Ready(s) => Some(s),
            _ => None,
        };
        copy::to_device(drv.as_ref(), staging, dst, &steps, stream).map_err(on(dev))?;
        ok()
    }

    fn memcpy_dtoh(&mut self, req: &Request) -> OpResult {
        let buf = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let src = req.header().args[0];
        let Some((dev, stream, steps)) = self.copy_setup(req, src, req.header().args[1], buf)?
        else {
            return ok();
        };
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        let staging = match &mut c.staging {
            StagingState::Ready(s) => Some(s),
            _ => None,
        };
        copy::from_device(drv.as_ref(), staging, src, &steps, stream).map_err(on(dev))?;
        ok()
    }

    fn memcpy_dtod(&mut self, req: &Request) -> OpResult {
        let Some((dev, stream, (dst, src, size))) = self.device_copy_setup(req)? else {
            return ok();
        };
        self.drv
            .memcpy_dtod(dst, src, size, stream)
            .map_err(on(dev))?;
        ok()
    }

    /// Common part of the copies between two device addresses (args: destination, source,
    /// size, stream): binds, resolves the stream, checks both ranges. `None` for zero bytes.
    fn device_copy_setup(
        &mut self,
        req: &Request,
    ) -> Result<Option<(usize, Stream, DeviceCopy)>, Fault> {
        let [dst, src, size, stream, ..] = req.header().args;
        let (dev, stream) = self.copy_stream(req, stream)?;
        if size == 0 {
            return Ok(None);
        }
        self.check_range_any(dev, dst, size)?;
        self.check_range_any(dev, src, size)?;
        Ok(Some((dev, stream, (dst, src, to_usize(size)?))))
    }

    fn memset(&mut self, req: &Request) -> OpResult {
        let [dst, value, count, stream, width, ..] = req.header().args;
        let width = MemsetWidth::from_wire(width).ok_or(status::INVALID_VALUE)?;
        let (dev, stream) = self.copy_stream(req, stream)?;
        if count == 0 {
            return ok();
        }
        if dst % width.bytes() != 0 {
            return Err(status::INVALID_VALUE.into());
        }
        let size = count
            .checked_mul(width.bytes())
            .ok_or(status::INVALID_VALUE)?;
        self.check_range_any(dev, dst, size)?;
        // The element is the value's low bits (cudaMemset takes an int and uses its low byte).
        #[expect(clippy::cast_possible_truncation, reason = "32-bit elements at most")]
        let value = value as u32;
        self.drv
            .memset(dst, value, width, to_usize(count)?, stream)
            .map_err(on(dev))?;
        ok()
    }

    // ----- modules and launches -----------------------------------------------------------

    fn module_load(&mut self, req: &Request) -> OpResult {
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let dev = self.bind_new(req)?;
        let image = ModuleImage::from_guest(buf)?;
        let loaded: u64 = self.modules.values().map(|m| m.bytes).sum();
        let bytes = buf.len() as u64;
        if !self.modules.has_room()
            || loaded.saturating_add(bytes) > self.host.tuning.max_module_bytes
        {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.module_load(image.as_bytes()).map_err(on(dev))?;
        debug!(session = self.id, dev, kind = ?image.kind(), len = buf.len(), "module loaded");
        let handle = self
            .modules
            .insert(&mut self.ids, ModuleEntry { dev, raw, bytes })
            .ok_or(status::MEMORY_ALLOCATION)?;
        ok_rets(&[handle])
    }

    fn module_unload(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = match self.modules.get(handle) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        self.bind(dev)?;
        let result = self.drv.module_unload(raw);
        // Forget the module even if the driver objected: its handle is no longer usable.
        self.modules.remove(handle);
        self.functions.retain(|f| f.module != handle);
        self.context(dev)?.memory.remove_module(handle);
        result.map_err(on(dev))?;
        ok()
    }

    /// `Link`: the driver's JIT linker over the guest's inputs. A link the driver refuses is
    /// answered in rets[3] (its `CUresult`) with its error log in the out-buffer, as
    /// `cuLinkComplete` reports it, rather than as a failed request.
    fn link(&mut self, req: &Request) -> OpResult {
        /// The `CUjit_option`s that carry a plain value: every other one is a pointer or an
        /// output, which the guest keeps (its log buffers, the wall time) or refuses.
        const VALUE_OPTIONS: &[u32] = &[
            0, 1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 23, 24, 29, 30, 31, 32, 33,
        ];
        const MAX_OPTIONS: usize = 64;
        const MAX_INPUTS: usize = 1024;
        let input = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let dev = self.bind_new(req)?;
        if input.len() as u64 > self.host.tuning.max_module_bytes {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let bytes = input.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let request = LinkRequest::decode(&bytes).ok_or(status::INVALID_VALUE)?;
        let options: Vec<(u32, u64)> = request.options().map(|o| (o.id, o.value)).collect();
        if options.len() > MAX_OPTIONS
            || options.iter().any(|(id, _)| !VALUE_OPTIONS.contains(id))
            || request.input_count() > MAX_INPUTS
        {
            return Err(status::INVALID_VALUE.into());
        }
        let mut names = Vec::with_capacity(request.input_count());
        for i in request.inputs() {
            if i.kind >= LINK_INPUT_TYPES || i.name.len() > MAX_NAME_LEN || i.data.is_empty() {
                return Err(status::INVALID_VALUE.into());
            }
            names.push(CString::new(i.name).map_err(|_| status::INVALID_VALUE)?);
        }
        let inputs: Vec<(u32, &std::ffi::CStr, &[u8])> = request
            .inputs()
            .zip(&names)
            .map(|(i, n)| (i.kind, n.as_c_str(), i.data))
            .collect();
        let (code, parts) = match self.drv.link(&options, &inputs) {
            Ok(o) => (0, [o.image, o.info_log, o.error_log]),
            Err((e, log)) => (u64::from(e.0), [Vec::new(), Vec::new(), log]),
        };
        debug!(session = self.id, dev, inputs = inputs.len(), code, "link");
        let total: usize = parts.iter().map(Vec::len).sum();
        if total <= out.len() {
            let mut at = 0;
            for p in &parts {
                out.write_at(at, p).map_err(|_| status::INVALID_VALUE)?;
                at += p.len();
            }
        }
        ok_rets(&[
            parts[0].len() as u64,
            parts[1].len() as u64,
            parts[2].len() as u64,
            code,
        ])
    }

    fn module_function_names(&mut self, req: &Request) -> OpResult {
        let (dev, module) = match self.modules.get(req.header().args[0]) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        self.bind(dev)?;
        let names = self.drv.module_function_names(module).map_err(on(dev))?;
        let bytes: Vec<u8> = names
            .iter()
            .flat_map(|n| n.as_bytes_with_nul().iter().copied())
            .collect();
        if bytes.len() <= out.len() {
            out.write_at(0, &bytes).map_err(|_| status::INVALID_VALUE)?;
        }
        ok_rets(&[names.len() as u64, bytes.len() as u64])
    }

    fn module_get_function(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let (dev, module) = match self.modules.get(handle) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        let name = symbol_name(req.inputs().first().ok_or(status::INVALID_VALUE)?)?;
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        self.bind(dev)?;
        let raw = self.drv.module_function(module, &name).map_err(on(dev))?;
        let (fh, layout) = match self.functions.find(|f| f.module == handle && f.raw == raw) {
            Some((fh, f)) => (fh, f.layout.clone()),
            None => {
                if !self.functions.has_room() {
                    return Err(status::MEMORY_ALLOCATION.into());
                }
                let layout = self.param_layout(dev, raw)?;
                let entry = FunctionEntry {
                    dev,
                    module: handle,
                    raw,
                    layout: layout.clone(),
                };
                let fh = self
                    .functions
                    .insert(&mut self.ids, entry)
                    .ok_or(status::MEMORY_ALLOCATION)?;
                (fh, layout)
            }
        };
        let fit = out.len() / PARAM_INFO_SIZE;
        let mut records = Vec::with_capacity(fit.min(layout.params().len()) * PARAM_INFO_SIZE);
        for p in layout.params().iter().take(fit) {
            records.extend_from_slice(&p.encode());
        }
        out.write_at(0, &records)
            .map_err(|_| status::INVALID_VALUE)?;
        ok_rets(&[fh, layout.params().len() as u64])
    }

    /// Asks the driver where each parameter of `func` sits, until it says there is no more.
    fn param_layout(&self, dev: usize, func: Function) -> Result<ParamLayout, Fault> {
        let mut pairs = Vec::new();
        let mut loaded = false;
        while pairs.len() < MAX_PARAMS {
            match self.drv.function_param_info(func, pairs.len()) {
                Ok(p) => pairs.push(p),
                Err(CuError::INVALID_VALUE) => {
                    return ParamLayout::new(&pairs).ok_or(Fault::Status(status::UNKNOWN));
                }
                Err(CuError::FUNCTION_NOT_LOADED) if !loaded => {
                    // A lazily loaded module: load the function, then ask again.
                    self.drv.function_load(func).map_err(on(dev))?;
                    loaded = true;
                }
                Err(err) => return Err(Fault::Driver { dev, err }),
            }
        }
        warn!(
            session = self.id,
            "cuFuncGetParamInfo never reported the end of the list"
        );
        Err(status::UNKNOWN.into())
    }

    fn module_get_global(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let (dev, module) = match self.modules.get(handle) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        let name = symbol_name(req.inputs().first().ok_or(status::INVALID_VALUE)?)?;
        self.bind(dev)?;
        let (ptr, size) = self.drv.module_global(module, &name).map_err(on(dev))?;
        if size > 0 {
            if let Err(e) = self.context(dev)?.memory.insert_global(ptr, size, handle) {
                warn!(
                    session = self.id,
                    ptr,
                    size,
                    ?e,
                    "module global not registered"
                );
            }
        }
        ok_rets(&[ptr, size])
    }

    fn launch_kernel(&mut self, req: &Request) -> OpResult {
        let args = &req.header().args;
        let (dev, raw, layout) = match self.functions.get(args[0]) {
            Some(f) => (f.dev, f.raw, f.layout.clone()),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        self.bind(dev)?;
        let cfg = LaunchConfig::decode(args)?;
        let limits = self
            .host
            .gpus
            .get(dev)
            .ok_or(status::INVALID_DEVICE)?
            .limits;
        cfg.check(&limits)?;
        let stream = self.stream_on(args[5], dev)?;
        let block_buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        // Exactly the kernel's parameter block: guest-lib packs it to that length, and a block
        // of another size means the caller has the kernel's signature wrong.
        if block_buf.len() != layout.block_len() {
            return Err(status::INVALID_VALUE.into());
        }
        let mut block = AlignedBytes::zeroed(layout.block_len());
        block_buf
            .read_at(0, block.as_mut_slice())
            .map_err(|_| status::INVALID_VALUE)?;
        let mut params = layout.pointers(&mut block).ok_or(status::INVALID_VALUE)?;
        // SAFETY: `params` holds one pointer per kernel parameter (the driver's own layout for
        // this function), each into `block`, which is at least `block_len` long and outlives
        // the call; the driver copies the values before returning.
        if req.op() == Op::LaunchKernelEx {
            if args[6] != 0 {
                return Err(status::INVALID_VALUE.into());
            }
            let buf = req.inputs().get(1).ok_or(status::INVALID_VALUE)?;
            let attrs = launch_attrs(buf, &self.events, dev)?;
            // SAFETY: as above; `attrs` outlive the call.
            unsafe { self.drv.launch_ex(raw, &cfg, stream, &mut params, &attrs) }
                .map_err(on(dev))?;
            self.host.count_kernel();
            return ok();
        }
        let launched = match args[6] {
            // SAFETY: as above.
            0 => unsafe { self.drv.launch(raw, &cfg, stream, &mut params) },
            // SAFETY: as above.
            LAUNCH_COOPERATIVE => unsafe {
                self.drv.launch_cooperative(raw, &cfg, stream, &mut params)
            },
            _ => return Err(status::INVALID_VALUE.into()),
        };
        launched.map_err(on(dev))?;
        self.host.count_kernel();
        ok()
    }

    /// A function of the session, its context bound.
    fn function(&mut self, handle: u64) -> Result<(usize, Function), Fault> {
        let (dev, raw) = match self.functions.get(handle) {
            Some(f) => (f.dev, f.raw),
            None => return Err(status::INVALID_DEVICE_FUNCTION.into()),
        };
        self.bind(dev)?;
        Ok((dev, raw))
    }

    fn func_attributes(&mut self, req: &Request) -> OpResult {
        let (dev, raw) = self.function(req.header().args[0])?;
        let drv = Arc::clone(&self.drv);
        attribute_table(req, |attr| drv.func_attribute(raw, attr).map_err(on(dev)))
    }

    fn func_set_attribute(&mut self, args: &[u64]) -> OpResult {
        let (dev, raw) = self.function(args[0])?;
        let attr = i32::try_from(args[1]).map_err(|_| status::INVALID_VALUE)?;
        let value = priority(args[2])?;
        self.drv
            .func_set_attribute(raw, attr, value)
            .map_err(on(dev))?;
        ok()
    }

    /// `OccupancyCluster`: cluster occupancy of a launch configuration with attributes.
    fn occupancy_cluster(&mut self, req: &Request) -> OpResult {
        let args = &req.header().args;
        let (dev, raw) = self.function(args[0])?;
        let cfg = LaunchConfig::decode(args)?;
        let active = match args[6] {
            0 => false,
            1 => true,
            _ => return Err(status::INVALID_VALUE.into()),
        };
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let attrs = launch_attrs(buf, &self.events, dev)?;
        let n = self
            .drv
            .occupancy_cluster(raw, &cfg, &attrs, active)
            .map_err(on(dev))?;
        #[expect(
            clippy::cast_sign_loss,
            reason = "a cluster count, never negative; sign-extended as it always was"
        )]
        let n = n as u64;
        ok_rets(&[n])
    }

    fn occupancy(&mut self, args: &[u64]) -> OpResult {
        let (dev, raw) = self.function(args[0])?;
        let block = i32::try_from(args[1]).map_err(|_| status::INVALID_VALUE)?;
        let flags = u32::try_from(args[3])
            .ok()
            .filter(|f| *f <= 1)
            .ok_or(status::INVALID_VALUE)?;
        let n = self
            .drv
            .occupancy_max_active_blocks(raw, block, to_usize(args[2])?, flags)
            .map_err(on(dev))?;
        #[expect(
            clippy::cast_sign_loss,
            reason = "a block count, never negative; sign-extended as it always was"
        )]
        let n = n as u64;
        ok_rets(&[n])
    }

    // ----- streams and events -------------------------------------------------------------

    fn stream_create(&mut self, req: &Request) -> OpResult {
        let flags = flags_u32(req.header().args[0], STREAM_NON_BLOCKING)?;
        let prio = priority(req.header().args[1])?;
        let dev = self.bind_new(req)?;
        if !self.streams.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.stream_create(flags, prio).map_err(on(dev))?;
        let got = match self.drv.stream_priority(raw) {
            Ok(p) => p,
            Err(err) => {
                let _ = self.drv.stream_destroy(raw);
                return Err(Fault::Driver { dev, err });
            }
        };
        let handle = self
            .streams
            .insert(&mut self.ids, StreamEntry { dev, raw })
            .ok_or(status::MEMORY_ALLOCATION)?;
        ok_rets(&[handle, int_ret(got)])
    }

    fn stream_destroy(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = match self.streams.get(handle) {
            Some(s) => (s.dev, s.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        self.bind(dev)?;
        let result = self.drv.stream_destroy(raw);
        self.streams.remove(handle);
        result.map_err(on(dev))?;
        ok()
    }

    /// StreamSynchronize and StreamQuery. Handle 0 is the legacy stream of the request's
    /// device.
    fn stream_wait(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let (dev, raw) = if handle == 0 {
            let dev = self.device(req)?;
            if !self.bind_existing(dev)? {
                return ok();
            }
            (dev, NULL_STREAM)
        } else {
            let (dev, raw) = match self.streams.get(handle) {
                Some(s) => (s.dev, s.raw),
                None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
            };
            self.bind(dev)?;
            (dev, raw)
        };
        if req.op() == Op::StreamQuery {
            self.drv.stream_query(raw).map_err(on(dev))?;
        } else {
            self.drv.stream_synchronize(raw).map_err(on(dev))?;
        }
        ok()
    }

    fn event(&self, handle: u64) -> Result<(usize, Event), Fault> {
        self.events
            .get(handle)
            .map(|e| (e.dev, e.raw))
            .ok_or(Fault::Status(status::INVALID_RESOURCE_HANDLE))
    }

    /// The event may belong to another device than the stream: waiting on it is how CUDA
    /// programs order work across devices.
    fn stream_wait_event(&mut self, req: &Request) -> OpResult {
        let args = &req.header().args;
        let (_, event) = self.event(args[1])?;
        let flags = flags_u32(args[2], EVENT_WAIT_FLAGS)?;
        let (dev, stream) = self.copy_stream(req, args[0])?;
        self.drv
            .stream_wait_event(stream, event, flags)
            .map_err(on(dev))?;
        ok()
    }

    fn event_create(&mut self, req: &Request) -> OpResult {
        let flags = flags_u32(req.header().args[0], EVENT_FLAGS)?;
        let dev = self.bind_new(req)?;
        if !self.events.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.event_create(flags).map_err(on(dev))?;
        let handle = self
            .events
            .insert(&mut self.ids, EventEntry { dev, raw })
            .ok_or(status::MEMORY_ALLOCATION)?;
        ok_rets(&[handle])
    }

    fn event_destroy(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = self.event(handle)?;
        self.bind(dev)?;
        let result = self.drv.event_destroy(raw);
        self.events.remove(handle);
        result.map_err(on(dev))?;
        ok()
    }

    fn event_record(&mut self, args: &[u64]) -> OpResult {
        let (dev, event) = self.event(args[0])?;
        let stream = self.stream_on(args[1], dev)?;
        self.bind(dev)?;
        self.drv.event_record(event, stream).map_err(on(dev))?;
        ok()
    }

    /// EventSynchronize and EventQuery.
    fn event_wait(&mut self, req: &Request) -> OpResult {
        let (dev, event) = self.event(req.header().args[0])?;
        self.bind(dev)?;
        if req.op() == Op::EventQuery {
            self.drv.event_query(event).map_err(on(dev))?;
        } else {
            self.drv.event_synchronize(event).map_err(on(dev))?;
        }
        ok()
    }

    /// Batch: each record runs as the fire-and-forget request it stands for; a waited batch
    /// may end with a synchronising record (`BATCH_TAIL`), which runs waited and answers for
    /// the batch. The records are read from a private copy of the buffer, so their shape
    /// cannot change while they run; in-data is read from guest memory as a single request's
    /// would be.
    fn batch(&mut self, req: &Request) -> OpResult {
        let input = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let bytes = input.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let count = req.header().args[0];
        let waited = req.header().flags & FLAG_ASYNC == 0;
        let mut at = 0usize;
        let mut first_failure = status::SUCCESS;
        for i in 0..count {
            let (op, rec) = match BatchRecord::decode(bytes.get(at..).unwrap_or_default()) {
                Ok(r) => r,
                Err(e) => {
                    warn!(
                        session = self.id,
                        ?e,
                        at,
                        "batch record refused; the rest dropped"
                    );
                    return Err(status::INVALID_VALUE.into());
                }
            };
            let tail = BATCH_TAIL.contains(&op);
            if tail && !(waited && i + 1 == count) {
                warn!(
                    session = self.id,
                    ?op,
                    at,
                    "a synchronising record not at the end of a waited batch; the rest dropped"
                );
                return Err(status::INVALID_VALUE.into());
            }
            let data_at = at + BATCH_RECORD_SIZE;
            let data_len = rec.in_len as usize;
            if data_at + data_len > bytes.len() {
                return Err(status::INVALID_VALUE.into());
            }
            let mut header = RequestHeader::new(op);
            header.flags = if tail { 0 } else { FLAG_ASYNC };
            header.session = req.header().session;
            header.device = rec.device;
            header.args = rec.args;
            let mut inputs = Vec::new();
            if op.shape().0 == 1 {
                header
                    .push_buffer(Direction::In, rec.in_len.into())
                    .map_err(|_| status::INVALID_VALUE)?;
                inputs.push(
                    input
                        .slice(data_at, data_len)
                        .map_err(|_| status::INVALID_VALUE)?,
                );
            }
            // Batch records take at most one In buffer and no Out buffer, so this holds.
            let sub =
                Request::new(header, inputs, Vec::new()).map_err(|_| status::INVALID_VALUE)?;
            let mut resp = self.execute(&sub);
            if tail {
                // The synchronising call answers; what failed before it is reported with it,
                // as the next waited-for request would report it.
                if first_failure != status::SUCCESS {
                    resp.set_deferred_error(first_failure);
                }
                return Ok(resp);
            }
            if resp.status != status::SUCCESS && first_failure == status::SUCCESS {
                first_failure = resp.status;
            }
            if is_sticky(resp.status) {
                // The context is lost: what follows cannot run.
                break;
            }
            at += rec.footprint();
        }
        if first_failure != status::SUCCESS {
            return Err(first_failure.into());
        }
        ok()
    }

    /// StreamSetAttribute: the attributes a stream has (a subset of the launch attributes),
    /// laid out by the launch-attribute rules (`launch.rs`).
    fn stream_set_attribute(&mut self, req: &Request) -> OpResult {
        let bytes = req
            .inputs()
            .first()
            .ok_or(status::INVALID_VALUE)?
            .to_vec()
            .map_err(|_| status::INVALID_VALUE)?;
        let a = LaunchAttr::decode(&bytes).map_err(|_| status::INVALID_VALUE)?;
        if !STREAM_ATTRIBUTES.contains(&a.id) {
            return Err(status::INVALID_VALUE.into());
        }
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(req.header().args[0], dev)?;
        let value = DriverLaunchAttr::from_wire(&a, |_| None)?.value;
        self.drv
            .stream_set_attribute(stream, a.id, &value)
            .map_err(on(dev))?;
        ok()
    }

    /// StreamGetAttribute: the value back as a wire record.
    fn stream_get_attribute(&mut self, req: &Request) -> OpResult {
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let id = u32::try_from(req.header().args[1]).map_err(|_| status::INVALID_VALUE)?;
        if !STREAM_ATTRIBUTES.contains(&id) || out.len() < LAUNCH_ATTR_SIZE {
            return Err(status::INVALID_VALUE.into());
        }
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(req.header().args[0], dev)?;
        let v = self.drv.stream_get_attribute(stream, id).map_err(on(dev))?;
        let u32_at = |at: usize| u32::from_le_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
        let u64_at = |at: usize| u64::from(u32_at(at)) | u64::from(u32_at(at + 4)) << 32;
        let mut rec = LaunchAttr {
            id,
            ..LaunchAttr::default()
        };
        match id {
            1 => {
                rec.w = [u64_at(0), u64_at(8)];
                rec.v = [u32_at(16), u32_at(20), u32_at(24)];
            }
            9 => rec.v = [u32::from(v[0]), u32::from(v[1]), 0],
            _ => rec.v[0] = u32_at(0),
        }
        out.write_at(0, &rec.encode())
            .map_err(|_| status::INVALID_VALUE)?;
        ok()
    }

    /// LaunchHostFunc: the guest's function runs in the guest when the stream reaches it (see
    /// host_functions.rs).
    fn launch_host_func(&mut self, req: &Request) -> OpResult {
        let key = req.header().args[1];
        if key == 0 {
            return Err(status::INVALID_VALUE.into());
        }
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(req.header().args[0], dev)?;
        if !self.host_functions.linked() {
            warn!(
                session = self.id,
                "host function launched without a host-function link"
            );
            return Err(status::NOT_SUPPORTED.into());
        }
        let capturing = self.drv.stream_is_capturing(stream).map_err(on(dev))?;
        let call = self
            .host_functions
            .call(key, !capturing)
            .ok_or(status::MEMORY_ALLOCATION)?;
        // SAFETY: a one-shot call lives until its run frees it; a captured one until the
        // session ends, after its contexts (and so its graphs) are destroyed.
        match unsafe { self.drv.launch_host_func(stream, trampoline, call) } {
            Ok(()) => {
                if capturing {
                    self.captured_calls.push(call as usize);
                }
                ok_rets(&[u64::from(capturing)])
            }
            Err(e) => {
                // SAFETY: the driver refused it, so it will never run.
                unsafe { HostFunctions::free(call) };
                Err(on(dev)(e))
            }
        }
    }

    fn event_elapsed(&mut self, args: &[u64]) -> OpResult {
        let (dev, start) = self.event(args[0])?;
        let (end_dev, end) = self.event(args[1])?;
        if dev != end_dev {
            return Err(status::INVALID_RESOURCE_HANDLE.into());
        }
        self.bind(dev)?;
        let ms = self.drv.event_elapsed(start, end).map_err(on(dev))?;
        ok_rets(&[u64::from(ms.to_bits())])
    }
}

impl Drop for CudaSession {
    /// Frees everything the session owns on the GPU by destroying its contexts.
    fn drop(&mut self) {
        // Mappings first: their memory may be another context's.
        self.vmm.release_all(self.drv.as_ref());
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

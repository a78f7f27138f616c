//! The driver boundary: every CUDA driver call the executor makes, as one trait.
//!
//! [`CudaDriver`] implements it over cudarc's `sys` layer with dynamic loading; the unit tests
//! implement it with a fake device (`fake.rs`, `fake_arrays.rs`, `fake_graphs.rs`), so the
//! session logic is tested on machines without a GPU. Driver objects cross the boundary as typed handles ([`Context`],
//! [`Module`], [`Function`], [`Stream`], [`Event`], [`MemPool`]) that only the driver layer
//! makes, so passing one kind where the driver expects another (a stream for an event, say)
//! does not compile. They are never shown to the guest, only stored in the session's tables.
//! Graphs and arrays have handles of their own (`graph.rs`, `array.rs`). Everything that
//! talks to libcuda or stands in for it lives in this folder, and only code here can make a
//! handle from a raw value or look inside one.
//!
//! Files, from the bottom: `handles.rs` (the typed handles), `error.rs` ([`CuError`]),
//! `library.rs` (the driver, loaded, and [`NoDriver`]); `array.rs`, `graph.rs`, `vmm.rs` (the
//! array, graph and VMM calls, each a supertrait of [`DriverApi`] with both implementations);
//! this file (the other calls, and the trait that joins them).
//!
//! The `sys` layer is used rather than cudarc's `result` layer because cudarc resolves each
//! symbol on first call and panics if it is missing. [`CudaDriver::load`] therefore checks, by
//! name, every symbol the layer calls (a unit test in each file keeps its list, here
//! [`REQUIRED_SYMBOLS`], in step with its calls), and a driver lacking one is reported as too
//! old instead of panicking later.
//!
//! # Contract for callers
//! Handles passed to a method must have come from the same driver and not have been destroyed,
//! and the context they belong to must be current on the calling thread
//! ([`DriverApi::ctx_set_current`]). The session tables uphold this: they are the only source
//! of handles, and an object leaves its table when it or its context is destroyed. A handle of
//! another context is an error the driver reports, not undefined behaviour.

use std::{
    ffi::{c_char, c_int, c_void, CStr},
    mem::MaybeUninit,
    ptr::null_mut,
};

use cudarc::driver::sys;
use tracing::debug;

use self::{
    array::{ArrayDriverApi, ARRAY_SYMBOLS},
    graph::{GraphDriverApi, GRAPH_SYMBOLS},
    host_facts::HostFactsDriverApi,
    jit_logs::JitLogDriverApi,
    node_attrs::{NodeAttrDriverApi, NODE_ATTR_SYMBOLS},
    tensor_maps::{TensorMapDriverApi, TENSOR_MAP_SYMBOLS},
    vmm::{mem_location, VmmDriverApi, VMM_SYMBOLS},
};
pub(crate) use self::{
    error::{check, CuError, CuResult},
    handles::{ptr, Context, Event, Function, MemPool, Module, Raw, Stream, NULL_STREAM},
    library::{CudaDriver, DriverLoad, NoDriver},
};
use super::launch::{DriverLaunchAttr, LaunchConfig};

pub(crate) mod array;
mod error;
pub(crate) mod graph;
mod handles;
pub(crate) mod host_facts;
pub(crate) mod jit_logs;
mod library;
pub(crate) mod node_attrs;
pub(crate) mod tensor_maps;
// Used by the session's VMM ops and by host-side placement of a session's memory.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod vmm;

// The test double also serves the fuzz targets (fuzz/, feature `fuzzing`) and the daemon built
// for the pre-copy test without a GPU (feature `test-double-driver`), never the binary that ships.
#[cfg(any(test, feature = "fuzzing", feature = "test-double-driver"))]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod fake;
#[cfg(any(test, feature = "fuzzing", feature = "test-double-driver"))]
#[cfg_attr(not(test), allow(dead_code))]
mod fake_graphs;

// The driver reads `DriverLaunchAttr` arrays as `CUlaunchAttribute` arrays.
const _: () = {
    assert!(size_of::<DriverLaunchAttr>() == size_of::<sys::CUlaunchAttribute>());
    assert!(align_of::<DriverLaunchAttr>() == align_of::<sys::CUlaunchAttribute>());
};

/// What the driver's JIT linker made of a link (`cuLinkComplete`) and what it said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkOutput {
    /// The linked image (a cubin).
    pub image: Vec<u8>,
    /// The info log, without its NUL.
    pub info_log: Vec<u8>,
    /// The error log, without its NUL.
    pub error_log: Vec<u8>,
}

/// The element width of a memset (`cuMemsetD8`/`D16`/`D32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemsetWidth {
    /// Bytes.
    W8,
    /// 16-bit elements.
    W16,
    /// 32-bit elements.
    W32,
}

impl MemsetWidth {
    /// The width for a wire value (0 or 1: bytes, 2, 4).
    pub fn from_wire(w: u64) -> Option<Self> {
        match w {
            0 | 1 => Some(Self::W8),
            2 => Some(Self::W16),
            4 => Some(Self::W32),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Self::W8 => 1,
            Self::W16 => 2,
            Self::W32 => 4,
        }
    }
}

/// The driver calls the executor makes. See the module documentation for the handle contract.
pub(crate) trait DriverApi:
    ArrayDriverApi
    + GraphDriverApi
    + HostFactsDriverApi
    + JitLogDriverApi
    + NodeAttrDriverApi
    + TensorMapDriverApi
    + VmmDriverApi
    + Send
    + Sync
{
    /// cuDeviceGetCount.
    fn device_count(&self) -> CuResult<i32>;
    /// cuDeviceGet: the `CUdevice` of ordinal `ordinal`.
    fn device_get(&self, ordinal: i32) -> CuResult<i32>;
    /// cuDeviceGetName.
    fn device_name(&self, dev: i32) -> CuResult<Vec<u8>>;
    /// cuDeviceGetUuid.
    fn device_uuid(&self, dev: i32) -> CuResult<[u8; 16]>;
    /// cuDeviceTotalMem.
    fn device_total_mem(&self, dev: i32) -> CuResult<u64>;
    /// cuDeviceGetAttribute with any attribute id (unknown ids are the driver's
    /// CUDA_ERROR_INVALID_VALUE).
    fn device_attribute(&self, dev: i32, attr: i32) -> CuResult<i32>;

    /// cuCtxCreate: a new context on `dev`. The calling thread's current context is left as it
    /// was.
    fn ctx_create(&self, dev: i32) -> CuResult<Context>;
    /// cuCtxDestroy: frees everything the context owns.
    fn ctx_destroy(&self, ctx: Context) -> CuResult<()>;
    /// cuCtxSetCurrent.
    fn ctx_set_current(&self, ctx: Context) -> CuResult<()>;
    /// cuCtxSynchronize.
    fn ctx_synchronize(&self) -> CuResult<()>;
    /// cuCtxGetLimit of limit `limit` (a `CUlimit`, 0..=6) in the current context.
    fn ctx_get_limit(&self, limit: u32) -> CuResult<usize>;
    /// cuCtxSetLimit.
    fn ctx_set_limit(&self, limit: u32, value: usize) -> CuResult<()>;

    /// cuMemGetInfo: (free, total).
    fn mem_get_info(&self) -> CuResult<(u64, u64)>;
    /// cuMemAlloc.
    fn mem_alloc(&self, size: usize) -> CuResult<u64>;
    /// cuMemFree.
    fn mem_free(&self, ptr: u64) -> CuResult<()>;
    /// cuMemAllocHost: pinned host memory of the current context.
    fn mem_alloc_host(&self, size: usize) -> CuResult<Raw>;
    /// cuMemcpyHtoDAsync.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes until `stream` has been synchronised.
    unsafe fn memcpy_htod(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: Stream,
    ) -> CuResult<()>;
    /// cuMemcpyDtoHAsync.
    ///
    /// # Safety
    /// `dst` must be writable for `len` bytes, and not otherwise accessed, until `stream` has
    /// been synchronised.
    unsafe fn memcpy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Stream,
    ) -> CuResult<()>;
    /// cuMemcpyDtoDAsync.
    fn memcpy_dtod(&self, dst: u64, src: u64, len: usize, stream: Stream) -> CuResult<()>;
    /// cuMemsetD8Async, cuMemsetD16Async or cuMemsetD32Async: `count` elements of `width`.
    fn memset(
        &self,
        dst: u64,
        value: u32,
        width: MemsetWidth,
        count: usize,
        stream: Stream,
    ) -> CuResult<()>;
    /// cuMemcpyAsync between two device-addressable ranges (device memory or registered host
    /// memory, by unified address).
    fn memcpy(&self, dst: u64, src: u64, len: usize, stream: Stream) -> CuResult<()>;
    /// cuMemHostRegister (portable, device-mapped; read-only if asked) of `ptr..ptr + len`.
    ///
    /// # Safety
    /// The range must be mapped in this process, and stay mapped until it is unregistered.
    unsafe fn mem_host_register(&self, ptr: u64, len: usize, read_only: bool) -> CuResult<()>;
    /// cuMemHostUnregister.
    fn mem_host_unregister(&self, ptr: u64) -> CuResult<()>;
    /// cuMemHostGetDevicePointer: the device address of registered host memory at `ptr`.
    fn mem_host_device_pointer(&self, ptr: u64) -> CuResult<u64>;

    /// cuModuleLoadData. `image` is a checked image ending in a NUL byte.
    fn module_load(&self, image: &[u8]) -> CuResult<Module>;
    /// cuModuleUnload.
    fn module_unload(&self, module: Module) -> CuResult<()>;
    /// cuModuleGetFunction.
    fn module_function(&self, module: Module, name: &CStr) -> CuResult<Function>;
    /// cuModuleGetGlobal: (device address, size).
    fn module_global(&self, module: Module, name: &CStr) -> CuResult<(u64, u64)>;
    /// The names of a module's kernels (cuModuleGetFunctionCount, cuModuleEnumerateFunctions,
    /// cuFuncGetName), in the driver's order.
    fn module_function_names(&self, module: Module) -> CuResult<Vec<std::ffi::CString>>;
    /// cuLinkCreate with `options` (value options only; the linker's logs are this call's),
    /// cuLinkAddData for each `(CUjitInputType, name, image)`, cuLinkComplete, cuLinkDestroy.
    /// On failure the error log comes with the error.
    fn link(
        &self,
        options: &[(u32, u64)],
        inputs: &[(u32, &CStr, &[u8])],
    ) -> Result<LinkOutput, (CuError, Vec<u8>)>;
    /// cuFuncLoad (for lazily loaded modules).
    fn function_load(&self, func: Function) -> CuResult<()>;
    /// cuFuncGetParamInfo: (offset, size) of parameter `index`; CUDA_ERROR_INVALID_VALUE
    /// past the last one.
    fn function_param_info(&self, func: Function, index: usize) -> CuResult<(usize, usize)>;
    /// cuLaunchKernel.
    ///
    /// # Safety
    /// `params` has one pointer per kernel parameter, each readable for that parameter's
    /// size for the duration of the call.
    unsafe fn launch(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> CuResult<()>;

    /// cuLaunchCooperativeKernel: as [`DriverApi::launch`], every block resident at once.
    ///
    /// # Safety
    /// As for [`DriverApi::launch`].
    unsafe fn launch_cooperative(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> CuResult<()>;

    /// cuLaunchKernelEx with launch attributes.
    ///
    /// # Safety
    /// As for [`DriverApi::launch`].
    unsafe fn launch_ex(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
        attrs: &[DriverLaunchAttr],
    ) -> CuResult<()>;
    /// cuOccupancyMaxPotentialClusterSize (`active` false) or cuOccupancyMaxActiveClusters.
    fn occupancy_cluster(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        attrs: &[DriverLaunchAttr],
        active: bool,
    ) -> CuResult<i32>;
    /// cuOccupancyAvailableDynamicSMemPerBlock.
    fn occupancy_available_smem(&self, func: Function, blocks: i32, block: i32) -> CuResult<usize>;
    /// cuFuncSetCacheConfig (`config` 0..=3).
    fn func_set_cache_config(&self, func: Function, config: u32) -> CuResult<()>;
    /// cuCtxSetCacheConfig (`config` 0..=3).
    fn ctx_set_cache_config(&self, config: u32) -> CuResult<()>;
    /// cuCtxGetCacheConfig.
    fn ctx_get_cache_config(&self) -> CuResult<u32>;

    /// cuDeviceCanAccessPeer.
    fn device_can_access_peer(&self, dev: i32, peer: i32) -> CuResult<bool>;
    /// cuDeviceGetP2PAttribute of attribute `attr` (1..=5).
    fn device_p2p_attribute(&self, attr: u32, src: i32, dst: i32) -> CuResult<i32>;
    /// cuCtxEnablePeerAccess (`enable`) or cuCtxDisablePeerAccess of context `peer` from the
    /// current context.
    fn ctx_peer_access(&self, peer: Context, enable: bool) -> CuResult<()>;
    /// cuMemcpyPeerAsync between two contexts, on a stream of the current context.
    fn memcpy_peer(
        &self,
        dst: u64,
        dst_ctx: Context,
        src: u64,
        src_ctx: Context,
        len: usize,
        stream: Stream,
    ) -> CuResult<()>;

    /// cuFuncGetAttribute of attribute `attr` (0..=15).
    fn func_attribute(&self, func: Function, attr: i32) -> CuResult<i32>;
    /// cuFuncSetAttribute.
    fn func_set_attribute(&self, func: Function, attr: i32, value: i32) -> CuResult<()>;
    /// cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags.
    fn occupancy_max_active_blocks(
        &self,
        func: Function,
        block: i32,
        shared: usize,
        flags: u32,
    ) -> CuResult<i32>;

    /// cuDeviceGetDefaultMemPool.
    fn mem_pool_default(&self, dev: i32) -> CuResult<MemPool>;
    /// cuMemPoolCreate: pinned device memory on `dev`, no shareable handle types, at most
    /// `max_size` bytes (0: the driver's default).
    fn mem_pool_create(&self, dev: i32, max_size: usize) -> CuResult<MemPool>;
    /// cuMemPoolDestroy.
    fn mem_pool_destroy(&self, pool: MemPool) -> CuResult<()>;
    /// cuDeviceSetMemPool.
    fn device_set_mem_pool(&self, dev: i32, pool: MemPool) -> CuResult<()>;
    /// cuMemPoolSetAttribute of attribute `attr` (1..=8; 1..=3 take an int, the others a
    /// 64-bit value).
    fn mem_pool_set_attribute(&self, pool: MemPool, attr: u32, value: u64) -> CuResult<()>;
    /// cuMemPoolGetAttribute (as for `mem_pool_set_attribute`).
    fn mem_pool_get_attribute(&self, pool: MemPool, attr: u32) -> CuResult<u64>;
    /// cuMemPoolTrimTo.
    fn mem_pool_trim_to(&self, pool: MemPool, keep: usize) -> CuResult<()>;
    /// cuMemPoolSetAccess: (`CUdevice`, flags 0, 1 or 3) pairs.
    fn mem_pool_set_access(&self, pool: MemPool, access: &[(i32, u32)]) -> CuResult<()>;
    /// cuMemPoolGetAccess of device `dev`.
    fn mem_pool_get_access(&self, pool: MemPool, dev: i32) -> CuResult<u32>;
    /// cuMemAllocAsync (`pool` None) or cuMemAllocFromPoolAsync.
    fn mem_alloc_async(&self, size: usize, pool: Option<MemPool>, stream: Stream) -> CuResult<u64>;
    /// cuMemFreeAsync.
    fn mem_free_async(&self, ptr: u64, stream: Stream) -> CuResult<()>;

    /// cuCtxGetStreamPriorityRange: (least, greatest).
    fn stream_priority_range(&self) -> CuResult<(i32, i32)>;
    /// cuStreamGetPriority.
    fn stream_priority(&self, stream: Stream) -> CuResult<i32>;
    /// cuStreamGetId.
    fn stream_id(&self, stream: Stream) -> CuResult<u64>;
    /// cuStreamCreateWithPriority.
    fn stream_create(&self, flags: u32, priority: i32) -> CuResult<Stream>;
    /// cuStreamDestroy.
    fn stream_destroy(&self, stream: Stream) -> CuResult<()>;
    /// cuStreamSynchronize.
    fn stream_synchronize(&self, stream: Stream) -> CuResult<()>;
    /// cuStreamQuery: CUDA_ERROR_NOT_READY while work is pending.
    fn stream_query(&self, stream: Stream) -> CuResult<()>;
    /// cuStreamWaitEvent.
    fn stream_wait_event(&self, stream: Stream, event: Event, flags: u32) -> CuResult<()>;

    /// cuEventCreate.
    fn event_create(&self, flags: u32) -> CuResult<Event>;
    /// cuEventDestroy.
    fn event_destroy(&self, event: Event) -> CuResult<()>;
    /// cuEventRecord.
    fn event_record(&self, event: Event, stream: Stream) -> CuResult<()>;
    /// cuEventSynchronize.
    fn event_synchronize(&self, event: Event) -> CuResult<()>;
    /// cuEventQuery: CUDA_ERROR_NOT_READY while pending.
    fn event_query(&self, event: Event) -> CuResult<()>;
    /// cuEventElapsedTime, milliseconds.
    fn event_elapsed(&self, start: Event, end: Event) -> CuResult<f32>;

    /// cuStreamSetAttribute with a value laid out as `CUstreamAttrValue` (64 bytes); `id` is
    /// one of the stream attributes (1, 3, 8, 9, 10), others are CUDA_ERROR_INVALID_VALUE.
    fn stream_set_attribute(&self, stream: Stream, id: u32, value: &[u8; 64]) -> CuResult<()>;
    /// cuStreamGetAttribute, as for `stream_set_attribute`.
    fn stream_get_attribute(&self, stream: Stream, id: u32) -> CuResult<[u8; 64]>;
    /// cuCtxResetPersistingL2Cache in the current context.
    fn ctx_reset_persisting_l2(&self) -> CuResult<()>;

    /// cuStreamIsCapturing: whether work enqueued on `stream` now goes into a graph.
    fn stream_is_capturing(&self, stream: Stream) -> CuResult<bool>;
    /// cuLaunchHostFunc: the driver calls `func(user_data)` on a thread of its own once the
    /// stream reaches it, and the stream waits for it to return.
    ///
    /// # Safety
    /// `user_data` must stay valid for `func` for as long as the driver may call it.
    unsafe fn launch_host_func(
        &self,
        stream: Stream,
        func: HostFn,
        user_data: *mut c_void,
    ) -> CuResult<()>;

    /// A record of the GPU work this driver runs, for the timeline recorder, where the driver
    /// keeps one itself (the test double); `None`: the recorder uses CUPTI or CUDA events
    /// (`cuda/trace/`).
    fn activity_source(&self) -> Option<Box<dyn crate::cuda::trace::ActivitySource>> {
        None
    }
}

/// The driver's id of a stream attribute (the launch attributes that apply to streams).
fn stream_attr_id(id: u32) -> CuResult<sys::CUstreamAttrID> {
    use sys::CUlaunchAttributeID as A;
    Ok(match id {
        1 => A::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
        3 => A::CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY,
        8 => A::CU_LAUNCH_ATTRIBUTE_PRIORITY,
        9 => A::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
        10 => A::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// A host function as the driver calls it (`CUhostFn`).
pub(crate) type HostFn = unsafe extern "C" fn(*mut c_void);

/// Every driver symbol [`CudaDriver`] calls. Checked by [`CudaDriver::load`] before the first
/// call, because cudarc panics on a missing symbol.
pub(crate) const REQUIRED_SYMBOLS: &[&str] = &[
    "cuCtxCreate_v4",
    "cuCtxDestroy_v2",
    "cuCtxDisablePeerAccess",
    "cuCtxEnablePeerAccess",
    "cuCtxGetCacheConfig",
    "cuCtxGetLimit",
    "cuCtxGetStreamPriorityRange",
    "cuCtxPopCurrent_v2",
    "cuCtxResetPersistingL2Cache",
    "cuCtxSetCacheConfig",
    "cuCtxSetCurrent",
    "cuCtxSetLimit",
    "cuCtxSynchronize",
    "cuDeviceCanAccessPeer",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetCount",
    "cuDeviceGetDefaultMemPool",
    "cuDeviceGetName",
    "cuDeviceGetP2PAttribute",
    "cuDeviceGetUuid_v2",
    "cuDeviceSetMemPool",
    "cuDeviceTotalMem_v2",
    "cuDriverGetVersion",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventElapsedTime_v2",
    "cuEventQuery",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuFuncGetAttribute",
    "cuFuncGetName",
    "cuFuncGetParamInfo",
    "cuFuncLoad",
    "cuFuncSetAttribute",
    "cuFuncSetCacheConfig",
    "cuInit",
    "cuLaunchCooperativeKernel",
    "cuLaunchHostFunc",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocHost_v2",
    "cuMemAlloc_v2",
    "cuMemFreeAsync",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolGetAccess",
    "cuMemPoolGetAttribute",
    "cuMemPoolSetAccess",
    "cuMemPoolSetAttribute",
    "cuMemPoolTrimTo",
    "cuMemcpyAsync",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemsetD16Async",
    "cuMemsetD32Async",
    "cuMemsetD8Async",
    "cuLinkAddData_v2",
    "cuLinkComplete",
    "cuLinkCreate_v2",
    "cuLinkDestroy",
    "cuModuleEnumerateFunctions",
    "cuModuleGetFunction",
    "cuModuleGetFunctionCount",
    "cuModuleGetGlobal_v2",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuOccupancyAvailableDynamicSMemPerBlock",
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
    "cuOccupancyMaxActiveClusters",
    "cuOccupancyMaxPotentialClusterSize",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy_v2",
    "cuStreamGetAttribute",
    "cuStreamGetId",
    "cuStreamGetPriority",
    "cuStreamIsCapturing",
    "cuStreamQuery",
    "cuStreamSetAttribute",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
];

impl CudaDriver {
    /// Finds libcuda, checks its version and every symbol the driver layer calls, and calls
    /// cuInit. Never panics on a missing or old library.
    pub(crate) fn load() -> DriverLoad {
        Self::load_checking(&[
            REQUIRED_SYMBOLS,
            ARRAY_SYMBOLS,
            GRAPH_SYMBOLS,
            NODE_ATTR_SYMBOLS,
            TENSOR_MAP_SYMBOLS,
            VMM_SYMBOLS,
        ])
    }
}

// SAFETY (for every unsafe block in this impl): each call goes to a symbol that `load` found,
// through cudarc's binding of its CUDA 13.0 prototype; out parameters point at live locals;
// handles obey the module-level contract; input buffers are borrowed for the whole call.
impl DriverApi for CudaDriver {
    fn device_count(&self) -> CuResult<i32> {
        let mut n: c_int = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuDeviceGetCount(&raw mut n) })?;
        Ok(n)
    }

    fn device_get(&self, ordinal: i32) -> CuResult<i32> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuDeviceGet(&raw mut dev, ordinal) })?;
        Ok(dev)
    }

    fn device_name(&self, dev: i32) -> CuResult<Vec<u8>> {
        let mut buf = [0u8; 256];
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_possible_wrap,
            reason = "the length of a 256-byte array fits a c_int"
        )]
        let len = buf.len() as c_int;
        // SAFETY: see the impl comment; the driver writes at most `len` bytes.
        check(unsafe { sys::cuDeviceGetName(buf.as_mut_ptr().cast::<c_char>(), len, dev) })?;
        let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
        Ok(buf[..end].to_vec())
    }

    fn device_uuid(&self, dev: i32) -> CuResult<[u8; 16]> {
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuDeviceGetUuid_v2(&raw mut uuid, dev) })?;
        // `c_char` is i8 or u8 by target; either way the byte is kept as it is.
        Ok(uuid.bytes.map(|b| u8::from_ne_bytes(b.to_ne_bytes())))
    }

    fn device_total_mem(&self, dev: i32) -> CuResult<u64> {
        let mut bytes = 0usize;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuDeviceTotalMem_v2(&raw mut bytes, dev) })?;
        Ok(bytes as u64)
    }

    fn device_attribute(&self, dev: i32, attr: i32) -> CuResult<i32> {
        let mut v: c_int = 0;
        // SAFETY: see the impl comment; the pointer was resolved with this exact C signature.
        let code = unsafe { (self.device_get_attribute)(&raw mut v, attr, dev) };
        match code {
            0 => Ok(v),
            e => Err(CuError(e)),
        }
    }

    fn ctx_create(&self, dev: i32) -> CuResult<Context> {
        let mut ctx: sys::CUcontext = null_mut();
        // Flags 0 is CU_CTX_SCHED_AUTO, what the runtime uses. No creation parameters.
        // SAFETY: see the impl comment; a NULL ctxCreateParams asks for a plain context.
        check(unsafe { sys::cuCtxCreate_v4(&raw mut ctx, null_mut(), 0, dev) })?;
        // cuCtxCreate pushed the new context on this thread's stack; pop it so the stack is as
        // it was. Ops bind their context with cuCtxSetCurrent.
        let mut popped: sys::CUcontext = null_mut();
        // SAFETY: see the impl comment.
        if let Err(e) = check(unsafe { sys::cuCtxPopCurrent_v2(&raw mut popped) }) {
            debug!(error = ?e, "cuCtxPopCurrent after cuCtxCreate failed");
        }
        Ok(Context::from_raw(ctx as Raw))
    }

    fn ctx_destroy(&self, ctx: Context) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuCtxDestroy_v2(ptr(ctx.raw())) })
    }

    fn ctx_set_current(&self, ctx: Context) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuCtxSetCurrent(ptr(ctx.raw())) })
    }

    fn ctx_synchronize(&self) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuCtxSynchronize() })
    }

    fn ctx_get_limit(&self, limit: u32) -> CuResult<usize> {
        let mut v = 0usize;
        // SAFETY: see the impl comment; `limit` is a valid CUlimit (`cu_limit`).
        check(unsafe { sys::cuCtxGetLimit(&raw mut v, cu_limit(limit)?) })?;
        Ok(v)
    }

    fn ctx_set_limit(&self, limit: u32, value: usize) -> CuResult<()> {
        // SAFETY: see the impl comment; the driver checks the value.
        check(unsafe { sys::cuCtxSetLimit(cu_limit(limit)?, value) })
    }

    fn mem_get_info(&self) -> CuResult<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemGetInfo_v2(&raw mut free, &raw mut total) })?;
        Ok((free as u64, total as u64))
    }

    fn mem_alloc(&self, size: usize) -> CuResult<u64> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemAlloc_v2(&raw mut p, size) })?;
        Ok(p)
    }

    fn mem_free(&self, ptr: u64) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemFree_v2(ptr) })
    }

    fn mem_alloc_host(&self, size: usize) -> CuResult<Raw> {
        let mut p: *mut c_void = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemAllocHost_v2(&raw mut p, size) })?;
        Ok(p as Raw)
    }

    unsafe fn memcpy_htod(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: Stream,
    ) -> CuResult<()> {
        // SAFETY: see the impl comment; the caller keeps `src` readable (method contract).
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, ptr(stream.raw())) })
    }

    unsafe fn memcpy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Stream,
    ) -> CuResult<()> {
        // SAFETY: see the impl comment; the caller keeps `dst` writable (method contract).
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, ptr(stream.raw())) })
    }

    fn memcpy_dtod(&self, dst: u64, src: u64, len: usize, stream: Stream) -> CuResult<()> {
        // SAFETY: see the impl comment; device addresses are checked by the driver.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, ptr(stream.raw())) })
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "the value is as wide as the element"
    )]
    fn memset(
        &self,
        dst: u64,
        value: u32,
        width: MemsetWidth,
        count: usize,
        stream: Stream,
    ) -> CuResult<()> {
        let s = ptr(stream.raw());
        // SAFETY: see the impl comment.
        check(unsafe {
            match width {
                MemsetWidth::W8 => sys::cuMemsetD8Async(dst, value as u8, count, s),
                MemsetWidth::W16 => sys::cuMemsetD16Async(dst, value as u16, count, s),
                MemsetWidth::W32 => sys::cuMemsetD32Async(dst, value, count, s),
            }
        })
    }

    fn memcpy(&self, dst: u64, src: u64, len: usize, stream: Stream) -> CuResult<()> {
        // SAFETY: see the impl comment; both addresses were checked against the session's
        // device memory and host mappings, and the driver checks them again.
        check(unsafe { sys::cuMemcpyAsync(dst, src, len, ptr(stream.raw())) })
    }

    unsafe fn mem_host_register(&self, p: u64, len: usize, read_only: bool) -> CuResult<()> {
        const PORTABLE: u32 = 0x1;
        const DEVICEMAP: u32 = 0x2;
        const READ_ONLY: u32 = 0x8;
        let flags = PORTABLE | DEVICEMAP | if read_only { READ_ONLY } else { 0 };
        // SAFETY: see the impl comment; the caller keeps the range mapped (method contract).
        check(unsafe { sys::cuMemHostRegister_v2(p as *mut c_void, len, flags) })
    }

    fn mem_host_unregister(&self, p: u64) -> CuResult<()> {
        // SAFETY: see the impl comment; the driver refuses addresses it did not register.
        check(unsafe { sys::cuMemHostUnregister(p as *mut c_void) })
    }

    fn mem_host_device_pointer(&self, p: u64) -> CuResult<u64> {
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: see the impl comment; the driver only looks the address up.
        check(unsafe { sys::cuMemHostGetDevicePointer_v2(&raw mut d, p as *mut c_void, 0) })?;
        Ok(d)
    }

    fn module_load(&self, image: &[u8]) -> CuResult<Module> {
        if image.last() != Some(&0) {
            return Err(CuError::INVALID_VALUE);
        }
        let mut m: sys::CUmodule = null_mut();
        // SAFETY: see the impl comment; the image was checked (module_image.rs) so the sizes
        // it declares lie inside it, and it ends in a NUL for PTX.
        check(unsafe { sys::cuModuleLoadData(&raw mut m, image.as_ptr().cast()) })?;
        Ok(Module::from_raw(m as Raw))
    }

    fn module_unload(&self, module: Module) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuModuleUnload(ptr(module.raw())) })
    }

    fn module_function(&self, module: Module, name: &CStr) -> CuResult<Function> {
        let mut f: sys::CUfunction = null_mut();
        // SAFETY: see the impl comment; `name` is NUL-terminated.
        check(unsafe { sys::cuModuleGetFunction(&raw mut f, ptr(module.raw()), name.as_ptr()) })?;
        Ok(Function::from_raw(f as Raw))
    }

    fn module_function_names(&self, module: Module) -> CuResult<Vec<std::ffi::CString>> {
        let mut count: std::ffi::c_uint = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuModuleGetFunctionCount(&raw mut count, ptr(module.raw())) })?;
        let mut functions: Vec<sys::CUfunction> = vec![null_mut(); count as usize];
        // SAFETY: see the impl comment; `functions` has room for `count` handles.
        check(unsafe {
            sys::cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, ptr(module.raw()))
        })?;
        functions
            .into_iter()
            .map(|f| {
                let mut name: *const std::ffi::c_char = null_mut();
                // SAFETY: see the impl comment; the driver returns a NUL-terminated name that
                // lives as long as the module.
                check(unsafe { sys::cuFuncGetName(&raw mut name, f) })?;
                if name.is_null() {
                    return Err(CuError::INVALID_VALUE);
                }
                // SAFETY: non-null and NUL-terminated (above).
                Ok(unsafe { CStr::from_ptr(name) }.to_owned())
            })
            .collect()
    }

    fn link(
        &self,
        options: &[(u32, u64)],
        inputs: &[(u32, &CStr, &[u8])],
    ) -> Result<LinkOutput, (CuError, Vec<u8>)> {
        const LOG: usize = 64 << 10;
        let mut info = vec![0u8; LOG];
        let mut error = vec![0u8; LOG];
        let mut ids: Vec<sys::CUjit_option> = Vec::with_capacity(options.len() + 4);
        let mut values: Vec<*mut std::ffi::c_void> = Vec::with_capacity(options.len() + 4);
        for &(id, value) in options {
            // SAFETY: `id` is one of the value options the caller checked (a plain enum value).
            ids.push(unsafe { std::mem::transmute::<u32, sys::CUjit_option>(id) });
            let value = usize::try_from(value).map_err(|_| (CuError::INVALID_VALUE, Vec::new()))?;
            values.push(value as *mut std::ffi::c_void);
        }
        for (id, value) in [
            (
                sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
                info.as_mut_ptr().cast(),
            ),
            (
                sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                LOG as *mut _,
            ),
            (
                sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
                error.as_mut_ptr().cast(),
            ),
            (
                sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                LOG as *mut _,
            ),
        ] {
            ids.push(id);
            values.push(value);
        }
        let text = |b: &[u8]| {
            b.iter()
                .take_while(|&&c| c != 0)
                .copied()
                .collect::<Vec<u8>>()
        };
        let mut state: sys::CUlinkState = null_mut();
        // SAFETY: see the impl comment; the arrays hold `ids.len()` entries and the log buffers
        // outlive the link state, which is destroyed below on every path.
        let created = check(unsafe {
            sys::cuLinkCreate_v2(
                std::ffi::c_uint::try_from(ids.len()).unwrap_or(0),
                ids.as_mut_ptr(),
                values.as_mut_ptr(),
                &raw mut state,
            )
        });
        if let Err(e) = created {
            return Err((e, text(&error)));
        }
        let linked = (|| {
            for &(kind, name, data) in inputs {
                // SAFETY: see the impl comment; `kind` is a checked CUjitInputType, `data` is
                // readable for its length and `name` NUL-terminated.
                check(unsafe {
                    sys::cuLinkAddData_v2(
                        state,
                        std::mem::transmute::<u32, sys::CUjitInputType>(kind),
                        data.as_ptr().cast_mut().cast(),
                        data.len(),
                        name.as_ptr(),
                        0,
                        null_mut(),
                        null_mut(),
                    )
                })?;
            }
            let (mut cubin, mut size): (*mut std::ffi::c_void, usize) = (null_mut(), 0);
            // SAFETY: see the impl comment; the image lives until cuLinkDestroy.
            check(unsafe { sys::cuLinkComplete(state, &raw mut cubin, &raw mut size) })?;
            if cubin.is_null() {
                return Err(CuError::UNKNOWN);
            }
            // SAFETY: the driver's image of `size` bytes, alive until cuLinkDestroy.
            Ok(unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), size) }.to_vec())
        })();
        // SAFETY: the state made above, destroyed once.
        let _ = unsafe { sys::cuLinkDestroy(state) };
        match linked {
            Ok(image) => Ok(LinkOutput {
                image,
                info_log: text(&info),
                error_log: text(&error),
            }),
            Err(e) => Err((e, text(&error))),
        }
    }

    fn module_global(&self, module: Module, name: &CStr) -> CuResult<(u64, u64)> {
        let (mut p, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: see the impl comment; `name` is NUL-terminated.
        check(unsafe {
            sys::cuModuleGetGlobal_v2(&raw mut p, &raw mut size, ptr(module.raw()), name.as_ptr())
        })?;
        Ok((p, size as u64))
    }

    fn function_load(&self, func: Function) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuFuncLoad(ptr(func.raw())) })
    }

    fn function_param_info(&self, func: Function, index: usize) -> CuResult<(usize, usize)> {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuFuncGetParamInfo(ptr(func.raw()), index, &raw mut offset, &raw mut size)
        })?;
        Ok((offset, size))
    }

    unsafe fn launch(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> CuResult<()> {
        // SAFETY: forwarded method contract.
        unsafe { launch_on(func, cfg, stream, params, false) }
    }

    unsafe fn launch_cooperative(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> CuResult<()> {
        // SAFETY: forwarded method contract.
        unsafe { launch_on(func, cfg, stream, params, true) }
    }

    unsafe fn launch_ex(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
        attrs: &[DriverLaunchAttr],
    ) -> CuResult<()> {
        let config = launch_config(cfg, stream.raw(), attrs)?;
        let p = if params.is_empty() {
            null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: see the impl comment; `config` points at `attrs`, which have the driver's
        // layout (checked at compile time above) and outlive the call; `p` holds one readable
        // pointer per parameter (caller contract); the driver copies everything before
        // returning.
        check(unsafe { sys::cuLaunchKernelEx(&raw const config, ptr(func.raw()), p, null_mut()) })
    }

    fn occupancy_cluster(
        &self,
        func: Function,
        cfg: &LaunchConfig,
        attrs: &[DriverLaunchAttr],
        active: bool,
    ) -> CuResult<i32> {
        let config = launch_config(cfg, NULL_STREAM.raw(), attrs)?;
        let mut n: c_int = 0;
        // SAFETY: see the impl comment and `launch_ex`; the driver only reads `config`.
        check(unsafe {
            if active {
                sys::cuOccupancyMaxActiveClusters(&raw mut n, ptr(func.raw()), &raw const config)
            } else {
                sys::cuOccupancyMaxPotentialClusterSize(
                    &raw mut n,
                    ptr(func.raw()),
                    &raw const config,
                )
            }
        })?;
        Ok(n)
    }

    fn occupancy_available_smem(&self, func: Function, blocks: i32, block: i32) -> CuResult<usize> {
        let mut n = 0usize;
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuOccupancyAvailableDynamicSMemPerBlock(&raw mut n, ptr(func.raw()), blocks, block)
        })?;
        Ok(n)
    }

    fn device_can_access_peer(&self, dev: i32, peer: i32) -> CuResult<bool> {
        let mut v: c_int = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuDeviceCanAccessPeer(&raw mut v, dev, peer) })?;
        Ok(v != 0)
    }

    fn device_p2p_attribute(&self, attr: u32, src: i32, dst: i32) -> CuResult<i32> {
        use sys::CUdevice_P2PAttribute as P;
        let a = match attr {
            1 => P::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
            2 => P::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
            3 => P::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
            4 => P::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_ACCESS_SUPPORTED,
            5 => P::CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED,
            _ => return Err(CuError::INVALID_VALUE),
        };
        let mut v: c_int = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuDeviceGetP2PAttribute(&raw mut v, a, src, dst) })?;
        Ok(v)
    }

    fn ctx_peer_access(&self, peer: Context, enable: bool) -> CuResult<()> {
        // SAFETY: see the impl comment; `peer` is a live context of the session.
        check(unsafe {
            if enable {
                sys::cuCtxEnablePeerAccess(ptr(peer.raw()), 0)
            } else {
                sys::cuCtxDisablePeerAccess(ptr(peer.raw()))
            }
        })
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
        // SAFETY: see the impl comment; both ranges were checked against the session's tables
        // of their devices, and both contexts are the session's.
        check(unsafe {
            sys::cuMemcpyPeerAsync(
                dst,
                ptr(dst_ctx.raw()),
                src,
                ptr(src_ctx.raw()),
                len,
                ptr(stream.raw()),
            )
        })
    }

    fn func_set_cache_config(&self, func: Function, config: u32) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuFuncSetCacheConfig(ptr(func.raw()), func_cache(config)?) })
    }

    fn ctx_set_cache_config(&self, config: u32) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuCtxSetCacheConfig(func_cache(config)?) })
    }

    fn ctx_get_cache_config(&self) -> CuResult<u32> {
        let mut c = sys::CUfunc_cache::CU_FUNC_CACHE_PREFER_NONE;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuCtxGetCacheConfig(&raw mut c) })?;
        Ok(c as u32)
    }

    fn func_attribute(&self, func: Function, attr: i32) -> CuResult<i32> {
        let mut v: c_int = 0;
        // SAFETY: see the impl comment; `func` is a live function of the session's module.
        check(unsafe { sys::cuFuncGetAttribute(&raw mut v, func_attr(attr)?, ptr(func.raw())) })?;
        Ok(v)
    }

    fn func_set_attribute(&self, func: Function, attr: i32, value: i32) -> CuResult<()> {
        // SAFETY: as above; the driver checks the value.
        check(unsafe { sys::cuFuncSetAttribute(ptr(func.raw()), func_attr(attr)?, value) })
    }

    fn occupancy_max_active_blocks(
        &self,
        func: Function,
        block: i32,
        shared: usize,
        flags: u32,
    ) -> CuResult<i32> {
        let mut n: c_int = 0;
        // SAFETY: as above; the driver checks the sizes and flags.
        check(unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                &raw mut n,
                ptr(func.raw()),
                block,
                shared,
                flags,
            )
        })?;
        Ok(n)
    }

    fn mem_pool_default(&self, dev: i32) -> CuResult<MemPool> {
        let mut p: sys::CUmemoryPool = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuDeviceGetDefaultMemPool(&raw mut p, dev) })?;
        Ok(MemPool::from_raw(p as Raw))
    }

    fn mem_pool_create(&self, dev: i32, max_size: usize) -> CuResult<MemPool> {
        // SAFETY: an all-zero CUmemPoolProps is a valid value (no pointers are followed).
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location = mem_location(dev);
        props.maxSize = max_size;
        let mut p: sys::CUmemoryPool = null_mut();
        // SAFETY: see the impl comment; `props` is fully initialised.
        check(unsafe { sys::cuMemPoolCreate(&raw mut p, &raw const props) })?;
        Ok(MemPool::from_raw(p as Raw))
    }

    fn mem_pool_destroy(&self, pool: MemPool) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemPoolDestroy(ptr(pool.raw())) })
    }

    fn device_set_mem_pool(&self, dev: i32, pool: MemPool) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuDeviceSetMemPool(dev, ptr(pool.raw())) })
    }

    fn mem_pool_set_attribute(&self, pool: MemPool, attr: u32, value: u64) -> CuResult<()> {
        let a = pool_attr(attr)?;
        if attr <= 3 {
            let mut v = c_int::from(value != 0);
            // SAFETY: see the impl comment; the int attributes take a pointer to an int.
            return check(unsafe {
                sys::cuMemPoolSetAttribute(ptr(pool.raw()), a, (&raw mut v).cast())
            });
        }
        let mut v: u64 = value;
        // SAFETY: see the impl comment; the other attributes take a pointer to a cuuint64_t.
        check(unsafe { sys::cuMemPoolSetAttribute(ptr(pool.raw()), a, (&raw mut v).cast()) })
    }

    fn mem_pool_get_attribute(&self, pool: MemPool, attr: u32) -> CuResult<u64> {
        let a = pool_attr(attr)?;
        if attr <= 3 {
            let mut v: c_int = 0;
            // SAFETY: as in `mem_pool_set_attribute`.
            check(unsafe { sys::cuMemPoolGetAttribute(ptr(pool.raw()), a, (&raw mut v).cast()) })?;
            return Ok(u64::from(v != 0));
        }
        let mut v: u64 = 0;
        // SAFETY: as in `mem_pool_set_attribute`.
        check(unsafe { sys::cuMemPoolGetAttribute(ptr(pool.raw()), a, (&raw mut v).cast()) })?;
        Ok(v)
    }

    fn mem_pool_trim_to(&self, pool: MemPool, keep: usize) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemPoolTrimTo(ptr(pool.raw()), keep) })
    }

    fn mem_pool_set_access(&self, pool: MemPool, access: &[(i32, u32)]) -> CuResult<()> {
        let mut descs = Vec::with_capacity(access.len());
        for &(dev, flags) in access {
            descs.push(sys::CUmemAccessDesc {
                location: mem_location(dev),
                flags: access_flags(flags)?,
            });
        }
        // SAFETY: see the impl comment; `descs` holds `descs.len()` initialised descriptors.
        check(unsafe { sys::cuMemPoolSetAccess(ptr(pool.raw()), descs.as_ptr(), descs.len()) })
    }

    fn mem_pool_get_access(&self, pool: MemPool, dev: i32) -> CuResult<u32> {
        let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        let mut location = mem_location(dev);
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuMemPoolGetAccess(&raw mut flags, ptr(pool.raw()), &raw mut location)
        })?;
        Ok(flags as u32)
    }

    fn mem_alloc_async(&self, size: usize, pool: Option<MemPool>, stream: Stream) -> CuResult<u64> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: see the impl comment.
        check(unsafe {
            match pool {
                None => sys::cuMemAllocAsync(&raw mut p, size, ptr(stream.raw())),
                Some(pool) => sys::cuMemAllocFromPoolAsync(
                    &raw mut p,
                    size,
                    ptr(pool.raw()),
                    ptr(stream.raw()),
                ),
            }
        })?;
        Ok(p)
    }

    fn mem_free_async(&self, p: u64, stream: Stream) -> CuResult<()> {
        // SAFETY: see the impl comment; the pointer is an allocation of the session.
        check(unsafe { sys::cuMemFreeAsync(p, ptr(stream.raw())) })
    }

    fn stream_priority_range(&self) -> CuResult<(i32, i32)> {
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuCtxGetStreamPriorityRange(&raw mut least, &raw mut greatest) })?;
        Ok((least, greatest))
    }

    fn stream_priority(&self, stream: Stream) -> CuResult<i32> {
        let mut p: c_int = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamGetPriority(ptr(stream.raw()), &raw mut p) })?;
        Ok(p)
    }

    fn stream_id(&self, stream: Stream) -> CuResult<u64> {
        let mut id: std::ffi::c_ulonglong = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamGetId(ptr(stream.raw()), &raw mut id) })?;
        Ok(id)
    }

    fn stream_create(&self, flags: u32, priority: i32) -> CuResult<Stream> {
        let mut s: sys::CUstream = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamCreateWithPriority(&raw mut s, flags, priority) })?;
        Ok(Stream::from_raw(s as Raw))
    }

    fn stream_destroy(&self, stream: Stream) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamDestroy_v2(ptr(stream.raw())) })
    }

    fn stream_synchronize(&self, stream: Stream) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamSynchronize(ptr(stream.raw())) })
    }

    fn stream_query(&self, stream: Stream) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamQuery(ptr(stream.raw())) })
    }

    fn stream_wait_event(&self, stream: Stream, event: Event, flags: u32) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamWaitEvent(ptr(stream.raw()), ptr(event.raw()), flags) })
    }

    fn event_create(&self, flags: u32) -> CuResult<Event> {
        let mut e: sys::CUevent = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuEventCreate(&raw mut e, flags) })?;
        Ok(Event::from_raw(e as Raw))
    }

    fn event_destroy(&self, event: Event) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuEventDestroy_v2(ptr(event.raw())) })
    }

    fn event_record(&self, event: Event, stream: Stream) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuEventRecord(ptr(event.raw()), ptr(stream.raw())) })
    }

    fn stream_set_attribute(&self, stream: Stream, id: u32, value: &[u8; 64]) -> CuResult<()> {
        let id = stream_attr_id(id)?;
        // The union needs 8-byte alignment, which the wire's byte array does not have.
        let mut v = MaybeUninit::<sys::CUstreamAttrValue>::zeroed();
        // SAFETY: the union is exactly 64 bytes (a const assertion says so), `v` is ours and
        // does not overlap `value`.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), v.as_mut_ptr().cast::<u8>(), 64) };
        // SAFETY: see the impl comment; `v` is an initialised union the driver only reads.
        check(unsafe { sys::cuStreamSetAttribute(ptr(stream.raw()), id, v.as_ptr()) })
    }

    fn stream_get_attribute(&self, stream: Stream, id: u32) -> CuResult<[u8; 64]> {
        let id = stream_attr_id(id)?;
        let mut v = MaybeUninit::<sys::CUstreamAttrValue>::zeroed();
        // SAFETY: see the impl comment; the driver writes at most the union's 64 bytes into `v`.
        check(unsafe { sys::cuStreamGetAttribute(ptr(stream.raw()), id, v.as_mut_ptr()) })?;
        let mut value = [0u8; 64];
        // SAFETY: `v` is 64 initialised bytes (zeroed, then written by the driver).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().cast::<u8>(), value.as_mut_ptr(), 64) };
        Ok(value)
    }

    fn ctx_reset_persisting_l2(&self) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuCtxResetPersistingL2Cache() })
    }

    fn stream_is_capturing(&self, stream: Stream) -> CuResult<bool> {
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: see the impl comment; the status is written to a local.
        check(unsafe { sys::cuStreamIsCapturing(ptr(stream.raw()), &raw mut st) })?;
        Ok(st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    unsafe fn launch_host_func(
        &self,
        stream: Stream,
        func: HostFn,
        user_data: *mut c_void,
    ) -> CuResult<()> {
        // SAFETY: see the impl comment; `user_data` stays valid for `func` by our contract.
        check(unsafe { sys::cuLaunchHostFunc(ptr(stream.raw()), Some(func), user_data) })
    }

    fn event_synchronize(&self, event: Event) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuEventSynchronize(ptr(event.raw())) })
    }

    fn event_query(&self, event: Event) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuEventQuery(ptr(event.raw())) })
    }

    fn event_elapsed(&self, start: Event, end: Event) -> CuResult<f32> {
        let mut ms = 0f32;
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuEventElapsedTime_v2(&raw mut ms, ptr(start.raw()), ptr(end.raw()))
        })?;
        Ok(ms)
    }
}

/// cuLaunchKernel, or cuLaunchCooperativeKernel (the driver then refuses grids that cannot all
/// be resident: CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE).
///
/// # Safety
/// As for [`DriverApi::launch`]: one readable pointer per kernel parameter in `params`.
unsafe fn launch_on(
    func: Function,
    cfg: &LaunchConfig,
    stream: Stream,
    params: &mut [*mut c_void],
    cooperative: bool,
) -> CuResult<()> {
    let [gx, gy, gz] = cfg.grid;
    let [bx, by, bz] = cfg.block;
    let p = if params.is_empty() {
        null_mut()
    } else {
        params.as_mut_ptr()
    };
    let (f, s, smem) = (ptr(func.raw()), ptr(stream.raw()), cfg.shared_mem);
    // SAFETY: `func` and `stream` are live handles of the current context (the executor's
    // handle tables), `p` holds one readable pointer per parameter (caller contract), and the
    // driver copies the values before returning.
    check(unsafe {
        if cooperative {
            sys::cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, smem, s, p)
        } else {
            sys::cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, s, p, null_mut())
        }
    })
}

/// The `CUfunction_attribute` with id `attr` (0..=15, the runtime's `cudaFuncAttribute` ids of
/// the settable ones are the same numbers).
fn func_attr(attr: i32) -> CuResult<sys::CUfunction_attribute> {
    use sys::CUfunction_attribute as A;
    Ok(match attr {
        0 => A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        1 => A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
        2 => A::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
        3 => A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
        4 => A::CU_FUNC_ATTRIBUTE_NUM_REGS,
        5 => A::CU_FUNC_ATTRIBUTE_PTX_VERSION,
        6 => A::CU_FUNC_ATTRIBUTE_BINARY_VERSION,
        7 => A::CU_FUNC_ATTRIBUTE_CACHE_MODE_CA,
        8 => A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        9 => A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        10 => A::CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET,
        11 => A::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
        12 => A::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
        13 => A::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH,
        14 => A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
        15 => A::CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// The `CUlaunchConfig` of a launch with attributes `attrs`.
fn launch_config(
    cfg: &LaunchConfig,
    stream: Raw,
    attrs: &[DriverLaunchAttr],
) -> CuResult<sys::CUlaunchConfig> {
    let [gx, gy, gz] = cfg.grid;
    let [bx, by, bz] = cfg.block;
    Ok(sys::CUlaunchConfig {
        gridDimX: gx,
        gridDimY: gy,
        gridDimZ: gz,
        blockDimX: bx,
        blockDimY: by,
        blockDimZ: bz,
        sharedMemBytes: cfg.shared_mem,
        hStream: ptr(stream),
        // The driver only reads the array (const in cuda.h's documentation of the config).
        attrs: attrs.as_ptr().cast_mut().cast(),
        numAttrs: u32::try_from(attrs.len()).map_err(|_| CuError::INVALID_VALUE)?,
    })
}

/// The `CUfunc_cache` with value `config` (0..=3, the runtime's `cudaFuncCache` values).
fn func_cache(config: u32) -> CuResult<sys::CUfunc_cache> {
    use sys::CUfunc_cache as C;
    Ok(match config {
        0 => C::CU_FUNC_CACHE_PREFER_NONE,
        1 => C::CU_FUNC_CACHE_PREFER_SHARED,
        2 => C::CU_FUNC_CACHE_PREFER_L1,
        3 => C::CU_FUNC_CACHE_PREFER_EQUAL,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// The `CUmemAccess_flags` with value `flags` (0, 1 or 3).
fn access_flags(flags: u32) -> CuResult<sys::CUmemAccess_flags> {
    use sys::CUmemAccess_flags as F;
    Ok(match flags {
        0 => F::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        1 => F::CU_MEM_ACCESS_FLAGS_PROT_READ,
        3 => F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// The `CUmemPool_attribute` with id `attr` (1..=8, the runtime's `cudaMemPoolAttr` values).
fn pool_attr(attr: u32) -> CuResult<sys::CUmemPool_attribute> {
    use sys::CUmemPool_attribute as A;
    Ok(match attr {
        1 => A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
        2 => A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        3 => A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
        4 => A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        5 => A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        6 => A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        7 => A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        8 => A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// The `CUlimit` the runtime's `cudaLimit` values 0..=6 name (the same numbers).
fn cu_limit(limit: u32) -> CuResult<sys::CUlimit> {
    use sys::CUlimit as L;
    Ok(match limit {
        0 => L::CU_LIMIT_STACK_SIZE,
        1 => L::CU_LIMIT_PRINTF_FIFO_SIZE,
        2 => L::CU_LIMIT_MALLOC_HEAP_SIZE,
        3 => L::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
        4 => L::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
        5 => L::CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
        6 => L::CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
        7 => L::CU_LIMIT_SHMEM_SIZE,
        8 => L::CU_LIMIT_CIG_ENABLED,
        9 => L::CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

impl DriverApi for NoDriver {
    fn device_count(&self) -> CuResult<i32> {
        Err(CuError::NO_DEVICE)
    }
    fn device_get(&self, _: i32) -> CuResult<i32> {
        Err(CuError::NO_DEVICE)
    }
    fn device_name(&self, _: i32) -> CuResult<Vec<u8>> {
        Err(CuError::NO_DEVICE)
    }
    fn device_uuid(&self, _: i32) -> CuResult<[u8; 16]> {
        Err(CuError::NO_DEVICE)
    }
    fn device_total_mem(&self, _: i32) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn device_attribute(&self, _: i32, _: i32) -> CuResult<i32> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_create(&self, _: i32) -> CuResult<Context> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_destroy(&self, _: Context) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_set_current(&self, _: Context) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_synchronize(&self) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_get_limit(&self, _: u32) -> CuResult<usize> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn launch_cooperative(
        &self,
        _: Function,
        _: &LaunchConfig,
        _: Stream,
        _: &mut [*mut c_void],
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn func_attribute(&self, _: Function, _: i32) -> CuResult<i32> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_default(&self, _: i32) -> CuResult<MemPool> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn launch_ex(
        &self,
        _: Function,
        _: &LaunchConfig,
        _: Stream,
        _: &mut [*mut c_void],
        _: &[DriverLaunchAttr],
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn occupancy_cluster(
        &self,
        _: Function,
        _: &LaunchConfig,
        _: &[DriverLaunchAttr],
        _: bool,
    ) -> CuResult<i32> {
        Err(CuError::NO_DEVICE)
    }
    fn occupancy_available_smem(&self, _: Function, _: i32, _: i32) -> CuResult<usize> {
        Err(CuError::NO_DEVICE)
    }
    fn func_set_cache_config(&self, _: Function, _: u32) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn device_can_access_peer(&self, _: i32, _: i32) -> CuResult<bool> {
        Err(CuError::NO_DEVICE)
    }
    fn device_p2p_attribute(&self, _: u32, _: i32, _: i32) -> CuResult<i32> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_peer_access(&self, _: Context, _: bool) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn memcpy_peer(
        &self,
        _: u64,
        _: Context,
        _: u64,
        _: Context,
        _: usize,
        _: Stream,
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_set_cache_config(&self, _: u32) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_get_cache_config(&self) -> CuResult<u32> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_create(&self, _: i32, _: usize) -> CuResult<MemPool> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_destroy(&self, _: MemPool) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn device_set_mem_pool(&self, _: i32, _: MemPool) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_set_attribute(&self, _: MemPool, _: u32, _: u64) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_get_attribute(&self, _: MemPool, _: u32) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_trim_to(&self, _: MemPool, _: usize) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_set_access(&self, _: MemPool, _: &[(i32, u32)]) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_get_access(&self, _: MemPool, _: i32) -> CuResult<u32> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_alloc_async(&self, _: usize, _: Option<MemPool>, _: Stream) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_free_async(&self, _: u64, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_priority_range(&self) -> CuResult<(i32, i32)> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_priority(&self, _: Stream) -> CuResult<i32> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_id(&self, _: Stream) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn func_set_attribute(&self, _: Function, _: i32, _: i32) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn occupancy_max_active_blocks(&self, _: Function, _: i32, _: usize, _: u32) -> CuResult<i32> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_set_limit(&self, _: u32, _: usize) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_get_info(&self) -> CuResult<(u64, u64)> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_alloc(&self, _: usize) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_free(&self, _: u64) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_alloc_host(&self, _: usize) -> CuResult<Raw> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn memcpy_htod(&self, _: u64, _: *const u8, _: usize, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn memcpy_dtoh(&self, _: *mut u8, _: u64, _: usize, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn memcpy_dtod(&self, _: u64, _: u64, _: usize, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn memcpy(&self, _: u64, _: u64, _: usize, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn mem_host_register(&self, _: u64, _: usize, _: bool) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_host_unregister(&self, _: u64) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_host_device_pointer(&self, _: u64) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn memset(&self, _: u64, _: u32, _: MemsetWidth, _: usize, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn module_function_names(&self, _: Module) -> CuResult<Vec<std::ffi::CString>> {
        Err(CuError::NO_DEVICE)
    }
    fn link(
        &self,
        _: &[(u32, u64)],
        _: &[(u32, &CStr, &[u8])],
    ) -> Result<LinkOutput, (CuError, Vec<u8>)> {
        Err((CuError::NO_DEVICE, Vec::new()))
    }
    fn module_load(&self, _: &[u8]) -> CuResult<Module> {
        Err(CuError::NO_DEVICE)
    }
    fn module_unload(&self, _: Module) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn module_function(&self, _: Module, _: &CStr) -> CuResult<Function> {
        Err(CuError::NO_DEVICE)
    }
    fn module_global(&self, _: Module, _: &CStr) -> CuResult<(u64, u64)> {
        Err(CuError::NO_DEVICE)
    }
    fn function_load(&self, _: Function) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn function_param_info(&self, _: Function, _: usize) -> CuResult<(usize, usize)> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn launch(
        &self,
        _: Function,
        _: &LaunchConfig,
        _: Stream,
        _: &mut [*mut c_void],
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_create(&self, _: u32, _: i32) -> CuResult<Stream> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_destroy(&self, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_synchronize(&self, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_query(&self, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_wait_event(&self, _: Stream, _: Event, _: u32) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn event_create(&self, _: u32) -> CuResult<Event> {
        Err(CuError::NO_DEVICE)
    }
    fn event_destroy(&self, _: Event) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn event_record(&self, _: Event, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_is_capturing(&self, _: Stream) -> CuResult<bool> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_set_attribute(&self, _: Stream, _: u32, _: &[u8; 64]) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_get_attribute(&self, _: Stream, _: u32) -> CuResult<[u8; 64]> {
        Err(CuError::NO_DEVICE)
    }
    fn ctx_reset_persisting_l2(&self) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn launch_host_func(&self, _: Stream, _: HostFn, _: *mut c_void) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn event_synchronize(&self, _: Event) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn event_query(&self, _: Event) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn event_elapsed(&self, _: Event, _: Event) -> CuResult<f32> {
        Err(CuError::NO_DEVICE)
    }
}

/// The wire carries a stream or launch attribute's value as the C union's 64 bytes.
const _: () = assert!(std::mem::size_of::<sys::CUstreamAttrValue>() == 64);

/// The driver functions a source file calls through `sys`, sorted, without repeats, from the part
/// before its tests: each driver file's test compares them with the symbols it declares.
#[cfg(test)]
pub(super) fn driver_calls(src: &str) -> Vec<&str> {
    let code = src.split("#[cfg(test)]").next().unwrap_or(src);
    let mut called: Vec<&str> = code
        .match_indices("sys::cu")
        .map(|(i, _)| {
            let rest = &code[i + 5..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|name| *name != "culib")
        .collect();
    called.sort_unstable();
    called.dedup();
    called
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `sys::cu*` call in this file and library.rs is in REQUIRED_SYMBOLS (so `load`
    /// checks it), and REQUIRED_SYMBOLS names nothing they do not call (cuDeviceGetAttribute is
    /// resolved by hand).
    #[test]
    fn required_symbols_match_the_calls() {
        let mut called = driver_calls(include_str!("mod.rs"));
        called.extend(driver_calls(include_str!("library.rs")));
        called.push("cuDeviceGetAttribute");
        called.sort_unstable();
        called.dedup();
        let mut required = REQUIRED_SYMBOLS.to_vec();
        required.sort_unstable();
        assert_eq!(called, required);
    }
}

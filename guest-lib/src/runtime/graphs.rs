//! CUDA graphs and stream capture. The graphs, nodes and executable graphs are the host's (real
//! driver objects in the session's worker); `cudaGraph_t`, `cudaGraphNode_t` and
//! `cudaGraphExec_t` are the host's session-local handles, which it checks on every use. Node
//! parameters travel in the encodings of `qcuda_proto::graph`; kernel parameters are packed with
//! the kernel's registered layout, exactly as for a launch. Capture: capture.rs (guest side) and
//! vhost-cuda's session/graphs.rs (host side).
//!
//! Not served: memory allocation and free nodes, host nodes (they wait for host functions run
//! in the guest: [`host_node`] is their one hook), external semaphore and conditional nodes,
//! arrays in memcpy nodes, and memcpy nodes whose host side is pageable memory (the worker
//! cannot reach it when the graph runs; such a node is `cudaErrorInvalidValue`).

use crate::core::conv::{low_u32, usize_of};
use core::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};
use std::cell::RefCell;

use qcuda_proto::{
    graph::{self as g, KernelNode, MemcpyNode, MemsetNode, KERNEL_NODE_HEADER},
    Op,
};

use super::write_out;
use crate::{
    core::capture,
    core::cuda_error::{CudaError, CudaResult},
    core::memory::{self, Direction},
    core::modules,
    core::params,
    core::runtime::{current, non_null, registry, Runtime},
    core::transport::Call,
    core::warnings::warn_once,
    generated::{
        self as cu, cudaEvent_t, cudaGraphEdgeData, cudaGraphExecUpdateResultInfo, cudaGraphExec_t,
        cudaGraphInstantiateParams, cudaGraphNodeType, cudaGraphNode_t, cudaGraph_t,
        cudaHostNodeParams, cudaKernelNodeParams, cudaMemcpy3DParms, cudaMemcpyKind,
        cudaMemsetParams, cudaStreamCaptureMode, cudaStreamCaptureStatus, cudaStream_t, dim3,
    },
};

/// Node handles in one `GraphGetNodes`-style reply at first; asked again when there are more.
const FIRST_LIST: usize = 256;
/// cudaGraphInstantiateSuccess / cudaGraphInstantiateError.
const INSTANTIATE_SUCCESS: u32 = 0;
const INSTANTIATE_ERROR: u32 = 1;

/// A kernel node's parameters as `cudaGraphKernelNodeGetParams` hands them out: the block
/// (8-byte aligned) and one pointer per parameter into it.
struct KernelParamsCopy {
    _block: Vec<u64>,
    _pointers: Vec<*mut c_void>,
}

// SAFETY: the pointers point into the record's own block and are only handed to the
// application, never dereferenced here.
unsafe impl Send for KernelParamsCopy {}

/// Per kernel node, the parameters last handed out: they stay valid until the node's next
/// `cudaGraphKernelNodeGetParams`, as the runtime keeps them until the parameters change.
static KERNEL_PARAMS: std::sync::Mutex<Vec<(u64, KernelParamsCopy)>> =
    std::sync::Mutex::new(Vec::new());

/// Per graph, the allocations of its memory allocation nodes, which the guest's allocation
/// table holds (so that `cudaMemcpyDefault` and pointer attributes see device memory) until the
/// graph is destroyed.
static GRAPH_MEMORY: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

thread_local! {
    /// Storage behind `cudaStreamGetCaptureInfo`'s dependency and edge-data arrays, valid until
    /// the thread's next call of it.
    static CAPTURE_DEPS: RefCell<(Vec<cudaGraphNode_t>, Vec<cudaGraphEdgeData>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

fn handle<T>(p: *mut T) -> u64 {
    p as usize as u64
}

fn u64_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A `const cudaGraphNode_t *` array of `n` entries as host handles.
///
/// # Safety
/// `nodes` must be null (with `n` 0) or valid for reads of `n` handles.
unsafe fn node_list(nodes: *const cudaGraphNode_t, n: usize) -> CudaResult<Vec<u64>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    non_null(nodes)?;
    // SAFETY: `n` readable handles (caller contract).
    let s = unsafe { std::slice::from_raw_parts(nodes, n) };
    if s.iter().any(|p| p.is_null()) {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(s.iter().map(|p| handle(*p)).collect())
}

/// Edge data must be absent or all default: qcuda's graphs have default edges only.
///
/// # Safety
/// `data` must be null or valid for reads of `n` entries.
unsafe fn default_edges(data: *const cudaGraphEdgeData, n: usize) -> CudaResult<()> {
    if data.is_null() || n == 0 {
        return Ok(());
    }
    // SAFETY: `n` readable entries (caller contract).
    let s = unsafe { std::slice::from_raw_parts(data, n) };
    if s.iter()
        .all(|e| e.from_port == 0 && e.to_port == 0 && e.type_ == 0)
    {
        Ok(())
    } else {
        warn_once!(
            "CUDA graphs: edges with ports or types other than the default are not supported"
        );
        Err(CudaError::NOT_SUPPORTED)
    }
}

/// Sends `op` and reads a list of u64 handles from out-buffer 0 (asking again if it was short).
fn fetch_list(rt: &Runtime, device: u32, op: Op, args: &[u64], per: usize) -> CudaResult<Vec<u64>> {
    let mut want = FIRST_LIST;
    loop {
        let mut buf = vec![0u8; want * 8 * per];
        let reply = rt
            .session
            .submit(Call::new(op, device).args(args).output(&mut buf))?;
        let n = usize::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)?;
        if n <= want {
            return Ok(buf[..n * 8 * per]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect());
        }
        want = n;
    }
}

/// Writes a node list the CUDA way: with a null array only the count; else up to `*count`
/// entries, the rest of the array nulled, and the real count.
///
/// # Safety
/// `out` must be null or valid for `*count` writes; `count` valid for a read and a write.
unsafe fn write_list(list: &[u64], out: *mut cudaGraphNode_t, count: *mut usize) -> CudaResult<()> {
    non_null(count)?;
    // SAFETY: readable (caller contract).
    let room = unsafe { *count };
    if !out.is_null() {
        for i in 0..room {
            let v = usize_of(list.get(i).copied().unwrap_or(0)) as cudaGraphNode_t;
            // SAFETY: `room` writable entries (caller contract).
            unsafe { out.add(i).write(v) };
        }
        // SAFETY: as above.
        unsafe { count.write(list.len().min(room)) };
        return Ok(());
    }
    // SAFETY: writable (caller contract).
    unsafe { count.write(list.len()) };
    Ok(())
}

/// Zeroes `n` edge-data entries (all of qcuda's edges are default edges).
///
/// # Safety
/// `data` must be null or valid for `n` writes.
unsafe fn zero_edges(data: *mut cudaGraphEdgeData, n: usize) {
    if data.is_null() {
        return;
    }
    for i in 0..n {
        // SAFETY: `n` writable entries (caller contract).
        unsafe { data.add(i).write(cudaGraphEdgeData::default()) };
    }
}

// ----- node parameters -------------------------------------------------------------------

/// The kernel node encoding of `p`, for a kernel resolved on the current device.
///
/// # Safety
/// `p.kernelParams` must satisfy [`params::pack`]'s contract for the kernel.
unsafe fn kernel_node(rt: &Runtime, device: u32, p: &cudaKernelNodeParams) -> CudaResult<Vec<u8>> {
    if !p.extra.is_null() {
        if !p.kernelParams.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        warn_once!("CUDA graphs: kernel nodes with `extra` parameter buffers are not supported");
        return Err(CudaError::NOT_SUPPORTED);
    }
    let kernel = registry()
        .kernel(p.func as usize)
        .ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    let resolved = modules::kernel(rt, kernel, device)?;
    // SAFETY: forwarded caller contract; `resolved.params` is this kernel's layout.
    let block = unsafe { params::pack(&resolved.params, p.kernelParams.cast())? };
    let mut out = vec![0u8; KERNEL_NODE_HEADER + block.len()];
    KernelNode {
        function: resolved.function,
        grid: [p.gridDim.x, p.gridDim.y, p.gridDim.z],
        block: [p.blockDim.x, p.blockDim.y, p.blockDim.z],
        shared_mem: p.sharedMemBytes,
        params: &block,
    }
    .encode(&mut out);
    Ok(out)
}

/// The device address of one side of a memcpy node: host memory must be host-mapped (pinned,
/// registered or managed); device memory goes as it is (the host checks it).
fn copy_side(rt: &Runtime, addr: u64, span: u64, host_side: bool) -> CudaResult<u64> {
    let len = usize::try_from(span).map_err(|_| CudaError::INVALID_VALUE)?;
    if let Some(d) = rt.host_memory.device_range(usize_of(addr), len.max(1)) {
        return Ok(d);
    }
    if host_side {
        // Pageable memory: the worker runs the copy whenever the graph runs, so the pages are
        // pinned and mapped for it now (host_memory.rs).
        let (_, device) = crate::core::runtime::current()?;
        return rt
            .host_memory
            .pin_for_graph(&rt.session, usize_of(addr), len, device);
    }
    Ok(addr)
}

/// The memcpy node encoding of a `cudaMemcpy3DParms` (pitched pointers only).
fn memcpy_node(rt: &Runtime, p: &cudaMemcpy3DParms) -> CudaResult<[u8; g::MEMCPY_NODE_SIZE]> {
    if !p.srcArray.is_null() || !p.dstArray.is_null() {
        warn_once!("CUDA graphs: memcpy nodes with CUDA arrays are not supported");
        return Err(CudaError::NOT_SUPPORTED);
    }
    let (e, s, d) = (p.extent, p.srcPtr, p.dstPtr);
    let at = |ptr: *mut c_void, pitch: usize, rows: usize, pos: crate::generated::cudaPos| {
        let off = pos
            .z
            .checked_mul(rows)
            .and_then(|r| r.checked_add(pos.y))
            .and_then(|r| r.checked_mul(pitch))
            .and_then(|r| r.checked_add(pos.x))
            .ok_or(CudaError::INVALID_VALUE)?;
        (ptr as u64)
            .checked_add(off as u64)
            .ok_or(CudaError::INVALID_VALUE)
    };
    let src = at(s.ptr, s.pitch, s.ysize, p.srcPos)?;
    let dst = at(d.ptr, d.pitch, d.ysize, p.dstPos)?;
    if s.ptr.is_null() || d.ptr.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let dir = memory::direction(rt, dst, src, p.kind)?;
    let (w, h, z) = (e.width as u64, e.height as u64, e.depth as u64);
    let src_span = MemcpyNode::span(s.pitch as u64, s.ysize as u64, w, h, z)
        .ok_or(CudaError::INVALID_VALUE)?;
    let dst_span = MemcpyNode::span(d.pitch as u64, d.ysize as u64, w, h, z)
        .ok_or(CudaError::INVALID_VALUE)?;
    let src_host = matches!(dir, Direction::HostToDevice | Direction::HostToHost);
    let dst_host = matches!(dir, Direction::DeviceToHost | Direction::HostToHost);
    let node = MemcpyNode {
        dst: copy_side(rt, dst, dst_span, dst_host)?,
        dst_pitch: d.pitch as u64,
        dst_rows: d.ysize as u64,
        src: copy_side(rt, src, src_span, src_host)?,
        src_pitch: s.pitch as u64,
        src_rows: s.ysize as u64,
        width: w,
        height: h,
        depth: z,
    };
    Ok(node.encode())
}

/// A 1D copy as `cudaMemcpy3DParms`.
fn memcpy_1d(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaMemcpy3DParms {
    let mut p = cudaMemcpy3DParms::default();
    p.srcPtr.ptr = src.cast_mut();
    p.srcPtr.pitch = count;
    p.srcPtr.xsize = count;
    p.srcPtr.ysize = 1;
    p.dstPtr.ptr = dst;
    p.dstPtr.pitch = count;
    p.dstPtr.xsize = count;
    p.dstPtr.ysize = 1;
    p.extent.width = count;
    p.extent.height = 1;
    p.extent.depth = 1;
    p.kind = kind;
    p
}

/// The memcpy node encoding of a copy to (`to_symbol`) or from a `__device__` variable at
/// `offset`, the other side at `other`.
#[allow(clippy::too_many_arguments)]
fn symbol_node(
    rt: &Runtime,
    device: u32,
    symbol: *const c_void,
    other: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    to_symbol: bool,
) -> CudaResult<[u8; g::MEMCPY_NODE_SIZE]> {
    let allowed = if to_symbol {
        cu::cudaMemcpyHostToDevice
    } else {
        cu::cudaMemcpyDeviceToHost
    };
    if !matches!(kind, k if k == allowed || k == cu::cudaMemcpyDeviceToDevice || k == cu::cudaMemcpyDefault)
    {
        return Err(CudaError::INVALID_MEMCPY_DIRECTION);
    }
    let global = crate::core::symbols::global(rt, registry(), symbol as usize, device)?;
    let addr = crate::core::symbols::range(global, count, offset)?;
    // Module globals are not in the guest's allocation table, so "default" is resolved here.
    let kind = match kind {
        cu::cudaMemcpyDefault if rt.allocations.find(other as u64).is_some() => {
            cu::cudaMemcpyDeviceToDevice
        }
        cu::cudaMemcpyDefault => allowed,
        k => k,
    };
    let p = if to_symbol {
        memcpy_1d(usize_of(addr) as *mut c_void, other, count, kind)
    } else {
        memcpy_1d(
            other.cast_mut(),
            usize_of(addr) as *const c_void,
            count,
            kind,
        )
    };
    memcpy_node(rt, &p)
}

fn memset_node(rt: &Runtime, p: &cudaMemsetParams) -> CudaResult<[u8; g::MEMSET_NODE_SIZE]> {
    let mut node = MemsetNode {
        dst: p.dst as u64,
        pitch: p.pitch as u64,
        value: p.value,
        element_size: p.elementSize,
        width: p.width as u64,
        height: p.height as u64,
    };
    let span = node.span().ok_or(CudaError::INVALID_VALUE)?;
    if node.dst == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    node.dst = copy_side(rt, node.dst, span, false)?;
    Ok(node.encode())
}

fn event_handle(rt: &Runtime, event: cudaEvent_t) -> CudaResult<Vec<u8>> {
    let info = rt.events.info(event as usize)?;
    Ok(info.host.to_le_bytes().to_vec())
}

/// The node type and parameter encoding of a generic `cudaGraphNodeParams` (CUDA 12.2's
/// `cudaGraphAddNode` family).
///
/// # Safety
/// The union member named by `p.type_` must be initialised, with its pointers valid as the API
/// requires (kernel parameters as for [`kernel_node`]).
unsafe fn generic_node(
    rt: &Runtime,
    device: u32,
    p: &crate::generated::cudaGraphNodeParams,
) -> CudaResult<(u32, Vec<u8>)> {
    let u = &p.__bindgen_anon_1;
    let encoded = match p.type_ {
        cu::cudaGraphNodeTypeKernel => {
            // SAFETY: `p.type_` names this member, initialised (caller contract).
            let k = unsafe { u.kernel };
            let v1 = cudaKernelNodeParams {
                func: k.func,
                gridDim: k.gridDim,
                blockDim: k.blockDim,
                sharedMemBytes: k.sharedMemBytes,
                kernelParams: k.kernelParams,
                extra: k.extra,
            };
            // SAFETY: forwarded caller contract.
            unsafe { kernel_node(rt, device, &v1)? }
        }
        cu::cudaGraphNodeTypeMemcpy => {
            // SAFETY: `p.type_` names this member, initialised (caller contract).
            let m = unsafe { u.memcpy };
            if m.flags != 0 {
                return Err(CudaError::INVALID_VALUE);
            }
            memcpy_node(rt, &m.copyParams)?.to_vec()
        }
        cu::cudaGraphNodeTypeMemset => {
            // SAFETY: `p.type_` names this member, initialised (caller contract).
            let m = unsafe { u.memset };
            let v1 = cudaMemsetParams {
                dst: m.dst,
                pitch: m.pitch,
                value: m.value,
                elementSize: m.elementSize,
                width: m.width,
                height: m.height,
            };
            memset_node(rt, &v1)?.to_vec()
        }
        cu::cudaGraphNodeTypeHost => {
            // SAFETY: `p.type_` names this member, initialised (caller contract).
            let h = unsafe { u.host };
            host_node(&cudaHostNodeParams {
                fn_: h.fn_,
                userData: h.userData,
            })?
        }
        cu::cudaGraphNodeTypeGraph => {
            // SAFETY: `p.type_` names this member, initialised (caller contract).
            let c = unsafe { u.graph };
            if c.ownership != cu::cudaGraphChildGraphOwnershipClone {
                warn_once!(
                    "CUDA graphs: child graph nodes that take ownership (move) are not supported"
                );
                return Err(CudaError::NOT_SUPPORTED);
            }
            if c.graph.is_null() {
                return Err(CudaError::INVALID_VALUE);
            }
            handle(c.graph).to_le_bytes().to_vec()
        }
        cu::cudaGraphNodeTypeEmpty => Vec::new(),
        // SAFETY: `p.type_` names this member, initialised (caller contract).
        cu::cudaGraphNodeTypeWaitEvent => event_handle(rt, unsafe { u.eventWait }.event)?,
        // SAFETY: `p.type_` names this member, initialised (caller contract).
        cu::cudaGraphNodeTypeEventRecord => event_handle(rt, unsafe { u.eventRecord }.event)?,
        t if t < cu::cudaGraphNodeTypeCount => {
            warn_once!(
                "CUDA graphs: memory, external semaphore and conditional nodes are not supported"
            );
            return Err(CudaError::NOT_SUPPORTED);
        }
        _ => return Err(CudaError::INVALID_VALUE),
    };
    Ok((p.type_, encoded))
}

/// A memory allocation node for `props` (pinned device memory of one device, accessible from
/// that device only) of `bytesize` bytes after `deps`: (node handle, device address).
///
/// # Safety
/// `deps` must hold `n` readable handles; `access` must be null or hold `access_count`
/// readable entries.
#[allow(clippy::too_many_arguments)]
unsafe fn mem_alloc_node(
    rt: &Runtime,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    n: usize,
    props: &cu::cudaMemPoolProps,
    access: *const cu::cudaMemAccessDesc,
    access_count: usize,
    bytesize: usize,
) -> CudaResult<(u64, u64)> {
    if graph.is_null()
        || bytesize == 0
        || props.allocType != cu::cudaMemAllocationTypePinned
        || props.location.type_ != cu::cudaMemLocationTypeDevice
    {
        return Err(CudaError::INVALID_VALUE);
    }
    let device = rt.devices.check(props.location.id)?;
    if props.handleTypes != 0 {
        warn_once!(
            "CUDA graphs: memory allocation nodes with exportable handles are not supported"
        );
        return Err(CudaError::NOT_SUPPORTED);
    }
    if access_count > 0 {
        non_null(access)?;
        // SAFETY: `access_count` readable entries (caller contract).
        let a = unsafe { std::slice::from_raw_parts(access, access_count) };
        if a.iter().any(|d| {
            d.location.type_ != cu::cudaMemLocationTypeDevice || d.location.id != props.location.id
        }) {
            warn_once!("CUDA graphs: graph memory reachable from other devices is not supported");
            return Err(CudaError::NOT_SUPPORTED);
        }
    }
    // SAFETY: forwarded caller contract.
    let deps = u64_bytes(&unsafe { node_list(deps, n)? });
    let reply = rt.session.submit(
        Call::new(Op::GraphAddNode, device)
            .args(&[handle(graph), u64::from(g::NODE_MEM_ALLOC)])
            .input(&deps)
            .input(&(bytesize as u64).to_le_bytes()),
    )?;
    let dptr = reply.rets[1];
    rt.allocations.insert(crate::core::allocations::Allocation {
        base: dptr,
        size: bytesize as u64,
        device,
    });
    GRAPH_MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((handle(graph), dptr));
    Ok((reply.rets[0], dptr))
}

// ----- requests --------------------------------------------------------------------------

/// Adds a node of type `ty` with encoded `params` after `deps`, writing its handle.
///
/// # Safety
/// `node` must be null or writable; `deps` must hold `n` readable handles.
#[allow(clippy::too_many_arguments)]
unsafe fn add_node(
    rt: &Runtime,
    device: u32,
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    n: usize,
    ty: u32,
    params: &[u8],
) -> CudaResult<()> {
    non_null(node)?;
    if graph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: forwarded caller contract.
    let deps = u64_bytes(&unsafe { node_list(deps, n)? });
    let reply = rt.session.submit(
        Call::new(Op::GraphAddNode, device)
            .args(&[handle(graph), u64::from(ty)])
            .input(&deps)
            .input(params),
    )?;
    if ty == g::NODE_HOST {
        if let Some(key) = host_node_key(params) {
            rt.host_fns.set_node(reply.rets[0], key);
        }
    }
    // SAFETY: non-null and writable (caller contract).
    unsafe { write_out(node, usize_of(reply.rets[0]) as cudaGraphNode_t) }
}

/// Sets node parameters: of a graph's node (`exec` null) or in an executable graph.
fn set_params(
    rt: &Runtime,
    device: u32,
    exec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    ty: u32,
    params: &[u8],
) -> CudaResult<()> {
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let call = if exec.is_null() {
        Call::new(Op::GraphNodeSetParams, device).args(&[handle(node), u64::from(ty)])
    } else {
        Call::new(Op::GraphExecNodeSetParams, device).args(&[
            handle(exec),
            handle(node),
            u64::from(ty),
        ])
    };
    rt.session.submit(call.input(params))?;
    Ok(())
}

/// A host node's parameters on the wire: the key of the function, registered with the process's
/// host functions (`host_fns.rs`) for as long as the process lives, since the node may run any
/// number of times. Each run goes through the host-function channel like `cudaLaunchHostFunc`.
fn host_node(params: &cudaHostNodeParams) -> CudaResult<Vec<u8>> {
    let func = params.fn_.ok_or(CudaError::INVALID_VALUE)?;
    let rt = crate::core::runtime::runtime()?;
    let key = rt.host_fns.register(
        rt,
        crate::core::host_fns::HostCallback::Func {
            func,
            data: params.userData as usize,
        },
        false,
    )?;
    Ok(key.to_le_bytes().to_vec())
}

/// The key a host node's encoding carries.
fn host_node_key(params: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(params.get(..8)?.try_into().ok()?))
}

fn begin_capture(stream: cudaStream_t, mode: cudaStreamCaptureMode) -> CudaResult<()> {
    if !capture::valid_mode(mode) {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    if t.wire == 0 {
        // The legacy stream cannot be captured; qcuda sends the per-thread default stream to
        // it too (streams.rs), so capture needs a created stream.
        return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
    }
    rt.session
        .submit(Call::new(Op::StreamBeginCapture, t.device).args(&[t.wire, u64::from(mode)]))?;
    rt.session
        .captures
        .begun(stream as usize, t.wire, t.device, mode);
    Ok(())
}

/// `cudaStreamBeginCaptureToGraph`: capture into an existing graph, after `deps` of it.
///
/// # Safety
/// `deps` and `edges` must be null or hold `n` readable entries.
unsafe fn begin_capture_to_graph(
    stream: cudaStream_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    edges: *const cudaGraphEdgeData,
    n: usize,
    mode: cudaStreamCaptureMode,
) -> CudaResult<()> {
    if !capture::valid_mode(mode) || graph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: forwarded API contract.
    let list = unsafe {
        default_edges(edges, n)?;
        u64_bytes(&node_list(deps, n)?)
    };
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    if t.wire == 0 {
        return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
    }
    rt.session.submit(
        Call::new(Op::StreamBeginCaptureToGraph, t.device)
            .args(&[t.wire, handle(graph), u64::from(mode)])
            .input(&list),
    )?;
    rt.session
        .captures
        .begun(stream as usize, t.wire, t.device, mode);
    Ok(())
}

unsafe fn end_capture(stream: cudaStream_t, graph: *mut cudaGraph_t) -> CudaResult<()> {
    non_null(graph)?;
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    if t.wire == 0 {
        return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
    }
    rt.session.captures.check_end(stream as usize)?;
    let r = rt
        .session
        .submit(Call::new(Op::StreamEndCapture, t.device).args(&[t.wire]));
    rt.session.captures.ended(stream as usize);
    let h = match r {
        Ok(reply) => reply.rets[0],
        Err(e) => {
            // SAFETY: non-null and writable (API contract): CUDA returns a NULL graph.
            unsafe { graph.write(std::ptr::null_mut()) };
            return Err(e);
        }
    };
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(graph, usize_of(h) as cudaGraph_t) }
}

fn capture_info(stream: cudaStream_t) -> CudaResult<(u64, u64, u64, Vec<u64>)> {
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    let mut want = 64usize;
    loop {
        let mut buf = vec![0u8; want * 8];
        let reply = rt.session.submit(
            Call::new(Op::StreamCaptureInfo, t.device)
                .args(&[t.wire])
                .output(&mut buf),
        )?;
        let n = usize::try_from(reply.rets[3]).map_err(|_| CudaError::UNKNOWN)?;
        if n <= want {
            let deps = buf[..n * 8]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            return Ok((reply.rets[0], reply.rets[1], reply.rets[2], deps));
        }
        want = n;
    }
}

unsafe fn is_capturing(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
) -> CudaResult<()> {
    non_null(status)?;
    let (st, ..) = capture_info(stream)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(status, low_u32(st) as cudaStreamCaptureStatus) }
}

#[allow(clippy::too_many_arguments)]
unsafe fn get_capture_info(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
    id: *mut c_ulonglong,
    graph: *mut cudaGraph_t,
    deps: *mut *const cudaGraphNode_t,
    edges: *mut *const cudaGraphEdgeData,
    num: *mut usize,
) -> CudaResult<()> {
    non_null(status)?;
    if !edges.is_null() && deps.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (st, capture_id, g, list) = capture_info(stream)?;
    // SAFETY: each out pointer is null or writable (API contract).
    unsafe {
        write_out(status, low_u32(st) as cudaStreamCaptureStatus)?;
        if !id.is_null() {
            id.write(capture_id);
        }
        if !graph.is_null() {
            graph.write(usize_of(g) as cudaGraph_t);
        }
        if !num.is_null() {
            num.write(list.len());
        }
    }
    CAPTURE_DEPS.with(|c| {
        let mut c = c.borrow_mut();
        c.0 = list
            .iter()
            .map(|&h| usize_of(h) as cudaGraphNode_t)
            .collect();
        c.1 = vec![cudaGraphEdgeData::default(); list.len()];
        // SAFETY: as above; the arrays live in this thread's storage until its next call.
        unsafe {
            if !deps.is_null() {
                deps.write(if list.is_empty() {
                    std::ptr::null()
                } else {
                    c.0.as_ptr()
                });
            }
            if !edges.is_null() {
                edges.write(if list.is_empty() {
                    std::ptr::null()
                } else {
                    c.1.as_ptr()
                });
            }
        }
    });
    Ok(())
}

unsafe fn update_capture_deps(
    stream: cudaStream_t,
    deps: *mut cudaGraphNode_t,
    edges: *const cudaGraphEdgeData,
    n: usize,
    flags: c_uint,
) -> CudaResult<()> {
    if flags > 1 {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: forwarded API contract.
    unsafe { default_edges(edges, n)? };
    // SAFETY: forwarded API contract.
    let list = u64_bytes(&unsafe { node_list(deps, n)? });
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    rt.session.submit(
        Call::new(Op::StreamUpdateCaptureDependencies, t.device)
            .args(&[t.wire, u64::from(flags)])
            .input(&list),
    )?;
    Ok(())
}

fn graph_launch(exec: cudaGraphExec_t, stream: cudaStream_t, upload: bool) -> CudaResult<()> {
    if exec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    rt.session.check_sticky(t.device)?;
    if upload {
        rt.session
            .submit(Call::new(Op::GraphUpload, t.device).args(&[handle(exec), t.wire]))?;
        return Ok(());
    }
    crate::core::managed_vars::before_launch(rt, t.device, t.wire)?;
    rt.session.submit(
        Call::new(Op::GraphLaunch, t.device)
            .args(&[handle(exec), t.wire])
            .fire_and_forget(),
    )?;
    Ok(())
}

unsafe fn instantiate(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    flags: c_ulonglong,
    stream: cudaStream_t,
) -> CudaResult<()> {
    non_null(exec)?;
    if graph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let t = rt.streams.target(stream as usize)?;
    let device = if stream.is_null() { d } else { t.device };
    let reply = rt
        .session
        .submit(Call::new(Op::GraphInstantiate, device).args(&[handle(graph), flags, t.wire]))?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(exec, usize_of(reply.rets[0]) as cudaGraphExec_t) }
}

unsafe fn node_lists(
    node: cudaGraphNode_t,
    which: u64,
    out: *mut cudaGraphNode_t,
    edges: *mut cudaGraphEdgeData,
    count: *mut usize,
) -> CudaResult<()> {
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    non_null(count)?;
    let (rt, d) = current()?;
    let list = fetch_list(rt, d, Op::GraphNodeQuery, &[handle(node), which], 1)?;
    // SAFETY: forwarded API contract.
    unsafe {
        let room = if out.is_null() { 0 } else { *count };
        write_list(&list, out, count)?;
        zero_edges(edges, room.min(list.len()));
    }
    Ok(())
}

unsafe fn graph_nodes(
    graph: cudaGraph_t,
    roots: bool,
    out: *mut cudaGraphNode_t,
    count: *mut usize,
) -> CudaResult<()> {
    if graph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    non_null(count)?;
    let (rt, d) = current()?;
    let list = fetch_list(
        rt,
        d,
        Op::GraphGetNodes,
        &[handle(graph), u64::from(roots)],
        1,
    )?;
    // SAFETY: forwarded API contract.
    unsafe { write_list(&list, out, count) }
}

unsafe fn change_edges(
    graph: cudaGraph_t,
    from: *const cudaGraphNode_t,
    to: *const cudaGraphNode_t,
    edges: *const cudaGraphEdgeData,
    n: usize,
    remove: bool,
) -> CudaResult<()> {
    if graph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: forwarded API contract.
    let (f, t) = unsafe {
        default_edges(edges, n)?;
        (node_list(from, n)?, node_list(to, n)?)
    };
    let pairs: Vec<u64> = f.iter().zip(&t).flat_map(|(a, b)| [*a, *b]).collect();
    let (rt, d) = current()?;
    rt.session.submit(
        Call::new(Op::GraphEdges, d)
            .args(&[handle(graph), u64::from(remove)])
            .input(&u64_bytes(&pairs)),
    )?;
    Ok(())
}

/// `GraphNodeGetParams` of a node that must be of type `ty`: its encoding (`len` bytes).
fn node_params(
    node: cudaGraphNode_t,
    ty: u32,
    len: usize,
) -> CudaResult<(&'static Runtime, Vec<u8>)> {
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let mut buf = vec![0u8; len];
    let reply = rt.session.submit(
        Call::new(Op::GraphNodeGetParams, d)
            .args(&[handle(node)])
            .output(&mut buf),
    )?;
    if reply.rets[0] != u64::from(ty) {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok((rt, buf))
}

/// `GraphQuery`: rets[0] for `what` of `handle`.
fn graph_query(handle: u64, what: u64) -> CudaResult<(&'static Runtime, u64)> {
    graph_query_in(handle, what, 0)
}

/// `GraphQuery` with its third argument.
fn graph_query_in(handle: u64, what: u64, arg: u64) -> CudaResult<(&'static Runtime, u64)> {
    if handle == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let reply = rt
        .session
        .submit(Call::new(Op::GraphQuery, d).args(&[handle, what, arg]))?;
    Ok((rt, reply.rets[0]))
}

/// The event of an event record or wait node, as the application's handle.
///
/// # Safety
/// `out` must be null or writable.
unsafe fn node_event(
    node: cudaGraphNode_t,
    out: *mut cudaEvent_t,
    ty: cudaGraphNodeType,
) -> CudaResult<()> {
    non_null(out)?;
    let (rt, d) = current()?;
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut none = [0u8; 0];
    let t = rt.session.submit(
        Call::new(Op::GraphNodeQuery, d)
            .args(&[handle(node), 0])
            .output(&mut none),
    )?;
    if t.rets[0] != u64::from(ty) {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, host) = graph_query(handle(node), 0)?;
    let e = rt
        .events
        .by_host(host)
        .ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
    // SAFETY: non-null and writable (caller contract).
    unsafe { write_out(out, e as cudaEvent_t) }
}

unsafe fn exec_set_event(
    exec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    event: cudaEvent_t,
) -> CudaResult<()> {
    if exec.is_null() || node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let e = rt.events.info(event as usize)?;
    rt.session
        .submit(Call::new(Op::GraphExecSetEvent, d).args(&[handle(exec), handle(node), e.host]))?;
    Ok(())
}

cuda_api! {
    /// `cudaThreadExchangeStreamCaptureMode`: per guest thread (capture.rs).
    fn cudaThreadExchangeStreamCaptureMode(mode: *mut cudaStreamCaptureMode) {
        non_null(mode)?;
        // SAFETY: non-null, readable and writable (API contract).
        unsafe { *mode = capture::exchange_mode(*mode)? };
        Ok(())
    }

    /// `cudaStreamBeginCapture`: the host's driver captures the stream (not the legacy or
    /// per-thread default stream: cudaErrorStreamCaptureUnsupported).
    #[per_thread(cudaStreamBeginCapture_ptsz)]
    fn cudaStreamBeginCapture(stream: cudaStream_t, mode: cudaStreamCaptureMode) {
        begin_capture(stream, mode)
    }

    /// `cudaStreamBeginCaptureToGraph` (default edges only).
    #[per_thread(cudaStreamBeginCaptureToGraph_ptsz)]
    fn cudaStreamBeginCaptureToGraph(
        stream: cudaStream_t,
        graph: cudaGraph_t,
        dependencies: *const cudaGraphNode_t,
        dependencyData: *const cudaGraphEdgeData,
        numDependencies: usize,
        mode: cudaStreamCaptureMode,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { begin_capture_to_graph(stream, graph, dependencies, dependencyData, numDependencies, mode) }
    }

    /// `cudaStreamEndCapture`.
    #[per_thread(cudaStreamEndCapture_ptsz)]
    fn cudaStreamEndCapture(stream: cudaStream_t, pGraph: *mut cudaGraph_t) {
        // SAFETY: forwarded API contract.
        unsafe { end_capture(stream, pGraph) }
    }

    /// `cudaStreamIsCapturing`: the driver's capture status of the stream.
    #[per_thread(cudaStreamIsCapturing_ptsz)]
    fn cudaStreamIsCapturing(stream: cudaStream_t, pCaptureStatus: *mut cudaStreamCaptureStatus) {
        // SAFETY: forwarded API contract.
        unsafe { is_capturing(stream, pCaptureStatus) }
    }

    /// `cudaStreamGetCaptureInfo` (CUDA 13's, with edge data): the dependency and edge arrays
    /// stay valid until the calling thread's next call of it.
    #[per_thread(cudaStreamGetCaptureInfo_ptsz)]
    fn cudaStreamGetCaptureInfo(
        stream: cudaStream_t,
        captureStatus_out: *mut cudaStreamCaptureStatus,
        id_out: *mut c_ulonglong,
        graph_out: *mut cudaGraph_t,
        dependencies_out: *mut *const cudaGraphNode_t,
        edgeData_out: *mut *const cudaGraphEdgeData,
        numDependencies_out: *mut usize,
    ) {
        // SAFETY: forwarded API contract.
        unsafe {
            get_capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out)
        }
    }

    /// `cudaStreamUpdateCaptureDependencies` (default edges only).
    #[per_thread(cudaStreamUpdateCaptureDependencies_ptsz)]
    fn cudaStreamUpdateCaptureDependencies(
        stream: cudaStream_t,
        dependencies: *mut cudaGraphNode_t,
        dependencyData: *const cudaGraphEdgeData,
        numDependencies: usize,
        flags: c_uint,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { update_capture_deps(stream, dependencies, dependencyData, numDependencies, flags) }
    }

    /// `cudaGraphCreate` (flags must be 0).
    fn cudaGraphCreate(pGraph: *mut cudaGraph_t, flags: c_uint) {
        non_null(pGraph)?;
        if flags != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let reply = rt.session.submit(Call::new(Op::GraphCreate, d))?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pGraph, usize_of(reply.rets[0]) as cudaGraph_t) }
    }

    /// `cudaGraphDestroy`.
    fn cudaGraphDestroy(graph: cudaGraph_t) {
        if graph.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session.submit(Call::new(Op::GraphDestroy, d).args(&[handle(graph)]))?;
        GRAPH_MEMORY
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(g, base)| {
                if *g == handle(graph) {
                    rt.allocations.remove(*base);
                    false
                } else {
                    true
                }
            });
        Ok(())
    }

    /// `cudaGraphClone`.
    fn cudaGraphClone(pGraphClone: *mut cudaGraph_t, originalGraph: cudaGraph_t) {
        non_null(pGraphClone)?;
        if originalGraph.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let reply = rt.session.submit(Call::new(Op::GraphClone, d).args(&[handle(originalGraph)]))?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pGraphClone, usize_of(reply.rets[0]) as cudaGraph_t) }
    }

    /// `cudaGraphAddNode`: the node types of the `cudaGraphAdd*Node` functions above (default
    /// edges only).
    fn cudaGraphAddNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        dependencyData: *const cudaGraphEdgeData,
        numDependencies: usize,
        nodeParams: *mut crate::generated::cudaGraphNodeParams,
    ) {
        non_null(nodeParams)?;
        let (rt, d) = current()?;
        // SAFETY: forwarded API contract; the union member named by `type_` is initialised.
        unsafe {
            default_edges(dependencyData, numDependencies)?;
            let params = &mut *nodeParams;
            match params.type_ {
                cu::cudaGraphNodeTypeMemAlloc => {
                    non_null(pGraphNode)?;
                    let a = &mut params.__bindgen_anon_1.alloc;
                    let (node, dptr) = mem_alloc_node(rt, graph, pDependencies, numDependencies, &a.poolProps, a.accessDescs, a.accessDescCount, a.bytesize)?;
                    a.dptr = usize_of(dptr) as *mut c_void;
                    return write_out(pGraphNode, usize_of(node) as cudaGraphNode_t);
                }
                cu::cudaGraphNodeTypeMemFree => {
                    let p = (params.__bindgen_anon_1.free.dptr as u64).to_le_bytes();
                    return add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_MEM_FREE, &p);
                }
                _ => {}
            }
            let (ty, p) = generic_node(rt, d, params)?;
            add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, ty, &p)
        }
    }

    /// `cudaGraphNodeSetParams`.
    fn cudaGraphNodeSetParams(node: cudaGraphNode_t, nodeParams: *mut crate::generated::cudaGraphNodeParams) {
        non_null(nodeParams)?;
        let (rt, d) = current()?;
        // SAFETY: forwarded API contract.
        let (ty, p) = unsafe { generic_node(rt, d, &*nodeParams)? };
        set_params(rt, d, std::ptr::null_mut(), node, ty, &p)
    }

    /// `cudaGraphExecNodeSetParams`.
    fn cudaGraphExecNodeSetParams(
        graphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        nodeParams: *mut crate::generated::cudaGraphNodeParams,
    ) {
        non_null(nodeParams)?;
        if graphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        // SAFETY: forwarded API contract.
        let (ty, p) = unsafe { generic_node(rt, d, &*nodeParams)? };
        set_params(rt, d, graphExec, node, ty, &p)
    }

    /// `cudaGraphAddMemAllocNode`: pinned device memory of the pool's device, at an address
    /// fixed for the graph's lifetime (written to `nodeParams->dptr`).
    fn cudaGraphAddMemAllocNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        nodeParams: *mut cu::cudaMemAllocNodeParams,
    ) {
        non_null(pGraphNode)?;
        non_null(nodeParams)?;
        let (rt, _) = current()?;
        // SAFETY: non-null, readable and writable (API contract); the rest forwarded.
        unsafe {
            let p = &mut *nodeParams;
            let (node, dptr) = mem_alloc_node(rt, graph, pDependencies, numDependencies, &p.poolProps, p.accessDescs, p.accessDescCount, p.bytesize)?;
            p.dptr = usize_of(dptr) as *mut c_void;
            write_out(pGraphNode, usize_of(node) as cudaGraphNode_t)
        }
    }

    /// `cudaGraphAddMemFreeNode`: `dptr` must be a graph allocation's address.
    fn cudaGraphAddMemFreeNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        dptr: *mut c_void,
    ) {
        let (rt, d) = current()?;
        let p = (dptr as u64).to_le_bytes();
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_MEM_FREE, &p) }
    }

    /// `cudaGraphAddEmptyNode`.
    fn cudaGraphAddEmptyNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
    ) {
        let (rt, d) = current()?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_EMPTY, &[]) }
    }

    /// `cudaGraphAddKernelNode`: `func` is a host stub or a `cudaKernel_t`; the parameters are
    /// packed with the kernel's layout, as for a launch.
    fn cudaGraphAddKernelNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        pNodeParams: *const cudaKernelNodeParams,
    ) {
        non_null(pNodeParams)?;
        let (rt, d) = current()?;
        // SAFETY: non-null and readable, with kernel parameters as the API requires.
        let p = unsafe { kernel_node(rt, d, &*pNodeParams)? };
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_KERNEL, &p) }
    }

    /// `cudaGraphKernelNodeGetParams`: `func` is the kernel's host stub; the parameter values
    /// stay valid until the node's next `cudaGraphKernelNodeGetParams`.
    fn cudaGraphKernelNodeGetParams(node: cudaGraphNode_t, pNodeParams: *mut cudaKernelNodeParams) {
        non_null(pNodeParams)?;
        if node.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let mut want = KERNEL_NODE_HEADER + 4096;
        let enc = loop {
            let mut buf = vec![0u8; want];
            let reply = rt.session.submit(
                Call::new(Op::GraphKernelNodeGetParams, d)
                    .args(&[handle(node)])
                    .output(&mut buf),
            )?;
            let n = usize::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)?;
            if n <= want {
                buf.truncate(n);
                break buf;
            }
            want = n;
        };
        let k = KernelNode::decode(&enc).ok_or(CudaError::UNKNOWN)?;
        let kernel = registry()
            .kernel_by_function(d, k.function)
            .ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        let resolved = modules::kernel(rt, kernel, d)?;
        if k.params.len() < params::block_len(&resolved.params)? {
            return Err(CudaError::UNKNOWN);
        }
        let mut block = vec![0u64; k.params.len().div_ceil(8)];
        // SAFETY: `block` holds at least `k.params.len()` bytes; u64 has no invalid values.
        unsafe {
            std::ptr::copy_nonoverlapping(k.params.as_ptr(), block.as_mut_ptr().cast::<u8>(), k.params.len());
        };
        let base = block.as_mut_ptr().cast::<u8>();
        let mut pointers: Vec<*mut c_void> = resolved
            .params
            .iter()
            .map(|p| base.wrapping_add(p.offset as usize).cast::<c_void>())
            .collect();
        let p = cudaKernelNodeParams {
            func: kernel.host_fun as *mut c_void,
            gridDim: dim3 { x: k.grid[0], y: k.grid[1], z: k.grid[2] },
            blockDim: dim3 { x: k.block[0], y: k.block[1], z: k.block[2] },
            sharedMemBytes: k.shared_mem,
            kernelParams: if pointers.is_empty() { std::ptr::null_mut() } else { pointers.as_mut_ptr() },
            extra: std::ptr::null_mut(),
        };
        let mut stored = KERNEL_PARAMS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        stored.retain(|(n, _)| *n != handle(node));
        stored.push((handle(node), KernelParamsCopy { _block: block, _pointers: pointers }));
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pNodeParams, p) }
    }

    /// `cudaGraphKernelNodeSetParams`.
    fn cudaGraphKernelNodeSetParams(node: cudaGraphNode_t, pNodeParams: *const cudaKernelNodeParams) {
        non_null(pNodeParams)?;
        let (rt, d) = current()?;
        // SAFETY: as for cudaGraphAddKernelNode.
        let p = unsafe { kernel_node(rt, d, &*pNodeParams)? };
        set_params(rt, d, std::ptr::null_mut(), node, g::NODE_KERNEL, &p)
    }

    /// `cudaGraphExecKernelNodeSetParams`.
    fn cudaGraphExecKernelNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        pNodeParams: *const cudaKernelNodeParams,
    ) {
        non_null(pNodeParams)?;
        if hGraphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        // SAFETY: as for cudaGraphAddKernelNode.
        let p = unsafe { kernel_node(rt, d, &*pNodeParams)? };
        set_params(rt, d, hGraphExec, node, g::NODE_KERNEL, &p)
    }

    /// `cudaGraphAddMemcpyNode`: pitched pointers, device or host-mapped memory.
    fn cudaGraphAddMemcpyNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        pCopyParams: *const cudaMemcpy3DParms,
    ) {
        non_null(pCopyParams)?;
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = memcpy_node(rt, unsafe { &*pCopyParams })?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_MEMCPY, &p) }
    }

    /// `cudaGraphAddMemcpyNode1D`.
    fn cudaGraphAddMemcpyNode1D(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
    ) {
        let (rt, d) = current()?;
        let p = memcpy_node(rt, &memcpy_1d(dst, src, count, kind))?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_MEMCPY, &p) }
    }

    /// `cudaGraphMemcpyNodeSetParams`.
    fn cudaGraphMemcpyNodeSetParams(node: cudaGraphNode_t, pNodeParams: *const cudaMemcpy3DParms) {
        non_null(pNodeParams)?;
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = memcpy_node(rt, unsafe { &*pNodeParams })?;
        set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMCPY, &p)
    }

    /// `cudaGraphMemcpyNodeSetParams1D`.
    fn cudaGraphMemcpyNodeSetParams1D(
        node: cudaGraphNode_t,
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
    ) {
        let (rt, d) = current()?;
        let p = memcpy_node(rt, &memcpy_1d(dst, src, count, kind))?;
        set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMCPY, &p)
    }

    /// `cudaGraphExecMemcpyNodeSetParams`.
    fn cudaGraphExecMemcpyNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        pNodeParams: *const cudaMemcpy3DParms,
    ) {
        non_null(pNodeParams)?;
        if hGraphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = memcpy_node(rt, unsafe { &*pNodeParams })?;
        set_params(rt, d, hGraphExec, node, g::NODE_MEMCPY, &p)
    }

    /// `cudaGraphExecMemcpyNodeSetParams1D`.
    fn cudaGraphExecMemcpyNodeSetParams1D(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
    ) {
        if hGraphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let p = memcpy_node(rt, &memcpy_1d(dst, src, count, kind))?;
        set_params(rt, d, hGraphExec, node, g::NODE_MEMCPY, &p)
    }

    /// `cudaGraphAddMemcpyNodeToSymbol`.
    fn cudaGraphAddMemcpyNodeToSymbol(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        symbol: *const c_void,
        src: *const c_void,
        count: usize,
        offset: usize,
        kind: cudaMemcpyKind,
    ) {
        let (rt, d) = current()?;
        let p = symbol_node(rt, d, symbol, src, count, offset, kind, true)?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_MEMCPY, &p) }
    }

    /// `cudaGraphAddMemcpyNodeFromSymbol`.
    fn cudaGraphAddMemcpyNodeFromSymbol(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        dst: *mut c_void,
        symbol: *const c_void,
        count: usize,
        offset: usize,
        kind: cudaMemcpyKind,
    ) {
        let (rt, d) = current()?;
        let p = symbol_node(rt, d, symbol, dst, count, offset, kind, false)?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_MEMCPY, &p) }
    }

    /// `cudaGraphMemcpyNodeSetParamsToSymbol`.
    fn cudaGraphMemcpyNodeSetParamsToSymbol(
        node: cudaGraphNode_t,
        symbol: *const c_void,
        src: *const c_void,
        count: usize,
        offset: usize,
        kind: cudaMemcpyKind,
    ) {
        let (rt, d) = current()?;
        let p = symbol_node(rt, d, symbol, src, count, offset, kind, true)?;
        set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMCPY, &p)
    }

    /// `cudaGraphMemcpyNodeSetParamsFromSymbol`.
    fn cudaGraphMemcpyNodeSetParamsFromSymbol(
        node: cudaGraphNode_t,
        dst: *mut c_void,
        symbol: *const c_void,
        count: usize,
        offset: usize,
        kind: cudaMemcpyKind,
    ) {
        let (rt, d) = current()?;
        let p = symbol_node(rt, d, symbol, dst, count, offset, kind, false)?;
        set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMCPY, &p)
    }

    /// `cudaGraphExecMemcpyNodeSetParamsToSymbol`.
    fn cudaGraphExecMemcpyNodeSetParamsToSymbol(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        symbol: *const c_void,
        src: *const c_void,
        count: usize,
        offset: usize,
        kind: cudaMemcpyKind,
    ) {
        if hGraphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let p = symbol_node(rt, d, symbol, src, count, offset, kind, true)?;
        set_params(rt, d, hGraphExec, node, g::NODE_MEMCPY, &p)
    }

    /// `cudaGraphExecMemcpyNodeSetParamsFromSymbol`.
    fn cudaGraphExecMemcpyNodeSetParamsFromSymbol(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        dst: *mut c_void,
        symbol: *const c_void,
        count: usize,
        offset: usize,
        kind: cudaMemcpyKind,
    ) {
        if hGraphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let p = symbol_node(rt, d, symbol, dst, count, offset, kind, false)?;
        set_params(rt, d, hGraphExec, node, g::NODE_MEMCPY, &p)
    }

    /// `cudaGraphMemcpyNodeGetParams`: pitched pointers at offset 0 (host-mapped memory by its
    /// guest pointer), `cudaMemcpyDefault` as the kind.
    fn cudaGraphMemcpyNodeGetParams(node: cudaGraphNode_t, pNodeParams: *mut cudaMemcpy3DParms) {
        non_null(pNodeParams)?;
        let (rt, enc) = node_params(node, g::NODE_MEMCPY, g::MEMCPY_NODE_SIZE)?;
        let m = MemcpyNode::decode(&enc).ok_or(CudaError::UNKNOWN)?;
        let guest = |a: u64| rt.host_memory.host_address(a).map_or(usize_of(a), |h| h) as *mut c_void;
        let mut p = cudaMemcpy3DParms::default();
        p.srcPtr.ptr = guest(m.src);
        p.srcPtr.pitch = usize_of(m.src_pitch);
        p.srcPtr.xsize = usize_of(m.width);
        p.srcPtr.ysize = usize_of(m.src_rows);
        p.dstPtr.ptr = guest(m.dst);
        p.dstPtr.pitch = usize_of(m.dst_pitch);
        p.dstPtr.xsize = usize_of(m.width);
        p.dstPtr.ysize = usize_of(m.dst_rows);
        p.extent.width = usize_of(m.width);
        p.extent.height = usize_of(m.height);
        p.extent.depth = usize_of(m.depth);
        p.kind = cu::cudaMemcpyDefault;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pNodeParams, p) }
    }

    /// `cudaGraphMemsetNodeGetParams`.
    fn cudaGraphMemsetNodeGetParams(node: cudaGraphNode_t, pNodeParams: *mut cudaMemsetParams) {
        non_null(pNodeParams)?;
        let (rt, enc) = node_params(node, g::NODE_MEMSET, g::MEMSET_NODE_SIZE)?;
        let m = MemsetNode::decode(&enc).ok_or(CudaError::UNKNOWN)?;
        let dst = rt.host_memory.host_address(m.dst).map_or(usize_of(m.dst), |h| h);
        let p = cudaMemsetParams {
            dst: dst as *mut c_void,
            pitch: usize_of(m.pitch),
            value: m.value,
            elementSize: m.element_size,
            width: usize_of(m.width),
            height: usize_of(m.height),
        };
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pNodeParams, p) }
    }

    /// `cudaGraphAddMemsetNode`.
    fn cudaGraphAddMemsetNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        pMemsetParams: *const cudaMemsetParams,
    ) {
        non_null(pMemsetParams)?;
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = memset_node(rt, unsafe { &*pMemsetParams })?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_MEMSET, &p) }
    }

    /// `cudaGraphMemsetNodeSetParams`.
    fn cudaGraphMemsetNodeSetParams(node: cudaGraphNode_t, pNodeParams: *const cudaMemsetParams) {
        non_null(pNodeParams)?;
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = memset_node(rt, unsafe { &*pNodeParams })?;
        set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMSET, &p)
    }

    /// `cudaGraphExecMemsetNodeSetParams`.
    fn cudaGraphExecMemsetNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        pNodeParams: *const cudaMemsetParams,
    ) {
        non_null(pNodeParams)?;
        if hGraphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = memset_node(rt, unsafe { &*pNodeParams })?;
        set_params(rt, d, hGraphExec, node, g::NODE_MEMSET, &p)
    }

    /// `cudaGraphAddHostNode`: the function runs in this process each time the node does.
    fn cudaGraphAddHostNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        pNodeParams: *const cudaHostNodeParams,
    ) {
        non_null(pNodeParams)?;
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = host_node(unsafe { &*pNodeParams })?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_HOST, &p) }
    }

    /// `cudaGraphHostNodeGetParams`: the function and argument the node was given.
    fn cudaGraphHostNodeGetParams(node: cudaGraphNode_t, pNodeParams: *mut cudaHostNodeParams) {
        non_null(pNodeParams)?;
        let (rt, _) = current()?;
        match rt.host_fns.node_callback(node as u64) {
            Some(crate::core::host_fns::HostCallback::Func { func, data }) => {
                // SAFETY: non-null and writable (API contract).
                unsafe {
                    write_out(
                        pNodeParams,
                        cudaHostNodeParams {
                            fn_: Some(func),
                            userData: data as *mut c_void,
                        },
                    )
                }
            }
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// `cudaGraphHostNodeSetParams`.
    fn cudaGraphHostNodeSetParams(node: cudaGraphNode_t, pNodeParams: *const cudaHostNodeParams) {
        non_null(pNodeParams)?;
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = host_node(unsafe { &*pNodeParams })?;
        set_params(rt, d, core::ptr::null_mut(), node, g::NODE_HOST, &p)?;
        if let Some(key) = host_node_key(&p) {
            rt.host_fns.set_node(node as u64, key);
        }
        Ok(())
    }

    /// `cudaGraphExecHostNodeSetParams`: the executable graph's node runs the new function; the
    /// graph's own node keeps its parameters.
    fn cudaGraphExecHostNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        pNodeParams: *const cudaHostNodeParams,
    ) {
        non_null(pNodeParams)?;
        if hGraphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        // SAFETY: non-null and readable (API contract).
        let p = host_node(unsafe { &*pNodeParams })?;
        set_params(rt, d, hGraphExec, node, g::NODE_HOST, &p)
    }

    /// `cudaGraphAddChildGraphNode`: the child graph is cloned into the node.
    fn cudaGraphAddChildGraphNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        childGraph: cudaGraph_t,
    ) {
        if childGraph.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let p = handle(childGraph).to_le_bytes();
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_GRAPH, &p) }
    }

    /// `cudaGraphExecChildGraphNodeSetParams`.
    fn cudaGraphExecChildGraphNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        childGraph: cudaGraph_t,
    ) {
        if hGraphExec.is_null() || node.is_null() || childGraph.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session.submit(Call::new(Op::GraphExecChildGraph, d).args(&[
            handle(hGraphExec),
            handle(node),
            handle(childGraph),
        ]))?;
        Ok(())
    }

    /// `cudaGraphAddEventRecordNode`.
    fn cudaGraphAddEventRecordNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        event: cudaEvent_t,
    ) {
        let (rt, d) = current()?;
        let p = event_handle(rt, event)?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_EVENT_RECORD, &p) }
    }

    /// `cudaGraphAddEventWaitNode`.
    fn cudaGraphAddEventWaitNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        event: cudaEvent_t,
    ) {
        let (rt, d) = current()?;
        let p = event_handle(rt, event)?;
        // SAFETY: forwarded API contract.
        unsafe { add_node(rt, d, pGraphNode, graph, pDependencies, numDependencies, g::NODE_WAIT_EVENT, &p) }
    }

    /// `cudaGraphEventRecordNodeSetEvent`.
    fn cudaGraphEventRecordNodeSetEvent(node: cudaGraphNode_t, event: cudaEvent_t) {
        let (rt, d) = current()?;
        let p = event_handle(rt, event)?;
        set_params(rt, d, std::ptr::null_mut(), node, g::NODE_EVENT_RECORD, &p)
    }

    /// `cudaGraphEventWaitNodeSetEvent`.
    fn cudaGraphEventWaitNodeSetEvent(node: cudaGraphNode_t, event: cudaEvent_t) {
        let (rt, d) = current()?;
        let p = event_handle(rt, event)?;
        set_params(rt, d, std::ptr::null_mut(), node, g::NODE_WAIT_EVENT, &p)
    }

    /// `cudaGraphEventRecordNodeGetEvent`.
    fn cudaGraphEventRecordNodeGetEvent(node: cudaGraphNode_t, event_out: *mut cudaEvent_t) {
        // SAFETY: forwarded API contract.
        unsafe { node_event(node, event_out, cu::cudaGraphNodeTypeEventRecord) }
    }

    /// `cudaGraphEventWaitNodeGetEvent`.
    fn cudaGraphEventWaitNodeGetEvent(node: cudaGraphNode_t, event_out: *mut cudaEvent_t) {
        // SAFETY: forwarded API contract.
        unsafe { node_event(node, event_out, cu::cudaGraphNodeTypeWaitEvent) }
    }

    /// `cudaGraphChildGraphNodeGetGraph`: the graph the node owns (it may be changed, not
    /// destroyed).
    fn cudaGraphChildGraphNodeGetGraph(node: cudaGraphNode_t, pGraph: *mut cudaGraph_t) {
        non_null(pGraph)?;
        let (_, g) = graph_query(handle(node), 1)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pGraph, usize_of(g) as cudaGraph_t) }
    }

    /// `cudaGraphNodeFindInClone`.
    fn cudaGraphNodeFindInClone(pNode: *mut cudaGraphNode_t, originalNode: cudaGraphNode_t, clonedGraph: cudaGraph_t) {
        non_null(pNode)?;
        if clonedGraph.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (_, n) = graph_query_in(handle(originalNode), 3, handle(clonedGraph))?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pNode, usize_of(n) as cudaGraphNode_t) }
    }

    /// `cudaGraphDestroyNode`: the node and its edges leave its graph.
    fn cudaGraphDestroyNode(node: cudaGraphNode_t) {
        if node.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session.submit(Call::new(Op::GraphDestroyNode, d).args(&[handle(node)]))?;
        Ok(())
    }

    /// `cudaGraphExecGetFlags`: the flags it was instantiated with.
    fn cudaGraphExecGetFlags(graphExec: cudaGraphExec_t, flags: *mut c_ulonglong) {
        non_null(flags)?;
        let (_, f) = graph_query(handle(graphExec), 2)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(flags, f) }
    }

    /// `cudaGraphExecEventRecordNodeSetEvent`.
    fn cudaGraphExecEventRecordNodeSetEvent(hGraphExec: cudaGraphExec_t, hNode: cudaGraphNode_t, event: cudaEvent_t) {
        // SAFETY: handles only.
        unsafe { exec_set_event(hGraphExec, hNode, event) }
    }

    /// `cudaGraphExecEventWaitNodeSetEvent`.
    fn cudaGraphExecEventWaitNodeSetEvent(hGraphExec: cudaGraphExec_t, hNode: cudaGraphNode_t, event: cudaEvent_t) {
        // SAFETY: handles only.
        unsafe { exec_set_event(hGraphExec, hNode, event) }
    }

    /// `cudaGraphAddDependencies` (default edges only).
    fn cudaGraphAddDependencies(
        graph: cudaGraph_t,
        from: *const cudaGraphNode_t,
        to: *const cudaGraphNode_t,
        edgeData: *const cudaGraphEdgeData,
        numDependencies: usize,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { change_edges(graph, from, to, edgeData, numDependencies, false) }
    }

    /// `cudaGraphRemoveDependencies` (default edges only).
    fn cudaGraphRemoveDependencies(
        graph: cudaGraph_t,
        from: *const cudaGraphNode_t,
        to: *const cudaGraphNode_t,
        edgeData: *const cudaGraphEdgeData,
        numDependencies: usize,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { change_edges(graph, from, to, edgeData, numDependencies, true) }
    }

    /// `cudaGraphGetNodes`.
    fn cudaGraphGetNodes(graph: cudaGraph_t, nodes: *mut cudaGraphNode_t, numNodes: *mut usize) {
        // SAFETY: forwarded API contract.
        unsafe { graph_nodes(graph, false, nodes, numNodes) }
    }

    /// `cudaGraphGetRootNodes`.
    fn cudaGraphGetRootNodes(graph: cudaGraph_t, pRootNodes: *mut cudaGraphNode_t, pNumRootNodes: *mut usize) {
        // SAFETY: forwarded API contract.
        unsafe { graph_nodes(graph, true, pRootNodes, pNumRootNodes) }
    }

    /// `cudaGraphGetEdges` (edge data, when asked for, is all default).
    fn cudaGraphGetEdges(
        graph: cudaGraph_t,
        from: *mut cudaGraphNode_t,
        to: *mut cudaGraphNode_t,
        edgeData: *mut cudaGraphEdgeData,
        numEdges: *mut usize,
    ) {
        if graph.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        non_null(numEdges)?;
        if from.is_null() != to.is_null() || (!edgeData.is_null() && from.is_null()) {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let pairs = fetch_list(rt, d, Op::GraphGetEdges, &[handle(graph)], 2)?;
        let f: Vec<u64> = pairs.iter().step_by(2).copied().collect();
        let t: Vec<u64> = pairs.iter().skip(1).step_by(2).copied().collect();
        // SAFETY: forwarded API contract: `from`, `to` and `edgeData` hold `*numEdges` entries.
        unsafe {
            let room = if from.is_null() { 0 } else { *numEdges };
            if !from.is_null() {
                let mut n = room;
                write_list(&f, from, &raw mut n)?;
                let mut n2 = room;
                write_list(&t, to, &raw mut n2)?;
            }
            zero_edges(edgeData, room);
            numEdges.write(if from.is_null() { f.len() } else { f.len().min(room) });
        }
        Ok(())
    }

    /// `cudaGraphNodeGetType`.
    fn cudaGraphNodeGetType(node: cudaGraphNode_t, pType: *mut cudaGraphNodeType) {
        non_null(pType)?;
        if node.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let mut none = [0u8; 0];
        let reply = rt.session.submit(
            Call::new(Op::GraphNodeQuery, d).args(&[handle(node), 0]).output(&mut none),
        )?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pType, low_u32(reply.rets[0]) as cudaGraphNodeType) }
    }

    /// `cudaGraphNodeGetDependencies`.
    fn cudaGraphNodeGetDependencies(
        node: cudaGraphNode_t,
        pDependencies: *mut cudaGraphNode_t,
        edgeData: *mut cudaGraphEdgeData,
        pNumDependencies: *mut usize,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { node_lists(node, 1, pDependencies, edgeData, pNumDependencies) }
    }

    /// `cudaGraphNodeGetDependentNodes`.
    fn cudaGraphNodeGetDependentNodes(
        node: cudaGraphNode_t,
        pDependentNodes: *mut cudaGraphNode_t,
        edgeData: *mut cudaGraphEdgeData,
        pNumDependentNodes: *mut usize,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { node_lists(node, 2, pDependentNodes, edgeData, pNumDependentNodes) }
    }

    /// `cudaGraphInstantiate`.
    fn cudaGraphInstantiate(pGraphExec: *mut cudaGraphExec_t, graph: cudaGraph_t, flags: c_ulonglong) {
        // SAFETY: forwarded API contract.
        unsafe { instantiate(pGraphExec, graph, flags, std::ptr::null_mut()) }
    }

    /// `cudaGraphInstantiateWithFlags`.
    fn cudaGraphInstantiateWithFlags(pGraphExec: *mut cudaGraphExec_t, graph: cudaGraph_t, flags: c_ulonglong) {
        // SAFETY: forwarded API contract.
        unsafe { instantiate(pGraphExec, graph, flags, std::ptr::null_mut()) }
    }

    /// `cudaGraphInstantiateWithParams`: flags and upload stream; the result is written back.
    #[per_thread(cudaGraphInstantiateWithParams_ptsz)]
    fn cudaGraphInstantiateWithParams(
        pGraphExec: *mut cudaGraphExec_t,
        graph: cudaGraph_t,
        instantiateParams: *mut cudaGraphInstantiateParams,
    ) {
        non_null(instantiateParams)?;
        // SAFETY: non-null, readable and writable (API contract).
        let p = unsafe { &mut *instantiateParams };
        // SAFETY: forwarded API contract.
        let r = unsafe { instantiate(pGraphExec, graph, p.flags, p.uploadStream) };
        p.result_out = if r.is_ok() { INSTANTIATE_SUCCESS } else { INSTANTIATE_ERROR };
        p.errNode_out = std::ptr::null_mut();
        r
    }

    /// `cudaGraphLaunch`: fire-and-forget, in stream order, like a kernel launch.
    #[per_thread(cudaGraphLaunch_ptsz)]
    fn cudaGraphLaunch(graphExec: cudaGraphExec_t, stream: cudaStream_t) {
        graph_launch(graphExec, stream, false)
    }

    /// `cudaGraphUpload`.
    #[per_thread(cudaGraphUpload_ptsz)]
    fn cudaGraphUpload(graphExec: cudaGraphExec_t, stream: cudaStream_t) {
        graph_launch(graphExec, stream, true)
    }

    /// `cudaGraphExecDestroy`.
    fn cudaGraphExecDestroy(graphExec: cudaGraphExec_t) {
        if graphExec.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session.submit(Call::new(Op::GraphExecDestroy, d).args(&[handle(graphExec)]))?;
        Ok(())
    }

    /// `cudaGraphExecUpdate`: the driver's verdict, with the node that failed.
    fn cudaGraphExecUpdate(
        hGraphExec: cudaGraphExec_t,
        hGraph: cudaGraph_t,
        resultInfo: *mut cudaGraphExecUpdateResultInfo,
    ) {
        if hGraphExec.is_null() || hGraph.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let call = Call::new(Op::GraphExecUpdate, d).args(&[handle(hGraphExec), handle(hGraph)]);
        let reply = rt.session.submit(call)?;
        let (result, node) = (reply.rets[0], reply.rets[1]);
        if !resultInfo.is_null() {
            let info = cudaGraphExecUpdateResultInfo {
                result: low_u32(result) as _,
                errorNode: usize_of(node) as cudaGraphNode_t,
                errorFromNode: std::ptr::null_mut(),
            };
            // SAFETY: non-null and writable (API contract).
            unsafe { resultInfo.write(info) };
        }
        if result != 0 {
            return Err(CudaError::GRAPH_EXEC_UPDATE_FAILURE);
        }
        Ok(())
    }

    /// `cudaGraphNodeSetEnabled`.
    fn cudaGraphNodeSetEnabled(hGraphExec: cudaGraphExec_t, hNode: cudaGraphNode_t, isEnabled: c_uint) {
        if hGraphExec.is_null() || hNode.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session.submit(Call::new(Op::GraphNodeEnabled, d).args(&[
            handle(hGraphExec),
            handle(hNode),
            1,
            u64::from(isEnabled != 0),
        ]))?;
        Ok(())
    }

    /// `cudaGraphNodeGetEnabled`.
    fn cudaGraphNodeGetEnabled(hGraphExec: cudaGraphExec_t, hNode: cudaGraphNode_t, isEnabled: *mut c_uint) {
        non_null(isEnabled)?;
        if hGraphExec.is_null() || hNode.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let reply = rt.session.submit(
            Call::new(Op::GraphNodeEnabled, d).args(&[handle(hGraphExec), handle(hNode), 0]),
        )?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(isEnabled, low_u32(reply.rets[0])) }
    }

    /// `cudaGraphDebugDotPrint`: the driver's DOT text, written to `path` here in the guest.
    fn cudaGraphDebugDotPrint(graph: cudaGraph_t, path: *const c_char, flags: c_uint) {
        non_null(path)?;
        if graph.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let mut want = 64 << 10;
        let text = loop {
            let mut buf = vec![0u8; want];
            let reply = rt.session.submit(
                Call::new(Op::GraphDebugDot, d)
                    .args(&[handle(graph), u64::from(flags)])
                    .output(&mut buf),
            )?;
            let n = usize::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)?;
            if n <= want {
                buf.truncate(n);
                break buf;
            }
            want = n;
        };
        // SAFETY: a NUL-terminated string (API contract).
        let path = unsafe { CStr::from_ptr(path) };
        let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes());
        std::fs::write(path, text).map_err(|_| CudaError::OPERATING_SYSTEM)
    }

    /// `cudaDeviceGraphMemTrim`: the driver's, on the host.
    fn cudaDeviceGraphMemTrim(device: core::ffi::c_int) {
        let (rt, _) = current()?;
        let d = rt.devices.check(device)?;
        rt.session.submit(Call::new(Op::GraphMem, d).args(&[0, 0, 0]))?;
        Ok(())
    }

    /// `cudaDeviceSetGraphMemAttribute`: the driver's (only the high watermarks can be reset,
    /// to 0).
    fn cudaDeviceSetGraphMemAttribute(device: core::ffi::c_int, attr: crate::generated::cudaGraphMemAttributeType, value: *mut c_void) {
        non_null(value)?;
        let (rt, _) = current()?;
        let d = rt.devices.check(device)?;
        // SAFETY: a u64 (cuuint64_t), readable (API contract).
        let v = unsafe { value.cast::<u64>().read_unaligned() };
        rt.session.submit(Call::new(Op::GraphMem, d).args(&[2, u64::from(attr), v]))?;
        Ok(())
    }

    /// `cudaDeviceGetGraphMemAttribute`: the driver's figures.
    fn cudaDeviceGetGraphMemAttribute(device: core::ffi::c_int, attr: crate::generated::cudaGraphMemAttributeType, value: *mut c_void) {
        non_null(value)?;
        let (rt, _) = current()?;
        let d = rt.devices.check(device)?;
        let reply = rt.session.submit(Call::new(Op::GraphMem, d).args(&[1, u64::from(attr), 0]))?;
        // SAFETY: every attribute is a u64 (cuuint64_t), writable (API contract).
        unsafe { value.cast::<u64>().write_unaligned(reply.rets[0]) };
        Ok(())
    }
}

//! CUDA graphs and stream capture, implemented once for both faces (the runtime face's
//! `runtime/graphs.rs` and the driver face's `driver/api/graph.rs` are C ABI over these). The graphs,
//! nodes and executable graphs are the host's (real driver objects in the session's worker);
//! `cudaGraph_t`/`CUgraph`, `cudaGraphNode_t`/`CUgraphNode` and `cudaGraphExec_t`/`CUgraphExec`
//! are the host's session-local handles, which it checks on every use, the same on both faces.
//! Node parameters travel in the encodings of `qcuda_proto::graph`; kernel parameters are packed
//! with the kernel's registered layout, exactly as for a launch. Capture: capture.rs (guest side)
//! and vhost-cuda's gpu_state/graphs.rs (host side). Conditional nodes: the host's driver makes
//! the handles and the body graphs; [`add_conditional_node`] keeps CUDA's array of the bodies.
//!
//! Not served: external semaphore nodes, batch memory-operation nodes, kernel node attributes,
//! user objects, arrays in memcpy nodes, and edges with ports or types other than the default.

#![allow(non_snake_case)] // the calls keep CUDA's parameter names

use super::conv::{low_u32, usize_of};
use core::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};
use std::cell::RefCell;

use qcuda_proto::{
    graph::{self as g, KernelNode, MemcpyNode, MemsetNode, KERNEL_NODE_HEADER},
    Op,
};

use super::{
    capture,
    cuda_error::{CudaError, CudaResult},
    memory::{self, Direction},
    modules, params,
    runtime::{current, non_null, registry, Runtime},
    transport::Call,
    warnings::warn_once,
};
use crate::generated::{
    self as cu, cudaEvent_t, cudaGraphEdgeData, cudaGraphExecUpdateResultInfo, cudaGraphExec_t,
    cudaGraphInstantiateParams, cudaGraphNodeType, cudaGraphNode_t, cudaGraph_t,
    cudaHostNodeParams, cudaKernelNodeParams, cudaMemcpy3DParms, cudaMemcpyKind, cudaMemsetParams,
    cudaStreamCaptureMode, cudaStreamCaptureStatus, cudaStream_t, dim3,
};

/// Writes `value` through an out-parameter, or fails with `cudaErrorInvalidValue` for null.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
pub unsafe fn write_out<T>(out: *mut T, value: T) -> CudaResult<()> {
    non_null(out)?;
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Node handles in one `GraphGetNodes`-style reply at first; asked again when there are more.
pub const FIRST_LIST: usize = 256;
/// cudaGraphInstantiateSuccess / cudaGraphInstantiateError.
pub const INSTANTIATE_SUCCESS: u32 = 0;
pub const INSTANTIATE_ERROR: u32 = 1;

/// A kernel node's parameters as `cudaGraphKernelNodeGetParams` hands them out: the block
/// (8-byte aligned) and one pointer per parameter into it.
#[derive(Debug)]
pub struct KernelParamsCopy {
    pub _block: Vec<u64>,
    pub _pointers: Vec<*mut c_void>,
}

// SAFETY: the pointers point into the record's own block and are only handed to the
// application, never dereferenced here.
unsafe impl Send for KernelParamsCopy {}

/// Per kernel node, the parameters last handed out: they stay valid until the node's next
/// `cudaGraphKernelNodeGetParams`, as the runtime keeps them until the parameters change.
pub static KERNEL_PARAMS: std::sync::Mutex<Vec<(u64, KernelParamsCopy)>> =
    std::sync::Mutex::new(Vec::new());

/// Per graph, the allocations of its memory allocation nodes, which the guest's allocation
/// table holds (so that `cudaMemcpyDefault` and pointer attributes see device memory) until the
/// graph is destroyed.
pub static GRAPH_MEMORY: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

thread_local! {
    /// Storage behind `cudaStreamGetCaptureInfo`'s dependency and edge-data arrays, valid until
    /// the thread's next call of it.
    static CAPTURE_DEPS: RefCell<(Vec<cudaGraphNode_t>, Vec<cudaGraphEdgeData>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

pub fn handle<T>(p: *mut T) -> u64 {
    p as usize as u64
}

pub fn u64_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A `const cudaGraphNode_t *` array of `n` entries as host handles.
///
/// # Safety
/// `nodes` must be null (with `n` 0) or valid for reads of `n` handles.
pub unsafe fn node_list(nodes: *const cudaGraphNode_t, n: usize) -> CudaResult<Vec<u64>> {
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
pub unsafe fn default_edges(data: *const cudaGraphEdgeData, n: usize) -> CudaResult<()> {
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
pub fn fetch_list(
    rt: &Runtime,
    device: u32,
    op: Op,
    args: &[u64],
    per: usize,
) -> CudaResult<Vec<u64>> {
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
pub unsafe fn write_list(
    list: &[u64],
    out: *mut cudaGraphNode_t,
    count: *mut usize,
) -> CudaResult<()> {
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
pub unsafe fn zero_edges(data: *mut cudaGraphEdgeData, n: usize) {
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
pub unsafe fn kernel_node(
    rt: &Runtime,
    device: u32,
    p: &cudaKernelNodeParams,
) -> CudaResult<Vec<u8>> {
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
pub fn copy_side(rt: &Runtime, addr: u64, span: u64, host_side: bool) -> CudaResult<u64> {
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
pub fn memcpy_node(rt: &Runtime, p: &cudaMemcpy3DParms) -> CudaResult<[u8; g::MEMCPY_NODE_SIZE]> {
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
pub fn memcpy_1d(
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
pub fn symbol_node(
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

pub fn memset_node(rt: &Runtime, p: &cudaMemsetParams) -> CudaResult<[u8; g::MEMSET_NODE_SIZE]> {
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

pub fn event_handle(rt: &Runtime, event: cudaEvent_t) -> CudaResult<Vec<u8>> {
    let info = rt.events.info(event as usize)?;
    Ok(info.host.to_le_bytes().to_vec())
}

/// The node type and parameter encoding of a generic `cudaGraphNodeParams` (CUDA 12.2's
/// `cudaGraphAddNode` family).
///
/// # Safety
/// The union member named by `p.type_` must be initialised, with its pointers valid as the API
/// requires (kernel parameters as for [`kernel_node`]).
pub unsafe fn generic_node(
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
                "CUDA graphs: external semaphore and batch memory-operation nodes, and new parameters for memory and conditional nodes, are not supported"
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
pub unsafe fn mem_alloc_node(
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
        legacy_ipc: false,
    });
    GRAPH_MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((handle(graph), dptr));
    Ok((reply.rets[0], dptr))
}

/// A kernel node's parameters in the `graph::KernelNode` encoding, as the host has them.
pub fn kernel_node_encoding(
    rt: &Runtime,
    device: u32,
    node: cudaGraphNode_t,
) -> CudaResult<Vec<u8>> {
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut want = KERNEL_NODE_HEADER + 4096;
    loop {
        let mut buf = vec![0u8; want];
        let reply = rt.session.submit(
            Call::new(Op::GraphKernelNodeGetParams, device)
                .args(&[handle(node)])
                .output(&mut buf),
        )?;
        let n = usize::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)?;
        if n <= want {
            buf.truncate(n);
            return Ok(buf);
        }
        want = n;
    }
}

/// Keeps the parameter block and pointers handed out for kernel node `node` until its next
/// `*KernelNodeGetParams`.
pub fn keep_kernel_params(node: u64, block: Vec<u64>, pointers: Vec<*mut c_void>) {
    let mut stored = KERNEL_PARAMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    stored.retain(|(n, _)| *n != node);
    stored.push((
        node,
        KernelParamsCopy {
            _block: block,
            _pointers: pointers,
        },
    ));
}

/// `cudaGraphConditionalHandleCreate`/`cuGraphConditionalHandleCreate`: a handle on `graph`,
/// whose value (the host driver's own) kernels pass to `cudaGraphSetConditional`.
///
/// # Safety
/// `out` must be null or writable.
pub unsafe fn conditional_handle_create(
    out: *mut u64,
    graph: cudaGraph_t,
    default_value: c_uint,
    flags: c_uint,
) -> CudaResult<()> {
    non_null(out)?;
    if graph.is_null() || flags > 1 {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let reply = rt
        .session
        .submit(Call::new(Op::GraphConditionalHandleCreate, d).args(&[
            handle(graph),
            u64::from(default_value),
            u64::from(flags),
        ]))?;
    // SAFETY: non-null and writable (caller contract).
    unsafe { write_out(out, reply.rets[0]) }
}

/// Per conditional node, the array of its body graphs that `phGraph_out` points to: CUDA's own
/// array, valid for the node's lifetime (kept until the node is destroyed, or the process ends).
static BODY_ARRAYS: std::sync::Mutex<Vec<(u64, Box<[usize]>)>> = std::sync::Mutex::new(Vec::new());

/// Forgets the body array of conditional node `node` (destroyed).
pub fn forget_bodies(node: u64) {
    BODY_ARRAYS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|(n, _)| *n != node);
}

/// A conditional node (if with one body or two, while, switch with `size` bodies) on
/// conditional handle `cond` of `graph`: writes the node, and points `bodies_out` at the array of
/// its body graphs (made by the host's driver, owned by the node; the caller fills them, or
/// captures into them), as CUDA does.
///
/// # Safety
/// `node` must be null or writable; `deps` must hold `n` readable handles; `bodies_out` must be
/// null or writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_conditional_node(
    rt: &Runtime,
    device: u32,
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    n: usize,
    cond: u64,
    kind: u32,
    size: c_uint,
    bodies_out: *mut *mut cudaGraph_t,
) -> CudaResult<()> {
    non_null(node)?;
    non_null(bodies_out)?;
    let enc = g::ConditionalNode {
        handle: cond,
        kind,
        size,
    }
    .encode();
    // What the host would refuse anyway: a kind with a number of bodies CUDA does not allow.
    g::ConditionalNode::decode(&enc).ok_or(CudaError::INVALID_VALUE)?;
    // SAFETY: forwarded caller contract.
    unsafe { add_node(rt, device, node, graph, deps, n, g::NODE_CONDITIONAL, &enc)? };
    // SAFETY: written by add_node just now.
    let h = handle(unsafe { *node });
    let mut bodies = Vec::with_capacity(size as usize);
    for i in 0..size {
        let reply =
            rt.session
                .submit(Call::new(Op::GraphQuery, device).args(&[h, 4, u64::from(i)]))?;
        bodies.push(usize_of(reply.rets[0]));
    }
    let mut bodies = bodies.into_boxed_slice();
    let at = bodies.as_mut_ptr().cast::<cudaGraph_t>();
    {
        let mut kept = BODY_ARRAYS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.retain(|(k, _)| *k != h);
        kept.push((h, bodies));
    }
    // SAFETY: non-null and writable (caller contract); the array lives as long as the node.
    unsafe { bodies_out.write(at) };
    Ok(())
}

/// `cudaGraphMemAllocNodeGetParams`/`cuGraphMemAllocNodeGetParams`: the allocation's address
/// and size, pinned memory of its device, with no access descriptors beyond that device's.
pub fn mem_alloc_node_get(node: cudaGraphNode_t) -> CudaResult<cu::cudaMemAllocNodeParams> {
    let (rt, d) = current()?;
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let reply = rt
        .session
        .submit(Call::new(Op::GraphQuery, d).args(&[handle(node), 5, 0]))?;
    let (dptr, size) = (reply.rets[0], reply.rets[1]);
    let device = rt.allocations.find(dptr).map_or(d, |a| a.device);
    // SAFETY: a C record of integers and pointers, for which all zeroes is a valid value.
    let mut p: cu::cudaMemAllocNodeParams = unsafe { std::mem::zeroed() };
    p.poolProps.allocType = cu::cudaMemAllocationTypePinned;
    p.poolProps.location.type_ = cu::cudaMemLocationTypeDevice;
    p.poolProps.location.id = i32::try_from(device).map_err(|_| CudaError::UNKNOWN)?;
    p.bytesize = usize::try_from(size).map_err(|_| CudaError::UNKNOWN)?;
    p.dptr = usize_of(dptr) as *mut c_void;
    Ok(p)
}

/// `cudaGraphMemFreeNodeGetParams`/`cuGraphMemFreeNodeGetParams`: the address the node frees.
pub fn mem_free_node_get(node: cudaGraphNode_t) -> CudaResult<u64> {
    let (_, dptr) = graph_query(handle(node), 6)?;
    Ok(dptr)
}

// ----- requests --------------------------------------------------------------------------

/// Adds a node of type `ty` with encoded `params` after `deps`, writing its handle.
///
/// # Safety
/// `node` must be null or writable; `deps` must hold `n` readable handles.
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_node(
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
pub fn set_params(
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
pub fn host_node(params: &cudaHostNodeParams) -> CudaResult<Vec<u8>> {
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
pub fn host_node_key(params: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(params.get(..8)?.try_into().ok()?))
}

pub fn begin_capture(stream: cudaStream_t, mode: cudaStreamCaptureMode) -> CudaResult<()> {
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
pub unsafe fn begin_capture_to_graph(
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

/// `cudaStreamEndCapture`: the captured graph.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn end_capture(stream: cudaStream_t, graph: *mut cudaGraph_t) -> CudaResult<()> {
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

pub fn capture_info(stream: cudaStream_t) -> CudaResult<(u64, u64, u64, Vec<u64>)> {
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

/// `cudaStreamIsCapturing`.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn is_capturing(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
) -> CudaResult<()> {
    non_null(status)?;
    let (st, ..) = capture_info(stream)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(status, low_u32(st) as cudaStreamCaptureStatus) }
}

/// `cudaStreamGetCaptureInfo`: the dependency and edge arrays stay valid until the calling
/// thread's next call of it.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn get_capture_info(
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

/// `cudaStreamUpdateCaptureDependencies` (default edges only).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn update_capture_deps(
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

pub fn graph_launch(exec: cudaGraphExec_t, stream: cudaStream_t, upload: bool) -> CudaResult<()> {
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

/// Instantiates `graph` with `flags`, uploading on `stream` when the flags say so.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn instantiate(
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

/// A node's dependencies (`which` 1) or dependent nodes (2), the CUDA way of lists.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn node_lists(
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

/// A graph's nodes, or its root nodes.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn graph_nodes(
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

/// Adds or removes edges (default edges only).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn change_edges(
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
pub fn node_params(
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
pub fn graph_query(handle: u64, what: u64) -> CudaResult<(&'static Runtime, u64)> {
    graph_query_in(handle, what, 0)
}

/// `GraphQuery` with its third argument.
pub fn graph_query_in(handle: u64, what: u64, arg: u64) -> CudaResult<(&'static Runtime, u64)> {
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
pub unsafe fn node_event(
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

/// Sets the event of an event record or wait node in an executable graph.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn exec_set_event(
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

// ----- the graph calls, as both faces take them ----------------------------------------

/// The body of `cudaThreadExchangeStreamCaptureMode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaThreadExchangeStreamCaptureMode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn thread_exchange_stream_capture_mode(
    mode: *mut cudaStreamCaptureMode,
) -> CudaResult<()> {
    non_null(mode)?;
    // SAFETY: non-null, readable and writable (API contract).
    unsafe { *mode = capture::exchange_mode(*mode)? };
    Ok(())
}

/// The body of `cudaStreamGetCaptureInfo` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaStreamGetCaptureInfo`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn stream_get_capture_info(
    stream: cudaStream_t,
    captureStatus_out: *mut cudaStreamCaptureStatus,
    id_out: *mut c_ulonglong,
    graph_out: *mut cudaGraph_t,
    dependencies_out: *mut *const cudaGraphNode_t,
    edgeData_out: *mut *const cudaGraphEdgeData,
    numDependencies_out: *mut usize,
) -> CudaResult<()> {
    // SAFETY: forwarded API contract.
    unsafe {
        get_capture_info(
            stream,
            captureStatus_out,
            id_out,
            graph_out,
            dependencies_out,
            edgeData_out,
            numDependencies_out,
        )
    }
}

/// The body of `cudaGraphCreate` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphCreate`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_create(pGraph: *mut cudaGraph_t, flags: c_uint) -> CudaResult<()> {
    non_null(pGraph)?;
    if flags != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let reply = rt.session.submit(Call::new(Op::GraphCreate, d))?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(pGraph, usize_of(reply.rets[0]) as cudaGraph_t) }
}

/// The body of `cudaGraphDestroy` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphDestroy`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_destroy(graph: cudaGraph_t) -> CudaResult<()> {
    if graph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    rt.session
        .submit(Call::new(Op::GraphDestroy, d).args(&[handle(graph)]))?;
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

/// The body of `cudaGraphClone` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphClone`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_clone(
    pGraphClone: *mut cudaGraph_t,
    originalGraph: cudaGraph_t,
) -> CudaResult<()> {
    non_null(pGraphClone)?;
    if originalGraph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let reply = rt
        .session
        .submit(Call::new(Op::GraphClone, d).args(&[handle(originalGraph)]))?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(pGraphClone, usize_of(reply.rets[0]) as cudaGraph_t) }
}

/// The body of `cudaGraphAddNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    dependencyData: *const cudaGraphEdgeData,
    numDependencies: usize,
    nodeParams: *mut crate::generated::cudaGraphNodeParams,
) -> CudaResult<()> {
    non_null(nodeParams)?;
    let (rt, d) = current()?;
    // SAFETY: forwarded API contract; the union member named by `type_` is initialised.
    unsafe {
        default_edges(dependencyData, numDependencies)?;
        let params = &mut *nodeParams;
        match params.type_ {
            cu::cudaGraphNodeTypeConditional => {
                let c = &mut params.__bindgen_anon_1.conditional;
                return add_conditional_node(
                    rt,
                    d,
                    pGraphNode,
                    graph,
                    pDependencies,
                    numDependencies,
                    c.handle,
                    c.type_,
                    c.size,
                    &raw mut c.phGraph_out,
                );
            }
            cu::cudaGraphNodeTypeMemAlloc => {
                non_null(pGraphNode)?;
                let a = &mut params.__bindgen_anon_1.alloc;
                let (node, dptr) = mem_alloc_node(
                    rt,
                    graph,
                    pDependencies,
                    numDependencies,
                    &a.poolProps,
                    a.accessDescs,
                    a.accessDescCount,
                    a.bytesize,
                )?;
                a.dptr = usize_of(dptr) as *mut c_void;
                return write_out(pGraphNode, usize_of(node) as cudaGraphNode_t);
            }
            cu::cudaGraphNodeTypeMemFree => {
                let p = (params.__bindgen_anon_1.free.dptr as u64).to_le_bytes();
                return add_node(
                    rt,
                    d,
                    pGraphNode,
                    graph,
                    pDependencies,
                    numDependencies,
                    g::NODE_MEM_FREE,
                    &p,
                );
            }
            _ => {}
        }
        let (ty, p) = generic_node(rt, d, params)?;
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            ty,
            &p,
        )
    }
}

/// The body of `cudaGraphNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_node_set_params(
    node: cudaGraphNode_t,
    nodeParams: *mut crate::generated::cudaGraphNodeParams,
) -> CudaResult<()> {
    non_null(nodeParams)?;
    let (rt, d) = current()?;
    // SAFETY: forwarded API contract.
    let (ty, p) = unsafe { generic_node(rt, d, &*nodeParams)? };
    set_params(rt, d, std::ptr::null_mut(), node, ty, &p)
}

/// The body of `cudaGraphExecNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_node_set_params(
    graphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    nodeParams: *mut crate::generated::cudaGraphNodeParams,
) -> CudaResult<()> {
    non_null(nodeParams)?;
    if graphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    // SAFETY: forwarded API contract.
    let (ty, p) = unsafe { generic_node(rt, d, &*nodeParams)? };
    set_params(rt, d, graphExec, node, ty, &p)
}

/// The body of `cudaGraphAddMemAllocNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddMemAllocNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_mem_alloc_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    nodeParams: *mut cu::cudaMemAllocNodeParams,
) -> CudaResult<()> {
    non_null(pGraphNode)?;
    non_null(nodeParams)?;
    let (rt, _) = current()?;
    // SAFETY: non-null, readable and writable (API contract); the rest forwarded.
    unsafe {
        let p = &mut *nodeParams;
        let (node, dptr) = mem_alloc_node(
            rt,
            graph,
            pDependencies,
            numDependencies,
            &p.poolProps,
            p.accessDescs,
            p.accessDescCount,
            p.bytesize,
        )?;
        p.dptr = usize_of(dptr) as *mut c_void;
        write_out(pGraphNode, usize_of(node) as cudaGraphNode_t)
    }
}

/// The body of `cudaGraphAddMemFreeNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddMemFreeNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_mem_free_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    dptr: *mut c_void,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = (dptr as u64).to_le_bytes();
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEM_FREE,
            &p,
        )
    }
}

/// The body of `cudaGraphAddKernelNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddKernelNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_kernel_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    pNodeParams: *const cudaKernelNodeParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    let (rt, d) = current()?;
    // SAFETY: non-null and readable, with kernel parameters as the API requires.
    let p = unsafe { kernel_node(rt, d, &*pNodeParams)? };
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_KERNEL,
            &p,
        )
    }
}

/// The body of `cudaGraphKernelNodeGetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphKernelNodeGetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_kernel_node_get_params(
    node: cudaGraphNode_t,
    pNodeParams: *mut cudaKernelNodeParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let enc = kernel_node_encoding(rt, d, node)?;
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
        std::ptr::copy_nonoverlapping(
            k.params.as_ptr(),
            block.as_mut_ptr().cast::<u8>(),
            k.params.len(),
        );
    };
    let base = block.as_mut_ptr().cast::<u8>();
    let mut pointers: Vec<*mut c_void> = resolved
        .params
        .iter()
        .map(|p| base.wrapping_add(p.offset as usize).cast::<c_void>())
        .collect();
    let p = cudaKernelNodeParams {
        func: kernel.host_fun as *mut c_void,
        gridDim: dim3 {
            x: k.grid[0],
            y: k.grid[1],
            z: k.grid[2],
        },
        blockDim: dim3 {
            x: k.block[0],
            y: k.block[1],
            z: k.block[2],
        },
        sharedMemBytes: k.shared_mem,
        kernelParams: if pointers.is_empty() {
            std::ptr::null_mut()
        } else {
            pointers.as_mut_ptr()
        },
        extra: std::ptr::null_mut(),
    };
    keep_kernel_params(handle(node), block, pointers);
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(pNodeParams, p) }
}

/// The body of `cudaGraphKernelNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphKernelNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_kernel_node_set_params(
    node: cudaGraphNode_t,
    pNodeParams: *const cudaKernelNodeParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    let (rt, d) = current()?;
    // SAFETY: as for cudaGraphAddKernelNode.
    let p = unsafe { kernel_node(rt, d, &*pNodeParams)? };
    set_params(rt, d, std::ptr::null_mut(), node, g::NODE_KERNEL, &p)
}

/// The body of `cudaGraphExecKernelNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecKernelNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_kernel_node_set_params(
    hGraphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    pNodeParams: *const cudaKernelNodeParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    if hGraphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    // SAFETY: as for cudaGraphAddKernelNode.
    let p = unsafe { kernel_node(rt, d, &*pNodeParams)? };
    set_params(rt, d, hGraphExec, node, g::NODE_KERNEL, &p)
}

/// The body of `cudaGraphAddMemcpyNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddMemcpyNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_memcpy_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    pCopyParams: *const cudaMemcpy3DParms,
) -> CudaResult<()> {
    non_null(pCopyParams)?;
    let (rt, d) = current()?;
    // SAFETY: non-null and readable (API contract).
    let p = memcpy_node(rt, unsafe { &*pCopyParams })?;
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMCPY,
            &p,
        )
    }
}

/// The body of `cudaGraphAddMemcpyNode1D` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddMemcpyNode1D`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_memcpy_node1d(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = memcpy_node(rt, &memcpy_1d(dst, src, count, kind))?;
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMCPY,
            &p,
        )
    }
}

/// The body of `cudaGraphMemcpyNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphMemcpyNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_memcpy_node_set_params(
    node: cudaGraphNode_t,
    pNodeParams: *const cudaMemcpy3DParms,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    let (rt, d) = current()?;
    // SAFETY: non-null and readable (API contract).
    let p = memcpy_node(rt, unsafe { &*pNodeParams })?;
    set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMCPY, &p)
}

/// The body of `cudaGraphMemcpyNodeSetParams1D` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphMemcpyNodeSetParams1D`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_memcpy_node_set_params1d(
    node: cudaGraphNode_t,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = memcpy_node(rt, &memcpy_1d(dst, src, count, kind))?;
    set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMCPY, &p)
}

/// The body of `cudaGraphExecMemcpyNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecMemcpyNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_memcpy_node_set_params(
    hGraphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    pNodeParams: *const cudaMemcpy3DParms,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    if hGraphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    // SAFETY: non-null and readable (API contract).
    let p = memcpy_node(rt, unsafe { &*pNodeParams })?;
    set_params(rt, d, hGraphExec, node, g::NODE_MEMCPY, &p)
}

/// The body of `cudaGraphExecMemcpyNodeSetParams1D` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecMemcpyNodeSetParams1D`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_memcpy_node_set_params1d(
    hGraphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    if hGraphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let p = memcpy_node(rt, &memcpy_1d(dst, src, count, kind))?;
    set_params(rt, d, hGraphExec, node, g::NODE_MEMCPY, &p)
}

/// The body of `cudaGraphAddMemcpyNodeToSymbol` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddMemcpyNodeToSymbol`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_memcpy_node_to_symbol(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = symbol_node(rt, d, symbol, src, count, offset, kind, true)?;
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMCPY,
            &p,
        )
    }
}

/// The body of `cudaGraphAddMemcpyNodeFromSymbol` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddMemcpyNodeFromSymbol`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_memcpy_node_from_symbol(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = symbol_node(rt, d, symbol, dst, count, offset, kind, false)?;
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMCPY,
            &p,
        )
    }
}

/// The body of `cudaGraphMemcpyNodeSetParamsToSymbol` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphMemcpyNodeSetParamsToSymbol`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_memcpy_node_set_params_to_symbol(
    node: cudaGraphNode_t,
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = symbol_node(rt, d, symbol, src, count, offset, kind, true)?;
    set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMCPY, &p)
}

/// The body of `cudaGraphMemcpyNodeSetParamsFromSymbol` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphMemcpyNodeSetParamsFromSymbol`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_memcpy_node_set_params_from_symbol(
    node: cudaGraphNode_t,
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = symbol_node(rt, d, symbol, dst, count, offset, kind, false)?;
    set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMCPY, &p)
}

/// The body of `cudaGraphExecMemcpyNodeSetParamsToSymbol` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecMemcpyNodeSetParamsToSymbol`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_memcpy_node_set_params_to_symbol(
    hGraphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    if hGraphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let p = symbol_node(rt, d, symbol, src, count, offset, kind, true)?;
    set_params(rt, d, hGraphExec, node, g::NODE_MEMCPY, &p)
}

/// The body of `cudaGraphExecMemcpyNodeSetParamsFromSymbol` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecMemcpyNodeSetParamsFromSymbol`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_memcpy_node_set_params_from_symbol(
    hGraphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    if hGraphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let p = symbol_node(rt, d, symbol, dst, count, offset, kind, false)?;
    set_params(rt, d, hGraphExec, node, g::NODE_MEMCPY, &p)
}

/// The body of `cudaGraphMemcpyNodeGetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphMemcpyNodeGetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_memcpy_node_get_params(
    node: cudaGraphNode_t,
    pNodeParams: *mut cudaMemcpy3DParms,
) -> CudaResult<()> {
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

/// The body of `cudaGraphMemsetNodeGetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphMemsetNodeGetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_memset_node_get_params(
    node: cudaGraphNode_t,
    pNodeParams: *mut cudaMemsetParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    let (rt, enc) = node_params(node, g::NODE_MEMSET, g::MEMSET_NODE_SIZE)?;
    let m = MemsetNode::decode(&enc).ok_or(CudaError::UNKNOWN)?;
    let dst = rt
        .host_memory
        .host_address(m.dst)
        .map_or(usize_of(m.dst), |h| h);
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

/// The body of `cudaGraphAddMemsetNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddMemsetNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_memset_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    pMemsetParams: *const cudaMemsetParams,
) -> CudaResult<()> {
    non_null(pMemsetParams)?;
    let (rt, d) = current()?;
    // SAFETY: non-null and readable (API contract).
    let p = memset_node(rt, unsafe { &*pMemsetParams })?;
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMSET,
            &p,
        )
    }
}

/// The body of `cudaGraphMemsetNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphMemsetNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_memset_node_set_params(
    node: cudaGraphNode_t,
    pNodeParams: *const cudaMemsetParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    let (rt, d) = current()?;
    // SAFETY: non-null and readable (API contract).
    let p = memset_node(rt, unsafe { &*pNodeParams })?;
    set_params(rt, d, std::ptr::null_mut(), node, g::NODE_MEMSET, &p)
}

/// The body of `cudaGraphExecMemsetNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecMemsetNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_memset_node_set_params(
    hGraphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    pNodeParams: *const cudaMemsetParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    if hGraphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    // SAFETY: non-null and readable (API contract).
    let p = memset_node(rt, unsafe { &*pNodeParams })?;
    set_params(rt, d, hGraphExec, node, g::NODE_MEMSET, &p)
}

/// The body of `cudaGraphAddHostNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddHostNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_host_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    pNodeParams: *const cudaHostNodeParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    let (rt, d) = current()?;
    // SAFETY: non-null and readable (API contract).
    let p = host_node(unsafe { &*pNodeParams })?;
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_HOST,
            &p,
        )
    }
}

/// The body of `cudaGraphHostNodeGetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphHostNodeGetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_host_node_get_params(
    node: cudaGraphNode_t,
    pNodeParams: *mut cudaHostNodeParams,
) -> CudaResult<()> {
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

/// The body of `cudaGraphHostNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphHostNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_host_node_set_params(
    node: cudaGraphNode_t,
    pNodeParams: *const cudaHostNodeParams,
) -> CudaResult<()> {
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

/// The body of `cudaGraphExecHostNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecHostNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_host_node_set_params(
    hGraphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    pNodeParams: *const cudaHostNodeParams,
) -> CudaResult<()> {
    non_null(pNodeParams)?;
    if hGraphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    // SAFETY: non-null and readable (API contract).
    let p = host_node(unsafe { &*pNodeParams })?;
    set_params(rt, d, hGraphExec, node, g::NODE_HOST, &p)
}

/// The body of `cudaGraphAddChildGraphNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddChildGraphNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_child_graph_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    childGraph: cudaGraph_t,
) -> CudaResult<()> {
    if childGraph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let p = handle(childGraph).to_le_bytes();
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_GRAPH,
            &p,
        )
    }
}

/// The body of `cudaGraphExecChildGraphNodeSetParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecChildGraphNodeSetParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_child_graph_node_set_params(
    hGraphExec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    childGraph: cudaGraph_t,
) -> CudaResult<()> {
    if hGraphExec.is_null() || node.is_null() || childGraph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    rt.session
        .submit(Call::new(Op::GraphExecChildGraph, d).args(&[
            handle(hGraphExec),
            handle(node),
            handle(childGraph),
        ]))?;
    Ok(())
}

/// The body of `cudaGraphAddEventRecordNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddEventRecordNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_event_record_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    event: cudaEvent_t,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = event_handle(rt, event)?;
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_EVENT_RECORD,
            &p,
        )
    }
}

/// The body of `cudaGraphAddEventWaitNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphAddEventWaitNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_add_event_wait_node(
    pGraphNode: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    pDependencies: *const cudaGraphNode_t,
    numDependencies: usize,
    event: cudaEvent_t,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = event_handle(rt, event)?;
    // SAFETY: forwarded API contract.
    unsafe {
        add_node(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_WAIT_EVENT,
            &p,
        )
    }
}

/// The body of `cudaGraphEventRecordNodeSetEvent` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphEventRecordNodeSetEvent`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_event_record_node_set_event(
    node: cudaGraphNode_t,
    event: cudaEvent_t,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = event_handle(rt, event)?;
    set_params(rt, d, std::ptr::null_mut(), node, g::NODE_EVENT_RECORD, &p)
}

/// The body of `cudaGraphEventWaitNodeSetEvent` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphEventWaitNodeSetEvent`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_event_wait_node_set_event(
    node: cudaGraphNode_t,
    event: cudaEvent_t,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = event_handle(rt, event)?;
    set_params(rt, d, std::ptr::null_mut(), node, g::NODE_WAIT_EVENT, &p)
}

/// The body of `cudaGraphChildGraphNodeGetGraph` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphChildGraphNodeGetGraph`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_child_graph_node_get_graph(
    node: cudaGraphNode_t,
    pGraph: *mut cudaGraph_t,
) -> CudaResult<()> {
    non_null(pGraph)?;
    let (_, g) = graph_query(handle(node), 1)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(pGraph, usize_of(g) as cudaGraph_t) }
}

/// The body of `cudaGraphNodeFindInClone` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphNodeFindInClone`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_node_find_in_clone(
    pNode: *mut cudaGraphNode_t,
    originalNode: cudaGraphNode_t,
    clonedGraph: cudaGraph_t,
) -> CudaResult<()> {
    non_null(pNode)?;
    if clonedGraph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (_, n) = graph_query_in(handle(originalNode), 3, handle(clonedGraph))?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(pNode, usize_of(n) as cudaGraphNode_t) }
}

/// The body of `cudaGraphDestroyNode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphDestroyNode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_destroy_node(node: cudaGraphNode_t) -> CudaResult<()> {
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    rt.session
        .submit(Call::new(Op::GraphDestroyNode, d).args(&[handle(node)]))?;
    forget_bodies(handle(node));
    Ok(())
}

/// The body of `cudaGraphExecGetFlags` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecGetFlags`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_get_flags(
    graphExec: cudaGraphExec_t,
    flags: *mut c_ulonglong,
) -> CudaResult<()> {
    non_null(flags)?;
    let (_, f) = graph_query(handle(graphExec), 2)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(flags, f) }
}

/// The body of `cudaGraphGetEdges` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphGetEdges`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_get_edges(
    graph: cudaGraph_t,
    from: *mut cudaGraphNode_t,
    to: *mut cudaGraphNode_t,
    edgeData: *mut cudaGraphEdgeData,
    numEdges: *mut usize,
) -> CudaResult<()> {
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
        numEdges.write(if from.is_null() {
            f.len()
        } else {
            f.len().min(room)
        });
    }
    Ok(())
}

/// The body of `cudaGraphNodeGetType` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphNodeGetType`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_node_get_type(
    node: cudaGraphNode_t,
    pType: *mut cudaGraphNodeType,
) -> CudaResult<()> {
    non_null(pType)?;
    if node.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let mut none = [0u8; 0];
    let reply = rt.session.submit(
        Call::new(Op::GraphNodeQuery, d)
            .args(&[handle(node), 0])
            .output(&mut none),
    )?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(pType, low_u32(reply.rets[0]) as cudaGraphNodeType) }
}

/// The body of `cudaGraphInstantiateWithParams` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphInstantiateWithParams`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_instantiate_with_params(
    pGraphExec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    instantiateParams: *mut cudaGraphInstantiateParams,
) -> CudaResult<()> {
    non_null(instantiateParams)?;
    // SAFETY: non-null, readable and writable (API contract).
    let p = unsafe { &mut *instantiateParams };
    // SAFETY: forwarded API contract.
    let r = unsafe { instantiate(pGraphExec, graph, p.flags, p.uploadStream) };
    p.result_out = if r.is_ok() {
        INSTANTIATE_SUCCESS
    } else {
        INSTANTIATE_ERROR
    };
    p.errNode_out = std::ptr::null_mut();
    r
}

/// The body of `cudaGraphExecDestroy` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecDestroy`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_destroy(graphExec: cudaGraphExec_t) -> CudaResult<()> {
    if graphExec.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    rt.session
        .submit(Call::new(Op::GraphExecDestroy, d).args(&[handle(graphExec)]))?;
    Ok(())
}

/// The body of `cudaGraphExecUpdate` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphExecUpdate`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_exec_update(
    hGraphExec: cudaGraphExec_t,
    hGraph: cudaGraph_t,
    resultInfo: *mut cudaGraphExecUpdateResultInfo,
) -> CudaResult<()> {
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

/// The body of `cudaGraphNodeSetEnabled` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphNodeSetEnabled`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_node_set_enabled(
    hGraphExec: cudaGraphExec_t,
    hNode: cudaGraphNode_t,
    isEnabled: c_uint,
) -> CudaResult<()> {
    if hGraphExec.is_null() || hNode.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    rt.session
        .submit(Call::new(Op::GraphNodeEnabled, d).args(&[
            handle(hGraphExec),
            handle(hNode),
            1,
            u64::from(isEnabled != 0),
        ]))?;
    Ok(())
}

/// The body of `cudaGraphNodeGetEnabled` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphNodeGetEnabled`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_node_get_enabled(
    hGraphExec: cudaGraphExec_t,
    hNode: cudaGraphNode_t,
    isEnabled: *mut c_uint,
) -> CudaResult<()> {
    non_null(isEnabled)?;
    if hGraphExec.is_null() || hNode.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    let reply = rt
        .session
        .submit(Call::new(Op::GraphNodeEnabled, d).args(&[handle(hGraphExec), handle(hNode), 0]))?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(isEnabled, low_u32(reply.rets[0])) }
}

/// The body of `cudaGraphDebugDotPrint` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaGraphDebugDotPrint`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn graph_debug_dot_print(
    graph: cudaGraph_t,
    path: *const c_char,
    flags: c_uint,
) -> CudaResult<()> {
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

/// The body of `cudaDeviceGraphMemTrim` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaDeviceGraphMemTrim`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn device_graph_mem_trim(device: core::ffi::c_int) -> CudaResult<()> {
    let (rt, _) = current()?;
    let d = rt.devices.check(device)?;
    rt.session
        .submit(Call::new(Op::GraphMem, d).args(&[0, 0, 0]))?;
    Ok(())
}

/// The body of `cudaDeviceSetGraphMemAttribute` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaDeviceSetGraphMemAttribute`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn device_set_graph_mem_attribute(
    device: core::ffi::c_int,
    attr: crate::generated::cudaGraphMemAttributeType,
    value: *mut c_void,
) -> CudaResult<()> {
    non_null(value)?;
    let (rt, _) = current()?;
    let d = rt.devices.check(device)?;
    // SAFETY: a u64 (cuuint64_t), readable (API contract).
    let v = unsafe { value.cast::<u64>().read_unaligned() };
    rt.session
        .submit(Call::new(Op::GraphMem, d).args(&[2, u64::from(attr), v]))?;
    Ok(())
}

/// The body of `cudaDeviceGetGraphMemAttribute` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaDeviceGetGraphMemAttribute`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn device_get_graph_mem_attribute(
    device: core::ffi::c_int,
    attr: crate::generated::cudaGraphMemAttributeType,
    value: *mut c_void,
) -> CudaResult<()> {
    non_null(value)?;
    let (rt, _) = current()?;
    let d = rt.devices.check(device)?;
    let reply = rt
        .session
        .submit(Call::new(Op::GraphMem, d).args(&[1, u64::from(attr), 0]))?;
    // SAFETY: every attribute is a u64 (cuuint64_t), writable (API contract).
    unsafe { value.cast::<u64>().write_unaligned(reply.rets[0]) };
    Ok(())
}

//! The requests on graphs and nodes that the calls share: adding a node, setting its
//! parameters, and the queries (lists, types, events, allocations).

use crate::core::conv::usize_of;
use core::ffi::c_void;

use qcuda_proto::{
    graph::{self as g},
    Op,
};

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    runtime::user_objects,
    runtime::{current, non_null, Runtime},
    transport::Call,
};
use crate::generated::{
    self as cu, cudaEvent_t, cudaGraphEdgeData, cudaGraphExec_t, cudaGraphNodeType,
    cudaGraphNode_t, cudaGraph_t,
};

use super::{
    lists::{
        edge_bytes, fetch_edged_list, fetch_list, handle, node_list, u64_bytes, write_edges,
        write_list, write_out,
    },
    nodes::host_node_key,
};

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

/// Adds a node of type `ty` with encoded `params` after `deps` (default edges), writing its
/// handle.
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
    // SAFETY: forwarded caller contract.
    unsafe { add_node_edged(rt, device, node, graph, deps, n, &[], ty, params) }
}

/// [`add_node`] with the dependencies' edge data (the wire form of [`edge_bytes`]).
///
/// # Safety
/// As for [`add_node`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_node_edged(
    rt: &Runtime,
    device: u32,
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    n: usize,
    edges: &[u8],
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
            .input(params)
            .input(edges),
    )?;
    if ty == g::NODE_HOST {
        if let Some(key) = host_node_key(params) {
            rt.host_fns.set_node(reply.rets[0], key);
        }
    }
    if let (g::NODE_GRAPH, Some((child, moved))) = (ty, g::decode_child(params)) {
        user_objects::child_added(handle(graph), child, moved);
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
    let (list, data) = fetch_edged_list(rt, d, Op::GraphNodeQuery, &[handle(node), which], 1)?;
    if !out.is_null()
        && edges.is_null()
        && data
            .iter()
            .any(|e| e.from_port != 0 || e.to_port != 0 || e.type_ != 0)
    {
        // Without edge data the answer would lose what makes those edges what they are.
        return Err(CudaError::LOSSY_QUERY);
    }
    // SAFETY: forwarded API contract.
    unsafe {
        let room = if out.is_null() { 0 } else { *count };
        write_list(&list, out, count)?;
        write_edges(edges, &data, room.min(list.len()));
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

/// Adds or removes edges, with their edge data.
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
    let (f, t, data) = unsafe {
        (
            node_list(from, n)?,
            node_list(to, n)?,
            edge_bytes(edges, n)?,
        )
    };
    let pairs: Vec<u64> = f.iter().zip(&t).flat_map(|(a, b)| [*a, *b]).collect();
    let (rt, d) = current()?;
    rt.session.submit(
        Call::new(Op::GraphEdges, d)
            .args(&[handle(graph), u64::from(remove)])
            .input(&u64_bytes(&pairs))
            .input(&data),
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
    let (mut none, mut no_edges) = ([0u8; 0], [0u8; 0]);
    let t = rt.session.submit(
        Call::new(Op::GraphNodeQuery, d)
            .args(&[handle(node), 0])
            .output(&mut none)
            .output(&mut no_edges),
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

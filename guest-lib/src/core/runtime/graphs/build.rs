//! Building and reading graphs: creating, cloning and destroying them, adding each kind of
//! node, edges, node types and the debug dump.

#![allow(non_snake_case)] // the calls keep CUDA's parameter names

use crate::core::conv::{low_u32, usize_of};
use core::ffi::{c_char, c_uint, c_void, CStr};

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
    self as cu, cudaEvent_t, cudaGraphEdgeData, cudaGraphNodeType, cudaGraphNode_t, cudaGraph_t,
    cudaHostNodeParams, cudaKernelNodeParams, cudaMemcpy3DParms, cudaMemcpyKind, cudaMemsetParams,
};

use super::{
    conditional::{add_conditional_node, forget_bodies},
    lists::{edge_bytes, fetch_edged_list, handle, write_edges, write_list, write_out},
    nodes::{
        event_handle, generic_node, host_node, kernel_node, mem_alloc_node, memcpy_1d, memcpy_node,
        memset_node, symbol_node, GRAPH_MEMORY,
    },
    requests::{add_node, add_node_edged, graph_query, graph_query_in},
};

/// Adds a node of type `ty` after the `n` nodes of `deps`, its parameters made by `encode` on the
/// calling thread's runtime and current device: the shared body of the `cudaGraphAdd*Node`
/// calls.
///
/// # Safety
/// `node` must be null or writable; `deps` must hold `n` readable handles.
unsafe fn add_encoded<P: AsRef<[u8]>>(
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    n: usize,
    ty: u32,
    encode: impl FnOnce(&'static Runtime, u32) -> CudaResult<P>,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = encode(rt, d)?;
    // SAFETY: forwarded caller contract.
    unsafe { add_node(rt, d, node, graph, deps, n, ty, p.as_ref()) }
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
    user_objects::graph_destroyed(handle(graph));
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
    user_objects::graph_cloned(handle(originalGraph), reply.rets[0]);
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
        let edges = edge_bytes(dependencyData, numDependencies)?;
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
                    &edges,
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
                    &edges,
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
                return add_node_edged(
                    rt,
                    d,
                    pGraphNode,
                    graph,
                    pDependencies,
                    numDependencies,
                    &edges,
                    g::NODE_MEM_FREE,
                    &p,
                );
            }
            _ => {}
        }
        let (ty, p) = generic_node(rt, d, params)?;
        add_node_edged(
            rt,
            d,
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            &edges,
            ty,
            &p,
        )
    }
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
            &[],
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEM_FREE,
            |_, _| Ok((dptr as u64).to_le_bytes()),
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_KERNEL,
            |rt, d| kernel_node(rt, d, &*pNodeParams),
        )
    }
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMCPY,
            |rt, _| memcpy_node(rt, &*pCopyParams),
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMCPY,
            |rt, _| memcpy_node(rt, &memcpy_1d(dst, src, count, kind)),
        )
    }
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMCPY,
            |rt, d| symbol_node(rt, d, symbol, src, count, offset, kind, true),
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMCPY,
            |rt, d| symbol_node(rt, d, symbol, dst, count, offset, kind, false),
        )
    }
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_MEMSET,
            |rt, _| memset_node(rt, &*pMemsetParams),
        )
    }
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_HOST,
            |_, _| host_node(&*pNodeParams),
        )
    }
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_GRAPH,
            |_, _| Ok(handle(childGraph).to_le_bytes()),
        )
    }
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_EVENT_RECORD,
            |rt, _| event_handle(rt, event),
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
    // SAFETY: the caller's pointers are valid as CUDA documents (API contract); add_node's
    // contract is the same.
    unsafe {
        add_encoded(
            pGraphNode,
            graph,
            pDependencies,
            numDependencies,
            g::NODE_WAIT_EVENT,
            |rt, _| event_handle(rt, event),
        )
    }
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
    let (pairs, data) = fetch_edged_list(rt, d, Op::GraphGetEdges, &[handle(graph)], 2)?;
    if !from.is_null()
        && edgeData.is_null()
        && data
            .iter()
            .any(|e| e.from_port != 0 || e.to_port != 0 || e.type_ != 0)
    {
        return Err(CudaError::LOSSY_QUERY);
    }
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
        write_edges(edgeData, &data, room.min(f.len()));
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
    let (mut none, mut no_edges) = ([0u8; 0], [0u8; 0]);
    let reply = rt.session.submit(
        Call::new(Op::GraphNodeQuery, d)
            .args(&[handle(node), 0])
            .output(&mut none)
            .output(&mut no_edges),
    )?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(pType, low_u32(reply.rets[0]) as cudaGraphNodeType) }
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

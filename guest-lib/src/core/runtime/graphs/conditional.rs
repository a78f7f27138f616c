//! Conditional nodes: the host's driver makes the handles and the body graphs; the guest
//! keeps CUDA's array of a node's bodies for as long as the node lives.

use crate::core::conv::usize_of;
use core::ffi::c_uint;

use qcuda_proto::{
    graph::{self as g},
    Op,
};

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    runtime::{current, non_null, Runtime},
    transport::Call,
};
use crate::generated::{cudaGraphNode_t, cudaGraph_t};

use super::{
    lists::{handle, write_out},
    requests::add_node_edged,
};

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
    edges: &[u8],
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
    unsafe {
        add_node_edged(
            rt,
            device,
            node,
            graph,
            deps,
            n,
            edges,
            g::NODE_CONDITIONAL,
            &enc,
        )?;
    }
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

//! Executable graphs: instantiating, launching and uploading, updating, enabling nodes, and
//! destroying them.

#![allow(non_snake_case)] // the calls keep CUDA's parameter names

use crate::core::conv::{low_u32, usize_of};
use core::ffi::{c_uint, c_ulonglong};

use qcuda_proto::Op;

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    runtime::user_objects,
    runtime::{current, non_null},
    transport::Call,
};
use crate::generated::{
    cudaGraphExecUpdateResultInfo, cudaGraphExec_t, cudaGraphInstantiateParams, cudaGraphNode_t,
    cudaGraph_t, cudaStream_t,
};

use super::{
    lists::{handle, write_out},
    requests::graph_query,
};

/// cudaGraphInstantiateSuccess / cudaGraphInstantiateError.
pub const INSTANTIATE_SUCCESS: u32 = 0;

pub const INSTANTIATE_ERROR: u32 = 1;

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
    crate::core::runtime::managed::before_launch(rt, t.device, t.wire)?;
    rt.session.submit(
        Call::new(Op::GraphLaunch, t.device)
            .args(&[handle(exec), t.wire])
            .fire_and_forget(),
    )?;
    user_objects::launched(rt, handle(exec), t.device, stream as usize)
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
    user_objects::instantiated(handle(graph), reply.rets[0]);
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(exec, usize_of(reply.rets[0]) as cudaGraphExec_t) }
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
    user_objects::exec_destroyed(rt, handle(graphExec));
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
    user_objects::exec_updated(rt, handle(hGraphExec), handle(hGraph));
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

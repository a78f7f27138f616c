//! Node parameters through the graph and executable-graph calls: getting and setting those
//! of kernel, memcpy, memset, host, child-graph and event nodes, and the generic forms.

#![allow(non_snake_case)] // the calls keep CUDA's parameter names

use crate::core::conv::usize_of;
use core::ffi::c_void;

use qcuda_proto::{
    graph::{self as g, KernelNode, MemcpyNode, MemsetNode},
    Op,
};

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    launch::params,
    modules,
    runtime::{current, non_null, registry},
    transport::Call,
};
use crate::generated::{
    self as cu, cudaEvent_t, cudaGraphExec_t, cudaGraphNode_t, cudaGraph_t, cudaHostNodeParams,
    cudaKernelNodeParams, cudaMemcpy3DParms, cudaMemcpyKind, cudaMemsetParams, dim3,
};

use super::{
    lists::{handle, write_out},
    nodes::{
        event_handle, generic_node, host_node, host_node_key, keep_kernel_params, kernel_node,
        kernel_node_encoding, memcpy_1d, memcpy_node, memset_node, symbol_node,
    },
    requests::{node_params, set_params},
};

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
    let resolved = modules::kernel(&rt.session, kernel, d)?;
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
        Some(crate::core::streams::host_fns::HostCallback::Func { func, data }) => {
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

//! Node parameters: each node type's encoding (`qcuda_proto::graph`) from the runtime's
//! structures, kernel parameters packed with the kernel's registered layout as for a launch;
//! what the guest keeps of nodes (the kernel parameters it handed out, graph memory).

use crate::core::conv::usize_of;
use core::ffi::c_void;

use qcuda_proto::{
    graph::{self as g, KernelNode, MemcpyNode, MemsetNode, KERNEL_NODE_HEADER},
    Op,
};

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    launch::params,
    modules,
    runtime::memory::{self, Direction},
    runtime::{non_null, registry, Runtime},
    transport::Call,
    warnings::warn_once,
};
use crate::generated::{
    self as cu, cudaEvent_t, cudaGraphNode_t, cudaGraph_t, cudaHostNodeParams,
    cudaKernelNodeParams, cudaMemcpy3DParms, cudaMemcpyKind, cudaMemsetParams,
};

use super::lists::{handle, node_list, u64_bytes};

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
    let resolved = modules::kernel(&rt.session, kernel, device)?;
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
        // pinned and mapped for it now (memory/host.rs).
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
    let global = crate::core::runtime::symbols::global(rt, registry(), symbol as usize, device)?;
    let addr = crate::core::runtime::symbols::range(global, count, offset)?;
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
    edges: &[u8],
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
            .input(&(bytesize as u64).to_le_bytes())
            .input(edges),
    )?;
    let dptr = reply.rets[1];
    rt.allocations
        .insert(crate::core::memory::device::Allocation {
            base: dptr,
            size: bytesize as u64,
            device,
            origin: crate::core::memory::device::Origin::Graph,
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

/// A host node's parameters on the wire: the key of the function, registered with the process's
/// host functions (`host_fns.rs`) for as long as the process lives, since the node may run any
/// number of times. Each run goes through the host-function channel like `cudaLaunchHostFunc`.
pub fn host_node(params: &cudaHostNodeParams) -> CudaResult<Vec<u8>> {
    let func = params.fn_.ok_or(CudaError::INVALID_VALUE)?;
    let rt = crate::core::runtime::runtime()?;
    let key = rt.host_fns.register(
        &rt.session,
        crate::core::streams::host_fns::HostCallback::Func {
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

//! CUDA graphs and stream capture on the driver face: the C ABI of the `cuGraph*`, capture and
//! graph-memory calls over the core's `graphs.rs`, which the runtime face uses too. A `CUgraph`
//! is a `cudaGraph_t`, a `CUgraphNode` a `cudaGraphNode_t`, a `CUgraphExec` a `cudaGraphExec_t`:
//! the host's session-local handles, so a graph built or captured through one face is queried,
//! instantiated and launched through the other. What is the driver's own is converted here:
//! kernel nodes name a `CUfunction` or `CUkernel` (parameters from `kernelParams` or `extra`),
//! copies are `CUDA_MEMCPY3D`, and the generic `CUgraphNodeParams` union has the driver's
//! members. Handles that the driver API passes along for a context (`ctx` fields) name the
//! current context's device, where qcuda runs every node of the graph.

use core::ffi::{c_char, c_uint, c_ulonglong, c_void};

use qcuda_proto::graph::{self as g, KernelNode, KERNEL_NODE_HEADER};

use super::{initialized, launch::parameter_block};
use crate::{
    core::{
        conv::usize_of,
        cuda_error::CudaError,
        runtime::context,
        runtime::graphs as cg,
        runtime::{current, Runtime},
        warnings::warn_once,
    },
    driver::{
        modules,
        status::{DriverError, DrvResult},
    },
    generated::{self as cu, driver_api as d},
};

// The driver's and the runtime's forms of these records are one C layout.
const _: () = {
    assert!(size_of::<d::CUmemPoolProps>() == size_of::<cu::cudaMemPoolProps>());
    assert!(size_of::<d::CUmemAccessDesc>() == size_of::<cu::cudaMemAccessDesc>());
    assert!(size_of::<d::CUgraphEdgeData>() == size_of::<cu::cudaGraphEdgeData>());
    assert!(
        size_of::<d::CUgraphExecUpdateResultInfo>()
            == size_of::<cu::cudaGraphExecUpdateResultInfo>()
    );
    assert!(
        size_of::<d::CUDA_GRAPH_INSTANTIATE_PARAMS>()
            == size_of::<cu::cudaGraphInstantiateParams>()
    );
    assert!(size_of::<d::CUDA_HOST_NODE_PARAMS>() == size_of::<cu::cudaHostNodeParams>());
    assert!(size_of::<d::CUDA_MEM_ALLOC_NODE_PARAMS>() == size_of::<cu::cudaMemAllocNodeParams>());
};

/// `cuInit` done and a context current (its device is then the core's current device).
fn ready() -> DrvResult<(&'static Runtime, u32)> {
    initialized()?;
    context::require_current()?;
    Ok(current()?)
}

/// Per kernel node made or changed through this face, the `CUfunction` and `CUkernel` it was
/// given, which `cuGraphKernelNodeGetParams` gives back (as the driver does) while the node
/// still runs that function.
static KERNEL_NODE_FUNCS: std::sync::Mutex<Vec<(u64, usize, usize)>> =
    std::sync::Mutex::new(Vec::new());

fn remember_function(node: u64, launch: &KernelLaunch) {
    let mut v = KERNEL_NODE_FUNCS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    v.retain(|(n, ..)| *n != node);
    v.push((node, launch.func as usize, launch.kern as usize));
}

fn remembered_function(node: u64) -> Option<(usize, usize)> {
    KERNEL_NODE_FUNCS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .find(|(n, ..)| *n == node)
        .map(|(_, f, k)| (*f, *k))
}

/// A kernel node's launch as the driver API states it (`CUDA_KERNEL_NODE_PARAMS` v1 to v3).
struct KernelLaunch {
    func: d::CUfunction,
    kern: d::CUkernel,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    args: *mut *mut c_void,
    extra: *mut *mut c_void,
}

impl KernelLaunch {
    fn v2(p: &d::CUDA_KERNEL_NODE_PARAMS) -> Self {
        Self {
            func: p.func,
            kern: p.kern,
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared: p.sharedMemBytes,
            args: p.kernelParams,
            extra: p.extra,
        }
    }

    fn v3(p: &d::CUDA_KERNEL_NODE_PARAMS_v3) -> Self {
        Self {
            func: p.func,
            kern: p.kern,
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared: p.sharedMemBytes,
            args: p.kernelParams,
            extra: p.extra,
        }
    }

    fn v1(p: &d::CUDA_KERNEL_NODE_PARAMS_v1) -> Self {
        Self {
            func: p.func,
            kern: std::ptr::null_mut(),
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared: p.sharedMemBytes,
            args: p.kernelParams,
            extra: p.extra,
        }
    }

    /// The kernel node encoding: the function (a `CUfunction`, else the `CUkernel` on the
    /// current device) and its parameter block, packed as for `cuLaunchKernel`.
    ///
    /// # Safety
    /// `args` and `extra` as `cuLaunchKernel` documents them.
    unsafe fn encode(&self) -> DrvResult<Vec<u8>> {
        let f = if self.func.is_null() {
            modules::launchable(self.kern as usize)?
        } else {
            modules::launchable(self.func as usize)?
        };
        // SAFETY: forwarded contract.
        let block = unsafe { parameter_block(f, self.args, self.extra)? };
        let mut out = vec![0u8; KERNEL_NODE_HEADER + block.len()];
        KernelNode {
            function: f.resolved.function,
            grid: self.grid,
            block: self.block,
            shared_mem: self.shared,
            params: &block,
        }
        .encode(&mut out);
        Ok(out)
    }
}

/// Whether `addr` lies in a page of this process's address space: a unified address that does
/// not cannot be host memory (the device's addresses are the host's, not the guest's).
fn guest_mapped(addr: u64) -> bool {
    let page = addr & !0xfff;
    let mut vec = [0u8; 1];
    // SAFETY: mincore only reads the page tables for [page, page + 1) and writes one byte to
    // `vec`; an unmapped range answers ENOMEM.
    unsafe { libc::mincore(usize_of(page) as *mut c_void, 1, vec.as_mut_ptr()) == 0 }
}

/// One side of a `CUDA_MEMCPY3D` as a pointer, and whether it is host memory. A unified
/// address is device memory when the guest knows it as such (allocations, graph memory),
/// host memory when it is host-mapped or in this process's address space, and otherwise device
/// memory (module globals): the host checks it against the session's memory either way.
fn copy_side(
    rt: &Runtime,
    ty: d::CUmemorytype,
    host: *const c_void,
    device: d::CUdeviceptr,
    array: d::CUarray,
    lod: usize,
) -> DrvResult<(*mut c_void, bool)> {
    match ty {
        d::CU_MEMORYTYPE_HOST => Ok((host.cast_mut(), true)),
        d::CU_MEMORYTYPE_DEVICE => Ok((usize_of(device) as *mut c_void, false)),
        d::CU_MEMORYTYPE_UNIFIED => {
            let is_host = rt.allocations.find(device).is_none()
                && (rt.host_memory.device_range(usize_of(device), 1).is_some()
                    || guest_mapped(device));
            Ok((usize_of(device) as *mut c_void, is_host))
        }
        d::CU_MEMORYTYPE_ARRAY if !array.is_null() || lod != 0 => {
            warn_once!("CUDA graphs: memcpy nodes with CUDA arrays are not supported");
            Err(DriverError::NOT_SUPPORTED)
        }
        _ => Err(DriverError::INVALID_VALUE),
    }
}

/// A `CUDA_MEMCPY3D` as the runtime's `cudaMemcpy3DParms` (pitched pointers; the kind from the
/// memory types, and for unified addresses from what they are).
fn memcpy_params(rt: &Runtime, p: &d::CUDA_MEMCPY3D) -> DrvResult<cu::cudaMemcpy3DParms> {
    let (src, src_host) = copy_side(
        rt,
        p.srcMemoryType,
        p.srcHost,
        p.srcDevice,
        p.srcArray,
        p.srcLOD,
    )?;
    let (dst, dst_host) = copy_side(
        rt,
        p.dstMemoryType,
        p.dstHost,
        p.dstDevice,
        p.dstArray,
        p.dstLOD,
    )?;
    let kind = match (src_host, dst_host) {
        (true, true) => cu::cudaMemcpyHostToHost,
        (true, false) => cu::cudaMemcpyHostToDevice,
        (false, true) => cu::cudaMemcpyDeviceToHost,
        (false, false) => cu::cudaMemcpyDeviceToDevice,
    };
    // A copy of one row (or one plane) needs no pitch (height) to be given.
    let pitch = |given: usize| if given == 0 { p.WidthInBytes } else { given };
    let rows = |given: usize| if given == 0 { p.Height.max(1) } else { given };
    let mut r = cu::cudaMemcpy3DParms::default();
    r.srcPtr.ptr = src;
    r.srcPtr.pitch = pitch(p.srcPitch);
    r.srcPtr.xsize = p.WidthInBytes;
    r.srcPtr.ysize = rows(p.srcHeight);
    r.srcPos.x = p.srcXInBytes;
    r.srcPos.y = p.srcY;
    r.srcPos.z = p.srcZ;
    r.dstPtr.ptr = dst;
    r.dstPtr.pitch = pitch(p.dstPitch);
    r.dstPtr.xsize = p.WidthInBytes;
    r.dstPtr.ysize = rows(p.dstHeight);
    r.dstPos.x = p.dstXInBytes;
    r.dstPos.y = p.dstY;
    r.dstPos.z = p.dstZ;
    r.extent.width = p.WidthInBytes;
    r.extent.height = p.Height;
    r.extent.depth = p.Depth;
    r.kind = kind;
    Ok(r)
}

/// The runtime's parameters of a memcpy node as a `CUDA_MEMCPY3D` (unified addresses).
fn memcpy_out(p: &cu::cudaMemcpy3DParms) -> d::CUDA_MEMCPY3D {
    d::CUDA_MEMCPY3D {
        srcXInBytes: p.srcPos.x,
        srcY: p.srcPos.y,
        srcZ: p.srcPos.z,
        srcLOD: 0,
        srcMemoryType: d::CU_MEMORYTYPE_UNIFIED,
        srcHost: std::ptr::null(),
        srcDevice: p.srcPtr.ptr as d::CUdeviceptr,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: p.srcPtr.pitch,
        srcHeight: p.srcPtr.ysize,
        dstXInBytes: p.dstPos.x,
        dstY: p.dstPos.y,
        dstZ: p.dstPos.z,
        dstLOD: 0,
        dstMemoryType: d::CU_MEMORYTYPE_UNIFIED,
        dstHost: std::ptr::null_mut(),
        dstDevice: p.dstPtr.ptr as d::CUdeviceptr,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: p.dstPtr.pitch,
        dstHeight: p.dstPtr.ysize,
        WidthInBytes: p.extent.width,
        Height: p.extent.height,
        Depth: p.extent.depth,
    }
}

#[allow(clippy::too_many_arguments)]
fn memset_params(
    dst: d::CUdeviceptr,
    pitch: usize,
    value: c_uint,
    element_size: c_uint,
    width: usize,
    height: usize,
) -> cu::cudaMemsetParams {
    cu::cudaMemsetParams {
        dst: usize_of(dst) as *mut c_void,
        pitch,
        value,
        elementSize: element_size,
        width,
        height,
    }
}

fn host_params(fn_: d::CUhostFn, data: *mut c_void) -> cu::cudaHostNodeParams {
    cu::cudaHostNodeParams {
        fn_,
        userData: data,
    }
}

/// The node type and encoding of a driver `CUgraphNodeParams` for the node types that can be
/// added and changed alike (not memory or conditional nodes, which `add_generic` handles).
///
/// # Safety
/// The union member named by `p.type_` must be initialised, its pointers valid as the API
/// requires.
unsafe fn generic_encoding(rt: &Runtime, p: &d::CUgraphNodeParams) -> DrvResult<(u32, Vec<u8>)> {
    let u = &p.__bindgen_anon_1;
    let enc = match p.type_ {
        // SAFETY: `type_` names the member (caller contract), and so for each arm below.
        d::CU_GRAPH_NODE_TYPE_KERNEL => unsafe { KernelLaunch::v3(&u.kernel).encode()? },
        d::CU_GRAPH_NODE_TYPE_MEMCPY => {
            // SAFETY: as above.
            let m = unsafe { &u.memcpy };
            if m.flags != 0 {
                return Err(DriverError::INVALID_VALUE);
            }
            cg::memcpy_node(rt, &memcpy_params(rt, &m.copyParams)?)?.to_vec()
        }
        d::CU_GRAPH_NODE_TYPE_MEMSET => {
            // SAFETY: as above.
            let m = unsafe { &u.memset };
            let p = memset_params(m.dst, m.pitch, m.value, m.elementSize, m.width, m.height);
            cg::memset_node(rt, &p)?.to_vec()
        }
        d::CU_GRAPH_NODE_TYPE_HOST => {
            // SAFETY: as above.
            let h = unsafe { &u.host };
            cg::host_node(&host_params(h.fn_, h.userData))?
        }
        d::CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: as above.
            let c = unsafe { &u.graph };
            if c.graph.is_null() {
                return Err(DriverError::INVALID_VALUE);
            }
            child_graph_params(c)?
        }
        d::CU_GRAPH_NODE_TYPE_EMPTY => Vec::new(),
        d::CU_GRAPH_NODE_TYPE_WAIT_EVENT => {
            // SAFETY: as above.
            let e = unsafe { u.eventWait.event };
            cg::event_handle(rt, e.cast())?
        }
        d::CU_GRAPH_NODE_TYPE_EVENT_RECORD => {
            // SAFETY: as above.
            let e = unsafe { u.eventRecord.event };
            cg::event_handle(rt, e.cast())?
        }
        t if t <= d::CU_GRAPH_NODE_TYPE_CONDITIONAL => {
            warn_once!("CUDA graphs: external semaphore and batch memory-operation nodes, and new parameters for memory and conditional nodes, are not supported");
            return Err(DriverError::NOT_SUPPORTED);
        }
        _ => return Err(DriverError::INVALID_VALUE),
    };
    Ok((p.type_, enc))
}

/// A child graph node's encoding: the graph, and for `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`
/// the word that has the host give the graph itself to the node (XLA's command buffers).
fn child_graph_params(c: &d::CUDA_CHILD_GRAPH_NODE_PARAMS) -> DrvResult<Vec<u8>> {
    let mut enc = (c.graph as u64).to_le_bytes().to_vec();
    match c.ownership {
        d::CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE => {}
        d::CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE => {
            enc.extend_from_slice(&g::CHILD_MOVE.to_le_bytes());
        }
        _ => return Err(DriverError::INVALID_VALUE),
    }
    Ok(enc)
}

/// `cuGraphAddNode[_v2]`: every node type of the generic call except external semaphores and
/// batch memory operations.
///
/// # Safety
/// As `cuGraphAddNode_v2` documents.
unsafe fn add_generic(
    node: *mut d::CUgraphNode,
    graph: d::CUgraph,
    deps: *const d::CUgraphNode,
    edges: *const d::CUgraphEdgeData,
    n: usize,
    params: *mut d::CUgraphNodeParams,
) -> DrvResult<()> {
    let (rt, dev) = ready()?;
    if params.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: forwarded API contract throughout; the union member named by `type_` is
    // initialised.
    unsafe {
        let edges = cg::edge_bytes(edges.cast(), n)?;
        let p = &mut *params;
        let u = &mut p.__bindgen_anon_1;
        match p.type_ {
            d::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                let a = &mut u.alloc;
                mem_alloc(
                    rt,
                    node,
                    graph,
                    deps,
                    n,
                    &edges,
                    &a.poolProps,
                    a.accessDescs,
                    a.accessDescCount,
                    a.bytesize,
                    &mut a.dptr,
                )
            }
            d::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                let p = u.free.dptr.to_le_bytes();
                Ok(cg::add_node_edged(
                    rt,
                    dev,
                    node.cast(),
                    graph.cast(),
                    deps.cast(),
                    n,
                    &edges,
                    g::NODE_MEM_FREE,
                    &p,
                )?)
            }
            d::CU_GRAPH_NODE_TYPE_CONDITIONAL => {
                let c = &mut u.conditional;
                Ok(cg::add_conditional_node(
                    rt,
                    dev,
                    node.cast(),
                    graph.cast(),
                    deps.cast(),
                    n,
                    &edges,
                    c.handle,
                    c.type_,
                    c.size,
                    (&raw mut c.phGraph_out).cast(),
                )?)
            }
            d::CU_GRAPH_NODE_TYPE_KERNEL => {
                add_kernel(node, graph, deps, n, &edges, &KernelLaunch::v3(&u.kernel))
            }
            _ => {
                let (ty, enc) = generic_encoding(rt, p)?;
                Ok(cg::add_node_edged(
                    rt,
                    dev,
                    node.cast(),
                    graph.cast(),
                    deps.cast(),
                    n,
                    &edges,
                    ty,
                    &enc,
                )?)
            }
        }
    }
}

/// A memory allocation node (the pool properties and access descriptors are the runtime's
/// records, by layout).
///
/// # Safety
/// As `cuGraphAddMemAllocNode` documents.
#[allow(clippy::too_many_arguments)]
unsafe fn mem_alloc(
    rt: &Runtime,
    node: *mut d::CUgraphNode,
    graph: d::CUgraph,
    deps: *const d::CUgraphNode,
    n: usize,
    edges: &[u8],
    props: &d::CUmemPoolProps,
    access: *const d::CUmemAccessDesc,
    access_count: usize,
    bytesize: usize,
    dptr: &mut d::CUdeviceptr,
) -> DrvResult<()> {
    if node.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: the same C layout (checked above); the rest forwarded.
    let (h, addr) = unsafe {
        cg::mem_alloc_node(
            rt,
            graph.cast(),
            deps.cast(),
            n,
            edges,
            &*std::ptr::from_ref(props).cast::<cu::cudaMemPoolProps>(),
            access.cast(),
            access_count,
            bytesize,
        )?
    };
    *dptr = addr;
    // SAFETY: non-null and writable (API contract).
    unsafe { node.write(usize_of(h) as d::CUgraphNode) };
    Ok(())
}

/// Sets node parameters from the driver's generic record: of a graph's node (`exec` null) or in
/// an executable graph.
///
/// # Safety
/// As `cuGraphNodeSetParams` documents.
unsafe fn set_generic(
    exec: d::CUgraphExec,
    node: d::CUgraphNode,
    params: *mut d::CUgraphNodeParams,
) -> DrvResult<()> {
    let (rt, dev) = ready()?;
    if params.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: forwarded API contract.
    let (ty, enc) = unsafe { generic_encoding(rt, &*params)? };
    if ty == d::CU_GRAPH_NODE_TYPE_HOST && exec.is_null() {
        // The host-function table follows the graph's node (as the runtime face's call does).
        return Ok(
            // SAFETY: forwarded API contract.
            unsafe {
                let h = &(*params).__bindgen_anon_1.host;
                cg::graph_host_node_set_params(
                    node.cast(),
                    &raw const *std::ptr::from_ref(&host_params(h.fn_, h.userData)),
                )
            }?,
        );
    }
    cg::set_params(rt, dev, exec.cast(), node.cast(), ty, &enc)?;
    if ty == d::CU_GRAPH_NODE_TYPE_KERNEL && exec.is_null() {
        // SAFETY: the kernel member, named by `type_` (API contract).
        remember_function(
            node as u64,
            &KernelLaunch::v3(unsafe { &(*params).__bindgen_anon_1.kernel }),
        );
    }
    Ok(())
}

/// Adds a node of type `ty` with encoded `params`.
///
/// # Safety
/// `node` null or writable; `deps` holds `n` readable handles.
unsafe fn add(
    node: *mut d::CUgraphNode,
    graph: d::CUgraph,
    deps: *const d::CUgraphNode,
    n: usize,
    ty: u32,
    params: &[u8],
) -> DrvResult<()> {
    let (rt, dev) = ready()?;
    // SAFETY: forwarded contract.
    Ok(unsafe {
        cg::add_node(
            rt,
            dev,
            node.cast(),
            graph.cast(),
            deps.cast(),
            n,
            ty,
            params,
        )
    }?)
}

/// Kernel node parameters as the driver hands them out: the `CUfunction` whose host function
/// the node runs, the values in a block kept until the node's next call of this.
///
/// # Safety
/// `out` null or writable.
unsafe fn kernel_get(
    node: d::CUgraphNode,
) -> DrvResult<(usize, usize, KernelNode<'static>, *mut *mut c_void)> {
    let (rt, dev) = ready()?;
    let enc = cg::kernel_node_encoding(rt, dev, node.cast())?;
    let k = KernelNode::decode(&enc).ok_or(CudaError::UNKNOWN)?;
    // The function the node was given through this face, while the node still runs it;
    // otherwise (captured, or made through the runtime face) this process's function that does.
    let given = remembered_function(node as u64).and_then(|(func, kern)| {
        let f = modules::launchable(if func == 0 { kern } else { func }).ok()?;
        (f.resolved.function == k.function).then_some((f, func, kern))
    });
    let (f, func, kern) = match given {
        Some(g) => g,
        None => {
            let f = modules::function_by_host(dev, k.function).ok_or(DriverError::INVALID_VALUE)?;
            (f, modules::handle_of(f), 0)
        }
    };
    let mut block = vec![0u64; k.params.len().div_ceil(8)];
    // SAFETY: `block` holds at least `k.params.len()` bytes; u64 has no invalid values.
    unsafe {
        std::ptr::copy_nonoverlapping(
            k.params.as_ptr(),
            block.as_mut_ptr().cast::<u8>(),
            k.params.len(),
        );
    }
    let base = block.as_mut_ptr().cast::<u8>();
    let mut pointers: Vec<*mut c_void> = f
        .resolved
        .params
        .iter()
        .map(|p| base.wrapping_add(p.offset as usize).cast::<c_void>())
        .collect();
    let args = if pointers.is_empty() {
        std::ptr::null_mut()
    } else {
        pointers.as_mut_ptr()
    };
    let header = KernelNode {
        function: k.function,
        grid: k.grid,
        block: k.block,
        shared_mem: k.shared_mem,
        params: &[],
    };
    cg::keep_kernel_params(node as u64, block, pointers);
    Ok((func, kern, header, args))
}

/// Adds a kernel node for `launch`, remembering the function it was given.
///
/// # Safety
/// As `cuGraphAddKernelNode_v2` documents.
unsafe fn add_kernel(
    node: *mut d::CUgraphNode,
    graph: d::CUgraph,
    deps: *const d::CUgraphNode,
    n: usize,
    edges: &[u8],
    launch: &KernelLaunch,
) -> DrvResult<()> {
    let (rt, dev) = ready()?;
    // SAFETY: forwarded contract.
    let enc = unsafe { launch.encode()? };
    // SAFETY: forwarded contract.
    unsafe {
        cg::add_node_edged(
            rt,
            dev,
            node.cast(),
            graph.cast(),
            deps.cast(),
            n,
            edges,
            g::NODE_KERNEL,
            &enc,
        )?;
    }
    // SAFETY: written by `add` just now.
    remember_function(unsafe { *node } as u64, launch);
    Ok(())
}

/// New kernel parameters for a graph's node (`exec` null; the function is remembered) or in an
/// executable graph.
///
/// # Safety
/// As `cuGraphKernelNodeSetParams_v2` documents.
unsafe fn set_kernel(
    exec: d::CUgraphExec,
    node: d::CUgraphNode,
    launch: &KernelLaunch,
) -> DrvResult<()> {
    let (rt, dev) = ready()?;
    // SAFETY: forwarded contract.
    let enc = unsafe { launch.encode()? };
    cg::set_params(rt, dev, exec.cast(), node.cast(), g::NODE_KERNEL, &enc)?;
    if exec.is_null() {
        remember_function(node as u64, launch);
    }
    Ok(())
}

driver_api! {
    /// `cuThreadExchangeStreamCaptureMode`: per guest thread (capture.rs).
    fn cuThreadExchangeStreamCaptureMode(mode: *mut d::CUstreamCaptureMode) {
        initialized()?;
        // SAFETY: forwarded contract; the modes are the runtime's.
        Ok(unsafe { cg::thread_exchange_stream_capture_mode(mode) }?)
    }

    /// `cuStreamBeginCapture_v2`.
    #[per_thread(cuStreamBeginCapture_v2_ptsz)]
    fn cuStreamBeginCapture_v2(hStream: d::CUstream, mode: d::CUstreamCaptureMode) {
        ready()?;
        Ok(cg::begin_capture(hStream.cast(), mode)?)
    }

    /// `cuStreamBeginCapture` (CUDA 10.0: the global mode).
    #[per_thread(cuStreamBeginCapture_ptsz)]
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuStreamBeginCapture(hStream: d::CUstream) {
        ready()?;
        Ok(cg::begin_capture(hStream.cast(), cu::cudaStreamCaptureModeGlobal)?)
    }

    /// `cuStreamBeginCaptureToGraph` (edge data included).
    #[per_thread(cuStreamBeginCaptureToGraph_ptsz)]
    fn cuStreamBeginCaptureToGraph(
        hStream: d::CUstream,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        dependencyData: *const d::CUgraphEdgeData,
        numDependencies: usize,
        mode: d::CUstreamCaptureMode,
    ) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe {
            cg::begin_capture_to_graph(hStream.cast(), hGraph.cast(), dependencies.cast(), dependencyData.cast(), numDependencies, mode)
        }?)
    }

    /// `cuStreamEndCapture`.
    #[per_thread(cuStreamEndCapture_ptsz)]
    fn cuStreamEndCapture(hStream: d::CUstream, phGraph: *mut d::CUgraph) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::end_capture(hStream.cast(), phGraph.cast()) }?)
    }

    /// `cuStreamIsCapturing`.
    #[per_thread(cuStreamIsCapturing_ptsz)]
    fn cuStreamIsCapturing(hStream: d::CUstream, captureStatus: *mut d::CUstreamCaptureStatus) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::is_capturing(hStream.cast(), captureStatus) }?)
    }

    /// `cuStreamGetCaptureInfo_v3`: the dependency and edge arrays stay valid until the calling
    /// thread's next call of it.
    #[per_thread(cuStreamGetCaptureInfo_v3_ptsz)]
    fn cuStreamGetCaptureInfo_v3(
        hStream: d::CUstream,
        captureStatus_out: *mut d::CUstreamCaptureStatus,
        id_out: *mut d::cuuint64_t,
        graph_out: *mut d::CUgraph,
        dependencies_out: *mut *const d::CUgraphNode,
        edgeData_out: *mut *const d::CUgraphEdgeData,
        numDependencies_out: *mut usize,
    ) {
        ready()?;
        // SAFETY: forwarded contract; the node and edge records are the core's.
        Ok(unsafe {
            cg::get_capture_info(
                hStream.cast(),
                captureStatus_out,
                id_out.cast::<c_ulonglong>(),
                graph_out.cast(),
                dependencies_out.cast(),
                edgeData_out.cast(),
                numDependencies_out,
            )
        }?)
    }

    /// `cuStreamGetCaptureInfo_v2` (CUDA 11.3-12.2: no edge data).
    #[per_thread(cuStreamGetCaptureInfo_v2_ptsz)]
    #[no_prototype = "cuda.h maps it to _v3"]
    fn cuStreamGetCaptureInfo_v2(
        hStream: d::CUstream,
        captureStatus_out: *mut d::CUstreamCaptureStatus,
        id_out: *mut d::cuuint64_t,
        graph_out: *mut d::CUgraph,
        dependencies_out: *mut *const d::CUgraphNode,
        numDependencies_out: *mut usize
    ) {
        ready()?;
        // SAFETY: the same contract, without edge data.
        Ok(unsafe {
            cg::get_capture_info(
                hStream.cast(),
                captureStatus_out,
                id_out.cast::<c_ulonglong>(),
                graph_out.cast(),
                dependencies_out.cast(),
                std::ptr::null_mut(),
                numDependencies_out,
            )
        }?)
    }

    /// `cuStreamGetCaptureInfo` (CUDA 10.1: status and id).
    #[per_thread(cuStreamGetCaptureInfo_ptsz)]
    #[no_prototype = "cuda.h maps it to _v3"]
    fn cuStreamGetCaptureInfo(
        hStream: d::CUstream,
        captureStatus_out: *mut d::CUstreamCaptureStatus,
        id_out: *mut d::cuuint64_t
    ) {
        ready()?;
        // SAFETY: the same contract, status and id only.
        Ok(unsafe {
            cg::get_capture_info(
                hStream.cast(),
                captureStatus_out,
                id_out.cast::<c_ulonglong>(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }?)
    }

    /// `cuStreamUpdateCaptureDependencies_v2` (edge data included).
    #[per_thread(cuStreamUpdateCaptureDependencies_v2_ptsz)]
    fn cuStreamUpdateCaptureDependencies_v2(
        hStream: d::CUstream,
        dependencies: *mut d::CUgraphNode,
        dependencyData: *const d::CUgraphEdgeData,
        numDependencies: usize,
        flags: c_uint,
    ) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe {
            cg::update_capture_deps(hStream.cast(), dependencies.cast(), dependencyData.cast(), numDependencies, flags)
        }?)
    }

    /// `cuStreamUpdateCaptureDependencies` (CUDA 11.3: no edge data).
    #[per_thread(cuStreamUpdateCaptureDependencies_ptsz)]
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuStreamUpdateCaptureDependencies(
        hStream: d::CUstream,
        dependencies: *mut d::CUgraphNode,
        numDependencies: usize,
        flags: c_uint
    ) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe {
            cg::update_capture_deps(hStream.cast(), dependencies.cast(), std::ptr::null(), numDependencies, flags)
        }?)
    }

    /// `cuGraphCreate` (flags must be 0).
    fn cuGraphCreate(phGraph: *mut d::CUgraph, flags: c_uint) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_create(phGraph.cast(), flags) }?)
    }

    /// `cuGraphDestroy`.
    fn cuGraphDestroy(hGraph: d::CUgraph) {
        // Like NVIDIA's driver, this needs no current context.
        initialized()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_destroy(hGraph.cast()) }?)
    }

    /// `cuGraphClone`.
    fn cuGraphClone(phGraphClone: *mut d::CUgraph, originalGraph: d::CUgraph) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_clone(phGraphClone.cast(), originalGraph.cast()) }?)
    }

    /// `cuGraphConditionalHandleCreate`: the host driver's handle on the graph (for the current
    /// context), the 64-bit value kernels pass to `cudaGraphSetConditional`.
    fn cuGraphConditionalHandleCreate(
        pHandle_out: *mut d::CUgraphConditionalHandle,
        hGraph: d::CUgraph,
        ctx: d::CUcontext,
        defaultLaunchValue: c_uint,
        flags: c_uint,
    ) {
        ready()?;
        if !ctx.is_null() {
            context::lookup(ctx as usize)?;
        }
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::conditional_handle_create(pHandle_out, hGraph.cast(), defaultLaunchValue, flags) }?)
    }

    /// `cuGraphAddNode_v2`: kernel, memcpy, memset, host, child graph, empty, event, memory
    /// allocation and free, and conditional nodes (edge data included).
    fn cuGraphAddNode_v2(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        dependencyData: *const d::CUgraphEdgeData,
        numDependencies: usize,
        nodeParams: *mut d::CUgraphNodeParams,
    ) {
        // SAFETY: forwarded contract.
        unsafe { add_generic(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams) }
    }

    /// `cuGraphAddNode` (CUDA 12.2: no edge data).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphAddNode(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        numDependencies: usize,
        nodeParams: *mut d::CUgraphNodeParams
    ) {
        // SAFETY: forwarded contract.
        unsafe { add_generic(phGraphNode, hGraph, dependencies, std::ptr::null(), numDependencies, nodeParams) }
    }

    /// `cuGraphNodeSetParams`.
    fn cuGraphNodeSetParams(hNode: d::CUgraphNode, nodeParams: *mut d::CUgraphNodeParams) {
        // SAFETY: forwarded contract.
        unsafe { set_generic(std::ptr::null_mut(), hNode, nodeParams) }
    }

    /// `cuGraphExecNodeSetParams`.
    fn cuGraphExecNodeSetParams(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, nodeParams: *mut d::CUgraphNodeParams) {
        if hGraphExec.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: forwarded contract.
        unsafe { set_generic(hGraphExec, hNode, nodeParams) }
    }

    /// `cuGraphAddEmptyNode`.
    fn cuGraphAddEmptyNode(phGraphNode: *mut d::CUgraphNode, hGraph: d::CUgraph, dependencies: *const d::CUgraphNode, numDependencies: usize) {
        // SAFETY: forwarded contract.
        unsafe { add(phGraphNode, hGraph, dependencies, numDependencies, g::NODE_EMPTY, &[]) }
    }

    /// `cuGraphAddKernelNode_v2`: a `CUfunction` (or a `CUkernel`), its parameters from
    /// `kernelParams` or `extra`, packed as for a launch.
    fn cuGraphAddKernelNode_v2(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        numDependencies: usize,
        nodeParams: *const d::CUDA_KERNEL_NODE_PARAMS,
    ) {
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: readable, with kernel parameters as the API requires; the rest forwarded.
        unsafe { add_kernel(phGraphNode, hGraph, dependencies, numDependencies, &[], &KernelLaunch::v2(&*nodeParams)) }
    }

    /// `cuGraphAddKernelNode` (CUDA 10-11 parameters).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphAddKernelNode(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        numDependencies: usize,
        nodeParams: *const d::CUDA_KERNEL_NODE_PARAMS_v1
    ) {
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: readable, with kernel parameters as the API requires; the rest forwarded.
        unsafe { add_kernel(phGraphNode, hGraph, dependencies, numDependencies, &[], &KernelLaunch::v1(&*nodeParams)) }
    }

    /// `cuGraphKernelNodeSetParams_v2`.
    fn cuGraphKernelNodeSetParams_v2(hNode: d::CUgraphNode, nodeParams: *const d::CUDA_KERNEL_NODE_PARAMS) {
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: as for cuGraphAddKernelNode_v2.
        unsafe { set_kernel(std::ptr::null_mut(), hNode, &KernelLaunch::v2(&*nodeParams)) }
    }

    /// `cuGraphKernelNodeSetParams` (CUDA 10-11 parameters).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphKernelNodeSetParams(hNode: d::CUgraphNode, nodeParams: *const d::CUDA_KERNEL_NODE_PARAMS_v1) {
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: as for cuGraphAddKernelNode_v2.
        unsafe { set_kernel(std::ptr::null_mut(), hNode, &KernelLaunch::v1(&*nodeParams)) }
    }

    /// `cuGraphExecKernelNodeSetParams_v2`.
    fn cuGraphExecKernelNodeSetParams_v2(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, nodeParams: *const d::CUDA_KERNEL_NODE_PARAMS) {
        if nodeParams.is_null() || hGraphExec.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: as for cuGraphAddKernelNode_v2.
        unsafe { set_kernel(hGraphExec, hNode, &KernelLaunch::v2(&*nodeParams)) }
    }

    /// `cuGraphExecKernelNodeSetParams` (CUDA 10-11 parameters).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphExecKernelNodeSetParams(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, nodeParams: *const d::CUDA_KERNEL_NODE_PARAMS_v1) {
        if nodeParams.is_null() || hGraphExec.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: as for cuGraphAddKernelNode_v2.
        unsafe { set_kernel(hGraphExec, hNode, &KernelLaunch::v1(&*nodeParams)) }
    }

    /// `cuGraphKernelNodeGetParams_v2`: the `CUfunction` of this process that the node runs;
    /// the parameter values stay valid until the node's next call of it.
    fn cuGraphKernelNodeGetParams_v2(hNode: d::CUgraphNode, nodeParams: *mut d::CUDA_KERNEL_NODE_PARAMS) {
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: forwarded contract.
        let (func, kern, k, args) = unsafe { kernel_get(hNode)? };
        let p = d::CUDA_KERNEL_NODE_PARAMS {
            func: func as d::CUfunction,
            gridDimX: k.grid[0],
            gridDimY: k.grid[1],
            gridDimZ: k.grid[2],
            blockDimX: k.block[0],
            blockDimY: k.block[1],
            blockDimZ: k.block[2],
            sharedMemBytes: k.shared_mem,
            kernelParams: args,
            extra: std::ptr::null_mut(),
            kern: kern as d::CUkernel,
            ctx: std::ptr::null_mut(),
        };
        // SAFETY: non-null and writable (API contract).
        unsafe { nodeParams.write_unaligned(p) };
        Ok(())
    }

    /// `cuGraphKernelNodeGetParams` (CUDA 10-11 parameters).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphKernelNodeGetParams(hNode: d::CUgraphNode, nodeParams: *mut d::CUDA_KERNEL_NODE_PARAMS_v1) {
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: forwarded contract.
        let (func, kern, k, args) = unsafe { kernel_get(hNode)? };
        let p = d::CUDA_KERNEL_NODE_PARAMS_v1 {
            // A CUkernel goes wherever a CUfunction does.
            func: (if func == 0 { kern } else { func }) as d::CUfunction,
            gridDimX: k.grid[0],
            gridDimY: k.grid[1],
            gridDimZ: k.grid[2],
            blockDimX: k.block[0],
            blockDimY: k.block[1],
            blockDimZ: k.block[2],
            sharedMemBytes: k.shared_mem,
            kernelParams: args,
            extra: std::ptr::null_mut(),
        };
        // SAFETY: non-null and writable (API contract).
        unsafe { nodeParams.write_unaligned(p) };
        Ok(())
    }

    /// `cuGraphAddMemcpyNode`: pitched device, host or unified memory (not arrays); host memory
    /// as for the runtime face (pinned, registered, managed, or pageable pinned for the graph).
    fn cuGraphAddMemcpyNode(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        numDependencies: usize,
        copyParams: *const d::CUDA_MEMCPY3D,
        ctx: d::CUcontext,
    ) {
        let (rt, _) = ready()?;
        if copyParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let _ = ctx;
        // SAFETY: readable (API contract).
        let enc = cg::memcpy_node(rt, &memcpy_params(rt, unsafe { &*copyParams })?)?;
        // SAFETY: forwarded contract.
        unsafe { add(phGraphNode, hGraph, dependencies, numDependencies, g::NODE_MEMCPY, &enc) }
    }

    /// `cuGraphMemcpyNodeSetParams`.
    fn cuGraphMemcpyNodeSetParams(hNode: d::CUgraphNode, nodeParams: *const d::CUDA_MEMCPY3D) {
        let (rt, dev) = ready()?;
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: readable (API contract).
        let enc = cg::memcpy_node(rt, &memcpy_params(rt, unsafe { &*nodeParams })?)?;
        Ok(cg::set_params(rt, dev, std::ptr::null_mut(), hNode.cast(), g::NODE_MEMCPY, &enc)?)
    }

    /// `cuGraphExecMemcpyNodeSetParams`.
    fn cuGraphExecMemcpyNodeSetParams(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, copyParams: *const d::CUDA_MEMCPY3D, ctx: d::CUcontext) {
        let (rt, dev) = ready()?;
        if copyParams.is_null() || hGraphExec.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let _ = ctx;
        // SAFETY: readable (API contract).
        let enc = cg::memcpy_node(rt, &memcpy_params(rt, unsafe { &*copyParams })?)?;
        Ok(cg::set_params(rt, dev, hGraphExec.cast(), hNode.cast(), g::NODE_MEMCPY, &enc)?)
    }

    /// `cuGraphMemcpyNodeGetParams`: unified addresses (host-mapped memory by its guest
    /// address), offsets in the addresses.
    fn cuGraphMemcpyNodeGetParams(hNode: d::CUgraphNode, nodeParams: *mut d::CUDA_MEMCPY3D) {
        ready()?;
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let mut p = cu::cudaMemcpy3DParms::default();
        // SAFETY: a local out-parameter.
        unsafe { cg::graph_memcpy_node_get_params(hNode.cast(), &raw mut p)? };
        // SAFETY: non-null and writable (API contract).
        unsafe { nodeParams.write_unaligned(memcpy_out(&p)) };
        Ok(())
    }

    /// `cuGraphAddMemsetNode`.
    fn cuGraphAddMemsetNode(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        numDependencies: usize,
        memsetParams: *const d::CUDA_MEMSET_NODE_PARAMS,
        ctx: d::CUcontext,
    ) {
        let (rt, _) = ready()?;
        if memsetParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let _ = ctx;
        // SAFETY: readable (API contract).
        let m = unsafe { &*memsetParams };
        let enc = cg::memset_node(rt, &memset_params(m.dst, m.pitch, m.value, m.elementSize, m.width, m.height))?;
        // SAFETY: forwarded contract.
        unsafe { add(phGraphNode, hGraph, dependencies, numDependencies, g::NODE_MEMSET, &enc) }
    }

    /// `cuGraphMemsetNodeSetParams`.
    fn cuGraphMemsetNodeSetParams(hNode: d::CUgraphNode, nodeParams: *const d::CUDA_MEMSET_NODE_PARAMS) {
        let (rt, dev) = ready()?;
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: readable (API contract).
        let m = unsafe { &*nodeParams };
        let enc = cg::memset_node(rt, &memset_params(m.dst, m.pitch, m.value, m.elementSize, m.width, m.height))?;
        Ok(cg::set_params(rt, dev, std::ptr::null_mut(), hNode.cast(), g::NODE_MEMSET, &enc)?)
    }

    /// `cuGraphExecMemsetNodeSetParams`.
    fn cuGraphExecMemsetNodeSetParams(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, memsetParams: *const d::CUDA_MEMSET_NODE_PARAMS, ctx: d::CUcontext) {
        let (rt, dev) = ready()?;
        if memsetParams.is_null() || hGraphExec.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let _ = ctx;
        // SAFETY: readable (API contract).
        let m = unsafe { &*memsetParams };
        let enc = cg::memset_node(rt, &memset_params(m.dst, m.pitch, m.value, m.elementSize, m.width, m.height))?;
        Ok(cg::set_params(rt, dev, hGraphExec.cast(), hNode.cast(), g::NODE_MEMSET, &enc)?)
    }

    /// `cuGraphMemsetNodeGetParams`.
    fn cuGraphMemsetNodeGetParams(hNode: d::CUgraphNode, nodeParams: *mut d::CUDA_MEMSET_NODE_PARAMS) {
        ready()?;
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let mut p = cu::cudaMemsetParams::default();
        // SAFETY: a local out-parameter.
        unsafe { cg::graph_memset_node_get_params(hNode.cast(), &raw mut p)? };
        let out = d::CUDA_MEMSET_NODE_PARAMS {
            dst: p.dst as d::CUdeviceptr,
            pitch: p.pitch,
            value: p.value,
            elementSize: p.elementSize,
            width: p.width,
            height: p.height,
        };
        // SAFETY: non-null and writable (API contract).
        unsafe { nodeParams.write_unaligned(out) };
        Ok(())
    }

    /// `cuGraphAddHostNode`: the function runs in this process, like `cuLaunchHostFunc`.
    fn cuGraphAddHostNode(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        numDependencies: usize,
        nodeParams: *const d::CUDA_HOST_NODE_PARAMS,
    ) {
        ready()?;
        // SAFETY: forwarded contract; the same record as the runtime's.
        Ok(unsafe { cg::graph_add_host_node(phGraphNode.cast(), hGraph.cast(), dependencies.cast(), numDependencies, nodeParams.cast()) }?)
    }

    /// `cuGraphHostNodeGetParams`.
    fn cuGraphHostNodeGetParams(hNode: d::CUgraphNode, nodeParams: *mut d::CUDA_HOST_NODE_PARAMS) {
        ready()?;
        // SAFETY: forwarded contract; the same record as the runtime's.
        Ok(unsafe { cg::graph_host_node_get_params(hNode.cast(), nodeParams.cast()) }?)
    }

    /// `cuGraphHostNodeSetParams`.
    fn cuGraphHostNodeSetParams(hNode: d::CUgraphNode, nodeParams: *const d::CUDA_HOST_NODE_PARAMS) {
        ready()?;
        // SAFETY: forwarded contract; the same record as the runtime's.
        Ok(unsafe { cg::graph_host_node_set_params(hNode.cast(), nodeParams.cast()) }?)
    }

    /// `cuGraphExecHostNodeSetParams`.
    fn cuGraphExecHostNodeSetParams(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, nodeParams: *const d::CUDA_HOST_NODE_PARAMS) {
        ready()?;
        // SAFETY: forwarded contract; the same record as the runtime's.
        Ok(unsafe { cg::graph_exec_host_node_set_params(hGraphExec.cast(), hNode.cast(), nodeParams.cast()) }?)
    }

    /// `cuGraphAddChildGraphNode`: the child graph is cloned into the node.
    fn cuGraphAddChildGraphNode(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        numDependencies: usize,
        childGraph: d::CUgraph,
    ) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_add_child_graph_node(phGraphNode.cast(), hGraph.cast(), dependencies.cast(), numDependencies, childGraph.cast()) }?)
    }

    /// `cuGraphChildGraphNodeGetGraph`: the graph the node owns.
    fn cuGraphChildGraphNodeGetGraph(hNode: d::CUgraphNode, phGraph: *mut d::CUgraph) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_child_graph_node_get_graph(hNode.cast(), phGraph.cast()) }?)
    }

    /// `cuGraphExecChildGraphNodeSetParams`.
    fn cuGraphExecChildGraphNodeSetParams(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, childGraph: d::CUgraph) {
        ready()?;
        // SAFETY: handles only.
        Ok(unsafe { cg::graph_exec_child_graph_node_set_params(hGraphExec.cast(), hNode.cast(), childGraph.cast()) }?)
    }

    /// `cuGraphAddEventRecordNode`.
    fn cuGraphAddEventRecordNode(phGraphNode: *mut d::CUgraphNode, hGraph: d::CUgraph, dependencies: *const d::CUgraphNode, numDependencies: usize, event: d::CUevent) {
        let (rt, _) = ready()?;
        let enc = cg::event_handle(rt, event.cast())?;
        // SAFETY: forwarded contract.
        unsafe { add(phGraphNode, hGraph, dependencies, numDependencies, g::NODE_EVENT_RECORD, &enc) }
    }

    /// `cuGraphAddEventWaitNode`.
    fn cuGraphAddEventWaitNode(phGraphNode: *mut d::CUgraphNode, hGraph: d::CUgraph, dependencies: *const d::CUgraphNode, numDependencies: usize, event: d::CUevent) {
        let (rt, _) = ready()?;
        let enc = cg::event_handle(rt, event.cast())?;
        // SAFETY: forwarded contract.
        unsafe { add(phGraphNode, hGraph, dependencies, numDependencies, g::NODE_WAIT_EVENT, &enc) }
    }

    /// `cuGraphEventRecordNodeGetEvent`.
    fn cuGraphEventRecordNodeGetEvent(hNode: d::CUgraphNode, event_out: *mut d::CUevent) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::node_event(hNode.cast(), event_out.cast(), cu::cudaGraphNodeTypeEventRecord) }?)
    }

    /// `cuGraphEventWaitNodeGetEvent`.
    fn cuGraphEventWaitNodeGetEvent(hNode: d::CUgraphNode, event_out: *mut d::CUevent) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::node_event(hNode.cast(), event_out.cast(), cu::cudaGraphNodeTypeWaitEvent) }?)
    }

    /// `cuGraphEventRecordNodeSetEvent`.
    fn cuGraphEventRecordNodeSetEvent(hNode: d::CUgraphNode, event: d::CUevent) {
        ready()?;
        // SAFETY: handles only.
        Ok(unsafe { cg::graph_event_record_node_set_event(hNode.cast(), event.cast()) }?)
    }

    /// `cuGraphEventWaitNodeSetEvent`.
    fn cuGraphEventWaitNodeSetEvent(hNode: d::CUgraphNode, event: d::CUevent) {
        ready()?;
        // SAFETY: handles only.
        Ok(unsafe { cg::graph_event_wait_node_set_event(hNode.cast(), event.cast()) }?)
    }

    /// `cuGraphExecEventRecordNodeSetEvent`.
    fn cuGraphExecEventRecordNodeSetEvent(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, event: d::CUevent) {
        ready()?;
        // SAFETY: handles only.
        Ok(unsafe { cg::exec_set_event(hGraphExec.cast(), hNode.cast(), event.cast()) }?)
    }

    /// `cuGraphExecEventWaitNodeSetEvent`.
    fn cuGraphExecEventWaitNodeSetEvent(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, event: d::CUevent) {
        ready()?;
        // SAFETY: handles only.
        Ok(unsafe { cg::exec_set_event(hGraphExec.cast(), hNode.cast(), event.cast()) }?)
    }

    /// `cuGraphAddMemAllocNode`: pinned device memory of the pool's device, at an address
    /// fixed for the graph's lifetime (written to `nodeParams->dptr`).
    fn cuGraphAddMemAllocNode(
        phGraphNode: *mut d::CUgraphNode,
        hGraph: d::CUgraph,
        dependencies: *const d::CUgraphNode,
        numDependencies: usize,
        nodeParams: *mut d::CUDA_MEM_ALLOC_NODE_PARAMS,
    ) {
        let (rt, _) = ready()?;
        if nodeParams.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: readable and writable (API contract); the rest forwarded.
        unsafe {
            let a = &mut *nodeParams;
            mem_alloc(rt, phGraphNode, hGraph, dependencies, numDependencies, &[], &a.poolProps, a.accessDescs, a.accessDescCount, a.bytesize, &mut a.dptr)
        }
    }

    /// `cuGraphMemAllocNodeGetParams`: address, size and the pool properties of the device.
    fn cuGraphMemAllocNodeGetParams(hNode: d::CUgraphNode, params_out: *mut d::CUDA_MEM_ALLOC_NODE_PARAMS) {
        ready()?;
        if params_out.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let p = cg::mem_alloc_node_get(hNode.cast())?;
        // SAFETY: writable (API contract); the runtime's record, by layout (checked above).
        unsafe { params_out.cast::<cu::cudaMemAllocNodeParams>().write_unaligned(p) };
        Ok(())
    }

    /// `cuGraphMemFreeNodeGetParams`.
    fn cuGraphMemFreeNodeGetParams(hNode: d::CUgraphNode, dptr_out: *mut d::CUdeviceptr) {
        ready()?;
        let d = cg::mem_free_node_get(hNode.cast())?;
        // SAFETY: null or writable (API contract).
        Ok(unsafe { cg::write_out(dptr_out, d) }?)
    }

    /// `cuGraphAddMemFreeNode`: `dptr` must be a graph allocation's address.
    fn cuGraphAddMemFreeNode(phGraphNode: *mut d::CUgraphNode, hGraph: d::CUgraph, dependencies: *const d::CUgraphNode, numDependencies: usize, dptr: d::CUdeviceptr) {
        // SAFETY: forwarded contract.
        unsafe { add(phGraphNode, hGraph, dependencies, numDependencies, g::NODE_MEM_FREE, &dptr.to_le_bytes()) }
    }

    /// `cuDeviceGraphMemTrim`: the driver's, on the host.
    fn cuDeviceGraphMemTrim(device: d::CUdevice) {
        initialized()?;
        // SAFETY: no pointers.
        Ok(unsafe { cg::device_graph_mem_trim(device) }?)
    }

    /// `cuDeviceGetGraphMemAttribute`: the driver's figures.
    fn cuDeviceGetGraphMemAttribute(device: d::CUdevice, attr: d::CUgraphMem_attribute, value: *mut c_void) {
        initialized()?;
        // SAFETY: forwarded contract (the attributes are the runtime's).
        Ok(unsafe { cg::device_get_graph_mem_attribute(device, attr, value) }?)
    }

    /// `cuDeviceSetGraphMemAttribute`: only the high watermarks can be reset, to 0.
    fn cuDeviceSetGraphMemAttribute(device: d::CUdevice, attr: d::CUgraphMem_attribute, value: *mut c_void) {
        initialized()?;
        // SAFETY: forwarded contract (the attributes are the runtime's).
        Ok(unsafe { cg::device_set_graph_mem_attribute(device, attr, value) }?)
    }

    /// `cuGraphGetNodes`.
    fn cuGraphGetNodes(hGraph: d::CUgraph, nodes: *mut d::CUgraphNode, numNodes: *mut usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_nodes(hGraph.cast(), false, nodes.cast(), numNodes) }?)
    }

    /// `cuGraphGetRootNodes`.
    fn cuGraphGetRootNodes(hGraph: d::CUgraph, rootNodes: *mut d::CUgraphNode, numRootNodes: *mut usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_nodes(hGraph.cast(), true, rootNodes.cast(), numRootNodes) }?)
    }

    /// `cuGraphGetEdges_v2` (edge data, when asked for, is all default).
    fn cuGraphGetEdges_v2(hGraph: d::CUgraph, from: *mut d::CUgraphNode, to: *mut d::CUgraphNode, edgeData: *mut d::CUgraphEdgeData, numEdges: *mut usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_get_edges(hGraph.cast(), from.cast(), to.cast(), edgeData.cast(), numEdges) }?)
    }

    /// `cuGraphGetEdges` (no edge data).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphGetEdges(hGraph: d::CUgraph, from: *mut d::CUgraphNode, to: *mut d::CUgraphNode, numEdges: *mut usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_get_edges(hGraph.cast(), from.cast(), to.cast(), std::ptr::null_mut(), numEdges) }?)
    }

    /// `cuGraphNodeGetType`.
    fn cuGraphNodeGetType(hNode: d::CUgraphNode, type_: *mut d::CUgraphNodeType) {
        ready()?;
        // SAFETY: forwarded contract (the types are the runtime's).
        Ok(unsafe { cg::graph_node_get_type(hNode.cast(), type_) }?)
    }

    /// `cuGraphNodeGetDependencies_v2`.
    fn cuGraphNodeGetDependencies_v2(hNode: d::CUgraphNode, dependencies: *mut d::CUgraphNode, edgeData: *mut d::CUgraphEdgeData, numDependencies: *mut usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::node_lists(hNode.cast(), 1, dependencies.cast(), edgeData.cast(), numDependencies) }?)
    }

    /// `cuGraphNodeGetDependencies` (no edge data).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphNodeGetDependencies(hNode: d::CUgraphNode, dependencies: *mut d::CUgraphNode, numDependencies: *mut usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::node_lists(hNode.cast(), 1, dependencies.cast(), std::ptr::null_mut(), numDependencies) }?)
    }

    /// `cuGraphNodeGetDependentNodes_v2`.
    fn cuGraphNodeGetDependentNodes_v2(hNode: d::CUgraphNode, dependentNodes: *mut d::CUgraphNode, edgeData: *mut d::CUgraphEdgeData, numDependentNodes: *mut usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::node_lists(hNode.cast(), 2, dependentNodes.cast(), edgeData.cast(), numDependentNodes) }?)
    }

    /// `cuGraphNodeGetDependentNodes` (no edge data).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphNodeGetDependentNodes(hNode: d::CUgraphNode, dependentNodes: *mut d::CUgraphNode, numDependentNodes: *mut usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::node_lists(hNode.cast(), 2, dependentNodes.cast(), std::ptr::null_mut(), numDependentNodes) }?)
    }

    /// `cuGraphAddDependencies_v2` (edge data included).
    fn cuGraphAddDependencies_v2(hGraph: d::CUgraph, from: *const d::CUgraphNode, to: *const d::CUgraphNode, edgeData: *const d::CUgraphEdgeData, numDependencies: usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::change_edges(hGraph.cast(), from.cast(), to.cast(), edgeData.cast(), numDependencies, false) }?)
    }

    /// `cuGraphAddDependencies` (no edge data).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphAddDependencies(hGraph: d::CUgraph, from: *const d::CUgraphNode, to: *const d::CUgraphNode, numDependencies: usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::change_edges(hGraph.cast(), from.cast(), to.cast(), std::ptr::null(), numDependencies, false) }?)
    }

    /// `cuGraphRemoveDependencies_v2` (edge data included).
    fn cuGraphRemoveDependencies_v2(hGraph: d::CUgraph, from: *const d::CUgraphNode, to: *const d::CUgraphNode, edgeData: *const d::CUgraphEdgeData, numDependencies: usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::change_edges(hGraph.cast(), from.cast(), to.cast(), edgeData.cast(), numDependencies, true) }?)
    }

    /// `cuGraphRemoveDependencies` (no edge data).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphRemoveDependencies(hGraph: d::CUgraph, from: *const d::CUgraphNode, to: *const d::CUgraphNode, numDependencies: usize) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::change_edges(hGraph.cast(), from.cast(), to.cast(), std::ptr::null(), numDependencies, true) }?)
    }

    /// `cuGraphDestroyNode`.
    fn cuGraphDestroyNode(hNode: d::CUgraphNode) {
        // Like NVIDIA's driver, this needs no current context.
        initialized()?;
        // SAFETY: a handle only.
        Ok(unsafe { cg::graph_destroy_node(hNode.cast()) }?)
    }

    /// `cuGraphNodeFindInClone`.
    fn cuGraphNodeFindInClone(phNode: *mut d::CUgraphNode, hOriginalNode: d::CUgraphNode, hClonedGraph: d::CUgraph) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_node_find_in_clone(phNode.cast(), hOriginalNode.cast(), hClonedGraph.cast()) }?)
    }

    /// `cuGraphInstantiateWithFlags`.
    fn cuGraphInstantiateWithFlags(phGraphExec: *mut d::CUgraphExec, hGraph: d::CUgraph, flags: c_ulonglong) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::instantiate(phGraphExec.cast(), hGraph.cast(), flags, std::ptr::null_mut()) }?)
    }

    /// `cuGraphInstantiate` (CUDA 10: error node and log buffer, no flags).
    #[no_prototype = "cuda.h maps it to cuGraphInstantiateWithFlags"]
    fn cuGraphInstantiate(
        phGraphExec: *mut d::CUgraphExec,
        hGraph: d::CUgraph,
        phErrorNode: *mut d::CUgraphNode,
        logBuffer: *mut c_char,
        bufferSize: usize
    ) {
        ready()?;
        // SAFETY: forwarded contract.
        let r = unsafe { cg::instantiate(phGraphExec.cast(), hGraph.cast(), 0, std::ptr::null_mut()) };
        // SAFETY: each is null or writable (API contract).
        unsafe {
            if !phErrorNode.is_null() {
                phErrorNode.write(std::ptr::null_mut());
            }
            if !logBuffer.is_null() && bufferSize > 0 {
                logBuffer.write(0);
            }
        }
        Ok(r?)
    }

    /// `cuGraphInstantiateWithParams`: flags and upload stream; the result is written back.
    #[per_thread(cuGraphInstantiateWithParams_ptsz)]
    fn cuGraphInstantiateWithParams(phGraphExec: *mut d::CUgraphExec, hGraph: d::CUgraph, instantiateParams: *mut d::CUDA_GRAPH_INSTANTIATE_PARAMS) {
        ready()?;
        // SAFETY: forwarded contract; the same record as the runtime's.
        Ok(unsafe { cg::graph_instantiate_with_params(phGraphExec.cast(), hGraph.cast(), instantiateParams.cast()) }?)
    }

    /// `cuGraphExecGetFlags`.
    fn cuGraphExecGetFlags(hGraphExec: d::CUgraphExec, flags: *mut d::cuuint64_t) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_exec_get_flags(hGraphExec.cast(), flags.cast()) }?)
    }

    /// `cuGraphLaunch`: fire-and-forget, in stream order, like a kernel launch.
    #[per_thread(cuGraphLaunch_ptsz)]
    fn cuGraphLaunch(hGraphExec: d::CUgraphExec, hStream: d::CUstream) {
        ready()?;
        Ok(cg::graph_launch(hGraphExec.cast(), hStream.cast(), false)?)
    }

    /// `cuGraphUpload`.
    #[per_thread(cuGraphUpload_ptsz)]
    fn cuGraphUpload(hGraphExec: d::CUgraphExec, hStream: d::CUstream) {
        ready()?;
        Ok(cg::graph_launch(hGraphExec.cast(), hStream.cast(), true)?)
    }

    /// `cuGraphExecDestroy`.
    fn cuGraphExecDestroy(hGraphExec: d::CUgraphExec) {
        initialized()?;
        // SAFETY: a handle only.
        Ok(unsafe { cg::graph_exec_destroy(hGraphExec.cast()) }?)
    }

    /// `cuGraphExecUpdate_v2`: the driver's verdict, with the node that failed.
    fn cuGraphExecUpdate_v2(hGraphExec: d::CUgraphExec, hGraph: d::CUgraph, resultInfo: *mut d::CUgraphExecUpdateResultInfo) {
        ready()?;
        // SAFETY: forwarded contract; the same record as the runtime's.
        Ok(unsafe { cg::graph_exec_update(hGraphExec.cast(), hGraph.cast(), resultInfo.cast()) }?)
    }

    /// `cuGraphExecUpdate` (CUDA 10.2-11: error node and result apart).
    #[no_prototype = "cuda.h maps it to _v2"]
    fn cuGraphExecUpdate(
        hGraphExec: d::CUgraphExec,
        hGraph: d::CUgraph,
        hErrorNode_out: *mut d::CUgraphNode,
        updateResult_out: *mut d::CUgraphExecUpdateResult
    ) {
        ready()?;
        if hErrorNode_out.is_null() || updateResult_out.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let mut info = cu::cudaGraphExecUpdateResultInfo::default();
        // SAFETY: a local record; the handles forwarded.
        let r = unsafe { cg::graph_exec_update(hGraphExec.cast(), hGraph.cast(), &raw mut info) };
        // SAFETY: non-null and writable (API contract).
        unsafe {
            hErrorNode_out.write(info.errorNode.cast());
            updateResult_out.write(info.result);
        }
        Ok(r?)
    }

    /// `cuGraphNodeSetEnabled`.
    fn cuGraphNodeSetEnabled(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, isEnabled: c_uint) {
        ready()?;
        // SAFETY: handles only.
        Ok(unsafe { cg::graph_node_set_enabled(hGraphExec.cast(), hNode.cast(), isEnabled) }?)
    }

    /// `cuGraphNodeGetEnabled`.
    fn cuGraphNodeGetEnabled(hGraphExec: d::CUgraphExec, hNode: d::CUgraphNode, isEnabled: *mut c_uint) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_node_get_enabled(hGraphExec.cast(), hNode.cast(), isEnabled) }?)
    }

    /// `cuGraphDebugDotPrint`: the driver's DOT text, written to `path` here in the guest.
    fn cuGraphDebugDotPrint(hGraph: d::CUgraph, path: *const c_char, flags: c_uint) {
        ready()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { cg::graph_debug_dot_print(hGraph.cast(), path, flags) }?)
    }
}

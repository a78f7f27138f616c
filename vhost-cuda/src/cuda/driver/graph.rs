//! The driver calls for CUDA graphs and stream capture, as a trait of their own
//! ([`GraphDriverApi`], a supertrait of `DriverApi`), with the real implementation over cudarc's
//! `sys` layer and the no-driver one. The handle contract of `driver/mod.rs` holds here too: graphs,
//! nodes and executable graphs cross as [`Raw`] integers that only the session's tables hold.

use std::{
    ffi::{c_uint, c_void},
    io::Read,
    ptr::{null, null_mut},
};

use cudarc::driver::sys;
use qcuda_proto::graph::{EdgeData, MemcpyNode, MemsetNode};

use super::{
    error::{CuError, CuResult},
    handles::{driver_handles, Context, Event, Function, Raw, Stream},
    library::{CudaDriver, NoDriver},
};
use crate::cuda::launch::{LaunchConfig, ParamLayout};

/// Parameters of a node other than a kernel node, already checked by the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeParams {
    /// An empty node.
    Empty,
    /// A copy between device addresses (unified addressing).
    Memcpy(MemcpyNode),
    /// A memset.
    Memset(MemsetNode),
    /// A child graph (the driver clones it).
    Child(Graph),
    /// An event record node.
    EventRecord(Event),
    /// An event wait node.
    EventWait(Event),
    /// A host node: the worker's host-function stand-in with this user data (a call of
    /// `host_functions.rs`, alive until the session ends).
    Host(Raw),
}

/// The driver's parameters of a host node running the worker's stand-in with `call`.
fn host_params(call: Raw) -> sys::CUDA_HOST_NODE_PARAMS {
    sys::CUDA_HOST_NODE_PARAMS {
        fn_: Some(crate::cuda::host_functions::trampoline),
        userData: call as *mut c_void,
    }
}

/// What `cuStreamGetCaptureInfo` says about a stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CaptureInfo {
    /// `CUstreamCaptureStatus`: 0 none, 1 active, 2 invalidated.
    pub(crate) status: u32,
    /// The capture's id (0 when none).
    pub(crate) id: u64,
    /// The graph being captured (None when none).
    pub(crate) graph: Option<Graph>,
    /// The nodes the next captured op will depend on.
    pub(crate) deps: Vec<GraphNode>,
    /// The edge data of each of `deps`.
    pub(crate) edges: Vec<EdgeData>,
}

driver_handles! {
    /// A `CUgraph`.
    Graph;
    /// A `CUgraphExec`.
    GraphExec;
    /// A `CUgraphNode`.
    GraphNode;
}

/// The graph and capture calls the executor makes.
pub(crate) trait GraphDriverApi {
    /// cuThreadExchangeStreamCaptureMode: sets the calling thread's mode, returns the old one.
    fn exchange_capture_mode(&self, mode: u32) -> CuResult<u32>;
    /// cuStreamBeginCapture with `mode` (0 global, 1 thread-local, 2 relaxed).
    fn stream_begin_capture(&self, stream: Stream, mode: u32) -> CuResult<()>;
    /// cuStreamBeginCaptureToGraph after `deps` with their `edges` (empty: default edges;
    /// else one per dependency, as for every `edges` below).
    fn stream_begin_capture_to_graph(
        &self,
        stream: Stream,
        graph: Graph,
        deps: &[GraphNode],
        edges: &[EdgeData],
        mode: u32,
    ) -> CuResult<()>;
    /// cuStreamEndCapture: the captured graph.
    fn stream_end_capture(&self, stream: Stream) -> CuResult<Graph>;
    /// cuStreamGetCaptureInfo, with the dependencies' edge data.
    fn stream_capture_info(&self, stream: Stream) -> CuResult<CaptureInfo>;
    /// cuStreamUpdateCaptureDependencies (flags: 0 add, 1 set).
    fn stream_update_capture_deps(
        &self,
        stream: Stream,
        deps: &[GraphNode],
        edges: &[EdgeData],
        flags: u32,
    ) -> CuResult<()>;

    /// cuGraphCreate.
    fn graph_create(&self) -> CuResult<Graph>;
    /// cuGraphDestroy.
    fn graph_destroy(&self, graph: Graph) -> CuResult<()>;
    /// cuGraphClone.
    fn graph_clone(&self, graph: Graph) -> CuResult<Graph>;
    /// Adds a node of `params` to `graph` after `deps`. `ctx` is the context memcpy and memset
    /// nodes run in.
    fn graph_add_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        params: &NodeParams,
        ctx: Context,
    ) -> CuResult<GraphNode>;
    /// cuGraphAddKernelNode.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each readable for its size (the driver
    /// copies the values before returning).
    unsafe fn graph_add_kernel_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        func: Function,
        cfg: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> CuResult<GraphNode>;
    /// cuGraphAddMemAllocNode: `bytesize` bytes of pinned device memory on CUdevice `device`;
    /// (node, its device address).
    fn graph_add_mem_alloc_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        device: i32,
        bytesize: usize,
    ) -> CuResult<(GraphNode, u64)>;
    /// cuGraphAddMemFreeNode.
    fn graph_add_mem_free_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        dptr: u64,
    ) -> CuResult<GraphNode>;
    /// Sets the parameters of a memcpy, memset, child-graph or event node: of the node in its
    /// graph (`exec` None), or in executable graph `exec`.
    fn node_set_params(
        &self,
        exec: Option<GraphExec>,
        node: GraphNode,
        params: &NodeParams,
        ctx: Option<Context>,
    ) -> CuResult<()>;
    /// cuGraph[Exec]KernelNodeSetParams (`exec` None: the graph's node).
    ///
    /// # Safety
    /// As for [`GraphDriverApi::graph_add_kernel_node`].
    unsafe fn kernel_node_set_params(
        &self,
        exec: Option<GraphExec>,
        node: GraphNode,
        func: Function,
        cfg: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> CuResult<()>;
    /// cuGraphGetNodes, or cuGraphGetRootNodes.
    fn graph_nodes(&self, graph: Graph, roots: bool) -> CuResult<Vec<GraphNode>>;
    /// cuGraphGetEdges: (from, to, edge data).
    fn graph_edges(&self, graph: Graph) -> CuResult<Vec<(GraphNode, GraphNode, EdgeData)>>;
    /// cuGraphAddDependencies, or cuGraphRemoveDependencies.
    fn graph_change_edges(
        &self,
        graph: Graph,
        from: &[GraphNode],
        to: &[GraphNode],
        edges: &[EdgeData],
        remove: bool,
    ) -> CuResult<()>;
    /// cuGraphNodeGetType.
    fn node_type(&self, node: GraphNode) -> CuResult<u32>;
    /// cuGraphNodeGetDependencies, or cuGraphNodeGetDependentNodes, with each edge's data.
    fn node_neighbours(
        &self,
        node: GraphNode,
        dependents: bool,
    ) -> CuResult<Vec<(GraphNode, EdgeData)>>;
    /// cuGraphInstantiateWithFlags.
    fn graph_instantiate(&self, graph: Graph, flags: u64) -> CuResult<GraphExec>;
    /// cuGraphExecDestroy.
    fn graph_exec_destroy(&self, exec: GraphExec) -> CuResult<()>;
    /// cuGraphLaunch, or cuGraphUpload.
    fn graph_launch(&self, exec: GraphExec, stream: Stream, upload_only: bool) -> CuResult<()>;
    /// cuGraphExecUpdate: Ok((result, error node)) when the driver judged the update, whether
    /// it applied or not (then the result says why).
    fn graph_exec_update(
        &self,
        exec: GraphExec,
        graph: Graph,
    ) -> CuResult<(u32, Option<GraphNode>)>;
    /// cuGraphDebugDotPrint, the text it writes.
    fn graph_debug_dot(&self, graph: Graph, flags: u32) -> CuResult<Vec<u8>>;
    /// cuGraphKernelNodeGetParams: the function, its geometry, and its parameter block laid
    /// out by `layout_of(function)` (`None`: not a function of the caller's).
    fn kernel_node_params(
        &self,
        node: GraphNode,
        layout_of: &dyn Fn(Function) -> Option<ParamLayout>,
    ) -> CuResult<(Function, LaunchConfig, Vec<u8>)>;
    /// cuDeviceGraphMemTrim (`what` 0), cuDeviceGetGraphMemAttribute (1) or
    /// cuDeviceSetGraphMemAttribute (2) of attribute `attr` (0..=3) on CUdevice `device`.
    fn graph_mem(&self, device: i32, what: u32, attr: u32, value: u64) -> CuResult<u64>;
    /// cuGraphConditionalHandleCreate on `graph` in `ctx`: the handle's value.
    fn conditional_handle_create(
        &self,
        graph: Graph,
        ctx: Context,
        default_value: u32,
        flags: u32,
    ) -> CuResult<u64>;
    /// cuGraphAddNode_v2 of a conditional node (`kind`: 0 if, 1 while, 2 switch) with `size`
    /// bodies on `handle`: the node, and the body graphs the driver made (owned by the node).
    fn graph_add_conditional_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        handle: u64,
        kind: u32,
        size: u32,
        ctx: Context,
    ) -> CuResult<(GraphNode, Vec<Graph>)>;
    /// cuGraphMemAllocNodeGetParams: (device address, size in bytes).
    fn mem_alloc_node_params(&self, node: GraphNode) -> CuResult<(u64, u64)>;
    /// cuGraphMemFreeNodeGetParams: the device address the node frees.
    fn mem_free_node_params(&self, node: GraphNode) -> CuResult<u64>;
    /// cuGraphMemcpyNodeGetParams, for a copy between device addresses.
    fn memcpy_node_params(&self, node: GraphNode) -> CuResult<MemcpyNode>;
    /// cuGraphMemsetNodeGetParams.
    fn memset_node_params(&self, node: GraphNode) -> CuResult<MemsetNode>;
    /// The event of an event record (`record`) or wait node.
    fn node_event(&self, node: GraphNode, record: bool) -> CuResult<Event>;
    /// cuGraphChildGraphNodeGetGraph.
    fn child_graph(&self, node: GraphNode) -> CuResult<Graph>;
    /// cuGraphNodeFindInClone.
    fn find_in_clone(&self, node: GraphNode, clone: Graph) -> CuResult<GraphNode>;
    /// cuGraphDestroyNode.
    fn destroy_node(&self, node: GraphNode) -> CuResult<()>;
    /// cuGraphNodeGetEnabled, or cuGraphNodeSetEnabled (`set`: the new value).
    fn node_enabled(&self, exec: GraphExec, node: GraphNode, set: Option<bool>) -> CuResult<bool>;
    /// cuGraphHostNodeGetParams: the user data of a host node (the worker's stand-in's call;
    /// the caller checks that it is one of its own).
    fn host_node_call(&self, node: GraphNode) -> CuResult<Raw>;
}

/// Every driver symbol this file calls; `CudaDriver::load` checks them with `driver/mod.rs`'s.
pub(crate) const GRAPH_SYMBOLS: &[&str] = &[
    "cuThreadExchangeStreamCaptureMode",
    "cuStreamBeginCapture_v2",
    "cuStreamBeginCaptureToGraph",
    "cuStreamEndCapture",
    "cuStreamGetCaptureInfo_v3",
    "cuStreamUpdateCaptureDependencies_v2",
    "cuGraphCreate",
    "cuGraphDestroy",
    "cuGraphClone",
    "cuGraphAddEmptyNode",
    "cuGraphAddMemcpyNode",
    "cuGraphAddMemsetNode",
    "cuGraphAddChildGraphNode",
    "cuGraphAddEventRecordNode",
    "cuGraphAddEventWaitNode",
    "cuGraphAddHostNode",
    "cuGraphHostNodeSetParams",
    "cuGraphExecHostNodeSetParams",
    "cuGraphAddKernelNode_v2",
    "cuGraphAddMemAllocNode",
    "cuGraphAddMemFreeNode",
    "cuGraphMemcpyNodeSetParams",
    "cuGraphMemsetNodeSetParams",
    "cuGraphEventRecordNodeSetEvent",
    "cuGraphEventWaitNodeSetEvent",
    "cuGraphExecMemcpyNodeSetParams",
    "cuGraphExecMemsetNodeSetParams",
    "cuGraphExecChildGraphNodeSetParams",
    "cuGraphExecEventRecordNodeSetEvent",
    "cuGraphExecEventWaitNodeSetEvent",
    "cuGraphKernelNodeSetParams_v2",
    "cuGraphExecKernelNodeSetParams_v2",
    "cuGraphGetNodes",
    "cuGraphGetRootNodes",
    "cuGraphGetEdges_v2",
    "cuGraphAddDependencies_v2",
    "cuGraphRemoveDependencies_v2",
    "cuGraphNodeGetType",
    "cuGraphNodeGetDependencies_v2",
    "cuGraphNodeGetDependentNodes_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphExecDestroy",
    "cuGraphLaunch",
    "cuGraphUpload",
    "cuGraphExecUpdate_v2",
    "cuGraphDebugDotPrint",
    "cuGraphNodeGetEnabled",
    "cuGraphEventRecordNodeGetEvent",
    "cuGraphEventWaitNodeGetEvent",
    "cuGraphChildGraphNodeGetGraph",
    "cuGraphKernelNodeGetParams_v2",
    "cuGraphNodeFindInClone",
    "cuGraphMemcpyNodeGetParams",
    "cuGraphMemsetNodeGetParams",
    "cuDeviceGraphMemTrim",
    "cuDeviceGetGraphMemAttribute",
    "cuDeviceSetGraphMemAttribute",
    "cuGraphDestroyNode",
    "cuGraphNodeSetEnabled",
    "cuGraphConditionalHandleCreate",
    "cuGraphAddNode_v2",
    "cuGraphMemAllocNodeGetParams",
    "cuGraphMemFreeNodeGetParams",
    "cuGraphHostNodeGetParams",
];

/// CUDA_ERROR_OPERATING_SYSTEM.
const OS_ERROR: CuError = CuError(304);

fn check(r: sys::CUresult) -> CuResult<()> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(CuError(e as u32)),
    }
}

fn ptr<T>(raw: Raw) -> *mut T {
    raw as *mut T
}

fn capture_mode(mode: u32) -> CuResult<sys::CUstreamCaptureMode> {
    use sys::CUstreamCaptureMode as M;
    Ok(match mode {
        0 => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        2 => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// `nodes` as the driver's array of `CUgraphNode` (a handle is `repr(transparent)` over the
/// pointer-sized value the driver gave).
fn node_list(nodes: &[GraphNode]) -> *const sys::CUgraphNode {
    if nodes.is_empty() {
        null()
    } else {
        nodes.as_ptr().cast()
    }
}

/// `edges` as the driver's array (empty: none, meaning default edges). The caller checks the
/// length against its node list.
fn edge_array(edges: &[EdgeData]) -> Vec<sys::CUgraphEdgeData> {
    edges
        .iter()
        .map(|e| sys::CUgraphEdgeData {
            from_port: e.from_port,
            to_port: e.to_port,
            type_: e.kind,
            reserved: [0; 5],
        })
        .collect()
}

fn edge_ptr(edges: &[sys::CUgraphEdgeData]) -> *const sys::CUgraphEdgeData {
    if edges.is_empty() {
        null()
    } else {
        edges.as_ptr()
    }
}

fn edge_of(e: &sys::CUgraphEdgeData) -> EdgeData {
    EdgeData {
        from_port: e.from_port,
        to_port: e.to_port,
        kind: e.type_,
    }
}

/// Empty, or one edge per node.
fn check_edges(nodes: usize, edges: &[EdgeData]) -> CuResult<()> {
    if edges.is_empty() || edges.len() == nodes {
        Ok(())
    } else {
        Err(CuError::INVALID_VALUE)
    }
}

/// The driver's 3D copy between two device addresses.
/// A `CUDA_MEMCPY3D` with every field zero except the memory types (unified), which have no
/// zero value: `mem::zeroed` of this struct is undefined behaviour (and panics without
/// unwinding at run time).
fn blank_memcpy3d() -> sys::CUDA_MEMCPY3D {
    sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
        srcHost: null(),
        srcDevice: 0,
        srcArray: null_mut(),
        reserved0: null_mut(),
        srcPitch: 0,
        srcHeight: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
        dstHost: null_mut(),
        dstDevice: 0,
        dstArray: null_mut(),
        reserved1: null_mut(),
        dstPitch: 0,
        dstHeight: 0,
        WidthInBytes: 0,
        Height: 0,
        Depth: 0,
    }
}

fn memcpy3d(m: &MemcpyNode) -> CuResult<sys::CUDA_MEMCPY3D> {
    let u = |v: u64| usize::try_from(v).map_err(|_| CuError::INVALID_VALUE);
    let mut p = blank_memcpy3d();
    p.srcMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED;
    p.srcDevice = m.src;
    p.srcPitch = u(m.src_pitch)?;
    p.srcHeight = u(m.src_rows)?;
    p.dstMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED;
    p.dstDevice = m.dst;
    p.dstPitch = u(m.dst_pitch)?;
    p.dstHeight = u(m.dst_rows)?;
    p.WidthInBytes = u(m.width)?;
    p.Height = u(m.height)?;
    p.Depth = u(m.depth)?;
    Ok(p)
}

fn memset_params(m: &MemsetNode) -> CuResult<sys::CUDA_MEMSET_NODE_PARAMS> {
    let u = |v: u64| usize::try_from(v).map_err(|_| CuError::INVALID_VALUE);
    Ok(sys::CUDA_MEMSET_NODE_PARAMS {
        dst: m.dst,
        pitch: u(m.pitch)?,
        value: m.value,
        elementSize: m.element_size,
        width: u(m.width)?,
        height: u(m.height)?,
    })
}

fn kernel_params(
    func: Raw,
    cfg: &LaunchConfig,
    params: &mut [*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    let p = if params.is_empty() {
        null_mut()
    } else {
        params.as_mut_ptr()
    };
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: ptr(func),
        gridDimX: cfg.grid[0],
        gridDimY: cfg.grid[1],
        gridDimZ: cfg.grid[2],
        blockDimX: cfg.block[0],
        blockDimY: cfg.block[1],
        blockDimZ: cfg.block[2],
        sharedMemBytes: cfg.shared_mem,
        kernelParams: p,
        extra: null_mut(),
        kern: null_mut(),
        ctx: null_mut(),
    }
}

/// Calls a two-step "count, then fill" list query.
fn list(
    mut query: impl FnMut(*mut sys::CUgraphNode, *mut usize) -> sys::CUresult,
) -> CuResult<Vec<GraphNode>> {
    let mut n = 0usize;
    check(query(null_mut(), &raw mut n))?;
    let mut v: Vec<sys::CUgraphNode> = vec![null_mut(); n];
    if n > 0 {
        check(query(v.as_mut_ptr(), &raw mut n))?;
        v.truncate(n);
    }
    Ok(v.into_iter()
        .map(|p| GraphNode::from_raw(p as Raw))
        .collect())
}

// SAFETY (for every unsafe block in this impl): each call goes to a symbol that `load` found
// (GRAPH_SYMBOLS), through cudarc's binding of its CUDA 13.0 prototype; out parameters point at
// live locals; handles obey driver/mod.rs's contract; input arrays are borrowed for the whole call.
impl GraphDriverApi for CudaDriver {
    fn exchange_capture_mode(&self, mode: u32) -> CuResult<u32> {
        let mut m = capture_mode(mode)?;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&raw mut m) })?;
        Ok(m as u32)
    }

    fn stream_begin_capture(&self, stream: Stream, mode: u32) -> CuResult<()> {
        let m = capture_mode(mode)?;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamBeginCapture_v2(ptr(stream.raw()), m) })
    }

    fn stream_begin_capture_to_graph(
        &self,
        stream: Stream,
        graph: Graph,
        deps: &[GraphNode],
        edges: &[EdgeData],
        mode: u32,
    ) -> CuResult<()> {
        let m = capture_mode(mode)?;
        check_edges(deps.len(), edges)?;
        let e = edge_array(edges);
        // SAFETY: see the impl comment; `deps` holds `deps.len()` nodes, `e` as many or none.
        check(unsafe {
            sys::cuStreamBeginCaptureToGraph(
                ptr(stream.raw()),
                ptr(graph.raw()),
                node_list(deps),
                edge_ptr(&e),
                deps.len(),
                m,
            )
        })
    }

    fn stream_end_capture(&self, stream: Stream) -> CuResult<Graph> {
        let mut g: sys::CUgraph = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuStreamEndCapture(ptr(stream.raw()), &raw mut g) })?;
        Ok(Graph::from_raw(g as Raw))
    }

    fn stream_capture_info(&self, stream: Stream) -> CuResult<CaptureInfo> {
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: u64 = 0;
        let mut graph: sys::CUgraph = null_mut();
        let mut deps: *const sys::CUgraphNode = null();
        let mut edges: *const sys::CUgraphEdgeData = null();
        let mut n = 0usize;
        // SAFETY: see the impl comment; the driver's dependency and edge arrays stay valid
        // until the next call on the stream, and are copied out at once. Asking for the edge
        // data keeps the query from being lossy (programmatic dependent launches).
        check(unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                ptr(stream.raw()),
                &raw mut st,
                &raw mut id,
                &raw mut graph,
                &raw mut deps,
                &raw mut edges,
                &raw mut n,
            )
        })?;
        let (deps, edges) = if deps.is_null() || n == 0 {
            (Vec::new(), Vec::new())
        } else {
            // SAFETY: the driver returned `n` nodes at `deps`.
            let d = unsafe { std::slice::from_raw_parts(deps, n) }
                .iter()
                .map(|p| GraphNode::from_raw(*p as Raw))
                .collect();
            let e = if edges.is_null() {
                vec![EdgeData::DEFAULT; n]
            } else {
                // SAFETY: and `n` edge data records at `edges`.
                unsafe { std::slice::from_raw_parts(edges, n) }
                    .iter()
                    .map(edge_of)
                    .collect()
            };
            (d, e)
        };
        Ok(CaptureInfo {
            status: st as u32,
            id,
            graph: (!graph.is_null()).then(|| Graph::from_raw(graph as Raw)),
            deps,
            edges,
        })
    }

    fn stream_update_capture_deps(
        &self,
        stream: Stream,
        deps: &[GraphNode],
        edges: &[EdgeData],
        flags: u32,
    ) -> CuResult<()> {
        check_edges(deps.len(), edges)?;
        let e = edge_array(edges);
        // SAFETY: see the impl comment; `e` holds as many records as `deps`, or none.
        check(unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(
                ptr(stream.raw()),
                node_list(deps).cast_mut(),
                edge_ptr(&e),
                deps.len(),
                flags,
            )
        })
    }

    fn graph_create(&self) -> CuResult<Graph> {
        let mut g: sys::CUgraph = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphCreate(&raw mut g, 0) })?;
        Ok(Graph::from_raw(g as Raw))
    }

    fn graph_destroy(&self, graph: Graph) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphDestroy(ptr(graph.raw())) })
    }

    fn graph_clone(&self, graph: Graph) -> CuResult<Graph> {
        let mut g: sys::CUgraph = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphClone(&raw mut g, ptr(graph.raw())) })?;
        Ok(Graph::from_raw(g as Raw))
    }

    fn graph_add_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        params: &NodeParams,
        ctx: Context,
    ) -> CuResult<GraphNode> {
        let mut n: sys::CUgraphNode = null_mut();
        let (g, d, nd) = (ptr(graph.raw()), node_list(deps), deps.len());
        // SAFETY: see the impl comment.
        check(unsafe {
            match params {
                NodeParams::Empty => sys::cuGraphAddEmptyNode(&raw mut n, g, d, nd),
                NodeParams::Memcpy(m) => {
                    let p = memcpy3d(m)?;
                    sys::cuGraphAddMemcpyNode(&raw mut n, g, d, nd, &raw const p, ptr(ctx.raw()))
                }
                NodeParams::Memset(m) => {
                    let p = memset_params(m)?;
                    sys::cuGraphAddMemsetNode(&raw mut n, g, d, nd, &raw const p, ptr(ctx.raw()))
                }
                NodeParams::Child(c) => {
                    sys::cuGraphAddChildGraphNode(&raw mut n, g, d, nd, ptr(c.raw()))
                }
                NodeParams::EventRecord(e) => {
                    sys::cuGraphAddEventRecordNode(&raw mut n, g, d, nd, ptr(e.raw()))
                }
                NodeParams::EventWait(e) => {
                    sys::cuGraphAddEventWaitNode(&raw mut n, g, d, nd, ptr(e.raw()))
                }
                NodeParams::Host(call) => {
                    let p = host_params(*call);
                    sys::cuGraphAddHostNode(&raw mut n, g, d, nd, &raw const p)
                }
            }
        })?;
        Ok(GraphNode::from_raw(n as Raw))
    }

    unsafe fn graph_add_kernel_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        func: Function,
        cfg: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> CuResult<GraphNode> {
        let mut n: sys::CUgraphNode = null_mut();
        let p = kernel_params(func.raw(), cfg, params);
        // SAFETY: see the impl comment; the parameter pointers are the caller's contract.
        check(unsafe {
            sys::cuGraphAddKernelNode_v2(
                &raw mut n,
                ptr(graph.raw()),
                node_list(deps),
                deps.len(),
                &raw const p,
            )
        })?;
        Ok(GraphNode::from_raw(n as Raw))
    }

    fn graph_add_mem_alloc_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        device: i32,
        bytesize: usize,
    ) -> CuResult<(GraphNode, u64)> {
        // SAFETY: plain C data; all-zero is the documented default of every field.
        let mut p: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        p.poolProps.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        p.poolProps.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = device;
        p.bytesize = bytesize;
        let mut n: sys::CUgraphNode = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuGraphAddMemAllocNode(
                &raw mut n,
                ptr(graph.raw()),
                node_list(deps),
                deps.len(),
                &raw mut p,
            )
        })?;
        Ok((GraphNode::from_raw(n as Raw), p.dptr))
    }

    fn graph_add_mem_free_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        dptr: u64,
    ) -> CuResult<GraphNode> {
        let mut n: sys::CUgraphNode = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuGraphAddMemFreeNode(
                &raw mut n,
                ptr(graph.raw()),
                node_list(deps),
                deps.len(),
                dptr,
            )
        })?;
        Ok(GraphNode::from_raw(n as Raw))
    }

    fn node_set_params(
        &self,
        exec: Option<GraphExec>,
        node: GraphNode,
        params: &NodeParams,
        ctx: Option<Context>,
    ) -> CuResult<()> {
        let (e, n) = (ptr(exec.map_or(0, GraphExec::raw)), ptr(node.raw()));
        // SAFETY: see the impl comment.
        check(unsafe {
            match (exec, params) {
                (_, NodeParams::Empty) => return Err(CuError::INVALID_VALUE),
                (None, NodeParams::Memcpy(m)) => sys::cuGraphMemcpyNodeSetParams(n, &memcpy3d(m)?),
                (None, NodeParams::Memset(m)) => {
                    sys::cuGraphMemsetNodeSetParams(n, &memset_params(m)?)
                }
                (None, NodeParams::EventRecord(ev)) => {
                    sys::cuGraphEventRecordNodeSetEvent(n, ptr(ev.raw()))
                }
                (None, NodeParams::EventWait(ev)) => {
                    sys::cuGraphEventWaitNodeSetEvent(n, ptr(ev.raw()))
                }
                // A child graph node's graph cannot be replaced in the graph itself.
                (None, NodeParams::Child(_)) => return Err(CuError::INVALID_VALUE),
                (_, NodeParams::Memcpy(m)) => sys::cuGraphExecMemcpyNodeSetParams(
                    e,
                    n,
                    &memcpy3d(m)?,
                    ptr(ctx.map_or(0, Context::raw)),
                ),
                (_, NodeParams::Memset(m)) => sys::cuGraphExecMemsetNodeSetParams(
                    e,
                    n,
                    &memset_params(m)?,
                    ptr(ctx.map_or(0, Context::raw)),
                ),
                (_, NodeParams::Child(c)) => {
                    sys::cuGraphExecChildGraphNodeSetParams(e, n, ptr(c.raw()))
                }
                (_, NodeParams::EventRecord(ev)) => {
                    sys::cuGraphExecEventRecordNodeSetEvent(e, n, ptr(ev.raw()))
                }
                (_, NodeParams::EventWait(ev)) => {
                    sys::cuGraphExecEventWaitNodeSetEvent(e, n, ptr(ev.raw()))
                }
                (None, NodeParams::Host(call)) => {
                    sys::cuGraphHostNodeSetParams(n, &host_params(*call))
                }
                (_, NodeParams::Host(call)) => {
                    sys::cuGraphExecHostNodeSetParams(e, n, &host_params(*call))
                }
            }
        })
    }

    unsafe fn kernel_node_set_params(
        &self,
        exec: Option<GraphExec>,
        node: GraphNode,
        func: Function,
        cfg: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> CuResult<()> {
        let p = kernel_params(func.raw(), cfg, params);
        // SAFETY: see the impl comment; the parameter pointers are the caller's contract.
        check(unsafe {
            match exec {
                None => sys::cuGraphKernelNodeSetParams_v2(ptr(node.raw()), &raw const p),
                Some(exec) => sys::cuGraphExecKernelNodeSetParams_v2(
                    ptr(exec.raw()),
                    ptr(node.raw()),
                    &raw const p,
                ),
            }
        })
    }

    fn graph_nodes(&self, graph: Graph, roots: bool) -> CuResult<Vec<GraphNode>> {
        let g = ptr(graph.raw());
        list(|out, n| {
            // SAFETY: see the impl comment; `out` is null or holds `*n` slots.
            unsafe {
                if roots {
                    sys::cuGraphGetRootNodes(g, out, n)
                } else {
                    sys::cuGraphGetNodes(g, out, n)
                }
            }
        })
    }

    fn graph_edges(&self, graph: Graph) -> CuResult<Vec<(GraphNode, GraphNode, EdgeData)>> {
        let g = ptr(graph.raw());
        let mut n = 0usize;
        // SAFETY: see the impl comment (a count query).
        check(unsafe {
            sys::cuGraphGetEdges_v2(g, null_mut(), null_mut(), null_mut(), &raw mut n)
        })?;
        let mut from: Vec<sys::CUgraphNode> = vec![null_mut(); n];
        let mut to: Vec<sys::CUgraphNode> = vec![null_mut(); n];
        let mut data = edge_array(&vec![EdgeData::DEFAULT; n]);
        if n > 0 {
            // SAFETY: the three arrays hold `n` slots.
            check(unsafe {
                sys::cuGraphGetEdges_v2(
                    g,
                    from.as_mut_ptr(),
                    to.as_mut_ptr(),
                    data.as_mut_ptr(),
                    &raw mut n,
                )
            })?;
        }
        Ok(from
            .into_iter()
            .zip(to)
            .zip(data)
            .take(n)
            .map(|((a, b), e)| {
                (
                    GraphNode::from_raw(a as Raw),
                    GraphNode::from_raw(b as Raw),
                    edge_of(&e),
                )
            })
            .collect())
    }

    fn graph_change_edges(
        &self,
        graph: Graph,
        from: &[GraphNode],
        to: &[GraphNode],
        edges: &[EdgeData],
        remove: bool,
    ) -> CuResult<()> {
        if from.len() != to.len() {
            return Err(CuError::INVALID_VALUE);
        }
        check_edges(from.len(), edges)?;
        let e = edge_array(edges);
        let (g, f, t, n) = (ptr(graph.raw()), node_list(from), node_list(to), from.len());
        // SAFETY: see the impl comment; both arrays hold `n` nodes, `e` as many or none.
        check(unsafe {
            if remove {
                sys::cuGraphRemoveDependencies_v2(g, f, t, edge_ptr(&e), n)
            } else {
                sys::cuGraphAddDependencies_v2(g, f, t, edge_ptr(&e), n)
            }
        })
    }

    fn node_type(&self, node: GraphNode) -> CuResult<u32> {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphNodeGetType(ptr(node.raw()), &raw mut t) })?;
        Ok(t as u32)
    }

    fn node_neighbours(
        &self,
        node: GraphNode,
        dependents: bool,
    ) -> CuResult<Vec<(GraphNode, EdgeData)>> {
        let n0 = ptr(node.raw());
        let query = |out: *mut sys::CUgraphNode, data: *mut sys::CUgraphEdgeData, n: *mut usize| {
            // SAFETY: see the impl comment; `out` and `data` are null or hold `*n` slots.
            unsafe {
                if dependents {
                    sys::cuGraphNodeGetDependentNodes_v2(n0, out, data, n)
                } else {
                    sys::cuGraphNodeGetDependencies_v2(n0, out, data, n)
                }
            }
        };
        let mut n = 0usize;
        check(query(null_mut(), null_mut(), &raw mut n))?;
        let mut nodes: Vec<sys::CUgraphNode> = vec![null_mut(); n];
        let mut data = edge_array(&vec![EdgeData::DEFAULT; n]);
        if n > 0 {
            check(query(nodes.as_mut_ptr(), data.as_mut_ptr(), &raw mut n))?;
        }
        Ok(nodes
            .into_iter()
            .zip(data)
            .take(n)
            .map(|(p, e)| (GraphNode::from_raw(p as Raw), edge_of(&e)))
            .collect())
    }

    fn graph_instantiate(&self, graph: Graph, flags: u64) -> CuResult<GraphExec> {
        let mut e: sys::CUgraphExec = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphInstantiateWithFlags(&raw mut e, ptr(graph.raw()), flags) })?;
        Ok(GraphExec::from_raw(e as Raw))
    }

    fn graph_exec_destroy(&self, exec: GraphExec) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphExecDestroy(ptr(exec.raw())) })
    }

    fn graph_launch(&self, exec: GraphExec, stream: Stream, upload_only: bool) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe {
            if upload_only {
                sys::cuGraphUpload(ptr(exec.raw()), ptr(stream.raw()))
            } else {
                sys::cuGraphLaunch(ptr(exec.raw()), ptr(stream.raw()))
            }
        })
    }

    fn graph_exec_update(
        &self,
        exec: GraphExec,
        graph: Graph,
    ) -> CuResult<(u32, Option<GraphNode>)> {
        // SAFETY: plain C data; zero is "success, no node".
        let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
        // SAFETY: see the impl comment.
        let r =
            unsafe { sys::cuGraphExecUpdate_v2(ptr(exec.raw()), ptr(graph.raw()), &raw mut info) };
        match r {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => {
                let node =
                    (!info.errorNode.is_null()).then(|| GraphNode::from_raw(info.errorNode as Raw));
                Ok((info.result as u32, node))
            }
            e => Err(CuError(e as u32)),
        }
    }

    fn graph_debug_dot(&self, graph: Graph, flags: u32) -> CuResult<Vec<u8>> {
        // The driver writes to a path: an anonymous memory file of this process.
        // SAFETY: a plain syscall with a static NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"qcuda-graph-dot".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(OS_ERROR);
        }
        // SAFETY: `fd` was just created and is owned here alone.
        let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).map_err(|_| OS_ERROR)?;
        // SAFETY: see the impl comment; `path` is NUL-terminated and lives across the call.
        check(unsafe {
            sys::cuGraphDebugDotPrint(ptr(graph.raw()), path.as_ptr(), flags as c_uint)
        })?;
        let mut text = Vec::new();
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).map_err(|_| OS_ERROR)?;
        file.read_to_end(&mut text).map_err(|_| OS_ERROR)?;
        Ok(text)
    }

    fn kernel_node_params(
        &self,
        node: GraphNode,
        layout_of: &dyn Fn(Function) -> Option<ParamLayout>,
    ) -> CuResult<(Function, LaunchConfig, Vec<u8>)> {
        // SAFETY: plain C data; the driver fills it in.
        let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphKernelNodeGetParams_v2(ptr(node.raw()), &raw mut p) })?;
        let func = p.func as Raw;
        let layout = layout_of(Function::from_raw(func)).ok_or(CuError::INVALID_VALUE)?;
        let cfg = LaunchConfig {
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared_mem: p.sharedMemBytes,
        };
        let mut block = vec![0u8; layout.block_len()];
        if !layout.params().is_empty() {
            if p.kernelParams.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            for (i, info) in layout.params().iter().enumerate() {
                // SAFETY: the driver returns one pointer per parameter of this function (whose
                // layout this is), each readable for the parameter's size, valid until the
                // node's parameters change (not before this call returns).
                let src = unsafe { *p.kernelParams.add(i) };
                if src.is_null() {
                    return Err(CuError::INVALID_VALUE);
                }
                let at = info.offset as usize;
                let dst = &mut block[at..at + info.size as usize];
                // SAFETY: as above; `dst` is our own buffer, no overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst.as_mut_ptr(), dst.len());
                };
            }
        }
        Ok((Function::from_raw(func), cfg, block))
    }

    fn graph_mem(&self, device: i32, what: u32, attr: u32, value: u64) -> CuResult<u64> {
        use sys::CUgraphMem_attribute as A;
        let a = match attr {
            0 => A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
            1 => A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            2 => A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
            3 => A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
            _ => return Err(CuError::INVALID_VALUE),
        };
        let mut v: u64 = value;
        // SAFETY: see the impl comment; every attribute is a cuuint64_t at `v`.
        check(unsafe {
            match what {
                0 => sys::cuDeviceGraphMemTrim(device),
                1 => sys::cuDeviceGetGraphMemAttribute(device, a, (&raw mut v).cast()),
                2 => sys::cuDeviceSetGraphMemAttribute(device, a, (&raw mut v).cast()),
                _ => return Err(CuError::INVALID_VALUE),
            }
        })?;
        Ok(v)
    }

    fn conditional_handle_create(
        &self,
        graph: Graph,
        ctx: Context,
        default_value: u32,
        flags: u32,
    ) -> CuResult<u64> {
        let mut h: sys::CUgraphConditionalHandle = 0;
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuGraphConditionalHandleCreate(
                &raw mut h,
                ptr(graph.raw()),
                ptr(ctx.raw()),
                default_value,
                flags,
            )
        })?;
        Ok(h)
    }

    fn graph_add_conditional_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        handle: u64,
        kind: u32,
        size: u32,
        ctx: Context,
    ) -> CuResult<(GraphNode, Vec<Graph>)> {
        use sys::CUgraphConditionalNodeType as K;
        let kind = match kind {
            0 => K::CU_GRAPH_COND_TYPE_IF,
            1 => K::CU_GRAPH_COND_TYPE_WHILE,
            2 => K::CU_GRAPH_COND_TYPE_SWITCH,
            _ => return Err(CuError::INVALID_VALUE),
        };
        // The driver checks the union's unused bytes and the reserved fields: all zero, as a C
        // caller's `= {}` leaves them (a Rust union literal would leave them undefined).
        // SAFETY: CUgraphNodeParams is plain C data; all zero is a valid value of every field.
        let mut p: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        p.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
            handle,
            type_: kind,
            size,
            // The driver points this at its own array of the body graphs.
            phGraph_out: null_mut(),
            ctx: ptr(ctx.raw()),
        };
        let mut n: sys::CUgraphNode = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuGraphAddNode_v2(
                &raw mut n,
                ptr(graph.raw()),
                node_list(deps),
                null(),
                deps.len(),
                &raw mut p,
            )
        })?;
        // SAFETY: the member this call filled in.
        let out = unsafe { p.__bindgen_anon_1.conditional.phGraph_out };
        if out.is_null() {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: the driver's array of `size` body graphs, valid while the node lives.
        let bodies = unsafe { std::slice::from_raw_parts(out, size as usize) };
        Ok((
            GraphNode::from_raw(n as Raw),
            bodies.iter().map(|g| Graph::from_raw(*g as Raw)).collect(),
        ))
    }

    fn mem_alloc_node_params(&self, node: GraphNode) -> CuResult<(u64, u64)> {
        let mut p = std::mem::MaybeUninit::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>::zeroed();
        // SAFETY: see the impl comment; the driver fills the record.
        check(unsafe { sys::cuGraphMemAllocNodeGetParams(ptr(node.raw()), p.as_mut_ptr()) })?;
        let p = p.as_ptr();
        // SAFETY: plain integer fields of the record the driver filled (nothing else is read,
        // so no enum field's value is relied on).
        Ok(unsafe { ((*p).dptr, (*p).bytesize as u64) })
    }

    fn mem_free_node_params(&self, node: GraphNode) -> CuResult<u64> {
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphMemFreeNodeGetParams(ptr(node.raw()), &raw mut d) })?;
        Ok(d)
    }

    fn memcpy_node_params(&self, node: GraphNode) -> CuResult<MemcpyNode> {
        let mut p = blank_memcpy3d();
        // SAFETY: see the impl comment; the driver fills the struct in.
        check(unsafe { sys::cuGraphMemcpyNodeGetParams(ptr(node.raw()), &raw mut p) })?;
        // Only nodes made from device addresses (as qcuda makes them) can be described.
        let device_side = |t: sys::CUmemorytype| {
            matches!(
                t,
                sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED | sys::CUmemorytype::CU_MEMORYTYPE_DEVICE
            )
        };
        if !device_side(p.srcMemoryType) || !device_side(p.dstMemoryType) {
            return Err(CuError::NOT_SUPPORTED);
        }
        let skip = |x: usize, y: usize, z: usize, pitch: usize, rows: usize| {
            (z as u64 * rows as u64 + y as u64) * pitch as u64 + x as u64
        };
        Ok(MemcpyNode {
            dst: p.dstDevice + skip(p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight),
            dst_pitch: p.dstPitch as u64,
            dst_rows: p.dstHeight as u64,
            src: p.srcDevice + skip(p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch, p.srcHeight),
            src_pitch: p.srcPitch as u64,
            src_rows: p.srcHeight as u64,
            width: p.WidthInBytes as u64,
            height: p.Height as u64,
            depth: p.Depth as u64,
        })
    }

    fn memset_node_params(&self, node: GraphNode) -> CuResult<MemsetNode> {
        // SAFETY: plain C data; the driver fills it in.
        let mut p: sys::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphMemsetNodeGetParams(ptr(node.raw()), &raw mut p) })?;
        Ok(MemsetNode {
            dst: p.dst,
            pitch: p.pitch as u64,
            value: p.value,
            element_size: p.elementSize,
            width: p.width as u64,
            height: p.height as u64,
        })
    }

    fn node_event(&self, node: GraphNode, record: bool) -> CuResult<Event> {
        let mut e: sys::CUevent = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe {
            if record {
                sys::cuGraphEventRecordNodeGetEvent(ptr(node.raw()), &raw mut e)
            } else {
                sys::cuGraphEventWaitNodeGetEvent(ptr(node.raw()), &raw mut e)
            }
        })?;
        Ok(Event::from_raw(e as Raw))
    }

    fn child_graph(&self, node: GraphNode) -> CuResult<Graph> {
        let mut g: sys::CUgraph = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphChildGraphNodeGetGraph(ptr(node.raw()), &raw mut g) })?;
        Ok(Graph::from_raw(g as Raw))
    }

    fn find_in_clone(&self, node: GraphNode, clone: Graph) -> CuResult<GraphNode> {
        let mut n: sys::CUgraphNode = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuGraphNodeFindInClone(&raw mut n, ptr(node.raw()), ptr(clone.raw()))
        })?;
        Ok(GraphNode::from_raw(n as Raw))
    }

    fn destroy_node(&self, node: GraphNode) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphDestroyNode(ptr(node.raw())) })
    }

    fn node_enabled(&self, exec: GraphExec, node: GraphNode, set: Option<bool>) -> CuResult<bool> {
        // SAFETY: see the impl comment.
        unsafe {
            match set {
                Some(on) => {
                    check(sys::cuGraphNodeSetEnabled(
                        ptr(exec.raw()),
                        ptr(node.raw()),
                        u32::from(on),
                    ))?;
                    Ok(on)
                }
                None => {
                    let mut v: c_uint = 0;
                    check(sys::cuGraphNodeGetEnabled(
                        ptr(exec.raw()),
                        ptr(node.raw()),
                        &raw mut v,
                    ))?;
                    Ok(v != 0)
                }
            }
        }
    }

    fn host_node_call(&self, node: GraphNode) -> CuResult<Raw> {
        let mut p = sys::CUDA_HOST_NODE_PARAMS {
            fn_: None,
            userData: null_mut(),
        };
        // SAFETY: see the impl comment; the driver fills the record.
        check(unsafe { sys::cuGraphHostNodeGetParams(ptr(node.raw()), &raw mut p) })?;
        if p.fn_.is_none() {
            return Err(CuError::INVALID_VALUE);
        }
        Ok(p.userData as Raw)
    }
}

impl GraphDriverApi for NoDriver {
    fn exchange_capture_mode(&self, _: u32) -> CuResult<u32> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_begin_capture(&self, _: Stream, _: u32) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_begin_capture_to_graph(
        &self,
        _: Stream,
        _: Graph,
        _: &[GraphNode],
        _: &[EdgeData],
        _: u32,
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_end_capture(&self, _: Stream) -> CuResult<Graph> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_capture_info(&self, _: Stream) -> CuResult<CaptureInfo> {
        Err(CuError::NO_DEVICE)
    }
    fn stream_update_capture_deps(
        &self,
        _: Stream,
        _: &[GraphNode],
        _: &[EdgeData],
        _: u32,
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_create(&self) -> CuResult<Graph> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_destroy(&self, _: Graph) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_clone(&self, _: Graph) -> CuResult<Graph> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_add_node(
        &self,
        _: Graph,
        _: &[GraphNode],
        _: &NodeParams,
        _: Context,
    ) -> CuResult<GraphNode> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn graph_add_kernel_node(
        &self,
        _: Graph,
        _: &[GraphNode],
        _: Function,
        _: &LaunchConfig,
        _: &mut [*mut c_void],
    ) -> CuResult<GraphNode> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_add_mem_alloc_node(
        &self,
        _: Graph,
        _: &[GraphNode],
        _: i32,
        _: usize,
    ) -> CuResult<(GraphNode, u64)> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_add_mem_free_node(&self, _: Graph, _: &[GraphNode], _: u64) -> CuResult<GraphNode> {
        Err(CuError::NO_DEVICE)
    }
    fn node_set_params(
        &self,
        _: Option<GraphExec>,
        _: GraphNode,
        _: &NodeParams,
        _: Option<Context>,
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn kernel_node_set_params(
        &self,
        _: Option<GraphExec>,
        _: GraphNode,
        _: Function,
        _: &LaunchConfig,
        _: &mut [*mut c_void],
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_nodes(&self, _: Graph, _: bool) -> CuResult<Vec<GraphNode>> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_edges(&self, _: Graph) -> CuResult<Vec<(GraphNode, GraphNode, EdgeData)>> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_change_edges(
        &self,
        _: Graph,
        _: &[GraphNode],
        _: &[GraphNode],
        _: &[EdgeData],
        _: bool,
    ) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn node_type(&self, _: GraphNode) -> CuResult<u32> {
        Err(CuError::NO_DEVICE)
    }
    fn node_neighbours(&self, _: GraphNode, _: bool) -> CuResult<Vec<(GraphNode, EdgeData)>> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_instantiate(&self, _: Graph, _: u64) -> CuResult<GraphExec> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_exec_destroy(&self, _: GraphExec) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_launch(&self, _: GraphExec, _: Stream, _: bool) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_exec_update(&self, _: GraphExec, _: Graph) -> CuResult<(u32, Option<GraphNode>)> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_debug_dot(&self, _: Graph, _: u32) -> CuResult<Vec<u8>> {
        Err(CuError::NO_DEVICE)
    }
    fn kernel_node_params(
        &self,
        _: GraphNode,
        _: &dyn Fn(Function) -> Option<ParamLayout>,
    ) -> CuResult<(Function, LaunchConfig, Vec<u8>)> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_mem(&self, _: i32, _: u32, _: u32, _: u64) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn conditional_handle_create(&self, _: Graph, _: Context, _: u32, _: u32) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn graph_add_conditional_node(
        &self,
        _: Graph,
        _: &[GraphNode],
        _: u64,
        _: u32,
        _: u32,
        _: Context,
    ) -> CuResult<(GraphNode, Vec<Graph>)> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_alloc_node_params(&self, _: GraphNode) -> CuResult<(u64, u64)> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_free_node_params(&self, _: GraphNode) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn memcpy_node_params(&self, _: GraphNode) -> CuResult<MemcpyNode> {
        Err(CuError::NO_DEVICE)
    }
    fn memset_node_params(&self, _: GraphNode) -> CuResult<MemsetNode> {
        Err(CuError::NO_DEVICE)
    }
    fn node_event(&self, _: GraphNode, _: bool) -> CuResult<Event> {
        Err(CuError::NO_DEVICE)
    }
    fn child_graph(&self, _: GraphNode) -> CuResult<Graph> {
        Err(CuError::NO_DEVICE)
    }
    fn find_in_clone(&self, _: GraphNode, _: Graph) -> CuResult<GraphNode> {
        Err(CuError::NO_DEVICE)
    }
    fn destroy_node(&self, _: GraphNode) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn node_enabled(&self, _: GraphExec, _: GraphNode, _: Option<bool>) -> CuResult<bool> {
        Err(CuError::NO_DEVICE)
    }
    fn host_node_call(&self, _: GraphNode) -> CuResult<Raw> {
        Err(CuError::NO_DEVICE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `sys::cu*` call in this file is in GRAPH_SYMBOLS and the other way round.
    #[test]
    fn graph_symbols_match_the_calls() {
        let called = super::super::driver_calls(include_str!("graph.rs"));
        let mut required = GRAPH_SYMBOLS.to_vec();
        required.sort_unstable();
        assert_eq!(called, required);
    }
}

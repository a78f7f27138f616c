//! The runtime face's CUDA graphs and stream capture: the C ABI of the `cudaGraph*` and
//! capture calls over the core's graphs.rs (shared with the driver face). Conditional nodes,
//! host nodes and memory nodes included; external semaphore nodes are not served.

use core::ffi::{c_char, c_uint, c_ulonglong, c_void};

use qcuda_proto::graph as g;

#[allow(clippy::wildcard_imports)]
use crate::core::runtime::graphs::*;
use crate::generated::{
    cudaEvent_t, cudaGraphEdgeData, cudaGraphExecUpdateResultInfo, cudaGraphExec_t,
    cudaGraphInstantiateParams, cudaGraphNodeType, cudaGraphNode_t, cudaGraph_t,
    cudaHostNodeParams, cudaKernelNodeParams, cudaMemcpy3DParms, cudaMemcpyKind, cudaMemsetParams,
    cudaStreamCaptureMode, cudaStreamCaptureStatus, cudaStream_t,
};
use crate::{core::runtime::current, generated as cu};

cuda_api! {
    /// `cudaThreadExchangeStreamCaptureMode`: per guest thread (capture.rs).
    fn cudaThreadExchangeStreamCaptureMode(mode: *mut cudaStreamCaptureMode) {
        // SAFETY: forwarded API contract.
        unsafe { thread_exchange_stream_capture_mode(mode) }
    }

    /// `cudaStreamBeginCapture`: the host's driver captures the stream (not the legacy or
    /// per-thread default stream: cudaErrorStreamCaptureUnsupported).
    #[per_thread(cudaStreamBeginCapture_ptsz)]
    fn cudaStreamBeginCapture(stream: cudaStream_t, mode: cudaStreamCaptureMode) {
        begin_capture(stream, mode)
    }

    /// `cudaStreamBeginCaptureToGraph` (edge data included).
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
        unsafe { stream_get_capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out) }
    }

    /// `cudaStreamUpdateCaptureDependencies` (edge data included).
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

    /// `cudaGraphConditionalHandleCreate`: the host driver's handle on `graph`, a plain 64-bit
    /// value that kernels take as an argument and pass to `cudaGraphSetConditional`.
    fn cudaGraphConditionalHandleCreate(
        pHandle_out: *mut cu::cudaGraphConditionalHandle,
        graph: cudaGraph_t,
        defaultLaunchValue: c_uint,
        flags: c_uint,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { conditional_handle_create(pHandle_out, graph, defaultLaunchValue, flags) }
    }

    /// `cudaGraphMemAllocNodeGetParams`: address, size and the pool properties of the device.
    fn cudaGraphMemAllocNodeGetParams(node: cudaGraphNode_t, params_out: *mut cu::cudaMemAllocNodeParams) {
        let p = mem_alloc_node_get(node)?;
        // SAFETY: null or writable (API contract).
        unsafe { write_out(params_out, p) }
    }

    /// `cudaGraphMemFreeNodeGetParams`: the address the node frees (written as a `void *`).
    fn cudaGraphMemFreeNodeGetParams(node: cudaGraphNode_t, dptr_out: *mut c_void) {
        let d = mem_free_node_get(node)?;
        // SAFETY: null or writable for a pointer (API contract).
        unsafe { write_out(dptr_out.cast::<u64>(), d) }
    }

    /// `cudaGraphCreate` (flags must be 0).
    fn cudaGraphCreate(pGraph: *mut cudaGraph_t, flags: c_uint) {
        // SAFETY: forwarded API contract.
        unsafe { graph_create(pGraph, flags) }
    }

    /// `cudaGraphDestroy`.
    fn cudaGraphDestroy(graph: cudaGraph_t) {
        // SAFETY: forwarded API contract.
        unsafe { graph_destroy(graph) }
    }

    /// `cudaGraphClone`.
    fn cudaGraphClone(pGraphClone: *mut cudaGraph_t, originalGraph: cudaGraph_t) {
        // SAFETY: forwarded API contract.
        unsafe { graph_clone(pGraphClone, originalGraph) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_add_node(pGraphNode, graph, pDependencies, dependencyData, numDependencies, nodeParams) }
    }

    /// `cudaGraphNodeSetParams`.
    fn cudaGraphNodeSetParams(node: cudaGraphNode_t, nodeParams: *mut crate::generated::cudaGraphNodeParams) {
        // SAFETY: forwarded API contract.
        unsafe { graph_node_set_params(node, nodeParams) }
    }

    /// `cudaGraphExecNodeSetParams`.
    fn cudaGraphExecNodeSetParams(
        graphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        nodeParams: *mut crate::generated::cudaGraphNodeParams,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_node_set_params(graphExec, node, nodeParams) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_add_mem_alloc_node(pGraphNode, graph, pDependencies, numDependencies, nodeParams) }
    }

    /// `cudaGraphAddMemFreeNode`: `dptr` must be a graph allocation's address.
    fn cudaGraphAddMemFreeNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        dptr: *mut c_void,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_add_mem_free_node(pGraphNode, graph, pDependencies, numDependencies, dptr) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_add_kernel_node(pGraphNode, graph, pDependencies, numDependencies, pNodeParams) }
    }

    /// `cudaGraphKernelNodeGetParams`: `func` is the kernel's host stub; the parameter values
    /// stay valid until the node's next `cudaGraphKernelNodeGetParams`.
    fn cudaGraphKernelNodeGetParams(node: cudaGraphNode_t, pNodeParams: *mut cudaKernelNodeParams) {
        // SAFETY: forwarded API contract.
        unsafe { graph_kernel_node_get_params(node, pNodeParams) }
    }

    /// `cudaGraphKernelNodeSetParams`.
    fn cudaGraphKernelNodeSetParams(node: cudaGraphNode_t, pNodeParams: *const cudaKernelNodeParams) {
        // SAFETY: forwarded API contract.
        unsafe { graph_kernel_node_set_params(node, pNodeParams) }
    }

    /// `cudaGraphExecKernelNodeSetParams`.
    fn cudaGraphExecKernelNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        pNodeParams: *const cudaKernelNodeParams,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_kernel_node_set_params(hGraphExec, node, pNodeParams) }
    }

    /// `cudaGraphAddMemcpyNode`: pitched pointers, device or host-mapped memory.
    fn cudaGraphAddMemcpyNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        pCopyParams: *const cudaMemcpy3DParms,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_add_memcpy_node(pGraphNode, graph, pDependencies, numDependencies, pCopyParams) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_add_memcpy_node1d(pGraphNode, graph, pDependencies, numDependencies, dst, src, count, kind) }
    }

    /// `cudaGraphMemcpyNodeSetParams`.
    fn cudaGraphMemcpyNodeSetParams(node: cudaGraphNode_t, pNodeParams: *const cudaMemcpy3DParms) {
        // SAFETY: forwarded API contract.
        unsafe { graph_memcpy_node_set_params(node, pNodeParams) }
    }

    /// `cudaGraphMemcpyNodeSetParams1D`.
    fn cudaGraphMemcpyNodeSetParams1D(
        node: cudaGraphNode_t,
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_memcpy_node_set_params1d(node, dst, src, count, kind) }
    }

    /// `cudaGraphExecMemcpyNodeSetParams`.
    fn cudaGraphExecMemcpyNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        pNodeParams: *const cudaMemcpy3DParms,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_memcpy_node_set_params(hGraphExec, node, pNodeParams) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_memcpy_node_set_params1d(hGraphExec, node, dst, src, count, kind) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_add_memcpy_node_to_symbol(pGraphNode, graph, pDependencies, numDependencies, symbol, src, count, offset, kind) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_add_memcpy_node_from_symbol(pGraphNode, graph, pDependencies, numDependencies, dst, symbol, count, offset, kind) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_memcpy_node_set_params_to_symbol(node, symbol, src, count, offset, kind) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_memcpy_node_set_params_from_symbol(node, dst, symbol, count, offset, kind) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_memcpy_node_set_params_to_symbol(hGraphExec, node, symbol, src, count, offset, kind) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_memcpy_node_set_params_from_symbol(hGraphExec, node, dst, symbol, count, offset, kind) }
    }

    /// `cudaGraphMemcpyNodeGetParams`: pitched pointers at offset 0 (host-mapped memory by its
    /// guest pointer), `cudaMemcpyDefault` as the kind.
    fn cudaGraphMemcpyNodeGetParams(node: cudaGraphNode_t, pNodeParams: *mut cudaMemcpy3DParms) {
        // SAFETY: forwarded API contract.
        unsafe { graph_memcpy_node_get_params(node, pNodeParams) }
    }

    /// `cudaGraphMemsetNodeGetParams`.
    fn cudaGraphMemsetNodeGetParams(node: cudaGraphNode_t, pNodeParams: *mut cudaMemsetParams) {
        // SAFETY: forwarded API contract.
        unsafe { graph_memset_node_get_params(node, pNodeParams) }
    }

    /// `cudaGraphAddMemsetNode`.
    fn cudaGraphAddMemsetNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        pMemsetParams: *const cudaMemsetParams,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_add_memset_node(pGraphNode, graph, pDependencies, numDependencies, pMemsetParams) }
    }

    /// `cudaGraphMemsetNodeSetParams`.
    fn cudaGraphMemsetNodeSetParams(node: cudaGraphNode_t, pNodeParams: *const cudaMemsetParams) {
        // SAFETY: forwarded API contract.
        unsafe { graph_memset_node_set_params(node, pNodeParams) }
    }

    /// `cudaGraphExecMemsetNodeSetParams`.
    fn cudaGraphExecMemsetNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        pNodeParams: *const cudaMemsetParams,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_memset_node_set_params(hGraphExec, node, pNodeParams) }
    }

    /// `cudaGraphAddHostNode`: the function runs in this process each time the node does.
    fn cudaGraphAddHostNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        pNodeParams: *const cudaHostNodeParams,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_add_host_node(pGraphNode, graph, pDependencies, numDependencies, pNodeParams) }
    }

    /// `cudaGraphHostNodeGetParams`: the function and argument the node was given.
    fn cudaGraphHostNodeGetParams(node: cudaGraphNode_t, pNodeParams: *mut cudaHostNodeParams) {
        // SAFETY: forwarded API contract.
        unsafe { graph_host_node_get_params(node, pNodeParams) }
    }

    /// `cudaGraphHostNodeSetParams`.
    fn cudaGraphHostNodeSetParams(node: cudaGraphNode_t, pNodeParams: *const cudaHostNodeParams) {
        // SAFETY: forwarded API contract.
        unsafe { graph_host_node_set_params(node, pNodeParams) }
    }

    /// `cudaGraphExecHostNodeSetParams`: the executable graph's node runs the new function; the
    /// graph's own node keeps its parameters.
    fn cudaGraphExecHostNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        pNodeParams: *const cudaHostNodeParams,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_host_node_set_params(hGraphExec, node, pNodeParams) }
    }

    /// `cudaGraphAddChildGraphNode`: the child graph is cloned into the node.
    fn cudaGraphAddChildGraphNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        childGraph: cudaGraph_t,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_add_child_graph_node(pGraphNode, graph, pDependencies, numDependencies, childGraph) }
    }

    /// `cudaGraphExecChildGraphNodeSetParams`.
    fn cudaGraphExecChildGraphNodeSetParams(
        hGraphExec: cudaGraphExec_t,
        node: cudaGraphNode_t,
        childGraph: cudaGraph_t,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_child_graph_node_set_params(hGraphExec, node, childGraph) }
    }

    /// `cudaGraphAddEventRecordNode`.
    fn cudaGraphAddEventRecordNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        event: cudaEvent_t,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_add_event_record_node(pGraphNode, graph, pDependencies, numDependencies, event) }
    }

    /// `cudaGraphAddEventWaitNode`.
    fn cudaGraphAddEventWaitNode(
        pGraphNode: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        pDependencies: *const cudaGraphNode_t,
        numDependencies: usize,
        event: cudaEvent_t,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_add_event_wait_node(pGraphNode, graph, pDependencies, numDependencies, event) }
    }

    /// `cudaGraphEventRecordNodeSetEvent`.
    fn cudaGraphEventRecordNodeSetEvent(node: cudaGraphNode_t, event: cudaEvent_t) {
        // SAFETY: forwarded API contract.
        unsafe { graph_event_record_node_set_event(node, event) }
    }

    /// `cudaGraphEventWaitNodeSetEvent`.
    fn cudaGraphEventWaitNodeSetEvent(node: cudaGraphNode_t, event: cudaEvent_t) {
        // SAFETY: forwarded API contract.
        unsafe { graph_event_wait_node_set_event(node, event) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_child_graph_node_get_graph(node, pGraph) }
    }

    /// `cudaGraphNodeFindInClone`.
    fn cudaGraphNodeFindInClone(pNode: *mut cudaGraphNode_t, originalNode: cudaGraphNode_t, clonedGraph: cudaGraph_t) {
        // SAFETY: forwarded API contract.
        unsafe { graph_node_find_in_clone(pNode, originalNode, clonedGraph) }
    }

    /// `cudaGraphDestroyNode`: the node and its edges leave its graph.
    fn cudaGraphDestroyNode(node: cudaGraphNode_t) {
        // SAFETY: forwarded API contract.
        unsafe { graph_destroy_node(node) }
    }

    /// `cudaGraphExecGetFlags`: the flags it was instantiated with.
    fn cudaGraphExecGetFlags(graphExec: cudaGraphExec_t, flags: *mut c_ulonglong) {
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_get_flags(graphExec, flags) }
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

    /// `cudaGraphAddDependencies` (edge data included).
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

    /// `cudaGraphRemoveDependencies` (edge data included).
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
        // SAFETY: forwarded API contract.
        unsafe { graph_get_edges(graph, from, to, edgeData, numEdges) }
    }

    /// `cudaGraphNodeGetType`.
    fn cudaGraphNodeGetType(node: cudaGraphNode_t, pType: *mut cudaGraphNodeType) {
        // SAFETY: forwarded API contract.
        unsafe { graph_node_get_type(node, pType) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_instantiate_with_params(pGraphExec, graph, instantiateParams) }
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
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_destroy(graphExec) }
    }

    /// `cudaGraphExecUpdate`: the driver's verdict, with the node that failed.
    fn cudaGraphExecUpdate(
        hGraphExec: cudaGraphExec_t,
        hGraph: cudaGraph_t,
        resultInfo: *mut cudaGraphExecUpdateResultInfo,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { graph_exec_update(hGraphExec, hGraph, resultInfo) }
    }

    /// `cudaGraphNodeSetEnabled`.
    fn cudaGraphNodeSetEnabled(hGraphExec: cudaGraphExec_t, hNode: cudaGraphNode_t, isEnabled: c_uint) {
        // SAFETY: forwarded API contract.
        unsafe { graph_node_set_enabled(hGraphExec, hNode, isEnabled) }
    }

    /// `cudaGraphNodeGetEnabled`.
    fn cudaGraphNodeGetEnabled(hGraphExec: cudaGraphExec_t, hNode: cudaGraphNode_t, isEnabled: *mut c_uint) {
        // SAFETY: forwarded API contract.
        unsafe { graph_node_get_enabled(hGraphExec, hNode, isEnabled) }
    }

    /// `cudaGraphDebugDotPrint`: the driver's DOT text, written to `path` here in the guest.
    fn cudaGraphDebugDotPrint(graph: cudaGraph_t, path: *const c_char, flags: c_uint) {
        // SAFETY: forwarded API contract.
        unsafe { graph_debug_dot_print(graph, path, flags) }
    }

    /// `cudaDeviceGraphMemTrim`: the driver's, on the host.
    fn cudaDeviceGraphMemTrim(device: core::ffi::c_int) {
        // SAFETY: forwarded API contract.
        unsafe { device_graph_mem_trim(device) }
    }

    /// `cudaDeviceSetGraphMemAttribute`: the driver's (only the high watermarks can be reset,
    /// to 0).
    fn cudaDeviceSetGraphMemAttribute(device: core::ffi::c_int, attr: crate::generated::cudaGraphMemAttributeType, value: *mut c_void) {
        // SAFETY: forwarded API contract.
        unsafe { device_set_graph_mem_attribute(device, attr, value) }
    }

    /// `cudaDeviceGetGraphMemAttribute`: the driver's figures.
    fn cudaDeviceGetGraphMemAttribute(device: core::ffi::c_int, attr: crate::generated::cudaGraphMemAttributeType, value: *mut c_void) {
        // SAFETY: forwarded API contract.
        unsafe { device_get_graph_mem_attribute(device, attr, value) }
    }
}

//! CUDA graphs and stream capture in the session: real driver graphs, executable graphs and
//! nodes behind session-local handles, checked on every use.
//!
//! Stream capture is the driver's own: `StreamBeginCapture` starts it on the session's real
//! stream, and the launches, copies, memsets and event records the guest then sends into that
//! stream (and into streams that join through events) are captured by the driver as the worker
//! issues them. The worker's thread runs in the relaxed capture mode: all guest threads share
//! it, so the per-thread rules of the global and thread-local modes are the guest library's to
//! apply (guest-lib/src/core/capture.rs).
//!
//! Node parameters arrive in the encodings of `qcuda_proto::graph` and are checked like the ops
//! they stand for: kernels by function handle, geometry and parameter layout, copies and memsets
//! against the session's device memory and host-mapped memory. A node handle lives as long as
//! its graph; nodes the driver made (captured, cloned) get handles when the guest first sees them.

use std::collections::HashMap;

use qcuda_proto::graph::{self as wire_graph, KernelNode, MemcpyNode, MemsetNode};

use qcuda_proto::MAX_ARGS;

use super::*;
use crate::cuda::{
    driver::graph::{Graph, GraphExec, GraphNode, NodeParams},
    driver::Raw,
};

/// Most graphs a session may hold.
const MAX_GRAPHS: usize = 1 << 14;
/// Most executable graphs a session may hold.
const MAX_EXECS: usize = 1 << 14;
/// Most node handles a session may hold.
const MAX_NODES: usize = 1 << 20;
/// Most nodes one request may name.
const MAX_NODE_LIST: usize = 1 << 16;
/// Largest node parameter encoding (a kernel node with the largest parameter block).
const MAX_NODE_PARAMS: usize = wire_graph::KERNEL_NODE_HEADER + MAX_PARAMS;
/// cudaGraphInstantiateFlagAutoFreeOnLaunch | Upload | DeviceLaunch | UseNodePriority.
const INSTANTIATE_FLAGS: u64 = 0xf;
/// cudaGraphInstantiateFlagUpload: the driver's WithFlags call does not take it; the upload is
/// done here, on the request's stream.
const INSTANTIATE_UPLOAD: u64 = 2;
/// The relaxed capture mode.
const CAPTURE_RELAXED: u32 = 2;
/// cudaGraphDebugDotFlags: every bit up to cudaGraphDebugDotFlagsConditionalNodeParams.
const DOT_FLAGS: u64 = (1 << 16) - 1;
/// Longest DOT text returned.
const MAX_DOT: usize = 64 << 20;

#[derive(Debug)]
struct GraphEntry {
    dev: usize,
    raw: Graph,
    /// Still being captured: the driver owns it until the capture ends.
    capturing: bool,
    /// A capture into this graph of the guest's is under way (StreamBeginCaptureToGraph).
    capture_target: bool,
    /// The graph whose child graph node holds this one (it goes with that graph).
    owner: Option<u64>,
}

#[derive(Debug)]
struct NodeEntry {
    graph: u64,
    raw: GraphNode,
}

#[derive(Debug)]
struct ExecEntry {
    dev: usize,
    raw: GraphExec,
    /// The flags it was instantiated with.
    flags: u64,
}

/// The graphs, nodes and executable graphs of a session.
#[derive(Debug)]
pub(super) struct GraphTables {
    graphs: HandleTable<GraphEntry>,
    nodes: HandleTable<NodeEntry>,
    /// Driver node -> its handle.
    node_ids: HashMap<GraphNode, u64>,
    execs: HandleTable<ExecEntry>,
    /// Captures begun and not ended (an upper bound: a capture can also end with its stream).
    captures: usize,
}

impl Default for GraphTables {
    fn default() -> Self {
        Self {
            graphs: HandleTable::new(MAX_GRAPHS),
            nodes: HandleTable::new(MAX_NODES),
            node_ids: HashMap::new(),
            execs: HandleTable::new(MAX_EXECS),
            captures: 0,
        }
    }
}

impl GraphTables {
    pub(super) fn len(&self) -> usize {
        self.graphs.len() + self.execs.len()
    }

    /// Forgets `graph`'s nodes, and the graphs its child graph nodes hold with theirs (the
    /// driver destroyed them with it).
    fn forget_nodes_of(&mut self, graph: u64) {
        while let Some((held, _)) = self.graphs.find(|g| g.owner == Some(graph)) {
            self.graphs.remove(held);
            self.forget_nodes_of(held);
        }
        self.forget_own_nodes(graph);
    }

    fn forget_own_nodes(&mut self, graph: u64) {
        let node_ids = &mut self.node_ids;
        self.nodes.retain(|n| {
            if n.graph == graph {
                node_ids.remove(&n.raw);
                false
            } else {
                true
            }
        });
    }
}

/// A decoded, checked kernel node: the function and the parameter block its pointers point into.
struct KernelArgs {
    dev: usize,
    func: Function,
    cfg: LaunchConfig,
    layout: ParamLayout,
    block: AlignedBytes,
}

enum Decoded {
    Kernel(KernelArgs),
    Other(NodeParams),
}

fn read_all(buf: Option<&GuestBuffer>, max: usize) -> Result<Vec<u8>, Fault> {
    let Some(b) = buf else {
        return Err(status::INVALID_VALUE.into());
    };
    if b.len() > max {
        return Err(status::INVALID_VALUE.into());
    }
    b.to_vec().map_err(|_| status::INVALID_VALUE.into())
}

fn u64s(bytes: &[u8]) -> Result<Vec<u64>, Fault> {
    if !bytes.len().is_multiple_of(8) {
        return Err(status::INVALID_VALUE.into());
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

fn write_u64s(out: Option<&GuestBuffer>, values: &[u64]) -> Result<(), Fault> {
    let Some(out) = out else {
        return Err(status::INVALID_VALUE.into());
    };
    let fit = (out.len() / 8).min(values.len());
    let bytes: Vec<u8> = values[..fit].iter().flat_map(|v| v.to_le_bytes()).collect();
    out.write_at(0, &bytes)
        .map_err(|_| Fault::Status(status::INVALID_VALUE))
}

impl GpuState {
    pub(super) fn graph_op(&mut self, req: &Request) -> OpResult {
        let args = req.header().args;
        match req.op() {
            Op::StreamBeginCapture => self.begin_capture(args),
            Op::StreamBeginCaptureToGraph => self.begin_capture_to_graph(req),
            Op::StreamEndCapture => self.end_capture(args),
            Op::StreamCaptureInfo => self.capture_info(req),
            Op::StreamUpdateCaptureDependencies => self.update_capture_deps(req),
            Op::GraphCreate => self.graph_create(req),
            Op::GraphDestroy => self.graph_destroy(args[0]),
            Op::GraphAddNode => self.graph_add_node(req),
            Op::GraphNodeSetParams => self.graph_set_params(req, None, args[0], args[1]),
            Op::GraphExecNodeSetParams => {
                let (_, exec) = self.exec(args[0])?;
                self.graph_set_params(req, Some(exec), args[1], args[2])
            }
            Op::GraphGetNodes => self.graph_nodes(req),
            Op::GraphGetEdges => self.graph_edges(req),
            Op::GraphNodeQuery => self.node_query(req),
            Op::GraphEdges => self.graph_change_edges(req),
            Op::GraphClone => self.graph_clone(args[0]),
            Op::GraphInstantiate => self.graph_instantiate(args),
            Op::GraphExecDestroy => self.graph_exec_destroy(args[0]),
            Op::GraphLaunch | Op::GraphUpload => {
                let (dev, exec) = self.exec(args[0])?;
                let stream = self.stream_on(args[1], dev)?;
                self.drv
                    .graph_launch(exec, stream, req.op() == Op::GraphUpload)
                    .map_err(on(dev))?;
                if req.op() == Op::GraphLaunch {
                    self.host.count_graph_launch();
                }
                ok()
            }
            Op::GraphExecUpdate => self.graph_exec_update(args),
            Op::GraphQuery => self.graph_query(args),
            Op::GraphKernelNodeGetParams => self.kernel_node_params(req),
            Op::GraphDestroyNode => self.destroy_node(args[0]),
            Op::GraphNodeGetParams => self.node_get_params(req),
            Op::GraphMem => {
                let [what, attr, value, ..] = args;
                let what = u32::try_from(what)
                    .ok()
                    .filter(|w| *w <= 2)
                    .ok_or(status::INVALID_VALUE)?;
                let attr = u32::try_from(attr)
                    .ok()
                    .filter(|a| *a <= 3)
                    .ok_or(status::INVALID_VALUE)?;
                let dev = self.bind_new(req)?;
                let cu_dev = self.host.gpus.get(dev).ok_or(status::INVALID_DEVICE)?.dev;
                let v = self
                    .drv
                    .graph_mem(cu_dev, what, attr, value)
                    .map_err(on(dev))?;
                ok_rets(&[v])
            }
            Op::StreamCaptureInvalidate => {
                let (dev, stream) = self.capture_stream(args[0])?;
                let info = self.drv.stream_capture_info(stream).map_err(on(dev))?;
                if info.status == 1 {
                    // Querying a capturing stream is prohibited, so the driver invalidates the
                    // capture: its own invalidation, with its own later errors.
                    let _ = self.drv.stream_query(stream);
                }
                ok()
            }
            Op::GraphDebugDot => self.graph_debug_dot(req),
            Op::GraphNodeEnabled => {
                let (dev, exec) = self.exec(args[0])?;
                let node = self.node(args[1])?;
                let set = match args[2] {
                    0 => None,
                    1 => Some(args[3] != 0),
                    _ => return Err(status::INVALID_VALUE.into()),
                };
                let on_now = self.drv.node_enabled(exec, node, set).map_err(on(dev))?;
                ok_rets(&[u64::from(on_now)])
            }
            Op::GraphExecChildGraph => {
                let (dev, exec) = self.exec(args[0])?;
                let node = self.node(args[1])?;
                let (_, child) = self.graph(args[2])?;
                self.drv
                    .node_set_params(Some(exec), node, &NodeParams::Child(child), None)
                    .map_err(on(dev))?;
                ok()
            }
            Op::GraphExecSetEvent => {
                let (dev, exec) = self.exec(args[0])?;
                let node = self.node(args[1])?;
                let (_, event) = self.event(args[2])?;
                let p = match self.drv.node_type(node).map_err(on(dev))? {
                    wire_graph::NODE_EVENT_RECORD => NodeParams::EventRecord(event),
                    wire_graph::NODE_WAIT_EVENT => NodeParams::EventWait(event),
                    _ => return Err(status::INVALID_VALUE.into()),
                };
                self.drv
                    .node_set_params(Some(exec), node, &p, None)
                    .map_err(on(dev))?;
                ok()
            }
            _ => Err(status::NOT_SUPPORTED.into()),
        }
    }

    /// Graph `handle`, its device's context bound.
    fn graph(&mut self, handle: u64) -> Result<(usize, Graph), Fault> {
        let (dev, raw) = self
            .graphs
            .graphs
            .get(handle)
            .map(|g| (g.dev, g.raw))
            .ok_or(Fault::Status(status::INVALID_VALUE))?;
        self.bind(dev)?;
        Ok((dev, raw))
    }

    /// Executable graph `handle`, its device's context bound.
    fn exec(&mut self, handle: u64) -> Result<(usize, GraphExec), Fault> {
        let (dev, raw) = self
            .graphs
            .execs
            .get(handle)
            .map(|e| (e.dev, e.raw))
            .ok_or(Fault::Status(status::INVALID_VALUE))?;
        self.bind(dev)?;
        Ok((dev, raw))
    }

    fn node(&self, handle: u64) -> Result<GraphNode, Fault> {
        self.graphs
            .nodes
            .get(handle)
            .map(|n| n.raw)
            .ok_or(Fault::Status(status::INVALID_VALUE))
    }

    fn nodes(&self, handles: &[u64]) -> Result<Vec<GraphNode>, Fault> {
        handles.iter().map(|&h| self.node(h)).collect()
    }

    /// The handle of driver node `raw` of graph `graph`, issued on first sight.
    fn node_handle(&mut self, graph: u64, raw: GraphNode) -> Result<u64, Fault> {
        if let Some(&h) = self.graphs.node_ids.get(&raw) {
            return Ok(h);
        }
        let h = self
            .graphs
            .nodes
            .insert(&mut self.ids, NodeEntry { graph, raw })
            .ok_or(status::MEMORY_ALLOCATION)?;
        self.graphs.node_ids.insert(raw, h);
        Ok(h)
    }

    /// The graph handle of a driver graph being captured (or held by a child graph node of
    /// graph `owner`), issued on first sight.
    fn captured_graph_handle(
        &mut self,
        dev: usize,
        raw: Graph,
        owner: Option<u64>,
    ) -> Result<u64, Fault> {
        if let Some((h, _)) = self.graphs.graphs.find(|g| g.raw == raw) {
            return Ok(h);
        }
        self.graphs
            .graphs
            .insert(
                &mut self.ids,
                GraphEntry {
                    dev,
                    raw,
                    capturing: true,
                    capture_target: false,
                    owner,
                },
            )
            .ok_or(status::MEMORY_ALLOCATION.into())
    }

    /// A session stream by handle (not the legacy stream), its context bound.
    fn capture_stream(&mut self, handle: u64) -> Result<(usize, Stream), Fault> {
        if handle == 0 {
            // Capture of the legacy stream is not allowed in CUDA.
            return Err(status::STREAM_CAPTURE_UNSUPPORTED.into());
        }
        self.bound_stream(handle)
    }

    fn begin_capture(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let mode = u32::try_from(args[1])
            .ok()
            .filter(|m| *m <= CAPTURE_RELAXED)
            .ok_or(status::INVALID_VALUE)?;
        let (dev, stream) = self.capture_stream(args[0])?;
        // The mode is per driver thread; set it at every capture (cheap), so that it holds
        // on whichever thread runs the session.
        self.drv
            .exchange_capture_mode(CAPTURE_RELAXED)
            .map_err(on(dev))?;
        self.drv
            .stream_begin_capture(stream, mode)
            .map_err(on(dev))?;
        self.graphs.captures += 1;
        ok()
    }

    /// Whether a capture the session began may still be under way.
    pub(super) fn capture_under_way(&self) -> bool {
        self.graphs.captures > 0
    }

    /// Whether `stream` (of the bound context) is being captured; free while no capture of the
    /// session is under way.
    pub(super) fn is_capturing(&self, stream: Stream) -> bool {
        self.graphs.captures > 0
            && self
                .drv
                .stream_capture_info(stream)
                .is_ok_and(|i| i.status != 0)
    }

    fn begin_capture_to_graph(&mut self, req: &Request) -> OpResult {
        let [stream, graph, mode, ..] = req.header().args;
        let mode = u32::try_from(mode)
            .ok()
            .filter(|m| *m <= CAPTURE_RELAXED)
            .ok_or(status::INVALID_VALUE)?;
        let list = u64s(&read_all(req.inputs().first(), MAX_NODE_LIST * 8)?)?;
        let deps = self.nodes(&list)?;
        let graph_handle = graph;
        let graph = match self.graphs.graphs.get(graph) {
            Some(g) if !g.capturing && !g.capture_target => g.raw,
            _ => return Err(status::INVALID_VALUE.into()),
        };
        let (dev, stream) = self.capture_stream(stream)?;
        self.drv
            .exchange_capture_mode(CAPTURE_RELAXED)
            .map_err(on(dev))?;
        self.drv
            .stream_begin_capture_to_graph(stream, graph, &deps, mode)
            .map_err(on(dev))?;
        if let Some(g) = self.graphs.graphs.get_mut(graph_handle) {
            g.capture_target = true;
        }
        self.graphs.captures += 1;
        ok()
    }

    fn end_capture(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let (dev, stream) = self.capture_stream(args[0])?;
        let before = self.drv.stream_capture_info(stream).ok();
        let ended = self.drv.stream_end_capture(stream);
        if before.as_ref().is_some_and(|i| i.status != 0) {
            self.graphs.captures = self.graphs.captures.saturating_sub(1);
        }
        // The graph of this capture is the caller's now, or gone (failed capture).
        let old = before.and_then(|i| i.graph);
        let known = old.and_then(|g| self.graphs.graphs.find(|e| e.raw == g).map(|(h, _)| h));
        if let Some(e) = known.and_then(|h| self.graphs.graphs.get_mut(h)) {
            e.capture_target = false;
        }
        match ended {
            Ok(raw) => {
                if let Some(h) = known {
                    if let Some(e) = self.graphs.graphs.get_mut(h) {
                        if e.raw == raw {
                            e.capturing = false;
                            return ok_rets(&[h]);
                        }
                    }
                    self.graphs.graphs.remove(h);
                    self.graphs.forget_nodes_of(h);
                }
                let h = self.graphs.graphs.insert(
                    &mut self.ids,
                    GraphEntry {
                        dev,
                        raw,
                        capturing: false,
                        capture_target: false,
                        owner: None,
                    },
                );
                match h {
                    Some(h) => ok_rets(&[h]),
                    None => {
                        let _ = self.drv.graph_destroy(raw);
                        Err(status::MEMORY_ALLOCATION.into())
                    }
                }
            }
            Err(e) => {
                // The driver's own capture graph is gone; a graph the guest captured into
                // (StreamBeginCaptureToGraph) stays the guest's.
                if let Some(h) =
                    known.filter(|h| self.graphs.graphs.get(*h).is_some_and(|g| g.capturing))
                {
                    self.graphs.graphs.remove(h);
                    self.graphs.forget_nodes_of(h);
                }
                Err(Fault::Driver { dev, err: e })
            }
        }
    }

    fn capture_info(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let (dev, stream) = if handle == 0 {
            let dev = self.bind_new(req)?;
            (dev, NULL_STREAM)
        } else {
            self.capture_stream(handle)?
        };
        let info = self.drv.stream_capture_info(stream).map_err(on(dev))?;
        let captured = info.graph.filter(|_| info.status == 1);
        let (graph, deps) = if let Some(captured) = captured {
            let g = self.captured_graph_handle(dev, captured, None)?;
            let mut deps = Vec::with_capacity(info.deps.len());
            for &d in &info.deps {
                deps.push(self.node_handle(g, d)?);
            }
            (g, deps)
        } else {
            (0, Vec::new())
        };
        write_u64s(req.outputs().first(), &deps)?;
        ok_rets(&[u64::from(info.status), info.id, graph, deps.len() as u64])
    }

    fn update_capture_deps(&mut self, req: &Request) -> OpResult {
        let [stream, flags, ..] = req.header().args;
        let flags = u32::try_from(flags)
            .ok()
            .filter(|f| *f <= 1)
            .ok_or(status::INVALID_VALUE)?;
        let list = u64s(&read_all(req.inputs().first(), MAX_NODE_LIST * 8)?)?;
        let deps = self.nodes(&list)?;
        let (dev, stream) = self.capture_stream(stream)?;
        self.drv
            .stream_update_capture_deps(stream, &deps, flags)
            .map_err(on(dev))?;
        ok()
    }

    fn graph_create(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        if !self.graphs.graphs.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.graph_create().map_err(on(dev))?;
        let entry = GraphEntry {
            dev,
            raw,
            capturing: false,
            capture_target: false,
            owner: None,
        };
        match self.graphs.graphs.insert(&mut self.ids, entry) {
            Some(h) => ok_rets(&[h]),
            None => {
                let _ = self.drv.graph_destroy(raw);
                Err(status::MEMORY_ALLOCATION.into())
            }
        }
    }

    fn graph_destroy(&mut self, handle: u64) -> OpResult {
        if self
            .graphs
            .graphs
            .get(handle)
            .is_some_and(|g| g.capturing || g.capture_target)
        {
            // A graph under capture is the driver's until the capture ends.
            return Err(status::INVALID_VALUE.into());
        }
        let (dev, raw) = self.graph(handle)?;
        let result = self.drv.graph_destroy(raw);
        self.graphs.graphs.remove(handle);
        self.graphs.forget_nodes_of(handle);
        // The graph's memory stays the session's: executable graphs instantiated from it keep
        // allocating it when they run, and a program may free it with cudaFree after
        // destroying the graph (CUDA allows both). It goes with the context.
        result.map_err(on(dev))?;
        ok()
    }

    fn graph_clone(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = self.graph(handle)?;
        if !self.graphs.graphs.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let copy = self.drv.graph_clone(raw).map_err(on(dev))?;
        let entry = GraphEntry {
            dev,
            raw: copy,
            capturing: false,
            capture_target: false,
            owner: None,
        };
        match self.graphs.graphs.insert(&mut self.ids, entry) {
            Some(h) => ok_rets(&[h]),
            None => {
                let _ = self.drv.graph_destroy(copy);
                Err(status::MEMORY_ALLOCATION.into())
            }
        }
    }

    /// Decodes and checks node parameters of type `ty` for a node in a context on `dev`.
    fn decode_node(&mut self, dev: usize, ty: u64, bytes: &[u8]) -> Result<Decoded, Fault> {
        let bad = Fault::Status(status::INVALID_VALUE);
        let ty = u32::try_from(ty).map_err(|_| bad)?;
        let p = match ty {
            wire_graph::NODE_KERNEL => {
                let k = KernelNode::decode(bytes).ok_or(bad)?;
                let (fdev, func, layout) = match self.functions.get(k.function) {
                    Some(f) => (f.dev, f.raw, f.layout.clone()),
                    None => return Err(status::INVALID_DEVICE_FUNCTION.into()),
                };
                let cfg = LaunchConfig {
                    grid: k.grid,
                    block: k.block,
                    shared_mem: k.shared_mem,
                };
                let gpu = self.host.gpus.get(fdev).ok_or(status::INVALID_DEVICE)?;
                cfg.check(&gpu.limits)?;
                if k.params.len() != layout.block_len() {
                    return Err(bad);
                }
                let mut block = AlignedBytes::zeroed(layout.block_len());
                block
                    .as_mut_slice()
                    .copy_from_slice(&k.params[..layout.block_len()]);
                return Ok(Decoded::Kernel(KernelArgs {
                    dev: fdev,
                    func,
                    cfg,
                    layout,
                    block,
                }));
            }
            wire_graph::NODE_MEMCPY => {
                let m = MemcpyNode::decode(bytes).ok_or(bad)?;
                let dst = MemcpyNode::span(m.dst_pitch, m.dst_rows, m.width, m.height, m.depth)
                    .ok_or(bad)?;
                let src = MemcpyNode::span(m.src_pitch, m.src_rows, m.width, m.height, m.depth)
                    .ok_or(bad)?;
                if dst == 0 {
                    return Err(bad);
                }
                self.check_range(dev, m.dst, dst)?;
                self.check_range(dev, m.src, src)?;
                NodeParams::Memcpy(m)
            }
            wire_graph::NODE_MEMSET => {
                let m = MemsetNode::decode(bytes).ok_or(bad)?;
                let span = m.span().ok_or(bad)?;
                if span == 0 {
                    return Err(bad);
                }
                self.check_range(dev, m.dst, span)?;
                NodeParams::Memset(m)
            }
            wire_graph::NODE_GRAPH => {
                let g = wire_graph::decode_handle(bytes).ok_or(bad)?;
                let raw = self.graphs.graphs.get(g).map(|e| e.raw).ok_or(bad)?;
                NodeParams::Child(raw)
            }
            wire_graph::NODE_EVENT_RECORD | wire_graph::NODE_WAIT_EVENT => {
                let e = wire_graph::decode_handle(bytes).ok_or(bad)?;
                let (_, raw) = self.event(e)?;
                if ty == wire_graph::NODE_EVENT_RECORD {
                    NodeParams::EventRecord(raw)
                } else {
                    NodeParams::EventWait(raw)
                }
            }
            wire_graph::NODE_EMPTY if bytes.is_empty() => NodeParams::Empty,
            // Host nodes wait for host functions run in the guest; semaphores and conditional
            // nodes are not served. Memory nodes are added by `graph_add_node` (they cannot
            // change).
            wire_graph::NODE_HOST => {
                // The guest's key for its function: the node runs the worker's stand-in, which
                // hands the key back to the guest each time the node runs (host_functions.rs).
                let key = wire_graph::decode_handle(bytes).ok_or(bad)?;
                if key == 0 {
                    return Err(bad);
                }
                if !self.host_functions.linked() {
                    return Err(status::NOT_SUPPORTED.into());
                }
                let call = self
                    .host_functions
                    .call(key, false)
                    .ok_or(status::MEMORY_ALLOCATION)?;
                // Freed with the session, after its contexts and so its graphs.
                self.captured_calls.push(call as usize);
                NodeParams::Host(call as Raw)
            }
            _ => return Err(bad),
        };
        Ok(Decoded::Other(p))
    }

    fn graph_add_node(&mut self, req: &Request) -> OpResult {
        let [graph, ty, ..] = req.header().args;
        let deps = u64s(&read_all(req.inputs().first(), MAX_NODE_LIST * 8)?)?;
        let deps = self.nodes(&deps)?;
        let params = read_all(req.inputs().get(1), MAX_NODE_PARAMS)?;
        let (gdev, graw) = self.graph(graph)?;
        if !self.graphs.nodes.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let dev = self.bind_new(req)?;
        match u32::try_from(ty) {
            Ok(wire_graph::NODE_MEM_ALLOC) => {
                return self.add_mem_alloc_node(dev, graph, graw, &deps, &params)
            }
            Ok(wire_graph::NODE_MEM_FREE) => {
                let dptr = wire_graph::decode_handle(&params).ok_or(status::INVALID_VALUE)?;
                if !self.context(dev)?.memory.is_graph_memory(dptr) {
                    return Err(status::INVALID_VALUE.into());
                }
                let raw = self
                    .drv
                    .graph_add_mem_free_node(graw, &deps, dptr)
                    .map_err(on(dev))?;
                return ok_rets(&[self.node_handle(graph, raw)?]);
            }
            _ => {}
        }
        let raw = match self.decode_node(dev, ty, &params)? {
            Decoded::Kernel(mut k) => {
                self.bind(k.dev)?;
                let mut ptrs = k
                    .layout
                    .pointers(&mut k.block)
                    .ok_or(status::INVALID_VALUE)?;
                // SAFETY: one pointer per parameter of this function's own layout, each into
                // `k.block`, which is block_len long and outlives the call; the driver copies
                // the values.
                unsafe {
                    self.drv
                        .graph_add_kernel_node(graw, &deps, k.func, &k.cfg, &mut ptrs)
                }
                .map_err(on(k.dev))?
            }
            Decoded::Other(p) => {
                let ctx = self.context(dev)?.ctx;
                self.drv
                    .graph_add_node(graw, &deps, &p, ctx)
                    .map_err(on(gdev))?
            }
        };
        let h = self.node_handle(graph, raw)?;
        ok_rets(&[h])
    }

    /// A memory allocation node of `bytesize` (params: one u64) bytes on `dev`: its address
    /// becomes session memory on `dev` for the graph's lifetime.
    fn add_mem_alloc_node(
        &mut self,
        dev: usize,
        graph: u64,
        graw: Graph,
        deps: &[GraphNode],
        params: &[u8],
    ) -> OpResult {
        let size = wire_graph::decode_handle(params).ok_or(status::INVALID_VALUE)?;
        if size == 0 {
            return Err(status::INVALID_VALUE.into());
        }
        let cu_dev = self.host.gpus.get(dev).ok_or(status::INVALID_DEVICE)?.dev;
        if !self.context(dev)?.memory.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let (raw, dptr) = self
            .drv
            .graph_add_mem_alloc_node(graw, deps, cu_dev, to_usize(size)?)
            .map_err(on(dev))?;
        let node = self.node_handle(graph, raw)?;
        if let Err(e) = self
            .context(dev)?
            .memory
            .insert_graph_memory(dptr, size, graph)
        {
            warn!(
                session = self.id,
                dev,
                dptr,
                size,
                ?e,
                "graph memory overlaps the table"
            );
            let _ = self.drv.destroy_node(raw);
            self.graphs.nodes.remove(node);
            self.graphs.node_ids.remove(&raw);
            return Err(status::UNKNOWN.into());
        }
        ok_rets(&[node, dptr])
    }

    /// `GraphNodeSetParams` (`exec` 0) and `GraphExecNodeSetParams`.
    fn graph_set_params(
        &mut self,
        req: &Request,
        exec: Option<GraphExec>,
        node: u64,
        ty: u64,
    ) -> OpResult {
        let node = self.node(node)?;
        let params = read_all(req.inputs().first(), MAX_NODE_PARAMS)?;
        let dev = self.bind_new(req)?;
        match self.decode_node(dev, ty, &params)? {
            Decoded::Kernel(mut k) => {
                self.bind(k.dev)?;
                let mut ptrs = k
                    .layout
                    .pointers(&mut k.block)
                    .ok_or(status::INVALID_VALUE)?;
                // SAFETY: as in graph_add_node.
                unsafe {
                    self.drv
                        .kernel_node_set_params(exec, node, k.func, &k.cfg, &mut ptrs)
                }
                .map_err(on(k.dev))?;
            }
            Decoded::Other(p) => {
                let ctx = self.context(dev)?.ctx;
                self.drv
                    .node_set_params(exec, node, &p, Some(ctx))
                    .map_err(on(dev))?;
            }
        }
        ok()
    }

    fn graph_nodes(&mut self, req: &Request) -> OpResult {
        let [graph, which, ..] = req.header().args;
        if which > 1 {
            return Err(status::INVALID_VALUE.into());
        }
        let (dev, raw) = self.graph(graph)?;
        let raws = self.drv.graph_nodes(raw, which == 1).map_err(on(dev))?;
        let mut handles = Vec::with_capacity(raws.len());
        for r in raws {
            handles.push(self.node_handle(graph, r)?);
        }
        write_u64s(req.outputs().first(), &handles)?;
        ok_rets(&[handles.len() as u64])
    }

    fn graph_edges(&mut self, req: &Request) -> OpResult {
        let graph = req.header().args[0];
        let (dev, raw) = self.graph(graph)?;
        let edges = self.drv.graph_edges(raw).map_err(on(dev))?;
        let mut flat = Vec::with_capacity(edges.len() * 2);
        for (a, b) in edges.iter().copied() {
            flat.push(self.node_handle(graph, a)?);
            flat.push(self.node_handle(graph, b)?);
        }
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let fit = (out.len() / 16).min(edges.len());
        write_u64s(Some(out), &flat[..fit * 2])?;
        ok_rets(&[edges.len() as u64])
    }

    fn node_query(&mut self, req: &Request) -> OpResult {
        let [handle, which, ..] = req.header().args;
        let graph = self
            .graphs
            .nodes
            .get(handle)
            .map(|n| n.graph)
            .ok_or(status::INVALID_VALUE)?;
        let raw = self.node(handle)?;
        let (dev, _) = self.graph(graph)?;
        let list = match which {
            0 => {
                let t = self.drv.node_type(raw).map_err(on(dev))?;
                return ok_rets(&[u64::from(t)]);
            }
            1 | 2 => self.drv.node_neighbours(raw, which == 2).map_err(on(dev))?,
            _ => return Err(status::INVALID_VALUE.into()),
        };
        let mut handles = Vec::with_capacity(list.len());
        for r in list {
            handles.push(self.node_handle(graph, r)?);
        }
        write_u64s(req.outputs().first(), &handles)?;
        ok_rets(&[handles.len() as u64])
    }

    fn graph_change_edges(&mut self, req: &Request) -> OpResult {
        let [graph, remove, ..] = req.header().args;
        if remove > 1 {
            return Err(status::INVALID_VALUE.into());
        }
        let pairs = u64s(&read_all(req.inputs().first(), MAX_NODE_LIST * 16)?)?;
        if !pairs.len().is_multiple_of(2) {
            return Err(status::INVALID_VALUE.into());
        }
        let from = self.nodes(&pairs.iter().step_by(2).copied().collect::<Vec<_>>())?;
        let to = self.nodes(&pairs.iter().skip(1).step_by(2).copied().collect::<Vec<_>>())?;
        let (dev, raw) = self.graph(graph)?;
        self.drv
            .graph_change_edges(raw, &from, &to, remove == 1)
            .map_err(on(dev))?;
        ok()
    }

    fn graph_instantiate(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let [graph, flags, stream, ..] = args;
        if flags & !INSTANTIATE_FLAGS != 0 {
            return Err(status::INVALID_VALUE.into());
        }
        let (dev, raw) = self.graph(graph)?;
        let stream = self.stream_on(stream, dev)?;
        if !self.graphs.execs.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let exec = self
            .drv
            .graph_instantiate(raw, flags & !INSTANTIATE_UPLOAD)
            .map_err(on(dev))?;
        let uploaded = if flags & INSTANTIATE_UPLOAD != 0 {
            self.drv.graph_launch(exec, stream, true)
        } else {
            Ok(())
        };
        let h = match uploaded {
            Ok(()) => self.graphs.execs.insert(
                &mut self.ids,
                ExecEntry {
                    dev,
                    raw: exec,
                    flags,
                },
            ),
            Err(_) => None,
        };
        match (h, uploaded) {
            (Some(h), _) => ok_rets(&[h]),
            (None, r) => {
                let _ = self.drv.graph_exec_destroy(exec);
                r.map_err(on(dev))?;
                Err(status::MEMORY_ALLOCATION.into())
            }
        }
    }

    fn graph_exec_destroy(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = self.exec(handle)?;
        let result = self.drv.graph_exec_destroy(raw);
        self.graphs.execs.remove(handle);
        result.map_err(on(dev))?;
        ok()
    }

    fn graph_exec_update(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let (dev, exec) = self.exec(args[0])?;
        let (_, graph) = self.graph(args[1])?;
        self.bind(dev)?;
        let (result, node) = self.drv.graph_exec_update(exec, graph).map_err(on(dev))?;
        let node = match node {
            None => 0,
            Some(node) => self.node_handle(args[1], node)?,
        };
        ok_rets(&[u64::from(result), node])
    }

    fn node_get_params(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let graph = self
            .graphs
            .nodes
            .get(handle)
            .map(|n| n.graph)
            .ok_or(status::INVALID_VALUE)?;
        let node = self.node(handle)?;
        let (dev, _) = self.graph(graph)?;
        let ty = self.drv.node_type(node).map_err(on(dev))?;
        let enc = match ty {
            wire_graph::NODE_MEMCPY => self
                .drv
                .memcpy_node_params(node)
                .map_err(on(dev))?
                .encode()
                .to_vec(),
            wire_graph::NODE_MEMSET => self
                .drv
                .memset_node_params(node)
                .map_err(on(dev))?
                .encode()
                .to_vec(),
            _ => return Err(status::INVALID_VALUE.into()),
        };
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let fit = out.len().min(enc.len());
        out.write_at(0, &enc[..fit])
            .map_err(|_| status::INVALID_VALUE)?;
        ok_rets(&[u64::from(ty)])
    }

    fn destroy_node(&mut self, handle: u64) -> OpResult {
        let graph = self
            .graphs
            .nodes
            .get(handle)
            .map(|n| n.graph)
            .ok_or(status::INVALID_VALUE)?;
        let node = self.node(handle)?;
        let (dev, _) = self.graph(graph)?;
        // A child graph node takes the graph it holds along.
        let held = match self.drv.node_type(node).map_err(on(dev))? {
            wire_graph::NODE_GRAPH => self.drv.child_graph(node).ok(),
            _ => None,
        };
        self.drv.destroy_node(node).map_err(on(dev))?;
        self.graphs.nodes.remove(handle);
        self.graphs.node_ids.remove(&node);
        if let Some((h, _)) = held.and_then(|raw| {
            self.graphs
                .graphs
                .find(|g| g.owner == Some(graph) && g.raw == raw)
        }) {
            self.graphs.graphs.remove(h);
            self.graphs.forget_nodes_of(h);
        }
        ok()
    }

    fn kernel_node_params(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let graph = self
            .graphs
            .nodes
            .get(handle)
            .map(|n| n.graph)
            .ok_or(status::INVALID_VALUE)?;
        let node = self.node(handle)?;
        let (dev, _) = self.graph(graph)?;
        if self.drv.node_type(node).map_err(on(dev))? != wire_graph::NODE_KERNEL {
            return Err(status::INVALID_VALUE.into());
        }
        let functions = &self.functions;
        let layout_of = |raw: Function| {
            functions
                .find(|f| f.raw == raw)
                .map(|(_, f)| f.layout.clone())
        };
        let (func, cfg, block) = self
            .drv
            .kernel_node_params(node, &layout_of)
            .map_err(on(dev))?;
        let (function, _) = self
            .functions
            .find(|f| f.raw == func)
            .ok_or(status::INVALID_VALUE)?;
        let mut enc = vec![0u8; wire_graph::KERNEL_NODE_HEADER + block.len()];
        KernelNode {
            function,
            grid: cfg.grid,
            block: cfg.block,
            shared_mem: cfg.shared_mem,
            params: &block,
        }
        .encode(&mut enc);
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let fit = out.len().min(enc.len());
        out.write_at(0, &enc[..fit])
            .map_err(|_| status::INVALID_VALUE)?;
        ok_rets(&[enc.len() as u64])
    }

    fn graph_query(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let [handle, what, clone, ..] = args;
        if what == 2 {
            let flags = self
                .graphs
                .execs
                .get(handle)
                .map(|e| e.flags)
                .ok_or(status::INVALID_VALUE)?;
            return ok_rets(&[flags]);
        }
        let graph = self
            .graphs
            .nodes
            .get(handle)
            .map(|n| n.graph)
            .ok_or(status::INVALID_VALUE)?;
        let node = self.node(handle)?;
        let (dev, _) = self.graph(graph)?;
        match what {
            0 => {
                let t = self.drv.node_type(node).map_err(on(dev))?;
                let record = match t {
                    wire_graph::NODE_EVENT_RECORD => true,
                    wire_graph::NODE_WAIT_EVENT => false,
                    _ => return Err(status::INVALID_VALUE.into()),
                };
                let raw = self.drv.node_event(node, record).map_err(on(dev))?;
                // An event the session has destroyed since has no handle any more.
                let (h, _) = self
                    .events
                    .find(|e| e.raw == raw)
                    .ok_or(status::INVALID_RESOURCE_HANDLE)?;
                ok_rets(&[h])
            }
            1 => {
                let raw = self.drv.child_graph(node).map_err(on(dev))?;
                // The node owns it: it is listed like a graph under capture (not destroyable).
                ok_rets(&[self.captured_graph_handle(dev, raw, Some(graph))?])
            }
            3 => {
                let (_, clone_raw) = self.graph(clone)?;
                let raw = self.drv.find_in_clone(node, clone_raw).map_err(on(dev))?;
                ok_rets(&[self.node_handle(clone, raw)?])
            }
            _ => Err(status::INVALID_VALUE.into()),
        }
    }

    fn graph_debug_dot(&mut self, req: &Request) -> OpResult {
        let [graph, flags, ..] = req.header().args;
        let flags = flags_u32(flags, DOT_FLAGS)?;
        let (dev, raw) = self.graph(graph)?;
        let mut text = self.drv.graph_debug_dot(raw, flags).map_err(on(dev))?;
        text.truncate(MAX_DOT);
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let fit = out.len().min(text.len());
        out.write_at(0, &text[..fit])
            .map_err(|_| status::INVALID_VALUE)?;
        ok_rets(&[text.len() as u64])
    }

    /// Destroys the executable graphs and graphs made on `dev` (DeviceReset, session end),
    /// before the context goes.
    pub(super) fn teardown_graphs(&mut self, dev: usize, call_driver: bool) {
        let drv = Arc::clone(&self.drv);
        self.graphs.execs.retain(|e| {
            if e.dev == dev {
                if call_driver {
                    let _ = drv.graph_exec_destroy(e.raw);
                }
                false
            } else {
                true
            }
        });
        let mut gone = Vec::new();
        self.graphs.graphs.retain(|g| {
            if g.dev == dev {
                if call_driver && !g.capturing {
                    let _ = drv.graph_destroy(g.raw);
                }
                false
            } else {
                true
            }
        });
        // Nodes of graphs that no longer exist.
        let graphs = &self.graphs.graphs;
        self.graphs.nodes.retain(|n| {
            if graphs.get(n.graph).is_some() {
                true
            } else {
                gone.push(n.raw);
                false
            }
        });
        for raw in gone {
            self.graphs.node_ids.remove(&raw);
        }
    }
}

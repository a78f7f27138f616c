//! CUDA graphs and stream capture in the session: real driver graphs, executable graphs and
//! nodes behind session-local handles, checked on every use.
//!
//! Stream capture is the driver's own: `StreamBeginCapture` starts it on the session's real
//! stream, and the launches, copies, memsets and event records the guest then sends into that
//! stream (and into streams that join through events) are captured by the driver as the worker
//! issues them. The worker's thread runs in the relaxed capture mode: all guest threads share
//! it, so the per-thread rules of the global and thread-local modes are the guest library's to
//! apply (guest-lib/src/core/transport/capture.rs).
//!
//! Node parameters arrive in the encodings of `qcuda_proto::graph` and are checked like the ops
//! they stand for: kernels by function handle, geometry and parameter layout, copies and memsets
//! against the session's device memory and host-mapped memory. A node handle lives as long as
//! its graph; nodes the driver made (captured, cloned) get handles when the guest first sees them.
//!
//! Conditional nodes: a conditional handle is the driver's own value (kernels pass it to
//! `cudaGraphSetConditional`), remembered with its graph; a node may name only a handle of its
//! graph, and the body graphs the driver makes become session graphs owned by the node's graph.

use std::collections::HashMap;

use qcuda_proto::graph::{self as wire_graph, EdgeData, KernelNode, MemcpyNode, MemsetNode};

use qcuda_proto::MAX_ARGS;

use super::*;
use crate::cuda::{
    driver::graph::{Graph, GraphExec, GraphNode, NodeParams},
    driver::Raw,
};

mod moved_child;
mod node_attrs;
mod saved;

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
/// cudaGraphCondAssignDefault.
const COND_FLAGS: u64 = 1;
/// Why graphs whose kernel nodes may carry attributes are not saved.
const ATTRIBUTED: &str = "graphs captured from launches with launch attributes, or from \
                          streams with attributes (kernel node attributes are not saved)";
/// Most conditional handles a session may hold.
const MAX_CONDITIONALS: usize = 1 << 16;
/// Longest DOT text returned.
const MAX_DOT: usize = 64 << 20;

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

/// The edge data of `n` dependencies or edges from in-buffer `buf` (empty: default edges,
/// returned as an empty list; else exactly `n` valid records).
fn read_edges(buf: Option<&GuestBuffer>, n: usize) -> Result<Vec<EdgeData>, Fault> {
    let bytes = match buf {
        Some(b) if !b.is_empty() => read_all(Some(b), MAX_NODE_LIST * wire_graph::EDGE_DATA_SIZE)?,
        _ => return Ok(Vec::new()),
    };
    if bytes.len() != n * wire_graph::EDGE_DATA_SIZE {
        return Err(status::INVALID_VALUE.into());
    }
    let edges = bytes
        .chunks_exact(wire_graph::EDGE_DATA_SIZE)
        .map(EdgeData::decode)
        .collect::<Option<Vec<_>>>()
        .ok_or(status::INVALID_VALUE)?;
    // All default edges are what the driver takes without an array.
    Ok(if edges.iter().all(|e| e.is_default()) {
        Vec::new()
    } else {
        edges
    })
}

/// Writes as many of `edges` as out-buffer `out` holds.
fn write_edges(out: Option<&GuestBuffer>, edges: &[EdgeData]) -> Result<(), Fault> {
    let Some(out) = out else {
        return Err(status::INVALID_VALUE.into());
    };
    let fit = (out.len() / wire_graph::EDGE_DATA_SIZE).min(edges.len());
    let bytes: Vec<u8> = edges[..fit].iter().flat_map(|e| e.encode()).collect();
    out.write_at(0, &bytes)
        .map_err(|_| Fault::Status(status::INVALID_VALUE))
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
            Op::GraphNodeSetParams => {
                let node = self.node(args[0])?;
                self.set_node_params(req, None, node, args[1])
            }
            Op::GraphExecNodeSetParams => {
                let (_, raw) = self.exec(args[0])?;
                let node = self.exec_node(args[0], args[1])?;
                self.set_node_params(req, Some((args[0], raw)), node, args[2])
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
            Op::GraphConditionalHandleCreate => self.conditional_handle_create(args),
            Op::GraphKernelNodeSetAttribute => self.kernel_node_set_attribute(req),
            Op::GraphKernelNodeGetAttribute => self.kernel_node_get_attribute(req),
            Op::GraphKernelNodeCopyAttributes => self.kernel_node_copy_attributes(args),
            Op::GraphNodeEnabled => {
                let (dev, exec) = self.exec(args[0])?;
                let node = self.exec_node(args[0], args[1])?;
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
                let node = self.exec_node(args[0], args[1])?;
                let (_, child) = self.graph(args[2])?;
                self.bind(dev)?;
                self.drv
                    .node_set_params(Some(exec), node, &NodeParams::Child(child), None)
                    .map_err(on(dev))?;
                // A graph's child graph node cannot take another graph: the copy cannot follow.
                self.exec_unsaveable(
                    args[0],
                    "an executable graph whose child graph was replaced \
                     (cudaGraphExecChildGraphNodeSetParams)",
                );
                ok()
            }
            Op::GraphExecSetEvent => {
                let (dev, exec) = self.exec(args[0])?;
                let node = self.exec_node(args[0], args[1])?;
                let (_, event) = self.event(args[2])?;
                self.bind(dev)?;
                let p = match self.drv.node_type(node).map_err(on(dev))? {
                    wire_graph::NODE_EVENT_RECORD => NodeParams::EventRecord(event),
                    wire_graph::NODE_WAIT_EVENT => NodeParams::EventWait(event),
                    _ => return Err(status::INVALID_VALUE.into()),
                };
                self.drv
                    .node_set_params(Some(exec), node, &p, None)
                    .map_err(on(dev))?;
                self.mirror_to_shadow(args[0], node, &p, dev);
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
            .insert(&mut self.ids, NodeEntry::new(graph, raw))
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
                    attributed: false,
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
        self.note_capture_stream(args[0]);
        ok()
    }

    /// Whether a capture the session began may still be under way.
    pub(super) fn capture_under_way(&self) -> bool {
        self.graphs.captures > 0
    }

    /// A launch with launch attributes: if a capture may be under way, its kernel node may
    /// carry them (see `GraphTables::attributed_capture`). Free otherwise.
    pub(super) fn note_launch_attributes(&mut self) {
        if self.graphs.captures > 0 {
            self.graphs.attributed_capture = true;
        }
    }

    /// A capture begun on stream `handle`: kernels captured from it take its attributes.
    fn note_capture_stream(&mut self, handle: u64) {
        if self
            .streams
            .get(handle)
            .is_some_and(|s| !s.attributes.is_empty())
        {
            self.graphs.attributed_capture = true;
        }
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
        let stream_handle = stream;
        let mode = u32::try_from(mode)
            .ok()
            .filter(|m| *m <= CAPTURE_RELAXED)
            .ok_or(status::INVALID_VALUE)?;
        let list = u64s(&read_all(req.inputs().first(), MAX_NODE_LIST * 8)?)?;
        let deps = self.nodes(&list)?;
        let edges = read_edges(req.inputs().get(1), deps.len())?;
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
            .stream_begin_capture_to_graph(stream, graph, &deps, &edges, mode)
            .map_err(on(dev))?;
        if let Some(g) = self.graphs.graphs.get_mut(graph_handle) {
            g.capture_target = true;
        }
        self.graphs.captures += 1;
        self.note_capture_stream(stream_handle);
        ok()
    }

    fn end_capture(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let (dev, stream) = self.capture_stream(args[0])?;
        let before = self.drv.stream_capture_info(stream).ok();
        let ended = self.drv.stream_end_capture(stream);
        if before.as_ref().is_some_and(|i| i.status != 0) {
            self.graphs.captures = self.graphs.captures.saturating_sub(1);
        }
        let attributed = self.graphs.attributed_capture;
        if self.graphs.captures == 0 {
            self.graphs.attributed_capture = false;
        }
        // The graph of this capture is the caller's now, or gone (failed capture).
        let old = before.and_then(|i| i.graph);
        let known = old.and_then(|g| self.graphs.graphs.find(|e| e.raw == g).map(|(h, _)| h));
        if let Some(e) = known.and_then(|h| self.graphs.graphs.get_mut(h)) {
            e.capture_target = false;
            e.attributed |= attributed;
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
                        attributed,
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
        let edges = if graph == 0 { Vec::new() } else { info.edges };
        write_u64s(req.outputs().first(), &deps)?;
        write_edges(req.outputs().get(1), &edges)?;
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
        let edges = read_edges(req.inputs().get(1), deps.len())?;
        let (dev, stream) = self.capture_stream(stream)?;
        self.drv
            .stream_update_capture_deps(stream, &deps, &edges, flags)
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
            attributed: false,
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
            .is_some_and(|g| g.capturing || g.capture_target || g.owner.is_some())
        {
            // A graph under capture is the driver's until the capture ends; a child graph or
            // conditional body goes with the node that holds it.
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
        let attributed = self.graphs.graphs.get(handle).is_some_and(|g| g.attributed);
        let entry = GraphEntry {
            dev,
            raw: copy,
            capturing: false,
            capture_target: false,
            owner: None,
            attributed,
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
        let edges = read_edges(req.inputs().get(2), deps.len())?;
        if edges.is_empty() {
            return self.add_node_after(req, graph, ty, &deps, &params);
        }
        // The driver's per-type calls take no edge data: the node comes first, then its edges,
        // and a node whose edges the driver refuses goes again, as if never added.
        let added = self.add_node_after(req, graph, ty, &[], &params)?;
        let node = added.rets[0];
        let raw = self.node(node)?;
        let (dev, graw) = self.graph(graph)?;
        let to = vec![raw; deps.len()];
        if let Err(e) = self.drv.graph_change_edges(graw, &deps, &to, &edges, false) {
            let _ = self.destroy_node(node);
            return Err(on(dev)(e));
        }
        Ok(added)
    }

    /// `GraphAddNode` of a node of type `ty` with encoded `params` after `deps` (default
    /// edges).
    fn add_node_after(
        &mut self,
        req: &Request,
        graph: u64,
        ty: u64,
        deps: &[GraphNode],
        params: &[u8],
    ) -> OpResult {
        let (gdev, graw) = self.graph(graph)?;
        if !self.graphs.nodes.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let dev = self.bind_new(req)?;
        if let (Ok(wire_graph::NODE_GRAPH), Some((child, true))) =
            (u32::try_from(ty), wire_graph::decode_child(params))
        {
            return self.add_moved_child(graph, graw, deps, child);
        }
        match u32::try_from(ty) {
            Ok(wire_graph::NODE_MEM_ALLOC) => {
                return self.add_mem_alloc_node(dev, graph, graw, deps, params)
            }
            Ok(wire_graph::NODE_CONDITIONAL) => {
                // The node runs in its graph's context, where its handle was made.
                self.bind(gdev)?;
                return self.add_conditional_node(gdev, graph, graw, deps, params);
            }
            Ok(wire_graph::NODE_MEM_FREE) => {
                let dptr = wire_graph::decode_handle(params).ok_or(status::INVALID_VALUE)?;
                if !self.context(dev)?.memory.is_graph_memory(dptr) {
                    return Err(status::INVALID_VALUE.into());
                }
                let raw = self
                    .drv
                    .graph_add_mem_free_node(graw, deps, dptr)
                    .map_err(on(dev))?;
                return ok_rets(&[self.node_handle(graph, raw)?]);
            }
            _ => {}
        }
        let raw = match self.decode_node(dev, ty, params)? {
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
                        .graph_add_kernel_node(graw, deps, k.func, &k.cfg, &mut ptrs)
                }
                .map_err(on(k.dev))?
            }
            Decoded::Other(p) => {
                let ctx = self.context(dev)?.ctx;
                self.drv
                    .graph_add_node(graw, deps, &p, ctx)
                    .map_err(on(gdev))?
            }
        };
        let h = self.node_handle(graph, raw)?;
        // A child graph node embeds a copy of its graph, attributes and all.
        let child = (u32::try_from(ty) == Ok(wire_graph::NODE_GRAPH))
            .then(|| wire_graph::decode_handle(params))
            .flatten();
        if child.is_some_and(|c| self.graphs.graphs.get(c).is_some_and(|g| g.attributed)) {
            if let Some(g) = self.graphs.graphs.get_mut(graph) {
                g.attributed = true;
            }
        }
        ok_rets(&[h])
    }

    /// `GraphConditionalHandleCreate`: a conditional handle on graph args[0], remembered with
    /// its graph so that conditional nodes name only handles of their own graph.
    fn conditional_handle_create(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let [graph, default_value, flags, ..] = args;
        let default_value = u32::try_from(default_value).map_err(|_| status::INVALID_VALUE)?;
        let flags = flags_u32(flags, COND_FLAGS)?;
        let (dev, raw) = self.graph(graph)?;
        if self.graphs.conditionals.len() >= MAX_CONDITIONALS {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let ctx = self.context(dev)?.ctx;
        let h = self
            .drv
            .conditional_handle_create(raw, ctx, default_value, flags)
            .map_err(on(dev))?;
        self.graphs.conditionals.insert(
            h,
            ConditionalEntry {
                graph,
                default_value,
                flags,
            },
        );
        ok_rets(&[h])
    }

    /// A conditional node on a handle of `graph`: its body graphs become graphs of the
    /// session, owned by `graph` (they go with it or with the node), which the guest fills
    /// with nodes or captures into. rets[0] = node, rets[1] = number of bodies.
    fn add_conditional_node(
        &mut self,
        dev: usize,
        graph: u64,
        graw: Graph,
        deps: &[GraphNode],
        params: &[u8],
    ) -> OpResult {
        let c = wire_graph::ConditionalNode::decode(params).ok_or(status::INVALID_VALUE)?;
        if self.graphs.conditionals.get(&c.handle).map(|e| e.graph) != Some(graph) {
            return Err(status::INVALID_VALUE.into());
        }
        if self.graphs.graphs.len() + c.size as usize > MAX_GRAPHS {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let ctx = self.context(dev)?.ctx;
        let (raw, bodies) = self
            .drv
            .graph_add_conditional_node(graw, deps, c.handle, c.kind, c.size, ctx)
            .map_err(on(dev))?;
        let node = self.node_handle(graph, raw)?;
        let mut handles = Vec::with_capacity(bodies.len());
        for body in bodies {
            let entry = GraphEntry {
                dev,
                raw: body,
                capturing: false,
                capture_target: false,
                owner: Some(graph),
                attributed: false,
            };
            match self.graphs.graphs.insert(&mut self.ids, entry) {
                Some(h) => handles.push(h),
                None => {
                    let _ = self.drv.destroy_node(raw);
                    for h in handles {
                        self.graphs.graphs.remove(h);
                    }
                    self.graphs.nodes.remove(node);
                    self.graphs.node_ids.remove(&raw);
                    return Err(status::MEMORY_ALLOCATION.into());
                }
            }
        }
        let count = handles.len() as u64;
        if let Some(n) = self.graphs.nodes.get_mut(node) {
            n.bodies = handles;
            n.cond = Some((c.handle, c.kind));
        }
        ok_rets(&[node, count])
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

    /// `GraphNodeSetParams` (`exec` None) and `GraphExecNodeSetParams` (`exec`: the executable
    /// graph's handle and driver value, `node` its own node): sets `node`'s parameters; an
    /// executable graph's copy follows (see `ExecEntry`).
    fn set_node_params(
        &mut self,
        req: &Request,
        exec: Option<(u64, GraphExec)>,
        node: GraphNode,
        ty: u64,
    ) -> OpResult {
        let params = read_all(req.inputs().first(), MAX_NODE_PARAMS)?;
        let dev = self.bind_new(req)?;
        let raw_exec = exec.map(|(_, raw)| raw);
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
                        .kernel_node_set_params(raw_exec, node, k.func, &k.cfg, &mut ptrs)
                }
                .map_err(on(k.dev))?;
                if let Some((handle, _)) = exec {
                    let shadow = self.graphs.execs.get(handle).and_then(|e| e.shadow);
                    let mirrored = shadow.is_none() || {
                        // SAFETY: as above.
                        unsafe {
                            self.drv
                                .kernel_node_set_params(None, node, k.func, &k.cfg, &mut ptrs)
                        }
                        .is_ok()
                    };
                    if !mirrored {
                        self.exec_unsaveable(
                            handle,
                            "an executable graph changed in a way its copy cannot follow",
                        );
                    }
                }
            }
            Decoded::Other(p) => {
                let ctx = self.context(dev)?.ctx;
                self.drv
                    .node_set_params(raw_exec, node, &p, Some(ctx))
                    .map_err(on(dev))?;
                if let Some((handle, _)) = exec {
                    self.mirror_to_shadow(handle, node, &p, dev);
                }
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
        let mut data = Vec::with_capacity(edges.len());
        for (a, b, e) in edges.iter().copied() {
            flat.push(self.node_handle(graph, a)?);
            flat.push(self.node_handle(graph, b)?);
            data.push(e);
        }
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let fit = (out.len() / 16).min(edges.len());
        write_u64s(Some(out), &flat[..fit * 2])?;
        write_edges(req.outputs().get(1), &data[..fit])?;
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
        let mut data = Vec::with_capacity(list.len());
        for (r, e) in list {
            handles.push(self.node_handle(graph, r)?);
            data.push(e);
        }
        write_u64s(req.outputs().first(), &handles)?;
        write_edges(req.outputs().get(1), &data)?;
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
        let edges = read_edges(req.inputs().get(1), from.len())?;
        let (dev, raw) = self.graph(graph)?;
        self.drv
            .graph_change_edges(raw, &from, &to, &edges, remove == 1)
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
        // Instantiated from a copy the session keeps in step (see ExecEntry). A graph with
        // conditional nodes is instantiated as it is: its handles belong to it.
        let has_conditionals = self.graphs.conditionals.values().any(|c| c.graph == graph);
        let shadow = if has_conditionals {
            None
        } else {
            self.drv.graph_clone(raw).ok()
        };
        let attributed = self.graphs.graphs.get(graph).is_some_and(|g| g.attributed);
        let unsaveable = match shadow {
            Some(_) if attributed => Some(ATTRIBUTED),
            Some(_) => None,
            None if has_conditionals => Some("executable graphs of graphs with conditional nodes"),
            None => Some("an executable graph of a graph the driver could not copy"),
        };
        let exec = match self
            .drv
            .graph_instantiate(shadow.unwrap_or(raw), flags & !INSTANTIATE_UPLOAD)
        {
            Ok(exec) => exec,
            Err(e) => {
                if let Some(copy) = shadow {
                    let _ = self.drv.graph_destroy(copy);
                }
                return Err(on(dev)(e));
            }
        };
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
                    shadow,
                    source: Some(graph),
                    nodes: HashMap::new(),
                    unsaveable,
                },
            ),
            Err(_) => None,
        };
        match (h, uploaded) {
            (Some(h), _) => ok_rets(&[h]),
            (None, r) => {
                let _ = self.drv.graph_exec_destroy(exec);
                if let Some(copy) = shadow {
                    let _ = self.drv.graph_destroy(copy);
                }
                r.map_err(on(dev))?;
                Err(status::MEMORY_ALLOCATION.into())
            }
        }
    }

    fn graph_exec_destroy(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = self.exec(handle)?;
        let result = self.drv.graph_exec_destroy(raw);
        if let Some(copy) = self.graphs.execs.remove(handle).and_then(|e| e.shadow) {
            let _ = self.drv.graph_destroy(copy);
        }
        result.map_err(on(dev))?;
        ok()
    }

    fn graph_exec_update(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let (dev, exec) = self.exec(args[0])?;
        let (_, graph) = self.graph(args[1])?;
        self.bind(dev)?;
        let (result, node) = self.drv.graph_exec_update(exec, graph).map_err(on(dev))?;
        if result == 0 {
            self.mirror_update(args[0], args[1], dev);
        }
        let node = match node {
            None => 0,
            Some(node) => self.node_handle(args[1], node)?,
        };
        ok_rets(&[u64::from(result), node])
    }

    /// The node of executable graph `exec` the guest names by node handle `node` (a node of
    /// the graph it came from): the copy's node it was instantiated from.
    fn exec_node(&mut self, exec: u64, node: u64) -> Result<GraphNode, Fault> {
        let e = self
            .graphs
            .execs
            .get(exec)
            .ok_or(Fault::Status(status::INVALID_VALUE))?;
        let Some(shadow) = e.shadow else {
            return self.node(node);
        };
        if let Some(&n) = e.nodes.get(&node) {
            return Ok(n);
        }
        let dev = e.dev;
        let raw = self.node(node)?;
        self.bind(dev)?;
        // Not a node of its graph when instantiated: the driver's own answer.
        let n = self
            .drv
            .find_in_clone(raw, shadow)
            .map_err(|_| Fault::Status(status::INVALID_VALUE))?;
        if let Some(e) = self.graphs.execs.get_mut(exec) {
            e.nodes.insert(node, n);
        }
        Ok(n)
    }

    fn exec_unsaveable(&mut self, exec: u64, why: &'static str) {
        if let Some(e) = self.graphs.execs.get_mut(exec) {
            e.unsaveable.get_or_insert(why);
        }
    }

    /// Sets `p` on the copy's `node` of executable graph `exec` (after the same change to
    /// the executable graph); if the copy cannot take it, the executable graph cannot be
    /// saved.
    fn mirror_to_shadow(&mut self, exec: u64, node: GraphNode, p: &NodeParams, dev: usize) {
        let Some(ctx) = self.context(dev).ok().map(|c| c.ctx) else {
            return;
        };
        if self
            .graphs
            .execs
            .get(exec)
            .is_some_and(|e| e.shadow.is_some())
            && self.drv.node_set_params(None, node, p, Some(ctx)).is_err()
        {
            self.exec_unsaveable(
                exec,
                "an executable graph changed in a way its copy cannot follow",
            );
        }
    }

    /// After `cudaGraphExecUpdate(exec, graph)` succeeded: the copy takes `graph`'s node
    /// parameters, node by node, when `graph` is the one the executable graph came from (its
    /// nodes pair with their own copies). An update from another graph pairs nodes the
    /// driver's way, which the session cannot follow: such an executable graph is not saved.
    fn mirror_update(&mut self, exec: u64, graph: u64, dev: usize) {
        let Some(e) = self.graphs.execs.get(exec) else {
            return;
        };
        if e.shadow.is_none() {
            return;
        }
        if self.graphs.graphs.get(graph).is_some_and(|g| g.attributed) {
            self.exec_unsaveable(exec, ATTRIBUTED);
            return;
        }
        if e.source != Some(graph) {
            self.exec_unsaveable(
                exec,
                "an executable graph updated from another graph (cudaGraphExecUpdate)",
            );
            return;
        }
        if let Err(why) = self.copy_params_to_shadow(exec, graph, dev) {
            self.exec_unsaveable(exec, why);
        }
    }

    fn copy_params_to_shadow(
        &mut self,
        exec: u64,
        graph: u64,
        dev: usize,
    ) -> Result<(), &'static str> {
        const CANNOT: &str = "an executable graph updated (cudaGraphExecUpdate) from a graph \
                              with child graph or conditional nodes";
        let (_, raw) = self.graph(graph).map_err(|_| CANNOT)?;
        let ctx = self.context(dev).map_err(|_| CANNOT)?.ctx;
        let nodes = self.drv.graph_nodes(raw, false).map_err(|_| CANNOT)?;
        for n in nodes {
            let h = self.node_handle(graph, n).map_err(|_| CANNOT)?;
            let target = self.exec_node(exec, h).map_err(|_| CANNOT)?;
            let p = match self.drv.node_type(n).map_err(|_| CANNOT)? {
                wire_graph::NODE_KERNEL => {
                    let functions = &self.functions;
                    let layout_of = |raw: Function| {
                        functions
                            .find(|f| f.raw == raw)
                            .map(|(_, f)| f.layout.clone())
                    };
                    let (func, cfg, bytes) = self
                        .drv
                        .kernel_node_params(n, &layout_of)
                        .map_err(|_| CANNOT)?;
                    let layout = layout_of(func).ok_or(CANNOT)?;
                    let mut block = AlignedBytes::zeroed(layout.block_len());
                    block.as_mut_slice().copy_from_slice(&bytes);
                    let mut ptrs = layout.pointers(&mut block).ok_or(CANNOT)?;
                    // SAFETY: one pointer per parameter of this function's own layout, each
                    // into `block`, which outlives the call; the driver copies the values.
                    unsafe {
                        self.drv
                            .kernel_node_set_params(None, target, func, &cfg, &mut ptrs)
                    }
                    .map_err(|_| CANNOT)?;
                    continue;
                }
                wire_graph::NODE_MEMCPY => {
                    NodeParams::Memcpy(self.drv.memcpy_node_params(n).map_err(|_| CANNOT)?)
                }
                wire_graph::NODE_MEMSET => {
                    NodeParams::Memset(self.drv.memset_node_params(n).map_err(|_| CANNOT)?)
                }
                wire_graph::NODE_EVENT_RECORD => {
                    NodeParams::EventRecord(self.drv.node_event(n, true).map_err(|_| CANNOT)?)
                }
                wire_graph::NODE_WAIT_EVENT => {
                    NodeParams::EventWait(self.drv.node_event(n, false).map_err(|_| CANNOT)?)
                }
                wire_graph::NODE_HOST => {
                    NodeParams::Host(self.drv.host_node_call(n).map_err(|_| CANNOT)?)
                }
                wire_graph::NODE_EMPTY => continue,
                _ => return Err(CANNOT),
            };
            self.drv
                .node_set_params(None, target, &p, Some(ctx))
                .map_err(|_| CANNOT)?;
        }
        Ok(())
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
        let entry = self.graphs.nodes.remove(handle);
        for body in entry.map(|e| e.bodies).unwrap_or_default() {
            self.graphs.graphs.remove(body);
            self.graphs.forget_nodes_of(body);
        }
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
            5 => {
                let (dptr, size) = self.drv.mem_alloc_node_params(node).map_err(on(dev))?;
                ok_rets(&[dptr, size])
            }
            6 => ok_rets(&[self.drv.mem_free_node_params(node).map_err(on(dev))?]),
            4 => {
                let body = self
                    .graphs
                    .nodes
                    .get(handle)
                    .and_then(|n| n.bodies.get(usize::try_from(clone).ok()?).copied())
                    .ok_or(status::INVALID_VALUE)?;
                ok_rets(&[body])
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
                    if let Some(copy) = e.shadow {
                        let _ = drv.graph_destroy(copy);
                    }
                }
                false
            } else {
                true
            }
        });
        let mut gone = Vec::new();
        self.graphs.graphs.retain(|g| {
            if g.dev == dev {
                if call_driver && !g.capturing && g.owner.is_none() {
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

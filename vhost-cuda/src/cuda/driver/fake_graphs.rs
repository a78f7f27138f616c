//! The fake driver's graphs (unit tests only): graphs as lists of typed nodes with edges,
//! executable graphs that count their launches, and stream capture that turns launches into
//! kernel nodes. It checks handles and capture state the way the driver does; it runs nothing.

use std::{
    collections::{HashMap, HashSet},
    ffi::c_void,
};

use qcuda_proto::graph::{EdgeData, MemcpyNode, MemsetNode};

use super::{
    fake::{check_stream, kernel_of, FakeDriver, KERNELS},
    graph::{CaptureInfo, Graph, GraphDriverApi, GraphExec, GraphNode, NodeParams},
    node_attrs::NodeAttrDriverApi,
    Context, CuError, CuResult, Event, Function, Raw, Stream,
};
use crate::cuda::launch::{LaunchConfig, ParamLayout};

const INVALID_VALUE: CuError = CuError(1);
const ILLEGAL_STATE: CuError = CuError(401);
const CAPTURE_UNSUPPORTED: CuError = CuError(900);
const CAPTURE_INVALIDATED: CuError = CuError(901);

#[derive(Debug, Clone)]
struct Node {
    graph: Graph,
    ty: u32,
    /// The event of an event node, the embedded graph of a child graph node, the function of
    /// a kernel node.
    object: Raw,
    /// A kernel node's geometry and parameter values, in order.
    kernel: Option<(LaunchConfig, Vec<Vec<u8>>)>,
    /// A memcpy or memset node's parameters.
    params: Option<NodeParams>,
    deps: Vec<GraphNode>,
    /// The edge data of dependencies whose edges are not default ones.
    edges: HashMap<GraphNode, EdgeData>,
    enabled: bool,
    /// A conditional node's body graphs.
    bodies: Vec<Graph>,
    /// A memory node's device address (and an allocation's size).
    mem: Option<(u64, u64)>,
    /// A conditional node's handle and kind.
    cond: Option<(u64, u32)>,
}

impl Node {
    /// What a launch of this node does, without the driver's own handles (events, functions
    /// and host calls differ from one driver to another): for tests to compare runs.
    fn describe(&self) -> String {
        let params = match self.params {
            Some(NodeParams::Memcpy(m)) => format!("{m:?}"),
            Some(NodeParams::Memset(m)) => format!("{m:?}"),
            _ => String::new(),
        };
        format!(
            "type {} kernel {:?} {params} enabled {} bodies {}",
            self.ty,
            self.kernel,
            self.enabled,
            self.bodies.len()
        )
    }
}

/// An executable graph: the graph it came from, its launches, and its own copy of the
/// nodes' parameters (which the executable-graph calls change, and the graph's do not).
#[derive(Debug)]
struct FakeExec {
    graph: Graph,
    launches: usize,
    nodes: HashMap<GraphNode, Node>,
}

/// A capture under way: the graph it records into and what the next captured op depends on.
#[derive(Debug)]
struct FakeCapture {
    graph: Graph,
    deps: Vec<GraphNode>,
    edges: Vec<EdgeData>,
}

/// An edge's data as the driver judges it: `to_port` 0, a default or programmatic type, a
/// kernel port; an edge that is not the default only between kernel nodes (checked where the
/// nodes are known).
fn check_edge(e: EdgeData) -> CuResult<()> {
    if e.to_port != 0 || e.kind > 1 || e.from_port > 2 {
        return Err(INVALID_VALUE);
    }
    Ok(())
}

/// `edges` for `n` dependencies (empty: default edges).
fn edges_for(n: usize, edges: &[EdgeData]) -> CuResult<Vec<EdgeData>> {
    if edges.is_empty() {
        return Ok(vec![EdgeData::DEFAULT; n]);
    }
    if edges.len() != n {
        return Err(INVALID_VALUE);
    }
    for e in edges {
        check_edge(*e)?;
    }
    Ok(edges.to_vec())
}

/// Graph state of one fake context.
#[derive(Debug, Default)]
pub(crate) struct FakeGraphs {
    /// Graph -> its nodes, in creation order.
    graphs: HashMap<Graph, Vec<GraphNode>>,
    nodes: HashMap<GraphNode, Node>,
    execs: HashMap<GraphExec, FakeExec>,
    /// What every launch ran: each node of the executable graph described, in order.
    runs: Vec<Vec<String>>,
    /// Conditional handles made so far (the driver numbers them).
    cond_made: u64,
    /// Capturing stream -> its capture.
    captures: HashMap<Raw, FakeCapture>,
    /// Captures an illegal call invalidated.
    invalidated: HashSet<Raw>,
    /// Streams capturing into a graph of the caller's (which survives a failed capture).
    into: HashSet<Raw>,
    /// Conditional handle -> the graph it was created on.
    conditionals: HashMap<u64, Graph>,
    /// Kernel node -> the launch attributes set on it (id, value).
    attributes: HashMap<GraphNode, Vec<(u32, [u8; 64])>>,
    /// Graphs that child graph nodes took (ownership moved).
    moved: HashSet<Graph>,
}

impl FakeGraphs {
    /// If `stream` is capturing, adds a node of type `ty` after the last captured one and
    /// returns true (the op is captured, not run).
    pub(crate) fn capture(&mut self, stream: Raw, ty: u32, next: &mut Raw) -> bool {
        let Some(c) = self.captures.get_mut(&stream) else {
            return false;
        };
        let (g, deps, edges) = (
            c.graph,
            std::mem::take(&mut c.deps),
            std::mem::take(&mut c.edges),
        );
        let n = self.add(g, ty, deps.clone(), next);
        if let Some(x) = self.nodes.get_mut(&n) {
            x.edges = deps
                .into_iter()
                .zip(edges)
                .filter(|(_, e)| !e.is_default())
                .collect();
        }
        if let Some(c) = self.captures.get_mut(&stream) {
            c.deps = vec![n];
            c.edges = vec![EdgeData::DEFAULT];
        }
        true
    }

    /// Synchronising or querying a capturing stream is illegal, and invalidates the capture.
    pub(crate) fn refuse_sync(&mut self, stream: Raw) -> CuResult<()> {
        if self.captures.contains_key(&stream) {
            self.invalidated.insert(stream);
            Err(CAPTURE_UNSUPPORTED)
        } else {
            Ok(())
        }
    }

    /// Executable graph launches so far.
    pub(crate) fn launches(&self) -> usize {
        self.execs.values().map(|e| e.launches).sum()
    }

    fn add(&mut self, graph: Graph, ty: u32, deps: Vec<GraphNode>, next: &mut Raw) -> GraphNode {
        *next += 0x10;
        let n = GraphNode::from_raw(*next);
        self.nodes.insert(
            n,
            Node {
                graph,
                ty,
                deps,
                edges: HashMap::new(),
                enabled: true,
                object: 0,
                kernel: None,
                params: None,
                bodies: Vec::new(),
                mem: None,
                cond: None,
            },
        );
        self.graphs.entry(graph).or_default().push(n);
        n
    }

    fn new_graph(&mut self, next: &mut Raw) -> Graph {
        *next += 0x10;
        let g = Graph::from_raw(*next);
        self.graphs.insert(g, Vec::new());
        g
    }

    /// A deep copy of `graph`: every node with its parameters, child graphs and bodies
    /// copied too, in the same order (so `find_in_clone` finds a node by its position).
    fn clone_graph(&mut self, graph: Graph, next: &mut Raw) -> CuResult<Graph> {
        self.check_graph(graph)?;
        let g = self.new_graph(next);
        let mut map = HashMap::new();
        for n in self.graphs[&graph].clone() {
            let mut x = self.nodes[&n].clone();
            x.deps = x.deps.iter().filter_map(|d| map.get(d).copied()).collect();
            x.edges = x
                .edges
                .iter()
                .filter_map(|(d, e)| Some((*map.get(d)?, *e)))
                .collect();
            if x.ty == 4 {
                x.object = self.clone_graph(Graph::from_raw(x.object), next)?.raw();
            }
            let mut bodies = Vec::new();
            for b in &x.bodies {
                bodies.push(self.clone_graph(*b, next)?);
            }
            x.bodies = bodies;
            x.graph = g;
            *next += 0x10;
            let m = GraphNode::from_raw(*next);
            self.nodes.insert(m, x);
            self.graphs.entry(g).or_default().push(m);
            map.insert(n, m);
        }
        Ok(g)
    }

    fn check_graph(&self, g: Graph) -> CuResult<()> {
        self.graphs
            .contains_key(&g)
            .then_some(())
            .ok_or(INVALID_VALUE)
    }

    fn check_nodes(&self, graph: Graph, nodes: &[GraphNode]) -> CuResult<()> {
        for n in nodes {
            match self.nodes.get(n) {
                Some(x) if x.graph == graph => {}
                _ => return Err(INVALID_VALUE),
            }
        }
        Ok(())
    }
}

impl FakeDriver {
    /// Executable graph launches in the current context.
    pub(crate) fn graph_launches(&self) -> usize {
        self.with_ctx("graph_launches", |c, _| Ok(c.graphs.launches()))
            .unwrap_or(0)
    }

    /// What each executable graph launch in the current context ran: its nodes described
    /// (type, kernel geometry and parameter values, copy and memset parameters, enabled).
    pub(crate) fn graph_runs(&self) -> Vec<Vec<String>> {
        self.with_ctx("graph_runs", |c, _| Ok(c.graphs.runs.clone()))
            .unwrap_or_default()
    }
}

impl GraphDriverApi for FakeDriver {
    fn exchange_capture_mode(&self, mode: u32) -> CuResult<u32> {
        self.with_ctx("exchange_capture_mode", |_, _| {
            if mode > 2 {
                return Err(INVALID_VALUE);
            }
            Ok(0)
        })
    }

    fn stream_begin_capture(&self, stream: Stream, mode: u32) -> CuResult<()> {
        self.with_ctx("stream_begin_capture", |c, next| {
            check_stream(c, stream.raw())?;
            if stream == Stream::NULL || mode > 2 {
                return Err(CAPTURE_UNSUPPORTED);
            }
            if c.graphs.captures.contains_key(&stream.raw()) {
                return Err(ILLEGAL_STATE);
            }
            let g = c.graphs.new_graph(next);
            c.graphs.captures.insert(
                stream.raw(),
                FakeCapture {
                    graph: g,
                    deps: Vec::new(),
                    edges: Vec::new(),
                },
            );
            Ok(())
        })
    }

    fn stream_begin_capture_to_graph(
        &self,
        stream: Stream,
        graph: Graph,
        deps: &[GraphNode],
        edges: &[EdgeData],
        mode: u32,
    ) -> CuResult<()> {
        self.with_ctx("stream_begin_capture_to_graph", |c, _| {
            check_stream(c, stream.raw())?;
            if stream == Stream::NULL || mode > 2 {
                return Err(CAPTURE_UNSUPPORTED);
            }
            c.graphs.check_graph(graph)?;
            c.graphs.check_nodes(graph, deps)?;
            let edges = edges_for(deps.len(), edges)?;
            if c.graphs.captures.contains_key(&stream.raw())
                || c.graphs.captures.values().any(|x| x.graph == graph)
            {
                return Err(ILLEGAL_STATE);
            }
            c.graphs.captures.insert(
                stream.raw(),
                FakeCapture {
                    graph,
                    deps: deps.to_vec(),
                    edges,
                },
            );
            c.graphs.into.insert(stream.raw());
            Ok(())
        })
    }

    fn stream_end_capture(&self, stream: Stream) -> CuResult<Graph> {
        self.with_ctx("stream_end_capture", |c, _| {
            check_stream(c, stream.raw())?;
            let g = c
                .graphs
                .captures
                .remove(&stream.raw())
                .ok_or(ILLEGAL_STATE)?
                .graph;
            let into = c.graphs.into.remove(&stream.raw());
            if c.graphs.invalidated.remove(&stream.raw()) {
                if !into {
                    if let Some(nodes) = c.graphs.graphs.remove(&g) {
                        for n in nodes {
                            c.graphs.nodes.remove(&n);
                        }
                    }
                }
                return Err(CAPTURE_INVALIDATED);
            }
            Ok(g)
        })
    }

    fn stream_capture_info(&self, stream: Stream) -> CuResult<CaptureInfo> {
        self.with_ctx("stream_capture_info", |c, _| {
            check_stream(c, stream.raw())?;
            Ok(match c.graphs.captures.get(&stream.raw()) {
                Some(x) => CaptureInfo {
                    status: if c.graphs.invalidated.contains(&stream.raw()) {
                        2
                    } else {
                        1
                    },
                    id: x.graph.raw() as u64,
                    graph: Some(x.graph),
                    deps: x.deps.clone(),
                    edges: x.edges.clone(),
                },
                None => CaptureInfo::default(),
            })
        })
    }

    fn stream_update_capture_deps(
        &self,
        stream: Stream,
        deps: &[GraphNode],
        edges: &[EdgeData],
        flags: u32,
    ) -> CuResult<()> {
        self.with_ctx("stream_update_capture_deps", |c, _| {
            let g = c
                .graphs
                .captures
                .get(&stream.raw())
                .ok_or(ILLEGAL_STATE)?
                .graph;
            if flags > 1 {
                return Err(INVALID_VALUE);
            }
            c.graphs.check_nodes(g, deps)?;
            let edges = edges_for(deps.len(), edges)?;
            let x = c
                .graphs
                .captures
                .get_mut(&stream.raw())
                .ok_or(ILLEGAL_STATE)?;
            if flags == 1 {
                x.deps.clear();
                x.edges.clear();
            }
            for (d, e) in deps.iter().zip(edges) {
                if !x.deps.contains(d) {
                    x.deps.push(*d);
                    x.edges.push(e);
                }
            }
            Ok(())
        })
    }

    fn graph_create(&self) -> CuResult<Graph> {
        self.with_ctx("graph_create", |c, next| Ok(c.graphs.new_graph(next)))
    }

    fn graph_destroy(&self, graph: Graph) -> CuResult<()> {
        self.with_ctx("graph_destroy", |c, _| {
            let mut gone = vec![graph];
            c.graphs.graphs.get(&graph).ok_or(INVALID_VALUE)?;
            // A conditional node's bodies go with its graph.
            while let Some(g) = gone.pop() {
                for n in c.graphs.graphs.remove(&g).unwrap_or_default() {
                    if let Some(x) = c.graphs.nodes.remove(&n) {
                        gone.extend(x.bodies);
                    }
                }
            }
            c.graphs.conditionals.retain(|_, g| *g != graph);
            Ok(())
        })
    }

    fn graph_clone(&self, graph: Graph) -> CuResult<Graph> {
        self.with_ctx("graph_clone", |c, next| c.graphs.clone_graph(graph, next))
    }

    fn graph_add_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        params: &NodeParams,
        _ctx: Context,
    ) -> CuResult<GraphNode> {
        self.with_ctx("graph_add_node", |c, next| {
            c.graphs.check_graph(graph)?;
            c.graphs.check_nodes(graph, deps)?;
            let (ty, object) = match params {
                NodeParams::Empty => (5, 0),
                NodeParams::Memcpy(_) => (1, 0),
                NodeParams::Memset(_) => (2, 0),
                // The driver embeds a copy of the graph.
                NodeParams::Child(g) => (4, c.graphs.clone_graph(*g, next)?.raw()),
                NodeParams::EventRecord(e) => (7, e.raw()),
                NodeParams::EventWait(e) => (6, e.raw()),
                NodeParams::Host(call) => (3, *call),
            };
            let n = c.graphs.add(graph, ty, deps.to_vec(), next);
            if let Some(x) = c.graphs.nodes.get_mut(&n) {
                x.object = object;
                x.params = Some(*params);
            }
            Ok(n)
        })
    }

    unsafe fn graph_add_kernel_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        func: Function,
        cfg: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> CuResult<GraphNode> {
        self.with_ctx("graph_add_kernel_node", |c, next| {
            c.graphs.check_graph(graph)?;
            c.graphs.check_nodes(graph, deps)?;
            let (_, k) = kernel_of(c, func.raw())?;
            let layout = KERNELS[k].1;
            if params.len() != layout.len() {
                return Err(INVALID_VALUE);
            }
            let values = layout
                .iter()
                .zip(params.iter())
                .map(|(&(_, size), p)| {
                    // SAFETY: the caller's contract: one readable pointer per parameter, of
                    // its size (from KERNELS).
                    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), size) }.to_vec()
                })
                .collect();
            let n = c.graphs.add(graph, 0, deps.to_vec(), next);
            if let Some(x) = c.graphs.nodes.get_mut(&n) {
                x.object = func.raw();
                x.kernel = Some((*cfg, values));
            }
            Ok(n)
        })
    }

    fn kernel_node_params(
        &self,
        node: GraphNode,
        layout_of: &dyn Fn(Function) -> Option<ParamLayout>,
    ) -> CuResult<(Function, LaunchConfig, Vec<u8>)> {
        self.with_ctx("kernel_node_params", |c, _| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            let (cfg, values) = n.kernel.clone().ok_or(INVALID_VALUE)?;
            let layout = layout_of(Function::from_raw(n.object)).ok_or(INVALID_VALUE)?;
            let mut block = vec![0u8; layout.block_len()];
            for (info, v) in layout.params().iter().zip(values) {
                let at = info.offset as usize;
                block[at..at + v.len()].copy_from_slice(&v);
            }
            Ok((Function::from_raw(n.object), cfg, block))
        })
    }

    fn graph_add_mem_alloc_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        _device: i32,
        bytesize: usize,
    ) -> CuResult<(GraphNode, u64)> {
        self.with_ctx("graph_add_mem_alloc_node", |c, next| {
            c.graphs.check_graph(graph)?;
            c.graphs.check_nodes(graph, deps)?;
            if bytesize == 0 {
                return Err(INVALID_VALUE);
            }
            let n = c.graphs.add(graph, 10, deps.to_vec(), next);
            // Graph memory lives in a range of its own, far from cuMemAlloc's.
            let dptr = 0x7000_0000_0000 + (n.raw() as u64) * 0x1_0000;
            if let Some(x) = c.graphs.nodes.get_mut(&n) {
                x.mem = Some((dptr, bytesize as u64));
            }
            Ok((n, dptr))
        })
    }

    fn graph_add_mem_free_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        dptr: u64,
    ) -> CuResult<GraphNode> {
        self.with_ctx("graph_add_mem_free_node", |c, next| {
            c.graphs.check_graph(graph)?;
            c.graphs.check_nodes(graph, deps)?;
            if dptr == 0 {
                return Err(INVALID_VALUE);
            }
            let n = c.graphs.add(graph, 11, deps.to_vec(), next);
            if let Some(x) = c.graphs.nodes.get_mut(&n) {
                x.mem = Some((dptr, 0));
            }
            Ok(n)
        })
    }

    fn node_set_params(
        &self,
        exec: Option<GraphExec>,
        node: GraphNode,
        params: &NodeParams,
        _: Option<Context>,
    ) -> CuResult<()> {
        self.with_ctx("node_set_params", |c, next| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            if exec.is_some_and(|x| c.graphs.execs.get(&x).map(|e| e.graph) != Some(n.graph)) {
                return Err(INVALID_VALUE);
            }
            let ty = match params {
                NodeParams::Empty => 5,
                NodeParams::Memcpy(_) => 1,
                NodeParams::Memset(_) => 2,
                NodeParams::Child(_) => 4,
                NodeParams::EventRecord(_) => 7,
                NodeParams::EventWait(_) => 6,
                NodeParams::Host(_) => 3,
            };
            if n.ty != ty || (exec.is_none() && ty == 4) {
                return Err(INVALID_VALUE);
            }
            let object = match params {
                NodeParams::Child(g) => c.graphs.clone_graph(*g, next)?.raw(),
                NodeParams::EventRecord(e) | NodeParams::EventWait(e) => e.raw(),
                NodeParams::Host(call) => *call,
                _ => n.object,
            };
            let target = match exec {
                None => c.graphs.nodes.get_mut(&node),
                Some(x) => c
                    .graphs
                    .execs
                    .get_mut(&x)
                    .and_then(|e| e.nodes.get_mut(&node)),
            };
            let target = target.ok_or(INVALID_VALUE)?;
            target.object = object;
            target.params = Some(*params);
            Ok(())
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
        self.with_ctx("kernel_node_set_params", |c, _| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            if exec.is_some_and(|x| c.graphs.execs.get(&x).map(|e| e.graph) != Some(n.graph)) {
                return Err(INVALID_VALUE);
            }
            if n.ty != 0 {
                return Err(INVALID_VALUE);
            }
            let (_, k) = kernel_of(c, func.raw())?;
            let layout = KERNELS[k].1;
            if params.len() != layout.len() {
                return Err(INVALID_VALUE);
            }
            let values = layout
                .iter()
                .zip(params.iter())
                .map(|(&(_, size), p)| {
                    // SAFETY: the caller's contract, as in graph_add_kernel_node.
                    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), size) }.to_vec()
                })
                .collect();
            let target = match exec {
                None => c.graphs.nodes.get_mut(&node),
                Some(x) => c
                    .graphs
                    .execs
                    .get_mut(&x)
                    .and_then(|e| e.nodes.get_mut(&node)),
            };
            let target = target.ok_or(INVALID_VALUE)?;
            target.object = func.raw();
            target.kernel = Some((*cfg, values));
            Ok(())
        })
    }

    fn graph_nodes(&self, graph: Graph, roots: bool) -> CuResult<Vec<GraphNode>> {
        self.with_ctx("graph_nodes", |c, _| {
            let nodes = c.graphs.graphs.get(&graph).ok_or(INVALID_VALUE)?;
            Ok(nodes
                .iter()
                .copied()
                .filter(|n| !roots || c.graphs.nodes[n].deps.is_empty())
                .collect())
        })
    }

    fn graph_edges(&self, graph: Graph) -> CuResult<Vec<(GraphNode, GraphNode, EdgeData)>> {
        self.with_ctx("graph_edges", |c, _| {
            let nodes = c.graphs.graphs.get(&graph).ok_or(INVALID_VALUE)?;
            Ok(nodes
                .iter()
                .flat_map(|n| {
                    let x = &c.graphs.nodes[n];
                    x.deps
                        .iter()
                        .map(move |d| (*d, *n, x.edges.get(d).copied().unwrap_or_default()))
                })
                .collect())
        })
    }

    fn graph_change_edges(
        &self,
        graph: Graph,
        from: &[GraphNode],
        to: &[GraphNode],
        edges: &[EdgeData],
        remove: bool,
    ) -> CuResult<()> {
        self.with_ctx("graph_change_edges", |c, _| {
            c.graphs.check_graph(graph)?;
            c.graphs.check_nodes(graph, from)?;
            c.graphs.check_nodes(graph, to)?;
            if from.len() != to.len() {
                return Err(INVALID_VALUE);
            }
            let edges = edges_for(from.len(), edges)?;
            // All or nothing, as the driver checks the whole list first.
            for ((f, t), e) in from.iter().zip(to).zip(&edges) {
                let kernels = c.graphs.nodes[f].ty == 0 && c.graphs.nodes[t].ty == 0;
                let has = c.graphs.nodes[t].deps.contains(f);
                if (!e.is_default() && !kernels) || has != remove {
                    return Err(INVALID_VALUE);
                }
            }
            for ((f, t), e) in from.iter().zip(to).zip(edges) {
                let x = c.graphs.nodes.get_mut(t).ok_or(INVALID_VALUE)?;
                if remove {
                    x.deps.retain(|d| d != f);
                    x.edges.remove(f);
                } else {
                    x.deps.push(*f);
                    if !e.is_default() {
                        x.edges.insert(*f, e);
                    }
                }
            }
            Ok(())
        })
    }

    fn node_type(&self, node: GraphNode) -> CuResult<u32> {
        self.with_ctx("node_type", |c, _| {
            c.graphs.nodes.get(&node).map(|n| n.ty).ok_or(INVALID_VALUE)
        })
    }

    fn node_neighbours(
        &self,
        node: GraphNode,
        dependents: bool,
    ) -> CuResult<Vec<(GraphNode, EdgeData)>> {
        self.with_ctx("node_neighbours", |c, _| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            if !dependents {
                return Ok(n
                    .deps
                    .iter()
                    .map(|d| (*d, n.edges.get(d).copied().unwrap_or_default()))
                    .collect());
            }
            Ok(c.graphs.graphs[&n.graph]
                .iter()
                .copied()
                .filter(|m| c.graphs.nodes[m].deps.contains(&node))
                .map(|m| {
                    let e = c.graphs.nodes[&m].edges.get(&node).copied();
                    (m, e.unwrap_or_default())
                })
                .collect())
        })
    }

    fn graph_instantiate(&self, graph: Graph, flags: u64) -> CuResult<GraphExec> {
        self.with_ctx("graph_instantiate", |c, next| {
            c.graphs.check_graph(graph)?;
            if flags & !0xd != 0 {
                return Err(INVALID_VALUE);
            }
            *next += 0x10;
            let exec = GraphExec::from_raw(*next);
            let nodes = c.graphs.graphs[&graph]
                .iter()
                .map(|n| (*n, c.graphs.nodes[n].clone()))
                .collect();
            c.graphs.execs.insert(
                exec,
                FakeExec {
                    graph,
                    launches: 0,
                    nodes,
                },
            );
            Ok(exec)
        })
    }

    fn graph_exec_destroy(&self, exec: GraphExec) -> CuResult<()> {
        self.with_ctx("graph_exec_destroy", |c, _| {
            c.graphs
                .execs
                .remove(&exec)
                .map(|_| ())
                .ok_or(INVALID_VALUE)
        })
    }

    fn graph_launch(&self, exec: GraphExec, stream: Stream, upload_only: bool) -> CuResult<()> {
        self.with_ctx("graph_launch", |c, next| {
            check_stream(c, stream.raw())?;
            if !c.graphs.execs.contains_key(&exec) {
                return Err(INVALID_VALUE);
            }
            if !upload_only && !c.graphs.capture(stream.raw(), 4, next) {
                let g = &mut c.graphs;
                if let Some(e) = g.execs.get_mut(&exec) {
                    e.launches += 1;
                    let order = g.graphs.get(&e.graph).cloned().unwrap_or_default();
                    let ran = order
                        .iter()
                        .filter_map(|n| e.nodes.get(n).map(Node::describe))
                        .collect();
                    g.runs.push(ran);
                }
            }
            Ok(())
        })
    }

    fn graph_exec_update(
        &self,
        exec: GraphExec,
        graph: Graph,
    ) -> CuResult<(u32, Option<GraphNode>)> {
        self.with_ctx("graph_exec_update", |c, _| {
            let old = c.graphs.execs.get(&exec).ok_or(INVALID_VALUE)?.graph;
            c.graphs.check_graph(graph)?;
            let shape = |g: Graph| -> Vec<u32> {
                c.graphs.graphs[&g]
                    .iter()
                    .map(|n| c.graphs.nodes[n].ty)
                    .collect()
            };
            if c.graphs.graphs.contains_key(&old) && shape(old) != shape(graph) {
                // cudaGraphExecUpdateErrorTopologyChanged
                return Ok((2, None));
            }
            // The nodes pair up in order; each takes the new graph's parameters and keeps its
            // enabled state.
            let pairs: Vec<(GraphNode, Node)> = c
                .graphs
                .graphs
                .get(&old)
                .into_iter()
                .flatten()
                .zip(&c.graphs.graphs[&graph])
                .map(|(o, n)| (*o, c.graphs.nodes[n].clone()))
                .collect();
            if let Some(e) = c.graphs.execs.get_mut(&exec) {
                for (o, mut n) in pairs {
                    if let Some(mine) = e.nodes.get(&o) {
                        n.enabled = mine.enabled;
                        n.deps.clone_from(&mine.deps);
                        n.graph = mine.graph;
                        e.nodes.insert(o, n);
                    }
                }
            }
            Ok((0, None))
        })
    }

    fn graph_debug_dot(&self, graph: Graph, _flags: u32) -> CuResult<Vec<u8>> {
        self.with_ctx("graph_debug_dot", |c, _| {
            let n = c.graphs.graphs.get(&graph).ok_or(INVALID_VALUE)?.len();
            Ok(format!("digraph fake {{ nodes={n} }}\n").into_bytes())
        })
    }

    fn graph_mem(&self, _device: i32, what: u32, attr: u32, value: u64) -> CuResult<u64> {
        self.with_ctx("graph_mem", |_, _| match (what, attr) {
            (0, _) | (1, 0..=3) => Ok(0),
            (2, 1 | 3) if value == 0 => Ok(0),
            _ => Err(INVALID_VALUE),
        })
    }

    fn conditional_handle_create(
        &self,
        graph: Graph,
        _ctx: Context,
        _default_value: u32,
        flags: u32,
    ) -> CuResult<u64> {
        self.with_ctx("conditional_handle_create", |c, _| {
            c.graphs.check_graph(graph)?;
            if flags > 1 {
                return Err(INVALID_VALUE);
            }
            // Numbered in order of creation in the context (so a context that makes its
            // handles in the same order gets the same values).
            c.graphs.cond_made += 1;
            let h = 0xc0d0_0000_0000_0000 | c.graphs.cond_made;
            c.graphs.conditionals.insert(h, graph);
            Ok(h)
        })
    }

    fn graph_add_conditional_node(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        handle: u64,
        kind: u32,
        size: u32,
        _ctx: Context,
    ) -> CuResult<(GraphNode, Vec<Graph>)> {
        self.with_ctx("graph_add_conditional_node", |c, next| {
            c.graphs.check_graph(graph)?;
            c.graphs.check_nodes(graph, deps)?;
            if c.graphs.conditionals.get(&handle) != Some(&graph) || kind > 2 || size == 0 {
                return Err(INVALID_VALUE);
            }
            let bodies: Vec<Graph> = (0..size).map(|_| c.graphs.new_graph(next)).collect();
            let n = c.graphs.add(graph, 13, deps.to_vec(), next);
            if let Some(x) = c.graphs.nodes.get_mut(&n) {
                x.bodies.clone_from(&bodies);
                x.cond = Some((handle, kind));
            }
            Ok((n, bodies))
        })
    }

    fn mem_alloc_node_params(&self, node: GraphNode) -> CuResult<(u64, u64)> {
        self.with_ctx("mem_alloc_node_params", |c, _| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            match (n.ty, n.mem) {
                (10, Some(m)) => Ok(m),
                _ => Err(INVALID_VALUE),
            }
        })
    }

    fn mem_free_node_params(&self, node: GraphNode) -> CuResult<u64> {
        self.with_ctx("mem_free_node_params", |c, _| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            match (n.ty, n.mem) {
                (11, Some((d, _))) => Ok(d),
                _ => Err(INVALID_VALUE),
            }
        })
    }

    fn memcpy_node_params(&self, node: GraphNode) -> CuResult<MemcpyNode> {
        self.with_ctx("memcpy_node_params", |c, _| {
            match c.graphs.nodes.get(&node).and_then(|n| n.params) {
                Some(NodeParams::Memcpy(m)) => Ok(m),
                _ => Err(INVALID_VALUE),
            }
        })
    }

    fn memset_node_params(&self, node: GraphNode) -> CuResult<MemsetNode> {
        self.with_ctx("memset_node_params", |c, _| {
            match c.graphs.nodes.get(&node).and_then(|n| n.params) {
                Some(NodeParams::Memset(m)) => Ok(m),
                _ => Err(INVALID_VALUE),
            }
        })
    }

    fn node_event(&self, node: GraphNode, record: bool) -> CuResult<Event> {
        self.with_ctx("node_event", |c, _| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            (n.ty == if record { 7 } else { 6 })
                .then_some(Event::from_raw(n.object))
                .ok_or(INVALID_VALUE)
        })
    }

    fn find_in_clone(&self, node: GraphNode, clone: Graph) -> CuResult<GraphNode> {
        self.with_ctx("find_in_clone", |c, _| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            let i = c.graphs.graphs[&n.graph]
                .iter()
                .position(|m| *m == node)
                .ok_or(INVALID_VALUE)?;
            c.graphs
                .graphs
                .get(&clone)
                .and_then(|nodes| nodes.get(i).copied())
                .ok_or(INVALID_VALUE)
        })
    }

    fn destroy_node(&self, node: GraphNode) -> CuResult<()> {
        self.with_ctx("destroy_node", |c, _| {
            let n = c.graphs.nodes.remove(&node).ok_or(INVALID_VALUE)?;
            if let Some(list) = c.graphs.graphs.get_mut(&n.graph) {
                list.retain(|m| *m != node);
            }
            for other in c.graphs.nodes.values_mut() {
                other.deps.retain(|d| *d != node);
            }
            Ok(())
        })
    }

    fn child_graph(&self, node: GraphNode) -> CuResult<Graph> {
        self.with_ctx("child_graph", |c, _| {
            let n = c.graphs.nodes.get(&node).ok_or(INVALID_VALUE)?;
            (n.ty == 4)
                .then_some(Graph::from_raw(n.object))
                .ok_or(INVALID_VALUE)
        })
    }

    fn node_enabled(&self, exec: GraphExec, node: GraphNode, set: Option<bool>) -> CuResult<bool> {
        self.with_ctx("node_enabled", |c, _| {
            let e = c.graphs.execs.get_mut(&exec).ok_or(INVALID_VALUE)?;
            let n = e.nodes.get_mut(&node).ok_or(INVALID_VALUE)?;
            if let Some(on) = set {
                n.enabled = on;
            }
            Ok(n.enabled)
        })
    }

    fn host_node_call(&self, node: GraphNode) -> CuResult<Raw> {
        self.with_ctx("host_node_call", |c, _| {
            match c.graphs.nodes.get(&node).and_then(|n| n.params) {
                Some(NodeParams::Host(call)) => Ok(call),
                _ => Err(INVALID_VALUE),
            }
        })
    }
}

/// The launch attributes a kernel node takes (cuda.h: "valid for graph nodes").
const NODE_ATTRIBUTES: &[u32] = &[1, 2, 4, 5, 8, 9, 10, 11, 14, 16];

impl FakeGraphs {
    /// A kernel node, or INVALID_VALUE.
    fn kernel_node(&self, node: GraphNode) -> CuResult<()> {
        match self.nodes.get(&node) {
            Some(n) if n.ty == 0 => Ok(()),
            _ => Err(INVALID_VALUE),
        }
    }
}

impl NodeAttrDriverApi for FakeDriver {
    fn kernel_node_set_attribute(
        &self,
        node: GraphNode,
        id: u32,
        value: &[u8; 64],
    ) -> CuResult<()> {
        self.with_ctx("kernel_node_set_attribute", |c, _| {
            c.graphs.kernel_node(node)?;
            if !NODE_ATTRIBUTES.contains(&id) {
                return Err(INVALID_VALUE);
            }
            let list = c.graphs.attributes.entry(node).or_default();
            list.retain(|(i, _)| *i != id);
            list.push((id, *value));
            Ok(())
        })
    }

    fn kernel_node_get_attribute(&self, node: GraphNode, id: u32) -> CuResult<[u8; 64]> {
        self.with_ctx("kernel_node_get_attribute", |c, _| {
            c.graphs.kernel_node(node)?;
            if !NODE_ATTRIBUTES.contains(&id) {
                return Err(INVALID_VALUE);
            }
            Ok(c.graphs
                .attributes
                .get(&node)
                .and_then(|l| l.iter().find(|(i, _)| *i == id))
                .map_or([0; 64], |(_, v)| *v))
        })
    }

    fn kernel_node_copy_attributes(&self, dst: GraphNode, src: GraphNode) -> CuResult<()> {
        self.with_ctx("kernel_node_copy_attributes", |c, _| {
            c.graphs.kernel_node(dst)?;
            c.graphs.kernel_node(src)?;
            let from = c.graphs.attributes.get(&src).cloned().unwrap_or_default();
            c.graphs.attributes.insert(dst, from);
            Ok(())
        })
    }

    fn graph_add_child_moved(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        child: Graph,
    ) -> CuResult<GraphNode> {
        self.with_ctx("graph_add_child_moved", |c, next| {
            c.graphs.check_graph(graph)?;
            c.graphs.check_graph(child)?;
            c.graphs.check_nodes(graph, deps)?;
            if graph == child || c.graphs.moved.contains(&child) {
                return Err(INVALID_VALUE);
            }
            // The node holds the graph itself, not a copy.
            let n = c.graphs.add(graph, 4, deps.to_vec(), next);
            if let Some(x) = c.graphs.nodes.get_mut(&n) {
                x.object = child.raw();
                x.params = Some(NodeParams::Child(child));
            }
            c.graphs.moved.insert(child);
            Ok(n)
        })
    }
}

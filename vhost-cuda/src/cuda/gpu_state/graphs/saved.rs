//! Graphs and executable graphs in a saved state (`saved_state/graphs.rs` holds the records).
//!
//! A capture reads every graph back from the driver (its nodes, their types and parameters,
//! its edges) and names everything by the program's handles: kernel nodes by function
//! handle, event nodes by event handle, host nodes by the guest's key, copies and memsets by
//! device address (addresses keep their values across a restore). Every node of the
//! program's graphs gets a handle if it has none yet, so that a restore can put each node
//! back under the handle the guest may hold. An executable graph is saved as its copy (see
//! `ExecEntry`), with the handles of the nodes that name its nodes, its disabled nodes and
//! its flags; a restore instantiates the copy again.
//!
//! What the record cannot make again is refused by name: memory nodes, copies to or from host
//! memory or arrays, kernel nodes that may carry launch attributes, conditional nodes the guest
//! did not add itself, executable graphs that are device-launchable, hold conditional nodes
//! or were changed in a way their copy could not follow. Conditional handles are the driver's
//! values, which kernels take as arguments: a restore that gets another value refuses.

use std::collections::{HashMap, VecDeque};

use qcuda_proto::graph::{self as wire_graph, KernelNode};

use super::*;
use crate::cuda::{
    gpu_state::CheckpointError,
    host_functions::HostFunctions,
    saved_state::{
        GraphRole, SavedConditional, SavedExec, SavedGraph, SavedNode, SavedNodeKind, SavedState,
    },
};

/// cudaGraphInstantiateFlagDeviceLaunch.
const INSTANTIATE_DEVICE_LAUNCH: u64 = 4;
/// Ids of graphs with no handle (executable graphs' copies and what they hold) start here,
/// far above any handle.
const PRIVATE_IDS: u64 = 1 << 63;

const NODE_KINDS_REFUSED: &str = "graph nodes of a kind a saved state cannot hold (external \
                                  semaphores, batched memory operations)";

type Saved<T> = Result<T, CheckpointError>;

fn unsupported(what: &'static str) -> CheckpointError {
    CheckpointError::Unsupported(what)
}

fn mismatch(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Mismatch(what.into())
}

/// A node's index in its graph (a session holds at most `MAX_NODES`).
fn index_u32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

fn dev_u32(dev: usize) -> u32 {
    u32::try_from(dev).unwrap_or(u32::MAX)
}

/// A graph still to be read: its id, driver graph, device and role.
type Pending = (u64, Graph, usize, GraphRole);

/// What a capture of the graphs gives.
pub(in crate::cuda::gpu_state) type SavedGraphs =
    (Vec<SavedGraph>, Vec<SavedConditional>, Vec<SavedExec>);

impl GpuState {
    /// Reads every graph and executable graph of the state (see the module documentation).
    pub(in crate::cuda::gpu_state) fn capture_graphs(&mut self) -> Saved<SavedGraphs> {
        if self.graphs.graphs.values().any(|g| g.attributed) {
            return Err(unsupported(ATTRIBUTED));
        }
        let mut out = Vec::new();
        let mut private = PRIVATE_IDS;
        let mut tops: Vec<(u64, usize, Graph)> = self
            .graphs
            .graphs
            .iter()
            .filter(|(_, g)| g.owner.is_none())
            .map(|(h, g)| (h, g.dev, g.raw))
            .collect();
        tops.sort_unstable_by_key(|t| t.0);
        for (h, dev, raw) in tops {
            self.capture_graph_tree((h, raw, dev, GraphRole::Session), &mut out, &mut private)?;
        }
        let mut conditionals: Vec<SavedConditional> = self
            .graphs
            .conditionals
            .iter()
            .map(|(&handle, c)| SavedConditional {
                handle,
                graph: c.graph,
                default_value: c.default_value,
                flags: c.flags,
            })
            .collect();
        conditionals.sort_unstable_by_key(|c| c.handle);
        let mut handles: Vec<u64> = self.graphs.execs.iter().map(|(h, _)| h).collect();
        handles.sort_unstable();
        let mut execs = Vec::with_capacity(handles.len());
        for h in handles {
            execs.push(self.capture_exec(h, &mut out, &mut private)?);
        }
        Ok((out, conditionals, execs))
    }

    /// Reads graph `first` and every graph its nodes hold (and theirs), without recursion;
    /// returns the driver nodes of `first` in saved order.
    fn capture_graph_tree(
        &mut self,
        first: Pending,
        out: &mut Vec<SavedGraph>,
        private: &mut u64,
    ) -> Saved<Vec<GraphNode>> {
        let mut queue = VecDeque::from([first]);
        let mut first_order = None;
        while let Some(p) = queue.pop_front() {
            let (saved, order) = self.capture_graph(p, &mut queue, private)?;
            out.push(saved);
            first_order.get_or_insert(order);
        }
        Ok(first_order.unwrap_or_default())
    }

    /// Reads one graph; the graphs its nodes hold go to `queue`.
    fn capture_graph(
        &mut self,
        (id, raw, dev, role): Pending,
        queue: &mut VecDeque<Pending>,
        private: &mut u64,
    ) -> Saved<(SavedGraph, Vec<GraphNode>)> {
        self.bind(dev)?;
        let nodes = self.drv.graph_nodes(raw, false).map_err(on(dev))?;
        let edged = self.drv.graph_edges(raw).map_err(on(dev))?;
        if edged.iter().any(|(_, _, e)| !e.is_default()) {
            return Err(unsupported(
                "graphs with programmatic edges (programmatic dependent launch)",
            ));
        }
        let edges: Vec<(GraphNode, GraphNode)> = edged.iter().map(|&(a, b, _)| (a, b)).collect();
        let order =
            topological(&nodes, &edges).ok_or_else(|| mismatch(format!("graph {id}'s edges")))?;
        let index: HashMap<GraphNode, u32> = order
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, index_u32(i)))
            .collect();
        let mut deps: HashMap<GraphNode, Vec<u32>> = HashMap::new();
        for (from, to) in &edges {
            let i = *index.get(from).ok_or_else(|| mismatch("an edge"))?;
            deps.entry(*to).or_default().push(i);
        }
        let mut saved = Vec::with_capacity(order.len());
        for &n in &order {
            let handle = match role {
                GraphRole::Private => 0,
                _ => self.node_handle(id, n)?,
            };
            let kind = self.capture_node(id, dev, role, handle, n, queue, private)?;
            let mut d = deps.remove(&n).unwrap_or_default();
            d.sort_unstable();
            d.dedup();
            saved.push(SavedNode {
                handle,
                kind,
                deps: d,
            });
        }
        Ok((
            SavedGraph {
                id,
                dev: dev_u32(dev),
                role,
                nodes: saved,
            },
            order,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn capture_node(
        &mut self,
        graph: u64,
        dev: usize,
        role: GraphRole,
        handle: u64,
        n: GraphNode,
        queue: &mut VecDeque<Pending>,
        private: &mut u64,
    ) -> Saved<SavedNodeKind> {
        let ty = self.drv.node_type(n).map_err(on(dev))?;
        let kind = self.capture_node_kind(graph, dev, role, handle, n, ty, queue, private)?;
        if let SavedNodeKind::Plain { params, .. } = &kind {
            // A restore checks copies and memsets against the program's memory as the
            // guest's own: one on memory freed since (CUDA lets a graph keep it while it is
            // not launched) would fail it, so the save refuses it now.
            if matches!(ty, wire_graph::NODE_MEMCPY | wire_graph::NODE_MEMSET)
                && self.decode_node(dev, u64::from(ty), params).is_err()
            {
                return Err(unsupported(
                    "graph copies or memsets of memory the program has freed",
                ));
            }
        }
        Ok(kind)
    }

    #[allow(clippy::too_many_arguments)]
    fn capture_node_kind(
        &mut self,
        graph: u64,
        dev: usize,
        role: GraphRole,
        handle: u64,
        n: GraphNode,
        ty: u32,
        queue: &mut VecDeque<Pending>,
        private: &mut u64,
    ) -> Saved<SavedNodeKind> {
        let plain = |params: Vec<u8>| SavedNodeKind::Plain { ty, params };
        Ok(match ty {
            wire_graph::NODE_KERNEL => {
                let functions = &self.functions;
                let layout_of = |raw: Function| {
                    functions
                        .find(|f| f.raw == raw)
                        .map(|(_, f)| f.layout.clone())
                };
                let (func, cfg, block) =
                    self.drv.kernel_node_params(n, &layout_of).map_err(|_| {
                        unsupported("kernel nodes of functions the program did not get")
                    })?;
                let (function, _) = self.functions.find(|f| f.raw == func).ok_or_else(|| {
                    unsupported("kernel nodes of functions the program did not get")
                })?;
                let mut enc = vec![0u8; wire_graph::KERNEL_NODE_HEADER + block.len()];
                KernelNode {
                    function,
                    grid: cfg.grid,
                    block: cfg.block,
                    shared_mem: cfg.shared_mem,
                    params: &block,
                }
                .encode(&mut enc);
                plain(enc)
            }
            wire_graph::NODE_MEMCPY => match self.drv.memcpy_node_params(n) {
                Ok(m) => plain(m.encode().to_vec()),
                Err(e) if e == CuError::NOT_SUPPORTED => {
                    return Err(unsupported(
                        "graph copies to or from host memory or CUDA arrays",
                    ))
                }
                Err(e) => return Err(on(dev)(e).into()),
            },
            wire_graph::NODE_MEMSET => plain(
                self.drv
                    .memset_node_params(n)
                    .map_err(on(dev))?
                    .encode()
                    .to_vec(),
            ),
            wire_graph::NODE_EVENT_RECORD | wire_graph::NODE_WAIT_EVENT => {
                let record = ty == wire_graph::NODE_EVENT_RECORD;
                let raw = self.drv.node_event(n, record).map_err(on(dev))?;
                let (event, _) = self.events.find(|e| e.raw == raw).ok_or_else(|| {
                    unsupported("graph event nodes whose event the program destroyed")
                })?;
                plain(event.to_le_bytes().to_vec())
            }
            wire_graph::NODE_HOST => {
                let call = self.drv.host_node_call(n).map_err(on(dev))?;
                if !self.captured_calls.contains(&call) {
                    return Err(unsupported("host nodes the worker did not make"));
                }
                // SAFETY: one of the session's captured calls, freed only when it ends.
                let key = unsafe { HostFunctions::key_of(call as *const std::ffi::c_void) };
                plain(key.to_le_bytes().to_vec())
            }
            wire_graph::NODE_EMPTY => plain(Vec::new()),
            wire_graph::NODE_GRAPH => {
                let child = self.drv.child_graph(n).map_err(on(dev))?;
                let (id, held_role) = match role {
                    GraphRole::Private => {
                        *private += 1;
                        (*private, GraphRole::Private)
                    }
                    _ => (
                        self.captured_graph_handle(dev, child, Some(graph))?,
                        GraphRole::Held,
                    ),
                };
                queue.push_back((id, child, dev, held_role));
                SavedNodeKind::Child { graph: id }
            }
            wire_graph::NODE_CONDITIONAL => {
                let entry = match role {
                    GraphRole::Private => None,
                    _ => self.graphs.nodes.get(handle),
                };
                let Some((cond_handle, kind)) = entry.and_then(|e| e.cond) else {
                    return Err(unsupported(
                        "conditional nodes the program did not add itself (captured or cloned)",
                    ));
                };
                let bodies = entry.map(|e| e.bodies.clone()).unwrap_or_default();
                for &b in &bodies {
                    let raw = self
                        .graphs
                        .graphs
                        .get(b)
                        .map(|g| g.raw)
                        .ok_or_else(|| mismatch("a conditional node's body"))?;
                    queue.push_back((b, raw, dev, GraphRole::Held));
                }
                SavedNodeKind::Conditional {
                    handle: cond_handle,
                    kind,
                    bodies,
                }
            }
            wire_graph::NODE_MEM_ALLOC | wire_graph::NODE_MEM_FREE => {
                return Err(unsupported(
                    "graph memory nodes (cudaGraphAddMemAllocNode, cudaGraphAddMemFreeNode)",
                ))
            }
            _ => return Err(unsupported(NODE_KINDS_REFUSED)),
        })
    }

    fn capture_exec(
        &mut self,
        handle: u64,
        out: &mut Vec<SavedGraph>,
        private: &mut u64,
    ) -> Saved<SavedExec> {
        let e = self
            .graphs
            .execs
            .get(handle)
            .ok_or_else(|| mismatch("an executable graph"))?;
        if e.flags & INSTANTIATE_DEVICE_LAUNCH != 0 {
            return Err(unsupported(
                "device-launchable executable graphs (kernels hold their driver handle)",
            ));
        }
        if let Some(why) = e.unsaveable {
            return Err(unsupported(why));
        }
        let (dev, raw, flags, source) = (e.dev, e.raw, e.flags, e.source);
        let shadow = e
            .shadow
            .ok_or_else(|| mismatch("an executable graph's copy"))?;
        let mut named: Vec<(u64, GraphNode)> = e.nodes.iter().map(|(&h, &n)| (h, n)).collect();
        let source = source.filter(|&s| self.graphs.graphs.get(s).is_some());
        *private += 1;
        let id = *private;
        let order = self.capture_graph_tree((id, shadow, dev, GraphRole::Private), out, private)?;
        let index: HashMap<GraphNode, u32> = order
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, index_u32(i)))
            .collect();
        // Every node of its graph the guest can name: those named so far, and the others
        // the driver finds in the copy (nodes added since are not the executable graph's).
        if let Some(src) = source {
            let mut known: Vec<(u64, GraphNode)> = self
                .graphs
                .nodes
                .iter()
                .filter(|(h, n)| n.graph == src && !named.iter().any(|(k, _)| k == h))
                .map(|(h, n)| (h, n.raw))
                .collect();
            known.sort_unstable_by_key(|k| k.0);
            self.bind(dev)?;
            for (h, n) in known {
                if let Ok(copy) = self.drv.find_in_clone(n, shadow) {
                    named.push((h, copy));
                }
            }
        }
        named.sort_unstable_by_key(|k| k.0);
        let nodes = named
            .iter()
            .filter_map(|(h, n)| Some((*h, *index.get(n)?)))
            .collect();
        let mut disabled = Vec::new();
        self.bind(dev)?;
        for (i, &n) in order.iter().enumerate() {
            let ty = self.drv.node_type(n).map_err(on(dev))?;
            // The node types that can be disabled.
            if matches!(
                ty,
                wire_graph::NODE_KERNEL | wire_graph::NODE_MEMCPY | wire_graph::NODE_MEMSET
            ) && !self.drv.node_enabled(raw, n, None).map_err(on(dev))?
            {
                disabled.push(index_u32(i));
            }
        }
        Ok(SavedExec {
            handle,
            dev: dev_u32(dev),
            flags,
            source: source.unwrap_or(0),
            graph: id,
            nodes,
            disabled,
        })
    }

    /// Makes the saved graphs, conditional handles and executable graphs again under their
    /// handles (after memory, modules, streams and events, which nodes name).
    pub(in crate::cuda::gpu_state) fn restore_graphs(&mut self, saved: &SavedState) -> Saved<()> {
        let by_id: HashMap<u64, &SavedGraph> = saved.graphs.iter().map(|g| (g.id, g)).collect();
        let mut conds: HashMap<u64, Vec<&SavedConditional>> = HashMap::new();
        for c in &saved.conditionals {
            conds.entry(c.graph).or_default().push(c);
        }
        for g in saved.graphs.iter().filter(|g| g.role == GraphRole::Session) {
            let dev = self.saved_graph_dev(g.dev)?;
            let raw = self.drv.graph_create().map_err(on(dev))?;
            let entry = GraphEntry {
                dev,
                raw,
                capturing: false,
                capture_target: false,
                owner: None,
                attributed: false,
            };
            if !self.graphs.graphs.insert_at(&self.ids, g.id, entry) {
                let _ = self.drv.graph_destroy(raw);
                return Err(mismatch(format!("graph handle {}", g.id)));
            }
            self.restore_graph_tree(g.id, raw, dev, &by_id, &conds)?;
        }
        for e in &saved.execs {
            let dev = self.saved_graph_dev(e.dev)?;
            if e.flags & !INSTANTIATE_FLAGS != 0 || e.flags & INSTANTIATE_DEVICE_LAUNCH != 0 {
                return Err(mismatch(format!("executable graph {}'s flags", e.handle)));
            }
            if e.source != 0 && self.graphs.graphs.get(e.source).is_none() {
                return Err(mismatch(format!("executable graph {}'s graph", e.handle)));
            }
            let copy = self.drv.graph_create().map_err(on(dev))?;
            let order = match self.restore_graph_tree(e.graph, copy, dev, &by_id, &conds) {
                Ok(order) => order,
                Err(err) => {
                    let _ = self.drv.graph_destroy(copy);
                    return Err(err);
                }
            };
            let exec = match self
                .drv
                .graph_instantiate(copy, e.flags & !INSTANTIATE_UPLOAD)
            {
                Ok(exec) => exec,
                Err(err) => {
                    let _ = self.drv.graph_destroy(copy);
                    return Err(on(dev)(err).into());
                }
            };
            let entry = ExecEntry {
                dev,
                raw: exec,
                flags: e.flags,
                shadow: Some(copy),
                source: (e.source != 0).then_some(e.source),
                nodes: e
                    .nodes
                    .iter()
                    .filter_map(|&(h, i)| Some((h, *order.get(i as usize)?)))
                    .collect(),
                unsaveable: None,
            };
            if !self.graphs.execs.insert_at(&self.ids, e.handle, entry) {
                let _ = self.drv.graph_exec_destroy(exec);
                let _ = self.drv.graph_destroy(copy);
                return Err(mismatch(format!("executable graph handle {}", e.handle)));
            }
            for &i in &e.disabled {
                let n = *order
                    .get(i as usize)
                    .ok_or_else(|| mismatch("a disabled node"))?;
                self.drv
                    .node_enabled(exec, n, Some(false))
                    .map_err(on(dev))?;
            }
        }
        Ok(())
    }

    fn saved_graph_dev(&mut self, dev: u32) -> Saved<usize> {
        let d = usize::try_from(dev)
            .ok()
            .filter(|&d| d < self.devices.len() && matches!(self.devices.get(d), Some(Some(_))))
            .ok_or_else(|| mismatch(format!("a graph on device {dev}")))?;
        self.bind(d)?;
        Ok(d)
    }

    /// Fills driver graph `raw` (made already) with saved graph `id`, and every graph its
    /// nodes hold with theirs, without recursion; returns `id`'s driver nodes in saved order.
    fn restore_graph_tree(
        &mut self,
        id: u64,
        raw: Graph,
        dev: usize,
        by_id: &HashMap<u64, &SavedGraph>,
        conds: &HashMap<u64, Vec<&SavedConditional>>,
    ) -> Saved<Vec<GraphNode>> {
        let mut queue = VecDeque::from([(id, raw)]);
        let mut first = None;
        while let Some((gid, graw)) = queue.pop_front() {
            let g = by_id
                .get(&gid)
                .ok_or_else(|| mismatch(format!("graph {gid}")))?;
            if g.dev != dev_u32(dev) {
                return Err(mismatch(format!("graph {gid}'s device")));
            }
            let order = self.restore_graph(g, graw, dev, conds, &mut queue)?;
            first.get_or_insert(order);
        }
        Ok(first.unwrap_or_default())
    }

    fn restore_graph(
        &mut self,
        g: &SavedGraph,
        raw: Graph,
        dev: usize,
        conds: &HashMap<u64, Vec<&SavedConditional>>,
        queue: &mut VecDeque<(u64, Graph)>,
    ) -> Saved<Vec<GraphNode>> {
        let registered = g.role != GraphRole::Private;
        self.bind(dev)?;
        let ctx = self.context(dev)?.ctx;
        for c in conds.get(&g.id).into_iter().flatten() {
            if !registered {
                return Err(mismatch(
                    "a conditional handle of an executable graph's copy",
                ));
            }
            let value = self
                .drv
                .conditional_handle_create(
                    raw,
                    ctx,
                    c.default_value,
                    flags_u32(u64::from(c.flags), COND_FLAGS)?,
                )
                .map_err(on(dev))?;
            if value != c.handle {
                // Kernels hold the value (cudaGraphSetConditional's argument): another one
                // would leave them setting a handle that is not there.
                return Err(mismatch(format!(
                    "conditional handle {:#x} came back as {value:#x}",
                    c.handle
                )));
            }
            if self.graphs.conditionals.len() >= MAX_CONDITIONALS {
                return Err(mismatch("too many conditional handles"));
            }
            self.graphs.conditionals.insert(
                value,
                ConditionalEntry {
                    graph: g.id,
                    default_value: c.default_value,
                    flags: c.flags,
                },
            );
        }
        let mut made: Vec<GraphNode> = Vec::with_capacity(g.nodes.len());
        for n in &g.nodes {
            let deps: Vec<GraphNode> = n
                .deps
                .iter()
                .map(|&i| made.get(i as usize).copied())
                .collect::<Option<_>>()
                .ok_or_else(|| mismatch("a node's dependencies"))?;
            let (mut bodies_of, mut cond) = (Vec::new(), None);
            let node = match &n.kind {
                SavedNodeKind::Plain { ty, params } => {
                    self.restore_plain_node(dev, raw, &deps, *ty, params, ctx)?
                }
                SavedNodeKind::Child { graph } => {
                    // The driver embeds a copy of the graph it is given: an empty one, filled
                    // in place afterwards (changes to a child graph node's graph are its own).
                    let empty = self.drv.graph_create().map_err(on(dev))?;
                    let added = self
                        .drv
                        .graph_add_node(raw, &deps, &NodeParams::Child(empty), ctx);
                    let _ = self.drv.graph_destroy(empty);
                    let node = added.map_err(on(dev))?;
                    let held = self.drv.child_graph(node).map_err(on(dev))?;
                    if registered {
                        self.register_held(*graph, dev, held, g.id)?;
                    }
                    queue.push_back((*graph, held));
                    node
                }
                SavedNodeKind::Conditional {
                    handle,
                    kind,
                    bodies,
                } => {
                    if !registered
                        || self.graphs.conditionals.get(handle).map(|c| c.graph) != Some(g.id)
                    {
                        return Err(mismatch(format!("conditional node on handle {handle:#x}")));
                    }
                    let size = u32::try_from(bodies.len()).map_err(|_| mismatch("bodies"))?;
                    let (node, held) = self
                        .drv
                        .graph_add_conditional_node(raw, &deps, *handle, *kind, size, ctx)
                        .map_err(on(dev))?;
                    if held.len() != bodies.len() {
                        return Err(mismatch("a conditional node's bodies"));
                    }
                    for (&b, &body) in bodies.iter().zip(&held) {
                        self.register_held(b, dev, body, g.id)?;
                        queue.push_back((b, body));
                    }
                    bodies_of.clone_from(bodies);
                    cond = Some((*handle, *kind));
                    node
                }
            };
            if registered {
                let entry = NodeEntry {
                    bodies: bodies_of,
                    cond,
                    ..NodeEntry::new(g.id, node)
                };
                if !self.graphs.nodes.insert_at(&self.ids, n.handle, entry) {
                    return Err(mismatch(format!("node handle {}", n.handle)));
                }
                self.graphs.node_ids.insert(node, n.handle);
            }
            made.push(node);
        }
        Ok(made)
    }

    fn restore_plain_node(
        &mut self,
        dev: usize,
        graph: Graph,
        deps: &[GraphNode],
        ty: u32,
        params: &[u8],
        ctx: Context,
    ) -> Saved<GraphNode> {
        // Checked as the guest's own node would be.
        Ok(match self.decode_node(dev, u64::from(ty), params)? {
            Decoded::Kernel(mut k) => {
                if k.dev != dev {
                    return Err(mismatch("a kernel node of another device's function"));
                }
                let mut ptrs = k
                    .layout
                    .pointers(&mut k.block)
                    .ok_or_else(|| mismatch("a kernel node's parameters"))?;
                // SAFETY: as in graph_add_node.
                unsafe {
                    self.drv
                        .graph_add_kernel_node(graph, deps, k.func, &k.cfg, &mut ptrs)
                }
                .map_err(on(dev))?
            }
            Decoded::Other(p) => self
                .drv
                .graph_add_node(graph, deps, &p, ctx)
                .map_err(on(dev))?,
        })
    }

    /// Puts graph `raw`, held by a node of graph `owner`, under handle `id`.
    fn register_held(&mut self, id: u64, dev: usize, raw: Graph, owner: u64) -> Saved<()> {
        let entry = GraphEntry {
            dev,
            raw,
            capturing: false,
            capture_target: false,
            owner: Some(owner),
            attributed: false,
        };
        if self.graphs.graphs.insert_at(&self.ids, id, entry) {
            Ok(())
        } else {
            Err(mismatch(format!("graph handle {id}")))
        }
    }
}

/// `nodes` ordered so that every node comes after the nodes it depends on (Kahn's, stable
/// in the driver's order); None if the edges name other nodes or make a cycle.
fn topological(nodes: &[GraphNode], edges: &[(GraphNode, GraphNode)]) -> Option<Vec<GraphNode>> {
    let at: HashMap<GraphNode, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut indegree = vec![0usize; nodes.len()];
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (from, to) in edges {
        let (f, t) = (*at.get(from)?, *at.get(to)?);
        out[f].push(t);
        indegree[t] += 1;
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(nodes[i]);
        for &t in &out[i] {
            indegree[t] -= 1;
            if indegree[t] == 0 {
                ready.insert(t);
            }
        }
    }
    (order.len() == nodes.len()).then_some(order)
}

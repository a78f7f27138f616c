//! The fake device's graphs (tests only): graphs as recorded nodes with their encoded
//! parameters and dependencies, executable graphs counting launches, and per-stream capture.
//! It checks handles the way the host does; it runs nothing.

#![expect(
    clippy::cast_possible_truncation,
    reason = "test double: it decodes enum values guest-lib itself encoded as 32-bit words"
)]

use std::collections::HashMap;

use qcuda_proto::{
    graph::{EdgeData, EDGE_DATA_SIZE},
    status, Op,
};

/// One recorded node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeNode {
    pub graph: u64,
    pub ty: u32,
    pub params: Vec<u8>,
    pub deps: Vec<u64>,
    /// The edge data of each dependency (absent: a default edge).
    pub edges: HashMap<u64, EdgeData>,
}

/// A capture under way: the graph it records into, its mode, and the nodes the next captured
/// work depends on (what `cuStreamGetCaptureInfo` reports and
/// `cuStreamUpdateCaptureDependencies` changes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeCapture {
    pub graph: u64,
    pub mode: u64,
    pub deps: Vec<u64>,
    pub edges: Vec<EdgeData>,
}

/// Graph state of the fake device.
#[derive(Debug, Default)]
pub struct FakeGraphs {
    /// Graph handle -> its nodes in order.
    pub graphs: HashMap<u64, Vec<u64>>,
    pub nodes: HashMap<u64, FakeNode>,
    /// Executable graph -> (graph, launches).
    pub execs: HashMap<u64, (u64, usize)>,
    /// Stream (wire handle) -> its capture.
    pub captures: HashMap<u64, FakeCapture>,
    /// Captures invalidated (`StreamCaptureInvalidate`).
    pub invalidated: Vec<u64>,
    /// Conditional handle -> its graph.
    pub conditionals: HashMap<u64, u64>,
    /// Conditional node -> its body graphs.
    pub bodies: HashMap<u64, Vec<u64>>,
}

fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `n` edge data records from an in-buffer (empty: default edges); `Err` if malformed.
fn edges_in(b: &[u8], n: usize) -> Result<Vec<EdgeData>, u32> {
    if b.is_empty() {
        return Ok(vec![EdgeData::DEFAULT; n]);
    }
    if b.len() != n * EDGE_DATA_SIZE {
        return Err(status::INVALID_VALUE);
    }
    b.chunks_exact(EDGE_DATA_SIZE)
        .map(|c| EdgeData::decode(c).ok_or(status::INVALID_VALUE))
        .collect()
}

fn put_edges(out: &mut [u8], edges: &[EdgeData]) {
    for (slot, e) in out.chunks_exact_mut(EDGE_DATA_SIZE).zip(edges) {
        slot.copy_from_slice(&e.encode());
    }
}

fn put(out: &mut [u8], values: &[u64]) {
    for (slot, v) in out.chunks_exact_mut(8).zip(values) {
        slot.copy_from_slice(&v.to_le_bytes());
    }
}

impl FakeGraphs {
    fn graph(&self, h: u64) -> Result<&Vec<u64>, u32> {
        self.graphs.get(&h).ok_or(status::INVALID_VALUE)
    }

    /// The edge data of the edge `from` -> `to`.
    fn edge(&self, from: u64, to: u64) -> EdgeData {
        self.nodes
            .get(&to)
            .and_then(|n| n.edges.get(&from))
            .copied()
            .unwrap_or_default()
    }

    /// Work of type `ty` with `params` sent to `stream`: recorded as node `fresh` of the
    /// stream's capture, after the capture's dependencies, if one is under way (true).
    pub fn capture_work(&mut self, stream: u64, ty: u32, params: &[u8], fresh: u64) -> bool {
        let Some(c) = self.captures.get_mut(&stream) else {
            return false;
        };
        let deps = std::mem::replace(&mut c.deps, vec![fresh]);
        let edges = std::mem::replace(&mut c.edges, vec![EdgeData::DEFAULT]);
        let graph = c.graph;
        self.nodes.insert(
            fresh,
            FakeNode {
                graph,
                ty,
                params: params.to_vec(),
                edges: deps.iter().copied().zip(edges).collect(),
                deps,
            },
        );
        self.graphs.entry(graph).or_default().push(fresh);
        true
    }

    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        op: Op,
        args: &[u64; 8],
        ins: &[&[u8]],
        outs: &mut [&mut [u8]],
        rets: &mut [u64; 7],
        fresh: u64,
        streams: &[u64],
    ) -> Result<(), u32> {
        let stream_ok = |s: u64| s == 0 || streams.contains(&s);
        match op {
            Op::StreamBeginCapture => {
                if args[0] == 0 {
                    return Err(status::STREAM_CAPTURE_UNSUPPORTED);
                }
                if !stream_ok(args[0]) {
                    return Err(status::INVALID_RESOURCE_HANDLE);
                }
                if self.captures.contains_key(&args[0]) {
                    return Err(status::ILLEGAL_STATE);
                }
                self.graphs.insert(fresh, Vec::new());
                self.captures.insert(
                    args[0],
                    FakeCapture {
                        graph: fresh,
                        mode: args[1],
                        deps: Vec::new(),
                        edges: Vec::new(),
                    },
                );
            }
            Op::StreamBeginCaptureToGraph => {
                self.graph(args[1])?;
                if self.captures.contains_key(&args[0])
                    || self.captures.values().any(|c| c.graph == args[1])
                {
                    return Err(status::ILLEGAL_STATE);
                }
                let deps = u64s(ins[0]);
                if deps
                    .iter()
                    .any(|d| self.nodes.get(d).map(|n| n.graph) != Some(args[1]))
                {
                    return Err(status::INVALID_VALUE);
                }
                let edges = edges_in(ins[1], deps.len())?;
                self.captures.insert(
                    args[0],
                    FakeCapture {
                        graph: args[1],
                        mode: args[2],
                        deps,
                        edges,
                    },
                );
            }
            Op::StreamEndCapture => {
                let g = self
                    .captures
                    .remove(&args[0])
                    .ok_or(status::ILLEGAL_STATE)?
                    .graph;
                if let Some(i) = self.invalidated.iter().position(|s| *s == args[0]) {
                    self.invalidated.remove(i);
                    self.graphs.remove(&g);
                    return Err(status::STREAM_CAPTURE_INVALIDATED);
                }
                rets[0] = g;
            }
            Op::StreamCaptureInfo => {
                if !stream_ok(args[0]) {
                    return Err(status::INVALID_RESOURCE_HANDLE);
                }
                if let Some(c) = self.captures.get(&args[0]) {
                    put(outs[0], &c.deps);
                    put_edges(outs[1], &c.edges);
                    *rets = [1, c.graph, c.graph, c.deps.len() as u64, 0, 0, 0];
                }
            }
            Op::StreamCaptureInvalidate => {
                if self.captures.contains_key(&args[0]) {
                    self.invalidated.push(args[0]);
                }
            }
            Op::StreamUpdateCaptureDependencies => {
                let c = self.captures.get(&args[0]).ok_or(status::ILLEGAL_STATE)?;
                let list = u64s(ins[0]);
                if list
                    .iter()
                    .any(|d| self.nodes.get(d).map(|n| n.graph) != Some(c.graph))
                {
                    return Err(status::INVALID_VALUE);
                }
                let edges = edges_in(ins[1], list.len())?;
                let c = self.captures.get_mut(&args[0]).unwrap();
                match args[1] {
                    0 => {
                        for (d, e) in list.into_iter().zip(edges) {
                            if !c.deps.contains(&d) {
                                c.deps.push(d);
                                c.edges.push(e);
                            }
                        }
                    }
                    1 => (c.deps, c.edges) = (list, edges),
                    _ => return Err(status::INVALID_VALUE),
                }
            }
            Op::GraphCreate => {
                self.graphs.insert(fresh, Vec::new());
                rets[0] = fresh;
            }
            Op::GraphDestroy => {
                let nodes = self.graphs.remove(&args[0]).ok_or(status::INVALID_VALUE)?;
                for n in nodes {
                    self.nodes.remove(&n);
                }
            }
            Op::GraphAddNode => {
                self.graph(args[0])?;
                let deps = u64s(ins[0]);
                if deps
                    .iter()
                    .any(|d| self.nodes.get(d).map(|n| n.graph) != Some(args[0]))
                {
                    return Err(status::INVALID_VALUE);
                }
                if args[1] == 3 && ins[1].len() != 8 {
                    // A host node carries the key of its function.
                    return Err(status::INVALID_VALUE);
                }
                if args[1] == u64::from(qcuda_proto::graph::NODE_CONDITIONAL) {
                    let c = qcuda_proto::graph::ConditionalNode::decode(ins[1])
                        .ok_or(status::INVALID_VALUE)?;
                    if self.conditionals.get(&c.handle) != Some(&args[0]) {
                        return Err(status::INVALID_VALUE);
                    }
                    let bodies: Vec<u64> = (0..u64::from(c.size))
                        .map(|i| fresh * 1000 + 500 + i)
                        .collect();
                    for b in &bodies {
                        self.graphs.insert(*b, Vec::new());
                    }
                    rets[1] = bodies.len() as u64;
                    self.bodies.insert(fresh, bodies);
                }
                let edges = edges_in(ins[2], deps.len())?;
                self.nodes.insert(
                    fresh,
                    FakeNode {
                        graph: args[0],
                        ty: args[1] as u32,
                        params: ins[1].to_vec(),
                        edges: deps.iter().copied().zip(edges).collect(),
                        deps,
                    },
                );
                self.graphs.get_mut(&args[0]).unwrap().push(fresh);
                rets[0] = fresh;
                if args[1] == 10 {
                    rets[1] = 0x7000_0000;
                }
            }
            Op::GraphConditionalHandleCreate => {
                self.graph(args[0])?;
                if args[2] > 1 {
                    return Err(status::INVALID_VALUE);
                }
                let h = 0xc0d0_0000_0000 | fresh;
                self.conditionals.insert(h, args[0]);
                rets[0] = h;
            }
            Op::GraphNodeSetParams | Op::GraphExecNodeSetParams => {
                let (node, ty) = if op == Op::GraphNodeSetParams {
                    (args[0], args[1])
                } else {
                    self.execs.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                    (args[1], args[2])
                };
                let n = self.nodes.get_mut(&node).ok_or(status::INVALID_VALUE)?;
                if u64::from(n.ty) != ty {
                    return Err(status::INVALID_VALUE);
                }
                n.params = ins[0].to_vec();
            }
            Op::GraphGetNodes => {
                let list: Vec<u64> = self
                    .graph(args[0])?
                    .iter()
                    .copied()
                    .filter(|n| args[1] == 0 || self.nodes[n].deps.is_empty())
                    .collect();
                put(outs[0], &list);
                rets[0] = list.len() as u64;
            }
            Op::GraphGetEdges => {
                let pairs: Vec<u64> = self
                    .graph(args[0])?
                    .iter()
                    .flat_map(|n| self.nodes[n].deps.iter().flat_map(move |d| [*d, *n]))
                    .collect();
                let data: Vec<EdgeData> = pairs
                    .chunks_exact(2)
                    .map(|p| self.edge(p[0], p[1]))
                    .collect();
                put(outs[0], &pairs);
                put_edges(outs[1], &data);
                rets[0] = pairs.len() as u64 / 2;
            }
            Op::GraphNodeQuery => {
                let n = self.nodes.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                match args[1] {
                    0 => rets[0] = u64::from(n.ty),
                    1 => {
                        let data: Vec<EdgeData> =
                            n.deps.iter().map(|d| self.edge(*d, args[0])).collect();
                        put(outs[0], &n.deps.clone());
                        put_edges(outs[1], &data);
                        rets[0] = n.deps.len() as u64;
                    }
                    _ => {
                        let list: Vec<u64> = self.graphs[&n.graph]
                            .iter()
                            .copied()
                            .filter(|m| self.nodes[m].deps.contains(&args[0]))
                            .collect();
                        let data: Vec<EdgeData> =
                            list.iter().map(|m| self.edge(args[0], *m)).collect();
                        put(outs[0], &list);
                        put_edges(outs[1], &data);
                        rets[0] = list.len() as u64;
                    }
                }
            }
            Op::GraphEdges => {
                self.graph(args[0])?;
                let pairs = u64s(ins[0]);
                let edges = edges_in(ins[1], pairs.len() / 2)?;
                for (p, e) in pairs.chunks_exact(2).zip(edges) {
                    let to = self.nodes.get_mut(&p[1]).ok_or(status::INVALID_VALUE)?;
                    if args[1] == 0 {
                        to.deps.push(p[0]);
                        to.edges.insert(p[0], e);
                    } else {
                        to.deps.retain(|d| *d != p[0]);
                        to.edges.remove(&p[0]);
                    }
                }
            }
            Op::GraphClone => {
                let nodes = self.graph(args[0])?.clone();
                let mut copies = Vec::new();
                for (i, n) in nodes.iter().enumerate() {
                    let id = fresh * 1000 + i as u64;
                    self.nodes.insert(
                        id,
                        FakeNode {
                            graph: fresh,
                            ..self.nodes[n].clone()
                        },
                    );
                    copies.push(id);
                }
                self.graphs.insert(fresh, copies);
                rets[0] = fresh;
            }
            Op::GraphInstantiate => {
                self.graph(args[0])?;
                if !stream_ok(args[2]) || args[1] > 0xf {
                    return Err(status::INVALID_VALUE);
                }
                self.execs.insert(fresh, (args[0], 0));
                rets[0] = fresh;
            }
            Op::GraphExecDestroy => {
                self.execs.remove(&args[0]).ok_or(status::INVALID_VALUE)?;
            }
            Op::GraphLaunch | Op::GraphUpload => {
                if !stream_ok(args[1]) {
                    return Err(status::INVALID_RESOURCE_HANDLE);
                }
                let e = self.execs.get_mut(&args[0]).ok_or(status::INVALID_VALUE)?;
                if op == Op::GraphLaunch {
                    e.1 += 1;
                }
            }
            Op::GraphExecUpdate => {
                let (old, _) = *self.execs.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                let shape = |g: &Vec<u64>| g.iter().map(|n| self.nodes[n].ty).collect::<Vec<_>>();
                let new = shape(self.graph(args[1])?);
                if self.graphs.get(&old).is_some_and(|o| shape(o) != new) {
                    rets[0] = 2;
                }
            }
            Op::GraphQuery => {
                if args[1] == 5 || args[1] == 6 {
                    let n = self.nodes.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                    let v = u64s(&n.params).first().copied().unwrap_or(0);
                    match (args[1], n.ty) {
                        (5, 10) => *rets = [0x7000_0000, v, 0, 0, 0, 0, 0],
                        (6, 11) => rets[0] = v,
                        _ => return Err(status::INVALID_VALUE),
                    }
                    return Ok(());
                }
                rets[0] = match args[1] {
                    4 => *self
                        .bodies
                        .get(&args[0])
                        .and_then(|b| b.get(args[2] as usize))
                        .ok_or(status::INVALID_VALUE)?,
                    3 => {
                        let n = self.nodes.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                        let i = self.graphs[&n.graph]
                            .iter()
                            .position(|m| *m == args[0])
                            .ok_or(status::INVALID_VALUE)?;
                        *self.graph(args[2])?.get(i).ok_or(status::INVALID_VALUE)?
                    }
                    2 => {
                        self.execs.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                        0
                    }
                    _ => {
                        let n = self.nodes.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                        u64s(&n.params)
                            .first()
                            .copied()
                            .ok_or(status::INVALID_VALUE)?
                    }
                };
            }
            Op::GraphDestroyNode => {
                let n = self.nodes.remove(&args[0]).ok_or(status::INVALID_VALUE)?;
                if let Some(list) = self.graphs.get_mut(&n.graph) {
                    list.retain(|m| *m != args[0]);
                }
                for other in self.nodes.values_mut() {
                    other.deps.retain(|d| *d != args[0]);
                }
            }
            Op::GraphMem => match (args[0], args[1]) {
                (0, _) | (1, 0..=3) => rets[0] = 0,
                (2, 1 | 3) if args[2] == 0 => {}
                _ => return Err(status::INVALID_VALUE),
            },
            Op::GraphNodeGetParams => {
                let n = self.nodes.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                if n.ty != 1 && n.ty != 2 {
                    return Err(status::INVALID_VALUE);
                }
                let len = n.params.len().min(outs[0].len());
                outs[0][..len].copy_from_slice(&n.params[..len]);
                rets[0] = u64::from(n.ty);
            }
            Op::GraphKernelNodeGetParams => {
                let n = self.nodes.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                if n.ty != 0 {
                    return Err(status::INVALID_VALUE);
                }
                let len = n.params.len().min(outs[0].len());
                outs[0][..len].copy_from_slice(&n.params[..len]);
                rets[0] = n.params.len() as u64;
            }
            Op::GraphDebugDot => {
                let text = format!("digraph qcuda {{ n{} }}\n", self.graph(args[0])?.len());
                let n = text.len().min(outs[0].len());
                outs[0][..n].copy_from_slice(&text.as_bytes()[..n]);
                rets[0] = text.len() as u64;
            }
            Op::GraphNodeEnabled => {
                self.execs.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                self.nodes.get(&args[1]).ok_or(status::INVALID_VALUE)?;
                rets[0] = 1;
            }
            Op::GraphExecChildGraph | Op::GraphExecSetEvent => {
                self.execs.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                self.nodes.get(&args[1]).ok_or(status::INVALID_VALUE)?;
            }
            _ => return Err(status::NOT_SUPPORTED),
        }
        Ok(())
    }
}

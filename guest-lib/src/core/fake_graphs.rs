//! The fake device's graphs (tests only): graphs as recorded nodes with their encoded
//! parameters and dependencies, executable graphs counting launches, and per-stream capture.
//! It checks handles the way the host does; it runs nothing.

#![expect(
    clippy::cast_possible_truncation,
    reason = "test double: it decodes enum values guest-lib itself encoded as 32-bit words"
)]

use std::collections::HashMap;

use qcuda_proto::{status, Op};

/// One recorded node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeNode {
    pub graph: u64,
    pub ty: u32,
    pub params: Vec<u8>,
    pub deps: Vec<u64>,
}

/// Graph state of the fake device.
#[derive(Debug, Default)]
pub struct FakeGraphs {
    /// Graph handle -> its nodes in order.
    pub graphs: HashMap<u64, Vec<u64>>,
    pub nodes: HashMap<u64, FakeNode>,
    /// Executable graph -> (graph, launches).
    pub execs: HashMap<u64, (u64, usize)>,
    /// Stream (wire handle) -> (graph, mode).
    pub captures: HashMap<u64, (u64, u64)>,
    /// Captures invalidated (`StreamCaptureInvalidate`).
    pub invalidated: Vec<u64>,
}

fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
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
                self.captures.insert(args[0], (fresh, args[1]));
            }
            Op::StreamBeginCaptureToGraph => {
                self.graph(args[1])?;
                if self.captures.contains_key(&args[0]) {
                    return Err(status::ILLEGAL_STATE);
                }
                self.captures.insert(args[0], (args[1], args[2]));
            }
            Op::StreamEndCapture => {
                let (g, _) = self
                    .captures
                    .remove(&args[0])
                    .ok_or(status::ILLEGAL_STATE)?;
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
                if let Some(&(g, _)) = self.captures.get(&args[0]) {
                    let last: Vec<u64> = self.graph(g)?.last().copied().into_iter().collect();
                    put(outs[0], &last);
                    *rets = [1, g, g, last.len() as u64, 0, 0, 0];
                }
            }
            Op::StreamCaptureInvalidate => {
                if self.captures.contains_key(&args[0]) {
                    self.invalidated.push(args[0]);
                }
            }
            Op::StreamUpdateCaptureDependencies => {
                self.captures.get(&args[0]).ok_or(status::ILLEGAL_STATE)?;
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
                self.nodes.insert(
                    fresh,
                    FakeNode {
                        graph: args[0],
                        ty: args[1] as u32,
                        params: ins[1].to_vec(),
                        deps,
                    },
                );
                self.graphs.get_mut(&args[0]).unwrap().push(fresh);
                rets[0] = fresh;
                if args[1] == 10 {
                    rets[1] = 0x7000_0000;
                }
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
                put(outs[0], &pairs);
                rets[0] = pairs.len() as u64 / 2;
            }
            Op::GraphNodeQuery => {
                let n = self.nodes.get(&args[0]).ok_or(status::INVALID_VALUE)?;
                match args[1] {
                    0 => rets[0] = u64::from(n.ty),
                    1 => {
                        put(outs[0], &n.deps.clone());
                        rets[0] = n.deps.len() as u64;
                    }
                    _ => {
                        let list: Vec<u64> = self.graphs[&n.graph]
                            .iter()
                            .copied()
                            .filter(|m| self.nodes[m].deps.contains(&args[0]))
                            .collect();
                        put(outs[0], &list);
                        rets[0] = list.len() as u64;
                    }
                }
            }
            Op::GraphEdges => {
                self.graph(args[0])?;
                for p in u64s(ins[0]).chunks_exact(2) {
                    let to = self.nodes.get_mut(&p[1]).ok_or(status::INVALID_VALUE)?;
                    if args[1] == 0 {
                        to.deps.push(p[0]);
                    } else {
                        to.deps.retain(|d| *d != p[0]);
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
                rets[0] = match args[1] {
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

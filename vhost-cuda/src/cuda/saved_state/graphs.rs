//! The saved state's graphs, conditional handles and executable graphs (records 20..=22),
//! and the checks that make a decoded set of them something a restore can build: every
//! graph named once, every node's dependencies earlier nodes of its own graph (so no cycle),
//! every graph a node holds held by exactly one node, every executable graph's copy its own.

use std::collections::{HashMap, HashSet};

use super::codec::{DecodeError, Reader, Writer};

pub(super) const TAG_GRAPH: u32 = 20;
pub(super) const TAG_GRAPH_CONDITIONAL: u32 = 21;
pub(super) const TAG_GRAPH_EXEC: u32 = 22;

/// Node types saved with their `qcuda_proto::graph` encoding: kernel, memcpy, memset, host,
/// empty, event wait, event record.
const PLAIN_TYPES: [u32; 7] = [0, 1, 2, 3, 5, 6, 7];
const NODE_GRAPH: u32 = 4;
const NODE_CONDITIONAL: u32 = 13;
/// Most body graphs of one conditional node (a switch's cases).
const MAX_BODIES: usize = 1 << 12;

/// What a saved graph is to the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GraphRole {
    /// A graph the program made (created, captured, cloned): `id` is its handle.
    Session,
    /// A graph a node of a session graph holds (a child graph node's graph, a conditional
    /// node's body): `id` is its handle.
    Held,
    /// An executable graph's own copy, or a graph a node of one holds: no handle.
    Private,
}

/// A graph: its nodes in an order where every node comes after its dependencies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedGraph {
    pub(crate) id: u64,
    pub(crate) dev: u32,
    pub(crate) role: GraphRole,
    pub(crate) nodes: Vec<SavedNode>,
}

/// A node: its handle (0 in a private graph), what it does, and the indices of the earlier
/// nodes of its graph it depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedNode {
    pub(crate) handle: u64,
    pub(crate) kind: SavedNodeKind,
    pub(crate) deps: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SavedNodeKind {
    /// A kernel, memcpy, memset, host, empty or event node: its type and its parameters in
    /// the encoding of `qcuda_proto::graph`, naming the program's handles (function, event,
    /// host-function key), checked again as the guest's own would be when restored.
    Plain { ty: u32, params: Vec<u8> },
    /// A child graph node, and the graph (id) it holds.
    Child { graph: u64 },
    /// A conditional node: its handle (the driver's value), kind, and body graphs (ids).
    Conditional {
        handle: u64,
        kind: u32,
        bodies: Vec<u64>,
    },
}

/// A conditional handle: its value, the graph it was made on, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SavedConditional {
    pub(crate) handle: u64,
    pub(crate) graph: u64,
    pub(crate) default_value: u32,
    pub(crate) flags: u32,
}

/// An executable graph: its own copy of the graph as it runs now, and the flags it was
/// instantiated with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedExec {
    pub(crate) handle: u64,
    pub(crate) dev: u32,
    pub(crate) flags: u64,
    /// The graph it was instantiated from, if that is still there (0: none).
    pub(crate) source: u64,
    /// Its copy (a private graph's id).
    pub(crate) graph: u64,
    /// The program's node handles that name its nodes: (handle, index in the copy).
    pub(crate) nodes: Vec<(u64, u32)>,
    /// Indices of the copy's nodes disabled in it (`cuGraphNodeSetEnabled`).
    pub(crate) disabled: Vec<u32>,
}

pub(super) fn encode_graph(g: &SavedGraph, w: &mut Writer) {
    let role = match g.role {
        GraphRole::Session => 0,
        GraphRole::Held => 1,
        GraphRole::Private => 2,
    };
    w.u64(g.id).u32(g.dev).u8(role).u64(g.nodes.len() as u64);
    for n in &g.nodes {
        w.u64(n.handle);
        match &n.kind {
            SavedNodeKind::Plain { ty, params } => {
                w.u32(*ty).bytes(params);
            }
            SavedNodeKind::Child { graph } => {
                w.u32(NODE_GRAPH).u64(*graph);
            }
            SavedNodeKind::Conditional {
                handle,
                kind,
                bodies,
            } => {
                w.u32(NODE_CONDITIONAL)
                    .u64(*handle)
                    .u32(*kind)
                    .u64(bodies.len() as u64);
                for b in bodies {
                    w.u64(*b);
                }
            }
        }
        w.u64(n.deps.len() as u64);
        for d in &n.deps {
            w.u32(*d);
        }
    }
}

pub(super) fn decode_graph(f: &mut Reader) -> Result<SavedGraph, DecodeError> {
    let (id, dev) = (f.u64()?, f.u32()?);
    let role = match f.u8()? {
        0 => GraphRole::Session,
        1 => GraphRole::Held,
        2 => GraphRole::Private,
        _ => return Err(DecodeError::Field("graph role")),
    };
    // A node is at least its handle, type and dependency count.
    let n = f.count(20)?;
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let handle = f.u64()?;
        let ty = f.u32()?;
        let kind = match ty {
            NODE_GRAPH => SavedNodeKind::Child { graph: f.u64()? },
            NODE_CONDITIONAL => {
                let (handle, kind) = (f.u64()?, f.u32()?);
                let count = f.count(8)?;
                if count == 0 || count > MAX_BODIES || kind > 2 {
                    return Err(DecodeError::Field("conditional node"));
                }
                let bodies = (0..count).map(|_| f.u64()).collect::<Result<_, _>>()?;
                SavedNodeKind::Conditional {
                    handle,
                    kind,
                    bodies,
                }
            }
            t if PLAIN_TYPES.contains(&t) => SavedNodeKind::Plain {
                ty,
                params: f.bytes()?.to_vec(),
            },
            _ => return Err(DecodeError::Field("graph node type")),
        };
        let count = f.count(4)?;
        let deps: Vec<u32> = (0..count).map(|_| f.u32()).collect::<Result<_, _>>()?;
        // Only earlier nodes, each once: the graph is acyclic by construction.
        let mut seen = HashSet::new();
        if deps.iter().any(|&d| d as usize >= i || !seen.insert(d)) {
            return Err(DecodeError::Field("graph node dependencies"));
        }
        nodes.push(SavedNode { handle, kind, deps });
    }
    Ok(SavedGraph {
        id,
        dev,
        role,
        nodes,
    })
}

pub(super) fn encode_conditional(c: &SavedConditional, w: &mut Writer) {
    w.u64(c.handle)
        .u64(c.graph)
        .u32(c.default_value)
        .u32(c.flags);
}

pub(super) fn decode_conditional(f: &mut Reader) -> Result<SavedConditional, DecodeError> {
    Ok(SavedConditional {
        handle: f.u64()?,
        graph: f.u64()?,
        default_value: f.u32()?,
        flags: f.u32()?,
    })
}

pub(super) fn encode_exec(e: &SavedExec, w: &mut Writer) {
    w.u64(e.handle)
        .u32(e.dev)
        .u64(e.flags)
        .u64(e.source)
        .u64(e.graph)
        .u64(e.nodes.len() as u64);
    for &(h, i) in &e.nodes {
        w.u64(h).u32(i);
    }
    w.u64(e.disabled.len() as u64);
    for &i in &e.disabled {
        w.u32(i);
    }
}

pub(super) fn decode_exec(f: &mut Reader) -> Result<SavedExec, DecodeError> {
    let (handle, dev, flags, source, graph) = (f.u64()?, f.u32()?, f.u64()?, f.u64()?, f.u64()?);
    let n = f.count(12)?;
    let nodes = (0..n)
        .map(|_| Ok((f.u64()?, f.u32()?)))
        .collect::<Result<_, DecodeError>>()?;
    let n = f.count(4)?;
    let disabled = (0..n).map(|_| f.u32()).collect::<Result<_, _>>()?;
    Ok(SavedExec {
        handle,
        dev,
        flags,
        source,
        graph,
        nodes,
        disabled,
    })
}

/// What holds a graph that is not one of the program's own.
enum Holder {
    /// A node of this graph.
    Graph(u64),
    /// An executable graph (its copy).
    Exec,
}

/// Checks that the graphs, conditional handles and executable graphs of a decoded state fit
/// together (see the module documentation).
pub(super) fn check(
    graphs: &[SavedGraph],
    conditionals: &[SavedConditional],
    execs: &[SavedExec],
) -> Result<(), DecodeError> {
    let bad = DecodeError::Field;
    let mut by_id: HashMap<u64, &SavedGraph> = HashMap::with_capacity(graphs.len());
    for g in graphs {
        if g.id == 0 || by_id.insert(g.id, g).is_some() {
            return Err(bad("graph id"));
        }
    }
    let mut node_handles = HashSet::new();
    let mut held: HashMap<u64, Holder> = HashMap::new();
    for g in graphs {
        let private = g.role == GraphRole::Private;
        for n in &g.nodes {
            if (n.handle == 0) != private || (!private && !node_handles.insert(n.handle)) {
                return Err(bad("graph node handle"));
            }
            let inner: &[u64] = match &n.kind {
                SavedNodeKind::Plain { .. } => &[],
                SavedNodeKind::Child { graph } => std::slice::from_ref(graph),
                SavedNodeKind::Conditional { bodies, .. } => bodies,
            };
            let want = if private {
                GraphRole::Private
            } else {
                GraphRole::Held
            };
            for id in inner {
                match by_id.get(id) {
                    Some(h) if h.role == want && h.dev == g.dev => {}
                    _ => return Err(bad("a graph a node holds")),
                }
                if held.insert(*id, Holder::Graph(g.id)).is_some() {
                    return Err(bad("a graph held twice"));
                }
            }
        }
    }
    let mut exec_handles = HashSet::new();
    for e in execs {
        if e.handle == 0 || !exec_handles.insert(e.handle) {
            return Err(bad("executable graph handle"));
        }
        let copy = match by_id.get(&e.graph) {
            Some(g) if g.role == GraphRole::Private && g.dev == e.dev => g,
            _ => return Err(bad("an executable graph's copy")),
        };
        if held.insert(e.graph, Holder::Exec).is_some() {
            return Err(bad("a graph held twice"));
        }
        if e.source != 0
            && !by_id
                .get(&e.source)
                .is_some_and(|g| g.role != GraphRole::Private)
        {
            return Err(bad("an executable graph's source"));
        }
        let len = copy.nodes.len();
        let mut named = HashSet::new();
        if e.nodes
            .iter()
            .any(|&(h, i)| h == 0 || i as usize >= len || !named.insert(h))
            || e.disabled.iter().any(|&i| i as usize >= len)
        {
            return Err(bad("an executable graph's nodes"));
        }
    }
    // Every graph but the program's own is held by exactly one holder (above), and leads up
    // to a program's graph or an executable graph: a ring of graphs holding each other is
    // refused. Each graph is walked once (`rooted` remembers the walks).
    let mut rooted: HashSet<u64> = HashSet::with_capacity(graphs.len());
    for g in graphs {
        if (g.role == GraphRole::Session) == held.contains_key(&g.id) {
            return Err(bad("a graph's holder"));
        }
        let mut path = Vec::new();
        let mut at = g.id;
        loop {
            if rooted.contains(&at) {
                break;
            }
            path.push(at);
            if path.len() > graphs.len() {
                return Err(bad("graphs holding each other"));
            }
            match held.get(&at) {
                None | Some(Holder::Exec) => break,
                Some(Holder::Graph(parent)) => at = *parent,
            }
        }
        rooted.extend(path);
    }
    let mut handles = HashSet::new();
    for c in conditionals {
        if !handles.insert(c.handle)
            || !by_id
                .get(&c.graph)
                .is_some_and(|g| g.role != GraphRole::Private)
        {
            return Err(bad("conditional handle"));
        }
    }
    Ok(())
}

//! Graph and stream-capture ops over the fake driver: handles, node checks, capture.

use qcuda_proto::graph::{self as g, KernelNode, MemcpyNode, MemsetNode, KERNEL_NODE_HEADER};

use super::*;

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn add_node(
    rig: &mut Rig,
    s: &mut GpuState,
    graph: u64,
    ty: u32,
    deps: &[u64],
    params: &[u8],
) -> ResponseHeader {
    let d = rig.buf(&u64s(deps));
    let p = rig.buf(params);
    s.execute(&req(
        Op::GraphAddNode,
        0,
        &[graph, u64::from(ty)],
        vec![d, p],
        vec![],
    ))
}

fn list(rig: &mut Rig, s: &mut GpuState, op: Op, args: &[u64]) -> Vec<u64> {
    let out = rig.out(8 * 64);
    let r = ok(s.execute(&req(op, 0, args, vec![], vec![out.clone()])));
    let n = usize::try_from(r[0]).unwrap();
    out.to_vec().unwrap()[..8 * n]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn kernel_params(func: u64, params: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; KERNEL_NODE_HEADER + params.len()];
    KernelNode {
        function: func,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        params,
    }
    .encode(&mut b);
    b
}

#[test]
fn explicit_graph_nodes_are_checked_and_queried() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let (r, _) = get_function(&mut rig, &mut s, m, "vadd", 64);
    let f = ok(r)[0];
    let a = malloc(&mut s, 256);
    let graph = ok(run(&mut s, Op::GraphCreate, &[]))[0];

    // A kernel node with vadd's 28-byte parameter block.
    let mut block = u64s(&[a, a, a]);
    block.extend_from_slice(&4i32.to_le_bytes());
    let k = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_KERNEL,
        &[],
        &kernel_params(f, &block),
    ))[0];
    // Its parameters read back.
    let out = rig.out(256);
    let r = ok(s.execute(&req(
        Op::GraphKernelNodeGetParams,
        0,
        &[k],
        vec![],
        vec![out.clone()],
    )));
    let bytes = out.to_vec().unwrap();
    let back = KernelNode::decode(&bytes[..usize::try_from(r[0]).unwrap()]).unwrap();
    assert_eq!(
        (back.function, back.block, back.params),
        (f, [32, 1, 1], &block[..])
    );
    // Too short or too long a block, an unknown function, a bad geometry.
    let short = kernel_params(f, &block[..20]);
    assert_eq!(
        add_node(&mut rig, &mut s, graph, 0, &[], &short).status,
        status::INVALID_VALUE
    );
    let mut padded = block.to_vec();
    padded.extend_from_slice(&[0; 8]);
    assert_eq!(
        add_node(&mut rig, &mut s, graph, 0, &[], &kernel_params(f, &padded)).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        add_node(&mut rig, &mut s, graph, 0, &[], &kernel_params(999, &block)).status,
        status::INVALID_DEVICE_FUNCTION
    );
    // Memset inside the allocation; one byte past it is refused.
    let set = MemsetNode {
        dst: a,
        pitch: 0,
        value: 7,
        element_size: 4,
        width: 64,
        height: 1,
    };
    let ms = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_MEMSET,
        &[k],
        &set.encode(),
    ))[0];
    let out = rig.out(64);
    let r = ok(s.execute(&req(
        Op::GraphNodeGetParams,
        0,
        &[ms],
        vec![],
        vec![out.clone()],
    )));
    assert_eq!(r[0], u64::from(g::NODE_MEMSET));
    assert_eq!(
        MemsetNode::decode(&out.to_vec().unwrap()[..g::MEMSET_NODE_SIZE]),
        Some(set)
    );
    let over = MemsetNode { width: 65, ..set };
    assert_eq!(
        add_node(&mut rig, &mut s, graph, g::NODE_MEMSET, &[], &over.encode()).status,
        status::INVALID_VALUE
    );
    // Memcpy within device memory; a source outside the session is refused.
    let cp = MemcpyNode {
        dst: a + 128,
        src: a,
        width: 128,
        height: 1,
        depth: 1,
        ..Default::default()
    };
    let mc = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_MEMCPY,
        &[ms],
        &cp.encode(),
    ))[0];
    let wild = MemcpyNode { src: 0x10, ..cp };
    assert_eq!(
        add_node(&mut rig, &mut s, graph, g::NODE_MEMCPY, &[], &wild.encode()).status,
        status::INVALID_VALUE
    );
    // Unknown dependencies, host and memory nodes.
    assert_eq!(
        add_node(&mut rig, &mut s, graph, g::NODE_EMPTY, &[12345], &[]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        add_node(
            &mut rig,
            &mut s,
            graph,
            g::NODE_HOST,
            &[],
            &7u64.to_le_bytes()
        )
        .status,
        status::NOT_SUPPORTED
    );
    let empty = ok(add_node(&mut rig, &mut s, graph, g::NODE_EMPTY, &[], &[]))[0];
    // Event and child graph nodes, and what GraphQuery says of them.
    let ev = ok(run(&mut s, Op::EventCreate, &[0]))[0];
    let rec = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_EVENT_RECORD,
        &[],
        &ev.to_le_bytes(),
    ))[0];
    assert_eq!(ok(run(&mut s, Op::GraphQuery, &[rec, 0]))[0], ev);
    assert_eq!(
        run(&mut s, Op::GraphQuery, &[empty, 0]).status,
        status::INVALID_VALUE
    );
    let sub_graph = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    let child = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_GRAPH,
        &[],
        &sub_graph.to_le_bytes(),
    ))[0];
    let owned = ok(run(&mut s, Op::GraphQuery, &[child, 1]))[0];
    assert_ne!(owned, sub_graph, "the node holds a copy");
    assert_eq!(
        run(&mut s, Op::GraphDestroy, &[owned]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::GraphDestroy, &[sub_graph]));

    assert_eq!(
        list(&mut rig, &mut s, Op::GraphGetNodes, &[graph, 0]),
        vec![k, ms, mc, empty, rec, child]
    );
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphGetNodes, &[graph, 1]),
        vec![k, empty, rec, child]
    );
    assert_eq!(
        ok(run(&mut s, Op::GraphNodeQuery, &[ms, 0]))[0],
        u64::from(g::NODE_MEMSET)
    );
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphNodeQuery, &[mc, 1]),
        vec![ms]
    );
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphNodeQuery, &[k, 2]),
        vec![ms]
    );
    let pairs = rig.buf(&u64s(&[mc, empty]));
    ok(s.execute(&req(Op::GraphEdges, 0, &[graph, 0], vec![pairs], vec![])));
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphGetNodes, &[graph, 1]),
        vec![k, rec, child]
    );

    // Instantiate, launch, update, destroy.
    let exec = ok(run(&mut s, Op::GraphInstantiate, &[graph, 1, 0]))[0];
    assert_eq!(ok(run(&mut s, Op::GraphQuery, &[exec, 2]))[0], 1);
    for _ in 0..3 {
        ok(run(&mut s, Op::GraphLaunch, &[exec, 0]));
    }
    assert_eq!(rig.fake.graph_launches(), 3);
    assert_eq!(
        run(&mut s, Op::GraphLaunch, &[graph, 0]).status,
        status::INVALID_VALUE
    );
    let p = rig.buf(&kernel_params(f, &block));
    ok(s.execute(&req(
        Op::GraphExecNodeSetParams,
        0,
        &[exec, k, 0],
        vec![p],
        vec![],
    )));
    let clone = ok(run(&mut s, Op::GraphClone, &[graph]))[0];
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphGetNodes, &[clone, 0]).len(),
        6
    );
    let k_clone = ok(run(&mut s, Op::GraphQuery, &[k, 3, clone]))[0];
    assert_ne!(k_clone, k);
    assert_eq!(ok(run(&mut s, Op::GraphNodeQuery, &[k_clone, 0]))[0], 0);
    // Destroying a node: gone from its graph and from the handle table.
    ok(run(&mut s, Op::GraphDestroyNode, &[k_clone]));
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphGetNodes, &[clone, 0]).len(),
        5
    );
    assert_eq!(
        run(&mut s, Op::GraphNodeQuery, &[k_clone, 0]).status,
        status::INVALID_VALUE
    );
    let clone = ok(run(&mut s, Op::GraphClone, &[graph]))[0];
    ok(run(&mut s, Op::GraphExecUpdate, &[exec, clone]));
    let other = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    let r = run(&mut s, Op::GraphExecUpdate, &[exec, other]);
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 2));
    ok(run(&mut s, Op::GraphNodeEnabled, &[exec, k, 1, 0]));
    assert_eq!(ok(run(&mut s, Op::GraphNodeEnabled, &[exec, k, 0]))[0], 0);
    ok(run(&mut s, Op::GraphExecDestroy, &[exec]));
    assert_eq!(
        run(&mut s, Op::GraphExecDestroy, &[exec]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::GraphDestroy, &[graph]));
    // Its nodes went with it, and the graph its child graph node held.
    assert_eq!(
        run(&mut s, Op::GraphClone, &[owned]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::GraphNodeQuery, &[k, 0]).status,
        status::INVALID_VALUE
    );
    drop(s);
    assert_eq!(rig.fake.live_contexts(), 0);
}

#[test]
fn memory_nodes_make_session_memory_for_their_graphs_lifetime() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let graph = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    assert_eq!(
        add_node(
            &mut rig,
            &mut s,
            graph,
            g::NODE_MEM_ALLOC,
            &[],
            &0u64.to_le_bytes()
        )
        .status,
        status::INVALID_VALUE
    );
    let r = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_MEM_ALLOC,
        &[],
        &4096u64.to_le_bytes(),
    ));
    let (alloc, dptr) = (r[0], r[1]);
    assert_eq!(ok(run(&mut s, Op::GraphNodeQuery, &[alloc, 0]))[0], 10);
    let set = MemsetNode {
        dst: dptr,
        pitch: 0,
        value: 0,
        element_size: 4,
        width: 1024,
        height: 1,
    };
    let ms = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_MEMSET,
        &[alloc],
        &set.encode(),
    ))[0];
    // A free node takes a graph allocation's start only.
    let a = malloc(&mut s, 64);
    assert_eq!(
        add_node(
            &mut rig,
            &mut s,
            graph,
            g::NODE_MEM_FREE,
            &[ms],
            &a.to_le_bytes()
        )
        .status,
        status::INVALID_VALUE
    );
    let free = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_MEM_FREE,
        &[ms],
        &dptr.to_le_bytes(),
    ))[0];
    // What each memory node holds, and only of memory nodes.
    assert_eq!(
        ok(run(&mut s, Op::GraphQuery, &[alloc, 5]))[..2],
        [dptr, 4096]
    );
    assert_eq!(ok(run(&mut s, Op::GraphQuery, &[free, 6]))[0], dptr);
    assert_eq!(
        run(&mut s, Op::GraphQuery, &[ms, 5]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::GraphQuery, &[alloc, 6]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::GraphDestroy, &[graph]));
    // With its graph gone the address stays the session's (an executable graph made from it
    // still allocates it), until the context goes.
    let other = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    ok(add_node(
        &mut rig,
        &mut s,
        other,
        g::NODE_MEMSET,
        &[],
        &set.encode(),
    ));
}

#[test]
fn stream_capture_records_launches_and_refuses_sync() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let (r, _) = get_function(&mut rig, &mut s, m, "spin", 64);
    let f = ok(r)[0];
    let stream = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    // The legacy stream cannot be captured; modes are 0..=2.
    assert_eq!(
        run(&mut s, Op::StreamBeginCapture, &[0, 0]).status,
        status::STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(
        run(&mut s, Op::StreamBeginCapture, &[stream, 3]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::StreamBeginCapture, &[stream, 0]));
    let empty = rig.buf(&[]);
    for _ in 0..2 {
        ok(s.execute(&req(
            Op::LaunchKernel,
            0,
            &launch_args(f, [1, 1, 1], [1, 1, 1], stream),
            vec![empty.clone()],
            vec![],
        )));
    }
    let out = rig.out(64);
    let info = ok(s.execute(&req(Op::StreamCaptureInfo, 0, &[stream], vec![], vec![out])));
    assert_eq!((info[0], info[3]), (1, 1));
    let during = info[2];
    // A waited-for mapped copy into the capturing stream is captured, not waited for (which
    // would invalidate the capture).
    let a = malloc(&mut s, 64);
    ok(run(&mut s, Op::MemcpyMapped, &[a, a + 32, 32, stream]));
    // A captured graph may not be destroyed.
    assert_eq!(
        run(&mut s, Op::GraphDestroy, &[during]).status,
        status::INVALID_VALUE
    );
    let graph = ok(run(&mut s, Op::StreamEndCapture, &[stream]))[0];
    assert_eq!(graph, during, "the graph keeps its handle");
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphGetNodes, &[graph, 0]).len(),
        2
    );
    let out = rig.out(8);
    let r = s.execute(&req(Op::StreamCaptureInfo, 0, &[0], vec![], vec![out]));
    assert_eq!(ok(r)[0], 0);
    assert_eq!(
        run(&mut s, Op::StreamEndCapture, &[stream]).status,
        status::ILLEGAL_STATE
    );
    // Synchronising a capturing stream is illegal and invalidates the capture, as does a
    // guest-side refusal (StreamCaptureInvalidate); the graph goes with it.
    for illegal in [Op::StreamSynchronize, Op::StreamCaptureInvalidate] {
        ok(run(&mut s, Op::StreamBeginCapture, &[stream, 0]));
        let r = run(&mut s, illegal, &[stream]);
        if illegal == Op::StreamSynchronize {
            assert_eq!(r.status, status::STREAM_CAPTURE_UNSUPPORTED);
        }
        assert_eq!(
            run(&mut s, Op::StreamEndCapture, &[stream]).status,
            status::STREAM_CAPTURE_INVALIDATED
        );
    }
    let exec = ok(run(&mut s, Op::GraphInstantiate, &[graph, 0, 0]))[0];
    ok(run(&mut s, Op::GraphLaunch, &[exec, stream]));
    ok(run(&mut s, Op::GraphDestroy, &[graph]));
    // The executable graph outlives its graph.
    ok(run(&mut s, Op::GraphLaunch, &[exec, stream]));
    // Capture into an existing graph: the graph keeps its handle, and a failed capture leaves
    // it to the guest.
    let into = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    let e = add_node(&mut rig, &mut s, into, g::NODE_EMPTY, &[], &[]);
    let first = ok(e)[0];
    let deps = rig.buf(&u64s(&[first]));
    ok(s.execute(&req(
        Op::StreamBeginCaptureToGraph,
        0,
        &[stream, into, 2],
        vec![deps.clone()],
        vec![],
    )));
    assert_eq!(ok(run(&mut s, Op::StreamEndCapture, &[stream]))[0], into);
    let d = rig.buf(&u64s(&[first]));
    ok(s.execute(&req(
        Op::StreamBeginCaptureToGraph,
        0,
        &[stream, into, 2],
        vec![d],
        vec![],
    )));
    // Not destroyable while captured into.
    assert_eq!(
        run(&mut s, Op::GraphDestroy, &[into]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::StreamEndCapture, &[stream]));
    ok(s.execute(&req(
        Op::StreamBeginCaptureToGraph,
        0,
        &[stream, into, 0],
        vec![deps],
        vec![],
    )));
    ok(run(&mut s, Op::StreamCaptureInvalidate, &[stream]));
    assert_eq!(
        run(&mut s, Op::StreamEndCapture, &[stream]).status,
        status::STREAM_CAPTURE_INVALIDATED
    );
    assert_eq!(ok(run(&mut s, Op::GraphNodeQuery, &[first, 0]))[0], 5);
    // DeviceReset forgets graphs and executable graphs.
    ok(run(&mut s, Op::DeviceReset, &[]));
    assert_eq!(
        run(&mut s, Op::GraphLaunch, &[exec, 0]).status,
        status::INVALID_VALUE
    );
}

#[test]
fn conditional_nodes_get_body_graphs_the_guest_fills() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let graph = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    let other = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    // A handle on a graph the session does not have, or with unknown flags, is refused.
    assert_eq!(
        run(&mut s, Op::GraphConditionalHandleCreate, &[0x77, 1, 1]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::GraphConditionalHandleCreate, &[graph, 1, 2]).status,
        status::INVALID_VALUE
    );
    let h = ok(run(
        &mut s,
        Op::GraphConditionalHandleCreate,
        &[graph, 1, 1],
    ))[0];
    let cond = |handle, kind, size| g::ConditionalNode { handle, kind, size }.encode().to_vec();
    // The handle belongs to its graph; sizes must suit the kind; unknown handles are refused.
    for (gr, p) in [
        (other, cond(h, g::COND_IF, 1)),
        (graph, cond(h, g::COND_IF, 3)),
        (graph, cond(h, g::COND_WHILE, 2)),
        (graph, cond(h ^ 0x10, g::COND_IF, 1)),
        (graph, cond(h, g::COND_IF, 1)[..15].to_vec()),
    ] {
        let r = add_node(&mut rig, &mut s, gr, g::NODE_CONDITIONAL, &[], &p);
        assert_eq!(r.status, status::INVALID_VALUE);
    }
    let r = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_CONDITIONAL,
        &[],
        &cond(h, g::COND_SWITCH, 3),
    ));
    let (node, count) = (r[0], r[1]);
    assert_eq!(count, 3);
    assert_eq!(
        ok(run(&mut s, Op::GraphNodeQuery, &[node, 0]))[0],
        u64::from(g::NODE_CONDITIONAL)
    );
    let bodies: Vec<u64> = (0..3)
        .map(|i| ok(run(&mut s, Op::GraphQuery, &[node, 4, i]))[0])
        .collect();
    assert!(bodies[0] != bodies[1] && bodies[1] != bodies[2]);
    assert_eq!(
        run(&mut s, Op::GraphQuery, &[node, 4, 3]).status,
        status::INVALID_VALUE
    );
    // A body is a graph of the session: nodes go into it, and streams capture into it.
    let e = ok(add_node(
        &mut rig,
        &mut s,
        bodies[0],
        g::NODE_EMPTY,
        &[],
        &[],
    ))[0];
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphGetNodes, &[bodies[0], 0]),
        vec![e]
    );
    let stream = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    let none = rig.buf(&[]);
    ok(s.execute(&req(
        Op::StreamBeginCaptureToGraph,
        0,
        &[stream, bodies[1], 2],
        vec![none],
        vec![],
    )));
    assert_eq!(
        ok(run(&mut s, Op::StreamEndCapture, &[stream]))[0],
        bodies[1]
    );
    // The node owns its bodies: not destroyable, and gone with the node.
    assert_eq!(
        run(&mut s, Op::GraphDestroy, &[bodies[2]]).status,
        status::INVALID_VALUE
    );
    let exec = ok(run(&mut s, Op::GraphInstantiate, &[graph, 0, 0]))[0];
    ok(run(&mut s, Op::GraphLaunch, &[exec, stream]));
    ok(run(&mut s, Op::GraphDestroyNode, &[node]));
    assert_eq!(
        run(&mut s, Op::GraphGetNodes, &[bodies[0], 0]).status,
        status::INVALID_VALUE
    );
    // A second conditional node's bodies go with the graph.
    let h2 = ok(run(
        &mut s,
        Op::GraphConditionalHandleCreate,
        &[graph, 0, 0],
    ))[0];
    let r = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_CONDITIONAL,
        &[],
        &cond(h2, g::COND_WHILE, 1),
    ));
    let body = ok(run(&mut s, Op::GraphQuery, &[r[0], 4, 0]))[0];
    ok(run(&mut s, Op::GraphDestroy, &[graph]));
    assert_eq!(run(&mut s, Op::GraphCreate, &[]).status, status::SUCCESS);
    assert_eq!(
        run(&mut s, Op::GraphGetNodes, &[body, 0]).status,
        status::INVALID_VALUE
    );
}

/// `(status, graph, dependencies, their edge data)` of `stream`'s capture.
fn capture_info(
    rig: &mut Rig,
    s: &mut GpuState,
    stream: u64,
) -> (u64, u64, Vec<u64>, Vec<g::EdgeData>) {
    let out = rig.out(8 * 16);
    let edges = rig.out(g::EDGE_DATA_SIZE * 16);
    let r = ok(s.execute(&req(
        Op::StreamCaptureInfo,
        0,
        &[stream],
        vec![],
        vec![out.clone(), edges.clone()],
    )));
    let n = usize::try_from(r[3]).unwrap();
    let deps = out.to_vec().unwrap()[..8 * n]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let data = edges.to_vec().unwrap()[..g::EDGE_DATA_SIZE * n]
        .chunks_exact(g::EDGE_DATA_SIZE)
        .map(|c| g::EdgeData::decode(c).unwrap())
        .collect();
    (r[0], r[2], deps, data)
}

#[test]
fn a_conditional_node_joins_a_graph_under_capture_and_its_body_is_captured() {
    // NVIDIA's capturedWhileGraph: the handle made on the capture's own graph, the node added
    // after the capture's dependencies, the capture moved past it, the body captured into
    // while the outer capture still runs (another stream) and after it ended.
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let (r, _) = get_function(&mut rig, &mut s, m, "spin", 64);
    let f = ok(r)[0];
    let outer = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    let side = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    let empty = rig.buf(&[]);
    let launch = |s: &mut GpuState, stream| {
        ok(s.execute(&req(
            Op::LaunchKernel,
            0,
            &launch_args(f, [1, 1, 1], [1, 1, 1], stream),
            vec![empty.clone()],
            vec![],
        )));
    };
    ok(run(&mut s, Op::StreamBeginCapture, &[outer, 0]));
    let (_, graph, deps, _) = capture_info(&mut rig, &mut s, outer);
    assert!(graph != 0 && deps.is_empty());
    let h = ok(run(
        &mut s,
        Op::GraphConditionalHandleCreate,
        &[graph, 0, 0],
    ))[0];
    launch(&mut s, outer);
    let (_, same, deps, _) = capture_info(&mut rig, &mut s, outer);
    assert_eq!((same, deps.len()), (graph, 1));
    let a = deps[0];
    let cond = g::ConditionalNode {
        handle: h,
        kind: g::COND_IF,
        size: 2,
    }
    .encode();
    let r = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_CONDITIONAL,
        &deps,
        &cond,
    ));
    let node = r[0];
    let bodies: Vec<u64> = (0..2)
        .map(|i| ok(run(&mut s, Op::GraphQuery, &[node, 4, i]))[0])
        .collect();
    let set = rig.buf(&u64s(&[node]));
    ok(s.execute(&req(
        Op::StreamUpdateCaptureDependencies,
        0,
        &[outer, 1],
        vec![set],
        vec![],
    )));
    assert_eq!(capture_info(&mut rig, &mut s, outer).2, vec![node]);
    // The first body while the outer capture runs, on another stream.
    let none = rig.buf(&[]);
    ok(s.execute(&req(
        Op::StreamBeginCaptureToGraph,
        0,
        &[side, bodies[0], 0],
        vec![none.clone()],
        vec![],
    )));
    launch(&mut s, side);
    assert_eq!(ok(run(&mut s, Op::StreamEndCapture, &[side]))[0], bodies[0]);
    launch(&mut s, outer);
    assert_eq!(ok(run(&mut s, Op::StreamEndCapture, &[outer]))[0], graph);
    // The second after it, on the outer capture's own stream.
    ok(s.execute(&req(
        Op::StreamBeginCaptureToGraph,
        0,
        &[outer, bodies[1], 0],
        vec![none],
        vec![],
    )));
    launch(&mut s, outer);
    assert_eq!(
        ok(run(&mut s, Op::StreamEndCapture, &[outer]))[0],
        bodies[1]
    );
    // A -> conditional -> D, a kernel in each body.
    let nodes = list(&mut rig, &mut s, Op::GraphGetNodes, &[graph, 0]);
    assert_eq!(nodes.len(), 3);
    let pairs = rig.out(16 * 4);
    let r = ok(s.execute(&req(
        Op::GraphGetEdges,
        0,
        &[graph],
        vec![],
        vec![pairs.clone()],
    )));
    assert_eq!(r[0], 2);
    let pairs = pairs.to_vec().unwrap();
    assert_eq!(&pairs[..16], &u64s(&[a, node])[..]);
    assert_eq!(&pairs[16..24], &node.to_le_bytes());
    for b in &bodies {
        assert_eq!(list(&mut rig, &mut s, Op::GraphGetNodes, &[*b, 0]).len(), 1);
    }
    let exec = ok(run(&mut s, Op::GraphInstantiate, &[graph, 0, 0]))[0];
    for _ in 0..3 {
        ok(run(&mut s, Op::GraphLaunch, &[exec, outer]));
    }
    assert_eq!(rig.fake.graph_launches(), 3);
}

#[test]
fn edge_data_reaches_the_driver_and_comes_back() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let (r, _) = get_function(&mut rig, &mut s, m, "spin", 64);
    let f = ok(r)[0];
    let graph = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    let k1 = ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_KERNEL,
        &[],
        &kernel_params(f, &[]),
    ))[0];
    let programmatic = g::EdgeData {
        from_port: 1,
        to_port: 0,
        kind: 1,
    };
    let with_edge = |rig: &mut Rig, s: &mut GpuState, ty: u32, params: &[u8], e: &[u8]| {
        let d = rig.buf(&u64s(&[k1]));
        let p = rig.buf(params);
        let e = rig.buf(e);
        s.execute(&req(
            Op::GraphAddNode,
            0,
            &[graph, u64::from(ty)],
            vec![d, p, e],
            vec![],
        ))
    };
    // A kernel node after k1 over a programmatic edge.
    let k2 = ok(with_edge(
        &mut rig,
        &mut s,
        g::NODE_KERNEL,
        &kernel_params(f, &[]),
        &programmatic.encode(),
    ))[0];
    // One the driver refuses (programmatic edges join kernel nodes only) is not left behind.
    let before = list(&mut rig, &mut s, Op::GraphGetNodes, &[graph, 0]).len();
    let r = with_edge(&mut rig, &mut s, g::NODE_EMPTY, &[], &programmatic.encode());
    assert_eq!(r.status, status::INVALID_VALUE);
    assert_eq!(
        list(&mut rig, &mut s, Op::GraphGetNodes, &[graph, 0]).len(),
        before
    );
    // Malformed edge data: reserved bytes, or not one record per dependency.
    let mut bad = programmatic.encode();
    bad[7] = 1;
    for e in [bad.to_vec(), programmatic.encode()[..4].to_vec()] {
        let r = with_edge(&mut rig, &mut s, g::NODE_KERNEL, &kernel_params(f, &[]), &e);
        assert_eq!(r.status, status::INVALID_VALUE);
    }
    // The edge and the dependency come back with their data.
    let pairs = rig.out(16 * 4);
    let data = rig.out(g::EDGE_DATA_SIZE * 4);
    let r = ok(s.execute(&req(
        Op::GraphGetEdges,
        0,
        &[graph],
        vec![],
        vec![pairs.clone(), data.clone()],
    )));
    assert_eq!(r[0], 1);
    assert_eq!(
        pairs.to_vec().unwrap()[..16],
        u64s(&[k1, k2])[..],
        "k1 -> k2"
    );
    assert_eq!(
        g::EdgeData::decode(&data.to_vec().unwrap()[..8]),
        Some(programmatic)
    );
    let deps = rig.out(8 * 4);
    let data = rig.out(g::EDGE_DATA_SIZE * 4);
    ok(s.execute(&req(
        Op::GraphNodeQuery,
        0,
        &[k2, 1],
        vec![],
        vec![deps, data.clone()],
    )));
    assert_eq!(
        g::EdgeData::decode(&data.to_vec().unwrap()[..8]),
        Some(programmatic)
    );
    // A capture into the graph after k2 over a programmatic edge reports it, and the next
    // captured kernel depends on k2 over it.
    let stream = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    let d = rig.buf(&u64s(&[k2]));
    let e = rig.buf(&programmatic.encode());
    ok(s.execute(&req(
        Op::StreamBeginCaptureToGraph,
        0,
        &[stream, graph, 2],
        vec![d, e],
        vec![],
    )));
    let (_, _, deps, data) = capture_info(&mut rig, &mut s, stream);
    assert_eq!((deps, data), (vec![k2], vec![programmatic]));
    let empty = rig.buf(&[]);
    ok(s.execute(&req(
        Op::LaunchKernel,
        0,
        &launch_args(f, [1, 1, 1], [1, 1, 1], stream),
        vec![empty],
        vec![],
    )));
    ok(run(&mut s, Op::StreamEndCapture, &[stream]));
    let data = rig.out(g::EDGE_DATA_SIZE * 4);
    let r = ok(s.execute(&req(
        Op::GraphGetEdges,
        0,
        &[graph],
        vec![],
        vec![rig.out(16 * 4), data.clone()],
    )));
    assert_eq!(r[0], 2);
    let all = data.to_vec().unwrap();
    assert_eq!(g::EdgeData::decode(&all[8..16]), Some(programmatic));
}

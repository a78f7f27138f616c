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
    ok(add_node(
        &mut rig,
        &mut s,
        graph,
        g::NODE_MEM_FREE,
        &[ms],
        &dptr.to_le_bytes(),
    ));
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

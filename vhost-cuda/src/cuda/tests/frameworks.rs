//! Ops that frameworks' driver calls need, over the fake driver: kernel node attributes, child
//! graph nodes that take their graph, the node-priority instantiate flag.

use qcuda_proto::{
    graph::{self as g, KernelNode, KERNEL_NODE_HEADER},
    LaunchAttr, LAUNCH_ATTR_SIZE,
};

use super::*;

fn add_node(rig: &mut Rig, s: &mut GpuState, graph: u64, ty: u32, params: &[u8]) -> ResponseHeader {
    let d = rig.buf(&[]);
    let p = rig.buf(params);
    s.execute(&req(
        Op::GraphAddNode,
        0,
        &[graph, u64::from(ty)],
        vec![d, p],
        vec![],
    ))
}

/// A graph with one kernel node of vadd; (graph, node).
fn graph_with_kernel(rig: &mut Rig, s: &mut GpuState, f: u64, a: u64) -> (u64, u64) {
    let graph = ok(run(s, Op::GraphCreate, &[]))[0];
    let mut block: Vec<u8> = [a, a, a].iter().flat_map(|x| x.to_le_bytes()).collect();
    block.extend_from_slice(&4i32.to_le_bytes());
    let mut enc = vec![0u8; KERNEL_NODE_HEADER + block.len()];
    KernelNode {
        function: f,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        params: &block,
    }
    .encode(&mut enc);
    let k = ok(add_node(rig, s, graph, g::NODE_KERNEL, &enc))[0];
    (graph, k)
}

fn set_attr(rig: &mut Rig, s: &mut GpuState, node: u64, a: LaunchAttr) -> ResponseHeader {
    let b = rig.buf(&a.encode());
    s.execute(&req(
        Op::GraphKernelNodeSetAttribute,
        0,
        &[node],
        vec![b],
        vec![],
    ))
}

fn get_attr(rig: &mut Rig, s: &mut GpuState, node: u64, id: u32) -> Result<LaunchAttr, u32> {
    let out = rig.out(LAUNCH_ATTR_SIZE);
    let r = s.execute(&req(
        Op::GraphKernelNodeGetAttribute,
        0,
        &[node, u64::from(id)],
        vec![],
        vec![out.clone()],
    ));
    if r.status != status::SUCCESS {
        return Err(r.status);
    }
    Ok(LaunchAttr::decode(&out.to_vec().unwrap()).unwrap())
}

#[test]
fn kernel_node_attributes_are_set_read_and_copied() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let f = ok(get_function(&mut rig, &mut s, m, "vadd", 64).0)[0];
    let a = malloc(&mut s, 256);
    let (graph, k) = graph_with_kernel(&mut rig, &mut s, f, a);
    let (_, k2) = graph_with_kernel(&mut rig, &mut s, f, a);
    let prio = LaunchAttr {
        id: 8,
        v: [u32::MAX - 1, 0, 0],
        w: [0; 2],
    };
    ok(set_attr(&mut rig, &mut s, k, prio));
    let cluster = LaunchAttr {
        id: 4,
        v: [2, 1, 1],
        w: [0; 2],
    };
    ok(set_attr(&mut rig, &mut s, k, cluster));
    assert_eq!(get_attr(&mut rig, &mut s, k, 8), Ok(prio));
    assert_eq!(get_attr(&mut rig, &mut s, k, 4), Ok(cluster));
    // The copy takes them all.
    ok(run(&mut s, Op::GraphKernelNodeCopyAttributes, &[k2, k]));
    assert_eq!(get_attr(&mut rig, &mut s, k2, 8), Ok(prio));
    // The driver's answer for what a node does not take (a stream's synchronisation policy),
    // and the launch rules for what no launch takes.
    let sync = LaunchAttr { id: 3, ..prio };
    assert_eq!(
        set_attr(&mut rig, &mut s, k, sync).status,
        status::INVALID_VALUE
    );
    let unknown = LaunchAttr { id: 99, ..prio };
    assert_eq!(
        set_attr(&mut rig, &mut s, k, unknown).status,
        status::INVALID_VALUE
    );
    // Only kernel nodes of the session.
    let empty = ok(add_node(&mut rig, &mut s, graph, g::NODE_EMPTY, &[]))[0];
    assert_eq!(
        set_attr(&mut rig, &mut s, empty, prio).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        set_attr(&mut rig, &mut s, 0xdead, prio).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::GraphKernelNodeCopyAttributes, &[k2, empty]).status,
        status::INVALID_VALUE
    );
    let short = rig.buf(&prio.encode()[..8]);
    assert_eq!(
        s.execute(&req(
            Op::GraphKernelNodeSetAttribute,
            0,
            &[k],
            vec![short],
            vec![]
        ))
        .status,
        status::INVALID_VALUE
    );
    // XLA's instantiate flag: node priorities in force.
    let exec = ok(run(&mut s, Op::GraphInstantiate, &[graph, 8, 0]))[0];
    ok(run(&mut s, Op::GraphLaunch, &[exec, 0]));
    assert_eq!(ok(run(&mut s, Op::GraphQuery, &[exec, 2]))[0], 8);
}

fn moved(child: u64) -> Vec<u8> {
    [child, g::CHILD_MOVE]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

#[test]
fn a_child_graph_node_takes_its_graph() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let f = ok(get_function(&mut rig, &mut s, m, "vadd", 64).0)[0];
    let a = malloc(&mut s, 256);
    let parent = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    let (child, _) = graph_with_kernel(&mut rig, &mut s, f, a);
    let node = ok(add_node(
        &mut rig,
        &mut s,
        parent,
        g::NODE_GRAPH,
        &moved(child),
    ))[0];
    // The node holds the guest's graph itself: the same handle comes back.
    assert_eq!(ok(run(&mut s, Op::GraphQuery, &[node, 1]))[0], child);
    // A moved graph is the node's: not destroyed on its own, not moved again, and nothing
    // moves into itself.
    assert_eq!(
        run(&mut s, Op::GraphDestroy, &[child]).status,
        status::INVALID_VALUE
    );
    let other = ok(run(&mut s, Op::GraphCreate, &[]))[0];
    assert_eq!(
        add_node(&mut rig, &mut s, other, g::NODE_GRAPH, &moved(child)).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        add_node(&mut rig, &mut s, child, g::NODE_GRAPH, &moved(parent)).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        add_node(&mut rig, &mut s, parent, g::NODE_GRAPH, &moved(parent)).status,
        status::INVALID_VALUE
    );
    let mut bad = moved(other);
    bad[8] = 5;
    assert_eq!(
        add_node(&mut rig, &mut s, parent, g::NODE_GRAPH, &bad).status,
        status::INVALID_VALUE
    );
    // The parent runs it, and takes it along when destroyed.
    let exec = ok(run(&mut s, Op::GraphInstantiate, &[parent, 0, 0]))[0];
    ok(run(&mut s, Op::GraphLaunch, &[exec, 0]));
    ok(run(&mut s, Op::GraphExecDestroy, &[exec]));
    ok(run(&mut s, Op::GraphDestroy, &[parent]));
    assert_eq!(
        run(&mut s, Op::GraphQuery, &[node, 1]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::GraphDestroy, &[child]).status,
        status::INVALID_VALUE
    );
}

#[test]
fn the_driver_release_and_the_pcie_link_reach_the_guest() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let out = rig.out(80);
    let r = ok(s.execute(&req(Op::DriverRelease, 0, &[], vec![], vec![out.clone()])));
    let n = usize::try_from(r[0]).unwrap();
    assert_eq!(&out.to_vec().unwrap()[..n], b"580.95.05");
    // Too small a buffer: the length only, nothing written.
    let small = rig.out(4);
    let r = ok(s.execute(&req(Op::DriverRelease, 0, &[], vec![], vec![small.clone()])));
    assert_eq!((r[0], small.to_vec().unwrap()), (9, vec![0xee; 4]));
    let info = rig.out(qcuda_proto::GPU_INFO_SIZE);
    ok(s.execute(&req(Op::DeviceInfo, 0, &[], vec![], vec![info.clone()])));
    let g = qcuda_proto::GpuInfo::decode(&info.to_vec().unwrap()).unwrap();
    assert_eq!(g.pcie_link, [4, 16, 5, 16]);
}

#[test]
fn a_module_load_with_options_answers_with_the_jits_logs() {
    use qcuda_proto::link::{encode_link, LinkOption};
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let options = |opts: &[LinkOption]| {
        let mut b = Vec::new();
        encode_link(opts, &[], |x| b.extend_from_slice(x)).unwrap();
        b
    };
    let load = |rig: &mut Rig, s: &mut GpuState, image: &[u8], opts: &[u8], room: usize| {
        let (i, o, out) = (rig.buf(image), rig.buf(opts), rig.out(room));
        let r = s.execute(&req(
            Op::ModuleLoadLogged,
            0,
            &[],
            vec![i, o],
            vec![out.clone()],
        ));
        (r, out.to_vec().unwrap())
    };
    let image = PTX.to_vec();
    let (r, out) = load(
        &mut rig,
        &mut s,
        &image,
        &options(&[LinkOption { id: 7, value: 3 }]),
        256,
    );
    let [m, info, error, code, ..] = ok(r);
    assert_ne!(m, 0);
    assert_eq!((error, code), (0, 0));
    let info = usize::try_from(info).unwrap();
    // The image as the driver got it: with the NUL PTX needs.
    assert_eq!(
        &out[..info],
        format!("fake JIT: {} bytes, 1 options", image.len() + 1).as_bytes()
    );
    // The module is the session's, as one from ModuleLoad.
    ok(run(&mut s, Op::ModuleUnload, &[m]));
    // A refused image: the driver's code and its error log, as an answer.
    let (r, out) = load(
        &mut rig,
        &mut s,
        b".version 9.0\n.bad\n",
        &options(&[]),
        256,
    );
    let [m, info, error, code, ..] = ok(r);
    assert_eq!((m, info), (0, 0));
    assert_eq!(code, 218);
    assert_eq!(
        &out[..usize::try_from(error).unwrap()],
        b"fake JIT: ptxas refused .bad"
    );
    // Pointer options (a symbol table, the wall time) and inputs are refused; logs are cut
    // to the room given.
    let bad = options(&[LinkOption { id: 2, value: 0 }]);
    assert_eq!(
        load(&mut rig, &mut s, &image, &bad, 64).0.status,
        status::INVALID_VALUE
    );
    let (r, _) = load(&mut rig, &mut s, &image, &options(&[]), 4);
    assert_eq!(ok(r)[1], 4);
    assert_eq!(
        load(&mut rig, &mut s, &image, b"junk", 64).0.status,
        status::INVALID_VALUE
    );
}

#[test]
fn tensor_maps_are_encoded_by_the_driver_and_checked_first() {
    use qcuda_proto::tensor_map::{TensorMapRequest, TENSOR_MAP_REPLACE_ADDRESS, TENSOR_MAP_TILED};
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let mut encode = |r: &TensorMapRequest, room: usize| {
        let (i, out) = (rig.buf(&r.encode()), rig.out(room));
        let h = s.execute(&req(
            Op::TensorMapEncode,
            0,
            &[],
            vec![i],
            vec![out.clone()],
        ));
        (h.status, out.to_vec().unwrap())
    };
    let r = TensorMapRequest {
        kind: TENSOR_MAP_TILED,
        data_type: 6,
        rank: 2,
        address: 0x7f00_0000_0000,
        global_dim: [1024, 512, 0, 0, 0],
        global_strides: [2048, 0, 0, 0],
        box_dim: [64, 64, 0, 0, 0],
        element_strides: [1, 1, 0, 0, 0],
        ..TensorMapRequest::default()
    };
    let (st, map) = encode(&r, 128);
    assert_eq!(st, status::SUCCESS);
    assert_eq!(&map[..8], &r.address.to_le_bytes());
    let mut moved = TensorMapRequest {
        kind: TENSOR_MAP_REPLACE_ADDRESS,
        rank: 0,
        address: 0x7f00_0010_0000,
        ..TensorMapRequest::default()
    };
    moved.map.copy_from_slice(&map[..128]);
    let (st, again) = encode(&moved, 128);
    assert_eq!(st, status::SUCCESS);
    assert_eq!(
        (&again[..8], &again[8..128]),
        (&moved.address.to_le_bytes()[..], &map[8..128])
    );
    // The driver's checks (the fake's: alignment), and ours: rank, kind, sizes.
    assert_eq!(
        encode(
            &TensorMapRequest {
                address: 0x7f00_0000_0004,
                ..r
            },
            128
        )
        .0,
        status::INVALID_VALUE
    );
    assert_eq!(
        encode(&TensorMapRequest { rank: 6, ..r }, 128).0,
        status::INVALID_VALUE
    );
    assert_eq!(
        encode(&TensorMapRequest { kind: 9, ..r }, 128).0,
        status::INVALID_VALUE
    );
    assert_eq!(encode(&r, 64).0, status::INVALID_VALUE);
}

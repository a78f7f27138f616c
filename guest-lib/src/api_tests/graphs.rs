use std::{ffi::c_void, ptr};

use qcuda_proto::{
    graph::{self as g, KernelNode, MemcpyNode, MemsetNode},
    Op,
};

use super::*;
use crate::{
    generated::{self as cu, cudaGraphExec_t, cudaGraphNode_t, cudaGraph_t, cudaStream_t, dim3},
    runtime::{graphs::*, memory::*, streams::*},
};

fn d3(x: u32) -> dim3 {
    dim3 { x, y: 1, z: 1 }
}

#[test]
fn an_explicit_graph_is_built_queried_instantiated_and_launched() {
    let fake = setup();
    fake.add_kernel("_Z3addPfi", &[(0, 8), (8, 4)]);
    let global = fake.add_global("table", 64);
    let fatbin = register_fatbin();
    let add = register_kernel(fatbin, c"_Z3addPfi");
    let table = register_var(fatbin, c"table", 64);
    let mut graph: cudaGraph_t = ptr::null_mut();
    let mut dev: *mut c_void = ptr::null_mut();
    let mut pinned: *mut c_void = ptr::null_mut();
    let mut pageable = vec![0u8; 256];
    // SAFETY: valid out-pointers and parameter blocks throughout.
    unsafe {
        ok(cudaGraphCreate(&raw mut graph, 0));
        assert_err(
            cudaGraphCreate(&raw mut graph, 1),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaMalloc(&raw mut dev, 256));
        ok(cudaMallocHost(&raw mut pinned, 256));

        let (mut p, mut n): (u64, i32) = (dev as u64, 64);
        let mut args: [*mut c_void; 2] = [(&raw mut p).cast(), (&raw mut n).cast()];
        let kp = cu::cudaKernelNodeParams {
            func: add as *mut c_void,
            gridDim: d3(2),
            blockDim: d3(32),
            sharedMemBytes: 0,
            kernelParams: args.as_mut_ptr(),
            extra: ptr::null_mut(),
        };
        let mut k: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddKernelNode(
            &raw mut k,
            graph,
            ptr::null(),
            0,
            &raw const kp,
        ));
        let mut back = cu::cudaKernelNodeParams::default();
        ok(cudaGraphKernelNodeGetParams(k, &raw mut back));
        assert_eq!(
            (back.func as usize, back.gridDim.x, back.blockDim.x),
            (add, 2, 32)
        );
        assert_eq!(*(*back.kernelParams).cast::<u64>(), dev as u64);
        assert_eq!(*(*back.kernelParams.add(1)).cast::<i32>(), 64);
        let set = cu::cudaMemsetParams {
            dst: dev,
            pitch: 0,
            value: 1,
            elementSize: 4,
            width: 64,
            height: 1,
        };
        let mut ms: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddMemsetNode(
            &raw mut ms,
            graph,
            &raw const k,
            1,
            &raw const set,
        ));
        let mut cp: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddMemcpyNode1D(
            &raw mut cp,
            graph,
            &raw const ms,
            1,
            pinned,
            dev,
            256,
            cu::cudaMemcpyDeviceToHost,
        ));
        let mut back_set = cu::cudaMemsetParams::default();
        ok(cudaGraphMemsetNodeGetParams(ms, &raw mut back_set));
        assert_eq!((back_set.dst, back_set.value, back_set.width), (dev, 1, 64));
        let mut back_cp = cu::cudaMemcpy3DParms::default();
        ok(cudaGraphMemcpyNodeGetParams(cp, &raw mut back_cp));
        assert_eq!(
            (back_cp.dstPtr.ptr, back_cp.srcPtr.ptr, back_cp.extent.width),
            (pinned, dev, 256)
        );
        assert_err(
            cudaGraphMemsetNodeGetParams(cp, &raw mut back_set),
            cu::cudaErrorInvalidValue,
        );
        // Pageable host memory as a memcpy node's host side is pinned and mapped for the
        // worker, which runs the copy whenever the graph runs.
        let mut bad: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddMemcpyNode1D(
            &raw mut bad,
            graph,
            ptr::null(),
            0,
            pageable.as_mut_ptr().cast(),
            dev,
            256,
            cu::cudaMemcpyDeviceToHost,
        ));
        let pinned_for_graph = crate::core::runtime::runtime()
            .unwrap()
            .host_memory
            .find(pageable.as_ptr() as usize)
            .unwrap();
        assert_eq!(
            pinned_for_graph.kind,
            crate::core::memory::host::HostKind::GraphPinned
        );
        ok(cudaGraphDestroyNode(bad));
        // A host node needs a function; with one, it carries the key of the process's host
        // function and gives its parameters back.
        let mut hp = cu::cudaHostNodeParams {
            fn_: None,
            userData: ptr::null_mut(),
        };
        assert_err(
            cudaGraphAddHostNode(&raw mut bad, graph, ptr::null(), 0, &raw const hp),
            cu::cudaErrorInvalidValue,
        );
        unsafe extern "C" fn nothing(_: *mut c_void) {}
        hp.fn_ = Some(nothing);
        hp.userData = 0x55 as *mut c_void;
        let mut host: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddHostNode(
            &raw mut host,
            graph,
            ptr::null(),
            0,
            &raw const hp,
        ));
        let mut back = cu::cudaHostNodeParams {
            fn_: None,
            userData: ptr::null_mut(),
        };
        ok(cudaGraphHostNodeGetParams(host, &raw mut back));
        assert_eq!(back.userData, 0x55 as *mut c_void);
        assert_eq!(fake.state().graphs.nodes[&(host as u64)].ty, g::NODE_HOST);
        ok(cudaGraphDestroyNode(host));

        {
            let st = fake.state();
            let node = &st.graphs.nodes[&(k as u64)];
            assert_eq!(node.ty, g::NODE_KERNEL);
            let kn = KernelNode::decode(&node.params).unwrap();
            assert_eq!((kn.grid, kn.block), ([2, 1, 1], [32, 1, 1]));
            assert_eq!(kn.params[..8], (dev as u64).to_le_bytes());
            assert_eq!(kn.params[8..12], 64i32.to_le_bytes());
            let m = MemcpyNode::decode(&st.graphs.nodes[&(cp as u64)].params).unwrap();
            assert_eq!((m.dst, m.src, m.width), (pinned as u64, dev as u64, 256));
            assert_eq!(st.graphs.nodes[&(cp as u64)].deps, vec![ms as u64]);
        }

        let mut count = 0usize;
        ok(cudaGraphGetNodes(graph, ptr::null_mut(), &raw mut count));
        assert_eq!(count, 3);
        let mut nodes = [ptr::null_mut(); 4];
        count = 4;
        ok(cudaGraphGetNodes(graph, nodes.as_mut_ptr(), &raw mut count));
        assert_eq!((count, nodes), (3, [k, ms, cp, ptr::null_mut()]));
        count = 4;
        ok(cudaGraphGetRootNodes(
            graph,
            nodes.as_mut_ptr(),
            &raw mut count,
        ));
        assert_eq!((count, nodes[0]), (1, k));
        let mut ty = 99;
        ok(cudaGraphNodeGetType(cp, &raw mut ty));
        assert_eq!(ty, cu::cudaGraphNodeTypeMemcpy);
        count = 4;
        ok(cudaGraphNodeGetDependentNodes(
            k,
            nodes.as_mut_ptr(),
            ptr::null_mut(),
            &raw mut count,
        ));
        assert_eq!((count, nodes[0]), (1, ms));
        let (mut from, mut to) = ([ptr::null_mut(); 4], [ptr::null_mut(); 4]);
        count = 4;
        ok(cudaGraphGetEdges(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            ptr::null_mut(),
            &raw mut count,
        ));
        assert_eq!((count, from[0], to[0]), (2, k, ms));

        // Copies to and from a __device__ variable.
        let mut sym: cudaGraphNode_t = ptr::null_mut();
        let t = table as *const c_void;
        ok(cudaGraphAddMemcpyNodeToSymbol(
            &raw mut sym,
            graph,
            ptr::null(),
            0,
            t,
            pinned,
            16,
            8,
            cu::cudaMemcpyHostToDevice,
        ));
        let m = MemcpyNode::decode(&fake.state().graphs.nodes[&(sym as u64)].params).unwrap();
        assert_eq!((m.dst, m.src, m.width), (global + 8, pinned as u64, 16));
        assert_err(
            cudaGraphAddMemcpyNodeToSymbol(
                &raw mut sym,
                graph,
                ptr::null(),
                0,
                t,
                pinned,
                64,
                8,
                cu::cudaMemcpyHostToDevice,
            ),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaGraphAddMemcpyNodeFromSymbol(
                &raw mut sym,
                graph,
                ptr::null(),
                0,
                pinned,
                t,
                8,
                0,
                cu::cudaMemcpyHostToDevice,
            ),
            cu::cudaErrorInvalidMemcpyDirection,
        );
        ok(cudaGraphAddMemcpyNodeFromSymbol(
            &raw mut sym,
            graph,
            ptr::null(),
            0,
            pinned,
            t,
            8,
            0,
            cu::cudaMemcpyDefault,
        ));

        // The generic form: a memset node through cudaGraphAddNode, then changed.
        let mut gp = cu::cudaGraphNodeParams {
            type_: cu::cudaGraphNodeTypeMemset,
            ..Default::default()
        };
        gp.__bindgen_anon_1.memset = cu::cudaMemsetParamsV2 {
            dst: dev,
            pitch: 0,
            value: 9,
            elementSize: 1,
            width: 16,
            height: 1,
        };
        let mut generic: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddNode(
            &raw mut generic,
            graph,
            &raw const cp,
            ptr::null(),
            1,
            &raw mut gp,
        ));
        assert_eq!(
            fake.state().graphs.nodes[&(generic as u64)].ty,
            g::NODE_MEMSET
        );
        gp.__bindgen_anon_1.memset.width = 8;
        ok(cudaGraphNodeSetParams(generic, &raw mut gp));
        let set = MemsetNode::decode(&fake.state().graphs.nodes[&(generic as u64)].params).unwrap();
        assert_eq!((set.width, set.value, set.element_size), (8, 9, 1));
        gp.type_ = cu::cudaGraphNodeTypeExtSemaphoreSignal;
        assert_err(
            cudaGraphAddNode(
                &raw mut generic,
                graph,
                ptr::null(),
                ptr::null(),
                0,
                &raw mut gp,
            ),
            cu::cudaErrorNotSupported,
        );
        // Memory nodes: the allocation's address comes back in the parameters.
        let mut ap = cu::cudaMemAllocNodeParams::default();
        ap.poolProps.allocType = cu::cudaMemAllocationTypePinned;
        ap.poolProps.location.type_ = cu::cudaMemLocationTypeDevice;
        ap.bytesize = 4096;
        let mut alloc: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddMemAllocNode(
            &raw mut alloc,
            graph,
            ptr::null(),
            0,
            &raw mut ap,
        ));
        assert_eq!(ap.dptr as u64, 0x7000_0000);
        let mut attr = cu::cudaPointerAttributes::default();
        ok(cudaPointerGetAttributes(&raw mut attr, ap.dptr));
        assert_eq!(attr.type_, cu::cudaMemoryTypeDevice);
        let mut free: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddMemFreeNode(
            &raw mut free,
            graph,
            &raw const alloc,
            1,
            ap.dptr,
        ));
        // What the memory nodes hold, read back (and only from memory nodes).
        let mut back: cu::cudaMemAllocNodeParams = std::mem::zeroed();
        ok(cudaGraphMemAllocNodeGetParams(alloc, &raw mut back));
        assert_eq!((back.dptr, back.bytesize), (ap.dptr, ap.bytesize));
        assert_eq!(back.poolProps.location.type_, cu::cudaMemLocationTypeDevice);
        let mut freed: *mut c_void = ptr::null_mut();
        ok(cudaGraphMemFreeNodeGetParams(free, (&raw mut freed).cast()));
        assert_eq!(freed, ap.dptr);
        assert_err(
            cudaGraphMemFreeNodeGetParams(alloc, (&raw mut freed).cast()),
            cu::cudaErrorInvalidValue,
        );
        ap.poolProps.location.id = 3;
        assert_err(
            cudaGraphAddMemAllocNode(&raw mut alloc, graph, ptr::null(), 0, &raw mut ap),
            cu::cudaErrorInvalidDevice,
        );

        let mut exec: cudaGraphExec_t = ptr::null_mut();
        ok(cudaGraphInstantiate(&raw mut exec, graph, 0));
        for _ in 0..5 {
            ok(cudaGraphLaunch(exec, ptr::null_mut()));
        }
        assert_eq!(fake.state().graphs.execs[&(exec as u64)].1, 5);
        ok(cudaGraphExecKernelNodeSetParams(exec, k, &raw const kp));

        let mut clone: cudaGraph_t = ptr::null_mut();
        ok(cudaGraphClone(&raw mut clone, graph));
        let mut k_clone: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphNodeFindInClone(&raw mut k_clone, k, clone));
        assert!(!k_clone.is_null() && k_clone != k);
        let mut spare: cudaGraph_t = ptr::null_mut();
        ok(cudaGraphClone(&raw mut spare, graph));
        let mut spare_k: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphNodeFindInClone(&raw mut spare_k, k, spare));
        ok(cudaGraphDestroyNode(spare_k));
        assert_err(
            cudaGraphNodeGetType(spare_k, &raw mut ty),
            cu::cudaErrorInvalidValue,
        );
        let mut info = cu::cudaGraphExecUpdateResultInfo::default();
        ok(cudaGraphExecUpdate(exec, clone, &raw mut info));
        let mut other: cudaGraph_t = ptr::null_mut();
        ok(cudaGraphCreate(&raw mut other, 0));
        assert_err(
            cudaGraphExecUpdate(exec, other, &raw mut info),
            cu::cudaErrorGraphExecUpdateFailure,
        );
        assert_eq!(info.result, cu::cudaGraphExecUpdateErrorTopologyChanged);

        let mut flags = 7;
        ok(cudaGraphExecGetFlags(exec, &raw mut flags));
        assert_eq!(flags, 0);
        ok(cudaGraphExecDestroy(exec));
        assert_err(cudaGraphExecDestroy(exec), cu::cudaErrorInvalidValue);
        ok(cudaGraphDestroy(graph));
        assert_err(
            cudaGraphNodeGetType(k, &raw mut ty),
            cu::cudaErrorInvalidValue,
        );

        // No memory nodes, so no graph memory.
        ok(cudaDeviceGraphMemTrim(0));
        assert_err(cudaDeviceGraphMemTrim(5), cu::cudaErrorInvalidDevice);
        let mut amount = 7u64;
        ok(cudaDeviceGetGraphMemAttribute(
            0,
            2,
            (&raw mut amount).cast(),
        ));
        assert_eq!(amount, 0);
        ok(cudaDeviceSetGraphMemAttribute(
            0,
            1,
            (&raw mut amount).cast(),
        ));
        assert_err(
            cudaDeviceSetGraphMemAttribute(0, 0, (&raw mut amount).cast()),
            cu::cudaErrorInvalidValue,
        );
    }
}

#[test]
fn capture_follows_the_modes_and_waits_for_every_call() {
    let fake = setup();
    let mut s: cudaStream_t = ptr::null_mut();
    let mut p: *mut c_void = ptr::null_mut();
    let mut status = 9;
    // SAFETY: valid out-pointers throughout.
    unsafe {
        ok(cudaStreamCreate(&raw mut s));
        ok(cudaMalloc(&raw mut p, 64));
        assert_err(
            cudaStreamBeginCapture(ptr::null_mut(), cu::cudaStreamCaptureModeGlobal),
            cu::cudaErrorStreamCaptureUnsupported,
        );
        assert_err(cudaStreamBeginCapture(s, 7), cu::cudaErrorInvalidValue);
        // Global mode: potentially unsafe calls are refused, and the capture is invalidated.
        ok(cudaStreamBeginCapture(s, cu::cudaStreamCaptureModeGlobal));
        ok(cudaStreamIsCapturing(s, &raw mut status));
        assert_eq!(status, cu::cudaStreamCaptureStatusActive);
        let mut q: *mut c_void = ptr::null_mut();
        assert_err(
            cudaMalloc(&raw mut q, 64),
            cu::cudaErrorStreamCaptureUnsupported,
        );
        assert!(fake.ops().contains(&Op::StreamCaptureInvalidate));
        let mut failed: cudaGraph_t = 1 as cudaGraph_t;
        assert_err(
            cudaStreamEndCapture(s, &raw mut failed),
            cu::cudaErrorStreamCaptureInvalidated,
        );
        assert!(failed.is_null());

        // In relaxed mode they are allowed.
        ok(cudaStreamBeginCapture(s, cu::cudaStreamCaptureModeGlobal));
        let mut mode = cu::cudaStreamCaptureModeRelaxed;
        ok(cudaThreadExchangeStreamCaptureMode(&raw mut mode));
        assert_eq!(mode, cu::cudaStreamCaptureModeGlobal);
        ok(cudaMalloc(&raw mut q, 64));
        ok(cudaThreadExchangeStreamCaptureMode(&raw mut mode));

        // During capture nothing is fire-and-forget, so refusals come back at the call.
        let before = fake.state().log.len();
        ok(cudaMemsetAsync(p, 0, 64, s));
        assert!(!fake.state().log[before].fire_and_forget);
        // A captured copy of pageable memory pins and maps it, and is the driver's copy.
        let mut host = [0u8; 64];
        ok(cudaMemcpyAsync(
            host.as_mut_ptr().cast(),
            p,
            64,
            cu::cudaMemcpyDeviceToHost,
            s,
        ));
        assert_eq!(fake.ops().last(), Some(&Op::MemcpyMapped));

        let mut deps: *const cudaGraphNode_t = ptr::null();
        let mut n = 0usize;
        let mut id = 0u64;
        let mut gr: cudaGraph_t = ptr::null_mut();
        ok(cudaStreamGetCaptureInfo(
            s,
            &raw mut status,
            &raw mut id,
            &raw mut gr,
            &raw mut deps,
            ptr::null_mut(),
            &raw mut n,
        ));
        assert_eq!((status, n), (cu::cudaStreamCaptureStatusActive, 0));
        assert!(!gr.is_null() && id != 0);

        let mut graph: cudaGraph_t = ptr::null_mut();
        ok(cudaStreamEndCapture(s, &raw mut graph));
        assert_eq!(graph, gr);
        ok(cudaStreamIsCapturing(s, &raw mut status));
        assert_eq!(status, cu::cudaStreamCaptureStatusNone);
        // Capture over: back to fire-and-forget, and cudaMalloc is fine again.
        let before = fake.state().log.len();
        ok(cudaMemsetAsync(p, 0, 64, s));
        flush();
        assert!(fake.state().log[before].fire_and_forget);
        ok(cudaMalloc(&raw mut q, 64));
        assert!(fake.ops().contains(&Op::StreamEndCapture));

        // Capture into an existing graph: the same graph comes back.
        let mut into: cudaGraph_t = ptr::null_mut();
        ok(cudaGraphCreate(&raw mut into, 0));
        let mut first: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddEmptyNode(&raw mut first, into, ptr::null(), 0));
        ok(cudaStreamBeginCaptureToGraph(
            s,
            into,
            &raw const first,
            ptr::null(),
            1,
            cu::cudaStreamCaptureModeRelaxed,
        ));
        ok(cudaStreamEndCapture(s, &raw mut graph));
        assert_eq!(graph, into);
    }
}

#[test]
fn edge_data_travels_with_nodes_edges_and_captures() {
    // Programmatic edges (what programmatic dependent launches make, and what programs pass
    // on from cudaStreamGetCaptureInfo) reach the host and come back; a query without room for
    // them fails with cudaErrorLossyQuery, as in CUDA.
    let fake = setup();
    let programmatic = cu::cudaGraphEdgeData {
        from_port: 1,
        to_port: 0,
        type_: 1,
        reserved: [0; 5],
    };
    let mut graph: cudaGraph_t = ptr::null_mut();
    let mut s: cudaStream_t = ptr::null_mut();
    // SAFETY: valid out-pointers and arrays throughout.
    unsafe {
        ok(cudaGraphCreate(&raw mut graph, 0));
        let mut a: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddEmptyNode(&raw mut a, graph, ptr::null(), 0));
        let mut params = cu::cudaGraphNodeParams {
            type_: cu::cudaGraphNodeTypeEmpty,
            ..Default::default()
        };
        let mut b: cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddNode(
            &raw mut b,
            graph,
            &raw const a,
            &raw const programmatic,
            1,
            &raw mut params,
        ));
        let mut bad = programmatic;
        bad.reserved[2] = 1;
        let mut c: cudaGraphNode_t = ptr::null_mut();
        assert_err(
            cudaGraphAddNode(
                &raw mut c,
                graph,
                &raw const a,
                &raw const bad,
                1,
                &raw mut params,
            ),
            cu::cudaErrorInvalidValue,
        );
        let mut from = [ptr::null_mut(); 2];
        let mut to = [ptr::null_mut(); 2];
        let mut data = [cu::cudaGraphEdgeData::default(); 2];
        let mut n = 2usize;
        ok(cudaGraphGetEdges(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &raw mut n,
        ));
        assert_eq!((n, from[0], to[0]), (1, a, b));
        assert_eq!((data[0].from_port, data[0].type_), (1, 1));
        n = 2;
        assert_err(
            cudaGraphGetEdges(
                graph,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                ptr::null_mut(),
                &raw mut n,
            ),
            cu::cudaErrorLossyQuery,
        );
        let mut deps = [ptr::null_mut(); 1];
        let mut dep_data = [cu::cudaGraphEdgeData::default(); 1];
        n = 1;
        ok(cudaGraphNodeGetDependencies(
            b,
            deps.as_mut_ptr(),
            dep_data.as_mut_ptr(),
            &raw mut n,
        ));
        assert_eq!((deps[0], dep_data[0].type_), (a, 1));
        // Removing and adding edges carries their data too.
        ok(cudaGraphRemoveDependencies(
            graph,
            &raw const a,
            &raw const b,
            &raw const programmatic,
            1,
        ));
        ok(cudaGraphAddDependencies(
            graph,
            &raw const a,
            &raw const b,
            &raw const programmatic,
            1,
        ));
        assert_eq!(
            fake.state().graphs.nodes[&(b as u64)].edges[&(a as u64)].kind,
            1
        );

        // A capture into the graph after `b` over a programmatic edge: the capture's
        // dependencies carry it, and a query that cannot hold it is lossy.
        ok(cudaStreamCreate(&raw mut s));
        ok(cudaStreamBeginCaptureToGraph(
            s,
            graph,
            &raw const b,
            &raw const programmatic,
            1,
            cu::cudaStreamCaptureModeRelaxed,
        ));
        let mut status = 0;
        let mut out: *const cudaGraphNode_t = ptr::null();
        let mut out_edges: *const cu::cudaGraphEdgeData = ptr::null();
        ok(cudaStreamGetCaptureInfo(
            s,
            &raw mut status,
            ptr::null_mut(),
            ptr::null_mut(),
            &raw mut out,
            &raw mut out_edges,
            &raw mut n,
        ));
        assert_eq!((n, *out, (*out_edges).type_), (1, b, 1));
        assert_err(
            cudaStreamGetCaptureInfo(
                s,
                &raw mut status,
                ptr::null_mut(),
                ptr::null_mut(),
                &raw mut out,
                ptr::null_mut(),
                &raw mut n,
            ),
            cu::cudaErrorLossyQuery,
        );
        // Set back to a default edge: nothing is lost any more.
        let mut node = b;
        ok(cudaStreamUpdateCaptureDependencies(
            s,
            &raw mut node,
            ptr::null(),
            1,
            1,
        ));
        ok(cudaStreamGetCaptureInfo(
            s,
            &raw mut status,
            ptr::null_mut(),
            ptr::null_mut(),
            &raw mut out,
            ptr::null_mut(),
            &raw mut n,
        ));
        ok(cudaStreamEndCapture(s, ptr::null_mut()));
        ok(cudaGraphDestroy(graph));
    }
}

//! Conditional nodes built the way NVIDIA's samples (graphConditionalNodes) and other public
//! programs build them, through both faces: bodies filled by capture into them
//! (`cudaStreamBeginCaptureToGraph`, ended with a null graph pointer), and conditional nodes
//! added to a graph while it is being captured (the handle made on the graph
//! `cudaStreamGetCaptureInfo` names, the node after the capture's dependencies, the capture
//! moved past it with `cudaStreamUpdateCaptureDependencies`), their bodies captured before or
//! after the outer capture ends, on another stream or on the same one.

use std::{ffi::c_void, ptr};

use qcuda_proto::{graph as g, Op};

use super::*;
use crate::{
    driver::{
        api::{context::*, graph::*, init::*},
        status::DriverError,
    },
    generated::driver_api as d,
    generated::{
        self as cu, cudaGraphConditionalHandle, cudaGraphExec_t, cudaGraphNode_t, cudaGraph_t,
        cudaStream_t, dim3,
    },
    runtime::{graphs::*, launch::cudaLaunchKernel, memory::*, streams::*},
};

#[track_caller]
fn cu(r: d::CUresult) {
    assert_eq!(DriverError::check(r), Ok(()));
}

const ONE: dim3 = dim3 { x: 1, y: 1, z: 1 };

/// A kernel `(char *, cudaGraphConditionalHandle)` as the samples' kernels are.
fn step_kernel(fake: &crate::core::fake_device::FakeDevice) -> usize {
    fake.add_kernel("_Z4stepPcy", &[(0, 8), (8, 8)]);
    register_kernel(register_fatbin(), c"_Z4stepPcy")
}

/// Launches `kernel(ptr, handle)` into `stream`.
///
/// # Safety
/// `kernel` is a registered `(char *, u64)` kernel.
unsafe fn launch(kernel: usize, stream: cudaStream_t, p: *mut c_void, h: u64) {
    let (mut p, mut h) = (p as u64, h);
    let mut args: [*mut c_void; 2] = [(&raw mut p).cast(), (&raw mut h).cast()];
    // SAFETY: two parameters of the kernel's layout.
    ok(unsafe {
        cudaLaunchKernel(
            kernel as *const c_void,
            ONE,
            ONE,
            args.as_mut_ptr(),
            0,
            stream,
        )
    });
}

fn conditional(handle: u64, kind: u32, size: u32) -> cu::cudaGraphNodeParams {
    let mut p = cu::cudaGraphNodeParams {
        type_: cu::cudaGraphNodeTypeConditional,
        ..Default::default()
    };
    p.__bindgen_anon_1.conditional.handle = handle;
    p.__bindgen_anon_1.conditional.type_ = kind;
    p.__bindgen_anon_1.conditional.size = size;
    p
}

/// The bodies a conditional node's parameters point at after `cudaGraphAddNode`.
///
/// # Safety
/// `p` was filled by a successful `cudaGraphAddNode` of a conditional node.
unsafe fn bodies(p: &cu::cudaGraphNodeParams) -> Vec<cudaGraph_t> {
    // SAFETY: CUDA's array of `size` body graphs (caller contract).
    unsafe {
        let c = &p.__bindgen_anon_1.conditional;
        std::slice::from_raw_parts(c.phGraph_out, c.size as usize).to_vec()
    }
}

fn node_count(graph: cudaGraph_t) -> usize {
    let mut n = 0usize;
    // SAFETY: a live graph; counting only.
    ok(unsafe { cudaGraphGetNodes(graph, ptr::null_mut(), &raw mut n) });
    n
}

/// The graph's edges, as (from, to).
fn edges(graph: cudaGraph_t) -> Vec<(cudaGraphNode_t, cudaGraphNode_t)> {
    let mut n = 0usize;
    // SAFETY: a live graph; the arrays hold `n` entries.
    unsafe {
        ok(cudaGraphGetEdges(
            graph,
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            &raw mut n,
        ));
        let mut from = vec![ptr::null_mut(); n];
        let mut to = vec![ptr::null_mut(); n];
        ok(cudaGraphGetEdges(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            ptr::null_mut(),
            &raw mut n,
        ));
        from.into_iter().zip(to).collect()
    }
}

/// (status, graph, dependencies) of `stream`'s capture.
fn capture_info(stream: cudaStream_t) -> (u32, cudaGraph_t, Vec<cudaGraphNode_t>) {
    let mut status = 9;
    let mut graph: cudaGraph_t = ptr::null_mut();
    let mut deps: *const cudaGraphNode_t = ptr::null();
    let mut edges: *const cu::cudaGraphEdgeData = ptr::null();
    let mut n = 0usize;
    // SAFETY: valid out-pointers; the arrays live until this thread's next call.
    unsafe {
        ok(cudaStreamGetCaptureInfo(
            stream,
            &raw mut status,
            ptr::null_mut(),
            &raw mut graph,
            &raw mut deps,
            &raw mut edges,
            &raw mut n,
        ));
        let list = if n == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(deps, n).to_vec()
        };
        (status, graph, list)
    }
}

fn run_twice(graph: cudaGraph_t, stream: cudaStream_t) {
    let mut exec: cudaGraphExec_t = ptr::null_mut();
    // SAFETY: a live graph and stream.
    unsafe {
        ok(cudaGraphInstantiate(&raw mut exec, graph, 0));
        for _ in 0..2 {
            ok(cudaGraphLaunch(exec, stream));
            ok(cudaStreamSynchronize(stream));
        }
        ok(cudaGraphExecDestroy(exec));
    }
}

#[test]
fn a_do_while_body_captured_into_ends_with_a_null_graph_pointer() {
    // graphConditionalNodes' simpleDoWhileGraph: this failed with cudaErrorInvalidValue at
    // cudaStreamEndCapture, leaving the body empty and the loop running for ever.
    let fake = setup();
    let kernel = step_kernel(&fake);
    let mut graph: cudaGraph_t = ptr::null_mut();
    let mut handle: cudaGraphConditionalHandle = 0;
    let mut node: cudaGraphNode_t = ptr::null_mut();
    let mut stream: cudaStream_t = ptr::null_mut();
    let mut counter: *mut c_void = ptr::null_mut();
    // SAFETY: valid out-pointers and parameters throughout.
    unsafe {
        ok(cudaMalloc(&raw mut counter, 1));
        ok(cudaGraphCreate(&raw mut graph, 0));
        ok(cudaGraphConditionalHandleCreate(
            &raw mut handle,
            graph,
            1,
            1,
        ));
        let mut p = conditional(handle, cu::cudaGraphCondTypeWhile, 1);
        ok(cudaGraphAddNode(
            &raw mut node,
            graph,
            ptr::null(),
            ptr::null(),
            0,
            &raw mut p,
        ));
        let body = bodies(&p)[0];
        ok(cudaStreamCreate(&raw mut stream));
        ok(cudaStreamBeginCaptureToGraph(
            stream,
            body,
            ptr::null(),
            ptr::null(),
            0,
            cu::cudaStreamCaptureModeGlobal,
        ));
        for _ in 0..3 {
            launch(kernel, stream, counter, handle);
        }
        ok(cudaStreamEndCapture(stream, ptr::null_mut()));
        let mut status = 9;
        ok(cudaStreamIsCapturing(stream, &raw mut status));
        assert_eq!(status, cu::cudaStreamCaptureStatusNone);
        // The three launches are the body, in order.
        assert_eq!(node_count(body), 3);
        assert_eq!(edges(body).len(), 2);
        ok(cudaStreamDestroy(stream));
        run_twice(graph, ptr::null_mut());
        // Ending a capture that is not under way still fails, pointer or not.
        let mut other: cudaStream_t = ptr::null_mut();
        ok(cudaStreamCreate(&raw mut other));
        assert_err(
            cudaStreamEndCapture(other, ptr::null_mut()),
            cu::cudaErrorIllegalState,
        );
        ok(cudaGraphDestroy(graph));
    }
    assert!(fake.ops().contains(&Op::StreamBeginCaptureToGraph));
}

#[test]
fn a_while_node_is_added_to_a_graph_under_capture_as_the_samples_do() {
    // graphConditionalNodes' capturedWhileGraph: the handle on the capture's own graph, the
    // node after the captured kernel, the capture moved past the node, the body captured after
    // the outer capture ended, on another stream.
    let fake = setup();
    let kernel = step_kernel(&fake);
    let mut counter: *mut c_void = ptr::null_mut();
    let mut cs: cudaStream_t = ptr::null_mut();
    let mut handle: cudaGraphConditionalHandle = 0;
    let mut node: cudaGraphNode_t = ptr::null_mut();
    // SAFETY: valid out-pointers and parameters throughout.
    unsafe {
        ok(cudaMalloc(&raw mut counter, 1));
        ok(cudaStreamCreate(&raw mut cs));
        ok(cudaStreamBeginCapture(cs, cu::cudaStreamCaptureModeGlobal));
        let (status, graph, deps) = capture_info(cs);
        assert_eq!(status, cu::cudaStreamCaptureStatusActive);
        assert!(!graph.is_null() && deps.is_empty());
        ok(cudaGraphConditionalHandleCreate(
            &raw mut handle,
            graph,
            0,
            0,
        ));
        launch(kernel, cs, counter, handle);
        let (_, same, deps) = capture_info(cs);
        assert_eq!((same, deps.len()), (graph, 1));
        let a = deps[0];
        let mut p = conditional(handle, cu::cudaGraphCondTypeWhile, 1);
        ok(cudaGraphAddNode(
            &raw mut node,
            graph,
            deps.as_ptr(),
            ptr::null(),
            deps.len(),
            &raw mut p,
        ));
        let body = bodies(&p)[0];
        ok(cudaStreamUpdateCaptureDependencies(
            cs,
            &raw mut node,
            ptr::null(),
            1,
            1,
        ));
        assert_eq!(capture_info(cs).2, vec![node]);
        launch(kernel, cs, counter, handle);
        let mut ended: cudaGraph_t = ptr::null_mut();
        ok(cudaStreamEndCapture(cs, &raw mut ended));
        assert_eq!(ended, graph);
        ok(cudaStreamDestroy(cs));
        // A -> conditional -> D.
        assert_eq!(node_count(graph), 3);
        let e = edges(graph);
        assert!(e.contains(&(a, node)));
        assert_eq!(e.iter().filter(|(from, _)| *from == node).count(), 1);

        let mut bs: cudaStream_t = ptr::null_mut();
        ok(cudaStreamCreate(&raw mut bs));
        ok(cudaStreamBeginCaptureToGraph(
            bs,
            body,
            ptr::null(),
            ptr::null(),
            0,
            cu::cudaStreamCaptureModeGlobal,
        ));
        launch(kernel, bs, counter, handle);
        ok(cudaStreamEndCapture(bs, ptr::null_mut()));
        ok(cudaStreamDestroy(bs));
        assert_eq!(node_count(body), 1);
        run_twice(graph, ptr::null_mut());
        ok(cudaGraphDestroy(graph));
    }
    assert!(fake.ops().contains(&Op::StreamUpdateCaptureDependencies));
}

#[test]
fn if_else_and_switch_bodies_are_captured_during_and_after_the_outer_capture() {
    // An if/else node whose bodies are captured on a second stream while the outer capture is
    // still under way, then a switch node whose four bodies are captured on the outer capture's
    // own stream after it ended (both the runtime's calls).
    let fake = setup();
    let kernel = step_kernel(&fake);
    let mut counter: *mut c_void = ptr::null_mut();
    let mut s: cudaStream_t = ptr::null_mut();
    let mut side: cudaStream_t = ptr::null_mut();
    // SAFETY: valid out-pointers and parameters throughout.
    unsafe {
        ok(cudaMalloc(&raw mut counter, 1));
        ok(cudaStreamCreate(&raw mut s));
        ok(cudaStreamCreate(&raw mut side));
        for (kind, size) in [
            (cu::cudaGraphCondTypeIf, 2),
            (cu::cudaGraphCondTypeSwitch, 4),
        ] {
            ok(cudaStreamBeginCapture(s, cu::cudaStreamCaptureModeRelaxed));
            let (_, graph, _) = capture_info(s);
            let mut handle: cudaGraphConditionalHandle = 0;
            ok(cudaGraphConditionalHandleCreate(
                &raw mut handle,
                graph,
                0,
                0,
            ));
            launch(kernel, s, counter, handle);
            let (_, _, deps) = capture_info(s);
            let mut node: cudaGraphNode_t = ptr::null_mut();
            let mut p = conditional(handle, kind, size);
            ok(cudaGraphAddNode(
                &raw mut node,
                graph,
                deps.as_ptr(),
                ptr::null(),
                deps.len(),
                &raw mut p,
            ));
            let list = bodies(&p);
            assert_eq!(list.len(), size as usize);
            ok(cudaStreamUpdateCaptureDependencies(
                s,
                &raw mut node,
                ptr::null(),
                1,
                1,
            ));
            let during = kind == cu::cudaGraphCondTypeIf;
            if during {
                for &b in &list {
                    ok(cudaStreamBeginCaptureToGraph(
                        side,
                        b,
                        ptr::null(),
                        ptr::null(),
                        0,
                        cu::cudaStreamCaptureModeRelaxed,
                    ));
                    launch(kernel, side, counter, handle);
                    ok(cudaStreamEndCapture(side, ptr::null_mut()));
                }
                // The outer capture goes on.
                assert_eq!(capture_info(s).0, cu::cudaStreamCaptureStatusActive);
            }
            let mut ended: cudaGraph_t = ptr::null_mut();
            ok(cudaStreamEndCapture(s, &raw mut ended));
            assert_eq!(ended, graph);
            if !during {
                for &b in &list {
                    ok(cudaStreamBeginCaptureToGraph(
                        s,
                        b,
                        ptr::null(),
                        ptr::null(),
                        0,
                        cu::cudaStreamCaptureModeGlobal,
                    ));
                    launch(kernel, s, counter, handle);
                    ok(cudaStreamEndCapture(s, ptr::null_mut()));
                }
            }
            for &b in &list {
                assert_eq!(node_count(b), 1);
            }
            assert_eq!(node_count(graph), 2);
            run_twice(graph, s);
            ok(cudaGraphDestroy(graph));
        }
    }
    let conditionals = fake
        .state()
        .graphs
        .nodes
        .values()
        .filter(|n| n.ty == g::NODE_CONDITIONAL)
        .count();
    assert_eq!(conditionals, 0, "destroyed with their graphs");
}

#[test]
fn the_driver_face_builds_the_same_graph_under_capture() {
    // The same flow through cuStreamGetCaptureInfo_v3, cuGraphAddNode_v2,
    // cuStreamUpdateCaptureDependencies_v2 and cuStreamEndCapture with a null graph pointer.
    let fake = setup();
    let kernel = step_kernel(&fake);
    let mut counter: *mut c_void = ptr::null_mut();
    let mut s: cudaStream_t = ptr::null_mut();
    // SAFETY: valid out-pointers and parameters throughout.
    unsafe {
        ok(cudaMalloc(&raw mut counter, 1));
        ok(cudaStreamCreate(&raw mut s));
        cu(cuInit(0));
        let mut primary: d::CUcontext = ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut primary, 0));
        cu(cuCtxSetCurrent(primary));
        let hs: d::CUstream = s.cast();
        cu(cuStreamBeginCapture_v2(
            hs,
            d::CU_STREAM_CAPTURE_MODE_GLOBAL,
        ));
        let mut status = 9;
        let mut graph: d::CUgraph = ptr::null_mut();
        let mut deps: *const d::CUgraphNode = ptr::null();
        let mut edges: *const d::CUgraphEdgeData = ptr::null();
        let mut n = 0usize;
        cu(cuStreamGetCaptureInfo_v3(
            hs,
            &raw mut status,
            ptr::null_mut(),
            &raw mut graph,
            &raw mut deps,
            &raw mut edges,
            &raw mut n,
        ));
        let mut handle: d::CUgraphConditionalHandle = 0;
        cu(cuGraphConditionalHandleCreate(
            &raw mut handle,
            graph,
            ptr::null_mut(),
            1,
            1,
        ));
        launch(kernel, s, counter, handle);
        cu(cuStreamGetCaptureInfo_v3(
            hs,
            &raw mut status,
            ptr::null_mut(),
            &raw mut graph,
            &raw mut deps,
            &raw mut edges,
            &raw mut n,
        ));
        assert_eq!(n, 1);
        let mut p = d::CUgraphNodeParams {
            type_: d::CU_GRAPH_NODE_TYPE_CONDITIONAL,
            ..Default::default()
        };
        p.__bindgen_anon_1.conditional.handle = handle;
        p.__bindgen_anon_1.conditional.type_ = d::CU_GRAPH_COND_TYPE_WHILE;
        p.__bindgen_anon_1.conditional.size = 1;
        let mut node: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddNode_v2(
            &raw mut node,
            graph,
            deps,
            edges,
            n,
            &raw mut p,
        ));
        let body = *p.__bindgen_anon_1.conditional.phGraph_out;
        cu(cuStreamUpdateCaptureDependencies_v2(
            hs,
            &raw mut node,
            ptr::null(),
            1,
            d::CU_STREAM_SET_CAPTURE_DEPENDENCIES,
        ));
        let mut ended: d::CUgraph = ptr::null_mut();
        cu(cuStreamEndCapture(hs, &raw mut ended));
        assert_eq!(ended, graph);
        cu(cuStreamBeginCaptureToGraph(
            hs,
            body,
            ptr::null(),
            ptr::null(),
            0,
            d::CU_STREAM_CAPTURE_MODE_GLOBAL,
        ));
        launch(kernel, s, counter, handle);
        cu(cuStreamEndCapture(hs, ptr::null_mut()));
        assert_eq!(node_count(body.cast()), 1);
        run_twice(graph.cast(), s);
    }
}

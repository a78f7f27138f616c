//! Graphs, stream capture and conditional nodes through the driver face (`cuGraph*`), and the
//! same graphs seen through the runtime face: one core, one set of handles.

use std::{ffi::c_void, ptr};

use qcuda_proto::{
    graph::{self as g, ConditionalNode, KernelNode},
    Op,
};

use super::*;
use crate::core::cuda_error::CudaError;
use crate::{
    driver::{
        api::{context::*, graph::*, init::*, memory::*, module::*, stream::*},
        status::DriverError,
    },
    generated::driver_api as d,
    runtime::graphs::{cudaGraphGetNodes, cudaGraphLaunch},
};

#[track_caller]
fn cu(r: d::CUresult) {
    assert_eq!(DriverError::check(r), Ok(()));
}

#[track_caller]
fn cu_err(r: d::CUresult, want: DriverError) {
    assert_eq!(DriverError::check(r), Err(want));
}

fn image() -> Vec<u64> {
    let mut words = vec![0u64; IMAGE_LEN / 8];
    words[0] = u64::from(crate::core::modules::fatbin::FATBIN_MAGIC) | 1 << 32 | 16 << 48;
    words[1] = (IMAGE_LEN - 16) as u64;
    words
}

/// A current primary context and a loaded function `k(u64, u32)`.
///
/// # Safety
/// Test setup only.
unsafe fn function(fake: &FakeDevice) -> d::CUfunction {
    fake.add_kernel("k", &[(0, 8), (8, 4)]);
    let img = image();
    // SAFETY: valid out-parameters and the fake image.
    unsafe {
        cu(cuInit(0));
        let mut primary: d::CUcontext = ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut primary, 0));
        cu(cuCtxSetCurrent(primary));
        let mut m: d::CUmodule = ptr::null_mut();
        cu(cuModuleLoadData(&raw mut m, img.as_ptr().cast()));
        let mut f: d::CUfunction = ptr::null_mut();
        cu(cuModuleGetFunction(&raw mut f, m, c"k".as_ptr()));
        f
    }
}

fn kernel_params(f: d::CUfunction, args: *mut *mut c_void) -> d::CUDA_KERNEL_NODE_PARAMS {
    d::CUDA_KERNEL_NODE_PARAMS {
        func: f,
        gridDimX: 4,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 64,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: args,
        extra: ptr::null_mut(),
        kern: ptr::null_mut(),
        ctx: ptr::null_mut(),
    }
}

#[test]
fn a_driver_graph_is_built_queried_cloned_updated_and_launched() {
    let fake = setup();
    // SAFETY: valid out-parameters and parameter storage that outlives the calls.
    unsafe {
        let f = function(&fake);
        let mut graph: d::CUgraph = ptr::null_mut();
        cu(cuGraphCreate(&raw mut graph, 0));
        cu_err(cuGraphCreate(&raw mut graph, 3), DriverError::INVALID_VALUE);
        let mut dev: d::CUdeviceptr = 0;
        cu(cuMemAlloc_v2(&raw mut dev, 256));

        // A kernel node of a CUfunction with a pointer array, its parameters read back.
        let (a, b) = (dev, 64u32);
        let mut args = [
            (&raw const a).cast::<c_void>().cast_mut(),
            (&raw const b).cast::<c_void>().cast_mut(),
        ];
        let kp = kernel_params(f, args.as_mut_ptr());
        let mut k: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddKernelNode_v2(
            &raw mut k,
            graph,
            ptr::null(),
            0,
            &raw const kp,
        ));
        let enc = fake.state().graphs.nodes[&(k as u64)].params.clone();
        let node = KernelNode::decode(&enc).unwrap();
        assert_eq!((node.grid, node.block[0]), ([4, 1, 1], 64));
        assert_eq!(&node.params[..8], &dev.to_le_bytes());
        let mut back = kernel_params(ptr::null_mut(), ptr::null_mut());
        cu(cuGraphKernelNodeGetParams_v2(k, &raw mut back));
        // The function the node was given.
        assert_eq!((back.func, back.gridDimX, back.blockDimX), (f, 4, 64));
        assert_eq!(*(*back.kernelParams).cast::<u64>(), dev);
        assert_eq!(*(*back.kernelParams.add(1)).cast::<u32>(), 64);
        // A made-up function is refused.
        let bad = kernel_params(0x10 as d::CUfunction, args.as_mut_ptr());
        let mut x: d::CUgraphNode = ptr::null_mut();
        cu_err(
            cuGraphAddKernelNode_v2(&raw mut x, graph, ptr::null(), 0, &raw const bad),
            DriverError::INVALID_HANDLE,
        );

        // A memset after it, a device-to-device copy after that, as the driver states them.
        let set = d::CUDA_MEMSET_NODE_PARAMS {
            dst: dev,
            pitch: 0,
            value: 7,
            elementSize: 4,
            width: 32,
            height: 1,
        };
        let mut ms: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddMemsetNode(
            &raw mut ms,
            graph,
            &raw const k,
            1,
            &raw const set,
            ptr::null_mut(),
        ));
        let mut copy: d::CUDA_MEMCPY3D = std::mem::zeroed();
        copy.srcMemoryType = d::CU_MEMORYTYPE_DEVICE;
        copy.srcDevice = dev;
        copy.dstMemoryType = d::CU_MEMORYTYPE_DEVICE;
        copy.dstDevice = dev + 128;
        copy.WidthInBytes = 128;
        copy.Height = 1;
        copy.Depth = 1;
        let mut mc: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddMemcpyNode(
            &raw mut mc,
            graph,
            &raw const ms,
            1,
            &raw const copy,
            ptr::null_mut(),
        ));
        let mut got: d::CUDA_MEMCPY3D = std::mem::zeroed();
        cu(cuGraphMemcpyNodeGetParams(mc, &raw mut got));
        assert_eq!(
            (got.srcDevice, got.dstDevice, got.WidthInBytes),
            (dev, dev + 128, 128)
        );
        let mut gs: d::CUDA_MEMSET_NODE_PARAMS = std::mem::zeroed();
        cu(cuGraphMemsetNodeGetParams(ms, &raw mut gs));
        assert_eq!((gs.dst, gs.value, gs.width), (dev, 7, 32));
        // Unified addresses: the device allocation is device memory, the guest's own buffer
        // host memory (pinned and mapped for the worker, as the node runs whenever the graph
        // does), an address the guest does not map a device address (a module global).
        let mut host_buf = vec![0u8; 128];
        let mut uni: d::CUDA_MEMCPY3D = std::mem::zeroed();
        uni.srcMemoryType = d::CU_MEMORYTYPE_UNIFIED;
        uni.srcDevice = dev;
        uni.dstMemoryType = d::CU_MEMORYTYPE_UNIFIED;
        uni.dstDevice = host_buf.as_mut_ptr() as d::CUdeviceptr;
        uni.WidthInBytes = 128;
        uni.Height = 1;
        uni.Depth = 1;
        let mut un: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddMemcpyNode(
            &raw mut un,
            graph,
            ptr::null(),
            0,
            &raw const uni,
            ptr::null_mut(),
        ));
        let m = g::MemcpyNode::decode(&fake.state().graphs.nodes[&(un as u64)].params).unwrap();
        assert_eq!(m.src, dev);
        let pinned = crate::core::runtime::runtime()
            .unwrap()
            .host_memory
            .find(host_buf.as_ptr() as usize)
            .expect("the pageable side is pinned and mapped for the worker");
        assert_eq!(
            pinned.kind,
            crate::core::memory::host::HostKind::GraphPinned
        );
        uni.dstDevice = 0x7ff0_0000_0000;
        let mut un2: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddMemcpyNode(
            &raw mut un2,
            graph,
            ptr::null(),
            0,
            &raw const uni,
            ptr::null_mut(),
        ));
        let m = g::MemcpyNode::decode(&fake.state().graphs.nodes[&(un2 as u64)].params).unwrap();
        assert_eq!(
            m.dst, 0x7ff0_0000_0000,
            "an address the guest does not map goes as it is"
        );
        cu(cuGraphDestroyNode(un));
        cu(cuGraphDestroyNode(un2));
        copy.srcMemoryType = d::CU_MEMORYTYPE_ARRAY;
        copy.srcArray = 0x40 as d::CUarray;
        cu_err(
            cuGraphAddMemcpyNode(
                &raw mut x,
                graph,
                ptr::null(),
                0,
                &raw const copy,
                ptr::null_mut(),
            ),
            DriverError::NOT_SUPPORTED,
        );

        // Empty, event record and child graph nodes; edges; types.
        let mut empty: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddEmptyNode(&raw mut empty, graph, ptr::null(), 0));
        let mut ev: d::CUevent = ptr::null_mut();
        cu(crate::driver::api::stream::cuEventCreate(&raw mut ev, 0));
        let mut rec: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddEventRecordNode(
            &raw mut rec,
            graph,
            &raw const mc,
            1,
            ev,
        ));
        let mut ev_back: d::CUevent = ptr::null_mut();
        cu(cuGraphEventRecordNodeGetEvent(rec, &raw mut ev_back));
        assert_eq!(ev_back, ev);
        let mut sub: d::CUgraph = ptr::null_mut();
        cu(cuGraphCreate(&raw mut sub, 0));
        let mut child: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddChildGraphNode(
            &raw mut child,
            graph,
            ptr::null(),
            0,
            sub,
        ));
        cu(cuGraphAddDependencies_v2(
            graph,
            &raw const empty,
            &raw const child,
            ptr::null(),
            1,
        ));
        let mut ty = 99;
        cu(cuGraphNodeGetType(ms, &raw mut ty));
        assert_eq!(ty, d::CU_GRAPH_NODE_TYPE_MEMSET);
        let mut n = 0usize;
        cu(cuGraphGetNodes(graph, ptr::null_mut(), &raw mut n));
        assert_eq!(n, 6);
        let mut roots = [ptr::null_mut(); 8];
        let mut nr = roots.len();
        cu(cuGraphGetRootNodes(graph, roots.as_mut_ptr(), &raw mut nr));
        assert_eq!(&roots[..nr], &[k, empty]);
        let mut deps = [ptr::null_mut(); 4];
        let mut nd = deps.len();
        cu(cuGraphNodeGetDependencies_v2(
            mc,
            deps.as_mut_ptr(),
            ptr::null_mut(),
            &raw mut nd,
        ));
        assert_eq!(&deps[..nd], &[ms]);
        let (mut from, mut to) = ([ptr::null_mut(); 8], [ptr::null_mut(); 8]);
        let mut ne = 8usize;
        cu(cuGraphGetEdges_v2(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            ptr::null_mut(),
            &raw mut ne,
        ));
        assert_eq!(ne, 4);
        // The runtime face sees the same graph.
        let mut rn = 0usize;
        assert_eq!(
            cudaGraphGetNodes(graph.cast(), ptr::null_mut(), &raw mut rn),
            0
        );
        assert_eq!(rn, 6);

        // Clone, find in clone; instantiate, launch, update, exec-level parameters.
        let mut clone: d::CUgraph = ptr::null_mut();
        cu(cuGraphClone(&raw mut clone, graph));
        let mut kc: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphNodeFindInClone(&raw mut kc, k, clone));
        assert!(!kc.is_null() && kc != k);
        let mut exec: d::CUgraphExec = ptr::null_mut();
        cu(cuGraphInstantiateWithFlags(&raw mut exec, graph, 1));
        let mut flags = 0u64;
        cu(cuGraphExecGetFlags(exec, &raw mut flags));
        assert_eq!(flags, 0);
        let mut stream: d::CUstream = ptr::null_mut();
        cu(cuStreamCreate(&raw mut stream, 0));
        cu(cuGraphUpload(exec, stream));
        cu(cuGraphLaunch(exec, stream));
        assert_eq!(cudaGraphLaunch(exec.cast(), stream.cast()), 0);
        cu(cuStreamSynchronize(stream));
        assert_eq!(fake.state().graphs.execs[&(exec as u64)].1, 2);
        let kp2 = kernel_params(f, args.as_mut_ptr());
        cu(cuGraphExecKernelNodeSetParams_v2(exec, k, &raw const kp2));
        let mut info: d::CUgraphExecUpdateResultInfo = std::mem::zeroed();
        cu(cuGraphExecUpdate_v2(exec, clone, &raw mut info));
        assert_eq!(info.result, 0);
        let mut params = d::CUDA_GRAPH_INSTANTIATE_PARAMS {
            flags: 0,
            hUploadStream: stream,
            hErrNode_out: ptr::null_mut(),
            result_out: 7,
        };
        let mut exec2: d::CUgraphExec = ptr::null_mut();
        cu(cuGraphInstantiateWithParams(
            &raw mut exec2,
            clone,
            &raw mut params,
        ));
        assert_eq!(params.result_out, 0);
        let mut on = 9;
        cu(cuGraphNodeGetEnabled(exec, k, &raw mut on));
        assert_eq!(on, 1);

        // Memory nodes through the driver's records.
        let mut ap: d::CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
        ap.poolProps.allocType = d::CU_MEM_ALLOCATION_TYPE_PINNED;
        ap.poolProps.location.type_ = d::CU_MEM_LOCATION_TYPE_DEVICE;
        ap.bytesize = 4096;
        let mut alloc: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddMemAllocNode(
            &raw mut alloc,
            clone,
            ptr::null(),
            0,
            &raw mut ap,
        ));
        assert_ne!(ap.dptr, 0);
        let mut free: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddMemFreeNode(
            &raw mut free,
            clone,
            &raw const alloc,
            1,
            ap.dptr,
        ));
        let mut back: d::CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
        cu(cuGraphMemAllocNodeGetParams(alloc, &raw mut back));
        assert_eq!((back.dptr, back.bytesize), (ap.dptr, 4096));
        let mut freed = 0;
        cu(cuGraphMemFreeNodeGetParams(free, &raw mut freed));
        assert_eq!(freed, ap.dptr);

        // DOT text, graph memory figures.
        let path = std::env::temp_dir().join(format!("qcuda-drv-graph-{}.dot", std::process::id()));
        let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        cu(cuGraphDebugDotPrint(graph, cpath.as_ptr(), 0));
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("digraph"));
        let _ = std::fs::remove_file(&path);
        let mut used = 5u64;
        cu(cuDeviceGetGraphMemAttribute(0, 2, (&raw mut used).cast()));
        assert_eq!(used, 0);
        cu(cuDeviceGraphMemTrim(0));

        // Destroying.
        cu(cuGraphDestroyNode(empty));
        cu(cuGraphExecDestroy(exec));
        cu(cuGraphExecDestroy(exec2));
        cu(cuGraphDestroy(clone));
        cu(cuGraphDestroy(sub));
        cu(cuGraphDestroy(graph));
        cu_err(cuGraphExecDestroy(exec), DriverError::INVALID_VALUE);
    }
}

#[test]
fn conditional_nodes_hand_out_bodies_on_both_faces() {
    let fake = setup();
    // SAFETY: valid out-parameters and parameter storage that outlives the calls.
    unsafe {
        let f = function(&fake);
        let mut graph: d::CUgraph = ptr::null_mut();
        cu(cuGraphCreate(&raw mut graph, 0));
        let mut h = 0u64;
        let mut ctx: d::CUcontext = ptr::null_mut();
        cu(cuCtxGetCurrent(&raw mut ctx));
        // The context NVIDIA's runtime passes (the current one).
        cu(cuGraphConditionalHandleCreate(&raw mut h, graph, ctx, 1, 1));
        cu_err(
            cuGraphConditionalHandleCreate(&raw mut h, graph, 0x99 as d::CUcontext, 1, 1),
            DriverError::INVALID_CONTEXT,
        );
        cu_err(
            cuGraphConditionalHandleCreate(&raw mut h, graph, ptr::null_mut(), 1, 2),
            DriverError::INVALID_VALUE,
        );
        assert!(fake.ops().contains(&Op::GraphConditionalHandleCreate));

        // if/else: two bodies, filled with a kernel node each.
        let mut p: d::CUgraphNodeParams = std::mem::zeroed();
        p.type_ = d::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        p.__bindgen_anon_1.conditional = d::CUDA_CONDITIONAL_NODE_PARAMS {
            handle: h,
            type_: d::CU_GRAPH_COND_TYPE_IF,
            size: 2,
            phGraph_out: ptr::null_mut(),
            ctx: ptr::null_mut(),
        };
        let mut node: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddNode_v2(
            &raw mut node,
            graph,
            ptr::null(),
            ptr::null(),
            0,
            &raw mut p,
        ));
        // CUDA's own array of the bodies, valid as long as the node.
        let out = p.__bindgen_anon_1.conditional.phGraph_out;
        let bodies = [*out, *out.add(1)];
        assert!(!bodies[0].is_null() && !bodies[1].is_null() && bodies[0] != bodies[1]);
        let enc = fake.state().graphs.nodes[&(node as u64)].params.clone();
        assert_eq!(
            ConditionalNode::decode(&enc),
            Some(ConditionalNode {
                handle: h,
                kind: g::COND_IF,
                size: 2
            })
        );
        let (a, b) = (0u64, 1u32);
        let mut args = [
            (&raw const a).cast::<c_void>().cast_mut(),
            (&raw const b).cast::<c_void>().cast_mut(),
        ];
        let kp = kernel_params(f, args.as_mut_ptr());
        for body in bodies {
            let mut k: d::CUgraphNode = ptr::null_mut();
            cu(cuGraphAddKernelNode_v2(
                &raw mut k,
                body,
                ptr::null(),
                0,
                &raw const kp,
            ));
        }
        // A body can be captured into.
        let mut stream: d::CUstream = ptr::null_mut();
        cu(cuStreamCreate(&raw mut stream, 0));
        cu(cuStreamBeginCaptureToGraph(
            stream,
            bodies[0],
            ptr::null(),
            ptr::null(),
            0,
            2,
        ));
        let mut into: d::CUgraph = ptr::null_mut();
        cu(cuStreamEndCapture(stream, &raw mut into));
        assert_eq!(into, bodies[0]);

        // A while node whose handle is of another graph, and a size the kind does not allow,
        // are refused.
        let mut other: d::CUgraph = ptr::null_mut();
        cu(cuGraphCreate(&raw mut other, 0));
        p.__bindgen_anon_1.conditional.type_ = d::CU_GRAPH_COND_TYPE_WHILE;
        p.__bindgen_anon_1.conditional.size = 1;
        cu_err(
            cuGraphAddNode_v2(
                &raw mut node,
                other,
                ptr::null(),
                ptr::null(),
                0,
                &raw mut p,
            ),
            DriverError::INVALID_VALUE,
        );
        p.__bindgen_anon_1.conditional.size = 2;
        cu_err(
            cuGraphAddNode_v2(
                &raw mut node,
                graph,
                ptr::null(),
                ptr::null(),
                0,
                &raw mut p,
            ),
            DriverError::INVALID_VALUE,
        );

        // The runtime face: a switch with three bodies.
        let mut rh = 0u64;
        assert_eq!(
            crate::runtime::graphs::cudaGraphConditionalHandleCreate(
                &raw mut rh,
                graph.cast(),
                0,
                0
            ),
            0
        );
        let mut rp: crate::generated::cudaGraphNodeParams = std::mem::zeroed();
        rp.type_ = crate::generated::cudaGraphNodeTypeConditional;
        rp.__bindgen_anon_1.conditional.handle = rh;
        rp.__bindgen_anon_1.conditional.type_ = crate::generated::cudaGraphCondTypeSwitch;
        rp.__bindgen_anon_1.conditional.size = 3;
        let mut rnode: crate::generated::cudaGraphNode_t = ptr::null_mut();
        assert_eq!(
            crate::runtime::graphs::cudaGraphAddNode(
                &raw mut rnode,
                graph.cast(),
                ptr::null(),
                ptr::null(),
                0,
                &raw mut rp
            ),
            0
        );
        let rbodies = std::slice::from_raw_parts(rp.__bindgen_anon_1.conditional.phGraph_out, 3);
        assert!(rbodies.iter().all(|b| !b.is_null()) && rbodies[0] != rbodies[2]);
        let mut none = 0usize;
        assert_eq!(
            cudaGraphGetNodes(rbodies[1], ptr::null_mut(), &raw mut none),
            0
        );
        assert_eq!(none, 0);
        let mut ty = 0;
        cu(cuGraphNodeGetType(rnode.cast(), &raw mut ty));
        assert_eq!(ty, d::CU_GRAPH_NODE_TYPE_CONDITIONAL);
        let mut exec: d::CUgraphExec = ptr::null_mut();
        cu(cuGraphInstantiateWithFlags(&raw mut exec, graph, 0));
        cu(cuGraphLaunch(exec, stream));
        cu(cuStreamSynchronize(stream));
        cu(cuGraphExecDestroy(exec));
        cu(cuGraphDestroy(graph));
    }
}

#[test]
fn driver_capture_records_launches_and_reports_its_graph() {
    let fake = setup();
    // SAFETY: valid out-parameters and parameter storage that outlives the calls.
    unsafe {
        let f = function(&fake);
        let mut stream: d::CUstream = ptr::null_mut();
        cu(cuStreamCreate(&raw mut stream, 0));
        cu_err(
            cuStreamBeginCapture_v2(ptr::null_mut(), 0),
            DriverError::from(CudaError::STREAM_CAPTURE_UNSUPPORTED),
        );
        cu(cuStreamBeginCapture_v2(stream, 0));
        let mut status = 9;
        cu(cuStreamIsCapturing(stream, &raw mut status));
        assert_eq!(status, 1);
        let (a, b) = (0u64, 1u32);
        let mut args = [
            (&raw const a).cast::<c_void>().cast_mut(),
            (&raw const b).cast::<c_void>().cast_mut(),
        ];
        cu(crate::driver::api::launch::cuLaunchKernel(
            f,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            stream,
            args.as_mut_ptr(),
            ptr::null_mut(),
        ));
        let (mut id, mut gr, mut deps, mut edges, mut n) =
            (0u64, ptr::null_mut(), ptr::null(), ptr::null(), 0usize);
        cu(cuStreamGetCaptureInfo_v3(
            stream,
            &raw mut status,
            &raw mut id,
            &raw mut gr,
            &raw mut deps,
            &raw mut edges,
            &raw mut n,
        ));
        assert_eq!(status, 1);
        assert!(!gr.is_null());
        // Global mode: cuMemAlloc is refused during the capture, which it invalidates.
        let mut p: d::CUdeviceptr = 0;
        let mut mode = d::CU_STREAM_CAPTURE_MODE_RELAXED;
        cu(cuThreadExchangeStreamCaptureMode(&raw mut mode));
        cu(cuMemAlloc_v2(&raw mut p, 64));
        cu(cuThreadExchangeStreamCaptureMode(&raw mut mode));
        assert_eq!(mode, d::CU_STREAM_CAPTURE_MODE_RELAXED);
        let mut graph: d::CUgraph = ptr::null_mut();
        cu(cuStreamEndCapture(stream, &raw mut graph));
        assert_eq!(graph, gr);
        let mut exec: d::CUgraphExec = ptr::null_mut();
        cu(cuGraphInstantiateWithFlags(&raw mut exec, graph, 0));
        cu(cuGraphLaunch(exec, stream));
        cu(cuStreamBeginCapture_v2(stream, 0));
        cu_err(
            cuMemAlloc_v2(&raw mut p, 64),
            DriverError::from(CudaError::STREAM_CAPTURE_UNSUPPORTED),
        );
        cu_err(
            cuStreamEndCapture(stream, &raw mut graph),
            DriverError::from(
                CudaError::from_code(crate::generated::cudaErrorStreamCaptureInvalidated).unwrap(),
            ),
        );
    }
}

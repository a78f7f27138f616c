//! Driver-face calls that frameworks make (XLA's command buffers, cuDNN, NVIDIA's runtime):
//! kernel node attributes, child graph nodes that take their graph, the node-priority
//! instantiate flag, stream attributes through the driver face.

use std::{ffi::c_void, ptr};

use qcuda_proto::{graph as g, LaunchAttr, Op};

use super::*;
use crate::{
    driver::{
        api::{
            attributes::*, context::*, graph::*, init::*, module::*, stream::*, tensor_map::*,
            user_objects::*,
        },
        status::DriverError,
    },
    generated::{self as cu, driver_api as d},
    runtime::stream_attrs::cudaGraphKernelNodeGetAttribute,
};

#[track_caller]
fn cu(r: d::CUresult) {
    assert_eq!(DriverError::check(r), Ok(()));
}

#[track_caller]
fn cu_err(r: d::CUresult, want: DriverError) {
    assert_eq!(DriverError::check(r), Err(want));
}

/// A current primary context and a loaded function `k(u64)`.
///
/// # Safety
/// Test setup only.
unsafe fn function(fake: &FakeDevice) -> d::CUfunction {
    fake.add_kernel("k", &[(0, 8)]);
    let mut words = [0u64; IMAGE_LEN / 8];
    words[0] = u64::from(FATBIN_MAGIC) | 1 << 32 | 16 << 48;
    words[1] = (IMAGE_LEN - 16) as u64;
    // SAFETY: valid out-parameters and the fake image.
    unsafe {
        cu(cuInit(0));
        let mut primary: d::CUcontext = ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut primary, 0));
        cu(cuCtxSetCurrent(primary));
        let mut m: d::CUmodule = ptr::null_mut();
        cu(cuModuleLoadData(&raw mut m, words.as_ptr().cast()));
        let mut f: d::CUfunction = ptr::null_mut();
        cu(cuModuleGetFunction(&raw mut f, m, c"k".as_ptr()));
        f
    }
}

/// A kernel node of `f` in `graph`.
///
/// # Safety
/// Test setup only.
unsafe fn kernel_node(graph: d::CUgraph, f: d::CUfunction) -> d::CUgraphNode {
    let a = 0u64;
    let mut args = [(&raw const a).cast::<c_void>().cast_mut()];
    let p = d::CUDA_KERNEL_NODE_PARAMS {
        func: f,
        gridDimX: 2,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 32,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: args.as_mut_ptr(),
        extra: ptr::null_mut(),
        kern: ptr::null_mut(),
        ctx: ptr::null_mut(),
    };
    let mut n: d::CUgraphNode = ptr::null_mut();
    // SAFETY: valid parameters that outlive the call.
    unsafe {
        cu(cuGraphAddKernelNode_v2(
            &raw mut n,
            graph,
            ptr::null(),
            0,
            &raw const p,
        ));
    }
    n
}

fn value_of(bytes: [u8; 64]) -> d::CUlaunchAttributeValue {
    // SAFETY: the union is 64 plain bytes.
    unsafe { std::mem::transmute(bytes) }
}

fn bytes_of(v: &d::CUlaunchAttributeValue) -> [u8; 64] {
    // SAFETY: as above.
    unsafe { std::mem::transmute(*v) }
}

#[test]
fn kernel_nodes_take_launch_attributes_and_copy_them() {
    let fake = setup();
    // SAFETY: valid out-parameters and values that outlive the calls.
    unsafe {
        let f = function(&fake);
        let mut graph: d::CUgraph = ptr::null_mut();
        cu(cuGraphCreate(&raw mut graph, 0));
        let (a, b) = (kernel_node(graph, f), kernel_node(graph, f));

        // XLA's priority, and cluster dimensions.
        let mut prio = [0u8; 64];
        prio[..4].copy_from_slice(&(-2i32).to_le_bytes());
        let v = value_of(prio);
        cu(cuGraphKernelNodeSetAttribute(
            a,
            d::CU_LAUNCH_ATTRIBUTE_PRIORITY,
            &raw const v,
        ));
        let mut cluster = [0u8; 64];
        for (i, x) in [2u32, 1, 1].iter().enumerate() {
            cluster[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
        }
        let v = value_of(cluster);
        cu(cuGraphKernelNodeSetAttribute(
            a,
            d::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            &raw const v,
        ));
        let set = fake.state().node_attributes[&(a as u64)].clone();
        assert_eq!(
            set[0],
            LaunchAttr {
                id: d::CU_LAUNCH_ATTRIBUTE_PRIORITY,
                v: [u32::from_le_bytes((-2i32).to_le_bytes()), 0, 0],
                w: [0; 2]
            }
        );
        assert_eq!(set[1].v, [2, 1, 1]);

        // Read back through both faces, one layout.
        let mut out = value_of([0xAA; 64]);
        cu(cuGraphKernelNodeGetAttribute(
            a,
            d::CU_LAUNCH_ATTRIBUTE_PRIORITY,
            &raw mut out,
        ));
        assert_eq!(bytes_of(&out), prio);
        let mut rt_out = value_of([0; 64]);
        ok(cudaGraphKernelNodeGetAttribute(
            a.cast(),
            cu::cudaLaunchAttributeClusterDimension,
            (&raw mut rt_out).cast(),
        ));
        assert_eq!(bytes_of(&rt_out), cluster);

        // The copy takes every attribute.
        cu(cuGraphKernelNodeCopyAttributes(b, a));
        cu(cuGraphKernelNodeGetAttribute(
            b,
            d::CU_LAUNCH_ATTRIBUTE_PRIORITY,
            &raw mut out,
        ));
        assert_eq!(bytes_of(&out), prio);
        assert!(fake.ops().contains(&Op::GraphKernelNodeCopyAttributes));

        // Not a kernel node, no node, no value, an id CUDA does not have: refused.
        let mut empty: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddEmptyNode(&raw mut empty, graph, ptr::null(), 0));
        let v = value_of(prio);
        cu_err(
            cuGraphKernelNodeSetAttribute(empty, d::CU_LAUNCH_ATTRIBUTE_PRIORITY, &raw const v),
            DriverError::INVALID_VALUE,
        );
        cu_err(
            cuGraphKernelNodeSetAttribute(
                ptr::null_mut(),
                d::CU_LAUNCH_ATTRIBUTE_PRIORITY,
                &raw const v,
            ),
            DriverError::INVALID_VALUE,
        );
        cu_err(
            cuGraphKernelNodeSetAttribute(a, d::CU_LAUNCH_ATTRIBUTE_PRIORITY, ptr::null()),
            DriverError::INVALID_VALUE,
        );
        cu_err(
            cuGraphKernelNodeSetAttribute(a, 99, &raw const v),
            DriverError::INVALID_VALUE,
        );
        cu_err(
            cuGraphKernelNodeCopyAttributes(a, empty),
            DriverError::INVALID_VALUE,
        );

        // XLA instantiates every command buffer with the node priorities in force.
        let mut exec: d::CUgraphExec = ptr::null_mut();
        cu(cuGraphInstantiateWithFlags(
            &raw mut exec,
            graph,
            u64::from(d::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY),
        ));
        cu(cuGraphLaunch(exec, ptr::null_mut()));
    }
}

#[test]
fn a_child_graph_node_can_take_its_graph() {
    let fake = setup();
    // SAFETY: valid out-parameters and parameters that outlive the calls.
    unsafe {
        let f = function(&fake);
        let (mut parent, mut child): (d::CUgraph, d::CUgraph) = (ptr::null_mut(), ptr::null_mut());
        cu(cuGraphCreate(&raw mut parent, 0));
        cu(cuGraphCreate(&raw mut child, 0));
        kernel_node(child, f);
        let mut p: d::CUgraphNodeParams = std::mem::zeroed();
        p.type_ = d::CU_GRAPH_NODE_TYPE_GRAPH;
        p.__bindgen_anon_1.graph = d::CUDA_CHILD_GRAPH_NODE_PARAMS {
            graph: child,
            ownership: d::CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE,
        };
        let mut node: d::CUgraphNode = ptr::null_mut();
        cu(cuGraphAddNode_v2(
            &raw mut node,
            parent,
            ptr::null(),
            ptr::null(),
            0,
            &raw mut p,
        ));
        // The host is told to give the graph itself to the node.
        let enc = fake.state().graphs.nodes[&(node as u64)].params.clone();
        assert_eq!(g::decode_child(&enc), Some((child as u64, true)));

        // The clone form is unchanged; an ownership CUDA does not define is refused.
        p.__bindgen_anon_1.graph.ownership = d::CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE;
        let mut copy: d::CUgraphNode = ptr::null_mut();
        let mut other: d::CUgraph = ptr::null_mut();
        cu(cuGraphCreate(&raw mut other, 0));
        p.__bindgen_anon_1.graph.graph = other;
        cu(cuGraphAddNode_v2(
            &raw mut copy,
            parent,
            ptr::null(),
            ptr::null(),
            0,
            &raw mut p,
        ));
        let enc = fake.state().graphs.nodes[&(copy as u64)].params.clone();
        assert_eq!(g::decode_child(&enc), Some((other as u64, false)));
        p.__bindgen_anon_1.graph.ownership = 7;
        cu_err(
            cuGraphAddNode_v2(
                &raw mut copy,
                parent,
                ptr::null(),
                ptr::null(),
                0,
                &raw mut p,
            ),
            DriverError::INVALID_VALUE,
        );
    }
}

#[test]
fn streams_take_attributes_through_the_driver_face() {
    let fake = setup();
    // SAFETY: valid out-parameters and values that outlive the calls.
    unsafe {
        function(&fake);
        let (mut s1, mut s2): (d::CUstream, d::CUstream) = (ptr::null_mut(), ptr::null_mut());
        cu(cuStreamCreate(&raw mut s1, 0));
        cu(cuStreamCreate(&raw mut s2, 0));
        let mut window = [0u8; 64];
        window[..8].copy_from_slice(&0x7f00_0000_1000u64.to_le_bytes());
        window[8..16].copy_from_slice(&(1u64 << 20).to_le_bytes());
        window[16..20].copy_from_slice(&0.5f32.to_bits().to_le_bytes());
        let v = value_of(window);
        cu(cuStreamSetAttribute(
            s1,
            d::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
            &raw const v,
        ));
        let mut out = value_of([0; 64]);
        cu(cuStreamGetAttribute(
            s1,
            d::CU_LAUNCH_ATTRIBUTE_PRIORITY,
            &raw mut out,
        ));
        // Cluster dimensions are a launch's and a node's, not a stream's.
        cu_err(
            cuStreamSetAttribute(s1, d::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &raw const v),
            DriverError::INVALID_VALUE,
        );
        cu_err(
            cuStreamGetAttribute(s1, d::CU_LAUNCH_ATTRIBUTE_PRIORITY, ptr::null_mut()),
            DriverError::INVALID_VALUE,
        );
        let count = |op| fake.ops().iter().filter(|o| **o == op).count();
        let (sets, gets) = (count(Op::StreamSetAttribute), count(Op::StreamGetAttribute));
        // A copy reads each of the five stream attributes and sets it on the other stream.
        cu(cuStreamCopyAttributes(s2, s1));
        assert_eq!(count(Op::StreamSetAttribute), sets + 5);
        assert_eq!(count(Op::StreamGetAttribute), gets + 5);
    }
}

#[test]
fn nvml_answers_the_driver_version_and_the_pcie_link_from_the_host() {
    use crate::nvml::*;
    let _fake = setup();
    // SAFETY: valid out-pointers and buffers of the sizes given.
    unsafe {
        assert_eq!(nvmlInit_v2(), 0);
        let mut buf = [0 as core::ffi::c_char; 80];
        assert_eq!(nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 80), 0);
        let text = std::ffi::CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert_eq!(text, "580.95.05");
        // NVML's rule for a short buffer.
        assert_eq!(nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 4), 7);
        let mut dev: *const Device = ptr::null();
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &raw mut dev), 0);
        let mut v = 0u32;
        assert_eq!(nvmlDeviceGetCurrPcieLinkGeneration(dev, &raw mut v), 0);
        assert_eq!(v, 4);
        assert_eq!(nvmlDeviceGetCurrPcieLinkWidth(dev, &raw mut v), 0);
        assert_eq!(v, 16);
        assert_eq!(nvmlDeviceGetMaxPcieLinkGeneration(dev, &raw mut v), 0);
        assert_eq!(v, 5);
        assert_eq!(nvmlDeviceGetMaxPcieLinkWidth(dev, &raw mut v), 0);
        assert_eq!(v, 16);
        assert_eq!(nvmlDeviceGetMaxPcieLinkWidth(ptr::null(), &raw mut v), 2);
        assert_eq!(nvmlShutdown(), 0);
    }
}

#[test]
fn module_loads_with_options_carry_the_jits_logs_back() {
    let fake = setup();
    let mut words = [0u64; IMAGE_LEN / 8];
    words[0] = u64::from(FATBIN_MAGIC) | 1 << 32 | 16 << 48;
    words[1] = (IMAGE_LEN - 16) as u64;
    // SAFETY: valid out-parameters, option arrays and log buffers of the sizes given.
    unsafe {
        function(&fake);
        let mut info = [0xffu8; 64];
        let mut error = [0xffu8; 64];
        let mut opts = [
            d::CU_JIT_INFO_LOG_BUFFER,
            d::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            d::CU_JIT_ERROR_LOG_BUFFER,
            d::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            d::CU_JIT_OPTIMIZATION_LEVEL,
        ];
        let mut values = [
            info.as_mut_ptr().cast::<c_void>(),
            64usize as *mut c_void,
            error.as_mut_ptr().cast::<c_void>(),
            64usize as *mut c_void,
            3usize as *mut c_void,
        ];
        let mut m: d::CUmodule = ptr::null_mut();
        cu(cuModuleLoadDataEx(
            &raw mut m,
            words.as_ptr().cast(),
            opts.len() as u32,
            opts.as_mut_ptr(),
            values.as_mut_ptr(),
        ));
        assert!(!m.is_null());
        let text = |b: &[u8]| {
            std::ffi::CStr::from_bytes_until_nul(b)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned()
        };
        // The host's info log, and the one value option it was given; an empty error log.
        assert_eq!(text(&info), "fake JIT: 1 options");
        assert_eq!(text(&error), "");
        // The bytes used, NUL included, written back where the sizes came.
        assert_eq!(values[1] as usize, "fake JIT: 1 options".len() + 1);
        assert!(fake.ops().contains(&Op::ModuleLoadLogged));

        // A load the JIT refuses: its error and its error log.
        let garbage = [0x11u64; 8];
        values[3] = 64usize as *mut c_void;
        let r = cuModuleLoadDataEx(
            &raw mut m,
            garbage.as_ptr().cast(),
            opts.len() as u32,
            opts.as_mut_ptr(),
            values.as_mut_ptr(),
        );
        assert_eq!(r, d::CUDA_ERROR_INVALID_PTX);
        assert_eq!(text(&error), "fake JIT: not a module image");
        assert_eq!(text(&info), "");
    }
}

#[test]
fn tensor_maps_are_encoded_by_the_host() {
    let fake = setup();
    // SAFETY: valid out-parameters and arrays of the rank given.
    unsafe {
        function(&fake);
        let mut map: d::CUtensorMap = std::mem::zeroed();
        let dims = [1024u64, 512];
        let strides = [2048u64];
        let boxes = [64u32, 64];
        let steps = [1u32, 1];
        let addr = 0x7f00_0000_0000usize as *mut c_void;
        cu(cuTensorMapEncodeTiled(
            &raw mut map,
            d::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            2,
            addr,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            d::CU_TENSOR_MAP_INTERLEAVE_NONE,
            d::CU_TENSOR_MAP_SWIZZLE_128B,
            d::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            d::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ));
        let bytes: [u8; 128] = std::mem::transmute(map);
        // The host's encoding lands in the caller's map (the fake's: address, kind, rank, dim).
        assert_eq!(&bytes[..8], &(addr as u64).to_le_bytes());
        assert_eq!(&bytes[12..16], &2u32.to_le_bytes());
        assert_eq!(&bytes[16..24], &1024u64.to_le_bytes());
        assert!(fake.ops().contains(&Op::TensorMapEncode));
        // The same map over another tensor: the rest kept.
        let other = 0x7f00_0010_0000usize as *mut c_void;
        cu(cuTensorMapReplaceAddress(&raw mut map, other));
        let again: [u8; 128] = std::mem::transmute(map);
        assert_eq!(&again[..8], &(other as u64).to_le_bytes());
        assert_eq!(&again[8..], &bytes[8..]);
        // Ranks CUDA does not allow, missing arrays, no map: refused here.
        let refuse = |rank, dims: *const u64, map: *mut d::CUtensorMap| {
            cuTensorMapEncodeTiled(
                map,
                d::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                rank,
                addr,
                dims,
                strides.as_ptr(),
                boxes.as_ptr(),
                steps.as_ptr(),
                0,
                0,
                0,
                0,
            )
        };
        assert_eq!(
            refuse(0, dims.as_ptr(), &raw mut map),
            d::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            refuse(6, dims.as_ptr(), &raw mut map),
            d::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            refuse(2, ptr::null(), &raw mut map),
            d::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            refuse(2, dims.as_ptr(), ptr::null_mut()),
            d::CUDA_ERROR_INVALID_VALUE
        );
        // Im2col needs 3 dimensions at least.
        let lower = [0i32; 3];
        assert_eq!(
            cuTensorMapEncodeIm2col(
                &raw mut map,
                0,
                2,
                addr,
                dims.as_ptr(),
                strides.as_ptr(),
                lower.as_ptr(),
                lower.as_ptr(),
                8,
                8,
                steps.as_ptr(),
                0,
                0,
                0,
                0
            ),
            d::CUDA_ERROR_INVALID_VALUE
        );
    }
}

unsafe extern "C" fn count_destroy(data: *mut c_void) {
    // SAFETY: the test's leaked counter.
    unsafe {
        (*data.cast::<std::sync::atomic::AtomicUsize>())
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    };
}

/// Waits (a second at most) for `counter` to reach `n`: destructors run on a thread of their own.
fn reaches(counter: &std::sync::atomic::AtomicUsize, n: usize) -> bool {
    for _ in 0..200 {
        if counter.load(std::sync::atomic::Ordering::SeqCst) >= n {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    false
}

#[test]
fn user_objects_live_as_long_as_their_references_graphs_and_executable_graphs_included() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let fake = setup();
    // SAFETY: valid out-parameters; the counters are leaked, so they outlive every destructor.
    unsafe {
        function(&fake);
        let done: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let data = (done as *const AtomicUsize).cast_mut().cast::<c_void>();
        let mut obj: d::CUuserObject = ptr::null_mut();
        // The only flag CUDA defines is required; a destructor too.
        cu_err(
            cuUserObjectCreate(&raw mut obj, data, Some(count_destroy), 1, 0),
            DriverError::INVALID_VALUE,
        );
        cu_err(
            cuUserObjectCreate(&raw mut obj, data, None, 1, 1),
            DriverError::INVALID_VALUE,
        );
        cu(cuUserObjectCreate(
            &raw mut obj,
            data,
            Some(count_destroy),
            1,
            1,
        ));
        cu(cuUserObjectRetain(obj, 2));
        cu(cuUserObjectRelease(obj, 2));
        assert!(!reaches(done, 1));
        cu_err(cuUserObjectRelease(obj, 2), DriverError::INVALID_VALUE);

        // A graph's reference, copied by its clone and by an executable graph.
        let mut graph: d::CUgraph = ptr::null_mut();
        cu(cuGraphCreate(&raw mut graph, 0));
        cu(cuGraphRetainUserObject(graph, obj, 1, 0));
        cu(cuUserObjectRelease(obj, 1)); // the caller's last own reference
        let mut copy: d::CUgraph = ptr::null_mut();
        cu(cuGraphClone(&raw mut copy, graph));
        let mut exec: d::CUgraphExec = ptr::null_mut();
        cu(cuGraphInstantiateWithFlags(&raw mut exec, graph, 0));
        cu(cuGraphDestroy(graph));
        cu(cuGraphDestroy(copy));
        assert!(
            !reaches(done, 1),
            "the executable graph still holds a reference"
        );
        let mut stream: d::CUstream = ptr::null_mut();
        cu(cuStreamCreate(&raw mut stream, 0));
        let records = fake.ops().iter().filter(|o| **o == Op::EventRecord).count();
        cu(cuGraphLaunch(exec, stream));
        flush();
        // Its launch is followed by an event, which the release waits for.
        assert_eq!(
            fake.ops().iter().filter(|o| **o == Op::EventRecord).count(),
            records + 1
        );
        cu(cuGraphExecDestroy(exec));
        assert!(
            reaches(done, 1),
            "the destructor ran once the last reference went"
        );
        assert!(fake.ops().contains(&Op::EventSynchronize));
        assert_eq!(done.load(SeqCst), 1);

        // Moved references: the caller's become the graph's; a graph releases what it holds.
        let other: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let data = (other as *const AtomicUsize).cast_mut().cast::<c_void>();
        cu(cuUserObjectCreate(
            &raw mut obj,
            data,
            Some(count_destroy),
            2,
            1,
        ));
        cu(cuGraphCreate(&raw mut graph, 0));
        cu(cuGraphRetainUserObject(graph, obj, 2, 1));
        cu_err(
            cuGraphReleaseUserObject(graph, obj, 3),
            DriverError::INVALID_VALUE,
        );
        cu(cuGraphReleaseUserObject(graph, obj, 1));
        assert!(!reaches(other, 1));
        cu(cuGraphDestroy(graph));
        assert!(reaches(other, 1));
        cu_err(
            cuGraphRetainUserObject(graph, obj, 1, 0),
            DriverError::INVALID_VALUE,
        );
    }
}

#[test]
fn freeing_null_stream_ordered_memory_does_nothing_as_natively() {
    // NVIDIA's runtime forwards cudaFreeAsync(NULL, stream) to cuMemFreeAsync(0, stream): what
    // cuSPARSE's destroys do with the buffers they never used, in stream-ordered mode.
    let fake = setup();
    // SAFETY: valid out-parameters.
    unsafe {
        function(&fake);
        let mut s: d::CUstream = ptr::null_mut();
        cu(cuStreamCreate(&raw mut s, 0));
        cu(crate::driver::api::memory::cuMemFreeAsync(0, s));
        cu(crate::driver::api::memory::cuMemFreeAsync(
            0,
            ptr::null_mut(),
        ));
        ok(crate::runtime::pools::cudaFreeAsync(
            ptr::null_mut(),
            s.cast(),
        ));
        // The stream is still checked.
        cu_err(
            crate::driver::api::memory::cuMemFreeAsync(0, 0x1234 as d::CUstream),
            DriverError::INVALID_HANDLE,
        );
    }
}

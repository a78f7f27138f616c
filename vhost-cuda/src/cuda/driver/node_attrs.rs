//! The driver calls for kernel node attributes (`cuGraphKernelNodeSetAttribute`,
//! `cuGraphKernelNodeGetAttribute`, `cuGraphKernelNodeCopyAttributes`) and for child graph nodes
//! that take their graph (`cuGraphAddNode` with `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`, as XLA's
//! command buffers add them), as a trait of their own ([`NodeAttrDriverApi`], a supertrait of
//! `DriverApi`), with the real implementation over cudarc's `sys` layer and the no-driver one
//! (the fake's is in `fake_graphs.rs`). Attribute values cross as the 64 bytes of the
//! `CUlaunchAttributeValue` union, laid out by the launch-attribute rules of `launch.rs`.

use std::mem::MaybeUninit;

use cudarc::driver::sys;

use super::{
    error::{check, CuError, CuResult},
    graph::{Graph, GraphNode},
    handles::{ptr, Raw},
    library::{CudaDriver, NoDriver},
};

/// The symbols [`NodeAttrDriverApi`] calls (checked when the driver is loaded).
pub(crate) const NODE_ATTR_SYMBOLS: &[&str] = &[
    "cuGraphKernelNodeCopyAttributes",
    "cuGraphKernelNodeGetAttribute",
    "cuGraphKernelNodeSetAttribute",
    "cuGraphAddNode_v2",
];

/// The kernel node attribute calls the executor makes.
pub(crate) trait NodeAttrDriverApi {
    /// cuGraphKernelNodeSetAttribute with a value laid out as `CUkernelNodeAttrValue`.
    fn kernel_node_set_attribute(&self, node: GraphNode, id: u32, value: &[u8; 64])
        -> CuResult<()>;
    /// cuGraphKernelNodeGetAttribute.
    fn kernel_node_get_attribute(&self, node: GraphNode, id: u32) -> CuResult<[u8; 64]>;
    /// cuGraphKernelNodeCopyAttributes: `dst` takes every attribute of `src`.
    fn kernel_node_copy_attributes(&self, dst: GraphNode, src: GraphNode) -> CuResult<()>;
    /// cuGraphAddNode of a child graph node that takes `child` itself
    /// (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`): `child` is destroyed with the node's graph.
    fn graph_add_child_moved(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        child: Graph,
    ) -> CuResult<GraphNode>;
}

/// The driver's id for launch attribute `id`; ids the driver's header does not have are
/// `INVALID_VALUE` (which of them a kernel node takes is the driver's to say).
fn attr_id(id: u32) -> CuResult<sys::CUkernelNodeAttrID> {
    use sys::CUlaunchAttributeID as A;
    Ok(match id {
        1 => A::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
        2 => A::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
        3 => A::CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY,
        4 => A::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        5 => A::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
        6 => A::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        7 => A::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT,
        8 => A::CU_LAUNCH_ATTRIBUTE_PRIORITY,
        9 => A::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
        10 => A::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
        11 => A::CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION,
        12 => A::CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT,
        14 => A::CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        16 => A::CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

// The value union is the 64 bytes the wire carries.
const _: () = assert!(size_of::<sys::CUkernelNodeAttrValue>() == 64);

// SAFETY (for every unsafe block in this impl): each call goes to a symbol that `load` found
// (NODE_ATTR_SYMBOLS), through cudarc's binding of its CUDA 13.0 prototype; nodes are the
// session's own (the module-level handle contract); values are locals of the union's size.
impl NodeAttrDriverApi for CudaDriver {
    fn kernel_node_set_attribute(
        &self,
        node: GraphNode,
        id: u32,
        value: &[u8; 64],
    ) -> CuResult<()> {
        let id = attr_id(id)?;
        // The union needs 8-byte alignment, which the wire's byte array does not have.
        let mut v = MaybeUninit::<sys::CUkernelNodeAttrValue>::zeroed();
        // SAFETY: the union is exactly 64 bytes (asserted above), `v` does not overlap `value`.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), v.as_mut_ptr().cast::<u8>(), 64) };
        // SAFETY: see the impl comment; `v` is an initialised union the driver only reads.
        check(unsafe { sys::cuGraphKernelNodeSetAttribute(ptr(node.raw()), id, v.as_ptr()) })
    }

    fn kernel_node_get_attribute(&self, node: GraphNode, id: u32) -> CuResult<[u8; 64]> {
        let id = attr_id(id)?;
        let mut v = MaybeUninit::<sys::CUkernelNodeAttrValue>::zeroed();
        // SAFETY: see the impl comment; the driver writes at most the union into `v`.
        check(unsafe { sys::cuGraphKernelNodeGetAttribute(ptr(node.raw()), id, v.as_mut_ptr()) })?;
        let mut value = [0u8; 64];
        // SAFETY: `v` is 64 initialised bytes (zeroed, then written by the driver).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().cast::<u8>(), value.as_mut_ptr(), 64) };
        Ok(value)
    }

    fn kernel_node_copy_attributes(&self, dst: GraphNode, src: GraphNode) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuGraphKernelNodeCopyAttributes(ptr(dst.raw()), ptr(src.raw())) })
    }

    fn graph_add_child_moved(
        &self,
        graph: Graph,
        deps: &[GraphNode],
        child: Graph,
    ) -> CuResult<GraphNode> {
        // SAFETY: plain C data; all-zero is a valid value of every member (the union's
        // reserved words).
        let mut p: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH;
        p.__bindgen_anon_1.graph = sys::CUDA_CHILD_GRAPH_NODE_PARAMS {
            graph: ptr(child.raw()),
            ownership: sys::CUgraphChildGraphNodeOwnership::CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE,
        };
        let list: Vec<sys::CUgraphNode> = deps.iter().map(|d| ptr(d.raw())).collect();
        let mut n: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: see the impl comment; `list` holds `deps.len()` nodes of the session's, no
        // edge data (default edges), `p` is an initialised child graph node's parameters.
        check(unsafe {
            sys::cuGraphAddNode_v2(
                &raw mut n,
                ptr(graph.raw()),
                if list.is_empty() {
                    std::ptr::null()
                } else {
                    list.as_ptr()
                },
                std::ptr::null(),
                list.len(),
                &raw mut p,
            )
        })?;
        Ok(GraphNode::from_raw(n as Raw))
    }
}

impl NodeAttrDriverApi for NoDriver {
    fn kernel_node_set_attribute(&self, _: GraphNode, _: u32, _: &[u8; 64]) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }

    fn kernel_node_get_attribute(&self, _: GraphNode, _: u32) -> CuResult<[u8; 64]> {
        Err(CuError::NO_DEVICE)
    }

    fn kernel_node_copy_attributes(&self, _: GraphNode, _: GraphNode) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }

    fn graph_add_child_moved(&self, _: Graph, _: &[GraphNode], _: Graph) -> CuResult<GraphNode> {
        Err(CuError::NO_DEVICE)
    }
}

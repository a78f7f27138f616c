//! Kernel node attributes (`GraphKernelNodeSetAttribute`, `GraphKernelNodeGetAttribute`,
//! `GraphKernelNodeCopyAttributes`): the launch attributes a kernel node carries (priority,
//! cluster dimensions, access policy window, ...), set and read with the driver's calls on the
//! session's own kernel nodes. Values cross as `LaunchAttr` records and are checked by the
//! launch-attribute rules (`launch.rs`), as for a launch; which of them a node takes is the
//! driver's to answer. A graph whose node got an attribute is marked `attributed` (a saved
//! state does not hold node attributes).

use qcuda_proto::{LaunchAttr, LAUNCH_ATTR_SIZE};

use super::*;
use crate::cuda::launch::{attr, DriverLaunchAttr};

impl GpuState {
    /// The kernel node behind `handle` and its graph, the graph's context bound.
    fn kernel_node(&mut self, handle: u64) -> Result<(usize, u64, GraphNode), Fault> {
        let graph = self
            .graphs
            .nodes
            .get(handle)
            .map(|n| n.graph)
            .ok_or(status::INVALID_VALUE)?;
        let node = self.node(handle)?;
        let (dev, _) = self.graph(graph)?;
        if self.drv.node_type(node).map_err(on(dev))? != wire_graph::NODE_KERNEL {
            return Err(status::INVALID_VALUE.into());
        }
        Ok((dev, graph, node))
    }

    fn mark_attributed(&mut self, graph: u64) {
        if let Some(g) = self.graphs.graphs.get_mut(graph) {
            g.attributed = true;
        }
    }

    /// args[0] = kernel node; in-buffer 0 = one `LaunchAttr` record.
    pub(super) fn kernel_node_set_attribute(&mut self, req: &Request) -> OpResult {
        let bytes = read_all(req.inputs().first(), LAUNCH_ATTR_SIZE)?;
        let a = LaunchAttr::decode(&bytes).map_err(|_| status::INVALID_VALUE)?;
        let (dev, graph, node) = self.kernel_node(req.header().args[0])?;
        // Events name the session's events on the node's device, as in a launch.
        let events = &self.events;
        let event = |h: u64| {
            events
                .get(h)
                .filter(|e| e.dev == dev)
                .map(|e| e.raw.launch_attr_value())
        };
        let value = DriverLaunchAttr::from_wire(&a, event)?.value;
        self.drv
            .kernel_node_set_attribute(node, a.id, &value)
            .map_err(on(dev))?;
        self.mark_attributed(graph);
        ok()
    }

    /// args[0] = kernel node, args[1] = attribute id; out-buffer 0 receives the value as one
    /// `LaunchAttr` record (events are not given back: no node takes one).
    pub(super) fn kernel_node_get_attribute(&mut self, req: &Request) -> OpResult {
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let id = u32::try_from(req.header().args[1]).map_err(|_| status::INVALID_VALUE)?;
        if out.len() < LAUNCH_ATTR_SIZE {
            return Err(status::INVALID_VALUE.into());
        }
        let (dev, _, node) = self.kernel_node(req.header().args[0])?;
        let v = self
            .drv
            .kernel_node_get_attribute(node, id)
            .map_err(on(dev))?;
        let rec = attr_to_wire(id, &v)?;
        out.write_at(0, &rec.encode())
            .map_err(|_| status::INVALID_VALUE)?;
        ok()
    }

    /// args[0] = destination kernel node, args[1] = source kernel node (of a graph of the same
    /// device).
    pub(super) fn kernel_node_copy_attributes(&mut self, args: [u64; MAX_ARGS]) -> OpResult {
        let (sdev, _, src) = self.kernel_node(args[1])?;
        let (dev, graph, dst) = self.kernel_node(args[0])?;
        if sdev != dev {
            return Err(status::INVALID_VALUE.into());
        }
        self.drv
            .kernel_node_copy_attributes(dst, src)
            .map_err(on(dev))?;
        self.mark_attributed(graph);
        ok()
    }
}

/// The wire record of attribute `id` with driver value `v` (the reverse of
/// `DriverLaunchAttr::from_wire`).
fn attr_to_wire(id: u32, v: &[u8; 64]) -> Result<LaunchAttr, Fault> {
    let u32_at = |at: usize| u32::from_le_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
    let u64_at = |at: usize| u64::from(u32_at(at)) | u64::from(u32_at(at + 4)) << 32;
    let mut rec = LaunchAttr {
        id,
        ..LaunchAttr::default()
    };
    match id {
        attr::ACCESS_POLICY_WINDOW => {
            rec.w = [u64_at(0), u64_at(8)];
            rec.v = [u32_at(16), u32_at(20), u32_at(24)];
        }
        attr::CLUSTER_DIMENSION | attr::PREFERRED_CLUSTER_DIMENSION => {
            rec.v = [u32_at(0), u32_at(4), u32_at(8)];
        }
        attr::MEM_SYNC_DOMAIN_MAP => rec.v = [u32::from(v[0]), u32::from(v[1]), 0],
        attr::PROGRAMMATIC_EVENT | attr::LAUNCH_COMPLETION_EVENT => {
            return Err(status::INVALID_VALUE.into())
        }
        _ => rec.v[0] = u32_at(0),
    }
    Ok(rec)
}

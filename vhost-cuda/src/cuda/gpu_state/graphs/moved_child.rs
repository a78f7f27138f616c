//! Child graph nodes that take their graph (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`, CUDA 12.9),
//! as XLA's command buffers add them: the guest's graph itself becomes the node's, owned by the
//! node's graph from then on (destroyed with it or with the node, never on its own; it cannot
//! be moved again), and `cuGraphChildGraphNodeGetGraph` gives back the same handle.

use super::*;

impl GpuState {
    /// A child graph node of `graph` that takes graph `child`. rets[0] = the node.
    pub(super) fn add_moved_child(
        &mut self,
        graph: u64,
        graw: Graph,
        deps: &[GraphNode],
        child: u64,
    ) -> OpResult {
        let bad = Fault::Status(status::INVALID_VALUE);
        let c = self.graphs.graphs.get(child).ok_or(bad)?;
        let gdev = self.graphs.graphs.get(graph).map(|g| g.dev).ok_or(bad)?;
        // A graph under capture is the driver's; one already held by a node (moved, a
        // conditional body, a clone's copy) is not the guest's to give away.
        if c.capturing || c.capture_target || c.owner.is_some() || c.dev != gdev {
            return Err(bad);
        }
        // No graph may end up inside itself: `graph` must not be `child` or held by it.
        let mut up = Some(graph);
        while let Some(g) = up {
            if g == child {
                return Err(bad);
            }
            up = self.graphs.graphs.get(g).and_then(|e| e.owner);
        }
        let (craw, attributed) = (c.raw, c.attributed);
        self.bind(gdev)?;
        let raw = self
            .drv
            .graph_add_child_moved(graw, deps, craw)
            .map_err(on(gdev))?;
        let h = self.node_handle(graph, raw)?;
        if let Some(c) = self.graphs.graphs.get_mut(child) {
            c.owner = Some(graph);
        }
        if attributed {
            if let Some(g) = self.graphs.graphs.get_mut(graph) {
                g.attributed = true;
            }
        }
        ok_rets(&[h])
    }
}

//! CUDA graphs and stream capture, implemented once for both faces (the runtime face's
//! `runtime/graphs.rs` and the driver face's `driver/api/graph.rs` are C ABI over these). The graphs,
//! nodes and executable graphs are the host's (real driver objects in the session's worker);
//! `cudaGraph_t`/`CUgraph`, `cudaGraphNode_t`/`CUgraphNode` and `cudaGraphExec_t`/`CUgraphExec`
//! are the host's session-local handles, which it checks on every use, the same on both faces.
//! Node parameters travel in the encodings of `qcuda_proto::graph`; kernel parameters are packed
//! with the kernel's registered layout, exactly as for a launch. Capture: transport/capture.rs
//! (guest side) and vhost-cuda's gpu_state/graphs.rs (host side). Conditional nodes: the host's
//! driver makes the handles and the body graphs; [`add_conditional_node`] keeps CUDA's array of
//! the bodies.
//!
//! Edge data (`cudaGraphEdgeData`: the ports and types of programmatic dependent launch) travels
//! with every dependency list, edge and capture dependency to the host's driver and back
//! (`qcuda_proto::graph::EdgeData`); the calls without edge data answer `cudaErrorLossyQuery`
//! where an edge's data would be lost, as CUDA does.
//!
//! Not served: external semaphore nodes, batch memory-operation nodes, kernel node attributes,
//! user objects and arrays in memcpy nodes.
//!
//! Files, from the bottom: `lists` (handles, node lists, edge data), `nodes` (each node type's
//! parameters on the wire), `requests` (adding nodes, setting parameters, queries),
//! `conditional` (conditional nodes and their bodies), `capture` (stream capture), `build`
//! (graphs and their nodes), `node_params` (getting and setting node parameters), `exec`
//! (executable graphs), `memory` (a device's graph memory).

mod build;
mod capture;
mod conditional;
mod exec;
mod lists;
mod memory;
mod node_params;
mod nodes;
mod requests;

pub use build::*;
pub use capture::*;
pub use conditional::*;
pub use exec::*;
pub use lists::*;
pub use memory::*;
pub use node_params::*;
pub use nodes::*;
pub use requests::*;

// SPDX-License-Identifier: Apache-2.0 OR MIT
//! qcuda-proto: the single definition of the qcuda wire format and the `/dev/qcuda` ioctl ABI.
//!
//! The wire definitions live in `wire.rs` (graph node parameter encodings in `graph.rs`), which
//! the guest kernel module includes verbatim with `#[path]`; this crate re-exports it for the
//! host daemon, guest-lib and qcuda-smi. `cuda_errors` is CUDA's own error table and sticky set,
//! which the kernel module, a transport, has no use for.
#![no_std]

pub mod cuda_errors;
pub mod graph;
pub mod link;
mod wire;

pub use wire::*;

/// The graph and stream-capture ops (served by the host's graph tables) as a pattern, for the
/// matches over [`Op`] that treat them alike: `qcuda_proto::graph_ops!() => ...`.
#[macro_export]
macro_rules! graph_ops {
    () => {
        $crate::Op::StreamBeginCapture
            | $crate::Op::StreamEndCapture
            | $crate::Op::StreamCaptureInfo
            | $crate::Op::StreamUpdateCaptureDependencies
            | $crate::Op::GraphCreate
            | $crate::Op::GraphDestroy
            | $crate::Op::GraphAddNode
            | $crate::Op::GraphNodeSetParams
            | $crate::Op::GraphExecNodeSetParams
            | $crate::Op::GraphGetNodes
            | $crate::Op::GraphGetEdges
            | $crate::Op::GraphNodeQuery
            | $crate::Op::GraphEdges
            | $crate::Op::GraphClone
            | $crate::Op::GraphInstantiate
            | $crate::Op::GraphExecDestroy
            | $crate::Op::GraphLaunch
            | $crate::Op::GraphUpload
            | $crate::Op::GraphExecUpdate
            | $crate::Op::GraphDebugDot
            | $crate::Op::GraphNodeEnabled
            | $crate::Op::GraphExecChildGraph
            | $crate::Op::GraphExecSetEvent
            | $crate::Op::StreamCaptureInvalidate
            | $crate::Op::StreamBeginCaptureToGraph
            | $crate::Op::GraphQuery
            | $crate::Op::GraphKernelNodeGetParams
            | $crate::Op::GraphDestroyNode
            | $crate::Op::GraphNodeGetParams
            | $crate::Op::GraphMem
    };
}

/// The pitched, 3D, array, texture and surface ops (served by the host's array tables) as a
/// pattern, for the matches over [`Op`] that treat them alike.
#[macro_export]
macro_rules! array_ops {
    () => {
        $crate::Op::MallocPitch
            | $crate::Op::Memset3D
            | $crate::Op::Memcpy3D
            | $crate::Op::Memcpy3DHtoD
            | $crate::Op::Memcpy3DDtoH
            | $crate::Op::ArrayCreate
            | $crate::Op::ArrayDestroy
            | $crate::Op::MipmappedArrayLevel
            | $crate::Op::ArrayInfo
            | $crate::Op::TexObjectCreate
            | $crate::Op::TexObjectDestroy
            | $crate::Op::SurfObjectCreate
            | $crate::Op::SurfObjectDestroy
    };
}

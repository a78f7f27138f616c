// SPDX-License-Identifier: Apache-2.0 OR MIT
//! qcuda-proto: the single definition of the qcuda wire format and the `/dev/qcuda` ioctl ABI.
//!
//! The wire definitions live in `wire.rs` (graph node parameter encodings in `graph.rs`), which
//! the guest kernel module includes verbatim with `#[path]`; this crate re-exports it for the
//! host daemon, guest-lib and qcuda-smi. `cuda_errors` is CUDA's own error table and sticky set,
//! which the kernel module, a transport, has no use for; `trace` is the GPU timeline's record
//! format (`Op::GpuTrace`).
#![no_std]

pub mod cuda_errors;
pub mod graph;
pub mod link;
pub mod tensor_map;
pub mod trace;
mod wire;

pub use wire::*;

/// A byte count for people, as qcuda-smi and vhost-cuda print it: "0 B", "512 B", "4.0 KiB",
/// "1.5 GiB" (powers of 1024, one decimal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanBytes(pub u64);

impl core::fmt::Display for HumanBytes {
    #[expect(
        clippy::cast_precision_loss,
        reason = "one decimal for people; exact counts are printed elsewhere"
    )]
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        let b = self.0;
        if b < 1024 {
            return write!(f, "{b} B");
        }
        let mut v = b as f64 / 1024.0;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        write!(f, "{v:.1} {}", UNITS[unit])
    }
}

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
            | $crate::Op::GraphConditionalHandleCreate
            | $crate::Op::GraphKernelNodeSetAttribute
            | $crate::Op::GraphKernelNodeGetAttribute
            | $crate::Op::GraphKernelNodeCopyAttributes
    };
}

/// The virtual memory management ops (`MemCreate` ... `MemMappingRange`) as a pattern, for the
/// matches over [`Op`] that treat them alike.
#[macro_export]
macro_rules! vmm_ops {
    () => {
        $crate::Op::MemCreate
            | $crate::Op::MemRelease
            | $crate::Op::MemAddressReserve
            | $crate::Op::MemAddressFree
            | $crate::Op::MemMap
            | $crate::Op::MemUnmap
            | $crate::Op::MemSetAccess
            | $crate::Op::MemGetAccess
            | $crate::Op::MemGetGranularity
            | $crate::Op::MemRetainHandle
            | $crate::Op::MemHandleProperties
            | $crate::Op::MemMappingRange
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

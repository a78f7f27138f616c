//! Launch attributes of streams and kernel nodes on the driver face: `cuStreamSetAttribute`,
//! `cuStreamGetAttribute`, `cuStreamCopyAttributes` and `cuGraphKernelNodeSetAttribute`,
//! `...GetAttribute`, `...CopyAttributes` over the core's `attributes.rs`, which the runtime face
//! shares (a `CUlaunchAttributeValue` is a `cudaLaunchAttributeValue`, a `CUstream` a
//! `cudaStream_t`, a `CUgraphNode` a `cudaGraphNode_t`).

use super::initialized;
use crate::{
    core::{runtime::attributes::ops, runtime::context},
    driver::status::DrvResult,
    generated::{self as cu, driver_api as d},
};

// The driver's and the runtime's forms of the value are one C layout.
const _: () =
    assert!(size_of::<d::CUlaunchAttributeValue>() == size_of::<cu::cudaLaunchAttributeValue>());

/// `cuInit` done and a context current.
fn ready() -> DrvResult<()> {
    initialized()?;
    context::require_current()?;
    Ok(())
}

driver_api! {
    /// `cuStreamSetAttribute`.
    #[per_thread(cuStreamSetAttribute_ptsz)]
    fn cuStreamSetAttribute(hStream: d::CUstream, attr: d::CUstreamAttrID, value: *const d::CUstreamAttrValue) {
        ready()?;
        // SAFETY: forwarded API contract; the value's layout is the runtime's.
        Ok(unsafe { ops::stream_set(hStream as usize, attr, value.cast()) }?)
    }

    /// `cuStreamGetAttribute`.
    #[per_thread(cuStreamGetAttribute_ptsz)]
    fn cuStreamGetAttribute(hStream: d::CUstream, attr: d::CUstreamAttrID, value_out: *mut d::CUstreamAttrValue) {
        ready()?;
        // SAFETY: forwarded API contract.
        Ok(unsafe { ops::stream_get(hStream as usize, attr, value_out.cast()) }?)
    }

    /// `cuStreamCopyAttributes`.
    #[per_thread(cuStreamCopyAttributes_ptsz)]
    fn cuStreamCopyAttributes(dst: d::CUstream, src: d::CUstream) {
        ready()?;
        Ok(ops::stream_copy(dst as usize, src as usize)?)
    }

    /// `cuGraphKernelNodeSetAttribute`: priority, cluster dimensions, access policy window and
    /// every other launch attribute the host's driver lets a kernel node take.
    fn cuGraphKernelNodeSetAttribute(hNode: d::CUgraphNode, attr: d::CUkernelNodeAttrID, value: *const d::CUkernelNodeAttrValue) {
        ready()?;
        // SAFETY: forwarded API contract.
        Ok(unsafe { ops::kernel_node_set(hNode as u64, attr, value.cast()) }?)
    }

    /// `cuGraphKernelNodeGetAttribute`.
    fn cuGraphKernelNodeGetAttribute(hNode: d::CUgraphNode, attr: d::CUkernelNodeAttrID, value_out: *mut d::CUkernelNodeAttrValue) {
        ready()?;
        // SAFETY: forwarded API contract.
        Ok(unsafe { ops::kernel_node_get(hNode as u64, attr, value_out.cast()) }?)
    }

    /// `cuGraphKernelNodeCopyAttributes`.
    fn cuGraphKernelNodeCopyAttributes(dst: d::CUgraphNode, src: d::CUgraphNode) {
        ready()?;
        Ok(ops::kernel_node_copy(dst as u64, src as u64)?)
    }
}

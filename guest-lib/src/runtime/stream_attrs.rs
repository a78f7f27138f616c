//! Launch attributes of streams (`cudaStreamSetAttribute`, `cudaStreamGetAttribute`,
//! `cudaStreamCopyAttributes`: the L2 access policy window, the synchronisation policy, the
//! priority and the memory synchronisation domain (map)) and of kernel nodes
//! (`cudaGraphKernelNodeSetAttribute`, `...GetAttribute`, `...CopyAttributes`: every launch
//! attribute a node takes, such as its priority and cluster dimensions); and
//! `cudaCtxResetPersistingL2Cache`. The work is the core's (`core::runtime::attributes`), which the
//! driver face shares.

use core::ffi::c_uint;

use crate::{
    core::runtime::attributes::ops,
    generated::{cudaGraphNode_t, cudaLaunchAttributeValue, cudaStream_t},
};

cuda_api! {
    /// `cudaStreamSetAttribute`.
    #[per_thread(cudaStreamSetAttribute_ptsz)]
    fn cudaStreamSetAttribute(hStream: cudaStream_t, attr: c_uint, value: *const cudaLaunchAttributeValue) {
        // SAFETY: forwarded API contract.
        unsafe { ops::stream_set(hStream as usize, attr, value) }
    }

    /// `cudaStreamGetAttribute`.
    #[per_thread(cudaStreamGetAttribute_ptsz)]
    fn cudaStreamGetAttribute(hStream: cudaStream_t, attr: c_uint, value_out: *mut cudaLaunchAttributeValue) {
        // SAFETY: forwarded API contract.
        unsafe { ops::stream_get(hStream as usize, attr, value_out) }
    }

    /// `cudaStreamCopyAttributes`: `dst` takes every attribute a stream has from `src`.
    #[per_thread(cudaStreamCopyAttributes_ptsz)]
    fn cudaStreamCopyAttributes(dst: cudaStream_t, src: cudaStream_t) {
        ops::stream_copy(dst as usize, src as usize)
    }

    /// `cudaGraphKernelNodeSetAttribute`.
    fn cudaGraphKernelNodeSetAttribute(hNode: cudaGraphNode_t, attr: c_uint, value: *const cudaLaunchAttributeValue) {
        // SAFETY: forwarded API contract.
        unsafe { ops::kernel_node_set(hNode as u64, attr, value) }
    }

    /// `cudaGraphKernelNodeGetAttribute`.
    fn cudaGraphKernelNodeGetAttribute(hNode: cudaGraphNode_t, attr: c_uint, value_out: *mut cudaLaunchAttributeValue) {
        // SAFETY: forwarded API contract.
        unsafe { ops::kernel_node_get(hNode as u64, attr, value_out) }
    }

    /// `cudaGraphKernelNodeCopyAttributes` (CUDA 13 order: destination, then source).
    fn cudaGraphKernelNodeCopyAttributes(hDst: cudaGraphNode_t, hSrc: cudaGraphNode_t) {
        ops::kernel_node_copy(hDst as u64, hSrc as u64)
    }

    /// `cudaCtxResetPersistingL2Cache`: lines of the current device's L2 cache kept as
    /// persisting go back to normal.
    fn cudaCtxResetPersistingL2Cache() { crate::core::runtime::devices::reset_persisting_l2() }
}

//! Stream capture and the graph calls that libraries make around it (cuBLAS asks whether a
//! stream is capturing before it works on it). A `CUgraph` is the runtime face's `cudaGraph_t`
//! and a `CUgraphExec` its `cudaGraphExec_t`: the same records, so a graph captured through one
//! face launches through the other.

use core::ffi::c_ulonglong;

use super::{initialized, via_runtime};
use crate::core::context;
use crate::{driver::status::DrvResult, generated::driver_api as d, runtime::graphs as rt_graphs};

fn ready() -> DrvResult<()> {
    initialized()?;
    Ok(context::require_current().map(drop)?)
}

driver_api! {
    /// `cuThreadExchangeStreamCaptureMode` (the modes are the runtime's).
    fn cuThreadExchangeStreamCaptureMode(mode: *mut d::CUstreamCaptureMode) {
        initialized()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_graphs::cudaThreadExchangeStreamCaptureMode(mode) })
    }

    /// `cuStreamBeginCapture_v2`.
    #[per_thread(cuStreamBeginCapture_v2_ptsz)]
    fn cuStreamBeginCapture_v2(hStream: d::CUstream, mode: d::CUstreamCaptureMode) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_graphs::cudaStreamBeginCapture(hStream.cast(), mode) })
    }

    /// `cuStreamEndCapture`.
    #[per_thread(cuStreamEndCapture_ptsz)]
    fn cuStreamEndCapture(hStream: d::CUstream, phGraph: *mut d::CUgraph) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_graphs::cudaStreamEndCapture(hStream.cast(), phGraph.cast()) })
    }

    /// `cuStreamIsCapturing`.
    #[per_thread(cuStreamIsCapturing_ptsz)]
    fn cuStreamIsCapturing(hStream: d::CUstream, captureStatus: *mut d::CUstreamCaptureStatus) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_graphs::cudaStreamIsCapturing(hStream.cast(), captureStatus) })
    }

    /// `cuStreamGetCaptureInfo_v3`.
    #[per_thread(cuStreamGetCaptureInfo_v3_ptsz)]
    fn cuStreamGetCaptureInfo_v3(
        hStream: d::CUstream,
        captureStatus_out: *mut d::CUstreamCaptureStatus,
        id_out: *mut d::cuuint64_t,
        graph_out: *mut d::CUgraph,
        dependencies_out: *mut *const d::CUgraphNode,
        edgeData_out: *mut *const d::CUgraphEdgeData,
        numDependencies_out: *mut usize,
    ) {
        ready()?;
        // SAFETY: forwarded contract; the node and edge records are the runtime's.
        via_runtime(|| unsafe {
            rt_graphs::cudaStreamGetCaptureInfo(
                hStream.cast(),
                captureStatus_out,
                id_out.cast::<c_ulonglong>(),
                graph_out.cast(),
                dependencies_out.cast(),
                edgeData_out.cast(),
                numDependencies_out,
            )
        })
    }

    /// `cuStreamGetCaptureInfo_v2` (CUDA 11.3-12.2: no edge data).
    #[per_thread(cuStreamGetCaptureInfo_v2_ptsz)]
    #[no_prototype = "cuda.h maps it to _v3"]
    fn cuStreamGetCaptureInfo_v2(
        hStream: d::CUstream,
        captureStatus_out: *mut d::CUstreamCaptureStatus,
        id_out: *mut d::cuuint64_t,
        graph_out: *mut d::CUgraph,
        dependencies_out: *mut *const d::CUgraphNode,
        numDependencies_out: *mut usize
    ) {
        // SAFETY: the same contract, without edge data.
        super::super::status::DriverError::check(unsafe {
            cuStreamGetCaptureInfo_v3(
                hStream,
                captureStatus_out,
                id_out,
                graph_out,
                dependencies_out,
                std::ptr::null_mut(),
                numDependencies_out,
            )
        })
    }

    /// `cuGraphInstantiateWithFlags`.
    fn cuGraphInstantiateWithFlags(phGraphExec: *mut d::CUgraphExec, hGraph: d::CUgraph, flags: ::core::ffi::c_ulonglong) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe {
            rt_graphs::cudaGraphInstantiateWithFlags(phGraphExec.cast(), hGraph.cast(), flags)
        })
    }

    /// `cuGraphLaunch`.
    #[per_thread(cuGraphLaunch_ptsz)]
    fn cuGraphLaunch(hGraphExec: d::CUgraphExec, hStream: d::CUstream) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_graphs::cudaGraphLaunch(hGraphExec.cast(), hStream.cast()) })
    }

    /// `cuGraphUpload`.
    #[per_thread(cuGraphUpload_ptsz)]
    fn cuGraphUpload(hGraphExec: d::CUgraphExec, hStream: d::CUstream) {
        ready()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_graphs::cudaGraphUpload(hGraphExec.cast(), hStream.cast()) })
    }

    /// `cuGraphExecDestroy`.
    fn cuGraphExecDestroy(hGraphExec: d::CUgraphExec) {
        initialized()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_graphs::cudaGraphExecDestroy(hGraphExec.cast()) })
    }

    /// `cuGraphDestroy`.
    fn cuGraphDestroy(hGraph: d::CUgraph) {
        initialized()?;
        // SAFETY: forwarded contract.
        via_runtime(|| unsafe { rt_graphs::cudaGraphDestroy(hGraph.cast()) })
    }
}

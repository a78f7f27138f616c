//! Stream capture: beginning (into a new graph or an existing one), ending, the capture's
//! state and dependencies, and each thread's capture mode (transport/capture.rs is the
//! session's record of captures under way).

#![allow(non_snake_case)] // the calls keep CUDA's parameter names

use crate::core::conv::{low_u32, usize_of};
use core::ffi::{c_uint, c_ulonglong};
use std::cell::RefCell;

use qcuda_proto::{
    graph::{self as g},
    Op,
};

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    runtime::{current, non_null},
    transport::capture,
    transport::Call,
};
use crate::generated::{
    cudaGraphEdgeData, cudaGraphNode_t, cudaGraph_t, cudaStreamCaptureMode,
    cudaStreamCaptureStatus, cudaStream_t,
};

use super::lists::{edge_bytes, edges_from, handle, node_list, u64_bytes, write_out};

thread_local! {
    /// Storage behind `cudaStreamGetCaptureInfo`'s dependency and edge-data arrays, valid until
    /// the thread's next call of it.
    static CAPTURE_DEPS: RefCell<(Vec<cudaGraphNode_t>, Vec<cudaGraphEdgeData>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

pub fn begin_capture(stream: cudaStream_t, mode: cudaStreamCaptureMode) -> CudaResult<()> {
    if !capture::valid_mode(mode) {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    if t.wire == 0 {
        // The legacy stream cannot be captured; qcuda sends the per-thread default stream to
        // it too (streams.rs), so capture needs a created stream.
        return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
    }
    rt.session
        .submit(Call::new(Op::StreamBeginCapture, t.device).args(&[t.wire, u64::from(mode)]))?;
    rt.session
        .captures
        .begun(stream as usize, t.wire, t.device, mode);
    Ok(())
}

/// `cudaStreamBeginCaptureToGraph`: capture into an existing graph, after `deps` of it.
///
/// # Safety
/// `deps` and `edges` must be null or hold `n` readable entries.
pub unsafe fn begin_capture_to_graph(
    stream: cudaStream_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    edges: *const cudaGraphEdgeData,
    n: usize,
    mode: cudaStreamCaptureMode,
) -> CudaResult<()> {
    if !capture::valid_mode(mode) || graph.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: forwarded API contract.
    let (list, edges) = unsafe { (u64_bytes(&node_list(deps, n)?), edge_bytes(edges, n)?) };
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    if t.wire == 0 {
        return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
    }
    rt.session.submit(
        Call::new(Op::StreamBeginCaptureToGraph, t.device)
            .args(&[t.wire, handle(graph), u64::from(mode)])
            .input(&list)
            .input(&edges),
    )?;
    rt.session
        .captures
        .begun(stream as usize, t.wire, t.device, mode);
    Ok(())
}

/// `cudaStreamEndCapture`: the captured graph, written to `graph` unless it is null. A null
/// `graph` is how programs end a capture into a graph they already hold
/// (`cudaStreamBeginCaptureToGraph`, as NVIDIA's conditional-node samples do) or abandon one;
/// the capture ends either way, and a graph nobody took stays the session's (like the graph
/// CUDA leaves behind) until the process ends.
///
/// # Safety
/// `graph` must be null or writable.
pub unsafe fn end_capture(stream: cudaStream_t, graph: *mut cudaGraph_t) -> CudaResult<()> {
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    if t.wire == 0 {
        return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
    }
    rt.session.captures.check_end(stream as usize)?;
    let r = rt
        .session
        .submit(Call::new(Op::StreamEndCapture, t.device).args(&[t.wire]));
    rt.session.captures.ended(stream as usize);
    let out = match &r {
        Ok(reply) => usize_of(reply.rets[0]) as cudaGraph_t,
        // CUDA returns a NULL graph for a failed capture.
        Err(_) => std::ptr::null_mut(),
    };
    if !graph.is_null() {
        // SAFETY: non-null, so writable (caller contract).
        unsafe { graph.write_unaligned(out) };
    }
    r.map(|_| ())
}

/// What the host's driver says of `stream`'s capture.
#[derive(Debug)]
pub struct CaptureInfo {
    /// `cudaStreamCaptureStatus`.
    pub status: u64,
    pub id: u64,
    /// The graph being captured (0 when none).
    pub graph: u64,
    /// The nodes the next captured work depends on, and the edge data of each.
    pub deps: Vec<u64>,
    pub edges: Vec<cudaGraphEdgeData>,
}

pub fn capture_info(stream: cudaStream_t) -> CudaResult<CaptureInfo> {
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    let mut want = 64usize;
    loop {
        let mut buf = vec![0u8; want * 8];
        let mut edges = vec![0u8; want * g::EDGE_DATA_SIZE];
        let reply = rt.session.submit(
            Call::new(Op::StreamCaptureInfo, t.device)
                .args(&[t.wire])
                .output(&mut buf)
                .output(&mut edges),
        )?;
        let n = usize::try_from(reply.rets[3]).map_err(|_| CudaError::UNKNOWN)?;
        if n <= want {
            let deps = buf[..n * 8]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            return Ok(CaptureInfo {
                status: reply.rets[0],
                id: reply.rets[1],
                graph: reply.rets[2],
                deps,
                edges: edges_from(&edges, n),
            });
        }
        want = n;
    }
}

/// `cudaStreamIsCapturing`.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn is_capturing(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
) -> CudaResult<()> {
    non_null(status)?;
    let info = capture_info(stream)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(status, low_u32(info.status) as cudaStreamCaptureStatus) }
}

/// `cudaStreamGetCaptureInfo`: the dependency and edge arrays stay valid until the calling
/// thread's next call of it. Asked without `edges` while a dependency has edge data other than
/// the default (a programmatic dependent launch was captured), it fails with
/// `cudaErrorLossyQuery`, as CUDA does (`cuStreamGetCaptureInfo_v2` has no edge data at all).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn get_capture_info(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
    id: *mut c_ulonglong,
    graph: *mut cudaGraph_t,
    deps: *mut *const cudaGraphNode_t,
    edges: *mut *const cudaGraphEdgeData,
    num: *mut usize,
) -> CudaResult<()> {
    non_null(status)?;
    if !edges.is_null() && deps.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let info = capture_info(stream)?;
    let lossy = info
        .edges
        .iter()
        .any(|e| e.from_port != 0 || e.to_port != 0 || e.type_ != 0);
    if lossy && edges.is_null() && !deps.is_null() {
        return Err(CudaError::LOSSY_QUERY);
    }
    let list = info.deps;
    // SAFETY: each out pointer is null or writable (API contract).
    unsafe {
        write_out(status, low_u32(info.status) as cudaStreamCaptureStatus)?;
        if !id.is_null() {
            id.write(info.id);
        }
        if !graph.is_null() {
            graph.write(usize_of(info.graph) as cudaGraph_t);
        }
        if !num.is_null() {
            num.write(list.len());
        }
    }
    CAPTURE_DEPS.with(|c| {
        let mut c = c.borrow_mut();
        c.0 = list
            .iter()
            .map(|&h| usize_of(h) as cudaGraphNode_t)
            .collect();
        c.1 = info.edges;
        // SAFETY: as above; the arrays live in this thread's storage until its next call.
        unsafe {
            if !deps.is_null() {
                deps.write(if list.is_empty() {
                    std::ptr::null()
                } else {
                    c.0.as_ptr()
                });
            }
            if !edges.is_null() {
                edges.write(if list.is_empty() {
                    std::ptr::null()
                } else {
                    c.1.as_ptr()
                });
            }
        }
    });
    Ok(())
}

/// `cudaStreamUpdateCaptureDependencies`, with the dependencies' edge data.
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for the call.
pub unsafe fn update_capture_deps(
    stream: cudaStream_t,
    deps: *mut cudaGraphNode_t,
    edges: *const cudaGraphEdgeData,
    n: usize,
    flags: c_uint,
) -> CudaResult<()> {
    if flags > 1 {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: forwarded API contract.
    let (list, edges) = unsafe { (u64_bytes(&node_list(deps, n)?), edge_bytes(edges, n)?) };
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    rt.session.submit(
        Call::new(Op::StreamUpdateCaptureDependencies, t.device)
            .args(&[t.wire, u64::from(flags)])
            .input(&list)
            .input(&edges),
    )?;
    Ok(())
}

/// The body of `cudaThreadExchangeStreamCaptureMode` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaThreadExchangeStreamCaptureMode`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn thread_exchange_stream_capture_mode(
    mode: *mut cudaStreamCaptureMode,
) -> CudaResult<()> {
    non_null(mode)?;
    // SAFETY: non-null, readable and writable (API contract).
    unsafe { *mode = capture::exchange_mode(*mode)? };
    Ok(())
}

/// The body of `cudaStreamGetCaptureInfo` (both faces).
///
/// # Safety
/// Pointer arguments must be valid as CUDA documents for `cudaStreamGetCaptureInfo`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn stream_get_capture_info(
    stream: cudaStream_t,
    captureStatus_out: *mut cudaStreamCaptureStatus,
    id_out: *mut c_ulonglong,
    graph_out: *mut cudaGraph_t,
    dependencies_out: *mut *const cudaGraphNode_t,
    edgeData_out: *mut *const cudaGraphEdgeData,
    numDependencies_out: *mut usize,
) -> CudaResult<()> {
    // SAFETY: forwarded API contract.
    unsafe {
        get_capture_info(
            stream,
            captureStatus_out,
            id_out,
            graph_out,
            dependencies_out,
            edgeData_out,
            numDependencies_out,
        )
    }
}

//! Handles and lists as the graph calls take and give them: node arrays, edge data on the
//! wire and back, lists fetched from the host and written back the CUDA way, out-parameters.

use crate::core::conv::usize_of;

use qcuda_proto::{
    graph::{self as g},
    Op,
};

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    runtime::{non_null, Runtime},
    transport::Call,
};
use crate::generated::{cudaGraphEdgeData, cudaGraphNode_t};

/// Writes `value` through an out-parameter, or fails with `cudaErrorInvalidValue` for null.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
pub unsafe fn write_out<T>(out: *mut T, value: T) -> CudaResult<()> {
    non_null(out)?;
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Node handles in one `GraphGetNodes`-style reply at first; asked again when there are more.
pub const FIRST_LIST: usize = 256;

pub fn handle<T>(p: *mut T) -> u64 {
    p as usize as u64
}

pub fn u64_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A `const cudaGraphNode_t *` array of `n` entries as host handles.
///
/// # Safety
/// `nodes` must be null (with `n` 0) or valid for reads of `n` handles.
pub unsafe fn node_list(nodes: *const cudaGraphNode_t, n: usize) -> CudaResult<Vec<u64>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    non_null(nodes)?;
    // SAFETY: `n` readable handles (caller contract).
    let s = unsafe { std::slice::from_raw_parts(nodes, n) };
    if s.iter().any(|p| p.is_null()) {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(s.iter().map(|p| handle(*p)).collect())
}

/// The wire form of the edge data of `n` dependencies (`graph::EdgeData` records): empty when
/// `data` is null or every edge is a default edge. Reserved bytes must be zero, as CUDA
/// requires (`cudaErrorInvalidValue`); the host's driver judges the ports and types.
///
/// # Safety
/// `data` must be null or valid for reads of `n` entries.
pub unsafe fn edge_bytes(data: *const cudaGraphEdgeData, n: usize) -> CudaResult<Vec<u8>> {
    if data.is_null() || n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: `n` readable entries (caller contract).
    let s = unsafe { std::slice::from_raw_parts(data, n) };
    if s.iter().any(|e| e.reserved != [0; 5]) {
        return Err(CudaError::INVALID_VALUE);
    }
    let edges: Vec<g::EdgeData> = s
        .iter()
        .map(|e| g::EdgeData {
            from_port: e.from_port,
            to_port: e.to_port,
            kind: e.type_,
        })
        .collect();
    if edges.iter().all(|e| e.is_default()) {
        return Ok(Vec::new());
    }
    Ok(edges.iter().flat_map(|e| e.encode()).collect())
}

/// Edge data the host wrote (`graph::EdgeData` records, one per entry of a list of `n`);
/// entries it left out are default edges.
pub fn edges_from(bytes: &[u8], n: usize) -> Vec<cudaGraphEdgeData> {
    (0..n)
        .map(|i| {
            let e = bytes
                .get(i * g::EDGE_DATA_SIZE..(i + 1) * g::EDGE_DATA_SIZE)
                .and_then(g::EdgeData::decode)
                .unwrap_or_default();
            cudaGraphEdgeData {
                from_port: e.from_port,
                to_port: e.to_port,
                type_: e.kind,
                reserved: [0; 5],
            }
        })
        .collect()
}

/// Sends `op` and reads a list of entries of `per` u64 handles from out-buffer 0 and one edge
/// data record per entry from out-buffer 1 (asking again if they were short).
pub fn fetch_edged_list(
    rt: &Runtime,
    device: u32,
    op: Op,
    args: &[u64],
    per: usize,
) -> CudaResult<(Vec<u64>, Vec<cudaGraphEdgeData>)> {
    let mut want = FIRST_LIST;
    loop {
        let mut buf = vec![0u8; want * 8 * per];
        let mut edges = vec![0u8; want * g::EDGE_DATA_SIZE];
        let reply = rt.session.submit(
            Call::new(op, device)
                .args(args)
                .output(&mut buf)
                .output(&mut edges),
        )?;
        let n = usize::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)?;
        if n <= want {
            let list = buf[..n * 8 * per]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            return Ok((list, edges_from(&edges, n)));
        }
        want = n;
    }
}

/// Sends `op` and reads a list of u64 handles from out-buffer 0 (asking again if it was short).
pub fn fetch_list(
    rt: &Runtime,
    device: u32,
    op: Op,
    args: &[u64],
    per: usize,
) -> CudaResult<Vec<u64>> {
    let mut want = FIRST_LIST;
    loop {
        let mut buf = vec![0u8; want * 8 * per];
        let reply = rt
            .session
            .submit(Call::new(op, device).args(args).output(&mut buf))?;
        let n = usize::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)?;
        if n <= want {
            return Ok(buf[..n * 8 * per]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect());
        }
        want = n;
    }
}

/// Writes a node list the CUDA way: with a null array only the count; else up to `*count`
/// entries, the rest of the array nulled, and the real count.
///
/// # Safety
/// `out` must be null or valid for `*count` writes; `count` valid for a read and a write.
pub unsafe fn write_list(
    list: &[u64],
    out: *mut cudaGraphNode_t,
    count: *mut usize,
) -> CudaResult<()> {
    non_null(count)?;
    // SAFETY: readable (caller contract).
    let room = unsafe { *count };
    if !out.is_null() {
        for i in 0..room {
            let v = usize_of(list.get(i).copied().unwrap_or(0)) as cudaGraphNode_t;
            // SAFETY: `room` writable entries (caller contract).
            unsafe { out.add(i).write(v) };
        }
        // SAFETY: as above.
        unsafe { count.write(list.len().min(room)) };
        return Ok(());
    }
    // SAFETY: writable (caller contract).
    unsafe { count.write(list.len()) };
    Ok(())
}

/// Writes the first `n` of `edges` to `data` (default edges past the list's end).
///
/// # Safety
/// `data` must be null or valid for `n` writes.
pub unsafe fn write_edges(data: *mut cudaGraphEdgeData, edges: &[cudaGraphEdgeData], n: usize) {
    if data.is_null() {
        return;
    }
    for i in 0..n {
        // SAFETY: `n` writable entries (caller contract).
        unsafe { data.add(i).write(edges.get(i).copied().unwrap_or_default()) };
    }
}

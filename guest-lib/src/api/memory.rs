//! Memory: `cudaMalloc`, `cudaFree`, `cudaMemcpy[Async]`, `cudaMemset[Async]`, host allocations
//! and `cudaPointerGetAttributes`. The `_ptds`/`_ptsz` exports are the per-thread-default-stream
//! spellings of the same calls (see streams.rs for how that stream is mapped).

use core::ffi::{c_int, c_uint, c_void};

use super::write_out;
use crate::{
    cuda_error::{CudaError, CudaResult},
    generated::{
        cudaHostAllocMapped, cudaHostAllocPortable, cudaHostAllocWriteCombined, cudaMemcpyKind,
        cudaMemoryTypeDevice, cudaMemoryTypeHost, cudaMemoryTypeUnregistered,
        cudaPointerAttributes, cudaStream_t,
    },
    memory::{self, Ordering},
    runtime::{current, non_null},
    warnings::warn_once,
};

/// Orders a synchronous call on the legacy stream of the current device.
fn sync_order(device: u32) -> Ordering {
    Ordering {
        device,
        stream: 0,
        is_async: false,
    }
}

/// Orders an `*Async` call on `stream`.
fn async_order(stream: cudaStream_t) -> CudaResult<(&'static crate::runtime::Runtime, Ordering)> {
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    Ok((
        rt,
        Ordering {
            device: t.device,
            stream: t.wire,
            is_async: true,
        },
    ))
}

unsafe fn memcpy_sync(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    // SAFETY: forwarded API contract for the host-side ranges.
    unsafe { memory::memcpy(rt, dst as u64, src as u64, count, kind, sync_order(d)) }
}

unsafe fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> CudaResult<()> {
    let (rt, order) = async_order(stream)?;
    // SAFETY: forwarded API contract for the host-side ranges.
    unsafe { memory::memcpy(rt, dst as u64, src as u64, count, kind, order) }
}

fn memset_sync(dst: *mut c_void, value: c_int, count: usize) -> CudaResult<()> {
    let (rt, d) = current()?;
    memory::memset(rt, dst as u64, value, count, sync_order(d))
}

fn memset_async(
    dst: *mut c_void,
    value: c_int,
    count: usize,
    stream: cudaStream_t,
) -> CudaResult<()> {
    let (rt, order) = async_order(stream)?;
    memory::memset(rt, dst as u64, value, count, order)
}

fn host_alloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    non_null(ptr)?;
    if flags & !(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined) != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    if flags & cudaHostAllocMapped != 0 {
        warn_once!("cudaHostAlloc: mapped (zero-copy) host memory is not supported yet");
        return Err(CudaError::NOT_SUPPORTED);
    }
    let (rt, d) = current()?;
    rt.session.check_sticky(d)?;
    let p = rt.host_memory.alloc(size, flags, d)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(ptr, p as *mut c_void) }
}

cuda_api! {
    /// `cudaMalloc`.
    fn cudaMalloc(devPtr: *mut *mut c_void, size: usize) {
        non_null(devPtr)?;
        let (rt, d) = current()?;
        let p = memory::malloc(rt, d, size)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(devPtr, p as *mut c_void) }
    }

    /// `cudaFree`.
    fn cudaFree(devPtr: *mut c_void) {
        let (rt, d) = current()?;
        memory::free(rt, d, devPtr as u64)
    }

    /// `cudaMemcpy`: all four kinds and `cudaMemcpyDefault`, any size.
    fn cudaMemcpy(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_sync(dst, src, count, kind) }
    }

    /// `cudaMemcpy` (per-thread default stream).
    fn cudaMemcpy_ptds(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_sync(dst, src, count, kind) }
    }

    /// `cudaMemcpyAsync`: copies touching guest memory complete before returning (the memory is
    /// pageable); device-to-device copies are fire-and-forget.
    fn cudaMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_async(dst, src, count, kind, stream) }
    }

    /// `cudaMemcpyAsync` (per-thread default stream).
    fn cudaMemcpyAsync_ptsz(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_async(dst, src, count, kind, stream) }
    }

    /// `cudaMemset`.
    fn cudaMemset(devPtr: *mut c_void, value: c_int, count: usize) {
        memset_sync(devPtr, value, count)
    }

    /// `cudaMemset` (per-thread default stream).
    fn cudaMemset_ptds(devPtr: *mut c_void, value: c_int, count: usize) {
        memset_sync(devPtr, value, count)
    }

    /// `cudaMemsetAsync` (fire-and-forget).
    fn cudaMemsetAsync(devPtr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t) {
        memset_async(devPtr, value, count, stream)
    }

    /// `cudaMemsetAsync` (per-thread default stream).
    fn cudaMemsetAsync_ptsz(devPtr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t) {
        memset_async(devPtr, value, count, stream)
    }

    /// `cudaMallocHost`: page-aligned host memory (zero-copy pinned memory comes later).
    fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) {
        host_alloc(ptr, size, 0)
    }

    /// `cudaHostAlloc`: as `cudaMallocHost`; `cudaHostAllocMapped` is not supported yet.
    fn cudaHostAlloc(pHost: *mut *mut c_void, size: usize, flags: c_uint) {
        host_alloc(pHost, size, flags)
    }

    /// `cudaFreeHost`.
    fn cudaFreeHost(ptr: *mut c_void) {
        let (rt, _) = current()?;
        rt.host_memory.free(ptr as usize)
    }

    /// `cudaHostGetFlags`: the flags an allocation was made with.
    fn cudaHostGetFlags(pFlags: *mut c_uint, pHost: *mut c_void) {
        non_null(pFlags)?;
        let (rt, _) = current()?;
        let a = rt.host_memory.find(pHost as usize).ok_or(CudaError::INVALID_VALUE)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pFlags, a.flags) }
    }

    /// `cudaPointerGetAttributes`: device memory from `cudaMalloc`, host memory from
    /// `cudaMallocHost`/`cudaHostAlloc` (not mapped into the device, so no device pointer),
    /// anything else unregistered (device -2, the pointer as host pointer, as NVIDIA's 13.0
    /// runtime answers).
    fn cudaPointerGetAttributes(attributes: *mut cudaPointerAttributes, ptr: *const c_void) {
        non_null(attributes)?;
        let (rt, _) = current()?;
        let mut a = cudaPointerAttributes {
            type_: cudaMemoryTypeUnregistered,
            device: -2,
            hostPointer: ptr.cast_mut(),
            ..Default::default()
        };
        if let Some(d) = rt.allocations.find(ptr as u64) {
            a.type_ = cudaMemoryTypeDevice;
            a.device = d.device as c_int;
            a.devicePointer = ptr.cast_mut();
            a.hostPointer = std::ptr::null_mut();
        } else if let Some(h) = rt.host_memory.find(ptr as usize) {
            a.type_ = cudaMemoryTypeHost;
            a.device = h.device as c_int;
            a.hostPointer = ptr.cast_mut();
        }
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(attributes, a) }
    }
}

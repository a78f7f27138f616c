//! Memory: `cudaMalloc`, `cudaFree`, `cudaMemcpy[Async]`, `cudaMemset[Async]`, host allocations
//! and `cudaPointerGetAttributes`. The `_ptds`/`_ptsz` exports are the per-thread-default-stream
//! spellings of the same calls (see streams.rs for how that stream is mapped). What each does
//! is `core::runtime::memory::ops`'s; this face checks and writes the out-parameters.

use core::ffi::{c_int, c_uint, c_void};

use super::write_out;
use crate::{
    core::runtime::memory::ops,
    core::runtime::non_null,
    generated::{cudaMemcpyKind, cudaPointerAttributes, cudaStream_t},
};

cuda_api! {
    /// `cudaMalloc`.
    fn cudaMalloc(devPtr: *mut *mut c_void, size: usize) {
        non_null(devPtr)?;
        let p = ops::malloc(size)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(devPtr, p as *mut c_void) }
    }

    /// `cudaFree`.
    fn cudaFree(devPtr: *mut c_void) {
        ops::free(devPtr as u64)
    }

    /// `cudaMemcpy`: all four kinds and `cudaMemcpyDefault`, any size.
    #[per_thread(cudaMemcpy_ptds)]
    fn cudaMemcpy(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind) {
        // SAFETY: forwarded API contract.
        unsafe { ops::memcpy(dst as u64, src as u64, count, kind) }
    }

    /// `cudaMemcpyAsync`: copies touching guest memory complete before returning (the memory is
    /// pageable); device-to-device copies are fire-and-forget.
    #[per_thread(cudaMemcpyAsync_ptsz)]
    fn cudaMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { ops::memcpy_async(dst as u64, src as u64, count, kind, stream as usize) }
    }

    /// `cudaMemset`.
    #[per_thread(cudaMemset_ptds)]
    fn cudaMemset(devPtr: *mut c_void, value: c_int, count: usize) {
        ops::memset(devPtr as u64, value, count)
    }

    /// `cudaMemsetAsync` (fire-and-forget).
    #[per_thread(cudaMemsetAsync_ptsz)]
    fn cudaMemsetAsync(devPtr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t) {
        ops::memset_async(devPtr as u64, value, count, stream as usize)
    }

    /// `cudaMallocHost`: pinned guest memory the GPU reads and writes directly (memory/host.rs).
    fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) {
        non_null(ptr)?;
        let p = ops::host_alloc(size, 0)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(ptr, p as *mut c_void) }
    }

    /// `cudaHostAlloc`: as `cudaMallocHost`, with its flags.
    fn cudaHostAlloc(pHost: *mut *mut c_void, size: usize, flags: c_uint) {
        non_null(pHost)?;
        let p = ops::host_alloc(size, flags)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pHost, p as *mut c_void) }
    }

    /// `cudaFreeHost`: waits for the device's work, then the host drops its mapping.
    fn cudaFreeHost(ptr: *mut c_void) {
        ops::free_host(ptr as usize)
    }

    /// `cudaHostRegister`: qcuda.ko pins the pages and the host maps and registers them for as
    /// long as the registration lives. `cudaHostRegisterIoMemory` (device memory of another
    /// PCI device) has no guest equivalent.
    fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) {
        ops::host_register(ptr as usize, size, flags)
    }

    /// `cudaHostUnregister`.
    fn cudaHostUnregister(ptr: *mut c_void) {
        ops::host_unregister(ptr as usize)
    }

    /// `cudaHostGetDevicePointer`: the device address of host-mapped memory.
    fn cudaHostGetDevicePointer(pDevice: *mut *mut c_void, pHost: *mut c_void, flags: c_uint) {
        non_null(pDevice)?;
        let p = ops::host_device_pointer(pHost as usize, flags)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pDevice, p as *mut c_void) }
    }

    /// `cudaMallocManaged`: guest memory mapped into the device at its own address, which the
    /// program and its kernels share. Unlike native unified memory it never migrates: the GPU
    /// reaches it over the bus (docs/ARCHITECTURE.md, "Host memory").
    fn cudaMallocManaged(devPtr: *mut *mut c_void, size: usize, flags: c_uint) {
        non_null(devPtr)?;
        let p = ops::malloc_managed(size, flags)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(devPtr, p as *mut c_void) }
    }

    /// `cudaHostGetFlags`: the flags an allocation was made with.
    fn cudaHostGetFlags(pFlags: *mut c_uint, pHost: *mut c_void) {
        non_null(pFlags)?;
        let f = ops::host_flags(pHost as usize)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pFlags, f) }
    }

    /// `cudaPointerGetAttributes`: device, host, managed memory, or unregistered (success:
    /// pageable memory, NULL, one past an allocation), as core/runtime/pointer_attrs.rs says.
    fn cudaPointerGetAttributes(attributes: *mut cudaPointerAttributes, ptr: *const c_void) {
        non_null(attributes)?;
        let a = crate::core::runtime::pointer_attrs::ops::pointer_attributes(ptr as usize)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(attributes, a) }
    }
}

cuda_api! {
    /// `cudaMemcpyPeer`.
    fn cudaMemcpyPeer(dst: *mut c_void, dstDevice: c_int, src: *const c_void, srcDevice: c_int, count: usize) {
        ops::memcpy_peer(dst as u64, dstDevice, src as u64, srcDevice, count, None)
    }

    /// `cudaMemcpyPeerAsync` (in the order of `stream`).
    fn cudaMemcpyPeerAsync(dst: *mut c_void, dstDevice: c_int, src: *const c_void, srcDevice: c_int, count: usize, stream: cudaStream_t) {
        ops::memcpy_peer(dst as u64, dstDevice, src as u64, srcDevice, count, Some(stream as usize))
    }
}

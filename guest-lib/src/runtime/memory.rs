//! Memory: `cudaMalloc`, `cudaFree`, `cudaMemcpy[Async]`, `cudaMemset[Async]`, host allocations
//! and `cudaPointerGetAttributes`. The `_ptds`/`_ptsz` exports are the per-thread-default-stream
//! spellings of the same calls (see streams.rs for how that stream is mapped).

use crate::core::conv::int_of_u32;
use core::ffi::{c_int, c_uint, c_void};

use super::write_out;
use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::host_memory::HostKind,
    core::memory::{self, Ordering},
    core::runtime::{current, non_null},
    core::warnings::warn_once,
    generated::{
        cudaHostAllocMapped, cudaHostAllocPortable, cudaHostAllocWriteCombined,
        cudaHostRegisterIoMemory, cudaHostRegisterMapped, cudaHostRegisterPortable,
        cudaHostRegisterReadOnly, cudaMemcpyKind, cudaMemoryTypeDevice, cudaMemoryTypeHost,
        cudaMemoryTypeManaged, cudaMemoryTypeUnregistered, cudaPointerAttributes, cudaStream_t,
    },
};

/// Orders a synchronous call on the legacy stream of the current device.
pub(crate) fn sync_order(device: u32) -> Ordering {
    Ordering {
        device,
        stream: 0,
        is_async: false,
    }
}

/// Orders an `*Async` call on `stream`.
pub(crate) fn async_order(
    stream: cudaStream_t,
) -> CudaResult<(&'static crate::core::runtime::Runtime, Ordering)> {
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

/// `cudaMemAttachGlobal`.
const MEM_ATTACH_GLOBAL: c_uint = 1;
/// `cudaMemAttachHost`.
const MEM_ATTACH_HOST: c_uint = 2;

/// `cudaHostAlloc`: every flag works. The memory is always portable and mapped (it is one
/// registration, visible to every device, at a device address equal to the pointer);
/// write-combining is a CPU caching hint that guest memory does not take, so it is recorded
/// only.
fn host_alloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    non_null(ptr)?;
    if flags & !(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined) != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, d) = current()?;
    rt.session.check_sticky(d)?;
    rt.session.captures.check_unsafe_call(&rt.session)?;
    let p = rt
        .host_memory
        .alloc(&rt.session, size, flags, d, HostKind::Allocated)?;
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
    #[per_thread(cudaMemcpy_ptds)]
    fn cudaMemcpy(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_sync(dst, src, count, kind) }
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
        unsafe { memcpy_async(dst, src, count, kind, stream) }
    }

    /// `cudaMemset`.
    #[per_thread(cudaMemset_ptds)]
    fn cudaMemset(devPtr: *mut c_void, value: c_int, count: usize) {
        memset_sync(devPtr, value, count)
    }

    /// `cudaMemsetAsync` (fire-and-forget).
    #[per_thread(cudaMemsetAsync_ptsz)]
    fn cudaMemsetAsync(devPtr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t) {
        memset_async(devPtr, value, count, stream)
    }

    /// `cudaMallocHost`: pinned guest memory the GPU reads and writes directly (host_memory.rs).
    fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) {
        host_alloc(ptr, size, 0)
    }

    /// `cudaHostAlloc`: as `cudaMallocHost`, with its flags.
    fn cudaHostAlloc(pHost: *mut *mut c_void, size: usize, flags: c_uint) {
        host_alloc(pHost, size, flags)
    }

    /// `cudaFreeHost`: waits for the device's work, then the host drops its mapping.
    fn cudaFreeHost(ptr: *mut c_void) {
        let (rt, _) = current()?;
        rt.host_memory.free(&rt.session, ptr as usize, HostKind::Allocated)
    }

    /// `cudaHostRegister`: qcuda.ko pins the pages and the host maps and registers them for as
    /// long as the registration lives. `cudaHostRegisterIoMemory` (device memory of another
    /// PCI device) has no guest equivalent.
    fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) {
        let known = cudaHostRegisterPortable
            | cudaHostRegisterMapped
            | cudaHostRegisterIoMemory
            | cudaHostRegisterReadOnly;
        if flags & !known != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        if flags & cudaHostRegisterIoMemory != 0 {
            warn_once!("cudaHostRegister: cudaHostRegisterIoMemory is not supported in a guest");
            return Err(CudaError::NOT_SUPPORTED);
        }
        let (rt, d) = current()?;
        rt.session.check_sticky(d)?;
        rt.session.captures.check_unsafe_call(&rt.session)?;
        let read_only = flags & cudaHostRegisterReadOnly != 0;
        rt.host_memory
            .register(&rt.session, ptr as usize, size, flags, read_only, d)
    }

    /// `cudaHostUnregister`.
    fn cudaHostUnregister(ptr: *mut c_void) {
        let (rt, _) = current()?;
        rt.host_memory.unregister(&rt.session, ptr as usize)
    }

    /// `cudaHostGetDevicePointer`: the device address of host-mapped memory.
    fn cudaHostGetDevicePointer(pDevice: *mut *mut c_void, pHost: *mut c_void, flags: c_uint) {
        non_null(pDevice)?;
        if flags != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, _) = current()?;
        let a = rt.host_memory.find(pHost as usize).ok_or(CudaError::INVALID_VALUE)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pDevice, a.device_address(pHost as usize) as *mut c_void) }
    }

    /// `cudaMallocManaged`: guest memory mapped into the device at its own address, which the
    /// program and its kernels share. Unlike native unified memory it never migrates: the GPU
    /// reaches it over the bus (docs/ARCHITECTURE.md, "Host memory").
    fn cudaMallocManaged(devPtr: *mut *mut c_void, size: usize, flags: c_uint) {
        non_null(devPtr)?;
        if flags != MEM_ATTACH_GLOBAL && flags != MEM_ATTACH_HOST {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session.check_sticky(d)?;
        rt.session.captures.check_unsafe_call(&rt.session)?;
        let p = rt
            .host_memory
            .alloc(&rt.session, size, flags, d, HostKind::Managed)?;
        if rt.host_memory.find(p).is_some_and(|a| a.dev_addr != p as u64) {
            // Only memory at one address for both sides is managed memory.
            let _ = rt.host_memory.free(&rt.session, p, HostKind::Managed);
            warn_once!("cudaMallocManaged: the host could not map the memory at its own address");
            return Err(CudaError::NOT_SUPPORTED);
        }
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(devPtr, p as *mut c_void) }
    }

    /// `cudaHostGetFlags`: the flags an allocation was made with.
    fn cudaHostGetFlags(pFlags: *mut c_uint, pHost: *mut c_void) {
        non_null(pFlags)?;
        let (rt, _) = current()?;
        let a = rt.host_memory.find(pHost as usize).ok_or(CudaError::INVALID_VALUE)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pFlags, a.flags) }
    }

    /// `cudaPointerGetAttributes`: device memory from `cudaMalloc`; host memory from
    /// `cudaMallocHost`/`cudaHostAlloc`/`cudaHostRegister`, with its device address; managed
    /// memory; anything else unregistered (device -2, the pointer as host pointer, as NVIDIA's
    /// 13.0 runtime answers).
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
            a.device = int_of_u32(d.device);
            a.devicePointer = ptr.cast_mut();
            a.hostPointer = std::ptr::null_mut();
        } else if let Some(h) = rt
            .host_memory
            .find(ptr as usize)
            .filter(|h| h.kind != HostKind::GraphPinned)
        {
            a.type_ = if h.kind == HostKind::Managed {
                cudaMemoryTypeManaged
            } else {
                cudaMemoryTypeHost
            };
            a.device = int_of_u32(h.device);
            a.hostPointer = ptr.cast_mut();
            a.devicePointer = h.device_address(ptr as usize) as *mut c_void;
        }
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(attributes, a) }
    }
}

/// `cudaMemcpyPeer[Async]`: a copy between the memory of two devices, on `order`'s stream (the
/// current device's legacy stream for the synchronous one, which returns once it is done).
fn memcpy_peer(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
    rt: &crate::core::runtime::Runtime,
    order: Ordering,
) -> CudaResult<()> {
    let dd = rt.devices.check(dst_device)?;
    let sd = rt.devices.check(src_device)?;
    if count == 0 {
        return Ok(());
    }
    let mut call = crate::core::transport::Call::new(qcuda_proto::Op::MemcpyPeer, order.device)
        .args(&[
            dst as u64,
            u64::from(dd),
            src as u64,
            u64::from(sd),
            count as u64,
            order.stream,
        ]);
    if order.is_async {
        call = call.fire_and_forget();
    }
    rt.session.submit(call)?;
    Ok(())
}

cuda_api! {
    /// `cudaMemcpyPeer`.
    fn cudaMemcpyPeer(dst: *mut c_void, dstDevice: c_int, src: *const c_void, srcDevice: c_int, count: usize) {
        let (rt, d) = current()?;
        memcpy_peer(dst, dstDevice, src, srcDevice, count, rt, sync_order(d))
    }

    /// `cudaMemcpyPeerAsync` (in the order of `stream`).
    fn cudaMemcpyPeerAsync(dst: *mut c_void, dstDevice: c_int, src: *const c_void, srcDevice: c_int, count: usize, stream: cudaStream_t) {
        let (rt, order) = async_order(stream)?;
        memcpy_peer(dst, dstDevice, src, srcDevice, count, rt, order)
    }
}

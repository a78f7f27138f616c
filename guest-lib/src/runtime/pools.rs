//! Memory pools and stream-ordered allocation: `cudaMallocAsync`, `cudaMallocFromPoolAsync`,
//! `cudaFreeAsync` (and their `_ptsz` spellings), the device's default and current pools
//! (`cudaDeviceGetDefaultMemPool`, `…GetMemPool`, `…SetMemPool`, and CUDA 13's location-based
//! `cudaMemGetDefaultMemPool`, `cudaMemGetMemPool`, `cudaMemSetMemPool` for device locations),
//! `cudaMemPoolCreate`/`Destroy`, attributes, `cudaMemPoolTrimTo` and access. Pools of host
//! memory, and pools shareable other than as POSIX file descriptors, are not supported
//! (`cudaErrorNotSupported`, warned once); export and import of shareable pools and their
//! allocations: runtime/ipc.rs. The work and the checks of CUDA's structures are the core's
//! (`core::runtime::pools`), which the driver face shares.

use core::ffi::{c_int, c_void};

use qcuda_proto::Op;

use super::write_out;
use crate::{
    core::cuda_error::CudaResult,
    core::runtime::pools as ops,
    core::runtime::{non_null, runtime},
    generated::{
        cudaMemAccessDesc, cudaMemAccessFlags, cudaMemAllocationType, cudaMemLocation,
        cudaMemPoolAttr, cudaMemPoolProps, cudaMemPool_t, cudaStream_t,
    },
};

unsafe fn malloc_async(
    ptr: *mut *mut c_void,
    size: usize,
    pool: Option<cudaMemPool_t>,
    stream: cudaStream_t,
) -> CudaResult<()> {
    non_null(ptr)?;
    let p = ops::malloc_async(size, pool.map(|p| p as usize), stream as usize)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(ptr, p as *mut c_void) }
}

unsafe fn write_pool(out: *mut cudaMemPool_t, handle: usize) -> CudaResult<()> {
    // SAFETY: checked non-null by write_out; writable by the API contract.
    unsafe { write_out(out, handle as cudaMemPool_t) }
}

fn pool_of(op: Op, out: *mut cudaMemPool_t, device: u32) -> CudaResult<()> {
    non_null(out)?;
    let h = ops::pool_of(op, device)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_pool(out, h) }
}

cuda_api! {
    /// `cudaMallocAsync`: from the current pool of the stream's device, in stream order.
    #[per_thread(cudaMallocAsync_ptsz)]
    fn cudaMallocAsync(devPtr: *mut *mut c_void, size: usize, hStream: cudaStream_t) {
        // SAFETY: forwarded API contract.
        unsafe { malloc_async(devPtr, size, None, hStream) }
    }

    /// `cudaMallocFromPoolAsync`.
    #[per_thread(cudaMallocFromPoolAsync_ptsz)]
    fn cudaMallocFromPoolAsync(ptr: *mut *mut c_void, size: usize, memPool: cudaMemPool_t, stream: cudaStream_t) {
        // SAFETY: forwarded API contract.
        unsafe { malloc_async(ptr, size, Some(memPool), stream) }
    }

    /// `cudaFreeAsync`.
    #[per_thread(cudaFreeAsync_ptsz)]
    fn cudaFreeAsync(devPtr: *mut c_void, hStream: cudaStream_t) {
        ops::free_async(devPtr as u64, hStream as usize)
    }

    /// `cudaDeviceGetDefaultMemPool`.
    fn cudaDeviceGetDefaultMemPool(memPool: *mut cudaMemPool_t, device: c_int) {
        let d = runtime()?.devices.check(device)?;
        pool_of(Op::DeviceGetDefaultMemPool, memPool, d)
    }

    /// `cudaDeviceGetMemPool`: the pool `cudaMallocAsync` on the device's streams uses.
    fn cudaDeviceGetMemPool(memPool: *mut cudaMemPool_t, device: c_int) {
        let d = runtime()?.devices.check(device)?;
        pool_of(Op::DeviceGetMemPool, memPool, d)
    }

    /// `cudaDeviceSetMemPool`: the pool must be one of the device's.
    fn cudaDeviceSetMemPool(device: c_int, memPool: cudaMemPool_t) {
        let d = runtime()?.devices.check(device)?;
        ops::set_current(d, memPool as usize)
    }

    /// `cudaMemGetDefaultMemPool` (device locations, pinned allocations).
    fn cudaMemGetDefaultMemPool(memPool: *mut cudaMemPool_t, location: *mut cudaMemLocation, type_: cudaMemAllocationType) {
        ops::check_type(type_)?;
        // SAFETY: forwarded API contract.
        let d = unsafe { ops::location_device(location) }?;
        pool_of(Op::DeviceGetDefaultMemPool, memPool, d)
    }

    /// `cudaMemGetMemPool` (device locations, pinned allocations).
    fn cudaMemGetMemPool(memPool: *mut cudaMemPool_t, location: *mut cudaMemLocation, type_: cudaMemAllocationType) {
        ops::check_type(type_)?;
        // SAFETY: forwarded API contract.
        let d = unsafe { ops::location_device(location) }?;
        pool_of(Op::DeviceGetMemPool, memPool, d)
    }

    /// `cudaMemSetMemPool` (device locations, pinned allocations).
    fn cudaMemSetMemPool(location: *mut cudaMemLocation, type_: cudaMemAllocationType, memPool: cudaMemPool_t) {
        ops::check_type(type_)?;
        // SAFETY: forwarded API contract.
        let d = unsafe { ops::location_device(location) }?;
        ops::set_current(d, memPool as usize)
    }

    /// `cudaMemPoolCreate`: pinned device memory, shareable as POSIX file descriptors or not.
    fn cudaMemPoolCreate(memPool: *mut cudaMemPool_t, poolProps: *const cudaMemPoolProps) {
        non_null(memPool)?;
        // SAFETY: forwarded API contract.
        let h = unsafe { ops::create(poolProps) }?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_pool(memPool, h) }
    }

    /// `cudaMemPoolDestroy`: not a default pool; its allocations stay valid until freed.
    fn cudaMemPoolDestroy(memPool: cudaMemPool_t) { ops::destroy(memPool as usize) }

    /// `cudaMemPoolSetAttribute`: the reuse flags take an `int`, the others a 64-bit value.
    fn cudaMemPoolSetAttribute(memPool: cudaMemPool_t, attr: cudaMemPoolAttr, value: *mut c_void) {
        // SAFETY: forwarded API contract.
        unsafe { ops::set_attribute(memPool as usize, attr, value) }
    }

    /// `cudaMemPoolGetAttribute`.
    fn cudaMemPoolGetAttribute(memPool: cudaMemPool_t, attr: cudaMemPoolAttr, value: *mut c_void) {
        // SAFETY: forwarded API contract.
        unsafe { ops::get_attribute(memPool as usize, attr, value) }
    }

    /// `cudaMemPoolTrimTo`: releases memory the pool holds beyond `minBytesToKeep`.
    fn cudaMemPoolTrimTo(memPool: cudaMemPool_t, minBytesToKeep: usize) {
        ops::trim_to(memPool as usize, minBytesToKeep)
    }

    /// `cudaMemPoolSetAccess`: device locations only.
    fn cudaMemPoolSetAccess(memPool: cudaMemPool_t, descList: *const cudaMemAccessDesc, count: usize) {
        // SAFETY: forwarded API contract.
        unsafe { ops::set_access(memPool as usize, descList, count) }
    }

    /// `cudaMemPoolGetAccess`: device locations only.
    fn cudaMemPoolGetAccess(flags: *mut cudaMemAccessFlags, memPool: cudaMemPool_t, location: *mut cudaMemLocation) {
        non_null(flags)?;
        // SAFETY: forwarded API contract.
        let f = unsafe { ops::get_access(memPool as usize, location) }?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(flags, f as cudaMemAccessFlags) }
    }
}

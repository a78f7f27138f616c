//! Memory pools and stream-ordered allocation: `cudaMallocAsync`, `cudaMallocFromPoolAsync`,
//! `cudaFreeAsync` (and their `_ptsz` spellings), the device's default and current pools
//! (`cudaDeviceGetDefaultMemPool`, `…GetMemPool`, `…SetMemPool`, and CUDA 13's location-based
//! `cudaMemGetDefaultMemPool`, `cudaMemGetMemPool`, `cudaMemSetMemPool` for device locations),
//! `cudaMemPoolCreate`/`Destroy`, attributes, `cudaMemPoolTrimTo` and access. Pools of host
//! memory, and pools shareable other than as POSIX file descriptors, are not supported
//! (`cudaErrorNotSupported`, warned once). Export and import of shareable pools and their
//! allocations: runtime/ipc.rs.

use crate::core::conv::low_u32;
use core::ffi::{c_int, c_void};

use qcuda_proto::Op;

use super::write_out;
use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::pools,
    core::runtime::{current, non_null, runtime},
    core::warnings::warn_once,
    generated::{
        self as cu, cudaMemAccessDesc, cudaMemAccessFlags, cudaMemAllocationType,
        cudaMemAllocationTypePinned, cudaMemLocation, cudaMemPoolAttr, cudaMemPoolAttrUsedMemHigh,
        cudaMemPoolProps, cudaMemPoolReuseAllowInternalDependencies,
        cudaMemPoolReuseFollowEventDependencies, cudaMemPool_t, cudaStream_t,
    },
};

/// Most access descriptors one `cudaMemPoolSetAccess` sends (more than any machine has GPUs).
const MAX_ACCESS: usize = 64;

unsafe fn malloc_async(
    ptr: *mut *mut c_void,
    size: usize,
    pool: Option<cudaMemPool_t>,
    stream: cudaStream_t,
) -> CudaResult<()> {
    non_null(ptr)?;
    let (rt, _) = current()?;
    let pool = match pool {
        Some(p) if p.is_null() => return Err(CudaError::INVALID_VALUE),
        Some(p) => Some(p as usize),
        None => None,
    };
    let p = pools::malloc_async(rt, size, pool, stream as usize)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(ptr, p as *mut c_void) }
}

fn free_async(ptr: *mut c_void, stream: cudaStream_t) -> CudaResult<()> {
    let (rt, _) = current()?;
    pools::free_async(rt, ptr as u64, stream as usize)
}

/// The device of a memory location, which must be a device: host locations are pools of host
/// memory, which qcuda does not offer.
///
/// # Safety
/// `location` is null or readable.
unsafe fn location_device(location: *const cudaMemLocation) -> CudaResult<u32> {
    non_null(location)?;
    // SAFETY: non-null and readable (caller's contract).
    let loc = unsafe { location.read_unaligned() };
    match loc.type_ {
        cu::cudaMemLocationTypeDevice => runtime()?.devices.check(loc.id),
        cu::cudaMemLocationTypeHost
        | cu::cudaMemLocationTypeHostNuma
        | cu::cudaMemLocationTypeHostNumaCurrent => {
            warn_once!("memory pools of host memory are not supported");
            Err(CudaError::NOT_SUPPORTED)
        }
        _ => Err(CudaError::INVALID_VALUE),
    }
}

unsafe fn write_pool(out: *mut cudaMemPool_t, handle: usize) -> CudaResult<()> {
    // SAFETY: checked non-null by write_out; writable by the API contract.
    unsafe { write_out(out, handle as cudaMemPool_t) }
}

fn pool_of(op: Op, out: *mut cudaMemPool_t, device: u32) -> CudaResult<()> {
    non_null(out)?;
    let rt = runtime()?;
    let h = rt.pools.of_device(rt, op, device)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_pool(out, h) }
}

fn check_type(kind: cudaMemAllocationType) -> CudaResult<()> {
    if kind == cudaMemAllocationTypePinned {
        Ok(())
    } else {
        Err(CudaError::INVALID_VALUE)
    }
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
    fn cudaFreeAsync(devPtr: *mut c_void, hStream: cudaStream_t) { free_async(devPtr, hStream) }

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
        let rt = runtime()?;
        let d = rt.devices.check(device)?;
        rt.pools.set_current(rt, d, memPool as usize)
    }

    /// `cudaMemGetDefaultMemPool` (device locations, pinned allocations).
    fn cudaMemGetDefaultMemPool(memPool: *mut cudaMemPool_t, location: *mut cudaMemLocation, type_: cudaMemAllocationType) {
        check_type(type_)?;
        // SAFETY: forwarded API contract.
        let d = unsafe { location_device(location) }?;
        pool_of(Op::DeviceGetDefaultMemPool, memPool, d)
    }

    /// `cudaMemGetMemPool` (device locations, pinned allocations).
    fn cudaMemGetMemPool(memPool: *mut cudaMemPool_t, location: *mut cudaMemLocation, type_: cudaMemAllocationType) {
        check_type(type_)?;
        // SAFETY: forwarded API contract.
        let d = unsafe { location_device(location) }?;
        pool_of(Op::DeviceGetMemPool, memPool, d)
    }

    /// `cudaMemSetMemPool` (device locations, pinned allocations).
    fn cudaMemSetMemPool(location: *mut cudaMemLocation, type_: cudaMemAllocationType, memPool: cudaMemPool_t) {
        check_type(type_)?;
        // SAFETY: forwarded API contract.
        let d = unsafe { location_device(location) }?;
        let rt = runtime()?;
        rt.pools.set_current(rt, d, memPool as usize)
    }

    /// `cudaMemPoolCreate`: pinned device memory, shareable as POSIX file descriptors or not.
    fn cudaMemPoolCreate(memPool: *mut cudaMemPool_t, poolProps: *const cudaMemPoolProps) {
        non_null(memPool)?;
        non_null(poolProps)?;
        // SAFETY: non-null and readable (API contract).
        let props = unsafe { poolProps.read_unaligned() };
        check_type(props.allocType)?;
        // SAFETY: the location lies inside `props`, a local.
        let d = unsafe { location_device(&raw const props.location) }?;
        let handle_types = match props.handleTypes {
            cu::cudaMemHandleTypeNone => 0,
            cu::cudaMemHandleTypePosixFileDescriptor => qcuda_proto::POOL_HANDLE_POSIX_FD,
            _ => {
                warn_once!("cudaMemPoolCreate: pools shareable other than as POSIX file descriptors are not supported");
                return Err(CudaError::NOT_SUPPORTED);
            }
        };
        if props.usage != 0 {
            warn_once!("cudaMemPoolCreate: pool usage flags are not supported");
            return Err(CudaError::NOT_SUPPORTED);
        }
        if !props.win32SecurityAttributes.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let rt = runtime()?;
        let h = rt.pools.create(rt, d, props.maxSize, handle_types)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_pool(memPool, h) }
    }

    /// `cudaMemPoolDestroy`: not a default pool; its allocations stay valid until freed.
    fn cudaMemPoolDestroy(memPool: cudaMemPool_t) {
        let rt = runtime()?;
        rt.pools.destroy(rt, memPool as usize)
    }

    /// `cudaMemPoolSetAttribute`: the reuse flags take an `int`, the others a 64-bit value.
    fn cudaMemPoolSetAttribute(memPool: cudaMemPool_t, attr: cudaMemPoolAttr, value: *mut c_void) {
        non_null(value)?;
        let v = match attr {
            // SAFETY: non-null, and an int for these attributes (API contract).
            cudaMemPoolReuseFollowEventDependencies..=cudaMemPoolReuseAllowInternalDependencies => unsafe {
                u64::from(value.cast::<c_int>().read_unaligned() != 0)
            },
            // SAFETY: non-null, and a cuuint64_t for these (API contract).
            _ if attr <= cudaMemPoolAttrUsedMemHigh => unsafe { value.cast::<u64>().read_unaligned() },
            _ => return Err(CudaError::INVALID_VALUE),
        };
        let rt = runtime()?;
        let info = rt.pools.info(memPool as usize)?;
        rt.session.submit(
            crate::core::transport::Call::new(Op::MemPoolSetAttribute, info.device)
                .args(&[info.host, u64::from(attr), v]),
        )?;
        Ok(())
    }

    /// `cudaMemPoolGetAttribute`.
    fn cudaMemPoolGetAttribute(memPool: cudaMemPool_t, attr: cudaMemPoolAttr, value: *mut c_void) {
        non_null(value)?;
        if !(cudaMemPoolReuseFollowEventDependencies..=cudaMemPoolAttrUsedMemHigh).contains(&attr) {
            return Err(CudaError::INVALID_VALUE);
        }
        let rt = runtime()?;
        let info = rt.pools.info(memPool as usize)?;
        let reply = rt.session.submit(
            crate::core::transport::Call::new(Op::MemPoolGetAttribute, info.device)
                .args(&[info.host, u64::from(attr)]),
        )?;
        let v = reply.rets[0];
        if attr <= cudaMemPoolReuseAllowInternalDependencies {
            // SAFETY: non-null and an int for these attributes (API contract).
            unsafe { value.cast::<c_int>().write_unaligned(c_int::from(v != 0)) };
        } else {
            // SAFETY: non-null and a cuuint64_t for these (API contract).
            unsafe { value.cast::<u64>().write_unaligned(v) };
        }
        Ok(())
    }

    /// `cudaMemPoolTrimTo`: releases memory the pool holds beyond `minBytesToKeep`.
    fn cudaMemPoolTrimTo(memPool: cudaMemPool_t, minBytesToKeep: usize) {
        let rt = runtime()?;
        let info = rt.pools.info(memPool as usize)?;
        rt.session.submit(
            crate::core::transport::Call::new(Op::MemPoolTrimTo, info.device)
                .args(&[info.host, minBytesToKeep as u64]),
        )?;
        Ok(())
    }

    /// `cudaMemPoolSetAccess`: device locations only.
    fn cudaMemPoolSetAccess(memPool: cudaMemPool_t, descList: *const cudaMemAccessDesc, count: usize) {
        let rt = runtime()?;
        let info = rt.pools.info(memPool as usize)?;
        if count == 0 {
            return Ok(());
        }
        non_null(descList)?;
        if count > MAX_ACCESS {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut records = Vec::with_capacity(count * 8);
        for i in 0..count {
            // SAFETY: `descList` holds `count` descriptors (API contract).
            let d = unsafe { descList.add(i).read_unaligned() };
            // SAFETY: the location lies inside `d`, a local.
            let dev = unsafe { location_device(&raw const d.location) }?;
            if !matches!(d.flags, 0 | 1 | 3) {
                return Err(CudaError::INVALID_VALUE);
            }
            records.extend_from_slice(&dev.to_le_bytes());
            records.extend_from_slice(&d.flags.to_le_bytes());
        }
        rt.session.submit(
            crate::core::transport::Call::new(Op::MemPoolSetAccess, info.device)
                .args(&[info.host])
                .input(&records),
        )?;
        Ok(())
    }

    /// `cudaMemPoolGetAccess`: device locations only.
    fn cudaMemPoolGetAccess(flags: *mut cudaMemAccessFlags, memPool: cudaMemPool_t, location: *mut cudaMemLocation) {
        non_null(flags)?;
        // SAFETY: forwarded API contract.
        let dev = unsafe { location_device(location) }?;
        let rt = runtime()?;
        let info = rt.pools.info(memPool as usize)?;
        let reply = rt.session.submit(
            crate::core::transport::Call::new(Op::MemPoolGetAccess, info.device)
                .args(&[info.host, u64::from(dev)]),
        )?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(flags, low_u32(reply.rets[0]) as cudaMemAccessFlags) }
    }
}

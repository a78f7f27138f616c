//! The pool operations both API faces offer (see `runtime::streams`), taking CUDA's own structures
//! (the runtime's `cudaMem*` types; the driver's `CUmem*` ones have the same layout) and checking
//! them once, for both.

use core::ffi::{c_int, c_void};

use qcuda_proto::Op;

use crate::{
    core::{
        cuda_error::{CudaError, CudaResult},
        memory::device::Allocation,
        runtime::{current, non_null, runtime, Runtime},
        transport::Call,
        warnings::warn_once,
    },
    generated::{
        self as cu, cudaMemAccessDesc, cudaMemAllocationType, cudaMemAllocationTypePinned,
        cudaMemLocation, cudaMemPoolAttr, cudaMemPoolAttrUsedMemHigh, cudaMemPoolProps,
        cudaMemPoolReuseAllowInternalDependencies, cudaMemPoolReuseFollowEventDependencies,
    },
};

/// Most access descriptors one `cudaMemPoolSetAccess` sends (more than any machine has
/// GPUs).
const MAX_ACCESS: usize = 64;

/// `cudaMallocAsync` (`pool` None) / `cudaMallocFromPoolAsync` on the calling thread's
/// current device's context: the new allocation's address.
pub fn malloc_async(size: usize, pool: Option<usize>, stream: usize) -> CudaResult<u64> {
    let (rt, _) = current()?;
    if pool == Some(0) {
        return Err(CudaError::INVALID_VALUE);
    }
    stream_ordered_malloc(rt, size, pool, stream)
}

/// `cudaFreeAsync`.
pub fn free_async(ptr: u64, stream: usize) -> CudaResult<()> {
    let (rt, _) = current()?;
    stream_ordered_free(rt, ptr, stream)
}

/// The device of a memory location, which must be a device: host locations are pools of
/// host memory, which qcuda does not offer.
///
/// # Safety
/// `location` is null or readable.
pub unsafe fn location_device(location: *const cudaMemLocation) -> CudaResult<u32> {
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

/// Pinned allocations are the only kind pools hold.
pub fn check_type(kind: cudaMemAllocationType) -> CudaResult<()> {
    if kind == cudaMemAllocationTypePinned {
        Ok(())
    } else {
        Err(CudaError::INVALID_VALUE)
    }
}

/// `cudaDeviceGetDefaultMemPool` (op `DeviceGetDefaultMemPool`) or `cudaDeviceGetMemPool`
/// (op `DeviceGetMemPool`) of device ordinal `device`.
pub fn pool_of(op: Op, device: u32) -> CudaResult<usize> {
    let rt = runtime()?;
    rt.pools.of_device(&rt.session, op, device)
}

/// `cudaDeviceSetMemPool`: the pool must be one of the device's.
pub fn set_current(device: u32, pool: usize) -> CudaResult<()> {
    let rt = runtime()?;
    rt.pools.set_current(&rt.session, device, pool)
}

/// `cudaMemPoolCreate`: pinned device memory, shareable as POSIX file descriptors or not
/// (export and import: core/runtime/ipc.rs).
///
/// # Safety
/// `props` is null or readable.
pub unsafe fn create(props: *const cudaMemPoolProps) -> CudaResult<usize> {
    non_null(props)?;
    // SAFETY: non-null and readable (caller's contract).
    let props = unsafe { props.read_unaligned() };
    check_type(props.allocType)?;
    // SAFETY: the location lies inside `props`, a local.
    let d = unsafe { location_device(&raw const props.location) }?;
    let handle_types = match props.handleTypes {
        cu::cudaMemHandleTypeNone => 0,
        cu::cudaMemHandleTypePosixFileDescriptor => qcuda_proto::POOL_HANDLE_POSIX_FD,
        _ => {
            warn_once!(
                "cudaMemPoolCreate: pools shareable other than as POSIX file descriptors \
                 are not supported"
            );
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
    rt.pools.create(&rt.session, d, props.maxSize, handle_types)
}

/// `cudaMemPoolDestroy`: not a default pool; its allocations stay valid until freed.
pub fn destroy(pool: usize) -> CudaResult<()> {
    let rt = runtime()?;
    rt.pools.destroy(&rt.session, pool)
}

/// `cudaMemPoolSetAttribute`: the reuse flags take an `int`, the others a 64-bit value.
///
/// # Safety
/// `value` is null or points at the attribute's type.
pub unsafe fn set_attribute(
    pool: usize,
    attr: cudaMemPoolAttr,
    value: *mut c_void,
) -> CudaResult<()> {
    non_null(value)?;
    let v = match attr {
        // SAFETY: non-null, and an int for these attributes (caller's contract).
        cudaMemPoolReuseFollowEventDependencies..=cudaMemPoolReuseAllowInternalDependencies => unsafe {
            u64::from(value.cast::<c_int>().read_unaligned() != 0)
        },
        // SAFETY: non-null, and a cuuint64_t for these (caller's contract).
        _ if attr <= cudaMemPoolAttrUsedMemHigh => unsafe { value.cast::<u64>().read_unaligned() },
        _ => return Err(CudaError::INVALID_VALUE),
    };
    let rt = runtime()?;
    let info = rt.pools.info(pool)?;
    rt.session
        .submit(Call::new(Op::MemPoolSetAttribute, info.device).args(&[
            info.host,
            u64::from(attr),
            v,
        ]))?;
    Ok(())
}

/// `cudaMemPoolGetAttribute`.
///
/// # Safety
/// `value` is null or writable as the attribute's type.
pub unsafe fn get_attribute(
    pool: usize,
    attr: cudaMemPoolAttr,
    value: *mut c_void,
) -> CudaResult<()> {
    non_null(value)?;
    if !(cudaMemPoolReuseFollowEventDependencies..=cudaMemPoolAttrUsedMemHigh).contains(&attr) {
        return Err(CudaError::INVALID_VALUE);
    }
    let rt = runtime()?;
    let info = rt.pools.info(pool)?;
    let reply = rt.session.submit(
        Call::new(Op::MemPoolGetAttribute, info.device).args(&[info.host, u64::from(attr)]),
    )?;
    let v = reply.rets[0];
    if attr <= cudaMemPoolReuseAllowInternalDependencies {
        // SAFETY: non-null and an int for these attributes (caller's contract).
        unsafe { value.cast::<c_int>().write_unaligned(c_int::from(v != 0)) };
    } else {
        // SAFETY: non-null and a cuuint64_t for these (caller's contract).
        unsafe { value.cast::<u64>().write_unaligned(v) };
    }
    Ok(())
}

/// `cudaMemPoolTrimTo`: releases memory the pool holds beyond `keep` bytes.
pub fn trim_to(pool: usize, keep: usize) -> CudaResult<()> {
    let rt = runtime()?;
    let info = rt.pools.info(pool)?;
    rt.session
        .submit(Call::new(Op::MemPoolTrimTo, info.device).args(&[info.host, keep as u64]))?;
    Ok(())
}

/// `cudaMemPoolSetAccess`: device locations only.
///
/// # Safety
/// `descs` is null or holds `count` readable descriptors.
pub unsafe fn set_access(
    pool: usize,
    descs: *const cudaMemAccessDesc,
    count: usize,
) -> CudaResult<()> {
    let rt = runtime()?;
    let info = rt.pools.info(pool)?;
    if count == 0 {
        return Ok(());
    }
    non_null(descs)?;
    if count > MAX_ACCESS {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut records = Vec::with_capacity(count * 8);
    for i in 0..count {
        // SAFETY: `descs` holds `count` descriptors (caller's contract).
        let d = unsafe { descs.add(i).read_unaligned() };
        // SAFETY: the location lies inside `d`, a local.
        let dev = unsafe { location_device(&raw const d.location) }?;
        if !matches!(d.flags, 0 | 1 | 3) {
            return Err(CudaError::INVALID_VALUE);
        }
        records.extend_from_slice(&dev.to_le_bytes());
        records.extend_from_slice(&d.flags.to_le_bytes());
    }
    rt.session.submit(
        Call::new(Op::MemPoolSetAccess, info.device)
            .args(&[info.host])
            .input(&records),
    )?;
    Ok(())
}

/// `cudaMemPoolGetAccess`: the access flags of device location `location`.
///
/// # Safety
/// `location` is null or readable.
pub unsafe fn get_access(pool: usize, location: *const cudaMemLocation) -> CudaResult<u32> {
    // SAFETY: the caller's contract.
    let dev = unsafe { location_device(location) }?;
    let rt = runtime()?;
    let info = rt.pools.info(pool)?;
    let reply = rt
        .session
        .submit(Call::new(Op::MemPoolGetAccess, info.device).args(&[info.host, u64::from(dev)]))?;
    Ok(crate::core::conv::low_u32(reply.rets[0]))
}

/// `cudaMallocAsync` (`pool` None: the current pool of the stream's device) and
/// `cudaMallocFromPoolAsync`, in the order of `stream`.
fn stream_ordered_malloc(
    rt: &Runtime,
    size: usize,
    pool: Option<usize>,
    stream: usize,
) -> CudaResult<u64> {
    let target = rt.streams.target(stream)?;
    let (host_pool, device) = match pool {
        Some(p) => {
            let info = rt.pools.info(p)?;
            (info.host, info.device)
        }
        None => (0, target.device),
    };
    let reply = rt
        .session
        .submit(Call::new(Op::MallocAsync, target.device).args(&[
            size as u64,
            target.wire,
            host_pool,
        ]))?;
    let base = reply.rets[0];
    if base != 0 {
        rt.allocations.insert(Allocation {
            base,
            size: size as u64,
            device,
            origin: crate::core::memory::device::Origin::Pool(pool.unwrap_or(0)),
        });
    }
    Ok(base)
}

/// `cudaFreeAsync`: in the order of `stream`.
fn stream_ordered_free(rt: &Runtime, ptr: u64, stream: usize) -> CudaResult<()> {
    let target = rt.streams.target(stream)?;
    // Nothing to free, as natively: NVIDIA's runtime forwards cudaFreeAsync(NULL, stream) to
    // the driver as it is (cuSPARSE's cusparseDestroyCsrilu02Info frees its unused buffers so
    // in stream-ordered mode), and the driver takes it.
    if ptr == 0 {
        return Ok(());
    }
    rt.session
        .submit(Call::new(Op::FreeAsync, target.device).args(&[ptr, target.wire]))?;
    rt.allocations.remove(ptr);
    Ok(())
}

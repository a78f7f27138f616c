//! Memory: device allocations, pinned and registered host memory, managed memory, copies and
//! memsets. Each is the runtime face's operation on the current context's device: the same
//! allocation records, the same copy paths (mapped memory by DMA, pageable memory through the
//! virtqueue), the same fire-and-forget rules for `*Async` work.

use core::ffi::{c_int, c_uint, c_void};

use super::{device_of, initialized, out, via_core};
use crate::core::runtime::context;
use crate::core::runtime::pools as pool_ops;
use crate::{
    core::conv::usize_of,
    core::runtime::arrays as array_ops,
    core::runtime::memory::{self, ops as mem_ops},
    core::runtime::pointer_attrs::{self, Attr},
    core::runtime::runtime,
    driver::status::{DriverError, DrvResult},
    generated::{
        cudaMemcpyDefault, cudaMemcpyDeviceToDevice, cudaMemcpyDeviceToHost,
        cudaMemcpyHostToDevice, cudaMemcpyKind, driver_api as d,
    },
};

// The driver's pool structures are the runtime's, field for field: the core reads both as the
// runtime's.
const _: () = {
    use crate::generated::{cudaMemAccessDesc, cudaMemLocation, cudaMemPoolProps};
    use core::mem::{align_of, size_of};
    assert!(size_of::<d::CUmemPoolProps>() == size_of::<cudaMemPoolProps>());
    assert!(align_of::<d::CUmemPoolProps>() == align_of::<cudaMemPoolProps>());
    assert!(size_of::<d::CUmemAccessDesc>() == size_of::<cudaMemAccessDesc>());
    assert!(size_of::<d::CUmemLocation>() == size_of::<cudaMemLocation>());
};

/// The current context, made the runtime face's current device.
fn ready() -> DrvResult<()> {
    initialized()?;
    Ok(context::require_current().map(drop)?)
}

fn copy(dst: u64, src: u64, n: usize, kind: cudaMemcpyKind) -> DrvResult<()> {
    ready()?;
    // SAFETY: the driver API's contract for the host-side range, forwarded.
    via_core(|| unsafe { mem_ops::memcpy(dst, src, n, kind) })
}

fn copy_async(
    dst: u64,
    src: u64,
    n: usize,
    kind: cudaMemcpyKind,
    stream: d::CUstream,
) -> DrvResult<()> {
    ready()?;
    // SAFETY: as above; CUstream and cudaStream_t are the same handle.
    via_core(|| unsafe { mem_ops::memcpy_async(dst, src, n, kind, stream as usize) })
}

fn memset(
    dst: u64,
    value: u32,
    width: u64,
    n: usize,
    stream: Option<d::CUstream>,
) -> DrvResult<()> {
    ready()?;
    let rt = runtime()?;
    let (rt, order) = match stream {
        None => (rt, mem_ops::sync_order(crate::core::devices::current())),
        Some(s) => mem_ops::async_order(s as usize)?,
    };
    Ok(memory::memset_elements(rt, dst, value, width, n, order)?)
}

driver_api! {
    /// `cuMemAlloc_v2`.
    fn cuMemAlloc_v2(dptr: *mut d::CUdeviceptr, bytesize: usize) {
        ready()?;
        if dptr.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        if bytesize == 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        let p = via_core(|| mem_ops::malloc(bytesize))?;
        // SAFETY: checked non-null; caller's out-parameter.
        unsafe { out(dptr, p) }
    }

    /// `cuMemFree_v2`.
    fn cuMemFree_v2(dptr: d::CUdeviceptr) {
        ready()?;
        via_core(|| mem_ops::free(dptr))
    }

    /// `cuMemGetInfo_v2`.
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        ready()?;
        if free.is_null() || total.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let (f, t) = via_core(mem_ops::mem_info)?;
        // SAFETY: caller's out-parameters, checked non-null.
        unsafe {
            out(free, f)?;
            out(total, t)
        }
    }

    /// `cuMemAllocPitch_v2`: rows of `WidthInBytes` at the device's pitch.
    fn cuMemAllocPitch_v2(
        dptr: *mut d::CUdeviceptr,
        pPitch: *mut usize,
        WidthInBytes: usize,
        Height: usize,
        ElementSizeBytes: c_uint,
    ) {
        ready()?;
        if !matches!(ElementSizeBytes, 4 | 8 | 16) {
            return Err(DriverError::INVALID_VALUE);
        }
        if dptr.is_null() || pPitch.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let (p, pitch) =
            via_core(|| array_ops::malloc_pitch_current(WidthInBytes as u64, Height as u64))?;
        // SAFETY: caller's out-parameters, checked non-null.
        unsafe {
            out(dptr, p)?;
            out(pPitch, usize_of(pitch))
        }
    }

    /// `cuMemGetAddressRange_v2`: the allocation `dptr` falls in.
    fn cuMemGetAddressRange_v2(pbase: *mut d::CUdeviceptr, psize: *mut usize, dptr: d::CUdeviceptr) {
        ready()?;
        let rt = runtime()?;
        let a = rt.allocations.find(dptr).ok_or(DriverError::NOT_FOUND)?;
        if !pbase.is_null() {
            // SAFETY: non-null: the caller asked for it.
            unsafe { pbase.write_unaligned(a.base) };
        }
        if !psize.is_null() {
            // SAFETY: as above.
            unsafe { psize.write_unaligned(usize::try_from(a.size).unwrap_or(usize::MAX)) };
        }
        Ok(())
    }

    /// `cuMemAllocHost_v2`: pinned guest memory the GPU reaches directly.
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) {
        ready()?;
        if pp.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let p = via_core(|| mem_ops::host_alloc(bytesize, 0))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pp, p as *mut c_void) }
    }

    /// `cuMemFreeHost`.
    fn cuMemFreeHost(p: *mut c_void) {
        ready()?;
        via_core(|| mem_ops::free_host(p as usize))
    }

    /// `cuMemHostAlloc` (`CU_MEMHOSTALLOC_*` are the runtime's `cudaHostAlloc*` flags).
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, Flags: c_uint) {
        ready()?;
        if pp.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let p = via_core(|| mem_ops::host_alloc(bytesize, Flags))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pp, p as *mut c_void) }
    }

    /// `cuMemHostGetDevicePointer_v2`.
    fn cuMemHostGetDevicePointer_v2(pdptr: *mut d::CUdeviceptr, p: *mut c_void, Flags: c_uint) {
        ready()?;
        if pdptr.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let dp = via_core(|| mem_ops::host_device_pointer(p as usize, Flags))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pdptr, dp) }
    }

    /// `cuMemHostGetFlags`.
    fn cuMemHostGetFlags(pFlags: *mut c_uint, p: *mut c_void) {
        ready()?;
        if pFlags.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let f = via_core(|| mem_ops::host_flags(p as usize))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pFlags, f) }
    }

    /// `cuMemHostRegister_v2` (`CU_MEMHOSTREGISTER_*` are the runtime's flags).
    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, Flags: c_uint) {
        ready()?;
        via_core(|| mem_ops::host_register(p as usize, bytesize, Flags))
    }

    /// `cuMemHostUnregister`.
    fn cuMemHostUnregister(p: *mut c_void) {
        ready()?;
        via_core(|| mem_ops::host_unregister(p as usize))
    }

    /// `cuMemAllocManaged`.
    fn cuMemAllocManaged(dptr: *mut d::CUdeviceptr, bytesize: usize, flags: c_uint) {
        ready()?;
        if dptr.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let p = via_core(|| mem_ops::malloc_managed(bytesize, flags))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(dptr, p as d::CUdeviceptr) }
    }

    /// `cuMemAllocAsync`.
    #[per_thread(cuMemAllocAsync_ptsz)]
    fn cuMemAllocAsync(dptr: *mut d::CUdeviceptr, bytesize: usize, hStream: d::CUstream) {
        ready()?;
        if dptr.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let p = via_core(|| pool_ops::malloc_async(bytesize, None, hStream as usize))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(dptr, p as d::CUdeviceptr) }
    }

    /// `cuMemAllocFromPoolAsync`.
    #[per_thread(cuMemAllocFromPoolAsync_ptsz)]
    fn cuMemAllocFromPoolAsync(
        dptr: *mut d::CUdeviceptr,
        bytesize: usize,
        pool: d::CUmemoryPool,
        hStream: d::CUstream,
    ) {
        ready()?;
        if dptr.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let p = via_core(|| pool_ops::malloc_async(bytesize, Some(pool as usize), hStream as usize))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(dptr, p as d::CUdeviceptr) }
    }

    /// `cuMemFreeAsync`.
    #[per_thread(cuMemFreeAsync_ptsz)]
    fn cuMemFreeAsync(dptr: d::CUdeviceptr, hStream: d::CUstream) {
        ready()?;
        via_core(|| pool_ops::free_async(dptr, hStream as usize))
    }

    /// `cuMemcpy`: between any two addresses, by unified addressing.
    #[per_thread(cuMemcpy_ptds)]
    fn cuMemcpy(dst: d::CUdeviceptr, src: d::CUdeviceptr, ByteCount: usize) {
        copy(dst, src, ByteCount, cudaMemcpyDefault)
    }

    /// `cuMemcpyAsync`.
    #[per_thread(cuMemcpyAsync_ptsz)]
    fn cuMemcpyAsync(dst: d::CUdeviceptr, src: d::CUdeviceptr, ByteCount: usize, hStream: d::CUstream) {
        copy_async(dst, src, ByteCount, cudaMemcpyDefault, hStream)
    }

    /// `cuMemcpyHtoD_v2`.
    #[per_thread(cuMemcpyHtoD_v2_ptds)]
    fn cuMemcpyHtoD_v2(dstDevice: d::CUdeviceptr, srcHost: *const c_void, ByteCount: usize) {
        copy(dstDevice, srcHost as u64, ByteCount, cudaMemcpyHostToDevice)
    }

    /// `cuMemcpyDtoH_v2`.
    #[per_thread(cuMemcpyDtoH_v2_ptds)]
    fn cuMemcpyDtoH_v2(dstHost: *mut c_void, srcDevice: d::CUdeviceptr, ByteCount: usize) {
        copy(dstHost as u64, srcDevice, ByteCount, cudaMemcpyDeviceToHost)
    }

    /// `cuMemcpyDtoD_v2`.
    #[per_thread(cuMemcpyDtoD_v2_ptds)]
    fn cuMemcpyDtoD_v2(dstDevice: d::CUdeviceptr, srcDevice: d::CUdeviceptr, ByteCount: usize) {
        copy(dstDevice, srcDevice, ByteCount, cudaMemcpyDeviceToDevice)
    }

    /// `cuMemcpyHtoDAsync_v2`.
    #[per_thread(cuMemcpyHtoDAsync_v2_ptsz)]
    fn cuMemcpyHtoDAsync_v2(
        dstDevice: d::CUdeviceptr,
        srcHost: *const c_void,
        ByteCount: usize,
        hStream: d::CUstream,
    ) {
        copy_async(dstDevice, srcHost as u64, ByteCount, cudaMemcpyHostToDevice, hStream)
    }

    /// `cuMemcpyDtoHAsync_v2`.
    #[per_thread(cuMemcpyDtoHAsync_v2_ptsz)]
    fn cuMemcpyDtoHAsync_v2(
        dstHost: *mut c_void,
        srcDevice: d::CUdeviceptr,
        ByteCount: usize,
        hStream: d::CUstream,
    ) {
        copy_async(dstHost as u64, srcDevice, ByteCount, cudaMemcpyDeviceToHost, hStream)
    }

    /// `cuMemcpyDtoDAsync_v2`.
    #[per_thread(cuMemcpyDtoDAsync_v2_ptsz)]
    fn cuMemcpyDtoDAsync_v2(
        dstDevice: d::CUdeviceptr,
        srcDevice: d::CUdeviceptr,
        ByteCount: usize,
        hStream: d::CUstream,
    ) {
        copy_async(dstDevice, srcDevice, ByteCount, cudaMemcpyDeviceToDevice, hStream)
    }

    /// `cuMemcpyPeer`.
    #[per_thread(cuMemcpyPeer_ptds)]
    fn cuMemcpyPeer(
        dstDevice: d::CUdeviceptr,
        dstContext: d::CUcontext,
        srcDevice: d::CUdeviceptr,
        srcContext: d::CUcontext,
        ByteCount: usize,
    ) {
        ready()?;
        let dst = device_of(dstContext)?;
        let src = device_of(srcContext)?;
        via_core(|| mem_ops::memcpy_peer(dstDevice, dst, srcDevice, src, ByteCount, None))
    }

    /// `cuMemcpyPeerAsync`.
    #[per_thread(cuMemcpyPeerAsync_ptsz)]
    fn cuMemcpyPeerAsync(
        dstDevice: d::CUdeviceptr,
        dstContext: d::CUcontext,
        srcDevice: d::CUdeviceptr,
        srcContext: d::CUcontext,
        ByteCount: usize,
        hStream: d::CUstream,
    ) {
        ready()?;
        let dst = device_of(dstContext)?;
        let src = device_of(srcContext)?;
        via_core(|| {
            mem_ops::memcpy_peer(dstDevice, dst, srcDevice, src, ByteCount, Some(hStream as usize))
        })
    }

    /// `cuMemsetD8_v2`.
    #[per_thread(cuMemsetD8_v2_ptds)]
    fn cuMemsetD8_v2(dstDevice: d::CUdeviceptr, uc: ::core::ffi::c_uchar, N: usize) {
        memset(dstDevice, u32::from(uc), 1, N, None)
    }

    /// `cuMemsetD16_v2`.
    #[per_thread(cuMemsetD16_v2_ptds)]
    fn cuMemsetD16_v2(dstDevice: d::CUdeviceptr, us: ::core::ffi::c_ushort, N: usize) {
        memset(dstDevice, u32::from(us), 2, N, None)
    }

    /// `cuMemsetD32_v2`.
    #[per_thread(cuMemsetD32_v2_ptds)]
    fn cuMemsetD32_v2(dstDevice: d::CUdeviceptr, ui: c_uint, N: usize) {
        memset(dstDevice, ui, 4, N, None)
    }

    /// `cuMemsetD8Async`.
    #[per_thread(cuMemsetD8Async_ptsz)]
    fn cuMemsetD8Async(dstDevice: d::CUdeviceptr, uc: ::core::ffi::c_uchar, N: usize, hStream: d::CUstream) {
        memset(dstDevice, u32::from(uc), 1, N, Some(hStream))
    }

    /// `cuMemsetD16Async`.
    #[per_thread(cuMemsetD16Async_ptsz)]
    fn cuMemsetD16Async(dstDevice: d::CUdeviceptr, us: ::core::ffi::c_ushort, N: usize, hStream: d::CUstream) {
        memset(dstDevice, u32::from(us), 2, N, Some(hStream))
    }

    /// `cuMemsetD32Async`.
    #[per_thread(cuMemsetD32Async_ptsz)]
    fn cuMemsetD32Async(dstDevice: d::CUdeviceptr, ui: c_uint, N: usize, hStream: d::CUstream) {
        memset(dstDevice, ui, 4, N, Some(hStream))
    }

    /// `cuMemcpy2D_v2`: a 2D copy between host, device or unified memory (arrays are not
    /// offered by the driver face).
    #[per_thread(cuMemcpy2D_v2_ptds)]
    fn cuMemcpy2D_v2(pCopy: *const d::CUDA_MEMCPY2D) {
        // SAFETY: the API's contract for the descriptor and the ranges it names.
        unsafe { copy_2d(pCopy, None) }
    }

    /// `cuMemcpy2DUnaligned_v2`: the same (qcuda has no alignment restriction to relax).
    #[per_thread(cuMemcpy2DUnaligned_v2_ptds)]
    fn cuMemcpy2DUnaligned_v2(pCopy: *const d::CUDA_MEMCPY2D) {
        // SAFETY: as above.
        unsafe { copy_2d(pCopy, None) }
    }

    /// `cuMemcpy2DAsync_v2`.
    #[per_thread(cuMemcpy2DAsync_v2_ptsz)]
    fn cuMemcpy2DAsync_v2(pCopy: *const d::CUDA_MEMCPY2D, hStream: d::CUstream) {
        // SAFETY: as above.
        unsafe { copy_2d(pCopy, Some(hStream)) }
    }

    /// `cuMemsetD2D8_v2`: rows of bytes at a pitch.
    #[per_thread(cuMemsetD2D8_v2_ptds)]
    fn cuMemsetD2D8_v2(dstDevice: d::CUdeviceptr, dstPitch: usize, uc: ::core::ffi::c_uchar, Width: usize, Height: usize) {
        ready()?;
        via_core(|| {
            array_ops::memset_2d(dstDevice as *mut c_void, dstPitch, c_int::from(uc), Width, Height, None)
        })
    }

    /// `cuMemsetD2D8Async`.
    #[per_thread(cuMemsetD2D8Async_ptsz)]
    fn cuMemsetD2D8Async(
        dstDevice: d::CUdeviceptr,
        dstPitch: usize,
        uc: ::core::ffi::c_uchar,
        Width: usize,
        Height: usize,
        hStream: d::CUstream,
    ) {
        ready()?;
        via_core(|| {
            let order = array_ops::stream_order(hStream.cast())?;
            array_ops::memset_2d(dstDevice as *mut c_void, dstPitch, c_int::from(uc), Width, Height, Some(order))
        })
    }

    /// `cuMemPoolCreate` (`CUmemPoolProps` is `cudaMemPoolProps`, field for field).
    fn cuMemPoolCreate(pool: *mut d::CUmemoryPool, poolProps: *const d::CUmemPoolProps) {
        ready()?;
        if pool.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: the caller's contract; the same layout (checked above).
        let h = via_core(|| unsafe { pool_ops::create(poolProps.cast()) })?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pool, h as d::CUmemoryPool) }
    }

    /// `cuMemPoolDestroy`.
    fn cuMemPoolDestroy(pool: d::CUmemoryPool) {
        ready()?;
        via_core(|| pool_ops::destroy(pool as usize))
    }

    /// `cuMemPoolSetAttribute` (the attribute ids are the runtime's).
    fn cuMemPoolSetAttribute(pool: d::CUmemoryPool, attr: d::CUmemPool_attribute, value: *mut c_void) {
        ready()?;
        // SAFETY: the caller's contract.
        via_core(|| unsafe { pool_ops::set_attribute(pool as usize, attr, value) })
    }

    /// `cuMemPoolGetAttribute`.
    fn cuMemPoolGetAttribute(pool: d::CUmemoryPool, attr: d::CUmemPool_attribute, value: *mut c_void) {
        ready()?;
        // SAFETY: the caller's contract.
        via_core(|| unsafe { pool_ops::get_attribute(pool as usize, attr, value) })
    }

    /// `cuMemPoolTrimTo`.
    fn cuMemPoolTrimTo(pool: d::CUmemoryPool, minBytesToKeep: usize) {
        ready()?;
        via_core(|| pool_ops::trim_to(pool as usize, minBytesToKeep))
    }

    /// `cuMemPoolSetAccess` (`CUmemAccessDesc` is `cudaMemAccessDesc`).
    fn cuMemPoolSetAccess(pool: d::CUmemoryPool, map: *const d::CUmemAccessDesc, count: usize) {
        ready()?;
        // SAFETY: the caller's contract; the same layout (checked above).
        via_core(|| unsafe { pool_ops::set_access(pool as usize, map.cast(), count) })
    }

    /// `cuMemPoolGetAccess`.
    fn cuMemPoolGetAccess(flags: *mut d::CUmemAccess_flags, memPool: d::CUmemoryPool, location: *mut d::CUmemLocation) {
        ready()?;
        if flags.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: the caller's contract; the same layout (checked above).
        let f = via_core(|| unsafe { pool_ops::get_access(memPool as usize, location.cast()) })?;
        // SAFETY: caller's out-parameter.
        unsafe { out(flags, f as d::CUmemAccess_flags) }
    }

    /// `cuPointerGetAttributes`: several attributes of one address. Unlike
    /// `cuPointerGetAttribute` it succeeds for memory CUDA does not know, and for attributes
    /// that say nothing of this memory, writing their default (zero, NULL, `CU_DEVICE_INVALID`).
    fn cuPointerGetAttributes(
        numAttributes: c_uint,
        attributes: *mut d::CUpointer_attribute,
        data: *mut *mut c_void,
        ptr: d::CUdeviceptr,
    ) {
        // What an address is needs no current context (a runtime may ask before it makes one
        // current); the current device, where an attribute depends on it, is the thread's.
        initialized()?;
        if numAttributes > 0 && (attributes.is_null() || data.is_null()) {
            return Err(DriverError::INVALID_VALUE);
        }
        let rt = runtime()?;
        let info = pointer_attrs::of(rt, ptr);
        for i in 0..numAttributes as usize {
            // SAFETY: `numAttributes` entries each (API contract).
            let (a, slot) = unsafe { (*attributes.add(i), *data.add(i)) };
            let v = match info.attribute(a, current_device()) {
                Attr::NotApplicable => pointer_attrs::default_of(a, &info),
                v => v,
            };
            // SAFETY: the slot has room for the attribute's type (API contract).
            unsafe { write_attribute(slot, a, v, &info) }?;
        }
        Ok(())
    }

    /// `cuPointerGetAttribute`: one attribute of an address; `CUDA_ERROR_INVALID_VALUE` where
    /// it says nothing of this memory (pageable memory's type, device memory's host pointer).
    fn cuPointerGetAttribute(data: *mut c_void, attribute: d::CUpointer_attribute, ptr: d::CUdeviceptr) {
        initialized()?;
        let rt = runtime()?;
        let info = pointer_attrs::of(rt, ptr);
        let v = info.attribute(attribute, current_device());
        // SAFETY: caller's contract: `data` has room for the attribute's type.
        unsafe { write_attribute(data, attribute, v, &info) }
    }
}

/// The device of the calling thread's context.
fn current_device() -> u32 {
    crate::core::devices::current()
}

/// Writes one attribute's value `v` into `data`.
///
/// # Safety
/// `data` must have room for the attribute's value type.
unsafe fn write_attribute(
    data: *mut c_void,
    attribute: d::CUpointer_attribute,
    v: Attr,
    info: &pointer_attrs::PointerInfo,
) -> DrvResult<()> {
    if data.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: the caller's buffer has room for the attribute's type (API contract).
    unsafe {
        match v {
            Attr::U32(x) => data.cast::<c_uint>().write_unaligned(x),
            Attr::I32(x) => data.cast::<c_int>().write_unaligned(x),
            Attr::U64(x) => data.cast::<u64>().write_unaligned(x),
            Attr::Context(dev) => data
                .cast::<usize>()
                .write_unaligned(context::primary(dev).handle()),
            Attr::Usize(x) if attribute == d::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE && x == 0 => {
                // Stream-ordered memory of the device's current pool names that pool.
                let pool = match (info.pool_current, info.device) {
                    (true, Some(dev)) => {
                        via_core(|| pool_ops::pool_of(qcuda_proto::Op::DeviceGetMemPool, dev))?
                    }
                    _ => 0,
                };
                data.cast::<usize>().write_unaligned(pool);
            }
            Attr::Usize(x) => data.cast::<usize>().write_unaligned(x),
            Attr::NoTokens => data
                .cast::<d::CUDA_POINTER_ATTRIBUTE_P2P_TOKENS>()
                .write_unaligned(d::CUDA_POINTER_ATTRIBUTE_P2P_TOKENS::default()),
            Attr::NotApplicable | Attr::Unknown => return Err(DriverError::INVALID_VALUE),
            Attr::NotSupported => {
                crate::core::warnings::warn_once!(
                    "cuPointerGetAttribute: attribute {attribute} (P2P tokens for the host kernel's nv-p2p interface) is not supported in a guest"
                );
                return Err(DriverError::NOT_SUPPORTED);
            }
        }
    }
    Ok(())
}

/// One side of a 2D copy: its first byte's address and whether it is host memory (`None` for
/// unified memory, whose kind the runtime face infers).
fn copy_side(
    kind: d::CUmemorytype,
    host: *const c_void,
    device: d::CUdeviceptr,
    x: usize,
    y: usize,
    pitch: usize,
) -> DrvResult<(u64, Option<bool>)> {
    let (base, is_host) = match kind {
        d::CU_MEMORYTYPE_HOST => (host as u64, Some(true)),
        d::CU_MEMORYTYPE_DEVICE => (device, Some(false)),
        d::CU_MEMORYTYPE_UNIFIED => (device, None),
        _ => return Err(DriverError::INVALID_VALUE),
    };
    let offset = y
        .checked_mul(pitch)
        .and_then(|o| o.checked_add(x))
        .ok_or(DriverError::INVALID_VALUE)?;
    Ok((base.wrapping_add(offset as u64), is_host))
}

/// `cuMemcpy2D(Async)`: the runtime face's `cudaMemcpy2D(Async)` on the described ranges.
///
/// # Safety
/// `p` points to a descriptor whose ranges are valid (API contract).
unsafe fn copy_2d(p: *const d::CUDA_MEMCPY2D, stream: Option<d::CUstream>) -> DrvResult<()> {
    use crate::generated::cudaMemcpyHostToHost;
    ready()?;
    if p.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: non-null and readable (API contract).
    let c = unsafe { p.read_unaligned() };
    if c.srcMemoryType == d::CU_MEMORYTYPE_ARRAY || c.dstMemoryType == d::CU_MEMORYTYPE_ARRAY {
        // SAFETY: the descriptor was read above.
        return unsafe { super::arrays::copy_2d_arrays(&c, stream) };
    }
    // A single row may leave its pitch 0.
    let pitch = |p: usize| {
        if c.Height == 1 {
            p.max(c.WidthInBytes)
        } else {
            p
        }
    };
    let (spitch, dpitch) = (pitch(c.srcPitch), pitch(c.dstPitch));
    let (src, src_host) = copy_side(
        c.srcMemoryType,
        c.srcHost,
        c.srcDevice,
        c.srcXInBytes,
        c.srcY,
        spitch,
    )?;
    let (dst, dst_host) = copy_side(
        c.dstMemoryType,
        c.dstHost,
        c.dstDevice,
        c.dstXInBytes,
        c.dstY,
        dpitch,
    )?;
    let kind = match (src_host, dst_host) {
        (Some(true), Some(false)) => cudaMemcpyHostToDevice,
        (Some(false), Some(true)) => cudaMemcpyDeviceToHost,
        (Some(false), Some(false)) => cudaMemcpyDeviceToDevice,
        (Some(true), Some(true)) => cudaMemcpyHostToHost,
        _ => cudaMemcpyDefault,
    };
    let (d, s) = (dst as *mut c_void, src as *const c_void);
    match stream {
        // SAFETY: the ranges the descriptor names (API contract).
        None => via_core(|| unsafe {
            array_ops::memcpy_2d(d, dpitch, s, spitch, c.WidthInBytes, c.Height, kind, None)
        }),
        // SAFETY: as above.
        Some(st) => via_core(|| unsafe {
            let order = array_ops::stream_order(st.cast())?;
            array_ops::memcpy_2d(
                d,
                dpitch,
                s,
                spitch,
                c.WidthInBytes,
                c.Height,
                kind,
                Some(order),
            )
        }),
    }
}

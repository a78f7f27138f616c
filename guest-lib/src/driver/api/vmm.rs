//! Virtual memory management: `cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`,
//! `cuMemSetAccess` and their companions, over the core's VMM (core/memory/vmm.rs). Only pinned
//! allocations located on a device exist, as on the GPU; addresses are the host driver's real
//! device addresses. Shareable handles are POSIX file descriptors: Win32 ones are refused with
//! `CUDA_ERROR_INVALID_VALUE`, as NVIDIA's Linux driver refuses them, and fabric ones with
//! `CUDA_ERROR_NOT_SUPPORTED`, as it answers on a system without fabric support.

use core::ffi::{c_ulonglong, c_void};

use super::{check_device, initialized};
use crate::{
    core::{memory::vmm::AllocProps, runtime::runtime, runtime::vmm},
    driver::status::{DriverError, DrvResult},
    generated::driver_api as d,
};

/// `allocFlags.compressionType` of generic compression.
const COMP_GENERIC: u8 = 1;

/// Access flags as the driver has them: none, read, read-write.
fn access_flags(flags: d::CUmemAccess_flags) -> DrvResult<u32> {
    match flags {
        0 | 1 | 3 => Ok(flags),
        _ => Err(DriverError::INVALID_VALUE),
    }
}

/// A device location's ordinal.
fn device_location(loc: &d::CUmemLocation) -> DrvResult<u32> {
    if loc.type_ != d::CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(DriverError::INVALID_VALUE);
    }
    check_device(loc.id).map_err(|_| DriverError::INVALID_DEVICE)
}

/// The core's properties of a `CUmemAllocationProp`.
///
/// # Safety
/// `prop` is null or points at a `CUmemAllocationProp`.
unsafe fn props_of(prop: *const d::CUmemAllocationProp) -> DrvResult<AllocProps> {
    // SAFETY: the caller's contract.
    let p = unsafe { prop.as_ref() }.ok_or(DriverError::INVALID_VALUE)?;
    if p.type_ != d::CU_MEM_ALLOCATION_TYPE_PINNED {
        // Managed allocations through cuMemCreate are not offered.
        return Err(DriverError::INVALID_VALUE);
    }
    let types = u64::from(p.requestedHandleTypes);
    if types
        & !u64::from(d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | d::CU_MEM_HANDLE_TYPE_FABRIC)
        != 0
    {
        return Err(DriverError::INVALID_VALUE);
    }
    // Fabric handles pass here (a granularity does not depend on them); `cuMemCreate` refuses
    // them as a driver without fabric support does.
    let types = types & !u64::from(d::CU_MEM_HANDLE_TYPE_FABRIC);
    if p.allocFlags.compressionType > COMP_GENERIC {
        return Err(DriverError::INVALID_VALUE);
    }
    Ok(AllocProps {
        device: device_location(&p.location)?,
        handle_types: types,
        compressed: p.allocFlags.compressionType == COMP_GENERIC,
        rdma_capable: p.allocFlags.gpuDirectRDMACapable != 0,
        usage: p.allocFlags.usage,
    })
}

driver_api! {
    /// `cuMemGetAllocationGranularity`.
    fn cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const d::CUmemAllocationProp,
        option: d::CUmemAllocationGranularity_flags,
    ) {
        initialized()?;
        if granularity.is_null() || option > d::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: the API's contract for `prop`.
        let props = unsafe { props_of(prop) }?;
        let g = vmm::granularity(
            runtime()?,
            &props,
            option == d::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )?;
        // SAFETY: checked non-null.
        unsafe { granularity.write_unaligned(g) };
        Ok(())
    }

    /// `cuMemCreate`: a physical allocation on the host's GPU.
    fn cuMemCreate(
        handle: *mut d::CUmemGenericAllocationHandle,
        size: usize,
        prop: *const d::CUmemAllocationProp,
        flags: c_ulonglong,
    ) {
        initialized()?;
        if handle.is_null() || size == 0 || flags != 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: the API's contract for `prop`.
        let props = unsafe { props_of(prop) }?;
        // The GPU behind qcuda offers no fabric handles (HANDLE_TYPE_FABRIC_SUPPORTED reads
        // 0): what NVIDIA's driver answers then, and what frameworks probe for before falling
        // back to file descriptors (PyTorch's expandable segments, NCCL, Mooncake).
        // SAFETY: `props_of` checked that `prop` points at a CUmemAllocationProp.
        if unsafe { (*prop).requestedHandleTypes } & d::CU_MEM_HANDLE_TYPE_FABRIC != 0 {
            return Err(DriverError::NOT_SUPPORTED);
        }
        let h = vmm::create(runtime()?, size, &props)?;
        // SAFETY: checked non-null.
        unsafe { handle.write_unaligned(h) };
        Ok(())
    }

    /// `cuMemRelease`.
    fn cuMemRelease(handle: d::CUmemGenericAllocationHandle) {
        initialized()?;
        Ok(vmm::release(runtime()?, handle)?)
    }

    /// `cuMemAddressReserve`: a range of the host's device address space.
    fn cuMemAddressReserve(
        ptr: *mut d::CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: d::CUdeviceptr,
        flags: c_ulonglong,
    ) {
        initialized()?;
        if ptr.is_null() || size == 0 || flags != 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(DriverError::INVALID_VALUE);
        }
        let va = vmm::address_reserve(runtime()?, size, alignment, addr)?;
        // SAFETY: checked non-null.
        unsafe { ptr.write_unaligned(va) };
        Ok(())
    }

    /// `cuMemAddressFree`.
    fn cuMemAddressFree(ptr: d::CUdeviceptr, size: usize) {
        initialized()?;
        Ok(vmm::address_free(runtime()?, ptr, size)?)
    }

    /// `cuMemMap` (`flags` must be 0).
    fn cuMemMap(
        ptr: d::CUdeviceptr,
        size: usize,
        offset: usize,
        handle: d::CUmemGenericAllocationHandle,
        flags: c_ulonglong,
    ) {
        initialized()?;
        if flags != 0 || size == 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        Ok(vmm::map(runtime()?, ptr, size, offset, handle)?)
    }

    /// `cuMemUnmap`.
    fn cuMemUnmap(ptr: d::CUdeviceptr, size: usize) {
        initialized()?;
        if size == 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        Ok(vmm::unmap(runtime()?, ptr, size)?)
    }

    /// `cuMemSetAccess`: device locations only.
    fn cuMemSetAccess(
        ptr: d::CUdeviceptr,
        size: usize,
        desc: *const d::CUmemAccessDesc,
        count: usize,
    ) {
        initialized()?;
        if desc.is_null() || count == 0 || count > 64 {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: `count` descriptors (API contract).
        let descs = unsafe { core::slice::from_raw_parts(desc, count) };
        let access = descs
            .iter()
            .map(|a| Ok((device_location(&a.location)?, access_flags(a.flags)?)))
            .collect::<DrvResult<Vec<_>>>()?;
        Ok(vmm::set_access(runtime()?, ptr, size, &access)?)
    }

    /// `cuMemGetAccess`: of a device location.
    fn cuMemGetAccess(flags: *mut c_ulonglong, location: *const d::CUmemLocation, ptr: d::CUdeviceptr) {
        initialized()?;
        if flags.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: null or a location (API contract).
        let loc = unsafe { location.as_ref() }.ok_or(DriverError::INVALID_VALUE)?;
        let dev = device_location(loc)?;
        let f = vmm::get_access(runtime()?, ptr, dev)?;
        // SAFETY: checked non-null.
        unsafe { flags.write_unaligned(c_ulonglong::from(f)) };
        Ok(())
    }

    /// `cuMemRetainAllocationHandle`: a new handle of the allocation mapped at `addr`.
    fn cuMemRetainAllocationHandle(handle: *mut d::CUmemGenericAllocationHandle, addr: *mut c_void) {
        initialized()?;
        if handle.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let h = vmm::retain(runtime()?, addr as u64)?;
        // SAFETY: checked non-null.
        unsafe { handle.write_unaligned(h) };
        Ok(())
    }

    /// `cuMemGetAllocationPropertiesFromHandle`.
    fn cuMemGetAllocationPropertiesFromHandle(
        prop: *mut d::CUmemAllocationProp,
        handle: d::CUmemGenericAllocationHandle,
    ) {
        initialized()?;
        if prop.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let p = vmm::properties(runtime()?, handle)?;
        let out = d::CUmemAllocationProp {
            type_: d::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: d::CUmemAllocationHandleType::try_from(p.handle_types)
                .map_err(|_| DriverError::UNKNOWN)?,
            location: d::CUmemLocation {
                type_: d::CU_MEM_LOCATION_TYPE_DEVICE,
                id: i32::try_from(p.device).map_err(|_| DriverError::UNKNOWN)?,
            },
            allocFlags: d::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: if p.compressed { COMP_GENERIC } else { 0 },
                gpuDirectRDMACapable: u8::from(p.rdma_capable),
                usage: p.usage,
                ..Default::default()
            },
            ..Default::default()
        };
        // SAFETY: checked non-null; room for the struct (API contract).
        unsafe { prop.write_unaligned(out) };
        Ok(())
    }
}

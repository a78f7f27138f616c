//! The VMM operations both faces offer (memory/vmm.rs), on the process's runtime: its session,
//! its VMM records and its allocation table.

use crate::core::{cuda_error::CudaResult, memory::vmm::AllocProps, runtime::Runtime};

/// `cuMemGetAllocationGranularity`.
pub fn granularity(rt: &Runtime, props: &AllocProps, recommended: bool) -> CudaResult<usize> {
    rt.vmm.granularity(&rt.session, props, recommended)
}

/// `cuMemCreate`: the new allocation's handle.
pub fn create(rt: &Runtime, size: usize, props: &AllocProps) -> CudaResult<u64> {
    rt.vmm.create(&rt.session, size, props)
}

/// `cuMemRelease`.
pub fn release(rt: &Runtime, handle: u64) -> CudaResult<()> {
    rt.vmm.release(&rt.session, handle)
}

/// `cuMemAddressReserve`.
pub fn address_reserve(rt: &Runtime, size: usize, align: usize, hint: u64) -> CudaResult<u64> {
    rt.vmm.address_reserve(&rt.session, size, align, hint)
}

/// `cuMemAddressFree`.
pub fn address_free(rt: &Runtime, ptr: u64, size: usize) -> CudaResult<()> {
    rt.vmm.address_free(&rt.session, ptr, size)
}

/// `cuMemMap`.
pub fn map(rt: &Runtime, ptr: u64, size: usize, offset: usize, handle: u64) -> CudaResult<()> {
    rt.vmm.map(&rt.session, ptr, size, offset, handle)
}

/// `cuMemUnmap`.
pub fn unmap(rt: &Runtime, ptr: u64, size: usize) -> CudaResult<()> {
    rt.vmm.unmap(&rt.session, &rt.allocations, ptr, size)
}

/// `cuMemSetAccess`: `(device ordinal, flags)` for each device (flags 0, 1 or 3).
pub fn set_access(rt: &Runtime, ptr: u64, size: usize, access: &[(u32, u32)]) -> CudaResult<()> {
    rt.vmm
        .set_access(&rt.session, &rt.allocations, ptr, size, access)
}

/// `cuMemGetAccess` of device `device` at `ptr`: 0, 1 or 3.
pub fn get_access(rt: &Runtime, ptr: u64, device: u32) -> CudaResult<u32> {
    rt.vmm.get_access(&rt.session, ptr, device)
}

/// `cuMemRetainAllocationHandle` of the allocation mapped at `ptr`.
pub fn retain(rt: &Runtime, ptr: u64) -> CudaResult<u64> {
    rt.vmm.retain(&rt.session, ptr)
}

/// `cuMemGetAllocationPropertiesFromHandle`.
pub fn properties(rt: &Runtime, handle: u64) -> CudaResult<AllocProps> {
    rt.vmm.properties(&rt.session, handle)
}

//! The driver's virtual memory management calls (`cuMemCreate`, `cuMemAddressReserve`,
//! `cuMemMap`, `cuMemSetAccess`, shareable handles, ...), as a supertrait of
//! [`DriverApi`](super::DriverApi) so that they stay in one place: [`CudaDriver`] implements
//! them over cudarc's `sys` layer, `NoDriver` refuses them and the unit tests' fake driver
//! (`fake_vmm.rs`) emulates them. The contract of `driver/mod.rs` holds here as well.
//!
//! Two users sit above: the session's VMM ops (what a guest asks for through `cuMemCreate` and
//! friends, checked against the session's own handles and reservations), and any host-side
//! placement of a session's memory at fixed addresses (a reserved range with allocations mapped
//! into it). Physical allocations are [`MemHandle`]s; virtual ranges are plain device addresses,
//! as the driver has them.
//!
//! The allocation properties cross this boundary as [`AllocProps`], with the driver's enums
//! made from numbers only through a `match` here (an unknown value is
//! `CUDA_ERROR_INVALID_VALUE`, never a transmute). Only device-located, pinned allocations
//! exist: what `cuMemCreate` offers a GPU application.

use std::{
    ffi::c_void,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

use cudarc::driver::sys;

use super::{
    error::{check, CuError, CuResult},
    handles::{driver_handles, Event, MemPool, Raw},
    library::{CudaDriver, NoDriver},
};

/// Driver entry points this file calls (`CudaDriver::load` checks them with the others).
pub(crate) const VMM_SYMBOLS: &[&str] = &[
    "cuIpcGetEventHandle",
    "cuIpcOpenEventHandle",
    "cuMemAddressFree",
    "cuMemAddressReserve",
    "cuMemCreate",
    "cuMemExportToShareableHandle",
    "cuMemGetAccess",
    "cuMemGetAddressRange_v2",
    "cuMemGetAllocationGranularity",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemImportFromShareableHandle",
    "cuMemMap",
    "cuMemPoolCreate",
    "cuMemPoolExportPointer",
    "cuMemPoolExportToShareableHandle",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolImportPointer",
    "cuMemRelease",
    "cuMemRetainAllocationHandle",
    "cuMemSetAccess",
    "cuMemUnmap",
];

/// The location of device `dev` (a `CUdevice`).
pub(super) fn mem_location(dev: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev,
    }
}

driver_handles! {
    /// A `CUmemGenericAllocationHandle`: a physical allocation made by `cuMemCreate`, retained
    /// by `cuMemRetainAllocationHandle` or imported from a shareable handle. Each handle the
    /// driver returned is released once ([`VmmDriverApi::mem_release`]).
    MemHandle;
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, as a bit of [`AllocProps::handle_types`].
pub(crate) const HANDLE_TYPE_POSIX_FD: u32 = 1;

/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`, `_READ`, `_READWRITE`.
pub(crate) const ACCESS_NONE: u32 = 0;
/// Read-only access.
pub(crate) const ACCESS_READ: u32 = 1;
/// Read-write access.
pub(crate) const ACCESS_READWRITE: u32 = 3;

/// `CUmemAllocationProp` for a pinned allocation on a device, in plain terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AllocProps {
    /// The `CUdevice` whose memory holds the allocation.
    pub(crate) device: i32,
    /// `CUmemAllocationHandleType` bits the allocation may be exported as (0: none;
    /// [`HANDLE_TYPE_POSIX_FD`]: a file descriptor).
    pub(crate) handle_types: u32,
    /// Generic compression (`CU_MEM_ALLOCATION_COMP_GENERIC`).
    pub(crate) compressed: bool,
    /// `allocFlags.gpuDirectRDMACapable`.
    pub(crate) rdma_capable: bool,
    /// `allocFlags.usage` (`CU_MEM_CREATE_USAGE_*`).
    pub(crate) usage: u16,
}

impl AllocProps {
    /// The driver's struct.
    fn to_sys(self) -> CuResult<sys::CUmemAllocationProp> {
        // Only the POSIX file descriptor type is offered: the others (Win32, fabric) name
        // objects a guest cannot hold.
        if self.handle_types & !HANDLE_TYPE_POSIX_FD != 0 {
            return Err(CuError::INVALID_VALUE);
        }
        Ok(sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType(self.handle_types),
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: u8::from(self.compressed),
                gpuDirectRDMACapable: u8::from(self.rdma_capable),
                usage: self.usage,
                reserved: [0; 4],
            },
        })
    }

    /// From the driver's struct; a host-located or managed allocation is not one of ours.
    fn from_sys(p: &sys::CUmemAllocationProp) -> CuResult<Self> {
        if p.type_ != sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
            || p.location.type_ != sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CuError::NOT_SUPPORTED);
        }
        Ok(Self {
            device: p.location.id,
            handle_types: p.requestedHandleTypes.0,
            compressed: p.allocFlags.compressionType != 0,
            rdma_capable: p.allocFlags.gpuDirectRDMACapable != 0,
            usage: p.allocFlags.usage,
        })
    }
}

/// The access flags a value names, or CUDA_ERROR_INVALID_VALUE.
fn access_flags(flags: u32) -> CuResult<sys::CUmemAccess_flags> {
    use sys::CUmemAccess_flags as F;
    Ok(match flags {
        ACCESS_NONE => F::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        ACCESS_READ => F::CU_MEM_ACCESS_FLAGS_PROT_READ,
        ACCESS_READWRITE => F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// A handle the driver returned, as the driver layer holds it.
fn handle_of(h: sys::CUmemGenericAllocationHandle) -> CuResult<MemHandle> {
    usize::try_from(h)
        .map(MemHandle::from_raw)
        .map_err(|_| CuError::UNKNOWN)
}

fn device_location(dev: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev,
    }
}

/// The virtual memory management calls of the driver. None needs a current context except
/// where it says so; addresses are the driver's own (unified addressing).
pub(crate) trait VmmDriverApi {
    /// cuMemCreate: a physical allocation of `size` bytes (a multiple of the granularity).
    fn mem_create(&self, size: usize, props: &AllocProps) -> CuResult<MemHandle>;
    /// cuMemRelease. The memory itself lives on while a mapping of it remains.
    fn mem_release(&self, handle: MemHandle) -> CuResult<()>;
    /// cuMemAddressReserve: a virtual range of `size` bytes aligned to `align` (0: the
    /// granularity), at `hint` if that is free (0: anywhere). The driver may place it
    /// elsewhere than the hint: callers that need the exact address compare.
    fn mem_address_reserve(&self, size: usize, align: usize, hint: u64) -> CuResult<u64>;
    /// cuMemAddressFree of a whole reservation.
    fn mem_address_free(&self, ptr: u64, size: usize) -> CuResult<()>;
    /// cuMemMap: `size` bytes of `handle` from `offset` at `ptr` (inside a reservation).
    fn mem_map(&self, ptr: u64, size: usize, offset: usize, handle: MemHandle) -> CuResult<()>;
    /// cuMemUnmap.
    fn mem_unmap(&self, ptr: u64, size: usize) -> CuResult<()>;
    /// cuMemSetAccess: `(CUdevice, ACCESS_*)` for each device, over mapped `ptr..ptr + size`.
    fn mem_set_access(&self, ptr: u64, size: usize, access: &[(i32, u32)]) -> CuResult<()>;
    /// cuMemGetAccess of device `dev` at `ptr`: an `ACCESS_*` value.
    fn mem_get_access(&self, ptr: u64, dev: i32) -> CuResult<u32>;
    /// cuMemGetAllocationGranularity (`recommended` or the minimum).
    fn mem_granularity(&self, props: &AllocProps, recommended: bool) -> CuResult<usize>;
    /// cuMemRetainAllocationHandle of the allocation mapped at `ptr`: a new reference, to be
    /// released.
    fn mem_retain_handle(&self, ptr: u64) -> CuResult<MemHandle>;
    /// cuMemGetAllocationPropertiesFromHandle.
    fn mem_handle_props(&self, handle: MemHandle) -> CuResult<AllocProps>;
    /// cuMemExportToShareableHandle as a POSIX file descriptor (the allocation must have been
    /// created with [`HANDLE_TYPE_POSIX_FD`]).
    fn mem_export_fd(&self, handle: MemHandle) -> CuResult<OwnedFd>;
    /// cuMemImportFromShareableHandle of a POSIX file descriptor: a new handle, to be
    /// released. The descriptor stays the caller's.
    fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> CuResult<MemHandle>;
    /// cuMemGetAddressRange: (base, size) of the allocation or mapping holding `ptr`. Needs
    /// a current context.
    fn mem_address_range(&self, ptr: u64) -> CuResult<(u64, usize)>;
    /// cuMemPoolCreate of a pool of pinned memory on `dev` shareable as POSIX file
    /// descriptors (`max_size` 0: the driver's default), to be destroyed with
    /// `DriverApi::mem_pool_destroy`.
    fn mem_pool_create_shareable(&self, dev: i32, max_size: usize) -> CuResult<MemPool>;
    /// cuMemPoolExportToShareableHandle of a POSIX file descriptor.
    fn mem_pool_export_fd(&self, pool: MemPool) -> CuResult<OwnedFd>;
    /// cuMemPoolImportFromShareableHandle of a POSIX file descriptor: a pool to be destroyed
    /// with `DriverApi::mem_pool_destroy`. The descriptor stays the caller's.
    fn mem_pool_import_fd(&self, fd: BorrowedFd<'_>) -> CuResult<MemPool>;
    /// cuMemPoolExportPointer: the driver's opaque 64 bytes naming the pool allocation `ptr`.
    fn mem_pool_export_pointer(&self, ptr: u64) -> CuResult<[u8; 64]>;
    /// cuMemPoolImportPointer: the address in this process of what `data` names in the
    /// imported `pool`, to be freed with cuMemFree(Async).
    fn mem_pool_import_pointer(&self, pool: MemPool, data: &[u8; 64]) -> CuResult<u64>;
    /// cuIpcGetEventHandle of an event created interprocess and without timing, its context
    /// current: the driver's 64 bytes.
    fn ipc_event_handle(&self, event: Event) -> CuResult<[u8; 64]>;
    /// cuIpcOpenEventHandle in the current context: an event to be destroyed with
    /// `DriverApi::event_destroy`.
    fn ipc_open_event(&self, handle: &[u8; 64]) -> CuResult<Event>;
}

// SAFETY (for every unsafe block in this impl): as for `DriverApi for CudaDriver`: each symbol
// was found by `load` (VMM_SYMBOLS), out parameters point at live locals, handles come from
// the session's tables, and descriptors are locals borrowed for the whole call.
impl VmmDriverApi for CudaDriver {
    fn mem_create(&self, size: usize, props: &AllocProps) -> CuResult<MemHandle> {
        let p = props.to_sys()?;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemCreate(&raw mut h, size, &raw const p, 0) })?;
        handle_of(h)
    }

    fn mem_release(&self, handle: MemHandle) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemRelease(handle.raw() as u64) })
    }

    fn mem_address_reserve(&self, size: usize, align: usize, hint: u64) -> CuResult<u64> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemAddressReserve(&raw mut p, size, align, hint, 0) })?;
        Ok(p)
    }

    fn mem_address_free(&self, ptr: u64, size: usize) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemAddressFree(ptr, size) })
    }

    fn mem_map(&self, ptr: u64, size: usize, offset: usize, handle: MemHandle) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemMap(ptr, size, offset, handle.raw() as u64, 0) })
    }

    fn mem_unmap(&self, ptr: u64, size: usize) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemUnmap(ptr, size) })
    }

    fn mem_set_access(&self, ptr: u64, size: usize, access: &[(i32, u32)]) -> CuResult<()> {
        let descs = access
            .iter()
            .map(|&(dev, flags)| {
                Ok(sys::CUmemAccessDesc {
                    location: device_location(dev),
                    flags: access_flags(flags)?,
                })
            })
            .collect::<CuResult<Vec<_>>>()?;
        // SAFETY: see the impl comment; `descs` holds `descs.len()` descriptors.
        check(unsafe { sys::cuMemSetAccess(ptr, size, descs.as_ptr(), descs.len()) })
    }

    fn mem_get_access(&self, ptr: u64, dev: i32) -> CuResult<u32> {
        let loc = device_location(dev);
        let mut flags: std::ffi::c_ulonglong = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemGetAccess(&raw mut flags, &raw const loc, ptr) })?;
        u32::try_from(flags).map_err(|_| CuError::UNKNOWN)
    }

    fn mem_granularity(&self, props: &AllocProps, recommended: bool) -> CuResult<usize> {
        use sys::CUmemAllocationGranularity_flags as G;
        let p = props.to_sys()?;
        let option = if recommended {
            G::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        } else {
            G::CU_MEM_ALLOC_GRANULARITY_MINIMUM
        };
        let mut g = 0usize;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemGetAllocationGranularity(&raw mut g, &raw const p, option) })?;
        Ok(g)
    }

    fn mem_retain_handle(&self, ptr: u64) -> CuResult<MemHandle> {
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        let addr = usize::try_from(ptr).map_err(|_| CuError::INVALID_VALUE)?;
        // SAFETY: see the impl comment; the driver takes the address as a pointer-sized value
        // and only looks it up.
        check(unsafe { sys::cuMemRetainAllocationHandle(&raw mut h, addr as *mut c_void) })?;
        handle_of(h)
    }

    fn mem_handle_props(&self, handle: MemHandle) -> CuResult<AllocProps> {
        let mut p = AllocProps::default().to_sys()?;
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuMemGetAllocationPropertiesFromHandle(&raw mut p, handle.raw() as u64)
        })?;
        AllocProps::from_sys(&p)
    }

    fn mem_export_fd(&self, handle: MemHandle) -> CuResult<OwnedFd> {
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: see the impl comment; for the POSIX type the driver writes an int.
        check(unsafe {
            sys::cuMemExportToShareableHandle(
                (&raw mut fd).cast(),
                handle.raw() as u64,
                sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD),
                0,
            )
        })?;
        if fd < 0 {
            return Err(CuError::UNKNOWN);
        }
        // SAFETY: the driver returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> CuResult<MemHandle> {
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: see the impl comment; for the POSIX type the driver takes the descriptor
        // itself as the pointer-sized value, and does not take ownership of it.
        check(unsafe {
            sys::cuMemImportFromShareableHandle(
                &raw mut h,
                fd.as_raw_fd() as isize as *mut c_void,
                sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD),
            )
        })?;
        handle_of(h)
    }

    fn mem_address_range(&self, ptr: u64) -> CuResult<(u64, usize)> {
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemGetAddressRange_v2(&raw mut base, &raw mut size, ptr) })?;
        Ok((base, size))
    }

    fn mem_pool_create_shareable(&self, dev: i32, max_size: usize) -> CuResult<MemPool> {
        // SAFETY: an all-zero CUmemPoolProps is a valid value (no pointers are followed).
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD);
        props.location = mem_location(dev);
        props.maxSize = max_size;
        let mut p: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: see the impl comment; `props` is fully initialised.
        check(unsafe { sys::cuMemPoolCreate(&raw mut p, &raw const props) })?;
        Ok(MemPool::from_raw(p as Raw))
    }

    fn mem_pool_export_fd(&self, pool: MemPool) -> CuResult<OwnedFd> {
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: see the impl comment; for the POSIX type the driver writes an int.
        check(unsafe {
            sys::cuMemPoolExportToShareableHandle(
                (&raw mut fd).cast(),
                pool.raw() as sys::CUmemoryPool,
                sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD),
                0,
            )
        })?;
        if fd < 0 {
            return Err(CuError::UNKNOWN);
        }
        // SAFETY: the driver returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn mem_pool_import_fd(&self, fd: BorrowedFd<'_>) -> CuResult<MemPool> {
        let mut p: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: see the impl comment; the descriptor is passed as the pointer-sized value.
        check(unsafe {
            sys::cuMemPoolImportFromShareableHandle(
                &raw mut p,
                fd.as_raw_fd() as isize as *mut c_void,
                sys::CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD),
                0,
            )
        })?;
        Ok(MemPool::from_raw(p as Raw))
    }

    fn mem_pool_export_pointer(&self, ptr: u64) -> CuResult<[u8; 64]> {
        // SAFETY: an all-zero export record is a valid value.
        let mut data: sys::CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemPoolExportPointer(&raw mut data, ptr) })?;
        Ok(data.reserved)
    }

    fn ipc_event_handle(&self, event: Event) -> CuResult<[u8; 64]> {
        // SAFETY: an all-zero handle is a valid value.
        let mut h: sys::CUipcEventHandle = unsafe { std::mem::zeroed() };
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuIpcGetEventHandle(&raw mut h, event.raw() as sys::CUevent) })?;
        Ok(h.reserved.map(|b| b.cast_unsigned()))
    }

    fn ipc_open_event(&self, handle: &[u8; 64]) -> CuResult<Event> {
        // SAFETY: an all-zero handle is a valid value.
        let mut h: sys::CUipcEventHandle = unsafe { std::mem::zeroed() };
        h.reserved = handle.map(|b| b.cast_signed());
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: see the impl comment; the handle is passed by value.
        check(unsafe { sys::cuIpcOpenEventHandle(&raw mut e, h) })?;
        Ok(Event::from_raw(e as Raw))
    }

    fn mem_pool_import_pointer(&self, pool: MemPool, data: &[u8; 64]) -> CuResult<u64> {
        // SAFETY: an all-zero export record is a valid value.
        let mut rec: sys::CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
        rec.reserved = *data;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: see the impl comment; the driver reads the local record.
        check(unsafe {
            sys::cuMemPoolImportPointer(&raw mut ptr, pool.raw() as sys::CUmemoryPool, &raw mut rec)
        })?;
        Ok(ptr)
    }
}

impl VmmDriverApi for NoDriver {
    fn mem_create(&self, _: usize, _: &AllocProps) -> CuResult<MemHandle> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_release(&self, _: MemHandle) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_address_reserve(&self, _: usize, _: usize, _: u64) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_address_free(&self, _: u64, _: usize) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_map(&self, _: u64, _: usize, _: usize, _: MemHandle) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_unmap(&self, _: u64, _: usize) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_set_access(&self, _: u64, _: usize, _: &[(i32, u32)]) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_get_access(&self, _: u64, _: i32) -> CuResult<u32> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_granularity(&self, _: &AllocProps, _: bool) -> CuResult<usize> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_retain_handle(&self, _: u64) -> CuResult<MemHandle> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_handle_props(&self, _: MemHandle) -> CuResult<AllocProps> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_export_fd(&self, _: MemHandle) -> CuResult<OwnedFd> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_import_fd(&self, _: BorrowedFd<'_>) -> CuResult<MemHandle> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_create_shareable(&self, _: i32, _: usize) -> CuResult<MemPool> {
        Err(CuError::NO_DEVICE)
    }
    fn ipc_event_handle(&self, _: Event) -> CuResult<[u8; 64]> {
        Err(CuError::NO_DEVICE)
    }
    fn ipc_open_event(&self, _: &[u8; 64]) -> CuResult<Event> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_export_fd(&self, _: MemPool) -> CuResult<OwnedFd> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_import_fd(&self, _: BorrowedFd<'_>) -> CuResult<MemPool> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_export_pointer(&self, _: u64) -> CuResult<[u8; 64]> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_pool_import_pointer(&self, _: MemPool, _: &[u8; 64]) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn mem_address_range(&self, _: u64) -> CuResult<(u64, usize)> {
        Err(CuError::NO_DEVICE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `sys::cu*` call in this file is in VMM_SYMBOLS and the other way round.
    #[test]
    fn vmm_symbols_match_the_calls() {
        let called = super::super::driver_calls(include_str!("vmm.rs"));
        let mut required = VMM_SYMBOLS.to_vec();
        required.sort_unstable();
        assert_eq!(called, required);
    }

    #[test]
    fn props_refuse_handle_types_a_guest_cannot_hold() {
        let p = AllocProps {
            handle_types: 2, // Win32
            ..AllocProps::default()
        };
        assert_eq!(p.to_sys().unwrap_err(), CuError::INVALID_VALUE);
        let p = AllocProps {
            device: 3,
            handle_types: HANDLE_TYPE_POSIX_FD,
            compressed: true,
            rdma_capable: false,
            usage: 0,
        };
        assert_eq!(AllocProps::from_sys(&p.to_sys().unwrap()), Ok(p));
    }

    #[test]
    fn access_flags_are_the_three_the_driver_has() {
        access_flags(ACCESS_NONE).unwrap();
        access_flags(ACCESS_READ).unwrap();
        access_flags(ACCESS_READWRITE).unwrap();
        assert_eq!(access_flags(2).unwrap_err(), CuError::INVALID_VALUE);
    }
}

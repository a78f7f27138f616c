//! Virtual memory management through the driver face against the test double: granularity,
//! create, reserve, map, access, copies into the mapping, pointer attributes and address
//! ranges that know it, retain, properties, and the refusals of what NVIDIA's driver refuses.

use super::*;
use crate::{
    driver::{
        api::{context::*, init::*, memory::*, vmm::*},
        status::DriverError,
    },
    generated::driver_api as d,
};

#[track_caller]
fn cu(r: d::CUresult) {
    assert_eq!(DriverError::check(r), Ok(()));
}

#[track_caller]
fn cu_err(r: d::CUresult, e: DriverError) {
    assert_eq!(DriverError::check(r), Err(e));
}

fn props(handle_types: u32) -> d::CUmemAllocationProp {
    d::CUmemAllocationProp {
        type_: d::CU_MEM_ALLOCATION_TYPE_PINNED,
        location: d::CUmemLocation {
            type_: d::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        requestedHandleTypes: handle_types,
        ..Default::default()
    }
}

#[test]
fn create_reserve_map_access_and_copy() {
    let fake = setup();
    // SAFETY: valid out-parameters and buffers throughout.
    unsafe {
        cu(cuInit(0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut ctx, 0));
        cu(cuCtxSetCurrent(ctx));
        let p = props(d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        let mut g = 0usize;
        cu(cuMemGetAllocationGranularity(
            &raw mut g,
            &raw const p,
            d::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        ));
        assert_eq!(g as u64, crate::core::fake_device::VMM_GRANULARITY);

        let mut h: d::CUmemGenericAllocationHandle = 0;
        cu(cuMemCreate(&raw mut h, 2 * g, &raw const p, 0));
        let mut va: d::CUdeviceptr = 0;
        cu(cuMemAddressReserve(&raw mut va, 4 * g, 0, 0, 0));
        cu(cuMemMap(va, 2 * g, 0, h, 0));
        let desc = d::CUmemAccessDesc {
            location: p.location,
            flags: d::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        cu(cuMemSetAccess(va, 2 * g, &raw const desc, 1));
        let mut flags = 0u64;
        cu(cuMemGetAccess(
            &raw mut flags,
            &raw const p.location,
            va + 8,
        ));
        assert_eq!(flags, 3);

        // The mapping is device memory: copies reach it, pointer queries know it.
        let data: Vec<u8> = (0..64).collect();
        cu(cuMemcpyHtoD_v2(va + 128, data.as_ptr().cast(), 64));
        let mut back = [0u8; 64];
        cu(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), va + 128, 64));
        assert_eq!(back.to_vec(), data);
        let (mut base, mut size) = (0u64, 0usize);
        cu(cuMemGetAddressRange_v2(
            &raw mut base,
            &raw mut size,
            va + 100,
        ));
        assert_eq!((base, size), (va, 2 * g));
        let mut mem_type: u32 = 0;
        cu(cuPointerGetAttribute(
            (&raw mut mem_type).cast(),
            d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            va + 1,
        ));
        assert_eq!(mem_type, d::CU_MEMORYTYPE_DEVICE);
        // Legacy IPC exports cuMemAlloc memory, never a VMM mapping.
        let legacy = |ptr: d::CUdeviceptr| {
            let mut v: u32 = 7;
            cu(cuPointerGetAttribute(
                (&raw mut v).cast(),
                d::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                ptr,
            ));
            v
        };
        assert_eq!(legacy(va + 1), 0);
        let mut plain: d::CUdeviceptr = 0;
        cu(cuMemAlloc_v2(&raw mut plain, 256));
        assert_eq!(legacy(plain + 8), 1);
        cu(cuMemFree_v2(plain));

        let mut retained: d::CUmemGenericAllocationHandle = 0;
        cu(cuMemRetainAllocationHandle(
            &raw mut retained,
            (va + 64) as *mut c_void,
        ));
        // Retained from the mapping: the same handle, one reference more.
        assert_eq!(retained, h);
        let mut got = d::CUmemAllocationProp::default();
        cu(cuMemGetAllocationPropertiesFromHandle(
            &raw mut got,
            retained,
        ));
        assert_eq!(got.location.id, 0);
        assert_eq!(got.type_, d::CU_MEM_ALLOCATION_TYPE_PINNED);
        assert_eq!(
            got.requestedHandleTypes,
            d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        );
        cu(cuMemRelease(retained));

        // NCCL's way to free: retained and released, range, unmap, the original released.
        let (mut base2, mut size2) = (0u64, 0usize);
        cu(cuMemGetAddressRange_v2(&raw mut base2, &raw mut size2, va));
        assert_eq!((base2, size2), (va, 2 * g));
        cu(cuMemUnmap(va, 2 * g));
        cu_err(
            cuMemGetAddressRange_v2(&raw mut base, &raw mut size, va + 100),
            DriverError::NOT_FOUND,
        );
        cu(cuMemAddressFree(va, 4 * g));
        cu(cuMemRelease(h));
        assert!(fake.state().vmm_handles.is_empty());
        cu_err(cuMemRelease(h), DriverError::INVALID_VALUE);
        assert!(fake.state().vmm_reserved.is_empty());
    }
}

#[test]
fn what_the_driver_refuses_is_refused() {
    let _fake = setup();
    // SAFETY: valid out-parameters; the refused calls must not touch their outputs.
    unsafe {
        cu(cuInit(0));
        let mut h: d::CUmemGenericAllocationHandle = 0;
        let g = crate::core::fake_device::VMM_GRANULARITY as usize;
        // Win32 handles, a managed type, a host location, flags, a missing prop.
        let mut bad = props(2);
        cu_err(
            cuMemCreate(&raw mut h, g, &raw const bad, 0),
            DriverError::INVALID_VALUE,
        );
        bad = props(0);
        bad.type_ = 2;
        cu_err(
            cuMemCreate(&raw mut h, g, &raw const bad, 0),
            DriverError::INVALID_VALUE,
        );
        bad = props(0);
        bad.location.type_ = 2;
        cu_err(
            cuMemCreate(&raw mut h, g, &raw const bad, 0),
            DriverError::INVALID_VALUE,
        );
        bad = props(0);
        bad.location.id = 5;
        cu_err(
            cuMemCreate(&raw mut h, g, &raw const bad, 0),
            DriverError::INVALID_DEVICE,
        );
        let p = props(0);
        cu_err(
            cuMemCreate(&raw mut h, g, &raw const p, 1),
            DriverError::INVALID_VALUE,
        );
        cu_err(
            cuMemCreate(&raw mut h, g, std::ptr::null(), 0),
            DriverError::INVALID_VALUE,
        );
        // A handle the process never had, access with a bad flag.
        cu_err(cuMemRelease(12345), DriverError::INVALID_VALUE);
        let mut va: d::CUdeviceptr = 0;
        cu_err(
            cuMemAddressReserve(&raw mut va, g, 3, 0, 0),
            DriverError::INVALID_VALUE,
        );
        cu(cuMemCreate(&raw mut h, g, &raw const p, 0));
        cu(cuMemAddressReserve(&raw mut va, g, 0, 0, 0));
        cu_err(cuMemMap(va, g, 0, 999, 0), DriverError::INVALID_VALUE);
        cu(cuMemMap(va, g, 0, h, 0));
        let desc = d::CUmemAccessDesc {
            location: p.location,
            flags: 2,
        };
        cu_err(
            cuMemSetAccess(va, g, &raw const desc, 1),
            DriverError::INVALID_VALUE,
        );
        cu_err(
            cuMemSetAccess(va, g, &raw const desc, 0),
            DriverError::INVALID_VALUE,
        );
    }
}

/// Fabric handles are answered as NVIDIA's driver answers on a system without fabric support
/// (`CUDA_ERROR_NOT_SUPPORTED`), which is what PyTorch's expandable segments, NCCL and others
/// probe for before falling back to file descriptors: `cuMemCreate` with them alone or beside
/// POSIX descriptors, exporting or importing one; the granularity does not depend on them, and
/// the probe leaves nothing behind on the host.
#[test]
fn fabric_handles_are_not_supported() {
    use crate::driver::api::ipc::{cuMemExportToShareableHandle, cuMemImportFromShareableHandle};
    let fake = setup();
    let fabric = d::CU_MEM_HANDLE_TYPE_FABRIC;
    let posix = d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: valid out-parameters; the refused calls must not touch their outputs.
    unsafe {
        cu(cuInit(0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut ctx, 0));
        cu(cuCtxSetCurrent(ctx));
        let mut g = 0usize;
        let p = props(fabric);
        cu(cuMemGetAllocationGranularity(
            &raw mut g,
            &raw const p,
            d::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        ));
        assert_eq!(g as u64, crate::core::fake_device::VMM_GRANULARITY);
        let before = fake.ops().len();
        let mut h: d::CUmemGenericAllocationHandle = 7;
        for types in [fabric, fabric | posix] {
            let p = props(types);
            cu_err(
                cuMemCreate(&raw mut h, g, &raw const p, 0),
                DriverError::NOT_SUPPORTED,
            );
            assert_eq!(h, 7);
        }
        assert_eq!(fake.ops().len(), before, "the probe reaches no host");
        // The fallback works: a POSIX-shareable allocation, which has no fabric handle.
        let p = props(posix);
        cu(cuMemCreate(&raw mut h, g, &raw const p, 0));
        let mut out = [0u8; 64];
        cu_err(
            cuMemExportToShareableHandle(out.as_mut_ptr().cast(), h, fabric, 0),
            DriverError::NOT_SUPPORTED,
        );
        // Win32 stays invalid on Linux.
        cu_err(
            cuMemExportToShareableHandle(out.as_mut_ptr().cast(), h, 2, 0),
            DriverError::INVALID_VALUE,
        );
        let mut imported: d::CUmemGenericAllocationHandle = 0;
        cu_err(
            cuMemImportFromShareableHandle(&raw mut imported, out.as_mut_ptr().cast(), fabric),
            DriverError::NOT_SUPPORTED,
        );
        cu(cuMemRelease(h));
    }
}

/// The device announces VMM and POSIX-fd shareable handles with the GPU's values, and pools'
/// handle types as far as qcuda offers them (POSIX descriptors), and IPC events; host-NUMA VMM
/// and multicast objects, which qcuda does not offer, read 0 whatever the GPU says.
#[test]
fn the_device_announces_what_is_offered() {
    use crate::driver::api::device::cuDeviceGetAttribute;
    let fake = setup();
    for attr in [
        102,
        103,
        107,
        141,
        d::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED as i32,
        d::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED as i32,
    ] {
        fake.state().attributes.insert(attr, 1);
    }
    // A GPU whose pools share as POSIX descriptors and fabric handles: only the first is offered.
    fake.state().attributes.insert(
        d::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES as i32,
        9,
    );
    // SAFETY: valid out-parameters.
    unsafe {
        cu(cuInit(0));
        for (attr, want) in [
            (
                d::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                1,
            ),
            (d::CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 1),
            (
                d::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                1,
            ),
            (d::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 1),
            (d::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 1),
            (d::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0),
            (
                d::CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                0,
            ),
        ] {
            let mut v = -1;
            cu(cuDeviceGetAttribute(&raw mut v, attr, 0));
            assert_eq!(v, want, "attribute {attr}");
        }
    }
}

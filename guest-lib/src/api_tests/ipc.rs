//! IPC through both faces against the test double: a legacy handle of an allocation opens as
//! device memory that pointer queries and copies know, closes once; forged handles and
//! descriptors are refused with CUDA's errors; a VMM allocation exports to a POSIX descriptor
//! (a sealed memory file) that imports as a handle of the process.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::*;
use crate::{
    driver::{
        api::{context::*, init::*, ipc::*, vmm::*},
        status::DriverError,
    },
    generated::{
        cudaErrorInvalidValue, cudaMemcpyDefault, driver_api as d, runtime_api::cudaIpcMemHandle_t,
    },
    runtime::{ipc::*, memory::*},
};

#[test]
fn legacy_handles_open_as_device_memory_and_close_once() {
    let _fake = setup();
    // SAFETY: valid out-parameters and buffers throughout.
    unsafe {
        let mut p: *mut c_void = ptr::null_mut();
        assert_eq!(cudaMalloc(&raw mut p, 4096), cudaSuccess);
        let mut h = cudaIpcMemHandle_t { reserved: [0; 64] };
        assert_eq!(cudaIpcGetMemHandle(&raw mut h, p.byte_add(16)), cudaSuccess);
        let mut q: *mut c_void = ptr::null_mut();
        assert_eq!(cudaIpcOpenMemHandle(&raw mut q, h, 1), cudaSuccess);
        assert!(!q.is_null());
        // Device memory to the copy paths (cudaMemcpyDefault asks the allocation table).
        let data = [7u8; 32];
        assert_eq!(
            cudaMemcpy(q, data.as_ptr().cast(), 32, cudaMemcpyDefault),
            cudaSuccess
        );
        assert_eq!(cudaIpcCloseMemHandle(q), cudaSuccess);
        assert_eq!(cudaIpcCloseMemHandle(q), cudaErrorInvalidValue);
        // Unknown flags, a forged handle, a handle of another kind, a pointer that is no
        // allocation, null outputs.
        assert_eq!(
            cudaIpcOpenMemHandle(&raw mut q, h, 2),
            cudaErrorInvalidValue
        );
        let mut forged = h;
        forged.reserved[20] ^= 1;
        assert_eq!(
            cudaIpcOpenMemHandle(&raw mut q, forged, 0),
            cudaErrorInvalidValue
        );
        let zero = cudaIpcMemHandle_t { reserved: [0; 64] };
        assert_eq!(
            cudaIpcOpenMemHandle(&raw mut q, zero, 0),
            cudaErrorInvalidValue
        );
        assert_eq!(
            cudaIpcGetMemHandle(&raw mut h, 0x1234 as *mut c_void),
            cudaErrorInvalidValue
        );
        assert_eq!(
            cudaIpcGetMemHandle(ptr::null_mut(), p),
            cudaErrorInvalidValue
        );
        assert_eq!(
            cudaIpcOpenMemHandle(ptr::null_mut(), h, 0),
            cudaErrorInvalidValue
        );
        assert_eq!(cudaFree(p), cudaSuccess);
    }
}

#[test]
fn vmm_handles_export_to_a_descriptor_and_import_from_it() {
    let _fake = setup();
    // SAFETY: valid out-parameters throughout; descriptors owned by the test.
    unsafe {
        assert_eq!(DriverError::check(cuInit(0)), Ok(()));
        let mut ctx: d::CUcontext = ptr::null_mut();
        assert_eq!(
            DriverError::check(cuDevicePrimaryCtxRetain(&raw mut ctx, 0)),
            Ok(())
        );
        assert_eq!(DriverError::check(cuCtxSetCurrent(ctx)), Ok(()));
        let prop = |types| d::CUmemAllocationProp {
            type_: d::CU_MEM_ALLOCATION_TYPE_PINNED,
            location: d::CUmemLocation {
                type_: d::CU_MEM_LOCATION_TYPE_DEVICE,
                id: 0,
            },
            requestedHandleTypes: types,
            ..Default::default()
        };
        let g = crate::core::fake_device::VMM_GRANULARITY as usize;
        let p = prop(d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        let mut h: d::CUmemGenericAllocationHandle = 0;
        assert_eq!(
            DriverError::check(cuMemCreate(&raw mut h, g, &raw const p, 0)),
            Ok(())
        );
        let mut fd: i32 = -1;
        let posix = d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        assert_eq!(
            DriverError::check(cuMemExportToShareableHandle(
                (&raw mut fd).cast(),
                h,
                posix,
                0
            )),
            Ok(())
        );
        assert!(fd >= 0);
        let fd = OwnedFd::from_raw_fd(fd);
        let mut imported: d::CUmemGenericAllocationHandle = 0;
        assert_eq!(
            DriverError::check(cuMemImportFromShareableHandle(
                &raw mut imported,
                fd.as_raw_fd().cast_unsigned() as usize as *mut c_void,
                posix
            )),
            Ok(())
        );
        assert_eq!(DriverError::check(cuMemRelease(imported)), Ok(()));
        // A Win32 handle type (fabric ones: vmm.rs); a descriptor that is no handle; flags.
        let mut other: i32 = -1;
        assert_eq!(
            DriverError::check(cuMemExportToShareableHandle(
                (&raw mut other).cast(),
                h,
                2,
                0
            )),
            Err(DriverError::INVALID_VALUE)
        );
        assert_eq!(
            DriverError::check(cuMemExportToShareableHandle(
                (&raw mut other).cast(),
                h,
                posix,
                1
            )),
            Err(DriverError::INVALID_VALUE)
        );
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(
            DriverError::check(cuMemImportFromShareableHandle(
                &raw mut imported,
                null.as_raw_fd().cast_unsigned() as usize as *mut c_void,
                posix
            )),
            Err(DriverError::INVALID_VALUE)
        );
        // Not made shareable: the host refuses to export it.
        let plain = prop(0);
        let mut h2: d::CUmemGenericAllocationHandle = 0;
        assert_eq!(
            DriverError::check(cuMemCreate(&raw mut h2, g, &raw const plain, 0)),
            Ok(())
        );
        assert_eq!(
            DriverError::check(cuMemExportToShareableHandle(
                (&raw mut other).cast(),
                h2,
                posix,
                0
            )),
            Err(DriverError::INVALID_VALUE)
        );
        assert_eq!(DriverError::check(cuMemRelease(h2)), Ok(()));
        assert_eq!(DriverError::check(cuMemRelease(h)), Ok(()));
    }
}

#[test]
fn shareable_pools_export_to_a_descriptor_and_their_allocations_follow() {
    use crate::{
        generated::{
            cudaErrorNotSupported, cudaMemAllocationTypePinned, cudaMemHandleTypeFabric,
            cudaMemHandleTypePosixFileDescriptor, cudaMemLocation, cudaMemLocationTypeDevice,
            cudaMemPoolProps, cudaMemPool_t, runtime_api::cudaMemPoolPtrExportData,
        },
        runtime::pools::*,
    };
    let _fake = setup();
    // SAFETY: valid out-parameters and buffers throughout; descriptors owned by the test.
    unsafe {
        let mut props = cudaMemPoolProps {
            allocType: cudaMemAllocationTypePinned,
            location: cudaMemLocation {
                type_: cudaMemLocationTypeDevice,
                id: 0,
            },
            ..Default::default()
        };
        let mut plain: cudaMemPool_t = ptr::null_mut();
        assert_eq!(
            cudaMemPoolCreate(&raw mut plain, &raw const props),
            cudaSuccess
        );
        props.handleTypes = cudaMemHandleTypeFabric;
        let mut pool: cudaMemPool_t = ptr::null_mut();
        assert_eq!(
            cudaMemPoolCreate(&raw mut pool, &raw const props),
            cudaErrorNotSupported
        );
        props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
        assert_eq!(
            cudaMemPoolCreate(&raw mut pool, &raw const props),
            cudaSuccess
        );
        let posix = cudaMemHandleTypePosixFileDescriptor;
        let mut fd: i32 = -1;
        // Not shareable: refused by the host.
        assert_eq!(
            cudaMemPoolExportToShareableHandle((&raw mut fd).cast(), plain, posix, 0),
            cudaErrorInvalidValue
        );
        assert_eq!(
            cudaMemPoolExportToShareableHandle((&raw mut fd).cast(), pool, posix, 1),
            cudaErrorInvalidValue
        );
        assert_eq!(
            cudaMemPoolExportToShareableHandle((&raw mut fd).cast(), pool, posix, 0),
            cudaSuccess
        );
        let fd = OwnedFd::from_raw_fd(fd);
        let mut imported: cudaMemPool_t = ptr::null_mut();
        assert_eq!(
            cudaMemPoolImportFromShareableHandle(
                &raw mut imported,
                fd.as_raw_fd().cast_unsigned() as usize as *mut c_void,
                posix,
                0
            ),
            cudaSuccess
        );
        assert!(!imported.is_null());
        assert_ne!(imported, pool);

        let mut p: *mut c_void = ptr::null_mut();
        assert_eq!(
            cudaMallocFromPoolAsync(&raw mut p, 512, pool, ptr::null_mut()),
            cudaSuccess
        );
        let mut rec = cudaMemPoolPtrExportData { reserved: [0; 64] };
        assert_eq!(cudaMemPoolExportPointer(&raw mut rec, p), cudaSuccess);
        // Not the start of an allocation.
        assert_eq!(
            cudaMemPoolExportPointer(&raw mut rec, p.byte_add(8)),
            cudaErrorInvalidValue
        );
        let mut q: *mut c_void = ptr::null_mut();
        // Only an imported pool takes pointers; a forged record is refused.
        assert_eq!(
            cudaMemPoolImportPointer(&raw mut q, pool, &raw mut rec),
            cudaErrorInvalidValue
        );
        let mut forged = rec;
        forged.reserved[16] ^= 1;
        assert_eq!(
            cudaMemPoolImportPointer(&raw mut q, imported, &raw mut forged),
            cudaErrorInvalidValue
        );
        assert_eq!(
            cudaMemPoolImportPointer(&raw mut q, imported, &raw mut rec),
            cudaSuccess
        );
        // The imported allocation is device memory of this process: copies know it.
        let data = [3u8; 16];
        assert_eq!(
            cudaMemcpy(q, data.as_ptr().cast(), 16, cudaMemcpyDefault),
            cudaSuccess
        );
        // A descriptor that is no pool handle.
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(
            cudaMemPoolImportFromShareableHandle(
                &raw mut imported,
                null.as_raw_fd().cast_unsigned() as usize as *mut c_void,
                posix,
                0
            ),
            cudaErrorInvalidValue
        );
    }
}

#[test]
fn interprocess_events_export_and_open_and_their_records_are_not_held_back() {
    use crate::{
        generated::{
            cudaErrorInvalidResourceHandle, cudaEventDisableTiming, cudaEventInterprocess,
            cudaEvent_t, runtime_api::cudaIpcEventHandle_t,
        },
        runtime::events::*,
    };
    let fake = setup();
    // SAFETY: valid out-parameters throughout.
    unsafe {
        let mut timed: cudaEvent_t = ptr::null_mut();
        assert_eq!(
            cudaEventCreateWithFlags(&raw mut timed, cudaEventInterprocess),
            cudaSuccess
        );
        let mut ev: cudaEvent_t = ptr::null_mut();
        assert_eq!(
            cudaEventCreateWithFlags(&raw mut ev, cudaEventInterprocess | cudaEventDisableTiming),
            cudaSuccess
        );
        let mut h = cudaIpcEventHandle_t { reserved: [0; 64] };
        // With timing: refused, as CUDA refuses it.
        assert_eq!(
            cudaIpcGetEventHandle(&raw mut h, timed),
            cudaErrorInvalidResourceHandle
        );
        assert_eq!(cudaIpcGetEventHandle(&raw mut h, ev), cudaSuccess);
        let mut opened: cudaEvent_t = ptr::null_mut();
        assert_eq!(cudaIpcOpenEventHandle(&raw mut opened, h), cudaSuccess);
        assert!(!opened.is_null());
        assert_eq!(cudaEventSynchronize(opened), cudaSuccess);
        let mut forged = h;
        forged.reserved[0] ^= 1;
        assert_eq!(
            cudaIpcOpenEventHandle(&raw mut opened, forged),
            cudaErrorInvalidValue
        );
        // A record of an interprocess event reaches the host before the call returns (another
        // process may wait for it at once), not in a later batch.
        let sent = fake.state().log.len();
        assert_eq!(cudaEventRecord(ev, ptr::null_mut()), cudaSuccess);
        let log = fake.state().log.clone();
        assert!(
            log[sent..]
                .iter()
                .any(|l| l.op == qcuda_proto::Op::EventRecord),
            "the record of an interprocess event was held back"
        );
        assert_eq!(cudaEventDestroy(opened), cudaSuccess);
    }
}

//! Memory pools and stream-ordered allocation against the fake device.

use std::ptr;

use qcuda_proto::Op;

use super::*;
use crate::{
    generated::{
        self as cu, cudaMemAccessDesc, cudaMemLocation, cudaMemPoolProps, cudaMemPool_t,
        cudaPointerAttributes, cudaStream_t,
    },
    runtime::{errors::cudaGetLastError, memory::*, pools::*, streams::*},
};

fn device_location(id: i32) -> cudaMemLocation {
    cudaMemLocation {
        type_: cu::cudaMemLocationTypeDevice,
        id,
    }
}

#[test]
fn stream_ordered_allocations_are_device_memory_of_the_stream_s_device() {
    let fake = setup();
    let mut s: cudaStream_t = ptr::null_mut();
    let mut p: *mut core::ffi::c_void = ptr::null_mut();
    // SAFETY: valid out-pointers throughout.
    unsafe {
        ok(cudaStreamCreate(&raw mut s));
        let host_stream = *fake.state().streams.last().unwrap();
        ok(cudaMallocAsync(&raw mut p, 4096, s));
        assert!(!p.is_null());
        let sent = fake
            .state()
            .log
            .iter()
            .rev()
            .find(|l| l.op == Op::MallocAsync)
            .cloned();
        assert!(sent.is_some());
        // Known to the guest as device memory: pointer attributes and cudaMemcpyDefault work.
        let mut attr = cudaPointerAttributes::default();
        ok(cudaPointerGetAttributes(&raw mut attr, p));
        assert_eq!(attr.type_, cu::cudaMemoryTypeDevice);
        let data = [7u8; 64];
        ok(cudaMemcpy(
            p,
            data.as_ptr().cast(),
            64,
            cu::cudaMemcpyDefault,
        ));
        let mut back = [0u8; 64];
        ok(cudaMemcpy(
            back.as_mut_ptr().cast(),
            p,
            64,
            cu::cudaMemcpyDefault,
        ));
        assert_eq!(back, data);
        ok(cudaFreeAsync(p, s));
        assert!(fake.state().memory.is_empty());
        let _ = host_stream;
        // Errors: null out-pointer, unknown stream, freeing twice.
        assert_err(
            cudaMallocAsync(ptr::null_mut(), 8, s),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaMallocAsync(&raw mut p, 8, 0x1234 as cudaStream_t),
            cu::cudaErrorInvalidResourceHandle,
        );
        assert_err(cudaFreeAsync(p, s), cu::cudaErrorInvalidValue);
        cudaGetLastError();
        // The per-thread spellings take the same path.
        ok(cudaMallocAsync_ptsz(&raw mut p, 16, ptr::null_mut()));
        ok(cudaFreeAsync_ptsz(p, ptr::null_mut()));
    }
}

#[test]
fn pools_get_stable_handles_and_device_checks() {
    let fake = setup();
    let (mut a, mut b, mut cur): (cudaMemPool_t, cudaMemPool_t, cudaMemPool_t) =
        (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid pointers throughout.
    unsafe {
        ok(cudaDeviceGetDefaultMemPool(&raw mut a, 0));
        ok(cudaDeviceGetDefaultMemPool(&raw mut b, 0));
        assert_eq!(a, b, "one handle for the default pool");
        ok(cudaDeviceGetMemPool(&raw mut cur, 0));
        assert_eq!(cur, a);
        assert_err(
            cudaDeviceGetDefaultMemPool(&raw mut a, 5),
            cu::cudaErrorInvalidDevice,
        );
        let mut loc = device_location(0);
        let mut c: cudaMemPool_t = ptr::null_mut();
        ok(cudaMemGetDefaultMemPool(
            &raw mut c,
            &raw mut loc,
            cu::cudaMemAllocationTypePinned,
        ));
        assert_eq!(c, b);
        let mut host = cudaMemLocation {
            type_: cu::cudaMemLocationTypeHost,
            id: 0,
        };
        assert_err(
            cudaMemGetDefaultMemPool(&raw mut c, &raw mut host, cu::cudaMemAllocationTypePinned),
            cu::cudaErrorNotSupported,
        );

        // A created pool.
        let mut props = cudaMemPoolProps {
            allocType: cu::cudaMemAllocationTypePinned,
            location: device_location(0),
            maxSize: 1 << 20,
            ..Default::default()
        };
        let mut pool: cudaMemPool_t = ptr::null_mut();
        ok(cudaMemPoolCreate(&raw mut pool, &raw const props));
        assert!(!pool.is_null() && pool != b);
        let sent = fake
            .state()
            .log
            .iter()
            .rev()
            .find(|l| l.op == Op::MemPoolCreate)
            .cloned();
        assert!(sent.is_some());
        ok(cudaDeviceSetMemPool(0, pool));
        ok(cudaDeviceGetMemPool(&raw mut cur, 0));
        assert_eq!(cur, pool);
        let mut p: *mut core::ffi::c_void = ptr::null_mut();
        ok(cudaMallocFromPoolAsync(
            &raw mut p,
            128,
            pool,
            ptr::null_mut(),
        ));
        ok(cudaFreeAsync(p, ptr::null_mut()));
        assert_err(
            cudaMallocFromPoolAsync(&raw mut p, 128, ptr::null_mut(), ptr::null_mut()),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaMallocFromPoolAsync(&raw mut p, 128, 0x99 as cudaMemPool_t, ptr::null_mut()),
            cu::cudaErrorInvalidValue,
        );

        // Attributes: ints for the reuse flags, 64-bit values for the others.
        let mut threshold: u64 = u64::MAX;
        ok(cudaMemPoolSetAttribute(
            pool,
            cu::cudaMemPoolAttrReleaseThreshold,
            (&raw mut threshold).cast(),
        ));
        let mut got: u64 = 0;
        ok(cudaMemPoolGetAttribute(
            pool,
            cu::cudaMemPoolAttrReleaseThreshold,
            (&raw mut got).cast(),
        ));
        assert_eq!(got, u64::MAX);
        let mut flag: i32 = 5;
        ok(cudaMemPoolSetAttribute(
            pool,
            cu::cudaMemPoolReuseAllowOpportunistic,
            (&raw mut flag).cast(),
        ));
        let mut read: [i32; 2] = [-1, -1];
        ok(cudaMemPoolGetAttribute(
            pool,
            cu::cudaMemPoolReuseAllowOpportunistic,
            read.as_mut_ptr().cast(),
        ));
        assert_eq!(read, [1, -1], "an int is written, nothing past it");
        assert_err(
            cudaMemPoolGetAttribute(pool, 99, (&raw mut got).cast()),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaMemPoolGetAttribute(pool, 4, ptr::null_mut()),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaMemPoolTrimTo(pool, 0));

        // Access: device locations only.
        let desc = cudaMemAccessDesc {
            location: device_location(0),
            flags: cu::cudaMemAccessFlagsProtReadWrite,
        };
        ok(cudaMemPoolSetAccess(pool, &raw const desc, 1));
        let bad = cudaMemAccessDesc {
            location: device_location(0),
            flags: 2,
        };
        assert_err(
            cudaMemPoolSetAccess(pool, &raw const bad, 1),
            cu::cudaErrorInvalidValue,
        );
        let mut flags = 0;
        ok(cudaMemPoolGetAccess(&raw mut flags, pool, &raw mut loc));
        assert_eq!(flags, cu::cudaMemAccessFlagsProtReadWrite);

        // Pools shareable other than as POSIX descriptors (fabric) and host pools are refused
        // honestly.
        props.handleTypes = cu::cudaMemHandleTypeFabric;
        assert_err(
            cudaMemPoolCreate(&raw mut c, &raw const props),
            cu::cudaErrorNotSupported,
        );
        props.handleTypes = cu::cudaMemHandleTypeNone;
        props.allocType = cu::cudaMemAllocationTypeManaged;
        assert_err(
            cudaMemPoolCreate(&raw mut c, &raw const props),
            cu::cudaErrorInvalidValue,
        );

        ok(cudaMemPoolDestroy(pool));
        assert_err(cudaMemPoolTrimTo(pool, 0), cu::cudaErrorInvalidValue);
        assert_err(cudaMemPoolDestroy(pool), cu::cudaErrorInvalidValue);
        cudaGetLastError();
    }
}

#[test]
fn stream_priorities_are_the_device_s_and_clamped() {
    let fake = setup();
    let (mut least, mut greatest) = (9, 9);
    let mut s: cudaStream_t = ptr::null_mut();
    let mut prio = 0;
    let mut id = 0u64;
    // SAFETY: valid pointers.
    unsafe {
        ok(cudaDeviceGetStreamPriorityRange(
            &raw mut least,
            &raw mut greatest,
        ));
        assert_eq!((least, greatest), (0, -5));
        ok(cudaDeviceGetStreamPriorityRange(
            ptr::null_mut(),
            &raw mut greatest,
        ));
        ok(cudaStreamCreateWithPriority(&raw mut s, 0, -100));
        ok(cudaStreamGetPriority(s, &raw mut prio));
        assert_eq!(prio, -5);
        ok(cudaStreamGetId(s, &raw mut id));
        let host = *fake.state().streams.last().unwrap();
        assert_eq!(id, 1000 + host);
        ok(cudaStreamGetId_ptsz(ptr::null_mut(), &raw mut id));
        assert_eq!(id, 1000);
        assert_err(
            cudaStreamGetId(s, ptr::null_mut()),
            cu::cudaErrorInvalidValue,
        );
        cudaGetLastError();
    }
}

#[test]
fn a_device_reset_forgets_the_device_s_pools() {
    use crate::runtime::devices::cudaDeviceReset;
    let fake = setup();
    let (mut def, mut pool): (cudaMemPool_t, cudaMemPool_t) = (ptr::null_mut(), ptr::null_mut());
    let props = cudaMemPoolProps {
        allocType: cu::cudaMemAllocationTypePinned,
        location: device_location(0),
        ..Default::default()
    };
    // SAFETY: valid pointers.
    unsafe {
        ok(cudaDeviceGetDefaultMemPool(&raw mut def, 0));
        ok(cudaMemPoolCreate(&raw mut pool, &raw const props));
        ok(cudaDeviceReset());
        assert_err(cudaMemPoolTrimTo(pool, 0), cu::cudaErrorInvalidValue);
        assert_err(cudaMemPoolTrimTo(def, 0), cu::cudaErrorInvalidValue);
        cudaGetLastError();
        // The default pool is there again, under a new record.
        let mut again: cudaMemPool_t = ptr::null_mut();
        ok(cudaDeviceGetDefaultMemPool(&raw mut again, 0));
        ok(cudaMemPoolTrimTo(again, 0));
    }
    assert!(fake.state().pools.values().all(|(_, default)| *default));
}

#[test]
fn the_driver_face_s_pools_are_the_core_s_as_the_runtime_s_are() {
    use crate::{
        driver::{
            api::{context::*, device::*, init::cuInit, memory::*},
            status::DriverError,
        },
        generated::driver_api as d,
    };
    let fake = setup();
    let drv = |r: d::CUresult| DriverError::check(r);
    // SAFETY: valid out-parameters and structures throughout.
    unsafe {
        assert_eq!(drv(cuInit(0)), Ok(()));
        let mut primary: d::CUcontext = ptr::null_mut();
        assert_eq!(drv(cuDevicePrimaryCtxRetain(&raw mut primary, 0)), Ok(()));
        assert_eq!(drv(cuCtxSetCurrent(primary)), Ok(()));
        // One default pool, whichever face asks.
        let mut dp: d::CUmemoryPool = ptr::null_mut();
        assert_eq!(drv(cuDeviceGetDefaultMemPool(&raw mut dp, 0)), Ok(()));
        let mut rp: cudaMemPool_t = ptr::null_mut();
        ok(cudaDeviceGetDefaultMemPool(&raw mut rp, 0));
        assert_eq!(dp.cast::<core::ffi::c_void>(), rp.cast());
        assert_eq!(
            drv(cuDeviceGetDefaultMemPool(ptr::null_mut(), 0)),
            Err(DriverError::INVALID_VALUE)
        );
        assert_eq!(
            drv(cuDeviceGetMemPool(&raw mut dp, 7)),
            Err(DriverError::INVALID_DEVICE)
        );

        // A created pool: the core's checks of the props, allocations from it, its attributes.
        let mut props: d::CUmemPoolProps = std::mem::zeroed();
        props.allocType = d::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = d::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        props.handleTypes = d::CU_MEM_HANDLE_TYPE_WIN32;
        let mut pool: d::CUmemoryPool = ptr::null_mut();
        assert_eq!(
            drv(cuMemPoolCreate(&raw mut pool, &raw const props)),
            Err(DriverError::NOT_SUPPORTED)
        );
        props.handleTypes = d::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = d::CU_MEM_LOCATION_TYPE_HOST;
        assert_eq!(
            drv(cuMemPoolCreate(&raw mut pool, &raw const props)),
            Err(DriverError::NOT_SUPPORTED)
        );
        props.location.type_ = d::CU_MEM_LOCATION_TYPE_DEVICE;
        assert_eq!(
            drv(cuMemPoolCreate(&raw mut pool, &raw const props)),
            Ok(())
        );
        let mut threshold: u64 = 1 << 20;
        assert_eq!(
            drv(cuMemPoolSetAttribute(
                pool,
                d::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&raw mut threshold).cast()
            )),
            Ok(())
        );
        let sets = fake
            .state()
            .log
            .iter()
            .filter(|l| l.op == Op::MemPoolSetAttribute)
            .count();
        assert_eq!(sets, 1);
        let mut p: d::CUdeviceptr = 0;
        assert_eq!(
            drv(cuMemAllocFromPoolAsync(
                &raw mut p,
                256,
                pool,
                ptr::null_mut()
            )),
            Ok(())
        );
        assert_ne!(p, 0);
        assert_eq!(drv(cuMemFreeAsync(p, ptr::null_mut())), Ok(()));
        assert_eq!(
            drv(cuMemAllocFromPoolAsync(
                &raw mut p,
                256,
                ptr::null_mut(),
                ptr::null_mut()
            )),
            Err(DriverError::INVALID_VALUE)
        );
        let mut loc: d::CUmemLocation = std::mem::zeroed();
        loc.type_ = d::CU_MEM_LOCATION_TYPE_DEVICE;
        let mut flags: d::CUmemAccess_flags = 99;
        assert_eq!(
            drv(cuMemPoolGetAccess(&raw mut flags, pool, &raw mut loc)),
            Ok(())
        );
        assert_eq!(drv(cuMemPoolTrimTo(pool, 0)), Ok(()));
        assert_eq!(drv(cuMemPoolDestroy(pool)), Ok(()));
        assert_eq!(drv(cuMemPoolDestroy(pool)), Err(DriverError::INVALID_VALUE));
    }
}

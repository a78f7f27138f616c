use std::ffi::CStr;

use super::*;
use crate::{
    core::fake_device::FakeDevice,
    core::last_error,
    core::runtime::Runtime,
    generated::{self as cu, cudaDeviceProp},
    runtime::devices::*,
};
use qcuda_proto::Op;

#[test]
fn without_a_device_count_is_zero_and_no_device() {
    // No runtime installed: as without /dev/qcuda.
    let mut n = -1;
    // SAFETY: valid out-pointer.
    assert_err(
        unsafe { cudaGetDeviceCount(&raw mut n) },
        cu::cudaErrorNoDevice,
    );
    assert_eq!(n, 0);
    let mut v = -1;
    // SAFETY: valid out-pointer.
    ok(unsafe { cudaDriverGetVersion(&raw mut v) });
    assert_eq!(v, 0);
    // SAFETY: valid out-pointer.
    ok(unsafe { cudaRuntimeGetVersion(&raw mut v) });
    assert_eq!(v, 13000);
    // SAFETY: no pointers.
    assert_err(unsafe { cudaSetDevice(0) }, cu::cudaErrorNoDevice);
}

#[test]
fn a_host_whose_driver_is_unusable_says_why() {
    let fake = FakeDevice::new(0);
    fake.state().fail_next = Some((
        Op::DeviceCount,
        qcuda_proto::status::INSUFFICIENT_DRIVER,
        false,
    ));
    fake.install();
    let mut n = -1;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_err(
            cudaGetDeviceCount(&raw mut n),
            cu::cudaErrorInsufficientDriver,
        );
        assert_eq!(n, 0);
        assert_err(cudaSetDevice(0), cu::cudaErrorInsufficientDriver);
        let mut v = 0;
        ok(cudaDriverGetVersion(&raw mut v));
        assert_eq!(v, 13000);
    }
    last_error::take();
}

#[test]
fn a_host_without_gpus_counts_zero() {
    FakeDevice::new(0).install();
    let mut n = -1;
    // SAFETY: valid out-pointer.
    assert_err(
        unsafe { cudaGetDeviceCount(&raw mut n) },
        cu::cudaErrorNoDevice,
    );
    assert_eq!(n, 0);
    let mut d = 0;
    // SAFETY: valid out-pointer.
    assert_err(unsafe { cudaGetDevice(&raw mut d) }, cu::cudaErrorNoDevice);
}

#[test]
fn set_device_validates_and_is_per_thread() {
    FakeDevice::new(2).install();
    let mut n = 0;
    // SAFETY: valid out-pointers, no pointers.
    unsafe {
        ok(cudaGetDeviceCount(&raw mut n));
        assert_eq!(n, 2);
        ok(cudaSetDevice(1));
        assert_err(cudaSetDevice(2), cu::cudaErrorInvalidDevice);
        assert_err(cudaSetDevice(-1), cu::cudaErrorInvalidDevice);
        let mut d = -1;
        ok(cudaGetDevice(&raw mut d));
        assert_eq!(d, 1);
    }
    std::thread::spawn(|| assert_eq!(crate::core::devices::current(), 0))
        .join()
        .unwrap();
}

#[test]
fn properties_come_from_one_batched_request_and_mask_unremoted_features() {
    let fake = setup();
    let mut p = cudaDeviceProp::default();
    // SAFETY: valid out-pointer.
    ok(unsafe { cudaGetDeviceProperties(&raw mut p, 0) });
    // SAFETY: the name is NUL-terminated.
    let name = unsafe { CStr::from_ptr(p.name.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "Fake H100 0");
    assert_eq!((p.major, p.minor), (9, 0));
    assert_eq!(p.totalGlobalMem, 80 << 30);
    assert_eq!(p.maxThreadsPerBlock, 1024);
    assert_eq!(p.maxGridSize, [i32::MAX, 65535, 65535]);
    assert_eq!(p.warpSize, 32);
    assert_eq!(p.multiProcessorCount, 132);
    assert_eq!(p.unifiedAddressing, 1);
    // Mapped host memory is carried: the host's value passes through.
    assert_eq!(p.canMapHostMemory, 1);
    // Managed memory is qcuda's own; pageable access and concurrent managed access are not.
    assert_eq!(p.managedMemory, 1);
    assert_eq!((p.pageableMemoryAccess, p.concurrentManagedAccess), (0, 0));
    assert_eq!(
        p.clusterLaunch,
        cu::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH as i32 * 10
    );
    let attribute_requests = || {
        fake.ops()
            .iter()
            .filter(|o| **o == Op::DeviceAttributes)
            .count()
    };
    assert_eq!(attribute_requests(), 1);

    // Cached: neither a second call nor single attributes ask again.
    // SAFETY: valid out-pointers.
    unsafe {
        ok(cudaGetDeviceProperties(&raw mut p, 0));
        let mut v = 0;
        ok(cudaDeviceGetAttribute(
            &raw mut v,
            cu::cudaDevAttrMaxThreadsPerBlock,
            0,
        ));
        assert_eq!(v, 1024);
        ok(cudaDeviceGetAttribute(
            &raw mut v,
            cu::cudaDevAttrCanMapHostMemory,
            0,
        ));
        assert_eq!(v, 1);
        ok(cudaDeviceGetAttribute(
            &raw mut v,
            cu::cudaDevAttrPageableMemoryAccess,
            0,
        ));
        assert_eq!(v, 0);
        assert_err(
            cudaGetDeviceProperties(&raw mut p, 1),
            cu::cudaErrorInvalidDevice,
        );
    }
    assert_eq!(attribute_requests(), 1);
}

#[test]
fn attributes_the_host_does_not_know_read_as_zero_in_properties() {
    let fake = setup();
    fake.state()
        .unknown_attributes
        .push(cu::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE as i32);
    let mut p = cudaDeviceProp::default();
    // SAFETY: valid out-pointer.
    ok(unsafe { cudaGetDeviceProperties(&raw mut p, 0) });
    assert_eq!(p.l2CacheSize, 0);
    assert_eq!(p.maxThreadsPerBlock, 1024);
    let mut v = 0;
    // Asked alone, the host's error is the answer.
    // SAFETY: valid out-pointer.
    let r = unsafe { cudaDeviceGetAttribute(&raw mut v, cu::cudaDevAttrL2CacheSize, 0) };
    assert_err(r, cu::cudaErrorInvalidValue);
}

#[test]
fn versions_flags_pci_and_memory_info() {
    let fake = FakeDevice::new(2);
    fake.install();
    // SAFETY: valid out-pointers and buffers throughout.
    unsafe {
        let mut v = 0;
        ok(cudaDriverGetVersion(&raw mut v));
        assert_eq!(v, 13000);
        ok(cudaSetDeviceFlags(cu::cudaDeviceScheduleBlockingSync));
        let mut f = 0;
        ok(cudaGetDeviceFlags(&raw mut f));
        assert_eq!(f, cu::cudaDeviceScheduleBlockingSync);
        assert_err(cudaSetDeviceFlags(3), cu::cudaErrorInvalidValue);
        let mut bus = [0i8; 32];
        ok(cudaDeviceGetPCIBusId(bus.as_mut_ptr(), 32, 1));
        let id = CStr::from_ptr(bus.as_ptr());
        assert_eq!(id.to_str().unwrap(), "0000:11:00.0");
        let mut d = -1;
        ok(cudaDeviceGetByPCIBusId(&raw mut d, id.as_ptr()));
        assert_eq!(d, 1);
        let mut short = [0x7fi8; 5];
        ok(cudaDeviceGetPCIBusId(short.as_mut_ptr(), 5, 0));
        assert_eq!(CStr::from_ptr(short.as_ptr()).to_str().unwrap(), "0000");
        // The host's answer (the fake: different devices are peers).
        let mut can = 0;
        ok(cudaDeviceCanAccessPeer(&raw mut can, 0, 1));
        assert_eq!(can, 1);
        ok(cudaDeviceCanAccessPeer(&raw mut can, 1, 1));
        assert_eq!(can, 0);
        assert_err(
            cudaDeviceCanAccessPeer(&raw mut can, 0, 2),
            cu::cudaErrorInvalidDevice,
        );
        let mut v = 0;
        ok(cudaDeviceGetP2PAttribute(
            &raw mut v,
            cu::cudaDevP2PAttrAccessSupported,
            0,
            1,
        ));
        assert_eq!(v, 1);
        assert_err(
            cudaDeviceGetP2PAttribute(&raw mut v, 9, 0, 1),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaDeviceEnablePeerAccess(1, 0));
        assert_err(cudaDeviceEnablePeerAccess(1, 3), cu::cudaErrorInvalidValue);
        assert_err(cudaDeviceEnablePeerAccess(0, 0), cu::cudaErrorInvalidDevice);
        ok(cudaDeviceDisablePeerAccess(1));
        crate::runtime::errors::cudaGetLastError();
        // A copy from device 1 to device 0.
        let (mut a, mut b): (*mut core::ffi::c_void, *mut core::ffi::c_void) =
            (core::ptr::null_mut(), core::ptr::null_mut());
        ok(crate::runtime::memory::cudaMalloc(&raw mut a, 64));
        ok(cudaSetDevice(1));
        ok(crate::runtime::memory::cudaMalloc(&raw mut b, 64));
        let data = [9u8; 64];
        ok(crate::runtime::memory::cudaMemcpy(
            b,
            data.as_ptr().cast(),
            64,
            cu::cudaMemcpyHostToDevice,
        ));
        ok(cudaSetDevice(0));
        ok(crate::runtime::memory::cudaMemcpyPeer(a, 0, b, 1, 64));
        let mut back = [0u8; 64];
        ok(crate::runtime::memory::cudaMemcpy(
            back.as_mut_ptr().cast(),
            a,
            64,
            cu::cudaMemcpyDeviceToHost,
        ));
        assert_eq!(back, data);
        ok(crate::runtime::memory::cudaMemcpyPeerAsync(
            a,
            0,
            b,
            1,
            64,
            core::ptr::null_mut(),
        ));
        assert_err(
            crate::runtime::memory::cudaMemcpyPeer(a, 0, b, 5, 64),
            cu::cudaErrorInvalidDevice,
        );
        crate::runtime::errors::cudaGetLastError();
        let (mut free, mut total) = (0, 0);
        ok(cudaMemGetInfo(&raw mut free, &raw mut total));
        assert_eq!(total, 80 << 30);
        assert!(free <= total);
    }
}

#[test]
fn transport_failures_map_to_cuda_errors_and_eintr_is_retried() {
    let fake = setup();
    fake.state().errnos.extend([libc::EINTR, libc::EINTR]);
    // SAFETY: no pointers.
    ok(unsafe { cudaDeviceSynchronize() });
    // A request in between, so that the next synchronisation has something to wait for and
    // goes to the host (an idle one makes no round trip).
    let mut p = std::ptr::null_mut();
    // SAFETY: a valid out-parameter.
    ok(unsafe { crate::runtime::memory::cudaMalloc(&raw mut p, 16) });
    fake.state().errnos.push_back(libc::EIO);
    // SAFETY: no pointers.
    assert_err(
        unsafe { cudaDeviceSynchronize() },
        cu::cudaErrorDevicesUnavailable,
    );
    fake.state().errnos.push_back(libc::ENODEV);
    // SAFETY: no pointers.
    assert_err(
        unsafe { cudaDeviceSynchronize() },
        cu::cudaErrorDevicesUnavailable,
    );
    fake.state().errnos.push_back(libc::EFAULT);
    // SAFETY: no pointers.
    assert_err(
        unsafe { cudaDeviceSynchronize() },
        cu::cudaErrorInvalidValue,
    );
    last_error::take();

    // A kernel module that does not know the ioctl: the handshake fails.
    let old = FakeDevice::new(1);
    old.state().errnos.push_back(libc::ENOTTY);
    let err = Runtime::connect(Box::new(old.clone()), false).unwrap_err();
    assert_eq!(err, crate::core::cuda_error::CudaError::INSUFFICIENT_DRIVER);
}

/// A repeated single-attribute query (NVIDIA's runtime asks the driver on every
/// `cudaDeviceGetAttribute`) is answered in the guest on both faces, masked as the first answer
/// was, after one request; an attribute the host does not know is asked again each time, so the
/// host's error stays the answer.
#[test]
fn repeated_attribute_queries_are_answered_in_the_guest_on_both_faces() {
    use crate::{driver::api::device::cuDeviceGetAttribute, generated::driver_api as d};
    let fake = setup();
    let pools = d::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES;
    fake.state().attributes.insert(pools as i32, 9);
    let l2 = d::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE;
    fake.state().unknown_attributes.push(l2 as i32);
    let requests = || {
        fake.ops()
            .iter()
            .filter(|o| **o == Op::DeviceAttributes)
            .count()
    };
    // SAFETY: valid out-pointers throughout.
    unsafe {
        assert_eq!(crate::driver::api::init::cuInit(0), d::CUDA_SUCCESS);
        for _ in 0..3 {
            let (mut a, mut b) = (-1, -1);
            ok(cudaDeviceGetAttribute(
                &raw mut a,
                cu::cudaDevAttrMultiProcessorCount,
                0,
            ));
            let sm = d::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
            assert_eq!(cuDeviceGetAttribute(&raw mut b, sm, 0), d::CUDA_SUCCESS);
            assert_eq!((a, b), (132, 132));
            assert_eq!(cuDeviceGetAttribute(&raw mut b, pools, 0), d::CUDA_SUCCESS);
            ok(cudaDeviceGetAttribute(&raw mut a, pools, 0));
            assert_eq!((a, b), (1, 1), "masked to what qcuda offers");
            assert_err(
                cudaDeviceGetAttribute(&raw mut a, cu::cudaDevAttrL2CacheSize, 0),
                cu::cudaErrorInvalidValue,
            );
            assert_eq!(
                cuDeviceGetAttribute(&raw mut b, l2, 0),
                d::CUDA_ERROR_INVALID_VALUE
            );
            // Another device's answers are its own.
            assert_eq!(
                cuDeviceGetAttribute(&raw mut b, sm, 7),
                d::CUDA_ERROR_INVALID_DEVICE
            );
        }
    }
    // One request each for the two known attributes, and one per unknown query.
    assert_eq!(requests(), 2 + 6);
}

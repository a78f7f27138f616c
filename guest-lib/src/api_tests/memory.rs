use std::{ffi::c_void, ptr};

use qcuda_proto::{Op, COPY_CHUNK};

use super::*;
use crate::{
    generated::{self as cu, cudaPointerAttributes},
    runtime::{errors::cudaGetLastError, memory::*},
};

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn large_copies_are_chunked_and_round_trip() {
    let fake = setup();
    let len = 2 * COPY_CHUNK as usize + 12345;
    let src = pattern(len);
    let mut back = vec![0u8; len];
    let mut d: *mut c_void = ptr::null_mut();
    // SAFETY: buffers of `len` bytes.
    unsafe {
        ok(cudaMalloc(&raw mut d, len));
        ok(cudaMemcpy(
            d,
            src.as_ptr().cast(),
            len,
            cu::cudaMemcpyHostToDevice,
        ));
        ok(cudaMemcpy(
            back.as_mut_ptr().cast(),
            d,
            len,
            cu::cudaMemcpyDeviceToHost,
        ));
    }
    assert!(back == src);
    let s = fake.state();
    // Chunks are in flight from two threads, so they may arrive in any order.
    let mut htod: Vec<u64> = s
        .log
        .iter()
        .filter(|l| l.op == Op::MemcpyHtoD)
        .map(|l| l.in_len)
        .collect();
    htod.sort_unstable();
    assert_eq!(htod, [12345, COPY_CHUNK, COPY_CHUNK]);
    let mut dtoh: Vec<u64> = s
        .log
        .iter()
        .filter(|l| l.op == Op::MemcpyDtoH)
        .map(|l| l.out_len)
        .collect();
    dtoh.sort_unstable();
    assert_eq!(dtoh, [12345, COPY_CHUNK, COPY_CHUNK]);
}

#[test]
fn every_kind_and_default_inference() {
    let fake = setup();
    let src = pattern(256);
    let mut out = vec![0u8; 256];
    let (mut a, mut b) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: 256-byte buffers throughout.
    unsafe {
        ok(cudaMalloc(&raw mut a, 256));
        ok(cudaMalloc(&raw mut b, 256));
        ok(cudaMemcpy(
            a,
            src.as_ptr().cast(),
            256,
            cu::cudaMemcpyDefault,
        ));
        ok(cudaMemcpy(b, a, 256, cu::cudaMemcpyDefault));
        ok(cudaMemcpy(
            out.as_mut_ptr().cast(),
            (b as *const u8).add(0).cast(),
            256,
            cu::cudaMemcpyDefault,
        ));
        assert!(out == src);
        // Inside an allocation counts as device memory too.
        ok(cudaMemcpy(
            out.as_mut_ptr().cast(),
            (a as *const u8).add(128).cast(),
            128,
            cu::cudaMemcpyDefault,
        ));
        assert_eq!(out[..128], src[128..]);
        let mut host2 = vec![0u8; 256];
        let before = fake.ops().len();
        ok(cudaMemcpy(
            host2.as_mut_ptr().cast(),
            src.as_ptr().cast(),
            256,
            cu::cudaMemcpyHostToHost,
        ));
        ok(cudaMemcpy(
            host2.as_mut_ptr().cast(),
            src.as_ptr().cast(),
            0,
            cu::cudaMemcpyHostToDevice,
        ));
        assert_eq!(
            fake.ops().len(),
            before,
            "host-to-host and empty copies stay local"
        );
        assert!(host2 == src);
        assert_err(cudaMemcpy(a, b, 4, 7), cu::cudaErrorInvalidMemcpyDirection);
        assert_err(
            cudaMemcpy(ptr::null_mut(), b, 4, cu::cudaMemcpyDeviceToHost),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaMemset(a, 0x1ab, 256));
        ok(cudaMemcpy(
            out.as_mut_ptr().cast(),
            a,
            256,
            cu::cudaMemcpyDeviceToHost,
        ));
        assert!(out.iter().all(|&x| x == 0xab));
        ok(cudaMemcpyAsync(
            b,
            a,
            256,
            cu::cudaMemcpyDeviceToDevice,
            ptr::null_mut(),
        ));
        ok(cudaMemsetAsync_ptsz(a, 0, 16, ptr::null_mut()));
        ok(cudaMemcpy_ptds(
            out.as_mut_ptr().cast(),
            b,
            256,
            cu::cudaMemcpyDeviceToHost,
        ));
        assert!(out.iter().all(|&x| x == 0xab));
        ok(cudaFree(a));
        ok(cudaFree(ptr::null_mut()));
        assert_err(cudaFree(a), cu::cudaErrorInvalidValue);
    }
    let log = &fake.state().log;
    assert!(log
        .iter()
        .any(|l| l.op == Op::MemcpyDtoD && l.fire_and_forget));
    assert!(log.iter().any(|l| l.op == Op::Memset && l.fire_and_forget));
    assert!(log
        .iter()
        .filter(|l| l.op == Op::MemcpyHtoD)
        .all(|l| !l.fire_and_forget));
    cudaGetLastError();
}

#[test]
fn zero_byte_malloc_is_null_without_a_round_trip() {
    let fake = setup();
    let mut p = ptr::dangling_mut::<c_void>();
    // SAFETY: valid out-pointer.
    ok(unsafe { cudaMalloc(&raw mut p, 0) });
    assert!(p.is_null());
    assert!(!fake.ops().contains(&Op::Malloc));
}

#[test]
fn host_allocations_and_pointer_attributes() {
    let fake = setup();
    let (mut h, mut d) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid pointers throughout.
    unsafe {
        ok(cudaMallocHost(&raw mut h, 100));
        assert_eq!(h as usize % 4096, 0);
        ok(cudaMalloc(&raw mut d, 100));
        let mut a = cudaPointerAttributes::default();
        ok(cudaPointerGetAttributes(&raw mut a, h));
        assert_eq!((a.type_, a.hostPointer), (cu::cudaMemoryTypeHost, h));
        ok(cudaPointerGetAttributes(
            &raw mut a,
            (d as *const u8).add(50).cast(),
        ));
        assert_eq!(a.type_, cu::cudaMemoryTypeDevice);
        assert!(a.hostPointer.is_null() && !a.devicePointer.is_null());
        let local = 5u8;
        ok(cudaPointerGetAttributes(
            &raw mut a,
            (&raw const local).cast(),
        ));
        assert_eq!(a.type_, cu::cudaMemoryTypeUnregistered);
        assert_eq!(
            (a.device, a.hostPointer),
            (-2, (&raw const local).cast_mut().cast())
        );
        // Pinned memory works as a copy source and destination.
        h.cast::<u8>().write_bytes(9, 100);
        ok(cudaMemcpy(d, h, 100, cu::cudaMemcpyDefault));
        let mut f = 99;
        ok(cudaHostGetFlags(&raw mut f, h));
        assert_eq!(f, 0);
        ok(cudaFreeHost(h));
        assert_err(cudaFreeHost(h), cu::cudaErrorInvalidValue);
        let mut m = ptr::null_mut();
        ok(cudaHostAlloc(&raw mut m, 10, cu::cudaHostAllocPortable));
        ok(cudaFreeHost(m));

        // Mapped memory: in the window, device address == pointer, copies go MemcpyMapped.
        ok(cudaHostAlloc(&raw mut m, 8192, cu::cudaHostAllocMapped));
        assert_eq!(m as u64 & 0xfff, 0);
        assert!(m as u64 >= qcuda_proto::HOST_WINDOW_BASE);
        let mut dp = ptr::null_mut();
        ok(cudaHostGetDevicePointer(
            &raw mut dp,
            m.cast::<u8>().add(4096).cast(),
            0,
        ));
        assert_eq!(dp as u64, m as u64 + 4096);
        assert_err(
            cudaHostGetDevicePointer(&raw mut dp, m, 1),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaHostGetDevicePointer(&raw mut dp, (&raw const local).cast_mut().cast(), 0),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaPointerGetAttributes(&raw mut a, m));
        assert_eq!((a.type_, a.devicePointer), (cu::cudaMemoryTypeHost, m));
        m.cast::<u8>().write_bytes(7, 100);
        ok(cudaMemcpy(d, m, 100, cu::cudaMemcpyHostToDevice));
        m.cast::<u8>().write_bytes(0, 100);
        ok(cudaMemcpyAsync(
            m,
            d,
            100,
            cu::cudaMemcpyDeviceToHost,
            ptr::null_mut(),
        ));
        flush();
        assert_eq!(*(m as *const u8).add(99), 7);
        assert!(
            fake.ops()
                .iter()
                .filter(|o| **o == Op::MemcpyMapped)
                .count()
                >= 2
        );
        ok(cudaFreeHost(m));

        // Registered malloc memory.
        let mut buf = vec![0u8; 10_000];
        let b = buf.as_mut_ptr().cast::<c_void>();
        ok(cudaHostRegister(b, buf.len(), cu::cudaHostRegisterMapped));
        assert_err(
            cudaHostRegister(b.cast::<u8>().add(10).cast(), 10, 0),
            cu::cudaErrorHostMemoryAlreadyRegistered,
        );
        ok(cudaHostGetDevicePointer(&raw mut dp, b, 0));
        assert_eq!(dp, b);
        ok(cudaMemcpy(b, d, 100, cu::cudaMemcpyDeviceToHost));
        assert_eq!(buf[50], 7);
        ok(cudaHostUnregister(b));
        assert_err(cudaHostUnregister(b), cu::cudaErrorHostMemoryNotRegistered);
        assert_err(
            cudaHostRegister(b, 10, cu::cudaHostRegisterIoMemory),
            cu::cudaErrorNotSupported,
        );

        // Managed memory: one pointer for both sides; cudaFree frees it.
        // Zero bytes succeeds with a null pointer, as NVIDIA's runtime answers.
        ok(cudaMallocManaged(&raw mut m, 0, 1));
        assert!(m.is_null());
        assert_err(
            cudaMallocManaged(&raw mut m, 64, 4),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaMallocManaged(&raw mut m, 64, 1));
        ok(cudaPointerGetAttributes(&raw mut a, m));
        assert_eq!(
            (a.type_, a.devicePointer, a.hostPointer),
            (cu::cudaMemoryTypeManaged, m, m)
        );
        ok(cudaFree(m));
        assert_eq!(fake.state().host_maps.len(), 0);
    }
    cudaGetLastError();
}

#[test]
fn stream_attach_checks_its_managed_range() {
    use crate::runtime::streams::cudaStreamAttachMemAsync;
    setup();
    let mut m = ptr::null_mut();
    let mut local = 0u8;
    // SAFETY: valid pointers; `m` is managed memory of 4096 bytes.
    unsafe {
        ok(cudaMallocManaged(&raw mut m, 4096, 1));
        ok(cudaStreamAttachMemAsync(ptr::null_mut(), m, 0, 2));
        ok(cudaStreamAttachMemAsync(ptr::null_mut(), m, 4096, 1));
        assert_err(
            cudaStreamAttachMemAsync(ptr::null_mut(), m, 4096, 4),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaStreamAttachMemAsync(ptr::null_mut(), m, 100, 1),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaStreamAttachMemAsync(ptr::null_mut(), (&raw mut local).cast(), 0, 1),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaStreamAttachMemAsync(ptr::null_mut(), m, 0, 3),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaFree(m));
    }
    cudaGetLastError();
}

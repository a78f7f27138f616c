use std::ptr;

use qcuda_proto::{status, Op};

use super::*;
use crate::{
    core::fake_device::FAULTING_KERNEL,
    generated::{self as cu, dim3},
    runtime::{devices::*, errors::*, launch::*, memory::*, streams::*, unsupported},
};

#[test]
fn error_names_and_strings_come_from_the_header_tables() {
    // SAFETY: the returned strings are static and NUL-terminated.
    unsafe {
        let name = CStr::from_ptr(cudaGetErrorName(cu::cudaErrorMemoryAllocation));
        assert_eq!(name, c"cudaErrorMemoryAllocation");
        let text = CStr::from_ptr(cudaGetErrorString(cu::cudaErrorInvalidValue));
        assert!(text
            .to_str()
            .unwrap()
            .contains("not within an acceptable range"));
        let unknown = CStr::from_ptr(cudaGetErrorString(4242));
        assert_eq!(unknown, c"unrecognized error code");
    }
}

#[test]
fn last_error_is_taken_by_get_and_kept_by_peek() {
    setup();
    let mut p = ptr::null_mut();
    // SAFETY: valid out-pointer; null free is fine.
    unsafe {
        assert_err(cudaMalloc(ptr::null_mut(), 4), cu::cudaErrorInvalidValue);
        ok(cudaMalloc(&raw mut p, 4));
        assert_err(cudaPeekAtLastError(), cu::cudaErrorInvalidValue);
        assert_err(cudaGetLastError(), cu::cudaErrorInvalidValue);
        ok(cudaGetLastError());
        ok(cudaPeekAtLastError());
    }
}

#[test]
fn a_fault_is_sticky_until_device_reset() {
    let fake = setup();
    fake.add_kernel(FAULTING_KERNEL, &[]);
    let fault = register_kernel(register_fatbin(), c"_Z5faultv");
    let one = dim3 { x: 1, y: 1, z: 1 };
    let mut p = ptr::null_mut();
    // SAFETY: valid pointers; the kernel has no parameters.
    unsafe {
        ok(cudaMalloc(&raw mut p, 64));
        // The launch does not wait: the fault shows at the next synchronising call.
        ok(cudaLaunchKernel(
            fault as *const _,
            one,
            one,
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        ));
        ok(cudaGetLastError());
        assert_err(cudaDeviceSynchronize(), cu::cudaErrorIllegalAddress);

        // Sticky: every later call on the device fails with it, locally.
        let before = fake.ops().len();
        assert_err(cudaMalloc(&raw mut p, 64), cu::cudaErrorIllegalAddress);
        assert_err(
            cudaStreamSynchronize(ptr::null_mut()),
            cu::cudaErrorIllegalAddress,
        );
        let mut host = [0u8; 4];
        let r = cudaMemcpy(
            host.as_mut_ptr().cast(),
            host.as_ptr().cast(),
            4,
            cu::cudaMemcpyHostToHost,
        );
        assert_err(r, cu::cudaErrorIllegalAddress);
        assert_eq!(
            fake.ops().len(),
            before,
            "no round trips for a sticky error"
        );
        // Each failing call recorded it; reading the variable clears it (NVIDIA 13.0 does so).
        assert_err(cudaPeekAtLastError(), cu::cudaErrorIllegalAddress);
        assert_err(cudaGetLastError(), cu::cudaErrorIllegalAddress);
        ok(cudaGetLastError());
        assert_err(cudaDeviceSynchronize(), cu::cudaErrorIllegalAddress);
        assert_err(cudaGetLastError(), cu::cudaErrorIllegalAddress);
        // Device queries still answer.
        let mut n = 0;
        ok(cudaGetDeviceCount(&raw mut n));

        ok(cudaDeviceReset());
        ok(cudaGetLastError());
        ok(cudaMalloc(&raw mut p, 64));
        // The reset freed the module on the host, so the next launch loads it again.
        let loads = |f: &FakeDevice| f.ops().iter().filter(|o| **o == Op::ModuleLoad).count();
        assert_eq!(loads(&fake), 1);
        fake.add_kernel("_Z1kv", &[]);
        let k = register_kernel(register_fatbin(), c"_Z1kv");
        ok(cudaLaunchKernel(
            k as *const _,
            one,
            one,
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        ));
        ok(cudaLaunchKernel(
            fault as *const _,
            one,
            one,
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        ));
        assert_eq!(loads(&fake), 3);
        assert_err(cudaDeviceSynchronize(), cu::cudaErrorIllegalAddress);
        ok(cudaDeviceReset());
    }
}

#[test]
fn a_failed_fire_and_forget_op_is_reported_once_at_the_next_sync() {
    let fake = setup();
    let (mut a, mut b) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid pointers.
    unsafe {
        ok(cudaMalloc(&raw mut a, 64));
        ok(cudaMalloc(&raw mut b, 64));
        fake.state().fail_next = Some((Op::Memset, status::INVALID_VALUE, false));
        ok(cudaMemsetAsync(a, 1, 64, ptr::null_mut()));
        assert_err(
            cudaStreamSynchronize(ptr::null_mut()),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaStreamSynchronize(ptr::null_mut()));
        assert_err(cudaGetLastError(), cu::cudaErrorInvalidValue);
        ok(cudaGetLastError());
        ok(cudaMemcpy(b, a, 64, cu::cudaMemcpyDeviceToDevice));
    }
}

#[test]
fn a_failed_fire_and_forget_op_reaches_the_last_error_through_a_non_sync_call() {
    let fake = setup();
    let (mut a, mut b) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid pointers.
    unsafe {
        ok(cudaMalloc(&raw mut a, 64));
        fake.state().fail_next = Some((Op::Memset, status::INVALID_VALUE, false));
        ok(cudaMemsetAsync(a, 1, 64, ptr::null_mut()));
        // The next waited-for op carries the failure: it succeeds itself, the error becomes
        // the thread's last error, and a later synchronise has nothing more to report.
        ok(cudaMalloc(&raw mut b, 64));
        ok(cudaDeviceSynchronize());
        assert_err(cudaGetLastError(), cu::cudaErrorInvalidValue);
        ok(cudaGetLastError());
    }
}

#[test]
fn unsupported_functions_fail_honestly() {
    setup();
    assert_err(
        unsupported::cudaGraphConditionalHandleCreate(),
        cu::cudaErrorNotSupported,
    );
    assert_err(
        unsupported::cudaGraphConditionalHandleCreate(),
        cu::cudaErrorNotSupported,
    );
    assert_err(cudaGetLastError(), cu::cudaErrorNotSupported);
    assert_err(
        unsupported::cudaGraphicsMapResources(),
        cu::cudaErrorNotSupported,
    );
    cudaGetLastError();
}

#[test]
fn the_sticky_flag_alone_does_not_make_an_error_sticky() {
    // The host flags every response of a session that holds a sticky error (on any device);
    // only a sticky code makes the guest stop sending.
    let fake = setup();
    fake.state().fail_next = Some((Op::Malloc, status::MEMORY_ALLOCATION, true));
    let mut p = ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe {
        assert_err(cudaMalloc(&raw mut p, 64), cu::cudaErrorMemoryAllocation);
        ok(cudaMalloc(&raw mut p, 64));
    }
    cudaGetLastError();
}

#[test]
fn interrupted_calls_are_repeated_only_when_idempotent() {
    let fake = setup();
    let mut p = ptr::null_mut();
    // SAFETY: valid out-pointer; no pointers.
    unsafe {
        fake.state().errnos.extend([libc::EINTR, libc::EINTR]);
        ok(cudaDeviceSynchronize());
        // Malloc is not repeated (it may have run); it is sent with signals blocked, so only a
        // test double can still interrupt it.
        fake.state().errnos.push_back(libc::EINTR);
        assert_err(cudaMalloc(&raw mut p, 64), cu::cudaErrorUnknown);
        assert!(fake.state().errnos.is_empty());
        assert!(!fake.ops().contains(&Op::Malloc));
        ok(cudaMalloc(&raw mut p, 64));
    }
    cudaGetLastError();
}

use crate::core::fake_device::FakeDevice;

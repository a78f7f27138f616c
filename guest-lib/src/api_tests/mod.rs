//! End-to-end tests of the exported C functions against the in-process test double
//! (`fake_device.rs`): each test installs its own runtime and registry on its own thread and
//! then calls the `extern "C"` functions exactly as an nvcc-built program would.

#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "test data: small patterns, constants and addresses of a 64-bit test process, and CUDA enum constants written as C ints"
)]

use std::{
    ffi::{c_void, CStr},
    ptr,
    sync::Arc,
};

use crate::{
    core::fake_device::FakeDevice,
    core::modules::fatbin::{FatbinWrapper, FATBIN_MAGIC, WRAPPER_MAGIC},
    generated::{cudaError_t, cudaSuccess},
    runtime::registration::{__cudaRegisterFatBinary, __cudaRegisterFunction, __cudaRegisterVar},
};

mod arrays;
mod checkpoint;
mod conditional_capture;
mod devices;
mod driver;
mod driver_graphs;
mod errors;
mod frameworks;
mod graphs;
mod ipc;
mod launch;
mod managed;
mod memory;
mod pointer_attrs;
mod pools;
mod profiler;
mod streams;
mod symbols;
mod vmm;

/// Bytes of the fake fatbin images the tests register: 16 header bytes + 48 entry bytes.
pub const IMAGE_LEN: usize = 64;

/// A fake with one device, installed as this thread's runtime.
/// Sends the runtime's gathered fire-and-forget work to the fake now (as the flusher thread
/// or the next call would), so a test can look at what the "host" did.
pub fn flush() {
    crate::core::runtime::runtime()
        .unwrap()
        .session
        .flush_batch();
}

/// Keeps the runtime's flusher thread from sending batches on its own (`true`; `false` lets it
/// again): for tests that count them, whatever the machine's load.
pub fn hold_batches(hold: bool) {
    crate::core::runtime::runtime()
        .unwrap()
        .session
        .hold_batches(hold);
}

/// Batches wait for a call or the test to send them (see [`hold_batches`]).
pub fn setup() -> Arc<FakeDevice> {
    let fake = FakeDevice::new(1);
    fake.install();
    hold_batches(true);
    fake
}

/// Registers a fatbin image as nvcc's static constructor does; returns the fatbin handle.
pub fn register_fatbin() -> *mut *mut c_void {
    let mut words = vec![0u64; IMAGE_LEN / 8];
    words[0] = u64::from(FATBIN_MAGIC) | 1 << 32 | 16 << 48;
    words[1] = (IMAGE_LEN - 16) as u64;
    let data = Box::leak(words.into_boxed_slice());
    let wrapper = Box::leak(Box::new(FatbinWrapper {
        magic: WRAPPER_MAGIC as i32,
        version: 1,
        data: data.as_ptr(),
        filename_or_fatbins: ptr::null_mut(),
    }));
    // SAFETY: a valid wrapper whose image is leaked, so it lives forever.
    unsafe { __cudaRegisterFatBinary((wrapper as *mut FatbinWrapper).cast()) }
}

/// A unique "host stub" address for a test kernel or variable.
pub fn host_address() -> usize {
    Box::leak(Box::new(0u64)) as *mut u64 as usize
}

/// Registers kernel `name` of `fatbin`; returns its host stub address.
pub fn register_kernel(fatbin: *mut *mut c_void, name: &CStr) -> usize {
    let host = host_address();
    // SAFETY: arguments as nvcc passes them.
    unsafe {
        __cudaRegisterFunction(
            fatbin,
            host as *const _,
            name.as_ptr().cast_mut(),
            name.as_ptr(),
            -1,
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
        );
    };
    host
}

/// Registers device variable `name` of `size` bytes; returns its host shadow address.
pub fn register_var(fatbin: *mut *mut c_void, name: &CStr, size: usize) -> usize {
    let host = host_address();
    // SAFETY: arguments as nvcc passes them.
    unsafe {
        __cudaRegisterVar(
            fatbin,
            host as *mut _,
            name.as_ptr().cast_mut(),
            name.as_ptr(),
            0,
            size,
            0,
            0,
        );
    };
    host
}

/// Asserts a `cudaError_t` result by name, for readable failures.
#[track_caller]
pub fn assert_err(got: cudaError_t, want: cudaError_t) {
    let name = |e| crate::core::cuda_error::error_name(e).to_str().unwrap();
    assert_eq!(name(got), name(want));
}

/// Asserts success.
#[track_caller]
pub fn ok(got: cudaError_t) {
    assert_err(got, cudaSuccess);
}

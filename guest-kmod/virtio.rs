// SPDX-License-Identifier: GPL-2.0
//! The virtio edge of qcuda.ko: declarations of glue.c and of the exported virtio core
//! functions, and the driver registration.
//!
//! Linux has no Rust virtio abstraction, so the few calls the driver needs are declared here by
//! hand (exported symbols) or wrapped in glue.c (macros and static inlines). Nothing above this
//! file (device.rs) calls C directly except through these declarations.

use kernel::{
    bindings,
    error::to_result,
    ffi::{c_int, c_uint, c_ulong, c_void},
    prelude::*,
};

/// `struct virtio_device`, only ever handled by pointer.
#[repr(C)]
pub(crate) struct VirtioDevice {
    _opaque: [u8; 0],
}

/// `struct virtqueue`, only ever handled by pointer.
#[repr(C)]
pub(crate) struct Virtqueue {
    _opaque: [u8; 0],
}

// `struct page` and `struct device` are passed by pointer only; rustc cannot see that through
// bindgen's zero-sized members, hence the `allow`.
// Every function below is called with pointers that the virtio core handed to this driver
// (probe's `vdev`, the queues from find_vqs) or with memory the caller owns; each call site
// states why.
#[allow(improper_ctypes)]
extern "C" {
    // glue.c
    pub(crate) fn qcuda_glue_register() -> c_int;
    pub(crate) fn qcuda_glue_unregister();
    pub(crate) fn qcuda_glue_find_vqs(
        vdev: *mut VirtioDevice,
        requests: *mut *mut Virtqueue,
        events: *mut *mut Virtqueue,
    ) -> c_int;
    pub(crate) fn qcuda_glue_del_vqs(vdev: *mut VirtioDevice);
    pub(crate) fn qcuda_glue_device_ready(vdev: *mut VirtioDevice);
    pub(crate) fn qcuda_glue_has_indirect(vdev: *mut VirtioDevice) -> bool;
    pub(crate) fn qcuda_glue_set_priv(vdev: *mut VirtioDevice, data: *mut c_void);
    pub(crate) fn qcuda_glue_get_priv(vdev: *mut VirtioDevice) -> *mut c_void;
    pub(crate) fn qcuda_glue_device(vdev: *mut VirtioDevice) -> *mut bindings::device;
    pub(crate) fn qcuda_glue_sg_set_buf(
        sg: *mut bindings::scatterlist,
        buf: *const c_void,
        len: c_uint,
    );
    pub(crate) fn qcuda_glue_sg_set_page(
        sg: *mut bindings::scatterlist,
        page: *mut bindings::page,
        len: c_uint,
        offset: c_uint,
    );
    pub(crate) fn qcuda_glue_page_to_pfn(page: *mut bindings::page) -> c_ulong;
    pub(crate) fn qcuda_glue_alloc_chunk(order: c_uint) -> *mut bindings::page;
    pub(crate) fn qcuda_glue_free_page(page: *mut bindings::page);

    // drivers/virtio (exported)
    pub(crate) fn virtqueue_add_sgs(
        vq: *mut Virtqueue,
        sgs: *mut *mut bindings::scatterlist,
        out_sgs: c_uint,
        in_sgs: c_uint,
        data: *mut c_void,
        gfp: bindings::gfp_t,
    ) -> c_int;
    pub(crate) fn virtqueue_kick(vq: *mut Virtqueue) -> bool;
    pub(crate) fn virtqueue_get_buf(vq: *mut Virtqueue, len: *mut c_uint) -> *mut c_void;
    pub(crate) fn virtqueue_disable_cb(vq: *mut Virtqueue);
    pub(crate) fn virtqueue_enable_cb(vq: *mut Virtqueue) -> bool;
    pub(crate) fn virtqueue_detach_unused_buf(vq: *mut Virtqueue) -> *mut c_void;
    pub(crate) fn virtqueue_get_vring_size(vq: *const Virtqueue) -> c_uint;
    pub(crate) fn virtio_reset_device(vdev: *mut VirtioDevice);
}

/// The registered `struct virtio_driver` (owned by glue.c) for the lifetime of the module.
///
/// # Invariants
///
/// The driver is registered while a value of this type exists.
pub(crate) struct DriverRegistration(());

impl DriverRegistration {
    /// Registers the driver; from here on the virtio core may call probe for device id 56.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: Registering the static driver of glue.c; it is unregistered in `drop`.
        to_result(unsafe { qcuda_glue_register() })?;
        Ok(Self(()))
    }
}

impl Drop for DriverRegistration {
    fn drop(&mut self) {
        // SAFETY: Registered, by the type invariant. This calls remove for every bound device,
        // which completes or fails every request before it returns.
        unsafe { qcuda_glue_unregister() };
    }
}

// SAFETY: The registration is a token for global driver state; dropping it on another thread is
// allowed (unregister_virtio_driver may be called from any process context).
unsafe impl Send for DriverRegistration {}
// SAFETY: `&DriverRegistration` gives access to nothing.
unsafe impl Sync for DriverRegistration {}

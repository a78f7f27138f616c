// SPDX-License-Identifier: GPL-2.0
//! The virtio driver of qcuda.ko: probe, remove and the request queue's interrupt, which glue.c
//! forwards here (`qcuda_rs_*`).
//!
//! Neighbours: virtio.rs is the C edge; device.rs is the device logic
//! (queue, in-flight table, completion) that this file sets up, starts and stops; session.rs
//! provides /dev/qcuda ([`DeviceNode`]), registered once the device works. Like nova-core's
//! driver.rs, this file holds the binding and nothing of the device logic; the raw pointers of
//! the C callbacks end here.
//!
//! A driver instance that goes away (unbind, guest reboot, module unload after a removal) cannot
//! close its sessions on the host: the device is reset before its files are closed. So each new
//! instance starts by sending `DriverReset`, before /dev/qcuda exists and thus before it has any
//! session of its own, and the host closes every session it still holds for this device.

use core::ptr;

use kernel::{
    device::Device,
    error::to_result,
    ffi::{c_int, c_void},
    prelude::*,
    sync::{Arc, SetOnce},
};

use crate::{
    device::QcudaDevice,
    session::DeviceNode,
    virtio::{self, VirtioDevice, Virtqueue},
    wire::{status, MAX_CHAIN_SEGMENTS},
};

/// What probe leaves behind in `vdev->priv`, from before the device is ready until remove.
///
/// The request queue's interrupt uses `device` from the moment the device is ready; `node` is
/// filled in later, once the host has closed the sessions of earlier driver instances.
/// Teardown order is field drop order: `node` first (/dev/qcuda goes away), then `device`.
struct Binding {
    node: SetOnce<Pin<KBox<DeviceNode>>>,
    device: Arc<QcudaDevice>,
}

fn probe(vdev: *mut VirtioDevice) -> Result {
    let mut requests: *mut Virtqueue = ptr::null_mut();
    let mut events: *mut Virtqueue = ptr::null_mut();
    // SAFETY: `vdev` is the device being probed; the out pointers are valid.
    to_result(unsafe { virtio::qcuda_glue_find_vqs(vdev, &mut requests, &mut events) })?;
    let device = match new_device(vdev, requests) {
        Ok(device) => device,
        Err(e) => {
            // SAFETY: The queues were set up above and nothing uses them.
            unsafe { virtio::qcuda_glue_del_vqs(vdev) };
            return Err(e);
        }
    };
    let binding = match KBox::new(
        Binding {
            node: SetOnce::new(),
            device: device.clone(),
        },
        GFP_KERNEL,
    ) {
        Ok(b) => KBox::into_raw(b),
        Err(e) => {
            // Resets the device (not ready yet) and deletes the queues.
            device.stop(vdev);
            return Err(e.into());
        }
    };
    // SAFETY: `vdev` is the device being probed. From here on the request queue's callback
    // reads this pointer; `qcuda_rs_remove` (or the failure path below) frees it only after
    // the reset stopped the callbacks.
    unsafe { virtio::qcuda_glue_set_priv(vdev, binding.cast()) };
    // SAFETY: As above; the queues are set up, so the device may start.
    unsafe { virtio::qcuda_glue_device_ready(vdev) };
    device.start();

    // Before /dev/qcuda exists, so every session the host closes is an earlier instance's.
    match device.reset_host_sessions() {
        Ok(r) if r.status == status::SUCCESS => dev_info!(
            device.dev(),
            "host closed {} session(s) of an earlier driver instance\n",
            r.rets[0]
        ),
        Ok(r) if r.status == status::NOT_SUPPORTED => dev_warn!(
            device.dev(),
            "host does not support DriverReset: sessions of earlier driver instances stay \
             open there until the VM disconnects\n"
        ),
        Ok(r) => dev_warn!(device.dev(), "DriverReset: host status {}\n", r.status),
        Err(e) => dev_warn!(device.dev(), "DriverReset failed: {:?}\n", e),
    }

    let node = KBox::pin_init(DeviceNode::register(device.clone()), GFP_KERNEL);
    // SAFETY: `binding` is valid until remove or the failure path below, and only this probe
    // writes `node` (the callback reads `device` only).
    let populated = node.map(|node| unsafe { (*binding).node.populate(node) });
    if let Err(e) = populated {
        device.stop(vdev);
        // SAFETY: `vdev` is valid; after the reset no callback reads `vdev->priv`.
        unsafe { virtio::qcuda_glue_set_priv(vdev, ptr::null_mut()) };
        // SAFETY: `binding` came from `KBox::into_raw` above and is taken back exactly once.
        drop(unsafe { KBox::from_raw(binding) });
        return Err(e);
    }
    dev_info!(
        device.dev(),
        "/dev/qcuda ready (ring {}, indirect {}, up to {} descriptors per call)\n",
        device.ring_size(),
        device.indirect(),
        device.max_segments()
    );
    Ok(())
}

/// The device state for the request queue `requests` of `vdev`, not ready yet.
fn new_device(vdev: *mut VirtioDevice, requests: *mut Virtqueue) -> Result<Arc<QcudaDevice>> {
    // SAFETY: `requests` is a live virtqueue of `vdev`.
    let ring_size = unsafe { virtio::virtqueue_get_vring_size(requests) } as usize;
    // SAFETY: `vdev` is the device being probed.
    let indirect = unsafe { virtio::qcuda_glue_has_indirect(vdev) };
    // Without indirect descriptors a chain longer than the ring trips a WARN in virtio_ring.
    let max_segments = if indirect {
        MAX_CHAIN_SEGMENTS
    } else {
        ring_size
    };
    // SAFETY: `vdev` is valid, so is its embedded `struct device`; this takes a reference.
    let dev = unsafe { Device::get_device(virtio::qcuda_glue_device(vdev)) };
    if ring_size == 0 {
        return Err(ENODEV);
    }
    QcudaDevice::new(requests, ring_size, indirect, max_segments, dev)
}

/// Called by glue.c when the virtio core binds a device with id 56.
///
/// # Safety
///
/// `vdev` is a device being probed by the virtio core.
#[no_mangle]
pub(crate) unsafe extern "C" fn qcuda_rs_probe(vdev: *mut VirtioDevice) -> c_int {
    match probe(vdev) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// Called by glue.c when the device goes away (unplug, unbind, module unload).
///
/// Nothing is sent to the host: the device may already be gone (unplug), and the sessions of
/// files still open are closed by the host when the next driver instance binds (`DriverReset`)
/// or when the VM disconnects.
///
/// # Safety
///
/// `vdev` is a device this driver probed successfully.
#[no_mangle]
pub(crate) unsafe extern "C" fn qcuda_rs_remove(vdev: *mut VirtioDevice) {
    // SAFETY: `vdev` is valid per the function's contract.
    let raw = unsafe { virtio::qcuda_glue_get_priv(vdev) }.cast::<Binding>();
    if raw.is_null() {
        return;
    }
    // SAFETY: `raw` came from `KBox::into_raw` in `probe` and is still owned by the device.
    let device = unsafe { (*raw).device.clone() };
    // After this no callback runs any more, so nothing reads `vdev->priv`.
    device.stop(vdev);
    // SAFETY: `vdev` is valid.
    unsafe { virtio::qcuda_glue_set_priv(vdev, ptr::null_mut()) };
    // SAFETY: `raw` came from `KBox::into_raw` and is taken back exactly once.
    let binding = unsafe { KBox::from_raw(raw) };
    // Deregisters /dev/qcuda; open files keep `device` and get ENODEV.
    drop(binding);
    device.reap();
    dev_info!(device.dev(), "device removed\n");
}

/// Called by glue.c from the request queue's interrupt with `vdev->priv`.
///
/// # Safety
///
/// `data` is null or the `Binding` that `probe` stored, which `qcuda_rs_remove` frees only
/// after the callbacks have stopped.
#[no_mangle]
pub(crate) unsafe extern "C" fn qcuda_rs_request_done(data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: Per the function's contract. Only `device` is used; probe may be filling in
    // `node` meanwhile, which `SetOnce` allows.
    let binding = unsafe { &*data.cast::<Binding>() };
    binding.device.complete();
}

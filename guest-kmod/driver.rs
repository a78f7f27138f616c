// SPDX-License-Identifier: GPL-2.0
//! The virtio driver of qcuda.ko: probe, remove and the request queue's interrupt, which glue.c
//! forwards here (`qcuda_rs_*`).
//!
//! Neighbours: virtio.rs is the C edge and its safe types; device.rs is the device logic
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
    ffi::{c_int, c_void},
    prelude::*,
    sync::{Arc, SetOnce},
};

use crate::{
    device::QcudaDevice,
    session::DeviceNode,
    virtio::{VirtioDev, VirtioDevice},
    wire::status,
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

fn probe(vdev: &VirtioDev) -> Result {
    let device = QcudaDevice::new(vdev)?;
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
    // SAFETY: From here on the request queue's callback reads this pointer; `qcuda_rs_remove`
    // (or the failure path below) frees it only after the reset stopped the callbacks.
    unsafe { vdev.set_driver_data(binding.cast()) };
    // The queues are set up, so the device may start.
    vdev.ready();
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
        // SAFETY: After the reset no callback reads `vdev->priv`.
        unsafe { vdev.set_driver_data(ptr::null_mut()) };
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

/// Called by glue.c when the virtio core binds a device with id 56.
///
/// # Safety
///
/// `vdev` is a device being probed by the virtio core.
#[no_mangle]
pub(crate) unsafe extern "C" fn qcuda_rs_probe(vdev: *mut VirtioDevice) -> c_int {
    // SAFETY: `vdev` is being probed; the reference ends with this call.
    let vdev = unsafe { VirtioDev::from_raw(vdev) };
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
    // SAFETY: `vdev` is being removed; the reference ends with this call.
    let vdev = unsafe { VirtioDev::from_raw(vdev) };
    let raw = vdev.driver_data().cast::<Binding>();
    if raw.is_null() {
        return;
    }
    // SAFETY: `raw` came from `KBox::into_raw` in `probe` and is still owned by the device.
    let device = unsafe { (*raw).device.clone() };
    // After this no callback runs any more, so nothing reads `vdev->priv`.
    device.stop(vdev);
    // SAFETY: Null is always allowed.
    unsafe { vdev.set_driver_data(ptr::null_mut()) };
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

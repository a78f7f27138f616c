// SPDX-License-Identifier: GPL-2.0
//! qcuda.ko: the guest transport of qcuda.
//!
//! A CUDA application in the guest calls guest-lib (our libcudart.so.13), which turns each
//! CUDA call into a request and hands it to this module through one generic ioctl on
//! /dev/qcuda. The module stamps the caller's session, moves the user buffers (bounce copies
//! or pinned pages), sends one descriptor chain on the request virtqueue of the qcuda virtio
//! device (id 56, `vhost-user-cuda-pci` in QEMU, served by vhost-cuda on the host), sleeps until
//! the chain completes and copies the results back. It knows nothing about CUDA: a new CUDA API
//! never needs a change here.
//!
//! Files, along the data path: session.rs (/dev/qcuda, the ioctl), request.rs (one chain),
//! user_buffer.rs (bounce or pin), host_memory.rs (pages the host maps), device.rs (queue,
//! completion), driver.rs (probe, remove, the C callbacks), virtio.rs (safe types over the C
//! virtio API), process.rs (which process opened each session, for CUDA's process checkpoint)
//! and glue.c (the macros and inlines they need). The wire format is qcuda-proto's wire.rs,
//! included verbatim. See docs/guest.md.

use kernel::prelude::*;

mod device;
mod driver;
mod host_memory;
mod process;
mod request;
mod session;
mod user_buffer;
mod virtio;

/// qcuda-proto's wire format, the one definition shared with guest-lib and vhost-cuda.
#[path = "../qcuda-proto/src/wire.rs"]
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
mod wire;

module! {
    type: QcudaModule,
    name: "qcuda",
    authors: ["The qcuda developers"],
    description: "qcuda: CUDA calls from the guest to the host GPU over virtio",
    license: "GPL",
}

struct QcudaModule {
    _driver: virtio::DriverRegistration,
}

impl kernel::Module for QcudaModule {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        session::seed_session_ids();
        let driver = virtio::DriverRegistration::new()?;
        pr_info!(
            "driver registered (virtio id {}, wire version {})\n",
            wire::VIRTIO_ID_CUDA,
            wire::VERSION
        );
        Ok(Self { _driver: driver })
    }
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
//! qcuda-proto: the single definition of the qcuda wire format and the `/dev/qcuda` ioctl ABI.
//!
//! All definitions live in `wire.rs` (graph node parameter encodings in `graph.rs`), which the guest kernel module includes verbatim with
//! `#[path]`; this crate only re-exports it for the host daemon, guest-lib and qcuda-smi.
#![no_std]

pub mod graph;
mod wire;

pub use wire::*;

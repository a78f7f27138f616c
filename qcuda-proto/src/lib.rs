// SPDX-License-Identifier: Apache-2.0 OR MIT
//! qcuda-proto: the single definition of the qcuda wire format and the `/dev/qcuda` ioctl ABI.
//!
//! The wire definitions live in `wire.rs` (graph node parameter encodings in `graph.rs`), which
//! the guest kernel module includes verbatim with `#[path]`; this crate re-exports it for the
//! host daemon, guest-lib and qcuda-smi. `cuda_errors` is CUDA's own error table and sticky set,
//! which the kernel module, a transport, has no use for.
#![no_std]

pub mod cuda_errors;
pub mod graph;
mod wire;

pub use wire::*;

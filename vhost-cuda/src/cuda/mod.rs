//! The CUDA executor: runs qcuda ops on the host GPU through the CUDA driver API.
//!
//! Above it, the session workers (`crate::session`) hand each validated
//! [`Request`](crate::guest_buffer::Request) of a guest process to that process's
//! [`CudaSession`]; below it is libcuda, loaded at run time through cudarc. [`CudaHost`] is the
//! process-wide part (driver, GPU list), shared by every session.
//!
//! Files, along the data path: `host.rs` (driver and GPUs), `session.rs` (per-process state and
//! the op handlers), `allocations.rs` and `handles.rs` (what a session may touch),
//! `module_image.rs` and `launch.rs` (checking images and launches), `copy.rs` (guest RAM to
//! and from the device), `driver.rs` (the driver calls, behind a trait), `status.rs`
//! (`CUresult` to `cudaError_t`). docs/executor.md describes the design.

mod aligned_bytes;
mod allocations;
mod copy;
mod driver;
mod graveyard;
mod handles;
mod host;
mod launch;
mod module_image;
mod session;
mod status;

#[cfg(test)]
mod fake_driver;
#[cfg(test)]
mod test_kernels;
#[cfg(test)]
mod tests;

pub use host::{CudaHost, HostError};
pub use session::CudaSession;

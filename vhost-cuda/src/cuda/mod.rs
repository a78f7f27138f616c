//! The CUDA executor: runs qcuda ops on the host GPU through the CUDA driver API.
//!
//! Above it, a session's worker process (`crate::worker`) hands each validated
//! [`Request`](crate::guest_buffer::Request) of its guest process to the [`GpuState`]; below
//! it is libcuda, loaded at run time through cudarc. [`CudaHost`] is the process-wide part
//! (driver, GPU list); the daemon keeps one too, to answer the host queries without a context.
//!
//! Files, along the data path: `host.rs` (driver and GPUs), `host_queries.rs` (what is
//! answered from the GPU list), `gpu_state/` (a guest process's GPU state and the op handlers),
//! `allocations.rs` and `handles.rs` (what a session may touch), `module_image.rs` and
//! `launch.rs` (checking images and launches), `host_functions.rs` (host functions run by the
//! guest), `copy.rs` (guest RAM to and from the device), `driver/` (the driver calls behind a
//! trait, the typed handles only it makes, and the test double), `status.rs` (`CUresult` to
//! `cudaError_t`), `trace/` (the GPU timeline recorder: ring, CUPTI, activity records).
//! docs/executor.md describes the design.

mod aligned_bytes;
mod allocations;
mod copy;
mod device_arena;
mod driver;
mod gpu_state;
mod handles;
mod host;
pub mod host_functions;
mod host_mappings;
mod host_queries;
mod launch;
mod module_image;
pub mod precopy;
mod ram_registry;
mod saved_state;
mod status;
pub mod trace;

#[cfg(feature = "fuzzing")]
pub mod fuzzing;
#[cfg(test)]
mod test_kernels;
#[cfg(test)]
mod tests;

pub use device_arena::{AddressSpace, DEFAULT_VA_BASE, DEFAULT_VA_SIZE, VA_ALIGN, VA_END};
pub use gpu_state::{CheckpointError, ExportedRun, GpuState, IpcExported, SaveFigures};
pub use host::{CudaHost, HostError};
pub use host_mappings::reserve_window;

/// The guest-physical runs (address, length) that the GPU of the session whose saved state is
/// `state` can write behind the daemon's map of guest RAM (`SavedState::gpu_written_runs`): a
/// migration's source marks them dirty at its last stop. `state` comes from a worker, and is
/// decoded as any state from elsewhere is.
pub fn gpu_written_guest_ram(state: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    saved_state::SavedState::decode_borrowed(state)
        .map(|(s, _)| s.gpu_written_runs())
        .map_err(|e| e.to_string())
}

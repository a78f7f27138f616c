//! guest-lib: `libcudart.so.13`, qcuda's stand-in for NVIDIA's CUDA runtime inside the guest.
//!
//! An unmodified application built with `nvcc --cudart=shared` loads this library instead of
//! NVIDIA's. Every runtime call becomes requests of the qcuda wire protocol (qcuda-proto), sent
//! as `ioctl`s on `/dev/qcuda` (guest-kmod), which carries them to vhost-cuda on the host, where
//! they run on the GPU. docs/guest-lib.md describes the behaviour; the layers, from the
//! application inwards:
//!
//! - `api/`: the exported C ABI, every symbol of NVIDIA's library declared once.
//! - `launch`, `memory`, `symbols`, `streams`, `events`, `devices`, `host_memory`, `host_fns`:
//!   the runtime semantics, in safe Rust.
//! - `registry`, `fatbin`, `modules`: what static constructors register, and loading it lazily.
//! - `session`, `batch`, `signal_mask`, `transport`: requests, batching fire-and-forget work,
//!   errnos, `EINTR`, sticky errors; the one ioctl.
//! - `generated/`: ABI types and error tables from the CUDA 13.0 headers (gen/bindgen.sh).
//!
//! The crate builds as a staticlib that `build.sh` relinks with `libcudart.map`, so that the
//! shared library exports exactly NVIDIA's symbols under the version node `libcudart.so.13`.

mod warnings;

pub mod allocations;
pub mod api;
pub mod arrays;
pub mod batch;
pub mod call_config;
pub mod capture;
pub mod conv;
pub mod copy;
pub mod copy3d;
pub mod cuda_error;
pub mod device_prop;
pub mod devices;
pub mod driver;
pub mod events;
pub mod fatbin;
pub mod generated;
pub mod graphs;
pub mod handles;
pub mod host_fns;
pub mod host_memory;
pub mod last_error;
pub mod latency;
pub mod launch;
pub mod managed_vars;
pub mod memory;
pub mod modules;
pub mod nvml;
pub mod params;
pub mod pools;
pub mod registry;
pub mod runtime;
pub mod schedule;
pub mod session;
pub mod signal_mask;
pub mod streams;
pub mod symbols;
pub mod transport;

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod fake_arrays;
#[cfg(test)]
mod fake_device;
#[cfg(test)]
mod fake_graphs;

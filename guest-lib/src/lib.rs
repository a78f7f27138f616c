//! guest-lib: `libcudart.so.13`, qcuda's stand-in for NVIDIA's CUDA runtime inside the guest.
//!
//! An unmodified application built with `nvcc --cudart=shared` loads this library instead of
//! NVIDIA's. Every runtime call becomes requests of the qcuda wire protocol (qcuda-proto), sent
//! as `ioctl`s on `/dev/qcuda` (guest-kmod), which carries them to vhost-cuda on the host, where
//! they run on the GPU. docs/guest-lib.md describes the behaviour; the layers, from the
//! application inwards:
//!
//! - `runtime/`: the exported C ABI of `libcudart.so.13`, every symbol of NVIDIA's library
//!   declared once.
//! - `driver/`: the exported C ABI of `libcuda.so.1`, `cuGetProcAddress`, export tables.
//! - `nvml/`: the exported C ABI of `libnvidia-ml.so.1`.
//! - `core/`: beneath the faces, in layers: `transport` (the one ioctl, the session, batching),
//!   the tables of each concept (`devices`, `memory`, `streams`, `modules`, `launch`, `arrays`),
//!   and `runtime`, the process's `Runtime` and the operations both faces call (core/mod.rs).
//! - `generated/`: ABI types and error tables from the CUDA 13.0 headers (gen/bindgen.sh).
//!
//! The crate builds as a staticlib that `build.sh` relinks with `libcudart.map`, so that the
//! shared library exports exactly NVIDIA's symbols under the version node `libcudart.so.13`.

pub mod core;
pub mod driver;
pub mod generated;
pub mod nvml;
pub mod runtime;

#[cfg(test)]
mod api_tests;

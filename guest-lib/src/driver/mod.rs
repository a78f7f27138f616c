//! The driver API face: `libcuda.so.1` in the guest.
//!
//! NVIDIA layers its runtime over its driver: `libcudart` (shared, or linked statically into
//! cuBLAS, cuFFT, PyTorch's extensions and `--cudart=static` programs) finds `libcuda.so.1`,
//! takes every driver entry point through `cuGetProcAddress`, and reaches private helpers
//! through `cuGetExportTable`. This face gives those programs, and programs written against the
//! driver API, the same session, handles and batching as our runtime face (DESIGN.md §6a):
//!
//! - `api/`: the exported `cu*` functions, each declared once (`driver_api!`);
//! - `unsupported.rs`, `symbol_table.rs`: generated from cuda.h's entry points
//!   (gen/driver-symbols.py): stubs for what is not implemented, and every symbol's address;
//! - `proc_address`: `cuGetProcAddress`'s version and flavour rules;
//! - `export_tables`: the private tables, with the runtime's integrity check;
//! - contexts and the per-thread stack are the core's (`core::runtime::context`), shared with the
//!   runtime face's device;
//! - `modules`: modules, functions, libraries and kernels;
//! - `status`: `CUresult` and the mapping from the core's runtime codes.

/// Declares the stubs of driver exports qcuda does not implement: each logs its name once and
/// returns `CUDA_ERROR_NOT_SUPPORTED`. They take no parameters: whatever the caller passes is
/// ignored, which the C calling convention allows.
macro_rules! unsupported {
    ($($name:ident)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported (`CUDA_ERROR_NOT_SUPPORTED`).")]
        #[no_mangle]
        pub extern "C" fn $name() -> $crate::generated::driver_api::CUresult {
            static ONCE: ::std::sync::atomic::AtomicBool = ::std::sync::atomic::AtomicBool::new(false);
            $crate::driver::status::not_supported(stringify!($name), &ONCE)
        }
    )*};
}

#[macro_use]
pub mod api;
pub mod export_tables;
pub mod modules;
pub mod proc_address;
pub mod status;
pub mod symbol_table;
pub mod trace;
#[allow(non_snake_case)]
pub mod unsupported;

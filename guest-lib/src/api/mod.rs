//! The exported C ABI: every function NVIDIA's `libcudart.so.13` exports, declared once.
//!
//! This is the unsafe edge of guest-lib. Each function here converts raw pointers and C types
//! into the safe internal API (memory.rs, launch.rs, streams.rs, ...) and its result back into a
//! `cudaError_t`. Functions returning `cudaError_t` are written with [`cuda_api!`], which records
//! failures as the thread's last error; the few with other return types (`cudaGetErrorString`,
//! `__cudaRegisterFatBinary`, `cudaCreateChannelDesc`, ...) are written out and say so. Every
//! export qcuda does not implement yet is in `unsupported.rs` and returns
//! `cudaErrorNotSupported`. The symbol test (tests/exported_symbols.rs) checks the built library
//! against `gen/exports.txt`, so none can go missing.
#![allow(non_snake_case)]

/// Declares exported functions that return `cudaError_t`.
///
/// The body is an `unsafe fn` returning `CudaResult<()>`; the generated export runs it and turns
/// its result into the return value, recording a failure as the calling thread's last error.
macro_rules! cuda_api {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments must be valid as the CUDA runtime API documents for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::generated::cudaError_t {
            #[allow(clippy::too_many_arguments)]
            unsafe fn body($($arg: $ty),*) -> $crate::cuda_error::CudaResult<()> $body
            // SAFETY: `body` has exactly this function's contract, which our caller upholds.
            $crate::last_error::finish(unsafe { body($($arg),*) })
        }
    )*};
}

/// Writes `value` through an out-parameter, or fails with `cudaErrorInvalidValue` for null.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn write_out<T>(out: *mut T, value: T) -> crate::cuda_error::CudaResult<()> {
    crate::runtime::non_null(out)?;
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

pub mod arrays;
pub mod devices;
pub mod errors;
pub mod events;
pub mod graphs;
pub mod launch;
pub mod launch_ex;
pub mod memory;
pub mod pools;
pub mod profiler;
pub mod registration;
pub mod stream_attrs;
pub mod streams;
pub mod symbols;
pub mod texture;
pub mod unsupported;

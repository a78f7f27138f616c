//! The exported C ABI: every function NVIDIA's `libcudart.so.13` exports, declared once.
//!
//! This is the unsafe edge of guest-lib. Each function here converts raw pointers and C types
//! into the safe internal API (memory.rs, launch.rs, streams.rs, ...) and its result back into a
//! `cudaError_t`. Functions returning `cudaError_t` are written with [`cuda_api!`], which records
//! failures as the thread's last error; the few that return something else and never fail
//! (`cudaGetErrorString`, `cudaCreateChannelDesc`, ...) with [`plain_api!`]. Both macros check
//! each signature against bindgen's prototype from `cuda_runtime_api.h` at compile time. The
//! hidden registration functions (`__cudaRegisterFatBinary`, ...), which no C header declares,
//! are written out. Every export qcuda does not implement yet is in `unsupported.rs` and returns
//! `cudaErrorNotSupported`. The symbol test (tests/exported_symbols.rs) checks the built library
//! against `gen/exports.txt`, so none can go missing.
#![allow(non_snake_case)]

/// Declares exported functions that return `cudaError_t`.
///
/// The body is an `unsafe fn` returning `CudaResult<()>`; the generated export runs it and turns
/// its result into the return value, recording a failure as the calling thread's last error.
///
/// Each export's signature is checked at compile time against the prototype bindgen generated
/// from `cuda_runtime_api.h` (`generated::runtime_api`): a parameter or return type that differs
/// from the header's fails the build. Two markers may follow the doc comment, in this order:
/// - `#[per_thread(name_ptsz)]` also exports the per-thread-default-stream spelling (`_ptsz` or
///   `_ptds`) as the same function, checked against its own prototype. qcuda maps that stream
///   to the legacy one (streams.rs), so the two spellings behave alike.
/// - `#[no_prototype = "why"]` skips the checks, for the functions no header of the wheels
///   declares in C (the hidden `__cuda*` API).
macro_rules! cuda_api {
    (@export [$($doc:literal)*] $name:ident ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments must be valid as the CUDA runtime API documents for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::generated::cudaError_t {
            #[allow(clippy::too_many_arguments)]
            unsafe fn body($($arg: $ty),*) -> $crate::core::cuda_error::CudaResult<()> $body
            // SAFETY: `body` has exactly this function's contract, which our caller upholds.
            let code = $crate::core::last_error::finish(unsafe { body($($arg),*) });
            $crate::core::warnings::exported(stringify!($name), code);
            code
        }
    };
    (@per_thread [] [$($why:literal)?] $name:ident $params:tt) => {};
    (@per_thread [$twin:ident] [$($why:literal)?] $name:ident
        ($($arg:ident: $ty:ty),* $(,)?)) => {
        #[doc = concat!("`", stringify!($name), "` (per-thread default stream).")]
        ///
        /// # Safety
        #[doc = concat!("As for `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $twin($($arg: $ty),*) -> $crate::generated::cudaError_t {
            // SAFETY: the same function and contract, which our caller upholds.
            unsafe { $name($($arg),*) }
        }
        cuda_api!(@prototype [$($why)?] $twin ($($arg: $ty),*));
    };
    (@prototype [] $name:ident ($($arg:ident: $ty:ty),* $(,)?)) => {
        const _: unsafe extern "C" fn($($ty),*) -> $crate::generated::cudaError_t =
            $crate::generated::runtime_api::$name;
    };
    (@prototype [$why:literal] $name:ident $params:tt) => {};
    ($(
        $(#[doc = $doc:literal])*
        $(#[per_thread($twin:ident)])?
        $(#[no_prototype = $why:literal])?
        fn $name:ident $params:tt $body:block
    )*) => {$(
        cuda_api!(@export [$($doc)*] $name $params $body);
        cuda_api!(@prototype [$($why)?] $name $params);
        cuda_api!(@per_thread [$($twin)?] [$($why)?] $name $params);
    )*};
}

/// Declares safe exports that return something other than `cudaError_t` (a string, a struct by
/// value) and never fail, so record no error. Their signatures are checked against the header's
/// prototypes as [`cuda_api!`]'s are.
macro_rules! plain_api {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block
    )*) => {$(
        $(#[doc = $doc])*
        #[no_mangle]
        pub extern "C" fn $name($($arg: $ty),*) -> $ret $body

        const _: unsafe extern "C" fn($($ty),*) -> $ret = $crate::generated::runtime_api::$name;
    )*};
}

/// Writes `value` through an out-parameter, or fails with `cudaErrorInvalidValue` for null.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn write_out<T>(out: *mut T, value: T) -> crate::core::cuda_error::CudaResult<()> {
    crate::core::runtime::non_null(out)?;
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

pub mod arrays;
pub mod devices;
pub mod driver_interop;
pub mod errors;
pub mod events;
pub mod graphs;
pub mod ipc;
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
pub mod user_objects;

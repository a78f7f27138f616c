//! Error reporting: `cudaGetLastError`, `cudaPeekAtLastError`, `cudaGetErrorName`,
//! `cudaGetErrorString`. None of them records an error itself or needs the device.

use core::ffi::c_char;

use crate::{core::cuda_error, core::last_error, generated::cudaError_t};

plain_api! {
    /// `cudaGetLastError`: the thread's last error, reset to `cudaSuccess`. As with NVIDIA's
    /// 13.0 runtime, a sticky error is not special here: the context stays broken, so every
    /// call that needs it fails again and records it again, but reading the variable clears it.
    fn cudaGetLastError() -> cudaError_t {
        last_error::take()
    }

    /// `cudaPeekAtLastError`: the thread's last error, not reset.
    fn cudaPeekAtLastError() -> cudaError_t {
        last_error::peek()
    }

    /// `cudaGetErrorName`: returns `const char *` (not a `cudaError_t`); never fails. Unknown
    /// codes give "unrecognized error code", as NVIDIA's runtime does.
    fn cudaGetErrorName(error: cudaError_t) -> *const c_char {
        cuda_error::error_name(error).as_ptr()
    }

    /// `cudaGetErrorString`: returns `const char *` (not a `cudaError_t`); never fails. The text
    /// is the first sentence of the code's documentation in driver_types.h.
    fn cudaGetErrorString(error: cudaError_t) -> *const c_char {
        cuda_error::error_string(error).as_ptr()
    }
}

//! ABI types and tables generated from the CUDA 13.0 headers by `gen/bindgen.sh`.
//!
//! Nothing here is written by hand except this file: `cuda_types.rs` is bindgen output
//! (cudaError_t and the other enums as consts with CUDA's own names, dim3, cudaDeviceProp, ...),
//! `error_table.rs` lists every `cudaError_t` with its name and description.

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_debug_implementations,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn
)]
mod cuda_types;
mod error_table;

use std::ffi::CStr;

pub use cuda_types::*;
pub use error_table::ERRORS;

/// One `cudaError_t` value as documented in driver_types.h.
#[derive(Debug)]
pub struct ErrorEntry {
    /// The numeric code.
    pub code: u32,
    /// The enumerator, e.g. `cudaErrorNoDevice`.
    pub name: &'static CStr,
    /// The first sentence of the header's documentation of the code.
    pub description: &'static CStr,
}

impl PartialEq for dim3 {
    fn eq(&self, other: &Self) -> bool {
        (self.x, self.y, self.z) == (other.x, other.y, other.z)
    }
}
impl Eq for dim3 {}

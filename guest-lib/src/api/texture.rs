//! The one texture-side function that is pure arithmetic: `cudaCreateChannelDesc`. It returns
//! a 20-byte struct by value (through a hidden pointer in the SysV ABI), so it could not share
//! the not-supported stub's signature; it is implemented instead. Texture and surface objects
//! themselves are not supported yet.

use core::ffi::c_int;

use crate::generated::{cudaChannelFormatDesc, cudaChannelFormatKind};

/// `cudaCreateChannelDesc`: returns `cudaChannelFormatDesc` by value, never fails.
#[no_mangle]
pub extern "C" fn cudaCreateChannelDesc(
    x: c_int,
    y: c_int,
    z: c_int,
    w: c_int,
    f: cudaChannelFormatKind,
) -> cudaChannelFormatDesc {
    cudaChannelFormatDesc { x, y, z, w, f }
}

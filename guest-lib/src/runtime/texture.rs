//! Texture and surface objects, and `cudaCreateChannelDesc`.
//!
//! `cudaCreateChannelDesc` is pure arithmetic and returns a 20-byte struct by value (through a
//! hidden pointer in the SysV ABI), so it is a `plain_api!` rather than a `cuda_api!`. The
//! objects are the driver's own values (kernels take them as arguments); arrays.rs keeps what
//! each was created with for the `cudaGet*` queries.

use core::ffi::c_int;

use super::write_out;
use crate::{
    core::runtime::non_null,
    core::runtime::objects as ops,
    generated::{
        cudaChannelFormatDesc, cudaChannelFormatKind, cudaResourceDesc, cudaResourceViewDesc,
        cudaSurfaceObject_t, cudaTextureDesc, cudaTextureObject_t,
    },
};

plain_api! {
    /// `cudaCreateChannelDesc`: returns `cudaChannelFormatDesc` by value, never fails.
    fn cudaCreateChannelDesc(
        x: c_int,
        y: c_int,
        z: c_int,
        w: c_int,
        f: cudaChannelFormatKind,
    ) -> cudaChannelFormatDesc {
        cudaChannelFormatDesc { x, y, z, w, f }
    }
}

cuda_api! {
    /// `cudaCreateTextureObject`: array, mipmapped array, linear and pitch-2D resources.
    fn cudaCreateTextureObject(
        pTexObject: *mut cudaTextureObject_t,
        pResDesc: *const cudaResourceDesc,
        pTexDesc: *const cudaTextureDesc,
        pResViewDesc: *const cudaResourceViewDesc,
    ) {
        non_null(pTexObject)?;
        non_null(pResDesc)?;
        non_null(pTexDesc)?;
        // SAFETY: non-null and readable (API contract); the view is null or readable.
        let (res, tex, view) = unsafe { (*pResDesc, *pTexDesc, pResViewDesc.as_ref()) };
        let obj = ops::create_texture(&res, &tex, view)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pTexObject, obj) }
    }

    /// `cudaDestroyTextureObject`: only objects this process created.
    fn cudaDestroyTextureObject(texObject: cudaTextureObject_t) {
        ops::destroy(texObject, false)
    }

    /// `cudaGetTextureObjectResourceDesc`.
    fn cudaGetTextureObjectResourceDesc(pResDesc: *mut cudaResourceDesc, texObject: cudaTextureObject_t) {
        non_null(pResDesc)?;
        let r = ops::resource(texObject, false)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pResDesc, r) }
    }

    /// `cudaGetTextureObjectTextureDesc`.
    fn cudaGetTextureObjectTextureDesc(pTexDesc: *mut cudaTextureDesc, texObject: cudaTextureObject_t) {
        non_null(pTexDesc)?;
        let t = ops::texture(texObject)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pTexDesc, t) }
    }

    /// `cudaGetTextureObjectResourceViewDesc`: all zero when the object has no view.
    fn cudaGetTextureObjectResourceViewDesc(
        pResViewDesc: *mut cudaResourceViewDesc,
        texObject: cudaTextureObject_t,
    ) {
        non_null(pResViewDesc)?;
        let v = ops::view(texObject)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pResViewDesc, v) }
    }

    /// `cudaCreateSurfaceObject`: over an array made with `cudaArraySurfaceLoadStore`.
    fn cudaCreateSurfaceObject(pSurfObject: *mut cudaSurfaceObject_t, pResDesc: *const cudaResourceDesc) {
        non_null(pSurfObject)?;
        non_null(pResDesc)?;
        // SAFETY: non-null and readable (API contract).
        let res = unsafe { *pResDesc };
        let obj = ops::create_surface(&res)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pSurfObject, obj) }
    }

    /// `cudaDestroySurfaceObject`: only objects this process created.
    fn cudaDestroySurfaceObject(surfObject: cudaSurfaceObject_t) {
        ops::destroy(surfObject, true)
    }

    /// `cudaGetSurfaceObjectResourceDesc`.
    fn cudaGetSurfaceObjectResourceDesc(pResDesc: *mut cudaResourceDesc, surfObject: cudaSurfaceObject_t) {
        non_null(pResDesc)?;
        let r = ops::resource(surfObject, true)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pResDesc, r) }
    }
}

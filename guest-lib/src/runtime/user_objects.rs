//! User objects (`cudaUserObjectCreate`, `cudaUserObjectRetain`, `cudaUserObjectRelease`,
//! `cudaGraphRetainUserObject`, `cudaGraphReleaseUserObject`): the core's `user_objects.rs`,
//! which the driver face shares.

use core::ffi::{c_uint, c_void};

use super::write_out;
use crate::{
    core::runtime::user_objects as uo,
    generated::{cudaGraph_t, cudaHostFn_t, runtime_api::cudaUserObject_t},
};

cuda_api! {
    /// `cudaUserObjectCreate`: `destroy(ptr)` runs when the last reference goes.
    fn cudaUserObjectCreate(object_out: *mut cudaUserObject_t, ptr: *mut c_void, destroy: cudaHostFn_t, initialRefcount: c_uint, flags: c_uint) {
        crate::core::runtime::non_null(object_out)?;
        let h = uo::create(ptr, destroy, initialRefcount, flags)?;
        // SAFETY: checked non-null (API contract: writable).
        unsafe { write_out(object_out, h as cudaUserObject_t) }
    }

    /// `cudaUserObjectRetain`.
    fn cudaUserObjectRetain(object: cudaUserObject_t, count: c_uint) {
        uo::retain(object as usize, count)
    }

    /// `cudaUserObjectRelease`.
    fn cudaUserObjectRelease(object: cudaUserObject_t, count: c_uint) {
        uo::release(object as usize, count)
    }

    /// `cudaGraphRetainUserObject`.
    fn cudaGraphRetainUserObject(graph: cudaGraph_t, object: cudaUserObject_t, count: c_uint, flags: c_uint) {
        uo::graph_retain(graph as u64, object as usize, count, flags)
    }

    /// `cudaGraphReleaseUserObject`.
    fn cudaGraphReleaseUserObject(graph: cudaGraph_t, object: cudaUserObject_t, count: c_uint) {
        uo::graph_release(graph as u64, object as usize, count)
    }
}

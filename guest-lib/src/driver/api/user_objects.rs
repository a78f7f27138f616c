//! User objects on the driver face (`cuUserObjectCreate`, `cuUserObjectRetain`,
//! `cuUserObjectRelease`, `cuGraphRetainUserObject`, `cuGraphReleaseUserObject`) over the
//! core's `user_objects.rs`, which the runtime face shares: a `CUuserObject` is a
//! `cudaUserObject_t`.

use core::ffi::{c_uint, c_void};

use super::{initialized, out};
use crate::{
    core::runtime::user_objects as uo, driver::status::DrvResult, generated::driver_api as d,
};

fn ready() -> DrvResult<()> {
    initialized()
}

driver_api! {
    /// `cuUserObjectCreate`: `destroy(ptr)` runs when the last reference goes.
    fn cuUserObjectCreate(object_out: *mut d::CUuserObject, ptr: *mut c_void, destroy: d::CUhostFn, initialRefcount: c_uint, flags: c_uint) {
        ready()?;
        if object_out.is_null() {
            return Err(crate::driver::status::DriverError::INVALID_VALUE);
        }
        let h = uo::create(ptr, destroy, initialRefcount, flags)?;
        // SAFETY: checked non-null (API contract: writable).
        unsafe { out(object_out, h as d::CUuserObject) }
    }

    /// `cuUserObjectRetain`.
    fn cuUserObjectRetain(object: d::CUuserObject, count: c_uint) {
        ready()?;
        Ok(uo::retain(object as usize, count)?)
    }

    /// `cuUserObjectRelease`.
    fn cuUserObjectRelease(object: d::CUuserObject, count: c_uint) {
        ready()?;
        Ok(uo::release(object as usize, count)?)
    }

    /// `cuGraphRetainUserObject`.
    fn cuGraphRetainUserObject(graph: d::CUgraph, object: d::CUuserObject, count: c_uint, flags: c_uint) {
        ready()?;
        Ok(uo::graph_retain(graph as u64, object as usize, count, flags)?)
    }

    /// `cuGraphReleaseUserObject`.
    fn cuGraphReleaseUserObject(graph: d::CUgraph, object: d::CUuserObject, count: c_uint) {
        ready()?;
        Ok(uo::graph_release(graph as u64, object as usize, count)?)
    }
}

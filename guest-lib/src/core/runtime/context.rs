//! The driver face's contexts as the runtime sees them: which one is current on the calling
//! thread, whether a primary context is active, and context-local storage by the handle a call
//! names. The records and each thread's stack are `devices::context`'s (re-exported here, so the
//! driver face reaches all of contexts through this module); what needs the session's state (a
//! device's flags, whether the session uses a device) is added here.

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    devices::{self, context as records},
    runtime::runtime_if_connected,
    transport::session::MAX_DEVICES_U32,
};

pub use records::{
    create, destroy, lookup, pop, primary, primary_reset, push, release_primary, retain_primary,
    runtime_set_device, set_current, Context, StorageDtor,
};

/// Whether the primary context of `device` is active: retained through the driver API,
/// initialised by the runtime face (`cudaSetDevice`, or any call that works on the device), or
/// in use by the session (it has the device's host context).
pub fn primary_active(device: u32) -> bool {
    records::retained(device)
        || runtime_if_connected()
            .is_some_and(|rt| rt.devices.primary_active(device) || rt.session.has_context(device))
}

/// The `CU_CTX_*` flags of `ctx` (a primary context's are its device's).
pub fn flags(ctx: &Context) -> u32 {
    ctx.flags(runtime_if_connected().map(|rt| &rt.devices))
}

/// Sets the `CU_CTX_*` flags of `ctx`.
pub fn set_flags(ctx: &Context, flags: u32) {
    ctx.set_flags(runtime_if_connected().map(|rt| &rt.devices), flags);
}

/// The calling thread's current context, if any.
pub fn current() -> Option<&'static Context> {
    if let Some(top) = records::top() {
        return Some(top);
    }
    let device = devices::current();
    (device < MAX_DEVICES_U32 && primary_active(device)).then(|| primary(device))
}

/// The calling thread's current context, or `CUDA_ERROR_INVALID_CONTEXT`.
pub fn require_current() -> CudaResult<&'static Context> {
    let ctx = current().ok_or(CudaError::INVALID_CONTEXT)?;
    devices::set_current(ctx.device);
    Ok(ctx)
}

/// The context a storage call names: null means the calling thread's current one.
fn storage_context(ctx: usize) -> CudaResult<usize> {
    if ctx == 0 {
        Ok(require_current()?.handle())
    } else {
        Ok(lookup(ctx)?.handle())
    }
}

/// Stores `value` under (`ctx`, `key`), replacing what was there.
pub fn storage_put(ctx: usize, key: usize, value: usize, dtor: StorageDtor) -> CudaResult<()> {
    records::storage_insert(storage_context(ctx)?, key, value, dtor);
    Ok(())
}

/// Removes (`ctx`, `key`) without running its destructor.
pub fn storage_delete(ctx: usize, key: usize) -> CudaResult<()> {
    records::storage_remove(storage_context(ctx)?, key)
        .then_some(())
        .ok_or(CudaError::INVALID_RESOURCE_HANDLE)
}

/// The value under (`ctx`, `key`): `CUDA_ERROR_INVALID_HANDLE` when there is none.
pub fn storage_get(ctx: usize, key: usize) -> CudaResult<usize> {
    // NVIDIA's runtime reads its entry of a named context on nearly every call. A context's
    // entries go when it is destroyed or reset, so an entry found proves the context live: the
    // lookup that tells which error a miss is comes only after a miss.
    if ctx != 0 {
        if let Some(v) = records::storage_value(ctx, key) {
            return Ok(v);
        }
    }
    records::storage_value(storage_context(ctx)?, key).ok_or(CudaError::INVALID_RESOURCE_HANDLE)
}

#[cfg(test)]
mod tests {
    use core::ffi::c_void;
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn stack_and_runtime_device_follow_each_other() {
        pop().unwrap_err();
        let a = create(0, 4);
        assert!(std::ptr::eq(current().unwrap(), a));
        assert_eq!(flags(a), 4);
        push(primary(1));
        assert_eq!(devices::current(), 1);
        assert!(std::ptr::eq(pop().unwrap(), primary(1)));
        assert_eq!(devices::current(), 0);
        runtime_set_device(1);
        assert!(std::ptr::eq(current().unwrap(), primary(1)));
        set_current(Some(a));
        destroy(a).unwrap();
        assert_eq!(
            lookup(a.handle()).map(Context::handle),
            Err(CudaError::CONTEXT_IS_DESTROYED)
        );
        lookup(primary(3).handle()).unwrap();
        lookup(0).unwrap_err();
    }

    #[test]
    fn storage_is_per_context_and_destructors_run_on_destroy() {
        use std::sync::atomic::AtomicUsize;
        static RAN: AtomicUsize = AtomicUsize::new(0);
        unsafe extern "C" fn dtor(_: usize, _: *mut c_void, value: *mut c_void) {
            RAN.fetch_add(value as usize, Ordering::Relaxed);
        }
        let a = create(0, 0);
        storage_put(0, 7, 40, Some(dtor)).unwrap();
        storage_put(a.handle(), 8, 2, Some(dtor)).unwrap();
        assert_eq!(storage_get(0, 7).unwrap(), 40);
        assert_eq!(
            storage_get(primary(0).handle(), 7),
            Err(CudaError::INVALID_RESOURCE_HANDLE)
        );
        storage_delete(0, 8).unwrap();
        assert_eq!(storage_get(0, 8), Err(CudaError::INVALID_RESOURCE_HANDLE));
        storage_put(0, 9, 2, Some(dtor)).unwrap();
        destroy(a).unwrap();
        assert_eq!(RAN.load(Ordering::Relaxed), 42);
    }
}

//! Driver contexts: each device's primary context, contexts made with `cuCtxCreate`, every
//! thread's context stack, and context-local storage.
//!
//! On the host a session has one CUDA context per device, the device's primary context, which
//! the worker makes when the session first uses the device. The guest's contexts are handles
//! over it: the primary context of device `d` (shared with our runtime face, as NVIDIA's runtime
//! shares it with the driver) and any number of created ones, which all run on that same host
//! context. A created context therefore shares memory, modules and streams with the primary one
//! of its device (docs/guest-lib.md, "Driver API"); what the driver API lets a program observe of
//! a context (its device, flags, id, API version, the stack, its local storage, that it was
//! destroyed) is kept here, per handle.
//!
//! A thread's current context is the top of its stack. With an empty stack, the runtime face's
//! implicit context counts: the primary context of the thread's current device once the session
//! uses that device, as with NVIDIA's runtime. Changing the current context changes the runtime
//! face's current device (`devices::set_current`), so both faces always agree.

use std::{
    cell::RefCell,
    collections::HashMap,
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        Mutex, PoisonError,
    },
};

use core::ffi::c_void;

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    devices,
    runtime::runtime_if_connected,
    session::{MAX_DEVICES, MAX_DEVICES_U32},
};

/// One driver context.
#[derive(Debug)]
pub struct Context {
    /// The device it runs on.
    pub device: u32,
    /// Whether this is the device's primary context.
    pub primary: bool,
    /// `cuCtxGetId`: unique in the process.
    pub id: u64,
    /// `CU_CTX_*` flags of a created context (a primary context's are the device's).
    flags: AtomicU32,
}

impl Context {
    /// The handle the application sees.
    pub fn handle(&'static self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// `CU_CTX_*` flags.
    pub fn flags(&self) -> u32 {
        if self.primary {
            runtime_if_connected().map_or(0, |rt| rt.devices.flags(self.device))
        } else {
            self.flags.load(Ordering::Relaxed)
        }
    }

    /// Sets the `CU_CTX_*` flags.
    pub fn set_flags(&self, flags: u32) {
        if self.primary {
            if let Some(rt) = runtime_if_connected() {
                rt.devices.set_flags(self.device, flags);
            }
        } else {
            self.flags.store(flags, Ordering::Relaxed);
        }
    }
}

const fn primary_context(device: u32) -> Context {
    Context {
        device,
        primary: true,
        id: device as u64 + 1,
        flags: AtomicU32::new(0),
    }
}

static PRIMARY: [Context; MAX_DEVICES] = {
    let mut all = [const { primary_context(0) }; MAX_DEVICES];
    let mut d = 0;
    while d < MAX_DEVICES {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "d < MAX_DEVICES, a small count"
        )]
        let ordinal = d as u32;
        all[d] = primary_context(ordinal);
        d += 1;
    }
    all
};
/// Retain counts of the primary contexts (`cuDevicePrimaryCtxRetain`/`Release`).
static RETAINED: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
/// Live created contexts, by handle.
static CREATED: Mutex<Vec<&'static Context>> = Mutex::new(Vec::new());
/// Destroyed ones: `CUDA_ERROR_CONTEXT_IS_DESTROYED` for them, as NVIDIA's driver answers.
static DESTROYED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(MAX_DEVICES as u64 + 1);

thread_local! {
    static STACK: RefCell<Vec<&'static Context>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on the calling thread's stack; `None` once the thread's locals are destroyed
/// (libraries' destructors at `exit()` still call the driver: they see an empty stack).
fn with_stack<R>(f: impl FnOnce(&mut Vec<&'static Context>) -> R) -> Option<R> {
    STACK.try_with(|s| f(&mut s.borrow_mut())).ok()
}

fn created() -> std::sync::MutexGuard<'static, Vec<&'static Context>> {
    CREATED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The primary context of `device` (already validated).
pub fn primary(device: u32) -> &'static Context {
    &PRIMARY[(device as usize).min(MAX_DEVICES - 1)]
}

/// The context behind a handle: `CUDA_ERROR_INVALID_CONTEXT` for null or unknown ones.
pub fn lookup(handle: usize) -> CudaResult<&'static Context> {
    if let Some(c) = PRIMARY.iter().find(|c| c.handle() == handle) {
        return Ok(c);
    }
    if let Some(c) = created().iter().copied().find(|c| c.handle() == handle) {
        return Ok(c);
    }
    if DESTROYED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&handle)
    {
        return Err(CudaError::CONTEXT_IS_DESTROYED);
    }
    Err(CudaError::INVALID_CONTEXT)
}

/// Whether the primary context of `device` is active: retained through the driver API,
/// initialised by the runtime face (`cudaSetDevice`, or any call that works on the device), or
/// in use by the session (it has the device's host context).
pub fn primary_active(device: u32) -> bool {
    RETAINED
        .get(device as usize)
        .is_some_and(|r| r.load(Ordering::Relaxed) > 0)
        || runtime_if_connected()
            .is_some_and(|rt| rt.devices.primary_active(device) || rt.session.has_context(device))
}

/// The flags of the calling thread's current context if it is one the driver face created (not
/// a primary context) and runs on `device`.
pub fn created_current_flags(device: u32) -> Option<u32> {
    with_stack(|s| s.last().copied())
        .flatten()
        .filter(|c| !c.primary && c.device == device)
        .map(|c| c.flags())
}

/// The calling thread's current context, if any.
pub fn current() -> Option<&'static Context> {
    if let Some(top) = with_stack(|s| s.last().copied()).flatten() {
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

fn follow(top: Option<&'static Context>) {
    if let Some(c) = top {
        devices::set_current(c.device);
    }
}

/// `cuCtxSetCurrent`: replaces the top of the stack (null pops it).
pub fn set_current(ctx: Option<&'static Context>) {
    let top = with_stack(|s| {
        s.pop();
        if let Some(c) = ctx {
            s.push(c);
        }
        s.last().copied()
    });
    follow(top.flatten());
}

/// `cuCtxPushCurrent`.
pub fn push(ctx: &'static Context) {
    with_stack(|s| s.push(ctx));
    follow(Some(ctx));
}

/// `cuCtxPopCurrent`: the popped context, `CUDA_ERROR_INVALID_CONTEXT` with an empty stack.
pub fn pop() -> CudaResult<&'static Context> {
    let (popped, top) = with_stack(|s| (s.pop(), s.last().copied())).unwrap_or((None, None));
    follow(top);
    popped.ok_or(CudaError::INVALID_CONTEXT)
}

/// The runtime face changed the thread's device (`cudaSetDevice`): as with NVIDIA's runtime,
/// that device's primary context replaces whatever context the thread had current.
pub fn runtime_set_device(device: u32) {
    let _ = STACK.try_with(|s| {
        if let Some(top) = s.borrow_mut().last_mut() {
            *top = primary(device);
        }
    });
}

/// `cuCtxCreate`: a new context on `device`, made current.
pub fn create(device: u32, flags: u32) -> &'static Context {
    let ctx: &'static Context = Box::leak(Box::new(Context {
        device,
        primary: false,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        flags: AtomicU32::new(flags),
    }));
    created().push(ctx);
    push(ctx);
    ctx
}

/// `cuCtxDestroy` of a created context: its local storage's destructors run, it leaves the
/// calling thread's stack, and its handle stops being valid. (Its record stays allocated, so a
/// racing use of the stale handle reads valid memory and fails the lookup.)
pub fn destroy(ctx: &'static Context) -> CudaResult<()> {
    if ctx.primary {
        return Err(CudaError::INVALID_CONTEXT);
    }
    created().retain(|c| !std::ptr::eq(*c, ctx));
    DESTROYED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(ctx.handle());
    let top = with_stack(|s| {
        s.retain(|c| !std::ptr::eq(*c, ctx));
        s.last().copied()
    });
    follow(top.flatten());
    storage_destroyed(ctx.handle());
    Ok(())
}

/// `cuDevicePrimaryCtxRetain`.
pub fn retain_primary(device: u32) -> &'static Context {
    if let Some(r) = RETAINED.get(device as usize) {
        r.fetch_add(1, Ordering::Relaxed);
    }
    primary(device)
}

/// `cuDevicePrimaryCtxRelease`: `CUDA_ERROR_INVALID_CONTEXT` when not retained.
pub fn release_primary(device: u32) -> CudaResult<()> {
    let r = RETAINED
        .get(device as usize)
        .ok_or(CudaError::INVALID_DEVICE)?;
    r.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .map(drop)
        .map_err(|_| CudaError::INVALID_CONTEXT)
}

/// The primary context of `device` was reset: its local storage's destructors run.
pub fn primary_reset(device: u32) {
    storage_destroyed(primary(device).handle());
}

/// A destructor of context-local storage: `(context, key, value)`.
pub type StorageDtor = Option<unsafe extern "C" fn(usize, *mut c_void, *mut c_void)>;

#[derive(Clone, Copy)]
struct Stored {
    value: usize,
    dtor: StorageDtor,
}

/// Context-local storage: values keyed by (context, key), for NVIDIA's runtime and libraries
/// (export table c693336e...). Kept in the guest: nothing of it concerns the host.
static STORAGE: Mutex<Option<HashMap<(usize, usize), Stored>>> = Mutex::new(None);

fn with_storage<R>(f: impl FnOnce(&mut HashMap<(usize, usize), Stored>) -> R) -> R {
    let mut guard = STORAGE.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(HashMap::new))
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
    let ctx = storage_context(ctx)?;
    with_storage(|s| s.insert((ctx, key), Stored { value, dtor }));
    Ok(())
}

/// Removes (`ctx`, `key`) without running its destructor.
pub fn storage_delete(ctx: usize, key: usize) -> CudaResult<()> {
    let ctx = storage_context(ctx)?;
    with_storage(|s| s.remove(&(ctx, key)))
        .map(drop)
        .ok_or(CudaError::INVALID_RESOURCE_HANDLE)
}

/// The value under (`ctx`, `key`): `CUDA_ERROR_INVALID_HANDLE` when there is none.
pub fn storage_get(ctx: usize, key: usize) -> CudaResult<usize> {
    let ctx = storage_context(ctx)?;
    with_storage(|s| s.get(&(ctx, key)).map(|v| v.value)).ok_or(CudaError::INVALID_RESOURCE_HANDLE)
}

/// Runs and drops every destructor stored for `ctx` (outside the lock: they may call back).
fn storage_destroyed(ctx: usize) {
    let gone: Vec<((usize, usize), Stored)> = with_storage(|s| {
        let keys: Vec<_> = s.keys().filter(|(c, _)| *c == ctx).copied().collect();
        keys.into_iter()
            .filter_map(|k| s.remove(&k).map(|v| (k, v)))
            .collect()
    });
    for ((ctx, key), stored) in gone {
        if let Some(dtor) = stored.dtor {
            // SAFETY: the application registered `dtor` for exactly these arguments.
            unsafe { dtor(ctx, key as *mut c_void, stored.value as *mut c_void) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_and_runtime_device_follow_each_other() {
        pop().unwrap_err();
        let a = create(0, 4);
        assert!(std::ptr::eq(current().unwrap(), a));
        assert_eq!(a.flags(), 4);
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

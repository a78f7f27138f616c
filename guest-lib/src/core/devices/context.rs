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
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        Mutex, PoisonError,
    },
};

use core::ffi::c_void;

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    devices::{self, Devices},
    transport::session::MAX_DEVICES,
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

    /// `CU_CTX_*` flags: a primary context's are its device's (`devices`, once the session is
    /// up; 0 before).
    pub fn flags(&self, devices: Option<&Devices>) -> u32 {
        if self.primary {
            devices.map_or(0, |d| d.flags(self.device))
        } else {
            self.flags.load(Ordering::Relaxed)
        }
    }

    /// Sets the `CU_CTX_*` flags (a primary context's on its device, in `devices`).
    pub fn set_flags(&self, devices: Option<&Devices>, flags: u32) {
        if self.primary {
            if let Some(d) = devices {
                d.set_flags(self.device, flags);
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

/// Whether the primary context of `device` is retained through the driver API (it is active
/// then; the runtime knows the other ways: `runtime::context::primary_active`).
pub fn retained(device: u32) -> bool {
    RETAINED
        .get(device as usize)
        .is_some_and(|r| r.load(Ordering::Relaxed) > 0)
}

/// The flags of the calling thread's current context if it is one the driver face created (not
/// a primary context) and runs on `device`.
pub fn created_current_flags(device: u32) -> Option<u32> {
    top()
        .filter(|c| !c.primary && c.device == device)
        .map(|c| c.flags(None))
}

/// The top of the calling thread's context stack, if any (with an empty stack, the current
/// context is the runtime's: `runtime::context::current`).
pub fn top() -> Option<&'static Context> {
    with_stack(|s| s.last().copied()).flatten()
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
    with_stack(|s| {
        if let Some(top) = s.last_mut() {
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
/// (export table c693336e...). Kept in the guest: nothing of it concerns the host. NVIDIA's
/// runtime reads its own entry on nearly every call and a process holds a handful (a key or two
/// per context), so a short list searched in place is the fastest map: no hashing, no
/// allocation on a read.
static STORAGE: Mutex<Vec<((usize, usize), Stored)>> = Mutex::new(Vec::new());

fn with_storage<R>(f: impl FnOnce(&mut Vec<((usize, usize), Stored)>) -> R) -> R {
    let mut guard = STORAGE.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut guard)
}

/// Stores `value` under (`ctx`, `key`), replacing what was there.
pub fn storage_insert(ctx: usize, key: usize, value: usize, dtor: StorageDtor) {
    let stored = Stored { value, dtor };
    with_storage(|s| match s.iter_mut().find(|(k, _)| *k == (ctx, key)) {
        Some((_, v)) => *v = stored,
        None => s.push(((ctx, key), stored)),
    });
}

/// Removes (`ctx`, `key`) without running its destructor: false when there was none.
pub fn storage_remove(ctx: usize, key: usize) -> bool {
    with_storage(|s| {
        s.iter()
            .position(|(k, _)| *k == (ctx, key))
            .map(|i| s.swap_remove(i))
    })
    .is_some()
}

/// The value under (`ctx`, `key`).
pub fn storage_value(ctx: usize, key: usize) -> Option<usize> {
    with_storage(|s| {
        s.iter()
            .find(|(k, _)| *k == (ctx, key))
            .map(|(_, v)| v.value)
    })
}

/// Runs and drops every destructor stored for `ctx` (outside the lock: they may call back).
fn storage_destroyed(ctx: usize) {
    let gone: Vec<((usize, usize), Stored)> = with_storage(|s| {
        let (gone, kept) = std::mem::take(s)
            .into_iter()
            .partition(|((c, _), _)| *c == ctx);
        *s = kept;
        gone
    });
    for ((ctx, key), stored) in gone {
        if let Some(dtor) = stored.dtor {
            // SAFETY: the application registered `dtor` for exactly these arguments.
            unsafe { dtor(ctx, key as *mut c_void, stored.value as *mut c_void) };
        }
    }
}

//! The hidden registration API nvcc 13 emits into every program (crt/host_runtime.h): static
//! constructors call `__cudaRegisterFatBinary`, then `__cudaRegisterFunction`/`__cudaRegisterVar`
//! per kernel/variable, then `__cudaRegisterFatBinaryEnd`; `atexit` calls
//! `__cudaUnregisterFatBinary`.
//!
//! All of this runs before `main`, so it only records (registry.rs): it never opens the device,
//! never fails visibly, and works without a GPU. Modules are loaded at first use (modules.rs).
//! None of these functions returns a `cudaError_t`: they return `void`, `void **` or `char`.

use core::ffi::{c_char, c_int, c_void, CStr};

use crate::{
    core::modules,
    core::modules::fatbin,
    core::runtime::managed as managed_vars,
    core::runtime::{registry, runtime_if_connected},
    core::warnings::warn_once,
    generated::{dim3, uint3},
};

/// `__cudaRegisterFatBinary(void *fatCubin)`: records the embedded image and returns the fatbin
/// handle (`void **`) that the other registration calls receive. The handle is never
/// dereferenced by the application.
///
/// # Safety
/// `fatCubin` is the `__fatBinC_Wrapper_t` nvcc emitted; its image stays mapped until
/// `__cudaUnregisterFatBinary`.
#[no_mangle]
pub unsafe extern "C" fn __cudaRegisterFatBinary(fatCubin: *mut c_void) -> *mut *mut c_void {
    // SAFETY: forwarded contract: nvcc's wrapper, whose data lives in a read-only section of the
    // application or library for as long as it is registered.
    let image = unsafe { fatbin::image_from_wrapper(fatCubin) };
    registry().register_fatbin(image) as *mut *mut c_void
}

/// `__cudaRegisterFatBinaryEnd`: nothing to do, since modules load lazily.
///
/// # Safety
/// Any value is accepted.
#[no_mangle]
pub unsafe extern "C" fn __cudaRegisterFatBinaryEnd(_fatCubinHandle: *mut *mut c_void) {}

/// `__cudaUnregisterFatBinary`: forgets the image and its kernels and variables, and unloads its
/// modules if any were loaded (never connecting just for that).
///
/// # Safety
/// Any value is accepted; unknown handles are ignored.
#[no_mangle]
pub unsafe extern "C" fn __cudaUnregisterFatBinary(fatCubinHandle: *mut *mut c_void) {
    if let Some(fatbin) = registry().unregister_fatbin(fatCubinHandle as usize) {
        managed_vars::forget_fatbin(fatbin);
        if let Some(rt) = runtime_if_connected() {
            modules::unload(&rt.session, fatbin);
        }
    }
}

/// `__cudaRegisterFunction`: records host stub `hostFun` → kernel `deviceName` in that image.
/// The remaining arguments are always -1/null from nvcc and unused.
///
/// # Safety
/// `deviceName` is null or a NUL-terminated string.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn __cudaRegisterFunction(
    fatCubinHandle: *mut *mut c_void,
    hostFun: *const c_char,
    _deviceFun: *mut c_char,
    deviceName: *const c_char,
    _thread_limit: c_int,
    _tid: *mut uint3,
    _bid: *mut uint3,
    _bDim: *mut dim3,
    _gDim: *mut dim3,
    _wSize: *mut c_int,
) {
    if hostFun.is_null() || deviceName.is_null() {
        warn_once!("__cudaRegisterFunction called without a host function or name; ignored");
        return;
    }
    // SAFETY: non-null and NUL-terminated (nvcc passes a string literal).
    let name = unsafe { CStr::from_ptr(deviceName) };
    if !registry().register_function(fatCubinHandle as usize, hostFun as usize, name) {
        warn_once!("__cudaRegisterFunction with an unknown fatbin handle; kernel {name:?} ignored");
    }
}

/// `__cudaRegisterVar`: records host shadow `hostVar` → device variable `deviceName` of `size`
/// bytes (`constant`: `__constant__`).
///
/// # Safety
/// `deviceName` is null or a NUL-terminated string.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn __cudaRegisterVar(
    fatCubinHandle: *mut *mut c_void,
    hostVar: *mut c_char,
    _deviceAddress: *mut c_char,
    deviceName: *const c_char,
    _ext: c_int,
    size: usize,
    constant: c_int,
    _global: c_int,
) {
    if hostVar.is_null() || deviceName.is_null() {
        warn_once!("__cudaRegisterVar called without a host variable or name; ignored");
        return;
    }
    // SAFETY: non-null and NUL-terminated (nvcc passes a string literal).
    let name = unsafe { CStr::from_ptr(deviceName) };
    let handle = fatCubinHandle as usize;
    if registry()
        .register_var(handle, hostVar as usize, name, size, constant != 0)
        .is_none()
    {
        warn_once!("__cudaRegisterVar with an unknown fatbin handle; variable {name:?} ignored");
    }
}

/// `__cudaRegisterManagedVar`: records a `__managed__` variable; `hostVarPtrAddress` is the
/// program's pointer to it, which `__cudaInitModule` fills in (modules/managed_vars.rs).
///
/// # Safety
/// `deviceName` is null or a NUL-terminated string; `hostVarPtrAddress` is null or the
/// program's own pointer variable for this managed variable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn __cudaRegisterManagedVar(
    fatCubinHandle: *mut *mut c_void,
    hostVarPtrAddress: *mut *mut c_void,
    _deviceAddress: *mut c_char,
    deviceName: *const c_char,
    _ext: c_int,
    size: usize,
    _constant: c_int,
    _global: c_int,
) {
    if hostVarPtrAddress.is_null() || deviceName.is_null() {
        warn_once!("__cudaRegisterManagedVar called without a host pointer or name; ignored");
        return;
    }
    // SAFETY: non-null and NUL-terminated (nvcc passes a string literal).
    let name = unsafe { CStr::from_ptr(deviceName) };
    let handle = fatCubinHandle as usize;
    match registry().register_var(handle, hostVarPtrAddress as usize, name, size, false) {
        Some(var) => managed_vars::register(var, hostVarPtrAddress as usize),
        None => warn_once!(
            "__cudaRegisterManagedVar with an unknown fatbin handle; variable {name:?} ignored"
        ),
    }
}

/// `__cudaInitModule`: binds the image's `__managed__` variables (nvcc's host code calls it
/// once, before the program's first access to one). Returns 1 on success; 0 if they cannot be
/// bound (the program then finds a null pointer, and the reason is logged once).
///
/// # Safety
/// Any value is accepted.
#[no_mangle]
pub unsafe extern "C" fn __cudaInitModule(fatCubinHandle: *mut *mut c_void) -> c_char {
    let Some(fatbin) = registry().fatbin(fatCubinHandle as usize) else {
        warn_once!("__cudaInitModule with an unknown fatbin handle");
        return 0;
    };
    match managed_vars::init_module(fatbin) {
        Ok(()) => 1,
        Err(e) => {
            warn_once!("__cudaInitModule: __managed__ variables cannot be bound ({e:?})");
            crate::core::last_error::record(e);
            0
        }
    }
}

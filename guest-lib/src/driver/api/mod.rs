//! The exported driver API (`libcuda.so.1`): every function this face implements, declared
//! once. Each export converts C arguments into calls on the shared core and the result into a
//! `CUresult`. The symbols of NVIDIA's driver that qcuda does not implement are
//! in `../unsupported.rs` and return `CUDA_ERROR_NOT_SUPPORTED`.
#![allow(non_snake_case)]

use crate::{core::last_error, core::runtime::runtime_if_connected, generated::driver_api as d};

use super::status::{DriverError, DrvResult};

/// Declares exported driver functions returning `CUresult`.
///
/// The body is an `unsafe fn` returning `DrvResult<()>`. Each export's signature is checked at
/// compile time against bindgen's prototype from cuda.h (`generated::driver_api`). Markers, after
/// the doc comment and in this order:
/// - `#[per_thread(twin)]` also exports the `_ptds`/`_ptsz` form as the same function: the
///   per-thread default stream is the legacy one in qcuda (streams.rs).
/// - `#[no_prototype = "why"]` skips the check, for forms cuda.h no longer declares.
macro_rules! driver_api {
    (@prototype [] $name:ident ($($arg:ident: $ty:ty),* $(,)?)) => {
        const _: unsafe extern "C" fn($($ty),*) -> $crate::generated::driver_api::CUresult =
            $crate::generated::driver_api::$name;
    };
    (@prototype [$why:literal] $name:ident $params:tt) => {};
    (@per_thread [] $name:ident $params:tt) => {};
    (@per_thread [$twin:ident] $name:ident ($($arg:ident: $ty:ty),* $(,)?)) => {
        #[doc = concat!("`", stringify!($name), "` on the per-thread default stream.")]
        ///
        /// # Safety
        #[doc = concat!("As for `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $twin($($arg: $ty),*) -> $crate::generated::driver_api::CUresult {
            // SAFETY: the same function and contract, which our caller upholds.
            unsafe { $name($($arg),*) }
        }
    };
    ($(
        $(#[doc = $doc:literal])*
        $(#[per_thread($twin:ident)])?
        $(#[no_prototype = $why:literal])?
        fn $name:ident $params:tt $body:block
    )*) => {$(
        driver_api!(@export [$($doc)*] $name $params $body);
        driver_api!(@prototype [$($why)?] $name $params);
        driver_api!(@per_thread [$($twin)?] $name $params);
    )*};
    (@export [$($doc:literal)*] $name:ident ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments must be valid as the CUDA driver API documents for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::generated::driver_api::CUresult {
            #[allow(clippy::too_many_arguments)]
            unsafe fn body($($arg: $ty),*) -> $crate::driver::status::DrvResult<()> $body
            // SAFETY: `body` has exactly this function's contract, which our caller upholds.
            let code = $crate::driver::status::finish(unsafe { body($($arg),*) });
            $crate::driver::trace::call(stringify!($name), code);
            code
        }
    };
}

/// Writes `value` through an out-parameter, or fails with `CUDA_ERROR_INVALID_VALUE` for null.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn out<T>(ptr: *mut T, value: T) -> DrvResult<()> {
    if ptr.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Runs a core operation for the driver face: its error becomes a driver status, and the
/// runtime face's per-thread last error is left as it was (driver calls never change what
/// `cudaGetLastError` reports, also when the core records a lost fire-and-forget failure).
fn via_core<T>(call: impl FnOnce() -> crate::core::cuda_error::CudaResult<T>) -> DrvResult<T> {
    last_error::preserving(call).map_err(Into::into)
}

/// `cuInit`'s outcome, once it succeeded.
static INITIALIZED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Fails with `CUDA_ERROR_NOT_INITIALIZED` until `cuInit` succeeded (or the runtime face, which
/// initialises the driver as NVIDIA's runtime does, reached a device).
fn initialized() -> DrvResult<()> {
    if INITIALIZED.load(std::sync::atomic::Ordering::Acquire)
        || runtime_if_connected().is_some_and(|rt| rt.devices.count() > 0)
    {
        Ok(())
    } else {
        Err(DriverError::NOT_INITIALIZED)
    }
}

/// `device` as an ordinal: `CUDA_ERROR_INVALID_DEVICE` when out of range.
pub fn check_device(device: d::CUdevice) -> DrvResult<u32> {
    initialized()?;
    let rt = crate::core::runtime::runtime()?;
    match u32::try_from(device) {
        Ok(dv) if dv < rt.devices.count() => Ok(dv),
        _ => Err(DriverError::INVALID_DEVICE),
    }
}

/// The device of context `ctx`, as an ordinal of the runtime's kind.
fn device_of(ctx: d::CUcontext) -> DrvResult<core::ffi::c_int> {
    let c = crate::core::runtime::context::lookup(ctx as usize)?;
    core::ffi::c_int::try_from(c.device).map_err(|_| DriverError::INVALID_CONTEXT)
}

/// The CUDA version of the driver API this library implements (cuda.h 13.0).
pub const DRIVER_API_VERSION: u32 = 13000;

/// The driver version this face reports: the host driver's, capped at the API version this
/// library implements (a newer host cannot give the guest entry points it does not have); the
/// implemented version itself when there is no host to ask (no `/dev/qcuda`), so that NVIDIA's
/// runtime goes on to `cuInit` and reports the missing device rather than an old driver.
pub fn driver_version_value() -> DrvResult<u32> {
    let host = crate::core::runtime::runtime().map_or(0, |rt| rt.session.host().driver_version);
    let host = u32::try_from(host).unwrap_or(0);
    Ok(if host == 0 {
        DRIVER_API_VERSION
    } else {
        host.min(DRIVER_API_VERSION)
    })
}

/// A device as the integrity check sees it: UUID, PCI domain, bus and device.
pub type DeviceIdentity = ([u8; 16], i32, i32, i32);

/// Per device, in ordinal order: UUID and PCI domain, bus and device, exactly as
/// `cuDeviceGetUuid` and `cuDeviceGetAttribute` report them (the integrity check hashes them).
pub fn device_identity() -> DrvResult<Vec<DeviceIdentity>> {
    let Some(rt) = runtime_if_connected() else {
        return Ok(Vec::new());
    };
    (0..rt.devices.count())
        .map(|dv| {
            let info = rt.devices.info(&rt.session, dv)?;
            let a = rt.devices.attributes(
                &rt.session,
                dv,
                &[
                    d::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
                    d::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
                    d::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
                ],
            )?;
            Ok((info.uuid, a[0], a[1], a[2]))
        })
        .collect()
}

pub mod arrays;
pub mod attributes;
pub mod checkpoint;
pub mod context;
pub mod device;
pub mod graph;
pub mod init;
pub mod ipc;
pub mod launch;
pub mod link;
pub mod memory;
pub mod module;
pub mod stream;
pub mod tensor_map;
pub mod user_objects;
pub mod vmm;

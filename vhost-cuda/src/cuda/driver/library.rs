//! The driver library: [`CudaDriver`], libcuda loaded and initialised (the calls are
//! `DriverApi`'s, in mod.rs and its siblings), and [`NoDriver`], the driver of a host without
//! one.

use std::{
    ffi::{c_int, c_uint},
    fmt,
};

use cudarc::driver::sys;
use qcuda_proto::status;
use tracing::warn;

use super::error::check;

/// Oldest driver the executor works with: CUDA 13.0 (compressed fatbins, the 13.0 symbol
/// versions cudarc binds, `cuFuncGetParamInfo`).
pub(crate) const MIN_DRIVER_VERSION: u32 = 13000;

/// cuDeviceGetAttribute with the attribute as a plain `int`, as the C ABI passes it: the guest
/// chooses the id, and cudarc's enum parameter cannot hold ids it does not list.
pub(super) type DeviceGetAttributeFn =
    unsafe extern "C" fn(*mut c_int, c_int, sys::CUdevice) -> c_uint;

/// The CUDA driver, loaded and initialised.
pub(crate) struct CudaDriver {
    pub(super) device_get_attribute: DeviceGetAttributeFn,
}

impl fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CudaDriver")
    }
}

/// What loading the driver found.
#[derive(Debug)]
pub(crate) enum DriverLoad {
    /// No libcuda on this host.
    Absent,
    /// libcuda is there but cannot serve: too old, missing symbols, or cuInit failed.
    /// `status` is what CUDA ops answer (cudaErrorInsufficientDriver, cudaErrorNoDevice, ...).
    Unusable {
        /// cuDriverGetVersion, 0 if unknown.
        version: u32,
        /// The `cudaError_t` for CUDA ops.
        status: u32,
    },
    /// Ready to use.
    Ready {
        /// The driver.
        driver: CudaDriver,
        /// cuDriverGetVersion.
        version: u32,
    },
}

impl CudaDriver {
    /// Finds libcuda, checks its version and the symbols of `required`, and calls cuInit.
    /// Never panics on a missing or old library.
    pub(crate) fn load_checking(required: &[&[&str]]) -> DriverLoad {
        // SAFETY: is_culib_present only dlopens candidate names and closes them again; loading
        // libcuda runs no initialisation that could affect this process beyond that.
        if !unsafe { sys::is_culib_present() } {
            return DriverLoad::Absent;
        }
        // SAFETY: a candidate loaded just above, so culib() finds one and does not panic.
        let lib = unsafe { sys::culib() };
        let has = |name: &str| {
            // SAFETY: the symbol is only looked up, never called through this type.
            unsafe { lib.get::<unsafe extern "C" fn()>(name) }.is_ok()
        };
        let too_old = |version| DriverLoad::Unusable {
            version,
            status: status::INSUFFICIENT_DRIVER,
        };
        if !has("cuDriverGetVersion") || !has("cuInit") {
            warn!("libcuda lacks cuInit/cuDriverGetVersion; treating it as too old");
            return too_old(0);
        }
        let mut v: c_int = 0;
        // SAFETY: the symbol exists (checked above); `v` is a valid out pointer.
        if let Err(e) = check(unsafe { sys::cuDriverGetVersion(&raw mut v) }) {
            warn!(error = ?e, "cuDriverGetVersion failed");
            return too_old(0);
        }
        let version = u32::try_from(v).unwrap_or(0);
        if version < MIN_DRIVER_VERSION {
            warn!(version, min = MIN_DRIVER_VERSION, "CUDA driver too old");
            return too_old(version);
        }
        let missing: Vec<&str> = required
            .iter()
            .flat_map(|list| list.iter())
            .copied()
            .filter(|s| !has(s))
            .collect();
        if !missing.is_empty() {
            warn!(version, ?missing, "CUDA driver lacks required entry points");
            return too_old(version);
        }
        // SAFETY: the symbol exists; cuInit may be called any number of times.
        if let Err(e) = check(unsafe { sys::cuInit(0) }) {
            warn!(version, error = ?e, "cuInit failed");
            return DriverLoad::Unusable {
                version,
                status: e.status(),
            };
        }
        // SAFETY: the symbol exists (`required` lists it) and has this C signature: CUresult is a
        // C enum (an unsigned int) and CUdevice_attribute is passed as an int.
        let get_attr = unsafe { lib.get::<DeviceGetAttributeFn>("cuDeviceGetAttribute") };
        match get_attr {
            Ok(f) => DriverLoad::Ready {
                driver: CudaDriver {
                    device_get_attribute: *f,
                },
                version,
            },
            Err(_) => too_old(version),
        }
    }
}

/// The driver of a host without a usable CUDA driver: every call fails with
/// CUDA_ERROR_NO_DEVICE. Sessions of such a host answer before calling it; it exists so that
/// a session always has a driver to hold.
#[derive(Debug)]
pub(crate) struct NoDriver;

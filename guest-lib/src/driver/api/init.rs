//! Initialisation, versions, error strings, and `cuGetProcAddress` (`cuGetExportTable` is
//! export_tables.rs's).

use core::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::Ordering;

use super::{out, INITIALIZED};
use crate::{
    core::runtime::runtime,
    driver::{
        proc_address,
        status::{self, DriverError},
    },
    generated::driver_api as d,
};

driver_api! {
    /// `cuInit`: connects to the host; `CUDA_ERROR_NO_DEVICE` when it has no usable GPU.
    fn cuInit(Flags: ::core::ffi::c_uint) {
        if Flags != 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        let rt = runtime()?;
        rt.devices.any()?;
        INITIALIZED.store(true, Ordering::Release);
        Ok(())
    }

    /// `cuDriverGetVersion` (see `driver_version_value`). Needs no `cuInit`.
    fn cuDriverGetVersion(driverVersion: *mut c_int) {
        let v = super::driver_version_value()?;
        // SAFETY: caller's out-parameter.
        unsafe { out(driverVersion, c_int::try_from(v).unwrap_or(0)) }
    }

    /// `cuGetErrorString`: `CUDA_ERROR_INVALID_VALUE` (and null) for codes cuda.h lacks.
    fn cuGetErrorString(error: d::CUresult, pStr: *mut *const c_char) {
        let s = status::error_string(error);
        // SAFETY: caller's out-parameter.
        unsafe { out(pStr, s.map_or(std::ptr::null(), CStr::as_ptr)) }?;
        s.map(drop).ok_or(DriverError::INVALID_VALUE)
    }

    /// `cuGetErrorName`.
    fn cuGetErrorName(error: d::CUresult, pStr: *mut *const c_char) {
        let s = status::error_name(error);
        // SAFETY: caller's out-parameter.
        unsafe { out(pStr, s.map_or(std::ptr::null(), CStr::as_ptr)) }?;
        s.map(drop).ok_or(DriverError::INVALID_VALUE)
    }

    /// `cuGetProcAddress_v2`: see proc_address.rs for the rules.
    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cudaVersion: c_int,
        flags: d::cuuint64_t,
        symbolStatus: *mut d::CUdriverProcAddressQueryResult,
    ) {
        // SAFETY: forwarded contract.
        unsafe { lookup_entry_point(symbol, pfn, cudaVersion, flags, symbolStatus, true) }
    }

    /// `cuGetProcAddress` (CUDA 11.3-11.8: no status out-parameter).
    #[no_prototype = "cuda.h maps cuGetProcAddress to _v2"]
    fn cuGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cudaVersion: c_int,
        flags: d::cuuint64_t
    ) {
        // SAFETY: forwarded contract; no status out-parameter.
        unsafe { lookup_entry_point(symbol, pfn, cudaVersion, flags, std::ptr::null_mut(), false) }
    }
}

/// Both `cuGetProcAddress` forms. A name without a form for `version`: `CUDA_SUCCESS` with a
/// null pointer and the reason in the status for `_v2` (`v2`), `CUDA_ERROR_NOT_FOUND` for the
/// CUDA 11 form.
///
/// # Safety
/// `symbol` is null or NUL-terminated; `pfn` and `status` are null or writable.
unsafe fn lookup_entry_point(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    symbol_status: *mut d::CUdriverProcAddressQueryResult,
    v2: bool,
) -> status::DrvResult<()> {
    if symbol.is_null() || pfn.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let found = proc_address::get(name, version, flags, super::driver_version_value()?)?;
    if crate::driver::trace::enabled() {
        crate::driver::trace::log(format_args!(
            "cuGetProcAddress {name} {version} flags {flags}: {:?}",
            found.as_ref().map(|_| ())
        ));
    }
    // SAFETY: checked non-null.
    unsafe { pfn.write_unaligned(*found.as_ref().unwrap_or(&std::ptr::null_mut())) };
    let code = match found {
        Ok(_) => d::CU_GET_PROC_ADDRESS_SUCCESS,
        Err(missing) => missing.status(),
    };
    if !symbol_status.is_null() {
        // SAFETY: non-null: the caller asked for it.
        unsafe { symbol_status.write_unaligned(code) };
    }
    match found {
        Err(_) if !v2 => Err(DriverError::NOT_FOUND),
        _ => Ok(()),
    }
}

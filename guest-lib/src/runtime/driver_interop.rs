//! The runtime's doors to the driver: `cudaGetDriverEntryPoint[ByVersion]` hand out entry points
//! of our `libcuda.so.1` (the driver face, with `cuGetProcAddress`'s rules), and
//! `cudaGetExportTable` its private tables, as NVIDIA's runtime hands out its driver's.

use core::ffi::{c_char, c_uint, c_ulonglong, c_void};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    driver::{self, proc_address::Missing, status::DriverError},
    generated::{cudaUUID_t, runtime_api::cudaDriverEntryPointQueryResult, CUDART_VERSION},
};

/// `cudaEnableDefault`: what the caller was built for, which the `_ptsz` spellings say.
const ENABLE_DEFAULT: u64 = 0;
/// `cudaEnablePerThreadDefaultStream`.
const ENABLE_PER_THREAD: u64 = 2;

fn runtime_error(e: DriverError) -> CudaError {
    CudaError::from_code(e.code()).unwrap_or(CudaError::UNKNOWN)
}

/// The entry point `symbol` at `version`: a null pointer and the reason in `status` when there
/// is none (`cudaSuccess` all the same, as `cuGetProcAddress_v2` answers).
///
/// # Safety
/// `symbol` is NUL-terminated; `func` is writable; `status` is null or writable.
unsafe fn entry_point(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_uint,
    flags: c_ulonglong,
    status: *mut cudaDriverEntryPointQueryResult,
    per_thread_build: bool,
) -> CudaResult<()> {
    if symbol.is_null() || func.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let flags = if flags == ENABLE_DEFAULT && per_thread_build {
        ENABLE_PER_THREAD
    } else {
        flags
    };
    // SAFETY: NUL-terminated (caller's contract).
    let name = unsafe { core::ffi::CStr::from_ptr(symbol) }
        .to_str()
        .unwrap_or("");
    let version = i32::try_from(version).map_err(|_| CudaError::INVALID_VALUE)?;
    let driver_version = driver::api::driver_version_value().map_err(runtime_error)?;
    let found =
        driver::proc_address::get(name, version, flags, driver_version).map_err(runtime_error)?;
    // SAFETY: checked non-null.
    unsafe { func.write_unaligned(*found.as_ref().unwrap_or(&std::ptr::null_mut())) };
    if !status.is_null() {
        let code = match found {
            Ok(_) => 0,
            Err(Missing::Symbol) => 1,
            Err(Missing::Version) => 2,
        };
        // SAFETY: non-null: the caller asked for it.
        unsafe { status.write_unaligned(code) };
    }
    Ok(())
}

cuda_api! {
    /// `cudaGetDriverEntryPoint`: at this runtime's version (13.0).
    fn cudaGetDriverEntryPoint(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        flags: c_ulonglong,
        driverStatus: *mut cudaDriverEntryPointQueryResult,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, false) }
    }

    /// `cudaGetDriverEntryPoint_ptsz`: a per-thread-default-stream build's default is the
    /// per-thread forms.
    fn cudaGetDriverEntryPoint_ptsz(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        flags: c_ulonglong,
        driverStatus: *mut cudaDriverEntryPointQueryResult,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, true) }
    }

    /// `cudaGetDriverEntryPointByVersion`.
    fn cudaGetDriverEntryPointByVersion(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        cudaVersion: c_uint,
        flags: c_ulonglong,
        driverStatus: *mut cudaDriverEntryPointQueryResult,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, false) }
    }

    /// `cudaGetDriverEntryPointByVersion_ptsz`.
    fn cudaGetDriverEntryPointByVersion_ptsz(
        symbol: *const c_char,
        funcPtr: *mut *mut c_void,
        cudaVersion: c_uint,
        flags: c_ulonglong,
        driverStatus: *mut cudaDriverEntryPointQueryResult,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, true) }
    }

    /// `cudaGetExportTable`: the driver face's table of that UUID.
    fn cudaGetExportTable(ppExportTable: *mut *const c_void, pExportTableId: *const cudaUUID_t) {
        if ppExportTable.is_null() || pExportTableId.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        // SAFETY: a cudaUUID_t is 16 bytes (checked non-null).
        let id = unsafe { &*pExportTableId.cast::<[u8; 16]>() };
        let table = driver::export_tables::get(id).map_err(runtime_error)?;
        // SAFETY: checked non-null.
        unsafe { ppExportTable.write_unaligned(table) };
        Ok(())
    }
}

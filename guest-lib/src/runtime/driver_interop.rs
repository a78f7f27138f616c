//! The runtime's doors to the driver: `cudaGetDriverEntryPoint[ByVersion]` hand out entry points
//! of our `libcuda.so.1` (the driver face, with `cuGetProcAddress`'s rules), and
//! `cudaGetExportTable` its private tables, as NVIDIA's runtime hands out its driver's. Like
//! NVIDIA's runtime, this face reaches the driver only through the driver's public C ABI
//! (`cuGetProcAddress_v2`, `cuGetExportTable`), never its internals.

use core::ffi::{c_char, c_uint, c_ulonglong, c_void};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    generated::{
        cudaUUID_t, driver_api as d, runtime_api::cudaDriverEntryPointQueryResult, CUDART_VERSION,
    },
};

/// `cudaEnableDefault`: what the caller was built for, which the `_ptsz` spellings say.
const ENABLE_DEFAULT: u64 = 0;
/// `cudaEnablePerThreadDefaultStream`.
const ENABLE_PER_THREAD: u64 = 2;

/// A driver status as the runtime's: every driver code has the runtime code of its number.
fn from_driver(code: d::CUresult) -> CudaResult<()> {
    CudaError::check(code)
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
    let version = i32::try_from(version).map_err(|_| CudaError::INVALID_VALUE)?;
    let mut found: *mut c_void = std::ptr::null_mut();
    let mut query: d::CUdriverProcAddressQueryResult = d::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: `symbol` is NUL-terminated (caller's contract); the out-parameters are locals.
    from_driver(unsafe {
        d::cuGetProcAddress_v2(symbol, &raw mut found, version, flags, &raw mut query)
    })?;
    // SAFETY: checked non-null.
    unsafe { func.write_unaligned(found) };
    if !status.is_null() {
        // `cudaDriverEntryPointQueryResult` has the values of `CUdriverProcAddressQueryResult`.
        // SAFETY: non-null: the caller asked for it.
        unsafe { status.write_unaligned(query) };
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
        // SAFETY: both checked non-null; a cudaUUID_t is a CUuuid.
        from_driver(unsafe { d::cuGetExportTable(ppExportTable, pExportTableId.cast()) })
    }
}

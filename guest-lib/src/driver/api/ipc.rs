//! Sharing device memory with the other processes of the VM on the driver face: legacy IPC
//! memory handles (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle[_v2]`, `cuIpcCloseMemHandle`) and
//! VMM shareable handles as POSIX file descriptors (`cuMemExportToShareableHandle`,
//! `cuMemImportFromShareableHandle`), over the core's IPC (core/runtime/ipc.rs). Win32 handles are
//! refused with `CUDA_ERROR_INVALID_VALUE`, as NVIDIA's Linux driver refuses them, and fabric
//! handles with `CUDA_ERROR_NOT_SUPPORTED`, as it answers on a system without fabric support. Also shareable pools (`cuMemPool*`) and interprocess events (`cuIpcGetEventHandle`,
//! `cuIpcOpenEventHandle`).

use core::ffi::{c_uint, c_ulonglong, c_void};

use super::{initialized, out};
use crate::{
    core::{runtime::context, runtime::current, runtime::ipc},
    driver::status::{DriverError, DrvResult},
    generated::driver_api as d,
};

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// The current context, made the core's current device.
fn ready() -> DrvResult<()> {
    initialized()?;
    Ok(context::require_current().map(drop)?)
}

fn open(pdptr: *mut d::CUdeviceptr, handle: &d::CUipcMemHandle, flags: c_uint) -> DrvResult<()> {
    ready()?;
    if pdptr.is_null() || flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
        return Err(DriverError::INVALID_VALUE);
    }
    let (rt, device) = current()?;
    let bytes = handle.reserved.map(|b| b.cast_unsigned());
    let p = ipc::open_mem_handle(rt, device, &bytes, flags)?;
    // SAFETY: checked non-null.
    unsafe { out(pdptr, p) }
}

driver_api! {
    /// `cuIpcGetMemHandle`.
    fn cuIpcGetMemHandle(pHandle: *mut d::CUipcMemHandle, dptr: d::CUdeviceptr) {
        ready()?;
        if pHandle.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let (rt, _) = current()?;
        let bytes = ipc::get_mem_handle(rt, dptr)?;
        // SAFETY: checked non-null; a CUipcMemHandle is 64 bytes of anything.
        unsafe { out(pHandle.cast::<[u8; 64]>(), bytes) }
    }

    /// `cuIpcOpenMemHandle_v2`, on the current context's device.
    fn cuIpcOpenMemHandle_v2(pdptr: *mut d::CUdeviceptr, handle: d::CUipcMemHandle, Flags: c_uint) {
        open(pdptr, &handle, Flags)
    }

    /// `cuIpcOpenMemHandle`: the same as `_v2`.
    #[no_prototype = "the header maps the name to cuIpcOpenMemHandle_v2"]
    fn cuIpcOpenMemHandle(pdptr: *mut d::CUdeviceptr, handle: d::CUipcMemHandle, Flags: c_uint) {
        open(pdptr, &handle, Flags)
    }

    /// `cuIpcCloseMemHandle`.
    fn cuIpcCloseMemHandle(dptr: d::CUdeviceptr) {
        ready()?;
        let (rt, _) = current()?;
        Ok(ipc::close_mem_handle(rt, dptr)?)
    }

    /// `cuMemExportToShareableHandle`: POSIX file descriptors only (`shareableHandle` points
    /// at an `int`).
    fn cuMemExportToShareableHandle(
        shareableHandle: *mut c_void,
        handle: d::CUmemGenericAllocationHandle,
        handleType: d::CUmemAllocationHandleType,
        flags: c_ulonglong,
    ) {
        initialized()?;
        if shareableHandle.is_null() || flags != 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        match handleType {
            d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR => {}
            d::CU_MEM_HANDLE_TYPE_FABRIC => return Err(DriverError::NOT_SUPPORTED),
            _ => return Err(DriverError::INVALID_VALUE),
        }
        let (rt, _) = current()?;
        let fd = ipc::export_fd(rt, handle)?;
        // SAFETY: checked non-null; for this handle type it points at an int (API contract).
        unsafe { out(shareableHandle.cast::<i32>(), fd) }
    }

    /// `cuMemImportFromShareableHandle`: `osHandle` is the file descriptor, cast to a pointer.
    fn cuMemImportFromShareableHandle(
        handle: *mut d::CUmemGenericAllocationHandle,
        osHandle: *mut c_void,
        shHandleType: d::CUmemAllocationHandleType,
    ) {
        initialized()?;
        if handle.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        match shHandleType {
            d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR => {}
            d::CU_MEM_HANDLE_TYPE_FABRIC => return Err(DriverError::NOT_SUPPORTED),
            _ => return Err(DriverError::INVALID_VALUE),
        }
        let fd = i32::try_from(osHandle as usize).map_err(|_| DriverError::INVALID_VALUE)?;
        let (rt, _) = current()?;
        let h = ipc::import_fd(rt, fd)?;
        // SAFETY: checked non-null.
        unsafe { out(handle, h) }
    }
}

driver_api! {
    /// `cuMemPoolExportToShareableHandle`: POSIX file descriptors (`handle_out` points at an
    /// `int`), flags 0.
    fn cuMemPoolExportToShareableHandle(
        handle_out: *mut c_void,
        pool: d::CUmemoryPool,
        handleType: d::CUmemAllocationHandleType,
        flags: c_ulonglong,
    ) {
        initialized()?;
        if handle_out.is_null()
            || flags != 0
            || handleType != d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        {
            return Err(DriverError::INVALID_VALUE);
        }
        let (rt, _) = current()?;
        let fd = ipc::export_pool_fd(rt, pool as usize)?;
        // SAFETY: checked non-null; an int for this handle type (API contract).
        unsafe { out(handle_out.cast::<i32>(), fd) }
    }

    /// `cuMemPoolImportFromShareableHandle`: `handle` is the descriptor, cast to a pointer.
    fn cuMemPoolImportFromShareableHandle(
        pool_out: *mut d::CUmemoryPool,
        handle: *mut c_void,
        handleType: d::CUmemAllocationHandleType,
        flags: c_ulonglong,
    ) {
        ready()?;
        if pool_out.is_null()
            || flags != 0
            || handleType != d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        {
            return Err(DriverError::INVALID_VALUE);
        }
        let fd = i32::try_from(handle as usize).map_err(|_| DriverError::INVALID_VALUE)?;
        let (rt, _) = current()?;
        let pool = ipc::import_pool_fd(rt, fd)?;
        // SAFETY: checked non-null.
        unsafe { out(pool_out, pool as d::CUmemoryPool) }
    }

    /// `cuMemPoolExportPointer`.
    fn cuMemPoolExportPointer(shareData_out: *mut d::CUmemPoolPtrExportData, ptr: d::CUdeviceptr) {
        ready()?;
        if shareData_out.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let (rt, _) = current()?;
        let data = ipc::export_pointer(rt, ptr)?;
        // SAFETY: checked non-null; the record is 64 bytes of anything.
        unsafe { out(shareData_out.cast::<[u8; 64]>(), data) }
    }

    /// `cuMemPoolImportPointer`.
    fn cuMemPoolImportPointer(
        ptr_out: *mut d::CUdeviceptr,
        pool: d::CUmemoryPool,
        shareData: *mut d::CUmemPoolPtrExportData,
    ) {
        ready()?;
        if ptr_out.is_null() || shareData.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: checked non-null; readable by the API contract; 64 bytes.
        let data = unsafe { shareData.cast::<[u8; 64]>().read_unaligned() };
        let (rt, _) = current()?;
        let p = ipc::import_pointer(rt, pool as usize, &data)?;
        // SAFETY: checked non-null.
        unsafe { out(ptr_out, p) }
    }
}

driver_api! {
    /// `cuIpcGetEventHandle`: of an event created with `CU_EVENT_INTERPROCESS` and
    /// `CU_EVENT_DISABLE_TIMING`.
    fn cuIpcGetEventHandle(pHandle: *mut d::CUipcEventHandle, event: d::CUevent) {
        initialized()?;
        if pHandle.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let (rt, _) = current()?;
        let bytes = ipc::get_event_handle(rt, event as usize)?;
        // SAFETY: checked non-null; a CUipcEventHandle is 64 bytes of anything.
        unsafe { out(pHandle.cast::<[u8; 64]>(), bytes) }
    }

    /// `cuIpcOpenEventHandle`, on the current context's device.
    fn cuIpcOpenEventHandle(phEvent: *mut d::CUevent, handle: d::CUipcEventHandle) {
        ready()?;
        if phEvent.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let (rt, device) = current()?;
        let bytes = handle.reserved.map(|b| b.cast_unsigned());
        let e = ipc::open_event_handle(rt, device, &bytes)?;
        // SAFETY: checked non-null.
        unsafe { out(phEvent, e as d::CUevent) }
    }
}

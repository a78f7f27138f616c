//! Memory shared between the processes of one VM (core/runtime/ipc.rs; the host brokers it between
//! the two processes' workers): legacy interprocess memory handles (`cudaIpcGetMemHandle`,
//! `cudaIpcOpenMemHandle`, `cudaIpcCloseMemHandle`) and shareable pools
//! (`cudaMemPoolExportToShareableHandle`, `cudaMemPoolImportFromShareableHandle`,
//! `cudaMemPoolExportPointer`, `cudaMemPoolImportPointer`; POSIX file descriptors), and
//! interprocess events (`cudaIpcGetEventHandle`, `cudaIpcOpenEventHandle`).

use core::ffi::{c_uint, c_void};

use super::write_out;
use crate::{
    core::{
        cuda_error::CudaError,
        runtime::ipc,
        runtime::{current, non_null, runtime},
    },
    generated::{
        self as cu, cudaEvent_t, cudaMemAllocationHandleType, cudaMemPool_t,
        runtime_api::{cudaIpcEventHandle_t, cudaIpcMemHandle_t, cudaMemPoolPtrExportData},
    },
};

/// `cudaIpcMemLazyEnablePeerAccess`, the one flag of `cudaIpcOpenMemHandle`.
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

cuda_api! {
    /// `cudaIpcGetMemHandle`: a handle another process of the VM can open.
    fn cudaIpcGetMemHandle(handle: *mut cudaIpcMemHandle_t, devPtr: *mut c_void) {
        non_null(handle)?;
        let (rt, _) = current()?;
        let bytes = ipc::get_mem_handle(rt, devPtr as u64)?;
        // SAFETY: non-null; a cudaIpcMemHandle_t is 64 bytes of anything.
        unsafe { write_out(handle.cast::<[u8; 64]>(), bytes) }
    }

    /// `cudaIpcOpenMemHandle` on the current device.
    fn cudaIpcOpenMemHandle(devPtr: *mut *mut c_void, handle: cudaIpcMemHandle_t, flags: c_uint) {
        non_null(devPtr)?;
        if flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, device) = current()?;
        let bytes = handle.reserved.map(|b| b.cast_unsigned());
        let p = ipc::open_mem_handle(rt, device, &bytes, flags)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(devPtr, p as *mut c_void) }
    }

    /// `cudaIpcCloseMemHandle`.
    fn cudaIpcCloseMemHandle(devPtr: *mut c_void) {
        ipc::close_mem_handle(runtime()?, devPtr as u64)
    }

    /// `cudaMemPoolExportToShareableHandle`: POSIX file descriptors (`shareableHandle` points
    /// at an `int`), flags 0.
    fn cudaMemPoolExportToShareableHandle(shareableHandle: *mut c_void, memPool: cudaMemPool_t, handleType: cudaMemAllocationHandleType, flags: c_uint) {
        non_null(shareableHandle)?;
        if handleType != cu::cudaMemHandleTypePosixFileDescriptor || flags != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let fd = ipc::export_pool_fd(runtime()?, memPool as usize)?;
        // SAFETY: non-null; an int for this handle type (API contract).
        unsafe { write_out(shareableHandle.cast::<i32>(), fd) }
    }

    /// `cudaMemPoolImportFromShareableHandle`: `shareableHandle` is the descriptor, cast to a
    /// pointer.
    fn cudaMemPoolImportFromShareableHandle(memPool: *mut cudaMemPool_t, shareableHandle: *mut c_void, handleType: cudaMemAllocationHandleType, flags: c_uint) {
        non_null(memPool)?;
        if handleType != cu::cudaMemHandleTypePosixFileDescriptor || flags != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let fd = i32::try_from(shareableHandle as usize).map_err(|_| CudaError::INVALID_VALUE)?;
        let (rt, _) = current()?;
        let pool = ipc::import_pool_fd(rt, fd)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(memPool, pool as cudaMemPool_t) }
    }

    /// `cudaMemPoolExportPointer`: a stream-ordered allocation of a shareable pool.
    fn cudaMemPoolExportPointer(exportData: *mut cudaMemPoolPtrExportData, ptr: *mut c_void) {
        non_null(exportData)?;
        let data = ipc::export_pointer(runtime()?, ptr as u64)?;
        // SAFETY: non-null; the record is 64 bytes of anything.
        unsafe { write_out(exportData.cast::<[u8; 64]>(), data) }
    }

    /// `cudaMemPoolImportPointer` from a pool imported with
    /// `cudaMemPoolImportFromShareableHandle`.
    fn cudaMemPoolImportPointer(ptr: *mut *mut c_void, memPool: cudaMemPool_t, exportData: *mut cudaMemPoolPtrExportData) {
        non_null(ptr)?;
        non_null(exportData)?;
        // SAFETY: non-null and readable (API contract); 64 bytes.
        let data = unsafe { exportData.cast::<[u8; 64]>().read_unaligned() };
        let p = ipc::import_pointer(runtime()?, memPool as usize, &data)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(ptr, p as *mut c_void) }
    }

    /// `cudaIpcGetEventHandle`: of an event created with `cudaEventInterprocess` and
    /// `cudaEventDisableTiming`.
    fn cudaIpcGetEventHandle(handle: *mut cudaIpcEventHandle_t, event: cudaEvent_t) {
        non_null(handle)?;
        let bytes = ipc::get_event_handle(runtime()?, event as usize)?;
        // SAFETY: non-null; a cudaIpcEventHandle_t is 64 bytes of anything.
        unsafe { write_out(handle.cast::<[u8; 64]>(), bytes) }
    }

    /// `cudaIpcOpenEventHandle` on the current device.
    fn cudaIpcOpenEventHandle(event: *mut cudaEvent_t, handle: cudaIpcEventHandle_t) {
        non_null(event)?;
        let (rt, device) = current()?;
        let bytes = handle.reserved.map(|b| b.cast_unsigned());
        let e = ipc::open_event_handle(rt, device, &bytes)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(event, e as cudaEvent_t) }
    }
}

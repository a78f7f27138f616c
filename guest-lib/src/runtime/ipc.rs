//! Legacy interprocess memory handles between the processes of one VM:
//! `cudaIpcGetMemHandle`, `cudaIpcOpenMemHandle`, `cudaIpcCloseMemHandle` (core/ipc.rs; the
//! host brokers the memory between the two processes' workers). Event handles
//! (`cudaIpcGetEventHandle`, `cudaIpcOpenEventHandle`) are not offered yet
//! (`cudaErrorNotSupported`, runtime/unsupported.rs).

use core::ffi::{c_uint, c_void};

use super::write_out;
use crate::{
    core::{
        cuda_error::CudaError,
        ipc,
        runtime::{current, non_null, runtime},
    },
    generated::runtime_api::cudaIpcMemHandle_t,
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
}

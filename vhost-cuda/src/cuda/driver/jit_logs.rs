//! `cuModuleLoadDataEx` with the JIT's logs (`CU_JIT_INFO_LOG_BUFFER`, `CU_JIT_ERROR_LOG_BUFFER`)
//! and the value options a program gave, as a trait of its own ([`JitLogDriverApi`], a
//! supertrait of `DriverApi`): XLA prints the error log of a PTX load that fails and reads the
//! info log ("Register allocation failed" and the like), Numba's linker reports errors from it.
//! The real implementation is over cudarc's `sys` layer; the fake's is in `fake.rs`.

use std::ptr::null_mut;

use cudarc::driver::sys;

use super::{
    error::{check, CuError, CuResult},
    handles::{Module, Raw},
    library::{CudaDriver, NoDriver},
};

/// Bytes of each log the driver may write.
pub(crate) const JIT_LOG: usize = 64 << 10;

/// The JIT's two logs (no NULs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JitLogs {
    /// `CU_JIT_INFO_LOG_BUFFER`.
    pub(crate) info: Vec<u8>,
    /// `CU_JIT_ERROR_LOG_BUFFER`.
    pub(crate) error: Vec<u8>,
}

/// The module loads with logs the executor makes.
pub(crate) trait JitLogDriverApi {
    /// cuModuleLoadDataEx with `options` (value options the caller checked: `CUjit_option`
    /// ids with their values) and both log buffers: the module or the error, and the logs.
    fn module_load_logged(
        &self,
        image: &[u8],
        options: &[(u32, u64)],
    ) -> (CuResult<Module>, JitLogs);
}

/// The text a driver wrote into a log buffer.
fn text(b: &[u8]) -> Vec<u8> {
    b.iter().take_while(|&&c| c != 0).copied().collect()
}

impl JitLogDriverApi for CudaDriver {
    fn module_load_logged(
        &self,
        image: &[u8],
        options: &[(u32, u64)],
    ) -> (CuResult<Module>, JitLogs) {
        if image.last() != Some(&0) {
            return (Err(CuError::INVALID_VALUE), JitLogs::default());
        }
        let mut info = vec![0u8; JIT_LOG];
        let mut error = vec![0u8; JIT_LOG];
        let mut ids: Vec<sys::CUjit_option> = Vec::with_capacity(options.len() + 4);
        let mut values: Vec<*mut std::ffi::c_void> = Vec::with_capacity(options.len() + 4);
        for &(id, value) in options {
            let Ok(value) = usize::try_from(value) else {
                return (Err(CuError::INVALID_VALUE), JitLogs::default());
            };
            // SAFETY: `id` is one of the value options the caller checked (a plain enum value).
            ids.push(unsafe { std::mem::transmute::<u32, sys::CUjit_option>(id) });
            values.push(value as *mut std::ffi::c_void);
        }
        for (id, value) in [
            (
                sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
                info.as_mut_ptr().cast(),
            ),
            (
                sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                JIT_LOG as *mut _,
            ),
            (
                sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
                error.as_mut_ptr().cast(),
            ),
            (
                sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                JIT_LOG as *mut _,
            ),
        ] {
            ids.push(id);
            values.push(value);
        }
        let mut m: sys::CUmodule = null_mut();
        // SAFETY: a symbol `load` found, through cudarc's binding; the image was checked
        // (module_image.rs) and ends in a NUL; the arrays hold `ids.len()` entries and the log
        // buffers, of the sizes given, outlive the call.
        let r = check(unsafe {
            sys::cuModuleLoadDataEx(
                &raw mut m,
                image.as_ptr().cast(),
                std::ffi::c_uint::try_from(ids.len()).unwrap_or(0),
                ids.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        });
        let logs = JitLogs {
            info: text(&info),
            error: text(&error),
        };
        (r.map(|()| Module::from_raw(m as Raw)), logs)
    }
}

impl JitLogDriverApi for NoDriver {
    fn module_load_logged(&self, _: &[u8], _: &[(u32, u64)]) -> (CuResult<Module>, JitLogs) {
        (Err(CuError::NO_DEVICE), JitLogs::default())
    }
}

//! `CUresult`, the driver API's status: [`DriverError`], the runtime codes the shared core
//! returns turned into driver codes, and the name/description tables behind `cuGetErrorName`
//! and `cuGetErrorString`.
//!
//! The core (session, memory, modules, ...) speaks `cudaError_t`, because the wire does. From
//! CUDA 11 on, every driver code has the runtime code of the same number where the runtime has
//! one (`CUDA_ERROR_INVALID_HANDLE` = 400 = `cudaErrorInvalidResourceHandle`); the runtime's own
//! codes below 100 that the driver lacks (`cudaErrorInvalidDevicePointer`, ...) are argument
//! errors there, and [`DriverError::from`] maps each to what the driver says for that mistake.

use std::{ffi::CStr, fmt, num::NonZeroU32, sync::atomic::AtomicBool};

use crate::{
    core::cuda_error::{self, CudaError},
    core::warnings,
    generated::{cudaError_t, driver_api as d, driver_tables::ERROR_NAMES},
};

/// A failed driver call: a nonzero `CUresult`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverError(NonZeroU32);

/// The result of a driver-face operation.
pub type DrvResult<T> = Result<T, DriverError>;

macro_rules! driver_errors {
    ($($konst:ident = $code:ident;)*) => {
        impl DriverError {
            $(
                #[doc = concat!("`", stringify!($code), "`")]
                pub const $konst: DriverError = DriverError::from_const(d::$code);
            )*
        }
    };
}

driver_errors! {
    INVALID_VALUE = CUDA_ERROR_INVALID_VALUE;
    OUT_OF_MEMORY = CUDA_ERROR_OUT_OF_MEMORY;
    NOT_INITIALIZED = CUDA_ERROR_NOT_INITIALIZED;
    DEINITIALIZED = CUDA_ERROR_DEINITIALIZED;
    NO_DEVICE = CUDA_ERROR_NO_DEVICE;
    INVALID_DEVICE = CUDA_ERROR_INVALID_DEVICE;
    INVALID_IMAGE = CUDA_ERROR_INVALID_IMAGE;
    INVALID_CONTEXT = CUDA_ERROR_INVALID_CONTEXT;
    FILE_NOT_FOUND = CUDA_ERROR_FILE_NOT_FOUND;
    INVALID_HANDLE = CUDA_ERROR_INVALID_HANDLE;
    NOT_FOUND = CUDA_ERROR_NOT_FOUND;
    LAUNCH_FAILED = CUDA_ERROR_LAUNCH_FAILED;
    PRIMARY_CONTEXT_ACTIVE = CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
    CONTEXT_IS_DESTROYED = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    NOT_SUPPORTED = CUDA_ERROR_NOT_SUPPORTED;
    NOT_READY = CUDA_ERROR_NOT_READY;
    ILLEGAL_STATE = CUDA_ERROR_ILLEGAL_STATE;
    SYSTEM_DRIVER_MISMATCH = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    UNKNOWN = CUDA_ERROR_UNKNOWN;
}

impl DriverError {
    const fn from_const(code: d::CUresult) -> Self {
        match NonZeroU32::new(code) {
            Some(c) => Self(c),
            None => panic!("CUDA_SUCCESS is not an error"),
        }
    }

    /// The `CUresult` value.
    pub fn code(self) -> d::CUresult {
        self.0.get()
    }

    /// `Ok(())` for `CUDA_SUCCESS`, the error otherwise.
    pub fn check(code: d::CUresult) -> DrvResult<()> {
        match NonZeroU32::new(code) {
            None => Ok(()),
            Some(c) => Err(Self(c)),
        }
    }
}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match error_name(self.code()) {
            Some(name) => write!(f, "{}({})", name.to_string_lossy(), self.code()),
            None => write!(f, "CUresult({})", self.code()),
        }
    }
}

impl From<CudaError> for DriverError {
    fn from(e: CudaError) -> Self {
        Self::from_const(driver_code(e.code()))
    }
}

/// The driver code for runtime code `code` (nonzero).
#[allow(non_upper_case_globals)]
pub const fn driver_code(code: cudaError_t) -> d::CUresult {
    use qcuda_proto::cuda_errors::*;
    match code {
        // Argument errors the runtime names more finely than the driver does.
        cudaErrorInvalidConfiguration
        | cudaErrorInvalidPitchValue
        | cudaErrorInvalidHostPointer
        | cudaErrorInvalidDevicePointer
        | cudaErrorInvalidTexture
        | cudaErrorInvalidTextureBinding
        | cudaErrorInvalidChannelDescriptor
        | cudaErrorInvalidMemcpyDirection
        | cudaErrorInvalidFilterSetting
        | cudaErrorInvalidNormSetting
        | cudaErrorAddressOfConstant
        | cudaErrorTextureFetchFailed
        | cudaErrorTextureNotBound
        | cudaErrorMixedDeviceExecution
        | cudaErrorMemoryValueTooLarge
        | cudaErrorInvalidSurface
        | cudaErrorDuplicateVariableName
        | cudaErrorDuplicateTextureName
        | cudaErrorDuplicateSurfaceName
        | cudaErrorMissingConfiguration
        | cudaErrorLaunchMaxDepthExceeded
        | cudaErrorLaunchFileScopedTex
        | cudaErrorLaunchFileScopedSurf
        | cudaErrorSyncDepthExceeded
        | cudaErrorLaunchPendingCountExceeded
        | cudaErrorSoftwareValidityNotEstablished => d::CUDA_ERROR_INVALID_VALUE,
        cudaErrorInvalidSymbol => d::CUDA_ERROR_NOT_FOUND,
        cudaErrorSynchronizationError => d::CUDA_ERROR_LAUNCH_FAILED,
        cudaErrorNotYetImplemented => d::CUDA_ERROR_NOT_SUPPORTED,
        cudaErrorInvalidDeviceFunction => d::CUDA_ERROR_INVALID_HANDLE,
        cudaErrorIncompatibleDriverContext => d::CUDA_ERROR_INVALID_CONTEXT,
        cudaErrorInsufficientDriver => d::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        cudaErrorPriorLaunchFailure => d::CUDA_ERROR_LAUNCH_FAILED,
        cudaErrorStartupFailure | cudaErrorApiFailureBase => d::CUDA_ERROR_UNKNOWN,
        // Everything else has the same number in both APIs.
        other => other,
    }
}

/// Turns the result of an exported driver function into its return value.
pub fn finish(result: DrvResult<()>) -> d::CUresult {
    match result {
        Ok(()) => d::CUDA_SUCCESS,
        Err(e) => e.code(),
    }
}

/// The body of every driver export qcuda does not implement: warns once (naming the function)
/// and returns `CUDA_ERROR_NOT_SUPPORTED`. Never pretends to succeed.
pub fn not_supported(name: &str, once: &AtomicBool) -> d::CUresult {
    warnings::warn_first(once, format_args!("{name} is not supported"));
    d::CUDA_ERROR_NOT_SUPPORTED
}

/// `CUDA_ERROR_...`, the name of a `CUresult` cuda.h defines.
pub fn error_name(code: d::CUresult) -> Option<&'static CStr> {
    ERROR_NAMES
        .binary_search_by_key(&code, |(c, _)| *c)
        .ok()
        .map(|i| ERROR_NAMES[i].1)
}

/// The description of a `CUresult` cuda.h defines: the runtime's wording for the code of the
/// same number (NVIDIA's driver and runtime describe a shared code alike), else the name.
pub fn error_string(code: d::CUresult) -> Option<&'static CStr> {
    let name = error_name(code)?;
    if code == d::CUDA_SUCCESS {
        return Some(c"no error");
    }
    Some(cuda_error::lookup(code).map_or(name, |e| e.description))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_codes_keep_their_number_and_runtime_only_ones_map_to_driver_codes() {
        assert_eq!(
            DriverError::from(CudaError::INVALID_RESOURCE_HANDLE),
            DriverError::INVALID_HANDLE
        );
        assert_eq!(
            DriverError::from(CudaError::NO_DEVICE),
            DriverError::NO_DEVICE
        );
        assert_eq!(
            DriverError::from(CudaError::INVALID_DEVICE_POINTER),
            DriverError::INVALID_VALUE
        );
        assert_eq!(
            DriverError::from(CudaError::INVALID_SYMBOL),
            DriverError::NOT_FOUND
        );
        // Every code the runtime can report becomes a code cuda.h defines.
        for code in 1..1000 {
            if cuda_error::lookup(code).is_some() {
                let drv = driver_code(code);
                assert!(error_name(drv).is_some(), "runtime {code} -> driver {drv}");
            }
        }
    }

    #[test]
    fn names_and_descriptions() {
        assert_eq!(error_name(1), Some(c"CUDA_ERROR_INVALID_VALUE"));
        assert_eq!(
            error_string(1),
            cuda_error::lookup(1).map(|e| e.description)
        );
        assert_eq!(
            error_string(202),
            Some(c"CUDA_ERROR_CONTEXT_ALREADY_CURRENT")
        );
        assert_eq!(error_name(0), Some(c"CUDA_SUCCESS"));
        assert_eq!(error_name(12345), None);
    }
}

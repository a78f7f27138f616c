//! `CudaError`, the error type of every internal guest-lib function, and the name/description
//! tables behind `cudaGetErrorName` and `cudaGetErrorString`.
//!
//! A `CudaError` is a nonzero `cudaError_t`: internal code returns `CudaResult<T>` and the
//! exported functions of the faces (runtime/, driver/) turn it back into the integer the
//! application sees (the driver face into the `CUresult` of the same number). The codes, names and
//! descriptions are qcuda-proto's `cuda_errors`, generated from the CUDA 13.0 headers and shared
//! with vhost-cuda, so they can never drift from the headers or from the host.

use std::{ffi::CStr, fmt, num::NonZeroU32};

use qcuda_proto::cuda_errors::{self as cu, ErrorEntry};

use crate::generated::cudaError_t;

/// A failed CUDA runtime call: a nonzero `cudaError_t`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaError(NonZeroU32);

/// The result of an internal runtime operation.
pub type CudaResult<T> = Result<T, CudaError>;

macro_rules! named_errors {
    ($($konst:ident = $code:ident;)*) => {
        impl CudaError {
            $(
                #[doc = concat!("`", stringify!($code), "`")]
                pub const $konst: CudaError = CudaError::from_const(cu::$code);
            )*
        }
    };
}

named_errors! {
    INVALID_VALUE = cudaErrorInvalidValue;
    MEMORY_ALLOCATION = cudaErrorMemoryAllocation;
    INITIALIZATION = cudaErrorInitializationError;
    CUDART_UNLOADING = cudaErrorCudartUnloading;
    INVALID_CONFIGURATION = cudaErrorInvalidConfiguration;
    INVALID_SYMBOL = cudaErrorInvalidSymbol;
    INVALID_DEVICE_POINTER = cudaErrorInvalidDevicePointer;
    INVALID_MEMCPY_DIRECTION = cudaErrorInvalidMemcpyDirection;
    INVALID_PITCH_VALUE = cudaErrorInvalidPitchValue;
    INVALID_CHANNEL_DESCRIPTOR = cudaErrorInvalidChannelDescriptor;
    INSUFFICIENT_DRIVER = cudaErrorInsufficientDriver;
    DEVICES_UNAVAILABLE = cudaErrorDevicesUnavailable;
    MISSING_CONFIGURATION = cudaErrorMissingConfiguration;
    INVALID_DEVICE_FUNCTION = cudaErrorInvalidDeviceFunction;
    NO_DEVICE = cudaErrorNoDevice;
    INVALID_DEVICE = cudaErrorInvalidDevice;
    INVALID_KERNEL_IMAGE = cudaErrorInvalidKernelImage;
    INVALID_RESOURCE_HANDLE = cudaErrorInvalidResourceHandle;
    NOT_READY = cudaErrorNotReady;
    LAUNCH_FAILURE = cudaErrorLaunchFailure;
    ILLEGAL_ADDRESS = cudaErrorIllegalAddress;
    NOT_SUPPORTED = cudaErrorNotSupported;
    HOST_MEMORY_ALREADY_REGISTERED = cudaErrorHostMemoryAlreadyRegistered;
    HOST_MEMORY_NOT_REGISTERED = cudaErrorHostMemoryNotRegistered;
    OPERATING_SYSTEM = cudaErrorOperatingSystem;
    GRAPH_EXEC_UPDATE_FAILURE = cudaErrorGraphExecUpdateFailure;
    STREAM_CAPTURE_UNSUPPORTED = cudaErrorStreamCaptureUnsupported;
    STREAM_CAPTURE_WRONG_THREAD = cudaErrorStreamCaptureWrongThread;
    LOSSY_QUERY = cudaErrorLossyQuery;
    UNKNOWN = cudaErrorUnknown;
    INVALID_CONTEXT = cudaErrorDeviceUninitialized;
    CONTEXT_IS_DESTROYED = cudaErrorContextIsDestroyed;
}

impl CudaError {
    const fn from_const(code: cudaError_t) -> Self {
        match NonZeroU32::new(code) {
            Some(c) => Self(c),
            // Only reached at compile time, for a constant that is cudaSuccess: a typo above.
            None => panic!("cudaSuccess is not an error"),
        }
    }

    /// The error for a status word from the host or the runtime, `None` for `cudaSuccess`.
    pub fn from_code(code: u32) -> Option<Self> {
        NonZeroU32::new(code).map(Self)
    }

    /// The `cudaError_t` value.
    pub fn code(self) -> cudaError_t {
        self.0.get()
    }

    /// `Ok(())` for `cudaSuccess`, the error otherwise.
    pub fn check(code: u32) -> CudaResult<()> {
        match Self::from_code(code) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

impl fmt::Debug for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = error_name(self.code()).to_string_lossy();
        write!(f, "{name}({})", self.code())
    }
}

/// The generated table entry for `code`, if CUDA 13.0 defines it.
pub fn lookup(code: cudaError_t) -> Option<&'static ErrorEntry> {
    cu::lookup(code)
}

/// What NVIDIA's runtime answers for codes it does not know, for both name and string.
pub const UNRECOGNIZED: &CStr = c"unrecognized error code";

/// `cudaGetErrorName`: the enumerator's name.
pub fn error_name(code: cudaError_t) -> &'static CStr {
    lookup(code).map_or(UNRECOGNIZED, |e| e.name)
}

/// `cudaGetErrorString`: the description from the header documentation.
pub fn error_string(code: cudaError_t) -> &'static CStr {
    lookup(code).map_or(UNRECOGNIZED, |e| e.description)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_enumerators() {
        for (code, name) in [
            (cu::cudaSuccess, "cudaSuccess"),
            (cu::cudaErrorInvalidValue, "cudaErrorInvalidValue"),
            (cu::cudaErrorNoDevice, "cudaErrorNoDevice"),
            (cu::cudaErrorIllegalAddress, "cudaErrorIllegalAddress"),
            (cu::cudaErrorNotSupported, "cudaErrorNotSupported"),
            (cu::cudaErrorUnknown, "cudaErrorUnknown"),
        ] {
            assert_eq!(error_name(code).to_str().unwrap(), name);
        }
    }

    #[test]
    fn strings_describe_the_error() {
        assert_eq!(
            error_string(cu::cudaErrorNoDevice).to_str().unwrap(),
            "This indicates that no CUDA-capable devices were detected by the installed CUDA \
             driver."
        );
        assert!(error_string(cu::cudaSuccess)
            .to_str()
            .unwrap()
            .contains("no errors"));
    }

    #[test]
    fn unknown_codes_are_unrecognized() {
        assert_eq!(error_name(12345), UNRECOGNIZED);
        assert_eq!(error_string(12345), UNRECOGNIZED);
        // 10 is a hole in the enum.
        assert_eq!(error_name(10), UNRECOGNIZED);
    }
}

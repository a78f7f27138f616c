//! Every `cudaError_t` of CUDA 13.0 (its value, name and description) and which of them are
//! sticky: the one home of these facts for guest-lib (`cudaGetErrorName`/`cudaGetErrorString`,
//! sticky errors per device) and vhost-cuda (driver codes to runtime codes, the sticky flag).
//!
//! `table.rs` is generated from the headers' driver_types.h by guest-lib/gen/bindgen.sh
//! (gen/error-table.py); the constants carry CUDA's own names (`cudaErrorIllegalAddress`). The
//! wire's `status` constants in wire.rs are the subset the protocol names itself; they stay there
//! because the kernel module includes wire.rs alone, and a test below holds them to this table.
#![allow(non_upper_case_globals)]

use core::ffi::CStr;

pub mod table;

pub use table::*;

/// One `cudaError_t` value as documented in driver_types.h.
#[derive(Debug)]
pub struct ErrorEntry {
    /// The numeric code.
    pub code: u32,
    /// The enumerator, e.g. `cudaErrorNoDevice`.
    pub name: &'static CStr,
    /// The first sentence of the header's documentation of the code.
    pub description: &'static CStr,
}

/// The entry for `code`, if CUDA 13.0 defines it.
pub fn lookup(code: u32) -> Option<&'static ErrorEntry> {
    ERRORS
        .binary_search_by_key(&code, |e| e.code)
        .ok()
        .and_then(|i| ERRORS.get(i))
}

/// The enumerator's name of `code` (`cudaErrorIllegalAddress`), if CUDA 13.0 defines it.
pub fn name(code: u32) -> Option<&'static str> {
    lookup(code).and_then(|e| e.name.to_str().ok())
}

/// The sticky errors: driver_types.h documents these as leaving the process in an inconsistent
/// state ("any further CUDA work will return the same error", or "the process must be
/// terminated and relaunched"), plus uncorrectable ECC and NVLink errors, after which nothing
/// in the context can be trusted either. Every later call in that context fails with the error
/// until the context is destroyed (`cudaDeviceReset`).
pub const STICKY: &[u32] = &[
    cudaErrorECCUncorrectable,
    cudaErrorNvlinkUncorrectable,
    cudaErrorContained,
    cudaErrorIllegalAddress,
    cudaErrorLaunchTimeout,
    cudaErrorAssert,
    cudaErrorHardwareStackError,
    cudaErrorIllegalInstruction,
    cudaErrorMisalignedAddress,
    cudaErrorInvalidAddressSpace,
    cudaErrorInvalidPc,
    cudaErrorLaunchFailure,
    cudaErrorTensorMemoryLeak,
    cudaErrorMpsClientTerminated,
    cudaErrorExternalDevice,
];

/// True for a sticky `cudaError_t` (see [`STICKY`]).
pub fn is_sticky(code: u32) -> bool {
    STICKY.contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status as s;

    #[test]
    fn table_is_sorted_unique_and_named_like_the_enum() {
        assert!(ERRORS.windows(2).all(|w| w[0].code < w[1].code));
        assert!(ERRORS.len() > 100);
        for e in ERRORS {
            let name = e.name.to_str().unwrap();
            assert!(
                name == "cudaSuccess" || name.starts_with("cudaError"),
                "{name}"
            );
            let desc = e.description.to_str().unwrap();
            assert!(
                !desc.is_empty() && !desc.contains("::") && !desc.contains('\\'),
                "{desc}"
            );
        }
        assert_eq!(
            name(cudaErrorIllegalAddress),
            Some("cudaErrorIllegalAddress")
        );
        assert_eq!(name(10), None, "10 is a hole in the enum");
    }

    #[test]
    fn sticky_codes_are_errors_of_the_table() {
        for &c in STICKY {
            assert!(c != cudaSuccess && lookup(c).is_some(), "{c}");
        }
        assert!(is_sticky(cudaErrorIllegalAddress));
        assert!(!is_sticky(cudaErrorInvalidValue));
        assert!(!is_sticky(cudaErrorLaunchOutOfResources));
    }

    #[test]
    fn wire_status_codes_agree_with_the_table() {
        for (wire, header) in [
            (s::SUCCESS, cudaSuccess),
            (s::INVALID_VALUE, cudaErrorInvalidValue),
            (s::MEMORY_ALLOCATION, cudaErrorMemoryAllocation),
            (s::INITIALIZATION_ERROR, cudaErrorInitializationError),
            (s::CUDART_UNLOADING, cudaErrorCudartUnloading),
            (s::INVALID_CONFIGURATION, cudaErrorInvalidConfiguration),
            (s::INVALID_SYMBOL, cudaErrorInvalidSymbol),
            (s::INVALID_DEVICE_POINTER, cudaErrorInvalidDevicePointer),
            (s::INVALID_MEMCPY_DIRECTION, cudaErrorInvalidMemcpyDirection),
            (s::INSUFFICIENT_DRIVER, cudaErrorInsufficientDriver),
            (s::DEVICES_UNAVAILABLE, cudaErrorDevicesUnavailable),
            (s::INVALID_DEVICE_FUNCTION, cudaErrorInvalidDeviceFunction),
            (s::NO_DEVICE, cudaErrorNoDevice),
            (s::INVALID_DEVICE, cudaErrorInvalidDevice),
            (s::UNSUPPORTED_LIMIT, cudaErrorUnsupportedLimit),
            (s::INVALID_KERNEL_IMAGE, cudaErrorInvalidKernelImage),
            (
                s::NO_KERNEL_IMAGE_FOR_DEVICE,
                cudaErrorNoKernelImageForDevice,
            ),
            (s::PEER_ACCESS_UNSUPPORTED, cudaErrorPeerAccessUnsupported),
            (s::INVALID_PTX, cudaErrorInvalidPtx),
            (s::INVALID_RESOURCE_HANDLE, cudaErrorInvalidResourceHandle),
            (s::SYMBOL_NOT_FOUND, cudaErrorSymbolNotFound),
            (s::NOT_READY, cudaErrorNotReady),
            (
                s::HOST_MEMORY_ALREADY_REGISTERED,
                cudaErrorHostMemoryAlreadyRegistered,
            ),
            (
                s::HOST_MEMORY_NOT_REGISTERED,
                cudaErrorHostMemoryNotRegistered,
            ),
            (s::ILLEGAL_ADDRESS, cudaErrorIllegalAddress),
            (s::LAUNCH_OUT_OF_RESOURCES, cudaErrorLaunchOutOfResources),
            (s::LAUNCH_FAILURE, cudaErrorLaunchFailure),
            (s::NOT_SUPPORTED, cudaErrorNotSupported),
            (s::ILLEGAL_STATE, cudaErrorIllegalState),
            (
                s::STREAM_CAPTURE_UNSUPPORTED,
                cudaErrorStreamCaptureUnsupported,
            ),
            (
                s::STREAM_CAPTURE_INVALIDATED,
                cudaErrorStreamCaptureInvalidated,
            ),
            (
                s::STREAM_CAPTURE_WRONG_THREAD,
                cudaErrorStreamCaptureWrongThread,
            ),
            (
                s::GRAPH_EXEC_UPDATE_FAILURE,
                cudaErrorGraphExecUpdateFailure,
            ),
            (s::UNKNOWN, cudaErrorUnknown),
        ] {
            assert_eq!(wire, header, "{:?}", name(header));
        }
    }
}

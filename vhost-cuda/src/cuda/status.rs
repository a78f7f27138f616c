//! Driver result codes (`CUresult`) to runtime status codes (`cudaError_t`).
//!
//! The wire carries `cudaError_t` values, because the guest library hands them to the
//! application unchanged; the executor gets `CUresult` values from the driver. Most codes are
//! numerically equal, but the names differ (`CUDA_ERROR_INVALID_HANDLE` is
//! `cudaErrorInvalidResourceHandle`), a few driver codes have no runtime counterpart, and some
//! runtime codes mark the context as unusable ("sticky"). The table below spells out every
//! `CUresult` of CUDA 13.0's `cuda.h` with the `cudaError_t` of 13.0's `driver_types.h` that
//! libcudart itself reports for it, so the mapping can be audited line by line. The runtime
//! codes, their names and which are sticky are qcuda-proto's `cuda_errors`, the table guest-lib
//! uses too.

use cudarc::driver::sys::CUresult as R;
use qcuda_proto::cuda_errors::{self, *};

/// cudaErrorUnknown: the answer for driver codes the table does not know.
pub(crate) const UNKNOWN: u32 = cudaErrorUnknown;

/// One row: the driver code and the runtime code.
struct Row {
    cu: R,
    cuda: u32,
}

const fn row(cu: R, cuda: u32) -> Row {
    Row { cu, cuda }
}

/// Every `CUresult`, sorted by driver code.
static TABLE: &[Row] = &[
    row(R::CUDA_SUCCESS, cudaSuccess),
    row(R::CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue),
    row(R::CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation),
    row(R::CUDA_ERROR_NOT_INITIALIZED, cudaErrorInitializationError),
    row(R::CUDA_ERROR_DEINITIALIZED, cudaErrorCudartUnloading),
    row(R::CUDA_ERROR_PROFILER_DISABLED, cudaErrorProfilerDisabled),
    row(
        R::CUDA_ERROR_PROFILER_NOT_INITIALIZED,
        cudaErrorProfilerNotInitialized,
    ),
    row(
        R::CUDA_ERROR_PROFILER_ALREADY_STARTED,
        cudaErrorProfilerAlreadyStarted,
    ),
    row(
        R::CUDA_ERROR_PROFILER_ALREADY_STOPPED,
        cudaErrorProfilerAlreadyStopped,
    ),
    row(R::CUDA_ERROR_STUB_LIBRARY, cudaErrorStubLibrary),
    row(
        R::CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
        cudaErrorCallRequiresNewerDriver,
    ),
    row(
        R::CUDA_ERROR_DEVICE_UNAVAILABLE,
        cudaErrorDevicesUnavailable,
    ),
    row(R::CUDA_ERROR_NO_DEVICE, cudaErrorNoDevice),
    row(R::CUDA_ERROR_INVALID_DEVICE, cudaErrorInvalidDevice),
    row(
        R::CUDA_ERROR_DEVICE_NOT_LICENSED,
        cudaErrorDeviceNotLicensed,
    ),
    row(R::CUDA_ERROR_INVALID_IMAGE, cudaErrorInvalidKernelImage),
    row(R::CUDA_ERROR_INVALID_CONTEXT, cudaErrorDeviceUninitialized),
    // Deprecated in the driver; the runtime has no such code.
    row(R::CUDA_ERROR_CONTEXT_ALREADY_CURRENT, cudaErrorUnknown),
    row(R::CUDA_ERROR_MAP_FAILED, cudaErrorMapBufferObjectFailed),
    row(R::CUDA_ERROR_UNMAP_FAILED, cudaErrorUnmapBufferObjectFailed),
    row(R::CUDA_ERROR_ARRAY_IS_MAPPED, cudaErrorArrayIsMapped),
    row(R::CUDA_ERROR_ALREADY_MAPPED, cudaErrorAlreadyMapped),
    row(
        R::CUDA_ERROR_NO_BINARY_FOR_GPU,
        cudaErrorNoKernelImageForDevice,
    ),
    row(R::CUDA_ERROR_ALREADY_ACQUIRED, cudaErrorAlreadyAcquired),
    row(R::CUDA_ERROR_NOT_MAPPED, cudaErrorNotMapped),
    row(R::CUDA_ERROR_NOT_MAPPED_AS_ARRAY, cudaErrorNotMappedAsArray),
    row(
        R::CUDA_ERROR_NOT_MAPPED_AS_POINTER,
        cudaErrorNotMappedAsPointer,
    ),
    row(R::CUDA_ERROR_ECC_UNCORRECTABLE, cudaErrorECCUncorrectable),
    row(R::CUDA_ERROR_UNSUPPORTED_LIMIT, cudaErrorUnsupportedLimit),
    row(
        R::CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
        cudaErrorDeviceAlreadyInUse,
    ),
    row(
        R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        cudaErrorPeerAccessUnsupported,
    ),
    row(R::CUDA_ERROR_INVALID_PTX, cudaErrorInvalidPtx),
    row(
        R::CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
        cudaErrorInvalidGraphicsContext,
    ),
    row(
        R::CUDA_ERROR_NVLINK_UNCORRECTABLE,
        cudaErrorNvlinkUncorrectable,
    ),
    row(
        R::CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
        cudaErrorJitCompilerNotFound,
    ),
    row(
        R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        cudaErrorUnsupportedPtxVersion,
    ),
    row(
        R::CUDA_ERROR_JIT_COMPILATION_DISABLED,
        cudaErrorJitCompilationDisabled,
    ),
    row(
        R::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
        cudaErrorUnsupportedExecAffinity,
    ),
    row(
        R::CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
        cudaErrorUnsupportedDevSideSync,
    ),
    row(R::CUDA_ERROR_CONTAINED, cudaErrorContained),
    row(R::CUDA_ERROR_INVALID_SOURCE, cudaErrorInvalidSource),
    row(R::CUDA_ERROR_FILE_NOT_FOUND, cudaErrorFileNotFound),
    row(
        R::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
        cudaErrorSharedObjectSymbolNotFound,
    ),
    row(
        R::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
        cudaErrorSharedObjectInitFailed,
    ),
    row(R::CUDA_ERROR_OPERATING_SYSTEM, cudaErrorOperatingSystem),
    row(R::CUDA_ERROR_INVALID_HANDLE, cudaErrorInvalidResourceHandle),
    row(R::CUDA_ERROR_ILLEGAL_STATE, cudaErrorIllegalState),
    row(R::CUDA_ERROR_LOSSY_QUERY, cudaErrorLossyQuery),
    row(R::CUDA_ERROR_NOT_FOUND, cudaErrorSymbolNotFound),
    row(R::CUDA_ERROR_NOT_READY, cudaErrorNotReady),
    row(R::CUDA_ERROR_ILLEGAL_ADDRESS, cudaErrorIllegalAddress),
    row(
        R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        cudaErrorLaunchOutOfResources,
    ),
    row(R::CUDA_ERROR_LAUNCH_TIMEOUT, cudaErrorLaunchTimeout),
    row(
        R::CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,
        cudaErrorLaunchIncompatibleTexturing,
    ),
    row(
        R::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        cudaErrorPeerAccessAlreadyEnabled,
    ),
    row(
        R::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        cudaErrorPeerAccessNotEnabled,
    ),
    row(
        R::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
        cudaErrorSetOnActiveProcess,
    ),
    row(
        R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
        cudaErrorContextIsDestroyed,
    ),
    row(R::CUDA_ERROR_ASSERT, cudaErrorAssert),
    row(R::CUDA_ERROR_TOO_MANY_PEERS, cudaErrorTooManyPeers),
    row(
        R::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        cudaErrorHostMemoryAlreadyRegistered,
    ),
    row(
        R::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        cudaErrorHostMemoryNotRegistered,
    ),
    row(
        R::CUDA_ERROR_HARDWARE_STACK_ERROR,
        cudaErrorHardwareStackError,
    ),
    row(
        R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
        cudaErrorIllegalInstruction,
    ),
    row(R::CUDA_ERROR_MISALIGNED_ADDRESS, cudaErrorMisalignedAddress),
    row(
        R::CUDA_ERROR_INVALID_ADDRESS_SPACE,
        cudaErrorInvalidAddressSpace,
    ),
    row(R::CUDA_ERROR_INVALID_PC, cudaErrorInvalidPc),
    row(R::CUDA_ERROR_LAUNCH_FAILED, cudaErrorLaunchFailure),
    row(
        R::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
        cudaErrorCooperativeLaunchTooLarge,
    ),
    row(R::CUDA_ERROR_TENSOR_MEMORY_LEAK, cudaErrorTensorMemoryLeak),
    row(R::CUDA_ERROR_NOT_PERMITTED, cudaErrorNotPermitted),
    row(R::CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported),
    row(R::CUDA_ERROR_SYSTEM_NOT_READY, cudaErrorSystemNotReady),
    row(
        R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        cudaErrorSystemDriverMismatch,
    ),
    row(
        R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
        cudaErrorCompatNotSupportedOnDevice,
    ),
    row(
        R::CUDA_ERROR_MPS_CONNECTION_FAILED,
        cudaErrorMpsConnectionFailed,
    ),
    row(R::CUDA_ERROR_MPS_RPC_FAILURE, cudaErrorMpsRpcFailure),
    row(
        R::CUDA_ERROR_MPS_SERVER_NOT_READY,
        cudaErrorMpsServerNotReady,
    ),
    row(
        R::CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
        cudaErrorMpsMaxClientsReached,
    ),
    row(
        R::CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
        cudaErrorMpsMaxConnectionsReached,
    ),
    row(
        R::CUDA_ERROR_MPS_CLIENT_TERMINATED,
        cudaErrorMpsClientTerminated,
    ),
    row(R::CUDA_ERROR_CDP_NOT_SUPPORTED, cudaErrorCdpNotSupported),
    row(
        R::CUDA_ERROR_CDP_VERSION_MISMATCH,
        cudaErrorCdpVersionMismatch,
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        cudaErrorStreamCaptureUnsupported,
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        cudaErrorStreamCaptureInvalidated,
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_MERGE,
        cudaErrorStreamCaptureMerge,
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        cudaErrorStreamCaptureUnmatched,
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
        cudaErrorStreamCaptureUnjoined,
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        cudaErrorStreamCaptureIsolation,
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        cudaErrorStreamCaptureImplicit,
    ),
    row(R::CUDA_ERROR_CAPTURED_EVENT, cudaErrorCapturedEvent),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        cudaErrorStreamCaptureWrongThread,
    ),
    row(R::CUDA_ERROR_TIMEOUT, cudaErrorTimeout),
    row(
        R::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
        cudaErrorGraphExecUpdateFailure,
    ),
    row(R::CUDA_ERROR_EXTERNAL_DEVICE, cudaErrorExternalDevice),
    row(
        R::CUDA_ERROR_INVALID_CLUSTER_SIZE,
        cudaErrorInvalidClusterSize,
    ),
    row(
        R::CUDA_ERROR_FUNCTION_NOT_LOADED,
        cudaErrorFunctionNotLoaded,
    ),
    row(
        R::CUDA_ERROR_INVALID_RESOURCE_TYPE,
        cudaErrorInvalidResourceType,
    ),
    row(
        R::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
        cudaErrorInvalidResourceConfiguration,
    ),
    // Confidential-computing key rotation: the 13.0 runtime has no counterpart.
    row(R::CUDA_ERROR_KEY_ROTATION, cudaErrorUnknown),
    row(R::CUDA_ERROR_UNKNOWN, cudaErrorUnknown),
];

fn lookup(cu: u32) -> Option<&'static Row> {
    TABLE
        .binary_search_by_key(&cu, |r| r.cu as u32)
        .ok()
        .and_then(|i| TABLE.get(i))
}

/// The `cudaError_t` libcudart reports for driver code `cu`; unknown codes become
/// cudaErrorUnknown.
pub(crate) fn cuda_status(cu: u32) -> u32 {
    lookup(cu).map_or(UNKNOWN, |r| r.cuda)
}

/// True if runtime status `status` corrupts the context: every later call in that context
/// fails with it until the context is destroyed (cudaDeviceReset).
pub(crate) fn is_sticky(status: u32) -> bool {
    cuda_errors::is_sticky(status)
}

/// A short name for driver code `cu`, for logs (`CUDA_ERROR_ILLEGAL_ADDRESS`).
pub(crate) fn driver_name(cu: u32) -> String {
    match lookup(cu) {
        Some(r) => format!("{:?}", r.cu),
        None => format!("CUresult({cu})"),
    }
}

/// The runtime name of `status` (`cudaErrorIllegalAddress`), for logs.
pub(crate) fn cuda_name(status: u32) -> &'static str {
    cuda_errors::name(status).unwrap_or("cudaErrorUnknown")
}

#[cfg(test)]
mod tests {
    use qcuda_proto::status;

    use super::*;

    #[test]
    fn table_is_sorted_unique_and_complete_for_the_bindings() {
        for w in TABLE.windows(2) {
            assert!(
                (w[0].cu as u32) < (w[1].cu as u32),
                "{:?} before {:?}",
                w[0].cu,
                w[1].cu
            );
        }
        // Every row is found again by lookup.
        for r in TABLE {
            assert_eq!(cuda_status(r.cu as u32), r.cuda);
        }
    }

    #[test]
    fn codes_whose_names_differ_map_to_the_runtime_code() {
        let cases = [
            (R::CUDA_SUCCESS, status::SUCCESS),
            (R::CUDA_ERROR_INVALID_VALUE, status::INVALID_VALUE),
            (R::CUDA_ERROR_OUT_OF_MEMORY, status::MEMORY_ALLOCATION),
            (R::CUDA_ERROR_NOT_INITIALIZED, status::INITIALIZATION_ERROR),
            (R::CUDA_ERROR_NO_DEVICE, status::NO_DEVICE),
            (R::CUDA_ERROR_INVALID_DEVICE, status::INVALID_DEVICE),
            (R::CUDA_ERROR_INVALID_IMAGE, status::INVALID_KERNEL_IMAGE),
            (
                R::CUDA_ERROR_NO_BINARY_FOR_GPU,
                status::NO_KERNEL_IMAGE_FOR_DEVICE,
            ),
            (R::CUDA_ERROR_INVALID_PTX, status::INVALID_PTX),
            (
                R::CUDA_ERROR_INVALID_HANDLE,
                status::INVALID_RESOURCE_HANDLE,
            ),
            (R::CUDA_ERROR_NOT_FOUND, status::SYMBOL_NOT_FOUND),
            (R::CUDA_ERROR_NOT_READY, status::NOT_READY),
            (R::CUDA_ERROR_ILLEGAL_ADDRESS, status::ILLEGAL_ADDRESS),
            (
                R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                status::LAUNCH_OUT_OF_RESOURCES,
            ),
            (R::CUDA_ERROR_LAUNCH_FAILED, status::LAUNCH_FAILURE),
            (R::CUDA_ERROR_NOT_SUPPORTED, status::NOT_SUPPORTED),
            (R::CUDA_ERROR_UNKNOWN, status::UNKNOWN),
            (R::CUDA_ERROR_DEINITIALIZED, 4),
            (R::CUDA_ERROR_INVALID_CONTEXT, 201),
            (R::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, 708),
            (R::CUDA_ERROR_CONTEXT_ALREADY_CURRENT, status::UNKNOWN),
            (R::CUDA_ERROR_KEY_ROTATION, status::UNKNOWN),
        ];
        for (cu, want) in cases {
            assert_eq!(cuda_status(cu as u32), want, "{cu:?}");
        }
        assert_eq!(cuda_name(700), "cudaErrorIllegalAddress");
        assert_eq!(driver_name(400), "CUDA_ERROR_INVALID_HANDLE");
        assert_eq!(driver_name(12345), "CUresult(12345)");
    }

    #[test]
    fn unknown_codes_become_cuda_error_unknown() {
        for cu in [9, 33, 47, 203, 227, 919, 1000, u32::MAX] {
            assert_eq!(cuda_status(cu), status::UNKNOWN, "{cu}");
        }
    }

    #[test]
    fn sticky_is_qcuda_protos_set() {
        assert!(is_sticky(status::ILLEGAL_ADDRESS));
        assert!(!is_sticky(status::LAUNCH_OUT_OF_RESOURCES));
    }

    /// Cross-checks every row against the CUDA 13.0 headers when they are at hand
    /// (`QCUDA_CUDA_INCLUDE=$(scripts/cuda-toolchain.sh)/include`): the driver name and value
    /// in cuda.h. The runtime side is qcuda-proto's table, generated from driver_types.h.
    #[test]
    fn table_matches_cuda_headers_when_available() {
        let Some(dir) = std::env::var_os("QCUDA_CUDA_INCLUDE") else {
            eprintln!("skipped: QCUDA_CUDA_INCLUDE not set");
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        let cuda_h = std::fs::read_to_string(dir.join("cuda.h")).expect("cuda.h");
        let value_of = |text: &str, name: &str| -> Option<u32> {
            text.lines().find_map(|l| {
                let l = l.trim();
                let rest = l.strip_prefix(name)?.trim_start();
                let rest = rest.strip_prefix('=')?.trim_start();
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            })
        };
        // Every driver code in cuda.h has a row.
        for l in cuda_h.lines() {
            let l = l.trim();
            if !l.starts_with("CUDA_ERROR_") {
                continue;
            }
            let name = l.split_whitespace().next().unwrap_or_default();
            if let Some(v) = value_of(&cuda_h, name) {
                assert!(lookup(v).is_some(), "{name} = {v} has no row");
            }
        }
        for r in TABLE {
            let cu_name = format!("{:?}", r.cu);
            match value_of(&cuda_h, &cu_name) {
                Some(v) => assert_eq!(v, r.cu as u32, "{cu_name} in cuda.h"),
                // Codes newer than the headers (cudarc's bindings may run ahead).
                None => eprintln!("note: {cu_name} not in these headers"),
            }
        }
    }
}

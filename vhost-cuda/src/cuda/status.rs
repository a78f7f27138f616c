//! Driver result codes (`CUresult`) to runtime status codes (`cudaError_t`).
//!
//! The wire carries `cudaError_t` values, because the guest library hands them to the
//! application unchanged; the executor gets `CUresult` values from the driver. Most codes are
//! numerically equal, but the names differ (`CUDA_ERROR_INVALID_HANDLE` is
//! `cudaErrorInvalidResourceHandle`), a few driver codes have no runtime counterpart, and some
//! runtime codes mark the context as unusable ("sticky"). The table below spells out every
//! `CUresult` of CUDA 13.0's `cuda.h` with the `cudaError_t` of 13.0's `driver_types.h` that
//! libcudart itself reports for it, so the mapping can be audited line by line.

use cudarc::driver::sys::CUresult as R;

/// cudaErrorUnknown: the answer for driver codes the table does not know.
pub(crate) const UNKNOWN: u32 = qcuda_proto::status::UNKNOWN;

/// One row: the driver code, the runtime code and its name. Which runtime codes are sticky is
/// qcuda-proto's `status::STICKY`.
struct Row {
    cu: R,
    cuda: u32,
    name: &'static str,
}

const fn row(cu: R, cuda: u32, name: &'static str) -> Row {
    Row { cu, cuda, name }
}

/// Every `CUresult`, sorted by driver code.
static TABLE: &[Row] = &[
    row(R::CUDA_SUCCESS, 0, "cudaSuccess"),
    row(R::CUDA_ERROR_INVALID_VALUE, 1, "cudaErrorInvalidValue"),
    row(R::CUDA_ERROR_OUT_OF_MEMORY, 2, "cudaErrorMemoryAllocation"),
    row(
        R::CUDA_ERROR_NOT_INITIALIZED,
        3,
        "cudaErrorInitializationError",
    ),
    row(R::CUDA_ERROR_DEINITIALIZED, 4, "cudaErrorCudartUnloading"),
    row(
        R::CUDA_ERROR_PROFILER_DISABLED,
        5,
        "cudaErrorProfilerDisabled",
    ),
    row(
        R::CUDA_ERROR_PROFILER_NOT_INITIALIZED,
        6,
        "cudaErrorProfilerNotInitialized",
    ),
    row(
        R::CUDA_ERROR_PROFILER_ALREADY_STARTED,
        7,
        "cudaErrorProfilerAlreadyStarted",
    ),
    row(
        R::CUDA_ERROR_PROFILER_ALREADY_STOPPED,
        8,
        "cudaErrorProfilerAlreadyStopped",
    ),
    row(R::CUDA_ERROR_STUB_LIBRARY, 34, "cudaErrorStubLibrary"),
    row(
        R::CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
        36,
        "cudaErrorCallRequiresNewerDriver",
    ),
    row(
        R::CUDA_ERROR_DEVICE_UNAVAILABLE,
        46,
        "cudaErrorDevicesUnavailable",
    ),
    row(R::CUDA_ERROR_NO_DEVICE, 100, "cudaErrorNoDevice"),
    row(R::CUDA_ERROR_INVALID_DEVICE, 101, "cudaErrorInvalidDevice"),
    row(
        R::CUDA_ERROR_DEVICE_NOT_LICENSED,
        102,
        "cudaErrorDeviceNotLicensed",
    ),
    row(
        R::CUDA_ERROR_INVALID_IMAGE,
        200,
        "cudaErrorInvalidKernelImage",
    ),
    row(
        R::CUDA_ERROR_INVALID_CONTEXT,
        201,
        "cudaErrorDeviceUninitialized",
    ),
    // Deprecated in the driver; the runtime has no such code.
    row(
        R::CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
        UNKNOWN,
        "cudaErrorUnknown",
    ),
    row(
        R::CUDA_ERROR_MAP_FAILED,
        205,
        "cudaErrorMapBufferObjectFailed",
    ),
    row(
        R::CUDA_ERROR_UNMAP_FAILED,
        206,
        "cudaErrorUnmapBufferObjectFailed",
    ),
    row(R::CUDA_ERROR_ARRAY_IS_MAPPED, 207, "cudaErrorArrayIsMapped"),
    row(R::CUDA_ERROR_ALREADY_MAPPED, 208, "cudaErrorAlreadyMapped"),
    row(
        R::CUDA_ERROR_NO_BINARY_FOR_GPU,
        209,
        "cudaErrorNoKernelImageForDevice",
    ),
    row(
        R::CUDA_ERROR_ALREADY_ACQUIRED,
        210,
        "cudaErrorAlreadyAcquired",
    ),
    row(R::CUDA_ERROR_NOT_MAPPED, 211, "cudaErrorNotMapped"),
    row(
        R::CUDA_ERROR_NOT_MAPPED_AS_ARRAY,
        212,
        "cudaErrorNotMappedAsArray",
    ),
    row(
        R::CUDA_ERROR_NOT_MAPPED_AS_POINTER,
        213,
        "cudaErrorNotMappedAsPointer",
    ),
    row(
        R::CUDA_ERROR_ECC_UNCORRECTABLE,
        214,
        "cudaErrorECCUncorrectable",
    ),
    row(
        R::CUDA_ERROR_UNSUPPORTED_LIMIT,
        215,
        "cudaErrorUnsupportedLimit",
    ),
    row(
        R::CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
        216,
        "cudaErrorDeviceAlreadyInUse",
    ),
    row(
        R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        217,
        "cudaErrorPeerAccessUnsupported",
    ),
    row(R::CUDA_ERROR_INVALID_PTX, 218, "cudaErrorInvalidPtx"),
    row(
        R::CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
        219,
        "cudaErrorInvalidGraphicsContext",
    ),
    row(
        R::CUDA_ERROR_NVLINK_UNCORRECTABLE,
        220,
        "cudaErrorNvlinkUncorrectable",
    ),
    row(
        R::CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
        221,
        "cudaErrorJitCompilerNotFound",
    ),
    row(
        R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        222,
        "cudaErrorUnsupportedPtxVersion",
    ),
    row(
        R::CUDA_ERROR_JIT_COMPILATION_DISABLED,
        223,
        "cudaErrorJitCompilationDisabled",
    ),
    row(
        R::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
        224,
        "cudaErrorUnsupportedExecAffinity",
    ),
    row(
        R::CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
        225,
        "cudaErrorUnsupportedDevSideSync",
    ),
    row(R::CUDA_ERROR_CONTAINED, 226, "cudaErrorContained"),
    row(R::CUDA_ERROR_INVALID_SOURCE, 300, "cudaErrorInvalidSource"),
    row(R::CUDA_ERROR_FILE_NOT_FOUND, 301, "cudaErrorFileNotFound"),
    row(
        R::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
        302,
        "cudaErrorSharedObjectSymbolNotFound",
    ),
    row(
        R::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
        303,
        "cudaErrorSharedObjectInitFailed",
    ),
    row(
        R::CUDA_ERROR_OPERATING_SYSTEM,
        304,
        "cudaErrorOperatingSystem",
    ),
    row(
        R::CUDA_ERROR_INVALID_HANDLE,
        400,
        "cudaErrorInvalidResourceHandle",
    ),
    row(R::CUDA_ERROR_ILLEGAL_STATE, 401, "cudaErrorIllegalState"),
    row(R::CUDA_ERROR_LOSSY_QUERY, 402, "cudaErrorLossyQuery"),
    row(R::CUDA_ERROR_NOT_FOUND, 500, "cudaErrorSymbolNotFound"),
    row(R::CUDA_ERROR_NOT_READY, 600, "cudaErrorNotReady"),
    row(
        R::CUDA_ERROR_ILLEGAL_ADDRESS,
        700,
        "cudaErrorIllegalAddress",
    ),
    row(
        R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        701,
        "cudaErrorLaunchOutOfResources",
    ),
    row(R::CUDA_ERROR_LAUNCH_TIMEOUT, 702, "cudaErrorLaunchTimeout"),
    row(
        R::CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,
        703,
        "cudaErrorLaunchIncompatibleTexturing",
    ),
    row(
        R::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        704,
        "cudaErrorPeerAccessAlreadyEnabled",
    ),
    row(
        R::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        705,
        "cudaErrorPeerAccessNotEnabled",
    ),
    row(
        R::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
        708,
        "cudaErrorSetOnActiveProcess",
    ),
    row(
        R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
        709,
        "cudaErrorContextIsDestroyed",
    ),
    row(R::CUDA_ERROR_ASSERT, 710, "cudaErrorAssert"),
    row(R::CUDA_ERROR_TOO_MANY_PEERS, 711, "cudaErrorTooManyPeers"),
    row(
        R::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        712,
        "cudaErrorHostMemoryAlreadyRegistered",
    ),
    row(
        R::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        713,
        "cudaErrorHostMemoryNotRegistered",
    ),
    row(
        R::CUDA_ERROR_HARDWARE_STACK_ERROR,
        714,
        "cudaErrorHardwareStackError",
    ),
    row(
        R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
        715,
        "cudaErrorIllegalInstruction",
    ),
    row(
        R::CUDA_ERROR_MISALIGNED_ADDRESS,
        716,
        "cudaErrorMisalignedAddress",
    ),
    row(
        R::CUDA_ERROR_INVALID_ADDRESS_SPACE,
        717,
        "cudaErrorInvalidAddressSpace",
    ),
    row(R::CUDA_ERROR_INVALID_PC, 718, "cudaErrorInvalidPc"),
    row(R::CUDA_ERROR_LAUNCH_FAILED, 719, "cudaErrorLaunchFailure"),
    row(
        R::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
        720,
        "cudaErrorCooperativeLaunchTooLarge",
    ),
    row(
        R::CUDA_ERROR_TENSOR_MEMORY_LEAK,
        721,
        "cudaErrorTensorMemoryLeak",
    ),
    row(R::CUDA_ERROR_NOT_PERMITTED, 800, "cudaErrorNotPermitted"),
    row(R::CUDA_ERROR_NOT_SUPPORTED, 801, "cudaErrorNotSupported"),
    row(
        R::CUDA_ERROR_SYSTEM_NOT_READY,
        802,
        "cudaErrorSystemNotReady",
    ),
    row(
        R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        803,
        "cudaErrorSystemDriverMismatch",
    ),
    row(
        R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
        804,
        "cudaErrorCompatNotSupportedOnDevice",
    ),
    row(
        R::CUDA_ERROR_MPS_CONNECTION_FAILED,
        805,
        "cudaErrorMpsConnectionFailed",
    ),
    row(R::CUDA_ERROR_MPS_RPC_FAILURE, 806, "cudaErrorMpsRpcFailure"),
    row(
        R::CUDA_ERROR_MPS_SERVER_NOT_READY,
        807,
        "cudaErrorMpsServerNotReady",
    ),
    row(
        R::CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
        808,
        "cudaErrorMpsMaxClientsReached",
    ),
    row(
        R::CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
        809,
        "cudaErrorMpsMaxConnectionsReached",
    ),
    row(
        R::CUDA_ERROR_MPS_CLIENT_TERMINATED,
        810,
        "cudaErrorMpsClientTerminated",
    ),
    row(
        R::CUDA_ERROR_CDP_NOT_SUPPORTED,
        811,
        "cudaErrorCdpNotSupported",
    ),
    row(
        R::CUDA_ERROR_CDP_VERSION_MISMATCH,
        812,
        "cudaErrorCdpVersionMismatch",
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        900,
        "cudaErrorStreamCaptureUnsupported",
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        901,
        "cudaErrorStreamCaptureInvalidated",
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_MERGE,
        902,
        "cudaErrorStreamCaptureMerge",
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        903,
        "cudaErrorStreamCaptureUnmatched",
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
        904,
        "cudaErrorStreamCaptureUnjoined",
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        905,
        "cudaErrorStreamCaptureIsolation",
    ),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        906,
        "cudaErrorStreamCaptureImplicit",
    ),
    row(R::CUDA_ERROR_CAPTURED_EVENT, 907, "cudaErrorCapturedEvent"),
    row(
        R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        908,
        "cudaErrorStreamCaptureWrongThread",
    ),
    row(R::CUDA_ERROR_TIMEOUT, 909, "cudaErrorTimeout"),
    row(
        R::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
        910,
        "cudaErrorGraphExecUpdateFailure",
    ),
    row(
        R::CUDA_ERROR_EXTERNAL_DEVICE,
        911,
        "cudaErrorExternalDevice",
    ),
    row(
        R::CUDA_ERROR_INVALID_CLUSTER_SIZE,
        912,
        "cudaErrorInvalidClusterSize",
    ),
    row(
        R::CUDA_ERROR_FUNCTION_NOT_LOADED,
        913,
        "cudaErrorFunctionNotLoaded",
    ),
    row(
        R::CUDA_ERROR_INVALID_RESOURCE_TYPE,
        914,
        "cudaErrorInvalidResourceType",
    ),
    row(
        R::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
        915,
        "cudaErrorInvalidResourceConfiguration",
    ),
    // Confidential-computing key rotation: the 13.0 runtime has no counterpart.
    row(R::CUDA_ERROR_KEY_ROTATION, UNKNOWN, "cudaErrorUnknown"),
    row(R::CUDA_ERROR_UNKNOWN, 999, "cudaErrorUnknown"),
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
    qcuda_proto::status::is_sticky(status)
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
    TABLE
        .iter()
        .find(|r| r.cuda == status && r.cuda != UNKNOWN)
        .map_or("cudaErrorUnknown", |r| r.name)
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
    fn sticky_set_is_the_context_corrupting_errors() {
        for s in [
            214, 220, 226, 700, 702, 710, 714, 715, 716, 717, 718, 719, 721, 810, 911,
        ] {
            assert!(is_sticky(s), "{s}");
        }
        for s in [0, 1, 2, 98, 200, 209, 400, 500, 600, 701, 720, 801, 999] {
            assert!(!is_sticky(s), "{s}");
        }
    }

    /// Cross-checks every row against the CUDA 13.0 headers when they are at hand
    /// (`QCUDA_CUDA_INCLUDE=$(scripts/cuda-toolchain.sh)/include`): the driver name and value
    /// in cuda.h, the runtime name and value in driver_types.h.
    #[test]
    fn table_matches_cuda_headers_when_available() {
        let Some(dir) = std::env::var_os("QCUDA_CUDA_INCLUDE") else {
            eprintln!("skipped: QCUDA_CUDA_INCLUDE not set");
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        let cuda_h = std::fs::read_to_string(dir.join("cuda.h")).expect("cuda.h");
        let types_h = std::fs::read_to_string(dir.join("driver_types.h")).expect("driver_types.h");
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
            if r.cuda == 0 {
                continue;
            }
            if let Some(v) = value_of(&types_h, r.name) {
                assert_eq!(v, r.cuda, "{} in driver_types.h", r.name);
            } else {
                eprintln!("note: {} not in these headers", r.name);
            }
        }
    }
}

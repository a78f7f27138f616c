//! Every export of NVIDIA's libcudart.so.13 that qcuda does not implement yet.
//!
//! Each returns `cudaErrorNotSupported`, records it as the thread's last error, and prints
//! `qcuda: <name> is not supported` on stderr the first time it is called. None pretends to
//! succeed. The stubs take no parameters: the caller's arguments sit unused in registers and on
//! its own stack frame, and the `int` result is where the caller expects its `cudaError_t`.
//! That holds for every function below, all of which return `cudaError_t` or (the three hidden
//! `__cuda*` ones, which no CUDA 13 header declares and nvcc 13 never emits) nothing the caller
//! reads as a pointer. Functions with other return types (`cudaGetErrorString`,
//! `cudaCreateChannelDesc`, `__cudaRegisterFatBinary`, ...) are implemented elsewhere in runtime/.
//!
//! Implementing a function means moving its name from this list to a `cuda_api!` block; the
//! linker refuses a duplicate, and tests/exported_symbols.rs refuses a missing one.

/// Declares not-supported exports.
macro_rules! not_supported {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported yet.")]
        #[no_mangle]
        pub extern "C" fn $name() -> $crate::generated::cudaError_t {
            static ONCE: ::std::sync::atomic::AtomicBool = ::std::sync::atomic::AtomicBool::new(false);
            $crate::core::last_error::not_supported(stringify!($name), &ONCE)
        }
    )*};
}

not_supported! {
    __cudaGetProcAddress,
    __cudaRegisterHostVar,
    __cudaRegisterUnifiedTable,
    cudaArrayGetMemoryRequirements,
    cudaArrayGetPlane,
    cudaArrayGetSparseProperties,
    cudaChooseDevice,
    cudaDestroyExternalMemory,
    cudaDestroyExternalSemaphore,
    cudaDeviceFlushGPUDirectRDMAWrites,
    cudaDeviceGetHostAtomicCapabilities,
    cudaDeviceGetNvSciSyncAttributes,
    cudaDeviceGetP2PAtomicCapabilities,
    cudaDeviceGetTexture1DLinearMaxWidth,
    cudaDeviceRegisterAsyncNotification,
    cudaDeviceUnregisterAsyncNotification,
    cudaEGLStreamConsumerAcquireFrame,
    cudaEGLStreamConsumerConnect,
    cudaEGLStreamConsumerConnectWithFlags,
    cudaEGLStreamConsumerDisconnect,
    cudaEGLStreamConsumerReleaseFrame,
    cudaEGLStreamProducerConnect,
    cudaEGLStreamProducerDisconnect,
    cudaEGLStreamProducerPresentFrame,
    cudaEGLStreamProducerReturnFrame,
    cudaEventCreateFromEGLSync,
    cudaExternalMemoryGetMappedBuffer,
    cudaExternalMemoryGetMappedMipmappedArray,
    cudaFuncGetParamInfo,
    cudaGLGetDevices,
    cudaGLMapBufferObject,
    cudaGLMapBufferObjectAsync,
    cudaGLRegisterBufferObject,
    cudaGLSetBufferObjectMapFlags,
    cudaGLSetGLDevice,
    cudaGLUnmapBufferObject,
    cudaGLUnmapBufferObjectAsync,
    cudaGLUnregisterBufferObject,
    cudaGetFuncBySymbol,
    cudaGraphAddExternalSemaphoresSignalNode,
    cudaGraphAddExternalSemaphoresWaitNode,
    cudaGraphExecExternalSemaphoresSignalNodeSetParams,
    cudaGraphExecExternalSemaphoresWaitNodeSetParams,
    cudaGraphExternalSemaphoresSignalNodeGetParams,
    cudaGraphExternalSemaphoresSignalNodeSetParams,
    cudaGraphExternalSemaphoresWaitNodeGetParams,
    cudaGraphExternalSemaphoresWaitNodeSetParams,
    cudaGraphicsEGLRegisterImage,
    cudaGraphicsGLRegisterBuffer,
    cudaGraphicsGLRegisterImage,
    cudaGraphicsMapResources,
    cudaGraphicsResourceGetMappedEglFrame,
    cudaGraphicsResourceGetMappedMipmappedArray,
    cudaGraphicsResourceGetMappedPointer,
    cudaGraphicsResourceSetMapFlags,
    cudaGraphicsSubResourceGetMappedArray,
    cudaGraphicsUnmapResources,
    cudaGraphicsUnregisterResource,
    cudaGraphicsVDPAURegisterOutputSurface,
    cudaGraphicsVDPAURegisterVideoSurface,
    cudaImportExternalMemory,
    cudaImportExternalSemaphore,
    cudaKernelSetAttributeForDevice,
    cudaLibraryEnumerateKernels,
    cudaLibraryGetGlobal,
    cudaLibraryGetKernel,
    cudaLibraryGetKernelCount,
    cudaLibraryGetManaged,
    cudaLibraryGetUnifiedFunction,
    cudaLibraryLoadData,
    cudaLibraryLoadFromFile,
    cudaLibraryUnload,
    cudaLogsCurrent,
    cudaLogsDumpToFile,
    cudaLogsDumpToMemory,
    cudaLogsRegisterCallback,
    cudaLogsUnregisterCallback,
    cudaMemAdvise,
    cudaMemDiscardAndPrefetchBatchAsync,
    cudaMemDiscardAndPrefetchBatchAsync_ptsz,
    cudaMemDiscardBatchAsync,
    cudaMemDiscardBatchAsync_ptsz,
    cudaMemPrefetchAsync,
    cudaMemPrefetchAsync_ptsz,
    cudaMemPrefetchBatchAsync,
    cudaMemPrefetchBatchAsync_ptsz,
    cudaMemRangeGetAttribute,
    cudaMemRangeGetAttributes,
    cudaMemcpy3DBatchAsync,
    cudaMemcpy3DBatchAsync_ptsz,
    cudaMemcpy3DPeer,
    cudaMemcpy3DPeerAsync,
    cudaMemcpy3DPeerAsync_ptsz,
    cudaMemcpy3DPeer_ptds,
    cudaMemcpyBatchAsync,
    cudaMemcpyBatchAsync_ptsz,
    cudaMipmappedArrayGetMemoryRequirements,
    cudaMipmappedArrayGetSparseProperties,
    cudaSetValidDevices,
    cudaSignalExternalSemaphoresAsync,
    cudaSignalExternalSemaphoresAsync_ptsz,
    cudaVDPAUGetDevice,
    cudaVDPAUSetVDPAUDevice,
    cudaWaitExternalSemaphoresAsync,
    cudaWaitExternalSemaphoresAsync_ptsz,
}

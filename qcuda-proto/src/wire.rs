// SPDX-License-Identifier: Apache-2.0 OR MIT
//! The qcuda wire format and ioctl ABI: the one definition shared by guest-lib, qcuda.ko and
//! vhost-cuda.
//!
//! This file is plain `core` Rust with no dependencies and no `unsafe`, because the guest kernel
//! module includes it verbatim with `#[path]` (Kbuild cannot use crates.io). Everything that
//! crosses a trust boundary is encoded and decoded explicitly as little-endian bytes; decoding
//! validates and never panics.
//!
//! A request travels as one virtqueue descriptor chain:
//!
//! ```text
//! [device-readable]  RequestHeader (REQUEST_HEADER_SIZE bytes)
//! [device-readable]  the bytes of every `In` buffer, in table order, concatenated
//! [device-writable]  the bytes of every `Out` buffer, in table order, concatenated
//! [device-writable]  ResponseHeader (RESPONSE_HEADER_SIZE bytes)
//! ```
//!
//! Descriptor boundaries carry no meaning: the device treats the readable and the writable part
//! of a chain each as one byte stream and cuts it by the lengths in the header's buffer table.

/// "QCUD" read as a little-endian u32.
pub const MAGIC: u32 = 0x4455_4351;
/// Wire version. A peer answers a different version with `status::INSUFFICIENT_DRIVER`.
pub const VERSION: u16 = 1;

/// Virtio device id of the qcuda device (unassigned in the virtio spec).
pub const VIRTIO_ID_CUDA: u32 = 56;
/// PCI vendor and device id of `vhost-user-cuda-pci` (modern virtio: 0x1040 + 56).
pub const PCI_VENDOR_ID: u16 = 0x1af4;
/// See [`PCI_VENDOR_ID`].
pub const PCI_DEVICE_ID: u16 = 0x1078;
/// Number of virtqueues the device exposes.
pub const NUM_QUEUES: usize = 2;
/// Queue 0 carries requests.
pub const REQUEST_QUEUE: u16 = 0;
/// Queue 1 is reserved for host-to-guest events (async errors, callbacks).
pub const EVENT_QUEUE: u16 = 1;
/// Size of each virtqueue.
pub const QUEUE_SIZE: u16 = 256;

/// Buffers one request may name.
pub const MAX_BUFFERS: usize = 8;
/// Inline 64-bit arguments in a request.
pub const MAX_ARGS: usize = 8;
/// Inline 64-bit return values in a response.
pub const MAX_RETS: usize = 7;
/// Most descriptors (guest-physical runs) one chain may use, header and response included.
/// The kernel module refuses larger requests with E2BIG; guest-lib splits them.
pub const MAX_CHAIN_SEGMENTS: usize = 4096;
/// Buffers up to this many bytes are copied into kernel bounce memory; larger ones are pinned.
pub const BOUNCE_THRESHOLD: u64 = 64 * 1024;
/// Largest single buffer. guest-lib cuts larger copies into chunks of at most this size.
pub const MAX_BUFFER_LEN: u64 = 64 * 1024 * 1024;
/// Chunk size guest-lib uses for large memcpys (several chunks are kept in flight).
pub const COPY_CHUNK: u64 = 8 * 1024 * 1024;

/// `ProcessCheckpoint` action: the target's `PROCESS_STATE_*` (`cuCheckpointProcessGetState`).
pub const PROCESS_GET_STATE: u64 = 0;
/// `ProcessCheckpoint` action: RUNNING -> LOCKED (`cuCheckpointProcessLock`): the target's
/// further calls wait.
pub const PROCESS_LOCK: u64 = 1;
/// `ProcessCheckpoint` action: LOCKED -> CHECKPOINTED (`cuCheckpointProcessCheckpoint`): its
/// device memory moves to host memory and the GPU memory is released.
pub const PROCESS_CHECKPOINT: u64 = 2;
/// `ProcessCheckpoint` action: CHECKPOINTED -> LOCKED (`cuCheckpointProcessRestore`).
pub const PROCESS_RESTORE: u64 = 3;
/// `ProcessCheckpoint` action: LOCKED -> RUNNING (`cuCheckpointProcessUnlock`).
pub const PROCESS_UNLOCK: u64 = 4;
/// `ProcessCheckpoint` action: the target's restore thread (`cuCheckpointProcessGetRestoreThreadId`).
pub const PROCESS_GET_RESTORE_THREAD: u64 = 5;
/// `CU_PROCESS_STATE_RUNNING`.
pub const PROCESS_STATE_RUNNING: u64 = 0;
/// `CU_PROCESS_STATE_LOCKED`.
pub const PROCESS_STATE_LOCKED: u64 = 1;
/// `CU_PROCESS_STATE_CHECKPOINTED`.
pub const PROCESS_STATE_CHECKPOINTED: u64 = 2;
/// `CU_PROCESS_STATE_FAILED`.
pub const PROCESS_STATE_FAILED: u64 = 3;

/// `MemCreate` flag: generic compression (`CU_MEM_ALLOCATION_COMP_GENERIC`).
pub const VMM_FLAG_COMPRESSED: u64 = 1 << 0;
/// `MemCreate` flag: `allocFlags.gpuDirectRDMACapable`.
pub const VMM_FLAG_RDMA_CAPABLE: u64 = 1 << 1;
/// Every `VMM_FLAG_*` bit.
pub const VMM_FLAGS: u64 = VMM_FLAG_COMPRESSED | VMM_FLAG_RDMA_CAPABLE;
/// `MemCreate` handle type: a POSIX file descriptor.
pub const VMM_HANDLE_POSIX_FD: u64 = 1;

/// `IpcExport`/`IpcImport` kind: device memory of a `Malloc` (legacy `cuIpcGetMemHandle`).
pub const IPC_KIND_MEMORY: u64 = 1;
/// `IpcExport`/`IpcImport` kind: a VMM allocation handle (`cuMemExportToShareableHandle`
/// with a POSIX file descriptor).
pub const IPC_KIND_VMM: u64 = 2;
/// `IpcExport`/`IpcImport` kind: a memory pool created shareable as POSIX file descriptors
/// (`cuMemPoolExportToShareableHandle`).
pub const IPC_KIND_POOL: u64 = 3;
/// `IpcExport`/`IpcImport` kind: an event created with `cudaEventInterprocess` and
/// `cudaEventDisableTiming` (`cuIpcGetEventHandle`).
pub const IPC_KIND_EVENT: u64 = 4;
/// `MemPoolCreate` args[1]: the pool is shareable as POSIX file descriptors.
pub const POOL_HANDLE_POSIX_FD: u64 = 1;
/// Bytes of a pool pointer's export record (`CUmemPoolPtrExportData`), the driver's own.
pub const POOL_PTR_EXPORT_LEN: usize = 64;
/// The bytes of a guest-side IPC handle (`cudaIpcMemHandle_t`, and the contents of the file
/// a POSIX-descriptor handle is): magic u32 @0 ([`IPC_HANDLE_MAGIC`]), kind u32 @4, token
/// u64 @8, secret [u64; 2] @16, device u32 @32 (of the exporter), reserved up to 64.
pub const IPC_HANDLE_LEN: usize = 64;
/// First word of a guest-side IPC handle ("QIPC").
pub const IPC_HANDLE_MAGIC: u32 = 0x4350_4951;

/// Request flag: fire-and-forget. The caller does not wait for the result; the device executes
/// the op in stream order and reports a failure at the session's next synchronising op.
pub const FLAG_ASYNC: u16 = 1 << 0;
/// All request flags this version knows.
pub const KNOWN_FLAGS: u16 = FLAG_ASYNC;

/// `IoctlCall` flag (bits 16..31 are the ioctl's own and never reach the device): how the caller
/// waits for its answer. Without either wait flag qcuda.ko polls the ring for a short while and
/// then sleeps until the completion interrupt. `CALL_WAIT_SPIN`: it polls until the answer comes
/// (CUDA's spin and yield scheduling; the guest kernel is preemptible, so a polling caller still
/// gives the CPU to others that need it).
pub const CALL_WAIT_SPIN: u32 = 1 << 16;
/// `IoctlCall` flag: the caller sleeps at once until the completion interrupt (CUDA's blocking
/// synchronisation, `cudaDeviceScheduleBlockingSync`, `cudaEventBlockingSync`).
pub const CALL_WAIT_BLOCK: u32 = 1 << 17;

/// How a waited call waits in qcuda.ko (from `CALL_WAIT_SPIN` / `CALL_WAIT_BLOCK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Poll for a short while, then sleep.
    #[default]
    Poll,
    /// Poll until the answer comes.
    Spin,
    /// Sleep at once.
    Block,
}

impl WaitMode {
    /// The `IoctlCall` flag bits of this mode.
    pub const fn call_flags(self) -> u32 {
        match self {
            Self::Poll => 0,
            Self::Spin => CALL_WAIT_SPIN,
            Self::Block => CALL_WAIT_BLOCK,
        }
    }
}

/// Ops with this bit set may only be issued by the kernel module itself.
pub const KERNEL_ONLY_OP: u32 = 0x8000_0000;

/// Response flag: the session holds a sticky (context-corrupting) error.
pub const RESP_FLAG_STICKY: u32 = 1 << 0;
/// Response flag: the session's kernels printed (device `printf`) and the output, flushed by a
/// synchronisation, waits on the host: fetch it with `Op::TakeOutput`.
pub const RESP_FLAG_OUTPUT: u32 = 1 << 1;
/// Response flags bits 16..31 carry the `cudaError_t` of an earlier fire-and-forget
/// (`FLAG_ASYNC`) op of the session that failed, 0 if none. Nobody waits for a fire-and-forget
/// op's own response, so the device reports its failure once, in its reply to the session's next
/// waited-for op, as CUDA reports asynchronous errors at a later call.
pub const RESP_DEFERRED_SHIFT: u32 = 16;

/// Why a byte sequence is not a valid wire value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than the structure needs.
    Short,
    /// The magic number is wrong.
    BadMagic,
    /// The version is not [`VERSION`].
    BadVersion,
    /// More buffers than [`MAX_BUFFERS`].
    TooManyBuffers,
    /// A buffer direction is neither `In` nor `Out`, or an `In` follows an `Out`.
    BadDirection,
    /// A buffer is longer than [`MAX_BUFFER_LEN`].
    BufferTooLong,
    /// A reserved field or flag is not zero.
    Reserved,
    /// The op code is unknown.
    UnknownOp,
    /// The buffer counts do not match what the op takes.
    BadShape,
}

/// CUDA runtime status codes (`cudaError_t`) used on the wire. The response status is always a
/// `cudaError_t` value; the guest library returns it to the application unchanged. Names,
/// descriptions and the sticky set of every code are in `qcuda_proto::cuda_errors`, whose tests
/// hold these values to it.
pub mod status {
    /// cudaSuccess
    pub const SUCCESS: u32 = 0;
    /// cudaErrorInvalidValue
    pub const INVALID_VALUE: u32 = 1;
    /// cudaErrorMemoryAllocation
    pub const MEMORY_ALLOCATION: u32 = 2;
    /// cudaErrorInitializationError
    pub const INITIALIZATION_ERROR: u32 = 3;
    /// cudaErrorCudartUnloading
    pub const CUDART_UNLOADING: u32 = 4;
    /// cudaErrorInvalidConfiguration
    pub const INVALID_CONFIGURATION: u32 = 9;
    /// cudaErrorInvalidSymbol
    pub const INVALID_SYMBOL: u32 = 13;
    /// cudaErrorInvalidDevicePointer
    pub const INVALID_DEVICE_POINTER: u32 = 17;
    /// cudaErrorInvalidMemcpyDirection
    pub const INVALID_MEMCPY_DIRECTION: u32 = 21;
    /// cudaErrorInsufficientDriver
    pub const INSUFFICIENT_DRIVER: u32 = 35;
    /// cudaErrorDevicesUnavailable
    pub const DEVICES_UNAVAILABLE: u32 = 46;
    /// cudaErrorInvalidDeviceFunction
    pub const INVALID_DEVICE_FUNCTION: u32 = 98;
    /// cudaErrorNoDevice
    pub const NO_DEVICE: u32 = 100;
    /// cudaErrorInvalidDevice
    pub const INVALID_DEVICE: u32 = 101;
    /// cudaErrorUnsupportedLimit
    pub const UNSUPPORTED_LIMIT: u32 = 215;
    /// cudaErrorInvalidKernelImage
    pub const INVALID_KERNEL_IMAGE: u32 = 200;
    /// cudaErrorDeviceUninitialized, which is CUDA_ERROR_INVALID_CONTEXT ("invalid device
    /// context").
    pub const INVALID_CONTEXT: u32 = 201;
    /// cudaErrorNoKernelImageForDevice
    pub const NO_KERNEL_IMAGE_FOR_DEVICE: u32 = 209;
    /// cudaErrorPeerAccessUnsupported
    pub const PEER_ACCESS_UNSUPPORTED: u32 = 217;
    /// cudaErrorInvalidPtx
    pub const INVALID_PTX: u32 = 218;
    /// cudaErrorInvalidResourceHandle
    pub const INVALID_RESOURCE_HANDLE: u32 = 400;
    /// cudaErrorSymbolNotFound
    pub const SYMBOL_NOT_FOUND: u32 = 500;
    /// cudaErrorNotReady
    pub const NOT_READY: u32 = 600;
    /// cudaErrorHostMemoryAlreadyRegistered
    pub const HOST_MEMORY_ALREADY_REGISTERED: u32 = 712;
    /// cudaErrorHostMemoryNotRegistered
    pub const HOST_MEMORY_NOT_REGISTERED: u32 = 713;
    /// cudaErrorIllegalAddress
    pub const ILLEGAL_ADDRESS: u32 = 700;
    /// cudaErrorLaunchOutOfResources
    pub const LAUNCH_OUT_OF_RESOURCES: u32 = 701;
    /// cudaErrorLaunchFailure
    pub const LAUNCH_FAILURE: u32 = 719;
    /// cudaErrorNotSupported
    pub const NOT_SUPPORTED: u32 = 801;
    /// cudaErrorNotPermitted
    pub const NOT_PERMITTED: u32 = 800;
    /// cudaErrorIllegalState
    pub const ILLEGAL_STATE: u32 = 401;
    /// cudaErrorStreamCaptureUnsupported
    pub const STREAM_CAPTURE_UNSUPPORTED: u32 = 900;
    /// cudaErrorStreamCaptureInvalidated
    pub const STREAM_CAPTURE_INVALIDATED: u32 = 901;
    /// cudaErrorStreamCaptureWrongThread
    pub const STREAM_CAPTURE_WRONG_THREAD: u32 = 908;
    /// cudaErrorGraphExecUpdateFailure
    pub const GRAPH_EXEC_UPDATE_FAILURE: u32 = 910;
    /// cudaErrorUnknown
    pub const UNKNOWN: u32 = 999;
}

/// Direction of a buffer, seen from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Direction {
    /// Guest to host: device-readable.
    In = 1,
    /// Host to guest: device-writable.
    Out = 2,
}

impl Direction {
    /// Decodes a direction.
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::In),
            2 => Some(Self::Out),
            _ => None,
        }
    }
}

macro_rules! ops {
    ($( $(#[$doc:meta])* $name:ident = $val:literal, ins $ins:expr, outs $outs:expr; )*) => {
        /// Operation codes. Each op takes a fixed number of `In` and `Out` buffers
        /// ([`Op::shape`]); inline arguments are described on each variant.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum Op {
            $( $(#[$doc])* $name = $val, )*
        }

        impl Op {
            /// Every op, for tests and tables.
            pub const ALL: &'static [Op] = &[$(Op::$name,)*];

            /// Decodes an op code.
            pub fn from_u32(v: u32) -> Option<Self> {
                match v {
                    $( $val => Some(Op::$name), )*
                    _ => None,
                }
            }

            /// Number of `In` and `Out` buffers the op takes.
            pub fn shape(self) -> (usize, usize) {
                match self {
                    $( Op::$name => ($ins, $outs), )*
                }
            }
        }
    };
}

ops! {
    /// Handshake. args[0] = guest wire version. rets[0] = host wire version,
    /// rets[1] = number of GPUs, rets[2] = driver version (0: no driver),
    /// rets[3] = sessions open on this device connection, the caller's included.
    Hello = 0x0001, ins 0, outs 0;
    /// Transport self-test: the device copies in-buffer 0 to out-buffer 0 (same length) and
    /// returns rets[0] = checksum of the bytes it read.
    Echo = 0x0002, ins 1, outs 1;
    /// Host GPUs. Out-buffer 0 receives up to len / GPU_INFO_SIZE `GpuInfo` records.
    /// rets[0] = GPU count, rets[1] = driver version (0: no driver loaded; still SUCCESS).
    HostInfo = 0x0003, ins 0, outs 1;
    /// Kernel module only: the session (open file) is gone; free everything it owns.
    SessionClose = 0x8000_0001, ins 0, outs 0;
    /// Kernel module only: sent by the kernel module when a driver instance binds to the
    /// device, before any session of it exists: every session the device still holds belongs
    /// to a previous driver instance and is closed; rets[0] = number of sessions closed.
    /// `hdr.session` carries no meaning (the module sends 0). A device that predates this op
    /// answers `status::NOT_SUPPORTED`.
    DriverReset = 0x8000_0002, ins 0, outs 0;
    /// Kernel module only: guest pages the module holds for the session (allocated by mmap of
    /// /dev/qcuda, or user pages it pinned) are to be mapped by the session's worker at guest
    /// user address args[0] (page-aligned), args[1] bytes (a page multiple), and registered with
    /// the driver (device-mapped, portable). args[2] = `HOST_MAP_*` flags. In-buffer 0 is the
    /// run table: `HostRun` records, in address order, whose lengths add up to args[1].
    /// rets[0] = the device address of args[0] (equal to it when the worker could map the
    /// range at the same address). The pages stay held by the module until `HostUnmap` or
    /// `SessionClose` is answered.
    HostMap = 0x8000_0003, ins 1, outs 0;
    /// Kernel module only: the worker unregisters and unmaps the range `HostMap` mapped at
    /// args[0]. Answered `HOST_MEMORY_NOT_REGISTERED` if nothing is mapped there; after any
    /// answer the host no longer maps it.
    HostUnmap = 0x8000_0004, ins 0, outs 0;

    /// rets[0] = number of devices the session may use.
    DeviceCount = 0x0100, ins 0, outs 0;
    /// Device `hdr.device`: out-buffer 0 receives one `GpuInfo`.
    DeviceInfo = 0x0101, ins 0, outs 1;
    /// Device `hdr.device`: in-buffer 0 holds i32 CUdevice_attribute ids, out-buffer 0 (same
    /// length) receives their i32 values.
    DeviceAttributes = 0x0102, ins 1, outs 1;
    /// rets[0] = cuDriverGetVersion.
    DriverVersion = 0x0103, ins 0, outs 0;
    /// Waits for all work of the session on device `hdr.device`.
    DeviceSynchronize = 0x0104, ins 0, outs 0;
    /// Frees everything the session owns on device `hdr.device` and clears its sticky error.
    DeviceReset = 0x0105, ins 0, outs 0;
    /// rets[0] = free bytes, rets[1] = total bytes on device `hdr.device`.
    MemGetInfo = 0x0106, ins 0, outs 0;
    /// Device `printf` output waiting on the host (see `RESP_FLAG_OUTPUT`), oldest first:
    /// out-buffer 0 receives up to its length in bytes; rets[0] = bytes written. The response
    /// carries `RESP_FLAG_OUTPUT` again while more remains.
    TakeOutput = 0x0107, ins 0, outs 1;
    /// args[0] = a `cudaLimit` (0..=6). rets[0] = its value in the session's context on
    /// `hdr.device`.
    DeviceGetLimit = 0x0108, ins 0, outs 0;
    /// args[0] = a `cudaLimit` (0..=6), args[1] = the new value.
    DeviceSetLimit = 0x0109, ins 0, outs 0;

    /// args[0] = size. rets[0] = device pointer.
    Malloc = 0x0110, ins 0, outs 0;
    /// args[0] = device pointer (0 is a no-op).
    Free = 0x0111, ins 0, outs 0;
    /// args[0] = destination device pointer, args[1] = stream handle (0: legacy stream).
    /// In-buffer 0 is the data; its length is the size.
    MemcpyHtoD = 0x0112, ins 1, outs 0;
    /// args[0] = source device pointer, args[1] = stream handle. Out-buffer 0 receives the
    /// data; its length is the size.
    MemcpyDtoH = 0x0113, ins 0, outs 1;
    /// args[0] = destination, args[1] = source, args[2] = size, args[3] = stream handle.
    MemcpyDtoD = 0x0114, ins 0, outs 0;
    /// args[0] = destination, args[1] = value, args[2] = element count, args[3] = stream
    /// handle, args[4] = element width in bytes: 0 or 1 (bytes, the value's low 8 bits), 2 or 4
    /// (`cuMemsetD16`/`D32`: the low 16 or 32 bits; the destination aligned to it).
    Memset = 0x0115, ins 0, outs 0;
    /// A copy between two device-addressable ranges, each the session's device memory or its
    /// host-mapped guest memory (`HostMap`): args[0] = destination, args[1] = source (device
    /// addresses), args[2] = size, args[3] = stream handle. The driver's own DMA moves the
    /// bytes, in stream order; nothing crosses the virtqueue.
    MemcpyMapped = 0x0116, ins 0, outs 0;
    /// Managed memory placed on the device ([`Op::ManagedPlace`], `HOST_MAP_MANAGED`): args[0]
    /// = the allocation's address, args[1] = [`MANAGED_TO_DEVICE`] or [`MANAGED_TO_HOST`],
    /// args[2] = a stream handle, args[3] = [`MANAGED_SCOPE_GLOBAL`] or
    /// [`MANAGED_SCOPE_STREAM`] (the allocation is attached to stream args[2] alone).
    /// To the device: guest RAM → device in stream order on args[2]; with the global scope the
    /// session's other streams of the device (and the ones it creates later) wait for the copy
    /// too, since any of them may touch the memory next. To the host (answered once the bytes
    /// are in guest RAM): device → guest RAM, but only once no work that may touch the
    /// allocation can still run: every stream of the session on the device idle (global
    /// scope), or stream args[2] idle (stream scope). rets[0] = 1 if the bytes moved; 0 if not:
    /// work that may touch them still runs, or args[2] is being captured (a capture records
    /// work for later; the graph's launch migrates then).
    ManagedMigrate = 0x0117, ins 0, outs 0;
    /// `cudaMallocManaged`'s device memory: args[0] = bytes the guest will map (a page
    /// multiple), args[1] = 0, or a [`MANAGED_ALIGN`]-aligned address of [`MANAGED_WINDOW_BASE`]'s
    /// window (or the host-mapping window) that the guest holds free for it (the driver may
    /// honour it). The worker reserves an address range with the
    /// driver, backs it with device memory of the request's device and makes it accessible
    /// (counted against the VM's device-memory quota). rets[0] = its address (a multiple of
    /// [`MANAGED_ALIGN`]; the guest maps the allocation's pages at that address in its
    /// process, which is the pointer the program holds), rets[1] = bytes reserved there
    /// (args[0] rounded up to [`MANAGED_ALIGN`]; the guest keeps all of them free). Then
    /// `HostMap` with `HOST_MAP_MANAGED` at rets[0] brings the guest pages.
    ManagedPlace = 0x0118, ins 0, outs 0;
    /// Frees device memory of [`Op::ManagedPlace`] at args[0] that `HostMap` has not taken (the
    /// guest could not use the address). Afterwards `HostUnmap` frees it.
    ManagedUnplace = 0x0119, ins 0, outs 0;

    /// In-buffer 0 is a whole fatbin (or cubin/PTX) image. rets[0] = module handle.
    ModuleLoad = 0x0120, ins 1, outs 0;
    /// args[0] = module handle.
    ModuleUnload = 0x0121, ins 0, outs 0;
    /// args[0] = module handle; in-buffer 0 = function name (no NUL). rets[0] = function
    /// handle, rets[1] = parameter count; out-buffer 0 receives up to len / 8 `ParamInfo`
    /// records (if rets[1] is larger, ask again with a larger buffer).
    ModuleGetFunction = 0x0122, ins 1, outs 1;
    /// args[0] = module handle; in-buffer 0 = variable name (no NUL). rets[0] = device
    /// address, rets[1] = size in bytes.
    ModuleGetGlobal = 0x0123, ins 1, outs 0;
    /// args[0] = module handle. Out-buffer 0 receives the names of the module's kernels, each
    /// NUL-terminated, in the driver's order, if they all fit. rets[0] = the number of kernels,
    /// rets[1] = the bytes the names take (ask again with that much room when it is larger).
    ModuleFunctionNames = 0x0124, ins 0, outs 1;
    /// Links the inputs in in-buffer 0 (`link::LinkRequest`: `cuLinkCreate`'s options and the
    /// images `cuLinkAddData` gathered) with the driver's JIT linker, as `cuLinkComplete`.
    /// Out-buffer 0 receives the linked image, then the info log, then the error log (no NULs),
    /// if all fit. rets[0..3] = their lengths (ask again with that much room when they do not).
    Link = 0x0125, ins 1, outs 1;

    /// args[0] = function handle, args[1] = grid x | grid y << 32, args[2] = grid z |
    /// block x << 32, args[3] = block y | block z << 32, args[4] = dynamic shared memory bytes,
    /// args[5] = stream handle, args[6] = `LAUNCH_*` flags. In-buffer 0 = the parameter block,
    /// each parameter at its `ParamInfo` offset.
    LaunchKernel = 0x0130, ins 1, outs 0;
    /// args[0] = function handle; in-buffer 0 holds i32 `CUfunction_attribute` ids (0..=15),
    /// out-buffer 0 (same length) receives their i32 values (cuFuncGetAttribute).
    FuncAttributes = 0x0131, ins 1, outs 1;
    /// args[0] = function handle, args[1] = `CUfunction_attribute` id (0..=15), args[2] = the
    /// value (an i32, sign-extended or not).
    FuncSetAttribute = 0x0132, ins 0, outs 0;
    /// args[0] = function handle, args[1] = block size, args[2] = dynamic shared memory bytes,
    /// args[3] = flags (cudaOccupancyDisableCachingOverride = 1). rets[0] = the most blocks of
    /// that size one multiprocessor runs at once.
    OccupancyMaxActiveBlocks = 0x0133, ins 0, outs 0;

    /// args[0] = flags (cudaStreamNonBlocking = 1), args[1] = priority. rets[0] = stream handle,
    /// rets[1] = the priority the stream got (the driver clamps it to the device's range; i32
    /// as u32).
    StreamCreate = 0x0140, ins 0, outs 0;
    /// args[0] = stream handle.
    StreamDestroy = 0x0141, ins 0, outs 0;
    /// args[0] = stream handle (0: legacy stream).
    StreamSynchronize = 0x0142, ins 0, outs 0;
    /// args[0] = stream handle. Status NOT_READY while work is pending.
    StreamQuery = 0x0143, ins 0, outs 0;
    /// args[0] = stream handle, args[1] = event handle, args[2] = flags.
    StreamWaitEvent = 0x0144, ins 0, outs 0;
    /// Device `hdr.device`: rets[0] = least (numerically greatest), rets[1] = greatest stream
    /// priority (cuCtxGetStreamPriorityRange; i32 as u32).
    StreamPriorityRange = 0x0145, ins 0, outs 0;
    /// args[0] = stream handle (0: legacy stream of `hdr.device`). rets[0] = cuStreamGetId.
    StreamGetId = 0x0146, ins 0, outs 0;

    /// Device `hdr.device`: rets[0] = the session's handle of its default memory pool
    /// (cuDeviceGetDefaultMemPool). Pool handles are session-local ids like stream handles.
    DeviceGetDefaultMemPool = 0x0180, ins 0, outs 0;
    /// Device `hdr.device`: rets[0] = the handle of its current memory pool (what
    /// `MallocAsync` with pool 0 allocates from).
    DeviceGetMemPool = 0x0181, ins 0, outs 0;
    /// args[0] = pool handle of device `hdr.device`, which becomes its current pool.
    DeviceSetMemPool = 0x0182, ins 0, outs 0;
    /// A new pool of pinned device memory on device `hdr.device`: args[0] = maximum size in
    /// bytes (0: the driver's default), args[1] = shareable handle types (0, or
    /// `POOL_HANDLE_POSIX_FD`). rets[0] = pool handle.
    MemPoolCreate = 0x0183, ins 0, outs 0;
    /// args[0] = pool handle (not a default pool). A pool that was its device's current pool
    /// is replaced there by the default pool.
    MemPoolDestroy = 0x0184, ins 0, outs 0;
    /// args[0] = pool handle, args[1] = `cudaMemPoolAttr` (1..=8), args[2] = value (the int
    /// attributes 1..=3 as 0 or 1, the others 64-bit).
    MemPoolSetAttribute = 0x0185, ins 0, outs 0;
    /// args[0] = pool handle, args[1] = `cudaMemPoolAttr` (1..=8). rets[0] = value.
    MemPoolGetAttribute = 0x0186, ins 0, outs 0;
    /// args[0] = pool handle, args[1] = bytes to keep (cuMemPoolTrimTo).
    MemPoolTrimTo = 0x0187, ins 0, outs 0;
    /// args[0] = pool handle. In-buffer 0 = `MemAccess` records (device ordinal u32, flags u32:
    /// 0 none, 1 read, 3 read-write), at most 64.
    MemPoolSetAccess = 0x0188, ins 1, outs 0;
    /// args[0] = pool handle, args[1] = device ordinal. rets[0] = access flags (0, 1 or 3).
    MemPoolGetAccess = 0x0189, ins 0, outs 0;
    /// Stream-ordered allocation: args[0] = size, args[1] = stream handle (0: legacy stream of
    /// `hdr.device`), args[2] = pool handle (0: the current pool of the stream's device).
    /// rets[0] = device pointer, which joins the session's allocations.
    MallocAsync = 0x018a, ins 0, outs 0;
    /// Stream-ordered free: args[0] = device pointer (an allocation of the session),
    /// args[1] = stream handle.
    FreeAsync = 0x018b, ins 0, outs 0;

    /// `LaunchKernel` with launch attributes (cuLaunchKernelEx): args[0..=5] as for
    /// `LaunchKernel`, args[6] = 0. In-buffer 0 = the parameter block, in-buffer 1 =
    /// `LaunchAttr` records (at most `MAX_LAUNCH_ATTRS`).
    LaunchKernelEx = 0x0190, ins 2, outs 0;
    /// args[0] = function handle, args[1] = `cudaFuncCache` (0..=3) (cuFuncSetCacheConfig).
    FuncSetCacheConfig = 0x0191, ins 0, outs 0;
    /// Device `hdr.device`: args[0] = `cudaFuncCache` (0..=3) (cuCtxSetCacheConfig).
    DeviceSetCacheConfig = 0x0192, ins 0, outs 0;
    /// Device `hdr.device`: rets[0] = its `cudaFuncCache` (cuCtxGetCacheConfig).
    DeviceGetCacheConfig = 0x0193, ins 0, outs 0;
    /// Cluster occupancy of a launch configuration: args[0..=5] as for `LaunchKernel`,
    /// args[6] = 0 for cuOccupancyMaxPotentialClusterSize, 1 for cuOccupancyMaxActiveClusters.
    /// In-buffer 0 = `LaunchAttr` records. rets[0] = the result.
    OccupancyCluster = 0x0194, ins 1, outs 0;
    /// args[0] = function handle, args[1] = blocks per multiprocessor, args[2] = block size.
    /// rets[0] = cuOccupancyAvailableDynamicSMemPerBlock.
    OccupancyAvailableDynamicSMem = 0x0195, ins 0, outs 0;
    /// args[0] = device, args[1] = peer device (ordinals). rets[0] = cuDeviceCanAccessPeer.
    DeviceCanAccessPeer = 0x0196, ins 0, outs 0;
    /// args[0] = `cudaDeviceP2PAttr` (1..=5), args[1] = source, args[2] = destination device
    /// (ordinals, different). rets[0] = cuDeviceGetP2PAttribute (i32 as u32).
    DeviceP2PAttribute = 0x0197, ins 0, outs 0;
    /// The session's context on `hdr.device` gains (args[1] = 1) or loses (0) access to its
    /// context on device args[0] (cuCtxEnablePeerAccess / cuCtxDisablePeerAccess); args[2] =
    /// flags (0).
    PeerAccess = 0x0198, ins 0, outs 0;
    /// A copy between devices: args[0] = destination, args[1] = its device, args[2] = source,
    /// args[3] = its device, args[4] = size, args[5] = stream handle of `hdr.device` (0: legacy
    /// stream). Both ranges must be the session's memory on their devices. A waited-for request
    /// returns once the copy is complete.
    MemcpyPeer = 0x0199, ins 0, outs 0;

    // Virtual memory management (cuMemCreate and friends). Physical allocations are
    // session-local handles; virtual addresses are the host driver's own, as for `Malloc`.
    // `VMM_FLAG_*` bits carry the allocation flags.
    /// A physical allocation on `hdr.device`: args[0] = size (a multiple of the granularity),
    /// args[1] = shareable handle types (0, or 1: POSIX file descriptor), args[2] =
    /// `VMM_FLAG_*` bits, args[3] = `allocFlags.usage`. rets[0] = allocation handle.
    MemCreate = 0x0240, ins 0, outs 0;
    /// args[0] = allocation handle (cuMemRelease). A mapping of it stays valid until unmapped.
    MemRelease = 0x0241, ins 0, outs 0;
    /// A virtual range: args[0] = size, args[1] = alignment (0: the granularity), args[2] =
    /// address hint (0: anywhere). rets[0] = its address.
    MemAddressReserve = 0x0242, ins 0, outs 0;
    /// args[0] = address, args[1] = size: a whole reservation of the session, without mappings.
    MemAddressFree = 0x0243, ins 0, outs 0;
    /// args[0] = address (inside a reservation of the session), args[1] = size, args[2] =
    /// offset into the allocation, args[3] = allocation handle.
    MemMap = 0x0244, ins 0, outs 0;
    /// args[0] = address, args[1] = size: whole mappings of the session.
    MemUnmap = 0x0245, ins 0, outs 0;
    /// args[0] = address, args[1] = size (mapped by the session). In-buffer 0 = `MemAccess`
    /// records (device ordinal u32, flags u32: 0 none, 1 read, 3 read-write), at most 64.
    MemSetAccess = 0x0246, ins 1, outs 0;
    /// args[0] = address (mapped by the session), args[1] = device ordinal. rets[0] = access
    /// flags (0, 1 or 3).
    MemGetAccess = 0x0247, ins 0, outs 0;
    /// Granularity of allocations on `hdr.device` with args[1..=3] as for `MemCreate`;
    /// args[0] = 1: recommended, 0: minimum. rets[0] = bytes.
    MemGetGranularity = 0x0248, ins 0, outs 0;
    /// args[0] = an address mapped by the session. rets[0] = a new allocation handle of the
    /// allocation mapped there (cuMemRetainAllocationHandle).
    MemRetainHandle = 0x0249, ins 0, outs 0;
    /// args[0] = allocation handle. rets[0] = device ordinal, rets[1] = handle types, rets[2] =
    /// `VMM_FLAG_*` bits, rets[3] = usage.
    MemHandleProperties = 0x024A, ins 0, outs 0;
    /// args[0] = an address mapped by the session. rets[0] = base, rets[1] = size of the
    /// mapping holding it (cuMemGetAddressRange).
    MemMappingRange = 0x024B, ins 0, outs 0;

    // Sharing device memory between the processes of one VM. The daemon keeps a table per VM
    // of what was exported, under a token and a random secret: the exporting worker makes the
    // real shareable handle (a POSIX file descriptor of the physical allocation), the daemon
    // holds it and hands it to the importing worker. Answered by the daemon and the workers,
    // never by one worker alone.
    /// args[0] = `IPC_KIND_*`, args[1] = the device pointer (`IPC_KIND_MEMORY`: anywhere in
    /// one `Malloc` of the session on `hdr.device`), the allocation handle (`IPC_KIND_VMM`),
    /// the pool handle (`IPC_KIND_POOL`) or the event handle (`IPC_KIND_EVENT`). rets[0] = token, rets[1..=2] = secret; valid until
    /// the exporting session ends.
    IpcExport = 0x0260, ins 0, outs 0;
    /// args[0] = `IPC_KIND_*`, args[1] = token, args[2..=3] = secret, args[4] = flags
    /// (`IPC_KIND_MEMORY`: cudaIpcMemLazyEnablePeerAccess = 1). Imported on `hdr.device`.
    /// rets[0] = the device address of the exported allocation's start (`IPC_KIND_MEMORY`) or
    /// a new allocation handle (`IPC_KIND_VMM`), pool handle (`IPC_KIND_POOL`) or event handle
    /// (`IPC_KIND_EVENT`) of the session; rets[1] = the size (`IPC_KIND_MEMORY`).
    IpcImport = 0x0261, ins 0, outs 0;
    /// args[0] = an address `IpcImport` returned (`IPC_KIND_MEMORY`): unmapped once the device
    /// is done with it (cuIpcCloseMemHandle).
    IpcClose = 0x0262, ins 0, outs 0;
    /// args[0] = a stream-ordered allocation of the session from a shareable pool: out-buffer 0
    /// (`POOL_PTR_EXPORT_LEN` bytes) receives the driver's export record (cuMemPoolExportPointer).
    MemPoolExportPointer = 0x0263, ins 0, outs 1;
    /// args[0] = a pool handle the session imported (`IpcImport` of `IPC_KIND_POOL`); in-buffer
    /// 0 = an export record of `MemPoolExportPointer`. rets[0] = the allocation's address in
    /// this process, rets[1] = its size (cuMemPoolImportPointer); freed by `Free`/`FreeAsync`.
    MemPoolImportPointer = 0x0264, ins 1, outs 0;
    /// CUDA's process checkpoint (`cuCheckpointProcess*`) of another guest process of this VM:
    /// args[0] = a `PROCESS_*` action, args[1] = the target's pid as the caller names it,
    /// args[2] = the lock's timeout in ms (0: none; `PROCESS_LOCK` only), args[3] = the target's
    /// session, args[4] = the target's process id as the caller's pid namespace numbers it.
    /// args[3] and args[4] are stamped by the kernel module, which looks the pid up, checks that
    /// the caller may act on it (root, or the same user) and finds its session; a caller's own
    /// values are overwritten. rets[0] = a `PROCESS_STATE_*` (`PROCESS_GET_STATE`) or the
    /// restore thread's id (`PROCESS_GET_RESTORE_THREAD`). A process without a session is
    /// answered `INITIALIZATION_ERROR`; an action in the wrong state `ILLEGAL_STATE`; a lock not
    /// taken within its timeout `NOT_READY`.
    ProcessCheckpoint = 0x0280, ins 0, outs 0;
    /// The GPU timeline recorder in a guest process's worker (`qcuda-smi trace`, and
    /// `cudaProfilerStart`/`cudaProfilerStop` with `QCUDA_PROFILE`; the record format is
    /// qcuda-proto's `trace` module): args[0] = a `TRACE_*` action, args[1] = the target's pid
    /// as the caller names it (0: the caller itself), args[2] = the ring's capacity in records
    /// (`TRACE_ARM`; 0: `TRACE_DEFAULT_RECORDS`, at most `TRACE_MAX_RECORDS`), args[3] = the
    /// target's session and args[4] = the target's process id, both stamped by the kernel
    /// module as for `ProcessCheckpoint` (the caller's own for args[1] = 0; a caller's values are
    /// overwritten), args[5] = the window in ms after which recording stops by itself
    /// (`TRACE_ARM`; 0: none, at most `TRACE_MAX_WINDOW_MS`). Out-buffer 0 (`TRACE_READ`; empty
    /// for the other actions) receives whole `TRACE_RECORD_SIZE`-byte records, oldest first,
    /// which leave the ring. rets[0] = `TRACE_STATE_*` bits, rets[1] = records written,
    /// rets[2] = records the ring still holds, rets[3] = records lost since the arm (ring full,
    /// or dropped by the GPU's profiling interface), rets[4] = the worker's CLOCK_MONOTONIC and
    /// rets[5] = its CLOCK_REALTIME at the answer (ns), rets[6] = ns recorded since the arm. A
    /// process without a session is answered `INITIALIZATION_ERROR`, one that has not used the
    /// GPU yet (named by another process) `NOT_READY`.
    GpuTrace = 0x0290, ins 0, outs 1;

    /// args[0] = flags (cudaEventDisableTiming = 2, ...). rets[0] = event handle.
    EventCreate = 0x0150, ins 0, outs 0;
    /// args[0] = event handle.
    EventDestroy = 0x0151, ins 0, outs 0;
    /// args[0] = event handle, args[1] = stream handle.
    EventRecord = 0x0152, ins 0, outs 0;
    /// args[0] = event handle.
    EventSynchronize = 0x0153, ins 0, outs 0;
    /// args[0] = start event, args[1] = end event. rets[0] = elapsed milliseconds as f32 bits.
    EventElapsedTime = 0x0154, ins 0, outs 0;
    /// args[0] = event handle. Status NOT_READY while pending.
    EventQuery = 0x0155, ins 0, outs 0;

    /// Host function (`cudaLaunchHostFunc`, `cudaStreamAddCallback`): args[0] = stream handle,
    /// args[1] = the guest's key for the function (nonzero; the device only hands it back).
    /// In stream order the host announces the function as due (answer to `HostFuncWait`) and
    /// holds the stream until the guest says it returned. rets[0] = 1 if the stream was
    /// capturing, so the function became a graph node that can run again (the key must stay
    /// valid), 0 for a one-shot function.
    LaunchHostFunc = 0x01D0, ins 0, outs 0;
    /// The guest's host-function thread: args[0] = the sequence number of the host function it
    /// has just run (0: none), which releases that function's stream. Then waits, for as long
    /// as it takes, until a host function of the session is due: rets[0] = its key, rets[1] =
    /// its sequence number (nonzero). Answered outside the session's request order (it must
    /// not wait behind a synchronisation that waits for the function). Status
    /// `CUDART_UNLOADING` once the session is closing: the thread ends.
    HostFuncWait = 0x01D1, ins 0, outs 0;
    /// args[0] = stream handle; in-buffer 0 = one [`LaunchAttr`] record whose id is a stream
    /// attribute (access policy window 1, synchronisation policy 3, priority 8, memory
    /// synchronisation domain map 9 and domain 10): cuStreamSetAttribute.
    StreamSetAttribute = 0x01D2, ins 1, outs 0;
    /// args[0] = stream handle, args[1] = a stream attribute id (as for `StreamSetAttribute`);
    /// out-buffer 0 receives its value as one [`LaunchAttr`] record (cuStreamGetAttribute).
    StreamGetAttribute = 0x01D3, ins 0, outs 1;
    /// cuCtxResetPersistingL2Cache in the session's context on `hdr.device`.
    CtxResetPersistingL2 = 0x01D4, ins 0, outs 0;
    /// Fire-and-forget work gathered by the guest: in-buffer 0 holds args[0] records
    /// ([`BatchRecord`], each followed by its in-data padded to 8 bytes), executed in order
    /// as if each had been sent alone with `FLAG_ASYNC`. Only [`BATCHABLE`] ops may appear,
    /// except that a batch sent waited (without `FLAG_ASYNC`) may end with one [`BATCH_TAIL`]
    /// record: the synchronising call that made the guest send the batch. That record runs as
    /// a waited request and the batch's response is its response, with the first failure of
    /// the records before it as the response's deferred error (`RESP_DEFERRED_SHIFT`). Without
    /// a tail the status is the first failure among the records (`SUCCESS` if none). After a
    /// sticky error the rest, tail included, are not run, and the status is that error.
    Batch = 0x01D8, ins 1, outs 0;
    /// Where the session's time went on the host so far, per op: out-buffer 0 receives up to
    /// len / [`LATENCY_RECORD_SIZE`] [`LatencyRecord`]s; rets[0] = records written, rets[1] =
    /// records the host has. Answered by the daemon without the worker.
    HostLatency = 0x01D9, ins 0, outs 1;
    /// What the caller's VM uses of the host now, for `qcuda-smi`: out-buffer 0 receives up to
    /// len / [`SESSION_USAGE_SIZE`] [`SessionUsage`] records, one per open session of the VM
    /// (the caller's included, flagged), by session id; bytes past them are left as they were. rets[0] = records written, rets[1] =
    /// sessions open, rets[2] = bytes of device memory the VM's sessions hold, rets[3] = the
    /// VM's device-memory limit (0: none), rets[4] = most sessions the VM may open, rets[5] =
    /// kernels its sessions launched since the VM connected (ended sessions included),
    /// rets[6] = sessions opened since then. Answered by the daemon without the worker.
    VmUsage = 0x01DA, ins 0, outs 1;
    /// Pitched device memory (cudaMallocPitch, cudaMalloc3D): args[0] = width in bytes,
    /// args[1] = rows (height, or height × depth). cuMemAllocPitch with 16-byte elements.
    /// rets[0] = device pointer, rets[1] = pitch; the allocation is pitch × rows bytes.
    MallocPitch = 0x0160, ins 0, outs 0;
    /// Memset of pitched device memory (cudaMemset2D/3D): args[0] = pointer, args[1] = pitch,
    /// args[2] = byte value, args[3] = width in bytes, args[4] = rows per slice written,
    /// args[5] = slices, args[6] = rows per slice in memory (slice stride pitch × args[6]),
    /// args[7] = stream handle.
    Memset3D = 0x0161, ins 0, outs 0;
    /// A copy between device-addressable memory and arrays (cudaMemcpy2D/3D and the array
    /// copies): args[0] = stream handle; in-buffer 0 = one [`Copy3D`] without `COPY_WIRE` sides.
    Memcpy3D = 0x0162, ins 1, outs 0;
    /// Guest bytes to device memory or an array: args[0] = stream handle; in-buffer 0 = one
    /// [`Copy3D`] whose source is `COPY_WIRE`; in-buffer 1 = the bytes, packed (rows of `width`
    /// bytes, `height` rows per slice, `depth` slices). Complete when answered.
    Memcpy3DHtoD = 0x0163, ins 2, outs 0;
    /// Device memory or an array to guest bytes: args[0] = stream handle; in-buffer 0 = one
    /// [`Copy3D`] whose destination is `COPY_WIRE`; out-buffer 0 receives the bytes, packed.
    Memcpy3DDtoH = 0x0164, ins 1, outs 1;
    /// A CUDA array (cuArray3DCreate) or mipmapped array (cuMipmappedArrayCreate): args[0] =
    /// width, args[1] = height, args[2] = depth (elements; 0 for an absent dimension),
    /// args[3] = `CUarray_format`, args[4] = channels (1, 2 or 4), args[5] = `CUDA_ARRAY3D_*`
    /// flags, args[6] = mipmap levels (0: a plain array). rets[0] = array handle.
    ArrayCreate = 0x0165, ins 0, outs 0;
    /// args[0] = array handle, args[1] = 1 for a mipmapped array, 0 for an array.
    ArrayDestroy = 0x0166, ins 0, outs 0;
    /// args[0] = mipmapped array handle, args[1] = level. rets[0] = an array handle for the
    /// level, owned by the mipmapped array (gone with it, never destroyed alone).
    MipmappedArrayLevel = 0x0167, ins 0, outs 0;
    /// args[0] = array handle. rets[0] = width, rets[1] = height, rets[2] = depth,
    /// rets[3] = `CUarray_format`, rets[4] = channels, rets[5] = `CUDA_ARRAY3D_*` flags.
    ArrayInfo = 0x0168, ins 0, outs 0;
    /// In-buffer 0 = `TEX_WORDS` little-endian u64 words (see [`tex`]). rets[0] = the
    /// `CUtexObject` value itself, which kernels take as an argument.
    TexObjectCreate = 0x0169, ins 1, outs 0;
    /// args[0] = a `CUtexObject` this session created.
    TexObjectDestroy = 0x016A, ins 0, outs 0;
    /// args[0] = array handle. rets[0] = the `CUsurfObject` value itself.
    SurfObjectCreate = 0x016B, ins 0, outs 0;
    /// args[0] = a `CUsurfObject` this session created.
    SurfObjectDestroy = 0x016C, ins 0, outs 0;
    // CUDA graphs and stream capture (graph.rs has the node parameter encodings). Graph, node
    // and executable-graph handles are session-local ids; a node handle stays valid while its
    // graph does.
    /// args[0] = stream handle (not the legacy stream), args[1] = `cudaStreamCaptureMode`
    /// (0 global, 1 thread-local, 2 relaxed) of the capture.
    StreamBeginCapture = 0x01A0, ins 0, outs 0;
    /// args[0] = stream handle. rets[0] = handle of the captured graph.
    StreamEndCapture = 0x01A1, ins 0, outs 0;
    /// args[0] = stream handle (0: legacy stream). rets[0] = `cudaStreamCaptureStatus`,
    /// rets[1] = capture id, rets[2] = handle of the graph being captured (0 when none),
    /// rets[3] = number of dependencies; out-buffer 0 receives up to len / 8 of their node
    /// handles (u64), out-buffer 1 up to len / `graph::EDGE_DATA_SIZE` of their edge data.
    StreamCaptureInfo = 0x01A2, ins 0, outs 2;
    /// args[0] = stream handle, args[1] = flags (0 add, 1 set); in-buffer 0 = node handles
    /// (u64) of the capture's graph, in-buffer 1 = their edge data (`graph::EdgeData`, one
    /// per node; empty: default edges).
    StreamUpdateCaptureDependencies = 0x01A3, ins 2, outs 0;
    /// rets[0] = handle of a new empty graph.
    GraphCreate = 0x01A4, ins 0, outs 0;
    /// args[0] = graph handle.
    GraphDestroy = 0x01A5, ins 0, outs 0;
    /// args[0] = graph handle, args[1] = node type (`graph::NODE_*`); in-buffer 0 = node
    /// handles (u64) it depends on, in-buffer 1 = its parameters, in-buffer 2 = the edge data
    /// of its dependencies (`graph::EdgeData`, one per dependency; empty: default edges).
    /// rets[0] = node handle, rets[1] = the device address of a memory allocation node.
    GraphAddNode = 0x01A6, ins 3, outs 0;
    /// args[0] = node handle, args[1] = its node type; in-buffer 0 = new parameters.
    GraphNodeSetParams = 0x01A7, ins 1, outs 0;
    /// args[0] = executable graph, args[1] = node handle (of the graph it came from),
    /// args[2] = node type; in-buffer 0 = new parameters.
    GraphExecNodeSetParams = 0x01A8, ins 1, outs 0;
    /// args[0] = graph handle, args[1] = 0 all nodes, 1 root nodes. rets[0] = count; out-buffer
    /// 0 receives up to len / 8 node handles (u64).
    GraphGetNodes = 0x01A9, ins 0, outs 1;
    /// args[0] = graph handle. rets[0] = number of edges; out-buffer 0 receives up to len / 16
    /// (from u64, to u64) pairs, out-buffer 1 up to len / `graph::EDGE_DATA_SIZE` of their
    /// edge data.
    GraphGetEdges = 0x01AA, ins 0, outs 2;
    /// args[0] = node handle, args[1] = 0 type, 1 dependencies, 2 dependent nodes. rets[0] =
    /// the `cudaGraphNodeType` or the count; out-buffer 0 receives up to len / 8 node handles,
    /// out-buffer 1 up to len / `graph::EDGE_DATA_SIZE` of the edges' data.
    GraphNodeQuery = 0x01AB, ins 0, outs 2;
    /// args[0] = graph handle, args[1] = 0 add, 1 remove; in-buffer 0 = (from u64, to u64)
    /// node handle pairs, in-buffer 1 = their edge data (`graph::EdgeData`, one per pair;
    /// empty: default edges).
    GraphEdges = 0x01AC, ins 2, outs 0;
    /// args[0] = graph handle. rets[0] = handle of a copy of it.
    GraphClone = 0x01AD, ins 0, outs 0;
    /// args[0] = graph handle, args[1] = `cudaGraphInstantiateFlags`, args[2] = stream handle
    /// to upload on (with `cudaGraphInstantiateFlagUpload`). rets[0] = executable graph handle.
    GraphInstantiate = 0x01AE, ins 0, outs 0;
    /// args[0] = executable graph handle.
    GraphExecDestroy = 0x01AF, ins 0, outs 0;
    /// args[0] = executable graph handle, args[1] = stream handle (0: legacy stream).
    GraphLaunch = 0x01B0, ins 0, outs 0;
    /// args[0] = executable graph handle, args[1] = stream handle (0: legacy stream).
    GraphUpload = 0x01B1, ins 0, outs 0;
    /// args[0] = executable graph, args[1] = graph handle. Status SUCCESS whenever the driver
    /// judged the update: rets[0] = `cudaGraphExecUpdateResult` (0: applied; otherwise the
    /// runtime answers cudaErrorGraphExecUpdateFailure), rets[1] = handle of the node that
    /// failed (0: none).
    GraphExecUpdate = 0x01B2, ins 0, outs 0;
    /// args[0] = graph handle, args[1] = `cudaGraphDebugDotFlags`. rets[0] = length of the DOT
    /// text; out-buffer 0 receives up to its length of it.
    GraphDebugDot = 0x01B3, ins 0, outs 1;
    /// args[0] = executable graph, args[1] = node handle, args[2] = 0 get, 1 set,
    /// args[3] = enabled (set). rets[0] = enabled (get).
    GraphNodeEnabled = 0x01B4, ins 0, outs 0;
    /// args[0] = executable graph, args[1] = node handle of a child graph node, args[2] =
    /// graph handle of the new child graph.
    GraphExecChildGraph = 0x01B5, ins 0, outs 0;
    /// args[0] = executable graph, args[1] = node handle of an event record or wait node,
    /// args[2] = event handle.
    GraphExecSetEvent = 0x01B6, ins 0, outs 0;
    /// args[0] = stream handle: if it is capturing, the capture is invalidated (an operation
    /// CUDA prohibits during capture was refused in the guest: the capture fails as it would
    /// natively, with cudaErrorStreamCaptureInvalidated at its end).
    StreamCaptureInvalidate = 0x01B7, ins 0, outs 0;
    /// args[0] = stream handle, args[1] = graph handle to capture into, args[2] = capture mode;
    /// in-buffer 0 = node handles (u64) of that graph the first captured node depends on,
    /// in-buffer 1 = their edge data (`graph::EdgeData`, one per node; empty: default edges).
    StreamBeginCaptureToGraph = 0x01B8, ins 2, outs 0;
    /// args[0] = a handle, args[1] = what: 0 the event of an event record or wait node, 1 the
    /// graph of a child graph node (owned by the node: not destroyable), 2 the
    /// `cudaGraphInstantiateFlags` of an executable graph, 3 the node of graph args[2] (a clone
    /// of the node's graph) that the node was cloned to, 4 body graph args[2] of a conditional
    /// node (owned by the node, like a child graph), 5 the device address (rets[0]) and size
    /// (rets[1]) of a memory allocation node, 6 the device address a memory free node frees.
    /// rets[0] = that handle or value.
    GraphQuery = 0x01B9, ins 0, outs 0;
    /// args[0] = handle of a kernel node. Out-buffer 0 receives up to its length of the node's
    /// parameters in the `graph::KernelNode` encoding; rets[0] = the encoding's length.
    GraphKernelNodeGetParams = 0x01BA, ins 0, outs 1;
    /// args[0] = node handle: the node and its edges are removed from its graph.
    GraphDestroyNode = 0x01BB, ins 0, outs 0;
    /// args[0] = handle of a memcpy or memset node. rets[0] = its node type; out-buffer 0
    /// receives its parameters in the `graph::MemcpyNode` or `graph::MemsetNode` encoding.
    GraphNodeGetParams = 0x01BC, ins 0, outs 1;
    /// Graph memory of device `hdr.device`: args[0] = 0 trim (cuDeviceGraphMemTrim), 1 get,
    /// 2 set attribute args[1] (`cudaGraphMemAttributeType`, 0..=3) to args[2]. rets[0] = the
    /// value (get).
    GraphMem = 0x01BD, ins 0, outs 0;
    /// args[0] = graph handle, args[1] = default launch value, args[2] = flags
    /// (`cudaGraphCondAssignDefault`). rets[0] = the driver's conditional handle itself, the
    /// value kernels pass to `cudaGraphSetConditional` and conditional nodes of that graph name.
    GraphConditionalHandleCreate = 0x01BE, ins 0, outs 0;

    /// `cuModuleLoadDataEx` with the JIT's logs: in-buffer 0 = the image (as for `ModuleLoad`),
    /// in-buffer 1 = a `link::LinkRequest` with the value options the program gave and no
    /// inputs. Out-buffer 0 receives the info log, then the error log (no NULs), as far as
    /// they fit. rets[0] = module handle (0 when the load failed), rets[1] and rets[2] = the
    /// logs' lengths, rets[3] = the driver's `CUresult` (the load's failure, with its error log,
    /// is an answer here, not a failed request).
    ModuleLoadLogged = 0x0304, ins 2, outs 1;
    /// A tensor map (`cuTensorMapEncodeTiled`, `...Im2col`, `...Im2colWide`,
    /// `cuTensorMapReplaceAddress`): in-buffer 0 = one `tensor_map::TensorMapRequest`;
    /// out-buffer 0 (128 bytes) receives the `CUtensorMap` the host's driver encoded.
    TensorMapEncode = 0x0305, ins 1, outs 1;
    /// The host's NVIDIA driver version as NVML gives it (e.g. "580.95.05"), answered by the
    /// daemon from what it read at start: out-buffer 0 receives the text (no NUL) if it fits;
    /// rets[0] = its length. `NOT_SUPPORTED` when the host's driver did not say.
    DriverRelease = 0x0303, ins 0, outs 1;
    /// args[0] = kernel node handle; in-buffer 0 = one [`LaunchAttr`] record, checked as for a
    /// launch (cuGraphKernelNodeSetAttribute: priority, cluster dimensions, access policy
    /// window, ...; the driver says which a node takes).
    GraphKernelNodeSetAttribute = 0x0300, ins 1, outs 0;
    /// args[0] = kernel node handle, args[1] = attribute id; out-buffer 0 receives its value as
    /// one [`LaunchAttr`] record (cuGraphKernelNodeGetAttribute).
    GraphKernelNodeGetAttribute = 0x0301, ins 0, outs 1;
    /// args[0] = destination kernel node, args[1] = source kernel node: the destination takes
    /// every attribute of the source (cuGraphKernelNodeCopyAttributes).
    GraphKernelNodeCopyAttributes = 0x0302, ins 0, outs 0;
}

/// Bytes of an encoded [`LatencyRecord`].
pub const LATENCY_RECORD_SIZE: usize = 48;

/// The host's time for one op of a session, summed over its requests (`Op::HostLatency`):
/// op u32 @0, reserved u32 @4, count u64 @8, then nanoseconds: queue @16 (the chain taken off
/// the ring until the session's thread starts it), hop @24 (to the worker and back, without the
/// worker's own time), worker @32 (the worker rebuilding and executing it, CUDA calls
/// included), host @40 (the chain taken off the ring until it is completed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencyRecord {
    /// An [`Op`] as u32.
    pub op: u32,
    /// Requests counted.
    pub count: u64,
    /// Nanoseconds waiting for the session's thread.
    pub queue_ns: u64,
    /// Nanoseconds between the session's thread and the worker, both ways.
    pub hop_ns: u64,
    /// Nanoseconds in the worker.
    pub worker_ns: u64,
    /// Nanoseconds on the host in all.
    pub host_ns: u64,
}

impl LatencyRecord {
    /// The encoded record.
    pub fn encode(&self) -> [u8; LATENCY_RECORD_SIZE] {
        let mut b = [0u8; LATENCY_RECORD_SIZE];
        put(&mut b, 0, &self.op.to_le_bytes());
        for (i, v) in [
            self.count,
            self.queue_ns,
            self.hop_ns,
            self.worker_ns,
            self.host_ns,
        ]
        .iter()
        .enumerate()
        {
            put(&mut b, 8 + 8 * i, &v.to_le_bytes());
        }
        b
    }

    /// Decodes a record (any op code; the reader decides what it knows).
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < LATENCY_RECORD_SIZE {
            return Err(WireError::Short);
        }
        Ok(Self {
            op: get_u32(b, 0),
            count: get_u64(b, 8),
            queue_ns: get_u64(b, 16),
            hop_ns: get_u64(b, 24),
            worker_ns: get_u64(b, 32),
            host_ns: get_u64(b, 40),
        })
    }
}

/// Bytes of an encoded [`SessionUsage`].
pub const SESSION_USAGE_SIZE: usize = 64;
/// [`SessionUsage::flags`]: the record is the asking session's own.
pub const USAGE_CALLER: u32 = 1 << 0;
/// [`SessionUsage::flags`]: the session has a worker (a CUDA context) on the host now.
pub const USAGE_GPU: u32 = 1 << 1;
/// [`SessionUsage::flags`]: the session's worker died; its GPU ops fail until DeviceReset.
pub const USAGE_FAILED: u32 = 1 << 2;
/// Every [`SessionUsage::flags`] bit this version knows.
pub const USAGE_KNOWN_FLAGS: u32 = USAGE_CALLER | USAGE_GPU | USAGE_FAILED;

/// One session of a VM as the host accounts it (`Op::VmUsage`): session u64 @0, pid u32 @8,
/// flags u32 @12, memory @16, peak memory @24, kernels @32, graph launches @40, age in ms @48
/// (all u64), reserved u64 @56.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionUsage {
    /// The session id (one open file of /dev/qcuda).
    pub session: u64,
    /// The guest process id the kernel module stamped on the session's first request (0: not
    /// known, from a module that does not stamp it).
    pub pid: u32,
    /// `USAGE_*` bits.
    pub flags: u32,
    /// Bytes of device memory the session holds now.
    pub memory: u64,
    /// The most it held at once.
    pub peak_memory: u64,
    /// Kernels it launched (accepted by the driver).
    pub kernels: u64,
    /// Graphs it launched.
    pub graph_launches: u64,
    /// Milliseconds since the session's first request.
    pub age_ms: u64,
}

impl SessionUsage {
    /// The encoded record.
    pub fn encode(&self) -> [u8; SESSION_USAGE_SIZE] {
        let mut b = [0u8; SESSION_USAGE_SIZE];
        put(&mut b, 0, &self.session.to_le_bytes());
        put(&mut b, 8, &self.pid.to_le_bytes());
        put(&mut b, 12, &self.flags.to_le_bytes());
        for (i, v) in [
            self.memory,
            self.peak_memory,
            self.kernels,
            self.graph_launches,
            self.age_ms,
        ]
        .iter()
        .enumerate()
        {
            put(&mut b, 16 + 8 * i, &v.to_le_bytes());
        }
        b
    }

    /// Decodes a record: unknown flags and a nonzero reserved word are refused.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < SESSION_USAGE_SIZE {
            return Err(WireError::Short);
        }
        let flags = get_u32(b, 12);
        if flags & !USAGE_KNOWN_FLAGS != 0 || get_u64(b, 56) != 0 {
            return Err(WireError::Reserved);
        }
        Ok(Self {
            session: get_u64(b, 0),
            pid: get_u32(b, 8),
            flags,
            memory: get_u64(b, 16),
            peak_memory: get_u64(b, 24),
            kernels: get_u64(b, 32),
            graph_launches: get_u64(b, 40),
            age_ms: get_u64(b, 48),
        })
    }
}

/// Ops a [`Op::Batch`] may carry: stream-ordered work that returns nothing.
pub const BATCHABLE: &[Op] = &[
    Op::LaunchKernel,
    Op::EventRecord,
    Op::StreamWaitEvent,
    Op::Memset,
    Op::MemcpyDtoD,
    Op::MemcpyMapped,
    Op::MemcpyHtoD,
];
/// Ops that may end a waited [`Op::Batch`] (see there): synchronising calls without buffers,
/// so a program's launch-then-synchronise costs one request instead of two.
pub const BATCH_TAIL: &[Op] = &[
    Op::DeviceSynchronize,
    Op::StreamSynchronize,
    Op::StreamQuery,
    Op::EventSynchronize,
    Op::EventQuery,
];
/// Ops that name a guest process by pid (args[1]): the kernel module resolves it in the
/// caller's pid namespace, checks that the caller may act on it (root, or the same user) and
/// stamps its session in args[3] and its pid in args[4]. For `GpuTrace`, args[1] = 0 names the
/// caller itself.
pub const NAMES_PROCESS: &[Op] = &[Op::ProcessCheckpoint, Op::GpuTrace];
/// Bytes of an encoded [`BatchRecord`].
pub const BATCH_RECORD_SIZE: usize = 80;
/// Most in-data bytes one batch record may carry.
pub const MAX_BATCH_DATA: u32 = 16 * 1024;

/// One op inside a [`Op::Batch`]: op u32 @0, device u32 @4, in-data length u32 @8, reserved
/// u32 @12, args [u64; 8] @16; its in-data follows, padded with zeros to a multiple of 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchRecord {
    /// An [`Op`] from [`BATCHABLE`] (or, last in a waited batch, [`BATCH_TAIL`]), as u32.
    pub op: u32,
    /// The guest device ordinal.
    pub device: u32,
    /// Bytes of in-data (0 for an op without an `In` buffer).
    pub in_len: u32,
    /// The op's inline arguments.
    pub args: [u64; MAX_ARGS],
}

impl BatchRecord {
    /// The encoded record.
    pub fn encode(&self) -> [u8; BATCH_RECORD_SIZE] {
        let mut b = [0u8; BATCH_RECORD_SIZE];
        put(&mut b, 0, &self.op.to_le_bytes());
        put(&mut b, 4, &self.device.to_le_bytes());
        put(&mut b, 8, &self.in_len.to_le_bytes());
        for (i, a) in self.args.iter().enumerate() {
            put(&mut b, 16 + 8 * i, &a.to_le_bytes());
        }
        b
    }

    /// Decodes and checks a record: a batchable or tail op (where a tail may stand is the
    /// reader's to check), in-data present exactly when the op takes an `In` buffer, at most
    /// [`MAX_BATCH_DATA`] bytes, reserved bytes zero.
    pub fn decode(b: &[u8]) -> Result<(Op, Self), WireError> {
        if b.len() < BATCH_RECORD_SIZE {
            return Err(WireError::Short);
        }
        let op_code = get_u32(b, 0);
        let op = Op::from_u32(op_code).ok_or(WireError::UnknownOp)?;
        if !BATCHABLE.contains(&op) && !BATCH_TAIL.contains(&op) {
            return Err(WireError::UnknownOp);
        }
        if get_u32(b, 12) != 0 {
            return Err(WireError::Reserved);
        }
        let mut args = [0u64; MAX_ARGS];
        for (i, a) in args.iter_mut().enumerate() {
            *a = get_u64(b, 16 + 8 * i);
        }
        let rec = Self {
            op: op_code,
            device: get_u32(b, 4),
            in_len: get_u32(b, 8),
            args,
        };
        let (ins, _) = op.shape();
        if rec.in_len > MAX_BATCH_DATA || (ins == 0 && rec.in_len != 0) {
            return Err(WireError::BadShape);
        }
        Ok((op, rec))
    }

    /// Bytes this record and its padded in-data take in the batch.
    pub fn footprint(&self) -> usize {
        BATCH_RECORD_SIZE + (self.in_len as usize).next_multiple_of(8)
    }
}

impl Op {
    /// True for ops only the kernel module may send.
    pub fn is_kernel_only(self) -> bool {
        (self as u32) & KERNEL_ONLY_OP != 0
    }
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// One entry of the request's buffer table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferDesc {
    /// Length in bytes.
    pub len: u64,
    /// A [`Direction`] as u32 (0 only in unused slots).
    pub dir: u32,
}

/// Bytes of an encoded [`RequestHeader`].
pub const REQUEST_HEADER_SIZE: usize = 224;
const BUF_TABLE_AT: usize = 96;

/// The first, device-readable bytes of every chain.
///
/// Layout (little-endian): magic u32 @0, version u16 @4, flags u16 @6, op u32 @8, nbufs u32 @12,
/// session u64 @16, device u32 @24, pid u32 @28, args [u64; 8] @32,
/// bufs [{len u64, dir u32, reserved u32}; 8] @96.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestHeader {
    /// Request flags (`FLAG_*`).
    pub flags: u16,
    /// An [`Op`] as u32.
    pub op: u32,
    /// Number of used entries in `bufs`.
    pub nbufs: u32,
    /// Session id, stamped by the kernel module (one per open file).
    pub session: u64,
    /// The CUDA device ordinal the op applies to (the calling thread's current device).
    pub device: u32,
    /// The calling guest process (its thread group id), stamped by the kernel module; 0 from
    /// a module that does not stamp it. The host only reports it (`Op::VmUsage`, its logs):
    /// it is what the guest kernel says, and grants nothing.
    pub pid: u32,
    /// Inline arguments, meaning per op.
    pub args: [u64; MAX_ARGS],
    /// Buffer table: `In` buffers first, then `Out` buffers.
    pub bufs: [BufferDesc; MAX_BUFFERS],
}

impl RequestHeader {
    /// A header for `op` with no buffers.
    pub fn new(op: Op) -> Self {
        Self {
            op: op as u32,
            ..Self::default()
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; REQUEST_HEADER_SIZE] {
        let mut b = [0u8; REQUEST_HEADER_SIZE];
        put(&mut b, 0, &MAGIC.to_le_bytes());
        put(&mut b, 4, &VERSION.to_le_bytes());
        put(&mut b, 6, &self.flags.to_le_bytes());
        put(&mut b, 8, &self.op.to_le_bytes());
        put(&mut b, 12, &self.nbufs.to_le_bytes());
        put(&mut b, 16, &self.session.to_le_bytes());
        put(&mut b, 24, &self.device.to_le_bytes());
        put(&mut b, 28, &self.pid.to_le_bytes());
        for (i, a) in self.args.iter().enumerate() {
            put(&mut b, 32 + 8 * i, &a.to_le_bytes());
        }
        for (i, d) in self.bufs.iter().enumerate() {
            put(&mut b, BUF_TABLE_AT + 16 * i, &d.len.to_le_bytes());
            put(&mut b, BUF_TABLE_AT + 16 * i + 8, &d.dir.to_le_bytes());
        }
        b
    }

    /// Decodes and validates a header: magic, version, flags, buffer count, directions, lengths
    /// and unused slots. The op code itself is checked by [`RequestHeader::checked_op`].
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < REQUEST_HEADER_SIZE {
            return Err(WireError::Short);
        }
        if get_u32(b, 0) != MAGIC {
            return Err(WireError::BadMagic);
        }
        if get_u16(b, 4) != VERSION {
            return Err(WireError::BadVersion);
        }
        let flags = get_u16(b, 6);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(WireError::Reserved);
        }
        let nbufs = get_u32(b, 12);
        if nbufs as usize > MAX_BUFFERS {
            return Err(WireError::TooManyBuffers);
        }
        let mut h = Self {
            flags,
            op: get_u32(b, 8),
            nbufs,
            session: get_u64(b, 16),
            device: get_u32(b, 24),
            pid: get_u32(b, 28),
            ..Self::default()
        };
        for (i, a) in h.args.iter_mut().enumerate() {
            *a = get_u64(b, 32 + 8 * i);
        }
        let mut seen_out = false;
        for i in 0..MAX_BUFFERS {
            let at = BUF_TABLE_AT + 16 * i;
            let d = BufferDesc {
                len: get_u64(b, at),
                dir: get_u32(b, at + 8),
            };
            if get_u32(b, at + 12) != 0 {
                return Err(WireError::Reserved);
            }
            if i >= nbufs as usize {
                if d.len != 0 || d.dir != 0 {
                    return Err(WireError::Reserved);
                }
                continue;
            }
            match Direction::from_u32(d.dir) {
                Some(Direction::In) if seen_out => return Err(WireError::BadDirection),
                Some(Direction::In) => {}
                Some(Direction::Out) => seen_out = true,
                None => return Err(WireError::BadDirection),
            }
            if d.len > MAX_BUFFER_LEN {
                return Err(WireError::BufferTooLong);
            }
            h.bufs[i] = d;
        }
        Ok(h)
    }

    /// The used buffer descriptors.
    pub fn buffers(&self) -> &[BufferDesc] {
        &self.bufs[..(self.nbufs as usize).min(MAX_BUFFERS)]
    }

    /// Number of `In` and `Out` buffers.
    pub fn counts(&self) -> (usize, usize) {
        let ins = self
            .buffers()
            .iter()
            .filter(|d| d.dir == Direction::In as u32)
            .count();
        (ins, self.buffers().len() - ins)
    }

    /// Total bytes of `In` and of `Out` buffers (each at most 8 × MAX_BUFFER_LEN, so no overflow).
    pub fn totals(&self) -> (u64, u64) {
        let mut t = (0u64, 0u64);
        for d in self.buffers() {
            if d.dir == Direction::In as u32 {
                t.0 += d.len;
            } else {
                t.1 += d.len;
            }
        }
        t
    }

    /// The op, if it is known and the buffer table has the op's shape.
    pub fn checked_op(&self) -> Result<Op, WireError> {
        let op = Op::from_u32(self.op).ok_or(WireError::UnknownOp)?;
        if self.counts() != op.shape() {
            return Err(WireError::BadShape);
        }
        Ok(op)
    }

    /// Appends a buffer to the table.
    pub fn push_buffer(&mut self, dir: Direction, len: u64) -> Result<(), WireError> {
        let n = self.nbufs as usize;
        if n >= MAX_BUFFERS {
            return Err(WireError::TooManyBuffers);
        }
        self.bufs[n] = BufferDesc {
            len,
            dir: dir as u32,
        };
        self.nbufs += 1;
        Ok(())
    }
}

/// Bytes of an encoded [`ResponseHeader`].
pub const RESPONSE_HEADER_SIZE: usize = 64;

/// The last, device-writable bytes of every chain.
///
/// Layout (little-endian): status u32 @0, flags u32 @4, rets [u64; 7] @8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponseHeader {
    /// A `cudaError_t` value ([`status`]).
    pub status: u32,
    /// `RESP_FLAG_*`.
    pub flags: u32,
    /// Return values, meaning per op.
    pub rets: [u64; MAX_RETS],
}

impl ResponseHeader {
    /// A response carrying only a status.
    pub fn with_status(status: u32) -> Self {
        Self {
            status,
            ..Self::default()
        }
    }

    /// The failed fire-and-forget op's status carried by this response, 0 if none.
    pub fn deferred_error(&self) -> u32 {
        self.flags >> RESP_DEFERRED_SHIFT
    }

    /// Carries `status` as the deferred error of an earlier fire-and-forget op (see
    /// [`RESP_DEFERRED_SHIFT`]); statuses that do not fit in 16 bits become `status::UNKNOWN`.
    pub fn set_deferred_error(&mut self, status: u32) {
        let code = if status > 0xffff {
            status::UNKNOWN
        } else {
            status
        };
        self.flags = (self.flags & 0xffff) | (code << RESP_DEFERRED_SHIFT);
    }

    /// Encodes the response.
    pub fn encode(&self) -> [u8; RESPONSE_HEADER_SIZE] {
        let mut b = [0u8; RESPONSE_HEADER_SIZE];
        put(&mut b, 0, &self.status.to_le_bytes());
        put(&mut b, 4, &self.flags.to_le_bytes());
        for (i, r) in self.rets.iter().enumerate() {
            put(&mut b, 8 + 8 * i, &r.to_le_bytes());
        }
        b
    }

    /// Decodes a response.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < RESPONSE_HEADER_SIZE {
            return Err(WireError::Short);
        }
        let mut r = Self {
            status: get_u32(b, 0),
            flags: get_u32(b, 4),
            ..Self::default()
        };
        for (i, v) in r.rets.iter_mut().enumerate() {
            *v = get_u64(b, 8 + 8 * i);
        }
        Ok(r)
    }
}

/// Bytes of an encoded [`GpuInfo`].
pub const GPU_INFO_SIZE: usize = 320;
/// Bytes of the NUL-padded name in [`GpuInfo`].
pub const GPU_NAME_LEN: usize = 256;

/// What the host says about one GPU.
///
/// Layout: name [u8; 256] @0, uuid [u8; 16] @256, total_mem u64 @272, cc_major i32 @280,
/// cc_minor i32 @284, multiprocessors i32 @288, pci_bus i32 @292, pci_device i32 @296,
/// pci_domain i32 @300, pcie_link [u8; 4] @304, reserved [u8; 12] @308.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInfo {
    /// Device name, NUL-padded.
    pub name: [u8; GPU_NAME_LEN],
    /// Device UUID.
    pub uuid: [u8; 16],
    /// Global memory in bytes.
    pub total_mem: u64,
    /// Compute capability, major.
    pub cc_major: i32,
    /// Compute capability, minor.
    pub cc_minor: i32,
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// PCI bus id.
    pub pci_bus: i32,
    /// PCI device id.
    pub pci_device: i32,
    /// PCI domain id.
    pub pci_domain: i32,
    /// The GPU's PCIe link as the host saw it when the daemon started: current generation,
    /// current width (lanes), maximum generation, maximum width; 0 where unknown.
    pub pcie_link: [u8; 4],
}

impl Default for GpuInfo {
    fn default() -> Self {
        Self {
            name: [0; GPU_NAME_LEN],
            uuid: [0; 16],
            total_mem: 0,
            cc_major: 0,
            cc_minor: 0,
            multiprocessors: 0,
            pci_bus: 0,
            pci_device: 0,
            pci_domain: 0,
            pcie_link: [0; 4],
        }
    }
}

impl GpuInfo {
    /// Sets the name from bytes, truncated to leave a terminating NUL.
    pub fn set_name(&mut self, name: &[u8]) {
        self.name = [0; GPU_NAME_LEN];
        let n = name.len().min(GPU_NAME_LEN - 1);
        self.name[..n].copy_from_slice(&name[..n]);
    }

    /// The name up to its first NUL.
    pub fn name_bytes(&self) -> &[u8] {
        let end = self
            .name
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(GPU_NAME_LEN);
        &self.name[..end]
    }

    /// Encodes the record.
    pub fn encode(&self) -> [u8; GPU_INFO_SIZE] {
        let mut b = [0u8; GPU_INFO_SIZE];
        put(&mut b, 0, &self.name);
        put(&mut b, 256, &self.uuid);
        put(&mut b, 272, &self.total_mem.to_le_bytes());
        let ints = [
            self.cc_major,
            self.cc_minor,
            self.multiprocessors,
            self.pci_bus,
            self.pci_device,
            self.pci_domain,
        ];
        for (i, v) in ints.iter().enumerate() {
            put(&mut b, 280 + 4 * i, &v.to_le_bytes());
        }
        put(&mut b, 304, &self.pcie_link);
        b
    }

    /// Decodes a record.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < GPU_INFO_SIZE {
            return Err(WireError::Short);
        }
        let mut g = Self::default();
        g.name.copy_from_slice(&b[0..256]);
        g.uuid.copy_from_slice(&b[256..272]);
        g.total_mem = get_u64(b, 272);
        // The C `int` fields, written by `encode` as two's-complement little-endian bytes.
        let i = |k: usize| i32::from_le_bytes(get_u32(b, 280 + 4 * k).to_le_bytes());
        g.cc_major = i(0);
        g.cc_minor = i(1);
        g.multiprocessors = i(2);
        g.pci_bus = i(3);
        g.pci_device = i(4);
        g.pci_domain = i(5);
        g.pcie_link.copy_from_slice(&b[304..308]);
        Ok(g)
    }
}

/// The guest-user address window for host-mapped memory that the guest library allocates
/// (`cudaHostAlloc`; `cudaMallocManaged` where the driver places its device memory there):
/// guest-lib and every session worker reserve
/// `[HOST_WINDOW_BASE, HOST_WINDOW_BASE + HOST_WINDOW_LEN)` at start, so that a range the guest
/// maps there can be mapped at the same address on the host, and the device address of
/// host-mapped memory equals the guest's pointer.
pub const HOST_WINDOW_BASE: u64 = 0x2000_0000_0000;
/// See [`HOST_WINDOW_BASE`] (1 TiB).
pub const HOST_WINDOW_LEN: u64 = 1 << 40;
/// Page granularity of host mappings.
pub const HOST_PAGE_SIZE: u64 = 4096;
/// `HostMap` flag: the device only reads the memory (`cudaHostRegisterReadOnly`).
pub const HOST_MAP_READ_ONLY: u64 = 1 << 0;
/// `HostMap` flag: managed memory (`cudaMallocManaged`). The worker places device memory at
/// the guest address: the device memory [`Op::ManagedPlace`] put there, of exactly this length.
/// The worker keeps the guest pages elsewhere in its process, as the other side of
/// [`Op::ManagedMigrate`].
pub const HOST_MAP_MANAGED: u64 = 1 << 1;
/// All `HostMap` flags.
pub const HOST_MAP_FLAGS: u64 = HOST_MAP_READ_ONLY | HOST_MAP_MANAGED;
/// Where guest-lib offers addresses for managed memory ([`Op::ManagedPlace`]'s hint):
/// `[MANAGED_WINDOW_BASE, MANAGED_WINDOW_BASE + MANAGED_WINDOW_LEN)` (80 TiB, 1 TiB long),
/// reserved in the guest process at its first managed allocation and mapped by nothing of
/// qcuda's in a worker (the sessions' device ranges start at 0x6800_0000_0000 by default, the
/// host-mapping window lies at 32 TiB), so that where the driver honours the hint the memory
/// lands at an address the guest holds for it.
pub const MANAGED_WINDOW_BASE: u64 = 0x5000_0000_0000;
/// See [`MANAGED_WINDOW_BASE`].
pub const MANAGED_WINDOW_LEN: u64 = 1 << 40;
/// Alignment and size granule of managed allocations' device memory (the device's VMM
/// granularity on every NVIDIA GPU qcuda supports).
pub const MANAGED_ALIGN: u64 = 2 << 20;
/// [`Op::ManagedMigrate`] direction: guest RAM → device.
pub const MANAGED_TO_DEVICE: u64 = 0;
/// [`Op::ManagedMigrate`] direction: device → guest RAM.
pub const MANAGED_TO_HOST: u64 = 1;
/// [`Op::ManagedMigrate`] scope: the allocation is attached globally (`cudaMemAttachGlobal`):
/// work on any stream of its device may touch it.
pub const MANAGED_SCOPE_GLOBAL: u64 = 0;
/// [`Op::ManagedMigrate`] scope: attached to one stream (`cudaMemAttachSingle`).
pub const MANAGED_SCOPE_STREAM: u64 = 1;

/// Bytes of an encoded [`HostRun`].
pub const HOST_RUN_SIZE: usize = 16;

/// One guest-physically contiguous run of a host mapping: gpa u64 @0, len u64 @8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostRun {
    /// Guest-physical address (page-aligned).
    pub gpa: u64,
    /// Length in bytes (a page multiple).
    pub len: u64,
}

impl HostRun {
    /// Encodes the record.
    pub fn encode(&self) -> [u8; HOST_RUN_SIZE] {
        let mut b = [0u8; HOST_RUN_SIZE];
        put(&mut b, 0, &self.gpa.to_le_bytes());
        put(&mut b, 8, &self.len.to_le_bytes());
        b
    }

    /// Decodes a record.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < HOST_RUN_SIZE {
            return Err(WireError::Short);
        }
        Ok(Self {
            gpa: get_u64(b, 0),
            len: get_u64(b, 8),
        })
    }
}

/// `LaunchKernel` flag (args[6]): a cooperative launch (`cudaLaunchCooperativeKernel`): every
/// block resident at once, so that grid-wide synchronisation works.
pub const LAUNCH_COOPERATIVE: u64 = 1 << 0;

/// Bytes of an encoded [`LaunchAttr`].
pub const LAUNCH_ATTR_SIZE: usize = 32;

/// Most launch attributes one launch may carry.
pub const MAX_LAUNCH_ATTRS: usize = 32;

/// One launch attribute (`cudaLaunchAttribute`): its id and its value, by kind of id:
/// scalars (cooperative, priority, ...) in `v[0]`; cluster dimensions in `v[0..3]`; the
/// memory-synchronisation domain map as default `v[0]`, remote `v[1]`; an event (programmatic
/// or completion event) as the session's event handle in `w[0]`, its flags in `v[0]` and
/// triggerAtBlockStart in `v[1]`; the access policy window as base `w[0]`, bytes `w[1]`,
/// hitRatio (f32 bits) `v[0]`, hitProp `v[1]`, missProp `v[2]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaunchAttr {
    /// The `cudaLaunchAttributeID` (the driver's `CUlaunchAttributeID`).
    pub id: u32,
    /// 32-bit values.
    pub v: [u32; 3],
    /// 64-bit values.
    pub w: [u64; 2],
}

impl LaunchAttr {
    /// Encodes the record: id u32 @0, v @4, w @16.
    pub fn encode(&self) -> [u8; LAUNCH_ATTR_SIZE] {
        let mut b = [0u8; LAUNCH_ATTR_SIZE];
        put(&mut b, 0, &self.id.to_le_bytes());
        for (i, v) in self.v.iter().enumerate() {
            put(&mut b, 4 + 4 * i, &v.to_le_bytes());
        }
        for (i, w) in self.w.iter().enumerate() {
            put(&mut b, 16 + 8 * i, &w.to_le_bytes());
        }
        b
    }

    /// Decodes a record.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < LAUNCH_ATTR_SIZE {
            return Err(WireError::Short);
        }
        Ok(Self {
            id: get_u32(b, 0),
            v: [get_u32(b, 4), get_u32(b, 8), get_u32(b, 12)],
            w: [get_u64(b, 16), get_u64(b, 24)],
        })
    }
}

/// Bytes of an encoded [`ParamInfo`].
pub const PARAM_INFO_SIZE: usize = 8;

/// Where one kernel parameter sits in the parameter block (from cuFuncGetParamInfo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParamInfo {
    /// Byte offset in the parameter block.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

impl ParamInfo {
    /// Encodes the record: offset u32 @0, size u32 @4.
    pub fn encode(&self) -> [u8; PARAM_INFO_SIZE] {
        let mut b = [0u8; PARAM_INFO_SIZE];
        put(&mut b, 0, &self.offset.to_le_bytes());
        put(&mut b, 4, &self.size.to_le_bytes());
        b
    }

    /// Decodes a record.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < PARAM_INFO_SIZE {
            return Err(WireError::Short);
        }
        Ok(Self {
            offset: get_u32(b, 0),
            size: get_u32(b, 4),
        })
    }
}

/// [`Copy3DSide::kind`]: bytes carried by the request (in-buffer 1 or out-buffer 0), packed.
pub const COPY_WIRE: u32 = 0;
/// [`Copy3DSide::kind`]: a device address of the session (device memory or host-mapped).
pub const COPY_DEVICE: u32 = 1;
/// [`Copy3DSide::kind`]: an array handle of the session.
pub const COPY_ARRAY: u32 = 2;

/// Bytes of an encoded [`Copy3DSide`].
pub const COPY3D_SIDE_SIZE: usize = 56;
/// Bytes of an encoded [`Copy3D`].
pub const COPY3D_SIZE: usize = 2 * COPY3D_SIDE_SIZE + 24;

/// One side of a [`Copy3D`]. For `COPY_WIRE` every field but `kind` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Copy3DSide {
    /// `COPY_WIRE`, `COPY_DEVICE` or `COPY_ARRAY`.
    pub kind: u32,
    /// Device address of the memory (`COPY_DEVICE`) or array handle (`COPY_ARRAY`).
    pub addr: u64,
    /// Bytes from one row to the next (`COPY_DEVICE`).
    pub pitch: u64,
    /// Rows from one slice to the next (`COPY_DEVICE`).
    pub height: u64,
    /// Offset of the first byte in a row, in bytes.
    pub x: u64,
    /// First row.
    pub y: u64,
    /// First slice (layer, for layered arrays).
    pub z: u64,
}

impl Copy3DSide {
    fn encode_into(&self, b: &mut [u8]) {
        put(b, 0, &u64::from(self.kind).to_le_bytes());
        for (i, v) in [self.addr, self.pitch, self.height, self.x, self.y, self.z]
            .iter()
            .enumerate()
        {
            put(b, 8 + 8 * i, &v.to_le_bytes());
        }
    }

    fn decode(b: &[u8]) -> Result<Self, WireError> {
        let kind = u32::try_from(get_u64(b, 0))
            .ok()
            .filter(|k| *k <= COPY_ARRAY)
            .ok_or(WireError::Reserved)?;
        Ok(Self {
            kind,
            addr: get_u64(b, 8),
            pitch: get_u64(b, 16),
            height: get_u64(b, 24),
            x: get_u64(b, 32),
            y: get_u64(b, 40),
            z: get_u64(b, 48),
        })
    }
}

/// A 3D copy (`CUDA_MEMCPY3D` in qcuda's terms): `depth` slices of `height` rows of `width`
/// bytes from `src` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Copy3D {
    /// Source.
    pub src: Copy3DSide,
    /// Destination.
    pub dst: Copy3DSide,
    /// Bytes per row.
    pub width: u64,
    /// Rows per slice.
    pub height: u64,
    /// Slices.
    pub depth: u64,
}

impl Copy3D {
    /// Encodes: src @0, dst @56 (each kind u64, addr, pitch, height, x, y, z), then width,
    /// height, depth (u64 each) @112.
    pub fn encode(&self) -> [u8; COPY3D_SIZE] {
        let mut b = [0u8; COPY3D_SIZE];
        self.src.encode_into(&mut b[..COPY3D_SIDE_SIZE]);
        self.dst
            .encode_into(&mut b[COPY3D_SIDE_SIZE..2 * COPY3D_SIDE_SIZE]);
        let at = 2 * COPY3D_SIDE_SIZE;
        put(&mut b, at, &self.width.to_le_bytes());
        put(&mut b, at + 8, &self.height.to_le_bytes());
        put(&mut b, at + 16, &self.depth.to_le_bytes());
        b
    }

    /// Decodes a copy; the buffer must be exactly [`COPY3D_SIZE`] bytes.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() != COPY3D_SIZE {
            return Err(WireError::Short);
        }
        let at = 2 * COPY3D_SIDE_SIZE;
        Ok(Self {
            src: Copy3DSide::decode(&b[..COPY3D_SIDE_SIZE])?,
            dst: Copy3DSide::decode(&b[COPY3D_SIDE_SIZE..at])?,
            width: get_u64(b, at),
            height: get_u64(b, at + 8),
            depth: get_u64(b, at + 16),
        })
    }

    /// Bytes a `COPY_WIRE` side carries: width × height × depth (None on overflow).
    pub fn packed_len(&self) -> Option<u64> {
        self.width.checked_mul(self.height)?.checked_mul(self.depth)
    }
}

/// The words of `TexObjectCreate`'s in-buffer: the driver's resource, texture and view
/// descriptors (`CUDA_RESOURCE_DESC`, `CUDA_TEXTURE_DESC`, `CUDA_RESOURCE_VIEW_DESC`), one
/// little-endian u64 per field; floats as their f32 bits.
pub mod tex {
    /// `CUresourcetype` (0 array, 1 mipmapped array, 2 linear, 3 pitch 2D).
    pub const RES_TYPE: usize = 0;
    /// Array or mipmapped array handle, or the device address of linear memory.
    pub const RES_HANDLE: usize = 1;
    /// `CUarray_format` of linear and pitch-2D memory.
    pub const RES_FORMAT: usize = 2;
    /// Channels of linear and pitch-2D memory.
    pub const RES_CHANNELS: usize = 3;
    /// Size in bytes (linear) or width in elements (pitch 2D).
    pub const RES_WIDTH: usize = 4;
    /// Height in rows (pitch 2D).
    pub const RES_HEIGHT: usize = 5;
    /// Pitch in bytes (pitch 2D).
    pub const RES_PITCH: usize = 6;
    /// `CUaddress_mode` of dimensions 0, 1, 2.
    pub const ADDRESS_MODE: usize = 7;
    /// `CUfilter_mode`.
    pub const FILTER_MODE: usize = 10;
    /// `CU_TRSF_*` flags.
    pub const FLAGS: usize = 11;
    /// Maximum anisotropy.
    pub const MAX_ANISOTROPY: usize = 12;
    /// Mipmap `CUfilter_mode`.
    pub const MIPMAP_FILTER_MODE: usize = 13;
    /// Mipmap level bias (f32 bits).
    pub const MIPMAP_LEVEL_BIAS: usize = 14;
    /// Minimum mipmap level clamp (f32 bits).
    pub const MIN_MIPMAP_LEVEL_CLAMP: usize = 15;
    /// Maximum mipmap level clamp (f32 bits).
    pub const MAX_MIPMAP_LEVEL_CLAMP: usize = 16;
    /// Border colour, 4 × f32 bits.
    pub const BORDER_COLOR: usize = 17;
    /// 1 if a resource view follows, else 0 (and the view words are 0).
    pub const VIEW_PRESENT: usize = 21;
    /// `CUresourceViewFormat`.
    pub const VIEW_FORMAT: usize = 22;
    /// View width, height, depth.
    pub const VIEW_EXTENT: usize = 23;
    /// First and last mipmap level, first and last layer.
    pub const VIEW_LEVELS: usize = 26;
    /// Words in the buffer.
    pub const WORDS: usize = 30;
}
/// Bytes of `TexObjectCreate`'s in-buffer.
pub const TEX_DESC_SIZE: usize = tex::WORDS * 8;

/// Streaming checksum used by the echo self-test: a 64-bit multiply-rotate hash over
/// little-endian 8-byte words, so it runs fast even in a TCG guest. Splitting the input at any
/// byte boundary gives the same result.
#[derive(Debug, Clone, Copy)]
pub struct Checksum {
    state: u64,
    len: u64,
    pending: [u8; 8],
    npending: usize,
}

impl Default for Checksum {
    fn default() -> Self {
        Self::new()
    }
}

impl Checksum {
    const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
    const MUL: u64 = 0xff51_afd7_ed55_8ccd;

    /// A fresh checksum.
    pub const fn new() -> Self {
        Self {
            state: Self::SEED,
            len: 0,
            pending: [0; 8],
            npending: 0,
        }
    }

    fn word(&mut self, w: u64) {
        self.state = (self.state ^ w).wrapping_mul(Self::MUL).rotate_left(31);
    }

    /// Feeds bytes.
    pub fn update(&mut self, mut data: &[u8]) {
        self.len = self.len.wrapping_add(data.len() as u64);
        if self.npending > 0 {
            let take = (8 - self.npending).min(data.len());
            self.pending[self.npending..self.npending + take].copy_from_slice(&data[..take]);
            self.npending += take;
            data = &data[take..];
            if self.npending < 8 {
                return;
            }
            let w = u64::from_le_bytes(self.pending);
            self.word(w);
            self.npending = 0;
        }
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.npending = rest.len();
    }

    /// The checksum of everything fed so far.
    pub fn finish(&self) -> u64 {
        let mut c = *self;
        if c.npending > 0 {
            let mut w = [0u8; 8];
            w[..c.npending].copy_from_slice(&c.pending[..c.npending]);
            c.word(u64::from_le_bytes(w));
        }
        c.word(c.len);
        c.state ^ (c.state >> 29)
    }

    /// Checksum of one slice.
    pub fn of(data: &[u8]) -> u64 {
        let mut c = Self::new();
        c.update(data);
        c.finish()
    }
}

/// The ioctl ABI of `/dev/qcuda`.
///
/// One generic call: user space fills an [`IoctlCall`] and issues [`IOCTL_CALL`]. The kernel
/// module reads it once, turns the user buffers into a chain, stamps the session id, waits, and
/// writes `status`, `resp_flags` and `rets` back. `IoctlCall` is `#[repr(C)]` with no padding,
/// so its in-memory layout is exactly its encoding on little-endian machines.
pub mod ioctl {
    use super::*;

    /// One user buffer: a user-space address, a length and a [`Direction`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    #[repr(C)]
    pub struct IoctlBuffer {
        /// User virtual address.
        pub addr: u64,
        /// Length in bytes.
        pub len: u64,
        /// A [`Direction`] as u32.
        pub dir: u32,
        /// Must be zero.
        pub reserved: u32,
    }

    /// The argument of [`IOCTL_CALL`].
    ///
    /// Layout: op u32 @0, flags u32 @4 (low 16 bits: `FLAG_*`), device u32 @8, nbufs u32 @12,
    /// status u32 @16 (out), resp_flags u32 @20 (out), args [u64; 8] @24, rets [u64; 7] @88
    /// (out), bufs [IoctlBuffer; 8] @144.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    #[repr(C)]
    pub struct IoctlCall {
        /// An [`Op`] as u32 (kernel-only ops are refused).
        pub op: u32,
        /// Request flags.
        pub flags: u32,
        /// Device ordinal.
        pub device: u32,
        /// Used entries of `bufs`.
        pub nbufs: u32,
        /// Out: the `cudaError_t` from the device.
        pub status: u32,
        /// Out: `RESP_FLAG_*`.
        pub resp_flags: u32,
        /// Inline arguments.
        pub args: [u64; MAX_ARGS],
        /// Out: return values.
        pub rets: [u64; MAX_RETS],
        /// The buffers.
        pub bufs: [IoctlBuffer; MAX_BUFFERS],
    }

    /// Bytes of an [`IoctlCall`].
    pub const IOCTL_CALL_SIZE: usize = 144 + 24 * MAX_BUFFERS;

    /// The size field of an ioctl number has 14 bits.
    const IOC_SIZE_LIMIT: usize = 1 << 14;
    const _: () = assert!(IOCTL_CALL_SIZE < IOC_SIZE_LIMIT && HOST_MAP_CALL_SIZE < IOC_SIZE_LIMIT);

    const IOC_WRITE: u32 = 1;
    const IOC_READ: u32 = 2;

    /// `_IOWR('Q', 0x01, struct IoctlCall)`.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "IOCTL_CALL_SIZE is a constant below 1 << 14 (asserted above)"
    )]
    pub const IOCTL_CALL: u32 = ((IOC_READ | IOC_WRITE) << 30)
        | ((IOCTL_CALL_SIZE as u32) << 16)
        | ((b'Q' as u32) << 8)
        | 0x01;

    /// Device node path in the guest.
    pub const DEVICE_PATH: &str = "/dev/qcuda";

    /// The argument of [`IOCTL_HOST_MAP`] and [`IOCTL_HOST_UNMAP`].
    ///
    /// Layout: addr u64 @0, len u64 @8, flags u64 @16 (in: `HOST_MAP_*`), device u32 @24 (in),
    /// status u32 @28 (out: the host's `cudaError_t`), dev_addr u64 @32 (out).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    #[repr(C)]
    pub struct HostMapCall {
        /// User address of the range.
        pub addr: u64,
        /// Its length in bytes (`IOCTL_HOST_MAP` only).
        pub len: u64,
        /// `HOST_MAP_*` flags (`IOCTL_HOST_MAP` only).
        pub flags: u64,
        /// The CUDA device current for the caller.
        pub device: u32,
        /// Out: the host's `cudaError_t`.
        pub status: u32,
        /// Out: the device address of `addr` (`IOCTL_HOST_MAP` only).
        pub dev_addr: u64,
    }

    /// Bytes of a [`HostMapCall`].
    pub const HOST_MAP_CALL_SIZE: usize = 40;

    /// `_IOWR('Q', 0x02, struct HostMapCall)`: makes the user range `[addr, addr + len)`
    /// reachable by the GPU. A range that is exactly one mmap of /dev/qcuda uses the module's
    /// pages; any other range is pinned (`FOLL_LONGTERM`) for as long as the mapping lives. The
    /// module sends `Op::HostMap` and holds the pages until the host has dropped its mapping.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "HOST_MAP_CALL_SIZE is a constant below 1 << 14 (asserted above)"
    )]
    pub const IOCTL_HOST_MAP: u32 = ((IOC_READ | IOC_WRITE) << 30)
        | ((HOST_MAP_CALL_SIZE as u32) << 16)
        | ((b'Q' as u32) << 8)
        | 0x02;
    /// `_IOWR('Q', 0x03, struct HostMapCall)`: ends the mapping made at `addr` (`Op::HostUnmap`)
    /// and releases its pages; for an mmap of /dev/qcuda that was never mapped, only forgets it.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "HOST_MAP_CALL_SIZE is a constant below 1 << 14 (asserted above)"
    )]
    pub const IOCTL_HOST_UNMAP: u32 = ((IOC_READ | IOC_WRITE) << 30)
        | ((HOST_MAP_CALL_SIZE as u32) << 16)
        | ((b'Q' as u32) << 8)
        | 0x03;

    impl HostMapCall {
        /// Encodes the call as the kernel reads it.
        pub fn encode(&self) -> [u8; HOST_MAP_CALL_SIZE] {
            let mut b = [0u8; HOST_MAP_CALL_SIZE];
            put(&mut b, 0, &self.addr.to_le_bytes());
            put(&mut b, 8, &self.len.to_le_bytes());
            put(&mut b, 16, &self.flags.to_le_bytes());
            put(&mut b, 24, &self.device.to_le_bytes());
            put(&mut b, 28, &self.status.to_le_bytes());
            put(&mut b, 32, &self.dev_addr.to_le_bytes());
            b
        }

        /// Decodes a call from user space (the out fields are ignored).
        pub fn decode(b: &[u8]) -> Result<Self, WireError> {
            if b.len() < HOST_MAP_CALL_SIZE {
                return Err(WireError::Short);
            }
            let c = Self {
                addr: get_u64(b, 0),
                len: get_u64(b, 8),
                flags: get_u64(b, 16),
                device: get_u32(b, 24),
                ..Self::default()
            };
            if c.flags & !HOST_MAP_FLAGS != 0 {
                return Err(WireError::Reserved);
            }
            Ok(c)
        }
    }

    impl IoctlCall {
        /// A call for `op` with no buffers.
        pub fn new(op: Op) -> Self {
            Self {
                op: op as u32,
                ..Self::default()
            }
        }

        /// Appends a user buffer.
        pub fn push(&mut self, dir: Direction, addr: u64, len: u64) -> Result<(), WireError> {
            let n = self.nbufs as usize;
            if n >= MAX_BUFFERS {
                return Err(WireError::TooManyBuffers);
            }
            self.bufs[n] = IoctlBuffer {
                addr,
                len,
                dir: dir as u32,
                reserved: 0,
            };
            self.nbufs += 1;
            Ok(())
        }

        /// Encodes the call as the kernel reads it.
        pub fn encode(&self) -> [u8; IOCTL_CALL_SIZE] {
            let mut b = [0u8; IOCTL_CALL_SIZE];
            let head = [
                self.op,
                self.flags,
                self.device,
                self.nbufs,
                self.status,
                self.resp_flags,
            ];
            for (i, v) in head.iter().enumerate() {
                put(&mut b, 4 * i, &v.to_le_bytes());
            }
            for (i, a) in self.args.iter().enumerate() {
                put(&mut b, 24 + 8 * i, &a.to_le_bytes());
            }
            for (i, r) in self.rets.iter().enumerate() {
                put(&mut b, 88 + 8 * i, &r.to_le_bytes());
            }
            for (i, d) in self.bufs.iter().enumerate() {
                let at = 144 + 24 * i;
                put(&mut b, at, &d.addr.to_le_bytes());
                put(&mut b, at + 8, &d.len.to_le_bytes());
                put(&mut b, at + 16, &d.dir.to_le_bytes());
                put(&mut b, at + 20, &d.reserved.to_le_bytes());
            }
            b
        }

        /// Decodes and validates a call from user space: buffer count, directions (`In`
        /// before `Out`), lengths, reserved fields, flags, and the op's shape. Kernel-only ops
        /// are refused. Zero-length buffers are allowed.
        pub fn decode(b: &[u8]) -> Result<Self, WireError> {
            if b.len() < IOCTL_CALL_SIZE {
                return Err(WireError::Short);
            }
            let mut c = Self {
                op: get_u32(b, 0),
                flags: get_u32(b, 4),
                device: get_u32(b, 8),
                nbufs: get_u32(b, 12),
                ..Self::default()
            };
            let wait = c.flags & (CALL_WAIT_SPIN | CALL_WAIT_BLOCK);
            let flags = u16::try_from(c.flags & !wait).map_err(|_| WireError::Reserved)?;
            if flags & !KNOWN_FLAGS != 0
                || wait == CALL_WAIT_SPIN | CALL_WAIT_BLOCK
                || (wait != 0 && flags & FLAG_ASYNC != 0)
            {
                // A fire-and-forget call does not wait, so it has no way to wait.
                return Err(WireError::Reserved);
            }
            if c.nbufs as usize > MAX_BUFFERS {
                return Err(WireError::TooManyBuffers);
            }
            for (i, a) in c.args.iter_mut().enumerate() {
                *a = get_u64(b, 24 + 8 * i);
            }
            let mut header = RequestHeader {
                op: c.op,
                flags,
                device: c.device,
                ..RequestHeader::default()
            };
            for i in 0..c.nbufs as usize {
                let at = 144 + 24 * i;
                let d = IoctlBuffer {
                    addr: get_u64(b, at),
                    len: get_u64(b, at + 8),
                    dir: get_u32(b, at + 16),
                    reserved: get_u32(b, at + 20),
                };
                if d.reserved != 0 {
                    return Err(WireError::Reserved);
                }
                if d.len > MAX_BUFFER_LEN {
                    return Err(WireError::BufferTooLong);
                }
                let dir = Direction::from_u32(d.dir).ok_or(WireError::BadDirection)?;
                if dir == Direction::In && header.counts().1 > 0 {
                    return Err(WireError::BadDirection);
                }
                header.push_buffer(dir, d.len)?;
                c.bufs[i] = d;
            }
            let op = header.checked_op()?;
            if op.is_kernel_only() {
                return Err(WireError::UnknownOp);
            }
            Ok(c)
        }

        /// How the caller waits for the answer (the call's `CALL_WAIT_*` flag; a decoded call
        /// has at most one).
        pub fn wait_mode(&self) -> WaitMode {
            if self.flags & CALL_WAIT_SPIN != 0 {
                WaitMode::Spin
            } else if self.flags & CALL_WAIT_BLOCK != 0 {
                WaitMode::Block
            } else {
                WaitMode::Poll
            }
        }

        /// The request header this call becomes, before the kernel stamps the session.
        /// Its flags are the low 16 bits (`decode` refuses any outside `KNOWN_FLAGS`); the
        /// wait flags above them stay in the guest.
        pub fn header(&self) -> RequestHeader {
            let mut h = RequestHeader {
                op: self.op,
                flags: (self.flags & 0xffff) as u16,
                device: self.device,
                args: self.args,
                ..RequestHeader::default()
            };
            for d in &self.bufs[..(self.nbufs as usize).min(MAX_BUFFERS)] {
                h.bufs[h.nbufs as usize] = BufferDesc {
                    len: d.len,
                    dir: d.dir,
                };
                h.nbufs += 1;
            }
            h
        }
    }
}

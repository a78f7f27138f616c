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

/// Request flag: fire-and-forget. The caller does not wait for the result; the device executes
/// the op in stream order and reports a failure at the session's next synchronising op.
pub const FLAG_ASYNC: u16 = 1 << 0;
/// All request flags this version knows.
pub const KNOWN_FLAGS: u16 = FLAG_ASYNC;

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
/// `cudaError_t` value; the guest library returns it to the application unchanged.
pub mod status {
    /// cudaSuccess
    pub const SUCCESS: u32 = 0;
    /// cudaErrorInvalidValue
    pub const INVALID_VALUE: u32 = 1;
    /// cudaErrorMemoryAllocation
    pub const MEMORY_ALLOCATION: u32 = 2;
    /// cudaErrorInitializationError
    pub const INITIALIZATION_ERROR: u32 = 3;
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
    /// cudaErrorNoKernelImageForDevice
    pub const NO_KERNEL_IMAGE_FOR_DEVICE: u32 = 209;
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
    /// cudaErrorUnknown
    pub const UNKNOWN: u32 = 999;

    /// The sticky errors: driver_types.h documents these as leaving the process in an
    /// inconsistent state ("any further CUDA work will return the same error", or "the process
    /// must be terminated and relaunched"), plus uncorrectable ECC and NVLink errors, after
    /// which nothing in the context can be trusted either. The one list the host executor and
    /// guest-lib both use: cudaErrorECCUncorrectable, NvlinkUncorrectable, Contained,
    /// IllegalAddress, LaunchTimeout, Assert, HardwareStackError, IllegalInstruction,
    /// MisalignedAddress, InvalidAddressSpace, InvalidPc, LaunchFailure, TensorMemoryLeak,
    /// MpsClientTerminated, ExternalDevice.
    pub const STICKY: &[u32] = &[
        214,
        220,
        226,
        ILLEGAL_ADDRESS,
        702,
        710,
        714,
        715,
        716,
        717,
        718,
        LAUNCH_FAILURE,
        721,
        810,
        911,
    ];

    /// True for a sticky `cudaError_t` (see [`STICKY`]).
    pub fn is_sticky(status: u32) -> bool {
        STICKY.contains(&status)
    }
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
    /// args[0] = destination, args[1] = byte value, args[2] = size, args[3] = stream handle.
    Memset = 0x0115, ins 0, outs 0;
    /// A copy between two device-addressable ranges, each the session's device memory or its
    /// host-mapped guest memory (`HostMap`): args[0] = destination, args[1] = source (device
    /// addresses), args[2] = size, args[3] = stream handle. The driver's own DMA moves the
    /// bytes, in stream order; nothing crosses the virtqueue.
    MemcpyMapped = 0x0116, ins 0, outs 0;

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

    /// args[0] = flags (cudaStreamNonBlocking = 1), args[1] = priority. rets[0] = stream handle.
    StreamCreate = 0x0140, ins 0, outs 0;
    /// args[0] = stream handle.
    StreamDestroy = 0x0141, ins 0, outs 0;
    /// args[0] = stream handle (0: legacy stream).
    StreamSynchronize = 0x0142, ins 0, outs 0;
    /// args[0] = stream handle. Status NOT_READY while work is pending.
    StreamQuery = 0x0143, ins 0, outs 0;
    /// args[0] = stream handle, args[1] = event handle, args[2] = flags.
    StreamWaitEvent = 0x0144, ins 0, outs 0;

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
/// session u64 @16, device u32 @24, reserved u32 @28, args [u64; 8] @32,
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
        if flags & !KNOWN_FLAGS != 0 || get_u32(b, 28) != 0 {
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
/// pci_domain i32 @300, reserved [u8; 16] @304.
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
        let i = |k: usize| get_u32(b, 280 + 4 * k) as i32;
        g.cc_major = i(0);
        g.cc_minor = i(1);
        g.multiprocessors = i(2);
        g.pci_bus = i(3);
        g.pci_device = i(4);
        g.pci_domain = i(5);
        Ok(g)
    }
}

/// The guest-user address window for host-mapped memory that the guest library allocates
/// (`cudaHostAlloc`, `cudaMallocManaged`): guest-lib and every session worker reserve
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
/// All `HostMap` flags.
pub const HOST_MAP_FLAGS: u64 = HOST_MAP_READ_ONLY;

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

    const IOC_WRITE: u32 = 1;
    const IOC_READ: u32 = 2;

    /// `_IOWR('Q', 0x01, struct IoctlCall)`.
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
    pub const IOCTL_HOST_MAP: u32 = ((IOC_READ | IOC_WRITE) << 30)
        | ((HOST_MAP_CALL_SIZE as u32) << 16)
        | ((b'Q' as u32) << 8)
        | 0x02;
    /// `_IOWR('Q', 0x03, struct HostMapCall)`: ends the mapping made at `addr` (`Op::HostUnmap`)
    /// and releases its pages; for an mmap of /dev/qcuda that was never mapped, only forgets it.
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
            if c.flags & !u32::from(KNOWN_FLAGS) != 0 {
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
                flags: c.flags as u16,
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

        /// The request header this call becomes, before the kernel stamps the session.
        pub fn header(&self) -> RequestHeader {
            let mut h = RequestHeader {
                op: self.op,
                flags: self.flags as u16,
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

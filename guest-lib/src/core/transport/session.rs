//! The session: this process's connection to the host through `/dev/qcuda`.
//!
//! It submits [`Call`]s through a [`Transport`] and owns the rules that apply to every call:
//! the handshake, interrupted ioctls, turning errnos into CUDA errors, fire-and-forget policy,
//! and sticky errors. A sticky error is one of the context-corrupting codes (illegal address,
//! launch failure, ...) answered with `RESP_FLAG_STICKY`; it is kept per device, and from then on
//! every call that needs that device's context fails with it locally, without a round trip,
//! until `cudaDeviceReset`.

use crate::core::conv::{c_int_of, low_u32};
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use qcuda_proto::{
    ioctl::HostMapCall, Direction, Op, WaitMode, BOUNCE_THRESHOLD, LATENCY_RECORD_SIZE,
    RESP_DEFERRED_SHIFT, RESP_FLAG_OUTPUT, RESP_FLAG_STICKY, VERSION,
};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::transport::batch::{Ahead, Batcher},
    core::transport::latency::{self, Latency, Timer},
    core::transport::profile::{Profile, TraceChannel},
    core::transport::signal_mask::SignalsBlocked,
    core::transport::{Call, Reply, Transport},
    core::warnings::warn_once,
};

/// Device ordinals guest-lib tracks state for; a host with more GPUs shows the first 64.
pub const MAX_DEVICES: usize = MAX_DEVICES_U32 as usize;
/// [`MAX_DEVICES`] as the wire's device numbers count.
pub const MAX_DEVICES_U32: u32 = 64;

/// What the host said in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostInfo {
    /// The host's wire version.
    pub wire_version: u32,
    /// GPUs on the host.
    pub gpus: u32,
    /// The host's `cuDriverGetVersion`, 0 without a driver.
    pub driver_version: i32,
}

/// One process's connection to the host.
pub struct Session {
    transport: Arc<dyn Transport>,
    /// Fire-and-forget work gathered into one request (batch.rs).
    batch: Batcher,
    host: HostInfo,
    /// Per device: the sticky `cudaError_t`, 0 while none.
    sticky: [AtomicU32; MAX_DEVICES],
    /// `CUDA_LAUNCH_BLOCKING=1`: every call waits for its result, so errors surface at the call
    /// that caused them (as with NVIDIA's runtime).
    launch_blocking: bool,
    /// Set once an op that needs a context was sent: only then can kernels have printed.
    gpu_used: AtomicBool,
    /// Per device: an op that needs a context was sent, so the host has one.
    contexts: [AtomicBool; MAX_DEVICES],
    /// Per-op timings, with `QCUDA_LATENCY=1` (latency.rs).
    latency: Option<Latency>,
    /// The stream captures this process has under way (capture.rs).
    pub captures: crate::core::transport::capture::Captures,
    /// How a synchronising call on a device waits: CUDA's scheduling flags, which the
    /// session's owner knows (devices/schedule.rs); every such call spins until it is set.
    wait_mode: fn(u32) -> WaitMode,
    /// Requests this process has made (any op but `HostFuncWait`): work can only reach the
    /// device through one, so none since a synchronisation means nothing to wait for.
    requests: AtomicU64,
    /// The last synchronisation that succeeded: the request count when it was made, its
    /// device, and its stream (`None`: the whole device).
    drained: Mutex<Option<(u64, u32, Option<u64>)>>,
    /// `QCUDA_PROFILE`: the GPU timeline recorded on the host (profile.rs); `None` costs
    /// nothing.
    profile: std::sync::OnceLock<Profile>,
}

/// A profile (profile.rs) records through the session's requests.
impl TraceChannel for Session {
    fn execute(&self, op: Op, call: &mut Call<'_>) -> Result<(), i32> {
        Session::execute(self, op, call)
    }

    fn flush_batch(&self) {
        Session::flush_batch(self);
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("host", &self.host)
            .field("launch_blocking", &self.launch_blocking)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Performs the handshake over `transport`.
    pub fn connect(transport: Box<dyn Transport>, launch_blocking: bool) -> CudaResult<Self> {
        let transport: Arc<dyn Transport> = Arc::from(transport);
        let mut session = Self {
            batch: Batcher::new(Arc::clone(&transport)),
            transport,
            host: HostInfo {
                wire_version: 0,
                gpus: 0,
                driver_version: 0,
            },
            sticky: [const { AtomicU32::new(0) }; MAX_DEVICES],
            launch_blocking,
            gpu_used: AtomicBool::new(false),
            contexts: [const { AtomicBool::new(false) }; MAX_DEVICES],
            latency: Latency::from_env(),
            captures: crate::core::transport::capture::Captures::default(),
            wait_mode: |_| WaitMode::Spin,
            requests: AtomicU64::new(0),
            drained: Mutex::new(None),
            profile: std::sync::OnceLock::new(),
        };
        if let Some(p) = Profile::from_env() {
            let _ = session.profile.set(p);
        }
        let reply = session.submit(Call::new(Op::Hello, 0).args(&[u64::from(VERSION)]))?;
        session.host = HostInfo {
            wire_version: low_u32(reply.rets[0]),
            gpus: low_u32(reply.rets[1]),
            driver_version: c_int_of(reply.rets[2]),
        };
        if let Some(p) = session.profile.get() {
            p.opened(&session);
        }
        Ok(session)
    }

    /// Test hook: records into `profile` from now on, as `QCUDA_PROFILE` would have.
    #[cfg(test)]
    pub fn set_profile(&self, profile: Profile) {
        if self.profile.set(profile).is_ok() {
            if let Some(p) = self.profile.get() {
                p.opened(self);
            }
        }
    }

    /// `cudaProfilerStart`/`cuProfilerStart`: with `QCUDA_PROFILE`, recording starts (or goes
    /// on); without, nothing happens and nothing is sent.
    pub fn profiler_start(&self) {
        if let Some(p) = self.profile.get() {
            p.start(self);
        }
    }

    /// `cudaProfilerStop`/`cuProfilerStop`: with `QCUDA_PROFILE`, the recording so far is
    /// written; without, nothing happens and nothing is sent.
    pub fn profiler_stop(&self) {
        if let Some(p) = self.profile.get() {
            p.stop(self);
        }
    }

    /// Sends the gathered fire-and-forget work now (batch.rs).
    pub fn flush_batch(&self) {
        self.batch.flush();
    }

    /// Test hook: batches go out only when a call or the test sends them (batch.rs), or again
    /// also when the flusher finds them idle.
    #[cfg(test)]
    pub fn hold_batches(&self, hold: bool) {
        self.batch.set_flush_after(if hold {
            std::time::Duration::from_secs(3600)
        } else {
            crate::core::transport::batch::FLUSH_AFTER
        });
    }

    /// Whether the host has this process's context on `device` already.
    pub fn has_context(&self, device: u32) -> bool {
        self.contexts
            .get(device as usize)
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// The number of requests made so far: taken just before a synchronisation is sent, and
    /// given to [`Session::drained`] once it succeeded.
    pub fn requests_made(&self) -> u64 {
        self.requests.load(Ordering::Acquire)
    }

    /// A synchronisation of `stream` (`None`: all of `device`) that was sent after
    /// `requests_made()` returned `before` has succeeded.
    pub fn drained(&self, before: u64, device: u32, stream: Option<u64>) {
        // The synchronisation's own request is the one after `before`.
        *self.drained.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((before + 1, device, stream));
    }

    /// Whether a synchronisation of `stream` (`None`: all of `device`) has nothing to wait for:
    /// one that covered it succeeded and no request was made since, so no work can be pending
    /// there, and no failure of earlier work can be unreported (that synchronisation reported
    /// it). Natively such a call returns at once too; here it then costs no round trip.
    /// While a capture is under way the host answers every synchronisation (capture rules).
    pub fn already_drained(&self, device: u32, stream: Option<u64>) -> bool {
        if self.captures.active() {
            return false;
        }
        let last = *self.drained.lock().unwrap_or_else(PoisonError::into_inner);
        last.is_some_and(|(count, d, covered)| {
            count == self.requests_made() && d == device && (covered.is_none() || covered == stream)
        })
    }

    /// Fails with `cudaErrorStreamCaptureUnsupported` if CUDA prohibits potentially unsafe
    /// calls for the calling thread now (capture.rs); the captures that prohibit it are
    /// invalidated on the host, as CUDA invalidates them.
    pub fn check_unsafe_call(&self) -> CudaResult<()> {
        let offending = self.captures.prohibiting();
        for &(device, wire) in &offending {
            let _ = self.submit(Call::new(Op::StreamCaptureInvalidate, device).args(&[wire]));
        }
        if offending.is_empty() {
            Ok(())
        } else {
            Err(CudaError::STREAM_CAPTURE_UNSUPPORTED)
        }
    }

    /// Makes `wait_mode` decide how synchronising calls wait, per device.
    pub fn set_wait_mode(&mut self, wait_mode: fn(u32) -> WaitMode) {
        self.wait_mode = wait_mode;
    }

    /// What the host said in the handshake.
    pub fn host(&self) -> HostInfo {
        self.host
    }

    /// Runs one call and returns the host's reply, or the CUDA error it stands for.
    ///
    /// Context ops on a device with a sticky error fail with it before anything is sent.
    /// Fire-and-forget calls come back with `cudaSuccess` at once (the device reports their
    /// failure at a later synchronising op), unless `CUDA_LAUNCH_BLOCKING=1` made them wait, or
    /// they carry data that qcuda.ko would have to keep pinned (see [`may_fire_and_forget`]).
    pub fn submit(&self, mut call: Call<'_>) -> CudaResult<Reply> {
        let Some(op) = call.op() else {
            return Err(CudaError::UNKNOWN);
        };
        let timer = self.latency.as_ref().map(|_| Timer::start());
        if call.is_malformed() {
            return Err(CudaError::UNKNOWN);
        }
        let device = call.device();
        if op != Op::HostFuncWait {
            self.requests.fetch_add(1, Ordering::AcqRel);
        }
        if needs_context(op) {
            self.check_sticky(device)?;
            self.gpu_used.store(true, Ordering::Relaxed);
            if let Some(c) = self.contexts.get(device as usize) {
                c.store(true, Ordering::Relaxed);
            }
        }
        if let Some(errno) = self.batch.take_lost() {
            crate::core::last_error::record(call_errno_to_error(errno));
        }
        // During a capture every call waits, so that an op the capture refuses fails at its
        // own call (capture.rs).
        if self.launch_blocking || !may_fire_and_forget(&call) || self.captures.active() {
            call.wait_for_result();
        } else if self.batch.try_append(&call) {
            if let (Some(l), Some(t)) = (&self.latency, &timer) {
                l.record(op, t.elapsed(), Duration::ZERO);
            }
            return Ok(Reply::default());
        }
        // Only a call that waits has a way to wait (qcuda.ko refuses wait flags on
        // fire-and-forget calls).
        if !call.is_fire_and_forget() && call.wait_mode() == WaitMode::Poll && waits_for_device(op)
        {
            call.set_wait_mode((self.wait_mode)(device));
        }
        // Whatever was gathered goes first, so requests keep program order: as one request
        // with a synchronising call at its end, else before the call. The host answers
        // HostFuncWait beside the other requests, so it neither waits for nor sends them.
        let mut ioctl = timer.as_ref().map(|_| Timer::start());
        let ahead = if op == Op::HostFuncWait {
            Ahead::Nothing
        } else {
            self.batch.send_ahead_of(&mut call)
        };
        // QCUDA_LATENCY: the request this call waited for is a Batch when the call travelled
        // as a batch's tail (the host records it so too); a fire-and-forget batch sent ahead
        // is the call's guest-lib time (the host records no fire-and-forget request).
        let mut waited_as = op;
        let executed = match ahead {
            Ahead::Carried(Err(libc::EINPROGRESS)) => self.execute(op, &mut call),
            Ahead::Carried(sent) => {
                waited_as = Op::Batch;
                sent
            }
            Ahead::Flushed => {
                ioctl = timer.as_ref().map(|_| Timer::start());
                self.execute(op, &mut call)
            }
            Ahead::Nothing => self.execute(op, &mut call),
        };
        if let (Some(l), Some(t), Some(i)) = (&self.latency, &timer, &ioctl) {
            l.record(waited_as, t.elapsed(), i.elapsed());
        }
        if let Err(errno) = executed {
            let e = call_errno_to_error(errno);
            warn_once!(
                "/dev/qcuda call {op:?} failed: {} (reported as {e:?}); further transport \
                 failures are not logged",
                std::io::Error::from_raw_os_error(errno)
            );
            return Err(e);
        }
        let reply = call.reply();
        if reply.flags & RESP_FLAG_OUTPUT != 0 && op != Op::TakeOutput {
            self.print_device_output(device);
        }
        // An earlier fire-and-forget op of this process failed on the host. Like CUDA's
        // asynchronous errors it surfaces now: as the result of a synchronising call that
        // otherwise succeeded, and as the thread's last error in any case.
        if let Some(d) = CudaError::from_code(reply.flags >> RESP_DEFERRED_SHIFT) {
            if is_sticky(d) && reply.flags & RESP_FLAG_STICKY != 0 {
                self.set_sticky(device, d);
            }
            if reply.status == 0 && is_synchronizing(op) {
                return Err(d);
            }
            crate::core::last_error::record(d);
        }
        if let Some(e) = CudaError::from_code(reply.status) {
            // RESP_FLAG_STICKY says the session holds a sticky error somewhere; the status is
            // that error only if it is one of the sticky codes (another device's op, or a
            // non-sticky failure, may carry the flag too).
            if reply.flags & RESP_FLAG_STICKY != 0 && is_sticky(e) {
                self.set_sticky(device, e);
            }
            return Err(e);
        }
        Ok(reply)
    }

    /// At process exit: each device is synchronised once, which brings back what kernels
    /// printed since the last synchronisation (the host's contexts outlive the process a
    /// moment, and their output would be lost with them).
    pub fn flush_at_exit(&self, devices: u32) {
        if let Some(p) = self.profile.get() {
            p.exiting(self);
        }
        if !self.gpu_used.load(Ordering::Relaxed) {
            return;
        }
        for device in 0..devices.min(MAX_DEVICES_U32) {
            let _ = self.submit(Call::new(Op::DeviceSynchronize, device));
        }
        self.report_latency();
    }

    /// With `QCUDA_LATENCY=1`: prints the per-op report (latency.rs) on stderr.
    fn report_latency(&self) {
        let Some(l) = &self.latency else { return };
        let mut buf = vec![0u8; 256 * LATENCY_RECORD_SIZE];
        let mut call = Call::new(Op::HostLatency, 0).output(&mut buf);
        call.wait_for_result();
        let host = match self.execute(Op::HostLatency, &mut call) {
            Ok(()) if call.reply().status == 0 => {
                let n = usize::try_from(call.reply().rets[0]).unwrap_or(0);
                latency::decode_host(&buf, n)
            }
            _ => Vec::new(),
        };
        eprint!("{}", l.report(&host));
    }

    /// Fetches the device `printf` output waiting on the host and writes it to the program's C
    /// `stdout`, as NVIDIA's runtime does at the synchronisation that flushed it.
    fn print_device_output(&self, device: u32) {
        const CHUNK: usize = 64 * 1024;
        let mut buf = vec![0u8; CHUNK];
        // Bounded: the host keeps at most 16 MiB (vhost-cuda's device_output.rs).
        for _ in 0..(16 << 20) / CHUNK + 1 {
            let mut call = Call::new(Op::TakeOutput, device).output(&mut buf);
            call.wait_for_result();
            if self.execute(Op::TakeOutput, &mut call).is_err() {
                return;
            }
            let reply = call.reply();
            let n = usize::try_from(reply.rets[0]).unwrap_or(0).min(CHUNK);
            if reply.status != 0 || n == 0 {
                return;
            }
            write_c_stdout(&buf[..n]);
            if reply.flags & RESP_FLAG_OUTPUT == 0 {
                return;
            }
        }
    }

    /// One ioctl, with the signal policy: a call that may safely run twice is sent again when a
    /// signal interrupts it (`EINTR` before qcuda.ko queued it, `EINPROGRESS` after); the others
    /// run with signals blocked, so that they are sent exactly once.
    ///
    /// A fire-and-forget call counts as repeatable: qcuda.ko queues it and returns at once, so
    /// its only interruptible wait (for a free slot) comes before the request is queued
    /// (docs/guest.md). That keeps the launch path free of signal-mask system calls.
    pub(crate) fn execute(&self, op: Op, call: &mut Call<'_>) -> Result<(), i32> {
        if is_idempotent(op) || call.is_fire_and_forget() {
            loop {
                match self.transport.execute(call) {
                    // Interrupted before or after qcuda.ko queued it: either way it may run again.
                    Err(libc::EINTR | libc::EINPROGRESS) => continue,
                    r => return r,
                }
            }
        }
        let _blocked = SignalsBlocked::block();
        self.transport.execute(call)
    }

    /// Backs `addr..addr + len` (the caller's reservation) with memory the host can map.
    pub fn map_memory(&self, addr: usize, len: usize) -> CudaResult<()> {
        self.transport
            .map_memory(addr, len)
            .map_err(|_| CudaError::MEMORY_ALLOCATION)
    }

    /// Asks qcuda.ko to have the host map (`unmap == false`) or unmap the range of `call`;
    /// returns the host's answer (`dev_addr` for a map).
    pub fn host_map(&self, mut call: HostMapCall, unmap: bool) -> CudaResult<HostMapCall> {
        // Gathered work may still use the range.
        self.batch.flush();
        let sent = {
            // Sent exactly once: the module holds pages on the host's word.
            let _blocked = SignalsBlocked::block();
            self.transport.host_map(&mut call, unmap)
        };
        match sent {
            Ok(()) => match CudaError::from_code(call.status) {
                None => Ok(call),
                Some(e) => Err(e),
            },
            Err(libc::ENOMEM | libc::E2BIG) => Err(CudaError::MEMORY_ALLOCATION),
            Err(libc::EFAULT | libc::EINVAL) => Err(CudaError::INVALID_VALUE),
            Err(errno) => {
                let e = call_errno_to_error(errno);
                warn_once!(
                    "/dev/qcuda host {} failed: {} (reported as {e:?})",
                    if unmap { "unmap" } else { "map" },
                    std::io::Error::from_raw_os_error(errno)
                );
                Err(e)
            }
        }
    }

    /// The sticky error of `device`, if it has one.
    pub fn sticky(&self, device: u32) -> Option<CudaError> {
        let slot = self.sticky.get(device as usize)?;
        CudaError::from_code(slot.load(Ordering::Acquire))
    }

    /// Fails with the sticky error of `device`, if it has one.
    pub fn check_sticky(&self, device: u32) -> CudaResult<()> {
        match self.sticky(device) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn set_sticky(&self, device: u32, e: CudaError) {
        if let Some(slot) = self.sticky.get(device as usize) {
            // The first sticky error is the one CUDA keeps reporting.
            let _ = slot.compare_exchange(0, e.code(), Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Forgets the sticky error of `device` (after a successful `DeviceReset`).
    pub fn clear_sticky(&self, device: u32) {
        if let Some(slot) = self.sticky.get(device as usize) {
            slot.store(0, Ordering::Release);
        }
    }
}

/// Whether `op` runs in a device context, so that a sticky error on that device fails it.
/// Device queries, the handshake and `DeviceReset` (the way out of a sticky error) do not.
pub fn needs_context(op: Op) -> bool {
    match op {
        Op::Hello
        | Op::Echo
        | Op::HostInfo
        | Op::DriverRelease
        | Op::SessionClose
        | Op::DriverReset
        | Op::HostMap
        | Op::HostUnmap
        | Op::TakeOutput
        | Op::DeviceCount
        | Op::DeviceInfo
        | Op::DeviceAttributes
        | Op::DriverVersion
        | Op::DeviceReset
        | Op::HostFuncWait
        | Op::HostLatency
        | Op::VmUsage
        // About another process, whose session is its own.
        | Op::ProcessCheckpoint
        // The host's recorder, beside the process's contexts.
        | Op::GpuTrace => false,
        Op::DeviceSynchronize
        | Op::MemGetInfo
        | Op::DeviceGetLimit
        | Op::DeviceSetLimit
        | Op::Malloc
        | Op::Free
        | Op::MemcpyHtoD
        | Op::MemcpyDtoH
        | Op::MemcpyDtoD
        | Op::MemcpyMapped
        | Op::ManagedMigrate
        | Op::ManagedPlace
        | Op::ManagedUnplace
        | Op::Memset
        | Op::ModuleLoad
        | Op::ModuleLoadLogged
        | Op::TensorMapEncode
        | Op::ModuleUnload
        | Op::ModuleGetFunction
        | Op::ModuleFunctionNames
        | Op::Link
        | Op::ModuleGetGlobal
        | Op::LaunchKernel
        | Op::FuncAttributes
        | Op::FuncSetAttribute
        | Op::OccupancyMaxActiveBlocks
        | Op::StreamCreate
        | Op::StreamDestroy
        | Op::StreamSynchronize
        | Op::StreamQuery
        | Op::StreamWaitEvent
        | Op::EventCreate
        | Op::EventDestroy
        | Op::EventRecord
        | Op::EventSynchronize
        | Op::EventElapsedTime
        | Op::EventQuery
        | Op::LaunchHostFunc
        | Op::Batch
        | Op::StreamSetAttribute
        | Op::StreamGetAttribute
        | Op::CtxResetPersistingL2
        | qcuda_proto::array_ops!()
        | Op::StreamPriorityRange
        | Op::StreamGetId
        | Op::DeviceGetDefaultMemPool
        | Op::DeviceGetMemPool
        | Op::DeviceSetMemPool
        | Op::MemPoolCreate
        | Op::MemPoolDestroy
        | Op::MemPoolSetAttribute
        | Op::MemPoolGetAttribute
        | Op::MemPoolTrimTo
        | Op::MemPoolSetAccess
        | Op::MemPoolGetAccess
        | Op::MallocAsync
        | Op::FreeAsync
        | Op::LaunchKernelEx
        | Op::FuncSetCacheConfig
        | Op::DeviceSetCacheConfig
        | Op::DeviceGetCacheConfig
        | Op::OccupancyCluster
        | Op::OccupancyAvailableDynamicSMem
        | Op::DeviceCanAccessPeer
        | Op::DeviceP2PAttribute
        | Op::PeerAccess
        | Op::MemcpyPeer
        | qcuda_proto::vmm_ops!()
        | Op::IpcExport
        | Op::IpcImport
        | Op::IpcClose
        | Op::MemPoolExportPointer
        | Op::MemPoolImportPointer
        | qcuda_proto::graph_ops!() => true,
    }
}

/// Whether sending `op` twice has the same effect as sending it once, so that an interrupted
/// call may simply be repeated.
pub fn is_idempotent(op: Op) -> bool {
    match op {
        Op::Malloc
        | Op::Free
        | Op::ManagedPlace
        | Op::ManagedUnplace
        | Op::ModuleLoad
        | Op::ModuleLoadLogged
        | Op::ModuleUnload
        | Op::LaunchKernel
        | Op::StreamCreate
        | Op::StreamDestroy
        | Op::EventCreate
        | Op::EventDestroy
        | Op::SessionClose
        | Op::DriverReset
        | Op::HostMap
        | Op::HostUnmap
        | Op::TakeOutput
        | Op::LaunchHostFunc
        | Op::Batch
        // An answer lost to a signal would be a function that never runs.
        | Op::HostFuncWait
        | Op::MallocPitch
        | Op::ArrayCreate
        | Op::ArrayDestroy
        | Op::TexObjectCreate
        | Op::TexObjectDestroy
        | Op::SurfObjectCreate
        | Op::SurfObjectDestroy
        | Op::MemPoolCreate
        | Op::MemPoolDestroy
        | Op::MallocAsync
        | Op::FreeAsync
        | Op::LaunchKernelEx
        | Op::PeerAccess
        | Op::StreamBeginCapture
        | Op::StreamBeginCaptureToGraph
        | Op::GraphDestroyNode
        | Op::StreamEndCapture
        | Op::StreamUpdateCaptureDependencies
        | Op::GraphCreate
        | Op::GraphConditionalHandleCreate
        | Op::GraphDestroy
        | Op::GraphAddNode
        | Op::GraphEdges
        | Op::GraphClone
        | Op::GraphInstantiate
        | Op::GraphExecDestroy
        | Op::GraphLaunch
        | Op::GraphExecUpdate
        | Op::MemCreate
        | Op::MemRelease
        | Op::MemAddressReserve
        | Op::MemAddressFree
        | Op::MemMap
        | Op::MemUnmap
        | Op::MemSetAccess
        | Op::MemRetainHandle
        | Op::IpcExport
        | Op::IpcImport
        | Op::IpcClose
        | Op::MemPoolImportPointer
        // A lock repeated finds the process locked already (ILLEGAL_STATE).
        | Op::ProcessCheckpoint
        // A read repeated would lose the records the first one moved.
        | Op::GpuTrace => false,
        Op::MemGetAccess
        | Op::MemPoolExportPointer
        | Op::MemGetGranularity
        | Op::MemHandleProperties
        | Op::MemMappingRange
        | Op::Hello
        | Op::Echo
        | Op::HostInfo
        | Op::DriverRelease
        | Op::HostLatency
        | Op::VmUsage
        | Op::StreamSetAttribute
        | Op::StreamGetAttribute
        | Op::GraphKernelNodeSetAttribute
        | Op::GraphKernelNodeGetAttribute
        | Op::GraphKernelNodeCopyAttributes
        | Op::TensorMapEncode
        | Op::CtxResetPersistingL2
        | Op::DeviceCount
        | Op::DeviceInfo
        | Op::DeviceAttributes
        | Op::DriverVersion
        | Op::DeviceSynchronize
        | Op::DeviceReset
        | Op::MemGetInfo
        | Op::DeviceGetLimit
        | Op::DeviceSetLimit
        | Op::FuncAttributes
        | Op::FuncSetAttribute
        | Op::OccupancyMaxActiveBlocks
        | Op::MemcpyHtoD
        | Op::MemcpyDtoH
        | Op::MemcpyDtoD
        | Op::MemcpyMapped
        | Op::ManagedMigrate
        | Op::Memset
        | Op::ModuleGetFunction
        | Op::ModuleFunctionNames
        | Op::Link
        | Op::ModuleGetGlobal
        | Op::StreamSynchronize
        | Op::StreamQuery
        | Op::StreamWaitEvent
        | Op::EventRecord
        | Op::EventSynchronize
        | Op::EventElapsedTime
        | Op::EventQuery
        | Op::Memset3D
        | Op::Memcpy3D
        | Op::Memcpy3DHtoD
        | Op::Memcpy3DDtoH
        | Op::MipmappedArrayLevel
        | Op::ArrayInfo
        | Op::StreamPriorityRange
        | Op::StreamGetId
        | Op::DeviceGetDefaultMemPool
        | Op::DeviceGetMemPool
        | Op::DeviceSetMemPool
        | Op::MemPoolSetAttribute
        | Op::MemPoolGetAttribute
        | Op::MemPoolTrimTo
        | Op::MemPoolSetAccess
        | Op::MemPoolGetAccess
        | Op::FuncSetCacheConfig
        | Op::DeviceSetCacheConfig
        | Op::DeviceGetCacheConfig
        | Op::OccupancyCluster
        | Op::OccupancyAvailableDynamicSMem
        | Op::DeviceCanAccessPeer
        | Op::DeviceP2PAttribute
        | Op::MemcpyPeer
        | Op::StreamCaptureInfo
        | Op::GraphNodeSetParams
        | Op::GraphExecNodeSetParams
        | Op::GraphGetNodes
        | Op::GraphGetEdges
        | Op::GraphNodeQuery
        | Op::GraphUpload
        | Op::GraphDebugDot
        | Op::GraphNodeEnabled
        | Op::GraphExecChildGraph
        | Op::GraphExecSetEvent
        | Op::StreamCaptureInvalidate
        | Op::GraphQuery
        | Op::GraphKernelNodeGetParams
        | Op::GraphNodeGetParams
        | Op::GraphMem => true,
    }
}

/// Whether qcuda.ko can take `call` fire-and-forget: no `Out` buffers (it refuses those), and
/// every `In` buffer small enough to be copied into its bounce memory, so the caller may reuse
/// or free its own buffer at once (a larger one would stay pinned until the device is done).
pub fn may_fire_and_forget(call: &Call<'_>) -> bool {
    let raw = call.raw();
    raw.bufs[..raw.nbufs as usize]
        .iter()
        .all(|b| b.dir == Direction::In as u32 && b.len <= BOUNCE_THRESHOLD)
}

/// Ops that wait for earlier work and so report the failures of earlier fire-and-forget ops.
pub fn is_synchronizing(op: Op) -> bool {
    matches!(
        op,
        Op::DeviceSynchronize | Op::StreamSynchronize | Op::EventSynchronize
    )
}

/// Ops whose caller waits for the device's earlier work to finish: the synchronisations and a
/// blocking copy of host-mapped memory. They wait as CUDA's scheduling flags say
/// ([`crate::core::devices::schedule`]); other calls poll briefly and then sleep. Pageable copies are left out:
/// their chunks' threads pin and describe the next chunks meanwhile and need the vCPUs.
fn waits_for_device(op: Op) -> bool {
    is_synchronizing(op) || op == Op::MemcpyMapped
}

/// The sticky (context-corrupting) errors: qcuda-proto's `cuda_errors::STICKY`, the list
/// vhost-cuda uses too.
pub fn is_sticky(e: CudaError) -> bool {
    qcuda_proto::cuda_errors::is_sticky(e.code())
}

extern "C" {
    /// glibc's `stdout` stream.
    static mut stdout: *mut libc::FILE;
}

/// Writes `bytes` through the program's C `stdout` stream (so they interleave with its own
/// `printf` output as natively) and flushes it.
fn write_c_stdout(bytes: &[u8]) {
    // SAFETY: `stdout` is glibc's initialised stream for the life of the process; fwrite and
    // fflush lock it themselves, and `bytes` is valid for its length.
    unsafe {
        let out = stdout;
        libc::fwrite(bytes.as_ptr().cast(), 1, bytes.len(), out);
        libc::fflush(out);
    }
}

/// The CUDA error that failing to open `/dev/qcuda` stands for.
///
/// | errno | meaning | cudaError_t |
/// |---|---|---|
/// | ENOENT, ENODEV, ENXIO | no qcuda device in this guest | cudaErrorNoDevice |
/// | EACCES, EPERM | /dev/qcuda exists but is not accessible | cudaErrorNoDevice |
/// | anything else | | cudaErrorUnknown |
pub fn open_errno_to_error(errno: i32) -> CudaError {
    match errno {
        libc::ENOENT | libc::ENODEV | libc::ENXIO | libc::EACCES | libc::EPERM => {
            CudaError::NO_DEVICE
        }
        _ => CudaError::UNKNOWN,
    }
}

/// The CUDA error a failed `IOCTL_CALL` stands for.
///
/// | errno | meaning | cudaError_t |
/// |---|---|---|
/// | ENOTTY | the module does not speak this ioctl ABI | cudaErrorInsufficientDriver |
/// | EFAULT, EINVAL, E2BIG | a buffer or size the module refused | cudaErrorInvalidValue |
/// | ENOMEM | the guest kernel is out of memory | cudaErrorMemoryAllocation |
/// | ENODEV, EIO | the device went away mid-session | cudaErrorDevicesUnavailable |
/// | EINTR, EINPROGRESS | a signal interrupted an op that is not repeated, before or after qcuda.ko queued it (signals were blocked, so only a kernel-side freeze gets here) | cudaErrorUnknown |
/// | anything else | | cudaErrorUnknown |
pub fn call_errno_to_error(errno: i32) -> CudaError {
    match errno {
        libc::ENOTTY => CudaError::INSUFFICIENT_DRIVER,
        libc::EFAULT | libc::EINVAL | libc::E2BIG => CudaError::INVALID_VALUE,
        libc::ENOMEM => CudaError::MEMORY_ALLOCATION,
        libc::ENODEV | libc::EIO => CudaError::DEVICES_UNAVAILABLE,
        _ => CudaError::UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_corrupting_errors_are_sticky() {
        assert!(is_sticky(CudaError::ILLEGAL_ADDRESS));
        assert!(is_sticky(CudaError::LAUNCH_FAILURE));
        assert!(!is_sticky(CudaError::INVALID_VALUE));
    }
}

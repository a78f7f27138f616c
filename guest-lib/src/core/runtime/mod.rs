//! The top layer of the core: the process's [`Runtime`] (this file), which owns the tables of
//! every concept, and the operations both faces offer on it, by concept (`devices`, `context`,
//! `streams`, `events`, `memory`, `pools`, `vmm`, `ipc`, `managed`, `arrays`, `objects`,
//! `copy3d`, `launch`, `symbols`, `pointer_attrs`, `attributes`, `user_objects`, `graphs`,
//! `process_checkpoint`). An operation finds the runtime (or is given it) and hands each table
//! what it needs; nothing below this layer reaches the runtime.
//!
//! [`Runtime`] exists once the session is up: `/dev/qcuda` opened, handshake done, devices
//! counted. It is created by the first API call that needs the device, never by registration,
//! so programs that never touch the GPU (or run without /dev/qcuda) need no device at all. A
//! failed start (no /dev/qcuda: `cudaErrorNoDevice`) is remembered for the life of the process,
//! as NVIDIA's runtime does.
//!
//! Kernel and variable registrations live in the [`Registry`], which exists from the first
//! static constructor on and needs no device.
//!
//! Unit tests swap both for per-thread instances driven by the in-process test double, so the
//! exported functions themselves run against it.

use std::path::Path;

use qcuda_proto::{ioctl::DEVICE_PATH, Op, WaitMode};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::devices::{context::created_current_flags, schedule, Devices},
    core::last_error,
    core::memory::device::Allocations,
    core::memory::host::HostAllocations,
    core::memory::pools::Pools,
    core::modules::{managed_vars::ManagedVars, registry::Registry},
    core::streams::events::Events,
    core::streams::host_fns::HostFns,
    core::streams::Streams,
    core::transport::session::{open_errno_to_error, Session},
    core::transport::{Call, DeviceFile, Transport},
    core::warnings::warn_once,
};

pub mod arrays;
pub mod attributes;
pub mod context;
pub mod copy3d;
pub mod devices;
pub mod events;
pub mod graphs;
pub mod ipc;
pub mod launch;
pub mod managed;
pub mod memory;
pub mod objects;
pub mod pointer_attrs;
pub mod pools;
pub mod process_checkpoint;
pub mod streams;
pub mod symbols;
pub mod user_objects;
pub mod vmm;

/// Everything the runtime knows once connected.
#[derive(Debug)]
pub struct Runtime {
    /// The connection to the host.
    pub session: Session,
    /// Device count, current device, cached device records.
    pub devices: Devices,
    /// Live `cudaMalloc` allocations.
    pub allocations: Allocations,
    /// Live host-mapped memory: `cudaHostAlloc`, `cudaHostRegister`, `cudaMallocManaged`.
    pub host_memory: HostAllocations,
    /// Live streams.
    pub streams: Streams,
    /// Live events.
    pub events: Events,
    /// Host functions and the thread that runs them.
    pub host_fns: HostFns,
    /// Texture and surface objects, with what they were made from.
    pub objects: crate::core::arrays::Objects,
    /// Memory pools the application has named.
    pub pools: Pools,
    /// Physical allocations and mappings (cuMemCreate, cuMemMap).
    pub vmm: crate::core::memory::vmm::Vmm,
}

impl Runtime {
    /// Connects over `transport`: handshake, then the device count. A host without usable GPUs
    /// still gives a runtime (with no devices), so that e.g. `cudaDriverGetVersion` answers.
    pub fn connect(transport: Box<dyn Transport>, launch_blocking: bool) -> CudaResult<Self> {
        let mut session = Session::connect(transport, launch_blocking)?;
        session.set_wait_mode(wait_mode);
        let devices = match session.submit(Call::new(Op::DeviceCount, 0)) {
            Ok(reply) => Devices::new(
                u32::try_from(reply.rets[0]).unwrap_or(u32::MAX),
                CudaError::NO_DEVICE,
            ),
            Err(e) => Devices::new(0, e),
        };
        Ok(Self {
            session,
            devices,
            allocations: Allocations::default(),
            host_memory: HostAllocations::default(),
            streams: Streams::default(),
            events: Events::default(),
            host_fns: HostFns::default(),
            objects: crate::core::arrays::Objects::default(),
            pools: Pools::default(),
            vmm: crate::core::memory::vmm::Vmm::default(),
        })
    }

    /// Opens `/dev/qcuda` and connects.
    pub fn open_device() -> CudaResult<Self> {
        let file = DeviceFile::open(Path::new(DEVICE_PATH)).map_err(|e| {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            // A missing device node is the normal "no GPU here" case; anything else deserves a
            // word, since the application will only see cudaErrorNoDevice.
            if errno != libc::ENOENT {
                warn_once!("cannot open {DEVICE_PATH}: {e}");
            }
            open_errno_to_error(errno)
        })?;
        let blocking = std::env::var("CUDA_LAUNCH_BLOCKING").is_ok_and(|v| v == "1");
        let rt = Self::connect(Box::new(file), blocking)?;
        // SAFETY: registering a plain extern "C" function; it runs once, at exit.
        unsafe { libc::atexit(flush_device_output_at_exit) };
        Ok(rt)
    }

    /// `cudaDeviceReset` for `device`: the host frees everything the session owns there, then
    /// the guest forgets its records of it (allocations, streams, events, loaded modules,
    /// resolved kernels and symbols, the sticky error).
    pub fn reset_device(&self, registry: &Registry, device: u32) -> CudaResult<()> {
        self.session.submit(Call::new(Op::DeviceReset, device))?;
        self.devices.deactivate_primary(device);
        self.allocations.forget_device(device);
        managed_vars().forget_device(device);
        crate::core::memory::ipc::forget_device(device);
        self.host_memory.forget_device(&self.session, device);
        self.streams.forget_device(device);
        self.session.captures.forget_device(device);
        self.events.forget_device(device);
        self.objects.forget_device(device);
        self.pools.forget_device(device);
        registry.forget_device(device);
        self.session.clear_sticky(device);
        // The calling thread starts over too; other threads keep what they last saw.
        last_error::take();
        Ok(())
    }
}

/// How the calling thread waits for `device`: the flags of its current context if the driver
/// face made one of its own current for that device, else the device's (its primary context's,
/// which `cudaSetDeviceFlags` sets).
fn wait_mode(device: u32) -> WaitMode {
    let flags = created_current_flags(device)
        .or_else(|| runtime_if_connected().map(|rt| rt.devices.flags(device)))
        .unwrap_or(0);
    schedule::mode_of(flags)
}

/// Registered with `atexit`: brings back what kernels printed since the last synchronisation.
extern "C" fn flush_device_output_at_exit() {
    if let Some(rt) = runtime_if_connected() {
        rt.session.flush_at_exit(rt.devices.count());
    }
}

/// The runtime and the calling thread's current device, checked: the common preamble of every
/// call that works on "the current device". As with NVIDIA's runtime (CUDA 12 and later), such
/// a call initialises the device's primary context, which the driver API then sees current.
pub fn current() -> CudaResult<(&'static Runtime, u32)> {
    let rt = runtime()?;
    let device = rt.devices.current()?;
    rt.devices.activate_primary(device);
    Ok((rt, device))
}

/// Fails with `CudaError::INVALID_VALUE` when `ptr` is null.
pub fn non_null<T>(ptr: *const T) -> CudaResult<()> {
    if ptr.is_null() {
        Err(CudaError::INVALID_VALUE)
    } else {
        Ok(())
    }
}

pub use global::*;

#[cfg(not(test))]
mod global {
    use std::sync::{LazyLock, OnceLock};

    use super::*;

    static RUNTIME: OnceLock<CudaResult<Runtime>> = OnceLock::new();
    static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::default);
    static MANAGED_VARS: LazyLock<ManagedVars> = LazyLock::new(ManagedVars::default);

    /// The runtime, connecting on first use.
    pub fn runtime() -> CudaResult<&'static Runtime> {
        RUNTIME
            .get_or_init(Runtime::open_device)
            .as_ref()
            .map_err(|e| *e)
    }

    /// The runtime if a previous call already connected; never connects.
    pub fn runtime_if_connected() -> Option<&'static Runtime> {
        RUNTIME.get()?.as_ref().ok()
    }

    /// The kernel/variable registry.
    pub fn registry() -> &'static Registry {
        &REGISTRY
    }

    /// The `__managed__` variables (registered beside the registry's records).
    pub fn managed_vars() -> &'static ManagedVars {
        &MANAGED_VARS
    }
}

#[cfg(test)]
mod global {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        static RUNTIME: Cell<Option<&'static Runtime>> = const { Cell::new(None) };
        static REGISTRY: Cell<Option<&'static Registry>> = const { Cell::new(None) };
        static MANAGED_VARS: Cell<Option<&'static ManagedVars>> = const { Cell::new(None) };
    }

    /// The test runtime of this thread; `cudaErrorNoDevice` until a test installs one.
    pub fn runtime() -> CudaResult<&'static Runtime> {
        RUNTIME.get().ok_or(CudaError::NO_DEVICE)
    }

    /// The test runtime of this thread, if installed.
    pub fn runtime_if_connected() -> Option<&'static Runtime> {
        RUNTIME.get()
    }

    /// The test registry of this thread (a fresh one per thread).
    pub fn registry() -> &'static Registry {
        REGISTRY.get().unwrap_or_else(|| {
            let r: &'static Registry = Box::leak(Box::default());
            REGISTRY.set(Some(r));
            r
        })
    }

    /// The test `__managed__` variables of this thread (fresh per thread, as the registry).
    pub fn managed_vars() -> &'static ManagedVars {
        MANAGED_VARS.get().unwrap_or_else(|| {
            let m: &'static ManagedVars = Box::leak(Box::default());
            MANAGED_VARS.set(Some(m));
            m
        })
    }

    /// Makes `rt` this thread's runtime (leaked: tests are short-lived).
    pub fn install(rt: Runtime) -> &'static Runtime {
        let rt: &'static Runtime = Box::leak(Box::new(rt));
        RUNTIME.set(Some(rt));
        rt
    }
}

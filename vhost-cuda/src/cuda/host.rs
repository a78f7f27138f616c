//! The host's CUDA driver and GPUs, found once at daemon start and shared by all sessions.

use std::{
    fmt,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex, OnceLock,
    },
};

use qcuda_proto::{status, GpuInfo};
use thiserror::Error;
use tracing::{debug, error, warn};

use crate::limits::QuotaSlot;

use super::{
    device_arena::AddressSpace,
    driver::{Context, CudaDriver, DriverApi, DriverLoad, NoDriver},
    launch::LaunchLimits,
};

/// Errors of choosing GPUs.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HostError {
    /// `--gpu N` names a GPU the host does not have.
    #[error("GPU {requested} requested, but the host has {available} CUDA device(s)")]
    NoSuchGpu {
        /// The ordinal asked for.
        requested: u32,
        /// How many the driver reports.
        available: u32,
    },
}

/// One GPU a guest may use.
#[derive(Debug, Clone)]
pub(crate) struct HostGpu {
    /// The driver's `CUdevice`.
    pub(crate) dev: i32,
    /// The host ordinal (what `--gpu` names).
    pub(crate) host_ordinal: u32,
    /// What DeviceInfo and HostInfo report.
    pub(crate) info: GpuInfo,
    /// What launches are checked against.
    pub(crate) limits: LaunchLimits,
}

/// Most bytes of module images a session may have loaded at once (`Tuning::max_module_bytes`):
/// the driver keeps what it loads in the worker's memory, so this bounds the host memory one
/// guest process makes it hold for modules (docs/SECURITY.md).
pub(crate) const MAX_MODULE_BYTES: u64 = 4 << 30;
/// Most bytes of guest RAM a session keeps registered with the driver for DMA (docs/SECURITY.md).
pub(crate) const MAX_REGISTERED_RAM: usize = 1 << 30;

/// Knobs of the executor; tests shrink them to reach every code path with small buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    /// Bytes of each of the two pinned staging halves per session and device.
    pub(crate) staging_half: usize,
    /// Guest runs at least this long are copied straight from or to guest memory; shorter
    /// runs are gathered into (or scattered from) the staging buffer.
    pub(crate) direct_min: usize,
    /// Most bytes of module images one session may have loaded at once.
    pub(crate) max_module_bytes: u64,
    /// Most bytes of guest RAM one session registers with the driver so that long runs of
    /// pageable copies are DMA (ram_registry.rs); 0: none.
    pub(crate) max_registered_ram: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            staging_half: 2 << 20,
            direct_min: 256 << 10,
            max_module_bytes: MAX_MODULE_BYTES,
            max_registered_ram: MAX_REGISTERED_RAM,
        }
    }
}

/// The process-wide CUDA state: the driver (if any) and the GPUs guests may use.
///
/// Guests see the selected GPUs as ordinals 0..[`CudaHost::gpu_count`], in host order.
pub struct CudaHost {
    pub(crate) driver: Arc<dyn DriverApi>,
    version: u32,
    /// What CUDA ops answer when there is no GPU to use (cudaErrorNoDevice,
    /// cudaErrorInsufficientDriver, ...).
    unavailable: u32,
    pub(crate) gpus: Vec<HostGpu>,
    pub(crate) tuning: Tuning,
    /// The first sticky error any session hit (0: none). It corrupts the driver state of the
    /// whole process, so it is the host's, not a session's (in a worker process the two are
    /// the same).
    sticky: AtomicU32,
    /// The VM's `--max-gpu-memory` quota (a worker's slot of it), if the daemon set one.
    memory_quota: OnceLock<Arc<QuotaSlot>>,
    /// Where sessions reserve their device address ranges (`device_arena.rs`).
    address_space: OnceLock<AddressSpace>,
    /// The NVIDIA driver's version text, read at start (`DriverRelease`).
    pub(crate) release: Option<String>,
    /// How the GPU timeline recorder times GPU work (`--gpu-trace`; `cuda/trace/`).
    trace_mode: OnceLock<super::trace::GpuTraceMode>,
    /// Contexts made before any session needed them (a spare worker's warm-up,
    /// [`CudaHost::warm_context`]), by the driver's device: a session's first use of that GPU
    /// takes one instead of waiting for the driver to make it.
    warm: Mutex<Vec<(i32, Context)>>,
}

impl fmt::Debug for CudaHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaHost")
            .field("driver_version", &self.version)
            .field("gpus", &self.gpus.len())
            .field("unavailable", &self.unavailable)
            .field("sticky_error", &self.sticky_error())
            .finish()
    }
}

const ATTR_MAX_THREADS_PER_BLOCK: i32 = 1;
const ATTR_MAX_BLOCK_DIM: [i32; 3] = [2, 3, 4];
const ATTR_MAX_GRID_DIM: [i32; 3] = [5, 6, 7];
const ATTR_MULTIPROCESSOR_COUNT: i32 = 16;
const ATTR_PCI_BUS_ID: i32 = 33;
const ATTR_PCI_DEVICE_ID: i32 = 34;
const ATTR_PCI_DOMAIN_ID: i32 = 50;
const ATTR_CC_MAJOR: i32 = 75;
const ATTR_CC_MINOR: i32 = 76;

/// Reads what the executor needs to know about GPU `ordinal`.
fn describe(driver: &dyn DriverApi, ordinal: u32) -> Result<HostGpu, super::driver::CuError> {
    let dev = driver.device_get(i32::try_from(ordinal).unwrap_or(i32::MAX))?;
    let attr = |a| driver.device_attribute(dev, a);
    let unsigned = |a| attr(a).map(|v| u32::try_from(v).unwrap_or(0));
    let mut info = GpuInfo::default();
    info.set_name(&driver.device_name(dev)?);
    info.uuid = driver.device_uuid(dev)?;
    info.total_mem = driver.device_total_mem(dev)?;
    info.cc_major = attr(ATTR_CC_MAJOR)?;
    info.cc_minor = attr(ATTR_CC_MINOR)?;
    info.multiprocessors = attr(ATTR_MULTIPROCESSOR_COUNT)?;
    info.pci_bus = attr(ATTR_PCI_BUS_ID)?;
    info.pci_device = attr(ATTR_PCI_DEVICE_ID)?;
    info.pci_domain = attr(ATTR_PCI_DOMAIN_ID)?;
    info.pcie_link = driver.pcie_link(info.pci_domain, info.pci_bus, info.pci_device);
    let limits = LaunchLimits {
        max_threads_per_block: unsigned(ATTR_MAX_THREADS_PER_BLOCK)?,
        max_block: [
            unsigned(ATTR_MAX_BLOCK_DIM[0])?,
            unsigned(ATTR_MAX_BLOCK_DIM[1])?,
            unsigned(ATTR_MAX_BLOCK_DIM[2])?,
        ],
        max_grid: [
            unsigned(ATTR_MAX_GRID_DIM[0])?,
            unsigned(ATTR_MAX_GRID_DIM[1])?,
            unsigned(ATTR_MAX_GRID_DIM[2])?,
        ],
    };
    Ok(HostGpu {
        dev,
        host_ordinal: ordinal,
        info,
        limits,
    })
}

impl CudaHost {
    /// Loads the CUDA driver if the host has one, initialises it and lists its GPUs. Never
    /// panics: a host without libcuda (or with one too old to use) gets a `CudaHost` with no
    /// GPUs, whose sessions answer cudaErrorNoDevice (or cudaErrorInsufficientDriver).
    pub fn probe() -> Arc<CudaHost> {
        Arc::new(Self::from_load(load_driver(), None).unwrap_or_else(|_| Self::without_driver()))
    }

    /// Like [`CudaHost::probe`], but guests see only host GPU `gpu` (as their device 0) when
    /// `gpu` is `Some` (the daemon's `--gpu`). Fails if the driver works and has no such GPU;
    /// a host without a usable driver still gets a GPU-less `CudaHost`, so a daemon started
    /// with `--gpu` on such a host answers "no device" rather than refusing to start.
    pub fn with_gpu_filter(gpu: Option<u32>) -> Result<Arc<CudaHost>, HostError> {
        #[cfg(feature = "test-double-driver")]
        if let Some(host) = test_double::host(gpu) {
            return host.map(Arc::new);
        }
        Self::from_load(load_driver(), gpu).map(Arc::new)
    }

    /// Number of GPUs guests may use (0 without a usable driver).
    pub fn gpu_count(&self) -> u32 {
        u32::try_from(self.gpus.len()).unwrap_or(u32::MAX)
    }

    /// cuDriverGetVersion (13000 for CUDA 13.0); 0 if the host has no CUDA driver.
    pub fn driver_version(&self) -> u32 {
        self.version
    }

    /// What the host reports about guest device `ordinal`.
    pub fn gpu_info(&self, ordinal: u32) -> Option<&GpuInfo> {
        self.gpus.get(ordinal as usize).map(|g| &g.info)
    }

    /// Makes every device allocation and launch of this process's sessions count in `quota`
    /// (the VM's accounting, and its `--max-gpu-memory`); set once, before the first session
    /// opens a context.
    pub fn set_memory_quota(&self, quota: QuotaSlot) {
        let _ = self.memory_quota.set(Arc::new(quota));
    }

    /// A spare worker's warm-up: makes a context on guest device `ordinal` now, for the
    /// session that comes later ([`CudaHost::take_warm_context`]). The driver's own cost of a
    /// process's first context (about 0.1 s on an H200) is then paid before the session waits
    /// for it. Without that GPU (or a driver) there is nothing to warm.
    pub(crate) fn warm_context(&self, ordinal: usize) -> Result<(), super::driver::CuError> {
        let Some(gpu) = self.gpus.get(ordinal) else {
            return Ok(());
        };
        let ctx = self.driver.ctx_create(gpu.dev)?;
        self.warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((gpu.dev, ctx));
        Ok(())
    }

    /// The context [`CudaHost::warm_context`] made on the driver's device `dev`, once.
    pub(crate) fn take_warm_context(&self, dev: i32) -> Option<Context> {
        let mut warm = self.warm.lock().unwrap_or_else(|p| p.into_inner());
        let at = warm.iter().position(|(d, _)| *d == dev)?;
        Some(warm.swap_remove(at).1)
    }

    /// How this process's recordings time GPU work (`--gpu-trace`); set once, at the
    /// worker's start. Unset: [`GpuTraceMode::Auto`](super::trace::GpuTraceMode::Auto).
    pub fn set_trace_mode(&self, mode: super::trace::GpuTraceMode) {
        let _ = self.trace_mode.set(mode);
    }

    /// See [`CudaHost::set_trace_mode`].
    pub(crate) fn trace_mode(&self) -> super::trace::GpuTraceMode {
        self.trace_mode.get().copied().unwrap_or_default()
    }

    /// Where this process's sessions reserve their device address ranges
    /// (`--gpu-va-base`, `--gpu-va-size`); set once, before the first session opens a context.
    /// Unset: [`AddressSpace::default`].
    pub fn set_address_space(&self, space: AddressSpace) {
        let _ = self.address_space.set(space);
    }

    /// Where sessions reserve their device address ranges.
    pub(crate) fn address_space(&self) -> AddressSpace {
        self.address_space.get().copied().unwrap_or_default()
    }

    /// The quota allocations count against, if any.
    pub(crate) fn memory_quota(&self) -> Option<Arc<QuotaSlot>> {
        self.memory_quota.get().cloned()
    }

    /// Counts a kernel launch the driver accepted in the VM's accounting (the quota's slot).
    pub(crate) fn count_kernel(&self) {
        if let Some(q) = self.memory_quota.get() {
            q.count_kernel();
        }
    }

    /// Counts a graph launch the driver accepted in the VM's accounting.
    pub(crate) fn count_graph_launch(&self) {
        if let Some(q) = self.memory_quota.get() {
            q.count_graph_launch();
        }
    }

    /// The sticky error (a `cudaError_t` such as cudaErrorIllegalAddress) that has corrupted
    /// this process's CUDA driver state, if any.
    ///
    /// CUDA documents these errors as leaving the process in an inconsistent state until it is
    /// relaunched, and a real driver (580) indeed fails every context of the process, old and
    /// new, once one kernel faulted. From then on every session of this host answers it; only a
    /// new process clears it. The daemon runs each session in a worker process of its own, so
    /// this is one session's error, and its DeviceReset starts a new worker.
    pub fn sticky_error(&self) -> Option<u32> {
        match self.sticky.load(Ordering::Acquire) {
            0 => None,
            s => Some(s),
        }
    }

    /// Records the first sticky error.
    pub(crate) fn set_sticky_error(&self, status: u32) {
        let first = self
            .sticky
            .compare_exchange(0, status, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            error!(
                status,
                "a sticky CUDA error corrupted the driver state of this process: every CUDA \
                 op now fails with it until the process ends (DeviceReset or close)"
            );
        }
    }

    /// The status CUDA ops answer when there is no GPU to use; `None` if there is one.
    pub(crate) fn unavailable(&self) -> Option<u32> {
        self.gpus.is_empty().then_some(self.unavailable)
    }

    /// A host without any CUDA driver.
    pub(crate) fn without_driver() -> Self {
        Self {
            driver: Arc::new(NoDriver),
            version: 0,
            unavailable: status::NO_DEVICE,
            gpus: Vec::new(),
            tuning: Tuning::default(),
            sticky: AtomicU32::new(0),
            memory_quota: OnceLock::new(),
            address_space: OnceLock::new(),
            release: None,
            trace_mode: OnceLock::new(),
            warm: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn from_load(load: DriverLoad, gpu: Option<u32>) -> Result<Self, HostError> {
        match load {
            DriverLoad::Absent => {
                debug!("no CUDA driver on this host: guests will see no GPU");
                Ok(Self::without_driver())
            }
            DriverLoad::Unusable { version, status } => {
                warn!(
                    version,
                    status, "CUDA driver unusable: guests will see no GPU"
                );
                Ok(Self {
                    version,
                    unavailable: status,
                    ..Self::without_driver()
                })
            }
            DriverLoad::Ready { driver, version } => {
                Self::from_driver(Arc::new(driver), version, gpu, Tuning::default())
            }
        }
    }

    /// Lists the GPUs of a working driver, keeping only `gpu` if given.
    pub(crate) fn from_driver(
        driver: Arc<dyn DriverApi>,
        version: u32,
        gpu: Option<u32>,
        tuning: Tuning,
    ) -> Result<Self, HostError> {
        let count = match driver.device_count() {
            Ok(n) => u32::try_from(n).unwrap_or(0),
            Err(e) => {
                warn!(error = ?e, "cuDeviceGetCount failed");
                0
            }
        };
        if let Some(g) = gpu {
            if g >= count {
                return Err(HostError::NoSuchGpu {
                    requested: g,
                    available: count,
                });
            }
        }
        let mut gpus = Vec::new();
        for ordinal in 0..count {
            if gpu.is_some_and(|g| g != ordinal) {
                continue;
            }
            match describe(driver.as_ref(), ordinal) {
                Ok(g) => {
                    debug!(
                        ordinal,
                        name = %String::from_utf8_lossy(g.info.name_bytes()),
                        cc = %format!("{}.{}", g.info.cc_major, g.info.cc_minor),
                        memory = g.info.total_mem,
                        "GPU available to guests"
                    );
                    gpus.push(g);
                }
                Err(e) => warn!(ordinal, error = ?e, "skipping a GPU the driver cannot describe"),
            }
        }
        let release = driver.driver_release();
        Ok(Self {
            driver,
            version,
            unavailable: status::NO_DEVICE,
            gpus,
            tuning,
            sticky: AtomicU32::new(0),
            memory_quota: OnceLock::new(),
            address_space: OnceLock::new(),
            release,
            trace_mode: OnceLock::new(),
            warm: Mutex::new(Vec::new()),
        })
    }
}

/// The fake CUDA driver as this process's driver, for the pre-copy test without a GPU
/// (scripts/test.sh, scripts/test-migration.sh `--program precopy-fake`): only in a daemon
/// built with the feature `test-double-driver`, and only where `QCUDA_TEST_DOUBLE_DRIVER=1` is
/// set (the daemon's workers inherit it). Its one device keeps its memory in host memory and
/// reports the fake's size for it, to the guest and to the pre-copy's stores alike.
#[cfg(feature = "test-double-driver")]
mod test_double {
    use std::sync::Arc;

    use tracing::warn;

    use super::{CudaHost, HostError, Tuning};
    use crate::cuda::driver::fake::FakeDriver;

    /// The environment variable that chooses the test double.
    const VAR: &str = "QCUDA_TEST_DOUBLE_DRIVER";
    /// What `cuDriverGetVersion` would say (CUDA 13.0).
    const VERSION: u32 = 13000;

    /// A host over the test double, if the environment asks for it.
    pub(super) fn host(gpu: Option<u32>) -> Option<Result<CudaHost, HostError>> {
        if std::env::var_os(VAR).is_none_or(|v| v != "1") {
            return None;
        }
        warn!(
            "{VAR}=1: the fake CUDA driver (a test double) serves this process, not libcuda; \
             device memory lives in host memory and the guest's kernels do not run"
        );
        let driver = Arc::new(FakeDriver::new(1).without_activity());
        Some(CudaHost::from_driver(
            driver,
            VERSION,
            gpu,
            Tuning::default(),
        ))
    }
}

/// Loads the driver, turning a panic in the loader (which the checks in `CudaDriver::load`
/// should make impossible) into "no driver".
fn load_driver() -> DriverLoad {
    std::panic::catch_unwind(CudaDriver::load).unwrap_or_else(|_| {
        warn!("loading the CUDA driver panicked; continuing without a driver");
        DriverLoad::Absent
    })
}

//! The NVML face: `libnvidia-ml.so.1` in the guest.
//!
//! NVIDIA's NVML talks to the kernel driver directly, which a guest does not have, so libraries
//! that need it fail there: NCCL stops at `nvmlInit_v2() failed: Driver Not Loaded`, and
//! PyTorch warns and counts devices without it. This face answers what such programs ask of
//! NVML from the same session as the CUDA faces (link.sh links it into libcuda.so.1 under
//! `qcuda_nvml_*` and makes `libnvidia-ml.so.1` a forwarder): the devices this VM may use, their
//! names, UUIDs, PCI locations, compute capabilities and peer-to-peer status, and the CUDA
//! driver version. Device handles are the GPUs in CUDA's order.
//!
//! What a VM cannot see (NVLink state, fabric and platform information, field values, clocks,
//! power, the host's processes) answers `NVML_ERROR_NOT_SUPPORTED` and says so once per
//! function; symbols of NVIDIA's NVML that programs look up but this face does not list are
//! absent, which NVML's users treat as an older library.

use core::ffi::{c_char, c_int, c_uint};
use std::sync::{
    atomic::{AtomicBool, AtomicU32, Ordering},
    OnceLock,
};

use qcuda_proto::{GpuInfo, Op};

use crate::{core::runtime::runtime, core::transport::Call};

type NvmlReturn = c_uint;

const SUCCESS: NvmlReturn = 0;
const UNINITIALIZED: NvmlReturn = 1;
const INVALID_ARGUMENT: NvmlReturn = 2;
const NOT_SUPPORTED: NvmlReturn = 3;
const NOT_FOUND: NvmlReturn = 6;
const INSUFFICIENT_SIZE: NvmlReturn = 7;
const DRIVER_NOT_LOADED: NvmlReturn = 9;
const UNKNOWN: NvmlReturn = 999;

/// `nvmlGpuP2PStatus_t`: OK, and "not supported".
const P2P_STATUS_OK: c_uint = 0;
const P2P_STATUS_NOT_SUPPORTED: c_uint = 5;
/// `nvmlGpuP2PCapsIndex_t`: read, write, NVLink, atomics, PCI (deprecated), prop.
const P2P_CAPS_READ: c_uint = 0;
const P2P_CAPS_WRITE: c_uint = 1;
const P2P_CAPS_NVLINK: c_uint = 2;
const P2P_CAPS_LAST: c_uint = 6;

/// One GPU this VM may use, as a `nvmlDevice_t` points to it.
#[derive(Debug)]
pub struct Device {
    index: u32,
    info: GpuInfo,
}

/// The devices, read once at the first successful `nvmlInit`.
static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
/// `nvmlInit` calls not yet matched by `nvmlShutdown`.
static INITS: AtomicU32 = AtomicU32::new(0);

fn devices() -> Result<&'static [Device], NvmlReturn> {
    if INITS.load(Ordering::Acquire) == 0 {
        return Err(UNINITIALIZED);
    }
    DEVICES.get().map(Vec::as_slice).ok_or(UNINITIALIZED)
}

fn init() -> NvmlReturn {
    let Ok(rt) = runtime() else {
        return DRIVER_NOT_LOADED;
    };
    if DEVICES.get().is_none() {
        let count = rt.devices.count();
        let mut list = Vec::new();
        for index in 0..count {
            match rt.devices.info(&rt.session, index) {
                Ok(info) => list.push(Device { index, info }),
                Err(_) => return UNKNOWN,
            }
        }
        let _ = DEVICES.set(list);
    }
    INITS.fetch_add(1, Ordering::AcqRel);
    SUCCESS
}

/// The device behind a handle, if it is one of ours.
fn device<'a>(handle: *const Device) -> Result<&'a Device, NvmlReturn> {
    devices()?
        .iter()
        .find(|d| std::ptr::eq(*d, handle))
        .ok_or(INVALID_ARGUMENT)
}

/// Writes `text` and its NUL into a caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` must be null or writable for `len` bytes.
unsafe fn put_string(buf: *mut c_char, len: c_uint, text: &str) -> NvmlReturn {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    if text.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: `buf` holds `len` bytes (caller's contract), and the text and NUL fit.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, text.len());
        buf.add(text.len()).write(0);
    }
    SUCCESS
}

/// Writes one value through a caller's pointer.
///
/// # Safety
/// `ptr` must be null or writable.
unsafe fn put<T>(ptr: *mut T, value: T) -> NvmlReturn {
    if ptr.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and writable (caller's contract).
    unsafe { ptr.write_unaligned(value) };
    SUCCESS
}

fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

fn name_of(info: &GpuInfo) -> String {
    let end = info
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(info.name.len());
    String::from_utf8_lossy(&info.name[..end]).into_owned()
}

/// Parses "[domain:]bus:device[.function]" in hex, as NVML accepts a PCI bus id.
fn parse_bus_id(s: &str) -> Option<(i32, i32, i32)> {
    let s = s.split('.').next()?;
    let parts: Vec<&str> = s.split(':').collect();
    let hex = |p: &str| i32::from_str_radix(p, 16).ok();
    match parts.as_slice() {
        [d, b, dev] => Some((hex(d)?, hex(b)?, hex(dev)?)),
        [b, dev] => Some((0, hex(b)?, hex(dev)?)),
        _ => None,
    }
}

/// `nvmlPciInfo_t` of NVML 11 and later (`nvmlDeviceGetPciInfo_v2`/`_v3`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    bus_id: [c_char; 32],
}

/// The first `nvmlPciInfo_t` (`nvmlDeviceGetPciInfo`, the unversioned symbol).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfoV1 {
    bus_id: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    reserved: [c_uint; 4],
}

fn c_text<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = c_char::from_ne_bytes([b]);
    }
    out
}

fn pci_of(info: &GpuInfo) -> (c_uint, c_uint, c_uint) {
    let u = |v: i32| c_uint::try_from(v).unwrap_or(0);
    (u(info.pci_domain), u(info.pci_bus), u(info.pci_device))
}

/// The once-per-function note of an NVML call the guest cannot answer.
fn unsupported(name: &str, once: &AtomicBool) -> NvmlReturn {
    crate::core::warnings::warn_first(
        once,
        format_args!("{name} is not supported in a qcuda guest"),
    );
    NOT_SUPPORTED
}

macro_rules! nvml_unsupported {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not visible from a VM.")]
        #[no_mangle]
        pub extern "C" fn $name($($arg: $ty),*) -> NvmlReturn {
            static ONCE: AtomicBool = AtomicBool::new(false);
            let _ = ($($arg,)*);
            unsupported(stringify!($name), &ONCE)
        }
    )*};
}

/// `nvmlInit_v2`.
#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    init()
}

/// `nvmlInit` (the first form).
#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    init()
}

/// `nvmlInitWithFlags`: the flags only concern devices NVML could not attach, which a VM
/// does not have.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> NvmlReturn {
    let _ = flags;
    init()
}

/// `nvmlShutdown`.
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    match INITS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)) {
        Ok(_) => SUCCESS,
        Err(_) => UNINITIALIZED,
    }
}

/// `nvmlErrorString`.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s: &'static core::ffi::CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// `nvmlSystemGetCudaDriverVersion_v2`: the host driver's CUDA version, as cuDriverGetVersion.
///
/// # Safety
/// `version` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    let Ok(rt) = runtime() else {
        return DRIVER_NOT_LOADED;
    };
    // SAFETY: caller's contract.
    unsafe { put(version, rt.session.host().driver_version) }
}

/// `nvmlSystemGetCudaDriverVersion`.
///
/// # Safety
/// `version` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

/// `nvmlDeviceGetCount_v2`.
///
/// # Safety
/// `count` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    match devices() {
        // SAFETY: caller's contract.
        Ok(d) => unsafe { put(count, c_uint::try_from(d.len()).unwrap_or(0)) },
        Err(e) => e,
    }
}

/// `nvmlDeviceGetCount`.
///
/// # Safety
/// `count` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// `device` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut *const Device,
) -> NvmlReturn {
    match devices() {
        Ok(d) => match d.get(index as usize) {
            // SAFETY: caller's contract.
            Some(dev) => unsafe { put(device, std::ptr::from_ref(dev)) },
            None => INVALID_ARGUMENT,
        },
        Err(e) => e,
    }
}

/// `nvmlDeviceGetHandleByIndex`.
///
/// # Safety
/// `device` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut *const Device,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// # Safety
/// `text` must be null or NUL-terminated.
unsafe fn text_arg<'a>(text: *const c_char) -> Result<&'a str, NvmlReturn> {
    if text.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: NUL-terminated (caller's contract).
    unsafe { core::ffi::CStr::from_ptr(text) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

/// `nvmlDeviceGetHandleByPciBusId_v2`.
///
/// # Safety
/// `bus_id` must be null or NUL-terminated, `device` null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut *const Device,
) -> NvmlReturn {
    let list = match devices() {
        Ok(l) => l,
        Err(e) => return e,
    };
    // SAFETY: caller's contract.
    let Ok(Some(wanted)) = unsafe { text_arg(bus_id) }.map(parse_bus_id) else {
        return INVALID_ARGUMENT;
    };
    match list
        .iter()
        .find(|d| (d.info.pci_domain, d.info.pci_bus, d.info.pci_device) == wanted)
    {
        // SAFETY: caller's contract.
        Some(dev) => unsafe { put(device, std::ptr::from_ref(dev)) },
        None => NOT_FOUND,
    }
}

/// `nvmlDeviceGetHandleByPciBusId`.
///
/// # Safety
/// As `nvmlDeviceGetHandleByPciBusId_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut *const Device,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

/// `nvmlDeviceGetHandleByUUID`.
///
/// # Safety
/// `uuid` must be null or NUL-terminated, `device` null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut *const Device,
) -> NvmlReturn {
    let list = match devices() {
        Ok(l) => l,
        Err(e) => return e,
    };
    // SAFETY: caller's contract.
    let wanted = match unsafe { text_arg(uuid) } {
        Ok(w) => w.to_ascii_lowercase(),
        Err(e) => return e,
    };
    match list.iter().find(|d| uuid_string(&d.info.uuid) == wanted) {
        // SAFETY: caller's contract.
        Some(dev) => unsafe { put(device, std::ptr::from_ref(dev)) },
        None => NOT_FOUND,
    }
}

/// `nvmlDeviceGetIndex`.
///
/// # Safety
/// `index` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: *const Device,
    index: *mut c_uint,
) -> NvmlReturn {
    match self::device(device) {
        // SAFETY: caller's contract.
        Ok(d) => unsafe { put(index, d.index) },
        Err(e) => e,
    }
}

/// `nvmlDeviceGetName`.
///
/// # Safety
/// `name` must be null or writable for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: *const Device,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    match self::device(device) {
        // SAFETY: caller's contract.
        Ok(d) => unsafe { put_string(name, length, &name_of(&d.info)) },
        Err(e) => e,
    }
}

/// `nvmlDeviceGetUUID`: "GPU-" and the UUID, as NVIDIA's NVML prints it.
///
/// # Safety
/// `uuid` must be null or writable for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: *const Device,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    match self::device(device) {
        // SAFETY: caller's contract.
        Ok(d) => unsafe { put_string(uuid, length, &uuid_string(&d.info.uuid)) },
        Err(e) => e,
    }
}

/// `nvmlDeviceGetPciInfo_v3` (and `_v2`, the same layout): the PCI location the guest's CUDA
/// reports; the PCI device and subsystem ids are not carried (0).
///
/// # Safety
/// `pci` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: *const Device,
    pci: *mut PciInfo,
) -> NvmlReturn {
    match self::device(device) {
        Ok(d) => {
            let (domain, bus, dev) = pci_of(&d.info);
            let info = PciInfo {
                bus_id_legacy: c_text(&format!("{domain:04X}:{bus:02X}:{dev:02X}.0")),
                domain,
                bus,
                device: dev,
                pci_device_id: 0,
                pci_subsystem_id: 0,
                bus_id: c_text(&format!("{domain:08X}:{bus:02X}:{dev:02X}.0")),
            };
            // SAFETY: caller's contract.
            unsafe { put(pci, info) }
        }
        Err(e) => e,
    }
}

/// `nvmlDeviceGetPciInfo_v2`.
///
/// # Safety
/// `pci` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: *const Device,
    pci: *mut PciInfo,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

/// `nvmlDeviceGetPciInfo`: the first layout, with the short bus id.
///
/// # Safety
/// `pci` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    device: *const Device,
    pci: *mut PciInfoV1,
) -> NvmlReturn {
    match self::device(device) {
        Ok(d) => {
            let (domain, bus, dev) = pci_of(&d.info);
            let info = PciInfoV1 {
                bus_id: c_text(&format!("{domain:04X}:{bus:02X}:{dev:02X}.0")),
                domain,
                bus,
                device: dev,
                pci_device_id: 0,
                pci_subsystem_id: 0,
                reserved: [0; 4],
            };
            // SAFETY: caller's contract.
            unsafe { put(pci, info) }
        }
        Err(e) => e,
    }
}

/// `nvmlDeviceGetCudaComputeCapability`.
///
/// # Safety
/// `major` and `minor` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: *const Device,
    major: *mut c_int,
    minor: *mut c_int,
) -> NvmlReturn {
    match self::device(device) {
        // SAFETY: caller's contract.
        Ok(d) => match unsafe { put(major, d.info.cc_major) } {
            // SAFETY: caller's contract.
            SUCCESS => unsafe { put(minor, d.info.cc_minor) },
            e => e,
        },
        Err(e) => e,
    }
}

/// `nvmlDeviceGetP2PStatus`: reads and writes between two GPUs as CUDA's peer access allows
/// them (a GPU reaches its own memory); NVLink and the other capabilities are not visible from
/// a VM and read as not supported.
///
/// # Safety
/// `status` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    device1: *const Device,
    device2: *const Device,
    index: c_uint,
    status: *mut c_uint,
) -> NvmlReturn {
    let (a, b) = match (self::device(device1), self::device(device2)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    if index > P2P_CAPS_LAST {
        return INVALID_ARGUMENT;
    }
    let value = if a.index == b.index {
        P2P_STATUS_OK
    } else if index == P2P_CAPS_READ || index == P2P_CAPS_WRITE {
        let Ok(rt) = runtime() else {
            return DRIVER_NOT_LOADED;
        };
        let reply = rt.session.submit(
            Call::new(Op::DeviceCanAccessPeer, a.index)
                .args(&[u64::from(a.index), u64::from(b.index)]),
        );
        match reply {
            Ok(r) if r.rets[0] != 0 => P2P_STATUS_OK,
            Ok(_) => P2P_STATUS_NOT_SUPPORTED,
            Err(_) => return UNKNOWN,
        }
    } else {
        let _ = P2P_CAPS_NVLINK;
        P2P_STATUS_NOT_SUPPORTED
    };
    // SAFETY: caller's contract.
    unsafe { put(status, value) }
}

/// The longest driver version text NVML gives (`NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`).
const DRIVER_VERSION_LEN: usize = 80;

/// `nvmlSystemGetDriverVersion`: the host's NVIDIA driver version (e.g. "580.95.05"), which
/// cuda-pathfinder's compatibility checks compare with the toolkit's minimum.
///
/// # Safety
/// `version` must be null or writable for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    if let Err(e) = devices() {
        return e;
    }
    let Ok(rt) = runtime() else {
        return DRIVER_NOT_LOADED;
    };
    let mut buf = [0u8; DRIVER_VERSION_LEN];
    match rt
        .session
        .submit(Call::new(Op::DriverRelease, 0).output(&mut buf))
    {
        Ok(r) => {
            let n = usize::try_from(r.rets[0]).unwrap_or(usize::MAX);
            let Some(text) = buf.get(..n).and_then(|b| std::str::from_utf8(b).ok()) else {
                return UNKNOWN;
            };
            // SAFETY: caller's contract.
            unsafe { put_string(version, length, text) }
        }
        Err(crate::core::cuda_error::CudaError::NOT_SUPPORTED) => {
            static ONCE: AtomicBool = AtomicBool::new(false);
            unsupported(
                "nvmlSystemGetDriverVersion (the host's driver did not say)",
                &ONCE,
            )
        }
        Err(_) => UNKNOWN,
    }
}

/// One field of the device's PCIe link as the host saw it (`GpuInfo::pcie_link`): 0 is unknown.
///
/// # Safety
/// `out` must be null or writable.
unsafe fn pcie(device: *const Device, field: usize, out: *mut c_uint) -> NvmlReturn {
    match self::device(device) {
        Ok(d) if d.info.pcie_link[field] != 0 => {
            // SAFETY: caller's contract.
            unsafe { put(out, c_uint::from(d.info.pcie_link[field])) }
        }
        Ok(_) => NOT_SUPPORTED,
        Err(e) => e,
    }
}

/// `nvmlDeviceGetCurrPcieLinkGeneration` (XLA's cost model reads the link).
///
/// # Safety
/// `gen` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: *const Device,
    gen: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { pcie(device, 0, gen) }
}

/// `nvmlDeviceGetCurrPcieLinkWidth`.
///
/// # Safety
/// `width` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: *const Device,
    width: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { pcie(device, 1, width) }
}

/// `nvmlDeviceGetMaxPcieLinkGeneration`.
///
/// # Safety
/// `gen` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: *const Device,
    gen: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { pcie(device, 2, gen) }
}

/// `nvmlDeviceGetMaxPcieLinkWidth`.
///
/// # Safety
/// `width` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: *const Device,
    width: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { pcie(device, 3, width) }
}

/// `nvmlFieldValue_t`: field id, scope id, timestamp, latency, value type, the field's own
/// status, the value (a union of 8 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: NvmlReturn,
    value: u64,
}

/// `nvmlDeviceGetFieldValues`: the call succeeds and each field carries its own status, as
/// NVML answers them. None of NVML's fields (NVLink counters and states, power, clocks,
/// fabric, ECC) is visible from a VM, so every field says `NVML_ERROR_NOT_SUPPORTED` (XLA asks
/// for the NVLink fields at start-up).
///
/// # Safety
/// `values` must be null or point to `count` writable field values.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: *const Device,
    count: c_int,
    values: *mut FieldValue,
) -> NvmlReturn {
    if let Err(e) = self::device(device) {
        return e;
    }
    let Ok(count) = usize::try_from(count) else {
        return INVALID_ARGUMENT;
    };
    if values.is_null() {
        return INVALID_ARGUMENT;
    }
    for i in 0..count {
        // SAFETY: the caller gives `count` writable field values; only the outputs are written.
        unsafe {
            let v = values.add(i);
            (*v).timestamp = 0;
            (*v).latency_usec = 0;
            (*v).nvml_return = NOT_SUPPORTED;
        }
    }
    SUCCESS
}

nvml_unsupported! {
    nvmlDeviceGetNvLinkState(device: *const Device, link: c_uint, active: *mut c_uint);
    nvmlDeviceGetNvLinkCapability(device: *const Device, link: c_uint, capability: c_uint, result: *mut c_uint);
    nvmlDeviceGetNvLinkRemotePciInfo(device: *const Device, link: c_uint, pci: *mut PciInfo);
    nvmlDeviceGetNvLinkRemotePciInfo_v2(device: *const Device, link: c_uint, pci: *mut PciInfo);
    nvmlDeviceGetNvLinkRemoteDeviceType(device: *const Device, link: c_uint, kind: *mut c_uint);
    nvmlDeviceGetGpuFabricInfoV(device: *const Device, info: *mut core::ffi::c_void);
    nvmlDeviceGetPlatformInfo(device: *const Device, info: *mut core::ffi::c_void);
    nvmlSystemGetConfComputeState(state: *mut core::ffi::c_void);
    nvmlSystemGetConfComputeSettings(settings: *mut core::ffi::c_void);
    nvmlDeviceGetMemoryInfo(device: *const Device, memory: *mut core::ffi::c_void);
    nvmlDeviceGetMemoryInfo_v2(device: *const Device, memory: *mut core::ffi::c_void);
    nvmlDeviceGetComputeRunningProcesses(device: *const Device, count: *mut c_uint, infos: *mut core::ffi::c_void);
    nvmlDeviceGetComputeRunningProcesses_v3(device: *const Device, count: *mut c_uint, infos: *mut core::ffi::c_void);
    nvmlDeviceGetUtilizationRates(device: *const Device, rates: *mut core::ffi::c_void);
    nvmlDeviceGetTemperature(device: *const Device, sensor: c_uint, temp: *mut c_uint);
    nvmlDeviceGetPowerUsage(device: *const Device, power: *mut c_uint);
    nvmlDeviceGetClockInfo(device: *const Device, kind: c_uint, clock: *mut c_uint);
    nvmlDeviceGetMinorNumber(device: *const Device, minor: *mut c_uint);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_values_have_nvmls_layout_and_a_bad_call_is_refused() {
        // nvmlFieldValue_t: 40 bytes, the field's status at byte 28.
        assert_eq!(core::mem::size_of::<FieldValue>(), 40);
        assert_eq!(core::mem::offset_of!(FieldValue, nvml_return), 28);
        let mut v = [0u8; 40];
        // SAFETY: a null device is refused before anything is written.
        let r = unsafe { nvmlDeviceGetFieldValues(core::ptr::null(), 1, v.as_mut_ptr().cast()) };
        assert_ne!(r, SUCCESS);
        assert_eq!(v, [0u8; 40]);
    }

    #[test]
    fn uuids_bus_ids_and_layouts_are_nvmls() {
        let u = [
            0x9a, 0xfe, 0x2b, 0x8a, 0xac, 0x25, 0x2d, 0x38, 0xea, 0x37, 0xae, 0xc5, 0x6d, 0x71,
            0x32, 0x5f,
        ];
        assert_eq!(uuid_string(&u), "GPU-9afe2b8a-ac25-2d38-ea37-aec56d71325f");
        assert_eq!(parse_bus_id("00000000:11:00.0"), Some((0, 0x11, 0)));
        assert_eq!(parse_bus_id("0000:1A:00.0"), Some((0, 0x1a, 0)));
        assert_eq!(parse_bus_id("x"), None);
        assert_eq!(std::mem::size_of::<PciInfo>(), 68);
        assert_eq!(std::mem::size_of::<PciInfoV1>(), 52);
        // Without nvmlInit every device call answers "uninitialized".
        let mut n = 7;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&raw mut n) }, UNINITIALIZED);
        assert_eq!(nvmlShutdown(), UNINITIALIZED);
        // SAFETY: nvmlErrorString returns a static C string.
        let s = unsafe { core::ffi::CStr::from_ptr(nvmlErrorString(DRIVER_NOT_LOADED)) };
        assert_eq!(s.to_str().unwrap(), "Driver Not Loaded");
    }

    #[test]
    fn the_export_list_names_exactly_this_faces_functions() {
        let src = include_str!("mod.rs");
        let listed: Vec<&str> = include_str!("../../gen/nvml-exports.txt").lines().collect();
        let defined = src
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = l
                    .strip_prefix("pub unsafe extern \"C\" fn ")
                    .or_else(|| l.strip_prefix("pub extern \"C\" fn "))
                    .or_else(|| l.starts_with("nvml").then_some(l))?;
                if !rest.contains('(') {
                    return None;
                }
                Some(rest.split('(').next()?.to_owned())
            })
            .filter(|n| n.starts_with("nvml"))
            .collect::<std::collections::BTreeSet<_>>();
        let listed = listed.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(defined, listed, "update guest-lib/gen/nvml-exports.txt");
    }
}

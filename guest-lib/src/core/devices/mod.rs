//! Devices (this file): the count, the calling thread's current device, per-device flags, and
//! cached device records and attributes; `device_prop` how `cudaDeviceProp` is filled,
//! `schedule` how the scheduling flags become the ioctl's wait mode, `context` the driver's
//! context records and each thread's context stack.
//!
//! Device records and attributes do not change while a process runs, so each is fetched from the
//! host once; all attributes `cudaGetDeviceProperties` needs travel in one `DeviceAttributes`
//! request. Attributes qcuda cannot honour in the guest are masked here (see `device_prop.rs`).

use crate::core::conv::{c_int_of, int_of_u32, u32_of_int};
use std::{
    cell::Cell,
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Mutex, OnceLock, PoisonError,
    },
};

use qcuda_proto::{GpuInfo, Op, GPU_INFO_SIZE};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::transport::session::{Session, MAX_DEVICES, MAX_DEVICES_U32},
    core::transport::Call,
    generated::{cudaDeviceProp, CUdevice_attribute},
};

pub mod context;
pub mod device_prop;
pub mod schedule;

thread_local! {
    static CURRENT: Cell<u32> = const { Cell::new(0) };
}

/// The calling thread's current device (0 until `cudaSetDevice`).
pub fn current() -> u32 {
    CURRENT.try_with(Cell::get).unwrap_or(0)
}

/// Makes `device` the calling thread's current device (already validated).
pub fn set_current(device: u32) {
    let _ = CURRENT.try_with(|c| c.set(device));
}

/// Attribute ids [`Devices::attribute`] answers from its table (CUDA 13.0's are below 148).
const ANSWER_SLOTS: usize = 160;
/// Marks a slot of [`Devices::answered`] as holding an answer.
const ANSWERED: u64 = 1 << 32;

/// What the host's GPUs look like to this process.
#[derive(Debug)]
pub struct Devices {
    count: u32,
    /// What "no device" is when `count` is 0: the host's answer to `DeviceCount`.
    unavailable: CudaError,
    info: Mutex<HashMap<u32, GpuInfo>>,
    attributes: Mutex<HashMap<(u32, CUdevice_attribute), i32>>,
    /// The answers of [`Self::attribute`] once known, `count` rows of [`ANSWER_SLOTS`]: the
    /// masked value in the low half, [`ANSWERED`] set. A repeated single-attribute query
    /// (`cudaDeviceGetAttribute`, `cuDeviceGetAttribute`, the commonest small call of
    /// frameworks) is then one load, with no lock, hash or allocation. `attributes` only grows,
    /// so an answer never goes stale.
    answered: Box<[AtomicU64]>,
    flags: [AtomicU32; MAX_DEVICES],
    /// Per device, the limits every launch is checked against (launch.rs), once known: the
    /// launch path reads them without a lock or an allocation.
    launch_limits: [OnceLock<Vec<i32>>; MAX_DEVICES],
    /// Per device, whether the runtime face has initialised its primary context: since CUDA 12,
    /// `cudaSetDevice` and the first call that works on a device do, and from then on the driver
    /// API sees that context current on threads that have none of their own (context.rs).
    primary_active: [AtomicBool; MAX_DEVICES],
}

impl Devices {
    /// `count` devices, as the host reported (at most [`MAX_DEVICES`]); with none, calls fail
    /// with `unavailable` (`cudaErrorNoDevice`, or e.g. `cudaErrorInsufficientDriver` when the
    /// host's driver is too old).
    pub fn new(count: u32, unavailable: CudaError) -> Self {
        Self {
            count: count.min(MAX_DEVICES_U32),
            unavailable,
            info: Mutex::default(),
            attributes: Mutex::default(),
            answered: (0..count.min(MAX_DEVICES_U32) as usize * ANSWER_SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            flags: [const { AtomicU32::new(0) }; MAX_DEVICES],
            launch_limits: [const { OnceLock::new() }; MAX_DEVICES],
            primary_active: [const { AtomicBool::new(false) }; MAX_DEVICES],
        }
    }

    /// The runtime face initialised the primary context of `device` (checked): a load first,
    /// so the common case (already active) writes nothing shared.
    pub fn activate_primary(&self, device: u32) {
        if let Some(a) = self.primary_active.get(device as usize) {
            if !a.load(Ordering::Relaxed) {
                a.store(true, Ordering::Relaxed);
            }
        }
    }

    /// `cudaDeviceReset` destroyed the primary context of `device`; the next runtime call that
    /// works on it initialises it again.
    pub fn deactivate_primary(&self, device: u32) {
        if let Some(a) = self.primary_active.get(device as usize) {
            a.store(false, Ordering::Relaxed);
        }
    }

    /// Whether the runtime face has initialised the primary context of `device`.
    pub fn primary_active(&self, device: u32) -> bool {
        self.primary_active
            .get(device as usize)
            .is_some_and(|a| a.load(Ordering::Relaxed))
    }

    /// Number of devices.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Fails when there is no device, with the host's reason (`cudaErrorNoDevice` mostly).
    pub fn any(&self) -> CudaResult<()> {
        if self.count == 0 {
            return Err(self.unavailable);
        }
        Ok(())
    }

    /// `device` as an ordinal, if it names a device: the reason there is none (see
    /// [`any`](Self::any)), or `cudaErrorInvalidDevice` when it is out of range.
    pub fn check(&self, device: i32) -> CudaResult<u32> {
        self.any()?;
        match u32::try_from(device) {
            Ok(d) if d < self.count => Ok(d),
            _ => Err(CudaError::INVALID_DEVICE),
        }
    }

    /// The calling thread's current device, checked (it may name no device when there are
    /// none).
    pub fn current(&self) -> CudaResult<u32> {
        self.check(int_of_u32(current()))
    }

    /// The flags set with `cudaSetDeviceFlags` for `device`.
    pub fn flags(&self, device: u32) -> u32 {
        self.flags
            .get(device as usize)
            .map_or(0, |f| f.load(Ordering::Relaxed))
    }

    /// Records the flags of `device`.
    pub fn set_flags(&self, device: u32, flags: u32) {
        if let Some(f) = self.flags.get(device as usize) {
            f.store(flags, Ordering::Relaxed);
        }
    }

    /// The host's record of `device`.
    pub fn info(&self, session: &Session, device: u32) -> CudaResult<GpuInfo> {
        let mut cache = self.info.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(info) = cache.get(&device) {
            return Ok(*info);
        }
        let mut buf = [0u8; GPU_INFO_SIZE];
        session.submit(Call::new(Op::DeviceInfo, device).output(&mut buf))?;
        let info = GpuInfo::decode(&buf).map_err(|_| CudaError::UNKNOWN)?;
        cache.insert(device, info);
        Ok(info)
    }

    /// One attribute of `device`, masked.
    pub fn attribute(
        &self,
        session: &Session,
        device: u32,
        attr: CUdevice_attribute,
    ) -> CudaResult<i32> {
        if let Some(v) = self.answered_attribute(device, attr) {
            return Ok(v);
        }
        let slot = self.answer_slot(device, attr);
        let v = self.attributes(session, device, &[attr])?[0];
        if let Some(s) = slot {
            s.store(ANSWERED | u64::from(u32_of_int(v)), Ordering::Relaxed);
        }
        Ok(v)
    }

    /// What [`Self::attribute`] answered before for `attr` of `device` (a valid ordinal), if it
    /// did: no lock, no request.
    #[inline]
    pub fn answered_attribute(&self, device: u32, attr: CUdevice_attribute) -> Option<i32> {
        let known = self.answer_slot(device, attr)?.load(Ordering::Relaxed);
        (known & ANSWERED != 0).then(|| c_int_of(known))
    }

    fn answer_slot(&self, device: u32, attr: CUdevice_attribute) -> Option<&AtomicU64> {
        let a = usize::try_from(attr).ok().filter(|a| *a < ANSWER_SLOTS)?;
        self.answered.get(device as usize * ANSWER_SLOTS + a)
    }

    /// Several attributes of `device`, masked, fetching those not cached in one request.
    ///
    /// If the host refuses the batch (an attribute its driver does not know), each missing
    /// attribute is asked for alone; with more than one attribute asked for, those the host does
    /// not know read as 0, with exactly one the host's error is returned.
    pub fn attributes(
        &self,
        session: &Session,
        device: u32,
        attrs: &[CUdevice_attribute],
    ) -> CudaResult<Vec<i32>> {
        let missing: Vec<CUdevice_attribute> = {
            let cache = self
                .attributes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut m: Vec<_> = attrs
                .iter()
                .copied()
                .filter(|a| device_prop::fixed_value(*a).is_none())
                .map(device_prop::source)
                .filter(|a| !cache.contains_key(&(device, *a)))
                .collect();
            m.sort_unstable();
            m.dedup();
            m
        };
        if !missing.is_empty() {
            let fetched: Vec<Option<i32>> = match fetch_attributes(session, device, &missing) {
                Ok(values) => values.into_iter().map(Some).collect(),
                Err(e) if missing.len() == 1 => return Err(e),
                Err(_) => missing
                    .iter()
                    .map(|a| fetch_attributes(session, device, &[*a]).ok().map(|v| v[0]))
                    .collect(),
            };
            let mut cache = self
                .attributes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (a, v) in missing.iter().zip(fetched) {
                // Unknown ones stay uncached: asked alone later, the host's error is the answer.
                if let Some(v) = v {
                    cache.insert((device, *a), v);
                }
            }
        }
        let cache = self
            .attributes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(attrs
            .iter()
            .map(|a| {
                device_prop::fixed_value(*a).unwrap_or_else(|| {
                    let v = cache.get(&(device, device_prop::source(*a))).copied();
                    device_prop::masked(*a, v.unwrap_or(0))
                })
            })
            .collect())
    }

    /// [`Self::attributes`] of `attrs`, which must be the same list on every call (the launch
    /// limits): asked once per device, then read without a lock.
    pub fn launch_limits(
        &self,
        session: &Session,
        device: u32,
        attrs: &[CUdevice_attribute],
    ) -> CudaResult<&[i32]> {
        let slot = self
            .launch_limits
            .get(device as usize)
            .ok_or(CudaError::INVALID_DEVICE)?;
        if let Some(v) = slot.get() {
            return Ok(v);
        }
        let values = self.attributes(session, device, attrs)?;
        Ok(slot.get_or_init(|| values))
    }

    /// `cudaGetDeviceProperties` for `device`.
    pub fn properties(&self, session: &Session, device: u32) -> CudaResult<cudaDeviceProp> {
        let info = self.info(session, device)?;
        let attrs: Vec<CUdevice_attribute> = device_prop::PROP_ATTRIBUTES
            .iter()
            .map(|(a, _)| *a)
            .collect();
        let values = self.attributes(session, device, &attrs)?;
        Ok(device_prop::build(&info, &values))
    }
}

/// One `DeviceAttributes` round trip.
fn fetch_attributes(
    session: &Session,
    device: u32,
    attrs: &[CUdevice_attribute],
) -> CudaResult<Vec<i32>> {
    let ids: Vec<u8> = attrs.iter().flat_map(|a| a.to_le_bytes()).collect();
    let mut out = vec![0u8; ids.len()];
    session.submit(
        Call::new(Op::DeviceAttributes, device)
            .input(&ids)
            .output(&mut out),
    )?;
    Ok(out
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

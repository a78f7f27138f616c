//! Devices as the application sees them: the count, the calling thread's current device,
//! per-device flags, and cached device records and attributes.
//!
//! Device records and attributes do not change while a process runs, so each is fetched from the
//! host once; all attributes `cudaGetDeviceProperties` needs travel in one `DeviceAttributes`
//! request. Attributes qcuda cannot honour in the guest are masked here (see `device_prop.rs`).

use crate::core::conv::int_of_u32;
use std::{
    cell::Cell,
    collections::HashMap,
    sync::{
        atomic::{AtomicU32, Ordering},
        Mutex, OnceLock, PoisonError,
    },
};

use qcuda_proto::{GpuInfo, Op, GPU_INFO_SIZE};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::device_prop,
    core::session::{Session, MAX_DEVICES, MAX_DEVICES_U32},
    core::transport::Call,
    generated::{cudaDeviceProp, CUdevice_attribute},
};

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

/// What the host's GPUs look like to this process.
#[derive(Debug)]
pub struct Devices {
    count: u32,
    /// What "no device" is when `count` is 0: the host's answer to `DeviceCount`.
    unavailable: CudaError,
    info: Mutex<HashMap<u32, GpuInfo>>,
    attributes: Mutex<HashMap<(u32, CUdevice_attribute), i32>>,
    flags: [AtomicU32; MAX_DEVICES],
    /// Per device, the limits every launch is checked against (launch.rs), once known: the
    /// launch path reads them without a lock or an allocation.
    launch_limits: [OnceLock<Vec<i32>>; MAX_DEVICES],
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
            flags: [const { AtomicU32::new(0) }; MAX_DEVICES],
            launch_limits: [const { OnceLock::new() }; MAX_DEVICES],
        }
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
        Ok(self.attributes(session, device, &[attr])?[0])
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
                .filter(|a| {
                    device_prop::fixed_value(*a).is_none() && !cache.contains_key(&(device, *a))
                })
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
                device_prop::fixed_value(*a)
                    .unwrap_or_else(|| cache.get(&(device, *a)).copied().unwrap_or(0))
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

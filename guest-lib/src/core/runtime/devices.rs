//! The device operations both API faces offer (see `runtime::streams`): devices are ordinals the
//! caller already checked, or the calling thread's current device.

use qcuda_proto::Op;

use crate::{
    core::{
        conv::{c_int_of, low_u32},
        cuda_error::{CudaError, CudaResult},
        runtime::{current, runtime},
        transport::Call,
    },
    generated::{cudaDeviceAttr, cudaFuncCache, cudaFuncCachePreferEqual},
};

/// `bus`/`device`/`domain` of a device in CUDA's "domain:bus:device.function" form.
pub fn pci_bus_id_string(domain: i32, bus: i32, device: i32) -> String {
    format!("{domain:04x}:{bus:02x}:{device:02x}.0")
}

/// Parses "[domain:]bus:device[.function]" (hex), as `cudaDeviceGetByPCIBusId` accepts it.
pub fn parse_pci_bus_id(s: &str) -> Option<(i32, i32, i32)> {
    let s = s.split('.').next()?;
    let parts: Vec<&str> = s.split(':').collect();
    let hex = |p: &str| i32::from_str_radix(p, 16).ok();
    match parts[..] {
        [domain, bus, device] => Some((hex(domain)?, hex(bus)?, hex(device)?)),
        [bus, device] => Some((0, hex(bus)?, hex(device)?)),
        _ => None,
    }
}

/// `cudaDeviceSynchronize` of the current device: then managed variables read what the
/// device wrote. With no request made since it last succeeded there, there is nothing to
/// wait for and no round trip is made.
pub fn synchronize() -> CudaResult<()> {
    let (rt, d) = current()?;
    rt.session.check_sticky(d)?;
    if !rt.session.already_drained(d, None) {
        let before = rt.session.requests_made();
        rt.session.submit(Call::new(Op::DeviceSynchronize, d))?;
        rt.session.drained(before, d, None);
    }
    crate::core::runtime::managed::after_sync(rt)
}

/// `cudaDeviceGetAttribute` (the ids are the driver's) of `device`, an ordinal the caller
/// has not checked.
pub fn attribute(device: i32, attr: cudaDeviceAttr) -> CudaResult<i32> {
    let rt = runtime()?;
    let d = rt.devices.check(device)?;
    rt.devices.attribute(&rt.session, d, attr)
}

/// `cudaDeviceGetPCIBusId`'s text for `device`.
pub fn pci_bus_id(device: i32) -> CudaResult<String> {
    let rt = runtime()?;
    let d = rt.devices.check(device)?;
    let info = rt.devices.info(&rt.session, d)?;
    Ok(pci_bus_id_string(
        info.pci_domain,
        info.pci_bus,
        info.pci_device,
    ))
}

/// `cudaDeviceGetByPCIBusId`: the device at that address.
pub fn by_pci_bus_id(id: &str) -> CudaResult<u32> {
    let want = parse_pci_bus_id(id).ok_or(CudaError::INVALID_VALUE)?;
    let rt = runtime()?;
    for d in 0..rt.devices.count() {
        let info = rt.devices.info(&rt.session, d)?;
        if (info.pci_domain, info.pci_bus, info.pci_device) == want {
            return Ok(d);
        }
    }
    Err(CudaError::INVALID_DEVICE)
}

/// `cudaDeviceCanAccessPeer`: the host driver's answer for the two GPUs (a device is not
/// its own peer).
pub fn can_access_peer(device: i32, peer: i32) -> CudaResult<bool> {
    let rt = runtime()?;
    let d = rt.devices.check(device)?;
    let p = rt.devices.check(peer)?;
    let reply = rt
        .session
        .submit(Call::new(Op::DeviceCanAccessPeer, d).args(&[u64::from(d), u64::from(p)]))?;
    Ok(reply.rets[0] != 0)
}

/// `cudaDeviceGetP2PAttribute` (attributes 1 to 5).
pub fn p2p_attribute(attr: u32, src: i32, dst: i32) -> CudaResult<i32> {
    let rt = runtime()?;
    let src = rt.devices.check(src)?;
    let dst = rt.devices.check(dst)?;
    if !(1..=5).contains(&attr) {
        return Err(CudaError::INVALID_VALUE);
    }
    let reply = rt
        .session
        .submit(Call::new(Op::DeviceP2PAttribute, src).args(&[
            u64::from(attr),
            u64::from(src),
            u64::from(dst),
        ]))?;
    Ok(c_int_of(reply.rets[0]))
}

/// A `cudaFuncCache` value as the wire carries it.
pub fn cache_config(config: cudaFuncCache) -> CudaResult<u64> {
    if config <= cudaFuncCachePreferEqual {
        Ok(u64::from(config))
    } else {
        Err(CudaError::INVALID_VALUE)
    }
}

/// `cudaDeviceSetCacheConfig` (the current device's context).
pub fn set_cache_config(config: cudaFuncCache) -> CudaResult<()> {
    let config = cache_config(config)?;
    let (rt, device) = current()?;
    rt.session
        .submit(Call::new(Op::DeviceSetCacheConfig, device).args(&[config]))?;
    Ok(())
}

/// `cudaDeviceGetCacheConfig`.
pub fn cache_config_of_current() -> CudaResult<cudaFuncCache> {
    let (rt, device) = current()?;
    let reply = rt
        .session
        .submit(Call::new(Op::DeviceGetCacheConfig, device))?;
    Ok(low_u32(reply.rets[0]))
}

/// `cudaCtxResetPersistingL2Cache`.
pub fn reset_persisting_l2() -> CudaResult<()> {
    let (rt, d) = current()?;
    rt.session.submit(Call::new(Op::CtxResetPersistingL2, d))?;
    Ok(())
}

//! Device management: count, selection, properties, attributes, versions, flags,
//! synchronisation, reset, memory info.

use crate::core::conv::{int_of_u32, usize_of};
use core::ffi::{c_char, c_int, c_uint};

use qcuda_proto::Op;

use super::write_out;
use crate::{
    core::cuda_error::CudaError,
    core::devices,
    core::runtime::devices as device_ops,
    core::runtime::{current, non_null, registry, runtime},
    core::transport::Call,
    generated::{
        cudaDeviceAttr, cudaDeviceLmemResizeToMax, cudaDeviceMapHost, cudaDeviceProp,
        cudaDeviceScheduleMask, cudaDeviceSyncMemops, CUDART_VERSION,
    },
};

/// Flags `cudaSetDeviceFlags` accepts.
const DEVICE_FLAGS: u32 =
    cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax | cudaDeviceSyncMemops;

/// `cudaInitDeviceFlagsAreValid`: `cudaInitDevice`'s `deviceFlags` are to be applied.
const INIT_DEVICE_FLAGS_ARE_VALID: u32 = 1;

/// Validates device flags: known bits, at most one scheduling mode.
fn check_device_flags(flags: u32) -> Result<u32, CudaError> {
    if flags & !DEVICE_FLAGS != 0 || (flags & cudaDeviceScheduleMask).count_ones() > 1 {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(flags)
}

/// The limits the runtime API names (`cudaLimit`: stack size to persisting L2 size); the
/// driver's later ones (shared memory size, CIG) are `cudaErrorUnsupportedLimit` here, as with
/// NVIDIA's runtime.
fn runtime_limit(limit: crate::generated::cudaLimit) -> crate::core::cuda_error::CudaResult<()> {
    if limit <= crate::generated::cudaLimitPersistingL2CacheSize {
        Ok(())
    } else {
        Err(
            CudaError::from_code(crate::generated::cudaErrorUnsupportedLimit)
                .unwrap_or(CudaError::INVALID_VALUE),
        )
    }
}

cuda_api! {
    /// `cudaGetDeviceCount`: without a qcuda device, `*count` is 0 and the result
    /// `cudaErrorNoDevice` (or the host's reason, e.g. `cudaErrorInsufficientDriver`).
    fn cudaGetDeviceCount(count: *mut c_int) {
        non_null(count)?;
        let rt = runtime();
        let n = rt.map_or(0, |rt| rt.devices.count());
        // SAFETY: `count` is non-null and writable (API contract).
        unsafe { write_out(count, int_of_u32(n))? };
        rt?.devices.any()
    }

    /// `cudaSetDevice`: validates the ordinal and makes it the thread's current device; as
    /// since CUDA 12, this initialises the device's primary context, current from then on for
    /// the driver API too.
    fn cudaSetDevice(device: c_int) {
        let rt = runtime()?;
        let d = rt.devices.check(device)?;
        rt.devices.activate_primary(d);
        devices::set_current(d);
        crate::core::runtime::context::runtime_set_device(d);
        Ok(())
    }

    /// `cudaGetDevice`.
    fn cudaGetDevice(device: *mut c_int) {
        non_null(device)?;
        // Not `current()`: asking which device is current initialises no context.
        let d = runtime()?.devices.current()?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(device, int_of_u32(d)) }
    }

    /// `cudaInitDevice`: validates the device and applies `deviceFlags` when asked to.
    fn cudaInitDevice(device: c_int, deviceFlags: c_uint, flags: c_uint) {
        let rt = runtime()?;
        let d = rt.devices.check(device)?;
        if flags & !INIT_DEVICE_FLAGS_ARE_VALID != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        if flags & INIT_DEVICE_FLAGS_ARE_VALID != 0 {
            rt.devices.set_flags(d, check_device_flags(deviceFlags)?);
        }
        Ok(())
    }

    /// `cudaGetDeviceProperties`: the host's record and attributes of `device`; capabilities
    /// qcuda cannot carry into the guest read as 0 (device_prop.rs).
    fn cudaGetDeviceProperties(prop: *mut cudaDeviceProp, device: c_int) {
        non_null(prop)?;
        let rt = runtime()?;
        let d = rt.devices.check(device)?;
        let p = rt.devices.properties(&rt.session, d)?;
        // SAFETY: non-null and writable for a cudaDeviceProp (API contract).
        unsafe { write_out(prop, p) }
    }

    /// `cudaDeviceGetAttribute`: `cudaDeviceAttr` values are the driver's attribute ids.
    fn cudaDeviceGetAttribute(value: *mut c_int, attr: cudaDeviceAttr, device: c_int) {
        non_null(value)?;
        let v = device_ops::attribute(device, attr)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(value, v) }
    }

    /// `cudaDeviceGetPCIBusId`: "domain:bus:device.function" in hex, truncated to `len`.
    fn cudaDeviceGetPCIBusId(pciBusId: *mut c_char, len: c_int, device: c_int) {
        non_null(pciBusId)?;
        let len = usize::try_from(len).ok().filter(|&l| l > 0).ok_or(CudaError::INVALID_VALUE)?;
        let id = device_ops::pci_bus_id(device)?;
        let n = id.len().min(len - 1);
        // SAFETY: `pciBusId` is writable for `len` bytes (API contract); we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(id.as_ptr().cast::<c_char>(), pciBusId, n);
            pciBusId.add(n).write(0);
        }
        Ok(())
    }

    /// `cudaDeviceGetByPCIBusId`.
    fn cudaDeviceGetByPCIBusId(device: *mut c_int, pciBusId: *const c_char) {
        non_null(device)?;
        non_null(pciBusId)?;
        // SAFETY: a NUL-terminated string (API contract).
        let s = unsafe { std::ffi::CStr::from_ptr(pciBusId) };
        let d = device_ops::by_pci_bus_id(s.to_str().map_err(|_| CudaError::INVALID_VALUE)?)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(device, int_of_u32(d)) }
    }

    /// `cudaDeviceCanAccessPeer`: the host driver's answer for the two GPUs (a device is not
    /// its own peer).
    fn cudaDeviceCanAccessPeer(canAccessPeer: *mut c_int, device: c_int, peerDevice: c_int) {
        non_null(canAccessPeer)?;
        let can = device_ops::can_access_peer(device, peerDevice)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(canAccessPeer, c_int::from(can)) }
    }

    /// `cudaDeviceGetP2PAttribute`.
    fn cudaDeviceGetP2PAttribute(value: *mut c_int, attr: crate::generated::cudaDeviceP2PAttr, srcDevice: c_int, dstDevice: c_int) {
        non_null(value)?;
        let v = device_ops::p2p_attribute(attr, srcDevice, dstDevice)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(value, v) }
    }

    /// `cudaDeviceEnablePeerAccess`: the current device's context reaches `peerDevice`'s
    /// memory (flags must be 0).
    fn cudaDeviceEnablePeerAccess(peerDevice: c_int, flags: core::ffi::c_uint) {
        peer_access(peerDevice, 1, flags)
    }

    /// `cudaDeviceDisablePeerAccess`.
    fn cudaDeviceDisablePeerAccess(peerDevice: c_int) {
        peer_access(peerDevice, 0, 0)
    }

    /// `cudaDriverGetVersion`: the host driver's version; 0 (and success) without a device, as
    /// NVIDIA's runtime answers without a driver.
    fn cudaDriverGetVersion(driverVersion: *mut c_int) {
        non_null(driverVersion)?;
        let v = runtime().map_or(0, |rt| rt.session.host().driver_version);
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(driverVersion, v) }
    }

    /// `cudaRuntimeGetVersion`: 13000, the CUDA runtime release this library stands in for.
    fn cudaRuntimeGetVersion(runtimeVersion: *mut c_int) {
        // SAFETY: writable when non-null (API contract).
        unsafe { write_out(runtimeVersion, int_of_u32(CUDART_VERSION)) }
    }

    /// `cudaSetDeviceFlags`: recorded for `cudaGetDeviceFlags`; the scheduling flags decide how
    /// the device's synchronising calls wait in the guest (schedule.rs).
    fn cudaSetDeviceFlags(flags: c_uint) {
        let (rt, d) = current()?;
        rt.devices.set_flags(d, check_device_flags(flags)?);
        Ok(())
    }

    /// `cudaGetDeviceFlags`.
    fn cudaGetDeviceFlags(flags: *mut c_uint) {
        non_null(flags)?;
        let (rt, d) = current()?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(flags, rt.devices.flags(d)) }
    }

    /// `cudaDeviceGetLimit`: the limit in this process's context on the current device.
    fn cudaDeviceGetLimit(pValue: *mut usize, limit: crate::generated::cudaLimit) {
        non_null(pValue)?;
        runtime_limit(limit)?;
        let (rt, d) = current()?;
        let reply = rt
            .session
            .submit(Call::new(Op::DeviceGetLimit, d).args(&[u64::from(limit)]))?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pValue, usize_of(reply.rets[0])) }
    }

    /// `cudaDeviceSetLimit`: stack size, printf FIFO, malloc heap, device-runtime depths, L2
    /// fetch granularity and persisting L2 size, as the driver takes them.
    fn cudaDeviceSetLimit(limit: crate::generated::cudaLimit, value: usize) {
        runtime_limit(limit)?;
        let (rt, d) = current()?;
        rt.session.submit(
            Call::new(Op::DeviceSetLimit, d).args(&[u64::from(limit), value as u64]),
        )?;
        Ok(())
    }

    /// `cudaDeviceSynchronize`: waits for all work of this process on the current device;
    /// reports failures of earlier fire-and-forget work.
    fn cudaDeviceSynchronize() { device_ops::synchronize() }

    /// `cudaDeviceReset`: frees everything of this process on the current device and clears its
    /// sticky error.
    fn cudaDeviceReset() {
        let (rt, d) = current()?;
        rt.reset_device(registry(), d)
    }

    /// `cudaMemGetInfo`.
    fn cudaMemGetInfo(free: *mut usize, total: *mut usize) {
        non_null(free)?;
        non_null(total)?;
        let (f, t) = crate::core::runtime::memory::ops::mem_info()?;
        // SAFETY: both non-null and writable (API contract).
        unsafe {
            write_out(free, f)?;
            write_out(total, t)
        }
    }
}

/// `PeerAccess` from the current device to `peer`.
fn peer_access(
    peer: c_int,
    enable: u64,
    flags: core::ffi::c_uint,
) -> crate::core::cuda_error::CudaResult<()> {
    let (rt, d) = crate::core::runtime::current()?;
    let p = rt.devices.check(peer)?;
    if flags != 0 {
        return Err(crate::core::cuda_error::CudaError::INVALID_VALUE);
    }
    rt.session.submit(
        crate::core::transport::Call::new(qcuda_proto::Op::PeerAccess, d).args(&[
            u64::from(p),
            enable,
            0,
        ]),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_round_trip() {
        use crate::core::runtime::devices::{parse_pci_bus_id, pci_bus_id_string as pci_bus_id};
        assert_eq!(pci_bus_id(0, 0x65, 0), "0000:65:00.0");
        assert_eq!(parse_pci_bus_id("0000:65:00.0"), Some((0, 0x65, 0)));
        assert_eq!(parse_pci_bus_id("00000001:0A:1f"), Some((1, 0xa, 0x1f)));
        assert_eq!(parse_pci_bus_id("65:00.0"), Some((0, 0x65, 0)));
        assert_eq!(parse_pci_bus_id("garbage"), None);
    }

    #[test]
    fn device_flags_are_validated() {
        assert_eq!(check_device_flags(0), Ok(0));
        assert_eq!(check_device_flags(4 | 8), Ok(12));
        assert_eq!(check_device_flags(1 | 2), Err(CudaError::INVALID_VALUE));
        assert_eq!(check_device_flags(0x100), Err(CudaError::INVALID_VALUE));
    }
}

//! Devices: count, ordinals, names, UUIDs, memory, attributes, PCI identity, peers.

use core::ffi::{c_char, c_int, c_uint};

use qcuda_proto::Op;

use super::{check_device, initialized, out, via_core};
use crate::{
    core::runtime::devices as device_ops, core::runtime::pools as pool_ops, core::runtime::runtime,
    driver::status::DriverError, generated::driver_api as d,
};

driver_api! {
    /// `cuDeviceGet`.
    fn cuDeviceGet(device: *mut d::CUdevice, ordinal: c_int) {
        check_device(ordinal)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(device, ordinal) }
    }

    /// `cuDeviceGetCount`.
    fn cuDeviceGetCount(count: *mut c_int) {
        initialized()?;
        let n = runtime()?.devices.count();
        // SAFETY: caller's out-parameter.
        unsafe { out(count, c_int::try_from(n).unwrap_or(c_int::MAX)) }
    }

    /// `cuDeviceGetName`: truncated to `len` bytes with the NUL, as the driver does.
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: d::CUdevice) {
        let dv = check_device(dev)?;
        let len = usize::try_from(len).ok().filter(|&l| l > 0).ok_or(DriverError::INVALID_VALUE)?;
        if name.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let rt = runtime()?;
        let info = rt.devices.info(&rt.session, dv)?;
        let text = info.name.split(|&b| b == 0).next().unwrap_or(&[]);
        let n = text.len().min(len - 1);
        // SAFETY: the caller gave `len` writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            name.add(n).write(0);
        }
        Ok(())
    }

    /// `cuDeviceGetUuid` (the CUDA 9.2 form; same bytes as `_v2`).
    #[no_prototype = "cuda.h maps cuDeviceGetUuid to _v2"]
    fn cuDeviceGetUuid(uuid: *mut d::CUuuid, dev: d::CUdevice) {
        // SAFETY: forwarded contract.
        DriverError::check(unsafe { cuDeviceGetUuid_v2(uuid, dev) })
    }

    /// `cuDeviceGetUuid_v2`.
    fn cuDeviceGetUuid_v2(uuid: *mut d::CUuuid, dev: d::CUdevice) {
        let dv = check_device(dev)?;
        let rt = runtime()?;
        let info = rt.devices.info(&rt.session, dv)?;
        let bytes = info.uuid.map(u8::cast_signed);
        // SAFETY: caller's out-parameter.
        unsafe { out(uuid, d::CUuuid { bytes }) }
    }

    /// `cuDeviceTotalMem_v2`.
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: d::CUdevice) {
        let dv = check_device(dev)?;
        let rt = runtime()?;
        let info = rt.devices.info(&rt.session, dv)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(bytes, usize::try_from(info.total_mem).unwrap_or(usize::MAX)) }
    }

    /// `cuDeviceTotalMem` (32-bit size, pre-3.2).
    #[no_prototype = "pre-3.2 form"]
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: d::CUdevice) {
        let mut total = 0usize;
        // SAFETY: a valid out-pointer.
        DriverError::check(unsafe { cuDeviceTotalMem_v2(&raw mut total, dev) })?;
        // SAFETY: caller's out-parameter.
        unsafe { out(bytes, c_uint::try_from(total).unwrap_or(c_uint::MAX)) }
    }

    /// `cuDeviceGetAttribute`: the attributes the runtime face reports (masked where qcuda
    /// cannot honour them in the guest).
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: d::CUdevice_attribute, dev: d::CUdevice) {
        let dv = check_device(dev)?;
        if pi.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // The ids are the runtime's cudaDeviceAttr values. One asked before is answered from
        // the runtime face's table (the commonest repeated driver call of NVIDIA's runtime).
        let v = match runtime()?.devices.answered_attribute(dv, attrib) {
            Some(v) => v,
            None => via_core(|| device_ops::attribute(dev, attrib))?,
        };
        // SAFETY: checked non-null; caller's out-parameter.
        unsafe { out(pi, v) }?;
        if crate::driver::trace::enabled() {
            // SAFETY: written above.
            crate::driver::trace::log(format_args!("device attribute {attrib}: {}", unsafe { *pi }));
        }
        Ok(())
    }

    /// `cuDeviceComputeCapability` (deprecated).
    #[no_prototype = "deprecated, not declared by default"]
    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: d::CUdevice) {
        let dv = check_device(dev)?;
        let rt = runtime()?;
        let info = rt.devices.info(&rt.session, dv)?;
        // SAFETY: caller's out-parameters.
        unsafe {
            out(major, info.cc_major)?;
            out(minor, info.cc_minor)
        }
    }

    /// `cuDeviceGetPCIBusId`.
    fn cuDeviceGetPCIBusId(pciBusId: *mut c_char, len: c_int, dev: d::CUdevice) {
        check_device(dev)?;
        if pciBusId.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let len = usize::try_from(len).ok().filter(|&l| l > 0).ok_or(DriverError::INVALID_VALUE)?;
        let id = via_core(|| device_ops::pci_bus_id(dev))?;
        let n = id.len().min(len - 1);
        // SAFETY: `pciBusId` is writable for `len` bytes (API contract); we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(id.as_ptr().cast::<c_char>(), pciBusId, n);
            pciBusId.add(n).write(0);
        }
        Ok(())
    }

    /// `cuDeviceGetByPCIBusId`.
    fn cuDeviceGetByPCIBusId(dev: *mut d::CUdevice, pciBusId: *const c_char) {
        initialized()?;
        if dev.is_null() || pciBusId.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated string (API contract).
        let id = unsafe { std::ffi::CStr::from_ptr(pciBusId) }
            .to_str()
            .map_err(|_| DriverError::INVALID_VALUE)?;
        let found = via_core(|| device_ops::by_pci_bus_id(id))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(dev, d::CUdevice::try_from(found).unwrap_or(d::CUdevice::MAX)) }
    }

    /// `cuDeviceCanAccessPeer`.
    fn cuDeviceCanAccessPeer(canAccessPeer: *mut c_int, dev: d::CUdevice, peerDev: d::CUdevice) {
        check_device(dev)?;
        check_device(peerDev)?;
        let can = via_core(|| device_ops::can_access_peer(dev, peerDev))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(canAccessPeer, c_int::from(can)) }
    }

    /// `cuDeviceGetP2PAttribute` (the attribute ids are the runtime's).
    fn cuDeviceGetP2PAttribute(
        value: *mut c_int,
        attrib: d::CUdevice_P2PAttribute,
        srcDevice: d::CUdevice,
        dstDevice: d::CUdevice,
    ) {
        check_device(srcDevice)?;
        check_device(dstDevice)?;
        let v = via_core(|| device_ops::p2p_attribute(attrib, srcDevice, dstDevice))?;
        // SAFETY: caller's out-parameter.
        unsafe { out(value, v) }
    }

    /// `cuDeviceGetDefaultMemPool`.
    fn cuDeviceGetDefaultMemPool(pool_out: *mut d::CUmemoryPool, dev: d::CUdevice) {
        let dev = check_device(dev)?;
        if pool_out.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let h = via_core(|| pool_ops::pool_of(Op::DeviceGetDefaultMemPool, dev))?;
        // SAFETY: caller's out-parameter; a CUmemoryPool is the core's pool handle.
        unsafe { out(pool_out, h as d::CUmemoryPool) }
    }

    /// `cuDeviceGetMemPool`.
    fn cuDeviceGetMemPool(pool: *mut d::CUmemoryPool, dev: d::CUdevice) {
        let dev = check_device(dev)?;
        if pool.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let h = via_core(|| pool_ops::pool_of(Op::DeviceGetMemPool, dev))?;
        // SAFETY: as above.
        unsafe { out(pool, h as d::CUmemoryPool) }
    }

    /// `cuDeviceSetMemPool`.
    fn cuDeviceSetMemPool(dev: d::CUdevice, pool: d::CUmemoryPool) {
        let dev = check_device(dev)?;
        via_core(|| pool_ops::set_current(dev, pool as usize))
    }

    /// `cuDeviceGetExecAffinitySupport`: qcuda offers no execution affinity (SM partitions),
    /// so every type is reported as unsupported (0), which is the truth.
    fn cuDeviceGetExecAffinitySupport(pi: *mut c_int, r#type: d::CUexecAffinityType, dev: d::CUdevice) {
        check_device(dev)?;
        if r#type != d::CU_EXEC_AFFINITY_TYPE_SM_COUNT {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: caller's out-parameter.
        unsafe { out(pi, 0) }
    }
}

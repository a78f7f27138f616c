//! Several GPUs: peer queries, peer access between the process's contexts, and copies between
//! devices. The host's worker keeps one context per device of the process, as CUDA does, so peer
//! access and peer copies are the driver's (`cuCtxEnablePeerAccess`, `cuMemcpyPeerAsync`).

use core::ffi::{c_int, c_uint, c_void};

use qcuda_proto::Op;

use super::write_out;
use crate::{
    cuda_error::{CudaError, CudaResult},
    generated::cudaStream_t,
    runtime::{current, non_null, runtime},
    transport::Call,
};

fn peer_access(peer: c_int, enable: bool) -> CudaResult<()> {
    let (rt, d) = current()?;
    let p = rt.devices.check(peer)?;
    rt.session
        .submit(Call::new(Op::PeerAccess, d).args(&[u64::from(p), u64::from(enable)]))?;
    Ok(())
}

fn memcpy_peer(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
    stream: cudaStream_t,
    asynchronous: bool,
) -> CudaResult<()> {
    let (rt, _) = current()?;
    let (dd, sd) = (rt.devices.check(dst_device)?, rt.devices.check(src_device)?);
    let t = rt.streams.target(stream as usize)?;
    let mut call = Call::new(Op::MemcpyPeer, t.device).args(&[
        dst as u64,
        u64::from(dd),
        src as u64,
        u64::from(sd),
        count as u64,
        t.wire,
    ]);
    if asynchronous {
        call = call.fire_and_forget();
    }
    rt.session.submit(call)?;
    Ok(())
}

cuda_api! {
    /// `cudaDeviceCanAccessPeer`: the driver's answer for the two host GPUs (0 for a device and
    /// itself).
    fn cudaDeviceCanAccessPeer(canAccessPeer: *mut c_int, device: c_int, peerDevice: c_int) {
        non_null(canAccessPeer)?;
        let rt = runtime()?;
        let d = rt.devices.check(device)?;
        let p = rt.devices.check(peerDevice)?;
        let r = rt
            .session
            .submit(Call::new(Op::DeviceCanAccessPeer, d).args(&[u64::from(p)]))?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(canAccessPeer, c_int::from(r.rets[0] != 0)) }
    }

    /// `cudaDeviceEnablePeerAccess`: the current device's context may use `peerDevice`'s
    /// memory; `flags` must be 0.
    fn cudaDeviceEnablePeerAccess(peerDevice: c_int, flags: c_uint) {
        if flags != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        peer_access(peerDevice, true)
    }

    /// `cudaDeviceDisablePeerAccess`.
    fn cudaDeviceDisablePeerAccess(peerDevice: c_int) { peer_access(peerDevice, false) }

    /// `cudaDeviceGetP2PAttribute`.
    fn cudaDeviceGetP2PAttribute(value: *mut c_int, attr: c_uint, srcDevice: c_int, dstDevice: c_int) {
        non_null(value)?;
        let rt = runtime()?;
        let (s, d) = (rt.devices.check(srcDevice)?, rt.devices.check(dstDevice)?);
        let r = rt.session.submit(
            Call::new(Op::P2PAttribute, s).args(&[u64::from(attr), u64::from(s), u64::from(d)]),
        )?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(value, r.rets[0] as u32 as c_int) }
    }

    /// `cudaMemcpyPeer`: synchronous with respect to the host, like `cudaMemcpy`.
    fn cudaMemcpyPeer(dst: *mut c_void, dstDevice: c_int, src: *const c_void, srcDevice: c_int, count: usize) {
        memcpy_peer(dst, dstDevice, src, srcDevice, count, core::ptr::null_mut(), false)
    }

    /// `cudaMemcpyPeerAsync` (fire-and-forget, stream-ordered).
    fn cudaMemcpyPeerAsync(dst: *mut c_void, dstDevice: c_int, src: *const c_void, srcDevice: c_int, count: usize, stream: cudaStream_t) {
        memcpy_peer(dst, dstDevice, src, srcDevice, count, stream, true)
    }
}

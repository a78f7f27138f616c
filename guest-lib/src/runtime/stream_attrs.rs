//! Stream attributes (`cudaStreamSetAttribute`, `cudaStreamGetAttribute`): the launch
//! attributes a stream takes, i.e. the L2 access policy window, the synchronisation policy, the
//! priority and the memory synchronisation domain (map); and `cudaCtxResetPersistingL2Cache`.
//! Values cross as qcuda-proto `LaunchAttr` records, as for `cudaLaunchKernelExC`.

use core::ffi::c_uint;

use qcuda_proto::{LaunchAttr, Op, LAUNCH_ATTR_SIZE};

use super::write_out;
use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::runtime::{current, non_null},
    core::transport::Call,
    generated::{cudaLaunchAttributeValue, cudaStream_t},
};

/// `cudaStreamAttrID` values a stream takes.
const ACCESS_POLICY_WINDOW: c_uint = 1;
const SYNCHRONIZATION_POLICY: c_uint = 3;
const PRIORITY: c_uint = 8;
const MEM_SYNC_DOMAIN_MAP: c_uint = 9;
const MEM_SYNC_DOMAIN: c_uint = 10;

fn word(val: &[u8; 64], i: usize) -> u32 {
    u32::from_le_bytes([val[4 * i], val[4 * i + 1], val[4 * i + 2], val[4 * i + 3]])
}

fn dword(val: &[u8; 64], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&val[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The wire record of stream attribute `attr` with value `val` (the C union's bytes).
fn to_wire(attr: c_uint, val: &[u8; 64]) -> CudaResult<LaunchAttr> {
    let mut rec = LaunchAttr {
        id: attr,
        ..LaunchAttr::default()
    };
    match attr {
        ACCESS_POLICY_WINDOW => {
            rec.w = [dword(val, 0), dword(val, 8)];
            rec.v = [word(val, 4), word(val, 5), word(val, 6)];
        }
        SYNCHRONIZATION_POLICY | PRIORITY | MEM_SYNC_DOMAIN => rec.v[0] = word(val, 0),
        MEM_SYNC_DOMAIN_MAP => rec.v = [u32::from(val[0]), u32::from(val[1]), 0],
        _ => return Err(CudaError::INVALID_VALUE),
    }
    Ok(rec)
}

/// The C union's bytes for wire record `rec`.
fn from_wire(rec: &LaunchAttr) -> [u8; 64] {
    let mut val = [0u8; 64];
    let mut put = |at: usize, b: &[u8]| val[at..at + b.len()].copy_from_slice(b);
    match rec.id {
        ACCESS_POLICY_WINDOW => {
            put(0, &rec.w[0].to_le_bytes());
            put(8, &rec.w[1].to_le_bytes());
            for (i, v) in rec.v.iter().enumerate() {
                put(16 + 4 * i, &v.to_le_bytes());
            }
        }
        MEM_SYNC_DOMAIN_MAP => put(0, &[rec.v[0].to_le_bytes()[0], rec.v[1].to_le_bytes()[0]]),
        _ => put(0, &rec.v[0].to_le_bytes()),
    }
    val
}

/// # Safety
/// `value` must be null or point at a readable `cudaStreamAttrValue`.
unsafe fn set(
    stream: cudaStream_t,
    attr: c_uint,
    value: *const cudaLaunchAttributeValue,
) -> CudaResult<()> {
    non_null(value)?;
    // SAFETY: non-null and readable (caller contract); the union is 64 plain bytes.
    let val: [u8; 64] = unsafe { value.cast::<[u8; 64]>().read_unaligned() };
    let rec = to_wire(attr, &val)?;
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    let bytes = rec.encode();
    rt.session.submit(
        Call::new(Op::StreamSetAttribute, t.device)
            .args(&[t.wire])
            .input(&bytes),
    )?;
    Ok(())
}

/// # Safety
/// `value` must be null or point at a writable `cudaStreamAttrValue`.
unsafe fn get(
    stream: cudaStream_t,
    attr: c_uint,
    value: *mut cudaLaunchAttributeValue,
) -> CudaResult<()> {
    non_null(value)?;
    to_wire(attr, &[0; 64])?;
    let (rt, _) = current()?;
    let t = rt.streams.target(stream as usize)?;
    let mut out = [0u8; LAUNCH_ATTR_SIZE];
    rt.session.submit(
        Call::new(Op::StreamGetAttribute, t.device)
            .args(&[t.wire, u64::from(attr)])
            .output(&mut out),
    )?;
    let rec = LaunchAttr::decode(&out).map_err(|_| CudaError::UNKNOWN)?;
    // SAFETY: non-null and writable (caller contract); the union is 64 plain bytes.
    unsafe { write_out(value.cast::<[u8; 64]>(), from_wire(&rec)) }
}

cuda_api! {
    /// `cudaStreamSetAttribute`.
    #[per_thread(cudaStreamSetAttribute_ptsz)]
    fn cudaStreamSetAttribute(hStream: cudaStream_t, attr: c_uint, value: *const cudaLaunchAttributeValue) {
        // SAFETY: forwarded API contract.
        unsafe { set(hStream, attr, value) }
    }

    /// `cudaStreamGetAttribute`.
    #[per_thread(cudaStreamGetAttribute_ptsz)]
    fn cudaStreamGetAttribute(hStream: cudaStream_t, attr: c_uint, value_out: *mut cudaLaunchAttributeValue) {
        // SAFETY: forwarded API contract.
        unsafe { get(hStream, attr, value_out) }
    }

    /// `cudaCtxResetPersistingL2Cache`: lines of the current device's L2 cache kept as
    /// persisting go back to normal.
    fn cudaCtxResetPersistingL2Cache() { crate::core::devices::ops::reset_persisting_l2() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_attribute_values_cross_the_wire_unchanged() {
        let mut window = [0u8; 64];
        window[..8].copy_from_slice(&0x7f00_0000_1000u64.to_le_bytes());
        window[8..16].copy_from_slice(&(1u64 << 20).to_le_bytes());
        window[16..20].copy_from_slice(&0.6f32.to_bits().to_le_bytes());
        window[20..24].copy_from_slice(&2u32.to_le_bytes());
        window[24..28].copy_from_slice(&1u32.to_le_bytes());
        let rec = to_wire(ACCESS_POLICY_WINDOW, &window).unwrap();
        assert_eq!(from_wire(&rec), window);
        let mut map = [0u8; 64];
        map[..2].copy_from_slice(&[1, 2]);
        assert_eq!(from_wire(&to_wire(MEM_SYNC_DOMAIN_MAP, &map).unwrap()), map);
        let mut prio = [0u8; 64];
        prio[..4].copy_from_slice(&(-3i32).to_le_bytes());
        assert_eq!(from_wire(&to_wire(PRIORITY, &prio).unwrap()), prio);
        to_wire(4, &prio).unwrap_err();
    }
}

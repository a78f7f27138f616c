//! Launch attributes kept by streams and by kernel nodes, for both faces: `cudaStreamSet/Get/
//! CopyAttributes` and `cuStream*Attribute(s)`, `cudaGraphKernelNodeSet/Get/CopyAttributes` and
//! `cuGraphKernelNode*Attribute(s)`. One value is the 64 bytes of the `cudaLaunchAttributeValue`
//! union (the driver's `CUlaunchAttributeValue`, the same layout); it crosses as a qcuda-proto
//! `LaunchAttr` record, laid out as for `cudaLaunchKernelExC` (`launch.rs`), and the host's driver
//! says which attributes a stream or a node takes.

use core::ffi::c_uint;

use qcuda_proto::{LaunchAttr, Op, LAUNCH_ATTR_SIZE};

use crate::{
    core::conv::usize_of,
    core::cuda_error::{CudaError, CudaResult},
    core::runtime::{current, non_null, Runtime},
    core::transport::Call,
    core::warnings::warn_once,
    generated as cu,
};

/// The attribute ids a stream takes (`cudaStreamAttrID`): access policy window, synchronisation
/// policy, priority, memory synchronisation domain map and domain.
pub const STREAM_ATTRIBUTES: [c_uint; 5] = [1, 3, 8, 9, 10];

fn word(val: &[u8; 64], i: usize) -> u32 {
    u32::from_le_bytes([val[4 * i], val[4 * i + 1], val[4 * i + 2], val[4 * i + 3]])
}

fn dword(val: &[u8; 64], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&val[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The wire record of attribute `id` with value `val` (the union's bytes). Events (the
/// programmatic and launch-completion events) are named by their host handles.
pub fn to_wire(rt: &Runtime, id: c_uint, val: &[u8; 64]) -> CudaResult<LaunchAttr> {
    encode(id, val, |e| rt.events.info(e).map(|i| i.host))
}

/// [`to_wire`], with `event` giving an event's host handle.
fn encode(
    id: c_uint,
    val: &[u8; 64],
    event: impl Fn(usize) -> CudaResult<u64>,
) -> CudaResult<LaunchAttr> {
    let mut rec = LaunchAttr {
        id,
        ..LaunchAttr::default()
    };
    match id {
        cu::cudaLaunchAttributeIgnore => {}
        cu::cudaLaunchAttributeCooperative
        | cu::cudaLaunchAttributeSynchronizationPolicy
        | cu::cudaLaunchAttributeClusterSchedulingPolicyPreference
        | cu::cudaLaunchAttributeProgrammaticStreamSerialization
        | cu::cudaLaunchAttributePriority
        | cu::cudaLaunchAttributeMemSyncDomain
        | cu::cudaLaunchAttributePreferredSharedMemoryCarveout
        | cu::cudaLaunchAttributeNvlinkUtilCentricScheduling => rec.v[0] = word(val, 0),
        cu::cudaLaunchAttributeClusterDimension
        | cu::cudaLaunchAttributePreferredClusterDimension => {
            rec.v = [word(val, 0), word(val, 1), word(val, 2)];
        }
        cu::cudaLaunchAttributeMemSyncDomainMap => {
            rec.v = [u32::from(val[0]), u32::from(val[1]), 0];
        }
        cu::cudaLaunchAttributeProgrammaticEvent | cu::cudaLaunchAttributeLaunchCompletionEvent => {
            rec.w[0] = event(usize_of(dword(val, 0)))?;
            rec.v = [word(val, 2), word(val, 3), 0];
            if id == cu::cudaLaunchAttributeLaunchCompletionEvent {
                rec.v[1] = 0;
            }
        }
        cu::cudaLaunchAttributeAccessPolicyWindow => {
            rec.w = [dword(val, 0), dword(val, 8)];
            rec.v = [word(val, 4), word(val, 5), word(val, 6)];
        }
        cu::cudaLaunchAttributeDeviceUpdatableKernelNode => {
            warn_once!("cudaLaunchAttributeDeviceUpdatableKernelNode: device-updatable kernel nodes are not supported");
            return Err(CudaError::NOT_SUPPORTED);
        }
        _ => return Err(CudaError::INVALID_VALUE),
    }
    Ok(rec)
}

/// The union's bytes for wire record `rec` (the reverse of [`to_wire`], events aside: no stream
/// or node gives one back).
pub fn from_wire(rec: &LaunchAttr) -> [u8; 64] {
    let mut val = [0u8; 64];
    let mut put = |at: usize, b: &[u8]| val[at..at + b.len()].copy_from_slice(b);
    match rec.id {
        cu::cudaLaunchAttributeAccessPolicyWindow => {
            put(0, &rec.w[0].to_le_bytes());
            put(8, &rec.w[1].to_le_bytes());
            for (i, v) in rec.v.iter().enumerate() {
                put(16 + 4 * i, &v.to_le_bytes());
            }
        }
        cu::cudaLaunchAttributeClusterDimension
        | cu::cudaLaunchAttributePreferredClusterDimension => {
            for (i, v) in rec.v.iter().enumerate() {
                put(4 * i, &v.to_le_bytes());
            }
        }
        cu::cudaLaunchAttributeMemSyncDomainMap => {
            put(0, &[rec.v[0].to_le_bytes()[0], rec.v[1].to_le_bytes()[0]]);
        }
        _ => put(0, &rec.v[0].to_le_bytes()),
    }
    val
}

/// The operations both faces offer, on the C types (the value as the union's pointer).
pub mod ops {
    use super::*;

    /// # Safety
    /// `value` must be null or readable for 64 bytes.
    unsafe fn read(value: *const cu::cudaLaunchAttributeValue) -> CudaResult<[u8; 64]> {
        non_null(value)?;
        // SAFETY: non-null and readable (caller's contract); the union is 64 plain bytes.
        Ok(unsafe { value.cast::<[u8; 64]>().read_unaligned() })
    }

    /// # Safety
    /// `value` must be null or writable for 64 bytes.
    unsafe fn write(value: *mut cu::cudaLaunchAttributeValue, bytes: [u8; 64]) -> CudaResult<()> {
        non_null(value)?;
        // SAFETY: non-null and writable (caller's contract).
        unsafe { value.cast::<[u8; 64]>().write_unaligned(bytes) };
        Ok(())
    }

    fn stream_attribute(id: c_uint) -> CudaResult<()> {
        if STREAM_ATTRIBUTES.contains(&id) {
            Ok(())
        } else {
            Err(CudaError::INVALID_VALUE)
        }
    }

    /// `cudaStreamSetAttribute`.
    ///
    /// # Safety
    /// `value` as the API documents.
    pub unsafe fn stream_set(
        stream: usize,
        id: c_uint,
        value: *const cu::cudaLaunchAttributeValue,
    ) -> CudaResult<()> {
        // SAFETY: forwarded contract.
        let val = unsafe { read(value) }?;
        stream_attribute(id)?;
        let (rt, _) = current()?;
        let rec = to_wire(rt, id, &val)?;
        let t = rt.streams.target(stream)?;
        rt.session.submit(
            Call::new(Op::StreamSetAttribute, t.device)
                .args(&[t.wire])
                .input(&rec.encode()),
        )?;
        Ok(())
    }

    /// The value of stream attribute `id` (the union's bytes).
    pub fn stream_value(stream: usize, id: c_uint) -> CudaResult<[u8; 64]> {
        stream_attribute(id)?;
        let (rt, _) = current()?;
        let t = rt.streams.target(stream)?;
        let mut out = [0u8; LAUNCH_ATTR_SIZE];
        rt.session.submit(
            Call::new(Op::StreamGetAttribute, t.device)
                .args(&[t.wire, u64::from(id)])
                .output(&mut out),
        )?;
        let rec = LaunchAttr::decode(&out).map_err(|_| CudaError::UNKNOWN)?;
        Ok(from_wire(&rec))
    }

    /// `cudaStreamGetAttribute`.
    ///
    /// # Safety
    /// `value` as the API documents.
    pub unsafe fn stream_get(
        stream: usize,
        id: c_uint,
        value: *mut cu::cudaLaunchAttributeValue,
    ) -> CudaResult<()> {
        non_null(value)?;
        let v = stream_value(stream, id)?;
        // SAFETY: forwarded contract.
        unsafe { write(value, v) }
    }

    /// `cudaStreamCopyAttributes`: every attribute a stream takes, from `src` to `dst`.
    pub fn stream_copy(dst: usize, src: usize) -> CudaResult<()> {
        let (rt, _) = current()?;
        let (d, s) = (rt.streams.target(dst)?, rt.streams.target(src)?);
        if d.device != s.device {
            return Err(CudaError::INVALID_VALUE);
        }
        for id in STREAM_ATTRIBUTES {
            let v = stream_value(src, id)?;
            let rec = to_wire(rt, id, &v)?;
            rt.session.submit(
                Call::new(Op::StreamSetAttribute, d.device)
                    .args(&[d.wire])
                    .input(&rec.encode()),
            )?;
        }
        Ok(())
    }

    /// `cudaGraphKernelNodeSetAttribute` on kernel node `node` (its handle).
    ///
    /// # Safety
    /// `value` as the API documents.
    pub unsafe fn kernel_node_set(
        node: u64,
        id: c_uint,
        value: *const cu::cudaLaunchAttributeValue,
    ) -> CudaResult<()> {
        // SAFETY: forwarded contract.
        let val = unsafe { read(value) }?;
        if node == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let rec = to_wire(rt, id, &val)?;
        rt.session.submit(
            Call::new(Op::GraphKernelNodeSetAttribute, d)
                .args(&[node])
                .input(&rec.encode()),
        )?;
        Ok(())
    }

    /// `cudaGraphKernelNodeGetAttribute`.
    ///
    /// # Safety
    /// `value` as the API documents.
    pub unsafe fn kernel_node_get(
        node: u64,
        id: c_uint,
        value: *mut cu::cudaLaunchAttributeValue,
    ) -> CudaResult<()> {
        non_null(value)?;
        if node == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        let mut out = [0u8; LAUNCH_ATTR_SIZE];
        rt.session.submit(
            Call::new(Op::GraphKernelNodeGetAttribute, d)
                .args(&[node, u64::from(id)])
                .output(&mut out),
        )?;
        let rec = LaunchAttr::decode(&out).map_err(|_| CudaError::UNKNOWN)?;
        // SAFETY: forwarded contract.
        unsafe { write(value, from_wire(&rec)) }
    }

    /// `cudaGraphKernelNodeCopyAttributes` (destination first).
    pub fn kernel_node_copy(dst: u64, src: u64) -> CudaResult<()> {
        if dst == 0 || src == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session
            .submit(Call::new(Op::GraphKernelNodeCopyAttributes, d).args(&[dst, src]))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_cross_the_wire_unchanged() {
        let rec = |id, v: [u32; 3], w: [u64; 2]| LaunchAttr { id, v, w };
        for (r, at) in [
            (rec(cu::cudaLaunchAttributePriority, [7, 0, 0], [0; 2]), 4),
            (
                rec(cu::cudaLaunchAttributeClusterDimension, [2, 1, 1], [0; 2]),
                12,
            ),
            (
                rec(cu::cudaLaunchAttributeMemSyncDomainMap, [1, 2, 0], [0; 2]),
                2,
            ),
            (
                rec(
                    cu::cudaLaunchAttributeAccessPolicyWindow,
                    [0x3f00_0000, 2, 1],
                    [0x7f00_1000, 1 << 20],
                ),
                28,
            ),
        ] {
            let bytes = from_wire(&r);
            assert!(bytes[at..].iter().all(|&b| b == 0));
            let again = encode(r.id, &bytes, |_| Err(CudaError::INVALID_VALUE)).unwrap();
            assert_eq!(again, r);
        }
        let event = |_| Err(CudaError::INVALID_RESOURCE_HANDLE);
        assert_eq!(
            encode(cu::cudaLaunchAttributeProgrammaticEvent, &[0; 64], event),
            Err(CudaError::INVALID_RESOURCE_HANDLE)
        );
        assert_eq!(
            encode(99, &[0; 64], |_| Ok(0)),
            Err(CudaError::INVALID_VALUE)
        );
    }
}

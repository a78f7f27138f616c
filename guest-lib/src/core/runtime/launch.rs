//! Kernel launches: from a registered kernel, a configuration and `void **args` to one
//! fire-and-forget `LaunchKernel` request.
//!
//! The configuration is checked against the device's limits first (cached attributes), so the
//! common mistakes (a zero or oversized grid or block, too much dynamic shared memory) fail at
//! the launch, as with NVIDIA's runtime, even though the launch itself does not wait for the
//! host. The error is `cudaErrorInvalidValue` for all of them: that is what NVIDIA's 13.0
//! runtime returns (measured on an H200, driver 580; older runtimes said
//! `cudaErrorInvalidConfiguration`). Failures the host finds (out of resources, a fault in the
//! kernel) surface at the next synchronising call.

use core::ffi::{c_int, c_void};

use qcuda_proto::{LaunchAttr, Op, MAX_LAUNCH_ATTRS};

use crate::{
    core::conv::{c_int_of, usize_of},
    core::cuda_error::{CudaError, CudaResult},
    core::launch::call_config::CallConfig,
    core::launch::params,
    core::modules,
    core::modules::registry::KernelRecord,
    core::runtime::managed,
    core::runtime::Runtime,
    core::transport::Call,
    core::warnings::warn_once,
    generated::{self as cu, cudaLaunchAttribute, cudaLaunchConfig_t, dim3},
};

/// The device limits a launch configuration is checked against.
const LIMITS: [cu::CUdevice_attribute; 8] = [
    cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    cu::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
    cu::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
    cu::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
    cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
    cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
    cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
    // Without opting in (cudaFuncSetAttribute); `launch` raises it to the kernel's opt-in.
    cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
];

/// Checks `config` against `limits` (values of [`LIMITS`], in order).
pub fn check_config(config: &CallConfig, limits: &[i32]) -> CudaResult<()> {
    let [max_threads, bx, by, bz, gx, gy, gz, max_smem] = limits else {
        return Ok(());
    };
    let (g, b) = (config.grid, config.block);
    let fits = |v: u32, max: &i32| v >= 1 && i64::from(v) <= i64::from(*max);
    let threads = u64::from(b.x) * u64::from(b.y) * u64::from(b.z);
    if !(fits(b.x, bx) && fits(b.y, by) && fits(b.z, bz))
        || threads > u64::try_from(*max_threads).unwrap_or(0)
        || !(fits(g.x, gx) && fits(g.y, gy) && fits(g.z, gz))
        || config.shared_mem as u64 > u64::try_from(*max_smem).unwrap_or(0)
    {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(())
}

/// The inline arguments of `LaunchKernel` (see qcuda-proto).
pub fn wire_args(function: u64, grid: dim3, block: dim3, smem: usize, stream: u64) -> [u64; 6] {
    let pair = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    [
        function,
        pair(grid.x, grid.y),
        pair(grid.z, block.x),
        pair(block.y, block.z),
        smem as u64,
        stream,
    ]
}

/// Launches `kernel` with `config` on the calling thread's current device.
///
/// # Safety
/// `args` must satisfy [`params::pack`]'s contract for this kernel.
pub unsafe fn launch(
    rt: &Runtime,
    kernel: &KernelRecord,
    config: &CallConfig,
    args: *const *const c_void,
) -> CudaResult<()> {
    // SAFETY: forwarded contract.
    unsafe { launch_with(rt, kernel, config, args, 0, None) }
}

/// [`launch`] with `LaunchKernel` flags (`LAUNCH_COOPERATIVE`), or, given encoded
/// `LaunchAttr` records, as `LaunchKernelEx` (flags 0).
///
/// # Safety
/// As for [`launch`].
pub unsafe fn launch_with(
    rt: &Runtime,
    kernel: &KernelRecord,
    config: &CallConfig,
    args: *const *const c_void,
    flags: u64,
    attrs: Option<&[u8]>,
) -> CudaResult<()> {
    let device = rt.devices.current()?;
    rt.session.check_sticky(device)?;
    let stream = rt.streams.target(config.stream)?;
    let opted_in = kernel
        .max_dynamic_smem
        .load(std::sync::atomic::Ordering::Relaxed);
    check_limits(rt, device, config, opted_in)?;
    let resolved = modules::kernel(&rt.session, kernel, device)?;
    // SAFETY: forwarded caller contract; `resolved.params` is this kernel's layout.
    let block = unsafe { params::pack(&resolved.params, args)? };
    submit(
        rt,
        device,
        resolved.function,
        config,
        stream.wire,
        &block,
        flags,
        attrs,
    )
}

/// Checks `config` against the cached limits of `device`, the dynamic shared memory limit
/// raised to what the kernel was opted into. If the limits cannot be had, the host checks the
/// configuration instead.
pub fn check_limits(
    rt: &Runtime,
    device: u32,
    config: &CallConfig,
    opted_in: u32,
) -> CudaResult<()> {
    if let Ok(cached) = rt.devices.launch_limits(&rt.session, device, &LIMITS) {
        let mut limits = [0i32; LIMITS.len()];
        if cached.len() == limits.len() {
            limits.copy_from_slice(cached);
            if let Some(smem) = limits.last_mut() {
                *smem = (*smem).max(i32::try_from(opted_in).unwrap_or(i32::MAX));
            }
            check_config(config, &limits)?;
        }
    }
    Ok(())
}

/// Sends one launch of host function `function` on `device` with the packed parameter block:
/// `LaunchKernel` (with `LAUNCH_*` flags), or `LaunchKernelEx` given encoded `LaunchAttr`
/// records; fire-and-forget. Both API faces launch through here, with the stream
/// (`config.stream`) already resolved to its wire handle `stream` by the caller.
#[allow(clippy::too_many_arguments)]
pub fn submit(
    rt: &Runtime,
    device: u32,
    function: u64,
    config: &CallConfig,
    stream: u64,
    block: &[u8],
    flags: u64,
    attrs: Option<&[u8]>,
) -> CudaResult<()> {
    managed::before_launch(rt, device, stream)?;
    let op = if attrs.is_some() {
        Op::LaunchKernelEx
    } else {
        Op::LaunchKernel
    };
    let mut call = Call::new(op, device)
        .args(&{
            let mut a = [0u64; 7];
            a[..6].copy_from_slice(&wire_args(
                function,
                config.grid,
                config.block,
                config.shared_mem,
                stream,
            ));
            a[6] = flags;
            a
        })
        .input(block);
    if let Some(attrs) = attrs {
        call = call.input(attrs);
    }
    rt.session.submit(call.fire_and_forget())?;
    Ok(())
}

/// Reads the `i`th 32-bit word of a launch attribute's value union.
fn word(val: &[u8; 64], i: usize) -> u32 {
    u32::from_le_bytes([val[4 * i], val[4 * i + 1], val[4 * i + 2], val[4 * i + 3]])
}

fn dword(val: &[u8; 64], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&val[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The wire records of `config`'s attributes (one `Ignore` record when there are none, so the
/// op always carries its buffer). Unknown ids are `cudaErrorInvalidValue`, as the driver
/// answers; events must be the application's; the device-updatable node attribute belongs to
/// graphs, which qcuda does not support.
///
/// # Safety
/// `config.attrs` holds `config.numAttrs` attributes (API contract).
pub unsafe fn wire_attrs(rt: &Runtime, config: &cudaLaunchConfig_t) -> CudaResult<Vec<u8>> {
    let n = config.numAttrs as usize;
    if n > 0 && config.attrs.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    if n > MAX_LAUNCH_ATTRS {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut out = Vec::with_capacity(n.max(1) * qcuda_proto::LAUNCH_ATTR_SIZE);
    for i in 0..n {
        // SAFETY: `attrs` holds `n` attributes (caller's contract).
        let a: cudaLaunchAttribute = unsafe { config.attrs.add(i).read_unaligned() };
        // SAFETY: every bit pattern is a valid byte array; the union is 64 bytes.
        let val: [u8; 64] = unsafe { core::mem::transmute(a.val) };
        let mut rec = LaunchAttr {
            id: a.id,
            ..LaunchAttr::default()
        };
        match a.id {
            cu::cudaLaunchAttributeIgnore => {}
            cu::cudaLaunchAttributeCooperative
            | cu::cudaLaunchAttributeSynchronizationPolicy
            | cu::cudaLaunchAttributeClusterSchedulingPolicyPreference
            | cu::cudaLaunchAttributeProgrammaticStreamSerialization
            | cu::cudaLaunchAttributePriority
            | cu::cudaLaunchAttributeMemSyncDomain
            | cu::cudaLaunchAttributePreferredSharedMemoryCarveout
            | cu::cudaLaunchAttributeNvlinkUtilCentricScheduling => rec.v[0] = word(&val, 0),
            cu::cudaLaunchAttributeClusterDimension
            | cu::cudaLaunchAttributePreferredClusterDimension => {
                rec.v = [word(&val, 0), word(&val, 1), word(&val, 2)];
            }
            cu::cudaLaunchAttributeMemSyncDomainMap => {
                rec.v = [u32::from(val[0]), u32::from(val[1]), 0];
            }
            cu::cudaLaunchAttributeProgrammaticEvent
            | cu::cudaLaunchAttributeLaunchCompletionEvent => {
                let event = rt.events.info(usize_of(dword(&val, 0)))?;
                rec.w[0] = event.host;
                rec.v = [word(&val, 2), word(&val, 3), 0];
                if a.id == cu::cudaLaunchAttributeLaunchCompletionEvent {
                    rec.v[1] = 0;
                }
            }
            cu::cudaLaunchAttributeAccessPolicyWindow => {
                rec.w = [dword(&val, 0), dword(&val, 8)];
                rec.v = [word(&val, 4), word(&val, 5), word(&val, 6)];
            }
            cu::cudaLaunchAttributeDeviceUpdatableKernelNode => {
                warn_once!(
                    "cudaLaunchAttributeDeviceUpdatableKernelNode: graphs are not supported"
                );
                return Err(CudaError::NOT_SUPPORTED);
            }
            _ => return Err(CudaError::INVALID_VALUE),
        }
        out.extend_from_slice(&rec.encode());
    }
    if out.is_empty() {
        out.extend_from_slice(&LaunchAttr::default().encode());
    }
    Ok(out)
}

/// The cluster occupancy of host function `f` on `device` (`OccupancyCluster`): the most
/// clusters resident at once (`active`) or the largest cluster size. Both faces' cluster
/// occupancy queries.
///
/// # Safety
/// `c.attrs` holds `c.numAttrs` attributes (API contract).
pub unsafe fn cluster_occupancy_of(
    rt: &Runtime,
    device: u32,
    f: u64,
    c: &cudaLaunchConfig_t,
    active: bool,
) -> CudaResult<c_int> {
    // SAFETY: forwarded contract.
    let attrs = unsafe { wire_attrs(rt, c) }?;
    let mut args = [0u64; 7];
    args[..6].copy_from_slice(&wire_args(f, c.gridDim, c.blockDim, c.dynamicSmemBytes, 0));
    args[6] = u64::from(active);
    let reply = rt.session.submit(
        Call::new(Op::OccupancyCluster, device)
            .args(&args)
            .input(&attrs),
    )?;
    Ok(c_int_of(reply.rets[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: [i32; 8] = [1024, 1024, 1024, 64, i32::MAX, 65535, 65535, 49152];

    fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32), smem: usize) -> CallConfig {
        CallConfig {
            grid: dim3 {
                x: grid.0,
                y: grid.1,
                z: grid.2,
            },
            block: dim3 {
                x: block.0,
                y: block.1,
                z: block.2,
            },
            shared_mem: smem,
            stream: 0,
        }
    }

    #[test]
    fn valid_configurations_pass() {
        check_config(&cfg((1, 1, 1), (1, 1, 1), 0), &H100).unwrap();
        check_config(
            &cfg((u32::MAX >> 1, 65535, 65535), (1024, 1, 1), 49152),
            &H100,
        )
        .unwrap();
        check_config(&cfg((4096, 1, 1), (16, 16, 4), 0), &H100).unwrap();
    }

    #[test]
    fn invalid_configurations_fail_like_cuda_13() {
        // The cases measured with NVIDIA's 13.0 runtime: all cudaErrorInvalidValue.
        let bad = Err(CudaError::INVALID_VALUE);
        assert_eq!(check_config(&cfg((0, 1, 1), (32, 1, 1), 0), &H100), bad);
        assert_eq!(check_config(&cfg((1, 1, 1), (0, 1, 1), 0), &H100), bad);
        assert_eq!(check_config(&cfg((1, 1, 1), (2048, 1, 1), 0), &H100), bad);
        assert_eq!(
            check_config(&cfg((1, 1, 1), (32, 32, 2), 0), &H100),
            bad,
            "2048 threads"
        );
        assert_eq!(check_config(&cfg((1, 1, 1), (1, 1, 65), 0), &H100), bad);
        assert_eq!(check_config(&cfg((1, 70000, 1), (1, 1, 1), 0), &H100), bad);
        assert_eq!(check_config(&cfg((1, 1, 1), (32, 1, 1), 60000), &H100), bad);
        assert_eq!(
            check_config(&cfg((1, 1, 1), (32, 1, 1), 300_000), &H100),
            bad
        );
    }

    #[test]
    fn wire_args_pack_dimensions_in_pairs() {
        let a = wire_args(
            9,
            dim3 { x: 1, y: 2, z: 3 },
            dim3 { x: 4, y: 5, z: 6 },
            128,
            77,
        );
        assert_eq!(a, [9, 1 | 2 << 32, 3 | 4 << 32, 5 | 6 << 32, 128, 77]);
    }
}

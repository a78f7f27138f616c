//! Kernel launches and host functions. A driver launch goes out exactly as a runtime launch:
//! checked against the device's cached limits, the parameters packed by the kernel's layout,
//! one fire-and-forget `LaunchKernel` in the session's batch.

use core::ffi::{c_uint, c_void};

use super::{initialized, via_core};
use crate::core::runtime::context;
use crate::{
    core::launch::call_config::CallConfig,
    core::launch::params,
    core::runtime::launch,
    core::runtime::runtime,
    driver::{
        modules::{self, Function},
        status::{DriverError, DrvResult},
    },
    generated::{cudaLaunchConfig_t, dim3, driver_api as d},
};

/// `CU_LAUNCH_PARAM_END`, `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE` (cuda.h
/// defines them as pointer-valued macros, which bindgen does not carry).
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// The parameter block of a launch: from `kernelParams` (one pointer per parameter) or from
/// `extra` (`CU_LAUNCH_PARAM_BUFFER_POINTER`/`SIZE`: the block already laid out). Exactly one
/// of them must be given, unless the kernel takes no parameters.
///
/// # Safety
/// As `cuLaunchKernel` documents for `kernelParams` and `extra`.
#[inline(always)]
pub(super) unsafe fn parameter_block(
    f: &Function,
    args: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> DrvResult<params::ParamBlock> {
    if extra.is_null() {
        // SAFETY: forwarded contract: one pointer per parameter.
        return Ok(unsafe { params::pack(&f.resolved.params, args as *const *const c_void) }?);
    }
    if !args.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    let (mut buffer, mut size) = (std::ptr::null::<u8>(), None::<usize>);
    for i in (0..64).step_by(2) {
        // SAFETY: `extra` is a list of (key, value) pairs ended by CU_LAUNCH_PARAM_END.
        let key = unsafe { *extra.add(i) } as usize;
        if key == PARAM_END {
            break;
        }
        // SAFETY: each key has its value.
        let value = unsafe { *extra.add(i + 1) };
        match key {
            PARAM_BUFFER_POINTER => buffer = value.cast(),
            PARAM_BUFFER_SIZE if !value.is_null() => {
                // SAFETY: the value of BUFFER_SIZE points to a size_t.
                size = Some(unsafe { value.cast::<usize>().read_unaligned() });
            }
            _ => return Err(DriverError::INVALID_VALUE),
        }
    }
    let need = params::block_len(&f.resolved.params)?;
    let size = size.ok_or(DriverError::INVALID_VALUE)?;
    if buffer.is_null() || size < need {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: the caller's block is `size` >= `need` bytes long.
    Ok(params::ParamBlock::copy_of(unsafe {
        std::slice::from_raw_parts(buffer, need)
    }))
}

/// One launch of `f` in its context's device.
///
/// # Safety
/// As `cuLaunchKernel` documents.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_function(
    f: &'static Function,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: d::CUstream,
    args: *mut *mut c_void,
    extra: *mut *mut c_void,
    flags: u64,
    attrs: Option<&[u8]>,
) -> DrvResult<()> {
    let rt = runtime()?;
    let device = f.module.device;
    rt.session.check_sticky(device)?;
    let config = CallConfig {
        grid: dim3 {
            x: grid[0],
            y: grid[1],
            z: grid[2],
        },
        block: dim3 {
            x: block[0],
            y: block[1],
            z: block[2],
        },
        shared_mem: shared as usize,
        stream: stream as usize,
    };
    let target = rt.streams.target(config.stream)?;
    if target.device != device {
        return Err(DriverError::INVALID_HANDLE);
    }
    launch::check_limits(
        rt,
        device,
        &config,
        f.max_dynamic_smem
            .load(std::sync::atomic::Ordering::Relaxed),
    )?;
    // SAFETY: forwarded contract.
    let block = unsafe { parameter_block(f, args, extra) }?;
    // The launch loads it on the host, if nothing did before.
    f.note_loaded();
    Ok(launch::submit(
        rt,
        device,
        f.resolved.function,
        &config,
        target.wire,
        &block,
        flags,
        attrs,
    )?)
}

/// A driver launch configuration as the runtime's: the same fields, and attributes of the same
/// layout and ids.
fn runtime_config(c: &d::CUlaunchConfig) -> cudaLaunchConfig_t {
    cudaLaunchConfig_t {
        gridDim: dim3 {
            x: c.gridDimX,
            y: c.gridDimY,
            z: c.gridDimZ,
        },
        blockDim: dim3 {
            x: c.blockDimX,
            y: c.blockDimY,
            z: c.blockDimZ,
        },
        dynamicSmemBytes: c.sharedMemBytes as usize,
        stream: c.hStream.cast(),
        attrs: c.attrs.cast(),
        numAttrs: c.numAttrs,
    }
}

/// `cuOccupancyMaxActiveClusters` (`active`) and `cuOccupancyMaxPotentialClusterSize`.
///
/// # Safety
/// `config` as the API documents.
unsafe fn cluster_occupancy(
    out: *mut core::ffi::c_int,
    f: d::CUfunction,
    config: *const d::CUlaunchConfig,
    active: bool,
) -> DrvResult<()> {
    initialized()?;
    if out.is_null() || config.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: non-null and readable (API contract).
    let c = unsafe { config.read_unaligned() };
    let func = modules::launchable(f as usize)?;
    let rt = runtime()?;
    // SAFETY: forwarded contract (attributes).
    let n = unsafe {
        launch::cluster_occupancy_of(
            rt,
            func.module.device,
            func.resolved.function,
            &runtime_config(&c),
            active,
        )
    }?;
    if crate::driver::trace::enabled() {
        crate::driver::trace::log(format_args!(
            "cluster occupancy of {} ({}x{}x{} blocks of {}x{}x{}, {} B, {} attributes): {n}",
            func.name.to_string_lossy(),
            c.gridDimX,
            c.gridDimY,
            c.gridDimZ,
            c.blockDimX,
            c.blockDimY,
            c.blockDimZ,
            c.sharedMemBytes,
            c.numAttrs
        ));
    }
    // SAFETY: checked non-null.
    unsafe { out.write_unaligned(n) };
    Ok(())
}

driver_api! {
    /// `cuOccupancyMaxActiveClusters`.
    fn cuOccupancyMaxActiveClusters(numClusters: *mut ::core::ffi::c_int, func: d::CUfunction, config: *const d::CUlaunchConfig) {
        // SAFETY: forwarded contract.
        unsafe { cluster_occupancy(numClusters, func, config, true) }
    }

    /// `cuOccupancyMaxPotentialClusterSize`.
    fn cuOccupancyMaxPotentialClusterSize(clusterSize: *mut ::core::ffi::c_int, func: d::CUfunction, config: *const d::CUlaunchConfig) {
        // SAFETY: forwarded contract.
        unsafe { cluster_occupancy(clusterSize, func, config, false) }
    }

    /// `cuLaunchKernel` (a `CUfunction` or a `CUkernel`).
    #[per_thread(cuLaunchKernel_ptsz)]
    fn cuLaunchKernel(
        f: d::CUfunction,
        gridDimX: c_uint,
        gridDimY: c_uint,
        gridDimZ: c_uint,
        blockDimX: c_uint,
        blockDimY: c_uint,
        blockDimZ: c_uint,
        sharedMemBytes: c_uint,
        hStream: d::CUstream,
        kernelParams: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        initialized()?;
        let func = modules::launchable(f as usize)?;
        // SAFETY: forwarded contract.
        unsafe {
            launch_function(
                func,
                [gridDimX, gridDimY, gridDimZ],
                [blockDimX, blockDimY, blockDimZ],
                sharedMemBytes,
                hStream,
                kernelParams,
                extra,
                0,
                None,
            )
        }
    }

    /// `cuLaunchCooperativeKernel`.
    #[per_thread(cuLaunchCooperativeKernel_ptsz)]
    fn cuLaunchCooperativeKernel(
        f: d::CUfunction,
        gridDimX: c_uint,
        gridDimY: c_uint,
        gridDimZ: c_uint,
        blockDimX: c_uint,
        blockDimY: c_uint,
        blockDimZ: c_uint,
        sharedMemBytes: c_uint,
        hStream: d::CUstream,
        kernelParams: *mut *mut c_void,
    ) {
        initialized()?;
        let func = modules::launchable(f as usize)?;
        // SAFETY: forwarded contract.
        unsafe {
            launch_function(
                func,
                [gridDimX, gridDimY, gridDimZ],
                [blockDimX, blockDimY, blockDimZ],
                sharedMemBytes,
                hStream,
                kernelParams,
                std::ptr::null_mut(),
                qcuda_proto::LAUNCH_COOPERATIVE,
                None,
            )
        }
    }

    /// `cuLaunchKernelEx`: the launch attributes are the runtime's (same ids and layout).
    #[per_thread(cuLaunchKernelEx_ptsz)]
    fn cuLaunchKernelEx(
        config: *const d::CUlaunchConfig,
        f: d::CUfunction,
        kernelParams: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        initialized()?;
        if config.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: non-null and readable (API contract).
        let c = unsafe { config.read_unaligned() };
        let func = modules::launchable(f as usize)?;
        let rt = runtime()?;
        let as_runtime = runtime_config(&c);
        // SAFETY: CUlaunchAttribute and cudaLaunchAttribute share layout and ids.
        let attrs = unsafe { launch::wire_attrs(rt, &as_runtime) }?;
        let attrs = (c.numAttrs > 0).then_some(attrs.as_slice());
        // SAFETY: forwarded contract.
        unsafe {
            launch_function(
                func,
                [c.gridDimX, c.gridDimY, c.gridDimZ],
                [c.blockDimX, c.blockDimY, c.blockDimZ],
                c.sharedMemBytes,
                c.hStream,
                kernelParams,
                extra,
                0,
                attrs,
            )
        }
    }

    /// `cuLaunchHostFunc`.
    #[per_thread(cuLaunchHostFunc_ptsz)]
    fn cuLaunchHostFunc(hStream: d::CUstream, fn_: d::CUhostFn, userData: *mut c_void) {
        initialized()?;
        context::require_current()?;
        // CUhostFn and cudaHostFn_t are the same C type.
        via_core(|| crate::core::runtime::streams::launch_host_func(hStream as usize, fn_, userData))
    }
}

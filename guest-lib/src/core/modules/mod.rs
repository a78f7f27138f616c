//! Modules: what static constructors register (`registry`, the fatbin image's header in
//! `fatbin`), lazy loading on each device (this file), and `__managed__` variables
//! (`managed_vars`). Each takes the session it sends requests through.
//!
//! Lazy module loading: the first launch of a kernel (or first access to a device variable) on a
//! device sends that fatbin's whole image to the host with `ModuleLoad`, then resolves the kernel
//! (`ModuleGetFunction`, which also returns its parameter layout) or variable
//! (`ModuleGetGlobal`). Every result is cached per device in the registry's records; a load
//! that fails because of the image itself is cached too, so a broken image is sent only once.
//!
//! Loading happens under the fatbin's lock, so concurrent first launches load once and other
//! fatbins are not held up.

use crate::core::conv::usize_of;
use std::sync::Arc;

use qcuda_proto::{Op, ParamInfo, PARAM_INFO_SIZE};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::modules::registry::{
        per_device, DeviceGlobal, FatbinRecord, KernelRecord, ResolvedKernel, VarRecord,
    },
    core::transport::session::Session,
    core::transport::Call,
    core::warnings::warn_once,
    generated as cu,
};

pub mod fatbin;
pub mod managed_vars;
pub mod registry;

/// Parameter records asked for at first; kernels with more are asked again.
const FIRST_PARAM_GUESS: usize = 64;
/// A bound on parameter counts (CUDA allows 32764 bytes of parameters).
const MAX_PARAMS: u64 = 32_768;

/// Whether a load error is a property of the image on this device (so retrying cannot help).
fn is_image_error(e: CudaError) -> bool {
    matches!(
        e.code(),
        cu::cudaErrorInvalidKernelImage
            | cu::cudaErrorNoKernelImageForDevice
            | cu::cudaErrorInvalidPtx
            | cu::cudaErrorUnsupportedPtxVersion
            | cu::cudaErrorJitCompilerNotFound
            | cu::cudaErrorJitCompilationDisabled
            | cu::cudaErrorInvalidSource
            | cu::cudaErrorSharedObjectSymbolNotFound
            | cu::cudaErrorSharedObjectInitFailed
    )
}

/// The host module of `fatbin` on `device`, loading it on first use.
pub fn module(session: &Session, fatbin: &FatbinRecord, device: u32) -> CudaResult<u64> {
    let mut modules = per_device(&fatbin.modules);
    if let Some((_, m)) = modules.iter().find(|(d, _)| *d == device) {
        return *m;
    }
    if !fatbin.is_live() {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    let image = match fatbin.image {
        Ok(image) => image,
        Err(why) => {
            warn_once!("an embedded fatbin cannot be used: {why:?}");
            return Err(CudaError::INVALID_KERNEL_IMAGE);
        }
    };
    let result = session
        .submit(Call::new(Op::ModuleLoad, device).input(image))
        .map(|reply| reply.rets[0]);
    match result {
        Ok(_) => modules.push((device, result)),
        Err(e) if is_image_error(e) => modules.push((device, result)),
        Err(_) => {}
    }
    result
}

/// `kernel` resolved on `device`: its function handle and parameter layout.
pub fn kernel(
    session: &Session,
    kernel: &KernelRecord,
    device: u32,
) -> CudaResult<Arc<ResolvedKernel>> {
    if let Some((_, k)) = per_device(&kernel.resolved)
        .iter()
        .find(|(d, _)| *d == device)
    {
        return Ok(k.clone());
    }
    let module = module(session, kernel.fatbin, device)?;
    let resolved = Arc::new(function(session, device, module, kernel.name.as_bytes())?);
    let mut cache = per_device(&kernel.resolved);
    // Another thread may have resolved it meanwhile; both answers are the same.
    if let Some((_, k)) = cache.iter().find(|(d, _)| *d == device) {
        return Ok(k.clone());
    }
    cache.push((device, resolved.clone()));
    Ok(resolved)
}

/// The kernel `name` of host module `module` on `device`: its function handle and parameter
/// layout (`ModuleGetFunction`). Shared by the runtime face's registered kernels and the driver
/// face's `cuModuleGetFunction`.
pub fn function(
    session: &Session,
    device: u32,
    module: u64,
    name: &[u8],
) -> CudaResult<ResolvedKernel> {
    let mut records = vec![0u8; FIRST_PARAM_GUESS * PARAM_INFO_SIZE];
    let (function, count) = loop {
        let reply = session.submit(
            Call::new(Op::ModuleGetFunction, device)
                .args(&[module])
                .input(name)
                .output(&mut records),
        )?;
        let count = reply.rets[1];
        if count > MAX_PARAMS {
            return Err(CudaError::UNKNOWN);
        }
        let count = usize_of(count);
        if count * PARAM_INFO_SIZE <= records.len() {
            break (reply.rets[0], count);
        }
        records = vec![0u8; count * PARAM_INFO_SIZE];
    };
    let params = records[..count * PARAM_INFO_SIZE]
        .chunks_exact(PARAM_INFO_SIZE)
        .map(|c| ParamInfo::decode(c).map_err(|_| CudaError::UNKNOWN))
        .collect::<CudaResult<Vec<_>>>()?;
    Ok(ResolvedKernel { function, params })
}

/// The device address and size of global `name` of host module `module` on `device`.
pub fn module_global(
    session: &Session,
    device: u32,
    module: u64,
    name: &[u8],
) -> CudaResult<DeviceGlobal> {
    let reply = session.submit(
        Call::new(Op::ModuleGetGlobal, device)
            .args(&[module])
            .input(name),
    )?;
    Ok(DeviceGlobal {
        addr: reply.rets[0],
        size: reply.rets[1],
    })
}

/// `var` resolved on `device`: its device address and size.
pub fn global(session: &Session, var: &VarRecord, device: u32) -> CudaResult<DeviceGlobal> {
    if let Some((_, g)) = per_device(&var.resolved).iter().find(|(d, _)| *d == device) {
        return Ok(*g);
    }
    let module = module(session, var.fatbin, device)?;
    let g = module_global(session, device, module, var.name.as_bytes())?;
    let mut cache = per_device(&var.resolved);
    if !cache.iter().any(|(d, _)| *d == device) {
        cache.push((device, g));
    }
    Ok(g)
}

/// Unloads the modules of an unregistered fatbin (best effort: at process exit the host frees
/// them with the session anyway).
pub fn unload(session: &Session, fatbin: &FatbinRecord) {
    let loaded: Vec<(u32, CudaResult<u64>)> = per_device(&fatbin.modules).drain(..).collect();
    for (device, m) in loaded {
        if let Ok(m) = m {
            let _ = session.submit(Call::new(Op::ModuleUnload, device).args(&[m]));
        }
    }
}

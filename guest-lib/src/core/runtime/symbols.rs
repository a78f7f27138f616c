//! Device variables by their host shadow: `cudaMemcpyToSymbol`, `cudaMemcpyFromSymbol` (and the
//! `Async` forms), `cudaGetSymbolAddress`, `cudaGetSymbolSize`.
//!
//! The symbol is the address of the host shadow nvcc registered with `__cudaRegisterVar`; its
//! device address comes from `ModuleGetGlobal` once per device (`modules.rs`), after which a
//! symbol copy is an ordinary copy at that address.

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::modules,
    core::modules::registry::{DeviceGlobal, Registry},
    core::runtime::memory::{self, Ordering},
    core::runtime::Runtime,
    generated::{self as cu, cudaMemcpyKind},
};

/// The device variable registered for host shadow `symbol`, resolved on `device`.
pub fn global(
    rt: &Runtime,
    registry: &Registry,
    symbol: usize,
    device: u32,
) -> CudaResult<DeviceGlobal> {
    let var = registry.var(symbol).ok_or(CudaError::INVALID_SYMBOL)?;
    modules::global(&rt.session, var, device)
}

/// The device range `offset..offset + count` of the variable, checked against its size.
pub fn range(g: DeviceGlobal, count: usize, offset: usize) -> CudaResult<u64> {
    let end = (offset as u64)
        .checked_add(count as u64)
        .ok_or(CudaError::INVALID_VALUE)?;
    if end > g.size {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(g.addr + offset as u64)
}

/// `cudaMemcpyToSymbol[Async]`: `kind` is host-to-device, device-to-device or default.
///
/// # Safety
/// For a host source, `src` must be readable for `count` bytes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn copy_to(
    rt: &Runtime,
    registry: &Registry,
    symbol: usize,
    src: u64,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    order: Ordering,
) -> CudaResult<()> {
    if !matches!(
        kind,
        cu::cudaMemcpyHostToDevice | cu::cudaMemcpyDeviceToDevice | cu::cudaMemcpyDefault
    ) {
        return Err(CudaError::INVALID_MEMCPY_DIRECTION);
    }
    let g = global(rt, registry, symbol, order.device)?;
    let dst = range(g, count, offset)?;
    // Module globals are not in the allocation table, so "default" is resolved here.
    let kind = match kind {
        cu::cudaMemcpyDefault if rt.allocations.find(src).is_some() => cu::cudaMemcpyDeviceToDevice,
        cu::cudaMemcpyDefault => cu::cudaMemcpyHostToDevice,
        k => k,
    };
    // SAFETY: forwarded caller contract; the destination is device memory.
    unsafe { memory::memcpy(rt, dst, src, count, kind, order) }
}

/// `cudaMemcpyFromSymbol[Async]`: `kind` is device-to-host, device-to-device or default.
///
/// # Safety
/// For a host destination, `dst` must be writable for `count` bytes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn copy_from(
    rt: &Runtime,
    registry: &Registry,
    dst: u64,
    symbol: usize,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    order: Ordering,
) -> CudaResult<()> {
    if !matches!(
        kind,
        cu::cudaMemcpyDeviceToHost | cu::cudaMemcpyDeviceToDevice | cu::cudaMemcpyDefault
    ) {
        return Err(CudaError::INVALID_MEMCPY_DIRECTION);
    }
    let g = global(rt, registry, symbol, order.device)?;
    let src = range(g, count, offset)?;
    let kind = match kind {
        cu::cudaMemcpyDefault if rt.allocations.find(dst).is_some() => cu::cudaMemcpyDeviceToDevice,
        cu::cudaMemcpyDefault => cu::cudaMemcpyDeviceToHost,
        k => k,
    };
    // SAFETY: forwarded caller contract; the source is device memory.
    unsafe { memory::memcpy(rt, dst, src, count, kind, order) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_stays_inside_the_variable() {
        let g = DeviceGlobal {
            addr: 0x1000,
            size: 64,
        };
        assert_eq!(range(g, 64, 0), Ok(0x1000));
        assert_eq!(range(g, 4, 60), Ok(0x103c));
        assert_eq!(range(g, 0, 64), Ok(0x1040));
        assert_eq!(range(g, 4, 61), Err(CudaError::INVALID_VALUE));
        assert_eq!(range(g, usize::MAX, 1), Err(CudaError::INVALID_VALUE));
    }
}

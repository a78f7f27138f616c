//! Device variables by host shadow: `cudaMemcpyToSymbol`, `cudaMemcpyFromSymbol` (each with its
//! `Async` form and per-thread-default-stream spellings), `cudaGetSymbolAddress`,
//! `cudaGetSymbolSize`.

use crate::core::conv::usize_of;
use core::ffi::c_void;

use super::write_out;
use crate::{
    core::cuda_error::CudaResult,
    core::runtime::memory::Ordering,
    core::runtime::symbols,
    core::runtime::{current, non_null, registry},
    generated::{cudaMemcpyKind, cudaStream_t},
};

fn order(
    stream: Option<cudaStream_t>,
) -> CudaResult<(&'static crate::core::runtime::Runtime, Ordering)> {
    let (rt, device) = current()?;
    Ok(match stream {
        None => (
            rt,
            Ordering {
                device,
                stream: 0,
                is_async: false,
            },
        ),
        Some(s) => {
            let t = rt.streams.target(s as usize)?;
            (
                rt,
                Ordering {
                    device: t.device,
                    stream: t.wire,
                    is_async: true,
                },
            )
        }
    })
}

unsafe fn to_symbol(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: Option<cudaStream_t>,
) -> CudaResult<()> {
    let (rt, order) = order(stream)?;
    // SAFETY: forwarded API contract for the source range.
    unsafe {
        symbols::copy_to(
            rt,
            registry(),
            symbol as usize,
            src as u64,
            count,
            offset,
            kind,
            order,
        )
    }
}

unsafe fn from_symbol(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: Option<cudaStream_t>,
) -> CudaResult<()> {
    let (rt, order) = order(stream)?;
    // SAFETY: forwarded API contract for the destination range.
    unsafe {
        symbols::copy_from(
            rt,
            registry(),
            dst as u64,
            symbol as usize,
            count,
            offset,
            kind,
            order,
        )
    }
}

cuda_api! {
    /// `cudaMemcpyToSymbol`.
    #[per_thread(cudaMemcpyToSymbol_ptds)]
    fn cudaMemcpyToSymbol(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind) {
        // SAFETY: forwarded API contract.
        unsafe { to_symbol(symbol, src, count, offset, kind, None) }
    }

    /// `cudaMemcpyToSymbolAsync`.
    #[per_thread(cudaMemcpyToSymbolAsync_ptsz)]
    fn cudaMemcpyToSymbolAsync(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t) {
        // SAFETY: forwarded API contract.
        unsafe { to_symbol(symbol, src, count, offset, kind, Some(stream)) }
    }

    /// `cudaMemcpyFromSymbol`.
    #[per_thread(cudaMemcpyFromSymbol_ptds)]
    fn cudaMemcpyFromSymbol(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind) {
        // SAFETY: forwarded API contract.
        unsafe { from_symbol(dst, symbol, count, offset, kind, None) }
    }

    /// `cudaMemcpyFromSymbolAsync`.
    #[per_thread(cudaMemcpyFromSymbolAsync_ptsz)]
    fn cudaMemcpyFromSymbolAsync(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t) {
        // SAFETY: forwarded API contract.
        unsafe { from_symbol(dst, symbol, count, offset, kind, Some(stream)) }
    }

    /// `cudaGetSymbolAddress`: the device address of a `__device__`/`__constant__` variable.
    fn cudaGetSymbolAddress(devPtr: *mut *mut c_void, symbol: *const c_void) {
        non_null(devPtr)?;
        let (rt, d) = current()?;
        let g = symbols::global(rt, registry(), symbol as usize, d)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(devPtr, g.addr as *mut c_void) }
    }

    /// `cudaGetSymbolSize`.
    fn cudaGetSymbolSize(size: *mut usize, symbol: *const c_void) {
        non_null(size)?;
        let (rt, d) = current()?;
        let g = symbols::global(rt, registry(), symbol as usize, d)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(size, usize_of(g.size)) }
    }
}

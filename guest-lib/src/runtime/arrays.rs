//! Pitched memory, 2D/3D copies and memsets, CUDA arrays and mipmapped arrays
//! (`cudaMallocPitch`, `cudaMalloc3D`, `cudaMemset2D/3D`, `cudaMemcpy2D*`, `cudaMemcpy3D`,
//! `cudaMemcpy*Array*`, `cudaMalloc*Array`, ...). The copies all go through copy3d.rs; the
//! `_ptds`/`_ptsz` exports are the per-thread-default-stream spellings.
// CUDA's own signatures take up to nine arguments.
#![allow(clippy::too_many_arguments)]

use crate::core::conv::usize_of;
use core::ffi::{c_int, c_uint, c_void};

use super::write_out;
use crate::{
    core::arrays::{self, channel_desc},
    core::cuda_error::{CudaError, CudaResult},
    core::runtime::arrays::{self as array_ops, *},
    core::runtime::{current, non_null},
    generated::{
        cudaArray_const_t, cudaArray_t, cudaChannelFormatDesc, cudaExtent, cudaMemcpy3DParms,
        cudaMemcpyKind, cudaMipmappedArray_const_t, cudaMipmappedArray_t, cudaPitchedPtr,
        cudaStream_t,
    },
};

/// `cudaMallocArray`/`cudaMalloc3DArray`/`cudaMallocMipmappedArray`: the new handle to `out`.
fn create_array(
    out: *mut u64,
    desc: *const cudaChannelFormatDesc,
    extent: [u64; 3],
    flags: c_uint,
    levels: u32,
) -> CudaResult<()> {
    non_null(out)?;
    non_null(desc)?;
    // SAFETY: non-null and readable (API contract).
    let desc = unsafe { *desc };
    let h = array_ops::create_array(&desc, extent, flags, levels)?;
    // SAFETY: non-null and writable (API contract).
    unsafe { write_out(out, h) }
}

cuda_api! {
    /// `cudaMallocPitch`: the pitch is the driver's (cuMemAllocPitch).
    fn cudaMallocPitch(devPtr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) {
        non_null(devPtr)?;
        non_null(pitch)?;
        let (p, pp) = array_ops::malloc_pitch_current(width as u64, height as u64)?;
        // SAFETY: non-null and writable (API contract).
        unsafe {
            write_out(devPtr, p as *mut c_void)?;
            write_out(pitch, usize_of(pp))
        }
    }

    /// `cudaMalloc3D`: pitched memory of `extent.height × extent.depth` rows.
    fn cudaMalloc3D(pitchedDevPtr: *mut cudaPitchedPtr, extent: cudaExtent) {
        non_null(pitchedDevPtr)?;
        let (rt, d) = current()?;
        let rows = (extent.height as u64)
            .checked_mul(extent.depth as u64)
            .ok_or(CudaError::INVALID_VALUE)?;
        let (p, pitch) = malloc_pitch(rt, d, extent.width as u64, rows)?;
        let out = cudaPitchedPtr {
            ptr: p as *mut c_void,
            pitch: usize_of(pitch),
            xsize: extent.width,
            ysize: extent.height,
        };
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(pitchedDevPtr, out) }
    }

    /// `cudaMemset2D`.
    #[per_thread(cudaMemset2D_ptds)]
    fn cudaMemset2D(devPtr: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize) {
        memset_2d(devPtr, pitch, value, width, height, None)
    }

    /// `cudaMemset2DAsync` (fire-and-forget).
    #[per_thread(cudaMemset2DAsync_ptsz)]
    fn cudaMemset2DAsync(
        devPtr: *mut c_void,
        pitch: usize,
        value: c_int,
        width: usize,
        height: usize,
        stream: cudaStream_t,
    ) {
        memset_2d(devPtr, pitch, value, width, height, Some(stream_order(stream)?))
    }

    /// `cudaMemset3D`.
    #[per_thread(cudaMemset3D_ptds)]
    fn cudaMemset3D(pitchedDevPtr: cudaPitchedPtr, value: c_int, extent: cudaExtent) {
        memset_3d_api(pitchedDevPtr, value, extent, None)
    }

    /// `cudaMemset3DAsync` (fire-and-forget).
    #[per_thread(cudaMemset3DAsync_ptsz)]
    fn cudaMemset3DAsync(
        pitchedDevPtr: cudaPitchedPtr,
        value: c_int,
        extent: cudaExtent,
        stream: cudaStream_t,
    ) {
        memset_3d_api(pitchedDevPtr, value, extent, Some(stream_order(stream)?))
    }

    /// `cudaMemcpy2D`: every kind.
    #[per_thread(cudaMemcpy2D_ptds)]
    fn cudaMemcpy2D(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_2d(dst, dpitch, src, spitch, width, height, kind, None) }
    }

    /// `cudaMemcpy2DAsync`: copies touching pageable guest memory complete before returning.
    #[per_thread(cudaMemcpy2DAsync_ptsz)]
    fn cudaMemcpy2DAsync(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) {
        let o = stream_order(stream)?;
        // SAFETY: forwarded API contract.
        unsafe { memcpy_2d(dst, dpitch, src, spitch, width, height, kind, Some(o)) }
    }

    /// `cudaMemcpy2DToArray`: `wOffset` and `width` in bytes.
    #[per_thread(cudaMemcpy2DToArray_ptds)]
    fn cudaMemcpy2DToArray(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, None) }
    }

    /// `cudaMemcpy2DToArrayAsync`.
    #[per_thread(cudaMemcpy2DToArrayAsync_ptsz)]
    fn cudaMemcpy2DToArrayAsync(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) {
        let o = stream_order(stream)?;
        // SAFETY: forwarded API contract.
        unsafe { to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, Some(o)) }
    }

    /// `cudaMemcpy2DFromArray`.
    #[per_thread(cudaMemcpy2DFromArray_ptds)]
    fn cudaMemcpy2DFromArray(
        dst: *mut c_void,
        dpitch: usize,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, None) }
    }

    /// `cudaMemcpy2DFromArrayAsync`.
    #[per_thread(cudaMemcpy2DFromArrayAsync_ptsz)]
    fn cudaMemcpy2DFromArrayAsync(
        dst: *mut c_void,
        dpitch: usize,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) {
        let o = stream_order(stream)?;
        // SAFETY: forwarded API contract.
        unsafe { from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, Some(o)) }
    }

    /// `cudaMemcpy2DArrayToArray`.
    #[per_thread(cudaMemcpy2DArrayToArray_ptds)]
    fn cudaMemcpy2DArrayToArray(
        dst: cudaArray_t,
        wOffsetDst: usize,
        hOffsetDst: usize,
        src: cudaArray_const_t,
        wOffsetSrc: usize,
        hOffsetSrc: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) {
        array_to_array_2d(dst, [wOffsetDst, hOffsetDst], src, [wOffsetSrc, hOffsetSrc], width, height, kind)
    }

    /// `cudaMemcpy3D`: arrays and pitched pointers, every kind.
    #[per_thread(cudaMemcpy3D_ptds)]
    fn cudaMemcpy3D(p: *const cudaMemcpy3DParms) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_3d(p, None) }
    }

    /// `cudaMemcpy3DAsync`.
    #[per_thread(cudaMemcpy3DAsync_ptsz)]
    fn cudaMemcpy3DAsync(p: *const cudaMemcpy3DParms, stream: cudaStream_t) {
        let o = stream_order(stream)?;
        // SAFETY: forwarded API contract.
        unsafe { memcpy_3d(p, Some(o)) }
    }

    /// `cudaMemcpyToArray` (deprecated): `count` bytes in row-major order.
    #[per_thread(cudaMemcpyToArray_ptds)]
    fn cudaMemcpyToArray(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_array_linear(dst as u64, wOffset, hOffset, src as u64, count, kind, true, None) }
    }

    /// `cudaMemcpyToArrayAsync` (deprecated).
    #[per_thread(cudaMemcpyToArrayAsync_ptsz)]
    fn cudaMemcpyToArrayAsync(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) {
        let o = stream_order(stream)?;
        // SAFETY: forwarded API contract.
        unsafe { memcpy_array_linear(dst as u64, wOffset, hOffset, src as u64, count, kind, true, Some(o)) }
    }

    /// `cudaMemcpyFromArray` (deprecated).
    #[per_thread(cudaMemcpyFromArray_ptds)]
    fn cudaMemcpyFromArray(
        dst: *mut c_void,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        count: usize,
        kind: cudaMemcpyKind,
    ) {
        // SAFETY: forwarded API contract.
        unsafe { memcpy_array_linear(src as u64, wOffset, hOffset, dst as u64, count, kind, false, None) }
    }

    /// `cudaMemcpyFromArrayAsync` (deprecated).
    #[per_thread(cudaMemcpyFromArrayAsync_ptsz)]
    fn cudaMemcpyFromArrayAsync(
        dst: *mut c_void,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) {
        let o = stream_order(stream)?;
        // SAFETY: forwarded API contract.
        unsafe { memcpy_array_linear(src as u64, wOffset, hOffset, dst as u64, count, kind, false, Some(o)) }
    }

    /// `cudaMemcpyArrayToArray` (deprecated).
    #[per_thread(cudaMemcpyArrayToArray_ptds)]
    fn cudaMemcpyArrayToArray(
        dst: cudaArray_t,
        wOffsetDst: usize,
        hOffsetDst: usize,
        src: cudaArray_const_t,
        wOffsetSrc: usize,
        hOffsetSrc: usize,
        count: usize,
        kind: cudaMemcpyKind,
    ) {
        memcpy_array_to_array(dst as u64, [wOffsetDst, hOffsetDst], src as u64, [wOffsetSrc, hOffsetSrc], count, kind)
    }

    /// `cudaMallocArray`: a 1D (`height` 0) or 2D array.
    fn cudaMallocArray(
        array: *mut cudaArray_t,
        desc: *const cudaChannelFormatDesc,
        width: usize,
        height: usize,
        flags: c_uint,
    ) {
        create_array(array.cast(), desc, [width as u64, height as u64, 0], flags, 0)
    }

    /// `cudaMalloc3DArray`: layered, cubemap, surface load/store and texture gather flags.
    fn cudaMalloc3DArray(
        array: *mut cudaArray_t,
        desc: *const cudaChannelFormatDesc,
        extent: cudaExtent,
        flags: c_uint,
    ) {
        create_array(array.cast(), desc, extent3(extent), flags, 0)
    }

    /// `cudaMallocMipmappedArray`.
    fn cudaMallocMipmappedArray(
        mipmappedArray: *mut cudaMipmappedArray_t,
        desc: *const cudaChannelFormatDesc,
        extent: cudaExtent,
        numLevels: c_uint,
        flags: c_uint,
    ) {
        if numLevels == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        create_array(mipmappedArray.cast(), desc, extent3(extent), flags, numLevels)
    }

    /// `cudaGetMipmappedArrayLevel`: the level's array belongs to the mipmapped array.
    fn cudaGetMipmappedArrayLevel(
        levelArray: *mut cudaArray_t,
        mipmappedArray: cudaMipmappedArray_const_t,
        level: c_uint,
    ) {
        non_null(levelArray)?;
        let a = array_ops::mipmapped_level(mipmappedArray as u64, level)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(levelArray, a as cudaArray_t) }
    }

    /// `cudaFreeArray`: null is a no-op.
    fn cudaFreeArray(array: cudaArray_t) {
        free_array(array as u64, false)
    }

    /// `cudaFreeMipmappedArray`: null is a no-op.
    fn cudaFreeMipmappedArray(mipmappedArray: cudaMipmappedArray_t) {
        free_array(mipmappedArray as u64, true)
    }

    /// `cudaArrayGetInfo`: the format, extent and flags, from the driver's descriptor. Each
    /// out pointer may be null.
    fn cudaArrayGetInfo(
        desc: *mut cudaChannelFormatDesc,
        extent: *mut cudaExtent,
        flags: *mut c_uint,
        array: cudaArray_t,
    ) {
        let i = array_ops::array_info(array as u64)?;
        // SAFETY: each pointer is null or writable (API contract).
        unsafe {
            if !desc.is_null() {
                write_out(desc, channel_desc(i.format, i.channels))?;
            }
            if !extent.is_null() {
                let e = cudaExtent {
                    width: usize_of(i.extent[0]),
                    height: usize_of(i.extent[1]),
                    depth: usize_of(i.extent[2]),
                };
                write_out(extent, e)?;
            }
            if !flags.is_null() {
                write_out(flags, i.flags)?;
            }
        }
        Ok(())
    }

    /// `cudaGetChannelDesc`: the array's format as a channel descriptor.
    fn cudaGetChannelDesc(desc: *mut cudaChannelFormatDesc, array: cudaArray_const_t) {
        non_null(desc)?;
        let (rt, d) = current()?;
        let i = arrays::info(&rt.session, d, array as u64)?;
        // SAFETY: non-null and writable (API contract).
        unsafe { write_out(desc, channel_desc(i.format, i.channels)) }
    }
}

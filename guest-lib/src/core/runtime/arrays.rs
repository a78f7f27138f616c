//! Pitched memory, 2D/3D copies and memsets, CUDA arrays and mipmapped arrays, as both API
//! faces offer them (`cudaMallocPitch`/`cuMemAllocPitch`, `cudaMemset2D/3D`/`cuMemsetD2D*`,
//! `cudaMemcpy2D*`/`cuMemcpy2D`, `cudaMemcpy3D`/`cuMemcpy3D`, `cudaMalloc*Array`/`cuArray*Create`,
//! ...). The copies all go through copy3d.rs. Functions taking pointers take them as the C API
//! documents them.
// CUDA's own signatures take up to nine arguments.
#![allow(clippy::too_many_arguments)]

use crate::core::conv::{low_byte, usize_of};
use core::ffi::{c_int, c_uint, c_void};

use qcuda_proto::Op;

use crate::{
    core::arrays,
    core::cuda_error::{CudaError, CudaResult},
    core::memory::device::Allocation,
    core::runtime::copy3d::{self, End, Side},
    core::runtime::memory::{
        ops::{async_order, sync_order},
        Ordering,
    },
    core::runtime::{current, non_null, Runtime},
    core::transport::Call,
    generated::{
        self as cu, cudaArray_const_t, cudaArray_t, cudaChannelFormatDesc, cudaExtent,
        cudaMemcpy3DParms, cudaMemcpyKind, cudaPitchedPtr, cudaStream_t,
    },
};

/// Pitched memory of `width` bytes × `rows`: (pointer, pitch).
pub fn malloc_pitch(rt: &Runtime, device: u32, width: u64, rows: u64) -> CudaResult<(u64, u64)> {
    rt.session.check_sticky(device)?;
    let r = rt
        .session
        .submit(Call::new(Op::MallocPitch, device).args(&[width, rows]))?;
    let (ptr, pitch) = (r.rets[0], r.rets[1]);
    if ptr != 0 {
        rt.allocations.insert(Allocation {
            base: ptr,
            size: pitch.saturating_mul(rows),
            device,
            origin: crate::core::memory::device::Origin::Malloc,
        });
    }
    Ok((ptr, pitch))
}

/// Memset of `extent` (bytes, rows, slices) at `ptr`, slices `slice_rows` rows apart.
pub fn memset_3d(
    rt: &Runtime,
    ptr: u64,
    pitch: u64,
    value: c_int,
    extent: [u64; 3],
    slice_rows: u64,
    order: Ordering,
) -> CudaResult<()> {
    rt.session.check_sticky(order.device)?;
    if extent.contains(&0) {
        return Ok(());
    }
    if ptr == 0 || extent[0] > pitch || (extent[2] > 1 && extent[1] > slice_rows) {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut call = Call::new(Op::Memset3D, order.device).args(&[
        ptr,
        pitch,
        u64::from(low_byte(value)),
        extent[0],
        extent[1],
        extent[2],
        slice_rows,
        order.stream,
    ]);
    if order.is_async {
        call = call.fire_and_forget();
    }
    rt.session.submit(call)?;
    Ok(())
}

/// Whether pointer `ptr`, the source (`as_src`) or destination of a copy of `kind`, is device
/// memory.
pub fn is_device(rt: &Runtime, ptr: u64, kind: cudaMemcpyKind, as_src: bool) -> CudaResult<bool> {
    Ok(match kind {
        cu::cudaMemcpyHostToHost => false,
        cu::cudaMemcpyHostToDevice => !as_src,
        cu::cudaMemcpyDeviceToHost => as_src,
        cu::cudaMemcpyDeviceToDevice => true,
        cu::cudaMemcpyDefault => rt.allocations.find(ptr).is_some(),
        _ => return Err(CudaError::INVALID_MEMCPY_DIRECTION),
    })
}

/// A pointer side of a copy.
pub fn pointer(
    rt: &Runtime,
    ptr: u64,
    pitch: u64,
    rows: u64,
    kind: cudaMemcpyKind,
    as_src: bool,
) -> CudaResult<End> {
    Ok(if is_device(rt, ptr, kind, as_src)? {
        End::Device {
            ptr,
            pitch,
            height: rows,
        }
    } else {
        End::Host {
            ptr: usize_of(ptr),
            pitch,
            height: rows,
        }
    })
}

pub fn check_kind(kind: cudaMemcpyKind) -> CudaResult<()> {
    if kind > cu::cudaMemcpyDefault {
        return Err(CudaError::INVALID_MEMCPY_DIRECTION);
    }
    Ok(())
}

/// A 2D copy of `width` bytes × `height` rows.
///
/// # Safety
/// Host sides valid for the copy (CUDA's contract).
pub unsafe fn copy_2d(
    rt: &Runtime,
    src: Side,
    dst: Side,
    width: usize,
    height: usize,
    order: Ordering,
) -> CudaResult<()> {
    // SAFETY: forwarded caller contract.
    unsafe { copy3d::copy(rt, src, dst, [width as u64, height as u64, 1], order) }
}

/// `cudaMemcpy2D[Async]`: every kind.
///
/// # Safety
/// The host-side ranges and parameter blocks are valid as the CUDA API documents for this copy.
pub unsafe fn memcpy_2d(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    order: Option<Ordering>,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let order = order.unwrap_or_else(|| sync_order(d));
    check_kind(kind)?;
    let rows = height as u64;
    let s = pointer(rt, src as u64, spitch as u64, rows, kind, true)?;
    let t = pointer(rt, dst as u64, dpitch as u64, rows, kind, false)?;
    // SAFETY: forwarded caller contract.
    unsafe {
        copy_2d(
            rt,
            Side::new(s, [0; 3]),
            Side::new(t, [0; 3]),
            width,
            height,
            order,
        )
    }
}

pub fn array_side(array: u64, w_offset: usize, h_offset: usize) -> CudaResult<Side> {
    if array == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(Side::new(
        End::Array(array),
        [w_offset as u64, h_offset as u64, 0],
    ))
}

/// `cudaMemcpy3D` parameters: each side an array or a pitched pointer; positions in elements
/// (bytes for pointers); the extent in elements of the array taking part, if any.
///
/// # Safety
/// The host-side ranges and parameter blocks are valid as the CUDA API documents for this copy.
pub unsafe fn memcpy_3d(p: *const cudaMemcpy3DParms, order: Option<Ordering>) -> CudaResult<()> {
    non_null(p)?;
    // SAFETY: non-null and readable (API contract).
    let p = unsafe { *p };
    let (rt, d) = current()?;
    let order = order.unwrap_or_else(|| sync_order(d));
    check_kind(p.kind)?;
    let mut elem = 1u64;
    let mut side = |array: cudaArray_t,
                    ptr: cudaPitchedPtr,
                    pos: cu::cudaPos,
                    as_src: bool|
     -> CudaResult<Side> {
        let pos = [pos.x as u64, pos.y as u64, pos.z as u64];
        match (array.is_null(), ptr.ptr.is_null()) {
            (false, true) => {
                let info = arrays::info(&rt.session, order.device, array as u64)?;
                elem = info.element_bytes();
                Ok(Side::new(
                    End::Array(array as u64),
                    [pos[0].saturating_mul(elem), pos[1], pos[2]],
                ))
            }
            (true, false) => Ok(Side::new(
                pointer(
                    rt,
                    ptr.ptr as u64,
                    ptr.pitch as u64,
                    ptr.ysize as u64,
                    p.kind,
                    as_src,
                )?,
                pos,
            )),
            _ => Err(CudaError::INVALID_VALUE),
        }
    };
    let src = side(p.srcArray, p.srcPtr, p.srcPos, true)?;
    let dst = side(p.dstArray, p.dstPtr, p.dstPos, false)?;
    let extent = [
        (p.extent.width as u64).saturating_mul(elem),
        p.extent.height as u64,
        p.extent.depth as u64,
    ];
    // SAFETY: forwarded API contract.
    unsafe { copy3d::copy(rt, src, dst, extent, order) }
}

/// `cudaMemcpyToArray`/`FromArray` (deprecated): `count` bytes in row-major order from
/// (`w_offset`, `h_offset`) of the array, against linear memory at `ptr`: a partial first row,
/// whole rows, a partial last row.
///
/// # Safety
/// The host-side ranges and parameter blocks are valid as the CUDA API documents for this copy.
pub unsafe fn memcpy_array_linear(
    array: u64,
    w_offset: usize,
    h_offset: usize,
    ptr: u64,
    count: usize,
    kind: cudaMemcpyKind,
    to_array: bool,
    order: Option<Ordering>,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let order = order.unwrap_or_else(|| sync_order(d));
    check_kind(kind)?;
    if count == 0 {
        return Ok(());
    }
    let row = arrays::info(&rt.session, order.device, array)?.row_bytes();
    let (mut x, mut y, mut done, count) = (w_offset as u64, h_offset as u64, 0u64, count as u64);
    if x >= row {
        return Err(CudaError::INVALID_VALUE);
    }
    while done < count {
        let left = count - done;
        // A partial row, or as many whole rows as remain.
        let (width, rows) = if x != 0 || left < row {
            ((row - x).min(left), 1)
        } else {
            (row, left / row)
        };
        let linear = pointer(rt, ptr + done, width, rows, kind, to_array)?;
        let a = Side::new(End::Array(array), [x, y, 0]);
        let l = Side::new(linear, [0; 3]);
        let (s, t) = if to_array { (l, a) } else { (a, l) };
        // SAFETY: the linear range is `count` bytes from `ptr` (API contract).
        unsafe { copy3d::copy(rt, s, t, [width, rows, 1], order)? };
        done += width * rows;
        x = (x + width) % row;
        y += if x == 0 { rows } else { 0 };
    }
    Ok(())
}

/// `cudaMemcpyArrayToArray` (deprecated): `count` bytes in row-major order, piece by piece
/// where neither array's row ends.
pub fn memcpy_array_to_array(
    dst: u64,
    dst_off: [usize; 2],
    src: u64,
    src_off: [usize; 2],
    count: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let order = sync_order(d);
    check_kind(kind)?;
    if count == 0 {
        return Ok(());
    }
    let srow = arrays::info(&rt.session, d, src)?.row_bytes();
    let drow = arrays::info(&rt.session, d, dst)?.row_bytes();
    let (mut s, mut t) = (
        [src_off[0] as u64, src_off[1] as u64],
        [dst_off[0] as u64, dst_off[1] as u64],
    );
    if s[0] >= srow || t[0] >= drow {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut left = count as u64;
    while left > 0 {
        let n = left.min(srow - s[0]).min(drow - t[0]);
        let a = Side::new(End::Array(src), [s[0], s[1], 0]);
        let b = Side::new(End::Array(dst), [t[0], t[1], 0]);
        // SAFETY: no host memory takes part.
        unsafe { copy3d::copy(rt, a, b, [n, 1, 1], order)? };
        left -= n;
        for (p, row) in [(&mut s, srow), (&mut t, drow)] {
            p[0] += n;
            if p[0] == row {
                p[0] = 0;
                p[1] += 1;
            }
        }
    }
    Ok(())
}

pub fn stream_order(stream: cudaStream_t) -> CudaResult<Ordering> {
    async_order(stream as usize).map(|(_, o)| o)
}

pub fn extent3(e: cudaExtent) -> [u64; 3] {
    [e.width as u64, e.height as u64, e.depth as u64]
}

pub fn memset_2d(
    ptr: *mut c_void,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
    order: Option<Ordering>,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let order = order.unwrap_or_else(|| sync_order(d));
    let h = height as u64;
    memset_3d(
        rt,
        ptr as u64,
        pitch as u64,
        value,
        [width as u64, h, 1],
        h,
        order,
    )
}

pub fn memset_3d_api(
    p: cudaPitchedPtr,
    value: c_int,
    e: cudaExtent,
    order: Option<Ordering>,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let order = order.unwrap_or_else(|| sync_order(d));
    memset_3d(
        rt,
        p.ptr as u64,
        p.pitch as u64,
        value,
        extent3(e),
        p.ysize as u64,
        order,
    )
}

pub fn create_array(
    desc: &cudaChannelFormatDesc,
    extent: [u64; 3],
    flags: c_uint,
    levels: u32,
) -> CudaResult<u64> {
    let (rt, d) = current()?;
    arrays::create(&rt.session, d, desc, extent, flags, levels)
}

/// `cudaGetMipmappedArrayLevel`: the level's array (it belongs to the mipmapped array).
pub fn mipmapped_level(mipmapped: u64, level: u32) -> CudaResult<u64> {
    if mipmapped == 0 {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    let (rt, d) = current()?;
    let r = rt
        .session
        .submit(Call::new(Op::MipmappedArrayLevel, d).args(&[mipmapped, u64::from(level)]))?;
    Ok(r.rets[0])
}

/// What the driver's descriptor of `array` says (`cudaArrayGetInfo`).
pub fn array_info(array: u64) -> CudaResult<arrays::ArrayInfo> {
    let (rt, d) = current()?;
    arrays::info(&rt.session, d, array)
}

/// `cudaMallocPitch`: rows of `width` bytes at the device's pitch: (pointer, pitch).
pub fn malloc_pitch_current(width: u64, rows: u64) -> CudaResult<(u64, u64)> {
    let (rt, d) = current()?;
    malloc_pitch(rt, d, width, rows)
}

pub fn free_array(handle: u64, mipmapped: bool) -> CudaResult<()> {
    if handle == 0 {
        return Ok(());
    }
    let (rt, d) = current()?;
    rt.session
        .submit(Call::new(Op::ArrayDestroy, d).args(&[handle, u64::from(mipmapped)]))?;
    Ok(())
}

/// `cudaMemcpy2DToArray[Async]`.
///
/// # Safety
/// The host-side ranges and parameter blocks are valid as the CUDA API documents for this copy.
pub unsafe fn to_array_2d(
    dst: cudaArray_t,
    w_offset: usize,
    h_offset: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    order: Option<Ordering>,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let order = order.unwrap_or_else(|| sync_order(d));
    check_kind(kind)?;
    let s = pointer(rt, src as u64, spitch as u64, height as u64, kind, true)?;
    let t = array_side(dst as u64, w_offset, h_offset)?;
    // SAFETY: forwarded caller contract.
    unsafe { copy_2d(rt, Side::new(s, [0; 3]), t, width, height, order) }
}

/// `cudaMemcpy2DFromArray[Async]`.
///
/// # Safety
/// The host-side ranges and parameter blocks are valid as the CUDA API documents for this copy.
pub unsafe fn from_array_2d(
    dst: *mut c_void,
    dpitch: usize,
    src: cudaArray_const_t,
    w_offset: usize,
    h_offset: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    order: Option<Ordering>,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    let order = order.unwrap_or_else(|| sync_order(d));
    check_kind(kind)?;
    let t = pointer(rt, dst as u64, dpitch as u64, height as u64, kind, false)?;
    let s = array_side(src as u64, w_offset, h_offset)?;
    // SAFETY: forwarded caller contract.
    unsafe { copy_2d(rt, s, Side::new(t, [0; 3]), width, height, order) }
}

pub fn array_to_array_2d(
    dst: cudaArray_t,
    dst_off: [usize; 2],
    src: cudaArray_const_t,
    src_off: [usize; 2],
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    let (rt, d) = current()?;
    check_kind(kind)?;
    let s = array_side(src as u64, src_off[0], src_off[1])?;
    let t = array_side(dst as u64, dst_off[0], dst_off[1])?;
    // SAFETY: no host memory takes part.
    unsafe { copy_2d(rt, s, t, width, height, sync_order(d)) }
}

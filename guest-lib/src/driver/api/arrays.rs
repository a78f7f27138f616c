//! Arrays, mipmapped arrays, texture and surface objects, and the copies that reach arrays,
//! through the driver API. A `CUarray` is the runtime face's `cudaArray_t` and a texture or
//! surface object is the same 64-bit value in both APIs, as in NVIDIA's stack; each call here
//! converts the driver's descriptors (formats and channel counts, byte offsets, `CU_TRSF_*`
//! flags) into the runtime face's and runs its implementation.

use core::ffi::{c_uint, c_void};

use super::{initialized, out, via_core};
use crate::core::runtime::context;
use crate::{
    core::arrays::{channel_desc, format_of},
    core::conv::usize_of,
    core::runtime::arrays as array_ops,
    core::runtime::objects as object_ops,
    driver::status::{DriverError, DrvResult},
    generated::{
        self as cu, cudaArray_t, cudaChannelFormatDesc, cudaExtent, cudaMemcpy3DParms,
        cudaMipmappedArray_t, cudaPitchedPtr, cudaPos, cudaResourceDesc, cudaResourceViewDesc,
        cudaTextureDesc, driver_api as d,
    },
};

fn ready() -> DrvResult<()> {
    initialized()?;
    Ok(context::require_current().map(drop)?)
}

/// The runtime's channel descriptor for a driver format and channel count.
fn channels_of(format: d::CUarray_format, channels: c_uint) -> DrvResult<cudaChannelFormatDesc> {
    const CLASSIC: [u32; 8] = [0x01, 0x02, 0x03, 0x08, 0x09, 0x0a, 0x10, 0x20];
    if !CLASSIC.contains(&format) {
        crate::core::warnings::warn_once!(
            "qcuda: driver-API arrays of NV12, normalized or block-compressed formats are not \
             supported"
        );
        return Err(DriverError::NOT_SUPPORTED);
    }
    if ![1, 2, 4].contains(&channels) {
        return Err(DriverError::INVALID_VALUE);
    }
    Ok(channel_desc(format, channels))
}

/// The driver's format and channel count for a runtime channel descriptor.
fn format_and_channels(desc: &cudaChannelFormatDesc) -> DrvResult<(d::CUarray_format, c_uint)> {
    format_of(desc).map_err(DriverError::from)
}

/// Bytes of one element of `array`.
fn element_bytes(array: d::CUarray) -> DrvResult<usize> {
    let i = via_core(|| array_ops::array_info(array as u64))?;
    let desc = channel_desc(i.format, i.channels);
    let bits = desc.x + desc.y + desc.z + desc.w;
    usize::try_from(bits / 8).map_err(|_| DriverError::INVALID_VALUE)
}

/// One side of a driver copy descriptor, in the runtime's 3D terms: an array at an element
/// position, or a pitched pointer (host, device or unified) at a byte position.
struct Side {
    array: d::CUarray,
    ptr: *mut c_void,
    pitch: usize,
    height: usize,
    pos: [usize; 3],
    host: Option<bool>,
}

/// One side of a copy descriptor (plain values; nothing is dereferenced).
#[expect(
    clippy::too_many_arguments,
    reason = "one field of each kind of the descriptor"
)]
fn side(
    kind: d::CUmemorytype,
    host: *const c_void,
    device: d::CUdeviceptr,
    array: d::CUarray,
    pitch: usize,
    height: usize,
    x_bytes: usize,
    y: usize,
    z: usize,
) -> DrvResult<Side> {
    let (ptr, host, array) = match kind {
        d::CU_MEMORYTYPE_HOST => (host.cast_mut(), Some(true), std::ptr::null_mut()),
        d::CU_MEMORYTYPE_DEVICE => (device as *mut c_void, Some(false), std::ptr::null_mut()),
        d::CU_MEMORYTYPE_UNIFIED => (device as *mut c_void, None, std::ptr::null_mut()),
        d::CU_MEMORYTYPE_ARRAY if !array.is_null() => (std::ptr::null_mut(), Some(false), array),
        _ => return Err(DriverError::INVALID_VALUE),
    };
    Ok(Side {
        array,
        ptr,
        pitch,
        height,
        pos: [x_bytes, y, z],
        host,
    })
}

/// A copy between two sides of `width` bytes × `height` rows × `depth` slices, through the
/// runtime face's `cudaMemcpy3D(Async)`: where an array takes part, the runtime counts
/// positions on it and the width in its elements.
fn copy_3d(
    mut src: Side,
    mut dst: Side,
    extent: [usize; 3],
    stream: Option<d::CUstream>,
) -> DrvResult<()> {
    use crate::generated::{
        cudaMemcpyDefault, cudaMemcpyDeviceToDevice, cudaMemcpyDeviceToHost,
        cudaMemcpyHostToDevice, cudaMemcpyHostToHost,
    };
    ready()?;
    let mut width = extent[0];
    for s in [&mut src, &mut dst] {
        if !s.array.is_null() {
            let e = element_bytes(s.array)?;
            if e == 0 || !s.pos[0].is_multiple_of(e) {
                return Err(DriverError::INVALID_VALUE);
            }
            s.pos[0] /= e;
        }
    }
    let array_elem = [&src, &dst]
        .into_iter()
        .find(|s| !s.array.is_null())
        .map(|s| element_bytes(s.array))
        .transpose()?;
    if let Some(e) = array_elem {
        if !width.is_multiple_of(e) {
            return Err(DriverError::INVALID_VALUE);
        }
        width /= e;
        // The pointer side of an array copy counts its position in those elements too.
        for s in [&mut src, &mut dst] {
            if s.array.is_null() {
                if !s.pos[0].is_multiple_of(e) {
                    return Err(DriverError::INVALID_VALUE);
                }
                s.pos[0] /= e;
            }
        }
    }
    let pitched = |s: &Side| cudaPitchedPtr {
        ptr: s.ptr,
        pitch: s.pitch,
        xsize: s.pitch,
        ysize: s.height,
    };
    let pos = |s: &Side| cudaPos {
        x: s.pos[0],
        y: s.pos[1],
        z: s.pos[2],
    };
    let kind = match (src.host, dst.host) {
        (Some(true), Some(false)) => cudaMemcpyHostToDevice,
        (Some(false), Some(true)) => cudaMemcpyDeviceToHost,
        (Some(false), Some(false)) => cudaMemcpyDeviceToDevice,
        (Some(true), Some(true)) => cudaMemcpyHostToHost,
        _ => cudaMemcpyDefault,
    };
    let p = cudaMemcpy3DParms {
        srcArray: src.array as cudaArray_t,
        srcPos: pos(&src),
        srcPtr: pitched(&src),
        dstArray: dst.array as cudaArray_t,
        dstPos: pos(&dst),
        dstPtr: pitched(&dst),
        extent: cudaExtent {
            width,
            height: extent[1],
            depth: extent[2],
        },
        kind,
    };
    match stream {
        // SAFETY: the ranges the caller's descriptor names (API contract).
        None => via_core(|| unsafe { array_ops::memcpy_3d(&raw const p, None) }),
        // SAFETY: as above.
        Some(s) => via_core(|| unsafe {
            let order = array_ops::stream_order(s.cast())?;
            array_ops::memcpy_3d(&raw const p, Some(order))
        }),
    }
}

/// `cuMemcpy2D` family for descriptors with an array on either side.
///
/// # Safety
/// The ranges the descriptor names must be valid (API contract).
pub unsafe fn copy_2d_arrays(c: &d::CUDA_MEMCPY2D, stream: Option<d::CUstream>) -> DrvResult<()> {
    let src = side(
        c.srcMemoryType,
        c.srcHost,
        c.srcDevice,
        c.srcArray,
        c.srcPitch.max(c.WidthInBytes),
        c.srcY + c.Height,
        c.srcXInBytes,
        c.srcY,
        0,
    )?;
    let dst = side(
        c.dstMemoryType,
        c.dstHost,
        c.dstDevice,
        c.dstArray,
        c.dstPitch.max(c.WidthInBytes),
        c.dstY + c.Height,
        c.dstXInBytes,
        c.dstY,
        0,
    )?;
    copy_3d(src, dst, [c.WidthInBytes, c.Height, 1], stream)
}

/// The `CUDA_MEMCPY3D` of a peer copy's description (its contexts are checked and dropped).
///
/// # Safety
/// `p` is null or points at a readable `CUDA_MEMCPY3D_PEER`.
unsafe fn peer_as_3d(p: *const d::CUDA_MEMCPY3D_PEER) -> DrvResult<d::CUDA_MEMCPY3D> {
    if p.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: non-null and readable (caller's contract).
    let c = unsafe { p.read_unaligned() };
    for ctx in [c.srcContext, c.dstContext] {
        if !ctx.is_null() {
            super::device_of(ctx)?;
        }
    }
    Ok(d::CUDA_MEMCPY3D {
        srcXInBytes: c.srcXInBytes,
        srcY: c.srcY,
        srcZ: c.srcZ,
        srcLOD: c.srcLOD,
        srcMemoryType: c.srcMemoryType,
        srcHost: c.srcHost,
        srcDevice: c.srcDevice,
        srcArray: c.srcArray,
        reserved0: std::ptr::null_mut(),
        srcPitch: c.srcPitch,
        srcHeight: c.srcHeight,
        dstXInBytes: c.dstXInBytes,
        dstY: c.dstY,
        dstZ: c.dstZ,
        dstLOD: c.dstLOD,
        dstMemoryType: c.dstMemoryType,
        dstHost: c.dstHost,
        dstDevice: c.dstDevice,
        dstArray: c.dstArray,
        reserved1: std::ptr::null_mut(),
        dstPitch: c.dstPitch,
        dstHeight: c.dstHeight,
        WidthInBytes: c.WidthInBytes,
        Height: c.Height,
        Depth: c.Depth,
    })
}

/// # Safety
/// `p` must be null or readable (API contract).
unsafe fn memcpy_3d(p: *const d::CUDA_MEMCPY3D, stream: Option<d::CUstream>) -> DrvResult<()> {
    if p.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: non-null and readable (API contract).
    let c = unsafe { p.read_unaligned() };
    if c.srcLOD != 0 || c.dstLOD != 0 {
        return Err(DriverError::INVALID_VALUE);
    }
    let height = |h: usize| if h == 0 { c.Height } else { h };
    let src = side(
        c.srcMemoryType,
        c.srcHost,
        c.srcDevice,
        c.srcArray,
        c.srcPitch.max(c.WidthInBytes),
        height(c.srcHeight),
        c.srcXInBytes,
        c.srcY,
        c.srcZ,
    )?;
    let dst = side(
        c.dstMemoryType,
        c.dstHost,
        c.dstDevice,
        c.dstArray,
        c.dstPitch.max(c.WidthInBytes),
        height(c.dstHeight),
        c.dstXInBytes,
        c.dstY,
        c.dstZ,
    )?;
    copy_3d(src, dst, [c.WidthInBytes, c.Height, c.Depth], stream)
}

/// A one-row copy to or from an array at a byte offset (`cuMemcpyHtoA` and friends).
fn linear(src: Side, dst: Side, bytes: usize, stream: Option<d::CUstream>) -> DrvResult<()> {
    copy_3d(src, dst, [bytes, 1, 1], stream)
}

fn array_side(array: d::CUarray, offset: usize) -> DrvResult<Side> {
    side(
        d::CU_MEMORYTYPE_ARRAY,
        std::ptr::null(),
        0,
        array,
        0,
        1,
        offset,
        0,
        0,
    )
}

fn host_side(p: *const c_void, bytes: usize) -> DrvResult<Side> {
    side(
        d::CU_MEMORYTYPE_HOST,
        p,
        0,
        std::ptr::null_mut(),
        bytes,
        1,
        0,
        0,
        0,
    )
}

fn device_side(p: d::CUdeviceptr, bytes: usize) -> DrvResult<Side> {
    side(
        d::CU_MEMORYTYPE_DEVICE,
        std::ptr::null(),
        p,
        std::ptr::null_mut(),
        bytes,
        1,
        0,
        0,
        0,
    )
}

/// A texture or surface resource descriptor in the runtime's terms.
fn resource(r: &d::CUDA_RESOURCE_DESC) -> DrvResult<cudaResourceDesc> {
    let mut out = cudaResourceDesc {
        resType: r.resType,
        flags: r.flags,
        ..Default::default()
    };
    // SAFETY: the member `resType` names is the one the caller filled in (API contract).
    unsafe {
        match r.resType {
            d::CU_RESOURCE_TYPE_ARRAY => out.res.array.array = r.res.array.hArray as cudaArray_t,
            d::CU_RESOURCE_TYPE_MIPMAPPED_ARRAY => {
                out.res.mipmap.mipmap = r.res.mipmap.hMipmappedArray as cudaMipmappedArray_t;
            }
            d::CU_RESOURCE_TYPE_LINEAR => {
                let l = r.res.linear;
                out.res.linear.devPtr = l.devPtr as *mut c_void;
                out.res.linear.desc = channels_of(l.format, l.numChannels)?;
                out.res.linear.sizeInBytes = l.sizeInBytes;
            }
            d::CU_RESOURCE_TYPE_PITCH2D => {
                let p = r.res.pitch2D;
                out.res.pitch2D.devPtr = p.devPtr as *mut c_void;
                out.res.pitch2D.desc = channels_of(p.format, p.numChannels)?;
                out.res.pitch2D.width = p.width;
                out.res.pitch2D.height = p.height;
                out.res.pitch2D.pitchInBytes = p.pitchInBytes;
            }
            _ => return Err(DriverError::INVALID_VALUE),
        }
    }
    Ok(out)
}

/// The driver's resource descriptor for a runtime one.
fn resource_back(r: &cudaResourceDesc) -> DrvResult<d::CUDA_RESOURCE_DESC> {
    let mut out = d::CUDA_RESOURCE_DESC {
        resType: r.resType,
        flags: r.flags,
        ..Default::default()
    };
    // SAFETY: the member `resType` names is the one that was filled in.
    unsafe {
        match r.resType {
            cu::cudaResourceTypeArray => out.res.array.hArray = r.res.array.array as d::CUarray,
            cu::cudaResourceTypeMipmappedArray => {
                out.res.mipmap.hMipmappedArray = r.res.mipmap.mipmap as d::CUmipmappedArray;
            }
            cu::cudaResourceTypeLinear => {
                let l = r.res.linear;
                let (format, channels) = format_and_channels(&l.desc)?;
                out.res.linear.devPtr = l.devPtr as d::CUdeviceptr;
                out.res.linear.format = format;
                out.res.linear.numChannels = channels;
                out.res.linear.sizeInBytes = l.sizeInBytes;
            }
            _ => {
                let p = r.res.pitch2D;
                let (format, channels) = format_and_channels(&p.desc)?;
                out.res.pitch2D.devPtr = p.devPtr as d::CUdeviceptr;
                out.res.pitch2D.format = format;
                out.res.pitch2D.numChannels = channels;
                out.res.pitch2D.width = p.width;
                out.res.pitch2D.height = p.height;
                out.res.pitch2D.pitchInBytes = p.pitchInBytes;
            }
        }
    }
    Ok(out)
}

/// Whether a resource's elements are floating point (read as they are whatever the flags).
fn float_resource(r: &cudaResourceDesc) -> bool {
    // SAFETY: the member `resType` names (filled in by `resource`).
    let desc = unsafe {
        match r.resType {
            cu::cudaResourceTypeLinear => Some(r.res.linear.desc),
            cu::cudaResourceTypePitch2D => Some(r.res.pitch2D.desc),
            _ => None,
        }
    };
    desc.is_some_and(|d| d.f == cu::cudaChannelFormatKindFloat)
}

/// The runtime's texture descriptor for the driver's (`CU_TRSF_*` flags become fields).
fn texture(t: &d::CUDA_TEXTURE_DESC, float: bool) -> cudaTextureDesc {
    let flag = |f: u32| i32::from(t.flags & f != 0);
    cudaTextureDesc {
        addressMode: t.addressMode,
        filterMode: t.filterMode,
        readMode: if t.flags & d::CU_TRSF_READ_AS_INTEGER != 0 || float {
            cu::cudaReadModeElementType
        } else {
            cu::cudaReadModeNormalizedFloat
        },
        sRGB: flag(d::CU_TRSF_SRGB),
        borderColor: t.borderColor,
        normalizedCoords: flag(d::CU_TRSF_NORMALIZED_COORDINATES),
        maxAnisotropy: t.maxAnisotropy,
        mipmapFilterMode: t.mipmapFilterMode,
        mipmapLevelBias: t.mipmapLevelBias,
        minMipmapLevelClamp: t.minMipmapLevelClamp,
        maxMipmapLevelClamp: t.maxMipmapLevelClamp,
        disableTrilinearOptimization: flag(d::CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION),
        seamlessCubemap: flag(d::CU_TRSF_SEAMLESS_CUBEMAP),
    }
}

/// The driver's texture descriptor for a runtime one.
fn texture_back(t: &cudaTextureDesc) -> d::CUDA_TEXTURE_DESC {
    let bit = |on: bool, f: u32| if on { f } else { 0 };
    d::CUDA_TEXTURE_DESC {
        addressMode: t.addressMode,
        filterMode: t.filterMode,
        flags: bit(
            t.readMode == cu::cudaReadModeElementType,
            d::CU_TRSF_READ_AS_INTEGER,
        ) | bit(t.sRGB != 0, d::CU_TRSF_SRGB)
            | bit(t.normalizedCoords != 0, d::CU_TRSF_NORMALIZED_COORDINATES)
            | bit(
                t.disableTrilinearOptimization != 0,
                d::CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION,
            )
            | bit(t.seamlessCubemap != 0, d::CU_TRSF_SEAMLESS_CUBEMAP),
        maxAnisotropy: t.maxAnisotropy,
        mipmapFilterMode: t.mipmapFilterMode,
        mipmapLevelBias: t.mipmapLevelBias,
        minMipmapLevelClamp: t.minMipmapLevelClamp,
        maxMipmapLevelClamp: t.maxMipmapLevelClamp,
        borderColor: t.borderColor,
        ..Default::default()
    }
}

fn view(v: &d::CUDA_RESOURCE_VIEW_DESC) -> cudaResourceViewDesc {
    cudaResourceViewDesc {
        format: v.format,
        width: v.width,
        height: v.height,
        depth: v.depth,
        firstMipmapLevel: v.firstMipmapLevel,
        lastMipmapLevel: v.lastMipmapLevel,
        firstLayer: v.firstLayer,
        lastLayer: v.lastLayer,
        ..Default::default()
    }
}

fn view_back(v: &cudaResourceViewDesc) -> d::CUDA_RESOURCE_VIEW_DESC {
    d::CUDA_RESOURCE_VIEW_DESC {
        format: v.format,
        width: v.width,
        height: v.height,
        depth: v.depth,
        firstMipmapLevel: v.firstMipmapLevel,
        lastMipmapLevel: v.lastMipmapLevel,
        firstLayer: v.firstLayer,
        lastLayer: v.lastLayer,
        ..Default::default()
    }
}

/// A getter through the runtime face: `query` fills the runtime's record, `convert` makes the
/// driver's, which goes to the caller's `dst`.
fn answer<R, D>(
    dst: *mut D,
    query: impl FnOnce() -> crate::core::cuda_error::CudaResult<R>,
    convert: impl FnOnce(&R) -> DrvResult<D>,
) -> DrvResult<()> {
    ready()?;
    let r = via_core(query)?;
    // SAFETY: the caller's out-pointer (API contract; null is refused).
    unsafe { out(dst, convert(&r)?) }
}

/// # Safety
/// `p` must be null or readable.
unsafe fn read<T: Copy>(p: *const T) -> DrvResult<T> {
    if p.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: non-null and readable (caller's contract).
    Ok(unsafe { p.read_unaligned() })
}

fn create_3d(handle: *mut d::CUarray, desc: &d::CUDA_ARRAY3D_DESCRIPTOR) -> DrvResult<()> {
    ready()?;
    if handle.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    let channels = channels_of(desc.Format, desc.NumChannels)?;
    let extent = cudaExtent {
        width: desc.Width,
        height: desc.Height,
        depth: desc.Depth,
    };
    // The CUDA_ARRAY3D_* flags have the values of the runtime's cudaArray* flags.
    let a =
        via_core(|| array_ops::create_array(&channels, array_ops::extent3(extent), desc.Flags, 0))?;
    // SAFETY: the caller's out-pointer (API contract; null is refused).
    unsafe { out(handle, a as d::CUarray) }
}

fn descriptor(array: d::CUarray) -> DrvResult<d::CUDA_ARRAY3D_DESCRIPTOR> {
    ready()?;
    let i = via_core(|| array_ops::array_info(array as u64))?;
    let desc = channel_desc(i.format, i.channels);
    let extent = cudaExtent {
        width: usize_of(i.extent[0]),
        height: usize_of(i.extent[1]),
        depth: usize_of(i.extent[2]),
    };
    let flags = i.flags;
    let (format, channels) = format_and_channels(&desc)?;
    Ok(d::CUDA_ARRAY3D_DESCRIPTOR {
        Width: extent.width,
        Height: extent.height,
        Depth: extent.depth,
        Format: format,
        NumChannels: channels,
        Flags: flags,
    })
}

driver_api! {
    /// `cuArrayCreate_v2`: a 1D (height 0) or 2D array.
    fn cuArrayCreate_v2(pHandle: *mut d::CUarray, pAllocateArray: *const d::CUDA_ARRAY_DESCRIPTOR) {
        // SAFETY: API contract.
        let a = unsafe { read(pAllocateArray) }?;
        let desc = d::CUDA_ARRAY3D_DESCRIPTOR {
            Width: a.Width,
            Height: a.Height,
            Depth: 0,
            Format: a.Format,
            NumChannels: a.NumChannels,
            Flags: 0,
        };
        create_3d(pHandle, &desc)
    }

    /// `cuArray3DCreate_v2`.
    fn cuArray3DCreate_v2(pHandle: *mut d::CUarray, pAllocateArray: *const d::CUDA_ARRAY3D_DESCRIPTOR) {
        // SAFETY: API contract.
        create_3d(pHandle, &unsafe { read(pAllocateArray) }?)
    }

    /// `cuArrayDestroy`.
    fn cuArrayDestroy(hArray: d::CUarray) {
        ready()?;
        via_core(|| array_ops::free_array(hArray as u64, false))
    }

    /// `cuArrayGetDescriptor_v2`.
    fn cuArrayGetDescriptor_v2(pArrayDescriptor: *mut d::CUDA_ARRAY_DESCRIPTOR, hArray: d::CUarray) {
        let a = descriptor(hArray)?;
        // SAFETY: the caller's out-pointer (API contract; null is refused).
        unsafe { out(
            pArrayDescriptor,
            d::CUDA_ARRAY_DESCRIPTOR {
                Width: a.Width,
                Height: a.Height,
                Format: a.Format,
                NumChannels: a.NumChannels,
            },
        ) }
    }

    /// `cuArray3DGetDescriptor_v2`.
    fn cuArray3DGetDescriptor_v2(pArrayDescriptor: *mut d::CUDA_ARRAY3D_DESCRIPTOR, hArray: d::CUarray) {
        // SAFETY: the caller's out-pointer (API contract; null is refused).
        unsafe { out(pArrayDescriptor, descriptor(hArray)?) }
    }

    /// `cuMipmappedArrayCreate`.
    fn cuMipmappedArrayCreate(
        pHandle: *mut d::CUmipmappedArray,
        pMipmappedArrayDesc: *const d::CUDA_ARRAY3D_DESCRIPTOR,
        numMipmapLevels: c_uint,
    ) {
        ready()?;
        // SAFETY: API contract.
        let desc = unsafe { read(pMipmappedArrayDesc) }?;
        if pHandle.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let channels = channels_of(desc.Format, desc.NumChannels)?;
        let extent = cudaExtent { width: desc.Width, height: desc.Height, depth: desc.Depth };
        if numMipmapLevels == 0 {
            return Err(DriverError::INVALID_VALUE);
        }
        let m = via_core(|| array_ops::create_array(&channels, array_ops::extent3(extent), desc.Flags, numMipmapLevels))?;
        // SAFETY: the caller's out-pointer (API contract; null is refused).
        unsafe { out(pHandle, m as d::CUmipmappedArray) }
    }

    /// `cuMipmappedArrayGetLevel`.
    fn cuMipmappedArrayGetLevel(pLevelArray: *mut d::CUarray, hMipmappedArray: d::CUmipmappedArray, level: c_uint) {
        ready()?;
        if pLevelArray.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let a = via_core(|| array_ops::mipmapped_level(hMipmappedArray as u64, level))?;
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { out(pLevelArray, a as d::CUarray) }
    }

    /// `cuMipmappedArrayDestroy`.
    fn cuMipmappedArrayDestroy(hMipmappedArray: d::CUmipmappedArray) {
        ready()?;
        via_core(|| array_ops::free_array(hMipmappedArray as u64, true))
    }

    /// `cuMemcpy3D_v2`.
    #[per_thread(cuMemcpy3D_v2_ptds)]
    fn cuMemcpy3D_v2(pCopy: *const d::CUDA_MEMCPY3D) {
        // SAFETY: API contract.
        unsafe { memcpy_3d(pCopy, None) }
    }

    /// `cuMemcpy3DAsync_v2`.
    #[per_thread(cuMemcpy3DAsync_v2_ptsz)]
    fn cuMemcpy3DAsync_v2(pCopy: *const d::CUDA_MEMCPY3D, hStream: d::CUstream) {
        // SAFETY: API contract.
        unsafe { memcpy_3d(pCopy, Some(hStream)) }
    }

    /// `cuMemcpy3DPeer`: device addresses are unified, so the peer copy is the 3D copy of the
    /// same description; the contexts name the devices the host already knows by address.
    #[per_thread(cuMemcpy3DPeer_ptds)]
    fn cuMemcpy3DPeer(pCopy: *const d::CUDA_MEMCPY3D_PEER) {
        // SAFETY: API contract.
        let c = unsafe { peer_as_3d(pCopy) }?;
        // SAFETY: a local description.
        unsafe { memcpy_3d(&raw const c, None) }
    }

    /// `cuMemcpy3DPeerAsync`.
    #[per_thread(cuMemcpy3DPeerAsync_ptsz)]
    fn cuMemcpy3DPeerAsync(pCopy: *const d::CUDA_MEMCPY3D_PEER, hStream: d::CUstream) {
        // SAFETY: API contract.
        let c = unsafe { peer_as_3d(pCopy) }?;
        // SAFETY: a local description.
        unsafe { memcpy_3d(&raw const c, Some(hStream)) }
    }

    /// `cuMemcpyHtoA_v2`.
    #[per_thread(cuMemcpyHtoA_v2_ptds)]
    fn cuMemcpyHtoA_v2(dstArray: d::CUarray, dstOffset: usize, srcHost: *const c_void, ByteCount: usize) {
        linear(host_side(srcHost, ByteCount)?, array_side(dstArray, dstOffset)?, ByteCount, None)
    }

    /// `cuMemcpyHtoAAsync_v2`.
    #[per_thread(cuMemcpyHtoAAsync_v2_ptsz)]
    fn cuMemcpyHtoAAsync_v2(dstArray: d::CUarray, dstOffset: usize, srcHost: *const c_void, ByteCount: usize, hStream: d::CUstream) {
        linear(host_side(srcHost, ByteCount)?, array_side(dstArray, dstOffset)?, ByteCount, Some(hStream))
    }

    /// `cuMemcpyAtoH_v2`.
    #[per_thread(cuMemcpyAtoH_v2_ptds)]
    fn cuMemcpyAtoH_v2(dstHost: *mut c_void, srcArray: d::CUarray, srcOffset: usize, ByteCount: usize) {
        linear(array_side(srcArray, srcOffset)?, host_side(dstHost, ByteCount)?, ByteCount, None)
    }

    /// `cuMemcpyAtoHAsync_v2`.
    #[per_thread(cuMemcpyAtoHAsync_v2_ptsz)]
    fn cuMemcpyAtoHAsync_v2(dstHost: *mut c_void, srcArray: d::CUarray, srcOffset: usize, ByteCount: usize, hStream: d::CUstream) {
        linear(array_side(srcArray, srcOffset)?, host_side(dstHost, ByteCount)?, ByteCount, Some(hStream))
    }

    /// `cuMemcpyDtoA_v2`.
    #[per_thread(cuMemcpyDtoA_v2_ptds)]
    fn cuMemcpyDtoA_v2(dstArray: d::CUarray, dstOffset: usize, srcDevice: d::CUdeviceptr, ByteCount: usize) {
        linear(device_side(srcDevice, ByteCount)?, array_side(dstArray, dstOffset)?, ByteCount, None)
    }

    /// `cuMemcpyAtoD_v2`.
    #[per_thread(cuMemcpyAtoD_v2_ptds)]
    fn cuMemcpyAtoD_v2(dstDevice: d::CUdeviceptr, srcArray: d::CUarray, srcOffset: usize, ByteCount: usize) {
        linear(array_side(srcArray, srcOffset)?, device_side(dstDevice, ByteCount)?, ByteCount, None)
    }

    /// `cuMemcpyAtoA_v2`.
    #[per_thread(cuMemcpyAtoA_v2_ptds)]
    fn cuMemcpyAtoA_v2(dstArray: d::CUarray, dstOffset: usize, srcArray: d::CUarray, srcOffset: usize, ByteCount: usize) {
        linear(array_side(srcArray, srcOffset)?, array_side(dstArray, dstOffset)?, ByteCount, None)
    }

    /// `cuTexObjectCreate`.
    fn cuTexObjectCreate(
        pTexObject: *mut d::CUtexObject,
        pResDesc: *const d::CUDA_RESOURCE_DESC,
        pTexDesc: *const d::CUDA_TEXTURE_DESC,
        pResViewDesc: *const d::CUDA_RESOURCE_VIEW_DESC,
    ) {
        ready()?;
        // SAFETY: API contract for each descriptor (the view may be null).
        let (res, tex) = unsafe { (resource(&read(pResDesc)?)?, read(pTexDesc)?) };
        let tex = texture(&tex, float_resource(&res));
        // SAFETY: as above.
        let view = (!pResViewDesc.is_null()).then(|| view(&unsafe { pResViewDesc.read_unaligned() }));
        let obj = via_core(|| object_ops::create_texture(&res, &tex, view.as_ref()))?;
        // SAFETY: the caller's out-pointer (API contract; null is refused).
        unsafe { out(pTexObject, obj) }
    }

    /// `cuTexObjectDestroy`.
    fn cuTexObjectDestroy(texObject: d::CUtexObject) {
        ready()?;
        via_core(|| object_ops::destroy(texObject, false))
    }

    /// `cuTexObjectGetResourceDesc`.
    fn cuTexObjectGetResourceDesc(pResDesc: *mut d::CUDA_RESOURCE_DESC, texObject: d::CUtexObject) {
        answer(pResDesc, || object_ops::resource(texObject, false), resource_back)
    }

    /// `cuTexObjectGetTextureDesc`.
    fn cuTexObjectGetTextureDesc(pTexDesc: *mut d::CUDA_TEXTURE_DESC, texObject: d::CUtexObject) {
        answer(pTexDesc, || object_ops::texture(texObject), |t| Ok(texture_back(t)))
    }

    /// `cuTexObjectGetResourceViewDesc`.
    fn cuTexObjectGetResourceViewDesc(pResViewDesc: *mut d::CUDA_RESOURCE_VIEW_DESC, texObject: d::CUtexObject) {
        answer(pResViewDesc, || object_ops::view(texObject), |v| Ok(view_back(v)))
    }

    /// `cuSurfObjectCreate`.
    fn cuSurfObjectCreate(pSurfObject: *mut d::CUsurfObject, pResDesc: *const d::CUDA_RESOURCE_DESC) {
        ready()?;
        // SAFETY: API contract.
        let res = resource(&unsafe { read(pResDesc) }?)?;
        let obj = via_core(|| object_ops::create_surface(&res))?;
        // SAFETY: the caller's out-pointer (API contract; null is refused).
        unsafe { out(pSurfObject, obj) }
    }

    /// `cuSurfObjectDestroy`.
    fn cuSurfObjectDestroy(surfObject: d::CUsurfObject) {
        ready()?;
        via_core(|| object_ops::destroy(surfObject, true))
    }

    /// `cuSurfObjectGetResourceDesc`.
    fn cuSurfObjectGetResourceDesc(pResDesc: *mut d::CUDA_RESOURCE_DESC, surfObject: d::CUsurfObject) {
        answer(pResDesc, || object_ops::resource(surfObject, true), resource_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texture_flags_become_fields_and_back() {
        let t = d::CUDA_TEXTURE_DESC {
            addressMode: [1, 2, 3],
            filterMode: 1,
            flags: d::CU_TRSF_NORMALIZED_COORDINATES | d::CU_TRSF_SRGB,
            maxAnisotropy: 4,
            borderColor: [1.0, 0.0, 0.5, 0.25],
            ..Default::default()
        };
        let r = texture(&t, false);
        assert_eq!(r.readMode, cu::cudaReadModeNormalizedFloat);
        assert_eq!((r.normalizedCoords, r.sRGB, r.seamlessCubemap), (1, 1, 0));
        assert_eq!(texture(&t, true).readMode, cu::cudaReadModeElementType);
        let back = texture_back(&r);
        assert_eq!(back.flags, t.flags);
        assert_eq!(back.addressMode, t.addressMode);
        assert_eq!(back.borderColor, t.borderColor);
        let int = d::CUDA_TEXTURE_DESC {
            flags: d::CU_TRSF_READ_AS_INTEGER,
            ..Default::default()
        };
        assert_eq!(texture(&int, false).readMode, cu::cudaReadModeElementType);
        assert_eq!(
            texture_back(&texture(&int, false)).flags,
            d::CU_TRSF_READ_AS_INTEGER
        );
    }

    #[test]
    fn resources_convert_both_ways() {
        let mut r = d::CUDA_RESOURCE_DESC {
            resType: d::CU_RESOURCE_TYPE_PITCH2D,
            ..Default::default()
        };
        r.res.pitch2D = d::CUDA_RESOURCE_DESC_st__bindgen_ty_1__bindgen_ty_4 {
            devPtr: 0x1000,
            format: d::CU_AD_FORMAT_FLOAT,
            numChannels: 4,
            width: 64,
            height: 32,
            pitchInBytes: 1024,
        };
        let rt = resource(&r).unwrap();
        assert!(float_resource(&rt));
        let back = resource_back(&rt).unwrap();
        // SAFETY: the pitch2D member, as set above.
        let p = unsafe { back.res.pitch2D };
        assert_eq!(
            (
                p.devPtr,
                p.format,
                p.numChannels,
                p.width,
                p.height,
                p.pitchInBytes
            ),
            (0x1000, d::CU_AD_FORMAT_FLOAT, 4, 64, 32, 1024)
        );
        r.res.pitch2D.numChannels = 3;
        assert_eq!(resource(&r).err(), Some(DriverError::INVALID_VALUE));
        r.res.pitch2D.format = d::CU_AD_FORMAT_NV12;
        assert_eq!(resource(&r).err(), Some(DriverError::NOT_SUPPORTED));
    }
}

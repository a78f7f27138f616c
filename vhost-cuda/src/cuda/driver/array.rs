//! The driver calls for pitched memory, 3D copies, CUDA arrays and texture/surface objects,
//! as a supertrait of [`DriverApi`](super::driver::DriverApi) so that these calls stay in one
//! place: [`CudaDriver`] implements them over cudarc's `sys` layer, `NoDriver` refuses them and
//! the unit tests' fake driver emulates them. The contract of `driver/mod.rs` holds here as well.
//!
//! The driver's enums are Rust enums in cudarc, so a value from the guest becomes one only
//! through a `match` here: an unknown value is `CUDA_ERROR_INVALID_VALUE`, never a transmute.

use std::{ffi::c_uint, ptr::null_mut};

use cudarc::driver::sys;

use super::{
    error::{check, CuError, CuResult},
    handles::{driver_handles, ptr, Raw, Stream},
    library::{CudaDriver, NoDriver},
};

/// Driver entry points this file calls (`CudaDriver::load` checks them with the others).
pub(crate) const ARRAY_SYMBOLS: &[&str] = &[
    "cuMemAllocPitch_v2",
    "cuMemsetD2D8Async",
    "cuMemcpy3DAsync_v2",
    "cuArray3DCreate_v2",
    "cuArray3DGetDescriptor_v2",
    "cuArrayDestroy",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy",
    "cuMipmappedArrayGetLevel",
    "cuTexObjectCreate",
    "cuTexObjectDestroy",
    "cuSurfObjectCreate",
    "cuSurfObjectDestroy",
];

/// Where one side of a 3D copy lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mem {
    /// Host memory of this process at this address (a staging buffer).
    Host(usize),
    /// A device address (device memory or host-mapped memory: the driver tells which).
    Device(u64),
    /// A CUDA array.
    Array(Array),
}

driver_handles! {
    /// A `CUarray`.
    Array;
    /// A `CUmipmappedArray`.
    MipmappedArray;
}

/// One side of a [`Copy3DParams`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopySide {
    pub(crate) mem: Mem,
    /// Bytes per row (memory only).
    pub(crate) pitch: usize,
    /// Rows per slice (memory only).
    pub(crate) height: usize,
    /// First byte in a row, first row, first slice.
    pub(crate) x: usize,
    pub(crate) y: usize,
    pub(crate) z: usize,
}

/// `CUDA_MEMCPY3D` in plain terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copy3DParams {
    pub(crate) src: CopySide,
    pub(crate) dst: CopySide,
    /// Bytes per row, rows, slices.
    pub(crate) extent: [usize; 3],
}

/// `CUDA_ARRAY3D_DESCRIPTOR` with the format as its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ArrayDesc {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) depth: usize,
    pub(crate) format: u32,
    pub(crate) channels: u32,
    pub(crate) flags: u32,
}

/// The resource of a texture object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    Array(Array),
    Mipmapped(MipmappedArray),
    Linear {
        ptr: u64,
        format: u32,
        channels: u32,
        size: usize,
    },
    Pitch2D {
        ptr: u64,
        format: u32,
        channels: u32,
        width: usize,
        height: usize,
        pitch: usize,
    },
}

/// `CUDA_TEXTURE_DESC`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct TexParams {
    pub(crate) address: [u32; 3],
    pub(crate) filter: u32,
    pub(crate) flags: u32,
    pub(crate) max_anisotropy: u32,
    pub(crate) mipmap_filter: u32,
    pub(crate) mipmap_bias: f32,
    pub(crate) min_clamp: f32,
    pub(crate) max_clamp: f32,
    pub(crate) border: [f32; 4],
}

/// `CUDA_RESOURCE_VIEW_DESC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ViewParams {
    pub(crate) format: u32,
    pub(crate) extent: [usize; 3],
    /// First and last mipmap level, first and last layer.
    pub(crate) levels: [u32; 4],
}

/// The array, pitched-memory and texture calls of the driver.
pub(crate) trait ArrayDriverApi {
    /// cuMemAllocPitch (16-byte elements): (pointer, pitch).
    fn mem_alloc_pitch(&self, width: usize, rows: usize) -> CuResult<(u64, usize)>;
    /// cuMemsetD2D8Async.
    fn memset_2d(
        &self,
        dst: u64,
        pitch: usize,
        value: u8,
        width: usize,
        height: usize,
        stream: Stream,
    ) -> CuResult<()>;
    /// cuMemcpy3DAsync.
    ///
    /// # Safety
    /// `Mem::Host` sides must be valid for the bytes the copy touches until the stream is
    /// synchronised.
    unsafe fn memcpy_3d(&self, p: &Copy3DParams, stream: Stream) -> CuResult<()>;
    /// cuArray3DCreate.
    fn array_create(&self, d: &ArrayDesc) -> CuResult<Array>;
    /// cuArrayDestroy.
    fn array_destroy(&self, array: Array) -> CuResult<()>;
    /// cuArray3DGetDescriptor.
    fn array_descriptor(&self, array: Array) -> CuResult<ArrayDesc>;
    /// cuMipmappedArrayCreate.
    fn mipmapped_array_create(&self, d: &ArrayDesc, levels: u32) -> CuResult<MipmappedArray>;
    /// cuMipmappedArrayDestroy.
    fn mipmapped_array_destroy(&self, array: MipmappedArray) -> CuResult<()>;
    /// cuMipmappedArrayGetLevel.
    fn mipmapped_array_level(&self, array: MipmappedArray, level: u32) -> CuResult<Array>;
    /// cuTexObjectCreate.
    fn tex_object_create(
        &self,
        res: &Resource,
        tex: &TexParams,
        view: Option<&ViewParams>,
    ) -> CuResult<u64>;
    /// cuTexObjectDestroy.
    fn tex_object_destroy(&self, obj: u64) -> CuResult<()>;
    /// cuSurfObjectCreate over an array.
    fn surf_object_create(&self, array: Array) -> CuResult<u64>;
    /// cuSurfObjectDestroy.
    fn surf_object_destroy(&self, obj: u64) -> CuResult<()>;
}

/// The `CUarray_format` with number `f` (the classic formats).
pub(crate) fn array_format(f: u32) -> CuResult<sys::CUarray_format> {
    use sys::CUarray_format as F;
    Ok(match f {
        0x01 => F::CU_AD_FORMAT_UNSIGNED_INT8,
        0x02 => F::CU_AD_FORMAT_UNSIGNED_INT16,
        0x03 => F::CU_AD_FORMAT_UNSIGNED_INT32,
        0x08 => F::CU_AD_FORMAT_SIGNED_INT8,
        0x09 => F::CU_AD_FORMAT_SIGNED_INT16,
        0x0a => F::CU_AD_FORMAT_SIGNED_INT32,
        0x10 => F::CU_AD_FORMAT_HALF,
        0x20 => F::CU_AD_FORMAT_FLOAT,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

/// Bytes of one channel of format `f` (0 for an unknown format).
pub(crate) fn format_bytes(f: u32) -> usize {
    match f {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 0,
    }
}

/// CUDA_ARRAY3D_LAYERED.
pub(crate) const ARRAY_LAYERED: u32 = 0x1;
/// CUDA_ARRAY3D_CUBEMAP.
pub(crate) const ARRAY_CUBEMAP: u32 = 0x4;

/// An array's bytes as a 3D copy moves them: (bytes per row, rows, slices), every layer and
/// cubemap face a slice. `None` for an unknown format or channel count, a zero width, or a
/// size that overflows.
pub(crate) fn array_layout(d: &ArrayDesc) -> Option<(usize, usize, usize)> {
    let elem = format_bytes(d.format).checked_mul(d.channels as usize)?;
    if elem == 0 || d.width == 0 || ![1, 2, 4].contains(&d.channels) {
        return None;
    }
    let row = d.width.checked_mul(elem)?;
    let (rows, slices) = (d.height.max(1), d.depth.max(1));
    row.checked_mul(rows)?.checked_mul(slices)?;
    Some((row, rows, slices))
}

/// Bytes of an array ([`array_layout`]'s product).
pub(crate) fn array_bytes(d: &ArrayDesc) -> Option<usize> {
    array_layout(d).map(|(row, rows, slices)| row * rows * slices)
}

/// The descriptor of level `level` of a mipmapped array of descriptor `d`, as CUDA sizes
/// levels: each extent halved per level (at least 1; a 0 stays 0), but the layers of a layered
/// array and the faces of a cubemap are not extents and stay.
pub(crate) fn mip_level(d: &ArrayDesc, level: u32) -> ArrayDesc {
    let half = |v: usize| match v {
        0 => 0,
        v => v.checked_shr(level).unwrap_or(0).max(1),
    };
    let keeps_depth = d.flags & (ARRAY_LAYERED | ARRAY_CUBEMAP) != 0;
    ArrayDesc {
        width: half(d.width),
        height: half(d.height),
        depth: if keeps_depth { d.depth } else { half(d.depth) },
        ..*d
    }
}

/// The most levels a mipmapped array of descriptor `d` has: 1 + floor(log2(largest extent)).
pub(crate) fn max_mip_levels(d: &ArrayDesc) -> u32 {
    let keeps_depth = d.flags & (ARRAY_LAYERED | ARRAY_CUBEMAP) != 0;
    let depth = if keeps_depth { 1 } else { d.depth };
    d.width.max(d.height).max(depth).max(1).ilog2() + 1
}

fn address_mode(m: u32) -> CuResult<sys::CUaddress_mode> {
    use sys::CUaddress_mode as A;
    Ok(match m {
        0 => A::CU_TR_ADDRESS_MODE_WRAP,
        1 => A::CU_TR_ADDRESS_MODE_CLAMP,
        2 => A::CU_TR_ADDRESS_MODE_MIRROR,
        3 => A::CU_TR_ADDRESS_MODE_BORDER,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

fn filter_mode(m: u32) -> CuResult<sys::CUfilter_mode> {
    use sys::CUfilter_mode as M;
    Ok(match m {
        0 => M::CU_TR_FILTER_MODE_POINT,
        1 => M::CU_TR_FILTER_MODE_LINEAR,
        _ => return Err(CuError::INVALID_VALUE),
    })
}

fn view_format(f: u32) -> CuResult<sys::CUresourceViewFormat> {
    use sys::CUresourceViewFormat as V;
    const ALL: [V; 35] = [
        V::CU_RES_VIEW_FORMAT_NONE,
        V::CU_RES_VIEW_FORMAT_UINT_1X8,
        V::CU_RES_VIEW_FORMAT_UINT_2X8,
        V::CU_RES_VIEW_FORMAT_UINT_4X8,
        V::CU_RES_VIEW_FORMAT_SINT_1X8,
        V::CU_RES_VIEW_FORMAT_SINT_2X8,
        V::CU_RES_VIEW_FORMAT_SINT_4X8,
        V::CU_RES_VIEW_FORMAT_UINT_1X16,
        V::CU_RES_VIEW_FORMAT_UINT_2X16,
        V::CU_RES_VIEW_FORMAT_UINT_4X16,
        V::CU_RES_VIEW_FORMAT_SINT_1X16,
        V::CU_RES_VIEW_FORMAT_SINT_2X16,
        V::CU_RES_VIEW_FORMAT_SINT_4X16,
        V::CU_RES_VIEW_FORMAT_UINT_1X32,
        V::CU_RES_VIEW_FORMAT_UINT_2X32,
        V::CU_RES_VIEW_FORMAT_UINT_4X32,
        V::CU_RES_VIEW_FORMAT_SINT_1X32,
        V::CU_RES_VIEW_FORMAT_SINT_2X32,
        V::CU_RES_VIEW_FORMAT_SINT_4X32,
        V::CU_RES_VIEW_FORMAT_FLOAT_1X16,
        V::CU_RES_VIEW_FORMAT_FLOAT_2X16,
        V::CU_RES_VIEW_FORMAT_FLOAT_4X16,
        V::CU_RES_VIEW_FORMAT_FLOAT_1X32,
        V::CU_RES_VIEW_FORMAT_FLOAT_2X32,
        V::CU_RES_VIEW_FORMAT_FLOAT_4X32,
        V::CU_RES_VIEW_FORMAT_UNSIGNED_BC1,
        V::CU_RES_VIEW_FORMAT_UNSIGNED_BC2,
        V::CU_RES_VIEW_FORMAT_UNSIGNED_BC3,
        V::CU_RES_VIEW_FORMAT_UNSIGNED_BC4,
        V::CU_RES_VIEW_FORMAT_SIGNED_BC4,
        V::CU_RES_VIEW_FORMAT_UNSIGNED_BC5,
        V::CU_RES_VIEW_FORMAT_SIGNED_BC5,
        V::CU_RES_VIEW_FORMAT_UNSIGNED_BC6H,
        V::CU_RES_VIEW_FORMAT_SIGNED_BC6H,
        V::CU_RES_VIEW_FORMAT_UNSIGNED_BC7,
    ];
    ALL.iter()
        .copied()
        .find(|v| *v as u32 == f)
        .ok_or(CuError::INVALID_VALUE)
}

fn array_descriptor(d: &ArrayDesc) -> CuResult<sys::CUDA_ARRAY3D_DESCRIPTOR> {
    Ok(sys::CUDA_ARRAY3D_DESCRIPTOR {
        Width: d.width,
        Height: d.height,
        Depth: d.depth,
        Format: array_format(d.format)?,
        NumChannels: d.channels,
        Flags: d.flags,
    })
}

fn copy_side(s: &CopySide) -> (sys::CUmemorytype, usize, u64, sys::CUarray) {
    use sys::CUmemorytype as T;
    match s.mem {
        Mem::Host(p) => (T::CU_MEMORYTYPE_HOST, p, 0, null_mut()),
        Mem::Device(d) => (T::CU_MEMORYTYPE_UNIFIED, 0, d, null_mut()),
        Mem::Array(a) => (T::CU_MEMORYTYPE_ARRAY, 0, 0, ptr(a.raw())),
    }
}

// SAFETY (for every unsafe block in this impl): as for `DriverApi for CudaDriver`: each symbol
// was found by `load` (ARRAY_SYMBOLS), out parameters point at live locals, handles come from
// the session's tables, and descriptors are locals borrowed for the whole call.
impl ArrayDriverApi for CudaDriver {
    fn mem_alloc_pitch(&self, width: usize, rows: usize) -> CuResult<(u64, usize)> {
        let (mut p, mut pitch) = (0u64, 0usize);
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMemAllocPitch_v2(&raw mut p, &raw mut pitch, width, rows, 16) })?;
        Ok((p, pitch))
    }

    fn memset_2d(
        &self,
        dst: u64,
        pitch: usize,
        value: u8,
        width: usize,
        height: usize,
        stream: Stream,
    ) -> CuResult<()> {
        // SAFETY: see the impl comment; the session checked the range.
        check(unsafe {
            sys::cuMemsetD2D8Async(dst, pitch, value, width, height, ptr(stream.raw()))
        })
    }

    unsafe fn memcpy_3d(&self, p: &Copy3DParams, stream: Stream) -> CuResult<()> {
        let (st, sh, sd, sa) = copy_side(&p.src);
        let (dt, dh, dd, da) = copy_side(&p.dst);
        let c = sys::CUDA_MEMCPY3D {
            srcXInBytes: p.src.x,
            srcY: p.src.y,
            srcZ: p.src.z,
            srcLOD: 0,
            srcMemoryType: st,
            srcHost: sh as *const _,
            srcDevice: sd,
            srcArray: sa,
            reserved0: null_mut(),
            srcPitch: p.src.pitch,
            srcHeight: p.src.height,
            dstXInBytes: p.dst.x,
            dstY: p.dst.y,
            dstZ: p.dst.z,
            dstLOD: 0,
            dstMemoryType: dt,
            dstHost: dh as *mut _,
            dstDevice: dd,
            dstArray: da,
            reserved1: null_mut(),
            dstPitch: p.dst.pitch,
            dstHeight: p.dst.height,
            WidthInBytes: p.extent[0],
            Height: p.extent[1],
            Depth: p.extent[2],
        };
        // SAFETY: see the impl comment; host sides are valid (caller contract) and device
        // ranges and arrays were checked by the session.
        check(unsafe { sys::cuMemcpy3DAsync_v2(&raw const c, ptr(stream.raw())) })
    }

    fn array_create(&self, d: &ArrayDesc) -> CuResult<Array> {
        let desc = array_descriptor(d)?;
        let mut a: sys::CUarray = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuArray3DCreate_v2(&raw mut a, &raw const desc) })?;
        Ok(Array::from_raw(a as Raw))
    }

    fn array_destroy(&self, array: Array) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuArrayDestroy(ptr(array.raw())) })
    }

    fn array_descriptor(&self, array: Array) -> CuResult<ArrayDesc> {
        let mut d = sys::CUDA_ARRAY3D_DESCRIPTOR {
            Width: 0,
            Height: 0,
            Depth: 0,
            Format: sys::CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8,
            NumChannels: 0,
            Flags: 0,
        };
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuArray3DGetDescriptor_v2(&raw mut d, ptr(array.raw())) })?;
        Ok(ArrayDesc {
            width: d.Width,
            height: d.Height,
            depth: d.Depth,
            format: d.Format as u32,
            channels: d.NumChannels,
            flags: d.Flags,
        })
    }

    fn mipmapped_array_create(&self, d: &ArrayDesc, levels: u32) -> CuResult<MipmappedArray> {
        let desc = array_descriptor(d)?;
        let mut a: sys::CUmipmappedArray = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe {
            sys::cuMipmappedArrayCreate(&raw mut a, &raw const desc, levels as c_uint)
        })?;
        Ok(MipmappedArray::from_raw(a as Raw))
    }

    fn mipmapped_array_destroy(&self, array: MipmappedArray) -> CuResult<()> {
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMipmappedArrayDestroy(ptr(array.raw())) })
    }

    fn mipmapped_array_level(&self, array: MipmappedArray, level: u32) -> CuResult<Array> {
        let mut a: sys::CUarray = null_mut();
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuMipmappedArrayGetLevel(&raw mut a, ptr(array.raw()), level) })?;
        Ok(Array::from_raw(a as Raw))
    }

    fn tex_object_create(
        &self,
        res: &Resource,
        tex: &TexParams,
        view: Option<&ViewParams>,
    ) -> CuResult<u64> {
        let r = resource_desc(res)?;
        let t = sys::CUDA_TEXTURE_DESC {
            addressMode: [
                address_mode(tex.address[0])?,
                address_mode(tex.address[1])?,
                address_mode(tex.address[2])?,
            ],
            filterMode: filter_mode(tex.filter)?,
            flags: tex.flags,
            maxAnisotropy: tex.max_anisotropy,
            mipmapFilterMode: filter_mode(tex.mipmap_filter)?,
            mipmapLevelBias: tex.mipmap_bias,
            minMipmapLevelClamp: tex.min_clamp,
            maxMipmapLevelClamp: tex.max_clamp,
            borderColor: tex.border,
            reserved: [0; 12],
        };
        let v = match view {
            Some(v) => Some(sys::CUDA_RESOURCE_VIEW_DESC {
                format: view_format(v.format)?,
                width: v.extent[0],
                height: v.extent[1],
                depth: v.extent[2],
                firstMipmapLevel: v.levels[0],
                lastMipmapLevel: v.levels[1],
                firstLayer: v.levels[2],
                lastLayer: v.levels[3],
                reserved: [0; 16],
            }),
            None => None,
        };
        let vp = v.as_ref().map_or(std::ptr::null(), |v| v as *const _);
        let mut obj: sys::CUtexObject = 0;
        // SAFETY: see the impl comment; `vp` is null or points at `v`, alive for the call.
        check(unsafe { sys::cuTexObjectCreate(&raw mut obj, &raw const r, &raw const t, vp) })?;
        Ok(obj)
    }

    fn tex_object_destroy(&self, obj: u64) -> CuResult<()> {
        // SAFETY: see the impl comment; the session created `obj`.
        check(unsafe { sys::cuTexObjectDestroy(obj) })
    }

    fn surf_object_create(&self, array: Array) -> CuResult<u64> {
        let r = resource_desc(&Resource::Array(array))?;
        let mut obj: sys::CUsurfObject = 0;
        // SAFETY: see the impl comment.
        check(unsafe { sys::cuSurfObjectCreate(&raw mut obj, &raw const r) })?;
        Ok(obj)
    }

    fn surf_object_destroy(&self, obj: u64) -> CuResult<()> {
        // SAFETY: see the impl comment; the session created `obj`.
        check(unsafe { sys::cuSurfObjectDestroy(obj) })
    }
}

fn resource_desc(res: &Resource) -> CuResult<sys::CUDA_RESOURCE_DESC> {
    use sys::CUresourcetype as T;
    // SAFETY: CUDA_RESOURCE_DESC is plain C data (integers, pointers, a union of them), for
    // which all-zero bytes are valid; the driver requires the unused parts to be zero.
    let mut r: sys::CUDA_RESOURCE_DESC = unsafe { std::mem::zeroed() };
    match *res {
        Resource::Array(a) => {
            r.resType = T::CU_RESOURCE_TYPE_ARRAY;
            r.res.array.hArray = ptr(a.raw());
        }
        Resource::Mipmapped(m) => {
            r.resType = T::CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
            r.res.mipmap.hMipmappedArray = ptr(m.raw());
        }
        Resource::Linear {
            ptr: p,
            format,
            channels,
            size,
        } => {
            r.resType = T::CU_RESOURCE_TYPE_LINEAR;
            r.res.linear.devPtr = p;
            r.res.linear.format = array_format(format)?;
            r.res.linear.numChannels = channels;
            r.res.linear.sizeInBytes = size;
        }
        Resource::Pitch2D {
            ptr: p,
            format,
            channels,
            width,
            height,
            pitch,
        } => {
            r.resType = T::CU_RESOURCE_TYPE_PITCH2D;
            r.res.pitch2D.devPtr = p;
            r.res.pitch2D.format = array_format(format)?;
            r.res.pitch2D.numChannels = channels;
            r.res.pitch2D.width = width;
            r.res.pitch2D.height = height;
            r.res.pitch2D.pitchInBytes = pitch;
        }
    }
    Ok(r)
}

impl ArrayDriverApi for NoDriver {
    fn mem_alloc_pitch(&self, _: usize, _: usize) -> CuResult<(u64, usize)> {
        Err(CuError::NO_DEVICE)
    }
    fn memset_2d(&self, _: u64, _: usize, _: u8, _: usize, _: usize, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    unsafe fn memcpy_3d(&self, _: &Copy3DParams, _: Stream) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn array_create(&self, _: &ArrayDesc) -> CuResult<Array> {
        Err(CuError::NO_DEVICE)
    }
    fn array_destroy(&self, _: Array) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn array_descriptor(&self, _: Array) -> CuResult<ArrayDesc> {
        Err(CuError::NO_DEVICE)
    }
    fn mipmapped_array_create(&self, _: &ArrayDesc, _: u32) -> CuResult<MipmappedArray> {
        Err(CuError::NO_DEVICE)
    }
    fn mipmapped_array_destroy(&self, _: MipmappedArray) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn mipmapped_array_level(&self, _: MipmappedArray, _: u32) -> CuResult<Array> {
        Err(CuError::NO_DEVICE)
    }
    fn tex_object_create(
        &self,
        _: &Resource,
        _: &TexParams,
        _: Option<&ViewParams>,
    ) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn tex_object_destroy(&self, _: u64) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
    fn surf_object_create(&self, _: Array) -> CuResult<u64> {
        Err(CuError::NO_DEVICE)
    }
    fn surf_object_destroy(&self, _: u64) -> CuResult<()> {
        Err(CuError::NO_DEVICE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes_and_mip_levels_follow_cuda() {
        let d = |width, height, depth, flags| ArrayDesc {
            width,
            height,
            depth,
            format: 0x20,
            channels: 2,
            flags,
        };
        // 1D, 2D, 3D, layered and cubemap arrays: every layer and face is a slice.
        assert_eq!(array_layout(&d(5, 0, 0, 0)), Some((40, 1, 1)));
        assert_eq!(array_layout(&d(5, 3, 0, 0)), Some((40, 3, 1)));
        assert_eq!(array_layout(&d(5, 3, 2, 0)), Some((40, 3, 2)));
        assert_eq!(array_bytes(&d(4, 4, 6, ARRAY_CUBEMAP)), Some(32 * 4 * 6));
        assert_eq!(array_layout(&d(0, 3, 2, 0)), None);
        assert_eq!(array_layout(&d(usize::MAX, 2, 2, 0)), None);
        assert_eq!(
            array_layout(&ArrayDesc {
                format: 7,
                ..d(1, 1, 1, 0)
            }),
            None
        );
        assert_eq!(
            array_layout(&ArrayDesc {
                channels: 3,
                ..d(1, 1, 1, 0)
            }),
            None
        );
        // Levels halve every extent but layers and faces; a 0 stays 0.
        let m = d(16, 5, 9, 0);
        assert_eq!(max_mip_levels(&m), 5);
        let l2 = mip_level(&m, 2);
        assert_eq!((l2.width, l2.height, l2.depth), (4, 1, 2));
        let l4 = mip_level(&m, 4);
        assert_eq!((l4.width, l4.height, l4.depth), (1, 1, 1));
        let layered = d(8, 8, 3, ARRAY_LAYERED);
        assert_eq!(max_mip_levels(&layered), 4);
        assert_eq!(mip_level(&layered, 3).depth, 3);
        assert_eq!(mip_level(&d(8, 0, 0, 0), 1).height, 0);
        assert_eq!(mip_level(&d(8, 0, 0, 0), 200).width, 1);
    }

    /// Every `sys::cu*` call in this file is in ARRAY_SYMBOLS and the other way round.
    #[test]
    fn array_symbols_match_the_calls() {
        let called = super::super::driver_calls(include_str!("array.rs"));
        let mut required = ARRAY_SYMBOLS.to_vec();
        required.sort_unstable();
        assert_eq!(called, required);
    }

    #[test]
    fn enums_come_only_from_known_values() {
        array_format(0x20).unwrap();
        assert_eq!(array_format(0x04).err(), Some(CuError::INVALID_VALUE));
        assert_eq!(format_bytes(0x10), 2);
        view_format(0x22).unwrap();
        view_format(0x23).unwrap_err();
        address_mode(4).unwrap_err();
        filter_mode(2).unwrap_err();
    }
}

//! Arrays and texture and surface objects (this file), given the session.
//!
//! CUDA arrays, mipmapped arrays and texture/surface objects on the guest side.
//!
//! Array handles (`cudaArray_t`, `cudaMipmappedArray_t`) are the host's session-local handles
//! cast to pointers; the application never dereferences them. Texture and surface objects are
//! the driver's own 64-bit values, which kernels take as arguments; the descriptors they were
//! made from are kept here, because the `cudaGet*ObjectResourceDesc`/`TextureDesc`/
//! `ResourceViewDesc` queries answer what the object was created with.
//!
//! The runtime describes formats with `cudaChannelFormatDesc` (bits per channel and a kind),
//! the driver with a `CUarray_format` and a channel count; [`format_of`] and [`channel_desc`]
//! convert both ways.

use crate::core::conv::low_u32;
use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use qcuda_proto::{tex, Op, TEX_DESC_SIZE};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::transport::session::Session,
    core::transport::Call,
    core::warnings::warn_once,
    generated::{
        self as cu, cudaChannelFormatDesc, cudaResourceDesc, cudaResourceViewDesc, cudaTextureDesc,
    },
};

/// `CUarray_format` values of the classic formats.
mod format {
    pub const U8: u32 = 0x01;
    pub const U16: u32 = 0x02;
    pub const U32: u32 = 0x03;
    pub const S8: u32 = 0x08;
    pub const S16: u32 = 0x09;
    pub const S32: u32 = 0x0a;
    pub const HALF: u32 = 0x10;
    pub const FLOAT: u32 = 0x20;
}

/// The driver's (`CUarray_format`, channels) for a channel descriptor.
pub fn format_of(d: &cudaChannelFormatDesc) -> CudaResult<(u32, u32)> {
    let bits = [d.x, d.y, d.z, d.w];
    let channels = bits.iter().take_while(|b| **b != 0).count();
    if bits[channels..].iter().any(|b| *b != 0) || bits[..channels].iter().any(|b| *b != d.x) {
        return Err(CudaError::INVALID_CHANNEL_DESCRIPTOR);
    }
    if ![1, 2, 4].contains(&channels) {
        return Err(CudaError::INVALID_CHANNEL_DESCRIPTOR);
    }
    let f = match (d.f, d.x) {
        (cu::cudaChannelFormatKindUnsigned, 8) => format::U8,
        (cu::cudaChannelFormatKindUnsigned, 16) => format::U16,
        (cu::cudaChannelFormatKindUnsigned, 32) => format::U32,
        (cu::cudaChannelFormatKindSigned, 8) => format::S8,
        (cu::cudaChannelFormatKindSigned, 16) => format::S16,
        (cu::cudaChannelFormatKindSigned, 32) => format::S32,
        (cu::cudaChannelFormatKindFloat, 16) => format::HALF,
        (cu::cudaChannelFormatKindFloat, 32) => format::FLOAT,
        (cu::cudaChannelFormatKindSigned, _)
        | (cu::cudaChannelFormatKindUnsigned, _)
        | (cu::cudaChannelFormatKindFloat, _)
        | (cu::cudaChannelFormatKindNone, _) => return Err(CudaError::INVALID_CHANNEL_DESCRIPTOR),
        _ => {
            warn_once!(
                "qcuda: NV12, normalized and block-compressed channel formats are not supported"
            );
            return Err(CudaError::NOT_SUPPORTED);
        }
    };
    let channels = u32::try_from(channels).map_err(|_| CudaError::INVALID_CHANNEL_DESCRIPTOR)?;
    Ok((f, channels))
}

/// Bytes of one element of (`format`, `channels`).
pub fn element_bytes(format: u32, channels: u32) -> u64 {
    let b = match format {
        format::U8 | format::S8 => 1,
        format::U16 | format::S16 | format::HALF => 2,
        _ => 4,
    };
    b * u64::from(channels)
}

/// The channel descriptor of (`format`, `channels`).
pub fn channel_desc(format: u32, channels: u32) -> cudaChannelFormatDesc {
    let (bits, f) = match format {
        format::U8 => (8, cu::cudaChannelFormatKindUnsigned),
        format::U16 => (16, cu::cudaChannelFormatKindUnsigned),
        format::U32 => (32, cu::cudaChannelFormatKindUnsigned),
        format::S8 => (8, cu::cudaChannelFormatKindSigned),
        format::S16 => (16, cu::cudaChannelFormatKindSigned),
        format::S32 => (32, cu::cudaChannelFormatKindSigned),
        format::HALF => (16, cu::cudaChannelFormatKindFloat),
        _ => (32, cu::cudaChannelFormatKindFloat),
    };
    let c = |i: u32| if channels > i { bits } else { 0 };
    cudaChannelFormatDesc {
        x: c(0),
        y: c(1),
        z: c(2),
        w: c(3),
        f,
    }
}

/// What the host says of an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayInfo {
    pub extent: [u64; 3],
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

impl ArrayInfo {
    pub fn element_bytes(&self) -> u64 {
        element_bytes(self.format, self.channels)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.extent[0] * self.element_bytes()
    }
}

/// `ArrayInfo` of array `handle`.
pub fn info(session: &Session, device: u32, handle: u64) -> CudaResult<ArrayInfo> {
    if handle == 0 {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    let r = session.submit(Call::new(Op::ArrayInfo, device).args(&[handle]))?;
    Ok(ArrayInfo {
        extent: [r.rets[0], r.rets[1], r.rets[2]],
        format: low_u32(r.rets[3]),
        channels: low_u32(r.rets[4]),
        flags: low_u32(r.rets[5]),
    })
}

/// `cudaArrayDefault`-style flags qcuda passes on (the driver's `CUDA_ARRAY3D_*` bits are the
/// same numbers): layered, surface load/store, cubemap, texture gather.
const ARRAY_FLAGS: u32 = cu::cudaArrayLayered
    | cu::cudaArraySurfaceLoadStore
    | cu::cudaArrayCubemap
    | cu::cudaArrayTextureGather;

/// Creates an array (`levels` 0) or a mipmapped array; returns its handle.
pub fn create(
    session: &Session,
    device: u32,
    desc: &cudaChannelFormatDesc,
    extent: [u64; 3],
    flags: u32,
    levels: u32,
) -> CudaResult<u64> {
    let known = ARRAY_FLAGS
        | cu::cudaArrayColorAttachment
        | cu::cudaArraySparse
        | cu::cudaArrayDeferredMapping;
    if flags & !known != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    if flags & !ARRAY_FLAGS != 0 {
        warn_once!("qcuda: sparse, deferred-mapping and color-attachment arrays are not supported");
        return Err(CudaError::NOT_SUPPORTED);
    }
    let (format, channels) = format_of(desc)?;
    session.check_sticky(device)?;
    let r = session.submit(Call::new(Op::ArrayCreate, device).args(&[
        extent[0],
        extent[1],
        extent[2],
        u64::from(format),
        u64::from(channels),
        u64::from(flags),
        u64::from(levels),
    ]))?;
    Ok(r.rets[0])
}

/// What a texture or surface object was created with.
#[derive(Clone, Copy)]
struct ObjectDescs {
    device: u32,
    res: cudaResourceDesc,
    tex: cudaTextureDesc,
    view: Option<cudaResourceViewDesc>,
}

// SAFETY: the descriptors hold raw pointers (device addresses, array handles) only as values;
// nothing here dereferences them.
unsafe impl Send for ObjectDescs {}

/// Texture and surface objects of this process.
#[derive(Default)]
pub struct Objects {
    by_value: Mutex<HashMap<(u64, bool), ObjectDescs>>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects").finish_non_exhaustive()
    }
}

impl Objects {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, bool), ObjectDescs>> {
        self.by_value.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates a texture object.
    pub fn create_texture(
        &self,
        session: &Session,
        device: u32,
        res: &cudaResourceDesc,
        tex_desc: &cudaTextureDesc,
        view: Option<&cudaResourceViewDesc>,
    ) -> CudaResult<u64> {
        let words = texture_words(res, tex_desc, view)?;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        debug_assert_eq!(bytes.len(), TEX_DESC_SIZE);
        session.check_sticky(device)?;
        let r = session.submit(Call::new(Op::TexObjectCreate, device).input(&bytes))?;
        let obj = r.rets[0];
        self.lock().insert(
            (obj, false),
            ObjectDescs {
                device,
                res: *res,
                tex: *tex_desc,
                view: view.copied(),
            },
        );
        Ok(obj)
    }

    /// Creates a surface object over an array.
    pub fn create_surface(
        &self,
        session: &Session,
        device: u32,
        res: &cudaResourceDesc,
    ) -> CudaResult<u64> {
        if res.resType != cu::cudaResourceTypeArray {
            return Err(CudaError::INVALID_VALUE);
        }
        // SAFETY: `resType` says the union holds `array`.
        let array = unsafe { res.res.array.array } as u64;
        if array == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        session.check_sticky(device)?;
        let r = session.submit(Call::new(Op::SurfObjectCreate, device).args(&[array]))?;
        let obj = r.rets[0];
        self.lock().insert(
            (obj, true),
            ObjectDescs {
                device,
                res: *res,
                tex: cudaTextureDesc::default(),
                view: None,
            },
        );
        Ok(obj)
    }

    /// Destroys a texture (`surface` false) or surface object. Object 0 is a no-op.
    pub fn destroy(
        &self,
        session: &Session,
        device: u32,
        obj: u64,
        surface: bool,
    ) -> CudaResult<()> {
        if obj == 0 {
            return Ok(());
        }
        let op = if surface {
            Op::SurfObjectDestroy
        } else {
            Op::TexObjectDestroy
        };
        session.submit(Call::new(op, device).args(&[obj]))?;
        self.lock().remove(&(obj, surface));
        Ok(())
    }

    /// The resource descriptor an object was created with.
    pub fn resource(&self, obj: u64, surface: bool) -> CudaResult<cudaResourceDesc> {
        self.get(obj, surface).map(|d| d.res)
    }

    /// The texture descriptor a texture object was created with.
    pub fn texture(&self, obj: u64) -> CudaResult<cudaTextureDesc> {
        self.get(obj, false).map(|d| d.tex)
    }

    /// The view a texture object was created with (all zero if none).
    pub fn view(&self, obj: u64) -> CudaResult<cudaResourceViewDesc> {
        self.get(obj, false).map(|d| d.view.unwrap_or_default())
    }

    fn get(&self, obj: u64, surface: bool) -> CudaResult<ObjectDescs> {
        self.lock()
            .get(&(obj, surface))
            .copied()
            .ok_or(CudaError::INVALID_VALUE)
    }

    /// Forgets the objects of `device` (the host destroyed them with the context in
    /// `cudaDeviceReset`).
    pub fn forget_device(&self, device: u32) {
        self.lock().retain(|_, d| d.device != device);
    }
}

fn bool_flag(v: i32, flag: u64) -> u64 {
    if v != 0 {
        flag
    } else {
        0
    }
}

/// The words of `TexObjectCreate`: the runtime's descriptors in the driver's terms.
fn texture_words(
    res: &cudaResourceDesc,
    t: &cudaTextureDesc,
    view: Option<&cudaResourceViewDesc>,
) -> CudaResult<[u64; tex::WORDS]> {
    let mut w = [0u64; tex::WORDS];
    w[tex::RES_TYPE] = u64::from(res.resType);
    match res.resType {
        cu::cudaResourceTypeArray => {
            // SAFETY: `resType` says which member of the union is live.
            w[tex::RES_HANDLE] = unsafe { res.res.array.array } as u64;
        }
        cu::cudaResourceTypeMipmappedArray => {
            // SAFETY: as above.
            w[tex::RES_HANDLE] = unsafe { res.res.mipmap.mipmap } as u64;
        }
        cu::cudaResourceTypeLinear => {
            // SAFETY: as above.
            let l = unsafe { res.res.linear };
            let (f, c) = format_of(&l.desc)?;
            w[tex::RES_HANDLE] = l.devPtr as u64;
            w[tex::RES_FORMAT] = u64::from(f);
            w[tex::RES_CHANNELS] = u64::from(c);
            w[tex::RES_WIDTH] = l.sizeInBytes as u64;
        }
        cu::cudaResourceTypePitch2D => {
            // SAFETY: as above.
            let p = unsafe { res.res.pitch2D };
            let (f, c) = format_of(&p.desc)?;
            w[tex::RES_HANDLE] = p.devPtr as u64;
            w[tex::RES_FORMAT] = u64::from(f);
            w[tex::RES_CHANNELS] = u64::from(c);
            w[tex::RES_WIDTH] = p.width as u64;
            w[tex::RES_HEIGHT] = p.height as u64;
            w[tex::RES_PITCH] = p.pitchInBytes as u64;
        }
        _ => return Err(CudaError::INVALID_VALUE),
    }
    if res.flags != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    for (i, m) in t.addressMode.iter().enumerate() {
        w[tex::ADDRESS_MODE + i] = u64::from(*m);
    }
    w[tex::FILTER_MODE] = u64::from(t.filterMode);
    // CU_TRSF_READ_AS_INTEGER | NORMALIZED_COORDINATES | SRGB | DISABLE_TRILINEAR_OPTIMIZATION
    // | SEAMLESS_CUBEMAP.
    let read_as_integer = match t.readMode {
        cu::cudaReadModeElementType => 0x1,
        cu::cudaReadModeNormalizedFloat => 0,
        _ => return Err(CudaError::INVALID_VALUE),
    };
    w[tex::FLAGS] = read_as_integer
        | bool_flag(t.normalizedCoords, 0x2)
        | bool_flag(t.sRGB, 0x10)
        | bool_flag(t.disableTrilinearOptimization, 0x20)
        | bool_flag(t.seamlessCubemap, 0x40);
    w[tex::MAX_ANISOTROPY] = u64::from(t.maxAnisotropy);
    w[tex::MIPMAP_FILTER_MODE] = u64::from(t.mipmapFilterMode);
    w[tex::MIPMAP_LEVEL_BIAS] = u64::from(t.mipmapLevelBias.to_bits());
    w[tex::MIN_MIPMAP_LEVEL_CLAMP] = u64::from(t.minMipmapLevelClamp.to_bits());
    w[tex::MAX_MIPMAP_LEVEL_CLAMP] = u64::from(t.maxMipmapLevelClamp.to_bits());
    for (i, c) in t.borderColor.iter().enumerate() {
        w[tex::BORDER_COLOR + i] = u64::from(c.to_bits());
    }
    if let Some(v) = view {
        w[tex::VIEW_PRESENT] = 1;
        w[tex::VIEW_FORMAT] = u64::from(v.format);
        w[tex::VIEW_EXTENT] = v.width as u64;
        w[tex::VIEW_EXTENT + 1] = v.height as u64;
        w[tex::VIEW_EXTENT + 2] = v.depth as u64;
        w[tex::VIEW_LEVELS] = u64::from(v.firstMipmapLevel);
        w[tex::VIEW_LEVELS + 1] = u64::from(v.lastMipmapLevel);
        w[tex::VIEW_LEVELS + 2] = u64::from(v.firstLayer);
        w[tex::VIEW_LEVELS + 3] = u64::from(v.lastLayer);
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_descs_round_trip_through_driver_formats() {
        for f in [
            format::U8,
            format::U16,
            format::U32,
            format::S8,
            format::S16,
            format::S32,
            format::HALF,
            format::FLOAT,
        ] {
            for c in [1, 2, 4] {
                assert_eq!(format_of(&channel_desc(f, c)), Ok((f, c)));
            }
        }
        let three = cudaChannelFormatDesc {
            x: 8,
            y: 8,
            z: 8,
            w: 0,
            f: cu::cudaChannelFormatKindUnsigned,
        };
        assert_eq!(
            format_of(&three),
            Err(CudaError::INVALID_CHANNEL_DESCRIPTOR)
        );
        let mixed = cudaChannelFormatDesc {
            y: 16,
            ..channel_desc(format::U8, 2)
        };
        assert_eq!(
            format_of(&mixed),
            Err(CudaError::INVALID_CHANNEL_DESCRIPTOR)
        );
        assert_eq!(element_bytes(format::HALF, 4), 8);
    }
}

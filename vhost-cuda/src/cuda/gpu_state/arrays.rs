//! The session's pitched memory, 2D/3D copies and memsets, CUDA arrays and texture/surface
//! objects (ops 0x0160..=0x016C).
//!
//! Arrays and mipmapped arrays reach the guest as session-local handles; the level arrays of a
//! mipmapped array get handles too, owned by it. Texture and surface objects are different:
//! kernels take the driver's 64-bit value as an argument, so the guest gets the real value,
//! and the session keeps the values it created (by device: a driver may number each context's
//! objects on its own), with how each was made (for a saved state: `arrays/saved.rs`),
//! destroying only those. Every device
//! range a copy, memset or texture touches is checked against the session's memory first
//! (the whole span from the first to the last byte, overflow-checked), and every array offset
//! and extent against the array's own size.

use qcuda_proto::{
    status, tex, Copy3D, Copy3DSide, COPY_ARRAY, COPY_DEVICE, COPY_WIRE, FLAG_ASYNC, TEX_DESC_SIZE,
};

use super::{
    super::{
        driver::array::Array,
        driver::array::{
            format_bytes, max_mip_levels, ArrayDesc, Copy3DParams, CopySide, Mem, Resource,
            TexParams, ViewParams,
        },
        saved_state::{
            tex_desc_ok, SavedResource, SavedTexDesc, SavedView, ARRAY_FLAGS, MAX_OBJECTS,
        },
    },
    flags_u32, ok, ok_rets, on, to_usize, ArrayEntry, ArrayState, Fault, GpuState, MipmappedEntry,
    ObjectEntry, OpResult,
};
use crate::guest_buffer::Request;

mod saved;

/// The row alignment of pitched allocations in the session's range: what cuMemAllocPitch
/// gives.
const PITCH_ALIGN: usize = 512;
// The most arrays (level arrays included), mipmapped arrays and texture or surface objects a
// session may hold, and the flags they may have, are the saved state's (`saved_state.rs`), so
// that whatever a session holds can be saved and nothing else can be restored.

fn invalid() -> Fault {
    Fault::Status(status::INVALID_VALUE)
}

/// The bytes from the first to the last one a pitched 3D region touches: slices of `rows`
/// rows of `pitch` bytes, `extent` = (bytes per row, rows, slices), all nonzero.
fn pitched_span(pitch: u64, rows: u64, extent: [u64; 3]) -> Option<u64> {
    let [w, h, d] = extent;
    if w > pitch || (d > 1 && h > rows) {
        return None;
    }
    let slice = pitch.checked_mul(rows)?;
    (d - 1)
        .checked_mul(slice)?
        .checked_add((h - 1).checked_mul(pitch)?)?
        .checked_add(w)
}

/// A texture descriptor in the saved state's terms (floats as their bits).
fn saved_tex(t: &TexParams) -> SavedTexDesc {
    SavedTexDesc {
        address: t.address,
        filter: t.filter,
        flags: t.flags,
        max_anisotropy: t.max_anisotropy,
        mipmap_filter: t.mipmap_filter,
        mipmap_bias: t.mipmap_bias.to_bits(),
        min_clamp: t.min_clamp.to_bits(),
        max_clamp: t.max_clamp.to_bits(),
        border: t.border.map(f32::to_bits),
    }
}

fn tex_params(t: &SavedTexDesc) -> TexParams {
    TexParams {
        address: t.address,
        filter: t.filter,
        flags: t.flags,
        max_anisotropy: t.max_anisotropy,
        mipmap_filter: t.mipmap_filter,
        mipmap_bias: f32::from_bits(t.mipmap_bias),
        min_clamp: f32::from_bits(t.min_clamp),
        max_clamp: f32::from_bits(t.max_clamp),
        border: t.border.map(f32::from_bits),
    }
}

fn saved_view(v: &ViewParams) -> SavedView {
    SavedView {
        format: v.format,
        extent: v.extent.map(|e| e as u64),
        levels: v.levels,
    }
}

fn view_params(v: &SavedView) -> Result<ViewParams, Fault> {
    Ok(ViewParams {
        format: v.format,
        extent: [
            to_usize(v.extent[0])?,
            to_usize(v.extent[1])?,
            to_usize(v.extent[2])?,
        ],
        levels: v.levels,
    })
}

fn word(words: &[u64], i: usize) -> u64 {
    words.get(i).copied().unwrap_or(0)
}

fn word_u32(words: &[u64], i: usize) -> Result<u32, Fault> {
    u32::try_from(word(words, i)).map_err(|_| invalid())
}

fn word_f32(words: &[u64], i: usize) -> Result<f32, Fault> {
    word_u32(words, i).map(f32::from_bits)
}

impl GpuState {
    /// `MallocPitch`: cuMemAllocPitch; the whole pitch × rows becomes an allocation.
    pub(super) fn malloc_pitch(&mut self, req: &Request) -> OpResult {
        let [width, rows, ..] = req.header().args;
        let dev = self.bind_new(req)?;
        if width == 0 || rows == 0 {
            return ok_rets(&[0, 0]);
        }
        let (w, r) = (to_usize(width)?, to_usize(rows)?);
        if !self.context(dev)?.memory.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let (ptr, pitch) = if self.context(dev)?.range.is_some() {
            // As cuMemAllocPitch pitches rows (measured: CUDA 13.0, H100), in the session's
            // range like every other allocation.
            let pitch = w
                .checked_next_multiple_of(PITCH_ALIGN)
                .ok_or_else(invalid)?;
            let size = (pitch as u64).checked_mul(rows).ok_or_else(invalid)?;
            (self.device_alloc(dev, size)?, pitch)
        } else {
            self.drv.mem_alloc_pitch(w, r).map_err(on(dev))?
        };
        let size = (pitch as u64).checked_mul(rows);
        let inserted = size.map(|s| {
            self.context(dev)
                .map(|c| c.memory.insert_allocation(ptr, s))
        });
        if !matches!(inserted, Some(Ok(Ok(())))) {
            let _ = self.device_free(dev, ptr);
            if matches!(
                inserted,
                Some(Ok(Err(super::super::allocations::TableError::OverQuota)))
            ) {
                return Err(status::MEMORY_ALLOCATION.into());
            }
            return Err(status::UNKNOWN.into());
        }
        ok_rets(&[ptr, pitch as u64])
    }

    /// `Memset3D`: cuMemsetD2D8 over each slice (one call when the slices are contiguous).
    pub(super) fn memset_3d(&mut self, req: &Request) -> OpResult {
        let [ptr, pitch, value, width, height, depth, rows, stream] = req.header().args;
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(stream, dev)?;
        if width == 0 || height == 0 || depth == 0 {
            return ok();
        }
        let span = pitched_span(pitch, rows, [width, height, depth]).ok_or_else(invalid)?;
        self.check_range(dev, ptr, span)?;
        let (p, w, h) = (to_usize(pitch)?, to_usize(width)?, to_usize(height)?);
        let value = (value & 0xff) as u8;
        if depth == 1 || height == rows {
            let all = h.checked_mul(to_usize(depth)?).ok_or_else(invalid)?;
            self.drv
                .memset_2d(ptr, p, value, w, all, stream)
                .map_err(on(dev))?;
            return ok();
        }
        let slice = pitch * rows; // cannot overflow: `pitched_span` computed it
        for z in 0..depth {
            self.drv
                .memset_2d(ptr + z * slice, p, value, w, h, stream)
                .map_err(on(dev))?;
        }
        ok()
    }

    /// The driver's view of one side of a copy on `dev`, checked. `wire` is where the packed
    /// bytes of a `COPY_WIRE` side are.
    fn copy_side(
        &self,
        dev: usize,
        s: &Copy3DSide,
        extent: [u64; 3],
        wire: Option<usize>,
    ) -> Result<CopySide, Fault> {
        let [w, h, d] = extent;
        match s.kind {
            COPY_WIRE => Ok(CopySide {
                mem: Mem::Host(wire.ok_or_else(invalid)?),
                pitch: to_usize(w)?,
                height: to_usize(h)?,
                x: 0,
                y: 0,
                z: 0,
            }),
            COPY_DEVICE => {
                let span = pitched_span(
                    s.pitch,
                    s.height,
                    [s.x.checked_add(w).ok_or_else(invalid)?, h, d],
                )
                .ok_or_else(invalid)?;
                let first =
                    s.z.checked_mul(s.pitch.checked_mul(s.height).ok_or_else(invalid)?)
                        .and_then(|v| v.checked_add(s.y.checked_mul(s.pitch)?))
                        .ok_or_else(invalid)?;
                // From the start of the first row touched: `span` counts x in (its width is
                // x + w), so the check covers the first byte to the last.
                let start = s.addr.checked_add(first).ok_or_else(invalid)?;
                self.check_range_ro(dev, start, span)?;
                Ok(CopySide {
                    mem: Mem::Device(s.addr),
                    pitch: to_usize(s.pitch)?,
                    height: to_usize(s.height)?,
                    x: to_usize(s.x)?,
                    y: to_usize(s.y)?,
                    z: to_usize(s.z)?,
                })
            }
            COPY_ARRAY => {
                let a = self
                    .arrays
                    .arrays
                    .get(s.addr)
                    .ok_or(Fault::Status(status::INVALID_RESOURCE_HANDLE))?;
                if a.dev != dev {
                    return Err(invalid());
                }
                let row = (a.desc.width as u64)
                    .checked_mul(format_bytes(a.desc.format) as u64 * u64::from(a.desc.channels))
                    .ok_or_else(invalid)?;
                let rows = (a.desc.height as u64).max(1);
                let slices = (a.desc.depth as u64).max(1);
                let fits = |o: u64, n: u64, lim: u64| o.checked_add(n).is_some_and(|e| e <= lim);
                if !fits(s.x, w, row) || !fits(s.y, h, rows) || !fits(s.z, d, slices) {
                    return Err(invalid());
                }
                Ok(CopySide {
                    mem: Mem::Array(a.raw),
                    pitch: 0,
                    height: 0,
                    x: to_usize(s.x)?,
                    y: to_usize(s.y)?,
                    z: to_usize(s.z)?,
                })
            }
            _ => Err(invalid()),
        }
    }

    /// `check_range` through a shared borrow, by unified addressing: the range may be the
    /// session's memory on any of its devices (a 3D copy between devices, `cuMemcpy3DPeer`, names
    /// both sides by address alone), host-mapped memory, or mapped VMM memory.
    fn check_range_ro(&self, dev: usize, ptr: u64, len: u64) -> Result<(), Fault> {
        let here = self
            .devices
            .get(dev)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.memory.contains(ptr, len));
        let anywhere = || {
            self.devices
                .iter()
                .flatten()
                .any(|c| c.memory.contains(ptr, len))
        };
        if here
            || anywhere()
            || self.host_memory.contains_device(ptr, len)
            || self.vmm.holds(ptr, len)
            || self.ipc.holds(ptr, len)
            || self.managed_contains(ptr, len)
        {
            Ok(())
        } else {
            Err(invalid())
        }
    }

    /// `Memcpy3D`, `Memcpy3DHtoD`, `Memcpy3DDtoH`.
    pub(super) fn memcpy_3d(&mut self, req: &Request) -> OpResult {
        let desc = req.inputs().first().ok_or_else(invalid)?;
        if desc.len() != qcuda_proto::COPY3D_SIZE {
            return Err(invalid());
        }
        let bytes = desc.to_vec().map_err(|_| invalid())?;
        let c = Copy3D::decode(&bytes).map_err(|_| invalid())?;
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(req.header().args[0], dev)?;
        let (src_wire, dst_wire) = (c.src.kind == COPY_WIRE, c.dst.kind == COPY_WIRE);
        let shape_ok = match req.op() {
            qcuda_proto::Op::Memcpy3DHtoD => src_wire && !dst_wire,
            qcuda_proto::Op::Memcpy3DDtoH => dst_wire && !src_wire,
            _ => !src_wire && !dst_wire,
        };
        if !shape_ok {
            return Err(invalid());
        }
        let extent = [c.width, c.height, c.depth];
        let packed = c.packed_len().ok_or_else(invalid)?;
        let wire_buf = match req.op() {
            qcuda_proto::Op::Memcpy3DHtoD => req.inputs().get(1),
            qcuda_proto::Op::Memcpy3DDtoH => req.outputs().first(),
            _ => None,
        };
        if wire_buf.is_some_and(|b| b.len() as u64 != packed) {
            return Err(invalid());
        }
        if packed == 0 {
            return ok();
        }
        let mut staging = match (req.op(), wire_buf) {
            (qcuda_proto::Op::Memcpy3DHtoD, Some(b)) => b.to_vec().map_err(|_| invalid())?,
            (qcuda_proto::Op::Memcpy3DDtoH, Some(_)) => vec![0u8; to_usize(packed)?],
            _ => Vec::new(),
        };
        let wire = (!staging.is_empty()).then_some(staging.as_mut_ptr() as usize);
        let p = Copy3DParams {
            src: self.copy_side(dev, &c.src, extent, wire)?,
            dst: self.copy_side(dev, &c.dst, extent, wire)?,
            extent: [to_usize(c.width)?, to_usize(c.height)?, to_usize(c.depth)?],
        };
        // SAFETY: the only host side is `staging`, packed bytes of exactly the extent, which
        // lives until after the stream is synchronised below.
        unsafe { self.drv.memcpy_3d(&p, stream) }.map_err(on(dev))?;
        if wire.is_some() || req.header().flags & FLAG_ASYNC == 0 {
            self.drv.stream_synchronize(stream).map_err(on(dev))?;
        }
        if let (qcuda_proto::Op::Memcpy3DDtoH, Some(out)) = (req.op(), wire_buf) {
            out.write_at(0, &staging).map_err(|_| invalid())?;
        }
        ok()
    }

    /// `ArrayCreate`: an array or a mipmapped array.
    pub(super) fn array_create(&mut self, req: &Request) -> OpResult {
        let [w, h, d, format, channels, flags, levels, _] = req.header().args;
        let format = u32::try_from(format).map_err(|_| invalid())?;
        let channels = u32::try_from(channels)
            .ok()
            .filter(|c| [1, 2, 4].contains(c))
            .ok_or_else(invalid)?;
        if format_bytes(format) == 0 {
            return Err(invalid());
        }
        let flags = flags_u32(flags, u64::from(ARRAY_FLAGS))?;
        let levels = u32::try_from(levels).map_err(|_| invalid())?;
        let desc = ArrayDesc {
            width: to_usize(w)?,
            height: to_usize(h)?,
            depth: to_usize(d)?,
            format,
            channels,
            flags,
        };
        // As CUDA documents for mipmapped arrays, the level count is clamped to
        // 1 + floor(log2(largest extent)): a hostile count must not make the driver (or the
        // test double) loop over billions of 1 x 1 levels.
        let levels = levels.min(max_mip_levels(&desc));
        let dev = self.bind_new(req)?;
        if levels == 0 {
            if !self.arrays.arrays.has_room() {
                return Err(status::MEMORY_ALLOCATION.into());
            }
            let raw = self.drv.array_create(&desc).map_err(on(dev))?;
            let entry = ArrayEntry {
                dev,
                raw,
                desc,
                owner: None,
                level: 0,
            };
            let Some(handle) = self.arrays.arrays.insert(&mut self.ids, entry) else {
                let _ = self.drv.array_destroy(raw);
                return Err(status::MEMORY_ALLOCATION.into());
            };
            return ok_rets(&[handle]);
        }
        if !self.arrays.mipmapped.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self
            .drv
            .mipmapped_array_create(&desc, levels)
            .map_err(on(dev))?;
        let Some(handle) = self.arrays.mipmapped.insert(
            &mut self.ids,
            MipmappedEntry {
                dev,
                raw,
                desc,
                levels,
            },
        ) else {
            let _ = self.drv.mipmapped_array_destroy(raw);
            return Err(status::MEMORY_ALLOCATION.into());
        };
        ok_rets(&[handle])
    }

    /// `ArrayDestroy`. A level array goes only with its mipmapped array.
    pub(super) fn array_destroy(&mut self, req: &Request) -> OpResult {
        let [handle, kind, ..] = req.header().args;
        match kind {
            0 => {
                let (dev, raw, owned) = match self.arrays.arrays.get(handle) {
                    Some(a) => (a.dev, a.raw, a.owner.is_some()),
                    None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
                };
                if owned {
                    return Err(invalid());
                }
                self.bind(dev)?;
                let r = self.drv.array_destroy(raw);
                self.arrays.arrays.remove(handle);
                r.map_err(on(dev))?;
            }
            1 => {
                let (dev, raw) = match self.arrays.mipmapped.get(handle) {
                    Some(m) => (m.dev, m.raw),
                    None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
                };
                self.bind(dev)?;
                let r = self.drv.mipmapped_array_destroy(raw);
                self.arrays.mipmapped.remove(handle);
                self.arrays.arrays.retain(|a| a.owner != Some(handle));
                r.map_err(on(dev))?;
            }
            _ => return Err(invalid()),
        }
        ok()
    }

    /// `MipmappedArrayLevel`: one handle per level, made on first request.
    pub(super) fn mipmapped_level(&mut self, req: &Request) -> OpResult {
        let [handle, level, ..] = req.header().args;
        let (dev, raw) = match self.arrays.mipmapped.get(handle) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        let level = u32::try_from(level).map_err(|_| invalid())?;
        self.bind(dev)?;
        let level_raw = self
            .drv
            .mipmapped_array_level(raw, level)
            .map_err(on(dev))?;
        if let Some((h, _)) = self
            .arrays
            .arrays
            .find(|a| a.owner == Some(handle) && a.raw == level_raw)
        {
            return ok_rets(&[h]);
        }
        let desc = self.drv.array_descriptor(level_raw).map_err(on(dev))?;
        let entry = ArrayEntry {
            dev,
            raw: level_raw,
            desc,
            owner: Some(handle),
            level,
        };
        let h = self
            .arrays
            .arrays
            .insert(&mut self.ids, entry)
            .ok_or(status::MEMORY_ALLOCATION)?;
        ok_rets(&[h])
    }

    /// `ArrayInfo`: the driver's descriptor of the array.
    pub(super) fn array_info(&mut self, req: &Request) -> OpResult {
        let (dev, raw) = self.array(req.header().args[0])?;
        self.bind(dev)?;
        let d = self.drv.array_descriptor(raw).map_err(on(dev))?;
        ok_rets(&[
            d.width as u64,
            d.height as u64,
            d.depth as u64,
            u64::from(d.format),
            u64::from(d.channels),
            u64::from(d.flags),
        ])
    }

    fn array(&self, handle: u64) -> Result<(usize, Array), Fault> {
        self.arrays
            .arrays
            .get(handle)
            .map(|a| (a.dev, a.raw))
            .ok_or(Fault::Status(status::INVALID_RESOURCE_HANDLE))
    }

    /// The resource of a texture object from the guest's words, in the session's terms, and
    /// the device linear memory is named on (the request's).
    fn resource_words(
        &self,
        req: &Request,
        words: &[u64],
    ) -> Result<(Option<usize>, SavedResource), Fault> {
        let handle = word(words, tex::RES_HANDLE);
        let format = word_u32(words, tex::RES_FORMAT)?;
        let channels = word_u32(words, tex::RES_CHANNELS)?;
        Ok(match word(words, tex::RES_TYPE) {
            0 => (None, SavedResource::Array(handle)),
            1 => (None, SavedResource::Mipmapped(handle)),
            2 => (
                Some(self.device(req)?),
                SavedResource::Linear {
                    ptr: handle,
                    format,
                    channels,
                    size: word(words, tex::RES_WIDTH),
                },
            ),
            3 => (
                Some(self.device(req)?),
                SavedResource::Pitch2D {
                    ptr: handle,
                    format,
                    channels,
                    width: word(words, tex::RES_WIDTH),
                    height: word(words, tex::RES_HEIGHT),
                    pitch: word(words, tex::RES_PITCH),
                },
            ),
            _ => return Err(invalid()),
        })
    }

    /// The driver's resource of `res`, checked: arrays must be the session's (on `dev`, if
    /// given), memory ranges the session's on `dev` (required for them). Its device.
    fn resource(
        &self,
        dev: Option<usize>,
        res: &SavedResource,
    ) -> Result<(usize, Resource), Fault> {
        let linear_ok =
            |format: u32, channels: u32| format_bytes(format) != 0 && [1, 2, 4].contains(&channels);
        let same = |d: usize| match dev {
            Some(want) if want != d => Err(invalid()),
            _ => Ok(d),
        };
        match *res {
            SavedResource::Array(handle) => {
                let (d, raw) = self.array(handle)?;
                Ok((same(d)?, Resource::Array(raw)))
            }
            SavedResource::Mipmapped(handle) => match self.arrays.mipmapped.get(handle) {
                Some(m) => Ok((same(m.dev)?, Resource::Mipmapped(m.raw))),
                None => Err(status::INVALID_RESOURCE_HANDLE.into()),
            },
            SavedResource::Linear {
                ptr,
                format,
                channels,
                size,
            } => {
                let dev = dev.ok_or_else(invalid)?;
                if !linear_ok(format, channels) || size == 0 {
                    return Err(invalid());
                }
                self.check_range_ro(dev, ptr, size)?;
                Ok((
                    dev,
                    Resource::Linear {
                        ptr,
                        format,
                        channels,
                        size: to_usize(size)?,
                    },
                ))
            }
            SavedResource::Pitch2D {
                ptr,
                format,
                channels,
                width,
                height,
                pitch,
            } => {
                let dev = dev.ok_or_else(invalid)?;
                let elem = format_bytes(format) as u64 * u64::from(channels);
                let row = width.checked_mul(elem).ok_or_else(invalid)?;
                if !linear_ok(format, channels) || row == 0 || height == 0 {
                    return Err(invalid());
                }
                let span = pitched_span(pitch, height, [row, height, 1]).ok_or_else(invalid)?;
                self.check_range_ro(dev, ptr, span)?;
                Ok((
                    dev,
                    Resource::Pitch2D {
                        ptr,
                        format,
                        channels,
                        width: to_usize(width)?,
                        height: to_usize(height)?,
                        pitch: to_usize(pitch)?,
                    },
                ))
            }
        }
    }

    /// `TexObjectCreate`.
    pub(super) fn tex_object_create(&mut self, req: &Request) -> OpResult {
        let buf = req.inputs().first().ok_or_else(invalid)?;
        if buf.len() != TEX_DESC_SIZE {
            return Err(invalid());
        }
        let bytes = buf.to_vec().map_err(|_| invalid())?;
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        let (dev, saved_res) = self.resource_words(req, &words)?;
        let (dev, res) = self.resource(dev, &saved_res)?;
        let t = TexParams {
            address: [
                word_u32(&words, tex::ADDRESS_MODE)?,
                word_u32(&words, tex::ADDRESS_MODE + 1)?,
                word_u32(&words, tex::ADDRESS_MODE + 2)?,
            ],
            filter: word_u32(&words, tex::FILTER_MODE)?,
            flags: word_u32(&words, tex::FLAGS)?,
            max_anisotropy: word_u32(&words, tex::MAX_ANISOTROPY)?,
            mipmap_filter: word_u32(&words, tex::MIPMAP_FILTER_MODE)?,
            mipmap_bias: word_f32(&words, tex::MIPMAP_LEVEL_BIAS)?,
            min_clamp: word_f32(&words, tex::MIN_MIPMAP_LEVEL_CLAMP)?,
            max_clamp: word_f32(&words, tex::MAX_MIPMAP_LEVEL_CLAMP)?,
            border: [
                word_f32(&words, tex::BORDER_COLOR)?,
                word_f32(&words, tex::BORDER_COLOR + 1)?,
                word_f32(&words, tex::BORDER_COLOR + 2)?,
                word_f32(&words, tex::BORDER_COLOR + 3)?,
            ],
        };
        let view = match word(&words, tex::VIEW_PRESENT) {
            0 => None,
            1 => Some(ViewParams {
                format: word_u32(&words, tex::VIEW_FORMAT)?,
                extent: [
                    to_usize(word(&words, tex::VIEW_EXTENT))?,
                    to_usize(word(&words, tex::VIEW_EXTENT + 1))?,
                    to_usize(word(&words, tex::VIEW_EXTENT + 2))?,
                ],
                levels: [
                    word_u32(&words, tex::VIEW_LEVELS)?,
                    word_u32(&words, tex::VIEW_LEVELS + 1)?,
                    word_u32(&words, tex::VIEW_LEVELS + 2)?,
                    word_u32(&words, tex::VIEW_LEVELS + 3)?,
                ],
            }),
            _ => return Err(invalid()),
        };
        // The driver's enums take only their own values (driver/array.rs converts them).
        if !tex_desc_ok(&saved_tex(&t), view.as_ref().map(saved_view).as_ref()) {
            return Err(invalid());
        }
        let made = ObjectEntry {
            dev,
            surface: false,
            seq: 0,
            resource: saved_res,
            tex: t,
            view,
        };
        self.new_object(made, |drv| drv.tex_object_create(&res, &t, view.as_ref()))
    }

    /// `SurfObjectCreate` over an array.
    pub(super) fn surf_object_create(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let (dev, raw) = self.array(handle)?;
        let made = ObjectEntry {
            dev,
            surface: true,
            seq: 0,
            resource: SavedResource::Array(handle),
            tex: TexParams::default(),
            view: None,
        };
        self.new_object(made, |drv| drv.surf_object_create(raw))
    }

    fn new_object(
        &mut self,
        mut made: ObjectEntry,
        create: impl FnOnce(&dyn super::super::driver::DriverApi) -> super::super::driver::CuResult<u64>,
    ) -> OpResult {
        let dev = made.dev;
        self.bind(dev)?;
        if self.arrays.objects.len() >= MAX_OBJECTS {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let obj = create(self.drv.as_ref()).map_err(on(dev))?;
        made.seq = self.arrays.next_seq;
        self.arrays.next_seq += 1;
        self.arrays.objects.insert((dev, obj), made);
        ok_rets(&[obj])
    }

    /// `TexObjectDestroy` and `SurfObjectDestroy`: only objects the session created; the one
    /// on the caller's current device, else the only one of that value on any device.
    pub(super) fn object_destroy(&mut self, req: &Request) -> OpResult {
        let obj = req.header().args[0];
        let surface = req.op() == qcuda_proto::Op::SurfObjectDestroy;
        let here = self
            .device(req)
            .ok()
            .and_then(|d| self.arrays.objects.get(&(d, obj)));
        let mut anywhere = self.arrays.objects.iter().filter(|(&(_, v), _)| v == obj);
        let only = match (anywhere.next(), anywhere.next()) {
            (Some((_, o)), None) => Some(o),
            _ => None,
        };
        let o = match here.or(only) {
            Some(o) if o.surface == surface => *o,
            _ => return Err(invalid()),
        };
        self.bind(o.dev)?;
        let r = if surface {
            self.drv.surf_object_destroy(obj)
        } else {
            self.drv.tex_object_destroy(obj)
        };
        self.arrays.objects.remove(&(o.dev, obj));
        r.map_err(on(o.dev))?;
        ok()
    }
}

#[cfg(test)]
mod tests {
    use super::pitched_span;

    #[test]
    fn pitched_spans_cover_first_to_last_byte() {
        assert_eq!(pitched_span(512, 10, [100, 10, 1]), Some(9 * 512 + 100));
        assert_eq!(
            pitched_span(512, 10, [100, 4, 3]),
            Some(2 * 5120 + 3 * 512 + 100)
        );
        assert_eq!(pitched_span(512, 10, [513, 1, 1]), None);
        assert_eq!(pitched_span(512, 10, [100, 11, 2]), None);
        assert_eq!(pitched_span(u64::MAX, 2, [1, 1, 3]), None);
    }
}

//! The fake driver's arrays, pitched memory, 3D copies and texture/surface objects: arrays are
//! byte vectors (rows of width × element bytes, height rows per slice), copies move real
//! bytes. Texture and surface objects are numbered per context as the driver is believed to
//! number them (small integers from 1, the least free one first; [`FakeDriver::set_object_base`]
//! moves the start, to play a driver that numbers them otherwise). Checks what the real driver checks that the session
//! relies on: live handles, ranges inside allocations and arrays.

use std::collections::{BTreeMap, HashMap};

use super::{
    super::{
        array::{
            format_bytes, max_mip_levels, mip_level, Array, ArrayDesc, ArrayDriverApi,
            Copy3DParams, CopySide, Mem, MipmappedArray, Resource, TexParams, ViewParams,
        },
        CuError, CuResult, DriverApi, Raw, Stream,
    },
    check_stream, fresh, host_slice, uva_slice_mut, Ctx, FakeDriver, INVALID_HANDLE, INVALID_VALUE,
};

/// Bytes per element, row pitch and rows per slice of an array.
fn array_layout(d: &ArrayDesc) -> (usize, usize, usize, usize) {
    let elem = format_bytes(d.format) * d.channels as usize;
    let rows = d.height.max(1);
    let slices = d.depth.max(1);
    // Like the driver, the fake refuses what it cannot hold (a pitch of 0 is refused below).
    (elem, d.width.checked_mul(elem).unwrap_or(0), rows, slices)
}

/// The bytes of one row of a copy side: `len` bytes at row (`y`, `z`) from byte `x`.
fn row<'a>(
    (c, others): (&'a mut Ctx, &'a mut HashMap<Raw, Ctx>),
    registered: &BTreeMap<u64, u64>,
    s: &CopySide,
    x: usize,
    y: usize,
    z: usize,
    len: usize,
) -> CuResult<&'a mut [u8]> {
    match s.mem {
        Mem::Host(p) => {
            let off = (z * s.height + y) * s.pitch + x;
            // SAFETY: host sides are valid for the copy (method contract of `memcpy_3d`).
            Ok(unsafe { std::slice::from_raw_parts_mut((p + off) as *mut u8, len) })
        }
        Mem::Device(d) => {
            let addr = d + ((z * s.height + y) * s.pitch + x) as u64;
            match host_slice(registered, addr, len) {
                // SAFETY: registered ranges stay mapped while registered (method contract of
                // `mem_host_register`).
                Some(p) => Ok(unsafe { std::slice::from_raw_parts_mut(p, len) }),
                // By unified addressing, as the driver reaches every context's memory.
                None => uva_slice_mut(c, others, addr, len),
            }
        }
        Mem::Array(a) => {
            let (desc, bytes) = c.arrays.get_mut(&a.raw()).ok_or(INVALID_HANDLE)?;
            let (_, pitch, rows, slices) = array_layout(desc);
            if x + len > pitch || y >= rows || z >= slices {
                return Err(INVALID_VALUE);
            }
            let off = (z * rows + y) * pitch + x;
            bytes.get_mut(off..off + len).ok_or(INVALID_VALUE)
        }
    }
}

/// How the fake numbers texture and surface objects: as the driver is believed to, small
/// integers from 1 (or the base a test set), the least freed one first, one numbering for
/// the whole process.
#[derive(Debug, Default)]
pub(crate) struct ObjectValues {
    /// The least value handed out (0: 1).
    base: u64,
    /// The next value never handed out (0: `base`).
    high: u64,
    freed: std::collections::BTreeSet<u64>,
}

impl ObjectValues {
    fn take(&mut self) -> u64 {
        if let Some(v) = self.freed.pop_first() {
            return v;
        }
        let v = self.high.max(self.base).max(1);
        self.high = v + 1;
        v
    }
}

impl FakeDriver {
    fn values(&self) -> std::sync::MutexGuard<'_, ObjectValues> {
        self.object_values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Arrays (level arrays included), mipmapped arrays and objects alive in every context.
    pub(crate) fn array_objects(&self) -> (usize, usize, usize) {
        let st = self.st();
        let c = st.contexts.values();
        c.fold((0, 0, 0), |(a, m, o), c| {
            (
                a + c.arrays.len(),
                m + c.mipmapped.len(),
                o + c.objects.len(),
            )
        })
    }

    /// Frees the values of objects gone with their context.
    pub(super) fn free_object_values(&self, values: impl Iterator<Item = u64>) {
        self.values().freed.extend(values);
    }

    /// Makes texture and surface objects take values from `base` up (a driver that numbers
    /// them unlike the one a state was saved under).
    pub(crate) fn set_object_base(&self, base: u64) {
        self.values().base = base;
    }

    /// The bytes texture or surface object `obj` views, from any context: an array's (a
    /// mipmapped array's first level), or the device memory of a linear or pitched resource.
    pub(crate) fn object_reads(&self, obj: u64) -> Option<Vec<u8>> {
        let res = {
            let st = self.st();
            let c = st
                .contexts
                .values()
                .find(|c| c.objects.contains_key(&obj))?;
            let res = *c.objects.get(&obj)?;
            let array = match res {
                Resource::Array(a) => Some(a),
                Resource::Mipmapped(m) => c.mipmapped.get(&m.raw())?.first().copied(),
                _ => None,
            };
            if let Some(a) = array {
                return c.arrays.get(&a.raw()).map(|(_, v)| v.clone());
            }
            res
        };
        match res {
            Resource::Linear { ptr, size, .. } => self.peek(ptr, size),
            Resource::Pitch2D {
                ptr, height, pitch, ..
            } => self.peek(ptr, pitch * height),
            _ => None,
        }
    }
}

impl ArrayDriverApi for FakeDriver {
    fn mem_alloc_pitch(&self, width: usize, rows: usize) -> CuResult<(u64, usize)> {
        if width == 0 || rows == 0 {
            return Err(INVALID_VALUE);
        }
        let pitch = width.div_ceil(512).checked_mul(512).ok_or(INVALID_VALUE)?;
        let p = self.mem_alloc(pitch.checked_mul(rows).ok_or(INVALID_VALUE)?)?;
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
        let registered = self.st().registered.clone();
        self.with_ctx("memset_2d", |c, _| {
            check_stream(c, stream.raw())?;
            if width > pitch {
                return Err(INVALID_VALUE);
            }
            let rows = CopySide {
                mem: Mem::Device(dst),
                pitch,
                height,
                x: 0,
                y: 0,
                z: 0,
            };
            for y in 0..height {
                row((c, &mut HashMap::new()), &registered, &rows, 0, y, 0, width)?.fill(value);
            }
            Ok(())
        })
    }

    unsafe fn memcpy_3d(&self, p: &Copy3DParams, stream: Stream) -> CuResult<()> {
        let registered = self.st().registered.clone();
        self.with_ctx_uva("memcpy_3d", |c, others| {
            check_stream(c, stream.raw())?;
            let [w, h, d] = p.extent;
            for z in 0..d {
                for y in 0..h {
                    let (s, t) = (&p.src, &p.dst);
                    let data = row((c, others), &registered, s, s.x, s.y + y, s.z + z, w)?.to_vec();
                    row((c, others), &registered, t, t.x, t.y + y, t.z + z, w)?
                        .copy_from_slice(&data);
                }
            }
            Ok(())
        })
    }

    fn array_create(&self, d: &ArrayDesc) -> CuResult<Array> {
        // Arrays count against the fake's host-memory budget too (their bound is per context).
        let (_, pitch, rows, slices) = array_layout(d);
        let want = pitch
            .saturating_mul(rows)
            .saturating_mul(slices)
            .min(16 << 20);
        self.check_ram(&self.st(), want)?;
        self.with_ctx("array_create", |c, next| {
            let (elem, pitch, rows, slices) = array_layout(d);
            if elem == 0 || d.width == 0 || ![1, 2, 4].contains(&d.channels) {
                return Err(INVALID_VALUE);
            }
            let bytes = pitch
                .checked_mul(rows)
                .and_then(|b| b.checked_mul(slices))
                // The fake keeps arrays in host memory: it answers out of memory well before
                // the machine would (a GPU has its own bound).
                .filter(|&b| b > 0 && b <= 16 << 20)
                .ok_or(CuError(2))?;
            let held: usize = c.arrays.values().map(|(_, v)| v.len()).sum();
            if held + bytes > 256 << 20 {
                return Err(CuError(2));
            }
            let a = fresh(next);
            c.arrays.insert(a, (*d, vec![0; bytes]));
            Ok(Array::from_raw(a))
        })
    }

    fn array_destroy(&self, array: Array) -> CuResult<()> {
        self.with_ctx("array_destroy", |c, _| {
            c.arrays
                .remove(&array.raw())
                .map(|_| ())
                .ok_or(INVALID_HANDLE)
        })
    }

    fn array_descriptor(&self, array: Array) -> CuResult<ArrayDesc> {
        self.with_ctx("array_descriptor", |c, _| {
            c.arrays
                .get(&array.raw())
                .map(|(d, _)| *d)
                .ok_or(INVALID_HANDLE)
        })
    }

    fn mipmapped_array_create(&self, d: &ArrayDesc, levels: u32) -> CuResult<MipmappedArray> {
        if levels == 0 {
            return Err(INVALID_VALUE);
        }
        if levels > max_mip_levels(d) {
            return Err(INVALID_VALUE);
        }
        let mut level_arrays = Vec::new();
        for l in 0..levels {
            match self.array_create(&mip_level(d, l)) {
                Ok(a) => level_arrays.push(a),
                Err(e) => {
                    for a in level_arrays {
                        let _ = self.array_destroy(a);
                    }
                    return Err(e);
                }
            }
        }
        self.with_ctx("mipmapped_array_create", |c, next| {
            let m = fresh(next);
            c.mipmapped.insert(m, level_arrays);
            Ok(MipmappedArray::from_raw(m))
        })
    }

    fn mipmapped_array_destroy(&self, array: MipmappedArray) -> CuResult<()> {
        self.with_ctx("mipmapped_array_destroy", |c, _| {
            let levels = c.mipmapped.remove(&array.raw()).ok_or(INVALID_HANDLE)?;
            for l in levels {
                c.arrays.remove(&l.raw());
            }
            Ok(())
        })
    }

    fn mipmapped_array_level(&self, array: MipmappedArray, level: u32) -> CuResult<Array> {
        self.with_ctx("mipmapped_array_level", |c, _| {
            let levels = c.mipmapped.get(&array.raw()).ok_or(INVALID_HANDLE)?;
            levels.get(level as usize).copied().ok_or(INVALID_VALUE)
        })
    }

    fn tex_object_create(
        &self,
        res: &Resource,
        _tex: &TexParams,
        _view: Option<&ViewParams>,
    ) -> CuResult<u64> {
        self.with_ctx("tex_object_create", |c, _| {
            match *res {
                Resource::Array(a) if !c.arrays.contains_key(&a.raw()) => {
                    return Err(INVALID_HANDLE)
                }
                Resource::Mipmapped(m) if !c.mipmapped.contains_key(&m.raw()) => {
                    return Err(INVALID_HANDLE)
                }
                _ => {}
            }
            Ok(())
        })?;
        let t = self.values().take();
        self.with_ctx("tex_object_create", |c, _| {
            c.objects.insert(t, *res);
            Ok(t)
        })
    }

    fn tex_object_destroy(&self, obj: u64) -> CuResult<()> {
        self.with_ctx("tex_object_destroy", |c, _| {
            c.objects.remove(&obj).map(|_| ()).ok_or(INVALID_VALUE)
        })?;
        self.values().freed.insert(obj);
        Ok(())
    }

    fn surf_object_create(&self, array: Array) -> CuResult<u64> {
        self.with_ctx("surf_object_create", |c, _| {
            if !c.arrays.contains_key(&array.raw()) {
                return Err(INVALID_HANDLE);
            }
            Ok(())
        })?;
        let s = self.values().take();
        self.with_ctx("surf_object_create", |c, _| {
            c.objects.insert(s, Resource::Array(array));
            Ok(s)
        })
    }

    fn surf_object_destroy(&self, obj: u64) -> CuResult<()> {
        self.with_ctx("surf_object_destroy", |c, _| {
            c.objects.remove(&obj).map(|_| ()).ok_or(INVALID_VALUE)
        })?;
        self.values().freed.insert(obj);
        Ok(())
    }
}

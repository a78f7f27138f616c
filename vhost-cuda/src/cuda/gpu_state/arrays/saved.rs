//! Capture and restore of the session's arrays, mipmapped arrays (every level's contents, and
//! the level handles the guest holds) and texture and surface objects (`checkpoint.rs` calls
//! these; `saved_state.rs` holds the format).
//!
//! Arrays come back under the handles the guest holds, with their descriptors and contents.
//! A texture or surface object is the driver's own 64-bit value, which the guest holds and
//! may have stored in device memory, so a restore must get the same value from the driver or
//! fail: it makes the objects again in ascending order of value, and while the driver hands
//! out a value below the one wanted (values freed before the capture, or taken by objects of
//! another kind), it keeps that object as a filler and asks again; once every object has its
//! value the fillers are destroyed. This reproduces every value when the driver numbers a
//! fresh context's objects upwards from where the capture's context started, reusing freed
//! values or not; a driver that hands out a value above the one wanted (or one already
//! taken) fails the restore, and nothing it made stays.

use super::*;
use crate::cuda::{
    driver::{
        array::{array_layout, MipmappedArray},
        NULL_STREAM,
    },
    gpu_state::CheckpointError,
    saved_state::{
        SavedArray, SavedArrayDesc, SavedLevel, SavedMipmapped, SavedObject, SavedState,
    },
};

/// Objects made only to take values the restored ones must not get.
#[derive(Default)]
struct Fillers {
    /// (device, surface, value) of each.
    made: Vec<(usize, bool, u64)>,
    /// (device, value) of each.
    values: std::collections::HashSet<(usize, u64)>,
}

/// What capture saves of arrays and objects.
pub(in crate::cuda::gpu_state) type SavedArrays = (
    Vec<SavedArray>,
    Vec<SavedMipmapped>,
    Vec<SavedLevel>,
    Vec<SavedObject>,
);

fn mismatch(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Mismatch(what.into())
}

fn dev_u32(dev: usize) -> u32 {
    u32::try_from(dev).unwrap_or(u32::MAX)
}

/// Why an array cannot be saved.
const UNSUPPORTED_ARRAY: &str = "a CUDA array of a kind the saved state does not hold \
                                 (sparse, deferred mapping, or a format other than the \
                                 classic 8/16/32-bit integer, half and float ones)";

/// Why an object cannot be saved.
const DANGLING_OBJECT: &str = "a texture or surface object over an array or memory freed \
                               since it was made";

impl GpuState {
    /// The whole array `raw` (on `dev`, bound) as host bytes: every row, layer and face,
    /// through the driver's 3D copy.
    fn read_array(
        &mut self,
        dev: usize,
        raw: Array,
        desc: &ArrayDesc,
    ) -> Result<Vec<u8>, CheckpointError> {
        let (row, rows, slices) =
            array_layout(desc).ok_or(CheckpointError::Unsupported(UNSUPPORTED_ARRAY))?;
        let mut v = vec![0u8; row * rows * slices];
        let p = Copy3DParams {
            src: CopySide {
                mem: Mem::Array(raw),
                pitch: 0,
                height: 0,
                x: 0,
                y: 0,
                z: 0,
            },
            dst: CopySide {
                mem: Mem::Host(v.as_mut_ptr() as usize),
                pitch: row,
                height: rows,
                x: 0,
                y: 0,
                z: 0,
            },
            extent: [row, rows, slices],
        };
        // SAFETY: the host side is `v`, exactly the bytes of the extent, alive until after
        // the stream is synchronised.
        unsafe { self.drv.memcpy_3d(&p, NULL_STREAM) }.map_err(on(dev))?;
        self.drv.stream_synchronize(NULL_STREAM).map_err(on(dev))?;
        Ok(v)
    }

    /// Writes `bytes` (exactly the array's, as [`read_array`](Self::read_array) gives them)
    /// into array `raw` (its context bound).
    fn write_array(
        &mut self,
        dev: usize,
        raw: Array,
        desc: &ArrayDesc,
        bytes: &[u8],
    ) -> Result<(), CheckpointError> {
        let (row, rows, slices) =
            array_layout(desc).ok_or_else(|| mismatch("an array's descriptor"))?;
        if bytes.len() != row * rows * slices {
            return Err(mismatch("an array's contents"));
        }
        let p = Copy3DParams {
            src: CopySide {
                mem: Mem::Host(bytes.as_ptr() as usize),
                pitch: row,
                height: rows,
                x: 0,
                y: 0,
                z: 0,
            },
            dst: CopySide {
                mem: Mem::Array(raw),
                pitch: 0,
                height: 0,
                x: 0,
                y: 0,
                z: 0,
            },
            extent: [row, rows, slices],
        };
        // SAFETY: the host side is `bytes`, exactly the bytes of the extent, borrowed until
        // after the stream is synchronised; the driver only reads it.
        unsafe { self.drv.memcpy_3d(&p, NULL_STREAM) }.map_err(on(dev))?;
        self.drv.stream_synchronize(NULL_STREAM).map_err(on(dev))?;
        Ok(())
    }

    /// Saves every array (with its contents), mipmapped array (with every level's), level
    /// handle and object (in creation order). Changes nothing.
    pub(in crate::cuda::gpu_state) fn capture_arrays(
        &mut self,
    ) -> Result<SavedArrays, CheckpointError> {
        let mut handles: Vec<u64> = self.arrays.arrays.iter().map(|(h, _)| h).collect();
        handles.sort_unstable();
        let (mut arrays, mut levels) = (Vec::new(), Vec::new());
        for handle in handles {
            let Some(a) = self.arrays.arrays.get(handle) else {
                continue;
            };
            let (dev, raw, desc, owner, level) = (a.dev, a.raw, a.desc, a.owner, a.level);
            if let Some(mipmapped) = owner {
                levels.push(SavedLevel {
                    handle,
                    mipmapped,
                    level,
                });
                continue;
            }
            if desc.flags & !ARRAY_FLAGS != 0 {
                return Err(CheckpointError::Unsupported(UNSUPPORTED_ARRAY));
            }
            self.bind(dev)?;
            let contents = self.read_array(dev, raw, &desc)?;
            arrays.push(SavedArray {
                handle,
                dev: dev_u32(dev),
                desc: SavedArrayDesc::from_desc(&desc),
                contents,
            });
        }
        let mut handles: Vec<u64> = self.arrays.mipmapped.iter().map(|(h, _)| h).collect();
        handles.sort_unstable();
        let mut mipmapped = Vec::new();
        for handle in handles {
            let Some(m) = self.arrays.mipmapped.get(handle) else {
                continue;
            };
            let (dev, raw, desc, n) = (m.dev, m.raw, m.desc, m.levels);
            if desc.flags & !ARRAY_FLAGS != 0 {
                return Err(CheckpointError::Unsupported(UNSUPPORTED_ARRAY));
            }
            self.bind(dev)?;
            let mut contents = Vec::with_capacity(n as usize);
            for l in 0..n {
                let level = self.drv.mipmapped_array_level(raw, l).map_err(on(dev))?;
                let d = self.drv.array_descriptor(level).map_err(on(dev))?;
                contents.push(self.read_array(dev, level, &d)?);
            }
            mipmapped.push(SavedMipmapped {
                handle,
                dev: dev_u32(dev),
                desc: SavedArrayDesc::from_desc(&desc),
                levels: contents,
            });
        }
        let mut objects: Vec<(u64, ObjectEntry)> = self
            .arrays
            .objects
            .iter()
            .map(|(&(_, v), o)| (v, *o))
            .collect();
        objects.sort_unstable_by_key(|(_, o)| o.seq);
        let mut saved = Vec::with_capacity(objects.len());
        for (value, o) in objects {
            // Over what is still there: a restore makes the resource first.
            if self.resource(Some(o.dev), &o.resource).is_err() {
                return Err(CheckpointError::Unsupported(DANGLING_OBJECT));
            }
            saved.push(SavedObject {
                value,
                dev: dev_u32(o.dev),
                surface: o.surface,
                resource: o.resource,
                tex: if o.surface {
                    SavedTexDesc::default()
                } else {
                    saved_tex(&o.tex)
                },
                view: o.view.as_ref().map(saved_view),
            });
        }
        Ok((arrays, mipmapped, levels, saved))
    }

    /// Makes the saved arrays and objects again (see the module documentation). On an error
    /// everything it made is destroyed again, fillers included, and the tables are as before
    /// (empty: the state is fresh).
    pub(in crate::cuda::gpu_state) fn restore_arrays(
        &mut self,
        saved: &SavedState,
    ) -> Result<(), CheckpointError> {
        let r = self.restore_arrays_inner(saved);
        if r.is_err() {
            self.release_arrays();
        }
        r
    }

    /// Destroys every array, mipmapped array and object the session holds.
    fn release_arrays(&mut self) {
        let objects: Vec<((usize, u64), ObjectEntry)> = self.arrays.objects.drain().collect();
        for ((_, value), o) in objects {
            if self.bind(o.dev).is_ok() {
                let _ = if o.surface {
                    self.drv.surf_object_destroy(value)
                } else {
                    self.drv.tex_object_destroy(value)
                };
            }
        }
        let mipmapped: Vec<(usize, MipmappedArray)> = self
            .arrays
            .mipmapped
            .values()
            .map(|m| (m.dev, m.raw))
            .collect();
        let arrays: Vec<(usize, Array)> = self
            .arrays
            .arrays
            .values()
            .filter(|a| a.owner.is_none())
            .map(|a| (a.dev, a.raw))
            .collect();
        for (dev, raw) in mipmapped {
            if self.bind(dev).is_ok() {
                let _ = self.drv.mipmapped_array_destroy(raw);
            }
        }
        for (dev, raw) in arrays {
            if self.bind(dev).is_ok() {
                let _ = self.drv.array_destroy(raw);
            }
        }
        self.arrays = ArrayState::default();
    }

    fn restore_arrays_inner(&mut self, saved: &SavedState) -> Result<(), CheckpointError> {
        let desc_of = |d: &SavedArrayDesc| {
            d.to_desc()
                .filter(|d| d.flags & !ARRAY_FLAGS == 0 && array_layout(d).is_some())
                .ok_or_else(|| mismatch("an array's descriptor"))
        };
        for a in &saved.arrays {
            let dev = self.saved_dev(a.dev)?;
            let desc = desc_of(&a.desc)?;
            self.bind(dev)?;
            if !self.arrays.arrays.has_room() {
                return Err(CheckpointError::Cuda(status::MEMORY_ALLOCATION));
            }
            let raw = self.drv.array_create(&desc).map_err(on(dev))?;
            let entry = ArrayEntry {
                dev,
                raw,
                desc,
                owner: None,
                level: 0,
            };
            if !self.arrays.arrays.insert_at(&self.ids, a.handle, entry) {
                let _ = self.drv.array_destroy(raw);
                return Err(mismatch(format!("array handle {}", a.handle)));
            }
            self.write_array(dev, raw, &desc, &a.contents)?;
        }
        for m in &saved.mipmapped {
            let dev = self.saved_dev(m.dev)?;
            let desc = desc_of(&m.desc)?;
            let levels = u32::try_from(m.levels.len())
                .ok()
                .filter(|&n| n > 0 && n <= max_mip_levels(&desc))
                .ok_or_else(|| mismatch("a mipmapped array's levels"))?;
            self.bind(dev)?;
            if !self.arrays.mipmapped.has_room() {
                return Err(CheckpointError::Cuda(status::MEMORY_ALLOCATION));
            }
            let raw = self
                .drv
                .mipmapped_array_create(&desc, levels)
                .map_err(on(dev))?;
            let entry = MipmappedEntry {
                dev,
                raw,
                desc,
                levels,
            };
            if !self.arrays.mipmapped.insert_at(&self.ids, m.handle, entry) {
                let _ = self.drv.mipmapped_array_destroy(raw);
                return Err(mismatch(format!("mipmapped array handle {}", m.handle)));
            }
            for (l, contents) in (0..levels).zip(&m.levels) {
                let level = self.drv.mipmapped_array_level(raw, l).map_err(on(dev))?;
                let d = self.drv.array_descriptor(level).map_err(on(dev))?;
                self.write_array(dev, level, &d, contents)?;
            }
        }
        for l in &saved.levels {
            let (dev, raw, n) = self
                .arrays
                .mipmapped
                .get(l.mipmapped)
                .map(|m| (m.dev, m.raw, m.levels))
                .ok_or_else(|| mismatch("a level of no mipmapped array"))?;
            if l.level >= n
                || self
                    .arrays
                    .arrays
                    .find(|a| a.owner == Some(l.mipmapped) && a.level == l.level)
                    .is_some()
            {
                return Err(mismatch(format!("level array {}", l.handle)));
            }
            self.bind(dev)?;
            let level = self
                .drv
                .mipmapped_array_level(raw, l.level)
                .map_err(on(dev))?;
            let desc = self.drv.array_descriptor(level).map_err(on(dev))?;
            let entry = ArrayEntry {
                dev,
                raw: level,
                desc,
                owner: Some(l.mipmapped),
                level: l.level,
            };
            if !self.arrays.arrays.insert_at(&self.ids, l.handle, entry) {
                return Err(mismatch(format!("level array handle {}", l.handle)));
            }
        }
        self.restore_objects(&saved.objects)
    }

    /// Makes the objects again with their old values (see the module documentation).
    fn restore_objects(&mut self, objects: &[SavedObject]) -> Result<(), CheckpointError> {
        if objects.len() > MAX_OBJECTS {
            return Err(CheckpointError::Cuda(status::MEMORY_ALLOCATION));
        }
        let mut order: Vec<usize> = (0..objects.len()).collect();
        order.sort_unstable_by_key(|&i| (objects[i].value, objects[i].dev));
        let mut fillers = Fillers::default();
        let mut result = Ok(());
        for i in order {
            result = self.restore_object(i as u64, &objects[i], &mut fillers);
            if result.is_err() {
                break;
            }
        }
        for (dev, surface, value) in fillers.made {
            if self.bind(dev).is_ok() {
                let _ = if surface {
                    self.drv.surf_object_destroy(value)
                } else {
                    self.drv.tex_object_destroy(value)
                };
            }
        }
        self.arrays.next_seq = objects.len() as u64;
        result
    }

    fn restore_object(
        &mut self,
        seq: u64,
        o: &SavedObject,
        fillers: &mut Fillers,
    ) -> Result<(), CheckpointError> {
        let dev = self.saved_dev(o.dev)?;
        let (_, res) = self
            .resource(Some(dev), &o.resource)
            .map_err(|_| mismatch(format!("object {:#x}'s resource", o.value)))?;
        let tex = tex_params(&o.tex);
        let view = o.view.as_ref().map(view_params).transpose()?;
        let desc_ok = if o.surface {
            matches!(res, Resource::Array(_)) && o.view.is_none()
        } else {
            tex_desc_ok(&o.tex, o.view.as_ref())
        };
        if !desc_ok {
            return Err(mismatch(format!("object {:#x}'s descriptor", o.value)));
        }
        self.bind(dev)?;
        loop {
            let got = match res {
                Resource::Array(raw) if o.surface => self.drv.surf_object_create(raw),
                _ => self.drv.tex_object_create(&res, &tex, view.as_ref()),
            }
            .map_err(on(dev))?;
            if got == o.value {
                let entry = ObjectEntry {
                    dev,
                    surface: o.surface,
                    seq,
                    resource: o.resource,
                    tex,
                    view,
                };
                self.arrays.objects.insert((dev, got), entry);
                return Ok(());
            }
            let taken = self.arrays.objects.contains_key(&(dev, got))
                || fillers.values.contains(&(dev, got));
            if got < o.value && !taken && fillers.made.len() < MAX_OBJECTS {
                fillers.made.push((dev, o.surface, got));
                fillers.values.insert((dev, got));
                continue;
            }
            let _ = if o.surface {
                self.drv.surf_object_destroy(got)
            } else {
                self.drv.tex_object_destroy(got)
            };
            return Err(mismatch(format!(
                "{} object {:#x}: the driver gives {got:#x} (object values are the driver's; \
                 the guest holds the old one)",
                if o.surface { "surface" } else { "texture" },
                o.value
            )));
        }
    }
}

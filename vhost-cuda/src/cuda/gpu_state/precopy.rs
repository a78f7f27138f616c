//! The source's side of device-memory pre-copy (the hash, logs and tracking are
//! `cuda/precopy.rs`'s): hashing chunks on the GPU ([`GpuState::hash_chunks`]), the rounds
//! sent while the VM runs ([`GpuState::precopy_round`], [`GpuState::precopy_reset`]), and what
//! the final save (`checkpoint.rs`) and a restore from a store need of them: which chunks
//! still hash as sent, and the check that what a store gave back hashes as the source said.
//!
//! The kernel is loaded into a context on first need, with a non-blocking stream of the
//! worker's own, so that pre-copy work runs beside the guest's (the legacy stream would wait
//! for every blocking stream of the program, and they for it); it and its two device buffers
//! (the ranges of a launch and their sums: 16 bytes per range, at most
//! [`KERNEL_MAX_RANGES`] ranges) go with the context. A round reads one chunk at a time
//! through the context's pinned staging buffer into one host buffer of a chunk's bytes,
//! hashes that copy and writes it: the hash sent is the hash of the bytes sent, whatever the
//! guest's kernels write meanwhile.

use std::collections::HashSet;

use super::*;
use crate::cuda::{
    precopy::{
        self, chunks_of, ChunkIndex, ChunkKey, RoundFigures, Tracking, CHUNK_MAX, KERNEL_BLOCK,
        KERNEL_MAX_RANGES, KERNEL_NAME, KERNEL_PTX,
    },
    saved_state::SavedChunkRef,
};

/// cudaStreamNonBlocking.
const NON_BLOCKING: u32 = 1;

fn dev_u32(dev: usize) -> u32 {
    u32::try_from(dev).unwrap_or(u32::MAX)
}

fn mismatch(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Mismatch(what.into())
}

/// The kernel's grid x for ranges of at most `longest` bytes: enough blocks that each thread
/// hashes about 32 words, at most 64 per range.
fn blocks_per_range(longest: u64) -> u32 {
    let words_per_block = u64::from(KERNEL_BLOCK) * 32;
    let blocks = (longest / 8).div_ceil(words_per_block).clamp(1, 64);
    u32::try_from(blocks).unwrap_or(64)
}

impl GpuState {
    /// The pre-copy kernel of `dev` (bound), loaded on first need, with buffers for at least
    /// `ranges` ranges.
    fn precopy_device(&mut self, dev: usize, ranges: usize) -> Result<&PrecopyDevice, Fault> {
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        if c.precopy.is_none() {
            let mut image = KERNEL_PTX.as_bytes().to_vec();
            image.push(0);
            let module = drv.module_load(&image).map_err(on(dev))?;
            let made = drv.module_function(module, KERNEL_NAME).and_then(|func| {
                let stream = drv.stream_create(NON_BLOCKING, 0)?;
                Ok((func, stream))
            });
            let (func, stream) = match made {
                Ok(m) => m,
                Err(e) => {
                    let _ = drv.module_unload(module);
                    return Err(on(dev)(e));
                }
            };
            c.precopy = Some(PrecopyDevice {
                func,
                stream,
                ranges: 0,
                sums: 0,
                capacity: 0,
            });
        }
        let Some(p) = c.precopy.as_mut() else {
            return Err(status::UNKNOWN.into());
        };
        if p.capacity < ranges {
            let capacity = ranges.next_power_of_two().clamp(64, KERNEL_MAX_RANGES);
            if p.capacity > 0 {
                let _ = drv.mem_free(p.ranges);
                let _ = drv.mem_free(p.sums);
                p.capacity = 0;
            }
            let r = drv.mem_alloc(capacity * 16).map_err(on(dev))?;
            let s = match drv.mem_alloc(capacity * 16) {
                Ok(s) => s,
                Err(e) => {
                    let _ = drv.mem_free(r);
                    return Err(on(dev)(e));
                }
            };
            (p.ranges, p.sums, p.capacity) = (r, s, capacity);
        }
        Ok(p)
    }

    /// The chunk hash ([`precopy::hash`]) of each `(guest device, device address, length)`,
    /// computed by the kernel over the device's memory: one launch per device (per
    /// [`KERNEL_MAX_RANGES`] ranges), on the pre-copy stream. Every range must lie in memory of
    /// the session (an allocation or a global) on a device it has a context on.
    pub fn hash_chunks(
        &mut self,
        chunks: &[(u32, u64, u64)],
    ) -> Result<Vec<[u64; 2]>, CheckpointError> {
        let mut out = vec![[0u64; 2]; chunks.len()];
        let mut devs: Vec<u32> = chunks.iter().map(|c| c.0).collect();
        devs.sort_unstable();
        devs.dedup();
        for d in devs {
            let dev = self.saved_dev(d)?;
            if !self.bind_existing(dev)? {
                return Err(mismatch(format!(
                    "hashing memory of device {dev}, which has no context"
                )));
            }
            let mine: Vec<usize> = (0..chunks.len()).filter(|&i| chunks[i].0 == d).collect();
            {
                let c = self.context(dev)?;
                if let Some(&i) = mine.iter().find(|&&i| {
                    let (_, ptr, len) = chunks[i];
                    !c.memory.contains(ptr, len.max(1))
                }) {
                    return Err(mismatch(format!(
                        "hashing {} bytes at {:#x}: not memory of the session",
                        chunks[i].2, chunks[i].1
                    )));
                }
            }
            for batch in mine.chunks(KERNEL_MAX_RANGES) {
                let ranges: Vec<(u64, u64)> =
                    batch.iter().map(|&i| (chunks[i].1, chunks[i].2)).collect();
                let sums = self.launch_hash(dev, &ranges)?;
                for (&i, h) in batch.iter().zip(sums) {
                    out[i] = h;
                }
            }
        }
        Ok(out)
    }

    /// One launch of the kernel over `ranges` (at most [`KERNEL_MAX_RANGES`]) of `dev`
    /// (bound): their hashes.
    fn launch_hash(
        &mut self,
        dev: usize,
        ranges: &[(u64, u64)],
    ) -> Result<Vec<[u64; 2]>, CheckpointError> {
        let n = ranges.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let drv = Arc::clone(&self.drv);
        let p = self.precopy_device(dev, n)?;
        let (func, stream, ranges_buf, sums_buf) = (p.func, p.stream, p.ranges, p.sums);
        let table: Vec<u8> = ranges
            .iter()
            .flat_map(|&(ptr, len)| [ptr.to_le_bytes(), len.to_le_bytes()])
            .flatten()
            .collect();
        let mut sums = vec![0u8; n * 16];
        let longest = ranges.iter().map(|r| r.1).max().unwrap_or(0);
        let cfg = LaunchConfig {
            grid: [
                blocks_per_range(longest),
                u32::try_from(n).unwrap_or(u32::MAX),
                1,
            ],
            block: [KERNEL_BLOCK, 1, 1],
            shared_mem: 0,
        };
        let mut count = u32::try_from(n).map_err(|_| mismatch("too many ranges"))?;
        let (mut rp, mut sp) = (ranges_buf, sums_buf);
        let mut params: [*mut std::ffi::c_void; 3] = [
            (&raw mut rp).cast(),
            (&raw mut count).cast(),
            (&raw mut sp).cast(),
        ];
        let queued = (|| {
            // SAFETY: `table` is readable for its length and outlives the stream's
            // synchronisation below (it is dropped after this function's last driver call).
            unsafe { drv.memcpy_htod(ranges_buf, table.as_ptr(), table.len(), stream) }?;
            drv.memset(sums_buf, 0, MemsetWidth::W32, n * 4, stream)?;
            // SAFETY: the kernel takes (u64, u32, u64) and `params` points at a u64, a u32
            // and a u64 that live until the call returns (the driver copies them).
            unsafe { drv.launch(func, &cfg, stream, &mut params) }?;
            // SAFETY: `sums` is writable for `n * 16` bytes and not touched until the stream
            // is synchronised below.
            unsafe { drv.memcpy_dtoh(sums.as_mut_ptr(), sums_buf, n * 16, stream) }
        })();
        // Waited for also after an error: nothing may still use `table` or `sums`.
        let synced = drv.stream_synchronize(stream);
        queued.and(synced).map_err(on(dev))?;
        Ok(sums
            .chunks_exact(16)
            .map(|s| {
                let word = |i: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&s[i..i + 8]);
                    u64::from_le_bytes(w)
                };
                [word(0), word(8)]
            })
            .collect())
    }

    /// Every chunk of every live allocation of the session, by device and address.
    fn live_chunks(&self) -> Vec<ChunkKey> {
        let mut keys = Vec::new();
        for (dev, c) in self.devices.iter().enumerate() {
            let Some(c) = c else { continue };
            for (alloc, size) in c.memory.allocations() {
                keys.extend(chunks_of(size).map(|(offset, len)| ChunkKey {
                    dev: dev_u32(dev),
                    alloc,
                    offset,
                    len,
                }));
            }
        }
        keys
    }

    /// The hashes of `keys`, computed on the GPU.
    fn hash_keys(&mut self, keys: &[ChunkKey]) -> Result<Vec<[u64; 2]>, CheckpointError> {
        let ranges: Vec<(u32, u64, u64)> = keys.iter().map(|k| (k.dev, k.addr(), k.len)).collect();
        self.hash_chunks(&ranges)
    }

    /// Writes one pre-copy round into `out`: a chunk log (`cuda/precopy.rs`) of at most
    /// `budget` bytes of chunk data (a budget under [`CHUNK_MAX`] counts as one chunk, so
    /// that every round goes forward). The state remembers the hash of what it sent of each
    /// chunk; a pass starts by hashing every chunk of every live allocation (one launch per
    /// device) and lists those whose hash is not what was sent; rounds send from that list
    /// (each chunk copied, the copy hashed, then written), and when it is empty the next pass
    /// starts, up to `max_passes` passes. A pass that finds nothing to send ends the passes
    /// early. After the last, a round sends nothing and reports pending 0. Allocations freed
    /// since are dropped from the tracking.
    ///
    /// Runs between the guest's ops, while its work goes on on the GPU. While a stream capture
    /// is under way (or a managed allocation is being made) a round sends nothing and reports
    /// at least 1 byte pending if passes are left; what the final save refuses
    /// (`CheckpointError::Unsupported`), a sticky error, or a paused state fail it.
    pub fn precopy_round(
        &mut self,
        budget: u64,
        max_passes: u32,
        out: &mut impl std::io::Write,
    ) -> Result<RoundFigures, CheckpointError> {
        if self.paused.is_some() {
            return Err(CheckpointError::WrongPhase("paused"));
        }
        match self.check_capturable() {
            Ok(()) => {}
            Err(CheckpointError::Busy) => {
                // A stream capture under way forbids the driver calls a round makes (they
                // would invalidate the guest's capture): this round sends nothing, and says
                // there is more while passes are left.
                let t = self.precopy.get_or_insert_default();
                let more = !t.finished && (t.passes < max_passes || !t.dirty.is_empty());
                return Ok(RoundFigures {
                    pending: if more { t.pending().max(1) } else { 0 },
                    pass: t.passes,
                    ..RoundFigures::default()
                });
            }
            Err(e) => return Err(e),
        }
        let mut t = self.precopy.take().unwrap_or_default();
        let figures = self.precopy_round_with(&mut t, budget.max(CHUNK_MAX), max_passes, out);
        self.precopy = Some(t);
        let figures = figures?;
        debug!(
            session = self.id,
            chunks = figures.chunks,
            bytes = figures.bytes,
            pending = figures.pending,
            pass = figures.pass,
            "pre-copy round"
        );
        Ok(figures)
    }

    fn precopy_round_with(
        &mut self,
        t: &mut Tracking,
        budget: u64,
        max_passes: u32,
        out: &mut impl std::io::Write,
    ) -> Result<RoundFigures, CheckpointError> {
        let mut figures = RoundFigures::default();
        if t.dirty.is_empty() {
            self.next_pass(t, max_passes)?;
        }
        let live: HashSet<ChunkKey> = self.live_chunks().into_iter().collect();
        let mut copy = Vec::new();
        while let Some(&key) = t.dirty.front() {
            if figures.bytes + key.len > budget {
                break;
            }
            t.dirty.pop_front();
            if !live.contains(&key) {
                // Freed since the pass began.
                continue;
            }
            self.read_chunk(key, &mut copy)?;
            let h = precopy::hash(&copy);
            precopy::write_chunk(out, key.dev, key.alloc, key.offset, &copy, h)
                .map_err(|e| mismatch(format!("writing a pre-copy round: {e}")))?;
            t.sent.insert(key, h);
            figures.chunks += 1;
            figures.bytes += key.len;
        }
        if t.dirty.is_empty() {
            // The next pass now, so that `pending` says what it will send.
            self.next_pass(t, max_passes)?;
        }
        figures.pending = t.pending();
        figures.pass = t.passes;
        Ok(figures)
    }

    /// Starts the next pass if one is left (see [`precopy_round`](Self::precopy_round)).
    fn next_pass(&mut self, t: &mut Tracking, max_passes: u32) -> Result<(), CheckpointError> {
        if t.finished || t.passes >= max_passes {
            t.finished = true;
            return Ok(());
        }
        let keys = self.live_chunks();
        let hashes = self.hash_keys(&keys)?;
        let current: Vec<(ChunkKey, [u64; 2])> = keys.into_iter().zip(hashes).collect();
        if !t.start_pass(&current) {
            t.finished = true;
        }
        Ok(())
    }

    /// Copies chunk `key` into `copy` (resized to its length), on the pre-copy stream: through
    /// the context's pinned staging buffer, or straight into `copy` without one.
    fn read_chunk(&mut self, key: ChunkKey, copy: &mut Vec<u8>) -> Result<(), CheckpointError> {
        let dev = self.saved_dev(key.dev)?;
        self.bind(dev)?;
        let stream = self.precopy_device(dev, 0)?.stream;
        let n = to_usize(key.len)?;
        copy.resize(n, 0);
        let drv = Arc::clone(&self.drv);
        let half = self.host.tuning.staging_half;
        let staged = half >= 64 << 10;
        if let Some(staging) = Self::staging_for(drv.as_ref(), self.context(dev)?, half, staged) {
            staging
                .read_device(drv.as_ref(), key.addr(), copy, stream)
                .map_err(on(dev))?;
            return Ok(());
        }
        // SAFETY: `copy` is writable for `n` bytes and not touched until the stream is
        // synchronised right after.
        let queued = unsafe { drv.memcpy_dtoh(copy.as_mut_ptr(), key.addr(), n, stream) };
        let synced = drv.stream_synchronize(stream);
        queued.and(synced).map_err(on(dev))?;
        Ok(())
    }

    /// Forgets every pre-copy round (a migration that failed or was cancelled): the next
    /// round starts from nothing sent, and the final save carries every byte again.
    pub fn precopy_reset(&mut self) {
        self.precopy = None;
    }

    /// Whether pre-copy rounds were sent (the final save then refers to what still hashes
    /// as sent).
    pub fn precopy_tracking(&self) -> bool {
        self.precopy.as_ref().is_some_and(|t| !t.sent.is_empty())
    }

    /// For the final save: of each allocation `(ptr, size)` of `dev` (bound, synchronised),
    /// the chunks that still hash as sent, which the saved state refers to instead of
    /// carrying their bytes. Empty lists without pre-copy tracking.
    pub(super) fn unchanged_chunks(
        &mut self,
        dev: usize,
        allocations: &[(u64, u64)],
    ) -> Result<Vec<Vec<SavedChunkRef>>, CheckpointError> {
        let mut refs = vec![Vec::new(); allocations.len()];
        let Some(t) = self.precopy.as_ref() else {
            return Ok(refs);
        };
        let mut asked = Vec::new();
        for (i, &(alloc, size)) in allocations.iter().enumerate() {
            for (offset, len) in chunks_of(size) {
                let key = ChunkKey {
                    dev: dev_u32(dev),
                    alloc,
                    offset,
                    len,
                };
                if let Some(&h) = t.sent.get(&key) {
                    asked.push((i, key, h));
                }
            }
        }
        if asked.is_empty() {
            return Ok(refs);
        }
        let keys: Vec<ChunkKey> = asked.iter().map(|a| a.1).collect();
        let now = self.hash_keys(&keys)?;
        for ((i, key, sent), h) in asked.into_iter().zip(now) {
            if h == sent {
                refs[i].push(SavedChunkRef {
                    offset: key.offset,
                    len: key.len,
                    hash: h,
                });
            }
        }
        Ok(refs)
    }

    /// For a restore: the bytes of each chunk an allocation at `alloc` of `dev` refers to,
    /// from `store`, checked to be the chunk it names with the hash it names.
    pub(super) fn stored_chunk<'s>(
        store: Option<&ChunkIndex<'s>>,
        dev: u32,
        alloc: u64,
        r: &SavedChunkRef,
    ) -> Result<&'s [u8], CheckpointError> {
        let Some(store) = store else {
            return Err(mismatch(
                "the state refers to pre-copied chunks, and no pre-copy store came with it",
            ));
        };
        let key = ChunkKey {
            dev,
            alloc,
            offset: r.offset,
            len: r.len,
        };
        match store.get(&key) {
            Some((h, bytes)) if h == r.hash => Ok(bytes),
            Some(_) => Err(mismatch(format!(
                "pre-copied chunk {:#x}+{:#x} ({} bytes) of device {dev} has another hash in \
                 the store than the final state names",
                alloc, r.offset, r.len
            ))),
            None => Err(mismatch(format!(
                "pre-copied chunk {:#x}+{:#x} ({} bytes) of device {dev} is missing from the \
                 store",
                alloc, r.offset, r.len
            ))),
        }
    }

    /// After a restore wrote chunks from a store: each `(dev, address, length, hash)` hashes
    /// on the GPU as the source said (what the destination's daemon appended is what the
    /// source sent).
    pub(super) fn check_restored_chunks(
        &mut self,
        chunks: &[(u32, u64, u64, [u64; 2])],
    ) -> Result<(), CheckpointError> {
        let ranges: Vec<(u32, u64, u64)> = chunks.iter().map(|c| (c.0, c.1, c.2)).collect();
        let hashes = self.hash_chunks(&ranges)?;
        match chunks.iter().zip(hashes).find(|(c, h)| c.3 != *h) {
            Some((c, _)) => Err(mismatch(format!(
                "the pre-copied chunk at {:#x} ({} bytes) of device {} does not hash as the \
                 source said once restored",
                c.1, c.2, c.0
            ))),
            None => Ok(()),
        }
    }
}

/// The chunks of an allocation of `size` bytes that its saved state carries inline, given
/// those it refers to (`refs`, in order): (offset, length) of each.
pub(super) fn inline_chunks(size: u64, refs: &[SavedChunkRef]) -> Vec<(u64, u64)> {
    let referred: HashSet<u64> = refs.iter().map(|r| r.offset).collect();
    chunks_of(size)
        .filter(|(offset, _)| !referred.contains(offset))
        .collect()
}

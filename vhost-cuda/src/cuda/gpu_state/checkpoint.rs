//! Capture and restore of the GPU state (`saved_state.rs` holds the format), and pause and
//! resume on top of them.
//!
//! The state keeps, beside each driver object, how it was made: a module's image and the
//! globals the guest looked up, a function's kernel name and the attributes set on it, a
//! stream's flags, priority and attributes, an event's flags, a context's limits, cache
//! configuration and peers, and every allocation's block in the session's reserved range
//! (`device_arena.rs`). [`GpuState::capture`] first quiesces the state (the worker runs one op
//! at a time, so nothing is in flight between ops; a stream capture under way, or a managed
//! allocation placed and not yet mapped, makes it answer [`CheckpointError::Busy`], to be tried
//! again once it has ended; then every context
//! is synchronised), then copies that record and the contents of every allocation and looked-up
//! global into a [`SavedState`]. [`GpuState::restore_into`] makes it all again in fresh
//! contexts: the same ranges at the same addresses, every block at its old address with its
//! contents, and every object under its old handle, so the guest's handles and device pointers
//! (those stored in device memory included) stay valid.
//!
//! What the record cannot make again is refused at capture, with the program left running
//! ([`CheckpointError::Unsupported`]): the graphs and executable graphs `graphs/saved.rs`
//! cannot make again (graphs and executable graphs themselves are saved), the texture or
//! surface objects `arrays/saved.rs` cannot make again (arrays, mipmapped arrays and objects
//! themselves are saved), stream-ordered allocations still live (the driver's pools place them;
//! the pools themselves, the default ones and those the program created, are saved with their
//! attributes, access and which one is current), graph memory, and allocations outside a
//! reserved range. Guest memory mapped for the GPU (pinned, registered and managed memory) is
//! saved by description, its pages staying guest RAM (`saved_host_memory.rs`). The
//! program's own VMM objects (`vmm.rs`) are saved: each physical allocation with its
//! properties, handle (and its reference count) and contents, read through a window of its
//! own; each reservation, made again at its address with the address as the hint (refused if
//! the driver places it elsewhere); each mapping with its offset and access. CUDA arrays,
//! mipmapped arrays (every level) and texture and surface objects are saved too
//! (`arrays/saved.rs`): arrays come back under their handles with their contents, objects with
//! their old values or not at all (the restore fails).
//!
//! [`GpuState::save`] is the capture encoded (`saved_state.rs`), and [`GpuState::restore`]
//! decodes and restores bytes from anywhere into a fresh state: the path a restart of the
//! daemon or a migration takes. Pause and resume on one worker take a shorter one:
//! [`GpuState::pause`] quiesces the state the same way, copies every mapped run of its reserved
//! ranges (so every allocation, at its address) to host memory and unmaps them, giving the GPU
//! memory back, and keeps the contexts, with what lives in them (modules and their globals,
//! streams, events, graphs, arrays, pools, host registrations); [`GpuState::resume`] maps the
//! runs back at their addresses and copies their contents back. So a pause needs nothing
//! refused above but a capture under way and allocations outside a range. An op that arrives
//! while paused resumes first: the guest program goes on unaware.

use super::precopy::inline_chunks;
use super::*;
use crate::cuda::{
    copy::SinkError,
    device_arena::{ArenaError, SavedRun as ArenaRun},
    precopy::{self, ChunkIndex},
    saved_state::{
        SavedAllocation, SavedContext, SavedEvent, SavedFunction, SavedGlobal, SavedModule,
        SavedPool, SavedRun, SavedStream,
    },
};

/// Bytes a state without a staging buffer streams from the device at a time.
const UNSTAGED_PIECE: usize = 8 << 20;

/// Why [`GpuState::stream_device`] stopped.
enum StreamedError {
    /// Reading the device.
    Device(CheckpointError),
    /// Writing the bytes.
    Write(std::io::Error),
}

/// A global the guest looked up: name, address, size.
type LookedUpGlobal = (CString, u64, u64);

/// Staging halves smaller than this cost more in calls than they save: such a context's
/// checkpoint copies go straight to pageable memory.
const STAGED_MIN_HALF: usize = 64 << 10;

fn mismatch(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Mismatch(what.into())
}

fn dev_u32(dev: usize) -> u32 {
    u32::try_from(dev).unwrap_or(u32::MAX)
}

/// Why a state that shares memory with another process is refused: the other process maps
/// the same physical memory, which a pause would take away and a restore cannot give back.
const IPC_SHARED: &str = "device memory shared with another process of the VM (CUDA IPC: \
                          cudaIpcGetMemHandle / cudaIpcOpenMemHandle, cuMem shareable handles)";

impl GpuState {
    /// True while paused.
    pub fn is_paused(&self) -> bool {
        self.paused.is_some()
    }

    /// Refuses a state the record cannot make again (see the module documentation).
    pub(super) fn check_capturable(&mut self) -> Result<(), CheckpointError> {
        if let Some(s) = self.host.sticky_error() {
            return Err(CheckpointError::Cuda(s));
        }
        if self.capture_under_way() || self.managed_unmapped() {
            return Err(CheckpointError::Busy);
        }
        if self.ipc.shares() {
            return Err(CheckpointError::Unsupported(IPC_SHARED));
        }
        for c in self.devices.iter().flatten() {
            if !c.memory.stream_ordered().is_empty() {
                return Err(CheckpointError::Unsupported(
                    "live stream-ordered allocations (cudaMallocAsync not yet freed: the \
                     driver's pools place them, not the reserved range)",
                ));
            }
            if c.memory.has_graph_memory() {
                return Err(CheckpointError::Unsupported(
                    "graph memory (memory allocation nodes)",
                ));
            }
            if c.range.is_none() && !c.memory.allocations().is_empty() {
                return Err(CheckpointError::Unsupported(
                    "allocations outside a reserved device range (--gpu-va-base off, or the \
                     driver placed the range elsewhere)",
                ));
            }
        }
        Ok(())
    }

    /// Copies `len` bytes of device memory at `ptr` (its context bound) to the host: through
    /// the context's pinned staging buffer, double-buffered (`Staging::read_device`), or, if
    /// it has none (or its halves are under [`STAGED_MIN_HALF`]), straight into pageable
    /// memory.
    pub(super) fn read_device(
        &mut self,
        dev: usize,
        ptr: u64,
        len: u64,
    ) -> Result<Vec<u8>, CheckpointError> {
        let n = to_usize(len)?;
        let mut v = vec![0u8; n];
        if n == 0 {
            return Ok(v);
        }
        let drv = Arc::clone(&self.drv);
        let half = self.host.tuning.staging_half;
        let staged = half >= STAGED_MIN_HALF;
        if let Some(staging) = Self::staging_for(drv.as_ref(), self.context(dev)?, half, staged) {
            staging
                .read_device(drv.as_ref(), ptr, &mut v, NULL_STREAM)
                .map_err(on(dev))?;
            return Ok(v);
        }
        // SAFETY: `v` is writable for `n` bytes and outlives the synchronised copy.
        unsafe { drv.memcpy_dtoh(v.as_mut_ptr(), ptr, n, NULL_STREAM) }.map_err(on(dev))?;
        drv.stream_synchronize(NULL_STREAM).map_err(on(dev))?;
        Ok(v)
    }

    /// Copies `bytes` to device memory at `ptr` (its context bound), through the context's
    /// pinned staging buffer as [`read_device`](Self::read_device) does.
    pub(super) fn write_device(
        &mut self,
        dev: usize,
        ptr: u64,
        bytes: &[u8],
    ) -> Result<(), CheckpointError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let drv = Arc::clone(&self.drv);
        let half = self.host.tuning.staging_half;
        let staged = half >= STAGED_MIN_HALF;
        if let Some(staging) = Self::staging_for(drv.as_ref(), self.context(dev)?, half, staged) {
            staging
                .write_device(drv.as_ref(), ptr, bytes, NULL_STREAM)
                .map_err(on(dev))?;
            return Ok(());
        }
        // SAFETY: `bytes` is readable for its length and outlives the synchronised copy.
        unsafe { drv.memcpy_htod(ptr, bytes.as_ptr(), bytes.len(), NULL_STREAM) }
            .map_err(on(dev))?;
        drv.stream_synchronize(NULL_STREAM).map_err(on(dev))?;
        Ok(())
    }

    /// Quiesces the state and saves it (see the module documentation). The state goes on
    /// running unchanged.
    pub(crate) fn capture(&mut self) -> Result<SavedState, CheckpointError> {
        self.capture_with(false, true)
    }

    /// [`capture`](Self::capture) without the allocations' contents (a handover's state).
    pub(super) fn capture_without_contents(&mut self) -> Result<SavedState, CheckpointError> {
        self.capture_with(true, false)
    }

    /// [`capture`](Self::capture); with `deferred`, the allocations' contents are left out
    /// (empty), for [`save_into`](Self::save_into) to stream from the device as it encodes.
    /// With `refer` (a save that carries contents), the chunks pre-copy rounds sent that still
    /// hash as sent are referred to instead (`precopy.rs`).
    fn capture_with(&mut self, deferred: bool, refer: bool) -> Result<SavedState, CheckpointError> {
        if self.paused.is_some() {
            return Err(CheckpointError::WrongPhase("paused"));
        }
        self.check_capturable()?;
        let space = self.host.address_space();
        let mut saved = SavedState {
            session: self.id,
            last_handle: self.ids.last(),
            devices: dev_u32(self.devices.len()),
            va_base: space.base,
            va_size: space.per_device,
            ..SavedState::default()
        };
        for dev in 0..self.devices.len() {
            if !matches!(self.devices.get(dev), Some(Some(_))) {
                continue;
            }
            self.bind(dev)?;
            self.drv.ctx_synchronize().map_err(on(dev))?;
            let c = self.context(dev)?;
            saved.contexts.push(SavedContext {
                dev: dev_u32(dev),
                cache_config: c.cache_config,
                limits: c.limits.clone(),
                peers: c.peers.iter().map(|&p| dev_u32(p)).collect(),
                ranged: c.range.is_some(),
            });
            let (allocations, blocks, runs) = match &c.range {
                Some(r) => {
                    let allocations = c.memory.allocations();
                    let blocks: Vec<Option<u64>> = allocations
                        .iter()
                        .map(|&(p, _)| r.arena.block_len(p))
                        .collect();
                    (allocations, blocks, r.arena.saved_runs())
                }
                None => (Vec::new(), Vec::new(), Vec::new()),
            };
            saved
                .runs
                .extend(runs.into_iter().map(|(va, len, class)| SavedRun {
                    dev: dev_u32(dev),
                    va,
                    len,
                    class,
                }));
            // After pre-copy rounds: the chunks that still hash as sent are referred to.
            let all_refs = if refer {
                self.unchanged_chunks(dev, &allocations)?
            } else {
                vec![Vec::new(); allocations.len()]
            };
            for ((&(ptr, size), block), refs) in allocations.iter().zip(blocks).zip(all_refs) {
                let block = block.ok_or_else(|| mismatch("an allocation outside its range"))?;
                let contents = if deferred {
                    Vec::new()
                } else if refs.is_empty() {
                    self.read_device(dev, ptr, size)?
                } else {
                    let mut carried = Vec::new();
                    for (offset, len) in inline_chunks(size, &refs) {
                        carried.extend(self.read_device(dev, ptr + offset, len)?);
                    }
                    carried
                };
                saved.allocations.push(SavedAllocation {
                    dev: dev_u32(dev),
                    ptr,
                    size,
                    block,
                    contents,
                    refs,
                });
            }
        }
        (
            saved.vmm_allocations,
            saved.vmm_reservations,
            saved.vmm_mappings,
        ) = self.capture_vmm()?;
        (saved.host_mappings, saved.managed) = self.capture_host_memory()?;
        let mut handles: Vec<u64> = self.modules.iter().map(|(h, _)| h).collect();
        handles.sort_unstable();
        for handle in handles {
            let Some(m) = self.modules.get(handle) else {
                continue;
            };
            let (dev, image) = (m.dev, Arc::clone(&m.image));
            let globals: Vec<LookedUpGlobal> = m.globals.clone();
            self.bind(dev)?;
            saved.modules.push(SavedModule {
                handle,
                dev: dev_u32(dev),
                image: image.to_vec(),
            });
            for (name, ptr, size) in globals {
                let contents = self.read_device(dev, ptr, size)?;
                saved.globals.push(SavedGlobal {
                    module: handle,
                    name,
                    ptr,
                    contents,
                });
            }
        }
        saved.functions = self
            .functions
            .iter()
            .map(|(handle, f)| SavedFunction {
                handle,
                module: f.module,
                name: f.name.clone(),
                cache_config: f.cache_config,
                attributes: f.attributes.clone(),
            })
            .collect();
        saved.functions.sort_unstable_by_key(|f| f.handle);
        saved.streams = self
            .streams
            .iter()
            .map(|(handle, s)| SavedStream {
                handle,
                dev: dev_u32(s.dev),
                flags: s.flags,
                priority: s.priority,
                attributes: s.attributes.clone(),
            })
            .collect();
        saved.streams.sort_unstable_by_key(|s| s.handle);
        saved.events = self
            .events
            .iter()
            .map(|(handle, e)| SavedEvent {
                handle,
                dev: dev_u32(e.dev),
                flags: e.flags,
                recorded: e.recorded,
            })
            .collect();
        saved.events.sort_unstable_by_key(|e| e.handle);
        saved.pools = self
            .pools
            .iter()
            .map(|(handle, p)| SavedPool {
                handle,
                dev: dev_u32(p.dev),
                default: p.default,
                current: self
                    .devices
                    .get(p.dev)
                    .and_then(Option::as_ref)
                    .is_some_and(|c| c.current_pool == Some(handle)),
                max_size: p.max_size,
                shareable: p.shareable,
                settings: p.settings.clone(),
                access: p.access.clone(),
            })
            .collect();
        saved.pools.sort_unstable_by_key(|p| p.handle);
        (saved.graphs, saved.conditionals, saved.execs) = self.capture_graphs()?;
        // Reading the graphs gives handles to the nodes and held graphs that had none.
        saved.last_handle = self.ids.last();
        (saved.arrays, saved.mipmapped, saved.levels, saved.objects) = self.capture_arrays()?;
        debug!(
            session = self.id,
            bytes = saved.device_bytes(),
            allocations = saved.allocations.len(),
            modules = saved.modules.len(),
            "GPU state captured"
        );
        Ok(saved)
    }

    /// A guest device ordinal from a saved state, checked.
    pub(super) fn saved_dev(&self, dev: u32) -> Result<usize, CheckpointError> {
        usize::try_from(dev)
            .ok()
            .filter(|&d| d < self.devices.len())
            .ok_or_else(|| mismatch(format!("device {dev}")))
    }

    /// Makes the saved state again in this state, which has no context (a fresh one, or one
    /// paused); `store` holds the pre-copied chunks its allocations may refer to. On an
    /// error, what was made stays for the caller to tear down.
    pub(crate) fn restore_into(
        &mut self,
        saved: &SavedState,
        store: Option<&ChunkIndex<'_>>,
    ) -> Result<(), CheckpointError> {
        self.restore_into_with(saved, &[], None, store)
    }

    /// [`restore_into`](Self::restore_into) of a state without allocation contents, every run
    /// of its ranges mapped from `imported` (a handover, `handover.rs`, which checked them).
    pub(super) fn restore_into_imported(
        &mut self,
        saved: &SavedState,
        imported: &[ExportedRun],
    ) -> Result<(), CheckpointError> {
        self.restore_into_with(saved, &[], Some(imported), None)
    }

    /// [`restore_into`](Self::restore_into), where `contents` (when not empty: one per
    /// allocation, `SavedState::decode_borrowed`) are the allocations' bytes, `imported`
    /// (when given) the memory of every run, whose allocations then carry no contents, and
    /// `store` the pre-copied chunks the allocations may refer to.
    fn restore_into_with(
        &mut self,
        saved: &SavedState,
        contents: &[&[u8]],
        imported: Option<&[ExportedRun]>,
        store: Option<&ChunkIndex<'_>>,
    ) -> Result<(), CheckpointError> {
        if !contents.is_empty() && contents.len() != saved.allocations.len() {
            return Err(mismatch("allocations and their contents"));
        }
        if self.devices.iter().any(Option::is_some) || self.modules.len() > 0 {
            return Err(CheckpointError::WrongPhase("running"));
        }
        let space = self.host.address_space();
        if saved.session != self.id
            || saved.devices as usize != self.devices.len()
            || saved.va_base != space.base
            || saved.va_size != space.per_device
        {
            return Err(mismatch(format!(
                "saved for session {} with {} GPU(s) and ranges at {:#x}+{}, restored into \
                 session {} with {} and {:#x}+{}",
                saved.session,
                saved.devices,
                saved.va_base,
                saved.va_size,
                self.id,
                self.devices.len(),
                space.base,
                space.per_device
            )));
        }
        self.ids = HandleCounter::after(saved.last_handle.max(self.ids.last()));
        for c in &saved.contexts {
            let dev = self.saved_dev(c.dev)?;
            if self.devices[dev].is_some() {
                return Err(mismatch(format!("device {dev} twice")));
            }
            self.bind(dev)?;
            for &(limit, value) in &c.limits {
                self.drv
                    .ctx_set_limit(limit, to_usize(value)?)
                    .map_err(on(dev))?;
            }
            if let Some(config) = c.cache_config {
                self.drv.ctx_set_cache_config(config).map_err(on(dev))?;
            }
            let drv = Arc::clone(&self.drv);
            let ctx = self.context(dev)?;
            ctx.limits = c.limits.clone();
            ctx.cache_config = c.cache_config;
            let runs: Vec<ArenaRun> = saved
                .runs
                .iter()
                .filter(|r| r.dev == c.dev)
                .map(|r| (r.va, r.len, r.class))
                .collect();
            let allocations: Vec<(&SavedAllocation, &[u8])> = saved
                .allocations
                .iter()
                .enumerate()
                .filter(|(_, a)| a.dev == c.dev)
                .map(|(i, a)| (a, contents.get(i).copied().unwrap_or(&a.contents)))
                .collect();
            match ctx.range.as_mut() {
                Some(r) => {
                    // Managed memory placed in the range is a block of it too (managed.rs).
                    let managed = saved
                        .managed
                        .iter()
                        .filter(|m| m.dev == c.dev)
                        .filter_map(|m| {
                            let len: u64 = m.runs.iter().map(|&(_, n)| n).sum();
                            let size = len.checked_next_multiple_of(qcuda_proto::MANAGED_ALIGN)?;
                            r.arena.covers(m.guest, size).then_some((m.guest, size))
                        });
                    let live: Vec<(u64, u64)> = allocations
                        .iter()
                        .map(|(a, _)| (a.ptr, a.block))
                        .chain(managed)
                        .collect();
                    let restored = match imported {
                        Some(all) => {
                            let mine: Vec<(u64, u64, &std::os::fd::OwnedFd)> = all
                                .iter()
                                .filter(|x| x.dev == c.dev)
                                .map(|x| (x.va, x.len, &x.fd))
                                .collect();
                            let backing = ImportingBacking {
                                drv: drv.as_ref(),
                                access: &r.access,
                                runs: &mine,
                            };
                            r.arena.restore(&runs, &live, &backing)
                        }
                        None => {
                            let backing = ReservedRange::backing(drv.as_ref(), r.gpu, &r.access);
                            r.arena.restore(&runs, &live, &backing)
                        }
                    };
                    restored.map_err(|e| mismatch(format!("device {dev}'s range: {e:?}")))?;
                }
                None if runs.is_empty() && allocations.is_empty() => {}
                None => {
                    return Err(mismatch(format!(
                        "device {dev}'s range could not be reserved at its address"
                    )))
                }
            }
            // Chunks written from the pre-copy store, checked once all are written.
            let mut stored = Vec::new();
            for (a, bytes) in allocations {
                if imported.is_some() {
                    // Its bytes are in the imported memory already.
                    if !bytes.is_empty() || !a.refs.is_empty() || a.size > a.block {
                        return Err(mismatch("a handed-over allocation"));
                    }
                } else if a.refs.is_empty() {
                    if bytes.len() as u64 != a.size || a.size > a.block {
                        return Err(mismatch("an allocation's contents"));
                    }
                    self.write_device(dev, a.ptr, bytes)?;
                } else {
                    if bytes.len() as u64 != a.carried() || a.size > a.block {
                        return Err(mismatch("an allocation's contents"));
                    }
                    let mut refs = a.refs.iter().peekable();
                    let mut carried = bytes;
                    for (offset, len) in precopy::chunks_of(a.size) {
                        let chunk = match refs.next_if(|r| r.offset == offset) {
                            Some(r) => {
                                let b = Self::stored_chunk(store, a.dev, a.ptr, r)?;
                                stored.push((a.dev, a.ptr + offset, len, r.hash));
                                b
                            }
                            None => {
                                let (b, rest) = carried.split_at(to_usize(len)?);
                                carried = rest;
                                b
                            }
                        };
                        self.write_device(dev, a.ptr + offset, chunk)?;
                    }
                    if refs.next().is_some() {
                        return Err(mismatch("an allocation's pre-copied chunks"));
                    }
                }
                self.context(dev)?
                    .memory
                    .insert_allocation(a.ptr, a.size)
                    .map_err(|e| mismatch(format!("allocation {:#x}: {e:?}", a.ptr)))?;
            }
            if !stored.is_empty() {
                self.check_restored_chunks(&stored)?;
            }
        }
        for c in &saved.contexts {
            let dev = self.saved_dev(c.dev)?;
            for &peer in &c.peers {
                let peer = self.saved_dev(peer)?;
                if peer == dev || self.devices[peer].is_none() {
                    return Err(mismatch("a peer"));
                }
                let peer_ctx = self.bind(peer)?.ctx;
                self.bind(dev)?;
                self.drv.ctx_peer_access(peer_ctx, true).map_err(on(dev))?;
                let gpu = self.gpu_of(dev as u64)?;
                self.share_range(peer, gpu, true)?;
                self.context(dev)?.peers.push(peer);
            }
        }
        self.restore_vmm(
            &saved.vmm_allocations,
            &saved.vmm_reservations,
            &saved.vmm_mappings,
        )?;
        self.restore_host_memory(&saved.host_mappings, &saved.managed)?;
        self.restore_modules(saved)?;
        self.restore_streams_and_events(saved)?;
        self.restore_pools(saved)?;
        self.restore_graphs(saved)?;
        self.restore_arrays(saved)?;
        for dev in 0..self.devices.len() {
            if self.bind_existing(dev)? {
                self.drv.ctx_synchronize().map_err(on(dev))?;
            }
        }
        debug!(
            session = self.id,
            bytes = saved.device_bytes(),
            "GPU state restored"
        );
        Ok(())
    }

    fn restore_modules(&mut self, saved: &SavedState) -> Result<(), CheckpointError> {
        for m in &saved.modules {
            let dev = self.saved_dev(m.dev)?;
            self.bind(dev)?;
            let image = ModuleImage::from_slice(&m.image).map_err(CheckpointError::Cuda)?;
            let raw = self.drv.module_load(image.as_bytes()).map_err(on(dev))?;
            let entry = ModuleEntry {
                dev,
                raw,
                bytes: m.image.len() as u64,
                image: image.image().into(),
                globals: Vec::new(),
            };
            if !self.modules.insert_at(&self.ids, m.handle, entry) {
                let _ = self.drv.module_unload(raw);
                return Err(mismatch(format!("module handle {}", m.handle)));
            }
        }
        for g in &saved.globals {
            let (dev, raw) = self
                .modules
                .get(g.module)
                .map(|m| (m.dev, m.raw))
                .ok_or_else(|| mismatch("a global of no module"))?;
            self.bind(dev)?;
            let (ptr, size) = self.drv.module_global(raw, &g.name).map_err(on(dev))?;
            if ptr != g.ptr || size != g.contents.len() as u64 {
                // A pointer to it may be stored anywhere: the module must load where it was.
                return Err(mismatch(format!(
                    "global {:?} loaded at {ptr:#x} ({size} bytes), was at {:#x} ({} bytes)",
                    g.name,
                    g.ptr,
                    g.contents.len()
                )));
            }
            self.write_device(dev, ptr, &g.contents)?;
            if size > 0 {
                let _ = self.context(dev)?.memory.insert_global(ptr, size, g.module);
            }
            if let Some(m) = self.modules.get_mut(g.module) {
                m.globals.push((g.name.clone(), ptr, size));
            }
        }
        for f in &saved.functions {
            let (dev, module) = self
                .modules
                .get(f.module)
                .map(|m| (m.dev, m.raw))
                .ok_or_else(|| mismatch("a function of no module"))?;
            self.bind(dev)?;
            let raw = self.drv.module_function(module, &f.name).map_err(on(dev))?;
            let layout = self.param_layout(dev, raw)?;
            if let Some(config) = f.cache_config {
                self.drv
                    .func_set_cache_config(raw, config)
                    .map_err(on(dev))?;
            }
            for &(attr, value) in &f.attributes {
                self.drv
                    .func_set_attribute(raw, attr, value)
                    .map_err(on(dev))?;
            }
            let entry = FunctionEntry {
                dev,
                module: f.module,
                raw,
                layout,
                name: f.name.clone(),
                cache_config: f.cache_config,
                attributes: f.attributes.clone(),
                loaded: false,
            };
            if !self.functions.insert_at(&self.ids, f.handle, entry) {
                return Err(mismatch(format!("function handle {}", f.handle)));
            }
        }
        Ok(())
    }

    /// Makes the saved pools again under their handles: default pools looked up, created
    /// pools created, each with the attributes and access the guest set, and the current pool
    /// of each device made current again.
    fn restore_pools(&mut self, saved: &SavedState) -> Result<(), CheckpointError> {
        for p in &saved.pools {
            let dev = self.saved_dev(p.dev)?;
            self.bind(dev)?;
            let gpu = self.gpu_of(dev as u64)?;
            if p.default && (p.current || p.max_size != 0 || p.shareable) {
                return Err(mismatch(format!("default pool {}", p.handle)));
            }
            if p.settings.iter().any(|&(a, _)| !(1..=4).contains(&a))
                || p.access.iter().any(|&(_, f)| !matches!(f, 0 | 1 | 3))
            {
                return Err(mismatch(format!("pool {}'s settings", p.handle)));
            }
            let raw = if p.default {
                if self.context(dev)?.default_pool.is_some() {
                    return Err(mismatch(format!("pool handle {}", p.handle)));
                }
                self.drv.mem_pool_default(gpu).map_err(on(dev))?
            } else {
                let max_size = to_usize(p.max_size)?;
                if p.shareable {
                    self.drv.mem_pool_create_shareable(gpu, max_size)
                } else {
                    self.drv.mem_pool_create(gpu, max_size)
                }
                .map_err(on(dev))?
            };
            let entry = PoolEntry {
                shareable: p.shareable,
                settings: p.settings.clone(),
                access: p.access.clone(),
                ..PoolEntry::new(dev, raw, p.default, p.max_size)
            };
            if !self.pools.insert_at(&self.ids, p.handle, entry) {
                if !p.default {
                    let _ = self.drv.mem_pool_destroy(raw);
                }
                return Err(mismatch(format!("pool handle {}", p.handle)));
            }
            if p.default {
                self.context(dev)?.default_pool = Some(p.handle);
            }
            for &(attr, value) in &p.settings {
                self.drv
                    .mem_pool_set_attribute(raw, attr, value)
                    .map_err(on(dev))?;
            }
            let mut access = Vec::with_capacity(p.access.len());
            for &(ordinal, flags) in &p.access {
                let peer = self
                    .gpu_of(u64::from(ordinal))
                    .map_err(|_| mismatch(format!("pool {}'s access", p.handle)))?;
                access.push((peer, flags));
            }
            if !access.is_empty() {
                self.drv
                    .mem_pool_set_access(raw, &access)
                    .map_err(on(dev))?;
            }
            if p.current {
                if self.context(dev)?.current_pool.is_some() {
                    return Err(mismatch(format!("device {dev}'s current pool")));
                }
                self.drv.device_set_mem_pool(gpu, raw).map_err(on(dev))?;
                self.context(dev)?.current_pool = Some(p.handle);
            }
        }
        Ok(())
    }

    fn restore_streams_and_events(&mut self, saved: &SavedState) -> Result<(), CheckpointError> {
        for s in &saved.streams {
            let dev = self.saved_dev(s.dev)?;
            self.bind(dev)?;
            let flags = flags_u32(u64::from(s.flags), STREAM_NON_BLOCKING)?;
            let raw = self.drv.stream_create(flags, s.priority).map_err(on(dev))?;
            let entry = StreamEntry {
                dev,
                raw,
                flags,
                priority: s.priority,
                attributes: Vec::new(),
            };
            if !self.streams.insert_at(&self.ids, s.handle, entry) {
                let _ = self.drv.stream_destroy(raw);
                return Err(mismatch(format!("stream handle {}", s.handle)));
            }
            for (id, value) in &s.attributes {
                if !STREAM_ATTRIBUTES.contains(id) {
                    return Err(mismatch("a stream attribute"));
                }
                self.drv
                    .stream_set_attribute(raw, *id, value)
                    .map_err(on(dev))?;
            }
            if let Some(e) = self.streams.get_mut(s.handle) {
                e.attributes = s.attributes.clone();
            }
        }
        for e in &saved.events {
            let dev = self.saved_dev(e.dev)?;
            self.bind(dev)?;
            let flags = flags_u32(u64::from(e.flags), EVENT_FLAGS)?;
            let raw = self.drv.event_create(flags).map_err(on(dev))?;
            if e.recorded {
                // Complete, as it was at the capture (its timing starts again).
                self.drv.event_record(raw, NULL_STREAM).map_err(on(dev))?;
            }
            let entry = EventEntry {
                dev,
                raw,
                flags,
                recorded: e.recorded,
            };
            if !self.events.insert_at(&self.ids, e.handle, entry) {
                let _ = self.drv.event_destroy(raw);
                return Err(mismatch(format!("event handle {}", e.handle)));
            }
        }
        Ok(())
    }

    /// Quiesces and saves the whole state as bytes (`saved_state.rs`), for a restore in a
    /// fresh worker ([`restore`](Self::restore)). The state goes on running.
    pub fn save(&mut self) -> Result<Vec<u8>, CheckpointError> {
        self.capture().map(|s| s.encode())
    }

    /// [`save`](Self::save) straight into `out` (a migration's file): the allocations'
    /// device memory is streamed into it as it is encoded, in pinned chunks, the DMA of the
    /// next chunk overlapping the write of the last ([`stream_device`](Self::stream_device)),
    /// never held whole in memory. Returns the bytes written and how long the capture
    /// (quiescing, recording, small contents) and the streaming took.
    pub fn save_into(
        &mut self,
        out: &mut (impl std::io::Write + std::io::Seek),
    ) -> Result<SaveFigures, CheckpointError> {
        let started = std::time::Instant::now();
        let saved = self.capture_with(true, true)?;
        let captured = started.elapsed();
        let mut device_bytes = saved.device_bytes();
        let mut failed = None;
        let written = saved.encode_streaming(
            out,
            Some(&mut |a: &SavedAllocation, out: &mut dyn std::io::Write| {
                device_bytes += a.carried();
                let pieces = if a.refs.is_empty() {
                    vec![(0, a.size)]
                } else {
                    inline_chunks(a.size, &a.refs)
                };
                pieces
                    .into_iter()
                    .try_for_each(|(offset, len)| {
                        self.stream_device(a.dev, a.ptr + offset, len, out)
                    })
                    .map_err(|e| match e {
                        StreamedError::Device(e) => {
                            failed = Some(e);
                            std::io::Error::other("device memory could not be read")
                        }
                        StreamedError::Write(e) => e,
                    })
            }),
        );
        if let Some(e) = failed {
            return Err(e);
        }
        let bytes = written.map_err(|e| mismatch(format!("writing the saved state: {e}")))?;
        Ok(SaveFigures {
            bytes,
            device_bytes,
            capture: captured,
            encode: started.elapsed() - captured,
        })
    }

    /// Writes `len` bytes of device `dev`'s memory at `ptr` into `out`: through the context's
    /// pinned staging buffer, chunk by chunk (`Staging::stream_device`), or, without one, in
    /// pieces through pageable memory.
    fn stream_device(
        &mut self,
        dev: u32,
        ptr: u64,
        len: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<(), StreamedError> {
        let dev = self.saved_dev(dev).map_err(StreamedError::Device)?;
        self.bind(dev)
            .map_err(|e| StreamedError::Device(e.into()))?;
        let n = to_usize(len).map_err(|e| StreamedError::Device(e.into()))?;
        let drv = Arc::clone(&self.drv);
        let half = self.host.tuning.staging_half;
        let staged = half >= STAGED_MIN_HALF;
        let ctx = self
            .context(dev)
            .map_err(|e| StreamedError::Device(e.into()))?;
        if let Some(staging) = Self::staging_for(drv.as_ref(), ctx, half, staged) {
            return staging
                .stream_device(drv.as_ref(), ptr, n, NULL_STREAM, &mut |chunk| {
                    out.write_all(chunk)
                })
                .map_err(|e| match e {
                    SinkError::Cuda(e) => StreamedError::Device(on(dev)(e).into()),
                    SinkError::Sink(e) => StreamedError::Write(e),
                });
        }
        for at in (0..len).step_by(UNSTAGED_PIECE) {
            let piece = (len - at).min(UNSTAGED_PIECE as u64);
            let bytes = self
                .read_device(dev, ptr + at, piece)
                .map_err(StreamedError::Device)?;
            out.write_all(&bytes).map_err(StreamedError::Write)?;
        }
        Ok(())
    }

    /// A fresh state of `host` for guest process `id`, restored from `bytes` (a saved state
    /// from anywhere: it is checked as it is decoded and as it is made).
    pub fn restore(host: &Arc<CudaHost>, id: u64, bytes: &[u8]) -> Result<Self, CheckpointError> {
        Self::restore_with_store(host, id, bytes, None)
    }

    /// [`restore`](Self::restore) of a live migration's final state, whose allocations may
    /// refer to pre-copied chunks: those are filled from `store` (the session's pre-copy
    /// store, chunk logs one after another, `cuda/precopy.rs`), each from the record of the
    /// same chunk with the same hash. A chunk missing from the store, or there with another
    /// hash, fails the restore.
    pub fn restore_with_store(
        host: &Arc<CudaHost>,
        id: u64,
        bytes: &[u8],
        store: Option<&[u8]>,
    ) -> Result<Self, CheckpointError> {
        let saved = SavedState::decode(bytes).map_err(|e| mismatch(e.to_string()))?;
        let index = Self::index_store(store)?;
        let mut state = Self::open(host, id);
        state.restore_into(&saved, index.as_ref())?;
        Ok(state)
    }

    /// The index of a pre-copy store, checked.
    fn index_store(store: Option<&[u8]>) -> Result<Option<ChunkIndex<'_>>, CheckpointError> {
        store
            .map(precopy::scan)
            .transpose()
            .map_err(|e| mismatch(format!("the pre-copy store: {e}")))
    }

    /// Makes the saved state in `bytes` (from anywhere: checked as it is decoded and as it is
    /// made) again in this state, which must be fresh: [`restore`](Self::restore) into a
    /// state already set up (its host-function link, say). On an error, what was made stays
    /// for the caller to tear down (end the worker).
    pub fn restore_saved(&mut self, bytes: &[u8]) -> Result<(), CheckpointError> {
        self.restore_saved_with_store(bytes, None)
    }

    /// [`restore_saved`](Self::restore_saved) of a live migration's final state, its
    /// references to pre-copied chunks filled from `store` as
    /// [`restore_with_store`](Self::restore_with_store) does. The store is read where it lies
    /// (a mapped memfd), as the state is.
    pub fn restore_saved_with_store(
        &mut self,
        bytes: &[u8],
        store: Option<&[u8]>,
    ) -> Result<(), CheckpointError> {
        let (saved, contents) =
            SavedState::decode_borrowed(bytes).map_err(|e| mismatch(e.to_string()))?;
        let index = Self::index_store(store)?;
        self.restore_into_with(&saved, &contents, None, index.as_ref())
    }

    /// Pauses the state: waits for its work, copies every run of its reserved ranges (every
    /// allocation it holds) to host memory and unmaps them, giving the GPU memory back. The
    /// contexts stay, and with them what lives in them (modules and their globals, streams,
    /// events, graphs, host registrations), so nothing but the memory has to be made again.
    /// Returns the bytes moved to host memory.
    pub fn pause(&mut self) -> Result<u64, CheckpointError> {
        if self.paused.is_some() {
            return Err(CheckpointError::WrongPhase("paused"));
        }
        if let Some(s) = self.host.sticky_error() {
            return Err(CheckpointError::Cuda(s));
        }
        if self.capture_under_way() || self.managed_unmapped() {
            return Err(CheckpointError::Busy);
        }
        if self.ipc.shares() {
            return Err(CheckpointError::Unsupported(IPC_SHARED));
        }
        if self
            .devices
            .iter()
            .flatten()
            .any(|c| c.range.is_none() && !c.memory.allocations().is_empty())
        {
            return Err(CheckpointError::Unsupported(
                "allocations outside a reserved device range (--gpu-va-base off, or the \
                 driver placed the range elsewhere)",
            ));
        }
        let mut paused = Vec::new();
        for dev in 0..self.devices.len() {
            if !self.bind_existing(dev)? {
                continue;
            }
            self.drv.ctx_synchronize().map_err(on(dev))?;
            let c = self.context(dev)?;
            let Some(r) = c.range.as_ref() else {
                continue;
            };
            let runs = r.arena.saved_runs();
            let mut live: Vec<(u64, u64)> = c
                .memory
                .allocations()
                .iter()
                .filter_map(|&(p, _)| Some((p, r.arena.block_len(p)?)))
                .collect();
            live.extend(self.managed_range_blocks(dev));
            let mut contents = Vec::with_capacity(runs.len());
            for &(va, len, _) in &runs {
                contents.push(self.read_device(dev, va, len)?);
            }
            paused.push(PausedRange {
                dev,
                runs,
                live,
                contents,
            });
        }
        // Everything is in host memory: now give the GPU memory back.
        let drv = Arc::clone(&self.drv);
        let mut bytes = 0;
        for p in &paused {
            self.bind(p.dev)?;
            if let Some(r) = self.context(p.dev)?.range.as_mut() {
                let backing = ReservedRange::backing(drv.as_ref(), r.gpu, &r.access);
                r.arena.release_all(&backing);
            }
            bytes += p.contents.iter().map(|c| c.len() as u64).sum::<u64>();
        }
        self.paused = Some(paused);
        debug!(session = self.id, bytes, "GPU state paused");
        Ok(bytes)
    }

    /// Maps every paused run back at its address and copies its contents back. On failure
    /// what was mapped is given back and the state stays paused.
    pub fn resume(&mut self) -> Result<u64, CheckpointError> {
        let paused = self
            .paused
            .take()
            .ok_or(CheckpointError::WrongPhase("running"))?;
        let mut bytes = 0;
        for (i, p) in paused.iter().enumerate() {
            if let Err(e) = self.resume_range(p) {
                warn!(session = self.id, error = %e, "resume failed; the state stays paused");
                let drv = Arc::clone(&self.drv);
                for q in &paused[..=i] {
                    if self.bind(q.dev).is_err() {
                        continue;
                    }
                    if let Ok(Some(r)) = self.context(q.dev).map(|c| c.range.as_mut()) {
                        let backing = ReservedRange::backing(drv.as_ref(), r.gpu, &r.access);
                        r.arena.release_all(&backing);
                    }
                }
                self.paused = Some(paused);
                return Err(e);
            }
            bytes += p.contents.iter().map(|c| c.len() as u64).sum::<u64>();
        }
        debug!(session = self.id, bytes, "GPU state resumed");
        Ok(bytes)
    }

    fn resume_range(&mut self, p: &PausedRange) -> Result<(), CheckpointError> {
        self.bind(p.dev)?;
        let drv = Arc::clone(&self.drv);
        let Some(r) = self.context(p.dev)?.range.as_mut() else {
            return Err(mismatch("a paused device without its range"));
        };
        let backing = ReservedRange::backing(drv.as_ref(), r.gpu, &r.access);
        r.arena
            .restore(&p.runs, &p.live, &backing)
            .map_err(|e| match e {
                ArenaError::Driver(code) => CheckpointError::Cuda(CuError(code).status()),
                e => mismatch(format!("{e:?}")),
            })?;
        for (&(va, _, _), contents) in p.runs.iter().zip(&p.contents) {
            self.write_device(p.dev, va, contents)?;
        }
        Ok(())
    }
}

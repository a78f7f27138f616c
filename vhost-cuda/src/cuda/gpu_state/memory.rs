//! The guest process's device memory (Malloc, Free), the check every device range passes, and
//! guest RAM mapped for the device (HostMap, HostUnmap).
//!
//! Device memory comes from the session's reserved range on the device (`device_arena.rs`),
//! with physical memory mapped under it through the driver's VMM calls ([`VmmBacking`]), so
//! every allocation has an address a restore can give it again. Without a range (ranges off,
//! or the driver placed the reservation elsewhere) it comes from `cuMemAlloc`.

use super::*;
use crate::cuda::{
    device_arena::{ArenaError, DeviceArena},
    driver::vmm::{AllocProps, ACCESS_NONE, ACCESS_READWRITE},
};

/// The fault of a failed arena allocation on `dev`: an exhausted range is out of memory, as
/// CUDA reports it (cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY).
pub(super) fn arena_fault(dev: usize, e: ArenaError) -> Fault {
    match e {
        ArenaError::RangeFull | ArenaError::BadSize => Fault::Status(status::MEMORY_ALLOCATION),
        ArenaError::Driver(code) => Fault::Driver {
            dev,
            err: CuError(code),
        },
        ArenaError::NotABlock | ArenaError::BadSnapshot => Fault::Status(status::INVALID_VALUE),
    }
}

impl GpuState {
    /// Reserves the session's range on guest device `dev` (`CUdevice` `gpu`), its context
    /// current: at the configured address or not at all, since an allocation at another address
    /// could not keep it across a restore. `None` (and a warning) when ranges are off or the
    /// driver cannot place it there; the device's memory then comes from `cuMemAlloc`.
    pub(super) fn reserve_range(&self, dev: usize, gpu: i32) -> Option<ReservedRange> {
        let space = self.host.address_space();
        let base = space.session_base(self.id, dev, self.devices.len())?;
        let size = usize::try_from(space.per_device).ok()?;
        let props = AllocProps {
            device: gpu,
            ..AllocProps::default()
        };
        let unplaced = |why: &dyn std::fmt::Debug| {
            warn!(
                session = self.id,
                dev,
                base = format_args!("{base:#x}"),
                reason = ?why,
                "no reserved device range: allocations come from cuMemAlloc and cannot be \
                 restored at their addresses"
            );
        };
        let granularity = match self.drv.mem_granularity(&props, false) {
            Ok(g) => g as u64,
            Err(e) => {
                unplaced(&e);
                return None;
            }
        };
        let got = match self.drv.mem_address_reserve(size, 0, base) {
            Ok(got) => got,
            Err(e) => {
                unplaced(&e);
                return None;
            }
        };
        let arena = (got == base)
            .then(|| DeviceArena::new(base, space.per_device, granularity))
            .flatten();
        let Some(arena) = arena else {
            let _ = self.drv.mem_address_free(got, size);
            unplaced(&format_args!(
                "placed at {got:#x}, granularity {granularity}"
            ));
            return None;
        };
        debug!(
            session = self.id,
            dev,
            base = format_args!("{base:#x}"),
            size,
            "device range reserved"
        );
        Some(ReservedRange {
            arena,
            gpu,
            access: vec![(gpu, ACCESS_READWRITE)],
        })
    }

    /// Gives the range of `c` back: unmaps every block and frees the reservation. Nothing of
    /// the guest's may use it any more.
    pub(super) fn release_range(drv: &dyn DriverApi, range: &mut ReservedRange) {
        let backing = ReservedRange::backing(drv, range.gpu, &range.access);
        range.arena.release_all(&backing);
        let (base, size) = range.arena.range();
        if let Ok(size) = usize::try_from(size) {
            let _ = drv.mem_address_free(base, size);
        }
    }

    /// `size` (> 0) bytes of device memory on `dev` (bound): a block of the session's range, or
    /// `cuMemAlloc`'s.
    pub(super) fn device_alloc(&mut self, dev: usize, size: u64) -> Result<u64, Fault> {
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        match c.range.as_mut() {
            Some(r) => {
                let backing = ReservedRange::backing(drv.as_ref(), r.gpu, &r.access);
                r.arena
                    .alloc(size, &backing)
                    .map_err(|e| arena_fault(dev, e))
            }
            None => drv.mem_alloc(to_usize(size)?).map_err(on(dev)),
        }
    }

    /// Frees what [`device_alloc`](Self::device_alloc) returned. A block of the range is handed
    /// out again at once, so the device's work is waited for first, as `cuMemFree` does.
    pub(super) fn device_free(&mut self, dev: usize, ptr: u64) -> Result<(), Fault> {
        let in_range = self
            .context(dev)?
            .range
            .as_ref()
            .is_some_and(|r| r.arena.holds(ptr));
        if !in_range {
            return self.drv.mem_free(ptr).map_err(on(dev));
        }
        if self.capture_under_way() {
            self.wait_for_device_work(dev);
        } else {
            self.drv.ctx_synchronize().map_err(on(dev))?;
        }
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        if let Some(r) = c.range.as_mut() {
            let backing = ReservedRange::backing(drv.as_ref(), r.gpu, &r.access);
            r.arena
                .free(ptr, &backing)
                .map_err(|e| arena_fault(dev, e))?;
        }
        Ok(())
    }

    /// Grants (or withdraws) device `peer_gpu` access to the session's range on `dev`: what
    /// peer access means for memory the driver did not allocate itself.
    pub(super) fn share_range(
        &mut self,
        dev: usize,
        peer_gpu: i32,
        enable: bool,
    ) -> Result<(), Fault> {
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        let Some(r) = c.range.as_mut() else {
            return Ok(());
        };
        r.access.retain(|&(g, _)| g != peer_gpu);
        let flags = if enable {
            ACCESS_READWRITE
        } else {
            ACCESS_NONE
        };
        if enable {
            r.access.push((peer_gpu, flags));
        }
        for (va, len) in r.arena.runs() {
            drv.mem_set_access(va, to_usize(len)?, &[(peer_gpu, flags)])
                .map_err(on(dev))?;
        }
        Ok(())
    }

    pub(super) fn malloc(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let size = req.header().args[0];
        if size == 0 {
            // cudaMalloc(&p, 0) succeeds with a NULL pointer.
            return ok_rets(&[0]);
        }
        let c = self.context(dev)?;
        if !c.memory.has_room() || !c.memory.quota_allows(size) {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let ptr = self.device_alloc(dev, size)?;
        self.record_allocation(dev, ptr, size)?;
        ok_rets(&[ptr])
    }

    /// Enters a fresh allocation in the table of `dev`; frees it again if the table refuses.
    pub(super) fn record_allocation(
        &mut self,
        dev: usize,
        ptr: u64,
        size: u64,
    ) -> Result<(), Fault> {
        let Err(e) = self.context(dev)?.memory.insert_allocation(ptr, size) else {
            return Ok(());
        };
        let _ = self.device_free(dev, ptr);
        if e == TableError::OverQuota {
            // Another session of the VM took the rest meanwhile.
            return Err(status::MEMORY_ALLOCATION.into());
        }
        warn!(
            session = self.id,
            dev,
            ptr,
            size,
            ?e,
            "an allocation overlaps another"
        );
        Err(status::UNKNOWN.into())
    }

    pub(super) fn free(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let ptr = req.header().args[0];
        if ptr == 0 {
            return ok();
        }
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        if !c.memory.is_allocation(ptr) {
            // A graph's allocation (memory node) may be freed outside the graph, as CUDA
            // allows; the range stays the graph's, which allocates it again when it runs.
            if c.memory.is_graph_memory(ptr) {
                // cuMemFree refuses graph memory; the stream-ordered free on the legacy stream
                // takes it, and cudaFree returns once it is done.
                drv.mem_free_async(ptr, NULL_STREAM).map_err(on(dev))?;
                drv.ctx_synchronize().map_err(on(dev))?;
                return ok();
            }
            // An allocation imported from another process's pool (ipc.rs): freed as natively,
            // once the device is done with it.
            let quota = self.host.memory_quota();
            if self.ipc.take_pool_pointer(ptr, quota.as_deref()) {
                drv.mem_free_async(ptr, NULL_STREAM).map_err(on(dev))?;
                drv.ctx_synchronize().map_err(on(dev))?;
                return ok();
            }
            return Err(status::INVALID_VALUE.into());
        }
        self.device_free(dev, ptr)?;
        let _ = self.context(dev)?.memory.remove_allocation(ptr);
        ok()
    }

    /// Checks that `[ptr, ptr + len)` is the session's memory on `dev`: device memory of its
    /// own, or guest memory it host-mapped (portable, so reachable from every device).
    /// `[ptr, ptr + len)` lies in one of the session's allocations on any of its devices
    /// (unified addressing lets the driver reach it from `dev`'s context, as NVIDIA's does for
    /// copies and memsets that name no device), or in host memory mapped for the device.
    pub(super) fn check_range_any(&mut self, dev: usize, ptr: u64, len: u64) -> Result<(), Fault> {
        if self.check_range(dev, ptr, len).is_ok()
            || self
                .devices
                .iter()
                .flatten()
                .any(|c| c.memory.contains(ptr, len))
        {
            Ok(())
        } else {
            Err(status::INVALID_VALUE.into())
        }
    }

    pub(super) fn check_range(&mut self, dev: usize, ptr: u64, len: u64) -> Result<(), Fault> {
        if self.context(dev)?.memory.contains(ptr, len)
            || self.host_memory.contains_device(ptr, len)
            || self.managed_contains(ptr, len)
            || self.vmm.holds(ptr, len)
            || self.ipc.holds(ptr, len)
        {
            Ok(())
        } else {
            Err(status::INVALID_VALUE.into())
        }
    }

    /// `HostMap` (from qcuda.ko only): maps the guest runs of in-buffer 0 at guest address
    /// args[0] (args[1] bytes) and registers them in the context of the request's device.
    pub(super) fn host_map(&mut self, req: &Request) -> OpResult {
        let [guest, len, flags, ..] = req.header().args;
        if flags & !HOST_MAP_FLAGS != 0 {
            return Err(status::INVALID_VALUE.into());
        }
        let table = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        host_mappings::check_range(guest, len).map_err(map_status)?;
        let bytes = table.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let runs = host_mappings::decode_runs(&bytes, len).map_err(map_status)?;
        if flags & HOST_MAP_MANAGED != 0 {
            if flags & HOST_MAP_READ_ONLY != 0 {
                return Err(status::INVALID_VALUE.into());
            }
            let dev = self.bind_new(req)?;
            return self.attach_managed(table.memory(), guest, len, &runs, dev);
        }
        // Device memory placed for managed memory holds the rest of its last granule too.
        if self.managed_overlaps(guest, len) {
            return Err(status::HOST_MEMORY_ALREADY_REGISTERED.into());
        }
        let dev = self.bind_new(req)?;
        let drv = Arc::clone(&self.drv);
        let read_only = flags & HOST_MAP_READ_ONLY != 0;
        let mut failure = None;
        let mapped = self
            .host_memory
            .map(table.memory(), guest, len, &runs, dev, |local, len| {
                let size = usize::try_from(len).map_err(|_| MapError::Invalid)?;
                // SAFETY: `local..local + len` is mapped by the host-mapping table, which
                // unregisters it (`unmap`, `teardown`) before it unmaps it.
                if let Err(e) = unsafe { drv.mem_host_register(local, size, read_only) } {
                    failure = Some(e);
                    return Err(MapError::NoMemory);
                }
                drv.mem_host_device_pointer(local).map_err(|e| {
                    let _ = drv.mem_host_unregister(local);
                    failure = Some(e);
                    MapError::NoMemory
                })
            });
        match (mapped, failure) {
            (Ok(m), _) => {
                if read_only {
                    self.read_only_host.insert(guest);
                }
                ok_rets(&[m.dev_addr])
            }
            (Err(_), Some(err)) => Err(Fault::Driver { dev, err }),
            (Err(e), None) => Err(map_status(e).into()),
        }
    }

    /// Waits for the work the session has queued on device `dev` (bound), without disturbing
    /// a stream capture: while one of the session's streams is being captured (by another guest
    /// thread, say), `cuCtxSynchronize` would be illegal and would invalidate that capture, which
    /// CUDA does not do to a thread freeing host memory. Then every other stream of the session
    /// on the device, and the legacy stream unless it is tied to a capture, is waited for one by
    /// one; captured work has not run and needs no wait.
    pub(super) fn wait_for_device_work(&self, dev: usize) {
        if !self.capture_under_way() {
            let _ = self.drv.ctx_synchronize();
            return;
        }
        for s in self.streams.values().filter(|s| s.dev == dev) {
            if !self.is_capturing(s.raw) {
                let _ = self.drv.stream_synchronize(s.raw);
            }
        }
        // The legacy stream waits for every blocking stream; while one of those is capturing,
        // asking about it fails (implicit capture) and it is left alone.
        if matches!(self.drv.stream_is_capturing(NULL_STREAM), Ok(false)) {
            let _ = self.drv.stream_synchronize(NULL_STREAM);
        }
    }

    /// `HostUnmap` (from qcuda.ko only): waits for the device's work (as `cudaFreeHost` and
    /// `cudaHostUnregister` do), unregisters and unmaps. The pages stay the guest's.
    pub(super) fn host_unmap(&mut self, req: &Request) -> OpResult {
        let guest = req.header().args[0];
        let drv = Arc::clone(&self.drv);
        let devices: Vec<usize> = (0..self.devices.len()).collect();
        // Work still queued may read or write the memory: let it finish first. A failed or
        // corrupted context has nothing left running.
        if self.host.sticky_error().is_none() {
            for dev in devices {
                if matches!(self.devices.get(dev), Some(Some(_))) && self.bind(dev).is_ok() {
                    self.wait_for_device_work(dev);
                }
            }
        }
        if self.unmap_waiting(guest) {
            return ok();
        }
        let dev_ctx: Vec<Option<Context>> = self
            .devices
            .iter()
            .map(|d| d.as_ref().map(|c| c.ctx))
            .collect();
        self.unplace_managed(guest);
        self.host_memory
            .unmap(guest, |m| {
                if let Some(Some(ctx)) = dev_ctx.get(m.dev) {
                    if drv.ctx_set_current(*ctx).is_ok() {
                        let _ = drv.mem_host_unregister(m.local);
                    }
                }
            })
            .map_err(map_status)?;
        self.read_only_host.remove(&guest);
        ok()
    }
}

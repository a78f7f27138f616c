//! The guest process's device memory (Malloc, Free), the check every device range passes, and
//! guest RAM mapped for the device (HostMap, HostUnmap).

use super::*;

impl GpuState {
    pub(super) fn malloc(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let size = req.header().args[0];
        if size == 0 {
            // cudaMalloc(&p, 0) succeeds with a NULL pointer.
            return ok_rets(&[0]);
        }
        let bytes = to_usize(size)?;
        let (drv, id) = (Arc::clone(&self.drv), self.id);
        let c = self.context(dev)?;
        if !c.memory.has_room() || !c.memory.quota_allows(size) {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let ptr = drv.mem_alloc(bytes).map_err(on(dev))?;
        if let Err(e) = c.memory.insert_allocation(ptr, size) {
            let _ = drv.mem_free(ptr);
            if e == TableError::OverQuota {
                // Another session of the VM took the rest meanwhile.
                return Err(status::MEMORY_ALLOCATION.into());
            }
            warn!(
                session = id,
                dev,
                ptr,
                size,
                ?e,
                "driver returned an overlapping allocation"
            );
            return Err(status::UNKNOWN.into());
        }
        ok_rets(&[ptr])
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
            return Err(status::INVALID_VALUE.into());
        }
        drv.mem_free(ptr).map_err(on(dev))?;
        let _ = c.memory.remove_allocation(ptr);
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
            (Ok(m), _) => ok_rets(&[m.dev_addr]),
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
        let dev_ctx: Vec<Option<Context>> = self
            .devices
            .iter()
            .map(|d| d.as_ref().map(|c| c.ctx))
            .collect();
        self.host_memory
            .unmap(guest, |m| {
                if let Some(Some(ctx)) = dev_ctx.get(m.dev) {
                    if drv.ctx_set_current(*ctx).is_ok() {
                        let _ = drv.mem_host_unregister(m.local);
                    }
                }
            })
            .map_err(map_status)?;
        ok()
    }
}

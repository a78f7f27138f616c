//! Memory pools and stream-ordered allocations (MallocAsync, FreeAsync) of the guest process.

use super::*;

impl GpuState {
    /// The session's handle of the default pool of `dev` (context bound), made on first use.
    pub(super) fn default_pool(&mut self, dev: usize) -> Result<u64, Fault> {
        if let Some(h) = self.context(dev)?.default_pool {
            return Ok(h);
        }
        let gpu = self.gpu_of(dev as u64)?;
        if !self.pools.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.mem_pool_default(gpu).map_err(on(dev))?;
        let h = self
            .pools
            .insert(&mut self.ids, PoolEntry::new(dev, raw, true, 0))
            .ok_or(status::MEMORY_ALLOCATION)?;
        self.context(dev)?.default_pool = Some(h);
        Ok(h)
    }

    /// A pool of the session, the context of its device bound.
    pub(super) fn pool(&mut self, handle: u64) -> Result<(usize, MemPool), Fault> {
        let (dev, raw) = match self.pools.get(handle) {
            Some(p) => (p.dev, p.raw),
            None => return Err(status::INVALID_VALUE.into()),
        };
        self.bind(dev)?;
        Ok((dev, raw))
    }

    pub(super) fn device_set_mem_pool(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let handle = req.header().args[0];
        let (pool_dev, raw, default) = match self.pools.get(handle) {
            Some(p) => (p.dev, p.raw, p.default),
            None => return Err(status::INVALID_VALUE.into()),
        };
        // A device's current pool must be one of its own.
        if pool_dev != dev {
            return Err(status::INVALID_VALUE.into());
        }
        let gpu = self.gpu_of(dev as u64)?;
        self.drv.device_set_mem_pool(gpu, raw).map_err(on(dev))?;
        self.context(dev)?.current_pool = (!default).then_some(handle);
        ok()
    }

    pub(super) fn mem_pool_create(&mut self, req: &Request) -> OpResult {
        let dev = self.bind_new(req)?;
        let [max_size, types, ..] = req.header().args;
        let max_size = to_usize(max_size)?;
        let gpu = self.gpu_of(dev as u64)?;
        if !self.pools.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let shareable = match types {
            0 => false,
            qcuda_proto::POOL_HANDLE_POSIX_FD => true,
            _ => return Err(status::INVALID_VALUE.into()),
        };
        let raw = if shareable {
            self.drv.mem_pool_create_shareable(gpu, max_size)
        } else {
            self.drv.mem_pool_create(gpu, max_size)
        }
        .map_err(on(dev))?;
        let entry = PoolEntry {
            shareable,
            ..PoolEntry::new(dev, raw, false, max_size as u64)
        };
        match self.pools.insert(&mut self.ids, entry) {
            Some(h) => ok_rets(&[h]),
            None => {
                let _ = self.drv.mem_pool_destroy(raw);
                Err(status::MEMORY_ALLOCATION.into())
            }
        }
    }

    pub(super) fn mem_pool_destroy(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = self.pool(handle)?;
        if self.pools.get(handle).is_some_and(|p| p.default) {
            return Err(status::INVALID_VALUE.into());
        }
        // A destroyed current pool leaves its device with the default pool, as in CUDA.
        if self.context(dev)?.current_pool == Some(handle) {
            let default = self.default_pool(dev)?;
            if let Some(d) = self.pools.get(default).map(|p| p.raw) {
                let gpu = self.gpu_of(dev as u64)?;
                self.drv.device_set_mem_pool(gpu, d).map_err(on(dev))?;
            }
            self.context(dev)?.current_pool = None;
        }
        let result = self.drv.mem_pool_destroy(raw);
        self.pools.remove(handle);
        result.map_err(on(dev))?;
        ok()
    }

    pub(super) fn mem_pool_attribute(&mut self, req: &Request) -> OpResult {
        let [handle, attr, value, ..] = req.header().args;
        let attr = u32::try_from(attr)
            .ok()
            .filter(|a| POOL_ATTRS.contains(&u64::from(*a)))
            .ok_or(status::INVALID_VALUE)?;
        let (dev, raw) = self.pool(handle)?;
        if req.op() == Op::MemPoolGetAttribute {
            let v = self
                .drv
                .mem_pool_get_attribute(raw, attr)
                .map_err(on(dev))?;
            return ok_rets(&[v]);
        }
        // Current reserved and used memory are read-only; the high watermarks may only be
        // reset (to 0).
        match attr {
            5 | 7 => return Err(status::INVALID_VALUE.into()),
            6 | 8 if value != 0 => return Err(status::INVALID_VALUE.into()),
            _ => {}
        }
        self.drv
            .mem_pool_set_attribute(raw, attr, value)
            .map_err(on(dev))?;
        // Kept for a restore (the high watermarks' resets are not settings).
        if (1..=4).contains(&attr) {
            if let Some(p) = self.pools.get_mut(handle) {
                p.settings.retain(|&(a, _)| a != attr);
                p.settings.push((attr, value));
            }
        }
        ok()
    }

    pub(super) fn mem_pool_set_access(&mut self, req: &Request) -> OpResult {
        let (dev, raw) = self.pool(req.header().args[0])?;
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        if !buf.len().is_multiple_of(8) || buf.len() / 8 > MAX_POOL_ACCESS {
            return Err(status::INVALID_VALUE.into());
        }
        let bytes = buf.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let mut access = Vec::with_capacity(bytes.len() / 8);
        let mut granted = Vec::with_capacity(bytes.len() / 8);
        for rec in bytes.chunks_exact(8) {
            let ordinal = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
            let flags = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
            if !matches!(flags, 0 | 1 | 3) {
                return Err(status::INVALID_VALUE.into());
            }
            let gpu = self
                .gpu_of(u64::from(ordinal))
                .map_err(|_| Fault::Status(status::INVALID_DEVICE))?;
            access.push((gpu, flags));
            granted.push((ordinal, flags));
        }
        self.drv
            .mem_pool_set_access(raw, &access)
            .map_err(on(dev))?;
        // Kept for a restore: the last flags of each device.
        if let Some(p) = self.pools.get_mut(req.header().args[0]) {
            for (ordinal, flags) in granted {
                p.access.retain(|&(o, _)| o != ordinal);
                p.access.push((ordinal, flags));
            }
        }
        ok()
    }

    /// `MallocAsync`: from the named pool, or the current pool of the stream's device. The
    /// allocation joins the table of the pool's device.
    pub(super) fn malloc_async(&mut self, req: &Request) -> OpResult {
        let [size, stream, pool, ..] = req.header().args;
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(stream, dev)?;
        let (mem_dev, pool_raw) = if pool == 0 {
            let current = self.context(dev)?.current_pool;
            (dev, current.and_then(|h| self.pools.get(h)).map(|p| p.raw))
        } else {
            match self.pools.get(pool) {
                Some(p) => (p.dev, Some(p.raw)),
                None => return Err(status::INVALID_VALUE.into()),
            }
        };
        if size == 0 {
            // As cudaMalloc(&p, 0): success with a NULL pointer.
            return ok_rets(&[0]);
        }
        let bytes = to_usize(size)?;
        if mem_dev != dev {
            // The pool's device must have a context for the table the memory joins.
            self.bind(mem_dev)?;
            self.bind(dev)?;
        }
        if !self.context(mem_dev)?.memory.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let ptr = self
            .drv
            .mem_alloc_async(bytes, pool_raw, stream)
            .map_err(on(dev))?;
        let (drv, id) = (Arc::clone(&self.drv), self.id);
        let c = self.context(mem_dev)?;
        if let Err(e) = c.memory.insert_stream_ordered(ptr, size) {
            let _ = drv.mem_free_async(ptr, stream);
            if e == TableError::OverQuota {
                return Err(status::MEMORY_ALLOCATION.into());
            }
            warn!(
                session = id,
                dev,
                ptr,
                size,
                ?e,
                "driver returned an overlapping pool allocation"
            );
            return Err(status::UNKNOWN.into());
        }
        ok_rets(&[ptr])
    }

    /// `FreeAsync`: an allocation of the session on any device, freed in the stream's order.
    pub(super) fn free_async(&mut self, req: &Request) -> OpResult {
        let [ptr, stream, ..] = req.header().args;
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(stream, dev)?;
        if ptr == 0 {
            return ok();
        }
        let owner = self
            .devices
            .iter()
            .position(|d| d.as_ref().is_some_and(|c| c.memory.is_allocation(ptr)));
        let Some(owner) = owner else {
            // A graph's allocation, freed outside the graph (see `free`).
            let graph_memory = self
                .devices
                .iter()
                .flatten()
                .any(|c| c.memory.is_graph_memory(ptr));
            if graph_memory {
                self.drv.mem_free_async(ptr, stream).map_err(on(dev))?;
                return ok();
            }
            // An allocation imported from another process's pool (ipc.rs).
            if self
                .ipc
                .take_pool_pointer(ptr, self.host.memory_quota().as_deref())
            {
                self.drv.mem_free_async(ptr, stream).map_err(on(dev))?;
                return ok();
            }
            return Err(status::INVALID_VALUE.into());
        };
        let from_malloc = self
            .context(owner)?
            .memory
            .allocation_at(ptr)
            .is_some_and(|(b, _)| b == ptr);
        if from_malloc {
            // `cudaMalloc` memory freed in stream order, as libraries do (cuSPARSE's
            // cusparseDestroyCsrilu02Info): the driver takes it natively. Here it is a block of
            // the session's range (or cuMemAlloc's), which cuMemFreeAsync does not take: freed
            // as `Free` frees it, once the stream has reached the free. A capture records only
            // graph allocations' frees.
            if self.is_capturing(stream) {
                return Err(status::INVALID_VALUE.into());
            }
            self.drv.stream_synchronize(stream).map_err(on(dev))?;
            self.bind(owner)?;
            self.device_free(owner, ptr)?;
            let _ = self.context(owner)?.memory.remove_allocation(ptr);
            return ok();
        }
        self.drv.mem_free_async(ptr, stream).map_err(on(dev))?;
        let _ = self.context(owner)?.memory.remove_allocation(ptr);
        ok()
    }

    /// Pool memory belongs to its pool, not to a context, so destroying the context does not
    /// free it: frees the session's stream-ordered allocations on `dev`, destroys the pools it
    /// created there, trims the default pool and makes it current again. Best effort (a
    /// corrupted context has nothing left to run, and the worker's exit frees the rest).
    pub(super) fn release_pools(&mut self, dev: usize) {
        if self.host.sticky_error().is_some() || !matches!(self.devices.get(dev), Some(Some(_))) {
            return;
        }
        if self.bind(dev).is_err() {
            return;
        }
        let drv = Arc::clone(&self.drv);
        let Ok(c) = self.context(dev) else {
            return;
        };
        let pending = c.memory.stream_ordered();
        let touched = !pending.is_empty() || c.default_pool.is_some();
        for ptr in pending {
            let _ = drv.mem_free_async(ptr, NULL_STREAM);
            let _ = c.memory.remove_allocation(ptr);
        }
        let _ = drv.ctx_synchronize();
        let mut default = None;
        let mut created = Vec::new();
        self.pools.retain(|p| {
            if p.dev == dev {
                if p.default {
                    default = Some(p.raw);
                } else {
                    created.push(p.raw);
                }
            }
            true
        });
        let gpu = self.host.gpus.get(dev).map(|g| g.dev);
        if let (Some(raw), Some(gpu)) = (default, gpu) {
            let _ = drv.device_set_mem_pool(gpu, raw);
        }
        for raw in created {
            let _ = drv.mem_pool_destroy(raw);
        }
        if touched {
            if let Some(raw) = default {
                let _ = drv.mem_pool_trim_to(raw, 0);
            }
        }
    }
}

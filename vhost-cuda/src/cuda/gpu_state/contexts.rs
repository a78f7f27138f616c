//! The worker's CUDA contexts, one per guest device the process has used: creating and binding
//! them, device-wide ops (attributes, synchronise, limits, peer access) and DeviceReset's teardown.

use super::*;

impl GpuState {
    /// The guest device ordinal of the request, checked.
    pub(super) fn device(&self, req: &Request) -> Result<usize, Fault> {
        let dev = req.header().device as usize;
        if dev < self.devices.len() {
            Ok(dev)
        } else {
            Err(status::INVALID_DEVICE.into())
        }
    }

    /// Binds the session's context on `dev` to this thread, creating it on first use. Fails
    /// with the sticky error once the driver state is corrupted.
    pub(super) fn bind(&mut self, dev: usize) -> Result<&mut DeviceContext, Fault> {
        if let Some(s) = self.host.sticky_error() {
            return Err(s.into());
        }
        let slot = self
            .devices
            .get_mut(dev)
            .ok_or(Fault::Status(status::INVALID_DEVICE))?;
        if slot.is_none() {
            let gpu = self
                .host
                .gpus
                .get(dev)
                .ok_or(Fault::Status(status::INVALID_DEVICE))?;
            let (gpu, host_ordinal) = (gpu.dev, gpu.host_ordinal);
            // A spare worker made one before the session came: the driver's cost is paid.
            let ctx = match self.host.take_warm_context(gpu) {
                Some(ctx) => {
                    debug!(
                        session = self.id,
                        dev,
                        gpu = host_ordinal,
                        "context taken from the warm-up"
                    );
                    ctx
                }
                None => {
                    let ctx = self.drv.ctx_create(gpu).map_err(on(dev))?;
                    debug!(
                        session = self.id,
                        dev,
                        gpu = host_ordinal,
                        "context created"
                    );
                    ctx
                }
            };
            let range = match self.drv.ctx_set_current(ctx) {
                Ok(()) => self.reserve_range(dev, gpu),
                Err(_) => None,
            };
            self.devices[dev] = Some(DeviceContext {
                ctx,
                memory: AllocationTable::with_quota(self.host.memory_quota()),
                staging: StagingState::NotYet,
                default_pool: None,
                current_pool: None,
                range,
                limits: Vec::new(),
                cache_config: None,
                peers: Vec::new(),
                managed_sync: None,
                precopy: None,
            });
        }
        let c = self
            .devices
            .get_mut(dev)
            .and_then(Option::as_mut)
            .ok_or(Fault::Status(status::UNKNOWN))?;
        self.drv.ctx_set_current(c.ctx).map_err(on(dev))?;
        Ok(c)
    }

    /// Binds the context of the request's device (creating it).
    pub(super) fn bind_new(&mut self, req: &Request) -> Result<usize, Fault> {
        let dev = self.device(req)?;
        self.bind(dev)?;
        Ok(dev)
    }

    /// Binds the context on `dev` if the session has one; `false` if it has none (so there
    /// is no work of this session to wait for). Fails with the sticky error in any case.
    pub(super) fn bind_existing(&mut self, dev: usize) -> Result<bool, Fault> {
        if let Some(s) = self.host.sticky_error() {
            return Err(s.into());
        }
        match self.devices.get(dev) {
            Some(Some(_)) => self.bind(dev).map(|_| true),
            Some(None) => Ok(false),
            None => Err(status::INVALID_DEVICE.into()),
        }
    }

    pub(super) fn context(&mut self, dev: usize) -> Result<&mut DeviceContext, Fault> {
        self.devices
            .get_mut(dev)
            .and_then(Option::as_mut)
            .ok_or(Fault::Status(status::UNKNOWN))
    }

    pub(super) fn device_attributes(&self, req: &Request) -> OpResult {
        let dev = self.device(req)?;
        let gpu = self.host.gpus.get(dev).ok_or(status::INVALID_DEVICE)?;
        attribute_table(req, |attr| match self.drv.device_attribute(gpu.dev, attr) {
            Ok(v) => Ok(v),
            Err(CuError::INVALID_VALUE) => Err(status::INVALID_VALUE.into()),
            Err(err) => Err(Fault::Driver { dev, err }),
        })
    }

    pub(super) fn device_synchronize(&mut self, req: &Request) -> OpResult {
        let dev = self.device(req)?;
        if self.bind_existing(dev)? {
            self.drv.ctx_synchronize().map_err(on(dev))?;
        }
        ok()
    }

    /// Destroys the session's context on `dev` (if any) and forgets everything in it: what
    /// DeviceReset does, and what dropping the session does for each device. A sticky error
    /// stays (it belongs to the process).
    ///
    /// `cuCtxDestroy` frees the context's allocations, pinned staging memory, modules, streams
    /// and events, and waits for the kernels still running in the process. The session is alone
    /// in its worker process, so that wait stalls no other session; a daemon ending the session
    /// does not wait for it beyond a bound, it kills the worker (`crate::worker`).
    pub(super) fn teardown(&mut self, dev: usize) {
        self.release_device(dev, false);
    }

    /// [`teardown`](Self::teardown), which also ends the host mappings registered in the
    /// context; with `keep_host_mappings` (a pause) they are only unregistered, and stay mapped
    /// for the context a resume makes.
    pub(super) fn release_device(&mut self, dev: usize, keep_host_mappings: bool) {
        // Memory opened from other processes: mapped in this process, not in the context.
        if self.host.sticky_error().is_none() {
            let drv = Arc::clone(&self.drv);
            let quota = self.host.memory_quota();
            self.ipc.release_device(dev, drv.as_ref(), quota.as_deref());
        }
        // Restored mappings still waiting for guest RAM go too, and managed memory placed
        // for an allocation still being made.
        self.drop_waiting(dev);
        self.unplace_unmapped_on(dev);
        // Host mappings registered in this context go with it; their pages stay the guest's.
        for guest in self.host_memory.on_device(dev) {
            self.unplace_managed(guest);
            let drv = Arc::clone(&self.drv);
            if keep_host_mappings {
                if let Some((_, m)) = self
                    .host_memory
                    .mappings()
                    .into_iter()
                    .find(|(g, _)| *g == guest)
                {
                    let _ = drv.mem_host_unregister(m.local);
                }
                continue;
            }
            let _ = self.host_memory.unmap(guest, |m| {
                let _ = drv.mem_host_unregister(m.local);
            });
        }
        // Executable graphs and graphs first, while their context still exists (with a
        // sticky error the driver is not called, and the context takes them along).
        let live = self.devices.get(dev).is_some_and(Option::is_some) && self.bind(dev).is_ok();
        // A context takes the registrations it made with it: forget them all (the next copy
        // registers what it needs again), so the registry never counts blocks the driver lost.
        if live {
            self.ram.release(self.drv.as_ref());
        }
        self.teardown_graphs(dev, live);
        self.release_pools(dev);
        let Some(mut c) = self.devices.get_mut(dev).and_then(Option::take) else {
            return;
        };
        // Memory mapped into the range is the process's, not the context's: destroying the
        // context would leave it mapped. Unmapped first, while the context is still current
        // (with a sticky error the driver is not called: the worker's exit frees it).
        if let Some(range) = c.range.as_mut() {
            if live {
                Self::release_range(self.drv.as_ref(), range);
            }
        }
        match self.drv.ctx_destroy(c.ctx) {
            Ok(()) => debug!(session = self.id, dev, "context destroyed"),
            Err(e) => warn!(session = self.id, dev, error = ?e, "cuCtxDestroy failed"),
        }
        self.modules.retain(|m| m.dev != dev);
        self.functions.retain(|f| f.dev != dev);
        self.streams.retain(|s| s.dev != dev);
        self.events.retain(|e| e.dev != dev);
        self.arrays.forget_device(dev);
        self.pools.retain(|p| p.dev != dev);
    }

    /// The `CUdevice` of guest device ordinal `ordinal` (an argument, not the header's).
    pub(super) fn gpu_of(&self, ordinal: u64) -> Result<i32, Fault> {
        self.gpu_index(ordinal).map(|(_, gpu)| gpu)
    }

    /// Guest device ordinal `ordinal` (an argument, not the header's) as an index, and its
    /// `CUdevice`.
    pub(super) fn gpu_index(&self, ordinal: u64) -> Result<(usize, i32), Fault> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|d| Some((d, self.host.gpus.get(d)?.dev)))
            .ok_or(Fault::Status(status::INVALID_DEVICE))
    }

    /// `PeerAccess`: the context on the request's device gains or loses access to the
    /// session's context on device args[0] (created if needed).
    pub(super) fn peer_access(&mut self, req: &Request) -> OpResult {
        let [peer, enable, flags, ..] = req.header().args;
        let dev = self.device(req)?;
        let (peer, _) = self.gpu_index(peer)?;
        if flags != 0 || enable > 1 {
            return Err(status::INVALID_VALUE.into());
        }
        // As the runtime answers (measured: CUDA 13.0, driver 580, H100): a device and itself,
        // or a pair that cannot reach each other, is cudaErrorPeerAccessUnsupported.
        if peer == dev {
            return Err(status::PEER_ACCESS_UNSUPPORTED.into());
        }
        let (a, b) = (self.gpu_of(dev as u64)?, self.gpu_of(peer as u64)?);
        if enable == 1 && !self.drv.device_can_access_peer(a, b).map_err(on(dev))? {
            return Err(status::PEER_ACCESS_UNSUPPORTED.into());
        }
        let peer_ctx = self.bind(peer)?.ctx;
        self.bind(dev)?;
        self.drv
            .ctx_peer_access(peer_ctx, enable == 1)
            .map_err(on(dev))?;
        // The peer's reserved range is VMM memory, which peer access does not reach by itself.
        self.share_range(peer, a, enable == 1)?;
        let peers = &mut self.context(dev)?.peers;
        peers.retain(|&p| p != peer);
        if enable == 1 {
            peers.push(peer);
        }
        ok()
    }

    /// `DeviceGetLimit` / `DeviceSetLimit`: `cuCtxGetLimit`/`SetLimit` in the session's context.
    pub(super) fn limit(&mut self, req: &Request) -> OpResult {
        let [limit, value, ..] = req.header().args;
        let limit = u32::try_from(limit)
            .ok()
            // Every CUlimit of CUDA 13.0 (7-9 only the driver API names: shared memory size
            // and the CIG settings).
            .filter(|l| *l <= 9)
            .ok_or(status::UNSUPPORTED_LIMIT)?;
        let dev = self.bind_new(req)?;
        if req.op() == Op::DeviceSetLimit {
            self.drv
                .ctx_set_limit(limit, to_usize(value)?)
                .map_err(on(dev))?;
            let limits = &mut self.context(dev)?.limits;
            limits.retain(|&(l, _)| l != limit);
            limits.push((limit, value));
            return ok();
        }
        let v = self.drv.ctx_get_limit(limit).map_err(on(dev))?;
        ok_rets(&[v as u64])
    }
}

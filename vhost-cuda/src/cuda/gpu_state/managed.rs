//! Managed memory resident on the device (`ManagedPlace`, `HostMap` with `HOST_MAP_MANAGED`,
//! `ManagedMigrate`).
//!
//! CUDA's model for devices without concurrent managed access (`concurrentManagedAccess` = 0,
//! what qcuda reports): managed memory is the device's while work that may touch it runs, and
//! the host's once that work is done and the program synchronised. The GPU's atomics on it are
//! then device atomics, as natively. Here:
//!
//! - `ManagedPlace` takes a large block of the session's reserved device range (device_arena.rs:
//!   physical memory mapped under it, 2 MiB multiples), as `Malloc` does: that address becomes
//!   the program's pointer, and a pause, a restart or a migration gives it the same address
//!   again whatever the new worker's driver would pick. Without a range it asks the driver for
//!   an address range (`cuMemAddressReserve`: wherever the driver's virtual memory puts it; the
//!   address the guest offers, of its managed-memory window, only if the driver honours that
//!   hint) and backs it (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`). The guest maps the
//!   allocation's pages there in its own process, which is why the worker chooses and the guest
//!   follows;
//! - `HostMap` with `HOST_MAP_MANAGED` then maps those guest pages into this process at an
//!   address of the kernel's choosing and registers them with the driver (the *staging* side);
//!   unified addressing keeps one address space, so they are NOT mapped at the device address;
//! - `ManagedMigrate` copies guest RAM → device (before work that may touch it, in stream
//!   order, the session's other streams ordered after the copy) or device → guest RAM (at a
//!   synchronisation, once no work that may touch it can still run) with the driver's DMA.
//!
//! guest-lib decides when (core/memory/managed.rs). A driver without virtual memory management
//! places nothing: `cudaMallocManaged` fails there rather than hand out memory whose atomics
//! would not be exact.

use qcuda_proto::{
    HostRun, HOST_PAGE_SIZE, MANAGED_ALIGN, MANAGED_SCOPE_GLOBAL, MANAGED_SCOPE_STREAM,
    MANAGED_TO_DEVICE, MANAGED_TO_HOST, MANAGED_WINDOW_BASE, MANAGED_WINDOW_LEN,
};

use super::*;
use crate::cuda::driver::vmm::{AllocProps, MemHandle, ACCESS_READWRITE};
use crate::guest_buffer::GuestRam;
use crate::limits::QuotaSlot;

/// Most managed allocations a session may have placed at once.
const MAX_PLACEMENTS: usize = 1 << 16;
/// cudaEventDisableTiming.
const EVENT_DISABLE_TIMING: u32 = 2;

impl GpuState {
    /// `ManagedPlace`: see qcuda-proto's `Op::ManagedPlace`.
    pub(super) fn managed_place(&mut self, req: &Request) -> OpResult {
        let [len, hint, ..] = req.header().args;
        if len == 0 || !len.is_multiple_of(HOST_PAGE_SIZE) {
            return Err(status::INVALID_VALUE.into());
        }
        let size = len
            .checked_next_multiple_of(MANAGED_ALIGN)
            .ok_or(status::INVALID_VALUE)?;
        let offered =
            |w: u64, n: u64| hint >= w && hint.checked_add(size).is_some_and(|e| e <= w + n);
        if hint != 0
            && (!hint.is_multiple_of(MANAGED_ALIGN)
                || !(offered(MANAGED_WINDOW_BASE, MANAGED_WINDOW_LEN)
                    || host_mappings::in_window(hint, size)))
        {
            return Err(status::INVALID_VALUE.into());
        }
        let size_us = to_usize(size)?;
        let dev = self.bind_new(req)?;
        if self.managed.len() >= MAX_PLACEMENTS {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let props = AllocProps {
            device: self.gpu_of(dev as u64)?,
            ..AllocProps::default()
        };
        match self.drv.mem_granularity(&props, false) {
            Ok(g) if g != 0 && MANAGED_ALIGN.is_multiple_of(g as u64) => {}
            Ok(_) => return Err(status::NOT_SUPPORTED.into()),
            Err(e) => return Err(on(dev)(e)),
        }
        let quota = self.host.memory_quota();
        if let Some(q) = &quota {
            if !q.reserve(size) {
                return Err(status::MEMORY_ALLOCATION.into());
            }
        }
        // A block of the session's device range where it has one: an address of its own that
        // a restore in another worker gives it again, whatever that worker's driver would pick.
        if let Some(placed) = self.place_in_range(dev, size) {
            let at = match placed {
                Ok(at) => at,
                Err(e) => {
                    if let Some(q) = &quota {
                        q.release(size);
                    }
                    warn!(session = self.id, len, error = ?e, "no device memory for managed memory");
                    return Err(e);
                }
            };
            self.managed.insert(
                at,
                Placement {
                    len,
                    size: size_us,
                    handle: None,
                    staging: 0,
                    dev,
                    quota,
                    in_window: false,
                    unmapped: true,
                },
            );
            debug!(
                session = self.id,
                at = format_args!("{at:#x}"),
                len,
                "managed memory placed in the session's device range"
            );
            return ok_rets(&[at, size]);
        }
        // A window address is worth asking for only where nothing of the session lies.
        let hint = if hint != 0
            && !self.host_memory.overlaps(hint, size)
            && !self.managed_overlaps(hint, size)
            && !self.waiting_overlaps(hint, size)
        {
            hint
        } else {
            0
        };
        let placed = Self::vmm_place(self.drv.as_ref(), hint, size_us, &props);
        let (at, handle) = match placed {
            Ok(p) => p,
            Err(e) => {
                if let Some(q) = &quota {
                    q.release(size);
                }
                warn!(
                    session = self.id,
                    len,
                    error = ?e,
                    "no device memory for managed memory"
                );
                return Err(on(dev)(e));
            }
        };
        let in_window = host_mappings::in_window(at, size);
        // Anywhere but the hint, the driver's range must be apart from all the session has
        // (it is, unless the driver's bookkeeping and this process's disagree).
        if at != hint
            && (in_window
                || self.host_memory.overlaps(at, size)
                || self.managed_overlaps(at, size)
                || self.waiting_overlaps(at, size))
        {
            warn!(
                session = self.id,
                at = format_args!("{at:#x}"),
                size,
                "the driver placed managed memory over the session's own memory"
            );
            Self::vmm_release(self.drv.as_ref(), at, size_us, handle, false);
            if let Some(q) = &quota {
                q.release(size);
            }
            return Err(status::UNKNOWN.into());
        }
        self.managed.insert(
            at,
            Placement {
                len,
                size: size_us,
                handle: Some(handle),
                staging: 0,
                dev,
                quota,
                in_window,
                unmapped: true,
            },
        );
        debug!(
            session = self.id,
            at = format_args!("{at:#x}"),
            len,
            hinted = at == hint,
            "managed memory placed on the device"
        );
        ok_rets(&[at, size])
    }

    /// `ManagedUnplace`: frees a placement `HostMap` has not taken.
    pub(super) fn managed_unplace(&mut self, at: u64) -> OpResult {
        match self.managed.get(&at) {
            Some(p) if p.unmapped => {
                self.unplace_managed(at);
                ok()
            }
            _ => Err(status::INVALID_VALUE.into()),
        }
    }

    /// `HostMap` with `HOST_MAP_MANAGED` of `guest` (`len` bytes, `runs`) on device `dev`
    /// (bound): the guest pages of the placement `ManagedPlace` made there become its staging
    /// side, and their bytes (fresh zeroes from the module) the device's.
    pub(super) fn attach_managed(
        &mut self,
        mem: &GuestRam,
        guest: u64,
        len: u64,
        runs: &[HostRun],
        dev: usize,
    ) -> OpResult {
        match self.managed.get(&guest) {
            Some(p) if p.unmapped && p.len == len && p.dev == dev => {}
            Some(p) if !p.unmapped => return Err(status::HOST_MEMORY_ALREADY_REGISTERED.into()),
            _ => return Err(status::INVALID_VALUE.into()),
        }
        let drv = Arc::clone(&self.drv);
        let mapped = self
            .host_memory
            .map_elsewhere(mem, guest, len, runs, dev, |local, n| {
                let n = usize::try_from(n).map_err(|_| MapError::Invalid)?;
                // SAFETY: `local..local + n` is mapped by the host-mapping table, which
                // unregisters it before it unmaps it.
                unsafe { drv.mem_host_register(local, n, false) }
                    .map_err(|_| MapError::NoMemory)?;
                drv.mem_host_device_pointer(local).map_err(|_| {
                    let _ = drv.mem_host_unregister(local);
                    MapError::NoMemory
                })
            })
            .map_err(map_status)?;
        let staging = mapped.dev_addr;
        let n = to_usize(len)?;
        // On the worker's own stream: the legacy stream would join a capture under way.
        let filled = self
            .managed_sync(dev)
            .map_err(|_| CuError::UNKNOWN)
            .and_then(|m| {
                drv.memcpy(guest, staging, n, m.stream)
                    .and_then(|()| drv.stream_synchronize(m.stream))
            });
        if let Err(e) = filled {
            let _ = self.host_memory.unmap(guest, |m| {
                let _ = drv.mem_host_unregister(m.local);
            });
            return Err(on(dev)(e));
        }
        if let Some(p) = self.managed.get_mut(&guest) {
            p.staging = staging;
            p.unmapped = false;
        }
        ok_rets(&[guest])
    }

    /// Places saved managed memory again (saved_host_memory.rs): device memory at `guest`
    /// for `len` bytes on device `dev` (bound), counted in the quota as `ManagedPlace` counts
    /// it, its staging side still to come (0). Its contents are the caller's to write. The
    /// driver must honour the address: the program holds it.
    pub(super) fn place_managed_again(
        &mut self,
        guest: u64,
        len: u64,
        dev: usize,
    ) -> Result<(), CheckpointError> {
        let size = len
            .checked_next_multiple_of(MANAGED_ALIGN)
            .filter(|_| len > 0 && guest.is_multiple_of(MANAGED_ALIGN))
            .ok_or(CheckpointError::Mismatch(format!(
                "managed memory at {guest:#x} ({len} bytes) off its granule"
            )))?;
        if self.host_memory.overlaps(guest, size) || self.managed_overlaps(guest, size) {
            return Err(CheckpointError::Mismatch(format!(
                "managed memory at {guest:#x} over other host memory"
            )));
        }
        let size_us = to_usize(size)?;
        let props = AllocProps {
            device: self.gpu_of(dev as u64)?,
            ..AllocProps::default()
        };
        // Inside the session's device range: the range's restore mapped its block already.
        let in_range = match self.context(dev)?.range.as_ref() {
            Some(r) if r.arena.covers(guest, size) => {
                if r.arena.block_len(guest) != Some(size) {
                    return Err(CheckpointError::Mismatch(format!(
                        "managed memory at {guest:#x}: no block of the device range there"
                    )));
                }
                true
            }
            _ => false,
        };
        let quota = self.host.memory_quota();
        if let Some(q) = &quota {
            if !q.reserve(size) {
                return Err(CheckpointError::Cuda(status::MEMORY_ALLOCATION));
            }
        }
        if in_range {
            self.managed.insert(
                guest,
                Placement {
                    len,
                    size: size_us,
                    handle: None,
                    staging: 0,
                    dev,
                    quota,
                    in_window: false,
                    unmapped: false,
                },
            );
            return Ok(());
        }
        let release = |q: &Option<Arc<QuotaSlot>>| {
            if let Some(q) = q {
                q.release(size);
            }
        };
        match Self::vmm_place(self.drv.as_ref(), guest, size_us, &props) {
            Ok((at, handle)) if at == guest => {
                self.managed.insert(
                    guest,
                    Placement {
                        len,
                        size: size_us,
                        handle: Some(handle),
                        staging: 0,
                        dev,
                        quota,
                        in_window: host_mappings::in_window(guest, size),
                        unmapped: false,
                    },
                );
                Ok(())
            }
            Ok((at, handle)) => {
                Self::vmm_release(self.drv.as_ref(), at, size_us, handle, false);
                release(&quota);
                Err(CheckpointError::Mismatch(format!(
                    "managed memory at {guest:#x}: this worker's driver places it at {at:#x}"
                )))
            }
            Err(e) => {
                release(&quota);
                Err(CheckpointError::Mismatch(format!(
                    "managed memory cannot be placed at {guest:#x} again ({e:?})"
                )))
            }
        }
    }

    /// Reserves `size` bytes (asking for `hint` if non-zero: a window address, opened for the
    /// driver in this process's reservation, or an address to have again), backs them with
    /// device memory of `props` and makes them readable and writable by its device: (address,
    /// handle). The address is wherever the driver put the reservation.
    fn vmm_place(
        drv: &dyn DriverApi,
        hint: u64,
        size: usize,
        props: &AllocProps,
    ) -> Result<(u64, MemHandle), CuError> {
        let window = hint != 0 && host_mappings::in_window(hint, size as u64);
        if window && !host_mappings::window_open(hint, size as u64) {
            return Err(CuError::INVALID_VALUE);
        }
        let reserved = drv.mem_address_reserve(size, to_usize(MANAGED_ALIGN).unwrap_or(0), hint);
        if window && reserved.as_ref().map_or(true, |&at| at != hint) {
            // Not taken: the hole goes back to the reservation.
            host_mappings::window_close(hint, size as u64);
        }
        let at = reserved?;
        let in_window = window && at == hint;
        let handle = match drv.mem_create(size, props) {
            Ok(h) => h,
            Err(e) => {
                let _ = drv.mem_address_free(at, size);
                if in_window {
                    host_mappings::window_close(at, size as u64);
                }
                return Err(e);
            }
        };
        let steps = drv.mem_map(at, size, 0, handle).and_then(|()| {
            drv.mem_set_access(at, size, &[(props.device, ACCESS_READWRITE)])
                .inspect_err(|_| {
                    let _ = drv.mem_unmap(at, size);
                })
        });
        if let Err(e) = steps {
            let _ = drv.mem_release(handle);
            let _ = drv.mem_address_free(at, size);
            if in_window {
                host_mappings::window_close(at, size as u64);
            }
            return Err(e);
        }
        Ok((at, handle))
    }

    /// Undoes [`Self::vmm_place`] of `at`.
    fn vmm_release(drv: &dyn DriverApi, at: u64, size: usize, handle: MemHandle, in_window: bool) {
        let _ = drv.mem_unmap(at, size);
        let _ = drv.mem_release(handle);
        let _ = drv.mem_address_free(at, size);
        if in_window {
            host_mappings::window_close(at, size as u64);
        }
    }

    /// True if `guest..guest + size` overlaps a placement.
    pub(super) fn managed_overlaps(&self, guest: u64, size: u64) -> bool {
        let end = guest.saturating_add(size);
        self.managed
            .range(..end)
            .next_back()
            .is_some_and(|(&b, p)| b + p.size as u64 > guest)
    }

    /// True if the device range `ptr..ptr + len` lies inside the mapped bytes of one placement
    /// the guest's pages stand behind.
    pub(super) fn managed_contains(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        self.managed
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, p)| !p.unmapped && end <= b + p.len)
    }

    /// True while a placement waits for its `HostMap` (a saved state cannot hold it).
    pub(super) fn managed_unmapped(&self) -> bool {
        self.managed.values().any(|p| p.unmapped)
    }

    /// Frees the device memory placed at `guest`, if any (the caller then unmaps the staging
    /// side). With a sticky error the driver is not called: the worker's exit frees it.
    pub(super) fn unplace_managed(&mut self, guest: u64) {
        let Some(p) = self.managed.remove(&guest) else {
            return;
        };
        if self.host.sticky_error().is_none() {
            match p.handle {
                Some(h) => Self::vmm_release(self.drv.as_ref(), guest, p.size, h, p.in_window),
                None => self.free_range_block(p.dev, guest),
            }
        }
        if let Some(q) = &p.quota {
            q.release(p.size as u64);
        }
    }

    /// A block of `size` bytes (a multiple of `MANAGED_ALIGN`) of device `dev`'s range (bound),
    /// if the session has a range there whose large blocks are `MANAGED_ALIGN` aligned; `None`
    /// where it has none (the driver's own reservation serves then).
    fn place_in_range(&mut self, dev: usize, size: u64) -> Option<Result<u64, Fault>> {
        let drv = Arc::clone(&self.drv);
        let c = match self.context(dev) {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        let r = c.range.as_mut()?;
        if r.arena.granularity() != MANAGED_ALIGN {
            return None;
        }
        let backing = ReservedRange::backing(drv.as_ref(), r.gpu, &r.access);
        Some(
            r.arena
                .alloc(size, &backing)
                .map_err(|e| super::memory::arena_fault(dev, e)),
        )
    }

    /// Gives the range block of a placement at `at` on `dev` back, once the device's work that
    /// may use it is done (as `cudaFree` of managed memory waits).
    fn free_range_block(&mut self, dev: usize, at: u64) {
        if self.bind(dev).is_err() {
            return;
        }
        let held = self
            .context(dev)
            .is_ok_and(|c| c.range.as_ref().is_some_and(|r| r.arena.holds(at)));
        if !held {
            return;
        }
        if self.capture_under_way() {
            self.wait_for_device_work(dev);
        } else {
            let _ = self.drv.ctx_synchronize();
        }
        let drv = Arc::clone(&self.drv);
        if let Ok(Some(r)) = self.context(dev).map(|c| c.range.as_mut()) {
            let backing = ReservedRange::backing(drv.as_ref(), r.gpu, &r.access);
            let _ = r.arena.free(at, &backing);
        }
    }

    /// The placements of `dev` that are blocks of its range: (address, block length), for the
    /// range's saved or paused state.
    pub(super) fn managed_range_blocks(&self, dev: usize) -> Vec<(u64, u64)> {
        self.managed
            .iter()
            .filter(|(_, p)| p.dev == dev && p.handle.is_none())
            .map(|(&at, p)| (at, p.size as u64))
            .collect()
    }

    /// Frees every placement on `dev` that `HostMap` has not taken (the context goes).
    pub(super) fn unplace_unmapped_on(&mut self, dev: usize) {
        let gone: Vec<u64> = self
            .managed
            .iter()
            .filter(|(_, p)| p.unmapped && p.dev == dev)
            .map(|(&g, _)| g)
            .collect();
        for g in gone {
            self.unplace_managed(g);
        }
    }

    /// The migration stream and event of `dev` (bound), made on first need.
    fn managed_sync(&mut self, dev: usize) -> Result<ManagedSync, Fault> {
        if let Some(s) = self.context(dev)?.managed_sync {
            return Ok(s);
        }
        // cudaStreamNonBlocking: ordered with none of the program's streams.
        let stream = self.drv.stream_create(1, 0).map_err(on(dev))?;
        let fence = match self.drv.event_create(EVENT_DISABLE_TIMING) {
            Ok(e) => e,
            Err(e) => {
                let _ = self.drv.stream_destroy(stream);
                return Err(on(dev)(e));
            }
        };
        let s = ManagedSync { stream, fence };
        self.context(dev)?.managed_sync = Some(s);
        Ok(s)
    }

    /// A stream made on `dev` (bound) waits for the last copy of managed memory to the
    /// device, as the streams that existed then do.
    pub(super) fn order_after_managed_copies(&mut self, dev: usize, stream: Stream) {
        let fence = self
            .devices
            .get(dev)
            .and_then(Option::as_ref)
            .and_then(|c| c.managed_sync)
            .map(|s| s.fence);
        if let Some(fence) = fence {
            let _ = self.drv.stream_wait_event(stream, fence, 0);
        }
    }

    /// Stream `stream` of `dev` (bound) is about to be destroyed with work that may touch
    /// managed memory still queued: the legacy stream waits for that work, so that the check
    /// before a copy back (`device_idle`) still sees it.
    pub(super) fn managed_outlive_stream(&mut self, dev: usize, stream: Stream) {
        if !self.managed.values().any(|p| p.dev == dev) || self.is_capturing(stream) {
            return;
        }
        if !matches!(self.drv.stream_is_capturing(NULL_STREAM), Ok(false)) {
            return;
        }
        // An event of its own: the fence marks the last copy to the device, which streams
        // made later wait for. Destroyed at once; the driver keeps it until the wait is done.
        let Ok(done) = self.drv.event_create(EVENT_DISABLE_TIMING) else {
            return;
        };
        if self.drv.event_record(done, stream).is_ok() {
            let _ = self.drv.stream_wait_event(NULL_STREAM, done, 0);
        }
        let _ = self.drv.event_destroy(done);
    }

    /// After a copy to the device on `stream` of `dev` (bound): every other stream of the
    /// session there (the legacy stream too) waits for it before its next work, which may
    /// touch the memory. Streams being captured record work for later and are left alone.
    fn order_streams_after(&mut self, dev: usize, stream: Stream) -> Result<(), Fault> {
        let fence = self.managed_sync(dev)?.fence;
        self.drv.event_record(fence, stream).map_err(on(dev))?;
        let others: Vec<Stream> = self
            .streams
            .values()
            .filter(|s| s.dev == dev && s.raw != stream)
            .map(|s| s.raw)
            .collect();
        for s in others {
            if !self.is_capturing(s) {
                self.drv.stream_wait_event(s, fence, 0).map_err(on(dev))?;
            }
        }
        if stream != NULL_STREAM && matches!(self.drv.stream_is_capturing(NULL_STREAM), Ok(false)) {
            self.drv
                .stream_wait_event(NULL_STREAM, fence, 0)
                .map_err(on(dev))?;
        }
        Ok(())
    }

    /// Whether no work of the session on `dev` (bound) can still run: every stream idle
    /// (streams being captured hold only work for later).
    fn device_idle(&self, dev: usize) -> Result<bool, Fault> {
        let idle = |s: Stream| match self.drv.stream_query(s) {
            Ok(()) => Ok(true),
            Err(e) if e == CuError::NOT_READY => Ok(false),
            Err(e) => Err(on(dev)(e)),
        };
        for s in self.streams.values().filter(|s| s.dev == dev) {
            if !self.is_capturing(s.raw) && !idle(s.raw)? {
                return Ok(false);
            }
        }
        if matches!(self.drv.stream_is_capturing(NULL_STREAM), Ok(false)) && !idle(NULL_STREAM)? {
            return Ok(false);
        }
        Ok(true)
    }

    /// `ManagedMigrate`: see qcuda-proto's `Op::ManagedMigrate`.
    pub(super) fn managed_migrate(&mut self, req: &Request) -> OpResult {
        let [guest, dir, stream, scope, ..] = req.header().args;
        if (dir != MANAGED_TO_DEVICE && dir != MANAGED_TO_HOST)
            || (scope != MANAGED_SCOPE_GLOBAL && scope != MANAGED_SCOPE_STREAM)
            || (scope == MANAGED_SCOPE_STREAM && stream == 0)
        {
            return Err(status::INVALID_VALUE.into());
        }
        let (dev, s) = self.copy_stream(req, stream)?;
        let (len, staging) = match self.managed.get(&guest) {
            Some(p) if p.dev == dev && !p.unmapped => (to_usize(p.len)?, p.staging),
            _ => return Err(status::INVALID_VALUE.into()),
        };
        if staging == 0 {
            // Restored, and guest RAM has not come yet: there is no staging side to copy.
            return Err(status::NOT_READY.into());
        }
        if dir == MANAGED_TO_DEVICE {
            if self.is_capturing(s) {
                // A capture records work for later; the graph's launch migrates then.
                return ok_rets(&[0]);
            }
            self.drv.memcpy(guest, staging, len, s).map_err(on(dev))?;
            if scope == MANAGED_SCOPE_GLOBAL {
                self.order_streams_after(dev, s)?;
            }
            return ok_rets(&[1]);
        }
        let idle = if scope == MANAGED_SCOPE_GLOBAL {
            self.device_idle(dev)?
        } else {
            !self.is_capturing(s)
                && match self.drv.stream_query(s) {
                    Ok(()) => true,
                    Err(e) if e == CuError::NOT_READY => false,
                    Err(e) => return Err(on(dev)(e)),
                }
        };
        if !idle {
            // Work that may touch it still runs: the CPU may not touch it yet either.
            return ok_rets(&[0]);
        }
        let copy = self.managed_sync(dev)?.stream;
        self.drv
            .memcpy(staging, guest, len, copy)
            .map_err(on(dev))?;
        self.drv.stream_synchronize(copy).map_err(on(dev))?;
        ok_rets(&[1])
    }
}

//! Managed memory resident on the device (`HostMap` with `HOST_MAP_MANAGED`, `ManagedMigrate`).
//!
//! CUDA's model for devices without concurrent managed access (`concurrentManagedAccess` = 0,
//! what qcuda reports): managed memory is the device's while work that may touch it runs, and
//! the host's after a synchronisation. The GPU's atomics on it are then device atomics, as
//! natively. Here:
//!
//! - the guest pages of a managed allocation (held by qcuda.ko) are mapped into this process at
//!   an address of the kernel's choosing and registered with the driver (the *staging* side);
//! - at the guest's own address, device memory is reserved, created, mapped and made
//!   accessible through the driver's virtual memory calls, so the pointer the program holds is
//!   a device address (unified addressing: one address space, so the guest pages are NOT also
//!   mapped there);
//! - `ManagedMigrate` copies guest RAM → device (before work that may touch it, in stream
//!   order) or device → guest RAM (at a synchronisation point) with the driver's DMA.
//!
//! guest-lib decides when (core/managed_memory.rs). Where any step fails (no VMM support, the
//! address not free in the driver's address space), the allocation is mapped as pinned memory
//! instead: coherent at all times, with atomics as the bus provides them.

use qcuda_proto::{HostRun, HOST_PAGE_SIZE, MANAGED_ALIGN, MANAGED_TO_DEVICE, MANAGED_TO_HOST};

use super::*;
use crate::cuda::driver::vmm::{AllocProps, MemHandle, ACCESS_READWRITE};
use crate::guest_buffer::GuestRam;
use crate::limits::QuotaSlot;

/// Device memory placed at a managed allocation's guest address.
#[derive(Debug)]
pub(super) struct Placement {
    /// Bytes the guest mapped (what migrates).
    pub(super) len: u64,
    /// Bytes reserved and backed on the device (`len` rounded up to `MANAGED_ALIGN`).
    pub(super) size: usize,
    handle: MemHandle,
    /// The device address of the guest pages (registered, mapped elsewhere in this process);
    /// 0 while a restored placement waits for guest RAM (saved_host_memory.rs).
    pub(super) staging: u64,
    /// The guest device ordinal it was placed on.
    pub(super) dev: usize,
    /// The quota this placement holds `size` bytes of.
    quota: Option<Arc<QuotaSlot>>,
}

impl GpuState {
    /// Places managed memory for `HostMap` of `guest` (`len` bytes, `runs`) on device `dev`
    /// (bound). `Ok(None)`: it could not be placed; nothing is left behind and the caller maps
    /// the pages as pinned memory.
    pub(super) fn place_managed(
        &mut self,
        mem: &GuestRam,
        guest: u64,
        len: u64,
        runs: &[HostRun],
        dev: usize,
    ) -> Result<Option<u64>, Fault> {
        let Some(size) = len.checked_next_multiple_of(MANAGED_ALIGN) else {
            return Err(status::INVALID_VALUE.into());
        };
        if !guest.is_multiple_of(MANAGED_ALIGN) {
            return Ok(None);
        }
        // The whole device range must be the guest's own: nothing else of the session there.
        if self.host_memory.overlaps(guest, size) || self.managed_overlaps(guest, size) {
            return Err(status::HOST_MEMORY_ALREADY_REGISTERED.into());
        }
        let size_us = to_usize(size)?;
        let cu_dev = self.gpu_of(dev as u64)?;
        let props = AllocProps {
            device: cu_dev,
            ..AllocProps::default()
        };
        let drv = Arc::clone(&self.drv);
        match drv.mem_granularity(&props, false) {
            Ok(g) if g != 0 && MANAGED_ALIGN.is_multiple_of(g as u64) => {}
            _ => return Ok(None),
        }
        let quota = self.host.memory_quota();
        if let Some(q) = &quota {
            if !q.reserve(size) {
                return Err(status::MEMORY_ALLOCATION.into());
            }
        }
        let give_quota = |q: &Option<Arc<QuotaSlot>>| {
            if let Some(q) = q {
                q.release(size);
            }
        };
        // The guest pages, elsewhere, registered: the staging side of every migration.
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
            });
        let staging = match mapped {
            Ok(m) => m.dev_addr,
            Err(_) => {
                give_quota(&quota);
                return Ok(None);
            }
        };
        let undo_staging = |me: &mut Self| {
            let _ = me.host_memory.unmap(guest, |m| {
                let _ = drv.mem_host_unregister(m.local);
            });
        };
        match Self::vmm_place(
            drv.as_ref(),
            guest,
            size_us,
            &props,
            Some((staging, to_usize(len)?)),
        ) {
            Ok(handle) => {
                self.managed.insert(
                    guest,
                    Placement {
                        len,
                        size: size_us,
                        handle,
                        staging,
                        dev,
                        quota,
                    },
                );
                debug!(
                    session = self.id,
                    guest = format_args!("{guest:#x}"),
                    len,
                    "managed memory placed on the device"
                );
                Ok(Some(guest))
            }
            Err(e) => {
                warn!(
                    session = self.id,
                    guest = format_args!("{guest:#x}"),
                    len,
                    error = ?e,
                    "managed memory stays in guest RAM: no device memory at its address"
                );
                undo_staging(self);
                give_quota(&quota);
                Ok(None)
            }
        }
    }

    /// Places saved managed memory again (saved_host_memory.rs): device memory at `guest`
    /// for `len` bytes on device `dev` (bound), counted in the quota as `place_managed`
    /// counts it, its staging side still to come (0). Its contents are the caller's to write.
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
        let quota = self.host.memory_quota();
        if let Some(q) = &quota {
            if !q.reserve(size) {
                return Err(CheckpointError::Cuda(status::MEMORY_ALLOCATION));
            }
        }
        match Self::vmm_place(self.drv.as_ref(), guest, size_us, &props, None) {
            Ok(handle) => {
                self.managed.insert(
                    guest,
                    Placement {
                        len,
                        size: size_us,
                        handle,
                        staging: 0,
                        dev,
                        quota,
                    },
                );
                Ok(())
            }
            Err(e) => {
                if let Some(q) = &quota {
                    q.release(size);
                }
                Err(CheckpointError::Mismatch(format!(
                    "managed memory cannot be placed at {guest:#x} again ({e:?})"
                )))
            }
        }
    }

    /// Device memory at `guest` (`size` bytes), holding the `len` bytes at `staging` where
    /// `fill` is `Some((staging, len))`.
    fn vmm_place(
        drv: &dyn DriverApi,
        guest: u64,
        size: usize,
        props: &AllocProps,
        fill: Option<(u64, usize)>,
    ) -> Result<MemHandle, CuError> {
        if !host_mappings::window_open(guest, size as u64) {
            return Err(CuError::INVALID_VALUE);
        }
        let close = || host_mappings::window_close(guest, size as u64);
        let at = match drv.mem_address_reserve(size, 0, guest) {
            Ok(at) => at,
            Err(e) => {
                close();
                return Err(e);
            }
        };
        if at != guest {
            let _ = drv.mem_address_free(at, size);
            close();
            return Err(CuError::INVALID_VALUE);
        }
        let free_va = || {
            let _ = drv.mem_address_free(guest, size);
            close();
        };
        let handle = match drv.mem_create(size, props) {
            Ok(h) => h,
            Err(e) => {
                free_va();
                return Err(e);
            }
        };
        let steps = drv.mem_map(guest, size, 0, handle).and_then(|()| {
            drv.mem_set_access(guest, size, &[(props.device, ACCESS_READWRITE)])
                .and_then(|()| match fill {
                    // The guest's bytes (zeroes, fresh from the module) become the device's.
                    Some((staging, len)) => drv
                        .memcpy(guest, staging, len, NULL_STREAM)
                        .and_then(|()| drv.stream_synchronize(NULL_STREAM)),
                    None => Ok(()),
                })
                .inspect_err(|_| {
                    let _ = drv.mem_unmap(guest, size);
                })
        });
        if let Err(e) = steps {
            let _ = drv.mem_release(handle);
            free_va();
            return Err(e);
        }
        Ok(handle)
    }

    /// True if `guest..guest + size` overlaps a placement.
    pub(super) fn managed_overlaps(&self, guest: u64, size: u64) -> bool {
        let end = guest.saturating_add(size);
        self.managed
            .range(..end)
            .next_back()
            .is_some_and(|(&b, p)| b + p.size as u64 > guest)
    }

    /// True if the device range `ptr..ptr + len` lies inside the mapped bytes of one placement.
    pub(super) fn managed_contains(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        self.managed
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, p)| end <= b + p.len)
    }

    /// Frees the device memory placed at `guest`, if any (the caller then unmaps the staging
    /// side). With a sticky error the driver is not called: the worker's exit frees it.
    pub(super) fn unplace_managed(&mut self, guest: u64) {
        let Some(p) = self.managed.remove(&guest) else {
            return;
        };
        if self.host.sticky_error().is_none() {
            let drv = self.drv.as_ref();
            let _ = drv.mem_unmap(guest, p.size);
            let _ = drv.mem_release(p.handle);
            let _ = drv.mem_address_free(guest, p.size);
            host_mappings::window_close(guest, p.size as u64);
        }
        if let Some(q) = &p.quota {
            q.release(p.size as u64);
        }
    }

    /// `ManagedMigrate`: see qcuda-proto's `Op::ManagedMigrate`.
    pub(super) fn managed_migrate(&mut self, req: &Request) -> OpResult {
        let [guest, dir, stream, ..] = req.header().args;
        if dir != MANAGED_TO_DEVICE && dir != MANAGED_TO_HOST {
            return Err(status::INVALID_VALUE.into());
        }
        let (dev, stream) = self.copy_stream(req, stream)?;
        if self.is_capturing(stream) {
            // A capture records work for later; the graph's launch migrates then.
            return ok_rets(&[0]);
        }
        let Some(p) = self.managed.get(&guest) else {
            // Pinned-style managed memory (not placed) is coherent by itself; anything else is
            // not the session's managed memory.
            return if guest.is_multiple_of(HOST_PAGE_SIZE) && self.host_memory.overlaps(guest, 1) {
                ok_rets(&[0])
            } else {
                Err(status::INVALID_VALUE.into())
            };
        };
        let (len, staging) = (to_usize(p.len)?, p.staging);
        if staging == 0 {
            // Restored, and guest RAM has not come yet: there is no staging side to copy.
            return Err(status::NOT_READY.into());
        }
        if dir == MANAGED_TO_DEVICE {
            self.drv
                .memcpy(guest, staging, len, stream)
                .map_err(on(dev))?;
        } else {
            self.drv
                .memcpy(staging, guest, len, stream)
                .map_err(on(dev))?;
            self.drv.stream_synchronize(stream).map_err(on(dev))?;
        }
        ok_rets(&[1])
    }
}

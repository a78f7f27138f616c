//! Guest memory mapped for the GPU in a saved state: pinned memory (`cudaHostAlloc`, qcuda.ko's
//! mmap of /dev/qcuda), registered memory (`cudaHostRegister`) and managed memory, captured
//! and made again (checkpoint.rs does the rest of the state).
//!
//! The pages themselves are guest RAM: they move with the VM (or stay where they are across a
//! restart), and qcuda.ko keeps holding them, so their guest-physical runs stay valid. What is
//! saved is each mapping's description: guest address, length, runs, device, flags, where this
//! process mapped it and the device address the guest was told; and for managed memory placed
//! on the device (managed.rs), its runs and the device's copy of its bytes. Both copies are
//! saved as they are, since either may be the current one: the device's while work may touch
//! it, the guest's after a synchronisation (guest-lib moves it back before the next launch).
//!
//! A restore runs in two steps, because a migration's destination gets the state before QEMU
//! sends guest RAM's table (SET_MEM_TABLE comes when the VM starts there):
//!
//! 1. [`GpuState::restore_into`] checks every record as `HostMap` checks the guest's (run
//!    tables, ranges, overlaps, run budgets), holds each mapping's local range at its saved
//!    address ([`HeldRange`]: refused if something of this process is there already, which
//!    fails the restore, so a migration fails and the source goes on), places managed memory
//!    on the device again at its guest address with its saved bytes, and counts it in the
//!    quota as `HostMap` does.
//! 2. [`GpuState::attach_guest_ram`] (the worker calls it whenever guest RAM is mapped, and
//!    the restore itself if it is there already) maps the runs from guest RAM into the held
//!    ranges, checked against the regions exactly as for `HostMap`, registers them, and
//!    requires the device address the guest holds. Managed memory's guest pages are mapped
//!    and registered as its staging side. What fails there leaves the process a sticky error:
//!    its memory is not what it was, and its calls say so rather than go on with wrong data.

use qcuda_proto::{HostRun, HOST_RUN_SIZE, MANAGED_ALIGN};
use tracing::error;
use vm_memory::GuestMemoryBackend;

use super::*;
use crate::{
    cuda::{
        host_mappings::{HeldRange, MAX_TOTAL_RUNS},
        saved_state::{SavedHostMapping, SavedManaged},
    },
    guest_buffer::GuestRam,
};

fn mismatch(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Mismatch(what.into())
}

fn dev_u32(dev: usize) -> u32 {
    u32::try_from(dev).unwrap_or(u32::MAX)
}

/// A saved record's flag word: `HOST_MAP_READ_ONLY` or nothing.
fn saved_flags(read_only: bool) -> u32 {
    if read_only {
        u32::try_from(HOST_MAP_READ_ONLY).unwrap_or(u32::MAX)
    } else {
        0
    }
}

fn saved_runs(runs: &[HostRun]) -> Vec<(u64, u64)> {
    runs.iter().map(|r| (r.gpa, r.len)).collect()
}

/// A saved run table, checked exactly as `HostMap`'s table from the guest is.
fn checked_runs(
    runs: &[(u64, u64)],
    len: u64,
    what: &str,
) -> Result<Vec<HostRun>, CheckpointError> {
    if runs.len() > host_mappings::MAX_RUNS {
        return Err(mismatch(format!("{what}: {} runs", runs.len())));
    }
    let mut table = Vec::with_capacity(runs.len() * HOST_RUN_SIZE);
    for &(gpa, len) in runs {
        table.extend_from_slice(&HostRun { gpa, len }.encode());
    }
    host_mappings::decode_runs(&table, len).map_err(|e| mismatch(format!("{what}'s runs: {e:?}")))
}

impl GpuState {
    /// The session's guest memory mapped for the GPU, for a saved state: its mappings, and
    /// its managed memory placed on the device with the device's bytes. Contexts are
    /// synchronised (checkpoint.rs's capture did it).
    pub(super) fn capture_host_memory(
        &mut self,
    ) -> Result<(Vec<SavedHostMapping>, Vec<SavedManaged>), CheckpointError> {
        let mut mappings = Vec::new();
        let mut managed = Vec::new();
        for (guest, m) in self.host_memory.mappings() {
            let runs = saved_runs(self.host_memory.runs_of(guest).unwrap_or_default());
            if let Some(p) = self.managed.get(&guest) {
                let (dev, len) = (p.dev, p.len);
                self.bind(dev)?;
                let contents = self.read_device(dev, guest, len)?;
                managed.push(SavedManaged {
                    guest,
                    dev: dev_u32(dev),
                    runs,
                    contents,
                });
                continue;
            }
            mappings.push(SavedHostMapping {
                guest,
                len: m.len,
                local: m.local,
                dev_addr: m.dev_addr,
                dev: dev_u32(m.dev),
                flags: saved_flags(self.read_only_host.contains(&guest)),
                runs,
            });
        }
        // Restored and still waiting for guest RAM: saved as they were restored.
        let waiting = std::mem::take(&mut self.waiting_host);
        let captured = self.capture_waiting(&waiting, &mut mappings, &mut managed);
        self.waiting_host = waiting;
        captured?;
        mappings.sort_unstable_by_key(|m| m.guest);
        managed.sort_unstable_by_key(|m| m.guest);
        Ok((mappings, managed))
    }

    fn capture_waiting(
        &mut self,
        waiting: &[Waiting],
        mappings: &mut Vec<SavedHostMapping>,
        managed: &mut Vec<SavedManaged>,
    ) -> Result<(), CheckpointError> {
        for w in waiting {
            match w {
                Waiting::Mapping {
                    guest,
                    dev,
                    read_only,
                    dev_addr,
                    runs,
                    held,
                } => mappings.push(SavedHostMapping {
                    guest: *guest,
                    len: runs.iter().map(|r| r.len).sum(),
                    local: held.local(),
                    dev_addr: *dev_addr,
                    dev: dev_u32(*dev),
                    flags: saved_flags(*read_only),
                    runs: saved_runs(runs),
                }),
                Waiting::Staging { guest, dev, runs } => {
                    self.bind(*dev)?;
                    let len = runs.iter().map(|r| r.len).sum();
                    let contents = self.read_device(*dev, *guest, len)?;
                    managed.push(SavedManaged {
                        guest: *guest,
                        dev: dev_u32(*dev),
                        runs: saved_runs(runs),
                        contents,
                    });
                }
            }
        }
        Ok(())
    }

    /// Step 1 of a restore (see the module documentation). On an error nothing of it is left.
    pub(super) fn restore_host_memory(
        &mut self,
        mappings: &[SavedHostMapping],
        managed: &[SavedManaged],
    ) -> Result<(), CheckpointError> {
        let made = self.restore_host_memory_records(mappings, managed);
        let made = made.and_then(|()| match self.guest_ram.clone() {
            Some(mem) => self.attach_waiting(&mem),
            None => Ok(()),
        });
        if made.is_err() {
            self.forget_host_memory();
        }
        made
    }

    fn restore_host_memory_records(
        &mut self,
        mappings: &[SavedHostMapping],
        managed: &[SavedManaged],
    ) -> Result<(), CheckpointError> {
        // Everything is checked before anything is made.
        let mut ranges = Vec::with_capacity(mappings.len() + managed.len());
        let mut total_runs = self.host_memory.total_runs();
        let mut checked = Vec::with_capacity(mappings.len());
        for m in mappings {
            let what = format!("host mapping at {:#x}", m.guest);
            let dev = self.saved_context(m.dev, &what)?;
            if u64::from(m.flags) & !HOST_MAP_READ_ONLY != 0 {
                return Err(mismatch(format!("{what}: flags {:#x}", m.flags)));
            }
            host_mappings::check_range(m.guest, m.len)
                .and_then(|()| host_mappings::check_range(m.local, m.len))
                .map_err(|e| mismatch(format!("{what}: {e:?}")))?;
            let runs = checked_runs(&m.runs, m.len, &what)?;
            total_runs += runs.len();
            ranges.push((m.guest, m.len));
            checked.push((dev, runs));
        }
        let mut placed = Vec::with_capacity(managed.len());
        for p in managed {
            let what = format!("managed memory at {:#x}", p.guest);
            let dev = self.saved_context(p.dev, &what)?;
            let len = p
                .runs
                .iter()
                .try_fold(0u64, |t, &(_, n)| t.checked_add(n))
                .ok_or_else(|| mismatch(format!("{what}: its length")))?;
            let runs = checked_runs(&p.runs, len, &what)?;
            if p.contents.len() as u64 != len {
                return Err(mismatch(format!("{what}: its contents")));
            }
            let size = len
                .checked_next_multiple_of(MANAGED_ALIGN)
                .ok_or_else(|| mismatch(format!("{what}: its length")))?;
            host_mappings::check_range(p.guest, size)
                .map_err(|e| mismatch(format!("{what}: {e:?}")))?;
            total_runs += runs.len();
            ranges.push((p.guest, size));
            placed.push((dev, len, runs));
        }
        if total_runs > MAX_TOTAL_RUNS {
            return Err(mismatch(format!("{total_runs} host-mapping runs")));
        }
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0)
            || ranges.iter().any(|&(g, n)| {
                self.host_memory.overlaps(g, n)
                    || self.managed_overlaps(g, n)
                    || self.waiting_overlaps(g, n)
            })
        {
            return Err(mismatch("host mappings over each other"));
        }
        // Managed memory first: its device memory takes holes in the window, which the
        // mappings' held ranges then keep clear of (they do not overlap, checked above).
        for (p, (dev, len, runs)) in managed.iter().zip(placed) {
            self.bind(dev)?;
            self.place_managed_again(p.guest, len, dev)?;
            self.waiting_host.push(Waiting::Staging {
                guest: p.guest,
                dev,
                runs,
            });
            self.write_device(dev, p.guest, &p.contents)?;
        }
        for (m, (dev, runs)) in mappings.iter().zip(checked) {
            let held = HeldRange::hold(m.guest, m.local, m.len).map_err(|e| {
                mismatch(format!(
                    "host mapping at {:#x}: its address {:#x} ({} bytes) cannot be had in this \
                     worker ({e:?}): the device address the guest holds would change",
                    m.guest, m.local, m.len
                ))
            })?;
            self.waiting_host.push(Waiting::Mapping {
                guest: m.guest,
                dev,
                read_only: u64::from(m.flags) & HOST_MAP_READ_ONLY != 0,
                dev_addr: m.dev_addr,
                runs,
                held,
            });
        }
        Ok(())
    }

    /// A saved device ordinal whose context the restore has made.
    fn saved_context(&self, dev: u32, what: &str) -> Result<usize, CheckpointError> {
        usize::try_from(dev)
            .ok()
            .filter(|&d| matches!(self.devices.get(d), Some(Some(_))))
            .ok_or_else(|| mismatch(format!("{what}: device {dev} has no context")))
    }

    pub(super) fn waiting_overlaps(&self, guest: u64, len: u64) -> bool {
        let end = guest.saturating_add(len);
        self.waiting_host.iter().any(|w| match w {
            Waiting::Mapping { guest: g, runs, .. } => {
                let n: u64 = runs.iter().map(|r| r.len).sum();
                *g < end && guest < g.saturating_add(n)
            }
            // Its placement holds the range.
            Waiting::Staging { .. } => false,
        })
    }

    /// Gives up every host mapping and placement (a restore that failed makes nothing).
    fn forget_host_memory(&mut self) {
        self.waiting_host.clear();
        let placed: Vec<u64> = self.managed.keys().copied().collect();
        for guest in placed {
            self.unplace_managed(guest);
        }
        let drv = Arc::clone(&self.drv);
        for guest in self.host_memory.all() {
            let _ = self.host_memory.unmap(guest, |m| {
                let _ = drv.mem_host_unregister(m.local);
            });
        }
        self.read_only_host.clear();
    }

    /// `HostUnmap` of a restored mapping still waiting for guest RAM: it is given up (a
    /// managed one's placement too). False if none waits at `guest`.
    pub(super) fn unmap_waiting(&mut self, guest: u64) -> bool {
        let Some(i) = self.waiting_host.iter().position(|w| match w {
            Waiting::Mapping { guest: g, .. } | Waiting::Staging { guest: g, .. } => *g == guest,
        }) else {
            return false;
        };
        if let Waiting::Staging { .. } = self.waiting_host.swap_remove(i) {
            self.unplace_managed(guest);
        }
        true
    }

    /// Ends what waits for guest RAM on device `dev` (its context is going).
    pub(super) fn drop_waiting(&mut self, dev: usize) {
        let (gone, kept): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting_host)
            .into_iter()
            .partition(|w| w.dev() == dev);
        self.waiting_host = kept;
        for w in gone {
            if let Waiting::Staging { guest, .. } = w {
                self.unplace_managed(guest);
            }
        }
    }

    /// Guest RAM as the worker maps it now (every memory table). Restored mappings waiting
    /// for it are made (step 2, see the module documentation); if one cannot be, the
    /// process's state is not what it was: it gets a sticky error, and the reason is logged.
    pub fn attach_guest_ram(&mut self, mem: &Arc<GuestRam>) {
        if mem.num_regions() == 0 {
            return;
        }
        self.guest_ram = Some(Arc::clone(mem));
        if self.waiting_host.is_empty() || self.host.sticky_error().is_some() {
            return;
        }
        if let Err(e) = self.attach_waiting(mem) {
            error!(
                session = self.id,
                error = %e,
                "restored guest memory cannot be mapped for the GPU again; the program's \
                 calls fail from now on"
            );
            self.host.set_sticky_error(status::UNKNOWN);
        }
    }

    /// Maps every waiting mapping from `mem`; stops at the first that fails (the rest wait).
    fn attach_waiting(&mut self, mem: &GuestRam) -> Result<(), CheckpointError> {
        while let Some(w) = self.waiting_host.pop() {
            let drv = Arc::clone(&self.drv);
            match w {
                Waiting::Mapping {
                    guest,
                    dev,
                    read_only,
                    dev_addr,
                    runs,
                    held,
                } => {
                    self.bind(dev)?;
                    let mapped =
                        self.host_memory
                            .map_held(mem, guest, &runs, dev, held, |local, n| {
                                register(drv.as_ref(), local, n, read_only)
                            });
                    let m = mapped.map_err(|e| {
                        mismatch(format!(
                            "host mapping at {guest:#x}: {e:?} in this guest RAM"
                        ))
                    })?;
                    if m.dev_addr != dev_addr {
                        let _ = self.host_memory.unmap(guest, |m| {
                            let _ = drv.mem_host_unregister(m.local);
                        });
                        return Err(mismatch(format!(
                            "host mapping at {guest:#x}: registered at device address {:#x}, \
                             the guest holds {dev_addr:#x}",
                            m.dev_addr
                        )));
                    }
                    if read_only {
                        self.read_only_host.insert(guest);
                    }
                }
                Waiting::Staging { guest, dev, runs } => {
                    self.bind(dev)?;
                    let len = runs.iter().map(|r| r.len).sum();
                    let mapped =
                        self.host_memory
                            .map_elsewhere(mem, guest, len, &runs, dev, |local, n| {
                                register(drv.as_ref(), local, n, false)
                            });
                    let m = mapped.map_err(|e| {
                        // Its placement waits no more: nothing would ever fill it.
                        self.unplace_managed(guest);
                        mismatch(format!(
                            "managed memory at {guest:#x}: its guest pages: {e:?} in this \
                             guest RAM"
                        ))
                    })?;
                    match self.managed.get_mut(&guest) {
                        Some(p) => p.staging = m.dev_addr,
                        None => return Err(mismatch("managed memory without its placement")),
                    }
                }
            }
        }
        debug!(
            session = self.id,
            "restored host mappings made from guest RAM"
        );
        Ok(())
    }
}

/// Registers `local..local + n` (mapped by the host-mapping table, which unregisters it
/// before it unmaps it) and returns its device address.
fn register(drv: &dyn DriverApi, local: u64, n: u64, read_only: bool) -> Result<u64, MapError> {
    let n = usize::try_from(n).map_err(|_| MapError::Invalid)?;
    // SAFETY: `local..local + n` is mapped by the host-mapping table, which unregisters it
    // (`unmap`, `teardown`) before it unmaps it.
    unsafe { drv.mem_host_register(local, n, read_only) }.map_err(|_| MapError::NoMemory)?;
    drv.mem_host_device_pointer(local).map_err(|_| {
        let _ = drv.mem_host_unregister(local);
        MapError::NoMemory
    })
}

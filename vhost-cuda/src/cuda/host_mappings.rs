//! Guest memory the GPU reaches directly: the worker's side of `HostMap` and `HostUnmap`.
//!
//! qcuda.ko holds guest pages for a session (its own, mmapped from /dev/qcuda for
//! `cudaHostAlloc`, or user pages it pinned for `cudaHostRegister`) and sends their
//! guest-physical runs with the guest user address they have. Here those runs are mapped from
//! the guest-RAM files (QEMU's memfd), one `mmap` per run, into one contiguous range of this
//! process, and the range is registered with the driver (`cuMemHostRegister`, device-mapped and
//! portable). The GPU then reads and writes the guest's own pages: copies from and to them are
//! the driver's DMA, kernels dereference them, and nothing is staged on either side.
//!
//! Where possible the range lands at the very address the guest process uses, so that with
//! unified addressing the device address equals the guest's pointer:
//!
//! - inside the agreed window (`HOST_WINDOW_BASE`, `HOST_WINDOW_LEN`), which the worker
//!   reserves at start before the driver takes any address space ([`reserve_window`]) and
//!   guest-lib reserves in the guest process, the address is always free;
//! - elsewhere (a `malloc`'d buffer the guest registers), the same address is taken if it is
//!   free here (`MAP_FIXED_NOREPLACE`); otherwise the range goes wherever the kernel puts it and
//!   the guest learns the different device address (`cudaHostGetDevicePointer`).
//!
//! Nothing is ever mapped over memory this process uses: outside the window only
//! `MAP_FIXED_NOREPLACE` or kernel-chosen addresses are used, inside it only ranges of the
//! window's own reservation that no mapping holds. Every run must lie inside one guest-RAM
//! region backed by a file, and the run table must describe exactly the mapping's length.

use std::{
    collections::BTreeMap,
    os::fd::AsRawFd,
    ptr::null_mut,
    sync::atomic::{AtomicBool, Ordering},
};

use qcuda_proto::{HostRun, HOST_PAGE_SIZE, HOST_RUN_SIZE, HOST_WINDOW_BASE, HOST_WINDOW_LEN};
use tracing::{debug, warn};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::guest_buffer::GuestRam;

/// The highest user address plus one on x86-64 with 4-level paging.
const USER_END: u64 = 0x7fff_ffff_f000;
/// Most runs one mapping may have: every run costs this process a VMA, and the kernel allows
/// about 65 000 of them per process by default.
pub(crate) const MAX_RUNS: usize = 32 * 1024;
/// Most runs all mappings of a session may have together.
pub(crate) const MAX_TOTAL_RUNS: usize = 48 * 1024;

/// [`HOST_WINDOW_LEN`] as a size for mmap.
#[expect(
    clippy::cast_possible_truncation,
    reason = "a 1 TiB constant; the assertion below refuses to build where it would not fit"
)]
const WINDOW_SIZE: usize = HOST_WINDOW_LEN as usize;
const _: () = assert!(WINDOW_SIZE as u64 == HOST_WINDOW_LEN);

static WINDOW_RESERVED: AtomicBool = AtomicBool::new(false);

/// Reserves the host-mapping window in this process (idempotent). Call it before the driver is
/// initialised, so that the driver's own reservations (unified addressing) keep out of it.
/// Returns whether the window is reserved.
pub fn reserve_window() -> bool {
    if WINDOW_RESERVED.load(Ordering::Acquire) {
        return true;
    }
    let base = HOST_WINDOW_BASE as *mut libc::c_void;
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; an anonymous PROT_NONE
    // reservation touches no memory.
    let p = unsafe {
        libc::mmap(
            base,
            WINDOW_SIZE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == base {
        WINDOW_RESERVED.store(true, Ordering::Release);
        return true;
    }
    if p != libc::MAP_FAILED {
        // A kernel that ignores MAP_FIXED_NOREPLACE put it elsewhere: not ours to keep.
        // SAFETY: `p` is the mapping just created, used by nothing.
        unsafe { libc::munmap(p, WINDOW_SIZE) };
    }
    // Another thread of this process may have won the race.
    WINDOW_RESERVED.load(Ordering::Acquire)
}

fn window_reserved() -> bool {
    WINDOW_RESERVED.load(Ordering::Acquire)
}

/// Whether `addr..addr + len` lies inside the window.
pub(crate) fn in_window(addr: u64, len: u64) -> bool {
    addr >= HOST_WINDOW_BASE
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= HOST_WINDOW_BASE + HOST_WINDOW_LEN)
}

/// Why a mapping request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapError {
    /// Bad address, length, alignment or run table.
    Invalid,
    /// It overlaps a mapping the session already has.
    Overlap,
    /// Out of address space, VMAs or run budget.
    NoMemory,
    /// Nothing is mapped at that address.
    NotMapped,
}

/// One host mapping of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mapping {
    /// Where it lives in this process.
    pub(crate) local: u64,
    /// Bytes.
    pub(crate) len: u64,
    /// Its device address (from the driver, once registered).
    pub(crate) dev_addr: u64,
    /// The guest device ordinal whose context registered it.
    pub(crate) dev: usize,
    /// Runs it took (VMAs).
    runs: usize,
}

/// Decodes and checks a run table for a mapping of `len` bytes.
pub(crate) fn decode_runs(table: &[u8], len: u64) -> Result<Vec<HostRun>, MapError> {
    if table.is_empty() || !table.len().is_multiple_of(HOST_RUN_SIZE) {
        return Err(MapError::Invalid);
    }
    let n = table.len() / HOST_RUN_SIZE;
    if n > MAX_RUNS {
        return Err(MapError::NoMemory);
    }
    let mut runs = Vec::with_capacity(n);
    let mut total = 0u64;
    for rec in table.chunks_exact(HOST_RUN_SIZE) {
        let r = HostRun::decode(rec).map_err(|_| MapError::Invalid)?;
        if r.len == 0 || r.gpa % HOST_PAGE_SIZE != 0 || r.len % HOST_PAGE_SIZE != 0 {
            return Err(MapError::Invalid);
        }
        r.gpa.checked_add(r.len).ok_or(MapError::Invalid)?;
        total = total.checked_add(r.len).ok_or(MapError::Invalid)?;
        runs.push(r);
    }
    if total != len {
        return Err(MapError::Invalid);
    }
    Ok(runs)
}

/// Checks a guest address range for a mapping.
pub(crate) fn check_range(addr: u64, len: u64) -> Result<(), MapError> {
    if addr == 0
        || len == 0
        || !addr.is_multiple_of(HOST_PAGE_SIZE)
        || !len.is_multiple_of(HOST_PAGE_SIZE)
    {
        return Err(MapError::Invalid);
    }
    match addr.checked_add(len) {
        Some(end) if end <= USER_END => Ok(()),
        _ => Err(MapError::Invalid),
    }
}

/// The session's host mappings, keyed by the guest address they were made for.
///
/// # Invariants
/// Every entry's `local..local + len` is mapped in this process by this table (from guest-RAM
/// files) and by nothing else; no two entries overlap, in guest or in local addresses.
#[derive(Debug, Default)]
pub(crate) struct HostMappings {
    by_guest: BTreeMap<u64, Mapping>,
    /// Each mapping's guest-physical runs, in order (what a saved state records).
    tables: BTreeMap<u64, Vec<HostRun>>,
    runs: usize,
}

/// Address space held for a mapping that a restore makes again at a saved local address,
/// until guest RAM is there to fill it ([`HostMappings::map_held`]). Dropped unused, it is
/// given back.
///
/// # Invariants
/// `local..local + len` is this hold's: the window's own reservation (`windowed`, where no
/// mapping of the session lies, which the caller checks) or a PROT_NONE reservation it made.
#[derive(Debug)]
pub(crate) struct HeldRange {
    local: u64,
    len: u64,
    windowed: bool,
}

impl HeldRange {
    /// Holds `local..local + len` for the mapping of guest range `guest..guest + len`: inside
    /// the window only at the guest's own address (as [`HostMappings::map`] places it), and
    /// elsewhere only if nothing of this process is there ([`MapError::Overlap`]: taken).
    pub(crate) fn hold(guest: u64, local: u64, len: u64) -> Result<Self, MapError> {
        check_range(guest, len)?;
        check_range(local, len)?;
        if window_reserved() && in_window(local, len) {
            if local != guest {
                return Err(MapError::Invalid);
            }
            return Ok(Self {
                local,
                len,
                windowed: true,
            });
        }
        let size = usize::try_from(len).map_err(|_| MapError::Invalid)?;
        let want = local as *mut libc::c_void;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; a PROT_NONE
        // anonymous reservation touches no memory.
        let p = unsafe {
            libc::mmap(
                want,
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == want {
            return Ok(Self {
                local,
                len,
                windowed: false,
            });
        }
        if p != libc::MAP_FAILED {
            // SAFETY: a reservation just made elsewhere, used by nothing.
            unsafe { libc::munmap(p, size) };
        }
        Err(MapError::Overlap)
    }

    /// The local address held.
    pub(crate) fn local(&self) -> u64 {
        self.local
    }

    /// Gives up the hold without releasing the range: its new owner releases it.
    fn into_parts(self) -> (u64, bool) {
        let parts = (self.local, self.windowed);
        std::mem::forget(self);
        parts
    }
}

impl Drop for HeldRange {
    fn drop(&mut self) {
        release(self.local, self.len, self.windowed);
    }
}

/// Where [`HostMappings::map_placed`] puts a mapping.
enum Place {
    /// At the guest's address if it can, else where the kernel chooses.
    Guest,
    /// Where the kernel chooses (managed memory's staging side).
    Elsewhere,
    /// In a range held for it.
    Held(HeldRange),
}

impl HostMappings {
    /// Number of mappings.
    pub(crate) fn len(&self) -> usize {
        self.by_guest.len()
    }

    /// True if `guest..guest + len` overlaps a mapping.
    pub(crate) fn overlaps(&self, guest: u64, len: u64) -> bool {
        let end = guest + len;
        if let Some((&b, m)) = self.by_guest.range(..end).next_back() {
            return b + m.len > guest;
        }
        false
    }

    /// Maps `runs` of `mem` contiguously, at `guest` if possible, and records the result with
    /// `register` run on the local range (which must register it and return the device
    /// address, or fail). Returns the mapping.
    pub(crate) fn map(
        &mut self,
        mem: &GuestRam,
        guest: u64,
        len: u64,
        runs: &[HostRun],
        dev: usize,
        register: impl FnOnce(u64, u64) -> Result<u64, MapError>,
    ) -> Result<Mapping, MapError> {
        self.map_placed(mem, guest, len, runs, dev, Place::Guest, register)
    }

    /// As [`map`](Self::map), but the runs go to an address of the kernel's choosing, never
    /// to `guest`: for managed memory, whose guest address holds device memory in this process
    /// (gpu_state/managed.rs). The mapping still counts as `guest..guest + len` for overlaps
    /// and lookups by guest address.
    pub(crate) fn map_elsewhere(
        &mut self,
        mem: &GuestRam,
        guest: u64,
        len: u64,
        runs: &[HostRun],
        dev: usize,
        register: impl FnOnce(u64, u64) -> Result<u64, MapError>,
    ) -> Result<Mapping, MapError> {
        self.map_placed(mem, guest, len, runs, dev, Place::Elsewhere, register)
    }

    /// As [`map`](Self::map), but in the range `held` (a restore's: the mapping comes back
    /// at the local address it had). Runs are checked against `mem` as for `map`, and the
    /// run budgets are the same. On an error the held range is given back.
    pub(crate) fn map_held(
        &mut self,
        mem: &GuestRam,
        guest: u64,
        runs: &[HostRun],
        dev: usize,
        held: HeldRange,
        register: impl FnOnce(u64, u64) -> Result<u64, MapError>,
    ) -> Result<Mapping, MapError> {
        let len = held.len;
        self.map_placed(mem, guest, len, runs, dev, Place::Held(held), register)
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the public forms above differ only in `place`"
    )]
    fn map_placed(
        &mut self,
        mem: &GuestRam,
        guest: u64,
        len: u64,
        runs: &[HostRun],
        dev: usize,
        place: Place,
        register: impl FnOnce(u64, u64) -> Result<u64, MapError>,
    ) -> Result<Mapping, MapError> {
        check_range(guest, len)?;
        if self.overlaps(guest, len) {
            return Err(MapError::Overlap);
        }
        if runs.len() > MAX_RUNS || self.runs + runs.len() > MAX_TOTAL_RUNS {
            return Err(MapError::NoMemory);
        }
        if runs.iter().try_fold(0u64, |t, r| t.checked_add(r.len)) != Some(len) {
            return Err(MapError::Invalid);
        }
        let (local, windowed) = match place {
            Place::Guest if in_window(guest, len) && window_reserved() => (guest, true),
            Place::Guest => (reserve_anywhere_near(guest, len)?, false),
            Place::Elsewhere => (reserve_anywhere(len)?, false),
            Place::Held(held) => held.into_parts(),
        };
        let mut at = local;
        for r in runs {
            if let Err(e) = map_run(mem, at, r) {
                release(local, len, windowed);
                return Err(e);
            }
            at += r.len;
        }
        let dev_addr = match register(local, len) {
            Ok(d) => d,
            Err(e) => {
                release(local, len, windowed);
                return Err(e);
            }
        };
        let m = Mapping {
            local,
            len,
            dev_addr,
            dev,
            runs: runs.len(),
        };
        self.by_guest.insert(guest, m);
        self.tables.insert(guest, runs.to_vec());
        self.runs += runs.len();
        debug!(
            guest = format_args!("{guest:#x}"),
            local = format_args!("{local:#x}"),
            len,
            runs = runs.len(),
            dev_addr = format_args!("{dev_addr:#x}"),
            "guest memory host-mapped"
        );
        Ok(m)
    }

    /// Removes the mapping made for `guest`: `unregister` runs on it first (while still
    /// mapped), then the range is unmapped (or given back to the window's reservation).
    pub(crate) fn unmap(
        &mut self,
        guest: u64,
        unregister: impl FnOnce(&Mapping),
    ) -> Result<(), MapError> {
        let m = self.by_guest.remove(&guest).ok_or(MapError::NotMapped)?;
        self.tables.remove(&guest);
        unregister(&m);
        self.runs -= m.runs;
        release(
            m.local,
            m.len,
            m.local == guest && in_window(guest, m.len) && window_reserved(),
        );
        Ok(())
    }

    /// The guest-physical runs of the mapping made for `guest`, in order.
    pub(crate) fn runs_of(&self, guest: u64) -> Option<&[HostRun]> {
        self.tables.get(&guest).map(Vec::as_slice)
    }

    /// Runs all mappings hold together (what [`MAX_TOTAL_RUNS`] bounds).
    pub(crate) fn total_runs(&self) -> usize {
        self.runs
    }

    /// The guest addresses of the mappings registered in the context of `dev`.
    pub(crate) fn on_device(&self, dev: usize) -> Vec<u64> {
        self.by_guest
            .iter()
            .filter(|(_, m)| m.dev == dev)
            .map(|(&g, _)| g)
            .collect()
    }

    /// Every mapping: guest address and what it is.
    pub(crate) fn mappings(&self) -> Vec<(u64, Mapping)> {
        self.by_guest.iter().map(|(&g, m)| (g, *m)).collect()
    }

    /// Every guest address with a mapping.
    pub(crate) fn all(&self) -> Vec<u64> {
        self.by_guest.keys().copied().collect()
    }

    /// True if the device range `ptr..ptr + len` lies inside one mapping.
    pub(crate) fn contains_device(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        self.by_guest
            .values()
            .any(|m| ptr >= m.dev_addr && end <= m.dev_addr + m.len)
    }
}

impl Drop for HostMappings {
    fn drop(&mut self) {
        // The driver's registrations go with the contexts (destroyed by the session); the
        // mappings are this table's to remove.
        for g in self.all() {
            let _ = self.unmap(g, |_| {});
        }
    }
}

/// Reserves `len` bytes of address space for a mapping made for guest address `guest`: at
/// that address if it is free here, else wherever the kernel chooses.
fn reserve_anywhere_near(guest: u64, len: u64) -> Result<u64, MapError> {
    let want = guest as *mut libc::c_void;
    let size = usize::try_from(len).map_err(|_| MapError::Invalid)?;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; a PROT_NONE anonymous
    // reservation touches no memory.
    let p = unsafe {
        libc::mmap(
            want,
            size,
            libc::PROT_NONE,
            flags | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == want {
        return Ok(guest);
    }
    if p != libc::MAP_FAILED {
        // SAFETY: `p` is the reservation just made, used by nothing.
        unsafe { libc::munmap(p, size) };
    }
    // SAFETY: as above, at an address of the kernel's choosing.
    let p = unsafe { libc::mmap(null_mut(), size, libc::PROT_NONE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(MapError::NoMemory);
    }
    Ok(p as u64)
}

/// Reserves `len` bytes of address space wherever the kernel chooses.
fn reserve_anywhere(len: u64) -> Result<u64, MapError> {
    let size = usize::try_from(len).map_err(|_| MapError::Invalid)?;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: a PROT_NONE anonymous reservation at an address of the kernel's choosing
    // replaces nothing and touches no memory.
    let p = unsafe { libc::mmap(null_mut(), size, libc::PROT_NONE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(MapError::NoMemory);
    }
    Ok(p as u64)
}

/// Opens a hole of `len` bytes at `guest` in this process's reservation of the window, for the
/// driver to reserve (device memory at the guest's address). False if the range is not inside
/// a reserved window. The caller must know that no mapping of its own lies there.
pub(crate) fn window_open(guest: u64, len: u64) -> bool {
    if !in_window(guest, len) || !window_reserved() || !guest.is_multiple_of(HOST_PAGE_SIZE) {
        return false;
    }
    let Ok(size) = usize::try_from(len) else {
        return false;
    };
    // SAFETY: inside the window this process reserved; the caller holds no mapping there, so
    // only (part of) the PROT_NONE reservation goes.
    unsafe { libc::munmap(guest as *mut libc::c_void, size) == 0 }
}

/// Closes a hole [`window_open`] made (after the driver freed its reservation): the range is
/// reserved PROT_NONE again. Where something else took it meanwhile, it is left alone.
pub(crate) fn window_close(guest: u64, len: u64) {
    let Ok(size) = usize::try_from(len) else {
        return;
    };
    let want = guest as *mut libc::c_void;
    // SAFETY: MAP_FIXED_NOREPLACE replaces nothing; a PROT_NONE reservation touches no memory.
    let p = unsafe {
        libc::mmap(
            want,
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p != want && p != libc::MAP_FAILED {
        // SAFETY: a reservation just made elsewhere, used by nothing.
        unsafe { libc::munmap(p, size) };
    }
}

/// Maps guest-physical run `r` at local address `at`, inside a reservation this table owns.
fn map_run(mem: &GuestRam, at: u64, r: &HostRun) -> Result<(), MapError> {
    let region = mem
        .find_region(GuestAddress(r.gpa))
        .ok_or(MapError::Invalid)?;
    let start = region.start_addr().0;
    let off_in_region = r.gpa - start;
    if off_in_region
        .checked_add(r.len)
        .is_none_or(|end| end > region.len())
    {
        return Err(MapError::Invalid);
    }
    let file = region.file_offset().ok_or(MapError::Invalid)?;
    let offset = file
        .start()
        .checked_add(off_in_region)
        .ok_or(MapError::Invalid)?;
    let offset = libc::off_t::try_from(offset).map_err(|_| MapError::Invalid)?;
    let size = usize::try_from(r.len).map_err(|_| MapError::Invalid)?;
    let want = at as *mut libc::c_void;
    // SAFETY: `at..at + len` lies inside a reservation this table made and no mapping of it
    // holds (type invariant of `HostMappings`), so MAP_FIXED replaces nothing else. The file
    // is guest RAM; the run lies inside its region (checked above), so inside the file.
    let p = unsafe {
        libc::mmap(
            want,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.file().as_raw_fd(),
            offset,
        )
    };
    if p != want {
        warn!(
            gpa = format_args!("{:#x}", r.gpa),
            len = r.len,
            error = %std::io::Error::last_os_error(),
            "cannot map a guest run"
        );
        return Err(MapError::NoMemory);
    }
    Ok(())
}

/// Gives back `local..local + len`: to the window's reservation, or to the kernel.
fn release(local: u64, len: u64, windowed: bool) {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the range was mapped in this process after `check_range` bounded `len` \
                  below USER_END (2^47), so it fits a usize"
    )]
    let size = len as usize;
    let p = local as *mut libc::c_void;
    if windowed {
        // SAFETY: the range is ours (a mapping this table made inside the window); it becomes
        // part of the PROT_NONE reservation again.
        unsafe {
            libc::mmap(
                p,
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
    } else {
        // SAFETY: the range is a reservation or mapping this table made and nothing else uses.
        unsafe { libc::munmap(p, size) };
    }
}

#[cfg(test)]
mod tests {
    use std::{fs::File, os::fd::FromRawFd};

    use vm_memory::{Bytes, FileOffset};

    use super::*;

    fn memfd(len: u64) -> File {
        // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"qcuda-map-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    fn ram() -> GuestRam {
        GuestRam::from_ranges_with_files([(
            GuestAddress(0x10_0000),
            0x40_0000,
            Some(FileOffset::new(memfd(0x40_0000), 0)),
        )])
        .unwrap()
    }

    fn table(runs: &[(u64, u64)]) -> Vec<u8> {
        runs.iter()
            .flat_map(|&(gpa, len)| HostRun { gpa, len }.encode())
            .collect()
    }

    #[test]
    fn run_tables_are_checked() {
        decode_runs(&table(&[(0x1000, 0x2000)]), 0x2000).unwrap();
        for (runs, len) in [
            (vec![(0x1000, 0x2000)], 0x3000),
            (vec![(0x1001, 0x1000)], 0x1000),
            (vec![(0x1000, 0x800)], 0x800),
            (vec![(0x1000, 0)], 0),
            (vec![(u64::MAX - 0xfff, 0x1000)], 0x1000),
            (vec![], 0),
        ] {
            assert!(decode_runs(&table(&runs), len).is_err(), "{runs:x?}");
        }
        assert_eq!(decode_runs(&[0; 17], 0x1000), Err(MapError::Invalid));
        for (addr, len) in [
            (0, 0x1000),
            (0x1000, 0),
            (0x1001, 0x1000),
            (USER_END, 0x1000),
        ] {
            check_range(addr, len).unwrap_err();
        }
    }

    #[test]
    fn runs_are_mapped_in_order_at_the_guest_address_and_removed() {
        assert!(reserve_window());
        let mem = ram();
        mem.write_slice(b"second", GuestAddress(0x30_0000)).unwrap();
        mem.write_slice(b"first", GuestAddress(0x10_1000)).unwrap();
        let mut t = HostMappings::default();
        let guest = HOST_WINDOW_BASE + 0x1234_5000;
        // Two runs out of guest-physical order: the local range follows the table.
        let runs =
            decode_runs(&table(&[(0x10_1000, 0x1000), (0x30_0000, 0x2000)]), 0x3000).unwrap();
        let m = t
            .map(&mem, guest, 0x3000, &runs, 0, |local, len| {
                assert_eq!((local, len), (guest, 0x3000));
                Ok(local)
            })
            .unwrap();
        assert_eq!(m.local, guest);
        // SAFETY: the mapping is live and 0x3000 bytes long.
        let view = unsafe { std::slice::from_raw_parts_mut(guest as *mut u8, 0x3000) };
        assert_eq!(&view[..5], b"first");
        assert_eq!(&view[0x1000..0x1006], b"second");
        // Writes land in guest RAM.
        view[0x2000] = 0x5a;
        let mut b = [0u8; 1];
        mem.read_slice(&mut b, GuestAddress(0x30_1000)).unwrap();
        assert_eq!(b[0], 0x5a);
        assert!(t.contains_device(guest + 0x10, 0x100));
        assert!(!t.contains_device(guest + 0x2f00, 0x200));

        // Overlaps, runs outside guest RAM and failed registrations are refused cleanly.
        assert_eq!(
            t.map(&mem, guest + 0x1000, 0x1000, &runs[..1], 0, |l, _| Ok(l)),
            Err(MapError::Overlap)
        );
        let outside = decode_runs(&table(&[(0x50_0000, 0x1000)]), 0x1000).unwrap();
        assert_eq!(
            t.map(&mem, guest + 0x10_0000, 0x1000, &outside, 0, |l, _| Ok(l)),
            Err(MapError::Invalid)
        );
        let crossing = decode_runs(&table(&[(0x4f_f000, 0x2000)]), 0x2000).unwrap();
        assert_eq!(
            t.map(&mem, guest + 0x10_0000, 0x2000, &crossing, 0, |l, _| Ok(l)),
            Err(MapError::Invalid)
        );
        assert_eq!(
            t.map(&mem, guest + 0x10_0000, 0x1000, &runs[..1], 0, |_, _| Err(
                MapError::NoMemory
            )),
            Err(MapError::NoMemory)
        );
        assert_eq!(t.len(), 1);

        let mut seen = None;
        t.unmap(guest, |m| seen = Some(m.local)).unwrap();
        assert_eq!(seen, Some(guest));
        assert_eq!(t.unmap(guest, |_| {}), Err(MapError::NotMapped));
        // The window's reservation is back: the same range can be mapped again.
        t.map(&mem, guest, 0x3000, &runs, 1, |l, _| Ok(l)).unwrap();
        assert_eq!(t.on_device(1), vec![guest]);
    }

    #[test]
    fn outside_the_window_a_taken_address_gives_another_local_range() {
        let mem = ram();
        mem.write_slice(b"abc", GuestAddress(0x20_0000)).unwrap();
        let runs = decode_runs(&table(&[(0x20_0000, 0x1000)]), 0x1000).unwrap();
        // An address this process already uses (this test's own stack page).
        let x = 0u64;
        let taken = (&raw const x as u64) & !(HOST_PAGE_SIZE - 1);
        let mut t = HostMappings::default();
        let m = t.map(&mem, taken, 0x1000, &runs, 0, |l, _| Ok(l)).unwrap();
        assert_ne!(m.local, taken);
        // SAFETY: the mapping is live and one page long.
        let view = unsafe { std::slice::from_raw_parts(m.local as *const u8, 3) };
        assert_eq!(view, b"abc");
        assert_eq!(x, 0);
        t.unmap(taken, |_| {}).unwrap();
    }
}

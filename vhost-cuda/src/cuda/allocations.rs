//! The device memory one session may touch on one device.
//!
//! Device pointers cross the wire as real `CUdeviceptr` values, because kernels dereference
//! them. Every pointer the guest hands to a host-side copy, memset or free is therefore checked
//! here first: a range must lie inside one region this session owns on that device, either an
//! allocation of its own (`Malloc`, or `MallocAsync` from a memory pool) or a module global it
//! looked up (`ModuleGetGlobal`).
//! Nothing here calls the driver.

use std::{collections::BTreeMap, sync::Arc};

use crate::limits::QuotaSlot;

/// Most regions one session may hold on one device. Device memory bounds the count in
/// practice; this only keeps a hostile guest from growing the host-side table without limit.
pub(crate) const MAX_REGIONS: usize = 1 << 20;

/// What a region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegionKind {
    /// A `Malloc` allocation; `Free` releases it.
    Allocation,
    /// A stream-ordered allocation from a memory pool (`MallocAsync`); `FreeAsync` or `Free`
    /// releases it. Pool memory outlives a context, so a device reset frees these first.
    StreamOrdered,
    /// A global of the module with this session handle; unloading the module removes it.
    Global { module: u64 },
    /// The allocation of a memory allocation node of the graph with this session handle (its
    /// address is fixed for the graph's lifetime); destroying the graph removes it.
    GraphMemory { graph: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    size: u64,
    kind: RegionKind,
}

/// Why a region could not be added or removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableError {
    /// The region is empty, or its end overflows the address space.
    BadRange,
    /// The region overlaps one already in the table.
    Overlap,
    /// The table holds [`MAX_REGIONS`] regions.
    Full,
    /// The pointer is not the base of an allocation.
    NotAnAllocation,
    /// The allocation would take the VM past `--max-gpu-memory`.
    OverQuota,
}

/// The regions of one session on one device, keyed by base address.
///
/// # Invariants
/// Regions are non-empty, their ends do not overflow, and no two overlap.
#[derive(Debug, Default)]
pub(crate) struct AllocationTable {
    regions: BTreeMap<u64, Region>,
    /// The VM's device-memory quota, which counts every allocation of this table.
    quota: Option<Arc<QuotaSlot>>,
    /// Bytes of the table's allocations (what it holds of the quota).
    allocated: u64,
}

impl Drop for AllocationTable {
    /// The context (and with it every allocation) is gone: so is their share of the quota.
    fn drop(&mut self) {
        if let Some(q) = &self.quota {
            q.release(self.allocated);
        }
    }
}

impl AllocationTable {
    /// An empty table whose allocations count against `quota`.
    pub(crate) fn with_quota(quota: Option<Arc<QuotaSlot>>) -> Self {
        Self {
            regions: BTreeMap::new(),
            quota,
            allocated: 0,
        }
    }

    /// True if `size` more bytes fit the quota now (checked again, for real, on insert).
    pub(crate) fn quota_allows(&self, size: u64) -> bool {
        self.quota.as_ref().is_none_or(|q| q.fits(size))
    }

    /// True if one more region fits.
    pub(crate) fn has_room(&self) -> bool {
        self.regions.len() < MAX_REGIONS
    }

    /// Number of regions.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.regions.len()
    }

    fn insert(&mut self, base: u64, size: u64, kind: RegionKind) -> Result<(), TableError> {
        let end = base
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or(TableError::BadRange)?;
        if let Some((&b, r)) = self.regions.range(..=base).next_back() {
            let same = b == base && r.size == size && r.kind == kind;
            if same && matches!(kind, RegionKind::Global { .. }) {
                // Looking up the same global twice registers it once.
                return Ok(());
            }
            if b + r.size > base {
                return Err(TableError::Overlap);
            }
        }
        if let Some((&b, _)) = self.regions.range(base..).next() {
            if b < end {
                return Err(TableError::Overlap);
            }
        }
        if !self.has_room() {
            return Err(TableError::Full);
        }
        // Device memory the session allocated counts against the VM's quota, whichever way it
        // was allocated (what `remove_allocation` gives back).
        if matches!(kind, RegionKind::Allocation | RegionKind::StreamOrdered) {
            if let Some(q) = &self.quota {
                if !q.reserve(size) {
                    return Err(TableError::OverQuota);
                }
            }
            self.allocated += size;
        }
        self.regions.insert(base, Region { size, kind });
        Ok(())
    }

    /// Adds an allocation of `size` bytes at `base`.
    pub(crate) fn insert_allocation(&mut self, base: u64, size: u64) -> Result<(), TableError> {
        self.insert(base, size, RegionKind::Allocation)
    }

    /// Adds the global `[base, base + size)` of module `module` (idempotent).
    pub(crate) fn insert_global(
        &mut self,
        base: u64,
        size: u64,
        module: u64,
    ) -> Result<(), TableError> {
        self.insert(base, size, RegionKind::Global { module })
    }

    /// Adds a stream-ordered allocation of `size` bytes at `base`.
    pub(crate) fn insert_stream_ordered(&mut self, base: u64, size: u64) -> Result<(), TableError> {
        self.insert(base, size, RegionKind::StreamOrdered)
    }

    /// Adds the allocation `[base, base + size)` of a memory allocation node of `graph`. The
    /// driver reuses the addresses of graph allocations freed before (by a free node of the
    /// same graph, or of a graph since destroyed): graph-memory regions it overlaps are merged
    /// with it. Overlapping any other memory is an error.
    pub(crate) fn insert_graph_memory(
        &mut self,
        base: u64,
        size: u64,
        graph: u64,
    ) -> Result<(), TableError> {
        let kind = RegionKind::GraphMemory { graph };
        let end = base
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or(TableError::BadRange)?;
        let overlapping: Vec<(u64, u64, RegionKind)> = self
            .regions
            .range(..end)
            .rev()
            .take_while(|(&b, r)| b + r.size > base || b >= base)
            .filter(|(&b, r)| b < end && b + r.size > base)
            .map(|(&b, r)| (b, r.size, r.kind))
            .collect();
        if overlapping
            .iter()
            .any(|&(_, _, k)| !matches!(k, RegionKind::GraphMemory { .. }))
        {
            return Err(TableError::Overlap);
        }
        let (mut lo, mut hi) = (base, end);
        for &(b, s, _) in &overlapping {
            lo = lo.min(b);
            hi = hi.max(b + s);
            self.regions.remove(&b);
        }
        self.insert(lo, hi - lo, kind)
    }

    /// True if `base` is the start of a graph's allocation (what a free node accepts).
    pub(crate) fn is_graph_memory(&self, base: u64) -> bool {
        // Inside a region, not only at its start: a graph's regions merge when the driver
        // reuses addresses (see `insert_graph_memory`).
        self.regions
            .range(..=base)
            .next_back()
            .is_some_and(|(&b, r)| {
                matches!(r.kind, RegionKind::GraphMemory { .. }) && base < b + r.size
            })
    }

    /// True if `base` is the start of an allocation of either kind (what `Free` and
    /// `FreeAsync` accept).
    pub(crate) fn is_allocation(&self, base: u64) -> bool {
        matches!(
            self.regions.get(&base),
            Some(Region {
                kind: RegionKind::Allocation | RegionKind::StreamOrdered,
                ..
            })
        )
    }

    /// The bases of the stream-ordered allocations.
    pub(crate) fn stream_ordered(&self) -> Vec<u64> {
        self.regions
            .iter()
            .filter(|(_, r)| r.kind == RegionKind::StreamOrdered)
            .map(|(&b, _)| b)
            .collect()
    }

    /// The `Malloc` allocation (not a stream-ordered one, graph memory or a global) holding
    /// `ptr`: its base and size.
    pub(crate) fn allocation_at(&self, ptr: u64) -> Option<(u64, u64)> {
        let (&b, r) = self.regions.range(..=ptr).next_back()?;
        (r.kind == RegionKind::Allocation && ptr < b + r.size).then_some((b, r.size))
    }

    /// The `Malloc` allocations (not stream-ordered ones): base and size, lowest first.
    pub(crate) fn allocations(&self) -> Vec<(u64, u64)> {
        self.regions
            .iter()
            .filter(|(_, r)| r.kind == RegionKind::Allocation)
            .map(|(&b, r)| (b, r.size))
            .collect()
    }

    /// True if the table holds graph memory.
    pub(crate) fn has_graph_memory(&self) -> bool {
        self.regions
            .values()
            .any(|r| matches!(r.kind, RegionKind::GraphMemory { .. }))
    }

    /// Removes the allocation starting at `base`; returns its size.
    pub(crate) fn remove_allocation(&mut self, base: u64) -> Result<u64, TableError> {
        if !self.is_allocation(base) {
            return Err(TableError::NotAnAllocation);
        }
        let size = self
            .regions
            .remove(&base)
            .map(|r| r.size)
            .ok_or(TableError::NotAnAllocation)?;
        self.allocated -= size;
        if let Some(q) = &self.quota {
            q.release(size);
        }
        Ok(size)
    }

    /// Removes every global of module `module`.
    pub(crate) fn remove_module(&mut self, module: u64) {
        self.regions
            .retain(|_, r| r.kind != RegionKind::Global { module });
    }

    /// True if `[ptr, ptr + len)` lies inside one region. An empty range is inside a region
    /// if `ptr` is (callers skip empty copies before asking).
    pub(crate) fn contains(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        match self.regions.range(..=ptr).next_back() {
            // b + size cannot overflow (invariant).
            Some((&b, r)) => ptr < b + r.size && end <= b + r.size,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_must_lie_inside_one_region() {
        let mut t = AllocationTable::default();
        t.insert_allocation(0x1000, 0x100).unwrap();
        t.insert_allocation(0x1100, 0x100).unwrap();
        assert!(t.contains(0x1000, 0x100));
        assert!(t.contains(0x10ff, 1));
        assert!(t.contains(0x1100, 0x100));
        assert!(t.contains(0x1080, 0));
        // Spans two adjacent allocations.
        assert!(!t.contains(0x10f0, 0x20));
        // Past the end, before the start, and unknown.
        assert!(!t.contains(0x1100, 0x101));
        assert!(!t.contains(0xfff, 2));
        assert!(!t.contains(0x1200, 1));
        assert!(!t.contains(0x1200, 0));
        assert!(!t.contains(0, 0));
        // Overflowing ends.
        assert!(!t.contains(0x1000, u64::MAX));
        assert!(!t.contains(u64::MAX, 2));
    }

    #[test]
    fn overlaps_and_bad_ranges_are_refused() {
        let mut t = AllocationTable::default();
        t.insert_allocation(0x1000, 0x100).unwrap();
        assert_eq!(t.insert_allocation(0x1000, 0x10), Err(TableError::Overlap));
        assert_eq!(t.insert_allocation(0x1000, 0x100), Err(TableError::Overlap));
        assert_eq!(t.insert_allocation(0x10ff, 0x10), Err(TableError::Overlap));
        assert_eq!(t.insert_allocation(0xff0, 0x11), Err(TableError::Overlap));
        assert_eq!(t.insert_allocation(0xf00, 0x1000), Err(TableError::Overlap));
        assert_eq!(t.insert_allocation(0x2000, 0), Err(TableError::BadRange));
        assert_eq!(
            t.insert_allocation(u64::MAX - 1, 4),
            Err(TableError::BadRange)
        );
        t.insert_allocation(0xf00, 0x100).unwrap();
        t.insert_allocation(0x1100, 1).unwrap();
        // The very top of the address space is fine as long as the end does not overflow.
        t.insert_allocation(u64::MAX - 4, 4).unwrap();
        assert!(t.contains(u64::MAX - 4, 4));
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn free_accepts_only_allocation_bases() {
        let mut t = AllocationTable::default();
        t.insert_allocation(0x1000, 0x100).unwrap();
        t.insert_global(0x5000, 0x40, 7).unwrap();
        assert_eq!(
            t.remove_allocation(0x1001),
            Err(TableError::NotAnAllocation)
        );
        assert_eq!(
            t.remove_allocation(0x5000),
            Err(TableError::NotAnAllocation)
        );
        assert_eq!(
            t.remove_allocation(0x9000),
            Err(TableError::NotAnAllocation)
        );
        assert_eq!(t.remove_allocation(0x1000), Ok(0x100));
        assert_eq!(
            t.remove_allocation(0x1000),
            Err(TableError::NotAnAllocation)
        );
        assert!(!t.contains(0x1000, 1));
    }

    #[test]
    fn allocations_count_against_the_quota_until_freed_or_dropped() {
        use crate::limits::GpuMemoryQuota;
        use std::os::fd::FromRawFd;

        let q = GpuMemoryQuota::new(0x300, 2).unwrap();
        let lease = q.lease().unwrap();
        // SAFETY: dup of an open descriptor returns a new one we own.
        let file = unsafe { std::fs::File::from_raw_fd(libc::dup(lease.fd())) };
        let slot = Arc::new(QuotaSlot::attach(file, lease.index()).unwrap());
        let mut t = AllocationTable::with_quota(Some(slot.clone()));
        t.insert_allocation(0x1000, 0x200).unwrap();
        // Globals are module memory, not allocations: they do not count.
        t.insert_global(0x9000, 0x1000, 1).unwrap();
        assert!(!t.quota_allows(0x101));
        assert_eq!(
            t.insert_allocation(0x2000, 0x101),
            Err(TableError::OverQuota)
        );
        assert!(!t.contains(0x2000, 1));
        t.insert_allocation(0x2000, 0x100).unwrap();
        assert_eq!(q.used(), 0x300);
        t.remove_allocation(0x1000).unwrap();
        assert_eq!(q.used(), 0x100);
        let mut other = AllocationTable::with_quota(Some(slot));
        other.insert_allocation(0x1000, 0x200).unwrap();
        drop(t);
        assert_eq!(q.used(), 0x200);
        drop(other);
        assert_eq!(q.used(), 0);
    }

    #[test]
    fn globals_are_valid_ranges_until_their_module_goes() {
        let mut t = AllocationTable::default();
        t.insert_global(0x5000, 0x40, 7).unwrap();
        t.insert_global(0x5000, 0x40, 7).unwrap();
        t.insert_global(0x6000, 0x10, 8).unwrap();
        assert_eq!(t.insert_global(0x5000, 0x40, 8), Err(TableError::Overlap));
        assert!(t.contains(0x5000, 0x40));
        assert!(!t.contains(0x5000, 0x41));
        t.insert_allocation(0x1000, 8).unwrap();
        assert!(t.is_allocation(0x1000) && !t.is_allocation(0x5000));
        t.remove_module(7);
        assert!(!t.contains(0x5000, 1));
        assert!(t.contains(0x6000, 0x10));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn stream_ordered_allocations_are_allocations_listed_apart() {
        let mut t = AllocationTable::default();
        t.insert_allocation(0x1000, 0x100).unwrap();
        t.insert_stream_ordered(0x2000, 0x100).unwrap();
        assert_eq!(
            t.insert_stream_ordered(0x1080, 0x10),
            Err(TableError::Overlap)
        );
        assert!(t.is_allocation(0x2000) && t.contains(0x2010, 0x10));
        assert_eq!(t.stream_ordered(), vec![0x2000]);
        assert_eq!(t.remove_allocation(0x2000), Ok(0x100));
        assert!(t.stream_ordered().is_empty());
    }

    #[test]
    fn a_graph_reusing_its_own_freed_addresses_merges_and_nothing_else_may_overlap() {
        let mut t = AllocationTable::default();
        t.insert_graph_memory(0x10_0000, 0x1000, 7).unwrap();
        // Another node of graph 7 at an address its earlier allocation had (reuse): merged.
        t.insert_graph_memory(0x10_0800, 0x1000, 7).unwrap();
        assert!(t.contains(0x10_0000, 0x1800));
        assert!(t.is_graph_memory(0x10_0000) && t.is_graph_memory(0x10_0800));
        assert!(!t.is_graph_memory(0x10_1800));
        // Another graph reusing those addresses merges too; an allocation must not overlap.
        t.insert_graph_memory(0x10_1000, 0x1000, 8).unwrap();
        assert!(t.contains(0x10_0000, 0x2000));
        t.insert_allocation(0x20_0000, 0x100).unwrap();
        assert_eq!(
            t.insert_graph_memory(0x1f_ff80, 0x100, 7),
            Err(TableError::Overlap)
        );
        assert!(t.is_graph_memory(0x10_1fff));
    }
}

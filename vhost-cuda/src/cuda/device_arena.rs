//! A session's device address range on one GPU: reserved at a fixed numeric address, mapped on
//! demand, and carved into the guest's allocations.
//!
//! Guest programs store device pointers in device memory (linked lists, trees, cuBLAS
//! handles), so a restore into a fresh worker must give every allocation its old numeric
//! address. The driver's own allocator (`cuMemAlloc`) picks addresses itself; this one does not:
//! the worker reserves `size` bytes of device address space at `base`
//! (`cuMemAddressReserve` with that address as the hint, and checked), and every `Malloc`
//! becomes a block of that range with physical memory mapped under it (`cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`). A restore reserves the same range again and maps each saved
//! block back at its address.
//!
//! Physical memory comes in granules (2 MiB on current GPUs). Small requests (at most
//! [`SMALL_MAX`]) are rounded up to a power of two of at least 256 bytes (cudaMalloc's
//! alignment) and taken from a free list per size class, which a fresh granule refills; their
//! granules stay mapped for the next allocation of the class. Larger requests are rounded up to
//! the granularity and get physical memory of their own, at virtual space taken from the
//! lowest free extent; freed, they stay mapped in a small cache of recently freed sizes (up to
//! [`LARGE_CACHE_BYTES`]) so that a program that frees and allocates the same buffer in a loop
//! does not pay the driver each time. So a warm `Malloc` or `Free` calls no driver function.
//!
//! The arena knows nothing about the driver: its caller passes a [`Backing`] that maps and
//! unmaps physical memory (`gpu_state/memory.rs` over the driver's VMM calls; a test double in
//! the tests below). The allocation table (`allocations.rs`) still records what the guest may
//! touch: the requested bytes, not the rounded block.

use std::collections::{BTreeMap, HashMap};

/// Largest request served from the size classes.
pub(crate) const SMALL_MAX: u64 = 1 << 20;
/// Smallest block (and the alignment of every block), as cudaMalloc guarantees.
const MIN_BLOCK_SHIFT: u32 = 8;
/// Size classes: 256 B .. 1 MiB.
const CLASSES: usize = (SMALL_MAX.trailing_zeros() - MIN_BLOCK_SHIFT + 1) as usize;
/// Most bytes of freed large blocks kept mapped for reuse.
pub(crate) const LARGE_CACHE_BYTES: u64 = 256 << 20;

/// Default `--gpu-va-base`: where the sessions' ranges start. Far from what Linux gives a
/// process's own mappings (they grow down from about 0x7fxx_xxxx_xxxx, the executable sits near
/// 0x55xx_xxxx_xxxx) and from the host-mapping window (`qcuda_proto::HOST_WINDOW_BASE`, at
/// 32 TiB), so a fresh worker finds it free.
pub const DEFAULT_VA_BASE: u64 = 0x6800_0000_0000;
/// Default `--gpu-va-size`: the range of one session on one GPU (more than any GPU's memory).
pub const DEFAULT_VA_SIZE: u64 = 256 << 30;
/// End of the space the sessions' ranges may use.
pub const VA_END: u64 = 0x7800_0000_0000;
/// The alignment of a base and a size: the largest granularity of current GPUs.
pub const VA_ALIGN: u64 = 2 << 20;

/// Where a worker reserves its session's ranges (`--gpu-va-base`, `--gpu-va-size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressSpace {
    /// Start of the sessions' space; 0: no reserved ranges (allocations come from
    /// `cuMemAlloc`, at addresses the driver picks, and cannot be restored in place).
    pub base: u64,
    /// Bytes of one session's range on one GPU.
    pub per_device: u64,
}

impl Default for AddressSpace {
    fn default() -> Self {
        Self {
            base: DEFAULT_VA_BASE,
            per_device: DEFAULT_VA_SIZE,
        }
    }
}

impl AddressSpace {
    /// No reserved ranges.
    pub const OFF: Self = Self {
        base: 0,
        per_device: 0,
    };

    /// Checks a configuration: base and size aligned to [`VA_ALIGN`], and one session's ranges
    /// on `gpus` GPUs inside `[base, VA_END)`.
    pub fn check(self, gpus: u32) -> Result<Self, String> {
        if self.base == 0 {
            return Ok(Self::OFF);
        }
        let span = self.per_device.checked_mul(u64::from(gpus.max(1)));
        if !self.base.is_multiple_of(VA_ALIGN)
            || self.per_device == 0
            || !self.per_device.is_multiple_of(VA_ALIGN)
        {
            return Err(format!(
                "--gpu-va-base {:#x} and --gpu-va-size {} must be non-zero multiples of {VA_ALIGN}",
                self.base, self.per_device
            ));
        }
        match span.and_then(|s| self.base.checked_add(s)) {
            Some(end) if end <= VA_END => Ok(self),
            _ => Err(format!(
                "--gpu-va-base {:#x} + {gpus} GPU(s) x --gpu-va-size {} passes {VA_END:#x}",
                self.base, self.per_device
            )),
        }
    }

    /// The base of session `session`'s range on guest device `dev` of `gpus`, if ranges are
    /// on. Sessions take slots of `per_device * gpus` bytes in turn (by id, which the guest
    /// numbers consecutively), so sessions opened close together get disjoint ranges; each
    /// worker is a process of its own, so two sessions that do share a slot still never share
    /// an address space.
    pub fn session_base(self, session: u64, dev: usize, gpus: usize) -> Option<u64> {
        if self.base == 0 || self.per_device == 0 || dev >= gpus {
            return None;
        }
        let span = self.per_device.checked_mul(gpus as u64)?;
        let slots = (VA_END.checked_sub(self.base)? / span).max(1);
        let slot = self
            .base
            .checked_add((session % slots).checked_mul(span)?)?;
        let base = slot.checked_add(self.per_device.checked_mul(dev as u64)?)?;
        (base.checked_add(self.per_device)? <= VA_END).then_some(base)
    }
}

/// Maps and unmaps physical memory under an arena's range.
pub(crate) trait Backing {
    /// What it needs to unmap a granule run again (the driver's allocation handle).
    type Handle: Copy + std::fmt::Debug;
    /// Maps `len` bytes of fresh physical memory at `va` (both granule-aligned), readable and
    /// writable by the arena's devices. Fails with the driver's error, mapping nothing.
    fn map(&self, va: u64, len: u64) -> Result<Self::Handle, ArenaError>;
    /// Unmaps what [`map`](Backing::map) mapped at `va` and frees its physical memory.
    fn unmap(&self, va: u64, len: u64, handle: Self::Handle);
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArenaError {
    /// The reserved range has no free extent large enough (CUDA_ERROR_OUT_OF_MEMORY).
    RangeFull,
    /// The driver refused to map memory (its `CUresult`).
    Driver(u32),
    /// Zero bytes, or a size past the range.
    BadSize,
    /// `free` of an address that is not a block of this arena.
    NotABlock,
    /// Saved runs or blocks that this arena cannot have made (outside the range, overlapping,
    /// misaligned, of an unknown class): a hostile or corrupted saved state.
    BadSnapshot,
}

/// A mapped run as a saved state holds it: address, length, and the size class its blocks
/// have (`None`: one large block).
pub(crate) type SavedRun = (u64, u64, Option<u8>);

/// How a live block was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    /// Of size class `class` (its size is `256 << class`).
    Small { class: u8 },
    /// Of its own granule run, `len` bytes.
    Large { len: u64 },
}

/// One session's range on one device. See the module documentation.
///
/// # Invariants
/// Every live block, free small block and cached large block lies in a mapped run; mapped runs
/// and free extents are disjoint and inside `[base, base + size)`; `top` is the offset below
/// which all virtual space has been handed out once (above it, nothing is mapped).
#[derive(Debug)]
pub(crate) struct DeviceArena<H> {
    base: u64,
    size: u64,
    granularity: u64,
    /// Offset of the first byte never used.
    top: u64,
    /// Unmapped virtual space below `top`: address -> length (coalesced).
    free_extents: BTreeMap<u64, u64>,
    /// Free blocks of each size class.
    classes: [Vec<u64>; CLASSES],
    /// Freed large blocks still mapped: length -> addresses.
    cached: HashMap<u64, Vec<u64>>,
    cached_bytes: u64,
    /// Live blocks by address.
    live: HashMap<u64, Block>,
    /// Mapped runs: address -> (length, handle, size class or `None` for a large block).
    mapped: BTreeMap<u64, (u64, H, Option<u8>)>,
}

impl<H: Copy + std::fmt::Debug> DeviceArena<H> {
    /// An empty arena over the reserved range `[base, base + size)`, mapped in runs of
    /// `granularity` bytes (a power of two; base and size multiples of it).
    pub(crate) fn new(base: u64, size: u64, granularity: u64) -> Option<Self> {
        let ok = granularity.is_power_of_two()
            && granularity >= SMALL_MAX
            && base.is_multiple_of(granularity)
            && size.is_multiple_of(granularity)
            && size > 0
            && base.checked_add(size).is_some();
        ok.then(|| Self {
            base,
            size,
            granularity,
            top: 0,
            free_extents: BTreeMap::new(),
            classes: Default::default(),
            cached: HashMap::new(),
            cached_bytes: 0,
            live: HashMap::new(),
            mapped: BTreeMap::new(),
        })
    }

    /// The reserved range: base and length.
    pub(crate) fn range(&self) -> (u64, u64) {
        (self.base, self.size)
    }

    /// The bytes of one run of physical memory: every large block's address and length are
    /// multiples of it.
    pub(crate) fn granularity(&self) -> u64 {
        self.granularity
    }

    /// True if `ptr..ptr + len` lies inside the reserved range.
    pub(crate) fn covers(&self, ptr: u64, len: u64) -> bool {
        ptr >= self.base
            && ptr
                .checked_add(len)
                .is_some_and(|e| e <= self.base + self.size)
    }

    /// True if `ptr` is the address of a live block.
    pub(crate) fn holds(&self, ptr: u64) -> bool {
        self.live.contains_key(&ptr)
    }

    /// Bytes of physical memory mapped now.
    #[cfg(test)]
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped.values().map(|(len, ..)| len).sum()
    }

    /// The size class of a small request.
    fn class_of(size: u64) -> u8 {
        let shift = size
            .next_power_of_two()
            .trailing_zeros()
            .max(MIN_BLOCK_SHIFT);
        // At most SMALL_MAX's shift - 8 < CLASSES.
        u8::try_from(shift - MIN_BLOCK_SHIFT).unwrap_or(u8::MAX)
    }

    /// A block of at least `size` bytes.
    pub(crate) fn alloc(
        &mut self,
        size: u64,
        backing: &impl Backing<Handle = H>,
    ) -> Result<u64, ArenaError> {
        if size == 0 || size > self.size {
            return Err(ArenaError::BadSize);
        }
        if size <= SMALL_MAX {
            let class = Self::class_of(size);
            let list = usize::from(class);
            if self.classes[list].is_empty() {
                self.refill(class, backing)?;
            }
            let ptr = self.classes[list].pop().ok_or(ArenaError::RangeFull)?;
            self.live.insert(ptr, Block::Small { class });
            return Ok(ptr);
        }
        let len = size.div_ceil(self.granularity) * self.granularity;
        if let Some(ptr) = self.cached.get_mut(&len).and_then(Vec::pop) {
            self.cached_bytes -= len;
            self.live.insert(ptr, Block::Large { len });
            return Ok(ptr);
        }
        let ptr = self.map_run(len, None, backing)?;
        self.live.insert(ptr, Block::Large { len });
        Ok(ptr)
    }

    /// Frees the block at `ptr`. The caller has waited for the device work that may use it
    /// (as cudaFree does), so it may be handed out again at once.
    pub(crate) fn free(
        &mut self,
        ptr: u64,
        backing: &impl Backing<Handle = H>,
    ) -> Result<(), ArenaError> {
        match self.live.remove(&ptr).ok_or(ArenaError::NotABlock)? {
            Block::Small { class } => self.classes[usize::from(class)].push(ptr),
            Block::Large { len } => {
                self.cached.entry(len).or_default().push(ptr);
                self.cached_bytes += len;
                if self.cached_bytes > LARGE_CACHE_BYTES {
                    self.trim_cache(backing);
                }
            }
        }
        Ok(())
    }

    /// Maps a fresh granule for size class `class` and splits it into free blocks.
    fn refill(&mut self, class: u8, backing: &impl Backing<Handle = H>) -> Result<(), ArenaError> {
        let run = self.map_run(self.granularity, Some(class), backing)?;
        let block = 1u64 << (u32::from(class) + MIN_BLOCK_SHIFT);
        let list = &mut self.classes[usize::from(class)];
        // Lowest address last, so it is handed out first.
        list.extend((0..self.granularity / block).rev().map(|i| run + i * block));
        Ok(())
    }

    /// Virtual space of `len` bytes (a multiple of the granularity) with physical memory mapped
    /// under it. When the range or the driver has no room, the cache of freed large blocks is
    /// given back first and the mapping tried once more.
    fn map_run(
        &mut self,
        len: u64,
        class: Option<u8>,
        backing: &impl Backing<Handle = H>,
    ) -> Result<u64, ArenaError> {
        let va = match self.take_space(len) {
            Err(ArenaError::RangeFull) if self.cached_bytes > 0 => {
                self.trim_all(backing);
                self.take_space(len)?
            }
            other => other?,
        };
        let handle = match backing.map(va, len) {
            Ok(h) => h,
            Err(ArenaError::Driver(_)) if self.cached_bytes > 0 => {
                self.trim_all(backing);
                backing
                    .map(va, len)
                    .inspect_err(|_| self.give_space(va, len))?
            }
            Err(e) => {
                self.give_space(va, len);
                return Err(e);
            }
        };
        self.mapped.insert(va, (len, handle, class));
        Ok(va)
    }

    /// Unmaps cached large blocks until the cache is within its bound.
    fn trim_cache(&mut self, backing: &impl Backing<Handle = H>) {
        let lens: Vec<u64> = self.cached.keys().copied().collect();
        for len in lens {
            while self.cached_bytes > LARGE_CACHE_BYTES {
                let Some(ptr) = self.cached.get_mut(&len).and_then(Vec::pop) else {
                    break;
                };
                self.cached_bytes -= len;
                self.unmap_run(ptr, backing);
            }
        }
        self.cached.retain(|_, v| !v.is_empty());
    }

    /// Unmaps every cached large block.
    pub(crate) fn trim_all(&mut self, backing: &impl Backing<Handle = H>) {
        for (_, ptrs) in std::mem::take(&mut self.cached) {
            for ptr in ptrs {
                self.unmap_run(ptr, backing);
            }
        }
        self.cached_bytes = 0;
    }

    fn unmap_run(&mut self, va: u64, backing: &impl Backing<Handle = H>) {
        if let Some((len, handle, _)) = self.mapped.remove(&va) {
            backing.unmap(va, len, handle);
            self.give_space(va, len);
        }
    }

    /// Takes `len` bytes of unmapped virtual space: the lowest free extent that fits, else the
    /// untouched space above `top`.
    fn take_space(&mut self, len: u64) -> Result<u64, ArenaError> {
        let fit = self
            .free_extents
            .iter()
            .find(|(_, &l)| l >= len)
            .map(|(&a, &l)| (a, l));
        if let Some((a, l)) = fit {
            self.free_extents.remove(&a);
            if l > len {
                self.free_extents.insert(a + len, l - len);
            }
            return Ok(a);
        }
        if self.size - self.top < len {
            return Err(ArenaError::RangeFull);
        }
        let a = self.base + self.top;
        self.top += len;
        Ok(a)
    }

    /// Gives unmapped virtual space back, merging it with its neighbours (and with the untouched
    /// space above `top`).
    fn give_space(&mut self, va: u64, len: u64) {
        let (mut a, mut l) = (va, len);
        if let Some((&pa, &pl)) = self.free_extents.range(..a).next_back() {
            if pa + pl == a {
                self.free_extents.remove(&pa);
                a = pa;
                l += pl;
            }
        }
        if let Some(nl) = self.free_extents.remove(&(a + l)) {
            l += nl;
        }
        if a + l == self.base + self.top {
            self.top = a - self.base;
        } else {
            self.free_extents.insert(a, l);
        }
    }

    /// Unmaps everything (the session ends, or its memory moved to the host for a pause).
    pub(crate) fn release_all(&mut self, backing: &impl Backing<Handle = H>) {
        for (va, (len, handle, _)) in std::mem::take(&mut self.mapped) {
            backing.unmap(va, len, handle);
        }
        self.free_extents.clear();
        self.classes = Default::default();
        self.cached.clear();
        self.cached_bytes = 0;
        self.live.clear();
        self.top = 0;
    }

    /// The mapped runs: (address, length), lowest first.
    pub(crate) fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.mapped.iter().map(|(&va, &(len, ..))| (va, len))
    }

    /// The mapped run (one physical allocation) holding `ptr`: its address and length.
    pub(crate) fn run_at(&self, ptr: u64) -> Option<(u64, u64)> {
        let (&va, &(len, ..)) = self.mapped.range(..=ptr).next_back()?;
        (ptr < va + len).then_some((va, len))
    }

    /// The length of the live block at `ptr`.
    pub(crate) fn block_len(&self, ptr: u64) -> Option<u64> {
        self.live.get(&ptr).map(|b| match *b {
            Block::Small { class } => 1u64 << (u32::from(class) + MIN_BLOCK_SHIFT),
            Block::Large { len } => len,
        })
    }

    /// The runs a restore needs: every run of small blocks, and every large block's run that
    /// is live (cached ones are left out).
    pub(crate) fn saved_runs(&self) -> Vec<SavedRun> {
        self.mapped
            .iter()
            .filter(|(va, (_, _, class))| class.is_some() || self.live.contains_key(va))
            .map(|(&va, &(len, _, class))| (va, len, class))
            .collect()
    }

    /// Makes an empty arena hold `runs` again, mapped at their addresses, with the blocks at
    /// `live` (address, block length) in use and every other block of a small run free: what
    /// [`saved_runs`](Self::saved_runs) and the live blocks described. Everything is checked
    /// against the range and the geometry first; on any error nothing stays mapped.
    pub(crate) fn restore(
        &mut self,
        runs: &[SavedRun],
        live: &[(u64, u64)],
        backing: &impl Backing<Handle = H>,
    ) -> Result<(), ArenaError> {
        if !self.mapped.is_empty() || !self.live.is_empty() {
            return Err(ArenaError::BadSnapshot);
        }
        let mut sorted = runs.to_vec();
        sorted.sort_unstable_by_key(|r| r.0);
        let end = self.base + self.size;
        let mut cursor = self.base;
        for &(va, len, class) in &sorted {
            let fits = va >= cursor
                && len > 0
                && va.is_multiple_of(self.granularity)
                && len.is_multiple_of(self.granularity)
                && va.checked_add(len).is_some_and(|e| e <= end)
                && class.is_none_or(|c| usize::from(c) < CLASSES && len == self.granularity);
            if !fits {
                return Err(ArenaError::BadSnapshot);
            }
            cursor = va + len;
        }
        let mut blocks = HashMap::new();
        for &(ptr, blen) in live {
            let run = sorted
                .iter()
                .rev()
                .find(|r| r.0 <= ptr)
                .filter(|r| ptr < r.0 + r.1)
                .ok_or(ArenaError::BadSnapshot)?;
            let block = match run.2 {
                Some(class) => {
                    let size = 1u64 << (u32::from(class) + MIN_BLOCK_SHIFT);
                    if blen != size || !(ptr - run.0).is_multiple_of(size) {
                        return Err(ArenaError::BadSnapshot);
                    }
                    Block::Small { class }
                }
                None if ptr == run.0 && blen == run.1 => Block::Large { len: blen },
                None => return Err(ArenaError::BadSnapshot),
            };
            if blocks.insert(ptr, block).is_some() {
                return Err(ArenaError::BadSnapshot);
            }
        }
        let mut cursor = self.base;
        for &(va, len, class) in &sorted {
            if va > cursor {
                self.free_extents.insert(cursor, va - cursor);
            }
            match backing.map(va, len) {
                Ok(h) => self.mapped.insert(va, (len, h, class)),
                Err(e) => {
                    self.release_all(backing);
                    return Err(e);
                }
            };
            cursor = va + len;
            if let Some(class) = class {
                let size = 1u64 << (u32::from(class) + MIN_BLOCK_SHIFT);
                let list = &mut self.classes[usize::from(class)];
                list.extend(
                    (0..len / size)
                        .rev()
                        .map(|i| va + i * size)
                        .filter(|p| !blocks.contains_key(p)),
                );
            }
        }
        self.top = cursor - self.base;
        self.live = blocks;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    const G: u64 = 2 << 20;

    /// Records mappings; refuses to map more than `limit` bytes at once.
    #[derive(Default)]
    struct TestBacking {
        maps: RefCell<BTreeMap<u64, u64>>,
        limit: u64,
        calls: RefCell<usize>,
    }

    impl Backing for TestBacking {
        type Handle = u64;
        fn map(&self, va: u64, len: u64) -> Result<u64, ArenaError> {
            *self.calls.borrow_mut() += 1;
            let mut m = self.maps.borrow_mut();
            let used: u64 = m.values().sum();
            if self.limit != 0 && used + len > self.limit {
                return Err(ArenaError::Driver(2));
            }
            assert!(va.is_multiple_of(G) && len.is_multiple_of(G));
            assert!(m
                .range(..va + len)
                .next_back()
                .is_none_or(|(&a, &l)| a + l <= va));
            m.insert(va, len);
            Ok(va ^ 0xabc)
        }
        fn unmap(&self, va: u64, len: u64, handle: u64) {
            assert_eq!(handle, va ^ 0xabc);
            assert_eq!(self.maps.borrow_mut().remove(&va), Some(len));
        }
    }

    const BASE: u64 = 0x6800_0000_0000;

    #[test]
    fn small_blocks_share_a_granule_and_are_reused_without_the_driver() {
        let b = TestBacking::default();
        let mut a = DeviceArena::new(BASE, 64 * G, G).unwrap();
        let p = a.alloc(1, &b).unwrap();
        let q = a.alloc(256, &b).unwrap();
        let r = a.alloc(300, &b).unwrap();
        assert_eq!((p, q), (BASE, BASE + 256));
        // 300 bytes: the 512-byte class, its own granule.
        assert_eq!(r, BASE + G);
        assert_eq!(*b.calls.borrow(), 2);
        a.free(q, &b).unwrap();
        assert_eq!(a.alloc(200, &b).unwrap(), q);
        assert_eq!(a.free(q + 1, &b), Err(ArenaError::NotABlock));
        // A 1 MiB request is small: two per granule.
        let m1 = a.alloc(SMALL_MAX, &b).unwrap();
        let m2 = a.alloc(SMALL_MAX, &b).unwrap();
        assert_eq!(m2, m1 + SMALL_MAX);
        for _ in 0..1000 {
            let x = a.alloc(SMALL_MAX, &b).unwrap();
            a.free(x, &b).unwrap();
        }
        assert_eq!(*b.calls.borrow(), 4);
    }

    #[test]
    fn large_blocks_are_granule_runs_cached_then_given_back() {
        let b = TestBacking::default();
        let mut a = DeviceArena::new(BASE, 1024 * G, G).unwrap();
        let p = a.alloc(3 * G - 1, &b).unwrap();
        assert_eq!(p, BASE);
        a.free(p, &b).unwrap();
        // Same size again: the cached block, no driver call.
        let calls = *b.calls.borrow();
        assert_eq!(a.alloc(3 * G, &b).unwrap(), p);
        assert_eq!(*b.calls.borrow(), calls);
        a.free(p, &b).unwrap();
        // Over the cache's bound, freed blocks are unmapped and their space reused.
        let big = LARGE_CACHE_BYTES + G;
        let q = a.alloc(big, &b).unwrap();
        a.free(q, &b).unwrap();
        assert!(a.mapped_bytes() <= LARGE_CACHE_BYTES);
        let r = a.alloc(big, &b).unwrap();
        assert!(r >= BASE && r + big <= BASE + 1024 * G);
        assert!(a.holds(r));
    }

    #[test]
    fn an_exhausted_range_and_a_refusing_driver_are_errors_and_leave_no_mapping() {
        let b = TestBacking::default();
        let mut a = DeviceArena::new(BASE, 4 * G, G).unwrap();
        assert_eq!(a.alloc(5 * G, &b), Err(ArenaError::BadSize));
        assert_eq!(a.alloc(0, &b), Err(ArenaError::BadSize));
        let p = a.alloc(3 * G, &b).unwrap();
        assert_eq!(a.alloc(2 * G, &b), Err(ArenaError::RangeFull));
        let s = a.alloc(8, &b).unwrap();
        assert_eq!(s, BASE + 3 * G);
        assert_eq!(a.alloc(SMALL_MAX * 2, &b), Err(ArenaError::RangeFull));
        a.free(p, &b).unwrap();
        // The freed 3-granule run is cached; a 2-granule request finds the range full, unmaps
        // the cached run and takes its space.
        assert_eq!(a.alloc(2 * G, &b), Ok(BASE));

        let b = TestBacking {
            limit: 2 * G,
            ..TestBacking::default()
        };
        let mut a = DeviceArena::new(BASE, 64 * G, G).unwrap();
        let p = a.alloc(2 * G, &b).unwrap();
        a.free(p, &b).unwrap();
        // The driver has no memory for another run: the cached one is given back, then it fits.
        let q = a.alloc(G + 1, &b).unwrap();
        assert_eq!(q, BASE);
        assert_eq!(a.alloc(2 * G, &b), Err(ArenaError::Driver(2)));
        assert_eq!(a.mapped_bytes(), 2 * G);
        a.release_all(&b);
        assert!(b.maps.borrow().is_empty());
        assert_eq!(a.alloc(G, &b).unwrap(), BASE);
    }

    #[test]
    fn sessions_get_disjoint_ranges_inside_the_space() {
        let a = AddressSpace::default();
        assert_eq!(a.check(2), Ok(a));
        let r = |s, d| a.session_base(s, d, 2).unwrap();
        assert_eq!(r(0, 0), DEFAULT_VA_BASE);
        assert_eq!(r(0, 1), DEFAULT_VA_BASE + DEFAULT_VA_SIZE);
        assert_eq!(r(1, 0), DEFAULT_VA_BASE + 2 * DEFAULT_VA_SIZE);
        let slots = (VA_END - DEFAULT_VA_BASE) / (2 * DEFAULT_VA_SIZE);
        let mut bases: Vec<u64> = (0..slots).map(|s| r(s + 7, 1)).collect();
        bases.sort_unstable();
        bases.dedup();
        assert_eq!(bases.len() as u64, slots);
        assert!(bases.iter().all(|b| b + DEFAULT_VA_SIZE <= VA_END));
        assert_eq!(
            a.session_base(u64::MAX, 1, 2)
                .map(|b| b + DEFAULT_VA_SIZE <= VA_END),
            Some(true)
        );
        assert_eq!(a.session_base(3, 2, 2), None);
        assert_eq!(AddressSpace::OFF.session_base(3, 0, 2), None);
        AddressSpace { base: 1, ..a }.check(1).unwrap_err();
        AddressSpace {
            per_device: VA_END,
            ..a
        }
        .check(1)
        .unwrap_err();
        AddressSpace { per_device: 0, ..a }.check(1).unwrap_err();
        assert_eq!(
            AddressSpace {
                base: 0,
                per_device: 7
            }
            .check(1),
            Ok(AddressSpace::OFF)
        );
    }

    #[test]
    fn a_restored_arena_has_the_same_blocks_and_hands_out_the_rest() {
        let b = TestBacking::default();
        let mut a = DeviceArena::new(BASE, 64 * G, G).unwrap();
        let small: Vec<u64> = (0..5).map(|_| a.alloc(100, &b).unwrap()).collect();
        let large = a.alloc(3 * G, &b).unwrap();
        let cached = a.alloc(2 * G, &b).unwrap();
        a.free(cached, &b).unwrap();
        a.free(small[1], &b).unwrap();
        let runs = a.saved_runs();
        assert_eq!(runs.len(), 2, "the cached run is left out: {runs:?}");
        let live: Vec<(u64, u64)> = [small[0], small[2], small[3], small[4], large]
            .iter()
            .map(|&p| (p, a.block_len(p).unwrap()))
            .collect();
        let b2 = TestBacking::default();
        let mut r = DeviceArena::new(BASE, 64 * G, G).unwrap();
        r.restore(&runs, &live, &b2).unwrap();
        for &(p, len) in &live {
            assert_eq!(r.block_len(p), Some(len));
        }
        assert_eq!(b2.maps.borrow().len(), 2);
        // The free block of the small run comes back first; new runs go to the gap or above.
        assert_eq!(r.alloc(128, &b2).unwrap(), small[1]);
        let next = r.alloc(G * 2, &b2).unwrap();
        assert!(!live.iter().any(|&(p, l)| next < p + l && p < next + 2 * G));
        r.free(large, &b2).unwrap();
        assert_eq!(r.free(large, &b2), Err(ArenaError::NotABlock));
    }

    #[test]
    fn hostile_snapshots_are_refused_and_leave_nothing_mapped() {
        let b = TestBacking::default();
        type Case<'a> = (&'a [SavedRun], &'a [(u64, u64)]);
        let cases: &[Case] = &[
            (&[(BASE - G, G, None)], &[]),
            (&[(BASE + 63 * G, 2 * G, None)], &[]),
            (&[(BASE + 1, G, None)], &[]),
            (&[(BASE, G, Some(13))], &[]),
            (&[(BASE, 2 * G, Some(0))], &[]),
            (&[(BASE, 2 * G, None), (BASE + G, G, None)], &[]),
            (&[(BASE, G, Some(0))], &[(BASE + 1, 256)]),
            (&[(BASE, G, Some(0))], &[(BASE, 512)]),
            (&[(BASE, G, Some(0))], &[(BASE, 256), (BASE, 256)]),
            (&[(BASE, 2 * G, None)], &[(BASE, G)]),
            (&[(BASE, G, None)], &[(BASE + G, G)]),
        ];
        for (runs, live) in cases {
            let mut a = DeviceArena::new(BASE, 64 * G, G).unwrap();
            assert_eq!(
                a.restore(runs, live, &b),
                Err(ArenaError::BadSnapshot),
                "{runs:?} {live:?}"
            );
            assert!(b.maps.borrow().is_empty());
        }
        // A driver that fails half-way leaves nothing mapped either.
        let b = TestBacking {
            limit: G,
            ..TestBacking::default()
        };
        let mut a = DeviceArena::new(BASE, 64 * G, G).unwrap();
        let runs = [(BASE, G, None), (BASE + G, G, None)];
        assert_eq!(a.restore(&runs, &[], &b), Err(ArenaError::Driver(2)));
        assert!(b.maps.borrow().is_empty());
    }

    #[test]
    fn bad_geometry_is_refused() {
        assert!(DeviceArena::<u64>::new(BASE + 1, G, G).is_none());
        assert!(DeviceArena::<u64>::new(BASE, G + 1, G).is_none());
        assert!(DeviceArena::<u64>::new(BASE, 0, G).is_none());
        assert!(DeviceArena::<u64>::new(BASE, G, 3 << 20).is_none());
        assert!(DeviceArena::<u64>::new(u64::MAX - G + 1, 2 * G, G).is_none());
    }
}

// SPDX-License-Identifier: GPL-2.0
//! One user buffer of a call, made reachable by the device.
//!
//! Buffers up to [`BOUNCE_THRESHOLD`] bytes are copied into kmalloc bounce memory, qCUDA's way:
//! one copy is cheaper than pinning for small sizes, and the device never sees user pages.
//! Larger buffers are pinned in place (`pin_user_pages_fast`) and described as runs of
//! physically contiguous pages, one descriptor per run, so the host reads and writes guest RAM
//! directly. request.rs creates buffers from the ioctl's table and turns their [`Segment`]s
//! (one descriptor each, virtio.rs) into the descriptor chain. A released buffer leaves its
//! memory (bounce allocation, page and run arrays) in a [`BufferStorage`] that the next call of
//! the same file takes it from, so that repeated calls do not allocate.

use kernel::{
    bindings,
    ffi::{c_int, c_ulong},
    page::{PAGE_SHIFT, PAGE_SIZE},
    prelude::*,
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    virtio::{self, Segment},
    wire::{Direction, BOUNCE_THRESHOLD, COPY_CHUNK, MAX_BUFFERS},
};

/// Largest bounce allocation a [`BufferStorage`] keeps. Most calls' buffers are structures of
/// a few hundred bytes or small copies; keeping every 64 KiB one would hold memory per file
/// for little gain (copying 64 KiB costs far more than allocating it).
const RETAINED_BOUNCE: usize = 16 * 1024;

/// Largest page array (in pages) a [`BufferStorage`] keeps: that of guest-lib's copy chunk,
/// misaligned by up to a page.
const RETAINED_PAGES: usize = (COPY_CHUNK as usize / PAGE_SIZE) + 1;

/// Memory that the buffers of a finished call leave for the next call of the same file: bounce
/// allocations and the arrays of one pinned buffer. Holds nothing of the user: only capacity.
pub(crate) struct BufferStorage {
    /// Empty vectors; those with a capacity of at most [`RETAINED_BOUNCE`] bytes are kept.
    bounce: [KVec<u8>; MAX_BUFFERS],
    /// Empty arrays of a pinned buffer, at most [`RETAINED_PAGES`] entries each.
    pages: KVVec<*mut bindings::page>,
    runs: KVVec<Run>,
}

// SAFETY: The arrays are empty: no page pointer is ever stored in a `BufferStorage`.
unsafe impl Send for BufferStorage {}
// SAFETY: As for `Send`.
unsafe impl Sync for BufferStorage {}

impl BufferStorage {
    /// Nothing kept yet.
    pub(crate) const fn new() -> Self {
        Self {
            bounce: [const { KVec::new() }; MAX_BUFFERS],
            pages: KVVec::new(),
            runs: KVVec::new(),
        }
    }

    /// An empty vector with room for `len` bytes if one is kept, else an empty one.
    fn take_bounce(&mut self, len: usize) -> KVec<u8> {
        match self.bounce.iter_mut().find(|v| v.capacity() >= len) {
            Some(v) => core::mem::take(v),
            None => KVec::new(),
        }
    }

    fn keep_bounce(&mut self, mut data: KVec<u8>) {
        if data.capacity() == 0 || data.capacity() > RETAINED_BOUNCE {
            return;
        }
        data.clear();
        if let Some(v) = self.bounce.iter_mut().find(|v| v.capacity() == 0) {
            *v = data;
        }
    }

    fn keep_arrays(&mut self, mut pages: KVVec<*mut bindings::page>, mut runs: KVVec<Run>) {
        pages.clear();
        runs.clear();
        if pages.capacity() <= RETAINED_PAGES && pages.capacity() > self.pages.capacity() {
            self.pages = pages;
        }
        if runs.capacity() <= RETAINED_PAGES && runs.capacity() > self.runs.capacity() {
            self.runs = runs;
        }
    }
}

/// The device-visible form of one user buffer.
pub(crate) enum UserBuffer {
    /// Copied to or from a kernel buffer.
    Bounce(BounceBuffer),
    /// Pinned user pages.
    Pinned(PinnedBuffer),
    /// Input the module itself made (a `HostMap` run table), in kmalloc pieces, one descriptor
    /// each.
    Kernel(KVec<KVec<u8>>),
}

impl UserBuffer {
    /// Makes `len` bytes at user address `addr` reachable by the device. `In` buffers are read
    /// here, once; `Out` buffers are written back by [`UserBuffer::copy_out`].
    /// Memory is taken from `storage` where it holds enough.
    pub(crate) fn new(
        addr: u64,
        len: u64,
        dir: Direction,
        storage: &mut BufferStorage,
    ) -> Result<Self> {
        let addr = usize::try_from(addr).map_err(|_| EFAULT)?;
        let len = usize::try_from(len).map_err(|_| EINVAL)?;
        addr.checked_add(len).ok_or(EFAULT)?;
        if len as u64 <= BOUNCE_THRESHOLD {
            Ok(Self::Bounce(BounceBuffer::new(addr, len, dir, storage)?))
        } else {
            Ok(Self::Pinned(PinnedBuffer::new(addr, len, dir, storage)?))
        }
    }

    /// Releases the buffer (unpinning its pages) and leaves its memory in `storage`. Process
    /// context (may sleep).
    pub(crate) fn release(self, storage: &mut BufferStorage) {
        match self {
            Self::Bounce(b) => storage.keep_bounce(b.data),
            Self::Pinned(p) => {
                let (pages, runs) = p.unpin();
                storage.keep_arrays(pages, runs);
            }
            Self::Kernel(_) => {}
        }
    }

    /// Whether the device reads (`In`) or writes (`Out`) this buffer.
    pub(crate) fn direction(&self) -> Direction {
        match self {
            Self::Bounce(b) => b.dir,
            Self::Pinned(p) if p.device_writes => Direction::Out,
            Self::Pinned(_) | Self::Kernel(_) => Direction::In,
        }
    }

    /// Descriptors this buffer uses in the chain.
    pub(crate) fn segment_count(&self) -> usize {
        match self {
            Self::Bounce(b) => usize::from(!b.data.is_empty()),
            Self::Pinned(p) => p.runs.len(),
            Self::Kernel(pieces) => pieces.iter().filter(|p| !p.is_empty()).count(),
        }
    }

    /// Calls `f` for each descriptor of this buffer, in address order.
    pub(crate) fn for_each_segment(&self, mut f: impl FnMut(Segment)) {
        match self {
            Self::Bounce(b) => {
                if !b.data.is_empty() {
                    f(Segment::Kernel {
                        addr: b.data.as_ptr(),
                        // At most BOUNCE_THRESHOLD bytes, see `UserBuffer::new`.
                        len: b.data.len() as u32,
                    })
                }
            }
            Self::Pinned(p) => {
                for run in p.runs.iter() {
                    f(Segment::Page {
                        page: run.page,
                        offset: run.offset,
                        len: run.len,
                    })
                }
            }
            Self::Kernel(pieces) => {
                for piece in pieces.iter().filter(|p| !p.is_empty()) {
                    f(Segment::Kernel {
                        addr: piece.as_ptr(),
                        // Pieces are at most a few hundred KiB (host_memory.rs).
                        len: piece.len() as u32,
                    })
                }
            }
        }
    }

    /// Writes what the device produced back to user space (pinned buffers already hold it).
    pub(crate) fn copy_out(&self) -> Result {
        match self {
            Self::Bounce(b) if b.dir == Direction::Out && !b.data.is_empty() => {
                UserSlice::new(UserPtr::from_addr(b.user), b.data.len())
                    .writer()
                    .write_slice(&b.data)
            }
            _ => Ok(()),
        }
    }
}

/// A kernel copy of a small user buffer.
pub(crate) struct BounceBuffer {
    user: usize,
    dir: Direction,
    /// Zero-filled for `Out` buffers, so that bytes the device does not write never leak kernel
    /// memory to user space.
    data: KVec<u8>,
}

impl BounceBuffer {
    fn new(user: usize, len: usize, dir: Direction, storage: &mut BufferStorage) -> Result<Self> {
        let mut data = storage.take_bounce(len);
        let data = if dir == Direction::In {
            // Copied straight into the allocation: nothing to zero first.
            UserSlice::new(UserPtr::from_addr(user), len)
                .reader()
                .read_all(&mut data, GFP_KERNEL)?;
            data
        } else if data.capacity() >= len {
            // SAFETY: the capacity is at least `len` bytes; one memset zeroes them, and zero is
            // a valid `u8`.
            unsafe {
                core::ptr::write_bytes(data.as_mut_ptr(), 0, len);
                data.inc_len(len);
            }
            data
        } else {
            // The allocator zeroes the memory (one memset, where filling the vector would
            // write it byte by byte, which costs microseconds per KiB in an emulated guest).
            let mut data = KVec::with_capacity(len, GFP_KERNEL | __GFP_ZERO)?;
            // SAFETY: the capacity is at least `len` bytes, all of them zeroed by the
            // allocator (`__GFP_ZERO`), and zero is a valid `u8`.
            unsafe { data.inc_len(len) };
            data
        };
        Ok(Self { user, dir, data })
    }
}

/// A run of physically contiguous pinned bytes.
struct Run {
    page: *mut bindings::page,
    offset: u32,
    len: u32,
}

/// User pages pinned for the duration of one request.
///
/// # Invariants
///
/// Every entry of `pages` is a page pinned by `pin_user_pages_fast` (FOLL_PIN), released
/// exactly once in `drop`. The value is dropped only in process context (it may sleep).
pub(crate) struct PinnedBuffer {
    pages: KVVec<*mut bindings::page>,
    runs: KVVec<Run>,
    /// The device writes these pages: mark them dirty when unpinning.
    device_writes: bool,
}

// SAFETY: The page pointers refer to pinned pages, which any thread may use and unpin.
unsafe impl Send for PinnedBuffer {}
// SAFETY: `&PinnedBuffer` only reads the page pointers.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    fn new(addr: usize, len: usize, dir: Direction, storage: &mut BufferStorage) -> Result<Self> {
        // `UserBuffer::new` checked that `addr + len` does not overflow, and `len > 0`.
        let first = addr >> PAGE_SHIFT;
        let npages = ((addr + len - 1) >> PAGE_SHIFT) - first + 1;
        let device_writes = dir == Direction::Out;
        let gup_flags = if device_writes {
            bindings::FOLL_WRITE
        } else {
            0
        };
        // Empty arrays (type invariant of `BufferStorage`), grown to the worst case once: at
        // most one run per page, so `build_runs` never reallocates.
        let mut pages = core::mem::take(&mut storage.pages);
        let mut runs = core::mem::take(&mut storage.runs);
        pages.reserve(npages, GFP_KERNEL)?;
        runs.reserve(npages, GFP_KERNEL)?;
        let mut this = Self {
            pages,
            runs,
            device_writes,
        };

        // pin_user_pages_fast may pin fewer pages than asked (e.g. at a VMA boundary).
        while this.pages.len() < npages {
            let done = this.pages.len();
            let want = c_int::try_from(npages - done).unwrap_or(c_int::MAX);
            let start = ((first + done) << PAGE_SHIFT) as c_ulong;
            // SAFETY: `pages` has capacity for `npages` pointers and holds `done`, so the array
            // at `as_mut_ptr() + done` has room for the `want <= npages - done` pointers that
            // pin_user_pages_fast writes at most. It validates the user range itself.
            let got = unsafe {
                bindings::pin_user_pages_fast(
                    start,
                    want,
                    gup_flags,
                    this.pages.as_mut_ptr().add(done),
                )
            };
            if got <= 0 {
                // `drop` unpins what was pinned so far.
                return Err(if got < 0 {
                    Error::from_errno(got)
                } else {
                    EFAULT
                });
            }
            // SAFETY: pin_user_pages_fast initialised `got <= want` more entries.
            unsafe { this.pages.inc_len(got as usize) };
        }
        this.build_runs(addr, len)?;
        Ok(this)
    }

    /// Merges physically contiguous pages into runs.
    fn build_runs(&mut self, addr: usize, len: usize) -> Result {
        let mut offset = addr % PAGE_SIZE;
        let mut left = len;
        let mut prev_pfn: c_ulong = 0;
        for &page in self.pages.iter() {
            let n = (PAGE_SIZE - offset).min(left);
            // SAFETY: `page` is pinned, so it is a valid `struct page`.
            let pfn = unsafe { virtio::qcuda_glue_page_to_pfn(page) };
            match self.runs.last_mut() {
                // A run never exceeds the buffer (<= MAX_BUFFER_LEN bytes), so it fits in u32.
                Some(run) if pfn == prev_pfn + 1 => run.len += n as u32,
                // Room for one run per page was reserved in `new`.
                _ => self
                    .runs
                    .push_within_capacity(Run {
                        page,
                        offset: offset as u32,
                        len: n as u32,
                    })
                    .map_err(|_| ENOMEM)?,
            }
            prev_pfn = pfn;
            left -= n;
            offset = 0;
        }
        Ok(())
    }
}

impl PinnedBuffer {
    /// Releases the pinned pages; returns the (emptied) page and run arrays.
    fn unpin(mut self) -> (KVVec<*mut bindings::page>, KVVec<Run>) {
        self.release_pages();
        (
            core::mem::take(&mut self.pages),
            core::mem::take(&mut self.runs),
        )
    }

    /// Unpins every page and empties `pages` (and `runs`, which point into them).
    fn release_pages(&mut self) {
        if !self.pages.is_empty() {
            // SAFETY: By the type invariant every entry is a page we pinned and have not
            // released, and we are in process context.
            unsafe {
                bindings::unpin_user_pages_dirty_lock(
                    self.pages.as_mut_ptr(),
                    self.pages.len() as c_ulong,
                    self.device_writes,
                )
            };
        }
        // INVARIANT: The released pages are gone from the array.
        self.pages.clear();
        self.runs.clear();
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        self.release_pages();
    }
}

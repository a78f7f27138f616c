// SPDX-License-Identifier: GPL-2.0
//! Guest pages a session lets the host map: the pages behind `cudaHostAlloc` and
//! `cudaHostRegister`.
//!
//! Two sources, one type ([`HostRegion`]):
//!
//! - **Module pages** ([`HostRegion::allocate`]): an mmap of /dev/qcuda is backed by pages this
//!   module allocates, zeroed, in chunks of up to 4 MiB (order 10) so that the host sees few,
//!   long guest-physical runs, split into order-0 pages and inserted into the VMA.
//! - **User pages** ([`HostRegion::pin`]): any other user range (a `malloc`'d buffer) is pinned
//!   with `FOLL_LONGTERM`, for as long as the region lives.
//!
//! A region's pages are released only when the region is dropped, and session.rs drops a region
//! the host has mapped only after the host confirmed that it no longer maps it (`HostUnmap` or
//! `SessionClose` answered). Where that confirmation never comes, the pages are leaked on
//! purpose: a page the host may still write must never return to the guest's allocator.
//! [`held_pages`] counts the pages all regions hold, for tests (fdinfo).

use kernel::{
    bindings,
    ffi::{c_int, c_uint, c_ulong},
    page::{PAGE_SHIFT, PAGE_SIZE},
    prelude::*,
    sync::atomic::{Atomic, Relaxed},
};

use crate::{
    virtio,
    wire::{HostRun, HOST_RUN_SIZE},
};

/// Largest chunk tried first: order 10 is 4 MiB, the buddy allocator's largest block.
const MAX_ORDER: u32 = 10;
/// Most guest-physical runs one region may have (the host maps each run separately).
pub(crate) const MAX_RUNS: usize = 32 * 1024;
/// Bytes of run table per kernel buffer of the `HostMap` chain (one descriptor each).
const TABLE_CHUNK: usize = 4096 * HOST_RUN_SIZE;

/// Pages held by all regions of all sessions.
static HELD_PAGES: Atomic<u64> = Atomic::new(0);

/// Pages held now by all host regions (pinned user pages and module pages).
pub(crate) fn held_pages() -> u64 {
    HELD_PAGES.load(Relaxed)
}

/// Where a region's pages come from, and so how they are released.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Allocated here; one reference each, dropped with `__free_pages`.
    Module,
    /// User pages pinned with `FOLL_PIN | FOLL_LONGTERM`.
    Pinned,
}

/// A user range whose pages the module holds for the host.
///
/// # Invariants
///
/// Every entry of `pages` is a valid order-0 page that this region holds (a reference for
/// `Source::Module`, a FOLL_PIN pin for `Source::Pinned`), released exactly once, in `drop`.
/// `pages.len()` pages were added to `HELD_PAGES`. `addr` and `len` are page-aligned and `len`
/// is `pages.len()` pages.
pub(crate) struct HostRegion {
    /// The address the caller named (not necessarily page-aligned).
    pub(crate) user_addr: usize,
    /// First page of the range.
    pub(crate) addr: usize,
    /// Bytes (whole pages).
    pub(crate) len: usize,
    pages: KVVec<*mut bindings::page>,
    source: Source,
    /// The host maps the pages (a `HostMap` succeeded, or its outcome is unknown).
    pub(crate) host_mapped: bool,
    /// The device address the host gave.
    pub(crate) dev_addr: u64,
}

// SAFETY: The page pointers refer to pages this region holds, usable and releasable from any
// thread in process context.
unsafe impl Send for HostRegion {}
// SAFETY: `&HostRegion` only reads the page pointers.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    fn empty(user_addr: usize, addr: usize, npages: usize, source: Source) -> Result<Self> {
        Ok(Self {
            user_addr,
            addr,
            len: npages << PAGE_SHIFT,
            pages: KVVec::with_capacity(npages, GFP_KERNEL)?,
            source,
            host_mapped: false,
            dev_addr: 0,
        })
    }

    /// Allocates zeroed pages for an mmap of `len` bytes (a page multiple) at `addr`, in the
    /// largest physically contiguous chunks available.
    pub(crate) fn allocate(addr: usize, len: usize) -> Result<Self> {
        let npages = len >> PAGE_SHIFT;
        if npages == 0 || len % PAGE_SIZE != 0 {
            return Err(EINVAL);
        }
        let mut this = Self::empty(addr, addr, npages, Source::Module)?;
        let mut order = MAX_ORDER;
        while this.pages.len() < npages {
            let left = npages - this.pages.len();
            while order > 0 && (1usize << order) > left {
                order -= 1;
            }
            // SAFETY: Plain page allocation; the pages come back split (order 0 each) and
            // zeroed, and this region holds one reference to each.
            let first = unsafe { virtio::qcuda_glue_alloc_chunk(order as c_uint) };
            if first.is_null() {
                if order == 0 {
                    // `drop` frees what was allocated so far.
                    return Err(ENOMEM);
                }
                order -= 1;
                continue;
            }
            for i in 0..(1usize << order) {
                // SAFETY: `first` is the first of 1 << order consecutive `struct page`s of one
                // allocation (the memory map is virtually contiguous on x86-64).
                let page = unsafe { first.add(i) };
                // Capacity was reserved for `npages` and at most `left` are added.
                if this.pages.push_within_capacity(page).is_err() {
                    // SAFETY: `page` is ours and not recorded anywhere.
                    unsafe { virtio::qcuda_glue_free_page(page) };
                    continue;
                }
                HELD_PAGES.fetch_add(1, Relaxed);
            }
        }
        Ok(this)
    }

    /// Pins the user pages under `user_addr..user_addr + len` for as long as the region lives.
    pub(crate) fn pin(user_addr: usize, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(EINVAL);
        }
        let end = user_addr.checked_add(len).ok_or(EFAULT)?;
        let first = user_addr >> PAGE_SHIFT;
        let npages = ((end - 1) >> PAGE_SHIFT) - first + 1;
        let mut this = Self::empty(user_addr, first << PAGE_SHIFT, npages, Source::Pinned)?;
        let flags = bindings::FOLL_WRITE | bindings::FOLL_LONGTERM;
        while this.pages.len() < npages {
            let done = this.pages.len();
            let want = c_int::try_from(npages - done).unwrap_or(c_int::MAX);
            let start = ((first + done) << PAGE_SHIFT) as c_ulong;
            // SAFETY: `pages` has capacity for `npages` pointers and holds `done`, so there is
            // room for the `want <= npages - done` pointers pin_user_pages_fast writes at most.
            // It validates the user range itself.
            let got = unsafe {
                bindings::pin_user_pages_fast(start, want, flags, this.pages.as_mut_ptr().add(done))
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
            HELD_PAGES.fetch_add(got as u64, Relaxed);
        }
        Ok(this)
    }

    /// True for pages of an mmap of /dev/qcuda.
    pub(crate) fn is_module_memory(&self) -> bool {
        self.source == Source::Module
    }

    /// Pages the region holds.
    pub(crate) fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// Calls `f` with each page, in address order (for inserting module pages into a VMA).
    pub(crate) fn for_each_page(
        &self,
        mut f: impl FnMut(usize, *mut bindings::page) -> Result,
    ) -> Result {
        for (i, &page) in self.pages.iter().enumerate() {
            f(self.addr + (i << PAGE_SHIFT), page)?;
        }
        Ok(())
    }

    /// The `HostMap` run table: physically contiguous pages merged into runs, encoded as
    /// `HostRun` records in kernel buffers of at most `TABLE_CHUNK` bytes. E2BIG past
    /// [`MAX_RUNS`].
    pub(crate) fn run_table(&self) -> Result<KVec<KVec<u8>>> {
        let mut runs: KVVec<HostRun> = KVVec::new();
        let mut prev_pfn: c_ulong = 0;
        for &page in self.pages.iter() {
            // SAFETY: `page` is held by this region (type invariant), so it is a valid page.
            let pfn = unsafe { virtio::qcuda_glue_page_to_pfn(page) };
            match runs.last_mut() {
                Some(run) if pfn == prev_pfn + 1 => run.len += PAGE_SIZE as u64,
                _ => {
                    if runs.len() == MAX_RUNS {
                        return Err(E2BIG);
                    }
                    runs.push(
                        HostRun {
                            gpa: (pfn as u64) << PAGE_SHIFT,
                            len: PAGE_SIZE as u64,
                        },
                        GFP_KERNEL,
                    )?
                }
            }
            prev_pfn = pfn;
        }
        let mut chunks = KVec::new();
        for group in runs.chunks(TABLE_CHUNK / HOST_RUN_SIZE) {
            let mut bytes = KVec::with_capacity(group.len() * HOST_RUN_SIZE, GFP_KERNEL)?;
            for r in group {
                bytes.extend_from_slice(&r.encode(), GFP_KERNEL)?;
            }
            chunks.push(bytes, GFP_KERNEL)?;
        }
        Ok(chunks)
    }

    /// Gives up the pages without releasing them: for pages the host may still map.
    pub(crate) fn leak(mut self) {
        pr_warn!(
            "keeping {} page(s) at {:#x} pinned for good: the host never confirmed dropping its mapping\n",
            self.pages.len(),
            self.addr
        );
        // The count stays: the pages are still held.
        let pages = core::mem::take(&mut self.pages);
        core::mem::forget(pages);
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        let n = self.pages.len();
        if n == 0 {
            return;
        }
        match self.source {
            Source::Module => {
                for &page in self.pages.iter() {
                    // SAFETY: By the type invariant the region holds one reference to `page`;
                    // a VMA still mapping it holds its own.
                    unsafe { virtio::qcuda_glue_free_page(page) };
                }
            }
            // SAFETY: By the type invariant every entry is a page pinned here and not yet
            // unpinned, and drops happen in process context. The device may have written them.
            Source::Pinned => unsafe {
                bindings::unpin_user_pages_dirty_lock(self.pages.as_mut_ptr(), n as c_ulong, true)
            },
        }
        HELD_PAGES.fetch_sub(n as u64, Relaxed);
    }
}

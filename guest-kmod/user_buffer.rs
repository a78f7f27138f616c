// SPDX-License-Identifier: GPL-2.0
//! One user buffer of a call, made reachable by the device.
//!
//! Buffers up to [`BOUNCE_THRESHOLD`] bytes are copied into kmalloc bounce memory, qCUDA's way:
//! one copy is cheaper than pinning for small sizes, and the device never sees user pages.
//! Larger buffers are pinned in place (`pin_user_pages_fast`) and described as runs of
//! physically contiguous pages, one descriptor per run, so the host reads and writes guest RAM
//! directly. session.rs creates buffers from the ioctl's table; request.rs turns their
//! [`Segment`]s (one descriptor each, virtio.rs) into the descriptor chain.

use kernel::{
    bindings,
    ffi::{c_int, c_ulong},
    page::{PAGE_SHIFT, PAGE_SIZE},
    prelude::*,
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    virtio::{self, Segment},
    wire::{Direction, BOUNCE_THRESHOLD},
};

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
    pub(crate) fn new(addr: u64, len: u64, dir: Direction) -> Result<Self> {
        let addr = usize::try_from(addr).map_err(|_| EFAULT)?;
        let len = usize::try_from(len).map_err(|_| EINVAL)?;
        addr.checked_add(len).ok_or(EFAULT)?;
        if len as u64 <= BOUNCE_THRESHOLD {
            Ok(Self::Bounce(BounceBuffer::new(addr, len, dir)?))
        } else {
            Ok(Self::Pinned(PinnedBuffer::new(addr, len, dir)?))
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
    fn new(user: usize, len: usize, dir: Direction) -> Result<Self> {
        let data = if dir == Direction::In {
            // Copied straight into the allocation: nothing to zero first.
            let mut data = KVec::new();
            UserSlice::new(UserPtr::from_addr(user), len)
                .reader()
                .read_all(&mut data, GFP_KERNEL)?;
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
    fn new(addr: usize, len: usize, dir: Direction) -> Result<Self> {
        // `UserBuffer::new` checked that `addr + len` does not overflow, and `len > 0`.
        let first = addr >> PAGE_SHIFT;
        let npages = ((addr + len - 1) >> PAGE_SHIFT) - first + 1;
        let device_writes = dir == Direction::Out;
        let gup_flags = if device_writes {
            bindings::FOLL_WRITE
        } else {
            0
        };
        let mut this = Self {
            pages: KVVec::with_capacity(npages, GFP_KERNEL)?,
            runs: KVVec::new(),
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
                _ => self.runs.push(
                    Run {
                        page,
                        offset: offset as u32,
                        len: n as u32,
                    },
                    GFP_KERNEL,
                )?,
            }
            prev_pfn = pfn;
            left -= n;
            offset = 0;
        }
        Ok(())
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.pages.is_empty() {
            return;
        }
        // SAFETY: By the type invariant every entry is a page we pinned and have not released,
        // and we are in process context.
        unsafe {
            bindings::unpin_user_pages_dirty_lock(
                self.pages.as_mut_ptr(),
                self.pages.len() as c_ulong,
                self.device_writes,
            )
        };
    }
}

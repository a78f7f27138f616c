// SPDX-License-Identifier: GPL-2.0
//! One request in flight and its descriptor chain.
//!
//! ```text
//! [device-readable]  request header   (kmalloc, REQUEST_HEADER_SIZE bytes, session stamped)
//! [device-readable]  In buffers       (one descriptor per bounce buffer or pinned run)
//! [device-writable]  Out buffers      (likewise)
//! [device-writable]  response header  (kmalloc, RESPONSE_HEADER_SIZE bytes)
//! ```
//!
//! A `Request` is shared (`Arc`) between the caller and the in-flight table of device.rs, which
//! keeps its reference until the device has completed the chain, so the memory the device may
//! still write is never freed early, even when the caller gave up (signal, async op).

use kernel::{
    bindings,
    ffi::{c_uint, c_void},
    new_condvar,
    prelude::*,
    sync::{Arc, CondVar},
    types::Opaque,
};

use crate::{
    user_buffer::{Segment, UserBuffer},
    virtio,
    wire::{
        ioctl::IoctlBuffer, status, Direction, RequestHeader, ResponseHeader, REQUEST_HEADER_SIZE,
        RESPONSE_HEADER_SIZE,
    },
};

/// A request: its header, its buffers and the response the device writes.
///
/// # Invariants
///
/// `header` and `response` are kmalloc memory (linear-mapped), as the scatterlists require.
/// `response` is written by the device only while the chain is in flight, and read by the CPU
/// only after the device completed it.
#[pin_data]
pub(crate) struct Request {
    /// Notified by the completion path when this request's chain is done or failed.
    #[pin]
    pub(crate) done: CondVar,
    header: KBox<[u8; REQUEST_HEADER_SIZE]>,
    response: KBox<Opaque<[u8; RESPONSE_HEADER_SIZE]>>,
    buffers: KVec<UserBuffer>,
}

// SAFETY: The only interior mutability besides the `CondVar` (which is `Sync`) is `response`,
// which the device writes while the chain is in flight and the CPU reads only after completion,
// ordered by the queue lock (type invariant). The page pointers inside `buffers` are pinned
// pages, usable from any thread.
unsafe impl Sync for Request {}
// SAFETY: See `Sync`; nothing in a `Request` is tied to the thread that created it.
unsafe impl Send for Request {}

impl Request {
    /// Builds a request: encodes `header` and makes every user buffer reachable by the device
    /// (copying `In` bounce buffers now).
    pub(crate) fn new(header: &RequestHeader, bufs: &[IoctlBuffer]) -> Result<Arc<Self>> {
        let mut buffers = KVec::with_capacity(bufs.len(), GFP_KERNEL)?;
        for b in bufs {
            let dir = Direction::from_u32(b.dir).ok_or(EINVAL)?;
            buffers.push(UserBuffer::new(b.addr, b.len, dir)?, GFP_KERNEL)?;
        }
        Self::assemble(header, buffers)
    }

    /// A request whose one `In` buffer is data the module made (`pieces`, concatenated); the
    /// header's buffer table must say so.
    pub(crate) fn with_kernel_input(
        header: &RequestHeader,
        pieces: KVec<KVec<u8>>,
    ) -> Result<Arc<Self>> {
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        match header.buffers() {
            [d] if d.dir == Direction::In as u32 && d.len == total as u64 => {}
            _ => return Err(EINVAL),
        }
        let mut buffers = KVec::with_capacity(1, GFP_KERNEL)?;
        buffers.push(UserBuffer::Kernel(pieces), GFP_KERNEL)?;
        Self::assemble(header, buffers)
    }

    fn assemble(header: &RequestHeader, buffers: KVec<UserBuffer>) -> Result<Arc<Self>> {
        let header = KBox::new(header.encode(), GFP_KERNEL)?;
        // A device that completes the chain without writing a response leaves this status.
        let response = KBox::new(
            Opaque::new(ResponseHeader::with_status(status::UNKNOWN).encode()),
            GFP_KERNEL,
        )?;
        Arc::pin_init(
            try_pin_init!(Self {
                done <- new_condvar!("qcuda_request"),
                header,
                response,
                buffers,
            }),
            GFP_KERNEL,
        )
    }

    /// Descriptors the chain uses, header and response included.
    pub(crate) fn segment_count(&self) -> usize {
        2 + self
            .buffers
            .iter()
            .map(UserBuffer::segment_count)
            .sum::<usize>()
    }

    /// The response the device wrote (or the prefilled `UNKNOWN` status if it wrote none).
    ///
    /// Call only after the device completed the chain (or it was taken back on removal).
    pub(crate) fn response(&self) -> Result<ResponseHeader> {
        // SAFETY: By the type invariant and the caller's guarantee, the device no longer
        // writes `response`; the completion path's lock release ordered its writes before us.
        let bytes = unsafe { core::ptr::read(self.response.get()) };
        ResponseHeader::decode(&bytes).map_err(|_| EIO)
    }

    /// Copies `Out` bounce buffers back to user space.
    pub(crate) fn copy_out(&self) -> Result {
        for b in self.buffers.iter() {
            b.copy_out()?;
        }
        Ok(())
    }

    /// Builds the scatterlists of the chain. They are only read while the chain is added to the
    /// ring, so they may be dropped as soon as `virtqueue_add_sgs` returned.
    pub(crate) fn scatterlists(&self) -> Result<SgList> {
        let total = self.segment_count();
        let mut sg = SgList {
            entries: KVVec::with_capacity(total, GFP_KERNEL)?,
            ptrs: KVVec::with_capacity(total, GFP_KERNEL)?,
            readable: 0,
            writable: 0,
        };
        sg.push(Segment::Kernel {
            addr: self.header.as_ptr(),
            len: REQUEST_HEADER_SIZE as u32,
        });
        sg.readable += 1;
        for b in self.buffers.iter() {
            let before = sg.entries.len();
            b.for_each_segment(|s| sg.push(s));
            let added = (sg.entries.len() - before) as c_uint;
            if b.direction() == Direction::In {
                sg.readable += added;
            } else {
                sg.writable += added;
            }
        }
        sg.push(Segment::Kernel {
            addr: self.response.get().cast::<u8>(),
            len: RESPONSE_HEADER_SIZE as u32,
        });
        sg.writable += 1;
        if sg.entries.len() != total {
            return Err(EINVAL);
        }
        // No push after this point: the entries stay where the pointers point.
        for i in 0..sg.entries.len() {
            // SAFETY: `i` is in bounds of `entries`.
            let p = unsafe { sg.entries.as_mut_ptr().add(i) };
            sg.ptrs.push(p, GFP_KERNEL)?;
        }
        Ok(sg)
    }
}

/// The scatterlists of one chain: one single-entry list per descriptor, readable ones first.
///
/// # Invariants
///
/// `ptrs[i]` points to `entries[i]`; `entries` is never resized after `ptrs` is filled, and
/// `readable + writable == entries.len()`.
pub(crate) struct SgList {
    entries: KVVec<bindings::scatterlist>,
    ptrs: KVVec<*mut bindings::scatterlist>,
    pub(crate) readable: c_uint,
    pub(crate) writable: c_uint,
}

impl SgList {
    /// Appends one descriptor. Capacity was reserved for every descriptor of the chain.
    fn push(&mut self, seg: Segment) {
        if self
            .entries
            .push_within_capacity(bindings::scatterlist::default())
            .is_err()
        {
            // Unreachable: `scatterlists` reserved `segment_count` entries. A refused descriptor
            // makes `scatterlists` fail its final count check (EINVAL).
            return;
        }
        let last = self.entries.len() - 1;
        // SAFETY: `last` is in bounds.
        let sg = unsafe { self.entries.as_mut_ptr().add(last) };
        match seg {
            // SAFETY: `addr` is kmalloc memory of `len` bytes owned by the request, which
            // outlives the chain (type invariant of `Request`).
            Segment::Kernel { addr, len } => unsafe {
                virtio::qcuda_glue_sg_set_buf(sg, addr.cast::<c_void>(), len)
            },
            // SAFETY: `page` is pinned by the request's `PinnedBuffer` for the chain's lifetime
            // and `offset..offset + len` is physically contiguous (see `build_runs`).
            Segment::Page { page, offset, len } => unsafe {
                virtio::qcuda_glue_sg_set_page(sg, page, len, offset)
            },
        }
    }

    /// The `struct scatterlist *sgs[]` argument of `virtqueue_add_sgs`.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut *mut bindings::scatterlist {
        self.ptrs.as_mut_ptr()
    }
}

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
//! A `Request` is shared (`Arc`) between the caller, the in-flight table of device.rs and the
//! ring (a chain's token is a reference to its request, see virtio.rs' `Vq`). The table keeps
//! its reference until the device has completed the chain and the result was collected, so the
//! memory the device may still write is never freed early, even when the caller gave up (signal,
//! async op), and never in the interrupt handler.

use kernel::{
    new_condvar,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, CondVar,
    },
    types::Opaque,
};

use crate::{
    user_buffer::UserBuffer,
    virtio::{Chain, Segment},
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
    /// Its slot in device.rs's in-flight table, while it has one; written and read with the
    /// queue lock held.
    slot: Atomic<usize>,
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
                slot: Atomic::new(usize::MAX),
                header,
                response,
                buffers,
            }),
            GFP_KERNEL,
        )
    }

    /// The slot of device.rs's in-flight table that holds this request.
    pub(crate) fn slot(&self) -> usize {
        self.slot.load(Relaxed)
    }

    /// Records the slot of device.rs's in-flight table that holds this request.
    pub(crate) fn set_slot(&self, idx: usize) {
        self.slot.store(idx, Relaxed);
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

    /// Builds the descriptor chain of `req`. Its scatterlists are only read while the chain is
    /// added to the ring, so it may be dropped as soon as [`Vq::add`](crate::virtio::Vq::add)
    /// returned; the ring keeps its own reference to `req`.
    pub(crate) fn chain(req: &Arc<Self>) -> Result<Chain<Self>> {
        let total = req.segment_count();
        let mut chain = Chain::new(req.clone(), total)?;
        let header = Segment::Kernel {
            addr: req.header.as_ptr(),
            len: REQUEST_HEADER_SIZE as u32,
        };
        // SAFETY: `header` is kmalloc memory owned by `req` (type invariant), the chain's owner;
        // the device only reads it.
        unsafe { chain.push(header, false) }?;
        let mut pushed = Ok(());
        for b in req.buffers.iter() {
            let device_writes = b.direction() == Direction::Out;
            b.for_each_segment(|s| {
                if pushed.is_ok() {
                    // SAFETY: Each segment is bounce or kernel memory owned by `req`, or pages
                    // its `PinnedBuffer` keeps pinned, physically contiguous per segment (see
                    // `build_runs`); `req` is the chain's owner. The device alone writes `Out`
                    // buffers while the chain is in flight: the caller copies them back only
                    // after completion.
                    pushed = unsafe { chain.push(s, device_writes) };
                }
            });
        }
        pushed?;
        let response = Segment::Kernel {
            addr: req.response.get().cast::<u8>(),
            len: RESPONSE_HEADER_SIZE as u32,
        };
        // SAFETY: `response` is kmalloc memory owned by `req`, written by the device only while
        // the chain is in flight and read by the CPU only after completion (type invariant).
        unsafe { chain.push(response, true) }?;
        if chain.descriptor_count() != total {
            return Err(EINVAL);
        }
        Ok(chain)
    }
}

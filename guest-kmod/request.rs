// SPDX-License-Identifier: GPL-2.0
//! One request in flight and its descriptor chain.
//!
//! ```text
//! [device-readable]  request header   (inside the request's own kmalloc allocation, session stamped)
//! [device-readable]  In buffers       (one descriptor per bounce buffer or pinned run)
//! [device-writable]  Out buffers      (likewise)
//! [device-writable]  response header  (inside the request's allocation, like the header)
//! ```
//!
//! A `Request` is shared (`Arc`) between the caller, the in-flight table of device.rs and the
//! ring (a chain's token is a reference to its request, see virtio.rs' `Vq`). The table keeps
//! its reference until the device has completed the chain and the result was collected, so the
//! memory the device may still write is never freed early, even when the caller gave up (signal,
//! async op), and never in the interrupt handler.
//!
//! A waited call's request comes back to its caller as the only reference once the call is
//! done; session.rs then [recycles](Request::recycle) it for the file's next call: the
//! allocation itself, and the bounce memory and page arrays of its buffers ([`BufferStorage`]),
//! so that a small call allocates nothing in the module (allocations cost microseconds each
//! under an emulated guest CPU).

use kernel::{
    new_condvar,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, CondVar, UniqueArc,
    },
    types::Opaque,
};

use crate::{
    user_buffer::{BufferStorage, UserBuffer},
    virtio::{Chain, Segment},
    wire::{
        ioctl::IoctlBuffer, status, Direction, RequestHeader, ResponseHeader, MAX_BUFFERS,
        REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE,
    },
};

/// A request: its header, its buffers and the response the device writes.
///
/// # Invariants
///
/// `header` and `response` live inside the request's `Arc` allocation, which is kmalloc memory
/// (linear-mapped), as the scatterlists require. `response` is written by the device only while
/// the chain is in flight, and read or rewritten by the CPU only after the device completed it
/// (or, when the request is reused, while its caller holds the only reference).
#[pin_data]
pub(crate) struct Request {
    /// Notified by the completion path when this request's chain is done or failed.
    #[pin]
    pub(crate) done: CondVar,
    /// Its slot in device.rs's in-flight table, while it has one; written and read with the
    /// queue lock held.
    slot: Atomic<usize>,
    /// The session (open file) the header names, for device.rs's per-session bound.
    session: u64,
    header: [u8; REQUEST_HEADER_SIZE],
    response: Opaque<[u8; RESPONSE_HEADER_SIZE]>,
    buffers: KVec<UserBuffer>,
    /// Memory of earlier calls' buffers, kept for the next call of the same file.
    storage: BufferStorage,
}

// SAFETY: The only interior mutability besides the `CondVar` (which is `Sync`) is `response`,
// which the device writes while the chain is in flight and the CPU reads only after completion,
// ordered by the queue lock (type invariant). The page pointers inside `buffers` are pinned
// pages, usable from any thread.
unsafe impl Sync for Request {}
// SAFETY: See `Sync`; nothing in a `Request` is tied to the thread that created it.
unsafe impl Send for Request {}

impl Request {
    /// An empty request (no buffers), to be filled by [`Self::fill`]; room for `MAX_BUFFERS`
    /// buffers is allocated now, so that a reused request never grows its table.
    pub(crate) fn empty() -> Result<Pin<UniqueArc<Self>>> {
        UniqueArc::pin_init(
            try_pin_init!(Self {
                done <- new_condvar!("qcuda_request"),
                slot: Atomic::new(usize::MAX),
                session: 0,
                header: [0; REQUEST_HEADER_SIZE],
                response: Opaque::new([0; RESPONSE_HEADER_SIZE]),
                buffers: KVec::with_capacity(MAX_BUFFERS, GFP_KERNEL)?,
                storage: BufferStorage::new(),
            }),
            GFP_KERNEL,
        )
    }

    /// Builds a request: encodes `header` and makes every user buffer reachable by the device
    /// (copying `In` bounce buffers now).
    pub(crate) fn new(header: &RequestHeader, bufs: &[IoctlBuffer]) -> Result<Arc<Self>> {
        let mut req = Self::empty()?;
        req.as_mut().fill(header, bufs)?;
        Ok(req.into())
    }

    /// Makes an empty (new or [recycled](Self::recycle)) request the request of one call:
    /// encodes `header`, prefills the response, and makes every user buffer reachable by the
    /// device (copying `In` bounce buffers now), reusing the memory that earlier calls left.
    /// On error the request is left to [`Self::recycle`].
    pub(crate) fn fill(
        self: Pin<&mut Self>,
        header: &RequestHeader,
        bufs: &[IoctlBuffer],
    ) -> Result {
        let this = self.project();
        if bufs.len() > MAX_BUFFERS {
            return Err(EINVAL);
        }
        *this.header = header.encode();
        *this.session = header.session;
        // A device that completes the chain without writing a response leaves this status.
        let prefill = ResponseHeader::with_status(status::UNKNOWN).encode();
        // SAFETY: The caller has the request exclusively (`Pin<&mut Self>`), so it is in no
        // ring and nobody reads or writes `response` concurrently.
        unsafe { this.response.get().write(prefill) };
        for b in bufs {
            let dir = Direction::from_u32(b.dir).ok_or(EINVAL)?;
            let buffer = UserBuffer::new(b.addr, b.len, dir, this.storage)?;
            // Cannot fail: room for MAX_BUFFERS was allocated with the request.
            this.buffers
                .push_within_capacity(buffer)
                .map_err(|_| EINVAL)?;
        }
        Ok(())
    }

    /// Empties a request whose call is over, for the next call of the same file: releases its
    /// buffers (unpinning pages) and keeps their memory. Process context (may sleep).
    pub(crate) fn recycle(self: Pin<&mut Self>) {
        let this = self.project();
        while let Some(b) = this.buffers.pop() {
            b.release(this.storage);
        }
        this.slot.store(usize::MAX, Relaxed);
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
        let mut req = Self::empty()?;
        req.as_mut().fill(header, &[])?;
        req.as_mut()
            .project()
            .buffers
            .push_within_capacity(UserBuffer::Kernel(pieces))
            .map_err(|_| EINVAL)?;
        Ok(req.into())
    }

    /// The slot of device.rs's in-flight table that holds this request.
    pub(crate) fn slot(&self) -> usize {
        self.slot.load(Relaxed)
    }

    /// The session (open file) this request is a call of; 0 for the module's own requests.
    pub(crate) fn session(&self) -> u64 {
        self.session
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
        // SAFETY: `header` is kmalloc memory inside `req` (type invariant), the chain's owner;
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
        // SAFETY: `response` is kmalloc memory inside `req`, written by the device only while
        // the chain is in flight and read by the CPU only after completion (type invariant).
        unsafe { chain.push(response, true) }?;
        if chain.descriptor_count() != total {
            return Err(EINVAL);
        }
        Ok(chain)
    }
}

// SPDX-License-Identifier: GPL-2.0
//! The virtio edge of qcuda.ko: safe types over the C virtio API, and the driver registration.
//!
//! Linux has no Rust virtio abstraction, so the few calls the driver needs are declared here by
//! hand (exported symbols) or wrapped in glue.c (macros and static inlines), and wrapped in the
//! safe types [`VirtioDev`], [`Vq`] and [`Chain`]. driver.rs (probe, remove, the callbacks) and
//! device.rs (the request queue) use these types; request.rs fills a [`Chain`] through its one
//! `unsafe` method, whose contract is the memory the chain describes. The page helpers of
//! glue.c (not virtio, but C all the same) are declared here too, and user_buffer.rs and
//! host_memory.rs call them directly, each call with its `SAFETY` argument. These types are
//! meant to be replaced by an upstream virtio abstraction once one exists.

use core::{marker::PhantomData, ptr::NonNull};

use kernel::{
    bindings,
    device::Device,
    error::to_result,
    ffi::{c_int, c_uint, c_ulong, c_void},
    prelude::*,
    sync::{aref::ARef, Arc},
    types::Opaque,
};

/// `struct virtio_device`, only ever handled by pointer.
#[repr(C)]
pub(crate) struct VirtioDevice {
    _opaque: [u8; 0],
}

/// `struct virtqueue`, only ever handled by pointer.
#[repr(C)]
pub(crate) struct Virtqueue {
    _opaque: [u8; 0],
}

// `struct page` and `struct device` are passed by pointer only; rustc cannot see that through
// bindgen's zero-sized members, hence the `allow`.
// Every function below is called with pointers that the virtio core handed to this driver
// (probe's `vdev`, the queues from find_vqs) or with memory the caller owns; each call site
// states why.
#[allow(improper_ctypes)]
extern "C" {
    // glue.c
    fn qcuda_glue_register() -> c_int;
    fn qcuda_glue_unregister();
    fn qcuda_glue_find_vqs(
        vdev: *mut VirtioDevice,
        requests: *mut *mut Virtqueue,
        events: *mut *mut Virtqueue,
    ) -> c_int;
    fn qcuda_glue_del_vqs(vdev: *mut VirtioDevice);
    fn qcuda_glue_device_ready(vdev: *mut VirtioDevice);
    fn qcuda_glue_has_indirect(vdev: *mut VirtioDevice) -> bool;
    fn qcuda_glue_set_priv(vdev: *mut VirtioDevice, data: *mut c_void);
    fn qcuda_glue_get_priv(vdev: *mut VirtioDevice) -> *mut c_void;
    fn qcuda_glue_device(vdev: *mut VirtioDevice) -> *mut bindings::device;
    fn qcuda_glue_sg_set_buf(sg: *mut bindings::scatterlist, buf: *const c_void, len: c_uint);
    fn qcuda_glue_sg_set_page(
        sg: *mut bindings::scatterlist,
        page: *mut bindings::page,
        len: c_uint,
        offset: c_uint,
    );
    fn qcuda_glue_sg_mark_end(sg: *mut bindings::scatterlist);
    pub(crate) fn qcuda_glue_page_to_pfn(page: *mut bindings::page) -> c_ulong;
    pub(crate) fn qcuda_glue_alloc_chunk(order: c_uint) -> *mut bindings::page;
    pub(crate) fn qcuda_glue_free_page(page: *mut bindings::page);
    fn qcuda_glue_fatal_signal_pending() -> bool;

    // drivers/virtio (exported)
    fn virtqueue_add_sgs(
        vq: *mut Virtqueue,
        sgs: *mut *mut bindings::scatterlist,
        out_sgs: c_uint,
        in_sgs: c_uint,
        data: *mut c_void,
        gfp: bindings::gfp_t,
    ) -> c_int;
    fn virtqueue_kick(vq: *mut Virtqueue) -> bool;
    fn virtqueue_get_buf(vq: *mut Virtqueue, len: *mut c_uint) -> *mut c_void;
    fn virtqueue_disable_cb(vq: *mut Virtqueue);
    fn virtqueue_enable_cb(vq: *mut Virtqueue) -> bool;
    fn virtqueue_detach_unused_buf(vq: *mut Virtqueue) -> *mut c_void;
    fn virtqueue_get_vring_size(vq: *const Virtqueue) -> c_uint;
    fn virtio_reset_device(vdev: *mut VirtioDevice);
}

/// A virtio device bound to this driver, borrowed for the duration of a driver callback
/// (probe, remove).
///
/// # Invariants
///
/// A `&VirtioDev` points to a live `struct virtio_device` that this driver is probing or has
/// bound; the reference does not outlive the callback that made it.
#[repr(transparent)]
pub(crate) struct VirtioDev(Opaque<VirtioDevice>);

impl VirtioDev {
    /// The device behind `ptr`, for the duration of the callback.
    ///
    /// # Safety
    ///
    /// `ptr` is the device of a probe or remove callback of this driver, and the returned
    /// reference is dropped before that callback returns.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut VirtioDevice) -> &'a Self {
        // SAFETY: `VirtioDev` is a transparent wrapper of the C struct; the pointer is valid
        // for the callback per the caller's guarantee.
        unsafe { &*ptr.cast::<Self>() }
    }

    fn as_raw(&self) -> *mut VirtioDevice {
        self.0.get()
    }

    /// The `struct device` of the virtio device, for logging; takes a reference.
    pub(crate) fn device(&self) -> ARef<Device> {
        // SAFETY: The virtio device is valid (type invariant), so is its embedded
        // `struct device`; `get_device` takes a reference of its own.
        unsafe { Device::get_device(qcuda_glue_device(self.as_raw())) }
    }

    /// Whether `VIRTIO_RING_F_INDIRECT_DESC` was negotiated.
    pub(crate) fn has_indirect(&self) -> bool {
        // SAFETY: The device is valid (type invariant).
        unsafe { qcuda_glue_has_indirect(self.as_raw()) }
    }

    /// Sets up queue 0 (requests, whose used-buffer callback is glue.c's, forwarded to
    /// `qcuda_rs_request_done`) and queue 1 (events, no callback).
    pub(crate) fn find_vqs<T>(&self) -> Result<Vqs<T>> {
        let mut requests: *mut Virtqueue = core::ptr::null_mut();
        let mut events: *mut Virtqueue = core::ptr::null_mut();
        // SAFETY: The device is valid (type invariant); the out pointers are valid.
        to_result(unsafe { qcuda_glue_find_vqs(self.as_raw(), &mut requests, &mut events) })?;
        let (Some(requests), Some(events)) = (NonNull::new(requests), NonNull::new(events)) else {
            // Unreachable: find_vqs sets up every queue that has a name. Deleting them here
            // is safe: no `Vq` exists for them.
            // SAFETY: The device is valid and nothing uses its queues.
            unsafe { qcuda_glue_del_vqs(self.as_raw()) };
            return Err(ENODEV);
        };
        // INVARIANT: Both queues were just set up on this device and are deleted only through
        // `del_vqs`, which consumes them.
        Ok(Vqs {
            requests: Vq::new(requests, self.as_raw()),
            events: Vq::new(events, self.as_raw()),
        })
    }

    /// Deletes the queues set up by [`Self::find_vqs`]. Chains still in them are forgotten:
    /// reset the device and take them back with [`Vq::detach_unused_buf`] first.
    pub(crate) fn del_vqs<T>(&self, vqs: Vqs<T>) {
        if vqs.requests.vdev != self.as_raw() || vqs.events.vdev != self.as_raw() {
            // Queues of another device: deleting ours would leave them dangling. Unreachable
            // (driver.rs only ever passes a device its own queues).
            return;
        }
        // SAFETY: The device is valid, and the only handles to its queues, `vqs`, are consumed
        // here, so nothing can use them afterwards.
        unsafe { qcuda_glue_del_vqs(self.as_raw()) };
    }

    /// Marks the device ready (`DRIVER_OK`): from here on it may use the queues and interrupt.
    pub(crate) fn ready(&self) {
        // SAFETY: The device is valid (type invariant).
        unsafe { qcuda_glue_device_ready(self.as_raw()) };
    }

    /// Resets the device: afterwards it neither reads nor writes guest memory nor raises
    /// interrupts, and callbacks that were running have finished. The returned proof lets
    /// [`Vq::detach_unused_buf`] take back what the device held.
    ///
    /// Nothing in this driver readies the device again after a reset (probe does, once).
    pub(crate) fn reset(&self) -> Reset<'_> {
        // SAFETY: The device is valid (type invariant).
        unsafe { virtio_reset_device(self.as_raw()) };
        Reset(self)
    }

    /// The driver's pointer in `vdev->priv`, which the request queue's callback receives.
    pub(crate) fn driver_data(&self) -> *mut c_void {
        // SAFETY: The device is valid (type invariant).
        unsafe { qcuda_glue_get_priv(self.as_raw()) }
    }

    /// Sets `vdev->priv`.
    ///
    /// # Safety
    ///
    /// `data` is null or stays valid for `qcuda_rs_request_done` until it is replaced here and
    /// the device has been reset (callbacks read it from interrupt context).
    pub(crate) unsafe fn set_driver_data(&self, data: *mut c_void) {
        // SAFETY: The device is valid (type invariant); the pointer's validity is the caller's.
        unsafe { qcuda_glue_set_priv(self.as_raw(), data) };
    }
}

/// Proof that a device was reset (see [`VirtioDev::reset`]).
pub(crate) struct Reset<'a>(&'a VirtioDev);

/// The two queues of the qcuda device.
pub(crate) struct Vqs<T> {
    /// Queue 0: requests.
    pub(crate) requests: Vq<T>,
    /// Queue 1: reserved for host-to-guest events; no buffers are posted to it yet.
    pub(crate) events: Vq<T>,
}

/// One virtqueue, whose chains carry an `Arc<T>` each: the owner of the memory the chain
/// describes, held by the ring until the chain comes back.
///
/// Virtio requires the operations on one queue to be serialised, and every method takes
/// `&mut self`: the owner keeps the `Vq` under its lock (device.rs: inside the `Queue` of a
/// `SpinLockIrq`), so a method can only be called through the lock guard.
///
/// # Invariants
///
/// `ptr` is a queue of the device `vdev`, set up by `find_vqs` and not deleted: it is deleted
/// only by [`VirtioDev::del_vqs`], which consumes the `Vq`. The token of every chain in the ring
/// is a pointer from `Arc::<T>::into_raw`.
pub(crate) struct Vq<T> {
    ptr: NonNull<Virtqueue>,
    vdev: *mut VirtioDevice,
    _owners: PhantomData<Arc<T>>,
}

// SAFETY: A virtqueue may be used from any CPU as long as the uses are serialised, which `&mut`
// does. The chains' owners (`Arc<T>`) move between threads with it.
unsafe impl<T: Send + Sync> Send for Vq<T> {}
// SAFETY: `&Vq` allows nothing (every method takes `&mut self`).
unsafe impl<T: Send + Sync> Sync for Vq<T> {}

impl<T> Vq<T> {
    fn new(ptr: NonNull<Virtqueue>, vdev: *mut VirtioDevice) -> Self {
        Self {
            ptr,
            vdev,
            _owners: PhantomData,
        }
    }

    /// Descriptors in the ring.
    pub(crate) fn size(&mut self) -> usize {
        // SAFETY: The queue is live (type invariant).
        unsafe { virtqueue_get_vring_size(self.ptr.as_ptr()) as usize }
    }

    /// Adds `chain` to the ring; the ring holds a reference to its owner until the chain comes
    /// back from [`Self::get_buf`] or [`Self::detach_unused_buf`]. ENOSPC when the ring is
    /// full, ENOMEM when no indirect table could be allocated.
    ///
    /// The indirect table is allocated atomically (`GFP_ATOMIC | __GFP_NOWARN`): a `Vq` is used
    /// under a spinlock.
    pub(crate) fn add(&mut self, chain: &mut Chain<T>) -> Result {
        let gfp = bindings::GFP_ATOMIC | bindings::__GFP_NOWARN;
        let (mut lists, out_sgs, in_sgs) = chain.lists();
        let token = Arc::into_raw(chain.owner.clone())
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: The queue is live and the call is serialised (`&mut self`). `lists` holds
        // `out_sgs` terminated lists of the chain's readable entries, then `in_sgs` of its
        // writable ones, which describe memory that stays valid while its owner lives (type
        // invariant of `Chain`); the ring holds the owner through `token` (non-null) until the
        // chain comes back.
        let ret = unsafe {
            virtqueue_add_sgs(
                self.ptr.as_ptr(),
                lists.as_mut_ptr(),
                out_sgs,
                in_sgs,
                token,
                gfp,
            )
        };
        if ret != 0 {
            // SAFETY: `token` came from `Arc::into_raw` above and the ring did not take it.
            drop(unsafe { Arc::from_raw(token.cast::<T>()) });
            return Err(Error::from_errno(ret));
        }
        Ok(())
    }

    /// Notifies the device of new chains (if it wants to be notified).
    pub(crate) fn kick(&mut self) -> bool {
        // SAFETY: The queue is live and the call is serialised (`&mut self`).
        unsafe { virtqueue_kick(self.ptr.as_ptr()) }
    }

    /// Takes the next chain the device completed off the used ring: its owner and the number
    /// of bytes the device says it wrote.
    pub(crate) fn get_buf(&mut self) -> Option<(Arc<T>, u32)> {
        let mut len: c_uint = 0;
        // SAFETY: The queue is live and the call is serialised (`&mut self`).
        let token = unsafe { virtqueue_get_buf(self.ptr.as_ptr(), &mut len) };
        if token.is_null() {
            return None;
        }
        // SAFETY: Every token in the ring came from `Arc::into_raw` in `add` (type invariant),
        // and the virtio core returns each exactly once.
        Some((unsafe { Arc::from_raw(token.cast::<T>()) }, len))
    }

    /// Turns the used-buffer callback off (a hint: it may still run once).
    pub(crate) fn disable_cb(&mut self) {
        // SAFETY: The queue is live and the call is serialised (`&mut self`).
        unsafe { virtqueue_disable_cb(self.ptr.as_ptr()) };
    }

    /// Turns the used-buffer callback on. False if completed chains are already waiting: the
    /// caller must take them with [`Self::get_buf`] instead of waiting for the callback.
    pub(crate) fn enable_cb(&mut self) -> bool {
        // SAFETY: The queue is live and the call is serialised (`&mut self`).
        unsafe { virtqueue_enable_cb(self.ptr.as_ptr()) }
    }

    /// Takes back one chain the device never completed. Needs the proof that this queue's
    /// device was reset: a live device might still write the memory of the chain.
    pub(crate) fn detach_unused_buf(&mut self, reset: &Reset<'_>) -> Option<Arc<T>> {
        if reset.0.as_raw() != self.vdev {
            // Another device was reset, not this one: the chains stay where they are.
            return None;
        }
        // SAFETY: The queue is live, the call is serialised (`&mut self`) and its device is
        // reset, so the device no longer touches the chain's memory.
        let token = unsafe { virtqueue_detach_unused_buf(self.ptr.as_ptr()) };
        if token.is_null() {
            return None;
        }
        // SAFETY: As in `get_buf`.
        Some(unsafe { Arc::from_raw(token.cast::<T>()) })
    }
}

/// Chains of at most this many descriptors keep their scatterlist on the stack: a header, one
/// descriptor for each of `MAX_BUFFERS` bounce buffers, and a response, so that a call's
/// chain costs no allocation unless it carries pinned pages.
const INLINE_ENTRIES: usize = crate::wire::MAX_BUFFERS + 2;

/// One descriptor chain being built: one scatterlist entry per descriptor, readable ones first,
/// and the owner of the memory they describe. The entries are chained by adjacency, so the
/// ring gets two lists (readable, writable) and no array of single-entry lists.
///
/// # Invariants
///
/// - The entries in use are the first `readable + writable` of `inline` (for a capacity of at
///   most [`INLINE_ENTRIES`]) or of `heap` (for more); `heap` never grows past the capacity
///   it was created with. Entries were zeroed when made, so none is marked as a list's end or
///   a link until [`Chain::lists`] marks the ends.
/// - The first `readable` entries are the device-readable ones.
/// - Every entry describes memory that stays valid while `owner` lives, and that nothing but
///   the device writes while the chain is in the ring (for writable entries).
pub(crate) struct Chain<T> {
    inline: [bindings::scatterlist; INLINE_ENTRIES],
    heap: KVVec<bindings::scatterlist>,
    capacity: usize,
    readable: c_uint,
    writable: c_uint,
    owner: Arc<T>,
}

/// What one descriptor of a [`Chain`] points to.
#[derive(Clone, Copy)]
pub(crate) enum Segment {
    /// Linear-mapped kernel memory (kmalloc).
    Kernel { addr: *const u8, len: u32 },
    /// `len` bytes from `offset` into `page`, physically contiguous.
    Page {
        page: *mut bindings::page,
        offset: u32,
        len: u32,
    },
}

impl<T> Chain<T> {
    /// An empty chain of at most `capacity` descriptors over memory that `owner` keeps valid.
    pub(crate) fn new(owner: Arc<T>, capacity: usize) -> Result<Self> {
        let heap = if capacity > INLINE_ENTRIES {
            let mut heap = KVVec::with_capacity(capacity, GFP_KERNEL)?;
            for _ in 0..capacity {
                heap.push_within_capacity(bindings::scatterlist::default())
                    .map_err(|_| EINVAL)?;
            }
            heap
        } else {
            KVVec::new()
        };
        Ok(Self {
            inline: core::array::from_fn(|_| bindings::scatterlist::default()),
            heap,
            capacity,
            readable: 0,
            writable: 0,
            owner,
        })
    }

    /// The entry storage in use (its length is the capacity).
    fn entries(&mut self) -> &mut [bindings::scatterlist] {
        if self.capacity > INLINE_ENTRIES {
            &mut self.heap
        } else {
            &mut self.inline[..self.capacity]
        }
    }

    /// Marks the end of the readable and of the writable entries, and returns the lists for
    /// `virtqueue_add_sgs`: their heads (readable first) and how many of each kind.
    fn lists(&mut self) -> ([*mut bindings::scatterlist; 2], c_uint, c_uint) {
        let (readable, writable) = (self.readable as usize, self.writable as usize);
        let entries = self.entries().as_mut_ptr();
        let mut lists = [core::ptr::null_mut(); 2];
        let mut n = 0;
        for (first, count) in [(0, readable), (readable, writable)] {
            if count > 0 {
                // SAFETY: `first + count <= readable + writable`, the entries in use (type
                // invariant), so both pointers are in bounds.
                let (head, last) = unsafe { (entries.add(first), entries.add(first + count - 1)) };
                // SAFETY: `last` is a valid entry.
                unsafe { qcuda_glue_sg_mark_end(last) };
                lists[n] = head;
                n += 1;
            }
        }
        (
            lists,
            c_uint::from(readable > 0),
            c_uint::from(writable > 0),
        )
    }

    /// The owner of the chain's memory.
    pub(crate) fn owner(&self) -> &Arc<T> {
        &self.owner
    }

    /// Descriptors added so far.
    pub(crate) fn descriptor_count(&self) -> usize {
        (self.readable + self.writable) as usize
    }

    /// Appends one descriptor, device-readable or device-writable. EINVAL past the capacity,
    /// or for a readable descriptor after a writable one.
    ///
    /// # Safety
    ///
    /// The memory `seg` describes stays valid while the chain's owner lives. For
    /// [`Segment::Kernel`] it is linear-mapped kernel memory; for [`Segment::Page`] the range
    /// lies within physically contiguous pages. If `device_writes`, nothing but the device
    /// writes it while the chain is in the ring.
    pub(crate) unsafe fn push(&mut self, seg: Segment, device_writes: bool) -> Result {
        if !device_writes && self.writable > 0 {
            return Err(EINVAL);
        }
        let next = self.descriptor_count();
        let sg: *mut bindings::scatterlist = self.entries().get_mut(next).ok_or(EINVAL)?;
        match seg {
            // SAFETY: `sg` is a valid entry; the memory is the caller's guarantee.
            Segment::Kernel { addr, len } => unsafe {
                qcuda_glue_sg_set_buf(sg, addr.cast::<c_void>(), len)
            },
            // SAFETY: As above.
            Segment::Page { page, offset, len } => unsafe {
                qcuda_glue_sg_set_page(sg, page, len, offset)
            },
        }
        if device_writes {
            self.writable += 1;
        } else {
            self.readable += 1;
        }
        Ok(())
    }
}

/// The registered `struct virtio_driver` (owned by glue.c) for the lifetime of the module.
///
/// # Invariants
///
/// The driver is registered while a value of this type exists.
pub(crate) struct DriverRegistration(());

impl DriverRegistration {
    /// Registers the driver; from here on the virtio core may call probe for device id 56
    /// (driver.rs).
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: Registering the static driver of glue.c; it is unregistered in `drop`.
        to_result(unsafe { qcuda_glue_register() })?;
        Ok(Self(()))
    }
}

impl Drop for DriverRegistration {
    fn drop(&mut self) {
        // SAFETY: Registered, by the type invariant. This calls remove for every bound device,
        // which completes or fails every request before it returns.
        unsafe { qcuda_glue_unregister() };
    }
}

// SAFETY: The registration is a token for global driver state; dropping it on another thread is
// allowed (unregister_virtio_driver may be called from any process context).
unsafe impl Send for DriverRegistration {}
// SAFETY: `&DriverRegistration` gives access to nothing.
unsafe impl Sync for DriverRegistration {}

/// Whether the calling task has been killed: SIGKILL is pending and it will not return to user
/// space. Its other signals do not count.
pub(crate) fn fatal_signal_pending() -> bool {
    // SAFETY: reads the current task's pending signals; callable from any process context.
    unsafe { qcuda_glue_fatal_signal_pending() }
}

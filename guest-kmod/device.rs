// SPDX-License-Identifier: GPL-2.0
//! The qcuda virtio device: the request queue, the table of requests the device holds,
//! completion, the host's stale sessions, and stopping on removal.
//!
//! Neighbours: driver.rs binds the device (probe, remove, the queue's interrupt) and calls in
//! here; virtio.rs is the C edge; request.rs is what gets queued; session.rs (one open file of
//! /dev/qcuda) is who queues. This file knows nothing of /dev/qcuda.
//!
//! Every request added to the ring owns a slot of the in-flight table; the slot index is the
//! virtqueue token, so completions may arrive in any order. The slot keeps a reference to the
//! request until the caller collects the result, or, when nobody waits any more (signal,
//! fire-and-forget op, close timeout), until `reap` frees it in process context: unpinning
//! pages may sleep, so nothing is ever freed in the interrupt handler.

use core::ptr;

use kernel::{
    bindings,
    device::Device,
    ffi::{c_uint, c_void},
    new_condvar, new_spinlock_irq,
    prelude::*,
    sync::{aref::ARef, Arc, CondVar, SpinLockIrq, SpinLockIrqGuard},
    time::{delay::fsleep, msecs_to_jiffies, Delta, Instant, Monotonic},
};

use crate::{
    request::{Request, SgList},
    virtio::{self, VirtioDevice, Virtqueue},
    wire::{Op, RequestHeader, ResponseHeader},
};

/// How long probe waits for the host to close the sessions of earlier driver instances. The
/// host answers once their worker processes are reaped (it gives up waiting after 10 s).
const DRIVER_RESET_TIMEOUT_MS: i64 = 30_000;

/// How long a caller that waits for its request polls the ring before it sleeps (ns).
const POLL_NS: i64 = 300_000;

/// What became of the request in a slot.
enum SlotState {
    /// Unused.
    Free,
    /// In the ring; its caller waits.
    Pending,
    /// Completed by the device; its caller collects it.
    Done,
    /// Taken back from a removed device; its caller collects the error.
    Failed(Error),
    /// In the ring, but nobody waits for it any more.
    Abandoned,
    /// Completed while abandoned; `reap` frees it.
    Reapable,
}

struct Slot {
    req: Option<Arc<Request>>,
    state: SlotState,
}

/// The request queue and the in-flight table.
///
/// # Invariants
///
/// - `vq` is the request virtqueue from `find_vqs`, or null once the device is being removed;
///   it is only used with the lock held, which serialises all operations on it as virtio
///   requires.
/// - `free` holds the indices of exactly the `Free` slots (its capacity is `slots.len()`).
/// - `in_ring` counts the `Pending` and `Abandoned` slots, `reapable` the `Reapable` ones.
struct Queue {
    vq: *mut Virtqueue,
    ready: bool,
    slots: KVec<Slot>,
    free: KVec<usize>,
    in_ring: usize,
    reapable: usize,
    space_waiters: usize,
    /// Callers sleeping until a completion: only while there are any does the device
    /// interrupt (the used-buffer callback is enabled); otherwise completions wait in the used
    /// ring until a caller takes them off (`drain_used`), which spares the guest an interrupt per
    /// fire-and-forget request and per polled completion.
    sleepers: usize,
}

// SAFETY: `vq` is only dereferenced (by the virtio core) with the lock held; the virtqueue may
// be used from any CPU.
unsafe impl Send for Queue {}

type QueueGuard<'a> = SpinLockIrqGuard<'a, Queue>;

/// How a caller waits for the device.
pub(crate) enum Wait {
    /// Until completion or a signal (then EINTR; the device keeps the request).
    Interruptible,
    /// Until completion or `timeout_ms` (then ETIMEDOUT), ignoring signals: used to close a
    /// session, which also happens while a killed process exits, and by probe.
    Uninterruptible { timeout_ms: i64 },
}

/// A snapshot of the in-flight table (for fdinfo).
pub(crate) struct QueueStats {
    /// Chains the device holds.
    pub(crate) in_ring: usize,
    /// Of those, chains nobody waits for.
    pub(crate) abandoned: usize,
    /// Completed abandoned requests not yet freed.
    pub(crate) reapable: usize,
    /// Unused slots.
    pub(crate) free_slots: usize,
}

/// One qcuda virtio device, shared by the driver binding and every open file.
#[pin_data]
pub(crate) struct QcudaDevice {
    #[pin]
    queue: SpinLockIrq<Queue>,
    /// Notified when a slot or ring space is freed.
    #[pin]
    space: CondVar,
    ring_size: usize,
    indirect: bool,
    max_segments: usize,
    dev: ARef<Device>,
}

/// Token passed to the virtio core for slot `idx`; never null.
fn token(idx: usize) -> *mut c_void {
    (idx + 1) as *mut c_void
}

impl QcudaDevice {
    /// The device state over the request queue `vq`, not ready yet (see [`Self::start`]).
    pub(crate) fn new(
        vq: *mut Virtqueue,
        ring_size: usize,
        indirect: bool,
        max_segments: usize,
        dev: ARef<Device>,
    ) -> Result<Arc<Self>> {
        let mut slots = KVec::with_capacity(ring_size, GFP_KERNEL)?;
        let mut free = KVec::with_capacity(ring_size, GFP_KERNEL)?;
        for i in 0..ring_size {
            slots.push(
                Slot {
                    req: None,
                    state: SlotState::Free,
                },
                GFP_KERNEL,
            )?;
            // Pop from the end: low indices first.
            free.push(ring_size - 1 - i, GFP_KERNEL)?;
        }
        let queue = Queue {
            vq,
            ready: false,
            slots,
            free,
            in_ring: 0,
            reapable: 0,
            space_waiters: 0,
            sleepers: 0,
        };
        Arc::pin_init(
            try_pin_init!(Self {
                queue <- new_spinlock_irq!(queue, "qcuda_queue"),
                space <- new_condvar!("qcuda_space"),
                ring_size,
                indirect,
                max_segments,
                dev,
            }),
            GFP_KERNEL,
        )
    }

    /// Once the device is ready (`DRIVER_OK`): requests may go out. No sleeper yet, so
    /// completions are taken by their callers (see `Queue::sleepers`).
    pub(crate) fn start(&self) {
        let mut q = self.queue.lock();
        q.ready = true;
        // SAFETY: `vq` is the live request queue and the lock is held.
        unsafe { virtio::virtqueue_disable_cb(q.vq) };
    }

    /// The virtio device's `struct device`, for logging.
    pub(crate) fn dev(&self) -> &ARef<Device> {
        &self.dev
    }

    /// Descriptors in the request ring.
    pub(crate) fn ring_size(&self) -> usize {
        self.ring_size
    }

    /// Whether indirect descriptors were negotiated.
    pub(crate) fn indirect(&self) -> bool {
        self.indirect
    }

    /// Counts of the in-flight table.
    pub(crate) fn stats(&self) -> QueueStats {
        self.reap();
        let q = self.queue.lock();
        QueueStats {
            in_ring: q.in_ring,
            abandoned: q
                .slots
                .iter()
                .filter(|s| matches!(s.state, SlotState::Abandoned))
                .count(),
            reapable: q.reapable,
            free_slots: q.free.len(),
        }
    }

    /// Most descriptors one chain may have.
    pub(crate) fn max_segments(&self) -> usize {
        self.max_segments
    }

    /// Queues `req`, waits for the device as `wait` says, and returns its response.
    pub(crate) fn execute(&self, req: &Arc<Request>, mut wait: Wait) -> Result<ResponseHeader> {
        let mut sg = req.scatterlists()?;
        let idx = self.submit(req, &mut sg, &mut wait)?;
        drop(sg);
        self.wait(idx, req, wait)?;
        req.response()
    }

    /// Queues `req` with nobody waiting for it (a fire-and-forget op).
    pub(crate) fn post(&self, req: &Arc<Request>) -> Result {
        let mut sg = req.scatterlists()?;
        let idx = self.submit(req, &mut sg, &mut Wait::Interruptible)?;
        drop(sg);
        let done = {
            let mut q = self.queue.lock();
            match q.slots.get_mut(idx) {
                Some(slot) if matches!(slot.state, SlotState::Pending) => {
                    slot.state = SlotState::Abandoned;
                    None
                }
                // Already completed (or failed): collect it now.
                Some(_) => Some(self.collect(&mut q, idx)),
                None => None,
            }
        };
        // Dropped here, unlocked: the request may hold pinned pages.
        drop(done);
        Ok(())
    }

    /// Adds `req` to the ring and kicks the device; waits for a slot or ring space if needed.
    fn submit(&self, req: &Arc<Request>, sg: &mut SgList, wait: &mut Wait) -> Result<usize> {
        let gfp = bindings::GFP_ATOMIC | bindings::__GFP_NOWARN;
        let started = Instant::<Monotonic>::now();
        let mut q = self.queue.lock();
        loop {
            if q.vq.is_null() || !q.ready {
                return Err(ENODEV);
            }
            if let Some(idx) = q.free.pop() {
                // SAFETY: `vq` is valid while non-null and we hold the lock (type invariant of
                // `Queue`). `sg` holds `readable + writable` valid single-entry lists that point
                // to memory `req` owns or pins; the slot keeps `req` alive until the device is
                // done with it. The token is non-null. The indirect table is allocated
                // atomically since we hold a spinlock.
                let ret = unsafe {
                    virtio::virtqueue_add_sgs(
                        q.vq,
                        sg.as_mut_ptr(),
                        sg.readable,
                        sg.writable,
                        token(idx),
                        gfp,
                    )
                };
                if ret == 0 {
                    if let Some(slot) = q.slots.get_mut(idx) {
                        slot.req = Some(req.clone());
                        slot.state = SlotState::Pending;
                    }
                    q.in_ring += 1;
                    // SAFETY: As above.
                    unsafe { virtio::virtqueue_kick(q.vq) };
                    return Ok(idx);
                }
                // Cannot fail: the slot was just taken out of `free`.
                let _ = q.free.push_within_capacity(idx);
                let err = Error::from_errno(ret);
                if err != ENOSPC && err != ENOMEM {
                    return Err(err);
                }
                if q.in_ring == 0 {
                    // No completion will ever make room (e.g. no memory for the indirect
                    // table of a long chain).
                    return Err(ENOMEM);
                }
            }
            if !q.vq.is_null() {
                // Completions may wait in the used ring (no interrupt while nobody sleeps).
                self.drain_used(&mut q);
                if !q.free.is_empty() {
                    continue;
                }
            }
            if q.reapable > 0 {
                // Completed fire-and-forget requests hold slots until someone frees them; the
                // caller that waits for a slot must, or nobody may (all 256 abandoned).
                drop(q);
                self.reap();
                q = self.queue.lock();
                continue;
            }
            q.space_waiters += 1;
            let slept;
            (q, slept) = self.sleep(&self.space, q, wait, &started);
            q.space_waiters = q.space_waiters.saturating_sub(1);
            slept?;
        }
    }

    /// Waits until slot `idx` (holding `req`) is completed or failed and collects it.
    fn wait(&self, idx: usize, req: &Arc<Request>, mut wait: Wait) -> Result {
        let started = Instant::<Monotonic>::now();
        let mut q = self.queue.lock();
        loop {
            match q.slots.get(idx).map(|s| &s.state) {
                Some(SlotState::Pending) => {}
                Some(SlotState::Done) | Some(SlotState::Failed(_)) => {
                    let (devref, result) = self.collect(&mut q, idx);
                    drop(q);
                    // Not the last reference (the caller holds `req`), but drop it unlocked
                    // all the same.
                    drop(devref);
                    return result;
                }
                // Only this caller moves its slot out of `Pending`.
                _ => return Err(EINVAL),
            }
            if matches!(wait, Wait::Interruptible)
                && started.elapsed().as_nanos() < POLL_NS
                && !kernel::current!().signal_pending()
            {
                // Most calls complete within a round trip: take the completion off the ring
                // here instead of paying for the interrupt's wake-up and a reschedule.
                if !q.vq.is_null() && q.ready {
                    self.drain_used(&mut q);
                }
                if matches!(q.slots.get(idx).map(|s| &s.state), Some(SlotState::Pending)) {
                    drop(q);
                    core::hint::spin_loop();
                    q = self.queue.lock();
                }
                continue;
            }
            let slept;
            (q, slept) = self.sleep(&req.done, q, &mut wait, &started);
            if let Err(e) = slept {
                if let Some(slot) = q.slots.get_mut(idx) {
                    if matches!(slot.state, SlotState::Pending) {
                        // The device still owns the chain: leave it the request.
                        slot.state = SlotState::Abandoned;
                        return Err(e);
                    }
                }
                // Completed meanwhile: return the result after all.
            }
        }
    }

    /// Sleeps on `cv` with the queue unlocked; returns with it locked again.
    fn sleep<'a>(
        &'a self,
        cv: &CondVar,
        mut q: QueueGuard<'a>,
        wait: &mut Wait,
        started: &Instant<Monotonic>,
    ) -> (QueueGuard<'a>, Result) {
        match wait {
            Wait::Interruptible => {
                if !self.arm(&mut q) {
                    // Completions arrived meanwhile and were taken: the caller looks again.
                    self.disarm(&mut q);
                    return (q, Ok(()));
                }
                let signal = cv.wait_interruptible(&mut q);
                self.disarm(&mut q);
                (q, if signal { Err(EINTR) } else { Ok(()) })
            }
            Wait::Uninterruptible { timeout_ms } => {
                const SLICE_MS: u32 = 10;
                if started.elapsed().as_millis() >= *timeout_ms {
                    return (q, Err(ETIMEDOUT));
                }
                if !kernel::current!().signal_pending() {
                    // Woken by the notification, or after a slice to check the deadline.
                    if self.arm(&mut q) {
                        let _ =
                            cv.wait_interruptible_timeout(&mut q, msecs_to_jiffies(SLICE_MS * 10));
                    }
                    self.disarm(&mut q);
                    return (q, Ok(()));
                }
                // A killed task keeps its fatal signal pending while its files are released,
                // so interruptible sleeps would return at once: poll in short slices.
                drop(q);
                fsleep(Delta::from_millis(i64::from(SLICE_MS)));
                let mut q = self.queue.lock();
                if !q.vq.is_null() && q.ready {
                    self.drain_used(&mut q);
                }
                (q, Ok(()))
            }
        }
    }

    /// Before a caller sleeps: makes completions interrupt. Returns false if used buffers were
    /// already waiting (they are taken off the ring now): the caller must look again instead of
    /// sleeping, and call [`Self::disarm`] either way.
    fn arm(&self, q: &mut Queue) -> bool {
        q.sleepers += 1;
        if q.vq.is_null() || !q.ready {
            // Stopping: `stop` wakes every sleeper.
            return true;
        }
        // SAFETY: `vq` is valid and the lock is held.
        if unsafe { virtio::virtqueue_enable_cb(q.vq) } {
            return true;
        }
        self.drain_used(q);
        false
    }

    /// After a sleep (or an [`Self::arm`] that found completions): the last sleeper turns the
    /// interrupt off again.
    fn disarm(&self, q: &mut Queue) {
        q.sleepers = q.sleepers.saturating_sub(1);
        if q.sleepers == 0 && !q.vq.is_null() {
            // SAFETY: `vq` is valid and the lock is held.
            unsafe { virtio::virtqueue_disable_cb(q.vq) };
        }
    }

    /// Frees slot `idx` (`Done` or `Failed`) and returns the device's reference to its request,
    /// to be dropped after unlocking, and the outcome.
    fn collect(&self, q: &mut Queue, idx: usize) -> (Option<Arc<Request>>, Result) {
        let Some(slot) = q.slots.get_mut(idx) else {
            return (None, Err(EINVAL));
        };
        let result = match core::mem::replace(&mut slot.state, SlotState::Free) {
            SlotState::Failed(e) => Err(e),
            _ => Ok(()),
        };
        let devref = slot.req.take();
        // Cannot fail: `free` has room for every slot.
        let _ = q.free.push_within_capacity(idx);
        if q.space_waiters > 0 {
            self.space.notify_all();
        }
        (devref, result)
    }

    /// Records the device's completion (or the removal's failure) of the chain `token`.
    fn finish(&self, q: &mut Queue, token: *mut c_void, outcome: SlotState) {
        let idx = (token as usize).wrapping_sub(1);
        let Some(slot) = q.slots.get_mut(idx) else {
            return;
        };
        match slot.state {
            SlotState::Pending => {
                slot.state = outcome;
                if let Some(req) = &slot.req {
                    req.done.notify_all();
                }
            }
            SlotState::Abandoned => {
                slot.state = SlotState::Reapable;
                q.reapable += 1;
            }
            // Not a chain of ours in the ring; the virtio core validates ids, so unreachable.
            _ => return,
        }
        q.in_ring = q.in_ring.saturating_sub(1);
        if q.space_waiters > 0 {
            self.space.notify_all();
        }
    }

    /// Takes every completed chain off the ring.
    fn drain_used(&self, q: &mut Queue) {
        loop {
            let mut len: c_uint = 0;
            // SAFETY: `vq` is valid and the lock is held (checked by the callers).
            let token = unsafe { virtio::virtqueue_get_buf(q.vq, &mut len) };
            if token.is_null() {
                return;
            }
            self.finish(q, token, SlotState::Done);
        }
    }

    /// Used-buffer notification of the request queue (interrupt context, from driver.rs).
    pub(crate) fn complete(&self) {
        let mut guard = self.queue.lock();
        let q = &mut *guard;
        if q.vq.is_null() {
            return;
        }
        loop {
            // SAFETY: `vq` is valid and the lock is held.
            unsafe { virtio::virtqueue_disable_cb(q.vq) };
            self.drain_used(q);
            if q.sleepers == 0 {
                // Nobody sleeps: the next completions wait in the ring for a caller.
                return;
            }
            // SAFETY: As above.
            if unsafe { virtio::virtqueue_enable_cb(q.vq) } {
                return;
            }
        }
    }

    /// Frees the requests that completed after their callers gave up. Process context.
    pub(crate) fn reap(&self) {
        {
            // Completions nobody was interrupted for.
            let mut guard = self.queue.lock();
            let q = &mut *guard;
            if !q.vq.is_null() && q.ready {
                self.drain_used(q);
            }
        }
        loop {
            let devref = {
                let mut guard = self.queue.lock();
                let q = &mut *guard;
                if q.reapable == 0 {
                    return;
                }
                let Some(idx) = q
                    .slots
                    .iter()
                    .position(|s| matches!(s.state, SlotState::Reapable))
                else {
                    q.reapable = 0;
                    return;
                };
                q.reapable -= 1;
                if let Some(slot) = q.slots.get_mut(idx) {
                    slot.state = SlotState::Done;
                }
                self.collect(q, idx).0
            };
            // Unlocked: this may unpin pages.
            drop(devref);
        }
    }

    /// Has the host close every session it still holds for this device: they belong to earlier
    /// driver instances, since this one has none yet. The host answers once they are closed,
    /// with their number in rets[0]; a host that predates the op answers `NOT_SUPPORTED`.
    pub(crate) fn reset_host_sessions(&self) -> Result<ResponseHeader> {
        // Session 0 is no session (ids start at 1); the host ignores it for this op.
        let req = Request::new(&RequestHeader::new(Op::DriverReset), &[])?;
        self.execute(
            &req,
            Wait::Uninterruptible {
                timeout_ms: DRIVER_RESET_TIMEOUT_MS,
            },
        )
    }

    /// Stops the queue: resets the device, fails every waiter with ENODEV and deletes the
    /// queues. Open files keep the (dead) device until they are closed; `reap` frees what the
    /// device still held.
    ///
    /// `vdev` is the device of this state, being removed (or failing probe).
    pub(crate) fn stop(&self, vdev: *mut VirtioDevice) {
        self.queue.lock().ready = false;
        // SAFETY: `vdev` is the device being removed. After the reset the device neither
        // writes guest memory nor raises interrupts, and running callbacks have finished.
        unsafe { virtio::virtio_reset_device(vdev) };
        {
            let mut guard = self.queue.lock();
            let q = &mut *guard;
            if !q.vq.is_null() {
                self.drain_used(q);
                loop {
                    // SAFETY: `vq` is valid, the lock is held and the device is reset.
                    let token = unsafe { virtio::virtqueue_detach_unused_buf(q.vq) };
                    if token.is_null() {
                        break;
                    }
                    self.finish(q, token, SlotState::Failed(ENODEV));
                }
                q.vq = ptr::null_mut();
            }
            self.space.notify_all();
        }
        // SAFETY: The queues are no longer used (`vq` is null under the lock).
        unsafe { virtio::qcuda_glue_del_vqs(vdev) };
    }
}

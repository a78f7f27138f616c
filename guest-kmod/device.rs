// SPDX-License-Identifier: GPL-2.0
//! The qcuda virtio device: the request queue, the table of requests the device holds,
//! completion, the host's stale sessions, and stopping on removal.
//!
//! Neighbours: driver.rs binds the device (probe, remove, the queue's interrupt) and calls in
//! here; virtio.rs provides the safe queue type ([`Vq`]); request.rs is what gets queued;
//! session.rs (one open file of /dev/qcuda) is who queues. This file holds no `unsafe` and
//! knows nothing of the C API or of /dev/qcuda.
//!
//! Every request added to the ring owns a slot of the in-flight table, and knows its index; the
//! ring's token is a reference to the request, so completions may arrive in any order. The slot
//! keeps a reference to the request until the caller collects the result, or, when nobody waits
//! any more (signal, fire-and-forget op, close timeout), until `reap` frees it in process
//! context: unpinning pages may sleep, so nothing is ever freed in the interrupt handler (the
//! ring's reference, dropped there, is never the last).

use kernel::{
    device::Device,
    new_condvar, new_spinlock_irq,
    prelude::*,
    sync::{aref::ARef, Arc, CondVar, SpinLockIrq, SpinLockIrqGuard},
    time::{delay::fsleep, msecs_to_jiffies, Delta, Instant, Monotonic},
};

use crate::{
    request::Request,
    virtio::{Chain, VirtioDev, Vq, Vqs},
    wire::{Op, RequestHeader, ResponseHeader, WaitMode, MAX_CHAIN_SEGMENTS},
};

/// How long probe waits for the host to close the sessions of earlier driver instances. The
/// host answers once their worker processes are reaped (it gives up waiting after 10 s).
const DRIVER_RESET_TIMEOUT_MS: i64 = 30_000;

/// How long a caller that waits for its request polls the ring before it sleeps (ns).
const POLL_NS: i64 = 300_000;

/// Most fire-and-forget requests of one session (open file) in the ring at once. A process
/// whose requests the host holds (paused, locked by `cuCheckpointProcessLock`, or behind a long
/// synchronisation) that keeps posting waits here, as CUDA's launch queue makes a launching
/// thread wait, instead of filling the ring that the VM's other processes share: a quarter of
/// the ring is left to them at the least. guest-lib posts batches of up to 64 KiB of records,
/// so this many is deep enough for any stream of work.
pub(crate) const MAX_POSTED_PER_SESSION: usize = 64;

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
/// - `vqs` are the device's queues from `find_vqs`, or `None` once the device is being removed
///   (or before probe attached them). Living inside the lock, they are only used with it held,
///   which serialises all operations on them as virtio requires.
/// - The token of every chain in the request queue is a request that a `Pending` or
///   `Abandoned` slot holds, at the index the request records.
/// - `free` holds the indices of exactly the `Free` slots (its capacity is `slots.len()`).
/// - `in_ring` counts the `Pending` and `Abandoned` slots, `reapable` the `Reapable` ones.
struct Queue {
    vqs: Option<Vqs<Request>>,
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

impl Queue {
    /// The request queue, unless the device is being removed.
    fn requests(&mut self) -> Option<&mut Vq<Request>> {
        self.vqs.as_mut().map(|vqs| &mut vqs.requests)
    }
}

type QueueGuard<'a> = SpinLockIrqGuard<'a, Queue>;

/// How a caller waits for the device.
pub(crate) enum Wait {
    /// Until completion or a signal: then EINTR if the request was not queued yet (it never
    /// reaches the device), EINPROGRESS if it was (the device keeps it and it runs; only its
    /// answer is lost), so that the caller knows which.
    /// `poll_ns`: how long it polls the ring before it sleeps (`i64::MAX`: until completion).
    Interruptible { poll_ns: i64 },
    /// Until completion or `timeout_ms` (then ETIMEDOUT), ignoring signals: used to close a
    /// session, which also happens while a killed process exits, and by probe.
    Uninterruptible { timeout_ms: i64 },
    /// As `Uninterruptible`, but a task that has been killed stops waiting (EINTR; the device
    /// keeps the request): for `HostMap` and `HostUnmap`, which wait behind the session's
    /// queued work, and that work may wait for a host function only the dying process would
    /// have run. The caller keeps what the request concerns until the session is closed.
    Killable { timeout_ms: i64 },
}

impl Wait {
    /// Interruptible, polling for [`POLL_NS`] before it sleeps.
    pub(crate) const fn interruptible() -> Self {
        Self::Interruptible { poll_ns: POLL_NS }
    }

    /// Interruptible, waiting as the caller asked (`CALL_WAIT_*`).
    pub(crate) const fn for_mode(mode: WaitMode) -> Self {
        Self::Interruptible {
            poll_ns: match mode {
                WaitMode::Poll => POLL_NS,
                // Preemptible kernel: the poll loop drops the queue lock between looks, so a
                // task that needs this CPU gets it.
                WaitMode::Spin => i64::MAX,
                WaitMode::Block => 0,
            },
        }
    }
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

impl QcudaDevice {
    /// Sets up the queues of `vdev` and the device state over them, not ready yet (see
    /// [`Self::start`]).
    pub(crate) fn new(vdev: &VirtioDev) -> Result<Arc<Self>> {
        let mut vqs = vdev.find_vqs()?;
        let ring_size = vqs.requests.size();
        let indirect = vdev.has_indirect();
        // Without indirect descriptors a chain longer than the ring trips a WARN in virtio_ring.
        let max_segments = if indirect {
            MAX_CHAIN_SEGMENTS
        } else {
            ring_size
        };
        let dev = vdev.device();
        if ring_size == 0 {
            vdev.del_vqs(vqs);
            return Err(ENODEV);
        }
        match Self::with_slots(ring_size, indirect, max_segments, dev) {
            Ok(device) => {
                device.queue.lock().vqs = Some(vqs);
                Ok(device)
            }
            Err(e) => {
                vdev.del_vqs(vqs);
                Err(e)
            }
        }
    }

    /// The device state with an empty in-flight table of `ring_size` slots and no queues.
    fn with_slots(
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
            vqs: None,
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
        let mut guard = self.queue.lock();
        let q = &mut *guard;
        q.ready = true;
        if let Some(vq) = q.requests() {
            vq.disable_cb();
        }
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

    /// Fire-and-forget requests of `session` in the ring now.
    pub(crate) fn posted(&self, session: u64) -> usize {
        Self::posted_by(&self.queue.lock(), session)
    }

    /// Most descriptors one chain may have.
    pub(crate) fn max_segments(&self) -> usize {
        self.max_segments
    }

    /// Queues `req`, waits for the device as `wait` says, and returns its response.
    pub(crate) fn execute(&self, req: &Arc<Request>, wait: Wait) -> Result<ResponseHeader> {
        self.execute_timed(req, wait, &mut 0)
    }

    /// [`Self::execute`], adding to `submit_ns` the nanoseconds spent building the chain and
    /// adding it to the ring (the rest of the call is the wait).
    pub(crate) fn execute_timed(
        &self,
        req: &Arc<Request>,
        mut wait: Wait,
        submit_ns: &mut u64,
    ) -> Result<ResponseHeader> {
        let started = Instant::<Monotonic>::now();
        let mut chain = Request::chain(req)?;
        let idx = self.submit(&mut chain, &mut wait)?;
        drop(chain);
        *submit_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.wait(idx, req, wait)?;
        req.response()
    }

    /// Queues `req` with nobody waiting for it (a fire-and-forget op), once its session has
    /// fewer than [`MAX_POSTED_PER_SESSION`] of them in the ring.
    pub(crate) fn post(&self, req: &Arc<Request>) -> Result {
        let mut wait = Wait::interruptible();
        self.wait_posted_below_bound(req.session(), &mut wait)?;
        let mut chain = Request::chain(req)?;
        let idx = self.submit(&mut chain, &mut wait)?;
        drop(chain);
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

    /// Fire-and-forget requests of `session` in the ring (nobody waits for them).
    fn posted_by(q: &Queue, session: u64) -> usize {
        // No session can be at the bound while the whole ring holds fewer: the common case
        // costs no scan.
        if q.in_ring < MAX_POSTED_PER_SESSION {
            return 0;
        }
        q.slots
            .iter()
            .filter(|s| {
                matches!(s.state, SlotState::Abandoned)
                    && s.req.as_deref().is_some_and(|r| r.session() == session)
            })
            .count()
    }

    /// Waits (as `wait` says: a signal ends it with `EINTR`, nothing queued) until `session`
    /// has fewer than [`MAX_POSTED_PER_SESSION`] fire-and-forget requests in the ring.
    fn wait_posted_below_bound(&self, session: u64, wait: &mut Wait) -> Result {
        let started = Instant::<Monotonic>::now();
        let mut q = self.queue.lock();
        loop {
            if !q.ready {
                return Err(ENODEV);
            }
            if Self::posted_by(&q, session) < MAX_POSTED_PER_SESSION {
                return Ok(());
            }
            // Completions may wait in the used ring (no interrupt while nobody sleeps).
            self.drain_used(&mut q);
            if Self::posted_by(&q, session) < MAX_POSTED_PER_SESSION {
                return Ok(());
            }
            // Every completion notifies `space` while someone waits on it.
            q.space_waiters += 1;
            let slept;
            (q, slept) = self.sleep(&self.space, q, wait, &started);
            q.space_waiters = q.space_waiters.saturating_sub(1);
            slept?;
        }
    }

    /// Adds the chain of a request to the ring and kicks the device; waits for a slot or ring
    /// space if needed.
    fn submit(&self, chain: &mut Chain<Request>, wait: &mut Wait) -> Result<usize> {
        let req = chain.owner().clone();
        let started = Instant::<Monotonic>::now();
        let mut q = self.queue.lock();
        loop {
            let queue = &mut *q;
            let Some(vq) = queue.vqs.as_mut().map(|vqs| &mut vqs.requests) else {
                return Err(ENODEV);
            };
            if !queue.ready {
                return Err(ENODEV);
            }
            if let Some(idx) = queue.free.pop() {
                // The ring holds `req` until the chain comes back; `finish` finds the slot by
                // this index.
                req.set_slot(idx);
                match vq.add(chain) {
                    Ok(()) => {
                        if let Some(slot) = queue.slots.get_mut(idx) {
                            slot.req = Some(req);
                            slot.state = SlotState::Pending;
                        }
                        queue.in_ring += 1;
                        vq.kick();
                        return Ok(idx);
                    }
                    Err(err) => {
                        // Cannot fail: the slot was just taken out of `free`.
                        let _ = queue.free.push_within_capacity(idx);
                        if err != ENOSPC && err != ENOMEM {
                            return Err(err);
                        }
                        if queue.in_ring == 0 {
                            // No completion will ever make room (e.g. no memory for the
                            // indirect table of a long chain).
                            return Err(ENOMEM);
                        }
                    }
                }
            }
            // Completions may wait in the used ring (no interrupt while nobody sleeps).
            self.drain_used(&mut q);
            if !q.free.is_empty() {
                continue;
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
            let poll_ns = match wait {
                Wait::Interruptible { poll_ns } => poll_ns,
                _ => 0,
            };
            if poll_ns > 0
                && started.elapsed().as_nanos() < poll_ns
                && !kernel::current!().signal_pending()
            {
                // Most calls complete within a round trip: take the completion off the ring
                // here instead of paying for the interrupt's wake-up and a reschedule.
                if q.ready {
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
                        // Queued, so it runs: say so, unlike a signal before the queueing.
                        if matches!(wait, Wait::Interruptible { .. }) && e == EINTR {
                            return Err(EINPROGRESS);
                        }
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
            Wait::Interruptible { .. } => {
                if !self.arm(&mut q) {
                    // Completions arrived meanwhile and were taken: the caller looks again.
                    self.disarm(&mut q);
                    return (q, Ok(()));
                }
                let signal = cv.wait_interruptible(&mut q);
                self.disarm(&mut q);
                (q, if signal { Err(EINTR) } else { Ok(()) })
            }
            Wait::Uninterruptible { timeout_ms } | Wait::Killable { timeout_ms } => {
                const SLICE_MS: u32 = 10;
                if started.elapsed().as_millis() >= *timeout_ms {
                    return (q, Err(ETIMEDOUT));
                }
                if matches!(wait, Wait::Killable { .. }) && crate::virtio::fatal_signal_pending() {
                    return (q, Err(EINTR));
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
                if q.ready {
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
        if !q.ready {
            // Stopping: `stop` wakes every sleeper.
            return true;
        }
        let Some(vq) = q.requests() else {
            // Stopping, likewise.
            return true;
        };
        if vq.enable_cb() {
            return true;
        }
        self.drain_used(q);
        false
    }

    /// After a sleep (or an [`Self::arm`] that found completions): the last sleeper turns the
    /// interrupt off again.
    fn disarm(&self, q: &mut Queue) {
        q.sleepers = q.sleepers.saturating_sub(1);
        if q.sleepers == 0 {
            if let Some(vq) = q.requests() {
                vq.disable_cb();
            }
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

    /// Records the device's completion (or the removal's failure) of the chain of `req`, and
    /// drops the ring's reference to it (never the last: the slot holds one).
    fn finish(&self, q: &mut Queue, req: Arc<Request>, outcome: SlotState) {
        let Some(slot) = q.slots.get_mut(req.slot()) else {
            return;
        };
        if !slot.req.as_deref().is_some_and(|r| core::ptr::eq(r, &*req)) {
            // Not the slot's request; the queue's invariant makes this unreachable. Never risk
            // freeing a request here, in the interrupt handler.
            core::mem::forget(req);
            return;
        }
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

    /// Takes every completed chain off the ring (none once the device is being removed).
    fn drain_used(&self, q: &mut Queue) {
        while let Some((req, _len)) = q.requests().and_then(|vq| vq.get_buf()) {
            self.finish(q, req, SlotState::Done);
        }
    }

    /// Used-buffer notification of the request queue (interrupt context, from driver.rs).
    pub(crate) fn complete(&self) {
        let mut guard = self.queue.lock();
        let q = &mut *guard;
        loop {
            let Some(vq) = q.requests() else {
                return;
            };
            vq.disable_cb();
            self.drain_used(q);
            if q.sleepers == 0 {
                // Nobody sleeps: the next completions wait in the ring for a caller.
                return;
            }
            if q.requests().is_none_or(|vq| vq.enable_cb()) {
                return;
            }
        }
    }

    /// Frees the requests that completed after their callers gave up. Process context.
    pub(crate) fn reap(&self) {
        loop {
            let devref = {
                let mut guard = self.queue.lock();
                let q = &mut *guard;
                // Completions nobody was interrupted for.
                if q.ready {
                    self.drain_used(q);
                }
                // Most calls find nothing to free: one lock and out.
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
    pub(crate) fn stop(&self, vdev: &VirtioDev) {
        self.queue.lock().ready = false;
        // Unlocked: the reset waits for running callbacks, which take the lock.
        let reset = vdev.reset();
        let vqs = {
            let mut guard = self.queue.lock();
            let q = &mut *guard;
            let mut vqs = q.vqs.take();
            if let Some(vqs) = vqs.as_mut() {
                while let Some((req, _len)) = vqs.requests.get_buf() {
                    self.finish(q, req, SlotState::Done);
                }
                while let Some(req) = vqs.requests.detach_unused_buf(&reset) {
                    self.finish(q, req, SlotState::Failed(ENODEV));
                }
            }
            self.space.notify_all();
            vqs
        };
        if let Some(vqs) = vqs {
            vdev.del_vqs(vqs);
        }
    }
}

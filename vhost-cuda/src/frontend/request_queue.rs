//! qcuda.ko's request queue (guest-kmod/device.rs and request.rs), in a host process: slots for
//! the requests in flight, chains laid out as the module lays them out, and its two ways of
//! waiting for an answer.
//!
//! Each of the ring's [`QUEUE_SIZE`] slots owns [`SLOT_BYTES`] of guest RAM: the request header,
//! the response, the chain's indirect descriptor table, and [`SLOT_BOUNCE`] bytes of bounce
//! memory for the request's buffers (qcuda.ko copies buffers up to `BOUNCE_THRESHOLD` into
//! kmalloc memory; larger ones it pins, which a host process has no use for). Linux's virtio
//! ring puts a chain of more than one segment in an indirect table when the device offers
//! them, so a chain takes one ring descriptor, the slot's own: head = slot index.
//!
//! Waiting ([`QueueWait`]): qcuda.ko polls the used ring for 300 µs and then sleeps until the
//! completion interrupt; `cudaDeviceScheduleBlockingSync` sleeps at once. Here an interrupt
//! thread per queue plays the guest's interrupt handler: it sleeps on the call eventfd, takes
//! the completions off the used ring and wakes the sleepers, and the device is asked to
//! interrupt only while someone sleeps (event indices), as qcuda.ko does.

use std::{
    io,
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use qcuda_proto::{
    status, Direction, RequestHeader, ResponseHeader, BOUNCE_THRESHOLD, QUEUE_SIZE,
    REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE,
};
use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use vm_memory::{Bytes, GuestAddress};

use super::{
    connection::{GuestVm, RING_AREA},
    error::{FrontendError, Result},
    split_ring::{write_desc, SplitRing},
};

/// Bounce memory of one slot: what qcuda.ko copies instead of pinning.
pub const SLOT_BOUNCE: u64 = BOUNCE_THRESHOLD;
/// Guest RAM of one slot: a page for the header, the response and the indirect table, then the
/// bounce memory.
pub const SLOT_BYTES: u64 = 0x1000 + SLOT_BOUNCE;
const RESPONSE_AT: u64 = 256;
const TABLE_AT: u64 = 512;
/// Descriptors of one chain: the header, up to `MAX_BUFFERS` buffers, the response.
const MAX_DESCS: u64 = 2 + qcuda_proto::MAX_BUFFERS as u64;
const _: () = assert!(RESPONSE_AT >= REQUEST_HEADER_SIZE as u64);
const _: () = assert!(TABLE_AT >= RESPONSE_AT + RESPONSE_HEADER_SIZE as u64);
const _: () = assert!(TABLE_AT + 16 * MAX_DESCS <= 0x1000);

/// How a caller waits for its answer (qcuda-proto's `WaitMode`, as qcuda.ko implements it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueWait {
    /// Poll the used ring for this long, then sleep until the interrupt (qcuda.ko's default
    /// is 300 µs; `Duration::MAX` polls until the answer comes, `CALL_WAIT_SPIN`).
    Poll(Duration),
    /// Sleep at once until the interrupt (`CALL_WAIT_BLOCK`): the device signals the call
    /// eventfd and the interrupt thread wakes the caller.
    Block,
}

impl QueueWait {
    /// qcuda.ko's default: poll for 300 µs, then sleep.
    pub const DEFAULT: Self = Self::Poll(Duration::from_micros(300));
}

/// A response, the bytes of the `Out` buffers, and the chain's used length.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The response header.
    pub resp: ResponseHeader,
    /// The `Out` buffers, concatenated.
    pub out: Vec<u8>,
    /// What the device reported as written.
    pub used_len: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    /// In the ring; its caller waits.
    Pending,
    /// Completed with this used length; its caller collects it.
    Done(u32),
    /// In the ring; nobody waits (fire-and-forget, or the caller gave up).
    Abandoned,
}

struct State {
    ring: SplitRing,
    slots: Vec<Slot>,
    free: Vec<u16>,
    sleepers: usize,
}

/// Counters of one queue.
#[derive(Debug, Default, Clone, Copy)]
pub struct QueueStats {
    /// Chains added.
    pub chains: u64,
    /// Kicks the device asked for (the guest's exits to QEMU, under KVM).
    pub kicks: u64,
    /// Call eventfd signals the interrupt thread took (the guest's interrupts).
    pub interrupts: u64,
}

struct Shared {
    vm: Arc<GuestVm>,
    slots_at: u64,
    state: Mutex<State>,
    /// Callers sleeping for their answer.
    done: Condvar,
    /// Callers waiting for a free slot.
    space: Condvar,
    stop: AtomicBool,
    chains: AtomicU64,
    kicks: AtomicU64,
    interrupts: AtomicU64,
}

/// qcuda.ko's request queue on queue 0 of a [`GuestVm`]. Shared by the threads that play guest
/// processes (`&self` everywhere); dropping it stops its interrupt thread.
pub struct RequestQueue {
    shared: Arc<Shared>,
    irq: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RequestQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestQueue")
            .field("slots_at", &self.shared.slots_at)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RequestQueue {
    /// The request queue of `vm` (queue 0), its slots in guest RAM from `slots_at`
    /// (`QUEUE_SIZE` * [`SLOT_BYTES`] bytes). Needs indirect descriptors, as qcuda.ko uses
    /// them; starts the interrupt thread.
    pub fn start(vm: Arc<GuestVm>, slots_at: u64) -> Result<Self> {
        if !vm.indirect() {
            return Err(FrontendError::Missing("indirect descriptors"));
        }
        let end = slots_at + u64::from(QUEUE_SIZE) * SLOT_BYTES;
        if slots_at < RING_AREA || end > vm.ram_bytes() {
            return Err(FrontendError::Memory(format!(
                "slots at {slots_at:#x}..{end:#x} do not fit guest RAM above the rings"
            )));
        }
        // The interrupt thread sleeps in read(2) on the call eventfd.
        let call = vm.calls[0].as_raw_fd();
        // SAFETY: fcntl on a descriptor `vm` owns; no memory is passed.
        let flags = unsafe { libc::fcntl(call, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(call, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
            return Err(FrontendError::Io {
                what: "making the call eventfd blocking",
                source: io::Error::last_os_error(),
            });
        }
        let mut ring = SplitRing::new(0, vm.event_idx());
        // Nobody sleeps yet: no interrupts (qcuda.ko's probe does the same).
        ring.disable_cb(&vm.mem)?;
        let shared = Arc::new(Shared {
            vm,
            slots_at,
            state: Mutex::new(State {
                ring,
                slots: vec![Slot::Free; usize::from(QUEUE_SIZE)],
                free: (0..QUEUE_SIZE).rev().collect(),
                sleepers: 0,
            }),
            done: Condvar::new(),
            space: Condvar::new(),
            stop: AtomicBool::new(false),
            chains: AtomicU64::new(0),
            kicks: AtomicU64::new(0),
            interrupts: AtomicU64::new(0),
        });
        let irq_shared = shared.clone();
        let irq = thread::Builder::new()
            .name("qcuda-fe-irq".into())
            .spawn(move || irq_shared.interrupt_thread())
            .map_err(|source| FrontendError::Io {
                what: "starting the interrupt thread",
                source,
            })?;
        Ok(Self {
            shared,
            irq: Some(irq),
        })
    }

    /// The guest this queue belongs to.
    pub fn vm(&self) -> &Arc<GuestVm> {
        &self.shared.vm
    }

    /// The queue's counters so far.
    pub fn stats(&self) -> QueueStats {
        QueueStats {
            chains: self.shared.chains.load(Ordering::Relaxed),
            kicks: self.shared.kicks.load(Ordering::Relaxed),
            interrupts: self.shared.interrupts.load(Ordering::Relaxed),
        }
    }

    /// Sends `h` with `input` (the bytes of its `In` buffers, in table order) and waits as
    /// `wait` says, at most `timeout`. The `Out` buffers' lengths come from the header.
    pub fn call(
        &self,
        h: &RequestHeader,
        input: &[u8],
        wait: QueueWait,
        timeout: Duration,
    ) -> Result<Reply> {
        let slot = self.shared.submit(h, input, Slot::Pending)?;
        self.shared.wait(slot, h, input.len(), wait, timeout)
    }

    /// Sends `h` with `input` and returns once it is in the ring: nobody waits for it (a
    /// fire-and-forget request; its slot is freed when the device completes it).
    pub fn post(&self, h: &RequestHeader, input: &[u8]) -> Result<()> {
        self.shared.submit(h, input, Slot::Abandoned).map(|_| ())
    }
}

impl Drop for RequestQueue {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the interrupt thread's read.
        let _ = self.shared.vm.calls[0].write(1);
        if let Some(t) = self.irq.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn slot_base(&self, slot: u16) -> u64 {
        self.slots_at + u64::from(slot) * SLOT_BYTES
    }

    /// Lays out and queues one request; its slot.
    fn submit(&self, h: &RequestHeader, input: &[u8], state: Slot) -> Result<u16> {
        let bufs = h.buffers();
        let (in_total, out_total) = bufs.iter().fold((0u64, 0u64), |(i, o), b| {
            if b.dir == Direction::In as u32 {
                (i + b.len, o)
            } else {
                (i, o + b.len)
            }
        });
        if in_total != input.len() as u64 {
            return Err(FrontendError::TooLarge(format!(
                "{} input bytes for In buffers of {in_total}",
                input.len()
            )));
        }
        if in_total + out_total > SLOT_BOUNCE {
            return Err(FrontendError::TooLarge(format!(
                "{} bytes of buffers, {SLOT_BOUNCE} of bounce memory",
                in_total + out_total
            )));
        }
        let slot = self.take_slot()?;
        let mem = &self.vm.mem;
        let base = self.slot_base(slot);
        let bounce = base + 0x1000;
        let ok = (|| -> Result<()> {
            mem.write_slice(&h.encode(), GuestAddress(base))
                .map_err(FrontendError::memory)?;
            // A device that completes the chain without a response leaves this (request.rs).
            mem.write_slice(
                &ResponseHeader::with_status(status::UNKNOWN).encode(),
                GuestAddress(base + RESPONSE_AT),
            )
            .map_err(FrontendError::memory)?;
            mem.write_slice(input, GuestAddress(bounce))
                .map_err(FrontendError::memory)?;
            // header, each non-empty buffer (In first: the table's order), response.
            let mut descs: Vec<(u64, u64, bool)> = Vec::with_capacity(bufs.len() + 2);
            descs.push((base, REQUEST_HEADER_SIZE as u64, false));
            let mut at = bounce;
            for b in bufs {
                if b.len > 0 {
                    descs.push((at, b.len, b.dir == Direction::Out as u32));
                }
                at += b.len;
            }
            descs.push((base + RESPONSE_AT, RESPONSE_HEADER_SIZE as u64, true));
            let n = descs.len();
            for (i, &(addr, len, writes)) in descs.iter().enumerate() {
                let mut flags = if writes { VRING_DESC_F_WRITE } else { 0 };
                if i + 1 < n {
                    flags |= VRING_DESC_F_NEXT;
                }
                write_desc(
                    mem,
                    base + TABLE_AT + 16 * i as u64,
                    addr,
                    u32::try_from(len).unwrap_or(u32::MAX),
                    u16::try_from(flags).unwrap_or(0),
                    u16::try_from(i + 1).unwrap_or(0),
                )?;
            }
            let table_len = u32::try_from(16 * n).unwrap_or(0);
            let mut st = lock(&self.state);
            st.ring.write_desc(
                mem,
                slot,
                base + TABLE_AT,
                table_len,
                u16::try_from(VRING_DESC_F_INDIRECT).unwrap_or(0),
                0,
            )?;
            st.slots[usize::from(slot)] = state;
            let kick = st.ring.publish(mem, slot)?;
            self.chains.fetch_add(1, Ordering::Relaxed);
            if kick {
                self.kicks.fetch_add(1, Ordering::Relaxed);
                self.vm.kicks[0]
                    .write(1)
                    .map_err(|source| FrontendError::Io {
                        what: "kick",
                        source,
                    })?;
            }
            Ok(())
        })();
        if let Err(e) = ok {
            let mut st = lock(&self.state);
            if st.slots[usize::from(slot)] == Slot::Free {
                st.free.push(slot);
            }
            return Err(e);
        }
        Ok(slot)
    }

    /// A free slot, waiting for one while all are in the ring.
    fn take_slot(&self) -> Result<u16> {
        let mut st = lock(&self.state);
        loop {
            if let Some(s) = st.free.pop() {
                return Ok(s);
            }
            // Completions may wait in the used ring (no interrupt while nobody sleeps).
            self.drain_used(&mut st)?;
            if !st.free.is_empty() {
                continue;
            }
            st.sleepers += 1;
            if st.ring.enable_cb(&self.vm.mem)? {
                st = self
                    .space
                    .wait_timeout(st, Duration::from_millis(10))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            st.sleepers -= 1;
            if st.sleepers == 0 {
                st.ring.disable_cb(&self.vm.mem)?;
            }
        }
    }

    /// Takes every completed chain off the used ring.
    fn drain_used(&self, st: &mut State) -> Result<()> {
        let mut freed = false;
        while let Some((id, len)) = st.ring.pop_used(&self.vm.mem)? {
            let slot = u16::try_from(id)
                .ok()
                .filter(|&s| s < QUEUE_SIZE)
                .ok_or_else(|| FrontendError::Device(format!("used id {id} is no chain")))?;
            match st.slots[usize::from(slot)] {
                Slot::Pending => st.slots[usize::from(slot)] = Slot::Done(len),
                Slot::Abandoned => {
                    st.slots[usize::from(slot)] = Slot::Free;
                    st.free.push(slot);
                    freed = true;
                }
                Slot::Free | Slot::Done(_) => {
                    return Err(FrontendError::Device(format!(
                        "chain {slot} used twice or never added"
                    )))
                }
            }
        }
        if freed {
            self.space.notify_all();
        }
        Ok(())
    }

    /// Waits for slot `slot`'s answer and frees the slot.
    fn wait(
        &self,
        slot: u16,
        h: &RequestHeader,
        in_len: usize,
        wait: QueueWait,
        timeout: Duration,
    ) -> Result<Reply> {
        let started = Instant::now();
        let poll = match wait {
            QueueWait::Poll(d) => d,
            QueueWait::Block => Duration::ZERO,
        };
        let idx = usize::from(slot);
        let mut st = lock(&self.state);
        let used_len = loop {
            if let Slot::Done(len) = st.slots[idx] {
                break len;
            }
            let elapsed = started.elapsed();
            if elapsed >= timeout {
                st.slots[idx] = Slot::Abandoned;
                return Err(FrontendError::Timeout(timeout));
            }
            if elapsed < poll {
                // Most calls complete within a round trip: take the completion off the ring
                // here instead of paying for the interrupt and a wake-up.
                self.drain_used(&mut st)?;
                if st.slots[idx] == Slot::Pending {
                    drop(st);
                    std::hint::spin_loop();
                    st = lock(&self.state);
                }
                continue;
            }
            st.sleepers += 1;
            if st.ring.enable_cb(&self.vm.mem)? {
                st = self
                    .done
                    .wait_timeout(st, timeout.saturating_sub(elapsed))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            } else {
                self.drain_used(&mut st)?;
            }
            st.sleepers -= 1;
            if st.sleepers == 0 {
                st.ring.disable_cb(&self.vm.mem)?;
            }
        };
        drop(st);
        // The slot stays ours (`Done`) until its response and outputs are read.
        let reply = self.read_reply(slot, h, in_len, used_len);
        let mut st = lock(&self.state);
        st.slots[idx] = Slot::Free;
        st.free.push(slot);
        drop(st);
        self.space.notify_all();
        reply
    }

    fn read_reply(
        &self,
        slot: u16,
        h: &RequestHeader,
        in_len: usize,
        used_len: u32,
    ) -> Result<Reply> {
        let base = self.slot_base(slot);
        let out_len = h
            .buffers()
            .iter()
            .filter(|b| b.dir == Direction::Out as u32)
            .map(|b| b.len)
            .sum::<u64>();
        let mut out = vec![0u8; usize::try_from(out_len).unwrap_or(0)];
        let mem = &self.vm.mem;
        mem.read_slice(&mut out, GuestAddress(base + 0x1000 + in_len as u64))
            .map_err(FrontendError::memory)?;
        let mut b = [0u8; RESPONSE_HEADER_SIZE];
        mem.read_slice(&mut b, GuestAddress(base + RESPONSE_AT))
            .map_err(FrontendError::memory)?;
        let resp = ResponseHeader::decode(&b)
            .map_err(|e| FrontendError::Device(format!("response: {e:?}")))?;
        Ok(Reply {
            resp,
            out,
            used_len,
        })
    }

    /// The guest's interrupt handler (device.rs' `complete`): woken by the call eventfd, takes
    /// the completions and wakes the sleepers; turns interrupts off again when nobody sleeps.
    fn interrupt_thread(&self) {
        let fd = &self.vm.calls[0];
        loop {
            let signalled = fd.read();
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if signalled.is_err() {
                // EINTR, or the eventfd went bad: look again after a moment.
                thread::sleep(Duration::from_millis(1));
                continue;
            }
            self.interrupts.fetch_add(1, Ordering::Relaxed);
            let mut st = lock(&self.state);
            loop {
                if st.ring.disable_cb(&self.vm.mem).is_err() || self.drain_used(&mut st).is_err() {
                    break;
                }
                if st.sleepers == 0 || st.ring.enable_cb(&self.vm.mem).unwrap_or(true) {
                    break;
                }
            }
            drop(st);
            self.done.notify_all();
            self.space.notify_all();
        }
    }
}

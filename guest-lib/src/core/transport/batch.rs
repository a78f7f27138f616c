//! Batching fire-and-forget work: many launches, event records and small async copies and
//! memsets travel to the host as one `Batch` request.
//!
//! A fire-and-forget call of a batchable op (qcuda-proto's `BATCHABLE`) is appended to the
//! process's batch as a record, its small in-data copied at once (so the caller may reuse its
//! buffer, as with a single request), and returns. The batch is sent, fire-and-forget itself:
//! - before any other request of the process is sent (so requests keep program order, across
//!   threads too: whatever one thread enqueued before another thread's call is sent first),
//! - when it is full (64 KiB, what qcuda.ko copies into bounce memory),
//! - and by a flusher thread once nothing was added for [`FLUSH_AFTER`], so work reaches the
//!   GPU without a later call, e.g. while the program polls mapped memory a kernel writes.
//!   (While the program keeps adding, the batch fills and goes out by size.)
//!
//! A synchronising call without buffers (qcuda-proto's `BATCH_TAIL`: `cudaDeviceSynchronize`,
//! `cudaStreamSynchronize`, `cudaStreamQuery`, `cudaEventSynchronize`, `cudaEventQuery`) that
//! finds work gathered does not send it first and then itself: it travels as the batch's last
//! record, in one waited request ([`Batcher::send_ahead_of`]), so a launch followed by a
//! synchronisation costs one round trip.
//!
//! The host runs the records in order, each as the single fire-and-forget request it stands
//! for; a failure is reported like theirs, at the next waited-for call (the tail's own reply
//! when there is one).
//!
//! Order: every batch is sent under `send`, taken before the state lock and held until the
//! request is queued, so batches reach the device in the order their records were taken. A
//! waited batch holds it until its answer (the ioctl does not return earlier): meanwhile other
//! threads keep appending, and a thread that must send (a full batch, its own call) waits, as
//! its request would wait behind the synchronisation on the host anyway. Only `HostFuncWait`,
//! which the host answers beside the others, never sends the batch (session.rs), so a
//! synchronisation that waits for a host function cannot block the thread that runs it.

use crate::core::conv::usize_of;
use std::{
    sync::{
        atomic::{AtomicI32, AtomicU64, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{
    BatchRecord, Direction, Op, BATCHABLE, BATCH_TAIL, BOUNCE_THRESHOLD, MAX_BATCH_DATA,
};

use crate::{
    core::transport::{Call, Transport},
    core::warnings::warn_once,
};

/// Most bytes of one batch: qcuda.ko copies a buffer this small, so the batch can be sent
/// fire-and-forget.
pub const BATCH_BYTES: usize = usize_of(BOUNCE_THRESHOLD);
/// How long a batch may sit without a new record before the flusher sends it.
pub const FLUSH_AFTER: Duration = Duration::from_micros(FLUSH_AFTER_US);
const FLUSH_AFTER_US: u64 = 200;
/// While the process is active the flusher looks every [`FLUSHER_TICK`] without being woken
/// (a wake-up per batch would cost a context switch per launch-and-synchronise); after this long
/// without any record it sleeps until the next one wakes it.
const FLUSHER_PARKS_AFTER: Duration = Duration::from_millis(50);
/// How often the active flusher looks at an empty batch: a record added then waits at most
/// about this long plus [`FLUSH_AFTER`] for a flush nobody else makes.
const FLUSHER_TICK: Duration = Duration::from_millis(1);

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    /// The buffer of the batch last sent, cleared, for the next one to reuse.
    spare: Vec<u8>,
    records: u64,
    /// Device of the first record (the batch request's device field; records carry their own).
    device: u32,
    /// When the newest record was appended (`None` while the batch is empty).
    since: Option<Instant>,
    flusher_started: bool,
    /// The flusher sleeps until woken (the process was idle).
    flusher_parked: bool,
    /// When the last record was appended, empty batch or not.
    last_append: Option<Instant>,
}

struct Shared {
    transport: Arc<dyn Transport>,
    /// Held by whoever sends a batch, from taking its records until the request is queued
    /// (see the module documentation); taken before `state`.
    send: Mutex<()>,
    state: Mutex<State>,
    wake: Condvar,
    /// [`FLUSH_AFTER`], save in tests that count batches and must not race the flusher.
    flush_after_us: AtomicU64,
    /// errno of a batch the device did not take (0: none): reported once, at the next call.
    /// Outside `state`, so that every call's look at it is one load and no lock.
    lost: AtomicI32,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send_lock(&self) -> MutexGuard<'_, ()> {
        self.send.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends what is gathered; whether there was anything. The caller holds `send`; the state
    /// lock is held throughout too (a fire-and-forget ioctl returns once the request is queued).
    fn flush_locked(&self, st: &mut State) -> bool {
        if st.records == 0 {
            return false;
        }
        let mut call = Call::new(Op::Batch, st.device)
            .args(&[st.records])
            .input(&st.buf)
            .fire_and_forget();
        // A fire-and-forget call is queued and returns, so a signal can only stop it before.
        let sent = self.execute_until_queued(&mut call);
        if let Err(errno) = sent {
            warn_once!(
                "a batch of {} fire-and-forget requests was not taken by /dev/qcuda: {}",
                st.records,
                std::io::Error::from_raw_os_error(errno)
            );
            // The first loss is the one reported.
            let _ = self
                .lost
                .compare_exchange(0, errno, Ordering::AcqRel, Ordering::Relaxed);
        }
        st.buf.clear();
        st.records = 0;
        st.since = None;
        true
    }

    /// Executes `call`, again whenever a signal stopped it before qcuda.ko queued it (`EINTR`:
    /// it never reached the device).
    fn execute_until_queued(&self, call: &mut Call<'_>) -> Result<(), i32> {
        loop {
            match self.transport.execute(call) {
                Err(libc::EINTR) => continue,
                r => return r,
            }
        }
    }

    /// Takes the gathered records out, leaving an empty batch: (records, first device, bytes).
    fn take(st: &mut State) -> (u64, u32, Vec<u8>) {
        let spare = std::mem::take(&mut st.spare);
        let buf = std::mem::replace(&mut st.buf, spare);
        let records = std::mem::take(&mut st.records);
        st.since = None;
        (records, st.device, buf)
    }
}

/// What [`Batcher::send_ahead_of`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahead {
    /// Nothing was gathered.
    Nothing,
    /// The gathered work went out as a fire-and-forget batch of its own.
    Flushed,
    /// The call travelled as the gathered batch's last record; the transport's result.
    Carried(Result<(), i32>),
}

/// The process's batch. See the module documentation.
pub struct Batcher {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.state();
        f.debug_struct("Batcher")
            .field("records", &st.records)
            .field("bytes", &st.buf.len())
            .finish()
    }
}

impl Batcher {
    /// A batch sent through `transport`.
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        Self {
            shared: Arc::new(Shared {
                transport,
                send: Mutex::new(()),
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                flush_after_us: AtomicU64::new(FLUSH_AFTER_US),
                lost: AtomicI32::new(0),
            }),
        }
    }

    /// Appends `call` if it can travel in a batch (a batchable op, fire-and-forget, at most one
    /// small `In` buffer); returns whether it did.
    pub fn try_append(&self, call: &Call<'_>) -> bool {
        let raw = call.raw();
        let Some(op) = call.op() else { return false };
        if !call.is_fire_and_forget() || !BATCHABLE.contains(&op) {
            return false;
        }
        let bufs = &raw.bufs[..raw.nbufs as usize];
        let (ins, outs) = op.shape();
        if outs != 0 || bufs.len() != ins || bufs.iter().any(|b| b.dir != Direction::In as u32) {
            return false;
        }
        let data: &[u8] = match bufs.first() {
            Some(b) if b.len > u64::from(MAX_BATCH_DATA) => return false,
            // SAFETY: `Call`'s invariant: its In buffers stay readable while it lives, and it
            // outlives this function.
            Some(b) => unsafe {
                std::slice::from_raw_parts(usize_of(b.addr) as *const u8, usize_of(b.len))
            },
            None => &[],
        };
        let Ok(in_len) = u32::try_from(data.len()) else {
            return false;
        };
        let rec = BatchRecord {
            op: raw.op,
            device: raw.device,
            in_len,
            args: raw.args,
        };
        let shared = &self.shared;
        let mut st = shared.state();
        if st.buf.len() + rec.footprint() > BATCH_BYTES {
            // Sending takes `send` first: let go of the state, queue behind any sender.
            drop(st);
            let _send = shared.send_lock();
            st = shared.state();
            if st.buf.len() + rec.footprint() > BATCH_BYTES {
                shared.flush_locked(&mut st);
            }
        }
        if st.records == 0 {
            st.device = raw.device;
        }
        let now = Instant::now();
        st.since = Some(now);
        st.last_append = Some(now);
        st.buf.extend_from_slice(&rec.encode());
        st.buf.extend_from_slice(data);
        let padded = st.buf.len().next_multiple_of(8);
        st.buf.resize(padded, 0);
        st.records += 1;
        if !st.flusher_started {
            st.flusher_started = true;
            let shared = Arc::clone(shared);
            if thread::Builder::new()
                .name("qcuda-batch".into())
                .spawn(move || flusher(&shared))
                .is_err()
            {
                // Without the flusher the batch still goes out with the next call or when full.
                warn_once!("cannot start the batch flusher thread");
            }
        }
        if st.flusher_parked {
            st.flusher_parked = false;
            shared.wake.notify_one();
        }
        true
    }

    /// Test hook: the flusher waits this long, not [`FLUSH_AFTER`], so that a test counting
    /// batches on a loaded machine decides itself when work goes out.
    #[cfg(test)]
    pub fn set_flush_after(&self, after: Duration) {
        let us = u64::try_from(after.as_micros()).unwrap_or(u64::MAX);
        self.shared.flush_after_us.store(us, Ordering::Relaxed);
        self.shared.wake.notify_one();
    }

    /// Sends what is gathered, now; whether there was anything.
    pub fn flush(&self) -> bool {
        let _send = self.shared.send_lock();
        let mut st = self.shared.state();
        self.shared.flush_locked(&mut st)
    }

    /// Whether `call` may end a batch: a waited synchronising call without buffers.
    fn can_end_batch(call: &Call<'_>) -> bool {
        !call.is_fire_and_forget()
            && call.raw().nbufs == 0
            && call.op().is_some_and(|op| BATCH_TAIL.contains(&op))
    }

    /// Sends what is gathered ahead of `call`, which is not batched itself: carried by `call`
    /// as its batch's last record when `call` can end a batch ([`Self::can_end_batch`]; then
    /// `call` receives the reply), else as a batch of its own before it.
    ///
    /// Signals stay deliverable. A carrying batch interrupted before qcuda.ko queued it
    /// (`EINTR`) is sent again; one interrupted after (`EINPROGRESS`: its records run, its
    /// answer is lost) comes back as that error, and the caller sends `call`, a synchronising
    /// call that may run twice, alone for its answer.
    pub fn send_ahead_of(&self, call: &mut Call<'_>) -> Ahead {
        let shared = &self.shared;
        let _send = shared.send_lock();
        let mut st = shared.state();
        if st.records == 0 {
            return Ahead::Nothing;
        }
        if !Self::can_end_batch(call) {
            shared.flush_locked(&mut st);
            return Ahead::Flushed;
        }
        let (records, device, mut buf) = Shared::take(&mut st);
        // Appending goes on meanwhile; `send` keeps later batches behind this one.
        drop(st);
        let raw = call.raw();
        let tail = BatchRecord {
            op: raw.op,
            device: raw.device,
            in_len: 0,
            args: raw.args,
        };
        buf.extend_from_slice(&tail.encode());
        // The batch ends with the caller's call, so it waits as that call would have.
        let mut batch = Call::new(Op::Batch, device)
            .args(&[records + 1])
            .input(&buf)
            .wait_as(call.wait_mode());
        let sent = shared.execute_until_queued(&mut batch);
        if sent.is_ok() {
            let reply = batch.raw();
            let (status, flags, rets) = (reply.status, reply.resp_flags, reply.rets);
            let out = call.raw_mut();
            out.status = status;
            out.resp_flags = flags;
            out.rets = rets;
        }
        buf.clear();
        let mut st = shared.state();
        if st.spare.capacity() < buf.capacity() {
            st.spare = buf;
        }
        Ahead::Carried(sent)
    }

    /// The errno of a batch the device did not take since the last call, once.
    pub fn take_lost(&self) -> Option<i32> {
        let lost = &self.shared.lost;
        if lost.load(Ordering::Relaxed) == 0 {
            return None;
        }
        Some(lost.swap(0, Ordering::AcqRel)).filter(|&e| e != 0)
    }
}

/// Sends a batch that got no new record for [`FLUSH_AFTER`].
fn flusher(shared: &Shared) {
    let mut st = shared.state();
    loop {
        match st.since {
            None if st
                .last_append
                .is_none_or(|t| t.elapsed() >= FLUSHER_PARKS_AFTER) =>
            {
                st.flusher_parked = true;
                while st.flusher_parked {
                    st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            }
            None => {
                st = shared
                    .wake
                    .wait_timeout(st, FLUSHER_TICK)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            Some(since) => {
                let after = Duration::from_micros(shared.flush_after_us.load(Ordering::Relaxed));
                let due = since + after;
                let now = Instant::now();
                if now >= due {
                    // Sending takes `send` first (a waited batch may hold it a while).
                    drop(st);
                    let send = shared.send_lock();
                    st = shared.state();
                    if st.since.is_some_and(|s| s + after <= Instant::now()) {
                        shared.flush_locked(&mut st);
                    }
                    drop(send);
                } else {
                    st = shared
                        .wake
                        .wait_timeout(st, due - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
}

//! What the parts of a VM's session table share: the table's state ([`Shared`]: its sessions'
//! handles, counters, guest memory map, accounting), each session's handle and the messages its
//! thread takes ([`SessionHandle`], [`Msg`]), a request on its way ([`Job`]) and a transition
//! of CUDA's process checkpoint ([`Transition`]). These hold each other, so they are one file;
//! the table (table.rs), the threads (thread.rs) and the rest build on them.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        mpsc::{SendError, Sender},
        Arc, Condvar, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use qcuda_proto::{status, Op, ResponseHeader};
use tracing::warn;
use vmm_sys_util::eventfd::EventFd;

use super::{
    account::{SessionAccount, VmTotals},
    handover::Piece,
    locking::lock,
    migration::SavedGpu,
    process_checkpoint::ProcessState,
};
use crate::{
    chain::Reply,
    cuda::CudaHost,
    fd_store::StoredWorker,
    guest_buffer::{GuestBuffer, GuestRam, Request},
    host_function_link::{HostFnLink, Waiter},
    limits::{GpuMemoryQuota, SlotLease},
    worker::{WorkerCommand, WorkerProcess},
};

/// How long a spare that is no longer wanted is given to end by itself (it may be making its
/// context), before SIGKILL.
const SPARE_CLOSE_WAIT: Duration = Duration::from_millis(500);

/// Puts a finished chain on the used ring. Implemented by the virtio edge; tests record calls.
pub trait ChainCompleter: Send + Sync {
    /// Completes the chain whose head descriptor is `head`, reporting `used_len` bytes written.
    fn complete(&self, head: u16, used_len: u32);

    /// Notes, before the chain completes, that its request's `outputs` may have been written
    /// behind the daemon's map of guest RAM: by a worker through its own map, or by the GPU's
    /// DMA. A migration's dirty log must see those pages (the virtio edge marks them while
    /// logging); by default nothing is noted.
    fn wrote(&self, _outputs: &[GuestBuffer]) {}
}

/// A worker of the previous daemon that a new session thread takes over first.
pub(super) struct Adopting {
    pub(super) worker: StoredWorker,
    /// Its slot of the VM's accounting file.
    pub(super) quota: Option<SlotLease>,
}

/// Counters the table waits on.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counters {
    /// Chains dispatched and not yet completed or dropped.
    pub(super) in_flight: usize,
    /// Sessions with a thread (and maybe a worker process) not yet ended.
    pub(super) open: usize,
}

pub(super) struct Shared {
    pub(super) host: Arc<CudaHost>,
    pub(super) command: WorkerCommand,
    pub(super) label: String,
    /// `--max-sessions` (at most [`MAX_SESSIONS`]).
    pub(super) max_sessions: usize,
    /// [`MAX_IN_FLIGHT`] (tests lower it).
    pub(super) max_in_flight: usize,
    /// Whether the in-flight bound was hit (logged once).
    pub(super) flooded: AtomicBool,
    /// The VM's accounting file (with its `--max-gpu-memory`), shared with its workers; `Err`
    /// if it could not be made: then, under a limit, no worker starts (the limit is not
    /// silently dropped), and without one they run uncounted.
    pub(super) gpu_memory: Result<GpuMemoryQuota, String>,
    /// Whether `--max-gpu-memory` is set.
    pub(super) memory_limited: bool,
    /// Counts over the VM's ended sessions.
    pub(super) totals: VmTotals,
    pub(super) threads: Mutex<HashMap<u64, SessionHandle>>,
    /// The guest memory map of the last SET_MEM_TABLE, for new worker processes.
    pub(super) memory: Mutex<Arc<GuestRam>>,
    pub(super) next_generation: AtomicU64,
    pub(super) counters: Mutex<Counters>,
    pub(super) changed: Condvar,
    /// Device memory the VM's processes share (CUDA IPC).
    pub(super) ipc: super::ipc_broker::IpcBroker,
    /// Workers started ahead of the VM's sessions (`--spare-workers`).
    pub(super) spares: Spares,
}

/// Workers started ahead of a VM's sessions (`--spare-workers`), each making its context on
/// the first GPU as it starts: a session's first need of a worker takes one
/// ([`Shared::take_spare`]) and another is started in its place. Kept only while the VM is
/// connected ([`Shared::start_spares`] .. [`Shared::stop_spares`]).
#[derive(Default)]
pub(super) struct Spares {
    ready: Mutex<Vec<WorkerProcess>>,
    on: AtomicBool,
    /// Whether a start failed (logged once).
    failed: AtomicBool,
}

impl Shared {
    /// Keeps the VM's spare workers from now on (starting them in the background).
    pub(super) fn start_spares(self: &Arc<Self>) {
        if self.command.spares() == 0 {
            return;
        }
        self.spares.on.store(true, Ordering::Release);
        self.refill_spares();
    }

    /// Ends the spare workers and starts no more (the VM went away).
    pub(super) fn stop_spares(&self) {
        self.spares.on.store(false, Ordering::Release);
        let ended: Vec<WorkerProcess> = std::mem::take(&mut *self.spare_list());
        for w in ended {
            w.close(SPARE_CLOSE_WAIT);
        }
    }

    /// A spare worker for a session that needs one now, if one is ready; another is started
    /// in its place.
    pub(super) fn take_spare(self: &Arc<Self>) -> Option<WorkerProcess> {
        let spare = {
            let mut list = self.spare_list();
            loop {
                let mut w = list.pop()?;
                if w.has_exited() {
                    // Gone before it was needed (killed by the operator, say): the next one.
                    drop(w);
                    continue;
                }
                break w;
            }
        };
        self.refill_spares();
        Some(spare)
    }

    pub(super) fn spare_pids(&self) -> Vec<u32> {
        self.spare_list().iter().map(WorkerProcess::pid).collect()
    }

    fn spare_list(&self) -> MutexGuard<'_, Vec<WorkerProcess>> {
        self.spares.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts spares up to `--spare-workers`, in a thread of its own (a start forks).
    fn refill_spares(self: &Arc<Self>) {
        if !self.spares.on.load(Ordering::Acquire) {
            return;
        }
        let shared = Arc::clone(self);
        let started = std::thread::Builder::new()
            .name("qcuda-spares".into())
            .spawn(move || shared.fill_spares());
        if let Err(e) = started {
            warn!(vm = %self.label, "no spare worker started: {e}");
        }
    }

    /// Starts spares until there are `--spare-workers`, each outside the list's lock (a
    /// session taking one does not wait for a start); one no longer wanted when it is up (the
    /// VM went, or another refill filled the list) is ended.
    fn fill_spares(&self) {
        let wanted = |list: &Vec<WorkerProcess>| {
            self.spares.on.load(Ordering::Acquire) && list.len() < self.command.spares()
        };
        while wanted(&self.spare_list()) {
            let w = match WorkerProcess::spawn_spare(&self.command, &self.label) {
                Ok(w) => w,
                Err(e) => {
                    if !self.spares.failed.swap(true, Ordering::AcqRel) {
                        warn!(vm = %self.label, "no spare worker started: {e}");
                    }
                    return;
                }
            };
            let mut list = self.spare_list();
            if wanted(&list) {
                list.push(w);
            } else {
                drop(list);
                w.close(SPARE_CLOSE_WAIT);
                return;
            }
        }
    }

    pub(super) fn counters(&self) -> MutexGuard<'_, Counters> {
        // The counters stay consistent even if a holder panicked: every update is one statement.
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn threads(&self) -> MutexGuard<'_, HashMap<u64, SessionHandle>> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn memory(&self) -> Arc<GuestRam> {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut Counters)) -> Counters {
        let mut c = self.counters();
        f(&mut c);
        self.changed.notify_all();
        *c
    }

    /// Waits until `done(counters)` or the timeout; returns whether `done` holds.
    pub(super) fn wait_for(&self, timeout: Duration, done: impl Fn(&Counters) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut c = self.counters();
        while !done(&c) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            c = self
                .changed
                .wait_timeout(c, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

/// Counts a chain as in flight from dispatch until it is completed or dropped.
pub(super) struct InFlight(Arc<Shared>);

impl InFlight {
    pub(super) fn new(shared: &Arc<Shared>) -> Self {
        shared.update(|c| c.in_flight += 1);
        Self(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.update(|c| c.in_flight -= 1);
    }
}

/// One request on its way to a session thread.
pub(super) struct Job {
    pub(super) head: u16,
    /// When the chain was taken off the ring (for the latency statistics).
    pub(super) received: Instant,
    pub(super) request: Request,
    pub(super) reply: Reply,
    pub(super) completer: Arc<dyn ChainCompleter>,
    pub(super) _in_flight: InFlight,
}

impl Job {
    /// Writes the response and completes the chain.
    pub(super) fn finish(self, resp: &ResponseHeader) {
        self.completer.wrote(self.request.outputs());
        let used = self.reply.write(resp);
        self.completer.complete(self.head, used);
    }
}

impl Waiter for Job {
    fn answer(self: Box<Self>, resp: &ResponseHeader) {
        self.finish(resp);
    }
}

/// How a migration's source saves a session ([`Msg::SaveState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SaveMode {
    /// The whole state, device memory included (the copy path).
    Full,
    /// The state without the allocations' contents: the quiesce at the last stop.
    Record,
    /// The runs exported and the state without contents (the handover path).
    Export,
}

/// What a session's thread answers a save with: its GPU side and, for [`SaveMode::Export`],
/// the pieces of its device memory (in its runs' order).
#[derive(Debug)]
pub(super) struct Saved {
    /// The session's GPU side.
    pub(super) gpu: SavedGpu,
    /// Its exported runs.
    pub(super) pieces: Vec<Piece>,
}

/// A migration's pre-copy asked of a session ([`Msg::Precopy`], `precopy.rs`).
pub(super) enum PrecopyAsk {
    /// A round of at most `budget` bytes in at most `passes` passes; the answer is the
    /// worker's chunk log (`None`: no worker, nothing on the GPU to pre-copy).
    Round {
        budget: u64,
        passes: u32,
        reply: Sender<Result<Option<crate::worker::PrecopiedByWorker>, String>>,
    },
    /// Forget what was sent (not answered).
    Reset,
}

pub(super) enum Msg {
    Run(Box<Job>),
    /// A migration's pre-copy, between the session's requests.
    Precopy(PrecopyAsk),
    /// A new guest memory map (SET_MEM_TABLE), for the worker process.
    Memory(Arc<GuestRam>),
    /// The VM, or the guest driver instance the session belonged to, is gone: close the
    /// session (the reason is logged) and stop.
    Shutdown(&'static str),
    /// The operator's pause (`true`) or resume of the session (`vhost-cuda --pause`): the
    /// thread answers on `reply` once its worker has (see `thread.rs`).
    Checkpoint {
        pause: bool,
        reply: Sender<ResponseHeader>,
    },
    /// A transition of CUDA's process checkpoint asked by a guest process
    /// (process_checkpoint.rs).
    Process(Transition),
    /// A migration's source: the thread answers what its GPU side is, its worker's saved state
    /// included (the state goes on running).
    SaveState(SaveMode, Sender<Result<Saved, String>>),
    /// Another process's `GpuTrace` of this session (its header restamped with this session):
    /// run by this session's worker between its own requests, never starting one.
    Trace(Box<Job>),
}

impl Msg {
    /// Whether this message ends the session.
    pub(super) fn ends_session(&self) -> bool {
        match self {
            Msg::Run(job) => job.request.op() == Op::SessionClose,
            Msg::Memory(_)
            | Msg::Checkpoint { .. }
            | Msg::Process(_)
            | Msg::SaveState(..)
            | Msg::Precopy(_)
            | Msg::Trace(_) => false,
            Msg::Shutdown(_) => true,
        }
    }
}

pub(super) struct SessionHandle {
    pub(super) tx: Sender<Msg>,
    pub(super) generation: u64,
    /// Set when the VM goes away: queued requests are dropped, never completed.
    pub(super) abandoned: Arc<AtomicBool>,
    /// Rung with every message that ends the session, so that a thread waiting for its worker
    /// looks at its queue.
    pub(super) wake: Arc<EventFd>,
    /// The worker process's id, 0 while there is none.
    pub(super) pid: Arc<AtomicU32>,
    /// What the session uses of the host.
    pub(super) account: Arc<SessionAccount>,
    /// Set when the session has ended (its worker reaped), under the counters' lock.
    pub(super) ended: Arc<AtomicBool>,
    /// Where `HostFuncWait` requests go, past the session's queue.
    pub(super) host_fns: Arc<HostFnLink>,
    /// The state under CUDA's process checkpoint, kept by the session's thread.
    pub(super) process: Arc<ProcessState>,
}

impl SessionHandle {
    /// Queues the operator's pause or resume.
    pub(super) fn send_checkpoint(
        &self,
        pause: bool,
        reply: Sender<ResponseHeader>,
    ) -> Result<(), SendError<Msg>> {
        self.tx.send(Msg::Checkpoint { pause, reply })
    }

    /// Queues a transition of CUDA's process checkpoint.
    pub(super) fn send_transition(&self, t: Transition) -> Result<(), SendError<Msg>> {
        self.tx.send(Msg::Process(t))
    }

    /// Queues `msg`, ringing the wake-up if it ends the session.
    pub(super) fn send(&self, msg: Msg) -> Result<(), SendError<Msg>> {
        let ends = msg.ends_session();
        self.tx.send(msg)?;
        if ends {
            let _ = self.wake.write(1);
        }
        Ok(())
    }
}

/// A transition on its way to the target's thread. The caller's request is answered by
/// whoever takes it first: the target's thread (which then runs the action), or, for a lock
/// with a timeout, the timer (which answers `NOT_READY`, and the action never runs).
#[derive(Clone)]
pub(super) struct Transition {
    pub(super) action: u64,
    claim: Arc<(Mutex<Option<Box<Job>>>, Condvar)>,
}

impl Transition {
    pub(super) fn new(action: u64, job: Box<Job>) -> Self {
        Self {
            action,
            claim: Arc::new((Mutex::new(Some(job)), Condvar::new())),
        }
    }

    /// The caller's request, unless the timer answered it already.
    pub(super) fn take(&self) -> Option<Box<Job>> {
        let job = lock(&self.claim.0).take();
        self.claim.1.notify_all();
        job
    }

    /// Answers `NOT_READY` if nobody has taken the request within `timeout`.
    pub(super) fn expire_after(&self, timeout: Duration) {
        let (slot, cv) = &*self.claim;
        let waited = cv
            .wait_timeout_while(lock(slot), timeout, |job| job.is_some())
            .unwrap_or_else(|p| p.into_inner());
        let mut guard: MutexGuard<'_, _> = waited.0;
        if let Some(job) = guard.take() {
            drop(guard);
            job.finish(&ResponseHeader::with_status(status::NOT_READY));
        }
    }
}

/// Tells the threads of `sessions` to end their sessions: what they have queued is dropped
/// without being completed (it came from a ring, or a driver instance, that is gone), a worker
/// still running an op is killed, the others get their usual bounded close.
pub(super) fn end_sessions(sessions: Vec<SessionHandle>, why: &'static str) {
    for t in sessions {
        t.abandoned.store(true, Ordering::Release);
        let _ = t.send(Msg::Shutdown(why));
    }
}

//! Sessions: one thread per guest process in the daemon, and one worker process per guest
//! process that uses the GPU.
//!
//! A session is identified by the id the guest kernel module stamps on every request (one per
//! open file of `/dev/qcuda`). The [`SessionTable`] starts a session thread on a session's
//! first request; the thread runs the session's requests in arrival order, so a long op in one
//! process never blocks another. It writes each response into guest memory and completes the
//! chain through a [`ChainCompleter`], so chains of different sessions complete out of order.
//!
//! The thread answers `Hello`, `Echo`, `SessionClose` and the host queries (HostInfo,
//! DriverVersion, DeviceCount, DeviceInfo: [`CudaHost::answer_query`]) itself, without any CUDA
//! context. Every other op runs in the session's worker process ([`WorkerProcess`]), started on
//! the first such op. All CUDA contexts of one process share one GPU address space and one
//! sticky error fails them all (measured with driver 580), so only separate processes isolate
//! guest processes from each other; killing a worker also ends its kernels and frees all its
//! GPU memory.
//!
//! A worker that dies unexpectedly fails the session: the op in flight and every later op that
//! needs the GPU are answered `cudaErrorLaunchFailure` with `RESP_FLAG_STICKY` (a sticky error
//! the guest library knows, so the guest program sees CUDA's own "reset or restart" state),
//! until `DeviceReset`, which then answers success and lets the next op start a new worker. A
//! `DeviceReset` after the worker reported a sticky error (`RESP_FLAG_STICKY`) likewise ends
//! the worker, so the program recovers for real.
//!
//! `SessionClose` ends the worker (closing its channel, SIGKILL after [`CLOSE_WAIT`]) and the
//! thread. If an op is still running in the worker when it arrives, its guest process is gone
//! and nobody waits for the result, and the op may never end (an endless kernel): the worker is
//! killed at once. When the VM goes away ([`SessionTable::close_all`]) every session is ended
//! the same way, and queued requests are dropped without touching the ring. All of that waiting
//! happens on the session's own thread.
//!
//! `DriverReset` comes from a guest driver instance that has just bound to the device, before
//! it has any session: every session in the table belongs to an instance that went away without
//! closing its files (a guest reboot, an unbind), so they are all ended as on a disconnect. A
//! thread of its own waits for them (bounded by [`DRIVER_RESET_WAIT`]) and then answers how
//! many there were, so the vring thread and new sessions never wait for it.
//!
//! The table's lock only guards the map from session id to thread and is never held while an
//! op runs. This module knows nothing about vrings: the virtio edge supplies the completer.

use std::{
    cell::{Cell, RefCell},
    collections::{BTreeMap, HashMap, VecDeque},
    mem,
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        mpsc::{self, Receiver, SendError, Sender},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{
    status, LatencyRecord, Op, ResponseHeader, FLAG_ASYNC, LATENCY_RECORD_SIZE, RESP_FLAG_STICKY,
};
use tracing::{debug, error, info, warn};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::{
    chain::{ParsedRequest, Reply},
    cuda::CudaHost,
    guest_buffer::{GuestRam, Request},
    host_function_link::{self, HostFnLink, Waiter},
    limits::GpuMemoryQuota,
    transport_ops,
    worker_message::ToWorker,
    worker_process::{Waited, WorkerCommand, WorkerError, WorkerProcess, CLOSE_WAIT},
};

/// Most sessions one VM may have open at once. Each is a host thread, and a worker process if
/// it uses the GPU; a guest kernel that invents session ids must not be able to exhaust the
/// host. Requests of further sessions are answered with `cudaErrorMemoryAllocation`.
pub const MAX_SESSIONS: usize = 1024;

/// Most chains of one VM handed to sessions and not yet completed. A driver that follows the
/// virtio rules has at most one queue's worth (256) outstanding, since a chain stays in the ring
/// until it is answered; a hostile one can publish the same descriptor heads again and again,
/// and every copy would hold host memory until its session gets to it. Past this, chains are
/// answered `cudaErrorMemoryAllocation` at once (`DriverReset` excepted: a new driver instance
/// must always be able to clear what an old one left).
pub const MAX_IN_FLIGHT: usize = 4 * qcuda_proto::QUEUE_SIZE as usize;

/// How long `DriverReset` waits for the sessions it ends before answering anyway (they then
/// finish closing in the background). Well above a worker's own close bound ([`CLOSE_WAIT`]),
/// and well below the guest module's wait for the answer (30 s).
pub const DRIVER_RESET_WAIT: Duration = Duration::from_secs(10);

/// Sessions open in this process, over all VMs.
static OPEN_SESSIONS_TOTAL: AtomicUsize = AtomicUsize::new(0);

/// Sessions open in this process, over all sockets (VMs).
pub fn open_sessions_total() -> usize {
    OPEN_SESSIONS_TOTAL.load(Ordering::Acquire)
}

/// The answer of every op that needs the GPU in a session whose worker died.
fn worker_lost() -> ResponseHeader {
    let mut resp = ResponseHeader::with_status(status::LAUNCH_FAILURE);
    resp.flags = RESP_FLAG_STICKY;
    resp
}

/// Puts a finished chain on the used ring. Implemented by the virtio edge; tests record calls.
pub trait ChainCompleter: Send + Sync {
    /// Completes the chain whose head descriptor is `head`, reporting `used_len` bytes written.
    fn complete(&self, head: u16, used_len: u32);
}

/// Counters the table waits on.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    /// Chains dispatched and not yet completed or dropped.
    in_flight: usize,
    /// Sessions with a thread (and maybe a worker process) not yet ended.
    open: usize,
}

struct Shared {
    host: Arc<CudaHost>,
    command: WorkerCommand,
    label: String,
    /// `--max-sessions` (at most [`MAX_SESSIONS`]).
    max_sessions: usize,
    /// [`MAX_IN_FLIGHT`] (tests lower it).
    max_in_flight: usize,
    /// Whether the in-flight bound was hit (logged once).
    flooded: AtomicBool,
    /// `--max-gpu-memory`: the VM's quota file, shared with its workers; `Err` if it could not
    /// be made (then no worker starts: the limit is not silently dropped).
    gpu_memory: Option<Result<GpuMemoryQuota, String>>,
    threads: Mutex<HashMap<u64, SessionHandle>>,
    /// The guest memory map of the last SET_MEM_TABLE, for new worker processes.
    memory: Mutex<Arc<GuestRam>>,
    next_generation: AtomicU64,
    counters: Mutex<Counters>,
    changed: Condvar,
}

impl Shared {
    fn counters(&self) -> MutexGuard<'_, Counters> {
        // The counters stay consistent even if a holder panicked: every update is one statement.
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn threads(&self) -> MutexGuard<'_, HashMap<u64, SessionHandle>> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn memory(&self) -> Arc<GuestRam> {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn update(&self, f: impl FnOnce(&mut Counters)) -> Counters {
        let mut c = self.counters();
        f(&mut c);
        self.changed.notify_all();
        *c
    }

    /// Waits until `done(counters)` or the timeout; returns whether `done` holds.
    fn wait_for(&self, timeout: Duration, done: impl Fn(&Counters) -> bool) -> bool {
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
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(shared: &Arc<Shared>) -> Self {
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
struct Job {
    head: u16,
    /// When the chain was taken off the ring (for the latency statistics).
    received: Instant,
    request: Request,
    reply: Reply,
    completer: Arc<dyn ChainCompleter>,
    _in_flight: InFlight,
}

impl Job {
    /// Writes the response and completes the chain.
    fn finish(self, resp: &ResponseHeader) {
        let used = self.reply.write(resp);
        self.completer.complete(self.head, used);
    }
}

impl Waiter for Job {
    fn answer(self: Box<Self>, resp: &ResponseHeader) {
        self.finish(resp);
    }
}

enum Msg {
    Run(Box<Job>),
    /// A new guest memory map (SET_MEM_TABLE), for the worker process.
    Memory(Arc<GuestRam>),
    /// The VM, or the guest driver instance the session belonged to, is gone: close the
    /// session (the reason is logged) and stop.
    Shutdown(&'static str),
}

impl Msg {
    /// Whether this message ends the session.
    fn ends_session(&self) -> bool {
        match self {
            Msg::Run(job) => job.request.op == Op::SessionClose,
            Msg::Memory(_) => false,
            Msg::Shutdown(_) => true,
        }
    }
}

struct SessionHandle {
    tx: Sender<Msg>,
    generation: u64,
    /// Set when the VM goes away: queued requests are dropped, never completed.
    abandoned: Arc<AtomicBool>,
    /// Rung with every message that ends the session, so that a thread waiting for its worker
    /// looks at its queue.
    wake: Arc<EventFd>,
    /// The worker process's id, 0 while there is none.
    pid: Arc<AtomicU32>,
    /// Set when the session has ended (its worker reaped), under the counters' lock.
    ended: Arc<AtomicBool>,
    /// Where `HostFuncWait` requests go, past the session's queue.
    host_fns: Arc<HostFnLink>,
}

impl SessionHandle {
    /// Queues `msg`, ringing the wake-up if it ends the session.
    fn send(&self, msg: Msg) -> Result<(), SendError<Msg>> {
        let ends = msg.ends_session();
        self.tx.send(msg)?;
        if ends {
            let _ = self.wake.write(1);
        }
        Ok(())
    }
}

/// The sessions of one VM (one vhost-user connection).
pub struct SessionTable {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SessionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTable")
            .field("label", &self.shared.label)
            .field("open", &self.open_count())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl SessionTable {
    /// An empty table. `host` answers the host queries; `command` starts worker processes;
    /// `label` names the VM (its socket) in logs.
    ///
    /// The table applies `command`'s per-VM limits: at most `max_sessions` sessions, and the
    /// device memory of all its workers together at most `max_gpu_memory`.
    pub fn new(host: Arc<CudaHost>, command: WorkerCommand, label: impl Into<String>) -> Self {
        let limits = command.limits();
        let label = label.into();
        let max_sessions = limits
            .max_sessions
            .unwrap_or(MAX_SESSIONS)
            .min(MAX_SESSIONS);
        let gpu_memory = limits.max_gpu_memory.map(|limit| {
            GpuMemoryQuota::new(limit, max_sessions).map_err(|e| {
                error!(vm = %label, "cannot set up --max-gpu-memory: {e}; no GPU work will run");
                e.to_string()
            })
        });
        Self {
            shared: Arc::new(Shared {
                host,
                command,
                max_sessions,
                max_in_flight: MAX_IN_FLIGHT,
                flooded: AtomicBool::new(false),
                gpu_memory,
                label,
                threads: Mutex::new(HashMap::new()),
                memory: Mutex::new(Arc::new(GuestRam::new())),
                next_generation: AtomicU64::new(0),
                counters: Mutex::new(Counters::default()),
                changed: Condvar::new(),
            }),
        }
    }

    /// Sessions of this VM not yet ended.
    pub fn open_count(&self) -> usize {
        self.shared.counters().open
    }

    /// Chains handed to session threads and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.shared.counters().in_flight
    }

    /// Bytes of device memory this VM's workers hold now, if `--max-gpu-memory` is set.
    pub fn gpu_memory_used(&self) -> Option<u64> {
        match &self.shared.gpu_memory {
            Some(Ok(q)) => Some(q.used()),
            _ => None,
        }
    }

    /// The process id of session `id`'s worker, if it has one now.
    pub fn worker_pid(&self, id: u64) -> Option<u32> {
        let pid = self.shared.threads().get(&id)?.pid.load(Ordering::Acquire);
        (pid != 0).then_some(pid)
    }

    /// Guest RAM from now on (SET_MEM_TABLE): new workers map it, live ones are sent it.
    pub fn set_memory(&self, mem: Arc<GuestRam>) {
        *self.shared.memory.lock().unwrap_or_else(|p| p.into_inner()) = mem.clone();
        for w in self.shared.threads().values() {
            let _ = w.send(Msg::Memory(mem.clone()));
        }
    }

    /// Hands a parsed request to its session's thread, starting the thread if needed. The chain
    /// is completed through `completer`, from the session's thread (a `DriverReset`'s from a
    /// thread of its own).
    pub fn dispatch(&self, head: u16, parsed: ParsedRequest, completer: Arc<dyn ChainCompleter>) {
        let id = parsed.request.header.session;
        if parsed.request.op != Op::DriverReset && self.in_flight() >= self.shared.max_in_flight {
            if !self.shared.flooded.swap(true, Ordering::Relaxed) {
                warn!(
                    vm = %self.shared.label,
                    "more than {} chains outstanding (descriptor heads published again?): \
                     refusing further chains until some complete",
                    self.shared.max_in_flight
                );
            }
            let resp = ResponseHeader::with_status(status::MEMORY_ALLOCATION);
            completer.complete(head, parsed.reply.write(&resp));
            return;
        }
        let job = Job {
            head,
            received: Instant::now(),
            request: parsed.request,
            reply: parsed.reply,
            completer,
            _in_flight: InFlight::new(&self.shared),
        };
        if job.request.op == Op::DriverReset {
            // Whatever session id it carries: it is about the whole table.
            self.driver_reset(job);
            return;
        }
        let mut threads = self.shared.threads();
        if job.request.op == Op::HostFuncWait {
            if let Some(w) = threads.get(&id) {
                let link = Arc::clone(&w.host_fns);
                drop(threads);
                link.wait(job.request.header.args[0], Box::new(job));
                return;
            }
        }
        let mut msg = Msg::Run(Box::new(job));
        if let Some(w) = threads.get(&id) {
            // The send happens under the map lock, so a thread that has removed itself from
            // the map (SessionClose) cannot receive anything afterwards.
            match w.send(msg) {
                Ok(()) => return,
                Err(SendError(m)) => {
                    // The thread died without removing itself (only a bug can do that).
                    error!(vm = %self.shared.label, "session {id}: thread gone, starting anew");
                    threads.remove(&id);
                    msg = m;
                }
            }
        }
        let Msg::Run(job) = msg else { return };
        if job.request.op == Op::SessionClose {
            drop(threads);
            // Nothing open under this id: closing it is already done.
            job.finish(&ResponseHeader::with_status(status::SUCCESS));
            return;
        }
        let max = self.shared.max_sessions;
        if threads.len() >= max {
            drop(threads);
            warn!(vm = %self.shared.label, "session {id}: refused, {max} sessions open");
            // The configured limit is a policy (the GPU is not available to more processes);
            // the built-in bound protects the host.
            job.finish(&ResponseHeader::with_status(if max < MAX_SESSIONS {
                status::DEVICES_UNAVAILABLE
            } else {
                status::MEMORY_ALLOCATION
            }));
            return;
        }
        let wake = match EventFd::new(EFD_NONBLOCK) {
            Ok(w) => Arc::new(w),
            Err(e) => {
                drop(threads);
                error!(vm = %self.shared.label, "session {id}: cannot create its eventfd: {e}");
                job.finish(&ResponseHeader::with_status(status::MEMORY_ALLOCATION));
                return;
            }
        };
        let (tx, rx) = mpsc::channel();
        let generation = self.shared.next_generation.fetch_add(1, Ordering::Relaxed);
        let abandoned = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicU32::new(0));
        let ended = Arc::new(AtomicBool::new(false));
        let host_fns = Arc::new(HostFnLink::default());
        let thread = SessionThread {
            shared: self.shared.clone(),
            id,
            generation,
            abandoned: abandoned.clone(),
            wake: wake.clone(),
            pid: pid.clone(),
            ended: ended.clone(),
            host_fns: host_fns.clone(),
            latency: RefCell::default(),
            last_hop: Cell::new((0, 0)),
        };
        let spawned = thread::Builder::new()
            .name(format!("qcuda-s{id}"))
            .spawn(move || thread.run(rx));
        if let Err(e) = spawned {
            drop(threads);
            error!(vm = %self.shared.label, "session {id}: cannot start its thread: {e}");
            job.finish(&ResponseHeader::with_status(status::MEMORY_ALLOCATION));
            return;
        }
        if job.request.op == Op::HostFuncWait {
            // The session's first request: its thread starts with nothing to do.
            host_fns.wait(job.request.header.args[0], job);
        } else {
            // The receiver lives until the thread ends, and it cannot end before receiving.
            let _ = tx.send(Msg::Run(job));
        }
        threads.insert(
            id,
            SessionHandle {
                tx,
                generation,
                abandoned,
                wake,
                pid,
                ended,
                host_fns,
            },
        );
    }

    /// `DriverReset`: ends every session in the table (they belong to a driver instance that is
    /// gone) exactly as a disconnect does, and answers with their number once they have ended,
    /// from a thread of its own. Sessions that start meanwhile are new ones and stay.
    fn driver_reset(&self, job: Job) {
        let stale = self.take_all();
        let count = stale.len();
        if count > 0 {
            info!(
                vm = %self.shared.label,
                "driver reset: a new guest driver instance; closing {count} stale session(s)"
            );
        }
        let ended: Vec<Arc<AtomicBool>> = stale.iter().map(|t| t.ended.clone()).collect();
        end_sessions(stale, "guest driver reset");
        let reply = DriverResetReply {
            shared: self.shared.clone(),
            job,
            ended,
        };
        if count == 0 {
            reply.finish();
            return;
        }
        // If the thread cannot start, the closure (and the reply in it) comes back here.
        let slot = Arc::new(Mutex::new(Some(reply)));
        let theirs = slot.clone();
        let spawned = thread::Builder::new()
            .name("qcuda-reset".into())
            .spawn(move || {
                if let Some(r) = lock(&theirs).take() {
                    r.finish();
                }
            });
        if let Err(e) = spawned {
            warn!(
                vm = %self.shared.label,
                "driver reset: cannot start a thread to wait for the sessions ({e}); answering now"
            );
            if let Some(r) = lock(&slot).take() {
                r.answer(count, self.open_count());
            }
        }
    }

    /// Takes every session out of the table: requests with their ids start new sessions.
    fn take_all(&self) -> Vec<SessionHandle> {
        self.shared.threads().drain().map(|(_, t)| t).collect()
    }

    /// Waits until every dispatched chain has been completed, at most `timeout`. Returns
    /// whether none is left.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.shared.wait_for(timeout, |c| c.in_flight == 0)
    }

    /// Closes every session: queued requests are dropped without being completed (the ring
    /// they came from is gone), a worker still running an op is killed, the others get their
    /// usual bounded close. Waits up to `timeout` for that and returns the number still open;
    /// those close in the background.
    pub fn close_all(&self, timeout: Duration) -> usize {
        let threads = self.take_all();
        if !threads.is_empty() {
            info!(vm = %self.shared.label, "closing all {} sessions", threads.len());
        }
        end_sessions(threads, "VM disconnected or reset");
        let closed = self.shared.wait_for(timeout, |c| c.open == 0);
        let open = self.open_count();
        if !closed {
            warn!(
                vm = %self.shared.label,
                "{open} sessions still busy; they close in the background"
            );
        }
        open
    }
}

impl Drop for SessionTable {
    fn drop(&mut self) {
        self.close_all(Duration::ZERO);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tells the threads of `sessions` to end their sessions: what they have queued is dropped
/// without being completed (it came from a ring, or a driver instance, that is gone), a worker
/// still running an op is killed, the others get their usual bounded close.
fn end_sessions(sessions: Vec<SessionHandle>, why: &'static str) {
    for t in sessions {
        t.abandoned.store(true, Ordering::Release);
        let _ = t.send(Msg::Shutdown(why));
    }
}

/// The answer to a `DriverReset`, once the sessions it ended are gone.
struct DriverResetReply {
    shared: Arc<Shared>,
    job: Job,
    ended: Vec<Arc<AtomicBool>>,
}

impl DriverResetReply {
    /// Waits (bounded) for the ended sessions, then answers.
    fn finish(self) {
        let all = self.shared.wait_for(DRIVER_RESET_WAIT, |_| {
            self.ended.iter().all(|e| e.load(Ordering::Acquire))
        });
        let count = self.ended.len();
        let open = self.shared.counters().open;
        if !all {
            let busy = self
                .ended
                .iter()
                .filter(|e| !e.load(Ordering::Acquire))
                .count();
            warn!(
                vm = %self.shared.label,
                "driver reset: {busy} of {count} stale session(s) still closing after \
                 {DRIVER_RESET_WAIT:?}; they close in the background"
            );
        }
        self.answer(count, open);
    }

    fn answer(self, count: usize, open: usize) {
        info!(
            vm = %self.shared.label,
            "driver reset: closed {count} stale session(s); sessions open: {open}"
        );
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        resp.rets[0] = count as u64;
        self.job.finish(&resp);
    }
}

/// The thread of one session.
struct SessionThread {
    shared: Arc<Shared>,
    id: u64,
    generation: u64,
    abandoned: Arc<AtomicBool>,
    wake: Arc<EventFd>,
    pid: Arc<AtomicU32>,
    ended: Arc<AtomicBool>,
    host_fns: Arc<HostFnLink>,
    /// Where the session's time went, per op (`Op::HostLatency`).
    latency: RefCell<LatencyStats>,
    /// The last worker round trip: (ns from send to answer, ns the worker said it took).
    last_hop: Cell<(u64, u64)>,
}

/// Per-op sums of where a session's requests spent their time on the host.
#[derive(Debug, Default)]
struct LatencyStats {
    by_op: BTreeMap<u32, LatencyRecord>,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl LatencyStats {
    fn record(&mut self, op: Op, queue: u64, hop: (u64, u64), host: u64) {
        let r = self.by_op.entry(op as u32).or_insert(LatencyRecord {
            op: op as u32,
            ..LatencyRecord::default()
        });
        r.count += 1;
        r.queue_ns = r.queue_ns.saturating_add(queue);
        r.hop_ns = r.hop_ns.saturating_add(hop.0.saturating_sub(hop.1));
        r.worker_ns = r.worker_ns.saturating_add(hop.1);
        r.host_ns = r.host_ns.saturating_add(host);
    }

    /// `HostLatency`: the records, as many as fit.
    fn answer(&self, req: &Request) -> ResponseHeader {
        let Some(out) = req.outputs.first() else {
            return ResponseHeader::with_status(status::INVALID_VALUE);
        };
        let fit = out.len() / LATENCY_RECORD_SIZE;
        let mut bytes = Vec::with_capacity(out.len());
        for r in self.by_op.values().take(fit) {
            bytes.extend_from_slice(&r.encode());
        }
        bytes.resize(out.len(), 0);
        if out.write_at(0, &bytes).is_err() {
            return ResponseHeader::with_status(status::INVALID_VALUE);
        }
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        resp.rets[0] = fit.min(self.by_op.len()) as u64;
        resp.rets[1] = self.by_op.len() as u64;
        resp
    }
}

/// A session's GPU side, seen from the daemon.
enum Gpu {
    /// No worker process (none needed yet, or the last one was ended by a reset).
    Idle,
    /// A worker process; `sticky` once it answered with `RESP_FLAG_STICKY` (it stays so).
    Running {
        process: WorkerProcess,
        sticky: bool,
    },
    /// The worker died unexpectedly: ops that need the GPU fail until DeviceReset.
    Failed,
}

impl Gpu {
    /// Whether responses of this session carry `RESP_FLAG_STICKY`.
    fn sticky(&self) -> bool {
        matches!(self, Gpu::Failed | Gpu::Running { sticky: true, .. })
    }
}

/// How an op handed to the worker ended.
enum Outcome {
    Answered(ResponseHeader),
    /// The session is ending (SessionClose or VM gone) while the op ran; the worker was killed.
    Interrupted,
}

impl SessionThread {
    fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }

    fn run(self, rx: Receiver<Msg>) {
        self.opened();
        let mut gpu = Gpu::Idle;
        // Messages taken off the queue while an op was running in the worker.
        let mut backlog: VecDeque<Msg> = VecDeque::new();
        // Why the loop ended, unless a SessionClose ended the session.
        let mut why = "VM disconnected or reset";
        // The status of the first failed fire-and-forget op not yet reported.
        let mut deferred = status::SUCCESS;
        loop {
            let msg = match backlog.pop_front() {
                Some(m) => m,
                None => match rx.recv() {
                    Ok(m) => m,
                    // The table is gone.
                    Err(_) => break,
                },
            };
            let job = match msg {
                Msg::Shutdown(reason) => {
                    why = reason;
                    break;
                }
                Msg::Memory(mem) => {
                    self.share_memory(&mut gpu, &mem);
                    continue;
                }
                Msg::Run(job) => job,
            };
            if self.abandoned() {
                continue;
            }
            if job.request.op == Op::SessionClose {
                self.close(&mut gpu, "SessionClose");
                self.leave_table();
                job.finish(&ResponseHeader::with_status(status::SUCCESS));
                // Nothing can arrive any more; answer what was queued behind the close.
                for late in backlog.drain(..).chain(rx.try_iter()) {
                    if let (Msg::Run(late), false) = (late, self.abandoned()) {
                        late.finish(&ResponseHeader::with_status(status::INVALID_VALUE));
                    }
                }
                return;
            }
            let fire_and_forget = job.request.header.flags & FLAG_ASYNC != 0;
            let queued = ns(job.received.elapsed());
            self.last_hop.set((0, 0));
            let mut resp = match self.run_op(&mut gpu, &job.request, &rx, &mut backlog) {
                // Ended meanwhile by a disconnect or a DriverReset: the chain is not ours to
                // complete any more (the ring restarted since, or is gone).
                _ if self.abandoned() => continue,
                Outcome::Answered(resp) => resp,
                Outcome::Interrupted => worker_lost(),
            };
            // Nobody reads a fire-and-forget op's response: keep its failure for the next
            // waited-for op of the session (RESP_DEFERRED_SHIFT). The first one counts.
            if fire_and_forget {
                if resp.status != status::SUCCESS && deferred == status::SUCCESS {
                    deferred = resp.status;
                }
            } else if deferred != status::SUCCESS {
                resp.set_deferred_error(deferred);
                deferred = status::SUCCESS;
            }
            let (op, received) = (job.request.op, job.received);
            job.finish(&resp);
            self.latency.borrow_mut().record(
                op,
                queued,
                self.last_hop.get(),
                ns(received.elapsed()),
            );
        }
        self.close(&mut gpu, why);
    }

    fn opened(&self) {
        let open = self.shared.update(|c| c.open += 1).open;
        OPEN_SESSIONS_TOTAL.fetch_add(1, Ordering::AcqRel);
        info!(vm = %self.shared.label, "session {} opened; sessions open: {open}", self.id);
    }

    /// Ends the session's worker (bounded; see `WorkerProcess::close`), then the session.
    fn close(&self, gpu: &mut Gpu, why: &str) {
        // First, so that the worker's waiting host functions return and it can end.
        self.host_fns.close(!self.abandoned());
        if let Gpu::Running { process, .. } = mem::replace(gpu, Gpu::Idle) {
            process.close(CLOSE_WAIT);
            self.pid.store(0, Ordering::Release);
        }
        let open = self
            .shared
            .update(|c| {
                c.open -= 1;
                // Under the counters' lock, so whoever waits on them sees both at once.
                self.ended.store(true, Ordering::Release);
            })
            .open;
        OPEN_SESSIONS_TOTAL.fetch_sub(1, Ordering::AcqRel);
        // With --max-gpu-memory, what the VM's remaining workers hold (this one's share is
        // gone: it was reaped above).
        let gpu_memory = match &self.shared.gpu_memory {
            Some(Ok(q)) => format!("; GPU memory held by its workers: {} MiB", q.used() >> 20),
            _ => String::new(),
        };
        info!(
            vm = %self.shared.label,
            "session {} closed ({why}); sessions open: {open}{gpu_memory}", self.id
        );
    }

    /// Removes this thread from the map, unless a newer one took the id already.
    fn leave_table(&self) {
        let mut threads = self.shared.threads();
        if threads
            .get(&self.id)
            .is_some_and(|t| t.generation == self.generation)
        {
            threads.remove(&self.id);
        }
    }

    /// Kills the worker (if any) and reaps it.
    fn end_worker(&self, gpu: &mut Gpu, next: Gpu) {
        self.host_fns.disconnect();
        if let Gpu::Running { process, .. } = mem::replace(gpu, next) {
            process.kill();
            self.pid.store(0, Ordering::Release);
        }
    }

    /// The worker failed (died, or broke the channel): reap it and fail the session.
    fn worker_failed(&self, gpu: &mut Gpu, op: Op, e: &WorkerError) -> ResponseHeader {
        let pid = self.pid.load(Ordering::Acquire);
        self.end_worker(gpu, Gpu::Failed);
        error!(
            vm = %self.shared.label,
            "session {}: worker process {pid} lost during {op:?} ({e}); the session's GPU ops \
             fail until DeviceReset",
            self.id
        );
        worker_lost()
    }

    fn share_memory(&self, gpu: &mut Gpu, mem: &Arc<GuestRam>) {
        if let Gpu::Running { process, .. } = gpu {
            if let Err(e) = process.share_memory(mem) {
                let pid = process.pid();
                self.end_worker(gpu, Gpu::Failed);
                error!(
                    vm = %self.shared.label,
                    "session {}: worker process {pid} lost taking a new memory table ({e})",
                    self.id
                );
            }
        }
    }

    fn run_op(
        &self,
        gpu: &mut Gpu,
        req: &Request,
        rx: &Receiver<Msg>,
        backlog: &mut VecDeque<Msg>,
    ) -> Outcome {
        let host = &self.shared.host;
        let mut resp = match req.op {
            Op::Hello => {
                let open = self.shared.counters().open;
                return Outcome::Answered(transport_ops::hello(host, req, open));
            }
            Op::Echo => return Outcome::Answered(transport_ops::echo(req)),
            Op::HostLatency => return Outcome::Answered(self.latency.borrow().answer(req)),
            Op::DeviceReset if gpu.sticky() => self.reset(gpu, req),
            // A worker that is not running maps nothing: no need to start one to say so.
            Op::HostUnmap if !matches!(gpu, Gpu::Running { .. }) => {
                ResponseHeader::with_status(status::HOST_MEMORY_NOT_REGISTERED)
            }
            // Nor does it hold device output.
            Op::TakeOutput if !matches!(gpu, Gpu::Running { .. }) => {
                ResponseHeader::with_status(status::SUCCESS)
            }
            _ => match host.answer_query(req) {
                Some(r) => r,
                None => return self.on_worker(gpu, req, rx, backlog),
            },
        };
        if gpu.sticky() {
            resp.flags |= RESP_FLAG_STICKY;
        }
        Outcome::Answered(resp)
    }

    /// DeviceReset after a sticky error or a lost worker: CUDA says the process must be
    /// restarted, so the worker is, and the session starts afresh on every device.
    fn reset(&self, gpu: &mut Gpu, req: &Request) -> ResponseHeader {
        if req.header.device >= self.shared.host.gpu_count() && !matches!(gpu, Gpu::Failed) {
            return ResponseHeader::with_status(status::INVALID_DEVICE);
        }
        let pid = self.pid.load(Ordering::Acquire);
        self.end_worker(gpu, Gpu::Idle);
        info!(
            vm = %self.shared.label,
            "session {}: DeviceReset of a session whose worker failed{}; the next op starts a \
             new worker",
            self.id,
            if pid != 0 { format!(": worker process {pid} ended") } else { String::new() }
        );
        ResponseHeader::with_status(status::SUCCESS)
    }

    /// Runs an op in the worker process, starting it if needed.
    fn on_worker(
        &self,
        gpu: &mut Gpu,
        req: &Request,
        rx: &Receiver<Msg>,
        backlog: &mut VecDeque<Msg>,
    ) -> Outcome {
        if let Gpu::Failed = gpu {
            return Outcome::Answered(worker_lost());
        }
        if let Gpu::Idle = gpu {
            let quota = match &self.shared.gpu_memory {
                None => None,
                Some(Ok(q)) => match q.lease() {
                    Some(lease) => Some(lease),
                    // Slots match --max-sessions; only a bug runs out of them.
                    None => {
                        return Outcome::Answered(ResponseHeader::with_status(
                            status::DEVICES_UNAVAILABLE,
                        ))
                    }
                },
                Some(Err(_)) => {
                    return Outcome::Answered(ResponseHeader::with_status(
                        status::MEMORY_ALLOCATION,
                    ))
                }
            };
            let spawned = WorkerProcess::spawn_with_quota(
                &self.shared.command,
                self.id,
                &self.shared.label,
                quota,
            );
            let mut process = match spawned {
                Ok(p) => p,
                Err(e) => {
                    error!(vm = %self.shared.label, "session {}: {e}", self.id);
                    return Outcome::Answered(ResponseHeader::with_status(
                        status::MEMORY_ALLOCATION,
                    ));
                }
            };
            self.pid.store(process.pid(), Ordering::Release);
            let shared = process
                .share_memory(&self.shared.memory())
                .and_then(|()| self.link_host_functions(&mut process));
            *gpu = Gpu::Running {
                process,
                sticky: false,
            };
            if let Err(e) = shared {
                return Outcome::Answered(self.worker_failed(gpu, req.op, &e));
            }
        }
        let Gpu::Running { process, sticky } = gpu else {
            return Outcome::Answered(ResponseHeader::with_status(status::UNKNOWN));
        };
        debug!(vm = %self.shared.label, session = self.id, op = ?req.op, "to worker");
        let sent = Instant::now();
        match process.send(req) {
            Ok(()) => {}
            Err(e @ WorkerError::Unsendable(_)) => {
                warn!(vm = %self.shared.label, "session {}: {e}", self.id);
                return Outcome::Answered(ResponseHeader::with_status(status::INVALID_VALUE));
            }
            Err(e) => return Outcome::Answered(self.worker_failed(gpu, req.op, &e)),
        }
        loop {
            match process.wait(Some(&self.wake)) {
                Ok(Waited::Done(mut resp)) => {
                    self.last_hop
                        .set((ns(sent.elapsed()), process.last_exec_ns()));
                    // A worker's sticky error lasts as long as the worker, even on answers
                    // that do not carry it (a request it refused).
                    *sticky |= resp.flags & RESP_FLAG_STICKY != 0;
                    if *sticky {
                        resp.flags |= RESP_FLAG_STICKY;
                    }
                    return Outcome::Answered(resp);
                }
                Ok(Waited::Woken) => {
                    if self.session_ending(rx, backlog) {
                        warn!(
                            vm = %self.shared.label,
                            "session {}: ending worker process {} with {:?} still running \
                             (the session is closing)",
                            self.id,
                            process.pid(),
                            req.op
                        );
                        self.end_worker(gpu, Gpu::Idle);
                        return Outcome::Interrupted;
                    }
                }
                Err(e) => return Outcome::Answered(self.worker_failed(gpu, req.op, &e)),
            }
        }
    }

    /// Gives a new worker its host-function link.
    fn link_host_functions(&self, process: &mut WorkerProcess) -> Result<(), WorkerError> {
        let (ours, theirs) = host_function_link::socket_pair().map_err(WorkerError::Spawn)?;
        process.send_message(&ToWorker::HostFunctionLink, &[theirs.as_raw_fd()])?;
        drop(theirs);
        self.host_fns.connect(ours).map_err(WorkerError::Spawn)
    }

    /// Moves what is queued into `backlog` and says whether it ends the session. If it does,
    /// the requests queued before the end are answered at once: their process is gone.
    fn session_ending(&self, rx: &Receiver<Msg>, backlog: &mut VecDeque<Msg>) -> bool {
        backlog.extend(rx.try_iter());
        let Some(end) = backlog.iter().position(Msg::ends_session) else {
            return self.abandoned();
        };
        for msg in backlog.drain(..end) {
            if let (Msg::Run(job), false) = (msg, self.abandoned()) {
                job.finish(&worker_lost());
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use qcuda_proto::{Checksum, Direction, RequestHeader, VERSION};
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::split::Descriptor;
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::{chain, guest_buffer::GuestRam};

    const WAIT: Duration = Duration::from_secs(10);

    /// Records completions; a completion may first wait for a gate.
    #[derive(Default)]
    struct Recorder {
        done: Mutex<Vec<(u16, u32)>>,
        cv: Condvar,
    }

    impl Recorder {
        fn wait(&self, n: usize) -> Vec<(u16, u32)> {
            let deadline = Instant::now() + WAIT;
            let mut d = self.done.lock().unwrap();
            while d.len() < n {
                let left = deadline.saturating_duration_since(Instant::now());
                assert!(!left.is_zero(), "only {} of {n} chains completed", d.len());
                d = self.cv.wait_timeout(d, left).unwrap().0;
            }
            d.clone()
        }
    }

    impl ChainCompleter for Recorder {
        fn complete(&self, head: u16, used_len: u32) {
            self.done.lock().unwrap().push((head, used_len));
            self.cv.notify_all();
        }
    }

    /// A one-way latch with a timeout.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        cv: Condvar,
    }

    impl Gate {
        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.cv.notify_all();
        }

        fn wait(&self, timeout: Duration) -> bool {
            let g = self.open.lock().unwrap();
            *self.cv.wait_timeout_while(g, timeout, |o| !*o).unwrap().0
        }
    }

    /// Completes only once `gate` opens (or after a timeout), then records whether it did.
    struct GatedCompleter {
        gate: Arc<Gate>,
        entered: Arc<Gate>,
        saw_open: Arc<Mutex<Option<bool>>>,
        inner: Arc<Recorder>,
    }

    impl ChainCompleter for GatedCompleter {
        fn complete(&self, head: u16, used_len: u32) {
            self.entered.open();
            *self.saw_open.lock().unwrap() = Some(self.gate.wait(WAIT));
            self.inner.complete(head, used_len);
        }
    }

    /// Opens a gate when called, then records.
    struct OpeningCompleter {
        gate: Arc<Gate>,
        inner: Arc<Recorder>,
    }

    impl ChainCompleter for OpeningCompleter {
        fn complete(&self, head: u16, used_len: u32) {
            self.gate.open();
            self.inner.complete(head, used_len);
        }
    }

    struct Guest {
        mem: Arc<GuestRam>,
        table: SessionTable,
        rec: Arc<Recorder>,
        next: u64,
    }

    impl Guest {
        fn new() -> Self {
            Self {
                mem: Arc::new(GuestRam::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap()),
                // No test here starts a worker: the unit-test binary is not vhost-cuda
                // (tests/session_workers.rs covers workers).
                table: SessionTable::new(
                    CudaHost::probe(),
                    WorkerCommand::this_binary(None, "info"),
                    "test",
                ),
                rec: Arc::new(Recorder::default()),
                next: 0,
            }
        }

        /// Lays out a request at a fresh place in guest memory; returns it and where its
        /// output (then response) starts.
        fn request(&mut self, h: RequestHeader, payload: &[u8]) -> (ParsedRequest, u64) {
            let at = 0x1000 + self.next * 0x4000;
            self.next += 1;
            let out_len = h.totals().1;
            let mut stream = h.encode().to_vec();
            stream.extend_from_slice(payload);
            self.mem.write_slice(&stream, GuestAddress(at)).unwrap();
            let out = at + 0x2000;
            let descs = [
                Descriptor::new(at, stream.len() as u32, 0, 0),
                Descriptor::new(out, out_len as u32 + 64, VRING_DESC_F_WRITE as u16, 0),
            ];
            (chain::parse(&self.mem, descs).unwrap(), out)
        }

        fn echo(&mut self, session: u64, payload: &[u8]) -> (ParsedRequest, u64) {
            let mut h = RequestHeader::new(Op::Echo);
            h.session = session;
            h.push_buffer(Direction::In, payload.len() as u64).unwrap();
            h.push_buffer(Direction::Out, payload.len() as u64).unwrap();
            self.request(h, payload)
        }

        fn simple(&mut self, op: Op, session: u64) -> (ParsedRequest, u64) {
            let mut h = RequestHeader::new(op);
            h.session = session;
            h.args[0] = u64::from(VERSION);
            self.request(h, &[])
        }

        fn response(&self, at: u64) -> ResponseHeader {
            let mut b = [0u8; 64];
            self.mem.read_slice(&mut b, GuestAddress(at)).unwrap();
            ResponseHeader::decode(&b).unwrap()
        }

        fn send(&self, head: u16, p: ParsedRequest) {
            self.table.dispatch(head, p, self.rec.clone());
        }
    }

    #[test]
    fn hello_and_echo_run_on_their_sessions() {
        let mut g = Guest::new();
        let (hello, hello_out) = g.simple(Op::Hello, 1);
        let (echo, echo_out) = g.echo(2, b"ping pong");
        g.send(10, hello);
        g.send(11, echo);
        let mut done = g.rec.wait(2);
        done.sort();
        assert_eq!(done, vec![(10, 64), (11, 9 + 64)]);
        let hello = g.response(hello_out);
        assert_eq!(hello.rets[0], u64::from(VERSION));
        assert!(
            (1..=2).contains(&hello.rets[3]),
            "sessions open: {}",
            hello.rets[3]
        );
        let r = g.response(echo_out + 9);
        assert_eq!((r.status, r.rets[0]), (0, Checksum::of(b"ping pong")));
        let mut out = [0u8; 9];
        g.mem.read_slice(&mut out, GuestAddress(echo_out)).unwrap();
        assert_eq!(&out, b"ping pong");
        assert_eq!(g.table.open_count(), 2);
        assert!(g.table.wait_idle(WAIT));
        assert_eq!(g.table.close_all(WAIT), 0);
        assert_eq!(g.table.open_count(), 0);
    }

    #[test]
    fn a_failed_fire_and_forget_op_is_reported_once_in_the_next_waited_for_reply() {
        let mut g = Guest::new();
        // Without a driver, DeviceCount fails (NO_DEVICE) in the daemon itself.
        let mut h = RequestHeader::new(Op::DeviceCount);
        h.session = 4;
        h.flags = FLAG_ASYNC;
        let (failing, _) = g.request(h, &[]);
        let mut h = RequestHeader::new(Op::Echo);
        h.session = 4;
        h.flags = FLAG_ASYNC;
        h.push_buffer(Direction::In, 1).unwrap();
        h.push_buffer(Direction::Out, 1).unwrap();
        let (async_echo, _) = g.request(h, b"y");
        let (first, first_out) = g.simple(Op::Hello, 4);
        let (second, second_out) = g.simple(Op::Hello, 4);
        for (head, p) in [failing, async_echo, first, second].into_iter().enumerate() {
            g.send(head as u16, p);
        }
        g.rec.wait(4);
        let first = g.response(first_out);
        assert_eq!(first.status, status::SUCCESS);
        assert_eq!(first.deferred_error(), status::NO_DEVICE);
        assert_eq!(g.response(second_out).deferred_error(), status::SUCCESS);
        assert!(g.table.wait_idle(WAIT));
        g.table.close_all(WAIT);
    }

    #[test]
    fn requests_of_one_session_complete_in_order() {
        let mut g = Guest::new();
        let reqs: Vec<_> = (0..40u8).map(|i| g.echo(3, &[i; 100]).0).collect();
        for (i, r) in reqs.into_iter().enumerate() {
            g.send(i as u16, r);
        }
        let heads: Vec<u16> = g.rec.wait(40).iter().map(|d| d.0).collect();
        assert_eq!(heads, (0..40).collect::<Vec<u16>>());
        assert_eq!(g.table.open_count(), 1);
    }

    #[test]
    fn a_blocked_session_does_not_block_another() {
        let mut g = Guest::new();
        let gate = Arc::new(Gate::default());
        let saw_open = Arc::new(Mutex::new(None));
        let (slow, _) = g.simple(Op::Hello, 1);
        let (fast, _) = g.simple(Op::Hello, 2);
        g.table.dispatch(
            1,
            slow,
            Arc::new(GatedCompleter {
                gate: gate.clone(),
                entered: Arc::default(),
                saw_open: saw_open.clone(),
                inner: g.rec.clone(),
            }),
        );
        g.table.dispatch(
            2,
            fast,
            Arc::new(OpeningCompleter {
                gate,
                inner: g.rec.clone(),
            }),
        );
        g.rec.wait(2);
        // Session 1's completion only went ahead once session 2's had run.
        assert_eq!(*saw_open.lock().unwrap(), Some(true));
    }

    #[test]
    fn host_latency_reports_where_each_op_spent_its_time() {
        let mut g = Guest::new();
        for i in 0..3 {
            let (hello, _) = g.simple(Op::Hello, 8);
            g.send(i, hello);
        }
        let mut h = RequestHeader::new(Op::HostLatency);
        h.session = 8;
        h.push_buffer(Direction::Out, 2 * LATENCY_RECORD_SIZE as u64)
            .unwrap();
        let (lat, out) = g.request(h, &[]);
        g.send(3, lat);
        g.rec.wait(4);
        let r = g.response(out + 2 * LATENCY_RECORD_SIZE as u64);
        assert_eq!((r.status, r.rets[0], r.rets[1]), (0, 1, 1));
        let mut b = [0u8; LATENCY_RECORD_SIZE];
        g.mem.read_slice(&mut b, GuestAddress(out)).unwrap();
        let rec = LatencyRecord::decode(&b).unwrap();
        assert_eq!((rec.op, rec.count, rec.worker_ns), (Op::Hello as u32, 3, 0));
        assert!(rec.host_ns >= rec.queue_ns);
    }

    #[test]
    fn a_host_function_wait_parks_beside_the_session_queue_until_the_session_closes() {
        let mut g = Guest::new();
        let (wait, wait_out) = g.simple(Op::HostFuncWait, 6);
        g.send(0, wait);
        let (hello, _) = g.simple(Op::Hello, 6);
        g.send(1, hello);
        // The Hello behind it completes; the wait stays parked.
        assert_eq!(g.rec.wait(1), vec![(1, 64)]);
        let (again, again_out) = g.simple(Op::HostFuncWait, 6);
        g.send(2, again);
        let (close, _) = g.simple(Op::SessionClose, 6);
        g.send(3, close);
        let mut done: Vec<u16> = g.rec.wait(4).iter().map(|d| d.0).collect();
        done.sort();
        assert_eq!(done, [0, 1, 2, 3]);
        for at in [wait_out, again_out] {
            assert_eq!(g.response(at).status, status::CUDART_UNLOADING);
        }
        assert_eq!(g.table.open_count(), 0);
    }

    #[test]
    fn chains_past_the_in_flight_bound_are_answered_at_once() {
        let mut g = Guest::new();
        Arc::get_mut(&mut g.table.shared).unwrap().max_in_flight = 4;
        let gate = Arc::new(Gate::default());
        let entered = Arc::new(Gate::default());
        let (first, _) = g.simple(Op::Hello, 1);
        // The session's thread blocks completing its first chain: the next ones stay queued.
        g.table.dispatch(
            0,
            first,
            Arc::new(GatedCompleter {
                gate: gate.clone(),
                entered: entered.clone(),
                saw_open: Arc::default(),
                inner: g.rec.clone(),
            }),
        );
        assert!(entered.wait(WAIT));
        for head in 1..4 {
            let (p, _) = g.simple(Op::Hello, 1);
            g.send(head, p);
        }
        assert_eq!(g.table.in_flight(), 4);
        // Any session's: the bound is the VM's.
        let (extra, extra_out) = g.simple(Op::Hello, 2);
        g.send(9, extra);
        assert_eq!(g.rec.wait(1), vec![(9, 64)]);
        assert_eq!(g.response(extra_out).status, status::MEMORY_ALLOCATION);
        assert_eq!(g.table.open_count(), 1);
        gate.open();
        g.rec.wait(5);
        assert!(g.table.wait_idle(WAIT));
        let (again, again_out) = g.simple(Op::Hello, 2);
        g.send(10, again);
        g.rec.wait(6);
        assert_eq!(g.response(again_out).status, status::SUCCESS);
        g.table.close_all(WAIT);
    }

    #[test]
    fn session_close_frees_the_session_and_the_id_can_come_back() {
        let mut g = Guest::new();
        let (a, _) = g.echo(5, b"x");
        g.send(0, a);
        g.rec.wait(1);
        assert_eq!(g.table.open_count(), 1);
        let (close, close_out) = g.simple(Op::SessionClose, 5);
        g.send(1, close);
        assert_eq!(g.rec.wait(2)[1], (1, 64));
        assert_eq!(g.response(close_out).status, status::SUCCESS);
        assert_eq!(g.table.open_count(), 0);

        // Closing a session that never existed opens nothing.
        let (close, close_out) = g.simple(Op::SessionClose, 6);
        g.send(2, close);
        g.rec.wait(3);
        assert_eq!(g.response(close_out).status, status::SUCCESS);
        assert_eq!(g.table.open_count(), 0);

        let (again, _) = g.simple(Op::Hello, 5);
        g.send(3, again);
        g.rec.wait(4);
        assert_eq!(g.table.open_count(), 1);
    }

    #[test]
    fn driver_reset_closes_every_session_and_counts_them() {
        let mut g = Guest::new();
        for (head, session) in [(0, 1), (1, 2), (2, 3)] {
            let (hello, _) = g.simple(Op::Hello, session);
            g.send(head, hello);
        }
        g.rec.wait(3);
        assert_eq!(g.table.open_count(), 3);

        // The module sends session 0; the id means nothing to the op.
        let (reset, reset_out) = g.simple(Op::DriverReset, 0);
        g.send(3, reset);
        assert_eq!(g.rec.wait(4)[3], (3, 64));
        let r = g.response(reset_out);
        assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 3));
        // Answered only once they had ended.
        assert_eq!(g.table.open_count(), 0);
        assert!(g.table.shared.threads().is_empty());

        // Nothing left: nothing closed. A session opened afterwards is the only one, and an id
        // of the old instance opens a new session.
        let (reset, reset_out) = g.simple(Op::DriverReset, 7);
        g.send(4, reset);
        g.rec.wait(5);
        assert_eq!(g.response(reset_out).rets[0], 0);
        let (hello, hello_out) = g.simple(Op::Hello, 2);
        g.send(5, hello);
        g.rec.wait(6);
        assert_eq!(g.response(hello_out).rets[3], 1);
        assert_eq!(g.table.open_count(), 1);
    }

    #[test]
    fn driver_reset_drops_stale_requests_and_blocks_no_new_session() {
        let mut g = Guest::new();
        let gate = Arc::new(Gate::default());
        let entered = Arc::new(Gate::default());
        let saw_open = Arc::new(Mutex::new(None));
        // Session 1 of the old instance is stuck completing a chain, with more queued behind.
        let (running, _) = g.simple(Op::Hello, 1);
        g.table.dispatch(
            0,
            running,
            Arc::new(GatedCompleter {
                gate: gate.clone(),
                entered: entered.clone(),
                saw_open,
                inner: g.rec.clone(),
            }),
        );
        for head in 1..4 {
            let (queued, _) = g.simple(Op::Hello, 1);
            g.send(head, queued);
        }
        assert!(entered.wait(WAIT));

        let (reset, reset_out) = g.simple(Op::DriverReset, 0);
        g.send(10, reset);
        // The reset waits for session 1; a session of the new instance is served meanwhile,
        // and is not closed by the reset under way.
        let (hello, hello_out) = g.simple(Op::Hello, 2);
        g.send(11, hello);
        assert_eq!(g.rec.wait(1), vec![(11, 64)]);
        assert_eq!(g.response(hello_out).status, status::SUCCESS);
        thread::sleep(Duration::from_millis(50));
        assert_eq!(
            g.rec.done.lock().unwrap().len(),
            1,
            "the reset answered early"
        );

        gate.open();
        let done = g.rec.wait(3);
        assert_eq!(done[1..], [(0, 64), (10, 64)]);
        assert_eq!(g.response(reset_out).rets[0], 1);
        // The queued requests of the old instance were dropped, never completed.
        assert!(g.table.wait_idle(WAIT));
        assert_eq!(g.rec.done.lock().unwrap().len(), 3);
        assert_eq!(g.table.open_count(), 1);
        assert_eq!(g.table.close_all(WAIT), 0);
    }

    #[test]
    fn host_queries_are_answered_without_a_worker() {
        let mut g = Guest::new();
        let (p, out) = g.simple(Op::DriverVersion, 8);
        g.mem.write_slice(&[0xff; 64], GuestAddress(out)).unwrap();
        g.send(0, p);
        assert_eq!(g.rec.wait(1)[0], (0, 64));
        let r = g.response(out);
        assert_eq!(r.status, status::SUCCESS);
        assert_eq!(r.rets[0], u64::from(g.table.shared.host.driver_version()));
        assert_eq!(g.table.worker_pid(8), None);
        assert_eq!(g.table.open_count(), 1);
    }

    #[test]
    fn host_unmap_without_a_worker_maps_nothing_and_starts_none() {
        let mut g = Guest::new();
        let (p, out) = g.simple(Op::HostUnmap, 9);
        g.send(0, p);
        assert_eq!(g.rec.wait(1)[0], (0, 64));
        assert_eq!(g.response(out).status, status::HOST_MEMORY_NOT_REGISTERED);
        assert_eq!(g.table.worker_pid(9), None);
    }

    #[test]
    fn close_all_drops_queued_requests_without_completing_them() {
        let mut g = Guest::new();
        let gate = Arc::new(Gate::default());
        let entered = Arc::new(Gate::default());
        let saw_open = Arc::new(Mutex::new(None));
        let (running, _) = g.simple(Op::Hello, 1);
        g.table.dispatch(
            0,
            running,
            Arc::new(GatedCompleter {
                gate: gate.clone(),
                entered: entered.clone(),
                saw_open,
                inner: g.rec.clone(),
            }),
        );
        let queued: Vec<_> = (0..5).map(|_| g.simple(Op::Hello, 1).0).collect();
        for (i, q) in queued.into_iter().enumerate() {
            g.send(1 + i as u16, q);
        }
        assert_eq!(g.table.in_flight(), 6);
        assert!(entered.wait(WAIT));
        // The worker is stuck in the first completion: close_all times out, then finishes
        // in the background once the gate opens.
        assert_eq!(g.table.close_all(Duration::from_millis(50)), 1);
        gate.open();
        assert!(g.table.wait_idle(WAIT));
        assert!(g.table.shared.wait_for(WAIT, |c| c.open == 0));
        assert_eq!(g.rec.done.lock().unwrap().len(), 1);
    }
}

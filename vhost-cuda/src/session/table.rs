//! The session table of one VM: session id → session thread, the counters the daemon waits
//! on, and how a request finds (or starts) its session's thread.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    fs::File,
    os::fd::OwnedFd,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        mpsc::{self, SendError, Sender},
        Arc, Condvar, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{status, Op, ResponseHeader};
use tracing::{error, info, warn};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use qcuda_proto::{PROCESS_GET_RESTORE_THREAD, PROCESS_GET_STATE, PROCESS_LOCK};

use super::{
    account::{SessionAccount, VmTotals, VmUsage},
    handover::Piece,
    limits::{MAX_IN_FLIGHT, MAX_SESSIONS},
    migration::{SavedGpu, SessionState},
    precopy::{SessionRound, Stores},
    process_checkpoint::{is_transition, ProcessState},
    shared::{
        end_sessions, Adopting, ChainCompleter, Counters, InFlight, Job, Msg, PrecopyAsk, SaveMode,
        SessionHandle, Shared, Transition,
    },
    thread::{Restore, SessionThread},
    usage::{self, UsageView},
};
use crate::{
    chain::ParsedRequest,
    cuda::CudaHost,
    fd_store::{self, StoredWorker},
    guest_buffer::{GuestRam, Request},
    host_function_link::HostFnLink,
    limits::{GpuMemoryQuota, NO_LIMIT},
    sandbox::ChildProcess,
    worker::WorkerCommand,
};

/// The sessions of one VM (one vhost-user connection).
pub struct SessionTable {
    pub(super) shared: Arc<Shared>,
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
        Self::with_quota_file(host, command, label, None)
    }

    /// Like [`SessionTable::new`], counting in the accounting file a previous daemon left
    /// (`quota_file`, from systemd's file-descriptor store), if any, so that the workers taken
    /// over from it ([`SessionTable::adopt`]) keep counting where this table reads. When the
    /// command keeps its workers for the next daemon, the file is kept for it too.
    pub fn with_quota_file(
        host: Arc<CudaHost>,
        command: WorkerCommand,
        label: impl Into<String>,
        quota_file: Option<OwnedFd>,
    ) -> Self {
        let limits = command.limits();
        let label = label.into();
        let max_sessions = limits
            .max_sessions
            .unwrap_or(MAX_SESSIONS)
            .min(MAX_SESSIONS);
        let memory_limited = limits.max_gpu_memory.is_some();
        let limit = limits.max_gpu_memory.unwrap_or(NO_LIMIT);
        let adopted = quota_file.and_then(|f| {
            GpuMemoryQuota::from_file(File::from(f), limit)
                .inspect_err(|e| {
                    warn!(vm = %label, "the previous daemon's accounting file is unusable: {e}");
                })
                .ok()
        });
        let gpu_memory = adopted
            .map_or_else(|| GpuMemoryQuota::new(limit, max_sessions), Ok)
            .map_err(|e| {
                if memory_limited {
                    error!(
                        vm = %label,
                        "cannot set up --max-gpu-memory: {e}; no GPU work will run"
                    );
                } else {
                    error!(
                        vm = %label,
                        "cannot set up GPU-memory accounting: {e}; sessions run uncounted"
                    );
                }
                e.to_string()
            });
        clear_shared_shm(&command, &label);
        if let (Some(keep), Ok(q)) = (command.keep(), &gpu_memory) {
            let name = fd_store::quota_name(keep.vm());
            keep.store().remove(&name);
            if let Err(e) = keep.store().store(&name, &[q.fd()]) {
                warn!(vm = %label, "accounting file not kept for a restart: {e}");
            }
        }
        Self {
            shared: Arc::new(Shared {
                host,
                command,
                max_sessions,
                max_in_flight: MAX_IN_FLIGHT,
                flooded: AtomicBool::new(false),
                gpu_memory,
                memory_limited,
                totals: VmTotals::default(),
                label,
                threads: Mutex::new(HashMap::new()),
                memory: Mutex::new(Arc::new(GuestRam::new())),
                next_generation: AtomicU64::new(0),
                counters: Mutex::new(Counters::default()),
                changed: Condvar::new(),
                ipc: super::ipc_broker::IpcBroker::default(),
                spares: super::shared::Spares::default(),
            }),
        }
    }

    /// Keeps `--spare-workers` workers started ahead of this VM's sessions from now on (the
    /// VM connected).
    pub fn start_spares(&self) {
        self.shared.start_spares();
    }

    /// Ends the spare workers (the VM went away); sessions start their own until
    /// [`SessionTable::start_spares`].
    pub fn stop_spares(&self) {
        self.shared.stop_spares();
    }

    /// Process ids of the spare workers waiting now.
    pub fn spare_pids(&self) -> Vec<u32> {
        self.shared.spare_pids()
    }

    /// How many of this VM's sessions' worker processes were reaped so far (spares that never
    /// served are not counted).
    pub fn workers_ended(&self) -> u64 {
        self.shared.totals.workers_ended.load(Ordering::Acquire)
    }

    /// Sessions of this VM not yet ended.
    pub fn open_count(&self) -> usize {
        self.shared.counters().open
    }

    /// Chains handed to session threads and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.shared.counters().in_flight
    }

    /// Bytes of device memory this VM's workers hold now (`None`: not counted, the
    /// accounting file could not be made).
    pub fn gpu_memory_used(&self) -> Option<u64> {
        self.shared
            .gpu_memory
            .as_ref()
            .ok()
            .map(GpuMemoryQuota::used)
    }

    /// What the VM uses of the host now.
    pub fn usage(&self) -> VmUsage {
        usage::snapshot(&self.shared, None)
    }

    /// A reader of [`SessionTable::usage`] that does not keep the table alive.
    pub fn usage_view(&self) -> UsageView {
        UsageView(Arc::downgrade(&self.shared))
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

    /// Takes over the workers a previous daemon left (systemd's file-descriptor store): each
    /// gets a session thread under its session id, with its slot of the accounting file, so
    /// that the guest process's next request reaches the worker that holds its state. The
    /// thread finishes the takeover itself (`WorkerProcess::adopt`, which waits for an op the
    /// worker may still be running).
    pub fn adopt(&self, workers: Vec<StoredWorker>) {
        for w in workers {
            let id = w.session;
            let quota = match (&self.shared.gpu_memory, w.slot) {
                (Ok(q), Some(slot)) => q.claim(slot),
                _ => None,
            };
            let mut threads = self.shared.threads();
            if threads.contains_key(&id) || threads.len() >= self.shared.max_sessions {
                drop(threads);
                warn!(
                    vm = %self.shared.label,
                    "session {id}: worker process {} of the previous daemon not taken over \
                     (session taken or too many sessions); ending it",
                    w.pid
                );
                if let Some(k) = self.shared.command.keep() {
                    k.store()
                        .remove(&fd_store::worker_name(k.vm(), id, w.pid, w.slot));
                }
                drop(ChildProcess::adopted(w.pid, w.pidfd).kill());
                continue;
            }
            if let Err(e) = self.start_thread(
                &mut threads,
                id,
                0,
                Some(Adopting { worker: w, quota }),
                None,
            ) {
                error!(vm = %self.shared.label, "session {id}: cannot take its worker over: {e}");
            }
        }
    }

    /// Starts the thread of session `id` (guest process `guest_pid`, 0 if not known yet) and
    /// puts it in `threads`; `adopting`: it starts with a worker of the previous daemon.
    fn start_thread(
        &self,
        threads: &mut HashMap<u64, SessionHandle>,
        id: u64,
        guest_pid: u32,
        adopting: Option<Adopting>,
        restore: Option<Restore>,
    ) -> std::io::Result<Sender<Msg>> {
        let wake = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let (tx, rx) = mpsc::channel();
        let generation = self.shared.next_generation.fetch_add(1, Ordering::Relaxed);
        let abandoned = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicU32::new(0));
        let account = Arc::new(SessionAccount::new(id, guest_pid, pid.clone()));
        let ended = Arc::new(AtomicBool::new(false));
        let host_fns = Arc::new(HostFnLink::default());
        let process = Arc::new(ProcessState::default());
        let thread = SessionThread {
            process: process.clone(),
            shared: self.shared.clone(),
            id,
            generation,
            abandoned: abandoned.clone(),
            wake: wake.clone(),
            pid: pid.clone(),
            account: account.clone(),
            ended: ended.clone(),
            host_fns: host_fns.clone(),
            latency: RefCell::default(),
            last_hop: Cell::new((0, 0)),
            adopting,
            restore,
        };
        thread::Builder::new()
            .name(format!("qcuda-s{id}"))
            .spawn(move || thread.run(rx))?;
        threads.insert(
            id,
            SessionHandle {
                tx: tx.clone(),
                generation,
                abandoned,
                wake,
                pid,
                account,
                ended,
                host_fns,
                process,
            },
        );
        Ok(tx)
    }

    /// Hands a parsed request to its session's thread, starting the thread if needed. The chain
    /// is completed through `completer`, from the session's thread (a `DriverReset`'s from a
    /// thread of its own).
    pub fn dispatch(&self, head: u16, parsed: ParsedRequest, completer: Arc<dyn ChainCompleter>) {
        let id = parsed.request.header().session;
        if parsed.request.op() != Op::DriverReset && self.in_flight() >= self.shared.max_in_flight {
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
        if job.request.op() == Op::DriverReset {
            // Whatever session id it carries: it is about the whole table.
            self.driver_reset(job);
            return;
        }
        if job.request.op() == Op::ProcessCheckpoint {
            // About another session (the target), which may be this one: never queued behind
            // the caller's own requests.
            self.process_checkpoint(job);
            return;
        }
        let job = if job.request.op() == Op::GpuTrace {
            // The session the kernel module named; the caller's own goes the usual way.
            match self.gpu_trace(job) {
                Some(own) => own,
                None => return,
            }
        } else {
            job
        };
        let mut threads = self.shared.threads();
        if job.request.op() == Op::HostFuncWait {
            if let Some(w) = threads.get(&id) {
                let link = Arc::clone(&w.host_fns);
                drop(threads);
                link.wait(job.request.header().args[0], Box::new(job));
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
        if job.request.op() == Op::SessionClose {
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
        let host_fns =
            match self.start_thread(&mut threads, id, job.request.header().pid, None, None) {
                Ok(_) => threads.get(&id).map(|h| h.host_fns.clone()),
                Err(e) => {
                    drop(threads);
                    error!(vm = %self.shared.label, "session {id}: cannot start its thread: {e}");
                    job.finish(&ResponseHeader::with_status(status::MEMORY_ALLOCATION));
                    return;
                }
            };
        let Some(handle) = threads.get(&id) else {
            return;
        };
        if job.request.op() == Op::HostFuncWait {
            // The session's first request: its thread starts with nothing to do.
            if let Some(link) = host_fns {
                link.wait(job.request.header().args[0], job);
            }
        } else {
            // The receiver lives until the thread ends, and it cannot end before receiving.
            let _ = handle.tx.send(Msg::Run(job));
        }
    }

    /// A migration's source, with the request ring stopped and idle: every session's state
    /// (`migration.rs`), its worker's saved state included. The sessions go on running (a
    /// migration that fails resumes them as they were). Fails with the first session that
    /// cannot be saved (what it holds cannot be saved, it is paused, or its worker failed
    /// meanwhile), or after `timeout`.
    pub fn save_states(&self, timeout: Duration) -> Result<Vec<SessionState>, String> {
        self.save_as(SaveMode::Full, timeout)
            .map(|(states, _)| states)
    }

    /// [`save_states`](Self::save_states) without the allocations' contents: a migration's
    /// last stop, which quiesces every worker (its GPU work synchronised, nothing more to
    /// write into guest RAM) and checks that each state can be saved, before the path is
    /// chosen.
    pub fn save_records(&self, timeout: Duration) -> Result<Vec<SessionState>, String> {
        self.save_as(SaveMode::Record, timeout)
            .map(|(states, _)| states)
    }

    /// A same-host handover's source: every worker exports the memory of its runs and saves
    /// its state without their contents. The states (in session order, as the stream carries
    /// them) and the pieces of every session, one after the other in that order. The workers
    /// go on running, their memory where it was.
    pub fn export_states(
        &self,
        timeout: Duration,
    ) -> Result<(Vec<SessionState>, Vec<Piece>), String> {
        self.save_as(SaveMode::Export, timeout)
    }

    /// One round of a migration's pre-copy: every session with a worker writes a chunk log of
    /// at most `budget` bytes (but one chunk at least) of the device memory changed since it
    /// last sent it, in at most `passes` passes over its memory. The sessions' logs, in
    /// session order (sessions without a worker send none), with the bytes each still has to
    /// pre-copy; an error if one could not (the migration then fails, the VM runs on).
    pub fn precopy_round(
        &self,
        budget: u64,
        passes: u32,
        timeout: Duration,
    ) -> Result<Vec<SessionRound>, String> {
        let mut asked = Vec::new();
        {
            let threads = self.shared.threads();
            let each = (budget / threads.len().max(1) as u64).max(super::precopy::CHUNK);
            for (&id, t) in threads.iter() {
                let (reply, answer) = mpsc::channel();
                let ask = PrecopyAsk::Round {
                    budget: each,
                    passes,
                    reply,
                };
                if t.send(Msg::Precopy(ask)).is_ok() {
                    asked.push((id, answer));
                }
            }
        }
        let deadline = Instant::now() + timeout;
        let mut rounds = Vec::with_capacity(asked.len());
        for (id, answer) in asked {
            let left = deadline.saturating_duration_since(Instant::now());
            match answer.recv_timeout(left) {
                Ok(Ok(Some(r))) => rounds.push(SessionRound {
                    id,
                    log: r.log,
                    chunks: r.chunks,
                    pending: r.pending,
                }),
                Ok(Ok(None)) => {}
                Ok(Err(why)) => return Err(format!("session {id}: {why}")),
                // A session that ended meanwhile has nothing more to send.
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "session {id}: no pre-copy round within {timeout:?}"
                    ))
                }
            }
        }
        rounds.sort_by_key(|r| r.id);
        Ok(rounds)
    }

    /// Every session's worker forgets what its pre-copy sent: a migration that ended without
    /// a stop (failed or cancelled), or a new one.
    pub fn precopy_reset(&self) {
        for t in self.shared.threads().values() {
            let _ = t.send(Msg::Precopy(PrecopyAsk::Reset));
        }
    }

    /// Bytes of memory of every GPU the VM's guest devices are.
    pub fn gpu_memory(&self) -> u64 {
        let host = &self.shared.host;
        (0..host.gpu_count())
            .filter_map(|i| host.gpu_info(i).map(|g| g.total_mem))
            .sum()
    }

    /// The UUID of each guest device's GPU, in guest-device order (none without a driver): what
    /// a handover's offer names, and what a destination compares with it.
    pub fn gpu_uuids(&self) -> Vec<[u8; 16]> {
        let host = &self.shared.host;
        (0..host.gpu_count())
            .filter_map(|i| host.gpu_info(i).map(|g| g.uuid))
            .collect()
    }

    fn save_as(
        &self,
        mode: SaveMode,
        timeout: Duration,
    ) -> Result<(Vec<SessionState>, Vec<Piece>), String> {
        let mut asked = Vec::new();
        for (&id, t) in self.shared.threads().iter() {
            let (reply, answer) = mpsc::channel();
            if t.send(Msg::SaveState(mode, reply)).is_ok() {
                asked.push((id, t.account.pid(), answer));
            }
        }
        let deadline = Instant::now() + timeout;
        let mut states = Vec::with_capacity(asked.len());
        for (id, pid, answer) in asked {
            let left = deadline.saturating_duration_since(Instant::now());
            match answer.recv_timeout(left) {
                Ok(Ok(saved)) => states.push((
                    SessionState {
                        id,
                        pid,
                        gpu: saved.gpu,
                    },
                    saved.pieces,
                )),
                Ok(Err(why)) => return Err(format!("session {id}: {why}")),
                // The session ended meanwhile: nothing of it to move.
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("session {id}: no answer within {timeout:?}"))
                }
            }
        }
        states.sort_unstable_by_key(|(s, _)| s.id);
        let mut pieces = Vec::new();
        let states = states
            .into_iter()
            .map(|(s, p)| {
                pieces.extend(p);
                s
            })
            .collect();
        Ok((states, pieces))
    }

    /// A migration's destination: starts a session for each of `states` under its id, with a
    /// worker restored from its saved state. All or nothing: if one fails, every session
    /// started by this call is ended again (no other) and the reason returned (the migration then fails, and the
    /// VM keeps running on its source).
    pub fn restore_states(
        &self,
        states: Vec<SessionState>,
        timeout: Duration,
    ) -> Result<(), String> {
        self.restore_handed_over(states, Vec::new(), timeout)
    }

    /// [`restore_states`](Self::restore_states) where device memory was handed over: `pieces`
    /// are the source's runs, claimed (`session/handover.rs`), each handed-over session's
    /// own taken in turn, in the states' order. Every piece must be some session's.
    pub fn restore_handed_over(
        &self,
        states: Vec<SessionState>,
        pieces: Vec<Piece>,
        timeout: Duration,
    ) -> Result<(), String> {
        self.restore_all(states, pieces, None, timeout)
    }

    /// [`restore_states`](Self::restore_states) after a pre-copy: each session's worker is
    /// given its store of pre-copied chunks from `stores`, from which its state's references
    /// are filled (a session without a store gets none, and refuses a state with references).
    pub fn restore_precopied(
        &self,
        states: Vec<SessionState>,
        stores: &mut Stores,
        timeout: Duration,
    ) -> Result<(), String> {
        self.restore_all(states, Vec::new(), Some(stores), timeout)
    }

    fn restore_all(
        &self,
        states: Vec<SessionState>,
        pieces: Vec<Piece>,
        mut stores: Option<&mut Stores>,
        timeout: Duration,
    ) -> Result<(), String> {
        let wanted: u64 = states
            .iter()
            .map(|s| match s.gpu {
                SavedGpu::HandedOver { pieces, .. } => u64::from(pieces),
                _ => 0,
            })
            .sum();
        if wanted != pieces.len() as u64 {
            return Err(format!(
                "the states name {wanted} pieces of device memory, {} were handed over",
                pieces.len()
            ));
        }
        let mut pieces = pieces.into_iter();
        let mut waits = Vec::with_capacity(states.len());
        let mut started = Vec::with_capacity(states.len());
        let mut failed = None;
        {
            let mut threads = self.shared.threads();
            for s in states {
                if threads.contains_key(&s.id) {
                    failed = Some(format!("session {} is open here already", s.id));
                    break;
                }
                if threads.len() >= self.shared.max_sessions {
                    failed = Some(format!("more than {} sessions", self.shared.max_sessions));
                    break;
                }
                let (reply, answer) = mpsc::channel();
                let mine = match s.gpu {
                    SavedGpu::HandedOver { pieces: n, .. } => {
                        pieces.by_ref().take(n as usize).collect()
                    }
                    _ => Vec::new(),
                };
                let store = match stores.as_mut().map(|st| st.take(s.id)).transpose() {
                    Ok(store) => store.flatten(),
                    Err(e) => {
                        failed = Some(format!("session {}: its pre-copied chunks: {e}", s.id));
                        break;
                    }
                };
                let restore = Restore {
                    gpu: s.gpu,
                    pieces: mine,
                    store,
                    reply,
                };
                match self.start_thread(&mut threads, s.id, s.pid, None, Some(restore)) {
                    Ok(_) => {
                        started.push(s.id);
                        waits.push((s.id, answer));
                    }
                    Err(_) => {
                        failed = Some(format!("session {}: cannot start its thread", s.id));
                        break;
                    }
                }
            }
        }
        let deadline = Instant::now() + timeout;
        for (id, answer) in waits {
            if failed.is_some() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match answer.recv_timeout(left) {
                Ok(Ok(())) => {}
                Ok(Err(why)) => failed = Some(format!("session {id}: {why}")),
                Err(_) => failed = Some(format!("session {id}: not restored within {timeout:?}")),
            }
        }
        let Some(why) = failed else {
            return Ok(());
        };
        // End what this restore started, and only that.
        let ended: Vec<SessionHandle> = {
            let mut threads = self.shared.threads();
            started.iter().filter_map(|id| threads.remove(id)).collect()
        };
        let n = ended.len();
        end_sessions(ended, "its migration was refused");
        let target = self.open_count().saturating_sub(n);
        self.shared
            .wait_for(CLOSE_WAIT_AFTER_REFUSAL, |c| c.open <= target);
        Err(why)
    }
}

impl SessionTable {
    /// `GpuTrace` naming session args[3] (stamped by the kernel module: the caller's own, or a
    /// process the caller may act on; this VM's table holds only this VM's sessions). Another
    /// session's goes to its thread, restamped as its own; the caller's own is handed back.
    fn gpu_trace(&self, mut job: Job) -> Option<Job> {
        let h = *job.request.header();
        let target = h.args[3];
        if target == h.session {
            return Some(job);
        }
        let threads = self.shared.threads();
        let Some(handle) = threads.get(&target) else {
            drop(threads);
            // No such session of this VM: the process has not used CUDA (or has ended).
            job.finish(&ResponseHeader::with_status(status::INITIALIZATION_ERROR));
            return None;
        };
        let mut header = h;
        header.session = target;
        // The caller's pid is not the target's (the target's thread notes pids of its own
        // requests).
        header.pid = 0;
        match Request::new(
            header,
            job.request.inputs().to_vec(),
            job.request.outputs().to_vec(),
        ) {
            Ok(r) => job.request = r,
            Err(_) => {
                drop(threads);
                job.finish(&ResponseHeader::with_status(status::INVALID_VALUE));
                return None;
            }
        }
        if let Err(SendError(Msg::Trace(job))) = handle.tx.send(Msg::Trace(Box::new(job))) {
            drop(threads);
            job.finish(&ResponseHeader::with_status(status::INITIALIZATION_ERROR));
        }
        None
    }
}

/// How long a refused restore waits for the sessions it had started to end.
const CLOSE_WAIT_AFTER_REFUSAL: Duration = Duration::from_secs(10);

impl SessionTable {
    /// Takes every session out of the table: requests with their ids start new sessions.
    pub(super) fn take_all(&self) -> Vec<SessionHandle> {
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
        self.shared.stop_spares();
        self.close_all(Duration::ZERO);
        clear_shared_shm(&self.shared.command, &self.shared.label);
    }
}

/// Empties the VM's shared `/dev/shm` (what its workers' driver left), unless its workers are
/// kept for the next daemon, which go on using it.
fn clear_shared_shm(command: &WorkerCommand, label: &str) {
    if command.keep().is_none() {
        if let Some(shm) = command.shared_shm() {
            shm.clear_vm(label);
        }
    }
}

impl SessionTable {
    /// `ProcessCheckpoint` from any session of this VM: args[0] = action, args[2] = the lock's
    /// timeout in ms, args[3] = the target's session, args[4] = the target's pid as its caller
    /// numbers it (both stamped by the guest kernel module).
    pub(super) fn process_checkpoint(&self, job: Job) {
        let args = job.request.header().args;
        let (action, timeout_ms, target) = (args[0], args[2], args[3]);
        if action != PROCESS_GET_STATE
            && action != PROCESS_GET_RESTORE_THREAD
            && !is_transition(action)
        {
            job.finish(&ResponseHeader::with_status(status::INVALID_VALUE));
            return;
        }
        let threads = self.shared.threads();
        let Some(handle) = threads.get(&target) else {
            drop(threads);
            // No such session of this VM: the process has not used CUDA (or has ended).
            job.finish(&ResponseHeader::with_status(status::INITIALIZATION_ERROR));
            return;
        };
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        match action {
            PROCESS_GET_STATE => {
                resp.rets[0] = handle.process.get();
            }
            // Nothing of the process takes part in a restore (the daemon restores the
            // worker), so any of its threads will do: its main thread, whose id is the pid.
            PROCESS_GET_RESTORE_THREAD => resp.rets[0] = args[4],
            _ => {
                let t = Transition::new(action, Box::new(job));
                if handle.send_transition(t.clone()).is_err() {
                    drop(threads);
                    if let Some(job) = t.take() {
                        job.finish(&ResponseHeader::with_status(status::INITIALIZATION_ERROR));
                    }
                    return;
                }
                drop(threads);
                if action == PROCESS_LOCK && timeout_ms != 0 {
                    let timer = t.clone();
                    let spawned = thread::Builder::new()
                        .name(format!("qcuda-lock{target}"))
                        .spawn(move || timer.expire_after(Duration::from_millis(timeout_ms)));
                    if let Err(e) = spawned {
                        // The lock then waits without a bound, as one without a timeout.
                        warn!(
                            vm = %self.shared.label,
                            "session {target}: cannot time the lock: {e}"
                        );
                    }
                }
                return;
            }
        }
        drop(threads);
        job.finish(&resp);
    }
}

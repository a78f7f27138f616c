//! The thread of one session: runs its requests in arrival order, answers what needs no GPU
//! itself, and drives the session's worker process for the rest.

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    mem,
    os::fd::{AsRawFd, RawFd},
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering},
        mpsc::Receiver,
        Arc,
    },
    time::{Duration, Instant},
};

use qcuda_proto::{
    status, Op, ResponseHeader, FLAG_ASYNC, PROCESS_CHECKPOINT, PROCESS_RESTORE,
    PROCESS_STATE_CHECKPOINTED, RESP_FLAG_STICKY,
};
use tracing::{debug, error, info, warn};
use vmm_sys_util::eventfd::EventFd;

use super::{
    account::{bytes_text, SessionAccount},
    handover::Piece,
    latency::{ns, LatencyStats},
    migration::SavedGpu,
    process_checkpoint::{self, ProcessState},
    shared::{Adopting, Msg, PrecopyAsk, SaveMode, Saved, Shared},
    usage,
};
use crate::{
    guest_buffer::{GuestRam, Request},
    host_function_link::{self, HostFnLink},
    spin_wait, transport_ops,
    worker::message::{IpcCall, ToWorker},
    worker::{PrecopiedByWorker, StateFile, Waited, WorkerError, WorkerProcess, CLOSE_WAIT},
};

/// Sessions open in this process, over all VMs.
static OPEN_SESSIONS_TOTAL: AtomicUsize = AtomicUsize::new(0);

/// How long a failed worker is given to end by itself before SIGKILL (its pid-namespace init
/// reports the worker's signal within milliseconds of it).
const LOST_WORKER_GRACE: Duration = Duration::from_millis(500);

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

/// The thread of one session.
pub(super) struct SessionThread {
    pub(super) shared: Arc<Shared>,
    pub(super) id: u64,
    pub(super) generation: u64,
    pub(super) abandoned: Arc<AtomicBool>,
    pub(super) wake: Arc<EventFd>,
    pub(super) pid: Arc<AtomicU32>,
    pub(super) account: Arc<SessionAccount>,
    pub(super) ended: Arc<AtomicBool>,
    pub(super) host_fns: Arc<HostFnLink>,
    /// Where the session's time went, per op (`Op::HostLatency`).
    pub(super) latency: RefCell<LatencyStats>,
    /// The last worker round trip: (ns from send to answer, ns the worker said it took).
    pub(super) last_hop: Cell<(u64, u64)>,
    /// The state under CUDA's process checkpoint (process_checkpoint.rs); this thread alone
    /// changes it.
    pub(super) process: Arc<ProcessState>,
    /// A worker of the previous daemon to take over before anything else.
    pub(super) adopting: Option<Adopting>,
    /// A migrated session's start: its worker to restore (taken once, at the start).
    pub(super) restore: Option<Restore>,
}

/// A migrated session's start: what its GPU side was on the source, and where to say whether
/// it was made again here.
pub(super) struct Restore {
    pub(super) gpu: SavedGpu,
    /// The pieces of a handed-over state's runs (none otherwise).
    pub(super) pieces: Vec<Piece>,
    /// The session's pre-copied chunks, if a pre-copy sent any (`precopy.rs`).
    pub(super) store: Option<StateFile>,
    pub(super) reply: std::sync::mpsc::Sender<Result<(), String>>,
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

/// Answers a message that will never run because its session ended: a request (`resp`), or
/// a transition of CUDA's process checkpoint, whose caller lives on (the process is gone).
fn answer_unrun(msg: Msg, resp: &ResponseHeader) {
    match msg {
        Msg::Run(job) => job.finish(resp),
        Msg::Process(t) => {
            if let Some(job) = t.take() {
                job.finish(&ResponseHeader::with_status(status::INITIALIZATION_ERROR));
            }
        }
        Msg::Trace(job) => job.finish(&ResponseHeader::with_status(status::INITIALIZATION_ERROR)),
        Msg::Memory(_)
        | Msg::Shutdown(_)
        | Msg::Checkpoint { .. }
        | Msg::SaveState(..)
        | Msg::Precopy(_) => {}
    }
}

/// Puts what waited back at the front of the queue, in its order, to be looked at again.
fn requeue(held: &mut VecDeque<Msg>, backlog: &mut VecDeque<Msg>) {
    for msg in held.drain(..).rev() {
        backlog.push_front(msg);
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

    pub(super) fn run(mut self, rx: Receiver<Msg>) {
        self.opened();
        let mut gpu = match self.adopting.take() {
            Some(a) => self.take_over(a),
            None => Gpu::Idle,
        };
        if let Some(Restore {
            gpu: saved,
            pieces,
            store,
            reply,
        }) = self.restore.take()
        {
            let restored = self.restore(&mut gpu, saved, &pieces, store.as_ref());
            // The worker mapped what it imported: the daemon's descriptors go. The store's last
            // descriptor is the table's, freed off the downtime's path (`Stores::release`).
            drop(pieces);
            drop(store);
            let ok = restored.is_ok();
            let _ = reply.send(restored);
            if !ok {
                // The table ends the restored sessions; this one has nothing to keep.
                self.end_worker(&mut gpu, Gpu::Idle);
            }
        }
        // Messages taken off the queue while an op was running in the worker.
        let mut backlog: VecDeque<Msg> = VecDeque::new();
        // Why the loop ended, unless a SessionClose ended the session.
        let mut why = "VM disconnected or reset";
        // The status of the first failed fire-and-forget op not yet reported.
        let mut deferred = status::SUCCESS;
        // How long to spin for the next message before blocking: `--hop-poll-us` right after
        // an answer (a guest calling back to back finds this thread awake), else nothing.
        let mut spin = Duration::ZERO;
        // Paused by the operator: requests and the guest's checkpoint actions wait here (in
        // order) until the resume. A process locked by CUDA's process checkpoint has its
        // requests wait here too.
        let mut paused = false;
        let mut held: VecDeque<Msg> = VecDeque::new();
        loop {
            let msg = match backlog.pop_front() {
                Some(m) => m,
                None => match spin_wait::recv(&rx, mem::take(&mut spin)) {
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
                Msg::SaveState(mode, reply) => {
                    let saved = if paused {
                        Err("paused by the operator".to_string())
                    } else {
                        self.save(&mut gpu, mode)
                    };
                    let _ = reply.send(saved);
                    continue;
                }
                Msg::Precopy(ask) => {
                    match ask {
                        PrecopyAsk::Round {
                            budget,
                            passes,
                            reply,
                        } => {
                            let round = if paused {
                                Err("paused by the operator".to_string())
                            } else {
                                self.precopy_round(&mut gpu, budget, passes)
                            };
                            let _ = reply.send(round);
                        }
                        PrecopyAsk::Reset => self.precopy_reset(&mut gpu),
                    }
                    continue;
                }
                Msg::Checkpoint { pause, reply } => {
                    let resp = if pause && self.process.get() == PROCESS_STATE_CHECKPOINTED {
                        // cuCheckpointProcessCheckpoint has moved it off the GPU already.
                        ResponseHeader::with_status(status::ILLEGAL_STATE)
                    } else {
                        self.checkpoint(&mut gpu, pause, paused)
                    };
                    if resp.status == status::SUCCESS {
                        paused = pause;
                        if !paused {
                            // What waited goes first, in its order.
                            requeue(&mut held, &mut backlog);
                        }
                    }
                    let _ = reply.send(resp);
                    continue;
                }
                Msg::Process(t) => {
                    if self.abandoned() {
                        // The VM is gone: the caller's chain is not ours to complete.
                        continue;
                    }
                    if paused {
                        held.push_back(Msg::Process(t));
                        continue;
                    }
                    // None: a lock whose timeout passed first (answered NOT_READY).
                    if let Some(job) = t.take() {
                        let was_holding = self.process.holds_requests();
                        let resp = self.transition(&mut gpu, t.action);
                        if was_holding && !self.process.holds_requests() {
                            requeue(&mut held, &mut backlog);
                        }
                        job.finish(&resp);
                    }
                    continue;
                }
                Msg::Trace(job) => {
                    if self.abandoned() {
                        continue;
                    }
                    if paused {
                        // A paused worker would resume for it.
                        held.push_back(Msg::Trace(job));
                        continue;
                    }
                    let resp = self.foreign_trace(&mut gpu, &job.request, &rx, &mut backlog);
                    if !self.abandoned() {
                        job.finish(&resp);
                    }
                    continue;
                }
                Msg::Run(job) => job,
            };
            if paused || self.process.holds_requests() {
                if job.request.op() != Op::SessionClose {
                    held.push_back(Msg::Run(job));
                    continue;
                }
                // The program ends while paused or locked: what waited is answered with the
                // close.
                backlog.extend(held.drain(..));
            }
            if self.abandoned() {
                continue;
            }
            self.account.note_pid(job.request.header().pid);
            if job.request.op() == Op::SessionClose {
                self.close(&mut gpu, "SessionClose");
                self.leave_table();
                job.finish(&ResponseHeader::with_status(status::SUCCESS));
                // Nothing can arrive any more; answer what was queued behind the close.
                for late in backlog.drain(..).chain(rx.try_iter()) {
                    if !self.abandoned() {
                        answer_unrun(late, &ResponseHeader::with_status(status::INVALID_VALUE));
                    }
                }
                return;
            }
            let fire_and_forget = job.request.header().flags & FLAG_ASYNC != 0;
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
            let (op, received) = (job.request.op(), job.received);
            job.finish(&resp);
            if let Gpu::Running { process, .. } = &gpu {
                // The answer reached the guest: a daemon that takes the worker over after a
                // restart must not give it again.
                process.note_delivered();
            }
            spin = self.shared.command.hop_poll();
            // Only a request that the guest waits for has a guest-side time to set this
            // against (HostLatency): a waited Batch is its own row, fire-and-forget ones none.
            if !fire_and_forget {
                self.latency.borrow_mut().record(
                    op,
                    queued,
                    self.last_hop.get(),
                    ns(received.elapsed()),
                );
            }
        }
        self.close(&mut gpu, why);
    }

    fn opened(&self) {
        let open = self.shared.update(|c| c.open += 1).open;
        OPEN_SESSIONS_TOTAL.fetch_add(1, Ordering::AcqRel);
        self.shared
            .totals
            .sessions_opened
            .fetch_add(1, Ordering::AcqRel);
        info!(
            vm = %self.shared.label,
            "session {} opened; sessions open: {open}; guest pid {}",
            self.id,
            pid_text(self.account.pid())
        );
    }

    /// Ends the session's worker (bounded; see `WorkerProcess::close`), then the session.
    fn close(&self, gpu: &mut Gpu, why: &str) {
        // First, so that the worker's waiting host functions return and it can end.
        self.host_fns.close(!self.abandoned());
        if let Gpu::Running { process, .. } = mem::replace(gpu, Gpu::Idle) {
            self.account.worker_ending();
            process.close(CLOSE_WAIT);
            self.pid.store(0, Ordering::Release);
            self.reaped(false);
        }
        // Its exports: no process can open them any more (what others opened stays theirs).
        let exports = self.shared.ipc.drop_session(self.id);
        if exports > 0 {
            debug!(vm = %self.shared.label, session = self.id, exports, "IPC exports dropped");
        }
        // What the guest process left allocated, freed with its worker.
        let held = self.account.held_at_end();
        let t = self.account.close_into(&self.shared.totals);
        // What the VM's remaining workers hold (this one's share is gone: it was reaped above).
        let vm_memory = match &self.shared.gpu_memory {
            Ok(q) => bytes_text(q.used()),
            Err(_) => "not counted".to_string(),
        };
        self.shared.update(|c| {
            c.open -= 1;
            // Under the counters' lock, so whoever waits on them (close_all, at shutdown) sees
            // both at once, and finds the line logged.
            self.ended.store(true, Ordering::Release);
            info!(
                vm = %self.shared.label,
                "session {} closed ({why}); sessions open: {}; guest pid {}, open {:.1} s, \
                 kernels {}, graph launches {}, GPU memory peak {}, held at close {}; VM GPU \
                 memory held: {vm_memory}",
                self.id,
                c.open,
                pid_text(self.account.pid()),
                self.account.age_secs(),
                t.kernels,
                t.graph_launches,
                bytes_text(t.peak_memory),
                bytes_text(held)
            );
        });
        OPEN_SESSIONS_TOTAL.fetch_sub(1, Ordering::AcqRel);
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

    /// The session's worker was reaped (`failed`: it died unexpectedly).
    fn reaped(&self, failed: bool) {
        self.account.worker_ended(failed);
        self.shared
            .totals
            .workers_ended
            .fetch_add(1, Ordering::AcqRel);
    }

    /// Kills the worker (if any) and reaps it.
    fn end_worker(&self, gpu: &mut Gpu, next: Gpu) {
        self.host_fns.disconnect();
        let failed = matches!(next, Gpu::Failed);
        if let Gpu::Running { process, .. } = mem::replace(gpu, next) {
            self.account.worker_ending();
            if failed {
                // The worker may be ending by itself (a signal): its own status is the one to
                // log, so it is given a moment before SIGKILL.
                process.reap_lost(LOST_WORKER_GRACE);
            } else {
                process.kill();
            }
            self.pid.store(0, Ordering::Release);
            self.reaped(failed);
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
        let mut resp = match req.op() {
            Op::Hello => {
                let open = self.shared.counters().open;
                return Outcome::Answered(transport_ops::hello(host, req, open));
            }
            Op::Echo => return Outcome::Answered(transport_ops::echo(req)),
            Op::HostLatency => return Outcome::Answered(self.latency.borrow().answer(req)),
            Op::VmUsage => return Outcome::Answered(usage::answer(&self.shared, self.id, req)),
            Op::DeviceReset if gpu.sticky() => self.reset(gpu, req),
            Op::IpcExport | Op::IpcImport => self.ipc(gpu, req),
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

    /// Another process's `GpuTrace` of this session: its worker answers, if it has one (a
    /// recording of a process that has not used the GPU is not a reason to start a worker).
    fn foreign_trace(
        &self,
        gpu: &mut Gpu,
        req: &Request,
        rx: &Receiver<Msg>,
        backlog: &mut VecDeque<Msg>,
    ) -> ResponseHeader {
        match gpu {
            Gpu::Running { .. } => match self.on_worker(gpu, req, rx, backlog) {
                // The target's sticky state is the target's to learn, not the caller's.
                Outcome::Answered(mut resp) => {
                    resp.flags &= !RESP_FLAG_STICKY;
                    resp
                }
                Outcome::Interrupted => ResponseHeader::with_status(status::INITIALIZATION_ERROR),
            },
            Gpu::Idle => ResponseHeader::with_status(status::NOT_READY),
            Gpu::Failed => ResponseHeader::with_status(status::LAUNCH_FAILURE),
        }
    }

    /// DeviceReset after a sticky error or a lost worker: CUDA says the process must be
    /// restarted, so the worker is, and the session starts afresh on every device.
    fn reset(&self, gpu: &mut Gpu, req: &Request) -> ResponseHeader {
        if req.header().device >= self.shared.host.gpu_count() && !matches!(gpu, Gpu::Failed) {
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
        if let Err(resp) = self.start_worker(gpu, req.op()) {
            return Outcome::Answered(resp);
        }
        let Gpu::Running { process, sticky } = gpu else {
            return Outcome::Answered(ResponseHeader::with_status(status::UNKNOWN));
        };
        debug!(vm = %self.shared.label, session = self.id, op = ?req.op(), "to worker");
        let sent = Instant::now();
        match process.send(req) {
            Ok(()) => {}
            Err(e @ WorkerError::Unsendable(_)) => {
                warn!(vm = %self.shared.label, "session {}: {e}", self.id);
                return Outcome::Answered(ResponseHeader::with_status(status::INVALID_VALUE));
            }
            Err(e) => return Outcome::Answered(self.worker_failed(gpu, req.op(), &e)),
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
                            req.op()
                        );
                        self.end_worker(gpu, Gpu::Idle);
                        return Outcome::Interrupted;
                    }
                }
                Err(e) => return Outcome::Answered(self.worker_failed(gpu, req.op(), &e)),
            }
        }
    }

    /// Starts the session's worker process if it has none; the answer for `op` if it cannot
    /// (the worker died earlier, or it failed to start).
    fn start_worker(&self, gpu: &mut Gpu, op: Op) -> Result<(), ResponseHeader> {
        if let Gpu::Failed = gpu {
            return Err(worker_lost());
        }
        if let Gpu::Idle = gpu {
            let quota = match &self.shared.gpu_memory {
                Ok(q) => match q.lease() {
                    Some(lease) => Some(lease),
                    // Slots match --max-sessions; only a bug runs out of them.
                    None => return Err(ResponseHeader::with_status(status::DEVICES_UNAVAILABLE)),
                },
                Err(_) if self.shared.memory_limited => {
                    return Err(ResponseHeader::with_status(status::MEMORY_ALLOCATION))
                }
                Err(_) => None,
            };
            let slot = quota.as_ref().map(crate::limits::SlotLease::usage);
            // A spare the VM keeps started ahead, else a worker of its own.
            let mut quota = quota;
            let mut taken = None;
            if let Some(mut spare) = self.shared.take_spare() {
                match spare.bind(&self.shared.command, self.id, quota.take()) {
                    Ok(()) => taken = Some(spare),
                    Err((e, back)) => {
                        warn!(
                            vm = %self.shared.label,
                            "session {}: spare worker {} not taken ({e}); starting one",
                            self.id,
                            spare.pid()
                        );
                        quota = back;
                    }
                }
            }
            let spawned = match taken {
                Some(spare) => Ok(spare),
                None => WorkerProcess::spawn_with_quota(
                    &self.shared.command,
                    self.id,
                    &self.shared.label,
                    quota,
                ),
            };
            let mut process = match spawned {
                Ok(p) => p,
                Err(e) => {
                    error!(vm = %self.shared.label, "session {}: {e}", self.id);
                    return Err(ResponseHeader::with_status(status::MEMORY_ALLOCATION));
                }
            };
            self.pid.store(process.pid(), Ordering::Release);
            self.account.set_gpu_pid(process.gpu_pid());
            self.account.worker_started(slot);
            let shared = process
                .share_memory(&self.shared.memory())
                .and_then(|()| self.link_host_functions(&mut process));
            *gpu = Gpu::Running {
                process,
                sticky: false,
            };
            if let Err(e) = shared {
                return Err(self.worker_failed(gpu, op, &e));
            }
        }
        Ok(())
    }

    /// `IpcExport` and `IpcImport`: brokered between this session's worker and the VM's table
    /// of exports (`ipc_broker.rs`), since a file descriptor travels with each.
    fn ipc(&self, gpu: &mut Gpu, req: &Request) -> ResponseHeader {
        let (h, op) = (req.header(), req.op());
        let args = h.args;
        let import = op == Op::IpcImport;
        if !import && !matches!(gpu, Gpu::Running { .. }) {
            // No worker: no memory to export.
            return ResponseHeader::with_status(if matches!(gpu, Gpu::Failed) {
                worker_lost().status
            } else {
                status::INVALID_VALUE
            });
        }
        let (call, found) = if import {
            let found = match self.shared.ipc.find(args[1], [args[2], args[3]], args[0]) {
                Ok(f) => f,
                Err(s) => {
                    warn!(
                        vm = %self.shared.label,
                        session = self.id,
                        token = args[1],
                        "IPC import of an unknown handle refused"
                    );
                    return ResponseHeader::with_status(s);
                }
            };
            // cuIpcOpenMemHandle in the exporting process itself is refused by CUDA.
            if found.exporter == self.id && args[0] == qcuda_proto::IPC_KIND_MEMORY {
                return ResponseHeader::with_status(status::INVALID_CONTEXT);
            }
            let call = IpcCall {
                import: true,
                device: h.device,
                kind: args[0],
                arg: args[4],
                meta: found.meta,
            };
            (call, Some(found))
        } else {
            let call = IpcCall {
                import: false,
                device: h.device,
                kind: args[0],
                arg: args[1],
                meta: [0; 3],
            };
            (call, None)
        };
        if let Err(resp) = self.start_worker(gpu, op) {
            return resp;
        }
        let Gpu::Running { process, sticky } = gpu else {
            return ResponseHeader::with_status(status::UNKNOWN);
        };
        let answer = process.ipc(&call, found.as_ref().map(|f| f.fd.as_raw_fd()));
        drop(found);
        let (mut resp, fd) = match answer {
            Ok(a) => a,
            Err(e) => return self.worker_failed(gpu, op, &e),
        };
        *sticky |= resp.flags & RESP_FLAG_STICKY != 0;
        if *sticky {
            resp.flags |= RESP_FLAG_STICKY;
        }
        if let (false, Some(fd)) = (import, fd) {
            let meta = [resp.rets[0], resp.rets[1], resp.rets[2]];
            resp.rets = [0; 7];
            match self.shared.ipc.register(self.id, call.kind, fd, meta) {
                Ok((token, secret)) => {
                    resp.rets[..3].copy_from_slice(&[token, secret[0], secret[1]]);
                    debug!(vm = %self.shared.label, session = self.id, token, "IPC export");
                }
                Err(s) => resp.status = s,
            }
        }
        resp
    }

    /// Takes over the worker a previous daemon left: its state lives on, and the session goes
    /// on where the guest process left it. A worker that cannot be taken over is ended, and
    /// the session's GPU ops fail until DeviceReset, as for a worker that died.
    fn take_over(&self, a: Adopting) -> Gpu {
        let (session, pid) = (a.worker.session, a.worker.pid);
        let slot = a.quota.as_ref().map(crate::limits::SlotLease::usage);
        match WorkerProcess::adopt(&self.shared.command, a.worker, &self.shared.label, a.quota) {
            Ok((mut process, replay)) => {
                self.pid.store(process.pid(), Ordering::Release);
                self.account.set_gpu_pid(process.gpu_pid());
                self.account.worker_started(slot);
                if let Err(e) = self.link_host_functions(&mut process) {
                    let mut gpu = Gpu::Running {
                        process,
                        sticky: false,
                    };
                    self.worker_failed(&mut gpu, Op::HostInfo, &e);
                    return gpu;
                }
                info!(
                    vm = %self.shared.label,
                    "session {session}: worker process {pid} taken over after a daemon restart{}",
                    if replay { "; the answer the previous daemon lost is given again" } else { "" }
                );
                Gpu::Running {
                    process,
                    sticky: false,
                }
            }
            Err(e) => {
                error!(
                    vm = %self.shared.label,
                    "session {session}: worker process {pid} of the previous daemon cannot be \
                     taken over ({e}); the session's GPU ops fail until DeviceReset"
                );
                Gpu::Failed
            }
        }
    }

    /// A migration's source: what this session's GPU side is, its worker's saved state
    /// included (the worker goes on running).
    fn save(&self, gpu: &mut Gpu, mode: SaveMode) -> Result<Saved, String> {
        let nothing = |gpu| {
            Ok(Saved {
                gpu,
                pieces: Vec::new(),
            })
        };
        let process = match gpu {
            Gpu::Idle => return nothing(SavedGpu::None),
            Gpu::Failed => return nothing(SavedGpu::Failed),
            Gpu::Running { sticky: true, .. } => {
                return Err("its worker holds a sticky CUDA error".into())
            }
            Gpu::Running { process, .. } => process,
        };
        let started = Instant::now();
        let saved = match mode {
            SaveMode::Full => process.save_state().map(|r| r.map(|s| (s, Vec::new()))),
            SaveMode::Record => process.save_record().map(|r| r.map(|s| (s, Vec::new()))),
            SaveMode::Export => process.export_runs(),
        };
        match saved {
            Ok(Ok((saved, runs))) => {
                let handed: u64 = runs.iter().map(|(m, _)| m[2]).sum();
                info!(
                    vm = %self.shared.label,
                    session = self.id,
                    ?mode,
                    bytes = saved.file.len(),
                    runs = runs.len(),
                    handed_over_bytes = handed,
                    capture_ms = saved.capture_us / 1000,
                    encode_ms = saved.encode_us / 1000,
                    ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "GPU state saved for migration"
                );
                let pieces: Vec<Piece> = runs
                    .into_iter()
                    .map(|(meta, fd)| Piece { meta, fd })
                    .collect();
                let gpu = match mode {
                    SaveMode::Export => SavedGpu::HandedOver {
                        state: saved.file,
                        pieces: u32::try_from(pieces.len())
                            .map_err(|_| "too many runs to hand over".to_string())?,
                    },
                    SaveMode::Full | SaveMode::Record => SavedGpu::State(saved.file),
                };
                Ok(Saved { gpu, pieces })
            }
            Ok(Err(resp)) => Err(format!(
                "its GPU state cannot be saved (CUDA error {})",
                resp.status
            )),
            Err(e) => {
                let why = e.to_string();
                self.worker_failed(gpu, Op::DeviceSynchronize, &e);
                Err(why)
            }
        }
    }

    /// A round of a migration's pre-copy: the worker's chunk log of what changed since it last
    /// sent (`None` without a worker: nothing on the GPU).
    fn precopy_round(
        &self,
        gpu: &mut Gpu,
        budget: u64,
        passes: u32,
    ) -> Result<Option<PrecopiedByWorker>, String> {
        let process = match gpu {
            Gpu::Idle | Gpu::Failed => return Ok(None),
            Gpu::Running { sticky: true, .. } => {
                return Err("its worker holds a sticky CUDA error".into())
            }
            Gpu::Running { process, .. } => process,
        };
        match process.precopy_round(budget, passes) {
            Ok(Ok(round)) => Ok(Some(round)),
            Ok(Err(resp)) => Err(format!(
                "its device memory cannot be pre-copied (CUDA error {})",
                resp.status
            )),
            Err(e) => {
                let why = e.to_string();
                self.worker_failed(gpu, Op::DeviceSynchronize, &e);
                Err(why)
            }
        }
    }

    /// The worker forgets what its pre-copy sent (a failed migration, or a new one).
    fn precopy_reset(&self, gpu: &mut Gpu) {
        let Gpu::Running { process, .. } = gpu else {
            return;
        };
        match process.precopy_reset() {
            Ok(resp) if resp.status == status::SUCCESS => {}
            Ok(resp) => warn!(
                vm = %self.shared.label,
                session = self.id,
                status = resp.status,
                "the worker did not forget its pre-copy"
            ),
            Err(e) => {
                self.worker_failed(gpu, Op::DeviceSynchronize, &e);
            }
        }
    }

    /// A migration's destination: makes the session's GPU side again from `saved`.
    fn restore(
        &self,
        gpu: &mut Gpu,
        saved: SavedGpu,
        pieces: &[Piece],
        store: Option<&StateFile>,
    ) -> Result<(), String> {
        let (bytes, handed_over) = match saved {
            SavedGpu::None => return Ok(()),
            SavedGpu::Failed => {
                *gpu = Gpu::Failed;
                return Ok(());
            }
            SavedGpu::State(bytes) => (bytes, false),
            SavedGpu::HandedOver { state, .. } => (state, true),
        };
        self.start_worker(gpu, Op::DeviceSynchronize)
            .map_err(|resp| format!("no worker (CUDA error {})", resp.status))?;
        let Gpu::Running { process, .. } = gpu else {
            return Err("no worker".into());
        };
        let started = Instant::now();
        let restored = if handed_over {
            let runs: Vec<([u64; 3], RawFd)> =
                pieces.iter().map(|p| (p.meta, p.fd.as_raw_fd())).collect();
            process.restore_handed_over(&bytes, &runs)
        } else {
            process.restore_state(&bytes, store)
        };
        match restored {
            Ok(resp) if resp.status == status::SUCCESS => {
                info!(
                    vm = %self.shared.label,
                    session = self.id,
                    bytes = bytes.len(),
                    runs = pieces.len(),
                    ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "GPU state restored from a migration"
                );
                Ok(())
            }
            Ok(resp) => Err(format!(
                "its saved state was refused here (CUDA error {}; the worker's log says why)",
                resp.status
            )),
            Err(e) => {
                let why = e.to_string();
                self.worker_failed(gpu, Op::DeviceSynchronize, &e);
                Err(why)
            }
        }
    }

    /// The operator's pause or resume of this session (`was_paused`: the state it is in).
    fn checkpoint(&self, gpu: &mut Gpu, pause: bool, was_paused: bool) -> ResponseHeader {
        if pause == was_paused {
            return ResponseHeader::with_status(status::ILLEGAL_STATE);
        }
        let Gpu::Running { process, .. } = gpu else {
            // No worker: nothing on the GPU to move; its requests wait all the same.
            return ResponseHeader::with_status(status::SUCCESS);
        };
        match process.checkpoint(pause) {
            Ok(resp) => {
                info!(
                    vm = %self.shared.label,
                    session = self.id,
                    status = resp.status,
                    bytes = resp.rets[0],
                    ms = resp.rets[1] / 1_000_000,
                    "{}",
                    if pause { "paused by the operator" } else { "resumed by the operator" }
                );
                resp
            }
            Err(e) => self.worker_failed(gpu, Op::DeviceSynchronize, &e),
        }
    }

    /// A transition of CUDA's process checkpoint (process_checkpoint.rs), run between this
    /// session's requests: checkpoint and restore are the worker's pause and resume.
    fn transition(&self, gpu: &mut Gpu, action: u64) -> ResponseHeader {
        let before = self.process.get();
        let next = match process_checkpoint::next_state(action, before) {
            Ok(next) => next,
            Err(code) => return ResponseHeader::with_status(code),
        };
        let resp = if action == PROCESS_CHECKPOINT || action == PROCESS_RESTORE {
            match gpu {
                Gpu::Running { process, .. } => {
                    match process.checkpoint(action == PROCESS_CHECKPOINT) {
                        Ok(resp) => resp,
                        Err(e) => {
                            let resp = self.worker_failed(gpu, Op::DeviceSynchronize, &e);
                            self.process
                                .set(process_checkpoint::after_failure(true, before));
                            return resp;
                        }
                    }
                }
                // No worker: nothing on the GPU to move.
                Gpu::Idle => ResponseHeader::with_status(status::SUCCESS),
                Gpu::Failed => worker_lost(),
            }
        } else {
            ResponseHeader::with_status(status::SUCCESS)
        };
        if resp.status == status::SUCCESS {
            self.process.set(next);
            process_checkpoint::log_transition(&self.shared.label, self.id, action, &resp);
        }
        resp
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
            if !self.abandoned() {
                answer_unrun(msg, &worker_lost());
            }
        }
        true
    }
}

/// A guest pid for the logs: "unknown" from a kernel module that does not stamp it.
fn pid_text(pid: u32) -> String {
    if pid == 0 {
        "unknown".to_string()
    } else {
        pid.to_string()
    }
}

//! Sessions: one worker thread per guest process, so that a long op in one process never
//! blocks another.
//!
//! A session is identified by the id the guest kernel module stamps on every request (one per
//! open file of `/dev/qcuda`). The [`SessionTable`] starts a worker on a session's first
//! request; the worker owns the session's [`CudaSession`] and runs its requests in arrival
//! order. It writes the outputs and the response into guest memory itself and completes the
//! chain through a [`ChainCompleter`], so chains of different sessions complete out of order.
//!
//! `SessionClose` drops the `CudaSession` (which frees every GPU resource of the session) and
//! ends the worker. When the VM goes away ([`SessionTable::close_all`]) every worker is told to
//! drop its queued requests without touching the ring, and to close its session.
//!
//! The table's lock only guards the map from session id to worker and is never held while an
//! op runs. This module knows nothing about vrings: the virtio edge supplies the completer.

use std::{
    collections::HashMap,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        mpsc::{self, Receiver, SendError, Sender},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{status, Op, ResponseHeader, RESP_FLAG_STICKY};
use tracing::{debug, error, info, warn};

use crate::{
    chain::{ParsedRequest, Reply},
    cuda::{CudaHost, CudaSession},
    guest_buffer::Request,
    transport_ops,
};

/// Most sessions one VM may have open at once. Each is a host thread; a guest kernel that
/// invents session ids must not be able to exhaust the host. Requests of further sessions are
/// answered with `cudaErrorMemoryAllocation`.
pub const MAX_SESSIONS: usize = 1024;

/// Sessions open in this process, over all VMs.
static OPEN_SESSIONS_TOTAL: AtomicUsize = AtomicUsize::new(0);

/// Sessions open in this process, over all sockets (VMs).
pub fn open_sessions_total() -> usize {
    OPEN_SESSIONS_TOTAL.load(Ordering::Acquire)
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
    /// Sessions with a live `CudaSession`.
    open: usize,
}

struct Shared {
    host: Arc<CudaHost>,
    label: String,
    workers: Mutex<HashMap<u64, WorkerHandle>>,
    next_generation: AtomicU64,
    counters: Mutex<Counters>,
    changed: Condvar,
}

impl Shared {
    fn counters(&self) -> MutexGuard<'_, Counters> {
        // The counters stay consistent even if a holder panicked: every update is one statement.
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn workers(&self) -> MutexGuard<'_, HashMap<u64, WorkerHandle>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
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

/// One request on its way to a worker.
struct Job {
    head: u16,
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

enum Msg {
    Run(Box<Job>),
    /// The VM is gone: close the session and stop.
    Shutdown,
}

struct WorkerHandle {
    tx: Sender<Msg>,
    generation: u64,
    /// Set when the VM goes away: queued requests are dropped, never completed.
    abandoned: Arc<AtomicBool>,
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
    /// An empty table. `label` names the VM (its socket) in logs.
    pub fn new(host: Arc<CudaHost>, label: impl Into<String>) -> Self {
        Self {
            shared: Arc::new(Shared {
                host,
                label: label.into(),
                workers: Mutex::new(HashMap::new()),
                next_generation: AtomicU64::new(0),
                counters: Mutex::new(Counters::default()),
                changed: Condvar::new(),
            }),
        }
    }

    /// Sessions of this VM with live CUDA state.
    pub fn open_count(&self) -> usize {
        self.shared.counters().open
    }

    /// Chains handed to workers and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.shared.counters().in_flight
    }

    /// Hands a parsed request to its session's worker, starting the worker if needed. The chain
    /// is completed through `completer`, from the worker's thread.
    pub fn dispatch(&self, head: u16, parsed: ParsedRequest, completer: Arc<dyn ChainCompleter>) {
        let id = parsed.request.header.session;
        let job = Job {
            head,
            request: parsed.request,
            reply: parsed.reply,
            completer,
            _in_flight: InFlight::new(&self.shared),
        };
        let mut workers = self.shared.workers();
        let mut msg = Msg::Run(Box::new(job));
        if let Some(w) = workers.get(&id) {
            // The send happens under the map lock, so a worker that has removed itself from
            // the map (SessionClose) cannot receive anything afterwards.
            match w.tx.send(msg) {
                Ok(()) => return,
                Err(SendError(m)) => {
                    // The worker died without removing itself (only a bug can do that).
                    error!(vm = %self.shared.label, "session {id}: worker gone, starting anew");
                    workers.remove(&id);
                    msg = m;
                }
            }
        }
        let Msg::Run(job) = msg else { return };
        if job.request.op == Op::SessionClose {
            drop(workers);
            // Nothing open under this id: closing it is already done.
            job.finish(&ResponseHeader::with_status(status::SUCCESS));
            return;
        }
        if workers.len() >= MAX_SESSIONS {
            drop(workers);
            warn!(vm = %self.shared.label, "session {id}: refused, {MAX_SESSIONS} sessions open");
            job.finish(&ResponseHeader::with_status(status::MEMORY_ALLOCATION));
            return;
        }
        let (tx, rx) = mpsc::channel();
        let generation = self.shared.next_generation.fetch_add(1, Ordering::Relaxed);
        let abandoned = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            shared: self.shared.clone(),
            id,
            generation,
            abandoned: abandoned.clone(),
        };
        let spawned = thread::Builder::new()
            .name(format!("qcuda-s{id}"))
            .spawn(move || worker.run(rx));
        if let Err(e) = spawned {
            drop(workers);
            error!(vm = %self.shared.label, "session {id}: cannot start worker: {e}");
            job.finish(&ResponseHeader::with_status(status::MEMORY_ALLOCATION));
            return;
        }
        // The receiver lives until the worker ends, and it cannot end before receiving.
        let _ = tx.send(Msg::Run(job));
        workers.insert(
            id,
            WorkerHandle {
                tx,
                generation,
                abandoned,
            },
        );
    }

    /// Waits until every dispatched chain has been completed, at most `timeout`. Returns
    /// whether none is left.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.shared.wait_for(timeout, |c| c.in_flight == 0)
    }

    /// Closes every session: queued requests are dropped without being completed (the ring
    /// they came from is gone), each worker finishes the op it is running, then frees its
    /// session. Waits up to `timeout` for that and returns the number still open; those close
    /// in the background.
    pub fn close_all(&self, timeout: Duration) -> usize {
        let workers: Vec<WorkerHandle> = self.shared.workers().drain().map(|(_, w)| w).collect();
        if !workers.is_empty() {
            info!(vm = %self.shared.label, "closing all {} sessions", workers.len());
        }
        for w in workers {
            w.abandoned.store(true, Ordering::Release);
            let _ = w.tx.send(Msg::Shutdown);
        }
        let closed = self.shared.wait_for(timeout, |c| c.open == 0);
        let open = self.open_count();
        if !closed {
            warn!(
                vm = %self.shared.label,
                "{open} sessions still busy; they close when their current op ends"
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

/// Ends a session's CUDA state: dropping a `CudaSession` frees everything it owns on the GPU.
fn free(_state: State) {}

/// The thread that owns one session.
struct Worker {
    shared: Arc<Shared>,
    id: u64,
    generation: u64,
    abandoned: Arc<AtomicBool>,
}

/// A session's CUDA state, or why it has none.
enum State {
    Live(Box<CudaSession>),
    /// The executor panicked; like a sticky CUDA error, every later op fails until close.
    Failed,
}

impl Worker {
    fn run(self, rx: Receiver<Msg>) {
        let mut state = Some(self.open());
        while let Ok(msg) = rx.recv() {
            let Msg::Run(job) = msg else { break };
            if self.abandoned.load(Ordering::Acquire) {
                continue;
            }
            if job.request.op == Op::SessionClose {
                self.close(state.take(), "SessionClose");
                self.leave_table();
                job.finish(&ResponseHeader::with_status(status::SUCCESS));
                // Nothing can arrive any more; answer what was queued behind the close.
                while let Ok(Msg::Run(late)) = rx.try_recv() {
                    if !self.abandoned.load(Ordering::Acquire) {
                        late.finish(&ResponseHeader::with_status(status::INVALID_VALUE));
                    }
                }
                return;
            }
            let resp = self.run_op(&mut state, &job.request);
            job.finish(&resp);
        }
        // Shutdown, or the table is gone.
        self.close(state.take(), "VM disconnected or reset");
    }

    fn open(&self) -> State {
        let session = self.shared.host.open_session(self.id);
        let open = self.shared.update(|c| c.open += 1).open;
        OPEN_SESSIONS_TOTAL.fetch_add(1, Ordering::AcqRel);
        info!(vm = %self.shared.label, "session {} opened; sessions open: {open}", self.id);
        State::Live(Box::new(session))
    }

    fn close(&self, state: Option<State>, why: &str) {
        let Some(state) = state else { return };
        free(state);
        let open = self.shared.update(|c| c.open -= 1).open;
        OPEN_SESSIONS_TOTAL.fetch_sub(1, Ordering::AcqRel);
        info!(
            vm = %self.shared.label,
            "session {} closed ({why}); sessions open: {open}", self.id
        );
    }

    /// Removes this worker from the map, unless a newer worker took the id already.
    fn leave_table(&self) {
        let mut workers = self.shared.workers();
        if workers
            .get(&self.id)
            .is_some_and(|w| w.generation == self.generation)
        {
            workers.remove(&self.id);
        }
    }

    fn run_op(&self, state: &mut Option<State>, req: &Request) -> ResponseHeader {
        match req.op {
            Op::Hello => {
                let open = self.shared.counters().open;
                return transport_ops::hello(&self.shared.host, req, open);
            }
            Op::Echo => return transport_ops::echo(req),
            _ => {}
        }
        let Some(State::Live(session)) = state else {
            let mut resp = ResponseHeader::with_status(status::UNKNOWN);
            resp.flags = RESP_FLAG_STICKY;
            return resp;
        };
        debug!(session = self.id, op = ?req.op, "execute");
        match catch_unwind(AssertUnwindSafe(|| session.execute(req))) {
            Ok(resp) => resp,
            Err(_) => {
                error!(
                    vm = %self.shared.label,
                    "session {}: executor panicked on {:?}; session failed", self.id, req.op
                );
                *state = Some(State::Failed);
                let mut resp = ResponseHeader::with_status(status::UNKNOWN);
                resp.flags = RESP_FLAG_STICKY;
                resp
            }
        }
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
                table: SessionTable::new(CudaHost::probe(), "test"),
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
    fn other_ops_go_to_the_executor() {
        let mut g = Guest::new();
        let (p, out) = g.simple(Op::DriverVersion, 8);
        g.mem.write_slice(&[0xff; 64], GuestAddress(out)).unwrap();
        g.send(0, p);
        // Whatever the executor answers (no GPU here), the chain completes with a response.
        assert_eq!(g.rec.wait(1)[0], (0, 64));
        assert_ne!(g.response(out).status, 0xffff_ffff);
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

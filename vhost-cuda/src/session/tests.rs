//! Unit tests of the session table and its threads, over a host without a GPU.

use std::{
    sync::{Arc, Condvar, Mutex},
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{
    status, Checksum, Direction, LatencyRecord, Op, RequestHeader, ResponseHeader, SessionUsage,
    FLAG_ASYNC, LATENCY_RECORD_SIZE, PROCESS_CHECKPOINT, PROCESS_GET_RESTORE_THREAD,
    PROCESS_GET_STATE, PROCESS_LOCK, PROCESS_RESTORE, PROCESS_STATE_CHECKPOINTED,
    PROCESS_STATE_LOCKED, PROCESS_STATE_RUNNING, PROCESS_UNLOCK, SESSION_USAGE_SIZE, USAGE_CALLER,
    VERSION,
};
use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress};

use super::{ChainCompleter, SessionTable};
use crate::{
    chain::{self, ParsedRequest},
    cuda::CudaHost,
    guest_buffer::{GuestBuffer, GuestRam},
    worker::WorkerCommand,
};

const WAIT: Duration = Duration::from_secs(10);

/// Records completions; a completion may first wait for a gate.
#[derive(Default)]
struct Recorder {
    done: Mutex<Vec<(u16, u32)>>,
    cv: Condvar,
    /// Every output run reported written, with how many chains had completed by then.
    written: Mutex<Vec<(u64, usize, usize)>>,
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
    fn wrote(&self, outputs: &[GuestBuffer]) {
        let done = self.done.lock().unwrap().len();
        let mut w = self.written.lock().unwrap();
        for r in outputs.iter().flat_map(GuestBuffer::runs) {
            w.push((r.addr.0, r.len, done));
        }
    }

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
        Self::with_hop_poll(Duration::ZERO)
    }

    /// A guest whose session threads spin for up to `hop_poll` after each answer.
    fn with_hop_poll(hop_poll: Duration) -> Self {
        Self {
            mem: Arc::new(GuestRam::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap()),
            // No test here starts a worker: the unit-test binary is not vhost-cuda
            // (tests/session_workers.rs covers workers).
            table: SessionTable::new(
                CudaHost::probe(),
                WorkerCommand::this_binary(None, "info").with_hop_poll(hop_poll),
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
            Descriptor::new(at, u32::try_from(stream.len()).unwrap(), 0, 0),
            Descriptor::new(
                out,
                u32::try_from(out_len).unwrap() + 64,
                u16::try_from(VRING_DESC_F_WRITE).unwrap(),
                0,
            ),
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

    /// `ProcessCheckpoint` from session `caller` about session `target` (as the guest kernel
    /// module stamps it, with 4242 as the target's pid).
    fn process(
        &mut self,
        caller: u64,
        action: u64,
        target: u64,
        timeout_ms: u64,
    ) -> (ParsedRequest, u64) {
        let mut h = RequestHeader::new(Op::ProcessCheckpoint);
        h.session = caller;
        h.args[0] = action;
        h.args[1] = 4242;
        h.args[2] = timeout_ms;
        h.args[3] = target;
        h.args[4] = 4242;
        self.request(h, &[])
    }

    /// Sends a `ProcessCheckpoint` and waits for its answer (the `n`th completion).
    fn process_now(
        &mut self,
        head: u16,
        n: usize,
        action: u64,
        target: u64,
        timeout_ms: u64,
    ) -> ResponseHeader {
        let (p, out) = self.process(99, action, target, timeout_ms);
        self.send(head, p);
        let done = self.rec.wait(n);
        assert!(done.contains(&(head, 64)), "{done:?}");
        self.response(out)
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
fn a_finished_request_reports_its_outputs_written_before_it_completes() {
    // What a migration's dirty log learns of writes behind the daemon's map: every output
    // buffer of every request, before its chain is on the used ring.
    let mut g = Guest::new();
    let (hello, _) = g.simple(Op::Hello, 1);
    g.send(1, hello);
    g.rec.wait(1);
    assert_eq!(*g.rec.written.lock().unwrap(), vec![]);
    let (echo, echo_out) = g.echo(1, &[3; 5000]);
    g.send(2, echo);
    g.rec.wait(2);
    assert_eq!(*g.rec.written.lock().unwrap(), vec![(echo_out, 5000, 1)]);
    assert_eq!(g.table.close_all(WAIT), 0);
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
    for (head, p) in (0u16..).zip([failing, async_echo, first, second]) {
        g.send(head, p);
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
    for hop_poll in [Duration::ZERO, Duration::from_micros(50)] {
        let mut g = Guest::with_hop_poll(hop_poll);
        let reqs: Vec<_> = (0..40u8).map(|i| g.echo(3, &[i; 100]).0).collect();
        for (head, r) in (0u16..).zip(reqs) {
            g.send(head, r);
        }
        let heads: Vec<u16> = g.rec.wait(40).iter().map(|d| d.0).collect();
        assert_eq!(heads, (0..40).collect::<Vec<u16>>());
        assert_eq!(g.table.open_count(), 1);
    }
}

#[test]
fn a_spinning_session_thread_sees_requests_and_the_end_at_once() {
    // A spin far longer than the test: whatever arrives must end it.
    let mut g = Guest::with_hop_poll(Duration::from_secs(30));
    let t = Instant::now();
    for head in 0..4u16 {
        // Sent while the thread spins after its last answer, or (the first) to a new thread.
        let (echo, out) = g.echo(5, &[0x5a; 8]);
        g.send(head, echo);
        assert_eq!(
            g.rec.wait(usize::from(head) + 1).len(),
            usize::from(head) + 1
        );
        assert_eq!(g.response(out + 8).status, status::SUCCESS);
    }
    // A SessionClose, then the VM going away while another session spins.
    let (close, close_out) = g.simple(Op::SessionClose, 5);
    g.send(4, close);
    g.rec.wait(5);
    assert_eq!(g.response(close_out).status, status::SUCCESS);
    let (echo, _) = g.echo(6, b"x");
    g.send(5, echo);
    g.rec.wait(6);
    assert_eq!(g.table.close_all(WAIT), 0);
    assert_eq!(g.table.open_count(), 0);
    assert!(t.elapsed() < WAIT, "{:?}", t.elapsed());
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
    // A fire-and-forget request has no guest-side wait to set against: not recorded.
    let mut h = RequestHeader::new(Op::DeviceCount);
    h.session = 8;
    h.flags = FLAG_ASYNC;
    let (unwaited, _) = g.request(h, &[]);
    g.send(3, unwaited);
    let mut h = RequestHeader::new(Op::HostLatency);
    h.session = 8;
    h.push_buffer(Direction::Out, 2 * LATENCY_RECORD_SIZE as u64)
        .unwrap();
    let (lat, out) = g.request(h, &[]);
    g.send(4, lat);
    g.rec.wait(5);
    let r = g.response(out + 2 * LATENCY_RECORD_SIZE as u64);
    assert_eq!((r.status, r.rets[0], r.rets[1]), (0, 1, 1));
    let mut b = [0u8; LATENCY_RECORD_SIZE];
    g.mem.read_slice(&mut b, GuestAddress(out)).unwrap();
    let rec = LatencyRecord::decode(&b).unwrap();
    assert_eq!((rec.op, rec.count, rec.worker_ns), (Op::Hello as u32, 3, 0));
    assert!(rec.host_ns >= rec.queue_ns);
}

#[test]
fn vm_usage_lists_the_vms_sessions_with_their_guest_pids() {
    let mut g = Guest::new();
    for (i, (session, pid)) in [(31, 1000), (32, 2000), (33, 0)].into_iter().enumerate() {
        let mut h = RequestHeader::new(Op::Hello);
        h.session = session;
        h.pid = pid;
        h.args[0] = u64::from(VERSION);
        let (hello, _) = g.request(h, &[]);
        g.send(u16::try_from(i).unwrap(), hello);
    }
    g.rec.wait(3);
    // Room for two of the three records.
    let mut h = RequestHeader::new(Op::VmUsage);
    h.session = 32;
    h.pid = 2001;
    h.push_buffer(Direction::Out, 2 * SESSION_USAGE_SIZE as u64)
        .unwrap();
    let (usage, out) = g.request(h, &[]);
    g.send(3, usage);
    g.rec.wait(4);
    let r = g.response(out + 2 * SESSION_USAGE_SIZE as u64);
    assert_eq!((r.status, r.rets[0], r.rets[1]), (0, 2, 3), "{r:?}");
    // No GPU work: nothing held, no kernels, no limit; three sessions opened so far.
    assert_eq!(&r.rets[2..], &[0, 0, 1024, 0, 3]);
    let mut b = [0u8; 2 * SESSION_USAGE_SIZE];
    g.mem.read_slice(&mut b, GuestAddress(out)).unwrap();
    let a = SessionUsage::decode(&b).unwrap();
    let c = SessionUsage::decode(&b[SESSION_USAGE_SIZE..]).unwrap();
    // By session id; the first pid a session's requests carried is its pid.
    assert_eq!((a.session, a.pid, a.flags), (31, 1000, 0));
    assert_eq!((c.session, c.pid, c.flags), (32, 2000, USAGE_CALLER));
    assert_eq!((c.memory, c.kernels), (0, 0));
    // The host's view is the same, with the sessions' worker pids (none here).
    let vm = g.table.usage();
    assert_eq!(
        (vm.vm.as_str(), vm.sessions_open, vm.memory),
        ("test", 3, 0)
    );
    let pids: Vec<_> = vm.sessions.iter().map(|s| s.usage.pid).collect();
    assert_eq!(pids, [1000, 2000, 0]);
    assert!(vm.sessions.iter().all(|s| s.worker_pid == 0));
    let view = g.table.usage_view();
    assert_eq!(view.snapshot().unwrap().sessions_open, 3);
    assert_eq!(g.table.close_all(WAIT), 0);
    assert!(view.snapshot().unwrap().sessions.is_empty());
    drop(g);
    // The sessions' threads let go of the table as they end, just after close_all returned.
    let deadline = std::time::Instant::now() + WAIT;
    while view.snapshot().is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(view.snapshot().is_none(), "the view outlived its table");
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
    for (head, q) in (1u16..).zip(queued) {
        g.send(head, q);
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

#[test]
fn cuda_process_checkpoint_follows_cudas_states_and_holds_a_locked_process() {
    let mut g = Guest::new();
    let (first, _) = g.echo(7, b"a");
    g.send(0, first);
    g.rec.wait(1);
    let state = |g: &mut Guest, head, n| {
        let r = g.process_now(head, n, PROCESS_GET_STATE, 7, 0);
        assert_eq!(r.status, status::SUCCESS);
        r.rets[0]
    };
    assert_eq!(state(&mut g, 1, 2), PROCESS_STATE_RUNNING);
    // Only a locked process can be checkpointed or unlocked, only a checkpointed one restored.
    for (head, action) in [
        (2, PROCESS_CHECKPOINT),
        (3, PROCESS_RESTORE),
        (4, PROCESS_UNLOCK),
    ] {
        let r = g.process_now(head, usize::from(head) + 1, action, 7, 0);
        assert_eq!(r.status, status::ILLEGAL_STATE, "action {action}");
    }
    assert_eq!(
        g.process_now(5, 6, PROCESS_LOCK, 7, 0).status,
        status::SUCCESS
    );
    assert_eq!(state(&mut g, 6, 7), PROCESS_STATE_LOCKED);
    assert_eq!(
        g.process_now(7, 8, PROCESS_LOCK, 7, 0).status,
        status::ILLEGAL_STATE
    );
    assert_eq!(
        g.process_now(8, 9, PROCESS_RESTORE, 7, 0).status,
        status::ILLEGAL_STATE
    );

    // The locked process's own requests wait, in order, while other sessions go on.
    let (held_a, held_a_out) = g.echo(7, b"b");
    let (held_b, _) = g.echo(7, b"c");
    g.send(20, held_a);
    g.send(21, held_b);
    let (other, _) = g.echo(8, b"d");
    g.send(22, other);
    assert!(g.rec.wait(10).contains(&(22, 65)));
    thread::sleep(Duration::from_millis(50));
    assert_eq!(
        g.rec.done.lock().unwrap().len(),
        10,
        "a locked process's request ran"
    );

    assert_eq!(
        g.process_now(9, 11, PROCESS_CHECKPOINT, 7, 0).status,
        status::SUCCESS
    );
    assert_eq!(state(&mut g, 10, 12), PROCESS_STATE_CHECKPOINTED);
    assert_eq!(
        g.process_now(11, 13, PROCESS_UNLOCK, 7, 0).status,
        status::ILLEGAL_STATE
    );
    assert_eq!(
        g.process_now(12, 14, PROCESS_CHECKPOINT, 7, 0).status,
        status::ILLEGAL_STATE
    );
    assert_eq!(
        g.process_now(13, 15, PROCESS_RESTORE, 7, 0).status,
        status::SUCCESS
    );
    assert_eq!(state(&mut g, 14, 16), PROCESS_STATE_LOCKED);
    assert_eq!(
        g.rec.done.lock().unwrap().len(),
        16,
        "a locked process's request ran"
    );
    assert_eq!(
        g.process_now(15, 17, PROCESS_UNLOCK, 7, 0).status,
        status::SUCCESS
    );
    let done = g.rec.wait(19);
    let order: Vec<u16> = done[17..].iter().map(|d| d.0).collect();
    assert_eq!(order, vec![20, 21]);
    assert_eq!(g.response(held_a_out + 1).status, status::SUCCESS);
    assert_eq!(state(&mut g, 16, 20), PROCESS_STATE_RUNNING);
    assert!(g.table.wait_idle(WAIT));
    g.table.close_all(WAIT);
}

#[test]
fn cuda_process_checkpoint_of_a_process_without_cuda_or_a_bad_action_fails() {
    let mut g = Guest::new();
    // No session 30 in this VM: the process never used CUDA (or another VM's id).
    for (head, action) in (0u16..).zip([PROCESS_GET_STATE, PROCESS_LOCK, PROCESS_UNLOCK]) {
        let r = g.process_now(head, usize::from(head) + 1, action, 30, 0);
        assert_eq!(r.status, status::INITIALIZATION_ERROR, "action {action}");
    }
    let (first, _) = g.echo(31, b"a");
    g.send(3, first);
    g.rec.wait(4);
    assert_eq!(g.process_now(4, 5, 77, 31, 0).status, status::INVALID_VALUE);
    let r = g.process_now(5, 6, PROCESS_GET_RESTORE_THREAD, 31, 0);
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 4242));
    g.table.close_all(WAIT);
}

#[test]
fn a_lock_not_taken_within_its_timeout_fails_and_leaves_the_process_running() {
    let mut g = Guest::new();
    let gate = Arc::new(Gate::default());
    let entered = Arc::new(Gate::default());
    let (busy, _) = g.simple(Op::Hello, 40);
    // Session 40's thread is busy (its completion waits for the gate), as in a long op.
    g.table.dispatch(
        1,
        busy,
        Arc::new(GatedCompleter {
            gate: gate.clone(),
            entered: entered.clone(),
            saw_open: Arc::default(),
            inner: g.rec.clone(),
        }),
    );
    assert!(entered.wait(WAIT));
    let started = Instant::now();
    let r = g.process_now(2, 1, PROCESS_LOCK, 40, 60);
    assert_eq!(r.status, status::NOT_READY);
    assert!(started.elapsed() >= Duration::from_millis(60));
    gate.open();
    g.rec.wait(2);
    // The expired lock is never taken: the process runs on, and can be locked again.
    let (after, _) = g.echo(40, b"x");
    g.send(3, after);
    g.rec.wait(3);
    let r = g.process_now(4, 4, PROCESS_GET_STATE, 40, 0);
    assert_eq!(r.rets[0], PROCESS_STATE_RUNNING);
    assert_eq!(
        g.process_now(5, 5, PROCESS_LOCK, 40, 1000).status,
        status::SUCCESS
    );
    g.table.close_all(WAIT);
}

#[test]
fn a_locked_process_that_ends_answers_what_waited_and_is_gone() {
    let mut g = Guest::new();
    let (first, _) = g.echo(50, b"a");
    g.send(0, first);
    g.rec.wait(1);
    assert_eq!(
        g.process_now(1, 2, PROCESS_LOCK, 50, 0).status,
        status::SUCCESS
    );
    let (held, _) = g.echo(50, b"b");
    g.send(2, held);
    let (close, close_out) = g.simple(Op::SessionClose, 50);
    g.send(3, close);
    let done = g.rec.wait(4);
    assert!(
        done.contains(&(2, 65)) && done.contains(&(3, 64)),
        "{done:?}"
    );
    assert_eq!(g.response(close_out).status, status::SUCCESS);
    let r = g.process_now(4, 5, PROCESS_UNLOCK, 50, 0);
    assert_eq!(r.status, status::INITIALIZATION_ERROR);
    g.table.close_all(WAIT);
}

#[test]
fn sessions_migrate_to_another_table_and_a_refused_stream_ends_only_what_it_started() {
    use super::migration::{read_copied, write_stream, SavedGpu};
    let mut src = Guest::new();
    for (head, session) in [(1u16, 21u64), (2, 22)] {
        let (hello, _) = src.simple(Op::Hello, session);
        src.send(head, hello);
    }
    src.rec.wait(2);
    assert!(src.table.wait_idle(WAIT));
    let states = src.table.save_states(WAIT).unwrap();
    assert_eq!(
        states.iter().map(|s| (s.id, &s.gpu)).collect::<Vec<_>>(),
        [(21, &SavedGpu::None), (22, &SavedGpu::None)]
    );
    // Saving changed nothing at the source: its sessions answer as before.
    let (echo, echo_out) = src.echo(21, b"still here");
    src.send(3, echo);
    src.rec.wait(3);
    assert_eq!(src.response(echo_out + 10).status, status::SUCCESS);
    let mut stream = Vec::new();
    write_stream(&mut stream, &states).unwrap();

    // The destination: the same sessions, open before their next request.
    let mut dst = Guest::new();
    dst.table
        .restore_states(read_copied(&mut stream.as_slice()).unwrap(), WAIT)
        .unwrap();
    assert_eq!(dst.table.open_count(), 2);
    let (echo, echo_out) = dst.echo(22, b"moved");
    dst.send(7, echo);
    dst.rec.wait(1);
    assert_eq!(dst.response(echo_out + 5).status, status::SUCCESS);
    assert_eq!(dst.table.open_count(), 2);
    // A stream with a new session and then an id open here already: refused as a whole, the
    // session it started is ended again, and the sessions open before are untouched.
    let mut again = read_copied(&mut stream.as_slice()).unwrap();
    again[0].id = 30;
    dst.table.restore_states(again, WAIT).unwrap_err();
    assert_eq!(dst.table.open_count(), 2);
    let (echo, echo_out) = dst.echo(21, b"after");
    dst.send(8, echo);
    dst.rec.wait(2);
    assert_eq!(dst.response(echo_out + 5).status, status::SUCCESS);
    dst.table.close_all(WAIT);
    src.table.close_all(WAIT);
}

impl Guest {
    /// `GpuTrace` (status) from session `caller` about session `target`, as the guest kernel
    /// module stamps it, waited for as the `n`th completion.
    fn trace_now(&mut self, head: u16, n: usize, caller: u64, target: u64) -> ResponseHeader {
        let mut h = RequestHeader::new(Op::GpuTrace);
        h.session = caller;
        h.args[1] = 4242;
        h.args[3] = target;
        h.args[4] = 4242;
        h.push_buffer(Direction::Out, 64).unwrap();
        let (p, out) = self.request(h, &[]);
        self.send(head, p);
        let done = self.rec.wait(n);
        assert!(done.contains(&(head, 128)), "{done:?}");
        self.response(out + 64)
    }
}

#[test]
fn a_gpu_trace_reaches_only_a_session_of_its_own_vm() {
    let mut a = Guest::new();
    let mut b = Guest::new();
    // Session 7 lives in VM A (a Hello opens it; it has no worker).
    let (hello, _) = a.simple(Op::Hello, 7);
    a.send(0, hello);
    a.rec.wait(1);
    // VM B's table has no session 7: another VM's process cannot be named.
    let r = b.trace_now(0, 1, 99, 7);
    assert_eq!(r.status, status::INITIALIZATION_ERROR);
    // In VM A it is found; with no GPU work yet there is nothing to record, and no worker is
    // started for it.
    let r = a.trace_now(1, 2, 99, 7);
    assert_eq!(r.status, status::NOT_READY);
    assert_eq!(a.table.worker_pid(7), None);
    // A session nobody has.
    let r = a.trace_now(2, 3, 99, 12345);
    assert_eq!(r.status, status::INITIALIZATION_ERROR);
}

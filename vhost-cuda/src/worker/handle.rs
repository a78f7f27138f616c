//! The daemon's side of a session's worker process: start it, share guest RAM with it, hand it
//! requests, wait for its answers (or for a reason to stop waiting), end it and reap it.
//!
//! The session thread (`crate::session`) owns a [`WorkerProcess`] and is the only thread that
//! talks to it, kills it or reaps it. The worker is this very binary in its hidden
//! `--session-worker` mode (`child.rs`), started through `crate::sandbox::spawn` (clone and
//! exec on the daemon's spawner thread, in the worker's own namespaces when `--sandbox` asks
//! for them). In the child, before exec:
//!
//! - `PR_SET_PDEATHSIG(SIGKILL)`: the worker dies with the spawner thread that started it,
//!   which lives as long as the daemon, so workers die with the daemon, however it ends;
//! - the worker's end of the channel goes to fd 3 ([`CHANNEL_FD`](crate::worker::CHANNEL_FD)), the quota file (if any) to
//!   fd 4, and every other descriptor is marked close-on-exec, so no worker inherits another
//!   session's channel, the guest's eventfds or the vhost-user socket, whatever flags they
//!   were opened with.
//!
//! A worker is ended by closing the channel (it drops its CUDA session and exits); one still
//! there after [`CLOSE_WAIT`] (behind an endless kernel, say) gets SIGKILL, which also stops its
//! kernels: the driver tears the process's contexts down. Every worker is reaped, also when this
//! handle is dropped on an error path.

use std::{
    ffi::OsString,
    io, mem,
    os::{
        fd::{AsRawFd, OwnedFd, RawFd},
        unix::process::ExitStatusExt,
    },
    path::PathBuf,
    process::ExitStatus,
    sync::{Arc, Weak},
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{status, ResponseHeader};
use thiserror::Error;
use tracing::{debug, error, info, warn};
use vmm_sys_util::eventfd::EventFd;

use crate::{
    cuda::{trace::GpuTraceSetup, AddressSpace},
    fd_store::{self, FdStore},
    guest_buffer::{GuestBuffer, GuestRam, Request},
    limits::{Limits, SlotLease, QUOTA_FD},
    sandbox::{self, ChildProcess, IdMaps, SandboxMode, SeccompMode, SharedShm, SpawnSpec},
    shared_guest_ram::region_table,
    spin_wait,
    worker::{
        mailbox::Mailbox,
        message::{
            FromWorker, IpcCall, MessageError, RunMeta, RunRequest, Span, ToWorker, WorkerChannel,
            RUN_BATCH,
        },
        state_file::StateFile,
    },
};

/// How long an ending worker gets to exit by itself before SIGKILL.
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How long a send to a worker, or the read of a frame it has begun, may block: a worker that
/// stops reading or stops mid-frame is broken.
const CHANNEL_TIMEOUT: Duration = Duration::from_secs(10);
/// The running binary, whatever happened to its file since it started.
const THIS_BINARY: &str = "/proc/self/exe";

/// How to start a worker: the program and what it is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    program: PathBuf,
    gpu: Option<u32>,
    log_filter: String,
    /// The daemon's per-VM limits (the session table applies them).
    limits: Limits,
    /// `--hop-poll-us`: how long each side of a hop spins before it blocks (zero: never).
    hop_poll: Duration,
    /// `--hop-mailbox`: each worker gets the hop's shared mailbox.
    hop_mailbox: bool,
    /// `--spare-workers`: workers each VM keeps started ahead of its sessions.
    spares: usize,
    /// `--sandbox`.
    sandbox: SandboxMode,
    /// `--worker-seccomp`.
    seccomp: SeccompMode,
    /// `--gpu-va-base`, `--gpu-va-size`.
    address_space: AddressSpace,
    /// `--gpu-trace`, `--cupti`.
    gpu_trace: GpuTraceSetup,
    /// Workers outlive the daemon, their channels kept in systemd's file-descriptor store
    /// (`crate::fd_store`), for the next daemon to take over.
    keep: Option<KeepWorkers>,
    /// Where each VM's workers get their shared `/dev/shm` (sandboxed workers only).
    shared_shm: Option<Arc<SharedShm>>,
}

/// Where a daemon keeps its workers for the next one: the store, and the index of the
/// daemon's socket (the VM) the workers belong to.
#[derive(Debug, Clone)]
pub struct KeepWorkers {
    store: Arc<FdStore>,
    vm: usize,
}

impl KeepWorkers {
    /// Workers of VM `vm` (the daemon's socket index) kept in `store`.
    pub fn new(store: Arc<FdStore>, vm: usize) -> Self {
        Self { store, vm }
    }

    /// The same store, for the workers of VM `vm`.
    pub fn for_vm(&self, vm: usize) -> Self {
        Self::new(self.store.clone(), vm)
    }

    /// The index of the daemon socket (VM) its workers belong to.
    pub fn vm(&self) -> usize {
        self.vm
    }

    /// The store.
    pub fn store(&self) -> &Arc<FdStore> {
        &self.store
    }
}

impl PartialEq for KeepWorkers {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.store, &other.store) && self.vm == other.vm
    }
}

impl Eq for KeepWorkers {}

impl WorkerCommand {
    /// Workers run this very binary (through `/proc/self/exe`, so replacing the file on disk
    /// cannot pair the daemon with a worker of another build: the message format is unversioned).
    pub fn this_binary(gpu: Option<u32>, log_filter: impl Into<String>) -> Self {
        Self::program(THIS_BINARY, gpu, log_filter)
    }

    /// Workers run `program` (tests name the `vhost-cuda` binary; the test binary is not one).
    pub fn program(
        program: impl Into<PathBuf>,
        gpu: Option<u32>,
        log_filter: impl Into<String>,
    ) -> Self {
        Self {
            program: program.into(),
            gpu,
            log_filter: log_filter.into(),
            limits: Limits::default(),
            hop_poll: Duration::ZERO,
            hop_mailbox: false,
            spares: 0,
            sandbox: SandboxMode::None,
            seccomp: SeccompMode::Enforce,
            address_space: AddressSpace::default(),
            gpu_trace: GpuTraceSetup::default(),
            keep: None,
            shared_shm: None,
        }
    }

    /// The same command, each VM's sandboxed workers sharing a directory of `shm` as their
    /// `/dev/shm` (the driver's interprocess events between the VM's processes).
    pub fn with_shared_shm(mut self, shm: Option<Arc<SharedShm>>) -> Self {
        self.shared_shm = shm;
        self
    }

    /// Where VMs' workers share their `/dev/shm`, if they do.
    pub fn shared_shm(&self) -> Option<&Arc<SharedShm>> {
        self.shared_shm
            .as_ref()
            .filter(|_| self.sandbox != SandboxMode::None)
    }

    /// The same command, for a daemon with `--gpu-trace` and `--cupti`.
    pub fn with_gpu_trace(mut self, setup: GpuTraceSetup) -> Self {
        self.gpu_trace = setup;
        self
    }

    /// The same command, its workers outliving the daemon in `keep`'s store.
    pub fn with_keep(mut self, keep: Option<KeepWorkers>) -> Self {
        self.keep = keep;
        self
    }

    /// Where workers are kept for the next daemon, if they are.
    pub fn keep(&self) -> Option<&KeepWorkers> {
        self.keep.as_ref()
    }

    /// Whether `--hop-mailbox` is on.
    pub fn hop_mailbox(&self) -> bool {
        self.hop_mailbox
    }

    /// The same command, for a daemon with `--gpu-va-base` and `--gpu-va-size`.
    pub fn with_address_space(mut self, space: AddressSpace) -> Self {
        self.address_space = space;
        self
    }

    /// The same command, for a daemon with these per-VM limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The per-VM limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The same command, for a daemon with `--hop-poll-us`: after each answer, the session
    /// thread waiting for its next request and the worker waiting for its next message spin
    /// for up to `hop_poll` before they block, and so does the daemon waiting for an answer.
    /// A worker takes at most 100 ms (the range of the command line's `--hop-poll-us`).
    pub fn with_hop_poll(mut self, hop_poll: Duration) -> Self {
        self.hop_poll = hop_poll;
        self
    }

    /// How long each side of a hop spins before it blocks (zero: never).
    pub fn hop_poll(&self) -> Duration {
        self.hop_poll
    }

    /// Gives each worker the hop's shared mailbox (`mailbox.rs`); without it the socket
    /// carries everything.
    pub fn with_hop_mailbox(mut self, on: bool) -> Self {
        self.hop_mailbox = on;
        self
    }

    /// The same command, each VM keeping `n` workers started ahead of its sessions
    /// ([`WorkerProcess::spawn_spare`]).
    pub fn with_spares(mut self, n: usize) -> Self {
        self.spares = n;
        self
    }

    /// How many spare workers each VM keeps.
    pub fn spares(&self) -> usize {
        self.spares
    }

    /// The same command, with workers confined by `mode` and a seccomp filter in `seccomp`
    /// mode.
    pub fn with_sandbox(mut self, mode: SandboxMode, seccomp: SeccompMode) -> Self {
        self.sandbox = mode;
        self.seccomp = seccomp;
        self
    }

    /// How workers are confined.
    pub fn sandbox(&self) -> SandboxMode {
        self.sandbox
    }

    /// `session` `None`: a spare (`--spare`), given its session later.
    fn spec(
        &self,
        session: Option<u64>,
        vm: &str,
        quota_slot: Option<usize>,
        fds: Vec<RawFd>,
    ) -> io::Result<SpawnSpec> {
        let mut args: Vec<OsString> = vec![
            if self.program.as_os_str() == THIS_BINARY {
                "vhost-cuda".into()
            } else {
                self.program.clone().into()
            },
            "--session-worker".into(),
            "--session-id".into(),
            session.unwrap_or(0).to_string().into(),
            "--vm".into(),
            vm.into(),
            "--log-level".into(),
            self.log_filter.clone().into(),
            "--hop-poll-us".into(),
            self.hop_poll.as_micros().to_string().into(),
            "--sandbox".into(),
            self.sandbox.as_str().into(),
            "--worker-seccomp".into(),
            self.seccomp.as_str().into(),
            "--gpu-va-base".into(),
            format!("{:#x}", self.address_space.base).into(),
            "--gpu-trace".into(),
            self.gpu_trace.mode.as_str().into(),
        ];
        if let Some(p) = &self.gpu_trace.cupti {
            args.extend(["--cupti".into(), p.clone().into()]);
        }
        if self.address_space.base != 0 {
            args.extend([
                "--gpu-va-size".into(),
                self.address_space.per_device.to_string().into(),
            ]);
        }
        if let Some(g) = self.gpu {
            args.extend(["--gpu".into(), g.to_string().into()]);
        }
        if let Some(slot) = quota_slot {
            args.extend(["--gpu-memory-slot".into(), slot.to_string().into()]);
        }
        if self.keep.is_some() {
            args.push("--outlive-daemon".into());
        }
        if session.is_none() {
            args.push("--spare".into());
        }
        let shm = self
            .shared_shm()
            .map(|s| (s.fd(), SharedShm::vm_dir_name(vm)));
        if shm.is_some() {
            let at = 3 + fds.len();
            args.extend(["--shm-fd".into(), at.to_string().into()]);
        }
        // In a sandbox the driver's JIT cache is out of reach (and must be: a cache shared
        // by every VM's workers would let one VM's worker plant code in another's): say so
        // to the driver rather than let it fail on every PTX load.
        let env: &[(&str, &str)] = if self.sandbox == SandboxMode::None {
            &[]
        } else {
            &[("CUDA_CACHE_DISABLE", "1")]
        };
        let (flags, user) = self.sandbox.clone_flags();
        let mut spec = SpawnSpec::new(&self.program, &args, env)?;
        if let Some((parent, name)) = shm {
            spec = spec.with_shared_dir(parent, name);
        }
        // Every worker starts the same way, so that a session restored in a new one (a
        // migration's destination, on this host or another with the same driver) finds its
        // modules' globals at the addresses the program holds: the driver places them in its
        // own part of the address space, which only randomisation moves.
        Ok(spec
            .with_fds(fds)
            .with_fixed_layout(true)
            .outliving_parent(self.keep.is_some())
            .with_namespaces(flags, user.then(IdMaps::own_ids_as_root)))
    }
}

/// Errors of talking to a worker.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// The process cannot be started.
    #[error("cannot start a worker process: {0}")]
    Spawn(io::Error),
    /// A request that does not fit a message (cannot happen for a chain the parser accepted).
    #[error("request cannot be sent: {0}")]
    Unsendable(MessageError),
    /// The channel failed or the worker sent garbage.
    #[error("channel to the worker: {0}")]
    Channel(#[from] MessageError),
    /// The worker closed its end: it exited or was killed.
    #[error("the worker closed its channel")]
    Closed,
    /// The file a saved state travels in cannot be made, written or read.
    #[error("saved-state file: {0}")]
    StateFile(io::Error),
}

/// A worker's saved state ([`WorkerProcess::save_state`]) and how long the worker took.
#[derive(Debug, Clone)]
pub struct SavedByWorker {
    /// The saved state.
    pub file: StateFile,
    /// Microseconds the worker took to quiesce and capture (device memory copied out).
    pub capture_us: u64,
    /// Microseconds it took to encode the capture and write it into the file.
    pub encode_us: u64,
}

/// What a worker wrote for one pre-copy round ([`WorkerProcess::precopy_round`]).
#[derive(Debug)]
pub struct PrecopiedByWorker {
    /// The chunk log (`session/precopy.rs` frames it in the round).
    pub log: StateFile,
    /// Chunks in it.
    pub chunks: u64,
    /// Bytes still to pre-copy after it.
    pub pending: u64,
}

/// What [`WorkerProcess::wait`] saw first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The worker answered.
    Done(ResponseHeader),
    /// The wake-up event fired (and was reset); the worker is still busy.
    Woken,
}

/// A running worker process and the daemon's end of its channel.
#[derive(Debug)]
pub struct WorkerProcess {
    session: u64,
    vm: String,
    pid: u32,
    child: ChildProcess,
    /// `None` once closed.
    channel: Option<WorkerChannel>,
    /// The map whose table the worker has now.
    shared: Weak<GuestRam>,
    reaped: bool,
    /// What the worker said its last answered request took (ns).
    last_exec_ns: u64,
    /// How long [`WorkerProcess::wait`] spins before it blocks.
    hop_poll: Duration,
    /// The hop's mailbox (`mailbox.rs`), if it could be made.
    mailbox: Option<Mailbox>,
    /// Frames sent over the socket so far.
    frames_sent: u64,
    /// Memory tables sent so far ([`WorkerProcess::share_memory`]).
    tables_sent: u64,
    /// Requests posted to the mailbox so far.
    requests_posted: u64,
    /// Answers received so far (both ways): the next one's number is this plus one.
    answers: u64,
    /// Its slot of the VM's GPU-memory quota; freed (dropped) only after the worker is reaped.
    _quota: Option<SlotLease>,
    /// The store and name its channel is kept under for the next daemon, if it is.
    stored: Option<(Arc<FdStore>, String)>,
    /// A spare not yet given a session ([`WorkerProcess::spawn_spare`]).
    spare: bool,
}

/// How long taking over a worker waits for its answer (it finishes the op it runs first).
pub const ADOPT_WAIT: Duration = Duration::from_secs(60);

/// While spinning on the mailbox, the socket is checked once every this many looks.
const SOCKET_CHECK_EVERY: u32 = 64;

/// A close-on-exec copy of `fd` numbered above [`QUOTA_FD`].
fn above_quota_fd(fd: RawFd) -> Result<std::os::fd::OwnedFd, WorkerError> {
    use std::os::fd::FromRawFd;
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one (or -1).
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, QUOTA_FD + 1) };
    if copy < 0 {
        return Err(WorkerError::Spawn(io::Error::last_os_error()));
    }
    // SAFETY: `copy` is a fresh descriptor nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(copy) })
}

/// Waits until `ch` has something to read (a frame, or the end), at most until `deadline`:
/// `TimedOut` after it.
fn wait_readable(ch: &WorkerChannel, deadline: Instant) -> Result<(), WorkerError> {
    let mut fds = [libc::pollfd {
        fd: ch.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one initialised pollfd that outlives the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
        if rc > 0 {
            return Ok(());
        }
        if rc == 0 {
            return Err(MessageError::Io(io::Error::from(io::ErrorKind::TimedOut)).into());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(MessageError::Io(e).into());
        }
    }
}

/// Waits for answer number `expected` of the worker on `ch` (and `mailbox`), or until `wake`
/// fires (`None`). Looks without blocking for up to `spin` first (the mailbox, and the socket
/// now and then). Whenever it is about to block on the socket it first raises the daemon's
/// `sleeping` flag and looks in the mailbox once more, so that an answer posted from then on
/// comes with a `Posted` frame; the flag is lowered again on the way out.
fn wait_for_answer(
    ch: &WorkerChannel,
    mailbox: Option<&Mailbox>,
    expected: u64,
    spin: Duration,
    wake: Option<&EventFd>,
) -> Result<Option<(ResponseHeader, u64)>, WorkerError> {
    /// Lowers the daemon's flag however the wait ends.
    struct Awake<'a>(Option<&'a Mailbox>);
    impl Drop for Awake<'_> {
        fn drop(&mut self) {
            if let Some(m) = self.0 {
                m.set_daemon_sleeping(false);
            }
        }
    }
    let _awake = Awake(mailbox);
    let wake_fd = wake.map_or(-1, |w| w.as_raw_fd());
    let pollfds = || {
        [
            libc::pollfd {
                fd: ch.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ]
    };
    let mut spin = spin;
    if let Some(m) = mailbox {
        let mut checks = 0u32;
        let found = spin_wait::spin_until(mem::take(&mut spin), || {
            if let Some(a) = m.take_answer(expected) {
                return Some(Some(a));
            }
            checks = checks.wrapping_add(1);
            if checks.is_multiple_of(SOCKET_CHECK_EVERY) {
                let mut fds = pollfds();
                // SAFETY: two initialised pollfds that outlive the call; a negative fd is
                // ignored; a zero timeout returns at once.
                if unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) } > 0 {
                    // Something on the socket or a wake-up: the loop below takes it.
                    return Some(None);
                }
            }
            None
        });
        if let Some(Some(a)) = found {
            return mailbox_answer(a).map(Some);
        }
    }
    loop {
        if let Some(m) = mailbox {
            // Before every blocking poll: from now on the worker sends a `Posted` frame with
            // its answer, and an answer posted before this line is seen here.
            m.set_daemon_sleeping(true);
            if let Some(a) = m.take_answer(expected) {
                return mailbox_answer(a).map(Some);
            }
        }
        let mut fds = pollfds();
        // Once per wait (without a mailbox): a retry after EINTR blocks at once.
        let ready = spin_wait::poll(&mut fds, mem::take(&mut spin));
        let rc = match ready {
            Ok(0) => {
                // SAFETY: `fds` is an array of two initialised pollfds that outlives the call;
                // poll ignores the entry with a negative fd.
                unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) }
            }
            Ok(_) => 1,
            Err(e) => return Err(MessageError::Io(e).into()),
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(MessageError::Io(e).into());
        }
        // An answer that is there wins over the wake-up, which stays set.
        if fds[0].revents != 0 {
            match ch.recv_from_worker()? {
                Some(FromWorker::Done(resp, exec_ns)) => return Ok(Some((resp, exec_ns))),
                // A wake-up, or a stale one (its answer was taken before it came): the loop
                // looks in the mailbox again.
                Some(FromWorker::Posted) => continue,
                Some(FromWorker::Adopted { .. }) => return Err(MessageError::Mailbox.into()),
                // Only ever the answer of an IPC call, which is read on its own.
                Some(FromWorker::Exported(_) | FromWorker::Runs(_)) => {
                    return Err(MessageError::Mailbox.into())
                }
                None => return Err(WorkerError::Closed),
            }
        }
        if fds[1].revents != 0 {
            if let Some(w) = wake {
                let _ = w.read();
            }
            return Ok(None);
        }
    }
}

/// The answer the worker posted in the mailbox.
fn mailbox_answer(answer: Result<Vec<u8>, ()>) -> Result<(ResponseHeader, u64), WorkerError> {
    let body = answer.map_err(|()| MessageError::Mailbox)?;
    match FromWorker::decode(&body)? {
        FromWorker::Done(resp, exec_ns) => Ok((resp, exec_ns)),
        FromWorker::Posted
        | FromWorker::Adopted { .. }
        | FromWorker::Exported(_)
        | FromWorker::Runs(_) => Err(MessageError::Mailbox.into()),
    }
}

/// The guest-physical runs of a buffer, for the wire.
fn spans(b: &GuestBuffer) -> Vec<Span> {
    b.runs()
        .iter()
        .map(|r| Span {
            gpa: r.addr.0,
            len: r.len as u64,
        })
        .collect()
}

impl WorkerProcess {
    /// Starts the worker of session `session` of VM `vm` (the label in logs).
    pub fn spawn(cmd: &WorkerCommand, session: u64, vm: &str) -> Result<Self, WorkerError> {
        Self::spawn_with_quota(cmd, session, vm, None)
    }

    /// Like [`WorkerProcess::spawn`], the worker's device allocations counting against its
    /// VM's `--max-gpu-memory` in slot `quota`.
    pub fn spawn_with_quota(
        cmd: &WorkerCommand,
        session: u64,
        vm: &str,
        quota: Option<SlotLease>,
    ) -> Result<Self, WorkerError> {
        let mut worker = Self::start(cmd, Some(session), vm, quota)?;
        if let Some(keep) = &cmd.keep {
            worker.keep_in(keep);
        }
        worker.open_mailbox(cmd)?;
        Ok(worker)
    }

    /// Starts the process of session `session` (`None`: a spare, `--spare`), the channel on
    /// its CHANNEL_FD and the quota file (if any) on QUOTA_FD.
    fn start(
        cmd: &WorkerCommand,
        session: Option<u64>,
        vm: &str,
        quota: Option<SlotLease>,
    ) -> Result<Self, WorkerError> {
        let (channel, theirs) = WorkerChannel::pair().map_err(WorkerError::Spawn)?;
        channel
            .set_timeouts(CHANNEL_TIMEOUT)
            .map_err(WorkerError::Spawn)?;
        // Copies above QUOTA_FD, so that the child's dup2s cannot clobber each other.
        let theirs = {
            let stream = theirs;
            above_quota_fd(stream.as_raw_fd())?
        };
        let quota_copy = match &quota {
            Some(q) => Some(above_quota_fd(q.fd())?),
            None => None,
        };
        let mut fds = vec![theirs.as_raw_fd()];
        fds.extend(quota_copy.as_ref().map(AsRawFd::as_raw_fd));
        let spec = cmd
            .spec(session, vm, quota.as_ref().map(SlotLease::index), fds)
            .map_err(WorkerError::Spawn)?;
        // Both copies stay open until the spawn returns (the child has its own by then).
        let child = sandbox::spawn(spec).map_err(WorkerError::Spawn)?;
        drop(theirs);
        drop(quota_copy);
        let pid = child.id();
        match (session, child.worker_id()) {
            (None, _) => debug!(vm, "spare worker process {pid} started"),
            (Some(session), gpu) if gpu != pid => info!(
                vm,
                "session {session}: worker process {pid} started (sandbox: {}; the init of its \
                 PID namespace, the worker proper {gpu})",
                cmd.sandbox
            ),
            (Some(session), _) => info!(
                vm,
                "session {session}: worker process {pid} started (sandbox: {})", cmd.sandbox
            ),
        }
        Ok(Self {
            session: session.unwrap_or(0),
            vm: vm.to_string(),
            pid,
            child,
            channel: Some(channel),
            shared: Weak::new(),
            reaped: false,
            last_exec_ns: 0,
            hop_poll: cmd.hop_poll,
            mailbox: None,
            frames_sent: 0,
            tables_sent: 0,
            requests_posted: 0,
            answers: 0,
            _quota: quota,
            stored: None,
            spare: session.is_none(),
        })
    }

    /// Without a mailbox the socket carries everything, as it always can.
    fn open_mailbox(&mut self, cmd: &WorkerCommand) -> Result<(), WorkerError> {
        if cmd.hop_mailbox {
            match Mailbox::create() {
                Ok((mailbox, fd)) => {
                    self.send_message(&ToWorker::Mailbox, &[fd.as_raw_fd()])?;
                    self.mailbox = Some(mailbox);
                }
                Err(e) => warn!(
                    vm = %self.vm,
                    "session {}: no hop mailbox ({e}); the socket alone", self.session
                ),
            }
        }
        Ok(())
    }

    /// Starts a spare worker of VM `vm` (`--spare`): it makes its context on the first GPU
    /// and waits, for [`WorkerProcess::bind`]. Returns once the process is started, not warm.
    pub fn spawn_spare(cmd: &WorkerCommand, vm: &str) -> Result<Self, WorkerError> {
        Self::start(cmd, None, vm, None)
    }

    /// Gives a spare ([`WorkerProcess::spawn_spare`]) its session and its slot of the VM's
    /// accounting file, then what every worker gets at its start (the store for the next
    /// daemon, the hop's mailbox). Waits for the spare to finish its warm-up (at most
    /// [`CHANNEL_TIMEOUT`]). On an error the spare is of no use (end it); the slot comes back.
    pub fn bind(
        &mut self,
        cmd: &WorkerCommand,
        session: u64,
        quota: Option<SlotLease>,
    ) -> Result<(), (WorkerError, Option<SlotLease>)> {
        let slot = quota
            .as_ref()
            .map(|q| u32::try_from(q.index()).unwrap_or(u32::MAX));
        let fds: Vec<RawFd> = quota.iter().map(SlotLease::fd).collect();
        // Not counted among the frames sent: the worker reads it before its hop begins, and
        // the mailbox's posts name how many frames of the hop come before them.
        let sent = self
            .channel()
            .and_then(|ch| Ok(ch.send_to_worker(&ToWorker::Bind { session, slot }, &fds)?));
        if let Err(e) = sent {
            return Err((e, quota));
        }
        let warm_ms = match self.bind_answer() {
            Ok(ms) => ms,
            Err(e) => return Err((e, quota)),
        };
        self.session = session;
        self._quota = quota;
        self.spare = false;
        info!(
            vm = %self.vm,
            "session {session}: spare worker process {} taken (started {warm_ms} ms before)",
            self.pid
        );
        if let Some(keep) = &cmd.keep {
            self.keep_in(keep);
        }
        self.open_mailbox(cmd).map_err(|e| (e, None))
    }

    /// The spare's answer to its binding, read on the socket and not counted among the hop's
    /// answers: the milliseconds since it started.
    fn bind_answer(&mut self) -> Result<u64, WorkerError> {
        let ch = self.channel()?;
        wait_readable(ch, Instant::now() + CHANNEL_TIMEOUT)?;
        match ch.recv_from_worker()? {
            Some(FromWorker::Done(resp, _)) if resp.status == status::SUCCESS => Ok(resp.rets[0]),
            Some(_) => Err(MessageError::Mailbox.into()),
            None => Err(WorkerError::Closed),
        }
    }

    /// Hands systemd copies of the channel and a pidfd, for the next daemon.
    fn keep_in(&mut self, keep: &KeepWorkers) {
        let Some(ch) = &self.channel else { return };
        let slot = self._quota.as_ref().map(SlotLease::index);
        let name = fd_store::worker_name(keep.vm, self.session, self.pid, slot);
        let kept = sandbox::pidfd_open(self.pid).and_then(|pidfd| {
            keep.store
                .store(&name, &[ch.as_raw_fd(), pidfd.as_raw_fd()])
        });
        match kept {
            Ok(()) => self.stored = Some((keep.store.clone(), name)),
            Err(e) => warn!(
                vm = %self.vm,
                "session {}: worker {} not kept for a restart ({e}): it ends with the daemon",
                self.session, self.pid
            ),
        }
    }

    /// Takes over a worker that an earlier daemon left in the store: tells it so
    /// ([`ToWorker::Adopt`]), skips the answers it had sent the old daemon, and gives it a
    /// mailbox of its own if `cmd` says so. `quota` is its slot of the VM's accounting file.
    /// Waits up to [`ADOPT_WAIT`] (the worker first finishes the op it runs). Returns the
    /// worker and whether it keeps an answer the old daemon never delivered.
    pub fn adopt(
        cmd: &WorkerCommand,
        stored: fd_store::StoredWorker,
        vm: &str,
        quota: Option<SlotLease>,
    ) -> Result<(Self, bool), WorkerError> {
        let channel = WorkerChannel::new(std::os::unix::net::UnixStream::from(stored.channel));
        channel
            .set_timeouts(CHANNEL_TIMEOUT)
            .map_err(WorkerError::Spawn)?;
        let keep = cmd.keep.as_ref().map(|k| {
            (
                k.store.clone(),
                fd_store::worker_name(k.vm, stored.session, stored.pid, stored.slot),
            )
        });
        let mut worker = Self {
            session: stored.session,
            vm: vm.to_string(),
            pid: stored.pid,
            child: ChildProcess::adopted(stored.pid, stored.pidfd),
            channel: Some(channel),
            shared: Weak::new(),
            reaped: false,
            last_exec_ns: 0,
            hop_poll: cmd.hop_poll,
            mailbox: None,
            frames_sent: 0,
            tables_sent: 0,
            requests_posted: 0,
            answers: 0,
            _quota: quota,
            stored: keep,
            spare: false,
        };
        worker.send_message(&ToWorker::Adopt, &[])?;
        let deadline = Instant::now() + ADOPT_WAIT;
        let replay = loop {
            let ch = worker.channel()?;
            wait_readable(ch, deadline)?;
            match ch.recv_from_worker()? {
                Some(FromWorker::Adopted { session, replay }) if session == stored.session => {
                    break replay
                }
                Some(FromWorker::Adopted { .. }) => return Err(MessageError::Mailbox.into()),
                // Answers the old daemon never read: the guest's ring delivers their requests
                // again (the worker gives the last one's answer again). An IPC export's answer
                // goes with the old daemon's table of exports (its descriptor is not taken).
                Some(
                    FromWorker::Done(..)
                    | FromWorker::Posted
                    | FromWorker::Exported(_)
                    | FromWorker::Runs(_),
                ) => {}
                None => return Err(WorkerError::Closed),
            }
        };
        info!(
            vm,
            "session {}: worker process {} taken over from the previous daemon",
            stored.session,
            stored.pid
        );
        if cmd.hop_mailbox {
            match Mailbox::create() {
                Ok((mailbox, fd)) => {
                    worker.send_message(&ToWorker::Mailbox, &[fd.as_raw_fd()])?;
                    worker.mailbox = Some(mailbox);
                }
                Err(e) => warn!(vm, "session {}: no hop mailbox ({e})", stored.session),
            }
        }
        Ok((worker, replay))
    }

    /// Records that every answer so far reached the guest (its chain was completed), for a
    /// daemon that takes this worker over after a restart (`ToWorker::Adopt`).
    pub fn note_delivered(&self) {
        if let Some(m) = &self.mailbox {
            m.set_delivered(self.answers);
        }
    }

    /// Whether the hop's mailbox carries requests and answers (else the socket alone does).
    pub fn has_mailbox(&self) -> bool {
        self.mailbox.is_some()
    }

    /// The worker's process id: the daemon's child (in the namespace sandbox, the init of the
    /// worker's PID namespace, which ends the worker when it is killed).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The id of the process that holds the session's GPU contexts, as `nvidia-smi` lists it:
    /// the init's child in the namespace sandbox, else [`WorkerProcess::pid`].
    pub fn gpu_pid(&self) -> u32 {
        self.child.worker_id()
    }

    /// Nanoseconds the worker spent on the last request it answered (its own measure).
    pub fn last_exec_ns(&self) -> u64 {
        self.last_exec_ns
    }

    fn channel(&self) -> Result<&WorkerChannel, WorkerError> {
        self.channel.as_ref().ok_or(WorkerError::Closed)
    }

    /// Gives the worker `mem`'s memory table, unless it has it already. A table with nothing
    /// to map goes to a worker that has had none only as nothing: a migration's destination
    /// restores its sessions (and starts their workers) before QEMU's `SET_MEM_TABLE`, and the
    /// worker would refuse an empty table as a bad one; the table comes with `SET_MEM_TABLE`
    /// (`SessionTable::set_memory` sends it to every session's worker).
    pub fn share_memory(&mut self, mem: &Arc<GuestRam>) -> Result<(), WorkerError> {
        if Weak::ptr_eq(&self.shared, &Arc::downgrade(mem)) {
            return Ok(());
        }
        let (regions, fds, skipped) = region_table(mem);
        if skipped > 0 {
            warn!(
                vm = %self.vm,
                "session {}: {skipped} region(s) of guest RAM have no file and cannot be \
                 shared with the worker",
                self.session
            );
        }
        if regions.is_empty() && self.tables_sent == 0 {
            // A worker that had a table is sent the empty one, which unmaps the old RAM.
            self.shared = Arc::downgrade(mem);
            return Ok(());
        }
        self.channel()?
            .send_to_worker(&ToWorker::MemoryTable(regions), &fds)?;
        self.frames_sent += 1;
        self.tables_sent += 1;
        self.shared = Arc::downgrade(mem);
        Ok(())
    }

    /// Memory tables sent to the worker so far (tests: none while there is no guest RAM).
    pub fn memory_tables_sent(&self) -> u64 {
        self.tables_sent
    }

    /// Sends a request. The worker first gets the memory map the request was checked against,
    /// if it does not have it (the map may have changed since).
    pub fn send(&mut self, req: &Request) -> Result<(), WorkerError> {
        if let Some(b) = req.inputs().iter().chain(req.outputs()).next() {
            self.share_memory(b.shared_memory())?;
        }
        let msg = ToWorker::Run(Box::new(RunRequest {
            header: req.header().encode(),
            inputs: req.inputs().iter().map(spans).collect(),
            outputs: req.outputs().iter().map(spans).collect(),
        }));
        let body = msg.encode().map_err(WorkerError::Unsendable)?;
        if let Some(m) = &self.mailbox {
            let seq = self.requests_posted + 1;
            if let Some(kick) = m.post_request(seq, self.frames_sent, &body) {
                self.requests_posted = seq;
                if kick {
                    // The worker sleeps on the socket.
                    self.send_message(&ToWorker::Posted, &[])?;
                }
                return Ok(());
            }
        }
        self.send_frame(&body)
    }

    /// Sends any message, as is (tests use it to play a confused daemon).
    pub fn send_message(&mut self, msg: &ToWorker, fds: &[RawFd]) -> Result<(), WorkerError> {
        self.channel()?.send_to_worker(msg, fds)?;
        self.frames_sent += 1;
        Ok(())
    }

    /// Sends a raw frame body (tests use it to send what no message encodes to).
    pub fn send_frame(&mut self, body: &[u8]) -> Result<(), WorkerError> {
        self.channel()?.send_frame(body, &[])?;
        self.frames_sent += 1;
        Ok(())
    }

    /// Waits for the worker's next answer, or until `wake` fires. Looks without blocking for
    /// up to the command's `hop_poll` first (the mailbox, and the socket now and then): a short
    /// op is answered before this thread would have gone to sleep.
    pub fn wait(&mut self, wake: Option<&EventFd>) -> Result<Waited, WorkerError> {
        let ch = self.channel.as_ref().ok_or(WorkerError::Closed)?;
        let arrived = wait_for_answer(
            ch,
            self.mailbox.as_ref(),
            self.answers + 1,
            self.hop_poll,
            wake,
        )?;
        Ok(match arrived {
            Some((resp, exec_ns)) => {
                self.answers += 1;
                self.last_exec_ns = exec_ns;
                Waited::Done(resp)
            }
            None => Waited::Woken,
        })
    }

    /// Sends a request and waits for its answer.
    pub fn execute(&mut self, req: &Request) -> Result<ResponseHeader, WorkerError> {
        self.send(req)?;
        loop {
            if let Waited::Done(resp) = self.wait(None)? {
                return Ok(resp);
            }
        }
    }

    /// The operator's pause (`pause` true) or resume of the worker's GPU state, between
    /// requests: the answer's status says how it went (`worker::checkpoint_answer`), rets[0]
    /// the bytes moved between the GPU and host memory, rets[1] the nanoseconds it took.
    pub fn checkpoint(&mut self, pause: bool) -> Result<ResponseHeader, WorkerError> {
        let msg = if pause {
            ToWorker::Pause
        } else {
            ToWorker::Resume
        };
        self.send_message(&msg, &[])?;
        loop {
            if let Waited::Done(resp) = self.wait(None)? {
                return Ok(resp);
            }
        }
    }

    /// An IPC export or import between requests (`crate::session::ipc_broker`), with `fd` the
    /// descriptor an import carries. Answered on the socket, never through the mailbox: the
    /// response, and for an export that succeeded the driver's descriptor.
    pub fn ipc(
        &mut self,
        call: &IpcCall,
        fd: Option<RawFd>,
    ) -> Result<(ResponseHeader, Option<OwnedFd>), WorkerError> {
        let fds: Vec<RawFd> = fd.into_iter().collect();
        self.send_message(&ToWorker::Ipc(*call), &fds)?;
        let ch = self.channel()?;
        // The read times out after CHANNEL_TIMEOUT; an import may first create the context,
        // which can take longer on a loaded host.
        let mut tries = 0;
        loop {
            match ch.recv_ipc_answer() {
                Ok(Some((FromWorker::Exported(resp), Some(f)))) => {
                    return Ok((resp, Some(OwnedFd::from(f))))
                }
                Ok(Some((FromWorker::Done(resp, _), _))) => return Ok((resp, None)),
                Ok(Some(_)) => return Err(MessageError::Mailbox.into()),
                Ok(None) => return Err(WorkerError::Closed),
                Err(MessageError::Io(e))
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) && tries < 6 =>
                {
                    tries += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Saves the worker's whole GPU state (a migration's source; the state goes on running):
    /// `Ok(Ok(saved))` the saved state (`saved_state.rs`) in its file, `Ok(Err(answer))` the worker's
    /// refusal (its status says why, as for [`checkpoint`](Self::checkpoint)).
    pub fn save_state(&mut self) -> Result<Result<SavedByWorker, ResponseHeader>, WorkerError> {
        self.save_as(&ToWorker::SaveState)
    }

    /// [`save_state`](Self::save_state) without the allocations' contents
    /// ([`ToWorker::SaveRecord`]): a migration's quiesce at its last stop.
    pub fn save_record(&mut self) -> Result<Result<SavedByWorker, ResponseHeader>, WorkerError> {
        self.save_as(&ToWorker::SaveRecord)
    }

    fn save_as(
        &mut self,
        msg: &ToWorker,
    ) -> Result<Result<SavedByWorker, ResponseHeader>, WorkerError> {
        let file = StateFile::create(c"qcuda-saved-state").map_err(WorkerError::StateFile)?;
        self.send_message(msg, &[file.file().as_raw_fd()])?;
        let resp = loop {
            if let Waited::Done(resp) = self.wait(None)? {
                break resp;
            }
        };
        if resp.status != qcuda_proto::status::SUCCESS {
            return Ok(Err(resp));
        }
        // The worker's number is checked against the file: the file is what travels on.
        let file = StateFile::filled(
            file.file().try_clone().map_err(WorkerError::StateFile)?,
            resp.rets[0],
        )
        .map_err(WorkerError::StateFile)?;
        Ok(Ok(SavedByWorker {
            file,
            capture_us: resp.rets[2],
            encode_us: resp.rets[3],
        }))
    }

    /// One round of a migration's pre-copy ([`ToWorker::PrecopyRound`]): the worker writes a
    /// chunk log of at most `budget` bytes of changed device memory. `Ok(Ok(round))`: the log
    /// and its figures; `Ok(Err(answer))`: the worker's refusal (its state cannot be
    /// pre-copied). The worker goes on running.
    pub fn precopy_round(
        &mut self,
        budget: u64,
        max_passes: u32,
    ) -> Result<Result<PrecopiedByWorker, ResponseHeader>, WorkerError> {
        let file = StateFile::create(c"qcuda-precopy-round").map_err(WorkerError::StateFile)?;
        self.send_message(
            &ToWorker::PrecopyRound { budget, max_passes },
            &[file.file().as_raw_fd()],
        )?;
        let resp = loop {
            if let Waited::Done(resp) = self.wait(None)? {
                break resp;
            }
        };
        if resp.status != qcuda_proto::status::SUCCESS {
            return Ok(Err(resp));
        }
        let log = StateFile::filled(
            file.file().try_clone().map_err(WorkerError::StateFile)?,
            resp.rets[0],
        )
        .map_err(WorkerError::StateFile)?;
        Ok(Ok(PrecopiedByWorker {
            log,
            chunks: resp.rets[2],
            pending: resp.rets[3],
        }))
    }

    /// The worker forgets what its pre-copy sent ([`ToWorker::PrecopyReset`]).
    pub fn precopy_reset(&mut self) -> Result<ResponseHeader, WorkerError> {
        self.send_message(&ToWorker::PrecopyReset, &[])?;
        loop {
            if let Waited::Done(resp) = self.wait(None)? {
                return Ok(resp);
            }
        }
    }

    /// A same-host handover's source (`session/handover.rs`): the worker exports the memory
    /// under every mapped run of its ranges and saves its state without their contents
    /// ([`ToWorker::ExportRuns`]). `Ok(Ok((saved, runs)))`: the state, and each run (guest
    /// device, address, length) with its memory's descriptor; `Ok(Err(answer))`: the worker's
    /// refusal. The state goes on running, its memory where it was.
    #[expect(clippy::type_complexity, reason = "two outcomes of one exchange")]
    pub fn export_runs(
        &mut self,
    ) -> Result<Result<(SavedByWorker, Vec<(RunMeta, OwnedFd)>), ResponseHeader>, WorkerError> {
        let file = StateFile::create(c"qcuda-handover-state").map_err(WorkerError::StateFile)?;
        self.send_message(&ToWorker::ExportRuns, &[file.file().as_raw_fd()])?;
        let ch = self.channel()?;
        // Each read times out after CHANNEL_TIMEOUT; the export first waits for the GPU's
        // work and may move runs to shareable memory.
        let mut tries = 0;
        let (resp, runs) = loop {
            match ch.recv_runs_answer(super::message::MAX_RUNS) {
                Ok(Some(answer)) => break answer,
                Ok(None) => return Err(WorkerError::Closed),
                Err(MessageError::Io(e))
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) && tries < 60 =>
                {
                    tries += 1;
                }
                Err(e) => return Err(e.into()),
            }
        };
        if resp.status != qcuda_proto::status::SUCCESS {
            return Ok(Err(resp));
        }
        let file = StateFile::filled(
            file.file().try_clone().map_err(WorkerError::StateFile)?,
            resp.rets[0],
        )
        .map_err(WorkerError::StateFile)?;
        let runs = runs
            .into_iter()
            .map(|(meta, f)| (meta, OwnedFd::from(f)))
            .collect();
        Ok(Ok((
            SavedByWorker {
                file,
                capture_us: resp.rets[2],
                encode_us: resp.rets[3],
            },
            runs,
        )))
    }

    /// A same-host handover's destination: restores the state without contents `state` into
    /// this fresh worker, every run of it mapped from `runs` (the source's, claimed: guest
    /// device, address, length and the memory's descriptor), which travel first in batches
    /// ([`ToWorker::ImportRuns`]). Answered as [`restore_state`](Self::restore_state) is.
    pub fn restore_handed_over(
        &mut self,
        state: &StateFile,
        runs: &[(RunMeta, RawFd)],
    ) -> Result<ResponseHeader, WorkerError> {
        for batch in runs.chunks(RUN_BATCH) {
            let metas: Vec<RunMeta> = batch.iter().map(|(m, _)| *m).collect();
            let fds: Vec<RawFd> = batch.iter().map(|(_, fd)| *fd).collect();
            self.send_message(&ToWorker::ImportRuns(metas), &fds)?;
        }
        state.seal().map_err(WorkerError::StateFile)?;
        self.send_message(&ToWorker::RestoreHandedOver, &[state.file().as_raw_fd()])?;
        loop {
            if let Waited::Done(resp) = self.wait(None)? {
                return Ok(resp);
            }
        }
    }

    /// Restores a saved state (`saved_state.rs`, from a migration's source) into this worker,
    /// which must not have run a request yet. The answer's status says whether it was taken
    /// (as for [`checkpoint`](Self::checkpoint)); on a refusal the worker's state is left
    /// fresh or broken and the caller ends it.
    /// After a pre-copy, `store` is the session's store of pre-copied chunks, which travels
    /// with the state (sealed the same way).
    pub fn restore_state(
        &mut self,
        state: &StateFile,
        store: Option<&StateFile>,
    ) -> Result<ResponseHeader, WorkerError> {
        for f in std::iter::once(state).chain(store) {
            // The worker reads the file to its end: a file longer than the state (none the
            // daemon makes) is cut first.
            if f.file().metadata().map_err(WorkerError::StateFile)?.len() != f.len() {
                f.file().set_len(f.len()).map_err(WorkerError::StateFile)?;
            }
            f.seal().map_err(WorkerError::StateFile)?;
        }
        match store {
            None => self.send_message(&ToWorker::RestoreState, &[state.file().as_raw_fd()])?,
            Some(store) => self.send_message(
                &ToWorker::RestorePrecopied,
                &[state.file().as_raw_fd(), store.file().as_raw_fd()],
            )?,
        }
        loop {
            if let Waited::Done(resp) = self.wait(None)? {
                return Ok(resp);
            }
        }
    }

    /// Ends the worker: closes the channel, gives it `bound` to exit by itself, then SIGKILL.
    /// Returns once it is reaped.
    pub fn close(mut self, bound: Duration) -> ExitStatus {
        if let Some((store, name)) = self.stored.take() {
            // systemd's copy keeps the channel open: say it in words, then drop the copy.
            let _ = self.send_message(&ToWorker::End, &[]);
            store.remove(&name);
        }
        self.channel = None;
        self.reap_within(bound, "after its session closed")
    }

    /// Reaps a worker that failed (it closed its channel or sent garbage): it is given `bound`
    /// to end by itself, so that what ended it (a signal such as SIGSYS from its seccomp
    /// filter, or SIGSEGV) is what the log says, rather than the SIGKILL that follows.
    pub fn reap_lost(mut self, bound: Duration) -> ExitStatus {
        if let Some((store, name)) = self.stored.take() {
            store.remove(&name);
        }
        self.channel = None;
        self.reap_within(bound, "after it failed")
    }

    fn reap_within(&mut self, bound: Duration, when: &str) -> ExitStatus {
        let deadline = Instant::now() + bound;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return self.reaped(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    warn!(
                        vm = %self.vm,
                        "session {}: worker process {} still there {bound:?} {when}; killing it",
                        self.session, self.pid
                    );
                    return self.kill_and_reap();
                }
                Err(_) => return self.kill_and_reap(),
            }
        }
    }

    /// Whether the process has ended (it is reaped then).
    pub fn has_exited(&mut self) -> bool {
        if self.reaped {
            return true;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.reaped(status);
                true
            }
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// Ends the worker at once with SIGKILL (which also ends its running kernels) and reaps it.
    pub fn kill(mut self) -> ExitStatus {
        self.kill_and_reap()
    }

    fn kill_and_reap(&mut self) -> ExitStatus {
        if let Some((store, name)) = self.stored.take() {
            store.remove(&name);
        }
        self.channel = None;
        // Child::kill does nothing once the child has been reaped, so it never hits a reused pid.
        let _ = self.child.kill();
        let status = self
            .child
            .wait()
            .unwrap_or_else(|_| ExitStatus::from_raw(libc::SIGKILL));
        self.reaped(status)
    }

    fn reaped(&mut self, status: ExitStatus) -> ExitStatus {
        self.reaped = true;
        if status.signal() == Some(libc::SIGSYS) {
            error!(
                vm = %self.vm,
                "session {}: worker process {} killed by its seccomp filter: it made a system \
                 call outside the sandbox's allowance (a compromised worker, or a driver that \
                 needs a call the list lacks: docs/SECURITY.md, \"Sandbox\")",
                self.session, self.pid
            );
        }
        if self.spare {
            debug!(vm = %self.vm, "spare worker process {} exited ({status})", self.pid);
        } else {
            info!(
                vm = %self.vm,
                "session {}: worker process {} exited ({status})", self.session, self.pid
            );
        }
        status
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill_and_reap();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::mpsc, thread, time::Instant};

    use qcuda_proto::status;

    use super::*;

    /// The worker's side of one answer, as `child.rs` sends it: into the mailbox, with a
    /// `Posted` frame if the daemon sleeps.
    fn post(worker_ch: &WorkerChannel, m: &Mailbox, n: u64) {
        let body = FromWorker::Done(ResponseHeader::with_status(status::SUCCESS), n).encode();
        if m.post_answer(n, &body).unwrap() {
            worker_ch.send_to_daemon(&FromWorker::Posted).unwrap();
        }
    }

    fn pair() -> (WorkerChannel, WorkerChannel, Mailbox, Mailbox) {
        let (daemon_ch, theirs) = WorkerChannel::pair().unwrap();
        let (daemon_m, fd) = Mailbox::create().unwrap();
        let worker_m = Mailbox::open(&std::fs::File::from(fd)).unwrap();
        (daemon_ch, WorkerChannel::new(theirs), daemon_m, worker_m)
    }

    #[test]
    fn a_stale_posted_frame_does_not_put_the_daemon_to_sleep_unannounced() {
        // A `Posted` frame left over from an answer the daemon had already taken sits on the
        // socket; the next wait finds it while spinning. It must still raise its flag before it
        // blocks, or the worker's next answer comes without a wake-up and the daemon sleeps for
        // ever (the hang the H100 load run found).
        let (daemon_ch, worker_ch, daemon_m, worker_m) = pair();
        worker_ch.send_to_daemon(&FromWorker::Posted).unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter = thread::spawn(move || {
            let r = wait_for_answer(
                &daemon_ch,
                Some(&daemon_m),
                1,
                Duration::from_millis(5),
                None,
            );
            tx.send(()).unwrap();
            r.map(|a| a.map(|(_, n)| n))
        });
        // Long after the daemon's spin: it sleeps on the socket by now.
        thread::sleep(Duration::from_millis(100));
        post(&worker_ch, &worker_m, 1);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the daemon did not wake for the answer");
        assert_eq!(waiter.join().unwrap().unwrap(), Some(1));
    }

    #[test]
    fn answers_are_never_missed_whatever_the_timing() {
        // Answers at random moments (at once, within the spin, after it), with stale `Posted`
        // frames thrown in: every wait returns its own answer.
        let (daemon_ch, worker_ch, daemon_m, worker_m) = pair();
        let rounds = 300u64;
        let worker = thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for n in 1..=rounds {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 4 {
                    0 => {}
                    1 => thread::sleep(Duration::from_micros(x % 300)),
                    2 => thread::sleep(Duration::from_millis(2 + x % 3)),
                    _ => {
                        worker_ch.send_to_daemon(&FromWorker::Posted).unwrap();
                        thread::sleep(Duration::from_micros(x % 2000));
                    }
                }
                post(&worker_ch, &worker_m, n);
                // The next answer only after the daemon took this one (one request at a time).
                while daemon_taken(&worker_m) < n {
                    thread::yield_now();
                }
            }
            worker_ch
        });
        let t = Instant::now();
        for n in 1..=rounds {
            let got = wait_for_answer(
                &daemon_ch,
                Some(&daemon_m),
                n,
                Duration::from_micros(500),
                None,
            )
            .unwrap()
            .map(|(_, e)| e);
            assert_eq!(got, Some(n));
            daemon_m.ack_for_test(n);
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "too slow: a missed answer"
            );
        }
        drop(worker.join().unwrap());
    }

    #[test]
    fn a_hostile_answer_in_the_mailbox_is_an_error_not_a_crash() {
        let (daemon_ch, _worker_ch, daemon_m, worker_m) = pair();
        // Garbage, a `Posted` where an answer belongs, and a truncated answer: each fails the
        // wait with an error (the session's op fails, as for a garbled frame).
        for body in [
            &b"\xff\xff"[..],
            &FromWorker::Posted.encode(),
            &[3u8, 1, 2][..],
        ] {
            worker_m.post_answer(1, body).unwrap();
            let r = wait_for_answer(&daemon_ch, Some(&daemon_m), 1, Duration::ZERO, None);
            assert!(r.is_err(), "{body:?} was taken for an answer");
        }
        // An answer with another number is not this wait's: it goes on waiting (here until
        // the wake-up).
        worker_m.post_answer(5, &FromWorker::Done(ResponseHeader::default(), 0).encode());
        let wake = EventFd::new(0).unwrap();
        wake.write(1).unwrap();
        let r = wait_for_answer(&daemon_ch, Some(&daemon_m), 2, Duration::ZERO, Some(&wake));
        assert_eq!(r.unwrap(), None);
    }

    fn daemon_taken(m: &Mailbox) -> u64 {
        m.acked_for_test()
    }
}

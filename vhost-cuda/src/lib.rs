//! vhost-cuda: a vhost-user backend that executes qcuda requests on the host GPU.
//!
//! The data path, top to bottom: `main.rs` (command line) → this file (sockets and the
//! connection lifecycle) → `vhu_cuda.rs` (the vhost-user backend, draining the queue) →
//! `chain.rs` (descriptor chain → validated [`guest_buffer::Request`]) → `session/` (one
//! thread per guest process) → `transport_ops.rs` (Hello, Echo), the host queries, or the
//! session's worker process, `worker/`: `handle.rs` (the daemon's side) → `message.rs` (the
//! socket between them) → `child.rs` (the worker itself: `vhost-cuda --session-worker`, guest
//! RAM mapped by `shared_guest_ram.rs`) → `cuda/` (every CUDA op). `spin_wait.rs` bounds the
//! spinning before the waits between the queue and the worker (`--hop-poll-us`).
//!
//! Names: a *session* is one guest process (one open file of `/dev/qcuda`); its *session
//! thread* runs in the daemon; its *worker* is the child process that holds its CUDA state.
//!
//! Lifecycle of one socket: bind once, then for each connection a fresh backend and
//! `VhostUserDaemon`, `start` (accept) and `wait`. A disconnect, clean or not, closes that
//! connection's sessions and the loop waits for the next frontend; the socket file stays.
//! SIGINT/SIGTERM stop every socket's loop and remove the socket files. Sockets that systemd
//! bound and passed (`socket_activation.rs`) are served the same way, but their files are
//! systemd's and stay. Beside them, `stats.rs` serves what each VM uses (`vhost-cuda --stats`)
//! from the table of its current connection.
//!
//! Across a restart: under systemd the workers outlive the daemon, their channels kept in
//! systemd's file-descriptor store (`fd_store.rs`), and the next daemon takes them over with
//! the request ring's record of chains in flight (`ring_record.rs`).
//!
//! Outside the data path, `frontend/` plays a VM (QEMU's vhost-user side and qcuda.ko's request
//! queue) from a host process, for the process tests and `vhost-cuda-frontend-bench`.

pub mod chain;
pub mod cuda;
pub mod device_output;
pub mod fd_store;
pub mod frontend;
pub mod guest_buffer;
pub mod host_function_link;
pub mod limits;
pub(crate) mod peer;
pub mod ring_record;
pub mod sandbox;
pub mod session;
pub mod shared_guest_ram;
pub mod signals;
pub mod socket;
pub mod socket_activation;
pub mod spin_wait;
pub mod stats;
pub mod transport_ops;
pub mod vhu_cuda;
pub mod worker;

use std::{
    ops::Range,
    os::fd::{AsRawFd, RawFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    thread,
    time::Duration,
};

use thiserror::Error as ThisError;
use tracing::{error, info, warn};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::eventfd::{EventFd, EFD_CLOEXEC, EFD_NONBLOCK};

use crate::{
    cuda::CudaHost, guest_buffer::GuestRam, stats::StatsRegistry, vhu_cuda::VhostCudaBackend,
    worker::WorkerCommand,
};

/// Most sockets one process serves.
pub const MAX_SOCKETS: u32 = 64;

/// Consecutive failed accepts after which a socket is given up.
const MAX_ACCEPT_FAILURES: u32 = 10;

/// Errors of the daemon.
#[derive(Debug, ThisError)]
pub enum Error {
    /// The directory that should hold the socket does not exist.
    #[error("socket directory {0} does not exist")]
    SocketDirMissing(PathBuf),
    /// The socket's parent is not a directory.
    #[error("{0} is not a directory")]
    SocketDirNotDir(PathBuf),
    /// The socket path has no file name.
    #[error("socket path {0} does not name a file")]
    SocketPathNoName(PathBuf),
    /// The socket path does not fit a sockaddr_un.
    #[error("socket path {0} is longer than the 107 bytes a Unix socket path may have")]
    SocketPathTooLong(PathBuf),
    /// `--socket-count` out of range.
    #[error("--socket-count must be between 1 and {MAX_SOCKETS}, not {0}")]
    BadSocketCount(u32),
    /// The log filter does not parse.
    #[error("invalid log level {0:?}: {1}")]
    BadLogLevel(String, String),
    /// `--gpu` names a GPU the host does not have.
    #[error("--gpu: {0}")]
    Gpu(#[from] cuda::HostError),
    /// A socket cannot be bound.
    #[error(transparent)]
    Socket(#[from] socket::SocketError),
    /// vhost-user-backend refused to create the daemon.
    #[error("cannot create the vhost-user daemon: {0}")]
    CreateDaemon(String),
    /// A socket stopped accepting connections.
    #[error("socket {path}: cannot accept connections: {reason}")]
    Accept {
        /// The socket path.
        path: PathBuf,
        /// The last accept error.
        reason: String,
    },
    /// The host cannot build the sandbox `--sandbox` asks for.
    #[error(
        "--sandbox={0}: {1}; the daemon does not start without it (--sandbox=chroot needs \
         fewer namespaces; --sandbox=none runs workers unconfined, unsafe with untrusted guests)"
    )]
    Sandbox(sandbox::SandboxMode, sandbox::SandboxError),
    /// The daemon's own seccomp filter cannot be installed.
    #[error("the daemon's seccomp filter: {0}")]
    DaemonFilter(sandbox::SandboxError),
    /// `--gpu-va-base` / `--gpu-va-size` out of range.
    #[error("{0}")]
    BadAddressSpace(String),
    /// `--max-sessions` out of range.
    #[error("--max-sessions must be between 1 and {1}, not {0}")]
    BadMaxSessions(usize, usize),
    /// Neither `--socket-path` nor sockets from systemd.
    #[error("--socket-path is required (or listening sockets from systemd: LISTEN_FDS)")]
    NoSocketPath,
    /// The sockets systemd passed cannot be used.
    #[error("socket activation: {0}")]
    Activation(#[from] socket_activation::ActivationError),
    /// `--socket-path` names a socket that systemd did not pass.
    #[error("socket activation: no socket bound to {0} was passed (check ListenStream= in the socket unit)")]
    InheritedSocketMissing(PathBuf),
    /// systemd passed a socket that `--socket-path` does not name.
    #[error("socket activation: fd {fd} ({label}) is not a socket --socket-path names")]
    InheritedSocketUnexpected {
        /// The fd.
        fd: RawFd,
        /// Its path, or "unnamed".
        label: String,
    },
    /// Signal handling cannot be set up.
    #[error("cannot set up signal handling: {0}")]
    Signals(std::io::Error),
    /// The eventfd that stops a socket's thread cannot be made.
    #[error("cannot create an eventfd: {0}")]
    WakeEvent(std::io::Error),
    /// A socket's thread cannot be started.
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    /// A socket's thread panicked (a bug).
    #[error("a socket thread panicked")]
    SocketThreadPanicked,
}

/// Result of daemon operations.
pub type Result<T> = std::result::Result<T, Error>;

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The socket path as given; `None` when every socket comes from systemd.
    pub socket_path: Option<PathBuf>,
    /// Sockets to serve: 1 serves `socket_path` itself; N > 1 serves `socket_path.0` ..
    /// `socket_path.(N-1)`.
    pub socket_count: u32,
    /// Listening sockets systemd passed (socket activation): served instead of binding
    /// `socket_path`, which, when given, must be where they are bound.
    pub inherited_fds: Option<Range<RawFd>>,
    /// Host GPU the guests are restricted to (they see it as their device 0).
    pub gpu: Option<u32>,
    /// The tracing filter (`info`, `vhost_cuda=debug`, ...).
    pub log_filter: String,
    /// How long each request queue is polled after its last request (0: wait for kicks).
    pub poll: Duration,
    /// How long a migration's source waits for a destination on its host to claim the device
    /// memory before it copies it (`--handover-wait-ms`; 0: it never offers).
    pub handover_wait: Duration,
    /// A migration's pre-copy of device memory (`--precopy-round-mib`, `--precopy-passes`).
    pub precopy: vhu_cuda::PrecopySetup,
    /// How long each wait between the request queue and the GPU spins before it blocks
    /// (`--hop-poll-us`; 0: block at once).
    pub hop_poll: Duration,
    /// Whether the hop to each worker has its shared mailbox (`--hop-mailbox`).
    pub hop_mailbox: bool,
    /// Workers each VM keeps started ahead of its guest processes (`--spare-workers`).
    pub spare_workers: usize,
    /// Per-VM limits (`--max-sessions`, `--max-gpu-memory`).
    pub limits: limits::Limits,
    /// Where to serve the stats (`--stats-socket`; by default `PATH.stats` beside the
    /// vhost-user socket); `None`: nowhere.
    pub stats_socket: Option<PathBuf>,
    /// How workers are confined (`--sandbox`).
    pub sandbox: sandbox::SandboxMode,
    /// What a worker's seccomp filter does outside its list (`--worker-seccomp`).
    pub worker_seccomp: sandbox::SeccompMode,
    /// Where each session's device address range lies (`--gpu-va-base`, `--gpu-va-size`).
    pub address_space: cuda::AddressSpace,
    /// How workers record GPU timelines (`--gpu-trace`, `--cupti`).
    pub gpu_trace: cuda::trace::GpuTraceSetup,
}

impl Config {
    /// The socket paths this configuration serves (of its inherited sockets: the ones it
    /// expects).
    pub fn socket_paths(&self) -> Vec<PathBuf> {
        let Some(path) = &self.socket_path else {
            return Vec::new();
        };
        if self.socket_count == 1 {
            return vec![path.clone()];
        }
        (0..self.socket_count)
            .map(|i| {
                let mut p = path.clone().into_os_string();
                p.push(format!(".{i}"));
                PathBuf::from(p)
            })
            .collect()
    }
}

/// What a daemon gets from the one before it, through systemd's file-descriptor store
/// (`fd_store.rs`), and whether it keeps its own workers there for the next one.
#[derive(Debug, Default)]
pub struct Handover {
    /// systemd's notification socket (`NOTIFY_SOCKET`), told `READY=1`.
    pub store: Option<Arc<fd_store::FdStore>>,
    /// Whether workers are kept in its file-descriptor store for the next daemon
    /// (`--keep-workers`).
    pub keep_workers: bool,
    /// What the previous daemon left: its workers and accounting files.
    pub passed: fd_store::Passed,
}

/// The directory of the VMs' shared `/dev/shm`s (sandbox/shared_shm.rs), on the host's
/// `/dev/shm`; made before the daemon's filter, which opens no file. Without it sandboxed
/// workers have no `/dev/shm`, and the driver's interprocess events fail.
fn shared_shm(mode: sandbox::SandboxMode) -> Option<Arc<sandbox::SharedShm>> {
    if mode == sandbox::SandboxMode::None {
        return None;
    }
    match sandbox::SharedShm::create(std::path::Path::new("/dev/shm")) {
        Ok(s) => {
            info!(
                "each VM's workers share a directory of {} as their /dev/shm (interprocess events)",
                s.path().display()
            );
            Some(s)
        }
        Err(e) => {
            warn!(
                "no shared /dev/shm for the workers ({e}): interprocess events between a VM's \
                 processes will fail"
            );
            None
        }
    }
}

/// Runs the daemon until SIGINT or SIGTERM: binds every socket, then serves one connection
/// after another on each.
pub fn start_backend(config: Config) -> Result<()> {
    start_backend_with(config, Handover::default())
}

/// [`start_backend`], taking over the previous daemon's workers and keeping this one's for
/// the next (`handover`). With a store, SIGINT and SIGTERM end the daemon at once and leave
/// the sessions to the next daemon: `systemctl restart` then loses no guest program's state,
/// and `systemctl stop` ends the workers when systemd closes the store.
pub fn start_backend_with(config: Config, handover: Handover) -> Result<()> {
    // Before any thread exists, so that every thread inherits the mask.
    let signals = signals::block().map_err(Error::Signals)?;
    let host = CudaHost::with_gpu_filter(config.gpu)?;
    info!(
        "CUDA: driver version {}, {} GPU(s) for guests{}",
        host.driver_version(),
        host.gpu_count(),
        config
            .gpu
            .map_or(String::new(), |g| format!(" (host GPU {g} only)"))
    );
    for i in 0..host.gpu_count() {
        if let Some(g) = host.gpu_info(i) {
            info!(
                "GPU {i}: {} (cc {}.{}, {} SMs, {} MiB)",
                String::from_utf8_lossy(g.name_bytes()),
                g.cc_major,
                g.cc_minor,
                g.multiprocessors,
                g.total_mem >> 20
            );
        }
    }
    match config.sandbox {
        sandbox::SandboxMode::None => warn!(
            "--sandbox=none: workers run UNCONFINED, with the daemon's view of the host and its \
             privileges; a guest that compromises the NVIDIA driver through its worker reaches \
             everything this user can. Use only with trusted guests."
        ),
        mode => {
            sandbox::check_host(
                std::path::Path::new("/proc/self/exe"),
                mode,
                config.worker_seccomp,
            )
            .map_err(|e| Error::Sandbox(mode, e))?;
            info!(
                "sandbox: every worker in a {mode} sandbox ({}), seccomp {}",
                match mode.clone_flags() {
                    (_, true) => "user namespace: the daemon lacks CAP_SYS_ADMIN",
                    _ => "the daemon's user",
                },
                config.worker_seccomp
            );
        }
    }
    info!(
        "GPU timelines: {}{}",
        config.gpu_trace.mode,
        match (&config.gpu_trace.cupti, config.gpu_trace.mode.wants_cupti()) {
            (Some(p), true) => format!(" (libcupti from {})", p.display()),
            (None, true) => " (libcupti from the CUDA toolkit or the loader's path)".to_string(),
            _ => String::new(),
        }
    );
    info!(
        "polling: request queues {} µs, the hop to the workers {} µs; hop mailbox {}",
        config.poll.as_micros(),
        config.hop_poll.as_micros(),
        if config.hop_mailbox { "on" } else { "off" }
    );
    let keeping = handover.store.clone().filter(|_| handover.keep_workers);
    let mut server = Server::bind(&config, host.clone())?;
    server.take_handover(handover);
    let stop = server.stop_handle();
    // Only the files this process made are removed; systemd's stay with systemd.
    let mut own_files = if config.inherited_fds.is_some() {
        Vec::new()
    } else {
        config.socket_paths()
    };
    if let Some(path) = &config.stats_socket {
        stats::serve(path, host, server.stats())?;
        own_files.push(path.clone());
    }
    match keeping {
        Some(store) => {
            let files = own_files.clone();
            signals
                .spawn_handler(own_files, move || {
                    // The sessions stay with their workers, in systemd's store, for the next
                    // daemon; QEMU reconnects to it. Ending now is what a crash would do.
                    info!("workers kept for the next daemon; exiting");
                    for p in &files {
                        let _ = std::fs::remove_file(p);
                    }
                    drop(store);
                    #[expect(
                        clippy::exit,
                        reason = "the sessions must outlive this process untouched: no drop \
                                  may close them"
                    )]
                    std::process::exit(0);
                })
                .map_err(Error::Signals)?;
        }
        None => signals
            .spawn_handler(own_files, move || stop.stop())
            .map_err(Error::Signals)?,
    }
    // From here on no thread that handles guest data opens a file or executes a program;
    // workers are started by the spawner thread, which stays unfiltered. (The stats socket is
    // bound already; its thread only accepts, reads and writes, and the unlink below is
    // allowed.)
    // A migration's handover offer names this host by its boot id: read it while files open.
    if let Err(e) = session::handover::boot_id() {
        warn!("this host's boot id is unreadable ({e}): migrations will copy device memory");
    }
    if config.sandbox != sandbox::SandboxMode::None {
        sandbox::enter_daemon_filter().map_err(Error::DaemonFilter)?;
        info!(
            "daemon seccomp filter installed: no file opens, exec, mounts or tracing from now on"
        );
    }
    let result = server.run();
    if let Some(path) = &config.stats_socket {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// Stop state of one socket, shared between its serving thread and whoever stops it.
///
/// The serving thread waits for a connection in poll(2) on the listener and `wake`, and calls
/// accept only once one is pending, so a stop reaches it without touching the listening
/// socket: shutdown(2) on it would also break it for systemd, which keeps a passed socket
/// open to hand it to the next daemon.
#[derive(Debug)]
struct SocketControl {
    path: PathBuf,
    wake: EventFd,
    state: Mutex<SocketState>,
}

#[derive(Default)]
struct SocketState {
    stopping: bool,
    connection: Option<ShutdownHandle>,
}

impl std::fmt::Debug for SocketState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketState")
            .field("stopping", &self.stopping)
            .field("connected", &self.connection.is_some())
            .finish()
    }
}

impl SocketControl {
    fn state(&self) -> MutexGuard<'_, SocketState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stopping(&self) -> bool {
        self.state().stopping
    }

    fn stop(&self) {
        let mut st = self.state();
        st.stopping = true;
        if let Err(e) = self.wake.write(1) {
            error!(
                "cannot wake the thread of socket {}: {e}",
                self.path.display()
            );
        }
        if let Some(c) = &st.connection {
            c.shutdown();
        }
    }

    /// Records the live connection; false if a stop came first.
    fn connected(&self, handle: Option<ShutdownHandle>) -> bool {
        let mut st = self.state();
        st.connection = handle;
        !st.stopping
    }

    fn disconnected(&self) {
        self.state().connection = None;
    }

    /// Waits until a frontend connects to `listener` (true) or the socket is stopped (false).
    fn wait_for_frontend(&self, listener: &Listener) -> std::io::Result<bool> {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            if self.stopping() {
                return Ok(false);
            }
            // SAFETY: `fds` is a valid array of two pollfd for the duration of the call, and
            // both fds are open: the listener is borrowed, `wake` is owned by `self`.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 {
                return Ok(false);
            }
            if fds[0].revents != 0 {
                return Ok(!self.stopping());
            }
        }
    }
    fn close_listener(&self, listener: Listener) {
        // Listener's drop removes the socket file, if it made it.
        drop(listener);
    }
}

/// Stops a running [`Server`]; cheap to clone, usable from any thread.
#[derive(Debug, Clone)]
pub struct StopHandle {
    sockets: Vec<Arc<SocketControl>>,
}

impl StopHandle {
    /// Stops every socket: no new connections, live ones are shut down, sessions closed,
    /// socket files removed. [`Server::run`] then returns.
    pub fn stop(&self) {
        for s in &self.sockets {
            s.stop();
        }
    }
}

/// The bound sockets, ready to serve.
pub struct Server {
    sockets: Vec<(Listener, Arc<SocketControl>)>,
    host: Arc<CudaHost>,
    workers: WorkerCommand,
    poll: Duration,
    handover_wait: Duration,
    precopy: vhu_cuda::PrecopySetup,
    stats: Arc<StatsRegistry>,
    /// Where workers are kept for the next daemon, if they are.
    keep: Option<worker::KeepWorkers>,
    /// What the previous daemon left.
    passed: fd_store::Passed,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.sockets.iter().map(|(_, c)| &c.path))
            .finish()
    }
}

impl Server {
    /// Binds every socket of `config`, or takes the ones systemd passed. Fails without side
    /// effects if any is in use.
    pub fn bind(config: &Config, host: Arc<CudaHost>) -> Result<Self> {
        let listeners = match &config.inherited_fds {
            Some(fds) => inherited_listeners(fds.clone(), &config.socket_paths())?,
            None => {
                let mut bound = Vec::new();
                for path in config.socket_paths() {
                    // On error the listeners bound so far drop and remove their files.
                    bound.push((socket::bind(&path)?, path));
                }
                bound
            }
        };
        let mut sockets = Vec::new();
        let stats = Arc::new(StatsRegistry::default());
        for (listener, path) in listeners {
            stats.add(&path.display().to_string());
            let control = Arc::new(SocketControl {
                wake: EventFd::new(EFD_NONBLOCK | EFD_CLOEXEC).map_err(Error::WakeEvent)?,
                path,
                state: Mutex::new(SocketState::default()),
            });
            sockets.push((listener, control));
        }
        // Workers are this binary, told the daemon's --gpu, log filter and --hop-poll-us.
        let workers = WorkerCommand::this_binary(config.gpu, config.log_filter.clone())
            .with_limits(config.limits)
            .with_hop_poll(config.hop_poll)
            .with_hop_mailbox(config.hop_mailbox)
            .with_spares(config.spare_workers)
            .with_sandbox(config.sandbox, config.worker_seccomp)
            .with_address_space(config.address_space)
            .with_shared_shm(shared_shm(config.sandbox))
            .with_gpu_trace(config.gpu_trace.clone());
        Ok(Self {
            sockets,
            host,
            workers,
            poll: config.poll,
            handover_wait: config.handover_wait,
            precopy: config.precopy,
            stats,
            keep: None,
            passed: fd_store::Passed::default(),
        })
    }

    /// Takes over what the previous daemon left, and keeps this one's workers for the next
    /// when `handover` has a store. Tells systemd the daemon is ready.
    pub fn take_handover(&mut self, handover: Handover) {
        self.passed = handover.passed;
        if let Some(s) = &handover.store {
            s.ready();
        }
        self.keep = handover
            .store
            .filter(|_| handover.keep_workers)
            .map(|s| worker::KeepWorkers::new(s, 0));
        if let Some(k) = &self.keep {
            for name in std::mem::take(&mut self.passed.gone) {
                k.store().remove(&name);
            }
        }
        let sockets = self.sockets.len();
        let (orphans, kept) = std::mem::take(&mut self.passed.workers)
            .into_iter()
            .partition(|w| w.vm >= sockets);
        self.passed.workers = kept;
        for w in orphans {
            warn!(
                "session {} of socket {} of the previous daemon: no such socket now; its \
                 worker process {} is ended",
                w.session, w.vm, w.pid
            );
            if let Some(k) = &self.keep {
                k.store()
                    .remove(&fd_store::worker_name(w.vm, w.session, w.pid, w.slot));
            }
            let _ = sandbox::ChildProcess::adopted(w.pid, w.pidfd).kill();
        }
    }

    /// What each socket's VM uses, for the stats socket.
    pub fn stats(&self) -> Arc<StatsRegistry> {
        self.stats.clone()
    }

    /// A handle that stops this server.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            sockets: self.sockets.iter().map(|(_, c)| c.clone()).collect(),
        }
    }

    /// Serves every socket, each on its own thread, until stopped. A socket that fails does
    /// not stop the others; the first failure is returned once all have ended.
    pub fn run(self) -> Result<()> {
        let mut threads = Vec::new();
        let mut passed = self.passed;
        for (i, (listener, control)) in self.sockets.into_iter().enumerate() {
            let workers = self
                .workers
                .clone()
                .with_keep(self.keep.as_ref().map(|k| k.for_vm(i)));
            let (host, poll) = (
                self.host.clone(),
                (self.poll, self.handover_wait, self.precopy),
            );
            let stats = (self.stats.clone(), i);
            let record = ring_record_for(i, passed.rings.remove(&i), self.keep.as_ref());
            let inherited = Inherited {
                workers: passed.take_workers(i),
                quota_file: passed.quotas.remove(&i),
                ring: record,
            };
            let spawned = thread::Builder::new()
                .name(format!("qcuda-vm{i}"))
                .spawn(move || {
                    serve_socket(listener, control, host, workers, poll, stats, inherited)
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    error!("cannot start the thread of socket {i}: {e}");
                    return Err(Error::Thread(e));
                }
            }
        }
        let mut result = Ok(());
        for t in threads {
            let r = t.join().unwrap_or(Err(Error::SocketThreadPanicked));
            if let Err(e) = r {
                error!("{e}");
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }
}

/// The sockets systemd passed, each with its label (its path), in the order of `expected`
/// when that names them.
fn inherited_listeners(
    fds: Range<RawFd>,
    expected: &[PathBuf],
) -> Result<Vec<(Listener, PathBuf)>> {
    let mut passed = socket_activation::adopt(fds)?;
    let label = |s: &socket_activation::InheritedSocket| {
        s.path
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("fd {}", s.fd)))
    };
    let mut listeners = Vec::new();
    if expected.is_empty() {
        for s in passed {
            info!("socket {} from systemd (fd {})", label(&s).display(), s.fd);
            let path = label(&s);
            // Built from a UnixListener, a Listener knows no path, so its drop leaves the
            // file to systemd.
            listeners.push((Listener::from(s.listener), path));
        }
        return Ok(listeners);
    }
    for want in expected {
        let at = passed
            .iter()
            .position(|s| s.path.as_deref() == Some(want.as_path()))
            .ok_or_else(|| Error::InheritedSocketMissing(want.clone()))?;
        let s = passed.swap_remove(at);
        info!("socket {} from systemd (fd {})", want.display(), s.fd);
        listeners.push((Listener::from(s.listener), want.clone()));
    }
    if let Some(extra) = passed.first() {
        return Err(Error::InheritedSocketUnexpected {
            fd: extra.fd,
            label: extra
                .path
                .as_deref()
                .map_or("unnamed".to_string(), |p: &Path| p.display().to_string()),
        });
    }
    Ok(listeners)
}

/// One connection's daemon, ended properly: the vring threads are told to exit and
/// joined (when the daemon drops), then the backend closes its sessions.
fn end_connection(daemon: VhostUserDaemon<Arc<VhostCudaBackend>>, backend: &VhostCudaBackend) {
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    drop(daemon);
    backend.disconnect();
}

/// What one socket takes over from the previous daemon.
struct Inherited {
    workers: Vec<fd_store::StoredWorker>,
    quota_file: Option<std::os::fd::OwnedFd>,
    /// The ring's record, and whether it is the previous daemon's.
    ring: (Option<Arc<ring_record::RingRecord>>, bool),
}

/// The record of socket `vm`'s request ring: the previous daemon's (`passed`: its chains in
/// flight are taken again), or a new one kept in the store for the next daemon; none when
/// workers are not kept. Returns it and whether it is the previous daemon's.
fn ring_record_for(
    vm: usize,
    passed: Option<std::os::fd::OwnedFd>,
    keep: Option<&worker::KeepWorkers>,
) -> (Option<Arc<ring_record::RingRecord>>, bool) {
    if let Some(fd) = passed {
        match ring_record::RingRecord::open(fd) {
            Ok(r) => return (Some(Arc::new(r)), true),
            Err(e) => warn!("the previous daemon's ring record of socket {vm} is unusable: {e}"),
        }
    }
    let Some(keep) = keep else {
        return (None, false);
    };
    match ring_record::RingRecord::create() {
        Ok(r) => {
            let name = fd_store::ring_name(vm);
            keep.store().remove(&name);
            if let Err(e) = keep.store().store(&name, &[r.fd()]) {
                warn!("ring record of socket {vm} not kept for a restart: {e}");
            }
            (Some(Arc::new(r)), false)
        }
        Err(e) => {
            warn!("no ring record for socket {vm}: {e}");
            (None, false)
        }
    }
}

/// How long sessions taken over from the previous daemon wait for their VM to reconnect.
pub const RECONNECT_WAIT: Duration = Duration::from_secs(120);

/// Ends the sessions taken over from the previous daemon if their VM does not reconnect within
/// [`RECONNECT_WAIT`] (QEMU quit during the restart): nothing of them is left behind.
fn watch_adopted(backend: &Arc<VhostCudaBackend>, label: &str) {
    let backend = Arc::downgrade(backend);
    let label = label.to_string();
    let spawned = thread::Builder::new()
        .name("qcuda-adopted".into())
        .spawn(move || {
            thread::sleep(RECONNECT_WAIT);
            if let Some(b) = backend.upgrade().filter(|b| !b.was_connected()) {
                warn!(
                    vm = %label,
                    "the VM did not reconnect within {RECONNECT_WAIT:?}: ending the sessions \
                     taken over from the previous daemon"
                );
                b.sessions().close_all(vhu_cuda::CLOSE_WAIT);
            }
        });
    if let Err(e) = spawned {
        warn!("cannot watch the sessions taken over: {e}");
    }
}

/// Where a migration's source makes its handover socket (`session/handover.rs`): the
/// daemon's runtime directory (systemd's `RUNTIME_DIRECTORY`, its first entry), else the
/// directory of the VM's socket.
fn handover_dir(socket: &std::path::Path) -> Option<PathBuf> {
    std::env::var_os("RUNTIME_DIRECTORY")
        .and_then(|v| {
            v.to_str()
                .and_then(|s| s.split(':').next())
                .filter(|s| s.starts_with('/'))
                .map(PathBuf::from)
        })
        .or_else(|| socket.parent().map(std::path::Path::to_path_buf))
        .filter(|d| !d.as_os_str().is_empty())
}

fn serve_socket(
    mut listener: Listener,
    control: Arc<SocketControl>,
    host: Arc<CudaHost>,
    workers: WorkerCommand,
    (poll, handover_wait, precopy): (Duration, Duration, vhu_cuda::PrecopySetup),
    (stats, stats_index): (Arc<StatsRegistry>, usize),
    inherited: Inherited,
) -> Result<()> {
    let handover = vhu_cuda::HandoverSetup {
        dir: (!handover_wait.is_zero())
            .then(|| handover_dir(&control.path))
            .flatten(),
        wait: handover_wait,
    };
    let Inherited {
        workers: mut adopted,
        mut quota_file,
        ring: (record, mut recover),
    } = inherited;
    let label = control.path.display().to_string();
    let mut failures = 0u32;
    let result = loop {
        if control.stopping() {
            break Ok(());
        }
        let mem = GuestMemoryAtomic::new(GuestRam::new());
        let backend = Arc::new(
            VhostCudaBackend::with_quota_file(
                host.clone(),
                workers.clone(),
                mem.clone(),
                &*label,
                quota_file.take(),
            )
            .with_poll(poll)
            .with_ring_record(record.clone(), std::mem::take(&mut recover))
            .with_migration_log(stats.migration_log(stats_index))
            .with_handover(handover.clone())
            .with_precopy(precopy),
        );
        // The previous daemon's sessions of this VM, for the frontend that reconnects.
        if !adopted.is_empty() {
            info!(vm = %label, "taking over {} session(s) of the previous daemon", adopted.len());
            backend.sessions().adopt(std::mem::take(&mut adopted));
            watch_adopted(&backend, &label);
        }
        let mut daemon = match VhostUserDaemon::new("vhost-cuda".to_string(), backend.clone(), mem)
        {
            Ok(d) => d,
            Err(e) => break Err(Error::CreateDaemon(e.to_string())),
        };
        info!(vm = %label, "waiting for a frontend");
        match control.wait_for_frontend(&listener) {
            Ok(true) => {}
            Ok(false) => {
                end_connection(daemon, &backend);
                break Ok(());
            }
            Err(e) => {
                end_connection(daemon, &backend);
                break Err(Error::Accept {
                    path: control.path.clone(),
                    reason: format!("poll: {e}"),
                });
            }
        }
        if let Err(e) = daemon.start(&mut listener) {
            end_connection(daemon, &backend);
            if control.stopping() {
                break Ok(());
            }
            failures += 1;
            error!(vm = %label, "accept failed ({failures}/{MAX_ACCEPT_FAILURES}): {e}");
            if failures >= MAX_ACCEPT_FAILURES {
                break Err(Error::Accept {
                    path: control.path.clone(),
                    reason: e.to_string(),
                });
            }
            thread::sleep(Duration::from_millis(100 * u64::from(failures)));
            continue;
        }
        failures = 0;
        backend.note_connected();
        if !control.connected(daemon.shutdown_handle()) {
            daemon.request_shutdown();
        }
        stats.connect(stats_index, backend.sessions().usage_view());
        info!(vm = %label, "frontend connected");
        let ended = daemon.wait();
        control.disconnected();
        match ended {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(VhostUserError::Disconnected)) => {
                info!(vm = %label, "frontend disconnected");
            }
            Err(vhost_user_backend::Error::HandleRequest(
                e @ (VhostUserError::PartialMessage | VhostUserError::SocketBroken(_)),
            )) => warn!(vm = %label, "frontend disconnected abruptly: {e}"),
            Err(e) => warn!(vm = %label, "frontend connection ended: {e}"),
        }
        stats.disconnect(stats_index);
        end_connection(daemon, &backend);
    };
    control.close_listener(listener);
    info!(vm = %label, "socket closed");
    result
}

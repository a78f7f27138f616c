//! The `vhost-cuda` command: parse and validate the command line, set up logging, serve.
//!
//! Exit status: 0 after SIGINT/SIGTERM, 1 when serving fails (socket in use, bind or accept
//! failure), 2 for an invalid command line or configuration.
//!
//! Under systemd, the per-VM settings come from the environment (`VHOST_CUDA_GPU`, ...: an
//! instance's `EnvironmentFile=`), and a socket unit may pass the listening socket
//! (`LISTEN_FDS`, `vhost_cuda::socket_activation`).
//!
//! `vhost-cuda --stats` asks a running daemon what each of its VMs uses (its stats socket,
//! `vhost_cuda::stats`) and prints it; exit status 1 if the daemon cannot be asked.
//!
//! The same binary is also each session's worker process (`--session-worker`, hidden from
//! `--help`): the daemon starts it that way itself (`vhost_cuda::worker`).

use std::{
    io::IsTerminal, ops::Range, os::fd::RawFd, path::PathBuf, process::exit, time::Duration,
};

use clap::Parser;
use tracing_subscriber::EnvFilter;
use vhost_cuda::{
    cuda::{
        trace::{GpuTraceMode, GpuTraceSetup},
        AddressSpace, DEFAULT_VA_BASE, DEFAULT_VA_SIZE,
    },
    limits::Limits,
    sandbox::{SandboxMode, SeccompMode},
    session::MAX_SESSIONS,
    socket_activation, spin_wait, start_backend_with,
    stats::{self, StatsFormat},
    worker::{self, WorkerConfig},
    Config, Error, Handover, Result, MAX_SOCKETS,
};

/// Longest socket path: sockaddr_un.sun_path holds 108 bytes including the NUL.
const MAX_SOCKET_PATH: usize = 107;

/// vhost-user backend for qcuda: runs the CUDA calls of a QEMU guest on this host's GPU.
#[derive(Parser, Debug)]
#[command(name = "vhost-cuda", version, about, long_about = None)]
struct Args {
    /// vhost-user Unix socket to listen on (QEMU's -chardev socket,path=...). Its directory
    /// must exist. With --socket-count N > 1 the sockets are PATH.0 ... PATH.(N-1). Under
    /// systemd socket activation (LISTEN_FDS) the daemon serves the sockets it is passed
    /// instead, and PATH, if given, must be where they are bound.
    #[arg(long, value_name = "PATH")]
    socket_path: Option<PathBuf>,

    /// Number of sockets (VMs) this process serves, each isolated from the others.
    #[arg(long, value_name = "N", default_value_t = 1)]
    socket_count: u32,

    /// Restrict the guests to this host GPU ordinal.
    #[arg(long, value_name = "ORDINAL", env = "VHOST_CUDA_GPU")]
    gpu: Option<u32>,

    /// Poll each request queue for this many microseconds after its last request before
    /// waiting for the guest's next kick: the guest then does not kick, which saves an exit to
    /// QEMU and a wake-up per request, while a host core spins for up to that long after each
    /// burst. 0 turns polling off.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    poll_us: u64,

    /// At a live migration's stop, wait up to this many milliseconds for a destination daemon
    /// on this host (same boot, same GPUs) to claim the guests' device memory, which it then
    /// maps instead of receiving a copy (see docs/operators.md, "Migrating a VM to another
    /// host"). A destination elsewhere never claims: the wait is added to the downtime before
    /// the memory is copied. 0: never offer, always copy.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    handover_wait_ms: u64,

    /// While a live migration copies guest RAM, pre-copy the guests' device memory too, in
    /// rounds of at most this many MiB (QEMU's `max-bandwidth` paces them): the stop then
    /// sends only what changed since. A migration whose device memory is handed over (same
    /// host) does not need it, but pays only the background traffic. See docs/operators.md.
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(2..=4096))]
    precopy_round_mib: u64,

    /// Passes over the device memory a pre-copy makes at most: memory that changes faster
    /// than the passes go is left to the stop. 0: no pre-copy.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=16))]
    precopy_passes: u32,

    /// Spin for up to this many microseconds before each wait on the hop between the request
    /// queue and the GPU: the session thread for its next request, the session's worker
    /// process for its next message, the daemon for the worker's answer. Back-to-back calls
    /// then find both awake, which saves two thread wake-ups per call (tens of µs on a
    /// virtualised host); the price is up to two host cores per active session spinning up
    /// to that long after each request. 0 turns it off. Default: 50 on a host with at least
    /// 8 CPUs, else 0 (on fewer, the spinning threads take the cores the guest's vCPUs need:
    /// measured on 2 cores under TCG, a call took 125 to 144 µs with it and 35 µs without).
    #[arg(long, value_name = "MICROSECONDS", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    hop_poll_us: Option<u64>,

    /// Give each worker a shared mailbox for the hop (requests and answers without a system
    /// call while both sides are awake; see docs/vhost-cuda.md): `on` (the default, also
    /// what a bare `--hop-mailbox` means) or `off` (the socket alone).
    #[arg(long, value_name = "on|off", env = "VHOST_CUDA_HOP_MAILBOX", default_value = "on",
          num_args = 0..=1, default_missing_value = "on", value_parser = parse_on_off)]
    hop_mailbox: bool,

    /// Most threads spinning at once (`--poll-us`, `--hop-poll-us`) over every vhost-cuda
    /// process of the host, daemons and session workers together (a table in
    /// /dev/shm/qcuda-spin-budget); a thread that finds them all spinning waits at once
    /// instead. Many busy sessions then leave the host's other cores to the guests' vCPUs.
    /// Give every daemon of a host the same value. 0 turns spinning off. Default: a quarter
    /// of the host's CPUs, at least 1.
    #[arg(long, value_name = "N", env = "VHOST_CUDA_SPIN_BUDGET", value_parser = clap::value_parser!(u64).range(0..=spin_wait::MAX_SPIN_BUDGET as u64))]
    spin_budget: Option<u64>,

    /// Log filter: error, warn, info, debug, trace, or tracing directives such as
    /// "vhost_cuda=debug". Default: $RUST_LOG, else info.
    #[arg(long, value_name = "LEVEL", env = "VHOST_CUDA_LOG_LEVEL")]
    log_level: Option<String>,

    /// Most bytes of GPU memory the sessions of one VM may have allocated together (suffixes
    /// K, M, G, T: powers of 1024). Past it, allocations fail with cudaErrorMemoryAllocation.
    /// Default: no limit beyond the GPU's.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, env = "VHOST_CUDA_MAX_GPU_MEMORY")]
    max_gpu_memory: Option<u64>,

    /// Where each guest process's device address range starts (hexadecimal with 0x, or
    /// decimal; "off" or 0: none). Every allocation of a guest process lies in a range of
    /// --gpu-va-size bytes per GPU reserved at a fixed address, so that its device pointers can
    /// keep their values when its state is restored (pause and resume). Ranges of guest
    /// processes follow each other up to 0x7800_0000_0000. Default: 0x680000000000.
    #[arg(long, value_name = "ADDRESS", value_parser = parse_va_base, env = "VHOST_CUDA_GPU_VA_BASE")]
    gpu_va_base: Option<u64>,

    /// Bytes of a guest process's device address range on one GPU (suffixes K, M, G, T; a
    /// multiple of 2M): the most it may allocate there. Default: 256G.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, env = "VHOST_CUDA_GPU_VA_SIZE")]
    gpu_va_size: Option<u64>,

    /// Worker processes each VM keeps started ahead of its guest processes (0 to 4), each
    /// with its CUDA context made on the first GPU: a guest process's first CUDA call (or a
    /// migrated process's restore on this daemon) takes one instead of waiting about 0.1 s for
    /// a worker and the driver's first context; another is started at once. Each holds a
    /// context's device memory while it waits. Default: 0.
    #[arg(long, value_name = "N", env = "VHOST_CUDA_SPARE_WORKERS", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=4))]
    spare_workers: u8,

    /// Worker mode: started ahead of its session, which `ToWorker::Bind` gives it.
    #[arg(long, hide = true, requires = "session_worker")]
    spare: bool,

    /// Most guest processes of one VM that may use qcuda at once (1 to 1024). A further
    /// process's first call fails with cudaErrorDevicesUnavailable. Default: 1024.
    #[arg(long, value_name = "N", env = "VHOST_CUDA_MAX_SESSIONS")]
    max_sessions: Option<usize>,

    /// Ask the daemon serving --socket-path (or --stats-socket) what each of its VMs uses:
    /// the GPUs, per VM its sessions (guest processes) with their GPU memory, kernels and
    /// guest pids; print it and exit.
    #[arg(long, conflicts_with = "session_worker")]
    stats: bool,

    /// Pause a guest process of the daemon serving --socket-path (or --stats-socket): its
    /// session id (as --stats shows it), or "all" for every guest process of every VM. The
    /// op in flight ends, every allocation's contents move to host memory and the GPU memory
    /// is released; the program's further CUDA calls wait until --resume. Only root or the
    /// daemon's user may.
    #[arg(long, value_name = "SESSION|all", conflicts_with_all = ["session_worker", "stats", "resume"])]
    pause: Option<String>,

    /// Resume what --pause paused: the memory goes back to the GPU at the same addresses and
    /// the program goes on.
    #[arg(long, value_name = "SESSION|all", conflicts_with_all = ["session_worker", "stats"])]
    resume: Option<String>,

    /// How --stats prints: a table for people, JSON, or Prometheus text.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = StatsFormat::Table)]
    stats_format: StatsFormat,

    /// The daemon's stats socket, which --stats asks. Default: the --socket-path with
    /// ".stats" appended (PATH.stats also with --socket-count).
    #[arg(long, value_name = "PATH")]
    stats_socket: Option<PathBuf>,
    /// How each guest process's worker is confined. namespace: its own mount, PID, network,
    /// IPC and UTS namespaces (and a user namespace when the daemon lacks CAP_SYS_ADMIN), a
    /// root holding only the NVIDIA devices and driver files, no capabilities, no_new_privs and
    /// a seccomp filter of the system calls the driver needs. chroot: the same root,
    /// privileges and filter in the host's PID, network and IPC namespaces. none: no
    /// confinement at all (unsafe with untrusted guests). The daemon refuses to start if the
    /// host cannot build the sandbox asked for.
    #[arg(long, value_name = "MODE", default_value_t = SandboxMode::Namespace, env = "VHOST_CUDA_SANDBOX")]
    sandbox: SandboxMode,

    /// What a worker's seccomp filter does with a system call outside its list: enforce
    /// (kill the worker) or log (the kernel logs the call and lets it run: only for measuring
    /// the calls a new driver makes).
    #[arg(long, value_name = "MODE", default_value_t = SeccompMode::Enforce, env = "VHOST_CUDA_WORKER_SECCOMP")]
    worker_seccomp: SeccompMode,

    /// How a recording of a guest process's GPU timeline (`qcuda-smi trace`, QCUDA_PROFILE in
    /// the guest) times its GPU work: auto (CUPTI's activity API where libcupti loads, else
    /// CUDA events around each op), cupti (CUPTI only: a recording is refused without it),
    /// events, off (requests only; nothing of CUPTI is loaded into workers).
    #[arg(long, value_name = "MODE", default_value_t = GpuTraceMode::Auto, env = "VHOST_CUDA_GPU_TRACE")]
    gpu_trace: GpuTraceMode,

    /// libcupti.so.13 for GPU timelines: the file, or the directory holding it (the CUDA
    /// toolkit's extras/CUPTI/lib64, or the nvidia-cuda-cupti wheel's lib). Default: the
    /// toolkit under /usr/local/cuda, then the dynamic loader's path.
    #[arg(long, value_name = "PATH", env = "VHOST_CUDA_CUPTI")]
    cupti: Option<PathBuf>,

    /// Print the system calls a worker's seccomp filter allows, one a line, and exit (for
    /// comparing with a measurement: scripts/sandbox-gpu-check.sh).
    #[arg(long, hide = true)]
    print_worker_syscalls: bool,

    /// A worker that only builds its sandbox and exits (the daemon's start-up check).
    #[arg(long, hide = true, requires = "session_worker")]
    sandbox_check: bool,

    /// Run as the worker process of one session, on the channel at fd 3 (the daemon starts
    /// its workers this way; not for people).
    #[arg(
        long,
        hide = true,
        requires = "session_id",
        conflicts_with = "socket_path"
    )]
    session_worker: bool,

    /// The session a worker serves.
    #[arg(long, hide = true, value_name = "ID")]
    session_id: Option<u64>,

    /// The VM a worker serves, for its logs.
    #[arg(long, hide = true, value_name = "LABEL", default_value = "")]
    vm: String,

    /// Worker mode: the descriptor of the VM's shared directory, bound at /dev/shm in the
    /// worker's root.
    #[arg(long, hide = true, value_name = "FD", requires = "session_worker")]
    shm_fd: Option<RawFd>,

    /// A worker's slot of its VM's GPU-memory quota, whose file is on fd 4.
    #[arg(long, hide = true, value_name = "SLOT", requires = "session_worker")]
    gpu_memory_slot: Option<usize>,

    /// Worker mode: the daemon keeps this worker for its successor (systemd's
    /// file-descriptor store), so a closed host-function link means the daemon died.
    #[arg(long, hide = true, requires = "session_worker")]
    outlive_daemon: bool,

    /// Under systemd (`NOTIFY_SOCKET`): start workers that outlive the daemon and keep their
    /// channels in systemd's file-descriptor store (the unit needs `FileDescriptorStoreMax=`,
    /// `NotifyAccess=main` and `KillMode=process`), so that a restarted or crashed daemon's
    /// successor takes every session over and no guest program notices. `off`: workers die
    /// with the daemon.
    #[arg(long, value_name = "on|off", env = "VHOST_CUDA_KEEP_WORKERS", default_value = "on",
          num_args = 0..=1, default_missing_value = "on", value_parser = parse_on_off)]
    keep_workers: bool,

    /// The listening sockets systemd passed (`LISTEN_FDS`), taken from the environment.
    #[arg(skip)]
    inherited_fds: Option<Range<RawFd>>,
}

/// A byte count: digits, optionally followed by K, M, G or T (powers of 1024; "KiB", "MB" and
/// lower case are read the same).
fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{s:?}: unknown unit (use K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("{s:?} is out of range"))
}

/// `--gpu-va-base`: an address (0x hexadecimal or decimal), or "off" (0).
fn parse_va_base(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim().replace('_', "");
    if t == "off" {
        return Ok(0);
    }
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("{s:?} is not an address"))
}

/// A switch: `on` or `off`.
fn parse_on_off(s: &str) -> std::result::Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: use on or off")),
    }
}

/// The log filter: --log-level, else $RUST_LOG, else info.
fn log_filter(level: Option<String>) -> String {
    level
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".to_string())
}

fn init_logging(filter: &str) {
    // Also bridges the `log` records of the rust-vmm crates.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

impl TryFrom<Args> for Config {
    type Error = Error;

    fn try_from(args: Args) -> Result<Self> {
        if args.socket_count == 0 || args.socket_count > MAX_SOCKETS {
            return Err(Error::BadSocketCount(args.socket_count));
        }
        let log_filter = log_filter(args.log_level);
        EnvFilter::try_new(&log_filter)
            .map_err(|e| Error::BadLogLevel(log_filter.clone(), e.to_string()))?;
        if let Some(n) = args.max_sessions {
            if n == 0 || n > MAX_SESSIONS {
                return Err(Error::BadMaxSessions(n, MAX_SESSIONS));
            }
        }
        let address_space = AddressSpace {
            base: args.gpu_va_base.unwrap_or(DEFAULT_VA_BASE),
            per_device: args.gpu_va_size.unwrap_or(DEFAULT_VA_SIZE),
        }
        .check(1)
        .map_err(Error::BadAddressSpace)?;
        let config = |socket_path, socket_count| Config {
            socket_path,
            socket_count,
            inherited_fds: args.inherited_fds.clone(),
            gpu: args.gpu,
            log_filter: log_filter.clone(),
            poll: Duration::from_micros(args.poll_us),
            handover_wait: Duration::from_millis(args.handover_wait_ms),
            precopy: vhost_cuda::vhu_cuda::PrecopySetup {
                round_bytes: args.precopy_round_mib << 20,
                passes: args.precopy_passes,
            },
            hop_poll: Duration::from_micros(args.hop_poll_us.unwrap_or_else(default_hop_poll_us)),
            hop_mailbox: args.hop_mailbox,
            spare_workers: usize::from(args.spare_workers),
            limits: Limits {
                max_sessions: args.max_sessions,
                max_gpu_memory: args.max_gpu_memory,
            },
            stats_socket: args
                .stats_socket
                .clone()
                .or_else(|| args.socket_path.as_deref().map(stats::default_path)),
            sandbox: args.sandbox,
            worker_seccomp: args.worker_seccomp,
            address_space,
            gpu_trace: GpuTraceSetup {
                mode: args.gpu_trace,
                cupti: args.cupti.clone(),
            },
        };
        let path = match (args.socket_path.clone(), &args.inherited_fds) {
            // Every socket systemd passed; their paths are systemd's business.
            (None, Some(fds)) => {
                let n = u32::try_from(fds.len()).map_err(|_| Error::BadSocketCount(u32::MAX))?;
                return Ok(config(None, n));
            }
            (None, None) => return Err(Error::NoSocketPath),
            (Some(path), _) => path,
        };
        if path.file_name().is_none() {
            return Err(Error::SocketPathNoName(path));
        }
        // The longest path served: PATH itself or PATH.(N-1).
        let suffix = if args.socket_count > 1 {
            format!(".{}", args.socket_count - 1).len()
        } else {
            0
        };
        if path.as_os_str().len() + suffix > MAX_SOCKET_PATH {
            return Err(Error::SocketPathTooLong(path));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(Error::SocketDirNotDir(dir)),
            Err(_) => return Err(Error::SocketDirMissing(dir)),
        }
        Ok(config(Some(path), args.socket_count))
    }
}

/// The hidden worker mode.
fn session_worker_main(args: Args) -> i32 {
    // First, while this process has one thread: a worker born pid 1 of its own PID
    // namespace becomes that namespace's init and forks the worker proper with a pid of its own.
    let split = if args.sandbox == vhost_cuda::sandbox::SandboxMode::Namespace {
        vhost_cuda::sandbox::split_from_pid_one()
    } else {
        Ok(())
    };
    init_logging(&log_filter(args.log_level));
    if let Err(e) = split {
        tracing::warn!(
            "this worker stays pid 1 of its PID namespace ({e}): the driver's interprocess \
             events between this VM's processes may not work"
        );
    }
    let Some(session) = args.session_id else {
        eprintln!("vhost-cuda: --session-worker needs --session-id");
        return 2;
    };
    // The daemon passes its budget in the environment (`main`).
    join_spin_budget(args.spin_budget);
    worker::run(&WorkerConfig {
        session,
        gpu: args.gpu,
        vm: args.vm,
        gpu_memory_slot: args.gpu_memory_slot,
        shm_fd: args.shm_fd,
        outlive_daemon: args.outlive_daemon,
        spare: args.spare,
        // The daemon always passes its value.
        hop_poll: Duration::from_micros(args.hop_poll_us.unwrap_or(0)),
        sandbox: args.sandbox,
        seccomp: args.worker_seccomp,
        sandbox_check: args.sandbox_check,
        gpu_trace: GpuTraceSetup {
            mode: args.gpu_trace,
            cupti: args.cupti,
        },
        // The daemon always passes its values (checked there).
        address_space: AddressSpace {
            base: args.gpu_va_base.unwrap_or(0),
            per_device: args.gpu_va_size.unwrap_or(0),
        },
    })
}

/// `--hop-poll-us` when not given: spinning pays only where cores are to spare.
fn default_hop_poll_us() -> u64 {
    const MIN_CPUS: usize = 8;
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= MIN_CPUS => 50,
        _ => 0,
    }
}

/// `--stats`: the client of a running daemon's stats socket.
fn stats_main(args: &Args) -> i32 {
    let Some(path) = args
        .stats_socket
        .clone()
        .or_else(|| args.socket_path.as_deref().map(stats::default_path))
    else {
        eprintln!("vhost-cuda: --stats needs --socket-path or --stats-socket");
        return 2;
    };
    match stats::query(&path, args.stats_format) {
        Ok(text) if text.starts_with("error:") => {
            eprint!("vhost-cuda: {}: {text}", path.display());
            1
        }
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!(
                "vhost-cuda: cannot ask {} ({e}): is a vhost-cuda daemon serving that socket?",
                path.display()
            );
            1
        }
    }
}

/// `--pause` / `--resume`: the client of the operator's commands on the stats socket.
fn checkpoint_main(args: &Args) -> i32 {
    let (pause, target) = match (&args.pause, &args.resume) {
        (Some(t), _) => (true, t.as_str()),
        (None, Some(t)) => (false, t.as_str()),
        (None, None) => return 2,
    };
    let Some(path) = args
        .stats_socket
        .clone()
        .or_else(|| args.socket_path.as_deref().map(stats::default_path))
    else {
        eprintln!("vhost-cuda: --pause and --resume need --socket-path or --stats-socket");
        return 2;
    };
    match stats::command(&path, pause, target) {
        Ok(text) => {
            print!("{text}");
            i32::from(!text.ends_with("result: ok\n"))
        }
        Err(e) => {
            eprintln!(
                "vhost-cuda: cannot ask {} ({e}): is a vhost-cuda daemon serving that socket?",
                path.display()
            );
            1
        }
    }
}

/// `--spin-budget` when not given: a quarter of the host's CPUs, at least 1.
fn default_spin_budget() -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    u64::try_from(cpus / 4).unwrap_or(1).max(1)
}

/// Joins the host-wide budget of spinning threads (spin_wait.rs); where the shared table
/// cannot be had, the process keeps a budget of its own and says so.
fn join_spin_budget(budget: Option<u64>) {
    let limit = budget.unwrap_or_else(default_spin_budget);
    let limit = usize::try_from(limit).unwrap_or(spin_wait::MAX_SPIN_BUDGET);
    if let Err(e) = spin_wait::join_host_budget(limit) {
        tracing::warn!("spin budget: no host-wide table ({e}); {limit} for this process alone");
    }
}

fn main() {
    // The init of a worker's PID namespace (a worker starts it itself, sandbox/pid_init.rs):
    // `--pid-namespace-init PID` and the worker's own arguments, which it only carries.
    let mut raw = std::env::args_os().skip(1);
    if raw
        .next()
        .is_some_and(|a| a == vhost_cuda::sandbox::PID_INIT_FLAG)
    {
        let worker = raw
            .next()
            .and_then(|p| p.to_str()?.parse().ok())
            .unwrap_or(-1);
        vhost_cuda::sandbox::run_init(worker);
    }
    let mut args = Args::parse();
    if args.print_worker_syscalls {
        for name in vhost_cuda::sandbox::worker_allowed_names() {
            println!("{name}");
        }
        exit(0);
    }
    if args.session_worker {
        exit(session_worker_main(args));
    }
    if args.stats {
        exit(stats_main(&args));
    }
    if args.pause.is_some() || args.resume.is_some() {
        exit(checkpoint_main(&args));
    }
    // Single-threaded still, so the environment may change: the session workers (children)
    // inherit the budget from it.
    let spin_budget = args.spin_budget.unwrap_or_else(default_spin_budget);
    std::env::set_var("VHOST_CUDA_SPIN_BUDGET", spin_budget.to_string());
    let keep_workers = args.keep_workers;
    // The previous daemon's workers first: what is left of LISTEN_FDS is the socket unit's.
    let passed = vhost_cuda::fd_store::take_passed();
    let store = match vhost_cuda::fd_store::FdStore::from_environment() {
        Ok(s) => s.map(std::sync::Arc::new),
        Err(e) => {
            eprintln!("vhost-cuda: NOTIFY_SOCKET: {e}; workers end with the daemon");
            None
        }
    };
    match socket_activation::take_from_environment() {
        Ok(fds) => args.inherited_fds = fds,
        Err(e) => {
            eprintln!("vhost-cuda: {e}");
            exit(2);
        }
    }
    let config = match Config::try_from(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vhost-cuda: {e}");
            exit(2);
        }
    };
    init_logging(&config.log_filter);
    join_spin_budget(Some(spin_budget));
    if !passed.workers.is_empty() {
        tracing::info!(
            "{} worker(s) of the previous daemon in systemd's file-descriptor store",
            passed.workers.len()
        );
    }
    let handover = Handover {
        store,
        keep_workers,
        passed,
    };
    if let Err(e) = start_backend_with(config, handover) {
        eprintln!("vhost-cuda: {e}");
        exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(path: &str) -> Args {
        Args {
            socket_path: Some(path.into()),
            socket_count: 1,
            gpu: None,
            poll_us: 200,
            handover_wait_ms: 300,
            precopy_round_mib: 64,
            precopy_passes: 2,
            hop_poll_us: None,
            hop_mailbox: false,
            spare_workers: 0,
            spare: false,
            keep_workers: true,
            spin_budget: None,
            log_level: Some("info".into()),
            session_worker: false,
            session_id: None,
            vm: String::new(),
            max_gpu_memory: None,
            max_sessions: None,
            gpu_va_base: None,
            gpu_va_size: None,
            gpu_memory_slot: None,
            shm_fd: None,
            outlive_daemon: false,
            inherited_fds: None,
            stats: false,
            pause: None,
            resume: None,
            stats_format: StatsFormat::Table,
            stats_socket: None,
            sandbox: SandboxMode::Namespace,
            worker_seccomp: SeccompMode::Enforce,
            sandbox_check: false,
            print_worker_syscalls: false,
            gpu_trace: GpuTraceMode::Auto,
            cupti: None,
        }
    }

    fn tmp() -> String {
        std::env::temp_dir().display().to_string()
    }

    #[test]
    fn device_address_ranges_are_configurable_and_checked() {
        let path = format!("{}/vm0.sock", tmp());
        let with = |base: Option<&str>, size: Option<&str>| {
            Config::try_from(Args {
                gpu_va_base: base.map(|b| parse_va_base(b).unwrap()),
                gpu_va_size: size.map(|s| parse_bytes(s).unwrap()),
                ..args(&path)
            })
            .map(|c| c.address_space)
        };
        assert_eq!(with(None, None).unwrap(), AddressSpace::default());
        assert_eq!(
            with(Some("0x7000_0000_0000"), Some("64G")).unwrap(),
            AddressSpace {
                base: 0x7000_0000_0000,
                per_device: 64 << 30
            }
        );
        assert_eq!(with(Some("off"), None).unwrap(), AddressSpace::OFF);
        assert_eq!(with(Some("0"), Some("3M")).unwrap(), AddressSpace::OFF);
        assert!(matches!(
            with(Some("0x7000_0000_1000"), None),
            Err(Error::BadAddressSpace(_))
        ));
        assert!(matches!(
            with(None, Some("3M")),
            Err(Error::BadAddressSpace(_))
        ));
        assert!(matches!(
            with(None, Some("64T")),
            Err(Error::BadAddressSpace(_))
        ));
        parse_va_base("0xzz").unwrap_err();
        let a =
            Args::try_parse_from(["vhost-cuda", "--socket-path", "/x", "--gpu-va-base", "0x10"])
                .unwrap();
        assert_eq!(a.gpu_va_base, Some(16));
    }

    #[test]
    fn valid_arguments() {
        let path = format!("{}/vm0.sock", tmp());
        let config = Config::try_from(Args {
            gpu: Some(1),
            ..args(&path)
        })
        .unwrap();
        assert_eq!(
            config,
            Config {
                socket_path: Some(path.clone().into()),
                socket_count: 1,
                inherited_fds: None,
                gpu: Some(1),
                log_filter: "info".into(),
                poll: Duration::from_micros(200),
                handover_wait: Duration::from_millis(300),
                precopy: vhost_cuda::vhu_cuda::PrecopySetup::default(),
                hop_poll: Duration::from_micros(default_hop_poll_us()),
                hop_mailbox: false,
                spare_workers: 0,
                limits: Limits::default(),
                stats_socket: Some(format!("{path}.stats").into()),
                sandbox: SandboxMode::Namespace,
                worker_seccomp: SeccompMode::Enforce,
                address_space: AddressSpace::default(),
                gpu_trace: GpuTraceSetup::default(),
            }
        );
        assert_eq!(config.socket_paths(), vec![PathBuf::from(&path)]);
        // A bare file name lives in the current directory.
        Config::try_from(args("vm0.sock")).unwrap();
    }

    #[test]
    fn socket_count_names_the_sockets() {
        let path = format!("{}/vm.sock", tmp());
        let config = Config::try_from(Args {
            socket_count: 3,
            ..args(&path)
        })
        .unwrap();
        let names: Vec<String> = config
            .socket_paths()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            names,
            ["0", "1", "2"].map(|i| format!("{path}.{i}")).to_vec()
        );
        for n in [0, MAX_SOCKETS + 1] {
            assert!(matches!(
                Config::try_from(Args {
                    socket_count: n,
                    ..args(&path)
                }),
                Err(Error::BadSocketCount(_))
            ));
        }
    }

    #[test]
    fn missing_socket_directory_is_a_clear_error() {
        let err = Config::try_from(args("/nonexistent-qcuda-dir/x/vm0.sock")).unwrap_err();
        assert!(matches!(err, Error::SocketDirMissing(_)));
        assert_eq!(
            err.to_string(),
            "socket directory /nonexistent-qcuda-dir/x does not exist"
        );
        // A file where the directory should be.
        let file = std::env::temp_dir().join(format!("vhost-cuda-notdir-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        let err = Config::try_from(args(&format!("{}/vm0.sock", file.display()))).unwrap_err();
        assert!(matches!(err, Error::SocketDirNotDir(_)));
        std::fs::remove_file(file).unwrap();
    }

    #[test]
    fn bad_paths_and_log_levels() {
        assert!(matches!(
            Config::try_from(args("/")),
            Err(Error::SocketPathNoName(_))
        ));
        let long = format!("{}/{}", tmp(), "s".repeat(120));
        assert!(matches!(
            Config::try_from(args(&long)),
            Err(Error::SocketPathTooLong(_))
        ));
        let path = format!("{}/vm0.sock", tmp());
        assert!(matches!(
            Config::try_from(Args {
                log_level: Some("vhost_cuda=loud".into()),
                ..args(&path)
            }),
            Err(Error::BadLogLevel(..))
        ));
    }

    #[test]
    fn limits_parse_and_are_checked() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("8G"), Ok(8 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("3 kb"), Ok(3 << 10));
        for bad in ["", "G", "0", "1.5G", "12X", "99999999999T", "-1"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        let path = format!("{}/vm0.sock", tmp());
        let a = Args::try_parse_from([
            "vhost-cuda",
            "--socket-path",
            &path,
            "--max-gpu-memory",
            "2G",
            "--max-sessions",
            "8",
        ])
        .unwrap();
        let c = Config::try_from(a).unwrap();
        assert_eq!(
            c.limits,
            Limits {
                max_sessions: Some(8),
                max_gpu_memory: Some(2 << 30)
            }
        );
        for n in [0, MAX_SESSIONS + 1] {
            assert!(matches!(
                Config::try_from(Args {
                    max_sessions: Some(n),
                    ..args(&path)
                }),
                Err(Error::BadMaxSessions(..))
            ));
        }
        Args::try_parse_from([
            "vhost-cuda",
            "--socket-path",
            &path,
            "--max-gpu-memory",
            "lots",
        ])
        .unwrap_err();
        // The worker's slot is hidden and only for workers.
        Args::try_parse_from([
            "vhost-cuda",
            "--socket-path",
            &path,
            "--gpu-memory-slot",
            "1",
        ])
        .unwrap_err();
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        let a = Args::try_parse_from([
            "vhost-cuda",
            "--socket-path",
            "/run/qcuda/vm0.sock",
            "--socket-count",
            "2",
            "--gpu",
            "0",
        ])
        .unwrap();
        assert_eq!(a.socket_count, 2);
        assert_eq!(a.gpu, Some(0));
        // No socket at all: a path or sockets from systemd are needed.
        let none = Args::try_parse_from(["vhost-cuda"]).unwrap();
        assert!(matches!(Config::try_from(none), Err(Error::NoSocketPath)));
    }

    #[test]
    fn sockets_from_systemd_need_no_path() {
        let passed = |path: Option<&str>| {
            Config::try_from(Args {
                socket_path: path.map(PathBuf::from),
                inherited_fds: Some(3..5),
                ..args("unused")
            })
        };
        let c = passed(None).unwrap();
        assert_eq!(
            (
                c.socket_path.as_ref(),
                c.socket_count,
                c.inherited_fds.clone()
            ),
            (None, 2, Some(3..5))
        );
        assert!(
            c.socket_paths().is_empty(),
            "nothing of systemd's to remove"
        );
        // With a path, the passed sockets must be bound there (checked when serving).
        let path = format!("{}/vm0.sock", tmp());
        let c = passed(Some(&path)).unwrap();
        assert_eq!(c.socket_paths(), vec![PathBuf::from(&path)]);
        assert_eq!(c.inherited_fds, Some(3..5));
    }

    #[test]
    fn the_spin_budget_is_bounded_and_defaults_to_a_quarter_of_the_cpus() {
        assert!(default_spin_budget() >= 1);
        let cpus = std::thread::available_parallelism().unwrap().get() as u64;
        assert_eq!(default_spin_budget(), (cpus / 4).max(1));
        let parse = |extra: &[&str]| {
            let mut argv = vec!["vhost-cuda", "--socket-path", "/tmp/vm0.sock"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv)
        };
        let a = parse(&["--spin-budget", "0"]).unwrap();
        assert_eq!(a.spin_budget, Some(0));
        let a = parse(&["--spin-budget", "512"]).unwrap();
        assert_eq!(a.spin_budget, Some(512));
        parse(&["--spin-budget", "513"]).unwrap_err();
        parse(&["--spin-budget", "-1"]).unwrap_err();
    }

    #[test]
    fn hop_polling_is_on_by_default_bounded_and_reaches_the_worker() {
        let path = format!("{}/vm0.sock", tmp());
        let parse = |extra: &[&str]| {
            let mut argv = vec!["vhost-cuda", "--socket-path", &path];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv)
        };
        let c = Config::try_from(parse(&[]).unwrap()).unwrap();
        assert_eq!(c.hop_poll, Duration::from_micros(default_hop_poll_us()));
        // The hop's mailbox is on unless turned off.
        assert!(c.hop_mailbox);
        let mailbox = |extra: &[&str]| Config::try_from(parse(extra).unwrap()).unwrap().hop_mailbox;
        assert!(mailbox(&["--hop-mailbox"]));
        assert!(mailbox(&["--hop-mailbox=on"]));
        assert!(!mailbox(&["--hop-mailbox=off"]));
        assert!(!mailbox(&["--hop-mailbox", "off"]));
        parse(&["--hop-mailbox=maybe"]).unwrap_err();
        let c = Config::try_from(parse(&["--hop-poll-us", "0"]).unwrap()).unwrap();
        assert_eq!(c.hop_poll, Duration::ZERO);
        let c = Config::try_from(parse(&["--hop-poll-us", "100000"]).unwrap()).unwrap();
        assert_eq!(c.hop_poll, Duration::from_millis(100));
        for bad in ["100001", "-1", "lots"] {
            parse(&["--hop-poll-us", bad]).unwrap_err();
        }
        // What the daemon passes its workers (`WorkerCommand`).
        let a = Args::try_parse_from([
            "vhost-cuda",
            "--session-worker",
            "--session-id",
            "7",
            "--hop-poll-us",
            "20",
        ])
        .unwrap();
        assert_eq!(a.hop_poll_us, Some(20));
    }

    #[test]
    fn the_worker_mode_is_hidden_and_complete() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("--socket-path"), "{help}");
        for hidden in ["session-worker", "session-id", "--vm", "gpu-memory-slot"] {
            assert!(!help.contains(hidden), "{hidden} in --help:\n{help}");
        }
        let a = Args::try_parse_from([
            "vhost-cuda",
            "--session-worker",
            "--session-id",
            "7",
            "--vm",
            "/run/qcuda/vm0.sock",
            "--gpu",
            "1",
        ])
        .unwrap();
        assert!(a.session_worker && a.socket_path.is_none());
        assert_eq!(
            (a.session_id, a.gpu, a.vm.as_str()),
            (Some(7), Some(1), "/run/qcuda/vm0.sock")
        );
        // A worker needs its session; it is no daemon.
        Args::try_parse_from(["vhost-cuda", "--session-worker"]).unwrap_err();
        Args::try_parse_from([
            "vhost-cuda",
            "--session-worker",
            "--session-id",
            "1",
            "--socket-path",
            "/tmp/x.sock",
        ])
        .unwrap_err();
    }
}

//! The sandbox of the daemon and of every session's worker process (`--sandbox`).
//!
//! A worker runs the NVIDIA driver on behalf of one guest process: a driver bug that a hostile
//! guest can reach runs code in the worker. So each worker starts in namespaces of its own
//! (`spawn.rs`: mount, PID, network, IPC and UTS; a user namespace when the daemon lacks
//! `CAP_SYS_ADMIN`). Born pid 1 of its PID namespace, it first forks the worker proper with a
//! pid of its own and stays as the namespace's init (`pid_init.rs`: the driver names what it
//! shares between processes by pid). Before it loads the driver it moves into a minimal root
//! that holds only the NVIDIA device nodes, the driver's files and the `/dev/shm` its VM's
//! workers share (`root.rs`, `shared_shm.rs`), and gives up every capability
//! and sets `no_new_privs` (`privileges.rs`); after the driver is initialised and before it
//! reads its first request it installs a seccomp filter that allows the system calls the
//! driver was measured to make (`filters.rs`, `syscalls-measured.txt`); any other call kills
//! the worker. The daemon, once started, gets a
//! filter of its own that refuses to open files (`filters.rs`, [`enter_daemon_filter`]).
//!
//! Neighbours: `worker/handle.rs` starts workers through [`spawn`] with the flags
//! [`SandboxMode::clone_flags`] gives; `worker/child.rs` calls [`confine_worker`] and
//! [`filter_worker`]; `lib.rs` checks at start-up that the host can build the sandbox
//! ([`check_host`]) and refuses to start otherwise.

mod error;
mod filters;
mod pid_init;
mod privileges;
mod root;
mod shared_shm;
mod spawn;
#[cfg(feature = "test-hooks")]
pub mod test_hook;

use std::{fmt, str::FromStr};

pub use error::SandboxError;
pub use filters::{daemon_filter, worker_allowed_names, worker_filters, SeccompMode};
pub use pid_init::{run_init, split_from_pid_one, INIT_FLAG as PID_INIT_FLAG};
pub use shared_shm::SharedShm;
pub use spawn::{
    pidfd_open, run_unfiltered, spawn, start_spawner, ChildProcess, IdMaps, SpawnSpec,
};

/// How workers are confined (`--sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// New mount, PID, network, IPC and UTS namespaces (and a user namespace when the daemon
    /// is unprivileged), the minimal root, no capabilities, `no_new_privs`, the seccomp filter.
    #[default]
    Namespace,
    /// The minimal root in a mount namespace of its own, no capabilities, `no_new_privs` and
    /// the seccomp filter, but the host's PID, network and IPC namespaces: for hosts that
    /// refuse those namespaces. Other processes are visible in its /proc; the filter still
    /// refuses network sockets and signals to other processes.
    Chroot,
    /// Nothing: the worker sees the host as the daemon does. Unsafe with untrusted guests.
    None,
}

impl SandboxMode {
    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Namespace => "namespace",
            Self::Chroot => "chroot",
            Self::None => "none",
        }
    }

    /// The `CLONE_NEW*` flags a worker is started with, and whether one of them is a user
    /// namespace (then the worker maps the daemon's ids to root inside).
    pub fn clone_flags(self) -> (libc::c_int, bool) {
        let own = match self {
            Self::Namespace => {
                libc::CLONE_NEWNS
                    | libc::CLONE_NEWPID
                    | libc::CLONE_NEWNET
                    | libc::CLONE_NEWIPC
                    | libc::CLONE_NEWUTS
            }
            Self::Chroot => libc::CLONE_NEWNS,
            Self::None => return (0, false),
        };
        if privileges::has_sys_admin() {
            (own, false)
        } else {
            (own | libc::CLONE_NEWUSER, true)
        }
    }
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "namespace" => Ok(Self::Namespace),
            "chroot" => Ok(Self::Chroot),
            "none" => Ok(Self::None),
            _ => Err(format!("{s:?}: namespace, chroot or none")),
        }
    }
}

/// Confines the calling worker before it loads the driver, while it has one thread (capabilities
/// are per thread): the minimal root (with `shm`, its VM's shared directory, at `/dev/shm`),
/// then no capabilities and `no_new_privs`. Returns how many paths the root holds.
/// [`SandboxMode::None`] does nothing. The worker must exit if this fails.
pub fn confine_worker(
    mode: SandboxMode,
    shm: Option<std::os::fd::OwnedFd>,
) -> Result<usize, SandboxError> {
    if mode == SandboxMode::None {
        return Ok(0);
    }
    let mut allowance = root::Allowance::of_this_process();
    allowance.shared_shm = shm;
    let bound = root::pivot_into_minimal_root(&allowance)?;
    privileges::drop_all()?;
    Ok(bound)
}

/// Installs the worker's seccomp filters on every thread (the driver's included), after the
/// driver is initialised and before the first request is read; `cupti`: libcupti is loaded
/// (GPU timelines may use it), and the calls it makes are allowed too. [`SandboxMode::None`]
/// does nothing.
pub fn filter_worker(
    mode: SandboxMode,
    seccomp: SeccompMode,
    cupti: bool,
) -> Result<(), SandboxError> {
    if mode == SandboxMode::None {
        return Ok(());
    }
    filters::install_worker_filters(seccomp, cupti)
}

/// Installs the daemon's own filter on the calling thread (and the threads it starts from now
/// on): no file can be opened, no program executed, nothing mounted. Starts the spawner thread
/// first, which must stay unfiltered to start workers.
pub fn enter_daemon_filter() -> Result<(), SandboxError> {
    start_spawner().map_err(|e| SandboxError::Seccomp(format!("spawner thread: {e}")))?;
    let prog = daemon_filter()?;
    seccompiler::apply_filter(&prog).map_err(|e| SandboxError::Seccomp(e.to_string()))
}

/// Starts one worker in `--sandbox-check` mode (it builds its sandbox and exits 0) and says
/// whether it succeeded, with the worker's exit status otherwise.
pub fn check_host(
    program: &std::path::Path,
    mode: SandboxMode,
    seccomp: SeccompMode,
) -> Result<(), SandboxError> {
    let argv = [
        "vhost-cuda",
        "--session-worker",
        "--session-id",
        "0",
        "--vm",
        "sandbox-check",
        "--sandbox",
        mode.as_str(),
        "--worker-seccomp",
        seccomp.as_str(),
        "--sandbox-check",
    ]
    .map(std::ffi::OsString::from);
    let (flags, user) = mode.clone_flags();
    let spec = SpawnSpec::new(program, &argv, &[])
        .map_err(|e| SandboxError::Check(format!("cannot be prepared: {e}")))?
        .with_namespaces(flags, user.then(IdMaps::own_ids_as_root));
    let mut child = spawn(spec).map_err(|e| SandboxError::Check(format!("cannot start: {e}")))?;
    let status = child
        .wait()
        .map_err(|e| SandboxError::Check(format!("cannot be waited for: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(SandboxError::Check(format!("failed ({status})")))
    }
}

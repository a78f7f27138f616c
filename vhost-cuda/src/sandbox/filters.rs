//! The seccomp filters, built with `seccompiler`.
//!
//! **Worker**: an allow-list; any other system call ends the worker process (all its threads,
//! the driver's included): the filter traps it (`SECCOMP_RET_TRAP`, the call is not made), and
//! the worker's SIGSYS handler writes the call's number to stderr (the daemon's log) and ends
//! the process with SIGSYS, so an operator sees which call a driver or library needed rather
//! than only a dead worker. A worker that replaced the handler gains nothing: the call still
//! is not made. The list is what the
//! worker and the NVIDIA driver call (`syscalls-measured.txt` says what was measured and how,
//! and what is not measured yet). Further filters make some allowed calls fail instead of
//! running: `clone3` (`ENOSYS`, so glibc falls back to `clone`, whose flags a filter can see),
//! `clone` of a new process rather than a thread, `kill`/`tgkill` of any process but the
//! worker itself (`EPERM`), `socket` of any family but `AF_UNIX` (`EAFNOSUPPORT`), and the
//! ioctls that push input into a terminal (`TIOCSTI`, `TIOCLINUX`: stderr may be the
//! operator's tty). The kernel applies the strictest answer of all filters.
//!
//! In [`SeccompMode::Log`] (for measuring only) a call outside the list is logged by the kernel
//! (`SECCOMP_RET_LOG`, in the audit log or dmesg) and allowed.
//!
//! **Daemon**: once it has started it has no reason to open a file, execute a program, mount,
//! trace or load anything; those calls fail with `EPERM`. It is a deny-list (everything else is
//! allowed): the daemon's own calls were not measured on every path, and a daemon killed for an
//! unforeseen call would take every VM's sessions with it. Workers are started by the
//! unfiltered spawner thread (`spawn.rs`).

use std::{collections::BTreeMap, fmt, str::FromStr};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::error::SandboxError;

/// What the worker's filter does with a call outside its list (`--worker-seccomp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeccompMode {
    /// Kill the worker.
    #[default]
    Enforce,
    /// Let the kernel log it and allow it: only for measuring which calls a driver makes.
    Log,
}

impl SeccompMode {
    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Log => "log",
        }
    }
}

impl fmt::Display for SeccompMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SeccompMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enforce" => Ok(Self::Enforce),
            "log" => Ok(Self::Log),
            _ => Err(format!("{s:?}: enforce or log")),
        }
    }
}

macro_rules! syscalls {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), libc::$name)),*]
    };
}

/// The worker's allow-list on every architecture (the names of `syscalls-measured.txt`).
const WORKER_CALLS: &[(&str, libc::c_long)] = syscalls![
    // Files: the driver's libraries, device nodes, /proc and /sys.
    SYS_read,
    SYS_write,
    SYS_readv,
    SYS_writev,
    SYS_pread64,
    SYS_pwrite64,
    SYS_lseek,
    SYS_close,
    SYS_close_range,
    SYS_openat,
    SYS_newfstatat,
    SYS_fstat,
    SYS_statx,
    SYS_readlinkat,
    SYS_faccessat,
    SYS_faccessat2,
    SYS_getdents64,
    SYS_getcwd,
    SYS_fstatfs,
    SYS_statfs,
    SYS_fcntl,
    SYS_dup,
    SYS_dup3,
    SYS_pipe2,
    SYS_eventfd2,
    SYS_memfd_create,
    SYS_ftruncate,
    SYS_fallocate,
    // The driver's interprocess events: shm_unlink of its file in /dev/shm, the one writable
    // directory of the root (the VM's shared one, root.rs).
    SYS_unlinkat,
    // Memory: guest RAM, the host-mapping window, the driver's pinned and UVM memory.
    SYS_mmap,
    SYS_munmap,
    SYS_mprotect,
    SYS_mremap,
    SYS_madvise,
    SYS_brk,
    SYS_msync,
    SYS_mincore,
    SYS_mlock,
    SYS_munlock,
    SYS_mlock2,
    SYS_membarrier,
    SYS_get_mempolicy,
    SYS_set_mempolicy,
    SYS_mbind,
    // Signals, threads, time.
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_sigaltstack,
    SYS_rt_sigtimedwait,
    SYS_futex,
    SYS_set_robust_list,
    SYS_get_robust_list,
    SYS_rseq,
    SYS_set_tid_address,
    SYS_clone,
    SYS_clone3,
    SYS_exit,
    SYS_exit_group,
    SYS_gettid,
    SYS_getpid,
    SYS_getppid,
    SYS_getuid,
    SYS_geteuid,
    SYS_getgid,
    SYS_getegid,
    SYS_getresuid,
    SYS_getresgid,
    SYS_sched_getaffinity,
    SYS_sched_setaffinity,
    SYS_sched_yield,
    SYS_sched_getparam,
    SYS_sched_getscheduler,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_getpriority,
    SYS_setpriority,
    SYS_nanosleep,
    SYS_clock_nanosleep,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_gettimeofday,
    SYS_kill,
    SYS_tgkill,
    SYS_restart_syscall,
    // The system.
    SYS_getrandom,
    SYS_uname,
    SYS_sysinfo,
    SYS_prlimit64,
    SYS_getrusage,
    SYS_prctl,
    SYS_ioctl,
    // Waiting, and the Unix sockets of the channel and the host-function link.
    SYS_ppoll,
    SYS_pselect6,
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_pwait,
    SYS_socket,
    SYS_socketpair,
    SYS_connect,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_sendto,
    SYS_recvfrom,
    SYS_shutdown,
    SYS_getsockopt,
    SYS_setsockopt,
    SYS_getsockname,
    SYS_getpeername,
];

/// What libcupti adds to the worker's calls, allowed only in workers that loaded it
/// (`--gpu-trace auto|cupti` where libcupti is found): the `[cupti]` section of
/// `syscalls-measured.txt`. Not measured yet: the file and socket calls libcupti's imports from
/// glibc make that the driver's list lacks (its temporary files and directories, its Unix
/// socket to a profiler), none of which reaches beyond the worker's own root and namespaces.
/// System V shared memory (`shmget`), which libcupti also imports, is not allowed: in
/// `--sandbox=chroot` the worker shares the host's IPC namespace. `scripts/sandbox-gpu-check.sh
/// --trace` measures what CUPTI makes.
const CUPTI_CALLS: &[(&str, libc::c_long)] = syscalls![
    SYS_bind,
    SYS_listen,
    SYS_mkdirat,
    SYS_renameat,
    SYS_renameat2,
    SYS_linkat,
    SYS_symlinkat,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_fsync,
    SYS_fdatasync,
    SYS_truncate,
    SYS_utimensat,
    SYS_fadvise64,
    SYS_sendfile,
];

/// libcupti's calls of the above that x86-64's glibc makes by their older numbers.
#[cfg(target_arch = "x86_64")]
const CUPTI_CALLS_ARCH: &[(&str, libc::c_long)] = syscalls![
    SYS_mkdir,
    SYS_rmdir,
    SYS_rename,
    SYS_link,
    SYS_symlink,
    SYS_chmod,
];
#[cfg(not(target_arch = "x86_64"))]
const CUPTI_CALLS_ARCH: &[(&str, libc::c_long)] = &[];

/// The older calls x86-64's glibc and driver still use.
#[cfg(target_arch = "x86_64")]
const WORKER_CALLS_ARCH: &[(&str, libc::c_long)] = syscalls![
    SYS_open,
    SYS_stat,
    SYS_lstat,
    SYS_access,
    SYS_readlink,
    SYS_unlink,
    SYS_pipe,
    SYS_dup2,
    SYS_poll,
    SYS_select,
    SYS_epoll_wait,
    SYS_getrlimit,
    SYS_arch_prctl,
    SYS_time,
];
#[cfg(not(target_arch = "x86_64"))]
const WORKER_CALLS_ARCH: &[(&str, libc::c_long)] = &[];

/// What the daemon never does once started.
const DAEMON_REFUSED: &[(&str, libc::c_long)] = syscalls![
    SYS_openat,
    SYS_openat2,
    SYS_open_by_handle_at,
    SYS_name_to_handle_at,
    SYS_execve,
    SYS_execveat,
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_chroot,
    SYS_move_mount,
    SYS_open_tree,
    SYS_fsopen,
    SYS_fsmount,
    SYS_unshare,
    SYS_setns,
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_kexec_load,
    SYS_kexec_file_load,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_mknodat,
    SYS_symlinkat,
    SYS_linkat,
    SYS_renameat,
    SYS_renameat2,
    SYS_truncate,
    SYS_fchmodat,
    SYS_fchownat,
    SYS_reboot,
    SYS_swapon,
    SYS_swapoff,
    SYS_acct,
    SYS_setuid,
    SYS_setgid,
    SYS_setreuid,
    SYS_setregid,
    SYS_setresuid,
    SYS_setresgid,
    SYS_setgroups,
    SYS_capset,
];
#[cfg(target_arch = "x86_64")]
const DAEMON_REFUSED_ARCH: &[(&str, libc::c_long)] = syscalls![
    SYS_open,
    SYS_creat,
    SYS_mknod,
    SYS_symlink,
    SYS_link,
    SYS_rename,
    SYS_chmod,
    SYS_chown,
    SYS_lchown,
    SYS_uselib,
];
#[cfg(not(target_arch = "x86_64"))]
const DAEMON_REFUSED_ARCH: &[(&str, libc::c_long)] = &[];

/// `TIOCLINUX` (not in every libc crate's list for every architecture).
const TIOCLINUX: u64 = 0x541C;

fn arch() -> Result<TargetArch, SandboxError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| SandboxError::Seccomp(format!("architecture: {e:?}")))
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
        .map_err(|e| SandboxError::Seccomp(e.to_string()))
}

fn dword(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .map_err(|e| SandboxError::Seccomp(e.to_string()))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SandboxError> {
    SeccompRule::new(conditions).map_err(|e| SandboxError::Seccomp(e.to_string()))
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SandboxError> {
    SeccompFilter::new(rules, mismatch, matched, arch()?)
        .and_then(BpfProgram::try_from)
        .map_err(|e| SandboxError::Seccomp(e.to_string()))
}

/// Every system call name the worker's list allows (for the measurement's comparison), with
/// those of libcupti.
pub fn worker_allowed_names() -> impl Iterator<Item = &'static str> {
    WORKER_CALLS
        .iter()
        .chain(WORKER_CALLS_ARCH)
        .chain(CUPTI_CALLS)
        .chain(CUPTI_CALLS_ARCH)
        .map(|(n, _)| n.trim_start_matches("SYS_"))
}

/// The worker's filters, for a process whose pid (in its own namespace) is `pid`: the
/// allow-list (with libcupti's calls if `cupti`), then one filter per refusal (a filter has one
/// action for all its matches).
pub fn worker_filters(
    mode: SeccompMode,
    pid: u32,
    cupti: bool,
) -> Result<Vec<BpfProgram>, SandboxError> {
    let pid = u64::from(pid);
    let none: &[(&str, libc::c_long)] = &[];
    let (extra, extra_arch) = if cupti {
        (CUPTI_CALLS, CUPTI_CALLS_ARCH)
    } else {
        (none, none)
    };
    let allow: BTreeMap<i64, Vec<SeccompRule>> = WORKER_CALLS
        .iter()
        .chain(WORKER_CALLS_ARCH)
        .chain(extra)
        .chain(extra_arch)
        .map(|&(_, nr)| (nr, Vec::new()))
        .collect();
    let mismatch = match mode {
        SeccompMode::Enforce => SeccompAction::Trap,
        SeccompMode::Log => SeccompAction::Log,
    };
    let allow = compile(allow, mismatch, SeccompAction::Allow)?;

    let af_unix = u64::try_from(libc::AF_UNIX).unwrap_or(0);
    let clone_thread = u64::try_from(libc::CLONE_THREAD).unwrap_or(0);
    let refusals = [
        // No rule: every call matches.
        (libc::SYS_clone3, vec![], libc::ENOSYS),
        // A new process (the driver runs nvidia-modprobe when a device node is missing): it
        // fails, threads start.
        (
            libc::SYS_clone,
            vec![rule(vec![cond(
                0,
                SeccompCmpOp::MaskedEq(clone_thread),
                0,
            )?])?],
            libc::EPERM,
        ),
        // Signals only to itself (pid 1 in its PID namespace; its own pid otherwise).
        (
            libc::SYS_kill,
            vec![rule(vec![dword(0, SeccompCmpOp::Ne, pid)?])?],
            libc::EPERM,
        ),
        (
            libc::SYS_tgkill,
            vec![rule(vec![dword(0, SeccompCmpOp::Ne, pid)?])?],
            libc::EPERM,
        ),
        (
            libc::SYS_socket,
            vec![rule(vec![dword(0, SeccompCmpOp::Ne, af_unix)?])?],
            libc::EAFNOSUPPORT,
        ),
        (
            libc::SYS_ioctl,
            vec![
                rule(vec![dword(1, SeccompCmpOp::Eq, libc::TIOCSTI)?])?,
                rule(vec![dword(1, SeccompCmpOp::Eq, TIOCLINUX)?])?,
            ],
            libc::EPERM,
        ),
    ];
    let mut programs = vec![allow];
    for (nr, rules, errno) in refusals {
        let errno = u32::try_from(errno).unwrap_or(1);
        programs.push(compile(
            BTreeMap::from([(nr, rules)]),
            SeccompAction::Allow,
            SeccompAction::Errno(errno),
        )?);
    }
    Ok(programs)
}

/// The daemon's filter (see the module's documentation).
pub fn daemon_filter() -> Result<BpfProgram, SandboxError> {
    let rules = DAEMON_REFUSED
        .iter()
        .chain(DAEMON_REFUSED_ARCH)
        .map(|&(_, nr)| (nr, Vec::new()))
        .collect();
    let eperm = u32::try_from(libc::EPERM).unwrap_or(1);
    compile(rules, SeccompAction::Allow, SeccompAction::Errno(eperm))
}

/// Writes `n` in decimal into `buf`, returning the digits' length (async-signal-safe).
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> usize {
    let mut digits = [0u8; 20];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[i] = digits[len - 1 - i];
    }
    len
}

/// The message the SIGSYS handler writes for system call `nr`.
fn refused_call_message(nr: u64, out: &mut [u8; 160]) -> usize {
    const HEAD: &[u8] = b"vhost-cuda worker: system call ";
    const TAIL: &[u8] =
        b" is outside the sandbox's allowance (seccomp); the worker ends (SIGSYS)\n";
    let mut digits = [0u8; 20];
    let n = decimal(nr, &mut digits);
    let mut len = 0;
    for part in [HEAD, &digits[..n], TAIL] {
        out[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    len
}

/// The worker's SIGSYS handler: says which call the filter trapped, then lets SIGSYS end the
/// process (default action, raised again: it is delivered as the handler returns).
extern "C" fn report_refused_call(
    _: libc::c_int,
    info: *mut libc::siginfo_t,
    _: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo; for a seccomp trap (si_code SYS_SECCOMP) its
    // union holds `_sigsys { void *call_addr; int syscall; unsigned arch; }` after the three
    // ints and their padding (16 bytes): the call's number is the int at byte 24.
    let nr = unsafe { (info.cast::<u8>().add(24).cast::<libc::c_int>()).read_unaligned() };
    let mut msg = [0u8; 160];
    let len = refused_call_message(u64::try_from(nr).unwrap_or(0), &mut msg);
    // SAFETY: write(2), signal(2) and raise(3) are async-signal-safe; the buffer is ours.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), len);
        libc::signal(libc::SIGSYS, libc::SIG_DFL);
        libc::raise(libc::SIGSYS);
    }
}

/// Installs [`report_refused_call`] for SIGSYS.
fn install_sigsys_reporter() -> Result<(), SandboxError> {
    // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn of the right shape
    // (SA_SIGINFO), and sigaction only sets this process's disposition.
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = report_refused_call as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&raw mut sa.sa_mask);
        libc::sigaction(libc::SIGSYS, &raw const sa, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(SandboxError::Seccomp(format!(
            "SIGSYS handler: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Installs the worker's filters on every thread of the process: the refusals first, the
/// allow-list last (it does not allow `seccomp` itself, so nothing can be installed after it);
/// in [`SeccompMode::Enforce`] the SIGSYS handler that reports a trapped call first.
pub fn install_worker_filters(mode: SeccompMode, cupti: bool) -> Result<(), SandboxError> {
    if mode == SeccompMode::Enforce {
        install_sigsys_reporter()?;
    }
    for prog in worker_filters(mode, std::process::id(), cupti)?
        .iter()
        .rev()
    {
        seccompiler::apply_filter_all_threads(prog)
            .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list in the code and the record of what was measured name the same calls.
    #[test]
    fn the_allow_list_is_the_recorded_one() {
        let record = include_str!("syscalls-measured.txt");
        let mut recorded: Vec<&str> = record
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
            .collect();
        recorded.sort_unstable();
        let mut allowed: Vec<&str> = worker_allowed_names().collect();
        allowed.sort_unstable();
        assert_eq!(recorded, allowed);
    }

    #[test]
    fn a_trapped_call_is_named_by_its_number() {
        let mut out = [0u8; 160];
        let len = refused_call_message(49, &mut out);
        let text = std::str::from_utf8(&out[..len]).unwrap();
        assert!(text.starts_with("vhost-cuda worker: system call 49 is outside"));
        assert!(text.ends_with("(SIGSYS)\n"));
        let len = refused_call_message(0, &mut out);
        assert!(std::str::from_utf8(&out[..len])
            .unwrap()
            .contains("call 0 is"));
        let len = refused_call_message(u64::MAX, &mut out);
        assert!(std::str::from_utf8(&out[..len])
            .unwrap()
            .contains(&u64::MAX.to_string()));
    }

    #[test]
    fn the_filters_compile_in_both_modes() {
        for mode in [SeccompMode::Enforce, SeccompMode::Log] {
            assert_eq!(worker_filters(mode, 1, false).unwrap().len(), 7);
            assert_eq!(worker_filters(mode, 1, true).unwrap().len(), 7);
        }
        assert!(!daemon_filter().unwrap().is_empty());
    }
}

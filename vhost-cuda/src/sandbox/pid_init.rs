//! Distinct pids for the workers of one PID namespace each.
//!
//! A worker started in a PID namespace of its own (`spawn.rs`, `--sandbox=namespace`) is born
//! its pid 1, so every worker would see itself as pid 1. The NVIDIA driver names what it shares
//! between processes by the pid: an interprocess event is the POSIX shared-memory file
//! `/dev/shm/cuda.shm.<uid>.<pid>.<n>` (made by the exporting process with its own pid, opened
//! by an importer with the pid the event's handle carries), and a file of that name is removed
//! before one is made. With one `/dev/shm` for a VM's workers (shared_shm.rs), two workers of
//! pid 1 would remove and open each other's events.
//!
//! So the process born pid 1 splits first thing, while it has one thread: it forks the worker
//! proper with a pid of its own in the namespace, chosen equal to its own pid on the host
//! (unique on the host while it lives; `clone3` with `set_tid`, which the namespace's owner
//! may do), and stays the namespace's init: it execs `vhost-cuda --pid-namespace-init <pid>`
//! with the worker's other arguments (so that nothing takes it for a worker, while `ps` still
//! says whose it is), reaps, and exits with the worker's status, a
//! signal that killed the worker as 128 + its number ([`worker_status`] turns that back into
//! the signal for the daemon). The daemon's child is the init: its SIGKILL ends the namespace,
//! and the worker with it. The daemon finds the worker proper as the init's child (spawn.rs,
//! from /proc on its unfiltered spawner thread) and reports that pid, the one `nvidia-smi`
//! lists. Where the split cannot be made the worker stays pid 1 and says so.

use std::{
    io,
    os::unix::process::{CommandExt, ExitStatusExt},
    process::{Command, ExitStatus},
};

/// The first argument of the init's command line; the second is the worker's pid (`main`
/// looks for it before parsing anything else).
pub const INIT_FLAG: &str = "--pid-namespace-init";

/// `CLOSE_RANGE_CLOEXEC` (Linux 5.11).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// An exit code of the init above which the worker was killed by signal `code - SIGNALLED`.
const SIGNALLED: i32 = 128;

/// `struct clone_args` of clone3(2), up to `set_tid_size` (`CLONE_ARGS_SIZE_VER1`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

/// This process's pid on the host: what `/proc/self` names in the host's /proc, which a new
/// mount namespace still has before the worker builds its root.
fn host_pid() -> io::Result<libc::pid_t> {
    let link = std::fs::read_link("/proc/self")?;
    link.to_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("/proc/self names no pid"))
}

/// In a process that is pid 1 of its PID namespace: forks the worker proper with the process's
/// host pid, returns in it, and turns the calling process into the namespace's init (never
/// returning there). Elsewhere (not pid 1) returns at once. An error: no split was made.
pub fn split_from_pid_one() -> io::Result<()> {
    if std::process::id() != 1 {
        return Ok(());
    }
    let pid = host_pid()?;
    // The worker waits until the init has exec'd (its end of this pipe closes then): the
    // worker's root-building changes the mount namespace they share, under the init's exec.
    let mut gate = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(gate.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let tids = [pid];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tids.as_ptr() as u64,
        set_tid_size: 1,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM and without a stack behaves like fork; this process has
    // one thread, so the child may go on running Rust code. `args` and `tids` outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::from_ref(&args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match rc {
        0 => {
            let mut b = 0u8;
            // SAFETY: close, read of one byte into a local, close: on the pipe made above.
            unsafe {
                libc::close(gate[1]);
                while libc::read(gate[0], (&raw mut b).cast(), 1) < 0
                    && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
                {
                }
                libc::close(gate[0]);
            }
            Ok(())
        }
        child if child > 0 => {
            let child = libc::pid_t::try_from(child).unwrap_or(pid);
            // The worker's descriptors are the worker's (the daemon must see its channel close
            // when the worker ends): every one closes on the exec, the gate's end with them.
            // SAFETY: close of the gate's read end; close_range only changes descriptor flags.
            unsafe {
                libc::close(gate[0]);
                libc::syscall(
                    libc::SYS_close_range,
                    3u32,
                    libc::c_uint::MAX,
                    CLOSE_RANGE_CLOEXEC,
                );
            }
            // The init gives up its privileges before the exec, not after it in `run_init`:
            // the worker goes on once the exec is under way (the gate above), and from then on
            // nothing may find a privileged process in the namespace. With no_new_privs set,
            // the exec grants none back.
            if let Err(e) = super::privileges::drop_all() {
                eprintln!("vhost-cuda: the worker's PID namespace init keeps its privileges: {e}");
            }
            // The worker's arguments stay (which VM and session), but not `--session-worker`:
            // nothing that looks for workers takes the init for one.
            let rest = std::env::args_os()
                .skip(1)
                .filter(|a| a.as_os_str() != "--session-worker");
            let e = Command::new("/proc/self/exe")
                .arg0("vhost-cuda")
                .arg(INIT_FLAG)
                .arg(child.to_string())
                .args(rest)
                .exec();
            eprintln!(
                "vhost-cuda: the worker's PID namespace init cannot exec itself ({e}); it stays as it is"
            );
            // SAFETY: close_range only closes descriptors (the gate's: the worker goes on).
            unsafe { libc::syscall(libc::SYS_close_range, 3u32, libc::c_uint::MAX, 0u32) };
            run_init(child)
        }
        _ => {
            let e = io::Error::last_os_error();
            // SAFETY: close of the pipe made above.
            unsafe {
                libc::close(gate[0]);
                libc::close(gate[1]);
            }
            Err(e)
        }
    }
}

/// The namespace's init: reaps every child and exits with `worker`'s status when it ends. It
/// needs no privilege for that: it gives up every capability first and sets `no_new_privs`.
pub fn run_init(worker: libc::pid_t) -> ! {
    if let Err(e) = super::privileges::drop_all() {
        eprintln!("vhost-cuda: the worker's PID namespace init keeps its privileges: {e}");
    }
    loop {
        let mut status = 0;
        // SAFETY: waitpid for any child, writing one int we own.
        let rc = unsafe { libc::waitpid(-1, &raw mut status, 0) };
        if rc == worker
            || (rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
        {
            let code = if rc < 0 {
                1
            } else if libc::WIFSIGNALED(status) {
                SIGNALLED + libc::WTERMSIG(status)
            } else {
                libc::WEXITSTATUS(status)
            };
            // SAFETY: _exit ends this process at once.
            unsafe { libc::_exit(code) }
        }
    }
}

/// The worker's status from its init's: the signal that killed the worker where the init says
/// so, else the init's own status (its code, or the SIGKILL that ended the namespace).
pub fn worker_status(init: ExitStatus) -> ExitStatus {
    match init.code() {
        Some(c) if c > SIGNALLED && c < SIGNALLED + 65 => ExitStatus::from_raw(c - SIGNALLED),
        _ => init,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_status_stands_for_the_worker() {
        // exit(code) is code << 8 in a wait status; a signal is its number.
        let exited = |c: i32| ExitStatus::from_raw(c << 8);
        assert_eq!(worker_status(exited(0)).code(), Some(0));
        assert_eq!(worker_status(exited(2)).code(), Some(2));
        assert_eq!(
            worker_status(exited(SIGNALLED + libc::SIGSYS)).signal(),
            Some(libc::SIGSYS)
        );
        let killed = ExitStatus::from_raw(libc::SIGKILL);
        assert_eq!(worker_status(killed).signal(), Some(libc::SIGKILL));
    }
}

//! The workers' sandbox (`--sandbox`, `src/sandbox/`), through the real worker binary with no
//! GPU needed: a test-only message (`ToWorker::SandboxTestHook`, compiled only with the
//! `test-hooks` feature these tests turn on) makes a sandboxed worker try what a worker taken
//! over through a driver bug would: open a host file, reach the network, see or signal other
//! processes, use a capability, make a system call outside its list. Each attempt fails, or the
//! filter kills that worker alone; the same attempts succeed without a sandbox, which shows
//! the tests can see an escape. The workers of one VM share a `/dev/shm` (the driver's
//! interprocess events), and no worker reaches another VM's.

mod common;

use std::{
    fs,
    net::TcpListener,
    os::unix::process::ExitStatusExt,
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::Duration,
};

use common::{rig::worker_binary, scratch_dir};
use qcuda_proto::ResponseHeader;
use vhost_cuda::{
    sandbox::{test_hook::Attempt, SandboxMode, SeccompMode, SharedShm},
    worker::{message::ToWorker, Waited, WorkerError, WorkerProcess},
};

/// The VMs' shared directories of these tests, as the daemon keeps them on /dev/shm.
fn shared_shm() -> Arc<SharedShm> {
    static SHM: OnceLock<Arc<SharedShm>> = OnceLock::new();
    SHM.get_or_init(|| SharedShm::create(&scratch_dir("sandbox-shm")).unwrap())
        .clone()
}

fn worker(mode: SandboxMode, session: u64) -> WorkerProcess {
    worker_of(mode, session, "sandbox-test")
}

/// A worker of VM `vm`.
fn worker_of(mode: SandboxMode, session: u64, vm: &str) -> WorkerProcess {
    let cmd = worker_binary("warn")
        .with_sandbox(mode, SeccompMode::Enforce)
        .with_shared_shm(Some(shared_shm()));
    WorkerProcess::spawn(&cmd, session, vm).unwrap()
}

fn attempt(w: &mut WorkerProcess, a: &Attempt) -> Result<ResponseHeader, WorkerError> {
    w.send_message(&ToWorker::SandboxTestHook(a.encode()), &[])?;
    loop {
        if let Waited::Done(r) = w.wait(None)? {
            return Ok(r);
        }
    }
}

#[test]
fn a_sandboxed_worker_cannot_open_host_files() {
    let dir = scratch_dir("sandbox-files");
    let secret = dir.join("host-secret");
    fs::write(&secret, b"not for guests").unwrap();
    let open = |mode, session| {
        let mut w = worker(mode, session);
        let r = [&secret, std::path::Path::new("/etc/passwd")].map(|p| {
            attempt(&mut w, &Attempt::OpenFile(p.to_path_buf()))
                .unwrap()
                .rets[0]
        });
        w.close(Duration::from_secs(2));
        r
    };
    let enoent = u64::try_from(libc::ENOENT).unwrap();
    assert_eq!(open(SandboxMode::Namespace, 1), [enoent, enoent]);
    assert_eq!(open(SandboxMode::Chroot, 2), [enoent, enoent]);
    // The same attempt without a sandbox opens both: the test sees an escape.
    assert_eq!(open(SandboxMode::None, 3), [0, 0]);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_sandboxed_worker_cannot_reach_the_network() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let net = |mode, session| {
        let mut w = worker(mode, session);
        let r = attempt(&mut w, &Attempt::Network(port)).unwrap().rets;
        w.close(Duration::from_secs(2));
        r
    };
    let eafnosupport = u64::try_from(libc::EAFNOSUPPORT).unwrap();
    let r = net(SandboxMode::Namespace, 11);
    // The filter refuses the socket; behind it, the network namespace has only a loopback
    // interface of its own.
    assert_eq!((r[0], r[1], r[2]), (eafnosupport, u64::MAX, 1), "{r:?}");
    let r = net(SandboxMode::Chroot, 12);
    assert_eq!((r[0], r[1]), (eafnosupport, u64::MAX), "{r:?}");
    let r = net(SandboxMode::None, 13);
    assert_eq!(
        (r[0], r[1]),
        (0, 0),
        "unsandboxed, the connect works: {r:?}"
    );
    drop(listener);
}

#[test]
fn a_sandboxed_worker_sees_no_other_process_and_holds_no_privilege() {
    let mut a = worker(SandboxMode::Namespace, 21);
    let mut b = worker(SandboxMode::Namespace, 22);
    let mut pids = Vec::new();
    for w in [&mut a, &mut b] {
        let r = attempt(w, &Attempt::Survey).unwrap().rets;
        // Only itself and its namespace's init in its /proc, with a pid that is not 1 (the
        // init's); no capability, no_new_privs, a seccomp filter.
        assert_eq!(r[0], 2, "processes: {r:?}");
        assert_ne!(r[4], 1, "own pid: {r:?}");
        assert_eq!(r[5], 1, "pid 1 is the namespace's init: {r:?}");
        assert_eq!(
            (r[1], r[2], r[3]),
            (0, 1, 2),
            "CapEff, NoNewPrivs, Seccomp: {r:?}"
        );
        pids.push(r[4]);
    }
    for w in [&a, &b] {
        // The daemon's child is the init; the worker proper is its child, with the init's
        // host pid as its pid in the namespace, and is what the daemon reports.
        let (init, gpu) = (w.pid(), w.gpu_pid());
        assert_ne!(init, gpu);
        let status = fs::read_to_string(format!("/proc/{gpu}/status")).unwrap();
        assert!(status.contains(&format!("\nPPid:\t{init}\n")), "{status}");
        assert!(
            status.contains(&format!("\nNSpid:\t{gpu}\t{init}\n")),
            "{status}"
        );
        let cmd = fs::read(format!("/proc/{gpu}/cmdline")).unwrap();
        assert!(cmd.split(|&c| c == 0).any(|a| a == b"--session-worker"));
        let cmd = fs::read(format!("/proc/{init}/cmdline")).unwrap();
        assert!(!cmd.split(|&c| c == 0).any(|a| a == b"--session-worker"));
        // The init holds no privilege either.
        let status = fs::read_to_string(format!("/proc/{init}/status")).unwrap();
        assert!(status.contains("\nCapEff:\t0000000000000000\n"), "{status}");
        assert!(status.contains("\nNoNewPrivs:\t1\n"), "{status}");
    }
    // Distinct pids, as the driver's shared-memory names need them.
    assert_ne!(pids[0], pids[1]);
    // chroot mode shares the host's PID namespace (documented): others are visible, but
    // the privileges are gone all the same.
    let mut c = worker(SandboxMode::Chroot, 23);
    let r = attempt(&mut c, &Attempt::Survey).unwrap().rets;
    assert!(r[0] > 1, "{r:?}");
    assert_eq!((r[1], r[2], r[3]), (0, 1, 2), "{r:?}");
    for w in [a, b, c] {
        assert_eq!(w.close(Duration::from_secs(2)).code(), Some(0));
    }
}

#[test]
fn a_forbidden_system_call_kills_that_worker_alone() {
    let mut victim = worker(SandboxMode::Namespace, 31);
    let mut neighbour = worker(SandboxMode::Namespace, 32);
    let e = attempt(&mut victim, &Attempt::ForbiddenSyscall).unwrap_err();
    assert!(
        matches!(e, WorkerError::Closed | WorkerError::Channel(_)),
        "{e}"
    );
    // SECCOMP_RET_TRAP: the worker's handler names the call on stderr and the worker dies of
    // SIGSYS. The daemon logs it, and its session
    // thread answers the guest LAUNCH_FAILURE + sticky for a dead worker (session_workers.rs,
    // a_killed_worker_fails_the_session_until_device_reset).
    let st = victim.close(Duration::from_secs(2));
    assert_eq!(st.signal(), Some(libc::SIGSYS), "{st:?}");
    // The neighbour keeps serving.
    let r = attempt(&mut neighbour, &Attempt::Survey).unwrap().rets;
    assert_eq!(r[1], 0);
    assert_eq!(neighbour.close(Duration::from_secs(2)).code(), Some(0));
    // Without a filter the same call just fails (the worker is not traced by anyone else).
    let mut open = worker(SandboxMode::None, 33);
    attempt(&mut open, &Attempt::ForbiddenSyscall).unwrap();
    assert_eq!(open.close(Duration::from_secs(2)).code(), Some(0));
}

#[test]
fn the_workers_of_one_vm_share_a_shm_directory_and_no_other_vm_reaches_it() {
    let file = |name: &str| PathBuf::from("/dev/shm").join(name);
    let mut a = worker_of(SandboxMode::Namespace, 41, "vm-a");
    let mut b = worker_of(SandboxMode::Namespace, 42, "vm-a");
    let mut other = worker_of(SandboxMode::Namespace, 43, "vm-b");
    let mut chroot = worker_of(SandboxMode::Chroot, 44, "vm-a");
    // The driver's steps for an interprocess event: remove a file of the name, create it,
    // size it, map it shared; an importer of the same VM opens and maps it.
    let made = attempt(&mut a, &Attempt::ShmCreate(file("cuda.shm.0.2a.1"), 0x5eed))
        .unwrap()
        .rets;
    assert_eq!(made[0], 0, "create: {made:?}");
    for w in [&mut b, &mut chroot] {
        let r = attempt(w, &Attempt::ShmOpen(file("cuda.shm.0.2a.1")))
            .unwrap()
            .rets;
        assert_eq!((r[0], r[1]), (0, 0x5eed), "the same VM's worker: {r:?}");
    }
    // Another VM's worker finds nothing there, nor above its own directory.
    let enoent = u64::try_from(libc::ENOENT).unwrap();
    let r = attempt(&mut other, &Attempt::ShmOpen(file("cuda.shm.0.2a.1")))
        .unwrap()
        .rets;
    assert_eq!(r[0], enoent, "another VM's worker: {r:?}");
    let above = PathBuf::from("/dev/shm/..")
        .join(SharedShm::vm_dir_name("vm-a").to_str().unwrap())
        .join("cuda.shm.0.2a.1");
    let r = attempt(&mut other, &Attempt::ShmOpen(above)).unwrap().rets;
    assert_eq!(r[0], enoent, "through ..: {r:?}");
    // It has a directory of its own, which the first VM's workers do not see.
    let r = attempt(&mut other, &Attempt::ShmCreate(file("cuda.shm.0.2a.2"), 7))
        .unwrap()
        .rets;
    assert_eq!(r[0], 0, "{r:?}");
    let r = attempt(&mut b, &Attempt::ShmOpen(file("cuda.shm.0.2a.2")))
        .unwrap()
        .rets;
    assert_eq!(r[0], enoent, "{r:?}");
    // On the host: one directory per VM, private to the daemon's user; nothing else is
    // writable in a worker's root.
    let shm = shared_shm();
    assert!(shm.vm_dir("vm-a").join("cuda.shm.0.2a.1").exists());
    assert!(shm.vm_dir("vm-b").join("cuda.shm.0.2a.2").exists());
    let r = attempt(&mut a, &Attempt::ShmCreate(PathBuf::from("/tmp-file"), 1))
        .unwrap()
        .rets;
    assert_ne!(r[0], 0, "outside /dev/shm: {r:?}");
    for w in [a, b, other, chroot] {
        assert_eq!(w.close(Duration::from_secs(2)).code(), Some(0));
    }
    // A VM that goes takes its directory with it.
    shm.clear_vm("vm-b");
    assert!(common::eventually(|| !shm.vm_dir("vm-b").exists()));
}

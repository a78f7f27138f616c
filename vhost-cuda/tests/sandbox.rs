//! The workers' sandbox (`--sandbox`, `src/sandbox/`), through the real worker binary with no
//! GPU needed: a test-only message (`ToWorker::SandboxTestHook`, compiled only with the
//! `test-hooks` feature these tests turn on) makes a sandboxed worker try what a worker taken
//! over through a driver bug would: open a host file, reach the network, see or signal other
//! processes, use a capability, make a system call outside its list. Each attempt fails, or the
//! filter kills that worker alone; the same attempts succeed without a sandbox, which shows
//! the tests can see an escape.

mod common;

use std::{fs, net::TcpListener, os::unix::process::ExitStatusExt, time::Duration};

use common::{rig::worker_binary, scratch_dir};
use qcuda_proto::ResponseHeader;
use vhost_cuda::{
    sandbox::{test_hook::Attempt, SandboxMode, SeccompMode},
    worker::{message::ToWorker, Waited, WorkerError, WorkerProcess},
};

fn worker(mode: SandboxMode, session: u64) -> WorkerProcess {
    let cmd = worker_binary("warn").with_sandbox(mode, SeccompMode::Enforce);
    WorkerProcess::spawn(&cmd, session, "sandbox-test").unwrap()
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
    for w in [&mut a, &mut b] {
        let r = attempt(w, &Attempt::Survey).unwrap().rets;
        // Only itself in its /proc, as pid 1 of its own PID namespace; no capability,
        // no_new_privs, a seccomp filter.
        assert_eq!((r[0], r[4]), (1, 1), "processes, own pid: {r:?}");
        assert_eq!(
            (r[1], r[2], r[3]),
            (0, 1, 2),
            "CapEff, NoNewPrivs, Seccomp: {r:?}"
        );
    }
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
    // SECCOMP_RET_KILL_PROCESS: the worker dies of SIGSYS. The daemon logs it, and its session
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

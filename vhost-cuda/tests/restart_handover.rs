//! A daemon restart under running sessions: the workers of one session table are kept in a
//! file-descriptor store (a stand-in for systemd's, on a datagram socket of the test), and a
//! second table, as the next daemon would, takes them over from what the store hands back; and
//! the same with daemon processes: one killed with SIGKILL, the next started with the stored
//! descriptors beside a socket unit's listening socket, as systemd starts it.

mod common;

use std::{
    collections::HashMap,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::{
            net::{UnixDatagram, UnixListener},
            process::CommandExt,
        },
    },
    path::Path,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use common::{
    rig::{guest_ram, process_state, worker_binary, Rig},
    scratch_dir, Daemon, GuestVm,
};
use qcuda_proto::{status, Op, RequestHeader, ResponseHeader, RESP_FLAG_STICKY};
use vhost_cuda::{
    cuda::CudaHost,
    fd_store::{self, FdStore},
    session::SessionTable,
    worker::KeepWorkers,
};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// systemd's side of the store: what the daemon stored, by name, minus what it removed.
struct StoreStandIn {
    sock: UnixDatagram,
    kept: Vec<(String, OwnedFd)>,
    removed: Vec<String>,
}

impl StoreStandIn {
    fn take_messages(&mut self) {
        self.sock.set_nonblocking(true).unwrap();
        loop {
            let mut buf = [0u8; 512];
            let mut fds = [0; 8];
            let mut iov = [libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            }];
            // SAFETY: the iovec points at `buf`, which outlives the call and may take any bytes.
            let Ok((n, nfds)) = (unsafe { self.sock.recv_with_fds(&mut iov, &mut fds) }) else {
                return;
            };
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let fields: HashMap<&str, &str> =
                text.lines().filter_map(|l| l.split_once('=')).collect();
            // SAFETY: the descriptors just received are ours.
            let fds = fds[..nfds]
                .iter()
                .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) });
            let name = fields.get("FDNAME").copied().unwrap_or("").to_string();
            if fields.get("FDSTOREREMOVE") == Some(&"1") {
                self.kept.retain(|(n, _)| *n != name);
                self.removed.push(name.clone());
            }
            if fields.get("FDSTORE") == Some(&"1") {
                self.kept.extend(fds.map(|f| (name.clone(), f)));
            }
        }
    }

    /// What a restarted daemon gets: copies of everything kept.
    fn pass(&self) -> Vec<(String, OwnedFd)> {
        self.kept
            .iter()
            .map(|(n, f)| (n.clone(), f.try_clone().unwrap()))
            .collect()
    }
}

fn gpu_op(host: &CudaHost, r: ResponseHeader) {
    if host.gpu_count() > 0 {
        assert_eq!(r.status, status::SUCCESS, "{r:?}");
    } else {
        assert_ne!(r.status, status::SUCCESS, "{r:?}");
        assert_eq!(r.flags, 0, "no sticky error: {r:?}");
    }
}

#[test]
fn a_new_session_table_takes_over_the_workers_of_the_last_and_keeps_their_ids() {
    let dir = scratch_dir("handover");
    let path = dir.join("notify.sock");
    let mut standin = StoreStandIn {
        sock: UnixDatagram::bind(&path).unwrap(),
        kept: Vec::new(),
        removed: Vec::new(),
    };
    let store = Arc::new(FdStore::connect(&path).unwrap());
    let command = worker_binary("warn")
        .with_hop_mailbox(true)
        .with_keep(Some(KeepWorkers::new(store.clone(), 0)));

    // The first daemon: two sessions with a worker each, one without.
    let mut old = Rig::new(command.clone(), "handover-old");
    let host = old.host.clone();
    gpu_op(&host, old.op(31, Op::Malloc, &[64]));
    gpu_op(&host, old.op(32, Op::MemGetInfo, &[]));
    assert_eq!(old.op(33, Op::Hello, &[1]).status, status::SUCCESS);
    let pids = [
        old.table.worker_pid(31).unwrap(),
        old.table.worker_pid(32).unwrap(),
    ];
    standin.take_messages();
    let names: Vec<&str> = standin.kept.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"qcuda-q.0"), "{names:?}");
    for (session, pid) in [31, 32].iter().zip(pids) {
        let n = names
            .iter()
            .filter(|n| n.starts_with(&format!("qcuda-w.0.{session}.{pid}.")))
            .count();
        assert_eq!(n, 2, "channel and pidfd of session {session}: {names:?}");
    }
    // The daemon dies: nothing of its sessions is closed (its table is never dropped).
    std::mem::forget(old);

    // The next daemon gets the store back and takes the workers over.
    let passed = fd_store::sort(standin.pass());
    let (mut passed, quota) = {
        let mut p = passed;
        let q = p.quotas.remove(&0);
        (p, q)
    };
    let table = SessionTable::with_quota_file(host.clone(), command, "handover-new", quota);
    table.adopt(passed.take_workers(0));
    let mut new = Rig::with_table(host.clone(), table, guest_ram());
    // The same sessions are served by the same workers, and nothing failed.
    gpu_op(&host, new.op(31, Op::MemGetInfo, &[]));
    gpu_op(&host, new.op(32, Op::MemGetInfo, &[]));
    assert_eq!(new.table.worker_pid(31), Some(pids[0]));
    assert_eq!(new.table.worker_pid(32), Some(pids[1]));
    // A guest process that ended meanwhile: its close reaps the worker it never saw start.
    assert_eq!(new.op(32, Op::SessionClose, &[]).status, status::SUCCESS);
    let gone = |pid: u32| process_state(pid).is_none_or(|s| s == 'Z');
    let t = Instant::now();
    while !gone(pids[1]) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "worker {} still runs",
            pids[1]
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    standin.take_messages();
    assert!(
        standin
            .removed
            .iter()
            .any(|n| n.starts_with(&format!("qcuda-w.0.32.{}.", pids[1]))),
        "{:?}",
        standin.removed
    );
    // The other goes on, and ends with the VM.
    gpu_op(&host, new.op(31, Op::MemGetInfo, &[]));
    assert_eq!(new.table.close_all(Duration::from_secs(10)), 0);
    let t = Instant::now();
    while !gone(pids[0]) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "worker {} still runs",
            pids[0]
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The daemon as systemd starts it with `NOTIFY_SOCKET` and `passed` (a socket unit's listener
/// first, named `vm0.socket`, then the store's entries) at 3, 4, ...
fn under_systemd(notify: &Path, log: &Path, args: &[&str], passed: &[(String, RawFd)]) -> Command {
    let mut cmd_sh = Command::new("/bin/sh");
    cmd_sh
        .arg("-c")
        .arg(r#"LISTEN_PID=$$ exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_vhost-cuda"))
        .args(args)
        .env("NOTIFY_SOCKET", notify)
        .env("LISTEN_FDS", passed.len().to_string())
        .env(
            "LISTEN_FDNAMES",
            passed
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(":"),
        )
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    let fds: Vec<RawFd> = passed.iter().map(|(_, fd)| *fd).collect();
    // SAFETY: the closure only calls dup2 and fcntl (async-signal-safe) on descriptors that
    // stay open in the parent until the child has started; copies go high first, so no dup2
    // clobbers a descriptor still to be placed.
    unsafe {
        cmd_sh.pre_exec(move || {
            for (i, fd) in (0..).zip(&fds) {
                if libc::dup2(*fd, 200 + i) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, _) in (0..).zip(&fds) {
                if libc::dup2(200 + i, 3 + i) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(200 + i);
            }
            Ok(())
        });
    }
    cmd_sh
}

#[test]
fn a_killed_daemons_successor_takes_its_sessions_over_beside_a_socket_units_socket() {
    let dir = scratch_dir("restart-process");
    let notify = dir.join("notify.sock");
    let mut standin = StoreStandIn {
        sock: UnixDatagram::bind(&notify).unwrap(),
        kept: Vec::new(),
        removed: Vec::new(),
    };
    let socket = dir.join("vm0.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let listener_entry = ("vm0.socket".to_string(), listener.as_raw_fd());
    let args = [
        "--socket-path",
        socket.to_str().unwrap(),
        "--sandbox",
        "none",
    ];

    let log = dir.join("daemon-1.log");
    let daemon = Daemon::spawn(
        under_systemd(&notify, &log, &args, std::slice::from_ref(&listener_entry)),
        log,
    );
    let mut vm = GuestVm::connect(&socket);
    let mut h = RequestHeader::new(Op::MemGetInfo);
    h.session = 7;
    let first = vm.call(&h, &[], 0).resp;
    assert_eq!(first.flags & RESP_FLAG_STICKY, 0, "{first:?}");
    assert!(daemon.wait_log("worker process", 1), "{}", daemon.log());
    standin.take_messages();
    assert!(
        standin
            .kept
            .iter()
            .any(|(n, _)| n.starts_with("qcuda-w.0.7.")),
        "{:?}\n{}",
        standin.kept.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        daemon.log()
    );
    // The crash.
    daemon.signal(libc::SIGKILL);
    drop(daemon);
    drop(vm);

    // systemd starts the next daemon with the socket and everything stored.
    let stored = standin.pass();
    let mut passed = vec![listener_entry];
    passed.extend(stored.iter().map(|(n, f)| (n.clone(), f.as_raw_fd())));
    let log = dir.join("daemon-2.log");
    let daemon = Daemon::spawn(under_systemd(&notify, &log, &args, &passed), log);
    drop(stored);
    assert!(
        daemon.wait_log("taken over after a daemon restart", 1),
        "{}",
        daemon.log()
    );
    assert!(
        daemon
            .log()
            .contains(&format!("socket {} from systemd (fd 3)", socket.display())),
        "{}",
        daemon.log()
    );
    // The guest process's next call reaches its old worker: the same answer, not a lost
    // worker's sticky error.
    let mut vm = GuestVm::connect(&socket);
    let again = vm.call(&h, &[], 0).resp;
    // The operator's view has the session, with its old worker.
    let out = Command::new(env!("CARGO_BIN_EXE_vhost-cuda"))
        .args(["--stats", "--stats-format", "json", "--socket-path"])
        .arg(&socket)
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&out.stdout);
    let worker = json_worker_pid(&json, 7);
    assert!(
        worker.is_some()
            && daemon
                .log()
                .contains(&format!("worker process {} taken over", worker.unwrap())),
        "{json}\n{}",
        daemon.log()
    );
    assert_eq!(
        (again.status, again.flags),
        (first.status, first.flags),
        "{}",
        daemon.log()
    );
    assert!(
        !daemon.log().contains("worker process") || !daemon.log().contains("started (sandbox"),
        "a new worker was started:\n{}",
        daemon.log()
    );
    // `systemctl restart`: SIGTERM ends the daemon at once (status 0) and leaves the session to
    // the next one.
    daemon.signal(libc::SIGTERM);
    let mut daemon = daemon;
    assert!(daemon.wait_exit().success(), "{}", daemon.log());
    drop(vm);
    standin.take_messages();
    let stored = standin.pass();
    let mut passed = vec![("vm0.socket".to_string(), listener.as_raw_fd())];
    passed.extend(stored.iter().map(|(n, f)| (n.clone(), f.as_raw_fd())));
    let log = dir.join("daemon-3.log");
    let daemon = Daemon::spawn(under_systemd(&notify, &log, &args, &passed), log);
    drop(stored);
    assert!(
        daemon.wait_log("taken over after a daemon restart", 1),
        "{}",
        daemon.log()
    );
    let mut vm = GuestVm::connect(&socket);
    let third = vm.call(&h, &[], 0).resp;
    assert_eq!(
        (third.status, third.flags),
        (first.status, first.flags),
        "{}",
        daemon.log()
    );
    // Its end ends the worker and its entries in the store.
    assert_eq!(vm.close_session(7).status, status::SUCCESS);
    standin.take_messages();
    assert!(
        standin
            .removed
            .iter()
            .any(|n| n.starts_with("qcuda-w.0.7.")),
        "{:?}",
        standin.removed
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The worker pid of session `session` in `vhost-cuda --stats --stats-format json`'s output.
fn json_worker_pid(json: &str, session: u64) -> Option<u64> {
    let at = json.find(&format!("\"session\":{session},"))?;
    let rest = &json[at..];
    let w = rest.find("\"worker_pid\":")? + "\"worker_pid\":".len();
    rest[w..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

//! What each VM uses, through the real daemon: two VMs (`--socket-count 2`), each with its
//! own sessions; `Op::VmUsage` shows each guest only its own VM's sessions, `vhost-cuda --stats`
//! shows the operator both in every format, and each session's open and close is one log line
//! with its guest pid and totals. No GPU needed (the sessions hold no device memory here; the
//! fake-driver and GPU tests count memory and kernels).

mod common;

use std::process::Command;

use common::{scratch_dir, Daemon, GuestVm};
use qcuda_proto::{
    status, Direction, Op, RequestHeader, SessionUsage, SESSION_USAGE_SIZE, USAGE_CALLER, VERSION,
};

fn hello(vm: &mut GuestVm, session: u64, pid: u32) {
    let mut h = RequestHeader::new(Op::Hello);
    h.session = session;
    h.pid = pid;
    h.args[0] = u64::from(VERSION);
    assert_eq!(vm.call(&h, &[], 0).resp.status, status::SUCCESS);
}

/// `Op::VmUsage` from `session`: the response and the records.
fn vm_usage(vm: &mut GuestVm, session: u64) -> (qcuda_proto::ResponseHeader, Vec<SessionUsage>) {
    let mut h = RequestHeader::new(Op::VmUsage);
    h.session = session;
    let len = 8 * SESSION_USAGE_SIZE;
    h.push_buffer(Direction::Out, len as u64).unwrap();
    let r = vm.call(&h, &[], len);
    let n = usize::try_from(r.resp.rets[0]).unwrap();
    let records = r
        .out
        .chunks(SESSION_USAGE_SIZE)
        .take(n)
        .map(|c| SessionUsage::decode(c).unwrap())
        .collect();
    (r.resp, records)
}

fn stats(socket: &std::path::Path, format: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_vhost-cuda"))
        .args(["--stats", "--stats-format", format, "--socket-path"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn each_vm_sees_its_own_sessions_and_the_operator_sees_all() {
    let dir = scratch_dir("stats");
    let socket = dir.join("vm.sock");
    let mut daemon = Daemon::start(
        &dir,
        &[
            "--socket-path",
            socket.to_str().unwrap(),
            "--socket-count",
            "2",
            "--max-gpu-memory",
            "1G",
        ],
    );
    let (s0, s1) = (dir.join("vm.sock.0"), dir.join("vm.sock.1"));
    let mut vm0 = GuestVm::connect(&s0);
    let mut vm1 = GuestVm::connect(&s1);
    hello(&mut vm0, 11, 500);
    hello(&mut vm0, 12, 501);
    hello(&mut vm1, 21, 700);
    assert!(daemon.wait_log("session 12 opened; sessions open: 2; guest pid 501", 1));

    // Each guest sees its own VM's sessions only, its own flagged.
    let (r, mine) = vm_usage(&mut vm0, 12);
    assert_eq!(r.status, status::SUCCESS);
    let ids: Vec<_> = mine.iter().map(|u| (u.session, u.pid, u.flags)).collect();
    assert_eq!(ids, [(11, 500, 0), (12, 501, USAGE_CALLER)]);
    assert_eq!(&r.rets[1..5], &[2, 0, 1 << 30, 1024]);
    let (_, theirs) = vm_usage(&mut vm1, 21);
    let ids: Vec<_> = theirs.iter().map(|u| (u.session, u.pid)).collect();
    assert_eq!(ids, [(21, 700)]);

    // The operator sees both, in each format.
    let table = stats(&dir.join("vm.sock"), "table");
    let vm0_line = format!("VM {}: 2 session(s) open", s0.display());
    let vm1_line = format!("VM {}: 1 session(s) open", s1.display());
    assert!(table.contains(&vm0_line), "{table}");
    assert!(table.contains(&vm1_line), "{table}");
    assert!(table.contains("GPU memory 0 B of 1.0 GiB"), "{table}");
    let row = |id: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("no session {id} in\n{table}"))
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string()
    };
    assert_eq!(
        (row("11"), row("12"), row("21")),
        ("500".into(), "501".into(), "700".into())
    );
    let json = stats(&dir.join("vm.sock"), "json");
    let v: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
    let s21 = &v["vms"][1]["sessions"][0];
    assert_eq!(
        (&s21["session"], &s21["guest_pid"], &s21["worker_pid"]),
        (&21.into(), &700.into(), &0.into()),
        "{json}"
    );
    assert_eq!(
        v["vms"][0]["gpu_memory_limit_bytes"], 1_073_741_824_u64,
        "{json}"
    );
    let prom = stats(&dir.join("vm.sock"), "prometheus");
    let sessions = format!("qcuda_vm_sessions{{vm=\"{}\"}} 2", s0.display());
    assert!(prom.lines().any(|l| l == sessions), "{prom}");

    // A session's close is one line with its totals.
    assert_eq!(vm0.close_session(11).status, status::SUCCESS);
    assert!(
        daemon.wait_log(
            "session 11 closed (SessionClose); sessions open: 1; guest pid 500, open ",
            1
        ),
        "{}",
        daemon.log()
    );
    assert!(daemon.log().contains(
        "kernels 0, graph launches 0, GPU memory peak 0 B, held at close 0 B; VM GPU memory \
         held: 0 B"
    ));
    let (r, mine) = vm_usage(&mut vm0, 12);
    assert_eq!((r.rets[1], mine.len(), r.rets[6]), (1, 1, 2));

    // A VM that goes away shows as not connected.
    drop(vm1);
    assert!(common::eventually(|| stats(&dir.join("vm.sock"), "table")
        .contains(&format!("VM {}: not connected", s1.display()))));
    drop(vm0);
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success(), "{}", daemon.log());
    assert!(
        !dir.join("vm.sock.stats").exists(),
        "stats socket left behind"
    );
    // Nobody to ask: a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_vhost-cuda"))
        .args(["--stats", "--socket-path"])
        .arg(dir.join("vm.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a vhost-cuda daemon serving"));
}

fn operator(socket: &std::path::Path, verb: &str, target: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vhost-cuda"))
        .args([verb, target, "--socket-path"])
        .arg(socket)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_operator_pauses_and_resumes_a_guest_process_and_no_other_user_may() {
    let dir = scratch_dir("stats-pause");
    let socket = dir.join("vm.sock");
    let daemon = Daemon::start(&dir, &["--socket-path", socket.to_str().unwrap()]);
    let mut vm = GuestVm::connect(&socket);
    hello(&mut vm, 31, 900);
    assert!(daemon.wait_log("session 31 opened", 1));

    let (ok, text) = operator(&socket, "--pause", "31");
    assert!(ok, "{text}");
    assert!(
        text.contains("session 31: paused") && text.ends_with("result: ok\n"),
        "{text}"
    );
    // Twice is an error, as is a session that does not exist.
    let (ok, text) = operator(&socket, "--pause", "all");
    assert!(
        !ok && text.contains("not paused: cudaErrorIllegalState"),
        "{text}"
    );
    let (ok, text) = operator(&socket, "--pause", "999");
    assert!(!ok && text.contains("no such session"), "{text}");
    let (ok, text) = operator(&socket, "--resume", "31");
    assert!(ok && text.contains("session 31: resumed"), "{text}");
    // The program goes on.
    hello(&mut vm, 31, 900);

    // Only root or the daemon's user: another user is refused by the socket's mode, and, where
    // the mode lets it in (here made world-writable on purpose), by its credentials.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: not root (another user cannot be played)");
        return;
    }
    let stats = dir.join("vm.sock.stats");
    let nobody = |verb: &str| {
        use std::os::unix::process::CommandExt;
        Command::new(env!("CARGO_BIN_EXE_vhost-cuda"))
            .args([verb, "all", "--stats-socket"])
            .arg(&stats)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let out = nobody("--pause");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot ask"));
    std::fs::set_permissions(&stats, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out = nobody("--pause");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && text.contains("error: only root or user 0"),
        "{text}"
    );
    assert!(daemon.wait_log("pause/resume refused to user 65534", 1));
    // Nothing was paused: the guest is answered at once.
    hello(&mut vm, 31, 900);
}

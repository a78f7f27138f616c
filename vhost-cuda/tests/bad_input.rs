//! The daemon binary facing bad input and rough lifecycles: a missing socket directory, a
//! socket path already served, stale and foreign files at the path, frontends that die
//! mid-handshake, signals while idle and while connected, and several sockets in one process.

mod common;

use std::{
    io::Write,
    os::unix::net::{UnixListener, UnixStream},
    process::Command,
};

use common::{eventually, scratch_dir, Daemon, GuestVm};
use qcuda_proto::status;
use vhost::VhostBackend;

fn run_to_exit(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let log = dir.join("oneshot.log");
    let st = Daemon::command(&log, args).status().unwrap();
    (st.code(), std::fs::read_to_string(&log).unwrap())
}

#[test]
fn missing_socket_directory_is_a_clear_error() {
    let dir = scratch_dir("nodir");
    let sock = dir.join("no/such/dir/vm0.sock");
    let (code, err) = run_to_exit(&dir, &["--socket-path", sock.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "socket directory {} does not exist",
            dir.join("no/such/dir").display()
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_exit_non_zero() {
    let dir = scratch_dir("badargs");
    let sock = dir.join("vm.sock");
    let sock = sock.to_str().unwrap();
    for args in [
        vec!["--socket-path", sock, "--socket-count", "0"],
        vec!["--socket-path", sock, "--log-level", "vhost_cuda=loud"],
        vec!["--socket-count", "1"],
    ] {
        let (code, err) = run_to_exit(&dir, &args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn socket_in_use_is_refused_and_the_first_daemon_keeps_serving() {
    let dir = scratch_dir("inuse");
    let socket = dir.join("vm0.sock");
    let args = ["--socket-path", socket.to_str().unwrap()];
    let mut first = Daemon::start(&dir, &args);

    let (code, err) = run_to_exit(&dir, &args);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is in use"), "{err}");

    assert!(first.is_running());
    assert!(
        socket.exists(),
        "the second daemon must not remove the first one's socket"
    );
    let mut vm = GuestVm::connect(&socket);
    assert_eq!(vm.hello(1).status, status::SUCCESS);
    drop(vm);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stale_socket_is_replaced_but_other_files_are_not() {
    let dir = scratch_dir("stale");
    let socket = dir.join("vm0.sock");
    drop(UnixListener::bind(&socket).unwrap()); // a socket file nobody listens on
    let d = Daemon::start(&dir, &["--socket-path", socket.to_str().unwrap()]);
    assert!(d.log().contains("replacing stale socket"), "{}", d.log());
    let mut vm = GuestVm::connect(&socket);
    assert_eq!(vm.hello(1).status, status::SUCCESS);
    drop(vm);
    drop(d);

    let file = dir.join("precious");
    std::fs::write(&file, b"data").unwrap();
    let (code, err) = run_to_exit(&dir, &["--socket-path", file.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"data");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn frontends_dying_mid_handshake_do_not_stop_the_daemon() {
    let dir = scratch_dir("midhandshake");
    let socket = dir.join("vm0.sock");
    let d = Daemon::start(&dir, &["--socket-path", socket.to_str().unwrap()]);

    // Connects and goes away without a word.
    drop(UnixStream::connect(&socket).unwrap());
    assert!(d.wait_log("waiting for a frontend", 2), "{}", d.log());

    // Dies in the middle of a message header.
    let mut s = UnixStream::connect(&socket).unwrap();
    s.write_all(&[1, 0, 0, 0, 1]).unwrap();
    drop(s);
    assert!(d.wait_log("waiting for a frontend", 3), "{}", d.log());

    // Dies after a few messages, with memory mapped and rings half set up.
    let f = GuestVm::connect_only(&socket);
    f.set_owner().unwrap();
    f.get_features().unwrap();
    drop(f);
    assert!(d.wait_log("waiting for a frontend", 4), "{}", d.log());

    // Dies with a session open and a request still queued.
    let mut vm = GuestVm::connect(&socket);
    assert_eq!(vm.hello(3).status, status::SUCCESS);
    vm.submit(
        &{
            let mut h = qcuda_proto::RequestHeader::new(qcuda_proto::Op::Hello);
            h.session = 4;
            h
        },
        &[],
        0,
    );
    drop(vm);
    assert!(d.wait_log("waiting for a frontend", 5), "{}", d.log());
    assert!(d.wait_log("sessions open: 0", 1), "{}", d.log());

    let log = d.log();
    assert!(
        log.matches("frontend disconnected").count() >= 4,
        "every disconnect is logged:\n{log}"
    );
    let mut vm = GuestVm::connect(&socket);
    assert_eq!(vm.hello(1).status, status::SUCCESS);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigint_and_sigterm_stop_cleanly_idle_or_connected() {
    let dir = scratch_dir("signals");
    let socket = dir.join("vm0.sock");
    let args = ["--socket-path", socket.to_str().unwrap()];

    let mut idle = Daemon::start(&dir, &args);
    idle.signal(libc::SIGINT);
    assert!(idle.wait_exit().success(), "{}", idle.log());
    assert!(!socket.exists());

    let mut busy = Daemon::start(&dir, &args);
    let mut vm = GuestVm::connect(&socket);
    assert_eq!(vm.hello(9).status, status::SUCCESS);
    busy.signal(libc::SIGTERM);
    assert!(busy.wait_exit().success(), "{}", busy.log());
    assert!(!socket.exists());
    let log = busy.log();
    assert!(log.contains("SIGTERM received, shutting down"), "{log}");
    assert!(log.contains("sessions open: 0"), "{log}");
    drop(vm);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn socket_count_serves_several_vms_from_one_process() {
    let dir = scratch_dir("count");
    let base = dir.join("vm.sock");
    let mut d = Daemon::start(
        &dir,
        &[
            "--socket-path",
            base.to_str().unwrap(),
            "--socket-count",
            "3",
        ],
    );
    assert!(d.wait_log("waiting for a frontend", 3));
    let paths: Vec<_> = (0..3).map(|i| dir.join(format!("vm.sock.{i}"))).collect();
    let mut vms: Vec<GuestVm> = paths.iter().map(|p| GuestVm::connect(p)).collect();
    // The same session id on different VMs: separate sessions.
    for vm in &mut vms {
        assert_eq!(vm.hello(1).status, status::SUCCESS);
    }
    assert!(d.wait_log("sessions open: 1", 3));
    drop(vms.remove(1));
    assert!(d.wait_log("waiting for a frontend", 4));
    for vm in &mut vms {
        assert_eq!(vm.echo(1, b"still here").out, b"still here");
    }
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit().success(), "{}", d.log());
    assert!(eventually(|| paths.iter().all(|p| !p.exists())));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn version_and_help_work() {
    let out = Command::new(env!("CARGO_BIN_EXE_vhost-cuda"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in ["--socket-path", "--socket-count", "--gpu", "--log-level"] {
        assert!(help.contains(opt), "{help}");
    }
}

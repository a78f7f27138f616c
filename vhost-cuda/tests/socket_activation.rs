//! The daemon under systemd: a listening socket passed the way a socket unit passes it (fd 3,
//! `LISTEN_FDS`, `LISTEN_PID`) is served, and left in place at exit; a `--socket-path` that
//! does not match the passed socket is refused; per-VM settings come from the environment an
//! instance's `EnvironmentFile=` sets.

mod common;

use std::{
    fs::File,
    os::{
        fd::{AsRawFd, RawFd},
        unix::{
            fs::{FileTypeExt, MetadataExt},
            net::UnixListener,
            process::CommandExt,
        },
    },
    path::Path,
    process::{Command, Stdio},
};

use common::{scratch_dir, Daemon, GuestVm};
use qcuda_proto::{status, Op, RequestHeader};

/// The daemon started as systemd starts it: `listener` at fd 3 and the variables naming it,
/// `LISTEN_PID` being the daemon's own pid (a shell sets it to its pid, then execs).
fn activated(listener: &UnixListener, log: &Path, args: &[&str]) -> Command {
    let fd: RawFd = listener.as_raw_fd();
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#"LISTEN_PID=$$ exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_vhost-cuda"))
        .args(args)
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "vm0")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(log).unwrap());
    // SAFETY: the closure only calls dup2 and fcntl, which are async-signal-safe, on the
    // listener's fd, which stays open in the parent until the child has started.
    unsafe {
        cmd.pre_exec(move || {
            let rc = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn a_socket_passed_by_systemd_is_served_and_left_in_place() {
    let dir = scratch_dir("activation");
    let socket = dir.join("vm0.sock");
    let listener = UnixListener::bind(&socket).unwrap();

    let log = dir.join("daemon.log");
    let mut daemon = Daemon::spawn(activated(&listener, &log, &[]), log);
    assert!(
        daemon
            .log()
            .contains(&format!("socket {} from systemd (fd 3)", socket.display())),
        "{}",
        daemon.log()
    );
    let mut vm = GuestVm::connect(&socket);
    let hello = vm.hello(1);
    assert_eq!(hello.status, status::SUCCESS, "{}", daemon.log());
    // A GPU op starts the session's worker, a child of the daemon: it must not hold the
    // listening socket (which would keep the socket alive past a daemon's exit).
    let mut h = RequestHeader::new(Op::MemGetInfo);
    h.session = 1;
    let r = vm.call(&h, &[], 0).resp;
    assert_ne!(r.status, status::LAUNCH_FAILURE, "{r:?}");
    let log = daemon.log();
    let worker: u32 = log
        .lines()
        .find_map(|l| {
            l.split("session 1: worker process ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no worker started:\n{log}"));
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", listener.as_raw_fd()))
        .unwrap()
        .ino();
    let held: Vec<String> = std::fs::read_dir(format!("/proc/{worker}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.display().to_string())
        .collect();
    assert!(
        !held.contains(&format!("socket:[{inode}]")),
        "the worker holds the listening socket: {held:?}"
    );
    drop(vm);

    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success(), "{}", daemon.log());
    let kept = std::fs::symlink_metadata(&socket).expect("the socket file is systemd's");
    assert!(kept.file_type().is_socket());

    // The same socket again (systemd keeps it open across restarts), now with the path
    // named: it matches, and QEMU's connection made while no daemon ran is served.
    let early = std::thread::spawn({
        let socket = socket.clone();
        move || GuestVm::connect(&socket).hello(5).status
    });
    let log = dir.join("daemon-2.log");
    let mut daemon = Daemon::spawn(
        activated(
            &listener,
            &log,
            &["--socket-path", socket.to_str().unwrap()],
        ),
        log,
    );
    assert_eq!(early.join().unwrap(), status::SUCCESS, "{}", daemon.log());
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success(), "{}", daemon.log());
    assert!(socket.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_passed_socket_that_is_not_the_named_path_is_refused() {
    let dir = scratch_dir("activation-mismatch");
    let listener = UnixListener::bind(dir.join("vm0.sock")).unwrap();
    let log = dir.join("daemon.log");
    let other = dir.join("vm1.sock");
    let out = activated(&listener, &log, &["--socket-path", other.to_str().unwrap()])
        .status()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(out.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "no socket bound to {} was passed",
            other.display()
        )),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn settings_come_from_the_environment_and_are_checked() {
    let dir = scratch_dir("activation-env");
    let socket = dir.join("vm0.sock");
    let log = dir.join("daemon.log");
    let out = Daemon::command(&log, &["--socket-path", socket.to_str().unwrap()])
        .env("VHOST_CUDA_MAX_SESSIONS", "0")
        .status()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(out.code(), Some(2), "{text}");
    assert!(text.contains("--max-sessions must be between 1"), "{text}");

    // A limit from the environment applies: one session, the second is refused.
    let daemon = Daemon::spawn(
        {
            let mut cmd = Daemon::command(&log, &["--socket-path", socket.to_str().unwrap()]);
            cmd.env("VHOST_CUDA_MAX_SESSIONS", "1");
            cmd
        },
        log.clone(),
    );
    let mut vm = GuestVm::connect(&socket);
    assert_eq!(vm.hello(1).status, status::SUCCESS, "{}", daemon.log());
    assert_eq!(vm.hello(2).status, status::DEVICES_UNAVAILABLE);
    drop(vm);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

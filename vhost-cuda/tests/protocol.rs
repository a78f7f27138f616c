//! Plays QEMU against the real daemon binary: a vhost-user frontend over memfd guest memory
//! with a hand-laid split vring, requests through the ring (one in a worker process,
//! which maps the guest RAM vhost-user handed the daemon), a `DriverReset`, then a disconnect and
//! a second connection served by the same process on the same socket.

mod common;

use common::{eventually, scratch_dir, Daemon, GuestVm};
use qcuda_proto::{status, Checksum, Op, RequestHeader, VERSION};

fn header(session: u64, op: Op, arg0: u64) -> RequestHeader {
    let mut h = RequestHeader::new(op);
    h.session = session;
    h.args[0] = arg0;
    h
}

/// The pid in the log's "session N: worker process PID started".
fn worker_pid(log: &str, session: u64) -> Option<u32> {
    let key = format!("session {session}: worker process ");
    log.lines()
        .filter(|l| l.contains(" started"))
        .find_map(|l| l.split(&key).nth(1)?.split(' ').next()?.parse().ok())
}

#[test]
fn frontend_handshake_requests_and_reconnect() {
    let dir = scratch_dir("protocol");
    let socket = dir.join("vm0.sock");
    let mut daemon = Daemon::start(
        &dir,
        &[
            "--socket-path",
            socket.to_str().unwrap(),
            "--log-level",
            "info,vhost_cuda::worker::child=debug",
        ],
    );

    let mut vm = GuestVm::connect(&socket);
    let hello = vm.hello(1);
    assert_eq!(hello.status, status::SUCCESS);
    assert_eq!(hello.rets[0], u64::from(VERSION));
    assert_eq!(hello.rets[3], 1, "sessions open, the caller's included");
    assert!(
        vm.was_signalled(),
        "the first completion must raise the call eventfd"
    );

    // An echo bigger than one copy chunk, across a descriptor boundary.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "test data: a byte of a multiplicative hash, truncation intended"
    )]
    let data: Vec<u8> = (0..600_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let r = vm.echo(2, &data);
    assert_eq!(r.resp.status, status::SUCCESS);
    assert_eq!(r.resp.rets[0], Checksum::of(&data));
    assert!(r.out == data, "echoed bytes differ");
    assert_eq!(r.used_len as usize, data.len() + 64);

    // A malformed chain (a HostInfo without its out-buffer) is answered, not dropped.
    let bad = vm.call(&RequestHeader::new(Op::HostInfo), &[], 0);
    assert_eq!(bad.resp.status, status::INVALID_VALUE);
    // A chain with no room for a response completes with used length 0.
    let (head, _) = (vm.submit_raw(&[(0x20_0000, 224, false)]), 0);
    assert_eq!(vm.wait_used(1), vec![(u32::from(head), 0)]);

    assert_eq!(vm.close_session(2).status, status::SUCCESS);
    assert!(daemon.wait_log("session 2 closed (SessionClose); sessions open: 1", 1));

    // A new guest driver instance binds (the guest rebooted, or the device was rebound): the
    // sessions of the previous one, which never closed their files, are closed and counted.
    assert_eq!(vm.hello(3).rets[3], 2);
    let reset = vm.call(&header(0, Op::DriverReset, 0), &[], 0).resp;
    assert_eq!((reset.status, reset.rets[0]), (status::SUCCESS, 2));
    assert!(
        daemon.wait_log(
            "driver reset: closed 2 stale session(s); sessions open: 0",
            1
        ),
        "{}",
        daemon.log()
    );
    assert!(daemon.wait_log("session 3 closed (guest driver reset)", 1));
    assert_eq!(vm.hello(1).rets[3], 1, "only the new instance's session");

    // The VM goes away: its sessions close, the daemon waits for the next one.
    drop(vm);
    assert!(
        daemon.wait_log("frontend disconnected", 1),
        "{}",
        daemon.log()
    );
    assert!(
        daemon.wait_log(
            "session 1 closed (VM disconnected or reset); sessions open: 0",
            1
        ),
        "{}",
        daemon.log()
    );
    assert!(daemon.wait_log("waiting for a frontend", 2));
    assert!(socket.exists(), "the socket must survive a disconnect");

    let mut vm = GuestVm::connect(&socket);
    let hello = vm.hello(7);
    assert_eq!(hello.status, status::SUCCESS);
    assert_eq!(hello.rets[3], 1, "the first VM's sessions are gone");
    assert_eq!(vm.echo(7, b"again").out, b"again");

    // A GPU op runs in the session's worker process (without a driver: cudaErrorNoDevice).
    let malloc = vm.call(&header(7, Op::Malloc, 64), &[], 0).resp;
    let gpus = daemon.log().contains("GPU 0:");
    assert!(
        (gpus && malloc.status == status::SUCCESS) || (!gpus && malloc.status != status::SUCCESS),
        "{malloc:?}"
    );
    let log = daemon.log();
    let pid = worker_pid(&log, 7).unwrap_or_else(|| panic!("no worker started:\n{log}"));
    // The worker mapped the guest RAM that QEMU (here: this test) gave the daemon, and logs
    // with its session on every line.
    assert!(
        daemon.wait_log(
            &format!(
                "worker{{vm={} session=7}}: vhost_cuda::worker::child: guest RAM mapped: 1 \
                 region(s), 16 MiB",
                socket.display()
            ),
            1
        ),
        "{}",
        daemon.log()
    );
    // The VM goes away with the worker running: it is ended and reaped with the session.
    drop(vm);
    assert!(daemon.wait_log("frontend disconnected", 2));
    assert!(
        daemon.wait_log(
            &format!("session 7: worker process {pid} exited (exit status: 0)"),
            1
        ),
        "{}",
        daemon.log()
    );
    assert!(daemon.wait_log(
        "session 7 closed (VM disconnected or reset); sessions open: 0",
        1
    ));
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "worker {pid} not reaped"
    );

    let log = daemon.log();
    for needle in [
        "acked features 0x170000000 (VERSION_1 | RING_INDIRECT_DESC | RING_EVENT_IDX | \
         PROTOCOL_FEATURES); offered 0x174000000",
        "SET_MEM_TABLE: 1 region(s), 16 MiB of guest RAM",
        "SET_MEM_TABLE: region 0: GPA 0x0..0x1000000 (16777216 bytes)",
        "vring 0 started: size 256, desc 0x0, avail 0x1000, used 0x2000, event_idx true",
        "vring 1 started",
        "session 1 opened; sessions open: 1",
    ] {
        assert!(log.contains(needle), "log lacks {needle:?}:\n{log}");
    }

    daemon.signal(libc::SIGTERM);
    let st = daemon.wait_exit();
    assert!(st.success(), "exit status {st:?}:\n{}", daemon.log());
    assert!(eventually(|| !socket.exists()), "socket file left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

//! A migration's dirty log through the real code path (the daemon binary, its session table
//! and real worker processes, played to by a frontend over its socket as QEMU does), with or
//! without a GPU: what the device writes while QEMU logs is marked; at the last stop (the
//! request ring stopped while logging) the daemon quiesces every worker and marks only the
//! guest pages its GPU can write behind the daemon's map, not all of guest RAM, unless a
//! worker ended while QEMU logged, which takes that knowledge with it.

mod common;

use common::{scratch_dir, Daemon, GuestVm};
use qcuda_proto::{status, Op, RequestHeader, RESPONSE_HEADER_SIZE};
use vhost_cuda::frontend::DirtyLog;

const PAGE: usize = 4096;

/// A daemon and a guest whose sessions 1 and 2 each have a worker process.
fn vm_with_workers(name: &str) -> (Daemon, GuestVm) {
    let dir = scratch_dir(name);
    let socket = dir.join("vm.sock");
    let daemon = Daemon::start(&dir, &["--socket-path", socket.to_str().unwrap()]);
    let mut vm = GuestVm::connect(&socket);
    for session in [1, 2] {
        assert_eq!(vm.hello(session).status, status::SUCCESS);
        // A GPU op starts the session's worker (without a GPU it answers an error).
        let mut h = RequestHeader::new(Op::MemGetInfo);
        h.session = session;
        let r = vm.call(&h, &[], 0).resp;
        assert_ne!(r.status, status::LAUNCH_FAILURE, "{r:?}");
    }
    let started = daemon.log().matches("worker process ").count();
    assert!(started >= 2, "{}", daemon.log());
    (daemon, vm)
}

/// Stops the request ring as QEMU does at a migration's last stop, waits for the daemon to have
/// quiesced the sessions, and takes the pages marked since the last take.
fn last_stop(daemon: &Daemon, vm: &GuestVm, log: &DirtyLog) -> Vec<u64> {
    vm.stop_queue(0).unwrap();
    assert!(
        daemon.wait_log("sessions quiesced at the last stop", 1),
        "{}",
        daemon.log()
    );
    log.take().unwrap()
}

#[test]
fn the_last_stop_marks_what_the_gpu_can_write_not_all_of_guest_ram() {
    let (daemon, mut vm) = vm_with_workers("dirty-log-stop");
    let log = vm.start_dirty_log().unwrap();
    assert!(daemon.wait_log("dirty logging on", 1), "{}", daemon.log());
    log.take().unwrap();

    // Written while QEMU logs: a reply's output pages and its response are marked.
    let data = vec![0x5a; 3 * PAGE];
    let r = vm.echo(1, &data);
    assert_eq!((r.resp.status, r.out), (status::SUCCESS, data.clone()));
    let dirty = log.take().unwrap();
    let out_len = data.len() + RESPONSE_HEADER_SIZE;
    let pages_written = dirty.len();
    assert!(
        out_len.div_ceil(PAGE) <= pages_written && pages_written < 16,
        "{dirty:?}"
    );

    // The last stop: every worker quiesces (its record saved), and what the GPU can write
    // behind the daemon's map is marked: here nothing (no GPU memory is mapped), not all of
    // guest RAM.
    let dirty = last_stop(&daemon, &vm, &log);
    assert!(
        dirty.len() < 16,
        "{} of {} pages marked at the last stop",
        dirty.len(),
        log.pages()
    );
    assert!(daemon.log().contains("marked=0"), "{}", daemon.log());
}

#[test]
fn a_worker_that_ends_while_qemu_logs_makes_the_last_stop_mark_all_of_guest_ram() {
    let (daemon, mut vm) = vm_with_workers("dirty-log-ended");
    let log = vm.start_dirty_log().unwrap();
    assert!(daemon.wait_log("dirty logging on", 1), "{}", daemon.log());
    // Session 2's guest process ends: its worker is reaped while QEMU logs.
    assert_eq!(vm.close_session(2).status, status::SUCCESS);
    assert!(daemon.wait_log("session 2 closed", 1), "{}", daemon.log());
    log.take().unwrap();
    let dirty = last_stop(&daemon, &vm, &log);
    assert_eq!(
        dirty.len() as u64,
        log.pages(),
        "all of guest RAM is marked"
    );
    assert!(
        daemon.log().contains("a worker ended while QEMU logged"),
        "{}",
        daemon.log()
    );
}

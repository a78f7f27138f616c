//! Per-VM limits through the real code path (session table, real worker binary), with or
//! without a GPU: `--max-sessions` refuses a further guest process's first call with
//! cudaErrorDevicesUnavailable and starts nothing for it; `--max-gpu-memory` hands each worker
//! a slot of the VM's quota (fd 4, `--gpu-memory-slot`), and with a GPU the workers' device
//! allocations together stay within it (cudaErrorMemoryAllocation past it) and come back when
//! freed or when the session ends; and the daemon binary applies both flags. The fake-driver
//! unit tests cover the arithmetic.

mod common;

use common::{
    rig::{children_with, cmdline, worker_binary, Rig},
    scratch_dir, Daemon, GuestVm,
};
use qcuda_proto::{status, Op, RequestHeader};
use vhost_cuda::limits::Limits;

/// The flags go all the way from the command line to the VM's session table: a daemon started
/// with `--max-sessions 1 --max-gpu-memory 1M`, played to by a frontend over its socket.
#[test]
fn the_daemon_applies_its_limit_flags() {
    let dir = scratch_dir("limits");
    let socket = dir.join("vm0.sock");
    let mut daemon = Daemon::start(
        &dir,
        &[
            "--socket-path",
            socket.to_str().unwrap(),
            "--max-sessions",
            "1",
            "--max-gpu-memory",
            "1M",
        ],
    );
    let mut vm = GuestVm::connect(&socket);
    assert_eq!(vm.hello(1).status, status::SUCCESS);
    assert_eq!(vm.hello(2).status, status::DEVICES_UNAVAILABLE);
    // The admitted session's GPU op starts its worker with a slot of the VM's quota.
    let mut h = RequestHeader::new(Op::MemGetInfo);
    h.session = 1;
    let r = vm.call(&h, &[], 0).resp;
    assert_ne!(r.status, status::LAUNCH_FAILURE, "{r:?}");
    let key = "session 1: worker process ";
    let log = daemon.log();
    let pid: u32 = log
        .lines()
        .find_map(|l| l.split(key).nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no worker started:\n{log}"));
    assert!(
        cmdline(pid).contains("--gpu-memory-slot 0"),
        "{}",
        cmdline(pid)
    );
    assert_eq!(vm.close_session(1).status, status::SUCCESS);
    // The daemon reports what the VM's workers hold, from the quota file, not per process.
    assert!(
        daemon.wait_log("held at close 0 B; VM GPU memory held: 0 B", 1),
        "{}",
        daemon.log()
    );
    assert_eq!(vm.hello(2).status, status::SUCCESS);
    assert_eq!(vm.close_session(2).status, status::SUCCESS);
    drop(vm);
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success(), "{}", daemon.log());
}

#[test]
fn max_sessions_refuses_further_processes_and_spawns_nothing_for_them() {
    let limits = Limits {
        max_sessions: Some(2),
        max_gpu_memory: None,
    };
    let mut rig = Rig::new(worker_binary("warn").with_limits(limits), "limits-sessions");
    assert_eq!(rig.op(101, Op::Hello, &[1]).status, status::SUCCESS);
    assert_eq!(rig.op(102, Op::Hello, &[1]).status, status::SUCCESS);
    for op in [Op::Hello, Op::Malloc, Op::DeviceCount] {
        assert_eq!(
            rig.op(103, op, &[1]).status,
            status::DEVICES_UNAVAILABLE,
            "{op:?}"
        );
    }
    assert_eq!(rig.table.open_count(), 2);
    assert_eq!(rig.table.worker_pid(103), None);
    assert!(children_with("--session-id 103 ").is_empty());
    // Closing a session that never opened is fine and frees nothing.
    assert_eq!(rig.op(103, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(rig.table.open_count(), 2);
    // A session that ends makes room.
    assert_eq!(rig.op(101, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(rig.op(103, Op::Hello, &[1]).rets[3], 2);
    for s in [102, 103] {
        assert_eq!(rig.op(s, Op::SessionClose, &[]).status, status::SUCCESS);
    }
    assert_eq!(rig.table.open_count(), 0);
}

#[test]
fn max_gpu_memory_is_shared_by_the_workers_of_a_vm() {
    const LIMIT: u64 = 3 << 20;
    let limits = Limits {
        max_sessions: Some(8),
        max_gpu_memory: Some(LIMIT),
    };
    let mut rig = Rig::new(worker_binary("warn").with_limits(limits), "limits-memory");
    let gpu = rig.host.gpu_count() > 0;
    assert_eq!(rig.table.gpu_memory_used(), Some(0));
    let r = rig.op(201, Op::Malloc, &[2 << 20]);
    let pid = rig.table.worker_pid(201).expect("a worker");
    // The worker took its slot and the quota file (it exits at once if it cannot).
    assert!(
        cmdline(pid).contains("--gpu-memory-slot 0"),
        "{}",
        cmdline(pid)
    );
    if !gpu {
        // No device: the worker itself answers (a worker that failed to attach its quota
        // would have exited: cudaErrorLaunchFailure), and nothing is counted.
        assert_ne!(r.status, status::SUCCESS);
        assert_ne!(r.status, status::LAUNCH_FAILURE);
        assert_ne!(
            rig.op(201, Op::MemGetInfo, &[]).status,
            status::LAUNCH_FAILURE
        );
        assert_eq!(rig.table.worker_pid(201), Some(pid));
        assert_eq!(rig.table.gpu_memory_used(), Some(0));
        println!("skipped: no GPU (allocations against --max-gpu-memory)");
        assert_eq!(rig.op(201, Op::SessionClose, &[]).status, status::SUCCESS);
        return;
    }
    assert_eq!(r.status, status::SUCCESS, "{r:?}");
    let first = r.rets[0];
    assert_eq!(rig.table.gpu_memory_used(), Some(2 << 20));
    // A second process of the VM gets the rest, not more.
    let r = rig.op(202, Op::Malloc, &[(1 << 20) + 1]);
    assert_eq!(r.status, status::MEMORY_ALLOCATION, "{r:?}");
    let r = rig.op(202, Op::Malloc, &[1 << 20]);
    assert_eq!(r.status, status::SUCCESS, "{r:?}");
    assert_eq!(rig.table.gpu_memory_used(), Some(LIMIT));
    assert_eq!(
        rig.op(201, Op::Malloc, &[1]).status,
        status::MEMORY_ALLOCATION
    );
    assert_eq!(rig.op(201, Op::Free, &[first]).status, status::SUCCESS);
    assert_eq!(rig.table.gpu_memory_used(), Some(1 << 20));
    // A session's end (its worker reaped) gives its share back.
    assert_eq!(rig.op(202, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(rig.table.gpu_memory_used(), Some(0));
    assert_eq!(rig.op(201, Op::Malloc, &[LIMIT]).status, status::SUCCESS);
    // A worker killed with its memory: the driver frees it, the daemon clears its slot.
    let pid = rig.table.worker_pid(201).expect("a worker");
    // SAFETY: kill(2) of our own child process.
    unsafe { libc::kill(libc::pid_t::try_from(pid).unwrap(), libc::SIGKILL) };
    assert_eq!(
        rig.op(201, Op::MemGetInfo, &[]).status,
        status::LAUNCH_FAILURE
    );
    assert_eq!(rig.table.gpu_memory_used(), Some(0));
    assert_eq!(rig.op(201, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(rig.table.gpu_memory_used(), Some(0));
}

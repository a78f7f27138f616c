//! Worker processes through the real code path, with no GPU needed: the session table starts
//! the real `vhost-cuda --session-worker` binary over memfd guest memory.
//!
//! Ops that need the GPU run in the worker (without a driver it answers `cudaErrorNoDevice`);
//! `SessionClose` reaps it; a worker killed mid-session fails the session with
//! `cudaErrorLaunchFailure` + `RESP_FLAG_STICKY` until `DeviceReset` starts a new one; a close
//! interrupts an op that never ends and kills a worker that does not exit; workers die with the
//! daemon's spawner thread that started them; 50 sessions leave no process behind; `DriverReset` (a new
//! guest driver instance) ends every session and its worker and counts them; and the worker
//! refuses run lists that the daemon should never have sent.

mod common;

use std::{
    fs,
    os::unix::{fs::PermissionsExt, process::ExitStatusExt},
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use common::{
    rig::{
        children_with, cmdline, guest_ram, header, is_our_child, process_state, within,
        worker_binary, Rig, HIGH,
    },
    scratch_dir,
};
use qcuda_proto::{
    status, Checksum, Direction, Op, RequestHeader, ResponseHeader, PROCESS_CHECKPOINT,
    PROCESS_GET_STATE, PROCESS_LOCK, PROCESS_RESTORE, PROCESS_STATE_CHECKPOINTED,
    PROCESS_STATE_RUNNING, PROCESS_UNLOCK, REQUEST_HEADER_SIZE, RESP_FLAG_STICKY,
};
use vhost_cuda::{
    cuda::CudaHost,
    guest_buffer::{GuestBuffer, GuestRam, Request},
    session::SessionTable,
    worker::message::{RunRequest, Span, ToWorker},
    worker::{Waited, WorkerCommand, WorkerError, WorkerProcess},
};
use vm_memory::{Bytes, GuestAddress};

const WAIT: Duration = Duration::from_secs(20);

/// What a GPU op answers on this host when the worker runs it: `NO_DEVICE` without a driver,
/// success with a GPU.
fn expect_gpu_op(rig: &Rig, r: ResponseHeader) {
    if rig.host.gpu_count() > 0 {
        assert_eq!((r.status, r.flags), (status::SUCCESS, 0), "{r:?}");
    } else if rig.host.driver_version() == 0 {
        assert_eq!((r.status, r.flags), (status::NO_DEVICE, 0), "{r:?}");
    } else {
        assert_ne!(r.status, status::SUCCESS, "{r:?}");
    }
}

fn lost(r: ResponseHeader) {
    assert_eq!(
        (r.status, r.flags),
        (status::LAUNCH_FAILURE, RESP_FLAG_STICKY),
        "{r:?}"
    );
}

#[test]
fn gpu_ops_run_in_a_worker_process_that_close_reaps() {
    let mut rig = Rig::new(worker_binary("warn"), "workers-basic");
    // The daemon answers the handshake and the host queries itself: no worker.
    assert_eq!(rig.op(11, Op::Hello, &[1]).rets[3], 1);
    let count = rig.op(11, Op::DeviceCount, &[]);
    assert_eq!(count.rets[0], u64::from(rig.host.gpu_count()));
    assert_eq!(
        rig.op(11, Op::DriverVersion, &[]).rets[0],
        u64::from(rig.host.driver_version())
    );
    assert_eq!(rig.table.worker_pid(11), None);

    // Malloc needs the GPU: it starts the worker, which answers it.
    let r = rig.op(11, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    let pid = rig.table.worker_pid(11).expect("a worker process");
    assert!(is_our_child(pid), "worker {pid} is not our child");
    let cmd = cmdline(pid);
    assert!(
        cmd.contains("--session-worker --session-id 11 --vm workers-basic"),
        "{cmd}"
    );
    // Without address-space randomisation (ADDR_NO_RANDOMIZE, 0x0040000), so that a session
    // restored in another worker finds its modules' globals where they were.
    let persona = fs::read_to_string(format!("/proc/{pid}/personality")).unwrap();
    let persona = u32::from_str_radix(persona.trim(), 16).unwrap();
    assert_ne!(persona & 0x0040000, 0, "personality {persona:#x}");
    // The same worker serves the session's next ops.
    let r = rig.op(11, Op::MemGetInfo, &[]);
    expect_gpu_op(&rig, r);
    assert_eq!(rig.table.worker_pid(11), Some(pid));
    // Hello counts the session, worker or not.
    assert_eq!(rig.op(12, Op::Hello, &[1]).rets[3], 2);

    let t = Instant::now();
    assert_eq!(rig.op(11, Op::SessionClose, &[]).status, status::SUCCESS);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a worker that exits by itself is not waited for: {:?}",
        t.elapsed()
    );
    // Reaped before the close was answered: not even a zombie is left.
    assert!(!is_our_child(pid), "worker {pid} not reaped");
    assert_eq!(rig.table.worker_pid(11), None);
    assert_eq!(rig.table.open_count(), 1);
    assert_eq!(rig.op(12, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(rig.table.open_count(), 0);
}

#[test]
fn a_killed_worker_fails_the_session_until_device_reset() {
    let mut rig = Rig::new(worker_binary("warn"), "workers-kill");
    let r = rig.op(21, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    let first = rig.table.worker_pid(21).unwrap();
    let first_pid = libc::pid_t::try_from(first).unwrap();
    // SAFETY: kill(2) on our own, unreaped child has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(first_pid, libc::SIGKILL) }, 0);
    // Gone (a zombie, or reaped): in the namespace sandbox it is the init of the worker's PID
    // namespace, whose exit ends the worker first.
    assert!(within(WAIT, || matches!(
        process_state(first),
        Some('Z') | None
    )));

    // The next op finds it dead: the documented error, and the session stays failed.
    lost(rig.op(21, Op::Malloc, &[64]));
    assert!(!is_our_child(first), "dead worker {first} not reaped");
    assert_eq!(rig.table.worker_pid(21), None);
    lost(rig.op(21, Op::MemGetInfo, &[]));
    assert_eq!(
        rig.table.worker_pid(21),
        None,
        "a failed session starts no worker"
    );
    // Queries the daemon answers still work, flagged; so does the handshake.
    let q = rig.op(21, Op::DriverVersion, &[]);
    assert_eq!((q.status, q.flags), (status::SUCCESS, RESP_FLAG_STICKY));
    assert_eq!(rig.op(21, Op::Hello, &[1]).status, status::SUCCESS);

    // DeviceReset recovers: success, then a new worker for the next op.
    let r = rig.op(21, Op::DeviceReset, &[]);
    assert_eq!((r.status, r.flags), (status::SUCCESS, 0));
    let r = rig.op(21, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    let second = rig.table.worker_pid(21).unwrap();
    assert_ne!(second, first);
    assert!(is_our_child(second));
    let q = rig.op(21, Op::DriverVersion, &[]);
    assert_eq!(q.flags, 0, "the reset cleared the flag");
    assert_eq!(rig.op(21, Op::SessionClose, &[]).status, status::SUCCESS);
    assert!(!is_our_child(second));
}

/// A stand-in worker that never reads, answers or exits by itself (`sleep`), keeping the
/// channel open: an op stuck in an endless kernel, as far as the daemon can tell.
fn stuck_worker(dir: &std::path::Path) -> WorkerCommand {
    let script = dir.join("stuck-worker");
    fs::write(&script, "#!/bin/sh\nexec sleep 600\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    WorkerCommand::program(script, None, "warn")
}

#[test]
fn closing_interrupts_an_op_that_never_ends() {
    let dir = scratch_dir("stuck");
    let mut rig = Rig::new(stuck_worker(&dir), "workers-stuck");
    let running = rig.submit(&header(31, Op::Malloc, &[64]), &[], 0);
    assert!(within(WAIT, || rig.table.worker_pid(31).is_some()));
    let pid = rig.table.worker_pid(31).unwrap();
    thread::sleep(Duration::from_millis(100));
    assert!(!rig.done.is_done(running.head), "the stuck op completed");

    // The guest process is gone: its close ends the worker at once, not after a bound.
    let t = Instant::now();
    let close = rig.submit(&header(31, Op::SessionClose, &[]), &[], 0);
    lost(rig.wait(running, WAIT).resp);
    assert_eq!(rig.wait(close, WAIT).resp.status, status::SUCCESS);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(!is_our_child(pid), "worker {pid} not reaped");

    // The VM going away does the same, and drops the op without completing it.
    let running = rig.submit(&header(32, Op::Malloc, &[64]), &[], 0);
    assert!(within(WAIT, || rig.table.worker_pid(32).is_some()));
    let pid = rig.table.worker_pid(32).unwrap();
    assert_eq!(rig.table.close_all(WAIT), 0);
    assert!(!is_our_child(pid), "worker {pid} not reaped");
    assert!(!rig.done.is_done(running.head));
    assert!(rig.table.wait_idle(WAIT));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_that_cannot_start_fails_the_op_not_the_session() {
    let mut rig = Rig::new(
        WorkerCommand::program("/nonexistent/vhost-cuda", None, "warn"),
        "workers-nostart",
    );
    for _ in 0..2 {
        let r = rig.op(71, Op::Malloc, &[64]);
        assert_eq!((r.status, r.flags), (status::MEMORY_ALLOCATION, 0));
        assert_eq!(rig.table.worker_pid(71), None);
    }
    assert_eq!(rig.op(71, Op::SessionClose, &[]).status, status::SUCCESS);
}

#[test]
fn a_worker_that_does_not_exit_is_killed_after_the_bound() {
    let dir = scratch_dir("noexit");
    let worker = WorkerProcess::spawn(&stuck_worker(&dir), 41, "workers-noexit").unwrap();
    let pid = worker.pid();
    let t = Instant::now();
    let st = worker.close(Duration::from_millis(300));
    let took = t.elapsed();
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    assert!(
        (Duration::from_millis(300)..Duration::from_secs(5)).contains(&took),
        "{took:?}"
    );
    assert!(!is_our_child(pid));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn workers_die_with_the_spawner_thread_not_with_the_session_thread() {
    let dir = scratch_dir("pdeathsig");
    let command = stuck_worker(&dir);
    let worker =
        thread::spawn(move || WorkerProcess::spawn(&command, 51, "workers-pdeath").unwrap())
            .join()
            .unwrap();
    let pid = worker.pid();
    // PR_SET_PDEATHSIG names the thread that forked the worker: the daemon's spawner thread
    // (sandbox/spawn.rs), which lives as long as the process, so the end of the thread that
    // asked for the worker does not kill it; the daemon's end does (not tested here: that
    // needs a daemon process of its own to kill).
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        process_state(pid).map(|s| s != 'Z'),
        Some(true),
        "worker {pid} died"
    );
    let st = worker.close(Duration::ZERO);
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    assert!(!is_our_child(pid));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn fifty_sessions_leave_no_worker_behind() {
    let label = "workers-fifty";
    let mut rig = Rig::new(worker_binary("warn"), label);
    let sessions: Vec<u64> = (1000..1050).collect();
    let pending: Vec<_> = sessions
        .iter()
        .map(|&s| rig.submit(&header(s, Op::Malloc, &[64]), &[], 0))
        .collect();
    for p in pending {
        expect_gpu_op(&rig, rig.wait(p, Duration::from_secs(60)).resp);
    }
    let pids: Vec<u32> = sessions
        .iter()
        .map(|&s| rig.table.worker_pid(s).unwrap())
        .collect();
    let mut distinct = pids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 50);
    assert_eq!(children_with(label).len(), 50);
    assert_eq!(rig.table.open_count(), 50);

    // Half close one by one, the rest with the VM.
    let closes: Vec<_> = sessions[..25]
        .iter()
        .map(|&s| rig.submit(&header(s, Op::SessionClose, &[]), &[], 0))
        .collect();
    for c in closes {
        assert_eq!(rig.wait(c, WAIT).resp.status, status::SUCCESS);
    }
    assert_eq!(rig.table.open_count(), 25);
    assert_eq!(rig.table.close_all(WAIT), 0);
    for pid in pids {
        assert!(!is_our_child(pid), "worker {pid} left behind");
    }
    assert_eq!(children_with(label), Vec::<u32>::new());
}

#[test]
fn driver_reset_ends_every_session_and_reaps_its_worker() {
    let label = "workers-driver-reset";
    let mut rig = Rig::new(worker_binary("warn"), label);
    // The previous driver instance: three sessions with workers, one without.
    for s in [81, 82, 83] {
        let r = rig.op(s, Op::Malloc, &[64]);
        expect_gpu_op(&rig, r);
    }
    assert_eq!(rig.op(84, Op::Hello, &[1]).rets[3], 4);
    let pids: Vec<u32> = [81, 82, 83]
        .iter()
        .map(|&s| rig.table.worker_pid(s).expect("a worker"))
        .collect();
    assert_eq!(children_with(label).len(), 3);

    // The new instance binds: every session is closed and counted, every worker reaped before
    // the answer.
    let t = Instant::now();
    let r = rig.op(0, Op::DriverReset, &[]);
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 4), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "workers that exit by themselves are not waited for: {:?}",
        t.elapsed()
    );
    assert_eq!(rig.table.open_count(), 0);
    for pid in &pids {
        assert!(!is_our_child(*pid), "worker {pid} not reaped");
    }
    assert_eq!(children_with(label), Vec::<u32>::new());

    // Sessions of the new instance work as ever, with new workers; an id the old instance used
    // is a new session.
    assert_eq!(rig.op(81, Op::Hello, &[1]).rets[3], 1);
    let r = rig.op(81, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    let new_pid = rig.table.worker_pid(81).expect("a new worker");
    assert!(!pids.contains(&new_pid));
    assert_eq!(rig.op(81, Op::SessionClose, &[]).status, status::SUCCESS);
    assert!(!is_our_child(new_pid));

    // With nothing left, nothing is closed.
    assert_eq!(rig.op(0, Op::DriverReset, &[]).rets[0], 0);
}

#[test]
fn driver_reset_kills_a_worker_stuck_in_an_op_and_drops_the_op() {
    let dir = scratch_dir("reset-stuck");
    let mut rig = Rig::new(stuck_worker(&dir), "workers-reset-stuck");
    let running = rig.submit(&header(91, Op::Malloc, &[64]), &[], 0);
    assert!(within(WAIT, || rig.table.worker_pid(91).is_some()));
    let pid = rig.table.worker_pid(91).unwrap();

    // Its guest process belonged to the old instance: the worker is killed at once, not after
    // the bound, and the op is dropped (its chain was on the old ring).
    let t = Instant::now();
    let r = rig.op(0, Op::DriverReset, &[]);
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 1));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(!is_our_child(pid), "worker {pid} not reaped");
    assert!(rig.table.wait_idle(WAIT));
    assert!(!rig.done.is_done(running.head), "a stale op was completed");
    assert_eq!(rig.table.open_count(), 0);
    let _ = fs::remove_dir_all(&dir);
}

/// A request of `session` whose buffers lie in `mem` at the given ranges.
fn request(
    session: u64,
    op: Op,
    mem: &std::sync::Arc<vhost_cuda::guest_buffer::GuestRam>,
    inputs: &[(u64, usize)],
    outputs: &[(u64, usize)],
) -> Request {
    let mut h = RequestHeader::new(op);
    h.session = session;
    let buf = |&(a, l): &(u64, usize)| GuestBuffer::new(mem.clone(), [(GuestAddress(a), l)]);
    let inputs: Vec<_> = inputs.iter().map(|r| buf(r).unwrap()).collect();
    let outputs: Vec<_> = outputs.iter().map(|r| buf(r).unwrap()).collect();
    for b in &inputs {
        h.push_buffer(Direction::In, b.len() as u64).unwrap();
    }
    for b in &outputs {
        h.push_buffer(Direction::Out, b.len() as u64).unwrap();
    }
    Request::new(h, inputs, outputs).unwrap()
}

fn answer(w: &mut WorkerProcess) -> ResponseHeader {
    match w.wait(None).unwrap() {
        Waited::Done(r) => r,
        Waited::Woken => unreachable!("no wake-up given"),
    }
}

#[test]
fn the_operators_pause_and_resume_reach_the_workers_state_between_requests() {
    let mem = guest_ram();
    let mut w = WorkerProcess::spawn(&worker_binary("error"), 62, "workers-pause").unwrap();
    w.share_memory(&mem).unwrap();
    // No GPU here: nothing to move, but the state goes paused and back.
    let r = w.checkpoint(true).unwrap();
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 0));
    assert_eq!(w.checkpoint(true).unwrap().status, status::ILLEGAL_STATE);
    let r = w.checkpoint(false).unwrap();
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 0));
    assert_eq!(w.checkpoint(false).unwrap().status, status::ILLEGAL_STATE);
    // Requests still run after it, in order.
    let data = b"after a pause".to_vec();
    mem.write_slice(&data, GuestAddress(0x10_0000)).unwrap();
    let echo = request(
        62,
        Op::Echo,
        &mem,
        &[(0x10_0000, data.len())],
        &[(HIGH + 0x20_0000, data.len())],
    );
    assert_eq!(w.execute(&echo).unwrap().status, status::SUCCESS);
}

#[test]
fn cuda_process_checkpoint_pauses_and_resumes_the_target_s_worker() {
    let mut rig = Rig::new(worker_binary("warn"), "workers-ckpt");
    // Session 31 uses the GPU (its worker starts); session 32 is cuda-checkpoint.
    let r = rig.op(31, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    let pid = rig.table.worker_pid(31).expect("a worker process");
    let act = |rig: &mut Rig, action: u64| {
        rig.op(32, Op::ProcessCheckpoint, &[action, 4242, 0, 31, 4242])
    };
    assert_eq!(act(&mut rig, PROCESS_LOCK).status, status::SUCCESS);
    // No GPU here: nothing to move, but the worker pauses and resumes for real.
    let r = act(&mut rig, PROCESS_CHECKPOINT);
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 0), "{r:?}");
    assert_eq!(
        act(&mut rig, PROCESS_GET_STATE).rets[0],
        PROCESS_STATE_CHECKPOINTED
    );
    assert_eq!(act(&mut rig, PROCESS_RESTORE).status, status::SUCCESS);
    assert_eq!(act(&mut rig, PROCESS_UNLOCK).status, status::SUCCESS);
    assert_eq!(
        act(&mut rig, PROCESS_GET_STATE).rets[0],
        PROCESS_STATE_RUNNING
    );
    // The same worker serves the session on.
    let r = rig.op(31, Op::MemGetInfo, &[]);
    expect_gpu_op(&rig, r);
    assert_eq!(rig.table.worker_pid(31), Some(pid));
    // A second round, as cuda-checkpoint --toggle twice more.
    assert_eq!(act(&mut rig, PROCESS_LOCK).status, status::SUCCESS);
    assert_eq!(act(&mut rig, PROCESS_CHECKPOINT).status, status::SUCCESS);
    assert_eq!(act(&mut rig, PROCESS_RESTORE).status, status::SUCCESS);
    assert_eq!(act(&mut rig, PROCESS_UNLOCK).status, status::SUCCESS);
    assert_eq!(rig.op(31, Op::SessionClose, &[]).status, status::SUCCESS);
    assert!(!is_our_child(pid), "worker {pid} not reaped");
    assert_eq!(
        act(&mut rig, PROCESS_GET_STATE).status,
        status::INITIALIZATION_ERROR
    );
    assert_eq!(rig.op(32, Op::SessionClose, &[]).status, status::SUCCESS);
}

#[test]
fn the_worker_maps_guest_ram_and_refuses_a_malformed_run_list() {
    let mem = guest_ram();
    let mut w = WorkerProcess::spawn(&worker_binary("error"), 61, "workers-malformed").unwrap();
    w.share_memory(&mem).unwrap();

    // Echo through the worker: it reads the low region and writes the high one (another file
    // offset) through its own mapping; the bytes show up here.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    mem.write_slice(&data, GuestAddress(0x10_0000)).unwrap();
    let echo = request(
        61,
        Op::Echo,
        &mem,
        &[(0x10_0000, data.len())],
        &[(HIGH + 0x20_0000, data.len())],
    );
    let r = w.execute(&echo).unwrap();
    assert_eq!(
        (r.status, r.rets[0]),
        (status::SUCCESS, Checksum::of(&data))
    );
    let mut back = vec![0u8; data.len()];
    mem.read_slice(&mut back, GuestAddress(HIGH + 0x20_0000))
        .unwrap();
    assert!(back == data, "echo through the worker differs");

    // Run lists the daemon must never send; the worker refuses each, untouched memory and all.
    let good = RunRequest {
        header: echo.header().encode(),
        inputs: vec![vec![Span {
            gpa: 0x10_0000,
            len: 16,
        }]],
        outputs: vec![vec![Span {
            gpa: HIGH + 0x30_0000,
            len: 16,
        }]],
    };
    let mut h = *echo.header();
    h.bufs[0].len = 16;
    h.bufs[1].len = 16;
    let good = RunRequest {
        header: h.encode(),
        ..good
    };
    let outside = |gpa| vec![Span { gpa, len: 16 }];
    let mut other_session = h;
    other_session.session = 62;
    let bad = [
        // In the gap between the regions, past the end, overflowing.
        RunRequest {
            outputs: vec![outside(0x1000_0000)],
            ..good.clone()
        },
        RunRequest {
            outputs: vec![outside(HIGH + (32 << 20) - 8)],
            ..good.clone()
        },
        RunRequest {
            inputs: vec![outside(u64::MAX - 8)],
            ..good.clone()
        },
        // Runs that do not add up to the header's length.
        RunRequest {
            inputs: vec![vec![Span {
                gpa: 0x10_0000,
                len: 15,
            }]],
            ..good.clone()
        },
        // A missing run list.
        RunRequest {
            outputs: vec![],
            ..good.clone()
        },
        // Another session's request.
        RunRequest {
            header: other_session.encode(),
            ..good.clone()
        },
        // A header that does not decode.
        RunRequest {
            header: [0; REQUEST_HEADER_SIZE],
            ..good.clone()
        },
    ];
    mem.write_slice(&[0x5a; 16], GuestAddress(HIGH + 0x30_0000))
        .unwrap();
    for run in bad {
        w.send_message(&ToWorker::Run(Box::new(run.clone())), &[])
            .unwrap();
        assert_eq!(answer(&mut w).status, status::INVALID_VALUE, "{run:x?}");
    }
    let mut out = [0u8; 16];
    mem.read_slice(&mut out, GuestAddress(HIGH + 0x30_0000))
        .unwrap();
    assert_eq!(out, [0x5a; 16], "a refused request wrote guest memory");
    // Still serving.
    w.send_message(&ToWorker::Run(Box::new(good)), &[]).unwrap();
    assert_eq!(answer(&mut w).status, status::SUCCESS);

    // A frame that is no message: the worker gives up on the channel and exits.
    w.send_frame(&[0x7f, 0, 0]).unwrap();
    assert!(matches!(w.wait(None), Err(WorkerError::Closed)));
    let pid = w.pid();
    let st = w.close(WAIT);
    assert_eq!(st.code(), Some(1), "{st:?}");
    assert!(!is_our_child(pid));
}

#[test]
fn with_hop_polling_the_worker_and_the_session_answer_the_same() {
    // The worker is told the daemon's --hop-poll-us, 0 included.
    let mut rig = Rig::new(worker_binary("warn"), "workers-nohop");
    let r = rig.op(81, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    let cmd = cmdline(rig.table.worker_pid(81).unwrap());
    assert!(cmd.contains("--hop-poll-us 0"), "{cmd}");
    assert_eq!(rig.op(81, Op::SessionClose, &[]).status, status::SUCCESS);

    let command = worker_binary("warn").with_hop_poll(Duration::from_micros(50));
    let mut rig = Rig::new(command, "workers-hop");
    for i in 0..6 {
        // Back to back, or after both sides gave up spinning.
        if i % 2 == 1 {
            thread::sleep(Duration::from_millis(5));
        }
        let op = if i % 3 == 0 {
            Op::Malloc
        } else {
            Op::MemGetInfo
        };
        let r = rig.op(82, op, &[64]);
        expect_gpu_op(&rig, r);
    }
    let pid = rig.table.worker_pid(82).unwrap();
    let cmd = cmdline(pid);
    assert!(cmd.contains("--hop-poll-us 50"), "{cmd}");
    assert_eq!(rig.op(82, Op::SessionClose, &[]).status, status::SUCCESS);
    assert!(!is_our_child(pid), "worker {pid} not reaped");
}

#[test]
fn a_spinning_wait_still_answers_in_order_and_sees_the_wake_up() {
    // The longest spin --hop-poll-us allows, longer than the steps below: what arrives must
    // end it.
    let spin = Duration::from_millis(100);
    let mem = guest_ram();
    let command = worker_binary("error").with_hop_poll(spin);
    let mut w = WorkerProcess::spawn(&command, 91, "workers-spin").unwrap();
    w.share_memory(&mem).unwrap();
    let t = Instant::now();
    for i in 0..4u8 {
        // Back to back, or after both sides gave up spinning.
        if i % 2 == 1 {
            thread::sleep(Duration::from_millis(150));
        }
        let data = [i; 64];
        mem.write_slice(&data, GuestAddress(0x10_0000)).unwrap();
        let echo = request(91, Op::Echo, &mem, &[(0x10_0000, 64)], &[(HIGH, 64)]);
        let r = w.execute(&echo).unwrap();
        assert_eq!(
            (r.status, r.rets[0]),
            (status::SUCCESS, Checksum::of(&data))
        );
    }
    // An answer that is there wins over the wake-up, which stays set for the next wait.
    let wake = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    let echo = request(91, Op::Echo, &mem, &[(0x10_0000, 64)], &[(HIGH, 64)]);
    w.send(&echo).unwrap();
    thread::sleep(Duration::from_millis(50));
    wake.write(1).unwrap();
    assert!(matches!(w.wait(Some(&wake)), Ok(Waited::Done(_))));
    assert_eq!(w.wait(Some(&wake)).unwrap(), Waited::Woken);
    assert!(t.elapsed() < WAIT, "{:?}", t.elapsed());
    let pid = w.pid();
    assert_eq!(w.close(WAIT).code(), Some(0));
    assert!(!is_our_child(pid));

    // A worker that never answers: the wake-up ends the spin, from another thread.
    let dir = scratch_dir("spin-wake");
    let mut w =
        WorkerProcess::spawn(&stuck_worker(&dir).with_hop_poll(spin), 92, "workers-spin").unwrap();
    w.send(&request(
        92,
        Op::Echo,
        &mem,
        &[(0x10_0000, 64)],
        &[(HIGH, 64)],
    ))
    .unwrap();
    let wake = std::sync::Arc::new(vmm_sys_util::eventfd::EventFd::new(0).unwrap());
    let ringer = {
        let wake = wake.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            wake.write(1).unwrap();
        })
    };
    let t = Instant::now();
    assert_eq!(w.wait(Some(&wake)).unwrap(), Waited::Woken);
    assert!(t.elapsed() < WAIT, "{:?}", t.elapsed());
    ringer.join().unwrap();
    w.kill();
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_hop_mailbox_keeps_the_daemons_order_with_the_socket() {
    // Both sides spin (the mailbox's fast path), and between requests the daemon sends new
    // memory tables over the socket: each request must see the table sent before it.
    let command = worker_binary("error")
        .with_hop_poll(Duration::from_millis(20))
        .with_hop_mailbox(true);
    let mut w = WorkerProcess::spawn(&command, 93, "workers-mailbox").unwrap();
    assert!(w.has_mailbox());
    for i in 0..6u8 {
        let mem = guest_ram();
        let data = [i.wrapping_mul(37); 256];
        mem.write_slice(&data, GuestAddress(0x10_0000)).unwrap();
        w.share_memory(&mem).unwrap();
        let echo = request(93, Op::Echo, &mem, &[(0x10_0000, 256)], &[(HIGH, 256)]);
        let r = w.execute(&echo).unwrap();
        assert_eq!(
            (r.status, r.rets[0]),
            (status::SUCCESS, Checksum::of(&data)),
            "request {i} saw another table"
        );
        if i % 2 == 1 {
            // Both sides asleep on the socket: the posts come with a wake-up frame.
            thread::sleep(Duration::from_millis(40));
        }
    }
    // A request too long for the mailbox (9000 runs of 2 bytes, about 140 KiB of run list)
    // goes over the socket, in order with the ones before and after it.
    let mem = guest_ram();
    w.share_memory(&mem).unwrap();
    let runs: Vec<(u64, usize)> = (0..9000u64).map(|k| (0x10_0000 + 4 * k, 2)).collect();
    let mut expect = Vec::new();
    for (k, &(a, _)) in (0u8..=250).cycle().zip(&runs) {
        let b = [k, k % 13];
        mem.write_slice(&b, GuestAddress(a)).unwrap();
        expect.extend_from_slice(&b);
    }
    let mut h = RequestHeader::new(Op::Echo);
    h.session = 93;
    let input =
        GuestBuffer::new(mem.clone(), runs.iter().map(|&(a, l)| (GuestAddress(a), l))).unwrap();
    let output = GuestBuffer::new(mem.clone(), [(GuestAddress(HIGH), expect.len())]).unwrap();
    h.push_buffer(Direction::In, input.len() as u64).unwrap();
    h.push_buffer(Direction::Out, output.len() as u64).unwrap();
    let long = Request::new(h, vec![input], vec![output]).unwrap();
    for _ in 0..2 {
        let r = w.execute(&long).unwrap();
        assert_eq!(
            (r.status, r.rets[0]),
            (status::SUCCESS, Checksum::of(&expect))
        );
        let short = request(93, Op::Echo, &mem, &[(0x10_0000, 64)], &[(HIGH, 64)]);
        assert_eq!(w.execute(&short).unwrap().status, status::SUCCESS);
    }
    let pid = w.pid();
    assert_eq!(w.close(WAIT).code(), Some(0));
    assert!(!is_our_child(pid));
}

#[test]
fn the_hop_mailbox_survives_a_storm_of_requests_at_every_pace() {
    // A real worker process, a short spin and requests at every pace (back to back, within
    // the spin, just after it, long after), with wake-ups and new memory tables between them:
    // every answer comes, right, and in time (the H100 load run once hung on a lost wake-up).
    for (spin, mailbox) in [(50, true), (0, true), (50, false)] {
        let command = worker_binary("error")
            .with_hop_poll(Duration::from_micros(spin))
            .with_hop_mailbox(mailbox);
        let mut w = WorkerProcess::spawn(&command, 94, "workers-storm").unwrap();
        assert_eq!(w.has_mailbox(), mailbox);
        let mut mem = guest_ram();
        w.share_memory(&mem).unwrap();
        let wake = std::sync::Arc::new(vmm_sys_util::eventfd::EventFd::new(0).unwrap());
        // A lost wake-up would block a wait for ever: a watchdog wakes it every second, and a
        // request that needed the watchdog fails the test below.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watchdog = {
            let (wake, done) = (wake.clone(), done.clone());
            thread::spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    thread::sleep(Duration::from_secs(1));
                    let _ = wake.write(1);
                }
            })
        };
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let t = Instant::now();
        for i in 0..1500u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 8 {
                0..=3 => {}
                4 => thread::sleep(Duration::from_micros(x % 80)),
                5 => thread::sleep(Duration::from_micros(200 + x % 400)),
                6 => {
                    mem = guest_ram();
                    w.share_memory(&mem).unwrap();
                }
                _ => wake.write(1).unwrap(),
            }
            let data = [(i % 251) as u8; 32];
            mem.write_slice(&data, GuestAddress(0x10_0000)).unwrap();
            let echo = request(94, Op::Echo, &mem, &[(0x10_0000, 32)], &[(HIGH, 32)]);
            let sent = Instant::now();
            w.send(&echo).unwrap();
            let r = loop {
                match w.wait(Some(&*wake)).unwrap() {
                    Waited::Done(r) => break r,
                    // The wake-up ends the wait; the answer is still due.
                    Waited::Woken => {}
                }
            };
            assert_eq!(
                (r.status, r.rets[0]),
                (status::SUCCESS, Checksum::of(&data)),
                "request {i}"
            );
            assert!(
                sent.elapsed() < Duration::from_millis(900),
                "request {i} (spin {spin} µs, mailbox {mailbox}): {:?}, its answer came only \
                 with the watchdog's wake-up",
                sent.elapsed()
            );
            assert!(t.elapsed() < WAIT, "request {i}: too slow");
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        watchdog.join().unwrap();
        let pid = w.pid();
        assert_eq!(w.close(WAIT).code(), Some(0));
        assert!(!is_our_child(pid));
    }
}

/// IPC through the daemon and real workers (without a GPU the workers answer
/// `cudaErrorNoDevice`): a session with no worker has nothing to export; a forged, unknown or
/// wrong-kind token is refused by the daemon before any worker is involved; an export and an
/// import (its descriptor passed with `SCM_RIGHTS`) reach the worker between requests and are
/// answered on the socket, and requests still run in order after them.
#[test]
fn ipc_calls_reach_the_worker_and_forged_tokens_do_not() {
    use qcuda_proto::{IPC_KIND_MEMORY, IPC_KIND_VMM};
    use std::os::fd::AsRawFd;
    use vhost_cuda::worker::message::IpcCall;

    let mut rig = Rig::new(worker_binary("warn"), "workers-ipc");
    let r = rig.op(21, Op::IpcExport, &[IPC_KIND_MEMORY, 0x1000]);
    assert_eq!(r.status, status::INVALID_VALUE);
    assert_eq!(rig.table.worker_pid(21), None, "an export started a worker");
    for args in [
        [IPC_KIND_MEMORY, 1, 2, 3, 0],
        [IPC_KIND_VMM, 1, 0, 0, 0],
        [IPC_KIND_MEMORY, 0, 0, 0, 0],
        [7, u64::MAX, u64::MAX, u64::MAX, 0],
    ] {
        let r = rig.op(22, Op::IpcImport, &args);
        assert_eq!(r.status, status::INVALID_VALUE, "{args:?}");
    }
    assert_eq!(
        rig.table.worker_pid(22),
        None,
        "a refused import started a worker"
    );
    // With a worker: it answers the export itself (no device here), through the daemon.
    let r = rig.op(21, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    let r = rig.op(21, Op::IpcExport, &[IPC_KIND_MEMORY, 0x1000]);
    if rig.host.gpu_count() == 0 {
        assert_ne!(r.status, status::SUCCESS, "{r:?}");
    }
    let r = rig.op(21, Op::MemGetInfo, &[]);
    expect_gpu_op(&rig, r);
    assert_eq!(rig.op(21, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(rig.op(22, Op::SessionClose, &[]).status, status::SUCCESS);

    // The worker side alone: an import carries its descriptor; an export without a device
    // comes back without one.
    let mem = guest_ram();
    let mut w = WorkerProcess::spawn(&worker_binary("error"), 63, "workers-ipc2").unwrap();
    w.share_memory(&mem).unwrap();
    let null = fs::File::open("/dev/null").unwrap();
    let call = IpcCall {
        import: true,
        device: 0,
        kind: IPC_KIND_MEMORY,
        arg: 0,
        meta: [0, 4096, 2 << 20],
    };
    let (r, fd) = w.ipc(&call, Some(null.as_raw_fd())).unwrap();
    assert!(fd.is_none());
    assert_ne!(r.status, status::SUCCESS, "{r:?}");
    let export = IpcCall {
        import: false,
        ..call
    };
    let (r, fd) = w.ipc(&export, None).unwrap();
    assert!(fd.is_none());
    assert_ne!(r.status, status::SUCCESS, "{r:?}");
    let data = b"after IPC".to_vec();
    mem.write_slice(&data, GuestAddress(0x10_0000)).unwrap();
    let echo = request(
        63,
        Op::Echo,
        &mem,
        &[(0x10_0000, data.len())],
        &[(HIGH + 0x20_0000, data.len())],
    );
    assert_eq!(w.execute(&echo).unwrap().status, status::SUCCESS);
}

#[test]
fn a_session_with_a_worker_migrates_into_a_restored_worker_of_another_table() {
    use vhost_cuda::session::migration::{read_copied, write_stream, SavedGpu};
    let mut src = Rig::new(worker_binary("warn"), "workers-migrate-src");
    let r = src.op(41, Op::Malloc, &[64]);
    expect_gpu_op(&src, r);
    let src_pid = src.table.worker_pid(41).expect("a worker process");
    assert!(src.table.wait_idle(WAIT));
    // The worker saves its state into a memfd (without a GPU: an empty state, still a whole
    // QCUDAGS1 record of its session) and goes on running.
    let states = src.table.save_states(WAIT).unwrap();
    assert_eq!(states.len(), 1);
    let SavedGpu::State(file) = &states[0].gpu else {
        panic!("no saved state: {:?}", states[0].gpu)
    };
    assert_eq!(&file.to_vec().unwrap()[..8], b"QCUDAGS1");
    assert_eq!(src.table.worker_pid(41), Some(src_pid));
    let r = src.op(41, Op::MemGetInfo, &[]);
    expect_gpu_op(&src, r);
    let mut stream = Vec::new();
    write_stream(&mut stream, &states).unwrap();

    // The destination starts the session with a worker restored from it, before any request.
    let mut dst = Rig::new(worker_binary("warn"), "workers-migrate-dst");
    dst.table
        .restore_states(read_copied(&mut stream.as_slice()).unwrap(), WAIT)
        .unwrap();
    let dst_pid = dst.table.worker_pid(41).expect("a restored worker");
    assert!(is_our_child(dst_pid));
    let r = dst.op(41, Op::MemGetInfo, &[]);
    expect_gpu_op(&dst, r);
    assert_eq!(dst.table.worker_pid(41), Some(dst_pid));

    // A saved state that is not its session's is refused by the worker: the restore fails as
    // a whole and leaves no session or worker behind.
    let mut wrong = read_copied(&mut stream.as_slice()).unwrap();
    wrong[0].id = 42;
    let other = Rig::new(worker_binary("warn"), "workers-migrate-refused");
    other.table.restore_states(wrong, WAIT).unwrap_err();
    assert_eq!(other.table.open_count(), 0);
    assert!(within(WAIT, || children_with("workers-migrate-refused").is_empty()));

    assert_eq!(src.op(41, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(dst.op(41, Op::SessionClose, &[]).status, status::SUCCESS);
}

#[test]
fn a_worker_started_before_there_is_guest_ram_is_sent_no_table_until_there_is() {
    // A migration's destination restores its sessions, and starts their workers, before QEMU's
    // SET_MEM_TABLE: the worker is sent no table then (an empty one it would refuse as a bad
    // table, with an error in the log), and the table that comes later is sent and mapped.
    let mut w = WorkerProcess::spawn(&worker_binary("error"), 64, "workers-no-ram").unwrap();
    w.share_memory(&Arc::new(GuestRam::new())).unwrap();
    assert_eq!(
        w.memory_tables_sent(),
        0,
        "an empty table went to the worker"
    );
    let mem = guest_ram();
    w.share_memory(&mem).unwrap();
    w.share_memory(&mem).unwrap();
    assert_eq!(w.memory_tables_sent(), 1);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 251) as u8).collect();
    mem.write_slice(&data, GuestAddress(0x10_0000)).unwrap();
    let echo = request(
        64,
        Op::Echo,
        &mem,
        &[(0x10_0000, data.len())],
        &[(HIGH + 0x20_0000, data.len())],
    );
    let r = w.execute(&echo).unwrap();
    assert_eq!(
        (r.status, r.rets[0]),
        (status::SUCCESS, Checksum::of(&data))
    );
    let pid = w.pid();
    assert_eq!(w.close(WAIT).code(), Some(0));
    assert!(!is_our_child(pid));
}

#[test]
fn a_session_restored_before_set_mem_table_serves_once_the_table_comes() {
    use vhost_cuda::session::migration::{read_copied, write_stream};
    let mut src = Rig::new(worker_binary("warn"), "workers-early-src");
    let r = src.op(43, Op::Malloc, &[64]);
    expect_gpu_op(&src, r);
    assert!(src.table.wait_idle(WAIT));
    let states = src.table.save_states(WAIT).unwrap();
    let mut stream = Vec::new();
    write_stream(&mut stream, &states).unwrap();

    // The destination's table has no guest RAM yet when the session is restored into it; the
    // rig's set_memory then plays QEMU's SET_MEM_TABLE.
    let host = CudaHost::probe();
    let table = SessionTable::new(host.clone(), worker_binary("warn"), "workers-early-dst");
    table
        .restore_states(read_copied(&mut stream.as_slice()).unwrap(), WAIT)
        .unwrap();
    let dst_pid = table.worker_pid(43).expect("a restored worker");
    let mut dst = Rig::with_table(host, table, guest_ram());
    let r = dst.op(43, Op::MemGetInfo, &[]);
    expect_gpu_op(&dst, r);
    assert_eq!(dst.table.worker_pid(43), Some(dst_pid));

    assert_eq!(src.op(43, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(dst.op(43, Op::SessionClose, &[]).status, status::SUCCESS);
}

#[test]
fn a_handed_over_session_is_restored_from_its_record_and_its_runs() {
    use vhost_cuda::session::migration::{
        read_stream, write_body, write_head, SavedGpu, PATH_HANDOVER,
    };
    let mut src = Rig::new(worker_binary("warn"), "workers-handover-src");
    let r = src.op(51, Op::Malloc, &[64]);
    expect_gpu_op(&src, r);
    let src_pid = src.table.worker_pid(51).expect("a worker process");
    assert!(src.table.wait_idle(WAIT));
    // The quiesce of the last stop: a record without device memory, the worker running on.
    let records = src.table.save_records(WAIT).unwrap();
    assert!(matches!(records[0].gpu, SavedGpu::State(_)));
    // The worker exports its runs over its channel (without a GPU it has none) and saves its
    // record beside them.
    let (states, pieces) = src.table.export_states(WAIT).unwrap();
    let SavedGpu::HandedOver { state, pieces: n } = &states[0].gpu else {
        panic!("not handed over: {:?}", states[0].gpu)
    };
    assert_eq!(&state.to_vec().unwrap()[..8], b"QCUDAGS1");
    assert_eq!(*n as usize, pieces.len());
    assert_eq!(src.table.worker_pid(51), Some(src_pid));
    let mut stream = Vec::new();
    write_head(&mut stream, None, 0).unwrap();
    write_body(&mut stream, PATH_HANDOVER, &states).unwrap();

    let mut dst = Rig::new(worker_binary("warn"), "workers-handover-dst");
    let incoming = read_stream(&mut stream.as_slice()).unwrap();
    // Pieces that are not the states' are refused before any session starts.
    let extra = vec![vhost_cuda::session::handover::Piece {
        meta: [0, 0x6800_0000_0000, 2 << 20],
        fd: std::fs::File::open("/dev/null").unwrap().into(),
    }];
    dst.table
        .restore_handed_over(incoming.sessions.clone(), extra, WAIT)
        .unwrap_err();
    assert_eq!(dst.table.open_count(), 0);
    dst.table
        .restore_handed_over(incoming.sessions, pieces, WAIT)
        .unwrap();
    let dst_pid = dst.table.worker_pid(51).expect("a restored worker");
    assert!(is_our_child(dst_pid));
    let r = dst.op(51, Op::MemGetInfo, &[]);
    expect_gpu_op(&dst, r);

    assert_eq!(src.op(51, Op::SessionClose, &[]).status, status::SUCCESS);
    assert_eq!(dst.op(51, Op::SessionClose, &[]).status, status::SUCCESS);
}

#[test]
fn a_spare_worker_serves_the_next_session_and_another_takes_its_place() {
    // Under a GPU-memory limit, so that the binding carries the VM's accounting file too.
    // With the hop's mailbox, as the daemon runs by default (its posts count the frames sent
    // before them: the binding must not be one of them).
    let command = worker_binary("warn")
        .with_spares(1)
        .with_hop_mailbox(true)
        .with_limits(vhost_cuda::limits::Limits {
            max_sessions: None,
            max_gpu_memory: Some(1 << 30),
        });
    let mut rig = Rig::new(command, "workers-spare");
    // No spare until the VM connects.
    assert!(rig.table.spare_pids().is_empty());
    rig.table.start_spares();
    assert!(within(WAIT, || rig.table.spare_pids().len() == 1));
    let spare = rig.table.spare_pids()[0];
    assert!(
        within(WAIT, || cmdline(spare).contains(" --spare")),
        "{}",
        cmdline(spare)
    );

    // The first op that needs a worker takes the spare, and it serves that session.
    let r = rig.op(31, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    assert_eq!(rig.table.worker_pid(31), Some(spare));
    let r = rig.op(31, Op::MemGetInfo, &[]);
    expect_gpu_op(&rig, r);
    assert_eq!(rig.table.worker_pid(31), Some(spare));

    // Another spare took its place; the next session takes that one.
    assert!(within(WAIT, || rig
        .table
        .spare_pids()
        .first()
        .is_some_and(|&p| p != spare)));
    let next = rig.table.spare_pids()[0];
    let r = rig.op(32, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    assert_eq!(rig.table.worker_pid(32), Some(next));

    // A spare killed before it is needed is passed over: the session starts its own worker.
    assert!(within(WAIT, || rig.table.spare_pids().len() == 1));
    let killed = rig.table.spare_pids()[0];
    let pid = libc::pid_t::try_from(killed).unwrap();
    // SAFETY: kill(2) on our own, unreaped child has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(rc, 0);
    assert!(within(WAIT, || matches!(
        process_state(killed),
        Some('Z') | None
    )));
    let r = rig.op(33, Op::Malloc, &[64]);
    expect_gpu_op(&rig, r);
    let own = rig.table.worker_pid(33).expect("a worker");
    assert_ne!(own, killed);
    assert!(!cmdline(own).contains(" --spare"), "{}", cmdline(own));

    // The VM goes away: its spares end, and its sessions leave nothing behind.
    rig.table.stop_spares();
    assert!(rig.table.spare_pids().is_empty());
    for s in [31, 32, 33] {
        assert_eq!(rig.op(s, Op::SessionClose, &[]).status, status::SUCCESS);
    }
    assert!(
        within(WAIT, || children_with("--vm workers-spare").is_empty()),
        "left behind: {:?}",
        children_with("--vm workers-spare")
    );
}

#[test]
fn a_spare_worker_ends_when_the_daemon_closes_its_channel_before_it_is_needed() {
    let command = worker_binary("warn");
    let mut w = WorkerProcess::spawn_spare(&command, "workers-spare-end").unwrap();
    let pid = w.pid();
    // Once it has executed (and, sandboxed, its PID namespace's init has forked it).
    assert!(
        within(WAIT, || cmdline(pid).contains(" --spare")),
        "{}",
        cmdline(pid)
    );
    assert!(!w.has_exited());
    // Closing the channel is all it takes: it exits by itself, 0.
    let status = w.close(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{status:?}");

    // A spare bound twice refuses the second binding: it ends instead of serving on.
    let mut w = WorkerProcess::spawn_spare(&command, "workers-spare-end").unwrap();
    w.bind(&command, 71, None).map_err(|(e, _)| e).unwrap();
    w.send_message(
        &ToWorker::Bind {
            session: 72,
            slot: None,
        },
        &[],
    )
    .unwrap();
    assert!(within(WAIT, || w.has_exited()));
}

//! Session worker processes on a real GPU: what one process per session gives that one context
//! per session in one process does not (docs/executor.md, "What the driver gives"). Sessions go
//! through the real session table and worker binary, over memfd guest memory.
//!
//! 1. A kernel of one session, given another session's device pointer, cannot write it.
//! 2. A sticky error stays in its session; DeviceReset recovers it with a new worker.
//! 3. An endless kernel: another session keeps working; the guest process's close ends the
//!    worker at once (an op in flight) or after the bound (none in flight), and all its device
//!    memory comes back.
//!
//! Without a CUDA driver and GPU the test prints `skipped: no GPU` and passes.

mod common;

use std::{
    thread,
    time::{Duration, Instant},
};

use common::rig::{children_with, header, is_our_child, within, worker_binary, Rig};
use qcuda_proto::{status, Direction, Op, ResponseHeader, FLAG_ASYNC, RESP_FLAG_STICKY};

#[path = "../src/cuda/test_kernels.rs"]
mod test_kernels;

use test_kernels::VADD_PTX;

const LABEL: &str = "gpu-workers";

#[track_caller]
fn ok(r: ResponseHeader) -> [u64; 7] {
    assert_eq!((r.status, r.flags), (status::SUCCESS, 0), "{r:?}");
    r.rets
}

fn free_memory(rig: &mut Rig, session: u64) -> u64 {
    ok(rig.op(session, Op::MemGetInfo, &[]))[0]
}

/// Loads the test PTX in `session` and returns the handle of kernel `name`.
fn kernel(rig: &mut Rig, session: u64, name: &str) -> u64 {
    let mut h = header(session, Op::ModuleLoad, &[]);
    h.push_buffer(Direction::In, VADD_PTX.len() as u64).unwrap();
    let module = ok(rig.call(&h, VADD_PTX.as_bytes(), 0).resp)[0];
    let mut h = header(session, Op::ModuleGetFunction, &[module]);
    h.push_buffer(Direction::In, name.len() as u64).unwrap();
    h.push_buffer(Direction::Out, 64).unwrap();
    ok(rig.call(&h, name.as_bytes(), 64).resp)[0]
}

/// Launches `func` as one thread with one pointer parameter.
fn launch(rig: &mut Rig, session: u64, func: u64, ptr: u64) -> ResponseHeader {
    let one = 1u64 | (1 << 32);
    let mut h = header(session, Op::LaunchKernel, &[func, one, one, one, 0, 0]);
    h.flags = FLAG_ASYNC;
    h.push_buffer(Direction::In, 8).unwrap();
    rig.call(&h, &ptr.to_le_bytes(), 0).resp
}

fn read(rig: &mut Rig, session: u64, ptr: u64, len: usize) -> Vec<u8> {
    let mut h = header(session, Op::MemcpyDtoH, &[ptr, 0]);
    h.push_buffer(Direction::Out, len as u64).unwrap();
    let a = rig.call(&h, &[], len);
    ok(a.resp);
    a.out
}

/// Waits until the observer sees at least `want` bytes free (the driver frees a dead
/// process's memory as it tears it down).
fn memory_comes_back(rig: &mut Rig, observer: u64, want: u64) -> u64 {
    let mut free = 0;
    let back = within(Duration::from_secs(15), || {
        free = free_memory(rig, observer);
        free >= want
    });
    assert!(back, "free memory {free}, expected at least {want}");
    free
}

#[test]
fn worker_processes_isolate_sessions_on_the_gpu() {
    let mut rig = Rig::new(worker_binary("warn"), LABEL);
    if rig.host.gpu_count() == 0 {
        println!("skipped: no GPU");
        return;
    }
    let observer = 100;
    let t = Instant::now();
    free_memory(&mut rig, observer);
    println!(
        "first GPU op of a session (worker start, cuInit, context): {:?}",
        t.elapsed()
    );

    // 1. Session 2's kernel writes to session 1's pointer.
    let (a, b) = (1, 2);
    let pa = ok(rig.op(a, Op::Malloc, &[64]))[0];
    ok(rig.op(a, Op::Memset, &[pa, 1, 64, 0]));
    ok(rig.op(a, Op::DeviceSynchronize, &[]));
    let poke = kernel(&mut rig, b, "poke");
    let launched = launch(&mut rig, b, poke, pa);
    let synced = rig.op(b, Op::DeviceSynchronize, &[]);
    println!(
        "session {b}'s kernel writing session {a}'s pointer: launch {}, synchronize {} \
         (flags {})",
        launched.status, synced.status, synced.flags
    );
    assert_eq!(
        read(&mut rig, a, pa, 64),
        vec![1u8; 64],
        "another session's kernel changed this session's memory"
    );
    ok(rig.op(a, Op::Malloc, &[64]));

    // 2. A sticky error stays in its session.
    let f = 3;
    let poke = kernel(&mut rig, f, "poke");
    launch(&mut rig, f, poke, 0x10);
    let r = rig.op(f, Op::DeviceSynchronize, &[]);
    println!("kernel writing to 0x10: status {}", r.status);
    assert!(
        [status::ILLEGAL_ADDRESS, status::LAUNCH_FAILURE].contains(&r.status),
        "{r:?}"
    );
    assert_eq!(r.flags, RESP_FLAG_STICKY);
    let sticky = r.status;
    let r = rig.op(f, Op::Malloc, &[64]);
    assert_eq!((r.status, r.flags), (sticky, RESP_FLAG_STICKY));
    let r = rig.op(f, Op::DeviceCount, &[]);
    assert_eq!((r.status, r.flags), (status::SUCCESS, RESP_FLAG_STICKY));
    // Other sessions, old and new, do not see it.
    ok(rig.op(a, Op::Malloc, &[64]));
    ok(rig.op(4, Op::Malloc, &[64]));
    ok(rig.op(observer, Op::MemGetInfo, &[]));
    // DeviceReset gives the session a new worker, and CUDA works there again.
    let old = rig.table.worker_pid(f).unwrap();
    ok(rig.op(f, Op::DeviceReset, &[]));
    assert!(!is_our_child(old));
    let p = ok(rig.op(f, Op::Malloc, &[64]))[0];
    ok(rig.op(f, Op::Memset, &[p, 7, 64, 0]));
    assert_eq!(read(&mut rig, f, p, 64), vec![7u8; 64]);
    assert_ne!(rig.table.worker_pid(f), Some(old));

    // 3. An endless kernel, ended by the guest process's close with an op in flight.
    let (e, other) = (5, 6);
    ok(rig.op(other, Op::Malloc, &[64]));
    let free_before = free_memory(&mut rig, observer);
    let flag = ok(rig.op(e, Op::Malloc, &[4]))[0];
    ok(rig.op(e, Op::Memset, &[flag, 0, 4, 0]));
    ok(rig.op(e, Op::Malloc, &[256 << 20]));
    let spin = kernel(&mut rig, e, "spin");
    ok(launch(&mut rig, e, spin, flag));
    assert_eq!(rig.op(e, Op::StreamQuery, &[0]).status, status::NOT_READY);
    let during = free_memory(&mut rig, observer);
    assert!(
        free_before.saturating_sub(during) >= 256 << 20,
        "{free_before} -> {during}"
    );
    // Others keep working meanwhile (the GPU time-slices processes).
    let t = Instant::now();
    let p = ok(rig.op(other, Op::Malloc, &[1 << 20]))[0];
    ok(rig.op(other, Op::Memset, &[p, 3, 1 << 20, 0]));
    ok(rig.op(other, Op::DeviceSynchronize, &[]));
    ok(rig.op(other, Op::Free, &[p]));
    println!(
        "another session next to an endless kernel: {:?}",
        t.elapsed()
    );
    let sync = rig.submit(&header(e, Op::StreamSynchronize, &[0]), &[], 0);
    thread::sleep(Duration::from_millis(300));
    assert!(!rig.done.is_done(sync.head));
    let pid = rig.table.worker_pid(e).unwrap();
    let t = Instant::now();
    let close = rig.submit(&header(e, Op::SessionClose, &[]), &[], 0);
    let r = rig.wait(sync, Duration::from_secs(30)).resp;
    assert_eq!(
        (r.status, r.flags),
        (status::LAUNCH_FAILURE, RESP_FLAG_STICKY)
    );
    assert_eq!(
        rig.wait(close, Duration::from_secs(30)).resp.status,
        status::SUCCESS
    );
    println!(
        "closed with an endless kernel in flight: {:?} (worker killed)",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(!is_our_child(pid));
    let after = memory_comes_back(&mut rig, observer, free_before.saturating_sub(16 << 20));
    println!("free memory: before {free_before}, during {during}, after {after}");

    // ... and with none in flight: the worker cannot destroy its context (cuCtxDestroy waits
    // for the kernel), so it is killed after the bound.
    let e2 = 7;
    let free_before = free_memory(&mut rig, observer);
    let flag = ok(rig.op(e2, Op::Malloc, &[4]))[0];
    ok(rig.op(e2, Op::Memset, &[flag, 0, 4, 0]));
    let spin = kernel(&mut rig, e2, "spin");
    ok(launch(&mut rig, e2, spin, flag));
    let pid = rig.table.worker_pid(e2).unwrap();
    let t = Instant::now();
    assert_eq!(rig.op(e2, Op::SessionClose, &[]).status, status::SUCCESS);
    println!("closed with an endless kernel running: {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(!is_our_child(pid));
    memory_comes_back(&mut rig, observer, free_before.saturating_sub(16 << 20));

    for s in [a, b, f, 4, other, observer] {
        assert_eq!(rig.op(s, Op::SessionClose, &[]).status, status::SUCCESS);
    }
    assert_eq!(rig.table.open_count(), 0);
    assert_eq!(children_with(LABEL), Vec::<u32>::new());
}

//! `vhost_cuda::frontend::RequestQueue` (qcuda.ko's request queue, played from a host process)
//! against the daemon binary: both wait modes, requests nobody waits for, more requests than the
//! ring holds, many threads at once, and what it refuses. vhost-cuda-frontend-bench measures
//! through this queue, so its answers must be right before its times mean anything.

mod common;

use std::{sync::Arc, thread, time::Duration};

use common::{scratch_dir, Daemon, WAIT};
use qcuda_proto::{status, Checksum, Direction, Op, RequestHeader, VERSION};
use vhost_cuda::frontend::{FrontendError, GuestVm, QueueWait, RequestQueue, RING_AREA};

fn echo_header(session: u64, len: usize) -> RequestHeader {
    let mut h = RequestHeader::new(Op::Echo);
    h.session = session;
    h.push_buffer(Direction::In, len as u64).unwrap();
    h.push_buffer(Direction::Out, len as u64).unwrap();
    h
}

fn echo(q: &RequestQueue, session: u64, data: &[u8], wait: QueueWait) {
    let r = q
        .call(&echo_header(session, data.len()), data, wait, WAIT)
        .unwrap();
    assert_eq!(r.resp.status, status::SUCCESS);
    assert_eq!(r.resp.rets[0], Checksum::of(data));
    assert!(r.out == data, "echoed bytes differ");
    assert_eq!(r.used_len as usize, data.len() + 64);
}

#[test]
fn request_queue_answers_every_request_right() {
    let dir = scratch_dir("frontend-queue");
    let socket = dir.join("vm.sock");
    let daemon = Daemon::start(&dir, &["--socket-path", socket.to_str().unwrap()]);
    let vm = GuestVm::connect(&socket, 32 << 20, WAIT).unwrap();
    assert!(vm.indirect() && vm.event_idx(), "{vm:?}");
    let q = RequestQueue::start(Arc::new(vm), RING_AREA).unwrap();

    // Hello, each way of waiting.
    for wait in [
        QueueWait::DEFAULT,
        QueueWait::Block,
        QueueWait::Poll(Duration::MAX),
    ] {
        let mut h = RequestHeader::new(Op::Hello);
        h.session = 1;
        h.args[0] = u64::from(VERSION);
        let r = q.call(&h, &[], wait, WAIT).unwrap();
        assert_eq!(
            (r.resp.status, r.resp.rets[0]),
            (status::SUCCESS, u64::from(VERSION))
        );
    }
    // Sleeping callers were woken by the call eventfd: the interrupt thread took interrupts.
    assert!(q.stats().interrupts > 0, "{:?}", q.stats());

    // Echo: empty, small, and the whole of a slot's bounce memory (in + out = 64 KiB).
    let data: Vec<u8> = (0..32 * 1024u32)
        .map(|i| (i * 31 % 251).to_le_bytes()[0])
        .collect();
    for len in [0, 1, 4096, data.len()] {
        echo(&q, 1, &data[..len], QueueWait::DEFAULT);
        echo(&q, 1, &data[..len], QueueWait::Block);
    }

    // Requests nobody waits for, three times as many as the ring holds: their slots come back
    // as the device completes them, and a waited call behind them is answered.
    for i in 0..768u32 {
        q.post(&echo_header(1, 4), &i.to_le_bytes()).unwrap();
    }
    echo(&q, 1, b"after the flood", QueueWait::DEFAULT);

    // Eight threads (guest processes) at once, each its own session and data, both wait modes:
    // every answer is its own caller's.
    thread::scope(|s| {
        for t in 0..8u64 {
            let q = &q;
            s.spawn(move || {
                let wait = if t % 2 == 0 {
                    QueueWait::DEFAULT
                } else {
                    QueueWait::Block
                };
                for i in 0..200u64 {
                    let data = ((t << 32) | i).to_le_bytes();
                    echo(q, 10 + t, &data, wait);
                }
            });
        }
    });
    let st = q.stats();
    assert!(st.chains >= 3 + 8 + 768 + 1 + 1600, "{st:?}");
    assert!(st.kicks <= st.chains, "{st:?}");

    // What does not fit a slot is refused before anything reaches the device.
    let big = vec![0u8; 40 * 1024];
    let e = q
        .call(&echo_header(1, big.len()), &big, QueueWait::DEFAULT, WAIT)
        .unwrap_err();
    assert!(matches!(e, FrontendError::TooLarge(_)), "{e}");
    let e = q
        .call(&echo_header(1, 8), &[0; 4], QueueWait::DEFAULT, WAIT)
        .unwrap_err();
    assert!(matches!(e, FrontendError::TooLarge(_)), "{e}");
    echo(&q, 1, b"still fine", QueueWait::Block);

    drop(q);
    assert!(
        daemon.wait_log("frontend disconnected", 1),
        "{}",
        daemon.log()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! `qcuda-smi worker-calls`: one guest process calling its worker on the host, back to back,
//! for a while: what a daemon restart under a running program must not disturb
//! (scripts/test-restart.sh --keep, tests/guest/check-restart).
//!
//! Each call is `MemGetInfo`, which the host's worker for this process answers (starting it on
//! the first call). Every answer must be the first one's status (success with a GPU,
//! `cudaErrorNoDevice` without) and never sticky: a worker lost with the daemon would answer
//! `cudaErrorLaunchFailure`, sticky. Prints the calls made and the longest wait for one.

use std::{
    io,
    time::{Duration, Instant},
};

use qcuda_proto::{ioctl::IoctlCall, status, Op, RESP_FLAG_STICKY};

use crate::device::Device;

/// Calls for `seconds`; an error names the first answer that differed.
pub fn run(dev: &Device, seconds: u64) -> io::Result<()> {
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut first: Option<u32> = None;
    let (mut calls, mut longest) = (0u64, Duration::ZERO);
    while Instant::now() < end {
        let mut call = IoctlCall::new(Op::MemGetInfo);
        let t = Instant::now();
        loop {
            // SAFETY: MemGetInfo names no buffers.
            match unsafe { dev.call_raw(&mut call) } {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EINPROGRESS)) => {}
                Err(e) => return Err(e),
                Ok(()) => break,
            }
        }
        longest = longest.max(t.elapsed());
        calls += 1;
        let want = *first.get_or_insert(call.status);
        if call.status != want || RESP_FLAG_STICKY & call.resp_flags != 0 {
            return Err(io::Error::other(format!(
                "call {calls}: status {} (flags {:#x}) after {}",
                call.status,
                call.resp_flags,
                status_text(want)
            )));
        }
    }
    println!(
        "worker-calls: {calls} calls, all {}; longest {} ms",
        status_text(first.unwrap_or(status::SUCCESS)),
        longest.as_millis()
    );
    Ok(())
}

fn status_text(s: u32) -> String {
    match s {
        status::SUCCESS => "success".into(),
        status::NO_DEVICE => "cudaErrorNoDevice (no GPU on the host)".into(),
        s => format!("status {s}"),
    }
}

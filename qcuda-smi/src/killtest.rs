// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `qcuda-smi killtest`: processes killed with SIGKILL in the middle of a call. Each child opens
//! its own session and echoes a large buffer in an endless loop; once it has completed a call
//! (so its session exists on the host) the parent waits a random delay, kills it while it is
//! inside the ioctl, and reaps it. The kernel must cancel or complete the request, unpin its
//! pages and close the session; the daemon must free it. Afterwards the parent checks that the
//! transport still works. Whether the daemon ended with zero open sessions is read from its log
//! by the harness.

use std::{
    io::{Read, Write},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::Checksum;

use crate::{
    child_process::{self, ChildEnd},
    device::Device,
    prng::Prng,
    shared_slots::SharedSlots,
    size::Size,
};

/// Options of `killtest`.
#[derive(Debug, Clone)]
pub struct KillOptions {
    /// Children to kill in all.
    pub count: u32,
    /// Children alive at once.
    pub parallel: u32,
    /// Echo size of each child's calls.
    pub size: u64,
    /// Random delay before each kill, in milliseconds: from `min_delay_ms` to `max_delay_ms`.
    pub min_delay_ms: u64,
    /// See `min_delay_ms`.
    pub max_delay_ms: u64,
    /// Seed of the delays.
    pub seed: u64,
}

/// How long a child may take to complete its first call (a TCG guest is slow).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a killed child may take to disappear: the kernel's release path sends the
/// session-close request and waits for it.
const REAP_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the kill test; the error names the first failure.
pub fn run(path: &Path, opts: &KillOptions) -> Result<(), String> {
    println!(
        "killtest: {} children, {} at a time, echo calls of {}, kill after {}..{} ms (seed {})",
        opts.count,
        opts.parallel,
        Size(opts.size),
        opts.min_delay_ms,
        opts.max_delay_ms,
        opts.seed
    );
    let slots = SharedSlots::new(opts.count as usize)
        .map_err(|e| format!("cannot map shared counters: {e}"))?;
    let mut rng = Prng::new(opts.seed);
    let mut killed = 0u32;
    let mut mid_call = 0u32;
    let start = Instant::now();

    let mut next = 0u32;
    while next < opts.count {
        let end = opts.count.min(next + opts.parallel.max(1));
        let batch: Vec<u32> = (next..end).collect();
        next = end;
        let mut children = Vec::new();
        for &i in &batch {
            let (reader, writer) =
                child_process::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
            let slots = &slots;
            let child = child_process::fork(move || {
                let err = call_forever(path, opts.size, slots.get(i as usize));
                let mut w = &writer;
                let _ = w.write_all(err.as_bytes());
                1
            })
            .map_err(|e| format!("fork: {e}"))?;
            children.push((i, child, reader));
        }

        // Every child must be in business (one call done) before any is killed.
        for (i, child, reader) in &mut children {
            let slot = slots.get(*i as usize);
            let waited = Instant::now();
            while slot.calls() == 0 {
                if let Some(end) = child.try_wait().map_err(|e| format!("waitpid: {e}"))? {
                    return Err(format!(
                        "child {i} (pid {}) ended before its first call completed: {} ({end})",
                        child.pid(),
                        report(reader)
                    ));
                }
                if waited.elapsed() > READY_TIMEOUT {
                    return Err(format!(
                        "child {i} (pid {}) did not complete a call within {} s",
                        child.pid(),
                        READY_TIMEOUT.as_secs()
                    ));
                }
                thread::sleep(Duration::from_millis(2));
            }
        }

        for (i, mut child, mut reader) in children {
            let slot = slots.get(i as usize);
            let delay = rng.range(opts.min_delay_ms, opts.max_delay_ms.max(opts.min_delay_ms));
            thread::sleep(Duration::from_millis(delay));
            // Between two calls a child spends only a few instructions, so this wait is short;
            // it makes "killed inside the ioctl" the rule rather than the odds.
            let spin = Instant::now();
            while !slot.in_call() && spin.elapsed() < Duration::from_millis(100) {
                std::hint::spin_loop();
            }
            let inside = slot.in_call();
            child
                .kill()
                .map_err(|e| format!("kill child {i} (pid {}): {e}", child.pid()))?;
            let end = child
                .wait_timeout(REAP_TIMEOUT)
                .map_err(|e| format!("waitpid: {e}"))?;
            match end {
                Some(ChildEnd::Signaled(libc::SIGKILL)) => {}
                Some(end) => {
                    return Err(format!(
                        "child {i} (pid {}) ended by itself before the kill: {} ({end})",
                        child.pid(),
                        report(&mut reader)
                    ))
                }
                None => {
                    return Err(format!(
                        "child {i} (pid {}) still exists {} s after SIGKILL: stuck in the kernel?",
                        child.pid(),
                        REAP_TIMEOUT.as_secs()
                    ))
                }
            }
            killed += 1;
            mid_call += u32::from(inside);
            println!(
                "killtest: child {:>3}/{} pid {:>6} killed after {delay:>3} ms, {} call(s) done, {}",
                i + 1,
                opts.count,
                child.pid(),
                slot.calls(),
                if inside { "mid-call" } else { "between calls" }
            );
        }
    }

    println!(
        "killtest: {killed} killed in {:.1} s, {mid_call} of them inside a call",
        start.elapsed().as_secs_f64()
    );
    check_transport_after(path)?;
    println!("killtest: {killed} killed");
    Ok(())
}

/// The child: open a session and echo `size` bytes until killed. Returns only on failure, with
/// the reason.
fn call_forever(path: &Path, size: u64, slot: &crate::shared_slots::Slot) -> String {
    use std::sync::atomic::Ordering::SeqCst;
    let dev = match Device::open(path) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let Ok(len) = usize::try_from(size) else {
        return format!("an echo of {} does not fit in memory", Size(size));
    };
    let mut input = vec![0u8; len];
    Prng::new(size).fill(&mut input);
    let want = Checksum::of(&input);
    let mut output = vec![0u8; len];
    loop {
        slot.in_call.store(1, SeqCst);
        let result = dev.echo(&input, &mut output);
        slot.in_call.store(0, SeqCst);
        match result {
            Ok(sum) if sum == want => {}
            Ok(sum) => return format!("checksum {sum:#018x}, expected {want:#018x}"),
            Err(e) => return format!("echo of {}: {e}", Size(size)),
        }
        slot.calls.fetch_add(1, SeqCst);
    }
}

/// What a child wrote before it exited.
fn report(reader: &mut impl Read) -> String {
    let mut text = String::new();
    let _ = reader.read_to_string(&mut text);
    if text.is_empty() {
        "no report".into()
    } else {
        text
    }
}

/// A fresh session must still get answers once all the killed ones are gone.
fn check_transport_after(path: &Path) -> Result<(), String> {
    let dev = Device::open(path)?;
    let hello = dev
        .hello()
        .map_err(|e| format!("hello after the kills: {e}"))?;
    let mut input = vec![0u8; 1 << 20];
    Prng::new(1).fill(&mut input);
    let mut output = vec![0u8; input.len()];
    let sum = dev
        .echo(&input, &mut output)
        .map_err(|e| format!("echo after the kills: {e}"))?;
    if sum != Checksum::of(&input) || output != input {
        return Err("echo after the kills returned wrong data".into());
    }
    // Informational: other processes may legitimately hold sessions; the harness decides.
    println!(
        "killtest: a new session still works; the host reports {} session(s) open, this one included",
        hello.sessions
    );
    Ok(())
}

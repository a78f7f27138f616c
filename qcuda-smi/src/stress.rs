// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `qcuda-smi stress`: many sessions with many calls in flight at once. `procs` processes
//! (one session each) run `threads` threads each (concurrent calls on one session), and every
//! thread issues `iters` echo calls of seeded random sizes and offsets, verifying the copied
//! bytes and the host's checksum of each. Completions may come back in any order; a call that
//! gets another call's data, or a torn one, shows up as a mismatch.

use std::{
    io::{Read, Write},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{Checksum, BOUNCE_THRESHOLD};

use crate::{
    child_process::{self, ChildEnd},
    device::Device,
    prng::Prng,
    size::Size,
};

/// Options of `stress`.
#[derive(Debug, Clone)]
pub struct StressOptions {
    /// Processes (sessions).
    pub procs: u32,
    /// Threads per process.
    pub threads: u32,
    /// Calls per thread.
    pub iters: u64,
    /// Largest echo size.
    pub max_size: u64,
    /// Seed; each worker derives its own generator from it.
    pub seed: u64,
}

/// Largest misalignment of a buffer start.
const MAX_OFFSET: usize = 64;

/// A random echo size: log-uniform up to `max`, so small (bounce) and large (pinned) calls are
/// both common, with the bounce threshold and its neighbours picked on purpose now and then.
pub fn random_size(rng: &mut Prng, max: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    let pick = rng.below(16);
    if pick == 0 && max > BOUNCE_THRESHOLD {
        return BOUNCE_THRESHOLD + rng.below(2);
    }
    if pick == 1 {
        return rng.below(2); // empty and one-byte calls
    }
    let bits = 64 - u64::from(max.leading_zeros()); // max < 2^bits
    let top = 1u64 << rng.below(bits.max(1));
    rng.range(1, top.min(max).max(1))
}

/// A random misalignment of a buffer start, below `MAX_OFFSET`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "below(MAX_OFFSET) is less than MAX_OFFSET, a usize"
)]
fn random_offset(rng: &mut Prng) -> usize {
    rng.below(MAX_OFFSET as u64) as usize
}

/// What one worker thread did.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    calls: u64,
    bytes: u64,
}

/// Runs the stress test; the error names the first failure.
pub fn run(path: &Path, opts: &StressOptions) -> Result<(), String> {
    println!(
        "stress: {} processes x {} threads x {} calls, sizes up to {}, seed {}",
        opts.procs,
        opts.threads,
        opts.iters,
        Size(opts.max_size),
        opts.seed
    );
    let start = Instant::now();
    let mut children = Vec::new();
    for proc in 0..opts.procs {
        let (reader, writer) =
            child_process::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
        let opts_c = opts.clone();
        let child = child_process::fork(move || {
            let report = stress_process(path, &opts_c, proc);
            let mut w = &writer;
            let line = match &report {
                Ok(t) => format!("ok {} {}\n", t.calls, t.bytes),
                Err(e) => format!("fail {e}\n"),
            };
            let _ = w.write_all(line.as_bytes());
            i32::from(report.is_err())
        })
        .map_err(|e| format!("fork: {e}"))?;
        // `writer` went into the closure, so the parent's copy closed when fork returned and
        // the reader sees EOF once the child is gone.
        children.push((proc, child, reader));
    }

    let mut total = Tally::default();
    let mut failures = Vec::new();
    for (proc, mut child, mut reader) in children {
        // Reading to EOF waits for the child to finish; a hung call hangs here, which the
        // harness's timeout turns into a failure.
        let mut report = String::new();
        let _ = reader.read_to_string(&mut report);
        let end = child
            .wait_timeout(Duration::from_secs(60))
            .map_err(|e| format!("waitpid: {e}"))?;
        let fields: Vec<&str> = report.split_whitespace().collect();
        match (end, fields.as_slice()) {
            (Some(ChildEnd::Exited(0)), ["ok", calls, bytes]) => {
                total.calls += calls.parse::<u64>().unwrap_or(0);
                total.bytes += bytes.parse::<u64>().unwrap_or(0);
            }
            (end, _) => failures.push(format!(
                "process {proc} (pid {}): {} [{}]",
                child.pid(),
                report.trim().strip_prefix("fail ").unwrap_or(report.trim()),
                end.map_or("did not exit".to_string(), |e| e.to_string())
            )),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "stress: {} calls, {:.1} MiB echoed each way in {secs:.2} s ({:.0} calls/s, {:.1} MB/s)",
        total.calls,
        total.bytes as f64 / f64::from(1u32 << 20),
        total.calls as f64 / secs,
        total.bytes as f64 / secs / 1e6
    );
    if let Some(first) = failures.first() {
        for f in &failures {
            println!("stress: FAIL {f}");
        }
        return Err(format!(
            "{} of {} processes failed; first: {first}",
            failures.len(),
            opts.procs
        ));
    }
    let want = u64::from(opts.procs) * u64::from(opts.threads) * opts.iters;
    if total.calls != want {
        return Err(format!("{} calls verified, expected {want}", total.calls));
    }
    println!("stress: PASS");
    Ok(())
}

/// One process: its own session, `threads` threads sharing it.
fn stress_process(path: &Path, opts: &StressOptions, proc: u32) -> Result<Tally, String> {
    let dev = Device::open(path)?;
    thread::scope(|s| {
        let workers: Vec<_> = (0..opts.threads)
            .map(|t| {
                let dev = &dev;
                s.spawn(move || stress_thread(dev, opts, proc, t))
            })
            .collect();
        let mut tally = Tally::default();
        for w in workers {
            let t = w
                .join()
                .map_err(|_| "a worker thread panicked".to_string())??;
            tally.calls += t.calls;
            tally.bytes += t.bytes;
        }
        Ok(tally)
    })
}

fn stress_thread(
    dev: &Device,
    opts: &StressOptions,
    proc: u32,
    thread: u32,
) -> Result<Tally, String> {
    let mut rng = Prng::for_worker(opts.seed, u64::from(proc), u64::from(thread));
    let max_len = usize::try_from(opts.max_size)
        .map_err(|_| format!("an echo of {} does not fit in memory", Size(opts.max_size)))?;
    let room = max_len + MAX_OFFSET + 1;
    let mut input = vec![0u8; room];
    let mut output = vec![0u8; room];
    let mut tally = Tally::default();
    for iter in 0..opts.iters {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "random_size stays within max_size, which fits in usize (checked above)"
        )]
        let len = random_size(&mut rng, opts.max_size) as usize;
        let in_off = random_offset(&mut rng);
        let out_off = random_offset(&mut rng);
        let src = &mut input[in_off..in_off + len];
        rng.fill(src);
        let dst = &mut output[out_off..out_off + len];
        // A different poison each call, so stale bytes from the previous call show as well.
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the poison follows the low byte of the call number; truncation intended"
        )]
        let poison = iter as u8 ^ 0x5a;
        dst.fill(poison);
        let what = || {
            format!(
                "thread {thread}, call {iter}: echo of {} at offsets {in_off}/{out_off}",
                Size(len as u64)
            )
        };
        let sum = dev.echo(src, dst).map_err(|e| format!("{}: {e}", what()))?;
        let want = Checksum::of(src);
        if sum != want {
            return Err(format!(
                "{}: host checksum {sum:#018x}, expected {want:#018x}",
                what()
            ));
        }
        if let Some(i) = (0..len).find(|&i| dst[i] != src[i]) {
            return Err(format!(
                "{}: output differs at byte {i}: got {:#04x}, sent {:#04x}",
                what(),
                dst[i],
                src[i]
            ));
        }
        tally.calls += 1;
        tally.bytes += len as u64;
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_stay_in_range_and_hit_both_transport_paths() {
        let mut rng = Prng::new(3);
        let max = 1 << 20;
        let (mut bounce, mut pinned, mut empty, mut threshold) = (0, 0, 0, 0);
        for _ in 0..10_000 {
            let s = random_size(&mut rng, max);
            assert!(s <= max);
            match s {
                0 => empty += 1,
                s if s == BOUNCE_THRESHOLD || s == BOUNCE_THRESHOLD + 1 => threshold += 1,
                s if s <= BOUNCE_THRESHOLD => bounce += 1,
                _ => pinned += 1,
            }
        }
        assert!(
            empty > 0 && threshold > 100 && bounce > 1000 && pinned > 1000,
            "empty {empty}, threshold {threshold}, bounce {bounce}, pinned {pinned}"
        );
    }

    #[test]
    fn small_maxima_work() {
        let mut rng = Prng::new(4);
        for max in [0u64, 1, 2, 100] {
            for _ in 0..100 {
                assert!(random_size(&mut rng, max) <= max);
            }
        }
    }

    #[test]
    fn seeds_reproduce() {
        let a: Vec<u64> = {
            let mut r = Prng::for_worker(9, 1, 2);
            (0..20).map(|_| random_size(&mut r, 1 << 20)).collect()
        };
        let b: Vec<u64> = {
            let mut r = Prng::for_worker(9, 1, 2);
            (0..20).map(|_| random_size(&mut r, 1 << 20)).collect()
        };
        assert_eq!(a, b);
    }
}

//! The daemon's ceiling: many VMs (one connection each), several sessions (guest processes)
//! each, all sending waited requests back to back for a few seconds; the requests per second
//! the one daemon served, for 1, 2, 4, ... VMs and 1 or M sessions per VM.

use std::{
    path::PathBuf,
    sync::{Arc, Barrier},
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{Op, VERSION};
use vhost_cuda::frontend::QueueWait;

use crate::{
    args::Args,
    report::Report,
    session::{RowError, Session},
    vm::connect,
};

/// What each session sends.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// Echo of 0 bytes: answered by the daemon's session thread, no worker.
    Echo,
    /// StreamQuery of the legacy stream: the hop to the worker and a driver call.
    Query,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Echo => "echo",
            Load::Query => "query",
        }
    }

    fn send(self, s: &Session<'_>) -> Result<(), RowError> {
        match self {
            Load::Echo => s.ok_with(Op::Echo, &[], &[], 0).map(drop),
            Load::Query => s.ok(Op::StreamQuery, &[0]).map(drop),
        }
    }
}

/// Counts in 1, 2, 4, ... up to and including `max`.
fn steps(max: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::iter::successors(Some(1u32), |n| n.checked_mul(2))
        .take_while(|&n| n < max)
        .collect();
    v.push(max.max(1));
    v
}

/// Runs every configuration and prints one row each: `ceiling_<load>_<V>vm_<S>sess`, requests
/// per second of all sessions together.
pub fn sweep(r: &mut Report, args: &Args, sockets: &[PathBuf], gpu: bool, timeout: Duration) {
    let vms = args
        .vms
        .min(u32::try_from(sockets.len()).unwrap_or(u32::MAX))
        .max(1);
    if vms < args.vms {
        eprintln!(
            "frontend: the daemon serves {} socket(s): the ceiling stops at {vms} VM(s) \
             (run it with --socket-count {} and pass the same here)",
            sockets.len(),
            args.vms
        );
    }
    let mut sessions = vec![1];
    if args.sessions > 1 {
        sessions.push(args.sessions);
    }
    let loads: &[Load] = if gpu {
        &[Load::Echo, Load::Query]
    } else {
        &[Load::Echo]
    };
    let seconds = Duration::from_secs_f64(args.seconds.max(0.1));
    for &load in loads {
        for v in steps(vms) {
            for &m in &sessions {
                let metric = format!("ceiling_{}_{v}vm_{m}sess", load.name());
                r.row(&metric, 0, "req/s", || {
                    run(&sockets[..v as usize], m, load, seconds, timeout)
                });
            }
        }
    }
}

/// `m` sessions on each of the VMs at `sockets` sending `load` for `seconds`.
fn run(
    sockets: &[PathBuf],
    m: u32,
    load: Load,
    seconds: Duration,
    timeout: Duration,
) -> Result<(f64, String), RowError> {
    let queues = sockets
        .iter()
        .map(|p| connect(p, 0, timeout))
        .collect::<Result<Vec<_>, _>>()?;
    let threads = queues.len() * m as usize;
    let start = Arc::new(Barrier::new(threads + 1));
    let results = thread::scope(|scope| {
        let handles: Vec<_> = queues
            .iter()
            .flat_map(|q| (1..=u64::from(m)).map(move |id| (q, id)))
            .map(|(q, id)| {
                let start = start.clone();
                scope.spawn(move || -> Result<(u64, f64), RowError> {
                    let s = Session {
                        queue: q,
                        id,
                        wait: QueueWait::DEFAULT,
                        timeout,
                    };
                    // Open the session (and its worker) before the clock starts.
                    let ready = s
                        .ok(Op::Hello, &[u64::from(VERSION)])
                        .and_then(|_| load.send(&s));
                    start.wait();
                    ready?;
                    let t = Instant::now();
                    let mut n = 0u64;
                    while t.elapsed() < seconds {
                        load.send(&s)?;
                        n += 1;
                    }
                    let el = t.elapsed().as_secs_f64();
                    let _ = s.close();
                    Ok((n, el))
                })
            })
            .collect();
        start.wait();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(RowError::Wrong("a session thread panicked".into())))
            })
            .collect::<Vec<_>>()
    });
    let mut total = 0.0;
    let mut count = 0u64;
    for res in results {
        let (n, el) = res?;
        total += n as f64 / el;
        count += n;
    }
    let chains: u64 = queues.iter().map(|q| q.stats().chains).sum();
    let kicks: u64 = queues.iter().map(|q| q.stats().kicks).sum();
    Ok((
        total,
        format!(
            "{} VM(s) x {m} session(s), {count} requests in {:.1} s ({:.1} us each per session; \
             {kicks} kicks for {chains} chains)",
            sockets.len(),
            seconds.as_secs_f64(),
            threads as f64 * 1e6 / total.max(1e-9),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::steps;

    #[test]
    fn steps_double_up_to_max() {
        assert_eq!(steps(1), vec![1]);
        assert_eq!(steps(4), vec![1, 2, 4]);
        assert_eq!(steps(6), vec![1, 2, 4, 6]);
    }
}

//! How much is repeated ([`Plan`]) and how rows are measured and printed ([`Report`],
//! [`mean_us`]).

use std::{
    io::Write,
    time::{Duration, Instant},
};

use vhost_cuda::frontend::RequestQueue;

use crate::session::RowError;

/// How much to repeat (qcuda_bench's plan: full, or a tenth with --quick).
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub small_calls: u32,
    pub launch_sync: u32,
    pub launch_async: u32,
    pub malloc_free: u32,
    pub module_loads: u32,
    /// A copy size is repeated until about this much time is spent, 5 to 1000 times.
    pub target: Duration,
}

impl Plan {
    pub fn new(quick: bool) -> Self {
        let d = if quick { 10 } else { 1 };
        Self {
            small_calls: 2000 / d,
            launch_sync: 2000 / d,
            launch_async: 100_000 / d,
            malloc_free: 1000 / d,
            module_loads: 200 / d,
            target: Duration::from_millis(300),
        }
    }
}

/// Prints rows and progress; remembers whether anything was wrong.
#[derive(Debug, Default)]
pub struct Report {
    pub rows: usize,
    pub failed: bool,
}

fn size_label(bytes: u64) -> String {
    match bytes {
        0 => "-".into(),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

impl Report {
    /// [`Self::row`], adding to its progress line what the guest's exits would have been:
    /// the chains `queue` carried meanwhile, the kicks the device asked for and the interrupts.
    pub fn counted_row(
        &mut self,
        queue: &RequestQueue,
        metric: &str,
        bytes: u64,
        unit: &str,
        m: impl FnOnce() -> Result<(f64, String), RowError>,
    ) {
        let before = queue.stats();
        self.row(metric, bytes, unit, || {
            let (v, how) = m()?;
            let after = queue.stats();
            Ok((
                v,
                format!(
                    "{how}; {} chains, {} kicks, {} interrupts",
                    after.chains - before.chains,
                    after.kicks - before.kicks,
                    after.interrupts - before.interrupts
                ),
            ))
        });
    }

    /// One measurement: its row, or NA and why; a wrong answer is a FAIL.
    pub fn row(
        &mut self,
        metric: &str,
        bytes: u64,
        unit: &str,
        m: impl FnOnce() -> Result<(f64, String), RowError>,
    ) {
        match m() {
            Ok((v, how)) => {
                println!("{metric},{bytes},{v:.3},{unit}");
                eprintln!(
                    "frontend: {metric:<24} {:>8} {v:>12.3} {unit:<7} {how}",
                    size_label(bytes)
                );
                self.rows += 1;
            }
            Err(RowError::Wrong(why)) => {
                println!("FAIL vhost-cuda-frontend-bench: {metric}: {why}");
                self.failed = true;
            }
            Err(e) => {
                println!("{metric},{bytes},NA,{unit}");
                eprintln!("frontend: {metric:<24} {:>8}  NA: {e}", size_label(bytes));
            }
        }
        let _ = std::io::stdout().flush();
    }
}

/// Mean microseconds of `n` calls of `f`, after min(n, 10) warm-up calls.
pub fn mean_us(
    n: u32,
    mut f: impl FnMut(u32) -> Result<(), RowError>,
) -> Result<(f64, String), RowError> {
    for i in 0..n.min(10) {
        f(i)?;
    }
    let t = Instant::now();
    for i in 0..n {
        f(i)?;
    }
    Ok((
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n.max(1)),
        format!("mean of {n}"),
    ))
}

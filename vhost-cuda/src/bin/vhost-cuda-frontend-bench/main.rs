//! vhost-cuda-frontend-bench: qcuda's own cost at native CPU speed.
//!
//! Connects to a running `vhost-cuda` as QEMU does (vhost-user, memfd guest RAM, the rings),
//! plays qcuda.ko's request queue in this process (`vhost_cuda::frontend`) and sends the
//! requests guest-lib sends for the calls `qcuda_bench` measures: the round trip of qcuda's
//! whole host side (ring, daemon, hop, worker, driver) without a guest CPU in the way, waited
//! for both ways qcuda.ko waits (polling the used ring; sleeping until the call eventfd).
//! Then many VMs and sessions at once: the requests per second one daemon serves.
//!
//! stdout is CSV, "metric,bytes,value,unit" (qcuda_bench's row names where the call is the
//! same); stderr is progress. Without a GPU (the daemon reports none) the rows that need one
//! are left out with one "skipped: no GPU" line. A wrong answer is a FAIL line and exit 1; a
//! frontend that cannot connect exits 2. docs/perf/frontend.md explains the rows.

mod ceiling;
mod latency;
mod session;

// The benchmark loads one of the tests' images (the file allows what it leaves unused).
#[path = "../../cuda/test_kernels.rs"]
mod test_kernels;

use std::{
    io::Write,
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::{Parser, ValueEnum};
use qcuda_proto::{status, Op, HOST_PAGE_SIZE, VERSION};
use vhost_cuda::frontend::{GuestVm, QueueWait, RequestQueue, RING_AREA, SLOT_BYTES};

use crate::session::{RowError, Session};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Group {
    /// Round trips of single calls, both wait modes, and launches.
    Latency,
    /// 64 and 256 MiB copies from registered guest RAM.
    Copy,
    /// Requests per second of many VMs and sessions at once.
    Ceiling,
}

#[derive(Parser, Debug)]
#[command(name = "vhost-cuda-frontend-bench", version, about)]
struct Args {
    /// The daemon's socket (vhost-cuda --socket-path).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// The daemon serves this many sockets, PATH.0 ... PATH.(N-1) (its --socket-count); the
    /// ceiling's VMs connect to them in turn.
    #[arg(long, value_name = "N", default_value_t = 1)]
    socket_count: u32,
    /// What to measure (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "latency,copy,ceiling"
    )]
    only: Vec<Group>,
    /// A tenth of the repetitions.
    #[arg(long)]
    quick: bool,
    /// The largest copy (64 MiB and 256 MiB up to it; suffixes K, M, G).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "256M")]
    max_bytes: u64,
    /// The ceiling: VMs at most (1, 2, 4, ... up to it; at most --socket-count).
    #[arg(long, value_name = "N", default_value_t = 4)]
    vms: u32,
    /// The ceiling: sessions (guest processes) per VM at most (1 and this).
    #[arg(long, value_name = "M", default_value_t = 4)]
    sessions: u32,
    /// The ceiling: seconds each configuration runs.
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    seconds: f64,
    /// Seconds one request may take before the benchmark gives up on it.
    #[arg(long, value_name = "S", default_value_t = 30)]
    timeout: u64,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("not a byte count: {s}"))
}

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
    fn new(quick: bool) -> Self {
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

/// Guest RAM of a VM: rings, the request slots, then (from [`PINNED_AT`]) the "pinned" memory
/// the copies use.
pub const PINNED_AT: u64 = 32 << 20;
const _: () = assert!(RING_AREA + 256 * SLOT_BYTES <= PINNED_AT);

/// The sockets the daemon serves.
fn sockets(args: &Args) -> Vec<PathBuf> {
    if args.socket_count <= 1 {
        return vec![args.socket.clone()];
    }
    (0..args.socket_count)
        .map(|i| {
            let mut s = args.socket.clone().into_os_string();
            s.push(format!(".{i}"));
            s.into()
        })
        .collect()
}

/// Connects one VM with `extra` bytes of RAM above [`PINNED_AT`] and starts its queue.
pub fn connect(
    socket: &std::path::Path,
    extra: u64,
    timeout: Duration,
) -> Result<RequestQueue, RowError> {
    let ram = PINNED_AT + extra.next_multiple_of(HOST_PAGE_SIZE);
    let vm = GuestVm::connect(socket, usize::try_from(ram).unwrap_or(usize::MAX), timeout)?;
    Ok(RequestQueue::start(Arc::new(vm), RING_AREA)?)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = Plan::new(args.quick);
    let timeout = Duration::from_secs(args.timeout);
    let sockets = sockets(&args);
    let copy_sizes: Vec<u64> = [64u64 << 20, 256 << 20]
        .into_iter()
        .filter(|&b| b <= args.max_bytes)
        .collect();
    let want = |g| args.only.contains(&g);
    let pinned = if want(Group::Copy) {
        copy_sizes.iter().copied().max().unwrap_or(0)
    } else {
        0
    };
    let mut report = Report::default();

    let queue = match connect(&sockets[0], pinned, timeout) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("vhost-cuda-frontend-bench: {}: {e}", sockets[0].display());
            return ExitCode::from(2);
        }
    };
    let s = Session {
        queue: &queue,
        id: 1,
        wait: QueueWait::DEFAULT,
        timeout,
    };
    let hello = match s.call(Op::Hello, &[u64::from(VERSION)], &[], 0) {
        Ok(r) if r.resp.status == status::SUCCESS && r.resp.rets[0] == u64::from(VERSION) => r.resp,
        Ok(r) => {
            println!(
                "FAIL vhost-cuda-frontend-bench: Hello answered {:?}",
                r.resp
            );
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("vhost-cuda-frontend-bench: Hello: {e}");
            return ExitCode::from(2);
        }
    };
    let gpus = hello.rets[1];
    eprintln!(
        "frontend: {} ({} GPU(s), driver {}), features {:#x}",
        sockets[0].display(),
        gpus,
        hello.rets[2],
        queue.vm().features
    );
    if want(Group::Latency) {
        latency::transport_rows(&mut report, &plan, &s);
    }
    if gpus == 0 {
        if want(Group::Latency) {
            latency::no_device_row(&mut report, &plan, &s);
        }
        println!("skipped: no GPU (the daemon reports none): the rows that need one are left out");
    } else {
        if want(Group::Latency) {
            latency::gpu_rows(&mut report, &plan, &s);
        }
        if want(Group::Copy) {
            latency::copy_rows(&mut report, &plan, &s, &copy_sizes);
        }
    }
    let st = queue.stats();
    eprintln!(
        "frontend: {} chains, {} kicks, {} interrupts",
        st.chains, st.kicks, st.interrupts
    );
    let _ = s.close();
    // The ceiling's VMs connect afresh; the daemon serves one VM per socket.
    drop(queue);
    if want(Group::Ceiling) {
        ceiling::sweep(&mut report, &args, &sockets, gpus > 0, timeout);
    }
    if report.failed {
        return ExitCode::from(1);
    }
    eprintln!("frontend: {} rows", report.rows);
    ExitCode::SUCCESS
}

//! The command line: what to measure, where the daemon is, how long and how much.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Group {
    /// Round trips of single calls, both wait modes, and launches.
    Latency,
    /// 64 and 256 MiB copies from registered guest RAM.
    Copy,
    /// Requests per second of many VMs and sessions at once.
    Ceiling,
}

#[derive(Parser, Debug)]
#[command(name = "vhost-cuda-frontend-bench", version, about)]
pub struct Args {
    /// The daemon's socket (vhost-cuda --socket-path).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The daemon serves this many sockets, PATH.0 ... PATH.(N-1) (its --socket-count); the
    /// ceiling's VMs connect to them in turn.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub socket_count: u32,
    /// What to measure (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "latency,copy,ceiling"
    )]
    pub only: Vec<Group>,
    /// A tenth of the repetitions.
    #[arg(long)]
    pub quick: bool,
    /// The largest copy (64 MiB and 256 MiB up to it; suffixes K, M, G).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "256M")]
    pub max_bytes: u64,
    /// The ceiling: VMs at most (1, 2, 4, ... up to it; at most --socket-count).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub vms: u32,
    /// The ceiling: sessions (guest processes) per VM at most (1 and this).
    #[arg(long, value_name = "M", default_value_t = 4)]
    pub sessions: u32,
    /// The ceiling: seconds each configuration runs.
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    pub seconds: f64,
    /// Seconds one request may take before the benchmark gives up on it.
    #[arg(long, value_name = "S", default_value_t = 30)]
    pub timeout: u64,
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

/// The sockets the daemon serves.
pub fn sockets(args: &Args) -> Vec<PathBuf> {
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

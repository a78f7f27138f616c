// SPDX-License-Identifier: Apache-2.0 OR MIT
//! qcuda-smi: the guest's view of the qcuda transport, in the spirit of nvidia-smi.
//!
//! It talks to `/dev/qcuda` (qcuda.ko) directly with the generic call ioctl of qcuda-proto,
//! bypassing guest-lib, so it can list the host's GPUs and test the transport on its own:
//! `selftest` (echo over every size class, refused calls), `stress` (many sessions and threads
//! with calls in flight), `killtest` (processes killed mid-call) and
//! `killprog` (copies of a CUDA program killed at random points); `sessions` prints how many
//! sessions the host has open, `processes` what each process of this VM holds on the host, and
//! `memory` the GPU memory this VM holds; `trace` records a process's GPU timeline on the host
//! (trace.rs); `loader` says which driver files programs get. docs/testing.md describes how the
//! in-VM tests use it.

mod call_plan;
mod child_process;
mod device;
mod host_info;
mod hostile;
mod killprog;
mod killtest;
mod loader;
mod page_buffer;
mod prng;
mod selftest;
mod shared_slots;
mod size;
mod stress;
mod trace;
mod vm_usage;
mod worker_calls;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use qcuda_proto::ioctl::DEVICE_PATH;

/// List the host GPUs seen through /dev/qcuda, or test the qcuda transport.
#[derive(Debug, Parser)]
#[command(name = "qcuda-smi", version)]
struct Args {
    /// The qcuda device node.
    #[arg(long, global = true, default_value = DEVICE_PATH)]
    device: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the number of sessions the host has open on this VM's device, this one included
    /// (1 when no other process has /dev/qcuda open).
    Sessions,
    /// This VM's processes that use qcuda, as the host accounts them: pid, GPU memory (now
    /// and at most), kernels and graphs launched, name; and the VM's GPU memory against its
    /// limit. Only this VM's processes are listed.
    Processes {
        /// One comma-separated line per process, after a header line, for scripts.
        #[arg(long)]
        csv: bool,
    },
    /// Print the bytes of GPU memory this VM's processes hold on the host now (the host's
    /// accounting of this VM alone, whoever else uses the GPU).
    Memory,
    /// Echo over sizes from 0 B to --max-size, checking data and checksums, then check that
    /// malformed calls are refused.
    Selftest {
        /// Largest echo (e.g. 64M, 256M). Transfers over one buffer's maximum (64 MiB) are
        /// split into calls.
        #[arg(long, default_value = "256M", value_parser = size::parse_size)]
        max_size: u64,
        /// Seed of the test data.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Processes x threads issuing random-size echo calls concurrently, all verified.
    Stress {
        /// Processes, each its own session.
        #[arg(long, default_value_t = 8)]
        procs: u32,
        /// Threads per process, sharing its session.
        #[arg(long, default_value_t = 4)]
        threads: u32,
        /// Calls per thread.
        #[arg(long, default_value_t = 200)]
        iters: u64,
        /// Largest echo.
        #[arg(long, default_value = "1M", value_parser = size::parse_size)]
        max_size: u64,
        /// Seed of sizes, offsets and data.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Round-trip latency of the transport: Hello (answered by the daemon), fire-and-forget
    /// Hello, 64 B and 4 KiB Echo (bounce buffers), each `count` times, and a 4 MiB Echo
    /// (2048 pinned pages in all, as many as guest-lib's 8 MiB copy chunk) `count / 100`
    /// times, waiting in each of qcuda.ko's three ways; microseconds per call. First the floor: an ioctl the module refuses at once.
    Latency {
        /// Calls of each kind.
        #[arg(long, default_value_t = 2000)]
        count: u32,
    },
    /// One process calling its worker on the host (MemGetInfo) back to back for SECONDS;
    /// every answer must be the first one's, never sticky (a daemon restart meanwhile must
    /// change nothing). Prints the calls and the longest wait for one.
    WorkerCalls {
        /// How long to call.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Children in endless large echo calls, each killed with SIGKILL mid-call and reaped.
    Killtest {
        /// Children to kill.
        #[arg(long, default_value_t = 100)]
        count: u32,
        /// Children alive at once.
        #[arg(long, default_value_t = 4)]
        parallel: u32,
        /// Echo size of the children's calls. 4 MiB in plus 4 MiB out is the largest echo whose
        /// pinned pages always fit in one chain (MAX_CHAIN_SEGMENTS), even when scattered.
        #[arg(long, default_value = "4M", value_parser = size::parse_size)]
        size: u64,
        /// Shortest delay before a kill, in ms.
        #[arg(long, default_value_t = 5)]
        min_delay_ms: u64,
        /// Longest delay before a kill, in ms.
        #[arg(long, default_value_t = 200)]
        max_delay_ms: u64,
        /// Seed of the delays.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Which files the dynamic loader gives for libcuda.so.1, libcuda.so, libnvidia-ml.so.1,
    /// libnvidia-ml.so and the fixed paths some frameworks open; fails when one is not qcuda's
    /// (another CUDA driver comes first). Needs no device.
    Loader,
    /// Record the GPU timeline of process PID for SECONDS on the host, where its GPU work runs:
    /// its kernels, copies, memsets and synchronisations with GPU times, and its requests as
    /// the host received them. Writes a Chrome/Perfetto trace (-o) and prints a summary (top
    /// kernels, copy bandwidth, GPU busy fraction). Your own processes, or any of this VM's as
    /// root.
    Trace {
        /// The process to trace.
        #[arg(long)]
        pid: u32,
        /// How long to record (1..3600).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// The trace file (trace-event JSON: ui.perfetto.dev, chrome://tracing).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Records the host may hold between reads (0: its default, 262144).
        #[arg(long, default_value_t = 0)]
        records: u64,
    },
    /// Merge a qcuda trace (qcuda-smi trace -o, QCUDA_PROFILE) into a Chrome trace the guest
    /// made (torch.profiler's export_chrome_trace), on the guest's clock.
    TraceMerge {
        /// The guest's trace (its events and time base are kept).
        #[arg(long)]
        torch: PathBuf,
        /// The qcuda trace.
        #[arg(long)]
        qcuda: PathBuf,
        /// The merged trace.
        #[arg(short, long)]
        output: PathBuf,
        /// The clock of the guest's trace: realtime (torch.profiler) or monotonic.
        #[arg(long, value_enum, default_value_t = trace::MergeClock::Realtime)]
        clock: trace::MergeClock,
    },
    /// Hostile raw calls: garbage and truncated module images, wrong parameter sizes, handles
    /// and pointers never issued, huge allocations, a fire-and-forget flood, 4000 descriptors;
    /// each must be refused with an error, and the session must still work.
    Hostile,
    /// Copies of a CUDA program (run until killed, printing "progress N" lines), each killed
    /// with SIGKILL a random delay after its start; then no session and no held page may be
    /// left.
    Killprog {
        /// Programs to kill.
        #[arg(long, default_value_t = 100)]
        count: u32,
        /// Programs alive at once.
        #[arg(long, default_value_t = 4)]
        parallel: u32,
        /// Shortest delay from start to kill, in ms.
        #[arg(long, default_value_t = 20)]
        min_delay_ms: u64,
        /// Longest delay from start to kill, in ms.
        #[arg(long, default_value_t = 3000)]
        max_delay_ms: u64,
        /// Seed of the delays.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Percentage of runs whose delay counts from their first "progress" line instead of
        /// their start: killed in the middle of work rather than while starting up.
        #[arg(long, default_value_t = 75)]
        during_work_percent: u32,
        /// The program and its arguments (after --).
        #[arg(required = true, last = true)]
        program: Vec<String>,
    },
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`qcuda-smi selftest | head`), like other Unix tools,
    // instead of panicking in println.
    // SAFETY: called before any thread exists; SIG_DFL is a valid disposition for SIGPIPE.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args = Args::parse();
    let result = match &args.command {
        None => device::Device::open(&args.device).and_then(|dev| host_info::run(&dev)),
        Some(Command::Sessions) => device::Device::open(&args.device).and_then(|dev| {
            let hello = dev.hello().map_err(|e| format!("hello: {e}"))?;
            println!("{}", hello.sessions);
            Ok(())
        }),
        Some(Command::Processes { csv }) => {
            device::Device::open(&args.device).and_then(|dev| vm_usage::run(&dev, *csv))
        }
        Some(Command::Memory) => device::Device::open(&args.device).and_then(|dev| {
            let usage = dev.vm_usage().map_err(|e| format!("VM usage: {e}"))?;
            println!("{}", usage.memory);
            Ok(())
        }),
        Some(Command::Selftest { max_size, seed }) => {
            device::Device::open(&args.device).and_then(|dev| {
                selftest::run(
                    &dev,
                    &selftest::SelftestOptions {
                        max_size: *max_size,
                        seed: *seed,
                    },
                )
            })
        }
        Some(Command::Stress {
            procs,
            threads,
            iters,
            max_size,
            seed,
        }) => stress::run(
            &args.device,
            &stress::StressOptions {
                procs: *procs,
                threads: *threads,
                iters: *iters,
                max_size: *max_size,
                seed: *seed,
            },
        ),
        Some(Command::Latency { count }) => {
            device::Device::open(&args.device).and_then(|dev| latency(&dev, *count))
        }
        Some(Command::WorkerCalls { seconds }) => device::Device::open(&args.device)
            .and_then(|dev| worker_calls::run(&dev, *seconds).map_err(|e| e.to_string())),
        Some(Command::Killtest {
            count,
            parallel,
            size,
            min_delay_ms,
            max_delay_ms,
            seed,
        }) => killtest::run(
            &args.device,
            &killtest::KillOptions {
                count: *count,
                parallel: *parallel,
                size: *size,
                min_delay_ms: *min_delay_ms,
                max_delay_ms: *max_delay_ms,
                seed: *seed,
            },
        ),
        Some(Command::Hostile) => hostile::run(&args.device),
        Some(Command::Loader) => loader::run(),
        Some(Command::Trace {
            pid,
            seconds,
            output,
            records,
        }) => device::Device::open(&args.device).and_then(|dev| {
            trace::run(
                &dev,
                &trace::TraceOptions {
                    pid: *pid,
                    seconds: *seconds,
                    output: output.clone(),
                    records: *records,
                },
            )
        }),
        Some(Command::TraceMerge {
            torch,
            qcuda,
            output,
            clock,
        }) => trace::merge(torch, qcuda, output, *clock),
        Some(Command::Killprog {
            count,
            parallel,
            min_delay_ms,
            max_delay_ms,
            seed,
            during_work_percent,
            program,
        }) => killprog::run(
            &args.device,
            &killprog::KillProgOptions {
                count: *count,
                parallel: *parallel,
                min_delay_ms: *min_delay_ms,
                max_delay_ms: *max_delay_ms,
                seed: *seed,
                during_work_percent: *during_work_percent,
                program: program.clone(),
            },
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let what = match &args.command {
                None
                | Some(Command::Sessions)
                | Some(Command::Processes { .. })
                | Some(Command::Memory) => "",
                Some(Command::Selftest { .. }) => "selftest FAILED: ",
                Some(Command::Stress { .. }) => "stress FAILED: ",
                Some(Command::Killtest { .. }) => "killtest FAILED: ",
                Some(Command::Killprog { .. }) => "killprog FAILED: ",
                Some(Command::Hostile) => "hostile FAILED: ",
                Some(Command::Loader) => "loader: ",
                Some(Command::Latency { .. }) => "latency FAILED: ",
                Some(Command::WorkerCalls { .. }) => "worker-calls FAILED: ",
                Some(Command::Trace { .. }) | Some(Command::TraceMerge { .. }) => "",
            };
            eprintln!("qcuda-smi: {what}{e}");
            ExitCode::FAILURE
        }
    }
}

/// `qcuda-smi latency`: mean microseconds per call of each kind.
fn latency(dev: &device::Device, count: u32) -> Result<(), String> {
    let count = count.max(1);
    // The session first: the host knows this process from its first call on, whatever the
    // rows below take (the per-VM views test holds sessions with long latency runs).
    dev.hello().map_err(|e| format!("hello: {e}"))?;
    let time =
        |what: &str, count: u32, f: &mut dyn FnMut() -> Result<(), String>| -> Result<(), String> {
            for _ in 0..count.min(20) {
                f()?;
            }
            let before = dev.module_phases();
            let t = std::time::Instant::now();
            for _ in 0..count {
                f()?;
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(count);
            println!("latency: {what:<28} {us:9.1} us per call ({count} calls)");
            // Waited calls only: qcuda.ko times those.
            if let (Some(b), Some(a)) = (before, dev.module_phases()) {
                let calls = a[0].saturating_sub(b[0]);
                if calls > 0 {
                    let per = |i: usize| a[i].saturating_sub(b[i]) as f64 / calls as f64 / 1e3;
                    println!(
                    "latency:   in qcuda.ko per call: prepare {:.1}, submit {:.1}, wait {:.1}, \
                     finish {:.1} us",
                    per(1),
                    per(2),
                    per(3),
                    per(4)
                );
                }
            }
            Ok(())
        };
    // A system call into the module and straight back (ENOTTY): what no transport can save.
    time("ioctl refused (ENOTTY)", count, &mut || {
        let mut call = qcuda_proto::ioctl::IoctlCall::new(qcuda_proto::Op::Hello);
        match dev.unknown_ioctl(&mut call) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => Ok(()),
            other => Err(format!("unknown ioctl: {other:?}")),
        }
    })?;
    time("hello (waited)", count, &mut || {
        dev.hello().map(|_| ()).map_err(|e| format!("hello: {e}"))
    })?;
    time("hello (fire-and-forget)", count, &mut || {
        dev.hello_async().map_err(|e| format!("async hello: {e}"))
    })?;
    // One waited call drains what the fire-and-forget ones left in flight.
    dev.hello().map_err(|e| format!("hello: {e}"))?;
    // Bounce buffers (at most 64 KiB are copied), then pinned pages: 4 MiB in and 4 MiB out
    // pin as many pages as the 8 MiB chunk guest-lib splits large pageable copies into, and
    // fit one chain even when every page is its own run.
    // The 4 MiB echo takes longer than qcuda.ko's short poll, so it also shows what each way
    // of waiting costs (CUDA's scheduling flags pick one for synchronisations).
    use qcuda_proto::WaitMode::{Block, Poll, Spin};
    let big = (count / 100).max(5);
    for (what, len, n, wait) in [
        ("echo 64 B (waited)", 64, count, Poll),
        ("echo 4 KiB (waited)", 4096, count, Poll),
        ("echo 4 MiB pinned (waited)", 4 << 20, big, Poll),
        ("echo 4 MiB pinned (spin)", 4 << 20, big, Spin),
        ("echo 4 MiB pinned (block)", 4 << 20, big, Block),
    ] {
        let input = vec![0x5au8; len];
        let mut output = vec![0u8; len];
        time(what, n, &mut || {
            dev.echo_waiting(&input, &mut output, wait)
                .map(|_| ())
                .map_err(|e| format!("echo: {e}"))
        })?;
    }
    Ok(())
}

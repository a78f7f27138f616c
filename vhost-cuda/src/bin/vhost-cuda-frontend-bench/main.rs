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
//!
//! Files: `args.rs` (the command line), `report.rs` (repetitions and rows), `vm.rs` (a VM and
//! its RAM), `session.rs` (one guest process's requests), `latency.rs` and `ceiling.rs` (the
//! measurements).

mod args;
mod ceiling;
mod latency;
mod report;
mod session;
mod vm;

// The benchmark loads one of the tests' images (the file allows what it leaves unused).
#[path = "../../cuda/test_kernels.rs"]
mod test_kernels;

use std::{process::ExitCode, time::Duration};

use clap::Parser;
use qcuda_proto::{status, Op, VERSION};
use vhost_cuda::frontend::QueueWait;

use crate::{
    args::{sockets, Args, Group},
    report::{Plan, Report},
    session::Session,
    vm::connect,
};

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

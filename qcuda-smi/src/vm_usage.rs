// SPDX-License-Identifier: Apache-2.0 OR MIT
//! What this VM uses of the host's GPUs, as the host accounts it (`Op::VmUsage`): the GPU
//! memory the VM holds against its limit and each process with its memory and kernel count,
//! like the process table of `nvidia-smi`. Only this VM's processes appear: the host answers
//! each VM about its own sessions.
//!
//! The host knows a process by its session (one open file of /dev/qcuda) and the pid qcuda.ko
//! stamped on its requests; the name comes from this guest's /proc. qcuda-smi's own session
//! is left out of the table, as nvidia-smi leaves itself out.

use qcuda_proto::{SessionUsage, USAGE_CALLER, USAGE_FAILED};

use crate::device::{CallError, Device, VmUsageReply};

/// Bytes for people: "0 B", "512 B", "4.0 KiB", "1.5 GiB" (`qcuda_proto::HumanBytes`).
pub fn bytes_text(b: u64) -> String {
    qcuda_proto::HumanBytes(b).to_string()
}

/// The name of guest process `pid` (its /proc comm), "-" if it is gone or unknown.
fn process_name(pid: u32) -> String {
    if pid == 0 {
        return "-".into();
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| "-".into())
}

/// The other processes' records (qcuda-smi's own left out).
pub fn others(reply: &VmUsageReply) -> impl Iterator<Item = &SessionUsage> {
    reply
        .sessions
        .iter()
        .filter(|s| s.flags & USAGE_CALLER == 0)
}

/// The VM's summary line.
pub fn summary_line(reply: &VmUsageReply) -> String {
    let limit = reply
        .memory_limit
        .map_or(String::new(), |l| format!(" of {} (limit)", bytes_text(l)));
    format!(
        "this VM: {} process(es) using qcuda, GPU memory {}{limit}, kernels {} since the VM \
         connected",
        others(reply).count(),
        bytes_text(reply.memory),
        reply.kernels
    )
}

/// The process table, `name` giving each pid's name.
pub fn process_table(reply: &VmUsageReply, name: &dyn Fn(u32) -> String) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>8} {:>20} {:>11} {:>11} {:>10} {:>7}  {}",
        "PID", "SESSION", "MEMORY", "PEAK", "KERNELS", "GRAPHS", "NAME"
    )];
    for s in others(reply) {
        let pid = if s.pid == 0 {
            "-".to_string()
        } else {
            s.pid.to_string()
        };
        let failed = if s.flags & USAGE_FAILED != 0 {
            "  (GPU lost: cudaDeviceReset needed)"
        } else {
            ""
        };
        lines.push(format!(
            "{pid:>8} {:>20} {:>11} {:>11} {:>10} {:>7}  {}{failed}",
            s.session,
            bytes_text(s.memory),
            bytes_text(s.peak_memory),
            s.kernels,
            s.graph_launches,
            name(s.pid)
        ));
    }
    lines
}

/// `pid,session,memory_bytes,peak_bytes,kernels,graph_launches,name` per process, for scripts.
pub fn csv(reply: &VmUsageReply, name: &dyn Fn(u32) -> String) -> Vec<String> {
    let mut lines = vec!["pid,session,memory_bytes,peak_bytes,kernels,graph_launches,name".into()];
    for s in others(reply) {
        lines.push(format!(
            "{},{},{},{},{},{},{}",
            s.pid,
            s.session,
            s.memory,
            s.peak_memory,
            s.kernels,
            s.graph_launches,
            name(s.pid).replace(',', "_")
        ));
    }
    lines
}

/// `qcuda-smi processes`: the summary and the table (or CSV).
pub fn run(dev: &Device, as_csv: bool) -> Result<(), String> {
    let reply = dev
        .vm_usage()
        .map_err(|e| format!("VM usage on {}: {e}", dev.path().display()))?;
    if as_csv {
        for l in csv(&reply, &process_name) {
            println!("{l}");
        }
        return Ok(());
    }
    println!("{}", summary_line(&reply));
    for l in process_table(&reply, &process_name) {
        println!("{l}");
    }
    Ok(())
}

/// The section of plain `qcuda-smi`; a note from a host that predates VmUsage.
pub fn section(dev: &Device) -> Result<Vec<String>, String> {
    match dev.vm_usage() {
        Ok(reply) => {
            let mut lines = vec![summary_line(&reply)];
            if others(&reply).next().is_some() {
                lines.extend(process_table(&reply, &process_name));
            }
            Ok(lines)
        }
        // A host older than VmUsage refuses the op: the GPUs above are still the answer.
        Err(CallError::Status(s)) => Ok(vec![format!(
            "this VM: the host does not report its usage ({})",
            crate::device::status_name(s)
        )]),
        Err(e) => Err(format!("VM usage on {}: {e}", dev.path().display())),
    }
}

#[cfg(test)]
mod tests {
    use qcuda_proto::USAGE_GPU;

    use super::*;

    fn reply() -> VmUsageReply {
        VmUsageReply {
            sessions: vec![
                SessionUsage {
                    session: 1001,
                    pid: 812,
                    flags: USAGE_GPU,
                    memory: 3 << 29,
                    peak_memory: 2 << 30,
                    kernels: 5000,
                    graph_launches: 2,
                    age_ms: 10,
                },
                SessionUsage {
                    session: 1002,
                    pid: 813,
                    flags: USAGE_CALLER,
                    ..SessionUsage::default()
                },
                SessionUsage {
                    session: 1003,
                    pid: 0,
                    flags: USAGE_FAILED,
                    ..SessionUsage::default()
                },
            ],
            memory: 3 << 29,
            memory_limit: Some(4 << 30),
            max_sessions: 1024,
            kernels: 9000,
            sessions_opened: 7,
        }
    }

    fn name(pid: u32) -> String {
        format!("prog{pid}")
    }

    #[test]
    fn the_summary_and_table_leave_qcuda_smi_out() {
        let r = reply();
        assert_eq!(
            summary_line(&r),
            "this VM: 2 process(es) using qcuda, GPU memory 1.5 GiB of 4.0 GiB (limit), kernels \
             9000 since the VM connected"
        );
        let t = process_table(&r, &name);
        assert_eq!(t.len(), 3);
        let cols: Vec<&str> = t[1].split_whitespace().collect();
        assert_eq!(
            cols,
            ["812", "1001", "1.5", "GiB", "2.0", "GiB", "5000", "2", "prog812"]
        );
        assert!(t[2].trim_start().starts_with("- "), "{}", t[2]);
        assert!(t[2].ends_with("prog0  (GPU lost: cudaDeviceReset needed)"));
        assert!(!t.iter().any(|l| l.contains("813")));
    }

    #[test]
    fn csv_for_scripts() {
        let c = csv(&reply(), &|_| "a,b".into());
        assert_eq!(
            c,
            [
                "pid,session,memory_bytes,peak_bytes,kernels,graph_launches,name",
                "812,1001,1610612736,2147483648,5000,2,a_b",
                "0,1003,0,0,0,0,a_b"
            ]
        );
    }

    #[test]
    fn bytes_for_people() {
        assert_eq!(bytes_text(0), "0 B");
        assert_eq!(bytes_text(4096), "4.0 KiB");
        assert_eq!(bytes_text(3 << 29), "1.5 GiB");
    }
}

//! The stats socket: what each VM of this daemon uses of the host, on request.
//!
//! The daemon listens on a Unix socket beside its vhost-user socket (`PATH.stats`, or
//! `--stats-socket`). A client writes one line naming a format, `table`, `json` or
//! `prometheus` (Prometheus' text exposition format), and reads the report until the daemon
//! closes the connection; `vhost-cuda --stats` is that client ([`query`]). The report covers
//! the host's GPUs that the VMs may use and, per VM (socket), its connection, its sessions and
//! their device memory (now and at most), kernels and graphs launched, guest and worker pids.
//! The figures come from each VM's session table (`session::usage`); the [`StatsRegistry`]
//! knows which table is the current connection's. Clients are served one at a time, each
//! bounded by [`CLIENT_TIMEOUT`], so a stuck client delays the next by at most that.
//!
//! The same socket takes the operator's `pause TARGET` and `resume TARGET` (TARGET: a session
//! id, or `all`), from the daemon's own user or root only (the peer's credentials,
//! `SO_PEERCRED`, are checked on every such line; anyone else gets an error and nothing
//! happens): each named session of every VM is paused or resumed (`UsageView::checkpoint`),
//! one answer line per session, then `result: ok` or `result: failed`; `vhost-cuda --pause` and
//! `--resume` are that client ([`command`]).
//!
//! Neighbours: lib.rs registers each connection's table; main.rs has the `--stats` client.

use crate::peer::peer_uid;
use std::{
    fmt::Write as _,
    io::{self, BufRead, BufReader, Read, Write},
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use tracing::{info, warn};

use crate::{
    cuda::CudaHost,
    session::{
        bytes_text,
        migration_figures::{MigrationFigures, MigrationLog, Phase},
        UsageView, VmUsage,
    },
    socket::{self, SocketError},
};

/// What the stats socket's name adds to the vhost-user socket's.
pub const STATS_SUFFIX: &str = ".stats";

/// How long the daemon waits for a client's request line, and for it to take the report.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest request line the daemon reads.
const MAX_REQUEST: u64 = 64;

/// How a report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatsFormat {
    /// For people, like `nvidia-smi`.
    Table,
    /// One JSON object.
    Json,
    /// Prometheus' text exposition format (e.g. for node_exporter's textfile collector).
    Prometheus,
}

impl StatsFormat {
    /// The request line's word.
    pub fn word(self) -> &'static str {
        match self {
            StatsFormat::Table => "table",
            StatsFormat::Json => "json",
            StatsFormat::Prometheus => "prometheus",
        }
    }

    fn from_word(w: &str) -> Option<Self> {
        [Self::Table, Self::Json, Self::Prometheus]
            .into_iter()
            .find(|f| f.word() == w)
    }
}

/// One VM (socket) of this daemon and the table of its current connection, if any.
#[derive(Debug)]
struct VmEntry {
    label: String,
    view: Option<UsageView>,
    /// Its last migration's figures, kept across connections.
    migration: MigrationLog,
    /// The VM's GPU busy and recorded ns at the last report (busy fraction since then).
    last_gpu: (u64, u64),
}

/// Every VM this daemon serves.
#[derive(Debug, Default)]
pub struct StatsRegistry {
    vms: Mutex<Vec<VmEntry>>,
}

/// One VM in a report.
#[derive(Debug, Clone, PartialEq)]
pub struct VmReport {
    /// Whether a frontend (QEMU) is connected.
    pub connected: bool,
    /// Its use of the host (all zero when not connected).
    pub usage: VmUsage,
    /// GPU busy ns and recorded ns since the previous report (GPU timelines recorded then).
    pub gpu_since_last: (u64, u64),
    /// Its last migration through this daemon, phase by phase (no phases: none yet).
    pub migration: MigrationFigures,
}

impl VmReport {
    /// The busy fraction over the recording since the previous report, else over all of it;
    /// `None`: nothing of the VM was recorded.
    pub fn gpu_busy(&self) -> Option<f64> {
        let (busy, traced) = if self.gpu_since_last.1 > 0 {
            self.gpu_since_last
        } else {
            (self.usage.gpu_busy_ns, self.usage.gpu_traced_ns)
        };
        #[expect(
            clippy::cast_precision_loss,
            reason = "a fraction, for people and Prometheus"
        )]
        (traced > 0).then(|| (busy as f64 / traced as f64).min(1.0))
    }
}

/// One host GPU in a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReport {
    /// Its ordinal as the guests see it.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Its memory in bytes.
    pub memory: u64,
}

/// A whole report.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The host's CUDA driver version (0: none).
    pub driver_version: u32,
    /// The GPUs the VMs may use.
    pub gpus: Vec<GpuReport>,
    /// The VMs, in socket order.
    pub vms: Vec<VmReport>,
}

impl StatsRegistry {
    /// Adds a VM labelled `label` (its socket path); returns its index.
    pub fn add(&self, label: &str) -> usize {
        let mut vms = self.lock();
        vms.push(VmEntry {
            label: label.to_string(),
            view: None,
            migration: MigrationLog::default(),
            last_gpu: (0, 0),
        });
        vms.len() - 1
    }

    /// VM `index`'s migration figures, for each of its connections' backends to record in.
    pub fn migration_log(&self, index: usize) -> MigrationLog {
        self.lock()
            .get(index)
            .map(|e| e.migration.clone())
            .unwrap_or_default()
    }

    /// VM `index` has a connection, whose table `view` reads.
    pub fn connect(&self, index: usize, view: UsageView) {
        if let Some(e) = self.lock().get_mut(index) {
            e.view = Some(view);
            e.last_gpu = (0, 0);
        }
    }

    /// VM `index`'s connection ended.
    pub fn disconnect(&self, index: usize) {
        if let Some(e) = self.lock().get_mut(index) {
            e.view = None;
        }
    }

    /// Each VM's label and the table of its current connection.
    fn views(&self) -> Vec<(String, UsageView)> {
        self.lock()
            .iter()
            .filter_map(|e| Some((e.label.clone(), e.view.clone()?)))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<VmEntry>> {
        self.vms.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every VM now.
    pub fn vms(&self) -> Vec<VmReport> {
        // The views are read outside the lock: a snapshot takes the tables' own locks.
        let entries: Vec<(String, Option<UsageView>, MigrationLog)> = self
            .lock()
            .iter()
            .map(|e| (e.label.clone(), e.view.clone(), e.migration.clone()))
            .collect();
        let mut reports: Vec<VmReport> = entries
            .into_iter()
            .map(|(label, view, migration)| {
                let migration = migration.snapshot();
                match view.and_then(|v| v.snapshot()) {
                    Some(usage) => VmReport {
                        connected: true,
                        usage: VmUsage { vm: label, ..usage },
                        gpu_since_last: (0, 0),
                        migration,
                    },
                    None => VmReport {
                        connected: false,
                        usage: VmUsage {
                            vm: label,
                            ..VmUsage::default()
                        },
                        gpu_since_last: (0, 0),
                        migration,
                    },
                }
            })
            .collect();
        let mut vms = self.lock();
        for (e, r) in vms.iter_mut().zip(&mut reports) {
            let now = (r.usage.gpu_busy_ns, r.usage.gpu_traced_ns);
            r.gpu_since_last = (
                now.0.saturating_sub(e.last_gpu.0),
                now.1.saturating_sub(e.last_gpu.1),
            );
            e.last_gpu = now;
        }
        reports
    }
}

/// The report of `host` and `registry` now.
pub fn report(host: &CudaHost, registry: &StatsRegistry) -> Report {
    Report {
        driver_version: host.driver_version(),
        gpus: (0..host.gpu_count())
            .filter_map(|i| {
                host.gpu_info(i).map(|g| GpuReport {
                    index: i,
                    name: String::from_utf8_lossy(g.name_bytes()).into_owned(),
                    memory: g.total_mem,
                })
            })
            .collect(),
        vms: registry.vms(),
    }
}

/// Binds the stats socket at `path` (replacing a stale one) and serves it on a thread of its
/// own for the life of the process.
pub fn serve(
    path: &Path,
    host: Arc<CudaHost>,
    registry: Arc<StatsRegistry>,
) -> Result<(), SocketError> {
    socket::remove_stale(path)?;
    let name = path.display().to_string();
    let listener = UnixListener::bind(path).map_err(|source| SocketError::Probe {
        path: name.clone(),
        source,
    })?;
    // The daemon's user and group may connect (the stats); pause and resume are checked
    // again per line against the peer's credentials.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o660)).map_err(
        |source| SocketError::Probe {
            path: name.clone(),
            source,
        },
    )?;
    info!("stats on {name} (vhost-cuda --stats, --pause, --resume)");
    thread::Builder::new()
        .name("qcuda-stats".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(c) => {
                        if let Err(e) = answer(c, &host, &registry) {
                            warn!("stats client: {e}");
                        }
                    }
                    Err(e) => {
                        warn!("stats socket {name}: accept failed: {e}");
                        thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .map(|_| ())
        .map_err(|source| SocketError::Probe {
            path: path.display().to_string(),
            source,
        })
}

/// Serves one client: its request line, then the report.
fn answer(conn: UnixStream, host: &CudaHost, registry: &StatsRegistry) -> io::Result<()> {
    conn.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    conn.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&conn).take(MAX_REQUEST)).read_line(&mut line)?;
    let mut out = &conn;
    let words: Vec<&str> = line.split_whitespace().collect();
    if let [verb @ ("pause" | "resume"), target] = words[..] {
        return out.write_all(control(&conn, registry, verb == "pause", target).as_bytes());
    }
    let Some(format) = StatsFormat::from_word(line.trim()) else {
        return out.write_all(b"error: ask for table, json or prometheus\n");
    };
    out.write_all(render(format, &report(host, registry)).as_bytes())
}

/// How long a pause or resume may take per request before its session is reported as not
/// answering (moving device memory to host memory runs at copy bandwidth).
pub const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(600);

/// The operator's `pause TARGET` or `resume TARGET`: the answer lines.
fn control(conn: &UnixStream, registry: &StatsRegistry, pause: bool, target: &str) -> String {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match peer_uid(conn) {
        Ok(uid) if uid == 0 || uid == me => {}
        Ok(uid) => {
            warn!("pause/resume refused to user {uid} (only root or user {me} may)");
            return format!("error: only root or user {me} may pause or resume sessions\n");
        }
        Err(e) => return format!("error: cannot tell who asks: {e}\n"),
    }
    let session = match target {
        "all" => None,
        t => match t.parse::<u64>() {
            Ok(id) => Some(id),
            Err(_) => return "error: name a session id or all\n".into(),
        },
    };
    let verb = if pause { "paused" } else { "resumed" };
    let mut out = String::new();
    let mut all_ok = true;
    for (label, view) in registry.views() {
        for (id, resp) in view.checkpoint(session, pause, CHECKPOINT_TIMEOUT) {
            let secs = resp.rets[1] as f64 / 1e9;
            if resp.status == qcuda_proto::status::SUCCESS {
                let rate = resp.rets[0] as f64 / secs.max(1e-9) / f64::from(1u32 << 30);
                let _ = writeln!(
                    out,
                    "vm {label} session {id}: {verb}, {} {} in {secs:.3} s ({rate:.2} GiB/s)",
                    bytes_text(resp.rets[0]),
                    if pause {
                        "to host memory"
                    } else {
                        "back to the GPU"
                    },
                );
            } else {
                all_ok = false;
                let _ = writeln!(
                    out,
                    "vm {label} session {id}: not {verb}: {} ({})",
                    qcuda_proto::cuda_errors::name(resp.status).unwrap_or("unknown error"),
                    resp.status
                );
            }
        }
    }
    if out.is_empty() {
        let _ = writeln!(out, "no such session: {target}");
        all_ok = false;
    }
    let _ = writeln!(out, "result: {}", if all_ok { "ok" } else { "failed" });
    out
}

/// The client of the operator's commands: `pause` or `resume` `target` (a session id or
/// `all`) at the daemon's stats socket `path`. Returns the daemon's answer.
pub fn command(path: &Path, pause: bool, target: &str) -> io::Result<String> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(CHECKPOINT_TIMEOUT + Duration::from_secs(10)))?;
    writeln!(conn, "{} {target}", if pause { "pause" } else { "resume" })?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    Ok(text)
}

/// The client: asks the daemon at `path` for a report in `format`.
pub fn query(path: &Path, format: StatsFormat) -> io::Result<String> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    writeln!(conn, "{}", format.word())?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    Ok(text)
}

/// The stats socket of the vhost-user socket `socket_path`.
pub fn default_path(socket_path: &Path) -> PathBuf {
    let mut p = socket_path.as_os_str().to_owned();
    p.push(STATS_SUFFIX);
    PathBuf::from(p)
}

/// `report` written in `format`.
pub fn render(format: StatsFormat, report: &Report) -> String {
    match format {
        StatsFormat::Table => table(report),
        StatsFormat::Json => json(report),
        StatsFormat::Prometheus => prometheus(report),
    }
}

fn table(r: &Report) -> String {
    let mut s = String::new();
    let driver = if r.driver_version == 0 {
        "none".to_string()
    } else {
        format!(
            "{}.{}",
            r.driver_version / 1000,
            r.driver_version % 1000 / 10
        )
    };
    let _ = writeln!(s, "host: CUDA driver {driver}, {} GPU(s)", r.gpus.len());
    for g in &r.gpus {
        let _ = writeln!(s, "  GPU {}: {}, {}", g.index, g.name, bytes_text(g.memory));
    }
    for vm in &r.vms {
        let u = &vm.usage;
        if !vm.connected {
            let _ = writeln!(s, "VM {}: not connected", u.vm);
            migration_lines(&mut s, &vm.migration);
            continue;
        }
        let limit = u
            .memory_limit
            .map_or(String::new(), |l| format!(" of {}", bytes_text(l)));
        let _ = writeln!(
            s,
            "VM {}: {} session(s) open (at most {}), GPU memory {}{limit}, kernels {}, graph \
             launches {}, sessions opened {}",
            u.vm,
            u.sessions_open,
            u.max_sessions,
            bytes_text(u.memory),
            u.kernels,
            u.graph_launches,
            u.sessions_opened
        );
        let _ = writeln!(s, "  GPU busy: {}", gpu_busy_text(vm));
        migration_lines(&mut s, &vm.migration);
        if u.sessions.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "  {:>20} {:>9} {:>10} {:>11} {:>11} {:>10} {:>7} {:>9}",
            "SESSION", "GUEST PID", "WORKER PID", "MEMORY", "PEAK", "KERNELS", "GRAPHS", "AGE"
        );
        for v in &u.sessions {
            let x = &v.usage;
            let pid = |p: u32| {
                if p == 0 {
                    "-".to_string()
                } else {
                    p.to_string()
                }
            };
            #[expect(
                clippy::cast_precision_loss,
                reason = "seconds with one decimal, for people"
            )]
            let age = x.age_ms as f64 / 1000.0;
            let _ = writeln!(
                s,
                "  {:>20} {:>9} {:>10} {:>11} {:>11} {:>10} {:>7} {:>8.1}s",
                x.session,
                pid(x.pid),
                pid(v.worker_pid),
                bytes_text(x.memory),
                bytes_text(x.peak_memory),
                x.kernels,
                x.graph_launches,
                age
            );
        }
    }
    s
}

/// The VM's last migration, one line per phase, for people.
fn migration_lines(s: &mut String, m: &MigrationFigures) {
    if m.phases.is_empty() {
        return;
    }
    let _ = writeln!(s, "  last migration ({}):", m.role);
    for p in &m.phases {
        if p.name == "handover" {
            // Handed over, not moved: a rate would mislead.
            let _ = writeln!(
                s,
                "    {:<8} {:>11} in {:>8.3} s, {} piece(s) handed over, not copied",
                p.name,
                bytes_text(p.bytes),
                p.secs,
                p.pieces
            );
            continue;
        }
        let _ = write!(
            s,
            "    {:<8} {:>11} in {:>8.3} s, {:>7.2} GiB/s",
            p.name,
            bytes_text(p.bytes),
            p.secs,
            p.gib_per_s()
        );
        if p.name == "precopy" {
            let _ = write!(s, " in {} round(s) while the VM ran", p.rounds);
        }
        let _ = writeln!(s);
    }
}

/// The VM's GPU busy fraction for people.
#[expect(
    clippy::cast_precision_loss,
    reason = "seconds with one decimal, for people"
)]
fn gpu_busy_text(vm: &VmReport) -> String {
    let secs = |ns: u64| ns as f64 / 1e9;
    match vm.gpu_busy() {
        None => "not recorded (no GPU timeline was recorded: qcuda-smi trace in the guest)".into(),
        Some(f) if vm.gpu_since_last.1 > 0 => format!(
            "{:.1}% of {:.1} s recorded since the last report",
            f * 100.0,
            secs(vm.gpu_since_last.1)
        ),
        Some(f) => format!(
            "{:.1}% of {:.1} s recorded in all (none since the last report)",
            f * 100.0,
            secs(vm.usage.gpu_traced_ns)
        ),
    }
}

/// The report as one JSON object (serde_json), on one line.
fn json(r: &Report) -> String {
    use serde_json::json;
    let gpus: Vec<_> = r
        .gpus
        .iter()
        .map(|g| json!({"index": g.index, "name": g.name, "memory_bytes": g.memory}))
        .collect();
    let vms: Vec<_> = r
        .vms
        .iter()
        .map(|vm| {
            let u = &vm.usage;
            let sessions: Vec<_> = u
                .sessions
                .iter()
                .map(|v| {
                    let x = &v.usage;
                    json!({
                        "session": x.session,
                        "guest_pid": x.pid,
                        "worker_pid": v.worker_pid,
                        "gpu_memory_bytes": x.memory,
                        "gpu_memory_peak_bytes": x.peak_memory,
                        "kernels": x.kernels,
                        "graph_launches": x.graph_launches,
                        "age_ms": x.age_ms,
                        "failed": x.flags & qcuda_proto::USAGE_FAILED != 0,
                    })
                })
                .collect();
            json!({
                "vm": u.vm,
                "connected": vm.connected,
                "sessions_open": u.sessions_open,
                "max_sessions": u.max_sessions,
                "gpu_memory_bytes": u.memory,
                "gpu_memory_limit_bytes": u.memory_limit,
                "kernels": u.kernels,
                "graph_launches": u.graph_launches,
                "sessions_opened": u.sessions_opened,
                "gpu_busy_ns": u.gpu_busy_ns,
                "gpu_traced_ns": u.gpu_traced_ns,
                "gpu_busy_since_last_ns": vm.gpu_since_last.0,
                "gpu_traced_since_last_ns": vm.gpu_since_last.1,
                "gpu_busy_fraction": vm.gpu_busy(),
                "sessions": sessions,
                "migration": {
                    "role": vm.migration.role,
                    "phases": vm.migration.phases.iter().map(|p| json!({
                        "phase": p.name,
                        "bytes": p.bytes,
                        "pieces": p.pieces,
                        "rounds": p.rounds,
                        "seconds": p.secs,
                        "gib_per_s": p.gib_per_s(),
                    })).collect::<Vec<_>>(),
                },
            })
        })
        .collect();
    let mut out = json!({"driver_version": r.driver_version, "gpus": gpus, "vms": vms}).to_string();
    out.push('\n');
    out
}

/// One figure of a VM for Prometheus; `None`: no sample.
type VmFigure<'a> = &'a dyn Fn(&VmReport) -> Option<u64>;

/// `v` as a Prometheus label value.
fn label(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn prometheus(r: &Report) -> String {
    let mut s = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(s, "{name}{{{labels}}} {v}");
        }
    };
    family(
        "qcuda_host_gpu_memory_bytes",
        "gauge",
        "Memory of each host GPU the VMs may use.",
        r.gpus
            .iter()
            .map(|g| {
                (
                    format!("gpu=\"{}\",name={}", g.index, label(&g.name)),
                    g.memory,
                )
            })
            .collect(),
    );
    let per_vm = |f: VmFigure| -> Vec<(String, u64)> {
        r.vms
            .iter()
            .filter_map(|vm| Some((format!("vm={}", label(&vm.usage.vm)), f(vm)?)))
            .collect()
    };
    let vm_families: [(&str, &str, &str, VmFigure); 8] = [
        (
            "qcuda_vm_connected",
            "gauge",
            "Whether the VM's frontend (QEMU) is connected.",
            &|vm| Some(u64::from(vm.connected)),
        ),
        (
            "qcuda_vm_sessions",
            "gauge",
            "Guest processes with /dev/qcuda open.",
            &|vm| Some(vm.usage.sessions_open as u64),
        ),
        (
            "qcuda_vm_max_sessions",
            "gauge",
            "Most guest processes the VM may have open (--max-sessions).",
            &|vm| vm.connected.then_some(vm.usage.max_sessions as u64),
        ),
        (
            "qcuda_vm_gpu_memory_bytes",
            "gauge",
            "Device memory the VM's sessions hold.",
            &|vm| Some(vm.usage.memory),
        ),
        (
            "qcuda_vm_gpu_memory_limit_bytes",
            "gauge",
            "The VM's device-memory limit (--max-gpu-memory), where set.",
            &|vm| vm.usage.memory_limit,
        ),
        (
            "qcuda_vm_kernels_total",
            "counter",
            "Kernels the VM's sessions launched since it connected.",
            &|vm| Some(vm.usage.kernels),
        ),
        (
            "qcuda_vm_graph_launches_total",
            "counter",
            "Graphs the VM's sessions launched since it connected.",
            &|vm| Some(vm.usage.graph_launches),
        ),
        (
            "qcuda_vm_sessions_opened_total",
            "counter",
            "Sessions the VM opened since it connected.",
            &|vm| Some(vm.usage.sessions_opened),
        ),
    ];
    for (name, kind, help, f) in vm_families {
        family(name, kind, help, per_vm(f));
    }
    // Seconds, as Prometheus counts time: rate(busy) / rate(traced) is the busy fraction.
    #[expect(
        clippy::cast_precision_loss,
        reason = "seconds to the ns, within f64's range"
    )]
    let seconds = |ns: u64| ns as f64 / 1e9;
    let float_family = |s: &mut String,
                        name: &str,
                        kind: &str,
                        help: &str,
                        f: &dyn Fn(&VmReport) -> Option<f64>| {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for vm in &r.vms {
            if let Some(v) = f(vm) {
                let _ = writeln!(s, "{name}{{vm={}}} {v}", label(&vm.usage.vm));
            }
        }
    };
    float_family(
        &mut s,
        "qcuda_vm_gpu_busy_seconds_total",
        "counter",
        "GPU time the VM's work kept the GPU busy while GPU timelines were recorded (the union of its kernels, copies and memsets).",
        &|vm| Some(seconds(vm.usage.gpu_busy_ns)),
    );
    float_family(
        &mut s,
        "qcuda_vm_gpu_traced_seconds_total",
        "counter",
        "Time the VM's sessions were recorded (summed over sessions), the base of qcuda_vm_gpu_busy_seconds_total.",
        &|vm| Some(seconds(vm.usage.gpu_traced_ns)),
    );
    for (name, help, f) in [
        (
            "qcuda_vm_migration_phase_seconds",
            "Seconds each phase of the VM's last migration through this daemon took (precopy, quiesce, handover, save, send, receive, restore).",
            (|p: &Phase| p.secs) as fn(&Phase) -> f64,
        ),
        (
            "qcuda_vm_migration_phase_bytes",
            "Bytes each phase of the VM's last migration through this daemon moved.",
            #[expect(clippy::cast_precision_loss, reason = "a gauge")]
            |p: &Phase| p.bytes as f64,
        ),
        (
            "qcuda_vm_migration_phase_pieces",
            "Pieces of device memory each phase of the VM's last migration through this daemon handed over (handover only).",
            #[expect(clippy::cast_precision_loss, reason = "a gauge")]
            |p: &Phase| p.pieces as f64,
        ),
        (
            "qcuda_vm_migration_phase_rounds",
            "Rounds each phase of the VM's last migration through this daemon took (precopy only: device memory copied while the VM ran).",
            #[expect(clippy::cast_precision_loss, reason = "a gauge")]
            |p: &Phase| p.rounds as f64,
        ),
    ] {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} gauge");
        for vm in &r.vms {
            for p in &vm.migration.phases {
                let _ = writeln!(
                    s,
                    "{name}{{vm={},role=\"{}\",phase=\"{}\"}} {}",
                    label(&vm.usage.vm),
                    vm.migration.role,
                    p.name,
                    f(p)
                );
            }
        }
    }
    float_family(
        &mut s,
        "qcuda_vm_gpu_busy_ratio",
        "gauge",
        "The VM's GPU busy fraction over the recording since the previous report (else over all of it); absent where nothing was recorded.",
        &|vm| vm.gpu_busy(),
    );
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(s, "{name}{{{labels}}} {v}");
        }
    };
    let per_session = |f: fn(&qcuda_proto::SessionUsage) -> u64| -> Vec<(String, u64)> {
        r.vms
            .iter()
            .flat_map(|vm| {
                vm.usage.sessions.iter().map(move |v| {
                    (
                        format!(
                            "vm={},session=\"{}\",guest_pid=\"{}\",worker_pid=\"{}\"",
                            label(&vm.usage.vm),
                            v.usage.session,
                            v.usage.pid,
                            v.worker_pid
                        ),
                        f(&v.usage),
                    )
                })
            })
            .collect()
    };
    family(
        "qcuda_session_gpu_memory_bytes",
        "gauge",
        "Device memory a session (guest process) holds.",
        per_session(|u| u.memory),
    );
    family(
        "qcuda_session_gpu_memory_peak_bytes",
        "gauge",
        "The most device memory a session held at once.",
        per_session(|u| u.peak_memory),
    );
    family(
        "qcuda_session_kernels_total",
        "counter",
        "Kernels a session launched.",
        per_session(|u| u.kernels),
    );
    s
}

#[cfg(test)]
mod tests {
    use qcuda_proto::SessionUsage;

    use super::*;
    use crate::session::SessionView;

    fn sample() -> Report {
        Report {
            driver_version: 13000,
            gpus: vec![GpuReport {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                memory: 80 << 30,
            }],
            vms: vec![
                VmReport {
                    connected: true,
                    usage: VmUsage {
                        vm: "/run/qcuda/vm\"0.sock".into(),
                        sessions_open: 1,
                        max_sessions: 1024,
                        memory: 3 << 29,
                        memory_limit: Some(4 << 30),
                        kernels: 12,
                        graph_launches: 1,
                        sessions_opened: 5,
                        sessions: vec![SessionView {
                            usage: SessionUsage {
                                session: 77,
                                pid: 812,
                                flags: 0,
                                memory: 3 << 29,
                                peak_memory: 2 << 30,
                                kernels: 10,
                                graph_launches: 1,
                                age_ms: 1500,
                            },
                            worker_pid: 40211,
                            gpu_busy_ns: 3_000_000_000,
                            gpu_traced_ns: 4_000_000_000,
                        }],
                        gpu_busy_ns: 3_000_000_000,
                        gpu_traced_ns: 4_000_000_000,
                    },
                    gpu_since_last: (0, 0),
                    migration: MigrationFigures {
                        role: "source",
                        phases: vec![
                            Phase {
                                name: "save",
                                bytes: 1 << 30,
                                pieces: 0,
                                rounds: 0,
                                secs: 0.5,
                            },
                            Phase {
                                name: "send",
                                bytes: 1 << 30,
                                pieces: 0,
                                rounds: 0,
                                secs: 0.25,
                            },
                        ],
                    },
                },
                VmReport {
                    connected: false,
                    usage: VmUsage {
                        vm: "/run/qcuda/vm1.sock".into(),
                        ..VmUsage::default()
                    },
                    gpu_since_last: (0, 0),
                    migration: MigrationFigures::default(),
                },
            ],
        }
    }

    #[test]
    fn a_table_for_people() {
        let t = render(StatsFormat::Table, &sample());
        assert!(t.starts_with("host: CUDA driver 13.0, 1 GPU(s)\n  GPU 0: NVIDIA H100"));
        assert!(
            t.contains(
                "VM /run/qcuda/vm\"0.sock: 1 session(s) open (at most 1024), GPU memory 1.5 GiB \
                 of 4.0 GiB, kernels 12, graph launches 1, sessions opened 5"
            ),
            "{t}"
        );
        let row = t
            .lines()
            .find(|l| l.trim_start().starts_with("77 "))
            .unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols,
            ["77", "812", "40211", "1.5", "GiB", "2.0", "GiB", "10", "1", "1.5s"]
        );
        assert!(
            t.ends_with("VM /run/qcuda/vm1.sock: not connected\n"),
            "{t}"
        );
        assert!(t.contains("  last migration (source):\n"), "{t}");
        let save = t
            .lines()
            .find(|l| l.trim_start().starts_with("save "))
            .unwrap();
        let cols: Vec<&str> = save.split_whitespace().collect();
        assert_eq!(
            cols,
            ["save", "1.0", "GiB", "in", "0.500", "s,", "2.00", "GiB/s"]
        );
    }

    #[test]
    fn json_has_every_figure_and_escapes_labels() {
        let j = render(StatsFormat::Json, &sample());
        assert!(j.ends_with("}\n") && j.lines().count() == 1, "{j}");
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["driver_version"], 13000);
        assert_eq!(v["gpus"][0]["index"], 0);
        let vm = &v["vms"][0];
        assert_eq!(vm["vm"], "/run/qcuda/vm\"0.sock");
        assert_eq!(vm["connected"], true);
        assert!(vm["gpu_memory_limit_bytes"].is_null() || vm["gpu_memory_limit_bytes"].is_u64());
        assert_eq!(
            vm["sessions"][0],
            serde_json::json!({
                "session": 77, "guest_pid": 812, "worker_pid": 40211,
                "gpu_memory_bytes": 1_610_612_736_u64, "gpu_memory_peak_bytes": 2_147_483_648_u64,
                "kernels": 10, "graph_launches": 1, "age_ms": 1500, "failed": false,
            })
        );
        assert_eq!(v["vms"][1]["connected"], false);
        assert_eq!(vm["migration"]["role"], "source");
        assert_eq!(vm["migration"]["phases"][1]["phase"], "send");
        assert_eq!(vm["migration"]["phases"][1]["bytes"], 1u64 << 30);
        assert_eq!(vm["migration"]["phases"][1]["gib_per_s"], 4.0);
        assert!(
            j.contains("\\\"0.sock"),
            "the quote in the label is escaped: {j}"
        );
    }

    #[test]
    fn prometheus_text_has_a_sample_per_vm_and_session() {
        let p = render(StatsFormat::Prometheus, &sample());
        for line in [
            "# TYPE qcuda_vm_gpu_memory_bytes gauge",
            "qcuda_vm_gpu_memory_bytes{vm=\"/run/qcuda/vm\\\"0.sock\"} 1610612736",
            "qcuda_vm_gpu_memory_bytes{vm=\"/run/qcuda/vm1.sock\"} 0",
            "# TYPE qcuda_vm_migration_phase_seconds gauge",
            "qcuda_vm_migration_phase_seconds{vm=\"/run/qcuda/vm\\\"0.sock\",role=\"source\",phase=\"save\"} 0.5",
            "qcuda_vm_migration_phase_bytes{vm=\"/run/qcuda/vm\\\"0.sock\",role=\"source\",phase=\"send\"} 1073741824",
            "qcuda_vm_connected{vm=\"/run/qcuda/vm1.sock\"} 0",
            "qcuda_vm_gpu_memory_limit_bytes{vm=\"/run/qcuda/vm\\\"0.sock\"} 4294967296",
            "qcuda_vm_kernels_total{vm=\"/run/qcuda/vm\\\"0.sock\"} 12",
            "qcuda_session_kernels_total{vm=\"/run/qcuda/vm\\\"0.sock\",session=\"77\",\
             guest_pid=\"812\",worker_pid=\"40211\"} 10",
            "qcuda_host_gpu_memory_bytes{gpu=\"0\",name=\"NVIDIA H100 80GB HBM3\"} 85899345920",
        ] {
            assert!(p.lines().any(|l| l == line), "no {line:?} in\n{p}");
        }
        // No limit, no sample; a disconnected VM has no session limit either.
        assert!(!p.contains("qcuda_vm_gpu_memory_limit_bytes{vm=\"/run/qcuda/vm1.sock\"}"));
        assert!(!p.contains("qcuda_vm_max_sessions{vm=\"/run/qcuda/vm1.sock\"}"));
    }
}

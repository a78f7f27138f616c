// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `qcuda-smi killprog`: real CUDA programs killed with SIGKILL at random points. The parent
//! keeps `parallel` copies of a program running (each its own process, so its own session and
//! host worker); each is killed a random delay after it started, whatever it is doing then:
//! starting its session, loading modules, copying, launching, synchronising, holding pinned
//! or mapped memory. The program reports work done as "progress N" lines on stdout; a kill
//! after the first such line is counted as one "in business".
//!
//! Afterwards the guest side must be clean: no session left open on the host (a new process
//! sees only itself) and no page left held by qcuda.ko for host mappings. What the host must
//! show (no worker, GPU memory at its baseline) is checked by the harness outside the VM.

use std::{
    io::{self, Read},
    os::{fd::AsRawFd, unix::process::ExitStatusExt},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{device::Device, prng::Prng};

/// Options of `killprog`.
#[derive(Debug, Clone)]
pub struct KillProgOptions {
    /// Programs to kill in all.
    pub count: u32,
    /// Programs alive at once.
    pub parallel: u32,
    /// Delay from start to kill, in milliseconds: from `min_delay_ms` to `max_delay_ms`.
    pub min_delay_ms: u64,
    /// See `min_delay_ms`.
    pub max_delay_ms: u64,
    /// Seed of the delays.
    pub seed: u64,
    /// Of every 100 runs, how many count their delay from their first "progress" line rather
    /// than from their start (so that they are killed in the middle of work, not while
    /// starting up).
    pub during_work_percent: u32,
    /// The program and its arguments.
    pub program: Vec<String>,
}

/// How long a program may take to print its first progress line (a loaded TCG guest is slow).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a killed program may take to disappear: the kernel's release path closes the
/// session and waits for the host.
const REAP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the sessions of the killed programs may take to be gone from the host's count.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// One running copy of the program.
#[derive(Debug)]
struct Running {
    index: u32,
    child: Child,
    started: Instant,
    kill_at: Duration,
    /// The delay counts from the first "progress" line (then `started` is reset to it).
    from_progress: bool,
    /// Output read so far, scanned for "progress".
    output: Vec<u8>,
}

impl Running {
    /// Reads what the program has printed so far (non-blocking).
    fn drain(&mut self) {
        let Some(out) = self.child.stdout.as_mut() else {
            return;
        };
        let mut buf = [0u8; 4096];
        loop {
            match out.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    self.output.extend_from_slice(&buf[..n]);
                    // Only the start (for "progress") and the end (for a failure) matter.
                    if self.output.len() > 64 << 10 {
                        let keep = self.output.split_off(self.output.len() - (16 << 10));
                        self.output.truncate(16 << 10);
                        self.output.extend_from_slice(b"\n...\n");
                        self.output.extend_from_slice(&keep);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return, // WouldBlock: nothing more for now
            }
        }
    }

    fn in_business(&self) -> bool {
        self.output
            .split(|&b| b == b'\n')
            .any(|l| l.starts_with(b"progress "))
    }

    fn tail(&self) -> String {
        let text = String::from_utf8_lossy(&self.output);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

/// Runs the test; the error names the first failure.
pub fn run(path: &Path, opts: &KillProgOptions) -> Result<(), String> {
    let (program, args) = opts
        .program
        .split_first()
        .ok_or("killprog needs a program to run")?;
    println!(
        "killprog: {} runs of {}, {} at a time, each killed {}..{} ms after it started ({}% of \
         them: after its first progress line) (seed {})",
        opts.count,
        opts.program.join(" "),
        opts.parallel.max(1),
        opts.min_delay_ms,
        opts.max_delay_ms,
        opts.during_work_percent.min(100),
        opts.seed
    );
    let mut rng = Prng::new(opts.seed);
    let start = Instant::now();
    let mut running: Vec<Running> = Vec::new();
    let (mut next, mut killed, mut in_business) = (0u32, 0u32, 0u32);
    while next < opts.count || !running.is_empty() {
        while next < opts.count && running.len() < opts.parallel.max(1) as usize {
            let child = Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start {program}: {e}"))?;
            if let Some(out) = &child.stdout {
                set_nonblocking(out.as_raw_fd())
                    .map_err(|e| format!("O_NONBLOCK on a pipe: {e}"))?;
            }
            let delay = rng.range(opts.min_delay_ms, opts.max_delay_ms.max(opts.min_delay_ms));
            let from_progress = rng.below(100) < u64::from(opts.during_work_percent);
            running.push(Running {
                index: next,
                child,
                started: Instant::now(),
                kill_at: Duration::from_millis(delay),
                from_progress,
                output: Vec::new(),
            });
            next += 1;
        }

        let mut i = 0;
        while i < running.len() {
            let r = &mut running[i];
            r.drain();
            if let Some(status) = r.child.try_wait().map_err(|e| format!("waitpid: {e}"))? {
                return Err(format!(
                    "run {} (pid {}) ended by itself after {} ms, before its kill at {} ms: {status}; \
                     its last output: {}",
                    r.index,
                    r.child.id(),
                    r.started.elapsed().as_millis(),
                    r.kill_at.as_millis(),
                    r.tail()
                ));
            }
            if r.from_progress {
                if r.in_business() {
                    r.from_progress = false;
                    r.started = Instant::now();
                } else if r.started.elapsed() > READY_TIMEOUT {
                    return Err(format!(
                        "run {} (pid {}) printed no progress within {} s; its last output: {}",
                        r.index,
                        r.child.id(),
                        READY_TIMEOUT.as_secs(),
                        r.tail()
                    ));
                }
                i += 1;
                continue;
            }
            if r.started.elapsed() < r.kill_at {
                i += 1;
                continue;
            }
            let mut r = running.swap_remove(i);
            r.child
                .kill()
                .map_err(|e| format!("kill run {} (pid {}): {e}", r.index, r.child.id()))?;
            let reaped = Instant::now();
            let status = loop {
                if let Some(status) = r.child.try_wait().map_err(|e| format!("waitpid: {e}"))? {
                    break status;
                }
                if reaped.elapsed() > REAP_TIMEOUT {
                    return Err(format!(
                        "run {} (pid {}) still exists {} s after SIGKILL: stuck in the kernel?",
                        r.index,
                        r.child.id(),
                        REAP_TIMEOUT.as_secs()
                    ));
                }
                thread::sleep(Duration::from_millis(2));
            };
            r.drain();
            if status.signal() != Some(libc::SIGKILL) {
                return Err(format!(
                    "run {} (pid {}) ended by itself ({status}) just before its kill; its last \
                     output: {}",
                    r.index,
                    r.child.id(),
                    r.tail()
                ));
            }
            killed += 1;
            let busy = r.in_business();
            in_business += u32::from(busy);
            if killed % 50 == 0 || killed == opts.count {
                println!(
                    "killprog: {killed}/{} killed ({in_business} after they had done work), {:.0} s",
                    opts.count,
                    start.elapsed().as_secs_f64()
                );
            }
        }
        thread::sleep(Duration::from_millis(5));
    }

    println!(
        "killprog: {killed} killed in {:.1} s, {in_business} of them after completing work",
        start.elapsed().as_secs_f64()
    );
    check_clean(path)
}

/// No session but ours on the host, no page held by the module for host mappings.
fn check_clean(path: &Path) -> Result<(), String> {
    let dev = Device::open(path)?;
    let waited = Instant::now();
    let (sessions, pages) = loop {
        let sessions = dev
            .hello()
            .map_err(|e| format!("hello after the kills: {e}"))?
            .sessions;
        let pages = dev.host_pages_held_by_module();
        if (sessions == 1 && pages == Some(0)) || waited.elapsed() > SETTLE_TIMEOUT {
            break (sessions, pages);
        }
        thread::sleep(Duration::from_millis(100));
    };
    let pages_text = pages.map_or("unknown".to_string(), |p| p.to_string());
    println!(
        "killprog: afterwards the host has {sessions} session(s) open (this one included); \
         pages held for host mappings: {pages_text}"
    );
    if sessions != 1 {
        return Err(format!(
            "{} session(s) of killed programs still open on the host",
            sessions.saturating_sub(1)
        ));
    }
    if pages != Some(0) {
        return Err(format!(
            "qcuda.ko still holds {pages_text} page(s) for host mappings"
        ));
    }
    Ok(())
}

fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor this process owns (the child's stdout pipe), with
    // F_GETFL/F_SETFL, which read and set only the file status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

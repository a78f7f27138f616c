//! Starting a worker process: fork and exec through `clone(2)`, so that the child can be born in
//! namespaces of its own (a PID namespace can only be entered by a new process, never by
//! `unshare` of the caller), and a process handle to wait for it and kill it.
//!
//! `std::process::Command` cannot pass clone flags, so this file does what it does for the
//! worker: build every C string before the clone, make only async-signal-safe system calls in
//! the child (the daemon is multi-threaded: another thread may hold the allocator's lock), report
//! a failed exec through a close-on-exec pipe, and reap the child on every path.
//!
//! The clone happens on one long-lived *spawner thread*, started before the daemon installs its
//! own seccomp filter (`daemon_filter.rs`): filters are per thread and inherited across fork and
//! exec, so a worker forked by a filtered thread could never open the driver's files. The
//! spawner thread holds no guest data; it only runs [`SpawnSpec`]s that the session threads
//! send it. `PR_SET_PDEATHSIG` names the thread that forked the child: the spawner thread lives
//! as long as the daemon, so a worker dies with the daemon, however it ends.

use std::{
    ffi::{CString, OsString},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::{ffi::OsStrExt, process::ExitStatusExt},
    },
    process::ExitStatus,
    sync::{mpsc, Mutex, OnceLock},
    thread,
};

/// `CLOSE_RANGE_CLOEXEC` (Linux 5.11).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// The user and group maps of a new user namespace: the daemon's own ids appear as root
/// inside, the only mapping an unprivileged process may write for itself.
#[derive(Debug, Clone)]
pub struct IdMaps {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

impl IdMaps {
    /// Maps the calling process's effective uid and gid to 0 inside.
    pub fn own_ids_as_root() -> Self {
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Self {
            uid_map: format!("0 {uid} 1\n").into_bytes(),
            gid_map: format!("0 {gid} 1\n").into_bytes(),
        }
    }
}

/// Everything the child needs, prepared before the clone (the child must not allocate).
#[derive(Debug)]
pub struct SpawnSpec {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    /// Descriptors to place at 3, 4, ... in the child, in order; every other descriptor above
    /// them is closed on exec. Each must be numbered above the last target (no dup2 clobbers
    /// another).
    fds: Vec<RawFd>,
    /// `CLONE_NEW*` flags.
    namespaces: libc::c_int,
    /// Written by the child itself when `namespaces` has `CLONE_NEWUSER`.
    id_maps: Option<IdMaps>,
    /// Whether the child outlives the daemon (no `PR_SET_PDEATHSIG`): a worker whose channel
    /// the daemon keeps in systemd's file-descriptor store, for the next daemon to take over
    /// (`worker/store.rs`).
    outlive_parent: bool,
    /// A directory to make (if missing) and open beneath a directory descriptor, given to the
    /// child after `fds` (its VM's shared `/dev/shm`, shared_shm.rs).
    shared_dir: Option<(RawFd, CString)>,
    /// Whether the child runs without address-space randomisation (`ADDR_NO_RANDOMIZE`).
    fixed_layout: bool,
}

impl SpawnSpec {
    /// `program` with `argv` (argv\[0\] included) and this process's environment plus `env`.
    pub fn new(
        program: &std::path::Path,
        argv: &[OsString],
        env: &[(&str, &str)],
    ) -> io::Result<Self> {
        let cstr = |b: &[u8]| CString::new(b).map_err(io::Error::other);
        let mut envp = Vec::new();
        for (k, v) in std::env::vars_os() {
            if env.iter().any(|(name, _)| k.as_bytes() == name.as_bytes()) {
                continue;
            }
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp.push(cstr(&kv)?);
        }
        for (k, v) in env {
            envp.push(cstr(format!("{k}={v}").as_bytes())?);
        }
        Ok(Self {
            program: cstr(program.as_os_str().as_bytes())?,
            argv: argv
                .iter()
                .map(|a| cstr(a.as_bytes()))
                .collect::<io::Result<_>>()?,
            envp,
            fds: Vec::new(),
            namespaces: 0,
            id_maps: None,
            outlive_parent: false,
            shared_dir: None,
            fixed_layout: false,
        })
    }

    /// Puts `fds` at 3, 4, ... in the child.
    pub fn with_fds(mut self, fds: Vec<RawFd>) -> Self {
        self.fds = fds;
        self
    }

    /// Gives the child, at the descriptor after `fds`, directory `name` beneath the directory
    /// `parent` (made with mode 0700 if missing; never through a symbolic link), opened
    /// `O_PATH` between clone and exec.
    pub fn with_shared_dir(mut self, parent: RawFd, name: CString) -> Self {
        self.shared_dir = Some((parent, name));
        self
    }

    /// Runs the child without address-space randomisation (`personality(ADDR_NO_RANDOMIZE)`
    /// before the exec): two children of the same program that make the same calls get the
    /// same addresses (a worker's CUDA driver places a module's data where it placed it in the
    /// worker the session came from).
    pub fn with_fixed_layout(mut self, on: bool) -> Self {
        self.fixed_layout = on;
        self
    }

    /// Lets the child outlive the daemon (no `PR_SET_PDEATHSIG`).
    pub fn outliving_parent(mut self, on: bool) -> Self {
        self.outlive_parent = on;
        self
    }

    /// Starts the child in new namespaces (`CLONE_NEW*` flags), writing `id_maps` when one of
    /// them is a user namespace.
    pub fn with_namespaces(mut self, flags: libc::c_int, id_maps: Option<IdMaps>) -> Self {
        self.namespaces = flags;
        self.id_maps = id_maps;
        self
    }
}

/// A started child process, reaped exactly once.
#[derive(Debug)]
pub struct ChildProcess {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
    /// Born pid 1 of a PID namespace of its own: the namespace's init (pid_init.rs), whose
    /// exit status stands for its worker's.
    pid_init: bool,
    /// Then the worker proper's pid (its child), as this daemon's PID namespace numbers it.
    worker: Option<libc::pid_t>,
    /// A process this daemon did not start (a worker of a daemon before a restart, whose
    /// parent is now init or a subreaper): it is watched and killed through its pidfd, and
    /// its exit status is not ours to read.
    adopted: Option<OwnedFd>,
}

/// `pidfd_open(2)` of `pid`.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_pidfd_open,
            libc::pid_t::try_from(pid).unwrap_or(-1),
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl ChildProcess {
    /// A process started by an earlier daemon, known by its pid (in this daemon's PID
    /// namespace) and a pidfd of it.
    pub fn adopted(pid: u32, pidfd: OwnedFd) -> Self {
        Self {
            pid: libc::pid_t::try_from(pid).unwrap_or(-1),
            status: None,
            pid_init: false,
            worker: None,
            adopted: Some(pidfd),
        }
    }

    /// Its process id (in the daemon's PID namespace).
    pub fn id(&self) -> u32 {
        self.pid.unsigned_abs()
    }

    /// The id of the process that does its work: for the init of a worker's PID namespace,
    /// the worker proper (the process `nvidia-smi` lists); else its own.
    pub fn worker_id(&self) -> u32 {
        self.worker.unwrap_or(self.pid).unsigned_abs()
    }

    /// Whether it ended, for an adopted process: its pidfd turns readable (`block`: wait).
    fn poll_adopted(&mut self, pidfd: RawFd, block: bool) -> io::Result<Option<ExitStatus>> {
        loop {
            let mut fds = [libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one initialised pollfd that outlives the call.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 1, if block { -1 } else { 0 }) };
            if rc > 0 {
                // Its parent (init, or a subreaper) reaps it; the status is not ours to know.
                let s = ExitStatus::from_raw(0);
                self.status = Some(s);
                return Ok(Some(s));
            }
            if rc == 0 {
                return Ok(None);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn waitpid(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        if let Some(fd) = self.adopted.as_ref().map(AsRawFd::as_raw_fd) {
            return self.poll_adopted(fd, flags & libc::WNOHANG == 0);
        }
        loop {
            let mut status = 0;
            // SAFETY: waitpid for our own child, writing one int we own.
            let rc = unsafe { libc::waitpid(self.pid, &raw mut status, flags) };
            if rc == self.pid {
                let mut s = ExitStatus::from_raw(status);
                if self.pid_init {
                    s = super::pid_init::worker_status(s);
                }
                self.status = Some(s);
                return Ok(Some(s));
            }
            if rc == 0 {
                return Ok(None);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Its exit status if it has ended (then it is reaped), `None` while it runs.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.waitpid(libc::WNOHANG)
    }

    /// Waits for it to end and reaps it.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        self.waitpid(0)?
            .ok_or_else(|| io::Error::other("waitpid returned without a status"))
    }

    /// SIGKILL, unless it was reaped already (its pid may then belong to another process).
    pub fn kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        if let Some(fd) = &self.adopted {
            // SAFETY: pidfd_send_signal on a pidfd we own, with no siginfo: a pidfd names
            // one process for good, so a reused pid cannot be hit.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
            return if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            };
        }
        // SAFETY: kill(2) of our own unreaped child: the pid cannot have been reused.
        if unsafe { libc::kill(self.pid, libc::SIGKILL) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// What the spawner thread does.
enum Job {
    /// Starts a child and answers its handle.
    Spawn(SpawnSpec, mpsc::Sender<io::Result<ChildProcess>>),
    /// Runs file-system work the daemon's filter refuses its other threads (shared_shm.rs).
    Run(Box<dyn FnOnce() + Send>),
}

static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();

/// Starts the spawner thread if it is not running yet. The daemon calls it before it installs
/// its own seccomp filter; elsewhere (tests) the first [`spawn`] does.
pub fn start_spawner() -> io::Result<()> {
    if SPAWNER.get().is_some() {
        return Ok(());
    }
    let (tx, rx) = mpsc::channel::<Job>();
    thread::Builder::new()
        .name("qcuda-spawner".into())
        .spawn(move || {
            for job in rx {
                match job {
                    Job::Spawn(spec, reply) => {
                        let _ = reply.send(spawn_here(&spec));
                    }
                    Job::Run(work) => work(),
                }
            }
        })?;
    // A racing caller's thread and channel are dropped; its thread then ends.
    let _ = SPAWNER.set(Mutex::new(tx));
    Ok(())
}

/// Starts `spec` on the spawner thread.
pub fn spawn(spec: SpawnSpec) -> io::Result<ChildProcess> {
    start_spawner()?;
    let (reply, answer) = mpsc::channel();
    let sender = SPAWNER
        .get()
        .ok_or_else(|| io::Error::other("no spawner thread"))?
        .lock()
        .map_err(|_| io::Error::other("spawner lock poisoned"))?
        .clone();
    sender
        .send(Job::Spawn(spec, reply))
        .map_err(|_| io::Error::other("the spawner thread has ended"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the spawner thread has ended"))?
}

/// Runs `work` on the spawner thread, which the daemon's filter does not cover, without
/// waiting for it. Work for which no spawner can be had is dropped, with a warning.
pub fn run_unfiltered(work: Box<dyn FnOnce() + Send>) {
    let sent = start_spawner().ok().and_then(|()| {
        let sender = SPAWNER.get()?.lock().ok()?.clone();
        sender.send(Job::Run(work)).ok()
    });
    if sent.is_none() {
        tracing::warn!("the spawner thread has ended: file-system work not done");
    }
}

fn null_terminated(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Clones and execs `spec` from the calling thread.
fn spawn_here(spec: &SpawnSpec) -> io::Result<ChildProcess> {
    let argv = null_terminated(&spec.argv);
    let envp = null_terminated(&spec.envp);
    // Numbered above every target of the child's dup2s, so that none of them is clobbered.
    let floor = 3 + RawFd::try_from(spec.fds.len() + usize::from(spec.shared_dir.is_some()))
        .map_err(io::Error::other)?;
    let null = above(
        std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")?
            .into(),
        floor,
    )?;
    // The shared directory's parent, numbered above the child's targets too (the caller's
    // descriptor may be one of them).
    let shared_parent = match &spec.shared_dir {
        Some((parent, _)) => {
            // SAFETY: F_DUPFD_CLOEXEC on the caller's open descriptor returns a new one or -1.
            let copy = unsafe { libc::fcntl(*parent, libc::F_DUPFD_CLOEXEC, floor) };
            if copy < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `copy` is a fresh descriptor nothing else owns.
            Some(unsafe { OwnedFd::from_raw_fd(copy) })
        }
        None => None,
    };
    let mut pipe = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both are fresh descriptors nothing else owns.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
    let write_end = above(write_end, floor)?;
    let flags = libc::c_ulong::from(spec.namespaces.unsigned_abs())
        | libc::c_ulong::from(libc::SIGCHLD.unsigned_abs());
    // SAFETY: clone without CLONE_VM and without a new stack behaves like fork: the child gets
    // a copy of this address space and continues here. It then runs `child_after_clone`,
    // which makes only async-signal-safe system calls on memory prepared above and never
    // returns.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid == 0 {
        child_after_clone(
            spec,
            &argv,
            &envp,
            null.as_raw_fd(),
            write_end.as_raw_fd(),
            shared_parent.as_ref().map(AsRawFd::as_raw_fd),
        );
    }
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(write_end);
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    let mut child = ChildProcess {
        pid,
        status: None,
        pid_init: spec.namespaces & libc::CLONE_NEWPID != 0,
        worker: None,
        adopted: None,
    };
    // The write end closes on exec: no bytes mean the exec worked, four are its errno.
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        // SAFETY: read into the unfilled part of a buffer we own.
        let n = unsafe {
            libc::read(
                read_end.as_raw_fd(),
                errno[got..].as_mut_ptr().cast(),
                errno.len() - got,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n.unsigned_abs(),
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    if got == 0 {
        if child.pid_init {
            child.worker = child_of(pid);
        }
        return Ok(child);
    }
    let _ = child.wait();
    Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)))
}

/// The child of `init`, a worker born pid 1 of its PID namespace, which forks the worker proper
/// first thing (pid_init.rs): read from /proc (this thread is not filtered), waiting up to a
/// second for it. None where the kernel lists no children (`CONFIG_PROC_CHILDREN`) or none
/// came.
fn child_of(init: libc::pid_t) -> Option<libc::pid_t> {
    let path = format!("/proc/{init}/task/{init}/children");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        let listed = std::fs::read_to_string(&path).ok()?;
        if let Some(pid) = listed
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
        {
            return Some(pid);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// `fd`, renumbered close-on-exec at `floor` or above.
fn above(fd: OwnedFd, floor: RawFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() >= floor {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one (or -1).
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `copy` is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// Writes all of `bytes` to `path`, in the child: only open, write and close.
fn write_file(path: &std::ffi::CStr, bytes: &[u8]) -> bool {
    // SAFETY: open of a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    // SAFETY: write of a buffer we own, to the descriptor just opened.
    let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    // SAFETY: close of the descriptor just opened.
    unsafe { libc::close(fd) };
    n >= 0 && n.unsigned_abs() == bytes.len()
}

/// The child between clone and exec. Only async-signal-safe calls, no allocation; never
/// returns. On any failure the errno goes to `report` and the child exits 127.
fn child_after_clone(
    spec: &SpawnSpec,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    null: RawFd,
    report: RawFd,
    shared_parent: Option<RawFd>,
) -> ! {
    let fail = || -> ! {
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        let bytes = errno.to_ne_bytes();
        // SAFETY: write of four bytes we own to the report pipe, then _exit: both
        // async-signal-safe.
        unsafe {
            libc::write(report, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127)
        }
    };
    // SAFETY: sigset operations on a local set, and sigprocmask/signal on this process: the
    // daemon blocks SIGINT/SIGTERM for its sigwait thread and ignores SIGPIPE; the worker
    // starts with the defaults, as exec from std::process::Command gives it.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&raw mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &raw const none, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A worker kept for the next daemon outlives this one.
    if !spec.outlive_parent
        // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of this process. The spawner
        // thread that cloned us waits on the report pipe, so it cannot have ended yet.
        && unsafe {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            )
        } != 0
    {
        fail();
    }
    if let Some(maps) = &spec.id_maps {
        // A process may map its own ids in the user namespace it was born in (setgroups
        // must be denied first for an unprivileged gid map).
        if !write_file(c"/proc/self/setgroups", b"deny")
            || !write_file(c"/proc/self/uid_map", &maps.uid_map)
            || !write_file(c"/proc/self/gid_map", &maps.gid_map)
        {
            fail();
        }
    }
    // SAFETY: dup2 of open descriptors onto stdin and stdout (not close-on-exec).
    if unsafe { libc::dup2(null, 0) } < 0 || unsafe { libc::dup2(null, 1) } < 0 {
        fail();
    }
    let mut target: RawFd = 3;
    for &fd in &spec.fds {
        let rc = if fd == target {
            // SAFETY: fcntl on an open descriptor; clears close-on-exec.
            unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }
        } else {
            // SAFETY: dup2 of an open descriptor; the copy is not close-on-exec. Every source
            // is numbered above every target (SpawnSpec::with_fds), so nothing is clobbered.
            unsafe { libc::dup2(fd, target) }
        };
        if rc < 0 {
            fail();
        }
        target += 1;
    }
    if let (Some(parent), Some((_, name))) = (shared_parent, &spec.shared_dir) {
        // SAFETY: mkdirat and openat of a NUL-terminated name beneath an open directory
        // descriptor; a directory that is already there is fine.
        let fd = unsafe {
            if libc::mkdirat(parent, name.as_ptr(), 0o700) != 0
                && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
            {
                fail();
            }
            libc::openat(
                parent,
                name.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            fail();
        }
        // SAFETY: dup2 of the descriptor just opened onto `target` (the copy is not
        // close-on-exec; the original, wherever it is, closes on exec), or fcntl clearing
        // close-on-exec when it already is `target`.
        let rc = unsafe {
            if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            }
        };
        if rc < 0 {
            fail();
        }
        target += 1;
    }
    if spec.fixed_layout {
        // SAFETY: personality(0xffffffff) only reads this process's persona.
        let persona = unsafe { libc::personality(0xffff_ffff) };
        let Ok(persona) = libc::c_ulong::try_from(persona) else {
            fail()
        };
        // SAFETY: setting the persona again with ADDR_NO_RANDOMIZE changes only how the exec
        // below lays out the new image.
        if unsafe { libc::personality(persona | libc::ADDR_NO_RANDOMIZE as libc::c_ulong) } < 0 {
            fail();
        }
    }
    // Best effort: kernels before 5.11 lack the flag, and then only descriptors opened
    // close-on-exec stay out of the worker.
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only changes descriptor flags.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            target.unsigned_abs(),
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    // SAFETY: execve with NUL-terminated strings and NULL-terminated arrays built before the
    // clone; it returns only on failure.
    unsafe { libc::execve(spec.program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    fail()
}

//! systemd's file-descriptor store: what lets the sessions outlive a daemon restart.
//!
//! A session's CUDA state lives in its worker process, not in the daemon. With `NOTIFY_SOCKET`
//! set (a unit with `FileDescriptorStoreMax=`, `NotifyAccess=main` and `KillMode=process`,
//! deploy/systemd), the daemon starts its workers without `PR_SET_PDEATHSIG` and hands systemd
//! a copy of the daemon's end of each worker's channel and a pidfd of the worker (`sd_notify`
//! with `FDSTORE=1`, `FDNAME=`). When the daemon dies (a crash, `kill -9`, `systemctl
//! restart`), the workers never see their channel close: systemd holds it. The next daemon gets
//! the copies back with `LISTEN_FDS`/`LISTEN_FDNAMES` ([`take_passed`]) and takes each worker
//! over (`worker::WorkerProcess::adopt`, `session::SessionTable::adopt`), under the same
//! session id, so the guest process's next call is served by the worker that holds its state.
//! A session that ends removes its entries (`FDSTOREREMOVE=1`); systemd also drops an entry
//! whose worker died (the channel hangs up). When the unit stops for good, systemd closes the
//! store and the idle workers see their channel end and exit.
//!
//! Names: `qcuda-w.<vm>.<session>.<pid>.<slot>` for a worker (its channel and its pidfd, told
//! apart by type), where `<vm>` is the index of the daemon's socket and `<slot>` the worker's
//! slot of the VM's accounting file (`x`: none); `qcuda-q.<vm>` for a VM's accounting file
//! (`limits.rs`), so that adopted workers keep counting where the daemon reads; `qcuda-r.<vm>`
//! for the record of the VM's request ring (`ring_record.rs`), so that the chains in flight are
//! taken again exactly.
//!
//! Outside systemd a stand-in does the same (scripts/fd-store.py: the restart test).

use std::{
    collections::HashMap,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        linux::net::SocketAddrExt,
        unix::net::{SocketAddr, UnixDatagram},
    },
};

use tracing::{info, warn};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// The prefix of every name this daemon stores.
pub const PREFIX: &str = "qcuda-";

/// The connection to systemd's notification socket.
#[derive(Debug)]
pub struct FdStore {
    sock: UnixDatagram,
}

impl FdStore {
    /// Connects to `NOTIFY_SOCKET` (a path, or `@name` for an abstract socket) and removes
    /// the variable, so that no worker inherits it. `None` without one. Call before any thread
    /// starts (it changes the environment).
    pub fn from_environment() -> io::Result<Option<Self>> {
        let Some(addr) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        std::env::remove_var("NOTIFY_SOCKET");
        let addr = addr.to_string_lossy().into_owned();
        let sock = UnixDatagram::unbound()?;
        match addr.strip_prefix('@') {
            Some(name) => sock.connect_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?,
            None => sock.connect(&addr)?,
        }
        Ok(Some(Self { sock }))
    }

    /// Connects to the notification socket at `path` (tests play systemd there).
    pub fn connect(path: &std::path::Path) -> io::Result<Self> {
        let sock = UnixDatagram::unbound()?;
        sock.connect(path)?;
        Ok(Self { sock })
    }

    /// Sends one notification, with `fds`.
    fn notify(&self, text: &str, fds: &[RawFd]) -> io::Result<()> {
        self.sock
            .send_with_fds(&[text.as_bytes()], fds)
            .map(drop)
            .map_err(|e| io::Error::from_raw_os_error(e.errno()))
    }

    /// Keeps copies of `fds` in the store under `name`.
    pub fn store(&self, name: &str, fds: &[RawFd]) -> io::Result<()> {
        self.notify(&format!("FDSTORE=1\nFDNAME={name}\n"), fds)
    }

    /// Drops every fd stored under `name`.
    pub fn remove(&self, name: &str) {
        if let Err(e) = self.notify(&format!("FDSTOREREMOVE=1\nFDNAME={name}\n"), &[]) {
            warn!("cannot remove {name} from the file-descriptor store: {e}");
        }
    }

    /// `READY=1`: the daemon serves its sockets.
    pub fn ready(&self) {
        if let Err(e) = self.notify("READY=1\n", &[]) {
            warn!("cannot tell the service manager the daemon is ready: {e}");
        }
    }
}

/// The name a worker's entries are stored under.
pub fn worker_name(vm: usize, session: u64, pid: u32, slot: Option<usize>) -> String {
    let slot = slot.map_or_else(|| "x".to_string(), |s| s.to_string());
    format!("{PREFIX}w.{vm}.{session}.{pid}.{slot}")
}

/// The name of a VM's record of its request ring (`ring_record.rs`).
pub fn ring_name(vm: usize) -> String {
    format!("{PREFIX}r.{vm}")
}

/// The name of a VM's accounting file.
pub fn quota_name(vm: usize) -> String {
    format!("{PREFIX}q.{vm}")
}

/// A worker the previous daemon left in the store.
#[derive(Debug)]
pub struct StoredWorker {
    /// The index of the daemon socket (VM) it belongs to.
    pub vm: usize,
    /// Its session id.
    pub session: u64,
    /// Its pid, as the previous daemon saw it (the same PID namespace).
    pub pid: u32,
    /// Its slot of the VM's accounting file.
    pub slot: Option<usize>,
    /// The daemon's end of its channel.
    pub channel: OwnedFd,
    /// A pidfd of it.
    pub pidfd: OwnedFd,
}

/// What the previous daemon left in the store, by VM.
#[derive(Debug, Default)]
pub struct Passed {
    /// The workers, each with its channel and its pidfd.
    pub workers: Vec<StoredWorker>,
    /// The VMs' accounting files.
    pub quotas: HashMap<usize, OwnedFd>,
    /// The VMs' records of their request rings.
    pub rings: HashMap<usize, OwnedFd>,
    /// Names of entries whose worker is gone (only half of the entry is left), for removal.
    pub gone: Vec<String>,
}

impl Passed {
    /// The workers of VM `vm`, taken out.
    pub fn take_workers(&mut self, vm: usize) -> Vec<StoredWorker> {
        let (mine, rest) = std::mem::take(&mut self.workers)
            .into_iter()
            .partition(|w| w.vm == vm);
        self.workers = rest;
        mine
    }
}

/// Parses a worker's name: `(vm, session, pid, slot)`.
pub fn parse_worker_name(name: &str) -> Option<(usize, u64, u32, Option<usize>)> {
    let rest = name.strip_prefix(PREFIX)?.strip_prefix("w.")?;
    let mut parts = rest.split('.');
    let vm = parts.next()?.parse().ok()?;
    let session = parts.next()?.parse().ok()?;
    let pid = parts.next()?.parse().ok()?;
    let slot = match parts.next()? {
        "x" => None,
        s => Some(s.parse().ok()?),
    };
    parts.next().is_none().then_some((vm, session, pid, slot))
}

fn is_socket(fd: RawFd) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes at most one `struct stat` into the buffer.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstat succeeded, so the buffer is initialised.
    let st = unsafe { st.assume_init() };
    st.st_mode & libc::S_IFMT == libc::S_IFSOCK
}

/// Sorts named descriptors into [`Passed`]; unknown ones are closed (and logged).
pub fn sort(named: Vec<(String, OwnedFd)>) -> Passed {
    let mut passed = Passed::default();
    let mut halves: HashMap<String, (Option<OwnedFd>, Option<OwnedFd>)> = HashMap::new();
    for (name, fd) in named {
        if let Some(vm) = name
            .strip_prefix(PREFIX)
            .and_then(|n| n.strip_prefix("q."))
            .and_then(|v| v.parse().ok())
        {
            passed.quotas.insert(vm, fd);
            continue;
        }
        if let Some(vm) = name
            .strip_prefix(PREFIX)
            .and_then(|n| n.strip_prefix("r."))
            .and_then(|v| v.parse().ok())
        {
            passed.rings.insert(vm, fd);
            continue;
        }
        if parse_worker_name(&name).is_none() {
            warn!("file-descriptor store: unknown entry {name:?} closed");
            if name.starts_with(PREFIX) {
                passed.gone.push(name);
            }
            continue;
        }
        let entry = halves.entry(name).or_default();
        if is_socket(fd.as_raw_fd()) {
            entry.0 = Some(fd);
        } else {
            entry.1 = Some(fd);
        }
    }
    for (name, halves) in halves {
        let Some((vm, session, pid, slot)) = parse_worker_name(&name) else {
            continue;
        };
        match halves {
            (Some(channel), Some(pidfd)) => passed.workers.push(StoredWorker {
                vm,
                session,
                pid,
                slot,
                channel,
                pidfd,
            }),
            // The channel hung up (systemd dropped it): the worker is gone.
            _ => {
                info!("file-descriptor store: worker {pid} of session {session} is gone");
                passed.gone.push(name);
            }
        }
    }
    passed.workers.sort_by_key(|w| (w.vm, w.session));
    passed
}

/// Takes the descriptors of the previous daemon (`LISTEN_FDS` entries whose `LISTEN_FDNAMES`
/// name starts with [`PREFIX`]) out of the passed range, and leaves the others (the listening
/// sockets of a socket unit) at 3, 4, ... with `LISTEN_FDS` and `LISTEN_FDNAMES` saying so, for
/// `socket_activation`. Call before any thread starts (it changes the environment and the
/// descriptor table).
pub fn take_passed() -> Passed {
    let mine = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.trim().parse::<RawFd>().ok())
        .filter(|n| (1..=4096).contains(n));
    let (true, Some(count)) = (mine, count) else {
        return Passed::default();
    };
    let names: Vec<String> = std::env::var("LISTEN_FDNAMES")
        .unwrap_or_default()
        .split(':')
        .map(str::to_string)
        .collect();
    let mut named = Vec::new();
    let mut kept_names = Vec::new();
    let mut next = crate::socket_activation::LISTEN_FDS_START;
    for i in 0..count {
        let fd = crate::socket_activation::LISTEN_FDS_START + i;
        let name = usize::try_from(i)
            .ok()
            .and_then(|i| names.get(i).cloned())
            .unwrap_or_default();
        if name.starts_with(PREFIX) {
            // SAFETY: F_DUPFD_CLOEXEC of a passed descriptor returns a new one (or -1).
            let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3 + count) };
            // SAFETY: `fd` was passed to this process and nothing else uses it.
            unsafe { libc::close(fd) };
            if copy >= 0 {
                // SAFETY: a fresh descriptor nothing else owns.
                named.push((name, unsafe { OwnedFd::from_raw_fd(copy) }));
            }
            continue;
        }
        if fd != next {
            // SAFETY: dup2 onto a slot freed above (a store entry's), then close the old one.
            unsafe {
                libc::dup2(fd, next);
                libc::close(fd);
            }
        }
        kept_names.push(name);
        next += 1;
    }
    let kept = next - crate::socket_activation::LISTEN_FDS_START;
    if kept == 0 {
        for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            std::env::remove_var(var);
        }
    } else {
        std::env::set_var("LISTEN_FDS", kept.to_string());
        std::env::set_var("LISTEN_FDNAMES", kept_names.join(":"));
    }
    let passed = sort(named);
    if !passed.workers.is_empty() {
        info!(
            "file-descriptor store: {} worker(s) of the previous daemon to take over",
            passed.workers.len()
        );
    }
    passed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_names_round_trip() {
        let n = worker_name(2, 77, 1234, Some(5));
        assert_eq!(n, "qcuda-w.2.77.1234.5");
        assert_eq!(parse_worker_name(&n), Some((2, 77, 1234, Some(5))));
        let n = worker_name(0, 1, 9, None);
        assert_eq!(parse_worker_name(&n), Some((0, 1, 9, None)));
        for bad in [
            "qcuda-w.1.2.3",
            "qcuda-w.1.2.3.4.5",
            "qcuda-w.a.2.3.4",
            "w.1.2.3.4",
            "qcuda-q.1",
        ] {
            assert_eq!(parse_worker_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn sort_pairs_channels_with_pidfds_and_drops_the_rest() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let pidfd = crate::sandbox::pidfd_open(std::process::id()).unwrap();
        let (lone, _c) = std::os::unix::net::UnixStream::pair().unwrap();
        let memfd = OwnedFd::from(tempfile_like());
        let passed = sort(vec![
            (worker_name(0, 3, 42, Some(1)), pidfd),
            (worker_name(0, 3, 42, Some(1)), OwnedFd::from(a)),
            // A worker whose channel systemd dropped: only its pidfd is left... here only a
            // channel, which is as incomplete.
            (worker_name(1, 4, 43, None), OwnedFd::from(lone)),
            (quota_name(0), memfd),
            (
                "vhost-cuda@vm0.socket".to_string(),
                OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
            ),
        ]);
        assert_eq!(passed.workers.len(), 1);
        let w = &passed.workers[0];
        assert_eq!((w.vm, w.session, w.pid, w.slot), (0, 3, 42, Some(1)));
        assert!(is_socket(w.channel.as_raw_fd()));
        assert!(!is_socket(w.pidfd.as_raw_fd()));
        assert!(passed.quotas.contains_key(&0));
        assert_eq!(passed.gone, vec![worker_name(1, 4, 43, None)]);
    }

    fn tempfile_like() -> std::fs::File {
        // SAFETY: memfd_create with a NUL-terminated name returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor.
        unsafe { std::fs::File::from_raw_fd(fd) }
    }
}

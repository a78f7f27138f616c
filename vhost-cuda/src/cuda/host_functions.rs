//! Host functions (`cudaLaunchHostFunc`, `cudaStreamAddCallback`, graph host nodes), worker
//! side.
//!
//! The guest's function must run in the guest process, in stream order: work queued after it
//! starts only when it has returned. The worker therefore enqueues a host function of its own,
//! [`trampoline`], with the driver. When the stream reaches it, the driver calls it on one of
//! its own threads; it announces the guest's function as due on the host-function link (a
//! socket to the daemon, apart from the request channel) and blocks until the daemon passes on
//! the guest's "returned". The request loop is not involved, so a synchronisation running in
//! it (which waits for the very function) cannot deadlock with it.
//!
//! Link records are 16 bytes, little-endian: worker → daemon `Due { key, seq }`, daemon →
//! worker `Done { seq, 0 }`. `key` is the guest's, handed back untouched; `seq` numbers each
//! run of a function, so that a graph node that runs again is released by its own answer. An
//! unknown `seq` (a hostile or stale guest) is ignored. When the link closes (session ending,
//! daemon gone) every waiting function returns at once and later ones do not wait, so nothing
//! the guest does or fails to do can keep the worker's streams blocked past its session.
//!
//! A worker kept across a daemon restart ([`LinkAttacher::survive_daemon`]) instead keeps its
//! runs waiting when the link closes (the daemon died; its successor sends a new link), and
//! announces every waiting run again on the new link; its session's end (the worker dropping
//! its state) releases them.

use std::{
    collections::{HashMap, HashSet},
    ffi::c_void,
    io::{Read, Write},
    os::unix::net::UnixStream,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread,
};

use tracing::{debug, warn};

/// Bytes of one link record.
pub const RECORD: usize = 16;
/// Most host functions of one session enqueued and not yet run; beyond, launching one fails
/// with `cudaErrorMemoryAllocation` (each holds a little worker memory until it runs).
pub(crate) const MAX_PENDING: usize = 1 << 16;

/// Encodes a link record.
pub fn record(a: u64, b: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..8].copy_from_slice(&a.to_le_bytes());
    r[8..].copy_from_slice(&b.to_le_bytes());
    r
}

/// Decodes a link record.
pub fn parse_record(r: &[u8; RECORD]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&r[..8]);
    b.copy_from_slice(&r[8..]);
    (u64::from_le_bytes(a), u64::from_le_bytes(b))
}

#[derive(Default)]
struct State {
    /// The daemon's end, for `Due` records; `None` before the link arrives and after it broke.
    link: Option<UnixStream>,
    /// The link has been attached once and is gone now: nothing waits any more.
    closed: bool,
    next_seq: u64,
    /// Runs announced and not yet released, with the guest's key.
    waiting: HashMap<u64, u64>,
    /// A closed link means the daemon died, not that the session ended: runs keep waiting for
    /// the next daemon's link.
    survive_daemon: bool,
    /// Runs the guest has released and whose trampoline has not woken yet.
    released: HashSet<u64>,
    /// Calls enqueued with the driver and not yet run (one-shot) or alive (graph nodes).
    live: usize,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The session's host functions: the link to the daemon and the runs waiting on it.
pub(crate) struct HostFunctions {
    shared: Arc<Shared>,
}

impl Default for HostFunctions {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    next_seq: 1,
                    ..State::default()
                }),
                wake: Condvar::new(),
            }),
        }
    }
}

/// Attaches the host-function link of a session (see [`HostFunctions::attacher`]).
pub struct LinkAttacher(Arc<Shared>);

impl std::fmt::Debug for LinkAttacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkAttacher")
    }
}

impl LinkAttacher {
    /// Keeps runs waiting across a closed link, for the link of the next daemon.
    pub fn survive_daemon(&self) {
        self.0.state().survive_daemon = true;
    }

    /// Takes the link from the daemon and starts the thread that reads its `Done` records.
    pub fn attach(&self, link: UnixStream) {
        let reader = match link.try_clone() {
            Ok(r) => r,
            Err(e) => {
                warn!("host-function link unusable: {e}");
                self.0.state().closed = true;
                return;
            }
        };
        {
            let mut st = self.0.state();
            if st.closed || (st.link.is_some() && !st.survive_daemon) {
                warn!("a second host-function link: ignored");
                return;
            }
            // A restarted daemon's link: the runs that wait are announced on it again.
            let mut link = link;
            let again: Vec<(u64, u64)> = st.waiting.iter().map(|(&s, &k)| (s, k)).collect();
            for (seq, key) in again {
                if link.write_all(&record(key, seq)).is_err() {
                    warn!("host-function link broke while runs were announced again");
                }
            }
            st.link = Some(link);
        }
        let shared = Arc::clone(&self.0);
        let spawned = thread::Builder::new()
            .name("qcuda-hostfn".into())
            .spawn(move || read_done(reader, &shared));
        if let Err(e) = spawned {
            warn!("cannot start the host-function thread: {e}");
            close(&self.0);
        }
    }
}

/// What the driver's thread gets as user data: one guest function, for one run (a stream's
/// host function) or for as long as a graph holds it.
pub(crate) struct HostCall {
    key: u64,
    one_shot: bool,
    shared: Arc<Shared>,
}

impl HostFunctions {
    /// A handle that attaches the link later, while the session is borrowed elsewhere.
    pub(crate) fn attacher(&self) -> LinkAttacher {
        LinkAttacher(Arc::clone(&self.shared))
    }

    /// A new call for the driver, or `None` if too many are alive. The pointer is what
    /// [`trampoline`] expects; a one-shot call frees itself after its run, any other must be
    /// freed with [`HostFunctions::free`] once the driver can no longer run it.
    pub(crate) fn call(&self, key: u64, one_shot: bool) -> Option<*mut c_void> {
        let mut st = self.shared.state();
        if st.live >= MAX_PENDING {
            return None;
        }
        st.live += 1;
        drop(st);
        let call = Box::new(HostCall {
            key,
            one_shot,
            shared: Arc::clone(&self.shared),
        });
        Some(Box::into_raw(call).cast())
    }

    /// Frees a call the driver will never run (its launch failed, or its graph is gone).
    ///
    /// # Safety
    /// `call` came from [`HostFunctions::call`] of this session, was not freed before, and no
    /// driver thread runs or will run it.
    pub(crate) unsafe fn free(call: *mut c_void) {
        // SAFETY: by the contract, we own the box.
        let call = unsafe { Box::from_raw(call.cast::<HostCall>()) };
        call.shared.state().live -= 1;
    }

    /// The guest's key of `call` (what a saved state keeps of a host node).
    ///
    /// # Safety
    /// `call` came from [`HostFunctions::call`] and was not freed.
    pub(crate) unsafe fn key_of(call: *const c_void) -> u64 {
        // SAFETY: by the contract, a live HostCall.
        unsafe { (*call.cast::<HostCall>()).key }
    }

    /// Whether host functions can run (the link is there and open).
    pub(crate) fn linked(&self) -> bool {
        let st = self.shared.state();
        st.link.is_some() && !st.closed
    }
}

impl Drop for HostFunctions {
    fn drop(&mut self) {
        close(&self.shared);
    }
}

/// The link is gone: release everything that waits, and let later runs pass.
fn close(shared: &Shared) {
    let mut st = shared.state();
    st.closed = true;
    st.link = None;
    let waiting: Vec<u64> = st.waiting.drain().map(|(seq, _)| seq).collect();
    st.released.extend(waiting);
    shared.wake.notify_all();
}

fn read_done(mut link: UnixStream, shared: &Shared) {
    let mut r = [0u8; RECORD];
    while link.read_exact(&mut r).is_ok() {
        let (seq, _) = parse_record(&r);
        let mut st = shared.state();
        if st.waiting.remove(&seq).is_some() {
            st.released.insert(seq);
            shared.wake.notify_all();
        } else {
            debug!(seq, "host function release for no waiting run: ignored");
        }
    }
    debug!("host-function link closed");
    let mut st = shared.state();
    if st.survive_daemon && !st.closed {
        // The daemon died: its successor sends a new link. (The session's end drops the
        // state, which releases everything.)
        st.link = None;
        return;
    }
    drop(st);
    close(shared);
}

/// The host function the worker gives the driver (`CUhostFn`).
///
/// # Safety
/// `user_data` is a pointer from [`HostFunctions::call`], alive (a one-shot call is run at
/// most once, and freed here).
pub(crate) unsafe extern "C" fn trampoline(user_data: *mut c_void) {
    // SAFETY: by the contract, the call is alive until we free it below (one-shot) or its
    // graph is destroyed, which the driver does not do while a node runs.
    let call = unsafe { &*(user_data as *const HostCall) };
    run(call);
    if call.one_shot {
        // SAFETY: a one-shot call is ours once it has run; nothing refers to it any more.
        unsafe { HostFunctions::free(user_data) };
    }
}

/// Announces `call` and waits for the guest to release it.
fn run(call: &HostCall) {
    let shared = &call.shared;
    let mut st = shared.state();
    if st.closed {
        return;
    }
    let seq = st.next_seq;
    st.next_seq += 1;
    let sent = match st.link.as_mut() {
        Some(link) => link.write_all(&record(call.key, seq)).is_ok(),
        // Between two daemons: announced when the next one links.
        None => st.survive_daemon,
    };
    if !sent {
        // No link yet (cannot happen: the daemon sends it before any request) or broken.
        warn!(
            key = call.key,
            "host function due but the link is gone; skipped"
        );
        drop(st);
        close(shared);
        return;
    }
    st.waiting.insert(seq, call.key);
    while !st.released.remove(&seq) {
        st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_run_waits_for_its_own_release_and_ignores_others() {
        let hf = HostFunctions::default();
        let (worker_end, mut daemon) = UnixStream::pair().unwrap();
        hf.attacher().attach(worker_end);
        let call = hf.call(77, true).unwrap() as usize;
        let runner = thread::spawn(move || {
            // SAFETY: a fresh one-shot call, run once.
            unsafe { trampoline(call as *mut c_void) }
        });
        let mut r = [0u8; RECORD];
        daemon.read_exact(&mut r).unwrap();
        let (key, seq) = parse_record(&r);
        assert_eq!(key, 77);
        // A release of another run changes nothing.
        daemon.write_all(&record(seq + 1000, 0)).unwrap();
        thread::sleep(Duration::from_millis(50));
        assert!(!runner.is_finished());
        daemon.write_all(&record(seq, 0)).unwrap();
        runner.join().unwrap();
        assert_eq!(hf.shared.state().live, 0);
    }

    #[test]
    fn a_closed_link_releases_waiting_runs_and_later_ones() {
        let hf = HostFunctions::default();
        let (worker_end, mut daemon) = UnixStream::pair().unwrap();
        hf.attacher().attach(worker_end);
        let call = hf.call(5, false).unwrap() as usize;
        let runner = thread::spawn(move || {
            // SAFETY: alive until freed below, after both runs.
            unsafe { trampoline(call as *mut c_void) };
            // SAFETY: as above.
            unsafe { trampoline(call as *mut c_void) };
        });
        let mut r = [0u8; RECORD];
        daemon.read_exact(&mut r).unwrap();
        drop(daemon);
        runner.join().unwrap();
        assert!(!hf.linked());
        // SAFETY: no driver runs it any more.
        unsafe { HostFunctions::free(call as *mut c_void) };
        assert_eq!(hf.shared.state().live, 0);
    }

    #[test]
    fn a_kept_worker_announces_waiting_runs_again_on_the_next_daemons_link() {
        let hf = HostFunctions::default();
        hf.attacher().survive_daemon();
        let (worker_end, mut daemon) = UnixStream::pair().unwrap();
        hf.attacher().attach(worker_end);
        let call = hf.call(9, true).unwrap() as usize;
        let runner = thread::spawn(move || {
            // SAFETY: a fresh one-shot call, run once.
            unsafe { trampoline(call as *mut c_void) }
        });
        let mut r = [0u8; RECORD];
        daemon.read_exact(&mut r).unwrap();
        let (key, seq) = parse_record(&r);
        assert_eq!(key, 9);
        // The daemon dies: the run keeps waiting.
        drop(daemon);
        thread::sleep(Duration::from_millis(50));
        assert!(!runner.is_finished());
        // The next daemon's link: the run is announced again and its release ends it.
        let (worker_end, mut daemon) = UnixStream::pair().unwrap();
        hf.attacher().attach(worker_end);
        daemon.read_exact(&mut r).unwrap();
        assert_eq!(parse_record(&r), (9, seq));
        daemon.write_all(&record(seq, 0)).unwrap();
        runner.join().unwrap();
        assert_eq!(hf.shared.state().live, 0);
        // The session's end releases what waits.
        let call = hf.call(10, true).unwrap() as usize;
        let runner = thread::spawn(move || {
            // SAFETY: a fresh one-shot call, run once.
            unsafe { trampoline(call as *mut c_void) }
        });
        daemon.read_exact(&mut r).unwrap();
        drop(hf);
        runner.join().unwrap();
    }

    #[test]
    fn live_calls_are_bounded() {
        let hf = HostFunctions::default();
        hf.shared.state().live = MAX_PENDING;
        assert!(hf.call(1, true).is_none());
    }
}

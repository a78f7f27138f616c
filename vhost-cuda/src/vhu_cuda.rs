//! The vhost-user edge: the [`VhostUserBackend`] of the qcuda device and the draining of its
//! request queue.
//!
//! This is the only module that knows about vrings. It pops chains from queue 0, has
//! `chain.rs` parse them, answers malformed ones on the spot and hands the rest to the
//! [`SessionTable`], whose session threads complete them later through a [`VringCompleter`].
//! Queue 1 (host-to-guest events) is set up but not used yet: buffers the guest posts there
//! stay queued.
//!
//! Live migration (QEMU's `migrate`) goes through here too. The device offers dirty logging
//! (`VHOST_F_LOG_ALL`, `VHOST_USER_PROTOCOL_F_LOG_SHMFD`): every write through the daemon's
//! map of guest RAM marks its pages in QEMU's log, and so does every request's output buffers
//! as its chain completes, since workers write them through maps of their own and the GPU by
//! DMA. When the request ring stops while logging is on (the migration's last stop, the VM
//! paused) the daemon waits for the requests under way, quiesces every session (its worker
//! synchronises its GPU work and saves its record without device memory), and marks the guest
//! pages the GPU can write at any time, which each record lists (pinned, registered and managed
//! memory); all of guest RAM if a worker ended while QEMU logged. QEMU's last RAM pass then
//! carries them. QEMU then takes the sessions' state through
//! `VHOST_USER_PROTOCOL_F_DEVICE_STATE` ([`VhostUserBackend::set_device_state_fd`], in the
//! `session/migration.rs` stream): first its head, with an offer of the device memory to a
//! destination on this host (`session/handover.rs`); if one claims it within
//! [`HandoverSetup::wait`], the workers export their runs to it and the states go without their
//! memory (the "handover" path), else the whole states are saved and sent (the "copy" path).
//! The destination's daemon claims what is offered from its own host, and starts the same
//! sessions from the states (and the claimed memory) before the VM runs there. A migration
//! that fails leaves every session here as it was: saving and exporting change nothing.
//!
//! The backend implements the `&self` trait with fine-grained state (atomics, the session
//! table's own lock, the vring's lock), so the vhost-user thread, the vring thread and the
//! session threads never wait on one big lock. One backend serves one connection; `lib.rs`
//! makes a new one for the next connection.

use std::{
    fs::File,
    io::{self, Read},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, RwLock,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use qcuda_proto::{EVENT_QUEUE, NUM_QUEUES, QUEUE_SIZE, REQUEST_QUEUE};
use tracing::{debug, info, trace, warn};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::{bitmap::BitmapMmapRegion, VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::{
    virtio_config::VIRTIO_F_VERSION_1,
    virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC},
};
use virtio_queue::QueueT;
use vm_memory::{
    bitmap::Bitmap, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryRegion,
};
use vmm_sys_util::{
    epoll::EventSet,
    event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier},
};

use crate::{
    chain,
    cuda::CudaHost,
    guest_buffer::{GuestBuffer, GuestRam},
    ring_record::{RingAddrs, RingRecord},
    session::{
        handover::{self, Claim, HandoverServer, Offer, Piece},
        migration::{self, SavedGpu, SessionState, PATH_COPY, PATH_HANDOVER},
        migration_figures::MigrationLog,
        precopy::{self, SessionRound, Stores},
        ChainCompleter, SessionTable,
    },
    spin_wait,
    worker::{widen_pipe, SealedMap, WorkerCommand},
};

/// Guest memory as vhost-user-backend shares it with us (swapped on SET_MEM_TABLE).
pub type GuestMemoryHandle = GuestMemoryAtomic<GuestRam>;
/// The vring type of this backend.
pub type Vring = VringRwLock<GuestMemoryHandle>;

/// How long GET_VRING_BASE waits for requests in flight before the ring is stopped anyway.
pub const STOP_WAIT: Duration = Duration::from_secs(30);
/// How long a disconnect or reset waits for sessions to close before moving on.
pub const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// How long a migration's last stop waits for every session's saved state.
pub const SAVE_WAIT: Duration = Duration::from_secs(600);
/// How long a migration's destination waits for every session's restore.
pub const RESTORE_WAIT: Duration = Duration::from_secs(600);

/// How long a migration's source waits for a destination on its host to claim its device
/// memory (`--handover-wait-ms`) before it sends the memory as data.
pub const HANDOVER_WAIT: Duration = Duration::from_millis(300);
/// How long a destination's claim may take once connected (the source exports every run
/// first, which waits for the GPU's work).
pub const CLAIM_WAIT: Duration = Duration::from_secs(60);

/// A host's identity for a handover: its boot id, and the UUID of each guest device's GPU in
/// guest-device order.
type Identity = ([u8; 16], Vec<[u8; 16]>);

/// How a migration's source offers its device memory to a destination on the same host
/// (`session/handover.rs`), and how long it waits for the claim.
#[derive(Debug, Clone)]
pub struct HandoverSetup {
    /// Where the source's handover socket is made (the daemon's runtime directory); `None`:
    /// the source never offers, and every migration copies.
    pub dir: Option<std::path::PathBuf>,
    /// How long the source waits for a claim.
    pub wait: Duration,
}

impl Default for HandoverSetup {
    fn default() -> Self {
        Self {
            dir: None,
            wait: HANDOVER_WAIT,
        }
    }
}

/// How a migration's source pre-copies its device memory while the VM runs
/// (`session/precopy.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrecopySetup {
    /// Bytes of chunk contents one round carries at most (`--precopy-round-mib`).
    pub round_bytes: u64,
    /// Passes over the device memory at most (`--precopy-passes`); 0: no pre-copy (every
    /// round reports nothing pending).
    pub passes: u32,
}

impl Default for PrecopySetup {
    fn default() -> Self {
        Self {
            round_bytes: 64 << 20,
            passes: 2,
        }
    }
}

/// How long a pre-copy round waits for every session's chunk log.
pub const PRECOPY_WAIT: Duration = Duration::from_secs(60);

/// `VHOST_F_LOG_ALL`: the back-end logs its writes to guest RAM (a vhost feature bit, not a
/// virtio one: QEMU sets it while a migration runs; the guest never acks it).
pub const VHOST_F_LOG_ALL: u64 = 1 << 26;

/// The virtio features the device offers.
pub const DEVICE_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | VHOST_F_LOG_ALL
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// Names of the feature bits in `features`, e.g. `VERSION_1 | RING_EVENT_IDX`.
pub fn feature_names(features: u64) -> String {
    const NAMES: [(u64, &str); 5] = [
        (1 << VIRTIO_F_VERSION_1, "VERSION_1"),
        (1 << VIRTIO_RING_F_INDIRECT_DESC, "RING_INDIRECT_DESC"),
        (1 << VIRTIO_RING_F_EVENT_IDX, "RING_EVENT_IDX"),
        (VHOST_F_LOG_ALL, "LOG_ALL"),
        (
            VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
            "PROTOCOL_FEATURES",
        ),
    ];
    let mut names: Vec<String> = NAMES
        .iter()
        .filter(|(bit, _)| features & bit != 0)
        .map(|(_, n)| (*n).to_string())
        .collect();
    let rest = NAMES.iter().fold(features, |f, (bit, _)| f & !bit);
    if rest != 0 {
        names.push(format!("{rest:#x}"));
    }
    if names.is_empty() {
        "none".into()
    } else {
        names.join(" | ")
    }
}

/// Marks `len` bytes of guest RAM from `gpa` dirty in QEMU's log, region by region (a no-op
/// without a log; bytes outside guest RAM are skipped). Returns the bytes inside guest RAM.
fn mark_dirty(mem: &GuestRam, gpa: u64, len: u64) -> u64 {
    let (mut at, end) = (gpa, gpa.saturating_add(len));
    let mut marked = 0;
    while at < end {
        let Some(r) = mem.find_region(GuestAddress(at)) else {
            // A hole: go on at the next region above it, if any.
            match mem
                .iter()
                .map(|r| r.start_addr().0)
                .filter(|&s| s > at)
                .min()
            {
                Some(next) => {
                    at = next;
                    continue;
                }
                None => break,
            }
        };
        let off = at - r.start_addr().0;
        let n = (r.len() - off).min(end - at);
        r.bitmap().mark_dirty(
            usize::try_from(off).unwrap_or(usize::MAX),
            usize::try_from(n).unwrap_or(usize::MAX),
        );
        marked += n;
        at += n;
    }
    marked
}

/// Completes chains on the request vring, from any session thread.
pub struct VringCompleter {
    vring: Vring,
    /// False once the ring was stopped (GET_VRING_BASE, reset, disconnect): after that the
    /// ring belongs to the frontend again and must not be written.
    live: Arc<RwLock<bool>>,
    /// The record of chains in flight, for a restarted daemon (`ring_record.rs`).
    record: Option<Arc<RingRecord>>,
    /// Guest RAM as the daemon maps it now, whose bitmaps are QEMU's dirty log once it gave one.
    mem: GuestMemoryHandle,
    /// Whether QEMU asked for dirty logging (the backend's flag).
    logging: Arc<AtomicBool>,
}

impl std::fmt::Debug for VringCompleter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VringCompleter").finish_non_exhaustive()
    }
}

impl ChainCompleter for VringCompleter {
    fn wrote(&self, outputs: &[GuestBuffer]) {
        // Checked before the chain completes, so a page written before logging began was
        // written before QEMU's first pass copies it (QEMU waits for SET_FEATURES' answer when
        // it turns logging on), and one written after is marked here.
        if !self.logging.load(Ordering::Acquire) {
            return;
        }
        let mem = self.mem.memory();
        for run in outputs.iter().flat_map(GuestBuffer::runs) {
            mark_dirty(&mem, run.addr.0, run.len as u64);
        }
    }

    fn complete(&self, head: u16, used_len: u32) {
        // Held across the update, so stopping the ring waits for a completion under way.
        let live = self.live.read().unwrap_or_else(|p| p.into_inner());
        if !*live {
            warn!("chain {head} finished after its ring stopped; completion dropped");
            return;
        }
        let mut vring = self.vring.get_mut();
        if let Some(r) = &self.record {
            r.completing(head, vring.get_queue().next_used());
        }
        if let Err(e) = vring.add_used(head, used_len) {
            warn!("cannot complete chain {head}: {e}");
            return;
        }
        if let Some(r) = &self.record {
            r.completed(head, vring.get_queue().next_used());
        }
        // With EVENT_IDX the guest says when it wants an interrupt; without, it always does.
        if vring.needs_notification().unwrap_or(true) {
            if let Err(e) = vring.signal_used_queue() {
                warn!("cannot signal the used queue: {e}");
            }
        }
    }
}

/// The qcuda device backend for one vhost-user connection.
pub struct VhostCudaBackend {
    label: String,
    mem: GuestMemoryHandle,
    /// Shared with a migration's transfer thread, which saves or exports the sessions.
    sessions: Arc<SessionTable>,
    live: Arc<RwLock<bool>>,
    acked_features: AtomicU64,
    event_idx: AtomicBool,
    started: [AtomicBool; NUM_QUEUES],
    /// How long the request queue is polled after its last chain before waiting for a kick.
    poll: Duration,
    /// Whether a frontend connected to this backend.
    connected: AtomicBool,
    /// The record of the request ring's chains in flight, kept for the next daemon.
    record: Option<Arc<RingRecord>>,
    /// Set until the request ring first starts when the record is the previous daemon's: the
    /// chains it had in flight are taken again then.
    recover: AtomicBool,
    /// Whether QEMU asked for dirty logging (`VHOST_F_LOG_ALL` acked: a migration runs).
    logging: Arc<AtomicBool>,
    /// How many of the VM's workers had ended when logging last began: a worker that ends
    /// while QEMU logs takes with it the knowledge of which guest pages its GPU wrote.
    ended_before_log: AtomicU64,
    /// A migration's state transfer.
    migration: Mutex<Migration>,
    /// The VM's migration figures, phase by phase (`session/migration_figures.rs`).
    figures: MigrationLog,
    /// The same-host handover of a migration's device memory.
    handover: HandoverSetup,
    /// The pre-copy of device memory while the VM runs.
    precopy: PrecopySetup,
    /// A destination's pre-copied device memory, per session, until the final state's
    /// restore takes it (`None` until the first round arrives).
    stores: Arc<Mutex<Option<Stores>>>,
    /// Whether a state transfer into this connection began (a destination's).
    loading: AtomicBool,
}

/// A migration's state transfer, as far as it has come.
#[derive(Default)]
struct Migration {
    /// The sessions' records (their states without device memory), saved when the request
    /// ring stopped while logging (the last stop of a migration's source: the quiesce), or why
    /// they could not be.
    saved: Option<Result<Vec<SessionState>, String>>,
    /// The thread moving the state through QEMU's pipe: a save yields nothing, a load what it
    /// read.
    transfer: Option<JoinHandle<Result<Option<Incoming>, String>>>,
}

/// What a destination read: the sessions, and the pieces of device memory it claimed (none
/// unless the source handed its memory over).
#[derive(Debug)]
struct Incoming {
    states: Vec<SessionState>,
    pieces: Vec<Piece>,
}

/// What a migration's source saves its sessions with: the session table, or a test double.
trait MigrationSessions: Send + Sync {
    /// Every session's whole state, device memory included.
    fn save_states(&self, timeout: Duration) -> Result<Vec<SessionState>, String>;
    /// Every session's runs exported and its state without contents.
    fn export_states(&self, timeout: Duration) -> Result<(Vec<SessionState>, Vec<Piece>), String>;
    /// One pre-copy round of every session (`SessionTable::precopy_round`).
    fn precopy_round(
        &self,
        budget: u64,
        passes: u32,
        timeout: Duration,
    ) -> Result<Vec<SessionRound>, String>;
}

impl MigrationSessions for SessionTable {
    fn save_states(&self, timeout: Duration) -> Result<Vec<SessionState>, String> {
        SessionTable::save_states(self, timeout)
    }

    fn export_states(&self, timeout: Duration) -> Result<(Vec<SessionState>, Vec<Piece>), String> {
        SessionTable::export_states(self, timeout)
    }

    fn precopy_round(
        &self,
        budget: u64,
        passes: u32,
        timeout: Duration,
    ) -> Result<Vec<SessionRound>, String> {
        SessionTable::precopy_round(self, budget, passes, timeout)
    }
}

impl std::fmt::Debug for VhostCudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostCudaBackend")
            .field("label", &self.label)
            .field("sessions", &self.sessions)
            .finish()
    }
}

impl VhostCudaBackend {
    /// A backend for one connection. `mem` must be the same handle given to
    /// `VhostUserDaemon::new`, so that SET_MEM_TABLE updates reach the chain parser; `workers`
    /// starts the sessions' worker processes.
    pub fn new(
        host: Arc<CudaHost>,
        workers: WorkerCommand,
        mem: GuestMemoryHandle,
        label: impl Into<String>,
    ) -> Self {
        Self::with_quota_file(host, workers, mem, label, None)
    }

    /// Like [`VhostCudaBackend::new`], counting in the accounting file a previous daemon left
    /// (`SessionTable::with_quota_file`).
    pub fn with_quota_file(
        host: Arc<CudaHost>,
        workers: WorkerCommand,
        mem: GuestMemoryHandle,
        label: impl Into<String>,
        quota_file: Option<std::os::fd::OwnedFd>,
    ) -> Self {
        let label = label.into();
        Self {
            sessions: Arc::new(SessionTable::with_quota_file(
                host,
                workers,
                label.clone(),
                quota_file,
            )),
            label,
            mem,
            live: Arc::new(RwLock::new(false)),
            acked_features: AtomicU64::new(0),
            event_idx: AtomicBool::new(false),
            started: [const { AtomicBool::new(false) }; NUM_QUEUES],
            poll: Duration::ZERO,
            connected: AtomicBool::new(false),
            record: None,
            recover: AtomicBool::new(false),
            logging: Arc::new(AtomicBool::new(false)),
            ended_before_log: AtomicU64::new(0),
            migration: Mutex::new(Migration::default()),
            figures: MigrationLog::default(),
            handover: HandoverSetup::default(),
            precopy: PrecopySetup::default(),
            stores: Arc::new(Mutex::new(None)),
            loading: AtomicBool::new(false),
        }
    }

    /// Pre-copies device memory during a migration as `setup` says.
    pub fn with_precopy(mut self, setup: PrecopySetup) -> Self {
        self.precopy = setup;
        self
    }

    /// Offers a migration's device memory to a destination on this host as `setup` says.
    pub fn with_handover(mut self, setup: HandoverSetup) -> Self {
        self.handover = setup;
        self
    }

    /// This host's identity for a handover: its boot id and the UUID of each guest device's
    /// GPU, in order (`None` if the boot id is unreadable or the host has no GPU).
    fn identity(&self) -> Option<Identity> {
        let boot = match handover::boot_id() {
            Ok(b) => b,
            Err(e) => {
                warn!(vm = %self.label, "migration: no handover: this host's boot id: {e}");
                return None;
            }
        };
        let gpus = self.sessions.gpu_uuids();
        (!gpus.is_empty()).then_some((boot, gpus))
    }

    /// Records the VM's migration figures in `figures` (the VM's own, which outlive this
    /// connection: `lib.rs` takes them from the stats registry).
    pub fn with_migration_log(mut self, figures: MigrationLog) -> Self {
        self.figures = figures;
        self
    }

    /// The VM's migration figures.
    pub fn migration_log(&self) -> &MigrationLog {
        &self.figures
    }

    /// Polls the request queue for `poll` after its last chain before going back to waiting
    /// for the guest's kick. While it polls the guest does not kick (with `EVENT_IDX` the
    /// device simply does not move the avail event; without, `VRING_USED_F_NO_NOTIFY` is set),
    /// which under TCG saves an exit to QEMU and a wake-up per request, at the price of a host
    /// core spinning for up to `poll` after each burst.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Keeps the record of the request ring's chains in flight in `record` (`ring_record.rs`);
    /// `recover`: it is the previous daemon's, and its chains in flight are taken again when
    /// the ring first starts.
    pub fn with_ring_record(mut self, record: Option<Arc<RingRecord>>, recover: bool) -> Self {
        self.record = record;
        self.recover = AtomicBool::new(recover);
        self
    }

    /// Records that a frontend connected.
    pub fn note_connected(&self) {
        self.connected.store(true, Ordering::Release);
        self.sessions.start_spares();
    }

    /// Whether a frontend connected to this backend.
    pub fn was_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// The sessions of this connection.
    pub fn sessions(&self) -> &SessionTable {
        &self.sessions
    }

    /// What completes the request ring's chains.
    fn completer(&self, vring: &Vring) -> VringCompleter {
        VringCompleter {
            vring: vring.clone(),
            live: self.live.clone(),
            record: self.record.clone(),
            mem: self.mem.clone(),
            logging: self.logging.clone(),
        }
    }

    /// Whether the rings are still ours (a reset or disconnect ends a poll).
    fn sessions_live(&self) -> bool {
        *self.live.read().unwrap_or_else(|p| p.into_inner())
    }

    fn set_live(&self, live: bool) {
        *self.live.write().unwrap_or_else(|p| p.into_inner()) = live;
    }

    fn migration(&self) -> std::sync::MutexGuard<'_, Migration> {
        self.migration.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks every page of guest RAM dirty in QEMU's log (a no-op without a log); returns the
    /// bytes marked.
    fn mark_all_dirty(&self) -> u64 {
        let mem = self.mem.memory();
        let mut bytes = 0;
        for r in mem.iter() {
            r.bitmap()
                .mark_dirty(0, usize::try_from(r.len()).unwrap_or(usize::MAX));
            bytes += r.len();
        }
        bytes
    }

    /// At the last stop, with every worker quiesced: marks dirty in QEMU's log the guest pages
    /// the GPU can write behind the daemon's map at any time ([`Self::gpu_written_runs`]).
    /// What workers wrote into requests' buffers was marked as each chain completed
    /// ([`VringCompleter::wrote`]). Where those pages are not known for sure, all of guest RAM
    /// is marked. Returns the bytes marked.
    fn mark_gpu_written(&self, states: &[SessionState]) -> u64 {
        match self.gpu_written_runs(states) {
            Ok(runs) => {
                let mem = self.mem.memory();
                let ram: u64 = mem.iter().map(|r| r.len()).sum();
                let mut bytes = 0u64;
                for (gpa, len) in runs {
                    bytes = bytes.saturating_add(mark_dirty(&mem, gpa, len));
                    if bytes >= ram {
                        // The records (a worker's word) name more than guest RAM holds: marking
                        // it all once is cheaper than going on.
                        return self.mark_all_dirty();
                    }
                }
                bytes
            }
            Err(why) => {
                info!(
                    vm = %self.label,
                    "migration: {why}: all of guest RAM is marked for the last pass"
                );
                self.mark_all_dirty()
            }
        }
    }

    /// The guest-physical runs every session's GPU can write behind the daemon's map: those of
    /// its writable host mappings (pinned, registered, and managed memory's guest side) and of
    /// managed memory placed on the device, as its record lists them. Unknown (`Err`, why) when
    /// logging did not begin before this stop, when a worker ended while QEMU logged (its
    /// mappings went with it), or when a record does not read back.
    fn gpu_written_runs(&self, states: &[SessionState]) -> Result<Vec<(u64, u64)>, String> {
        if !self.logging.load(Ordering::Acquire) {
            return Err("dirty logging is off".into());
        }
        if self.sessions.workers_ended() != self.ended_before_log.load(Ordering::Acquire) {
            return Err("a worker ended while QEMU logged dirty pages".into());
        }
        let mut runs = Vec::new();
        for s in states {
            let SavedGpu::State(file) = &s.gpu else {
                continue;
            };
            // Sealed and mapped, as a restore reads one: the worker cannot change it meanwhile.
            let record = file
                .seal()
                .and_then(|()| SealedMap::new(file.file()))
                .map_err(|e| e.to_string())
                .and_then(|map| {
                    let len = usize::try_from(file.len()).unwrap_or(usize::MAX);
                    let bytes = map.bytes().get(..len).ok_or("the file is shorter")?;
                    crate::cuda::gpu_written_guest_ram(bytes)
                });
            match record {
                Ok(r) => runs.extend(r),
                Err(e) => {
                    return Err(format!(
                        "the record of session {} does not read back ({e})",
                        s.id
                    ))
                }
            }
        }
        Ok(runs)
    }

    /// The last stop of a migration's source (the VM is paused, the ring idle): saves every
    /// session's state now, while QEMU has yet to copy guest RAM for the last time, and marks
    /// guest RAM dirty where the GPU may have written it.
    fn save_for_migration(&self) {
        let started = Instant::now();
        // The figures began when logging did (`acked_features`): the pre-copy's rounds are
        // this migration's too.
        // Only the records (no device memory): they quiesce every worker and tell whether its
        // state can be saved at all. Whether the memory is then handed over or copied is known
        // once the state transfer begins (`send_state`).
        let saved = self.sessions.save_records(SAVE_WAIT);
        match &saved {
            Ok(states) => {
                let bytes = state_bytes(states);
                self.figures.record(&self.label, "quiesce", bytes, started);
                // The GPU wrote pinned guest memory without the daemon's map seeing it: QEMU's
                // last pass must carry those pages.
                let marked = self.mark_gpu_written(states);
                info!(
                    vm = %self.label,
                    sessions = states.len(),
                    bytes,
                    marked,
                    ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "migration: sessions quiesced at the last stop"
                );
            }
            Err(why) => warn!(
                vm = %self.label,
                "migration: the sessions cannot be saved ({why}); the migration will fail and \
                 the VM go on here"
            ),
        }
        self.migration().saved = Some(saved);
    }

    /// The frontend is gone: stop completing chains and close every session. A destination
    /// whose migration never finished frees what it kept of the source's pre-copy.
    pub fn disconnect(&self) {
        self.set_live(false);
        self.sessions.stop_spares();
        self.sessions.close_all(CLOSE_WAIT);
        if let Some(stores) = self.stores.lock().unwrap_or_else(|p| p.into_inner()).take() {
            stores.release();
        }
    }

    /// Logs a queue's layout the first time it is serviced after (re)starting; for the
    /// request queue, starts the ring's record, or first takes again what the previous daemon
    /// had in flight.
    fn note_started(&self, index: usize, vring: &Vring) {
        if self.started[index].swap(true, Ordering::AcqRel) {
            return;
        }
        if index == usize::from(REQUEST_QUEUE) {
            self.start_record(vring);
        }
        let state = vring.get_ref();
        let q = state.get_queue();
        info!(
            vm = %self.label,
            "vring {index} started: size {}, desc {:#x}, avail {:#x}, used {:#x}, event_idx {}",
            q.size(),
            q.desc_table(),
            q.avail_ring(),
            q.used_ring(),
            q.event_idx_enabled()
        );
    }

    fn start_record(&self, vring: &Vring) {
        let Some(record) = &self.record else { return };
        let mem = self.mem.memory().into_inner();
        let (addrs, next_avail, next_used, avail_idx) = {
            let state = vring.get_ref();
            let q = state.get_queue();
            (
                RingAddrs {
                    desc: q.desc_table(),
                    avail: q.avail_ring(),
                    used: q.used_ring(),
                },
                q.next_avail(),
                q.next_used(),
                q.avail_idx(&*mem, std::sync::atomic::Ordering::Acquire)
                    .ok(),
            )
        };
        let recovery = if self.recover.swap(false, Ordering::AcqRel) {
            match (vring.queue_used_idx().ok(), avail_idx) {
                (Some(used), Some(avail)) => record.recovery(addrs, used, avail.0),
                _ => None,
            }
        } else {
            None
        };
        let Some(recovery) = recovery else {
            record.start(addrs, next_avail, next_used);
            return;
        };
        info!(
            vm = %self.label,
            "request ring of the previous daemon: {} chain(s) in flight taken again, going on at \
             avail {} (the frontend said {next_avail})",
            recovery.in_flight.len(),
            recovery.next_avail
        );
        record.start(addrs, recovery.next_avail, next_used);
        self.set_live(true);
        let completer: Arc<dyn ChainCompleter> = Arc::new(self.completer(vring));
        for (pos, head) in recovery.in_flight {
            let chain = {
                let mut state = vring.get_mut();
                let q = state.get_queue_mut();
                q.set_next_avail(pos);
                q.pop_descriptor_chain(mem.clone())
            };
            match chain {
                Some(chain) if chain.head_index() == head => {
                    record.taken(head, pos);
                    self.dispatch(&mem, chain, &completer);
                }
                _ => warn!(
                    vm = %self.label,
                    "chain {head} at avail {pos} of the previous daemon is not there any more"
                ),
            }
        }
        vring
            .get_mut()
            .get_queue_mut()
            .set_next_avail(recovery.next_avail);
    }

    /// Parses a chain and hands it to its session (or answers it, if malformed).
    fn dispatch(
        &self,
        mem: &Arc<GuestRam>,
        chain: virtio_queue::DescriptorChain<Arc<GuestRam>>,
        completer: &Arc<dyn ChainCompleter>,
    ) {
        let head = chain.head_index();
        match chain::parse(mem, chain) {
            Ok(parsed) => self.sessions.dispatch(head, parsed, completer.clone()),
            Err(rejected) => {
                debug!(vm = %self.label, "chain {head} rejected: {}", rejected.error);
                completer.complete(head, rejected.answer());
            }
        }
    }

    /// Drains the request queue: disable notifications, pop everything, re-enable, and go
    /// again if the guest added chains in between.
    fn process_requests(&self, vring: &Vring) {
        if !vring.get_ref().get_queue().ready() {
            return;
        }
        self.set_live(true);
        let completer: Arc<dyn ChainCompleter> = Arc::new(self.completer(vring));
        let mut last_chain = Instant::now();
        // Polling is spinning: it needs a slot of the host's spin budget (spin_wait.rs), kept
        // while chains keep coming; without one, the queue waits for the next kick at once.
        let mut poll_slot = (!self.poll.is_zero())
            .then(|| spin_wait::take_slot(self.poll))
            .flatten();
        // Set when re-enabling found chains announced after a pass that popped none: the guest
        // may simply have added one in between, so look once more before calling it corrupt.
        let mut announced_unseen = false;
        loop {
            if let Err(e) = vring.disable_notification() {
                warn!(vm = %self.label, "request queue unusable: {e}");
                return;
            }
            let popped = self.drain(vring, &completer);
            trace!(vm = %self.label, "request queue: {popped} chain(s) taken");
            if popped > 0 {
                last_chain = Instant::now();
                // Chains came: whatever was announced before was real.
                announced_unseen = false;
                if !self.poll.is_zero() {
                    poll_slot = match poll_slot.take() {
                        Some(Some(mut slot)) => {
                            if slot.extend(self.poll) {
                                Some(Some(slot))
                            } else {
                                // Overran and lost it: take a free one, if any.
                                spin_wait::take_slot(self.poll)
                            }
                        }
                        Some(None) => Some(None),
                        None => spin_wait::take_slot(self.poll),
                    };
                }
            }
            if poll_slot.is_some() && last_chain.elapsed() < self.poll {
                // Notifications stay off: look again soon.
                if !self.sessions_live() {
                    return;
                }
                std::hint::spin_loop();
                continue;
            }
            match vring.enable_notification() {
                Ok(true) if popped > 0 || !announced_unseen => {
                    announced_unseen = popped == 0;
                    continue;
                }
                // Announced twice with nothing poppable in between: a corrupt avail index.
                // Don't spin.
                Ok(true) => {
                    warn!(vm = %self.label, "avail ring index is inconsistent; waiting for a kick");
                    return;
                }
                Ok(false) => return,
                Err(e) => {
                    warn!(vm = %self.label, "request queue unusable: {e}");
                    return;
                }
            }
        }
    }

    fn drain(&self, vring: &Vring, completer: &Arc<dyn ChainCompleter>) -> usize {
        // One snapshot of the memory map per pass: each chain, and every buffer parsed from
        // it, keeps the snapshot it was read with, even across a SET_MEM_TABLE.
        let mem = self.mem.memory().into_inner();
        let mut popped = 0;
        loop {
            let chain = {
                let mut state = vring.get_mut();
                let q = state.get_queue_mut();
                let pos = q.next_avail();
                let chain = q.pop_descriptor_chain(mem.clone());
                if let (Some(r), Some(c)) = (&self.record, &chain) {
                    r.taken(c.head_index(), pos);
                    r.advanced(q.next_avail());
                }
                chain
            };
            let Some(chain) = chain else {
                return popped;
            };
            popped += 1;
            self.dispatch(&mem, chain, completer);
        }
    }
}

impl VhostUserBackend for VhostCudaBackend {
    type Bitmap = BitmapMmapRegion;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        usize::from(QUEUE_SIZE)
    }

    fn features(&self) -> u64 {
        DEVICE_FEATURES
    }

    fn acked_features(&self, features: u64) {
        self.acked_features.store(features, Ordering::Release);
        let logging = features & VHOST_F_LOG_ALL != 0;
        if logging && !self.logging.load(Ordering::Acquire) {
            // Counted before the flag is set: a worker ending from here on is seen at the stop.
            self.ended_before_log
                .store(self.sessions.workers_ended(), Ordering::Release);
        }
        if self.logging.swap(logging, Ordering::AcqRel) != logging {
            info!(vm = %self.label, "dirty logging {}", if logging { "on" } else { "off" });
            // A migration begins, or ended without a stop here (failed, cancelled): what an
            // earlier pre-copy sent is no base for the next.
            self.sessions.precopy_reset();
            if logging {
                self.figures.begin("source");
            }
        }
        if !logging {
            // No migration runs (any more): a state saved for one is stale.
            self.migration().saved = None;
        }
        info!(
            vm = %self.label,
            "acked features {features:#x} ({}); offered {DEVICE_FEATURES:#x}",
            feature_names(features)
        );
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::DEVICE_STATE
    }

    fn reset_device(&self) {
        info!(vm = %self.label, "device reset: closing all sessions");
        if let Some(r) = &self.record {
            r.stop();
        }
        self.set_live(false);
        for s in &self.started {
            s.store(false, Ordering::Release);
        }
        self.sessions.close_all(CLOSE_WAIT);
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
        debug!(vm = %self.label, "event_idx {enabled}");
    }

    fn update_memory(&self, mem: GuestMemoryHandle) -> io::Result<()> {
        let map = mem.memory();
        let total: u64 = map.iter().map(|r| r.len()).sum();
        info!(
            vm = %self.label,
            "SET_MEM_TABLE: {} region(s), {} MiB of guest RAM",
            map.num_regions(),
            total >> 20
        );
        for (i, r) in map.iter().enumerate() {
            let start = r.start_addr().0;
            info!(
                vm = %self.label,
                "SET_MEM_TABLE: region {i}: GPA {start:#x}..{:#x} ({} bytes)",
                start.saturating_add(r.len()),
                r.len()
            );
        }
        // The sessions' worker processes map the new table too.
        self.sessions.set_memory(map.into_inner());
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
            Ok(pair) => Some(pair),
            Err(e) => {
                warn!("cannot create the vring worker's exit event: {e}");
                None
            }
        }
    }

    fn stop_vring(&self, index: u32) -> io::Result<()> {
        if let Some(s) = self.started.get(index as usize) {
            s.store(false, Ordering::Release);
        }
        if index == u32::from(REQUEST_QUEUE) {
            if let Some(r) = &self.record {
                // The frontend owns the ring again: a later daemon takes nothing from it.
                r.stop();
            }
            // The ring goes back to the frontend when we return: let requests under way finish
            // first, as the vhost-user spec asks.
            if !self.sessions.wait_idle(STOP_WAIT) {
                warn!(
                    vm = %self.label,
                    "request ring stopped with {} requests still running; their completions \
                     will be dropped",
                    self.sessions.in_flight()
                );
            }
            self.set_live(false);
            if self.logging.load(Ordering::Acquire) {
                self.save_for_migration();
            }
        }
        info!(vm = %self.label, "vring {index} stopped");
        Ok(())
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        if !matches!(phase, VhostTransferStatePhase::STOPPED) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "only the stopped phase of a state transfer is supported",
            ));
        }
        let mut m = self.migration();
        if m.transfer.is_some() {
            return Err(io::Error::other("a state transfer is under way already"));
        }
        let label = self.label.clone();
        let spawned = match direction {
            // While QEMU logs and the request ring has not had its last stop, the VM runs:
            // QEMU's pre-copy section asks for a round (qemu-patches/0006).
            VhostTransferStateDirection::SAVE
                if self.logging.load(Ordering::Acquire) && m.saved.is_none() =>
            {
                let source = Source {
                    label,
                    figures: self.figures.clone(),
                    offer: None,
                    wait: Duration::ZERO,
                };
                let (sessions, precopy) = (Arc::clone(&self.sessions), self.precopy);
                thread::Builder::new()
                    .name("qcuda-precopy-out".into())
                    .spawn(move || send_round(&source, &*sessions, precopy, file))
            }
            VhostTransferStateDirection::SAVE => {
                // Quiesced at the ring's last stop; without one (no migration's logging: a
                // snapshot, say) the sessions are quiesced now.
                let saved = match m.saved.take() {
                    Some(s) => s,
                    None => {
                        let started = Instant::now();
                        self.figures.begin("source");
                        let saved = self.sessions.save_records(SAVE_WAIT);
                        if let Ok(states) = &saved {
                            let bytes = state_bytes(states);
                            self.figures.record(&label, "quiesce", bytes, started);
                        }
                        saved
                    }
                };
                // A handover is offered only where there is device memory to hand over.
                let offer = match &saved {
                    Ok(states) if states.iter().any(|s| s.gpu.file().is_some()) => self
                        .handover
                        .dir
                        .clone()
                        .and_then(|dir| self.identity().map(|id| (dir, id))),
                    _ => None,
                };
                let source = Source {
                    label,
                    figures: self.figures.clone(),
                    offer,
                    wait: self.handover.wait,
                };
                let sessions = Arc::clone(&self.sessions);
                thread::Builder::new()
                    .name("qcuda-migrate-out".into())
                    .spawn(move || send_state(&source, &*sessions, file, saved))
            }
            VhostTransferStateDirection::LOAD => {
                // The first transfer into this connection, a pre-copy round or the state,
                // begins the migration's figures.
                if !self.loading.swap(true, Ordering::AcqRel) {
                    self.figures.begin("destination");
                }
                let figures = self.figures.clone();
                let local = self.identity();
                let stores = Arc::clone(&self.stores);
                let limit = self.sessions.gpu_memory().saturating_mul(2);
                thread::Builder::new()
                    .name("qcuda-migrate-in".into())
                    .spawn(move || receive(&label, &figures, local, &stores, limit, file))
            }
        };
        m.transfer = Some(spawned?);
        Ok(None)
    }

    fn check_device_state(&self) -> io::Result<()> {
        let transfer = self.migration().transfer.take();
        let Some(transfer) = transfer else {
            return Err(io::Error::other("no state transfer was started"));
        };
        let outcome = transfer
            .join()
            .unwrap_or_else(|_| Err("the state transfer's thread panicked".into()));
        let outcome = match outcome {
            Ok(Some(Incoming { states, pieces })) => {
                let started = Instant::now();
                let n = states.len();
                let bytes = state_bytes(&states);
                let stores = self.stores.lock().unwrap_or_else(|p| p.into_inner()).take();
                let restored = match stores {
                    // A handover brought the memory itself: what was pre-copied goes unused.
                    Some(mut stores) if pieces.is_empty() => {
                        let r = self
                            .sessions
                            .restore_precopied(states, &mut stores, RESTORE_WAIT);
                        stores.release();
                        r
                    }
                    stores => {
                        if let Some(s) = stores {
                            s.release();
                        }
                        self.sessions
                            .restore_handed_over(states, pieces, RESTORE_WAIT)
                    }
                };
                restored.map(|()| {
                    self.figures.record(&self.label, "restore", bytes, started);
                    info!(
                        vm = %self.label,
                        sessions = n,
                        ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                        "migration: sessions restored"
                    );
                })
            }
            Ok(None) => Ok(()),
            Err(why) => Err(why),
        };
        outcome.map_err(|why| {
            warn!(vm = %self.label, "migration: state transfer failed: {why}");
            io::Error::other(why)
        })
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        if !evset.contains(EventSet::IN) {
            warn!(vm = %self.label, "unexpected event {evset:?} on {device_event}");
            return Ok(());
        }
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            warn!(vm = %self.label, "event for unknown queue {device_event}");
            return Ok(());
        };
        self.note_started(usize::from(device_event), vring);
        match device_event {
            REQUEST_QUEUE => self.process_requests(vring),
            // Reserved for host-to-guest events: the guest's buffers wait there.
            EVENT_QUEUE => {}
            _ => {}
        }
        // Guest mistakes never end the vring thread: they are answered or logged above.
        Ok(())
    }
}

/// Bytes of the saved states among `states`.
fn state_bytes(states: &[SessionState]) -> u64 {
    states
        .iter()
        .map(|s| s.gpu.file().map_or(0, crate::worker::StateFile::len))
        .sum()
}

/// A migration's source, as its transfer thread sees it.
struct Source {
    label: String,
    figures: MigrationLog,
    /// Where to offer a handover, and this host's identity (boot id, GPU UUIDs); `None`: no
    /// offer.
    offer: Option<(std::path::PathBuf, Identity)>,
    /// How long to wait for the claim.
    wait: Duration,
}

/// A migration's source: writes the head of the stream (with a handover offer where it can
/// make one), waits for a destination on this host to claim the device memory, and then
/// writes the sessions: without their device memory if it was claimed (the "handover" path),
/// their whole states otherwise (the "copy" path). Closes QEMU's pipe at the end.
fn send_state(
    source: &Source,
    sessions: &dyn MigrationSessions,
    file: File,
    saved: Result<Vec<SessionState>, String>,
) -> Result<Option<Incoming>, String> {
    // Dropping the file at the end is the end of the stream for QEMU, also on an error (QEMU
    // then asks CHECK_DEVICE_STATE, which reports it).
    let records = saved?;
    let label = source.label.as_str();
    widen_pipe(&file);
    let mut out = io::BufWriter::with_capacity(1 << 20, file);
    let server = source.offer.as_ref().and_then(|(dir, (boot, gpus))| {
        match HandoverServer::open(dir, *boot, gpus.clone()) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(vm = %label, "migration: no handover offered ({e}); the memory is copied");
                None
            }
        }
    });
    let head = migration::write_head(
        &mut out,
        server.as_ref().map(|(_, offer)| offer),
        if server.is_some() {
            migration::HEAD_PADDING
        } else {
            0
        },
    );
    head.map_err(|e| e.to_string())?;
    let handed = match &server {
        Some((server, _)) => hand_over(source, sessions, server),
        None => None,
    };
    drop(records);
    let (path, states) = match handed {
        Some(states) => (PATH_HANDOVER, states),
        None => {
            // The copy path: the whole states, saved now (the VM is stopped, the workers
            // quiesced since the last stop: nothing changed).
            let started = Instant::now();
            let states = sessions.save_states(SAVE_WAIT)?;
            source
                .figures
                .record(label, "save", state_bytes(&states), started);
            (PATH_COPY, states)
        }
    };
    let started = Instant::now();
    migration::write_body(&mut out, path, &states).map_err(|e| e.to_string())?;
    source
        .figures
        .record(label, "send", state_bytes(&states), started);
    info!(
        vm = %label,
        sessions = states.len(),
        path = if path == PATH_HANDOVER { "handover" } else { "copy" },
        "migration: state sent"
    );
    Ok(None)
}

/// Waits for a claim of `server`'s offer; the claim takes every session's runs, exported when
/// it comes. The states without contents if the memory was handed over; `None` if it was not
/// (no claim in time, a refused or failed one, an export that failed): the memory is then
/// copied, and the source is as it was.
fn hand_over(
    source: &Source,
    sessions: &dyn MigrationSessions,
    server: &HandoverServer,
) -> Option<Vec<SessionState>> {
    let label = source.label.as_str();
    let started = Instant::now();
    let mut exported: Option<Vec<SessionState>> = None;
    let claim = server.serve_with(Instant::now() + source.wait, CLAIM_WAIT, || match sessions
        .export_states(SAVE_WAIT)
    {
        Ok((states, pieces)) => {
            exported = Some(states);
            Ok(pieces)
        }
        Err(why) => Err(why),
    });
    match claim {
        Ok((Claim::Claimed, pieces, bytes)) => {
            source
                .figures
                .record_pieces(label, "handover", bytes, pieces, started.elapsed());
            info!(
                vm = %label,
                pieces,
                bytes,
                "migration: device memory handed over to a destination on this host (path: handover)"
            );
            exported
        }
        Ok((Claim::Unclaimed, ..)) => {
            info!(
                vm = %label,
                wait_ms = u64::try_from(source.wait.as_millis()).unwrap_or(u64::MAX),
                "migration: no destination on this host claimed the device memory; it is copied (path: copy)"
            );
            None
        }
        Err(why) => {
            warn!(vm = %label, "migration: the handover failed ({why}); the memory is copied (path: copy)");
            None
        }
    }
}

/// A migration's destination: reads the head from QEMU's pipe, claims the device memory if the
/// head offers it from this host (`local`: this host's boot id and GPUs), then reads the
/// sessions to the stream's end.
/// A round of a migration's pre-copy, while the VM runs: every session's chunk log of what
/// changed since it last sent, in one round (`session/precopy.rs`) into QEMU's pipe; closes
/// the pipe at the end. QEMU reads the head's `pending` to decide when to stop the VM.
fn send_round(
    source: &Source,
    sessions: &dyn MigrationSessions,
    setup: PrecopySetup,
    file: File,
) -> Result<Option<Incoming>, String> {
    let started = Instant::now();
    let rounds = if setup.passes == 0 {
        Vec::new()
    } else {
        sessions.precopy_round(setup.round_bytes, setup.passes, PRECOPY_WAIT)?
    };
    let pending: u64 = rounds.iter().map(|r| r.pending).sum();
    let bytes: u64 = rounds.iter().map(|r| r.log.len()).sum();
    widen_pipe(&file);
    let mut out = io::BufWriter::with_capacity(1 << 20, file);
    precopy::write_round(&mut out, pending, &rounds).map_err(|e| e.to_string())?;
    let chunks: u64 = rounds.iter().map(|r| r.chunks).sum();
    debug!(vm = %source.label, sessions = rounds.len(), chunks, "migration: pre-copy round sent");
    source
        .figures
        .record_round(&source.label, bytes, pending, started.elapsed());
    Ok(None)
}

/// A migration's destination: a state transfer is either a pre-copy round (appended to the
/// sessions' stores, nothing restored yet) or the final state.
fn receive(
    label: &str,
    figures: &MigrationLog,
    local: Option<Identity>,
    stores: &Mutex<Option<Stores>>,
    limit: u64,
    file: File,
) -> Result<Option<Incoming>, String> {
    let started = Instant::now();
    widen_pipe(&file);
    let mut input = io::BufReader::with_capacity(1 << 20, file);
    let mut magic = [0u8; 8];
    input
        .read_exact(&mut magic)
        .map_err(|e| format!("the state transfer: {e}"))?;
    if magic != precopy::MAGIC {
        return receive_state(
            label,
            figures,
            local,
            &mut io::Cursor::new(magic).chain(input),
            started,
        );
    }
    let mut held = stores.lock().unwrap_or_else(|p| p.into_inner());
    let stores = held.get_or_insert_with(|| Stores::new(limit));
    let round = stores
        .read_round(&mut input)
        .map_err(|e| format!("a pre-copy round: {e}"))?;
    figures.record_round(label, round.bytes, round.pending, started.elapsed());
    Ok(None)
}

fn receive_state(
    label: &str,
    figures: &MigrationLog,
    local: Option<Identity>,
    input: &mut impl Read,
    started: Instant,
) -> Result<Option<Incoming>, String> {
    let head = migration::read_head(input).map_err(|e| e.to_string())?;
    let mut pieces = Vec::new();
    let mut claimed = false;
    if let Some(offer) = &head.offer {
        match &local {
            Some((boot, gpus)) if is_local(offer, boot, gpus) => {
                let t = Instant::now();
                match handover::claim(offer, CLAIM_WAIT) {
                    Ok(p) => {
                        let bytes: u64 = p.iter().map(|p| p.meta[2]).sum();
                        figures.record_pieces(
                            label,
                            "handover",
                            bytes,
                            p.len() as u64,
                            t.elapsed(),
                        );
                        pieces = p;
                        claimed = true;
                    }
                    Err(e) => {
                        warn!(vm = %label, "migration: the source's device memory could not be claimed ({e}); it comes as data");
                    }
                }
            }
            _ => info!(
                vm = %label,
                "migration: the source is on another host or GPU: its device memory comes as data"
            ),
        }
    }
    let (path, states) = migration::read_body(input, &head).map_err(|e| e.to_string())?;
    match path {
        PATH_HANDOVER if !claimed => {
            return Err(
                "the source handed its device memory over, but it was not claimed here".into(),
            )
        }
        // The source saw the claim fail (its acknowledgement lost): the memory comes as data,
        // and what was claimed is dropped.
        PATH_COPY if claimed => pieces.clear(),
        _ => {}
    }
    figures.record(label, "receive", state_bytes(&states), started);
    info!(
        vm = %label,
        sessions = states.len(),
        path = if path == PATH_HANDOVER { "handover" } else { "copy" },
        "migration: state received"
    );
    Ok(Some(Incoming { states, pieces }))
}

/// Whether an offer comes from this host (`boot`) and names its GPUs as the same guest
/// devices (`gpus`, in guest-device order): the runs are imported as the devices they were.
fn is_local(offer: &Offer, boot: &[u8; 16], gpus: &[[u8; 16]]) -> bool {
    offer.is_local(boot, gpus) && offer.gpus.iter().zip(gpus).all(|(a, b)| a == b)
}

#[cfg(test)]
mod tests {
    use qcuda_proto::{
        status, Checksum, Direction, Op, RequestHeader, ResponseHeader, RESPONSE_HEADER_SIZE,
        VERSION,
    };
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::{
        desc::{split::Descriptor, RawDescriptor},
        mock::MockSplitQueue,
    };
    use vm_memory::Bytes;

    use super::*;

    const DATA: u64 = 0x10_0000;

    struct Rig {
        mem: GuestMemoryHandle,
        backend: VhostCudaBackend,
        vrings: Vec<Vring>,
    }

    fn rig() -> Rig {
        let ram = GuestRam::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap();
        let mem = GuestMemoryAtomic::new(ram);
        // These tests only send ops the daemon answers itself, so no worker is started.
        let workers = WorkerCommand::this_binary(None, "info");
        let backend = VhostCudaBackend::new(CudaHost::probe(), workers, mem.clone(), "test");
        let vrings: Vec<Vring> = (0..NUM_QUEUES)
            .map(|_| Vring::new(mem.clone(), QUEUE_SIZE).unwrap())
            .collect();
        Rig {
            mem,
            backend,
            vrings,
        }
    }

    fn used_entry(mem: &GuestRam, q: &MockSplitQueue<GuestRam>, i: u16) -> (u32, u32) {
        let at = q.used_addr().0 + 4 + 8 * u64::from(i);
        let id: u32 = mem.read_obj(GuestAddress(at)).unwrap();
        let len: u32 = mem.read_obj(GuestAddress(at + 4)).unwrap();
        (id, len)
    }

    fn used_idx(mem: &GuestRam, q: &MockSplitQueue<GuestRam>) -> u16 {
        mem.read_obj(GuestAddress(q.used_addr().0 + 2)).unwrap()
    }

    #[test]
    fn drains_requests_and_completes_them_on_the_used_ring() {
        let r = rig();
        let ram = r.mem.memory();
        let q = MockSplitQueue::new(&*ram, QUEUE_SIZE);
        {
            let v = &r.vrings[0];
            v.set_queue_size(QUEUE_SIZE);
            v.set_queue_info(q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0)
                .unwrap();
            v.set_queue_ready(true);
            v.set_enabled(true);
        }
        // Chain A (descriptors 0-1): Hello. Chain B (2-4): Echo of 1000 bytes.
        // Chain C (5): a lone readable descriptor, completed with used length 0.
        let mut hello = RequestHeader::new(Op::Hello);
        hello.args[0] = u64::from(VERSION);
        ram.write_slice(&hello.encode(), GuestAddress(DATA))
            .unwrap();
        let mut echo = RequestHeader::new(Op::Echo);
        echo.session = 2;
        echo.push_buffer(Direction::In, 1000).unwrap();
        echo.push_buffer(Direction::Out, 1000).unwrap();
        let payload: Vec<u8> = (0..1000u32).map(|i| (i % 253) as u8).collect();
        let mut stream = echo.encode().to_vec();
        stream.extend_from_slice(&payload);
        ram.write_slice(&stream, GuestAddress(DATA + 0x1000))
            .unwrap();
        let w = u16::try_from(VRING_DESC_F_WRITE).unwrap();
        let n = u16::try_from(virtio_bindings::bindings::virtio_ring::VRING_DESC_F_NEXT).unwrap();
        let d = |a, l, f, next| RawDescriptor::from(Descriptor::new(a, l, f, next));
        let descs = [
            d(DATA, 224, n, 1),
            d(DATA + 0x800, 64, w, 0),
            d(DATA + 0x1000, 1224, n, 3),
            d(DATA + 0x2000, 1000, w | n, 4),
            d(DATA + 0x3000, 64, w, 0),
            d(DATA, 224, 0, 0),
        ];
        q.add_desc_chains(&descs, 0).unwrap();

        r.backend
            .handle_event(REQUEST_QUEUE, EventSet::IN, &r.vrings, 0)
            .unwrap();
        assert!(r.backend.sessions().wait_idle(Duration::from_secs(10)));
        assert_eq!(used_idx(&ram, &q), 3);
        let mut used: Vec<(u32, u32)> = (0..3).map(|i| used_entry(&ram, &q, i)).collect();
        used.sort();
        assert_eq!(used, vec![(0, 64), (2, 1064), (5, 0)]);

        let mut b = [0u8; RESPONSE_HEADER_SIZE];
        ram.read_slice(&mut b, GuestAddress(DATA + 0x800)).unwrap();
        let resp = ResponseHeader::decode(&b).unwrap();
        assert_eq!(resp.status, status::SUCCESS);
        assert_eq!(resp.rets[0], u64::from(VERSION));
        ram.read_slice(&mut b, GuestAddress(DATA + 0x3000)).unwrap();
        let resp = ResponseHeader::decode(&b).unwrap();
        assert_eq!(resp.status, status::SUCCESS);
        assert_eq!(resp.rets[0], Checksum::of(&payload));
        let mut out = vec![0u8; 1000];
        ram.read_slice(&mut out, GuestAddress(DATA + 0x2000))
            .unwrap();
        assert_eq!(out, payload);

        assert_eq!(r.backend.sessions().open_count(), 2);
        r.backend.disconnect();
        assert_eq!(r.backend.sessions().open_count(), 0);
    }

    #[test]
    fn a_polled_queue_takes_requests_that_come_without_a_kick() {
        let mut r = rig();
        r.backend.poll = Duration::from_millis(300);
        let ram = r.mem.memory();
        let q = MockSplitQueue::new(&*ram, QUEUE_SIZE);
        let v = &r.vrings[0];
        v.set_queue_size(QUEUE_SIZE);
        v.set_queue_info(q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0)
            .unwrap();
        v.set_queue_ready(true);
        v.set_enabled(true);
        let mut hello = RequestHeader::new(Op::Hello);
        hello.args[0] = u64::from(VERSION);
        ram.write_slice(&hello.encode(), GuestAddress(DATA))
            .unwrap();
        let w = u16::try_from(VRING_DESC_F_WRITE).unwrap();
        let n = u16::try_from(virtio_bindings::bindings::virtio_ring::VRING_DESC_F_NEXT).unwrap();
        let d = |a, l, f, next| RawDescriptor::from(Descriptor::new(a, l, f, next));
        q.add_desc_chains(&[d(DATA, 224, n, 1), d(DATA + 0x800, 64, w, 0)], 0)
            .unwrap();
        std::thread::scope(|s| {
            // One kick; the second request comes while the queue is polled.
            let polling = s.spawn(|| {
                r.backend
                    .handle_event(REQUEST_QUEUE, EventSet::IN, &r.vrings, 0)
                    .unwrap();
            });
            std::thread::sleep(Duration::from_millis(50));
            q.add_desc_chains(&[d(DATA, 224, n, 3), d(DATA + 0x900, 64, w, 0)], 2)
                .unwrap();
            polling.join().unwrap();
        });
        assert!(r.backend.sessions().wait_idle(Duration::from_secs(10)));
        assert_eq!(used_idx(&ram, &q), 2);
        r.backend.disconnect();
    }

    #[test]
    fn a_stopped_ring_is_not_written() {
        let r = rig();
        let ram = r.mem.memory();
        let q = MockSplitQueue::new(&*ram, QUEUE_SIZE);
        let v = &r.vrings[0];
        v.set_queue_size(QUEUE_SIZE);
        v.set_queue_info(q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0)
            .unwrap();
        v.set_queue_ready(true);
        r.backend
            .handle_event(REQUEST_QUEUE, EventSet::IN, &r.vrings, 0)
            .unwrap();
        r.backend.stop_vring(0).unwrap();
        let completer = VringCompleter {
            record: None,
            ..r.backend.completer(v)
        };
        completer.complete(0, 64);
        assert_eq!(used_idx(&ram, &q), 0);
    }

    #[test]
    fn device_reset_closes_every_session() {
        let r = rig();
        let ram = r.mem.memory();
        let q = MockSplitQueue::new(&*ram, QUEUE_SIZE);
        let v = &r.vrings[0];
        v.set_queue_size(QUEUE_SIZE);
        v.set_queue_info(q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0)
            .unwrap();
        v.set_queue_ready(true);
        let mut descs = Vec::new();
        for session in 0..3u16 {
            let mut h = RequestHeader::new(Op::Hello);
            h.session = u64::from(session);
            h.args[0] = u64::from(VERSION);
            let at = DATA + u64::from(session) * 0x1000;
            ram.write_slice(&h.encode(), GuestAddress(at)).unwrap();
            let n =
                u16::try_from(virtio_bindings::bindings::virtio_ring::VRING_DESC_F_NEXT).unwrap();
            let w = u16::try_from(VRING_DESC_F_WRITE).unwrap();
            descs.push(RawDescriptor::from(Descriptor::new(
                at,
                224,
                n,
                2 * session + 1,
            )));
            descs.push(RawDescriptor::from(Descriptor::new(at + 0x800, 64, w, 0)));
        }
        q.add_desc_chains(&descs, 0).unwrap();
        r.backend
            .handle_event(REQUEST_QUEUE, EventSet::IN, &r.vrings, 0)
            .unwrap();
        assert!(r.backend.sessions().wait_idle(Duration::from_secs(10)));
        assert_eq!(used_idx(&ram, &q), 3);
        assert_eq!(r.backend.sessions().open_count(), 3);
        r.backend.reset_device();
        assert_eq!(r.backend.sessions().open_count(), 0);
    }

    #[test]
    fn a_restarted_daemon_takes_again_exactly_the_chains_in_flight() {
        // Three Hello chains of three sessions at avail 0, 1, 2. The old daemon completed the
        // first and the third (out of order) and died with the second in flight. QEMU then
        // rolls the ring back to the used index (2): without the record the third chain would
        // come again (a second completion of a head the guest has back) and the second never.
        let old = rig();
        let ram = old.mem.memory();
        let q = MockSplitQueue::new(&*ram, QUEUE_SIZE);
        let n = u16::try_from(virtio_bindings::bindings::virtio_ring::VRING_DESC_F_NEXT).unwrap();
        let w = u16::try_from(VRING_DESC_F_WRITE).unwrap();
        let mut descs = Vec::new();
        for session in 0..3u16 {
            let mut h = RequestHeader::new(Op::Hello);
            h.session = u64::from(session) + 1;
            h.args[0] = u64::from(VERSION);
            let at = DATA + u64::from(session) * 0x1000;
            ram.write_slice(&h.encode(), GuestAddress(at)).unwrap();
            descs.push(RawDescriptor::from(Descriptor::new(
                at,
                224,
                n,
                2 * session + 1,
            )));
            descs.push(RawDescriptor::from(Descriptor::new(at + 0x800, 64, w, 0)));
        }
        q.add_desc_chains(&descs, 0).unwrap();
        let setup = |v: &Vring| {
            v.set_queue_size(QUEUE_SIZE);
            v.set_queue_info(q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0)
                .unwrap();
            v.set_queue_ready(true);
            v.set_enabled(true);
        };
        setup(&old.vrings[0]);
        let record = Arc::new(RingRecord::create().unwrap());
        let addrs = RingAddrs {
            desc: q.desc_table_addr().0,
            avail: q.avail_addr().0,
            used: q.used_addr().0,
        };
        // What the old daemon's drain and completions recorded.
        record.start(addrs, 0, 0);
        for (pos, head) in [(0u16, 0u16), (1, 2), (2, 4)] {
            record.taken(head, pos);
            record.advanced(pos + 1);
        }
        let completer = VringCompleter {
            live: Arc::new(RwLock::new(true)),
            record: Some(record.clone()),
            ..old.backend.completer(&old.vrings[0])
        };
        completer.complete(0, 64);
        completer.complete(4, 64);
        assert_eq!(used_idx(&ram, &q), 2);

        // The next daemon: the same ring, as QEMU hands it over (avail rolled back to 2).
        let vrings: Vec<Vring> = (0..NUM_QUEUES)
            .map(|_| Vring::new(old.mem.clone(), QUEUE_SIZE).unwrap())
            .collect();
        let backend = VhostCudaBackend::new(
            CudaHost::probe(),
            WorkerCommand::this_binary(None, "info"),
            old.mem.clone(),
            "test",
        )
        .with_ring_record(Some(record.clone()), true);
        let v = &vrings[0];
        setup(v);
        v.set_queue_next_avail(2);
        v.set_queue_next_used(2);
        backend
            .handle_event(REQUEST_QUEUE, EventSet::IN, &vrings, 0)
            .unwrap();
        assert!(backend.sessions().wait_idle(Duration::from_secs(10)));
        assert_eq!(used_idx(&ram, &q), 3);
        let used: Vec<u32> = (0..3).map(|i| used_entry(&ram, &q, i).0).collect();
        assert_eq!(used, vec![0, 4, 2]);
        // It goes on at avail 3, and the record says nothing is in flight.
        assert_eq!(v.get_ref().get_queue().next_avail(), 3);
        assert_eq!(
            record.recovery(addrs, 3, 3).unwrap().in_flight,
            Vec::<(u16, u16)>::new()
        );
        backend.disconnect();
    }

    #[test]
    fn features_are_named() {
        assert_eq!(
            feature_names(DEVICE_FEATURES),
            "VERSION_1 | RING_INDIRECT_DESC | RING_EVENT_IDX | LOG_ALL | PROTOCOL_FEATURES"
        );
        assert_eq!(feature_names(0), "none");
        assert_eq!(feature_names(1 << 32 | 1), "VERSION_1 | 0x1");
    }

    #[test]
    fn a_state_transfer_through_a_pipe_records_each_phase_on_both_ends() {
        let src = rig();
        let dst = rig();
        let log = MigrationLog::default();
        let dst_log = MigrationLog::default();
        let src_backend = src.backend.with_migration_log(log.clone());
        let dst_backend = dst.backend.with_migration_log(dst_log.clone());
        // QEMU's pipes, one per end, joined as QEMU relays the bytes.
        let (from_src, to_qemu) = std::io::pipe().unwrap();
        let (from_qemu, to_dst) = std::io::pipe().unwrap();
        let relay = thread::spawn(move || {
            let mut from_src = from_src;
            let mut to_dst = to_dst;
            io::copy(&mut from_src, &mut to_dst).unwrap()
        });
        dst_backend
            .set_device_state_fd(
                VhostTransferStateDirection::LOAD,
                VhostTransferStatePhase::STOPPED,
                File::from(std::os::fd::OwnedFd::from(from_qemu)),
            )
            .unwrap();
        src_backend
            .set_device_state_fd(
                VhostTransferStateDirection::SAVE,
                VhostTransferStatePhase::STOPPED,
                File::from(std::os::fd::OwnedFd::from(to_qemu)),
            )
            .unwrap();
        src_backend.check_device_state().unwrap();
        // magic, version, no offer, no padding, the copy path and a count of no sessions.
        assert_eq!(relay.join().unwrap(), 25);
        dst_backend.check_device_state().unwrap();
        let phases = |l: &MigrationLog| {
            let f = l.snapshot();
            (f.role, f.phases.iter().map(|p| p.name).collect::<Vec<_>>())
        };
        // No device memory: nothing offered, the copy path.
        assert_eq!(phases(&log), ("source", vec!["quiesce", "save", "send"]));
        assert_eq!(
            phases(&dst_log),
            ("destination", vec!["receive", "restore"])
        );
        // The source's figures belong to the VM: a later connection's backend shares them.
        assert_eq!(phases(src_backend.migration_log()).1.len(), 3);
    }

    /// A test double of a source's session table: sessions whose states are bytes, and whose
    /// device memory is memfds (one per run, holding its number).
    struct FakeSessions {
        exports: std::sync::atomic::AtomicUsize,
        export_fails: bool,
        rounds: std::sync::atomic::AtomicUsize,
    }

    const STATE: &[u8] = b"QCUDAGS1 with device memory";
    const RECORD: &[u8] = b"QCUDAGS1 record";

    impl FakeSessions {
        fn new(export_fails: bool) -> Self {
            Self {
                exports: std::sync::atomic::AtomicUsize::new(0),
                export_fails,
                rounds: std::sync::atomic::AtomicUsize::new(0),
            }
        }

        fn session(gpu: SavedGpu) -> Vec<SessionState> {
            vec![
                SessionState {
                    id: 3,
                    pid: 30,
                    gpu,
                },
                SessionState {
                    id: 4,
                    pid: 40,
                    gpu: SavedGpu::None,
                },
            ]
        }
    }

    impl MigrationSessions for FakeSessions {
        fn save_states(&self, _: Duration) -> Result<Vec<SessionState>, String> {
            Ok(Self::session(SavedGpu::State(
                crate::worker::StateFile::from_bytes(STATE).unwrap(),
            )))
        }

        fn export_states(&self, _: Duration) -> Result<(Vec<SessionState>, Vec<Piece>), String> {
            self.exports.fetch_add(1, Ordering::AcqRel);
            if self.export_fails {
                return Err("the export failed (test)".into());
            }
            let pieces = (0..3u64)
                .map(|i| {
                    let f = crate::worker::StateFile::from_bytes(&i.to_le_bytes()).unwrap();
                    Piece {
                        meta: [0, 0x6800_0000_0000 + (i << 21), 2 << 20],
                        fd: f.file().try_clone().unwrap().into(),
                    }
                })
                .collect();
            let state = crate::worker::StateFile::from_bytes(RECORD).unwrap();
            Ok((
                Self::session(SavedGpu::HandedOver { state, pieces: 3 }),
                pieces,
            ))
        }

        /// Session 3 sends [`LOG`] in each round, with 2 MiB pending.
        fn precopy_round(
            &self,
            budget: u64,
            passes: u32,
            _: Duration,
        ) -> Result<Vec<SessionRound>, String> {
            self.rounds.fetch_add(1, Ordering::AcqRel);
            assert!(budget >= precopy::CHUNK && passes > 0);
            Ok(vec![SessionRound {
                id: 3,
                log: crate::worker::StateFile::from_bytes(&log()).unwrap(),
                chunks: 1,
                pending: 2 << 20,
            }])
        }
    }

    /// A chunk log of one record: 16 bytes at offset 2 MiB of an allocation.
    fn log() -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(&0x7000_0000_0000u64.to_le_bytes());
        r.extend_from_slice(&(2u64 << 20).to_le_bytes());
        r.extend_from_slice(&16u64.to_le_bytes());
        r.extend_from_slice(&[5; 16]);
        r.extend_from_slice(&[6; 16]);
        r
    }

    /// One pre-copy round from `sessions` through a pipe into the destination's `stores`.
    fn round_through(
        sessions: &FakeSessions,
        setup: PrecopySetup,
        stores: &Mutex<Option<Stores>>,
        dst_log: &MigrationLog,
    ) -> Result<Option<Incoming>, String> {
        let (from_src, to_dst) = std::io::pipe().unwrap();
        let source = Source {
            label: "src".into(),
            figures: MigrationLog::default(),
            offer: None,
            wait: Duration::ZERO,
        };
        let file = File::from(std::os::fd::OwnedFd::from(to_dst));
        let sent = thread::scope(|s| {
            let sender = s.spawn(|| send_round(&source, sessions, setup, file));
            let file = File::from(std::os::fd::OwnedFd::from(from_src));
            let got = receive("dst", dst_log, None, stores, 1 << 30, file);
            assert!(sender.join().unwrap().unwrap().is_none());
            got
        });
        let f = source.figures.snapshot();
        assert_eq!(f.phases[0].name, "precopy");
        sent
    }

    #[test]
    fn pre_copy_rounds_reach_the_destinations_store_and_the_final_state_still_follows() {
        let sessions = FakeSessions::new(false);
        let stores = Mutex::new(None);
        let dst_log = MigrationLog::default();
        for _ in 0..2 {
            let got = round_through(&sessions, PrecopySetup::default(), &stores, &dst_log);
            assert!(got.unwrap().is_none());
        }
        assert_eq!(sessions.rounds.load(Ordering::Acquire), 2);
        let p = &dst_log.snapshot().phases[0];
        assert_eq!((p.name, p.rounds, p.bytes), ("precopy", 2, 32));
        // Session 3's store holds both rounds' logs, one after the other.
        let store = stores.lock().unwrap().as_mut().unwrap().take(3).unwrap();
        assert_eq!(store.unwrap().to_vec().unwrap(), [log(), log()].concat());
        // Without passes no session is asked, and nothing is pending.
        let none = PrecopySetup {
            passes: 0,
            ..PrecopySetup::default()
        };
        let got = round_through(&sessions, none, &stores, &dst_log);
        assert!(got.unwrap().is_none());
        assert_eq!(sessions.rounds.load(Ordering::Acquire), 2);
        // A round cut short is refused.
        let mut bytes = Vec::new();
        let rounds = sessions.precopy_round(64 << 20, 2, Duration::ZERO).unwrap();
        precopy::write_round(&mut bytes, 0, &rounds).unwrap();
        bytes.truncate(bytes.len() - 1);
        let f = crate::worker::StateFile::from_bytes(&bytes).unwrap();
        let file = f.file().try_clone().unwrap();
        receive("dst", &dst_log, None, &stores, 1 << 30, file).unwrap_err();
    }

    #[test]
    fn a_save_while_the_ring_runs_and_qemu_logs_is_a_pre_copy_round() {
        let src = rig();
        let dst = rig();
        let log = MigrationLog::default();
        let src_backend = src.backend.with_migration_log(log.clone());
        src_backend.acked_features(DEVICE_FEATURES);
        let (from_src, to_qemu) = std::io::pipe().unwrap();
        src_backend
            .set_device_state_fd(
                VhostTransferStateDirection::SAVE,
                VhostTransferStatePhase::STOPPED,
                File::from(std::os::fd::OwnedFd::from(to_qemu)),
            )
            .unwrap();
        let mut bytes = Vec::new();
        let mut from_src = from_src;
        io::copy(&mut from_src, &mut bytes).unwrap();
        src_backend.check_device_state().unwrap();
        // The head QEMU reads (nothing pending: no session has device memory), the version
        // and no sessions.
        assert_eq!(bytes[..8], precopy::MAGIC);
        assert_eq!(bytes[8..16], 0u64.to_le_bytes());
        assert_eq!(bytes.len(), 24);
        assert_eq!(log.snapshot().role, "source");
        assert_eq!(log.snapshot().phases[0].rounds, 1);
        // The destination takes it as a round, and restores nothing yet.
        let f = crate::worker::StateFile::from_bytes(&bytes).unwrap();
        dst.backend
            .set_device_state_fd(
                VhostTransferStateDirection::LOAD,
                VhostTransferStatePhase::STOPPED,
                f.file().try_clone().unwrap(),
            )
            .unwrap();
        dst.backend.check_device_state().unwrap();
        assert!(dst
            .backend
            .stores
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .is_empty());
        assert_eq!(dst.backend.migration_log().snapshot().role, "destination");
        // A destination whose QEMU goes before the final state keeps nothing of the rounds.
        dst.backend.disconnect();
        assert!(dst.backend.stores.lock().unwrap().is_none());
    }

    const BOOT: [u8; 16] = [1; 16];
    const GPU: [u8; 16] = [7; 16];

    fn handover_dir() -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("qcuda-vhu-handover-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    /// Moves a state from a source over `sessions` (offering from a host of `BOOT` and `GPU`)
    /// through two pipes joined as QEMU joins them, to a destination on a host of `local`.
    fn transfer(
        sessions: &FakeSessions,
        local: Option<([u8; 16], Vec<[u8; 16]>)>,
        wait: Duration,
    ) -> (
        Result<Option<Incoming>, String>,
        MigrationLog,
        MigrationLog,
        Duration,
    ) {
        let (from_src, to_qemu) = std::io::pipe().unwrap();
        let (from_qemu, to_dst) = std::io::pipe().unwrap();
        let relay = thread::spawn(move || {
            let (mut from_src, mut to_dst) = (from_src, to_dst);
            io::copy(&mut from_src, &mut to_dst).unwrap()
        });
        let dst_log = MigrationLog::default();
        let log = dst_log.clone();
        let dst = thread::spawn(move || {
            let file = File::from(std::os::fd::OwnedFd::from(from_qemu));
            receive("dst", &log, local, &Mutex::new(None), u64::MAX, file)
        });
        let source = Source {
            label: "src".into(),
            figures: MigrationLog::default(),
            offer: Some((handover_dir(), (BOOT, vec![GPU]))),
            wait,
        };
        let records = FakeSessions::session(SavedGpu::State(
            crate::worker::StateFile::from_bytes(RECORD).unwrap(),
        ));
        let started = Instant::now();
        let file = File::from(std::os::fd::OwnedFd::from(to_qemu));
        assert!(send_state(&source, sessions, file, Ok(records))
            .unwrap()
            .is_none());
        let took = started.elapsed();
        relay.join().unwrap();
        (dst.join().unwrap(), source.figures, dst_log, took)
    }

    fn names(l: &MigrationLog) -> Vec<&'static str> {
        l.snapshot().phases.iter().map(|p| p.name).collect()
    }

    #[test]
    fn a_same_host_transfer_hands_the_device_memory_over() {
        let sessions = FakeSessions::new(false);
        let wait = Duration::from_secs(20);
        let (got, src, dst, took) = transfer(&sessions, Some((BOOT, vec![GPU, [9; 16]])), wait);
        let got = got.unwrap().unwrap();
        // Claimed at once: the source did not wait out its deadline.
        assert!(took < wait, "{took:?}");
        assert_eq!(sessions.exports.load(Ordering::Acquire), 1);
        assert_eq!(got.states.len(), 2);
        let SavedGpu::HandedOver { state, pieces: 3 } = &got.states[0].gpu else {
            panic!("{:?}", got.states[0].gpu)
        };
        assert_eq!(state.to_vec().unwrap(), RECORD);
        assert_eq!(got.states[1].gpu, SavedGpu::None);
        // The destination holds the source's memory itself, not a copy.
        assert_eq!(got.pieces.len(), 3);
        for (i, p) in got.pieces.iter().enumerate() {
            use std::os::unix::fs::FileExt;
            let mut b = [0u8; 8];
            File::from(p.fd.try_clone().unwrap())
                .read_exact_at(&mut b, 0)
                .unwrap();
            assert_eq!(u64::from_le_bytes(b), i as u64);
            assert_eq!(p.meta[1], 0x6800_0000_0000 + ((i as u64) << 21));
        }
        assert_eq!(names(&src), ["handover", "send"]);
        assert_eq!(names(&dst), ["handover", "receive"]);
        let h = &src.snapshot().phases[0];
        assert_eq!((h.pieces, h.bytes), (3, 3 * (2 << 20)));
    }

    #[test]
    fn a_destination_elsewhere_does_not_claim_and_the_memory_is_copied() {
        let wait = Duration::from_millis(200);
        for local in [
            Some(([2; 16], vec![GPU])),
            Some((BOOT, vec![[9; 16]])),
            // The same GPUs as other guest devices: imported there, they would be misplaced.
            Some((BOOT, vec![[9; 16], GPU])),
            None,
        ] {
            let sessions = FakeSessions::new(false);
            let (got, src, dst, took) = transfer(&sessions, local.clone(), wait);
            let got = got.unwrap().unwrap();
            assert!(took >= wait, "{local:?}: {took:?}");
            assert_eq!(sessions.exports.load(Ordering::Acquire), 0, "{local:?}");
            assert!(got.pieces.is_empty());
            let SavedGpu::State(state) = &got.states[0].gpu else {
                panic!("{:?}", got.states[0].gpu)
            };
            assert_eq!(state.to_vec().unwrap(), STATE, "{local:?}");
            assert_eq!(names(&src), ["save", "send"]);
            assert_eq!(names(&dst), ["receive"]);
        }
    }

    #[test]
    fn a_claim_whose_export_fails_falls_back_to_the_copy() {
        let sessions = FakeSessions::new(true);
        let (got, src, _, _) =
            transfer(&sessions, Some((BOOT, vec![GPU])), Duration::from_secs(20));
        let got = got.unwrap().unwrap();
        assert_eq!(sessions.exports.load(Ordering::Acquire), 1);
        assert!(got.pieces.is_empty());
        assert!(matches!(got.states[0].gpu, SavedGpu::State(_)));
        assert_eq!(names(&src), ["save", "send"]);
    }

    #[test]
    fn hostile_heads_end_the_load_with_an_error_not_a_panic() {
        let load = |bytes: Vec<u8>, local: Option<([u8; 16], Vec<[u8; 16]>)>| {
            let f = crate::worker::StateFile::from_bytes(&bytes).unwrap();
            receive(
                "dst",
                &MigrationLog::default(),
                local,
                &Mutex::new(None),
                u64::MAX,
                f.file().try_clone().unwrap(),
            )
        };
        let offer = Offer {
            boot_id: BOOT,
            gpus: vec![GPU],
            socket: handover_dir().join("nobody-listens.sock"),
            token: [5; 32],
        };
        // An offer of this host whose socket is not there: nothing claimed, the copy is read.
        let mut copy = Vec::new();
        migration::write_head(&mut copy, Some(&offer), 8).unwrap();
        migration::write_body(&mut copy, PATH_COPY, &[]).unwrap();
        let local = Some((BOOT, vec![GPU]));
        assert!(load(copy.clone(), local.clone())
            .unwrap()
            .unwrap()
            .states
            .is_empty());
        // A handover's stream whose pieces never came is refused.
        let mut handed = Vec::new();
        migration::write_head(&mut handed, Some(&offer), 8).unwrap();
        migration::write_body(&mut handed, PATH_HANDOVER, &[]).unwrap();
        load(handed, local.clone()).unwrap_err();
        // A head cut anywhere, and an offer whose lengths lie.
        for cut in 0..copy.len() {
            load(copy[..cut].to_vec(), local.clone()).unwrap_err();
        }
        let mut long = copy.clone();
        long[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        load(long, local.clone()).unwrap_err();
        let mut path = copy;
        path[16 + 24..16 + 28].copy_from_slice(&100u32.to_le_bytes());
        load(path, local).unwrap_err();
    }
}

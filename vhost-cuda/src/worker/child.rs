//! The worker process of one session: `vhost-cuda --session-worker --session-id N`.
//!
//! The daemon starts one per guest process that uses the GPU (`handle.rs`), because
//! only separate processes isolate guest processes from each other on the GPU: measured with
//! driver 580, all CUDA contexts of one process share one GPU address space (a kernel can
//! write another context's memory), and one sticky error fails every context of the process.
//! Here the session's [`GpuState`] lives alone; a fault or an endless kernel ends with this
//! process, and the driver frees everything it had when it exits.
//!
//! The worker maps guest RAM itself from the descriptors the daemon passes
//! (`shared_guest_ram.rs`), and for each [`ToWorker::Run`] rebuilds the [`Request`] from the
//! header bytes and the guest-physical runs, checking everything again as if the daemon were
//! the guest: the header decodes and its op has the right shape, the runs match the buffer
//! table, the session id is this worker's, and every run lies in guest RAM as this process maps
//! it. A request that fails is answered `cudaErrorInvalidValue` and never reaches the driver.
//! Outputs go straight into guest memory; the response header goes back to the daemon, which
//! completes the chain.
//!
//! The worker ends when the daemon closes the channel (dropping the `GpuState` frees its
//! contexts), on a frame it cannot decode (the daemon is the same binary, so that is a broken
//! daemon or channel), and with the daemon's thread that started it (`PR_SET_PDEATHSIG`).

use std::{
    collections::BTreeMap,
    io::{self, Write},
    mem::MaybeUninit,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::net::UnixStream,
    },
    sync::Arc,
    time::{Duration, Instant},
};

use qcuda_proto::{status, Op, RequestHeader, ResponseHeader, WireError};
use thiserror::Error;
use tracing::{debug, error, error_span, info, warn};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::{
    cuda::{
        trace::{cupti, GpuTraceMode, GpuTraceSetup},
        AddressSpace, CheckpointError, CudaHost, ExportedRun, GpuState,
    },
    device_output::DeviceOutput,
    guest_buffer::{BufferError, GuestBuffer, GuestRam, Request, RequestError},
    sandbox::{self, SandboxMode, SeccompMode},
    shared_guest_ram::{map_regions, maps_the_same},
    signals, spin_wait, transport_ops,
    worker::{
        mailbox::{self, Mailbox},
        message::{FromWorker, IpcCall, MessageError, RunRequest, Span, ToWorker, WorkerChannel},
    },
};

/// The descriptor the daemon puts the worker's end of the channel on.
pub const CHANNEL_FD: RawFd = 3;

/// What a worker is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The session (guest process) it serves.
    pub session: u64,
    /// `--gpu` of the daemon.
    pub gpu: Option<u32>,
    /// The VM (socket path), for logs.
    pub vm: String,
    /// Its slot of the VM's GPU-memory quota (`--max-gpu-memory`), whose file is on
    /// [`QUOTA_FD`](crate::limits::QUOTA_FD).
    pub gpu_memory_slot: Option<usize>,
    /// `--hop-poll-us` of the daemon: how long to spin for the next request after an answer.
    pub hop_poll: Duration,
    /// `--sandbox` of the daemon: how this worker confines itself.
    pub sandbox: SandboxMode,
    /// `--worker-seccomp` of the daemon.
    pub seccomp: SeccompMode,
    /// `--sandbox-check`: build the sandbox, then exit 0 (the daemon's start-up check).
    pub sandbox_check: bool,
    /// `--shm-fd`: the inherited descriptor of the VM's shared directory (the worker's
    /// `/dev/shm`).
    pub shm_fd: Option<std::os::fd::RawFd>,
    /// `--gpu-va-base` and `--gpu-va-size` of the daemon: where the session's device
    /// address ranges lie.
    pub address_space: AddressSpace,
    /// `--outlive-daemon`: the daemon keeps this worker for its successor
    /// (`crate::fd_store`): a closed host-function link means the daemon died.
    pub outlive_daemon: bool,
    /// `--gpu-trace` and `--cupti` of the daemon: how a recording of the GPU timeline times GPU
    /// work, and where libcupti is.
    pub gpu_trace: GpuTraceSetup,
    /// `--spare`: started before any guest process needed it (`--spare-workers` of the
    /// daemon): it makes its context on the first GPU, then waits for the session it is given
    /// ([`ToWorker::Bind`], with its quota slot); `session` is unused until then.
    pub spare: bool,
}

/// Why a request from the daemon is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RunError {
    /// The header does not decode, or its op is unknown or has the wrong shape.
    #[error("bad request header: {0:?}")]
    Header(WireError),
    /// The request belongs to another session.
    #[error("request of session {got} sent to the worker of session {expected}")]
    Session {
        /// This worker's session.
        expected: u64,
        /// The header's.
        got: u64,
    },
    /// Not one run list per buffer of the header's table.
    #[error(
        "{inputs} input and {outputs} output run lists for the header's {want_in} and {want_out}"
    )]
    Shape {
        /// Input run lists sent.
        inputs: usize,
        /// Output run lists sent.
        outputs: usize,
        /// Inputs in the header.
        want_in: usize,
        /// Outputs in the header.
        want_out: usize,
    },
    /// A buffer's runs do not add up to its length in the header.
    #[error("buffer {index}: runs of {got} bytes for a buffer of {expected}")]
    Length {
        /// The buffer's index in the table.
        index: usize,
        /// The header's length.
        expected: u64,
        /// The runs' total (saturating).
        got: u64,
    },
    /// A run outside guest RAM.
    #[error("{0}")]
    Memory(#[from] BufferError),
    /// The buffers do not match the header (the checks above rule it out).
    #[error("{0}")]
    Request(#[from] RequestError),
}

/// Rebuilds and checks a request against this worker's map of guest RAM.
pub fn build_request(
    session: u64,
    mem: &Arc<GuestRam>,
    run: &RunRequest,
) -> Result<Request, RunError> {
    let header = RequestHeader::decode(&run.header).map_err(RunError::Header)?;
    header.checked_op().map_err(RunError::Header)?;
    if header.session != session {
        return Err(RunError::Session {
            expected: session,
            got: header.session,
        });
    }
    let (want_in, want_out) = header.counts();
    if run.inputs.len() != want_in || run.outputs.len() != want_out {
        return Err(RunError::Shape {
            inputs: run.inputs.len(),
            outputs: run.outputs.len(),
            want_in,
            want_out,
        });
    }
    // The table lists In buffers first (decode enforces it), like the run lists.
    let lists = run.inputs.iter().chain(&run.outputs);
    let mut buffers = Vec::with_capacity(header.buffers().len());
    for (index, (desc, spans)) in header.buffers().iter().zip(lists).enumerate() {
        let got = spans
            .iter()
            .try_fold(0u64, |t, s| t.checked_add(s.len))
            .unwrap_or(u64::MAX);
        if got != desc.len {
            return Err(RunError::Length {
                index,
                expected: desc.len,
                got,
            });
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the runs add up to desc.len, which RequestHeader::decode bounds by \
                      MAX_BUFFER_LEN (64 MiB), so each fits a usize"
        )]
        let ranges = spans
            .iter()
            .map(|&Span { gpa, len }| (GuestAddress(gpa), len as usize));
        buffers.push(GuestBuffer::new(mem.clone(), ranges)?);
    }
    let outputs = buffers.split_off(want_in);
    Ok(Request::new(header, buffers, outputs)?)
}

/// Where this worker's time per request went, per op: rebuilding the request from guest
/// memory, running it (`execute`: the CUDA calls, their checks, the device-output check) and
/// answering. Logged when the session ends, under the `qcuda::phases` target at debug level
/// (`--log-level info,qcuda::phases=debug`): the *worker* column of `QCUDA_LATENCY`, split.
#[derive(Debug, Default)]
struct Phases {
    /// Per op: requests, then ns rebuilding, running and answering.
    by_op: BTreeMap<u32, [u64; 4]>,
}

impl Phases {
    /// Whether the log would show them.
    fn wanted() -> bool {
        tracing::enabled!(target: "qcuda::phases", tracing::Level::DEBUG)
    }

    fn add(&mut self, op: Op, [rebuild, run, answer]: [Duration; 3]) {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let e = self.by_op.entry(op as u32).or_default();
        e[0] += 1;
        e[1] = e[1].saturating_add(ns(rebuild));
        e[2] = e[2].saturating_add(ns(run));
        e[3] = e[3].saturating_add(ns(answer));
    }

    fn log(&self, session: u64) {
        for (&op, &[n, rebuild, run, answer]) in &self.by_op {
            let us = |ns: u64| ns as f64 / 1e3 / n.max(1) as f64;
            let name = Op::from_u32(op).map_or_else(|| format!("{op:#x}"), |o| format!("{o:?}"));
            debug!(
                target: "qcuda::phases",
                "session {session}: {name}: {n} request(s), mean µs: rebuild {:.2}, run {:.2}, answer {:.2}",
                us(rebuild),
                us(run),
                us(answer)
            );
        }
    }
}

/// What the worker's loop hands its GPU state.
#[derive(Debug)]
pub enum Work<'a> {
    /// A guest request.
    Request(&'a Request),
    /// The operator's pause ([`ToWorker::Pause`]).
    Pause,
    /// The operator's resume.
    Resume,
    /// An IPC export or import (`ToWorker::Ipc`), with the descriptor an import carries; an
    /// export that succeeds leaves the driver's descriptor in `exported`.
    Ipc {
        /// The call.
        call: IpcCall,
        /// The descriptor of an import.
        fd: Option<BorrowedFd<'a>>,
        /// Where an export leaves its descriptor.
        exported: &'a mut Option<OwnedFd>,
    },
    /// Save the whole state into this file from offset 0 ([`ToWorker::SaveState`]); the
    /// answer's rets[0] is the bytes written.
    SaveState(&'a std::fs::File),
    /// Replace the (fresh) state with the saved state `file` holds from offset 0
    /// ([`ToWorker::RestoreState`]), taking the chunks it refers to from `store`, the
    /// session's pre-copied chunks ([`ToWorker::RestorePrecopied`]); the answer's rets[0] is
    /// the bytes read.
    RestoreState {
        /// The saved state.
        file: &'a std::fs::File,
        /// The session's store of pre-copied chunks, if it has one.
        store: Option<&'a std::fs::File>,
    },
    /// One pre-copy round into `file` ([`ToWorker::PrecopyRound`]).
    PrecopyRound {
        /// Where the chunk log goes, from offset 0.
        file: &'a std::fs::File,
        /// Bytes of chunk contents at most.
        budget: u64,
        /// Passes at most.
        max_passes: u32,
    },
    /// Forget what the pre-copy sent ([`ToWorker::PrecopyReset`]).
    PrecopyReset,
    /// Save the state without the allocations' contents into this file
    /// ([`ToWorker::SaveRecord`]); answered as `SaveState` is.
    SaveRecord(&'a std::fs::File),
    /// Export every run into `runs`, then save the state without contents into `file`
    /// ([`ToWorker::ExportRuns`]); answered as `SaveState` is.
    ExportRuns {
        /// Where the state goes.
        file: &'a std::fs::File,
        /// Where the exported runs go.
        runs: &'a mut Vec<ExportedRun>,
    },
    /// Replace the (fresh) state with the state without contents in `file`, every run mapped
    /// from `runs` ([`ToWorker::RestoreHandedOver`]); answered as `RestoreState` is.
    RestoreHandedOver {
        /// The saved state.
        file: &'a std::fs::File,
        /// The source's runs, imported.
        runs: &'a [ExportedRun],
    },
    /// Guest RAM has just been mapped (a memory table): a restored state maps the guest
    /// memory it had mapped for the GPU from it. The answer is not sent anywhere.
    GuestRam(&'a Arc<GuestRam>),
}

/// The answer of a pause or resume: SUCCESS with rets[0] the bytes moved, or why not
/// (cudaErrorNotReady: a stream capture is under way, try again; cudaErrorNotSupported: the
/// state holds what cannot be paused; cudaErrorIllegalState: already paused, or not paused).
pub fn checkpoint_answer(result: Result<u64, CheckpointError>) -> ResponseHeader {
    match result {
        Ok(bytes) => {
            let mut r = ResponseHeader::with_status(status::SUCCESS);
            r.rets[0] = bytes;
            r
        }
        Err(e) => {
            warn!("{e}");
            ResponseHeader::with_status(match e {
                CheckpointError::Busy => status::NOT_READY,
                CheckpointError::Unsupported(_) => status::NOT_SUPPORTED,
                CheckpointError::Cuda(s) => s,
                CheckpointError::WrongPhase(_) => status::ILLEGAL_STATE,
                CheckpointError::Mismatch(_) => status::UNKNOWN,
            })
        }
    }
}

/// The answer of an IPC call to `session` (see [`Work::Ipc`]).
pub fn ipc_answer(
    session: &mut GpuState,
    call: &IpcCall,
    fd: Option<BorrowedFd<'_>>,
    exported: &mut Option<OwnedFd>,
) -> ResponseHeader {
    if call.import {
        return match fd {
            Some(fd) => session.ipc_import(call.device, call.kind, fd, call.meta, call.arg),
            None => ResponseHeader::with_status(status::INVALID_VALUE),
        };
    }
    match session.ipc_export(call.device, call.kind, call.arg) {
        Ok(e) => {
            let mut r = ResponseHeader::with_status(status::SUCCESS);
            r.rets[..3].copy_from_slice(&e.meta);
            *exported = Some(e.fd);
            r
        }
        Err(resp) => resp,
    }
}

/// A migration's source: saves the whole state into `file` (from offset 0), written as it is
/// encoded (`GpuState::save_into`); the answer's rets[0] is the bytes written, rets[2] and
/// rets[3] the microseconds of the capture and of the encoding (rets[1], the nanoseconds of
/// the whole, is the loop's).
fn save_state_into(session: &mut GpuState, file: &std::fs::File) -> ResponseHeader {
    let mut out = io::BufWriter::with_capacity(1 << 20, file);
    let figures = match session.save_into(&mut out) {
        Ok(f) => f,
        Err(e) => return checkpoint_answer(Err(e)),
    };
    if let Err(e) = out.flush() {
        error!("cannot write the saved state: {e}");
        return ResponseHeader::with_status(status::MEMORY_ALLOCATION);
    }
    info!(
        bytes = figures.bytes,
        device_bytes = figures.device_bytes,
        capture_s = figures.capture.as_secs_f64(),
        encode_s = figures.encode.as_secs_f64(),
        "saved state written"
    );
    saved_answer(&figures)
}

/// The answer to a save that wrote `figures.bytes`: rets[2] and rets[3] the microseconds of the
/// capture and of the encoding.
fn saved_answer(figures: &crate::cuda::SaveFigures) -> ResponseHeader {
    let mut r = checkpoint_answer(Ok(figures.bytes));
    r.rets[2] = u64::try_from(figures.capture.as_micros()).unwrap_or(u64::MAX);
    r.rets[3] = u64::try_from(figures.encode.as_micros()).unwrap_or(u64::MAX);
    r
}

/// A migration's destination: makes the saved state in `file` (offset 0 to its end) again in
/// this fresh state. The bytes come from another host: they are decoded with the checked
/// decoder (`saved_state.rs`) and every object is checked as it is made again. The file is
/// mapped, not read: the state's gigabytes of device memory are copied once, from the
/// mapping to the device.
///
/// After a pre-copy, `store` is the session's store of pre-copied chunks (a chunk log the
/// destination's daemon kept, sealed and mapped the same way), from which the chunks the state
/// refers to come.
fn restore_state_from(
    session: &mut GpuState,
    file: &std::fs::File,
    store: Option<&std::fs::File>,
) -> ResponseHeader {
    let map = |f: &std::fs::File, what: &str| {
        super::state_file::SealedMap::new(f).map_err(|e| {
            error!("cannot map the {what} to restore: {e}");
            ResponseHeader::with_status(status::MEMORY_ALLOCATION)
        })
    };
    let mapped = match map(file, "state") {
        Ok(m) => m,
        Err(resp) => return resp,
    };
    let store = match store.map(|f| map(f, "pre-copied chunks")).transpose() {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    let bytes = mapped.bytes();
    checkpoint_answer(
        session
            .restore_saved_with_store(bytes, store.as_ref().map(|s| s.bytes()))
            .map(|()| bytes.len() as u64),
    )
}

/// One round of a migration's pre-copy: a chunk log into `file` from offset 0
/// (`GpuState::precopy_round`); the answer's rets[0] is the bytes written, rets[2] the chunks,
/// rets[3] the bytes still to pre-copy (rets[1], the nanoseconds, is the loop's).
fn precopy_round_into(
    session: &mut GpuState,
    file: &std::fs::File,
    budget: u64,
    max_passes: u32,
) -> ResponseHeader {
    let mut out = io::BufWriter::with_capacity(1 << 20, file);
    let round = match session.precopy_round(budget, max_passes, &mut out) {
        Ok(r) => r,
        Err(e) => return checkpoint_answer(Err(e)),
    };
    let written = match out.into_inner() {
        Ok(f) => f.metadata().map(|m| m.len()),
        Err(e) => Err(e.into_error()),
    };
    let written = match written {
        Ok(n) => n,
        Err(e) => {
            error!("cannot write the pre-copy round: {e}");
            return ResponseHeader::with_status(status::MEMORY_ALLOCATION);
        }
    };
    debug!(
        chunks = round.chunks,
        bytes = round.bytes,
        pending = round.pending,
        pass = round.pass,
        "pre-copy round written"
    );
    let mut r = checkpoint_answer(Ok(written));
    r.rets[2] = round.chunks;
    r.rets[3] = round.pending;
    r
}

/// Saves the state without the allocations' contents into `file` (from offset 0): a
/// migration's quiesce at its last stop (`save_record`), or a handover's state after its runs
/// were exported (`export_runs`, which exports them into `runs` first).
fn save_without_contents_into(
    session: &mut GpuState,
    file: &std::fs::File,
    runs: Option<&mut Vec<ExportedRun>>,
) -> ResponseHeader {
    if let Some(runs) = runs {
        match session.export_runs() {
            Ok(r) => *runs = r,
            Err(e) => return checkpoint_answer(Err(e)),
        }
    }
    let mut out = io::BufWriter::with_capacity(1 << 20, file);
    let figures = match session.save_for_handover_into(&mut out) {
        Ok(f) => f,
        Err(e) => return checkpoint_answer(Err(e)),
    };
    if let Err(e) = out.flush() {
        error!("cannot write the saved state: {e}");
        return ResponseHeader::with_status(status::MEMORY_ALLOCATION);
    }
    saved_answer(&figures)
}

/// A handover's destination: makes the state without contents in `file` again in this fresh
/// state, every run mapped from `runs` (checked against the state's own: `restore_handed_over`).
fn restore_handed_over_from(
    session: &mut GpuState,
    file: &std::fs::File,
    runs: &[ExportedRun],
) -> ResponseHeader {
    let mapped = match super::state_file::SealedMap::new(file) {
        Ok(m) => m,
        Err(e) => {
            error!("cannot map the state to restore: {e}");
            return ResponseHeader::with_status(status::MEMORY_ALLOCATION);
        }
    };
    let bytes = mapped.bytes();
    checkpoint_answer(
        session
            .restore_handed_over(bytes, runs)
            .map(|()| bytes.len() as u64),
    )
}

/// Most runs a worker takes for one handover (`session/handover.rs`'s bound on pieces).
const MAX_IMPORTED_RUNS: usize = super::message::MAX_RUNS;

/// Serves the daemon on `channel` until it closes its end: maps each memory table, runs each
/// request through `execute` (after [`build_request`]) and answers it. Returns the error that
/// ended it otherwise (a broken channel or an undecodable frame).
///
/// Requests come over the socket or, once the daemon sent one, through the hop's mailbox
/// (`mailbox.rs`), and answers go back the same way. After each answer it looks for the next
/// request without blocking for up to `hop_poll` (the mailbox, and the socket now and then)
/// before it blocks on the socket: a guest issuing calls back to back finds this process awake.
pub fn serve(
    channel: &WorkerChannel,
    session: u64,
    hop_poll: Duration,
    mut execute: impl FnMut(Work<'_>) -> ResponseHeader,
    mut host_function_link: impl FnMut(UnixStream),
) -> Result<(), MessageError> {
    let mut mem = Arc::new(GuestRam::new());
    let mut hop = Hop::default();
    // Only when someone will read it: nothing added to a request's path otherwise.
    let mut phases = Phases::wanted().then(Phases::default);
    // How long to spin before the next read: `hop_poll` right after an answer, else nothing.
    let mut spin = Duration::ZERO;
    // The last request run and its answer, and (after an adoption, `ToWorker::Adopt`) the one
    // whose answer the old daemon never delivered: when the guest's ring delivers that request
    // again, its answer is given again instead of running it twice.
    let mut last_run: Option<(Box<RunRequest>, ResponseHeader)> = None;
    let mut replay: Option<(Box<RunRequest>, ResponseHeader)> = None;
    // The runs a handover's destination was given for its next `RestoreHandedOver`.
    let mut imported: Vec<ExportedRun> = Vec::new();
    loop {
        let (msg, files) = match hop.next(channel, std::mem::take(&mut spin))? {
            Next::End => break,
            Next::Posted(body) => (
                ToWorker::decode(&body).and_then(|m| match m {
                    ToWorker::Run(run) => Ok(ToWorker::Run(run)),
                    // Only requests travel through the mailbox.
                    _ => Err(MessageError::Mailbox),
                })?,
                Vec::new(),
            ),
            Next::Frame(ToWorker::Mailbox, files) => {
                // The daemon posts to it from now on: a worker without it would never see
                // another request, so it ends instead (the session's op fails, nothing hangs).
                hop.open_mailbox(files)?;
                continue;
            }
            // Wake-ups: the loop looks in the mailbox next.
            Next::Frame(ToWorker::Posted, _) => continue,
            Next::Frame(msg, files) => {
                match msg {
                    ToWorker::MemoryTable(regions) => {
                        if mem.num_regions() > 0 && maps_the_same(&mem, &regions, &files) {
                            debug!("guest RAM table sent again: the mapping stays");
                            continue;
                        }
                        mem = match map_regions(&regions, files) {
                            Ok(m) => {
                                let total: u64 = m.iter().map(|r| r.len()).sum();
                                debug!(
                                    "guest RAM mapped: {} region(s), {} MiB",
                                    regions.len(),
                                    total >> 20
                                );
                                let m = Arc::new(m);
                                execute(Work::GuestRam(&m));
                                m
                            }
                            Err(e) => {
                                // Without a map every run is refused, which is what a bad table
                                // earns.
                                error!("memory table refused: {e}");
                                Arc::new(GuestRam::new())
                            }
                        };
                        continue;
                    }
                    ToWorker::Ipc(call) => {
                        // Answered on the socket, outside the mailbox's numbering: the daemon
                        // reads this answer alone (`WorkerProcess::ipc`).
                        let file = files.into_iter().next();
                        let mut exported = None;
                        let resp = execute(Work::Ipc {
                            call,
                            fd: file.as_ref().map(AsFd::as_fd),
                            exported: &mut exported,
                        });
                        match exported {
                            Some(fd) => channel.send_exported(resp, fd.as_raw_fd())?,
                            None => channel.send_to_daemon(&FromWorker::Done(resp, 0))?,
                        }
                        continue;
                    }
                    ToWorker::ImportRuns(metas) => {
                        if imported.len() + metas.len() > MAX_IMPORTED_RUNS {
                            // The restore that follows is refused: its runs are not all here.
                            warn!("more runs handed over than a handover carries; dropped");
                            imported.clear();
                            continue;
                        }
                        // recv_to_worker checked one descriptor per run.
                        for (m, f) in metas.into_iter().zip(files) {
                            imported.push(ExportedRun {
                                dev: u32::try_from(m[0]).unwrap_or(u32::MAX),
                                va: m[1],
                                len: m[2],
                                fd: OwnedFd::from(f),
                            });
                        }
                        continue;
                    }
                    ToWorker::ExportRuns => {
                        // Answered on the socket with the descriptors, outside the mailbox's
                        // numbering: the daemon reads this answer alone
                        // (`WorkerProcess::export_runs`).
                        let started = Instant::now();
                        let mut runs = Vec::new();
                        let mut resp = match files.first() {
                            Some(file) => execute(Work::ExportRuns {
                                file,
                                runs: &mut runs,
                            }),
                            None => ResponseHeader::with_status(status::INVALID_VALUE),
                        };
                        resp.rets[1] =
                            u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        if resp.status == status::SUCCESS {
                            let with_fds: Vec<([u64; 3], RawFd)> = runs
                                .iter()
                                .map(|r| ([u64::from(r.dev), r.va, r.len], r.fd.as_raw_fd()))
                                .collect();
                            channel.send_runs(&with_fds)?;
                        }
                        channel.send_to_daemon(&FromWorker::Done(resp, 0))?;
                        continue;
                    }
                    ToWorker::HostFunctionLink => {
                        match files.into_iter().next() {
                            // fd_count() is 1 for this message, and recv_to_worker checked the
                            // count.
                            Some(f) => host_function_link(UnixStream::from(OwnedFd::from(f))),
                            None => warn!("host-function link without its socket"),
                        }
                        continue;
                    }
                    other => (other, files),
                }
            }
        };
        match msg {
            ToWorker::Run(run) => {
                // Only the first request after an adoption can be the one given again.
                if let Some((again, resp)) = replay.take().filter(|(r, _)| *r == run) {
                    info!(
                        "session {session}: a request the restarted daemon delivered again \
                         was answered before the restart: its answer is given again"
                    );
                    hop.answer(channel, &FromWorker::Done(resp, 0))?;
                    last_run = Some((again, resp));
                    spin = hop_poll;
                    continue;
                }
                let started = Instant::now();
                let built = build_request(session, &mem, &run);
                let rebuilt = Instant::now();
                let (op, resp) = match built {
                    Ok(req) => (Some(req.op()), execute(Work::Request(&req))),
                    Err(e) => {
                        warn!("request refused: {e}");
                        (None, ResponseHeader::with_status(status::INVALID_VALUE))
                    }
                };
                let ran = Instant::now();
                let took = u64::try_from((ran - started).as_nanos()).unwrap_or(u64::MAX);
                hop.answer(channel, &FromWorker::Done(resp, took))?;
                if let (Some(p), Some(op)) = (&mut phases, op) {
                    p.add(op, [rebuilt - started, ran - rebuilt, ran.elapsed()]);
                }
                last_run = Some((run, resp));
                spin = hop_poll;
            }
            ToWorker::Adopt => {
                // The old daemon numbered our answers; the mailbox it shared says how many
                // reached the guest. One short: the last was lost with it.
                let lost = hop
                    .mailbox
                    .as_ref()
                    .is_some_and(|m| m.delivered().wrapping_add(1) == hop.answers);
                replay = if lost { last_run.take() } else { None };
                // The new daemon numbers from zero, over the socket (it may send a mailbox of
                // its own); the Adopt frame itself was read.
                hop = Hop {
                    frames_read: 1,
                    ..Hop::default()
                };
                info!(
                    "session {session}: taken over by a restarted daemon{}",
                    if replay.is_some() {
                        "; the last answer is kept to be given again"
                    } else {
                        ""
                    }
                );
                channel.send_to_daemon(&FromWorker::Adopted {
                    session,
                    replay: replay.is_some(),
                })?;
            }
            ToWorker::End => break,
            // Only a spare is given its session, before it serves (`wait_for_binding`).
            ToWorker::Bind { .. } => return Err(MessageError::Rebound),
            #[cfg(feature = "test-hooks")]
            ToWorker::SandboxTestHook(attempt) => {
                let resp = crate::sandbox::test_hook::attempt(&attempt);
                hop.answer(channel, &FromWorker::Done(resp, 0))?;
            }
            ToWorker::Pause
            | ToWorker::Resume
            | ToWorker::SaveState
            | ToWorker::RestoreState
            | ToWorker::SaveRecord
            | ToWorker::RestoreHandedOver
            | ToWorker::PrecopyRound { .. }
            | ToWorker::PrecopyReset
            | ToWorker::RestorePrecopied => {
                let started = Instant::now();
                let file = files.first();
                let mut resp = match (&msg, file) {
                    (ToWorker::Pause, _) => execute(Work::Pause),
                    (ToWorker::Resume, _) => execute(Work::Resume),
                    (ToWorker::PrecopyReset, _) => execute(Work::PrecopyReset),
                    (ToWorker::SaveState, Some(f)) => execute(Work::SaveState(f)),
                    (ToWorker::RestoreState, Some(f)) => execute(Work::RestoreState {
                        file: f,
                        store: None,
                    }),
                    (ToWorker::RestorePrecopied, Some(f)) => execute(Work::RestoreState {
                        file: f,
                        store: files.get(1),
                    }),
                    (&ToWorker::PrecopyRound { budget, max_passes }, Some(f)) => {
                        execute(Work::PrecopyRound {
                            file: f,
                            budget,
                            max_passes,
                        })
                    }
                    (ToWorker::SaveRecord, Some(f)) => execute(Work::SaveRecord(f)),
                    (ToWorker::RestoreHandedOver, Some(f)) => {
                        let runs = std::mem::take(&mut imported);
                        execute(Work::RestoreHandedOver {
                            file: f,
                            runs: &runs,
                        })
                    }
                    // recv_to_worker checked that the file came.
                    _ => ResponseHeader::with_status(status::INVALID_VALUE),
                };
                let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                resp.rets[1] = took;
                hop.answer(channel, &FromWorker::Done(resp, took))?;
            }
            // Handled above.
            ToWorker::MemoryTable(_)
            | ToWorker::HostFunctionLink
            | ToWorker::Ipc(_)
            | ToWorker::ImportRuns(_)
            | ToWorker::ExportRuns
            | ToWorker::Mailbox
            | ToWorker::Posted => {}
        }
    }
    if let Some(p) = &phases {
        p.log(session);
    }
    Ok(())
}

/// What the worker's wait found.
enum Next {
    /// The daemon closed the channel.
    End,
    /// A frame from the socket, with its descriptors.
    Frame(ToWorker, Vec<std::fs::File>),
    /// A request body from the mailbox.
    Posted(Vec<u8>),
}

/// The worker's side of the hop: the socket, and the mailbox once the daemon sent one.
#[derive(Default)]
struct Hop {
    mailbox: Option<Mailbox>,
    /// Socket frames read so far.
    frames_read: u64,
    /// The last mailbox request taken.
    last_request: u64,
    /// A mailbox request waiting for socket frames the daemon sent before it.
    pending: Option<mailbox::Posted>,
    /// Answers sent so far (both ways): the next one's number is this plus one.
    answers: u64,
}

impl Hop {
    fn open_mailbox(&mut self, files: Vec<std::fs::File>) -> Result<(), MessageError> {
        let file = files.first().ok_or(MessageError::Mailbox)?;
        let m = Mailbox::open(file).inspect_err(|e| error!("hop mailbox refused: {e}"))?;
        self.mailbox = Some(m);
        Ok(())
    }

    /// The next message: a mailbox request once the socket frames sent before it are read,
    /// else the next socket frame. Spins for up to `spin` first.
    fn next(&mut self, channel: &WorkerChannel, spin: Duration) -> Result<Next, MessageError> {
        if self.pending.is_none() {
            self.pending = self.look(channel, spin);
        }
        if let Some(p) = self.pending.take_if(|p| p.after_frames <= self.frames_read) {
            return Ok(Next::Posted(p.body));
        }
        // A frame is due: one the daemon sent before the pending request, or the next one.
        let Some((msg, files)) = channel.recv_to_worker()? else {
            return Ok(Next::End);
        };
        self.frames_read += 1;
        if let Some(m) = &self.mailbox {
            m.set_worker_sleeping(false);
        }
        Ok(Next::Frame(msg, files))
    }

    /// Looks for a mailbox request, spinning for up to `spin` (and checking the socket now and
    /// then: a frame there ends the spin). Before it gives up it raises the `sleeping` flag and
    /// looks once more, so that a request posted from then on comes with a `Posted` frame.
    fn look(&mut self, channel: &WorkerChannel, spin: Duration) -> Option<mailbox::Posted> {
        let m = self.mailbox.as_ref()?;
        let last = self.last_request;
        let mut checks = 0u32;
        let found = spin_wait::spin_until(spin, || {
            if let Some(p) = m.take_request(last) {
                return Some(Some(p));
            }
            checks = checks.wrapping_add(1);
            (checks.is_multiple_of(SOCKET_CHECK_EVERY) && socket_ready(channel)).then_some(None)
        });
        let posted = match found {
            Some(p) => p,
            None => {
                m.set_worker_sleeping(true);
                m.take_request(last)
            }
        };
        if let Some(p) = &posted {
            m.set_worker_sleeping(false);
            self.last_request = p.seq;
        }
        posted
    }

    /// Sends an answer: through the mailbox if there is one (with a `Posted` frame if the
    /// daemon sleeps on the socket), else over the socket.
    fn answer(&mut self, channel: &WorkerChannel, msg: &FromWorker) -> Result<(), MessageError> {
        self.answers += 1;
        let body = msg.encode();
        match self
            .mailbox
            .as_ref()
            .and_then(|m| m.post_answer(self.answers, &body))
        {
            Some(false) => Ok(()),
            Some(true) => channel.send_to_daemon(&FromWorker::Posted),
            None => channel.send_frame(&body, &[]),
        }
    }
}

/// While spinning on the mailbox, the socket is checked once every this many looks.
const SOCKET_CHECK_EVERY: u32 = 64;

/// Whether `channel` has something to read (a frame, or the end), without blocking.
fn socket_ready(channel: &WorkerChannel) -> bool {
    let mut fds = [libc::pollfd {
        fd: channel.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one initialised pollfd that outlives the call; a zero timeout returns at once.
    unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) > 0 }
}

/// Takes the channel the daemon left on [`CHANNEL_FD`].
fn take_channel() -> io::Result<WorkerChannel> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes at most one `struct stat` to the buffer it is given.
    if unsafe { libc::fstat(CHANNEL_FD, st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it initialised the buffer.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::other(format!("fd {CHANNEL_FD} is not a socket")));
    }
    // SAFETY: the daemon started this process with its channel on CHANNEL_FD (see
    // `handle.rs`) and nothing else in this process uses that descriptor, so the stream
    // may own it.
    let sock = unsafe { UnixStream::from_raw_fd(CHANNEL_FD) };
    Ok(WorkerChannel::new(sock))
}

/// `--sandbox-check`: builds the sandbox as a worker would, without a driver or a channel.
fn check_sandbox(config: &WorkerConfig) -> i32 {
    match sandbox::confine_worker(config.sandbox, inherited_shm(config))
        .and_then(|_| sandbox::filter_worker(config.sandbox, config.seccomp, false))
    {
        Ok(()) => 0,
        Err(e) => {
            error!(
                "{} sandbox cannot be built on this host: {e}",
                config.sandbox
            );
            1
        }
    }
}

/// The VM's shared directory the daemon passed (`--shm-fd`), if any.
fn inherited_shm(config: &WorkerConfig) -> Option<std::os::fd::OwnedFd> {
    let fd = config.shm_fd?;
    // SAFETY: the daemon passes `--shm-fd` exactly when it placed that descriptor there
    // (SpawnSpec::with_shared_dir), and nothing else in this process owns it.
    Some(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// A spare worker's wait for its session ([`ToWorker::Bind`]), unfiltered as a worker is
/// until its quota is attached (only the daemon speaks on the channel): attaches the quota
/// file that travels with it, answers `Done` on the socket (rets[0]: milliseconds since this
/// process started), and returns the session. `None` when the daemon ended the spare first
/// (closed the channel, or `End`).
fn wait_for_binding(
    channel: &WorkerChannel,
    host: &CudaHost,
    born: Instant,
) -> Result<Option<u64>, String> {
    let (session, slot, mut files) = match channel.recv_to_worker() {
        Ok(None) | Ok(Some((ToWorker::End, _))) => return Ok(None),
        Ok(Some((ToWorker::Bind { session, slot }, files))) => (session, slot, files),
        Ok(Some((other, _))) => {
            return Err(format!("sent {other:?} before its session was given"));
        }
        Err(e) => return Err(format!("its channel: {e}")),
    };
    if let Some(slot) = slot {
        let file = files.pop().ok_or("no quota file with its slot")?;
        let index = usize::try_from(slot).map_err(|_| format!("slot {slot}"))?;
        let quota = crate::limits::QuotaSlot::attach(file, index)
            .map_err(|e| format!("no GPU-memory quota (slot {slot}): {e}"))?;
        host.set_memory_quota(quota);
    }
    let mut resp = ResponseHeader::with_status(status::SUCCESS);
    resp.rets[0] = u64::try_from(born.elapsed().as_millis()).unwrap_or(u64::MAX);
    channel
        .send_to_daemon(&FromWorker::Done(resp, 0))
        .map_err(|e| format!("its channel: {e}"))?;
    debug!(session, ms = resp.rets[0], "spare worker given its session");
    Ok(Some(session))
}

/// The worker's `main`: returns the exit status.
pub fn run(config: &WorkerConfig) -> i32 {
    let born = Instant::now();
    // At ERROR level, so that the span (and the session id) is on every line that is logged.
    // A spare's session is recorded once it is given one.
    let span = if config.spare {
        error_span!("worker", vm = %config.vm, session = tracing::field::Empty)
    } else {
        error_span!("worker", vm = %config.vm, session = config.session)
    };
    let _entered = span.enter();
    // The daemon decides when a worker ends (a Ctrl-C in its terminal reaches us too).
    if let Err(e) = signals::block() {
        warn!("cannot block SIGINT/SIGTERM: {e}");
    }
    if config.sandbox_check {
        return check_sandbox(config);
    }
    let channel = match take_channel() {
        Ok(c) => c,
        Err(e) => {
            error!("no channel to the daemon: {e} (this mode is only for vhost-cuda itself)");
            return 2;
        }
    };
    // Before the driver is loaded: it prints device printf output to fd 1.
    let mut output = DeviceOutput::capture();
    // Before the driver reserves address space of its own (see `cuda::reserve_window`).
    if !crate::cuda::reserve_window() {
        warn!("cannot reserve the host-mapping window: host memory will map at other addresses");
    }
    // libcupti, where recordings may use it, is loaded before the root is built, so that its
    // file is bound with the driver's; without it nothing of CUPTI is in the worker.
    let cupti_loaded = config.gpu_trace.mode.wants_cupti()
        && match cupti::load(config.gpu_trace.cupti.as_deref()) {
            Ok(path) => {
                debug!("libcupti loaded from {}", path.display());
                true
            }
            Err(e) => {
                if config.gpu_trace.mode == GpuTraceMode::Cupti {
                    warn!("{e}: GPU traces of this process are refused (--gpu-trace cupti)");
                } else {
                    debug!("{e}: GPU traces of this process time GPU work with CUDA events");
                }
                false
            }
        };
    // Into the minimal root while this process has one thread (capabilities are per thread);
    // the driver is loaded here first, so that its files are known.
    let bound = match sandbox::confine_worker(config.sandbox, inherited_shm(config)) {
        Ok(n) => n,
        Err(e) => {
            error!(
                "cannot confine this worker ({} sandbox): {e}",
                config.sandbox
            );
            return 1;
        }
    };
    let host = match CudaHost::with_gpu_filter(config.gpu) {
        Ok(h) => h,
        Err(e) => {
            error!("{e}");
            return 1;
        }
    };
    // A spare: the driver's first context now, then the session it will serve.
    let session_id = if config.spare {
        if let Err(e) = host.warm_context(0) {
            // The session makes its context when it needs one, as without a spare.
            warn!("spare worker: no context made ahead ({e:?})");
        }
        match wait_for_binding(&channel, &host, born) {
            Ok(Some(id)) => {
                span.record("session", id);
                id
            }
            // The daemon ended the spare before it was needed.
            Ok(None) => return 0,
            Err(e) => {
                error!("spare worker: {e}");
                return 1;
            }
        }
    } else {
        config.session
    };
    if let Some(slot) = config.gpu_memory_slot {
        // SAFETY: the daemon passes the quota file on QUOTA_FD exactly when it gives a slot,
        // and nothing else in this process uses that descriptor.
        match unsafe { crate::limits::QuotaSlot::from_inherited_fd(slot) } {
            Ok(q) => host.set_memory_quota(q),
            Err(e) => {
                error!("no GPU-memory quota (slot {slot}): {e}");
                return 1;
            }
        }
    }
    host.set_trace_mode(config.gpu_trace.mode);
    match config.address_space.check(host.gpu_count()) {
        Ok(space) => host.set_address_space(space),
        Err(e) => {
            warn!("{e}: no reserved device ranges (device pointers cannot keep their values across a restore)");
            host.set_address_space(AddressSpace::OFF);
        }
    }
    let mut session = GpuState::open(&host, session_id);
    debug!(
        pid = std::process::id(),
        gpus = host.gpu_count(),
        "worker ready"
    );
    let host_functions = session.host_functions_attacher();
    if config.outlive_daemon {
        host_functions.survive_daemon();
    }
    // The driver is initialised: from here on only the measured system calls (every thread).
    if let Err(e) = sandbox::filter_worker(config.sandbox, config.seccomp, cupti_loaded) {
        error!("cannot install the worker's seccomp filter: {e}");
        return 1;
    }
    debug!(
        sandbox = %config.sandbox,
        seccomp = %config.seccomp,
        paths = bound,
        "worker confined"
    );
    // The device-output check's share of each request (Phases' *run* includes it).
    let time_checks = Phases::wanted();
    let (mut checks, mut check_ns) = (0u64, 0u64);
    let served = serve(
        &channel,
        session_id,
        config.hop_poll,
        |work| {
            let req = match work {
                Work::Request(req) => req,
                Work::Pause => return checkpoint_answer(session.pause()),
                Work::Resume => return checkpoint_answer(session.resume()),
                Work::Ipc { call, fd, exported } => {
                    return ipc_answer(&mut session, &call, fd, exported)
                }
                Work::SaveState(file) => return save_state_into(&mut session, file),
                Work::RestoreState { file, store } => {
                    return restore_state_from(&mut session, file, store)
                }
                Work::PrecopyRound {
                    file,
                    budget,
                    max_passes,
                } => return precopy_round_into(&mut session, file, budget, max_passes),
                Work::PrecopyReset => {
                    session.precopy_reset();
                    return ResponseHeader::with_status(status::SUCCESS);
                }
                Work::SaveRecord(file) => {
                    return save_without_contents_into(&mut session, file, None)
                }
                Work::ExportRuns { file, runs } => {
                    return save_without_contents_into(&mut session, file, Some(runs))
                }
                Work::RestoreHandedOver { file, runs } => {
                    return restore_handed_over_from(&mut session, file, runs)
                }
                Work::GuestRam(mem) => {
                    session.attach_guest_ram(mem);
                    return ResponseHeader::with_status(status::SUCCESS);
                }
            };
            let mut resp = match req.op() {
                // The transport self-test, here too: it proves this process's view of guest RAM.
                Op::Echo => transport_ops::echo(req),
                Op::TakeOutput => output.take(req),
                _ => session.execute(req),
            };
            if time_checks {
                let t = Instant::now();
                output.flag(&mut resp);
                checks += 1;
                check_ns =
                    check_ns.saturating_add(u64::try_from(t.elapsed().as_nanos()).unwrap_or(0));
            } else {
                output.flag(&mut resp);
            }
            resp
        },
        |link| host_functions.attach(link),
    );
    if time_checks {
        debug!(
            target: "qcuda::phases",
            "session {}: device-output checks: {checks}, mean µs {:.2}",
            session_id,
            check_ns as f64 / 1e3 / checks.max(1) as f64
        );
    }
    // Dropping the session destroys its contexts; exiting would free them as well.
    drop(session);
    match served {
        Ok(()) => {
            debug!("channel closed; exiting");
            0
        }
        Err(e) => {
            error!("channel to the daemon broken: {e}; exiting");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{fs::File, os::fd::AsRawFd, thread};

    use qcuda_proto::{Direction, MAX_BUFFER_LEN};
    use vm_memory::{Bytes, FileOffset};

    use super::*;
    use crate::{shared_guest_ram::region_table, worker::message::RegionSpec};

    #[test]
    fn phases_are_kept_only_when_their_log_is_on() {
        let with = |filter: &str| {
            let sub = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .finish();
            tracing::subscriber::with_default(sub, Phases::wanted)
        };
        assert!(with("info,qcuda::phases=debug"));
        assert!(!with("info"));
        assert!(!with("info,qcuda::phases=info"));
    }

    #[test]
    fn phases_add_up_per_op() {
        let mut p = Phases::default();
        let us = Duration::from_micros;
        p.add(Op::Batch, [us(1), us(10), us(2)]);
        p.add(Op::Batch, [us(3), us(30), us(4)]);
        p.add(Op::Hello, [us(5), us(6), us(7)]);
        assert_eq!(p.by_op[&(Op::Batch as u32)], [2, 4_000, 40_000, 6_000]);
        assert_eq!(p.by_op[&(Op::Hello as u32)], [1, 5_000, 6_000, 7_000]);
        p.log(1);
    }

    fn ram() -> Arc<GuestRam> {
        Arc::new(
            GuestRam::from_ranges(&[
                (GuestAddress(0), 0x1_0000),
                (GuestAddress(0x10_0000), 0x1_0000),
            ])
            .unwrap(),
        )
    }

    fn copy_run(session: u64, len: u64, spans: Vec<Span>) -> RunRequest {
        let mut h = RequestHeader::new(Op::MemcpyHtoD);
        h.session = session;
        h.push_buffer(Direction::In, len).unwrap();
        RunRequest {
            header: h.encode(),
            inputs: vec![spans],
            outputs: vec![],
        }
    }

    fn span(gpa: u64, len: u64) -> Span {
        Span { gpa, len }
    }

    #[test]
    fn requests_are_rebuilt_and_checked_like_chains() {
        let mem = ram();
        mem.write_slice(b"hello ", GuestAddress(0x10_0000)).unwrap();
        mem.write_slice(b"world", GuestAddress(0xfffb)).unwrap();
        let ok = copy_run(4, 11, vec![span(0x10_0000, 6), span(0xfffb, 5)]);
        let req = build_request(4, &mem, &ok).unwrap();
        assert_eq!(req.op(), Op::MemcpyHtoD);
        assert_eq!(req.inputs()[0].to_vec().unwrap(), b"hello world");
        assert!(req.outputs().is_empty());

        let refused = [
            // Outside guest RAM: the gap, past the end, overflowing.
            (copy_run(4, 16, vec![span(0x1_0000, 16)]), "memory"),
            (copy_run(4, 16, vec![span(0x10_fff8, 16)]), "memory"),
            (copy_run(4, 16, vec![span(u64::MAX - 3, 16)]), "memory"),
            // Runs that do not add up, or overflow when added.
            (copy_run(4, 16, vec![span(0, 15)]), "length"),
            (copy_run(4, 16, vec![span(0, 8), span(0, 9)]), "length"),
            (
                copy_run(4, 16, vec![span(0, u64::MAX), span(0, 17)]),
                "length",
            ),
            (
                copy_run(4, MAX_BUFFER_LEN, vec![span(0, MAX_BUFFER_LEN)]),
                "memory",
            ),
            // Another session's request.
            (copy_run(5, 11, vec![span(0x10_0000, 11)]), "session"),
        ];
        for (run, why) in refused {
            let e = build_request(4, &mem, &run).unwrap_err();
            let kind = match e {
                RunError::Memory(_) => "memory",
                RunError::Length { .. } => "length",
                RunError::Session { .. } => "session",
                _ => "other",
            };
            assert_eq!(kind, why, "{e}");
        }
        // Run lists that do not match the buffer table, and a header that is not one.
        let mut two = copy_run(4, 0, vec![]);
        two.inputs.push(vec![]);
        assert!(matches!(
            build_request(4, &mem, &two),
            Err(RunError::Shape { .. })
        ));
        let mut none = copy_run(4, 0, vec![]);
        none.inputs.clear();
        assert!(matches!(
            build_request(4, &mem, &none),
            Err(RunError::Shape { .. })
        ));
        let mut bad = copy_run(4, 0, vec![]);
        bad.header[0] ^= 1;
        assert!(matches!(
            build_request(4, &mem, &bad),
            Err(RunError::Header(WireError::BadMagic))
        ));
        let mut close = copy_run(4, 0, vec![]);
        let mut h = RequestHeader::new(Op::Echo);
        h.session = 4;
        close.header = h.encode();
        assert!(matches!(
            build_request(4, &mem, &close),
            Err(RunError::Header(WireError::BadShape))
        ));
    }

    fn memfd(len: u64) -> File {
        // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"qcuda-worker-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn serve_maps_tables_answers_in_order_and_ends_with_the_channel() {
        // Spinning for the next request or not, the same answers.
        for hop_poll in [Duration::ZERO, Duration::from_micros(200)] {
            serves_in_order(hop_poll);
        }
    }

    #[test]
    fn an_adopted_worker_gives_a_lost_answer_again_and_runs_nothing_twice() {
        let file = memfd(0x1_0000);
        let mem = GuestRam::from_ranges_with_files([(
            GuestAddress(0x4000_0000),
            0x1_0000,
            Some(FileOffset::new(file, 0)),
        )])
        .unwrap();
        let (daemon, theirs) = WorkerChannel::pair().unwrap();
        let worker = thread::spawn(move || {
            let ch = WorkerChannel::new(theirs);
            let mut runs = 0u32;
            let r = serve(
                &ch,
                9,
                Duration::ZERO,
                |work| {
                    if matches!(work, Work::GuestRam(_)) {
                        return ResponseHeader::with_status(status::SUCCESS);
                    }
                    runs += 1;
                    ResponseHeader::with_status(100 + runs)
                },
                |_| {},
            );
            (r.is_ok(), runs)
        });
        let (regions, fds, _) = region_table(&mem);
        daemon
            .send_to_worker(&ToWorker::MemoryTable(regions), &fds)
            .unwrap();
        // The old daemon's mailbox: it records which answers reached the guest.
        let (old_mailbox, fd) = Mailbox::create().unwrap();
        daemon
            .send_to_worker(&ToWorker::Mailbox, &[fd.as_raw_fd()])
            .unwrap();
        let run = |gpa| ToWorker::Run(Box::new(copy_run(9, 6, vec![span(gpa, 6)])));
        let answer = |m: Option<&Mailbox>, n: u64| -> (u32, u64) {
            let body = match m {
                Some(m) => loop {
                    if let Some(b) = m.take_answer(n) {
                        break b.unwrap();
                    }
                    std::hint::spin_loop();
                },
                None => loop {
                    match daemon.recv_from_worker().unwrap().unwrap() {
                        FromWorker::Posted => {}
                        other => break other.encode(),
                    }
                },
            };
            match FromWorker::decode(&body).unwrap() {
                FromWorker::Done(r, ns) => (r.status, ns),
                other => panic!("{other:?}"),
            }
        };
        let adopt = || {
            daemon.send_to_worker(&ToWorker::Adopt, &[]).unwrap();
            loop {
                match daemon.recv_from_worker().unwrap().unwrap() {
                    FromWorker::Adopted { session, replay } => {
                        assert_eq!(session, 9);
                        break replay;
                    }
                    // What the old daemon never read.
                    FromWorker::Done(..)
                    | FromWorker::Posted
                    | FromWorker::Exported(_)
                    | FromWorker::Runs(_) => {}
                }
            }
        };
        // Request A answered and delivered; request B answered, then the daemon dies before
        // completing its chain (the delivered count stays at 1).
        daemon.send_to_worker(&run(0x4000_0100), &[]).unwrap();
        assert_eq!(answer(Some(&old_mailbox), 1).0, 101);
        old_mailbox.set_delivered(1);
        daemon.send_to_worker(&run(0x4000_0200), &[]).unwrap();
        assert_eq!(answer(Some(&old_mailbox), 2).0, 102);
        assert!(adopt(), "the lost answer is not kept");
        // The ring delivers B again: its answer comes back without a second run.
        daemon.send_to_worker(&run(0x4000_0200), &[]).unwrap();
        assert_eq!(answer(None, 1), (102, 0));
        // The same request once more is a new one: it runs.
        daemon.send_to_worker(&run(0x4000_0200), &[]).unwrap();
        assert_eq!(answer(None, 2).0, 103);
        // Adopted again with nothing lost (no mailbox: nothing known, nothing kept); a request
        // equal to the last one runs.
        assert!(!adopt());
        daemon.send_to_worker(&run(0x4000_0200), &[]).unwrap();
        assert_eq!(answer(None, 1).0, 104);
        // A request other than the lost one, after an adoption that kept one, runs too.
        let (m, fd) = Mailbox::create().unwrap();
        daemon
            .send_to_worker(&ToWorker::Mailbox, &[fd.as_raw_fd()])
            .unwrap();
        daemon.send_to_worker(&run(0x4000_0300), &[]).unwrap();
        assert_eq!(answer(Some(&m), 2).0, 105);
        m.set_delivered(1);
        assert!(adopt());
        daemon.send_to_worker(&run(0x4000_0100), &[]).unwrap();
        assert_eq!(answer(None, 1).0, 106);
        // End stops the worker although the daemon's end stays open.
        daemon.send_to_worker(&ToWorker::End, &[]).unwrap();
        let (clean, runs) = worker.join().unwrap();
        assert!(clean);
        assert_eq!(runs, 6);
        drop(daemon);
    }

    fn serves_in_order(hop_poll: Duration) {
        let file = memfd(0x1_0000);
        let mem = GuestRam::from_ranges_with_files([(
            GuestAddress(0x4000_0000),
            0x1_0000,
            Some(FileOffset::new(file, 0)),
        )])
        .unwrap();
        mem.write_slice(b"shared", GuestAddress(0x4000_0100))
            .unwrap();
        let (daemon, theirs) = WorkerChannel::pair().unwrap();
        let worker = thread::spawn(move || {
            let ch = WorkerChannel::new(theirs);
            let mut seen = Vec::new();
            let mut tables = 0;
            let r = serve(
                &ch,
                9,
                hop_poll,
                |work| {
                    let req = match work {
                        Work::Request(req) => req,
                        Work::Pause => return ResponseHeader::with_status(77),
                        Work::Resume => return ResponseHeader::with_status(78),
                        // An export hands over a descriptor; an import must come with one.
                        Work::Ipc { call, fd, exported } => {
                            if call.import {
                                return ResponseHeader::with_status(if fd.is_some() {
                                    79
                                } else {
                                    1
                                });
                            }
                            *exported = Some(OwnedFd::from(memfd(16)));
                            return ResponseHeader::with_status(80);
                        }
                        Work::SaveState(f) => {
                            use std::os::unix::fs::FileExt;
                            f.write_all_at(b"saved", 0).unwrap();
                            let mut r = ResponseHeader::with_status(status::SUCCESS);
                            r.rets[0] = 5;
                            return r;
                        }
                        Work::RestoreState { .. } => return ResponseHeader::with_status(79),
                        Work::PrecopyRound { .. } | Work::PrecopyReset => {
                            return ResponseHeader::with_status(82)
                        }
                        Work::SaveRecord(_) => return ResponseHeader::with_status(81),
                        // A test double of a handover's export: memfds stand for the device
                        // memory of 300 runs (more than one frame carries).
                        Work::ExportRuns { runs, .. } => {
                            for i in 0..300u64 {
                                let f = memfd(8);
                                use std::os::unix::fs::FileExt;
                                f.write_all_at(&i.to_le_bytes(), 0).unwrap();
                                runs.push(ExportedRun {
                                    dev: 0,
                                    va: 0x6800_0000_0000 + (i << 21),
                                    len: 2 << 20,
                                    fd: OwnedFd::from(f),
                                });
                            }
                            return ResponseHeader::with_status(status::SUCCESS);
                        }
                        // The runs given before the restore reach it, in order, with their
                        // memory.
                        Work::RestoreHandedOver { runs, .. } => {
                            use std::os::unix::fs::FileExt;
                            let ok = runs.len() == 100
                                && runs.iter().enumerate().all(|(i, r)| {
                                    let mut b = [0u8; 8];
                                    File::from(r.fd.try_clone().unwrap())
                                        .read_exact_at(&mut b, 0)
                                        .unwrap();
                                    r.va == 0x6800_0000_0000 + ((i as u64) << 21)
                                        && u64::from_le_bytes(b) == i as u64
                                });
                            return ResponseHeader::with_status(if ok { 82 } else { 1 });
                        }
                        Work::GuestRam(m) => {
                            // Each table mapped reaches the state (a restored state's host
                            // mappings wait for it).
                            assert!(m.num_regions() > 0);
                            tables += 1;
                            return ResponseHeader::with_status(status::SUCCESS);
                        }
                    };
                    seen.push(req.inputs()[0].to_vec().unwrap());
                    ResponseHeader::with_status(u32::try_from(seen.len()).unwrap())
                },
                |_| unreachable!(),
            );
            (r.is_ok(), seen, tables)
        });
        let run = |gpa| ToWorker::Run(Box::new(copy_run(9, 6, vec![span(gpa, 6)])));
        let answer = || match daemon.recv_from_worker().unwrap().unwrap() {
            FromWorker::Done(r, _) => r.status,
            FromWorker::Posted
            | FromWorker::Adopted { .. }
            | FromWorker::Exported(_)
            | FromWorker::Runs(_) => {
                unreachable!("no mailbox or IPC in this test")
            }
        };
        // Before any table: refused.
        daemon.send_to_worker(&run(0x4000_0100), &[]).unwrap();
        let (regions, fds, _) = region_table(&mem);
        daemon
            .send_to_worker(&ToWorker::MemoryTable(regions), &fds)
            .unwrap();
        assert_eq!(answer(), status::INVALID_VALUE);
        // One at a time, the next request coming while the worker spins or after it gave up.
        for n in 1..=4 {
            if n % 2 == 0 {
                thread::sleep(Duration::from_millis(2));
            }
            daemon.send_to_worker(&run(0x4000_0100), &[]).unwrap();
            assert_eq!(answer(), n);
        }
        // The operator's pause and resume reach the state between requests, answered in turn.
        daemon.send_to_worker(&ToWorker::Pause, &[]).unwrap();
        assert_eq!(answer(), 77);
        daemon.send_to_worker(&ToWorker::Resume, &[]).unwrap();
        assert_eq!(answer(), 78);
        // IPC calls between requests: an export's answer brings its descriptor, an import's
        // descriptor reaches the state.
        let call = IpcCall {
            import: false,
            device: 0,
            kind: qcuda_proto::IPC_KIND_MEMORY,
            arg: 0,
            meta: [0; 3],
        };
        daemon.send_to_worker(&ToWorker::Ipc(call), &[]).unwrap();
        match daemon.recv_ipc_answer().unwrap().unwrap() {
            (FromWorker::Exported(r), Some(_)) => assert_eq!(r.status, 80),
            other => panic!("{other:?}"),
        }
        let import = IpcCall {
            import: true,
            ..call
        };
        let f = memfd(16);
        daemon
            .send_to_worker(&ToWorker::Ipc(import), &[f.as_raw_fd()])
            .unwrap();
        match daemon.recv_ipc_answer().unwrap().unwrap() {
            (FromWorker::Done(r, _), None) => assert_eq!(r.status, 79),
            other => panic!("{other:?}"),
        }
        // An import without its descriptor is not a message.
        assert!(daemon.send_to_worker(&ToWorker::Ipc(import), &[]).is_err());
        // A handover: the export's runs come back on the socket with their descriptors, in
        // batches; the destination's runs, given in batches, reach its restore.
        let state = memfd(16);
        daemon
            .send_to_worker(&ToWorker::SaveRecord, &[state.as_raw_fd()])
            .unwrap();
        assert_eq!(answer(), 81);
        daemon
            .send_to_worker(&ToWorker::ExportRuns, &[state.as_raw_fd()])
            .unwrap();
        let (resp, runs) = daemon.recv_runs_answer(1000).unwrap().unwrap();
        assert_eq!((resp.status, runs.len()), (status::SUCCESS, 300));
        for (i, (meta, f)) in runs.iter().enumerate() {
            use std::os::unix::fs::FileExt;
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, 0).unwrap();
            assert_eq!(u64::from_le_bytes(b), i as u64);
            assert_eq!(meta[1], 0x6800_0000_0000 + ((i as u64) << 21));
        }
        for batch in runs[..100].chunks(crate::worker::message::RUN_BATCH) {
            let metas: Vec<[u64; 3]> = batch.iter().map(|(m, _)| *m).collect();
            let fds: Vec<RawFd> = batch.iter().map(|(_, f)| f.as_raw_fd()).collect();
            daemon
                .send_to_worker(&ToWorker::ImportRuns(metas), &fds)
                .unwrap();
        }
        daemon
            .send_to_worker(&ToWorker::RestoreHandedOver, &[state.as_raw_fd()])
            .unwrap();
        assert_eq!(answer(), 82);
        // The runs were taken by that restore: the next has none.
        daemon
            .send_to_worker(&ToWorker::RestoreHandedOver, &[state.as_raw_fd()])
            .unwrap();
        assert_eq!(answer(), 1);
        daemon.send_to_worker(&run(0x4000_0100), &[]).unwrap();
        // A table the worker cannot map leaves it without guest RAM.
        let f = memfd(0x1000);
        daemon
            .send_to_worker(
                &ToWorker::MemoryTable(vec![RegionSpec {
                    gpa: 0,
                    size: 0x2000,
                    file_offset: 0,
                }]),
                &[f.as_raw_fd()],
            )
            .unwrap();
        daemon.send_to_worker(&run(0x4000_0100), &[]).unwrap();
        let answers: Vec<u32> = (0..2).map(|_| answer()).collect();
        assert_eq!(answers, [5, status::INVALID_VALUE]);
        drop(daemon);
        let (clean, seen, tables) = worker.join().unwrap();
        assert!(clean);
        assert_eq!(seen, vec![b"shared".to_vec(); 5]);
        // The table mapped reached the state; the refused one did not.
        assert_eq!(tables, 1);

        // A mailbox the worker cannot use ends it: the daemon would post requests it never saw.
        let (daemon, theirs) = WorkerChannel::pair().unwrap();
        let small = memfd(100);
        daemon
            .send_to_worker(&ToWorker::Mailbox, &[small.as_raw_fd()])
            .unwrap();
        let ch = WorkerChannel::new(theirs);
        assert!(serve(&ch, 9, hop_poll, |_| unreachable!(), |_| unreachable!()).is_err());

        // An undecodable frame ends the worker with an error.
        let (daemon, theirs) = WorkerChannel::pair().unwrap();
        daemon.send_frame(&[0x7f, 1, 2], &[]).unwrap();
        let ch = WorkerChannel::new(theirs);
        assert!(matches!(
            serve(&ch, 9, hop_poll, |_| unreachable!(), |_| unreachable!()),
            Err(MessageError::UnknownTag(0x7f))
        ));
    }
}

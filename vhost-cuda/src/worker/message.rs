//! The messages between the daemon and a session's worker process, and how they travel.
//!
//! Each session's CUDA work runs in a worker process of its own (`child.rs`), which the
//! daemon's session thread drives (`handle.rs`) over one Unix stream socket pair:
//!
//! - daemon → worker: [`ToWorker::MemoryTable`] (guest RAM, with one file descriptor per region
//!   as `SCM_RIGHTS`; sent on spawn and on every SET_MEM_TABLE) and [`ToWorker::Run`] (one
//!   request: its header bytes and the guest-physical runs of each buffer);
//! - worker → daemon: [`FromWorker::Done`] (the response header and how long the worker took),
//!   one per `Run`, in order.
//!
//! Closing the daemon's end ends the worker. A frame is the body length (u32, little-endian)
//! followed by the body: a tag byte, then the message's fields, little-endian. The daemon
//! always execs its own binary as the worker, so both ends are the same build and the format
//! carries no version.
//!
//! Neither end trusts the other: decoding checks every length and count, and the worker still
//! validates every run against its own map of guest RAM before it touches a byte.

use std::{
    fs::File,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, RawFd},
        unix::net::UnixStream,
    },
    time::Duration,
};

use qcuda_proto::{ResponseHeader, MAX_BUFFERS, REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE};
use thiserror::Error;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub use crate::shared_guest_ram::RegionSpec;

/// Longest frame body. A request has at most `MAX_SPANS` runs of 16 bytes each.
pub const MAX_FRAME: usize = 2 << 20;
/// Most regions a memory table may have (vhost-user without `CONFIGURE_MEM_SLOTS` sends at most
/// 8; `SCM_RIGHTS` carries at most 253 descriptors per message).
pub const MAX_REGIONS: usize = 64;
/// Most guest-physical runs one request may have over all its buffers: a chain has at most
/// `MAX_CHAIN_SEGMENTS` (4096) descriptors, each split at most at every region boundary.
pub const MAX_SPANS: usize = 64 * 1024;
/// Most runs of device memory (each with its descriptor) one frame carries, both ways: below
/// the kernel's 253 descriptors a message, and what a worker's read takes ([`MAX_REGIONS`]).
pub const RUN_BATCH: usize = MAX_REGIONS;
/// Most runs of device memory one worker exports or imports (a migration's handover: every
/// mapped run of the session's ranges).
pub const MAX_RUNS: usize = 1 << 20;

/// One run of device memory handed over (`session/handover.rs`): the guest device, its address
/// and its length; its descriptor travels beside the frame.
pub type RunMeta = [u64; 3];

const TAG_MEMORY_TABLE: u8 = 1;
const TAG_RUN: u8 = 2;
const TAG_DONE: u8 = 3;
const TAG_HOST_FUNCTION_LINK: u8 = 4;
const TAG_MAILBOX: u8 = 5;
const TAG_POSTED: u8 = 6;
const TAG_PAUSE: u8 = 7;
const TAG_RESUME: u8 = 8;
const TAG_ADOPT: u8 = 9;
const TAG_ADOPTED: u8 = 10;
const TAG_END: u8 = 11;
const TAG_IPC: u8 = 12;
const TAG_EXPORTED: u8 = 13;
const TAG_SAVE_STATE: u8 = 14;
const TAG_RESTORE_STATE: u8 = 15;
const TAG_SAVE_RECORD: u8 = 16;
const TAG_EXPORT_RUNS: u8 = 17;
const TAG_IMPORT_RUNS: u8 = 18;
const TAG_RESTORE_HANDED_OVER: u8 = 19;
const TAG_RUNS: u8 = 20;
const TAG_BIND: u8 = 21;
const TAG_PRECOPY_ROUND: u8 = 22;
const TAG_PRECOPY_RESET: u8 = 23;
const TAG_RESTORE_PRECOPIED: u8 = 24;
/// Only in builds with the `test-hooks` feature: elsewhere the tag is unknown, and a worker
/// that receives it exits as for any undecodable frame.
#[cfg(feature = "test-hooks")]
const TAG_SANDBOX_TEST_HOOK: u8 = 0xf0;

/// One guest-physical run of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Guest-physical start.
    pub gpa: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A request for the worker to execute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// The request header as the guest sent it (re-decoded and re-checked by the worker).
    pub header: [u8; REQUEST_HEADER_SIZE],
    /// The runs of each `In` buffer, in table order.
    pub inputs: Vec<Vec<Span>>,
    /// The runs of each `Out` buffer, in table order.
    pub outputs: Vec<Vec<Span>>,
}

/// A share of device memory with another process of the VM, which the daemon brokers
/// (`crate::session::ipc_broker`): an export (the worker answers [`FromWorker::Exported`] with
/// the driver's file descriptor) or an import of a descriptor that travels with the message
/// (answered [`FromWorker::Done`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcCall {
    /// Import (a descriptor travels with the message) or export.
    pub import: bool,
    /// The guest device the guest process called on.
    pub device: u32,
    /// `qcuda_proto::IPC_KIND_*`.
    pub kind: u64,
    /// Export: the device pointer or allocation handle. Import: the guest's flags.
    pub arg: u64,
    /// Import: what the exporting worker said about the allocation (`IpcExported::meta`).
    pub meta: [u64; 3],
}

/// What the daemon sends a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToWorker {
    /// Guest RAM from now on; one file descriptor per region travels with it, in order.
    MemoryTable(Vec<RegionSpec>),
    /// Execute a request and answer [`FromWorker::Done`].
    Run(Box<RunRequest>),
    /// The host-function link (one socket travels with it): see `cuda/host_functions.rs`.
    HostFunctionLink,
    /// The hop's shared mailbox (one memfd travels with it): see `worker/mailbox.rs`.
    Mailbox,
    /// "Look in the mailbox": a request was posted there while the worker slept on this socket.
    Posted,
    /// The operator's pause: quiesce the GPU state and move its memory to host memory
    /// (`GpuState::pause`); answered [`FromWorker::Done`] with the status, rets[0] the bytes
    /// moved and rets[1] the nanoseconds it took.
    Pause,
    /// The operator's resume (`GpuState::resume`); answered as [`ToWorker::Pause`] is.
    Resume,
    /// A restarted daemon takes the worker over (`worker/store.rs`): the worker drops the old
    /// daemon's mailbox, remembers whether its last answer was lost with the old daemon (the
    /// mailbox's delivered count), and answers [`FromWorker::Adopted`] over the socket. Answers
    /// it sent the old daemon may still be in the socket before that one.
    Adopt,
    /// The session is over: the worker exits (as when the channel closes, which it cannot see
    /// while a copy of the daemon's end is kept for a restart).
    End,
    /// An IPC export or import (an import carries one descriptor).
    Ipc(IpcCall),
    /// Save the whole GPU state (`GpuState::save`, a migration's source): one file travels
    /// with it (a memfd), which the worker fills with the saved state from offset 0. Answered
    /// [`FromWorker::Done`] with the status (as for [`ToWorker::Pause`]), rets[0] the bytes
    /// written, rets[1] the nanoseconds it took, rets[2] and rets[3] the microseconds of the
    /// capture and of the encoding with device memory streamed. The state goes on running.
    SaveState,
    /// Replace this worker's GPU state, which must be fresh (no request ran yet), with the
    /// saved state in the file that travels with it (`GpuState::restore`, a migration's
    /// destination), read from offset 0 to its end. Answered as [`ToWorker::SaveState`] is,
    /// rets[0] the bytes read.
    RestoreState,
    /// [`ToWorker::SaveState`] without the allocations' contents
    /// (`GpuState::save_for_handover_into`): at a migration's last stop, the quiesce (it
    /// synchronises the GPU work) and the check that the state can be saved at all, before the
    /// path is chosen. Answered as `SaveState` is.
    SaveRecord,
    /// A same-host handover's source: export the memory under every mapped run
    /// (`GpuState::export_runs`), then save the state without the contents into the file that
    /// travels with it. Answered on the socket, never through the mailbox: [`FromWorker::Runs`]
    /// frames with the runs' descriptors (at most [`RUN_BATCH`] a frame), then
    /// [`FromWorker::Done`] (as for `SaveState`; on an error the runs sent are void).
    ExportRuns,
    /// A same-host handover's destination: runs imported from the source, their descriptors
    /// with the message (at most [`RUN_BATCH`]), kept for the next
    /// [`ToWorker::RestoreHandedOver`]. Not answered.
    ImportRuns(Vec<RunMeta>),
    /// Restore the state without contents in the file that travels with it into this fresh
    /// state, every run mapped from the runs given before (`GpuState::restore_handed_over`),
    /// which it then forgets. Answered as `RestoreState` is.
    RestoreHandedOver,
    /// One round of a migration's pre-copy (`GpuState::precopy_round`, the VM still running):
    /// the worker writes into the file that travels with it, from offset 0, a chunk log of at
    /// most `budget` bytes of the device memory changed since it last sent it, in at most
    /// `max_passes` passes over its memory. Answered [`FromWorker::Done`] with the status,
    /// rets[0] the bytes written, rets[1] the nanoseconds it took, rets[2] the chunks, rets[3]
    /// the bytes still to pre-copy after this round (0: none, or the passes are over).
    PrecopyRound {
        /// Bytes of chunk contents at most.
        budget: u64,
        /// Passes over the memory at most.
        max_passes: u32,
    },
    /// Forget what the pre-copy sent (a migration failed or was cancelled, or a new one
    /// begins). Answered `Done`.
    PrecopyReset,
    /// [`ToWorker::RestoreState`] after a pre-copy: two files travel with it, the saved state
    /// and the session's store of pre-copied chunks (a chunk log), from which the restore takes
    /// every chunk the state refers to. Answered as `RestoreState` is.
    RestorePrecopied,
    /// A spare worker (`--spare`, started before any guest process needed it) is given the
    /// session it serves from now on, and its slot of the VM's accounting file (the file
    /// travels with the message when `slot` is set). The first message a spare takes, and
    /// the only one; answered [`FromWorker::Done`] on the socket (never counted as an answer
    /// of the hop) once its warm-up is over: rets[0] the milliseconds since it started.
    Bind {
        /// The session.
        session: u64,
        /// Its slot of the accounting file, if the VM has one.
        slot: Option<u32>,
    },
    /// Test double, compiled only with the `test-hooks` feature (the sandbox tests): the
    /// worker tries what `crate::sandbox::test_hook` encodes here and answers `Done`.
    #[cfg(feature = "test-hooks")]
    SandboxTestHook(Vec<u8>),
}

/// What a worker sends the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromWorker {
    /// The response to the oldest `Run` not yet answered, and the nanoseconds the worker spent
    /// on it (rebuilding and executing it), for the latency statistics.
    Done(ResponseHeader, u64),
    /// "Look in the mailbox": an answer was posted there while the daemon slept on this socket.
    Posted,
    /// The answer to [`ToWorker::Adopt`]: the worker's session id, and whether it holds an
    /// answer that the old daemon never delivered (it gives it again, without running the
    /// request twice, when the guest's ring delivers that request again).
    Adopted {
        /// The session the worker serves.
        session: u64,
        /// Whether its last answer was lost with the old daemon.
        replay: bool,
    },
    /// The answer of an IPC export that succeeded: the response (rets[0..3] the `meta` for
    /// importers) and, with it, the driver's file descriptor. Always sent on the socket.
    Exported(ResponseHeader),
    /// Runs of device memory exported for a handover ([`ToWorker::ExportRuns`]), one
    /// descriptor each beside the frame.
    Runs(Vec<RunMeta>),
}

/// Errors of encoding, decoding and moving messages.
#[derive(Debug, Error)]
pub enum MessageError {
    /// A frame announces (or a message needs) more than `MAX_FRAME` bytes.
    #[error("frame of {0} bytes, at most {MAX_FRAME}")]
    FrameTooLong(u64),
    /// The body ends before the message does.
    #[error("message ends early")]
    Truncated,
    /// Bytes after the end of the message.
    #[error("{0} stray bytes after the message")]
    TrailingBytes(usize),
    /// An unknown tag byte.
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    /// A memory table with too many regions.
    #[error("memory table of {0} regions, at most {MAX_REGIONS}")]
    TooManyRegions(u64),
    /// A request with too many buffers.
    #[error("{0} buffers, at most {MAX_BUFFERS}")]
    TooManyBuffers(usize),
    /// A request with too many runs.
    #[error("more than {MAX_SPANS} guest runs")]
    TooManySpans,
    /// A batch of device-memory runs longer than [`RUN_BATCH`].
    #[error("a batch of {0} device-memory runs, at most {RUN_BATCH}")]
    TooManyRuns(u64),
    /// File descriptors that do not match the message.
    #[error("{got} file descriptors with a message that carries {expected}")]
    FdCount {
        /// What the message needs.
        expected: usize,
        /// What arrived.
        got: usize,
    },
    /// The peer closed the socket in the middle of a frame.
    #[error("connection closed mid-frame")]
    ClosedMidFrame,
    /// The hop's mailbox held what it never carries: a message other than a request (to the
    /// worker) or an answer (to the daemon), or an answer longer than its slot.
    #[error("the hop mailbox held something other than a request or an answer")]
    Mailbox,
    /// A message out of place: a session given to a worker that serves one already.
    #[error("a session given to a worker that has one")]
    Rebound,
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads little-endian fields from a body, front to back.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], MessageError> {
        if self.b.len() < n {
            return Err(MessageError::Truncated);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, MessageError> {
        Ok(self.bytes(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, MessageError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, MessageError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn end(self) -> Result<(), MessageError> {
        match self.b.len() {
            0 => Ok(()),
            n => Err(MessageError::TrailingBytes(n)),
        }
    }
}

fn put_spans(out: &mut Vec<u8>, buffers: &[Vec<Span>]) -> Result<(), MessageError> {
    for spans in buffers {
        let n = u32::try_from(spans.len()).map_err(|_| MessageError::TooManySpans)?;
        out.extend_from_slice(&n.to_le_bytes());
        for s in spans {
            out.extend_from_slice(&s.gpa.to_le_bytes());
            out.extend_from_slice(&s.len.to_le_bytes());
        }
    }
    Ok(())
}

fn get_spans(
    r: &mut Reader<'_>,
    count: usize,
    budget: &mut usize,
) -> Result<Vec<Vec<Span>>, MessageError> {
    let mut buffers = Vec::with_capacity(count);
    for _ in 0..count {
        let n = r.u32()? as usize;
        *budget = budget.checked_sub(n).ok_or(MessageError::TooManySpans)?;
        // Each span needs 16 bytes of body, so a lying count fails before it allocates much.
        if n.saturating_mul(16) > r.b.len() {
            return Err(MessageError::Truncated);
        }
        let mut spans = Vec::with_capacity(n);
        for _ in 0..n {
            spans.push(Span {
                gpa: r.u64()?,
                len: r.u64()?,
            });
        }
        buffers.push(spans);
    }
    Ok(buffers)
}

impl ToWorker {
    /// File descriptors that travel with this message.
    pub fn fd_count(&self) -> usize {
        match self {
            Self::MemoryTable(regions) => regions.len(),
            Self::Run(_) => 0,
            Self::HostFunctionLink
            | Self::Mailbox
            | Self::SaveState
            | Self::RestoreState
            | Self::SaveRecord
            | Self::ExportRuns
            | Self::RestoreHandedOver
            | Self::PrecopyRound { .. } => 1,
            Self::RestorePrecopied => 2,
            Self::PrecopyReset => 0,
            Self::ImportRuns(runs) => runs.len(),
            Self::Bind { slot, .. } => usize::from(slot.is_some()),
            Self::Posted | Self::Pause | Self::Resume | Self::Adopt | Self::End => 0,
            Self::Ipc(call) => usize::from(call.import),
            #[cfg(feature = "test-hooks")]
            Self::SandboxTestHook(_) => 0,
        }
    }

    /// The frame body. Fails if the message breaks a limit (the decoder would refuse it).
    pub fn encode(&self) -> Result<Vec<u8>, MessageError> {
        let mut out = Vec::new();
        match self {
            Self::MemoryTable(regions) => {
                if regions.len() > MAX_REGIONS {
                    return Err(MessageError::TooManyRegions(regions.len() as u64));
                }
                let n = u32::try_from(regions.len())
                    .map_err(|_| MessageError::TooManyRegions(regions.len() as u64))?;
                out.push(TAG_MEMORY_TABLE);
                out.extend_from_slice(&n.to_le_bytes());
                for r in regions {
                    out.extend_from_slice(&r.gpa.to_le_bytes());
                    out.extend_from_slice(&r.size.to_le_bytes());
                    out.extend_from_slice(&r.file_offset.to_le_bytes());
                }
            }
            Self::Run(run) => {
                let buffers = run.inputs.len() + run.outputs.len();
                if buffers > MAX_BUFFERS {
                    return Err(MessageError::TooManyBuffers(buffers));
                }
                let spans: usize = run.inputs.iter().chain(&run.outputs).map(Vec::len).sum();
                if spans > MAX_SPANS {
                    return Err(MessageError::TooManySpans);
                }
                let count = |list: &[Vec<Span>]| {
                    u8::try_from(list.len()).map_err(|_| MessageError::TooManyBuffers(buffers))
                };
                let (ins, outs) = (count(&run.inputs)?, count(&run.outputs)?);
                out.push(TAG_RUN);
                out.extend_from_slice(&run.header);
                out.push(ins);
                out.push(outs);
                put_spans(&mut out, &run.inputs)?;
                put_spans(&mut out, &run.outputs)?;
            }
            Self::HostFunctionLink => out.push(TAG_HOST_FUNCTION_LINK),
            Self::Mailbox => out.push(TAG_MAILBOX),
            Self::Posted => out.push(TAG_POSTED),
            Self::Pause => out.push(TAG_PAUSE),
            Self::Resume => out.push(TAG_RESUME),
            Self::Adopt => out.push(TAG_ADOPT),
            Self::End => out.push(TAG_END),
            Self::Ipc(c) => {
                out.push(TAG_IPC);
                out.push(u8::from(c.import));
                out.extend_from_slice(&c.device.to_le_bytes());
                for v in [c.kind, c.arg, c.meta[0], c.meta[1], c.meta[2]] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            Self::SaveState => out.push(TAG_SAVE_STATE),
            Self::RestoreState => out.push(TAG_RESTORE_STATE),
            Self::SaveRecord => out.push(TAG_SAVE_RECORD),
            Self::ExportRuns => out.push(TAG_EXPORT_RUNS),
            Self::ImportRuns(runs) => {
                out.push(TAG_IMPORT_RUNS);
                put_runs(&mut out, runs)?;
            }
            Self::RestoreHandedOver => out.push(TAG_RESTORE_HANDED_OVER),
            Self::PrecopyRound { budget, max_passes } => {
                out.push(TAG_PRECOPY_ROUND);
                out.extend_from_slice(&budget.to_le_bytes());
                out.extend_from_slice(&max_passes.to_le_bytes());
            }
            Self::PrecopyReset => out.push(TAG_PRECOPY_RESET),
            Self::RestorePrecopied => out.push(TAG_RESTORE_PRECOPIED),
            Self::Bind { session, slot } => {
                out.push(TAG_BIND);
                out.extend_from_slice(&session.to_le_bytes());
                out.push(u8::from(slot.is_some()));
                out.extend_from_slice(&slot.unwrap_or(0).to_le_bytes());
            }
            #[cfg(feature = "test-hooks")]
            Self::SandboxTestHook(bytes) => {
                let n = u32::try_from(bytes.len())
                    .map_err(|_| MessageError::FrameTooLong(bytes.len() as u64))?;
                out.push(TAG_SANDBOX_TEST_HOOK);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(bytes);
            }
        }
        if out.len() > MAX_FRAME {
            return Err(MessageError::FrameTooLong(out.len() as u64));
        }
        Ok(out)
    }

    /// Decodes a frame body.
    pub fn decode(body: &[u8]) -> Result<Self, MessageError> {
        let mut r = Reader { b: body };
        let msg = match r.u8()? {
            TAG_MEMORY_TABLE => {
                let n = u64::from(r.u32()?);
                let count = usize::try_from(n)
                    .ok()
                    .filter(|c| *c <= MAX_REGIONS)
                    .ok_or(MessageError::TooManyRegions(n))?;
                let mut regions = Vec::with_capacity(count);
                for _ in 0..count {
                    regions.push(RegionSpec {
                        gpa: r.u64()?,
                        size: r.u64()?,
                        file_offset: r.u64()?,
                    });
                }
                Self::MemoryTable(regions)
            }
            TAG_RUN => {
                let mut header = [0u8; REQUEST_HEADER_SIZE];
                header.copy_from_slice(r.bytes(REQUEST_HEADER_SIZE)?);
                let (ins, outs) = (usize::from(r.u8()?), usize::from(r.u8()?));
                if ins + outs > MAX_BUFFERS {
                    return Err(MessageError::TooManyBuffers(ins + outs));
                }
                let mut budget = MAX_SPANS;
                let inputs = get_spans(&mut r, ins, &mut budget)?;
                let outputs = get_spans(&mut r, outs, &mut budget)?;
                Self::Run(Box::new(RunRequest {
                    header,
                    inputs,
                    outputs,
                }))
            }
            TAG_HOST_FUNCTION_LINK => Self::HostFunctionLink,
            TAG_MAILBOX => Self::Mailbox,
            TAG_POSTED => Self::Posted,
            TAG_PAUSE => Self::Pause,
            TAG_RESUME => Self::Resume,
            TAG_ADOPT => Self::Adopt,
            TAG_END => Self::End,
            TAG_IPC => {
                let import = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(MessageError::Truncated),
                };
                let device = r.u32()?;
                let (kind, arg) = (r.u64()?, r.u64()?);
                let meta = [r.u64()?, r.u64()?, r.u64()?];
                Self::Ipc(IpcCall {
                    import,
                    device,
                    kind,
                    arg,
                    meta,
                })
            }
            TAG_SAVE_STATE => Self::SaveState,
            TAG_RESTORE_STATE => Self::RestoreState,
            TAG_SAVE_RECORD => Self::SaveRecord,
            TAG_EXPORT_RUNS => Self::ExportRuns,
            TAG_IMPORT_RUNS => Self::ImportRuns(get_runs(&mut r)?),
            TAG_RESTORE_HANDED_OVER => Self::RestoreHandedOver,
            TAG_PRECOPY_ROUND => Self::PrecopyRound {
                budget: r.u64()?,
                max_passes: r.u32()?,
            },
            TAG_PRECOPY_RESET => Self::PrecopyReset,
            TAG_RESTORE_PRECOPIED => Self::RestorePrecopied,
            TAG_BIND => {
                let session = r.u64()?;
                let has_slot = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(MessageError::Truncated),
                };
                let slot = r.u32()?;
                if !has_slot && slot != 0 {
                    return Err(MessageError::Truncated);
                }
                Self::Bind {
                    session,
                    slot: has_slot.then_some(slot),
                }
            }
            #[cfg(feature = "test-hooks")]
            TAG_SANDBOX_TEST_HOOK => {
                let n = usize::try_from(r.u32()?).map_err(|_| MessageError::Truncated)?;
                Self::SandboxTestHook(r.bytes(n)?.to_vec())
            }
            tag => return Err(MessageError::UnknownTag(tag)),
        };
        r.end()?;
        Ok(msg)
    }
}

/// A batch of runs: the count (u32, at most [`RUN_BATCH`]), then three u64 each.
fn put_runs(out: &mut Vec<u8>, runs: &[RunMeta]) -> Result<(), MessageError> {
    if runs.len() > RUN_BATCH {
        return Err(MessageError::TooManyRuns(runs.len() as u64));
    }
    out.extend_from_slice(&u32::try_from(runs.len()).unwrap_or(u32::MAX).to_le_bytes());
    for run in runs {
        for v in run {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok(())
}

fn get_runs(r: &mut Reader<'_>) -> Result<Vec<RunMeta>, MessageError> {
    let n = u64::from(r.u32()?);
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= RUN_BATCH)
        .ok_or(MessageError::TooManyRuns(n))?;
    let mut runs = Vec::with_capacity(n);
    for _ in 0..n {
        runs.push([r.u64()?, r.u64()?, r.u64()?]);
    }
    Ok(runs)
}

impl FromWorker {
    /// The frame body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + RESPONSE_HEADER_SIZE + 8);
        match self {
            Self::Done(resp, exec_ns) => {
                out.push(TAG_DONE);
                out.extend_from_slice(&resp.encode());
                out.extend_from_slice(&exec_ns.to_le_bytes());
            }
            Self::Posted => out.push(TAG_POSTED),
            Self::Adopted { session, replay } => {
                out.push(TAG_ADOPTED);
                out.extend_from_slice(&session.to_le_bytes());
                out.push(u8::from(*replay));
            }
            Self::Exported(resp) => {
                out.push(TAG_EXPORTED);
                out.extend_from_slice(&resp.encode());
            }
            Self::Runs(runs) => {
                out.push(TAG_RUNS);
                // A worker never makes a longer batch (`send_runs`); cut, it would be refused.
                let _ = put_runs(&mut out, &runs[..runs.len().min(RUN_BATCH)]);
            }
        }
        out
    }

    /// Decodes a frame body.
    pub fn decode(body: &[u8]) -> Result<Self, MessageError> {
        let mut r = Reader { b: body };
        let msg = match r.u8()? {
            TAG_DONE => {
                let bytes = r.bytes(RESPONSE_HEADER_SIZE)?;
                let resp = ResponseHeader::decode(bytes).map_err(|_| MessageError::Truncated)?;
                Self::Done(resp, r.u64()?)
            }
            TAG_POSTED => Self::Posted,
            TAG_ADOPTED => Self::Adopted {
                session: r.u64()?,
                replay: r.u8()? != 0,
            },
            TAG_EXPORTED => {
                let bytes = r.bytes(RESPONSE_HEADER_SIZE)?;
                Self::Exported(ResponseHeader::decode(bytes).map_err(|_| MessageError::Truncated)?)
            }
            TAG_RUNS => Self::Runs(get_runs(&mut r)?),
            tag => return Err(MessageError::UnknownTag(tag)),
        };
        r.end()?;
        Ok(msg)
    }
}

/// The answer of [`ToWorker::ExportRuns`]: the final response, and every run with its
/// descriptor.
pub type ExportAnswer = (ResponseHeader, Vec<(RunMeta, File)>);

/// A received frame: its body and the descriptors that came with it.
#[derive(Debug)]
pub struct Frame {
    /// The body.
    pub body: Vec<u8>,
    /// The descriptors, in order.
    pub files: Vec<File>,
}

/// One end of the socket between the daemon and a worker, moving whole frames.
#[derive(Debug)]
pub struct WorkerChannel {
    sock: UnixStream,
}

impl WorkerChannel {
    /// Wraps a connected stream socket.
    pub fn new(sock: UnixStream) -> Self {
        Self { sock }
    }

    /// A connected pair: (daemon end, worker end).
    pub fn pair() -> io::Result<(Self, UnixStream)> {
        let (a, b) = UnixStream::pair()?;
        Ok((Self::new(a), b))
    }

    /// The socket's descriptor (for poll).
    pub fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Bounds how long one send or one read may block: a peer that stopped reading, or that
    /// stopped in the middle of a frame. (The daemon reads only once poll says a frame has
    /// begun, so the bound never cuts a long op short.)
    pub fn set_timeouts(&self, timeout: Duration) -> io::Result<()> {
        self.sock.set_write_timeout(Some(timeout))?;
        self.sock.set_read_timeout(Some(timeout))
    }

    /// Sends a message to the worker, with `fds` (as many as the message carries).
    pub fn send_to_worker(&self, msg: &ToWorker, fds: &[RawFd]) -> Result<(), MessageError> {
        if fds.len() != msg.fd_count() {
            return Err(MessageError::FdCount {
                expected: msg.fd_count(),
                got: fds.len(),
            });
        }
        self.send_frame(&msg.encode()?, fds)
    }

    /// Receives a message from the daemon with its file descriptors; `None` when the daemon
    /// closed its end.
    pub fn recv_to_worker(&self) -> Result<Option<(ToWorker, Vec<File>)>, MessageError> {
        let Some(Frame { body, files }) = self.recv_frame(MAX_REGIONS)? else {
            return Ok(None);
        };
        let msg = ToWorker::decode(&body)?;
        if files.len() != msg.fd_count() {
            return Err(MessageError::FdCount {
                expected: msg.fd_count(),
                got: files.len(),
            });
        }
        Ok(Some((msg, files)))
    }

    /// Sends a message to the daemon.
    pub fn send_to_daemon(&self, msg: &FromWorker) -> Result<(), MessageError> {
        self.send_frame(&msg.encode(), &[])
    }

    /// Receives a message from the worker; `None` when the worker closed its end (or died).
    /// Descriptors a worker tries to pass are discarded by the kernel.
    pub fn recv_from_worker(&self) -> Result<Option<FromWorker>, MessageError> {
        match self.recv_frame(0)? {
            Some(frame) => FromWorker::decode(&frame.body).map(Some),
            None => Ok(None),
        }
    }

    /// Sends one frame: the length, then the body; `fds` travel with the first bytes.
    pub fn send_frame(&self, body: &[u8], fds: &[RawFd]) -> Result<(), MessageError> {
        if body.len() > MAX_FRAME {
            return Err(MessageError::FrameTooLong(body.len() as u64));
        }
        let len =
            u32::try_from(body.len()).map_err(|_| MessageError::FrameTooLong(body.len() as u64))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(body);
        let (mut sent, mut fds) = (0, fds);
        while sent < frame.len() {
            match self.sock.send_with_fds(&[&frame[sent..]], fds) {
                Ok(n) => {
                    sent += n;
                    fds = &[];
                }
                Err(e) if e.errno() == libc::EINTR => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        Ok(())
    }

    /// Sends an IPC export's answer with the driver's descriptor.
    pub fn send_exported(&self, resp: ResponseHeader, fd: RawFd) -> Result<(), MessageError> {
        self.send_frame(&FromWorker::Exported(resp).encode(), &[fd])
    }

    /// Sends a handover's exported runs to the daemon, in batches of at most [`RUN_BATCH`]
    /// with their descriptors ([`ToWorker::ExportRuns`]).
    pub fn send_runs(&self, runs: &[(RunMeta, RawFd)]) -> Result<(), MessageError> {
        for batch in runs.chunks(RUN_BATCH) {
            let metas: Vec<RunMeta> = batch.iter().map(|(m, _)| *m).collect();
            let fds: Vec<RawFd> = batch.iter().map(|(_, fd)| *fd).collect();
            self.send_frame(&FromWorker::Runs(metas).encode(), &fds)?;
        }
        Ok(())
    }

    /// Receives the answer of [`ToWorker::ExportRuns`], on the socket: every run with its
    /// descriptor, and the final `Done`'s response; `Posted` frames are skipped. `None` when
    /// the worker closed its end. At most `max_runs` runs are taken.
    pub fn recv_runs_answer(&self, max_runs: usize) -> Result<Option<ExportAnswer>, MessageError> {
        let mut runs = Vec::new();
        loop {
            let Some(Frame { body, files }) = self.recv_frame(RUN_BATCH)? else {
                return Ok(None);
            };
            match FromWorker::decode(&body)? {
                FromWorker::Posted if files.is_empty() => {}
                FromWorker::Runs(metas) if metas.len() == files.len() => {
                    if runs.len() + metas.len() > max_runs {
                        return Err(MessageError::TooManyRuns((runs.len() + metas.len()) as u64));
                    }
                    runs.extend(metas.into_iter().zip(files));
                }
                FromWorker::Done(resp, _) if files.is_empty() => return Ok(Some((resp, runs))),
                FromWorker::Runs(metas) => {
                    return Err(MessageError::FdCount {
                        expected: metas.len(),
                        got: files.len(),
                    })
                }
                _ => return Err(MessageError::Mailbox),
            }
        }
    }

    /// Receives the answer of an IPC call from the worker, on the socket: `Exported` with its
    /// descriptor, or `Done`; `Posted` frames (stale wake-ups) are skipped. `None` when the
    /// worker closed its end.
    pub fn recv_ipc_answer(&self) -> Result<Option<(FromWorker, Option<File>)>, MessageError> {
        loop {
            let Some(Frame { body, mut files }) = self.recv_frame(1)? else {
                return Ok(None);
            };
            let msg = FromWorker::decode(&body)?;
            let expected = usize::from(matches!(msg, FromWorker::Exported(_)));
            match msg {
                FromWorker::Posted => continue,
                _ if files.len() != expected => {
                    return Err(MessageError::FdCount {
                        expected,
                        got: files.len(),
                    })
                }
                _ => return Ok(Some((msg, files.pop()))),
            }
        }
    }

    /// Receives one frame and the descriptors that came with it (at most `max_fds`); `None`
    /// if the peer closed the socket between frames.
    pub fn recv_frame(&self, max_fds: usize) -> Result<Option<Frame>, MessageError> {
        let mut files = Vec::new();
        let mut len = [0u8; 4];
        match self.read_full(&mut len, max_fds, &mut files)? {
            0 => return Ok(None),
            4 => {}
            _ => return Err(MessageError::ClosedMidFrame),
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(MessageError::FrameTooLong(len as u64));
        }
        let mut body = vec![0u8; len];
        if self.read_full(&mut body, max_fds, &mut files)? != len {
            return Err(MessageError::ClosedMidFrame);
        }
        Ok(Some(Frame { body, files }))
    }

    /// Reads until `buf` is full or the peer closes; returns the bytes read. Reads never ask
    /// for more than `buf` holds, so they cannot take bytes (or descriptors) of the next frame.
    fn read_full(
        &self,
        buf: &mut [u8],
        max_fds: usize,
        files: &mut Vec<File>,
    ) -> Result<usize, MessageError> {
        let mut pos = 0;
        while pos < buf.len() {
            let mut fds = vec![-1 as RawFd; max_fds.saturating_sub(files.len())];
            let rest = &mut buf[pos..];
            let mut iov = [libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            }];
            // SAFETY: the iovec covers `rest`, a live, exclusively borrowed byte slice, and any
            // bytes may be written to it.
            let got = unsafe { self.sock.recv_with_fds(&mut iov, &mut fds) };
            match got {
                Ok((n, nfds)) => {
                    for &fd in &fds[..nfds] {
                        // SAFETY: recvmsg just installed `fd` in this process for us; nothing
                        // else owns it.
                        files.push(unsafe { File::from_raw_fd(fd) });
                    }
                    if n == 0 {
                        break;
                    }
                    pos += n;
                }
                Err(e) if e.errno() == libc::EINTR => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        Ok(pos)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, Write};

    use qcuda_proto::{Direction, Op, RequestHeader};

    use super::*;

    fn run_request() -> RunRequest {
        let mut h = RequestHeader::new(Op::MemcpyHtoD);
        h.push_buffer(Direction::In, 0x3000).unwrap();
        RunRequest {
            header: h.encode(),
            inputs: vec![vec![
                Span {
                    gpa: 0x1000,
                    len: 0x1000,
                },
                Span {
                    gpa: u64::MAX - 7,
                    len: 0x2000,
                },
            ]],
            outputs: vec![vec![]],
        }
    }

    fn table() -> ToWorker {
        ToWorker::MemoryTable(vec![
            RegionSpec {
                gpa: 0,
                size: 0xa_0000,
                file_offset: 0,
            },
            RegionSpec {
                gpa: 0x1_0000_0000,
                size: 1 << 30,
                file_offset: 0xa_0000,
            },
        ])
    }

    #[test]
    fn messages_round_trip() {
        for msg in [
            table(),
            ToWorker::MemoryTable(vec![]),
            ToWorker::Run(Box::new(run_request())),
            ToWorker::HostFunctionLink,
            ToWorker::Pause,
            ToWorker::Resume,
            ToWorker::Adopt,
            ToWorker::End,
            ToWorker::SaveState,
            ToWorker::RestoreState,
            ToWorker::PrecopyRound {
                budget: 64 << 20,
                max_passes: 2,
            },
            ToWorker::PrecopyReset,
            ToWorker::RestorePrecopied,
        ] {
            assert_eq!(ToWorker::decode(&msg.encode().unwrap()).unwrap(), msg);
        }
        assert_eq!(ToWorker::RestorePrecopied.fd_count(), 2);
        assert_eq!(ToWorker::PrecopyReset.fd_count(), 0);
        // A spare's binding carries the quota file exactly when it names a slot.
        for slot in [None, Some(0), Some(u32::MAX)] {
            let msg = ToWorker::Bind {
                session: u64::MAX,
                slot,
            };
            assert_eq!(ToWorker::decode(&msg.encode().unwrap()).unwrap(), msg);
            assert_eq!(msg.fd_count(), usize::from(slot.is_some()));
        }
        let mut resp = ResponseHeader::with_status(700);
        resp.flags = 1;
        resp.rets = [1, 2, 3, 4, 5, 6, u64::MAX];
        for msg in [
            FromWorker::Done(resp, 1234),
            FromWorker::Adopted {
                session: u64::MAX - 1,
                replay: true,
            },
            FromWorker::Adopted {
                session: 3,
                replay: false,
            },
        ] {
            assert_eq!(FromWorker::decode(&msg.encode()).unwrap(), msg);
        }
        // An Adopted answer cut short is refused.
        let b = FromWorker::Adopted {
            session: 3,
            replay: false,
        }
        .encode();
        FromWorker::decode(&b[..b.len() - 1]).unwrap_err();
        let msg = FromWorker::Exported(resp);
        assert_eq!(FromWorker::decode(&msg.encode()).unwrap(), msg);
        for import in [false, true] {
            let msg = ToWorker::Ipc(IpcCall {
                import,
                device: 3,
                kind: 1,
                arg: u64::MAX,
                meta: [7, 8, 9],
            });
            assert_eq!(ToWorker::decode(&msg.encode().unwrap()).unwrap(), msg);
            assert_eq!(msg.fd_count(), usize::from(import));
        }
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let good = ToWorker::Run(Box::new(run_request())).encode().unwrap();
        // Every proper prefix is truncated; a longer body has trailing bytes.
        for n in 0..good.len() {
            assert!(
                matches!(ToWorker::decode(&good[..n]), Err(MessageError::Truncated)),
                "prefix of {n}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            ToWorker::decode(&long),
            Err(MessageError::TrailingBytes(1))
        ));
        assert!(matches!(
            ToWorker::decode(&[0x7f]),
            Err(MessageError::UnknownTag(0x7f))
        ));
        // An IPC call with a bad import flag, or cut short.
        let ipc = ToWorker::Ipc(IpcCall {
            import: true,
            device: 1,
            kind: 2,
            arg: 3,
            meta: [4, 5, u64::MAX],
        })
        .encode()
        .unwrap();
        let mut bad_flag = ipc.clone();
        bad_flag[1] = 2;
        ToWorker::decode(&bad_flag).unwrap_err();
        // A binding with a bad slot flag, a slot without the flag, or cut short.
        let bind = ToWorker::Bind {
            session: 5,
            slot: Some(2),
        }
        .encode()
        .unwrap();
        let mut bad = bind.clone();
        bad[9] = 2;
        ToWorker::decode(&bad).unwrap_err();
        bad[9] = 0;
        ToWorker::decode(&bad).unwrap_err();
        for n in 0..bind.len() {
            assert!(
                matches!(ToWorker::decode(&bind[..n]), Err(MessageError::Truncated)),
                "prefix of {n}"
            );
        }
        for n in 0..ipc.len() {
            assert!(
                matches!(ToWorker::decode(&ipc[..n]), Err(MessageError::Truncated)),
                "prefix of {n}"
            );
        }
        assert!(matches!(
            FromWorker::decode(&good),
            Err(MessageError::UnknownTag(TAG_RUN))
        ));
        // 9 buffers.
        let mut nine = good.clone();
        nine[1 + REQUEST_HEADER_SIZE] = 5;
        nine[2 + REQUEST_HEADER_SIZE] = 4;
        assert!(matches!(
            ToWorker::decode(&nine),
            Err(MessageError::TooManyBuffers(9))
        ));
        // A span count far beyond the body, and one beyond the limit.
        let at = 3 + REQUEST_HEADER_SIZE;
        let mut lying = good.clone();
        lying[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(
            ToWorker::decode(&lying),
            Err(MessageError::Truncated)
        ));
        lying[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            ToWorker::decode(&lying),
            Err(MessageError::TooManySpans)
        ));
        // Too many regions.
        let mut regions = vec![TAG_MEMORY_TABLE];
        regions.extend_from_slice(&u32::try_from(MAX_REGIONS + 1).unwrap().to_le_bytes());
        assert!(matches!(
            ToWorker::decode(&regions),
            Err(MessageError::TooManyRegions(_))
        ));
        let too_many = ToWorker::MemoryTable(vec![
            RegionSpec {
                gpa: 0,
                size: 1,
                file_offset: 0
            };
            MAX_REGIONS + 1
        ]);
        too_many.encode().unwrap_err();
        // A short response.
        assert!(matches!(
            FromWorker::decode(&[TAG_DONE, 0, 0]),
            Err(MessageError::Truncated)
        ));
    }

    fn memfd(data: &[u8]) -> File {
        // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"qcuda-msg-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let mut f = unsafe { File::from_raw_fd(fd) };
        f.write_all(data).unwrap();
        f.rewind().unwrap();
        f
    }

    #[test]
    fn frames_carry_descriptors_and_keep_their_boundaries() {
        let (daemon, worker) = WorkerChannel::pair().unwrap();
        let worker = WorkerChannel::new(worker);
        let (a, b) = (memfd(b"aaaa"), memfd(b"bbbbbbbb"));
        daemon
            .send_to_worker(&table(), &[a.as_raw_fd(), b.as_raw_fd()])
            .unwrap();
        daemon
            .send_to_worker(&ToWorker::Run(Box::new(run_request())), &[])
            .unwrap();
        // A frame bigger than a socket buffer, sent from another thread.
        let big = ToWorker::Run(Box::new(RunRequest {
            inputs: vec![vec![Span { gpa: 1, len: 2 }; 50_000]],
            ..run_request()
        }));
        let sent = big.clone();
        let sender = std::thread::spawn(move || {
            daemon.send_to_worker(&sent, &[]).unwrap();
            daemon
        });

        let (msg, files) = worker.recv_to_worker().unwrap().unwrap();
        assert_eq!(msg, table());
        let sizes: Vec<u64> = files.iter().map(|f| f.metadata().unwrap().len()).collect();
        assert_eq!(sizes, [4, 8]);
        let (msg, files) = worker.recv_to_worker().unwrap().unwrap();
        assert_eq!(
            (msg, files.len()),
            (ToWorker::Run(Box::new(run_request())), 0)
        );
        let (msg, _) = worker.recv_to_worker().unwrap().unwrap();
        assert_eq!(msg, big);
        let daemon = sender.join().unwrap();

        worker
            .send_to_daemon(&FromWorker::Done(ResponseHeader::with_status(3), 5))
            .unwrap();
        assert_eq!(
            daemon.recv_from_worker().unwrap(),
            Some(FromWorker::Done(ResponseHeader::with_status(3), 5))
        );
        drop(worker);
        assert_eq!(daemon.recv_from_worker().unwrap(), None);
    }

    #[test]
    fn descriptor_mismatches_and_broken_frames_are_refused() {
        let (daemon, worker) = WorkerChannel::pair().unwrap();
        let worker = WorkerChannel::new(worker);
        let f = memfd(b"x");
        assert!(matches!(
            daemon.send_to_worker(&table(), &[f.as_raw_fd()]),
            Err(MessageError::FdCount {
                expected: 2,
                got: 1
            })
        ));
        // A run with a descriptor attached, sent raw.
        let body = ToWorker::Run(Box::new(run_request())).encode().unwrap();
        daemon.send_frame(&body, &[f.as_raw_fd()]).unwrap();
        assert!(matches!(
            worker.recv_to_worker(),
            Err(MessageError::FdCount {
                expected: 0,
                got: 1
            })
        ));
        // A frame length beyond the limit.
        daemon
            .sock
            .try_clone()
            .unwrap()
            .write_all(&u32::try_from(MAX_FRAME + 1).unwrap().to_le_bytes())
            .unwrap();
        assert!(matches!(
            worker.recv_to_worker(),
            Err(MessageError::FrameTooLong(_))
        ));
        // A frame cut short by the peer closing.
        let (daemon, worker) = WorkerChannel::pair().unwrap();
        let worker = WorkerChannel::new(worker);
        daemon
            .sock
            .try_clone()
            .unwrap()
            .write_all(&[10, 0, 0, 0, TAG_DONE])
            .unwrap();
        drop(daemon);
        assert!(matches!(
            worker.recv_frame(0),
            Err(MessageError::ClosedMidFrame)
        ));
    }
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
//! The GPU timeline a guest process's worker records (`Op::GpuTrace`): the actions, the bounds,
//! and the 64-byte records `TRACE_READ` returns.
//!
//! Every record has the same layout: kind u8 @0, sub u8 @1 (per kind), device u16 @2 (the
//! guest's device ordinal), a u32 @4 (per kind), start u64 @8 and end u64 @16 (ns of the
//! worker's CLOCK_MONOTONIC), stream u64 @24, correlation u64 @32 (the sequence number of the
//! request that issued the work; 0: not known), then 24 bytes per kind @40. A kernel's name
//! travels in [`TraceRecord::Name`] records before the first record that uses its id (48 bytes
//! of the name each, so a long C++ name takes several).
//!
//! GPU records (kernels, copies, memsets, graphs) carry GPU timestamps as the host driver's
//! profiling interface (CUPTI) reported them, or, where the worker could not use it, from CUDA
//! events recorded around each op on its stream ([`TRACE_STATE_EVENTS`]). Request records
//! carry the worker's own clock: when a request reached it and when its answer left.

use crate::wire::WireError;

/// Bytes of one encoded [`TraceRecord`].
pub const TRACE_RECORD_SIZE: usize = 64;
/// `GpuTrace` action: the recorder's state only.
pub const TRACE_STATUS: u64 = 0;
/// `GpuTrace` action: start recording (again: records of an earlier recording not yet read are
/// dropped, and the counts start from zero).
pub const TRACE_ARM: u64 = 1;
/// `GpuTrace` action: stop recording; the records stay to be read.
pub const TRACE_DISARM: u64 = 2;
/// `GpuTrace` action: move records into out-buffer 0 (whole records, at most
/// [`TRACE_MAX_READ_RECORDS`] per request).
pub const TRACE_READ: u64 = 3;
/// The ring's capacity unless the arm says otherwise.
pub const TRACE_DEFAULT_RECORDS: u64 = 1 << 18;
/// The largest ring an arm may ask for (256 MiB of records at most per process).
pub const TRACE_MAX_RECORDS: u64 = 1 << 22;
/// The longest window an arm may ask for (one hour).
pub const TRACE_MAX_WINDOW_MS: u64 = 3_600_000;
/// Most records one `TRACE_READ` moves (one buffer's worth).
pub const TRACE_MAX_READ_RECORDS: u64 = crate::wire::MAX_BUFFER_LEN / TRACE_RECORD_SIZE as u64;
/// `TRACE_STATE_*` bit: recording now.
pub const TRACE_STATE_ARMED: u64 = 1 << 0;
/// `TRACE_STATE_*` bit: GPU times come from CUPTI's activity API.
pub const TRACE_STATE_CUPTI: u64 = 1 << 1;
/// `TRACE_STATE_*` bit: GPU times come from CUDA events around each op (CUPTI not usable).
pub const TRACE_STATE_EVENTS: u64 = 1 << 2;
/// `TRACE_STATE_*` bit: the host records requests only (no GPU times: tracing of GPU work is
/// off on the host, `vhost-cuda --gpu-trace off`).
pub const TRACE_STATE_REQUESTS_ONLY: u64 = 1 << 3;
/// Every `TRACE_STATE_*` bit.
pub const TRACE_STATE_KNOWN: u64 =
    TRACE_STATE_ARMED | TRACE_STATE_CUPTI | TRACE_STATE_EVENTS | TRACE_STATE_REQUESTS_ONLY;
/// Bytes of a name one [`TraceRecord::Name`] carries.
pub const TRACE_NAME_CHUNK: usize = 48;
/// Longest kernel name recorded (longer ones are cut).
pub const TRACE_MAX_NAME: usize = 4096;

/// `TraceRecord::Request` flag: fire-and-forget (nobody waited for its answer).
pub const TRACE_REQUEST_ASYNC: u8 = 1 << 0;
/// `TraceRecord::Request` flag: a record of a `Batch` (its `batch` is the batch's sequence
/// number), not a request of its own.
pub const TRACE_REQUEST_IN_BATCH: u8 = 1 << 1;

/// Kinds of copy, numbered as CUPTI numbers them (`CUpti_ActivityMemcpyKind`).
pub mod copy_kind {
    /// Host to device.
    pub const HTOD: u8 = 1;
    /// Device to host.
    pub const DTOH: u8 = 2;
    /// Host to array.
    pub const HTOA: u8 = 3;
    /// Array to host.
    pub const ATOH: u8 = 4;
    /// Array to array.
    pub const ATOA: u8 = 5;
    /// Array to device.
    pub const ATOD: u8 = 6;
    /// Device to array.
    pub const DTOA: u8 = 7;
    /// Device to device.
    pub const DTOD: u8 = 8;
    /// Host to host.
    pub const HTOH: u8 = 9;
    /// Peer to peer (between devices).
    pub const PTOP: u8 = 10;

    /// A short name for people ("HtoD", ...); "copy" for a kind this version does not know.
    pub fn name(kind: u8) -> &'static str {
        match kind {
            HTOD => "HtoD",
            DTOH => "DtoH",
            HTOA => "HtoA",
            ATOH => "AtoH",
            ATOA => "AtoA",
            ATOD => "AtoD",
            DTOA => "DtoA",
            DTOD => "DtoD",
            HTOH => "HtoH",
            PTOP => "PtoP",
            _ => "copy",
        }
    }
}

/// Kinds of synchronisation, numbered as CUPTI numbers them
/// (`CUpti_ActivitySynchronizationType`).
pub mod sync_kind {
    /// `cuEventSynchronize`.
    pub const EVENT: u8 = 1;
    /// `cuStreamWaitEvent`.
    pub const STREAM_WAIT_EVENT: u8 = 2;
    /// `cuStreamSynchronize`.
    pub const STREAM: u8 = 3;
    /// `cuCtxSynchronize`.
    pub const CONTEXT: u8 = 4;

    /// A short name for people.
    pub fn name(kind: u8) -> &'static str {
        match kind {
            EVENT => "cuEventSynchronize",
            STREAM_WAIT_EVENT => "cuStreamWaitEvent",
            STREAM => "cuStreamSynchronize",
            CONTEXT => "cuCtxSynchronize",
            _ => "synchronize",
        }
    }
}

const KIND_REQUEST: u8 = 1;
const KIND_KERNEL: u8 = 2;
const KIND_COPY: u8 = 3;
const KIND_MEMSET: u8 = 4;
const KIND_SYNC: u8 = 5;
const KIND_GRAPH: u8 = 6;
const KIND_NAME: u8 = 7;

/// Where and when a piece of work ran: the fields every GPU record has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceSpan {
    /// The guest's device ordinal.
    pub device: u16,
    /// Start, ns of the worker's CLOCK_MONOTONIC.
    pub start: u64,
    /// End, ns of the worker's CLOCK_MONOTONIC (not before `start`).
    pub end: u64,
    /// The stream: the driver's stream id (`cuStreamGetId`) for GPU records, the guest's
    /// stream handle for requests (0: the legacy stream).
    pub stream: u64,
    /// The sequence number of the request that issued it (0: not known).
    pub correlation: u64,
}

/// One record of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceRecord {
    /// A request as the worker saw it: `span.start` when it arrived, `span.end` when its answer
    /// left, `span.correlation` its own sequence number.
    Request {
        /// Device, times, the guest's stream handle, sequence number.
        span: TraceSpan,
        /// The [`crate::Op`] as u32.
        op: u32,
        /// `TRACE_REQUEST_*` bits.
        flags: u8,
        /// The answer's status (`cudaError_t`).
        status: u32,
        /// Records of a `Batch` (0 otherwise).
        records: u32,
        /// For a record of a batch, the batch's sequence number.
        batch: u64,
    },
    /// A kernel.
    Kernel {
        /// Device, GPU times, stream, request.
        span: TraceSpan,
        /// Id of its name (a [`TraceRecord::Name`] came first).
        name: u32,
        /// Grid dimensions.
        grid: [u32; 3],
        /// Block dimensions.
        block: [u16; 3],
        /// Dynamic shared memory bytes.
        shared_mem: u32,
    },
    /// A copy.
    Copy {
        /// Device, GPU times, stream, request.
        span: TraceSpan,
        /// A [`copy_kind`].
        kind: u8,
        /// Bytes copied.
        bytes: u64,
    },
    /// A memset.
    Memset {
        /// Device, GPU times, stream, request.
        span: TraceSpan,
        /// Bytes set.
        bytes: u64,
    },
    /// A synchronisation the worker waited in (CUPTI only: host times).
    Sync {
        /// Device, times, stream, request.
        span: TraceSpan,
        /// A [`sync_kind`].
        kind: u8,
    },
    /// A graph launch, from its first node's start to its last node's end.
    Graph {
        /// Device, GPU times, stream, request.
        span: TraceSpan,
        /// The driver's graph id.
        graph: u32,
    },
    /// A piece of the name with id `id`: bytes `offset..offset + len` of a name of `total`
    /// bytes (UTF-8, cut at [`TRACE_MAX_NAME`]).
    Name {
        /// The id kernel records use.
        id: u32,
        /// Where this piece starts in the name.
        offset: u32,
        /// The whole name's length.
        total: u32,
        /// Bytes of `chunk` that belong to the name.
        len: u8,
        /// The piece, zero-padded.
        chunk: [u8; TRACE_NAME_CHUNK],
    },
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl TraceRecord {
    /// The span of a timed record (every kind but `Name`).
    pub fn span(&self) -> Option<&TraceSpan> {
        match self {
            Self::Request { span, .. }
            | Self::Kernel { span, .. }
            | Self::Copy { span, .. }
            | Self::Memset { span, .. }
            | Self::Sync { span, .. }
            | Self::Graph { span, .. } => Some(span),
            Self::Name { .. } => None,
        }
    }

    /// Whether it is work on the GPU (kernel, copy, memset, graph), whose time counts as busy.
    pub fn is_gpu_work(&self) -> bool {
        matches!(
            self,
            Self::Kernel { .. } | Self::Copy { .. } | Self::Memset { .. } | Self::Graph { .. }
        )
    }

    /// The name records of `name` under `id`: one per [`TRACE_NAME_CHUNK`] bytes (cut at
    /// [`TRACE_MAX_NAME`]), handed to `emit` in order.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "lengths and offsets of a name cut at TRACE_MAX_NAME (4096) bytes, pieces of \
                  TRACE_NAME_CHUNK (48)"
    )]
    pub fn name_records(id: u32, name: &[u8], mut emit: impl FnMut(TraceRecord)) {
        let name = &name[..name.len().min(TRACE_MAX_NAME)];
        // A name of zero bytes still gets one record, so that its id is known.
        let total = name.len() as u32;
        let mut offset = 0usize;
        loop {
            let piece = &name[offset..(offset + TRACE_NAME_CHUNK).min(name.len())];
            let mut chunk = [0u8; TRACE_NAME_CHUNK];
            chunk[..piece.len()].copy_from_slice(piece);
            emit(TraceRecord::Name {
                id,
                offset: offset as u32,
                total,
                len: piece.len() as u8,
                chunk,
            });
            offset += TRACE_NAME_CHUNK;
            if offset >= name.len() {
                break;
            }
        }
    }

    /// The encoded record.
    pub fn encode(&self) -> [u8; TRACE_RECORD_SIZE] {
        let mut b = [0u8; TRACE_RECORD_SIZE];
        let common = |b: &mut [u8; TRACE_RECORD_SIZE], kind: u8, sub: u8, a: u32, s: &TraceSpan| {
            b[0] = kind;
            b[1] = sub;
            put(b, 2, &s.device.to_le_bytes());
            put(b, 4, &a.to_le_bytes());
            put(b, 8, &s.start.to_le_bytes());
            put(b, 16, &s.end.to_le_bytes());
            put(b, 24, &s.stream.to_le_bytes());
            put(b, 32, &s.correlation.to_le_bytes());
        };
        match self {
            Self::Request {
                span,
                op,
                flags,
                status,
                records,
                batch,
            } => {
                common(&mut b, KIND_REQUEST, *flags, *op, span);
                put(&mut b, 40, &status.to_le_bytes());
                put(&mut b, 44, &records.to_le_bytes());
                put(&mut b, 48, &batch.to_le_bytes());
            }
            Self::Kernel {
                span,
                name,
                grid,
                block,
                shared_mem,
            } => {
                common(&mut b, KIND_KERNEL, 0, *name, span);
                for (i, g) in grid.iter().enumerate() {
                    put(&mut b, 40 + 4 * i, &g.to_le_bytes());
                }
                for (i, x) in block.iter().enumerate() {
                    put(&mut b, 52 + 2 * i, &x.to_le_bytes());
                }
                put(&mut b, 58, &[0, 0]);
                put(&mut b, 60, &shared_mem.to_le_bytes());
            }
            Self::Copy { span, kind, bytes } => {
                common(&mut b, KIND_COPY, *kind, 0, span);
                put(&mut b, 40, &bytes.to_le_bytes());
            }
            Self::Memset { span, bytes } => {
                common(&mut b, KIND_MEMSET, 0, 0, span);
                put(&mut b, 40, &bytes.to_le_bytes());
            }
            Self::Sync { span, kind } => common(&mut b, KIND_SYNC, *kind, 0, span),
            Self::Graph { span, graph } => common(&mut b, KIND_GRAPH, 0, *graph, span),
            Self::Name {
                id,
                offset,
                total,
                len,
                chunk,
            } => {
                b[0] = KIND_NAME;
                b[1] = *len;
                put(&mut b, 4, &id.to_le_bytes());
                put(&mut b, 8, &offset.to_le_bytes());
                put(&mut b, 12, &total.to_le_bytes());
                put(&mut b, 16, chunk);
            }
        }
        b
    }

    /// Decodes and checks one record: a known kind, end not before start, a name piece inside
    /// its name, reserved bytes zero.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < TRACE_RECORD_SIZE {
            return Err(WireError::Short);
        }
        let (kind, sub) = (b[0], b[1]);
        if kind == KIND_NAME {
            let (id, offset, total) = (u32_at(b, 4), u32_at(b, 8), u32_at(b, 12));
            let len = sub;
            let fits = usize::from(len) <= TRACE_NAME_CHUNK
                && (total as usize) <= TRACE_MAX_NAME
                && u64::from(offset) + u64::from(len) <= u64::from(total)
                && u16_at(b, 2) == 0;
            if !fits {
                return Err(WireError::Reserved);
            }
            let mut chunk = [0u8; TRACE_NAME_CHUNK];
            chunk.copy_from_slice(&b[16..64]);
            return Ok(Self::Name {
                id,
                offset,
                total,
                len,
                chunk,
            });
        }
        let span = TraceSpan {
            device: u16_at(b, 2),
            start: u64_at(b, 8),
            end: u64_at(b, 16),
            stream: u64_at(b, 24),
            correlation: u64_at(b, 32),
        };
        if span.end < span.start {
            return Err(WireError::Reserved);
        }
        let a = u32_at(b, 4);
        let zero = |from: usize| b[from..TRACE_RECORD_SIZE].iter().all(|&x| x == 0);
        let (rec, clean) = match kind {
            KIND_REQUEST => (
                Self::Request {
                    span,
                    op: a,
                    flags: sub,
                    status: u32_at(b, 40),
                    records: u32_at(b, 44),
                    batch: u64_at(b, 48),
                },
                sub & !(TRACE_REQUEST_ASYNC | TRACE_REQUEST_IN_BATCH) == 0 && zero(56),
            ),
            KIND_KERNEL => (
                Self::Kernel {
                    span,
                    name: a,
                    grid: [u32_at(b, 40), u32_at(b, 44), u32_at(b, 48)],
                    block: [u16_at(b, 52), u16_at(b, 54), u16_at(b, 56)],
                    shared_mem: u32_at(b, 60),
                },
                sub == 0 && u16_at(b, 58) == 0,
            ),
            KIND_COPY => (
                Self::Copy {
                    span,
                    kind: sub,
                    bytes: u64_at(b, 40),
                },
                a == 0 && zero(48),
            ),
            KIND_MEMSET => (
                Self::Memset {
                    span,
                    bytes: u64_at(b, 40),
                },
                a == 0 && sub == 0 && zero(48),
            ),
            KIND_SYNC => (Self::Sync { span, kind: sub }, a == 0 && zero(40)),
            KIND_GRAPH => (Self::Graph { span, graph: a }, sub == 0 && zero(40)),
            _ => return Err(WireError::Reserved),
        };
        if !clean {
            return Err(WireError::Reserved);
        }
        Ok(rec)
    }
}

/// Where the two clocks stand at one moment: the worker's answer to a `GpuTrace` request
/// (rets[4], rets[5]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostClock {
    /// The worker's CLOCK_MONOTONIC, ns.
    pub monotonic_ns: u64,
    /// The worker's CLOCK_REALTIME, ns since the epoch.
    pub realtime_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: u64, end: u64) -> TraceSpan {
        TraceSpan {
            device: 1,
            start,
            end,
            stream: 7,
            correlation: 42,
        }
    }

    #[test]
    fn every_kind_round_trips() {
        let recs = [
            TraceRecord::Request {
                span: span(1, 2),
                op: 0x130,
                flags: TRACE_REQUEST_ASYNC | TRACE_REQUEST_IN_BATCH,
                status: 0,
                records: 3,
                batch: 9,
            },
            TraceRecord::Kernel {
                span: span(10, 20),
                name: 5,
                grid: [1, 2, 3],
                block: [256, 1, 1],
                shared_mem: 1024,
            },
            TraceRecord::Copy {
                span: span(3, 4),
                kind: copy_kind::HTOD,
                bytes: 1 << 20,
            },
            TraceRecord::Memset {
                span: span(3, 3),
                bytes: 64,
            },
            TraceRecord::Sync {
                span: span(5, 9),
                kind: sync_kind::STREAM,
            },
            TraceRecord::Graph {
                span: span(5, 9),
                graph: 77,
            },
        ];
        for r in recs {
            assert_eq!(TraceRecord::decode(&r.encode()), Ok(r));
            assert!(r.span().is_some());
        }
    }

    #[test]
    fn names_travel_in_pieces() {
        let name = [b'k'; 100];
        let mut got = [0u8; 100];
        let mut n = 0;
        TraceRecord::name_records(3, &name, |r| {
            let back = TraceRecord::decode(&r.encode()).unwrap();
            let TraceRecord::Name {
                id,
                offset,
                total,
                len,
                chunk,
            } = back
            else {
                panic!("not a name");
            };
            assert_eq!((id, total), (3, 100));
            let o = offset as usize;
            got[o..o + usize::from(len)].copy_from_slice(&chunk[..usize::from(len)]);
            n += 1;
        });
        assert_eq!(n, 3);
        assert_eq!(got, name);
        let mut empty = 0;
        TraceRecord::name_records(4, b"", |_| empty += 1);
        assert_eq!(empty, 1);
        let mut long = 0;
        TraceRecord::name_records(5, &[b'x'; 10_000], |_| long += 1);
        assert_eq!(long, TRACE_MAX_NAME.div_ceil(TRACE_NAME_CHUNK));
    }

    #[test]
    fn hostile_records_are_refused() {
        let good = TraceRecord::Kernel {
            span: span(10, 20),
            name: 5,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem: 0,
        }
        .encode();
        TraceRecord::decode(&good[..63]).unwrap_err();
        let mut b = good;
        b[0] = 99;
        TraceRecord::decode(&b).unwrap_err();
        // End before start.
        let mut b = good;
        b[16..24].copy_from_slice(&1u64.to_le_bytes());
        TraceRecord::decode(&b).unwrap_err();
        // A name piece past its name.
        let mut name = None;
        TraceRecord::name_records(1, b"abc", |r| name = Some(r.encode()));
        let mut b = name.unwrap();
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        TraceRecord::decode(&b).unwrap_err();
        let mut b = name.unwrap();
        b[1] = 49;
        TraceRecord::decode(&b).unwrap_err();
        // Reserved bytes.
        let mut b = TraceRecord::Sync {
            span: span(1, 2),
            kind: 3,
        }
        .encode();
        b[63] = 1;
        TraceRecord::decode(&b).unwrap_err();
    }

    #[test]
    fn bounds_fit_the_wire() {
        assert_eq!(
            TRACE_MAX_READ_RECORDS * TRACE_RECORD_SIZE as u64,
            crate::wire::MAX_BUFFER_LEN
        );
        assert!(TRACE_MAX_RECORDS * TRACE_RECORD_SIZE as u64 <= 256 << 20);
    }
}

//! The state of a VM's sessions as it travels in a live migration: the back-end state that QEMU
//! carries in its migration stream (`VHOST_USER_PROTOCOL_F_DEVICE_STATE`, see `vhu_cuda.rs`).
//!
//! On the source, every session's thread answers what its GPU side is (no worker, a failed
//! worker, or its worker's saved state: `GpuState::save`, the `QCUDAGS1` format of
//! `cuda/saved_state.rs`); on the destination a session thread is started for each, and a
//! worker restored from the saved state, under the same session id, so the guest's open files
//! of `/dev/qcuda` go on as they were.
//!
//! Layout (little-endian): the 8-byte magic `QCUDAMS1` and the version (u32). Version 2 (this
//! build's) then has its *head*: the length of a handover offer (u32, 0: none) and the offer
//! (`session/handover.rs`), then the length of a padding (u32) and that many zero bytes, and
//! then the *path* (u8: [`PATH_COPY`], [`PATH_HANDOVER`]). Both versions then have the number
//! of sessions (u32) and per session its id (u64), the guest pid (u32), what it holds (u8:
//! [`KIND_NONE`], [`KIND_FAILED`], [`KIND_STATE`], [`KIND_HANDED_OVER`]), for
//! `KIND_HANDED_OVER` only the number of pieces of device memory handed over for it (u32), the
//! length of the saved state (u64, 0 for none and failed) and the saved state; nothing after
//! the last session. Version 1 (no head, no path, no `KIND_HANDED_OVER`) is still read.
//!
//! Why a head. A source that shares the destination's host offers its device memory before it
//! sends anything else ([`write_head`]); the destination reads the head alone ([`read_head`]),
//! claims the memory over the offer's socket while the source waits, and then reads the rest
//! ([`read_body`]). The source writes the sessions only once it knows: with
//! [`PATH_HANDOVER`] the states carry no device memory (their runs came as pieces, in session
//! order, `pieces` of them for each `KIND_HANDED_OVER` session); with [`PATH_COPY`] they carry
//! it all, as version 1 did. The padding is there because QEMU does not pass the bytes on as
//! they come (see [`HEAD_PADDING`]).
//!
//! A saved state is never held in the daemon's memory: it is a [`StateFile`] (a memfd) that the
//! source's worker filled, copied into the stream by the kernel, and on the destination copied
//! from the stream into a new file, which its worker maps.
//!
//! The stream comes from another host and QEMU relays it unchecked: the readers trust
//! nothing. Every count is bounded, a length is never allocated before its bytes have arrived
//! (the file grows with what came), ids must be distinct, the padding must be zeros, kinds
//! must match the path, and trailing bytes are refused. The saved states themselves are
//! decoded by the worker with the checked decoder of `saved_state.rs`. Both decoders are
//! fuzzed (`fuzz/fuzz_targets/migration_stream.rs`, `saved_state.rs`).

use std::io::{self, Read, Write};

use thiserror::Error;

use super::{
    handover::{Offer, OfferError, MAX_PIECES},
    limits::MAX_SESSIONS,
};
use crate::worker::StateFile;

/// The first bytes of every stream.
pub const MAGIC: [u8; 8] = *b"QCUDAMS1";
/// The version this build writes.
pub const VERSION: u32 = 2;
/// The version before the head (still read).
pub const VERSION_WITHOUT_HEAD: u32 = 1;
/// A session without a worker (it has used no GPU op yet, or was reset).
pub const KIND_NONE: u8 = 0;
/// A session whose worker failed: its GPU ops fail until `DeviceReset`, on the destination too.
pub const KIND_FAILED: u8 = 1;
/// A session with a worker: its saved state follows, device memory included.
pub const KIND_STATE: u8 = 2;
/// A session with a worker whose device memory was handed over: its piece count and its saved
/// state without the memory's contents follow.
pub const KIND_HANDED_OVER: u8 = 3;
/// The device memory travels in the states.
pub const PATH_COPY: u8 = 0;
/// The device memory was handed over (same host): the states carry none.
pub const PATH_HANDOVER: u8 = 1;
/// Longest saved state one session may send: far above any GPU's memory, far below what would
/// overflow anything.
pub const MAX_STATE: u64 = 1 << 44;
/// Longest offer a head may hold (an offer of [`super::handover::MAX_GPUS`] GPUs and the
/// longest path is below 1.2 KiB).
pub const MAX_OFFER: u32 = 4096;
/// Longest padding a head may hold.
pub const MAX_PADDING: u32 = 4 << 20;
/// The padding a source writes after an offer, so that the offer reaches the destination while
/// the source waits for its claim. QEMU (10.0, `hw/virtio/vhost.c`
/// `vhost_save_backend_state`) reads our pipe in chunks of at most 1 MiB and puts each into
/// its migration stream as a length and the bytes; the stream's `QEMUFile` keeps up to 32 KiB
/// in its buffer before it writes them to the socket, and the destination's QEMU
/// (`vhost_load_backend_state`) passes a chunk to its back-end only once the whole chunk has
/// arrived. The offer is in the first chunk, which ends at most 1 MiB into the stream; with at
/// least 64 KiB more after it, QEMU has written all of that chunk by the time it buffers the
/// rest, so the destination gets the offer without anything more from us. It costs a
/// megabyte of zeros per migration.
pub const HEAD_PADDING: u32 = (1 << 20) + (64 << 10);

/// What a session holds on the GPU side, as it migrates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SavedGpu {
    /// No worker.
    None,
    /// A failed worker.
    Failed,
    /// A worker's saved state (`QCUDAGS1`), in the file it travels in.
    State(StateFile),
    /// A worker's saved state without device memory contents, whose runs were handed over as
    /// `pieces` pieces (`session/handover.rs`).
    HandedOver {
        /// The saved state.
        state: StateFile,
        /// How many of the handover's pieces are this session's (in session order).
        pieces: u32,
    },
}

impl SavedGpu {
    /// The saved state's file, if it has one.
    pub fn file(&self) -> Option<&StateFile> {
        match self {
            Self::State(f) | Self::HandedOver { state: f, .. } => Some(f),
            Self::None | Self::Failed => None,
        }
    }
}

/// One session in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionState {
    /// The session id the guest kernel module stamps on its requests.
    pub id: u64,
    /// The guest process's pid (0: unknown), for the logs.
    pub pid: u32,
    /// Its GPU side.
    pub gpu: SavedGpu,
}

/// The head of a stream, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The stream's version.
    pub version: u32,
    /// The source's handover offer (version 2 only).
    pub offer: Option<Offer>,
    /// Bytes of padding that follow (version 2 only).
    pub padding: u32,
}

/// A whole stream, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// Its head.
    pub head: Head,
    /// [`PATH_COPY`] or [`PATH_HANDOVER`] (always copy in version 1).
    pub path: u8,
    /// Its sessions.
    pub sessions: Vec<SessionState>,
}

/// Why a stream is refused.
#[derive(Debug, Error)]
pub enum StreamError {
    /// Not a migration stream of qcuda.
    #[error("not a qcuda migration stream (bad magic)")]
    Magic,
    /// Written by another version.
    #[error("migration stream version {0}, this build reads {VERSION_WITHOUT_HEAD} and {VERSION}")]
    Version(u32),
    /// A count, kind, length or id no source writes.
    #[error("bad migration stream: {0}")]
    Field(&'static str),
    /// The head's offer does not decode.
    #[error("bad migration stream: its handover offer: {0}")]
    Offer(#[from] OfferError),
    /// The stream ended early, or has bytes after its end.
    #[error("migration stream truncated or with trailing bytes")]
    Length,
    /// Reading or writing the stream failed.
    #[error("migration stream: {0}")]
    Io(#[from] io::Error),
}

/// Writes the head of a stream: `offer` (if any) and `padding` zero bytes after it, and
/// flushes `out` (a source then waits for the offer's claim: the bytes must be on their way).
pub fn write_head(
    out: &mut impl Write,
    offer: Option<&Offer>,
    padding: u32,
) -> Result<(), StreamError> {
    let offer = offer.map(Offer::encode).unwrap_or_default();
    let len = u32::try_from(offer.len())
        .ok()
        .filter(|&n| n <= MAX_OFFER)
        .ok_or(StreamError::Field("an offer too long"))?;
    if padding > MAX_PADDING {
        return Err(StreamError::Field("a padding too long"));
    }
    out.write_all(&MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&offer)?;
    out.write_all(&padding.to_le_bytes())?;
    let zeros = [0u8; 64 << 10];
    let mut left = padding as usize;
    while left > 0 {
        let n = left.min(zeros.len());
        out.write_all(&zeros[..n])?;
        left -= n;
    }
    out.flush()?;
    Ok(())
}

/// Writes the rest of a stream after its head: `path` and `sessions` (whose kinds must match
/// the path: [`SavedGpu::State`] only with [`PATH_COPY`], [`SavedGpu::HandedOver`] only with
/// [`PATH_HANDOVER`]).
pub fn write_body(
    out: &mut impl Write,
    path: u8,
    sessions: &[SessionState],
) -> Result<(), StreamError> {
    let n = u32::try_from(sessions.len())
        .ok()
        .filter(|&n| n as usize <= MAX_SESSIONS)
        .ok_or(StreamError::Field("too many sessions"))?;
    if path != PATH_COPY && path != PATH_HANDOVER {
        return Err(StreamError::Field("a path"));
    }
    out.write_all(&[path])?;
    out.write_all(&n.to_le_bytes())?;
    for s in sessions {
        let (kind, pieces, state) = match &s.gpu {
            SavedGpu::None => (KIND_NONE, None, None),
            SavedGpu::Failed => (KIND_FAILED, None, None),
            SavedGpu::State(f) if path == PATH_COPY => (KIND_STATE, None, Some(f)),
            SavedGpu::HandedOver { state, pieces } if path == PATH_HANDOVER => {
                (KIND_HANDED_OVER, Some(*pieces), Some(state))
            }
            _ => return Err(StreamError::Field("a session's kind against the path")),
        };
        out.write_all(&s.id.to_le_bytes())?;
        out.write_all(&s.pid.to_le_bytes())?;
        out.write_all(&[kind])?;
        if let Some(p) = pieces {
            out.write_all(&p.to_le_bytes())?;
        }
        out.write_all(&state.map_or(0, StateFile::len).to_le_bytes())?;
        if let Some(f) = state {
            f.write_to(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Writes `sessions` as a whole stream without an offer, their device memory copied.
pub fn write_stream(out: &mut impl Write, sessions: &[SessionState]) -> Result<(), StreamError> {
    write_head(out, None, 0)?;
    write_body(out, PATH_COPY, sessions)
}

fn read_array<const N: usize>(input: &mut impl Read) -> Result<[u8; N], StreamError> {
    let mut b = [0u8; N];
    input.read_exact(&mut b).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => StreamError::Length,
        _ => StreamError::Io(e),
    })?;
    Ok(b)
}

/// Reads a stream's head: its version and, in version 2, the offer and the padding's length
/// (not the padding: a destination claims the offer before it waits for more bytes).
pub fn read_head(input: &mut impl Read) -> Result<Head, StreamError> {
    if read_array::<8>(input)? != MAGIC {
        return Err(StreamError::Magic);
    }
    let version = u32::from_le_bytes(read_array(input)?);
    match version {
        VERSION_WITHOUT_HEAD => Ok(Head {
            version,
            offer: None,
            padding: 0,
        }),
        VERSION => {
            let len = u32::from_le_bytes(read_array(input)?);
            if len > MAX_OFFER {
                return Err(StreamError::Field("an offer too long"));
            }
            let offer = if len == 0 {
                None
            } else {
                let mut bytes = vec![0u8; len as usize];
                input.read_exact(&mut bytes).map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => StreamError::Length,
                    _ => StreamError::Io(e),
                })?;
                Some(Offer::decode(&bytes)?)
            };
            let padding = u32::from_le_bytes(read_array(input)?);
            if padding > MAX_PADDING {
                return Err(StreamError::Field("a padding too long"));
            }
            Ok(Head {
                version,
                offer,
                padding,
            })
        }
        v => Err(StreamError::Version(v)),
    }
}

/// Reads the rest of a stream after `head` (to its end: bytes after the last session are
/// refused): the padding, the path and the sessions.
pub fn read_body(
    input: &mut impl Read,
    head: &Head,
) -> Result<(u8, Vec<SessionState>), StreamError> {
    let path = if head.version == VERSION {
        let mut left = head.padding as usize;
        let mut buf = [0u8; 64 << 10];
        while left > 0 {
            let n = left.min(buf.len());
            input
                .read_exact(&mut buf[..n])
                .map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => StreamError::Length,
                    _ => StreamError::Io(e),
                })?;
            if buf[..n].iter().any(|&b| b != 0) {
                return Err(StreamError::Field("a padding that is not zeros"));
            }
            left -= n;
        }
        match read_array::<1>(input)? {
            [p @ (PATH_COPY | PATH_HANDOVER)] => p,
            _ => return Err(StreamError::Field("a path")),
        }
    } else {
        PATH_COPY
    };
    let n = u32::from_le_bytes(read_array(input)?) as usize;
    if n > MAX_SESSIONS {
        return Err(StreamError::Field("too many sessions"));
    }
    let mut sessions: Vec<SessionState> = Vec::new();
    let mut all_pieces = 0usize;
    for _ in 0..n {
        let id = u64::from_le_bytes(read_array(input)?);
        let pid = u32::from_le_bytes(read_array(input)?);
        let [kind] = read_array::<1>(input)?;
        let pieces = match (kind, path) {
            (KIND_NONE | KIND_FAILED, _) | (KIND_STATE, PATH_COPY) => None,
            (KIND_HANDED_OVER, PATH_HANDOVER) if head.version == VERSION => {
                let p = u32::from_le_bytes(read_array(input)?);
                all_pieces = all_pieces.saturating_add(p as usize);
                if all_pieces > MAX_PIECES {
                    return Err(StreamError::Field("too many pieces"));
                }
                Some(p)
            }
            (KIND_STATE | KIND_HANDED_OVER, _) => {
                return Err(StreamError::Field("a session's kind against the path"))
            }
            _ => return Err(StreamError::Field("a session's kind")),
        };
        let len = u64::from_le_bytes(read_array(input)?);
        if sessions.iter().any(|s| s.id == id) {
            return Err(StreamError::Field("a session id twice"));
        }
        let gpu = match (kind, len) {
            (KIND_NONE, 0) => SavedGpu::None,
            (KIND_FAILED, 0) => SavedGpu::Failed,
            (KIND_STATE | KIND_HANDED_OVER, 1..=MAX_STATE) => {
                let f = match StateFile::read_from(input, len) {
                    Ok(f) => f,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(StreamError::Length)
                    }
                    Err(e) => return Err(StreamError::Io(e)),
                };
                match pieces {
                    Some(pieces) => SavedGpu::HandedOver { state: f, pieces },
                    None => SavedGpu::State(f),
                }
            }
            _ => return Err(StreamError::Field("a saved state's length")),
        };
        sessions.push(SessionState { id, pid, gpu });
    }
    let mut rest = [0u8; 1];
    if input.read(&mut rest)? != 0 {
        return Err(StreamError::Length);
    }
    Ok((path, sessions))
}

/// Reads a whole stream (to its end), claiming nothing.
pub fn read_stream(input: &mut impl Read) -> Result<Stream, StreamError> {
    let head = read_head(input)?;
    let (path, sessions) = read_body(input, &head)?;
    Ok(Stream {
        head,
        path,
        sessions,
    })
}

/// Reads a whole stream whose device memory was copied (its sessions; an offer is ignored, a
/// handover's stream refused: its memory is not in it).
pub fn read_copied(input: &mut impl Read) -> Result<Vec<SessionState>, StreamError> {
    let s = read_stream(input)?;
    if s.path != PATH_COPY {
        return Err(StreamError::Field("a handover's stream without its pieces"));
    }
    Ok(s.sessions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<SessionState> {
        vec![
            SessionState {
                id: 7,
                pid: 1234,
                gpu: SavedGpu::State(StateFile::from_bytes(b"QCUDAGS1 and more").unwrap()),
            },
            SessionState {
                id: 9,
                pid: 0,
                gpu: SavedGpu::None,
            },
            SessionState {
                id: 11,
                pid: 5,
                gpu: SavedGpu::Failed,
            },
        ]
    }

    fn encoded(sessions: &[SessionState]) -> Vec<u8> {
        let mut out = Vec::new();
        write_stream(&mut out, sessions).unwrap();
        out
    }

    fn offer() -> Offer {
        Offer {
            boot_id: [1; 16],
            gpus: vec![[7; 16]],
            socket: "/run/qcuda/qcuda-handover-1.sock".into(),
            token: [3; 32],
        }
    }

    /// A handover's stream: an offer, `padding`, and one session handed over in two pieces.
    fn handover_stream(padding: u32) -> Vec<u8> {
        let mut out = Vec::new();
        write_head(&mut out, Some(&offer()), padding).unwrap();
        let sessions = [
            SessionState {
                id: 7,
                pid: 1,
                gpu: SavedGpu::HandedOver {
                    state: StateFile::from_bytes(b"QCUDAGS1 record").unwrap(),
                    pieces: 2,
                },
            },
            SessionState {
                id: 8,
                pid: 2,
                gpu: SavedGpu::None,
            },
        ];
        write_body(&mut out, PATH_HANDOVER, &sessions).unwrap();
        out
    }

    #[test]
    fn streams_round_trip() {
        for sessions in [sample(), Vec::new()] {
            let bytes = encoded(&sessions);
            assert_eq!(read_copied(&mut bytes.as_slice()).unwrap(), sessions);
        }
        let bytes = handover_stream(HEAD_PADDING);
        let s = read_stream(&mut bytes.as_slice()).unwrap();
        assert_eq!(s.head.offer, Some(offer()));
        assert_eq!(s.head.padding, HEAD_PADDING);
        assert_eq!(s.path, PATH_HANDOVER);
        assert!(matches!(
            s.sessions[0].gpu,
            SavedGpu::HandedOver { pieces: 2, .. }
        ));
        assert!(bytes.len() > HEAD_PADDING as usize);
        // A handover's stream has no memory in it: taken only with its pieces.
        read_copied(&mut bytes.as_slice()).unwrap_err();
    }

    #[test]
    fn the_head_is_read_before_the_padding_arrives() {
        let bytes = handover_stream(HEAD_PADDING);
        // Only the bytes up to the padding's length: enough for the offer.
        let at = 8 + 4 + 4 + offer().encode().len() + 4;
        let head = read_head(&mut &bytes[..at]).unwrap();
        assert_eq!(head.offer, Some(offer()));
        let mut rest = &bytes[at..];
        let (path, sessions) = read_body(&mut rest, &head).unwrap();
        assert_eq!((path, sessions.len()), (PATH_HANDOVER, 2));
    }

    #[test]
    fn version_1_streams_still_load() {
        // magic, version 1, one session without a worker.
        let mut v1 = MAGIC.to_vec();
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&5u64.to_le_bytes());
        v1.extend_from_slice(&6u32.to_le_bytes());
        v1.push(KIND_NONE);
        v1.extend_from_slice(&0u64.to_le_bytes());
        let s = read_stream(&mut v1.as_slice()).unwrap();
        assert_eq!(
            (s.head.version, s.path, s.sessions.len()),
            (1, PATH_COPY, 1)
        );
        // A handed-over kind does not exist in version 1.
        let at = 8 + 4 + 4 + 8 + 4;
        v1[at] = KIND_HANDED_OVER;
        read_stream(&mut v1.as_slice()).unwrap_err();
        let mut v3 = v1.clone();
        v3[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            read_stream(&mut v3.as_slice()),
            Err(StreamError::Version(3))
        ));
    }

    #[test]
    fn every_truncation_and_trailing_byte_is_refused() {
        for bytes in [encoded(&sample()), handover_stream(100)] {
            for cut in 0..bytes.len() {
                if read_stream(&mut &bytes[..cut]).is_ok() {
                    panic!("a stream cut at {cut} was taken");
                }
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(matches!(
                read_stream(&mut long.as_slice()),
                Err(StreamError::Length)
            ));
        }
    }

    #[test]
    fn hostile_heads_are_refused_without_panics() {
        let good = handover_stream(16);
        let offer_len = offer().encode().len();
        // An offer longer than any source writes, and its claimed length past what came.
        let mut long = good.clone();
        long[12..16].copy_from_slice(&(MAX_OFFER + 1).to_le_bytes());
        assert!(matches!(
            read_stream(&mut long.as_slice()),
            Err(StreamError::Field(_))
        ));
        let mut short = good.clone();
        short[12..16].copy_from_slice(&MAX_OFFER.to_le_bytes());
        read_stream(&mut short.as_slice()).unwrap_err();
        // An offer cut short inside its frame, one with a count of GPUs no source writes.
        let mut cut = good.clone();
        cut[12..16].copy_from_slice(&(u32::try_from(offer_len).unwrap() - 1).to_le_bytes());
        assert!(matches!(
            read_stream(&mut cut.as_slice()),
            Err(StreamError::Offer(_))
        ));
        let mut gpus = good.clone();
        gpus[16 + 24..16 + 28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_stream(&mut gpus.as_slice()),
            Err(StreamError::Offer(OfferError::Field("GPU count")))
        ));
        // A padding too long, or not zeros.
        let pad_at = 16 + offer_len;
        let mut pad = good.clone();
        pad[pad_at..pad_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_stream(&mut pad.as_slice()),
            Err(StreamError::Field(_))
        ));
        let mut dirty = good.clone();
        dirty[pad_at + 4] = 1;
        assert!(matches!(
            read_stream(&mut dirty.as_slice()),
            Err(StreamError::Field("a padding that is not zeros"))
        ));
        // A path no source writes; a copied state under the handover path.
        let path_at = pad_at + 4 + 16;
        let mut path = good.clone();
        path[path_at] = 7;
        assert!(matches!(
            read_stream(&mut path.as_slice()),
            Err(StreamError::Field("a path"))
        ));
        let mut kind = good.clone();
        kind[path_at + 1 + 4 + 12] = KIND_STATE;
        read_stream(&mut kind.as_slice()).unwrap_err();
        // More pieces than a handover carries.
        let mut pieces = good;
        let at = path_at + 1 + 4 + 13;
        pieces[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_stream(&mut pieces.as_slice()),
            Err(StreamError::Field("too many pieces"))
        ));
    }

    #[test]
    fn hostile_fields_are_refused_without_allocating_their_lengths() {
        let mut bytes = encoded(&sample()[..1]);
        // The first session's length (after the head, path, count, id, pid, kind).
        let body = 8 + 4 + 4 + 4 + 1;
        let at = body + 4 + 8 + 4 + 1;
        bytes[at..at + 8].copy_from_slice(&(MAX_STATE).to_le_bytes());
        // Claims 16 TiB, has 17 bytes: refused as truncated, having read only what came.
        assert!(matches!(
            read_stream(&mut bytes.as_slice()),
            Err(StreamError::Length)
        ));
        bytes[at..at + 8].copy_from_slice(&(MAX_STATE + 1).to_le_bytes());
        assert!(matches!(
            read_stream(&mut bytes.as_slice()),
            Err(StreamError::Field(_))
        ));
        let mut bad_kind = encoded(&sample()[..1]);
        bad_kind[at - 1] = 9;
        read_stream(&mut bad_kind.as_slice()).unwrap_err();
        let mut twice = sample();
        twice[1].id = 7;
        assert!(matches!(
            read_stream(&mut encoded(&twice).as_slice()),
            Err(StreamError::Field("a session id twice"))
        ));
        let mut many = encoded(&[]);
        many[body..body + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        read_stream(&mut many.as_slice()).unwrap_err();
        let mut magic = encoded(&[]);
        magic[0] = b'X';
        assert!(matches!(
            read_stream(&mut magic.as_slice()),
            Err(StreamError::Magic)
        ));
        // A writer never mixes a kind with the other path.
        let mut out = Vec::new();
        write_body(&mut out, PATH_HANDOVER, &sample()).unwrap_err();
    }
}

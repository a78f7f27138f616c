//! The state of a VM's sessions as it travels in a live migration: the back-end state that QEMU
//! carries in its migration stream (`VHOST_USER_PROTOCOL_F_DEVICE_STATE`, see `vhu_cuda.rs`).
//!
//! On the source, every session's thread answers what its GPU side is (no worker, a failed
//! worker, or its worker's saved state: `GpuState::save`, the `QCUDAGS1` format of
//! `cuda/saved_state.rs`); on the destination a session thread is started for each, and a
//! worker restored from the saved state, under the same session id, so the guest's open files
//! of `/dev/qcuda` go on as they were.
//!
//! Layout (little-endian): the 8-byte magic `QCUDAMS1`, the version (u32), the number of
//! sessions (u32); then per session its id (u64), the guest pid (u32), what it holds (u8:
//! [`KIND_NONE`], [`KIND_FAILED`], [`KIND_STATE`]), the length of the saved state (u64, 0
//! unless `KIND_STATE`) and the saved state; nothing after the last session.
//!
//! A saved state is never held in the daemon's memory: it is a [`StateFile`] (a memfd) that the
//! source's worker filled, copied into the stream by the kernel, and on the destination copied
//! from the stream into a new file, which its worker maps.
//!
//! The stream comes from another host and QEMU relays it unchecked: [`read_stream`] trusts
//! nothing. Every count is bounded, a length is never allocated before its bytes have arrived
//! (the file grows with what came), ids must be distinct, and trailing bytes are refused. The saved states
//! themselves are decoded by the worker with the checked decoder of `saved_state.rs`. Both
//! decoders are fuzzed (`fuzz/fuzz_targets/migration_stream.rs`, `saved_state.rs`).

use std::io::{self, Read, Write};

use thiserror::Error;

use super::limits::MAX_SESSIONS;
use crate::worker::StateFile;

/// The first bytes of every stream.
pub const MAGIC: [u8; 8] = *b"QCUDAMS1";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;
/// A session without a worker (it has used no GPU op yet, or was reset).
pub const KIND_NONE: u8 = 0;
/// A session whose worker failed: its GPU ops fail until `DeviceReset`, on the destination too.
pub const KIND_FAILED: u8 = 1;
/// A session with a worker: its saved state follows.
pub const KIND_STATE: u8 = 2;
/// Longest saved state one session may send: far above any GPU's memory, far below what would
/// overflow anything.
pub const MAX_STATE: u64 = 1 << 44;

/// What a session holds on the GPU side, as it migrates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SavedGpu {
    /// No worker.
    None,
    /// A failed worker.
    Failed,
    /// A worker's saved state (`QCUDAGS1`), in the file it travels in.
    State(StateFile),
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

/// Why a stream is refused.
#[derive(Debug, Error)]
pub enum StreamError {
    /// Not a migration stream of qcuda.
    #[error("not a qcuda migration stream (bad magic)")]
    Magic,
    /// Written by another version.
    #[error("migration stream version {0}, this build reads {VERSION}")]
    Version(u32),
    /// A count, kind, length or id no source writes.
    #[error("bad migration stream: {0}")]
    Field(&'static str),
    /// The stream ended early, or has bytes after its end.
    #[error("migration stream truncated or with trailing bytes")]
    Length,
    /// Reading or writing the stream failed.
    #[error("migration stream: {0}")]
    Io(#[from] io::Error),
}

/// Writes `sessions` as a stream.
pub fn write_stream(out: &mut impl Write, sessions: &[SessionState]) -> Result<(), StreamError> {
    let n = u32::try_from(sessions.len())
        .ok()
        .filter(|&n| n as usize <= MAX_SESSIONS)
        .ok_or(StreamError::Field("too many sessions"))?;
    out.write_all(&MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&n.to_le_bytes())?;
    for s in sessions {
        let (kind, state) = match &s.gpu {
            SavedGpu::None => (KIND_NONE, None),
            SavedGpu::Failed => (KIND_FAILED, None),
            SavedGpu::State(f) => (KIND_STATE, Some(f)),
        };
        out.write_all(&s.id.to_le_bytes())?;
        out.write_all(&s.pid.to_le_bytes())?;
        out.write_all(&[kind])?;
        out.write_all(&state.map_or(0, StateFile::len).to_le_bytes())?;
        if let Some(f) = state {
            f.write_to(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

fn read_array<const N: usize>(input: &mut impl Read) -> Result<[u8; N], StreamError> {
    let mut b = [0u8; N];
    input.read_exact(&mut b).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => StreamError::Length,
        _ => StreamError::Io(e),
    })?;
    Ok(b)
}

/// Reads a whole stream (to its end: bytes after the last session are refused).
pub fn read_stream(input: &mut impl Read) -> Result<Vec<SessionState>, StreamError> {
    if read_array::<8>(input)? != MAGIC {
        return Err(StreamError::Magic);
    }
    let version = u32::from_le_bytes(read_array(input)?);
    if version != VERSION {
        return Err(StreamError::Version(version));
    }
    let n = u32::from_le_bytes(read_array(input)?) as usize;
    if n > MAX_SESSIONS {
        return Err(StreamError::Field("too many sessions"));
    }
    let mut sessions: Vec<SessionState> = Vec::new();
    for _ in 0..n {
        let id = u64::from_le_bytes(read_array(input)?);
        let pid = u32::from_le_bytes(read_array(input)?);
        let [kind] = read_array::<1>(input)?;
        let len = u64::from_le_bytes(read_array(input)?);
        if sessions.iter().any(|s| s.id == id) {
            return Err(StreamError::Field("a session id twice"));
        }
        let gpu = match (kind, len) {
            (KIND_NONE, 0) => SavedGpu::None,
            (KIND_FAILED, 0) => SavedGpu::Failed,
            (KIND_STATE, 1..=MAX_STATE) => match StateFile::read_from(input, len) {
                Ok(f) => SavedGpu::State(f),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(StreamError::Length)
                }
                Err(e) => return Err(StreamError::Io(e)),
            },
            (KIND_NONE | KIND_FAILED | KIND_STATE, _) => {
                return Err(StreamError::Field("a saved state's length"))
            }
            _ => return Err(StreamError::Field("a session's kind")),
        };
        sessions.push(SessionState { id, pid, gpu });
    }
    let mut rest = [0u8; 1];
    if input.read(&mut rest)? != 0 {
        return Err(StreamError::Length);
    }
    Ok(sessions)
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

    #[test]
    fn streams_round_trip() {
        for sessions in [sample(), Vec::new()] {
            let bytes = encoded(&sessions);
            assert_eq!(read_stream(&mut bytes.as_slice()).unwrap(), sessions);
        }
    }

    #[test]
    fn every_truncation_and_trailing_byte_is_refused() {
        let bytes = encoded(&sample());
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

    #[test]
    fn hostile_fields_are_refused_without_allocating_their_lengths() {
        let mut bytes = encoded(&sample()[..1]);
        // The first session's length (after magic, version, count, id, pid, kind).
        let at = 8 + 4 + 4 + 8 + 4 + 1;
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
        many[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        read_stream(&mut many.as_slice()).unwrap_err();
        let mut magic = encoded(&[]);
        magic[0] = b'X';
        assert!(matches!(
            read_stream(&mut magic.as_slice()),
            Err(StreamError::Magic)
        ));
    }
}

//! Pre-copy of device memory while the VM runs: the rounds a migration's source sends through
//! QEMU's stream before the last stop, and the stores its destination keeps them in.
//!
//! QEMU's `vhost-user-cuda` device (qemu-patches/0006) asks for a round with a state transfer
//! (`SET_DEVICE_STATE_FD`, direction save) while the device's rings still run; the daemon
//! answers with one round: every session's worker writes a chunk log of the device memory
//! that changed since it last sent it (`cuda/precopy.rs`, at most the round's budget), and
//! this module frames them. QEMU reads the round's first 16 bytes (the magic and `pending`,
//! the bytes the daemon still has to pre-copy, for QEMU's convergence decision) and relays
//! the whole round; QEMU's `max-bandwidth` paces the rounds. On the destination QEMU writes
//! each round into a state transfer of direction load, before the final state: the daemon
//! checks each log's framing and appends it to its session's [`Stores`]; the final state's
//! restore hands each session its store, from which the worker takes every chunk the last
//! stop did not send again.
//!
//! Layout (little-endian): the 8-byte magic [`MAGIC`], `pending` (u64), the version (u32,
//! [`VERSION`]), the number of sessions (u32), then per session its id (u64), the length of
//! its chunk log (u64) and the log. A log is chunk records, each a head of
//! [`RECORD_HEAD`] bytes (device u32, the allocation's base u64, the offset into it u64, the
//! length u64, the hash 16 bytes) and `length` bytes.
//!
//! The stream comes from another host through QEMU unchecked: the reader trusts nothing. A
//! log's records are checked one by one as they arrive (their lengths bounded by
//! [`CHUNK_MAX`], offsets on [`CHUNK`]); no length is allocated before its bytes arrived (a
//! store grows with what came); the stores of one VM together are bounded; ids are distinct
//! within a round. A record's contents and hash are the guest's own memory: they are checked
//! by the restoring worker, which refuses a store that does not hold what the last stop names.

use std::{
    collections::HashMap,
    fs::File,
    io::{self, Read, Write},
    os::unix::fs::FileExt,
};

use thiserror::Error;

use super::limits::MAX_SESSIONS;
use crate::worker::StateFile;

/// The first bytes of every round.
pub const MAGIC: [u8; 8] = *b"QCUDAPC1";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;
/// Device memory is pre-copied in chunks of this size (the last of an allocation may be
/// shorter).
pub const CHUNK: u64 = 2 << 20;
/// Longest chunk a record may hold.
pub const CHUNK_MAX: u64 = CHUNK;
/// Bytes of a chunk record's head.
pub const RECORD_HEAD: usize = 4 + 8 + 8 + 8 + 16;

/// Why a round was refused.
#[derive(Debug, Error)]
pub enum RoundError {
    /// Not a round (or not of this version).
    #[error("not a qcuda pre-copy round of version {VERSION}")]
    Magic,
    /// A count, id, offset or length no source writes.
    #[error("bad pre-copy round: {0}")]
    Field(&'static str),
    /// The stores would outgrow their bound.
    #[error("pre-copy stores would hold more than {0} bytes")]
    TooLarge(u64),
    /// The round ended early, or has bytes after its end.
    #[error("pre-copy round truncated or with trailing bytes")]
    Length,
    /// Reading the round or writing a store failed.
    #[error("pre-copy round: {0}")]
    Io(#[from] io::Error),
}

fn read_array<const N: usize>(input: &mut impl Read) -> Result<[u8; N], RoundError> {
    let mut b = [0u8; N];
    input.read_exact(&mut b).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => RoundError::Length,
        _ => RoundError::Io(e),
    })?;
    Ok(b)
}

/// What one session's worker wrote for a round: its chunk log, and its figures.
#[derive(Debug)]
pub struct SessionRound {
    /// The session.
    pub id: u64,
    /// Its chunk log.
    pub log: StateFile,
    /// Chunks in the log.
    pub chunks: u64,
    /// Bytes of device memory the session still has to pre-copy after this round.
    pub pending: u64,
}

/// Writes a round: the head with `pending`, then each session's log.
pub fn write_round(
    out: &mut impl Write,
    pending: u64,
    sessions: &[SessionRound],
) -> io::Result<()> {
    let n = u32::try_from(sessions.len()).map_err(io::Error::other)?;
    out.write_all(&MAGIC)?;
    out.write_all(&pending.to_le_bytes())?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&n.to_le_bytes())?;
    for s in sessions {
        out.write_all(&s.id.to_le_bytes())?;
        out.write_all(&s.log.len().to_le_bytes())?;
        s.log.write_to(out)?;
    }
    out.flush()
}

/// A destination's pre-copied device memory: one chunk log per session, in an anonymous file
/// that grows as rounds arrive, the VM's stores together bounded.
#[derive(Debug)]
pub struct Stores {
    logs: HashMap<u64, StoreLog>,
    bytes: u64,
    limit: u64,
}

#[derive(Debug)]
struct StoreLog {
    file: File,
    len: u64,
}

/// What a round brought.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RoundSummary {
    /// The source's `pending` after it.
    pub pending: u64,
    /// Sessions in it.
    pub sessions: u32,
    /// Chunk records in it.
    pub chunks: u64,
    /// Bytes of chunk contents in it.
    pub bytes: u64,
}

impl Stores {
    /// Empty stores that may hold `limit` bytes in all.
    pub fn new(limit: u64) -> Self {
        Self {
            logs: HashMap::new(),
            bytes: 0,
            limit,
        }
    }

    /// Bytes held, heads included.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether nothing was pre-copied.
    pub fn is_empty(&self) -> bool {
        self.logs.is_empty()
    }

    /// Reads one round from `input`, whose magic was read already, to its end, appending each
    /// session's log to its store. On an error the stores may hold part of the round: the
    /// caller fails the migration and drops them.
    pub fn read_round(&mut self, input: &mut impl Read) -> Result<RoundSummary, RoundError> {
        let pending = u64::from_le_bytes(read_array(input)?);
        if u32::from_le_bytes(read_array(input)?) != VERSION {
            return Err(RoundError::Magic);
        }
        let sessions = u32::from_le_bytes(read_array(input)?);
        if sessions as usize > MAX_SESSIONS {
            return Err(RoundError::Field("more sessions than a VM may have"));
        }
        let mut summary = RoundSummary {
            pending,
            sessions,
            ..RoundSummary::default()
        };
        let mut seen = Vec::with_capacity(sessions as usize);
        for _ in 0..sessions {
            let id = u64::from_le_bytes(read_array(input)?);
            if seen.contains(&id) {
                return Err(RoundError::Field("a session twice in one round"));
            }
            seen.push(id);
            let len = u64::from_le_bytes(read_array(input)?);
            let (chunks, bytes) = self.append(id, &mut input.by_ref().take(len), len)?;
            summary.chunks += chunks;
            summary.bytes += bytes;
        }
        let mut extra = [0u8; 1];
        if input.read(&mut extra)? != 0 {
            return Err(RoundError::Length);
        }
        Ok(summary)
    }

    /// Appends exactly `len` bytes of a chunk log from `input` to session `id`'s store,
    /// checking each record as it arrives. Chunks and content bytes appended.
    fn append(
        &mut self,
        id: u64,
        input: &mut impl Read,
        len: u64,
    ) -> Result<(u64, u64), RoundError> {
        if !self.logs.contains_key(&id) {
            let f = StateFile::create(c"qcuda-precopy-store")?;
            let file = f.file().try_clone()?;
            self.logs.insert(id, StoreLog { file, len: 0 });
        }
        let mut left = len;
        let (mut chunks, mut bytes) = (0u64, 0u64);
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            if left < RECORD_HEAD as u64 {
                return Err(RoundError::Field("a chunk log that ends inside a record"));
            }
            let head: [u8; RECORD_HEAD] = read_array(input)?;
            let rec = record_len(&head)?;
            left -= RECORD_HEAD as u64;
            if rec > left {
                return Err(RoundError::Field("a chunk log that ends inside a record"));
            }
            let grow = RECORD_HEAD as u64 + rec;
            if self.bytes.saturating_add(grow) > self.limit {
                return Err(RoundError::TooLarge(self.limit));
            }
            let log = self
                .logs
                .get_mut(&id)
                .ok_or(RoundError::Field("a session"))?;
            log.file.write_all_at(&head, log.len)?;
            let mut at = log.len + RECORD_HEAD as u64;
            let mut n = rec;
            while n > 0 {
                let k = usize::try_from(n.min(buf.len() as u64)).unwrap_or(buf.len());
                input
                    .read_exact(&mut buf[..k])
                    .map_err(|e| match e.kind() {
                        io::ErrorKind::UnexpectedEof => RoundError::Length,
                        _ => RoundError::Io(e),
                    })?;
                log.file.write_all_at(&buf[..k], at)?;
                at += k as u64;
                n -= k as u64;
            }
            log.len = at;
            self.bytes += grow;
            left -= rec;
            chunks += 1;
            bytes += rec;
        }
        Ok((chunks, bytes))
    }

    /// Takes session `id`'s store (a restore hands it to the session's worker).
    pub fn take(&mut self, id: u64) -> io::Result<Option<StateFile>> {
        match self.logs.remove(&id) {
            Some(log) => {
                self.bytes -= log.len;
                StateFile::filled(log.file, log.len).map(Some)
            }
            None => Ok(None),
        }
    }
}

/// A record head's contents length, checked: 1 to [`CHUNK_MAX`] bytes, at an offset that is
/// a multiple of [`CHUNK`], within the address space.
fn record_len(head: &[u8; RECORD_HEAD]) -> Result<u64, RoundError> {
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let (alloc, offset, len) = (word(4), word(12), word(20));
    if len == 0 || len > CHUNK_MAX {
        return Err(RoundError::Field("a chunk's length"));
    }
    if offset % CHUNK != 0 {
        return Err(RoundError::Field("a chunk's offset"));
    }
    if alloc
        .checked_add(offset)
        .and_then(|a| a.checked_add(len))
        .is_none()
    {
        return Err(RoundError::Field("a chunk beyond the address space"));
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dev: u32, alloc: u64, offset: u64, bytes: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&dev.to_le_bytes());
        r.extend_from_slice(&alloc.to_le_bytes());
        r.extend_from_slice(&offset.to_le_bytes());
        r.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        r.extend_from_slice(&[0xab; 16]);
        r.extend_from_slice(bytes);
        r
    }

    fn round(pending: u64, logs: &[(u64, Vec<u8>)]) -> Vec<u8> {
        let sessions: Vec<SessionRound> = logs
            .iter()
            .map(|(id, log)| SessionRound {
                id: *id,
                log: StateFile::from_bytes(log).unwrap(),
                chunks: 0,
                pending: 0,
            })
            .collect();
        let mut out = Vec::new();
        write_round(&mut out, pending, &sessions).unwrap();
        out
    }

    fn read(stores: &mut Stores, bytes: &[u8]) -> Result<RoundSummary, RoundError> {
        assert_eq!(bytes[..8], MAGIC);
        stores.read_round(&mut &bytes[8..])
    }

    #[test]
    fn rounds_append_to_each_sessions_store() {
        let a = record(0, 0x7000_0000_0000, 0, &[1; 100]);
        let b = record(0, 0x7000_0000_0000, CHUNK, &[2; 7]);
        let mut stores = Stores::new(1 << 30);
        let r = read(
            &mut stores,
            &round(4096, &[(5, a.clone()), (6, Vec::new())]),
        )
        .unwrap();
        assert_eq!(
            r,
            RoundSummary {
                pending: 4096,
                sessions: 2,
                chunks: 1,
                bytes: 100
            }
        );
        let r = read(&mut stores, &round(0, &[(5, b.clone())])).unwrap();
        assert_eq!((r.pending, r.chunks, r.bytes), (0, 1, 7));
        assert_eq!(stores.bytes(), (a.len() + b.len()) as u64);
        let five = stores.take(5).unwrap().unwrap();
        assert_eq!(five.to_vec().unwrap(), [a, b].concat());
        // A session that sent an empty log has an empty store; one never named has none.
        assert!(stores.take(6).unwrap().unwrap().is_empty());
        assert!(stores.take(7).unwrap().is_none());
        assert_eq!(stores.bytes(), 0);
    }

    #[test]
    fn hostile_rounds_are_refused() {
        let good = record(0, 0x7000_0000_0000, 0, &[1; 16]);
        let mut stores = Stores::new(1 << 30);
        // Every truncation of a round is an error, never a panic.
        let whole = round(1, &[(5, good.clone())]);
        for cut in 8..whole.len() {
            assert!(
                read(&mut Stores::new(1 << 30), &whole[..cut]).is_err(),
                "cut {cut}"
            );
        }
        // Trailing bytes.
        let mut long = whole.clone();
        long.push(0);
        assert!(matches!(read(&mut stores, &long), Err(RoundError::Length)));
        // Another version.
        let mut v = whole.clone();
        v[16] = 9;
        assert!(matches!(read(&mut stores, &v), Err(RoundError::Magic)));
        // Too many sessions, a session twice.
        let mut many = whole.clone();
        many[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read(&mut stores, &many).is_err());
        let twice = round(1, &[(5, good.clone()), (5, good.clone())]);
        assert!(read(&mut stores, &twice).is_err());
        // Records: empty, too long, off a chunk's start, past the address space, a log that
        // ends inside a record, a length that names more than came.
        for bad in [
            record(0, 0, 0, &[]),
            record(0, 0, 0, &vec![0; CHUNK_MAX as usize + 1]),
            record(0, 0, 4096, &[1]),
            record(0, u64::MAX - 4, 0, &[1; 8]),
            good[..good.len() - 1].to_vec(),
        ] {
            assert!(read(&mut stores, &round(1, &[(5, bad)])).is_err());
        }
        let mut lying = round(1, &[(5, good.clone())]);
        lying[32..40].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(read(&mut stores, &lying).is_err());
    }

    #[test]
    fn the_stores_are_bounded() {
        let rec = record(0, 0x7000_0000_0000, 0, &[3; 1000]);
        let mut stores = Stores::new(2 * rec.len() as u64);
        read(&mut stores, &round(0, &[(1, rec.clone())])).unwrap();
        read(&mut stores, &round(0, &[(2, rec.clone())])).unwrap();
        assert!(matches!(
            read(&mut stores, &round(0, &[(1, rec)])),
            Err(RoundError::TooLarge(_))
        ));
    }
}

//! Pre-copy of device memory while the VM runs: the rounds a migration's source sends through
//! QEMU's stream before the last stop, and the stores its destination keeps them in.
//!
//! QEMU's `vhost-user-cuda` device (qemu-patches/0006) asks for a round with a state transfer
//! (`SET_DEVICE_STATE_FD`, direction save) while the device's rings still run; the daemon
//! answers with one round: every session's worker writes a chunk log of the device memory
//! that changed since it last sent it (`cuda/precopy.rs`, at most the round's budget), and
//! this module frames them. QEMU reads the round's first 16 bytes (the magic and `pending`,
//! the bytes the daemon still has to pre-copy, for QEMU's convergence decision) and relays
//! the whole round, keeping it to QEMU's `max-bandwidth` as it goes. On the destination QEMU
//! writes each round into a state transfer of direction load, before the final state: the
//! daemon checks each log's framing and appends it to its session's [`Stores`]; the final
//! state's restore hands each session its store, from which the worker takes every chunk the
//! last stop did not send again.
//!
//! The layout and its checked reader are `cuda/precopy.rs`'s (the magic [`MAGIC`], `pending`,
//! the version, then per session its id and chunk log), one definition for the worker that
//! writes the logs, this module that frames them, and the fuzz target.
//!
//! The stream comes from another host through QEMU unchecked: the reader trusts nothing. A
//! round is copied into an anonymous file no longer than what the VM's stores may still take
//! (so a hostile length costs nothing), then checked whole (every record's key and length,
//! nothing after the last session) before any of it is appended; ids must be distinct within a
//! round. A record's contents and hash are the guest's own memory: they are checked
//! by the restoring worker, which refuses a store that does not hold what the last stop names.

use std::{
    collections::HashMap,
    fs::File,
    io::{self, Read, Write},
    os::unix::fs::FileExt,
};

use thiserror::Error;

use crate::{
    cuda::precopy::{self as codec, LogError},
    worker::{SealedMap, StateFile},
};

/// The first bytes of every round.
pub const MAGIC: [u8; 8] = codec::ROUND_MAGIC;
/// Device memory is pre-copied in chunks of this size (the last of an allocation may be
/// shorter).
pub const CHUNK: u64 = codec::CHUNK;

/// Why a round was refused.
#[derive(Debug, Error)]
pub enum RoundError {
    /// Not a round of this version, or its framing is broken (`cuda/precopy.rs` checks it).
    #[error("bad pre-copy round: {0}")]
    Format(#[from] LogError),
    /// A session twice in one round.
    #[error("bad pre-copy round: session {0} twice")]
    Twice(u64),
    /// The stores would outgrow their bound.
    #[error("pre-copy stores would hold more than {0} bytes")]
    TooLarge(u64),
    /// Reading the round or writing a store failed.
    #[error("pre-copy round: {0}")]
    Io(#[from] io::Error),
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

/// Writes a round: the head with `pending`, then each session's log (copied by the kernel
/// from the worker's file).
pub fn write_round(
    out: &mut impl Write,
    pending: u64,
    sessions: &[SessionRound],
) -> io::Result<()> {
    let n = u32::try_from(sessions.len()).map_err(io::Error::other)?;
    codec::write_round_head(out, pending, n)?;
    for s in sessions {
        codec::write_session_head(out, s.id, s.log.len())?;
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
    /// The files of stores taken: their pages are freed when the last descriptor closes,
    /// which for gigabytes takes a second or more, so the stores keep one of each until they
    /// are dropped themselves (off the downtime's path: [`Stores::release`]).
    taken: Vec<File>,
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
            taken: Vec::new(),
        }
    }

    /// Drops the stores on a thread of their own: freeing gigabytes of pre-copied chunks
    /// must not hold up the migration's last steps (QEMU waits for `CHECK_DEVICE_STATE`).
    pub fn release(self) {
        let spawned = std::thread::Builder::new()
            .name("qcuda-store-free".into())
            .spawn(move || drop(self));
        if let Err(e) = spawned {
            tracing::warn!("pre-copy stores freed in place: no thread for it ({e})");
        }
    }

    /// Bytes held, record heads included.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether nothing was pre-copied.
    pub fn is_empty(&self) -> bool {
        self.logs.is_empty()
    }

    /// Reads one round from `input`, whose magic was read already, to its end and appends each session's log to its store.
    /// The round goes into an anonymous file first (the kernel's copy, at most what the
    /// stores may still take, so a hostile length costs nothing), is sealed, mapped and
    /// checked whole by the format's reader; only then is anything appended, so a refused
    /// round leaves the stores as they were.
    pub fn read_round(&mut self, input: &mut impl Read) -> Result<RoundSummary, RoundError> {
        let room = self.limit.saturating_sub(self.bytes);
        let file = StateFile::create(c"qcuda-precopy-round")?;
        file.file().write_all_at(&MAGIC, 0)?;
        let got = {
            let mut out: &File = file.file();
            io::Seek::seek(&mut out, io::SeekFrom::Start(MAGIC.len() as u64))?;
            // The heads come on top of the contents: a round's is 24 bytes, a session's 16.
            let cap = room.saturating_add(codec::ROUND_HEAD_LEN as u64 + (1 << 20));
            io::copy(&mut input.by_ref().take(cap.saturating_add(1)), &mut out)?
        };
        let file = StateFile::filled(file.file().try_clone()?, MAGIC.len() as u64 + got)?;
        file.seal()?;
        let map = SealedMap::new(file.file())?;
        let round = codec::read_round(map.bytes())?;
        let mut summary = RoundSummary {
            pending: round.pending,
            sessions: u32::try_from(round.sessions.len()).unwrap_or(u32::MAX),
            ..RoundSummary::default()
        };
        let grow: u64 = round.sessions.iter().map(|(_, log)| log.len() as u64).sum();
        if self.bytes.saturating_add(grow) > self.limit {
            return Err(RoundError::TooLarge(self.limit));
        }
        let mut seen = Vec::with_capacity(round.sessions.len());
        for (id, _) in &round.sessions {
            if seen.contains(id) {
                return Err(RoundError::Twice(*id));
            }
            seen.push(*id);
        }
        for (id, log) in round.sessions {
            let n = codec::check_log(log)?;
            summary.chunks += n.chunks;
            summary.bytes += n.bytes;
            self.append(id, log)?;
        }
        Ok(summary)
    }

    fn append(&mut self, id: u64, log: &[u8]) -> io::Result<()> {
        let store = match self.logs.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let f = StateFile::create(c"qcuda-precopy-store")?;
                e.insert(StoreLog {
                    file: f.file().try_clone()?,
                    len: 0,
                })
            }
        };
        store.file.write_all_at(log, store.len)?;
        store.len += log.len() as u64;
        self.bytes += log.len() as u64;
        Ok(())
    }

    /// Takes session `id`'s store (a restore hands it to the session's worker).
    pub fn take(&mut self, id: u64) -> io::Result<Option<StateFile>> {
        match self.logs.remove(&id) {
            Some(log) => {
                self.bytes -= log.len;
                self.taken.push(log.file.try_clone()?);
                StateFile::filled(log.file, log.len).map(Some)
            }
            None => Ok(None),
        }
    }
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
        assert!(matches!(
            read(&mut stores, &long),
            Err(RoundError::Format(LogError::Trailing(_)))
        ));
        // Another version.
        let mut v = whole.clone();
        v[16] = 9;
        assert!(matches!(
            read(&mut stores, &v),
            Err(RoundError::Format(LogError::Version(9)))
        ));
        // Too many sessions, a session twice.
        let mut many = whole.clone();
        many[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        read(&mut stores, &many).unwrap_err();
        let twice = round(1, &[(5, good.clone()), (5, good.clone())]);
        read(&mut stores, &twice).unwrap_err();
        // Records: empty, too long, off a chunk's start, past the address space, a log that
        // ends inside a record, a length that names more than came.
        for bad in [
            record(0, 0, 0, &[]),
            record(0, 0, 0, &vec![0; (2 << 20) + 1]),
            record(0, 0, 4096, &[1]),
            record(0, u64::MAX - 4, 0, &[1; 8]),
            good[..good.len() - 1].to_vec(),
        ] {
            read(&mut stores, &round(1, &[(5, bad)])).unwrap_err();
        }
        let mut lying = round(1, &[(5, good.clone())]);
        lying[32..40].copy_from_slice(&(1u64 << 40).to_le_bytes());
        read(&mut stores, &lying).unwrap_err();
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

//! Device-memory pre-copy for live migration: the chunk hash, the chunk log, the rounds'
//! framing and what a source remembers of what it sent (docs: the pre-copy design,
//! `/work/runs/precopy-spec.md` section 2).
//!
//! While the VM runs, the source's worker copies its allocations in rounds
//! (`GpuState::precopy_round`, `gpu_state/precopy.rs`), each a **chunk log**: records of one
//! chunk each (an allocation's 2 MiB pieces, [`CHUNK`]) with the [`hash`] of its bytes. A pass
//! hashes every chunk on the GPU (the kernel of `precopy/precopy_hash.cu`, which computes
//! exactly [`hash`]) and sends those whose hash differs from what was sent; the final save
//! (`saved_state.rs`, record `TAG_ALLOCATION_CHUNKS`) then refers to the chunks that still
//! hash as sent instead of carrying their bytes. The destination's daemon checks each log's
//! framing ([`check_log`], [`read_round`]) and appends it to the session's store; the
//! restoring worker indexes the store ([`scan`]) and fills each reference from it.
//!
//! Everything here reads bytes from another host: every length is checked against what is
//! there, nothing is allocated before its bytes are known to be there, and no input panics
//! (the fuzz target `precopy_log`).

use std::{collections::HashMap, ffi::CStr, io};

use thiserror::Error;

/// Bytes of a chunk: chunk `i` of an allocation `(ptr, size)` is
/// `[ptr + i * CHUNK, ptr + i * CHUNK + min(CHUNK, size - i * CHUNK))`.
pub const CHUNK: u64 = 2 << 20;
/// The longest chunk a log may hold.
pub const CHUNK_MAX: u64 = CHUNK;
/// The first bytes of a round.
pub const ROUND_MAGIC: [u8; 8] = *b"QCUDAPC1";
/// The round format's version (the u32 after `pending`).
pub const ROUND_VERSION: u32 = 1;
/// Bytes of a round's head: magic, pending, version, sessions.
pub const ROUND_HEAD_LEN: usize = 8 + 8 + 4 + 4;
/// Bytes of a session's head in a round: id, log length.
pub const SESSION_HEAD_LEN: usize = 8 + 8;
/// Bytes of a chunk record before its bytes: dev, alloc, offset, len, hash.
pub const CHUNK_HEAD_LEN: usize = 4 + 8 + 8 + 8 + 16;

/// The kernel computing [`hash`] over a list of device ranges: `precopy_hash.cu` compiled by
/// nvcc 13.0 (`nvcc -ptx -arch=compute_90`; the test `the_kernel_is_its_source_compiled`
/// compiles it again when the toolchain is at hand).
pub(crate) const KERNEL_PTX: &str = include_str!("precopy/precopy_hash.ptx");
/// Its entry: `qcuda_precopy_hash(const u64 *ranges, unsigned count, u64 *out)`.
pub(crate) const KERNEL_NAME: &CStr = c"qcuda_precopy_hash";
/// Threads per block of its launches (a multiple of 32, as it needs).
pub(crate) const KERNEL_BLOCK: u32 = 256;
/// Most ranges one launch hashes (its grid's y; more go in further launches).
pub(crate) const KERNEL_MAX_RANGES: usize = 1 << 16;

// The hash's constants: the per-position keys K (odd, so i * K differs for every word index)
// and the length keys L of each lane. The same in precopy_hash.cu.
const K: [u64; 2] = [0x9e37_79b9_7f4a_7c15, 0xc2b2_ae3d_27d4_eb4f];
const L: [u64; 2] = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344];

/// Lane 0's mixer: splitmix64's finaliser (a bijection with full avalanche).
#[must_use]
pub const fn mix0(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Lane 1's mixer: MurmurHash3's fmix64, another bijection, independent of lane 0's.
#[must_use]
pub const fn mix1(mut z: u64) -> u64 {
    z = (z ^ (z >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    z = (z ^ (z >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    z ^ (z >> 33)
}

/// The chunk hash of `bytes` (the CPU reference; the kernel computes the same on the GPU).
///
/// Two 64-bit lanes, each the sum mod 2^64 over the 8-byte little-endian words `w[i]` of the
/// bytes (the last one zero-padded) of `mix(w[i] ^ i * K)`, plus `mix(len ^ L)`, with each
/// lane's own mixer and keys. A sum is order-independent, so the GPU adds the words' terms in
/// any order (threads, warps, blocks, atomics) and gets the same; the key makes each term
/// depend on the word's position, so moved or swapped words change the hash, and the length
/// term tells a zero-padded tail from zeros that are there.
///
/// Not cryptographic: the mixers are public bijections, and a sum of them can be made to
/// collide on purpose (a generalised birthday search). A guest could thus make a chunk it
/// changed hash as the one sent; the destination would then restore the old bytes of that
/// chunk, which is the guest corrupting its own migrated memory, nothing of anyone else's.
/// Changes that are not made to collide do so with a chance of about 2^-128.
#[must_use]
pub fn hash(bytes: &[u8]) -> [u64; 2] {
    let mut h = [
        mix0(bytes.len() as u64 ^ L[0]),
        mix1(bytes.len() as u64 ^ L[1]),
    ];
    let mut words = bytes.chunks_exact(8);
    let mut keys = [0u64; 2];
    for w in words.by_ref() {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        add_word(&mut h, u64::from_le_bytes(b), keys);
        keys = [keys[0].wrapping_add(K[0]), keys[1].wrapping_add(K[1])];
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut b = [0u8; 8];
        b[..tail.len()].copy_from_slice(tail);
        add_word(&mut h, u64::from_le_bytes(b), keys);
    }
    h
}

/// Adds word `x`'s terms, its position's keys being `keys` (`i * K`).
fn add_word(h: &mut [u64; 2], x: u64, keys: [u64; 2]) {
    h[0] = h[0].wrapping_add(mix0(x ^ keys[0]));
    h[1] = h[1].wrapping_add(mix1(x ^ keys[1]));
}

/// The chunks of an allocation of `size` bytes: (offset, length) of each, in order.
pub fn chunks_of(size: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..size.div_ceil(CHUNK)).map(move |i| {
        let offset = i * CHUNK;
        (offset, CHUNK.min(size - offset))
    })
}

/// Which chunk a record holds: device (guest ordinal), the allocation's base address, the
/// chunk's offset in it and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    pub dev: u32,
    pub alloc: u64,
    pub offset: u64,
    pub len: u64,
}

impl ChunkKey {
    /// Its device address.
    pub fn addr(&self) -> u64 {
        self.alloc.wrapping_add(self.offset)
    }

    /// Whether it is a chunk as [`chunks_of`] cuts them: a length of 1..=[`CHUNK_MAX`], at a
    /// multiple of [`CHUNK`], inside the address space.
    pub fn is_well_formed(&self) -> bool {
        (1..=CHUNK_MAX).contains(&self.len)
            && self.offset.is_multiple_of(CHUNK)
            && self
                .alloc
                .checked_add(self.offset)
                .and_then(|a| a.checked_add(self.len))
                .is_some()
    }
}

/// Why bytes are not a chunk log or a round.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
pub enum LogError {
    /// A record, head or log ends past the bytes.
    #[error("pre-copy log truncated at offset {0}")]
    Truncated(usize),
    /// A chunk of length 0 or over CHUNK_MAX, off a CHUNK boundary, or past the address space.
    #[error("bad pre-copy chunk at offset {0}")]
    Chunk(usize),
    /// A round that does not begin with `QCUDAPC1`.
    #[error("not a pre-copy round (bad magic)")]
    Magic,
    /// A round of another format version.
    #[error("pre-copy round version {0}, this build reads {ROUND_VERSION}")]
    Version(u32),
    /// Bytes after a round's last session.
    #[error("trailing bytes after the pre-copy round at offset {0}")]
    Trailing(usize),
}

/// What a log holds: chunk records and their bytes of chunk data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkCount {
    pub chunks: u64,
    pub bytes: u64,
}

/// Writes one chunk record: `hash` must be [`hash`]`(bytes)` (the caller has it already:
/// a round hashes the copy it sends). Refuses a chunk a reader would refuse.
pub fn write_chunk(
    out: &mut (impl io::Write + ?Sized),
    dev: u32,
    alloc: u64,
    offset: u64,
    bytes: &[u8],
    hash: [u64; 2],
) -> io::Result<()> {
    let key = ChunkKey {
        dev,
        alloc,
        offset,
        len: bytes.len() as u64,
    };
    if !key.is_well_formed() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a pre-copy chunk",
        ));
    }
    let mut head = [0u8; CHUNK_HEAD_LEN];
    head[..4].copy_from_slice(&dev.to_le_bytes());
    head[4..12].copy_from_slice(&alloc.to_le_bytes());
    head[12..20].copy_from_slice(&offset.to_le_bytes());
    head[20..28].copy_from_slice(&key.len.to_le_bytes());
    head[28..36].copy_from_slice(&hash[0].to_le_bytes());
    head[36..44].copy_from_slice(&hash[1].to_le_bytes());
    out.write_all(&head)?;
    out.write_all(bytes)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The records of a log, each checked as it is read: key, hash and bytes.
struct Records<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(ChunkKey, [u64; 2], &'a [u8]), LogError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.bytes.get(self.at..).filter(|r| !r.is_empty())?;
        let at = self.at;
        // Stops the iteration after an error.
        self.at = self.bytes.len();
        if rest.len() < CHUNK_HEAD_LEN {
            return Some(Err(LogError::Truncated(at)));
        }
        let key = ChunkKey {
            dev: u32_at(rest, 0),
            alloc: u64_at(rest, 4),
            offset: u64_at(rest, 12),
            len: u64_at(rest, 20),
        };
        if !key.is_well_formed() {
            return Some(Err(LogError::Chunk(at)));
        }
        let hash = [u64_at(rest, 28), u64_at(rest, 36)];
        let Some(data) = usize::try_from(key.len)
            .ok()
            .and_then(|len| rest.get(CHUNK_HEAD_LEN..CHUNK_HEAD_LEN.checked_add(len)?))
        else {
            return Some(Err(LogError::Truncated(at)));
        };
        self.at = at + CHUNK_HEAD_LEN + data.len();
        Some(Ok((key, hash, data)))
    }
}

fn records(bytes: &[u8]) -> Records<'_> {
    Records { bytes, at: 0 }
}

/// Checks that `bytes` are a chunk log (framing only: the hashes are not computed), cheaply,
/// as the destination's daemon does before it appends them to a store.
pub fn check_log(bytes: &[u8]) -> Result<ChunkCount, LogError> {
    let mut n = ChunkCount::default();
    for r in records(bytes) {
        let (key, _, _) = r?;
        n.chunks += 1;
        n.bytes += key.len;
    }
    Ok(n)
}

/// A store's chunks, each the last record of its key (a later record replaces an earlier one):
/// its hash and bytes, borrowed from the store.
#[derive(Debug, Default)]
pub struct ChunkIndex<'a> {
    chunks: HashMap<ChunkKey, ([u64; 2], &'a [u8])>,
}

impl<'a> ChunkIndex<'a> {
    /// The chunk of `key`, if the store has it: its hash and bytes.
    pub fn get(&self, key: &ChunkKey) -> Option<([u64; 2], &'a [u8])> {
        self.chunks.get(key).copied()
    }

    /// Distinct chunks.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// Indexes a store (chunk logs one after another: itself a chunk log), checking it as
/// [`check_log`] does. The index holds one entry per distinct chunk, each pointing into
/// `bytes`.
pub fn scan(bytes: &[u8]) -> Result<ChunkIndex<'_>, LogError> {
    let mut chunks = HashMap::new();
    for r in records(bytes) {
        let (key, hash, data) = r?;
        chunks.insert(key, (hash, data));
    }
    Ok(ChunkIndex { chunks })
}

/// Writes a round's head: the magic, `pending` (bytes still to pre-copy after this round), the
/// version and the number of sessions whose logs follow ([`write_session_head`] and the log
/// bytes, each).
pub fn write_round_head(
    out: &mut (impl io::Write + ?Sized),
    pending: u64,
    sessions: u32,
) -> io::Result<()> {
    out.write_all(&ROUND_MAGIC)?;
    out.write_all(&pending.to_le_bytes())?;
    out.write_all(&ROUND_VERSION.to_le_bytes())?;
    out.write_all(&sessions.to_le_bytes())
}

/// Writes the head of session `id`'s log of `log_len` bytes in a round (the log follows).
pub fn write_session_head(
    out: &mut (impl io::Write + ?Sized),
    id: u64,
    log_len: u64,
) -> io::Result<()> {
    out.write_all(&id.to_le_bytes())?;
    out.write_all(&log_len.to_le_bytes())
}

/// A round as read: `pending`, and each session's id and log (checked by [`check_log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round<'a> {
    pub pending: u64,
    pub sessions: Vec<(u64, &'a [u8])>,
}

/// Reads a whole round (from another host): the head, then every session's log, each one's
/// framing checked; nothing may follow the last.
pub fn read_round(bytes: &[u8]) -> Result<Round<'_>, LogError> {
    if bytes.get(..8).is_some_and(|m| m != ROUND_MAGIC) {
        return Err(LogError::Magic);
    }
    if bytes.len() < ROUND_HEAD_LEN {
        return Err(LogError::Truncated(bytes.len()));
    }
    let pending = u64_at(bytes, 8);
    let version = u32_at(bytes, 16);
    if version != ROUND_VERSION {
        return Err(LogError::Version(version));
    }
    let count = u32_at(bytes, 20) as usize;
    let mut at = ROUND_HEAD_LEN;
    // Each session takes at least its head: a count past that is refused before allocating.
    if count > (bytes.len() - at) / SESSION_HEAD_LEN {
        return Err(LogError::Truncated(bytes.len()));
    }
    let mut sessions = Vec::with_capacity(count);
    for _ in 0..count {
        let head = bytes
            .get(at..at + SESSION_HEAD_LEN)
            .ok_or(LogError::Truncated(at))?;
        let (id, len) = (u64_at(head, 0), u64_at(head, 8));
        let start = at + SESSION_HEAD_LEN;
        let log = usize::try_from(len)
            .ok()
            .and_then(|len| bytes.get(start..start.checked_add(len)?))
            .ok_or(LogError::Truncated(at))?;
        check_log(log).map_err(|e| match e {
            LogError::Truncated(o) => LogError::Truncated(start + o),
            LogError::Chunk(o) => LogError::Chunk(start + o),
            e => e,
        })?;
        sessions.push((id, log));
        at = start + log.len();
    }
    if at != bytes.len() {
        return Err(LogError::Trailing(at));
    }
    Ok(Round { pending, sessions })
}

/// What one round did: chunks and bytes of chunk data it sent, the bytes still to pre-copy
/// after it (0: nothing more; no more rounds are needed), and the pass it belongs to (1 is
/// the first; 0: none was made).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundFigures {
    pub chunks: u64,
    pub bytes: u64,
    pub pending: u64,
    pub pass: u32,
}

/// What a source remembers between rounds (`GpuState::precopy_round`): the hash of what it
/// last sent of each chunk, the current pass's chunks still to send, and the passes made.
#[derive(Debug, Default)]
pub(crate) struct Tracking {
    /// The hash of the bytes last sent of each chunk.
    pub(crate) sent: HashMap<ChunkKey, [u64; 2]>,
    /// The current pass's dirty chunks not sent yet, in the order to send them.
    pub(crate) dirty: std::collections::VecDeque<ChunkKey>,
    /// Passes started.
    pub(crate) passes: u32,
    /// No pass is to start again: the last one found nothing to send, or `max_passes` passes
    /// were made.
    pub(crate) finished: bool,
}

impl Tracking {
    /// Bytes of the dirty chunks still to send.
    pub(crate) fn pending(&self) -> u64 {
        self.dirty.iter().map(|k| k.len).sum()
    }

    /// Starts a pass over `current`, every live chunk and its hash now: what was sent of chunks
    /// no longer live is forgotten, and the chunks whose hash is not what was sent become the
    /// dirty list. Returns whether any is dirty.
    pub(crate) fn start_pass(&mut self, current: &[(ChunkKey, [u64; 2])]) -> bool {
        self.passes += 1;
        let live: std::collections::HashSet<ChunkKey> = current.iter().map(|(k, _)| *k).collect();
        self.sent.retain(|k, _| live.contains(k));
        self.dirty = current
            .iter()
            .filter(|(k, h)| self.sent.get(k) != Some(h))
            .map(|(k, _)| *k)
            .collect();
        !self.dirty.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte j of test buffer n, as precopy_mixer_check.cu makes them.
    fn buffer(n: u64, len: u64) -> Vec<u8> {
        (0..len)
            .map(|j| ((j * 131 + n * 7 + 1) & 0xff) as u8)
            .collect()
    }

    const CHECK_INPUTS: [u64; 8] = [
        0,
        1,
        2,
        0x8000_0000_0000_0000,
        u64::MAX,
        0x0123_4567_89ab_cdef,
        K[0],
        L[1],
    ];
    const CHECK_LENGTHS: [u64; 7] = [0, 1, 7, 8, 9, 4096, (2 << 20) - 3];

    /// What precopy_mixer_check.cu prints, computed here.
    fn mixer_check_output() -> String {
        let mut s = String::new();
        for x in CHECK_INPUTS {
            s += &format!("{:016x} {:016x}\n", mix0(x), mix1(x));
        }
        for (n, len) in CHECK_LENGTHS.into_iter().enumerate() {
            let [a, b] = hash(&buffer(n as u64, len));
            s += &format!("{a:016x} {b:016x}\n");
        }
        s
    }

    /// Output of precopy_mixer_check.cu built by nvcc 13.0 and run (the check the test below
    /// repeats when the toolchain is at hand).
    const MIXER_CHECK_NVCC: &str = "\
0000000000000000 0000000000000000
5692161d100b05e5 b456bcfc34c2cb2c
dbd238973a2b148a 3abf2a20650683e7
25c26ea579cea98a 8f780810af31a493
b4d055fcf2cbbd7b 64b5720b4b825f21
b2c058e4ebb5112c 87cbfbfe89022cea
e220a8397b1dcdaf 9ca066f1a4ab2eea
dfc7a99951f24649 72dee428a469f6fd
e9e0033e3badaf36 72dee428a469f6fd
576f96efca87eaa8 04661d131fc690e7
4a1dde07cacc5a47 ac6328e47c58b481
117afa8fda22420f 041b07395b40226d
c21a06c059595e28 60bc158d521c58bc
59477bc80d77e29f 93923a84c50d9275
cc6db9b9410dd961 ea322112152da5b5
";

    #[test]
    fn the_reference_computes_what_nvcc_compiles_of_the_kernels_mixers() {
        assert_eq!(mixer_check_output(), MIXER_CHECK_NVCC);
    }

    /// The CUDA toolchain's root (`scripts/cuda-toolchain.sh`), if it is installed already.
    fn toolchain() -> Option<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(
                "source scripts/lib.sh && ls -d \"$QCUDA_CACHE\"/cuda-venv-*/lib/python3*/\
                 site-packages/nvidia/cu13 2>/dev/null | head -n1",
            )
            .current_dir(&root)
            .output()
            .ok()?;
        let dir = String::from_utf8(out.stdout).ok()?;
        let dir = std::path::PathBuf::from(dir.trim());
        dir.join("bin/nvcc").is_file().then_some(dir)
    }

    /// With the toolchain at hand: the checked-in PTX is its source compiled, ptxas takes it
    /// for sm_90, and the mixers built into a host program by nvcc print what the reference
    /// computes. Without it: skipped (the constants above keep the last run's result).
    #[test]
    fn the_kernel_is_its_source_compiled() {
        let Some(root) = toolchain() else {
            eprintln!("skipped: no CUDA toolchain (scripts/cuda-toolchain.sh)");
            return;
        };
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda/precopy");
        let tmp = std::env::temp_dir().join(format!("qcuda-precopy-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let ptx = tmp.join("precopy_hash.ptx");
        let run = |cmd: &mut std::process::Command| {
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{cmd:?}: {out:?}");
            out.stdout
        };
        run(std::process::Command::new(root.join("bin/nvcc"))
            .args(["-ptx", "-arch=compute_90", "-o"])
            .arg(&ptx)
            .arg("precopy_hash.cu")
            .current_dir(&src));
        assert_eq!(std::fs::read_to_string(&ptx).unwrap(), KERNEL_PTX);
        run(std::process::Command::new(root.join("bin/ptxas"))
            .args(["-arch=sm_90", "-o"])
            .arg(tmp.join("precopy_hash.cubin"))
            .arg(&ptx));
        let check = tmp.join("check");
        run(std::process::Command::new(root.join("bin/nvcc"))
            .arg(format!("-L{}", root.join("lib").display()))
            .arg("-o")
            .arg(&check)
            .arg("precopy_mixer_check.cu")
            .current_dir(&src));
        let printed = run(&mut std::process::Command::new(&check));
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(String::from_utf8(printed).unwrap(), mixer_check_output());
    }

    #[test]
    fn the_hash_sees_every_byte_its_position_and_the_length() {
        let base = buffer(3, 4099);
        let h = hash(&base);
        for i in [0, 1, 7, 8, 4000, 4098] {
            let mut b = base.clone();
            b[i] ^= 1;
            assert_ne!(hash(&b), h, "byte {i}");
        }
        // Two words swapped.
        let mut b = base.clone();
        let (x, y) = (b[0..8].to_vec(), b[8..16].to_vec());
        b[0..8].copy_from_slice(&y);
        b[8..16].copy_from_slice(&x);
        assert_ne!(hash(&b), h);
        // Zeros that are there are not the padding.
        assert_ne!(hash(&[1, 0, 0]), hash(&[1]));
        assert_ne!(hash(&[0; 8]), hash(&[]));
        assert_ne!(hash(&[0; 16]), hash(&[0; 8]));
        // The same bytes elsewhere hash the same (the hash is of bytes, not of addresses).
        assert_eq!(hash(&base[8..]), hash(&base.clone()[8..]));
        // The lanes are not one another.
        assert_ne!(h[0], h[1]);
    }

    #[test]
    fn the_hash_is_a_sum_in_any_order() {
        // What a GPU's threads do: each word's terms added in any order, then the length.
        let b = buffer(1, 1000);
        let mut words: Vec<(u64, u64)> = b
            .chunks(8)
            .enumerate()
            .map(|(i, w)| {
                let mut x = [0u8; 8];
                x[..w.len()].copy_from_slice(w);
                (i as u64, u64::from_le_bytes(x))
            })
            .collect();
        words.reverse();
        let mut h = [mix0(1000 ^ L[0]), mix1(1000 ^ L[1])];
        for (i, x) in words {
            add_word(&mut h, x, [i.wrapping_mul(K[0]), i.wrapping_mul(K[1])]);
        }
        assert_eq!(h, hash(&b));
    }

    #[test]
    fn chunks_cover_an_allocation() {
        assert_eq!(chunks_of(0).count(), 0);
        assert_eq!(chunks_of(1).collect::<Vec<_>>(), vec![(0, 1)]);
        assert_eq!(
            chunks_of(2 * CHUNK + 5).collect::<Vec<_>>(),
            vec![(0, CHUNK), (CHUNK, CHUNK), (2 * CHUNK, 5)]
        );
        assert_eq!(chunks_of(CHUNK).collect::<Vec<_>>(), vec![(0, CHUNK)]);
    }

    /// A log of three chunks, the last replacing the first.
    fn sample_log() -> Vec<u8> {
        let mut log = Vec::new();
        for (dev, offset, bytes) in [
            (0, 0, b"first".to_vec()),
            (1, CHUNK, vec![7; 100]),
            (0, 0, b"again".to_vec()),
        ] {
            write_chunk(
                &mut log,
                dev,
                0x6800_0000_0000,
                offset,
                &bytes,
                hash(&bytes),
            )
            .unwrap();
        }
        log
    }

    #[test]
    fn a_log_reads_back_and_later_records_replace_earlier_ones() {
        let log = sample_log();
        assert_eq!(
            check_log(&log),
            Ok(ChunkCount {
                chunks: 3,
                bytes: 110
            })
        );
        let index = scan(&log).unwrap();
        assert_eq!(index.len(), 2);
        let key = ChunkKey {
            dev: 0,
            alloc: 0x6800_0000_0000,
            offset: 0,
            len: 5,
        };
        assert_eq!(index.get(&key), Some((hash(b"again"), &b"again"[..])));
        assert_eq!(index.get(&ChunkKey { dev: 1, ..key }), None);
        assert_eq!(check_log(&[]), Ok(ChunkCount::default()));
        assert!(scan(&[]).unwrap().is_empty());
    }

    #[test]
    fn chunks_a_reader_refuses_are_not_written() {
        let mut out = Vec::new();
        write_chunk(&mut out, 0, 0, 0, &[], [0; 2]).unwrap_err();
        write_chunk(&mut out, 0, 0, 4096, &[1], [0; 2]).unwrap_err();
        write_chunk(&mut out, 0, 0, 0, &vec![0; (2 << 20) + 1], [0; 2]).unwrap_err();
        write_chunk(&mut out, 0, u64::MAX, 0, &[1], [0; 2]).unwrap_err();
        assert!(out.is_empty());
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_of_a_log_is_an_error_or_another_log() {
        let log = sample_log();
        // Cut at a record's end: a shorter log; anywhere else: an error.
        let ends = [CHUNK_HEAD_LEN + 5, 2 * CHUNK_HEAD_LEN + 105, log.len()];
        for n in 0..log.len() {
            let r = check_log(&log[..n]);
            if n == 0 || ends.contains(&n) {
                r.unwrap();
            } else {
                assert!(matches!(r, Err(LogError::Truncated(_))), "prefix of {n}");
            }
            assert_eq!(scan(&log[..n]).is_ok(), r.is_ok());
        }
        for i in 0..log.len() {
            for x in [0x01, 0x80, 0xff] {
                let mut b = log.clone();
                b[i] ^= x;
                let r = check_log(&b);
                assert_eq!(scan(&b).is_ok(), r.is_ok(), "byte {i} ^ {x:#x}");
            }
        }
        // Refused chunks.
        let mut b = log.clone();
        b[20..28].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(check_log(&b), Err(LogError::Chunk(0)));
        let mut b = log.clone();
        b[20..28].copy_from_slice(&(CHUNK_MAX + 1).to_le_bytes());
        assert_eq!(check_log(&b), Err(LogError::Chunk(0)));
        let mut b = log.clone();
        b[12..20].copy_from_slice(&8u64.to_le_bytes());
        assert_eq!(check_log(&b), Err(LogError::Chunk(0)));
        let mut b = log.clone();
        b[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(check_log(&b), Err(LogError::Chunk(0)));
        // A length that claims more than is there.
        let mut b = log.clone();
        b[20..28].copy_from_slice(&CHUNK_MAX.to_le_bytes());
        assert_eq!(check_log(&b), Err(LogError::Truncated(0)));
    }

    fn sample_round() -> Vec<u8> {
        let log = sample_log();
        let mut r = Vec::new();
        write_round_head(&mut r, 12345, 2).unwrap();
        write_session_head(&mut r, 7, log.len() as u64).unwrap();
        r.extend_from_slice(&log);
        write_session_head(&mut r, 9, 0).unwrap();
        r
    }

    #[test]
    fn a_round_reads_back_and_every_truncation_or_flip_is_refused_or_another_round() {
        let bytes = sample_round();
        let log = sample_log();
        assert_eq!(
            read_round(&bytes),
            Ok(Round {
                pending: 12345,
                sessions: vec![(7, &log[..]), (9, &[][..])],
            })
        );
        for n in 0..bytes.len() {
            assert!(read_round(&bytes[..n]).is_err(), "prefix of {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(read_round(&longer), Err(LogError::Trailing(bytes.len())));
        for i in 0..bytes.len() {
            for x in [0x01, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= x;
                if let Ok(r) = read_round(&b) {
                    for (_, log) in r.sessions {
                        check_log(log).unwrap();
                    }
                }
            }
        }
        let mut b = bytes.clone();
        b[0] = b'X';
        assert_eq!(read_round(&b), Err(LogError::Magic));
        let mut b = bytes.clone();
        b[16..20].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(read_round(&b), Err(LogError::Version(2)));
        // A session count no bytes could hold.
        let mut b = bytes.clone();
        b[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read_round(&b), Err(LogError::Truncated(_))));
    }

    #[test]
    fn a_pass_forgets_freed_chunks_and_lists_the_changed_ones() {
        let key = |offset| ChunkKey {
            dev: 0,
            alloc: 0x1000,
            offset,
            len: CHUNK,
        };
        let mut t = Tracking::default();
        assert!(t.start_pass(&[(key(0), [1, 1]), (key(CHUNK), [2, 2])]));
        assert_eq!(t.pending(), 2 * CHUNK);
        t.sent.insert(key(0), [1, 1]);
        t.sent.insert(key(CHUNK), [2, 2]);
        t.sent.insert(key(4 * CHUNK), [3, 3]);
        // Chunk 1 changed; chunk 4 was freed.
        assert!(t.start_pass(&[(key(0), [1, 1]), (key(CHUNK), [9, 9])]));
        assert_eq!(t.dirty, vec![key(CHUNK)]);
        assert!(!t.sent.contains_key(&key(4 * CHUNK)));
        assert_eq!(t.passes, 2);
    }
}

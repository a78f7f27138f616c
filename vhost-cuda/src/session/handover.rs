//! Same-host handover of device memory at a migration's stop: the rendezvous between the
//! source's daemon and a destination's daemon that share the GPU, so that the destination maps
//! the source's physical memory (exported as POSIX descriptors) instead of receiving its bytes.
//!
//! The migration stream is one-way and carries no descriptors, so the source offers and the
//! destination claims. The source opens a [`HandoverServer`]: a Unix socket of a random name in
//! its runtime directory (mode 0600, its directory the daemon's own), and puts an [`Offer`] at
//! the head of its state: the host's boot id, the UUIDs of the GPUs its sessions use, the
//! socket's path and a random 256-bit token. A destination whose host has the same boot id and
//! those GPUs ([`Offer::is_local`]) connects, presents the token ([`claim`]) and receives the
//! pieces of device memory (each a descriptor and three numbers the GPU side gives meaning:
//! device, address, length) over `SCM_RIGHTS`, in batches below the kernel's 253 descriptors a
//! message; it acknowledges with one byte once all arrived. A destination elsewhere never
//! connects: the source's [`HandoverServer::serve`] ends unclaimed at its deadline and the
//! state's device memory travels as data, as before. So the path falls back by itself.
//!
//! Trust. The token is what lets a peer take a VM's memory: it only travels in that VM's
//! migration stream (QEMU to QEMU; no guest sees it), it is compared in constant time, and a
//! wrong one closes that connection and, after [`MAX_WRONG`] of them, withdraws the offer. The
//! socket's mode and directory keep other users out (`SO_PEERCRED` is checked too: root or the
//! daemon's own user only). One claim is served, then the socket is removed.
//!
//! Memory. Exported memory stays the source's: its mappings stay as they were, so a migration
//! that fails later leaves the source running with its memory intact (the destination's
//! imports end with its workers, and a destination writes nothing into imported memory before
//! its guest runs). After a migration that succeeds, the source's workers end with their
//! sessions, and the memory lives on in the destination's mappings (the driver frees physical
//! memory when its last mapping, handle and descriptor are gone).
//!
//! Neighbours: `migration.rs` (the stream the offer rides in), `cuda/gpu_state` (the runs
//! exported and imported), `vhu_cuda.rs` (the stop phase that drives both ends).

use std::{
    fs,
    io::{self, Read, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::{
            fs::DirBuilderExt,
            net::{UnixListener, UnixStream},
        },
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::peer::peer_uid;
use tracing::{info, warn};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// The first bytes of an offer.
pub const OFFER_MAGIC: [u8; 8] = *b"QCUDAHO1";
/// Most GPUs an offer names.
pub const MAX_GPUS: usize = 64;
/// Longest socket path (`sun_path` holds 108 bytes with its NUL).
pub const MAX_PATH: usize = 107;
/// Most pieces one handover carries (every mapped run of every session's ranges): the bound a
/// worker's channel puts on the runs it exports or imports.
pub use crate::worker::message::MAX_RUNS as MAX_PIECES;
/// Descriptors per message: below the kernel's `SCM_MAX_FD` (253).
const BATCH: usize = 250;
/// Wrong tokens after which the offer is withdrawn.
pub const MAX_WRONG: u32 = 3;
/// Bytes of a token.
pub const TOKEN_LEN: usize = 32;
/// The destination's acknowledgement: every piece arrived.
const ACK: u8 = b'K';

/// What the source offers, at the head of its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// `/proc/sys/kernel/random/boot_id` of the source's host: same host, same boot.
    pub boot_id: [u8; 16],
    /// UUIDs of the GPUs whose memory is offered.
    pub gpus: Vec<[u8; 16]>,
    /// The source's handover socket.
    pub socket: PathBuf,
    /// The secret a claim presents.
    pub token: [u8; TOKEN_LEN],
}

/// Why an offer's bytes are refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OfferError {
    /// Not an offer.
    #[error("not a handover offer (bad magic)")]
    Magic,
    /// A count or path no source writes.
    #[error("bad handover offer: {0}")]
    Field(&'static str),
    /// Too short, or bytes after its end.
    #[error("handover offer truncated or with trailing bytes")]
    Length,
}

/// Why a handover failed (the migration then moves the memory as data).
#[derive(Debug, Error)]
pub enum HandoverError {
    /// The socket could not be made, reached or used.
    #[error("handover socket: {0}")]
    Io(#[from] io::Error),
    /// The peer broke the protocol.
    #[error("handover: {0}")]
    Protocol(&'static str),
}

impl Offer {
    /// Its bytes: magic, boot id, GPU count (u32) and UUIDs, path length (u32) and path, token.
    pub fn encode(&self) -> Vec<u8> {
        let path = self.socket.as_os_str().as_encoded_bytes();
        let mut out = Vec::with_capacity(8 + 16 + 4 + 16 * self.gpus.len() + 4 + path.len() + 32);
        out.extend_from_slice(&OFFER_MAGIC);
        out.extend_from_slice(&self.boot_id);
        out.extend_from_slice(
            &u32::try_from(self.gpus.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for g in &self.gpus {
            out.extend_from_slice(g);
        }
        out.extend_from_slice(&u32::try_from(path.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(path);
        out.extend_from_slice(&self.token);
        out
    }

    /// Decodes an offer from anywhere (it comes in the migration stream): bounded counts, an
    /// absolute path of at most [`MAX_PATH`] bytes without NUL, nothing after the token.
    pub fn decode(bytes: &[u8]) -> Result<Self, OfferError> {
        let mut r = bytes;
        let mut take = |n: usize| -> Result<&[u8], OfferError> {
            if r.len() < n {
                return Err(OfferError::Length);
            }
            let (a, b) = r.split_at(n);
            r = b;
            Ok(a)
        };
        if take(8)? != OFFER_MAGIC {
            return Err(OfferError::Magic);
        }
        let boot_id: [u8; 16] = take(16)?.try_into().map_err(|_| OfferError::Length)?;
        let n = u32::from_le_bytes(take(4)?.try_into().map_err(|_| OfferError::Length)?) as usize;
        if n == 0 || n > MAX_GPUS {
            return Err(OfferError::Field("GPU count"));
        }
        let mut gpus = Vec::with_capacity(n);
        for _ in 0..n {
            gpus.push(take(16)?.try_into().map_err(|_| OfferError::Length)?);
        }
        let len = u32::from_le_bytes(take(4)?.try_into().map_err(|_| OfferError::Length)?) as usize;
        if len == 0 || len > MAX_PATH {
            return Err(OfferError::Field("socket path length"));
        }
        let path = take(len)?;
        if path[0] != b'/' || path.contains(&0) {
            return Err(OfferError::Field("socket path"));
        }
        let socket = PathBuf::from(
            String::from_utf8(path.to_vec()).map_err(|_| OfferError::Field("socket path"))?,
        );
        let token: [u8; TOKEN_LEN] = take(TOKEN_LEN)?
            .try_into()
            .map_err(|_| OfferError::Length)?;
        if !r.is_empty() {
            return Err(OfferError::Length);
        }
        Ok(Self {
            boot_id,
            gpus,
            socket,
            token,
        })
    }

    /// Whether a destination on the host booted as `boot_id`, with the GPUs `local`, can
    /// claim it: the same boot, and every offered GPU present.
    pub fn is_local(&self, boot_id: &[u8; 16], local: &[[u8; 16]]) -> bool {
        &self.boot_id == boot_id && self.gpus.iter().all(|g| local.contains(g))
    }
}

/// This host's boot id (`/proc/sys/kernel/random/boot_id`, a UUID in text), read once: the
/// daemon reads it before its seccomp filter refuses file opens (`lib.rs` calls this first),
/// and every later call answers from that first read.
pub fn boot_id() -> io::Result<[u8; 16]> {
    static READ: std::sync::OnceLock<Result<[u8; 16], String>> = std::sync::OnceLock::new();
    READ.get_or_init(|| {
        let text =
            fs::read_to_string("/proc/sys/kernel/random/boot_id").map_err(|e| e.to_string())?;
        parse_uuid(text.trim()).ok_or_else(|| "unreadable boot_id".to_owned())
    })
    .clone()
    .map_err(io::Error::other)
}

/// A UUID's 16 bytes from its text (hex digits, dashes ignored).
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// A piece of device memory handed over: three numbers for the GPU side (device, address,
/// length of a run) and the descriptor of its physical memory.
#[derive(Debug)]
pub struct Piece {
    /// Device, address, length (the GPU side's meaning).
    pub meta: [u64; 3],
    /// The exported memory.
    pub fd: OwnedFd,
}

/// What [`HandoverServer::serve`] ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// A destination took every piece and acknowledged.
    Claimed,
    /// No destination came before the deadline (another host, or an older daemon), or the
    /// offer was withdrawn after wrong tokens: the memory moves as data.
    Unclaimed,
}

/// The source's end: its socket, and the token a claim must present.
#[derive(Debug)]
pub struct HandoverServer {
    listener: UnixListener,
    path: PathBuf,
    token: [u8; TOKEN_LEN],
}

/// `n` bytes from the kernel's random source.
fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`, a live local buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(n).ok() != Some(N) {
        return Err(io::Error::other("getrandom"));
    }
    Ok(b)
}

/// Equality of two tokens in a time that does not depend on where they differ.
fn same_token(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl HandoverServer {
    /// Opens a socket in a directory of its own, of a random name in `dir` (the daemon's
    /// runtime directory) and mode 0700, and returns it with the offer naming it.
    ///
    /// The directory is made with its mode (no chmod: the daemon's seccomp filter refuses
    /// `chmod` and `fchmodat`, and a socket's own mode could only be narrowed after `bind`,
    /// when a peer may already connect): only the daemon's user can reach the socket from the
    /// moment it exists, whatever the umask.
    pub fn open(
        dir: &Path,
        boot_id: [u8; 16],
        gpus: Vec<[u8; 16]>,
    ) -> Result<(Self, Offer), HandoverError> {
        let name: [u8; 8] = random()?;
        let private = dir.join(format!("qcuda-handover-{}", u64::from_le_bytes(name)));
        let path = private.join("offer.sock");
        if path.as_os_str().len() > MAX_PATH {
            return Err(HandoverError::Protocol("runtime directory path too long"));
        }
        fs::DirBuilder::new().mode(0o700).create(&private)?;
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                let _ = fs::remove_dir(&private);
                return Err(e.into());
            }
        };
        listener.set_nonblocking(true)?;
        let token = random()?;
        let offer = Offer {
            boot_id,
            gpus,
            socket: path.clone(),
            token,
        };
        Ok((
            Self {
                listener,
                path,
                token,
            },
            offer,
        ))
    }

    /// Waits until `deadline` for a destination to claim the offer, and hands it `pieces`.
    /// A connection with a wrong token, from another user, or that breaks the protocol is
    /// closed and the wait goes on; after [`MAX_WRONG`] wrong tokens the offer is withdrawn.
    pub fn serve(&self, deadline: Instant, pieces: &[Piece]) -> Claim {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut given = Some(pieces);
        match self.serve_with(deadline, left, || {
            given.take().ok_or_else(|| "served once".to_string())
        }) {
            Ok((claim, ..)) => claim,
            Err(why) => {
                warn!("migration handover: a claim failed: {why}");
                Claim::Unclaimed
            }
        }
    }

    /// Waits until `deadline` for a destination to present the token (connections with a
    /// wrong one, from another user, or that break the protocol are closed and the wait goes
    /// on; after [`MAX_WRONG`] wrong tokens the offer is withdrawn: unclaimed). Once one has,
    /// `pieces` makes what it takes (the source exports its memory only for a claim), and it
    /// is given them within `transfer` and acknowledges. Returns how it ended, with the
    /// pieces and bytes handed over; `Err` if the claim came but the pieces could not be made
    /// or given (the destination then takes nothing: it has no acknowledgement to give).
    pub fn serve_with<P: std::borrow::Borrow<[Piece]>>(
        &self,
        deadline: Instant,
        transfer: Duration,
        pieces: impl FnOnce() -> Result<P, String>,
    ) -> Result<(Claim, u64, u64), String> {
        let mut wrong = 0;
        while Instant::now() < deadline && wrong < MAX_WRONG {
            let conn = match self.listener.accept() {
                Ok((c, _)) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => {
                    warn!("migration handover: accept failed: {e}");
                    return Ok((Claim::Unclaimed, 0, 0));
                }
            };
            match self.authenticate(&conn, deadline) {
                Ok(()) => {}
                Err(Refused::WrongToken) => {
                    wrong += 1;
                    warn!("migration handover: a claim with a wrong token was refused");
                    continue;
                }
                Err(Refused::Other(why)) => {
                    warn!("migration handover: a claim failed: {why}");
                    continue;
                }
            }
            let pieces = pieces()?;
            let pieces = pieces.borrow();
            give(&conn, pieces, transfer).map_err(|e| format!("giving the pieces: {e}"))?;
            let bytes = pieces.iter().map(|p| p.meta[2]).sum();
            info!(pieces = pieces.len(), bytes, "migration handover: claimed");
            return Ok((Claim::Claimed, pieces.len() as u64, bytes));
        }
        Ok((Claim::Unclaimed, 0, 0))
    }

    /// Checks a connection's peer and token, reading until `deadline` at most.
    fn authenticate(&self, conn: &UnixStream, deadline: Instant) -> Result<(), Refused> {
        conn.set_nonblocking(false).map_err(Refused::io)?;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        conn.set_read_timeout(Some(left)).map_err(Refused::io)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        match peer_uid(conn) {
            Ok(uid) if uid == 0 || uid == me => {}
            Ok(_) => return Err(Refused::Other("a peer of another user".into())),
            Err(e) => return Err(Refused::io(e)),
        }
        let mut token = [0u8; TOKEN_LEN];
        (&*conn).read_exact(&mut token).map_err(Refused::io)?;
        if !same_token(&token, &self.token) {
            return Err(Refused::WrongToken);
        }
        Ok(())
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HandoverServer {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        if let Some(private) = self.path.parent() {
            let _ = fs::remove_dir(private);
        }
    }
}

enum Refused {
    WrongToken,
    Other(String),
}

impl Refused {
    #[expect(clippy::needless_pass_by_value, reason = "used as a map_err function")]
    fn io(e: io::Error) -> Self {
        Self::Other(e.to_string())
    }
}

/// Gives an authenticated destination `pieces`, within `timeout` for each read or write, and
/// takes its acknowledgement.
fn give(conn: &UnixStream, pieces: &[Piece], timeout: Duration) -> io::Result<()> {
    let timeout = timeout.max(Duration::from_millis(1));
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    let mut c = conn;
    c.write_all(&(pieces.len() as u64).to_le_bytes())?;
    for batch in pieces.chunks(BATCH) {
        let mut frame = Vec::with_capacity(4 + 24 * batch.len());
        frame.extend_from_slice(&u32::try_from(batch.len()).unwrap_or(u32::MAX).to_le_bytes());
        for p in batch {
            for m in p.meta {
                frame.extend_from_slice(&m.to_le_bytes());
            }
        }
        let fds: Vec<RawFd> = batch.iter().map(|p| p.fd.as_raw_fd()).collect();
        send_all(conn, &frame, &fds)?;
    }
    let mut ack = [0u8; 1];
    c.read_exact(&mut ack)?;
    if ack[0] != ACK {
        return Err(io::Error::other("no acknowledgement"));
    }
    Ok(())
}

/// Sends `bytes` with `fds` attached to its first part.
fn send_all(conn: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let (mut sent, mut fds) = (0, fds);
    while sent < bytes.len() {
        match conn.send_with_fds(&[&bytes[sent..]], fds) {
            Ok(n) => {
                sent += n;
                fds = &[];
            }
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => return Err(io::Error::from(e)),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes, keeping every descriptor that comes with them.
fn recv_all(conn: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<()> {
    let mut pos = 0;
    while pos < buf.len() {
        let mut got_fds = vec![-1 as RawFd; BATCH + 3];
        let rest = &mut buf[pos..];
        let mut iov = [libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        }];
        // SAFETY: the iovec covers `rest`, a live, exclusively borrowed byte slice, and any
        // bytes may be written to it.
        let (n, nfds) =
            unsafe { conn.recv_with_fds(&mut iov, &mut got_fds) }.map_err(io::Error::from)?;
        for &fd in &got_fds[..nfds] {
            // SAFETY: recvmsg just installed `fd` in this process for us; nothing else owns it.
            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        pos += n;
    }
    Ok(())
}

/// The destination's end: connects to the offer's socket within `timeout`, presents its token
/// and takes every piece. Call only where [`Offer::is_local`] holds.
pub fn claim(offer: &Offer, timeout: Duration) -> Result<Vec<Piece>, HandoverError> {
    let conn = UnixStream::connect(&offer.socket)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    (&conn).write_all(&offer.token)?;
    let mut n = [0u8; 8];
    (&conn).read_exact(&mut n)?;
    let n = usize::try_from(u64::from_le_bytes(n))
        .ok()
        .filter(|&n| n <= MAX_PIECES)
        .ok_or(HandoverError::Protocol("too many pieces"))?;
    let mut pieces = Vec::with_capacity(n.min(BATCH));
    while pieces.len() < n {
        let mut fds = Vec::new();
        let mut count = [0u8; 4];
        recv_all(&conn, &mut count, &mut fds)?;
        let count = u32::from_le_bytes(count) as usize;
        if count == 0 || count > BATCH || count > n - pieces.len() {
            return Err(HandoverError::Protocol("a batch's count"));
        }
        let mut meta = vec![0u8; 24 * count];
        recv_all(&conn, &mut meta, &mut fds)?;
        if fds.len() != count {
            return Err(HandoverError::Protocol("a batch's descriptors"));
        }
        for (m, fd) in meta.chunks_exact(24).zip(fds) {
            let word = |i: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&m[8 * i..8 * i + 8]);
                u64::from_le_bytes(b)
            };
            pieces.push(Piece {
                meta: [word(0), word(1), word(2)],
                fd,
            });
        }
    }
    (&conn).write_all(&[ACK])?;
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use std::{
        os::unix::fs::{FileExt, PermissionsExt},
        sync::Arc,
        thread,
    };

    use super::*;

    const GPU: [u8; 16] = [7; 16];

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("qcuda-handover-test-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    /// Pieces whose memory is a memfd holding `i` (a stand-in for exported device memory).
    fn pieces(n: usize) -> Vec<Piece> {
        (0..n)
            .map(|i| {
                let f = crate::worker::StateFile::from_bytes(&(i as u64).to_le_bytes()).unwrap();
                let fd = f.file().try_clone().unwrap().into();
                Piece {
                    meta: [0, 0x6800_0000_0000 + (i as u64) * (2 << 20), 2 << 20],
                    fd,
                }
            })
            .collect()
    }

    /// `server` serves `given` on a thread of its own while this one claims `offer`: the
    /// pieces claimed, once the source said it was claimed.
    fn serve_and_claim(
        server: &Arc<HandoverServer>,
        offer: &Offer,
        given: Vec<Piece>,
    ) -> Vec<Piece> {
        let s = Arc::clone(server);
        let source =
            thread::spawn(move || s.serve(Instant::now() + Duration::from_secs(20), &given));
        let got = claim(offer, Duration::from_secs(20)).unwrap();
        assert_eq!(source.join().unwrap(), Claim::Claimed);
        got
    }

    #[test]
    fn offers_round_trip_and_hostile_ones_are_refused() {
        let offer = Offer {
            boot_id: [1; 16],
            gpus: vec![GPU, [9; 16]],
            socket: "/run/qcuda/qcuda-handover-1.sock".into(),
            token: [3; TOKEN_LEN],
        };
        let bytes = offer.encode();
        assert_eq!(Offer::decode(&bytes), Ok(offer.clone()));
        for cut in 0..bytes.len() {
            assert!(Offer::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Offer::decode(&long), Err(OfferError::Length));
        let mut relative = offer.clone();
        relative.socket = "run/x.sock".into();
        Offer::decode(&relative.encode()).unwrap_err();
        let mut many = bytes.clone();
        many[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Offer::decode(&many), Err(OfferError::Field("GPU count")));
        assert!(offer.is_local(&[1; 16], &[[9; 16], GPU, [0; 16]]));
        assert!(!offer.is_local(&[2; 16], &[[9; 16], GPU]), "another boot");
        assert!(!offer.is_local(&[1; 16], &[GPU]), "a GPU missing");
        assert_eq!(
            parse_uuid("0f8e2c5e-3b0a-4c1e-9d5f-8a7b6c5d4e3f").unwrap()[..2],
            [0x0f, 0x8e]
        );
        boot_id().unwrap();
    }

    #[test]
    fn a_destination_with_the_token_claims_every_piece_over_a_private_socket() {
        let (server, offer) = HandoverServer::open(&dir(), [1; 16], vec![GPU]).unwrap();
        let private = server.path().parent().unwrap();
        let mode = fs::metadata(private).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o700,
            "the socket's directory is the daemon user's alone"
        );
        // More pieces than one message carries.
        let given = pieces(BATCH * 2 + 3);
        let metas: Vec<[u64; 3]> = given.iter().map(|p| p.meta).collect();
        let server = Arc::new(server);
        let got = serve_and_claim(&server, &offer, given);
        assert_eq!(got.len(), metas.len());
        for (i, p) in got.iter().enumerate() {
            assert_eq!(p.meta, metas[i]);
            let f = fs::File::from(p.fd.try_clone().unwrap());
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, 0).unwrap();
            assert_eq!(u64::from_le_bytes(b), i as u64, "the memory of piece {i}");
        }
        let path = server.path().to_path_buf();
        drop(server);
        assert!(!path.exists(), "the socket is removed");
    }

    /// What both daemons do at a migration's stop runs under the daemon's seccomp filter (no
    /// file opens, no chmod): the boot id from its read at start, the offer's private socket,
    /// the claim and the clean-up. (On the GPU host the boot id read at the stop and the
    /// socket's chmod were refused, and every migration fell back to a copy.)
    #[test]
    fn an_offer_is_made_claimed_and_removed_under_the_daemons_filter() {
        let boot = boot_id().unwrap();
        let d = dir();
        let given = pieces(3);
        let filtered = thread::spawn(move || {
            seccompiler::apply_filter(&crate::sandbox::daemon_filter().unwrap()).unwrap();
            assert!(
                fs::read_to_string("/proc/sys/kernel/random/boot_id").is_err(),
                "the filter refuses file opens"
            );
            assert_eq!(
                boot_id().unwrap(),
                boot,
                "the boot id read before the filter"
            );
            let (server, offer) = HandoverServer::open(&d, boot, vec![GPU]).unwrap();
            let server = Arc::new(server);
            assert_eq!(serve_and_claim(&server, &offer, given).len(), 3);
            let path = server.path().to_path_buf();
            drop(server);
            (path.exists(), path.parent().unwrap().exists())
        });
        assert_eq!(
            filtered.join().unwrap(),
            (false, false),
            "socket and directory removed"
        );
    }

    #[test]
    fn wrong_tokens_take_nothing_and_withdraw_the_offer_and_no_claim_falls_back() {
        let (server, offer) = HandoverServer::open(&dir(), [1; 16], vec![GPU]).unwrap();
        let server = Arc::new(server);
        let s = Arc::clone(&server);
        let source =
            thread::spawn(move || s.serve(Instant::now() + Duration::from_secs(20), &pieces(2)));
        for _ in 0..MAX_WRONG {
            let mut thief = offer.clone();
            thief.token[0] ^= 1;
            // The connection is closed without a piece or a count.
            match claim(&thief, Duration::from_secs(20)) {
                Err(HandoverError::Io(_)) => {}
                other => panic!("a wrong token got {other:?}"),
            }
        }
        assert_eq!(source.join().unwrap(), Claim::Unclaimed);
        // A destination elsewhere never comes: the deadline ends the wait, unclaimed.
        let started = Instant::now();
        let none = server.serve(Instant::now() + Duration::from_millis(50), &pieces(1));
        assert_eq!(none, Claim::Unclaimed);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

//! The VM's table of device memory its processes share (CUDA IPC), kept by the daemon.
//!
//! Every guest process has a worker of its own, sandboxed in namespaces of its own, so nothing
//! one worker makes can reach another directly. An export (`Op::IpcExport`) makes the
//! exporting worker ask the driver for a POSIX file descriptor of the physical allocation
//! (`crate::cuda::GpuState::ipc_export`); that descriptor comes to the daemon with the answer
//! (`SCM_RIGHTS`) and is kept here under a token and a 128-bit secret drawn from the kernel's
//! random source, which are what the guest process gets (inside its `cudaIpcMemHandle_t`, or in
//! the file a POSIX-descriptor handle is). An import (`Op::IpcImport`) names token and secret;
//! the daemon checks them here and passes a copy of the descriptor to the importing worker,
//! which imports it (`GpuState::ipc_import`).
//!
//! - The table is per VM (one per connection): a token of another VM, or a forged or stale one,
//!   finds nothing and is refused with `cudaErrorInvalidValue` (`CUDA_ERROR_INVALID_VALUE`), as
//!   the driver refuses a handle it does not know. A right token with a wrong secret is refused
//!   the same way, and the comparison takes the same time whatever the bytes.
//! - An entry lives as long as its exporting session: it is dropped when that session ends
//!   (`drop_session`), and with it the daemon's descriptor. What importers opened stays theirs
//!   (their mappings hold the memory), so an exporter that exits takes nothing away from them,
//!   but a handle cannot be opened after its exporter is gone (as a legacy handle of a process
//!   that exited cannot natively). A killed process therefore leaves nothing here.
//! - At most [`MAX_EXPORTS`] entries per VM and [`MAX_EXPORTS_PER_SESSION`] per session (each
//!   is a descriptor the daemon holds).

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{Arc, Mutex, MutexGuard},
};

use qcuda_proto::status;

/// Most exports one VM may hold.
pub const MAX_EXPORTS: usize = 1024;
/// Most exports one session may hold.
pub const MAX_EXPORTS_PER_SESSION: usize = 256;

/// One export.
#[derive(Debug)]
struct Export {
    secret: [u64; 2],
    kind: u64,
    /// The driver's descriptor; shared with imports in flight.
    fd: Arc<OwnedFd>,
    /// What the exporting worker said about the allocation, for the importer.
    meta: [u64; 3],
    exporter: u64,
}

/// What an import gets from the table.
#[derive(Debug, Clone)]
pub struct Found {
    /// The driver's descriptor, to pass to the importing worker.
    pub fd: Arc<OwnedFd>,
    /// What the exporting worker said about the allocation.
    pub meta: [u64; 3],
    /// The exporting session.
    pub exporter: u64,
}

/// The VM's exports.
#[derive(Debug, Default)]
pub struct IpcBroker {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    exports: HashMap<u64, Export>,
    next: u64,
}

/// 128 bits from the kernel's random source.
fn random_secret() -> Option<[u64; 2]> {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`, a live local buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(n).ok() != Some(b.len()) {
        return None;
    }
    let (lo, hi) = b.split_at(8);
    Some([
        u64::from_le_bytes(lo.try_into().ok()?),
        u64::from_le_bytes(hi.try_into().ok()?),
    ])
}

/// Equality of two secrets in a time that does not depend on where they differ.
fn same_secret(a: &[u64; 2], b: &[u64; 2]) -> bool {
    ((a[0] ^ b[0]) | (a[1] ^ b[1])) == 0
}

impl IpcBroker {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Every update is one insert or removal: the table stays consistent if a holder panicked.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `fd`, exported by session `exporter`, and returns its token and secret; a CUDA
    /// status if the VM or the session holds too many exports (`cudaErrorMemoryAllocation`)
    /// or no secret could be drawn.
    pub fn register(
        &self,
        exporter: u64,
        kind: u64,
        fd: OwnedFd,
        meta: [u64; 3],
    ) -> Result<(u64, [u64; 2]), u32> {
        let secret = random_secret().ok_or(status::UNKNOWN)?;
        let mut t = self.table();
        let mine = t
            .exports
            .values()
            .filter(|e| e.exporter == exporter)
            .count();
        if t.exports.len() >= MAX_EXPORTS || mine >= MAX_EXPORTS_PER_SESSION {
            return Err(status::MEMORY_ALLOCATION);
        }
        t.next += 1;
        let token = t.next;
        t.exports.insert(
            token,
            Export {
                secret,
                kind,
                fd: Arc::new(fd),
                meta,
                exporter,
            },
        );
        Ok((token, secret))
    }

    /// The export behind `token` if `secret` and `kind` match it, else
    /// `cudaErrorInvalidValue`.
    pub fn find(&self, token: u64, secret: [u64; 2], kind: u64) -> Result<Found, u32> {
        let t = self.table();
        let e = t.exports.get(&token).ok_or(status::INVALID_VALUE)?;
        if !same_secret(&e.secret, &secret) || e.kind != kind {
            return Err(status::INVALID_VALUE);
        }
        Ok(Found {
            fd: Arc::clone(&e.fd),
            meta: e.meta,
            exporter: e.exporter,
        })
    }

    /// Drops every export of `session` (it ended); returns how many.
    pub fn drop_session(&self, session: u64) -> usize {
        let mut t = self.table();
        let before = t.exports.len();
        t.exports.retain(|_, e| e.exporter != session);
        before - t.exports.len()
    }

    /// How many exports the VM holds.
    pub fn len(&self) -> usize {
        self.table().exports.len()
    }

    /// Whether the VM holds no export.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    fn fd() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    #[test]
    fn tokens_open_only_with_their_secret_and_kind() {
        let b = IpcBroker::default();
        let (t, s) = b.register(7, 1, fd(), [1, 2, 3]).unwrap();
        let found = b.find(t, s, 1).unwrap();
        assert_eq!((found.meta, found.exporter), ([1, 2, 3], 7));
        assert!(found.fd.as_raw_fd() >= 0);
        // Wrong secret (each half), wrong kind, unknown and forged tokens.
        assert_eq!(
            b.find(t, [s[0] ^ 1, s[1]], 1).unwrap_err(),
            status::INVALID_VALUE
        );
        assert_eq!(
            b.find(t, [s[0], s[1] ^ 1 << 63], 1).unwrap_err(),
            status::INVALID_VALUE
        );
        assert_eq!(b.find(t, s, 2).unwrap_err(), status::INVALID_VALUE);
        assert_eq!(b.find(t + 1, s, 1).unwrap_err(), status::INVALID_VALUE);
        assert_eq!(b.find(0, [0, 0], 1).unwrap_err(), status::INVALID_VALUE);
        // Two exports never share a secret.
        let (t2, s2) = b.register(7, 1, fd(), [0; 3]).unwrap();
        assert_ne!((t, s), (t2, s2));
        assert_ne!(s, s2);
    }

    #[test]
    fn another_vms_token_finds_nothing() {
        let (vm_a, vm_b) = (IpcBroker::default(), IpcBroker::default());
        let (t, s) = vm_a.register(1, 1, fd(), [0; 3]).unwrap();
        assert_eq!(vm_b.find(t, s, 1).unwrap_err(), status::INVALID_VALUE);
    }

    #[test]
    fn an_ended_exporter_leaves_nothing_and_imports_in_flight_keep_their_fd() {
        let b = IpcBroker::default();
        let (t, s) = b.register(3, 2, fd(), [0; 3]).unwrap();
        let (other, os) = b.register(4, 2, fd(), [0; 3]).unwrap();
        let in_flight = b.find(t, s, 2).unwrap();
        assert_eq!(b.drop_session(3), 1);
        assert_eq!(b.find(t, s, 2).unwrap_err(), status::INVALID_VALUE);
        b.find(other, os, 2).unwrap();
        // The descriptor an import already took stays open until the import is done.
        assert_eq!(Arc::strong_count(&in_flight.fd), 1);
        assert_eq!(b.drop_session(4), 1);
        assert!(b.is_empty());
    }

    #[test]
    fn a_session_cannot_fill_the_vms_table() {
        let b = IpcBroker::default();
        for _ in 0..MAX_EXPORTS_PER_SESSION {
            b.register(1, 1, fd(), [0; 3]).unwrap();
        }
        assert_eq!(
            b.register(1, 1, fd(), [0; 3]).unwrap_err(),
            status::MEMORY_ALLOCATION
        );
        // Another process of the VM still can.
        b.register(2, 1, fd(), [0; 3]).unwrap();
        assert_eq!(b.drop_session(1), MAX_EXPORTS_PER_SESSION);
    }
}

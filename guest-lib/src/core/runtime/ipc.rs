//! Device memory shared between the processes of one VM, for both faces: legacy IPC memory
//! handles (`cudaIpcGetMemHandle`/`cuIpcGetMemHandle`, open, close) and VMM shareable handles
//! as POSIX file descriptors (`cuMemExportToShareableHandle`, `cuMemImportFromShareableHandle`).
//!
//! The host brokers the real thing (vhost-cuda's session/ipc_broker.rs): an export answers a
//! token and a 128-bit secret of the VM's table; an import names them. What the guest holds is
//! those bytes, in CUDA's own 64-byte handle (`cudaIpcMemHandle_t`) or, for a POSIX-descriptor
//! handle, in a sealed memory file (memfd) made for it: a real descriptor the program can pass
//! to another process over a Unix socket (`SCM_RIGHTS`), as CUDA documents, and that the
//! importer reads back. Layout: `qcuda_proto::IPC_HANDLE_LEN`. A handle from another VM, a
//! stale one or a forged one names nothing in this VM's table and is refused by the host.
//!
//! Lifetimes, as CUDA's: an opened legacy handle is mapped until `cudaIpcCloseMemHandle` (or
//! the process's end) and keeps the memory even after the exporter exits; a handle can only be
//! opened while its exporting process lives, and never by that process itself
//! (`cudaErrorDeviceUninitialized`, "invalid device context"). An imported VMM handle is a
//! handle of this process like one of `cuMemCreate` (core/memory/vmm.rs). Closing the descriptor
//! of a POSIX handle does not free the allocation (the allocation's handles and mappings hold
//! it).

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

use qcuda_proto::{
    Op, IPC_HANDLE_LEN, IPC_HANDLE_MAGIC, IPC_KIND_EVENT, IPC_KIND_MEMORY, IPC_KIND_POOL,
    IPC_KIND_VMM, POOL_PTR_EXPORT_LEN,
};

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    memory::{device::Allocation, ipc::opened},
    runtime::Runtime,
    transport::{Call, Reply},
};

/// A guest-side IPC handle: CUDA's 64 bytes.
pub type IpcHandle = [u8; IPC_HANDLE_LEN];

/// The handle bytes of an export: magic, kind, token, secret, the exporter's device.
pub fn encode(kind: u64, token: u64, secret: [u64; 2], device: u32) -> IpcHandle {
    let mut h = [0u8; IPC_HANDLE_LEN];
    h[0..4].copy_from_slice(&IPC_HANDLE_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&u32::try_from(kind).unwrap_or(u32::MAX).to_le_bytes());
    h[8..16].copy_from_slice(&token.to_le_bytes());
    h[16..24].copy_from_slice(&secret[0].to_le_bytes());
    h[24..32].copy_from_slice(&secret[1].to_le_bytes());
    h[32..36].copy_from_slice(&device.to_le_bytes());
    h
}

/// Token, secret and exporter's device of handle bytes of `kind`; `cudaErrorInvalidValue` for
/// bytes that are no such handle (as the driver answers a handle it does not know).
pub fn decode(h: &IpcHandle, kind: u64) -> CudaResult<(u64, [u64; 2], u32)> {
    let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]));
    let half = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().unwrap_or([0; 4]));
    if half(0) != IPC_HANDLE_MAGIC || u64::from(half(4)) != kind || word(8) == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok((word(8), [word(16), word(24)], half(32)))
}

/// Exports `object` (of `kind`, on `device`) through the host's broker: the handle bytes that
/// name it.
fn export(rt: &Runtime, kind: u64, device: u32, object: u64) -> CudaResult<IpcHandle> {
    let reply = rt
        .session
        .submit(Call::new(Op::IpcExport, device).args(&[kind, object]))?;
    let [token, s0, s1, ..] = reply.rets;
    Ok(encode(kind, token, [s0, s1], device))
}

/// Imports the object handle bytes `h` of `kind` name, on `device` with `flags`: the host's
/// answer (its handle, or address and size, in `rets`).
fn import(rt: &Runtime, kind: u64, device: u32, h: &IpcHandle, flags: u64) -> CudaResult<Reply> {
    let (token, secret, _exporter_device) = decode(h, kind)?;
    rt.session
        .submit(Call::new(Op::IpcImport, device).args(&[kind, token, secret[0], secret[1], flags]))
}

/// `cudaIpcGetMemHandle`: a handle of the allocation holding `ptr`.
pub fn get_mem_handle(rt: &Runtime, ptr: u64) -> CudaResult<IpcHandle> {
    let a = rt.allocations.find(ptr).ok_or(CudaError::INVALID_VALUE)?;
    // Memory this process opened from another is not its own to export.
    if opened()
        .range(..=ptr)
        .next_back()
        .is_some_and(|(&b, _)| b == a.base)
    {
        return Err(CudaError::INVALID_VALUE);
    }
    export(rt, IPC_KIND_MEMORY, a.device, ptr)
}

/// `cudaIpcOpenMemHandle` on `device`: the start of the exported allocation, mapped here.
pub fn open_mem_handle(rt: &Runtime, device: u32, h: &IpcHandle, flags: u32) -> CudaResult<u64> {
    let [ptr, size, ..] = import(rt, IPC_KIND_MEMORY, device, h, u64::from(flags))?.rets;
    rt.allocations.insert(Allocation {
        base: ptr,
        size,
        device,
        origin: crate::core::memory::device::Origin::IpcOpened,
    });
    opened().insert(ptr, device);
    Ok(ptr)
}

/// `cudaIpcCloseMemHandle`: `ptr` as `open_mem_handle` gave it.
pub fn close_mem_handle(rt: &Runtime, ptr: u64) -> CudaResult<()> {
    let device = *opened().get(&ptr).ok_or(CudaError::INVALID_VALUE)?;
    rt.session
        .submit(Call::new(Op::IpcClose, device).args(&[ptr]))?;
    opened().remove(&ptr);
    rt.allocations.remove(ptr);
    Ok(())
}

/// `cudaIpcGetEventHandle`: a handle of an event created with `cudaEventInterprocess` and
/// `cudaEventDisableTiming` (else `cudaErrorInvalidResourceHandle`, from the host).
pub fn get_event_handle(rt: &Runtime, event: usize) -> CudaResult<IpcHandle> {
    let e = rt.events.info(event)?;
    export(rt, IPC_KIND_EVENT, e.device, e.host)
}

/// `cudaIpcOpenEventHandle` on `device`: an event of this process.
pub fn open_event_handle(rt: &Runtime, device: u32, h: &IpcHandle) -> CudaResult<usize> {
    let host = import(rt, IPC_KIND_EVENT, device, h, 0)?.rets[0];
    Ok(rt.events.adopt(host, device))
}

/// `cuMemExportToShareableHandle` with a POSIX file descriptor: a new descriptor of a sealed
/// memory file holding the handle bytes.
pub fn export_fd(rt: &Runtime, handle: u64) -> CudaResult<RawFd> {
    let device = rt.vmm.handle_device(handle)?;
    let bytes = export(rt, IPC_KIND_VMM, device, handle)?;
    let fd = handle_file(&bytes).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
    Ok(fd.into_raw_fd())
}

/// `cuMemImportFromShareableHandle` of descriptor `fd`: a new allocation handle of this process.
pub fn import_fd(rt: &Runtime, fd: RawFd) -> CudaResult<u64> {
    let h = read_handle_file(fd)?;
    // The calling thread's device, as natively the current context's: the host works in its
    // context there (no context on the allocation's own device, which may be a peer).
    let device = crate::core::devices::current();
    let handle = import(rt, IPC_KIND_VMM, device, &h, 0)?.rets[0];
    rt.vmm.adopt(&rt.session, handle, device);
    Ok(handle)
}

/// Reads the handle bytes of a descriptor `export_fd`/`export_pool_fd` made; another file is
/// `cudaErrorInvalidValue`.
fn read_handle_file(fd: RawFd) -> CudaResult<IpcHandle> {
    let mut h = [0u8; IPC_HANDLE_LEN];
    // SAFETY: reads at most `h.len()` bytes into `h`, a live local buffer; `fd` is the
    // caller's, and a bad one fails the call.
    let n = unsafe { libc::pread(fd, h.as_mut_ptr().cast(), h.len(), 0) };
    if usize::try_from(n).ok() != Some(h.len()) {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(h)
}

/// `cudaMemPoolExportToShareableHandle` with a POSIX file descriptor (the pool was created
/// shareable that way).
pub fn export_pool_fd(rt: &Runtime, pool: usize) -> CudaResult<RawFd> {
    let info = rt.pools.info(pool)?;
    let bytes = export(rt, IPC_KIND_POOL, info.device, info.host)?;
    let fd = handle_file(&bytes).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
    Ok(fd.into_raw_fd())
}

/// `cudaMemPoolImportFromShareableHandle` of descriptor `fd`: a pool of this process, worked on
/// from the current device.
pub fn import_pool_fd(rt: &Runtime, fd: RawFd) -> CudaResult<usize> {
    let h = read_handle_file(fd)?;
    let device = crate::core::devices::current();
    let host = import(rt, IPC_KIND_POOL, device, &h, 0)?.rets[0];
    Ok(rt.pools.adopt(host, device))
}

/// `cudaMemPoolExportPointer`: the driver's record of a stream-ordered allocation.
pub fn export_pointer(rt: &Runtime, ptr: u64) -> CudaResult<[u8; POOL_PTR_EXPORT_LEN]> {
    let a = rt.allocations.find(ptr).ok_or(CudaError::INVALID_VALUE)?;
    if a.base != ptr {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut data = [0u8; POOL_PTR_EXPORT_LEN];
    rt.session.submit(
        Call::new(Op::MemPoolExportPointer, a.device)
            .args(&[ptr])
            .output(&mut data),
    )?;
    Ok(data)
}

/// `cudaMemPoolImportPointer` from an imported `pool`: the allocation's address here.
pub fn import_pointer(
    rt: &Runtime,
    pool: usize,
    data: &[u8; POOL_PTR_EXPORT_LEN],
) -> CudaResult<u64> {
    let info = rt.pools.info(pool)?;
    let reply = rt.session.submit(
        Call::new(Op::MemPoolImportPointer, info.device)
            .args(&[info.host])
            .input(data),
    )?;
    let [ptr, size, ..] = reply.rets;
    rt.allocations.insert(Allocation {
        base: ptr,
        size,
        device: info.device,
        origin: crate::core::memory::device::Origin::PoolImport(pool),
    });
    Ok(ptr)
}

/// A memory file holding `bytes`, sealed against any change.
fn handle_file(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain system call with a static name; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"qcuda-ipc-handle".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: writes `bytes`, a live slice, to the descriptor owned above.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
    if usize::try_from(n).ok() != Some(bytes.len()) {
        return Err(std::io::Error::last_os_error());
    }
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on the descriptor owned above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_foreign_bytes_are_refused() {
        let h = encode(IPC_KIND_MEMORY, 7, [1, u64::MAX], 1);
        assert_eq!(decode(&h, IPC_KIND_MEMORY).unwrap(), (7, [1, u64::MAX], 1));
        // Another kind, no magic, no token.
        assert_eq!(decode(&h, IPC_KIND_VMM), Err(CudaError::INVALID_VALUE));
        assert_eq!(
            decode(&[0; 64], IPC_KIND_MEMORY),
            Err(CudaError::INVALID_VALUE)
        );
        let none = encode(IPC_KIND_MEMORY, 0, [1, 2], 0);
        assert_eq!(
            decode(&none, IPC_KIND_MEMORY),
            Err(CudaError::INVALID_VALUE)
        );
    }

    #[test]
    fn a_handle_file_holds_the_bytes_and_cannot_be_changed() {
        let bytes = encode(IPC_KIND_VMM, 3, [4, 5], 0);
        let fd = handle_file(&bytes).unwrap();
        let mut back = [0u8; IPC_HANDLE_LEN];
        // SAFETY: reads into a live local buffer from the descriptor owned above.
        let n = unsafe { libc::pread(fd.as_raw_fd(), back.as_mut_ptr().cast(), back.len(), 0) };
        assert_eq!((n, back), (64, bytes));
        // SAFETY: a write attempt of a live local buffer to the descriptor owned above.
        let w = unsafe { libc::pwrite(fd.as_raw_fd(), back.as_ptr().cast(), 1, 0) };
        assert_eq!(w, -1, "a sealed handle file took a write");
    }
}

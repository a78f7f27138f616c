//! Device memory shared with the other processes of the VM: this worker's half of legacy IPC
//! (`cuIpcGetMemHandle`/`cuIpcOpenMemHandle`/`cuIpcCloseMemHandle`) and of VMM shareable
//! handles (`cuMemExportToShareableHandle`/`cuMemImportFromShareableHandle`, POSIX file
//! descriptors).
//!
//! Each guest process has a worker of its own, in namespaces of its own, so the driver's legacy
//! IPC handles (which name the exporting process) cannot cross from one worker to another. One
//! mechanism serves both kinds instead: the exporting worker asks the driver for a POSIX file
//! descriptor of the physical allocation (every block of a session's reserved range is made
//! shareable that way, `memory.rs`), the daemon keeps it in the VM's table under a token
//! (`crate::session::ipc_broker`) and passes it, with what the exporter said about it, to the
//! importing worker, which imports it here.
//!
//! - Legacy memory: the importer maps the whole physical allocation (the 2 MiB granule, or the
//!   run of a large block) at an address the driver picks, grants its device (and the owner's)
//!   access, and lets the guest reach only the exported allocation inside it; the answer is
//!   that allocation's start, as `cuIpcOpenMemHandle` answers the base of the allocation.
//!   `IpcClose` unmaps it (after the device's work, as natively). The mapping holds the memory:
//!   an exporter that exits or frees takes nothing from the importer.
//! - VMM: the imported allocation becomes a handle of the session's VMM table (`vmm.rs`),
//!   mapped, given access and released as any other.
//!
//! Neighbours: `crate::worker::child` calls [`GpuState::ipc_export`] and
//! [`GpuState::ipc_import`] for the daemon's `ToWorker::Ipc` messages (they carry a file
//! descriptor, so they do not travel as guest requests); `IpcClose` is an ordinary request.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use qcuda_proto::{
    IPC_KIND_EVENT, IPC_KIND_MEMORY, IPC_KIND_POOL, IPC_KIND_VMM, POOL_PTR_EXPORT_LEN,
};

use super::*;
use crate::cuda::driver::vmm::{AllocProps, ACCESS_READWRITE, HANDLE_TYPE_POSIX_FD};

/// Most legacy IPC mappings a session may hold open.
const MAX_IPC_OPEN: usize = 4096;
/// `cudaEventInterprocess | cudaEventDisableTiming`: what an event needs to be exported.
const IPC_EVENT_FLAGS: u32 = 0x6;
/// `cudaIpcMemLazyEnablePeerAccess`, the one flag `cuIpcOpenMemHandle` knows.
const IPC_LAZY_ENABLE_PEER_ACCESS: u64 = 1;

impl GpuState {
    /// Counts `bytes` of memory another process made against this VM's device-memory quota
    /// for as long as this session holds it: an exporter that exits gives its share back, and
    /// the importer's mapping would otherwise hold memory nobody counts.
    fn charge_import(&self, bytes: u64) -> Result<(), Fault> {
        match self.host.memory_quota() {
            Some(q) if !q.reserve(bytes) => Err(status::MEMORY_ALLOCATION.into()),
            _ => Ok(()),
        }
    }

    fn uncharge_import(&self, bytes: u64) {
        if let Some(q) = self.host.memory_quota() {
            q.release(bytes);
        }
    }

    /// The answer for `r` of `op` (a driver error may be sticky), as `execute` gives it.
    fn ipc_answer(&mut self, op: Op, r: OpResult) -> ResponseHeader {
        let mut resp = match r {
            Ok(r) => r,
            Err(Fault::Status(s)) => ResponseHeader::with_status(s),
            Err(Fault::Driver { dev, err }) => {
                ResponseHeader::with_status(self.driver_failed(op, dev, err))
            }
        };
        if self.host.sticky_error().is_some() {
            resp.flags |= RESP_FLAG_STICKY;
        }
        resp
    }

    /// Puts memory shareable as a POSIX descriptor under the run `run..run + len` of the
    /// session's range on `dev` (context bound), with the run's contents, at the same address:
    /// the device's work is waited for, the bytes copied to a new allocation mapped aside, the
    /// run unmapped and the new allocation mapped in its place with the same access. Blocks in
    /// the run keep their addresses and contents; only the physical memory changes.
    pub(super) fn make_shareable(
        &mut self,
        dev: usize,
        run: u64,
        len: u64,
        access: &[(i32, u32)],
    ) -> Result<(), Fault> {
        let drv = Arc::clone(&self.drv);
        let gpu = self.gpu_of(dev as u64)?;
        let size = to_usize(len)?;
        let props = AllocProps {
            device: gpu,
            handle_types: HANDLE_TYPE_POSIX_FD,
            ..AllocProps::default()
        };
        drv.ctx_synchronize().map_err(on(dev))?;
        let fresh = drv.mem_create(size, &props).map_err(on(dev))?;
        let aside = match drv.mem_address_reserve(size, 0, 0) {
            Ok(va) => va,
            Err(e) => {
                let _ = drv.mem_release(fresh);
                return Err(on(dev)(e));
            }
        };
        let undo_aside = |mapped: bool| {
            if mapped {
                let _ = drv.mem_unmap(aside, size);
            }
            let _ = drv.mem_address_free(aside, size);
            let _ = drv.mem_release(fresh);
        };
        if let Err(e) = drv.mem_map(aside, size, 0, fresh) {
            undo_aside(false);
            return Err(on(dev)(e));
        }
        let copied = drv
            .mem_set_access(aside, size, access)
            .and_then(|()| drv.memcpy_dtod(aside, run, size, NULL_STREAM))
            .and_then(|()| drv.ctx_synchronize());
        if let Err(e) = copied {
            undo_aside(true);
            return Err(on(dev)(e));
        }
        // From here the run's old memory goes: the new one must take its place.
        let _ = drv.mem_unmap(aside, size);
        let _ = drv.mem_address_free(aside, size);
        let swapped = drv
            .mem_unmap(run, size)
            .and_then(|()| drv.mem_map(run, size, 0, fresh))
            .and_then(|()| drv.mem_set_access(run, size, access));
        let _ = drv.mem_release(fresh);
        swapped.map_err(|e| {
            warn!(
                session = self.id,
                dev,
                run = format_args!("{run:#x}"),
                error = ?e,
                "moving a run to shareable memory failed after its old memory was unmapped"
            );
            on(dev)(e)
        })
    }

    /// `IpcExport` of `kind` for guest device `device`: `arg` is a device pointer
    /// (`IPC_KIND_MEMORY`) or an allocation handle (`IPC_KIND_VMM`). The error is the answer.
    pub fn ipc_export(
        &mut self,
        device: u32,
        kind: u64,
        arg: u64,
    ) -> Result<IpcExported, ResponseHeader> {
        let r = self.export(device, kind, arg);
        r.map_err(|f| self.ipc_answer(Op::IpcExport, Err(f)))
    }

    fn export(&mut self, device: u32, kind: u64, arg: u64) -> Result<IpcExported, Fault> {
        if let Some(s) = self.host.unavailable() {
            return Err(s.into());
        }
        if self.paused.is_some() {
            self.resume().map_err(|_| Fault::Status(status::UNKNOWN))?;
        }
        let dev = device as usize;
        match kind {
            IPC_KIND_MEMORY => {
                // cuIpcGetMemHandle: any pointer inside an allocation of the current context.
                if !self.bind_existing(dev)? {
                    return Err(invalid());
                }
                let ctx = self.context(dev)?;
                let (base, size) = ctx.memory.allocation_at(arg).ok_or_else(invalid)?;
                let range = ctx.range.as_ref().ok_or(status::NOT_SUPPORTED)?;
                let (run, run_len) = range.arena.run_at(base).ok_or_else(invalid)?;
                if base + size > run + run_len {
                    return Err(invalid());
                }
                let access = range.access.clone();
                let raw = self.drv.mem_retain_handle(run).map_err(on(dev))?;
                let shareable = self
                    .drv
                    .mem_handle_props(raw)
                    .is_ok_and(|p| p.handle_types & HANDLE_TYPE_POSIX_FD != 0);
                let _ = self.drv.mem_release(raw);
                if !shareable {
                    self.make_shareable(dev, run, run_len, &access)?;
                }
                let raw = self.drv.mem_retain_handle(run).map_err(on(dev))?;
                let fd = self.drv.mem_export_fd(raw);
                let _ = self.drv.mem_release(raw);
                self.ipc.exported = true;
                Ok(IpcExported {
                    fd: fd.map_err(on(dev))?,
                    meta: [base - run, size, run_len],
                })
            }
            IPC_KIND_POOL => {
                let (dev, raw) = self.pool(arg)?;
                if self.ipc.pools.contains(&arg) {
                    // Not this process's to give away.
                    return Err(invalid());
                }
                let fd = self.drv.mem_pool_export_fd(raw).map_err(on(dev))?;
                self.ipc.exported = true;
                Ok(IpcExported { fd, meta: [0; 3] })
            }
            IPC_KIND_EVENT => {
                // cuIpcGetEventHandle: the event was made interprocess, without timing.
                let e = self
                    .events
                    .get(arg)
                    .ok_or(status::INVALID_RESOURCE_HANDLE)?;
                let (dev, raw, flags) = (e.dev, e.raw, e.flags);
                if flags & IPC_EVENT_FLAGS != IPC_EVENT_FLAGS || self.ipc.events.contains(&arg) {
                    return Err(Fault::Status(status::INVALID_RESOURCE_HANDLE));
                }
                self.bind(dev)?;
                let bytes = self.drv.ipc_event_handle(raw).map_err(on(dev))?;
                let fd =
                    bytes_file(&bytes).map_err(|_| Fault::Status(status::MEMORY_ALLOCATION))?;
                self.ipc.exported = true;
                Ok(IpcExported { fd, meta: [0; 3] })
            }
            IPC_KIND_VMM => {
                let h = self.vmm.handle_raw(arg).ok_or_else(invalid)?;
                let dev = self.vmm_dev_of(arg)?;
                let size = self.vmm.handle_size(arg);
                self.bind(dev)?;
                let fd = self.drv.mem_export_fd(h).map_err(on(dev))?;
                self.ipc.exported = true;
                Ok(IpcExported {
                    fd,
                    meta: [0, size, 0],
                })
            }
            _ => Err(invalid()),
        }
    }

    /// `IpcImport` of `kind` on guest device `device` of the descriptor `fd` an exporter made,
    /// with the exporter's `meta`; `flags` as the guest gave them.
    pub fn ipc_import(
        &mut self,
        device: u32,
        kind: u64,
        fd: BorrowedFd<'_>,
        meta: [u64; 3],
        flags: u64,
    ) -> ResponseHeader {
        let r = self.import(device, kind, fd, meta, flags);
        self.ipc_answer(Op::IpcImport, r)
    }

    fn import(
        &mut self,
        device: u32,
        kind: u64,
        fd: BorrowedFd<'_>,
        meta: [u64; 3],
        flags: u64,
    ) -> OpResult {
        if let Some(s) = self.host.unavailable() {
            return Err(s.into());
        }
        if self.paused.is_some() {
            self.resume().map_err(|_| Fault::Status(status::UNKNOWN))?;
        }
        let dev = device as usize;
        if dev >= self.devices.len() {
            return Err(status::INVALID_DEVICE.into());
        }
        match kind {
            IPC_KIND_MEMORY => {
                if flags & !IPC_LAZY_ENABLE_PEER_ACCESS != 0 {
                    return Err(invalid());
                }
                let [offset, size, len] = meta;
                let end = offset.checked_add(size).ok_or_else(invalid)?;
                if size == 0 || end > len || self.ipc.open.len() >= MAX_IPC_OPEN {
                    return Err(invalid());
                }
                let gpu = self.gpu_of(dev as u64)?;
                self.bind(dev)?;
                let drv = Arc::clone(&self.drv);
                self.charge_import(len)?;
                let raw = match drv.mem_import_fd(fd) {
                    Ok(raw) => raw,
                    Err(e) => {
                        self.uncharge_import(len);
                        return Err(on(dev)(e));
                    }
                };
                let owner = drv.mem_handle_props(raw).map(|p| p.device);
                let len_us = to_usize(len)?;
                let va = match drv.mem_address_reserve(len_us, 0, 0) {
                    Ok(va) => va,
                    Err(e) => {
                        let _ = drv.mem_release(raw);
                        self.uncharge_import(len);
                        return Err(on(dev)(e));
                    }
                };
                let mapped = drv.mem_map(va, len_us, 0, raw);
                let _ = drv.mem_release(raw);
                let mut access = vec![(gpu, ACCESS_READWRITE)];
                if let Ok(o) = owner {
                    if o != gpu {
                        access.push((o, ACCESS_READWRITE));
                    }
                }
                let m = IpcMapping { va, len, size, dev };
                if let Err(e) = mapped {
                    let _ = drv.mem_address_free(va, len_us);
                    self.uncharge_import(len);
                    return Err(on(dev)(e));
                }
                if let Err(e) = drv.mem_set_access(va, len_us, &access) {
                    unmap(drv.as_ref(), &m);
                    self.uncharge_import(len);
                    return Err(on(dev)(e));
                }
                self.ipc.open.insert(va + offset, m);
                ok_rets(&[va + offset, size])
            }
            IPC_KIND_EVENT => {
                if flags != 0 {
                    return Err(invalid());
                }
                let mut bytes = [0u8; 64];
                // SAFETY: reads at most 64 bytes into a live local buffer from a descriptor
                // borrowed for the call.
                let n = unsafe {
                    libc::pread(fd.as_raw_fd(), bytes.as_mut_ptr().cast(), bytes.len(), 0)
                };
                if usize::try_from(n).ok() != Some(bytes.len()) {
                    return Err(invalid());
                }
                self.bind(dev)?;
                if !self.events.has_room() {
                    return Err(status::MEMORY_ALLOCATION.into());
                }
                let raw = self.drv.ipc_open_event(&bytes).map_err(on(dev))?;
                let entry = EventEntry {
                    dev,
                    raw,
                    flags: IPC_EVENT_FLAGS,
                    recorded: true,
                };
                let Some(h) = self.events.insert(&mut self.ids, entry) else {
                    let _ = self.drv.event_destroy(raw);
                    return Err(status::MEMORY_ALLOCATION.into());
                };
                self.ipc.events.insert(h);
                ok_rets(&[h])
            }
            IPC_KIND_POOL => {
                if flags != 0 {
                    return Err(invalid());
                }
                self.bind(dev)?;
                if !self.pools.has_room() {
                    return Err(status::MEMORY_ALLOCATION.into());
                }
                let raw = self.drv.mem_pool_import_fd(fd).map_err(on(dev))?;
                let entry = PoolEntry {
                    shareable: true,
                    ..PoolEntry::new(dev, raw, false, 0)
                };
                let Some(h) = self.pools.insert(&mut self.ids, entry) else {
                    let _ = self.drv.mem_pool_destroy(raw);
                    return Err(status::MEMORY_ALLOCATION.into());
                };
                self.ipc.pools.insert(h);
                ok_rets(&[h])
            }
            IPC_KIND_VMM => {
                if flags != 0 {
                    return Err(invalid());
                }
                self.bind(dev)?;
                let drv = Arc::clone(&self.drv);
                let size = meta[1];
                self.charge_import(size)?;
                let raw = match drv.mem_import_fd(fd) {
                    Ok(raw) => raw,
                    Err(e) => {
                        self.uncharge_import(size);
                        return Err(on(dev)(e));
                    }
                };
                if self.vmm.quota_unset() {
                    self.vmm.set_quota(self.host.memory_quota());
                }
                // The allocation may live on a peer of `dev` (another process's GPU): the
                // session works on it in its context on `dev`, as the importing process does
                // natively, and makes no context on the owner. Its count goes back when the
                // session's last handle and mapping of it are gone.
                let id = self
                    .vmm
                    .adopt(&mut self.ids, drv.as_ref(), raw, dev, size)
                    .ok_or(status::MEMORY_ALLOCATION)?;
                ok_rets(&[id])
            }
            _ => Err(invalid()),
        }
    }

    /// `IpcClose`: args[0] = an address `IpcImport` gave. Waits for the device's work, as
    /// `cuIpcCloseMemHandle` does, then unmaps.
    pub(super) fn ipc_close(&mut self, req: &Request) -> OpResult {
        let ptr = req.header().args[0];
        let m = *self.ipc.open.get(&ptr).ok_or_else(invalid)?;
        self.bind(m.dev)?;
        self.drv.ctx_synchronize().map_err(on(m.dev))?;
        self.ipc.open.remove(&ptr);
        unmap(self.drv.as_ref(), &m);
        self.uncharge_import(m.len);
        ok()
    }
}

impl GpuState {
    /// `MemPoolExportPointer`: args[0] = a stream-ordered allocation of the session.
    pub(super) fn pool_export_pointer(&mut self, req: &Request) -> OpResult {
        let ptr = req.header().args[0];
        let out = req.outputs().first().ok_or_else(invalid)?;
        if out.len() != POOL_PTR_EXPORT_LEN {
            return Err(invalid());
        }
        let dev = self
            .devices
            .iter()
            .position(|d| {
                d.as_ref()
                    .is_some_and(|c| c.memory.stream_ordered().contains(&ptr))
            })
            .ok_or_else(invalid)?;
        self.bind(dev)?;
        let data = self.drv.mem_pool_export_pointer(ptr).map_err(on(dev))?;
        out.write_at(0, &data).map_err(|_| invalid())?;
        self.ipc.exported = true;
        ok()
    }

    /// `MemPoolImportPointer`: args[0] = a pool the session imported, in-buffer 0 the record.
    pub(super) fn pool_import_pointer(&mut self, req: &Request) -> OpResult {
        let pool = req.header().args[0];
        if !self.ipc.pools.contains(&pool) {
            return Err(invalid());
        }
        let input = req.inputs().first().ok_or_else(invalid)?;
        let bytes = input.to_vec().map_err(|_| invalid())?;
        let data: [u8; POOL_PTR_EXPORT_LEN] = bytes.try_into().map_err(|_| invalid())?;
        let (dev, raw) = self.pool(pool)?;
        let ptr = self
            .drv
            .mem_pool_import_pointer(raw, &data)
            .map_err(on(dev))?;
        let size = match self.drv.mem_address_range(ptr) {
            Ok((base, size)) if base == ptr && size > 0 => size as u64,
            _ => {
                let _ = self.drv.mem_free_async(ptr, NULL_STREAM);
                return Err(invalid());
            }
        };
        if let Err(f) = self.charge_import(size) {
            let _ = self.drv.mem_free_async(ptr, NULL_STREAM);
            return Err(f);
        }
        self.ipc.pool_pointers.insert(ptr, size);
        ok_rets(&[ptr, size])
    }
}

/// A memory file holding `bytes` (how a driver's event handle travels to the daemon, which
/// only carries descriptors).
fn bytes_file(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain system call with a static name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"qcuda-ipc-event".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this descriptor; nothing else owns it.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: writes `bytes`, a live slice, to the descriptor owned above.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
    if usize::try_from(n).ok() != Some(bytes.len()) {
        return Err(std::io::Error::other("short write"));
    }
    Ok(fd)
}

fn invalid() -> Fault {
    Fault::Status(status::INVALID_VALUE)
}

//! Virtual memory management in the session: the guest's `cuMemCreate`, `cuMemAddressReserve`,
//! `cuMemMap`, `cuMemSetAccess` and friends, over the driver's own calls (`driver/vmm.rs`).
//!
//! Physical allocations are session-local handles (a retained handle is a new one of the same
//! allocation); reservations and mappings are the driver's real addresses, so pointers into
//! mapped memory are device pointers like any other. Everything is checked against what this
//! session made: a handle must be the session's, a mapping must lie inside one of its
//! reservations, and access, unmapping and freeing name only its own mappings and reservations.
//! Mapped memory that has access set joins the ranges copies and memsets may touch
//! (`VmmTables::holds`). The allocations count against the VM's device-memory quota from
//! creation until the driver frees them (the last handle released and the last mapping gone).
//! Dropping the session unmaps, frees and releases everything it still holds.

use std::collections::HashMap;

use qcuda_proto::{VMM_FLAGS, VMM_FLAG_COMPRESSED, VMM_FLAG_RDMA_CAPABLE, VMM_HANDLE_POSIX_FD};

use super::*;
use crate::cuda::driver::vmm::{AllocProps, MemHandle, ACCESS_NONE};

/// Most reservations a session may hold.
const MAX_RESERVATIONS: usize = 1 << 14;
/// Most mappings a session may hold.
const MAX_MAPPINGS: usize = 1 << 16;
/// Most access descriptors one MemSetAccess may carry.
const MAX_ACCESS: usize = 64;

/// `VMM_FLAG_*` bits of allocation properties.
fn prop_flags(p: &AllocProps) -> u64 {
    let mut f = 0;
    if p.compressed {
        f |= VMM_FLAG_COMPRESSED;
    }
    if p.rdma_capable {
        f |= VMM_FLAG_RDMA_CAPABLE;
    }
    f
}

impl GpuState {
    /// The allocation properties of args `[types, flags, usage]` for device `dev`.
    fn alloc_props(&self, dev: usize, args: &[u64]) -> Result<AllocProps, Fault> {
        let [types, flags, usage] = [args[0], args[1], args[2]];
        if types & !VMM_HANDLE_POSIX_FD != 0 || flags & !VMM_FLAGS != 0 {
            return Err(status::INVALID_VALUE.into());
        }
        Ok(AllocProps {
            device: self.gpu_of(dev as u64)?,
            handle_types: u32::try_from(types).map_err(|_| status::INVALID_VALUE)?,
            compressed: flags & VMM_FLAG_COMPRESSED != 0,
            rdma_capable: flags & VMM_FLAG_RDMA_CAPABLE != 0,
            usage: u16::try_from(usage).map_err(|_| status::INVALID_VALUE)?,
        })
    }

    /// The VMM ops (`qcuda_proto::vmm_ops!`).
    pub(super) fn vmm_op(&mut self, req: &Request) -> OpResult {
        let args = req.header().args;
        match req.op() {
            Op::MemCreate => self.mem_create(req),
            Op::MemRelease => self.mem_release(args[0]),
            Op::MemAddressReserve => self.mem_address_reserve(req),
            Op::MemAddressFree => self.mem_address_free(req),
            Op::MemMap => self.mem_map(req),
            Op::MemUnmap => self.mem_unmap(req),
            Op::MemSetAccess => self.mem_set_access(req),
            Op::MemGetAccess => {
                let (ptr, ordinal) = (args[0], args[1]);
                let (_, m) = self.vmm.mapping_at(ptr).ok_or(status::INVALID_VALUE)?;
                let dev = self.phys_dev(m.phys)?;
                let gpu = self.gpu_of(ordinal)?;
                self.bind(dev)?;
                let flags = self.drv.mem_get_access(ptr, gpu).map_err(on(dev))?;
                ok_rets(&[u64::from(flags)])
            }
            Op::MemGetGranularity => {
                let dev = self.bind_new(req)?;
                let props = self.alloc_props(dev, &args[1..4])?;
                let recommended = match args[0] {
                    0 => false,
                    1 => true,
                    _ => return Err(status::INVALID_VALUE.into()),
                };
                let g = self
                    .drv
                    .mem_granularity(&props, recommended)
                    .map_err(on(dev))?;
                ok_rets(&[g as u64])
            }
            Op::MemRetainHandle => {
                let (_, m) = self.vmm.mapping_at(args[0]).ok_or(status::INVALID_VALUE)?;
                let dev = self.phys_dev(m.phys)?;
                self.bind(dev)?;
                let raw = self.drv.mem_retain_handle(args[0]).map_err(on(dev))?;
                let drv = Arc::clone(&self.drv);
                let id = self
                    .vmm
                    .add_handle(&mut self.ids, drv.as_ref(), raw, m.phys)
                    .ok_or(status::MEMORY_ALLOCATION)?;
                ok_rets(&[id])
            }
            Op::MemHandleProperties => {
                let h = self.vmm.handles.get(args[0]).ok_or(status::INVALID_VALUE)?;
                let (raw, dev) = (h.raw(), self.phys_dev(h.phys)?);
                self.bind(dev)?;
                let p = self.drv.mem_handle_props(raw).map_err(on(dev))?;
                let ordinal = self
                    .host
                    .gpus
                    .iter()
                    .position(|g| g.dev == p.device)
                    .ok_or(status::UNKNOWN)?;
                ok_rets(&[
                    ordinal as u64,
                    u64::from(p.handle_types),
                    prop_flags(&p),
                    u64::from(p.usage),
                ])
            }
            Op::MemMappingRange => {
                let (va, m) = self.vmm.mapping_at(args[0]).ok_or(status::INVALID_VALUE)?;
                ok_rets(&[va, m.size])
            }
            _ => Err(status::NOT_SUPPORTED.into()),
        }
    }

    /// The guest device of the physical allocation behind allocation handle `id`.
    pub(super) fn vmm_dev_of(&self, id: u64) -> Result<usize, Fault> {
        let h = self.vmm.handles.get(id).ok_or(status::INVALID_VALUE)?;
        self.phys_dev(h.phys)
    }

    fn phys_dev(&self, phys: u64) -> Result<usize, Fault> {
        self.vmm
            .phys
            .get(&phys)
            .map(|p| p.dev)
            .ok_or(Fault::Status(status::UNKNOWN))
    }

    /// `MemCreate`: counted against the quota before the driver is asked.
    fn mem_create(&mut self, req: &Request) -> OpResult {
        let args = req.header().args;
        let dev = self.bind_new(req)?;
        let props = self.alloc_props(dev, &args[1..4])?;
        let size = args[0];
        if size == 0 {
            return Err(status::INVALID_VALUE.into());
        }
        if !self.vmm.handles.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        if self.vmm.quota.is_none() {
            self.vmm.quota = self.host.memory_quota();
        }
        if let Some(q) = &self.vmm.quota {
            if !q.reserve(size) {
                return Err(status::MEMORY_ALLOCATION.into());
            }
        }
        let raw = match self.drv.mem_create(to_usize(size)?, &props) {
            Ok(raw) => raw,
            Err(err) => {
                if let Some(q) = &self.vmm.quota {
                    q.release(size);
                }
                return Err(Fault::Driver { dev, err });
            }
        };
        let phys = self.vmm.new_phys(dev, size, props);
        let drv = Arc::clone(&self.drv);
        match self.vmm.add_handle(&mut self.ids, drv.as_ref(), raw, phys) {
            Some(id) => ok_rets(&[id]),
            None => {
                // Released by add_handle: the allocation is gone.
                if let Some(p) = self.vmm.phys.get_mut(&phys) {
                    p.refs = 1;
                }
                self.vmm.unref(phys);
                Err(status::MEMORY_ALLOCATION.into())
            }
        }
    }

    fn mem_release(&mut self, handle: u64) -> OpResult {
        let h = self.vmm.handles.get(handle).ok_or(status::INVALID_VALUE)?;
        let (raw, phys) = (h.raws[h.raws.len() - 1], h.phys);
        let dev = self.phys_dev(phys)?;
        self.drv.mem_release(raw).map_err(on(dev))?;
        let last = self.vmm.handles.get_mut(handle).is_some_and(|h| {
            h.raws.pop();
            h.raws.is_empty()
        });
        if last {
            self.vmm.handles.remove(handle);
        }
        self.vmm.unref(phys);
        ok()
    }

    fn mem_address_reserve(&mut self, req: &Request) -> OpResult {
        let [size, align, hint, ..] = req.header().args;
        let dev = self.bind_new(req)?;
        if size == 0 || self.vmm.reserved.len() >= MAX_RESERVATIONS {
            return Err(if size == 0 {
                status::INVALID_VALUE
            } else {
                status::MEMORY_ALLOCATION
            }
            .into());
        }
        let ptr = self
            .drv
            .mem_address_reserve(to_usize(size)?, to_usize(align)?, hint)
            .map_err(on(dev))?;
        let overlaps = self
            .vmm
            .reserved
            .range(..ptr.saturating_add(size))
            .next_back()
            .is_some_and(|(&b, &l)| b + l > ptr);
        if overlaps {
            let _ = self.drv.mem_address_free(ptr, to_usize(size)?);
            warn!(
                session = self.id,
                ptr, size, "driver returned an overlapping reservation"
            );
            return Err(status::UNKNOWN.into());
        }
        self.vmm.reserved.insert(ptr, size);
        ok_rets(&[ptr])
    }

    fn mem_address_free(&mut self, req: &Request) -> OpResult {
        let [ptr, size, ..] = req.header().args;
        if self.vmm.reserved.get(&ptr) != Some(&size) {
            return Err(status::INVALID_VALUE.into());
        }
        if self.vmm.maps.range(ptr..ptr + size).next().is_some() {
            // Still mapped: unmap first, as the driver requires.
            return Err(status::INVALID_VALUE.into());
        }
        self.drv
            .mem_address_free(ptr, to_usize(size)?)
            .map_err(on(0))?;
        self.vmm.reserved.remove(&ptr);
        ok()
    }

    fn mem_map(&mut self, req: &Request) -> OpResult {
        let [ptr, size, offset, handle, ..] = req.header().args;
        let h = self.vmm.handles.get(handle).ok_or(status::INVALID_VALUE)?;
        let (raw, phys) = (h.raw(), h.phys);
        if size == 0 || !self.vmm.in_reservation(ptr, size) {
            return Err(status::INVALID_VALUE.into());
        }
        let end = ptr + size;
        let overlaps = self
            .vmm
            .maps
            .range(..end)
            .next_back()
            .is_some_and(|(&va, m)| va + m.size > ptr);
        if overlaps || self.vmm.maps.len() >= MAX_MAPPINGS {
            return Err(status::INVALID_VALUE.into());
        }
        let dev = self.phys_dev(phys)?;
        self.bind(dev)?;
        self.drv
            .mem_map(ptr, to_usize(size)?, to_usize(offset)?, raw)
            .map_err(on(dev))?;
        self.vmm.maps.insert(
            ptr,
            Mapping {
                size,
                offset,
                phys,
                accessible: false,
            },
        );
        if let Some(p) = self.vmm.phys.get_mut(&phys) {
            p.refs += 1;
        }
        ok()
    }

    fn mem_unmap(&mut self, req: &Request) -> OpResult {
        let [ptr, size, ..] = req.header().args;
        let tiles = self.vmm.tiling(ptr, size).ok_or(status::INVALID_VALUE)?;
        for va in tiles {
            let Some(m) = self.vmm.maps.get(&va).copied() else {
                continue;
            };
            let dev = self.phys_dev(m.phys)?;
            // Work still queued may use the range: the driver unmaps at once, so wait as
            // cuMemUnmap's callers are told to.
            self.drv.mem_unmap(va, to_usize(m.size)?).map_err(on(dev))?;
            self.vmm.maps.remove(&va);
            self.vmm.unref(m.phys);
        }
        ok()
    }

    fn mem_set_access(&mut self, req: &Request) -> OpResult {
        let [ptr, size, ..] = req.header().args;
        let tiles = self.vmm.tiling(ptr, size).ok_or(status::INVALID_VALUE)?;
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        if buf.is_empty() || !buf.len().is_multiple_of(8) || buf.len() / 8 > MAX_ACCESS {
            return Err(status::INVALID_VALUE.into());
        }
        let bytes = buf.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let mut access = Vec::with_capacity(bytes.len() / 8);
        for rec in bytes.chunks_exact(8) {
            let ordinal = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
            let flags = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
            if !matches!(flags, 0 | 1 | 3) {
                return Err(status::INVALID_VALUE.into());
            }
            access.push((self.gpu_of(u64::from(ordinal))?, flags));
        }
        let first = self.vmm.maps.get(&ptr).ok_or(status::INVALID_VALUE)?.phys;
        let dev = self.phys_dev(first)?;
        self.bind(dev)?;
        self.drv
            .mem_set_access(ptr, to_usize(size)?, &access)
            .map_err(on(dev))?;
        let granted = access.iter().any(|&(_, f)| f != ACCESS_NONE);
        for va in tiles {
            if let Some(m) = self.vmm.maps.get_mut(&va) {
                m.accessible |= granted;
            }
        }
        ok()
    }
}

/// Capture and restore of the program's VMM objects (`checkpoint.rs` calls these): every
/// physical allocation with its properties, handle and contents, every reservation at its
/// address, every mapping with its offset and access.
mod saved {
    use super::*;
    use crate::cuda::{
        driver::vmm::ACCESS_READWRITE,
        gpu_state::CheckpointError,
        saved_state::{SavedVmmAllocation, SavedVmmMapping, SavedVmmReservation},
    };

    /// The program's VMM objects as saved: allocations, reservations, mappings.
    pub(in crate::cuda::gpu_state) type SavedVmm = (
        Vec<SavedVmmAllocation>,
        Vec<SavedVmmReservation>,
        Vec<SavedVmmMapping>,
    );

    fn mismatch(what: impl Into<String>) -> CheckpointError {
        CheckpointError::Mismatch(what.into())
    }

    fn dev_u32(dev: usize) -> u32 {
        u32::try_from(dev).unwrap_or(u32::MAX)
    }

    /// A physical allocation mapped whole, with access for `gpu`, at an address of its own for
    /// as long as it lives (to read or write its contents). Unmapped and freed when dropped.
    struct Window<'a> {
        drv: &'a dyn DriverApi,
        va: u64,
        size: usize,
        mapped: bool,
    }

    impl<'a> Window<'a> {
        fn open(
            drv: &'a dyn DriverApi,
            raw: MemHandle,
            size: usize,
            gpu: i32,
        ) -> Result<Self, CuError> {
            let va = drv.mem_address_reserve(size, 0, 0)?;
            let mut w = Window {
                drv,
                va,
                size,
                mapped: false,
            };
            drv.mem_map(va, size, 0, raw)?;
            w.mapped = true;
            drv.mem_set_access(va, size, &[(gpu, ACCESS_READWRITE)])?;
            Ok(w)
        }
    }

    impl Drop for Window<'_> {
        fn drop(&mut self) {
            if self.mapped {
                let _ = self.drv.mem_unmap(self.va, self.size);
            }
            let _ = self.drv.mem_address_free(self.va, self.size);
        }
    }

    impl GpuState {
        /// The program's VMM objects, with the contents of every physical allocation (read
        /// through a window of its own, so what no mapping shows is saved too).
        pub(in crate::cuda::gpu_state) fn capture_vmm(
            &mut self,
        ) -> Result<SavedVmm, CheckpointError> {
            let drv = Arc::clone(&self.drv);
            let mut phys: Vec<(u64, usize, u64, AllocProps)> = self
                .vmm
                .phys
                .iter()
                .map(|(&id, p)| (id, p.dev, p.size, p.props))
                .collect();
            phys.sort_unstable_by_key(|p| p.0);
            let mut allocations = Vec::with_capacity(phys.len());
            for (id, dev, size, props) in phys {
                if size == 0 {
                    return Err(CheckpointError::Unsupported(
                        "VMM memory the program did not create itself",
                    ));
                }
                let handle = self
                    .vmm
                    .handles
                    .find(|h| h.phys == id)
                    .map(|(h, e)| (h, e.raw(), e.raws.len()));
                self.bind(dev)?;
                // Without a handle, a mapping keeps it: take a reference from there.
                let (raw, retained) = match handle {
                    Some((_, raw, _)) => (raw, false),
                    None => {
                        let va = self
                            .vmm
                            .maps
                            .iter()
                            .find(|(_, m)| m.phys == id)
                            .map(|(&va, _)| va)
                            .ok_or_else(|| {
                                mismatch("an allocation with no handle and no mapping")
                            })?;
                        (drv.mem_retain_handle(va).map_err(on(dev))?, true)
                    }
                };
                // Through a mapping of it the program can reach, if any (the driver maps an
                // allocation whole), else through a window of its own.
                let mapped = self
                    .vmm
                    .maps
                    .iter()
                    .find(|(_, m)| m.phys == id && m.accessible && m.offset == 0 && m.size == size)
                    .map(|(&va, _)| va);
                let contents = if let Some(va) = mapped {
                    if retained {
                        let _ = drv.mem_release(raw);
                    }
                    self.read_device(dev, va, size)?
                } else {
                    let n = to_usize(size)?;
                    let read = Window::open(drv.as_ref(), raw, n, props.device)
                        .map_err(on(dev))
                        .map_err(CheckpointError::from)
                        .and_then(|w| self.read_device(dev, w.va, size));
                    if retained {
                        let _ = drv.mem_release(raw);
                    }
                    read?
                };
                allocations.push(SavedVmmAllocation {
                    id,
                    dev: dev_u32(dev),
                    size,
                    handle_types: props.handle_types,
                    compressed: props.compressed,
                    rdma_capable: props.rdma_capable,
                    usage: props.usage,
                    handle: handle.map_or(0, |h| h.0),
                    refs: handle.map_or(0, |h| h.2 as u64),
                    contents,
                });
            }
            let reservations = self
                .vmm
                .reserved
                .iter()
                .map(|(&va, &size)| SavedVmmReservation { va, size })
                .collect();
            let maps: Vec<(u64, Mapping)> = self.vmm.maps.iter().map(|(&v, &m)| (v, m)).collect();
            let mut mappings = Vec::with_capacity(maps.len());
            for (va, m) in maps {
                let dev = self.phys_dev(m.phys)?;
                self.bind(dev)?;
                let mut access = Vec::new();
                if m.accessible {
                    for ordinal in 0..self.devices.len() {
                        let gpu = self.gpu_of(ordinal as u64)?;
                        let flags = drv.mem_get_access(va, gpu).map_err(on(dev))?;
                        if flags != ACCESS_NONE {
                            access.push((dev_u32(ordinal), flags));
                        }
                    }
                }
                mappings.push(SavedVmmMapping {
                    va,
                    size: m.size,
                    offset: m.offset,
                    allocation: m.phys,
                    access,
                });
            }
            Ok((allocations, reservations, mappings))
        }

        /// Makes the saved VMM objects again: allocations created with their properties and
        /// contents under their handles, reservations at their addresses (refused if the driver
        /// places one elsewhere), mappings with their access. On an error, what was made is in
        /// the tables, for the state's teardown.
        pub(in crate::cuda::gpu_state) fn restore_vmm(
            &mut self,
            allocations: &[SavedVmmAllocation],
            reservations: &[SavedVmmReservation],
            mappings: &[SavedVmmMapping],
        ) -> Result<(), CheckpointError> {
            let drv = Arc::clone(&self.drv);
            if self.vmm.quota.is_none() {
                self.vmm.quota = self.host.memory_quota();
            }
            // Creation references of allocations that only mappings keep, released at the end.
            let mut unheld: Vec<(u64, MemHandle)> = Vec::new();
            let result = self.restore_vmm_inner(
                drv.as_ref(),
                allocations,
                reservations,
                mappings,
                &mut unheld,
            );
            for (phys, raw) in unheld {
                let _ = drv.mem_release(raw);
                self.vmm.unref(phys);
            }
            result
        }

        fn restore_vmm_inner(
            &mut self,
            drv: &dyn DriverApi,
            allocations: &[SavedVmmAllocation],
            reservations: &[SavedVmmReservation],
            mappings: &[SavedVmmMapping],
            unheld: &mut Vec<(u64, MemHandle)>,
        ) -> Result<(), CheckpointError> {
            let mut raws: HashMap<u64, MemHandle> = HashMap::new();
            for a in allocations {
                let dev = usize::try_from(a.dev)
                    .ok()
                    .filter(|&d| d < self.devices.len())
                    .ok_or_else(|| mismatch(format!("VMM allocation on device {}", a.dev)))?;
                let refs = usize::try_from(a.refs).unwrap_or(usize::MAX);
                if a.id == 0
                    || self.vmm.phys.contains_key(&a.id)
                    || a.contents.len() as u64 != a.size
                    || a.size == 0
                    || (a.handle == 0) != (refs == 0)
                    || refs > MAX_HANDLE_REFS
                    || u64::from(a.handle_types) & !VMM_HANDLE_POSIX_FD != 0
                {
                    return Err(mismatch(format!("VMM allocation {}", a.id)));
                }
                self.bind(dev)?;
                let props = AllocProps {
                    device: self.gpu_of(dev as u64)?,
                    handle_types: a.handle_types,
                    compressed: a.compressed,
                    rdma_capable: a.rdma_capable,
                    usage: a.usage,
                };
                if let Some(q) = &self.vmm.quota {
                    if !q.reserve(a.size) {
                        return Err(CheckpointError::Cuda(status::MEMORY_ALLOCATION));
                    }
                }
                let size = to_usize(a.size)?;
                let raw = match drv.mem_create(size, &props) {
                    Ok(raw) => raw,
                    Err(e) => {
                        if let Some(q) = &self.vmm.quota {
                            q.release(a.size);
                        }
                        return Err(on(dev)(e).into());
                    }
                };
                self.vmm.phys.insert(
                    a.id,
                    Phys {
                        dev,
                        charged: a.size,
                        refs: 1,
                        size: a.size,
                        props,
                    },
                );
                self.vmm.next_phys = self.vmm.next_phys.max(a.id);
                let mut held = vec![raw];
                let filled = Window::open(drv, raw, size, props.device)
                    .map_err(on(dev))
                    .map_err(CheckpointError::from)
                    .and_then(|w| {
                        self.write_device(dev, w.va, &a.contents)?;
                        // The handle's other references, as the program retained them.
                        while held.len() < refs {
                            held.push(drv.mem_retain_handle(w.va).map_err(on(dev))?);
                        }
                        Ok(())
                    });
                if a.handle == 0 {
                    unheld.push((a.id, raw));
                } else {
                    let entry = HandleEntry {
                        raws: held.clone(),
                        phys: a.id,
                    };
                    if let Some(p) = self.vmm.phys.get_mut(&a.id) {
                        p.refs = held.len();
                    }
                    if !self.vmm.handles.insert_at(&self.ids, a.handle, entry) {
                        for r in held {
                            let _ = drv.mem_release(r);
                            self.vmm.unref(a.id);
                        }
                        return Err(mismatch(format!("VMM handle {}", a.handle)));
                    }
                }
                raws.insert(a.id, raw);
                filled?;
            }
            let first = (0..self.devices.len())
                .find(|&d| matches!(self.devices.get(d), Some(Some(_))))
                .unwrap_or(0);
            for r in reservations {
                let overlaps = self
                    .vmm
                    .reserved
                    .range(..r.va.saturating_add(r.size))
                    .next_back()
                    .is_some_and(|(&b, &l)| b + l > r.va);
                if r.size == 0
                    || r.va == 0
                    || overlaps
                    || self.vmm.reserved.len() >= MAX_RESERVATIONS
                {
                    return Err(mismatch(format!("VMM reservation {:#x}", r.va)));
                }
                self.bind(first)?;
                let size = to_usize(r.size)?;
                let got = drv.mem_address_reserve(size, 0, r.va).map_err(on(first))?;
                if got != r.va {
                    let _ = drv.mem_address_free(got, size);
                    return Err(mismatch(format!(
                        "the program's reservation at {:#x} ({} bytes) was placed at {got:#x}",
                        r.va, r.size
                    )));
                }
                self.vmm.reserved.insert(r.va, r.size);
            }
            for m in mappings {
                let (raw, dev, psize) =
                    match (raws.get(&m.allocation), self.vmm.phys.get(&m.allocation)) {
                        (Some(&raw), Some(p)) => (raw, p.dev, p.size),
                        _ => return Err(mismatch(format!("mapping {:#x}", m.va))),
                    };
                let overlaps = self
                    .vmm
                    .maps
                    .range(..m.va.saturating_add(m.size))
                    .next_back()
                    .is_some_and(|(&va, x)| va + x.size > m.va);
                let fits = m.offset.checked_add(m.size).is_some_and(|e| e <= psize);
                if m.size == 0
                    || !fits
                    || overlaps
                    || !self.vmm.in_reservation(m.va, m.size)
                    || self.vmm.maps.len() >= MAX_MAPPINGS
                    || m.access.len() > MAX_ACCESS
                {
                    return Err(mismatch(format!("mapping {:#x}", m.va)));
                }
                self.bind(dev)?;
                drv.mem_map(m.va, to_usize(m.size)?, to_usize(m.offset)?, raw)
                    .map_err(on(dev))?;
                self.vmm.maps.insert(
                    m.va,
                    Mapping {
                        size: m.size,
                        offset: m.offset,
                        phys: m.allocation,
                        accessible: false,
                    },
                );
                if let Some(p) = self.vmm.phys.get_mut(&m.allocation) {
                    p.refs += 1;
                }
                let mut access = Vec::with_capacity(m.access.len());
                for &(ordinal, flags) in &m.access {
                    if !matches!(flags, 1 | 3) {
                        return Err(mismatch(format!("mapping {:#x}'s access", m.va)));
                    }
                    let gpu = self
                        .gpu_of(u64::from(ordinal))
                        .map_err(|_| mismatch(format!("mapping {:#x}'s access", m.va)))?;
                    access.push((gpu, flags));
                }
                if !access.is_empty() {
                    drv.mem_set_access(m.va, to_usize(m.size)?, &access)
                        .map_err(on(dev))?;
                    if let Some(x) = self.vmm.maps.get_mut(&m.va) {
                        x.accessible = true;
                    }
                }
            }
            Ok(())
        }
    }
}

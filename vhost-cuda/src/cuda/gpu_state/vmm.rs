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

use std::collections::{BTreeMap, HashMap};

use qcuda_proto::{VMM_FLAGS, VMM_FLAG_COMPRESSED, VMM_FLAG_RDMA_CAPABLE, VMM_HANDLE_POSIX_FD};

use super::*;
use crate::{
    cuda::driver::vmm::{AllocProps, MemHandle, ACCESS_NONE},
    limits::QuotaSlot,
};

/// Most allocation handles a session may hold.
const MAX_VMM_HANDLES: usize = 1 << 16;
/// Most reservations a session may hold.
const MAX_RESERVATIONS: usize = 1 << 14;
/// Most mappings a session may hold.
const MAX_MAPPINGS: usize = 1 << 16;
/// Most access descriptors one MemSetAccess may carry.
const MAX_ACCESS: usize = 64;

/// Most references one handle may count (`cuMemRetainAllocationHandle` of a mapping of it).
const MAX_HANDLE_REFS: usize = 1 << 16;

/// A handle of the session: the references it holds of a physical allocation. As natively, a
/// handle retained from a mapping is the same value as the handle the allocation already has,
/// one reference more, and each `cuMemRelease` of it drops one (NCCL releases a retained handle
/// and then the original, by the same value).
#[derive(Debug)]
struct HandleEntry {
    /// The driver's references, each released once; never empty.
    raws: Vec<MemHandle>,
    phys: u64,
}

impl HandleEntry {
    fn raw(&self) -> MemHandle {
        self.raws[0]
    }
}

/// A physical allocation the session holds handles of or has mapped.
#[derive(Debug)]
struct Phys {
    /// Guest ordinal of the device holding it.
    dev: usize,
    /// Bytes counted against the quota (0 for what the session did not create).
    charged: u64,
    /// Handles plus mappings: the driver frees it when this reaches 0.
    refs: usize,
}

#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: u64,
    phys: u64,
    /// Access has been granted to some device: copies may touch it.
    accessible: bool,
}

/// The session's VMM objects.
#[derive(Debug)]
pub(super) struct VmmTables {
    handles: HandleTable<HandleEntry>,
    phys: HashMap<u64, Phys>,
    next_phys: u64,
    /// Reservations: base -> size.
    reserved: BTreeMap<u64, u64>,
    /// Mappings: address -> mapping.
    maps: BTreeMap<u64, Mapping>,
    quota: Option<Arc<QuotaSlot>>,
}

impl Default for VmmTables {
    fn default() -> Self {
        Self {
            handles: HandleTable::new(MAX_VMM_HANDLES),
            phys: HashMap::new(),
            next_phys: 0,
            reserved: BTreeMap::new(),
            maps: BTreeMap::new(),
            quota: None,
        }
    }
}

impl VmmTables {
    /// True if the program holds no physical allocation, reservation or mapping of its own.
    pub(super) fn is_empty(&self) -> bool {
        self.handles.len() == 0
            && self.phys.is_empty()
            && self.reserved.is_empty()
            && self.maps.is_empty()
    }

    /// Whether `ptr..ptr + len` is mapped memory of the session with access set, over one or
    /// more adjacent mappings.
    pub(super) fn holds(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let Some((&va, m)) = self.maps.range(..=ptr).next_back() else {
            return false;
        };
        if !m.accessible || va + m.size <= ptr {
            return false;
        }
        let mut reached = va + m.size;
        while reached < end {
            match self.maps.get(&reached) {
                Some(m) if m.accessible => reached += m.size,
                _ => return false,
            }
        }
        true
    }

    /// The mapping holding `ptr`, with its address.
    fn mapping_at(&self, ptr: u64) -> Option<(u64, Mapping)> {
        let (&va, &m) = self.maps.range(..=ptr).next_back()?;
        (ptr < va + m.size).then_some((va, m))
    }

    /// The addresses of the mappings that tile `ptr..ptr + size` exactly.
    fn tiling(&self, ptr: u64, size: u64) -> Option<Vec<u64>> {
        let end = ptr.checked_add(size).filter(|_| size > 0)?;
        let mut at = ptr;
        let mut out = Vec::new();
        while at < end {
            let m = self.maps.get(&at)?;
            out.push(at);
            at += m.size;
        }
        (at == end).then_some(out)
    }

    /// Whether `ptr..ptr + size` lies in one reservation.
    fn in_reservation(&self, ptr: u64, size: u64) -> bool {
        let Some(end) = ptr.checked_add(size) else {
            return false;
        };
        self.reserved
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &l)| end <= b + l)
    }

    /// Takes one reference of `phys` away; at the last, the driver freed it: the quota gets its
    /// bytes back.
    fn unref(&mut self, phys: u64) {
        let gone = self.phys.get_mut(&phys).is_some_and(|p| {
            p.refs -= 1;
            p.refs == 0
        });
        if gone {
            if let (Some(p), Some(q)) = (self.phys.remove(&phys), &self.quota) {
                q.release(p.charged);
            }
        }
    }

    fn new_phys(&mut self, dev: usize, charged: u64) -> u64 {
        self.next_phys += 1;
        self.phys.insert(
            self.next_phys,
            Phys {
                dev,
                charged,
                refs: 0,
            },
        );
        self.next_phys
    }

    /// Adds a reference `raw` of `phys`: to the session's handle of it if it has one, else as
    /// a new handle. `None` (and the reference released) if the table or the count is full.
    fn add_handle(
        &mut self,
        ids: &mut HandleCounter,
        drv: &dyn DriverApi,
        raw: MemHandle,
        phys: u64,
    ) -> Option<u64> {
        let existing = self.handles.find(|h| h.phys == phys).map(|(id, _)| id);
        let id = match existing {
            Some(id) => match self.handles.get_mut(id) {
                Some(h) if h.raws.len() < MAX_HANDLE_REFS => {
                    h.raws.push(raw);
                    Some(id)
                }
                _ => None,
            },
            None => self.handles.insert(
                ids,
                HandleEntry {
                    raws: vec![raw],
                    phys,
                },
            ),
        };
        let Some(id) = id else {
            let _ = drv.mem_release(raw);
            return None;
        };
        if let Some(p) = self.phys.get_mut(&phys) {
            p.refs += 1;
        }
        Some(id)
    }

    /// The driver's handle behind the session's allocation handle `id`.
    pub(super) fn handle_raw(&self, id: u64) -> Option<MemHandle> {
        self.handles.get(id).map(HandleEntry::raw)
    }

    /// A handle of an allocation another process made (imported, `ipc.rs`): a physical
    /// allocation of its own, worked on in the context of guest device `dev` (the importer's;
    /// the memory may be a peer's), `charged` bytes already counted for it against the quota
    /// (given back when the driver frees it here). `None` (and `raw`
    /// released) if the table is full.
    pub(super) fn adopt(
        &mut self,
        ids: &mut HandleCounter,
        drv: &dyn DriverApi,
        raw: MemHandle,
        dev: usize,
        charged: u64,
    ) -> Option<u64> {
        let phys = self.new_phys(dev, charged);
        let id = self.add_handle(ids, drv, raw, phys);
        if id.is_none() {
            // Released by add_handle: the count goes back with it.
            if let Some(p) = self.phys.get_mut(&phys) {
                p.refs = 1;
            }
            self.unref(phys);
        }
        id
    }

    /// Bytes counted for the allocation behind handle `id` (its size, for what the session
    /// created or imported with a size).
    pub(super) fn handle_size(&self, id: u64) -> u64 {
        self.handles
            .get(id)
            .and_then(|h| self.phys.get(&h.phys))
            .map_or(0, |p| p.charged)
    }

    /// Whether the quota slot has not been looked up yet.
    pub(super) fn quota_unset(&self) -> bool {
        self.quota.is_none()
    }

    /// The quota slot imports and creations count against.
    pub(super) fn set_quota(&mut self, quota: Option<Arc<QuotaSlot>>) {
        self.quota = quota;
    }

    /// Unmaps, frees and releases everything (the session ends), and gives the quota back.
    /// Best effort: the worker's exit frees whatever the driver refuses now. With a sticky
    /// error (`driver` None) the corrupted driver is not called at all.
    pub(super) fn release_all(&mut self, driver: Option<&dyn DriverApi>) {
        for (va, m) in std::mem::take(&mut self.maps) {
            if let Some(drv) = driver {
                let _ = drv.mem_unmap(va, to_usize(m.size).unwrap_or(usize::MAX));
            }
            self.unref(m.phys);
        }
        for (va, size) in std::mem::take(&mut self.reserved) {
            if let Some(drv) = driver {
                let _ = drv.mem_address_free(va, to_usize(size).unwrap_or(usize::MAX));
            }
        }
        let mut handles = Vec::new();
        self.handles.retain(|h| {
            handles.extend(h.raws.iter().map(|&r| (r, h.phys)));
            false
        });
        for (raw, phys) in handles {
            if let Some(drv) = driver {
                let _ = drv.mem_release(raw);
            }
            self.unref(phys);
        }
    }
}

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
        let phys = self.vmm.new_phys(dev, size);
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

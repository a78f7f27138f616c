//! The fake driver's virtual memory management: physical allocations are byte vectors with a
//! reference count, reservations are address ranges in a window of their own, and a mapping
//! becomes device memory of the current context (so copies and kernels reach it) once access
//! is set, as the driver makes it reachable only then. The bytes go back to the physical
//! allocation when the mapping is unmapped, so a second mapping of the same allocation, in this
//! process or after an export and import, sees what the first one wrote. Shareable handles are
//! memfds, known by inode. Checks what the real driver checks that the session relies on: the
//! granularity, ranges inside one reservation, no double mapping, live handles.

use std::{
    collections::{BTreeMap, HashMap},
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

use super::{
    super::{
        vmm::{AllocProps, MemHandle, VmmDriverApi, ACCESS_NONE, HANDLE_TYPE_POSIX_FD},
        CuError, CuResult, Event, MemPool,
    },
    fresh, FakeDriver, FakePool, INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, OUT_OF_MEMORY,
};

/// CUDA_ERROR_NOT_SUPPORTED.
const NOT_SUPPORTED: CuError = CuError(801);

/// The fake's allocation granularity (minimum and recommended), as an H100's.
pub(crate) const GRANULARITY: usize = 2 << 20;
/// Where the fake places reservations asked for without a hint: apart from every context's
/// allocations.
const RESERVE_BASE: u64 = 0x6000_0000_0000;
/// The virtual address space the fake manages, where it honours a hint: from 64 TiB to the end
/// of the sessions' space (`device_arena::VA_END`). NVIDIA's driver honoured hints for qcuda's
/// session ranges there (`--gpu-va-base`, 0x6800_0000_0000 by default) and did not place
/// managed memory at the host-mapping window's addresses (32 TiB), below it.
const DRIVER_VA: std::ops::Range<u64> = 0x4000_0000_0000..0x7800_0000_0000;
/// CUDA_ERROR_NOT_PERMITTED.
const NOT_PERMITTED: CuError = CuError(800);

#[derive(Debug)]
struct Phys {
    props: AllocProps,
    bytes: Vec<u8>,
    /// Handles held (create, retain, import) plus mappings alive: freed at 0.
    refs: usize,
    /// Inode of its exported memfd, once exported.
    exported: Option<u64>,
}

#[derive(Debug, Clone)]
struct Mapping {
    size: usize,
    phys: u64,
    offset: usize,
    /// CUdevice -> ACCESS_* flags.
    access: HashMap<i32, u32>,
    /// The context whose memory holds the bytes while access is set.
    ctx: Option<super::Raw>,
}

/// The VMM state of the fake driver (process-wide, as the driver's is).
#[derive(Debug, Default)]
pub(crate) struct FakeVmm {
    /// Physical allocations by id.
    phys: HashMap<u64, Phys>,
    /// Handle -> physical allocation (a handle is a counted reference).
    handles: HashMap<super::Raw, u64>,
    /// Reservations: base -> size.
    reserved: BTreeMap<u64, usize>,
    next_reserve: u64,
    /// Mappings: address -> mapping.
    maps: BTreeMap<u64, Mapping>,
    /// memfd inode -> physical allocation.
    exports: HashMap<u64, u64>,
    /// memfd inode -> exported pool.
    pool_exports: HashMap<u64, super::Raw>,
    /// Address ranges something else of the process holds (base, length): a hint there is not
    /// honoured, as the real driver does not place a reservation over the process's mappings.
    occupied: Vec<(u64, u64)>,
}

impl FakeVmm {
    /// Bytes of the physical allocations.
    pub(super) fn phys_bytes(&self) -> u64 {
        self.phys.values().map(|p| p.bytes.len() as u64).sum()
    }

    fn handle(&self, h: MemHandle) -> CuResult<u64> {
        self.handles.get(&h.raw()).copied().ok_or(INVALID_VALUE)
    }

    /// Drops one reference of `phys`, freeing it at the last.
    fn unref(&mut self, phys: u64) {
        let gone = self.phys.get_mut(&phys).is_some_and(|p| {
            p.refs -= 1;
            p.refs == 0
        });
        if gone {
            if let Some(ino) = self.phys.remove(&phys).and_then(|p| p.exported) {
                self.exports.remove(&ino);
            }
        }
    }

    /// The mapping holding `ptr`, with its address.
    fn mapping_at(&self, ptr: u64) -> Option<(u64, &Mapping)> {
        let (&va, m) = self.maps.range(..=ptr).next_back()?;
        (ptr < va + m.size as u64).then_some((va, m))
    }

    /// Whether `ptr..ptr + size` lies in one reservation.
    fn in_reservation(&self, ptr: u64, size: usize) -> bool {
        self.reserved
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &l)| ptr.saturating_add(size as u64) <= b + l as u64)
    }
}

impl FakeDriver {
    /// Physical allocations alive (for assertions).
    pub(crate) fn vmm_allocations(&self) -> usize {
        self.st().vmm.phys.len()
    }

    /// Reservations and mappings alive (for assertions).
    pub(crate) fn vmm_ranges(&self) -> (usize, usize) {
        let st = self.st();
        (st.vmm.reserved.len(), st.vmm.maps.len())
    }

    /// Marks `[base, base + len)` as held by something else of the process (for tests of a
    /// placement the driver refuses).
    pub(crate) fn occupy_va(&self, base: u64, len: u64) {
        self.st().vmm.occupied.push((base, len));
    }

    /// Handles held (for assertions).
    pub(crate) fn vmm_handles(&self) -> usize {
        self.st().vmm.handles.len()
    }
}

fn check_granular(v: u64) -> CuResult<()> {
    if v.is_multiple_of(GRANULARITY as u64) {
        Ok(())
    } else {
        Err(INVALID_VALUE)
    }
}

impl VmmDriverApi for FakeDriver {
    fn mem_create(&self, size: usize, props: &AllocProps) -> CuResult<MemHandle> {
        let mut st = self.enter("mem_create")?;
        if size == 0 || props.handle_types & !HANDLE_TYPE_POSIX_FD != 0 {
            return Err(INVALID_VALUE);
        }
        check_granular(size as u64)?;
        if !(100..100 + self.gpus).contains(&props.device) {
            return Err(CuError(101));
        }
        if st.vmm.phys_bytes().saturating_add(size as u64) > super::TOTAL_MEM {
            return Err(OUT_OF_MEMORY);
        }
        self.check_ram(&st, size)?;
        let id = fresh(&mut st.next);
        st.vmm.phys.insert(
            id as u64,
            Phys {
                props: *props,
                bytes: vec![0; size],
                refs: 1,
                exported: None,
            },
        );
        st.vmm.handles.insert(id, id as u64);
        Ok(MemHandle::from_raw(id))
    }

    fn mem_release(&self, handle: MemHandle) -> CuResult<()> {
        let mut st = self.enter("mem_release")?;
        let phys = st.vmm.handles.remove(&handle.raw()).ok_or(INVALID_VALUE)?;
        st.vmm.unref(phys);
        Ok(())
    }

    fn mem_address_reserve(&self, size: usize, align: usize, hint: u64) -> CuResult<u64> {
        let mut st = self.enter("mem_address_reserve")?;
        if size == 0 || (align != 0 && !align.is_power_of_two()) {
            return Err(INVALID_VALUE);
        }
        check_granular(size as u64)?;
        let vmm = &mut st.vmm;
        let free = |vmm: &FakeVmm, at: u64| {
            // The address is only a hint: NVIDIA's driver need not place a reservation there.
            // The fake honours one only inside the range it manages itself, and only where that
            // is free (the stricter reading), so that nothing qcuda does depends on a hint
            // outside it being honoured.
            at >= DRIVER_VA.start
                && at.saturating_add(size as u64) <= DRIVER_VA.end
                && at.is_multiple_of(GRANULARITY as u64)
                && vmm
                    .reserved
                    .iter()
                    .map(|(&b, &l)| (b, l as u64))
                    .chain(vmm.occupied.iter().copied())
                    .all(|(b, l)| at + size as u64 <= b || b + l <= at)
        };
        let base = if hint != 0 && free(vmm, hint) {
            hint
        } else {
            // The next free range from where the last one ended.
            let align = (align as u64).max(GRANULARITY as u64);
            let mut b = (RESERVE_BASE + vmm.next_reserve).div_ceil(align) * align;
            while !free(vmm, b) {
                b = (b + GRANULARITY as u64).div_ceil(align) * align;
                if b + size as u64 > DRIVER_VA.end {
                    return Err(OUT_OF_MEMORY);
                }
            }
            vmm.next_reserve = b - RESERVE_BASE + size as u64 + GRANULARITY as u64;
            b
        };
        vmm.reserved.insert(base, size);
        Ok(base)
    }

    fn mem_address_free(&self, ptr: u64, size: usize) -> CuResult<()> {
        let mut st = self.enter("mem_address_free")?;
        if st.vmm.reserved.get(&ptr) != Some(&size) {
            return Err(INVALID_VALUE);
        }
        let end = ptr + size as u64;
        if st.vmm.maps.range(ptr..end).next().is_some() {
            // The driver refuses to free a range that still has mappings.
            return Err(INVALID_VALUE);
        }
        st.vmm.reserved.remove(&ptr);
        Ok(())
    }

    fn mem_map(&self, ptr: u64, size: usize, offset: usize, handle: MemHandle) -> CuResult<()> {
        let mut st = self.enter("mem_map")?;
        let vmm = &mut st.vmm;
        let phys = vmm.handle(handle)?;
        check_granular(ptr)?;
        check_granular(size as u64)?;
        check_granular(offset as u64)?;
        let len = vmm.phys.get(&phys).ok_or(INVALID_HANDLE)?.bytes.len();
        if size == 0 || offset.checked_add(size).is_none_or(|e| e > len) {
            return Err(INVALID_VALUE);
        }
        if !vmm.in_reservation(ptr, size) {
            return Err(INVALID_VALUE);
        }
        let end = ptr + size as u64;
        let overlaps = vmm
            .maps
            .range(..end)
            .next_back()
            .is_some_and(|(&va, m)| va + m.size as u64 > ptr);
        if overlaps {
            return Err(INVALID_VALUE);
        }
        // As the real driver (measured on an H200, driver 580): an allocation maps whole, from
        // offset 0; a part of it is refused.
        if offset != 0 || size != len {
            return Err(NOT_SUPPORTED);
        }
        if let Some(p) = vmm.phys.get_mut(&phys) {
            p.refs += 1;
        }
        vmm.maps.insert(
            ptr,
            Mapping {
                size,
                phys,
                offset,
                access: HashMap::new(),
                ctx: None,
            },
        );
        Ok(())
    }

    fn mem_unmap(&self, ptr: u64, size: usize) -> CuResult<()> {
        let mut st = self.enter("mem_unmap")?;
        let st = &mut *st;
        // The fake unmaps whole mappings only (what the session does).
        match st.vmm.maps.get(&ptr) {
            Some(m) if m.size == size => {}
            _ => return Err(INVALID_VALUE),
        }
        let m = st.vmm.maps.remove(&ptr).ok_or(INVALID_VALUE)?;
        if let Some(bytes) = m
            .ctx
            .and_then(|c| st.contexts.get_mut(&c))
            .and_then(|c| c.mem.remove(&ptr))
        {
            if let Some(p) = st.vmm.phys.get_mut(&m.phys) {
                p.bytes[m.offset..m.offset + m.size].copy_from_slice(&bytes);
            }
        }
        st.vmm.unref(m.phys);
        Ok(())
    }

    fn mem_set_access(&self, ptr: u64, size: usize, access: &[(i32, u32)]) -> CuResult<()> {
        let mut st = self.enter("mem_set_access")?;
        let st = &mut *st;
        let cur = st.cur();
        if !st.contexts.contains_key(&cur) {
            return Err(INVALID_CONTEXT);
        }
        if access.is_empty() {
            return Err(INVALID_VALUE);
        }
        for &(dev, flags) in access {
            if !(100..100 + self.gpus).contains(&dev) || ![0, 1, 3].contains(&flags) {
                return Err(INVALID_VALUE);
            }
        }
        // The range must be covered by mappings, each wholly inside it.
        let end = ptr.checked_add(size as u64).ok_or(INVALID_VALUE)?;
        let inside: Vec<u64> = st.vmm.maps.range(ptr..end).map(|(&va, _)| va).collect();
        let covered: u64 = inside.iter().map(|va| st.vmm.maps[va].size as u64).sum();
        if size == 0 || covered != size as u64 || inside.first() != Some(&ptr) {
            return Err(INVALID_VALUE);
        }
        for va in inside {
            let Some(m) = st.vmm.maps.get_mut(&va) else {
                continue;
            };
            for &(dev, flags) in access {
                m.access.insert(dev, flags);
            }
            let reachable = m.access.values().any(|&f| f != ACCESS_NONE);
            if reachable && m.ctx.is_none() {
                let (phys, offset, size) = (m.phys, m.offset, m.size);
                m.ctx = Some(cur);
                // Another live mapping of the allocation (an exporter's, say) holds its current
                // bytes; the fake copies them now (later writes stay each mapping's own until
                // it is unmapped).
                let sibling = st
                    .vmm
                    .maps
                    .iter()
                    .filter(|&(&v, o)| v != va && o.phys == phys && o.offset == offset)
                    .find_map(|(&v, o)| {
                        o.ctx
                            .and_then(|c| st.contexts.get(&c))
                            .and_then(|c| c.mem.get(&v))
                            .filter(|b| b.len() == size)
                            .cloned()
                    });
                let bytes = sibling
                    .unwrap_or_else(|| st.vmm.phys[&phys].bytes[offset..offset + size].to_vec());
                if let Some(c) = st.contexts.get_mut(&cur) {
                    c.mem.insert(va, bytes);
                }
            }
        }
        Ok(())
    }

    fn mem_get_access(&self, ptr: u64, dev: i32) -> CuResult<u32> {
        let st = self.enter("mem_get_access")?;
        let (_, m) = st.vmm.mapping_at(ptr).ok_or(INVALID_VALUE)?;
        Ok(m.access.get(&dev).copied().unwrap_or(ACCESS_NONE))
    }

    fn mem_granularity(&self, props: &AllocProps, _recommended: bool) -> CuResult<usize> {
        let _st = self.enter("mem_granularity")?;
        if !(100..100 + self.gpus).contains(&props.device)
            || props.handle_types & !HANDLE_TYPE_POSIX_FD != 0
        {
            return Err(INVALID_VALUE);
        }
        Ok(GRANULARITY)
    }

    fn mem_retain_handle(&self, ptr: u64) -> CuResult<MemHandle> {
        let mut st = self.enter("mem_retain_handle")?;
        let st = &mut *st;
        let phys = st.vmm.mapping_at(ptr).ok_or(INVALID_VALUE)?.1.phys;
        let h = fresh(&mut st.next);
        st.vmm.handles.insert(h, phys);
        if let Some(p) = st.vmm.phys.get_mut(&phys) {
            p.refs += 1;
        }
        Ok(MemHandle::from_raw(h))
    }

    fn mem_handle_props(&self, handle: MemHandle) -> CuResult<AllocProps> {
        let st = self.enter("mem_handle_props")?;
        let phys = st.vmm.handle(handle)?;
        Ok(st.vmm.phys.get(&phys).ok_or(INVALID_VALUE)?.props)
    }

    fn mem_export_fd(&self, handle: MemHandle) -> CuResult<OwnedFd> {
        let mut st = self.enter("mem_export_fd")?;
        let phys = st.vmm.handle(handle)?;
        let p = st.vmm.phys.get(&phys).ok_or(INVALID_VALUE)?;
        if p.props.handle_types & HANDLE_TYPE_POSIX_FD == 0 {
            return Err(NOT_PERMITTED);
        }
        // SAFETY: a plain system call with a static name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"qcuda-fake-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(OUT_OF_MEMORY);
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ino = inode(fd.as_fd())?;
        st.vmm.exports.insert(ino, phys);
        if let Some(p) = st.vmm.phys.get_mut(&phys) {
            p.exported = Some(ino);
        }
        Ok(fd)
    }

    fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> CuResult<MemHandle> {
        let mut st = self.enter("mem_import_fd")?;
        let st = &mut *st;
        let phys = *st.vmm.exports.get(&inode(fd)?).ok_or(INVALID_VALUE)?;
        let h = fresh(&mut st.next);
        st.vmm.handles.insert(h, phys);
        if let Some(p) = st.vmm.phys.get_mut(&phys) {
            p.refs += 1;
        }
        Ok(MemHandle::from_raw(h))
    }

    fn mem_pool_create_shareable(&self, dev: i32, max_size: usize) -> CuResult<MemPool> {
        let pool = super::super::DriverApi::mem_pool_create(self, dev, max_size)?;
        let mut st = self.enter("mem_pool_create_shareable")?;
        if let Some(p) = st.pools.get_mut(&pool.raw()) {
            p.shareable = true;
        }
        Ok(pool)
    }

    fn mem_pool_export_fd(&self, pool: MemPool) -> CuResult<OwnedFd> {
        let mut st = self.enter("mem_pool_export_fd")?;
        let p = st.pools.get(&pool.raw()).ok_or(INVALID_VALUE)?;
        if !p.shareable {
            return Err(INVALID_VALUE);
        }
        // SAFETY: a plain system call with a static name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"qcuda-fake-pool".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(OUT_OF_MEMORY);
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ino = inode(fd.as_fd())?;
        st.vmm.pool_exports.insert(ino, pool.raw());
        Ok(fd)
    }

    fn mem_pool_import_fd(&self, fd: BorrowedFd<'_>) -> CuResult<MemPool> {
        let mut st = self.enter("mem_pool_import_fd")?;
        let st = &mut *st;
        let origin = *st.vmm.pool_exports.get(&inode(fd)?).ok_or(INVALID_VALUE)?;
        let dev = st.pools.get(&origin).ok_or(INVALID_VALUE)?.dev;
        let p = fresh(&mut st.next);
        st.pools.insert(
            p,
            FakePool {
                dev,
                settings: [1, 1, 1, 0],
                origin: Some(origin),
                ..FakePool::default()
            },
        );
        Ok(MemPool::from_raw(p))
    }

    fn mem_pool_export_pointer(&self, ptr: u64) -> CuResult<[u8; 64]> {
        let st = self.enter("mem_pool_export_pointer")?;
        let c = st.contexts.get(&st.cur()).ok_or(INVALID_CONTEXT)?;
        if !c.mem.contains_key(&ptr) {
            return Err(INVALID_VALUE);
        }
        let mut data = [0u8; 64];
        data[..8].copy_from_slice(&ptr.to_le_bytes());
        data[8..16].copy_from_slice(&0x5ca1_ab1e_u64.to_le_bytes());
        Ok(data)
    }

    fn mem_pool_import_pointer(&self, pool: MemPool, data: &[u8; 64]) -> CuResult<u64> {
        let mut st = self.enter("mem_pool_import_pointer")?;
        let st = &mut *st;
        let p = st.pools.get(&pool.raw()).ok_or(INVALID_VALUE)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(&data[8..16]);
        if p.origin.is_none() || u64::from_le_bytes(word) != 0x5ca1_ab1e {
            return Err(INVALID_VALUE);
        }
        word.copy_from_slice(&data[..8]);
        let ptr = u64::from_le_bytes(word);
        // The importing context gets the allocation's bytes as they are now (the fake keeps
        // memory per context).
        let bytes = st
            .contexts
            .values()
            .find_map(|c| c.mem.get(&ptr).cloned())
            .ok_or(INVALID_VALUE)?;
        let cur = st.cur();
        st.contexts
            .get_mut(&cur)
            .ok_or(INVALID_CONTEXT)?
            .mem
            .insert(ptr, bytes);
        Ok(ptr)
    }

    fn ipc_event_handle(&self, event: Event) -> CuResult<[u8; 64]> {
        self.with_ctx("ipc_event_handle", |c, _| {
            c.events.get(&event.raw()).ok_or(INVALID_HANDLE)?;
            let mut h = [0u8; 64];
            h[..8].copy_from_slice(&event.raw().to_le_bytes());
            h[8..16].copy_from_slice(&0x1bc_e7e_u64.to_le_bytes());
            Ok(h)
        })
    }

    fn ipc_open_event(&self, handle: &[u8; 64]) -> CuResult<Event> {
        let mut word = [0u8; 8];
        word.copy_from_slice(&handle[8..16]);
        if u64::from_le_bytes(word) != 0x1bc_e7e {
            return Err(INVALID_VALUE);
        }
        self.with_ctx("ipc_open_event", |c, next| {
            // The fake keeps events per context: the opened one is a new event of the
            // importer's, complete (it cannot follow the exporter's records).
            let e = fresh(next);
            c.events.insert(e, true);
            Ok(Event::from_raw(e))
        })
    }

    fn mem_address_range(&self, ptr: u64) -> CuResult<(u64, usize)> {
        let st = self.enter("mem_address_range")?;
        if let Some((va, m)) = st.vmm.mapping_at(ptr) {
            return Ok((va, m.size));
        }
        let c = st.contexts.get(&st.cur()).ok_or(INVALID_CONTEXT)?;
        let (&base, v) = c.mem.range(..=ptr).next_back().ok_or(CuError(1))?;
        if ptr < base + v.len() as u64 {
            Ok((base, v.len()))
        } else {
            Err(super::NOT_FOUND)
        }
    }
}

/// The inode of a descriptor: how the fake knows its exported memfds again.
fn inode(fd: BorrowedFd<'_>) -> CuResult<u64> {
    let mut s = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `s` is a writable stat buffer; the descriptor is borrowed, so open.
    if unsafe { libc::fstat(fd.as_raw_fd(), s.as_mut_ptr()) } != 0 {
        return Err(INVALID_VALUE);
    }
    // SAFETY: fstat succeeded, so it filled the buffer.
    Ok(unsafe { s.assume_init() }.st_ino)
}

#[cfg(test)]
mod tests {
    use super::{
        super::super::{vmm::ACCESS_READWRITE, DriverApi, Stream},
        *,
    };

    fn props(handle_types: u32) -> AllocProps {
        AllocProps {
            device: 100,
            handle_types,
            ..AllocProps::default()
        }
    }

    /// Create, reserve, map, set access: the range is device memory copies reach; unmapped,
    /// released and freed, nothing remains.
    #[test]
    fn a_ram_budget_bounds_every_kind_of_buffer_together() {
        let d = FakeDriver::new(2).with_ram_budget(6 * GRANULARITY as u64);
        let ctx = d.ctx_create(100).unwrap();
        d.ctx_set_current(ctx).unwrap();
        let dev = d.mem_alloc(2 * GRANULARITY).unwrap();
        let phys = d.mem_create(2 * GRANULARITY, &props(0)).unwrap();
        d.mem_alloc_host(GRANULARITY).unwrap();
        // 5 granules held: one more fits, two do not, whatever kind they are.
        assert_eq!(d.mem_alloc(2 * GRANULARITY).unwrap_err(), OUT_OF_MEMORY);
        assert_eq!(
            d.mem_create(2 * GRANULARITY, &props(0)).unwrap_err(),
            OUT_OF_MEMORY
        );
        assert_eq!(
            d.mem_alloc_host(2 * GRANULARITY).unwrap_err(),
            OUT_OF_MEMORY
        );
        d.mem_free(dev).unwrap();
        d.mem_release(phys).unwrap();
        d.mem_alloc(5 * GRANULARITY).unwrap();
    }

    #[test]
    fn a_mapping_is_device_memory_until_unmapped() {
        let d = FakeDriver::new(1);
        let ctx = d.ctx_create(100).unwrap();
        d.ctx_set_current(ctx).unwrap();
        let g = d.mem_granularity(&props(0), false).unwrap();
        assert_eq!(d.mem_create(g + 1, &props(0)).unwrap_err(), INVALID_VALUE);
        let h = d.mem_create(2 * g, &props(0)).unwrap();
        let va = d.mem_address_reserve(4 * g, 0, 0).unwrap();
        assert_eq!(
            d.mem_map(va + 3 * g as u64, 2 * g, 0, h).unwrap_err(),
            INVALID_VALUE
        );
        d.mem_map(va, 2 * g, 0, h).unwrap();
        assert_eq!(
            d.mem_map(va + g as u64, g, 0, h).unwrap_err(),
            INVALID_VALUE
        );
        assert_eq!(
            d.memcpy_dtod(va, va, 4, Stream::NULL).unwrap_err(),
            INVALID_VALUE
        );
        d.mem_set_access(va, 2 * g, &[(100, ACCESS_READWRITE)])
            .unwrap();
        assert_eq!(d.mem_get_access(va + 5, 100), Ok(ACCESS_READWRITE));
        d.memset(
            va + 8,
            7,
            crate::cuda::driver::MemsetWidth::W8,
            4,
            Stream::NULL,
        )
        .unwrap();
        assert_eq!(d.peek(va + 8, 4), Some(vec![7; 4]));
        assert_eq!(d.mem_address_range(va + 100), Ok((va, 2 * g)));
        // Released while mapped: the memory lives on until unmapped.
        d.mem_release(h).unwrap();
        assert_eq!(d.vmm_allocations(), 1);
        assert_eq!(d.mem_address_free(va, 4 * g).unwrap_err(), INVALID_VALUE);
        d.mem_unmap(va, 2 * g).unwrap();
        assert_eq!(d.vmm_allocations(), 0);
        d.mem_address_free(va, 4 * g).unwrap();
        assert_eq!(d.vmm_ranges(), (0, 0));
    }

    /// An exported allocation imported again (as another process would) holds the same bytes;
    /// one created without the POSIX handle type cannot be exported.
    #[test]
    fn an_imported_allocation_sees_what_the_exporter_wrote() {
        let d = FakeDriver::new(1);
        let ctx = d.ctx_create(100).unwrap();
        d.ctx_set_current(ctx).unwrap();
        let g = GRANULARITY;
        let plain = d.mem_create(g, &props(0)).unwrap();
        assert_eq!(d.mem_export_fd(plain).unwrap_err(), NOT_PERMITTED);
        let h = d.mem_create(g, &props(HANDLE_TYPE_POSIX_FD)).unwrap();
        let va = d.mem_address_reserve(g, 0, 0).unwrap();
        d.mem_map(va, g, 0, h).unwrap();
        d.mem_set_access(va, g, &[(100, ACCESS_READWRITE)]).unwrap();
        d.memset(
            va,
            9,
            crate::cuda::driver::MemsetWidth::W8,
            16,
            Stream::NULL,
        )
        .unwrap();
        d.mem_unmap(va, g).unwrap();
        d.mem_release(h).unwrap();
        let h = d.mem_create(g, &props(HANDLE_TYPE_POSIX_FD)).unwrap();
        let fd = d.mem_export_fd(h).unwrap();
        let imported = d.mem_import_fd(fd.as_fd()).unwrap();
        assert_eq!(
            d.mem_handle_props(imported),
            Ok(props(HANDLE_TYPE_POSIX_FD))
        );
        d.mem_map(va, g, 0, h).unwrap();
        d.mem_set_access(va, g, &[(100, ACCESS_READWRITE)]).unwrap();
        d.memset(
            va,
            5,
            crate::cuda::driver::MemsetWidth::W8,
            16,
            Stream::NULL,
        )
        .unwrap();
        d.mem_unmap(va, g).unwrap();
        d.mem_release(h).unwrap();
        let va2 = d.mem_address_reserve(g, 0, 0).unwrap();
        d.mem_map(va2, g, 0, imported).unwrap();
        d.mem_set_access(va2, g, &[(100, ACCESS_READWRITE)])
            .unwrap();
        assert_eq!(d.peek(va2, 16), Some(vec![5; 16]));
        let retained = d.mem_retain_handle(va2 + 4).unwrap();
        d.mem_release(retained).unwrap();
        d.mem_unmap(va2, g).unwrap();
        d.mem_release(imported).unwrap();
        d.mem_release(plain).unwrap();
        assert_eq!(d.vmm_allocations(), 0);
        assert_eq!(d.vmm_handles(), 0);
    }
}

//! Virtual memory management: physical allocations (`cuMemCreate`), reserved address ranges
//! (`cuMemAddressReserve`), mappings (`cuMemMap`) and their access (`cuMemSetAccess`), for both
//! faces.
//!
//! The host does the work and checks it (vhost-cuda's gpu_state/vmm.rs): an allocation handle
//! is the host's session-local number, passed to the application as the
//! `CUmemGenericAllocationHandle`, and addresses are the host driver's, so a mapped range is
//! a device pointer like any other. What the guest keeps is what lets it answer without a round
//! trip: each handle's device, and the mappings, which join the allocation table
//! (allocations.rs) once access is set so that `cudaMemcpyDefault`, pointer attributes and
//! `cuMemGetAddressRange` know them.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, PoisonError},
};

use qcuda_proto::{Op, VMM_FLAG_COMPRESSED, VMM_FLAG_RDMA_CAPABLE};

use crate::core::{
    allocations::Allocation,
    cuda_error::{CudaError, CudaResult},
    runtime::Runtime,
    transport::Call,
};

/// The properties of a physical allocation (a pinned allocation on a device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocProps {
    /// Device ordinal.
    pub device: u32,
    /// Shareable handle types (0, or 1: POSIX file descriptor).
    pub handle_types: u64,
    /// Generic compression.
    pub compressed: bool,
    /// `gpuDirectRDMACapable`.
    pub rdma_capable: bool,
    /// `allocFlags.usage`.
    pub usage: u16,
}

impl AllocProps {
    /// The wire arguments `[types, flags, usage]`.
    fn wire(&self) -> [u64; 3] {
        let mut flags = 0;
        if self.compressed {
            flags |= VMM_FLAG_COMPRESSED;
        }
        if self.rdma_capable {
            flags |= VMM_FLAG_RDMA_CAPABLE;
        }
        [self.handle_types, flags, u64::from(self.usage)]
    }
}

#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: u64,
    device: u32,
    /// In the allocation table (access has been set).
    recorded: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Host handle -> (device ordinal, references): a handle retained from a mapping is the
    /// same value as the allocation's handle, and each release drops one reference.
    handles: HashMap<u64, (u32, usize)>,
    /// Address -> mapping.
    maps: BTreeMap<u64, Mapping>,
}

/// The VMM objects of this process as the guest knows them.
#[derive(Debug, Default)]
pub struct Vmm {
    state: Mutex<State>,
}

impl Vmm {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device of the mapping holding `addr`, with the mapping's base and size.
    pub fn mapping(&self, addr: u64) -> Option<(u64, u64, u32)> {
        let st = self.lock();
        let (&va, m) = st.maps.range(..=addr).next_back()?;
        (addr - va < m.size).then_some((va, m.size, m.device))
    }
}

/// `cuMemGetAllocationGranularity`.
pub fn granularity(rt: &Runtime, props: &AllocProps, recommended: bool) -> CudaResult<usize> {
    let [t, f, u] = props.wire();
    let reply = rt
        .session
        .submit(Call::new(Op::MemGetGranularity, props.device).args(&[
            u64::from(recommended),
            t,
            f,
            u,
        ]))?;
    usize::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)
}

/// `cuMemCreate`: the new allocation's handle.
pub fn create(rt: &Runtime, size: usize, props: &AllocProps) -> CudaResult<u64> {
    let [t, f, u] = props.wire();
    let reply = rt
        .session
        .submit(Call::new(Op::MemCreate, props.device).args(&[size as u64, t, f, u]))?;
    let h = reply.rets[0];
    rt.vmm.lock().handles.insert(h, (props.device, 1));
    Ok(h)
}

/// `cuMemRelease`.
pub fn release(rt: &Runtime, handle: u64) -> CudaResult<()> {
    let device = handle_device(rt, handle)?;
    rt.session
        .submit(Call::new(Op::MemRelease, device).args(&[handle]))?;
    let mut st = rt.vmm.lock();
    let last = st.handles.get_mut(&handle).is_some_and(|(_, refs)| {
        *refs -= 1;
        *refs == 0
    });
    if last {
        st.handles.remove(&handle);
    }
    Ok(())
}

/// The device of the process's allocation handle `handle`.
pub(crate) fn handle_device(rt: &Runtime, handle: u64) -> CudaResult<u32> {
    rt.vmm
        .lock()
        .handles
        .get(&handle)
        .map(|&(device, _)| device)
        .ok_or(CudaError::INVALID_VALUE)
}

/// Takes a handle the host made by importing another process's allocation (core/ipc.rs):
/// the physical allocation lives on `device`.
pub(crate) fn adopt(rt: &Runtime, handle: u64, device: u32) {
    rt.vmm.lock().handles.entry(handle).or_insert((device, 0)).1 += 1;
}

/// `cuMemAddressReserve`.
pub fn address_reserve(rt: &Runtime, size: usize, align: usize, hint: u64) -> CudaResult<u64> {
    let device = crate::core::devices::current();
    let reply = rt
        .session
        .submit(Call::new(Op::MemAddressReserve, device).args(&[
            size as u64,
            align as u64,
            hint,
        ]))?;
    Ok(reply.rets[0])
}

/// `cuMemAddressFree`.
pub fn address_free(rt: &Runtime, ptr: u64, size: usize) -> CudaResult<()> {
    rt.session.submit(
        Call::new(Op::MemAddressFree, crate::core::devices::current()).args(&[ptr, size as u64]),
    )?;
    Ok(())
}

/// `cuMemMap`.
pub fn map(rt: &Runtime, ptr: u64, size: usize, offset: usize, handle: u64) -> CudaResult<()> {
    let device = handle_device(rt, handle)?;
    rt.session.submit(Call::new(Op::MemMap, device).args(&[
        ptr,
        size as u64,
        offset as u64,
        handle,
    ]))?;
    rt.vmm.lock().maps.insert(
        ptr,
        Mapping {
            size: size as u64,
            device,
            recorded: false,
        },
    );
    Ok(())
}

/// `cuMemUnmap`.
pub fn unmap(rt: &Runtime, ptr: u64, size: usize) -> CudaResult<()> {
    let device = rt
        .vmm
        .mapping(ptr)
        .map_or(crate::core::devices::current(), |(_, _, d)| d);
    rt.session
        .submit(Call::new(Op::MemUnmap, device).args(&[ptr, size as u64]))?;
    let end = ptr.saturating_add(size as u64);
    let mut st = rt.vmm.lock();
    let gone: Vec<u64> = st.maps.range(ptr..end).map(|(&va, _)| va).collect();
    for va in gone {
        if st.maps.remove(&va).is_some_and(|m| m.recorded) {
            rt.allocations.remove(va);
        }
    }
    Ok(())
}

/// `cuMemSetAccess`: `(device ordinal, flags)` for each device (flags 0, 1 or 3).
pub fn set_access(rt: &Runtime, ptr: u64, size: usize, access: &[(u32, u32)]) -> CudaResult<()> {
    if access.is_empty() {
        return Err(CudaError::INVALID_VALUE);
    }
    let records: Vec<u8> = access
        .iter()
        .flat_map(|&(d, f)| [d.to_le_bytes(), f.to_le_bytes()].concat())
        .collect();
    let device = rt
        .vmm
        .mapping(ptr)
        .map_or(crate::core::devices::current(), |(_, _, d)| d);
    rt.session.submit(
        Call::new(Op::MemSetAccess, device)
            .args(&[ptr, size as u64])
            .input(&records),
    )?;
    if access.iter().any(|&(_, f)| f != 0) {
        let end = ptr.saturating_add(size as u64);
        let mut st = rt.vmm.lock();
        for (&va, m) in st.maps.range_mut(ptr..end) {
            if !m.recorded {
                m.recorded = true;
                rt.allocations.insert(Allocation {
                    base: va,
                    size: m.size,
                    device: m.device,
                    legacy_ipc: false,
                });
            }
        }
    }
    Ok(())
}

/// `cuMemGetAccess` of device `device` at `ptr`: 0, 1 or 3.
pub fn get_access(rt: &Runtime, ptr: u64, device: u32) -> CudaResult<u32> {
    let (_, _, owner) = rt.vmm.mapping(ptr).ok_or(CudaError::INVALID_VALUE)?;
    let reply = rt
        .session
        .submit(Call::new(Op::MemGetAccess, owner).args(&[ptr, u64::from(device)]))?;
    u32::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)
}

/// `cuMemRetainAllocationHandle` of the allocation mapped at `ptr`.
pub fn retain(rt: &Runtime, ptr: u64) -> CudaResult<u64> {
    let (_, _, device) = rt.vmm.mapping(ptr).ok_or(CudaError::INVALID_VALUE)?;
    let reply = rt
        .session
        .submit(Call::new(Op::MemRetainHandle, device).args(&[ptr]))?;
    let h = reply.rets[0];
    rt.vmm.lock().handles.entry(h).or_insert((device, 0)).1 += 1;
    Ok(h)
}

/// `cuMemGetAllocationPropertiesFromHandle`.
pub fn properties(rt: &Runtime, handle: u64) -> CudaResult<AllocProps> {
    let device = handle_device(rt, handle)?;
    let r = rt
        .session
        .submit(Call::new(Op::MemHandleProperties, device).args(&[handle]))?
        .rets;
    Ok(AllocProps {
        device: u32::try_from(r[0]).map_err(|_| CudaError::UNKNOWN)?,
        handle_types: r[1],
        compressed: r[2] & VMM_FLAG_COMPRESSED != 0,
        rdma_capable: r[2] & VMM_FLAG_RDMA_CAPABLE != 0,
        usage: u16::try_from(r[3]).map_err(|_| CudaError::UNKNOWN)?,
    })
}

//! Virtual memory management: physical allocations (`cuMemCreate`), reserved address ranges
//! (`cuMemAddressReserve`), mappings (`cuMemMap`) and their access (`cuMemSetAccess`), for both
//! faces.
//!
//! The host does the work and checks it (vhost-cuda's gpu_state/vmm.rs): an allocation handle
//! is the host's session-local number, passed to the application as the
//! `CUmemGenericAllocationHandle`, and addresses are the host driver's, so a mapped range is
//! a device pointer like any other. What the guest keeps is what lets it answer without a round
//! trip: each handle's device, and the mappings, which join the allocation table
//! (memory/device.rs) once access is set so that `cudaMemcpyDefault`, pointer attributes and
//! `cuMemGetAddressRange` know them.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, PoisonError},
};

use qcuda_proto::{Op, VMM_FLAG_COMPRESSED, VMM_FLAG_RDMA_CAPABLE};

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    memory::device::{Allocation, Allocations},
    transport::{session::Session, Call},
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

#[derive(Debug, Clone)]
struct Mapping {
    size: u64,
    device: u32,
    /// In the allocation table (access has been set).
    recorded: bool,
    /// The physical allocation's handle and properties (None: not known here).
    handle: u64,
    props: Option<AllocProps>,
    /// The access each device was given (`cuMemSetAccess`): (device ordinal, flags).
    access: Vec<(u32, u32)>,
}

#[derive(Debug, Default)]
struct State {
    /// Host handle -> (device ordinal, references): a handle retained from a mapping is the
    /// same value as the allocation's handle, and each release drops one reference.
    handles: HashMap<u64, (u32, usize)>,
    /// The properties of the physical allocations known here, by handle: kept after the
    /// handles are released, for the mappings that still hold the memory.
    props: HashMap<u64, AllocProps>,
    /// Address -> mapping.
    maps: BTreeMap<u64, Mapping>,
    /// Reserved address ranges (`cuMemAddressReserve`): start -> size.
    reserved: BTreeMap<u64, u64>,
}

/// What the guest knows of a mapped VMM address (runtime/pointer_attrs.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedPointer {
    /// The mapping holding the address: start and size.
    pub mapping: (u64, u64),
    /// The reserved range holding the mapping (`cuMemAddressReserve`), if known.
    pub reserved: Option<(u64, u64)>,
    /// The physical allocation's handle (unique in the process while it lives).
    pub handle: u64,
    /// The physical allocation's properties, if known.
    pub props: Option<AllocProps>,
    /// The access flags `device` was given, 0 if none.
    pub access: Vec<(u32, u32)>,
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

    /// What is known of the mapping holding `addr`.
    pub fn pointer(&self, addr: u64) -> Option<MappedPointer> {
        let st = self.lock();
        let (&va, m) = st.maps.range(..=addr).next_back()?;
        if addr - va >= m.size {
            return None;
        }
        let reserved = st
            .reserved
            .range(..=va)
            .next_back()
            .filter(|(&b, &len)| va - b < len)
            .map(|(&b, &len)| (b, len));
        Some(MappedPointer {
            mapping: (va, m.size),
            reserved,
            handle: m.handle,
            props: m.props,
            access: m.access.clone(),
        })
    }
}

impl Vmm {
    /// `cuMemGetAllocationGranularity`.
    pub fn granularity(
        &self,
        session: &Session,
        props: &AllocProps,
        recommended: bool,
    ) -> CudaResult<usize> {
        let [t, f, u] = props.wire();
        let reply = session.submit(Call::new(Op::MemGetGranularity, props.device).args(&[
            u64::from(recommended),
            t,
            f,
            u,
        ]))?;
        usize::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)
    }

    /// `cuMemCreate`: the new allocation's handle.
    pub fn create(&self, session: &Session, size: usize, props: &AllocProps) -> CudaResult<u64> {
        let [t, f, u] = props.wire();
        let reply =
            session.submit(Call::new(Op::MemCreate, props.device).args(&[size as u64, t, f, u]))?;
        let h = reply.rets[0];
        let mut st = self.lock();
        st.handles.insert(h, (props.device, 1));
        st.props.insert(h, *props);
        Ok(h)
    }

    /// `cuMemRelease`.
    pub fn release(&self, session: &Session, handle: u64) -> CudaResult<()> {
        let device = self.handle_device(handle)?;
        session.submit(Call::new(Op::MemRelease, device).args(&[handle]))?;
        let mut st = self.lock();
        let last = st.handles.get_mut(&handle).is_some_and(|(_, refs)| {
            *refs -= 1;
            *refs == 0
        });
        if last {
            st.handles.remove(&handle);
            if !st.maps.values().any(|m| m.handle == handle) {
                st.props.remove(&handle);
            }
        }
        Ok(())
    }

    /// The device of the process's allocation handle `handle`.
    pub fn handle_device(&self, handle: u64) -> CudaResult<u32> {
        self.lock()
            .handles
            .get(&handle)
            .map(|&(device, _)| device)
            .ok_or(CudaError::INVALID_VALUE)
    }

    /// Takes a handle the host made by importing another process's allocation
    /// (core/runtime/ipc.rs): the physical allocation lives on `device`.
    pub fn adopt(&self, session: &Session, handle: u64, device: u32) {
        self.lock().handles.entry(handle).or_insert((device, 0)).1 += 1;
        // What the exporter made it with, for pointer queries of its mappings.
        if let Ok(p) = self.properties(session, handle) {
            self.lock().props.insert(handle, p);
        }
    }

    /// `cuMemAddressReserve`.
    pub fn address_reserve(
        &self,
        session: &Session,
        size: usize,
        align: usize,
        hint: u64,
    ) -> CudaResult<u64> {
        let device = crate::core::devices::current();
        let reply = session.submit(Call::new(Op::MemAddressReserve, device).args(&[
            size as u64,
            align as u64,
            hint,
        ]))?;
        let va = reply.rets[0];
        self.lock().reserved.insert(va, size as u64);
        Ok(va)
    }

    /// `cuMemAddressFree`.
    pub fn address_free(&self, session: &Session, ptr: u64, size: usize) -> CudaResult<()> {
        session.submit(
            Call::new(Op::MemAddressFree, crate::core::devices::current())
                .args(&[ptr, size as u64]),
        )?;
        self.lock().reserved.remove(&ptr);
        Ok(())
    }

    /// `cuMemMap`.
    pub fn map(
        &self,
        session: &Session,
        ptr: u64,
        size: usize,
        offset: usize,
        handle: u64,
    ) -> CudaResult<()> {
        let device = self.handle_device(handle)?;
        session.submit(Call::new(Op::MemMap, device).args(&[
            ptr,
            size as u64,
            offset as u64,
            handle,
        ]))?;
        let mut st = self.lock();
        let props = st.props.get(&handle).copied();
        st.maps.insert(
            ptr,
            Mapping {
                size: size as u64,
                device,
                recorded: false,
                handle,
                props,
                access: Vec::new(),
            },
        );
        Ok(())
    }

    /// `cuMemUnmap`.
    pub fn unmap(
        &self,
        session: &Session,
        allocations: &Allocations,
        ptr: u64,
        size: usize,
    ) -> CudaResult<()> {
        let device = self
            .mapping(ptr)
            .map_or(crate::core::devices::current(), |(_, _, d)| d);
        session.submit(Call::new(Op::MemUnmap, device).args(&[ptr, size as u64]))?;
        let end = ptr.saturating_add(size as u64);
        let mut st = self.lock();
        let gone: Vec<u64> = st.maps.range(ptr..end).map(|(&va, _)| va).collect();
        for va in gone {
            let Some(m) = st.maps.remove(&va) else {
                continue;
            };
            if m.recorded {
                allocations.remove(va);
            }
            let held = st.handles.contains_key(&m.handle)
                || st.maps.values().any(|o| o.handle == m.handle);
            if !held {
                st.props.remove(&m.handle);
            }
        }
        Ok(())
    }

    /// `cuMemSetAccess`: `(device ordinal, flags)` for each device (flags 0, 1 or 3).
    pub fn set_access(
        &self,
        session: &Session,
        allocations: &Allocations,
        ptr: u64,
        size: usize,
        access: &[(u32, u32)],
    ) -> CudaResult<()> {
        if access.is_empty() {
            return Err(CudaError::INVALID_VALUE);
        }
        let records: Vec<u8> = access
            .iter()
            .flat_map(|&(d, f)| [d.to_le_bytes(), f.to_le_bytes()].concat())
            .collect();
        let device = self
            .mapping(ptr)
            .map_or(crate::core::devices::current(), |(_, _, d)| d);
        session.submit(
            Call::new(Op::MemSetAccess, device)
                .args(&[ptr, size as u64])
                .input(&records),
        )?;
        let end = ptr.saturating_add(size as u64);
        let mut st = self.lock();
        for (_, m) in st.maps.range_mut(ptr..end) {
            for &(d, f) in access {
                m.access.retain(|&(o, _)| o != d);
                m.access.push((d, f));
            }
        }
        if access.iter().any(|&(_, f)| f != 0) {
            for (&va, m) in st.maps.range_mut(ptr..end) {
                if !m.recorded {
                    m.recorded = true;
                    allocations.insert(Allocation {
                        base: va,
                        size: m.size,
                        device: m.device,
                        origin: crate::core::memory::device::Origin::Vmm,
                    });
                }
            }
        }
        Ok(())
    }

    /// `cuMemGetAccess` of device `device` at `ptr`: 0, 1 or 3.
    pub fn get_access(&self, session: &Session, ptr: u64, device: u32) -> CudaResult<u32> {
        let (_, _, owner) = self.mapping(ptr).ok_or(CudaError::INVALID_VALUE)?;
        let reply =
            session.submit(Call::new(Op::MemGetAccess, owner).args(&[ptr, u64::from(device)]))?;
        u32::try_from(reply.rets[0]).map_err(|_| CudaError::UNKNOWN)
    }

    /// `cuMemRetainAllocationHandle` of the allocation mapped at `ptr`.
    pub fn retain(&self, session: &Session, ptr: u64) -> CudaResult<u64> {
        let (_, _, device) = self.mapping(ptr).ok_or(CudaError::INVALID_VALUE)?;
        let reply = session.submit(Call::new(Op::MemRetainHandle, device).args(&[ptr]))?;
        let h = reply.rets[0];
        self.lock().handles.entry(h).or_insert((device, 0)).1 += 1;
        Ok(h)
    }

    /// `cuMemGetAllocationPropertiesFromHandle`.
    pub fn properties(&self, session: &Session, handle: u64) -> CudaResult<AllocProps> {
        let device = self.handle_device(handle)?;
        let r = session
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
}

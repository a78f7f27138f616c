//! What CUDA knows of an address, for both faces: `cudaPointerGetAttributes` (runtime) and
//! `cuPointerGetAttribute`/`cuPointerGetAttributes` (driver).
//!
//! Everything is answered from the guest's own tables, without a round trip: device
//! allocations and how each was made (memory/device.rs), host memory (memory/host.rs), VMM
//! reservations and mappings (memory/vmm.rs), pools (memory/pools.rs). [`of`] classifies an address once;
//! [`PointerInfo::attribute`] gives one `CU_POINTER_ATTRIBUTE_*` value as CUDA 13.0's
//! `cuda.h` documents it, or says that the attribute does not apply to this memory
//! ([`Attr::NotApplicable`]): `cuPointerGetAttribute` answers that with
//! `CUDA_ERROR_INVALID_VALUE`, `cuPointerGetAttributes` with the attribute's default value and
//! success ("the attributes are assigned default NULL values and CUDA_SUCCESS is returned"),
//! which is what NVIDIA's runtime over our driver (`--cudart=static` programs, CuPy) reads for
//! pageable memory.
//!
//! - Memory CUDA never saw (`malloc`, the stack, a NumPy array), NULL, one past the end of an
//!   allocation: unregistered. The runtime answers success with `cudaMemoryTypeUnregistered`,
//!   device -2 (`cudaInvalidDeviceId`), no device pointer (the guest has no pageable memory
//!   access), and the pointer itself as host pointer (CUDA does not check it).
//! - Interior pointers answer for the allocation holding them.
//! - Stream-ordered, graph and VMM memory belong to no context: `CU_POINTER_ATTRIBUTE_CONTEXT`
//!   is NULL for them (documented for stream-ordered memory).

use crate::{
    core::{
        conv::usize_of,
        memory::device::Origin,
        memory::host::HostKind,
        memory::vmm::{AllocProps, MappedPointer},
        runtime::Runtime,
    },
    generated::{
        self as g, cudaMemoryTypeDevice, cudaMemoryTypeHost, cudaMemoryTypeManaged,
        cudaMemoryTypeUnregistered, cudaPointerAttributes, driver_api as d,
    },
};

/// `cudaInvalidDeviceId` / `CU_DEVICE_INVALID`.
pub const INVALID_DEVICE: i32 = -2;

/// `CU_MEM_CREATE_USAGE_HW_DECOMPRESS`: `allocFlags.usage` of memory the hardware
/// decompresses into.
const USAGE_HW_DECOMPRESS: u16 = 0x2;

/// The kind of memory an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Not CUDA's.
    Unregistered,
    /// Pinned or registered host memory.
    Host,
    /// Device memory.
    Device,
    /// Managed memory.
    Managed,
}

/// What CUDA knows of one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointerInfo {
    /// The address asked about.
    pub ptr: u64,
    /// Its kind.
    pub kind: MemoryKind,
    /// The device it was allocated on or registered against.
    pub device: Option<u32>,
    /// Whether a context owns it (the device's primary one).
    pub in_context: bool,
    /// The address kernels reach it at.
    pub device_pointer: Option<u64>,
    /// The address the host reaches it at.
    pub host_pointer: Option<u64>,
    /// The allocation's address range (for VMM memory the reserved range).
    pub range: Option<(u64, u64)>,
    /// The mapping (for other memory, the allocation).
    pub mapping: Option<(u64, u64)>,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID` (0: none).
    pub buffer_id: u64,
    /// `CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID` (0: none).
    pub block_id: u64,
    /// Exported by legacy IPC.
    pub legacy_ipc: bool,
    /// Shareable handle types of its physical allocation.
    pub handle_types: u64,
    /// Its pool's application handle (0: none); `pool_current` if it is the device's current
    /// pool, resolved by the face (a round trip).
    pub pool: usize,
    /// The pool is the device's current one, not named at allocation.
    pub pool_current: bool,
    /// `CU_POINTER_ATTRIBUTE_ACCESS_FLAGS` per device: (ordinal, flags); empty: read-write for
    /// every device.
    pub access: Vec<(u32, u32)>,
    /// Registered read-only (`cudaHostRegisterReadOnly`).
    pub read_only: bool,
    /// `gpuDirectRDMACapable`.
    pub rdma: bool,
    /// Usable for hardware decompression.
    pub hw_decompress: bool,
}

/// One attribute's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attr {
    /// An unsigned 32-bit value (`unsigned int`, `CUmemorytype`, booleans).
    U32(u32),
    /// A signed 32-bit value (the device ordinal).
    I32(i32),
    /// A 64-bit value (`CUdeviceptr`, `unsigned long long`).
    U64(u64),
    /// A pointer-sized value (`void *`, `size_t`, `CUcontext`, `CUmemoryPool`); for a context
    /// the primary context of this device, for a pool the pool's application handle.
    Context(u32),
    /// A pointer-sized plain value.
    Usize(usize),
    /// No P2P tokens: a zeroed `CUDA_POINTER_ATTRIBUTE_P2P_TOKENS`.
    NoTokens,
    /// The attribute says nothing of this memory.
    NotApplicable,
    /// Not provided by qcuda (`CUDA_ERROR_NOT_SUPPORTED`).
    NotSupported,
    /// No such attribute (`CUDA_ERROR_INVALID_VALUE` on both calls).
    Unknown,
}

/// Classifies `ptr`.
pub fn of(rt: &Runtime, ptr: u64) -> PointerInfo {
    let mut info = PointerInfo {
        ptr,
        kind: MemoryKind::Unregistered,
        device: None,
        in_context: false,
        device_pointer: None,
        host_pointer: None,
        range: None,
        mapping: None,
        buffer_id: 0,
        block_id: 0,
        legacy_ipc: false,
        handle_types: 0,
        pool: 0,
        pool_current: false,
        access: Vec::new(),
        read_only: false,
        rdma: false,
        hw_decompress: false,
    };
    if let Some(a) = rt.allocations.find(ptr) {
        info.kind = MemoryKind::Device;
        info.device = Some(a.device);
        info.in_context = a.in_context();
        info.device_pointer = Some(ptr);
        info.range = Some((a.base, a.size));
        info.mapping = Some((a.base, a.size));
        info.buffer_id = rt.allocations.buffer_id(a.base).unwrap_or(0);
        info.block_id = info.buffer_id;
        info.legacy_ipc = a.legacy_ipc();
        match a.origin {
            Origin::Pool(p) | Origin::PoolImport(p) => {
                info.pool = p;
                info.pool_current = p == 0;
            }
            Origin::Vmm => {
                if let Some(m) = rt.vmm.pointer(ptr) {
                    vmm_details(&mut info, &m);
                }
            }
            Origin::Malloc | Origin::Graph | Origin::IpcOpened => {}
        }
        return info;
    }
    let host = rt
        .host_memory
        .find(usize_of(ptr))
        .filter(|h| h.kind != HostKind::GraphPinned);
    if let Some(h) = host {
        info.kind = if h.kind == HostKind::Managed {
            MemoryKind::Managed
        } else {
            MemoryKind::Host
        };
        info.device = Some(h.device);
        info.in_context = true;
        info.host_pointer = Some(ptr);
        info.device_pointer = Some(h.device_address(usize_of(ptr)));
        info.range = Some((h.base as u64, h.size as u64));
        info.mapping = info.range;
        info.buffer_id = h.buffer_id;
        info.block_id = h.buffer_id;
        info.read_only =
            h.kind == HostKind::Registered && h.flags & g::cudaHostRegisterReadOnly != 0;
        if info.kind == MemoryKind::Managed {
            info.device_pointer = Some(ptr);
        }
    }
    info
}

fn vmm_details(info: &mut PointerInfo, m: &MappedPointer) {
    info.mapping = Some(m.mapping);
    info.range = Some(m.reserved.unwrap_or(m.mapping));
    info.block_id = m.handle;
    info.access.clone_from(&m.access);
    if let Some(AllocProps {
        handle_types,
        rdma_capable,
        usage,
        ..
    }) = m.props
    {
        info.handle_types = handle_types;
        info.rdma = rdma_capable;
        info.hw_decompress = usage & USAGE_HW_DECOMPRESS != 0;
    }
}

impl PointerInfo {
    /// Whether CUDA knows the address at all.
    pub fn known(&self) -> bool {
        self.kind != MemoryKind::Unregistered
    }

    /// The runtime's `cudaPointerAttributes`.
    pub fn runtime_attributes(&self) -> cudaPointerAttributes {
        let ptr_of = |v: Option<u64>| v.map_or(std::ptr::null_mut(), |p| usize_of(p) as *mut _);
        let device = self
            .device
            .and_then(|d| i32::try_from(d).ok())
            .unwrap_or(INVALID_DEVICE);
        match self.kind {
            MemoryKind::Unregistered => cudaPointerAttributes {
                type_: cudaMemoryTypeUnregistered,
                device: INVALID_DEVICE,
                hostPointer: usize_of(self.ptr) as *mut _,
                ..Default::default()
            },
            kind => cudaPointerAttributes {
                type_: match kind {
                    MemoryKind::Host => cudaMemoryTypeHost,
                    MemoryKind::Managed => cudaMemoryTypeManaged,
                    _ => cudaMemoryTypeDevice,
                },
                device,
                devicePointer: ptr_of(self.device_pointer),
                hostPointer: ptr_of(self.host_pointer),
                ..Default::default()
            },
        }
    }

    /// The access flags of `device` (the current context's).
    fn access_of(&self, device: u32) -> u32 {
        if self.access.is_empty() {
            return if self.read_only {
                d::CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
            } else {
                d::CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
            };
        }
        self.access
            .iter()
            .find(|&&(o, _)| o == device)
            .map_or(d::CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE, |&(_, f)| f)
    }

    /// The value of `attribute`, as `cuPointerGetAttribute` documents it; `current` is the
    /// device of the calling thread's context.
    pub fn attribute(&self, attribute: d::CUpointer_attribute, current: u32) -> Attr {
        let known = self.known();
        let size = |v: u64| Attr::Usize(usize::try_from(v).unwrap_or(usize::MAX));
        match attribute {
            d::CU_POINTER_ATTRIBUTE_CONTEXT => match self.device {
                Some(dev) if self.in_context => Attr::Context(dev),
                // Memory no context owns: success, NULL.
                Some(_) => Attr::Usize(0),
                None => Attr::NotApplicable,
            },
            d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => match self.kind {
                MemoryKind::Device | MemoryKind::Managed => Attr::U32(d::CU_MEMORYTYPE_DEVICE),
                MemoryKind::Host => Attr::U32(d::CU_MEMORYTYPE_HOST),
                MemoryKind::Unregistered => Attr::NotApplicable,
            },
            d::CU_POINTER_ATTRIBUTE_DEVICE_POINTER => {
                self.device_pointer.map_or(Attr::NotApplicable, Attr::U64)
            }
            d::CU_POINTER_ATTRIBUTE_HOST_POINTER => self
                .host_pointer
                .map_or(Attr::NotApplicable, |p| Attr::Usize(usize_of(p))),
            // Tokens for the host kernel's nv-p2p interface, which a guest cannot use.
            d::CU_POINTER_ATTRIBUTE_P2P_TOKENS if self.kind == MemoryKind::Device => {
                Attr::NotSupported
            }
            d::CU_POINTER_ATTRIBUTE_P2P_TOKENS => Attr::NotApplicable,
            // Every synchronous copy of qcuda's waits for the device.
            d::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS if known => Attr::U32(1),
            d::CU_POINTER_ATTRIBUTE_BUFFER_ID if self.buffer_id != 0 => Attr::U64(self.buffer_id),
            d::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID if self.block_id != 0 => {
                Attr::U64(self.block_id)
            }
            d::CU_POINTER_ATTRIBUTE_IS_MANAGED if known => {
                Attr::U32(u32::from(self.kind == MemoryKind::Managed))
            }
            d::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => self
                .device
                .and_then(|d| i32::try_from(d).ok())
                .map_or(Attr::NotApplicable, Attr::I32),
            d::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE => {
                Attr::U32(u32::from(self.legacy_ipc))
            }
            d::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => self
                .range
                .map_or(Attr::NotApplicable, |(b, _)| Attr::U64(b)),
            d::CU_POINTER_ATTRIBUTE_RANGE_SIZE => {
                self.range.map_or(Attr::NotApplicable, |(_, s)| size(s))
            }
            d::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR => self
                .mapping
                .map_or(Attr::NotApplicable, |(b, _)| Attr::U64(b)),
            d::CU_POINTER_ATTRIBUTE_MAPPING_SIZE => {
                self.mapping.map_or(Attr::NotApplicable, |(_, s)| size(s))
            }
            d::CU_POINTER_ATTRIBUTE_MAPPED => Attr::U32(u32::from(known)),
            d::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES => Attr::U64(self.handle_types),
            d::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE => Attr::U32(u32::from(self.rdma)),
            d::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS if known => Attr::U32(self.access_of(current)),
            d::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => Attr::Usize(self.pool),
            d::CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE => {
                Attr::U32(u32::from(self.hw_decompress))
            }
            d::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS
            | d::CU_POINTER_ATTRIBUTE_BUFFER_ID
            | d::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID
            | d::CU_POINTER_ATTRIBUTE_IS_MANAGED
            | d::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => Attr::NotApplicable,
            _ => Attr::Unknown,
        }
    }
}

/// The value `cuPointerGetAttributes` writes for an attribute that does not apply to `info`'s
/// memory: zero or NULL, as NVIDIA's driver 580 writes them (measured on an H200 for a NumPy
/// array's memory: context NULL, type 0, device pointer 0, host pointer the address itself,
/// managed 0, device ordinal 0, mapped 0).
pub fn default_of(attribute: d::CUpointer_attribute, info: &PointerInfo) -> Attr {
    match attribute {
        d::CU_POINTER_ATTRIBUTE_HOST_POINTER if info.kind == MemoryKind::Unregistered => {
            Attr::U64(info.ptr)
        }
        d::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => Attr::I32(0),
        d::CU_POINTER_ATTRIBUTE_CONTEXT
        | d::CU_POINTER_ATTRIBUTE_HOST_POINTER
        | d::CU_POINTER_ATTRIBUTE_RANGE_SIZE
        | d::CU_POINTER_ATTRIBUTE_MAPPING_SIZE
        | d::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => Attr::Usize(0),
        d::CU_POINTER_ATTRIBUTE_DEVICE_POINTER
        | d::CU_POINTER_ATTRIBUTE_BUFFER_ID
        | d::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
        | d::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
        | d::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
        | d::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => Attr::U64(0),
        d::CU_POINTER_ATTRIBUTE_P2P_TOKENS => Attr::NoTokens,
        _ => Attr::U32(0),
    }
}

/// The runtime's `cudaPointerGetAttributes` (documented since CUDA 11: pageable memory is
/// `cudaMemoryTypeUnregistered` and success).
pub mod ops {
    use super::*;
    use crate::core::{cuda_error::CudaResult, runtime::current};

    /// `cudaPointerGetAttributes`.
    pub fn pointer_attributes(ptr: usize) -> CudaResult<cudaPointerAttributes> {
        let (rt, _) = current()?;
        Ok(of(rt, ptr as u64).runtime_attributes())
    }
}

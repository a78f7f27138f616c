//! How `cudaDeviceProp` is filled: which driver attribute (`CUdevice_attribute`) feeds which field,
//! and which capabilities are reported as absent because qcuda does not carry them into the
//! guest yet.
//!
//! `cudaDeviceAttr` values equal the driver's `CUdevice_attribute` values (checked in the tests
//! below), so `cudaDeviceGetAttribute` passes its argument straight to the host and the same
//! masking applies to both APIs.

use crate::core::conv::{u32_of_int, usize_of};
use qcuda_proto::GpuInfo;

use crate::generated::{self as cu, cudaDeviceProp, CUdevice_attribute};

type Setter = fn(&mut cudaDeviceProp, i32);

fn int(v: i32) -> i32 {
    v
}

/// Non-negative attribute values of size fields.
fn size(v: i32) -> usize {
    usize::try_from(v).unwrap_or(0)
}

/// Bitmask fields.
fn uint(v: i32) -> u32 {
    u32_of_int(v)
}

/// `CU_DEVICE_ATTRIBUTE_X => field[index]: conversion;`
macro_rules! prop_attributes {
    ($($attr:ident => $field:ident $([$i:literal])?: $conv:ident;)*) => {
        &[$((cu::$attr, |p: &mut cudaDeviceProp, v: i32| p.$field $([$i])? = $conv(v)),)*]
    };
}

/// Every `cudaDeviceProp` field the driver can provide, with its attribute. Name, UUID and total
/// memory come from the `DeviceInfo` record instead; luid and luidDeviceNodeMask are undefined
/// off Windows and stay zero.
#[rustfmt::skip]
pub const PROP_ATTRIBUTES: &[(CUdevice_attribute, Setter)] = prop_attributes! {
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => sharedMemPerBlock: size;
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK => regsPerBlock: int;
    CU_DEVICE_ATTRIBUTE_WARP_SIZE => warpSize: int;
    CU_DEVICE_ATTRIBUTE_MAX_PITCH => memPitch: size;
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => maxThreadsPerBlock: int;
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X => maxThreadsDim[0]: int;
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => maxThreadsDim[1]: int;
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => maxThreadsDim[2]: int;
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => maxGridSize[0]: int;
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y => maxGridSize[1]: int;
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => maxGridSize[2]: int;
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => totalConstMem: size;
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => major: int;
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => minor: int;
    CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => textureAlignment: size;
    CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT => texturePitchAlignment: size;
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => multiProcessorCount: int;
    CU_DEVICE_ATTRIBUTE_INTEGRATED => integrated: int;
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY => canMapHostMemory: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH => maxTexture1D: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH => maxTexture1DMipmap: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH => maxTexture2D[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT => maxTexture2D[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH => maxTexture2DMipmap[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT => maxTexture2DMipmap[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH => maxTexture2DLinear[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT => maxTexture2DLinear[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH => maxTexture2DLinear[2]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH => maxTexture2DGather[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT => maxTexture2DGather[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH => maxTexture3D[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT => maxTexture3D[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH => maxTexture3D[2]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE => maxTexture3DAlt[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE => maxTexture3DAlt[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE => maxTexture3DAlt[2]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH => maxTextureCubemap: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH => maxTexture1DLayered[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS => maxTexture1DLayered[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH => maxTexture2DLayered[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT => maxTexture2DLayered[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS => maxTexture2DLayered[2]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH => maxTextureCubemapLayered[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS => maxTextureCubemapLayered[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH => maxSurface1D: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH => maxSurface2D[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT => maxSurface2D[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH => maxSurface3D[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT => maxSurface3D[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH => maxSurface3D[2]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH => maxSurface1DLayered[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS => maxSurface1DLayered[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH => maxSurface2DLayered[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT => maxSurface2DLayered[1]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS => maxSurface2DLayered[2]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH => maxSurfaceCubemap: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH => maxSurfaceCubemapLayered[0]: int;
    CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS => maxSurfaceCubemapLayered[1]: int;
    CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT => surfaceAlignment: size;
    CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS => concurrentKernels: int;
    CU_DEVICE_ATTRIBUTE_ECC_ENABLED => ECCEnabled: int;
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => pciBusID: int;
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID => pciDeviceID: int;
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => pciDomainID: int;
    CU_DEVICE_ATTRIBUTE_TCC_DRIVER => tccDriver: int;
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => asyncEngineCount: int;
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING => unifiedAddressing: int;
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => memoryBusWidth: int;
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => l2CacheSize: int;
    CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE => persistingL2CacheMaxSize: int;
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => maxThreadsPerMultiProcessor: int;
    CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED => streamPrioritiesSupported: int;
    CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED => globalL1CacheSupported: int;
    CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED => localL1CacheSupported: int;
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => sharedMemPerMultiprocessor: size;
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => regsPerMultiprocessor: int;
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY => managedMemory: int;
    CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD => isMultiGpuBoard: int;
    CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID => multiGpuBoardGroupID: int;
    CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED => hostNativeAtomicSupported: int;
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS => pageableMemoryAccess: int;
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS => concurrentManagedAccess: int;
    CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED => computePreemptionSupported: int;
    CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM => canUseHostPointerForRegisteredMem: int;
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH => cooperativeLaunch: int;
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => sharedMemPerBlockOptin: size;
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES => pageableMemoryAccessUsesHostPageTables: int;
    CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST => directManagedMemAccessFromHost: int;
    CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => maxBlocksPerMultiProcessor: int;
    CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE => accessPolicyMaxWindowSize: int;
    CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK => reservedSharedMemPerBlock: size;
    CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED => hostRegisterSupported: int;
    CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED => sparseCudaArraySupported: int;
    CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED => hostRegisterReadOnlySupported: int;
    CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED => timelineSemaphoreInteropSupported: int;
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => memoryPoolsSupported: int;
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED => gpuDirectRDMASupported: int;
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS => gpuDirectRDMAFlushWritesOptions: uint;
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING => gpuDirectRDMAWritesOrdering: int;
    CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES => memoryPoolSupportedHandleTypes: uint;
    CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED => deferredMappingCudaArraySupported: int;
    CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED => ipcEventSupported: int;
    CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH => clusterLaunch: int;
    CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS => unifiedFunctionPointers: int;
    CU_DEVICE_ATTRIBUTE_NUMA_CONFIG => deviceNumaConfig: int;
    CU_DEVICE_ATTRIBUTE_NUMA_ID => deviceNumaId: int;
    CU_DEVICE_ATTRIBUTE_MPS_ENABLED => mpsEnabled: int;
    CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID => hostNumaId: int;
    CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID => gpuPciDeviceID: uint;
    CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID => gpuPciSubsystemID: uint;
    CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED => hostNumaMultinodeIpcSupported: int;
};

/// Capabilities the GPU may have but a guest application cannot use through qcuda yet: pageable
/// memory access, host atomics, pools of host memory and shareable pools, multi-device cooperative launches, IPC, interop. They read as
/// 0 in both `cudaDeviceProp` and `cudaDeviceGetAttribute`, so applications that check before
/// using a feature take the path that works. Mapped host memory, host registration and virtual
/// memory management (`cuMemCreate`, `cuMemMap`: core/memory/vmm.rs) are carried (the host's own
/// values pass through, generic compression included); shareable handles of VMM allocations
/// (POSIX file descriptors) are, between the processes of the VM (core/runtime/ipc.rs), so that
/// attribute passes through, and pools shareable that way ([`MASKED`]), and interprocess
/// events (`IPC_EVENT_SUPPORTED` passes through). Managed memory is there where the GPU's
/// virtual memory management is ([`DERIVED`]), without concurrent access from the CPU.
pub const NOT_REMOTED: &[CUdevice_attribute] = &[
    cu::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
    cu::CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST,
    cu::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
    cu::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
    cu::CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
    cu::CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH,
    cu::CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED,
    // cuMemCreate of host (NUMA) memory is not offered: only device-located allocations.
    cu::CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
    cu::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
    cu::CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
    // Multicast objects (cuMulticast*: NVLink SHARP) are not offered; NCCL takes its NVLS path
    // only where this reads 1.
    cu::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
    cu::CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED,
];

/// Attributes whose value is qcuda's, not the GPU's (none at present; see [`DERIVED`]). A
/// registered host range is mapped at its own address on the host when that address is free
/// there, which is not guaranteed, so `canUseHostPointerForRegisteredMem` is 0 (see
/// [`NOT_REMOTED`]): programs use `cudaHostGetDevicePointer`, as CUDA requires then.
pub const QCUDA_VALUES: &[(CUdevice_attribute, i32)] = &[];

/// Attributes that read as another attribute of the GPU: qcuda's managed memory is device
/// memory placed with the driver's virtual memory management and migrated at launches and
/// synchronisations (docs/ARCHITECTURE.md, "Host memory"), so `managedMemory` is the GPU's
/// `virtualMemoryManagementSupported`; it is never accessed concurrently with the CPU (so
/// `concurrentManagedAccess` is in [`NOT_REMOTED`], as are pageable memory access and host
/// native atomics).
pub const DERIVED: &[(CUdevice_attribute, CUdevice_attribute)] = &[(
    cu::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
    cu::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
)];

/// The GPU attribute whose value `attr` reads as ([`DERIVED`]; itself for most).
pub fn source(attr: CUdevice_attribute) -> CUdevice_attribute {
    DERIVED
        .iter()
        .find(|(a, _)| *a == attr)
        .map_or(attr, |&(_, from)| from)
}

/// Attributes whose GPU value passes through only in part: the bits qcuda offers. Pools
/// shareable as POSIX file descriptors are (core/runtime/ipc.rs); other handle types (fabric,
/// Win32) are not.
pub const MASKED: &[(CUdevice_attribute, i32)] =
    &[(cu::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 1)];

/// The GPU's value `v` of `attr` as qcuda reports it ([`MASKED`]).
pub fn masked(attr: CUdevice_attribute, v: i32) -> i32 {
    MASKED
        .iter()
        .find(|(a, _)| *a == attr)
        .map_or(v, |&(_, m)| v & m)
}

/// The value qcuda reports for `attr` whatever the GPU says, if any.
pub fn fixed_value(attr: CUdevice_attribute) -> Option<i32> {
    if NOT_REMOTED.contains(&attr) {
        return Some(0);
    }
    QCUDA_VALUES
        .iter()
        .find(|(a, _)| *a == attr)
        .map(|&(_, v)| v)
}

/// Builds `cudaDeviceProp` from the device record and the values of [`PROP_ATTRIBUTES`], in
/// table order (already masked by [`fixed_value`]).
pub fn build(info: &GpuInfo, values: &[i32]) -> cudaDeviceProp {
    let mut p = cudaDeviceProp::default();
    for (dst, &src) in p.name.iter_mut().zip(info.name_bytes()) {
        *dst = core::ffi::c_char::from_ne_bytes([src]);
    }
    p.uuid.bytes = info.uuid.map(|b| core::ffi::c_char::from_ne_bytes([b]));
    p.totalGlobalMem = usize_of(info.total_mem);
    for ((_, set), &v) in PROP_ATTRIBUTES.iter().zip(values) {
        set(&mut p, v);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::conv::int_of_u32;

    #[test]
    fn table_has_no_duplicate_attributes() {
        let mut ids: Vec<_> = PROP_ATTRIBUTES.iter().map(|(a, _)| *a).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }

    #[test]
    fn the_gpu_test_runner_allows_exactly_the_attributes_qcuda_reports_itself() {
        let runner = include_str!("../../../../scripts/run-gpu-tests.sh");
        let line = runner
            .lines()
            .find_map(|l| l.strip_prefix("QCUDA_OWN_ATTRIBUTES=\""))
            .expect("run-gpu-tests.sh sets QCUDA_OWN_ATTRIBUTES");
        let mut listed: Vec<u32> = line
            .trim_end_matches('"')
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        listed.sort_unstable();
        let mut ours: Vec<u32> = NOT_REMOTED
            .iter()
            .copied()
            .chain(QCUDA_VALUES.iter().map(|&(a, _)| a))
            .chain(MASKED.iter().map(|&(a, _)| a))
            .chain(DERIVED.iter().map(|&(a, _)| a))
            .collect();
        ours.sort_unstable();
        assert_eq!(
            listed, ours,
            "update QCUDA_OWN_ATTRIBUTES in scripts/run-gpu-tests.sh"
        );
    }

    #[test]
    fn runtime_attribute_ids_equal_driver_ids() {
        // cudaDeviceGetAttribute forwards cudaDeviceAttr values as CUdevice_attribute ids.
        for (rt, drv) in [
            (
                cu::cudaDevAttrMaxThreadsPerBlock,
                cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            ),
            (
                cu::cudaDevAttrMaxBlockDimX,
                cu::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
            ),
            (
                cu::cudaDevAttrMaxGridDimZ,
                cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
            ),
            (
                cu::cudaDevAttrMaxSharedMemoryPerBlock,
                cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            ),
            (cu::cudaDevAttrWarpSize, cu::CU_DEVICE_ATTRIBUTE_WARP_SIZE),
            (cu::cudaDevAttrClockRate, cu::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            (
                cu::cudaDevAttrMultiProcessorCount,
                cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            ),
            (
                cu::cudaDevAttrComputeCapabilityMajor,
                cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            ),
            (
                cu::cudaDevAttrComputeCapabilityMinor,
                cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            ),
            (
                cu::cudaDevAttrMemoryClockRate,
                cu::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
            ),
            (
                cu::cudaDevAttrGlobalMemoryBusWidth,
                cu::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
            ),
            (
                cu::cudaDevAttrL2CacheSize,
                cu::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
            ),
            (cu::cudaDevAttrPciBusId, cu::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            (
                cu::cudaDevAttrPciDomainId,
                cu::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
            ),
            (
                cu::cudaDevAttrUnifiedAddressing,
                cu::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
            ),
            (
                cu::cudaDevAttrManagedMemory,
                cu::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
            ),
            (
                cu::cudaDevAttrCooperativeLaunch,
                cu::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
            ),
            (
                cu::cudaDevAttrMaxSharedMemoryPerBlockOptin,
                cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            ),
            (
                cu::cudaDevAttrMaxBlocksPerMultiprocessor,
                cu::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
            ),
            (
                cu::cudaDevAttrMemoryPoolsSupported,
                cu::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            ),
            (
                cu::cudaDevAttrClusterLaunch,
                cu::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH,
            ),
            (
                cu::cudaDevAttrNumaConfig,
                cu::CU_DEVICE_ATTRIBUTE_NUMA_CONFIG,
            ),
            (
                cu::cudaDevAttrHostNumaId,
                cu::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID,
            ),
            (
                cu::cudaDevAttrGpuPciDeviceId,
                cu::CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID,
            ),
            (
                cu::cudaDevAttrGpuPciSubsystemId,
                cu::CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID,
            ),
        ] {
            assert_eq!(rt, drv);
        }
    }

    #[test]
    fn build_fills_fields_from_info_and_attributes() {
        let mut info = GpuInfo::default();
        info.set_name(b"NVIDIA H100 80GB HBM3");
        info.uuid = [7; 16];
        info.total_mem = 80 << 30;
        let values: Vec<i32> = PROP_ATTRIBUTES
            .iter()
            .map(|(a, _)| int_of_u32(*a) + 1000)
            .collect();
        let p = build(&info, &values);
        // SAFETY: `build` copied a NUL-padded name that is shorter than the array.
        let name = unsafe { std::ffi::CStr::from_ptr(p.name.as_ptr()) };
        assert_eq!(name.to_str().unwrap(), "NVIDIA H100 80GB HBM3");
        assert_eq!(p.uuid.bytes, [7; 16]);
        assert_eq!(p.totalGlobalMem, 80 << 30);
        let v = |a: CUdevice_attribute| int_of_u32(a) + 1000;
        assert_eq!(
            p.maxThreadsPerBlock,
            v(cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        );
        assert_eq!(p.maxGridSize[2], v(cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z));
        assert_eq!(
            p.sharedMemPerBlock,
            usize::try_from(v(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)).unwrap()
        );
        assert_eq!(p.major, v(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));
        assert_eq!(
            p.hostNumaMultinodeIpcSupported,
            v(cu::CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED)
        );
        assert_eq!(p.reserved, [0; 56]);
    }
}

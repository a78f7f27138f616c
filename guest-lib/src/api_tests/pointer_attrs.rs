//! Pointer attributes of every kind of pointer, through both faces, as CUDA 13.0's headers
//! document them: one table, each row a pointer and what `cudaPointerGetAttributes` and
//! `cuPointerGetAttribute` answer of it; `cuPointerGetAttributes` must then answer every
//! attribute the same, with the default value and success where the single query says
//! `CUDA_ERROR_INVALID_VALUE` (pageable memory above all: what NVIDIA's runtime reads for
//! CuPy's `cp.asarray(numpy_array)`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::*;
use crate::{
    driver::{
        api::{context::*, init::*, ipc::*, memory::*, vmm::*},
        status::DriverError,
    },
    generated::{
        self as cu, driver_api as d,
        runtime_api::{cudaIpcMemHandle_t, cudaMemPoolPtrExportData},
    },
    runtime::{
        arrays::cudaMallocPitch, devices::cudaSetDevice, errors::cudaGetLastError, graphs::*,
        ipc::*, memory::*, pools::*,
    },
};

/// What one query must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum W {
    /// This value.
    V(u64),
    /// Success with a nonzero value (ids, pool handles the test does not know).
    Some,
    /// This error.
    E(DriverError),
}
use W::{Some as Any, E, V};

const INV: W = E(DriverError::INVALID_VALUE);

/// Every `CUpointer_attribute` of CUDA 13.0.
const ALL: std::ops::RangeInclusive<u32> =
    d::CU_POINTER_ATTRIBUTE_CONTEXT..=d::CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE;

struct Row {
    name: &'static str,
    ptr: u64,
    /// `cudaPointerGetAttributes`: type, device, devicePointer, hostPointer.
    runtime: (cu::cudaMemoryType, i32, u64, u64),
    attrs: Vec<(u32, W)>,
}

/// One attribute through `cuPointerGetAttribute` (16 zeroed bytes: room for any type).
fn single(attr: u32, ptr: u64) -> Result<u64, DriverError> {
    let mut slot = [0u64; 2];
    // SAFETY: 16 bytes of room, the largest attribute (P2P tokens).
    DriverError::check(unsafe { cuPointerGetAttribute(slot.as_mut_ptr().cast(), attr, ptr) })
        .map(|()| slot[0])
}

/// Attributes through one `cuPointerGetAttributes` call.
fn plural(attrs: &[u32], ptr: u64) -> Result<Vec<u64>, DriverError> {
    let mut slots = vec![[0u64; 2]; attrs.len()];
    let mut data: Vec<*mut c_void> = slots.iter_mut().map(|s| s.as_mut_ptr().cast()).collect();
    let mut a = attrs.to_vec();
    // SAFETY: one 16-byte slot per attribute.
    let r =
        unsafe { cuPointerGetAttributes(a.len() as u32, a.as_mut_ptr(), data.as_mut_ptr(), ptr) };
    DriverError::check(r).map(|()| slots.iter().map(|s| s[0]).collect())
}

/// The value `cuPointerGetAttributes` writes where the single query has none (driver 580's,
/// measured): the address itself as the host pointer of memory CUDA never saw, else zero.
fn default_of(attr: u32, row: &Row) -> u64 {
    if attr == d::CU_POINTER_ATTRIBUTE_HOST_POINTER
        && row.runtime.0 == cu::cudaMemoryTypeUnregistered
    {
        row.ptr
    } else {
        0
    }
}

#[track_caller]
fn check(row: &Row) {
    let mut a = cu::cudaPointerAttributes::default();
    // SAFETY: a valid out-parameter; the pointer is only classified.
    ok(unsafe { cudaPointerGetAttributes(&raw mut a, row.ptr as usize as *const c_void) });
    let got = (
        a.type_,
        a.device,
        a.devicePointer as u64,
        a.hostPointer as u64,
    );
    assert_eq!(got, row.runtime, "{}: cudaPointerGetAttributes", row.name);
    assert!(a.reserved.iter().all(|&r| r == 0), "{}: reserved", row.name);
    for &(attr, want) in &row.attrs {
        let got = single(attr, row.ptr);
        match want {
            V(v) => assert_eq!(got, Ok(v), "{}: attribute {attr}", row.name),
            Any => assert!(
                got.is_ok_and(|v| v != 0),
                "{}: attribute {attr}: {got:?}",
                row.name
            ),
            E(e) => assert_eq!(got, Err(e), "{}: attribute {attr}", row.name),
        }
    }
    // Every attribute: the single query succeeds or says INVALID_VALUE (or, for P2P tokens,
    // NOT_SUPPORTED), and the plural one agrees, one at a time and all at once.
    let mut expected = Vec::new();
    for attr in ALL {
        let one = single(attr, row.ptr);
        let want = match one {
            Ok(v) => Ok(v),
            Err(DriverError::INVALID_VALUE) => Ok(default_of(attr, row)),
            Err(e) => {
                assert_eq!(
                    (attr, e),
                    (
                        d::CU_POINTER_ATTRIBUTE_P2P_TOKENS,
                        DriverError::NOT_SUPPORTED
                    ),
                    "{}",
                    row.name
                );
                Err(e)
            }
        };
        assert_eq!(
            plural(&[attr], row.ptr).map(|v| v[0]),
            want,
            "{}: cuPointerGetAttributes of attribute {attr}",
            row.name
        );
        if attr != d::CU_POINTER_ATTRIBUTE_P2P_TOKENS {
            expected.push((attr, want.unwrap()));
        }
    }
    let attrs: Vec<u32> = expected.iter().map(|&(a, _)| a).collect();
    let values: Vec<u64> = expected.iter().map(|&(_, v)| v).collect();
    assert_eq!(
        plural(&attrs, row.ptr),
        Ok(values),
        "{}: all at once",
        row.name
    );
}

/// The attributes of unregistered memory: no type, context, pointers or device.
fn unregistered(name: &'static str, ptr: u64) -> Row {
    Row {
        name,
        ptr,
        runtime: (cu::cudaMemoryTypeUnregistered, -2, 0, ptr),
        attrs: vec![
            (d::CU_POINTER_ATTRIBUTE_CONTEXT, INV),
            (d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, INV),
            (d::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, INV),
            (d::CU_POINTER_ATTRIBUTE_HOST_POINTER, INV),
            (d::CU_POINTER_ATTRIBUTE_P2P_TOKENS, INV),
            (d::CU_POINTER_ATTRIBUTE_BUFFER_ID, INV),
            (d::CU_POINTER_ATTRIBUTE_IS_MANAGED, INV),
            (d::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, INV),
            (d::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, INV),
            (d::CU_POINTER_ATTRIBUTE_RANGE_SIZE, INV),
            (d::CU_POINTER_ATTRIBUTE_MAPPED, V(0)),
            (d::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, V(0)),
            (d::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, V(0)),
        ],
    }
}

/// Device memory at `ptr` inside `base..base + size` of `device`, whose context is `ctx`
/// (0: no context owns it).
#[allow(clippy::too_many_arguments)]
fn device_row(
    name: &'static str,
    ptr: u64,
    base: u64,
    size: u64,
    device: u32,
    ctx: u64,
    legacy: bool,
    pool: W,
) -> Row {
    Row {
        name,
        ptr,
        runtime: (cu::cudaMemoryTypeDevice, device as i32, ptr, 0),
        attrs: vec![
            (d::CU_POINTER_ATTRIBUTE_CONTEXT, V(ctx)),
            (
                d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                V(d::CU_MEMORYTYPE_DEVICE.into()),
            ),
            (d::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, V(ptr)),
            (d::CU_POINTER_ATTRIBUTE_HOST_POINTER, INV),
            (
                d::CU_POINTER_ATTRIBUTE_P2P_TOKENS,
                E(DriverError::NOT_SUPPORTED),
            ),
            (d::CU_POINTER_ATTRIBUTE_BUFFER_ID, Any),
            (d::CU_POINTER_ATTRIBUTE_IS_MANAGED, V(0)),
            (d::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, V(device.into())),
            (
                d::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                V(legacy.into()),
            ),
            (d::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, V(base)),
            (d::CU_POINTER_ATTRIBUTE_RANGE_SIZE, V(size)),
            (d::CU_POINTER_ATTRIBUTE_MAPPED, V(1)),
            (d::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, V(3)),
            (d::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, V(base)),
            (d::CU_POINTER_ATTRIBUTE_MAPPING_SIZE, V(size)),
            (d::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, pool),
            (d::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, V(0)),
        ],
    }
}

/// Pinned or registered host memory at `ptr` inside `base..base + size`, reached by kernels at
/// `dptr`.
fn host_row(name: &'static str, ptr: u64, dptr: u64, base: u64, size: u64, ctx: u64) -> Row {
    Row {
        name,
        ptr,
        runtime: (cu::cudaMemoryTypeHost, 0, dptr, ptr),
        attrs: vec![
            (d::CU_POINTER_ATTRIBUTE_CONTEXT, V(ctx)),
            (
                d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                V(d::CU_MEMORYTYPE_HOST.into()),
            ),
            (d::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, V(dptr)),
            (d::CU_POINTER_ATTRIBUTE_HOST_POINTER, V(ptr)),
            (d::CU_POINTER_ATTRIBUTE_P2P_TOKENS, INV),
            (d::CU_POINTER_ATTRIBUTE_BUFFER_ID, Any),
            (d::CU_POINTER_ATTRIBUTE_IS_MANAGED, V(0)),
            (d::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, V(0)),
            (d::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, V(0)),
            (d::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, V(base)),
            (d::CU_POINTER_ATTRIBUTE_RANGE_SIZE, V(size)),
            (d::CU_POINTER_ATTRIBUTE_MAPPED, V(1)),
            (d::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, V(3)),
            (d::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, V(0)),
        ],
    }
}

#[track_caller]
fn cuok(r: d::CUresult) {
    assert_eq!(DriverError::check(r), Ok(()));
}

#[test]
#[allow(clippy::too_many_lines)]
fn every_kind_of_pointer_through_both_faces() {
    let fake = FakeDevice::new(2);
    fake.install();
    hold_batches(true);
    let g = crate::core::fake_device::VMM_GRANULARITY;
    // SAFETY: valid out-parameters and buffers throughout; descriptors owned by the test.
    unsafe {
        cuok(cuInit(0));
        let (mut c0, mut c1): (d::CUcontext, d::CUcontext) = (ptr::null_mut(), ptr::null_mut());
        cuok(cuDevicePrimaryCtxRetain(&raw mut c0, 0));
        cuok(cuDevicePrimaryCtxRetain(&raw mut c1, 1));
        cuok(cuCtxSetCurrent(c0));
        let (ctx0, ctx1) = (c0 as u64, c1 as u64);

        // Device memory: cudaMalloc, an interior pointer, one past the end, cuMemAlloc, pitched.
        let mut p: *mut c_void = ptr::null_mut();
        ok(cudaMalloc(&raw mut p, 1000));
        let p = p as u64;
        check(&device_row("cudaMalloc", p, p, 1000, 0, ctx0, true, V(0)));
        check(&device_row(
            "interior",
            p + 999,
            p,
            1000,
            0,
            ctx0,
            true,
            V(0),
        ));
        check(&unregistered("one past the end", p + 1000));
        let mut q: d::CUdeviceptr = 0;
        cuok(cuMemAlloc_v2(&raw mut q, 512));
        check(&device_row(
            "cuMemAlloc",
            q + 8,
            q,
            512,
            0,
            ctx0,
            true,
            V(0),
        ));
        assert_ne!(
            single(d::CU_POINTER_ATTRIBUTE_BUFFER_ID, p),
            single(d::CU_POINTER_ATTRIBUTE_BUFFER_ID, q)
        );
        let (mut pp, mut pitch) = (ptr::null_mut(), 0usize);
        ok(cudaMallocPitch(&raw mut pp, &raw mut pitch, 100, 4));
        let pp = pp as u64;
        check(&device_row(
            "cudaMallocPitch",
            pp,
            pp,
            pitch as u64 * 4,
            0,
            ctx0,
            true,
            V(0),
        ));

        // Pinned memory: cudaMallocHost, cuMemHostAlloc mapped and portable.
        let mut h: *mut c_void = ptr::null_mut();
        ok(cudaMallocHost(&raw mut h, 100));
        let h = h as u64;
        check(&host_row("cudaMallocHost", h, h, h, 100, ctx0));
        let mut hm: *mut c_void = ptr::null_mut();
        cuok(cuMemHostAlloc(
            &raw mut hm,
            8192,
            d::CU_MEMHOSTALLOC_PORTABLE | d::CU_MEMHOSTALLOC_DEVICEMAP,
        ));
        let hm = hm as u64;
        check(&host_row(
            "cuMemHostAlloc",
            hm + 4096,
            hm + 4096,
            hm,
            8192,
            ctx0,
        ));

        // Registered memory, asked about an interior pointer.
        let mut buf = vec![0u8; 10_000];
        let b = buf.as_mut_ptr() as u64;
        ok(cudaHostRegister(
            b as *mut c_void,
            buf.len(),
            cu::cudaHostRegisterMapped,
        ));
        let mut dp: *mut c_void = ptr::null_mut();
        ok(cudaHostGetDevicePointer(&raw mut dp, b as *mut c_void, 0));
        let dp = dp as u64;
        check(&host_row(
            "cudaHostRegister, interior",
            b + 10,
            dp + 10,
            b,
            10_000,
            ctx0,
        ));
        ok(cudaHostUnregister(b as *mut c_void));
        check(&unregistered("unregistered again", b + 10));

        // Managed memory.
        let mut m: *mut c_void = ptr::null_mut();
        ok(cudaMallocManaged(&raw mut m, 64, 1));
        let m = m as u64;
        check(&Row {
            name: "cudaMallocManaged",
            ptr: m,
            runtime: (cu::cudaMemoryTypeManaged, 0, m, m),
            attrs: vec![
                (d::CU_POINTER_ATTRIBUTE_CONTEXT, V(ctx0)),
                (
                    d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    V(d::CU_MEMORYTYPE_DEVICE.into()),
                ),
                (d::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, V(m)),
                (d::CU_POINTER_ATTRIBUTE_HOST_POINTER, V(m)),
                (d::CU_POINTER_ATTRIBUTE_IS_MANAGED, V(1)),
                (d::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, V(0)),
                (d::CU_POINTER_ATTRIBUTE_MAPPED, V(1)),
                (d::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, V(m)),
            ],
        });

        // Stream-ordered memory: no context owns it; it names its pool.
        let mut current: cu::cudaMemPool_t = ptr::null_mut();
        ok(cudaDeviceGetMemPool(&raw mut current, 0));
        let mut a: *mut c_void = ptr::null_mut();
        ok(cudaMallocAsync(&raw mut a, 300, ptr::null_mut()));
        let a = a as u64;
        check(&device_row(
            "cudaMallocAsync",
            a + 1,
            a,
            300,
            0,
            0,
            false,
            V(current as u64),
        ));
        let mut props = cu::cudaMemPoolProps {
            allocType: cu::cudaMemAllocationTypePinned,
            handleTypes: cu::cudaMemHandleTypePosixFileDescriptor,
            location: cu::cudaMemLocation {
                type_: cu::cudaMemLocationTypeDevice,
                id: 0,
            },
            ..Default::default()
        };
        let mut pool: cu::cudaMemPool_t = ptr::null_mut();
        ok(cudaMemPoolCreate(&raw mut pool, &raw mut props));
        let mut pa: *mut c_void = ptr::null_mut();
        ok(cudaMallocFromPoolAsync(
            &raw mut pa,
            256,
            pool,
            ptr::null_mut(),
        ));
        let pa = pa as u64;
        check(&device_row(
            "cudaMallocFromPoolAsync",
            pa,
            pa,
            256,
            0,
            0,
            false,
            V(pool as u64),
        ));

        // A graph's allocation.
        let mut graph: cu::cudaGraph_t = ptr::null_mut();
        ok(cudaGraphCreate(&raw mut graph, 0));
        let mut ap = cu::cudaMemAllocNodeParams::default();
        ap.poolProps.allocType = cu::cudaMemAllocationTypePinned;
        ap.poolProps.location.type_ = cu::cudaMemLocationTypeDevice;
        ap.bytesize = 4096;
        let mut node: cu::cudaGraphNode_t = ptr::null_mut();
        ok(cudaGraphAddMemAllocNode(
            &raw mut node,
            graph,
            ptr::null(),
            0,
            &raw mut ap,
        ));
        let ga = ap.dptr as u64;
        check(&device_row(
            "graph allocation",
            ga + 64,
            ga,
            4096,
            0,
            0,
            false,
            V(0),
        ));

        // VMM: the range is the reservation, the mapping the mapping; shareable as POSIX
        // descriptors; an address of the reservation that nothing is mapped at is unknown.
        let vprops = d::CUmemAllocationProp {
            type_: d::CU_MEM_ALLOCATION_TYPE_PINNED,
            location: d::CUmemLocation {
                type_: d::CU_MEM_LOCATION_TYPE_DEVICE,
                id: 0,
            },
            requestedHandleTypes: d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            ..Default::default()
        };
        let mut vh: d::CUmemGenericAllocationHandle = 0;
        cuok(cuMemCreate(
            &raw mut vh,
            2 * g as usize,
            &raw const vprops,
            0,
        ));
        let mut va: d::CUdeviceptr = 0;
        cuok(cuMemAddressReserve(&raw mut va, 4 * g as usize, 0, 0, 0));
        cuok(cuMemMap(va, 2 * g as usize, 0, vh, 0));
        let desc = d::CUmemAccessDesc {
            location: vprops.location,
            flags: d::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        cuok(cuMemSetAccess(va, 2 * g as usize, &raw const desc, 1));
        cuok(cuMemRelease(vh));
        let mut vmm = device_row("VMM mapping", va + 5, va, 4 * g, 0, 0, false, V(0));
        vmm.attrs.retain(|&(a, _)| {
            a != d::CU_POINTER_ATTRIBUTE_MAPPING_SIZE
                && a != d::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
        });
        vmm.attrs.extend([
            (d::CU_POINTER_ATTRIBUTE_MAPPING_SIZE, V(2 * g)),
            (
                d::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                V(d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.into()),
            ),
            (d::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, Any),
        ]);
        check(&vmm);
        check(&unregistered("VMM reservation, unmapped", va + 2 * g + 1));

        // IPC: a legacy handle opened, a pool's pointer imported, a VMM descriptor imported.
        let mut e: *mut c_void = ptr::null_mut();
        ok(cudaMalloc(&raw mut e, 4096));
        let mut ih = cudaIpcMemHandle_t { reserved: [0; 64] };
        ok(cudaIpcGetMemHandle(&raw mut ih, e));
        let mut o: *mut c_void = ptr::null_mut();
        ok(cudaIpcOpenMemHandle(&raw mut o, ih, 1));
        let o = o as u64;
        check(&device_row(
            "IPC-opened (legacy)",
            o,
            o,
            4096,
            0,
            ctx0,
            false,
            V(0),
        ));
        ok(cudaIpcCloseMemHandle(o as *mut c_void));

        let posix = cu::cudaMemHandleTypePosixFileDescriptor;
        let mut fd: i32 = -1;
        ok(cudaMemPoolExportToShareableHandle(
            (&raw mut fd).cast(),
            pool,
            posix,
            0,
        ));
        let fd = OwnedFd::from_raw_fd(fd);
        let mut imported: cu::cudaMemPool_t = ptr::null_mut();
        ok(cudaMemPoolImportFromShareableHandle(
            &raw mut imported,
            fd.as_raw_fd().cast_unsigned() as usize as *mut c_void,
            posix,
            0,
        ));
        let mut rec = cudaMemPoolPtrExportData { reserved: [0; 64] };
        ok(cudaMemPoolExportPointer(&raw mut rec, pa as *mut c_void));
        let mut ip: *mut c_void = ptr::null_mut();
        ok(cudaMemPoolImportPointer(
            &raw mut ip,
            imported,
            &raw mut rec,
        ));
        let ip = ip as u64;
        check(&device_row(
            "IPC-imported pool pointer",
            ip,
            ip,
            256,
            0,
            0,
            false,
            V(imported as u64),
        ));

        let mut vh: d::CUmemGenericAllocationHandle = 0;
        cuok(cuMemCreate(&raw mut vh, g as usize, &raw const vprops, 0));
        let mut vfd: i32 = -1;
        cuok(cuMemExportToShareableHandle(
            (&raw mut vfd).cast(),
            vh,
            d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        ));
        let vfd = OwnedFd::from_raw_fd(vfd);
        let mut ivh: d::CUmemGenericAllocationHandle = 0;
        cuok(cuMemImportFromShareableHandle(
            &raw mut ivh,
            vfd.as_raw_fd().cast_unsigned() as usize as *mut c_void,
            d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        ));
        let mut iva: d::CUdeviceptr = 0;
        cuok(cuMemAddressReserve(&raw mut iva, g as usize, 0, 0, 0));
        cuok(cuMemMap(iva, g as usize, 0, ivh, 0));
        cuok(cuMemSetAccess(iva, g as usize, &raw const desc, 1));
        let mut imp = device_row(
            "VMM imported from a descriptor",
            iva,
            iva,
            g,
            0,
            0,
            false,
            V(0),
        );
        imp.attrs
            .retain(|&(a, _)| a != d::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES);
        imp.attrs.push((
            d::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
            V(d::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.into()),
        ));
        check(&imp);

        // Another device's memory: its device, its context.
        ok(cudaSetDevice(1));
        let mut p1: *mut c_void = ptr::null_mut();
        ok(cudaMalloc(&raw mut p1, 128));
        ok(cudaSetDevice(0));
        cuok(cuCtxSetCurrent(c0));
        let p1 = p1 as u64;
        check(&device_row(
            "another device's",
            p1,
            p1,
            128,
            1,
            ctx1,
            true,
            V(0),
        ));

        // Memory CUDA never saw, and NULL.
        let local = 5u64;
        check(&unregistered("the stack", (&raw const local) as u64));
        let heap = Box::new([1u8; 64]);
        check(&unregistered("the heap", heap.as_ptr() as u64 + 3));
        check(&unregistered("NULL", 0));
    }
    cudaGetLastError();
}

#[test]
fn an_unknown_attribute_is_refused_by_both() {
    let _fake = setup();
    // SAFETY: valid out-parameters.
    unsafe {
        cuok(cuInit(0));
        let mut c: d::CUcontext = ptr::null_mut();
        cuok(cuDevicePrimaryCtxRetain(&raw mut c, 0));
        cuok(cuCtxSetCurrent(c));
        let local = 1u32;
        let ptr = (&raw const local) as u64;
        assert_eq!(single(0, ptr), Err(DriverError::INVALID_VALUE));
        assert_eq!(single(99, ptr), Err(DriverError::INVALID_VALUE));
        assert_eq!(
            plural(&[d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 99], ptr),
            Err(DriverError::INVALID_VALUE)
        );
        // A null slot.
        let mut a = [d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE];
        let mut data = [ptr::null_mut::<c_void>()];
        assert_eq!(
            DriverError::check(cuPointerGetAttributes(
                1,
                a.as_mut_ptr(),
                data.as_mut_ptr(),
                ptr
            )),
            Err(DriverError::INVALID_VALUE)
        );
    }
}

/// What NVIDIA's runtime (statically linked into CuPy) asks of the driver for
/// `cudaPointerGetAttributes`: several attributes of a NumPy array's pageable memory at once.
/// CUDA documents success with default values; `cp.asarray(numpy_array)` depends on it.
#[test]
fn pageable_memory_through_the_plural_query_succeeds_with_defaults() {
    let _fake = setup();
    // SAFETY: valid out-parameters.
    unsafe {
        cuok(cuInit(0));
        let mut c: d::CUcontext = ptr::null_mut();
        cuok(cuDevicePrimaryCtxRetain(&raw mut c, 0));
        cuok(cuCtxSetCurrent(c));
    }
    let array = vec![1.5f64; 1000];
    let ptr = array.as_ptr() as u64;
    let attrs = [
        d::CU_POINTER_ATTRIBUTE_CONTEXT,
        d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        d::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
        d::CU_POINTER_ATTRIBUTE_HOST_POINTER,
        d::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        d::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ];
    assert_eq!(plural(&attrs, ptr), Ok(vec![0, 0, 0, ptr, 0, 0]));
    assert_eq!(
        single(d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr),
        Err(DriverError::INVALID_VALUE)
    );
    let mut a = cu::cudaPointerAttributes::default();
    // SAFETY: a valid out-parameter.
    ok(unsafe { cudaPointerGetAttributes(&raw mut a, array.as_ptr().cast()) });
    assert_eq!((a.type_, a.device), (cu::cudaMemoryTypeUnregistered, -2));
}

/// Without a current context (a runtime may ask before it makes its own current), what an
/// address is is still answered.
#[test]
fn no_current_context_is_needed() {
    let _fake = setup();
    // SAFETY: valid out-parameters.
    unsafe {
        cuok(cuInit(0));
        cuok(cuCtxSetCurrent(ptr::null_mut()));
    }
    let local = 3u32;
    let ptr = (&raw const local) as u64;
    assert_eq!(
        plural(&[d::CU_POINTER_ATTRIBUTE_MEMORY_TYPE], ptr),
        Ok(vec![0])
    );
}

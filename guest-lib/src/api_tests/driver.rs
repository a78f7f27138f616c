//! The driver API face (`libcuda.so.1`) against the test double: contexts, memory, memsets of
//! every width, 2D copies, modules and libraries, launches with pointer arrays and packed
//! buffers, and the cuFFT table that lists a module's functions.

use qcuda_proto::Op;
use std::ffi::{c_void, CStr};

use super::*;
use crate::{
    driver::{
        api::{context::*, device::*, init::*, launch::*, memory::*, module::*, stream::*},
        export_tables::cuGetExportTable,
        status::DriverError,
    },
    generated::driver_api as d,
};

#[track_caller]
fn cu(r: d::CUresult) {
    assert_eq!(DriverError::check(r), Ok(()));
}

/// A fake fatbin image as the test double accepts it.
fn image() -> Vec<u64> {
    let mut words = vec![0u64; IMAGE_LEN / 8];
    words[0] = u64::from(crate::core::modules::fatbin::FATBIN_MAGIC) | 1 << 32 | 16 << 48;
    words[1] = (IMAGE_LEN - 16) as u64;
    words
}

#[test]
fn attribute_and_occupancy_calls_load_a_function_before_its_first_launch() {
    let fake = setup();
    fake.add_kernel("k1", &[(0, 8)]);
    fake.add_kernel("k2", &[(0, 8)]);
    fake.add_kernel("k3", &[(0, 8)]);
    let img = image();
    let attr_calls = |fake: &FakeDevice| {
        fake.state()
            .log
            .iter()
            .filter(|l| l.op == Op::FuncAttributes)
            .count()
    };
    let is_loaded = |f: d::CUfunction| {
        let mut st = 99;
        // SAFETY: a valid out-parameter.
        cu(unsafe { cuFuncIsLoaded(&raw mut st, f) });
        st == d::CU_FUNCTION_LOADING_STATE_LOADED
    };
    // SAFETY: valid out-parameters and the fake image throughout.
    unsafe {
        cu(cuInit(0));
        let mut primary: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut primary, 0));
        cu(cuCtxSetCurrent(primary));
        let mut m: d::CUmodule = std::ptr::null_mut();
        cu(cuModuleLoadData(&raw mut m, img.as_ptr().cast()));
        let [mut f1, mut f2, mut f3]: [d::CUfunction; 3] = [std::ptr::null_mut(); 3];
        cu(cuModuleGetFunction(&raw mut f1, m, c"k1".as_ptr()));
        cu(cuModuleGetFunction(&raw mut f2, m, c"k2".as_ptr()));
        cu(cuModuleGetFunction(&raw mut f3, m, c"k3".as_ptr()));
        // As under the driver's lazy loading: not loaded until something loads it.
        assert!(!is_loaded(f1) && !is_loaded(f2) && !is_loaded(f3));

        // An attribute query is the moment the host loads it (vhost-cuda: cuFuncLoad first).
        let mut v = 0;
        cu(cuFuncGetAttribute(
            &raw mut v,
            d::CU_FUNC_ATTRIBUTE_NUM_REGS,
            f1,
        ));
        assert!(is_loaded(f1));
        let mut blocks = 0;
        cu(cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &raw mut blocks,
            f2,
            128,
            0,
        ));
        assert!(is_loaded(f2));

        // cuFuncLoad (what NVIDIA's runtime calls when cuFuncIsLoaded says UNLOADED) reaches
        // the host, once.
        let before = attr_calls(&fake);
        cu(cuFuncLoad(f3));
        assert_eq!(attr_calls(&fake), before + 1);
        assert!(is_loaded(f3));
        cu(cuFuncLoad(f3));
        assert_eq!(attr_calls(&fake), before + 1);
    }
}

#[test]
fn contexts_memory_memsets_and_2d_copies() {
    let _fake = setup();
    // SAFETY: valid out-parameters and buffers throughout.
    unsafe {
        cu(cuInit(0));
        let mut dev = -1;
        cu(cuDeviceGet(&raw mut dev, 0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuCtxCreate_v4(&raw mut ctx, std::ptr::null_mut(), 0, dev));
        let mut cur: d::CUcontext = std::ptr::null_mut();
        cu(cuCtxGetCurrent(&raw mut cur));
        assert_eq!(cur, ctx);

        let mut p: d::CUdeviceptr = 0;
        cu(cuMemAlloc_v2(&raw mut p, 64));
        let zeros = [0u8; 64];
        cu(cuMemcpyHtoD_v2(p, zeros.as_ptr().cast(), 64));
        cu(cuMemsetD8_v2(p, 0xab, 2));
        cu(cuMemsetD16_v2(p + 4, 0x1234, 2));
        cu(cuMemsetD32_v2(p + 8, 0xdead_beef, 1));
        let mut back = [0u8; 16];
        cu(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), p, 16));
        assert_eq!(
            back,
            [0xab, 0xab, 0, 0, 0x34, 0x12, 0x34, 0x12, 0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0]
        );

        // A 3x2 block out of a host image with pitch 8, into device rows of pitch 4.
        let host: Vec<u8> = (0..16).collect();
        let desc = d::CUDA_MEMCPY2D {
            srcXInBytes: 1,
            srcY: 0,
            srcMemoryType: d::CU_MEMORYTYPE_HOST,
            srcHost: host.as_ptr().cast(),
            srcPitch: 8,
            dstMemoryType: d::CU_MEMORYTYPE_DEVICE,
            dstDevice: p + 32,
            dstPitch: 4,
            WidthInBytes: 3,
            Height: 2,
            ..Default::default()
        };
        cu(cuMemcpy2D_v2(&raw const desc));
        let mut rows = [0u8; 8];
        cu(cuMemcpyDtoH_v2(rows.as_mut_ptr().cast(), p + 32, 8));
        assert_eq!(rows, [1, 2, 3, 0, 9, 10, 11, 0]);
        // An array side without an array.
        let array = d::CUDA_MEMCPY2D {
            srcMemoryType: d::CU_MEMORYTYPE_ARRAY,
            ..desc
        };
        assert_eq!(
            DriverError::check(cuMemcpy2D_v2(&raw const array)),
            Err(DriverError::INVALID_VALUE)
        );

        let (mut base, mut size) = (0, 0);
        cu(cuMemGetAddressRange_v2(
            &raw mut base,
            &raw mut size,
            p + 10,
        ));
        assert_eq!((base, size), (p, 64));
        cu(cuMemFree_v2(p));
        cu(cuCtxDestroy_v2(ctx));
        // With the stack empty, the device's primary context is current again: the session
        // uses the device (guest-lib.md, "Limits": NVIDIA's driver would have none current).
        cu(cuCtxGetCurrent(&raw mut cur));
        assert_eq!(
            cur as usize,
            crate::core::runtime::context::primary(0).handle()
        );
        let mut id = 0;
        assert_eq!(
            DriverError::check(cuCtxGetId(ctx, &raw mut id)),
            Err(DriverError::CONTEXT_IS_DESTROYED)
        );
    }
}

#[test]
fn modules_libraries_and_launches() {
    let fake = setup();
    fake.add_kernel("k", &[(0, 8), (8, 4)]);
    let img = image();
    // SAFETY: valid out-parameters, the fake image, and parameter storage that outlives the
    // calls.
    unsafe {
        cu(cuInit(0));
        let mut primary: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut primary, 0));
        cu(cuCtxSetCurrent(primary));

        let mut m: d::CUmodule = std::ptr::null_mut();
        cu(cuModuleLoadData(&raw mut m, img.as_ptr().cast()));
        let mut f: d::CUfunction = std::ptr::null_mut();
        cu(cuModuleGetFunction(&raw mut f, m, c"k".as_ptr()));
        let mut again: d::CUfunction = std::ptr::null_mut();
        cu(cuModuleGetFunction(&raw mut again, m, c"k".as_ptr()));
        assert_eq!(f, again);
        let (mut off, mut size) = (0, 0);
        cu(cuFuncGetParamInfo(f, 1, &raw mut off, &raw mut size));
        assert_eq!((off, size), (8, 4));

        // Parameters by pointer array and as one packed buffer give the same block.
        let (a, b) = (0x1122_3344_5566_7788u64, 0x99aa_bbccu32);
        let mut args = [
            (&raw const a).cast::<c_void>().cast_mut(),
            (&raw const b).cast::<c_void>().cast_mut(),
        ];
        cu(cuLaunchKernel(
            f,
            2,
            1,
            1,
            32,
            1,
            1,
            0,
            std::ptr::null_mut(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        ));
        let mut packed = [0u8; 12];
        packed[..8].copy_from_slice(&a.to_le_bytes());
        packed[8..].copy_from_slice(&b.to_le_bytes());
        let mut packed_size = packed.len();
        let mut extra = [
            std::ptr::without_provenance_mut(1), // CU_LAUNCH_PARAM_BUFFER_POINTER
            packed.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(2), // CU_LAUNCH_PARAM_BUFFER_SIZE
            (&raw mut packed_size).cast(),
            std::ptr::null_mut(),
        ];
        cu(cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            extra.as_mut_ptr(),
        ));
        let mut short = 4usize;
        extra[3] = (&raw mut short).cast();
        assert_eq!(
            DriverError::check(cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                extra.as_mut_ptr()
            )),
            Err(DriverError::INVALID_VALUE)
        );

        // A library's kernel launches as a CUkernel.
        let mut lib: d::CUlibrary = std::ptr::null_mut();
        cu(cuLibraryLoadData(
            &raw mut lib,
            img.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        ));
        let mut kern: d::CUkernel = std::ptr::null_mut();
        cu(cuLibraryGetKernel(&raw mut kern, lib, c"k".as_ptr()));
        cu(cuLaunchKernel(
            kern.cast(),
            3,
            1,
            1,
            64,
            1,
            1,
            0,
            std::ptr::null_mut(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        ));
        flush();
        let params: Vec<Vec<u8>> = fake
            .state()
            .launches
            .iter()
            .map(|l| l.params.clone())
            .collect();
        assert_eq!(params, [packed.to_vec(), packed.to_vec(), packed.to_vec()]);
        // A CUkernel resolved once launches with no lookup on the host: one fire-and-forget
        // LaunchKernel per launch, as a runtime launch.
        let logged = fake.state().log.len();
        let mut launch_kern = || {
            cuLaunchKernel(
                kern.cast(),
                3,
                1,
                1,
                64,
                1,
                1,
                0,
                std::ptr::null_mut(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        cu(launch_kern());
        cu(launch_kern());
        flush();
        let ops: Vec<(Op, bool)> = fake.state().log[logged..]
            .iter()
            .map(|l| (l.op, l.fire_and_forget))
            .filter(|(op, _)| *op != Op::Batch)
            .collect();
        assert_eq!(ops, [(Op::LaunchKernel, true), (Op::LaunchKernel, true)]);

        // cuFFT's table: a module's functions, each through the caller's sink.
        let mut table: *const c_void = std::ptr::null();
        let id = d::CUuuid {
            bytes: [
                0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1,
                0x99, 0x1e,
            ]
            .map(u8::cast_signed),
        };
        cu(cuGetExportTable(&raw mut table, &raw const id));
        let slot7: unsafe extern "C" fn(
            usize,
            usize,
            Option<unsafe extern "C" fn(*mut c_void, usize)>,
            *mut c_void,
        ) -> i32 = std::mem::transmute(*table.cast::<usize>().add(7));
        unsafe extern "C" fn sink(user: *mut c_void, f: usize) {
            // SAFETY: the test passes a Vec<usize>.
            unsafe { (*user.cast::<Vec<usize>>()).push(f) };
        }
        let mut seen: Vec<usize> = Vec::new();
        let n = slot7(0, m as usize, Some(sink), (&raw mut seen).cast());
        assert_eq!(n, 1);
        assert_eq!(seen, [f as usize]);

        let mut name: *const std::ffi::c_char = std::ptr::null();
        cu(cuFuncGetName(&raw mut name, f));
        assert_eq!(CStr::from_ptr(name), c"k");
        cu(cuModuleUnload(m));
        assert_eq!(
            DriverError::check(cuModuleGetFunction(&raw mut again, m, c"k".as_ptr())),
            Err(DriverError::INVALID_HANDLE)
        );
        cu(cuLibraryUnload(lib));
        // Its kernels go with it, cached functions or not.
        assert_eq!(
            DriverError::check(launch_kern()),
            Err(DriverError::INVALID_HANDLE)
        );
        cu(cuDevicePrimaryCtxRelease_v2(0));
    }
}

#[test]
fn peer_access_between_contexts_of_two_devices() {
    FakeDevice::new(2).install();
    // SAFETY: valid out-parameters throughout.
    unsafe {
        cu(cuInit(0));
        let (mut c0, mut c1): (d::CUcontext, d::CUcontext) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        cu(cuDevicePrimaryCtxRetain(&raw mut c0, 0));
        cu(cuDevicePrimaryCtxRetain(&raw mut c1, 1));
        let mut can = 0;
        cu(cuDeviceCanAccessPeer(&raw mut can, 0, 1));
        assert_eq!(can, 1);
        cu(cuCtxSetCurrent(c0));
        cu(cuCtxEnablePeerAccess(c1, 0));
        assert_eq!(
            DriverError::check(cuCtxEnablePeerAccess(c1, 1)),
            Err(DriverError::INVALID_VALUE)
        );
        assert_eq!(
            DriverError::check(cuCtxEnablePeerAccess(std::ptr::null_mut(), 0)),
            Err(DriverError::INVALID_HANDLE)
        );
        // A context is no peer of its own device (the host's answer).
        assert!(DriverError::check(cuCtxEnablePeerAccess(c0, 0)).is_err());
        cu(cuCtxDisablePeerAccess(c1));

        // A 3D peer copy (what cufftXt issues between the GPUs of a plan): a 4x2 block from
        // device 1's memory (pitch 8) into device 0's (pitch 4).
        cu(cuCtxSetCurrent(c1));
        let mut src: d::CUdeviceptr = 0;
        cu(cuMemAlloc_v2(&raw mut src, 16));
        let bytes: Vec<u8> = (0..16).collect();
        cu(cuMemcpyHtoD_v2(src, bytes.as_ptr().cast(), 16));
        cu(cuCtxSetCurrent(c0));
        let mut dst: d::CUdeviceptr = 0;
        cu(cuMemAlloc_v2(&raw mut dst, 8));
        let peer = d::CUDA_MEMCPY3D_PEER {
            srcMemoryType: d::CU_MEMORYTYPE_DEVICE,
            srcDevice: src,
            srcContext: c1,
            srcPitch: 8,
            srcHeight: 2,
            dstMemoryType: d::CU_MEMORYTYPE_DEVICE,
            dstDevice: dst,
            dstContext: c0,
            dstPitch: 4,
            dstHeight: 2,
            WidthInBytes: 4,
            Height: 2,
            Depth: 1,
            ..Default::default()
        };
        cu(crate::driver::api::arrays::cuMemcpy3DPeer(&raw const peer));
        let mut back = [0u8; 8];
        cu(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), dst, 8));
        assert_eq!(back, [0, 1, 2, 3, 8, 9, 10, 11]);
        let bad = d::CUDA_MEMCPY3D_PEER {
            srcContext: 0xdead_0000 as d::CUcontext,
            ..peer
        };
        assert!(
            DriverError::check(crate::driver::api::arrays::cuMemcpy3DPeer(&raw const bad)).is_err()
        );
    }
}

#[test]
fn jit_linking_gathers_inputs_and_the_host_links_them() {
    use crate::driver::api::link::*;
    let _fake = setup();
    // SAFETY: valid out-parameters, option arrays and buffers throughout.
    unsafe {
        cu(cuInit(0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut ctx, 0));
        cu(cuCtxSetCurrent(ctx));
        let mut info = [0x55u8; 64];
        let mut error = [0x55u8; 64];
        let mut options = [
            d::CU_JIT_WALL_TIME,
            d::CU_JIT_INFO_LOG_BUFFER,
            d::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            d::CU_JIT_ERROR_LOG_BUFFER,
            d::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            d::CU_JIT_LOG_VERBOSE,
        ];
        let mut values: [*mut c_void; 6] = [
            std::ptr::null_mut(),
            info.as_mut_ptr().cast(),
            64 as *mut c_void,
            error.as_mut_ptr().cast(),
            64 as *mut c_void,
            std::ptr::without_provenance_mut(1),
        ];
        let mut state: d::CUlinkState = std::ptr::null_mut();
        cu(cuLinkCreate_v2(
            6,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
            &raw mut state,
        ));
        let mut img = image();
        let bytes = img.len() * 8;
        cu(cuLinkAddData_v2(
            state,
            d::CU_JIT_INPUT_FATBINARY,
            img.as_mut_ptr().cast(),
            bytes,
            c"k.fatbin".as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ));
        assert_eq!(
            DriverError::check(cuLinkAddData_v2(
                state,
                9,
                img.as_mut_ptr().cast(),
                bytes,
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )),
            Err(DriverError::INVALID_VALUE)
        );
        let (mut cubin, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        cu(cuLinkComplete(state, &raw mut cubin, &raw mut size));
        assert_eq!(size, bytes);
        assert_eq!(CStr::from_ptr(info.as_ptr().cast()).to_bytes(), b"linked 1");
        assert_eq!(values[2] as usize, 9, "the info log's bytes, NUL included");
        assert_eq!(error[0], 0);
        assert!(f32::from_bits(values[0] as usize as u32) >= 0.0);
        // The linked image loads.
        let mut module: d::CUmodule = std::ptr::null_mut();
        cu(cuModuleLoadData(&raw mut module, cubin));
        cu(cuModuleUnload(module));
        cu(cuLinkDestroy(state));
        assert_eq!(
            DriverError::check(cuLinkDestroy(state)),
            Err(DriverError::INVALID_HANDLE)
        );

        // A link the host's driver refuses: its error and log.
        values[4] = 64 as *mut c_void;
        cu(cuLinkCreate_v2(
            6,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
            &raw mut state,
        ));
        let mut bad = *b"bad ptx\0";
        cu(cuLinkAddData_v2(
            state,
            d::CU_JIT_INPUT_PTX,
            bad.as_mut_ptr().cast(),
            8,
            c"k.ptx".as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ));
        assert_eq!(
            DriverError::check(cuLinkComplete(state, &raw mut cubin, &raw mut size)),
            DriverError::check(d::CUDA_ERROR_INVALID_PTX)
        );
        assert_eq!(
            CStr::from_ptr(error.as_ptr().cast()).to_bytes(),
            b"error in k.ptx"
        );
        cu(cuLinkDestroy(state));

        // Options that hold guest pointers are not remoted.
        let mut names = [d::CU_JIT_GLOBAL_SYMBOL_NAMES];
        let mut v = [8 as *mut c_void];
        assert_eq!(
            DriverError::check(cuLinkCreate_v2(
                1,
                names.as_mut_ptr(),
                v.as_mut_ptr(),
                &raw mut state
            )),
            Err(DriverError::NOT_SUPPORTED)
        );
    }
}

#[test]
fn arrays_copies_and_texture_objects() {
    use crate::driver::api::arrays::*;
    let _fake = setup();
    // SAFETY: valid out-parameters, descriptors and buffers throughout.
    unsafe {
        cu(cuInit(0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut ctx, 0));
        cu(cuCtxSetCurrent(ctx));
        // A 2D float2 array of 8 x 4 elements.
        let desc = d::CUDA_ARRAY_DESCRIPTOR {
            Width: 8,
            Height: 4,
            Format: d::CU_AD_FORMAT_FLOAT,
            NumChannels: 2,
        };
        let mut a: d::CUarray = std::ptr::null_mut();
        cu(cuArrayCreate_v2(&raw mut a, &raw const desc));
        let mut got = d::CUDA_ARRAY_DESCRIPTOR::default();
        cu(cuArrayGetDescriptor_v2(&raw mut got, a));
        assert_eq!(
            (got.Width, got.Height, got.Format, got.NumChannels),
            (8, 4, d::CU_AD_FORMAT_FLOAT, 2)
        );
        let bad = d::CUDA_ARRAY_DESCRIPTOR {
            NumChannels: 3,
            ..desc
        };
        let mut unused: d::CUarray = std::ptr::null_mut();
        assert_eq!(
            DriverError::check(cuArrayCreate_v2(&raw mut unused, &raw const bad)),
            Err(DriverError::INVALID_VALUE)
        );
        // Host rows of 64 bytes (8 float2) into the array, then a 2 x 2 element window back.
        let host: Vec<u8> = (0..256u32).map(|i| i as u8).collect();
        let up = d::CUDA_MEMCPY2D {
            srcMemoryType: d::CU_MEMORYTYPE_HOST,
            srcHost: host.as_ptr().cast(),
            srcPitch: 64,
            dstMemoryType: d::CU_MEMORYTYPE_ARRAY,
            dstArray: a,
            WidthInBytes: 64,
            Height: 4,
            ..Default::default()
        };
        cu(cuMemcpy2D_v2(&raw const up));
        let mut back = [0u8; 32];
        let down = d::CUDA_MEMCPY2D {
            srcMemoryType: d::CU_MEMORYTYPE_ARRAY,
            srcArray: a,
            srcXInBytes: 16,
            srcY: 1,
            dstMemoryType: d::CU_MEMORYTYPE_HOST,
            dstHost: back.as_mut_ptr().cast(),
            dstPitch: 16,
            WidthInBytes: 16,
            Height: 2,
            ..Default::default()
        };
        cu(cuMemcpy2D_v2(&raw const down));
        assert_eq!(&back[..16], &host[64 + 16..64 + 32]);
        assert_eq!(&back[16..], &host[128 + 16..128 + 32]);
        // A byte offset that is not a whole element.
        let odd = d::CUDA_MEMCPY2D {
            srcXInBytes: 4,
            ..down
        };
        assert_eq!(
            DriverError::check(cuMemcpy2D_v2(&raw const odd)),
            Err(DriverError::INVALID_VALUE)
        );
        // Part of the first row through cuMemcpyAtoH (a byte offset along it).
        let mut row = [0u8; 48];
        cu(cuMemcpyAtoH_v2(row.as_mut_ptr().cast(), a, 16, 48));
        assert_eq!(&row[..], &host[16..64]);
        // A texture object over the array, and its descriptors back in the driver's terms.
        let mut res = d::CUDA_RESOURCE_DESC {
            resType: d::CU_RESOURCE_TYPE_ARRAY,
            ..Default::default()
        };
        res.res.array.hArray = a;
        let tex = d::CUDA_TEXTURE_DESC {
            filterMode: d::CU_TR_FILTER_MODE_LINEAR,
            flags: d::CU_TRSF_NORMALIZED_COORDINATES,
            ..Default::default()
        };
        let mut obj: d::CUtexObject = 0;
        cu(cuTexObjectCreate(
            &raw mut obj,
            &raw const res,
            &raw const tex,
            std::ptr::null(),
        ));
        let mut res_back = d::CUDA_RESOURCE_DESC::default();
        cu(cuTexObjectGetResourceDesc(&raw mut res_back, obj));
        assert_eq!(res_back.resType, d::CU_RESOURCE_TYPE_ARRAY);
        assert_eq!(res_back.res.array.hArray, a);
        let mut tex_back = d::CUDA_TEXTURE_DESC::default();
        cu(cuTexObjectGetTextureDesc(&raw mut tex_back, obj));
        assert_eq!(tex_back.filterMode, d::CU_TR_FILTER_MODE_LINEAR);
        assert_ne!(tex_back.flags & d::CU_TRSF_NORMALIZED_COORDINATES, 0);
        cu(cuTexObjectDestroy(obj));
        cu(cuArrayDestroy(a));
    }
}

/// Mixed programs: the runtime face's primary context is the driver face's current context
/// once a runtime call has selected the device, and a context the driver face makes current is
/// the one the runtime face then uses.
#[test]
fn the_runtime_primary_context_is_current_for_the_driver() {
    use crate::runtime::{devices::*, memory::cudaFree};
    let fake = FakeDevice::new(2);
    fake.install();
    let primary = |d| crate::core::runtime::context::primary(d).handle();
    // SAFETY: valid out-parameters throughout.
    unsafe {
        assert_eq!(cudaSetDevice(1), 0);
        let mut cur: d::CUcontext = std::ptr::null_mut();
        cu(cuCtxGetCurrent(&raw mut cur));
        assert_eq!(cur as usize, primary(1));
        let mut dev = -1;
        cu(cuCtxGetDevice(&raw mut dev));
        assert_eq!(dev, 1);
        // The context cuDevicePrimaryCtxRetain hands out is that same one.
        let mut retained: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut retained, 1));
        assert_eq!(retained, cur);
        cu(cuDevicePrimaryCtxRelease_v2(1));
        let (mut flags, mut active) = (0, 0);
        cu(cuDevicePrimaryCtxGetState(
            1,
            &raw mut flags,
            &raw mut active,
        ));
        assert_eq!(active, 1);

        // A context made through the driver API is what the runtime then works in.
        let mut created: d::CUcontext = std::ptr::null_mut();
        cu(cuCtxCreate_v2(&raw mut created, 0, 0));
        let mut rt_dev = -1;
        assert_eq!(cudaGetDevice(&raw mut rt_dev), 0);
        assert_eq!(rt_dev, 0);
        // cudaSetDevice puts that device's primary context in its place.
        assert_eq!(cudaSetDevice(1), 0);
        cu(cuCtxGetCurrent(&raw mut cur));
        assert_eq!(cur as usize, primary(1));
        cu(cuCtxDestroy_v2(created));
    }
    // Any runtime call that works on the device does it too: cudaFree(0) on a fresh thread.
    std::thread::spawn(move || {
        fake.install();
        // SAFETY: as above.
        unsafe {
            assert_eq!(cudaFree(std::ptr::null_mut()), 0);
            let mut cur: d::CUcontext = std::ptr::null_mut();
            cu(cuCtxGetCurrent(&raw mut cur));
            assert_eq!(cur as usize, primary(0));
            let mut dev = -1;
            cu(cuCtxGetDevice(&raw mut dev));
            assert_eq!(dev, 0);
        }
    })
    .join()
    .unwrap();
}

/// Profiler control with no profiler attached succeeds, in a current context, as natively.
#[test]
fn profiler_control_is_a_successful_no_op() {
    use crate::runtime::profiler::{cudaProfilerStart, cudaProfilerStop};
    let _fake = setup();
    // SAFETY: no arguments.
    unsafe {
        cu(cuInit(0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut ctx, 0));
        cu(cuCtxPushCurrent_v2(ctx));
        cu(cuProfilerStart());
        cu(cuProfilerStop());
        assert_eq!(cudaProfilerStart(), 0);
        assert_eq!(cudaProfilerStop(), 0);
        let mut popped: d::CUcontext = std::ptr::null_mut();
        cu(cuCtxPopCurrent_v2(&raw mut popped));
        cu(cuDevicePrimaryCtxRelease_v2(0));
    }
}

/// The driver face's small calls go out exactly as the runtime face's: the same requests, each
/// waited for (or not) the same way, with the same payloads. NVIDIA's runtime over our driver
/// then costs what our runtime costs per launch, synchronisation, small copy either way and
/// allocation with its free (the benchmark's rows; issue 35).
#[test]
fn driver_calls_send_what_runtime_calls_send() {
    use crate::runtime::{
        launch::cudaLaunchKernel,
        memory::{cudaFree, cudaMalloc, cudaMemcpy},
        streams::cudaStreamSynchronize,
    };
    let fake = setup();
    fake.add_kernel("k", &[(0, 8), (8, 4)]);
    let fatbin = register_fatbin();
    let stub = register_kernel(fatbin, c"k");
    let img = image();
    let mut a = 7u64;
    let mut b = 9u32;
    let mut args = [(&raw mut a).cast::<c_void>(), (&raw mut b).cast::<c_void>()];
    let host = [1u8, 2, 3, 4];
    let mut back = [0u8; 4];
    let calls = |from: usize| -> Vec<(Op, bool, u64, u64, qcuda_proto::WaitMode)> {
        flush();
        fake.state().log[from..]
            .iter()
            .map(|l| (l.op, l.fire_and_forget, l.in_len, l.out_len, l.wait))
            .collect()
    };
    // SAFETY: valid out-parameters, buffers and parameter storage throughout.
    unsafe {
        cu(cuInit(0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut ctx, 0));
        cu(cuCtxSetCurrent(ctx));
        let mut m: d::CUmodule = std::ptr::null_mut();
        cu(cuModuleLoadData(&raw mut m, img.as_ptr().cast()));
        let mut f: d::CUfunction = std::ptr::null_mut();
        cu(cuModuleGetFunction(&raw mut f, m, c"k".as_ptr()));
        let mut dev: *mut c_void = std::ptr::null_mut();
        assert_eq!(cudaMalloc(&raw mut dev, 64), 0);
        let mut dptr: d::CUdeviceptr = 0;
        cu(cuMemAlloc_v2(&raw mut dptr, 64));
        let grid = crate::generated::dim3 { x: 2, y: 1, z: 1 };
        let block = crate::generated::dim3 { x: 32, y: 1, z: 1 };
        // Each runtime call once first, so that what is loaded or cached stays out of the way.
        assert_eq!(
            cudaLaunchKernel(
                stub as *const c_void,
                grid,
                block,
                args.as_mut_ptr(),
                0,
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(cudaStreamSynchronize(std::ptr::null_mut()), 0);

        let start = fake.state().log.len();
        assert_eq!(
            cudaLaunchKernel(
                stub as *const c_void,
                grid,
                block,
                args.as_mut_ptr(),
                0,
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(cudaStreamSynchronize(std::ptr::null_mut()), 0);
        assert_eq!(
            cudaMemcpy(
                dev,
                host.as_ptr().cast(),
                4,
                crate::generated::cudaMemcpyHostToDevice
            ),
            0
        );
        assert_eq!(cudaStreamSynchronize(std::ptr::null_mut()), 0);
        assert_eq!(
            cudaMemcpy(
                back.as_mut_ptr().cast(),
                dev,
                4,
                crate::generated::cudaMemcpyDeviceToHost
            ),
            0
        );
        let mut block_mib: *mut c_void = std::ptr::null_mut();
        assert_eq!(cudaMalloc(&raw mut block_mib, 1 << 20), 0);
        assert_eq!(cudaFree(block_mib), 0);
        let runtime = calls(start);

        let start = fake.state().log.len();
        cu(cuLaunchKernel(
            f,
            2,
            1,
            1,
            32,
            1,
            1,
            0,
            std::ptr::null_mut(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        ));
        cu(cuStreamSynchronize(std::ptr::null_mut()));
        cu(cuMemcpyHtoD_v2(dptr, host.as_ptr().cast(), 4));
        cu(cuStreamSynchronize(std::ptr::null_mut()));
        cu(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), dptr, 4));
        let mut block_mib: d::CUdeviceptr = 0;
        cu(cuMemAlloc_v2(&raw mut block_mib, 1 << 20));
        cu(cuMemFree_v2(block_mib));
        let driver = calls(start);

        let ops: Vec<Op> = runtime.iter().map(|c| c.0).collect();
        for op in [Op::MemcpyHtoD, Op::MemcpyDtoH, Op::Malloc, Op::Free] {
            assert_eq!(
                ops.iter().filter(|&&o| o == op).count(),
                1,
                "{op:?} in {ops:?}"
            );
        }
        assert_eq!(driver, runtime);
        cu(cuDevicePrimaryCtxRelease_v2(0));
    }
}

/// The CUDA 3.1 symbols of context creation and the stack (what old binaries and
/// `cuGetProcAddress` at those versions get) behave as their `_v2` forms.
#[test]
fn first_context_symbols_are_their_v2_forms() {
    let _fake = setup();
    // SAFETY: valid out-parameters.
    unsafe {
        cu(cuInit(0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuCtxCreate(&raw mut ctx, 0, 0));
        let mut cur: d::CUcontext = std::ptr::null_mut();
        cu(cuCtxGetCurrent(&raw mut cur));
        assert_eq!(cur, ctx);
        let mut popped: d::CUcontext = std::ptr::null_mut();
        cu(cuCtxPopCurrent(&raw mut popped));
        assert_eq!(popped, ctx);
        cu(cuCtxPushCurrent(ctx));
        cu(cuCtxDestroy(ctx));
        assert_eq!(
            DriverError::check(cuCtxPushCurrent(ctx)),
            Err(DriverError::CONTEXT_IS_DESTROYED)
        );
    }
}

/// `cuModuleGetLoadingMode` answers eager unless `CUDA_MODULE_LOADING=LAZY` (the tests run
/// without the variable, or with the CI's own).
#[test]
fn the_loading_mode_is_eager_by_default() {
    let _fake = setup();
    let want = match std::env::var("CUDA_MODULE_LOADING").as_deref() {
        Ok("LAZY") => d::CU_MODULE_LAZY_LOADING,
        _ => d::CU_MODULE_EAGER_LOADING,
    };
    let mut mode = 0;
    // SAFETY: valid out-parameter; null is refused.
    unsafe {
        cu(cuInit(0));
        cu(cuModuleGetLoadingMode(&raw mut mode));
        assert_eq!(mode, want);
        assert_eq!(
            DriverError::check(cuModuleGetLoadingMode(std::ptr::null_mut())),
            Err(DriverError::INVALID_VALUE)
        );
    }
}

/// A library keeps its own copy of the image, made once at `cuLibraryLoadData` (what the host
/// loads later is what was passed then), unless the caller keeps it
/// (`CU_LIBRARY_BINARY_IS_PRESERVED`): then the caller's bytes are what the host gets, with no
/// copy in the guest. `cuLibraryLoadFromFile` reads the file once and refuses the option.
#[test]
fn libraries_copy_their_image_once_or_not_at_all() {
    let fake = setup();
    let load = |img: &mut Vec<u64>, preserved: bool| {
        let mut lib: d::CUlibrary = std::ptr::null_mut();
        let mut opt = d::CU_LIBRARY_BINARY_IS_PRESERVED;
        let mut value: *mut c_void = std::ptr::without_provenance_mut(1); // "true"
                                                                          // SAFETY: valid out-parameter, image and one option.
        cu(unsafe {
            cuLibraryLoadData(
                &raw mut lib,
                img.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                &raw mut opt,
                &raw mut value,
                u32::from(preserved),
            )
        });
        // Changed after the load, before the first use.
        img[2] = 0x1234_5678;
        let mut m: d::CUmodule = std::ptr::null_mut();
        // SAFETY: valid out-parameter; the library is live.
        cu(unsafe { cuLibraryGetModule(&raw mut m, lib) });
        // The only module loaded: the last one went with its library.
        let loaded = fake.state().modules.values().last().unwrap().clone();
        // SAFETY: the library is live; after this the image may go.
        cu(unsafe { cuLibraryUnload(lib) });
        u64::from_le_bytes(loaded[16..24].try_into().unwrap())
    };
    // SAFETY: no pointers.
    unsafe {
        cu(cuInit(0));
        let mut ctx: d::CUcontext = std::ptr::null_mut();
        cu(cuDevicePrimaryCtxRetain(&raw mut ctx, 0));
        cu(cuCtxSetCurrent(ctx));
    }
    assert_eq!(
        load(&mut image(), false),
        0,
        "its own copy, made at the load"
    );
    assert_eq!(
        load(&mut image(), true),
        0x1234_5678,
        "the caller's own bytes"
    );

    let path = std::env::temp_dir().join(format!("qcuda-lib-{}.fatbin", std::process::id()));
    let bytes: Vec<u8> = image().iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(&path, &bytes).unwrap();
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let mut lib: d::CUlibrary = std::ptr::null_mut();
    let mut opt = d::CU_LIBRARY_BINARY_IS_PRESERVED;
    let mut value: *mut c_void = std::ptr::without_provenance_mut(1); // "true"
                                                                      // SAFETY: valid out-parameters, path and options.
    unsafe {
        assert_eq!(
            DriverError::check(cuLibraryLoadFromFile(
                &raw mut lib,
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                &raw mut opt,
                &raw mut value,
                1,
            )),
            Err(DriverError::INVALID_VALUE)
        );
        cu(cuLibraryLoadFromFile(
            &raw mut lib,
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        ));
        std::fs::remove_file(&path).unwrap();
        let mut m: d::CUmodule = std::ptr::null_mut();
        cu(cuLibraryGetModule(&raw mut m, lib));
        let loaded = fake.state().modules.values().last().unwrap().clone();
        assert_eq!(loaded, bytes, "the file's image, exactly");
        cu(cuLibraryUnload(lib));

        // A count of library options with null arrays, as NVIDIA's runtime passes when it
        // loads cuBLAS's fatbins: no option, a library of its own copy (NVIDIA's driver takes
        // it; refusing it left cuBLAS without kernels).
        let img = image();
        cu(cuLibraryLoadData(
            &raw mut lib,
            img.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            2,
        ));
        cu(cuLibraryGetModule(&raw mut m, lib));
        cu(cuLibraryUnload(lib));
    }
}

use std::{ffi::c_void, ptr};

use qcuda_proto::{status, Op};

use super::*;
use crate::{
    core::fake_device::FakeDevice,
    core::last_error,
    generated::{self as cu, cudaKernel_t, cudaStream_t, dim3},
    runtime::{errors::cudaGetLastError, launch::*},
};

fn d3(x: u32, y: u32, z: u32) -> dim3 {
    dim3 { x, y, z }
}

/// `kernel<<<1, 1>>>()` of a kernel without parameters, checked to succeed.
fn launch_plain(host_fun: usize) {
    // SAFETY: the kernel takes no parameters.
    ok(unsafe {
        stub_launch(
            host_fun,
            d3(1, 1, 1),
            d3(1, 1, 1),
            0,
            ptr::null_mut(),
            &mut [],
        )
    });
}

/// What nvcc's stub does for `kernel<<<grid, block, smem, stream>>>(args)`.
///
/// # Safety
/// `args` must match the kernel's parameters.
unsafe fn stub_launch(
    host_fun: usize,
    grid: dim3,
    block: dim3,
    smem: usize,
    stream: cudaStream_t,
    args: &mut [*mut c_void],
) -> cu::cudaError_t {
    if __cudaPushCallConfiguration(grid, block, smem, stream) != 0 {
        return cu::cudaSuccess;
    }
    let mut handle: cudaKernel_t = ptr::null_mut();
    // SAFETY: valid out-pointers, as in the stub.
    unsafe {
        let _ = __cudaGetKernel(&raw mut handle, host_fun as *const c_void);
        let (mut g, mut b, mut s, mut st): (_, _, usize, cudaStream_t) =
            (d3(0, 0, 0), d3(0, 0, 0), 0, ptr::null_mut());
        let popped = __cudaPopCallConfiguration(
            &raw mut g,
            &raw mut b,
            &raw mut s,
            (&raw mut st).cast::<c_void>(),
        );
        if popped != cu::cudaSuccess {
            return popped;
        }
        __cudaLaunchKernel(handle, g, b, args.as_mut_ptr(), s, st)
    }
}

#[test]
fn a_launch_loads_lazily_packs_parameters_and_does_not_wait() {
    let fake = setup();
    fake.add_kernel("_Z3addPfS_i", &[(0, 8), (8, 8), (16, 4)]);
    let fatbin = register_fatbin();
    let add = register_kernel(fatbin, c"_Z3addPfS_i");
    assert!(
        fake.ops().iter().all(|o| !matches!(o, Op::ModuleLoad)),
        "nothing loads early"
    );

    let (mut a, mut b, mut n): (u64, u64, i32) = (0x1111, 0x2222, 1 << 20);
    let mut args: [*mut c_void; 3] = [
        (&raw mut a).cast(),
        (&raw mut b).cast(),
        (&raw mut n).cast(),
    ];
    // SAFETY: args match the kernel's (8, 8, 4)-byte parameters.
    ok(unsafe {
        stub_launch(
            add,
            d3(4096, 1, 1),
            d3(256, 1, 1),
            0,
            ptr::null_mut(),
            &mut args,
        )
    });
    ok(cudaGetLastError());

    flush();
    let s = fake.state();
    assert_eq!(s.modules.len(), 1);
    assert_eq!(
        s.modules.values().next().unwrap().len(),
        IMAGE_LEN,
        "the whole image is sent"
    );
    assert_eq!(s.launches.len(), 1);
    let l = &s.launches[0];
    assert!(l.fire_and_forget);
    assert_eq!(
        l.args[1..],
        [4096 | 1 << 32, 1 | 256 << 32, 1 | 1 << 32, 0, 0]
    );
    let mut want = Vec::new();
    want.extend_from_slice(&a.to_ne_bytes());
    want.extend_from_slice(&b.to_ne_bytes());
    want.extend_from_slice(&n.to_ne_bytes());
    assert_eq!(l.params, want);
    drop(s);

    // The second launch reuses the module and the resolved function.
    // SAFETY: args[2] points at `n`, an i32.
    unsafe { args[2].cast::<i32>().write(7) };
    // SAFETY: as above.
    ok(unsafe {
        stub_launch(
            add,
            d3(1, 1, 1),
            d3(32, 1, 1),
            0,
            ptr::null_mut(),
            &mut args,
        )
    });
    let ops = fake.ops();
    assert_eq!(ops.iter().filter(|o| **o == Op::ModuleLoad).count(), 1);
    assert_eq!(
        ops.iter().filter(|o| **o == Op::ModuleGetFunction).count(),
        1
    );
    assert_eq!(
        ops.iter().filter(|o| **o == Op::DeviceAttributes).count(),
        1,
        "limits cached"
    );
    flush();
    assert_eq!(fake.state().launches[1].params[16..20], 7i32.to_ne_bytes());
}

#[test]
fn cuda_launch_kernel_takes_a_host_stub_or_a_kernel_handle() {
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let fatbin = register_fatbin();
    let k = register_kernel(fatbin, c"_Z1kv");
    // SAFETY: the kernel takes no parameters, so args may be null.
    unsafe {
        ok(cudaLaunchKernel(
            k as *const c_void,
            d3(1, 1, 1),
            d3(1, 1, 1),
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        ));
        let mut h: cudaKernel_t = ptr::null_mut();
        ok(cudaGetKernel(&raw mut h, k as *const c_void));
        ok(cudaLaunchKernel_ptsz(
            h as *const c_void,
            d3(1, 1, 1),
            d3(1, 1, 1),
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        ));
        let mut name = ptr::null();
        ok(cudaFuncGetName(&raw mut name, k as *const c_void));
        assert_eq!(std::ffi::CStr::from_ptr(name), c"_Z1kv");
        let unknown = host_address() as *const c_void;
        assert_err(
            cudaLaunchKernel(
                unknown,
                d3(1, 1, 1),
                d3(1, 1, 1),
                ptr::null_mut(),
                0,
                ptr::null_mut(),
            ),
            cu::cudaErrorInvalidDeviceFunction,
        );
    }
    flush();
    assert_eq!(fake.state().launches.len(), 2);
    assert_eq!(fake.state().launches[0].params, Vec::<u8>::new());
    last_error::take();
}

#[test]
fn bad_configurations_fail_at_the_launch_without_reaching_the_host() {
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    // SAFETY: no parameters.
    unsafe {
        let r = stub_launch(k, d3(1, 1, 1), d3(2048, 1, 1), 0, ptr::null_mut(), &mut []);
        assert_err(r, cu::cudaErrorInvalidValue);
        assert_err(cudaGetLastError(), cu::cudaErrorInvalidValue);
        let r = stub_launch(k, d3(0, 1, 1), d3(1, 1, 1), 0, ptr::null_mut(), &mut []);
        assert_err(r, cu::cudaErrorInvalidValue);
    }
    assert!(fake.state().launches.is_empty());
    last_error::take();
}

#[test]
fn pop_without_push_is_a_missing_configuration() {
    setup();
    let (mut g, mut b, mut s, mut st) =
        (d3(0, 0, 0), d3(0, 0, 0), 0usize, ptr::null_mut::<c_void>());
    // SAFETY: valid out-pointers.
    let r = unsafe {
        __cudaPopCallConfiguration(&raw mut g, &raw mut b, &raw mut s, (&raw mut st).cast())
    };
    assert_err(r, cu::cudaErrorMissingConfiguration);
    last_error::take();
}

#[test]
fn kernels_with_many_parameters_are_asked_for_again() {
    let fake = setup();
    let layout: Vec<(u32, u32)> = (0..100).map(|i| (i * 4, 4)).collect();
    fake.add_kernel("_Z4manyv", &layout);
    let k = register_kernel(register_fatbin(), c"_Z4manyv");
    let mut values: Vec<i32> = (0..100).collect();
    let mut args: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut i32).cast()).collect();
    // SAFETY: 100 four-byte parameters.
    ok(unsafe { stub_launch(k, d3(1, 1, 1), d3(1, 1, 1), 0, ptr::null_mut(), &mut args) });
    assert_eq!(
        fake.ops()
            .iter()
            .filter(|o| **o == Op::ModuleGetFunction)
            .count(),
        2
    );
    flush();
    let params = &fake.state().launches[0].params;
    assert_eq!(params.len(), 400);
    assert_eq!(params[396..400], 99i32.to_ne_bytes());
}

#[test]
fn an_image_the_device_cannot_use_is_sent_once() {
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    fake.state().fail_next = Some((Op::ModuleLoad, status::NO_KERNEL_IMAGE_FOR_DEVICE, false));
    // SAFETY: no parameters.
    unsafe {
        for _ in 0..2 {
            let r = stub_launch(k, d3(1, 1, 1), d3(1, 1, 1), 0, ptr::null_mut(), &mut []);
            assert_err(r, cu::cudaErrorNoKernelImageForDevice);
        }
    }
    assert_eq!(
        fake.ops().iter().filter(|o| **o == Op::ModuleLoad).count(),
        1
    );
    last_error::take();
}

#[test]
fn large_parameter_blocks_are_not_fire_and_forget() {
    // Over the bounce threshold, qcuda.ko would keep the block pinned after returning, but the
    // block is freed as soon as the launch returns; so such a launch waits.
    let fake = setup();
    fake.add_kernel("_Z3bigv", &[(0, 70_000)]);
    let k = register_kernel(register_fatbin(), c"_Z3bigv");
    let mut big = vec![5u8; 70_000];
    let mut args: [*mut c_void; 1] = [big.as_mut_ptr().cast()];
    // SAFETY: one 70 000-byte parameter.
    ok(unsafe { stub_launch(k, d3(1, 1, 1), d3(1, 1, 1), 0, ptr::null_mut(), &mut args) });
    assert!(!fake.state().launches[0].fire_and_forget);
}

#[test]
fn an_interrupted_fire_and_forget_launch_is_sent_again() {
    // qcuda.ko returns EINTR for an async call only before queueing it.
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    // SAFETY: no parameters.
    ok(unsafe { stub_launch(k, d3(1, 1, 1), d3(1, 1, 1), 0, ptr::null_mut(), &mut []) });
    // SAFETY: no parameters.
    ok(unsafe { stub_launch(k, d3(1, 1, 1), d3(1, 1, 1), 0, ptr::null_mut(), &mut []) });
    // Both travel in one batch, whose send is interrupted once and repeated.
    fake.state().errnos.push_back(libc::EINTR);
    flush();
    assert_eq!(fake.state().launches.len(), 2);
    assert_eq!(fake.state().batches, 1);
}

#[test]
fn launch_blocking_waits_and_reports_at_the_launch() {
    let fake = FakeDevice::new(1);
    crate::core::runtime::install(
        crate::core::runtime::Runtime::connect(Box::new(fake.clone()), true).unwrap(),
    );
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    fake.state().fail_next = Some((Op::LaunchKernel, status::LAUNCH_OUT_OF_RESOURCES, false));
    // SAFETY: no parameters.
    let r = unsafe { stub_launch(k, d3(1, 1, 1), d3(1, 1, 1), 0, ptr::null_mut(), &mut []) };
    assert_err(r, cu::cudaErrorLaunchOutOfResources);
    assert!(!fake.state().launches[0].fire_and_forget);
    last_error::take();
}

#[test]
fn managed_variables_take_turns_between_launches_and_synchronisations() {
    use crate::runtime::{devices::cudaDeviceSynchronize, registration::*};
    let fake = setup();
    fake.add_kernel("_Z3incv", &[]);
    let p = fake.add_global("counter", 4);
    fake.state()
        .device_bytes_for_test(p, 4)
        .copy_from_slice(&5u32.to_le_bytes());
    let fatbin = register_fatbin();
    let inc = register_kernel(fatbin, c"_Z3incv");
    // nvcc's host code: a `static int *counter` that __cudaInitModule fills in.
    let mut counter: *mut u32 = ptr::null_mut();
    // SAFETY: arguments as nvcc passes them; `counter` outlives the test's use of it.
    unsafe {
        __cudaRegisterManagedVar(
            fatbin,
            (&raw mut counter).cast(),
            c"counter".as_ptr().cast_mut(),
            c"counter".as_ptr(),
            0,
            4,
            0,
            0,
        );
        assert_eq!(__cudaInitModule(fatbin), 1);
        assert!(!counter.is_null());
        // The module's initial value reached the program.
        assert_eq!(*counter, 5);
        // The host's turn: its write reaches the device at the next launch.
        *counter = 9;
        ok(stub_launch(
            inc,
            d3(1, 1, 1),
            d3(1, 1, 1),
            0,
            ptr::null_mut(),
            &mut [],
        ));
        flush();
        let dev = |f: &FakeDevice| {
            u32::from_le_bytes(f.state().device_bytes_for_test(p, 4).try_into().unwrap())
        };
        assert_eq!(dev(&fake), 9);
        // The "kernel" changes it; the host sees that after synchronising, not before.
        fake.state()
            .device_bytes_for_test(p, 4)
            .copy_from_slice(&11u32.to_le_bytes());
        assert_eq!(*counter, 9);
        ok(cudaDeviceSynchronize());
        assert_eq!(*counter, 11);
        // A second launch without a host turn in between copies nothing over the device's value.
        fake.state()
            .device_bytes_for_test(p, 4)
            .copy_from_slice(&12u32.to_le_bytes());
        ok(cudaDeviceSynchronize());
        let copies = fake
            .ops()
            .iter()
            .filter(|o| **o == Op::MemcpyMapped)
            .count();
        ok(stub_launch(
            inc,
            d3(1, 1, 1),
            d3(1, 1, 1),
            0,
            ptr::null_mut(),
            &mut [],
        ));
        flush();
        assert_eq!(
            fake.ops()
                .iter()
                .filter(|o| **o == Op::MemcpyMapped)
                .count(),
            copies + 1
        );
        __cudaUnregisterFatBinary(fatbin);
    }
    assert_eq!(fake.state().host_maps.len(), 0);
}

#[test]
fn function_attributes_and_occupancy_go_to_the_kernel_s_host_function() {
    use crate::generated::cudaFuncAttributes;
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let fatbin = register_fatbin();
    let k = register_kernel(fatbin, c"_Z1kv") as *const c_void;
    let mut fa = cudaFuncAttributes::default();
    let mut n = 0;
    // SAFETY: valid out-pointers; `k` is a registered host stub.
    unsafe {
        ok(cudaFuncGetAttributes(&raw mut fa, k));
        // The fake answers 100 + attribute id.
        assert_eq!(
            (fa.maxThreadsPerBlock, fa.sharedSizeBytes, fa.numRegs),
            (100, 101, 104)
        );
        assert_eq!(fa.clusterSchedulingPolicyPreference, 115);
        ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &raw mut n, k, 256, 0,
        ));
        assert_eq!(n, 8);
        assert_err(
            cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&raw mut n, k, 256, 0, 7),
            cu::cudaErrorInvalidValue,
        );
        ok(cudaFuncSetAttribute(
            k,
            cu::cudaFuncAttributeMaxDynamicSharedMemorySize,
            96 * 1024,
        ));
        assert_err(cudaFuncSetAttribute(k, 99, 1), cu::cudaErrorInvalidValue);
        assert_err(
            cudaFuncGetAttributes(&raw mut fa, host_address() as *const c_void),
            cu::cudaErrorInvalidDeviceFunction,
        );
    }
    cudaGetLastError();
    let ops = fake.ops();
    assert!(ops.contains(&Op::FuncAttributes) && ops.contains(&Op::OccupancyMaxActiveBlocks));
    assert!(ops.contains(&Op::FuncSetAttribute));
}

#[test]
fn a_synchronising_call_carries_the_gathered_work_in_one_request() {
    use crate::runtime::{errors::cudaGetLastError, streams::cudaStreamSynchronize};
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    // SAFETY: the legacy stream (null) is always a valid stream.
    let sync = || unsafe { cudaStreamSynchronize(ptr::null_mut()) };
    // The first launch loads the module, with waited calls.
    launch_plain(k);
    ok(sync());
    let before = fake.state().requests;
    // A launch fails on the host; the synchronisation reports it.
    fake.state().fail_next = Some((Op::LaunchKernel, 1, false));
    launch_plain(k);
    launch_plain(k);
    assert_eq!(sync(), 1);
    assert_eq!(cudaGetLastError(), 1);
    ok(sync());
    let s = fake.state();
    // Two launches and a synchronisation in one waited request, then the second
    // synchronisation alone (nothing gathered).
    assert_eq!(s.requests - before, 2);
    assert_eq!(s.batches, 2);
    let ops: Vec<(Op, bool)> = s
        .log
        .iter()
        .rev()
        .take(4)
        .rev()
        .map(|l| (l.op, l.fire_and_forget))
        .collect();
    assert_eq!(
        ops,
        [
            (Op::LaunchKernel, true),
            (Op::LaunchKernel, true),
            (Op::StreamSynchronize, false),
            (Op::StreamSynchronize, false)
        ]
    );
}

#[test]
fn an_interrupted_batch_with_a_synchronising_tail_runs_its_records_once() {
    use crate::runtime::devices::cudaDeviceSynchronize;
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    // SAFETY: no arguments.
    let sync = || unsafe { cudaDeviceSynchronize() };
    launch_plain(k);
    ok(sync());
    let launches = fake.state().launches.len();
    // Before queueing (EINTR) the whole batch goes again; after (EINPROGRESS) its records
    // ran, and only the synchronisation is asked again.
    for errno in [libc::EINTR, libc::EINPROGRESS] {
        launch_plain(k);
        fake.state().errnos.push_back(errno);
        ok(sync());
    }
    let s = fake.state();
    assert_eq!(s.launches.len(), launches + 2);
    let syncs = s
        .log
        .iter()
        .rev()
        .take_while(|l| l.op != Op::LaunchKernel)
        .count();
    assert_eq!(syncs, 2, "the synchronisation, in the batch and then alone");
}

#[test]
fn fire_and_forget_work_travels_in_batches_in_program_order() {
    use crate::runtime::{devices::cudaDeviceSynchronize, errors::cudaGetLastError};
    let fake = setup();
    fake.add_kernel("_Z1kPi", &[(0, 8)]);
    let k = register_kernel(register_fatbin(), c"_Z1kPi");
    // SAFETY: one 8-byte parameter each time.
    unsafe {
        for i in 0..2000u64 {
            let mut v = i;
            let mut args: [*mut c_void; 1] = [(&raw mut v).cast()];
            ok(stub_launch(
                k,
                d3(1, 1, 1),
                d3(1, 1, 1),
                0,
                ptr::null_mut(),
                &mut args,
            ));
        }
        // The synchronisation goes after everything gathered before it.
        ok(cudaDeviceSynchronize());
    }
    let s = fake.state();
    assert_eq!(s.launches.len(), 2000);
    assert!(s
        .launches
        .iter()
        .enumerate()
        .all(|(i, l)| l.params == (i as u64).to_ne_bytes()));
    // 2000 launches of 88 bytes, in 64 KiB batches while the loop keeps adding, the last one
    // carried by the synchronisation.
    let full = (2000 * 88 / crate::core::transport::batch::BATCH_BYTES) as u64;
    assert_eq!(s.batches, full + 1, "{} batches", s.batches);
    assert_eq!(s.log.last().unwrap().op, Op::DeviceSynchronize);
    drop(s);
    hold_batches(false);

    // Without a later call, the flusher sends the batch within moments.
    // SAFETY: as above.
    unsafe {
        let mut v = 7u64;
        let mut args: [*mut c_void; 1] = [(&raw mut v).cast()];
        ok(stub_launch(
            k,
            d3(1, 1, 1),
            d3(1, 1, 1),
            0,
            ptr::null_mut(),
            &mut args,
        ));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while fake.state().launches.len() < 2001 {
        assert!(
            std::time::Instant::now() < deadline,
            "the batch was never flushed"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    // A batched op that fails is reported at the next synchronisation, as a single one is.
    fake.state().fail_next = Some((Op::LaunchKernel, status::LAUNCH_OUT_OF_RESOURCES, false));
    // SAFETY: as above.
    unsafe {
        let mut v = 8u64;
        let mut args: [*mut c_void; 1] = [(&raw mut v).cast()];
        ok(stub_launch(
            k,
            d3(1, 1, 1),
            d3(1, 1, 1),
            0,
            ptr::null_mut(),
            &mut args,
        ));
        assert_err(cudaDeviceSynchronize(), cu::cudaErrorLaunchOutOfResources);
    }
    assert_err(cudaGetLastError(), cu::cudaErrorLaunchOutOfResources);
    ok(cudaGetLastError());
}

#[test]
fn launch_ex_sends_its_attributes_and_tuning_calls_reach_the_host() {
    use qcuda_proto::{LaunchAttr, LAUNCH_ATTR_SIZE};

    use crate::{
        generated::{cudaEvent_t, cudaLaunchAttribute, cudaLaunchConfig_t},
        runtime::{events::cudaEventCreate, launch_ex::*},
    };
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let fatbin = register_fatbin();
    let k = register_kernel(fatbin, c"_Z1kv") as *const c_void;
    let mut attrs: [cudaLaunchAttribute; 3] = Default::default();
    attrs[0].id = cu::cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = 2;
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cu::cudaLaunchAttributePriority;
    attrs[1].val.priority = -3;
    attrs[2].id = cu::cudaLaunchAttributeCooperative;
    attrs[2].val.cooperative = 1;
    let mut config = cudaLaunchConfig_t {
        gridDim: d3(8, 1, 1),
        blockDim: d3(64, 1, 1),
        dynamicSmemBytes: 0,
        stream: ptr::null_mut(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: 3,
    };
    let decoded = |fake: &FakeDevice| -> Vec<LaunchAttr> {
        fake.state()
            .launch_attrs
            .chunks_exact(LAUNCH_ATTR_SIZE)
            .map(|c| LaunchAttr::decode(c).unwrap())
            .collect()
    };
    // SAFETY: valid configuration and pointers; the kernel has no parameters.
    unsafe {
        ok(cudaLaunchKernelExC(&raw const config, k, ptr::null_mut()));
        let sent = decoded(&fake);
        assert_eq!(sent.len(), 3);
        assert_eq!((sent[0].id, sent[0].v), (4, [2, 1, 1]));
        assert_eq!((sent[1].id, sent[1].v[0] as i32), (8, -3));
        assert_eq!((sent[2].id, sent[2].v[0]), (2, 1));
        assert_eq!(fake.state().launches.len(), 1);

        // An event attribute names the host's event.
        let mut e: cudaEvent_t = ptr::null_mut();
        ok(cudaEventCreate(&raw mut e));
        (*config.attrs.add(1)).id = cu::cudaLaunchAttributeLaunchCompletionEvent;
        (*config.attrs.add(1)).val.launchCompletionEvent.event = e;
        ok(cudaLaunchKernelExC_ptsz(
            &raw const config,
            k,
            ptr::null_mut(),
        ));
        let host_event = *fake.state().events.keys().max().unwrap();
        assert_eq!(decoded(&fake)[1].w[0], host_event);
        (*config.attrs.add(1)).val.launchCompletionEvent.event = 0x77 as cudaEvent_t;
        assert_err(
            cudaLaunchKernelExC(&raw const config, k, ptr::null_mut()),
            cu::cudaErrorInvalidResourceHandle,
        );
        // Unknown ids are refused with the driver's answer; graph-only ones as unsupported.
        (*config.attrs.add(1)).id = 99;
        assert_err(
            cudaLaunchKernelExC(&raw const config, k, ptr::null_mut()),
            cu::cudaErrorInvalidValue,
        );
        (*config.attrs.add(1)).id = cu::cudaLaunchAttributeDeviceUpdatableKernelNode;
        assert_err(
            cudaLaunchKernelExC(&raw const config, k, ptr::null_mut()),
            cu::cudaErrorNotSupported,
        );
        config.numAttrs = 0;
        flush();
        let before = fake.state().launches.len();
        ok(cudaLaunchKernelExC(&raw const config, k, ptr::null_mut()));
        flush();
        assert_eq!(fake.state().launches.len(), before + 1);
        assert_eq!(
            fake.ops().last(),
            Some(&Op::LaunchKernel),
            "no attributes: a plain launch"
        );
        assert_err(
            cudaLaunchKernelExC(ptr::null(), k, ptr::null_mut()),
            cu::cudaErrorInvalidValue,
        );

        // Cluster occupancy carries the configuration's attributes (an Ignore record if none).
        config.numAttrs = 1;
        let mut n = 0;
        ok(cudaOccupancyMaxPotentialClusterSize(
            &raw mut n,
            k,
            &raw const config,
        ));
        assert_eq!(n, 8);
        ok(cudaOccupancyMaxActiveClusters(
            &raw mut n,
            k,
            &raw const config,
        ));
        assert_eq!(n, 16);
        assert_eq!(decoded(&fake)[0].v, [2, 1, 1]);
        config.numAttrs = 0;
        ok(cudaOccupancyMaxActiveClusters(
            &raw mut n,
            k,
            &raw const config,
        ));
        assert_eq!(decoded(&fake), vec![LaunchAttr::default()]);
        let mut smem = 0usize;
        ok(cudaOccupancyAvailableDynamicSMemPerBlock(
            &raw mut smem,
            k,
            2,
            128,
        ));
        assert_eq!(smem, 2128);
        assert_err(
            cudaOccupancyAvailableDynamicSMemPerBlock(&raw mut smem, k, -1, 128),
            cu::cudaErrorInvalidValue,
        );

        // Cache and shared memory configuration.
        ok(cudaFuncSetCacheConfig(k, cu::cudaFuncCachePreferShared));
        assert_eq!(fake.state().cache_config, 1);
        assert_err(cudaFuncSetCacheConfig(k, 4), cu::cudaErrorInvalidValue);
        ok(cudaDeviceSetCacheConfig(cu::cudaFuncCachePreferL1));
        let mut c = 0;
        ok(cudaDeviceGetCacheConfig(&raw mut c));
        assert_eq!(c, cu::cudaFuncCachePreferL1);
        let mut bank = 0;
        ok(cudaDeviceSetSharedMemConfig(
            cu::cudaSharedMemBankSizeEightByte,
        ));
        ok(cudaDeviceGetSharedMemConfig(&raw mut bank));
        assert_eq!(bank, cu::cudaSharedMemBankSizeFourByte);
        assert_err(cudaDeviceSetSharedMemConfig(3), cu::cudaErrorInvalidValue);
        ok(cudaFuncSetSharedMemConfig(
            k,
            cu::cudaSharedMemBankSizeDefault,
        ));
        assert_err(
            cudaFuncSetSharedMemConfig(host_address() as *const c_void, 0),
            cu::cudaErrorInvalidDeviceFunction,
        );
    }
    cudaGetLastError();
}

#[test]
fn managed_memory_is_the_device_s_during_work_and_the_host_s_after_synchronising() {
    use crate::runtime::{
        devices::cudaDeviceSynchronize,
        memory::{cudaFree, cudaMallocManaged, cudaMemcpy, cudaMemset},
        streams::cudaStreamSynchronize,
    };
    use qcuda_proto::MANAGED_ALIGN;
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let fatbin = register_fatbin();
    let k = register_kernel(fatbin, c"_Z1kv");
    let migrations = |f: &FakeDevice| f.ops().iter().filter(|o| **o == Op::ManagedMigrate).count();
    let launch = || {
        // SAFETY: the kernel takes no parameters.
        ok(unsafe { stub_launch(k, d3(1, 1, 1), d3(1, 1, 1), 0, ptr::null_mut(), &mut []) });
        flush();
    };
    let mut m: *mut c_void = ptr::null_mut();
    // SAFETY: `m` is managed memory of 4096 bytes, touched by the CPU only between turns.
    unsafe {
        ok(cudaMallocManaged(&raw mut m, 4096, 1));
        let base = m as u64;
        assert_eq!(base % MANAGED_ALIGN, 0, "placed on its own granule");
        assert!(
            fake.state().managed.contains_key(&base),
            "placed on the device"
        );
        let host = std::slice::from_raw_parts_mut(m.cast::<u8>(), 4096);
        host[..4].copy_from_slice(b"abcd");
        // The host's writes reach the device before a kernel runs.
        let before = migrations(&fake);
        launch();
        assert_eq!(migrations(&fake), before + 1);
        assert_eq!(fake.state().device_bytes_for_test(base, 4), b"abcd");
        // The "kernel" (and its atomics) write device memory; the CPU sees that only after
        // synchronising.
        fake.state()
            .device_bytes_for_test(base, 2)
            .copy_from_slice(b"XY");
        assert_eq!(&host[..4], b"abcd");
        // A blocking copy the CPU does (host to host) is ordered after the work, as natively.
        let mut local = [0u8; 4];
        ok(cudaMemcpy(
            local.as_mut_ptr().cast(),
            m,
            4,
            cu::cudaMemcpyDefault,
        ));
        assert_eq!(&local, b"XYcd");
        assert_eq!(&host[..4], b"XYcd");
        assert_eq!(migrations(&fake), before + 2);
        ok(cudaDeviceSynchronize());
        assert_eq!(migrations(&fake), before + 2);
        // Nothing ran since: a synchronisation migrates nothing.
        ok(cudaStreamSynchronize(ptr::null_mut()));
        assert_eq!(migrations(&fake), before + 2);
        // A memset is work on managed memory too: the host's write goes first, the memset's
        // bytes come back at the synchronisation.
        host[3] = b'q';
        ok(cudaMemset(m.byte_add(1), i32::from(b'Z'), 1));
        ok(cudaDeviceSynchronize());
        assert_eq!(&host[..4], b"XZcq");
        assert_eq!(migrations(&fake), before + 4);
        ok(cudaFree(m));
        assert!(fake.state().managed.is_empty());
        assert_eq!(fake.state().host_maps.len(), 0);
        // Without managed memory, launches and synchronisations migrate nothing.
        launch();
        ok(cudaDeviceSynchronize());
        assert_eq!(migrations(&fake), before + 4);
    }
}

/// The guest's own cost per launch, for a profiler: `cargo test --release -p guest-lib --lib
/// launch_path_for_profiling -- --ignored` under `valgrind --tool=callgrind` (the fake's work
/// at each batch shows apart, under `FakeDevice`).
#[test]
#[ignore = "a workload for a profiler, not a check"]
fn launch_path_for_profiling() {
    use crate::runtime::devices::cudaDeviceSynchronize;
    let fake = setup();
    fake.add_kernel("_Z1kPi", &[(0, 8)]);
    let k = register_kernel(register_fatbin(), c"_Z1kPi");
    // SAFETY: one 8-byte parameter each time.
    unsafe {
        for i in 0..20_000u64 {
            let mut v = i;
            let mut args: [*mut c_void; 1] = [(&raw mut v).cast()];
            ok(stub_launch(
                k,
                d3(1, 1, 1),
                d3(1, 1, 1),
                0,
                ptr::null_mut(),
                &mut args,
            ));
        }
        ok(cudaDeviceSynchronize());
    }
    assert_eq!(fake.state().launches.len(), 20_000);
}

#[test]
fn a_batch_the_device_did_not_take_is_reported_once_at_the_next_call() {
    use crate::runtime::{devices::cudaDeviceSynchronize, errors::cudaGetLastError};
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    launch_plain(k);
    fake.state().errnos.push_back(libc::EIO);
    flush();
    assert!(fake.state().launches.is_empty());
    // SAFETY: no arguments.
    ok(unsafe { cudaDeviceSynchronize() });
    assert_ne!(cudaGetLastError(), cu::cudaSuccess);
    // SAFETY: no arguments.
    ok(unsafe { cudaDeviceSynchronize() });
    assert_eq!(cudaGetLastError(), cu::cudaSuccess);
}

//! `cudaMallocManaged` over the fake device: the pointer is where the host's driver placed the
//! device memory (a window address only if the driver honoured the hint), taken in this
//! process for the allocation's pages; an address this process holds already is placed again;
//! and the migrations follow the attachments and wait for the work that may touch them.

use std::{ffi::c_void, ptr};

use qcuda_proto::{
    Op, HOST_WINDOW_BASE, HOST_WINDOW_LEN, MANAGED_ALIGN, MANAGED_SCOPE_GLOBAL,
    MANAGED_SCOPE_STREAM, MANAGED_TO_DEVICE, MANAGED_TO_HOST, MANAGED_WINDOW_BASE,
    MANAGED_WINDOW_LEN,
};

use super::*;
use crate::{
    core::fake_device::FakeDevice,
    generated::{self as cu, cudaStream_t, dim3},
    runtime::{
        devices::cudaDeviceSynchronize,
        launch::cudaLaunchKernel,
        memory::{cudaFree, cudaMallocManaged, cudaMemcpy},
        streams::{
            cudaStreamAttachMemAsync, cudaStreamCreate, cudaStreamDestroy, cudaStreamSynchronize,
        },
    },
};

fn in_window(p: u64) -> bool {
    (HOST_WINDOW_BASE..HOST_WINDOW_BASE + HOST_WINDOW_LEN).contains(&p)
}

fn in_managed_window(p: u64) -> bool {
    (MANAGED_WINDOW_BASE..MANAGED_WINDOW_BASE + MANAGED_WINDOW_LEN).contains(&p)
}

/// A kernel without parameters, launched on `stream` (and sent).
fn launcher(fake: &FakeDevice) -> impl Fn(cudaStream_t) {
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    move |stream| {
        let one = dim3 { x: 1, y: 1, z: 1 };
        // SAFETY: the kernel takes no parameters.
        ok(unsafe { cudaLaunchKernel(k as *const c_void, one, one, ptr::null_mut(), 0, stream) });
        flush();
    }
}

/// The migrations sent since `from`: (direction, stream, scope).
fn migrations(fake: &FakeDevice, from: usize) -> Vec<(u64, u64, u64)> {
    fake.state().migrations[from..]
        .iter()
        .map(|m| (m[1], m[2], m[3]))
        .collect()
}

#[test]
fn the_pointer_is_where_the_driver_placed_the_device_memory() {
    let fake = setup();
    let mut m: *mut c_void = ptr::null_mut();
    // SAFETY: valid out-pointers; the memory is touched only between turns.
    unsafe {
        // This driver does not honour the address offered: the pointer is its own.
        ok(cudaMallocManaged(&raw mut m, 4096, 1));
        let p = m as u64;
        assert!(
            !in_window(p) && !in_managed_window(p) && p.is_multiple_of(MANAGED_ALIGN),
            "{p:#x}"
        );
        assert_eq!(
            fake.state().placed.get(&p),
            Some(&(4096, MANAGED_ALIGN, true))
        );
        assert!(fake.ops().contains(&Op::ManagedPlace));
        // The allocation's pages are there, in this process.
        m.cast::<u32>().write(0x1234_5678);
        assert_eq!(m.cast::<u32>().read(), 0x1234_5678);
        ok(cudaFree(m));
        assert!(fake.state().placed.is_empty());

        // An address this process holds (as a driver's may be): placed again, the first
        // placement given back, nothing of this process touched.
        let held = Box::leak(vec![0x5au8; 3 * MANAGED_ALIGN as usize].into_boxed_slice());
        let taken = (held.as_ptr() as u64).next_multiple_of(MANAGED_ALIGN);
        fake.state().place_at.push_back(taken);
        ok(cudaMallocManaged(&raw mut m, 3 * 4096, 1));
        assert_ne!(m as u64, taken);
        assert!(held.iter().all(|&b| b == 0x5a));
        assert!(!fake.state().placed.contains_key(&taken), "given back");
        assert_eq!(fake.state().placed.len(), 1);
        ok(cudaFree(m));

        // Taken every time: the allocation fails, and every placement is given back.
        for _ in 0..8 {
            fake.state().place_at.push_back(taken);
        }
        assert_err(
            cudaMallocManaged(&raw mut m, 4096, 1),
            cu::cudaErrorMemoryAllocation,
        );
        assert!(fake.state().placed.is_empty());

        // A driver that honours the address offered: the pointer is in the managed-memory
        // window, held here for it.
        fake.state().honour_hint = true;
        ok(cudaMallocManaged(&raw mut m, 5 << 20, 1));
        let p = m as u64;
        assert!(in_managed_window(p), "{p:#x}");
        assert_eq!(fake.state().placed.get(&p), Some(&(5 << 20, 6 << 20, true)));
        ok(cudaFree(m));
        // The host refusing the placement fails the allocation, nothing left.
        fake.state().fail_next =
            Some((Op::ManagedPlace, qcuda_proto::status::NOT_SUPPORTED, false));
        assert_err(
            cudaMallocManaged(&raw mut m, 4096, 1),
            cu::cudaErrorNotSupported,
        );
        assert!(fake.state().host_maps.is_empty());
    }
}

#[test]
fn migrations_follow_the_attachments_and_wait_for_the_work() {
    let fake = setup();
    let launch = launcher(&fake);
    let (mut global, mut host, mut single): (*mut c_void, *mut c_void, *mut c_void) =
        (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
    let (mut a, mut b): (cudaStream_t, cudaStream_t) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid out-pointers and arguments throughout.
    unsafe {
        ok(cudaStreamCreate(&raw mut a));
        ok(cudaStreamCreate(&raw mut b));
        ok(cudaMallocManaged(&raw mut global, 4096, 1));
        ok(cudaMallocManaged(&raw mut host, 4096, 2));
        ok(cudaMallocManaged(&raw mut single, 4096, 1));
        ok(cudaStreamAttachMemAsync(a, single, 0, 4));
        let wire = |s: cudaStream_t| {
            crate::core::runtime::runtime()
                .unwrap()
                .streams
                .target(s as usize)
                .unwrap()
                .wire
        };
        let (wa, wb) = (wire(a), wire(b));
        // Work on b: the global allocation goes to the device, ordering the others after it;
        // the host's and a's do not.
        let from = fake.state().migrations.len();
        launch(b);
        assert_eq!(
            migrations(&fake, from),
            vec![(MANAGED_TO_DEVICE, wb, MANAGED_SCOPE_GLOBAL)]
        );
        // Work on a: the one attached to a goes, for a alone.
        let from = fake.state().migrations.len();
        launch(a);
        assert_eq!(
            migrations(&fake, from),
            vec![(MANAGED_TO_DEVICE, wa, MANAGED_SCOPE_STREAM)]
        );
        // Work that may touch them still runs: a synchronisation asks for both, gets neither,
        // and they stay the device's (asked again at the next one).
        fake.state().managed_busy = true;
        let from = fake.state().migrations.len();
        ok(cudaStreamSynchronize(b));
        let asked = migrations(&fake, from);
        assert_eq!(asked.len(), 2);
        assert!(asked.contains(&(MANAGED_TO_HOST, 0, MANAGED_SCOPE_GLOBAL)));
        assert!(asked.contains(&(MANAGED_TO_HOST, wa, MANAGED_SCOPE_STREAM)));
        let from = fake.state().migrations.len();
        launch(b);
        assert!(migrations(&fake, from).is_empty(), "still the device's");
        // A blocking copy from it meanwhile is the device's to make: it reads what the device
        // holds, not the stale guest pages.
        fake.state()
            .device_bytes_for_test(global as u64, 4)
            .copy_from_slice(b"devi");
        let mut local = [0u8; 4];
        ok(cudaMemcpy(
            local.as_mut_ptr().cast(),
            global,
            4,
            cu::cudaMemcpyDefault,
        ));
        assert_eq!(&local, b"devi");
        assert_ne!(&std::slice::from_raw_parts(global.cast::<u8>(), 4), b"devi");
        fake.state().managed_busy = false;
        let from = fake.state().migrations.len();
        ok(cudaDeviceSynchronize());
        assert_eq!(migrations(&fake, from).len(), 2);
        let from = fake.state().migrations.len();
        ok(cudaDeviceSynchronize());
        assert!(migrations(&fake, from).is_empty(), "the host's now");
        // The host's allocation: the CPU's alone, through every turn.
        host.cast::<u8>().write(7);
        launch(b);
        ok(cudaDeviceSynchronize());
        assert_eq!(host.cast::<u8>().read(), 7);
        assert!(fake.state().migrations.iter().all(|m| m[0] != host as u64));
        // Attached globally again, it goes with the next work; a's allocation, once a is
        // destroyed, is global too.
        ok(cudaStreamAttachMemAsync(b, host, 0, 1));
        ok(cudaStreamDestroy(a));
        let from = fake.state().migrations.len();
        launch(b);
        let sent = migrations(&fake, from);
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert!(sent
            .iter()
            .all(|&(d, s, sc)| (d, s, sc) == (MANAGED_TO_DEVICE, wb, MANAGED_SCOPE_GLOBAL)));
        ok(cudaDeviceSynchronize());
        for p in [global, host, single] {
            ok(cudaFree(p));
        }
        ok(cudaStreamDestroy(b));
    }
}

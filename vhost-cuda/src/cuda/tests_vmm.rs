//! Session tests of virtual memory management: the guest's cuMemCreate, cuMemAddressReserve,
//! cuMemMap and cuMemSetAccess, checked against the session's own objects, and everything
//! freed when the session ends.

use qcuda_proto::{status, Op, VMM_HANDLE_POSIX_FD};

use super::{dtoh, htod, ok, req, run, GpuState, Rig};

/// A `MemSetAccess` of `(ordinal, flags)` records over `ptr..ptr + size`.
fn set_access(rig: &mut Rig, s: &mut GpuState, ptr: u64, size: u64, recs: &[(u32, u32)]) -> u32 {
    let bytes: Vec<u8> = recs
        .iter()
        .flat_map(|&(d, f)| [d.to_le_bytes(), f.to_le_bytes()].concat())
        .collect();
    let b = rig.buf(&bytes);
    s.execute(&req(Op::MemSetAccess, 0, &[ptr, size], vec![b], vec![]))
        .status
}

/// Create, reserve, map, set access: the mapping is memory copies and memsets reach, at a
/// real address; retain, properties and range answer for it; unmapped, freed and released,
/// nothing remains.
#[test]
fn mapped_memory_is_device_memory_of_the_session() {
    let mut rig = Rig::new(2);
    // The guest's own reservations only: no reserved range of the session beside them.
    rig.host.set_address_space(crate::cuda::AddressSpace::OFF);
    let mut s = rig.session();
    let g = ok(run(&mut s, Op::MemGetGranularity, &[0, 0, 0, 0]))[0];
    assert_eq!(ok(run(&mut s, Op::MemGetGranularity, &[1, 0, 0, 0]))[0], g);
    assert_eq!(
        run(&mut s, Op::MemGetGranularity, &[2, 0, 0, 0]).status,
        status::INVALID_VALUE
    );
    let h = ok(run(
        &mut s,
        Op::MemCreate,
        &[2 * g, VMM_HANDLE_POSIX_FD, 0, 0],
    ))[0];
    let va = ok(run(&mut s, Op::MemAddressReserve, &[4 * g, 0, 0]))[0];
    ok(run(&mut s, Op::MemMap, &[va, 2 * g, 0, h]));
    // Mapped without access: no copy may touch it yet.
    let (r, _) = dtoh(&mut rig, &mut s, va, 16, &[16]);
    assert_eq!(r.status, status::INVALID_VALUE);
    assert_eq!(
        set_access(&mut rig, &mut s, va, 2 * g, &[(0, 3)]),
        status::SUCCESS
    );
    assert_eq!(ok(run(&mut s, Op::MemGetAccess, &[va + 64, 0]))[0], 3);
    assert_eq!(ok(run(&mut s, Op::MemGetAccess, &[va + 64, 1]))[0], 0);
    ok(htod(&mut rig, &mut s, va + g - 8, &[5; 16], &[16]));
    let (r, data) = dtoh(&mut rig, &mut s, va + g - 8, 16, &[16]);
    assert_eq!((r.status, data), (status::SUCCESS, vec![5; 16]));
    ok(run(&mut s, Op::Memset, &[va, 7, 4, 0, 1]));
    assert_eq!(rig.fake.peek(va, 4), Some(vec![7; 4]));
    // Past the mapping, inside the reservation: not memory.
    assert_eq!(
        run(&mut s, Op::Memset, &[va + 2 * g - 2, 7, 4, 0, 1]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        ok(run(&mut s, Op::MemMappingRange, &[va + 5]))[..2],
        [va, 2 * g]
    );
    assert_eq!(
        ok(run(&mut s, Op::MemHandleProperties, &[h]))[..4],
        [0, VMM_HANDLE_POSIX_FD, 0, 0]
    );
    // Retained from the mapping: the same handle, one reference more (NCCL releases it, then
    // the original, by the same value).
    let retained = ok(run(&mut s, Op::MemRetainHandle, &[va + 100]))[0];
    assert_eq!(retained, h);
    ok(run(&mut s, Op::MemRelease, &[retained]));
    assert_eq!(rig.fake.vmm_handles(), 1);
    // Released while mapped: the memory stays until unmapped.
    ok(run(&mut s, Op::MemRelease, &[h]));
    assert_eq!(rig.fake.vmm_handles(), 0);
    assert_eq!(
        run(&mut s, Op::MemRelease, &[h]).status,
        status::INVALID_VALUE
    );
    assert_eq!(rig.fake.vmm_allocations(), 1);
    // Retained again now that no handle is left: a new one, released on its own.
    let again = ok(run(&mut s, Op::MemRetainHandle, &[va]))[0];
    assert_ne!(again, h);
    ok(run(&mut s, Op::MemRelease, &[again]));
    assert_eq!(
        run(&mut s, Op::MemAddressFree, &[va, 4 * g]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::MemUnmap, &[va, 2 * g]));
    assert_eq!(rig.fake.vmm_allocations(), 0);
    ok(run(&mut s, Op::MemAddressFree, &[va, 4 * g]));
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
}

/// Handles, reservations and mappings are checked against the session's own.
#[test]
fn only_the_sessions_own_handles_and_reservations_are_accepted() {
    let mut rig = Rig::new(1);
    // The guest's own reservations only: no reserved range of the session beside them.
    rig.host.set_address_space(crate::cuda::AddressSpace::OFF);
    let mut s = rig.session();
    let g = ok(run(&mut s, Op::MemGetGranularity, &[0, 0, 0, 0]))[0];
    for bad in [[g, 2, 0, 0], [g, 0, 4, 0], [0, 0, 0, 0]] {
        assert_eq!(
            run(&mut s, Op::MemCreate, &bad).status,
            status::INVALID_VALUE
        );
    }
    let h = ok(run(&mut s, Op::MemCreate, &[g, 0, 0, 0]))[0];
    let va = ok(run(&mut s, Op::MemAddressReserve, &[2 * g, 0, 0]))[0];
    // A handle that is not the session's, a range outside its reservations.
    for (ptr, handle) in [(va, h + 1000), (va + 2 * g, h), (va - g, h), (0x1000, h)] {
        assert_eq!(
            run(&mut s, Op::MemMap, &[ptr, g, 0, handle]).status,
            status::INVALID_VALUE,
            "{ptr:#x} {handle}"
        );
    }
    ok(run(&mut s, Op::MemMap, &[va, g, 0, h]));
    assert_eq!(
        run(&mut s, Op::MemMap, &[va, g, 0, h]).status,
        status::INVALID_VALUE
    );
    // Access over a range that is not exactly mappings, or with a bad flag or device.
    assert_eq!(
        set_access(&mut rig, &mut s, va, 2 * g, &[(0, 3)]),
        status::INVALID_VALUE
    );
    assert_eq!(
        set_access(&mut rig, &mut s, va, g, &[(0, 2)]),
        status::INVALID_VALUE
    );
    assert_eq!(
        set_access(&mut rig, &mut s, va, g, &[(5, 3)]),
        status::INVALID_DEVICE
    );
    assert_eq!(
        run(&mut s, Op::MemUnmap, &[va, g / 2]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::MemGetAccess, &[va + g, 0]).status,
        status::INVALID_VALUE
    );

    // Another session knows none of it: not the handle, not the reservation, not the memory.
    assert_eq!(
        set_access(&mut rig, &mut s, va, g, &[(0, 3)]),
        status::SUCCESS
    );
    let mut other = rig.session();
    assert_eq!(
        run(&mut other, Op::MemMap, &[va + g, g, 0, h]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut other, Op::Malloc, &[16]));
    assert_eq!(
        run(&mut other, Op::Memset, &[va, 1, 4, 0, 1]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut other, Op::MemRetainHandle, &[va]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut other, Op::MemAddressFree, &[va, 2 * g]).status,
        status::INVALID_VALUE
    );
    drop(other);
    assert_eq!(rig.fake.vmm_ranges(), (1, 1));
}

/// A session that ends with memory mapped, reserved and held leaves nothing behind.
#[test]
fn the_end_of_a_session_frees_its_vmm_objects() {
    let mut rig = Rig::new(1);
    // The guest's own reservations only: no reserved range of the session beside them.
    rig.host.set_address_space(crate::cuda::AddressSpace::OFF);
    let mut s = rig.session();
    let g = ok(run(&mut s, Op::MemGetGranularity, &[0, 0, 0, 0]))[0];
    let h = ok(run(&mut s, Op::MemCreate, &[g, 0, 0, 0]))[0];
    ok(run(&mut s, Op::MemCreate, &[g, 0, 0, 0]));
    let va = ok(run(&mut s, Op::MemAddressReserve, &[g, 0, 0]))[0];
    ok(run(&mut s, Op::MemMap, &[va, g, 0, h]));
    assert_eq!(
        set_access(&mut rig, &mut s, va, g, &[(0, 3)]),
        status::SUCCESS
    );
    ok(run(&mut s, Op::MemRetainHandle, &[va]));
    ok(run(&mut s, Op::MemAddressReserve, &[g, 0, 0]));
    assert_eq!(rig.fake.vmm_allocations(), 2);
    drop(s);
    assert_eq!(rig.fake.vmm_allocations(), 0);
    assert_eq!(rig.fake.vmm_handles(), 0);
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
}

/// PyTorch's expandable segments on a large GPU: one reservation of about 161 GB beside the
/// session's reserved range, then 20 MiB allocations made shareable as POSIX descriptors,
/// mapped one after another at its start, given access and used.
#[test]
fn a_large_reservation_takes_shareable_segments() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let warm = ok(run(&mut s, Op::Malloc, &[256]))[0];
    let g = ok(run(
        &mut s,
        Op::MemGetGranularity,
        &[0, VMM_HANDLE_POSIX_FD, 0, 0],
    ))[0];
    let seg = 10 * g;
    let total = seg * (161u64 << 30).div_ceil(seg);
    let va = ok(run(&mut s, Op::MemAddressReserve, &[total, 0, 0]))[0];
    for i in 0..3 {
        let h = ok(run(
            &mut s,
            Op::MemCreate,
            &[seg, VMM_HANDLE_POSIX_FD, 0, 0],
        ))[0];
        ok(run(&mut s, Op::MemMap, &[va + i * seg, seg, 0, h]));
        ok(run(&mut s, Op::MemRelease, &[h]));
        assert_eq!(
            set_access(&mut rig, &mut s, va + i * seg, seg, &[(0, 3)]),
            status::SUCCESS
        );
        ok(run(
            &mut s,
            Op::Memset,
            &[va + i * seg + seg - 64, 9, 64, 0, 1],
        ));
    }
    // Each segment is memory copies reach (the fake keeps each mapping's bytes apart, so a
    // copy across two of them is the real driver's to check).
    for i in 0..3 {
        let (r, data) = dtoh(&mut rig, &mut s, va + i * seg + seg - 8, 8, &[8]);
        assert_eq!((r.status, data), (status::SUCCESS, vec![9; 8]));
    }
    for i in 0..3 {
        ok(run(&mut s, Op::MemUnmap, &[va + i * seg, seg]));
    }
    ok(run(&mut s, Op::MemAddressFree, &[va, total]));
    ok(run(&mut s, Op::Free, &[warm]));
}

//! The session's reserved device range over the fake driver: allocations at fixed addresses,
//! sub-allocation, exhaustion, fallback, release, peer access.

use super::*;
use crate::cuda::{
    device_arena::{AddressSpace, DEFAULT_VA_BASE, DEFAULT_VA_SIZE},
    driver::vmm::{VmmDriverApi, ACCESS_NONE, ACCESS_READWRITE},
};

const MIB: u64 = 1 << 20;

fn rig_with(gpus: i32, space: AddressSpace) -> Rig {
    let rig = Rig::new(gpus);
    rig.host.set_address_space(space);
    rig
}

#[test]
fn allocations_lie_in_the_sessions_range_at_the_same_addresses_every_time() {
    let sizes = [1, 256, 300, 4096, MIB, 3 * MIB + 5, 64];
    let run_once = || {
        let mut rig = Rig::new(1);
        let mut s = GpuState::open(&rig.host, 5);
        let ptrs: Vec<u64> = sizes.iter().map(|&n| malloc(&mut s, n)).collect();
        let data = pattern(300);
        ok(htod(&mut rig, &mut s, ptrs[2], &data, &[300]));
        let (r, got) = dtoh(&mut rig, &mut s, ptrs[2], 300, &[300]);
        ok(r);
        assert_eq!(got, data);
        ptrs
    };
    let ptrs = run_once();
    let base = AddressSpace::default().session_base(5, 0, 1).unwrap();
    assert_eq!(base, DEFAULT_VA_BASE + 5 * DEFAULT_VA_SIZE);
    for (p, n) in ptrs.iter().zip(sizes) {
        assert!(*p >= base && p + n <= base + DEFAULT_VA_SIZE, "{p:#x}");
        assert!(p.is_multiple_of(256));
    }
    // A fresh worker making the same calls gets the same addresses.
    assert_eq!(run_once(), ptrs);
}

#[test]
fn warm_malloc_and_free_call_no_driver_allocator() {
    let rig = Rig::new(1);
    let mut s = rig.session();
    for size in [MIB, 8 * MIB] {
        let p = malloc(&mut s, size);
        ok(run(&mut s, Op::Free, &[p]));
        let created = rig.fake.calls("mem_create");
        for _ in 0..100 {
            let q = malloc(&mut s, size);
            assert_eq!(q, p);
            ok(run(&mut s, Op::Free, &[q]));
        }
        assert_eq!(rig.fake.calls("mem_create"), created);
        assert_eq!(rig.fake.calls("mem_alloc"), 0);
    }
    // A freed pointer is no longer the guest's.
    let p = malloc(&mut s, 64);
    ok(run(&mut s, Op::Free, &[p]));
    assert_eq!(run(&mut s, Op::Free, &[p]).status, status::INVALID_VALUE);
}

#[test]
fn an_exhausted_range_is_out_of_memory_and_frees_make_room() {
    let space = AddressSpace {
        base: DEFAULT_VA_BASE,
        per_device: 8 * MIB,
    };
    let rig = rig_with(1, space);
    let mut s = rig.session();
    let big = malloc(&mut s, 6 * MIB);
    let r = run(&mut s, Op::Malloc, &[4 * MIB]);
    assert_eq!(r.status, status::MEMORY_ALLOCATION);
    assert_eq!(
        run(&mut s, Op::Malloc, &[u64::MAX]).status,
        status::MEMORY_ALLOCATION
    );
    ok(run(&mut s, Op::Free, &[big]));
    let p = malloc(&mut s, 4 * MIB);
    assert!((DEFAULT_VA_BASE + 8 * MIB..DEFAULT_VA_BASE + 16 * MIB).contains(&p));
}

#[test]
fn a_range_the_driver_will_not_place_falls_back_to_cu_mem_alloc() {
    // Something else of the worker holds the range, so the driver places the reservation
    // elsewhere.
    let space = AddressSpace {
        base: 0x1000_0000_0000,
        per_device: DEFAULT_VA_SIZE,
    };
    let mut rig = rig_with(1, space);
    rig.fake.occupy_va(0x1000_0000_0000, 0x1000_0000_0000);
    let mut s = rig.session();
    let p = malloc(&mut s, 1000);
    assert!(!(0x1000_0000_0000..0x1000_0000_0000 + DEFAULT_VA_SIZE).contains(&p));
    assert_eq!(rig.fake.calls("mem_alloc"), 1);
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
    let data = pattern(1000);
    ok(htod(&mut rig, &mut s, p, &data, &[1000]));
    ok(run(&mut s, Op::Free, &[p]));
    // Off: the same.
    let rig = rig_with(1, AddressSpace::OFF);
    let mut s = rig.session();
    malloc(&mut s, 10);
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
}

#[test]
fn device_reset_and_the_end_of_the_session_give_the_range_back() {
    let rig = Rig::new(2);
    let mut s = rig.session();
    malloc(&mut s, 100);
    malloc(&mut s, 5 * MIB);
    let r = s.execute(&req(Op::Malloc, 1, &[100, 0], vec![], vec![]));
    ok(r);
    assert_eq!(rig.fake.vmm_ranges().0, 2);
    assert!(rig.fake.vmm_ranges().1 >= 3);
    ok(run(&mut s, Op::DeviceReset, &[]));
    assert_eq!(rig.fake.vmm_ranges(), (1, 1));
    // The device is usable again, at the same addresses.
    let p = malloc(&mut s, 100);
    assert_eq!(p, AddressSpace::default().session_base(1, 0, 2).unwrap());
    drop(s);
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
    assert_eq!(rig.fake.vmm_allocations(), 0);
    assert_eq!(rig.fake.vmm_handles(), 0);
}

#[test]
fn peer_access_reaches_the_peers_range() {
    let rig = Rig::new(2);
    let mut s = rig.session();
    let on1 = ok(s.execute(&req(Op::Malloc, 1, &[4096, 0], vec![], vec![])))[0];
    let gpu0 = 100;
    assert_eq!(rig.fake.mem_get_access(on1, gpu0), Ok(ACCESS_NONE));
    ok(run(&mut s, Op::PeerAccess, &[1, 1, 0]));
    assert_eq!(rig.fake.mem_get_access(on1, gpu0), Ok(ACCESS_READWRITE));
    // Memory mapped after the grant is reachable too.
    let later = ok(s.execute(&req(Op::Malloc, 1, &[8 << 20, 0], vec![], vec![])))[0];
    assert_eq!(rig.fake.mem_get_access(later, gpu0), Ok(ACCESS_READWRITE));
    ok(run(&mut s, Op::PeerAccess, &[1, 0, 0]));
    assert_eq!(rig.fake.mem_get_access(on1, gpu0), Ok(ACCESS_NONE));
}

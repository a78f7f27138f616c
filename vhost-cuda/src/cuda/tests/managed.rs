//! Managed memory placed on the device (`HostMap` with `HOST_MAP_MANAGED`) and its migrations
//! (`ManagedMigrate`) over the fake driver.

use qcuda_proto::{
    HostRun, HOST_MAP_MANAGED, HOST_WINDOW_BASE, MANAGED_ALIGN, MANAGED_TO_DEVICE, MANAGED_TO_HOST,
};

use super::*;

fn run_table(runs: &[(u64, u64)]) -> Vec<u8> {
    runs.iter()
        .flat_map(|&(gpa, len)| HostRun { gpa, len }.encode())
        .collect()
}

fn guest_bytes(rig: &Rig, gpa: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rig.mem.read_slice(&mut v, GuestAddress(gpa)).unwrap();
    v
}

#[test]
fn managed_memory_lives_on_the_device_at_the_guest_address_and_migrates_on_request() {
    assert!(super::super::reserve_window());
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let guest = HOST_WINDOW_BASE + 0x7400_0000;
    assert!(guest.is_multiple_of(MANAGED_ALIGN));
    // Two guest pages, out of guest-physical order.
    let table = run_table(&[(0x30_0000, 0x1000), (0x28_0000, 0x1000)]);
    rig.mem
        .write_slice(b"abcd", GuestAddress(0x30_0000))
        .unwrap();
    let t = rig.buf(&table);
    let r = s.execute(&req(
        Op::HostMap,
        0,
        &[guest, 0x2000, HOST_MAP_MANAGED],
        vec![t],
        vec![],
    ));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, guest));
    // Device memory at the guest's address, holding the guest's bytes.
    assert_eq!(rig.fake.vmm_allocations(), 1);
    assert_eq!(rig.fake.peek(guest, 4).unwrap(), b"abcd");
    // The device writes it (a memset): guest RAM does not change until a migration.
    let set = req(
        Op::Memset,
        0,
        &[guest, u64::from(b'Z'), 2, 0],
        vec![],
        vec![],
    );
    assert_eq!(s.execute(&set).status, status::SUCCESS);
    assert_eq!(guest_bytes(&rig, 0x30_0000, 4), b"abcd");
    let migrate = |dir: u64, at: u64| req(Op::ManagedMigrate, 0, &[at, dir, 0], vec![], vec![]);
    let r = s.execute(&migrate(MANAGED_TO_HOST, guest));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 1));
    assert_eq!(guest_bytes(&rig, 0x30_0000, 4), b"ZZcd");
    // The guest writes both pages; a migration to the device carries them over.
    rig.mem.write_slice(b"xy", GuestAddress(0x30_0000)).unwrap();
    rig.mem.write_slice(b"q", GuestAddress(0x28_0000)).unwrap();
    assert_eq!(rig.fake.peek(guest, 2).unwrap(), b"ZZ");
    assert_eq!(
        s.execute(&migrate(MANAGED_TO_DEVICE, guest)).status,
        status::SUCCESS
    );
    assert_eq!(rig.fake.peek(guest, 4).unwrap(), b"xycd");
    assert_eq!(rig.fake.peek(guest + 0x1000, 1).unwrap(), b"q");
    // Copies reach the mapped bytes; past them (the rest of the granule) is not the guest's.
    let dptr = ok(run(&mut s, Op::Malloc, &[0x1000]))[0];
    ok(run(&mut s, Op::MemcpyMapped, &[dptr, guest, 4, 0]));
    assert_eq!(rig.fake.peek(dptr, 4).unwrap(), b"xycd");
    assert_eq!(
        run(&mut s, Op::MemcpyMapped, &[dptr, guest + 0x1ff0, 0x20, 0]).status,
        status::INVALID_VALUE
    );
    // Unknown addresses and directions are refused; nothing else may map into the granule.
    assert_eq!(
        s.execute(&migrate(MANAGED_TO_HOST, guest + MANAGED_ALIGN))
            .status,
        status::INVALID_VALUE
    );
    assert_eq!(s.execute(&migrate(2, guest)).status, status::INVALID_VALUE);
    let t = rig.buf(&run_table(&[(0x40_0000, 0x1000)]));
    let inside = req(
        Op::HostMap,
        0,
        &[guest + 0x10_0000, 0x1000, 0],
        vec![t],
        vec![],
    );
    assert_eq!(
        s.execute(&inside).status,
        status::HOST_MEMORY_ALREADY_REGISTERED
    );
    // HostUnmap frees the device memory and its address range.
    // (The session's own allocations live in its reserved range: count the managed one alone.)
    let allocations = rig.fake.vmm_allocations();
    let (reservations, mappings) = rig.fake.vmm_ranges();
    let unmap = req(Op::HostUnmap, 0, &[guest], vec![], vec![]);
    assert_eq!(s.execute(&unmap).status, status::SUCCESS);
    assert_eq!(rig.fake.vmm_allocations(), allocations - 1);
    assert_eq!(rig.fake.vmm_ranges(), (reservations - 1, mappings - 1));
    assert_eq!(
        s.execute(&migrate(MANAGED_TO_HOST, guest)).status,
        status::INVALID_VALUE
    );
    // The session's end frees what is still placed.
    let t = rig.buf(&table);
    let r = s.execute(&req(
        Op::HostMap,
        0,
        &[guest, 0x2000, HOST_MAP_MANAGED],
        vec![t],
        vec![],
    ));
    assert_eq!(r.status, status::SUCCESS);
    assert_eq!(rig.fake.vmm_allocations(), allocations);
    drop(s);
    assert_eq!(rig.fake.vmm_allocations(), 0);
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
}

#[test]
fn managed_memory_off_the_granule_stays_in_guest_ram_and_needs_no_migration() {
    assert!(super::super::reserve_window());
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let guest = HOST_WINDOW_BASE + 0x7600_1000;
    let t = rig.buf(&run_table(&[(0x30_0000, 0x1000)]));
    let r = s.execute(&req(
        Op::HostMap,
        0,
        &[guest, 0x1000, HOST_MAP_MANAGED],
        vec![t],
        vec![],
    ));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, guest));
    assert_eq!(rig.fake.vmm_allocations(), 0);
    let migrate = req(
        Op::ManagedMigrate,
        0,
        &[guest, MANAGED_TO_HOST, 0],
        vec![],
        vec![],
    );
    let r = s.execute(&migrate);
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 0), "nothing moved");
}

//! Managed memory placed on the device (`ManagedPlace`, then `HOST_MAP_MANAGED`) and its
//! migrations (`ManagedMigrate`) over the fake driver: a block of the session's device range,
//! which a pause, a restart or a migration gives the same address again; without a range, where
//! the driver reserves it (the fake honours an address hint only inside the range it manages
//! itself; NVIDIA's driver is not bound by one either).

use qcuda_proto::{
    HostRun, HOST_MAP_MANAGED, HOST_WINDOW_BASE, MANAGED_ALIGN, MANAGED_SCOPE_GLOBAL,
    MANAGED_SCOPE_STREAM, MANAGED_TO_DEVICE, MANAGED_TO_HOST, MANAGED_WINDOW_BASE,
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

fn host_map(rig: &mut Rig, s: &mut GpuState, at: u64, runs: &[(u64, u64)]) -> ResponseHeader {
    let len = runs.iter().map(|r| r.1).sum();
    let t = rig.buf(&run_table(runs));
    s.execute(&req(
        Op::HostMap,
        0,
        &[at, len, HOST_MAP_MANAGED],
        vec![t],
        vec![],
    ))
}

fn migrate(at: u64, dir: u64, stream: u64, scope: u64) -> Request {
    req(
        Op::ManagedMigrate,
        0,
        &[at, dir, stream, scope],
        vec![],
        vec![],
    )
}

/// True if this process holds `at` (the window's reservation is there): a fixed mapping that
/// replaces nothing is refused.
fn held(at: u64) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; a PROT_NONE page touches nothing.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            0x1000,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return true;
    }
    // SAFETY: the page just mapped, used by nothing.
    unsafe { libc::munmap(p, 0x1000) };
    false
}

#[test]
fn without_a_device_range_managed_memory_is_placed_where_the_driver_reserves_it() {
    assert!(super::super::reserve_window());
    let mut rig = Rig::new(1);
    // No reserved range (--gpu-va-base 0): the driver's own reservation serves.
    rig.host.set_address_space(crate::cuda::AddressSpace::OFF);
    let mut s = rig.session();
    // The guest offers an address of the host-mapping window; this driver does not honour
    // it, and the window's reservation is whole again afterwards.
    let hint = HOST_WINDOW_BASE + 0x7400_0000;
    let r = ok(run(&mut s, Op::ManagedPlace, &[0x2000, hint]));
    let (at, size) = (r[0], r[1]);
    assert_ne!(at, hint);
    assert!(at.is_multiple_of(MANAGED_ALIGN) && size == MANAGED_ALIGN);
    assert!(held(hint), "the window hole is closed again");
    assert_eq!(rig.fake.vmm_allocations(), 1);
    // Not reachable before the guest's pages come.
    let scratch = ok(run(&mut s, Op::Malloc, &[0x1000]))[0];
    assert_eq!(
        run(&mut s, Op::MemcpyMapped, &[scratch, at, 4, 0]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        s.execute(&migrate(at, MANAGED_TO_HOST, 0, MANAGED_SCOPE_GLOBAL))
            .status,
        status::INVALID_VALUE
    );
    // HostMap at another address, or of another length, is refused; then the pages come.
    let runs = [(0x30_0000, 0x1000), (0x28_0000, 0x1000)];
    rig.mem
        .write_slice(b"abcd", GuestAddress(0x30_0000))
        .unwrap();
    assert_eq!(
        host_map(&mut rig, &mut s, at + MANAGED_ALIGN, &runs).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        host_map(&mut rig, &mut s, at, &runs[..1]).status,
        status::INVALID_VALUE
    );
    let r = host_map(&mut rig, &mut s, at, &runs);
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, at));
    assert_eq!(
        host_map(&mut rig, &mut s, at, &runs).status,
        status::HOST_MEMORY_ALREADY_REGISTERED
    );
    // Device memory at that address, holding the guest's bytes.
    assert_eq!(rig.fake.peek(at, 4).unwrap(), b"abcd");
    // The device writes it: guest RAM does not change until a migration.
    ok(run(&mut s, Op::Memset, &[at, u64::from(b'Z'), 2, 0]));
    assert_eq!(guest_bytes(&rig, 0x30_0000, 4), b"abcd");
    let r = s.execute(&migrate(at, MANAGED_TO_HOST, 0, MANAGED_SCOPE_GLOBAL));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 1));
    assert_eq!(guest_bytes(&rig, 0x30_0000, 4), b"ZZcd");
    // The guest writes both pages; a migration to the device carries them over.
    rig.mem.write_slice(b"xy", GuestAddress(0x30_0000)).unwrap();
    rig.mem.write_slice(b"q", GuestAddress(0x28_0000)).unwrap();
    assert_eq!(rig.fake.peek(at, 2).unwrap(), b"ZZ");
    ok(s.execute(&migrate(at, MANAGED_TO_DEVICE, 0, MANAGED_SCOPE_GLOBAL)));
    assert_eq!(rig.fake.peek(at, 4).unwrap(), b"xycd");
    assert_eq!(rig.fake.peek(at + 0x1000, 1).unwrap(), b"q");
    // Copies reach the mapped bytes; past them (the rest of the granule) is not the guest's.
    ok(run(&mut s, Op::MemcpyMapped, &[scratch, at, 4, 0]));
    assert_eq!(rig.fake.peek(scratch, 4).unwrap(), b"xycd");
    assert_eq!(
        run(&mut s, Op::MemcpyMapped, &[scratch, at + 0x1ff0, 0x20, 0]).status,
        status::INVALID_VALUE
    );
    // Unknown addresses, directions and scopes are refused; nothing else maps into the
    // granule; a mapped placement is not unplaced but unmapped.
    for bad in [
        migrate(at + MANAGED_ALIGN, MANAGED_TO_HOST, 0, MANAGED_SCOPE_GLOBAL),
        migrate(at, 2, 0, MANAGED_SCOPE_GLOBAL),
        migrate(at, MANAGED_TO_HOST, 0, 2),
        migrate(at, MANAGED_TO_HOST, 0, MANAGED_SCOPE_STREAM),
    ] {
        assert_eq!(s.execute(&bad).status, status::INVALID_VALUE);
    }
    let t = rig.buf(&run_table(&[(0x40_0000, 0x1000)]));
    let inside = req(
        Op::HostMap,
        0,
        &[at + 0x10_0000, 0x1000, 0],
        vec![t],
        vec![],
    );
    assert_eq!(
        s.execute(&inside).status,
        status::HOST_MEMORY_ALREADY_REGISTERED
    );
    assert_eq!(
        run(&mut s, Op::ManagedUnplace, &[at]).status,
        status::INVALID_VALUE
    );
    let allocations = rig.fake.vmm_allocations();
    let (reservations, mappings) = rig.fake.vmm_ranges();
    ok(run(&mut s, Op::HostUnmap, &[at]));
    assert_eq!(rig.fake.vmm_allocations(), allocations - 1);
    assert_eq!(rig.fake.vmm_ranges(), (reservations - 1, mappings - 1));
    assert_eq!(
        s.execute(&migrate(at, MANAGED_TO_HOST, 0, MANAGED_SCOPE_GLOBAL))
            .status,
        status::INVALID_VALUE
    );
    // An address of the managed-memory window, which nothing of qcuda maps in a worker: this
    // driver honours it.
    let offered = MANAGED_WINDOW_BASE + 0x4000_0000;
    let r = ok(run(&mut s, Op::ManagedPlace, &[0x1000, offered]));
    assert_eq!(r[0], offered);
    ok(run(&mut s, Op::ManagedUnplace, &[offered]));
    // A placement the guest could not use goes with ManagedUnplace.
    let other = ok(run(&mut s, Op::ManagedPlace, &[0x1000, 0]))[0];
    ok(run(&mut s, Op::ManagedUnplace, &[other]));
    assert_eq!(rig.fake.vmm_allocations(), allocations - 1);
    // Arguments: a length that is no page multiple, a hint off its granule or outside the
    // window.
    for args in [
        [0, 0],
        [0x1800, 0],
        [0x1000, hint + 0x1000],
        [0x1000, 0x7000_0000_0000],
    ] {
        assert_eq!(
            run(&mut s, Op::ManagedPlace, &args).status,
            status::INVALID_VALUE,
            "{args:x?}"
        );
    }
    // The session's end frees what is still placed, mapped or not.
    let a = ok(run(&mut s, Op::ManagedPlace, &[0x2000, 0]))[0];
    assert_eq!(host_map(&mut rig, &mut s, a, &runs).status, status::SUCCESS);
    ok(run(&mut s, Op::ManagedPlace, &[0x1000, 0]));
    drop(s);
    assert_eq!(rig.fake.vmm_allocations(), 0);
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
}

#[test]
fn a_copy_back_waits_until_no_work_can_touch_the_memory() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = load_module(&mut rig, &mut s);
    let (r, _) = get_function(&mut rig, &mut s, m, "spin", 64);
    let spin = ok(r)[0];
    let busy = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    let idle = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    let at = ok(run(&mut s, Op::ManagedPlace, &[0x1000, 0]))[0];
    assert_eq!(
        host_map(&mut rig, &mut s, at, &[(0x30_0000, 0x1000)]).status,
        status::SUCCESS
    );
    ok(run(&mut s, Op::Memset, &[at, u64::from(b'G'), 4, 0]));
    // A kernel still running on a stream of the device: globally attached memory is not the
    // host's yet, whatever stream was synchronised.
    let empty = rig.buf(&[]);
    ok(s.execute(&req(
        Op::LaunchKernel,
        0,
        &launch_args(spin, [1, 1, 1], [1, 1, 1], busy),
        vec![empty],
        vec![],
    )));
    let r = s.execute(&migrate(at, MANAGED_TO_HOST, idle, MANAGED_SCOPE_GLOBAL));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 0), "not moved");
    assert_eq!(guest_bytes(&rig, 0x30_0000, 4), [0; 4]);
    // Attached to the idle stream alone, it is the host's once that stream is done.
    let r = s.execute(&migrate(at, MANAGED_TO_HOST, idle, MANAGED_SCOPE_STREAM));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 1));
    assert_eq!(guest_bytes(&rig, 0x30_0000, 4), b"GGGG");
    let r = s.execute(&migrate(at, MANAGED_TO_HOST, busy, MANAGED_SCOPE_STREAM));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 0));
    // A copy to the device on one stream: the session's other streams, and the ones made
    // later, wait for it before their next work.
    let waits = rig.fake.calls("stream_wait_event");
    ok(s.execute(&migrate(at, MANAGED_TO_DEVICE, idle, MANAGED_SCOPE_GLOBAL)));
    // The busy stream and the legacy stream.
    assert_eq!(rig.fake.calls("stream_wait_event"), waits + 2);
    ok(run(&mut s, Op::StreamCreate, &[0, 0]));
    assert_eq!(rig.fake.calls("stream_wait_event"), waits + 3);
    // Attached to one stream, nothing else waits.
    ok(s.execute(&migrate(at, MANAGED_TO_DEVICE, idle, MANAGED_SCOPE_STREAM)));
    assert_eq!(rig.fake.calls("stream_wait_event"), waits + 3);
}

#[test]
fn a_driver_without_virtual_memory_management_places_nothing() {
    let rig = Rig::new(1);
    let mut s = rig.session();
    ok(run(&mut s, Op::Malloc, &[0x1000]));
    let before = rig.fake.vmm_ranges();
    rig.fake.fail_next("mem_create", 801);
    let r = run(&mut s, Op::ManagedPlace, &[0x1000, 0]);
    assert_eq!(r.status, status::NOT_SUPPORTED);
    assert_eq!(
        rig.fake.vmm_ranges(),
        before,
        "the reservation is freed again"
    );
}

#[test]
fn managed_memory_is_a_block_of_the_sessions_range_and_keeps_its_address() {
    assert!(super::super::reserve_window());
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let runs = [(0x30_0000, 0x1000), (0x28_0000, 0x1000)];
    ok(run(&mut s, Op::Malloc, &[0x1000]));
    let (reservations, _) = rig.fake.vmm_ranges();
    // The guest's offer is not needed: the range has the address, whatever a driver honours.
    let r = ok(run(
        &mut s,
        Op::ManagedPlace,
        &[0x2000, MANAGED_WINDOW_BASE],
    ));
    let (at, size) = (r[0], r[1]);
    let space = rig.host.address_space();
    let base = space.session_base(1, 0, 1).unwrap();
    assert!(
        at >= base && at + size <= base + space.per_device,
        "{at:#x}"
    );
    assert!(at.is_multiple_of(MANAGED_ALIGN) && size == MANAGED_ALIGN);
    assert_eq!(
        rig.fake.vmm_ranges().0,
        reservations,
        "no reservation of its own"
    );
    rig.mem
        .write_slice(b"abcd", GuestAddress(0x30_0000))
        .unwrap();
    assert_eq!(
        host_map(&mut rig, &mut s, at, &runs).status,
        status::SUCCESS
    );
    assert_eq!(rig.fake.peek(at, 4).unwrap(), b"abcd");
    ok(run(&mut s, Op::Memset, &[at, u64::from(b'P'), 2, 0]));
    // Paused and resumed: the block comes back at its address with the device's bytes.
    s.pause().unwrap();
    s.resume().unwrap();
    assert_eq!(rig.fake.peek(at, 4).unwrap(), b"PPcd");
    let r = s.execute(&migrate(at, MANAGED_TO_HOST, 0, MANAGED_SCOPE_GLOBAL));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, 1));
    assert_eq!(guest_bytes(&rig, 0x30_0000, 4), b"PPcd");
    // Saved and restored in a fresh worker (a restart or a migration): the same address.
    let bytes = s.capture().unwrap().encode();
    drop(s);
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
    let mut r = GpuState::restore(&rig.host, 1, &bytes).unwrap();
    r.attach_guest_ram(&rig.mem);
    assert_eq!(rig.host.sticky_error(), None);
    assert_eq!(rig.fake.peek(at, 4).unwrap(), b"PPcd");
    rig.mem.write_slice(b"xy", GuestAddress(0x30_0000)).unwrap();
    ok(r.execute(&migrate(at, MANAGED_TO_DEVICE, 0, MANAGED_SCOPE_GLOBAL)));
    assert_eq!(rig.fake.peek(at, 4).unwrap(), b"xycd");
    // Unmapped, its block goes back to the range (the address is the next placement's).
    ok(run(&mut r, Op::HostUnmap, &[at]));
    assert_eq!(s_place(&mut r), at, "the freed block is handed out again");
    drop(r);
    assert_eq!(rig.fake.vmm_ranges(), (0, 0));
}

fn s_place(s: &mut GpuState) -> u64 {
    ok(run(s, Op::ManagedPlace, &[0x2000, 0]))[0]
}

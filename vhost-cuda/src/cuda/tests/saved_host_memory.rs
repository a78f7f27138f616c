//! Guest memory mapped for the GPU in a saved state (gpu_state/saved_host_memory.rs): pinned,
//! registered and managed memory captured, encoded, decoded and restored into a fresh state
//! over the fake driver, with guest RAM moved as a migration moves it.

use std::os::fd::FromRawFd;

use qcuda_proto::{HostRun, HOST_MAP_MANAGED, HOST_MAP_READ_ONLY, HOST_WINDOW_BASE};

use super::*;
use crate::{
    cuda::{gpu_state::CheckpointError, saved_state::SavedState},
    limits::{GpuMemoryQuota, QuotaSlot, SlotLease},
};

/// Where a test's program maps its memory (tests run in parallel in one process, whose host
/// window they share): pinned memory (two guest pages at a window address), registered memory
/// (one read-only page at a `malloc`-style address outside the window) and managed memory
/// placed on the device (two pages, wherever the driver placed them: 0 until then).
#[derive(Clone, Copy)]
struct At {
    pinned: u64,
    registered: u64,
    managed: u64,
}

impl At {
    const fn slot(k: u64) -> Self {
        Self {
            pinned: HOST_WINDOW_BASE + ((k + 1) << 32),
            registered: 0x3e51_2340_0000 + (k << 32),
            managed: 0,
        }
    }
}

/// `cudaMallocManaged`'s two steps: device memory placed (`ManagedPlace`, where the driver
/// chooses), then the guest's pages mapped there. Returns the address.
fn place(rig: &mut Rig, s: &mut GpuState, runs: &[(u64, u64)]) -> u64 {
    let len: u64 = runs.iter().map(|r| r.1).sum();
    let at = ok(run(s, Op::ManagedPlace, &[len, 0]))[0];
    assert_eq!(host_map(rig, s, at, runs, HOST_MAP_MANAGED), at);
    at
}

const PINNED_RUNS: [(u64, u64); 2] = [(0x180_0000, 0x1000), (0x1a0_0000, 0x1000)];
const REGISTERED_RUNS: [(u64, u64); 1] = [(0x1c0_0000, 0x1000)];
const MANAGED_RUNS: [(u64, u64); 2] = [(0x1e0_0000, 0x1000), (0x1d0_0000, 0x1000)];

fn run_table(runs: &[(u64, u64)]) -> Vec<u8> {
    runs.iter()
        .flat_map(|&(gpa, len)| HostRun { gpa, len }.encode())
        .collect()
}

fn host_map(rig: &mut Rig, s: &mut GpuState, guest: u64, runs: &[(u64, u64)], flags: u64) -> u64 {
    let len = runs.iter().map(|r| r.1).sum();
    let t = rig.buf(&run_table(runs));
    let r = s.execute(&req(Op::HostMap, 0, &[guest, len, flags], vec![t], vec![]));
    assert_eq!(r.status, status::SUCCESS, "HostMap at {guest:#x}");
    r.rets[0]
}

fn guest_bytes(mem: &GuestRam, gpa: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    mem.read_slice(&mut v, GuestAddress(gpa)).unwrap();
    v
}

/// A fake worker host counting its device memory in slot `lease` of `quota`.
fn quota_rig(lease: &SlotLease) -> Rig {
    let rig = Rig::new(1);
    // SAFETY: dup of an open descriptor returns a new one we own.
    let file = unsafe { std::fs::File::from_raw_fd(libc::dup(lease.fd())) };
    rig.host
        .set_memory_quota(QuotaSlot::attach(file, lease.index()).unwrap());
    rig
}

/// Guest RAM's bytes, as the migration's last pass copies them.
fn ram_of(rig: &Rig) -> Vec<u8> {
    let mut all = vec![0u8; RAM];
    rig.mem.read_slice(&mut all, GuestAddress(0)).unwrap();
    all
}

/// Guest RAM as a migration leaves it: the destination's own memfd, holding the same bytes.
fn migrate_ram(ram: &[u8], to: &Rig) {
    to.mem.write_slice(ram, GuestAddress(0)).unwrap();
}

/// A state with pinned, registered and managed memory, the managed bytes on the device
/// differing from its guest pages. Returns the session.
fn program(rig: &mut Rig, at: At) -> (GpuState, At) {
    let At {
        pinned, registered, ..
    } = at;
    let mut s = GpuState::open(&rig.host, 3);
    assert_eq!(host_map(rig, &mut s, pinned, &PINNED_RUNS, 0), pinned);
    let got = host_map(
        rig,
        &mut s,
        registered,
        &REGISTERED_RUNS,
        HOST_MAP_READ_ONLY,
    );
    assert_eq!(got, registered, "the test's address is free here");
    let managed = place(rig, &mut s, &MANAGED_RUNS);
    rig.mem
        .write_slice(b"pinned page", GuestAddress(PINNED_RUNS[0].0))
        .unwrap();
    rig.mem
        .write_slice(b"registered", GuestAddress(REGISTERED_RUNS[0].0))
        .unwrap();
    rig.mem
        .write_slice(b"guest side", GuestAddress(MANAGED_RUNS[0].0))
        .unwrap();
    // The device's copy of the managed bytes: written by the GPU, not yet moved back.
    ok(run(
        &mut s,
        Op::Memset,
        &[managed, u64::from(b'D'), 0x1800, 0],
    ));
    (s, At { managed, ..at })
}

/// Everything reaches the GPU at the addresses the guest holds, and the managed memory holds
/// the device's bytes as they were saved.
fn check_program(rig: &mut Rig, s: &mut GpuState, at: At) {
    let At {
        pinned,
        registered,
        managed,
    } = at;
    let scratch = malloc(s, 64);
    let copy =
        |dst: u64, src: u64, n: u64| req(Op::MemcpyMapped, 0, &[dst, src, n, 0], vec![], vec![]);
    ok(s.execute(&copy(scratch, pinned, 11)));
    assert_eq!(rig.fake.peek(scratch, 11).unwrap(), b"pinned page");
    ok(s.execute(&copy(scratch, registered, 10)));
    assert_eq!(rig.fake.peek(scratch, 10).unwrap(), b"registered");
    // The device writes the pinned memory's second page: guest RAM holds it.
    ok(s.execute(&copy(pinned + 0x1000, scratch, 10)));
    assert_eq!(guest_bytes(&rig.mem, PINNED_RUNS[1].0, 10), b"registered");
    assert_eq!(rig.fake.peek(managed, 4).unwrap(), b"DDDD");
    assert_eq!(rig.fake.peek(managed + 0x1800, 1).unwrap(), [0]);
    assert_eq!(guest_bytes(&rig.mem, MANAGED_RUNS[0].0, 10), b"guest side");
    let migrate = |dir: u64| req(Op::ManagedMigrate, 0, &[managed, dir, 0], vec![], vec![]);
    ok(s.execute(&migrate(qcuda_proto::MANAGED_TO_HOST)));
    assert_eq!(guest_bytes(&rig.mem, MANAGED_RUNS[0].0, 4), b"DDDD");
    assert_eq!(guest_bytes(&rig.mem, MANAGED_RUNS[1].0 + 0x7ff, 2), b"D\0");
    rig.mem
        .write_slice(b"up", GuestAddress(MANAGED_RUNS[0].0))
        .unwrap();
    ok(s.execute(&migrate(qcuda_proto::MANAGED_TO_DEVICE)));
    assert_eq!(rig.fake.peek(managed, 4).unwrap(), b"upDD");
    ok(run(s, Op::Free, &[scratch]));
}

#[test]
fn pinned_registered_and_managed_memory_come_back_at_the_addresses_the_guest_holds() {
    assert!(crate::cuda::reserve_window());
    let quota = GpuMemoryQuota::new(1 << 30, 4).unwrap();
    let (la, lb) = (quota.lease().unwrap(), quota.lease().unwrap());
    let mut a = quota_rig(&la);
    let (mut s, at) = program(&mut a, At::slot(0));
    let At {
        pinned,
        registered,
        managed,
    } = at;
    let saved = s.capture().unwrap();
    assert_eq!(saved.host_mappings.len(), 2);
    assert_eq!(saved.managed.len(), 1);
    assert!(saved.managed[0].contents[..0x1800]
        .iter()
        .all(|&b| b == b'D'));
    let bytes = saved.encode();
    let ram = ram_of(&a);
    assert_eq!(SavedState::decode(&bytes).unwrap(), saved);
    let (used, registrations, vmm) = (quota.used(), a.fake.registered(), a.fake.vmm_allocations());
    let counts = format!("{s:?}");
    assert!(used >= 2 << 20, "managed memory counts: {used}");
    // The source goes on after a capture.
    check_program(&mut a, &mut s, at);
    drop(s);
    assert_eq!(quota.used(), 0);

    // The destination: a fresh worker, with guest RAM moved to its own memfd. The state comes
    // before guest RAM's table, as in a migration: the mappings wait for it.
    let mut b = quota_rig(&lb);
    migrate_ram(&ram, &b);
    // Unmapped before guest RAM came (no guest does that, a hostile one may): given up, and
    // what is left is made when it comes.
    let mut early = GpuState::restore(&b.host, 3, &bytes).unwrap();
    ok(run(&mut early, Op::HostUnmap, &[managed]));
    ok(run(&mut early, Op::HostUnmap, &[pinned]));
    assert_eq!(quota.used(), used - (2 << 20));
    early.attach_guest_ram(&b.mem);
    assert_eq!(b.host.sticky_error(), None);
    assert_eq!(b.fake.registered(), 1);
    drop(early);
    assert_eq!(quota.used(), 0);
    assert_eq!(b.fake.registered(), 0);
    let mut r = GpuState::restore(&b.host, 3, &bytes).unwrap();
    assert_eq!(quota.used(), used);
    assert_eq!(b.fake.peek(managed, 4).unwrap(), b"DDDD");
    assert_eq!(
        b.fake.registered(),
        0,
        "nothing registered before guest RAM"
    );
    // Saved again before guest RAM came: the same state.
    let again = r.capture().unwrap();
    assert_eq!(
        (&again.host_mappings, &again.managed),
        (&saved.host_mappings, &saved.managed)
    );
    r.attach_guest_ram(&b.mem);
    assert_eq!(b.host.sticky_error(), None);
    assert_eq!(
        (quota.used(), b.fake.registered(), b.fake.vmm_allocations()),
        (used, registrations, vmm)
    );
    assert_eq!(format!("{r:?}"), counts);
    let again = r.capture().unwrap();
    assert_eq!(
        (&again.host_mappings, &again.managed),
        (&saved.host_mappings, &saved.managed)
    );
    check_program(&mut b, &mut r, at);
    drop(r);
    assert_eq!(quota.used(), 0);
    assert_eq!(b.fake.registered(), 0);
    assert_eq!(b.fake.vmm_ranges(), (0, 0));

    // Guest RAM already there (a restart on the same host): made at once.
    migrate_ram(&ram, &b);
    let mut r = GpuState::open(&b.host, 3);
    r.attach_guest_ram(&b.mem);
    r.restore_saved(&bytes).unwrap();
    assert_eq!(
        (quota.used(), b.fake.registered(), b.fake.vmm_allocations()),
        (used, registrations, vmm)
    );
    check_program(&mut b, &mut r, at);
    // Unmapped as any mapping is.
    for guest in [pinned, registered, managed] {
        ok(run(&mut r, Op::HostUnmap, &[guest]));
    }
    assert_eq!(b.fake.registered(), 0);
    drop(r);
    assert_eq!(quota.used(), 0);
    drop((la, lb));
}

#[test]
fn a_restore_whose_address_is_taken_fails_and_leaves_nothing_behind() {
    assert!(crate::cuda::reserve_window());
    let quota = GpuMemoryQuota::new(1 << 30, 4).unwrap();
    let (la, lb) = (quota.lease().unwrap(), quota.lease().unwrap());
    let mut a = quota_rig(&la);
    // Another test's addresses: this one keeps its source alive.
    let mut s = GpuState::open(&a.host, 3);
    let At {
        registered: outside,
        ..
    } = At::slot(1);
    place(&mut a, &mut s, &MANAGED_RUNS);
    assert_eq!(
        host_map(&mut a, &mut s, outside, &REGISTERED_RUNS, 0),
        outside
    );
    let bytes = s.save().unwrap();
    let used = quota.used();
    let ram = ram_of(&a);

    // The source still holds `outside` in this process: the device address the guest holds
    // cannot be had again, so the restore fails, before and after guest RAM came.
    let b = quota_rig(&lb);
    migrate_ram(&ram, &b);
    let e = GpuState::restore(&b.host, 3, &bytes).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Mismatch(why) if why.contains("cannot be had")),
        "{e}"
    );
    let gone = |b: &Rig| {
        assert_eq!(quota.used(), used, "only the source's");
        assert_eq!(b.fake.registered(), 0);
        assert_eq!(b.fake.vmm_ranges(), (0, 0));
        assert_eq!(b.fake.vmm_allocations(), 0);
        assert_eq!(b.fake.live_contexts(), 0);
    };
    gone(&b);
    let mut r = GpuState::open(&b.host, 3);
    r.attach_guest_ram(&b.mem);
    r.restore_saved(&bytes).unwrap_err();
    drop(r);
    gone(&b);
    // The source goes on.
    let scratch = malloc(&mut s, 16);
    let copy = req(
        Op::MemcpyMapped,
        0,
        &[scratch, outside, 4, 0],
        vec![],
        vec![],
    );
    ok(s.execute(&copy));
    drop(s);
    drop((la, lb));
}

#[test]
fn hostile_host_memory_records_are_refused_and_leave_nothing_behind() {
    assert!(crate::cuda::reserve_window());
    let mut a = Rig::new(1);
    let (mut s, at) = program(&mut a, At::slot(2));
    let At {
        pinned, managed, ..
    } = at;
    let saved = s.capture().unwrap();
    let ram = ram_of(&a);
    drop(s);
    let b = Rig::new(1);
    migrate_ram(&ram, &b);
    let refused = |st: &SavedState, with_ram: bool| {
        let mut r = GpuState::open(&b.host, 3);
        if with_ram {
            r.attach_guest_ram(&b.mem);
        }
        let e = r.restore_saved(&st.encode());
        assert!(e.is_err(), "{st:?}");
        drop(r);
        assert_eq!(b.fake.registered(), 0);
        assert_eq!(b.fake.vmm_ranges(), (0, 0));
        assert_eq!(b.fake.live_contexts(), 0);
    };
    // Runs outside guest RAM (32 MiB), across its end, unaligned, of the wrong total.
    let mut bad = saved.clone();
    bad.host_mappings[0].runs[0].0 = 0x4000_0000;
    refused(&bad, true);
    let mut bad = saved.clone();
    bad.managed[0].runs[0].0 = (RAM as u64) - 0x1000;
    bad.managed[0].runs[0].1 = 0x2000;
    bad.managed[0].contents.resize(0x3000, 0);
    refused(&bad, true);
    let mut bad = saved.clone();
    bad.host_mappings[1].runs[0].0 += 8;
    refused(&bad, false);
    let mut bad = saved.clone();
    bad.host_mappings[0].len += 0x1000;
    refused(&bad, false);
    let mut bad = saved.clone();
    bad.managed[0].contents.pop();
    refused(&bad, false);
    // Over each other, over managed memory's granule, a window address elsewhere.
    let mut bad = saved.clone();
    bad.host_mappings[1].guest = bad.host_mappings[0].guest + 0x1000;
    bad.host_mappings[1].local = bad.host_mappings[1].guest;
    refused(&bad, false);
    let mut bad = saved.clone();
    bad.host_mappings[0].guest = managed + 0x10_0000;
    bad.host_mappings[0].local = bad.host_mappings[0].guest;
    refused(&bad, false);
    let mut bad = saved.clone();
    bad.host_mappings[0].local += 0x10_0000;
    refused(&bad, false);
    // Managed memory off its granule; unknown flags and devices; huge run counts.
    let mut bad = saved.clone();
    bad.managed[0].guest += 0x1000;
    refused(&bad, false);
    let mut bad = saved.clone();
    bad.host_mappings[0].flags = 0x80;
    refused(&bad, false);
    let mut bad = saved.clone();
    bad.host_mappings[0].dev = 1;
    refused(&bad, false);
    let mut bad = saved.clone();
    bad.host_mappings[0].runs = vec![(0x10_0000, 0x1000); 40 * 1024];
    bad.host_mappings[0].len = 40 * 1024 * 0x1000;
    refused(&bad, false);
    // Another device address than the guest holds.
    let mut bad = saved.clone();
    bad.host_mappings[0].dev_addr += 0x1000;
    refused(&bad, true);
    // The same, found only when guest RAM comes (a migration's destination): the program's
    // calls fail from then on with a sticky error (its worker's exit frees the rest).
    let mut r = GpuState::open(&b.host, 3);
    r.restore_saved(&bad.encode()).unwrap();
    r.attach_guest_ram(&b.mem);
    assert_eq!(b.host.sticky_error(), Some(status::UNKNOWN));
    let copy = req(
        Op::MemcpyMapped,
        0,
        &[managed, pinned, 4, 0],
        vec![],
        vec![],
    );
    let resp = r.execute(&copy);
    assert_eq!(resp.status, status::UNKNOWN);
    assert_ne!(resp.flags & qcuda_proto::RESP_FLAG_STICKY, 0);
    assert_eq!(b.fake.registered(), 1, "the other mapping was made");
    drop(r);
    // Flipped bytes: refused or restored, never a panic, nothing left behind.
    let mut c = Rig::new(1);
    migrate_ram(&ram, &c);
    let bytes = saved.encode();
    for i in (0..bytes.len()).step_by(bytes.len() / 200 + 1) {
        let mut b2 = bytes.clone();
        b2[i] ^= 0x5a;
        if let Ok(mut r) = GpuState::restore(&c.host, 3, &b2) {
            r.attach_guest_ram(&c.mem);
        }
        if c.host.sticky_error().is_some() {
            // Found only when guest RAM came (a run past it): the worker's calls fail from
            // then on and its exit frees the rest, as above; the next flips get a fresh one.
            c = Rig::new(1);
            migrate_ram(&ram, &c);
            continue;
        }
        assert_eq!(c.fake.registered(), 0);
        assert_eq!(c.fake.vmm_ranges(), (0, 0), "byte {i}");
    }
}

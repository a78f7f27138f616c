//! Capture, restore, pause and resume of the GPU state over the fake driver.

use qcuda_proto::{tex, HostRun, LaunchAttr, HOST_WINDOW_BASE};

use super::*;
use crate::cuda::{driver::vmm::VmmDriverApi, gpu_state::CheckpointError, saved_state::SavedState};

/// What a program holds: a linked list in device memory (each node's first 8 bytes the next
/// node's address), a buffer for vadd, a module with its function and global, a stream with
/// an attribute, a recorded event, a limit.
struct Program {
    nodes: Vec<u64>,
    module: u64,
    func: u64,
    global: u64,
    stream: u64,
    event: u64,
    abc: [u64; 3],
}

const N: usize = 64;

fn build(rig: &mut Rig, s: &mut GpuState) -> Program {
    // Nodes of several sizes, so small classes and large runs are both saved.
    let sizes = [24u64, 300, 4096, 3 << 20, 40];
    let nodes: Vec<u64> = sizes.iter().map(|&n| malloc(s, n)).collect();
    for (i, &p) in nodes.iter().enumerate() {
        let next = nodes.get(i + 1).copied().unwrap_or(0);
        let mut node = next.to_le_bytes().to_vec();
        node.extend_from_slice(&(i as u64 * 7).to_le_bytes());
        ok(htod(rig, s, p, &node, &[16]));
    }
    let module = load_module(rig, s);
    let (r, _) = get_function(rig, s, module, "vadd", 64);
    let func = ok(r)[0];
    ok(run(s, Op::FuncSetAttribute, &[func, 8, 1024]));
    let name = rig.buf(b"g");
    let global = ok(s.execute(&req(Op::ModuleGetGlobal, 0, &[module], vec![name], vec![])))[0];
    ok(htod(rig, s, global, b"global value", &[12]));
    let stream = ok(run(s, Op::StreamCreate, &[1, u64::from(u32::MAX)]))[0];
    let attr = LaunchAttr {
        id: 3,
        v: [1, 0, 0],
        ..LaunchAttr::default()
    };
    let a = rig.buf(&attr.encode());
    ok(s.execute(&req(Op::StreamSetAttribute, 0, &[stream], vec![a], vec![])));
    let event = ok(run(s, Op::EventCreate, &[0]))[0];
    ok(run(s, Op::EventRecord, &[event, stream]));
    ok(run(s, Op::DeviceSetLimit, &[0, 4096]));
    let abc = [
        malloc(s, 4 * N as u64),
        malloc(s, 4 * N as u64),
        malloc(s, 4 * N as u64),
    ];
    let xs: Vec<f32> = (0..N).map(|i| i as f32).collect();
    ok(htod(rig, s, abc[0], &floats(&xs), &[4 * N]));
    ok(htod(rig, s, abc[1], &floats(&xs), &[4 * N]));
    Program {
        nodes,
        module,
        func,
        global,
        stream,
        event,
        abc,
    }
}

/// Checks that everything the program holds still works: the list walked through the
/// pointers stored in device memory, vadd launched through its handle on its stream, the
/// global, the event, the limit.
fn check(rig: &mut Rig, s: &mut GpuState, p: &Program) {
    let mut at = p.nodes[0];
    let mut walked = 0;
    while at != 0 {
        let (r, node) = dtoh(rig, s, at, 16, &[16]);
        ok(r);
        assert_eq!(
            u64::from_le_bytes(node[8..].try_into().unwrap()),
            walked * 7
        );
        at = u64::from_le_bytes(node[..8].try_into().unwrap());
        walked += 1;
    }
    assert_eq!(walked, p.nodes.len() as u64);
    let mut block = Vec::new();
    for x in p.abc {
        block.extend_from_slice(&x.to_le_bytes());
    }
    block.extend_from_slice(&i32::try_from(N).unwrap().to_le_bytes());
    let pb = rig.buf(&block);
    let args = launch_args(p.func, [1, 1, 1], [128, 1, 1], p.stream);
    ok(s.execute(&req(Op::LaunchKernel, 0, &args, vec![pb], vec![])));
    ok(run(s, Op::StreamSynchronize, &[p.stream]));
    let (r, got) = dtoh(rig, s, p.abc[2], 4 * N, &[4 * N]);
    ok(r);
    let want: Vec<f32> = (0..N).map(|i| 2.0 * i as f32).collect();
    assert_eq!(got, floats(&want));
    let (r, g) = dtoh(rig, s, p.global, 12, &[12]);
    ok(r);
    assert_eq!(g, b"global value");
    ok(run(s, Op::EventSynchronize, &[p.event]));
    assert_eq!(ok(run(s, Op::DeviceGetLimit, &[0]))[0], 4096);
    let out = rig.out(LAUNCH_ATTR_SIZE_FOR_TESTS);
    ok(s.execute(&req(
        Op::StreamGetAttribute,
        0,
        &[p.stream, 3],
        vec![],
        vec![out.clone()],
    )));
    assert_eq!(LaunchAttr::decode(&out.to_vec().unwrap()).unwrap().v[0], 1);
    assert!(p.module != 0);
}

const LAUNCH_ATTR_SIZE_FOR_TESTS: usize = qcuda_proto::LAUNCH_ATTR_SIZE;

#[test]
fn a_state_restored_in_a_fresh_worker_keeps_its_handles_pointers_and_contents() {
    let mut a = Rig::new(1);
    let mut s = GpuState::open(&a.host, 3);
    let p = build(&mut a, &mut s);
    check(&mut a, &mut s, &p);
    let saved = s.capture().unwrap();
    assert!(saved.device_bytes() >= (3 << 20) + 12);
    let bytes = saved.encode();
    assert_eq!(SavedState::decode(&bytes).unwrap(), saved);
    // The state goes on running after a capture.
    check(&mut a, &mut s, &p);
    drop(s);

    // Another worker: a fresh driver (process), a fresh host, other guest memory.
    let mut b = Rig::new(1);
    let mut r = GpuState::restore(&b.host, 3, &bytes).unwrap();
    check(&mut b, &mut r, &p);
    // New handles never collide with restored ones; new memory never overlaps restored blocks.
    let stream = ok(run(&mut r, Op::StreamCreate, &[0, 0]))[0];
    assert!(stream > p.event);
    let q = malloc(&mut r, 24);
    assert!(!p.nodes.contains(&q));
    // A restored state is saved again just the same.
    let again = r.capture().unwrap();
    assert_eq!(again.allocations.len(), saved.allocations.len() + 1);
    drop(r);
    assert_eq!(b.fake.live_contexts(), 0);
    assert_eq!(b.fake.vmm_ranges(), (0, 0));
}

#[test]
fn pause_gives_the_gpu_back_and_the_next_call_resumes_unaware() {
    assert!(crate::cuda::reserve_window());
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let p = build(&mut rig, &mut s);
    // Guest memory mapped for the device (how managed memory reaches the GPU).
    let guest = HOST_WINDOW_BASE + 0x7300_0000;
    let t = rig.buf(
        &HostRun {
            gpa: 0x30_0000,
            len: 0x1000,
        }
        .encode(),
    );
    let r = s.execute(&req(Op::HostMap, 0, &[guest, 0x1000, 0], vec![t], vec![]));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, guest));
    let saved = s.pause().unwrap();
    assert!(saved >= 3 << 20);
    assert!(s.is_paused());
    // The memory is given back; the context (code, streams, events) and the reserved range
    // stay.
    assert_eq!(rig.fake.vmm_ranges(), (1, 0));
    assert_eq!(rig.fake.vmm_allocations(), 0);
    assert_eq!(rig.fake.live_contexts(), 1);
    assert_eq!(s.pause(), Err(CheckpointError::WrongPhase("paused")));
    // The next op resumes first.
    check(&mut rig, &mut s, &p);
    assert!(!s.is_paused());
    // The host mapping still reaches the device.
    let scratch = malloc(&mut s, 64);
    rig.mem
        .write_slice(b"managed", GuestAddress(0x30_0000))
        .unwrap();
    let copy = req(Op::MemcpyMapped, 0, &[scratch, guest, 7, 0], vec![], vec![]);
    ok(s.execute(&copy));
    assert_eq!(rig.fake.peek(scratch, 7).unwrap(), b"managed");
    // Pause and resume by hand, twice.
    for _ in 0..2 {
        s.pause().unwrap();
        s.resume().unwrap();
    }
    assert_eq!(s.resume(), Err(CheckpointError::WrongPhase("running")));
    check(&mut rig, &mut s, &p);
}

#[test]
fn what_cannot_be_saved_is_refused_and_the_program_goes_on() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let p = build(&mut rig, &mut s);
    // A capture under way: busy, try again later.
    ok(run(&mut s, Op::StreamBeginCapture, &[p.stream, 2]));
    assert_eq!(s.pause(), Err(CheckpointError::Busy));
    assert_eq!(s.save(), Err(CheckpointError::Busy));
    let graph = ok(run(&mut s, Op::StreamEndCapture, &[p.stream]))[0];
    // A graph lives in its context: a pause keeps it; a saved state cannot make this one
    // again (captured from a stream with attributes, which its kernel nodes may carry).
    assert!(matches!(s.save(), Err(CheckpointError::Unsupported(_))));
    s.pause().unwrap();
    s.resume().unwrap();
    ok(run(&mut s, Op::GraphDestroy, &[graph]));
    // Live stream-ordered allocations live in the driver's pools, at its addresses.
    let q = ok(run(&mut s, Op::MallocAsync, &[100, p.stream, 0]))[0];
    assert!(matches!(
        s.save(),
        Err(CheckpointError::Unsupported(what)) if what.contains("stream-ordered")
    ));
    ok(run(&mut s, Op::FreeAsync, &[q, p.stream]));
    ok(run(&mut s, Op::StreamSynchronize, &[p.stream]));
    check(&mut rig, &mut s, &p);
    // Allocations outside a reserved range cannot be paused.
    let rig2 = Rig::new(1);
    rig2.host.set_address_space(crate::cuda::AddressSpace::OFF);
    let mut t = rig2.session();
    malloc(&mut t, 64);
    assert!(matches!(t.pause(), Err(CheckpointError::Unsupported(_))));
    malloc(&mut t, 64);
}

#[test]
fn a_hostile_saved_state_is_refused_and_leaves_nothing_behind() {
    let mut a = Rig::new(1);
    let mut s = GpuState::open(&a.host, 3);
    build(&mut a, &mut s);
    let saved = s.capture().unwrap();
    drop(s);
    let b = Rig::new(1);
    let refused = |bytes: &[u8]| {
        GpuState::restore(&b.host, 3, bytes).unwrap_err();
        assert_eq!(b.fake.live_contexts(), 0);
        assert_eq!(b.fake.vmm_ranges(), (0, 0));
    };
    // Another session's, another address space's.
    assert!(matches!(
        GpuState::restore(&b.host, 4, &saved.encode()),
        Err(CheckpointError::Mismatch(_))
    ));
    let mut other = saved.clone();
    other.va_base += 2 << 20;
    refused(&other.encode());
    // Memory outside the range, blocks over each other, contents of the wrong length, handles
    // taken twice or never handed out, devices that do not exist, an unloadable image.
    let mut bad = saved.clone();
    bad.allocations[0].ptr = 0x1000;
    refused(&bad.encode());
    let mut bad = saved.clone();
    bad.allocations[1].ptr = bad.allocations[0].ptr;
    refused(&bad.encode());
    let mut bad = saved.clone();
    bad.allocations[0].contents.push(0);
    refused(&bad.encode());
    let mut bad = saved.clone();
    bad.streams[0].handle = bad.events[0].handle;
    refused(&bad.encode());
    let mut bad = saved.clone();
    bad.events[0].handle = bad.last_handle + 1;
    refused(&bad.encode());
    let mut bad = saved.clone();
    bad.contexts[0].dev = 5;
    refused(&bad.encode());
    let mut bad = saved.clone();
    bad.modules[0].image = b"\x7fELF nonsense".to_vec();
    refused(&bad.encode());
    let mut bad = saved.clone();
    bad.globals[0].ptr += 8;
    refused(&bad.encode());
    // Any single flipped byte: refused or restored, never a panic, nothing left behind.
    let bytes = saved.encode();
    for i in (0..bytes.len()).step_by(bytes.len() / 96 + 1) {
        let mut b2 = bytes.clone();
        b2[i] ^= 0x5a;
        if let Ok(r) = GpuState::restore(&b.host, 3, &b2) {
            drop(r);
        }
        assert_eq!(b.fake.live_contexts(), 0);
        assert_eq!(b.fake.vmm_ranges(), (0, 0));
    }
}

#[cfg(feature = "fuzzing")]
#[test]
fn the_fuzz_seed_restores() {
    assert!(crate::cuda::fuzzing::restore_saved_state(
        &crate::cuda::fuzzing::sample_saved_state()
    ));
}

/// The handover offer's fuzz check: the seed decodes, every cut and flipped byte is refused or
/// decodes to bytes that encode back the same.
#[cfg(feature = "fuzzing")]
#[test]
fn the_handover_offer_seed_decodes_and_its_mutations_never_panic() {
    let seed = crate::cuda::fuzzing::sample_handover_offer();
    assert!(crate::cuda::fuzzing::decode_handover_offer(&seed));
    for i in 0..seed.len() {
        assert!(!crate::cuda::fuzzing::decode_handover_offer(&seed[..i]));
        let mut b = seed.clone();
        b[i] ^= 0x81;
        crate::cuda::fuzzing::decode_handover_offer(&b);
    }
}

/// The fuzz target's check over every flipped byte of its seed (graphs included): refused or
/// restored, never a panic, nothing left behind.
#[cfg(feature = "fuzzing")]
#[test]
fn every_flipped_byte_of_the_fuzz_seed_restores_or_is_refused_cleanly() {
    let seed = crate::cuda::fuzzing::sample_saved_state();
    for i in 0..seed.len() {
        let mut b = seed.clone();
        b[i] ^= 0x81;
        crate::cuda::fuzzing::restore_saved_state(&b);
    }
}

#[test]
fn memory_pools_come_back_under_their_handles_with_their_settings() {
    let mut a = Rig::new(2);
    let mut s = GpuState::open(&a.host, 3);
    let p = build(&mut a, &mut s);
    let default = ok(run(&mut s, Op::DeviceGetDefaultMemPool, &[]))[0];
    // The default pool's release threshold, and a created pool with a size limit, settings,
    // access for device 1, made current.
    ok(run(&mut s, Op::MemPoolSetAttribute, &[default, 4, 1 << 30]));
    let pool = ok(run(
        &mut s,
        Op::MemPoolCreate,
        &[64 << 20, qcuda_proto::POOL_HANDLE_POSIX_FD],
    ))[0];
    ok(run(&mut s, Op::MemPoolSetAttribute, &[pool, 1, 0]));
    ok(run(&mut s, Op::MemPoolSetAttribute, &[pool, 4, 4096]));
    ok(run(&mut s, Op::MemPoolSetAttribute, &[pool, 4, 8192]));
    let descs: Vec<u8> = [1u32, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let d = a.buf(&descs);
    ok(s.execute(&req(Op::MemPoolSetAccess, 0, &[pool], vec![d], vec![])));
    ok(run(&mut s, Op::DeviceSetMemPool, &[pool]));
    // A stream-ordered allocation freed before the save leaves nothing to refuse.
    let q = ok(run(&mut s, Op::MallocAsync, &[100, p.stream, 0]))[0];
    ok(run(&mut s, Op::FreeAsync, &[q, p.stream]));
    let saved = s.capture().unwrap();
    assert_eq!(saved.pools.len(), 2);
    assert!(saved
        .pools
        .iter()
        .any(|p| p.shareable && p.max_size == 64 << 20));
    let bytes = saved.encode();
    assert_eq!(SavedState::decode(&bytes).unwrap(), saved);
    drop(s);

    let mut b = Rig::new(2);
    let mut r = GpuState::restore(&b.host, 3, &bytes).unwrap();
    check(&mut b, &mut r, &p);
    assert_eq!(
        ok(run(&mut r, Op::DeviceGetDefaultMemPool, &[]))[0],
        default
    );
    assert_eq!(ok(run(&mut r, Op::DeviceGetMemPool, &[]))[0], pool);
    let attr = |r: &mut GpuState, h: u64, a: u64| ok(run(r, Op::MemPoolGetAttribute, &[h, a]))[0];
    assert_eq!(attr(&mut r, default, 4), 1 << 30);
    assert_eq!(attr(&mut r, pool, 1), 0);
    assert_eq!(attr(&mut r, pool, 4), 8192);
    assert_eq!(ok(run(&mut r, Op::MemPoolGetAccess, &[pool, 1]))[0], 3);
    // The current pool serves the next stream-ordered allocation, as before the save.
    let q = ok(run(&mut r, Op::MallocAsync, &[512, p.stream, 0]))[0];
    assert_eq!(attr(&mut r, pool, 7), 512);
    ok(run(&mut r, Op::FreeAsync, &[q, p.stream]));
    ok(run(&mut r, Op::MemPoolDestroy, &[pool]));
    assert_eq!(ok(run(&mut r, Op::DeviceGetMemPool, &[]))[0], default);

    // A saved pool the restore cannot make is refused, and nothing stays behind.
    let c = Rig::new(2);
    for bad in [
        {
            let mut x = saved.clone();
            x.pools[1].settings.push((9, 0));
            x
        },
        {
            let mut x = saved.clone();
            x.pools[1].access.push((7, 3));
            x
        },
        {
            let mut x = saved.clone();
            x.pools[0].current = true;
            x
        },
        {
            let mut x = saved.clone();
            x.pools[1].handle = x.pools[0].handle;
            x
        },
    ] {
        assert!(matches!(
            GpuState::restore(&c.host, 3, &bad.encode()),
            Err(CheckpointError::Mismatch(_))
        ));
        assert_eq!(c.fake.live_contexts(), 0);
        assert_eq!(c.fake.vmm_ranges(), (0, 0));
    }
}

/// A `MemSetAccess` of `(ordinal, flags)` records over `ptr..ptr + size`.
fn set_access(rig: &mut Rig, s: &mut GpuState, ptr: u64, size: u64, recs: &[(u32, u32)]) {
    let bytes: Vec<u8> = recs
        .iter()
        .flat_map(|&(d, f)| [d.to_le_bytes(), f.to_le_bytes()].concat())
        .collect();
    let b = rig.buf(&bytes);
    ok(s.execute(&req(Op::MemSetAccess, 0, &[ptr, size], vec![b], vec![])));
}

#[test]
fn the_programs_own_vmm_memory_comes_back_at_its_addresses_with_its_handles() {
    let mut a = Rig::new(2);
    let mut s = GpuState::open(&a.host, 3);
    let p = build(&mut a, &mut s);
    let g = ok(run(&mut s, Op::MemGetGranularity, &[0, 0, 0, 0]))[0];
    let h1 = ok(run(&mut s, Op::MemCreate, &[2 * g, 0, 0, 0]))[0];
    let h2 = ok(run(
        &mut s,
        Op::MemCreate,
        &[g, qcuda_proto::VMM_HANDLE_POSIX_FD, 0, 0],
    ))[0];
    // Never mapped: its handle alone keeps it.
    let h3 = ok(run(&mut s, Op::MemCreate, &[g, 0, 0, 0]))[0];
    let va = ok(run(&mut s, Op::MemAddressReserve, &[8 * g, 0, 0]))[0];
    ok(run(&mut s, Op::MemMap, &[va, 2 * g, 0, h1]));
    // h2 mapped twice, the second time without access.
    ok(run(&mut s, Op::MemMap, &[va + 2 * g, g, 0, h2]));
    ok(run(&mut s, Op::MemMap, &[va + 4 * g, g, 0, h2]));
    set_access(&mut a, &mut s, va, 2 * g, &[(0, 3), (1, 1)]);
    set_access(&mut a, &mut s, va + 2 * g, g, &[(0, 3)]);
    let pattern = |seed: u8| -> Vec<u8> { (0..64u8).map(|i| i ^ seed).collect() };
    ok(htod(&mut a, &mut s, va + g - 32, &pattern(1), &[64]));
    ok(htod(&mut a, &mut s, va + 2 * g + 8, &pattern(2), &[64]));
    // A pointer to mapped memory stored in ordinary device memory.
    let slot = malloc(&mut s, 8);
    ok(htod(&mut a, &mut s, slot, &va.to_le_bytes(), &[8]));
    // h1 retained once (two references); h2 released (its mappings keep it).
    assert_eq!(ok(run(&mut s, Op::MemRetainHandle, &[va + 5]))[0], h1);
    ok(run(&mut s, Op::MemRelease, &[h2]));
    let saved = s.capture().unwrap();
    assert_eq!(
        (
            saved.vmm_allocations.len(),
            saved.vmm_reservations.len(),
            saved.vmm_mappings.len()
        ),
        (3, 1, 3)
    );
    let bytes = saved.encode();
    assert_eq!(SavedState::decode(&bytes).unwrap(), saved);
    drop(s);

    let mut b = Rig::new(2);
    let mut r = GpuState::restore(&b.host, 3, &bytes).unwrap();
    let (st, data) = dtoh(&mut b, &mut r, va + g - 32, 64, &[64]);
    ok(st);
    assert_eq!(data, pattern(1));
    let (st, data) = dtoh(&mut b, &mut r, va + 2 * g + 8, 64, &[64]);
    ok(st);
    assert_eq!(data, pattern(2));
    // Without access, still not memory copies may touch.
    let (st, _) = dtoh(&mut b, &mut r, va + 4 * g + 8, 64, &[64]);
    assert_eq!(st.status, status::INVALID_VALUE);
    let (st, data) = dtoh(&mut b, &mut r, slot, 8, &[8]);
    ok(st);
    assert_eq!(data, va.to_le_bytes());
    assert_eq!(ok(run(&mut r, Op::MemGetAccess, &[va, 1]))[0], 1);
    assert_eq!(ok(run(&mut r, Op::MemGetAccess, &[va + 4 * g, 0]))[0], 0);
    assert_eq!(
        ok(run(&mut r, Op::MemMappingRange, &[va + 2 * g + 5]))[..2],
        [va + 2 * g, g]
    );
    assert_eq!(
        ok(run(&mut r, Op::MemHandleProperties, &[h3]))[..4],
        [0, 0, 0, 0]
    );
    // h1 holds its two references, h2 none: retained from a mapping, a new handle.
    ok(run(&mut r, Op::MemRelease, &[h1]));
    ok(run(&mut r, Op::MemRelease, &[h1]));
    assert_eq!(
        run(&mut r, Op::MemRelease, &[h1]).status,
        status::INVALID_VALUE
    );
    let h2b = ok(run(&mut r, Op::MemRetainHandle, &[va + 4 * g]))[0];
    assert!(h2b != h2 && h2b > h3);
    assert_eq!(
        ok(run(&mut r, Op::MemHandleProperties, &[h2b]))[1],
        qcuda_proto::VMM_HANDLE_POSIX_FD
    );
    check(&mut b, &mut r, &p);
    drop(r);
    assert_eq!(b.fake.vmm_ranges(), (0, 0));
    assert_eq!(b.fake.vmm_allocations(), 0);

    // The program's reservation cannot be placed at its address: refused, nothing left.
    let c = Rig::new(2);
    let taken = c
        .fake
        .mem_address_reserve(2 << 20, 0, va + (2 << 20))
        .unwrap();
    assert_eq!(taken, va + (2 << 20));
    let before = c.fake.vmm_ranges();
    match GpuState::restore(&c.host, 3, &bytes) {
        Err(CheckpointError::Mismatch(m)) => assert!(m.contains("placed at"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.fake.vmm_ranges(), before);
    // Hostile records: a mapping past its allocation, of no allocation, outside any
    // reservation; contents of the wrong length; a handle taken twice.
    let d = Rig::new(2);
    let mut bad = Vec::new();
    let mut x = saved.clone();
    x.vmm_mappings[0].offset = 2 * g;
    bad.push(x);
    let mut x = saved.clone();
    x.vmm_mappings[0].allocation = 99;
    bad.push(x);
    let mut x = saved.clone();
    x.vmm_mappings[0].va = va + 64 * g;
    bad.push(x);
    let mut x = saved.clone();
    x.vmm_allocations[0].contents.pop();
    bad.push(x);
    let mut x = saved.clone();
    x.vmm_allocations[2].handle = x.vmm_allocations[0].handle;
    bad.push(x);
    for x in bad {
        assert!(matches!(
            GpuState::restore(&d.host, 3, &x.encode()),
            Err(CheckpointError::Mismatch(_))
        ));
        assert_eq!(d.fake.live_contexts(), 0);
        assert_eq!(d.fake.vmm_ranges(), (0, 0));
        assert_eq!(d.fake.vmm_allocations(), 0);
    }
}

/// A rig whose host has the default staging halves (2 MiB), so checkpoint copies go through
/// the pinned staging buffer.
fn staged_rig(gpus: i32) -> Rig {
    let mut rig = Rig::new(gpus);
    let tuning = Tuning {
        max_registered_ram: 0,
        ..Tuning::default()
    };
    rig.host = Arc::new(CudaHost::from_driver(rig.fake.clone(), 13000, None, tuning).unwrap());
    rig
}

#[test]
fn checkpoint_copies_go_through_the_pinned_staging_buffer() {
    let mut a = staged_rig(1);
    let mut s = GpuState::open(&a.host, 3);
    let p = build(&mut a, &mut s);
    let (events, dtoh) = (a.fake.calls("event_record"), a.fake.calls("memcpy_dtoh"));
    let bytes = s.save().unwrap();
    // Every chunk is marked with its half's event; the 3 MiB node takes two chunks of the
    // 2 MiB halves, so there are more chunks than saved allocations and globals.
    let saved = SavedState::decode(&bytes).unwrap();
    let copies = saved.allocations.len() + saved.globals.len();
    assert_eq!(
        a.fake.calls("event_record") - events,
        a.fake.calls("memcpy_dtoh") - dtoh
    );
    assert!(a.fake.calls("memcpy_dtoh") - dtoh > copies);
    assert!(a.fake.calls("mem_alloc_host") > 0);
    drop(s);
    let mut b = staged_rig(1);
    let mut r = GpuState::restore(&b.host, 3, &bytes).unwrap();
    check(&mut b, &mut r, &p);
    assert!(b.fake.calls("mem_alloc_host") > 0);
    r.pause().unwrap();
    r.resume().unwrap();
    check(&mut b, &mut r, &p);
}

#[test]
fn a_state_carried_in_a_migration_stream_is_restored_on_the_destination() {
    use crate::{
        session::migration::{read_copied, write_stream, SavedGpu, SessionState},
        worker::StateFile,
    };
    let mut a = Rig::new(1);
    let mut s = GpuState::open(&a.host, 3);
    let p = build(&mut a, &mut s);
    let sessions = [
        SessionState {
            id: 3,
            pid: 77,
            gpu: SavedGpu::State(StateFile::from_bytes(&s.save().unwrap()).unwrap()),
        },
        SessionState {
            id: 4,
            pid: 78,
            gpu: SavedGpu::None,
        },
    ];
    // The source goes on running: a migration that fails leaves it as it was.
    check(&mut a, &mut s, &p);
    let mut stream = Vec::new();
    write_stream(&mut stream, &sessions).unwrap();
    drop(s);

    // The destination: another daemon's worker, fresh, restored from what the stream carried.
    let got = read_copied(&mut stream.as_slice()).unwrap();
    assert_eq!(got, sessions);
    let SavedGpu::State(file) = &got[0].gpu else {
        panic!("no state")
    };
    let bytes = &file.to_vec().unwrap();
    let mut b = Rig::new(1);
    let mut r = GpuState::open(&b.host, 3);
    r.restore_saved(bytes).unwrap();
    check(&mut b, &mut r, &p);
    // A state restored under another session id is refused, and so is one into a used state.
    let mut other = GpuState::open(&b.host, 5);
    assert!(matches!(
        other.restore_saved(bytes),
        Err(CheckpointError::Mismatch(_))
    ));
    r.restore_saved(bytes).unwrap_err();
}

#[test]
fn a_state_with_guest_memory_mapped_for_the_gpu_is_saved_with_its_mappings() {
    assert!(crate::cuda::reserve_window());
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let p = build(&mut rig, &mut s);
    let guest = HOST_WINDOW_BASE + 0x7500_0000;
    let t = rig.buf(
        &HostRun {
            gpa: 0x30_0000,
            len: 0x1000,
        }
        .encode(),
    );
    let r = s.execute(&req(Op::HostMap, 0, &[guest, 0x1000, 0], vec![t], vec![]));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, guest));
    // Pinned, registered and managed memory are saved by description (tests/
    // saved_host_memory.rs restores them); the program goes on.
    let saved = s.capture().unwrap();
    assert_eq!(saved.host_mappings.len(), 1);
    assert_eq!(
        (
            saved.host_mappings[0].guest,
            saved.host_mappings[0].dev_addr
        ),
        (guest, guest)
    );
    assert_eq!(saved.host_mappings[0].runs, [(0x30_0000, 0x1000)]);
    check(&mut rig, &mut s, &p);
    ok(run(&mut s, Op::HostUnmap, &[guest]));
    assert!(s.capture().unwrap().host_mappings.is_empty());
}

mod graphs {
    //! Graphs and executable graphs in a saved state.

    use qcuda_proto::graph::{self as g, ConditionalNode, KernelNode, MemcpyNode, MemsetNode};

    use super::*;

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn add(rig: &mut Rig, s: &mut GpuState, graph: u64, ty: u32, deps: &[u64], p: &[u8]) -> u64 {
        let d = rig.buf(&u64s(deps));
        let p = rig.buf(p);
        ok(s.execute(&req(
            Op::GraphAddNode,
            0,
            &[graph, u64::from(ty)],
            vec![d, p],
            vec![],
        )))[0]
    }

    /// vadd(a, b, c, n) as a kernel node.
    fn vadd(func: u64, abc: [u64; 3], n: i32) -> Vec<u8> {
        let mut params = u64s(&abc);
        params.extend_from_slice(&n.to_le_bytes());
        let mut b = vec![0u8; g::KERNEL_NODE_HEADER + params.len()];
        KernelNode {
            function: func,
            grid: [1, 1, 1],
            block: [64, 1, 1],
            shared_mem: 0,
            params: &params,
        }
        .encode(&mut b);
        b
    }

    fn memset(dst: u64, value: u32) -> MemsetNode {
        MemsetNode {
            dst,
            pitch: 0,
            value,
            element_size: 4,
            width: N as u64,
            height: 1,
        }
    }

    fn list(rig: &mut Rig, s: &mut GpuState, op: Op, args: &[u64]) -> Vec<u64> {
        let out = rig.out(8 * 64);
        let n = ok(s.execute(&req(op, 0, args, vec![], vec![out.clone()])))[0];
        out.to_vec().unwrap()[..8 * usize::try_from(n).unwrap()]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn params_of(rig: &mut Rig, s: &mut GpuState, op: Op, node: u64) -> Vec<u8> {
        let out = rig.out(256);
        ok(s.execute(&req(op, 0, &[node], vec![], vec![out.clone()])));
        out.to_vec().unwrap()
    }

    /// The program's graphs: `graph` with a node of every kind and two conditional nodes,
    /// `g2` (kernel, memset, child graph) and its executable graph, changed after it was
    /// instantiated in every way a copy can follow.
    struct Graphs {
        graph: u64,
        nodes: Vec<u64>,
        child_graph: u64,
        bodies: Vec<u64>,
        g2: u64,
        k2: u64,
        ms2: u64,
        exec: u64,
        exec3: u64,
    }

    fn build_graphs(rig: &mut Rig, s: &mut GpuState, p: &Program) -> Graphs {
        let graph = ok(run(s, Op::GraphCreate, &[]))[0];
        let k = add(rig, s, graph, g::NODE_KERNEL, &[], &vadd(p.func, p.abc, 16));
        let ms = add(
            rig,
            s,
            graph,
            g::NODE_MEMSET,
            &[k],
            &memset(p.abc[2], 9).encode(),
        );
        let copy = MemcpyNode {
            dst: p.abc[1],
            src: p.abc[0],
            width: 64,
            height: 1,
            depth: 1,
            ..Default::default()
        };
        let mc = add(rig, s, graph, g::NODE_MEMCPY, &[ms], &copy.encode());
        let ev = p.event.to_le_bytes();
        let rec = add(rig, s, graph, g::NODE_EVENT_RECORD, &[mc], &ev);
        let wait = add(rig, s, graph, g::NODE_WAIT_EVENT, &[], &ev);
        let inner = ok(run(s, Op::GraphCreate, &[]))[0];
        add(rig, s, inner, g::NODE_EMPTY, &[], &[]);
        let child = add(
            rig,
            s,
            graph,
            g::NODE_GRAPH,
            &[rec, wait],
            &inner.to_le_bytes(),
        );
        ok(run(s, Op::GraphDestroy, &[inner]));
        let child_graph = ok(run(s, Op::GraphQuery, &[child, 1]))[0];
        let h_if = ok(run(s, Op::GraphConditionalHandleCreate, &[graph, 1, 1]))[0];
        let h_while = ok(run(s, Op::GraphConditionalHandleCreate, &[graph, 0, 0]))[0];
        let cond = |handle, kind| ConditionalNode {
            handle,
            kind,
            size: 1,
        };
        let c_if = add(
            rig,
            s,
            graph,
            g::NODE_CONDITIONAL,
            &[child],
            &cond(h_if, g::COND_IF).encode(),
        );
        let c_while = add(
            rig,
            s,
            graph,
            g::NODE_CONDITIONAL,
            &[],
            &cond(h_while, g::COND_WHILE).encode(),
        );
        let body_if = ok(run(s, Op::GraphQuery, &[c_if, 4, 0]))[0];
        let body_while = ok(run(s, Op::GraphQuery, &[c_while, 4, 0]))[0];
        add(
            rig,
            s,
            body_if,
            g::NODE_KERNEL,
            &[],
            &vadd(p.func, p.abc, 8),
        );
        let e = add(rig, s, body_while, g::NODE_EMPTY, &[], &[]);
        add(
            rig,
            s,
            body_while,
            g::NODE_MEMSET,
            &[e],
            &memset(p.abc[0], 1).encode(),
        );

        let g2 = ok(run(s, Op::GraphCreate, &[]))[0];
        let k2 = add(rig, s, g2, g::NODE_KERNEL, &[], &vadd(p.func, p.abc, 32));
        let ms2 = add(
            rig,
            s,
            g2,
            g::NODE_MEMSET,
            &[k2],
            &memset(p.abc[2], 3).encode(),
        );
        let inner = ok(run(s, Op::GraphCreate, &[]))[0];
        add(
            rig,
            s,
            inner,
            g::NODE_MEMSET,
            &[],
            &memset(p.abc[1], 4).encode(),
        );
        // A third graph holds a child graph; its executable graph's copy holds one too.
        let g3 = ok(run(s, Op::GraphCreate, &[]))[0];
        add(rig, s, g3, g::NODE_GRAPH, &[], &inner.to_le_bytes());
        ok(run(s, Op::GraphDestroy, &[inner]));
        let exec3 = ok(run(s, Op::GraphInstantiate, &[g3, 0, 0]))[0];
        let exec = ok(run(s, Op::GraphInstantiate, &[g2, 0, 0]))[0];
        // Changed after instantiation: the graph's memset edited and the executable graph
        // updated from it; then its kernel's arguments set in the executable graph alone;
        // its memset disabled; the graph edited again (the executable graph keeps its own).
        let set = rig.buf(&memset(p.abc[2], 5).encode());
        ok(s.execute(&req(
            Op::GraphNodeSetParams,
            0,
            &[ms2, u64::from(g::NODE_MEMSET)],
            vec![set],
            vec![],
        )));
        let r = ok(run(s, Op::GraphExecUpdate, &[exec, g2]));
        assert_eq!(r[0], 0);
        let kp = rig.buf(&vadd(p.func, p.abc, 12));
        ok(s.execute(&req(
            Op::GraphExecNodeSetParams,
            0,
            &[exec, k2, u64::from(g::NODE_KERNEL)],
            vec![kp],
            vec![],
        )));
        ok(run(s, Op::GraphNodeEnabled, &[exec, ms2, 1, 0]));
        let set = rig.buf(&memset(p.abc[2], 6).encode());
        ok(s.execute(&req(
            Op::GraphNodeSetParams,
            0,
            &[ms2, u64::from(g::NODE_MEMSET)],
            vec![set],
            vec![],
        )));
        Graphs {
            graph,
            nodes: vec![k, ms, mc, rec, wait, child, c_if, c_while],
            child_graph,
            bodies: vec![body_if, body_while],
            g2,
            k2,
            ms2,
            exec,
            exec3,
        }
    }

    /// Everything the guest can ask of the graphs, as it answers.
    fn answers(rig: &mut Rig, s: &mut GpuState, p: &Program, gr: &Graphs) -> Vec<Vec<u8>> {
        let mut a = Vec::new();
        a.push(u64s(&list(rig, s, Op::GraphGetNodes, &[gr.graph, 0])));
        a.push(u64s(&list(rig, s, Op::GraphGetEdges, &[gr.graph])));
        for &n in &gr.nodes {
            a.push(u64s(&[ok(run(s, Op::GraphNodeQuery, &[n, 0]))[0]]));
            a.push(u64s(&list(rig, s, Op::GraphNodeQuery, &[n, 1])));
        }
        a.push(params_of(rig, s, Op::GraphKernelNodeGetParams, gr.nodes[0]));
        a.push(params_of(rig, s, Op::GraphNodeGetParams, gr.nodes[1]));
        a.push(params_of(rig, s, Op::GraphNodeGetParams, gr.nodes[2]));
        a.push(u64s(&[
            ok(run(s, Op::GraphQuery, &[gr.nodes[3], 0]))[0],
            p.event,
        ]));
        a.push(u64s(&[
            ok(run(s, Op::GraphQuery, &[gr.nodes[5], 1]))[0],
            gr.child_graph,
        ]));
        a.push(u64s(&list(rig, s, Op::GraphGetNodes, &[gr.child_graph, 0])));
        for (i, &c) in gr.nodes[6..].iter().enumerate() {
            a.push(u64s(&[
                ok(run(s, Op::GraphQuery, &[c, 4, 0]))[0],
                gr.bodies[i],
            ]));
        }
        for &b in &gr.bodies {
            let nodes = list(rig, s, Op::GraphGetNodes, &[b, 0]);
            a.push(u64s(&nodes));
            a.push(u64s(&list(rig, s, Op::GraphGetEdges, &[b])));
        }
        a.push(params_of(rig, s, Op::GraphKernelNodeGetParams, gr.k2));
        a.push(u64s(&[ok(run(s, Op::GraphQuery, &[gr.exec, 2]))[0]]));
        a
    }

    /// What a launch of the executable graph runs (the fake driver's record of it).
    fn launch(rig: &Rig, s: &mut GpuState, exec: u64, stream: u64) -> Vec<String> {
        ok(run(s, Op::GraphLaunch, &[exec, stream]));
        rig.fake.graph_runs().last().cloned().unwrap()
    }

    #[test]
    fn graphs_and_executable_graphs_come_back_under_their_handles_as_they_run() {
        let mut a = Rig::new(1);
        let mut s = GpuState::open(&a.host, 3);
        let p = build(&mut a, &mut s);
        let gr = build_graphs(&mut a, &mut s, &p);
        let ran = launch(&a, &mut s, gr.exec, 0);
        let ran3 = launch(&a, &mut s, gr.exec3, 0);
        assert_eq!(ran3.len(), 1);
        // The executable graph runs its own parameters, not its graph's.
        let fresh = ok(run(&mut s, Op::GraphInstantiate, &[gr.g2, 0, 0]))[0];
        let graph_runs = launch(&a, &mut s, fresh, 0);
        assert_ne!(ran, graph_runs);
        ok(run(&mut s, Op::GraphExecDestroy, &[fresh]));
        assert!(ran[0].contains("[12, 0, 0, 0]"), "{ran:?}");
        assert!(
            ran[1].contains("value: 5") && ran[1].contains("enabled false"),
            "{ran:?}"
        );
        let before = answers(&mut a, &mut s, &p, &gr);

        let saved = s.capture().unwrap();
        // The program's graphs (and what their nodes hold) under their handles, and the
        // executable graph's copy with what it holds.
        // Three graphs of the program; four held by their nodes (a child graph, two bodies,
        // a child graph); the executable graphs' two copies and the child graph one holds.
        assert_eq!(saved.graphs.len(), 3 + 4 + 3);
        assert_eq!(saved.execs.len(), 2);
        assert_eq!(saved.conditionals.len(), 2);
        let bytes = saved.encode();
        assert_eq!(SavedState::decode(&bytes).unwrap(), saved);
        // Still running, unchanged.
        assert_eq!(launch(&a, &mut s, gr.exec, 0), ran);
        assert_eq!(answers(&mut a, &mut s, &p, &gr), before);
        drop(s);

        let mut b = Rig::new(1);
        let mut r = GpuState::restore(&b.host, 3, &bytes).unwrap();
        check(&mut b, &mut r, &p);
        assert_eq!(answers(&mut b, &mut r, &p, &gr), before);
        assert_eq!(launch(&b, &mut r, gr.exec, p.stream), ran);
        assert_eq!(launch(&b, &mut r, gr.exec3, p.stream), ran3);
        // The graph is its own again: instantiated afresh it runs what it holds now.
        let fresh = ok(run(&mut r, Op::GraphInstantiate, &[gr.g2, 0, 0]))[0];
        assert_eq!(launch(&b, &mut r, fresh, 0), graph_runs);
        // The executable graph's nodes are still named by its graph's node handles.
        let kp = b.buf(&vadd(p.func, p.abc, 20));
        ok(r.execute(&req(
            Op::GraphExecNodeSetParams,
            0,
            &[gr.exec, gr.k2, u64::from(g::NODE_KERNEL)],
            vec![kp],
            vec![],
        )));
        // Its memset is still disabled in it.
        assert_eq!(
            ok(run(&mut r, Op::GraphNodeEnabled, &[gr.exec, gr.ms2, 0]))[0],
            0
        );
        let now = launch(&b, &mut r, gr.exec, 0);
        assert!(now[0].contains("[20, 0, 0, 0]"), "{now:?}");
        assert_eq!(now[1..], ran[1..]);
        // And saved again, it comes back again.
        let again = r.capture().unwrap();
        assert_eq!(again.execs[..2], saved.execs[..]);
        drop(r);
        assert_eq!(b.fake.live_contexts(), 0);
    }

    #[test]
    fn graphs_a_restore_cannot_make_again_are_refused_by_name() {
        let mut rig = Rig::new(1);
        let mut s = rig.session();
        let p = build(&mut rig, &mut s);
        let refused = |s: &mut GpuState, what: &str| match s.save() {
            Err(CheckpointError::Unsupported(why)) => assert!(why.contains(what), "{why}"),
            other => panic!("not refused: {other:?}"),
        };
        // Executable graphs of graphs with conditional nodes (their handles are the graph's).
        let graph = ok(run(&mut s, Op::GraphCreate, &[]))[0];
        let h = ok(run(
            &mut s,
            Op::GraphConditionalHandleCreate,
            &[graph, 1, 1],
        ))[0];
        let c = ConditionalNode {
            handle: h,
            kind: g::COND_IF,
            size: 1,
        };
        add(
            &mut rig,
            &mut s,
            graph,
            g::NODE_CONDITIONAL,
            &[],
            &c.encode(),
        );
        let exec = ok(run(&mut s, Op::GraphInstantiate, &[graph, 0, 0]))[0];
        refused(&mut s, "conditional nodes");
        ok(run(&mut s, Op::GraphExecDestroy, &[exec]));
        s.save().unwrap();
        ok(run(&mut s, Op::GraphDestroy, &[graph]));
        // An executable graph updated from another graph: the driver pairs the nodes.
        let g1 = ok(run(&mut s, Op::GraphCreate, &[]))[0];
        add(
            &mut rig,
            &mut s,
            g1,
            g::NODE_MEMSET,
            &[],
            &memset(p.abc[0], 1).encode(),
        );
        let g2 = ok(run(&mut s, Op::GraphCreate, &[]))[0];
        add(
            &mut rig,
            &mut s,
            g2,
            g::NODE_MEMSET,
            &[],
            &memset(p.abc[0], 2).encode(),
        );
        let exec = ok(run(&mut s, Op::GraphInstantiate, &[g1, 0, 0]))[0];
        s.save().unwrap();
        assert_eq!(ok(run(&mut s, Op::GraphExecUpdate, &[exec, g2]))[0], 0);
        refused(&mut s, "updated from another graph");
        ok(run(&mut s, Op::GraphExecDestroy, &[exec]));
        // Device-launchable executable graphs: kernels hold their driver handle.
        let exec = ok(run(&mut s, Op::GraphInstantiate, &[g1, 4, 0]))[0];
        refused(&mut s, "device-launchable");
        ok(run(&mut s, Op::GraphExecDestroy, &[exec]));
        // A memset of memory freed since (CUDA lets the graph keep it until it runs).
        let gone = malloc(&mut s, 4 * N as u64);
        let g4 = ok(run(&mut s, Op::GraphCreate, &[]))[0];
        add(
            &mut rig,
            &mut s,
            g4,
            g::NODE_MEMSET,
            &[],
            &memset(gone, 1).encode(),
        );
        s.save().unwrap();
        ok(run(&mut s, Op::Free, &[gone]));
        refused(&mut s, "freed");
        ok(run(&mut s, Op::GraphDestroy, &[g4]));
        // Kernels captured from a stream with attributes may carry them as node attributes.
        ok(run(&mut s, Op::StreamBeginCapture, &[p.stream, 2]));
        let captured = ok(run(&mut s, Op::StreamEndCapture, &[p.stream]))[0];
        refused(&mut s, "attributes");
        ok(run(&mut s, Op::GraphDestroy, &[captured]));
        s.save().unwrap();
        check(&mut rig, &mut s, &p);
        // Graph memory nodes (the memory stays the program's, as CUDA allows, until the
        // context goes).
        let g1 = ok(run(&mut s, Op::GraphCreate, &[]))[0];
        add(
            &mut rig,
            &mut s,
            g1,
            g::NODE_MEM_ALLOC,
            &[],
            &256u64.to_le_bytes(),
        );
        refused(&mut s, "graph memory");
        ok(run(&mut s, Op::GraphDestroy, &[g1]));
        ok(run(&mut s, Op::GraphDestroy, &[g2]));
    }

    #[test]
    fn a_conditional_handle_that_comes_back_with_another_value_fails_the_restore() {
        let mut a = Rig::new(1);
        let mut s = GpuState::open(&a.host, 3);
        let p = build(&mut a, &mut s);
        build_graphs(&mut a, &mut s, &p);
        let mut saved = s.capture().unwrap();
        drop(s);
        // Kernels hold the value: as if the driver gave the first handle another one.
        let old = saved.conditionals[0].handle;
        let new = old ^ 0x100;
        saved.conditionals[0].handle = new;
        for gr in &mut saved.graphs {
            for n in &mut gr.nodes {
                if let crate::cuda::saved_state::SavedNodeKind::Conditional { handle, .. } =
                    &mut n.kind
                {
                    if *handle == old {
                        *handle = new;
                    }
                }
            }
        }
        let b = Rig::new(1);
        match GpuState::restore(&b.host, 3, &saved.encode()) {
            Err(CheckpointError::Mismatch(why)) => assert!(why.contains("came back as"), "{why}"),
            other => panic!("restored: {:?}", other.map(|_| ())),
        }
        assert_eq!(b.fake.live_contexts(), 0);
    }
}

/// What a program holds of arrays and objects, and the bytes it put in them.
struct Textures {
    /// 8 x 4 floats, surface load/store: handle, contents.
    flat: (u64, Vec<u8>),
    /// 4 x 4 x 3 layers of 2 x u8: handle, contents.
    layered: (u64, Vec<u8>),
    /// 16 x 16 of 4 x u8, 3 levels, and handles of levels 0 and 2 with their contents.
    mipmapped: u64,
    levels: [(u64, Vec<u8>); 2],
    /// Pitched memory (pointer, pitch) of 16 x 4 floats under a texture.
    pitched: (u64, u64, Vec<u8>),
    /// Texture over `flat`, texture over `pitched`, surface over `flat`, texture over
    /// `mipmapped`.
    objects: [u64; 4],
}

fn create_textures(rig: &mut Rig, s: &mut GpuState) -> Textures {
    use super::arrays::{array, copy, put, tex_words, wire};
    let filled = |rig: &mut Rig, s: &mut GpuState, handle: u64, extent: [u64; 3], seed: usize| {
        let n = usize::try_from(extent.iter().product::<u64>()).unwrap();
        let data: Vec<u8> = (0..n)
            .map(|i: usize| (i * 7 + seed).to_le_bytes()[0])
            .collect();
        assert_eq!(
            put(rig, s, copy(wire(), array(handle), extent), &data),
            status::SUCCESS
        );
        (handle, data)
    };
    let flat = ok(run(s, Op::ArrayCreate, &[8, 4, 0, 0x20, 1, 2, 0]))[0];
    let flat = filled(rig, s, flat, [32, 4, 1], 1);
    let layered = ok(run(s, Op::ArrayCreate, &[4, 4, 3, 0x01, 2, 1, 0]))[0];
    let layered = filled(rig, s, layered, [8, 4, 3], 2);
    let mipmapped = ok(run(s, Op::ArrayCreate, &[16, 16, 0, 0x01, 4, 0, 3]))[0];
    let l0 = ok(run(s, Op::MipmappedArrayLevel, &[mipmapped, 0]))[0];
    let l2 = ok(run(s, Op::MipmappedArrayLevel, &[mipmapped, 2]))[0];
    let levels = [
        filled(rig, s, l0, [64, 16, 1], 3),
        filled(rig, s, l2, [16, 4, 1], 4),
    ];
    let r = ok(run(s, Op::MallocPitch, &[64, 4]));
    let (ptr, pitch) = (r[0], r[1]);
    let bytes: Vec<u8> = (0..pitch * 4).map(|i| (i * 3).to_le_bytes()[0]).collect();
    ok(htod(rig, s, ptr, &bytes, &[100]));
    let tex = |rig: &mut Rig, s: &mut GpuState, words: &[(usize, u64)]| {
        let t = rig.buf(&tex_words(words));
        ok(s.execute(&req(Op::TexObjectCreate, 0, &[], vec![t], vec![])))[0]
    };
    // A value freed before the capture: the restore has to step over it.
    let gone = tex(rig, s, &[(tex::RES_TYPE, 0), (tex::RES_HANDLE, flat.0)]);
    let over_flat = tex(
        rig,
        s,
        &[
            (tex::RES_TYPE, 0),
            (tex::RES_HANDLE, flat.0),
            (tex::ADDRESS_MODE, 1),
            (tex::FILTER_MODE, 1),
            (tex::FLAGS, 2),
            (tex::BORDER_COLOR, u64::from(0.25f32.to_bits())),
        ],
    );
    let over_pitched = tex(
        rig,
        s,
        &[
            (tex::RES_TYPE, 3),
            (tex::RES_HANDLE, ptr),
            (tex::RES_FORMAT, 0x20),
            (tex::RES_CHANNELS, 1),
            (tex::RES_WIDTH, 16),
            (tex::RES_HEIGHT, 4),
            (tex::RES_PITCH, pitch),
        ],
    );
    let surface = ok(run(s, Op::SurfObjectCreate, &[flat.0]))[0];
    let over_mipmapped = tex(
        rig,
        s,
        &[
            (tex::RES_TYPE, 1),
            (tex::RES_HANDLE, mipmapped),
            (tex::MIPMAP_FILTER_MODE, 1),
            (tex::MAX_MIPMAP_LEVEL_CLAMP, u64::from(2.0f32.to_bits())),
            (tex::VIEW_PRESENT, 1),
            (tex::VIEW_FORMAT, 3),
            (tex::VIEW_EXTENT, 16),
            (tex::VIEW_EXTENT + 1, 16),
            (tex::VIEW_LEVELS + 1, 2),
        ],
    );
    ok(run(s, Op::TexObjectDestroy, &[gone]));
    Textures {
        flat,
        layered,
        mipmapped,
        levels,
        pitched: (ptr, pitch, bytes),
        objects: [over_flat, over_pitched, surface, over_mipmapped],
    }
}

/// Checks every array's contents through a copy, and what every object views in the fake.
fn check_textures(rig: &mut Rig, s: &mut GpuState, t: &Textures) {
    use super::arrays::{array, copy, get, wire};
    for ((handle, data), extent) in [
        (&t.flat, [32, 4, 1]),
        (&t.layered, [8, 4, 3]),
        (&t.levels[0], [64, 16, 1]),
        (&t.levels[1], [16, 4, 1]),
    ] {
        let (st, back) = get(rig, s, copy(array(*handle), wire(), extent));
        assert_eq!((st, &back), (status::SUCCESS, data), "array {handle}");
    }
    assert_eq!(
        ok(run(s, Op::ArrayInfo, &[t.flat.0]))[..6],
        [8, 4, 0, 0x20, 1, 2]
    );
    assert_eq!(
        ok(run(s, Op::ArrayInfo, &[t.layered.0]))[..6],
        [4, 4, 3, 1, 2, 1]
    );
    assert_eq!(ok(run(s, Op::ArrayInfo, &[t.levels[1].0]))[..2], [4, 4]);
    let [over_flat, over_pitched, surface, over_mipmapped] = t.objects;
    assert_eq!(rig.fake.object_reads(over_flat).as_ref(), Some(&t.flat.1));
    assert_eq!(rig.fake.object_reads(surface).as_ref(), Some(&t.flat.1));
    assert_eq!(
        rig.fake.object_reads(over_mipmapped).as_ref(),
        Some(&t.levels[0].1)
    );
    assert_eq!(
        rig.fake.object_reads(over_pitched).as_ref(),
        Some(&t.pitched.2)
    );
}

#[test]
fn arrays_mipmaps_and_objects_come_back_under_their_handles_and_values() {
    let mut a = Rig::new(1);
    let mut s = GpuState::open(&a.host, 3);
    let p = build(&mut a, &mut s);
    let t = create_textures(&mut a, &mut s);
    check_textures(&mut a, &mut s, &t);
    // The freed value is below the live ones: the restore must step over it.
    assert_eq!(a.fake.object_reads(1), None);
    assert!(t.objects.iter().all(|&v| v > 1));
    let saved = s.capture().unwrap();
    assert_eq!(
        (
            saved.arrays.len(),
            saved.mipmapped.len(),
            saved.levels.len(),
            saved.objects.len()
        ),
        (2, 1, 2, 4)
    );
    // In creation order, each with its own descriptor.
    let values: Vec<u64> = saved.objects.iter().map(|o| o.value).collect();
    assert_eq!(values, t.objects);
    assert_eq!(saved.mipmapped[0].levels.len(), 3);
    let bytes = saved.encode();
    assert_eq!(SavedState::decode(&bytes).unwrap(), saved);
    check_textures(&mut a, &mut s, &t);
    drop(s);

    let mut b = Rig::new(1);
    let mut r = GpuState::restore(&b.host, 3, &bytes).unwrap();
    check(&mut b, &mut r, &p);
    check_textures(&mut b, &mut r, &t);
    // The fillers that took the freed value are gone again.
    assert_eq!(b.fake.object_reads(1), None);
    assert_eq!(b.fake.array_objects().2, 4);
    // The level without a handle came back too (zeros), and gets a new handle.
    let l1 = ok(run(&mut r, Op::MipmappedArrayLevel, &[t.mipmapped, 1]))[0];
    assert!(l1 > saved.last_handle);
    let (st, back) = super::arrays::get(
        &mut b,
        &mut r,
        super::arrays::copy(super::arrays::array(l1), super::arrays::wire(), [32, 8, 1]),
    );
    assert_eq!((st, back), (status::SUCCESS, vec![0; 256]));
    assert_eq!(
        ok(run(&mut r, Op::MipmappedArrayLevel, &[t.mipmapped, 2]))[0],
        t.levels[1].0
    );
    // Saved again just the same (and the new level handle).
    let again = r.capture().unwrap();
    assert_eq!(again.arrays, saved.arrays);
    assert_eq!(again.mipmapped, saved.mipmapped);
    assert_eq!(again.objects, saved.objects);
    assert_eq!(again.levels.len(), 3);
    // The objects are the session's: destroyed by their values; a level goes only with its
    // mipmapped array.
    for (i, &o) in t.objects.iter().enumerate() {
        let op = if i == 2 {
            Op::SurfObjectDestroy
        } else {
            Op::TexObjectDestroy
        };
        ok(run(&mut r, op, &[o]));
    }
    assert_eq!(
        run(&mut r, Op::ArrayDestroy, &[t.levels[0].0, 0]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut r, Op::ArrayDestroy, &[t.mipmapped, 1]));
    ok(run(&mut r, Op::ArrayDestroy, &[t.flat.0, 0]));
    assert_eq!(b.fake.array_objects(), (1, 0, 0));
    drop(r);
    assert_eq!(b.fake.live_contexts(), 0);
}

#[test]
fn a_restore_the_driver_would_give_other_object_values_fails_and_leaves_nothing() {
    let mut a = Rig::new(1);
    let mut s = GpuState::open(&a.host, 3);
    let p = build(&mut a, &mut s);
    let t = create_textures(&mut a, &mut s);
    let bytes = s.save().unwrap();
    drop(s);
    // A driver that numbers objects from 100: the first object would get another value.
    let b = Rig::new(1);
    b.fake.set_object_base(100);
    let mut r = GpuState::open(&b.host, 3);
    let err = r.restore_saved(&bytes).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Mismatch(m) if m.contains("the driver gives 0x64")),
        "{err}"
    );
    // Everything of arrays and objects it made is gone already (fillers and all), the rest
    // goes with the state.
    assert_eq!(b.fake.array_objects(), (0, 0, 0));
    drop(r);
    assert_eq!(b.fake.live_contexts(), 0);
    assert_eq!(b.fake.vmm_ranges(), (0, 0));
    // A driver that numbers them as the saved state's did restores it.
    let mut c = Rig::new(1);
    let mut r = GpuState::restore(&c.host, 3, &bytes).unwrap();
    check(&mut c, &mut r, &p);
    check_textures(&mut c, &mut r, &t);
}

#[test]
fn objects_over_freed_memory_are_refused_and_the_program_goes_on() {
    use super::arrays::tex_words;
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let p = build(&mut rig, &mut s);
    let q = malloc(&mut s, 256);
    let w = rig.buf(&tex_words(&[
        (tex::RES_TYPE, 2),
        (tex::RES_HANDLE, q),
        (tex::RES_FORMAT, 0x20),
        (tex::RES_CHANNELS, 1),
        (tex::RES_WIDTH, 256),
    ]));
    let obj = ok(s.execute(&req(Op::TexObjectCreate, 0, &[], vec![w], vec![])))[0];
    s.capture().unwrap();
    ok(run(&mut s, Op::Free, &[q]));
    assert!(matches!(
        s.save(),
        Err(CheckpointError::Unsupported(what)) if what.contains("freed")
    ));
    check(&mut rig, &mut s, &p);
    ok(run(&mut s, Op::TexObjectDestroy, &[obj]));
    s.save().unwrap();
}

#[test]
fn hostile_array_and_object_records_are_refused_and_leave_nothing_behind() {
    use crate::cuda::saved_state::SavedResource;
    let mut a = Rig::new(1);
    let mut s = GpuState::open(&a.host, 3);
    build(&mut a, &mut s);
    create_textures(&mut a, &mut s);
    let saved = s.capture().unwrap();
    drop(s);
    let b = Rig::new(1);
    let refused = |bad: &SavedState, why: &str| {
        let mut r = GpuState::open(&b.host, 3);
        assert!(
            matches!(
                r.restore_saved(&bad.encode()),
                Err(CheckpointError::Mismatch(_))
            ),
            "{why}"
        );
        assert_eq!(b.fake.array_objects(), (0, 0, 0), "{why}");
        drop(r);
        assert_eq!(b.fake.live_contexts(), 0, "{why}");
    };
    // A texture over memory the state does not hold.
    let mut bad = saved.clone();
    let pitched = bad
        .objects
        .iter_mut()
        .find(|o| matches!(o.resource, SavedResource::Pitch2D { .. }))
        .unwrap();
    if let SavedResource::Pitch2D { ref mut ptr, .. } = pitched.resource {
        *ptr += 1 << 30;
    }
    refused(&bad, "a texture over memory of no allocation");
    // An array under a handle another object holds, or one never handed out.
    let mut bad = saved.clone();
    bad.arrays[1].handle = bad.modules[0].handle;
    refused(&bad, "an array under a module's handle");
    let mut bad = saved.clone();
    bad.mipmapped[0].handle = bad.last_handle + 1;
    for l in &mut bad.levels {
        l.mipmapped = bad.last_handle + 1;
    }
    for o in &mut bad.objects {
        if o.resource == SavedResource::Mipmapped(saved.mipmapped[0].handle) {
            o.resource = SavedResource::Mipmapped(bad.last_handle + 1);
        }
    }
    refused(&bad, "a handle the counter never gave");
    // Objects and arrays on a device the state does not have.
    let mut bad = saved.clone();
    bad.objects[3].dev = 5;
    refused(&bad, "an object on device 5");
    let mut bad = saved.clone();
    bad.arrays[0].dev = 1;
    refused(&bad, "an array on device 1 of 1");
    // Any single flipped byte of the array and object records: refused or restored, never a
    // panic, nothing left behind.
    let bytes = saved.encode();
    // They are encoded last: they start where a state without them ends.
    let records = SavedState {
        arrays: Vec::new(),
        mipmapped: Vec::new(),
        levels: Vec::new(),
        objects: Vec::new(),
        ..saved.clone()
    }
    .encode()
    .len();
    assert!(records < bytes.len());
    for i in (records..bytes.len()).step_by(7) {
        let mut b2 = bytes.clone();
        b2[i] ^= 0x5a;
        if let Ok(r) = GpuState::restore(&b.host, 3, &b2) {
            drop(r);
        }
        assert_eq!(b.fake.live_contexts(), 0);
        assert_eq!(b.fake.array_objects(), (0, 0, 0));
    }
}

/// The stop phase of a migration over the fake driver, phase by phase, as the daemons run it:
/// the source's worker saves its state into a memfd (capture: device memory copied out through
/// the staging buffers; encode: written into the file as it is encoded), the source's daemon
/// sends the file into a pipe (QEMU's) while the destination's daemon receives it into a new
/// file, and the destination's worker maps that file and restores from it. Prints each phase's
/// bytes, seconds and GiB/s (`cargo test -p vhost-cuda stop_phase -- --nocapture`); the working
/// set is `QCUDA_FAKE_WORKING_SET_MIB` MiB (64 by default, 1024 to measure), and every MiB of it
/// must come back with its own contents.
#[test]
fn the_stop_phase_moves_a_working_set_through_files_and_a_pipe_phase_by_phase() {
    use std::{io::Write as _, time::Instant};

    use crate::{
        session::migration::{read_copied, write_stream, SavedGpu, SessionState},
        worker::{widen_pipe, SealedMap, StateFile},
    };
    const MIB: u64 = 1 << 20;
    let mib: u64 = std::env::var("QCUDA_FAKE_WORKING_SET_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    // The daemon's staging halves (2 MiB), so device memory moves through pinned chunks.
    let mut a = Rig::with_staging(FakeDriver::new(1), 2 << 20);
    let mut s = GpuState::open(&a.host, 3);
    // The working set in 64 MiB allocations, each MiB marked with its own number.
    let chunk = 64.min(mib);
    let blocks: Vec<u64> = (0..mib / chunk)
        .map(|_| malloc(&mut s, chunk * MIB))
        .collect();
    let mut marks = Vec::new();
    for &b in &blocks {
        ok(run(&mut s, Op::Memset, &[b, 0x5a, chunk * MIB, 0]));
        for m in 0..chunk {
            let at = b + m * MIB;
            ok(htod(&mut a, &mut s, at, &at.to_le_bytes(), &[8]));
            marks.push(at);
        }
    }
    let figure = |name: &str, bytes: u64, started: Instant| {
        let secs = started.elapsed().as_secs_f64();
        #[expect(clippy::cast_precision_loss, reason = "a figure for people")]
        let gib = bytes as f64 / f64::from(1u32 << 30);
        eprintln!(
            "stop phase {name:<8} {bytes:>12} bytes {secs:>8.3} s {:>8.2} GiB/s",
            gib / secs.max(1e-9)
        );
    };

    let file = StateFile::create(c"test-saved-state").unwrap();
    let started = Instant::now();
    let figures = {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file.file());
        let f = s.save_into(&mut out).unwrap();
        out.flush().unwrap();
        f
    };
    eprintln!(
        "stop phase capture  {:>12} bytes {:>8.3} s (quiesce, record)",
        figures.device_bytes,
        figures.capture.as_secs_f64()
    );
    eprintln!(
        "stop phase encode   {:>12} bytes {:>8.3} s (device memory streamed into the file)",
        figures.bytes,
        figures.encode.as_secs_f64()
    );
    figure("save", figures.bytes, started);
    assert!(figures.device_bytes >= mib * MIB);
    let saved = StateFile::filled(file.file().try_clone().unwrap(), figures.bytes).unwrap();
    let sessions = vec![SessionState {
        id: 3,
        pid: 1,
        gpu: SavedGpu::State(saved),
    }];

    let (r, w) = std::io::pipe().unwrap();
    // As the daemons do with QEMU's pipes.
    widen_pipe(&w);
    let started = Instant::now();
    let sender = std::thread::spawn(move || {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, w);
        write_stream(&mut out, &sessions).unwrap();
    });
    let got = read_copied(&mut std::io::BufReader::with_capacity(1 << 20, r)).unwrap();
    sender.join().unwrap();
    figure("transfer", figures.bytes, started);
    let SavedGpu::State(incoming) = &got[0].gpu else {
        panic!("no state")
    };
    drop(s);

    let started = Instant::now();
    incoming.seal().unwrap();
    let mapped = SealedMap::new(incoming.file()).unwrap();
    let mut b = Rig::with_staging(FakeDriver::new(1), 2 << 20);
    let mut restored = GpuState::open(&b.host, 3);
    restored.restore_saved(mapped.bytes()).unwrap();
    figure("restore", figures.bytes, started);
    for at in marks {
        let (r, got) = dtoh(&mut b, &mut restored, at, 8, &[8]);
        ok(r);
        assert_eq!(got, at.to_le_bytes());
    }
}

/// A same-host handover over the fake driver: the source exports its runs (moved to shareable
/// memory in place, the program unaware) and saves its state without the allocations' contents;
/// a destination given other runs is refused before it maps anything, and the source goes on
/// as a failed migration leaves it; the destination given the source's runs maps them at their
/// addresses, and the program's memory (pointers stored in it included) is all there. The fake
/// keeps an allocation's bytes in its mapping until it is unmapped and frees an allocation whose
/// last handle goes even while its descriptor is open (the real driver keeps it for the
/// descriptor), so the test holds an import of each run while the source ends. (One fake
/// serves both ends, so the program holds no module: the fake would place a second load's
/// globals elsewhere.)
#[test]
fn a_handover_maps_the_sources_memory_at_its_addresses_and_a_refused_one_leaves_the_source_running()
{
    use std::os::fd::AsFd;
    let mut a = Rig::new(1);
    let mut s = GpuState::open(&a.host, 3);
    // A linked list in device memory, of small blocks and a large one.
    let nodes: Vec<u64> = [24u64, 300, 4096, 3 << 20, 40]
        .iter()
        .map(|&n| malloc(&mut s, n))
        .collect();
    for (i, &at) in nodes.iter().enumerate() {
        let mut node = nodes
            .get(i + 1)
            .copied()
            .unwrap_or(0)
            .to_le_bytes()
            .to_vec();
        node.extend_from_slice(&(i as u64 * 7).to_le_bytes());
        ok(htod(&mut a, &mut s, at, &node, &[16]));
    }
    let walk = |a: &mut Rig, s: &mut GpuState| {
        let (mut at, mut seen) = (nodes[0], 0u64);
        while at != 0 {
            let (r, node) = dtoh(a, s, at, 16, &[16]);
            ok(r);
            assert_eq!(node[8..], (seen * 7).to_le_bytes());
            at = u64::from_le_bytes(node[..8].try_into().unwrap());
            seen += 1;
        }
        assert_eq!(seen, nodes.len() as u64);
    };
    let runs = s.export_runs().unwrap();
    assert!(!runs.is_empty());
    let mut out = std::io::Cursor::new(Vec::new());
    let figures = s.save_for_handover_into(&mut out).unwrap();
    let bytes = out.into_inner();
    assert_eq!(figures.bytes, bytes.len() as u64);
    // The 3 MiB node and the rest stay on the GPU: the state is only the record.
    assert!(bytes.len() < 64 << 10, "{} bytes", bytes.len());
    walk(&mut a, &mut s);

    // A destination given fewer runs than were saved refuses before it maps anything (the
    // source still holds its range, so mapping would fail anyway: it is never tried).
    let mut wrong = GpuState::open(&a.host, 3);
    assert!(matches!(
        wrong.restore_handed_over(&bytes, &runs[1..]),
        Err(CheckpointError::Mismatch(_))
    ));
    drop(wrong);
    // A state with contents is not a handover's.
    let full = s.save().unwrap();
    let mut wrong = GpuState::open(&a.host, 3);
    wrong.restore_handed_over(&full, &runs).unwrap_err();
    drop(wrong);
    // The migration failed: the source runs on, its memory intact.
    walk(&mut a, &mut s);

    let held: Vec<_> = runs
        .iter()
        .map(|r| a.fake.mem_import_fd(r.fd.as_fd()).unwrap())
        .collect();
    drop(s);
    let mut r = GpuState::open(&a.host, 3);
    r.restore_handed_over(&bytes, &runs).unwrap();
    for h in held {
        a.fake.mem_release(h).unwrap();
    }
    walk(&mut a, &mut r);
}

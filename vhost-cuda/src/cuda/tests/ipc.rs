//! Device memory shared between two sessions (two guest processes) over the fake driver: what
//! one exports, the other imports and reaches; the importer's mapping outlives the exporter;
//! hostile imports are refused; the checkpoint refuses a sharing state.

use std::os::fd::AsFd;

use qcuda_proto::{IPC_KIND_MEMORY, IPC_KIND_VMM, VMM_HANDLE_POSIX_FD};

use super::*;
use crate::cuda::CheckpointError;

fn two_sessions(rig: &Rig) -> (GpuState, GpuState) {
    (GpuState::open(&rig.host, 5), GpuState::open(&rig.host, 6))
}

#[test]
fn legacy_ipc_memory_is_shared_and_survives_the_exporter() {
    let mut rig = Rig::new(1);
    let (mut a, mut b) = two_sessions(&rig);
    let neighbour = malloc(&mut a, 512);
    ok(htod(&mut rig, &mut a, neighbour, &[0x77; 512], &[512]));
    let p = malloc(&mut a, 4096);
    let data = pattern(4096);
    ok(htod(&mut rig, &mut a, p, &data, &[4096]));
    // Any pointer inside the allocation names it. The first export moves the granule to
    // shareable memory at the same address: the exporter's blocks keep their contents.
    let e = a.ipc_export(0, IPC_KIND_MEMORY, p + 100).unwrap();
    let (_, got) = dtoh(&mut rig, &mut a, neighbour, 512, &[512]);
    assert!(
        got == vec![0x77; 512],
        "the neighbour block lost its contents"
    );
    let (_, got) = dtoh(&mut rig, &mut a, p, 4096, &[4096]);
    assert!(got == data, "the exported block lost its contents");
    // A second export of the same granule needs no move.
    let again = a.ipc_export(0, IPC_KIND_MEMORY, neighbour).unwrap();
    assert_eq!(again.meta[2], e.meta[2]);
    let [offset, size, len] = e.meta;
    assert_eq!(size, 4096);
    assert!(offset + size <= len);
    let r = b.ipc_import(0, IPC_KIND_MEMORY, e.fd.as_fd(), e.meta, 1);
    let [q, qsize, ..] = ok(r);
    assert_eq!(qsize, 4096);
    // The importer reads the exporter's bytes and writes its own. (The fake driver gives a
    // second mapping the bytes of the allocation when it is made; the real one shares them
    // from then on too, which the GPU test checks.)
    let (r, got) = dtoh(&mut rig, &mut b, q, 4096, &[4096]);
    assert_eq!(r.status, status::SUCCESS);
    assert!(
        got == data,
        "the importer does not see the exporter's bytes"
    );
    ok(htod(&mut rig, &mut b, q + 8, &[9; 8], &[8]));
    // Only the exported allocation is the importer's to touch, not its granule neighbours.
    let (r, _) = dtoh(&mut rig, &mut b, q + 4090, 16, &[16]);
    assert_eq!(r.status, status::INVALID_VALUE);
    let (r, _) = dtoh(&mut rig, &mut b, q - 512, 16, &[16]);
    assert_eq!(r.status, status::INVALID_VALUE);
    // Neither side can be checkpointed now.
    assert!(matches!(a.pause(), Err(CheckpointError::Unsupported(_))));
    assert!(matches!(b.pause(), Err(CheckpointError::Unsupported(_))));
    // The exporter exits: the importer's memory stays, with its contents.
    drop(a);
    let (r, got) = dtoh(&mut rig, &mut b, q + 8, 8, &[8]);
    assert_eq!((r.status, got), (status::SUCCESS, vec![9; 8]));
    // Closed, it is gone; a second close is refused.
    ok(run(&mut b, Op::IpcClose, &[q]));
    assert_eq!(
        run(&mut b, Op::IpcClose, &[q]).status,
        status::INVALID_VALUE
    );
    let (r, _) = dtoh(&mut rig, &mut b, q, 8, &[8]);
    assert_eq!(r.status, status::INVALID_VALUE);
    drop(b);
    let (reservations, mappings) = rig.fake.vmm_ranges();
    assert_eq!((reservations, mappings), (0, 0));
    assert_eq!(rig.fake.vmm_allocations(), 0);
}

#[test]
fn hostile_exports_and_imports_are_refused() {
    let mut rig = Rig::new(1);
    let (mut a, mut b) = two_sessions(&rig);
    // Nothing allocated yet, then pointers that are no allocation of the session.
    assert_eq!(
        a.ipc_export(0, IPC_KIND_MEMORY, 0x1234).unwrap_err().status,
        status::INVALID_VALUE
    );
    let p = malloc(&mut a, 256);
    for (kind, arg) in [
        (IPC_KIND_MEMORY, p + 256),
        (IPC_KIND_MEMORY, 0),
        (9, p),
        (IPC_KIND_VMM, 77),
    ] {
        assert_eq!(
            a.ipc_export(0, kind, arg).unwrap_err().status,
            status::INVALID_VALUE,
            "{kind} {arg:#x}"
        );
    }
    let e = a.ipc_export(0, IPC_KIND_MEMORY, p).unwrap();
    // Lying metadata (past the physical allocation, empty), unknown flags, a descriptor that
    // is no export, another kind, another device: refused, nothing left mapped.
    for (meta, flags) in [
        ([e.meta[2], 256, e.meta[2]], 0),
        ([0, 0, e.meta[2]], 0),
        ([u64::MAX, 2, e.meta[2]], 0),
        (e.meta, 2),
    ] {
        let r = b.ipc_import(0, IPC_KIND_MEMORY, e.fd.as_fd(), meta, flags);
        assert_eq!(r.status, status::INVALID_VALUE, "{meta:?} {flags}");
    }
    let null = std::fs::File::open("/dev/null").unwrap();
    assert_ne!(
        b.ipc_import(0, IPC_KIND_MEMORY, null.as_fd(), e.meta, 0)
            .status,
        status::SUCCESS
    );
    assert_eq!(
        b.ipc_import(0, 7, e.fd.as_fd(), e.meta, 0).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        b.ipc_import(3, IPC_KIND_MEMORY, e.fd.as_fd(), e.meta, 0)
            .status,
        status::INVALID_DEVICE
    );
    // What is left is the exporter's range and its one granule.
    drop(b);
    assert_eq!(rig.fake.vmm_ranges(), (1, 1));
    let _ = &mut rig;
}

#[test]
fn vmm_handles_travel_as_descriptors() {
    let mut rig = Rig::new(1);
    rig.host.set_address_space(crate::cuda::AddressSpace::OFF);
    let (mut a, mut b) = two_sessions(&rig);
    let g = ok(run(&mut a, Op::MemGetGranularity, &[0, 0, 0, 0]))[0];
    let plain = ok(run(&mut a, Op::MemCreate, &[g, 0, 0, 0]))[0];
    // Not created shareable: the driver refuses, as natively.
    assert_ne!(
        a.ipc_export(0, IPC_KIND_VMM, plain).unwrap_err().status,
        status::SUCCESS
    );
    let h = ok(run(&mut a, Op::MemCreate, &[g, VMM_HANDLE_POSIX_FD, 0, 0]))[0];
    let va = ok(run(&mut a, Op::MemAddressReserve, &[g, 0, 0]))[0];
    ok(run(&mut a, Op::MemMap, &[va, g, 0, h]));
    let acc = rig.buf(&[0, 0, 0, 0, 3, 0, 0, 0]);
    ok(a.execute(&req(Op::MemSetAccess, 0, &[va, g], vec![acc], vec![])));
    ok(htod(&mut rig, &mut a, va, &[42; 64], &[64]));
    let e = a.ipc_export(0, IPC_KIND_VMM, h).unwrap();
    assert_eq!(e.meta, [0, g, 0]);
    let hb = ok(b.ipc_import(0, IPC_KIND_VMM, e.fd.as_fd(), e.meta, 0))[0];
    // The importer's handle is an ordinary handle of its own: properties, map, access, copy.
    assert_eq!(
        ok(run(&mut b, Op::MemHandleProperties, &[hb]))[..2],
        [0, VMM_HANDLE_POSIX_FD]
    );
    let vb = ok(run(&mut b, Op::MemAddressReserve, &[g, 0, 0]))[0];
    ok(run(&mut b, Op::MemMap, &[vb, g, 0, hb]));
    let acc = rig.buf(&[0, 0, 0, 0, 3, 0, 0, 0]);
    ok(b.execute(&req(Op::MemSetAccess, 0, &[vb, g], vec![acc], vec![])));
    let (r, got) = dtoh(&mut rig, &mut b, vb, 64, &[64]);
    assert_eq!((r.status, got), (status::SUCCESS, vec![42; 64]));
    // The exporter releases and exits: the importer's mapping keeps the memory.
    drop(a);
    let (r, got) = dtoh(&mut rig, &mut b, vb, 64, &[64]);
    assert_eq!((r.status, got), (status::SUCCESS, vec![42; 64]));
    drop(b);
    assert_eq!(rig.fake.vmm_allocations(), 0);
}

#[test]
fn shareable_pools_and_their_pointers_are_imported_by_another_session() {
    use qcuda_proto::{IPC_KIND_POOL, POOL_HANDLE_POSIX_FD};
    let mut rig = Rig::new(1);
    let (mut a, mut b) = two_sessions(&rig);
    let plain = ok(run(&mut a, Op::MemPoolCreate, &[0, 0]))[0];
    assert_eq!(
        run(&mut a, Op::MemPoolCreate, &[0, 2]).status,
        status::INVALID_VALUE
    );
    // A pool not created shareable cannot be exported.
    assert_ne!(
        a.ipc_export(0, IPC_KIND_POOL, plain).unwrap_err().status,
        status::SUCCESS
    );
    let pool = ok(run(&mut a, Op::MemPoolCreate, &[0, POOL_HANDLE_POSIX_FD]))[0];
    let p = ok(run(&mut a, Op::MallocAsync, &[256, 0, pool]))[0];
    ok(htod(&mut rig, &mut a, p, &[0x5a; 256], &[256]));
    let e = a.ipc_export(0, IPC_KIND_POOL, pool).unwrap();
    let out = rig.out(64);
    ok(a.execute(&req(
        Op::MemPoolExportPointer,
        0,
        &[p],
        vec![],
        vec![out.clone()],
    )));
    let record = out.to_vec().unwrap();
    // Only stream-ordered allocations export, into a record of the driver's size.
    let m = malloc(&mut a, 64);
    let out2 = rig.out(64);
    assert_eq!(
        a.execute(&req(Op::MemPoolExportPointer, 0, &[m], vec![], vec![out2]))
            .status,
        status::INVALID_VALUE
    );

    let hb = ok(b.ipc_import(0, IPC_KIND_POOL, e.fd.as_fd(), e.meta, 0))[0];
    // A pool of its own is no imported pool; a forged record is refused.
    let own = ok(run(&mut b, Op::MemPoolCreate, &[0, 0]))[0];
    let rec = rig.buf(&record);
    assert_eq!(
        b.execute(&req(Op::MemPoolImportPointer, 0, &[own], vec![rec], vec![]))
            .status,
        status::INVALID_VALUE
    );
    let mut forged = record.clone();
    forged[9] ^= 1;
    let rec = rig.buf(&forged);
    assert_ne!(
        b.execute(&req(Op::MemPoolImportPointer, 0, &[hb], vec![rec], vec![]))
            .status,
        status::SUCCESS
    );
    let rec = rig.buf(&record);
    let [q, size, ..] = ok(b.execute(&req(Op::MemPoolImportPointer, 0, &[hb], vec![rec], vec![])));
    assert_eq!(size, 256);
    let (r, got) = dtoh(&mut rig, &mut b, q, 256, &[256]);
    assert_eq!(r.status, status::SUCCESS);
    assert!(
        got == vec![0x5a; 256],
        "the importer does not see the pool allocation"
    );
    // The importer re-exports nothing of it, cannot be checkpointed, and frees what it imported.
    assert_eq!(
        b.ipc_export(0, IPC_KIND_POOL, hb).unwrap_err().status,
        status::INVALID_VALUE
    );
    assert!(matches!(b.pause(), Err(CheckpointError::Unsupported(_))));
    ok(run(&mut b, Op::FreeAsync, &[q, 0]));
    assert_eq!(
        run(&mut b, Op::FreeAsync, &[q, 0]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut b, Op::MemPoolDestroy, &[hb]));
}

#[test]
fn interprocess_events_are_opened_by_another_session() {
    use qcuda_proto::IPC_KIND_EVENT;
    let rig = Rig::new(1);
    let (mut a, mut b) = two_sessions(&rig);
    let timed = ok(run(&mut a, Op::EventCreate, &[4]))[0];
    let ipc = ok(run(&mut a, Op::EventCreate, &[6]))[0];
    // Only an event made interprocess and without timing exports, as CUDA says.
    for e in [timed, 999] {
        assert_eq!(
            a.ipc_export(0, IPC_KIND_EVENT, e).unwrap_err().status,
            status::INVALID_RESOURCE_HANDLE
        );
    }
    ok(run(&mut a, Op::EventRecord, &[ipc, 0]));
    let e = a.ipc_export(0, IPC_KIND_EVENT, ipc).unwrap();
    let h = ok(b.ipc_import(0, IPC_KIND_EVENT, e.fd.as_fd(), e.meta, 0))[0];
    // An event of the importer's: waited for, queried, waited on by a stream, destroyed.
    ok(run(&mut b, Op::EventSynchronize, &[h]));
    ok(run(&mut b, Op::EventQuery, &[h]));
    ok(run(&mut b, Op::StreamWaitEvent, &[0, h, 0]));
    // Not the importer's to export again; a descriptor that holds no event handle is refused.
    assert_eq!(
        b.ipc_export(0, IPC_KIND_EVENT, h).unwrap_err().status,
        status::INVALID_RESOURCE_HANDLE
    );
    let null = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(
        b.ipc_import(0, IPC_KIND_EVENT, null.as_fd(), e.meta, 0)
            .status,
        status::INVALID_VALUE
    );
    assert!(matches!(b.pause(), Err(CheckpointError::Unsupported(_))));
    ok(run(&mut b, Op::EventDestroy, &[h]));
}

/// What a process opens of another's counts against the VM's device-memory quota while it holds
/// it: an exporter that exits gives its own count back, and the memory is still held.
#[test]
fn imported_memory_counts_against_the_vms_quota_until_closed() {
    use std::os::fd::FromRawFd;

    use crate::limits::{GpuMemoryQuota, QuotaSlot};
    let mut rig = Rig::new(1);
    let quota = GpuMemoryQuota::new(5 << 20, 2).unwrap();
    let lease = quota.lease().unwrap();
    // SAFETY: dup of an open descriptor returns a new one we own.
    let file = unsafe { std::fs::File::from_raw_fd(libc::dup(lease.fd())) };
    rig.host
        .set_memory_quota(QuotaSlot::attach(file, lease.index()).unwrap());
    let (mut a, mut b) = two_sessions(&rig);
    let p = malloc(&mut a, 1 << 20);
    assert_eq!(quota.used(), 1 << 20);
    let e = a.ipc_export(0, IPC_KIND_MEMORY, p).unwrap();
    let granule = e.meta[2];
    assert_eq!(granule, 2 << 20);
    let q = ok(b.ipc_import(0, IPC_KIND_MEMORY, e.fd.as_fd(), e.meta, 0))[0];
    assert_eq!(quota.used(), (1 << 20) + granule);
    // A second open of the same memory counts again; past the limit it is refused.
    let q2 = ok(b.ipc_import(0, IPC_KIND_MEMORY, e.fd.as_fd(), e.meta, 0))[0];
    assert_eq!(
        b.ipc_import(0, IPC_KIND_MEMORY, e.fd.as_fd(), e.meta, 0)
            .status,
        status::MEMORY_ALLOCATION
    );
    // The exporter leaves: the importer's opens still count.
    drop(a);
    assert_eq!(quota.used(), 2 * granule);
    ok(run(&mut b, Op::IpcClose, &[q]));
    assert_eq!(quota.used(), granule);
    drop(b);
    assert_eq!(quota.used(), 0);
    let _ = (q2, &mut rig);
}

//! What the fuzz targets (`fuzz/`, feature `fuzzing`) need from inside the executor: a host
//! over the fake driver, the host-side module image check, the saved-state decoder and
//! restore, and the pre-copy logs with a restore from a store. Not built into the binary.

use std::sync::Arc;

use super::{
    driver::fake::FakeDriver,
    host::{CudaHost, Tuning},
    module_image::ModuleImage,
    saved_state::SavedState,
    GpuState,
};

/// Most bytes of host memory a fuzzed fake driver's buffers hold together.
const FUZZ_RAM_BUDGET: u64 = 256 << 20;

/// Held by each restore below: a restored state maps its host mappings at their addresses in
/// this process, so two restores at once (the unit tests' threads; a fuzzer runs one input at
/// a time) would take each other's addresses.
static RESTORING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn restoring() -> std::sync::MutexGuard<'static, ()> {
    RESTORING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fake driver (2 GPUs) and a host over it, with the default tuning, that a restore below
/// goes into.
fn restore_host() -> (Arc<FakeDriver>, Arc<CudaHost>) {
    let driver = Arc::new(FakeDriver::new(2).with_ram_budget(FUZZ_RAM_BUDGET));
    let host = CudaHost::from_driver(driver.clone(), 13000, None, Tuning::default())
        .expect("fake driver host");
    (driver, Arc::new(host))
}

/// Whatever a restore did, once its state is dropped nothing stays on the fake device.
fn assert_nothing_left(driver: &FakeDriver) {
    assert_eq!(driver.live_contexts(), 0);
    assert_eq!(driver.vmm_ranges(), (0, 0));
    assert_eq!(driver.registered(), 0);
}

/// A host over the fake driver with `gpus` GPUs and tiny staging, so that small buffers take
/// every copy path.
pub fn fake_host(gpus: i32) -> Arc<CudaHost> {
    let tuning = Tuning {
        staging_half: 64,
        direct_min: 100,
        max_registered_ram: 0,
        ..Tuning::default()
    };
    // Every device may be filled at once: bounded in all, so that no input passes the fuzzer's
    // memory limit (2 GiB, with AddressSanitizer's own share).
    let driver = Arc::new(FakeDriver::new(gpus).with_ram_budget(FUZZ_RAM_BUDGET));
    Arc::new(CudaHost::from_driver(driver, 13000, None, tuning).expect("fake driver host"))
}

/// The host's check of a module image (fatbin, cubin or PTX) from the guest: `Ok(kind name)`
/// or the `cudaError_t` it is refused with.
pub fn check_module_image(bytes: &[u8]) -> Result<&'static str, u32> {
    let image = ModuleImage::from_slice(bytes)?;
    assert!(image.as_bytes().len() >= bytes.len());
    Ok(match image.kind() {
        super::module_image::ImageKind::Fatbin => "fatbin",
        super::module_image::ImageKind::Elf => "elf",
        super::module_image::ImageKind::Ptx => "ptx",
    })
}

/// A saved state from anywhere (a file, another daemon): decoded, and if it decodes, restored
/// into a fresh state over the fake driver (2 GPUs) and dropped. Whatever the bytes, nothing
/// panics, what decodes re-encodes to a state that decodes the same, and nothing stays behind
/// on the fake device. Returns whether the state was restored.
pub fn restore_saved_state(bytes: &[u8]) -> bool {
    let Ok(state) = SavedState::decode(bytes) else {
        return false;
    };
    assert_eq!(SavedState::decode(&state.encode()).as_ref(), Ok(&state));
    let _one_at_a_time = restoring();
    // As a worker does before its driver starts: managed memory is placed in the window.
    super::reserve_window();
    let (driver, host) = restore_host();
    let restored = GpuState::restore(&host, state.session, bytes).is_ok();
    assert_nothing_left(&driver);
    // Decoded in place (a worker's restore from its mapped file): the same state, the
    // allocations' bytes where they lie.
    let (mut borrowed, contents) = SavedState::decode_borrowed(bytes).expect("it decoded");
    assert_eq!(contents.len(), borrowed.allocations.len());
    for (a, c) in borrowed.allocations.iter_mut().zip(&contents) {
        assert!(a.contents.is_empty());
        a.contents = c.to_vec();
    }
    assert_eq!(borrowed, state);
    // The same bytes as a handover's state, restored in place, with no run handed over: only a
    // state without runs or contents may come back, and nothing stays behind either way.
    {
        let mut fresh = GpuState::open(&host, state.session);
        let handed = fresh.restore_handed_over(bytes, &[]);
        assert!(
            handed.is_err() || (state.runs.is_empty() && contents.iter().all(|c| c.is_empty()))
        );
        let mut fresh = GpuState::open(&host, state.session);
        let _ = fresh.restore_saved(bytes);
    }
    assert_nothing_left(&driver);
    restored
}

/// A live migration's pre-copy input from anywhere (it comes from the source host through
/// QEMU): `data` is a u32 (little-endian) length `n`, a final saved state of `n` bytes, and a
/// pre-copy store (chunk logs), as a destination's worker gets them. The store's framing is
/// checked ([`precopy::check_log`], [`precopy::scan`], which must agree, and the whole input is
/// tried as a round, [`precopy::read_round`]), then the state restored from the store into a
/// fresh state over the fake driver: nothing panics, and nothing stays behind. Returns whether
/// it restored.
pub fn restore_with_store(data: &[u8]) -> bool {
    use super::precopy;
    if let Ok(round) = precopy::read_round(data) {
        for (_, log) in round.sessions {
            precopy::check_log(log).expect("a round's logs are checked");
        }
    }
    let Some((head, rest)) = data.split_first_chunk::<4>() else {
        return false;
    };
    let n = u32::from_le_bytes(*head) as usize;
    if n > rest.len() {
        return false;
    }
    let (state, store) = rest.split_at(n);
    let checked = precopy::check_log(store);
    let scanned = precopy::scan(store);
    assert_eq!(checked.is_ok(), scanned.is_ok());
    if let (Ok(count), Ok(index)) = (checked, scanned) {
        assert!(index.len() as u64 <= count.chunks);
    }
    let Ok(saved) = SavedState::decode(state) else {
        return false;
    };
    let _one_at_a_time = restoring();
    super::reserve_window();
    let (driver, host) = restore_host();
    let restored = {
        let mut fresh = GpuState::open(&host, saved.session);
        fresh.restore_saved_with_store(state, Some(store)).is_ok()
    };
    assert_nothing_left(&driver);
    restored
}

/// [`sample_saved_state`] with its allocation pre-copied: the input [`restore_with_store`]
/// takes, which restores (a seed for the fuzz target `precopy_log`).
pub fn sample_precopy_input() -> Vec<u8> {
    use super::{precopy, saved_state::SavedChunkRef};
    let mut state = SavedState::decode(&sample_saved_state()).expect("the seed decodes");
    let mut store = Vec::new();
    for a in &mut state.allocations {
        let hash = precopy::hash(&a.contents);
        precopy::write_chunk(&mut store, a.dev, a.ptr, 0, &a.contents, hash)
            .expect("writing into memory");
        a.refs = vec![SavedChunkRef {
            offset: 0,
            len: a.size,
            hash,
        }];
        a.contents.clear();
    }
    let state = state.encode();
    let mut input = u32::try_from(state.len())
        .expect("a small state")
        .to_le_bytes()
        .to_vec();
    input.extend_from_slice(&state);
    input.extend_from_slice(&store);
    input
}

/// A same-host handover's offer from anywhere (it rides in the migration stream): decoded,
/// and what decodes encodes to the same bytes. Returns whether it decoded.
pub fn decode_handover_offer(bytes: &[u8]) -> bool {
    let Ok(offer) = crate::session::handover::Offer::decode(bytes) else {
        return false;
    };
    assert_eq!(offer.encode(), bytes);
    true
}

/// An offer: a seed for the fuzz target.
pub fn sample_handover_offer() -> Vec<u8> {
    crate::session::handover::Offer {
        boot_id: [0x5a; 16],
        gpus: vec![[1; 16], [2; 16]],
        socket: "/run/qcuda/qcuda-handover-42.sock".into(),
        token: [0xc3; crate::session::handover::TOKEN_LEN],
    }
    .encode()
}

/// A saved state with one of most things the format holds (contexts with settings and a peer,
/// a run of small blocks with an allocation, an empty large run, a module with a function, a
/// stream, an event, the default pool and a created current one, a VMM reservation, pinned,
/// registered and managed memory, a graph with a kernel, memset, event record, child graph and
/// conditional node, an executable graph, arrays, a mipmapped array with a level handle, texture
/// and surface objects), restorable over the fake driver with 2 GPUs: a seed for the fuzz
/// target.
pub fn sample_saved_state() -> Vec<u8> {
    use qcuda_proto::graph::{self as g, KernelNode, MemsetNode};
    use qcuda_proto::{HOST_WINDOW_BASE, MANAGED_WINDOW_BASE};

    use super::saved_state::{
        GraphRole, SavedAllocation, SavedArray, SavedArrayDesc, SavedConditional, SavedContext,
        SavedEvent, SavedExec, SavedFunction, SavedGraph, SavedHostMapping, SavedLevel,
        SavedManaged, SavedMipmapped, SavedModule, SavedNode, SavedNodeKind, SavedObject,
        SavedPool, SavedResource, SavedRun, SavedStream, SavedTexDesc,
    };
    let desc = |width, height, format, flags| SavedArrayDesc {
        width,
        height,
        depth: 0,
        format,
        channels: 1,
        flags,
    };
    let space = super::AddressSpace::default();
    let base = |dev| space.session_base(1, dev, 2).expect("in the space");
    let buffer = base(0) + 256;
    let mut params: Vec<u8> = [buffer, buffer, buffer]
        .iter()
        .flat_map(|p| p.to_le_bytes())
        .collect();
    params.extend_from_slice(&4i32.to_le_bytes());
    let mut kernel = vec![0u8; g::KERNEL_NODE_HEADER + params.len()];
    KernelNode {
        function: 3,
        grid: [1, 1, 1],
        block: [4, 1, 1],
        shared_mem: 0,
        params: &params,
    }
    .encode(&mut kernel);
    let memset = MemsetNode {
        dst: buffer,
        pitch: 0,
        value: 1,
        element_size: 4,
        width: 4,
        height: 1,
    }
    .encode()
    .to_vec();
    let node = |handle, kind, deps: &[u32]| SavedNode {
        handle,
        kind,
        deps: deps.to_vec(),
    };
    let plain = |ty, params: &[u8]| SavedNodeKind::Plain {
        ty,
        params: params.to_vec(),
    };
    // The fake driver numbers conditional handles in order, from 1.
    let cond = 0xc0d0_0000_0000_0001;
    let graphs = vec![
        SavedGraph {
            id: 11,
            dev: 0,
            role: GraphRole::Session,
            nodes: vec![
                node(12, plain(g::NODE_KERNEL, &kernel), &[]),
                node(13, plain(g::NODE_MEMSET, &memset), &[0]),
                node(14, plain(g::NODE_EVENT_RECORD, &5u64.to_le_bytes()), &[1]),
                node(15, SavedNodeKind::Child { graph: 16 }, &[0]),
                node(
                    18,
                    SavedNodeKind::Conditional {
                        handle: cond,
                        kind: 0,
                        bodies: vec![19],
                    },
                    &[2, 3],
                ),
            ],
        },
        SavedGraph {
            id: 16,
            dev: 0,
            role: GraphRole::Held,
            nodes: vec![node(17, plain(g::NODE_EMPTY, &[]), &[])],
        },
        SavedGraph {
            id: 19,
            dev: 0,
            role: GraphRole::Held,
            nodes: Vec::new(),
        },
        SavedGraph {
            id: 1 << 63,
            dev: 0,
            role: GraphRole::Private,
            nodes: vec![
                node(0, plain(g::NODE_KERNEL, &kernel), &[]),
                node(0, plain(g::NODE_MEMSET, &memset), &[0]),
            ],
        },
    ];
    let state = SavedState {
        session: 1,
        last_handle: 20,
        devices: 2,
        va_base: space.base,
        va_size: space.per_device,
        contexts: vec![
            SavedContext {
                dev: 0,
                cache_config: Some(1),
                limits: vec![(0, 4096)],
                peers: vec![1],
                ranged: true,
            },
            SavedContext {
                dev: 1,
                cache_config: None,
                limits: Vec::new(),
                peers: Vec::new(),
                ranged: true,
            },
        ],
        runs: vec![
            SavedRun {
                dev: 0,
                va: base(0),
                len: 2 << 20,
                class: Some(0),
            },
            SavedRun {
                dev: 1,
                va: base(1) + (4 << 20),
                len: 4 << 20,
                class: None,
            },
        ],
        allocations: vec![SavedAllocation {
            dev: 0,
            ptr: base(0) + 256,
            size: 16,
            block: 256,
            contents: b"0123456789abcdef".to_vec(),
            refs: Vec::new(),
        }],
        modules: vec![SavedModule {
            handle: 2,
            dev: 0,
            image: b".version 9.0\n.target sm_90\n.address_size 64\n".to_vec(),
        }],
        globals: Vec::new(),
        functions: vec![SavedFunction {
            handle: 3,
            module: 2,
            name: c"vadd".to_owned(),
            cache_config: Some(2),
            attributes: vec![(8, 1024)],
        }],
        streams: vec![SavedStream {
            handle: 4,
            dev: 1,
            flags: 1,
            priority: -1,
            attributes: vec![(3, [0; 64])],
        }],
        events: vec![SavedEvent {
            handle: 5,
            dev: 0,
            flags: 2,
            recorded: true,
        }],
        pools: vec![
            SavedPool {
                handle: 6,
                dev: 0,
                default: true,
                current: false,
                max_size: 0,
                shareable: false,
                settings: vec![(4, 1 << 20)],
                access: Vec::new(),
            },
            SavedPool {
                handle: 7,
                dev: 0,
                default: false,
                current: true,
                max_size: 32 << 20,
                shareable: false,
                settings: vec![(1, 0)],
                access: vec![(1, 3)],
            },
        ],
        // A reservation of the program's own (an allocation would make the seed 2 MiB: the
        // granularity).
        vmm_reservations: vec![super::saved_state::SavedVmmReservation {
            va: 0x6000_0000_0000,
            size: 4 << 20,
        }],
        // Pinned memory in the window and registered memory outside it (their pages are guest
        // RAM: the restore holds their addresses until guest RAM comes), and managed memory
        // placed on the device with its bytes.
        host_mappings: vec![
            SavedHostMapping {
                guest: HOST_WINDOW_BASE + 0x4000_0000,
                len: 0x2000,
                local: HOST_WINDOW_BASE + 0x4000_0000,
                dev_addr: HOST_WINDOW_BASE + 0x4000_0000,
                dev: 0,
                flags: 0,
                runs: vec![(0x10_0000, 0x1000), (0x8_0000, 0x1000)],
            },
            SavedHostMapping {
                guest: 0x3f00_0000_0000,
                len: 0x1000,
                local: 0x3f00_0000_0000,
                dev_addr: 0x3f00_0000_0000,
                dev: 1,
                flags: 1,
                runs: vec![(0x20_0000, 0x1000)],
            },
        ],
        managed: vec![SavedManaged {
            // Managed memory lives in the managed-memory window, where guest-lib offers the
            // driver its hints (and the fake, as NVIDIA's driver does there, honours them).
            guest: MANAGED_WINDOW_BASE + 0x20_0000,
            dev: 0,
            runs: vec![(0x30_0000, 0x1000)],
            contents: b"managed".repeat(586)[..0x1000].to_vec(),
        }],
        graphs,
        conditionals: vec![SavedConditional {
            handle: cond,
            graph: 11,
            default_value: 1,
            flags: 1,
        }],
        execs: vec![SavedExec {
            handle: 20,
            dev: 0,
            flags: 0,
            source: 11,
            graph: 1 << 63,
            nodes: vec![(12, 0), (13, 1)],
            disabled: vec![1],
        }],
        // A 2D array and a mipmapped array of 2 levels on device 1, a handle of level 1, and
        // objects over them and over the allocation (value 1 freed before the capture).
        arrays: vec![SavedArray {
            handle: 8,
            dev: 1,
            desc: desc(4, 2, 0x01, 2),
            contents: (0..8).collect(),
        }],
        mipmapped: vec![SavedMipmapped {
            handle: 9,
            dev: 1,
            desc: desc(2, 2, 0x02, 0),
            levels: vec![vec![1; 8], vec![2; 2]],
        }],
        levels: vec![SavedLevel {
            handle: 10,
            mipmapped: 9,
            level: 1,
        }],
        objects: vec![
            SavedObject {
                value: 2,
                dev: 1,
                surface: true,
                resource: SavedResource::Array(8),
                tex: SavedTexDesc::default(),
                view: None,
            },
            SavedObject {
                value: 3,
                dev: 1,
                surface: false,
                resource: SavedResource::Mipmapped(9),
                tex: SavedTexDesc {
                    filter: 1,
                    ..SavedTexDesc::default()
                },
                view: None,
            },
            SavedObject {
                value: 4,
                dev: 0,
                surface: false,
                resource: SavedResource::Linear {
                    ptr: base(0) + 256,
                    format: 0x20,
                    channels: 1,
                    size: 16,
                },
                tex: SavedTexDesc::default(),
                view: None,
            },
        ],
        ..SavedState::default()
    };
    state.encode()
}

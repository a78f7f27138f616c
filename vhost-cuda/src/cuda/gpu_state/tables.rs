//! What a session's GPU state holds beyond its contexts and handle tables (mod.rs), by
//! concept: arrays and texture or surface objects (the ops: arrays.rs), graphs (graphs.rs),
//! memory opened from other processes (ipc.rs), managed placements (managed.rs), the reserved
//! range of each device (memory.rs), restored host mappings waiting for guest RAM
//! (saved_host_memory.rs), VMM objects (vmm.rs), the ranges of a paused state
//! (checkpoint.rs), a GPU timeline recording (trace.rs), and the pre-copy kernel of a context
//! (precopy.rs). Nothing here acts on the
//! `GpuState`: the files named do.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    os::fd::OwnedFd,
    sync::Arc,
};

use qcuda_proto::{trace::TraceRecord, HostRun};

use super::fault::to_usize;
use crate::{
    cuda::{
        device_arena::{ArenaError, Backing, DeviceArena, SavedRun as ArenaRun},
        driver::{
            array::{Array, ArrayDesc, MipmappedArray, TexParams, ViewParams},
            graph::{Graph, GraphExec, GraphNode},
            vmm::{AllocProps, MemHandle},
            CuError, DriverApi, Event, Function, Stream,
        },
        handles::{HandleCounter, HandleTable},
        host_mappings::HeldRange,
        saved_state::{SavedResource, MAX_ARRAYS, MAX_MIPMAPPED},
        trace::Recorder,
    },
    limits::QuotaSlot,
};

/// Most graphs a session may hold.
pub(super) const MAX_GRAPHS: usize = 1 << 14;

/// Most executable graphs a session may hold.
pub(super) const MAX_EXECS: usize = 1 << 14;

/// Most node handles a session may hold.
pub(super) const MAX_NODES: usize = 1 << 20;

/// Most allocation handles a session may hold.
pub(super) const MAX_VMM_HANDLES: usize = 1 << 16;

/// Most references one handle may count (`cuMemRetainAllocationHandle` of a mapping of it).
pub(super) const MAX_HANDLE_REFS: usize = 1 << 16;

#[derive(Debug)]
pub(super) struct ArrayEntry {
    pub(super) dev: usize,
    pub(super) raw: Array,
    pub(super) desc: ArrayDesc,
    /// The mipmapped array a level array belongs to.
    pub(super) owner: Option<u64>,
    /// Which level of it (0 for an array of its own).
    pub(super) level: u32,
}

#[derive(Debug)]
pub(super) struct MipmappedEntry {
    pub(super) dev: usize,
    pub(super) raw: MipmappedArray,
    /// Level 0's descriptor, and the level count (clamped as the driver clamps it).
    pub(super) desc: ArrayDesc,
    pub(super) levels: u32,
}

/// A texture or surface object, with how it was made (what a saved state needs to make it
/// again).
#[derive(Debug, Clone, Copy)]
pub(super) struct ObjectEntry {
    pub(super) dev: usize,
    pub(super) surface: bool,
    /// Creation order among the session's objects.
    pub(super) seq: u64,
    pub(super) resource: SavedResource,
    pub(super) tex: TexParams,
    pub(super) view: Option<ViewParams>,
}

/// What the session owns of arrays and objects.
#[derive(Debug)]
pub(super) struct ArrayState {
    pub(super) arrays: HandleTable<ArrayEntry>,
    pub(super) mipmapped: HandleTable<MipmappedEntry>,
    /// By (device, value): a driver may number each context's objects on its own.
    pub(super) objects: HashMap<(usize, u64), ObjectEntry>,
    /// The next object's [`ObjectEntry::seq`].
    pub(super) next_seq: u64,
}

impl Default for ArrayState {
    fn default() -> Self {
        Self {
            arrays: HandleTable::new(MAX_ARRAYS),
            mipmapped: HandleTable::new(MAX_MIPMAPPED),
            objects: HashMap::new(),
            next_seq: 0,
        }
    }
}

impl ArrayState {
    /// Forgets everything on `dev` (its context, which owned it, is gone).
    pub(super) fn forget_device(&mut self, dev: usize) {
        self.arrays.retain(|a| a.dev != dev);
        self.mipmapped.retain(|m| m.dev != dev);
        self.objects.retain(|&(d, _), _| d != dev);
    }
}

#[derive(Debug)]
pub(super) struct GraphEntry {
    pub(super) dev: usize,
    pub(super) raw: Graph,
    /// Still being captured: the driver owns it until the capture ends.
    pub(super) capturing: bool,
    /// A capture into this graph of the guest's is under way (StreamBeginCaptureToGraph).
    pub(super) capture_target: bool,
    /// The graph whose child graph node holds this one (it goes with that graph).
    pub(super) owner: Option<u64>,
    /// Its kernel nodes may carry attributes (captured while launch attributes were in use,
    /// or made from such a graph), which a saved state does not hold.
    pub(super) attributed: bool,
}

#[derive(Debug)]
pub(super) struct NodeEntry {
    pub(super) graph: u64,
    pub(super) raw: GraphNode,
    /// A conditional node's body graphs (handles, owned by the node's graph).
    pub(super) bodies: Vec<u64>,
    /// A conditional node's handle and kind, as the guest gave them (the driver of CUDA 13.0
    /// cannot be asked).
    pub(super) cond: Option<(u64, u32)>,
}

impl NodeEntry {
    pub(super) fn new(graph: u64, raw: GraphNode) -> Self {
        Self {
            graph,
            raw,
            bodies: Vec::new(),
            cond: None,
        }
    }
}

/// An executable graph. It is instantiated from a copy of its graph (`shadow`) that the
/// session keeps as the executable graph runs: the executable-graph calls that change it
/// change the copy's node too, so a saved state can read back what it runs now, whatever
/// became of the graph it came from. The guest names its nodes by the nodes of that graph:
/// `nodes` maps them (filled on first use with the driver's `cuGraphNodeFindInClone`, or
/// whole when restored).
#[derive(Debug)]
pub(super) struct ExecEntry {
    pub(super) dev: usize,
    pub(super) raw: GraphExec,
    /// The flags it was instantiated with.
    pub(super) flags: u64,
    /// The copy it was instantiated from (None: instantiated from the graph itself, see
    /// `unsaveable`).
    pub(super) shadow: Option<Graph>,
    /// The graph it came from.
    pub(super) source: Option<u64>,
    /// Node handle (of `source`) -> the copy's node.
    pub(super) nodes: HashMap<u64, GraphNode>,
    /// Why a saved state cannot hold it, if it cannot.
    pub(super) unsaveable: Option<&'static str>,
}

/// A conditional handle the guest made: the graph, default value and flags it was made with.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConditionalEntry {
    pub(super) graph: u64,
    pub(super) default_value: u32,
    pub(super) flags: u32,
}

/// The graphs, nodes and executable graphs of a session.
#[derive(Debug)]
pub(super) struct GraphTables {
    pub(super) graphs: HandleTable<GraphEntry>,
    pub(super) nodes: HandleTable<NodeEntry>,
    /// Driver node -> its handle.
    pub(super) node_ids: HashMap<GraphNode, u64>,
    pub(super) execs: HandleTable<ExecEntry>,
    /// Captures begun and not ended (an upper bound: a capture can also end with its stream).
    pub(super) captures: usize,
    /// Conditional handle (the driver's value) -> how it was made.
    pub(super) conditionals: HashMap<u64, ConditionalEntry>,
    /// A launch with launch attributes, or a capture begun on a stream with attributes, while
    /// a capture was under way: the graphs of captures that end before none is left under
    /// way are `attributed`.
    pub(super) attributed_capture: bool,
}

impl Default for GraphTables {
    fn default() -> Self {
        Self {
            graphs: HandleTable::new(MAX_GRAPHS),
            nodes: HandleTable::new(MAX_NODES),
            node_ids: HashMap::new(),
            execs: HandleTable::new(MAX_EXECS),
            captures: 0,
            conditionals: HashMap::new(),
            attributed_capture: false,
        }
    }
}

impl GraphTables {
    pub(super) fn len(&self) -> usize {
        self.graphs.len() + self.execs.len()
    }

    /// Forgets `graph`'s nodes, and the graphs its child graph nodes hold with theirs (the
    /// driver destroyed them with it).
    pub(super) fn forget_nodes_of(&mut self, graph: u64) {
        while let Some((held, _)) = self.graphs.find(|g| g.owner == Some(graph)) {
            self.graphs.remove(held);
            self.forget_nodes_of(held);
        }
        self.forget_own_nodes(graph);
        self.conditionals.retain(|_, c| c.graph != graph);
    }

    pub(super) fn forget_own_nodes(&mut self, graph: u64) {
        let node_ids = &mut self.node_ids;
        self.nodes.retain(|n| {
            if n.graph == graph {
                node_ids.remove(&n.raw);
                false
            } else {
                true
            }
        });
    }
}

/// What `GpuState::save_into` (checkpoint.rs) wrote and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveFigures {
    /// Bytes of the saved state.
    pub bytes: u64,
    /// Of those, bytes of device memory (allocations, globals, arrays, managed memory).
    pub device_bytes: u64,
    /// Quiescing and recording (small contents copied to the host).
    pub capture: std::time::Duration,
    /// Encoding and writing, the allocations' device memory streamed into the file.
    pub encode: std::time::Duration,
}

/// A run of a session's reserved range on guest device `dev`, and its physical memory: what a
/// same-host handover exports and imports (handover.rs).
#[derive(Debug)]
pub struct ExportedRun {
    /// The guest device ordinal.
    pub dev: u32,
    /// Its address.
    pub va: u64,
    /// Its length.
    pub len: u64,
    /// Its physical memory, shareable.
    pub fd: OwnedFd,
}

/// Runs of a range mapped from imported memory, each found by its address.
pub(super) struct ImportingBacking<'a> {
    pub(super) drv: &'a dyn DriverApi,
    /// `(CUdevice, ACCESS_*)`: the owner, and peers that enabled access to it.
    pub(super) access: &'a [(i32, u32)],
    /// The runs of this device: (address, length, memory).
    pub(super) runs: &'a [(u64, u64, &'a OwnedFd)],
}

impl Backing for ImportingBacking<'_> {
    type Handle = ();

    fn map(&self, va: u64, len: u64) -> Result<(), ArenaError> {
        let fd = self
            .runs
            .iter()
            .find(|r| r.0 == va && r.1 == len)
            .map(|r| r.2)
            .ok_or(ArenaError::BadSnapshot)?;
        let size = usize::try_from(len).map_err(|_| ArenaError::BadSize)?;
        let drv = |e: CuError| ArenaError::Driver(e.0);
        let handle = self
            .drv
            .mem_import_fd(std::os::fd::AsFd::as_fd(fd))
            .map_err(drv)?;
        let mapped = self.drv.mem_map(va, size, 0, handle);
        let _ = self.drv.mem_release(handle);
        mapped.map_err(drv)?;
        if let Err(e) = self.drv.mem_set_access(va, size, self.access) {
            let _ = self.drv.mem_unmap(va, size);
            return Err(drv(e));
        }
        Ok(())
    }

    fn unmap(&self, va: u64, len: u64, (): ()) {
        if let Ok(size) = usize::try_from(len) {
            let _ = self.drv.mem_unmap(va, size);
        }
    }
}

/// What an export gives the daemon: the real shareable handle and what an importer needs to
/// know about it (`meta`, passed back to the importing worker as is).
#[derive(Debug)]
pub struct IpcExported {
    /// The driver's POSIX file descriptor of the physical allocation.
    pub fd: OwnedFd,
    /// `IPC_KIND_MEMORY`: the exported allocation's offset in the physical allocation, its
    /// size, the physical allocation's size. `IPC_KIND_VMM`: 0, the allocation's size, 0.
    /// Other kinds: zeros.
    pub meta: [u64; 3],
}

/// One opened legacy IPC mapping.
#[derive(Debug, Clone, Copy)]
pub(super) struct IpcMapping {
    /// The reservation and mapping: the whole physical allocation.
    pub(super) va: u64,
    pub(super) len: u64,
    /// What the guest may touch: the exported allocation.
    pub(super) size: u64,
    /// The guest device it was opened on (whose context must be current to unmap).
    pub(super) dev: usize,
}

/// The legacy IPC mappings the session opened, by the address given to the guest.
#[derive(Debug, Default)]
pub(super) struct IpcImports {
    pub(super) open: BTreeMap<u64, IpcMapping>,
    /// Allocations imported from other processes' pools: address -> size.
    pub(super) pool_pointers: BTreeMap<u64, u64>,
    /// Pools imported from other processes (session pool handles).
    pub(super) pools: std::collections::HashSet<u64>,
    /// Events opened from other processes (session event handles).
    pub(super) events: std::collections::HashSet<u64>,
    /// Whether the session has exported memory: another process may map it from then on.
    pub(super) exported: bool,
}

impl IpcImports {
    /// Whether `ptr..ptr + len` lies inside one opened or imported allocation.
    pub(super) fn holds(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let inside = |base: u64, size: u64| ptr < base + size && end <= base + size;
        self.open
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, m)| inside(base, m.size))
            || self
                .pool_pointers
                .range(..=ptr)
                .next_back()
                .is_some_and(|(&base, &size)| inside(base, size))
    }

    /// Forgets the imported pool allocation at `ptr` (its count given back); whether it was
    /// one.
    pub(super) fn take_pool_pointer(
        &mut self,
        ptr: u64,
        quota: Option<&crate::limits::QuotaSlot>,
    ) -> bool {
        match self.pool_pointers.remove(&ptr) {
            Some(size) => {
                if let Some(q) = quota {
                    q.release(size);
                }
                true
            }
            None => false,
        }
    }

    /// Whether the session shares device memory with another process: it opened memory of
    /// one, or gave its own away (after an export, the importer may map it at any time).
    pub(super) fn shares(&self) -> bool {
        self.exported || !self.open.is_empty() || !self.pools.is_empty() || !self.events.is_empty()
    }

    /// Unmaps what was opened on guest device `dev` (its reset) and gives its count back.
    pub(super) fn release_device(
        &mut self,
        dev: usize,
        drv: &dyn DriverApi,
        quota: Option<&crate::limits::QuotaSlot>,
    ) {
        let gone: Vec<u64> = self
            .open
            .iter()
            .filter(|(_, m)| m.dev == dev)
            .map(|(&p, _)| p)
            .collect();
        for p in gone {
            if let Some(m) = self.open.remove(&p) {
                unmap(drv, &m);
                if let Some(q) = quota {
                    q.release(m.len);
                }
            }
        }
    }

    /// Unmaps everything (the session ends); with a sticky error (`driver` None) the
    /// corrupted driver is not called: the worker's exit frees it.
    pub(super) fn release_all(
        &mut self,
        driver: Option<&dyn DriverApi>,
        quota: Option<&crate::limits::QuotaSlot>,
    ) {
        for (_, m) in std::mem::take(&mut self.open) {
            if let Some(drv) = driver {
                unmap(drv, &m);
            }
            if let Some(q) = quota {
                q.release(m.len);
            }
        }
        if let Some(q) = quota {
            q.release(self.pool_pointers.values().sum());
        }
        // Imported pool allocations go with their pools (the contexts' teardown destroys
        // them); the worker's exit frees whatever is left.
        self.pool_pointers.clear();
        self.pools.clear();
        self.events.clear();
    }
}

pub(super) fn unmap(drv: &dyn DriverApi, m: &IpcMapping) {
    if let Ok(len) = usize::try_from(m.len) {
        let _ = drv.mem_unmap(m.va, len);
        let _ = drv.mem_address_free(m.va, len);
    }
}

/// Device memory placed for a managed allocation, at the address the program holds.
#[derive(Debug)]
pub(super) struct Placement {
    /// Bytes the guest maps (what migrates).
    pub(super) len: u64,
    /// Bytes reserved and backed on the device (`len` rounded up to `MANAGED_ALIGN`).
    pub(super) size: usize,
    /// The driver's allocation behind a placement of its own reservation; `None` for a large
    /// block of the session's device range (device_arena.rs), which a restore gives the same
    /// address again.
    pub(super) handle: Option<MemHandle>,
    /// The device address of the guest pages (registered, mapped elsewhere in this process);
    /// 0 until `HostMap` brings them, or while a restored placement waits for guest RAM
    /// (saved_host_memory.rs).
    pub(super) staging: u64,
    /// The guest device ordinal it was placed on.
    pub(super) dev: usize,
    /// The quota this placement holds `size` bytes of.
    pub(super) quota: Option<Arc<QuotaSlot>>,
    /// Inside this process's window reservation (the driver honoured a window address): the
    /// range goes back to the reservation when the placement goes.
    pub(super) in_window: bool,
    /// Placed by `ManagedPlace` and not yet taken by `HostMap`.
    pub(super) unmapped: bool,
}

/// A device's stream and event for migrations: the stream copies device → guest RAM apart
/// from the program's streams (the legacy stream would join a capture); the event marks the
/// last copy to the device, which the session's other streams wait for.
#[derive(Debug, Clone, Copy)]
pub(super) struct ManagedSync {
    pub(super) stream: Stream,
    pub(super) fence: Event,
}

/// The pre-copy hash kernel in one context (precopy.rs), with its non-blocking stream and two
/// device buffers for `capacity` ranges: the ranges (ptr, len) of a launch and their sums.
/// Its module, stream and buffers are the context's, and go with it.
#[derive(Debug)]
pub(super) struct PrecopyDevice {
    pub(super) func: Function,
    pub(super) stream: Stream,
    pub(super) ranges: u64,
    pub(super) sums: u64,
    pub(super) capacity: usize,
}

/// Physical memory under a session's range, through the driver's VMM calls: one `cuMemCreate`
/// per run, mapped and made accessible to the devices in `access`. The allocation handle is
/// released at once: the mapping keeps the memory, and unmapping frees it.
pub(super) struct VmmBacking<'a> {
    pub(super) drv: &'a dyn DriverApi,
    /// The device whose memory backs the range.
    pub(super) props: AllocProps,
    /// `(CUdevice, ACCESS_*)`: the owner, and peers that enabled access to it.
    pub(super) access: &'a [(i32, u32)],
}

impl Backing for VmmBacking<'_> {
    type Handle = ();

    fn map(&self, va: u64, len: u64) -> Result<(), ArenaError> {
        let size = usize::try_from(len).map_err(|_| ArenaError::BadSize)?;
        let drv = |e: CuError| ArenaError::Driver(e.0);
        let handle = self.drv.mem_create(size, &self.props).map_err(drv)?;
        let mapped = self.drv.mem_map(va, size, 0, handle);
        let _ = self.drv.mem_release(handle);
        mapped.map_err(drv)?;
        if let Err(e) = self.drv.mem_set_access(va, size, self.access) {
            let _ = self.drv.mem_unmap(va, size);
            return Err(drv(e));
        }
        Ok(())
    }

    fn unmap(&self, va: u64, len: u64, (): ()) {
        if let Ok(size) = usize::try_from(len) {
            let _ = self.drv.mem_unmap(va, size);
        }
    }
}

/// The reserved range of a session on one device and who may reach its memory.
#[derive(Debug)]
pub(super) struct ReservedRange {
    pub(super) arena: DeviceArena<()>,
    /// The `CUdevice` whose memory it holds.
    pub(super) gpu: i32,
    /// `(CUdevice, ACCESS_*)` of every device that reaches it: its own first, then peers.
    pub(super) access: Vec<(i32, u32)>,
}

impl ReservedRange {
    /// Its blocks' backing over `drv`.
    pub(super) fn backing<'a>(
        drv: &'a dyn DriverApi,
        gpu: i32,
        access: &'a [(i32, u32)],
    ) -> VmmBacking<'a> {
        VmmBacking {
            drv,
            // Not shareable: legacy IPC (`ipc.rs`) moves a run to shareable memory, at the same
            // address, the first time a block of it is exported, so programs that never share
            // never ask the driver for shareable memory.
            props: AllocProps {
                device: gpu,
                ..AllocProps::default()
            },
            access,
        }
    }
}

/// A restored mapping waiting for guest RAM.
#[derive(Debug)]
pub(super) enum Waiting {
    /// Pinned or registered memory, its local range held.
    Mapping {
        guest: u64,
        dev: usize,
        read_only: bool,
        dev_addr: u64,
        runs: Vec<HostRun>,
        held: HeldRange,
    },
    /// The guest pages of managed memory placed on the device.
    Staging {
        guest: u64,
        dev: usize,
        runs: Vec<HostRun>,
    },
}

impl Waiting {
    pub(super) fn dev(&self) -> usize {
        match self {
            Self::Mapping { dev, .. } | Self::Staging { dev, .. } => *dev,
        }
    }
}

/// A handle of the session: the references it holds of a physical allocation. As natively, a
/// handle retained from a mapping is the same value as the handle the allocation already has,
/// one reference more, and each `cuMemRelease` of it drops one (NCCL releases a retained handle
/// and then the original, by the same value).
#[derive(Debug)]
pub(super) struct HandleEntry {
    /// The driver's references, each released once; never empty.
    pub(super) raws: Vec<MemHandle>,
    pub(super) phys: u64,
}

impl HandleEntry {
    pub(super) fn raw(&self) -> MemHandle {
        self.raws[0]
    }
}

/// A physical allocation the session holds handles of or has mapped.
#[derive(Debug)]
pub(super) struct Phys {
    /// Guest ordinal of the device holding it.
    pub(super) dev: usize,
    /// Bytes counted against the quota (0 for what the session did not create).
    pub(super) charged: u64,
    /// Handles plus mappings: the driver frees it when this reaches 0.
    pub(super) refs: usize,
    /// Its size and properties, as created (for a restore); size 0: imported, not the
    /// session's own.
    pub(super) size: u64,
    pub(super) props: AllocProps,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Mapping {
    pub(super) size: u64,
    /// Offset in the physical allocation.
    pub(super) offset: u64,
    pub(super) phys: u64,
    /// Access has been granted to some device: copies may touch it.
    pub(super) accessible: bool,
}

/// The session's VMM objects.
#[derive(Debug)]
pub(super) struct VmmTables {
    pub(super) handles: HandleTable<HandleEntry>,
    pub(super) phys: HashMap<u64, Phys>,
    pub(super) next_phys: u64,
    /// Reservations: base -> size.
    pub(super) reserved: BTreeMap<u64, u64>,
    /// Mappings: address -> mapping.
    pub(super) maps: BTreeMap<u64, Mapping>,
    pub(super) quota: Option<Arc<QuotaSlot>>,
}

impl Default for VmmTables {
    fn default() -> Self {
        Self {
            handles: HandleTable::new(MAX_VMM_HANDLES),
            phys: HashMap::new(),
            next_phys: 0,
            reserved: BTreeMap::new(),
            maps: BTreeMap::new(),
            quota: None,
        }
    }
}

impl VmmTables {
    /// Whether `ptr..ptr + len` is mapped memory of the session with access set, over one or
    /// more adjacent mappings.
    pub(super) fn holds(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let Some((&va, m)) = self.maps.range(..=ptr).next_back() else {
            return false;
        };
        if !m.accessible || va + m.size <= ptr {
            return false;
        }
        let mut reached = va + m.size;
        while reached < end {
            match self.maps.get(&reached) {
                Some(m) if m.accessible => reached += m.size,
                _ => return false,
            }
        }
        true
    }

    /// The mapping holding `ptr`, with its address.
    pub(super) fn mapping_at(&self, ptr: u64) -> Option<(u64, Mapping)> {
        let (&va, &m) = self.maps.range(..=ptr).next_back()?;
        (ptr < va + m.size).then_some((va, m))
    }

    /// The addresses of the mappings that tile `ptr..ptr + size` exactly.
    pub(super) fn tiling(&self, ptr: u64, size: u64) -> Option<Vec<u64>> {
        let end = ptr.checked_add(size).filter(|_| size > 0)?;
        let mut at = ptr;
        let mut out = Vec::new();
        while at < end {
            let m = self.maps.get(&at)?;
            out.push(at);
            at += m.size;
        }
        (at == end).then_some(out)
    }

    /// Whether `ptr..ptr + size` lies in one reservation.
    pub(super) fn in_reservation(&self, ptr: u64, size: u64) -> bool {
        let Some(end) = ptr.checked_add(size) else {
            return false;
        };
        self.reserved
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &l)| end <= b + l)
    }

    /// Takes one reference of `phys` away; at the last, the driver freed it: the quota gets its
    /// bytes back.
    pub(super) fn unref(&mut self, phys: u64) {
        let gone = self.phys.get_mut(&phys).is_some_and(|p| {
            p.refs -= 1;
            p.refs == 0
        });
        if gone {
            if let (Some(p), Some(q)) = (self.phys.remove(&phys), &self.quota) {
                q.release(p.charged);
            }
        }
    }

    pub(super) fn new_phys(&mut self, dev: usize, charged: u64, props: AllocProps) -> u64 {
        self.next_phys += 1;
        self.phys.insert(
            self.next_phys,
            Phys {
                dev,
                charged,
                refs: 0,
                size: charged,
                props,
            },
        );
        self.next_phys
    }

    /// Adds a reference `raw` of `phys`: to the session's handle of it if it has one, else as
    /// a new handle. `None` (and the reference released) if the table or the count is full.
    pub(super) fn add_handle(
        &mut self,
        ids: &mut HandleCounter,
        drv: &dyn DriverApi,
        raw: MemHandle,
        phys: u64,
    ) -> Option<u64> {
        let existing = self.handles.find(|h| h.phys == phys).map(|(id, _)| id);
        let id = match existing {
            Some(id) => match self.handles.get_mut(id) {
                Some(h) if h.raws.len() < MAX_HANDLE_REFS => {
                    h.raws.push(raw);
                    Some(id)
                }
                _ => None,
            },
            None => self.handles.insert(
                ids,
                HandleEntry {
                    raws: vec![raw],
                    phys,
                },
            ),
        };
        let Some(id) = id else {
            let _ = drv.mem_release(raw);
            return None;
        };
        if let Some(p) = self.phys.get_mut(&phys) {
            p.refs += 1;
        }
        Some(id)
    }

    /// The driver's handle behind the session's allocation handle `id`.
    pub(super) fn handle_raw(&self, id: u64) -> Option<MemHandle> {
        self.handles.get(id).map(HandleEntry::raw)
    }

    /// A handle of an allocation another process made (imported, `ipc.rs`): a physical
    /// allocation of its own, worked on in the context of guest device `dev` (the importer's;
    /// the memory may be a peer's), `charged` bytes already counted for it against the quota
    /// (given back when the driver frees it here). `None` (and `raw`
    /// released) if the table is full.
    pub(super) fn adopt(
        &mut self,
        ids: &mut HandleCounter,
        drv: &dyn DriverApi,
        raw: MemHandle,
        dev: usize,
        charged: u64,
    ) -> Option<u64> {
        let phys = self.new_phys(dev, charged, AllocProps::default());
        if let Some(p) = self.phys.get_mut(&phys) {
            // Not the session's own: a save refuses it (size 0: not made here).
            p.size = 0;
        }
        let id = self.add_handle(ids, drv, raw, phys);
        if id.is_none() {
            // Released by add_handle: the count goes back with it.
            if let Some(p) = self.phys.get_mut(&phys) {
                p.refs = 1;
            }
            self.unref(phys);
        }
        id
    }

    /// Bytes counted for the allocation behind handle `id` (its size, for what the session
    /// created or imported with a size).
    pub(super) fn handle_size(&self, id: u64) -> u64 {
        self.handles
            .get(id)
            .and_then(|h| self.phys.get(&h.phys))
            .map_or(0, |p| p.charged)
    }

    /// Whether the quota slot has not been looked up yet.
    pub(super) fn quota_unset(&self) -> bool {
        self.quota.is_none()
    }

    /// The quota slot imports and creations count against.
    pub(super) fn set_quota(&mut self, quota: Option<Arc<QuotaSlot>>) {
        self.quota = quota;
    }

    /// Unmaps, frees and releases everything (the session ends), and gives the quota back.
    /// Best effort: the worker's exit frees whatever the driver refuses now. With a sticky
    /// error (`driver` None) the corrupted driver is not called at all.
    pub(super) fn release_all(&mut self, driver: Option<&dyn DriverApi>) {
        for (va, m) in std::mem::take(&mut self.maps) {
            if let Some(drv) = driver {
                let _ = drv.mem_unmap(va, to_usize(m.size).unwrap_or(usize::MAX));
            }
            self.unref(m.phys);
        }
        for (va, size) in std::mem::take(&mut self.reserved) {
            if let Some(drv) = driver {
                let _ = drv.mem_address_free(va, to_usize(size).unwrap_or(usize::MAX));
            }
        }
        let mut handles = Vec::new();
        self.handles.retain(|h| {
            handles.extend(h.raws.iter().map(|&r| (r, h.phys)));
            false
        });
        for (raw, phys) in handles {
            if let Some(drv) = driver {
                let _ = drv.mem_release(raw);
            }
            self.unref(phys);
        }
    }
}

/// One device's range while paused: its runs, the live blocks in them, and the runs'
/// contents.
#[derive(Debug)]
pub(super) struct PausedRange {
    pub(super) dev: usize,
    pub(super) runs: Vec<ArenaRun>,
    pub(super) live: Vec<(u64, u64)>,
    pub(super) contents: Vec<Vec<u8>>,
}

/// A recording and what the session keeps for it.
#[derive(Debug)]
pub(super) struct Tracing {
    pub(super) rec: Recorder,
    pub(super) events: Option<EventTimer>,
    /// The request running now (the batch, for the records of a batch).
    pub(super) current: u64,
}

/// An op timed with events, waiting for its end event.
#[derive(Debug)]
pub(super) struct Timed {
    pub(super) dev: usize,
    /// The op's stream.
    pub(super) stream: Stream,
    pub(super) start: Event,
    pub(super) end: Event,
    /// The reference the events are measured against: its event and host time.
    pub(super) reference: (Event, u64),
    /// The record, its times filled in when the end event completes.
    pub(super) rec: TraceRecord,
}

/// The event timer of a recording (see the module's documentation).
#[derive(Debug, Default)]
pub(super) struct EventTimer {
    /// Per device: the timer's stream and the current reference (event, host ns).
    pub(super) devices: HashMap<usize, (Stream, Event, u64)>,
    pub(super) spare: HashMap<usize, Vec<Event>>,
    pub(super) pending: VecDeque<Timed>,
    /// Driver stream ids by (device, guest stream handle).
    pub(super) stream_ids: HashMap<(usize, u64), u64>,
    pub(super) lost: u64,
}

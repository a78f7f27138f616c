//! Managed memory (`cudaMallocManaged`) resident on the device, and its migrations.
//!
//! The host places device memory at the allocation's own address (memory/host.rs,
//! `ManagedPlace` and `HOST_MAP_MANAGED`), so kernels, copies and the GPU's atomics reach device
//! memory, as natively; the program's loads and stores reach the guest pages at the same
//! address. The two are kept coherent at the turns CUDA's model for devices without concurrent
//! managed access (`concurrentManagedAccess` = 0, what qcuda reports) defines:
//!
//! - before work that may touch managed memory is queued (a kernel or graph launch, a copy, a
//!   memset) on a stream of device D, every managed allocation of D in the host's turn that the
//!   stream may reach is copied guest RAM → device on that stream (`ManagedMigrate`,
//!   fire-and-forget, in stream order before the work; the host orders the device's other
//!   streams after the copy), and is in the device's turn. An allocation attached globally
//!   (`cudaMemAttachGlobal`, the default) is reachable from every stream of its device; one
//!   attached to a stream (`cudaMemAttachSingle`) from that stream only; one attached to the
//!   host (`cudaMemAttachHost`) from none, so the CPU may use it while kernels run;
//! - after a synchronising call (device, stream or event synchronisation, a blocking copy),
//!   every allocation in the device's turn is copied device → guest RAM (answered when done)
//!   and is in the host's turn, once no work that may touch it can still run: none of the
//!   device's streams busy for a global attachment, its stream idle for a single one. Until
//!   then it stays the device's (CUDA gives the CPU no access then either).
//!
//! The choice is conservative: after a synchronisation the host may have written any managed
//! allocation, so the next launch copies each one back to the device, whole; and a launch may
//! have written any of them, so the next synchronisation copies each one to guest RAM. That
//! costs two driver copies per allocation per launch-and-synchronise turn (at DMA rate, no byte
//! on the virtqueue) and nothing when the program has no managed memory or makes no turn. A
//! program that touches managed memory from the CPU while work that may reach it runs breaks
//! the model, as it would natively on such a device.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, MutexGuard, PoisonError,
    },
};

use qcuda_proto::{
    Op, MANAGED_SCOPE_GLOBAL, MANAGED_SCOPE_STREAM, MANAGED_TO_DEVICE, MANAGED_TO_HOST,
};

use crate::core::{
    cuda_error::CudaResult,
    transport::{session::Session, Call},
};

/// Whose turn an allocation is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// The CPU may have written guest RAM; the device copy is stale until the next work.
    Host,
    /// Work may have written the device memory; guest RAM is stale until a synchronisation.
    Device,
}

/// Which streams' work may touch an allocation (`cudaMemAttach*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// Every stream of its device (`cudaMemAttachGlobal`).
    Global,
    /// None: the CPU's alone (`cudaMemAttachHost`).
    Host,
    /// One stream, by its wire handle (`cudaMemAttachSingle`).
    Stream(u64),
}

impl Attach {
    /// The attachment `cudaMallocManaged`'s flags ask for (cudaMemAttachHost is 2).
    pub fn of_alloc_flags(flags: u32) -> Self {
        if flags == 2 {
            Self::Host
        } else {
            Self::Global
        }
    }

    /// Whether work on `stream` may touch it.
    fn reached_from(self, stream: u64) -> bool {
        match self {
            Self::Global => true,
            Self::Host => false,
            Self::Stream(s) => s == stream,
        }
    }

    /// `ManagedMigrate`'s stream and scope arguments for it (work on `stream` going first).
    fn scope(self, stream: u64) -> (u64, u64) {
        match self {
            Self::Stream(s) => (s, MANAGED_SCOPE_STREAM),
            Self::Global | Self::Host => (stream, MANAGED_SCOPE_GLOBAL),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    device: u32,
    turn: Turn,
    /// What the program attached it to last.
    attach: Attach,
    /// What it was attached to when it went to the device (its work is waited for by that).
    went: Attach,
}

/// The process's managed allocations on the device, by base address.
#[derive(Debug, Default)]
pub struct ManagedTurns {
    allocs: Mutex<BTreeMap<usize, Entry>>,
    /// Allocations in the table; 0 keeps launches and synchronisations free of any work here.
    live: AtomicUsize,
    /// Allocations in the device's turn; 0 makes a synchronisation free of any work here.
    on_device: AtomicUsize,
}

impl ManagedTurns {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, Entry>> {
        self.allocs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new allocation at `base` on `device`, in the host's turn, attached as
    /// `cudaMallocManaged`'s `flags` say.
    pub fn insert(&self, base: usize, device: u32, flags: u32) {
        let attach = Attach::of_alloc_flags(flags);
        let entry = Entry {
            device,
            turn: Turn::Host,
            attach,
            went: attach,
        };
        if self.lock().insert(base, entry).is_none() {
            self.live.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// `cudaStreamAttachMemAsync` of the allocation at `base`: from its next turn on, `attach`
    /// says which streams' work may touch it.
    pub fn attach(&self, base: usize, attach: Attach) {
        if let Some(e) = self.lock().get_mut(&base) {
            e.attach = attach;
        }
    }

    /// Stream `wire` is destroyed: what was attached to it alone is attached globally (its
    /// work, done or not, is then waited for as the device's).
    pub fn forget_stream(&self, wire: u64) {
        for e in self.lock().values_mut() {
            if e.attach == Attach::Stream(wire) {
                e.attach = Attach::Global;
            }
            if e.went == Attach::Stream(wire) {
                e.went = Attach::Global;
            }
        }
    }

    /// The allocation at `base` is gone (nothing if it was not managed memory on the device).
    pub fn remove(&self, base: usize) {
        if let Some(e) = self.lock().remove(&base) {
            self.live.fetch_sub(1, Ordering::AcqRel);
            if e.turn == Turn::Device {
                self.on_device.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Managed allocations on the device (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ManagedTurns {
    /// Before work that may touch managed memory is queued on `stream` (wire handle) of
    /// `device`: hands the device every allocation of it in the host's turn.
    pub fn before_work(&self, session: &Session, device: u32, stream: u64) -> CudaResult<()> {
        if self.live.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let capturing = session.captures.active();
        let mut allocs = self.lock();
        for (&base, e) in allocs.iter_mut() {
            if e.device != device || e.turn != Turn::Host || !e.attach.reached_from(stream) {
                continue;
            }
            let (_, scope) = e.attach.scope(stream);
            let call = Call::new(Op::ManagedMigrate, device).args(&[
                base as u64,
                MANAGED_TO_DEVICE,
                stream,
                scope,
            ]);
            if capturing {
                // The call waits (as every call does during a capture): a capturing stream
                // moves nothing (rets[0] = 0), and the allocation stays in the host's turn.
                if session.submit(call)?.rets[0] == 0 {
                    continue;
                }
            } else {
                session.submit(call.fire_and_forget())?;
            }
            e.turn = Turn::Device;
            e.went = e.attach;
            self.on_device.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// After a synchronising call that succeeded: hands the host every allocation in the
    /// device's turn that no work can touch any more (the host judges; the others stay the
    /// device's).
    pub fn after_sync(&self, session: &Session) -> CudaResult<()> {
        if self.on_device.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let mut allocs = self.lock();
        for (&base, e) in allocs.iter_mut() {
            if e.turn != Turn::Device {
                continue;
            }
            let (stream, scope) = e.went.scope(0);
            let moved = session
                .submit(Call::new(Op::ManagedMigrate, e.device).args(&[
                    base as u64,
                    MANAGED_TO_HOST,
                    stream,
                    scope,
                ]))?
                .rets[0];
            if moved == 0 {
                continue;
            }
            e.turn = Turn::Host;
            self.on_device.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Whether one of `ranges` lies in a managed allocation in the device's turn; `end_of`
    /// gives the end of the allocation at a base address (the host memory table's record).
    pub fn device_turn_in(
        &self,
        ranges: &[(u64, usize)],
        end_of: impl Fn(usize) -> Option<usize>,
    ) -> bool {
        if self.on_device.load(Ordering::Acquire) == 0 {
            return false;
        }
        let allocs = self.lock();
        ranges.iter().any(|&(addr, len)| {
            let Ok(addr) = usize::try_from(addr) else {
                return false;
            };
            allocs
                .range(..addr.saturating_add(len))
                .any(|(&b, e)| e.turn == Turn::Device && end_of(b).is_some_and(|end| end > addr))
        })
    }
}

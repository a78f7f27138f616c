//! Managed memory (`cudaMallocManaged`) resident on the device, and its migrations.
//!
//! The host places device memory at the allocation's own address (host_memory.rs,
//! `HOST_MAP_MANAGED`), so kernels, copies and the GPU's atomics reach device memory, as
//! natively; the program's loads and stores reach the guest pages at the same address. The two
//! are kept coherent at the turns CUDA's model for devices without concurrent managed access
//! (`concurrentManagedAccess` = 0, what qcuda reports) defines:
//!
//! - before work that may touch managed memory is queued (a kernel or graph launch, a copy, a
//!   memset) on a stream of device D, every managed allocation of D in the host's turn is
//!   copied guest RAM → device on that stream (`ManagedMigrate`, fire-and-forget, in stream
//!   order before the work), and is in the device's turn;
//! - after a synchronising call (device, stream or event synchronisation, a blocking copy),
//!   every allocation in the device's turn is copied device → guest RAM (answered when done),
//!   and is in the host's turn.
//!
//! The choice is conservative: after a synchronisation the host may have written any managed
//! allocation, so the next launch copies each one back to the device, whole; and a launch may
//! have written any of them, so the next synchronisation copies each one to guest RAM. That
//! costs two driver copies per allocation per launch-and-synchronise turn (at DMA rate, no byte
//! on the virtqueue) and nothing when the program has no managed memory or makes no turn. A
//! program that touches managed memory from the CPU while kernels run breaks the model, as it
//! would natively on such a device.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, MutexGuard, PoisonError,
    },
};

use qcuda_proto::{Op, MANAGED_TO_DEVICE, MANAGED_TO_HOST};

use crate::core::{cuda_error::CudaResult, runtime::Runtime, transport::Call};

/// Whose turn an allocation is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// The CPU may have written guest RAM; the device copy is stale until the next work.
    Host,
    /// Work may have written the device memory; guest RAM is stale until a synchronisation.
    Device,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    device: u32,
    turn: Turn,
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

    /// A new allocation at `base` on `device`, in the host's turn.
    pub fn insert(&self, base: usize, device: u32) {
        let turn = Turn::Host;
        if self.lock().insert(base, Entry { device, turn }).is_none() {
            self.live.fetch_add(1, Ordering::AcqRel);
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

/// Before work that may touch managed memory is queued on `stream` (wire handle) of `device`:
/// hands the device every allocation of it in the host's turn.
pub fn before_work(rt: &Runtime, device: u32, stream: u64) -> CudaResult<()> {
    let t = &rt.host_memory.managed;
    if t.live.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let capturing = rt.session.captures.active();
    let mut allocs = t.lock();
    for (&base, e) in allocs.iter_mut() {
        if e.device != device || e.turn != Turn::Host {
            continue;
        }
        let call =
            Call::new(Op::ManagedMigrate, device).args(&[base as u64, MANAGED_TO_DEVICE, stream]);
        if capturing {
            // The call waits (as every call does during a capture): a capturing stream moves
            // nothing (rets[0] = 0), and the allocation stays in the host's turn.
            if rt.session.submit(call)?.rets[0] == 0 {
                continue;
            }
        } else {
            rt.session.submit(call.fire_and_forget())?;
        }
        e.turn = Turn::Device;
        t.on_device.fetch_add(1, Ordering::AcqRel);
    }
    Ok(())
}

/// After a synchronising call that succeeded: hands the host every allocation in the device's
/// turn.
pub fn after_sync(rt: &Runtime) -> CudaResult<()> {
    let t = &rt.host_memory.managed;
    if t.on_device.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let mut allocs = t.lock();
    for (&base, e) in allocs.iter_mut() {
        if e.turn != Turn::Device {
            continue;
        }
        rt.session
            .submit(Call::new(Op::ManagedMigrate, e.device).args(&[
                base as u64,
                MANAGED_TO_HOST,
                0,
            ]))?;
        e.turn = Turn::Host;
        t.on_device.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(())
}

/// Before a blocking copy that the CPU does itself (host to host) from or to `ranges`: where
/// one lies in a managed allocation in the device's turn, the copy waits for the work queued
/// on `stream` of `device` and the host takes its turn first, so it reads and writes what the
/// device left there (a blocking `cudaMemcpy` is ordered after earlier work, as natively).
pub fn before_cpu_copy(
    rt: &Runtime,
    device: u32,
    stream: u64,
    ranges: &[(u64, usize)],
) -> CudaResult<()> {
    let t = &rt.host_memory.managed;
    if t.on_device.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let touches = {
        let allocs = t.lock();
        ranges.iter().any(|&(addr, len)| {
            let Ok(addr) = usize::try_from(addr) else {
                return false;
            };
            allocs.range(..addr.saturating_add(len)).any(|(&b, e)| {
                e.turn == Turn::Device
                    && rt
                        .host_memory
                        .find(b)
                        .is_some_and(|a| a.base + a.size > addr)
            })
        })
    };
    if !touches {
        return Ok(());
    }
    rt.session
        .submit(Call::new(Op::StreamSynchronize, device).args(&[stream]))?;
    crate::core::managed_vars::after_sync(rt)
}

//! The device allocations this process made (`cudaMalloc`), kept on the guest side so that
//! `cudaMemcpyDefault` and `cudaPointerGetAttributes` can tell device from host pointers without
//! a round trip. The host keeps its own table and stays the authority on what may be accessed.

use std::{
    collections::BTreeMap,
    sync::{Mutex, PoisonError},
};

/// One `cudaMalloc` allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Device address of the first byte.
    pub base: u64,
    /// Size in bytes (nonzero).
    pub size: u64,
    /// The device it lives on.
    pub device: u32,
    /// How it was made, which decides what pointer queries answer of it (runtime/pointer_attrs.rs).
    pub origin: Origin,
}

/// How a device allocation was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `cudaMalloc`/`cuMemAlloc` or their pitched forms: memory of the device's primary
    /// context, and what CUDA's legacy IPC exports
    /// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`).
    Malloc,
    /// Stream-ordered memory (`cudaMallocAsync`) of the pool with this application handle, or
    /// of the device's current pool (0).
    Pool(usize),
    /// A graph's memory allocation node.
    Graph,
    /// A VMM mapping (vmm.rs knows its range and its physical allocation).
    Vmm,
    /// Another process's allocation opened with `cudaIpcOpenMemHandle`.
    IpcOpened,
    /// Another process's stream-ordered allocation, from the imported pool with this
    /// application handle (`cudaMemPoolImportPointer`).
    PoolImport(usize),
}

impl Allocation {
    /// Whether legacy IPC (`cudaIpcGetMemHandle`) exports it.
    pub fn legacy_ipc(&self) -> bool {
        self.origin == Origin::Malloc
    }

    /// Whether a context owns it (the device's primary one): stream-ordered, graph and VMM
    /// memory belong to no context (`CU_POINTER_ATTRIBUTE_CONTEXT` is NULL for them).
    pub fn in_context(&self) -> bool {
        matches!(self.origin, Origin::Malloc | Origin::IpcOpened)
    }
}

/// A new process-wide unique buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`), for device and host
/// memory alike: never reused, unlike addresses.
pub fn next_buffer_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Live device allocations, by base address.
#[derive(Debug, Default)]
pub struct Allocations {
    by_base: Mutex<BTreeMap<u64, Allocation>>,
    /// Each live allocation's buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): unique for the
    /// life of the process, unlike base addresses, which the driver reuses.
    ids: Mutex<BTreeMap<u64, u64>>,
}

impl Allocations {
    /// Records a new allocation.
    pub fn insert(&self, a: Allocation) {
        let id = next_buffer_id();
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(a.base, id);
        self.lock().insert(a.base, a);
    }

    /// Forgets the allocation starting at `base`.
    pub fn remove(&self, base: u64) -> Option<Allocation> {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&base);
        self.lock().remove(&base)
    }

    /// The buffer id of the allocation starting at `base`.
    pub fn buffer_id(&self, base: u64) -> Option<u64> {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&base)
            .copied()
    }

    /// The allocation containing `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<Allocation> {
        let map = self.lock();
        let (_, a) = map.range(..=addr).next_back()?;
        (addr - a.base < a.size).then_some(*a)
    }

    /// Forgets the allocations of `device` (the host freed them in `DeviceReset`).
    pub fn forget_device(&self, device: u32) {
        self.lock().retain(|_, a| a.device != device);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Allocation>> {
        self.by_base.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_covers_exactly_the_allocation() {
        let t = Allocations::default();
        t.insert(Allocation {
            base: 0x1000,
            size: 0x100,
            device: 0,
            origin: Origin::Malloc,
        });
        t.insert(Allocation {
            base: 0x2000,
            size: 0x10,
            device: 1,
            origin: Origin::Graph,
        });
        assert_eq!(t.find(0xfff), None);
        assert_eq!(t.find(0x1000).unwrap().base, 0x1000);
        assert_eq!(t.find(0x10ff).unwrap().base, 0x1000);
        assert_eq!(t.find(0x1100), None);
        assert_eq!(t.find(0x200f).unwrap().device, 1);
        t.forget_device(1);
        assert_eq!(t.find(0x2000), None);
        assert_eq!(t.remove(0x1000).unwrap().size, 0x100);
        assert_eq!(t.find(0x1000), None);
    }
}

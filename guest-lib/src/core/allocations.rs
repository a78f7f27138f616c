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
    /// Made by `cudaMalloc`/`cuMemAlloc` or their pitched forms: memory CUDA's legacy IPC
    /// exports (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`), unlike pool, graph, VMM and
    /// imported memory.
    pub legacy_ipc: bool,
}

/// Live device allocations, by base address.
#[derive(Debug, Default)]
pub struct Allocations {
    by_base: Mutex<BTreeMap<u64, Allocation>>,
    /// Each live allocation's buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): unique for the
    /// life of the process, unlike base addresses, which the driver reuses.
    ids: Mutex<BTreeMap<u64, u64>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl Allocations {
    /// Records a new allocation.
    pub fn insert(&self, a: Allocation) {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
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
            legacy_ipc: true,
        });
        t.insert(Allocation {
            base: 0x2000,
            size: 0x10,
            device: 1,
            legacy_ipc: false,
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

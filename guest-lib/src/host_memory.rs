//! "Pinned" host memory: `cudaMallocHost`, `cudaHostAlloc`, `cudaFreeHost`.
//!
//! For now this is plain page-aligned anonymous memory (mmap), copied like any pageable buffer.
//! Zero-copy pinned memory (mmapped from /dev/qcuda and registered on the host, DESIGN.md §5)
//! replaces it later; the allocation table here is what it will hang off.

use std::{
    collections::BTreeMap,
    sync::{Mutex, PoisonError},
};

use crate::cuda_error::{CudaError, CudaResult};

/// One host allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostAllocation {
    /// Address of the first byte.
    pub base: usize,
    /// Bytes asked for.
    pub size: usize,
    /// Bytes mapped (size rounded up to pages).
    mapped: usize,
    /// `cudaHostAlloc*` flags.
    pub flags: u32,
    /// The device that was current when it was allocated.
    pub device: u32,
}

/// Live host allocations, by base address.
#[derive(Debug, Default)]
pub struct HostAllocations {
    by_base: Mutex<BTreeMap<usize, HostAllocation>>,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(4096)
}

impl HostAllocations {
    /// Allocates `size` bytes, page-aligned and zeroed. Zero bytes gives a null pointer.
    pub fn alloc(&self, size: usize, flags: u32, device: u32) -> CudaResult<usize> {
        if size == 0 {
            return Ok(0);
        }
        let page = page_size();
        let mapped = size
            .checked_add(page - 1)
            .ok_or(CudaError::MEMORY_ALLOCATION)?
            & !(page - 1);
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
        // no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let base = p as usize;
        self.lock().insert(
            base,
            HostAllocation {
                base,
                size,
                mapped,
                flags,
                device,
            },
        );
        Ok(base)
    }

    /// Frees an allocation made by [`alloc`](Self::alloc). Null is a no-op; any other pointer
    /// that is not the start of one is `cudaErrorInvalidValue`.
    pub fn free(&self, base: usize) -> CudaResult<()> {
        if base == 0 {
            return Ok(());
        }
        let a = self.lock().remove(&base).ok_or(CudaError::INVALID_VALUE)?;
        // SAFETY: `base..base + mapped` is exactly a mapping we created and just removed from
        // the table, so nothing of ours refers to it any more; the application gave it back.
        unsafe { libc::munmap(a.base as *mut libc::c_void, a.mapped) };
        Ok(())
    }

    /// The allocation containing `addr`, if any.
    pub fn find(&self, addr: usize) -> Option<HostAllocation> {
        let map = self.lock();
        let (_, a) = map.range(..=addr).next_back()?;
        (addr - a.base < a.size).then_some(*a)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, HostAllocation>> {
        self.by_base.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_is_page_aligned_zeroed_writable_and_freed_once() {
        let t = HostAllocations::default();
        let p = t.alloc(10_000, 0, 0).unwrap();
        assert_eq!(p % page_size(), 0);
        // SAFETY: `p` is a fresh 10 000-byte read-write mapping.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, 10_000) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[9_999] = 7;
        assert_eq!(t.find(p + 9_999).unwrap().base, p);
        assert_eq!(t.find(p + 10_000), None);
        assert_eq!(t.free(p + 1), Err(CudaError::INVALID_VALUE));
        t.free(p).unwrap();
        assert_eq!(t.free(p), Err(CudaError::INVALID_VALUE));
        assert_eq!(t.alloc(0, 0, 0), Ok(0));
        assert_eq!(t.free(0), Ok(()));
    }
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
//! Page-aligned anonymous memory for test buffers. The transport treats buffers differently by
//! size and by where they start in a page (bounce copy vs pinned pages, page-crossing runs), so
//! the tests place buffers at exact offsets from a page boundary, which `Vec` cannot promise.

use std::{io, ptr::NonNull};

use crate::call_plan::PAGE_LEN;

/// An anonymous private mapping, unmapped on drop.
///
/// # Invariants
/// `ptr` is the start of a live mapping of `len` bytes (a multiple of the page size) that this
/// value owns exclusively; it is readable, and writable unless made by [`PageBuffer::read_only`].
#[derive(Debug)]
pub struct PageBuffer {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: PageBuffer owns its mapping like a Box owns its allocation; it has no thread affinity.
unsafe impl Send for PageBuffer {}
// SAFETY: shared access only reads (`as_slice`); writes need `&mut self`.
unsafe impl Sync for PageBuffer {}

impl PageBuffer {
    /// A zeroed, writable buffer of at least `len` bytes (at least one page).
    pub fn new(len: usize) -> io::Result<Self> {
        Self::map(len, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// A buffer the process may only read: the kernel must refuse to write a response into it.
    pub fn read_only(len: usize) -> io::Result<Self> {
        Self::map(len, libc::PROT_READ)
    }

    fn map(len: usize, prot: libc::c_int) -> io::Result<Self> {
        let len = len
            .max(1)
            .checked_next_multiple_of(PAGE_LEN)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
        // no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Self {
            ptr,
            len,
            writable: prot & libc::PROT_WRITE != 0,
        })
    }

    /// Bytes in the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The user address of byte `offset`, for building raw calls.
    pub fn addr(&self, offset: usize) -> u64 {
        assert!(
            offset <= self.len,
            "offset {offset} beyond {} bytes",
            self.len
        );
        self.ptr.as_ptr() as u64 + offset as u64
    }

    /// The whole mapping.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: by the invariant the mapping is live, readable and `len` bytes long; the
        // shared borrow of `self` keeps it from being written or unmapped meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole mapping, writable. Panics for a read-only buffer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        assert!(self.writable, "read-only buffer");
        // SAFETY: by the invariant the mapping is live, writable (checked) and `len` bytes long;
        // the exclusive borrow of `self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageBuffer {
    fn drop(&mut self) {
        // SAFETY: by the invariant this value owns the mapping; no borrow of it outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_plan::PAGE_SIZE;

    #[test]
    fn is_page_aligned_zeroed_and_rounded_up() {
        let mut b = PageBuffer::new(5000).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(b.addr(0) % PAGE_SIZE, 0);
        assert_eq!(b.addr(1), b.addr(0) + 1);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[8191] = 7;
        assert_eq!(b.as_slice()[8191], 7);
    }

    #[test]
    fn read_only_reads_zero() {
        let b = PageBuffer::read_only(1).unwrap();
        assert_eq!(b.len(), 4096);
        assert!(b.as_slice().iter().all(|&x| x == 0));
    }
}

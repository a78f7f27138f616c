// SPDX-License-Identifier: Apache-2.0 OR MIT
//! Counters shared between the kill-test parent and its children through a shared anonymous
//! mapping, so the parent can see, without any syscall on the child's side, whether a child has
//! finished a call and whether it is inside one right now.

use std::{
    io,
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

/// One child's slot.
#[derive(Debug)]
#[repr(C)]
pub struct Slot {
    /// Calls completed.
    pub calls: AtomicU64,
    /// 1 while the child is inside the ioctl (set just before, cleared just after).
    pub in_call: AtomicU64,
}

/// `count` slots in a `MAP_SHARED` mapping; children forked after it was made share it.
///
/// # Invariants
/// `ptr` is the start of a live, zero-initialised, read-write shared mapping that holds `count`
/// [`Slot`]s and is owned by this value.
#[derive(Debug)]
pub struct SharedSlots {
    ptr: NonNull<Slot>,
    count: usize,
}

impl SharedSlots {
    /// Maps `count` zeroed slots.
    pub fn new(count: usize) -> io::Result<Self> {
        let bytes = count.max(1) * std::mem::size_of::<Slot>();
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing touches no
        // existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<Slot>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Self { ptr, count })
    }

    /// Slot `i`.
    pub fn get(&self, i: usize) -> &Slot {
        assert!(i < self.count, "slot {i} of {}", self.count);
        // SAFETY: by the invariant the mapping holds `count` slots, page-aligned (so every
        // Slot is aligned); zeroed memory is a valid AtomicU64 pair. Other processes touch it
        // only through atomics, which is what makes the sharing sound.
        unsafe { &*self.ptr.as_ptr().add(i) }
    }
}

impl Drop for SharedSlots {
    fn drop(&mut self) {
        let bytes = self.count.max(1) * std::mem::size_of::<Slot>();
        // SAFETY: by the invariant this value owns the mapping; no `&Slot` outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), bytes) };
    }
}

impl Slot {
    /// Calls completed so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Whether the child is inside a call.
    pub fn in_call(&self) -> bool {
        self.in_call.load(Ordering::SeqCst) != 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::child_process::{self, ChildEnd};

    #[test]
    fn a_child_sees_and_updates_the_same_memory() {
        let slots = SharedSlots::new(3).unwrap();
        slots.get(2).calls.store(40, Ordering::SeqCst);
        let mut c = child_process::fork(|| {
            let s = slots.get(2);
            s.calls.fetch_add(2, Ordering::SeqCst);
            s.in_call.store(1, Ordering::SeqCst);
            0
        })
        .unwrap();
        assert_eq!(
            c.wait_timeout(Duration::from_secs(10)).unwrap(),
            Some(ChildEnd::Exited(0))
        );
        assert_eq!(slots.get(2).calls(), 42);
        assert!(slots.get(2).in_call());
        assert!(!slots.get(0).in_call());
    }
}

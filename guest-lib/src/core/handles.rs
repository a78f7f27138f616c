//! Application-visible handles for host objects (streams, events).
//!
//! The host's own handle values could be anything, including 1 and 2, which CUDA reserves for
//! `cudaStreamLegacy` and `cudaStreamPerThread`. So the application gets the address of a small
//! guest-side record instead, as NVIDIA's runtime hands out addresses of its own records, and
//! every use looks the handle up: an unknown or destroyed handle is
//! `cudaErrorInvalidResourceHandle`, never a wild pointer.

use std::sync::{Mutex, PoisonError};

use crate::core::addr_map::AddrMap;

/// Handles to records of type `T`.
#[derive(Debug)]
pub struct HandleTable<T> {
    records: Mutex<AddrMap<usize, Box<T>>>,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        Self {
            records: Mutex::default(),
        }
    }
}

impl<T: Copy> HandleTable<T> {
    /// Stores `record`; the handle is its heap address, unique while it is stored.
    pub fn insert(&self, record: T) -> usize {
        // A zero-sized record would give every handle the same address.
        const { assert!(size_of::<T>() > 0) };
        let boxed = Box::new(record);
        let handle = &raw const *boxed as usize;
        self.lock().insert(handle, boxed);
        handle
    }

    /// The record of `handle`.
    pub fn get(&self, handle: usize) -> Option<T> {
        self.lock().get(&handle).map(|b| **b)
    }

    /// Removes and returns the record of `handle`.
    pub fn remove(&self, handle: usize) -> Option<T> {
        self.lock().remove(&handle).map(|b| *b)
    }

    /// The handle of a record for which `pred` is true (any one).
    pub fn find(&self, mut pred: impl FnMut(&T) -> bool) -> Option<usize> {
        self.lock().iter().find(|(_, r)| pred(r)).map(|(h, _)| *h)
    }

    /// Drops every record for which `keep` is false.
    pub fn retain(&self, mut keep: impl FnMut(&T) -> bool) {
        self.lock().retain(|_, r| keep(r));
    }

    /// Whether no handle is live.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AddrMap<usize, Box<T>>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_unique_addresses_and_removable() {
        let t = HandleTable::<u64>::default();
        let a = t.insert(10);
        let b = t.insert(20);
        assert_ne!(a, b);
        assert!(
            a > 2 && b > 2,
            "never collides with cudaStreamLegacy/PerThread"
        );
        assert_eq!(t.get(a), Some(10));
        assert_eq!(t.remove(a), Some(10));
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        t.retain(|v| *v != 20);
        assert_eq!(t.get(b), None);
        assert!(t.is_empty());
    }
}

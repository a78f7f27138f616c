//! Maps keyed by addresses and handles, on the paths every launch and copy takes.
//!
//! The standard map hashes with SipHash, built to resist keys chosen by an attacker; here the
//! keys are the process's own addresses and handle values (the application is the only one
//! that can choose them, and it can only slow itself), and one SipHash of a `usize` costs more
//! than the rest of a lookup. [`AddrHasher`] mixes a key with one multiplication (Fibonacci
//! hashing) instead, which spreads aligned addresses over the table's buckets.

use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
};

/// A `HashMap` whose keys are addresses or handles (see the module documentation).
pub type AddrMap<K, V> = HashMap<K, V, BuildHasherDefault<AddrHasher>>;

/// The hasher of [`AddrMap`]: integer keys only.
#[derive(Debug, Default, Clone, Copy)]
pub struct AddrHasher(u64);

/// 2^64 divided by the golden ratio: consecutive multiples spread evenly.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        // hashbrown takes its bucket from the low bits and a tag from the top 7: fold the
        // well-mixed high half down so both are spread.
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not an integer key (never used so): mix byte by byte.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(GOLDEN);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_addresses_land_in_different_buckets() {
        let mut buckets = std::collections::HashSet::new();
        for i in 0..256u64 {
            let mut h = AddrHasher::default();
            h.write_u64(0x7f00_0000_0000 + i * 4096);
            buckets.insert(h.finish() & 255);
        }
        // Page-aligned keys: a hash of the low bits alone would put all in one bucket.
        assert!(buckets.len() > 128, "{} of 256 buckets", buckets.len());
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut m: AddrMap<usize, usize> = AddrMap::default();
        for i in 0..1000usize {
            m.insert(i * 64, i);
        }
        assert!((0..1000usize).all(|i| m.get(&(i * 64)) == Some(&i)));
        assert_eq!(m.get(&1), None);
    }
}

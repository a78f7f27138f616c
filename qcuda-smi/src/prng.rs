// SPDX-License-Identifier: Apache-2.0 OR MIT
//! A small seeded generator (SplitMix64) for test data and random sizes and delays: runs are
//! reproducible from the printed seed, and no crate is needed in the guest image.

/// SplitMix64 (Steele, Lea and Flood, 2014): passes BigCrush, one add and three mixes per word.
#[derive(Debug, Clone)]
pub struct Prng {
    state: u64,
}

impl Prng {
    /// A generator for `seed`; equal seeds give equal sequences.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one worker of a run, independent of its siblings'.
    pub fn for_worker(seed: u64, proc: u64, thread: u64) -> Self {
        let mut mix = Self::new(seed ^ proc.wrapping_mul(0xa076_1d64_78bd_642f));
        let s = mix.next_u64() ^ thread.wrapping_mul(0xe703_7ed1_a0b4_28db);
        Self::new(s)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift; the bias is below 2^-32 for
    /// the ranges used here.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "empty range {lo}..={hi}");
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_splitmix64_reference() {
        // First outputs of the reference implementation for seed 1234567.
        let mut p = Prng::new(1234567);
        let want = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for w in want {
            assert_eq!(p.next_u64(), w);
        }
    }

    #[test]
    fn same_seed_same_sequence_and_workers_differ() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut p = Prng::new(42);
                move |_| p.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut p = Prng::new(42);
                move |_| p.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        let w00 = Prng::for_worker(1, 0, 0).next_u64();
        let w01 = Prng::for_worker(1, 0, 1).next_u64();
        let w10 = Prng::for_worker(1, 1, 0).next_u64();
        assert_ne!(w00, w01);
        assert_ne!(w00, w10);
        assert_ne!(w01, w10);
    }

    #[test]
    fn ranges_stay_in_bounds_and_cover_them() {
        let mut p = Prng::new(7);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = p.range(10, 14);
            assert!((10..=14).contains(&v));
            seen[usize::try_from(v - 10).unwrap()] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(p.range(3, 3), 3);
        let _ = p.range(0, u64::MAX);
    }

    #[test]
    fn fill_covers_odd_lengths() {
        let mut p = Prng::new(9);
        for len in [0usize, 1, 7, 8, 9, 4097] {
            let mut buf = vec![0u8; len];
            p.fill(&mut buf);
            if len >= 8 {
                assert!(buf.iter().any(|&b| b != 0));
            }
        }
    }
}

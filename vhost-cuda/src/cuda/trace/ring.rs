//! The recorder's ring: a bounded queue of records that drops what does not fit.
//!
//! The producer is the worker itself, between ops, so it never waits: a record that finds the
//! ring full is counted and dropped (the newest go, the older ones stay to be read, so that a
//! trace shows one contiguous stretch of time). A reader that is slow, or never comes, costs
//! the guest's GPU work nothing but the records.

use std::collections::VecDeque;

use qcuda_proto::trace::TraceRecord;

/// Records waiting to be read, at most `capacity`.
#[derive(Debug)]
pub(crate) struct TraceRing {
    records: VecDeque<TraceRecord>,
    capacity: usize,
    dropped: u64,
}

impl TraceRing {
    /// An empty ring of `capacity` records (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            // Grown as records come: a ring that is armed and hardly used costs little.
            records: VecDeque::with_capacity(capacity.min(4096)),
            capacity,
            dropped: 0,
        }
    }

    /// Adds a record, or counts it lost if the ring is full.
    pub(crate) fn push(&mut self, r: TraceRecord) {
        if self.records.len() >= self.capacity {
            self.dropped += 1;
        } else {
            self.records.push_back(r);
        }
    }

    /// Counts `n` records lost before they reached the ring (the profiling interface's).
    pub(crate) fn lost(&mut self, n: u64) {
        self.dropped = self.dropped.saturating_add(n);
    }

    /// The oldest record, if any, without taking it.
    pub(crate) fn front(&self) -> Option<&TraceRecord> {
        self.records.front()
    }

    /// Takes the oldest record.
    pub(crate) fn pop(&mut self) -> Option<TraceRecord> {
        self.records.pop_front()
    }

    /// Records held.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Records lost since the ring was made.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Its capacity.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use qcuda_proto::trace::TraceSpan;

    use super::*;

    fn rec(i: u64) -> TraceRecord {
        TraceRecord::Memset {
            span: TraceSpan {
                start: i,
                end: i,
                ..TraceSpan::default()
            },
            bytes: i,
        }
    }

    #[test]
    fn a_full_ring_drops_the_newest_and_counts_them() {
        let mut r = TraceRing::new(3);
        for i in 0..10 {
            r.push(rec(i));
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.dropped(), 7);
        // The oldest stay: one stretch of time, from the start.
        assert_eq!(r.pop(), Some(rec(0)));
        r.push(rec(10));
        assert_eq!(r.dropped(), 7);
        assert_eq!(r.pop(), Some(rec(1)));
        assert_eq!(r.pop(), Some(rec(2)));
        assert_eq!(r.pop(), Some(rec(10)));
        assert_eq!(r.pop(), None);
        r.lost(5);
        assert_eq!(r.dropped(), 12);
        assert_eq!(TraceRing::new(0).capacity(), 1);
    }
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
//! How a transfer is cut into echo calls: pieces of at most one buffer's worth
//! (`MAX_BUFFER_LEN`), the way guest-lib cuts large copies, and the descriptor budget that
//! decides whether the kernel may refuse a piece with E2BIG.

use std::ops::Range;

use qcuda_proto::{BOUNCE_THRESHOLD, MAX_CHAIN_SEGMENTS};

/// Guest page size the kernel pins in (x86-64), as a length in memory.
pub const PAGE_LEN: usize = 4096;

/// Guest page size the kernel pins in (x86-64), for guest addresses and transfer sizes.
pub const PAGE_SIZE: u64 = PAGE_LEN as u64;

/// Cuts `0..total` into consecutive pieces of at most `max_call` bytes. An empty transfer is
/// one empty piece: a zero-length call is still a call.
pub fn split(total: u64, max_call: u64) -> Vec<Range<u64>> {
    assert!(max_call > 0, "max_call must be positive");
    if total == 0 {
        return std::iter::once(0..0).collect();
    }
    // Only a hint: a count beyond `usize` could not be collected anyway.
    let mut pieces = Vec::with_capacity(usize::try_from(total.div_ceil(max_call)).unwrap_or(0));
    let mut at = 0;
    while at < total {
        let end = total.min(at + max_call);
        pieces.push(at..end);
        at = end;
    }
    pieces
}

/// Descriptors one buffer may need, at worst: none when empty, one bounce buffer up to
/// `BOUNCE_THRESHOLD`, otherwise one per page it touches (pages that turn out physically
/// contiguous are merged by the kernel, so this is an upper bound).
pub fn buffer_segments(addr: u64, len: u64) -> u64 {
    if len == 0 {
        0
    } else if len <= BOUNCE_THRESHOLD {
        1
    } else {
        (addr + len - 1) / PAGE_SIZE - addr / PAGE_SIZE + 1
    }
}

/// Whether an echo of `len` bytes from `in_addr` to `out_addr` fits in one chain whatever the
/// physical layout: request header + input + output + response header. A call that fits must
/// never be refused with E2BIG; one that does not may be, and is then split.
pub fn echo_fits_worst_case(in_addr: u64, out_addr: u64, len: u64) -> bool {
    2 + buffer_segments(in_addr, len) + buffer_segments(out_addr, len) <= MAX_CHAIN_SEGMENTS as u64
}

/// Splits a piece the kernel refused as too large into two, the first a whole number of pages
/// so that the second starts page-aligned relative to the first.
pub fn halve(piece: Range<u64>) -> (Range<u64>, Range<u64>) {
    let len = piece.end - piece.start;
    assert!(len >= 2, "cannot halve {len} bytes");
    let first = (len / 2).div_ceil(PAGE_SIZE).max(1) * PAGE_SIZE;
    let first = first.min(len - 1);
    (
        piece.start..piece.start + first,
        piece.start + first..piece.end,
    )
}

#[cfg(test)]
mod tests {
    use qcuda_proto::MAX_BUFFER_LEN;

    use super::*;

    #[test]
    fn splits_into_max_sized_pieces_with_a_tail() {
        assert_eq!(split(0, 10), vec![0..0]);
        assert_eq!(split(1, 10), vec![0..1]);
        assert_eq!(split(10, 10), vec![0..10]);
        assert_eq!(split(25, 10), vec![0..10, 10..20, 20..25]);
        let big = split(256 << 20, MAX_BUFFER_LEN);
        assert_eq!(big.len(), 4);
        assert!(big.iter().all(|p| p.end - p.start == MAX_BUFFER_LEN));
        let odd = split((256 << 20) + 1, MAX_BUFFER_LEN);
        assert_eq!(odd.len(), 5);
        assert_eq!(odd[4], (256 << 20)..(256 << 20) + 1);
    }

    #[test]
    fn pieces_are_contiguous_and_cover_everything() {
        for total in [1u64, 4095, 4096, 4097, 1 << 20, (64 << 20) + 3] {
            for max in [1u64, 7, 4096, 65537, MAX_BUFFER_LEN] {
                if total / max > 100_000 {
                    continue;
                }
                let p = split(total, max);
                assert_eq!(p[0].start, 0);
                assert_eq!(p.last().unwrap().end, total);
                for w in p.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                assert!(p.iter().all(|r| r.end - r.start <= max && r.end > r.start));
            }
        }
    }

    #[test]
    fn counts_segments_per_buffer() {
        assert_eq!(buffer_segments(0, 0), 0);
        assert_eq!(buffer_segments(1, 1), 1);
        assert_eq!(buffer_segments(4095, BOUNCE_THRESHOLD), 1);
        // Just over the bounce threshold: 16 pages and one byte touch 17 pages from any start.
        assert_eq!(buffer_segments(0, BOUNCE_THRESHOLD + 1), 17);
        assert_eq!(buffer_segments(4095, BOUNCE_THRESHOLD + 1), 17);
        // A whole number of pages touches one more page when it starts mid-page.
        assert_eq!(buffer_segments(0, 2 * BOUNCE_THRESHOLD), 32);
        assert_eq!(buffer_segments(1, 2 * BOUNCE_THRESHOLD), 33);
        assert_eq!(buffer_segments(0, 1 << 20), 256);
        assert_eq!(buffer_segments(1, 1 << 20), 257);
    }

    #[test]
    fn worst_case_budget() {
        // 4 MiB each way fits even unaligned; 8 MiB each way does not.
        assert!(echo_fits_worst_case(1, 4095, 4 << 20));
        assert!(!echo_fits_worst_case(0, 0, 8 << 20));
        assert!(echo_fits_worst_case(0, 0, 0));
        assert!(echo_fits_worst_case(1, 1, BOUNCE_THRESHOLD));
    }

    #[test]
    fn halving_makes_progress_and_keeps_the_range() {
        for len in [
            2u64,
            3,
            4096,
            4097,
            65537,
            MAX_BUFFER_LEN,
            MAX_BUFFER_LEN - 1,
        ] {
            let (a, b) = halve(10..10 + len);
            assert_eq!(a.start, 10);
            assert_eq!(a.end, b.start);
            assert_eq!(b.end, 10 + len);
            assert!(a.end > a.start && b.end > b.start);
        }
        let (a, _) = halve(0..MAX_BUFFER_LEN);
        assert_eq!(a.end, MAX_BUFFER_LEN / 2);
        assert_eq!((a.end - a.start) % PAGE_SIZE, 0);
    }
}

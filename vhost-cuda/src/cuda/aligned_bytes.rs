//! A zeroed, 16-byte-aligned host copy of guest bytes that the driver reads through a pointer
//! (module images, kernel parameter blocks).
//!
//! Guest memory is shared with the guest, which may change it at any time, so anything that is
//! validated and then handed to the driver is first copied into host memory the guest cannot
//! reach. The alignment matches the strictest kernel parameter alignment and what the driver
//! expects of an image.

/// Owned bytes, zero-initialised, aligned to 16.
///
/// # Invariants
/// `words` holds at least `len` bytes.
pub(crate) struct AlignedBytes {
    words: Vec<u128>,
    len: usize,
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBytes")
            .field("len", &self.len)
            .finish()
    }
}

impl AlignedBytes {
    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> Self {
        Self {
            words: vec![0u128; len.div_ceil(16)],
            len,
        }
    }

    /// Number of bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes (invariant); u8 has no
        // alignment or validity requirements; the slice borrows `self`.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the slice borrows `self` mutably, so it is unique.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }

    /// Pointer to the first byte, valid for `len` bytes while `self` is neither dropped nor
    /// borrowed mutably.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast::<u8>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_sized() {
        for len in [0, 1, 15, 16, 17, 4096] {
            let mut b = AlignedBytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            assert_eq!(b.as_mut_ptr() as usize % 16, 0);
            b.as_mut_slice().fill(0xab);
            assert!(b.as_slice().iter().all(|&x| x == 0xab));
        }
    }
}

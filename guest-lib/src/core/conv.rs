//! Integer conversions whose reason is the same everywhere, in one place: what the C API and
//! the wire define as a reinterpretation or a narrowing, named, so that the casts lints
//! (`cast_possible_truncation`, `cast_possible_wrap`, `cast_sign_loss`) flag only conversions
//! nobody has decided about.

// guest-lib is a 64-bit Linux library (libcudart.so.13 exists for 64-bit targets only), so a u64
// always fits a usize.
const _: () = assert!(usize::BITS == 64, "guest-lib supports 64-bit targets only");

/// A u64 (a length, an address or a count from the wire or a CUDA structure) as a usize.
#[expect(
    clippy::cast_possible_truncation,
    reason = "usize is 64 bits wide on every target guest-lib builds for (asserted above)"
)]
pub const fn usize_of(x: u64) -> usize {
    x as usize
}

/// The low 32 bits of a reply or argument word: the wire carries 32-bit values (CUDA enums,
/// flags, `float` bits, C `unsigned`) zero-extended in 64-bit words.
#[expect(
    clippy::cast_possible_truncation,
    reason = "the word holds a 32-bit value; its upper half is zero by the wire's rule"
)]
pub const fn low_u32(word: u64) -> u32 {
    word as u32
}

/// A C `int` the host answered: the wire carries it as its 32-bit pattern (`i32 as u32`).
pub const fn c_int_of(word: u64) -> i32 {
    i32::from_ne_bytes(low_u32(word).to_ne_bytes())
}

/// A C `int` as the wire's 64-bit argument word, sign-extended (how the host reads it back).
pub fn int_word(v: i32) -> u64 {
    u64::from_ne_bytes(i64::from(v).to_ne_bytes())
}

/// The same 32 bits as a C `int` (CUDA enum constants, which bindgen types as u32, stored
/// into `int` fields; small counts and ordinals), bit for bit, as C's conversion does.
pub const fn int_of_u32(v: u32) -> i32 {
    i32::from_ne_bytes(v.to_ne_bytes())
}

/// The same 32 bits as an unsigned value (a C `int` field holding a bitmask or a magic).
pub const fn u32_of_int(v: i32) -> u32 {
    u32::from_ne_bytes(v.to_ne_bytes())
}

/// The low byte: what `cudaMemset`'s `int value` sets each byte to, and the width of CUDA's
/// byte-sized fields.
pub const fn low_byte(v: i32) -> u8 {
    v.to_le_bytes()[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_are_the_c_ones() {
        assert_eq!(usize_of(u64::MAX), usize::MAX);
        assert_eq!(low_u32(0x1_2345_6789), 0x2345_6789);
        assert_eq!(c_int_of(u64::from(u32::MAX)), -1);
        assert_eq!(c_int_of(5), 5);
        assert_eq!(int_word(-1), u64::MAX);
        assert_eq!(int_word(7), 7);
        assert_eq!(int_of_u32(u32::MAX), -1);
        assert_eq!(u32_of_int(-1), u32::MAX);
        assert_eq!(low_byte(0x1ff), 0xff);
        assert_eq!(low_byte(-1), 0xff);
    }
}

//! Finding the fatbin image nvcc embedded in the application, and its length.
//!
//! `__cudaRegisterFatBinary` receives a `__fatBinC_Wrapper_t` (fatbinary_section.h) whose `data`
//! points at a fatbin: a 16-byte header `{u32 magic 0xBA55ED50; u16 version; u16 header_size;
//! u64 fat_size}` followed by `fat_size` bytes of entries. That header is all guest-lib reads:
//! the whole image (header_size + fat_size bytes) goes to the host, which lets the driver pick,
//! decompress and JIT the right entry (DESIGN.md §4).

use crate::core::conv::{u32_of_int, usize_of};
use core::ffi::c_void;

use qcuda_proto::MAX_BUFFER_LEN;

/// `FATBINC_MAGIC`: the wrapper's magic.
pub const WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// The fatbin header's magic.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Bytes of the fixed fatbin header.
pub const HEADER_LEN: usize = 16;

/// `__fatBinC_Wrapper_t`.
#[repr(C)]
#[derive(Debug)]
pub struct FatbinWrapper {
    /// `FATBINC_MAGIC`.
    pub magic: i32,
    /// 1, or 2 for `-rdc` builds linked by nvlink (the image is the linked one either way).
    pub version: i32,
    /// The fatbin.
    pub data: *const u64,
    /// Version 1: unused; version 2: the prelinked fatbins (already linked into `data`).
    pub filename_or_fatbins: *mut c_void,
}

/// Why an embedded image cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatbinError {
    /// A null wrapper or data pointer.
    Null,
    /// The wrapper's magic is not `FATBINC_MAGIC`.
    BadWrapperMagic(u32),
    /// The data does not start with a fatbin header.
    BadMagic(u32),
    /// `header_size` is smaller than the header itself.
    BadHeaderSize(u16),
    /// The image does not fit one transport buffer (`MAX_BUFFER_LEN`).
    TooLarge(u64),
}

/// The total image length given its first [`HEADER_LEN`] bytes.
pub fn image_len(header: &[u8; HEADER_LEN]) -> Result<usize, FatbinError> {
    let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if magic != FATBIN_MAGIC {
        return Err(FatbinError::BadMagic(magic));
    }
    let header_size = u16::from_le_bytes([header[6], header[7]]);
    if usize::from(header_size) < HEADER_LEN {
        return Err(FatbinError::BadHeaderSize(header_size));
    }
    let mut fat = [0u8; 8];
    fat.copy_from_slice(&header[8..16]);
    let fat_size = u64::from_le_bytes(fat);
    let total = fat_size.saturating_add(u64::from(header_size));
    if total > MAX_BUFFER_LEN {
        return Err(FatbinError::TooLarge(total));
    }
    Ok(usize_of(total))
}

/// The image a wrapper describes.
///
/// # Safety
/// `wrapper` must be null or point at a `__fatBinC_Wrapper_t` whose `data` is null or points at
/// a fatbin that stays mapped and unchanged for `'static` (nvcc puts it in a read-only section of
/// the application or library, registered until `__cudaUnregisterFatBinary`).
pub unsafe fn image_from_wrapper(wrapper: *const c_void) -> Result<&'static [u8], FatbinError> {
    if wrapper.is_null() {
        return Err(FatbinError::Null);
    }
    // SAFETY: the caller guarantees a valid wrapper; read_unaligned tolerates any alignment.
    let w = unsafe { std::ptr::read_unaligned(wrapper.cast::<FatbinWrapper>()) };
    if u32_of_int(w.magic) != WRAPPER_MAGIC {
        return Err(FatbinError::BadWrapperMagic(u32_of_int(w.magic)));
    }
    if w.data.is_null() {
        return Err(FatbinError::Null);
    }
    let mut header = [0u8; HEADER_LEN];
    // SAFETY: `data` points at a fatbin (caller contract), which begins with the header.
    unsafe { std::ptr::copy_nonoverlapping(w.data.cast::<u8>(), header.as_mut_ptr(), HEADER_LEN) };
    let len = image_len(&header)?;
    // SAFETY: the header says the image is `len` bytes long, all inside the section nvcc
    // emitted, which stays mapped and immutable for as long as the caller guarantees.
    Ok(unsafe { std::slice::from_raw_parts(w.data.cast::<u8>(), len) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::conv::int_of_u32;

    fn header(magic: u32, header_size: u16, fat_size: u64) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&magic.to_le_bytes());
        h[4..6].copy_from_slice(&1u16.to_le_bytes());
        h[6..8].copy_from_slice(&header_size.to_le_bytes());
        h[8..16].copy_from_slice(&fat_size.to_le_bytes());
        h
    }

    #[test]
    fn length_is_header_size_plus_fat_size() {
        // The header nvcc 13 wrote for a small test program: 0x00100001ba55ed50, 0x1be0.
        assert_eq!(
            image_len(&header(FATBIN_MAGIC, 0x10, 0x1be0)),
            Ok(0x10 + 0x1be0)
        );
        assert_eq!(image_len(&header(FATBIN_MAGIC, 0x40, 0)), Ok(0x40));
    }

    #[test]
    fn bad_headers_are_refused() {
        assert_eq!(
            image_len(&header(0x464c_457f, 0x10, 1)),
            Err(FatbinError::BadMagic(0x464c_457f))
        );
        assert_eq!(
            image_len(&header(FATBIN_MAGIC, 8, 1)),
            Err(FatbinError::BadHeaderSize(8))
        );
        assert!(matches!(
            image_len(&header(FATBIN_MAGIC, 0x10, u64::MAX)),
            Err(FatbinError::TooLarge(_))
        ));
        assert!(matches!(
            image_len(&header(FATBIN_MAGIC, 0x10, MAX_BUFFER_LEN)),
            Err(FatbinError::TooLarge(_))
        ));
    }

    #[test]
    fn wrapper_yields_the_whole_image() {
        // A fatbin of 16 header bytes + 24 entry bytes, 8-aligned like nvcc's.
        let mut words = [0u64; 6];
        let h = header(FATBIN_MAGIC, 0x10, 24);
        words[0] = u64::from_le_bytes(h[0..8].try_into().unwrap());
        words[1] = u64::from_le_bytes(h[8..16].try_into().unwrap());
        words[2..5].copy_from_slice(&[1, 2, 3]);
        let words: &'static [u64; 6] = Box::leak(Box::new(words));
        let wrapper = FatbinWrapper {
            magic: int_of_u32(WRAPPER_MAGIC),
            version: 1,
            data: words.as_ptr(),
            filename_or_fatbins: std::ptr::null_mut(),
        };
        // SAFETY: the wrapper and its leaked data are valid for 'static.
        let image = unsafe { image_from_wrapper((&raw const wrapper).cast()) }.unwrap();
        assert_eq!(image.len(), 40);
        assert_eq!(image.as_ptr(), words.as_ptr().cast());

        let bad = FatbinWrapper {
            magic: 0,
            ..wrapper
        };
        // SAFETY: as above.
        let err = unsafe { image_from_wrapper((&raw const bad).cast()) };
        assert_eq!(err, Err(FatbinError::BadWrapperMagic(0)));
        // SAFETY: null is allowed.
        let err = unsafe { image_from_wrapper(std::ptr::null()) };
        assert_eq!(err, Err(FatbinError::Null));
    }
}

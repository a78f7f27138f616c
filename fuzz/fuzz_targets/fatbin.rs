//! Fatbin images, on both sides: guest-lib's parser of the image an application registers
//! (`image_len`, `image_from_wrapper`), and the host's check of the image a guest sends
//! (`ModuleImage`, which must refuse any image whose sizes point outside it, since the driver
//! trusts them).
#![no_main]

use std::ptr;

use qcudart::core::modules::fatbin::{image_from_wrapper, image_len, FatbinWrapper, HEADER_LEN, WRAPPER_MAGIC};
use libfuzzer_sys::fuzz_target;
use vhost_cuda::cuda::fuzzing::check_module_image;

fuzz_target!(|data: &[u8]| {
    // Host side: any bytes at all.
    let _ = check_module_image(data);

    // Guest side: the header, then the wrapper over an image that really is that long (nvcc's
    // contract; a shorter one is the application's own memory error, not ours to catch).
    let Some(header) = data.get(..HEADER_LEN) else {
        return;
    };
    let header: &[u8; HEADER_LEN] = header.try_into().unwrap();
    let Ok(len) = image_len(header) else {
        return;
    };
    assert!(len >= HEADER_LEN);
    if len > data.len() {
        return;
    }
    // 8-aligned like nvcc's section.
    let mut words = vec![0u64; data.len().div_ceil(8)];
    // SAFETY: `words` holds at least data.len() bytes.
    unsafe { ptr::copy_nonoverlapping(data.as_ptr(), words.as_mut_ptr().cast(), data.len()) };
    let words: &'static [u64] = Box::leak(words.into_boxed_slice());
    let wrapper = FatbinWrapper {
        magic: WRAPPER_MAGIC as i32,
        version: 1,
        data: words.as_ptr(),
        filename_or_fatbins: ptr::null_mut(),
    };
    // SAFETY: the wrapper is valid and its data holds `len` bytes for 'static (leaked).
    let image = unsafe { image_from_wrapper((&raw const wrapper).cast()) }.unwrap();
    assert_eq!(image, &data[..len]);
    // SAFETY: from_raw_parts of our own leak, reclaimed so the fuzzer does not grow.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(words.as_ptr().cast_mut(), words.len())) });
});

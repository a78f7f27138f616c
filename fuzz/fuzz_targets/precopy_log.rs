//! A live migration's pre-copy data from anywhere (QEMU relays it from the source host
//! unchecked): the chunk logs and rounds (`cuda::precopy`: `check_log`, `scan`, `read_round`)
//! and a final saved state restored from a store over the fake CUDA driver. No input may
//! panic, allocate past its own length, or leave a context, reservation or mapping behind.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_cuda::cuda::fuzzing::restore_with_store;

fuzz_target!(|data: &[u8]| {
    let _ = restore_with_store(data);
});

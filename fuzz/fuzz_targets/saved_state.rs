//! A guest process's saved GPU state from anywhere (a file an operator hands over, another
//! daemon): `SavedState::decode`, and a restore of what decodes into a fresh state over the
//! fake CUDA driver. No input may panic, allocate past its own length, or leave a context,
//! reservation or mapping behind; what decodes re-encodes to the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_cuda::cuda::fuzzing::restore_saved_state;

fuzz_target!(|data: &[u8]| {
    let _ = restore_saved_state(data);
});

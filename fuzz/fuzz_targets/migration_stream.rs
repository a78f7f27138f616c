//! A live migration's incoming back-end state (QEMU relays it from the source host unchecked):
//! `session::migration::read_stream`, and every saved state it carries restored into a fresh
//! state over the fake CUDA driver, as a destination's workers would. No input may panic,
//! allocate past what arrived, or leave a context, reservation or mapping behind; what reads
//! writes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_cuda::{
    cuda::fuzzing::restore_saved_state,
    session::migration::{read_stream, write_stream, SavedGpu},
};

fuzz_target!(|data: &[u8]| {
    let Ok(sessions) = read_stream(&mut &data[..]) else {
        return;
    };
    let mut again = Vec::new();
    write_stream(&mut again, &sessions).expect("a stream that reads writes");
    assert_eq!(again, data);
    for s in &sessions {
        if let SavedGpu::State(bytes) = &s.gpu {
            let _ = restore_saved_state(bytes);
        }
    }
});

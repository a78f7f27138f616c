//! A live migration's incoming back-end state (QEMU relays it from the source host unchecked):
//! `session::migration::read_stream`, and every saved state it carries restored into a fresh
//! state over the fake CUDA driver, as a destination's workers would. No input may panic,
//! allocate past what arrived, or leave a context, reservation or mapping behind; what reads
//! writes back to what reads the same. Inputs that begin as a same-host handover's offer
//! (`QCUDAHO1`, which a source puts at the head of its state) go to the offer's decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_cuda::{
    cuda::fuzzing::{decode_handover_offer, restore_saved_state},
    session::{
        handover::OFFER_MAGIC,
        migration::{read_stream, write_body, write_head},
    },
};

fuzz_target!(|data: &[u8]| {
    if data.starts_with(&OFFER_MAGIC) {
        let _ = decode_handover_offer(data);
        return;
    }
    let Ok(stream) = read_stream(&mut &data[..]) else {
        return;
    };
    let mut again = Vec::new();
    write_head(&mut again, stream.head.offer.as_ref(), stream.head.padding)
        .expect("a head that reads writes");
    write_body(&mut again, stream.path, &stream.sessions).expect("a stream that reads writes");
    // Version 1 is read, version 2 written: what is written reads as what was read, but for
    // the version.
    let back = read_stream(&mut again.as_slice()).expect("reads again");
    assert_eq!(back.head.offer, stream.head.offer);
    assert_eq!(back.head.padding, stream.head.padding);
    assert_eq!(back.path, stream.path);
    assert_eq!(back.sessions, stream.sessions);
    for s in &stream.sessions {
        if let Some(file) = s.gpu.file() {
            let bytes = file.to_vec().expect("a state that arrived reads back");
            let _ = restore_saved_state(&bytes);
        }
    }
});

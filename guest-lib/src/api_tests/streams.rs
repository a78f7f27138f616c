use std::ptr;

use qcuda_proto::Op;

use super::*;
use crate::{
    api::{
        errors::cudaGetLastError, events::*, graphs::cudaStreamIsCapturing,
        launch::cudaLaunchKernel, memory::*, streams::*,
    },
    generated::{self as cu, cudaEvent_t, cudaStream_t, dim3},
    streams::{LEGACY, PER_THREAD},
};

#[test]
fn streams_get_guest_handles_that_map_to_host_handles() {
    let fake = setup();
    fake.add_kernel("_Z1kv", &[]);
    let k = register_kernel(register_fatbin(), c"_Z1kv");
    let mut s: cudaStream_t = ptr::null_mut();
    let one = dim3 { x: 1, y: 1, z: 1 };
    // SAFETY: valid pointers; the kernel has no parameters.
    unsafe {
        ok(cudaStreamCreateWithPriority(
            &mut s,
            cu::cudaStreamNonBlocking,
            -1,
        ));
        let host = *fake.state().streams.last().unwrap();
        assert!(s as usize > PER_THREAD && s as usize != host as usize);
        ok(cudaLaunchKernel(
            k as *const _,
            one,
            one,
            ptr::null_mut(),
            0,
            s,
        ));
        assert_eq!(fake.state().launches[0].args[5], host);
        ok(cudaLaunchKernel(
            k as *const _,
            one,
            one,
            ptr::null_mut(),
            0,
            PER_THREAD as cudaStream_t,
        ));
        ok(cudaLaunchKernel(
            k as *const _,
            one,
            one,
            ptr::null_mut(),
            0,
            LEGACY as cudaStream_t,
        ));
        assert_eq!(fake.state().launches[1].args[5], 0);
        assert_eq!(fake.state().launches[2].args[5], 0);

        let (mut flags, mut prio, mut dev) = (0, 0, -1);
        ok(cudaStreamGetFlags(s, &mut flags));
        ok(cudaStreamGetPriority(s, &mut prio));
        ok(cudaStreamGetDevice_ptsz(s, &mut dev));
        assert_eq!((flags, prio, dev), (cu::cudaStreamNonBlocking, -1, 0));
        let mut capturing = 7;
        ok(cudaStreamIsCapturing(s, &mut capturing));
        assert_eq!(capturing, cu::cudaStreamCaptureStatusNone);
        ok(cudaStreamSynchronize(s));
        ok(cudaStreamQuery_ptsz(s));
        ok(cudaStreamDestroy(s));
        assert_err(cudaStreamSynchronize(s), cu::cudaErrorInvalidResourceHandle);
        assert_err(cudaStreamDestroy(s), cu::cudaErrorInvalidResourceHandle);
        assert_err(
            cudaStreamDestroy(ptr::null_mut()),
            cu::cudaErrorInvalidResourceHandle,
        );
        assert_err(
            cudaStreamCreateWithFlags(&mut s, 4),
            cu::cudaErrorInvalidValue,
        );
    }
    assert!(fake.state().streams.is_empty());
    cudaGetLastError();
}

#[test]
fn events_record_time_and_wait() {
    let fake = setup();
    let (mut start, mut end): (cudaEvent_t, cudaEvent_t) = (ptr::null_mut(), ptr::null_mut());
    let mut s: cudaStream_t = ptr::null_mut();
    // SAFETY: valid pointers.
    unsafe {
        ok(cudaStreamCreate(&mut s));
        ok(cudaEventCreate(&mut start));
        ok(cudaEventCreateWithFlags(
            &mut end,
            cu::cudaEventBlockingSync,
        ));
        ok(cudaEventRecord(start, s));
        ok(cudaEventRecord_ptsz(end, ptr::null_mut()));
        ok(cudaEventSynchronize(end));
        ok(cudaEventQuery(end));
        let mut ms = 0.0f32;
        ok(cudaEventElapsedTime(&mut ms, start, end));
        assert_eq!(ms, 1.5);
        ok(cudaStreamWaitEvent(s, end, 0));
        assert_err(cudaStreamWaitEvent(s, end, 1), cu::cudaErrorNotSupported);
        assert_err(
            cudaEventRecordWithFlags(end, s, 1),
            cu::cudaErrorNotSupported,
        );
        assert_err(
            cudaEventCreateWithFlags(
                &mut end,
                cu::cudaEventInterprocess | cu::cudaEventDisableTiming,
            ),
            cu::cudaErrorNotSupported,
        );
        ok(cudaEventDestroy(start));
        assert_err(
            cudaEventRecord(start, s),
            cu::cudaErrorInvalidResourceHandle,
        );
        ok(cudaStreamDestroy(s));
    }
    let log = &fake.state().log;
    assert!(log
        .iter()
        .filter(|l| l.op == Op::EventRecord)
        .all(|l| l.fire_and_forget));
    assert!(log
        .iter()
        .filter(|l| l.op == Op::StreamWaitEvent)
        .all(|l| l.fire_and_forget));
    assert!(log
        .iter()
        .filter(|l| l.op == Op::EventSynchronize)
        .all(|l| !l.fire_and_forget));
    cudaGetLastError();
}

#[test]
fn async_copies_of_guest_memory_wait_and_use_the_stream() {
    let fake = setup();
    let mut s: cudaStream_t = ptr::null_mut();
    let mut d = ptr::null_mut();
    let data = [3u8; 64];
    let mut back = [0u8; 64];
    // SAFETY: 64-byte buffers.
    unsafe {
        ok(cudaStreamCreate(&mut s));
        ok(cudaMalloc(&mut d, 64));
        ok(cudaMemcpyAsync(
            d,
            data.as_ptr().cast(),
            64,
            cu::cudaMemcpyHostToDevice,
            s,
        ));
        ok(cudaMemcpyAsync_ptsz(
            back.as_mut_ptr().cast(),
            d,
            64,
            cu::cudaMemcpyDeviceToHost,
            s,
        ));
    }
    assert_eq!(back, data);
    let log = &fake.state().log;
    assert!(log
        .iter()
        .filter(|l| matches!(l.op, Op::MemcpyHtoD | Op::MemcpyDtoH))
        .all(|l| !l.fire_and_forget));
}

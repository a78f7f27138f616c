use std::ptr;

use qcuda_proto::Op;

use super::*;
use crate::{
    core::streams::{LEGACY, PER_THREAD},
    generated::{self as cu, cudaEvent_t, cudaStream_t, dim3},
    runtime::{
        errors::cudaGetLastError, events::*, graphs::cudaStreamIsCapturing,
        launch::cudaLaunchKernel, memory::*, streams::*,
    },
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
            &raw mut s,
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
        flush();
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
        flush();
        assert_eq!(fake.state().launches[1].args[5], 0);
        assert_eq!(fake.state().launches[2].args[5], 0);

        let (mut flags, mut prio, mut dev) = (0, 0, -1);
        ok(cudaStreamGetFlags(s, &raw mut flags));
        ok(cudaStreamGetPriority(s, &raw mut prio));
        ok(cudaStreamGetDevice_ptsz(s, &raw mut dev));
        assert_eq!((flags, prio, dev), (cu::cudaStreamNonBlocking, -1, 0));
        let mut capturing = 7;
        ok(cudaStreamIsCapturing(s, &raw mut capturing));
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
            cudaStreamCreateWithFlags(&raw mut s, 4),
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
        ok(cudaStreamCreate(&raw mut s));
        ok(cudaEventCreate(&raw mut start));
        ok(cudaEventCreateWithFlags(
            &raw mut end,
            cu::cudaEventBlockingSync,
        ));
        ok(cudaEventRecord(start, s));
        ok(cudaEventRecord_ptsz(end, ptr::null_mut()));
        ok(cudaEventSynchronize(end));
        ok(cudaEventQuery(end));
        let mut ms = 0.0f32;
        ok(cudaEventElapsedTime(&raw mut ms, start, end));
        assert_eq!(ms, 1.5);
        ok(cudaStreamWaitEvent(s, end, 0));
        assert_err(cudaStreamWaitEvent(s, end, 1), cu::cudaErrorNotSupported);
        assert_err(
            cudaEventRecordWithFlags(end, s, 1),
            cu::cudaErrorNotSupported,
        );
        // Interprocess events exist (their handles: api_tests/ipc.rs); unknown flags do not.
        let mut ipc: cudaEvent_t = ptr::null_mut();
        ok(cudaEventCreateWithFlags(
            &raw mut ipc,
            cu::cudaEventInterprocess | cu::cudaEventDisableTiming,
        ));
        ok(cudaEventDestroy(ipc));
        assert_err(
            cudaEventCreateWithFlags(&raw mut ipc, 0x80),
            cu::cudaErrorInvalidValue,
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
fn a_completed_event_is_answered_without_a_round_trip_until_anything_is_sent() {
    let fake = setup();
    let mut e: cudaEvent_t = ptr::null_mut();
    let count = |fake: &FakeDevice, op: Op| fake.state().log.iter().filter(|l| l.op == op).count();
    // SAFETY: valid pointers; the null stream always exists.
    unsafe {
        ok(cudaEventCreate(&raw mut e));
        ok(cudaEventRecord(e, ptr::null_mut()));
        ok(cudaEventSynchronize(e));
        let asked = count(&fake, Op::EventSynchronize) + count(&fake, Op::EventQuery);
        for _ in 0..5 {
            ok(cudaEventQuery(e));
            ok(cudaEventSynchronize(e));
        }
        assert_eq!(
            count(&fake, Op::EventSynchronize) + count(&fake, Op::EventQuery),
            asked
        );
        // Recorded again: the host is asked, and a pending event says so.
        ok(cudaEventRecord(e, ptr::null_mut()));
        fake.state().fail_next = Some((Op::EventQuery, qcuda_proto::status::NOT_READY, false));
        assert_err(cudaEventQuery(e), cu::cudaErrorNotReady);
        // Not complete: asked again, complete now, then known.
        ok(cudaEventQuery(e));
        ok(cudaEventQuery(e));
        assert_eq!(count(&fake, Op::EventQuery), 2);
        ok(cudaEventDestroy(e));
    }
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
        ok(cudaStreamCreate(&raw mut s));
        ok(cudaMalloc(&raw mut d, 64));
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

static HOST_FN_RUNS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

unsafe extern "C" fn record_host_fn(data: *mut c_void) {
    HOST_FN_RUNS.lock().unwrap().push((0, data as usize));
}

unsafe extern "C" fn record_callback(
    stream: cudaStream_t,
    status: cu::cudaError_t,
    data: *mut c_void,
) {
    assert_eq!(status, 0);
    HOST_FN_RUNS
        .lock()
        .unwrap()
        .push((stream as usize, data as usize));
}

#[test]
fn host_functions_run_in_this_process_in_order_and_release_their_stream() {
    let fake = setup();
    let mut s = ptr::null_mut();
    // SAFETY: valid pointers; the functions take any data.
    unsafe {
        ok(cudaStreamCreate(&raw mut s));
        ok(cudaLaunchHostFunc(
            s,
            Some(record_host_fn),
            11 as *mut c_void,
        ));
        ok(cudaStreamAddCallback(
            s,
            Some(record_callback),
            12 as *mut c_void,
            0,
        ));
        // CUDA's argument rules.
        assert_err(
            cudaStreamAddCallback(s, Some(record_callback), ptr::null_mut(), 1),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaLaunchHostFunc(s, None, ptr::null_mut()),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaLaunchHostFunc(0x77 as cudaStream_t, Some(record_host_fn), ptr::null_mut()),
            cu::cudaErrorInvalidResourceHandle,
        );
        cudaGetLastError();
    }
    // The runtime's thread runs both, in order, and releases each run with its next wait.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fake.state().host_released.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "host functions did not run"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(*HOST_FN_RUNS.lock().unwrap(), [(0, 11), (s as usize, 12)]);
    assert_eq!(fake.state().host_released, [1, 2]);
    // One-shot: forgotten after their run.
    assert!(crate::core::runtime::runtime().unwrap().host_fns.is_empty());
}

#[test]
fn synchronisations_wait_as_the_scheduling_flags_say() {
    use crate::runtime::devices::{cudaDeviceSynchronize, cudaSetDeviceFlags};
    use qcuda_proto::WaitMode;
    let fake = setup();
    let waits = |op: Op| -> Vec<WaitMode> {
        let s = fake.state();
        s.log
            .iter()
            .filter(|l| l.op == op)
            .map(|l| l.wait)
            .collect()
    };
    let mut s: cudaStream_t = ptr::null_mut();
    let mut e: cudaEvent_t = ptr::null_mut();
    let mut blocking: cudaEvent_t = ptr::null_mut();
    let mut d = ptr::null_mut();
    // SAFETY: valid pointers throughout.
    unsafe {
        ok(cudaStreamCreate(&raw mut s));
        ok(cudaEventCreate(&raw mut e));
        ok(cudaEventCreateWithFlags(
            &raw mut blocking,
            cu::cudaEventBlockingSync,
        ));
        ok(cudaMalloc(&raw mut d, 64));
        // The default (auto): synchronisations poll until the answer comes. (A record before
        // a synchronisation gives it work to wait for: an idle one makes no round trip.)
        ok(cudaDeviceSynchronize());
        ok(cudaEventRecord(e, s));
        ok(cudaStreamSynchronize(s));
        ok(cudaEventRecord(e, s));
        ok(cudaEventSynchronize(e));
        // An event made for blocking waits blocks, whatever the device's flags.
        ok(cudaEventRecord(blocking, s));
        ok(cudaEventSynchronize(blocking));
        // Blocking synchronisation for the device.
        ok(cudaSetDeviceFlags(cu::cudaDeviceScheduleBlockingSync));
        ok(cudaDeviceSynchronize());
        ok(cudaEventRecord(e, s));
        ok(cudaStreamSynchronize(s));
        ok(cudaSetDeviceFlags(cu::cudaDeviceScheduleYield));
        ok(cudaEventRecord(e, s));
        ok(cudaStreamSynchronize(s));
    }
    assert_eq!(
        waits(Op::DeviceSynchronize),
        [WaitMode::Spin, WaitMode::Block]
    );
    assert_eq!(
        waits(Op::StreamSynchronize),
        [WaitMode::Spin, WaitMode::Block, WaitMode::Spin]
    );
    assert_eq!(
        waits(Op::EventSynchronize),
        [WaitMode::Spin, WaitMode::Block]
    );
    // Calls that are not synchronisations keep the module's default.
    assert_eq!(waits(Op::Malloc), [WaitMode::Poll]);
    assert!(waits(Op::StreamCreate).iter().all(|w| *w == WaitMode::Poll));
}

/// A synchronisation with nothing to wait for (no request since one that covered it
/// succeeded) makes no round trip; any request in between, from any thread, makes the next one
/// go to the host again.
#[test]
fn an_idle_synchronisation_makes_no_round_trip() {
    use crate::runtime::{devices::cudaDeviceSynchronize, streams::*};
    let fake = setup();
    let sent = |op: Op| fake.state().log.iter().filter(|l| l.op == op).count();
    let mut s: crate::generated::cudaStream_t = std::ptr::null_mut();
    let mut e: cudaEvent_t = std::ptr::null_mut();
    // SAFETY: valid out-parameters.
    unsafe {
        assert_eq!(cudaStreamCreate(&raw mut s), 0);
        assert_eq!(cudaEventCreate(&raw mut e), 0);
        assert_eq!(cudaStreamSynchronize(s), 0);
        assert_eq!(cudaStreamSynchronize(s), 0);
        assert_eq!(cudaStreamSynchronize(s), 0);
        assert_eq!(sent(Op::StreamSynchronize), 1);
        // A stream known to be done is answered at once.
        assert_eq!(cudaStreamQuery(s), 0);
        assert_eq!(sent(Op::StreamQuery), 0);
        // Another stream was not covered by that.
        assert_eq!(cudaStreamSynchronize(std::ptr::null_mut()), 0);
        assert_eq!(sent(Op::StreamSynchronize), 2);
        // A device synchronisation covers every stream of the device.
        assert_eq!(cudaDeviceSynchronize(), 0);
        assert_eq!(cudaDeviceSynchronize(), 0);
        assert_eq!(cudaStreamSynchronize(s), 0);
        assert_eq!(sent(Op::DeviceSynchronize), 1);
        assert_eq!(sent(Op::StreamSynchronize), 2);
        // Work in between: the next one waits for it; a query that finds it done covers the
        // stream too.
        assert_eq!(cudaEventRecord(e, s), 0);
        assert_eq!(cudaStreamQuery(s), 0);
        assert_eq!(cudaStreamSynchronize(s), 0);
        assert_eq!(sent(Op::StreamQuery), 1);
        assert_eq!(sent(Op::StreamSynchronize), 2);
        // A query answered from the guest's records is no request.
        let mut flags = 0;
        assert_eq!(cudaStreamGetFlags(s, &raw mut flags), 0);
        assert_eq!(cudaStreamSynchronize(s), 0);
        assert_eq!(sent(Op::StreamSynchronize), 2);
        // A synchronisation that failed covers nothing: the next one goes to the host.
        assert_eq!(cudaEventRecord(e, s), 0);
        fake.state().fail_next = Some((Op::StreamSynchronize, cu::cudaErrorUnknown, false));
        assert_eq!(cudaStreamSynchronize(s), cu::cudaErrorUnknown);
        assert_eq!(cudaStreamSynchronize(s), 0);
        assert_eq!(sent(Op::StreamSynchronize), 4);
    }
}

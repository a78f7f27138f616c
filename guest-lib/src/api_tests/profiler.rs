//! The profiler API (`cudaProfilerStart`/`Stop`, `cuProfilerStart`/`Stop`) against the test
//! double: without `QCUDA_PROFILE` it sends nothing; with it, the host's recording of the
//! process is armed, read and written as a trace file.

use super::*;
/// `f` of the profiler API.
fn call(f: unsafe extern "C" fn() -> cudaError_t) -> cudaError_t {
    // SAFETY: the profiler calls take no arguments.
    unsafe { f() }
}

use crate::{
    core::transport::profile::Profile,
    driver::api::{context::*, init::cuInit},
    runtime::{memory::cudaMalloc, profiler::*},
};

#[test]
fn without_a_profile_the_profiler_api_costs_no_request() {
    let fake = setup();
    let mut p: *mut c_void = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cudaMalloc(&raw mut p, 64) }, cudaSuccess);
    let before = fake.state().requests;
    for _ in 0..10 {
        assert_eq!(call(cudaProfilerStart), cudaSuccess);
        assert_eq!(call(cudaProfilerStop), cudaSuccess);
    }
    // SAFETY: no arguments; the runtime's primary context is current after cudaMalloc.
    unsafe {
        assert_eq!(cuInit(0), 0);
        assert_eq!(cuProfilerStart(), 0);
        assert_eq!(cuProfilerStop(), 0);
    }
    assert_eq!(fake.state().requests, before, "nothing sent");
    assert_eq!(fake.state().trace_arms, 0);
    // The same calls of a program cost the same requests as before any of this existed: one
    // Malloc, one request.
    // SAFETY: as above.
    assert_eq!(unsafe { cudaMalloc(&raw mut p, 64) }, cudaSuccess);
    assert_eq!(fake.state().requests, before + 1);
}

#[test]
fn with_a_profile_the_host_records_and_a_stop_writes_the_trace() {
    let fake = setup();
    let dir = std::env::temp_dir().join(format!("qcuda-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{:?}.json", std::thread::current().id()).replace(['(', ')'], ""));
    let rt = crate::core::runtime::runtime().unwrap();
    // The whole run: armed as the session opens.
    rt.session.set_profile(Profile::new(file.clone(), false));
    assert_eq!(fake.state().trace_arms, 1);
    assert!(fake.state().trace_armed);
    assert_eq!(call(cudaProfilerStart), cudaSuccess, "already recording");
    assert_eq!(fake.state().trace_arms, 1);
    assert_eq!(call(cudaProfilerStop), cudaSuccess);
    assert!(!fake.state().trace_armed);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"name\":\"kernel()\""), "{text}");
    assert!(text.contains("\"mangled\":\"_Z6kernelv\""));
    assert!(
        text.contains("\"guest_realtime_offset_ns\""),
        "clocks sampled"
    );
    // A second region adds to the file.
    assert_eq!(call(cudaProfilerStart), cudaSuccess);
    assert_eq!(fake.state().trace_arms, 2);
    assert_eq!(call(cudaProfilerStop), cudaSuccess);
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.matches("\"cat\":\"kernel\"").count(), 2);
    let _ = std::fs::remove_file(&file);
}

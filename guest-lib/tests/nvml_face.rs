//! The NVML face (libnvidia-ml.so.1) on a machine without /dev/qcuda: a C program loads it as
//! NCCL does and checks what it answers without a driver (tests/driver/nvml.c).

mod common;

#[test]
fn nvml_without_a_device_reports_the_missing_driver() {
    let lib = common::link_library("nvml_face");
    let dir = lib.parent().unwrap();
    let (out, err) = common::run_c_program(dir, "nvml.c", &[]);
    for line in [
        "open 1",
        "init 9 Driver Not Loaded",
        "count 1 7",
        "nvlink 3 3",
        "missing 1",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "missing {line:?} in:\n{out}"
        );
    }
    let said = err
        .lines()
        .filter(|l| l.contains("nvmlDeviceGetNvLinkState is not supported"))
        .count();
    assert_eq!(said, 1, "{err}");
}

//! The NVML face (libnvidia-ml.so.1) on a machine without /dev/qcuda: a C program loads it as
//! NCCL does and checks what it answers without a driver (tests/driver/nvml.c).

mod common;

use std::process::Command;

#[test]
fn nvml_without_a_device_reports_the_missing_driver() {
    let lib = common::link_library("nvml_face");
    let dir = lib.parent().unwrap();
    let exe = dir.join("nvml");
    let cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-o")
        .arg(&exe)
        .arg(common::crate_dir().join("tests/driver/nvml.c"))
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-ldl")
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = Command::new(&exe).output().expect("run the program");
    let out = String::from_utf8_lossy(&run.stdout);
    let err = String::from_utf8_lossy(&run.stderr);
    println!("{out}{err}");
    assert!(run.status.success());
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

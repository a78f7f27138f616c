//! The driver face (libcuda.so.1) on a machine without /dev/qcuda: a C program linked against
//! the library of this test run checks versions, `cuGetProcAddress`'s rules, `cuInit`'s missing
//! device, and that an unsupported entry point, an unknown export table and an unused table
//! slot each fail with a CUDA error and say so exactly once on stderr.

mod common;

#[test]
fn refusals_are_cuda_errors_logged_once() {
    let lib = common::link_library("driver_face");
    let dir = lib.parent().unwrap();
    let (out, err) = common::run_c_program(dir, "unsupported.c", &[dir.join("libcuda.so.1")]);
    let expect = [
        "version 0 13000",
        "init 100",
        "proc-memalloc 0 0 1",
        "proc-ptds 0 0 1",
        "proc-missing 0 1 1",
        "proc-old 0 2 1",
        "proc-newer 1",
        "luid 801 801",
        "table-unknown 1 1",
        "table-ctx 0 744 801 801",
        "name CUDA_ERROR_NO_DEVICE",
    ];
    for line in expect {
        assert!(
            out.lines().any(|l| l == line),
            "missing {line:?} in:\n{out}"
        );
    }
    let once = |needle: &str| err.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(once("cuDeviceGetLuid is not supported"), 1, "{err}");
    assert_eq!(once("cuGetExportTable: no table 00112233"), 1, "{err}");
    assert_eq!(
        once("export table 21318c60 slot 20 is not supported"),
        1,
        "{err}"
    );
}

//! Shared by the integration tests: the libcudart.so.13 built from this very test run.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// guest-lib's directory.
pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Builds this tree's staticlib (`libqcudart.a`) and links it with `link.sh` into
/// `<tmp>/<name>/libcudart.so.13`, exactly as build.sh does for the release build.
pub fn link_library(name: &str) -> PathBuf {
    // `cargo test` builds the rlib only, and a staticlib left in the profile folder by an
    // earlier `cargo build` may be older than the code under test: build this tree's, in a
    // target dir of its own (the one of this test run is locked by the running cargo).
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("staticlib");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--lib", "--manifest-path"])
        .arg(crate_dir().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("run cargo build for the staticlib");
    assert!(status.success(), "cargo build of the staticlib failed");
    let archive = target.join("debug").join("libqcudart.a");
    assert!(archive.exists(), "{} was not built", archive.display());
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(name)
        .join("libcudart.so.13");
    let status = Command::new(crate_dir().join("link.sh"))
        .arg(&archive)
        .arg(&out)
        .status()
        .expect("run link.sh");
    assert!(status.success(), "link.sh failed");
    out
}

/// Builds the C program `tests/driver/<source>` next to the libraries in `dir` (found there at
/// run time through its rpath), runs it, echoes its output, checks it exited 0, and returns its
/// stdout and stderr. `libs` are extra files to link (a library of `dir`, say).
#[allow(dead_code)]
pub fn run_c_program(dir: &Path, source: &str, libs: &[PathBuf]) -> (String, String) {
    let exe = dir.join(source.trim_end_matches(".c"));
    let cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-o")
        .arg(&exe)
        .arg(crate_dir().join("tests/driver").join(source))
        .args(libs)
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
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    println!("{out}{err}");
    assert!(run.status.success());
    (out, err)
}

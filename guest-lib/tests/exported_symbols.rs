//! The symbol-versioning check on the library of this test run: `check-symbols.sh` must find
//! every name of NVIDIA's libcudart.so.13 (gen/exports.txt, libcudart.map) exported as a function
//! at version `libcudart.so.13`, and nothing else. Without the version node, ld.so refuses
//! applications that bind `name@libcudart.so.13`; rustc's own version script would drop it
//! silently, which is why the library is relinked (link.sh) and checked with `readelf`.

mod common;

use std::process::Command;

#[test]
fn every_map_name_is_exported_at_version_libcudart_so_13_and_nothing_else() {
    let lib = common::link_library("exported_symbols");
    let out = Command::new(common::crate_dir().join("check-symbols.sh"))
        .arg(&lib)
        .output()
        .expect("run check-symbols.sh (needs readelf)");
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    let exports = std::fs::read_to_string(common::crate_dir().join("gen/exports.txt")).unwrap();
    let n = exports.lines().count();
    assert!(n > 400, "gen/exports.txt lists only {n} functions");
    assert!(
        text.contains(&format!("exports all {n} functions")),
        "{text}"
    );
}

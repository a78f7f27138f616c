//! docs/api-coverage.md is generated from the code: every export of NVIDIA's libcudart.so.13
//! (gen/exports.txt) is either implemented in guest-lib's api/ or listed in api/unsupported.rs
//! (where it answers `cudaErrorNotSupported`, logged once). This test fails when the document
//! is stale; `QCUDA_BLESS=1 cargo test -p guest-lib --test api_coverage` rewrites it.

use std::{collections::BTreeMap, fs, path::Path};

/// The names in the `not_supported!` list.
fn not_supported(src: &str) -> Vec<String> {
    let start = src
        .find("not_supported! {")
        .expect("api/unsupported.rs has a not_supported! list");
    let body = &src[start + "not_supported! {".len()..];
    let end = body.find('}').expect("the list ends");
    body[..end]
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.starts_with("//"))
        .map(str::to_owned)
        .collect()
}

/// The area a function belongs to, from its name.
fn area(name: &str) -> &'static str {
    const AREAS: &[(&str, &str)] = &[
        ("__cuda", "Registration and launch (hidden API)"),
        ("cudaGraphics", "Graphics interop"),
        ("cudaGL", "Graphics interop"),
        ("cudaEGL", "Graphics interop"),
        ("cudaVDPAU", "Graphics interop"),
        ("cudaGetDriverEntryPoint", "Driver interop"),
        ("cudaGetExportTable", "Driver interop"),
        ("cudaGetFuncBySymbol", "Launch"),
        ("cudaDriverGetVersion", "Versions"),
        ("cudaRuntimeGetVersion", "Versions"),
        ("cudaGraph", "Graphs"),
        ("cudaStreamBeginCapture", "Graphs"),
        ("cudaStreamEndCapture", "Graphs"),
        ("cudaStreamIsCapturing", "Graphs"),
        ("cudaStreamGetCapture", "Graphs"),
        ("cudaStreamUpdateCapture", "Graphs"),
        ("cudaThreadExchangeStreamCaptureMode", "Graphs"),
        ("cudaUserObject", "Graphs"),
        ("cudaDeviceGraphMem", "Graphs"),
        ("cudaDeviceGetGraphMem", "Graphs"),
        ("cudaDeviceSetGraphMem", "Graphs"),
        ("cudaMemPool", "Stream-ordered allocation"),
        ("cudaMallocAsync", "Stream-ordered allocation"),
        ("cudaMallocFromPoolAsync", "Stream-ordered allocation"),
        ("cudaFreeAsync", "Stream-ordered allocation"),
        ("cudaDeviceGetDefaultMemPool", "Stream-ordered allocation"),
        ("cudaDeviceGetMemPool", "Stream-ordered allocation"),
        ("cudaDeviceSetMemPool", "Stream-ordered allocation"),
        ("cudaStream", "Streams"),
        ("cudaLaunchHostFunc", "Streams"),
        ("cudaEvent", "Events"),
        ("cudaIpc", "Inter-process"),
        ("cudaExternal", "External resources"),
        ("cudaImportExternal", "External resources"),
        ("cudaDestroyExternal", "External resources"),
        ("cudaSignalExternal", "External resources"),
        ("cudaWaitExternal", "External resources"),
        ("cudaCreateTextureObject", "Textures and surfaces"),
        ("cudaDestroyTextureObject", "Textures and surfaces"),
        ("cudaGetTextureObject", "Textures and surfaces"),
        ("cudaCreateSurfaceObject", "Textures and surfaces"),
        ("cudaDestroySurfaceObject", "Textures and surfaces"),
        ("cudaGetSurfaceObject", "Textures and surfaces"),
        ("cudaCreateChannelDesc", "Textures and surfaces"),
        ("cudaGetChannelDesc", "Textures and surfaces"),
        ("cudaArray", "Arrays"),
        ("cudaMallocArray", "Arrays"),
        ("cudaMalloc3DArray", "Arrays"),
        ("cudaMallocMipmappedArray", "Arrays"),
        ("cudaFreeArray", "Arrays"),
        ("cudaFreeMipmappedArray", "Arrays"),
        ("cudaGetMipmappedArray", "Arrays"),
        ("cudaMipmappedArray", "Arrays"),
        ("cudaLaunch", "Launch"),
        ("cudaFunc", "Launch"),
        ("cudaOccupancy", "Launch"),
        ("cudaGetKernel", "Launch"),
        ("cudaKernel", "Launch"),
        ("cudaLibrary", "Libraries"),
        ("cudaMemcpy", "Copies and memsets"),
        ("cudaMemset", "Copies and memsets"),
        ("cudaHost", "Host memory"),
        ("cudaMallocHost", "Host memory"),
        ("cudaFreeHost", "Host memory"),
        ("cudaMallocManaged", "Host memory"),
        ("cudaMem", "Memory"),
        ("cudaMalloc", "Memory"),
        ("cudaFree", "Memory"),
        ("cudaPointer", "Memory"),
        ("cudaGetSymbol", "Memory"),
        ("cudaDevice", "Devices"),
        ("cudaSetDevice", "Devices"),
        ("cudaGetDevice", "Devices"),
        ("cudaChooseDevice", "Devices"),
        ("cudaSetValidDevices", "Devices"),
        ("cudaInitDevice", "Devices"),
        ("cudaThread", "Devices"),
        ("cudaGetError", "Errors"),
        ("cudaGetLastError", "Errors"),
        ("cudaPeekAtLastError", "Errors"),
        ("cudaProfiler", "Profiler"),
        ("cudaLogs", "Logs"),
    ];
    AREAS
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map_or("Other", |(_, a)| a)
}

/// Why an area is left out on purpose, where it is.
fn note(area: &str) -> Option<&'static str> {
    Some(match area {
        "Graphics interop" => {
            "OpenGL, EGL, VDPAU and Direct3D objects live in the guest's display stack, which the \
             host GPU cannot reach: not supported by design."
        }
        "Driver interop" => {
            "These hand out driver API entry points (`cu*`); the guest has no CUDA driver, so a \
             caller would get nothing it could use."
        }
        "Inter-process" => {
            "IPC handles name host memory of another process; across VMs they would break the \
             isolation between sessions."
        }
        "External resources" => {
            "External memory and semaphores are file descriptors or handles of the guest's own \
             drivers (Vulkan, NvSci), which the host cannot import."
        }
        _ => return None,
    })
}

fn render(exports: &[&str], unsupported: &[String]) -> String {
    let mut by_area: BTreeMap<&str, Vec<(&str, bool)>> = BTreeMap::new();
    for &name in exports {
        let works = !unsupported.iter().any(|u| u == name);
        by_area.entry(area(name)).or_default().push((name, works));
    }
    let implemented = exports.len() - unsupported.len();
    let mut out = String::new();
    out.push_str(
        "# Runtime API coverage\n\n\
         Generated from the code by `guest-lib/tests/api_coverage.rs` (do not edit; run\n\
         `QCUDA_BLESS=1 cargo test -p guest-lib --test api_coverage` after changing the API).\n\
         Every export of NVIDIA's `libcudart.so.13` (CUDA 13.0, `guest-lib/gen/exports.txt`) is\n\
         either implemented by qcuda's guest-lib or answers `cudaErrorNotSupported`, logged once\n\
         per process (`guest-lib/src/api/unsupported.rs`); none pretends to succeed.\n\n",
    );
    out.push_str(&format!(
        "**{implemented} of {} exports implemented; {} answer `cudaErrorNotSupported`.**\n\n",
        exports.len(),
        unsupported.len()
    ));
    out.push_str("| area | implemented | not supported |\n|---|---|---|\n");
    for (area, fns) in &by_area {
        let ok = fns.iter().filter(|f| f.1).count();
        out.push_str(&format!("| {area} | {ok} | {} |\n", fns.len() - ok));
    }
    for (area, fns) in &by_area {
        out.push_str(&format!("\n## {area}\n\n"));
        if let Some(note) = note(area) {
            out.push_str(note);
            out.push_str("\n\n");
        }
        out.push_str("| function | qcuda |\n|---|---|\n");
        for (name, works) in fns {
            let state = if *works {
                "implemented"
            } else {
                "`cudaErrorNotSupported`"
            };
            out.push_str(&format!("| `{name}` | {state} |\n"));
        }
    }
    out
}

#[test]
fn the_coverage_table_in_docs_is_current() {
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exports = fs::read_to_string(krate.join("gen/exports.txt")).unwrap();
    let exports: Vec<&str> = exports.lines().filter(|l| !l.is_empty()).collect();
    let unsupported =
        not_supported(&fs::read_to_string(krate.join("src/api/unsupported.rs")).unwrap());
    for u in &unsupported {
        assert!(
            exports.contains(&u.as_str()),
            "{u} is listed as not supported but is no export"
        );
    }
    let doc = krate.join("../docs/api-coverage.md");
    let want = render(&exports, &unsupported);
    if std::env::var_os("QCUDA_BLESS").is_some() {
        fs::write(&doc, &want).unwrap();
    }
    let have = fs::read_to_string(&doc).unwrap_or_default();
    assert!(
        have == want,
        "docs/api-coverage.md is stale: run QCUDA_BLESS=1 cargo test -p guest-lib --test api_coverage"
    );
}

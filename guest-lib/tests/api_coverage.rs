//! docs/api-coverage.md is generated from the code: every export of NVIDIA's libcudart.so.13
//! (gen/exports.txt) is either implemented in guest-lib's api/ or listed in api/unsupported.rs
//! (where it answers `cudaErrorNotSupported`, logged once); every symbol of NVIDIA's
//! libcuda.so.1 (gen/driver-exports.txt) is implemented in driver/api/ or a stub of
//! driver/unsupported.rs (`CUDA_ERROR_NOT_SUPPORTED`, logged once); and every slot of the
//! export tables of driver/export_tables.rs is implemented or such a stub. This test fails
//! when the document is stale; `QCUDA_BLESS=1 cargo test -p guest-lib --test api_coverage`
//! rewrites it.

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
            "These hand out driver API entry points (`cu*`) and tables: the driver face's own \
             (`libcuda.so.1`, below), through `cuGetProcAddress` and `cuGetExportTable`."
        }
        "Inter-process" => {
            "Memory, event and pool handles work between the processes of one VM: the host \
             brokers each export under a token and a secret of that VM's table (guest-lib.md, \
             \"IPC\"); a handle of another VM opens nothing."
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
         per process (`guest-lib/src/runtime/unsupported.rs`); none pretends to succeed.\n\n",
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

/// The driver API's areas, by name prefix (longest first where they overlap).
fn driver_area(name: &str) -> &'static str {
    const AREAS: &[(&str, &str)] = &[
        ("cuGraphics", "Graphics interop"),
        ("cuGL", "Graphics interop"),
        ("cuEGL", "Graphics interop"),
        ("cuVDPAU", "Graphics interop"),
        ("cuD3D", "Graphics interop"),
        ("cuDevicePrimaryCtx", "Contexts"),
        ("cuCtx", "Contexts"),
        ("cuGreenCtx", "Green contexts and resources"),
        ("cuDevResource", "Green contexts and resources"),
        ("cuDeviceGetDevResource", "Green contexts and resources"),
        ("cuStreamGetGreenCtx", "Green contexts and resources"),
        ("cuDevice", "Devices"),
        ("cuInit", "Initialisation and entry points"),
        ("cuDriverGetVersion", "Initialisation and entry points"),
        ("cuGetProcAddress", "Initialisation and entry points"),
        ("cuGetExportTable", "Initialisation and entry points"),
        ("cuGetError", "Initialisation and entry points"),
        ("cuModule", "Modules and libraries"),
        ("cuLibrary", "Modules and libraries"),
        ("cuKernel", "Modules and libraries"),
        ("cuFunc", "Modules and libraries"),
        ("cuLink", "JIT linking"),
        ("cuOccupancy", "Launch and occupancy"),
        ("cuLaunch", "Launch and occupancy"),
        ("cuParam", "Launch and occupancy"),
        ("cuStreamBeginCapture", "Graphs and capture"),
        ("cuStreamEndCapture", "Graphs and capture"),
        ("cuStreamIsCapturing", "Graphs and capture"),
        ("cuStreamGetCapture", "Graphs and capture"),
        ("cuStreamUpdateCapture", "Graphs and capture"),
        ("cuThreadExchangeStreamCaptureMode", "Graphs and capture"),
        ("cuGraph", "Graphs and capture"),
        ("cuUserObject", "Graphs and capture"),
        ("cuDeviceGraphMem", "Graphs and capture"),
        ("cuStreamWaitValue", "Stream memory operations"),
        ("cuStreamWriteValue", "Stream memory operations"),
        ("cuStreamBatchMemOp", "Stream memory operations"),
        ("cuStream", "Streams"),
        ("cuEvent", "Events"),
        ("cuMemPool", "Stream-ordered allocation"),
        ("cuMemAllocAsync", "Stream-ordered allocation"),
        ("cuMemAllocFromPoolAsync", "Stream-ordered allocation"),
        ("cuMemFreeAsync", "Stream-ordered allocation"),
        ("cuMemCreate", "Virtual memory management"),
        ("cuMemRelease", "Virtual memory management"),
        ("cuMemMap", "Virtual memory management"),
        ("cuMemUnmap", "Virtual memory management"),
        ("cuMemAddress", "Virtual memory management"),
        ("cuMemSetAccess", "Virtual memory management"),
        ("cuMemGetAccess", "Virtual memory management"),
        ("cuMemExport", "Virtual memory management"),
        ("cuMemImport", "Virtual memory management"),
        ("cuMemGetAllocation", "Virtual memory management"),
        ("cuMemRetainAllocationHandle", "Virtual memory management"),
        ("cuMemcpy", "Copies and memsets"),
        ("cuMemset", "Copies and memsets"),
        ("cuMem", "Memory"),
        ("cuPointer", "Memory"),
        ("cuArray", "Arrays, textures and surfaces"),
        ("cuMipmappedArray", "Arrays, textures and surfaces"),
        ("cuTex", "Arrays, textures and surfaces"),
        ("cuSurf", "Arrays, textures and surfaces"),
        ("cuTensorMap", "Arrays, textures and surfaces"),
        ("cuIpc", "Inter-process"),
        ("cuMulticast", "Inter-process"),
        ("cuExternal", "External resources"),
        ("cuImportExternal", "External resources"),
        ("cuDestroyExternal", "External resources"),
        ("cuSignalExternal", "External resources"),
        ("cuWaitExternal", "External resources"),
        ("cuProfiler", "Profiler"),
        ("cuCheckpoint", "Checkpoint and coredump"),
        ("cuCoredump", "Checkpoint and coredump"),
        ("cuLog", "Logs"),
        ("cuFlushGPUDirectRDMAWrites", "Other"),
    ];
    AREAS
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map_or("Other", |(_, a)| a)
}

/// The names in the generated `unsupported!` list of the driver face.
fn driver_unsupported(src: &str) -> Vec<String> {
    let start = src
        .find("unsupported! {")
        .expect("driver/unsupported.rs has a list");
    let body = &src[start + "unsupported! {".len()..];
    let end = body.find('}').expect("the list ends");
    body[..end].split_whitespace().map(str::to_owned).collect()
}

/// One export table: UUID, size in words, and its implemented slots.
struct TableInfo {
    uuid: String,
    words: usize,
    implemented: Vec<(usize, String)>,
}

/// The tables of driver/export_tables.rs, read from its source: each `static NAME: Table<N>`
/// with its `t[i] = function` lines, and the UUID `tables()` gives it.
fn export_tables(src: &str) -> Vec<TableInfo> {
    let mut out = Vec::new();
    for (i, _) in src.match_indices("static ") {
        let rest = &src[i + "static ".len()..];
        let Some((name, rest)) = rest.split_once(": Table<") else {
            continue;
        };
        if name.contains(|c: char| !(c.is_ascii_uppercase() || c == '_')) {
            continue;
        }
        let words: usize = rest[..rest.find('>').unwrap()].parse().unwrap();
        let end = [rest.find("\n});"), rest.find("]);"), rest.find("));")]
            .into_iter()
            .flatten()
            .min()
            .expect("the table ends");
        let body = &rest[..end];
        let mut implemented: Vec<(usize, String)> = body
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let (slot, f) = l.strip_prefix("t[")?.split_once("] = ")?;
                Some((slot.parse().ok()?, f.split(' ').next()?.to_owned()))
            })
            .collect();
        if !body.contains("stub_table!") {
            // A table without stubs (no size word): every function word is implemented.
            implemented = body
                .lines()
                .map(str::trim)
                .filter(|l| l.ends_with("as *const c_void,"))
                .enumerate()
                .map(|(k, l)| (k, l.split(' ').next().unwrap().to_owned()))
                .collect();
        }
        let key = format!("{name}.address()");
        let list = src
            .find("fn tables()")
            .expect("driver/export_tables.rs has tables()");
        let at = list + src[list..].find(&key).expect("every table is in tables()");
        let before = &src[..at];
        let q = before.rfind("uuid(\"").expect("a uuid before it") + "uuid(\"".len();
        let uuid = before[q..q + 32].to_owned();
        out.push(TableInfo {
            uuid,
            words,
            implemented,
        });
    }
    out.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    out
}

fn render_driver(exports: &[&str], unsupported: &[String], tables: &[TableInfo]) -> String {
    let mut by_area: BTreeMap<&str, Vec<(&str, bool)>> = BTreeMap::new();
    for &name in exports {
        let works = !unsupported.iter().any(|u| u == name);
        by_area
            .entry(driver_area(name))
            .or_default()
            .push((name, works));
    }
    let implemented = exports.len() - unsupported.len();
    let mut out = String::new();
    out.push_str(
        "\n# Driver API coverage\n\n\
         Every symbol of NVIDIA's `libcuda.so.1` that `cuGetProcAddress` hands out (CUDA 13.0's\n\
         `cuda*Typedefs.h`, `guest-lib/gen/driver-exports.txt`: every form, `_v2`/`_ptds`/`_ptsz`\n\
         included) is exported by qcuda's `libcuda.so.1`: implemented in `guest-lib/src/driver/api/`,\n\
         or a stub of `guest-lib/src/driver/unsupported.rs` that answers `CUDA_ERROR_NOT_SUPPORTED`\n\
         and says so once per process. Most stubs are whole areas qcuda does not remote: graphics\n\
         interop, external resources, green contexts, multicast, coredumps, and the rarer forms of\n\
         arrays (sparse, planes, memory requirements) and graphs (external-semaphore and batch\n\
         memory-operation nodes, kernel node attributes, user objects).\n\n",
    );
    out.push_str(&format!(
        "**{implemented} of {} symbols implemented; {} answer `CUDA_ERROR_NOT_SUPPORTED`.**\n\n",
        exports.len(),
        unsupported.len()
    ));
    out.push_str("| area | implemented | not supported |\n|---|---|---|\n");
    for (area, fns) in &by_area {
        let ok = fns.iter().filter(|f| f.1).count();
        out.push_str(&format!("| {area} | {ok} | {} |\n", fns.len() - ok));
    }
    out.push_str(
        "\n## Export tables (`cuGetExportTable`)\n\n\
         What each table and slot is, and how it was measured: docs/driver-export-tables.md. An\n\
         unknown UUID answers `CUDA_ERROR_INVALID_VALUE`; every slot not listed as implemented\n\
         is a stub that answers `CUDA_ERROR_NOT_SUPPORTED` and names its table and slot once.\n\n\
         | table | words | implemented slots |\n|---|---|---|\n",
    );
    for t in tables {
        let slots: Vec<String> = t
            .implemented
            .iter()
            .map(|(i, f)| format!("{i} (`{f}`)"))
            .collect();
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            t.uuid,
            t.words,
            slots.join(", ")
        ));
    }
    for (area, fns) in &by_area {
        out.push_str(&format!(
            "\n## Driver: {area}\n\n| function | qcuda |\n|---|---|\n"
        ));
        for (name, works) in fns {
            let state = if *works {
                "implemented"
            } else {
                "`CUDA_ERROR_NOT_SUPPORTED`"
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
        not_supported(&fs::read_to_string(krate.join("src/runtime/unsupported.rs")).unwrap());
    for u in &unsupported {
        assert!(
            exports.contains(&u.as_str()),
            "{u} is listed as not supported but is no export"
        );
    }
    let driver_exports = fs::read_to_string(krate.join("gen/driver-exports.txt")).unwrap();
    let driver_exports: Vec<&str> = driver_exports.lines().filter(|l| !l.is_empty()).collect();
    let driver_unsupported =
        driver_unsupported(&fs::read_to_string(krate.join("src/driver/unsupported.rs")).unwrap());
    for u in &driver_unsupported {
        assert!(
            driver_exports.contains(&u.as_str()),
            "{u} is no driver export"
        );
    }
    let tables =
        export_tables(&fs::read_to_string(krate.join("src/driver/export_tables.rs")).unwrap());
    assert!(tables.len() >= 9, "{} export tables found", tables.len());
    let doc = krate.join("../docs/api-coverage.md");
    let want = render(&exports, &unsupported)
        + &render_driver(&driver_exports, &driver_unsupported, &tables);
    if std::env::var_os("QCUDA_BLESS").is_some() {
        fs::write(&doc, &want).unwrap();
    }
    let have = fs::read_to_string(&doc).unwrap_or_default();
    assert!(
        have == want,
        "docs/api-coverage.md is stale: run QCUDA_BLESS=1 cargo test -p guest-lib --test api_coverage"
    );
}

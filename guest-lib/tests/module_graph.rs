//! The shape of guest-lib (DESIGN.md §6a): one core beneath three faces, and no circle of
//! imports anywhere in it.
//!
//! Reads every `mod` and `use` line and every path in code of `src/` (the reader is
//! `tests/rust/module_graph.rs` at the top of the repository, shared with vhost-cuda), builds
//! the graph of which module uses which, and fails when
//! - the core uses a face (`runtime`, `driver`, `nvml`),
//! - one face uses another,
//! - `generated` (ABI types, a leaf every area may use) uses anything of the crate, or
//! - any modules form a circle: files of one folder, or folders of one parent (each taken
//!   whole, its `mod.rs` included), that reach each other through their imports, or
//! - a module of the core uses one of a higher layer of the core ([`CORE_LAYERS`]).
//!
//! Test-only code (`api_tests`, the `fake_*` test doubles, `#[cfg(test)]` items) is not read.

#[path = "../../tests/rust/module_graph.rs"]
mod module_graph;

use std::path::Path;

use module_graph::{circles, segments, Crate, Edges, ModPath};

/// Uses that break the rules and are still to be removed (none today: every operation both faces
/// offer is the core's). The list must be exact: an entry that no longer occurs fails the test
/// too, so it only ever shrinks.
const NOT_YET_IN_CORE: &[&str] = &[];

/// Which areas each area may use (besides itself).
fn allowed(from: &str, to: &str) -> bool {
    match from {
        "generated" => false,
        "core" => to == "generated",
        "runtime" | "driver" | "nvml" => to == "core" || to == "generated",
        _ => false,
    }
}

/// The core's layers, from the bottom: each of the core's modules is in one, and uses only its
/// own layer and those below (docs/guest-lib.md, "Layout").
const CORE_LAYERS: &[&[&str]] = &[
    // Words every layer speaks: errors, conversions, warnings, the last error, handle tables.
    &[
        "cuda_error",
        "conv",
        "warnings",
        "last_error",
        "handles",
        "addr_map",
    ],
    // The connection: the ioctl, calls, the session, batching, capture state.
    &["transport"],
    // The tables and state of each concept, given the session (and each other) as arguments.
    &[
        "devices", "memory", "streams", "modules", "launch", "arrays",
    ],
    // The process's Runtime, which owns the tables, and the operations on it.
    &["runtime"],
];

fn core_layer(name: &str) -> Option<usize> {
    CORE_LAYERS.iter().position(|l| l.contains(&name))
}

/// The core's uses of a higher layer, and core modules in no layer.
fn layer_breaks(edges: &Edges) -> Vec<String> {
    let mut out = Vec::new();
    for (from, deps) in edges {
        let [a, x, ..] = &from[..] else { continue };
        if a != "core" {
            continue;
        }
        let Some(lx) = core_layer(x) else {
            out.push(format!("core::{x} is in no layer of CORE_LAYERS"));
            continue;
        };
        for to in deps.keys() {
            if let [b, y, ..] = &to[..] {
                if b == "core" && core_layer(y).is_some_and(|ly| ly > lx) {
                    out.push(format!("{} -> {}", from.join("::"), to.join("::")));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn area(m: &ModPath) -> &str {
    m.first().map_or("lib", String::as_str)
}

/// The rule breaks of a graph: each as `from -> to`.
fn violations(edges: &Edges) -> Vec<String> {
    let mut out = Vec::new();
    for (from, deps) in edges {
        if from.is_empty() {
            continue;
        }
        for to in deps.keys() {
            let (a, b) = (area(from), area(to));
            if a == b || to.is_empty() {
                continue;
            }
            if !allowed(a, b) {
                out.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    out
}

fn guest_lib() -> Crate {
    Crate::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
}

#[test]
fn the_core_uses_no_face_and_the_faces_use_no_other() {
    let known = guest_lib();
    for area in ["core", "runtime", "driver", "nvml", "generated"] {
        assert!(
            known.modules.contains_key(&vec![area.to_string()]),
            "src/{area} is missing"
        );
    }
    let mut broken = violations(&known.edges());
    let stale: Vec<&str> = NOT_YET_IN_CORE
        .iter()
        .copied()
        .filter(|e| !broken.iter().any(|b| b == e))
        .collect();
    assert!(
        stale.is_empty(),
        "no longer used: remove from NOT_YET_IN_CORE: {stale:?}"
    );
    broken.retain(|b| !NOT_YET_IN_CORE.contains(&b.as_str()));
    assert!(
        broken.is_empty(),
        "guest-lib's imports break DESIGN.md §6a (a face may use core; core uses no face; the \
         faces use no other):\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn no_modules_of_guest_lib_import_each_other_in_a_circle() {
    let found = circles(&guest_lib().edges());
    let text: String = found.iter().map(ToString::to_string).collect();
    assert!(
        found.is_empty(),
        "{} circles of imports in guest-lib/src (a module that a module it uses also uses, \
         directly or through others: give the lower one what it needs as an argument):\n{text}",
        found.len()
    );
}

#[test]
fn the_core_uses_only_its_own_layer_and_those_below() {
    let broken = layer_breaks(&guest_lib().edges());
    assert!(
        broken.is_empty(),
        "guest-lib's core imports a higher layer (CORE_LAYERS):\n  {}",
        broken.join("\n  ")
    );
}

fn graph_of(files: &[(&str, &str)]) -> Edges {
    Crate::from_code(files).edges()
}

#[test]
fn the_checker_sees_imports_of_every_form() {
    let edges = graph_of(&[
        ("", "mod core;\n"),
        ("core", "mod a;\nmod b;\n"),
        ("core::a", "use crate::{core::b, runtime::x::f};\n"),
        (
            "core::b",
            "let s = \"crate::driver\";\nmod t {\n    use super::*;\n}\n",
        ),
        ("runtime", ""),
        (
            "runtime::x",
            "use super::super::driver::y; // crate::nvml\n",
        ),
        ("driver", "mod y;\n"),
        (
            "driver::y",
            "fn f() { crate::runtime::x::g(); }\npub(in crate::nvml) fn h() {}\n",
        ),
        ("nvml", ""),
    ]);
    let broken = violations(&edges);
    assert!(!broken.iter().any(|b| b.contains("nvml")), "{broken:?}");
    for b in [
        "core::a -> runtime::x",
        "driver::y -> runtime::x",
        "runtime::x -> driver::y",
    ] {
        assert!(broken.contains(&b.to_string()), "{b}: {broken:?}");
    }
    assert!(
        !broken.iter().any(|b| b.starts_with("core::b")),
        "{broken:?}"
    );
    let tops: Vec<String> = circles(&edges)
        .iter()
        .filter(|c| c.parent.is_empty())
        .flat_map(|c| c.members.clone())
        .collect();
    assert_eq!(tops, ["driver", "runtime"], "{edges:?}");
}

#[test]
fn the_checker_finds_circles_at_every_level_and_skips_test_code() {
    let edges = graph_of(&[
        ("", "mod core;\n"),
        // Files of one folder: a -> b -> c -> a; d only uses them.
        ("core", "mod a;\nmod b;\nmod c;\nmod d;\nmod memory;\nmod streams;\n"),
        ("core::a", "fn f() { super::b::g(); }\n"),
        ("core::b", "use super::c::{X, Y as Z};\n"),
        ("core::c", "pub use crate::core::a;\n"),
        ("core::d", "use super::{a, b::X};\n"),
        // Folders of one parent: memory::host -> streams::event, streams (mod.rs) -> memory.
        ("core::memory", "mod host;\n"),
        ("core::memory::host", "use crate::core::streams::event::Event;\n"),
        ("core::streams", "mod event;\nfn f() { event::g(); super::memory::h(); }\n"),
        ("core::streams::event", ""),
        // Test code uses anything.
        (
            "core::x",
            "#[cfg(test)]\nmod tests {\n    use crate::core::d;\n}\n#[cfg(not(test))]\nuse crate::core::a;\n\
             const S: &str = \"one \\\n    line\";\n#[cfg(test)]\nuse crate::core::c;\nuse crate::core::b;\n",
        ),
    ]);
    let found = circles(&edges);
    let shown: String = found.iter().map(ToString::to_string).collect();
    let members: Vec<&[String]> = found.iter().map(|c| c.members.as_slice()).collect();
    assert_eq!(
        members,
        [&["a", "b", "c"][..], &["memory", "streams"][..]],
        "{shown}"
    );
    assert!(found.iter().all(|c| c.parent == ["core"]), "{shown}");
    assert!(
        found[1]
            .arrows
            .contains(&"memory -> streams (event::Event)".to_string()),
        "{shown}"
    );
    let layers = layer_breaks(&graph_of(&[
        ("core::transport", "use crate::core::runtime::current;\n"),
        ("core::runtime", "use crate::core::transport::Call;\n"),
        ("core::elsewhere", ""),
    ]));
    assert_eq!(
        layers,
        [
            "core::elsewhere is in no layer of CORE_LAYERS",
            "core::transport -> core::runtime",
        ],
    );
    let x = &edges[&segments("core::x")];
    assert_eq!(
        x.keys().collect::<Vec<_>>(),
        [&segments("core::a"), &segments("core::b")],
        "{x:?}"
    );
}

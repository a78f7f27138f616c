//! The shape of guest-lib (DESIGN.md §6a): one core beneath three faces.
//!
//! Reads every `mod` and `use` line (and every `crate::` path) of `src/`, builds the graph of
//! which module uses which, and fails when
//! - the core uses a face (`runtime`, `driver`, `nvml`),
//! - one face uses another,
//! - `generated` (ABI types, a leaf every area may use) uses anything of the crate, or
//! - the top-level areas form a cycle.
//!
//! Test-only modules (`api_tests`, the `fake_*` test doubles) may use anything.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// A module path below the crate root: `["core", "session"]`.
type ModPath = Vec<String>;

/// Areas that hold only tests and test doubles; they may reach everywhere.
const TEST_ONLY: &[&str] = &["api_tests"];

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

/// Collects `src/**/*.rs` as module paths, following `mod` declarations from `lib.rs`.
fn modules(src: &Path) -> BTreeMap<ModPath, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(Vec::<String>::new(), src.join("lib.rs"))];
    while let Some((path, file)) = todo.pop() {
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let code = strip(&text);
        // The directory that this file's child modules live in.
        let dir = if path.is_empty() || file.file_name().is_some_and(|n| n == "mod.rs") {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        for decl in mod_declarations(&code) {
            let mut child = path.clone();
            child.push(decl.clone());
            let flat = dir.join(format!("{decl}.rs"));
            let nested = dir.join(&decl).join("mod.rs");
            let f = if flat.exists() { flat } else { nested };
            assert!(f.exists(), "mod {decl} of {}: no file", file.display());
            todo.push((child, f));
        }
        out.insert(path, code);
    }
    out
}

/// `mod name;` declarations (not inline `mod name { ... }` blocks).
fn mod_declarations(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in code.lines() {
        let t = line.trim();
        let t = strip_visibility(t);
        if let Some(rest) = t.strip_prefix("mod ") {
            if let Some(name) = rest.trim().strip_suffix(';') {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

fn strip_visibility(t: &str) -> &str {
    if let Some(rest) = t.strip_prefix("pub(") {
        return rest.split_once(')').map_or(t, |(_, r)| r.trim_start());
    }
    t.strip_prefix("pub ").unwrap_or(t)
}

/// Removes comments and the contents of string and character literals, keeping line structure.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == b'"' {
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    if b[j] == b'\n' {
                        out.push('\n');
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j + close.len();
            } else {
                out.push('r');
                i += 1;
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                } else if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x' or '\n'); lifetimes ('a) pass through.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Flattens a use tree (`a::{b, c::{d, e}}`) into paths.
fn flatten(tree: &str) -> Vec<Vec<String>> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let t = tree.split(" as ").next().unwrap_or(tree);
        return vec![segments(t)];
    };
    let prefix = segments(&tree[..open]);
    let close = tree.rfind('}').expect("balanced use tree");
    let inner = &tree[open + 1..close];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| {
            flatten(p)
                .into_iter()
                .map(|s| prefix.iter().cloned().chain(s).collect())
        })
        .collect()
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The module a path names, or `None` for paths outside the crate.
fn resolve(
    me: &ModPath,
    path: &[String],
    nested: bool,
    known: &BTreeMap<ModPath, String>,
) -> Option<ModPath> {
    let (mut base, mut rest): (ModPath, &[String]) = match path.first().map(String::as_str)? {
        "crate" | "$crate" => (Vec::new(), &path[1..]),
        // `super` at a file's top level is its parent; inside an inline module (indented) it is
        // the file's own module.
        "super" => {
            let mut b = me.clone();
            if !nested {
                b.pop();
            }
            (b, &path[1..])
        }
        "self" => (me.clone(), &path[1..]),
        _ => return None,
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    (0..=base.len())
        .rev()
        .map(|k| base[..k].to_vec())
        .find(|p| known.contains_key(p))
}

/// Every module each module uses.
fn graph(known: &BTreeMap<ModPath, String>) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut edges = BTreeMap::new();
    for (me, code) in known {
        let mut deps = BTreeSet::new();
        // `use` statements, which may span lines.
        let mut rest = code.as_str();
        while let Some(at) = find_use(rest) {
            let line_start = rest[..at].rfind('\n').map_or(0, |n| n + 1);
            let nested = rest[line_start..at].starts_with([' ', '\t']);
            let after = &rest[at..];
            let stmt_start = after.find("use ").unwrap() + 4;
            let end = after.find(';').expect("use statement ends");
            for p in flatten(&after[stmt_start..end]) {
                deps.extend(resolve(me, &p, nested, known));
            }
            rest = &after[end..];
        }
        // Inline `crate::a::b` paths in code.
        for (k, _) in code.match_indices("crate::") {
            if k > 0 && code[..k].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let tail: String = code[k..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            deps.extend(resolve(me, &segments(&tail), false, known));
        }
        deps.remove(me);
        edges.insert(me.clone(), deps);
    }
    edges
}

/// The offset of the next `use` item's visibility or `use` keyword at the start of a line.
fn find_use(code: &str) -> Option<usize> {
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let t = line.trim_start();
        let v = strip_visibility(t);
        if v.starts_with("use ") {
            return Some(offset + (line.len() - t.len()));
        }
        offset += line.len();
    }
    None
}

fn area(m: &ModPath) -> &str {
    m.first().map_or("lib", String::as_str)
}

fn test_only(m: &ModPath) -> bool {
    TEST_ONLY.contains(&area(m)) || m.last().is_some_and(|n| n.starts_with("fake_"))
}

/// The rule breaks of a graph: each as `from -> to`.
fn violations(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<String> {
    let mut out = Vec::new();
    let mut area_edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, deps) in edges {
        if test_only(from) || from.is_empty() {
            continue;
        }
        for to in deps {
            let (a, b) = (area(from), area(to));
            if a == b || to.is_empty() || test_only(to) {
                continue;
            }
            let edge = format!("{} -> {}", from.join("::"), to.join("::"));
            if !NOT_YET_IN_CORE.contains(&edge.as_str()) {
                area_edges.entry(a).or_default().insert(b);
            }
            if !allowed(a, b) {
                out.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    // A cycle between areas (the rules above already exclude one; this says it plainly).
    for (&a, outs) in &area_edges {
        for &b in outs {
            if reaches(&area_edges, b, a) {
                out.push(format!("cycle between areas {a} and {b}"));
            }
        }
    }
    out
}

fn reaches(g: &BTreeMap<&str, BTreeSet<&str>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from];
    while let Some(n) = todo.pop() {
        if n == to {
            return true;
        }
        if seen.insert(n) {
            todo.extend(g.get(n).into_iter().flatten().copied());
        }
    }
    false
}

#[test]
fn the_core_uses_no_face_and_the_faces_use_no_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    for area in ["core", "runtime", "driver", "nvml", "generated"] {
        assert!(
            known.contains_key(&vec![area.to_string()]),
            "src/{area} is missing"
        );
    }
    let edges = graph(&known);
    let mut broken = violations(&edges);
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
fn the_checker_sees_imports_of_every_form() {
    let mut known = BTreeMap::new();
    for m in [
        "",
        "core",
        "core::a",
        "core::b",
        "runtime",
        "runtime::x",
        "driver",
        "driver::y",
    ] {
        known.insert(segments(m), String::new());
    }
    let code = |s: &str| strip(s);
    known.insert(
        segments("core::a"),
        code("use crate::{core::b, runtime::x::f};\n"),
    );
    known.insert(
        segments("driver::y"),
        code("fn f() { crate::runtime::x::g(); }\n"),
    );
    known.insert(
        segments("runtime::x"),
        code("use super::super::driver::y; // crate::nvml\n"),
    );
    known.insert(
        segments("core::b"),
        code("let s = \"crate::driver\";\nmod t {\n    use super::*;\n}\n"),
    );
    let broken = violations(&graph(&known));
    assert!(
        broken.contains(&"core::a -> runtime::x".to_string()),
        "{broken:?}"
    );
    assert!(
        broken.contains(&"driver::y -> runtime::x".to_string()),
        "{broken:?}"
    );
    assert!(
        broken.contains(&"runtime::x -> driver::y".to_string()),
        "{broken:?}"
    );
    assert!(
        broken.iter().any(|b| b.starts_with("cycle between areas")),
        "{broken:?}"
    );
    assert!(
        !broken.iter().any(|b| b.starts_with("core::b")),
        "{broken:?}"
    );
}

//! The import graph of one crate's modules, read from its source: shared by
//! `guest-lib/tests/module_graph.rs` and `vhost-cuda/tests/module_graph.rs` (each includes this
//! file with `#[path]`).
//!
//! [`Crate::load`] follows the `mod` declarations from a crate root (`#[path]` included), leaves
//! out what a build without `cfg(test)` and without features does not compile (`#[cfg(test)]`
//! items, test-only features) and the test doubles by name (`fake*`, `tests*`), and
//! [`Crate::edges`] finds, for every module file, the module files it uses: through `use` trees,
//! inline `crate::`, `super::` and `self::` paths, and paths that start with a child module's
//! name. [`circles`] then reports every circle of imports, at every level of the tree: between
//! the files of one folder, and between the folders (each with its `mod.rs`) of one parent.
//!
//! It reads text, not the compiler's view: a name brought in by a glob and then used bare, or a
//! method called on a value, is not an import and does not count.

#![allow(dead_code)] // Each test uses part of it.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt, fs,
    path::{Path, PathBuf},
};

/// A module path below the crate root: `["core", "session"]`.
pub type ModPath = Vec<String>;

/// Module names that are test doubles or tests wherever they stand.
fn test_double(name: &str) -> bool {
    name.starts_with("fake") || name == "tests" || name.starts_with("tests_")
}

/// One module file of a crate.
#[derive(Debug)]
pub struct Module {
    /// The file, relative to the crate root's directory.
    pub file: PathBuf,
    /// Its code with comments, literals and test-only items removed (line structure kept).
    pub code: String,
    /// Byte ranges of `code` that lie inside inline `mod name { ... }` blocks.
    pub inline: Vec<(usize, usize)>,
}

/// The module files of one crate, by module path.
#[derive(Debug)]
pub struct Crate {
    pub modules: BTreeMap<ModPath, Module>,
}

/// `from -> to`, with the names used (the path below `to`; `to`'s own name where the module
/// itself is named).
pub type Edges = BTreeMap<ModPath, BTreeMap<ModPath, BTreeSet<String>>>;

impl Crate {
    /// Reads the crate whose root file (`lib.rs`, `main.rs`) is `root`.
    pub fn load(root: &Path) -> Crate {
        let base = root.parent().unwrap().to_path_buf();
        let mut modules = BTreeMap::new();
        let mut todo = vec![(Vec::<String>::new(), root.to_path_buf())];
        while let Some((path, file)) = todo.pop() {
            let raw =
                fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let code = without_test_items(&strip(&raw), &raw);
            let dir = if path.is_empty() || file.file_name().is_some_and(|n| n == "mod.rs") {
                file.parent().unwrap().to_path_buf()
            } else {
                file.with_extension("")
            };
            for (decl, at) in mod_declarations(&code, &raw) {
                let mut child = path.clone();
                child.push(decl.clone());
                if test_double(&decl) {
                    continue;
                }
                let f = match at {
                    Some(p) => file.parent().unwrap().join(p),
                    None => {
                        let flat = dir.join(format!("{decl}.rs"));
                        if flat.exists() {
                            flat
                        } else {
                            dir.join(&decl).join("mod.rs")
                        }
                    }
                };
                assert!(f.exists(), "mod {decl} of {}: no file", file.display());
                todo.push((child, f));
            }
            let inline = inline_modules(&code);
            let rel = file.strip_prefix(&base).unwrap_or(&file).to_path_buf();
            modules.insert(
                path,
                Module {
                    file: rel,
                    code,
                    inline,
                },
            );
        }
        Crate { modules }
    }

    /// Builds a crate from given code, for the checker's own tests.
    pub fn from_code(files: &[(&str, &str)]) -> Crate {
        let modules = files
            .iter()
            .map(|(path, text)| {
                let code = without_test_items(&strip(text), text);
                let inline = inline_modules(&code);
                (
                    segments(path),
                    Module {
                        file: PathBuf::from(format!("{path}.rs")),
                        code,
                        inline,
                    },
                )
            })
            .collect();
        Crate { modules }
    }

    /// Every module file each module file uses.
    pub fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (me, m) in &self.modules {
            let mut deps: BTreeMap<ModPath, BTreeSet<String>> = BTreeMap::new();
            let mut add = |path: &[String], nested: bool| {
                if let Some((to, rest)) = self.resolve(me, path, nested) {
                    if &to != me {
                        let name = if rest.is_empty() {
                            to.last().cloned().unwrap_or_else(|| "crate".into())
                        } else {
                            rest.join("::")
                        };
                        deps.entry(to).or_default().insert(name);
                    }
                }
            };
            let code = m.code.as_str();
            let nested = |at: usize| m.inline.iter().any(|&(a, b)| a <= at && at < b);
            // `use` items, which may span lines.
            let mut covered = Vec::new();
            let mut from = 0;
            while let Some(at) = find_use(&code[from..]).map(|k| k + from) {
                let stmt = at + code[at..].find("use ").unwrap() + 4;
                let end = stmt + code[stmt..].find(';').expect("use statement ends");
                for p in flatten(&code[stmt..end]) {
                    add(&p, nested(at));
                }
                covered.push((at, end));
                from = end;
            }
            // Paths in code: `crate::a::b`, `super::x`, `self::x`, `child::x`.
            let bytes = code.as_bytes();
            let mut k = 0;
            while k < bytes.len() {
                let c = bytes[k];
                let starts = (c.is_ascii_alphabetic() || c == b'_' || c == b'$')
                    && (k == 0 || !is_ident_byte(bytes[k - 1]) && bytes[k - 1] != b':');
                if !starts {
                    k += 1;
                    continue;
                }
                let len = code[k..]
                    .bytes()
                    .take_while(|&b| is_ident_byte(b) || b == b':' || b == b'$')
                    .count();
                let tail = &code[k..k + len];
                // `pub(in crate::a)` restricts visibility; it imports nothing.
                let visibility = code[..k]
                    .trim_end()
                    .strip_suffix("in")
                    .is_some_and(|before| {
                        before
                            .trim_end()
                            .strip_suffix('(')
                            .is_some_and(|b| b.ends_with("pub"))
                    });
                if tail.contains("::")
                    && !visibility
                    && !covered.iter().any(|&(a, b)| a <= k && k < b)
                {
                    let segs = segments(tail);
                    let first = segs[0].as_str();
                    let mut child = me.clone();
                    child.push(first.to_string());
                    if matches!(first, "crate" | "$crate" | "super" | "self")
                        || self.modules.contains_key(&child)
                    {
                        add(&segs, nested(k));
                    }
                }
                k += len.max(1);
            }
            edges.insert(me.clone(), deps);
        }
        edges
    }

    /// The module file a path names and the rest of the path below it, or `None` for paths
    /// outside the crate.
    fn resolve(&self, me: &ModPath, path: &[String], nested: bool) -> Option<(ModPath, ModPath)> {
        let (mut base, mut rest): (ModPath, &[String]) = match path.first().map(String::as_str)? {
            "crate" | "$crate" => (Vec::new(), &path[1..]),
            // `super` at a file's top level is its parent; inside an inline module it is the
            // file's own module.
            "super" => {
                let mut b = me.clone();
                if !nested {
                    b.pop();
                }
                (b, &path[1..])
            }
            "self" => (me.clone(), &path[1..]),
            // A path that starts with a child module's name (2018 paths).
            first => {
                let mut child = me.clone();
                child.push(first.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                (me.clone(), path)
            }
        };
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        (0..=base.len()).rev().find_map(|k| {
            let p = base[..k].to_vec();
            self.modules
                .contains_key(&p)
                .then(|| (p, base[k..].to_vec()))
        })
    }
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// One circle of imports: modules of one parent (files, or folders taken whole) that reach each
/// other.
#[derive(Debug)]
pub struct Circle {
    /// The folder they stand in (`crate::core`).
    pub parent: ModPath,
    /// The members, by name below the parent (`mod.rs` for the parent's own file).
    pub members: Vec<String>,
    /// The imports between members: `a -> b (names)`.
    pub arrows: Vec<String>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parent = if self.parent.is_empty() {
            "crate".to_string()
        } else {
            format!("crate::{}", self.parent.join("::"))
        };
        writeln!(
            f,
            "circle in {parent} ({} modules): {}",
            self.members.len(),
            self.members.join(", ")
        )?;
        for a in &self.arrows {
            writeln!(f, "    {a}")?;
        }
        Ok(())
    }
}

/// Every circle of imports: for every folder, its own file and its children (each child with
/// everything below it) as nodes, and an arrow where anything in one uses anything in another.
pub fn circles(edges: &Edges) -> Vec<Circle> {
    let mut parents: BTreeSet<ModPath> = BTreeSet::new();
    for m in edges.keys() {
        if let Some((_, p)) = m.split_last() {
            parents.insert(p.to_vec());
        }
    }
    let own = "mod.rs".to_string();
    let mut out = Vec::new();
    for parent in parents {
        // The node of `parent`'s level that a module falls in.
        let node = |m: &ModPath| -> Option<String> {
            if m.len() < parent.len() || m[..parent.len()] != parent[..] {
                return None;
            }
            Some(m.get(parent.len()).cloned().unwrap_or_else(|| own.clone()))
        };
        let mut arrows: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in edges {
            let Some(a) = node(from) else { continue };
            for (to, names) in tos {
                let Some(b) = node(to) else { continue };
                if a == b {
                    continue;
                }
                let below: Vec<&str> = to[parent.len()..]
                    .iter()
                    .skip(1)
                    .map(String::as_str)
                    .collect();
                let set = arrows.entry((a.clone(), b.clone())).or_default();
                for n in names {
                    let mut full = below.clone();
                    if below.last() != Some(&n.as_str()) {
                        full.push(n);
                    }
                    set.insert(full.join("::"));
                }
            }
        }
        let mut g: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (a, b) in arrows.keys() {
            g.entry(a).or_default().insert(b);
            g.entry(b).or_default();
        }
        for scc in components(&g) {
            if scc.len() < 2 {
                continue;
            }
            let members: BTreeSet<&str> = scc.iter().copied().collect();
            let list = arrows
                .iter()
                .filter(|((a, b), _)| members.contains(a.as_str()) && members.contains(b.as_str()))
                .map(|((a, b), names)| {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    format!("{a} -> {b} ({})", names.join(", "))
                })
                .collect();
            out.push(Circle {
                parent: parent.clone(),
                members: members.iter().map(|s| s.to_string()).collect(),
                arrows: list,
            });
        }
    }
    out
}

/// The strongly connected components of a graph (Tarjan).
fn components<'a>(g: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, g: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for &w in &g[v] {
            if !s.index.contains_key(w) {
                visit(w, g, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut c = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                c.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(c);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in g.keys() {
        if !s.index.contains_key(v) {
            visit(v, g, &mut s);
        }
    }
    s.out
}

/// `mod name;` declarations (not inline blocks), each with its `#[path]` when it has one.
fn mod_declarations(code: &str, raw: &str) -> Vec<(String, Option<String>)> {
    let raw_lines: Vec<&str> = raw.lines().collect();
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let t = strip_visibility(line.trim());
        let Some(name) = t
            .strip_prefix("mod ")
            .and_then(|r| r.trim().strip_suffix(';'))
        else {
            continue;
        };
        // A `#[path = "..."]` on the lines above (attributes only).
        let mut at = None;
        for prev in raw_lines[..n].iter().rev() {
            let p = prev.trim();
            if !p.starts_with("#[") {
                break;
            }
            if let Some(v) = p.strip_prefix("#[path") {
                at = v.split('"').nth(1).map(String::from);
            }
        }
        out.push((name.trim().to_string(), at));
    }
    out
}

fn strip_visibility(t: &str) -> &str {
    if let Some(rest) = t.strip_prefix("pub(") {
        return rest.split_once(')').map_or(t, |(_, r)| r.trim_start());
    }
    t.strip_prefix("pub ").unwrap_or(t)
}

/// What a `cfg` predicate is in a build without `test` and without features (`None`: depends
/// on the target).
fn cfg_value(p: &str) -> Option<bool> {
    let p = p.trim();
    if p == "test" {
        return Some(false);
    }
    if p.starts_with("feature") {
        return Some(false);
    }
    let args = |inner: &str| -> Vec<String> {
        let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
        for (k, ch) in inner.char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(inner[start..k].to_string());
                    start = k + 1;
                }
                _ => {}
            }
        }
        parts.push(inner[start..].to_string());
        parts.into_iter().filter(|s| !s.trim().is_empty()).collect()
    };
    let call = |name: &str| {
        p.strip_prefix(name)
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix('('))
            .and_then(|r| r.strip_suffix(')'))
    };
    if let Some(inner) = call("not") {
        return cfg_value(inner).map(|v| !v);
    }
    if let Some(inner) = call("any") {
        let vs: Vec<Option<bool>> = args(inner).iter().map(|a| cfg_value(a)).collect();
        if vs.contains(&Some(true)) {
            return Some(true);
        }
        return vs.iter().all(|v| *v == Some(false)).then_some(false);
    }
    if let Some(inner) = call("all") {
        let vs: Vec<Option<bool>> = args(inner).iter().map(|a| cfg_value(a)).collect();
        if vs.contains(&Some(false)) {
            return Some(false);
        }
        return vs.iter().all(|v| *v == Some(true)).then_some(true);
    }
    None
}

/// Blanks the items a build without `test` and without features leaves out: each item whose
/// `#[cfg(...)]` (read from the raw line, where strings are kept) is false. `code` is the
/// stripped text of `raw`, line for line.
fn without_test_items(code: &str, raw: &str) -> String {
    let raw_lines: Vec<&str> = raw.lines().collect();
    let mut out = code.to_string();
    let mut offset = 0;
    let mut blank: Vec<(usize, usize)> = Vec::new();
    for (n, line) in code.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += line.len();
        if blank.last().is_some_and(|&(_, e)| start < e) {
            continue;
        }
        let r = raw_lines.get(n).map_or("", |l| l.trim());
        let Some(pred) = r
            .strip_prefix("#[cfg(")
            .and_then(|x| x.trim_end().strip_suffix(")]"))
        else {
            continue;
        };
        if cfg_value(pred) != Some(false) {
            continue;
        }
        blank.push((start, item_end(code, start + line.len())));
    }
    // The blanked text becomes spaces; newlines stay, so lines still match `raw`'s.
    let mut bytes = std::mem::take(&mut out).into_bytes();
    for (a, b) in blank {
        for byte in &mut bytes[a..b] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    }
    String::from_utf8(bytes).expect("ASCII blanks keep UTF-8")
}

/// Where the item that starts at `from` (after its attributes) ends: after its `;` or its closing
/// brace.
fn item_end(code: &str, from: usize) -> usize {
    let b = code.as_bytes();
    let mut i = from;
    // Further attributes of the same item.
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b[i..].starts_with(b"#[") {
            let mut depth = 0;
            while i < b.len() {
                match b[i] {
                    b'[' => depth += 1,
                    b']' => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            break;
        }
    }
    let mut depth = 0;
    while i < b.len() {
        match b[i] {
            b';' if depth == 0 => return i + 1,
            b'{' | b'(' | b'[' => depth += 1,
            b'}' | b')' | b']' => {
                depth -= 1;
                if depth == 0 && b[i] == b'}' {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The byte ranges of inline `mod name { ... }` blocks.
fn inline_modules(code: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let t = strip_visibility(line.trim_start());
        if let Some(rest) = t.strip_prefix("mod ") {
            if rest.trim_end().ends_with('{') {
                let start = offset;
                out.push((start, item_end(code, start)));
            }
        }
        offset += line.len();
    }
    out
}

/// Removes comments and the contents of string and character literals, keeping line structure.
pub fn strip(text: &str) -> String {
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
        } else if (b[i] == b'r' || b[i] == b'b')
            && (i == 0 || !is_ident_byte(b[i - 1]))
            && (b[i..].starts_with(b"r\"")
                || b[i..].starts_with(b"r#\"")
                || b[i..].starts_with(b"r##")
                || b[i..].starts_with(b"br\"")
                || b[i..].starts_with(b"br#"))
        {
            // Raw string: r"...", r#"..."#, br"...".
            let mut j = i + if b[i] == b'b' { 2 } else { 1 };
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
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
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                // A line break in the string, escaped (a continuation) or not, stays one.
                if i < b.len() && b[i] == b'\n' {
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
pub fn flatten(tree: &str) -> Vec<Vec<String>> {
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

pub fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The offset of the next `use` item (its visibility or `use` keyword) at the start of a line.
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

// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `qcuda-smi loader`: which files the dynamic loader gives programs for the CUDA driver and
//! NVML, and whether each is qcuda's.
//!
//! Frameworks find the driver in different ways (docs/guest-install.md): NVIDIA's runtime,
//! PyTorch, XLA and cuda-pathfinder `dlopen("libcuda.so.1")`, Numba opens `libcuda.so` first
//! and then absolute paths under `/usr/lib` and `/usr/lib64`, NVML's users
//! `libnvidia-ml.so.1`. Once any `libcuda` is loaded, glibc answers every later `libcuda.so.1`
//! lookup of the process with it (a loaded object's soname matches), so one foreign file that a
//! single name reaches is enough to take a process away from qcuda. This check resolves each
//! name as glibc does for a program without its own run paths: `LD_LIBRARY_PATH`, then
//! `/etc/ld.so.cache` (read as the loader reads it), then the default directories; and each fixed path as it
//! is. A file counts as qcuda's when it is the same file (device and inode) as the one in
//! `/usr/lib/qcuda`: a bind mount over NVIDIA's file (the chrooted test guest) is.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// Where qcuda's libraries are.
const OURS: &str = "/usr/lib/qcuda";

/// The names programs open, and qcuda's file each must reach.
const NAMES: &[(&str, &str)] = &[
    ("libcuda.so.1", "libcuda.so.1"),
    ("libcuda.so", "libcuda.so.1"),
    ("libnvidia-ml.so.1", "libnvidia-ml.so.1"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
];

/// Absolute paths frameworks open when a name fails (Numba), or that container images name.
const FIXED: &[&str] = &[
    "/usr/lib/libcuda.so",
    "/usr/lib/libcuda.so.1",
    "/usr/lib64/libcuda.so",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
];

/// glibc's default directories on x86-64 (Debian's multiarch ones first).
const DEFAULT_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// How a name or path resolves.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// qcuda's own file.
    Ours(PathBuf),
    /// Another file.
    Foreign(PathBuf),
    /// Nothing.
    Missing,
}

/// The loader's cache.
const CACHE: &str = "/etc/ld.so.cache";
/// The new format's magic and version ("glibc-ld.so.cache" "1.1"), its header's size, and an
/// entry's size (glibc's `cache_file_new` and `file_entry_new`).
const CACHE_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const CACHE_HEADER: usize = 48;
const CACHE_ENTRY: usize = 24;
/// `FLAG_ELF_LIBC6 | FLAG_X8664_LIB64`: a 64-bit x86 library.
const CACHE_X86_64: u32 = 0x0303;

/// The 64-bit x86 entries of a `ld.so.cache` in glibc's new format (what ldconfig writes since
/// glibc 2.32, after an old-format part before that), in the file's order, which is the
/// loader's order of preference: (name, path). Empty for anything it cannot read.
pub fn parse_cache(file: &[u8]) -> Vec<(String, PathBuf)> {
    use std::os::unix::ffi::OsStrExt;
    let Some(base) = file
        .windows(CACHE_MAGIC.len())
        .position(|w| w == CACHE_MAGIC)
    else {
        return Vec::new();
    };
    let b = &file[base..];
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let text_at = |at: u32| -> Option<&[u8]> {
        let s = b.get(usize::try_from(at).ok()?..)?;
        Some(&s[..s.iter().position(|&c| c == 0)?])
    };
    let Some(n) = u32_at(20) else {
        return Vec::new();
    };
    (0..n as usize)
        .map_while(|i| {
            let e = CACHE_HEADER + i * CACHE_ENTRY;
            Some((u32_at(e)?, u32_at(e + 4)?, u32_at(e + 8)?))
        })
        .filter(|(flags, ..)| flags & 0xffff == CACHE_X86_64)
        .filter_map(|(_, key, value)| {
            let name = String::from_utf8_lossy(text_at(key)?).into_owned();
            Some((
                name,
                PathBuf::from(std::ffi::OsStr::from_bytes(text_at(value)?)),
            ))
        })
        .collect()
}

/// The file `name` resolves to: `LD_LIBRARY_PATH`'s directories, the cache, the defaults.
pub fn resolve(name: &str, ld_library_path: &str, cache: &[(String, PathBuf)]) -> Option<PathBuf> {
    let from_dirs = |dirs: &mut dyn Iterator<Item = &str>| {
        dirs.filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(name))
            .find(|p| p.exists())
    };
    from_dirs(&mut ld_library_path.split([':', ';']))
        .or_else(|| {
            cache
                .iter()
                .find(|(n, p)| n == name && p.exists())
                .map(|(_, p)| p.clone())
        })
        .or_else(|| from_dirs(&mut DEFAULT_DIRS.iter().copied()))
}

/// Whether `path` is qcuda's `file` (the same device and inode).
fn classify(path: Option<PathBuf>, file: &str) -> Found {
    let Some(path) = path else {
        return Found::Missing;
    };
    let ours = Path::new(OURS).join(file).metadata();
    match (path.metadata(), ours) {
        (Ok(a), Ok(b)) if a.dev() == b.dev() && a.ino() == b.ino() => Found::Ours(path),
        (Ok(_), _) => Found::Foreign(path),
        (Err(_), _) => Found::Missing,
    }
}

/// Prints one line per name and path; fails when one reaches a file that is not qcuda's.
pub fn run() -> Result<(), String> {
    let cache = std::fs::read(CACHE)
        .map(|f| parse_cache(&f))
        .unwrap_or_default();
    if cache.is_empty() {
        println!("loader: no 64-bit entries in {CACHE}: names resolve without it");
    }
    let llp = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let mut foreign = Vec::new();
    let mut report = |what: String, found: Found| match found {
        Found::Ours(p) => println!("loader: {what:<54} {} (qcuda's)", p.display()),
        Found::Missing => println!("loader: {what:<54} not found"),
        Found::Foreign(p) => {
            println!("loader: {what:<54} {} NOT qcuda's", p.display());
            foreign.push(format!("{what}: {}", p.display()));
        }
    };
    for (name, file) in NAMES {
        report(
            format!("dlopen(\"{name}\")"),
            classify(resolve(name, &llp, &cache), file),
        );
    }
    for path in FIXED {
        let file = if path.contains("libnvidia-ml") {
            "libnvidia-ml.so.1"
        } else {
            "libcuda.so.1"
        };
        let p = Path::new(path);
        report(
            format!("dlopen(\"{path}\")"),
            classify(p.exists().then(|| p.to_path_buf()), file),
        );
    }
    if foreign.is_empty() {
        println!("loader: every name and path gives qcuda's driver (or nothing)");
        Ok(())
    } else {
        Err(format!(
            "another CUDA driver comes first: {} (docs/guest-install.md: an installed guest must not have NVIDIA's driver on the loader's path)",
            foreign.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machines_cache_is_read_like_ldconfig_p() {
        // ldconfig -p prints the same entries in the same order (its 64-bit ones).
        let Ok(file) = std::fs::read(CACHE) else {
            return;
        };
        let Ok(out) = std::process::Command::new("ldconfig").arg("-p").output() else {
            return;
        };
        let want: Vec<(String, PathBuf)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (left, path) = l.split_once(" => ")?;
                let (name, kind) = left.trim().split_once(' ')?;
                kind.contains("x86-64")
                    .then(|| (name.to_string(), PathBuf::from(path.trim())))
            })
            .collect();
        assert!(!want.is_empty());
        assert_eq!(parse_cache(&file), want);
        assert!(parse_cache(&file[..100]).len() < want.len());
        assert!(parse_cache(b"garbage").is_empty());
    }

    #[test]
    fn names_resolve_through_the_path_then_the_cache() {
        let dir = std::env::temp_dir().join(format!("qcuda-loader-{}", std::process::id()));
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("libx.so.1"), b"b").unwrap();
        let cache = vec![("libx.so.1".to_string(), b.join("libx.so.1"))];
        let path = format!("{}:{}", a.display(), b.display());
        assert_eq!(resolve("libx.so.1", &path, &[]), Some(b.join("libx.so.1")));
        std::fs::write(a.join("libx.so.1"), b"a").unwrap();
        assert_eq!(resolve("libx.so.1", &path, &[]), Some(a.join("libx.so.1")));
        assert_eq!(resolve("libx.so.1", "", &cache), Some(b.join("libx.so.1")));
        assert_eq!(resolve("libqcuda-nothing.so.7", "", &cache), None);
        // Another file is foreign, the same file (a link to it, a bind mount) is not.
        assert!(matches!(
            classify(Some(a.join("libx.so.1")), "../../nonexistent"),
            Found::Foreign(_)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

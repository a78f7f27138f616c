//! The worker's minimal root: a tmpfs that holds only what the NVIDIA driver needs, bound in
//! from the host, and a /proc of the worker's own PID namespace. Built in the worker's mount
//! namespace (born with it, `spawn.rs`), entered with `pivot_root`, the host's tree then
//! detached: nothing else of the host's file system can be named any more.
//!
//! What is bound (the allowance), found on the host at the worker's start rather than listed by
//! hand, because driver installs differ (distribution packages, the .run installer, containers):
//!
//! - the device nodes `/dev/nvidia*` (control, GPUs, UVM, `nvidia-caps/`), read-write, and the
//!   harmless `/dev/null`, `/dev/zero`, `/dev/urandom`;
//! - every file this process has mapped once `libcuda.so.1` is loaded (the driver, the
//!   libraries it links, this binary and glibc), read-only, at the same path;
//! - beside `libcuda.so.1`, the driver's other libraries (`libcuda*`, `libnvidia-*`), which it
//!   opens later (the PTX JIT compiler, say), and `/etc/ld.so.cache` to find them, read-only;
//! - `/sys/devices`, `/sys/bus`, `/sys/class` and `/sys/module`, read-only (the driver reads
//!   PCI and NUMA topology there), without the mounts below them (cgroups, debugfs, ...);
//! - a fresh /proc (in `namespace` mode it lists only the worker itself; `/proc/driver/nvidia`
//!   is the driver's).
//!
//! - the VM's shared directory at `/dev/shm` (shared_shm.rs), read-write, `nosuid,nodev,noexec`,
//!   where the driver keeps interprocess events.
//!
//! Nothing else is writable but the device nodes: the tmpfs is made read-only once built.

use std::{
    ffi::CString,
    fs,
    io::{self, BufRead},
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::{
            ffi::OsStrExt,
            fs::{FileTypeExt, OpenOptionsExt},
        },
    },
    path::{Path, PathBuf},
};

use super::error::SandboxError;

/// Where the new root is assembled before `pivot_root` (in the worker's own mount namespace,
/// so the host never sees it). Sources are opened before it is covered.
const STAGING: &str = "/tmp";
/// The host's old root, under the new one until it is detached.
const OLD_ROOT: &str = ".old-root";
/// Device nodes every program may have besides the driver's.
const PLAIN_DEVICES: [&str; 3] = ["/dev/null", "/dev/zero", "/dev/urandom"];
/// The parts of /sys the driver reads.
const SYS_DIRS: [&str; 4] = ["/sys/devices", "/sys/bus", "/sys/class", "/sys/module"];

/// How a path is bound into the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A device node, read-write.
    Device,
    /// A directory of device nodes, read-write.
    DeviceDir,
    /// A file, read-only.
    File,
    /// A directory, read-only and without what is mounted below it.
    Dir,
}

/// The paths a worker may reach.
#[derive(Debug, Default)]
pub struct Allowance {
    entries: Vec<(PathBuf, Kind)>,
    /// The VM's shared directory (shared_shm.rs), bound writable at `/dev/shm`.
    pub shared_shm: Option<OwnedFd>,
}

impl Allowance {
    /// What this process needs: the driver (loaded here if it is installed, so that its path
    /// and its libraries' are known), its devices and files.
    pub fn of_this_process() -> Self {
        let mut a = Self::default();
        // SAFETY: dlopen of a NUL-terminated name; the handle is kept for the process's life
        // (cudarc opens the same library later and gets this one). Loading runs the driver
        // library's initialisers, which start no thread.
        let driver = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY) };
        let _ = driver;
        if let Ok(dev) = fs::read_dir("/dev") {
            for e in dev.flatten() {
                let name = e.file_name();
                if !name.as_bytes().starts_with(b"nvidia") {
                    continue;
                }
                match e.file_type() {
                    Ok(t) if t.is_char_device() => a.add(e.path(), Kind::Device),
                    Ok(t) if t.is_dir() => a.add(e.path(), Kind::DeviceDir),
                    _ => {}
                }
            }
        }
        for d in PLAIN_DEVICES {
            a.add(d.into(), Kind::Device);
        }
        let mut driver_dirs = Vec::new();
        for path in mapped_files() {
            if path
                .file_name()
                .is_some_and(|n| n.as_bytes().starts_with(b"libcuda.so"))
            {
                if let Some(dir) = path.parent() {
                    driver_dirs.push(dir.to_path_buf());
                }
            }
            a.add(path, Kind::File);
        }
        for dir in driver_dirs {
            for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                let n = e.file_name();
                let n = n.as_bytes();
                let ours = n.starts_with(b"libcuda") || n.starts_with(b"libnvidia-");
                if ours && n.windows(3).any(|w| w == b".so") {
                    a.add(e.path(), Kind::File);
                }
            }
            a.add("/etc/ld.so.cache".into(), Kind::File);
        }
        for d in SYS_DIRS {
            a.add(d.into(), Kind::Dir);
        }
        a
    }

    fn add(&mut self, path: PathBuf, kind: Kind) {
        if !self.entries.iter().any(|(p, _)| *p == path) {
            self.entries.push((path, kind));
        }
    }
}

/// The files mapped into this process (/proc/self/maps), each once.
fn mapped_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = Vec::new();
    let Ok(maps) = fs::File::open("/proc/self/maps") else {
        return files;
    };
    for line in io::BufReader::new(maps).lines().map_while(Result::ok) {
        // address perms offset dev inode path
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        // Only whole paths of regular files that are still there ("(deleted)" ones are not).
        if !path.starts_with('/') || line.ends_with("(deleted)") {
            continue;
        }
        let path = PathBuf::from(path);
        if path.is_file() && !files.contains(&path) {
            files.push(path);
        }
    }
    files
}

fn root_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> SandboxError {
    let what = what.into();
    move |source| SandboxError::Root { what, source }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other)
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
) -> io::Result<()> {
    let source = source.map(cpath).transpose()?;
    let target = cpath(target)?;
    let fstype = fstype
        .map(|t| CString::new(t).map_err(io::Error::other))
        .transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: mount with NUL-terminated strings (or NULL) that outlive the call, and no data.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The mount flags of the file system `fd` lies on, as `MS_*` flags: a bind mount in a user
/// namespace must keep the ones the host locked (nosuid, nodev, noexec, atime).
fn locked_flags(fd: &OwnedFd) -> libc::c_ulong {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: fstatvfs writes one statvfs into the buffer it is given.
    if unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return 0;
    }
    // SAFETY: fstatvfs succeeded, so it initialised the buffer.
    let f = unsafe { st.assume_init() }.f_flag;
    [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ]
    .iter()
    .filter(|(st, _)| f & st != 0)
    .fold(0, |acc, (_, ms)| acc | ms)
}

/// The directory `given` names, opened again in this process's mount namespace (a bind mount
/// must come from it; the daemon's spawn opened `given` beneath a descriptor of the host's):
/// by its path, and only if that is still the same directory.
fn in_own_namespace(given: &OwnedFd) -> io::Result<OwnedFd> {
    let path = fs::read_link(format!("/proc/self/fd/{}", given.as_raw_fd()))?;
    let again = OwnedFd::from(
        fs::File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&path)?,
    );
    let id = |fd: &OwnedFd| -> io::Result<(u64, u64)> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes one stat into the buffer it is given.
        if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstat succeeded, so it initialised the buffer.
        let st = unsafe { st.assume_init() };
        Ok((st.st_dev, st.st_ino))
    };
    if id(&again)? != id(given)? {
        return Err(io::Error::other(format!(
            "{} is no longer the directory the daemon gave",
            path.display()
        )));
    }
    Ok(again)
}

/// Builds the root from `allowance` and moves this process into it. Returns how many paths
/// were bound.
pub fn pivot_into_minimal_root(allowance: &Allowance) -> Result<usize, SandboxError> {
    // Nothing mounted here may reach the host's namespace, nor the host's mounts reach here.
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE)
        .map_err(root_err("making / private"))?;
    // Opened before the staging tmpfs covers anything: the sources are then named by
    // descriptor, wherever they are.
    let sources: Vec<(&Path, Kind, OwnedFd)> = allowance
        .entries
        .iter()
        .filter_map(|(p, k)| {
            let f = fs::File::options()
                .read(true)
                .custom_flags(libc::O_PATH)
                .open(p)
                .ok()?;
            Some((p.as_path(), *k, OwnedFd::from(f)))
        })
        .collect();
    let shared = allowance
        .shared_shm
        .as_ref()
        .map(in_own_namespace)
        .transpose()
        .map_err(root_err("finding the VM's shared /dev/shm"))?;
    let staging = Path::new(STAGING);
    mount(
        Some(Path::new("tmpfs")),
        staging,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
    )
    .map_err(root_err("mounting the staging tmpfs"))?;
    for (path, kind, fd) in &sources {
        let rel = path.strip_prefix("/").unwrap_or(path);
        let target = staging.join(rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(root_err(format!("mkdir {}", parent.display())))?;
        }
        match kind {
            Kind::Dir | Kind::DeviceDir => fs::create_dir_all(&target),
            Kind::Device | Kind::File => fs::File::create(&target).map(drop),
        }
        .map_err(root_err(format!("creating {}", target.display())))?;
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        mount(Some(&by_fd), &target, None, libc::MS_BIND)
            .map_err(root_err(format!("binding {}", path.display())))?;
        let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | locked_flags(fd);
        match kind {
            Kind::Device | Kind::DeviceDir => flags |= libc::MS_NOEXEC,
            Kind::Dir => flags |= libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOEXEC,
            Kind::File => flags |= libc::MS_RDONLY | libc::MS_NODEV,
        }
        mount(None, &target, None, flags)
            .map_err(root_err(format!("making {} read-only", path.display())))?;
    }
    let mut bound = sources.len();
    drop(sources);
    if let Some(fd) = shared {
        // The one writable place: what the VM's workers share (the driver's interprocess
        // events). Nothing in it may run or be a device.
        let target = staging.join("dev/shm");
        fs::create_dir_all(&target).map_err(root_err("mkdir /dev/shm"))?;
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        mount(Some(&by_fd), &target, None, libc::MS_BIND)
            .map_err(root_err("binding the VM's shared /dev/shm"))?;
        let flags =
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        mount(None, &target, None, flags | locked_flags(&fd))
            .map_err(root_err("remounting /dev/shm"))?;
        bound += 1;
    }
    let proc = staging.join("proc");
    fs::create_dir_all(&proc).map_err(root_err("mkdir /proc"))?;
    mount(
        Some(Path::new("proc")),
        &proc,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
    )
    .map_err(root_err("mounting /proc"))?;
    let old = staging.join(OLD_ROOT);
    fs::create_dir_all(&old).map_err(root_err("mkdir the old root"))?;
    let (new_c, old_c) = (
        cpath(staging).map_err(root_err("path"))?,
        cpath(&old).map_err(root_err("path"))?,
    );
    // SAFETY: pivot_root with two NUL-terminated paths that outlive the call.
    if unsafe { libc::syscall(libc::SYS_pivot_root, new_c.as_ptr(), old_c.as_ptr()) } != 0 {
        return Err(root_err("pivot_root")(io::Error::last_os_error()));
    }
    std::env::set_current_dir("/").map_err(root_err("chdir /"))?;
    let old_in_new =
        CString::new(format!("/{OLD_ROOT}")).map_err(|e| root_err("path")(io::Error::other(e)))?;
    // SAFETY: umount2 of a NUL-terminated path; MNT_DETACH cuts the host's tree off at once.
    if unsafe { libc::umount2(old_in_new.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(root_err("detaching the host's root")(
            io::Error::last_os_error(),
        ));
    }
    fs::remove_dir(format!("/{OLD_ROOT}")).map_err(root_err("removing the old root"))?;
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
    )
    .map_err(root_err("making the root read-only"))?;
    Ok(bound)
}

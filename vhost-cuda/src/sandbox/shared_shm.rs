//! The `/dev/shm` a VM's workers share, and only they.
//!
//! The NVIDIA driver makes an interprocess event (`cudaEventInterprocess`) a POSIX
//! shared-memory file, `/dev/shm/cuda.shm.<uid>.<pid>.<n>` (`shm_open`), and a process that
//! opens the event's handle (`cuIpcOpenEventHandle`) opens that file by the pid and number the
//! handle carries. Every guest process has a worker of its own, each in a mount namespace of
//! its own with a minimal root (root.rs), so for two guest processes to share an event their
//! workers need one `/dev/shm`; workers of other VMs must not reach it.
//!
//! So the daemon keeps one directory on the host's `/dev/shm` (by default), `qcuda-<euid>`,
//! mode 0700, and in it one directory per VM, named by a hash of the VM's label (its socket),
//! made when its first worker starts. Each worker gets a descriptor of its VM's directory
//! (opened between clone and exec, spawn.rs: the daemon itself opens no file) and binds it at
//! `/dev/shm` in its root, writable, `nosuid,nodev,noexec`: the only writable place of the
//! root. A worker cannot name the parent directory (`..` of a mount's root is the root) nor
//! another VM's. The driver's names carry the pid, so the workers of one VM need distinct
//! pids (pid_init.rs). A VM's directory is emptied when its table is set up and when it goes
//! (unless its workers are kept for the next daemon, which go on using it).

use std::{
    ffi::CString,
    fs, io,
    os::{
        fd::{AsRawFd, OwnedFd, RawFd},
        unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::Arc,
};

/// The daemon's directory of the VMs' shared directories.
#[derive(Debug)]
pub struct SharedShm {
    dir: PathBuf,
    fd: OwnedFd,
}

/// Two are the same directory (commands compare equal when their workers share alike).
impl PartialEq for SharedShm {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir
    }
}

impl Eq for SharedShm {}

impl SharedShm {
    /// `parent/qcuda-<euid>` (made if missing), which must be a directory of this user's,
    /// mode 0700, not a symbolic link.
    pub fn create(parent: &Path) -> io::Result<Arc<Self>> {
        // SAFETY: geteuid cannot fail and touches no memory.
        let uid = unsafe { libc::geteuid() };
        let dir = parent.join(format!("qcuda-{uid}"));
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = fs::symlink_metadata(&dir)?;
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
            return Err(io::Error::other(format!(
                "{} is not a private directory of user {uid}",
                dir.display()
            )));
        }
        let fd = fs::File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&dir)?;
        Ok(Arc::new(Self {
            dir,
            fd: OwnedFd::from(fd),
        }))
    }

    /// The directory (for logs and tests).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The descriptor a worker's spawn opens its VM's directory beneath.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The name of VM `label`'s directory: `vm-` and the 16 hex digits of the label's 64-bit
    /// FNV-1a hash (fixed, so that a daemon of another build that takes the VM's workers over
    /// names the same directory).
    pub fn vm_dir_name(label: &str) -> CString {
        let h = label.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        CString::new(format!("vm-{h:016x}")).unwrap_or_default()
    }

    /// VM `label`'s directory on the host.
    pub fn vm_dir(&self, label: &str) -> PathBuf {
        self.dir
            .join(Self::vm_dir_name(label).to_string_lossy().as_ref())
    }

    /// Removes what VM `label`'s workers left (the directory and its files), on the
    /// unfiltered spawner thread (the daemon's own filter opens no file). Files still mapped
    /// stay with their mappings.
    pub fn clear_vm(self: &Arc<Self>, label: &str) {
        let dir = self.vm_dir(label);
        super::spawn::run_unfiltered(Box::new(move || {
            if let Err(e) = fs::remove_dir_all(&dir) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove {}: {e}", dir.display());
                }
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_private_directory_per_user_and_one_name_per_vm() {
        let parent = std::env::temp_dir().join(format!("qcuda-shm-test-{}", std::process::id()));
        fs::create_dir_all(&parent).unwrap();
        let s = SharedShm::create(&parent).unwrap();
        let meta = fs::metadata(s.path()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        // Made again, the same directory.
        let again = SharedShm::create(&parent).unwrap();
        assert_eq!(again.path(), s.path());
        let (a, b) = (
            SharedShm::vm_dir_name("/run/qcuda/vm0.sock"),
            SharedShm::vm_dir_name("/run/qcuda/vm1.sock"),
        );
        assert_ne!(a, b);
        assert_eq!(a, SharedShm::vm_dir_name("/run/qcuda/vm0.sock"));
        // FNV-1a's own test vector: the empty string hashes to the offset basis.
        assert_eq!(
            SharedShm::vm_dir_name("").to_str().unwrap(),
            "vm-cbf29ce484222325"
        );
        assert!(a
            .to_bytes()
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-'));
        // A directory others may enter is refused.
        let open = parent.join("open");
        fs::create_dir_all(&open).unwrap();
        // SAFETY: geteuid cannot fail and touches no memory.
        let shared = open.join(format!("qcuda-{}", unsafe { libc::geteuid() }));
        fs::DirBuilder::new().mode(0o777).create(&shared).unwrap();
        fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        SharedShm::create(&open).unwrap_err();
        let _ = fs::remove_dir_all(&parent);
    }
}

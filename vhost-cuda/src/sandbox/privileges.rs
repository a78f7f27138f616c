//! Giving up privileges in a worker: every capability (effective, permitted, inheritable,
//! ambient and the bounding set) and `no_new_privs`, so that nothing it executes or does later
//! can gain any. In a user namespace the worker starts with every capability *of that
//! namespace* (it needs `CAP_SYS_ADMIN` there to build its root); a worker of a root daemon
//! starts with the daemon's. Either way it keeps none once its root is built.

use std::io;

use super::error::SandboxError;

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// The highest capability any kernel has today is 40 (`CAP_CHECKPOINT_RESTORE`); the bounding
/// set loop stops at the first number the kernel does not know.
const MAX_CAPABILITY: libc::c_ulong = 63;
/// `CAP_SYS_ADMIN`.
const CAP_SYS_ADMIN: u32 = 21;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn capget() -> io::Result<[CapData; 2]> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a version-3 header writes two CapData structs into `data`.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(data)
}

/// Whether this process has `CAP_SYS_ADMIN` (then workers need no user namespace).
pub fn has_sys_admin() -> bool {
    capget().is_ok_and(|d| d[0].effective & (1 << CAP_SYS_ADMIN) != 0)
}

/// Drops every capability and sets `no_new_privs`.
pub fn drop_all() -> Result<(), SandboxError> {
    let err = |e: io::Error| SandboxError::Privileges(e);
    for cap in 0..=MAX_CAPABILITY {
        // SAFETY: prctl(PR_CAPBSET_DROP) changes only this process's bounding set.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Past the last capability this kernel knows.
                Some(libc::EINVAL) => break,
                // Without CAP_SETPCAP the set cannot shrink, and then the process has no
                // capability to lose (no_new_privs below keeps it from gaining one).
                Some(libc::EPERM) => break,
                _ => return Err(err(e)),
            }
        }
    }
    // SAFETY: prctl(PR_CAP_AMBIENT_CLEAR_ALL) changes only this process's ambient set.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(err(io::Error::last_os_error()));
    }
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let none = [CapData::default(); 2];
    // SAFETY: capset with a version-3 header reads two CapData structs from `none`.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, none.as_ptr()) } != 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(err(io::Error::last_os_error()));
    }
    let left = capget().map_err(err)?;
    if left
        .iter()
        .any(|d| d.effective | d.permitted | d.inheritable != 0)
    {
        return Err(err(io::Error::other("capabilities left after capset")));
    }
    Ok(())
}

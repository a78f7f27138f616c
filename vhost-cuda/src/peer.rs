//! Who is at the other end of a unix socket: the operator's stats socket and the handover's
//! rendezvous both admit a peer by its user id.

use std::{io, os::fd::AsRawFd, os::unix::net::UnixStream};

/// The user id of the peer of `conn` (`SO_PEERCRED`).
pub(crate) fn peer_uid(conn: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>())
        .map_err(|_| io::Error::other("ucred size"))?;
    // SAFETY: `cred` and `len` are live locals of the sizes the kernel writes.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

//! Binding the vhost-user socket, with a clear answer when its path is taken.
//!
//! A path that holds a socket some process listens on is refused: starting a second daemon for
//! the same VM must fail loudly, not steal the socket from the first one. A socket file nobody
//! listens on (left by a daemon that was killed) is stale and is replaced. Anything else at the
//! path (a regular file, a directory) is left alone and refused.
//!
//! Liveness is probed by connecting: a live daemon sees that connection as a frontend that
//! disconnects before its first message, logs it and keeps serving.

use std::{
    io,
    os::unix::{fs::FileTypeExt, net::UnixStream},
    path::Path,
};

use thiserror::Error;
use tracing::warn;
use vhost::vhost_user::Listener;

/// Why the socket cannot be bound.
#[derive(Debug, Error)]
pub enum SocketError {
    /// A process is listening on the path.
    #[error("socket {0} is in use: another process is listening on it")]
    InUse(String),
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(String),
    /// The path cannot be inspected or probed.
    #[error("cannot check {path}: {source}")]
    Probe {
        /// The socket path.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// A stale socket cannot be removed.
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale {
        /// The socket path.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// bind(2) failed.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: String,
        /// The error.
        source: vhost::vhost_user::Error,
    },
}

/// Creates the listening socket at `path`, replacing a stale socket file.
pub fn bind(path: &Path) -> Result<Listener, SocketError> {
    let name = path.display().to_string();
    remove_stale(path)?;
    Listener::new(path, false).map_err(|source| match source {
        // Another daemon bound it between our probe and our bind.
        vhost::vhost_user::Error::SocketError(ref e) if e.kind() == io::ErrorKind::AddrInUse => {
            SocketError::InUse(name)
        }
        source => SocketError::Bind { path: name, source },
    })
}

/// Makes way for a socket at `path`: nothing there is fine, a socket nobody listens on is
/// removed, a live socket or another kind of file is an error.
pub fn remove_stale(path: &Path) -> Result<(), SocketError> {
    let name = path.display().to_string();
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => return Err(SocketError::NotASocket(name)),
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => return Err(SocketError::InUse(name)),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                warn!("replacing stale socket {name} (nobody listens on it)");
                std::fs::remove_file(path).map_err(|source| SocketError::RemoveStale {
                    path: name.clone(),
                    source,
                })?;
            }
            Err(source) => return Err(SocketError::Probe { path: name, source }),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(SocketError::Probe { path: name, source }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("vhost-cuda-socket-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn live_socket_is_refused_and_stale_one_replaced() {
        let dir = scratch("live");
        let path = dir.join("s.sock");
        let first = bind(&path).unwrap();
        assert!(matches!(bind(&path), Err(SocketError::InUse(_))));
        drop(first); // Listener's drop unlinks the path.
        assert!(!path.exists());

        // A stale socket: bound and closed, the file stays.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let _again = bind(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn other_files_are_left_alone() {
        let dir = scratch("file");
        let path = dir.join("not-a-socket");
        std::fs::write(&path, b"keep me").unwrap();
        assert!(matches!(bind(&path), Err(SocketError::NotASocket(_))));
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
        let missing = dir.join("no/such/dir/s.sock");
        assert!(matches!(bind(&missing), Err(SocketError::Bind { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

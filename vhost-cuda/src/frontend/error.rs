//! What fails in the frontend: [`FrontendError`], and its [`Result`].

use std::{io, path::PathBuf, time::Duration};

use thiserror::Error as ThisError;

/// Errors of the frontend.
#[derive(Debug, ThisError)]
pub enum FrontendError {
    /// The daemon's socket could not be connected to.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: vhost::Error,
    },
    /// A vhost-user message of the handshake failed.
    #[error("vhost-user {step}: {source}")]
    Handshake {
        /// The message.
        step: &'static str,
        /// Why.
        source: vhost::Error,
    },
    /// The device does not offer what qcuda.ko needs.
    #[error("the device lacks {0}")]
    Missing(&'static str),
    /// Guest RAM could not be created or accessed.
    #[error("guest RAM: {0}")]
    Memory(String),
    /// An eventfd or another system call failed.
    #[error("{what}: {source}")]
    Io {
        /// The call.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
    /// A request that does not fit a slot's bounce memory or descriptor table.
    #[error("request too large: {0}")]
    TooLarge(String),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The device put a chain on the used ring that it was not given, or no valid response.
    #[error("device misbehaved: {0}")]
    Device(String),
}

impl FrontendError {
    pub(super) fn memory(e: impl std::fmt::Display) -> Self {
        Self::Memory(e.to_string())
    }
}

/// Results of the frontend.
pub type Result<T> = std::result::Result<T, FrontendError>;

//! Why a sandbox cannot be built: [`SandboxError`], what each part of the sandbox fails with.

use std::io;

use thiserror::Error;

/// Why a sandbox cannot be built.
#[derive(Debug, Error)]
pub enum SandboxError {
    /// A mount, pivot_root or directory of the minimal root.
    #[error("building the worker's root: {what}: {source}")]
    Root {
        /// What was being done.
        what: String,
        /// The system's error.
        source: io::Error,
    },
    /// Dropping capabilities or setting `no_new_privs`.
    #[error("dropping privileges: {0}")]
    Privileges(io::Error),
    /// The seccomp filter cannot be built or installed.
    #[error("seccomp filter: {0}")]
    Seccomp(String),
    /// The check worker could not be started or failed.
    #[error("the sandbox check worker {0}")]
    Check(String),
}

//! The worker: the child process that runs one session's CUDA work,
//! `vhost-cuda --session-worker --session-id N`.
//!
//! Only separate processes isolate guest processes from each other on the GPU, so each session
//! that uses the GPU gets a worker of its own. Along the data path: `handle.rs` (the daemon's
//! side: start a worker, share guest RAM with it, hand it requests, wait for its answers, end
//! and reap it; driven by the session's thread, `crate::session`) → `message.rs` (the socket
//! between them: messages and frames; `mailbox.rs`, the hop's shared-memory fast path) →
//! `child.rs` (the worker itself: its main, the re-validation of every request, its loop) →
//! `crate::cuda` (every CUDA op). A saved state travels to and from a worker in a
//! `state_file.rs` (a memfd), never as bytes in the daemon's memory.

mod child;
mod handle;
pub mod mailbox;
pub mod message;
mod state_file;

pub use child::{
    build_request, checkpoint_answer, run, serve, RunError, Work, WorkerConfig, CHANNEL_FD,
};
pub use handle::{
    KeepWorkers, PrecopiedByWorker, SavedByWorker, Waited, WorkerCommand, WorkerError,
    WorkerProcess, ADOPT_WAIT, CLOSE_WAIT,
};
pub use state_file::{widen_pipe, SealedMap, StateFile};

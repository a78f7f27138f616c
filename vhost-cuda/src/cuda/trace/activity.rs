//! What the GPU's profiling interface hands the recorder: activity records in the worker's
//! clock, before they become the wire's `TraceRecord`s.
//!
//! Two implementations: CUPTI's activity API (`cupti.rs`, the host's libcupti loaded at run
//! time) and, in the unit tests, the fake driver's (`driver/fake.rs`), which reports the
//! launches, copies and memsets it ran. Where neither is there, the recorder times each op with
//! CUDA events itself (`gpu_state/trace.rs`).

use std::sync::Arc;

/// One piece of GPU work (or a synchronisation) as the profiling interface saw it. Times are
/// ns of the worker's CLOCK_MONOTONIC; `device` is the CUDA device ordinal of this process
/// (the host's), `stream` the driver's stream id; `correlation` the interface's own id of the
/// API call that issued it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Activity {
    /// A kernel.
    Kernel {
        /// Where and when.
        at: ActivitySpan,
        /// Its (mangled) name.
        name: Arc<str>,
        /// Grid and block dimensions.
        grid: [u32; 3],
        /// Block dimensions.
        block: [u32; 3],
        /// Dynamic shared memory bytes.
        shared_mem: u32,
    },
    /// A copy (`qcuda_proto::trace::copy_kind`).
    Copy {
        /// Where and when.
        at: ActivitySpan,
        /// Its kind.
        kind: u8,
        /// Bytes.
        bytes: u64,
    },
    /// A memset.
    Memset {
        /// Where and when.
        at: ActivitySpan,
        /// Bytes.
        bytes: u64,
    },
    /// A synchronisation (`qcuda_proto::trace::sync_kind`), host times.
    Sync {
        /// Where and when.
        at: ActivitySpan,
        /// Its kind.
        kind: u8,
    },
    /// The request (`id`, the recorder's sequence number) that was current when the API call
    /// `correlation` was made.
    Request {
        /// The interface's id of the API call.
        correlation: u32,
        /// The recorder's sequence number of the request.
        id: u64,
    },
}

/// Where and when one activity ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ActivitySpan {
    /// The CUDA device ordinal in this process.
    pub(crate) device: u32,
    /// The driver's stream id.
    pub(crate) stream: u64,
    /// The interface's id of the API call that issued it.
    pub(crate) correlation: u32,
    /// Start, ns of CLOCK_MONOTONIC.
    pub(crate) start: u64,
    /// End, ns of CLOCK_MONOTONIC.
    pub(crate) end: u64,
}

/// A source of [`Activity`] records: enabled while the recorder is armed.
pub(crate) trait ActivitySource: Send + std::fmt::Debug {
    /// Starts delivering records.
    fn enable(&mut self) -> Result<(), String>;
    /// Stops delivering records (those already made are still collected).
    fn disable(&mut self);
    /// The request `id` issues the API calls from now until [`ActivitySource::end_request`].
    fn begin_request(&mut self, id: u64);
    /// The request of [`ActivitySource::begin_request`] is done.
    fn end_request(&mut self);
    /// Hands every record made so far to `sink` and returns how many the interface lost.
    /// `forced`: every buffer, also one holding records of work still running (the end of a
    /// recording: such records have no times, and count as lost); otherwise each buffer whose
    /// records are all complete, full or not (what a recording takes as it goes).
    fn collect(&mut self, forced: bool, sink: &mut dyn FnMut(Activity)) -> u64;
}

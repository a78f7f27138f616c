//! The core beneath the faces: the runtime face (`crate::runtime`), the driver face
//! (`crate::driver`) and NVML (`crate::nvml`) call into it; it calls none of them. In layers,
//! each using only those below it (tests/module_graph.rs checks it):
//!
//! 1. the words every layer speaks: `cuda_error`, `conv`, `warnings`, `last_error`, `handles`,
//!    `addr_map`;
//! 2. `transport`: the ioctl, calls, the session, batching, signals, capture state;
//! 3. the tables and state of each concept, each given the session and the other tables it acts
//!    on as arguments: `devices` (with contexts), `memory` (device, host, managed, pools, VMM,
//!    IPC), `streams` (with events and host functions), `modules` (registrations, loading,
//!    managed variables), `launch`, `arrays` (with texture and surface objects);
//! 4. `runtime`: the process's `Runtime`, which owns the tables, and the operations on it that
//!    both faces call.

pub mod addr_map;
pub mod arrays;
pub mod conv;
pub mod cuda_error;
pub mod devices;
pub mod handles;
pub mod last_error;
pub mod launch;
pub mod memory;
pub mod modules;
pub mod runtime;
pub mod streams;
pub mod transport;
pub(crate) mod warnings;

#[cfg(test)]
pub(crate) mod fake_arrays;
#[cfg(test)]
pub(crate) mod fake_device;
#[cfg(test)]
pub(crate) mod fake_graphs;

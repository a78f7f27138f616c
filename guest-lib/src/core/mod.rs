//! The core beneath the faces: the session with the host, transport, batching, handle tables,
//! registered fatbins and their modules, memory, streams, events, capture, launches and copies,
//! and the process-wide state. The runtime face (`crate::runtime`), the driver face
//! (`crate::driver`) and NVML (`crate::nvml`) call into it; it calls none of them.

pub mod addr_map;
pub mod allocations;
pub mod array_ops;
pub mod arrays;
pub mod batch;
pub mod call_config;
pub mod capture;
pub mod context;
pub mod conv;
pub mod copy;
pub mod copy3d;
pub mod cuda_error;
pub mod device_prop;
pub mod devices;
pub mod events;
pub mod fatbin;
pub mod graphs;
pub mod handles;
pub mod host_fns;
pub mod host_memory;
pub mod ipc;
pub mod last_error;
pub mod latency;
pub mod launch;
pub mod managed_memory;
pub mod managed_vars;
pub mod memory;
pub mod modules;
pub mod params;
pub mod pools;
pub mod process_checkpoint;
pub mod registry;
pub mod runtime;
pub mod schedule;
pub mod session;
pub mod signal_mask;
pub mod streams;
pub mod symbols;
pub mod transport;
pub mod vmm;
pub(crate) mod warnings;

#[cfg(test)]
pub(crate) mod fake_arrays;
#[cfg(test)]
pub(crate) mod fake_device;
#[cfg(test)]
pub(crate) mod fake_graphs;

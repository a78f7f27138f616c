//! Memory, by kind: device memory (`device`: the allocations the guest knows, for
//! `cudaMemcpyDefault` and pointer attributes), host memory the GPU reaches (`host`: pinned,
//! registered and managed ranges), managed memory's turns (`managed`), memory pools (`pools`),
//! virtual memory management (`vmm`), the IPC handles a process opened (`ipc`), and moving bytes
//! between guest and device memory (`copy`). Each table takes the session and the other tables
//! it acts on as arguments.

pub mod copy;
pub mod device;
pub mod host;
pub mod ipc;
pub mod managed;
pub mod pools;
pub mod vmm;

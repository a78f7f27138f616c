//! Memory pools: `cudaMemPool_t` handles and stream-ordered allocation (`cudaMallocAsync`,
//! `cudaFreeAsync`).
//!
//! A pool lives on the host; its `cudaMemPool_t` is the address of a guest record naming the
//! host's session-local handle and the pool's device (handles.rs), so a made-up or destroyed
//! pool is refused here. A device's default pool has one record for the life of the process,
//! whatever number of times it is asked for. Stream-ordered allocations join the guest's
//! allocation table (memory/device.rs) like `cudaMalloc`'s, so copies and pointer attributes know
//! them; the host keeps its own table and checks every use.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use qcuda_proto::Op;

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::handles::HandleTable,
    core::transport::session::Session,
    core::transport::Call,
};

/// A pool the application can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInfo {
    /// The host's handle.
    pub host: u64,
    /// The device the pool's memory lives on.
    pub device: u32,
}

/// The pools of this process.
#[derive(Debug, Default)]
pub struct Pools {
    table: HandleTable<PoolInfo>,
    /// Host handle -> guest handle, so that a pool asked for twice is one `cudaMemPool_t`.
    by_host: Mutex<HashMap<u64, usize>>,
}

impl Pools {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        self.by_host.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The application's handle for host pool `host` on `device`.
    fn handle_for(&self, host: u64, device: u32) -> usize {
        let mut map = self.lock();
        if let Some(&h) = map.get(&host) {
            if self.table.get(h).is_some() {
                return h;
            }
        }
        let h = self.table.insert(PoolInfo { host, device });
        map.insert(host, h);
        h
    }

    /// The record of a `cudaMemPool_t`; unknown ones are `cudaErrorInvalidValue`, as CUDA says
    /// of a pool that is not one.
    pub fn info(&self, handle: usize) -> CudaResult<PoolInfo> {
        self.table.get(handle).ok_or(CudaError::INVALID_VALUE)
    }

    /// `cudaDeviceGetDefaultMemPool` (op `DeviceGetDefaultMemPool`) or `cudaDeviceGetMemPool`
    /// (op `DeviceGetMemPool`) of `device`.
    pub fn of_device(&self, session: &Session, op: Op, device: u32) -> CudaResult<usize> {
        let reply = session.submit(Call::new(op, device))?;
        Ok(self.handle_for(reply.rets[0], device))
    }

    /// `cudaDeviceSetMemPool`.
    pub fn set_current(&self, session: &Session, device: u32, pool: usize) -> CudaResult<()> {
        let info = self.info(pool)?;
        session.submit(Call::new(Op::DeviceSetMemPool, device).args(&[info.host]))?;
        Ok(())
    }

    /// `cudaMemPoolCreate` of a device pool of at most `max_size` bytes, shareable as
    /// `handle_types` say (0, or `qcuda_proto::POOL_HANDLE_POSIX_FD`).
    pub fn create(
        &self,
        session: &Session,
        device: u32,
        max_size: usize,
        handle_types: u64,
    ) -> CudaResult<usize> {
        let reply = session
            .submit(Call::new(Op::MemPoolCreate, device).args(&[max_size as u64, handle_types]))?;
        Ok(self.handle_for(reply.rets[0], device))
    }

    /// The application's handle for a pool the host imported from another process
    /// (core/runtime/ipc.rs), worked on from `device`.
    pub fn adopt(&self, host: u64, device: u32) -> usize {
        self.handle_for(host, device)
    }

    /// `cudaMemPoolDestroy`.
    pub fn destroy(&self, session: &Session, pool: usize) -> CudaResult<()> {
        let info = self.info(pool)?;
        session.submit(Call::new(Op::MemPoolDestroy, info.device).args(&[info.host]))?;
        self.table.remove(pool);
        self.lock().remove(&info.host);
        Ok(())
    }

    /// Forgets the pools of `device` (the host destroyed them in `DeviceReset`).
    pub fn forget_device(&self, device: u32) {
        self.table.retain(|p| p.device != device);
        self.lock().retain(|_, h| self.table.get(*h).is_some());
    }
}

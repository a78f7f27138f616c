//! The event operations both API faces offer (see `runtime::streams`).

use crate::{
    core::{
        cuda_error::{CudaError, CudaResult},
        runtime::current,
    },
    generated::cudaEventRecordDefault,
};

/// `cudaEventCreateWithFlags`: the new event's handle.
pub fn create(flags: u32) -> CudaResult<usize> {
    let (rt, d) = current()?;
    rt.events.create(&rt.session, d, flags)
}

/// `cudaEventRecordWithFlags` (fire-and-forget): only `cudaEventRecordDefault`
/// (`cudaEventRecordExternal` only matters under stream capture).
pub fn record(event: usize, stream: usize, flags: u32) -> CudaResult<()> {
    if flags != cudaEventRecordDefault {
        return Err(CudaError::NOT_SUPPORTED);
    }
    let (rt, _) = current()?;
    rt.events.record(&rt.session, &rt.streams, event, stream)
}

/// `cudaEventSynchronize`: then managed variables read what the device wrote.
pub fn synchronize(event: usize) -> CudaResult<()> {
    let (rt, _) = current()?;
    rt.events.synchronize(&rt.session, event)?;
    crate::core::runtime::managed::after_sync(rt)
}

/// `cudaEventQuery`: `cudaErrorNotReady` while pending.
pub fn query(event: usize) -> CudaResult<()> {
    let (rt, _) = current()?;
    rt.events.query(&rt.session, event)
}

/// `cudaEventElapsedTime` in milliseconds.
pub fn elapsed_ms(start: usize, end: usize) -> CudaResult<f32> {
    let (rt, _) = current()?;
    rt.events.elapsed_ms(&rt.session, start, end)
}

/// `cudaEventDestroy`.
pub fn destroy(event: usize) -> CudaResult<()> {
    let (rt, _) = current()?;
    rt.events.destroy(&rt.session, event)
}

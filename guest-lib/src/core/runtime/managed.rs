//! Managed memory and `__managed__` variables at the turns of CUDA's model (memory/managed.rs,
//! modules/managed_vars.rs): what the operations call before work, before a launch, after a
//! synchronisation and around a copy the CPU does, and registration's side of the variables.

use qcuda_proto::Op;

use crate::core::{
    cuda_error::{CudaError, CudaResult},
    memory::{host::HostKind, managed::Attach},
    modules::registry::{FatbinRecord, VarRecord},
    runtime::{current, managed_vars, runtime_if_connected, Runtime},
    transport::Call,
};

/// Before work that may touch managed memory is queued on `stream` (wire handle) of `device`:
/// hands the device every managed allocation of it in the host's turn.
pub fn before_work(rt: &Runtime, device: u32, stream: u64) -> CudaResult<()> {
    rt.host_memory
        .managed
        .before_work(&rt.session, device, stream)
}

/// Before a launch on `stream` (wire handle) of `device`: hands the device every managed
/// allocation and `__managed__` variable in the host's turn.
pub fn before_launch(rt: &Runtime, device: u32, stream: u64) -> CudaResult<()> {
    before_work(rt, device, stream)?;
    managed_vars().before_launch(&rt.session, device, stream)
}

/// After a synchronising call that succeeded: hands the host every managed allocation and
/// `__managed__` variable in the device's turn.
pub fn after_sync(rt: &Runtime) -> CudaResult<()> {
    rt.host_memory.managed.after_sync(&rt.session)?;
    managed_vars().after_sync(&rt.session)
}

/// Before a blocking copy that the CPU does itself (host to host) from or to `ranges`: where
/// one lies in a managed allocation in the device's turn, the copy waits for the work queued
/// on `stream` of `device` and the host takes its turn first, so it reads and writes what the
/// device left there (a blocking `cudaMemcpy` is ordered after earlier work, as natively).
/// True if one is still the device's then (work on another stream may touch it): the copy is
/// then the device's to make, between the device addresses.
pub fn before_cpu_copy(
    rt: &Runtime,
    device: u32,
    stream: u64,
    ranges: &[(u64, usize)],
) -> CudaResult<bool> {
    let end_of = |base| rt.host_memory.find(base).map(|a| a.base + a.size);
    if !rt.host_memory.managed.device_turn_in(ranges, end_of) {
        return Ok(false);
    }
    rt.session
        .submit(Call::new(Op::StreamSynchronize, device).args(&[stream]))?;
    after_sync(rt)?;
    Ok(rt.host_memory.managed.device_turn_in(ranges, end_of))
}

/// `cudaStreamAttachMemAsync`/`cuStreamAttachMemAsync`: which streams' work may touch a managed
/// allocation: every stream of its device, the host alone (the CPU may then use it while
/// kernels run), or one stream. It takes effect from the allocation's next turn to the device
/// (its work so far is waited for as it was attached then).
pub fn attach_mem(stream: usize, ptr: usize, length: usize, flags: u32) -> CudaResult<()> {
    const GLOBAL: u32 = 1;
    const HOST: u32 = 2;
    const SINGLE: u32 = 4;
    if flags != GLOBAL && flags != HOST && flags != SINGLE {
        return Err(CudaError::INVALID_VALUE);
    }
    let (rt, _) = current()?;
    let t = rt.streams.target(stream)?;
    if flags == SINGLE && t.wire == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let a = rt
        .host_memory
        .find(ptr)
        .filter(|a| a.kind == HostKind::Managed)
        .ok_or(CudaError::INVALID_VALUE)?;
    // Length 0 names the whole allocation, which `ptr` must then start.
    if (length == 0 && a.base != ptr) || (length != 0 && length != a.size) {
        return Err(CudaError::INVALID_VALUE);
    }
    let attach = match flags {
        GLOBAL => Attach::Global,
        HOST => Attach::Host,
        _ => Attach::Stream(t.wire),
    };
    rt.host_memory.managed.attach(a.base, attach);
    Ok(())
}

/// Records a `__managed__` variable of `var`'s image, whose address nvcc's code reads from
/// `host_ptr`.
pub fn register(var: &'static VarRecord, host_ptr: usize) {
    managed_vars().register(var, host_ptr);
}

/// `__cudaUnregisterFatBinary`: forgets the image's variables (and frees what was bound).
pub fn forget_fatbin(fatbin: &FatbinRecord) {
    let bound = managed_vars().forget_fatbin(fatbin);
    if let Some(rt) = runtime_if_connected() {
        for host in bound {
            let _ = rt.host_memory.free(&rt.session, host, HostKind::Managed);
        }
    }
}

/// `__cudaInitModule`: binds every `__managed__` variable of `fatbin` on the current device.
pub fn init_module(fatbin: &FatbinRecord) -> CudaResult<()> {
    let (rt, device) = current()?;
    managed_vars().init_module(&rt.session, &rt.host_memory, fatbin, device)
}

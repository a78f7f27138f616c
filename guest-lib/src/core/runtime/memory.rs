//! Device memory: `cudaMalloc`, `cudaFree`, the `cudaMemcpy` family and `cudaMemset`.
//!
//! Host<->device data goes through `copy.rs`; device<->device copies and memsets carry no data
//! and are single requests. Host-to-host copies never leave the guest. `cu::cudaMemcpyDefault` is
//! resolved with the guest's allocation table: a pointer inside a `cudaMalloc` allocation is
//! device memory, anything else is host memory.

use crate::core::conv::{low_byte, usize_of};
use qcuda_proto::Op;

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::memory::copy,
    core::memory::device::Allocation,
    core::memory::host::HostKind,
    core::runtime::Runtime,
    core::transport::Call,
    generated::{self as cu, cudaMemcpyKind},
};

/// `cudaMalloc` of `size` bytes on `device`. Zero bytes gives a null pointer, as in CUDA.
pub fn malloc(rt: &Runtime, device: u32, size: usize) -> CudaResult<u64> {
    rt.session.check_unsafe_call()?;
    if size == 0 {
        return Ok(0);
    }
    let reply = rt
        .session
        .submit(Call::new(Op::Malloc, device).args(&[size as u64]))?;
    let base = reply.rets[0];
    rt.allocations.insert(Allocation {
        base,
        size: size as u64,
        device,
        origin: crate::core::memory::device::Origin::Malloc,
    });
    Ok(base)
}

/// `cudaFree`. Null is a no-op; managed memory is freed as such. The host decides whether any
/// other pointer is valid.
pub fn free(rt: &Runtime, device: u32, ptr: u64) -> CudaResult<()> {
    if ptr == 0 {
        // `cudaFree(0)` is how programs make CUDA set up early: the host creates the context
        // (and starts the session's worker) now rather than at the first real call.
        if !rt.session.has_context(device) {
            rt.session.submit(Call::new(Op::Free, device).args(&[0]))?;
        }
        return Ok(());
    }
    if let Some(m) = rt.host_memory.find(usize_of(ptr)) {
        if m.kind == HostKind::Managed && m.base as u64 == ptr {
            return rt.host_memory.free(&rt.session, m.base, HostKind::Managed);
        }
    }
    let device = rt.allocations.find(ptr).map_or(device, |a| a.device);
    rt.session
        .submit(Call::new(Op::Free, device).args(&[ptr]))?;
    rt.allocations.remove(ptr);
    Ok(())
}

/// The direction of a copy, once `cu::cudaMemcpyDefault` is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Host to host: done in the guest.
    HostToHost,
    /// Host to device.
    HostToDevice,
    /// Device to host.
    DeviceToHost,
    /// Device to device.
    DeviceToDevice,
}

/// Resolves `kind` for a copy from `src` to `dst`.
pub fn direction(rt: &Runtime, dst: u64, src: u64, kind: cudaMemcpyKind) -> CudaResult<Direction> {
    Ok(match kind {
        cu::cudaMemcpyHostToHost => Direction::HostToHost,
        cu::cudaMemcpyHostToDevice => Direction::HostToDevice,
        cu::cudaMemcpyDeviceToHost => Direction::DeviceToHost,
        cu::cudaMemcpyDeviceToDevice => Direction::DeviceToDevice,
        cu::cudaMemcpyDefault => {
            let dst_dev = rt.allocations.find(dst).is_some();
            let src_dev = rt.allocations.find(src).is_some();
            match (src_dev, dst_dev) {
                (false, false) => Direction::HostToHost,
                (false, true) => Direction::HostToDevice,
                (true, false) => Direction::DeviceToHost,
                (true, true) => Direction::DeviceToDevice,
            }
        }
        _ => return Err(CudaError::INVALID_MEMCPY_DIRECTION),
    })
}

/// Where a copy or memset is ordered: a stream on a device, and whether the caller waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ordering {
    /// The device for the request.
    pub device: u32,
    /// The stream handle on the wire (0: legacy stream).
    pub stream: u64,
    /// `*Async` variant: work that carries no guest data (device-to-device copies, memsets) is
    /// fire-and-forget. Copies touching guest memory always wait, since the memory is pageable.
    pub is_async: bool,
}

/// `cudaMemcpy`/`cudaMemcpyAsync` of `count` bytes.
///
/// # Safety
/// Host-side ranges (`dst` for device-to-host and host-to-host, `src` for host-to-device and
/// host-to-host) must be valid for `count` bytes, as the CUDA API requires.
pub unsafe fn memcpy(
    rt: &Runtime,
    dst: u64,
    src: u64,
    count: usize,
    kind: cudaMemcpyKind,
    order: Ordering,
) -> CudaResult<()> {
    let dir = direction(rt, dst, src, kind)?;
    rt.session.check_sticky(order.device)?;
    if !order.is_async {
        rt.session.check_unsafe_call()?;
    }
    if count == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    if dir != Direction::HostToHost {
        // Managed memory on either side is the device's while the copy runs.
        crate::core::runtime::managed::before_work(rt, order.device, order.stream)?;
    }
    // Host memory the GPU maps: the driver copies it directly, in stream order, with nothing on
    // the virtqueue; an `*Async` copy returns at once, as on native pinned memory.
    let mapped = match dir {
        Direction::HostToDevice => rt
            .host_memory
            .device_range(usize_of(src), count)
            .map(|s| (dst, s)),
        Direction::DeviceToHost => rt
            .host_memory
            .device_range(usize_of(dst), count)
            .map(|d| (d, src)),
        _ => None,
    };
    let mut mapped = mapped;
    if mapped.is_none()
        && order.is_async
        && matches!(dir, Direction::HostToDevice | Direction::DeviceToHost)
        && capturing(rt, order)?
    {
        // Captured into a graph, the copy runs whenever the graph does: the pageable side is
        // pinned and mapped for the worker (memory/host.rs), and the copy is the driver's.
        let pin = |a: u64| {
            rt.host_memory
                .pin_for_graph(&rt.session, usize_of(a), count, order.device)
        };
        mapped = Some(match dir {
            Direction::HostToDevice => (dst, pin(src)?),
            _ => (pin(dst)?, src),
        });
    }
    if let Some((dst, src)) = mapped {
        let mut call =
            Call::new(Op::MemcpyMapped, order.device).args(&[dst, src, count as u64, order.stream]);
        if order.is_async {
            call = call.fire_and_forget();
        }
        rt.session.submit(call)?;
        return synchronised(rt, order);
    }
    match dir {
        Direction::HostToHost => {
            if !order.is_async
                && crate::core::runtime::managed::before_cpu_copy(
                    rt,
                    order.device,
                    order.stream,
                    &[(dst, count), (src, count)],
                )?
            {
                // Managed memory still the device's: the device copies it.
                let dev = |a: u64| rt.host_memory.device_range(usize_of(a), count);
                match (dev(dst), dev(src)) {
                    (Some(d), Some(s)) => {
                        rt.session
                            .submit(Call::new(Op::MemcpyMapped, order.device).args(&[
                                d,
                                s,
                                count as u64,
                                order.stream,
                            ]))?;
                    }
                    // SAFETY: the other side is host memory valid for `count` bytes (caller
                    // contract).
                    (None, Some(s)) => unsafe {
                        copy::device_to_host(
                            &rt.session,
                            order.device,
                            dst as *mut u8,
                            s,
                            count,
                            order.stream,
                        )?;
                    },
                    // SAFETY: as above.
                    (Some(d), None) => unsafe {
                        copy::host_to_device(
                            &rt.session,
                            order.device,
                            d,
                            src as *const u8,
                            count,
                            order.stream,
                        )?;
                    },
                    (None, None) => return Err(CudaError::INVALID_VALUE),
                }
                return synchronised(rt, order);
            }
            // SAFETY: both ranges are host memory valid for `count` bytes (caller contract);
            // `copy` allows them to overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count) };
            Ok(())
        }
        Direction::HostToDevice => {
            // SAFETY: `src` is host memory readable for `count` bytes (caller contract).
            unsafe {
                copy::host_to_device(
                    &rt.session,
                    order.device,
                    dst,
                    src as *const u8,
                    count,
                    order.stream,
                )?;
            };
            synchronised(rt, order)
        }
        Direction::DeviceToHost => {
            // SAFETY: `dst` is host memory writable for `count` bytes (caller contract).
            unsafe {
                copy::device_to_host(
                    &rt.session,
                    order.device,
                    dst as *mut u8,
                    src,
                    count,
                    order.stream,
                )?;
            };
            synchronised(rt, order)
        }
        Direction::DeviceToDevice => {
            // Memory of other devices (unified addressing makes that a plain device-to-device
            // copy natively): a peer copy on the same stream, each range on its own device.
            let home = |p: u64| rt.allocations.find(p).map(|a| a.device);
            if let (Some(dd), Some(sd)) = (home(dst), home(src)) {
                if dd != order.device || sd != order.device {
                    let mut call = Call::new(Op::MemcpyPeer, order.device).args(&[
                        dst,
                        u64::from(dd),
                        src,
                        u64::from(sd),
                        count as u64,
                        order.stream,
                    ]);
                    if order.is_async {
                        call = call.fire_and_forget();
                    }
                    rt.session.submit(call)?;
                    return Ok(());
                }
            }
            let mut call = Call::new(Op::MemcpyDtoD, order.device).args(&[
                dst,
                src,
                count as u64,
                order.stream,
            ]);
            if order.is_async {
                call = call.fire_and_forget();
            }
            rt.session.submit(call)?;
            Ok(())
        }
    }
}

/// Whether the copy's stream is capturing into a graph (only asked while a capture of the
/// process is under way).
fn capturing(rt: &Runtime, order: Ordering) -> CudaResult<bool> {
    if !rt.session.captures.active() {
        return Ok(false);
    }
    let (mut none, mut no_edges) = ([0u8; 0], [0u8; 0]);
    let reply = rt.session.submit(
        Call::new(Op::StreamCaptureInfo, order.device)
            .args(&[order.stream])
            .output(&mut none)
            .output(&mut no_edges),
    )?;
    Ok(reply.rets[0] != 0)
}

/// After a blocking copy between host and device: the host's turn for `__managed__` variables
/// (modules/managed_vars.rs), as after any synchronisation.
fn synchronised(rt: &Runtime, order: Ordering) -> CudaResult<()> {
    if order.is_async {
        return Ok(());
    }
    crate::core::runtime::managed::after_sync(rt)
}

/// `cudaMemset`/`cudaMemsetAsync`: `count` bytes at device address `dst` set to the low byte of
/// `value`.
pub fn memset(rt: &Runtime, dst: u64, value: i32, count: usize, order: Ordering) -> CudaResult<()> {
    memset_elements(rt, dst, u32::from(low_byte(value)), 1, count, order)
}

/// `count` elements of `width` bytes (1, 2 or 4: `cuMemsetD8`/`D16`/`D32`) at device address
/// `dst` set to the low `width` bytes of `value`.
pub fn memset_elements(
    rt: &Runtime,
    dst: u64,
    value: u32,
    width: u64,
    count: usize,
    order: Ordering,
) -> CudaResult<()> {
    rt.session.check_sticky(order.device)?;
    if !order.is_async {
        rt.session.check_unsafe_call()?;
    }
    if count == 0 {
        return Ok(());
    }
    crate::core::runtime::managed::before_work(rt, order.device, order.stream)?;
    let mut call = Call::new(Op::Memset, order.device).args(&[
        dst,
        u64::from(value),
        count as u64,
        order.stream,
        width,
    ]);
    if order.is_async {
        call = call.fire_and_forget();
    }
    rt.session.submit(call)?;
    Ok(())
}

/// The memory operations both API faces offer (see `runtime::streams`), on the calling thread's
/// current device unless a stream or pointer names another.
pub mod ops {
    use qcuda_proto::Op;

    use super::Ordering;
    use crate::{
        core::{
            conv::usize_of,
            cuda_error::{CudaError, CudaResult},
            memory::host::HostKind,
            runtime::{current, Runtime},
            transport::Call,
            warnings::warn_once,
        },
        generated::{
            cudaHostAllocMapped, cudaHostAllocPortable, cudaHostAllocWriteCombined,
            cudaHostRegisterIoMemory, cudaHostRegisterMapped, cudaHostRegisterPortable,
            cudaHostRegisterReadOnly, cudaMemcpyKind,
        },
    };

    /// `cudaMemAttachGlobal`.
    const MEM_ATTACH_GLOBAL: u32 = 1;
    /// `cudaMemAttachHost`.
    const MEM_ATTACH_HOST: u32 = 2;

    /// Orders a synchronous call on the legacy stream of `device`.
    pub fn sync_order(device: u32) -> Ordering {
        Ordering {
            device,
            stream: 0,
            is_async: false,
        }
    }

    /// Orders an `*Async` call on `stream`.
    pub fn async_order(stream: usize) -> CudaResult<(&'static Runtime, Ordering)> {
        let (rt, _) = current()?;
        let t = rt.streams.target(stream)?;
        Ok((
            rt,
            Ordering {
                device: t.device,
                stream: t.wire,
                is_async: true,
            },
        ))
    }

    /// `cudaMalloc`: the new allocation's device address (0 for size 0).
    pub fn malloc(size: usize) -> CudaResult<u64> {
        let (rt, d) = current()?;
        super::malloc(rt, d, size)
    }

    /// `cudaFree`.
    pub fn free(ptr: u64) -> CudaResult<()> {
        let (rt, d) = current()?;
        super::free(rt, d, ptr)
    }

    /// `cudaMemcpy`: all four kinds and `cudaMemcpyDefault`, any size.
    ///
    /// # Safety
    /// The host-side ranges are valid for `count` bytes, as the API documents.
    pub unsafe fn memcpy(dst: u64, src: u64, count: usize, kind: cudaMemcpyKind) -> CudaResult<()> {
        let (rt, d) = current()?;
        // SAFETY: forwarded contract for the host-side ranges.
        unsafe { super::memcpy(rt, dst, src, count, kind, sync_order(d)) }
    }

    /// `cudaMemcpyAsync`: copies touching guest memory complete before returning (the memory
    /// is pageable); device-to-device copies are fire-and-forget.
    ///
    /// # Safety
    /// As for [`memcpy`].
    pub unsafe fn memcpy_async(
        dst: u64,
        src: u64,
        count: usize,
        kind: cudaMemcpyKind,
        stream: usize,
    ) -> CudaResult<()> {
        let (rt, order) = async_order(stream)?;
        // SAFETY: forwarded contract for the host-side ranges.
        unsafe { super::memcpy(rt, dst, src, count, kind, order) }
    }

    /// `cudaMemset`.
    pub fn memset(dst: u64, value: i32, count: usize) -> CudaResult<()> {
        let (rt, d) = current()?;
        super::memset(rt, dst, value, count, sync_order(d))
    }

    /// `cudaMemsetAsync` (fire-and-forget).
    pub fn memset_async(dst: u64, value: i32, count: usize, stream: usize) -> CudaResult<()> {
        let (rt, order) = async_order(stream)?;
        super::memset(rt, dst, value, count, order)
    }

    /// `cudaMemGetInfo` of the current device: (free, total).
    pub fn mem_info() -> CudaResult<(usize, usize)> {
        let (rt, d) = current()?;
        let reply = rt.session.submit(Call::new(Op::MemGetInfo, d))?;
        Ok((usize_of(reply.rets[0]), usize_of(reply.rets[1])))
    }

    /// `cudaHostAlloc`: every flag works. The memory is always portable and mapped (it is one
    /// registration, visible to every device, at a device address equal to the pointer);
    /// write-combining is a CPU caching hint that guest memory does not take, so it is recorded
    /// only.
    pub fn host_alloc(size: usize, flags: u32) -> CudaResult<usize> {
        if flags & !(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined) != 0
        {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session.check_sticky(d)?;
        rt.session.check_unsafe_call()?;
        rt.host_memory
            .alloc(&rt.session, size, flags, d, HostKind::Allocated)
    }

    /// `cudaFreeHost`: waits for the device's work, then the host drops its mapping.
    pub fn free_host(ptr: usize) -> CudaResult<()> {
        let (rt, _) = current()?;
        rt.host_memory.free(&rt.session, ptr, HostKind::Allocated)
    }

    /// `cudaHostRegister`: qcuda.ko pins the pages and the host maps and registers them for as
    /// long as the registration lives. `cudaHostRegisterIoMemory` (device memory of another
    /// PCI device) has no guest equivalent.
    pub fn host_register(ptr: usize, size: usize, flags: u32) -> CudaResult<()> {
        let known = cudaHostRegisterPortable
            | cudaHostRegisterMapped
            | cudaHostRegisterIoMemory
            | cudaHostRegisterReadOnly;
        if flags & !known != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        if flags & cudaHostRegisterIoMemory != 0 {
            warn_once!("cudaHostRegister: cudaHostRegisterIoMemory is not supported in a guest");
            return Err(CudaError::NOT_SUPPORTED);
        }
        let (rt, d) = current()?;
        rt.session.check_sticky(d)?;
        rt.session.check_unsafe_call()?;
        let read_only = flags & cudaHostRegisterReadOnly != 0;
        rt.host_memory
            .register(&rt.session, ptr, size, flags, read_only, d)
    }

    /// `cudaHostUnregister`.
    pub fn host_unregister(ptr: usize) -> CudaResult<()> {
        let (rt, _) = current()?;
        rt.host_memory.unregister(&rt.session, ptr)
    }

    /// `cudaHostGetDevicePointer`: the device address of host-mapped memory.
    pub fn host_device_pointer(ptr: usize, flags: u32) -> CudaResult<u64> {
        if flags != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, _) = current()?;
        let a = rt.host_memory.find(ptr).ok_or(CudaError::INVALID_VALUE)?;
        Ok(a.device_address(ptr))
    }

    /// `cudaHostGetFlags`: the flags an allocation was made with.
    pub fn host_flags(ptr: usize) -> CudaResult<u32> {
        let (rt, _) = current()?;
        let a = rt.host_memory.find(ptr).ok_or(CudaError::INVALID_VALUE)?;
        Ok(a.flags)
    }

    /// `cudaMallocManaged`: one address that the program and its kernels share: device memory
    /// for the GPU, guest pages for the CPU, migrated at launches and synchronisations
    /// (memory/managed.rs; docs/ARCHITECTURE.md, "Host memory").
    pub fn malloc_managed(size: usize, flags: u32) -> CudaResult<usize> {
        if flags != MEM_ATTACH_GLOBAL && flags != MEM_ATTACH_HOST {
            return Err(CudaError::INVALID_VALUE);
        }
        let (rt, d) = current()?;
        rt.session.check_sticky(d)?;
        rt.session.check_unsafe_call()?;
        let p = rt.host_memory.alloc_managed(&rt.session, size, flags, d)?;
        if rt
            .host_memory
            .find(p)
            .is_some_and(|a| a.dev_addr != p as u64)
        {
            // Only memory at one address for both sides is managed memory.
            let _ = rt.host_memory.free(&rt.session, p, HostKind::Managed);
            warn_once!("cudaMallocManaged: the host could not map the memory at its own address");
            return Err(CudaError::NOT_SUPPORTED);
        }
        Ok(p)
    }

    /// `cudaMemcpyPeer` (`stream` None: the current device's legacy stream, returning once the
    /// copy is done) and `cudaMemcpyPeerAsync` (in the order of `stream`).
    pub fn memcpy_peer(
        dst: u64,
        dst_device: i32,
        src: u64,
        src_device: i32,
        count: usize,
        stream: Option<usize>,
    ) -> CudaResult<()> {
        let (rt, order) = match stream {
            None => {
                let (rt, d) = current()?;
                (rt, sync_order(d))
            }
            Some(s) => async_order(s)?,
        };
        let dd = rt.devices.check(dst_device)?;
        let sd = rt.devices.check(src_device)?;
        if count == 0 {
            return Ok(());
        }
        let mut call = Call::new(Op::MemcpyPeer, order.device).args(&[
            dst,
            u64::from(dd),
            src,
            u64::from(sd),
            count as u64,
            order.stream,
        ]);
        if order.is_async {
            call = call.fire_and_forget();
        }
        rt.session.submit(call)?;
        Ok(())
    }
}

//! Host memory the GPU reaches directly: `cudaMallocHost`/`cudaHostAlloc`, `cudaHostRegister`
//! and `cudaMallocManaged`.
//!
//! Every such range is guest memory that qcuda.ko holds for the host and the session's worker
//! maps and registers with the driver (docs/ARCHITECTURE.md, "Host memory"):
//!
//! - **Allocated** (`cudaHostAlloc`, `cudaMallocManaged`): pages of an mmap of `/dev/qcuda`,
//!   placed inside the window of addresses (`HOST_WINDOW_BASE`) that this process and every
//!   worker reserve, so the worker maps them at the same address and the device address equals
//!   the pointer. Copies from and to them, and kernels reading them, are the driver's own DMA.
//! - **Registered** (`cudaHostRegister`): the application's own pages, pinned by the module;
//!   mapped at the same address on the host when it is free there, else elsewhere (then
//!   `cudaHostGetDevicePointer` gives a different device address).
//!
//! - **Managed on the device** (`cudaMallocManaged`): the worker first places device memory
//!   (`ManagedPlace`) wherever the host's driver reserves it (an address of the managed-memory
//!   window `MANAGED_WINDOW_BASE`, reserved here for it, offered as the hint, which the driver
//!   may or may not honour); this process then takes that very range of
//!   its own address space (all of it, `MANAGED_ALIGN` multiples), maps the allocation's pages
//!   of `/dev/qcuda` there and has the worker keep them as the other side of the migrations
//!   that memory/managed.rs asks for (`HOST_MAP_MANAGED`). So the pointer is the same on both
//!   sides, and kernels and the GPU's atomics reach device memory. Where the address is taken
//!   here, the worker places again (the taken placements held meanwhile, then given back).
//!
//! The table here answers which pointers are such memory, and their device addresses.

use crate::core::conv::usize_of;
use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard, PoisonError},
};

use qcuda_proto::{
    ioctl::HostMapCall, Op, HOST_MAP_MANAGED, HOST_MAP_READ_ONLY, HOST_PAGE_SIZE, HOST_WINDOW_BASE,
    HOST_WINDOW_LEN, MANAGED_ALIGN, MANAGED_WINDOW_BASE, MANAGED_WINDOW_LEN,
};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::transport::session::Session,
    core::transport::Call,
    core::warnings::warn_once,
};

const PAGE: usize = usize_of(HOST_PAGE_SIZE);

/// What kind of host memory a range is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// `cudaMallocHost` / `cudaHostAlloc`.
    Allocated,
    /// `cudaHostRegister`.
    Registered,
    /// `cudaMallocManaged`.
    Managed,
    /// Pageable memory a graph's memcpy node (or a copy captured into a graph) reads or writes:
    /// pinned and mapped by qcuda itself ([`HostAllocations::pin_for_graph`]), since the worker
    /// runs the copy whenever the graph runs, long after the call. The application still sees
    /// pageable memory.
    GraphPinned,
}

/// One host-mapped range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostAllocation {
    /// Address of the first byte (what the application holds).
    pub base: usize,
    /// Bytes asked for.
    pub size: usize,
    /// Bytes mapped (allocations: size rounded up to pages).
    mapped: usize,
    /// Bytes of address space it holds (`mapped`, or for managed memory `mapped` rounded up
    /// to `MANAGED_ALIGN`).
    window: usize,
    /// Whose address space that is.
    held: Held,
    /// `cudaHostAlloc*` / `cudaHostRegister*` / `cudaMemAttach*` flags.
    pub flags: u32,
    /// The device that was current when it was made.
    pub device: u32,
    /// The device address of `base`.
    pub dev_addr: u64,
    /// Its `CU_POINTER_ATTRIBUTE_BUFFER_ID` (0 for memory the application never made).
    pub buffer_id: u64,
    /// Where it came from.
    pub kind: HostKind,
}

/// Who holds a host-mapped range's addresses in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// The window: they go back to it.
    Window,
    /// The managed-memory window: they go back to it.
    ManagedWindow,
    /// A reservation of its own (managed memory the driver placed outside the window): unmapped
    /// when it goes.
    Own,
    /// The application (registered and graph-pinned memory): left as they are.
    Application,
}

/// Most places a `cudaMallocManaged` asks for when the addresses the driver gives are taken
/// in this process.
const MANAGED_TRIES: usize = 8;

impl HostAllocation {
    /// The device address of `addr`, a pointer inside this range.
    pub fn device_address(&self, addr: usize) -> u64 {
        self.dev_addr + (addr - self.base) as u64
    }
}

/// The address window for allocations: reserved at first use, handed out first-fit. One per
/// process, like the address space it reserves.
static WINDOW: Mutex<Window> = Mutex::new(Window {
    base: HOST_WINDOW_BASE,
    len: HOST_WINDOW_LEN,
    reserved: None,
    free: BTreeMap::new(),
});

/// The addresses offered to the host's driver for managed memory (`MANAGED_WINDOW_BASE`).
static MANAGED_WINDOW: Mutex<Window> = Mutex::new(Window {
    base: MANAGED_WINDOW_BASE,
    len: MANAGED_WINDOW_LEN,
    reserved: None,
    free: BTreeMap::new(),
});

#[derive(Debug)]
struct Window {
    base: u64,
    len: u64,
    reserved: Option<bool>,
    /// Free ranges: start -> length.
    free: BTreeMap<usize, usize>,
}

impl Window {
    /// Whether `at..at + len` lies inside it.
    fn holds(&self, at: usize, len: usize) -> bool {
        at >= usize_of(self.base)
            && at
                .checked_add(len)
                .is_some_and(|end| end <= usize_of(self.base + self.len))
    }

    fn reserve(&mut self) -> bool {
        if let Some(r) = self.reserved {
            return r;
        }
        let base = usize_of(self.base) as *mut libc::c_void;
        let len = usize_of(self.len);
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; a PROT_NONE
        // reservation touches no memory.
        let p = unsafe {
            libc::mmap(
                base,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        let ok = p == base;
        if !ok {
            if p != libc::MAP_FAILED {
                // SAFETY: `p` is the mapping just made, used by nothing.
                unsafe { libc::munmap(p, len) };
            }
            if self.base == HOST_WINDOW_BASE {
                warn_once!(
                    "cannot reserve the host-memory window at {HOST_WINDOW_BASE:#x}: pinned \
                     memory gets device addresses that differ from its pointers"
                );
            } else {
                warn_once!(
                    "cannot reserve the managed-memory window at {MANAGED_WINDOW_BASE:#x}: \
                     managed memory goes where the host's driver puts it"
                );
            }
        } else {
            self.free.insert(base as usize, len);
        }
        self.reserved = Some(ok);
        ok
    }

    /// `start..start + len` if all of it is free.
    fn take_exact(&mut self, start: usize, len: usize) -> bool {
        let Some((&s, &n)) = self.free.range(..=start).next_back() else {
            return false;
        };
        if start.checked_add(len).is_none_or(|end| end > s + n) {
            return false;
        }
        self.free.remove(&s);
        if start > s {
            self.free.insert(s, start - s);
        }
        if s + n > start + len {
            self.free.insert(start + len, s + n - (start + len));
        }
        true
    }

    /// First fit of `len` bytes at a multiple of `align` (a power of two, at least a page).
    fn take_aligned(&mut self, len: usize, align: usize) -> Option<usize> {
        let (start, n, at) = self.free.iter().find_map(|(&start, &n)| {
            let at = start.checked_next_multiple_of(align)?;
            (at.checked_add(len)? <= start + n).then_some((start, n, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if start + n > at + len {
            self.free.insert(at + len, start + n - (at + len));
        }
        Some(at)
    }

    /// Gives `start..start + len` back, as a PROT_NONE reservation again.
    fn give(&mut self, start: usize, len: usize) {
        // SAFETY: the range was taken from this window (ours, inside the reservation); it
        // becomes reserved address space again, replacing whatever we mapped there.
        unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        let mut start = start;
        let mut len = len;
        if let Some((&s, &n)) = self.free.range(..start).next_back() {
            if s + n == start {
                self.free.remove(&s);
                start = s;
                len += n;
            }
        }
        if let Some(n) = self.free.remove(&(start + len)) {
            len += n;
        }
        self.free.insert(start, len);
    }
}

/// Live host-mapped ranges, by base address.
#[derive(Debug, Default)]
pub struct HostAllocations {
    by_base: Mutex<BTreeMap<usize, HostAllocation>>,
    /// Managed memory on the device and whose turn it is (memory/managed.rs).
    pub managed: crate::core::memory::managed::ManagedTurns,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HostAllocations {
    /// Allocates `size` bytes the GPU reaches directly, zeroed, at an address whose device
    /// address is itself (inside the window). Zero bytes gives a null pointer.
    pub fn alloc(
        &self,
        session: &Session,
        size: usize,
        flags: u32,
        device: u32,
        kind: HostKind,
    ) -> CudaResult<usize> {
        self.alloc_in(session, size, flags, device, kind)
    }

    /// `cudaMallocManaged`: device memory placed by the host, its address taken here for the
    /// allocation's pages (see the module's doc); the allocation starts in the host's turn
    /// (memory/managed.rs), attached as `flags` says. Zero bytes gives a null pointer.
    pub fn alloc_managed(
        &self,
        session: &Session,
        size: usize,
        flags: u32,
        device: u32,
    ) -> CudaResult<usize> {
        if size == 0 {
            return Ok(0);
        }
        let mapped = size
            .checked_next_multiple_of(PAGE)
            .ok_or(CudaError::MEMORY_ALLOCATION)?;
        let window = mapped
            .checked_next_multiple_of(usize_of(MANAGED_ALIGN))
            .ok_or(CudaError::MEMORY_ALLOCATION)?;
        let hint = {
            let mut w = lock(&MANAGED_WINDOW);
            if w.reserve() {
                w.take_aligned(window, usize_of(MANAGED_ALIGN))
            } else {
                None
            }
        };
        let placed = place_managed(session, mapped, window, hint, device);
        if let Some(h) = hint {
            if !matches!(placed, Ok((at, _)) if at == h) {
                lock(&MANAGED_WINDOW).give(h, window);
            }
        }
        let (base, held) = placed?;
        let undo = |forget: bool| {
            if forget {
                // The module forgets the mmap's pages (the host never mapped them).
                let _ = session.host_map(call(base, 0, 0, device), true);
            }
            let _ = session.submit(Call::new(Op::ManagedUnplace, device).args(&[base as u64]));
            release_range(base, window, held);
        };
        let reply = map_new(session, base, mapped, HOST_MAP_MANAGED, device, undo)?;
        lock(&self.by_base).insert(
            base,
            HostAllocation {
                base,
                size,
                mapped,
                window,
                held,
                flags,
                device,
                dev_addr: reply.dev_addr,
                buffer_id: crate::core::memory::device::next_buffer_id(),
                kind: HostKind::Managed,
            },
        );
        self.managed.insert(base, device, flags);
        Ok(base)
    }

    fn alloc_in(
        &self,
        session: &Session,
        size: usize,
        flags: u32,
        device: u32,
        kind: HostKind,
    ) -> CudaResult<usize> {
        if size == 0 {
            return Ok(0);
        }
        let mapped = size
            .checked_next_multiple_of(PAGE)
            .ok_or(CudaError::MEMORY_ALLOCATION)?;
        let (window, align) = (mapped, PAGE);
        let base = {
            let mut w = lock(&WINDOW);
            if !w.reserve() {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            w.take_aligned(window, align)
                .ok_or(CudaError::MEMORY_ALLOCATION)?
        };
        let undo = |forget: bool| {
            if forget {
                // The module forgets the mmap's pages (the host never mapped them).
                let _ = session.host_map(call(base, 0, 0, device), true);
            }
            lock(&WINDOW).give(base, window);
        };
        let reply = map_new(session, base, mapped, 0, device, undo)?;
        lock(&self.by_base).insert(
            base,
            HostAllocation {
                base,
                size,
                mapped,
                window,
                held: Held::Window,
                flags,
                device,
                dev_addr: reply.dev_addr,
                buffer_id: crate::core::memory::device::next_buffer_id(),
                kind,
            },
        );
        Ok(base)
    }

    /// Frees an allocation of `kind` made by [`alloc`](Self::alloc). Null is a no-op; any other
    /// pointer that is not the start of one is `cudaErrorInvalidValue`.
    pub fn free(&self, session: &Session, base: usize, kind: HostKind) -> CudaResult<()> {
        if base == 0 {
            return Ok(());
        }
        let a = {
            let mut map = lock(&self.by_base);
            match map.get(&base) {
                Some(a) if a.kind == kind => map.remove(&base),
                _ => None,
            }
        }
        .ok_or(CudaError::INVALID_VALUE)?;
        self.release(session, &a)
    }

    /// Ends the host mapping of `a` (waiting for the device's work, as `cudaFreeHost` does) and
    /// gives allocated memory back.
    fn release(&self, session: &Session, a: &HostAllocation) -> CudaResult<()> {
        self.managed.remove(a.base);
        let unmapped = session.host_map(call(a.base, 0, 0, a.device), true);
        if unmapped.is_err() {
            // Pages the host may still map stay mapped here too (the module holds them until
            // the process ends); only the address range is lost.
            return unmapped.map(|_| ());
        }
        release_range(a.base, a.window, a.held);
        unmapped.map(|_| ())
    }

    /// `cudaHostRegister` of `ptr..ptr + size`.
    pub fn register(
        &self,
        session: &Session,
        ptr: usize,
        size: usize,
        flags: u32,
        read_only: bool,
        device: u32,
    ) -> CudaResult<()> {
        if ptr == 0 || size == 0 || ptr.checked_add(size).is_none() {
            return Err(CudaError::INVALID_VALUE);
        }
        if self.overlapping(ptr, size) {
            return Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED);
        }
        let map_flags = if read_only { HOST_MAP_READ_ONLY } else { 0 };
        let mut c = call(ptr, size, map_flags, device);
        c.len = size as u64;
        let reply = session.host_map(c, false)?;
        lock(&self.by_base).insert(
            ptr,
            HostAllocation {
                base: ptr,
                size,
                mapped: size,
                window: size,
                held: Held::Application,
                flags,
                device,
                dev_addr: reply.dev_addr,
                buffer_id: crate::core::memory::device::next_buffer_id(),
                kind: HostKind::Registered,
            },
        );
        Ok(())
    }

    /// Makes `addr..addr + len` of pageable memory reachable by the GPU for as long as the
    /// process lives, and returns the device address of `addr`: the pages not host-mapped yet
    /// are pinned and mapped (`HostKind::GraphPinned`). A graph may run any number of times,
    /// and qcuda cannot tell when the application frees the memory, so they stay mapped; CUDA
    /// likewise requires a graph's host memory to outlive the graph.
    pub fn pin_for_graph(
        &self,
        session: &Session,
        addr: usize,
        len: usize,
        device: u32,
    ) -> CudaResult<u64> {
        if let Some(d) = self.device_range(addr, len.max(1)) {
            return Ok(d);
        }
        const PAGE: usize = 4096;
        let end = addr
            .checked_add(len.max(1))
            .ok_or(CudaError::INVALID_VALUE)?;
        let (start, end) = (addr & !(PAGE - 1), end.next_multiple_of(PAGE));
        // The pages of the range no host-mapped range touches yet, as runs.
        let mut gaps: Vec<(usize, usize)> = Vec::new();
        {
            let map = lock(&self.by_base);
            let mut page = start;
            while page < end {
                let touched = map
                    .range(..page + PAGE)
                    .next_back()
                    .is_some_and(|(_, a)| a.base + a.mapped.max(a.size).max(1) > page);
                if !touched {
                    match gaps.last_mut() {
                        Some((_, e)) if *e == page => *e += PAGE,
                        _ => gaps.push((page, page + PAGE)),
                    }
                }
                page += PAGE;
            }
        }
        for (s, e) in gaps {
            let reply = session.host_map(call(s, e - s, 0, device), false)?;
            lock(&self.by_base).insert(
                s,
                HostAllocation {
                    base: s,
                    size: e - s,
                    mapped: e - s,
                    window: e - s,
                    held: Held::Application,
                    flags: 0,
                    device,
                    dev_addr: reply.dev_addr,
                    buffer_id: 0,
                    kind: HostKind::GraphPinned,
                },
            );
        }
        if let Some(d) = self.device_range(addr, len.max(1)) {
            return Ok(d);
        }
        // Several mappings: one device range only if each is at its own guest address.
        let map = lock(&self.by_base);
        let identity = map
            .range(..end)
            .rev()
            .take_while(|(_, a)| a.base + a.size > start)
            .all(|(_, a)| a.dev_addr == a.base as u64);
        if identity {
            Ok(addr as u64)
        } else {
            Err(CudaError::INVALID_VALUE)
        }
    }

    /// `cudaHostUnregister` of the range registered at `ptr`.
    pub fn unregister(&self, session: &Session, ptr: usize) -> CudaResult<()> {
        let a = {
            let mut map = lock(&self.by_base);
            match map.get(&ptr) {
                Some(a) if a.kind == HostKind::Registered => map.remove(&ptr),
                _ => None,
            }
        }
        .ok_or(CudaError::HOST_MEMORY_NOT_REGISTERED)?;
        self.release(session, &a)
    }

    fn overlapping(&self, ptr: usize, size: usize) -> bool {
        let map = lock(&self.by_base);
        let end = ptr + size;
        map.range(..end)
            .next_back()
            .is_some_and(|(_, a)| a.base + a.size.max(1) > ptr)
    }

    /// The range containing `addr`, if any.
    pub fn find(&self, addr: usize) -> Option<HostAllocation> {
        let map = lock(&self.by_base);
        let (_, a) = map.range(..=addr).next_back()?;
        (addr - a.base < a.size).then_some(*a)
    }

    /// The guest pointer of device address `dev` inside a host-mapped range (the inverse of
    /// [`HostAllocations::device_range`]); `None` for any other address.
    pub fn host_address(&self, dev: u64) -> Option<usize> {
        lock(&self.by_base).values().find_map(|a| {
            let off = dev.checked_sub(a.dev_addr)?;
            (off < a.size as u64).then(|| a.base + usize_of(off))
        })
    }

    /// The device address of `addr..addr + len` if it lies inside one range.
    pub fn device_range(&self, addr: usize, len: usize) -> Option<u64> {
        let a = self.find(addr)?;
        let end = addr.checked_add(len)?;
        (end <= a.base + a.size).then(|| a.device_address(addr))
    }

    /// After `cudaDeviceReset` of `device`: the host dropped its mappings made there; release
    /// them here too.
    pub fn forget_device(&self, session: &Session, device: u32) {
        let gone: Vec<HostAllocation> = {
            let mut map = lock(&self.by_base);
            let keys: Vec<usize> = map
                .values()
                .filter(|a| a.device == device)
                .map(|a| a.base)
                .collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        for a in gone {
            let _ = self.release(session, &a);
        }
    }
}

/// Gives the addresses of a range back to whoever held them before (see [`Held`]).
fn release_range(base: usize, len: usize, held: Held) {
    match held {
        Held::Window => lock(&WINDOW).give(base, len),
        Held::ManagedWindow => lock(&MANAGED_WINDOW).give(base, len),
        Held::Own => {
            // SAFETY: the reservation this process made for the range (`reserve_fixed`) and
            // the pages mapped over it, used by nothing else.
            unsafe { libc::munmap(base as *mut libc::c_void, len) };
        }
        Held::Application => {}
    }
}

/// Reserves `at..at + len` (PROT_NONE) if nothing of this process lies there.
fn reserve_fixed(at: usize, len: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; a PROT_NONE reservation
    // touches no memory.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == at as *mut libc::c_void {
        return true;
    }
    if p != libc::MAP_FAILED {
        // A kernel that ignores MAP_FIXED_NOREPLACE put it elsewhere: not ours to keep.
        // SAFETY: the mapping just made, used by nothing.
        unsafe { libc::munmap(p, len) };
    }
    false
}

/// Has the host place `mapped` bytes of managed memory on `device` (offering window range
/// `hint`, `window` bytes, held for it), and takes the address it answers here: (address, who
/// holds it now). Addresses taken in this process are placed again, up to [`MANAGED_TRIES`]
/// times; the placements refused meanwhile are given back.
fn place_managed(
    session: &Session,
    mapped: usize,
    window: usize,
    hint: Option<usize>,
    device: u32,
) -> CudaResult<(usize, Held)> {
    let mut refused: Vec<u64> = Vec::new();
    let mut offer = hint;
    let result = loop {
        let reply = match session.submit(
            Call::new(Op::ManagedPlace, device).args(&[mapped as u64, offer.unwrap_or(0) as u64]),
        ) {
            Ok(r) => r,
            Err(e) => break Err(e),
        };
        let (at, size) = (usize_of(reply.rets[0]), usize_of(reply.rets[1]));
        if at == 0 || !(at as u64).is_multiple_of(MANAGED_ALIGN) || size != window {
            refused.push(reply.rets[0]);
            break Err(CudaError::UNKNOWN);
        }
        if Some(at) == offer {
            break Ok((at, Held::ManagedWindow));
        }
        // Inside one of this process's windows the address is free only if the window says so;
        // elsewhere if nothing of this process lies there.
        let in_host_window = lock(&WINDOW).holds(at, size);
        let in_managed_window = lock(&MANAGED_WINDOW).holds(at, size);
        let taken = if in_host_window {
            lock(&WINDOW).take_exact(at, size).then_some(Held::Window)
        } else if in_managed_window {
            let mut w = lock(&MANAGED_WINDOW);
            (w.reserved == Some(true) && w.take_exact(at, size)).then_some(Held::ManagedWindow)
        } else {
            reserve_fixed(at, size).then_some(Held::Own)
        };
        if let Some(held) = taken {
            break Ok((at, held));
        }
        refused.push(reply.rets[0]);
        if refused.len() >= MANAGED_TRIES {
            warn_once!(
                "cudaMallocManaged: the addresses the host's driver gives are taken in this \
                 process ({} tries)",
                MANAGED_TRIES
            );
            break Err(CudaError::MEMORY_ALLOCATION);
        }
        offer = None;
    };
    for at in refused.into_iter().filter(|&a| a != 0) {
        let _ = session.submit(Call::new(Op::ManagedUnplace, device).args(&[at]));
    }
    result
}

/// Maps `mapped` bytes at `base` into this process and has the host map them there with
/// `flags`; on failure `undo` gives the range back, told whether the module must forget the
/// pages (the host refusing the range is `cudaErrorMemoryAllocation`).
fn map_new(
    session: &Session,
    base: usize,
    mapped: usize,
    flags: u64,
    device: u32,
    undo: impl Fn(bool),
) -> CudaResult<HostMapCall> {
    if let Err(e) = session.map_memory(base, mapped) {
        undo(false);
        return Err(e);
    }
    session
        .host_map(call(base, mapped, flags, device), false)
        .map_err(|e| {
            undo(true);
            if e == CudaError::INVALID_VALUE {
                CudaError::MEMORY_ALLOCATION
            } else {
                e
            }
        })
}

fn call(addr: usize, len: usize, flags: u64, device: u32) -> HostMapCall {
    HostMapCall {
        addr: addr as u64,
        len: len as u64,
        flags,
        device,
        ..HostMapCall::default()
    }
}

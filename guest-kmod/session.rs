// SPDX-License-Identifier: GPL-2.0
//! /dev/qcuda: one open file is one session.
//!
//! The session id comes from a global counter when the file is opened and is stamped on every
//! request of that file, so a process can neither choose nor forge it. The one ioctl,
//! `IOCTL_CALL`, carries a request header and up to `MAX_BUFFERS` user buffers (qcuda-proto's
//! `wire::ioctl`); the module knows nothing about the ops beyond refusing kernel-only ones,
//! except `ProcessCheckpoint` and `GpuTrace` (`NAMES_PROCESS`), which name another process:
//! the module checks that the caller may act on it and stamps its session (process.rs).
//! Closing the file (also when the process is killed) sends `SessionClose` and waits for it,
//! so the host frees everything the session owned.
//!
//! Neighbours: guest-lib calls this from user space; driver.rs registers /dev/qcuda
//! ([`DeviceNode`]) for each device it binds; device.rs carries the requests.

use core::{mem::offset_of, ptr::NonNull};

use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex, new_spinlock,
    page::BorrowedPage,
    prelude::*,
    seq_file::SeqFile,
    seq_print,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex, SpinLock, UniqueArc,
    },
    time::{ClockSource, Instant, Monotonic},
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    device::{QcudaDevice, Wait},
    host_memory::{held_pages, HostRegion},
    process::{ProcessRef, SessionOwners},
    request::Request,
    wire::{
        ioctl::{
            HostMapCall, IoctlCall, HOST_MAP_CALL_SIZE, IOCTL_CALL, IOCTL_CALL_SIZE,
            IOCTL_HOST_MAP, IOCTL_HOST_UNMAP,
        },
        status, Direction, Op, RequestHeader, ResponseHeader, FLAG_ASYNC, MAX_RETS, NAMES_PROCESS,
    },
};

// The ioctl numbers of wire.rs are the kernel's own `_IOWR` encodings of the structures.
const _: () = {
    use kernel::ioctl::_IOWR;
    assert!(IOCTL_CALL == _IOWR::<IoctlCall>(b'Q' as u32, 1));
    assert!(IOCTL_HOST_MAP == _IOWR::<HostMapCall>(b'Q' as u32, 2));
    assert!(IOCTL_HOST_UNMAP == _IOWR::<HostMapCall>(b'Q' as u32, 3));
};

/// Session ids: never 0, never from user space, and unique for the VM's lifetime (see
/// [`seed_session_ids`]).
static NEXT_SESSION: Atomic<u64> = Atomic::new(1);

/// Starts the session counter at the monotonic clock in nanoseconds. Ids then stay unique across
/// module reloads too (a reload takes far longer than one nanosecond per open since), so a new
/// session can never be taken for one the host still holds from before a reload.
pub(crate) fn seed_session_ids() {
    let now = <Monotonic as ClockSource>::ktime_get();
    NEXT_SESSION.store(u64::try_from(now).unwrap_or(0).max(1), Relaxed);
}

/// How long closing a file waits for the host to confirm `SessionClose`.
const CLOSE_TIMEOUT_MS: i64 = 30_000;
/// How long `HostMap` and `HostUnmap` wait for the host. The module must learn whether the host
/// maps the pages before it may release them, so only a killed task stops waiting early; it then
/// keeps the pages until the session's close, which ends every mapping of the host.
const HOST_MAP_TIMEOUT_MS: i64 = 60_000;
/// Largest single mmap of /dev/qcuda, and largest range `IOCTL_HOST_MAP` pins.
const MAX_MMAP_LEN: usize = 64 << 30;
/// Requests a file keeps for its next waited calls: one per thread that calls at the same
/// time, up to this many; a thread that finds none allocates one.
const SPARE_REQUESTS: usize = 2;

/// /dev/qcuda of one device: the misc device and the device state its files use.
///
/// Teardown order is field drop order: `misc` first (deregistering /dev/qcuda waits for opens
/// in progress, so no open can reach `device` or `owners` afterwards), then `device`, `owners`.
#[pin_data]
pub(crate) struct DeviceNode {
    #[pin]
    misc: MiscDeviceRegistration<Session>,
    device: Arc<QcudaDevice>,
    /// Which process opened each session (for CUDA's process checkpoint).
    owners: Arc<SessionOwners>,
}

impl DeviceNode {
    /// Registers /dev/qcuda, whose files use `device`.
    pub(crate) fn register(device: Arc<QcudaDevice>) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            // Initialised before `misc` registers /dev/qcuda: open() reads them.
            device,
            owners: SessionOwners::new()?,
            misc <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"qcuda" }),
        })
    }
}

/// The calling process (thread group) id as the caller's pid namespace numbers it (what the
/// process and `ps` beside it see), stamped on its requests for the host's accounting
/// (`RequestHeader::pid`); 0 for a negative id, which a thread group never has.
///
/// Through the kernel's `task_tgid_nr_ns`: `Task::tgid()`, which reads the field of the
/// bindings' `task_struct`, read garbage on our 7.3 guest kernel (-1 where the C helper said 48).
fn caller_pid() -> u32 {
    u32::try_from(kernel::current!().tgid_nr_ns(None)).unwrap_or(0)
}

/// Nanoseconds since `t`.
fn ns_since(t: &Instant<Monotonic>) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// One open file of /dev/qcuda.
#[pin_data]
pub(crate) struct Session {
    id: u64,
    device: Arc<QcudaDevice>,
    /// The device's sessions and their processes, this one's among them until release.
    owners: Arc<SessionOwners>,
    /// Set once a request went out: only then does the host know the session.
    used: Atomic<bool>,
    /// Where this file's waited calls spent their time in the module, summed (fdinfo): the
    /// count of calls, then ns preparing the request (decoding, bounce copies, pinning),
    /// building its chain and adding it to the ring, waiting for the device, and finishing
    /// (copying out, unpinning, writing the response).
    phases: [Atomic<u64>; 5],
    /// Pages held for the host: mmaps of this file and pinned user ranges (host_memory.rs).
    /// Never held across anything that takes the mmap lock or waits for the device.
    #[pin]
    regions: Mutex<KVec<HostRegion>>,
    /// Empty requests of finished waited calls, with the memory of their buffers, for the next
    /// calls (request.rs, `Request::recycle`): a small call then allocates nothing here.
    #[pin]
    spares: SpinLock<[Option<Pin<UniqueArc<Request>>>; SPARE_REQUESTS]>,
}

#[vtable]
impl MiscDevice for Session {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let misc = core::ptr::from_ref(misc).cast_mut();
        // SAFETY: Every `MiscDeviceRegistration<Session>` is the `misc` field of a
        // `DeviceNode` (`DeviceNode::register` registers no other). misc_open() holds misc_mtx
        // during this call and deregistration takes it, so the `DeviceNode` is alive, and its
        // `device` was initialised before the registration.
        let node = unsafe { &*kernel::container_of!(misc, DeviceNode, misc) };
        let id = NEXT_SESSION.fetch_add(1, Relaxed);
        node.owners.opened(id)?;
        let session = KBox::try_pin_init(
            try_pin_init!(Session {
                id,
                device: node.device.clone(),
                owners: node.owners.clone(),
                used: Atomic::new(false),
                phases: [const { Atomic::new(0) }; 5],
                regions <- new_mutex!(KVec::new(), "qcuda_regions"),
                spares <- new_spinlock!([const { None }; SPARE_REQUESTS], "qcuda_spares"),
            }),
            GFP_KERNEL,
        );
        if session.is_err() {
            node.owners.closed(id);
        }
        session
    }

    fn release(session: Pin<KBox<Self>>, _file: &File) {
        session.owners.closed(session.id);
        let host_done = session.close();
        let regions = core::mem::take(&mut *session.regions.lock());
        for r in regions {
            if r.host_mapped && !host_done {
                r.leak();
            }
        }
    }

    fn ioctl(session: Pin<&Session>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            IOCTL_CALL => session.call(UserPtr::from_addr(arg)),
            IOCTL_HOST_MAP => session.host_map(UserPtr::from_addr(arg)),
            IOCTL_HOST_UNMAP => session.host_unmap(UserPtr::from_addr(arg)),
            _ => Err(ENOTTY),
        }
    }

    /// Backs the mapping with zeroed module pages in large physically contiguous chunks, kept
    /// until `IOCTL_HOST_UNMAP` or close (the VMA holds its own references). Not inherited by
    /// children, not expandable, not dumped.
    fn mmap(session: Pin<&Session>, _file: &File, vma: &VmaNew) -> Result {
        let (start, end) = (vma.start(), vma.end());
        // SAFETY: `vma` is the VMA being set up for this call; reading its offset is allowed.
        let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff };
        let len = end - start;
        if pgoff != 0 || len == 0 || len > MAX_MMAP_LEN {
            return Err(EINVAL);
        }
        vma.set_dontcopy();
        vma.set_dontexpand();
        vma.set_dontdump();
        let region = HostRegion::allocate(start, len)?;
        let map = vma.set_mixedmap();
        region.for_each_page(|addr, page| {
            let page = NonNull::new(page).ok_or(EINVAL)?;
            // SAFETY: `page` is held by `region`, which lives until after the insertion.
            let page = unsafe { BorrowedPage::from_raw(page) };
            map.vm_insert_page(addr, &page)
        })?;
        session.regions.lock().push(region, GFP_KERNEL)?;
        Ok(())
    }

    /// `/proc/<pid>/fdinfo/<fd>`: the session id, the device's in-flight table, this file's
    /// fire-and-forget requests in the ring, and the pages held for the host (this file's, and all files' together), for debugging and tests.
    fn show_fdinfo(session: Pin<&Session>, m: &SeqFile, _file: &File) {
        let s = session.device.stats();
        let (regions, pages) = {
            let r = session.regions.lock();
            (r.len(), r.iter().map(HostRegion::page_count).sum::<usize>())
        };
        seq_print!(
            m,
            "qcuda-session:\t{}\nqcuda-in-ring:\t{}\nqcuda-abandoned:\t{}\nqcuda-reapable:\t{}\nqcuda-free-slots:\t{}\nqcuda-posted:\t{}\nqcuda-host-regions:\t{}\nqcuda-host-pages:\t{}\nqcuda-host-pages-all:\t{}\nqcuda-waited-calls:\t{}\nqcuda-prepare-ns:\t{}\nqcuda-submit-ns:\t{}\nqcuda-wait-ns:\t{}\nqcuda-finish-ns:\t{}\n",
            session.id,
            s.in_ring,
            s.abandoned,
            s.reapable,
            s.free_slots,
            session.device.posted(session.id),
            regions,
            pages,
            held_pages(),
            session.phases[0].load(Relaxed),
            session.phases[1].load(Relaxed),
            session.phases[2].load(Relaxed),
            session.phases[3].load(Relaxed),
            session.phases[4].load(Relaxed),
        );
    }
}

impl Session {
    /// `IOCTL_CALL`: one request, its buffers, and the response written back.
    fn call(&self, user: UserPtr) -> Result<isize> {
        let started = Instant::<Monotonic>::now();
        self.device.reap();

        // Read the argument exactly once; everything below uses this copy.
        let mut raw = [0u8; IOCTL_CALL_SIZE];
        UserSlice::new(user, raw.len())
            .reader()
            .read_slice(&mut raw)?;
        // Validates flags, counts, directions (In before Out), lengths, reserved fields, the
        // op's shape, and refuses kernel-only ops.
        let call = IoctlCall::decode(&raw).map_err(|_| EINVAL)?;
        let bufs = call.bufs.get(..call.nbufs as usize).ok_or(EINVAL)?;
        let mut header: RequestHeader = call.header();
        header.session = self.id;
        header.pid = caller_pid();
        if NAMES_PROCESS.iter().any(|&op| op as u32 == header.op) {
            if let Err(code) = self.name_process(&mut header) {
                write_response(user, &ResponseHeader::with_status(code))?;
                return Ok(0);
            }
        }
        let fire_and_forget = header.flags & FLAG_ASYNC != 0;
        if fire_and_forget && header.counts().1 > 0 {
            // Nobody would copy the outputs back.
            return Err(EINVAL);
        }

        // A fire-and-forget request is freed by whoever reaps it, so it takes no spare.
        let mut req = if fire_and_forget {
            Request::empty()?
        } else {
            self.take_spare()?
        };
        let filled = req.as_mut().fill(&header, bufs).and_then(|()| {
            if req.segment_count() > self.device.max_segments() {
                return Err(E2BIG);
            }
            Ok(())
        });
        if let Err(e) = filled {
            self.keep_spare(req);
            return Err(e);
        }
        let req: Arc<Request> = req.into();
        self.used.store(true, Relaxed);
        let response = if fire_and_forget {
            self.device.post(&req)?;
            ResponseHeader::with_status(status::SUCCESS)
        } else {
            let prepared = ns_since(&started);
            let mut submit = 0;
            let response =
                self.device
                    .execute_timed(&req, Wait::for_mode(call.wait_mode()), &mut submit)?;
            let executed = ns_since(&started);
            req.copy_out()?;
            // Unpin before touching user memory again. The device has let go of the request
            // (the call was answered), so this is its only reference: kept for the next call.
            if let Some(spare) = Arc::into_unique_or_drop(req) {
                self.keep_spare(spare);
            }
            write_response(user, &response)?;
            let done = ns_since(&started);
            let wait = executed.saturating_sub(prepared).saturating_sub(submit);
            for (phase, ns) in
                self.phases
                    .iter()
                    .zip([1, prepared, submit, wait, done.saturating_sub(executed)])
            {
                phase.fetch_add(ns, Relaxed);
            }
            return Ok(0);
        };
        // Unpin before touching user memory again.
        drop(req);
        write_response(user, &response)?;
        Ok(0)
    }

    /// `ProcessCheckpoint` and `GpuTrace` (`NAMES_PROCESS`): resolves the pid the caller names
    /// (args[1]; for `GpuTrace` 0 names the caller) and stamps the target's
    /// session (args[3]; 0, which no session has, if the process has none) and its pid as the
    /// caller numbers it (args[4]). The CUDA status of a pid that names no process, or one the
    /// caller may not act on, is the error (the request then does not go out).
    fn name_process(&self, header: &mut RequestHeader) -> core::result::Result<(), u32> {
        if header.op == Op::GpuTrace as u32 && header.args[1] == 0 {
            // The caller names itself.
            header.args[3] = self.id;
            header.args[4] = u64::from(header.pid);
            return Ok(());
        }
        let vpid = i32::try_from(header.args[1]).map_err(|_| status::INVALID_VALUE)?;
        let (process, nr) = ProcessRef::named(vpid).map_err(|e| {
            if e == EPERM {
                status::NOT_PERMITTED
            } else {
                status::INVALID_VALUE
            }
        })?;
        header.args[3] = self.owners.session_of(&process).unwrap_or(0);
        header.args[4] = u64::try_from(nr).unwrap_or(0);
        Ok(())
    }

    /// An empty request: a kept one if there is one, else a new one.
    fn take_spare(&self) -> Result<Pin<UniqueArc<Request>>> {
        let kept = self.spares.lock().iter_mut().find_map(Option::take);
        match kept {
            Some(req) => Ok(req),
            None => Request::empty(),
        }
    }

    /// Empties `req` (unpinning its pages, which may sleep: not under the lock) and keeps it
    /// for a later call if there is room.
    fn keep_spare(&self, mut req: Pin<UniqueArc<Request>>) {
        req.as_mut().recycle();
        let mut spares = self.spares.lock();
        if let Some(free) = spares.iter_mut().find(|s| s.is_none()) {
            *free = Some(req);
            return;
        }
        drop(spares);
        // No room: freed here, unlocked.
        drop(req);
    }

    /// `IOCTL_HOST_MAP`: makes a user range reachable by the GPU (see wire.rs). The result of
    /// the host is the call's `status`; errno values are for the call itself.
    fn host_map(&self, user: UserPtr) -> Result<isize> {
        let mut call = read_host_map_call(user)?;
        let addr = usize::try_from(call.addr).map_err(|_| EFAULT)?;
        let len = usize::try_from(call.len).map_err(|_| EINVAL)?;
        if len == 0 {
            return Err(EINVAL);
        }
        // An mmap of this file, named exactly, uses its module pages; anything else is pinned.
        let own = {
            let mut regions = self.regions.lock();
            let page_len = len
                .checked_next_multiple_of(kernel::page::PAGE_SIZE)
                .ok_or(EINVAL)?;
            match regions
                .iter()
                .position(|r| r.addr == addr && r.len == page_len)
            {
                Some(i) if regions[i].host_mapped => {
                    drop(regions);
                    call.status = status::HOST_MEMORY_ALREADY_REGISTERED;
                    return write_host_map_call(user, &call);
                }
                Some(i) => regions.remove(i).ok(),
                None => None,
            }
        };
        let mut region = match own {
            Some(r) => r,
            None if len > MAX_MMAP_LEN => return Err(EINVAL),
            None => HostRegion::pin(addr, len)?,
        };
        let table = region.run_table();
        let result = table.and_then(|pieces| {
            let mut header = RequestHeader::new(Op::HostMap);
            header.session = self.id;
            header.pid = caller_pid();
            header.device = call.device;
            header.args[0] = region.addr as u64;
            header.args[1] = region.len as u64;
            header.args[2] = call.flags;
            let total: usize = pieces.iter().map(|p| p.len()).sum();
            header
                .push_buffer(Direction::In, total as u64)
                .map_err(|_| EINVAL)?;
            let req = Request::with_kernel_input(&header, pieces)?;
            self.used.store(true, Relaxed);
            // Killable: the worker serves the session's requests in order, and one before this
            // (a synchronisation) may wait for a host function that a killed process will
            // never run.
            self.device.execute(
                &req,
                Wait::Killable {
                    timeout_ms: HOST_MAP_TIMEOUT_MS,
                },
            )
        });
        let mut failed = None;
        match result {
            Ok(r) => {
                call.status = r.status;
                if r.status == status::SUCCESS {
                    region.host_mapped = true;
                    region.dev_addr = r.rets[0];
                    // The device address of the first byte the caller named.
                    call.dev_addr = r.rets[0] + (addr - region.addr) as u64;
                }
            }
            Err(e) => {
                // Without an answer (timed out, or the task was killed) the host may or may not
                // map the pages: hold them until close, which the host does confirm.
                region.host_mapped = e == ETIMEDOUT || e == EINTR;
                failed = Some(e);
            }
        }
        // Held on: what the host maps, and mmaps of this file (still plain memory). Pinned
        // user pages the host does not map are released here.
        if region.host_mapped || region.is_module_memory() {
            self.regions.lock().push(region, GFP_KERNEL)?;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        write_host_map_call(user, &call)
    }

    /// `IOCTL_HOST_UNMAP`: the host drops its mapping of the range mapped at `addr`, then the
    /// pages are released (an mmap of this file stays usable until munmap).
    fn host_unmap(&self, user: UserPtr) -> Result<isize> {
        let mut call = read_host_map_call(user)?;
        let addr = usize::try_from(call.addr).map_err(|_| EFAULT)?;
        let region = {
            let mut regions = self.regions.lock();
            let found = regions.iter().position(|r| r.user_addr == addr);
            found.and_then(|i| regions.remove(i).ok())
        };
        let Some(region) = region else {
            call.status = status::HOST_MEMORY_NOT_REGISTERED;
            return write_host_map_call(user, &call);
        };
        call.status = status::SUCCESS;
        if region.host_mapped {
            let mut header = RequestHeader::new(Op::HostUnmap);
            header.session = self.id;
            header.pid = caller_pid();
            header.device = call.device;
            header.args[0] = region.addr as u64;
            // Killable: the host waits for the session's queued work first, and a killed
            // process cannot run the host functions that work may wait for. The pages then
            // stay held (below) until the session's close, which ends the host's mapping.
            let outcome = Request::new(&header, &[]).and_then(|req| {
                self.device.execute(
                    &req,
                    Wait::Killable {
                        timeout_ms: HOST_MAP_TIMEOUT_MS,
                    },
                )
            });
            match outcome {
                // Whatever it says, the host maps nothing there any more.
                Ok(r) => {
                    if r.status != status::HOST_MEMORY_NOT_REGISTERED {
                        call.status = r.status;
                    }
                }
                Err(e) => {
                    // No answer: the host may still map the pages. Keep them until close.
                    self.regions.lock().push(region, GFP_KERNEL)?;
                    return Err(e);
                }
            }
        }
        drop(region);
        write_host_map_call(user, &call)
    }

    /// Tells the host that the session is gone and waits for it (bounded). Returns whether the
    /// host confirmed (or never knew the session), so that what it mapped may be released.
    fn close(&self) -> bool {
        self.device.reap();
        if !self.used.load(Relaxed) {
            return true;
        }
        let mut header = RequestHeader::new(Op::SessionClose);
        header.session = self.id;
        let result = Request::new(&header, &[]).and_then(|req| {
            self.device.execute(
                &req,
                Wait::Uninterruptible {
                    timeout_ms: CLOSE_TIMEOUT_MS,
                },
            )
        });
        match result {
            Ok(r) if r.status == status::SUCCESS => true,
            Ok(r) => {
                pr_warn!("session {} close: status {}\n", self.id, r.status);
                true
            }
            // The device is gone; the host drops the session's state when the next driver
            // instance binds (DriverReset), not before: what it mapped stays held.
            Err(e) if e == ENODEV => false,
            Err(e) => {
                pr_warn!("session {} close failed: {:?}\n", self.id, e);
                false
            }
        }
    }
}

/// Writes the output fields of the user's `IoctlCall`: `status`, `resp_flags` and `rets`.
/// `IoctlCall` is `#[repr(C)]` and its encoding is its memory layout, so the field offsets are
/// the ABI; the encoding comes from wire.rs all the same.
fn write_response(user: UserPtr, r: &ResponseHeader) -> Result {
    const STATUS_AT: usize = offset_of!(IoctlCall, status);
    const FLAGS_AT: usize = offset_of!(IoctlCall, resp_flags);
    const RETS_AT: usize = offset_of!(IoctlCall, rets);
    const RETS_END: usize = RETS_AT + 8 * MAX_RETS;
    const _: () = assert!(FLAGS_AT == STATUS_AT + 4 && RETS_END <= IOCTL_CALL_SIZE);

    let encoded = IoctlCall {
        status: r.status,
        resp_flags: r.flags,
        rets: r.rets,
        ..IoctlCall::default()
    }
    .encode();
    for range in [STATUS_AT..FLAGS_AT + 4, RETS_AT..RETS_END] {
        let bytes = encoded.get(range.clone()).ok_or(EINVAL)?;
        UserSlice::new(user.wrapping_byte_add(range.start), bytes.len())
            .writer()
            .write_slice(bytes)?;
    }
    Ok(())
}

fn read_host_map_call(user: UserPtr) -> Result<HostMapCall> {
    let mut raw = [0u8; HOST_MAP_CALL_SIZE];
    UserSlice::new(user, raw.len())
        .reader()
        .read_slice(&mut raw)?;
    HostMapCall::decode(&raw).map_err(|_| EINVAL)
}

/// Writes the output fields (`status`, `dev_addr`) of the user's `HostMapCall`.
fn write_host_map_call(user: UserPtr, c: &HostMapCall) -> Result<isize> {
    const STATUS_AT: usize = offset_of!(HostMapCall, status);
    const END: usize = offset_of!(HostMapCall, dev_addr) + 8;
    const _: () = assert!(END == HOST_MAP_CALL_SIZE);
    let encoded = c.encode();
    let bytes = encoded.get(STATUS_AT..END).ok_or(EINVAL)?;
    UserSlice::new(user.wrapping_byte_add(STATUS_AT), bytes.len())
        .writer()
        .write_slice(bytes)?;
    Ok(0)
}

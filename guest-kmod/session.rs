// SPDX-License-Identifier: GPL-2.0
//! /dev/qcuda: one open file is one session.
//!
//! The session id comes from a global counter when the file is opened and is stamped on every
//! request of that file, so a process can neither choose nor forge it. The one ioctl,
//! `IOCTL_CALL`, carries a request header and up to `MAX_BUFFERS` user buffers (qcuda-proto's
//! `wire::ioctl`); the module knows nothing about the ops beyond refusing kernel-only ones.
//! Closing the file (also when the process is killed) sends `SessionClose` and waits for it,
//! so the host frees everything the session owned.
//!
//! Neighbours: guest-lib calls this from user space; device.rs carries the requests.

use core::mem::offset_of;

use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    prelude::*,
    seq_file::SeqFile,
    seq_print,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc,
    },
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    device::{DeviceNode, QcudaDevice, Wait},
    request::Request,
    wire::{
        ioctl::{IoctlCall, IOCTL_CALL, IOCTL_CALL_SIZE},
        status, Op, RequestHeader, ResponseHeader, FLAG_ASYNC, MAX_RETS,
    },
};

/// Session ids: never 0, never from user space, and unique for the VM's lifetime (see
/// [`seed_session_ids`]).
static NEXT_SESSION: Atomic<u64> = Atomic::new(1);

/// Starts the session counter at the monotonic clock in nanoseconds. Ids then stay unique across
/// module reloads too (a reload takes far longer than one nanosecond per open since), so a new
/// session can never be taken for one the host still holds from before a reload.
pub(crate) fn seed_session_ids() {
    // SAFETY: `ktime_get` has no preconditions.
    let now = unsafe { kernel::bindings::ktime_get() };
    NEXT_SESSION.store(u64::try_from(now).unwrap_or(0).max(1), Relaxed);
}

/// How long closing a file waits for the host to confirm `SessionClose`.
const CLOSE_TIMEOUT_MS: i64 = 30_000;

/// One open file of /dev/qcuda.
pub(crate) struct Session {
    id: u64,
    device: Arc<QcudaDevice>,
    /// Set once a request went out: only then does the host know the session.
    used: Atomic<bool>,
}

#[vtable]
impl MiscDevice for Session {
    type Ptr = KBox<Self>;

    fn open(_file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        let misc = core::ptr::from_ref(misc).cast_mut();
        // SAFETY: Every `MiscDeviceRegistration<Session>` is the `misc` field of a
        // `DeviceNode` (device.rs registers it nowhere else). misc_open() holds misc_mtx
        // during this call and deregistration takes it, so the `DeviceNode` is alive, and
        // its `device` was initialised before the registration.
        let node = unsafe { &*kernel::container_of!(misc, DeviceNode, misc) };
        Ok(KBox::new(
            Session {
                id: NEXT_SESSION.fetch_add(1, Relaxed),
                device: node.device.clone(),
                used: Atomic::new(false),
            },
            GFP_KERNEL,
        )?)
    }

    fn release(session: KBox<Self>, _file: &File) {
        session.close();
    }

    fn ioctl(session: &Session, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            IOCTL_CALL => session.call(UserPtr::from_addr(arg)),
            _ => Err(ENOTTY),
        }
    }

    /// `/proc/<pid>/fdinfo/<fd>`: the session id and the device's in-flight table, for
    /// debugging and tests.
    fn show_fdinfo(session: &Session, m: &SeqFile, _file: &File) {
        let s = session.device.stats();
        seq_print!(
            m,
            "qcuda-session:\t{}\nqcuda-in-ring:\t{}\nqcuda-abandoned:\t{}\nqcuda-reapable:\t{}\nqcuda-free-slots:\t{}\n",
            session.id,
            s.in_ring,
            s.abandoned,
            s.reapable,
            s.free_slots
        );
    }
}

impl Session {
    /// `IOCTL_CALL`: one request, its buffers, and the response written back.
    fn call(&self, user: UserPtr) -> Result<isize> {
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
        let fire_and_forget = header.flags & FLAG_ASYNC != 0;
        if fire_and_forget && header.counts().1 > 0 {
            // Nobody would copy the outputs back.
            return Err(EINVAL);
        }

        let req = Request::new(&header, bufs)?;
        if req.segment_count() > self.device.max_segments() {
            return Err(E2BIG);
        }
        self.used.store(true, Relaxed);
        let response = if fire_and_forget {
            self.device.post(&req)?;
            ResponseHeader::with_status(status::SUCCESS)
        } else {
            let response = self.device.execute(&req, Wait::Interruptible)?;
            req.copy_out()?;
            response
        };
        // Unpin before touching user memory again.
        drop(req);
        write_response(user, &response)?;
        Ok(0)
    }

    /// Tells the host that the session is gone and waits for it (bounded).
    fn close(&self) {
        self.device.reap();
        if !self.used.load(Relaxed) {
            return;
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
            Ok(r) if r.status == status::SUCCESS => {}
            Ok(r) => pr_warn!("session {} close: status {}\n", self.id, r.status),
            // The device is gone, and with it the host's state.
            Err(e) if e == ENODEV => {}
            Err(e) => pr_warn!("session {} close failed: {:?}\n", self.id, e),
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

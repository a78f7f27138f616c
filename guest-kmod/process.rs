// SPDX-License-Identifier: GPL-2.0
//! Which guest process opened each session, so that one process can name another by pid for
//! CUDA's process checkpoint (`cuCheckpointProcessLock` ... `Unlock`, qcuda-proto's
//! `Op::ProcessCheckpoint`).
//!
//! The module is the only party that knows both sides: the caller's credentials and the
//! processes behind the sessions. It resolves the pid the caller names (in the caller's pid
//! namespace, a thread id naming its process), checks that the caller may act on that process
//! (the same user, or root: `CAP_SYS_PTRACE`, as for other ways of reaching into another
//! process), and stamps the target's session on the request. The host then only ever acts on
//! a session of this VM. A process is held by its `struct pid`, not its number, so a number
//! reused after an exit never names the wrong process.
//!
//! Neighbours: session.rs records each open here and stamps `ProcessCheckpoint`; glue.c does
//! the lookup and the credential check (static inlines and RCU-protected fields).

use core::{ffi::c_int, ffi::c_void, ptr::NonNull};

use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
};

extern "C" {
    // glue.c
    fn qcuda_glue_current_process() -> *mut c_void;
    fn qcuda_glue_process_of(vpid: c_int, process: *mut *mut c_void, nr: *mut c_int) -> c_int;
    fn qcuda_glue_put_process(process: *mut c_void);
}

/// A guest process (thread group), held.
///
/// # Invariants
/// `self.0` is a `struct pid` of a thread group on which this value holds one reference.
pub(crate) struct ProcessRef(NonNull<c_void>);

// SAFETY: a `struct pid` is reference-counted and its identity never changes; the reference
// may be dropped from any thread.
unsafe impl Send for ProcessRef {}
// SAFETY: shared references only compare addresses.
unsafe impl Sync for ProcessRef {}

impl ProcessRef {
    /// The calling process.
    pub(crate) fn current() -> Result<Self> {
        // SAFETY: no preconditions; returns a new reference (never null for a live task).
        let p = unsafe { qcuda_glue_current_process() };
        NonNull::new(p).map(Self).ok_or(ESRCH)
    }

    /// The process of thread `vpid` (the caller's pid namespace) if the caller may act on it,
    /// with the process id as the caller numbers it. ESRCH: no such thread; EPERM: another
    /// user's process and the caller is not root.
    pub(crate) fn named(vpid: i32) -> Result<(Self, i32)> {
        if vpid <= 0 {
            return Err(ESRCH);
        }
        let mut p = core::ptr::null_mut();
        let mut nr = 0;
        // SAFETY: both out-pointers are valid for writes; on success `p` holds a reference.
        let rc = unsafe { qcuda_glue_process_of(vpid, &mut p, &mut nr) };
        if rc != 0 {
            return Err(Error::from_errno(rc));
        }
        let p = NonNull::new(p).ok_or(ESRCH)?;
        Ok((Self(p), nr))
    }

    fn same(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Drop for ProcessRef {
    fn drop(&mut self) {
        // SAFETY: by the type invariant we hold one reference, given back once.
        unsafe { qcuda_glue_put_process(self.0.as_ptr()) };
    }
}

/// The sessions of one device with the process that opened each.
#[pin_data]
pub(crate) struct SessionOwners {
    #[pin]
    list: Mutex<KVec<(u64, ProcessRef)>>,
}

impl SessionOwners {
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                list <- new_mutex!(KVec::new(), "qcuda_owners"),
            }),
            GFP_KERNEL,
        )
    }

    /// Records that the calling process opened session `id`.
    pub(crate) fn opened(&self, id: u64) -> Result {
        let me = ProcessRef::current()?;
        self.list.lock().push((id, me), GFP_KERNEL)?;
        Ok(())
    }

    /// Forgets session `id` (its file is closed).
    pub(crate) fn closed(&self, id: u64) {
        let gone = {
            let mut list = self.list.lock();
            list.iter()
                .position(|(s, _)| *s == id)
                .and_then(|i| list.remove(i).ok())
        };
        // The reference is given back outside the lock.
        drop(gone);
    }

    /// The session `process` opened first, if it has one on this device.
    pub(crate) fn session_of(&self, process: &ProcessRef) -> Option<u64> {
        self.list
            .lock()
            .iter()
            .find(|(_, p)| p.same(process))
            .map(|(s, _)| *s)
    }
}

//! Contexts of closed sessions that cannot be destroyed yet.
//!
//! Measured with driver 580 on an H200: `cuCtxDestroy` waits until no kernel of the process is
//! running, in any context, and while it waits other threads' driver calls (creating a context,
//! loading a module) wait with it. A guest process killed during an endless kernel would so
//! hang its own close forever, and with it every other session's close and every new session.
//!
//! So a session whose work is still running when it closes (after a bounded wait) is not
//! destroyed but buried here, and while anything lies here, closing sessions free their memory
//! with `cuMemFree` (which does not wait) and are buried too instead of calling `cuCtxDestroy`.
//! A reaper thread polls the buried contexts and destroys them all once none has work left.
//! An endless kernel keeps its context (and whatever the guest left in it) until the daemon
//! restarts: in one process nothing can stop a running kernel. [`Graveyard::len`] exposes the
//! count so the daemon can tell.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    thread,
    time::Duration,
};

use tracing::{debug, info, warn};

use super::driver::{CuError, DriverApi, Raw, NULL_STREAM};

/// A buried context and the streams to poll before destroying it.
#[derive(Debug, Clone)]
pub(crate) struct Grave {
    /// The context.
    pub(crate) ctx: Raw,
    /// Its streams besides the legacy stream.
    pub(crate) streams: Vec<Raw>,
}

#[derive(Debug, Default)]
struct State {
    graves: Vec<Grave>,
    reaper: bool,
}

/// The buried contexts of one host.
#[derive(Debug, Default)]
pub(crate) struct Graveyard {
    state: Mutex<State>,
}

/// True if the legacy stream or one of `streams` of the current context has work pending.
pub(crate) fn has_pending_work(drv: &dyn DriverApi, streams: &[Raw]) -> bool {
    std::iter::once(NULL_STREAM)
        .chain(streams.iter().copied())
        .any(|s| drv.stream_query(s) == Err(CuError::NOT_READY))
}

impl Graveyard {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is one statement, so the state is consistent even after a panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Contexts buried and not yet destroyed.
    pub(crate) fn len(&self) -> usize {
        self.state().graves.len()
    }

    /// True if no context waits here.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Buries `grave` and makes sure a reaper polls it every `interval`.
    pub(crate) fn bury(
        self: &Arc<Self>,
        drv: &Arc<dyn DriverApi>,
        grave: Grave,
        interval: Duration,
    ) {
        let mut st = self.state();
        st.graves.push(grave);
        if st.reaper {
            return;
        }
        let (yard, drv) = (Arc::clone(self), Arc::clone(drv));
        let spawned = thread::Builder::new()
            .name("qcuda-reaper".into())
            .spawn(move || yard.reap(drv.as_ref(), interval));
        match spawned {
            Ok(_) => st.reaper = true,
            Err(e) => warn!(error = %e, "cannot start the context reaper; buried contexts stay"),
        }
    }

    /// The reaper: waits until no buried context has work, then destroys them all. Returns
    /// when the graveyard is empty.
    fn reap(&self, drv: &dyn DriverApi, interval: Duration) {
        loop {
            thread::sleep(interval);
            let graves = {
                let mut st = self.state();
                if st.graves.is_empty() {
                    st.reaper = false;
                    return;
                }
                st.graves.clone()
            };
            // A context that cannot be bound any more has nothing left to wait for.
            let busy = graves
                .iter()
                .any(|g| drv.ctx_set_current(g.ctx).is_ok() && has_pending_work(drv, &g.streams));
            if busy {
                continue;
            }
            // The buried contexts stay listed while they are destroyed, so that closing
            // sessions keep burying rather than calling cuCtxDestroy next to us.
            for g in &graves {
                match drv.ctx_destroy(g.ctx) {
                    Ok(()) => debug!(ctx = g.ctx, "buried context destroyed"),
                    Err(e) => warn!(error = ?e, "cuCtxDestroy of a buried context failed"),
                }
            }
            self.state()
                .graves
                .retain(|g| !graves.iter().any(|d| d.ctx == g.ctx));
            info!(count = graves.len(), "deferred contexts destroyed");
        }
    }
}

//! `DriverReset`: a new guest driver instance ends every session an old one left behind.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
};

use qcuda_proto::{status, ResponseHeader};
use tracing::{info, warn};

use super::{
    limits::DRIVER_RESET_WAIT,
    locking::lock,
    shared::{end_sessions, Job, Shared},
    table::SessionTable,
};

impl SessionTable {
    /// `DriverReset`: ends every session in the table (they belong to a driver instance that is
    /// gone) exactly as a disconnect does, and answers with their number once they have ended,
    /// from a thread of its own. Sessions that start meanwhile are new ones and stay.
    pub(super) fn driver_reset(&self, job: Job) {
        let stale = self.take_all();
        let count = stale.len();
        if count > 0 {
            info!(
                vm = %self.shared.label,
                "driver reset: a new guest driver instance; closing {count} stale session(s)"
            );
        }
        let ended: Vec<Arc<AtomicBool>> = stale.iter().map(|t| t.ended.clone()).collect();
        end_sessions(stale, "guest driver reset");
        let reply = DriverResetReply {
            shared: self.shared.clone(),
            job,
            ended,
        };
        if count == 0 {
            reply.finish();
            return;
        }
        // If the thread cannot start, the closure (and the reply in it) comes back here.
        let slot = Arc::new(Mutex::new(Some(reply)));
        let theirs = slot.clone();
        let spawned = thread::Builder::new()
            .name("qcuda-reset".into())
            .spawn(move || {
                if let Some(r) = lock(&theirs).take() {
                    r.finish();
                }
            });
        if let Err(e) = spawned {
            warn!(
                vm = %self.shared.label,
                "driver reset: cannot start a thread to wait for the sessions ({e}); answering now"
            );
            if let Some(r) = lock(&slot).take() {
                r.answer(count, self.open_count());
            }
        }
    }
}

/// The answer to a `DriverReset`, once the sessions it ended are gone.
struct DriverResetReply {
    shared: Arc<Shared>,
    job: Job,
    ended: Vec<Arc<AtomicBool>>,
}

impl DriverResetReply {
    /// Waits (bounded) for the ended sessions, then answers.
    fn finish(self) {
        let all = self.shared.wait_for(DRIVER_RESET_WAIT, |_| {
            self.ended.iter().all(|e| e.load(Ordering::Acquire))
        });
        let count = self.ended.len();
        let open = self.shared.counters().open;
        if !all {
            let busy = self
                .ended
                .iter()
                .filter(|e| !e.load(Ordering::Acquire))
                .count();
            warn!(
                vm = %self.shared.label,
                "driver reset: {busy} of {count} stale session(s) still closing after \
                 {DRIVER_RESET_WAIT:?}; they close in the background"
            );
        }
        self.answer(count, open);
    }

    fn answer(self, count: usize, open: usize) {
        info!(
            vm = %self.shared.label,
            "driver reset: closed {count} stale session(s); sessions open: {open}"
        );
        let mut resp = ResponseHeader::with_status(status::SUCCESS);
        resp.rets[0] = count as u64;
        self.job.finish(&resp);
    }
}

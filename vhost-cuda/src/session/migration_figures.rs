//! What a VM's last migration took here, phase by phase: the figures an operator plans with.
//!
//! `vhu_cuda.rs` times each phase of the stop (on the source: the sessions quiesced at the
//! ring's last stop; then either the device memory handed over to a destination on the same
//! host, or the sessions saved with their device memory streamed into their files; the state
//! sent into QEMU's pipe; on the destination: the handover claimed, if any; the state
//! received; the sessions restored) and records it in the VM's
//! [`MigrationLog`], which logs it as it comes (bytes, seconds, GiB/s) and which the stats
//! socket reports (`vhost-cuda --stats`, `stats.rs`). The log belongs to the VM's socket, not
//! to one connection, so the source's figures outlive the QEMU that migrated away.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tracing::info;

/// One phase of a migration's stop.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// Its name: `precopy` (while the VM runs, on both ends), then the stop's: `quiesce`,
    /// `handover`, `save`, `send`, `receive`, `restore`.
    pub name: &'static str,
    /// Bytes it moved (for `handover`: the device memory handed over, which was not copied).
    pub bytes: u64,
    /// Pieces of device memory handed over (`handover` only; 0 elsewhere).
    pub pieces: u64,
    /// Rounds it took (`precopy`, device memory pre-copied while the VM ran, only; 0
    /// elsewhere).
    pub rounds: u64,
    /// Seconds it took.
    pub secs: f64,
}

impl Phase {
    /// GiB per second (0 for a phase of no time).
    pub fn gib_per_s(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "a rate, for people")]
        let gib = self.bytes as f64 / f64::from(1u32 << 30);
        if self.secs > 0.0 {
            gib / self.secs
        } else {
            0.0
        }
    }
}

/// The phases of a VM's last migration here, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigrationFigures {
    /// `source` or `destination` (empty: none yet).
    pub role: &'static str,
    /// Its phases so far.
    pub phases: Vec<Phase>,
}

/// A VM's [`MigrationFigures`], shared by its connections' backends and the stats socket.
#[derive(Debug, Clone, Default)]
pub struct MigrationLog(Arc<Mutex<MigrationFigures>>);

impl MigrationLog {
    /// A new migration as `role` begins: the last one's figures are dropped.
    pub fn begin(&self, role: &'static str) {
        *self.lock() = MigrationFigures {
            role,
            phases: Vec::new(),
        };
    }

    /// Records phase `name` of VM `vm`: `bytes` moved since `started`; logs it.
    pub fn record(&self, vm: &str, name: &'static str, bytes: u64, started: Instant) {
        self.record_took(vm, name, bytes, started.elapsed());
    }

    /// [`record`](Self::record) with the time it took.
    pub fn record_took(&self, vm: &str, name: &'static str, bytes: u64, took: Duration) {
        self.record_pieces(vm, name, bytes, 0, took);
    }

    /// [`record_took`](Self::record_took) of a phase that handed `pieces` pieces over.
    pub fn record_pieces(
        &self,
        vm: &str,
        name: &'static str,
        bytes: u64,
        pieces: u64,
        took: Duration,
    ) {
        let phase = Phase {
            name,
            bytes,
            pieces,
            rounds: 0,
            secs: took.as_secs_f64(),
        };
        info!(
            vm,
            phase = name,
            bytes,
            pieces,
            secs = format_args!("{:.3}", phase.secs),
            gib_per_s = format_args!("{:.2}", phase.gib_per_s()),
            "migration: phase done"
        );
        let mut f = self.lock();
        // The same phase again (a second save without a migration between) replaces the last.
        f.phases.retain(|p| p.name != name);
        f.phases.push(phase);
    }

    /// Adds one pre-copy round of VM `vm` to phase `precopy`: `bytes` of device memory
    /// moved in `took`, `pending` still to go (logged, not kept).
    pub fn record_round(&self, vm: &str, bytes: u64, pending: u64, took: Duration) {
        let mut f = self.lock();
        let at = match f.phases.iter().position(|p| p.name == "precopy") {
            Some(i) => i,
            None => {
                f.phases.push(Phase {
                    name: "precopy",
                    bytes: 0,
                    pieces: 0,
                    rounds: 0,
                    secs: 0.0,
                });
                f.phases.len() - 1
            }
        };
        let p = &mut f.phases[at];
        p.bytes = p.bytes.saturating_add(bytes);
        p.rounds += 1;
        p.secs += took.as_secs_f64();
        info!(
            vm,
            round = p.rounds,
            bytes,
            pending,
            secs = format_args!("{:.3}", took.as_secs_f64()),
            total_bytes = p.bytes,
            "migration: pre-copy round"
        );
    }

    /// The figures now.
    pub fn snapshot(&self) -> MigrationFigures {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MigrationFigures> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_kept_in_order_and_a_new_migration_starts_afresh() {
        let log = MigrationLog::default();
        log.begin("source");
        log.record_took("vm", "save", 1 << 30, Duration::from_millis(500));
        log.record_took("vm", "send", 1 << 30, Duration::from_millis(250));
        let f = log.snapshot();
        assert_eq!(f.role, "source");
        assert_eq!(
            f.phases.iter().map(|p| p.name).collect::<Vec<_>>(),
            ["save", "send"]
        );
        assert!((f.phases[0].gib_per_s() - 2.0).abs() < 1e-9);
        log.record_pieces("vm", "handover", 4 << 30, 3, Duration::from_millis(20));
        assert_eq!(log.snapshot().phases[2].pieces, 3);
        log.record_took("vm", "save", 5, Duration::ZERO);
        assert_eq!(log.snapshot().phases[2].bytes, 5);
        assert_eq!(log.snapshot().phases[2].gib_per_s(), 0.0);
        log.begin("destination");
        assert!(log.snapshot().phases.is_empty());
    }
}

//! Locking that goes on after a holder panicked: every lock of the session table's state is
//! taken through [`lock`], since each update is one statement and stays consistent.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, whether or not a holder panicked.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

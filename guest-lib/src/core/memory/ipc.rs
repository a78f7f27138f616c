//! The legacy IPC memory handles this process opened (`cudaIpcOpenMemHandle`), by the address
//! given to the program: what `cudaIpcCloseMemHandle` and a device's reset need to know
//! (runtime/ipc.rs does the opening and closing).

use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard, PoisonError},
};

/// Address given to the program -> device.
static OPENED: Mutex<BTreeMap<u64, u32>> = Mutex::new(BTreeMap::new());

/// The opened handles, locked.
pub fn opened() -> MutexGuard<'static, BTreeMap<u64, u32>> {
    OPENED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Forgets what was opened on `device` (its reset unmapped it on the host).
pub fn forget_device(device: u32) {
    opened().retain(|_, d| *d != device);
}

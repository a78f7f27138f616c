//! `QCUDA_DRIVER_TRACE=1`: one line on stderr per driver-face call with its result, for finding
//! what a library (cuBLAS, cuFFT, a framework) asks of the driver and where it stops. Off by
//! default; reading the switch once costs one relaxed load per call afterwards.

use std::sync::{
    atomic::{AtomicU8, Ordering},
    Mutex,
};

/// 0: not read yet, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static OUT: Mutex<()> = Mutex::new(());

/// Whether tracing is on.
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os("QCUDA_DRIVER_TRACE").is_some_and(|v| v == "1");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
}

/// One traced event.
pub fn log(what: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _guard = OUT.lock();
    let _ = writeln!(std::io::stderr().lock(), "qcuda-trace: {what}");
}

/// A call and its result.
pub fn call(name: &str, code: u32) {
    if enabled() {
        match super::status::error_name(code) {
            Some(n) => log(format_args!("{name} -> {}", n.to_string_lossy())),
            None => log(format_args!("{name} -> {code}")),
        }
    }
}

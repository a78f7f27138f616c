//! The library's only output: one-line `qcuda: ...` warnings on stderr, for things the
//! application cannot learn from a status code alone (an API qcuda does not implement yet, a
//! /dev/qcuda that exists but cannot be opened, a transport failure).
//!
//! Writes never panic: a closed or broken stderr just loses the message.

use std::{
    fmt,
    io::Write,
    sync::atomic::{AtomicBool, Ordering},
};

/// Prints `qcuda: <message>` on stderr.
pub fn warn(message: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "qcuda: {message}");
}

/// Prints the warning only the first time `once` is passed in.
pub fn warn_first(once: &AtomicBool, message: fmt::Arguments<'_>) {
    if !once.swap(true, Ordering::Relaxed) {
        warn(message);
    }
}

/// `warn_once!("...", args)`: a warning printed once per call site.
macro_rules! warn_once {
    ($($arg:tt)*) => {{
        static ONCE: ::std::sync::atomic::AtomicBool = ::std::sync::atomic::AtomicBool::new(false);
        $crate::core::warnings::warn_first(&ONCE, format_args!($($arg)*));
    }};
}
pub(crate) use warn_once;

/// `QCUDA_TRACE_ERRORS=1`: one `qcuda-trace: NAME failed: CODE` line per failing export of
/// either face (the runtime's `cudaError_t`, the driver's `CUresult`), for finding which call
/// a library such as cuBLAS turned into its own status. "Not ready" answers (600 in both
/// numberings, what queries and polls return) are left out. Off by default: 0 unread, 1 off,
/// 2 on.
static TRACE_ERRORS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether failures are traced.
fn trace_errors() -> bool {
    match TRACE_ERRORS.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os("QCUDA_TRACE_ERRORS").is_some_and(|v| v == "1");
            TRACE_ERRORS.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
}

/// An export's status: traced where it failed and the switch is on.
#[inline]
pub fn exported(name: &'static str, code: u32) {
    if code != 0 && code != 600 {
        failed(name, code);
    }
}

#[cold]
fn failed(name: &'static str, code: u32) {
    if trace_errors() {
        let _ = writeln!(
            std::io::stderr().lock(),
            "qcuda-trace: {name} failed: {code}"
        );
    }
}

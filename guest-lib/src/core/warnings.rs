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

//! `QCUDA_DRIVER_TRACE=1`: one line on stderr per driver-face call with its result, for finding
//! what a library (cuBLAS, cuFFT, a framework) asks of the driver and where it stops.
//! `QCUDA_DRIVER_TRACE=count`: no lines; at exit, one line per driver function (and traced
//! export-table slot) with how often it was called, most called first: divided by the number of
//! launches or copies a program made, what a runtime above the driver calls per operation.
//! Off by default; reading the switch once costs one relaxed load per call afterwards.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU8, Ordering},
        Mutex, PoisonError,
    },
};

/// 0: not read yet, 1: off, 2: a line per call, 3: counts at exit.
static STATE: AtomicU8 = AtomicU8::new(0);
static OUT: Mutex<()> = Mutex::new(());
static COUNTS: Mutex<Option<HashMap<&'static str, u64>>> = Mutex::new(None);

/// The switch, read from the environment on first use.
#[inline]
fn state() -> u8 {
    match STATE.load(Ordering::Relaxed) {
        0 => read_switch(),
        s => s,
    }
}

#[cold]
fn read_switch() -> u8 {
    let s = match std::env::var_os("QCUDA_DRIVER_TRACE") {
        Some(v) if v == "1" => 2,
        Some(v) if v == "count" => 3,
        _ => 1,
    };
    if STATE
        .compare_exchange(0, s, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
        && s == 3
    {
        // SAFETY: registering a plain extern "C" function; it runs once, at exit.
        unsafe { libc::atexit(print_counts) };
    }
    STATE.load(Ordering::Relaxed)
}

/// Whether a line per call is printed.
#[inline]
pub fn enabled() -> bool {
    state() == 2
}

/// One traced event.
pub fn log(what: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _guard = OUT.lock();
    let _ = writeln!(std::io::stderr().lock(), "qcuda-trace: {what}");
}

/// A call and its result. Every driver export ends here: with tracing off (the switch read),
/// one load and a compare, inlined into the export.
#[inline]
pub fn call(name: &'static str, code: u32) {
    crate::core::warnings::exported(name, code);
    match state() {
        1 => {}
        s => record(name, code, s),
    }
}

#[cold]
fn record(name: &'static str, code: u32, state: u8) {
    match state {
        2 => match super::status::error_name(code) {
            Some(n) => log(format_args!("{name} -> {}", n.to_string_lossy())),
            None => log(format_args!("{name} -> {code}")),
        },
        3 => {
            let mut counts = COUNTS.lock().unwrap_or_else(PoisonError::into_inner);
            *counts
                .get_or_insert_with(HashMap::new)
                .entry(name)
                .or_insert(0) += 1;
        }
        _ => {}
    }
}

/// The counts, most called first (then by name).
fn sorted_counts() -> Vec<(&'static str, u64)> {
    let counts = COUNTS.lock().unwrap_or_else(PoisonError::into_inner);
    let mut all: Vec<(&'static str, u64)> = counts
        .as_ref()
        .map(|c| c.iter().map(|(k, v)| (*k, *v)).collect())
        .unwrap_or_default();
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    all
}

extern "C" fn print_counts() {
    for (name, n) in sorted_counts() {
        log(format_args!("count {n} {name}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_orders_by_calls() {
        STATE.store(3, Ordering::Relaxed);
        call("cuTestB", 0);
        call("cuTestA", 0);
        call("cuTestA", 1);
        STATE.store(1, Ordering::Relaxed);
        call("cuTestA", 0);
        let mine: Vec<_> = sorted_counts()
            .into_iter()
            .filter(|(n, _)| n.starts_with("cuTest"))
            .collect();
        assert_eq!(mine, [("cuTestA", 2), ("cuTestB", 1)]);
    }
}

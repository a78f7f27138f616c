//! CUDA's error reporting semantics on the guest side: the per-thread last error.
//!
//! Every exported runtime function that fails records its error as the calling thread's last
//! error; `cudaGetLastError` returns it and resets it to `cudaSuccess`, `cudaPeekAtLastError`
//! returns it without resetting. `cudaErrorNotReady` from the query functions is an answer, not a
//! failure, and is not recorded. Sticky (context-corrupting) errors live in the session
//! (`session.rs`), per device: every later call that needs the context fails with the sticky
//! error and so records it again, until `cudaDeviceReset`; reading the last error clears the
//! variable as usual (measured with NVIDIA's 13.0 runtime: get, get gives 700, then success).

use std::{cell::Cell, sync::atomic::AtomicBool};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::warnings,
    generated::{cudaError_t, cudaSuccess},
};

thread_local! {
    static LAST_ERROR: Cell<u32> = const { Cell::new(0) };
}

/// Records `e` as the calling thread's last error (unless it is `cudaErrorNotReady`).
pub fn record(e: CudaError) {
    if e != CudaError::NOT_READY {
        // try_with: a runtime call from a thread-local destructor must not panic.
        let _ = LAST_ERROR.try_with(|c| c.set(e.code()));
    }
}

/// The last error, reset to `cudaSuccess` (`cudaGetLastError` without a sticky error).
pub fn take() -> cudaError_t {
    LAST_ERROR
        .try_with(|c| c.replace(cudaSuccess))
        .unwrap_or(cudaSuccess)
}

/// The last error, left in place (`cudaPeekAtLastError` without a sticky error).
pub fn peek() -> cudaError_t {
    LAST_ERROR.try_with(Cell::get).unwrap_or(cudaSuccess)
}

/// Puts back a last error read with [`peek`]: the driver face runs runtime-face functions
/// without touching the runtime's last error, which only runtime calls may change.
pub fn restore(code: cudaError_t) {
    let _ = LAST_ERROR.try_with(|c| c.set(code));
}

/// Runs `f` and then puts the calling thread's last error back as it was: the driver face runs
/// runtime-face functions without touching the runtime's last error, which only runtime calls
/// may change. One thread-local access for both the read and the write.
pub fn preserving<T>(f: impl FnOnce() -> T) -> T {
    let mut f = Some(f);
    let kept = LAST_ERROR.try_with(|c| {
        let saved = c.get();
        let r = f.take().map(|f| f());
        c.set(saved);
        r
    });
    match (kept, f) {
        (Ok(Some(r)), _) => r,
        // The thread's locals are being torn down: nothing to keep.
        (_, Some(f)) => f(),
        (_, None) => unreachable!("a closure that ran returned its value"),
    }
}

/// Turns the result of an exported function into its return value, recording a failure.
pub fn finish(result: CudaResult<()>) -> cudaError_t {
    match result {
        Ok(()) => cudaSuccess,
        Err(e) => {
            record(e);
            e.code()
        }
    }
}

/// The body of every exported function qcuda does not implement: warns once (naming the
/// function), records and returns `cudaErrorNotSupported`. Never pretends to succeed.
pub fn not_supported(name: &str, once: &AtomicBool) -> cudaError_t {
    warnings::warn_first(once, format_args!("{name} is not supported"));
    finish(Err(CudaError::NOT_SUPPORTED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated as cu;

    #[test]
    fn take_resets_peek_does_not() {
        assert_eq!(take(), cu::cudaSuccess);
        record(CudaError::INVALID_VALUE);
        assert_eq!(peek(), cu::cudaErrorInvalidValue);
        assert_eq!(peek(), cu::cudaErrorInvalidValue);
        assert_eq!(take(), cu::cudaErrorInvalidValue);
        assert_eq!(take(), cu::cudaSuccess);
    }

    #[test]
    fn success_does_not_clear_and_later_errors_overwrite() {
        record(CudaError::INVALID_VALUE);
        assert_eq!(finish(Ok(())), cu::cudaSuccess);
        assert_eq!(peek(), cu::cudaErrorInvalidValue);
        assert_eq!(finish(Err(CudaError::NO_DEVICE)), cu::cudaErrorNoDevice);
        assert_eq!(take(), cu::cudaErrorNoDevice);
    }

    #[test]
    fn not_ready_is_not_recorded() {
        take();
        assert_eq!(finish(Err(CudaError::NOT_READY)), cu::cudaErrorNotReady);
        assert_eq!(take(), cu::cudaSuccess);
    }

    #[test]
    fn last_error_is_per_thread() {
        record(CudaError::INVALID_DEVICE);
        std::thread::spawn(|| assert_eq!(take(), cu::cudaSuccess))
            .join()
            .unwrap();
        assert_eq!(take(), cu::cudaErrorInvalidDevice);
    }

    #[test]
    fn not_supported_returns_and_records() {
        static ONCE: AtomicBool = AtomicBool::new(false);
        assert_eq!(
            not_supported("cudaTestOnly", &ONCE),
            cu::cudaErrorNotSupported
        );
        assert!(ONCE.load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(
            not_supported("cudaTestOnly", &ONCE),
            cu::cudaErrorNotSupported
        );
        assert_eq!(take(), cu::cudaErrorNotSupported);
    }
}

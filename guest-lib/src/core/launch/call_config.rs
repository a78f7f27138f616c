//! The per-thread stack behind `<<<grid, block, smem, stream>>>`.
//!
//! nvcc turns `k<<<g, b, s, t>>>(args)` into `__cudaPushCallConfiguration(g, b, s, t)` followed by
//! a call of the host stub, which pops the configuration (`__cudaPopCallConfiguration`) and
//! launches. Pushes can nest when a kernel argument expression itself launches a kernel, hence a
//! stack.

use std::cell::RefCell;

use crate::generated::dim3;

/// One launch configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallConfig {
    /// Grid dimensions.
    pub grid: dim3,
    /// Block dimensions.
    pub block: dim3,
    /// Dynamic shared memory in bytes.
    pub shared_mem: usize,
    /// The `cudaStream_t` as given.
    pub stream: usize,
}

thread_local! {
    static STACK: RefCell<Vec<CallConfig>> = const { RefCell::new(Vec::new()) };
}

/// `__cudaPushCallConfiguration`.
pub fn push(config: CallConfig) {
    let _ = STACK.try_with(|s| s.borrow_mut().push(config));
}

/// `__cudaPopCallConfiguration`: the innermost configuration, or `None` when nothing was pushed.
pub fn pop() -> Option<CallConfig> {
    STACK.try_with(|s| s.borrow_mut().pop()).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n: u32) -> CallConfig {
        CallConfig {
            grid: dim3 { x: n, y: 1, z: 1 },
            block: dim3 { x: 32, y: n, z: 1 },
            shared_mem: n as usize,
            stream: 0,
        }
    }

    #[test]
    fn stack_is_last_in_first_out() {
        assert_eq!(pop(), None);
        push(cfg(1));
        push(cfg(2));
        assert_eq!(pop(), Some(cfg(2)));
        push(cfg(3));
        assert_eq!(pop(), Some(cfg(3)));
        assert_eq!(pop(), Some(cfg(1)));
        assert_eq!(pop(), None);
    }

    #[test]
    fn stack_is_per_thread() {
        push(cfg(7));
        std::thread::spawn(|| assert_eq!(pop(), None))
            .join()
            .unwrap();
        assert_eq!(pop(), Some(cfg(7)));
    }
}

//! `cudaProfilerStart`/`cudaProfilerStop`. No profiler can attach to the guest side, and with
//! none attached NVIDIA's runtime does nothing and succeeds; so do we.

use crate::runtime::runtime;

cuda_api! {
    /// `cudaProfilerStart`: nothing to start in the guest.
    fn cudaProfilerStart() {
        runtime().map(|_| ())
    }

    /// `cudaProfilerStop`: nothing to stop in the guest.
    fn cudaProfilerStop() {
        runtime().map(|_| ())
    }
}

//! `cudaProfilerStart`/`cudaProfilerStop`. No profiler can attach to the guest side, and with
//! none attached NVIDIA's runtime does nothing and succeeds; so do we.

use crate::core::runtime::runtime;

cuda_api! {
    /// `cudaProfilerStart`: nothing to start in the guest.
    #[no_prototype = "cuda_profiler_api.h is not in the CUDA 13.0 runtime wheels"]
    fn cudaProfilerStart() {
        runtime().map(|_| ())
    }

    /// `cudaProfilerStop`: nothing to stop in the guest.
    #[no_prototype = "cuda_profiler_api.h is not in the CUDA 13.0 runtime wheels"]
    fn cudaProfilerStop() {
        runtime().map(|_| ())
    }
}

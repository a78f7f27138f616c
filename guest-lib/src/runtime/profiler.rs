//! `cudaProfilerStart`/`cudaProfilerStop`. No profiler attaches to the guest side; what
//! profiles a guest process is the host's record of its GPU work (docs/profiling.md). With
//! `QCUDA_PROFILE` set these start and stop that recording (core/profile.rs); without, they do
//! nothing and succeed, as NVIDIA's runtime does with no profiler attached, and send nothing.

use crate::core::runtime::runtime;

cuda_api! {
    /// `cudaProfilerStart`: the host records this process's GPU timeline from now on, with
    /// `QCUDA_PROFILE`.
    #[no_prototype = "cuda_profiler_api.h is not in the CUDA 13.0 runtime wheels"]
    fn cudaProfilerStart() {
        runtime().map(|rt| rt.session.profiler_start())
    }

    /// `cudaProfilerStop`: the recording so far is written to `QCUDA_PROFILE`'s file.
    #[no_prototype = "cuda_profiler_api.h is not in the CUDA 13.0 runtime wheels"]
    fn cudaProfilerStop() {
        runtime().map(|rt| rt.session.profiler_stop())
    }
}

//! How a synchronising call waits for the device: CUDA's scheduling flags.
//!
//! CUDA lets a program choose how its threads wait for the GPU (`cudaSetDeviceFlags`,
//! `cuDevicePrimaryCtxSetFlags`, `cuCtxCreate`): spin, yield, block on a synchronisation
//! primitive, or "auto", which spins or yields (it blocks only when asked). In the guest the wait
//! happens in qcuda.ko, which polls the virtqueue or sleeps until the completion interrupt; this
//! module turns the flags into the ioctl's wait mode (the runtime decides whose flags count:
//! `runtime::wait_mode`). Spin and yield both poll: the guest kernel
//! is preemptible and the poll loop drops its lock between looks, so a polling thread yields to
//! any other that needs the CPU, which is what yield asks. Blocking sleeps at once. A call that
//! is not a synchronisation keeps the module's default (a short poll, then sleep).

use qcuda_proto::WaitMode;

use crate::generated::{cudaDeviceScheduleBlockingSync, cudaDeviceScheduleMask};

/// The wait mode scheduling flags ask for (`cudaDeviceSchedule*`, equal to `CU_CTX_SCHED_*`).
pub fn mode_of(flags: u32) -> WaitMode {
    if flags & cudaDeviceScheduleMask == cudaDeviceScheduleBlockingSync {
        WaitMode::Block
    } else {
        WaitMode::Spin
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::{
        cudaDeviceScheduleAuto, cudaDeviceScheduleSpin, cudaDeviceScheduleYield,
    };

    #[test]
    fn flags_map_to_wait_modes() {
        assert_eq!(mode_of(cudaDeviceScheduleAuto), WaitMode::Spin);
        assert_eq!(mode_of(cudaDeviceScheduleSpin), WaitMode::Spin);
        assert_eq!(mode_of(cudaDeviceScheduleYield), WaitMode::Spin);
        assert_eq!(mode_of(cudaDeviceScheduleBlockingSync), WaitMode::Block);
        // Other device flags (map host memory = 8) do not change the mode.
        assert_eq!(mode_of(cudaDeviceScheduleBlockingSync | 8), WaitMode::Block);
        assert_eq!(mode_of(8), WaitMode::Spin);
    }
}

//! What a kernel launch is made of: the per-thread `<<<grid, block, smem, stream>>>` stack
//! (`call_config`) and the parameter block packed with the kernel's layout (`params`). The launch
//! itself is runtime/launch.rs.

pub mod call_config;
pub mod params;

//! Kernel launches: the launch geometry packed in a request's inline arguments, the limits it
//! is checked against, and the parameter layout that turns the guest's parameter block into
//! the `void*[]` array `cuLaunchKernel` wants.
//!
//! Kernel arguments reach the guest library as `void**` with no sizes, so the layout comes from
//! the host (`cuFuncGetParamInfo`, cached per function handle): the guest packs each argument at
//! its offset into one block, and the host points one array entry at each offset of its own
//! copy of that block.

use std::ffi::c_void;

use qcuda_proto::{status, ParamInfo, MAX_ARGS};

use super::aligned_bytes::AlignedBytes;

/// Grid and block dimensions and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaunchConfig {
    /// Blocks in x, y, z.
    pub(crate) grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub(crate) block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub(crate) shared_mem: u32,
}

/// The device limits a launch is checked against before it reaches the driver. A limit of 0
/// means unknown: the driver decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct LaunchLimits {
    /// CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK.
    pub(crate) max_threads_per_block: u32,
    /// CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_{X,Y,Z}.
    pub(crate) max_block: [u32; 3],
    /// CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_{X,Y,Z}.
    pub(crate) max_grid: [u32; 3],
}

fn lo(v: u64) -> u32 {
    (v & 0xffff_ffff) as u32
}

fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

impl LaunchConfig {
    /// Decodes LaunchKernel's args: args[1] = grid x | grid y << 32, args[2] = grid z |
    /// block x << 32, args[3] = block y | block z << 32, args[4] = dynamic shared memory.
    pub(crate) fn decode(args: &[u64; MAX_ARGS]) -> Result<Self, u32> {
        let shared_mem = u32::try_from(args[4]).map_err(|_| status::INVALID_VALUE)?;
        Ok(Self {
            grid: [lo(args[1]), hi(args[1]), lo(args[2])],
            block: [hi(args[2]), lo(args[3]), hi(args[3])],
            shared_mem,
        })
    }

    /// Encodes the geometry as LaunchKernel's args[1..=4] (the guest library's side; tests).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> [u64; 4] {
        let pack = |a: u32, b: u32| u64::from(a) | (u64::from(b) << 32);
        [
            pack(self.grid[0], self.grid[1]),
            pack(self.grid[2], self.block[0]),
            pack(self.block[1], self.block[2]),
            u64::from(self.shared_mem),
        ]
    }

    /// Checks the geometry the way the runtime does: zero or too large dimensions are
    /// cudaErrorInvalidValue (what CUDA 13.0 returns for grid 0, block 2048, block z 65, grid y
    /// 70000 and too much shared memory, measured with NVIDIA's runtime on an H200).
    pub(crate) fn check(&self, limits: &LaunchLimits) -> Result<(), u32> {
        let bad = status::INVALID_VALUE;
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(bad);
        }
        let over = |v: u32, max: u32| max != 0 && v > max;
        for i in 0..3 {
            if over(self.block[i], limits.max_block[i]) || over(self.grid[i], limits.max_grid[i]) {
                return Err(bad);
            }
        }
        // Three 32-bit factors fit in 96 bits.
        let threads = self.block.iter().map(|&b| u128::from(b)).product::<u128>();
        if limits.max_threads_per_block != 0 && threads > u128::from(limits.max_threads_per_block) {
            return Err(bad);
        }
        Ok(())
    }
}

/// One launch attribute in the driver's own layout (`CUlaunchAttribute`: id, 4 bytes of
/// padding, a 64-byte value union), built from a checked wire record.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct DriverLaunchAttr {
    /// The `CUlaunchAttributeID`.
    pub(crate) id: u32,
    pad: u32,
    /// The value union, little-endian.
    pub(crate) value: [u8; 64],
}

impl std::fmt::Debug for DriverLaunchAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LaunchAttr({}, {:?})", self.id, &self.value[..16])
    }
}

/// The launch attribute ids cuLaunchKernelEx takes, by how their value is laid out.
pub(crate) mod attr {
    pub(crate) const IGNORE: u32 = 0;
    pub(crate) const ACCESS_POLICY_WINDOW: u32 = 1;
    pub(crate) const COOPERATIVE: u32 = 2;
    pub(crate) const SYNCHRONIZATION_POLICY: u32 = 3;
    pub(crate) const CLUSTER_DIMENSION: u32 = 4;
    pub(crate) const CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 5;
    pub(crate) const PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
    pub(crate) const PROGRAMMATIC_EVENT: u32 = 7;
    pub(crate) const PRIORITY: u32 = 8;
    pub(crate) const MEM_SYNC_DOMAIN_MAP: u32 = 9;
    pub(crate) const MEM_SYNC_DOMAIN: u32 = 10;
    pub(crate) const PREFERRED_CLUSTER_DIMENSION: u32 = 11;
    pub(crate) const LAUNCH_COMPLETION_EVENT: u32 = 12;
    pub(crate) const PREFERRED_SHARED_MEMORY_CARVEOUT: u32 = 14;
    pub(crate) const NVLINK_UTIL_CENTRIC_SCHEDULING: u32 = 16;
}

impl DriverLaunchAttr {
    /// The driver's attribute for wire record `a`. `event` maps a session event handle to the
    /// driver's event as a launch attribute holds it (`Event::launch_attr_value`; None:
    /// unknown). Unknown ids, and the graph-only device-updatable node,
    /// are `INVALID_VALUE`.
    pub(crate) fn from_wire(
        a: &qcuda_proto::LaunchAttr,
        event: impl Fn(u64) -> Option<u64>,
    ) -> Result<Self, u32> {
        let mut value = [0u8; 64];
        let mut put = |at: usize, b: &[u8]| value[at..at + b.len()].copy_from_slice(b);
        match a.id {
            attr::IGNORE => {}
            attr::COOPERATIVE
            | attr::SYNCHRONIZATION_POLICY
            | attr::CLUSTER_SCHEDULING_POLICY_PREFERENCE
            | attr::PROGRAMMATIC_STREAM_SERIALIZATION
            | attr::PRIORITY
            | attr::MEM_SYNC_DOMAIN
            | attr::PREFERRED_SHARED_MEMORY_CARVEOUT
            | attr::NVLINK_UTIL_CENTRIC_SCHEDULING => put(0, &a.v[0].to_le_bytes()),
            attr::CLUSTER_DIMENSION | attr::PREFERRED_CLUSTER_DIMENSION => {
                for (i, v) in a.v.iter().enumerate() {
                    put(4 * i, &v.to_le_bytes());
                }
            }
            attr::MEM_SYNC_DOMAIN_MAP => {
                let (d, r) = (u8::try_from(a.v[0]), u8::try_from(a.v[1]));
                let (Ok(d), Ok(r)) = (d, r) else {
                    return Err(status::INVALID_VALUE);
                };
                put(0, &[d, r]);
            }
            attr::PROGRAMMATIC_EVENT | attr::LAUNCH_COMPLETION_EVENT => {
                let e = event(a.w[0]).ok_or(status::INVALID_RESOURCE_HANDLE)?;
                put(0, &e.to_le_bytes());
                put(8, &a.v[0].to_le_bytes());
                if a.id == attr::PROGRAMMATIC_EVENT {
                    put(12, &a.v[1].to_le_bytes());
                }
            }
            attr::ACCESS_POLICY_WINDOW => {
                // A cache hint over an address range; the driver never dereferences it.
                put(0, &a.w[0].to_le_bytes());
                put(8, &a.w[1].to_le_bytes());
                put(16, &a.v[0].to_le_bytes());
                put(20, &a.v[1].to_le_bytes());
                put(24, &a.v[2].to_le_bytes());
            }
            _ => return Err(status::INVALID_VALUE),
        }
        Ok(Self {
            id: a.id,
            pad: 0,
            value,
        })
    }

    /// The 32-bit value at `index` (scalars: 0; cluster dimensions: 0..3).
    #[cfg(any(test, feature = "fuzzing", feature = "test-double-driver"))]
    pub(crate) fn scalar(&self, index: usize) -> u32 {
        let b = &self.value[4 * index..4 * index + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// Where a kernel's parameters sit in its parameter block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ParamLayout {
    params: Vec<ParamInfo>,
    block_len: usize,
}

impl ParamLayout {
    /// A layout from the driver's (offset, size) pairs, in parameter order. `None` if an
    /// offset or end does not fit in 32 bits (no real kernel comes near).
    pub(crate) fn new(pairs: &[(usize, usize)]) -> Option<Self> {
        let mut params = Vec::with_capacity(pairs.len());
        let mut block_len = 0usize;
        for &(offset, size) in pairs {
            let end = offset.checked_add(size)?;
            u32::try_from(end).ok()?;
            params.push(ParamInfo {
                offset: u32::try_from(offset).ok()?,
                size: u32::try_from(size).ok()?,
            });
            block_len = block_len.max(end);
        }
        Some(Self { params, block_len })
    }

    /// The parameters, in order.
    pub(crate) fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    /// Bytes the parameter block must have: the largest offset + size.
    pub(crate) fn block_len(&self) -> usize {
        self.block_len
    }

    /// The `void*[]` for `cuLaunchKernel`: one pointer per parameter, into `block` at the
    /// parameter's offset. `None` if `block` is shorter than [`ParamLayout::block_len`].
    /// The pointers are valid while `block` is neither dropped nor moved.
    pub(crate) fn pointers(&self, block: &mut AlignedBytes) -> Option<Vec<*mut c_void>> {
        if block.len() < self.block_len {
            return None;
        }
        let base = block.as_mut_ptr();
        Some(
            self.params
                .iter()
                // Offsets are below block_len <= block.len(), so each pointer stays inside
                // the block; wrapping_add keeps this free of unsafe.
                .map(|p| base.wrapping_add(p.offset as usize).cast::<c_void>())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_for(cfg: &LaunchConfig) -> [u64; MAX_ARGS] {
        let mut a = [0u64; MAX_ARGS];
        a[1..5].copy_from_slice(&cfg.encode());
        a
    }

    const H100: LaunchLimits = LaunchLimits {
        max_threads_per_block: 1024,
        max_block: [1024, 1024, 64],
        max_grid: [i32::MAX as u32, 65535, 65535],
    };

    #[test]
    fn geometry_round_trips_through_the_packing() {
        let cfg = LaunchConfig {
            grid: [0x8000_0001, 2, 3],
            block: [4, 5, 0xffff_fff6],
            shared_mem: 48 * 1024,
        };
        let mut args = args_for(&cfg);
        assert_eq!(LaunchConfig::decode(&args), Ok(cfg));
        // Exact packing as documented in wire.rs.
        assert_eq!(args[1], 0x8000_0001 | (2 << 32));
        assert_eq!(args[2], 3 | (4 << 32));
        assert_eq!(args[3], 5 | (0xffff_fff6 << 32));
        args[4] = u64::from(u32::MAX) + 1;
        assert_eq!(LaunchConfig::decode(&args), Err(status::INVALID_VALUE));
    }

    #[test]
    fn geometry_checks_match_the_runtime() {
        let ok = LaunchConfig {
            grid: [65536, 65535, 65535],
            block: [256, 4, 1],
            shared_mem: 0,
        };
        assert_eq!(ok.check(&H100), Ok(()));
        let bad = status::INVALID_VALUE;
        for (grid, block) in [
            ([0, 1, 1], [1, 1, 1]),
            ([1, 1, 1], [1, 0, 1]),
            ([1, 65536, 1], [1, 1, 1]),
            ([1, 1, 1], [1025, 1, 1]),
            ([1, 1, 1], [1, 1, 65]),
            ([1, 1, 1], [32, 32, 2]),
        ] {
            let cfg = LaunchConfig {
                grid,
                block,
                shared_mem: 0,
            };
            assert_eq!(cfg.check(&H100), Err(bad), "{grid:?} {block:?}");
        }
        // Unknown limits leave the decision to the driver, except for zeros.
        let big = LaunchConfig {
            grid: [u32::MAX; 3],
            block: [u32::MAX; 3],
            shared_mem: 0,
        };
        assert_eq!(big.check(&LaunchLimits::default()), Ok(()));
    }

    #[test]
    fn parameter_pointers_point_at_each_offset() {
        // void vadd(const float*, const float*, float*, int)
        let layout = ParamLayout::new(&[(0, 8), (8, 8), (16, 8), (24, 4)]).unwrap();
        assert_eq!(layout.block_len(), 28);
        assert_eq!(
            layout.params()[3],
            ParamInfo {
                offset: 24,
                size: 4
            }
        );
        let mut block = AlignedBytes::zeroed(32);
        block.as_mut_slice()[24..28].copy_from_slice(&1234i32.to_le_bytes());
        let base = block.as_mut_ptr() as usize;
        let ptrs = layout.pointers(&mut block).unwrap();
        let offsets: Vec<usize> = ptrs.iter().map(|&p| p as usize - base).collect();
        assert_eq!(offsets, [0, 8, 16, 24]);
        assert!(layout.pointers(&mut AlignedBytes::zeroed(27)).is_none());

        let none = ParamLayout::new(&[]).unwrap();
        assert_eq!(none.block_len(), 0);
        assert_eq!(none.pointers(&mut AlignedBytes::zeroed(0)), Some(vec![]));

        assert!(ParamLayout::new(&[(usize::MAX, 2)]).is_none());
        assert!(ParamLayout::new(&[(u32::MAX as usize, 1)]).is_none());
    }
}

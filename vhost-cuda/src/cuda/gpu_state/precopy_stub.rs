//! TEMPORARY stand-in for the pre-copy of branch pcgpu while the daemon side is written: a
//! round sends nothing and reports nothing pending. Replaced at the merge.

use super::*;

/// What a round did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RoundFigures {
    pub(crate) chunks: u64,
    pub(crate) bytes: u64,
    pub(crate) pending: u64,
    pub(crate) pass: u32,
}

impl GpuState {
    pub(crate) fn precopy_round(
        &mut self,
        _budget: u64,
        _max_passes: u32,
        _out: &mut impl std::io::Write,
    ) -> Result<RoundFigures, CheckpointError> {
        Ok(RoundFigures::default())
    }

    pub(crate) fn precopy_reset(&mut self) {}

    pub(crate) fn restore_saved_with(
        &mut self,
        bytes: &[u8],
        _store: Option<&[u8]>,
    ) -> Result<(), CheckpointError> {
        self.restore_saved(bytes)
    }
}

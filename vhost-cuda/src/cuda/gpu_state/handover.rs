//! The GPU side of a same-host handover (`session/handover.rs`): the source exports the
//! physical memory under every mapped run of its reserved ranges, and the destination maps it
//! at the same addresses instead of receiving its bytes, so the stop moves no device memory at
//! all.
//!
//! [`GpuState::export_runs`] gives each run's memory as a POSIX descriptor
//! (`cuMemExportToShareableHandle`). The arena creates runs without a shareable handle type
//! (programs that never share never ask the driver for one), so a run that has none is first
//! moved to shareable memory in place, at the same address, with its contents (`ipc.rs`'s
//! `make_shareable`: a device-to-device copy, at the GPU's speed). The source's mappings stay:
//! its state is unchanged for the program, which goes on if the migration fails.
//! [`GpuState::save_for_handover_into`] saves the state without the allocations' contents (the
//! memory is handed over instead), and [`GpuState::restore_handed_over`] makes it again in a
//! fresh state of the destination with each run imported (`cuMemImportFromShareableHandle`),
//! mapped at its address (`cuMemMap`) and made accessible (`cuMemSetAccess`). Every saved run
//! must come with exactly its descriptor (`tables.rs`'s `ExportedRun`, mapped through its
//! `ImportingBacking`), and nothing is written into imported memory: a
//! migration that fails after the import leaves the source's memory as it was.

use super::*;
use crate::cuda::{driver::vmm::HANDLE_TYPE_POSIX_FD, saved_state::SavedState};

impl GpuState {
    /// Exports the memory under every mapped run of every device's range (a migration's
    /// source on the destination's host; see the module documentation). Waits for the
    /// devices' work first. The state goes on running unchanged.
    pub fn export_runs(&mut self) -> Result<Vec<ExportedRun>, CheckpointError> {
        self.check_capturable()?;
        let mut out = Vec::new();
        for dev in 0..self.devices.len() {
            if !matches!(self.devices.get(dev), Some(Some(_))) {
                continue;
            }
            self.bind(dev)?;
            self.drv.ctx_synchronize().map_err(on(dev))?;
            let Some(range) = self.context(dev)?.range.as_ref() else {
                continue;
            };
            let runs: Vec<(u64, u64)> = range.arena.runs().collect();
            let access = range.access.clone();
            for (va, len) in runs {
                let raw = self.drv.mem_retain_handle(va).map_err(on(dev))?;
                let shareable = self
                    .drv
                    .mem_handle_props(raw)
                    .is_ok_and(|p| p.handle_types & HANDLE_TYPE_POSIX_FD != 0);
                let _ = self.drv.mem_release(raw);
                if !shareable {
                    self.make_shareable(dev, va, len, &access)?;
                }
                let raw = self.drv.mem_retain_handle(va).map_err(on(dev))?;
                let fd = self.drv.mem_export_fd(raw);
                let _ = self.drv.mem_release(raw);
                out.push(ExportedRun {
                    dev: u32::try_from(dev).unwrap_or(u32::MAX),
                    va,
                    len,
                    fd: fd.map_err(on(dev))?,
                });
            }
        }
        Ok(out)
    }

    /// [`save_into`](Self::save_into) without the allocations' contents: the state a handover
    /// sends beside the exported runs (globals, arrays, managed and the program's own VMM
    /// memory still travel as data).
    pub fn save_for_handover_into(
        &mut self,
        out: &mut (impl std::io::Write + std::io::Seek),
    ) -> Result<SaveFigures, CheckpointError> {
        let started = std::time::Instant::now();
        let saved = self.capture_without_contents()?;
        let captured = started.elapsed();
        let bytes = saved
            .encode_into(out)
            .map_err(|e| CheckpointError::Mismatch(format!("writing the saved state: {e}")))?;
        Ok(SaveFigures {
            bytes,
            device_bytes: saved.device_bytes(),
            capture: captured,
            encode: started.elapsed() - captured,
        })
    }

    /// Makes the state saved by [`save_for_handover_into`](Self::save_for_handover_into) again
    /// in this fresh state, every run of its ranges mapped from `runs` (the source's, imported):
    /// each saved run must have its run here, of the same device, address and length, and no
    /// other may be given. On an error what was made stays for the caller to tear down (the
    /// source's memory is untouched: nothing is written into imported memory).
    pub fn restore_handed_over(
        &mut self,
        bytes: &[u8],
        runs: &[ExportedRun],
    ) -> Result<(), CheckpointError> {
        let mismatch = |what: &str| CheckpointError::Mismatch(what.into());
        let (saved, contents) = SavedState::decode_borrowed(bytes)
            .map_err(|e| CheckpointError::Mismatch(e.to_string()))?;
        if contents.iter().any(|c| !c.is_empty()) {
            return Err(mismatch("a handed-over state with allocation contents"));
        }
        let mut given: Vec<(u32, u64, u64)> = runs.iter().map(|r| (r.dev, r.va, r.len)).collect();
        let mut wanted: Vec<(u32, u64, u64)> =
            saved.runs.iter().map(|r| (r.dev, r.va, r.len)).collect();
        given.sort_unstable();
        wanted.sort_unstable();
        if given != wanted {
            return Err(mismatch("the handed-over runs are not the saved ones"));
        }
        self.restore_into_imported(&saved, runs)
    }
}

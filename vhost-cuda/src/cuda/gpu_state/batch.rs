//! Batch: a run of fire-and-forget records in one request, each executed as the request it
//! stands for.

use super::*;

impl GpuState {
    /// Batch: each record runs as the fire-and-forget request it stands for; a waited batch
    /// may end with a synchronising record (`BATCH_TAIL`), which runs waited and answers for
    /// the batch. The records are read from a private copy of the buffer, so their shape
    /// cannot change while they run; in-data is read from guest memory as a single request's
    /// would be.
    pub(super) fn batch(&mut self, req: &Request) -> OpResult {
        let input = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let bytes = input.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let count = req.header().args[0];
        let waited = req.header().flags & FLAG_ASYNC == 0;
        let mut at = 0usize;
        let mut first_failure = status::SUCCESS;
        for i in 0..count {
            let (op, rec) = match BatchRecord::decode(bytes.get(at..).unwrap_or_default()) {
                Ok(r) => r,
                Err(e) => {
                    warn!(
                        session = self.id,
                        ?e,
                        at,
                        "batch record refused; the rest dropped"
                    );
                    return Err(status::INVALID_VALUE.into());
                }
            };
            let tail = BATCH_TAIL.contains(&op);
            if tail && !(waited && i + 1 == count) {
                warn!(
                    session = self.id,
                    ?op,
                    at,
                    "a synchronising record not at the end of a waited batch; the rest dropped"
                );
                return Err(status::INVALID_VALUE.into());
            }
            let data_at = at + BATCH_RECORD_SIZE;
            let data_len = rec.in_len as usize;
            if data_at + data_len > bytes.len() {
                return Err(status::INVALID_VALUE.into());
            }
            let mut header = RequestHeader::new(op);
            header.flags = if tail { 0 } else { FLAG_ASYNC };
            header.session = req.header().session;
            header.device = rec.device;
            header.args = rec.args;
            let mut inputs = Vec::new();
            if op.shape().0 == 1 {
                header
                    .push_buffer(Direction::In, rec.in_len.into())
                    .map_err(|_| status::INVALID_VALUE)?;
                inputs.push(
                    input
                        .slice(data_at, data_len)
                        .map_err(|_| status::INVALID_VALUE)?,
                );
            }
            // Batch records take at most one In buffer and no Out buffer, so this holds.
            let sub =
                Request::new(header, inputs, Vec::new()).map_err(|_| status::INVALID_VALUE)?;
            let mut resp = self.execute_batched(&sub);
            if tail {
                // The synchronising call answers; what failed before it is reported with it,
                // as the next waited-for request would report it.
                if first_failure != status::SUCCESS {
                    resp.set_deferred_error(first_failure);
                }
                return Ok(resp);
            }
            if resp.status != status::SUCCESS && first_failure == status::SUCCESS {
                first_failure = resp.status;
            }
            if is_sticky(resp.status) {
                // The context is lost: what follows cannot run.
                break;
            }
            at += rec.footprint();
        }
        if first_failure != status::SUCCESS {
            return Err(first_failure.into());
        }
        ok()
    }
}

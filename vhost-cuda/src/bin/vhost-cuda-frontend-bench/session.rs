//! One simulated guest process: a session id on a VM's request queue, and the requests guest-lib
//! and qcuda.ko send for the CUDA calls the benchmark measures.

use std::time::Duration;

use qcuda_proto::{
    cuda_errors, status, BatchRecord, Direction, Op, RequestHeader, ResponseHeader, FLAG_ASYNC,
    MAX_ARGS,
};
use vhost_cuda::frontend::{FrontendError, QueueWait, Reply, RequestQueue};

/// Why a measurement has no value.
#[derive(Debug, thiserror::Error)]
pub enum RowError {
    /// The device answered with a CUDA error: the row reads NA.
    #[error("{op:?} answered {name} ({code})")]
    Cuda {
        /// The op.
        op: Op,
        /// The status.
        code: u32,
        /// Its name.
        name: &'static str,
    },
    /// The transport failed: the row reads NA.
    #[error("{0}")]
    Frontend(#[from] FrontendError),
    /// What the row needs could not be set up: the row reads NA.
    #[error("{0}")]
    Setup(String),
    /// A wrong answer: the benchmark fails.
    #[error("wrong result: {0}")]
    Wrong(String),
}

/// A guest process's session on one VM.
#[derive(Debug)]
pub struct Session<'q> {
    pub queue: &'q RequestQueue,
    pub id: u64,
    pub wait: QueueWait,
    pub timeout: Duration,
}

/// An op's header for `session`, as qcuda.ko stamps it.
pub fn header(session: u64, op: Op, args: &[u64]) -> RequestHeader {
    let mut h = RequestHeader::new(op);
    h.session = session;
    h.pid = std::process::id();
    h.args[..args.len()].copy_from_slice(args);
    h
}

/// The check of a response's status.
pub fn success(op: Op, resp: &ResponseHeader) -> Result<(), RowError> {
    if resp.status == status::SUCCESS {
        return Ok(());
    }
    Err(RowError::Cuda {
        op,
        code: resp.status,
        name: cuda_errors::name(resp.status).unwrap_or("an unknown status"),
    })
}

/// Batch records, as guest-lib's batch.rs gathers them.
#[derive(Debug, Default)]
pub struct Batch {
    bytes: Vec<u8>,
    records: u64,
}

impl Batch {
    /// Appends one record of `op` with `args` and `data` (padded to 8 bytes).
    pub fn push(&mut self, op: Op, args: &[u64], data: &[u8]) {
        let mut a = [0u64; MAX_ARGS];
        a[..args.len()].copy_from_slice(args);
        let rec = BatchRecord {
            op: op as u32,
            device: 0,
            in_len: u32::try_from(data.len()).unwrap_or(u32::MAX),
            args: a,
        };
        self.bytes.extend_from_slice(&rec.encode());
        self.bytes.extend_from_slice(data);
        self.bytes.resize(self.bytes.len().next_multiple_of(8), 0);
        self.records += 1;
    }

    /// Bytes the batch takes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
}

impl Session<'_> {
    /// A waited request with `input` as its one `In` buffer (if any) and `out_len` bytes of
    /// `Out` buffer (if any).
    pub fn call(
        &self,
        op: Op,
        args: &[u64],
        input: &[u8],
        out_len: usize,
    ) -> Result<Reply, RowError> {
        let h = self.with_buffers(header(self.id, op, args), input.len(), out_len, op)?;
        Ok(self.queue.call(&h, input, self.wait, self.timeout)?)
    }

    fn with_buffers(
        &self,
        mut h: RequestHeader,
        in_len: usize,
        out_len: usize,
        op: Op,
    ) -> Result<RequestHeader, RowError> {
        let (ins, outs) = op.shape();
        let wrong = |e| RowError::Wrong(format!("{op:?}: {e:?}"));
        if ins > 0 {
            h.push_buffer(Direction::In, in_len as u64).map_err(wrong)?;
        }
        if outs > 0 {
            h.push_buffer(Direction::Out, out_len as u64)
                .map_err(wrong)?;
        }
        Ok(h)
    }

    /// A waited request that must succeed; its response.
    pub fn ok(&self, op: Op, args: &[u64]) -> Result<ResponseHeader, RowError> {
        let r = self.call(op, args, &[], 0)?;
        success(op, &r.resp)?;
        Ok(r.resp)
    }

    /// A waited request with buffers that must succeed.
    pub fn ok_with(
        &self,
        op: Op,
        args: &[u64],
        input: &[u8],
        out_len: usize,
    ) -> Result<Reply, RowError> {
        let r = self.call(op, args, input, out_len)?;
        success(op, &r.resp)?;
        Ok(r)
    }

    /// Sends `batch` fire-and-forget (guest-lib's full batch, or its flusher).
    pub fn post_batch(&self, batch: &Batch) -> Result<(), RowError> {
        let mut h = header(self.id, Op::Batch, &[batch.records]);
        h.flags = FLAG_ASYNC;
        let h = self.with_buffers(h, batch.len(), 0, Op::Batch)?;
        Ok(self.queue.post(&h, &batch.bytes)?)
    }

    /// Sends `batch` ending with the synchronising `tail` (op and args), waited: guest-lib's
    /// way of sending a launch or an async copy followed by a synchronisation.
    pub fn batch_with_tail(
        &self,
        mut batch: Batch,
        tail: Op,
        args: &[u64],
    ) -> Result<ResponseHeader, RowError> {
        batch.push(tail, args, &[]);
        let r = self.call(Op::Batch, &[batch.records], &batch.bytes, 0)?;
        success(Op::Batch, &r.resp)?;
        let deferred = r.resp.deferred_error();
        if deferred != 0 {
            return Err(RowError::Cuda {
                op: Op::Batch,
                code: deferred,
                name: cuda_errors::name(deferred).unwrap_or("an unknown status"),
            });
        }
        Ok(r.resp)
    }

    /// Ends the session, as qcuda.ko does when the process closes /dev/qcuda.
    pub fn close(&self) -> Result<(), RowError> {
        let r = self.queue.call(
            &header(self.id, Op::SessionClose, &[]),
            &[],
            QueueWait::DEFAULT,
            self.timeout,
        )?;
        success(Op::SessionClose, &r.resp)
    }
}

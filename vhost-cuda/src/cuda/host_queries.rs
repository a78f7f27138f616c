//! The ops answered from what the host found at start, with no context and no driver call:
//! HostInfo, DriverVersion, DriverRelease, DeviceCount and DeviceInfo.
//!
//! The daemon answers them itself (`crate::session`), so a guest process that only asks which GPUs
//! there are never starts a worker process, and the daemon never creates a CUDA context. A
//! [`GpuState`](super::GpuState) answers them the same way, through the same code.

use qcuda_proto::{status, Op, ResponseHeader, GPU_INFO_SIZE};

use super::host::CudaHost;
use crate::guest_buffer::Request;

fn with_rets(rets: &[u64]) -> ResponseHeader {
    let mut r = ResponseHeader::with_status(status::SUCCESS);
    for (slot, v) in r.rets.iter_mut().zip(rets) {
        *slot = *v;
    }
    r
}

impl CudaHost {
    /// The answer to `req` if it is one of the host queries; `None` for every other op.
    ///
    /// Without a usable GPU, HostInfo answers success with count 0 and DriverVersion the
    /// version (0 without a driver), as the runtime does; DeviceCount and DeviceInfo answer the
    /// unavailable status.
    pub fn answer_query(&self, req: &Request) -> Option<ResponseHeader> {
        let resp = match req.op() {
            Op::HostInfo => self.host_info(req),
            Op::DriverVersion => Ok(with_rets(&[u64::from(self.driver_version())])),
            Op::DriverRelease => match self.unavailable() {
                Some(s) => Err(s),
                None => self.driver_release(req),
            },
            Op::DeviceCount => match self.unavailable() {
                Some(s) => Err(s),
                None => Ok(with_rets(&[u64::from(self.gpu_count())])),
            },
            Op::DeviceInfo => match self.unavailable() {
                Some(s) => Err(s),
                None => self.device_info(req),
            },
            _ => return None,
        };
        Some(resp.unwrap_or_else(ResponseHeader::with_status))
    }

    /// HostInfo: one `GpuInfo` record per GPU into out-buffer 0, as far as they fit.
    fn host_info(&self, req: &Request) -> Result<ResponseHeader, u32> {
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let fit = out.len() / GPU_INFO_SIZE;
        for (i, gpu) in self.gpus.iter().take(fit).enumerate() {
            out.write_at(i * GPU_INFO_SIZE, &gpu.info.encode())
                .map_err(|_| status::INVALID_VALUE)?;
        }
        Ok(with_rets(&[
            u64::from(self.gpu_count()),
            u64::from(self.driver_version()),
        ]))
    }

    /// DriverRelease: the NVIDIA driver's version text into out-buffer 0 if it fits; rets[0]
    /// = its length.
    fn driver_release(&self, req: &Request) -> Result<ResponseHeader, u32> {
        let text = self.release.as_deref().ok_or(status::NOT_SUPPORTED)?;
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        if text.len() <= out.len() {
            out.write_at(0, text.as_bytes())
                .map_err(|_| status::INVALID_VALUE)?;
        }
        Ok(with_rets(&[text.len() as u64]))
    }

    /// DeviceInfo: the `GpuInfo` of the request's device into out-buffer 0.
    fn device_info(&self, req: &Request) -> Result<ResponseHeader, u32> {
        let gpu = self
            .gpus
            .get(req.header().device as usize)
            .ok_or(status::INVALID_DEVICE)?;
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        if out.len() < GPU_INFO_SIZE {
            return Err(status::INVALID_VALUE);
        }
        out.write_at(0, &gpu.info.encode())
            .map_err(|_| status::INVALID_VALUE)?;
        Ok(with_rets(&[]))
    }
}

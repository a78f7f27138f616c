//! Copies and memsets: guest RAM to and from the device (through `crate::cuda::copy`), between
//! device ranges, between devices.

use super::*;

impl GpuState {
    /// The stream for handle `handle` on `dev`: 0 is the legacy stream; others must be
    /// streams of this session on the same device.
    /// The device and stream a memory copy or memset runs on: a stream's own device (CUDA runs
    /// a copy issued to a stream of another device than the current one), or the current device
    /// and its null stream. Binds that device.
    pub(super) fn copy_stream(
        &mut self,
        req: &Request,
        handle: u64,
    ) -> Result<(usize, Stream), Fault> {
        if handle == 0 {
            return Ok((self.bind_new(req)?, NULL_STREAM));
        }
        self.bound_stream(handle)
    }

    /// The staging buffer of `dev` if guest runs shorter than the direct threshold are to be
    /// copied; allocated on first need.
    pub(super) fn staging_for<'c>(
        drv: &dyn DriverApi,
        c: &'c mut DeviceContext,
        half: usize,
        needed: bool,
    ) -> Option<&'c mut Staging> {
        if !needed {
            return None;
        }
        if matches!(c.staging, StagingState::NotYet) {
            c.staging = match Staging::create(drv, half) {
                Ok(s) => StagingState::Ready(s),
                Err(e) => {
                    debug!(error = ?e, "no pinned staging buffer; copying run by run");
                    StagingState::Unavailable
                }
            };
        }
        match &mut c.staging {
            StagingState::Ready(s) => Some(s),
            _ => None,
        }
    }

    /// Common part of HtoD and DtoH: binds, resolves the stream, checks the range, plans.
    pub(super) fn copy_setup(
        &mut self,
        req: &Request,
        ptr: u64,
        stream: u64,
        buf: &GuestBuffer,
    ) -> Result<Option<(usize, Stream, Vec<copy::Step>)>, Fault> {
        let (dev, stream) = self.copy_stream(req, stream)?;
        if buf.is_empty() {
            return Ok(None);
        }
        self.check_range_any(dev, ptr, buf.len() as u64)?;
        let runs = copy::host_runs(buf).map_err(|_| status::INVALID_VALUE)?;
        let tuning = self.host.tuning;
        let small = copy::is_small(&runs);
        let needed = !small && runs.iter().any(|r| r.len < tuning.direct_min);
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        // Half 0 (no staging, as for small copies): every run direct (plan).
        let half =
            Self::staging_for(drv.as_ref(), c, tuning.staging_half, needed).map_or(0, |s| s.half());
        let steps = copy::plan(&runs, half, tuning.direct_min);
        let steps = if buf.len() <= copy::TINY_COPY {
            steps
        } else {
            self.ram.prepare(
                drv.as_ref(),
                buf.shared_memory(),
                steps,
                tuning.max_registered_ram,
            )
        };
        Ok(Some((dev, stream, steps)))
    }

    pub(super) fn memcpy_htod(&mut self, req: &Request) -> OpResult {
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let dst = req.header().args[0];
        let Some((dev, stream, steps)) = self.copy_setup(req, dst, req.header().args[1], buf)?
        else {
            return ok();
        };
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        let staging = match &mut c.staging {
            StagingState::Ready(s) => Some(s),
            _ => None,
        };
        copy::to_device(drv.as_ref(), staging, dst, &steps, stream).map_err(on(dev))?;
        ok()
    }

    pub(super) fn memcpy_dtoh(&mut self, req: &Request) -> OpResult {
        let buf = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let src = req.header().args[0];
        let Some((dev, stream, steps)) = self.copy_setup(req, src, req.header().args[1], buf)?
        else {
            return ok();
        };
        let drv = Arc::clone(&self.drv);
        let c = self.context(dev)?;
        let staging = match &mut c.staging {
            StagingState::Ready(s) => Some(s),
            _ => None,
        };
        copy::from_device(drv.as_ref(), staging, src, &steps, stream).map_err(on(dev))?;
        ok()
    }

    pub(super) fn memcpy_dtod(&mut self, req: &Request) -> OpResult {
        let Some((dev, stream, (dst, src, size))) = self.device_copy_setup(req)? else {
            return ok();
        };
        self.drv
            .memcpy_dtod(dst, src, size, stream)
            .map_err(on(dev))?;
        ok()
    }

    /// Common part of the copies between two device addresses (args: destination, source,
    /// size, stream): binds, resolves the stream, checks both ranges. `None` for zero bytes.
    pub(super) fn device_copy_setup(
        &mut self,
        req: &Request,
    ) -> Result<Option<(usize, Stream, DeviceCopy)>, Fault> {
        let [dst, src, size, stream, ..] = req.header().args;
        let (dev, stream) = self.copy_stream(req, stream)?;
        if size == 0 {
            return Ok(None);
        }
        self.check_range_any(dev, dst, size)?;
        self.check_range_any(dev, src, size)?;
        Ok(Some((dev, stream, (dst, src, to_usize(size)?))))
    }

    pub(super) fn memset(&mut self, req: &Request) -> OpResult {
        let [dst, value, count, stream, width, ..] = req.header().args;
        let width = MemsetWidth::from_wire(width).ok_or(status::INVALID_VALUE)?;
        let (dev, stream) = self.copy_stream(req, stream)?;
        if count == 0 {
            return ok();
        }
        if dst % width.bytes() != 0 {
            return Err(status::INVALID_VALUE.into());
        }
        let size = count
            .checked_mul(width.bytes())
            .ok_or(status::INVALID_VALUE)?;
        self.check_range_any(dev, dst, size)?;
        // The element is the value's low bits (cudaMemset takes an int and uses its low byte).
        #[expect(clippy::cast_possible_truncation, reason = "32-bit elements at most")]
        let value = value as u32;
        self.drv
            .memset(dst, value, width, to_usize(count)?, stream)
            .map_err(on(dev))?;
        ok()
    }

    /// `MemcpyMapped`: a copy between device-addressable ranges of the session (device memory
    /// or host-mapped guest memory), done by the driver in stream order. A waited-for request
    /// returns once the copy is complete, as `cudaMemcpy` does, unless its stream is capturing
    /// (the guest waits for every request during capture; the copy is captured, not run).
    pub(super) fn memcpy_mapped(&mut self, req: &Request) -> OpResult {
        let Some((dev, stream, (dst, src, size))) = self.device_copy_setup(req)? else {
            return ok();
        };
        self.drv.memcpy(dst, src, size, stream).map_err(on(dev))?;
        if req.header().flags & FLAG_ASYNC == 0 && !self.is_capturing(stream) {
            self.drv.stream_synchronize(stream).map_err(on(dev))?;
        }
        ok()
    }

    /// `MemcpyPeer`: both ranges checked on their own devices; `cuMemcpyPeerAsync` on the
    /// stream of the request's device.
    pub(super) fn memcpy_peer(&mut self, req: &Request) -> OpResult {
        let [dst, dst_dev, src, src_dev, size, stream, ..] = req.header().args;
        let (dst_dev, _) = self.gpu_index(dst_dev)?;
        let (src_dev, _) = self.gpu_index(src_dev)?;
        let dst_ctx = self.bind(dst_dev)?.ctx;
        let src_ctx = self.bind(src_dev)?.ctx;
        // The copy may be issued to a stream of any device (p2pBandwidthLatencyTest does).
        let (dev, stream) = self.copy_stream(req, stream)?;
        if size == 0 {
            return ok();
        }
        self.check_range(dst_dev, dst, size)?;
        self.check_range(src_dev, src, size)?;
        self.drv
            .memcpy_peer(dst, dst_ctx, src, src_ctx, to_usize(size)?, stream)
            .map_err(on(dev))?;
        if req.header().flags & FLAG_ASYNC == 0 {
            self.drv.stream_synchronize(stream).map_err(on(dev))?;
        }
        ok()
    }
}

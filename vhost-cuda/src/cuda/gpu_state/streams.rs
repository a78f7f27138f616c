//! Streams and events of the guest process, stream attributes, and host functions launched
//! into streams.

use super::*;

impl GpuState {
    /// A session stream by handle (not the legacy stream) and its device, whose context it
    /// binds.
    pub(super) fn bound_stream(&mut self, handle: u64) -> Result<(usize, Stream), Fault> {
        let (dev, raw) = self
            .streams
            .get(handle)
            .map(|s| (s.dev, s.raw))
            .ok_or(Fault::Status(status::INVALID_RESOURCE_HANDLE))?;
        self.bind(dev)?;
        Ok((dev, raw))
    }

    pub(super) fn stream_on(&self, handle: u64, dev: usize) -> Result<Stream, Fault> {
        if handle == 0 {
            return Ok(NULL_STREAM);
        }
        match self.streams.get(handle) {
            Some(s) if s.dev == dev => Ok(s.raw),
            _ => Err(status::INVALID_RESOURCE_HANDLE.into()),
        }
    }

    pub(super) fn stream_create(&mut self, req: &Request) -> OpResult {
        let flags = flags_u32(req.header().args[0], STREAM_NON_BLOCKING)?;
        let prio = priority(req.header().args[1])?;
        let dev = self.bind_new(req)?;
        if !self.streams.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.stream_create(flags, prio).map_err(on(dev))?;
        let got = match self.drv.stream_priority(raw) {
            Ok(p) => p,
            Err(err) => {
                let _ = self.drv.stream_destroy(raw);
                return Err(Fault::Driver { dev, err });
            }
        };
        let handle = self
            .streams
            .insert(
                &mut self.ids,
                StreamEntry {
                    dev,
                    raw,
                    flags,
                    priority: prio,
                    attributes: Vec::new(),
                },
            )
            .ok_or(status::MEMORY_ALLOCATION)?;
        // Its work may touch managed memory copied to the device just before.
        self.order_after_managed_copies(dev, raw);
        ok_rets(&[handle, int_ret(got)])
    }

    pub(super) fn stream_destroy(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = match self.streams.get(handle) {
            Some(s) => (s.dev, s.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        self.bind(dev)?;
        // Work still queued on it may touch managed memory: the legacy stream, which the
        // copies back to guest RAM wait for (managed.rs), waits for it from now on.
        self.managed_outlive_stream(dev, raw);
        let result = self.drv.stream_destroy(raw);
        self.streams.remove(handle);
        result.map_err(on(dev))?;
        ok()
    }

    /// StreamSynchronize and StreamQuery. Handle 0 is the legacy stream of the request's
    /// device.
    pub(super) fn stream_wait(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let (dev, raw) = if handle == 0 {
            let dev = self.device(req)?;
            if !self.bind_existing(dev)? {
                return ok();
            }
            (dev, NULL_STREAM)
        } else {
            let (dev, raw) = match self.streams.get(handle) {
                Some(s) => (s.dev, s.raw),
                None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
            };
            self.bind(dev)?;
            (dev, raw)
        };
        if req.op() == Op::StreamQuery {
            self.drv.stream_query(raw).map_err(on(dev))?;
        } else {
            self.drv.stream_synchronize(raw).map_err(on(dev))?;
        }
        ok()
    }

    pub(super) fn event(&self, handle: u64) -> Result<(usize, Event), Fault> {
        self.events
            .get(handle)
            .map(|e| (e.dev, e.raw))
            .ok_or(Fault::Status(status::INVALID_RESOURCE_HANDLE))
    }

    /// The event may belong to another device than the stream: waiting on it is how CUDA
    /// programs order work across devices.
    pub(super) fn stream_wait_event(&mut self, req: &Request) -> OpResult {
        let args = &req.header().args;
        let (_, event) = self.event(args[1])?;
        let flags = flags_u32(args[2], EVENT_WAIT_FLAGS)?;
        let (dev, stream) = self.copy_stream(req, args[0])?;
        self.drv
            .stream_wait_event(stream, event, flags)
            .map_err(on(dev))?;
        ok()
    }

    pub(super) fn event_create(&mut self, req: &Request) -> OpResult {
        let flags = flags_u32(req.header().args[0], EVENT_FLAGS)?;
        let dev = self.bind_new(req)?;
        if !self.events.has_room() {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.event_create(flags).map_err(on(dev))?;
        let handle = self
            .events
            .insert(
                &mut self.ids,
                EventEntry {
                    dev,
                    raw,
                    flags,
                    recorded: false,
                },
            )
            .ok_or(status::MEMORY_ALLOCATION)?;
        ok_rets(&[handle])
    }

    pub(super) fn event_destroy(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = self.event(handle)?;
        self.bind(dev)?;
        let result = self.drv.event_destroy(raw);
        self.events.remove(handle);
        result.map_err(on(dev))?;
        ok()
    }

    pub(super) fn event_record(&mut self, args: &[u64]) -> OpResult {
        let (dev, event) = self.event(args[0])?;
        let stream = self.stream_on(args[1], dev)?;
        self.bind(dev)?;
        self.drv.event_record(event, stream).map_err(on(dev))?;
        if let Some(e) = self.events.get_mut(args[0]) {
            e.recorded = true;
        }
        ok()
    }

    /// EventSynchronize and EventQuery.
    pub(super) fn event_wait(&mut self, req: &Request) -> OpResult {
        let (dev, event) = self.event(req.header().args[0])?;
        self.bind(dev)?;
        if req.op() == Op::EventQuery {
            self.drv.event_query(event).map_err(on(dev))?;
        } else {
            self.drv.event_synchronize(event).map_err(on(dev))?;
        }
        ok()
    }

    /// StreamSetAttribute: the attributes a stream has (a subset of the launch attributes),
    /// laid out by the launch-attribute rules (`launch.rs`).
    pub(super) fn stream_set_attribute(&mut self, req: &Request) -> OpResult {
        let bytes = req
            .inputs()
            .first()
            .ok_or(status::INVALID_VALUE)?
            .to_vec()
            .map_err(|_| status::INVALID_VALUE)?;
        let a = LaunchAttr::decode(&bytes).map_err(|_| status::INVALID_VALUE)?;
        if !STREAM_ATTRIBUTES.contains(&a.id) {
            return Err(status::INVALID_VALUE.into());
        }
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(req.header().args[0], dev)?;
        let value = DriverLaunchAttr::from_wire(&a, |_| None)?.value;
        self.drv
            .stream_set_attribute(stream, a.id, &value)
            .map_err(on(dev))?;
        if let Some(s) = self.streams.get_mut(req.header().args[0]) {
            s.attributes.retain(|&(id, _)| id != a.id);
            s.attributes.push((a.id, value));
        }
        ok()
    }

    /// StreamGetAttribute: the value back as a wire record.
    pub(super) fn stream_get_attribute(&mut self, req: &Request) -> OpResult {
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let id = u32::try_from(req.header().args[1]).map_err(|_| status::INVALID_VALUE)?;
        if !STREAM_ATTRIBUTES.contains(&id) || out.len() < LAUNCH_ATTR_SIZE {
            return Err(status::INVALID_VALUE.into());
        }
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(req.header().args[0], dev)?;
        let v = self.drv.stream_get_attribute(stream, id).map_err(on(dev))?;
        let u32_at = |at: usize| u32::from_le_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
        let u64_at = |at: usize| u64::from(u32_at(at)) | u64::from(u32_at(at + 4)) << 32;
        let mut rec = LaunchAttr {
            id,
            ..LaunchAttr::default()
        };
        match id {
            1 => {
                rec.w = [u64_at(0), u64_at(8)];
                rec.v = [u32_at(16), u32_at(20), u32_at(24)];
            }
            9 => rec.v = [u32::from(v[0]), u32::from(v[1]), 0],
            _ => rec.v[0] = u32_at(0),
        }
        out.write_at(0, &rec.encode())
            .map_err(|_| status::INVALID_VALUE)?;
        ok()
    }

    /// LaunchHostFunc: the guest's function runs in the guest when the stream reaches it (see
    /// host_functions.rs).
    pub(super) fn launch_host_func(&mut self, req: &Request) -> OpResult {
        let key = req.header().args[1];
        if key == 0 {
            return Err(status::INVALID_VALUE.into());
        }
        let dev = self.bind_new(req)?;
        let stream = self.stream_on(req.header().args[0], dev)?;
        if !self.host_functions.linked() {
            warn!(
                session = self.id,
                "host function launched without a host-function link"
            );
            return Err(status::NOT_SUPPORTED.into());
        }
        let capturing = self.drv.stream_is_capturing(stream).map_err(on(dev))?;
        let call = self
            .host_functions
            .call(key, !capturing)
            .ok_or(status::MEMORY_ALLOCATION)?;
        // SAFETY: a one-shot call lives until its run frees it; a captured one until the
        // session ends, after its contexts (and so its graphs) are destroyed.
        match unsafe { self.drv.launch_host_func(stream, trampoline, call) } {
            Ok(()) => {
                if capturing {
                    self.captured_calls.push(call as usize);
                }
                ok_rets(&[u64::from(capturing)])
            }
            Err(e) => {
                // SAFETY: the driver refused it, so it will never run.
                unsafe { HostFunctions::free(call) };
                Err(on(dev)(e))
            }
        }
    }

    pub(super) fn event_elapsed(&mut self, args: &[u64]) -> OpResult {
        let (dev, start) = self.event(args[0])?;
        let (end_dev, end) = self.event(args[1])?;
        if dev != end_dev {
            return Err(status::INVALID_RESOURCE_HANDLE.into());
        }
        self.bind(dev)?;
        let ms = self.drv.event_elapsed(start, end).map_err(on(dev))?;
        ok_rets(&[u64::from(ms.to_bits())])
    }
}

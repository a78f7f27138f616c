//! Modules, the JIT linker, functions, globals, kernel launches and occupancy queries.

use super::*;

/// The `CUjit_option`s that carry a plain value: every other one is a pointer or an output,
/// which the guest keeps (its log buffers, the wall time) or refuses.
pub(super) const VALUE_OPTIONS: &[u32] = &[
    0, 1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 23, 24, 29, 30, 31, 32, 33,
];
/// Most JIT options one request may carry.
pub(super) const MAX_OPTIONS: usize = 64;

impl GpuState {
    pub(super) fn module_load(&mut self, req: &Request) -> OpResult {
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let dev = self.bind_new(req)?;
        let image = ModuleImage::from_guest(buf)?;
        let loaded: u64 = self.modules.values().map(|m| m.bytes).sum();
        let bytes = buf.len() as u64;
        if !self.modules.has_room()
            || loaded.saturating_add(bytes) > self.host.tuning.max_module_bytes
        {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let raw = self.drv.module_load(image.as_bytes()).map_err(on(dev))?;
        debug!(session = self.id, dev, kind = ?image.kind(), len = buf.len(), "module loaded");
        let handle = self
            .modules
            .insert(
                &mut self.ids,
                ModuleEntry {
                    dev,
                    raw,
                    bytes,
                    image: image.image().into(),
                    globals: Vec::new(),
                },
            )
            .ok_or(status::MEMORY_ALLOCATION)?;
        ok_rets(&[handle])
    }

    pub(super) fn module_unload(&mut self, handle: u64) -> OpResult {
        let (dev, raw) = match self.modules.get(handle) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        self.bind(dev)?;
        let result = self.drv.module_unload(raw);
        // Forget the module even if the driver objected: its handle is no longer usable.
        self.modules.remove(handle);
        self.functions.retain(|f| f.module != handle);
        self.context(dev)?.memory.remove_module(handle);
        result.map_err(on(dev))?;
        ok()
    }

    /// `Link`: the driver's JIT linker over the guest's inputs. A link the driver refuses is
    /// answered in rets[3] (its `CUresult`) with its error log in the out-buffer, as
    /// `cuLinkComplete` reports it, rather than as a failed request.
    pub(super) fn link(&mut self, req: &Request) -> OpResult {
        const MAX_INPUTS: usize = 1024;
        let input = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let dev = self.bind_new(req)?;
        if input.len() as u64 > self.host.tuning.max_module_bytes {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let bytes = input.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let request = LinkRequest::decode(&bytes).ok_or(status::INVALID_VALUE)?;
        let options: Vec<(u32, u64)> = request.options().map(|o| (o.id, o.value)).collect();
        if options.len() > MAX_OPTIONS
            || options.iter().any(|(id, _)| !VALUE_OPTIONS.contains(id))
            || request.input_count() > MAX_INPUTS
        {
            return Err(status::INVALID_VALUE.into());
        }
        let mut names = Vec::with_capacity(request.input_count());
        for i in request.inputs() {
            if i.kind >= LINK_INPUT_TYPES || i.name.len() > MAX_NAME_LEN || i.data.is_empty() {
                return Err(status::INVALID_VALUE.into());
            }
            names.push(CString::new(i.name).map_err(|_| status::INVALID_VALUE)?);
        }
        let inputs: Vec<(u32, &std::ffi::CStr, &[u8])> = request
            .inputs()
            .zip(&names)
            .map(|(i, n)| (i.kind, n.as_c_str(), i.data))
            .collect();
        let (code, parts) = match self.drv.link(&options, &inputs) {
            Ok(o) => (0, [o.image, o.info_log, o.error_log]),
            Err((e, log)) => (u64::from(e.0), [Vec::new(), Vec::new(), log]),
        };
        debug!(session = self.id, dev, inputs = inputs.len(), code, "link");
        let total: usize = parts.iter().map(Vec::len).sum();
        if total <= out.len() {
            let mut at = 0;
            for p in &parts {
                out.write_at(at, p).map_err(|_| status::INVALID_VALUE)?;
                at += p.len();
            }
        }
        ok_rets(&[
            parts[0].len() as u64,
            parts[1].len() as u64,
            parts[2].len() as u64,
            code,
        ])
    }

    pub(super) fn module_function_names(&mut self, req: &Request) -> OpResult {
        let (dev, module) = match self.modules.get(req.header().args[0]) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        self.bind(dev)?;
        let names = self.drv.module_function_names(module).map_err(on(dev))?;
        let bytes: Vec<u8> = names
            .iter()
            .flat_map(|n| n.as_bytes_with_nul().iter().copied())
            .collect();
        if bytes.len() <= out.len() {
            out.write_at(0, &bytes).map_err(|_| status::INVALID_VALUE)?;
        }
        ok_rets(&[names.len() as u64, bytes.len() as u64])
    }

    pub(super) fn module_get_function(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let (dev, module) = match self.modules.get(handle) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        let name = symbol_name(req.inputs().first().ok_or(status::INVALID_VALUE)?)?;
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        self.bind(dev)?;
        let raw = self.drv.module_function(module, &name).map_err(on(dev))?;
        let (fh, layout) = match self.functions.find(|f| f.module == handle && f.raw == raw) {
            Some((fh, f)) => (fh, f.layout.clone()),
            None => {
                if !self.functions.has_room() {
                    return Err(status::MEMORY_ALLOCATION.into());
                }
                let layout = self.param_layout(dev, raw)?;
                let entry = FunctionEntry {
                    dev,
                    module: handle,
                    raw,
                    layout: layout.clone(),
                    name,
                    cache_config: None,
                    attributes: Vec::new(),
                    loaded: false,
                };
                let fh = self
                    .functions
                    .insert(&mut self.ids, entry)
                    .ok_or(status::MEMORY_ALLOCATION)?;
                (fh, layout)
            }
        };
        let fit = out.len() / PARAM_INFO_SIZE;
        let mut records = Vec::with_capacity(fit.min(layout.params().len()) * PARAM_INFO_SIZE);
        for p in layout.params().iter().take(fit) {
            records.extend_from_slice(&p.encode());
        }
        out.write_at(0, &records)
            .map_err(|_| status::INVALID_VALUE)?;
        ok_rets(&[fh, layout.params().len() as u64])
    }

    /// Asks the driver where each parameter of `func` sits, until it says there is no more.
    pub(super) fn param_layout(&self, dev: usize, func: Function) -> Result<ParamLayout, Fault> {
        let mut pairs = Vec::new();
        let mut loaded = false;
        while pairs.len() < MAX_PARAMS {
            match self.drv.function_param_info(func, pairs.len()) {
                Ok(p) => pairs.push(p),
                Err(CuError::INVALID_VALUE) => {
                    return ParamLayout::new(&pairs).ok_or(Fault::Status(status::UNKNOWN));
                }
                Err(CuError::FUNCTION_NOT_LOADED) if !loaded => {
                    // A lazily loaded module: load the function, then ask again.
                    self.drv.function_load(func).map_err(on(dev))?;
                    loaded = true;
                }
                Err(err) => return Err(Fault::Driver { dev, err }),
            }
        }
        warn!(
            session = self.id,
            "cuFuncGetParamInfo never reported the end of the list"
        );
        Err(status::UNKNOWN.into())
    }

    pub(super) fn module_get_global(&mut self, req: &Request) -> OpResult {
        let handle = req.header().args[0];
        let (dev, module) = match self.modules.get(handle) {
            Some(m) => (m.dev, m.raw),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        let name = symbol_name(req.inputs().first().ok_or(status::INVALID_VALUE)?)?;
        self.bind(dev)?;
        let (ptr, size) = self.drv.module_global(module, &name).map_err(on(dev))?;
        if let Some(m) = self.modules.get_mut(handle) {
            if !m.globals.iter().any(|(n, ..)| *n == name) {
                m.globals.push((name, ptr, size));
            }
        }
        if size > 0 {
            if let Err(e) = self.context(dev)?.memory.insert_global(ptr, size, handle) {
                warn!(
                    session = self.id,
                    ptr,
                    size,
                    ?e,
                    "module global not registered"
                );
            }
        }
        ok_rets(&[ptr, size])
    }

    pub(super) fn launch_kernel(&mut self, req: &Request) -> OpResult {
        let args = &req.header().args;
        let (dev, raw, layout) = match self.functions.get(args[0]) {
            Some(f) => (f.dev, f.raw, f.layout.clone()),
            None => return Err(status::INVALID_RESOURCE_HANDLE.into()),
        };
        self.bind(dev)?;
        let cfg = LaunchConfig::decode(args)?;
        let limits = self
            .host
            .gpus
            .get(dev)
            .ok_or(status::INVALID_DEVICE)?
            .limits;
        cfg.check(&limits)?;
        let stream = self.stream_on(args[5], dev)?;
        let block_buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        // Exactly the kernel's parameter block: guest-lib packs it to that length, and a block
        // of another size means the caller has the kernel's signature wrong.
        if block_buf.len() != layout.block_len() {
            return Err(status::INVALID_VALUE.into());
        }
        let mut block = AlignedBytes::zeroed(layout.block_len());
        block_buf
            .read_at(0, block.as_mut_slice())
            .map_err(|_| status::INVALID_VALUE)?;
        let mut params = layout.pointers(&mut block).ok_or(status::INVALID_VALUE)?;
        // SAFETY: `params` holds one pointer per kernel parameter (the driver's own layout for
        // this function), each into `block`, which is at least `block_len` long and outlives
        // the call; the driver copies the values before returning.
        if req.op() == Op::LaunchKernelEx {
            if args[6] != 0 {
                return Err(status::INVALID_VALUE.into());
            }
            let buf = req.inputs().get(1).ok_or(status::INVALID_VALUE)?;
            let attrs = launch_attrs(buf, &self.events, dev)?;
            if !attrs.is_empty() {
                self.note_launch_attributes();
            }
            // SAFETY: as above; `attrs` outlive the call.
            unsafe { self.drv.launch_ex(raw, &cfg, stream, &mut params, &attrs) }
                .map_err(on(dev))?;
            self.host.count_kernel();
            return ok();
        }
        let launched = match args[6] {
            // SAFETY: as above.
            0 => unsafe { self.drv.launch(raw, &cfg, stream, &mut params) },
            // SAFETY: as above.
            LAUNCH_COOPERATIVE => unsafe {
                self.drv.launch_cooperative(raw, &cfg, stream, &mut params)
            },
            _ => return Err(status::INVALID_VALUE.into()),
        };
        launched.map_err(on(dev))?;
        self.host.count_kernel();
        ok()
    }

    /// A function of the session, its context bound.
    pub(super) fn function(&mut self, handle: u64) -> Result<(usize, Function), Fault> {
        let (dev, raw) = match self.functions.get(handle) {
            Some(f) => (f.dev, f.raw),
            None => return Err(status::INVALID_DEVICE_FUNCTION.into()),
        };
        self.bind(dev)?;
        Ok((dev, raw))
    }

    /// [`Self::function`], loaded by the driver first the first time: the attribute and
    /// occupancy calls (cudaFuncGetAttributes, cuFuncGetAttribute, cudaFuncSetAttribute, the
    /// occupancy calculators) load a lazily loaded function, as they do natively, rather than
    /// leaving the load to its first launch.
    pub(super) fn loaded_function(&mut self, handle: u64) -> Result<(usize, Function), Fault> {
        let (dev, raw) = self.function(handle)?;
        if let Some(f) = self.functions.get_mut(handle) {
            if !f.loaded {
                self.drv.function_load(raw).map_err(on(dev))?;
                f.loaded = true;
            }
        }
        Ok((dev, raw))
    }

    pub(super) fn func_attributes(&mut self, req: &Request) -> OpResult {
        let (dev, raw) = self.loaded_function(req.header().args[0])?;
        let drv = Arc::clone(&self.drv);
        attribute_table(req, |attr| drv.func_attribute(raw, attr).map_err(on(dev)))
    }

    pub(super) fn func_set_attribute(&mut self, args: &[u64]) -> OpResult {
        let (dev, raw) = self.loaded_function(args[0])?;
        let attr = i32::try_from(args[1]).map_err(|_| status::INVALID_VALUE)?;
        let value = priority(args[2])?;
        self.drv
            .func_set_attribute(raw, attr, value)
            .map_err(on(dev))?;
        if let Some(f) = self.functions.get_mut(args[0]) {
            f.attributes.retain(|&(a, _)| a != attr);
            f.attributes.push((attr, value));
        }
        ok()
    }

    /// `OccupancyCluster`: cluster occupancy of a launch configuration with attributes.
    pub(super) fn occupancy_cluster(&mut self, req: &Request) -> OpResult {
        let args = &req.header().args;
        let (dev, raw) = self.loaded_function(args[0])?;
        let cfg = LaunchConfig::decode(args)?;
        let active = match args[6] {
            0 => false,
            1 => true,
            _ => return Err(status::INVALID_VALUE.into()),
        };
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let attrs = launch_attrs(buf, &self.events, dev)?;
        let n = self
            .drv
            .occupancy_cluster(raw, &cfg, &attrs, active)
            .map_err(on(dev))?;
        #[expect(
            clippy::cast_sign_loss,
            reason = "a cluster count, never negative; sign-extended as it always was"
        )]
        let n = n as u64;
        ok_rets(&[n])
    }

    pub(super) fn occupancy(&mut self, args: &[u64]) -> OpResult {
        let (dev, raw) = self.loaded_function(args[0])?;
        let block = i32::try_from(args[1]).map_err(|_| status::INVALID_VALUE)?;
        let flags = u32::try_from(args[3])
            .ok()
            .filter(|f| *f <= 1)
            .ok_or(status::INVALID_VALUE)?;
        let n = self
            .drv
            .occupancy_max_active_blocks(raw, block, to_usize(args[2])?, flags)
            .map_err(on(dev))?;
        #[expect(
            clippy::cast_sign_loss,
            reason = "a block count, never negative; sign-extended as it always was"
        )]
        let n = n as u64;
        ok_rets(&[n])
    }
}

//! `ModuleLoadLogged`: a module loaded as `cuModuleLoadDataEx` loads it, with the program's
//! value options and the JIT's info and error logs carried back, which a failed load answers
//! with its `CUresult` (the program reads the error log then).

use qcuda_proto::link::LinkRequest;

use super::{
    modules::{MAX_OPTIONS, VALUE_OPTIONS},
    *,
};

impl GpuState {
    pub(super) fn module_load_logged(&mut self, req: &Request) -> OpResult {
        let buf = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let opts = req.inputs().get(1).ok_or(status::INVALID_VALUE)?;
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        let dev = self.bind_new(req)?;
        if opts.len() > LINK_OPTIONS_MAX {
            return Err(status::INVALID_VALUE.into());
        }
        let opts = opts.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let request = LinkRequest::decode(&opts).ok_or(status::INVALID_VALUE)?;
        let options: Vec<(u32, u64)> = request.options().map(|o| (o.id, o.value)).collect();
        if request.input_count() != 0
            || options.len() > MAX_OPTIONS
            || options.iter().any(|(id, _)| !VALUE_OPTIONS.contains(id))
        {
            return Err(status::INVALID_VALUE.into());
        }
        let image = ModuleImage::from_guest(buf)?;
        let loaded: u64 = self.modules.values().map(|m| m.bytes).sum();
        let bytes = buf.len() as u64;
        if !self.modules.has_room()
            || loaded.saturating_add(bytes) > self.host.tuning.max_module_bytes
        {
            return Err(status::MEMORY_ALLOCATION.into());
        }
        let (result, logs) = self.drv.module_load_logged(image.as_bytes(), &options);
        let (handle, code) = match result {
            Ok(raw) => {
                let h = self
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
                    .ok_or(status::MEMORY_ALLOCATION);
                match h {
                    Ok(h) => (h, 0),
                    Err(e) => {
                        let _ = self.drv.module_unload(raw);
                        return Err(e.into());
                    }
                }
            }
            // What the JIT or the loader refused comes back with its logs; any other error
            // (a lost context, no memory) is the request's, as for `ModuleLoad`.
            Err(e) if LOAD_ERRORS.contains(&e.0) => (0, u64::from(e.0)),
            Err(e) => return Err(on(dev)(e)),
        };
        debug!(
            session = self.id,
            dev,
            code,
            len = buf.len(),
            "module loaded with logs"
        );
        let info = &logs.info[..logs.info.len().min(out.len())];
        let room = out.len() - info.len();
        let error = &logs.error[..logs.error.len().min(room)];
        out.write_at(0, info).map_err(|_| status::INVALID_VALUE)?;
        out.write_at(info.len(), error)
            .map_err(|_| status::INVALID_VALUE)?;
        ok_rets(&[handle, info.len() as u64, error.len() as u64, code])
    }
}

/// Largest options buffer: MAX_OPTIONS records and the header.
const LINK_OPTIONS_MAX: usize =
    qcuda_proto::link::LINK_HEADER + MAX_OPTIONS * qcuda_proto::link::LINK_OPTION;

/// The `CUresult`s of an image the JIT or the loader refused: invalid value, invalid image, no
/// binary for the GPU, invalid PTX, JIT compiler not found, unsupported PTX version, JIT
/// compilation disabled, unsupported device-side sync, invalid source, file not found, shared
/// object symbol not found, shared object init failed.
const LOAD_ERRORS: &[u32] = &[1, 200, 209, 218, 221, 222, 223, 224, 300, 301, 302, 303];

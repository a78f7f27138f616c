//! JIT linking (`cuLink*`): the guest gathers the inputs and options, and the host's driver
//! links them in one `Link` request at `cuLinkComplete`. The linked image stays in the guest,
//! owned by the link state, as the driver's own does; it loads like any other image.

use core::ffi::{c_char, c_uint, c_void, CStr};
use std::{
    collections::HashSet,
    sync::{atomic::AtomicBool, Mutex, PoisonError},
    time::Instant,
};

use qcuda_proto::{
    link::{encode_link, LinkInput, LinkOption, LINK_INPUT_TYPES},
    Op,
};

use super::initialized;
use crate::core::runtime::context;
use crate::{
    core::runtime::runtime,
    core::transport::Call,
    core::warnings::warn_first,
    driver::status::{DriverError, DrvResult},
    generated::driver_api as d,
};

/// The `CUjit_option`s that carry a plain value, which travel to the host's linker as they
/// are; the log buffers and the wall time are answered here; the others (symbol tables and
/// kernel lists, which hold guest pointers) are not supported.
pub(super) const VALUE_OPTIONS: &[u32] = &[
    0, 1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 23, 24, 29, 30, 31, 32, 33,
];

/// A caller's log buffer and the option slot its size came in (the driver writes back the
/// bytes it used there).
pub(super) struct Log {
    pub(super) buf: *mut u8,
    pub(super) size: usize,
    pub(super) size_slot: *mut *mut c_void,
}

/// One `CUlinkState`.
struct LinkState {
    device: u32,
    options: Vec<LinkOption>,
    info: Option<Log>,
    error: Option<Log>,
    wall_time: Option<*mut *mut c_void>,
    inputs: Vec<(u32, Vec<u8>, Vec<u8>)>,
    image: Vec<u8>,
}

impl LinkState {
    /// The info (`true`) or error log's record, made empty on first mention.
    fn log(&mut self, info: bool) -> &mut Log {
        let log = if info {
            &mut self.info
        } else {
            &mut self.error
        };
        log.get_or_insert(Log {
            buf: std::ptr::null_mut(),
            size: 0,
            size_slot: std::ptr::null_mut(),
        })
    }
}

/// The live link states, by address.
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn with_live<T>(f: impl FnOnce(&mut HashSet<usize>) -> T) -> T {
    f(LIVE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashSet::new))
}

/// The link state behind `state`, if it is one of ours and alive.
fn state_of<'a>(state: d::CUlinkState) -> DrvResult<&'a mut LinkState> {
    if state.is_null() || !with_live(|l| l.contains(&(state as usize))) {
        return Err(DriverError::INVALID_HANDLE);
    }
    // SAFETY: a live state made by `create` and not yet destroyed; the API does not allow two
    // threads to use one link state at once.
    Ok(unsafe { &mut *state.cast::<LinkState>() })
}

/// Writes `text` into a caller's log buffer (truncated, NUL-terminated) and the bytes used
/// into its size slot.
pub(super) fn fill_log(log: Option<&Log>, text: &[u8]) {
    let Some(log) = log else { return };
    if log.buf.is_null() || log.size == 0 {
        return;
    }
    let n = text.len().min(log.size - 1);
    // SAFETY: the caller's buffer holds `size` bytes (API contract).
    unsafe {
        log.buf.copy_from_nonoverlapping(text.as_ptr(), n);
        log.buf.add(n).write(0);
    }
    if !log.size_slot.is_null() {
        // SAFETY: the caller's option value slot, which the driver also writes back.
        unsafe { log.size_slot.write((n + 1) as *mut c_void) };
    }
}

/// # Safety
/// `options`/`values` must hold `n` entries when `n > 0` and not null.
unsafe fn create(
    n: c_uint,
    options: *const d::CUjit_option,
    values: *mut *mut c_void,
    state_out: *mut d::CUlinkState,
) -> DrvResult<()> {
    static POINTER_OPTION: AtomicBool = AtomicBool::new(false);
    initialized()?;
    let ctx = context::require_current()?;
    if state_out.is_null() || (n > 0 && (options.is_null() || values.is_null())) {
        return Err(DriverError::INVALID_VALUE);
    }
    let mut state = LinkState {
        device: ctx.device,
        options: Vec::new(),
        info: None,
        error: None,
        wall_time: None,
        inputs: Vec::new(),
        image: Vec::new(),
    };
    for i in 0..n as usize {
        // SAFETY: `n` entries (caller's contract).
        let (opt, slot) = unsafe { (*options.add(i), values.add(i)) };
        // SAFETY: as above.
        let value = unsafe { *slot };
        match opt {
            d::CU_JIT_WALL_TIME => state.wall_time = Some(slot),
            d::CU_JIT_INFO_LOG_BUFFER | d::CU_JIT_ERROR_LOG_BUFFER => {
                state.log(opt == d::CU_JIT_INFO_LOG_BUFFER).buf = value.cast();
            }
            d::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES | d::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES => {
                let l = state.log(opt == d::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
                l.size = value as usize;
                l.size_slot = slot;
            }
            o if VALUE_OPTIONS.contains(&o) => state.options.push(LinkOption {
                id: o,
                value: value as usize as u64,
            }),
            o => {
                warn_first(
                    &POINTER_OPTION,
                    format_args!("cuLinkCreate: JIT option {o} is not supported"),
                );
                return Err(DriverError::NOT_SUPPORTED);
            }
        }
    }
    for log in [&state.info, &state.error].into_iter().flatten() {
        fill_log(Some(log), b"");
    }
    let handle = Box::into_raw(Box::new(state));
    with_live(|l| l.insert(handle as usize));
    // SAFETY: checked non-null.
    unsafe { state_out.write_unaligned(handle.cast()) };
    Ok(())
}

fn add(
    state: d::CUlinkState,
    kind: d::CUjitInputType,
    data: Vec<u8>,
    name: &[u8],
) -> DrvResult<()> {
    let s = state_of(state)?;
    if kind >= LINK_INPUT_TYPES || data.is_empty() {
        return Err(DriverError::INVALID_VALUE);
    }
    s.inputs.push((kind, name.to_vec(), data));
    Ok(())
}

/// # Safety
/// `name` must be null or NUL-terminated.
unsafe fn name_bytes<'a>(name: *const c_char) -> &'a [u8] {
    if name.is_null() {
        b""
    } else {
        // SAFETY: NUL-terminated (caller's contract).
        unsafe { CStr::from_ptr(name) }.to_bytes()
    }
}

fn complete(state: d::CUlinkState, cubin: *mut *mut c_void, size: *mut usize) -> DrvResult<()> {
    let s = state_of(state)?;
    if cubin.is_null() || size.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    let rt = runtime()?;
    let started = Instant::now();
    let inputs: Vec<LinkInput<'_>> = s
        .inputs
        .iter()
        .map(|(kind, name, data)| LinkInput {
            kind: *kind,
            name,
            data,
        })
        .collect();
    let mut request = Vec::new();
    encode_link(&s.options, &inputs, |b| request.extend_from_slice(b))
        .ok_or(DriverError::INVALID_VALUE)?;
    let input_bytes: usize = s.inputs.iter().map(|i| i.2.len()).sum();
    let mut out = vec![0u8; input_bytes.saturating_mul(4).max(256 << 10)];
    let rets = loop {
        let reply = rt.session.submit(
            Call::new(Op::Link, s.device)
                .input(&request)
                .output(&mut out),
        )?;
        let need: u64 = reply.rets[..3].iter().sum();
        let need = crate::core::conv::usize_of(need);
        if need <= out.len() {
            break reply.rets;
        }
        if need > 1 << 30 {
            return Err(DriverError::UNKNOWN);
        }
        out = vec![0u8; need];
    };
    let [image, info, error] = [0, 1, 2].map(|i| crate::core::conv::usize_of(rets[i]));
    fill_log(s.info.as_ref(), &out[image..image + info]);
    fill_log(s.error.as_ref(), &out[image + info..image + info + error]);
    if let Some(slot) = s.wall_time {
        let ms = started.elapsed().as_secs_f32() * 1000.0;
        // SAFETY: the caller's option value slot; the driver writes a float into it.
        unsafe { slot.cast::<f32>().write_unaligned(ms) };
    }
    DriverError::check(d::CUresult::try_from(rets[3]).unwrap_or(d::CUDA_ERROR_UNKNOWN))?;
    out.truncate(image);
    s.image = out;
    // SAFETY: both checked non-null; the image lives until cuLinkDestroy.
    unsafe {
        cubin.write_unaligned(s.image.as_mut_ptr().cast());
        size.write_unaligned(s.image.len());
    }
    Ok(())
}

driver_api! {
    /// `cuLinkCreate_v2`.
    fn cuLinkCreate_v2(
        numOptions: c_uint,
        options: *mut d::CUjit_option,
        optionValues: *mut *mut c_void,
        stateOut: *mut d::CUlinkState,
    ) {
        // SAFETY: the API's contract for the option arrays.
        unsafe { create(numOptions, options, optionValues, stateOut) }
    }

    /// `cuLinkCreate` (the CUDA 5.5 symbol, the same call).
    #[no_prototype = "cuda.h maps cuLinkCreate to _v2"]
    fn cuLinkCreate(
        numOptions: c_uint,
        options: *mut d::CUjit_option,
        optionValues: *mut *mut c_void,
        stateOut: *mut d::CUlinkState,
    ) {
        // SAFETY: as above.
        unsafe { create(numOptions, options, optionValues, stateOut) }
    }

    /// `cuLinkAddData_v2`: the image is copied; per-input options are compiler hints.
    fn cuLinkAddData_v2(
        state: d::CUlinkState,
        type_: d::CUjitInputType,
        data: *mut c_void,
        size: usize,
        name: *const c_char,
        numOptions: c_uint,
        options: *mut d::CUjit_option,
        optionValues: *mut *mut c_void,
    ) {
        let _ = (numOptions, options, optionValues);
        if data.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: `data` holds `size` bytes, `name` is null or NUL-terminated (API contract).
        let (bytes, name) = unsafe {
            (std::slice::from_raw_parts(data.cast::<u8>(), size).to_vec(), name_bytes(name))
        };
        add(state, type_, bytes, name)
    }

    /// `cuLinkAddData`.
    #[no_prototype = "cuda.h maps cuLinkAddData to _v2"]
    fn cuLinkAddData(
        state: d::CUlinkState,
        type_: d::CUjitInputType,
        data: *mut c_void,
        size: usize,
        name: *const c_char,
        numOptions: c_uint,
        options: *mut d::CUjit_option,
        optionValues: *mut *mut c_void,
    ) {
        // SAFETY: forwarded API contract.
        DriverError::check(unsafe {
            cuLinkAddData_v2(state, type_, data, size, name, numOptions, options, optionValues)
        })
    }

    /// `cuLinkAddFile_v2`: the file is read in the guest (PTX gets its NUL).
    fn cuLinkAddFile_v2(
        state: d::CUlinkState,
        type_: d::CUjitInputType,
        path: *const c_char,
        numOptions: c_uint,
        options: *mut d::CUjit_option,
        optionValues: *mut *mut c_void,
    ) {
        use std::os::unix::ffi::OsStrExt;
        let _ = (numOptions, options, optionValues);
        state_of(state)?;
        if path.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: NUL-terminated (API contract).
        let name = unsafe { CStr::from_ptr(path) }.to_bytes();
        let mut bytes = std::fs::read(std::ffi::OsStr::from_bytes(name))
            .map_err(|_| DriverError::FILE_NOT_FOUND)?;
        if type_ == d::CU_JIT_INPUT_PTX && bytes.last() != Some(&0) {
            bytes.push(0);
        }
        add(state, type_, bytes, name)
    }

    /// `cuLinkAddFile`.
    #[no_prototype = "cuda.h maps cuLinkAddFile to _v2"]
    fn cuLinkAddFile(
        state: d::CUlinkState,
        type_: d::CUjitInputType,
        path: *const c_char,
        numOptions: c_uint,
        options: *mut d::CUjit_option,
        optionValues: *mut *mut c_void,
    ) {
        // SAFETY: forwarded API contract.
        DriverError::check(unsafe {
            cuLinkAddFile_v2(state, type_, path, numOptions, options, optionValues)
        })
    }

    /// `cuLinkComplete`: the host's driver links; the image belongs to the link state.
    fn cuLinkComplete(state: d::CUlinkState, cubinOut: *mut *mut c_void, sizeOut: *mut usize) {
        complete(state, cubinOut, sizeOut)
    }

    /// `cuLinkDestroy`.
    fn cuLinkDestroy(state: d::CUlinkState) {
        state_of(state)?;
        with_live(|l| l.remove(&(state as usize)));
        // SAFETY: a live state made by `create`, removed from the live set above.
        drop(unsafe { Box::from_raw(state.cast::<LinkState>()) });
        Ok(())
    }
}

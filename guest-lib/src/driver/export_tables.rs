//! `cuGetExportTable`: the driver's private function tables that NVIDIA's runtime (shared or
//! static) and libraries take by UUID.
//!
//! The tables are undocumented. What each slot does was established from public
//! reimplementations and measured against NVIDIA's driver 580 (docs/driver-export-tables.md
//! lists the sources and measurements). Each table here has the size NVIDIA's driver 580
//! reports in its first word, so callers that check it are satisfied, and every function slot
//! holds one of:
//! - an implementation in the guest, where the slot only concerns guest state (context-local
//!   storage, the tools hooks, the integrity check, which must be computed over this process's
//!   own view) or maps onto the driver face (primary contexts, module loading);
//! - a stub that logs the table and slot once and returns `CUDA_ERROR_NOT_SUPPORTED`, for the
//!   slots no measured program calls. None is left null, so nothing jumps to address 0.
//!
//! An unknown UUID fails with `CUDA_ERROR_INVALID_VALUE` and one log line, as NVIDIA's driver
//! answers tables it does not have.
#![allow(non_snake_case)] // cuGetExportTable keeps CUDA's parameter names

use core::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::AtomicBool;

use hmac::{Hmac, Mac};

use super::{
    api::{device_identity, driver_version_value},
    modules,
    status::{DriverError, DrvResult},
};
use crate::core::runtime::context;
use crate::{core::modules::fatbin, core::warnings::warn_first, generated::driver_api as d};

driver_api! {
    /// `cuGetExportTable`.
    fn cuGetExportTable(ppExportTable: *mut *const c_void, pExportTableId: *const d::CUuuid) {
        if ppExportTable.is_null() || pExportTableId.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: a CUuuid is 16 bytes (checked non-null above).
        let id = unsafe { &*pExportTableId.cast::<[u8; 16]>() };
        let table = get(id);
        // SAFETY: checked non-null.
        unsafe { ppExportTable.write_unaligned(*table.as_ref().unwrap_or(&std::ptr::null())) };
        table.map(drop)
    }
}

/// A table as the driver hands it out: words, function pointers among them.
#[repr(C)]
#[derive(Debug)]
pub struct Table<const N: usize>(pub [*const c_void; N]);

// SAFETY: the tables are immutable statics of function addresses and integers.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn address(&'static self) -> *const c_void {
        std::ptr::from_ref(self).cast()
    }
}

/// The tables by index, for the stubs' log lines.
const TABLE_NAMES: [&str; 10] = [
    "6bd5fb6c", "263e8860", "42d85a81", "a094798c", "d4082055", "f8cff951", "21318c60", "6e163fbe",
    "c693336e", "1734dc26",
];
const RT: usize = 0;
const CC: usize = 1;
const TLS: usize = 2;
const HOOKS: usize = 3;
const IC: usize = 4;
const REQ: usize = 5;
const CTX_EXT: usize = 6;
const FN_EXT: usize = 7;
const LT_EXT: usize = 9;

/// Which stubs have said so already: one line per table and slot.
static STUB_SEEN: [[AtomicBool; 128]; 10] = [const { [const { AtomicBool::new(false) }; 128] }; 10];

/// The stub of slot `S` of table `T`: no measured program calls it, so it logs the table and
/// slot once and returns `CUDA_ERROR_NOT_SUPPORTED`.
extern "C" fn unused<const T: usize, const S: usize>() -> d::CUresult {
    warn_first(
        &STUB_SEEN[T][S],
        format_args!("export table {} slot {S} is not supported", TABLE_NAMES[T]),
    );
    d::CUDA_ERROR_NOT_SUPPORTED
}

/// A table of `N` words, every slot a stub of table `$t` and word 0 its size in bytes; the
/// slots qcuda implements are set over it.
macro_rules! stub_table {
    ($t:expr, $n:literal; $($slot:literal)*) => {{
        let mut words: [*const c_void; $n] = [std::ptr::null(); $n];
        $(words[$slot] = unused::<{ $t }, $slot> as *const c_void;)*
        words[0] = ($n * 8) as *const c_void;
        words
    }};
}

// ----- 6bd5fb6c-5bf4e74a-8987d939-12fd9df9: the runtime interface ------------------------------

/// Slot 1: a module from the fatbin wrapper that `__cudaRegisterFatBinary` receives.
unsafe extern "C" fn rt_module_from_wrapper(
    out: *mut usize,
    wrapper: *const c_void,
) -> d::CUresult {
    // SAFETY: the runtime passes its registered wrapper, as for `__cudaRegisterFatBinary`.
    super::status::finish(unsafe { load_wrapper(out, wrapper) })
}

unsafe fn load_wrapper(out: *mut usize, wrapper: *const c_void) -> DrvResult<()> {
    if out.is_null() || wrapper.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: a registered wrapper (caller's contract).
    let image =
        unsafe { fatbin::image_from_wrapper(wrapper) }.map_err(|_| DriverError::INVALID_IMAGE)?;
    let module = modules::load(image)?;
    // SAFETY: checked non-null; the caller provides the out-parameter.
    unsafe { out.write_unaligned(module) };
    Ok(())
}

/// `6bd5fb6c[2]`, traced (`QCUDA_DRIVER_TRACE`).
unsafe extern "C" fn rt_primary_context(out: *mut usize, device: c_int) -> d::CUresult {
    // SAFETY: the same contract.
    let code = unsafe { rt_primary_context_impl(out, device) };
    super::trace::call("export table 6bd5fb6c[2]", code);
    code
}

/// Slot 2: the primary context of a device, without retaining or activating it.
unsafe fn rt_primary_context_impl(out: *mut usize, device: c_int) -> d::CUresult {
    super::status::finish((|| {
        if out.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let device = super::api::check_device(device)?;
        // SAFETY: checked non-null; the caller provides the out-parameter.
        unsafe { out.write_unaligned(context::primary(device).handle()) };
        Ok(())
    })())
}

/// Slot 6: slot 1 with three more arguments, seen null, null, 0 in every trace.
unsafe extern "C" fn rt_module_from_wrapper_ext(
    out: *mut usize,
    wrapper: *const c_void,
    _a3: *const c_void,
    _a4: *const c_void,
    _a5: c_uint,
) -> d::CUresult {
    // SAFETY: as for slot 1.
    super::status::finish(unsafe { load_wrapper(out, wrapper) })
}

/// Slot 7: the runtime letting go of a registered image. Its modules stay loaded until the
/// runtime unloads them or the session ends, as with NVIDIA's driver.
extern "C" fn rt_release_image(_: usize) {}

/// Slot 8: a module from a bare fatbin header (image first, then the out-parameter).
unsafe extern "C" fn rt_module_from_fatbin(
    header: *const c_void,
    out: *mut usize,
    _a3: *const c_void,
    _a4: *const c_void,
    _a5: c_uint,
) -> d::CUresult {
    super::status::finish((|| {
        if out.is_null() || header.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: the runtime passes an embedded fatbin.
        let image = unsafe { modules::image_at(header) }?;
        let module = modules::load(image)?;
        // SAFETY: checked non-null.
        unsafe { out.write_unaligned(module) };
        Ok(())
    })())
}

/// Slot 12: "load the compilers" (PTX JIT and friends). The host's driver compiles what the
/// guest loads, so there is nothing to load here.
extern "C" fn rt_load_compilers() -> d::CUresult {
    d::CUDA_SUCCESS
}

static RUNTIME_INTERFACE: Table<13> = Table({
    let mut t = stub_table!(RT, 13; 1 2 3 4 5 6 7 8 9 10 11 12);
    t[1] = rt_module_from_wrapper as *const c_void;
    t[2] = rt_primary_context as *const c_void;
    t[6] = rt_module_from_wrapper_ext as *const c_void;
    t[7] = rt_release_image as *const c_void;
    t[8] = rt_module_from_fatbin as *const c_void;
    t[12] = rt_load_compilers as *const c_void;
    t
});

// ----- 263e8860-7cd26143-92f6bbd5-006dfa7e: context checks -------------------------------------

/// Slot 2: whether a context is of a special kind. qcuda has only plain contexts: 0, and the
/// third argument left alone (NVIDIA's driver 580 writes nothing there for plain contexts).
unsafe extern "C" fn cc_context_kind(
    _ctx: usize,
    kind: *mut u32,
    _wrapped: *mut *const c_void,
) -> d::CUresult {
    if !kind.is_null() {
        // SAFETY: caller-provided out-parameter.
        unsafe { kind.write_unaligned(0) };
    }
    d::CUDA_SUCCESS
}

/// Slot 3: a process-wide check answered with a plain 0 (no special mode in effect).
extern "C" fn cc_mode() -> u32 {
    0
}

static CONTEXT_CHECKS: Table<15> = Table({
    let mut t = stub_table!(CC, 15; 1 2 3 4 5 6 7 8 9 10 11 12 13 14);
    t[2] = cc_context_kind as *const c_void;
    t[3] = cc_mode as *const c_void;
    t
});

// ----- 42d85a81-23f6cb47-8298f6e7-8a3aecdc: tools thread-local state -----------------------------

/// `42d85a81[2]`, traced (`QCUDA_DRIVER_TRACE`).
unsafe extern "C" fn tls_current_context(out: *mut usize) -> d::CUresult {
    // SAFETY: the same contract.
    let code = unsafe { tls_current_context_impl(out) };
    super::trace::call("export table 42d85a81[2]", code);
    code
}

/// Slot 2: the calling thread's current context (null when it has none), as `cuCtxGetCurrent`.
unsafe fn tls_current_context_impl(out: *mut usize) -> d::CUresult {
    if out.is_null() {
        return d::CUDA_ERROR_INVALID_VALUE;
    }
    let ctx = context::current().map_or(0, context::Context::handle);
    // SAFETY: checked non-null.
    unsafe { out.write_unaligned(ctx) };
    d::CUDA_SUCCESS
}

static TOOLS_TLS: Table<3> = Table({
    let mut t = stub_table!(TLS, 3; 1 2);
    t[2] = tls_current_context as *const c_void;
    t
});

// ----- a094798c-2e742e74-93f20800-200c0a66: tools callback hooks --------------------------------

/// The tools' callback switchboards: all zero, since no profiler or debugger is attached in
/// the guest. The runtime reads them; nothing writes them.
static HOOKS_A: [u64; 1024] = [0; 1024];
static HOOKS_B: [u64; 14] = [0; 14];

fn hand_out(buf: *mut *const c_void, size: *mut usize, table: &'static [u64]) -> *const c_void {
    if !buf.is_null() {
        // SAFETY: caller-provided out-parameter.
        unsafe { buf.write_unaligned(table.as_ptr().cast()) };
    }
    if !size.is_null() {
        // SAFETY: caller-provided out-parameter.
        unsafe { size.write_unaligned(table.len()) };
    }
    table.as_ptr().cast()
}

/// Slots 1 and 4: notifications to attached tools; there are none.
extern "C" fn hook_notify(_: usize, _: usize) {}
/// Slot 2: the first switchboard (also returned, as NVIDIA's driver does).
extern "C" fn hook_board_a(buf: *mut *const c_void, size: *mut usize) -> *const c_void {
    hand_out(buf, size, &HOOKS_A)
}
/// Slot 6: the second switchboard.
extern "C" fn hook_board_b(buf: *mut *const c_void, size: *mut usize) -> *const c_void {
    hand_out(buf, size, &HOOKS_B)
}

static TOOLS_HOOKS: Table<7> = Table({
    let mut t = stub_table!(HOOKS, 7; 1 2 3 4 5 6);
    t[1] = hook_notify as *const c_void;
    t[2] = hook_board_a as *const c_void;
    t[4] = hook_notify as *const c_void;
    t[6] = hook_board_b as *const c_void;
    t
});

// ----- c693336e-1121df11-a8c368f3-55d89593: context-local storage (no size word) ---------------

unsafe extern "C" fn cls_put(
    ctx: usize,
    key: usize,
    value: usize,
    dtor: context::StorageDtor,
) -> d::CUresult {
    super::status::finish(context::storage_put(ctx, key, value, dtor).map_err(Into::into))
}

extern "C" fn cls_delete(ctx: usize, key: usize) -> d::CUresult {
    super::status::finish(context::storage_delete(ctx, key).map_err(Into::into))
}

unsafe extern "C" fn cls_get(out: *mut usize, ctx: usize, key: usize) -> d::CUresult {
    if out.is_null() {
        return d::CUDA_ERROR_INVALID_VALUE;
    }
    let result = context::storage_get(ctx, key);
    // SAFETY: checked non-null.
    unsafe { out.write_unaligned(*result.as_ref().unwrap_or(&0)) };
    super::status::finish(result.map(drop).map_err(Into::into))
}

static CONTEXT_STORAGE: Table<4> = Table([
    cls_put as *const c_void,
    cls_delete as *const c_void,
    cls_get as *const c_void,
    std::ptr::null(),
]);

// ----- d4082055-bde6704b-8d34ba12-3c66e1f2: the integrity check ----------------------------------

/// The key of the runtime's keyed hash over the driver's view of the process.
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

/// What the integrity hash covers, all as this process sees it.
#[derive(Debug, Clone)]
pub struct IntegrityInput {
    /// What `cuDriverGetVersion` reports.
    pub driver_version: u32,
    /// The caller's `version` argument.
    pub version: u32,
    /// `getpid()`.
    pub pid: u32,
    /// The low half of `pthread_self()`.
    pub thread: u32,
    /// The runtime interface table's address as handed out.
    pub runtime_table: u64,
    /// This table's address as handed out.
    pub integrity_table: u64,
    /// The check function's address (its slot).
    pub function: u64,
    /// The caller's `unix_seconds` argument.
    pub seconds: u64,
    /// Per device: UUID, PCI domain, bus and device, as the driver face reports them.
    pub devices: Vec<super::api::DeviceIdentity>,
}

/// The keyed hash the runtime compares with its own (HMAC-MD2 over the little-endian fields).
pub fn integrity_digest(input: &IntegrityInput) -> [u64; 2] {
    let mut mac = Hmac::<md2::Md2>::new_from_slice(&INTEGRITY_KEY).expect("any key length");
    for word in [input.driver_version, input.version, input.pid, input.thread] {
        mac.update(&word.to_le_bytes());
    }
    for word in [
        input.runtime_table,
        input.integrity_table,
        input.function,
        input.seconds,
    ] {
        mac.update(&word.to_le_bytes());
    }
    for (uuid, domain, bus, device) in &input.devices {
        mac.update(uuid);
        for v in [domain, bus, device] {
            mac.update(&v.to_le_bytes());
        }
    }
    let digest = mac.finalize().into_bytes();
    let half = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&digest[i..i + 8]);
        u64::from_le_bytes(b)
    };
    [half(0), half(8)]
}

/// `d4082055[1]`, traced (`QCUDA_DRIVER_TRACE`).
unsafe extern "C" fn integrity_check(
    version: u32,
    seconds: u64,
    out: *mut [u64; 2],
) -> d::CUresult {
    // SAFETY: the same contract.
    let code = unsafe { integrity_check_impl(version, seconds, out) };
    super::trace::call("export table d4082055[1]", code);
    code
}

/// Slot 1: the check itself.
unsafe fn integrity_check_impl(version: u32, seconds: u64, out: *mut [u64; 2]) -> d::CUresult {
    if out.is_null() {
        return d::CUDA_ERROR_INVALID_VALUE;
    }
    // Protocol digits 0 and 1 have fixed answers.
    let fixed = |b7: u64| [0x0041_181C_03CB_675C | (b7 << 56), 0x8ED3_83AA_1F4C_D1E8];
    let value = match version % 10 {
        0 => fixed(0x33),
        1 => fixed(0x18),
        _ => {
            let Ok(devices) = device_identity() else {
                return d::CUDA_ERROR_NOT_INITIALIZED;
            };
            integrity_digest(&IntegrityInput {
                driver_version: driver_version_value().unwrap_or(0),
                version,
                // SAFETY: getpid and pthread_self have no preconditions.
                pid: unsafe { libc::getpid() }.cast_unsigned(),
                // SAFETY: as above. The runtime hashes the low half of the thread handle.
                thread: crate::core::conv::low_u32(unsafe { libc::pthread_self() }),
                runtime_table: RUNTIME_INTERFACE.address() as u64,
                integrity_table: INTEGRITY.address() as u64,
                function: integrity_check as *const () as u64,
                seconds,
                devices,
            })
        }
    };
    // SAFETY: checked non-null; the caller passes room for two words.
    unsafe { out.write_unaligned(value) };
    d::CUDA_SUCCESS
}

static INTEGRITY: Table<3> = Table({
    let mut t = stub_table!(IC, 3; 1 2);
    t[1] = integrity_check as *const c_void;
    t
});

// ----- f8cff951-21468b4e-b9e2fb46-9e7c0dd9 ------------------------------------------------------

/// Slot 1: a message from a library to the driver's log (NVIDIA's runtime reports duplicate
/// kernel names through it, cuDNN other notes). NVIDIA's driver prints none of them, so neither
/// does qcuda: they are lines of `QCUDA_DRIVER_TRACE=1`.
unsafe extern "C" fn req_log(
    domain: *const core::ffi::c_char,
    _severity: c_int,
    format: *const core::ffi::c_char,
) {
    let text = |p: *const core::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: the library passes NUL-terminated strings.
            unsafe { core::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        }
    };
    if super::trace::enabled() {
        super::trace::log(format_args!(
            "driver log from {}: {}",
            text(domain),
            text(format)
        ));
    }
}

static REQUIREMENTS: Table<3> = Table({
    let mut t = stub_table!(REQ, 3; 1 2);
    t[1] = req_log as *const c_void;
    t
});

// ----- 21318c60-97143248-8ca641ff-7324c8f2: context and stream identities (cuBLAS, cuFFT) ------

/// `21318c60[4]`, traced (`QCUDA_DRIVER_TRACE`).
unsafe extern "C" fn ctx_id(ctx: usize, id: *mut u64) -> d::CUresult {
    // SAFETY: the same contract.
    let code = unsafe { ctx_id_impl(ctx, id) };
    super::trace::call("export table 21318c60[4]", code);
    code
}

/// Slot 4: a context's unique id (`cuCtxGetId`); 0 for a null context, as NVIDIA's driver
/// answers.
unsafe fn ctx_id_impl(ctx: usize, id: *mut u64) -> d::CUresult {
    if id.is_null() {
        return d::CUDA_ERROR_INVALID_VALUE;
    }
    let value = if ctx == 0 {
        Ok(0)
    } else {
        context::lookup(ctx)
            .map(|c| c.id)
            .map_err(DriverError::from)
    };
    value.map_or_else(DriverError::code, |v| {
        // SAFETY: checked non-null.
        unsafe { id.write_unaligned(v) };
        d::CUDA_SUCCESS
    })
}

/// The driver's object for a stream, as slot 51 hands it out: its words mirror NVIDIA's
/// (`{1, 0, context, 0, 0, 1}`); slot 39 takes it back.
#[derive(Debug)]
#[repr(C)]
struct StreamObject {
    words: [u64; 6],
    stream: usize,
}

static STREAM_OBJECTS: std::sync::Mutex<Vec<&'static StreamObject>> =
    std::sync::Mutex::new(Vec::new());

/// `21318c60[51]`, traced (`QCUDA_DRIVER_TRACE`).
unsafe extern "C" fn stream_object(
    ctx: usize,
    stream: usize,
    out: *mut *const StreamObject,
) -> d::CUresult {
    // SAFETY: the same contract.
    let code = unsafe { stream_object_impl(ctx, stream, out) };
    super::trace::call("export table 21318c60[51]", code);
    code
}

/// Slot 51: the object of stream `stream` (null and the legacy stream are the same), the same
/// one for the same stream every time.
unsafe fn stream_object_impl(
    ctx: usize,
    stream: usize,
    out: *mut *const StreamObject,
) -> d::CUresult {
    if out.is_null() {
        return d::CUDA_ERROR_INVALID_VALUE;
    }
    let stream = if stream == crate::core::streams::LEGACY {
        0
    } else {
        stream
    };
    let Some(rt) = crate::core::runtime::runtime_if_connected() else {
        return d::CUDA_ERROR_NOT_INITIALIZED;
    };
    if let Err(e) = rt.streams.target(stream) {
        return DriverError::from(e).code();
    }
    let mut objects = STREAM_OBJECTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let obj = match objects.iter().find(|o| o.stream == stream) {
        Some(o) => *o,
        None => {
            let o: &'static StreamObject = Box::leak(Box::new(StreamObject {
                words: [1, 0, ctx as u64, 0, 0, 1],
                stream,
            }));
            objects.push(o);
            o
        }
    };
    // SAFETY: checked non-null.
    unsafe { out.write_unaligned(obj) };
    d::CUDA_SUCCESS
}

/// `21318c60[39]`, traced (`QCUDA_DRIVER_TRACE`).
unsafe extern "C" fn stream_object_id(
    ctx: usize,
    obj: *const StreamObject,
    id: *mut u64,
) -> d::CUresult {
    // SAFETY: the same contract.
    let code = unsafe { stream_object_id_impl(ctx, obj, id) };
    super::trace::call("export table 21318c60[39]", code);
    code
}

/// Slot 39: the unique id of the stream behind an object of slot 51 (`cuStreamGetId`).
unsafe fn stream_object_id_impl(
    _ctx: usize,
    obj: *const StreamObject,
    id: *mut u64,
) -> d::CUresult {
    if id.is_null() {
        return d::CUDA_ERROR_INVALID_VALUE;
    }
    let stream = STREAM_OBJECTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .find(|o| std::ptr::eq(**o, obj))
        .map(|o| o.stream);
    let Some(stream) = stream else {
        return d::CUDA_ERROR_INVALID_HANDLE;
    };
    let Some(rt) = crate::core::runtime::runtime_if_connected() else {
        return d::CUDA_ERROR_NOT_INITIALIZED;
    };
    match rt.streams.id(&rt.session, stream) {
        Ok(v) => {
            // SAFETY: checked non-null.
            unsafe { id.write_unaligned(v) };
            d::CUDA_SUCCESS
        }
        Err(e) => DriverError::from(e).code(),
    }
}

static CONTEXT_EXTRA: Table<93> = Table({
    let mut t = stub_table!(CTX_EXT, 93; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92);
    t[4] = ctx_id as *const c_void;
    t[39] = stream_object_id as *const c_void;
    t[51] = stream_object as *const c_void;
    t
});

// ----- 6e163fbe-b958444d-835ce182-aff1991e: function helpers (cuFFT) ----------------------------

/// Where slot 7 reports each function.
type FunctionSink = Option<unsafe extern "C" fn(*mut c_void, usize)>;

/// Slot 7: calls `sink(user, f)` for every kernel `f` of `module` and returns how many there
/// are (not a status; 0 when the module is unknown).
unsafe extern "C" fn module_functions(
    _ctx: usize,
    module: usize,
    sink: FunctionSink,
    user: *mut c_void,
) -> c_int {
    let listed = modules::module(module).and_then(modules::functions);
    let functions = match listed {
        Ok(f) => f,
        Err(e) => {
            crate::core::warnings::warn(format_args!("export table 6e163fbe slot 7: {e:?}"));
            return 0;
        }
    };
    if let Some(sink) = sink {
        for f in &functions {
            // SAFETY: the caller's callback, called as NVIDIA's driver calls it.
            unsafe { sink(user, modules::handle_of(*f)) };
        }
    }
    if super::trace::enabled() {
        super::trace::log(format_args!(
            "export table 6e163fbe[7]: {} functions",
            functions.len()
        ));
    }
    c_int::try_from(functions.len()).unwrap_or(c_int::MAX)
}

static FUNCTION_EXTRA: Table<99> = Table({
    let mut t = stub_table!(FN_EXT, 99; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98);
    t[7] = module_functions as *const c_void;
    t
});

// ----- 1734dc26-800d4745-8726c0f1-e7dd8bca: cuBLASLt's table ----------------------------------

/// Taken by cuBLASLt (under PyTorch), which calls slots 4 and 13 once per process. Slot 4 hands
/// out two small byte tables from the driver's heap and slot 13 writes values into them; what
/// they mean is not known (docs/driver-export-tables.md). Every slot answers
/// `CUDA_ERROR_NOT_SUPPORTED`: measured over NVIDIA's driver 580, cuBLASLt's bf16, fp16 and
/// fp32 products are right with slot 4 or slot 13 failing so, while refusing the whole table
/// crashes cuBLASLt (it does not check `cuGetExportTable`'s status).
static LT_EXTRA: Table<17> = Table(stub_table!(LT_EXT, 17; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16));

/// Every table qcuda offers, by UUID (the 16 bytes in memory order).
fn tables() -> [([u8; 16], *const c_void); 10] {
    [
        (
            uuid("6bd5fb6c5bf4e74a8987d93912fd9df9"),
            RUNTIME_INTERFACE.address(),
        ),
        (
            uuid("263e88607cd2614392f6bbd5006dfa7e"),
            CONTEXT_CHECKS.address(),
        ),
        (
            uuid("42d85a8123f6cb478298f6e78a3aecdc"),
            TOOLS_TLS.address(),
        ),
        (
            uuid("a094798c2e742e7493f20800200c0a66"),
            TOOLS_HOOKS.address(),
        ),
        (
            uuid("c693336e1121df11a8c368f355d89593"),
            CONTEXT_STORAGE.address(),
        ),
        (
            uuid("d4082055bde6704b8d34ba123c66e1f2"),
            INTEGRITY.address(),
        ),
        (
            uuid("f8cff95121468b4eb9e2fb469e7c0dd9"),
            REQUIREMENTS.address(),
        ),
        (
            uuid("21318c60971432488ca641ff7324c8f2"),
            CONTEXT_EXTRA.address(),
        ),
        (
            uuid("6e163fbeb958444d835ce182aff1991e"),
            FUNCTION_EXTRA.address(),
        ),
        (uuid("1734dc26800d47458726c0f1e7dd8bca"), LT_EXTRA.address()),
    ]
}

const fn uuid(hex: &str) -> [u8; 16] {
    let h = hex.as_bytes();
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = nibble(h[2 * i]) << 4 | nibble(h[2 * i + 1]);
        i += 1;
    }
    out
}

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("not a lowercase hex digit"),
    }
}

/// `cuGetExportTable`.
pub fn get(id: &[u8; 16]) -> DrvResult<*const c_void> {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    if let Some((_, t)) = tables().iter().find(|(u, _)| u == id) {
        if super::trace::enabled() {
            super::trace::log(format_args!("cuGetExportTable {hex}"));
        }
        return Ok(*t);
    }
    crate::core::warnings::warn(format_args!("cuGetExportTable: no table {hex}"));
    Err(DriverError::INVALID_VALUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IntegrityInput {
        IntegrityInput {
            driver_version: 12080,
            version: 12082,
            pid: 0x002F_A423,
            thread: 0xF79C_1000,
            runtime_table: 0x7FFF_F695_8240,
            integrity_table: 0x7FFF_F695_8220,
            function: 0x7FFF_F2AA_F4A0,
            seconds: 0x682B_9CEE,
            devices: vec![],
        }
    }

    #[test]
    fn integrity_digest_matches_the_known_vectors() {
        let mut input = sample();
        assert_eq!(
            integrity_digest(&input),
            [
                u64::from_le_bytes([0x07, 0x79, 0xef, 0x5e, 0x4f, 0xfa, 0x2d, 0xd2]),
                u64::from_le_bytes([0x07, 0x52, 0x75, 0x03, 0xd1, 0x90, 0x7b, 0xfa]),
            ]
        );
        input
            .devices
            .push((uuid("9afe2b8aac252d38ea37aec56d71325f"), 0, 2, 0));
        assert_eq!(
            integrity_digest(&input),
            [0xF7CE_26B0_71A1_4844, 0xDD02_1B05_393E_8C6C]
        );
    }

    #[test]
    fn tables_have_their_sizes_and_no_null_slot() {
        for (id, t) in tables() {
            let words = t.cast::<usize>();
            if id == uuid("c693336e1121df11a8c368f355d89593") {
                continue;
            }
            // SAFETY: every table starts with its size in bytes, then that many bytes of words.
            let size = unsafe { *words };
            for i in 1..size / 8 {
                // SAFETY: within the table, as its size word says.
                assert_ne!(unsafe { *words.add(i) }, 0, "{id:02x?} slot {i}");
            }
        }
        assert_eq!(get(&[0; 16]), Err(DriverError::INVALID_VALUE));
        get(&uuid("d4082055bde6704b8d34ba123c66e1f2")).unwrap();
    }
}

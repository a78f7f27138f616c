//! The driver face's code objects: modules (`CUmodule`), functions (`CUfunction`), libraries
//! (`CUlibrary`) and library kernels (`CUkernel`).
//!
//! A module is loaded on the device of the current context: its whole image (fatbin, cubin or
//! PTX) travels to the host once, in one `ModuleLoad`, and the host's driver loads it, as the
//! runtime face loads registered fatbins. A library is context-independent: its image is kept
//! in the guest and loaded as a module on each device that uses it, on first use. Every handle
//! the application sees is the address of a record here; records are never freed (a stale
//! handle must read valid memory and fail the lookup), and a live set says which handles are
//! valid, so a made-up or unloaded handle is `CUDA_ERROR_INVALID_HANDLE`.

use core::ffi::{c_void, CStr};
use std::{
    borrow::Cow,
    ffi::CString,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Arc, Mutex, OnceLock, PoisonError, RwLock,
    },
};

use qcuda_proto::Op;

use super::status::{DriverError, DrvResult};
use crate::core::runtime::context;
use crate::{
    core::addr_map::AddrMap,
    core::modules as core_modules,
    core::modules::fatbin,
    core::modules::registry::{DeviceGlobal, ResolvedKernel},
    core::runtime::runtime,
    core::transport::session::MAX_DEVICES,
    core::transport::Call,
};

/// A loaded module.
#[derive(Debug)]
pub struct Module {
    /// The device it was loaded on.
    pub device: u32,
    /// The host's module handle.
    pub host: u64,
    live: AtomicBool,
    functions: Mutex<Vec<&'static Function>>,
}

/// A kernel of a module.
#[derive(Debug)]
pub struct Function {
    /// Its module.
    pub module: &'static Module,
    /// Its name.
    pub name: CString,
    /// The host's function handle and the parameter layout.
    pub resolved: Arc<ResolvedKernel>,
    /// The dynamic shared memory the kernel was opted into (`cuFuncSetAttribute`).
    pub max_dynamic_smem: AtomicU32,
    /// Whether the host's driver has loaded it: a launch, `cuFuncLoad`, or an attribute or
    /// occupancy call, which load it there as they do natively (`cuFuncIsLoaded`).
    pub loaded: AtomicBool,
}

impl Function {
    /// Notes that a call that loads the function on the host went out.
    pub fn note_loaded(&self) {
        self.loaded.store(true, Ordering::Relaxed);
    }
}

/// A library: an image loadable on any device.
#[derive(Debug)]
pub struct Library {
    /// The image: qcuda's own copy, or the caller's where it promised to keep it until
    /// `cuLibraryUnload` (`CU_LIBRARY_BINARY_IS_PRESERVED`), which is read only while the
    /// library is live.
    image: Cow<'static, [u8]>,
    live: AtomicBool,
    modules: Mutex<Vec<(u32, &'static Module)>>,
    kernels: Mutex<Vec<&'static Kernel>>,
}

/// A kernel of a library, resolved per device on use.
#[derive(Debug)]
pub struct Kernel {
    /// Its library.
    pub library: &'static Library,
    /// Its name.
    pub name: CString,
    /// Its function on each device, once resolved there: a launch of a `CUkernel` (NVIDIA's
    /// runtime launches these) then costs no lock and no name lookup.
    functions: [OnceLock<&'static Function>; MAX_DEVICES],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Module,
    Function,
    Library,
    Kernel,
}

/// The live handles and their kinds, read on every launch (an address-keyed map: no SipHash).
static LIVE: RwLock<Option<AddrMap<usize, Kind>>> = RwLock::new(None);

fn with_live<R>(f: impl FnOnce(&mut AddrMap<usize, Kind>) -> R) -> R {
    let mut guard = LIVE.write().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(AddrMap::default))
}

/// What a handle is, if it is live: a shared lock, so launching threads do not contend.
fn kind_of(h: usize) -> Option<Kind> {
    let guard = LIVE.read().unwrap_or_else(PoisonError::into_inner);
    guard.as_ref().and_then(|l| l.get(&h).copied())
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn handle<T>(r: &'static T) -> usize {
    std::ptr::from_ref(r) as usize
}

fn is_live(h: usize, kind: Kind) -> bool {
    kind_of(h) == Some(kind)
}

/// The module behind a handle.
pub fn module(h: usize) -> DrvResult<&'static Module> {
    if !is_live(h, Kind::Module) {
        return Err(DriverError::INVALID_HANDLE);
    }
    // SAFETY: live handles are addresses of leaked `Module` records (the live set says so).
    Ok(unsafe { &*(h as *const Module) })
}

/// The function behind a handle.
pub fn function(h: usize) -> DrvResult<&'static Function> {
    if !is_live(h, Kind::Function) {
        return Err(DriverError::INVALID_HANDLE);
    }
    // SAFETY: as for `module`.
    Ok(unsafe { &*(h as *const Function) })
}

/// The live function of this process whose host function on `device` is `host` (what a graph's
/// kernel node names).
pub fn function_by_host(device: u32, host: u64) -> Option<&'static Function> {
    let handles: Vec<usize> = with_live(|l| {
        l.iter()
            .filter(|(_, k)| **k == Kind::Function)
            .map(|(h, _)| *h)
            .collect()
    });
    handles
        .into_iter()
        .filter_map(|h| function(h).ok())
        .find(|f| f.module.device == device && f.resolved.function == host)
}

/// The library behind a handle.
pub fn library(h: usize) -> DrvResult<&'static Library> {
    if !is_live(h, Kind::Library) {
        return Err(DriverError::INVALID_HANDLE);
    }
    // SAFETY: as for `module`.
    Ok(unsafe { &*(h as *const Library) })
}

/// The library kernel behind a handle.
pub fn kernel(h: usize) -> DrvResult<&'static Kernel> {
    if !is_live(h, Kind::Kernel) {
        return Err(DriverError::INVALID_HANDLE);
    }
    // SAFETY: as for `module`.
    Ok(unsafe { &*(h as *const Kernel) })
}

/// A launchable handle: a `CUfunction`, or a `CUkernel` (which the driver accepts wherever a
/// function goes), resolved on the current context's device.
pub fn launchable(h: usize) -> DrvResult<&'static Function> {
    match kind_of(h) {
        // SAFETY: live handles of these kinds are addresses of leaked records of them.
        Some(Kind::Function) => Ok(unsafe { &*(h as *const Function) }),
        Some(Kind::Kernel) => kernel_function(
            // SAFETY: as above.
            unsafe { &*(h as *const Kernel) },
            context::require_current()?.device,
        ),
        _ => Err(DriverError::INVALID_HANDLE),
    }
}

/// The length of the code image at `image`: a fatbin wrapper, a fatbin, an ELF cubin, or
/// NUL-terminated PTX.
///
/// # Safety
/// `image` must point to one of those, as the driver API requires; the slice is read only for
/// the duration of the call that loads it.
pub unsafe fn image_at<'a>(image: *const c_void) -> DrvResult<&'a [u8]> {
    if image.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: every accepted format is at least 4 bytes long (caller's contract).
    let magic = unsafe { image.cast::<u32>().read_unaligned() };
    match magic {
        fatbin::WRAPPER_MAGIC => {
            // SAFETY: a wrapper (caller's contract).
            unsafe { fatbin::image_from_wrapper(image) }.map_err(|_| DriverError::INVALID_IMAGE)
        }
        fatbin::FATBIN_MAGIC => {
            // SAFETY: a fatbin starts with its 16-byte header.
            let header = unsafe { &*image.cast::<[u8; fatbin::HEADER_LEN]>() };
            let len = fatbin::image_len(header).map_err(|_| DriverError::INVALID_IMAGE)?;
            // SAFETY: the header says how long the fatbin is.
            Ok(unsafe { std::slice::from_raw_parts(image.cast(), len) })
        }
        0x464c_457f => {
            // SAFETY: an ELF image (caller's contract).
            let len = unsafe { elf_len(image.cast()) }?;
            // SAFETY: the ELF headers say how long the image is.
            Ok(unsafe { std::slice::from_raw_parts(image.cast(), len) })
        }
        // SAFETY: otherwise PTX text, NUL-terminated (caller's contract).
        _ => Ok(unsafe { CStr::from_ptr(image.cast()) }.to_bytes_with_nul()),
    }
}

/// The largest ELF image accepted (a sanity bound on what the headers claim).
const MAX_ELF: u64 = 1 << 31;

/// The extent of a 64-bit ELF image: its headers, section table and every section with data.
///
/// # Safety
/// `p` must point to an ELF image whose headers are readable.
unsafe fn elf_len(p: *const u8) -> DrvResult<usize> {
    // SAFETY: reads within the ELF header and tables the image describes (caller's contract).
    let (u16_at, u32_at, u64_at) = unsafe {
        (
            |o: u64| {
                u64::from(
                    p.add(crate::core::conv::usize_of(o))
                        .cast::<u16>()
                        .read_unaligned(),
                )
            },
            |o: u64| {
                p.add(crate::core::conv::usize_of(o))
                    .cast::<u32>()
                    .read_unaligned()
            },
            |o: u64| {
                p.add(crate::core::conv::usize_of(o))
                    .cast::<u64>()
                    .read_unaligned()
            },
        )
    };
    // SAFETY: the ident bytes are within the header.
    if unsafe { *p.add(4) } != 2 {
        return Err(DriverError::INVALID_IMAGE); // not ELFCLASS64
    }
    let (phoff, shoff) = (u64_at(0x20), u64_at(0x28));
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    let (shentsize, shnum) = (u16_at(0x3A), u16_at(0x3C));
    let mut end = 64u64
        .max(phoff.saturating_add(phentsize * phnum))
        .max(shoff.saturating_add(shentsize * shnum));
    if end > MAX_ELF {
        return Err(DriverError::INVALID_IMAGE);
    }
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        const SHT_NOBITS: u32 = 8;
        if u32_at(sh + 4) != SHT_NOBITS {
            end = end.max(u64_at(sh + 0x18).saturating_add(u64_at(sh + 0x20)));
        }
    }
    if end > MAX_ELF {
        return Err(DriverError::INVALID_IMAGE);
    }
    usize::try_from(end).map_err(|_| DriverError::INVALID_IMAGE)
}

fn load_on(image: &[u8], device: u32) -> DrvResult<&'static Module> {
    let rt = runtime()?;
    let reply = rt
        .session
        .submit(Call::new(Op::ModuleLoad, device).input(image))?;
    let m: &'static Module = Box::leak(Box::new(Module {
        device,
        host: reply.rets[0],
        live: AtomicBool::new(true),
        functions: Mutex::default(),
    }));
    with_live(|l| l.insert(handle(m), Kind::Module));
    Ok(m)
}

/// What a module load with the JIT's logs (`ModuleLoadLogged`) answered: the module (or the
/// driver's error), and how many bytes of `logs` are the info and the error log.
#[derive(Debug)]
pub struct LoggedLoad {
    pub module: DrvResult<usize>,
    pub info_len: usize,
    pub error_len: usize,
}

/// `cuModuleLoadDataEx` with logs: `image` loaded in the current context with the value
/// options encoded in `options` (a `link::LinkRequest` without inputs); the host writes the
/// info log and then the error log into `logs`, as far as they fit.
pub fn load_logged(image: &[u8], options: &[u8], logs: &mut [u8]) -> DrvResult<LoggedLoad> {
    let ctx = context::require_current()?;
    let rt = runtime()?;
    let reply = rt.session.submit(
        Call::new(Op::ModuleLoadLogged, ctx.device)
            .input(image)
            .input(options)
            .output(logs),
    )?;
    let [host, info, error, code, ..] = reply.rets;
    let len = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let (info_len, error_len) = (len(info), len(error));
    if info_len.saturating_add(error_len) > logs.len() {
        return Err(DriverError::UNKNOWN);
    }
    let module = match DriverError::check(u32::try_from(code).unwrap_or(u32::MAX)) {
        Ok(()) => {
            let m: &'static Module = Box::leak(Box::new(Module {
                device: ctx.device,
                host,
                live: AtomicBool::new(true),
                functions: Mutex::default(),
            }));
            with_live(|l| l.insert(handle(m), Kind::Module));
            Ok(handle(m))
        }
        Err(e) => Err(e),
    };
    Ok(LoggedLoad {
        module,
        info_len,
        error_len,
    })
}

/// `cuModuleLoadData`: `image` loaded in the current context; the module's handle.
pub fn load(image: &[u8]) -> DrvResult<usize> {
    let ctx = context::require_current()?;
    Ok(handle(load_on(image, ctx.device)?))
}

/// `cuModuleUnload`.
pub fn unload(m: &'static Module) -> DrvResult<()> {
    if !m.live.swap(false, Ordering::AcqRel) {
        return Err(DriverError::INVALID_HANDLE);
    }
    let functions: Vec<usize> = locked(&m.functions).iter().map(|f| handle(*f)).collect();
    with_live(|l| {
        l.remove(&handle(m));
        for f in functions {
            l.remove(&f);
        }
    });
    let rt = runtime()?;
    rt.session
        .submit(Call::new(Op::ModuleUnload, m.device).args(&[m.host]))?;
    Ok(())
}

/// `cuModuleGetFunction`: the same handle for the same name every time.
pub fn get_function(m: &'static Module, name: &CStr) -> DrvResult<&'static Function> {
    let mut functions = locked(&m.functions);
    if let Some(f) = functions.iter().find(|f| f.name.as_c_str() == name) {
        return Ok(f);
    }
    let rt = runtime()?;
    let resolved = core_modules::function(&rt.session, m.device, m.host, name.to_bytes())?;
    let f: &'static Function = Box::leak(Box::new(Function {
        module: m,
        name: name.to_owned(),
        resolved: Arc::new(resolved),
        max_dynamic_smem: AtomicU32::new(0),
        loaded: AtomicBool::new(false),
    }));
    functions.push(f);
    with_live(|l| l.insert(handle(f), Kind::Function));
    Ok(f)
}

/// Every kernel of module `m`, in the driver's order (`cuModuleEnumerateFunctions`).
pub fn functions(m: &'static Module) -> DrvResult<Vec<&'static Function>> {
    let rt = runtime()?;
    let mut names = vec![0u8; 4096];
    let (count, needed) = loop {
        let reply = rt.session.submit(
            Call::new(Op::ModuleFunctionNames, m.device)
                .args(&[m.host])
                .output(&mut names),
        )?;
        let needed = crate::core::conv::usize_of(reply.rets[1]);
        if needed <= names.len() {
            break (reply.rets[0], needed);
        }
        if needed > 64 << 20 {
            return Err(DriverError::UNKNOWN);
        }
        names = vec![0u8; needed];
    };
    let list: Vec<&CStr> = names[..needed]
        .split_inclusive(|&b| b == 0)
        .filter_map(|n| CStr::from_bytes_with_nul(n).ok())
        .collect();
    if list.len() as u64 != count {
        return Err(DriverError::UNKNOWN);
    }
    list.into_iter().map(|n| get_function(m, n)).collect()
}

/// `cuModuleGetGlobal`.
pub fn get_global(m: &'static Module, name: &CStr) -> DrvResult<DeviceGlobal> {
    let rt = runtime()?;
    Ok(core_modules::module_global(
        &rt.session,
        m.device,
        m.host,
        name.to_bytes(),
    )?)
}

/// `cuLibraryLoadData`: the image is kept in the guest and loaded on each device when first
/// used there, as NVIDIA's driver loads libraries lazily (`CUDA_MODULE_LOADING=LAZY`, its
/// default): NVIDIA's runtime loads every fatbin of a program or library this way, also those
/// with no code for this GPU, which must fail only if a kernel of theirs is used.
pub fn load_library(image: Cow<'static, [u8]>) -> DrvResult<usize> {
    let lib: &'static Library = Box::leak(Box::new(Library {
        image,
        live: AtomicBool::new(true),
        modules: Mutex::default(),
        kernels: Mutex::default(),
    }));
    with_live(|l| l.insert(handle(lib), Kind::Library));
    Ok(handle(lib))
}

/// The module of `lib` on `device`, loading it on first use.
pub fn library_module(lib: &'static Library, device: u32) -> DrvResult<&'static Module> {
    let mut modules = locked(&lib.modules);
    if let Some((_, m)) = modules.iter().find(|(d, _)| *d == device) {
        return Ok(m);
    }
    if !lib.live.load(Ordering::Acquire) {
        return Err(DriverError::INVALID_HANDLE);
    }
    let m = load_on(&lib.image, device)?;
    modules.push((device, m));
    Ok(m)
}

/// `cuLibraryUnload`: every per-device module goes too.
pub fn unload_library(lib: &'static Library) -> DrvResult<()> {
    if !lib.live.swap(false, Ordering::AcqRel) {
        return Err(DriverError::INVALID_HANDLE);
    }
    let kernels: Vec<usize> = locked(&lib.kernels).iter().map(|k| handle(*k)).collect();
    with_live(|l| {
        l.remove(&handle(lib));
        for k in kernels {
            l.remove(&k);
        }
    });
    let modules: Vec<&'static Module> = locked(&lib.modules).drain(..).map(|(_, m)| m).collect();
    let mut result = Ok(());
    for m in modules {
        if let Err(e) = unload(m) {
            result = Err(e);
        }
    }
    result
}

/// `cuLibraryGetKernel`: a handle, resolved on a device when used there (lazily, as above).
pub fn get_kernel(lib: &'static Library, name: &CStr) -> DrvResult<&'static Kernel> {
    if !lib.live.load(Ordering::Acquire) {
        return Err(DriverError::INVALID_HANDLE);
    }
    let mut kernels = locked(&lib.kernels);
    if let Some(k) = kernels.iter().find(|k| k.name.as_c_str() == name) {
        return Ok(k);
    }
    let k: &'static Kernel = Box::leak(Box::new(Kernel {
        library: lib,
        name: name.to_owned(),
        functions: [const { OnceLock::new() }; MAX_DEVICES],
    }));
    kernels.push(k);
    with_live(|l| l.insert(handle(k), Kind::Kernel));
    Ok(k)
}

/// `cuKernelGetFunction` on `device`.
pub fn kernel_function(k: &'static Kernel, device: u32) -> DrvResult<&'static Function> {
    let slot = k
        .functions
        .get(device as usize)
        .ok_or(DriverError::INVALID_DEVICE)?;
    if let Some(f) = slot.get() {
        return Ok(f);
    }
    let f = get_function(library_module(k.library, device)?, &k.name)?;
    // Another thread may have resolved it meanwhile: `get_function` gives the same record.
    Ok(slot.get_or_init(|| f))
}

/// A handle's address, for the exports.
pub fn handle_of<T>(r: &'static T) -> usize {
    handle(r)
}

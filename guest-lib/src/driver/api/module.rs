//! Modules, functions, libraries and kernels: loading code and looking up what it holds.

use core::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::borrow::Cow;

use qcuda_proto::Op;

use qcuda_proto::link::{encode_link, LinkOption};

use super::{
    initialized,
    link::{fill_log, Log, VALUE_OPTIONS},
    out,
};
use crate::core::runtime::context;
use crate::{
    core::runtime::runtime,
    core::transport::Call,
    driver::{
        modules::{self, Function},
        status::{DriverError, DrvResult},
    },
    generated::driver_api as d,
};

/// A NUL-terminated name argument.
///
/// # Safety
/// `name` must be null or NUL-terminated.
unsafe fn name_arg<'a>(name: *const c_char) -> DrvResult<&'a CStr> {
    if name.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    // SAFETY: NUL-terminated (caller's contract).
    Ok(unsafe { CStr::from_ptr(name) })
}

/// The JIT options of `cuModuleLoadDataEx` and `cuLibraryLoadData`: the log buffers (filled
/// with the host JIT's logs), the value options (optimisation level, register limit, target,
/// verbosity, ... which travel to the host's driver as they are); every other option is a
/// pointer or an output the host cannot use (the wall time, symbol tables) and changes nothing
/// observable.
struct JitRequest {
    info: Option<Log>,
    error: Option<Log>,
    values: Vec<LinkOption>,
}

impl JitRequest {
    /// # Safety
    /// `options`/`values` must hold `n` entries when `n > 0`, as the API requires.
    unsafe fn parse(n: c_uint, options: *const d::CUjit_option, values: *mut *mut c_void) -> Self {
        let mut r = Self {
            info: None,
            error: None,
            values: Vec::new(),
        };
        // Without both arrays there is nothing to honour or answer (libraries pass counts with
        // null arrays; NVIDIA's driver accepts that).
        if n == 0 || options.is_null() || values.is_null() {
            return r;
        }
        let empty = || Log {
            buf: std::ptr::null_mut(),
            size: 0,
            size_slot: std::ptr::null_mut(),
        };
        for i in 0..n as usize {
            // SAFETY: `n` entries (caller's contract).
            let (opt, slot) = unsafe { (*options.add(i), values.add(i)) };
            // SAFETY: as above.
            let value = unsafe { *slot };
            match opt {
                d::CU_JIT_INFO_LOG_BUFFER => r.info.get_or_insert_with(empty).buf = value.cast(),
                d::CU_JIT_ERROR_LOG_BUFFER => r.error.get_or_insert_with(empty).buf = value.cast(),
                d::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES | d::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES => {
                    let log = if opt == d::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES {
                        &mut r.info
                    } else {
                        &mut r.error
                    };
                    let log = log.get_or_insert_with(empty);
                    log.size = value as usize;
                    log.size_slot = slot;
                }
                o if VALUE_OPTIONS.contains(&o) => r.values.push(LinkOption {
                    id: o,
                    value: value as usize as u64,
                }),
                _ => {}
            }
        }
        r
    }

    /// The bytes of each log the caller has room for.
    fn room(log: Option<&Log>) -> usize {
        log.filter(|l| !l.buf.is_null())
            .map_or(0, |l| l.size.saturating_sub(1).min(LOG_MAX))
    }

    /// Whether the host must be asked (logs wanted, or options to pass on).
    fn wants_host(&self) -> bool {
        Self::room(self.info.as_ref()) + Self::room(self.error.as_ref()) > 0
            || !self.values.is_empty()
    }

    /// Empty logs, as a load that writes none.
    fn clear(&self) {
        fill_log(self.info.as_ref(), b"");
        fill_log(self.error.as_ref(), b"");
    }

    /// `image` loaded with these options in the current context, the host's logs written into
    /// the caller's buffers: the module's handle or the load's error.
    fn load(&self, image: &[u8]) -> DrvResult<usize> {
        let mut options = Vec::new();
        encode_link(&self.values, &[], |b| options.extend_from_slice(b))
            .ok_or(DriverError::INVALID_VALUE)?;
        let (i, e) = (
            Self::room(self.info.as_ref()),
            Self::room(self.error.as_ref()),
        );
        let mut logs = vec![0u8; i + e];
        let r = modules::load_logged(image, &options, &mut logs).inspect_err(|_| self.clear())?;
        // The host wrote as much of each log as fitted in the whole buffer; each caller
        // buffer takes its own part.
        let info = &logs[..r.info_len];
        let error = &logs[r.info_len..r.info_len + r.error_len];
        fill_log(self.info.as_ref(), &info[..info.len().min(i)]);
        fill_log(self.error.as_ref(), &error[..error.len().min(e)]);
        r.module
    }
}

/// Most bytes of a log carried back (the host's JIT writes at most 64 KiB of each).
const LOG_MAX: usize = 64 << 10;

/// The code image in file `path` (read in the guest), followed by a NUL: PTX text must end
/// with one; binary formats ignore what follows their own length.
fn read_image(path: &CStr) -> DrvResult<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let mut image = std::fs::read(path).map_err(|_| DriverError::FILE_NOT_FOUND)?;
    image.push(0);
    Ok(image)
}

fn module_out(module: *mut d::CUmodule, image: &[u8]) -> DrvResult<()> {
    if module.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    initialized()?;
    let m = modules::load(image)?;
    // SAFETY: checked non-null.
    unsafe { module.write_unaligned(m as d::CUmodule) };
    Ok(())
}

fn function_handle(f: &'static Function) -> d::CUfunction {
    modules::handle_of(f) as d::CUfunction
}

/// Whether the library options say the caller keeps its image (`CU_LIBRARY_BINARY_IS_PRESERVED`
/// with a nonzero value); `CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE` and others say
/// nothing qcuda needs.
///
/// # Safety
/// `options` and `values` hold `n` entries each when `n` > 0.
unsafe fn binary_is_preserved(
    options: *const d::CUlibraryOption,
    values: *const *mut c_void,
    n: c_uint,
) -> DrvResult<bool> {
    // Without both arrays there is no option to honour: NVIDIA's driver takes a count with
    // null arrays, and NVIDIA's runtime passes one when it loads a program's or a library's
    // fatbins (cuBLAS's, seen over the device double: refusing it left cuBLAS without its
    // kernels, CUBLAS_STATUS_INTERNAL_ERROR).
    if n == 0 || options.is_null() || values.is_null() {
        return Ok(false);
    }
    // SAFETY: `n` entries each (caller's contract).
    let (options, values) = unsafe {
        (
            std::slice::from_raw_parts(options, n as usize),
            std::slice::from_raw_parts(values, n as usize),
        )
    };
    Ok(options
        .iter()
        .zip(values)
        .any(|(o, v)| *o == d::CU_LIBRARY_BINARY_IS_PRESERVED && !v.is_null()))
}

/// A new library of `image` into `library` (checked non-null): it loads on each device at first
/// use, with no JIT options (their logs are empty).
///
/// # Safety
/// The JIT options as `cuLibraryLoadData` takes them.
unsafe fn library_out(
    library: *mut d::CUlibrary,
    image: Cow<'static, [u8]>,
    jit_options: *mut d::CUjit_option,
    jit_values: *mut *mut c_void,
    jit_count: c_uint,
) -> DrvResult<()> {
    // SAFETY: the caller's contract for the options.
    let jit = unsafe { JitRequest::parse(jit_count, jit_options, jit_values) };
    jit.clear();
    let lib = modules::load_library(image)?;
    // SAFETY: checked non-null.
    unsafe { library.write_unaligned(lib as d::CUlibrary) };
    Ok(())
}

/// The loading mode reported: eager, as qcuda loads a module's kernels when the module loads,
/// unless `CUDA_MODULE_LOADING=LAZY` asks for lazy loading. Read once, as the driver reads it at
/// initialisation. NVIDIA's runtime asks, and takes other paths under lazy loading.
fn loading_mode() -> d::CUmoduleLoadingMode {
    static MODE: std::sync::OnceLock<d::CUmoduleLoadingMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| loading_mode_of(std::env::var_os("CUDA_MODULE_LOADING").as_deref()))
}

fn loading_mode_of(setting: Option<&std::ffi::OsStr>) -> d::CUmoduleLoadingMode {
    match setting {
        Some(v) if v == "LAZY" => d::CU_MODULE_LAZY_LOADING,
        _ => d::CU_MODULE_EAGER_LOADING,
    }
}

driver_api! {
    /// `cuModuleLoadData`: a fatbin, cubin or PTX image.
    fn cuModuleLoadData(module: *mut d::CUmodule, image: *const c_void) {
        // SAFETY: the API's contract for `image`.
        module_out(module, unsafe { modules::image_at(image) }?)
    }

    /// `cuModuleLoadDataEx`.
    fn cuModuleLoadDataEx(
        module: *mut d::CUmodule,
        image: *const c_void,
        numOptions: c_uint,
        options: *mut d::CUjit_option,
        optionValues: *mut *mut c_void,
    ) {
        // SAFETY: the API's contract for the options.
        let jit = unsafe { JitRequest::parse(numOptions, options, optionValues) };
        // SAFETY: the API's contract for `image`.
        let image = unsafe { modules::image_at(image) }?;
        if !jit.wants_host() {
            jit.clear();
            return module_out(module, image);
        }
        if module.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        initialized()?;
        let m = jit.load(image)?;
        // SAFETY: checked non-null.
        unsafe { module.write_unaligned(m as d::CUmodule) };
        Ok(())
    }

    /// `cuModuleLoadFatBinary`.
    fn cuModuleLoadFatBinary(module: *mut d::CUmodule, fatCubin: *const c_void) {
        // SAFETY: the API's contract for `fatCubin`.
        module_out(module, unsafe { modules::image_at(fatCubin) }?)
    }

    /// `cuModuleLoad`: the file is read in the guest, its image loaded like
    /// `cuModuleLoadData`'s.
    fn cuModuleLoad(module: *mut d::CUmodule, fname: *const c_char) {
        // SAFETY: NUL-terminated (API contract).
        let image = read_image(unsafe { name_arg(fname) }?)?;
        // SAFETY: a readable image that ends with a NUL.
        module_out(module, unsafe { modules::image_at(image.as_ptr().cast()) }?)
    }

    /// `cuModuleUnload`.
    fn cuModuleUnload(hmod: d::CUmodule) {
        initialized()?;
        modules::unload(modules::module(hmod as usize)?)
    }

    /// `cuModuleGetFunction`.
    fn cuModuleGetFunction(hfunc: *mut d::CUfunction, hmod: d::CUmodule, name: *const c_char) {
        initialized()?;
        let m = modules::module(hmod as usize)?;
        // SAFETY: NUL-terminated (API contract).
        let f = modules::get_function(m, unsafe { name_arg(name) }?)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(hfunc, function_handle(f)) }
    }

    /// `cuModuleGetGlobal_v2`: either out-parameter may be null.
    fn cuModuleGetGlobal_v2(
        dptr: *mut d::CUdeviceptr,
        bytes: *mut usize,
        hmod: d::CUmodule,
        name: *const c_char,
    ) {
        initialized()?;
        let m = modules::module(hmod as usize)?;
        // SAFETY: NUL-terminated (API contract).
        let g = modules::get_global(m, unsafe { name_arg(name) }?)?;
        global_out(dptr, bytes, g)
    }

    /// `cuModuleGetLoadingMode`: what NVIDIA's driver answers, from `CUDA_MODULE_LOADING`.
    fn cuModuleGetLoadingMode(mode: *mut d::CUmoduleLoadingMode) {
        initialized()?;
        if mode.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: checked non-null; caller's out-parameter.
        unsafe { out(mode, loading_mode()) }
    }

    /// `cuLibraryLoadData`: the image is kept and loaded per device on use: a copy of it, as
    /// NVIDIA's driver keeps one, unless the caller keeps it (`CU_LIBRARY_BINARY_IS_PRESERVED`).
    fn cuLibraryLoadData(
        library: *mut d::CUlibrary,
        code: *const c_void,
        jitOptions: *mut d::CUjit_option,
        jitOptionsValues: *mut *mut c_void,
        numJitOptions: c_uint,
        libraryOptions: *mut d::CUlibraryOption,
        libraryOptionValues: *mut *mut c_void,
        numLibraryOptions: c_uint,
    ) {
        initialized()?;
        if library.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: the API's contract for the options.
        let preserved =
            unsafe { binary_is_preserved(libraryOptions, libraryOptionValues, numLibraryOptions) }?;
        // SAFETY: the API's contract for `code`.
        let image = unsafe { modules::image_at(code) }?;
        let image = if preserved {
            // SAFETY: the caller keeps `code` readable until cuLibraryUnload, and the library
            // reads its image only while it is live.
            Cow::Borrowed(unsafe { std::slice::from_raw_parts(image.as_ptr(), image.len()) })
        } else {
            Cow::Owned(image.to_vec())
        };
        // SAFETY: the API's contract for the options.
        unsafe { library_out(library, image, jitOptions, jitOptionsValues, numJitOptions) }
    }

    /// `cuLibraryLoadFromFile`: the file's image, read once, is the library's own.
    fn cuLibraryLoadFromFile(
        library: *mut d::CUlibrary,
        fileName: *const c_char,
        jitOptions: *mut d::CUjit_option,
        jitOptionsValues: *mut *mut c_void,
        numJitOptions: c_uint,
        libraryOptions: *mut d::CUlibraryOption,
        libraryOptionValues: *mut *mut c_void,
        numLibraryOptions: c_uint,
    ) {
        initialized()?;
        if library.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: the API's contract for the options.
        if unsafe { binary_is_preserved(libraryOptions, libraryOptionValues, numLibraryOptions) }? {
            // cuda.h: "Specifying this option with cuLibraryLoadFromFile() is invalid".
            return Err(DriverError::INVALID_VALUE);
        }
        // SAFETY: NUL-terminated (API contract).
        let mut image = read_image(unsafe { name_arg(fileName) }?)?;
        // SAFETY: a readable image that ends with a NUL.
        let len = unsafe { modules::image_at(image.as_ptr().cast()) }?.len();
        image.truncate(len);
        // SAFETY: the API's contract for the options.
        unsafe { library_out(library, Cow::Owned(image), jitOptions, jitOptionsValues, numJitOptions) }
    }

    /// `cuLibraryUnload`.
    fn cuLibraryUnload(library: d::CUlibrary) {
        initialized()?;
        modules::unload_library(modules::library(library as usize)?)
    }

    /// `cuLibraryGetKernel`.
    fn cuLibraryGetKernel(pKernel: *mut d::CUkernel, library: d::CUlibrary, name: *const c_char) {
        initialized()?;
        let lib = modules::library(library as usize)?;
        // SAFETY: NUL-terminated (API contract).
        let k = modules::get_kernel(lib, unsafe { name_arg(name) }?)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pKernel, modules::handle_of(k) as d::CUkernel) }
    }

    /// `cuLibraryGetModule`: the library's module in the current context.
    fn cuLibraryGetModule(pMod: *mut d::CUmodule, library: d::CUlibrary) {
        initialized()?;
        let lib = modules::library(library as usize)?;
        let m = modules::library_module(lib, context::require_current()?.device)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pMod, modules::handle_of(m) as d::CUmodule) }
    }

    /// `cuLibraryGetGlobal`: in the current context.
    fn cuLibraryGetGlobal(
        dptr: *mut d::CUdeviceptr,
        bytes: *mut usize,
        library: d::CUlibrary,
        name: *const c_char,
    ) {
        initialized()?;
        let lib = modules::library(library as usize)?;
        let m = modules::library_module(lib, context::require_current()?.device)?;
        // SAFETY: NUL-terminated (API contract).
        let g = modules::get_global(m, unsafe { name_arg(name) }?)?;
        global_out(dptr, bytes, g)
    }

    /// `cuLibraryGetManaged`: `__managed__` variables of a library are not offered.
    fn cuLibraryGetManaged(
        dptr: *mut d::CUdeviceptr,
        bytes: *mut usize,
        library: d::CUlibrary,
        name: *const c_char,
    ) {
        initialized()?;
        modules::library(library as usize)?;
        let _ = (dptr, bytes, name);
        crate::core::warnings::warn_once!("cuLibraryGetManaged is not supported");
        Err(DriverError::NOT_SUPPORTED)
    }

    /// `cuKernelGetFunction`: the kernel in the current context.
    fn cuKernelGetFunction(pFunc: *mut d::CUfunction, kernel: d::CUkernel) {
        initialized()?;
        let k = modules::kernel(kernel as usize)?;
        let f = modules::kernel_function(k, context::require_current()?.device)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pFunc, function_handle(f)) }
    }

    /// `cuKernelGetLibrary`.
    fn cuKernelGetLibrary(pLib: *mut d::CUlibrary, kernel: d::CUkernel) {
        initialized()?;
        let k = modules::kernel(kernel as usize)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(pLib, modules::handle_of(k.library) as d::CUlibrary) }
    }

    /// `cuKernelGetName`.
    fn cuKernelGetName(name: *mut *const c_char, hfunc: d::CUkernel) {
        initialized()?;
        let k = modules::kernel(hfunc as usize)?;
        // SAFETY: caller's out-parameter; the name lives as long as the process.
        unsafe { out(name, k.name.as_ptr()) }
    }

    /// `cuKernelGetAttribute` on device `dev`.
    fn cuKernelGetAttribute(pi: *mut c_int, attrib: d::CUfunction_attribute, kernel: d::CUkernel, dev: d::CUdevice) {
        let dv = super::check_device(dev)?;
        let f = modules::kernel_function(modules::kernel(kernel as usize)?, dv)?;
        function_attribute(pi, attrib, f)
    }

    /// `cuKernelSetAttribute` on device `dev`.
    fn cuKernelSetAttribute(attrib: d::CUfunction_attribute, val: c_int, kernel: d::CUkernel, dev: d::CUdevice) {
        let dv = super::check_device(dev)?;
        let f = modules::kernel_function(modules::kernel(kernel as usize)?, dv)?;
        set_function_attribute(attrib, val, f)
    }

    /// `cuKernelSetCacheConfig` on device `dev`.
    fn cuKernelSetCacheConfig(kernel: d::CUkernel, config: d::CUfunc_cache, dev: d::CUdevice) {
        let dv = super::check_device(dev)?;
        let f = modules::kernel_function(modules::kernel(kernel as usize)?, dv)?;
        set_cache_config(f, config)
    }

    /// `cuKernelGetParamInfo`.
    fn cuKernelGetParamInfo(kernel: d::CUkernel, paramIndex: usize, paramOffset: *mut usize, paramSize: *mut usize) {
        initialized()?;
        let f = modules::kernel_function(modules::kernel(kernel as usize)?, context::require_current()?.device)?;
        param_info(f, paramIndex, paramOffset, paramSize)
    }

    /// `cuFuncGetAttribute`.
    fn cuFuncGetAttribute(pi: *mut c_int, attrib: d::CUfunction_attribute, hfunc: d::CUfunction) {
        initialized()?;
        function_attribute(pi, attrib, modules::launchable(hfunc as usize)?)
    }

    /// `cuFuncSetAttribute`.
    fn cuFuncSetAttribute(hfunc: d::CUfunction, attrib: d::CUfunction_attribute, value: c_int) {
        initialized()?;
        set_function_attribute(attrib, value, modules::launchable(hfunc as usize)?)
    }

    /// `cuFuncSetCacheConfig`.
    fn cuFuncSetCacheConfig(hfunc: d::CUfunction, config: d::CUfunc_cache) {
        initialized()?;
        set_cache_config(modules::launchable(hfunc as usize)?, config)
    }

    /// `cuFuncGetName`.
    fn cuFuncGetName(name: *mut *const c_char, hfunc: d::CUfunction) {
        initialized()?;
        let f = modules::launchable(hfunc as usize)?;
        // SAFETY: caller's out-parameter; the name lives as long as the process.
        unsafe { out(name, f.name.as_ptr()) }
    }

    /// `cuFuncGetModule`.
    fn cuFuncGetModule(hmod: *mut d::CUmodule, hfunc: d::CUfunction) {
        initialized()?;
        let f = modules::function(hfunc as usize)?;
        // SAFETY: caller's out-parameter.
        unsafe { out(hmod, modules::handle_of(f.module) as d::CUmodule) }
    }

    /// `cuFuncGetParamInfo`.
    fn cuFuncGetParamInfo(func: d::CUfunction, paramIndex: usize, paramOffset: *mut usize, paramSize: *mut usize) {
        initialized()?;
        param_info(modules::launchable(func as usize)?, paramIndex, paramOffset, paramSize)
    }

    /// `cuFuncIsLoaded`: whether the host's driver has loaded the function (modules are
    /// loaded lazily there, as natively): after a launch, `cuFuncLoad`, or an attribute or
    /// occupancy call.
    fn cuFuncIsLoaded(state: *mut d::CUfunctionLoadingState, function: d::CUfunction) {
        initialized()?;
        let f = modules::launchable(function as usize)?;
        let s = if f.loaded.load(std::sync::atomic::Ordering::Relaxed) {
            d::CU_FUNCTION_LOADING_STATE_LOADED
        } else {
            d::CU_FUNCTION_LOADING_STATE_UNLOADED
        };
        // SAFETY: caller's out-parameter.
        unsafe { out(state, s) }
    }

    /// `cuFuncLoad`: the host's driver loads the function now (an attribute query, which
    /// loads it there first), so that its first launch does not.
    fn cuFuncLoad(function: d::CUfunction) {
        initialized()?;
        let f = modules::launchable(function as usize)?;
        if f.loaded.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let mut threads: c_int = 0;
        function_attribute(&raw mut threads, d::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f)
    }

    /// `cuOccupancyMaxActiveBlocksPerMultiprocessor`.
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
        numBlocks: *mut c_int,
        func: d::CUfunction,
        blockSize: c_int,
        dynamicSMemSize: usize,
    ) {
        occupancy(numBlocks, func, blockSize, dynamicSMemSize, 0)
    }

    /// `cuOccupancyMaxPotentialBlockSize`: the block size with the most resident threads per
    /// multiprocessor (the largest such, as CUDA's own search prefers), and the grid that fills
    /// the device with it.
    fn cuOccupancyMaxPotentialBlockSize(
        minGridSize: *mut c_int,
        blockSize: *mut c_int,
        func: d::CUfunction,
        blockSizeToDynamicSMemSize: d::CUoccupancyB2DSize,
        dynamicSMemSize: usize,
        blockSizeLimit: c_int,
    ) {
        potential_block_size(minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit, 0)
    }

    /// `cuOccupancyMaxPotentialBlockSizeWithFlags`.
    fn cuOccupancyMaxPotentialBlockSizeWithFlags(
        minGridSize: *mut c_int,
        blockSize: *mut c_int,
        func: d::CUfunction,
        blockSizeToDynamicSMemSize: d::CUoccupancyB2DSize,
        dynamicSMemSize: usize,
        blockSizeLimit: c_int,
        flags: c_uint,
    ) {
        potential_block_size(minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit, flags)
    }

    /// `cuOccupancyAvailableDynamicSMemPerBlock`: the dynamic shared memory a block may use
    /// with `numBlocks` blocks of `blockSize` resident per multiprocessor.
    fn cuOccupancyAvailableDynamicSMemPerBlock(
        dynamicSmemSize: *mut usize,
        func: d::CUfunction,
        numBlocks: c_int,
        blockSize: c_int,
    ) {
        initialized()?;
        if dynamicSmemSize.is_null() {
            return Err(DriverError::INVALID_VALUE);
        }
        let f = modules::launchable(func as usize)?;
        let blocks = u64::try_from(numBlocks).map_err(|_| DriverError::INVALID_VALUE)?;
        let block = u64::try_from(blockSize).map_err(|_| DriverError::INVALID_VALUE)?;
        let rt = runtime()?;
        let reply = rt.session.submit(
            Call::new(Op::OccupancyAvailableDynamicSMem, f.module.device)
                .args(&[f.resolved.function, blocks, block]),
        )?;
        f.note_loaded();
        // SAFETY: checked non-null.
        unsafe { dynamicSmemSize.write_unaligned(crate::core::conv::usize_of(reply.rets[0])) };
        Ok(())
    }

    /// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`.
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        numBlocks: *mut c_int,
        func: d::CUfunction,
        blockSize: c_int,
        dynamicSMemSize: usize,
        flags: c_uint,
    ) {
        occupancy(numBlocks, func, blockSize, dynamicSMemSize, flags)
    }
}

fn global_out(
    dptr: *mut d::CUdeviceptr,
    bytes: *mut usize,
    g: crate::core::modules::registry::DeviceGlobal,
) -> DrvResult<()> {
    if !dptr.is_null() {
        // SAFETY: non-null: the caller asked for it.
        unsafe { dptr.write_unaligned(g.addr) };
    }
    if !bytes.is_null() {
        // SAFETY: as above.
        unsafe { bytes.write_unaligned(usize::try_from(g.size).unwrap_or(usize::MAX)) };
    }
    Ok(())
}

fn function_attribute(
    pi: *mut c_int,
    attrib: d::CUfunction_attribute,
    f: &'static Function,
) -> DrvResult<()> {
    if pi.is_null() || attrib >= d::CU_FUNC_ATTRIBUTE_MAX {
        return Err(DriverError::INVALID_VALUE);
    }
    let rt = runtime()?;
    let id = attrib.to_le_bytes();
    let mut value = [0u8; 4];
    rt.session.submit(
        Call::new(Op::FuncAttributes, f.module.device)
            .args(&[f.resolved.function])
            .input(&id)
            .output(&mut value),
    )?;
    f.note_loaded();
    if crate::driver::trace::enabled() {
        crate::driver::trace::log(format_args!(
            "function attribute {attrib} of {}: {}",
            f.name.to_string_lossy(),
            c_int::from_le_bytes(value)
        ));
    }
    // SAFETY: checked non-null.
    unsafe { pi.write_unaligned(c_int::from_le_bytes(value)) };
    Ok(())
}

fn set_function_attribute(
    attrib: d::CUfunction_attribute,
    value: c_int,
    f: &'static Function,
) -> DrvResult<()> {
    if attrib >= d::CU_FUNC_ATTRIBUTE_MAX {
        return Err(DriverError::INVALID_VALUE);
    }
    let rt = runtime()?;
    rt.session
        .submit(Call::new(Op::FuncSetAttribute, f.module.device).args(&[
            f.resolved.function,
            u64::from(attrib),
            crate::core::conv::int_word(value),
        ]))?;
    f.note_loaded();
    if attrib == d::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES {
        f.max_dynamic_smem.store(
            u32::try_from(value).unwrap_or(0),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    Ok(())
}

fn set_cache_config(f: &'static Function, config: d::CUfunc_cache) -> DrvResult<()> {
    let rt = runtime()?;
    rt.session.submit(
        Call::new(Op::FuncSetCacheConfig, f.module.device)
            .args(&[f.resolved.function, u64::from(config)]),
    )?;
    Ok(())
}

fn param_info(
    f: &'static Function,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> DrvResult<()> {
    let p = f
        .resolved
        .params
        .get(index)
        .ok_or(DriverError::INVALID_VALUE)?;
    if !offset.is_null() {
        // SAFETY: non-null: the caller asked for it.
        unsafe { offset.write_unaligned(p.offset as usize) };
    }
    if !size.is_null() {
        // SAFETY: as above.
        unsafe { size.write_unaligned(p.size as usize) };
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn potential_block_size(
    min_grid: *mut c_int,
    block_size: *mut c_int,
    func: d::CUfunction,
    smem_of: d::CUoccupancyB2DSize,
    smem: usize,
    limit: c_int,
    flags: c_uint,
) -> DrvResult<()> {
    initialized()?;
    if min_grid.is_null() || block_size.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    let f = modules::launchable(func as usize)?;
    let mut max_threads: c_int = 0;
    function_attribute(
        &raw mut max_threads,
        d::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        f,
    )?;
    let rt = runtime()?;
    let dev = f.module.device;
    let [warp, sms] = rt.devices.attributes(
        &rt.session,
        dev,
        &[
            d::CU_DEVICE_ATTRIBUTE_WARP_SIZE,
            d::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        ],
    )?[..] else {
        return Err(DriverError::UNKNOWN);
    };
    let mut top = max_threads;
    if limit > 0 {
        top = top.min(limit);
    }
    let warp = warp.max(1);
    let (mut best_threads, mut best_block, mut best_blocks) = (0i64, 0, 0);
    // From the largest warp multiple down: the first block size reaching the most resident
    // threads wins, so ties go to larger blocks.
    let mut b = top - top % warp;
    while b > 0 {
        let smem = match smem_of {
            // SAFETY: the caller's callback, called as the driver calls it.
            Some(cb) => unsafe { cb(b) },
            None => smem,
        };
        let mut blocks: c_int = 0;
        occupancy(&raw mut blocks, func, b, smem, flags)?;
        let threads = i64::from(blocks) * i64::from(b);
        if threads > best_threads {
            (best_threads, best_block, best_blocks) = (threads, b, blocks);
        }
        b -= warp;
    }
    // SAFETY: checked non-null above.
    unsafe {
        min_grid.write_unaligned(best_blocks * sms);
        block_size.write_unaligned(best_block);
    }
    Ok(())
}

fn occupancy(
    num_blocks: *mut c_int,
    func: d::CUfunction,
    block: c_int,
    smem: usize,
    flags: c_uint,
) -> DrvResult<()> {
    initialized()?;
    if num_blocks.is_null() {
        return Err(DriverError::INVALID_VALUE);
    }
    let f = modules::launchable(func as usize)?;
    let block = u64::try_from(block).map_err(|_| DriverError::INVALID_VALUE)?;
    let rt = runtime()?;
    let reply = rt.session.submit(
        Call::new(Op::OccupancyMaxActiveBlocks, f.module.device).args(&[
            f.resolved.function,
            block,
            smem as u64,
            u64::from(flags),
        ]),
    )?;
    f.note_loaded();
    // SAFETY: checked non-null.
    unsafe { num_blocks.write_unaligned(c_int::try_from(reply.rets[0]).unwrap_or(c_int::MAX)) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[test]
    fn loading_is_eager_unless_lazy_is_asked_for() {
        assert_eq!(loading_mode_of(None), d::CU_MODULE_EAGER_LOADING);
        assert_eq!(
            loading_mode_of(Some(OsStr::new("LAZY"))),
            d::CU_MODULE_LAZY_LOADING
        );
        assert_eq!(
            loading_mode_of(Some(OsStr::new("EAGER"))),
            d::CU_MODULE_EAGER_LOADING
        );
        assert_eq!(
            loading_mode_of(Some(OsStr::new(""))),
            d::CU_MODULE_EAGER_LOADING
        );
    }
}

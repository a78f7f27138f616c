//! What the application registered from its static constructors: fatbin images, kernels (host
//! stub → device name) and device variables (host shadow → device name, size).
//!
//! Registration runs before `main`, possibly with no device at all, so it only records; nothing
//! here talks to the host (`modules.rs` does, lazily). Records are allocated once and never
//! freed, so the handles given to the application (a fatbin handle from
//! `__cudaRegisterFatBinary`, a `cudaKernel_t` from `__cudaGetKernel`) are their addresses, and
//! every use looks them up in the maps, so that a stale or foreign handle is an error rather
//! than a dangling pointer. Unregistering a fatbin (at exit or `dlclose`) removes its kernels and
//! variables from the maps.

use std::{
    ffi::{CStr, CString},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError, RwLock,
    },
};

use qcuda_proto::ParamInfo;

use crate::{
    core::addr_map::AddrMap, core::cuda_error::CudaResult, core::modules::fatbin::FatbinError,
};

/// One `__cudaRegisterFatBinary` call: an image, loaded lazily per device.
#[derive(Debug)]
pub struct FatbinRecord {
    /// The whole image, or why it cannot be used (reported at first use).
    pub image: Result<&'static [u8], FatbinError>,
    /// Per device: the host's module handle, or the load error, which is kept so that a broken
    /// image is not sent again at every launch.
    pub modules: Mutex<Vec<(u32, CudaResult<u64>)>>,
    live: AtomicBool,
}

impl FatbinRecord {
    /// False once `__cudaUnregisterFatBinary` ran for it.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }
}

/// A kernel resolved on one device: what a launch needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedKernel {
    /// The host's function handle.
    pub function: u64,
    /// Offset and size of every parameter, from the host's `cuFuncGetParamInfo`.
    pub params: Vec<ParamInfo>,
}

/// One `__cudaRegisterFunction` call.
#[derive(Debug)]
pub struct KernelRecord {
    /// The image the kernel lives in.
    pub fatbin: &'static FatbinRecord,
    /// The host stub's address (what `<<<>>>` and `cudaLaunchKernel` name the kernel by).
    pub host_fun: usize,
    /// The device function's (mangled) name.
    pub name: CString,
    /// Per device, once resolved.
    pub resolved: Mutex<Vec<(u32, Arc<ResolvedKernel>)>>,
    /// Dynamic shared memory the program opted in to (`cudaFuncSetAttribute`,
    /// `cudaFuncAttributeMaxDynamicSharedMemorySize`); 0 until it did.
    pub max_dynamic_smem: std::sync::atomic::AtomicU32,
}

impl KernelRecord {
    /// The `cudaKernel_t` the application gets for this kernel.
    pub fn handle(&'static self) -> usize {
        self as *const Self as usize
    }
}

/// A device variable resolved on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceGlobal {
    /// Device address.
    pub addr: u64,
    /// Size in bytes, as the host reports it.
    pub size: u64,
}

/// One `__cudaRegisterVar` call.
#[derive(Debug)]
pub struct VarRecord {
    /// The image the variable lives in.
    pub fatbin: &'static FatbinRecord,
    /// The host shadow's address (what `cudaMemcpyToSymbol` names the variable by).
    pub host_var: usize,
    /// The device variable's name.
    pub name: CString,
    /// Size in bytes, as registered.
    pub size: usize,
    /// `__constant__`.
    pub constant: bool,
    /// Per device, once resolved.
    pub resolved: Mutex<Vec<(u32, DeviceGlobal)>>,
}

#[derive(Debug, Default)]
struct Maps {
    fatbins: AddrMap<usize, &'static FatbinRecord>,
    kernels_by_host: AddrMap<usize, &'static KernelRecord>,
    kernels_by_handle: AddrMap<usize, &'static KernelRecord>,
    vars: AddrMap<usize, &'static VarRecord>,
}

/// All registrations of the process.
#[derive(Debug, Default)]
pub struct Registry {
    maps: RwLock<Maps>,
}

impl Registry {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Maps> {
        self.maps.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Maps> {
        self.maps.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an image; the returned address is the fatbin handle.
    pub fn register_fatbin(&self, image: Result<&'static [u8], FatbinError>) -> usize {
        let record: &'static FatbinRecord = Box::leak(Box::new(FatbinRecord {
            image,
            modules: Mutex::default(),
            live: AtomicBool::new(true),
        }));
        let handle = record as *const FatbinRecord as usize;
        self.write().fatbins.insert(handle, record);
        handle
    }

    /// The image of a fatbin handle, if registered.
    pub fn fatbin(&self, handle: usize) -> Option<&'static FatbinRecord> {
        self.read().fatbins.get(&handle).copied()
    }

    /// Records a kernel of fatbin `handle`. Returns false for an unknown handle.
    pub fn register_function(&self, handle: usize, host_fun: usize, name: &CStr) -> bool {
        let Some(fatbin) = self.fatbin(handle) else {
            return false;
        };
        let record: &'static KernelRecord = Box::leak(Box::new(KernelRecord {
            fatbin,
            host_fun,
            name: name.to_owned(),
            resolved: Mutex::default(),
            max_dynamic_smem: Default::default(),
        }));
        let mut maps = self.write();
        maps.kernels_by_host.insert(host_fun, record);
        maps.kernels_by_handle.insert(record.handle(), record);
        true
    }

    /// Records a device variable of fatbin `handle`. Returns None for an unknown handle.
    pub fn register_var(
        &self,
        handle: usize,
        host_var: usize,
        name: &CStr,
        size: usize,
        constant: bool,
    ) -> Option<&'static VarRecord> {
        let fatbin = self.fatbin(handle)?;
        let record: &'static VarRecord = Box::leak(Box::new(VarRecord {
            fatbin,
            host_var,
            name: name.to_owned(),
            size,
            constant,
            resolved: Mutex::default(),
        }));
        self.write().vars.insert(host_var, record);
        Some(record)
    }

    /// Removes a fatbin and everything registered against it; returns it so that the caller can
    /// unload its modules.
    pub fn unregister_fatbin(&self, handle: usize) -> Option<&'static FatbinRecord> {
        let mut maps = self.write();
        let fatbin = maps.fatbins.remove(&handle)?;
        fatbin.live.store(false, Ordering::Release);
        let same = |f: &'static FatbinRecord| std::ptr::eq(f, fatbin);
        maps.kernels_by_host.retain(|_, k| !same(k.fatbin));
        maps.kernels_by_handle.retain(|_, k| !same(k.fatbin));
        maps.vars.retain(|_, v| !same(v.fatbin));
        Some(fatbin)
    }

    /// The kernel whose host stub is at `host_fun`.
    pub fn kernel_by_host(&self, host_fun: usize) -> Option<&'static KernelRecord> {
        self.read().kernels_by_host.get(&host_fun).copied()
    }

    /// The kernel a `cudaKernel_t` from `__cudaGetKernel` stands for.
    pub fn kernel_by_handle(&self, handle: usize) -> Option<&'static KernelRecord> {
        self.read().kernels_by_handle.get(&handle).copied()
    }

    /// The kernel `func` names, as `cudaLaunchKernel` accepts it: a host stub, or a
    /// `cudaKernel_t`.
    pub fn kernel(&self, func: usize) -> Option<&'static KernelRecord> {
        let maps = self.read();
        maps.kernels_by_host
            .get(&func)
            .or_else(|| maps.kernels_by_handle.get(&func))
            .copied()
    }

    /// The kernel whose module function on `device` has the host's handle `function`.
    pub fn kernel_by_function(&self, device: u32, function: u64) -> Option<&'static KernelRecord> {
        self.read().kernels_by_host.values().copied().find(|k| {
            per_device(&k.resolved)
                .iter()
                .any(|(d, r)| *d == device && r.function == function)
        })
    }

    /// The variable whose host shadow is at `host_var`.
    pub fn var(&self, host_var: usize) -> Option<&'static VarRecord> {
        self.read().vars.get(&host_var).copied()
    }

    /// Forgets every module, kernel and variable resolved on `device` (`cudaDeviceReset`).
    pub fn forget_device(&self, device: u32) {
        let maps = self.read();
        for f in maps.fatbins.values() {
            per_device(&f.modules).retain(|(d, _)| *d != device);
        }
        for k in maps.kernels_by_host.values() {
            per_device(&k.resolved).retain(|(d, _)| *d != device);
        }
        for v in maps.vars.values() {
            per_device(&v.resolved).retain(|(d, _)| *d != device);
        }
    }
}

/// Locks a record's per-device list; a panic elsewhere (poisoning) does not stop the runtime.
pub fn per_device<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_and_vars_are_found_by_host_address_and_handle() {
        let r = Registry::default();
        let fb = r.register_fatbin(Ok(&[1, 2, 3]));
        assert!(r.register_function(fb, 0x1000, c"_Z3addPf"));
        assert!(r.register_var(fb, 0x2000, c"table", 64, true).is_some());
        assert!(
            !r.register_function(fb + 8, 0x1008, c"nope"),
            "unknown fatbin handle"
        );

        let k = r.kernel_by_host(0x1000).unwrap();
        assert_eq!(k.name.as_c_str(), c"_Z3addPf");
        assert!(std::ptr::eq(r.kernel_by_handle(k.handle()).unwrap(), k));
        assert!(std::ptr::eq(r.kernel(0x1000).unwrap(), k));
        assert!(std::ptr::eq(r.kernel(k.handle()).unwrap(), k));
        assert!(r.kernel(0x1234).is_none());
        let v = r.var(0x2000).unwrap();
        assert_eq!((v.size, v.constant), (64, true));
        assert!(std::ptr::eq(v.fatbin, r.fatbin(fb).unwrap()));
    }

    #[test]
    fn unregistering_removes_everything_of_that_fatbin_only() {
        let r = Registry::default();
        let a = r.register_fatbin(Ok(&[1]));
        let b = r.register_fatbin(Ok(&[2]));
        r.register_function(a, 0x10, c"ka");
        r.register_function(b, 0x20, c"kb");
        r.register_var(a, 0x30, c"va", 4, false);
        let ka = r.kernel_by_host(0x10).unwrap().handle();
        let rec = r.unregister_fatbin(a).unwrap();
        assert!(!rec.is_live());
        assert!(r.kernel_by_host(0x10).is_none());
        assert!(r.kernel_by_handle(ka).is_none());
        assert!(r.var(0x30).is_none());
        assert!(r.kernel_by_host(0x20).is_some());
        assert!(r.unregister_fatbin(a).is_none());
    }

    #[test]
    fn forget_device_drops_only_that_device() {
        let r = Registry::default();
        let fb = r.register_fatbin(Ok(&[1]));
        r.register_function(fb, 0x10, c"k");
        let f = r.fatbin(fb).unwrap();
        per_device(&f.modules).extend([(0, Ok(5)), (1, Ok(6))]);
        let k = r.kernel_by_host(0x10).unwrap();
        let rk = Arc::new(ResolvedKernel {
            function: 1,
            params: vec![],
        });
        per_device(&k.resolved).extend([(0, rk.clone()), (1, rk)]);
        r.forget_device(0);
        assert_eq!(per_device(&f.modules).len(), 1);
        assert_eq!(per_device(&k.resolved)[0].0, 1);
    }
}

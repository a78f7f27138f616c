//! `__managed__` variables.
//!
//! The variable itself lives in its module on the host: the driver places it in managed memory
//! of the worker process when it loads the module, and kernels reach it there (address P). The
//! program reaches it through a pointer that `__cudaInitModule` fills in (nvcc's host code reads
//! `*ptr` after calling it once): here that pointer is a managed range of our own, host-mapped
//! guest memory W (memory/host.rs). The two copies are kept coherent at the points CUDA's model
//! for devices without concurrent managed access (`concurrentManagedAccess` = 0, what qcuda
//! reports) gives the host and the device their turns:
//!
//! - before a kernel launch, a variable the host may have changed (host's turn) is copied W → P
//!   on the launch's stream, and the device has its turn;
//! - after a synchronising call (device, stream or event synchronisation, a blocking copy), a
//!   variable in the device's turn is copied back P → W, and the host has its turn.
//!
//! A program that touches a `__managed__` variable from the host while a kernel runs breaks
//! that model (as it would natively on such a device). The copies are driver copies between
//! device addresses (`MemcpyMapped`); programs without `__managed__` variables pay nothing.
//!
//! The table exists from the first static constructor on, beside the registry
//! (`runtime::managed_vars`); each step is given the session and the host memory it works with.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Mutex, PoisonError,
};

use qcuda_proto::Op;

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::memory::host::{HostAllocations, HostKind},
    core::modules,
    core::modules::registry::{FatbinRecord, VarRecord},
    core::transport::{session::Session, Call},
};

/// Whose turn it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Not bound yet: the program has not reached it, W does not exist.
    Unbound,
    /// The host may read and write W; P is stale until the next launch.
    Host,
    /// Kernels may have changed P; W is stale until the next synchronisation.
    Device,
}

#[derive(Debug)]
struct Binding {
    turn: Turn,
    /// W: the guest pointer the program uses (its device address too).
    host: usize,
    /// P: the variable in its module on the host.
    device_addr: u64,
    device: u32,
}

/// One `__cudaRegisterManagedVar`.
#[derive(Debug)]
struct ManagedVar {
    var: &'static VarRecord,
    /// The `void **` nvcc's host code reads the variable's address from.
    host_ptr: usize,
    binding: Mutex<Binding>,
}

/// The program's `__managed__` variables.
#[derive(Debug, Default)]
pub struct ManagedVars {
    vars: Mutex<Vec<&'static ManagedVar>>,
    /// Variables bound (W exists); 0 keeps launches and synchronisations free of any work here.
    bound: AtomicUsize,
}

impl ManagedVars {
    fn vars(&self) -> Vec<&'static ManagedVar> {
        self.vars
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records a `__managed__` variable of `var`'s image, whose address nvcc's code reads from
    /// `host_ptr`.
    pub fn register(&self, var: &'static VarRecord, host_ptr: usize) {
        let v: &'static ManagedVar = Box::leak(Box::new(ManagedVar {
            var,
            host_ptr,
            binding: Mutex::new(Binding {
                turn: Turn::Unbound,
                host: 0,
                device_addr: 0,
                device: 0,
            }),
        }));
        self.vars
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(v);
    }

    /// `__cudaUnregisterFatBinary`: forgets the image's variables; returns the W of those that
    /// were bound, for the caller to free.
    pub fn forget_fatbin(&self, fatbin: &FatbinRecord) -> Vec<usize> {
        let gone: Vec<&'static ManagedVar> = {
            let mut vars = self.vars.lock().unwrap_or_else(PoisonError::into_inner);
            let (gone, keep) = vars
                .iter()
                .partition(|v| std::ptr::eq(v.var.fatbin, fatbin));
            *vars = keep;
            gone
        };
        let mut bound = Vec::new();
        for v in gone {
            let b = v.binding.lock().unwrap_or_else(PoisonError::into_inner);
            if b.turn != Turn::Unbound {
                self.bound.fetch_sub(1, Ordering::AcqRel);
                bound.push(b.host);
            }
        }
        bound
    }

    /// `__cudaInitModule`: binds every `__managed__` variable of `fatbin` on `device`: W is
    /// allocated in `host_memory`, receives the variable's value from the module, and becomes
    /// the address the program reads.
    pub fn init_module(
        &self,
        session: &Session,
        host_memory: &HostAllocations,
        fatbin: &FatbinRecord,
        device: u32,
    ) -> CudaResult<()> {
        for v in self.vars() {
            if std::ptr::eq(v.var.fatbin, fatbin) {
                self.bind(session, host_memory, v, device)?;
            }
        }
        Ok(())
    }

    fn bind(
        &self,
        session: &Session,
        host_memory: &HostAllocations,
        v: &ManagedVar,
        device: u32,
    ) -> CudaResult<()> {
        let mut b = v.binding.lock().unwrap_or_else(PoisonError::into_inner);
        if b.turn != Turn::Unbound {
            return Ok(());
        }
        let g = modules::global(session, v.var, device)?;
        let size = usize::try_from(g.size).map_err(|_| CudaError::INVALID_VALUE)?;
        let host = host_memory.alloc(session, size.max(1), 1, device, HostKind::Managed)?;
        if host_memory.find(host).map(|a| a.dev_addr) != Some(host as u64) {
            let _ = host_memory.free(session, host, HostKind::Managed);
            return Err(CudaError::NOT_SUPPORTED);
        }
        copy(session, device, host as u64, g.addr, size, 0, false)?;
        // SAFETY: nvcc's registration passed the address of the program's own `T *` for this
        // variable, which lives as long as the program; writing it is what `__cudaInitModule`
        // is for.
        unsafe { (v.host_ptr as *mut usize).write(host) };
        *b = Binding {
            turn: Turn::Host,
            host,
            device_addr: g.addr,
            device,
        };
        self.bound.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Before a launch on `stream` (wire handle) of `device`: hands the device every variable
    /// in the host's turn.
    pub fn before_launch(&self, session: &Session, device: u32, stream: u64) -> CudaResult<()> {
        if self.bound.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        for v in self.vars() {
            let mut b = v.binding.lock().unwrap_or_else(PoisonError::into_inner);
            if b.turn == Turn::Host && b.device == device {
                copy(
                    session,
                    device,
                    b.device_addr,
                    b.host as u64,
                    v.var.size,
                    stream,
                    true,
                )?;
                b.turn = Turn::Device;
            }
        }
        Ok(())
    }

    /// After a synchronising call that succeeded: hands the host every variable in the
    /// device's turn.
    pub fn after_sync(&self, session: &Session) -> CudaResult<()> {
        if self.bound.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        for v in self.vars() {
            let mut b = v.binding.lock().unwrap_or_else(PoisonError::into_inner);
            if b.turn == Turn::Device {
                copy(
                    session,
                    b.device,
                    b.host as u64,
                    b.device_addr,
                    v.var.size,
                    0,
                    false,
                )?;
                b.turn = Turn::Host;
            }
        }
        Ok(())
    }

    /// After `cudaDeviceReset` of `device`: its bindings are gone with the module and W.
    pub fn forget_device(&self, device: u32) {
        for v in self.vars() {
            let mut b = v.binding.lock().unwrap_or_else(PoisonError::into_inner);
            if b.turn != Turn::Unbound && b.device == device {
                b.turn = Turn::Unbound;
                self.bound.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

fn copy(
    session: &Session,
    device: u32,
    dst: u64,
    src: u64,
    size: usize,
    stream: u64,
    fire_and_forget: bool,
) -> CudaResult<()> {
    if size == 0 {
        return Ok(());
    }
    let mut call = Call::new(Op::MemcpyMapped, device).args(&[dst, src, size as u64, stream]);
    if fire_and_forget {
        call = call.fire_and_forget();
    }
    session.submit(call).map(|_| ())
}

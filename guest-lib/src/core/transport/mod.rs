//! The connection to the host, the bottom layer of the core: this file is the transport (the one
//! ioctl), `session` the session over it (handshake, errnos, sticky errors, fire-and-forget
//! policy), `batch` the batching of fire-and-forget work, `signal_mask` the ioctls no signal may
//! interrupt, `latency` the per-op timings on request, `profile` the GPU timeline of
//! `QCUDA_PROFILE`, and `capture` the stream captures under way, which change how the session
//! sends calls. Nothing here knows a CUDA object.
//!
//! The only place guest-lib talks to the kernel module: one `IOCTL_CALL` on `/dev/qcuda` per
//! request (qcuda-proto's `ioctl` module defines the ABI).
//!
//! A request is built as a [`Call`], which borrows its buffers for as long as it lives, so a
//! [`Transport`] may hand their addresses to the kernel (or, in tests, read them in-process)
//! while the call is executed. [`DeviceFile`] is the real transport; unit tests use the
//! in-process test double in `fake_device.rs`. Above this layer, `session.rs` turns errnos and
//! statuses into CUDA errors.

use std::{fs::File, io, marker::PhantomData, os::fd::AsRawFd, path::Path};

use qcuda_proto::{
    ioctl::{HostMapCall, IoctlCall, IOCTL_CALL, IOCTL_HOST_MAP, IOCTL_HOST_UNMAP},
    Direction, Op, WaitMode, CALL_WAIT_BLOCK, CALL_WAIT_SPIN, FLAG_ASYNC, MAX_ARGS, MAX_RETS,
};

pub mod batch;
pub mod capture;
pub mod latency;
pub mod profile;
pub mod session;
pub mod signal_mask;

/// One request: op, device, inline arguments and the user buffers it moves.
///
/// # Invariants
/// Every buffer in `raw` stays valid for reads (`In`) or writes (`Out`) for `'a`, and `In`
/// buffers come before `Out` buffers.
#[derive(Debug)]
pub struct Call<'a> {
    raw: IoctlCall,
    /// Set when the builder was misused (too many buffers, `In` after `Out`); such a call is
    /// never submitted.
    malformed: bool,
    _buffers: PhantomData<&'a mut [u8]>,
}

impl<'a> Call<'a> {
    /// A call of `op` for device ordinal `device`, with no arguments or buffers.
    pub fn new(op: Op, device: u32) -> Self {
        let mut raw = IoctlCall::new(op);
        raw.device = device;
        Self {
            raw,
            malformed: false,
            _buffers: PhantomData,
        }
    }

    /// Sets the inline arguments `args[0..]`.
    pub fn args(mut self, args: &[u64]) -> Self {
        if args.len() > MAX_ARGS {
            self.malformed = true;
            return self;
        }
        self.raw.args[..args.len()].copy_from_slice(args);
        self
    }

    /// Marks the call fire-and-forget (`FLAG_ASYNC`); see `Session::submit` for when the flag
    /// is honoured.
    pub fn fire_and_forget(mut self) -> Self {
        self.raw.flags |= u32::from(FLAG_ASYNC);
        self.raw.flags &= !(CALL_WAIT_SPIN | CALL_WAIT_BLOCK);
        self
    }

    /// How the caller waits in qcuda.ko for the answer of a waited call (a fire-and-forget
    /// call does not wait: the mode is dropped when the call goes out that way).
    pub fn wait_as(mut self, mode: WaitMode) -> Self {
        self.set_wait_mode(mode);
        self
    }

    /// [`Self::wait_as`] in place.
    pub fn set_wait_mode(&mut self, mode: WaitMode) {
        self.raw.flags = (self.raw.flags & !(CALL_WAIT_SPIN | CALL_WAIT_BLOCK)) | mode.call_flags();
    }

    /// The wait mode set with [`Self::wait_as`] (`Poll` if none).
    pub fn wait_mode(&self) -> WaitMode {
        self.raw.wait_mode()
    }

    /// Appends an `In` buffer (guest to host).
    pub fn input(self, data: &'a [u8]) -> Self {
        // SAFETY: `data` is borrowed for 'a, which the call does not outlive.
        unsafe { self.input_raw(data.as_ptr(), data.len()) }
    }

    /// Appends an `Out` buffer (host to guest).
    pub fn output(self, data: &'a mut [u8]) -> Self {
        // SAFETY: `data` is borrowed mutably for 'a, which the call does not outlive.
        unsafe { self.output_raw(data.as_mut_ptr(), data.len()) }
    }

    /// Appends an `In` buffer given by address, e.g. application memory passed to `cudaMemcpy`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be readable for as long as the call lives.
    pub unsafe fn input_raw(mut self, ptr: *const u8, len: usize) -> Self {
        if self.raw.bufs[..self.raw.nbufs as usize]
            .iter()
            .any(|b| b.dir == Direction::Out as u32)
        {
            self.malformed = true;
            return self;
        }
        self.push(Direction::In, ptr as u64, len)
    }

    /// Appends an `Out` buffer given by address.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be writable, and not otherwise accessed, for as long as the call
    /// lives.
    pub unsafe fn output_raw(self, ptr: *mut u8, len: usize) -> Self {
        self.push(Direction::Out, ptr as u64, len)
    }

    fn push(mut self, dir: Direction, addr: u64, len: usize) -> Self {
        if self.raw.push(dir, addr, len as u64).is_err() {
            self.malformed = true;
        }
        self
    }

    /// The op this call carries.
    pub fn op(&self) -> Option<Op> {
        Op::from_u32(self.raw.op)
    }

    /// The device ordinal the call is for.
    pub fn device(&self) -> u32 {
        self.raw.device
    }

    /// Whether the call asks not to wait for the result.
    pub fn is_fire_and_forget(&self) -> bool {
        self.raw.flags & u32::from(FLAG_ASYNC) != 0
    }

    /// Clears `FLAG_ASYNC`: the call waits for its result.
    pub fn wait_for_result(&mut self) {
        self.raw.flags &= !u32::from(FLAG_ASYNC);
    }

    /// Whether the builder was misused; such a call must not be submitted.
    pub fn is_malformed(&self) -> bool {
        self.malformed
    }

    /// The ioctl argument, for transports. The buffers it names are valid as long as `self`.
    pub fn raw(&self) -> &IoctlCall {
        &self.raw
    }

    /// The ioctl argument, for transports to fill in `status`, `resp_flags` and `rets`.
    pub fn raw_mut(&mut self) -> &mut IoctlCall {
        &mut self.raw
    }

    /// The response fields, after the transport ran the call.
    pub fn reply(&self) -> Reply {
        Reply {
            status: self.raw.status,
            flags: self.raw.resp_flags,
            rets: self.raw.rets,
        }
    }
}

/// What the device answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reply {
    /// A `cudaError_t`.
    pub status: u32,
    /// `RESP_FLAG_*`.
    pub flags: u32,
    /// Return values, meaning per op.
    pub rets: [u64; MAX_RETS],
}

/// Something that executes calls: `/dev/qcuda`, or a test double.
pub trait Transport: Send + Sync {
    /// Runs `call` to completion (or hands it off, for fire-and-forget calls) and stores the
    /// response in it. `Err(errno)` means the call did not get a response from the device.
    fn execute(&self, call: &mut Call<'_>) -> Result<(), i32>;

    /// Backs `addr..addr + len` (page-aligned, inside a reservation of the caller's) with
    /// memory the host can map: an mmap of `/dev/qcuda` over it (`MAP_FIXED`).
    fn map_memory(&self, _addr: usize, _len: usize) -> Result<(), i32> {
        Err(libc::ENODEV)
    }

    /// `IOCTL_HOST_MAP` (`unmap == false`) or `IOCTL_HOST_UNMAP`: fills `status` and `dev_addr`.
    fn host_map(&self, _call: &mut HostMapCall, _unmap: bool) -> Result<(), i32> {
        Err(libc::ENODEV)
    }
}

/// The open `/dev/qcuda`; one per process, which the kernel module treats as one session.
#[derive(Debug)]
pub struct DeviceFile {
    file: File,
}

impl DeviceFile {
    /// Opens the device read-write; std opens with `O_CLOEXEC`, so a child process started with
    /// exec does not inherit (and cannot pose as) this session.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::options().read(true).write(true).open(path)?;
        Ok(Self { file })
    }
}

impl Transport for DeviceFile {
    fn execute(&self, call: &mut Call<'_>) -> Result<(), i32> {
        let arg: *mut IoctlCall = call.raw_mut();
        // SAFETY: `arg` points at a live, exclusively borrowed IoctlCall, the exact structure
        // IOCTL_CALL reads and writes back; every buffer it names is valid for the lifetime of
        // `call` (Call's invariant), which spans this synchronous ioctl.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), IOCTL_CALL.into(), arg) };
        if rc < 0 {
            Err(last_errno())
        } else {
            Ok(())
        }
    }

    fn map_memory(&self, addr: usize, len: usize) -> Result<(), i32> {
        let want = addr as *mut libc::c_void;
        // SAFETY: the caller owns `addr..addr + len` (a PROT_NONE reservation of its own), so
        // MAP_FIXED replaces nothing anyone else uses.
        let p = unsafe {
            libc::mmap(
                want,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        Ok(())
    }

    fn host_map(&self, call: &mut HostMapCall, unmap: bool) -> Result<(), i32> {
        let cmd = if unmap {
            IOCTL_HOST_UNMAP
        } else {
            IOCTL_HOST_MAP
        };
        let arg: *mut HostMapCall = call;
        // SAFETY: `arg` points at a live HostMapCall, the structure both ioctls read and
        // write back; the range it names is the caller's.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), cmd.into(), arg) };
        if rc < 0 {
            Err(last_errno())
        } else {
            Ok(())
        }
    }
}

fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_lays_out_buffers_in_before_out() {
        let input = [1u8, 2, 3];
        let mut output = [0u8; 8];
        let call = Call::new(Op::Echo, 2)
            .args(&[7, 8])
            .input(&input)
            .output(&mut output);
        assert!(!call.is_malformed());
        let raw = call.raw();
        assert_eq!(raw.device, 2);
        assert_eq!(raw.nbufs, 2);
        assert_eq!(&raw.args[..3], &[7, 8, 0]);
        assert_eq!(raw.bufs[0].dir, Direction::In as u32);
        assert_eq!(raw.bufs[0].len, 3);
        assert_eq!(raw.bufs[1].dir, Direction::Out as u32);
        assert_eq!(raw.bufs[1].len, 8);
        // The kernel module's own validation accepts it.
        IoctlCall::decode(&raw.encode()).unwrap();
    }

    #[test]
    fn misuse_is_caught_before_submission() {
        let mut out = [0u8; 4];
        let input = [0u8; 4];
        let call = Call::new(Op::Echo, 0).output(&mut out).input(&input);
        assert!(call.is_malformed());
        let call = Call::new(Op::Hello, 0).args(&[0; MAX_ARGS + 1]);
        assert!(call.is_malformed());
    }

    #[test]
    fn fire_and_forget_sets_and_clears_the_flag() {
        let mut call = Call::new(Op::LaunchKernel, 0).fire_and_forget();
        assert!(call.is_fire_and_forget());
        call.wait_for_result();
        assert!(!call.is_fire_and_forget());
    }
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `/dev/qcuda` as qcuda-smi sees it: an open file and the one generic call ioctl
//! (qcuda-proto's `ioctl` module), plus the transport ops Hello, Echo and HostInfo, and
//! VmUsage (what this VM's processes use on the host).
//!
//! This is deliberately independent of guest-lib: qcuda-smi checks the transport itself, so it
//! builds its [`IoctlCall`]s by hand, including malformed ones for the refusal checks.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use qcuda_proto::{
    ioctl::{IoctlCall, IOCTL_CALL, IOCTL_CALL_SIZE},
    status, Direction, GpuInfo, Op, SessionUsage, GPU_INFO_SIZE, SESSION_USAGE_SIZE, VERSION,
};

// The kernel copies exactly IOCTL_CALL_SIZE bytes in and out of this struct.
const _: () = assert!(std::mem::size_of::<IoctlCall>() == IOCTL_CALL_SIZE);

/// Why a call did not produce a response.
#[derive(Debug)]
pub enum CallError {
    /// The ioctl itself failed: the kernel refused or could not carry the request.
    Ioctl(io::Error),
    /// The device answered with a status other than success.
    Status(u32),
}

impl CallError {
    /// The errno of a refused ioctl.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Ioctl(e) => e.raw_os_error(),
            Self::Status(_) => None,
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ioctl(e) => match e.raw_os_error() {
                Some(n) => write!(f, "ioctl failed with {} ({e})", errno_name(n)),
                None => write!(f, "ioctl failed: {e}"),
            },
            Self::Status(s) => write!(f, "device answered status {} ({s})", status_name(*s)),
        }
    }
}

/// The symbolic name of the errnos the kernel module uses.
pub fn errno_name(n: i32) -> &'static str {
    match n {
        libc::EPERM => "EPERM",
        libc::EINTR => "EINTR",
        libc::EINPROGRESS => "EINPROGRESS",
        libc::EIO => "EIO",
        libc::E2BIG => "E2BIG",
        libc::ENOMEM => "ENOMEM",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOTTY => "ENOTTY",
        libc::ENOSPC => "ENOSPC",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => "errno",
    }
}

/// The `cudaError_t` name of a status (qcuda-proto's table, the one every part uses).
pub fn status_name(s: u32) -> &'static str {
    qcuda_proto::cuda_errors::name(s).unwrap_or("an unknown cudaError_t")
}

/// What Hello answers.
#[derive(Debug, Clone, Copy)]
pub struct HelloReply {
    /// The host's wire version.
    pub host_version: u64,
    /// GPUs the host offers.
    pub gpu_count: u64,
    /// cuDriverGetVersion, 0 without a driver.
    pub driver_version: u64,
    /// Sessions the host has open on this VM's device connection, the caller's included.
    pub sessions: u64,
}

/// What HostInfo answers.
#[derive(Debug, Clone)]
pub struct HostInfoReply {
    /// The GPUs, in host order.
    pub gpus: Vec<GpuInfo>,
    /// cuDriverGetVersion, 0 without a driver.
    pub driver_version: u64,
}

/// What VmUsage answers: this VM's sessions and totals, as the host accounts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmUsageReply {
    /// The VM's open sessions, this one included (flagged `USAGE_CALLER`), by session id.
    pub sessions: Vec<SessionUsage>,
    /// Bytes of device memory the VM's sessions hold.
    pub memory: u64,
    /// The VM's device-memory limit; `None`: none.
    pub memory_limit: Option<u64>,
    /// Most sessions the VM may open.
    pub max_sessions: u64,
    /// Kernels the VM's sessions launched since it connected.
    pub kernels: u64,
    /// Sessions the VM opened since it connected.
    pub sessions_opened: u64,
}

/// Most sessions a VmUsage answer may list (the host's own bound is 1024).
const MAX_USAGE_RECORDS: usize = 4096;

/// An open `/dev/qcuda`: one session, for as long as it stays open.
#[derive(Debug)]
pub struct Device {
    file: File,
    path: PathBuf,
}

impl Device {
    /// Opens the device node.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| {
                let hint = if e.kind() == io::ErrorKind::NotFound {
                    " (is qcuda.ko loaded, and does the VM have a vhost-user-cuda-pci device?)"
                } else {
                    ""
                };
                format!("cannot open {}: {e}{hint}", path.display())
            })?;
        Ok(Self {
            file,
            path: path.to_owned(),
        })
    }

    /// Pages of guest memory qcuda.ko holds for host mappings, over every open file of the
    /// module (`qcuda-host-pages-all` in this file's fdinfo); `None` if the module does not
    /// report it.
    pub fn host_pages_held_by_module(&self) -> Option<u64> {
        let info =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.file.as_raw_fd())).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("qcuda-host-pages-all:"))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Where this file's waited calls spent their time inside qcuda.ko so far, summed: the
    /// calls, then ns preparing, submitting, waiting and finishing (fdinfo's `qcuda-waited-calls`
    /// and `qcuda-*-ns`); `None` if the module does not report them.
    pub fn module_phases(&self) -> Option<[u64; 5]> {
        let info =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.file.as_raw_fd())).ok()?;
        let field = |key: &str| -> Option<u64> {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
        };
        Some([
            field("qcuda-waited-calls:")?,
            field("qcuda-prepare-ns:")?,
            field("qcuda-submit-ns:")?,
            field("qcuda-wait-ns:")?,
            field("qcuda-finish-ns:")?,
        ])
    }

    /// A device over a descriptor of the node opened elsewhere.
    pub fn from_file(file: File, path: &Path) -> Self {
        Self {
            file,
            path: path.to_owned(),
        }
    }

    /// The node this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Issues `call` as is and returns the ioctl's result; `status`, `resp_flags` and `rets`
    /// are filled in on success. Used directly only for deliberately malformed calls.
    ///
    /// # Safety
    /// Every buffer `call` names must be valid for the device to read (`In`) or write (`Out`)
    /// for the duration of the call, or lie outside this process's mappings (a bad address the
    /// kernel must refuse with EFAULT).
    pub unsafe fn call_raw(&self, call: &mut IoctlCall) -> Result<(), io::Error> {
        // SAFETY: `call` is a live, exclusively borrowed #[repr(C)] IoctlCall of exactly
        // IOCTL_CALL_SIZE bytes, which is what IOCTL_CALL encodes; the kernel reads and writes
        // only those bytes. The buffers it names are the caller's responsibility (above).
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::Ioctl::from(IOCTL_CALL),
                call as *mut IoctlCall,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Issues an ioctl command number the module does not define (IOCTL_CALL's with another
    /// number) with a valid argument; the module must answer ENOTTY.
    pub fn unknown_ioctl(&self, call: &mut IoctlCall) -> Result<(), io::Error> {
        let cmd = (IOCTL_CALL & !0xff) | 0x7f;
        // SAFETY: `call` is a live, exclusively borrowed IoctlCall of the size the command
        // encodes; a module that wrongly accepted the command could at most read and write it.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::Ioctl::from(cmd),
                call as *mut IoctlCall,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Issues a call whose buffers are valid; a non-success status is an error. Retries a call
    /// interrupted by a signal (EINTR before qcuda.ko queued it, EINPROGRESS after): no op of
    /// this tool has side effects that matter.
    ///
    /// # Safety
    /// As for [`Device::call_raw`], and every buffer must be valid.
    /// [`Device::call`] for other modules: the status checked, interrupted calls repeated.
    ///
    /// # Safety
    /// As for [`Device::call_raw`].
    pub unsafe fn call_checked(&self, call: &mut IoctlCall) -> Result<(), CallError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.call(call) }
    }

    unsafe fn call(&self, call: &mut IoctlCall) -> Result<(), CallError> {
        loop {
            // SAFETY: forwarded from the caller.
            match unsafe { self.call_raw(call) } {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EINPROGRESS)) => {
                    continue
                }
                Err(e) => return Err(CallError::Ioctl(e)),
                Ok(()) if call.status != status::SUCCESS => {
                    return Err(CallError::Status(call.status))
                }
                Ok(()) => return Ok(()),
            }
        }
    }

    /// The version handshake.
    pub fn hello(&self) -> Result<HelloReply, CallError> {
        let mut call = IoctlCall::new(Op::Hello);
        call.args[0] = u64::from(VERSION);
        // SAFETY: Hello names no buffers.
        unsafe { self.call(&mut call) }?;
        Ok(HelloReply {
            host_version: call.rets[0],
            gpu_count: call.rets[1],
            driver_version: call.rets[2],
            sessions: call.rets[3],
        })
    }

    /// A fire-and-forget Hello: returns once queued (for latency measurements).
    pub fn hello_async(&self) -> Result<(), CallError> {
        let mut call = IoctlCall::new(Op::Hello);
        call.args[0] = u64::from(VERSION);
        call.flags = u32::from(qcuda_proto::FLAG_ASYNC);
        // SAFETY: Hello names no buffers.
        unsafe { self.call(&mut call) }
    }

    /// The host's GPUs. Asks again with a larger buffer if the host has more than fit.
    pub fn host_info(&self) -> Result<HostInfoReply, CallError> {
        let mut room = 16usize;
        loop {
            let mut out = vec![0u8; room * GPU_INFO_SIZE];
            let mut call = IoctlCall::new(Op::HostInfo);
            call.push(Direction::Out, out.as_mut_ptr() as u64, out.len() as u64)
                .expect("one buffer fits");
            // SAFETY: `out` is a live, writable allocation of the length named, unused until
            // the call returns.
            unsafe { self.call(&mut call) }?;
            let count = usize::try_from(call.rets[0]).map_err(|_| {
                CallError::Ioctl(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the host reports {} GPUs", call.rets[0]),
                ))
            })?;
            if count > room {
                room = count;
                continue;
            }
            let gpus = out
                .chunks_exact(GPU_INFO_SIZE)
                .take(count)
                .map(|rec| GpuInfo::decode(rec).expect("record is GPU_INFO_SIZE bytes"))
                .collect();
            return Ok(HostInfoReply {
                gpus,
                driver_version: call.rets[1],
            });
        }
    }

    /// This VM's sessions and totals. Asks again with a larger buffer if more sessions are open
    /// than fit; a record that does not decode is an error (the host speaks another version).
    pub fn vm_usage(&self) -> Result<VmUsageReply, CallError> {
        let bad = |what: String| CallError::Ioctl(io::Error::new(io::ErrorKind::InvalidData, what));
        let mut room = 64usize;
        loop {
            let mut out = vec![0u8; room * SESSION_USAGE_SIZE];
            let mut call = IoctlCall::new(Op::VmUsage);
            call.push(Direction::Out, out.as_mut_ptr() as u64, out.len() as u64)
                .expect("one buffer fits");
            // SAFETY: `out` is a live, writable allocation of the length named, unused until
            // the call returns.
            unsafe { self.call(&mut call) }?;
            let [written, open, memory, limit, max_sessions, kernels, opened] = call.rets;
            let open = usize::try_from(open)
                .ok()
                .filter(|n| *n <= MAX_USAGE_RECORDS)
                .ok_or_else(|| bad(format!("the host reports {open} sessions")))?;
            if open > room {
                room = open;
                continue;
            }
            let written = usize::try_from(written)
                .ok()
                .filter(|n| *n <= room)
                .ok_or_else(|| bad(format!("the host wrote {written} records into {room}")))?;
            let sessions = out
                .chunks_exact(SESSION_USAGE_SIZE)
                .take(written)
                .map(|rec| {
                    SessionUsage::decode(rec)
                        .map_err(|e| bad(format!("a session record does not decode: {e:?}")))
                })
                .collect::<Result<_, _>>()?;
            return Ok(VmUsageReply {
                sessions,
                memory,
                memory_limit: (limit != 0).then_some(limit),
                max_sessions,
                kernels,
                sessions_opened: opened,
            });
        }
    }

    /// Echo: the device copies `input` into `output` (same length) and returns the checksum of
    /// what it read.
    pub fn echo(&self, input: &[u8], output: &mut [u8]) -> Result<u64, CallError> {
        self.echo_waiting(input, output, qcuda_proto::WaitMode::Poll)
    }

    /// [`Self::echo`], waiting in qcuda.ko as `wait` says (`CALL_WAIT_*`).
    pub fn echo_waiting(
        &self,
        input: &[u8],
        output: &mut [u8],
        wait: qcuda_proto::WaitMode,
    ) -> Result<u64, CallError> {
        assert_eq!(input.len(), output.len(), "echo buffers differ in length");
        let mut call = echo_call(
            input.as_ptr() as u64,
            output.as_mut_ptr() as u64,
            input.len() as u64,
        );
        call.flags |= wait.call_flags();
        // SAFETY: `input` is readable and `output` writable, for their whole lengths, and both
        // stay borrowed until the call returns; they may not overlap (`&` and `&mut`).
        unsafe { self.call(&mut call) }?;
        Ok(call.rets[0])
    }
}

/// An Echo call from `in_addr` to `out_addr`, `len` bytes each.
pub fn echo_call(in_addr: u64, out_addr: u64, len: u64) -> IoctlCall {
    let mut call = IoctlCall::new(Op::Echo);
    call.push(Direction::In, in_addr, len)
        .expect("two buffers fit");
    call.push(Direction::Out, out_addr, len)
        .expect("two buffers fit");
    call
}

/// A driver version as CUDA prints it: 13000 -> "13.0", 12040 -> "12.4".
pub fn driver_version_text(v: u64) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_call_has_the_echo_shape() {
        let call = echo_call(0x1000, 0x2000, 7);
        let decoded = IoctlCall::decode(&call.encode()).expect("valid call");
        assert_eq!(decoded.header().checked_op(), Ok(Op::Echo));
        assert_eq!(decoded.bufs[0].addr, 0x1000);
        assert_eq!(decoded.bufs[1].dir, Direction::Out as u32);
    }

    #[test]
    fn in_memory_layout_is_the_encoding() {
        let mut call = echo_call(0x1111_2222_3333_4444, 0x5555, 65537);
        call.args[7] = 0xdead_beef;
        call.flags = 1;
        // SAFETY: IoctlCall is #[repr(C)], plain integers, no padding (asserted above), so
        // viewing it as bytes is sound.
        let bytes =
            unsafe { std::slice::from_raw_parts((&raw const call).cast::<u8>(), IOCTL_CALL_SIZE) };
        assert_eq!(bytes, &call.encode()[..]);
    }

    #[test]
    fn names() {
        assert_eq!(driver_version_text(13000), "13.0");
        assert_eq!(driver_version_text(12040), "12.4");
        assert_eq!(errno_name(libc::EFAULT), "EFAULT");
        assert_eq!(status_name(status::NOT_SUPPORTED), "cudaErrorNotSupported");
    }
}

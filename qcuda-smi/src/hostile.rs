// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `qcuda-smi hostile`: what a hostile guest program can send through the real ioctl, bypassing
//! guest-lib's checks: garbage and truncated module images, kernels launched with parameter
//! blocks of the wrong size, handles and device pointers never issued, huge allocations, floods
//! of fire-and-forget requests nobody waits for, thousands of open descriptors, and NVIDIA's own
//! ioctls (as its user space would send them on `/dev/nvidiactl`, a link to the device). Every call
//! must be answered with an error status (never success, never a hung or failed ioctl), and the
//! session must still work afterwards. Whether other processes kept computing and the guest
//! kernel stayed quiet is checked by the caller (tests/guest/check-cuda runs a mixed load
//! beside it, and greps dmesg).

use std::{
    fs::{File, OpenOptions},
    io,
    path::Path,
};

use qcuda_proto::{ioctl::IoctlCall, status, Direction, Op, FLAG_ASYNC, VERSION};

use crate::device::{status_name, Device};

/// A tiny PTX module: `k(u32 *p, u32 n)` stores n into p[0]. Parameters: 8 + 4 bytes.
const PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p, .param .u32 n)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd0, [p];
    ld.param.u32 %r0, [n];
    cvta.to.global.u64 %rd1, %rd0;
    st.global.u32 [%rd1], %r0;
    ret;
}
";

/// Descriptors opened at once by the descriptor check.
const MANY_FDS: usize = 4000;

/// One raw call: op, args, buffers. Returns the device's status and return values.
struct Raw<'a> {
    dev: &'a Device,
    failures: Vec<String>,
    checked: u32,
}

impl Raw<'_> {
    fn call(
        &self,
        op: Op,
        args: &[u64],
        ins: &[&[u8]],
        outs: &mut [&mut [u8]],
        flags: u16,
    ) -> io::Result<(u32, [u64; 4])> {
        let mut call = IoctlCall::new(op);
        call.args[..args.len()].copy_from_slice(args);
        call.flags = u32::from(flags);
        for b in ins {
            call.push(Direction::In, b.as_ptr() as u64, b.len() as u64)
                .map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
        }
        for b in outs.iter_mut() {
            call.push(Direction::Out, b.as_mut_ptr() as u64, b.len() as u64)
                .map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
        }
        loop {
            // SAFETY: every buffer named is a live slice of the length named, readable (`ins`)
            // or exclusively borrowed and writable (`outs`) until the call returns.
            match unsafe { self.dev.call_raw(&mut call) } {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EINPROGRESS)) => {
                    continue
                }
                Err(e) => return Err(e),
                Ok(()) => {
                    let mut rets = [0u64; 4];
                    rets.copy_from_slice(&call.rets[..4]);
                    return Ok((call.status, rets));
                }
            }
        }
    }

    /// A call that must be refused with an error status.
    fn refused(&mut self, what: &str, op: Op, args: &[u64], ins: &[&[u8]], outs: &mut [&mut [u8]]) {
        self.checked += 1;
        match self.call(op, args, ins, outs, 0) {
            Ok((status::SUCCESS, _)) => self.failures.push(format!("{what}: accepted")),
            Ok((s, _)) => println!("hostile: {what:<58} -> {}", status_name(s)),
            // qcuda.ko refusing the call before the host sees it is an error answer too.
            Err(e) => println!("hostile: {what:<58} -> refused by qcuda.ko ({e})"),
        }
    }

    /// A call that must succeed; returns its return values.
    fn must(
        &mut self,
        what: &str,
        op: Op,
        args: &[u64],
        ins: &[&[u8]],
        outs: &mut [&mut [u8]],
    ) -> Option<[u64; 4]> {
        match self.call(op, args, ins, outs, 0) {
            Ok((status::SUCCESS, rets)) => Some(rets),
            Ok((s, _)) => {
                self.failures.push(format!("{what}: {}", status_name(s)));
                None
            }
            Err(e) => {
                self.failures
                    .push(format!("{what}: the ioctl failed ({e})"));
                None
            }
        }
    }
}

/// Runs every hostile case; the error lists the calls that were not refused as they must be.
pub fn run(path: &Path) -> Result<(), String> {
    let dev = Device::open(path)?;
    let hello = dev.hello().map_err(|e| format!("hello: {e}"))?;
    let mut raw = Raw {
        dev: &dev,
        failures: Vec::new(),
        checked: 0,
    };
    let gpu = hello.gpu_count > 0;
    if !gpu {
        println!("hostile: the host has no GPU: CUDA calls are refused for that reason too");
    }

    module_images(&mut raw);
    handles_and_pointers(&mut raw);
    if gpu {
        launches(&mut raw);
    }
    flood(&mut raw);
    // The session still works after all of it.
    if let Err(e) = dev.hello() {
        raw.failures
            .push(format!("hello after the hostile calls: {e}"));
    }
    let (checked, mut failures) = (raw.checked, raw.failures);
    match many_descriptors(path) {
        Ok(text) => println!("hostile: {text}"),
        Err(e) => failures.push(e),
    }
    match foreign_ioctls(path) {
        Ok(text) => println!("hostile: {text}"),
        Err(e) => failures.push(e),
    }
    if failures.is_empty() {
        println!("hostile: {checked} hostile calls refused, the session still works");
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Images the host must refuse before or in the driver, never crash on.
fn module_images(raw: &mut Raw<'_>) {
    let mut garbage = vec![0u8; 64 << 10];
    crate::prng::Prng::new(7).fill(&mut garbage);
    raw.refused(
        "ModuleLoad of 64 KiB of random bytes",
        Op::ModuleLoad,
        &[],
        &[&garbage],
        &mut [],
    );
    raw.refused(
        "ModuleLoad of an empty image",
        Op::ModuleLoad,
        &[],
        &[&[]],
        &mut [],
    );
    // A fatbin header (magic, version 1, header size 16) claiming far more than it holds.
    let mut fatbin = Vec::new();
    fatbin.extend_from_slice(&0xBA55_ED50u32.to_le_bytes());
    fatbin.extend_from_slice(&1u16.to_le_bytes());
    fatbin.extend_from_slice(&16u16.to_le_bytes());
    fatbin.extend_from_slice(&(u64::MAX - 8).to_le_bytes());
    fatbin.extend_from_slice(&[0xAB; 48]);
    raw.refused(
        "ModuleLoad of a fatbin claiming 2^64 bytes",
        Op::ModuleLoad,
        &[],
        &[&fatbin],
        &mut [],
    );
    // An ELF header whose section table lies far outside the image.
    let mut elf = vec![0u8; 64];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2; // 64-bit
    elf[5] = 1; // little-endian
    elf[6] = 1;
    elf[16] = 2; // ET_EXEC
    elf[18] = 190; // EM_CUDA
    elf[40..48].copy_from_slice(&0xffff_ffff_0000u64.to_le_bytes()); // e_shoff
    elf[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    elf[60..62].copy_from_slice(&0xffffu16.to_le_bytes()); // e_shnum
    raw.refused(
        "ModuleLoad of an ELF with its sections out of the image",
        Op::ModuleLoad,
        &[],
        &[&elf],
        &mut [],
    );
    let truncated = &PTX.as_bytes()[..PTX.len() / 2];
    raw.refused(
        "ModuleLoad of a PTX module cut in half",
        Op::ModuleLoad,
        &[],
        &[truncated],
        &mut [],
    );
}

/// Handles and device pointers this session was never given.
fn handles_and_pointers(raw: &mut Raw<'_>) {
    const BOGUS: u64 = 0xdead_0000;
    let mut out = [0u8; 64];
    raw.refused(
        "Free of a pointer never allocated",
        Op::Free,
        &[BOGUS],
        &[],
        &mut [],
    );
    raw.refused(
        "MemcpyDtoH from a pointer never allocated",
        Op::MemcpyDtoH,
        &[BOGUS, 0],
        &[],
        &mut [&mut out],
    );
    raw.refused(
        "MemcpyHtoD to a pointer never allocated",
        Op::MemcpyHtoD,
        &[BOGUS, 0],
        &[&[1u8; 64]],
        &mut [],
    );
    raw.refused(
        "Memset of 2^63 bytes at a pointer never allocated",
        Op::Memset,
        &[BOGUS, 0, 1 << 63, 0],
        &[],
        &mut [],
    );
    raw.refused(
        "MemcpyDtoD between pointers never allocated",
        Op::MemcpyDtoD,
        &[BOGUS, BOGUS + 4096, 4096, 0],
        &[],
        &mut [],
    );
    raw.refused(
        "StreamSynchronize of a stream never created",
        Op::StreamSynchronize,
        &[0x1234_5678],
        &[],
        &mut [],
    );
    raw.refused(
        "StreamDestroy of a stream never created",
        Op::StreamDestroy,
        &[77],
        &[],
        &mut [],
    );
    raw.refused(
        "EventRecord of an event never created",
        Op::EventRecord,
        &[0x999, 0],
        &[],
        &mut [],
    );
    raw.refused(
        "EventSynchronize of an event never created",
        Op::EventSynchronize,
        &[u64::MAX],
        &[],
        &mut [],
    );
    raw.refused(
        "StreamWaitEvent with handles never issued",
        Op::StreamWaitEvent,
        &[3, 5, 0],
        &[],
        &mut [],
    );
    raw.refused(
        "ModuleUnload of a module never loaded",
        Op::ModuleUnload,
        &[12_345],
        &[],
        &mut [],
    );
    raw.refused(
        "ModuleGetFunction in a module never loaded",
        Op::ModuleGetFunction,
        &[12_345],
        &[b"k"],
        &mut [&mut out],
    );
    raw.refused(
        "LaunchKernel of a function never issued",
        Op::LaunchKernel,
        &[0xdead_beef, 1 | 1 << 32, 1 | 1 << 32, 1 | 1 << 32, 0, 0, 0],
        &[&[0u8; 16]],
        &mut [],
    );
    raw.refused("Malloc of 2^62 bytes", Op::Malloc, &[1 << 62], &[], &mut []);
    raw.refused(
        "Malloc of 2^64 - 1 bytes",
        Op::Malloc,
        &[u64::MAX],
        &[],
        &mut [],
    );
}

/// A real module and kernel, launched with parameter blocks of the wrong size and with
/// impossible configurations; then once correctly, to show the session is healthy.
fn launches(raw: &mut Raw<'_>) {
    let Some([module, ..]) = raw.must(
        "ModuleLoad of a valid PTX module",
        Op::ModuleLoad,
        &[],
        &[PTX.as_bytes()],
        &mut [],
    ) else {
        return;
    };
    let mut info = [0u8; 8 * 8];
    let Some([func, params, ..]) = raw.must(
        "ModuleGetFunction k",
        Op::ModuleGetFunction,
        &[module],
        &[b"k"],
        &mut [&mut info],
    ) else {
        return;
    };
    if params != 2 {
        raw.failures
            .push(format!("k has {params} parameters, expected 2"));
    }
    let Some([buf, ..]) = raw.must("Malloc of 4 bytes", Op::Malloc, &[4], &[], &mut []) else {
        return;
    };
    let one = 1 | 1 << 32;
    let cfg = [func, one, one, one, 0, 0, 0];
    let mut block = [0u8; 16];
    block[..8].copy_from_slice(&buf.to_le_bytes());
    block[8..12].copy_from_slice(&0x5eed_u32.to_le_bytes());
    raw.refused(
        "LaunchKernel with an empty parameter block",
        Op::LaunchKernel,
        &cfg,
        &[&[]],
        &mut [],
    );
    raw.refused(
        "LaunchKernel with 3 parameter bytes of 12",
        Op::LaunchKernel,
        &cfg,
        &[&block[..3]],
        &mut [],
    );
    raw.refused(
        "LaunchKernel with 64 KiB of parameters",
        Op::LaunchKernel,
        &cfg,
        &[&[0u8; 64 << 10]],
        &mut [],
    );
    let huge_block = [func, one, 1 | 4096 << 32, one, 0, 0, 0];
    raw.refused(
        "LaunchKernel with 4096 threads per block",
        Op::LaunchKernel,
        &huge_block,
        &[&block[..12]],
        &mut [],
    );
    let zero_grid = [func, 0, 1 | 1 << 32, one, 0, 0, 0];
    raw.refused(
        "LaunchKernel with a zero grid",
        Op::LaunchKernel,
        &zero_grid,
        &[&block[..12]],
        &mut [],
    );
    let shmem = [func, one, one, one, 1 << 40, 0, 0];
    raw.refused(
        "LaunchKernel with 2^40 bytes of shared memory",
        Op::LaunchKernel,
        &shmem,
        &[&block[..12]],
        &mut [],
    );
    let stream = [func, one, one, one, 0, 0xbad_5ee, 0];
    raw.refused(
        "LaunchKernel on a stream never created",
        Op::LaunchKernel,
        &stream,
        &[&block[..12]],
        &mut [],
    );
    // The correct launch still works and computes.
    if raw
        .must(
            "LaunchKernel, correctly",
            Op::LaunchKernel,
            &cfg,
            &[&block[..12]],
            &mut [],
        )
        .is_some()
    {
        let mut out = [0u8; 4];
        if raw
            .must(
                "MemcpyDtoH of the result",
                Op::MemcpyDtoH,
                &[buf, 0],
                &[],
                &mut [&mut out],
            )
            .is_some()
            && u32::from_le_bytes(out) != 0x5eed
        {
            raw.failures.push(format!(
                "the correct launch stored {:#x}, expected 0x5eed",
                u32::from_le_bytes(out)
            ));
        }
    }
    raw.must("Free", Op::Free, &[buf], &[], &mut []);
    raw.must("ModuleUnload", Op::ModuleUnload, &[module], &[], &mut []);
    raw.refused(
        "LaunchKernel of a function of an unloaded module",
        Op::LaunchKernel,
        &cfg,
        &[&block[..12]],
        &mut [],
    );
}

/// 20 000 fire-and-forget requests nobody waits for, half of them invalid; then a waited call
/// must still be answered.
fn flood(raw: &mut Raw<'_>) {
    let mut refused_at_submit = 0u32;
    for i in 0..20_000u64 {
        let (op, args): (Op, &[u64]) = if i % 2 == 0 {
            (Op::EventRecord, &[0x4242, 0])
        } else {
            (Op::Hello, &[u64::from(VERSION)])
        };
        match raw.call(op, args, &[], &mut [], FLAG_ASYNC) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => refused_at_submit += 1,
            Err(e) => {
                raw.failures.push(format!("fire-and-forget call {i}: {e}"));
                return;
            }
        }
    }
    raw.checked += 1;
    match raw.call(Op::Hello, &[u64::from(VERSION)], &[], &mut [], 0) {
        Ok((status::SUCCESS, _)) => println!(
            "hostile: 20000 fire-and-forget requests (half invalid) then a waited call: answered{}",
            if refused_at_submit > 0 {
                format!(" ({refused_at_submit} refused at submission)")
            } else {
                String::new()
            }
        ),
        // The invalid records' error may be reported at the next waited call.
        Ok((s, _)) => println!(
            "hostile: 20000 fire-and-forget requests then a waited call: {}",
            status_name(s)
        ),
        Err(e) => raw
            .failures
            .push(format!("a waited call after the flood: {e}")),
    }
}

/// Thousands of descriptors of /dev/qcuda open in one process, each saying Hello: the host
/// opens sessions up to its limit and refuses the rest with an error; closing them all leaves
/// the host as before.
fn many_descriptors(path: &Path) -> Result<String, String> {
    raise_fd_limit(MANY_FDS as u64 + 64);
    let before = Device::open(path)?
        .hello()
        .map_err(|e| format!("hello: {e}"))?
        .sessions;
    let mut files: Vec<File> = Vec::with_capacity(MANY_FDS);
    let (mut opened, mut refused) = (0u32, 0u32);
    let mut open_err = None;
    for _ in 0..MANY_FDS {
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => files.push(f),
            Err(e) => {
                open_err = Some(e);
                break;
            }
        }
    }
    for f in &files {
        let dev = Device::from_file(f.try_clone().map_err(|e| format!("dup: {e}"))?, path);
        match dev.hello() {
            Ok(_) => opened += 1,
            Err(crate::device::CallError::Status(_)) => refused += 1,
            Err(e) => return Err(format!("hello on descriptor {}: {e}", opened + refused)),
        }
    }
    let n = files.len();
    drop(files);
    let after = Device::open(path)?
        .hello()
        .map_err(|e| format!("hello: {e}"))?
        .sessions;
    let text = format!(
        "{n} descriptors of {} open at once{}: {opened} sessions opened, {refused} refused by the host's limit; \
         sessions before {before}, after closing them {after}",
        path.display(),
        open_err.map_or(String::new(), |e| format!(" (opening more: {e})"))
    );
    if n < 1024 {
        return Err(format!(
            "{text}: fewer than 1024 descriptors could be opened"
        ));
    }
    // Other processes may end meanwhile, never start more sessions than they had.
    if after > before {
        return Err(format!("{text}: sessions were left open"));
    }
    Ok(text)
}

fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid resource and a live rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) == 0 && lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max).max(lim.rlim_cur);
            if lim.rlim_max < want {
                // root may raise the hard limit too
                let raised = libc::rlimit {
                    rlim_cur: want,
                    rlim_max: want,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) == 0 {
                    return;
                }
            }
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim);
        }
    }
}

/// NVIDIA's ioctl magic ('F') and some of its requests with their parameter sizes, as NVIDIA's
/// user space sends them to `/dev/nvidiactl`: the card list (NV_ESC_CARD_INFO, 200), the
/// version check (NV_ESC_CHECK_VERSION_STR, 210), an fd registration (201), the system
/// parameters (214), and the resource manager's free, control and alloc escapes (0x29, 0x2a,
/// 0x2b).
const NVIDIA_IOCTLS: &[(u32, u32)] = &[
    (200, 0x400),
    (210, 0x48),
    (201, 4),
    (214, 8),
    (0x29, 0x10),
    (0x2a, 0x20),
    (0x2b, 0x30),
];

/// `_IOWR(type, nr, size)`.
const fn iowr(ty: u32, nr: u32, size: u32) -> u32 {
    (3 << 30) | (size << 16) | (ty << 8) | nr
}

/// NVIDIA's ioctls on the device (through `/dev/nvidiactl` where it is the link to it, as
/// JAX's device check needs it): each must fail with ENOTTY, no other answer, and the session
/// must still work after them.
fn foreign_ioctls(path: &Path) -> Result<String, String> {
    use std::os::unix::{fs::FileTypeExt, fs::MetadataExt, io::AsRawFd};
    let ctl = Path::new("/dev/nvidiactl");
    let rdev = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .filter(|m| m.file_type().is_char_device())
            .map(|m| m.rdev())
    };
    let target = match (rdev(ctl), rdev(path)) {
        (Some(a), Some(b)) if a == b => ctl,
        (Some(_), _) => {
            return Err(format!(
                "foreign ioctls: {} is another device than {}",
                ctl.display(),
                path.display()
            ))
        }
        _ => path,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(target)
        .map_err(|e| format!("open {}: {e}", target.display()))?;
    let mut params = vec![0u8; 0x400];
    let mut wrong = Vec::new();
    for &(nr, size) in NVIDIA_IOCTLS {
        let cmd = iowr(u32::from(b'F'), nr, size);
        // SAFETY: `params` is a live, writable buffer at least `size` bytes long, which is all
        // any handler of this request could read or write; qcuda.ko must not touch it at all.
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                libc::c_ulong::from(cmd),
                params.as_mut_ptr(),
            )
        };
        let errno = io::Error::last_os_error().raw_os_error();
        if rc != -1 || errno != Some(libc::ENOTTY) {
            wrong.push(format!(
                "ioctl {cmd:#010x} ('F', {nr}) returned {rc} ({})",
                io::Error::last_os_error()
            ));
        }
    }
    if params.iter().any(|&b| b != 0) {
        wrong.push("a refused ioctl wrote into its buffer".into());
    }
    Device::from_file(file, target)
        .hello()
        .map_err(|e| format!("hello after NVIDIA's ioctls: {e}"))?;
    if wrong.is_empty() {
        Ok(format!(
            "{} of NVIDIA's ioctls on {} answered ENOTTY, the session still works",
            NVIDIA_IOCTLS.len(),
            target.display()
        ))
    } else {
        Err(format!("NVIDIA's ioctls: {}", wrong.join("; ")))
    }
}

//! Test harness shared by the process-level tests: the `vhost-cuda` binary as a child process
//! with its log in a file, and a minimal virtio driver ("guest VM") that plays QEMU's part
//! over vhost-user with memfd guest memory and a hand-laid split vring. `rig.rs`: a session
//! table with real worker processes, without vhost-user.

#![allow(dead_code)] // Each test file uses part of the harness.

pub mod rig;

use std::{
    fs::File,
    io::Read,
    os::fd::FromRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{
    Direction, Op, RequestHeader, ResponseHeader, NUM_QUEUES, QUEUE_SIZE, RESPONSE_HEADER_SIZE,
    VERSION,
};
use vhost::{
    vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures},
    VhostBackend, VhostUserMemoryRegionInfo, VringConfigData,
};
use vhost_cuda::vhu_cuda::DEVICE_FEATURES;
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub const WAIT: Duration = Duration::from_secs(20);

/// A fresh, empty directory under the system temp dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vhost-cuda-test-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Polls `f` until it holds or `WAIT` passes.
pub fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// The daemon binary, run as a child process.
pub struct Daemon {
    child: Child,
    log_path: PathBuf,
}

impl Daemon {
    /// Command for the daemon binary with its stderr going to `log_path`.
    pub fn command(log_path: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-cuda"));
        cmd.args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log_path).unwrap());
        cmd
    }

    /// Starts the daemon and waits until it listens.
    pub fn start(dir: &Path, args: &[&str]) -> Daemon {
        let log_path = dir.join(format!("daemon-{}.log", std::process::id()));
        let log_path = unique(log_path);
        Self::spawn(Self::command(&log_path, args), log_path)
    }

    /// Starts `cmd`, a command that becomes the daemon and logs to `log_path`, and waits
    /// until it listens.
    pub fn spawn(mut cmd: Command, log_path: PathBuf) -> Daemon {
        let child = cmd.spawn().unwrap();
        let d = Daemon { child, log_path };
        assert!(
            d.wait_log("waiting for a frontend", 1),
            "daemon did not come up:\n{}",
            d.log()
        );
        d
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        let _ = File::open(&self.log_path).and_then(|mut f| f.read_to_string(&mut s));
        s
    }

    /// Waits until `needle` occurs at least `count` times in the log.
    pub fn wait_log(&self, needle: &str, count: usize) -> bool {
        eventually(|| self.log().matches(needle).count() >= count)
    }

    pub fn pid(&self) -> i32 {
        libc::pid_t::try_from(self.child.id()).expect("a pid fits in pid_t")
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for the daemon to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not exit:\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn unique(p: PathBuf) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut s = p.into_os_string();
    s.push(format!(".{}", N.fetch_add(1, Ordering::Relaxed)));
    s.into()
}

const GUEST_RAM: usize = 16 << 20;
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const DATA: u64 = 0x1_0000;

/// A guest as the device sees it: memfd-backed RAM shared with the daemon, a split vring for
/// each queue, and a driver that puts chains on queue 0.
pub struct GuestVm {
    pub frontend: Frontend,
    pub mem: GuestMemoryMmap,
    kicks: Vec<EventFd>,
    pub calls: Vec<EventFd>,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
    data_next: u64,
}

/// A response and the output bytes of one call.
pub struct Reply {
    pub resp: ResponseHeader,
    pub out: Vec<u8>,
    pub used_len: u32,
}

fn memfd(size: usize) -> File {
    // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"qcuda-test-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size as u64).unwrap();
    f
}

impl GuestVm {
    /// Connects to the daemon without any handshake.
    pub fn connect_only(socket: &Path) -> Frontend {
        let mut last = None;
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            match Frontend::connect(socket, NUM_QUEUES as u64) {
                Ok(f) => return f,
                Err(e) => last = Some(e),
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!("cannot connect to {}: {last:?}", socket.display());
    }

    /// Connects and does what QEMU does when the guest driver starts the device.
    pub fn connect(socket: &Path) -> GuestVm {
        let mut frontend = Self::connect_only(socket);
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            GUEST_RAM,
            Some(FileOffset::new(memfd(GUEST_RAM), 0)),
        )])
        .unwrap();

        frontend.set_owner().unwrap();
        let features = frontend.get_features().unwrap();
        assert_eq!(features, DEVICE_FEATURES, "offered virtio features");
        let protocol = frontend.get_protocol_features().unwrap();
        assert!(protocol.contains(VhostUserProtocolFeatures::MQ));
        frontend.set_protocol_features(protocol).unwrap();
        assert_eq!(frontend.get_queue_num().unwrap(), NUM_QUEUES as u64);
        frontend.set_features(features).unwrap();

        let regions: Vec<VhostUserMemoryRegionInfo> = mem
            .iter()
            .map(|r| VhostUserMemoryRegionInfo::from_guest_region(r).unwrap())
            .collect();
        frontend.set_mem_table(&regions).unwrap();

        let mut kicks = Vec::new();
        let mut calls = Vec::new();
        for q in 0..NUM_QUEUES {
            // Queue q's rings live in the q-th 16 KiB below DATA.
            let base = (q as u64) * 0x4000;
            let va = |gpa: u64| mem.get_host_address(GuestAddress(base + gpa)).unwrap() as u64;
            frontend.set_vring_num(q, QUEUE_SIZE).unwrap();
            frontend.set_vring_base(q, 0).unwrap();
            frontend
                .set_vring_addr(
                    q,
                    &VringConfigData {
                        queue_max_size: QUEUE_SIZE,
                        queue_size: QUEUE_SIZE,
                        flags: 0,
                        desc_table_addr: va(DESC),
                        used_ring_addr: va(USED),
                        avail_ring_addr: va(AVAIL),
                        log_addr: None,
                    },
                )
                .unwrap();
            let kick = EventFd::new(EFD_NONBLOCK).unwrap();
            let call = EventFd::new(EFD_NONBLOCK).unwrap();
            frontend.set_vring_kick(q, &kick).unwrap();
            frontend.set_vring_call(q, &call).unwrap();
            kicks.push(kick);
            calls.push(call);
        }
        for q in 0..NUM_QUEUES {
            frontend.set_vring_enable(q, true).unwrap();
        }
        GuestVm {
            frontend,
            mem,
            kicks,
            calls,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
            data_next: DATA,
        }
    }

    fn alloc(&mut self, len: u64) -> u64 {
        let at = self.data_next;
        self.data_next = (at + len + 0xfff) & !0xfff;
        assert!(
            self.data_next < GUEST_RAM as u64,
            "test guest RAM exhausted"
        );
        at
    }

    /// Puts one chain of `(gpa, len, writable)` descriptors on queue 0 and kicks.
    pub fn submit_raw(&mut self, descs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in descs.iter().enumerate() {
            let idx = self.next_desc;
            self.next_desc = (self.next_desc + 1) % QUEUE_SIZE;
            let mut flags = if writable {
                u16::try_from(VRING_DESC_F_WRITE).unwrap()
            } else {
                0
            };
            if i + 1 < descs.len() {
                flags |= u16::try_from(VRING_DESC_F_NEXT).unwrap();
            }
            let at = DESC + 16 * u64::from(idx);
            self.mem.write_obj(addr, GuestAddress(at)).unwrap();
            self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
            self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
            self.mem
                .write_obj(self.next_desc, GuestAddress(at + 14))
                .unwrap();
        }
        let slot = AVAIL + 4 + 2 * u64::from(self.avail_idx % QUEUE_SIZE);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        self.kicks[0].write(1).unwrap();
        head
    }

    /// Lays out a request (header and input, then output and response space, each split in
    /// two descriptors) and submits it. Returns the head and where the output starts.
    pub fn submit(&mut self, h: &RequestHeader, input: &[u8], out_len: usize) -> (u16, u64) {
        let mut stream = h.encode().to_vec();
        stream.extend_from_slice(input);
        let r = self.alloc(stream.len() as u64);
        self.mem.write_slice(&stream, GuestAddress(r)).unwrap();
        let wlen = out_len + RESPONSE_HEADER_SIZE;
        let w = self.alloc(wlen as u64);
        let (r1, w1) = (stream.len() / 2, wlen / 3);
        let head = self.submit_raw(&[
            (r, u32::try_from(r1).unwrap(), false),
            (
                r + r1 as u64,
                u32::try_from(stream.len() - r1).unwrap(),
                false,
            ),
            (w, u32::try_from(w1).unwrap(), true),
            (w + w1 as u64, u32::try_from(wlen - w1).unwrap(), true),
        ]);
        (head, w)
    }

    /// Waits until the device has used `n` more chains; returns their (id, len).
    pub fn wait_used(&mut self, n: u16) -> Vec<(u32, u32)> {
        let target = self.used_seen.wrapping_add(n);
        assert!(
            eventually(|| {
                let idx: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
                idx.wrapping_sub(self.used_seen) >= n
            }),
            "the device did not complete {n} chains"
        );
        let mut out = Vec::new();
        while self.used_seen != target {
            let at = USED + 4 + 8 * u64::from(self.used_seen % QUEUE_SIZE);
            let id: u32 = self.mem.read_obj(GuestAddress(at)).unwrap();
            let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
            out.push((id, len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }

    /// One request, waited for.
    pub fn call(&mut self, h: &RequestHeader, input: &[u8], out_len: usize) -> Reply {
        let (head, w) = self.submit(h, input, out_len);
        let used = self.wait_used(1);
        assert_eq!(used[0].0, u32::from(head));
        let mut out = vec![0u8; out_len];
        self.mem.read_slice(&mut out, GuestAddress(w)).unwrap();
        let mut b = [0u8; RESPONSE_HEADER_SIZE];
        self.mem
            .read_slice(&mut b, GuestAddress(w + out_len as u64))
            .unwrap();
        Reply {
            resp: ResponseHeader::decode(&b).unwrap(),
            out,
            used_len: used[0].1,
        }
    }

    pub fn hello(&mut self, session: u64) -> ResponseHeader {
        let mut h = RequestHeader::new(Op::Hello);
        h.session = session;
        h.args[0] = u64::from(VERSION);
        self.call(&h, &[], 0).resp
    }

    pub fn echo(&mut self, session: u64, data: &[u8]) -> Reply {
        let mut h = RequestHeader::new(Op::Echo);
        h.session = session;
        h.push_buffer(Direction::In, data.len() as u64).unwrap();
        h.push_buffer(Direction::Out, data.len() as u64).unwrap();
        self.call(&h, data, data.len())
    }

    pub fn close_session(&mut self, session: u64) -> ResponseHeader {
        let mut h = RequestHeader::new(Op::SessionClose);
        h.session = session;
        self.call(&h, &[], 0).resp
    }

    /// Whether the device signalled queue 0 since the last look.
    pub fn was_signalled(&self) -> bool {
        self.calls[0].read().is_ok()
    }
}

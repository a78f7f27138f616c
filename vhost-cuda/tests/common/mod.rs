//! Test harness shared by the process-level tests: the `vhost-cuda` binary as a child process
//! with its log in a file, and a minimal virtio driver ("guest VM") over the crate's own
//! frontend (`vhost_cuda::frontend`: QEMU's part over vhost-user with memfd guest memory and a
//! split ring), which lays chains out by hand with direct descriptors. `rig.rs`: a session
//! table with real worker processes, without vhost-user.

#![allow(dead_code)] // Each test file uses part of the harness.

pub mod rig;

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{
    Direction, Op, RequestHeader, ResponseHeader, QUEUE_SIZE, RESPONSE_HEADER_SIZE, VERSION,
};
use vhost::vhost_user::Frontend;
use vhost_cuda::{
    frontend::{self, SplitRing, RING_AREA},
    vhu_cuda::{DEVICE_FEATURES, VHOST_F_LOG_ALL},
};
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};

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
const DATA: u64 = RING_AREA;

/// A guest as the device sees it (`vhost_cuda::frontend::GuestVm`: memfd RAM shared with the
/// daemon, a split ring per queue, set up as QEMU does), with a driver that puts chains of
/// direct descriptors on queue 0, in order, and panics on anything unexpected.
pub struct GuestVm {
    vm: frontend::GuestVm,
    ring: SplitRing,
    next_desc: u16,
    data_next: u64,
}

impl std::ops::Deref for GuestVm {
    type Target = frontend::GuestVm;
    fn deref(&self) -> &frontend::GuestVm {
        &self.vm
    }
}

/// A response and the output bytes of one call.
pub struct Reply {
    pub resp: ResponseHeader,
    pub out: Vec<u8>,
    pub used_len: u32,
}

impl GuestVm {
    /// Connects to the daemon without any handshake.
    pub fn connect_only(socket: &Path) -> Frontend {
        frontend::GuestVm::connect_only(socket, WAIT)
            .unwrap_or_else(|e| panic!("{}: {e}", socket.display()))
    }

    /// Connects and does what QEMU does when the guest driver starts the device.
    pub fn connect(socket: &Path) -> GuestVm {
        let vm = frontend::GuestVm::connect(socket, GUEST_RAM, WAIT)
            .unwrap_or_else(|e| panic!("{}: {e}", socket.display()));
        assert_eq!(
            vm.offered_features, DEVICE_FEATURES,
            "offered virtio features"
        );
        assert_eq!(
            vm.features,
            DEVICE_FEATURES & !VHOST_F_LOG_ALL,
            "acknowledged virtio features (dirty logging waits for a migration)"
        );
        let ring = SplitRing::new(0, vm.event_idx());
        GuestVm {
            vm,
            ring,
            next_desc: 0,
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
            self.ring
                .write_desc(&self.vm.mem, idx, addr, len, flags, self.next_desc)
                .unwrap();
        }
        // Always kick: the tests do not depend on the device's notification suppression.
        self.ring.publish(&self.vm.mem, head).unwrap();
        self.vm.kicks[0].write(1).unwrap();
        head
    }

    /// Lays out a request (header and input, then output and response space, each split in
    /// two descriptors) and submits it. Returns the head and where the output starts.
    pub fn submit(&mut self, h: &RequestHeader, input: &[u8], out_len: usize) -> (u16, u64) {
        let mut stream = h.encode().to_vec();
        stream.extend_from_slice(input);
        let r = self.alloc(stream.len() as u64);
        self.vm.mem.write_slice(&stream, GuestAddress(r)).unwrap();
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
        let mut out = Vec::new();
        let deadline = Instant::now() + WAIT;
        while out.len() < usize::from(n) {
            match self.ring.pop_used(&self.vm.mem).unwrap() {
                Some(u) => out.push(u),
                None => {
                    assert!(
                        Instant::now() < deadline,
                        "the device did not complete {n} chains"
                    );
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
        out
    }

    /// One request, waited for.
    pub fn call(&mut self, h: &RequestHeader, input: &[u8], out_len: usize) -> Reply {
        let (head, w) = self.submit(h, input, out_len);
        let used = self.wait_used(1);
        assert_eq!(used[0].0, u32::from(head));
        let mut out = vec![0u8; out_len];
        self.vm.mem.read_slice(&mut out, GuestAddress(w)).unwrap();
        let mut b = [0u8; RESPONSE_HEADER_SIZE];
        self.vm
            .mem
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
        self.vm.calls[0].read().is_ok()
    }
}

//! A session table with real worker processes, driven like the vring thread drives it: guest
//! RAM in a memfd (two regions at different file offsets, as QEMU lays out RAM below and above
//! 4 GiB), requests laid out in guest memory and parsed by the real chain parser, completions
//! recorded per chain.

use std::{
    collections::HashMap,
    fs::File,
    os::fd::FromRawFd,
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use qcuda_proto::{Op, RequestHeader, ResponseHeader, RESPONSE_HEADER_SIZE};
use vhost_cuda::{
    chain,
    cuda::CudaHost,
    guest_buffer::GuestRam,
    sandbox::{SandboxMode, SeccompMode},
    session::{ChainCompleter, SessionTable},
    worker::WorkerCommand,
};
use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, FileOffset, GuestAddress};

/// Bytes of each of the two regions.
pub const REGION: u64 = 32 << 20;
/// Guest-physical start of the high region.
pub const HIGH: u64 = 0x1_0000_0000;

/// Guest RAM in one memfd: [0, REGION) at file offset 0 and [HIGH, HIGH + REGION) at REGION.
pub fn guest_ram() -> Arc<GuestRam> {
    // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"qcuda-rig-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(2 * REGION).unwrap();
    Arc::new(
        GuestRam::from_ranges_with_files([
            (
                GuestAddress(0),
                usize::try_from(REGION).unwrap(),
                Some(FileOffset::new(file.try_clone().unwrap(), 0)),
            ),
            (
                GuestAddress(HIGH),
                usize::try_from(REGION).unwrap(),
                Some(FileOffset::new(file, REGION)),
            ),
        ])
        .unwrap(),
    )
}

/// The `vhost-cuda` binary as the worker command, logging at `log`. `QCUDA_WORKER_BINARY`
/// names another copy (a test binary carried to a GPU host, where cargo's path does not exist).
pub fn worker_binary(log: &str) -> WorkerCommand {
    let program = std::env::var_os("QCUDA_WORKER_BINARY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_vhost-cuda").into());
    // Sandboxed as the daemon's default (--sandbox=namespace), so that every worker test
    // also runs through the sandbox.
    WorkerCommand::program(program, None, log)
        .with_sandbox(SandboxMode::Namespace, SeccompMode::Enforce)
}

/// Completions by chain head.
#[derive(Default)]
pub struct Completions {
    done: Mutex<HashMap<u16, u32>>,
    cv: Condvar,
}

impl ChainCompleter for Completions {
    fn complete(&self, head: u16, used_len: u32) {
        let prev = self.done.lock().unwrap().insert(head, used_len);
        assert!(prev.is_none(), "chain {head} completed twice");
        self.cv.notify_all();
    }
}

impl Completions {
    /// Waits up to `timeout` for chain `head`; its used length.
    pub fn wait(&self, head: u16, timeout: Duration) -> Option<u32> {
        let d = self.done.lock().unwrap();
        let (d, _) = self
            .cv
            .wait_timeout_while(d, timeout, |d| !d.contains_key(&head))
            .unwrap();
        d.get(&head).copied()
    }

    /// Whether chain `head` has completed.
    pub fn is_done(&self, head: u16) -> bool {
        self.done.lock().unwrap().contains_key(&head)
    }
}

/// A request on its way.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub head: u16,
    /// Where the outputs start; the response follows them.
    pub out_at: u64,
    pub out_len: usize,
}

/// A response and the output bytes.
#[derive(Debug)]
pub struct Answer {
    pub resp: ResponseHeader,
    pub out: Vec<u8>,
}

pub struct Rig {
    pub mem: Arc<GuestRam>,
    pub host: Arc<CudaHost>,
    pub table: SessionTable,
    pub done: Arc<Completions>,
    next_low: u64,
    next_high: u64,
    next_head: u16,
}

impl Rig {
    pub fn new(command: WorkerCommand, label: &str) -> Rig {
        let host = CudaHost::probe();
        let table = SessionTable::new(host.clone(), command, label);
        Self::with_table(host, table, guest_ram())
    }

    /// A rig around `table` (made with `host`), serving guest RAM `mem`.
    pub fn with_table(host: Arc<CudaHost>, table: SessionTable, mem: Arc<GuestRam>) -> Rig {
        table.set_memory(mem.clone());
        Rig {
            mem,
            host,
            table,
            done: Arc::default(),
            next_low: 0x1000,
            next_high: HIGH,
            next_head: 0,
        }
    }

    fn alloc(next: &mut u64, base: u64, len: u64) -> u64 {
        if *next + len + 0x1000 > base + REGION {
            *next = base + 0x1000;
        }
        let at = *next;
        *next = (at + len + 0xfff) & !0xfff;
        at
    }

    /// Lays out a request (header and input in the low region, outputs and response in the
    /// high one) and dispatches it.
    pub fn submit(&mut self, h: &RequestHeader, input: &[u8], out_len: usize) -> Pending {
        let mut stream = h.encode().to_vec();
        stream.extend_from_slice(input);
        let r = Self::alloc(&mut self.next_low, 0, stream.len() as u64);
        self.mem.write_slice(&stream, GuestAddress(r)).unwrap();
        let wlen = out_len + RESPONSE_HEADER_SIZE;
        let w = Self::alloc(&mut self.next_high, HIGH, wlen as u64);
        // Poison the output and response area, so a missing write shows.
        self.mem
            .write_slice(&vec![0xa5; wlen], GuestAddress(w))
            .unwrap();
        let descs = [
            Descriptor::new(r, u32::try_from(stream.len()).unwrap(), 0, 0),
            Descriptor::new(
                w,
                u32::try_from(wlen).unwrap(),
                u16::try_from(VRING_DESC_F_WRITE).unwrap(),
                0,
            ),
        ];
        let parsed = chain::parse(&self.mem, descs).expect("a valid chain");
        let head = self.next_head;
        self.next_head = self.next_head.wrapping_add(1);
        self.table.dispatch(head, parsed, self.done.clone());
        Pending {
            head,
            out_at: w,
            out_len,
        }
    }

    /// Waits for a request's answer.
    #[track_caller]
    pub fn wait(&self, p: Pending, timeout: Duration) -> Answer {
        let used = self
            .done
            .wait(p.head, timeout)
            .unwrap_or_else(|| panic!("chain {} not completed within {timeout:?}", p.head));
        assert_eq!(
            used as usize,
            p.out_len + RESPONSE_HEADER_SIZE,
            "used length"
        );
        let mut out = vec![0u8; p.out_len];
        self.mem
            .read_slice(&mut out, GuestAddress(p.out_at))
            .unwrap();
        let mut b = [0u8; RESPONSE_HEADER_SIZE];
        self.mem
            .read_slice(&mut b, GuestAddress(p.out_at + p.out_len as u64))
            .unwrap();
        Answer {
            resp: ResponseHeader::decode(&b).unwrap(),
            out,
        }
    }

    /// One request, waited for (up to 30 s).
    #[track_caller]
    pub fn call(&mut self, h: &RequestHeader, input: &[u8], out_len: usize) -> Answer {
        let p = self.submit(h, input, out_len);
        self.wait(p, Duration::from_secs(30))
    }

    /// An op without buffers.
    #[track_caller]
    pub fn op(&mut self, session: u64, op: Op, args: &[u64]) -> ResponseHeader {
        self.call(&header(session, op, args), &[], 0).resp
    }
}

/// A header for `op` of `session` with `args`.
pub fn header(session: u64, op: Op, args: &[u64]) -> RequestHeader {
    let mut h = RequestHeader::new(op);
    h.session = session;
    h.args[..args.len()].copy_from_slice(args);
    h
}

/// Whether `pid` is a child of this process that has not been reaped (a zombie counts).
pub fn is_our_child(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) state ppid ...": comm may hold anything, so look after the last ')'.
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
    rest.split_whitespace().nth(1) == Some(&std::process::id().to_string())
}

/// The state letter of process `pid` (`Z` for a zombie), if it exists.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// The command line of process `pid`, NUL-separated arguments joined with spaces; for the
/// init of a worker's PID namespace (the daemon's child in the `namespace` sandbox), its
/// worker's.
pub fn cmdline(pid: u32) -> String {
    let read = |pid: &str| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default()
    };
    let own = read(&pid.to_string());
    if !own.contains(" --pid-namespace-init ") {
        return own;
    }
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children.split_whitespace().next().map_or(own, read)
}

/// Children of this process whose command line contains `needle`.
pub fn children_with(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| is_our_child(pid) && cmdline(pid).contains(needle))
        .collect()
}

/// Polls `f` until it holds or `timeout` passes.
pub fn within(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

//! QEMU's part: the vhost-user connection, guest RAM in a memfd and the queues' rings.

use std::{
    fs::File,
    os::fd::{AsRawFd, FromRawFd},
    os::unix::fs::FileExt,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use qcuda_proto::{NUM_QUEUES, QUEUE_SIZE};
use vhost::{
    vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures},
    VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo, VringConfigData,
};
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{
    error::{FrontendError, Result},
    split_ring::ring_layout,
};
use crate::vhu_cuda::{DEVICE_FEATURES, VHOST_F_LOG_ALL};

/// Guest RAM below this address holds the queues' rings (queue q's in the q-th 16 KiB); what
/// lies above is the caller's.
pub const RING_AREA: u64 = 0x1_0000;

/// A guest as the device sees it: memfd-backed RAM shared with the daemon and a split ring for
/// each queue, set up as QEMU sets them up when the guest driver starts the device.
pub struct GuestVm {
    /// The vhost-user connection (dropping it disconnects the VM).
    pub frontend: Frontend,
    /// Guest RAM, from guest-physical address 0.
    pub mem: GuestMemoryMmap,
    /// Each queue's kick eventfd (the guest's notification; `EFD_NONBLOCK`).
    pub kicks: Vec<EventFd>,
    /// Each queue's call eventfd (the device's interrupt; `EFD_NONBLOCK`).
    pub calls: Vec<EventFd>,
    /// The virtio features the device offered.
    pub offered_features: u64,
    /// The features acknowledged (what Linux's virtio core and qcuda.ko take of them).
    pub features: u64,
}

impl std::fmt::Debug for GuestVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestVm")
            .field("ram", &self.ram_bytes())
            .field("features", &format_args!("{:#x}", self.features))
            .finish_non_exhaustive()
    }
}

/// A memfd of `size` bytes, sparse until touched.
fn memfd(size: usize) -> Result<File> {
    // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"qcuda-frontend-guest".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(FrontendError::Io {
            what: "memfd_create",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size as u64).map_err(|source| FrontendError::Io {
        what: "sizing the guest RAM memfd",
        source,
    })?;
    Ok(f)
}

fn step<T>(step: &'static str, r: std::result::Result<T, vhost::Error>) -> Result<T> {
    r.map_err(|source| FrontendError::Handshake { step, source })
}

fn eventfd() -> Result<EventFd> {
    EventFd::new(EFD_NONBLOCK).map_err(|source| FrontendError::Io {
        what: "eventfd",
        source,
    })
}

impl GuestVm {
    /// Connects to the daemon's socket, retrying for up to `timeout` while it is not there yet,
    /// without any handshake.
    pub fn connect_only(socket: &Path, timeout: Duration) -> Result<Frontend> {
        let deadline = Instant::now() + timeout;
        loop {
            match Frontend::connect(socket, NUM_QUEUES as u64) {
                Ok(f) => return Ok(f),
                Err(source) if Instant::now() >= deadline => {
                    return Err(FrontendError::Connect {
                        path: socket.to_owned(),
                        source,
                    })
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Connects and does what QEMU does when the guest driver starts the device: owner,
    /// features (those of [`DEVICE_FEATURES`] the device offers: indirect descriptors and
    /// event indices, as Linux takes them), the memory table of `ram_bytes` of memfd RAM, and
    /// both queues' rings and eventfds, then enables the queues.
    pub fn connect(socket: &Path, ram_bytes: usize, timeout: Duration) -> Result<GuestVm> {
        let mut frontend = Self::connect_only(socket, timeout)?;
        let ram = memfd(ram_bytes)?;
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            ram_bytes,
            Some(FileOffset::new(ram, 0)),
        )])
        .map_err(FrontendError::memory)?;

        step("SET_OWNER", frontend.set_owner())?;
        let offered = step("GET_FEATURES", frontend.get_features())?;
        // Dirty logging is for a migration, which QEMU turns on by itself later: not at start.
        let features = offered & DEVICE_FEATURES & !VHOST_F_LOG_ALL;
        let protocol = step("GET_PROTOCOL_FEATURES", frontend.get_protocol_features())?;
        if !protocol.contains(VhostUserProtocolFeatures::MQ) {
            return Err(FrontendError::Missing("the MQ protocol feature"));
        }
        step(
            "SET_PROTOCOL_FEATURES",
            frontend.set_protocol_features(protocol),
        )?;
        if step("GET_QUEUE_NUM", frontend.get_queue_num())? != NUM_QUEUES as u64 {
            return Err(FrontendError::Missing("qcuda's two queues"));
        }
        step("SET_FEATURES", frontend.set_features(features))?;

        let regions = mem
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|source| FrontendError::Handshake {
                step: "describing guest RAM",
                source,
            })?;
        step("SET_MEM_TABLE", frontend.set_mem_table(&regions))?;

        let mut kicks = Vec::new();
        let mut calls = Vec::new();
        for q in 0..NUM_QUEUES {
            let (desc, avail, used) = ring_layout(q);
            let va = |gpa: u64| -> Result<u64> {
                mem.get_host_address(GuestAddress(gpa))
                    .map(|p| p as u64)
                    .map_err(FrontendError::memory)
            };
            step("SET_VRING_NUM", frontend.set_vring_num(q, QUEUE_SIZE))?;
            step("SET_VRING_BASE", frontend.set_vring_base(q, 0))?;
            let config = VringConfigData {
                queue_max_size: QUEUE_SIZE,
                queue_size: QUEUE_SIZE,
                flags: 0,
                desc_table_addr: va(desc)?,
                used_ring_addr: va(used)?,
                avail_ring_addr: va(avail)?,
                log_addr: None,
            };
            step("SET_VRING_ADDR", frontend.set_vring_addr(q, &config))?;
            let kick = eventfd()?;
            let call = eventfd()?;
            step("SET_VRING_KICK", frontend.set_vring_kick(q, &kick))?;
            step("SET_VRING_CALL", frontend.set_vring_call(q, &call))?;
            kicks.push(kick);
            calls.push(call);
        }
        for q in 0..NUM_QUEUES {
            step("SET_VRING_ENABLE", frontend.set_vring_enable(q, true))?;
        }
        Ok(GuestVm {
            frontend,
            mem,
            kicks,
            calls,
            offered_features: offered,
            features,
        })
    }

    /// Whether `VIRTIO_RING_F_EVENT_IDX` was negotiated.
    pub fn event_idx(&self) -> bool {
        self.features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0
    }

    /// Whether `VIRTIO_RING_F_INDIRECT_DESC` was negotiated.
    pub fn indirect(&self) -> bool {
        self.features & (1 << VIRTIO_RING_F_INDIRECT_DESC) != 0
    }

    /// Bytes of guest RAM.
    pub fn ram_bytes(&self) -> u64 {
        self.mem.iter().map(|r| r.len()).sum()
    }

    /// Turns dirty logging on as QEMU does when a migration starts: the log (one bit per
    /// 4 KiB page of guest RAM, in a memfd) through `SET_LOG_BASE`, then the features with
    /// `VHOST_F_LOG_ALL`, then `GET_FEATURES`, whose answer says the device has taken them.
    pub fn start_dirty_log(&self) -> Result<DirtyLog> {
        let pages = self.ram_bytes().div_ceil(LOG_PAGE);
        let log = DirtyLog {
            file: memfd(usize::try_from(pages.div_ceil(8)).unwrap_or(usize::MAX))?,
            pages,
        };
        step(
            "SET_LOG_BASE",
            self.frontend.set_log_base(
                0,
                Some(VhostUserDirtyLogRegion {
                    mmap_size: pages.div_ceil(8),
                    mmap_offset: 0,
                    mmap_handle: log.file.as_raw_fd(),
                }),
            ),
        )?;
        step(
            "SET_FEATURES",
            self.frontend.set_features(self.features | VHOST_F_LOG_ALL),
        )?;
        step("GET_FEATURES", self.frontend.get_features())?;
        Ok(log)
    }

    /// Stops queue `q` as QEMU does when the VM stops (`GET_VRING_BASE`); returns the ring's
    /// next available index. With logging on, this is a migration's last stop.
    pub fn stop_queue(&self, q: usize) -> Result<u32> {
        step("GET_VRING_BASE", self.frontend.get_vring_base(q))
    }
}

/// Bytes of guest RAM per bit of the dirty log (`VHOST_LOG_PAGE`).
const LOG_PAGE: u64 = 0x1000;

/// QEMU's dirty log of guest RAM as the device writes it ([`GuestVm::start_dirty_log`]).
#[derive(Debug)]
pub struct DirtyLog {
    file: File,
    pages: u64,
}

impl DirtyLog {
    /// The guest pages (numbers of 4 KiB pages) marked since the last take, which clears them,
    /// as QEMU's sync of the log does. For a quiet device only: a page the device marks while
    /// this runs may be cleared unseen.
    pub fn take(&self) -> Result<Vec<u64>> {
        let io = |what| move |source| FrontendError::Io { what, source };
        let mut bytes = vec![0u8; usize::try_from(self.pages.div_ceil(8)).unwrap_or(0)];
        self.file
            .read_exact_at(&mut bytes, 0)
            .map_err(io("reading the dirty log"))?;
        self.file
            .write_all_at(&vec![0u8; bytes.len()], 0)
            .map_err(io("clearing the dirty log"))?;
        Ok((0..self.pages)
            .filter(|&p| bytes[(p / 8) as usize] & (1 << (p % 8)) != 0)
            .collect())
    }

    /// Pages of guest RAM the log covers.
    pub fn pages(&self) -> u64 {
        self.pages
    }
}

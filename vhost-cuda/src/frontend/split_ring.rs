//! The driver's side of one split virtqueue in guest RAM, kept as Linux's virtio_ring.c keeps
//! it: descriptors, the avail ring and whether an addition needs a kick, the used ring and
//! whether the device should interrupt.

use std::sync::atomic::{fence, Ordering};

use qcuda_proto::QUEUE_SIZE;
use virtio_bindings::bindings::virtio_ring::{VRING_AVAIL_F_NO_INTERRUPT, VRING_USED_F_NO_NOTIFY};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::error::{FrontendError, Result};

/// Guest-physical addresses of queue `q`'s descriptor table, avail ring and used ring: the
/// q-th 16 KiB of guest RAM, each part in a page of its own.
pub fn ring_layout(q: usize) -> (u64, u64, u64) {
    let base = (q as u64) * 0x4000;
    (base, base + 0x1000, base + 0x2000)
}

/// Bytes of one descriptor.
const DESC_BYTES: u64 = 16;

/// `vring_need_event`: whether moving an index from `old` to `new` passes `event`.
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// One split ring of [`QUEUE_SIZE`] entries.
#[derive(Debug)]
pub struct SplitRing {
    desc: u64,
    avail: u64,
    used: u64,
    event_idx: bool,
    avail_idx: u16,
    used_seen: u16,
}

impl SplitRing {
    /// The ring of queue `q` (at [`ring_layout`]), fresh: nothing added, nothing used.
    /// `event_idx`: whether `VIRTIO_RING_F_EVENT_IDX` was negotiated.
    pub fn new(q: usize, event_idx: bool) -> Self {
        let (desc, avail, used) = ring_layout(q);
        Self {
            desc,
            avail,
            used,
            event_idx,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    /// Writes descriptor `idx` of the ring's table.
    pub fn write_desc(
        &self,
        mem: &GuestMemoryMmap,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<()> {
        write_desc(
            mem,
            self.desc + DESC_BYTES * u64::from(idx),
            addr,
            len,
            flags,
            next,
        )
    }

    /// Puts chain `head` on the avail ring and publishes it. Returns whether the device wants
    /// a kick for it (`virtqueue_kick_prepare`: its avail event, or its `NO_NOTIFY` flag).
    pub fn publish(&mut self, mem: &GuestMemoryMmap, head: u16) -> Result<bool> {
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % QUEUE_SIZE);
        mem.write_obj(head, GuestAddress(slot))
            .map_err(FrontendError::memory)?;
        let old = self.avail_idx;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // The descriptors and the ring entry before the index.
        fence(Ordering::Release);
        mem.store(
            self.avail_idx,
            GuestAddress(self.avail + 2),
            Ordering::Release,
        )
        .map_err(FrontendError::memory)?;
        // The index before reading what the device asked for (virtio_mb).
        fence(Ordering::SeqCst);
        if self.event_idx {
            let avail_event: u16 = mem
                .load(
                    GuestAddress(self.used + 4 + 8 * u64::from(QUEUE_SIZE)),
                    Ordering::Acquire,
                )
                .map_err(FrontendError::memory)?;
            Ok(need_event(avail_event, self.avail_idx, old))
        } else {
            let flags: u16 = mem
                .load(GuestAddress(self.used), Ordering::Acquire)
                .map_err(FrontendError::memory)?;
            Ok(u32::from(flags) & VRING_USED_F_NO_NOTIFY == 0)
        }
    }

    /// Whether the device has used chains that [`Self::pop_used`] has not taken yet.
    pub fn has_used(&self, mem: &GuestMemoryMmap) -> Result<bool> {
        let idx: u16 = mem
            .load(GuestAddress(self.used + 2), Ordering::Acquire)
            .map_err(FrontendError::memory)?;
        Ok(idx != self.used_seen)
    }

    /// The next used chain: its head and used length.
    pub fn pop_used(&mut self, mem: &GuestMemoryMmap) -> Result<Option<(u32, u32)>> {
        if !self.has_used(mem)? {
            return Ok(None);
        }
        let at = self.used + 4 + 8 * u64::from(self.used_seen % QUEUE_SIZE);
        let id: u32 = mem
            .read_obj(GuestAddress(at))
            .map_err(FrontendError::memory)?;
        let len: u32 = mem
            .read_obj(GuestAddress(at + 4))
            .map_err(FrontendError::memory)?;
        self.used_seen = self.used_seen.wrapping_add(1);
        Ok(Some((id, len)))
    }

    /// Asks the device to interrupt at its next completion (`virtqueue_enable_cb`). Returns
    /// false if completions are already waiting: the caller takes them instead of sleeping.
    pub fn enable_cb(&mut self, mem: &GuestMemoryMmap) -> Result<bool> {
        if self.event_idx {
            let at = self.avail + 4 + 2 * u64::from(QUEUE_SIZE);
            mem.store(self.used_seen, GuestAddress(at), Ordering::Release)
                .map_err(FrontendError::memory)?;
        } else {
            mem.store(0u16, GuestAddress(self.avail), Ordering::Release)
                .map_err(FrontendError::memory)?;
        }
        fence(Ordering::SeqCst);
        Ok(!self.has_used(mem)?)
    }

    /// Asks the device not to interrupt (`virtqueue_disable_cb`). With event indices Linux
    /// writes 0 as the used event, which the device passes only when its index wraps; so
    /// does this.
    pub fn disable_cb(&mut self, mem: &GuestMemoryMmap) -> Result<()> {
        let (value, at) = if self.event_idx {
            (0u16, self.avail + 4 + 2 * u64::from(QUEUE_SIZE))
        } else {
            (
                u16::try_from(VRING_AVAIL_F_NO_INTERRUPT).unwrap_or(1),
                self.avail,
            )
        };
        mem.store(value, GuestAddress(at), Ordering::Release)
            .map_err(FrontendError::memory)
    }
}

/// Writes one descriptor at guest-physical `at` (in the ring's table or an indirect table).
pub(super) fn write_desc(
    mem: &GuestMemoryMmap,
    at: u64,
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
) -> Result<()> {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    d[14..16].copy_from_slice(&next.to_le_bytes());
    mem.write_slice(&d, GuestAddress(at))
        .map_err(FrontendError::memory)
}

#[cfg(test)]
mod tests {
    use super::need_event;

    #[test]
    fn need_event_is_virtio_rings() {
        // The device asked to hear about index 5: moving 4 -> 6 passes it, 5 -> 6 does not.
        assert!(need_event(5, 6, 4));
        assert!(!need_event(5, 7, 6));
        // Across the wrap.
        assert!(need_event(u16::MAX, 1, u16::MAX - 1));
        assert!(!need_event(0, 0, 0));
    }
}

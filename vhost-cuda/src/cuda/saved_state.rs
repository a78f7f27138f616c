//! The saved state of one guest process's GPU state, and its byte format.
//!
//! [`GpuState::capture`](super::GpuState::capture) fills a [`SavedState`] from the state's
//! record of how each object was made (creation call and later settings, not a log of calls)
//! and the contents of its memory; [`GpuState::restore`](super::GpuState::restore) makes it
//! all again, behind the same handle numbers and at the same device addresses, in fresh
//! contexts of this or another worker. Between the two the state may sit in host memory or a
//! file, and later cross to another daemon, so the bytes are a versioned, self-describing
//! format, and decoding trusts nothing: every count and length is checked against the bytes
//! that are left, nothing is allocated before its bytes are known to be there, and no input
//! panics (the fuzz target `saved_state` feeds it anything).
//!
//! Layout (little-endian): the 8-byte magic `QCUDAGS1`, the format version (u32), a reserved
//! u32 (0), the length of everything after the header (u64); then records, each a tag (u32),
//! the length of its body (u64) and the body. Bodies are fixed fields and length-prefixed byte
//! strings (u64 length). A reader refuses an unknown tag, a body longer or shorter than its
//! fields, and trailing bytes. The first record is [`TAG_SESSION`], exactly once.
//!
//! Versions 2 and 3 are read; 3 is written only for a state with an allocation that refers to
//! pre-copied chunks ([`TAG_ALLOCATION_CHUNKS`], the final state of a live migration that
//! pre-copied, `cuda/precopy.rs`): dev (u32), ptr, size, block (u64), the number of chunks
//! referred to (u64), each chunk's offset, length and hash (4 x u64: a chunk as
//! `precopy::chunks_of` cuts the allocation, in increasing order, at least one), then the bytes
//! of the other chunks, in order (length-prefixed, exactly as long as they are). Each chunk of
//! the allocation is thus either referred to or carried, once.

use std::{ffi::CString, io};

mod codec;
mod graphs;

pub use codec::DecodeError;
use codec::{Reader, Writer};
pub(crate) use codec::{OLDEST_VERSION, VERSION};
pub(crate) use graphs::{
    GraphRole, SavedConditional, SavedExec, SavedGraph, SavedNode, SavedNodeKind,
};

use super::driver::array::{array_bytes, max_mip_levels, mip_level, ArrayDesc};

/// The first bytes of every saved state.
pub(crate) const MAGIC: [u8; 8] = *b"QCUDAGS1";
const HEADER_LEN: usize = 8 + 4 + 4 + 8;

const TAG_SESSION: u32 = 1;
const TAG_CONTEXT: u32 = 2;
const TAG_RUN: u32 = 3;
const TAG_ALLOCATION: u32 = 4;
const TAG_MODULE: u32 = 5;
const TAG_GLOBAL: u32 = 6;
const TAG_FUNCTION: u32 = 7;
const TAG_STREAM: u32 = 8;
const TAG_EVENT: u32 = 9;
const TAG_POOL: u32 = 10;
const TAG_VMM_ALLOCATION: u32 = 11;
const TAG_VMM_RESERVATION: u32 = 12;
const TAG_VMM_MAPPING: u32 = 13;
/// An allocation whose pre-copied chunks are referred to, not carried (version 3).
const TAG_ALLOCATION_CHUNKS: u32 = 14;
const TAG_HOST_MAPPING: u32 = 30;
const TAG_MANAGED: u32 = 31;

const TAG_ARRAY: u32 = 40;
const TAG_MIPMAPPED: u32 = 41;
const TAG_LEVEL: u32 = 42;
const TAG_OBJECT: u32 = 43;

/// Most arrays (level arrays with handles included), mipmapped arrays and texture or surface
/// objects a saved state may hold: what a session may hold (`gpu_state/arrays.rs`).
pub(crate) const MAX_ARRAYS: usize = 1 << 16;
pub(crate) const MAX_MIPMAPPED: usize = 1 << 14;
pub(crate) const MAX_OBJECTS: usize = 1 << 16;
/// The array flags a saved array may have: CUDA_ARRAY3D_LAYERED | SURFACE_LDST | CUBEMAP |
/// TEXTURE_GATHER (no sparse or deferred-mapping array is ever saved).
pub(crate) const ARRAY_FLAGS: u32 = 0xf;
/// The texture flags: CU_TRSF_READ_AS_INTEGER | NORMALIZED_COORDINATES | SRGB |
/// DISABLE_TRILINEAR_OPTIMIZATION | SEAMLESS_CUBEMAP.
pub(crate) const TEX_FLAGS: u32 = 0x73;
/// The last `CUresourceViewFormat` (CU_RES_VIEW_FORMAT_UNSIGNED_BC7).
pub(crate) const MAX_VIEW_FORMAT: u32 = 0x22;

/// Whether a texture descriptor and view hold only values the driver's enums and flags take.
pub(crate) fn tex_desc_ok(t: &SavedTexDesc, view: Option<&SavedView>) -> bool {
    t.address.iter().all(|&m| m <= 3)
        && t.filter <= 1
        && t.mipmap_filter <= 1
        && t.flags & !TEX_FLAGS == 0
        && view.is_none_or(|v| v.format <= MAX_VIEW_FORMAT)
}

/// A guest process's saved GPU state. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SavedState {
    /// The session (guest process) it belongs to.
    pub(crate) session: u64,
    /// The last handle number given out (new handles continue after it).
    pub(crate) last_handle: u64,
    /// Guest devices of the state when captured.
    pub(crate) devices: u32,
    /// The address space the ranges lie in (`--gpu-va-base`, `--gpu-va-size`).
    pub(crate) va_base: u64,
    pub(crate) va_size: u64,
    pub(crate) contexts: Vec<SavedContext>,
    pub(crate) runs: Vec<SavedRun>,
    pub(crate) allocations: Vec<SavedAllocation>,
    pub(crate) modules: Vec<SavedModule>,
    pub(crate) globals: Vec<SavedGlobal>,
    pub(crate) functions: Vec<SavedFunction>,
    pub(crate) streams: Vec<SavedStream>,
    pub(crate) events: Vec<SavedEvent>,
    pub(crate) pools: Vec<SavedPool>,
    /// The program's own VMM objects (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`).
    pub(crate) vmm_allocations: Vec<SavedVmmAllocation>,
    pub(crate) vmm_reservations: Vec<SavedVmmReservation>,
    pub(crate) vmm_mappings: Vec<SavedVmmMapping>,
    /// Graphs (the program's, those their nodes hold, executable graphs' copies), their
    /// conditional handles, and executable graphs (`saved_state/graphs.rs`).
    pub(crate) graphs: Vec<SavedGraph>,
    pub(crate) conditionals: Vec<SavedConditional>,
    pub(crate) execs: Vec<SavedExec>,
    /// Guest memory mapped for the GPU: pinned, registered, and managed memory left in guest
    /// RAM (its pinned form). The pages are not here: guest RAM moves with the VM.
    pub(crate) host_mappings: Vec<SavedHostMapping>,
    /// Managed memory placed on the device at its guest address, with the device's copy.
    pub(crate) managed: Vec<SavedManaged>,
    /// CUDA arrays the program created (not the levels of mipmapped arrays), with contents.
    pub(crate) arrays: Vec<SavedArray>,
    /// Mipmapped arrays, with the contents of every level.
    pub(crate) mipmapped: Vec<SavedMipmapped>,
    /// Level arrays the program holds handles of.
    pub(crate) levels: Vec<SavedLevel>,
    /// Texture and surface objects, in the order they were created.
    pub(crate) objects: Vec<SavedObject>,
}

/// Guest memory mapped into the worker and registered with the driver (`HostMap`): where
/// the guest has it, where the worker mapped it, the device address the guest was told, and
/// the guest-physical runs (held by qcuda.ko, so valid wherever the VM goes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedHostMapping {
    pub(crate) guest: u64,
    pub(crate) len: u64,
    /// Its address in the worker (a restore maps it there again).
    pub(crate) local: u64,
    /// The device address the guest learnt (a restore must give it again).
    pub(crate) dev_addr: u64,
    /// The guest device ordinal whose context registered it.
    pub(crate) dev: u32,
    /// `HOST_MAP_*` flags it was made with (read-only; managed, for managed memory that
    /// stayed in guest RAM).
    pub(crate) flags: u32,
    /// (guest-physical address, length) of each run, in order.
    pub(crate) runs: Vec<(u64, u64)>,
}

/// Managed memory placed on the device at its guest address (gpu_state/managed.rs): the
/// guest pages (its staging side, by their runs) and the device's copy of the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedManaged {
    pub(crate) guest: u64,
    pub(crate) dev: u32,
    /// (guest-physical address, length) of each run of the guest pages, in order.
    pub(crate) runs: Vec<(u64, u64)>,
    /// The device's bytes at `guest` (as many as the guest mapped).
    pub(crate) contents: Vec<u8>,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`: extents, format number, channels, flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SavedArrayDesc {
    pub(crate) width: u64,
    pub(crate) height: u64,
    pub(crate) depth: u64,
    pub(crate) format: u32,
    pub(crate) channels: u32,
    pub(crate) flags: u32,
}

/// A CUDA array: its handle, descriptor and contents (rows of width x element bytes, height
/// rows (at least 1) per slice, depth slices (at least 1): every layer and cubemap face).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedArray {
    pub(crate) handle: u64,
    pub(crate) dev: u32,
    pub(crate) desc: SavedArrayDesc,
    pub(crate) contents: Vec<u8>,
}

/// A mipmapped array: handle, level 0's descriptor, level count, and every level's contents
/// (laid out as [`SavedArray::contents`], each level sized as CUDA sizes levels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedMipmapped {
    pub(crate) handle: u64,
    pub(crate) dev: u32,
    pub(crate) desc: SavedArrayDesc,
    pub(crate) levels: Vec<Vec<u8>>,
}

/// The handle the program holds of one level of a mipmapped array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SavedLevel {
    pub(crate) handle: u64,
    /// [`SavedMipmapped::handle`] of the array it is a level of.
    pub(crate) mipmapped: u64,
    pub(crate) level: u32,
}

/// What a texture or surface object views, in the program's terms: arrays by handle, memory
/// by device address (which a restore keeps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SavedResource {
    Array(u64),
    Mipmapped(u64),
    Linear {
        ptr: u64,
        format: u32,
        channels: u32,
        size: u64,
    },
    Pitch2D {
        ptr: u64,
        format: u32,
        channels: u32,
        width: u64,
        height: u64,
        pitch: u64,
    },
}

/// `CUDA_TEXTURE_DESC`, its floats as their bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SavedTexDesc {
    pub(crate) address: [u32; 3],
    pub(crate) filter: u32,
    pub(crate) flags: u32,
    pub(crate) max_anisotropy: u32,
    pub(crate) mipmap_filter: u32,
    pub(crate) mipmap_bias: u32,
    pub(crate) min_clamp: u32,
    pub(crate) max_clamp: u32,
    pub(crate) border: [u32; 4],
}

/// `CUDA_RESOURCE_VIEW_DESC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SavedView {
    pub(crate) format: u32,
    pub(crate) extent: [u64; 3],
    /// First and last mipmap level, first and last layer.
    pub(crate) levels: [u32; 4],
}

/// A texture or surface object: the driver's value the program holds (a restore must give it
/// the same one), and how it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SavedObject {
    pub(crate) value: u64,
    pub(crate) dev: u32,
    /// A surface object (over an array; no texture or view descriptor).
    pub(crate) surface: bool,
    pub(crate) resource: SavedResource,
    pub(crate) tex: SavedTexDesc,
    pub(crate) view: Option<SavedView>,
}

impl SavedArrayDesc {
    /// The driver's form of it, if its extents fit this machine.
    pub(crate) fn to_desc(self) -> Option<ArrayDesc> {
        Some(ArrayDesc {
            width: usize::try_from(self.width).ok()?,
            height: usize::try_from(self.height).ok()?,
            depth: usize::try_from(self.depth).ok()?,
            format: self.format,
            channels: self.channels,
            flags: self.flags,
        })
    }

    pub(crate) fn from_desc(d: &ArrayDesc) -> Self {
        Self {
            width: d.width as u64,
            height: d.height as u64,
            depth: d.depth as u64,
            format: d.format,
            channels: d.channels,
            flags: d.flags,
        }
    }
}

/// A physical allocation the program made with `cuMemCreate`, and its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedVmmAllocation {
    /// The state's own number for it (what mappings name).
    pub(crate) id: u64,
    pub(crate) dev: u32,
    pub(crate) size: u64,
    /// `CUmemAllocationHandleType` bits, compression, RDMA, usage, as created.
    pub(crate) handle_types: u32,
    pub(crate) compressed: bool,
    pub(crate) rdma_capable: bool,
    pub(crate) usage: u16,
    /// The program's handle of it (0: none left, only mappings keep it).
    pub(crate) handle: u64,
    /// References the handle holds (`cuMemCreate` and every `cuMemRetainAllocationHandle`).
    pub(crate) refs: u64,
    pub(crate) contents: Vec<u8>,
}

/// An address range the program reserved (`cuMemAddressReserve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SavedVmmReservation {
    pub(crate) va: u64,
    pub(crate) size: u64,
}

/// A mapping the program made (`cuMemMap`), with the access set on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedVmmMapping {
    pub(crate) va: u64,
    pub(crate) size: u64,
    /// Offset in the physical allocation.
    pub(crate) offset: u64,
    /// [`SavedVmmAllocation::id`] of what it maps.
    pub(crate) allocation: u64,
    /// (guest device ordinal, `ACCESS_*`) of every device with access.
    pub(crate) access: Vec<(u32, u32)>,
}

/// A context on one guest device, with its settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SavedContext {
    pub(crate) dev: u32,
    /// `cuCtxSetCacheConfig`, if set.
    pub(crate) cache_config: Option<u32>,
    /// `cuCtxSetLimit`s: (limit, value), in the order set.
    pub(crate) limits: Vec<(u32, u64)>,
    /// Guest devices whose memory this context reaches (peer access enabled).
    pub(crate) peers: Vec<u32>,
    /// Whether the device's memory came from its reserved range.
    pub(crate) ranged: bool,
}

/// A mapped run of a device range: its address, length, and the size class it was cut into
/// (`None`: a large block's run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SavedRun {
    pub(crate) dev: u32,
    pub(crate) va: u64,
    pub(crate) len: u64,
    pub(crate) class: Option<u8>,
}

/// A device allocation and its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedAllocation {
    pub(crate) dev: u32,
    pub(crate) ptr: u64,
    /// The bytes the guest asked for (what the allocation table holds).
    pub(crate) size: u64,
    /// The block's length in the range (what it was cut to).
    pub(crate) block: u64,
    /// The bytes of the chunks it carries (`cuda/precopy.rs` cuts it into chunks): all of
    /// them, or, with `refs`, those of the chunks not referred to, in order.
    pub(crate) contents: Vec<u8>,
    /// The chunks a live migration pre-copied and that still hash as sent, in order: the
    /// destination fills them from its pre-copy store (record `TAG_ALLOCATION_CHUNKS`).
    pub(crate) refs: Vec<SavedChunkRef>,
}

/// A chunk of an allocation that a saved state refers to instead of carrying it: its offset
/// and length (as `precopy::chunks_of` cuts the allocation) and the hash of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SavedChunkRef {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) hash: [u64; 2],
}

impl SavedAllocation {
    /// Bytes of the chunks it carries (its size, less the chunks it refers to).
    pub(crate) fn carried(&self) -> u64 {
        self.size
            .saturating_sub(self.refs.iter().map(|r| r.len).sum::<u64>())
    }
}

/// Whether `refs` name chunks of an allocation of `size` bytes as `precopy::chunks_of` cuts
/// it, each once, in order, at least one.
fn chunk_refs_ok(size: u64, refs: &[SavedChunkRef]) -> bool {
    use super::precopy::CHUNK;
    !refs.is_empty()
        && refs.windows(2).all(|w| w[0].offset < w[1].offset)
        && refs.iter().all(|r| {
            r.offset.is_multiple_of(CHUNK) && r.offset < size && r.len == CHUNK.min(size - r.offset)
        })
}

/// A loaded module: its handle, device and image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedModule {
    pub(crate) handle: u64,
    pub(crate) dev: u32,
    pub(crate) image: Vec<u8>,
}

/// A module global the guest looked up, with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedGlobal {
    pub(crate) module: u64,
    pub(crate) name: CString,
    pub(crate) ptr: u64,
    pub(crate) contents: Vec<u8>,
}

/// A function handle: which kernel of which module, and its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedFunction {
    pub(crate) handle: u64,
    pub(crate) module: u64,
    pub(crate) name: CString,
    pub(crate) cache_config: Option<u32>,
    /// `cuFuncSetAttribute`s: (attribute, value), in the order set.
    pub(crate) attributes: Vec<(i32, i32)>,
}

/// A stream: how it was created, and the attributes set on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedStream {
    pub(crate) handle: u64,
    pub(crate) dev: u32,
    pub(crate) flags: u32,
    pub(crate) priority: i32,
    pub(crate) attributes: Vec<(u32, [u8; 64])>,
}

/// An event: how it was created, and whether it had been recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SavedEvent {
    pub(crate) handle: u64,
    pub(crate) dev: u32,
    pub(crate) flags: u32,
    pub(crate) recorded: bool,
}

/// A memory pool as the guest knows it: a device's default pool, or one the guest created,
/// with the settings it gave it. (Version 1 held only `handle` and `dev`, of default pools.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedPool {
    pub(crate) handle: u64,
    pub(crate) dev: u32,
    /// The device's default pool (else `cuMemPoolCreate`'s).
    pub(crate) default: bool,
    /// The device's current pool (`cuDeviceSetMemPool`), if not its default one.
    pub(crate) current: bool,
    /// `maxSize` it was created with (0 for a default pool, or no limit).
    pub(crate) max_size: u64,
    /// Created shareable (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`).
    pub(crate) shareable: bool,
    /// Settable attributes (1..=4): (attribute, value), in the order set.
    pub(crate) settings: Vec<(u32, u64)>,
    /// Access granted: (guest device ordinal, flags), in the order granted.
    pub(crate) access: Vec<(u32, u32)>,
}

impl Writer {
    fn desc(&mut self, d: &SavedArrayDesc) -> &mut Self {
        self.u64(d.width)
            .u64(d.height)
            .u64(d.depth)
            .u32(d.format)
            .u32(d.channels)
            .u32(d.flags)
    }
    fn object(&mut self, o: &SavedObject) -> &mut Self {
        self.u64(o.value).u32(o.dev).u8(u8::from(o.surface));
        let (kind, addr, format, channels, [w, h, p]) = match o.resource {
            SavedResource::Array(a) => (0, a, 0, 0, [0; 3]),
            SavedResource::Mipmapped(m) => (1, m, 0, 0, [0; 3]),
            SavedResource::Linear {
                ptr,
                format,
                channels,
                size,
            } => (2, ptr, format, channels, [size, 0, 0]),
            SavedResource::Pitch2D {
                ptr,
                format,
                channels,
                width,
                height,
                pitch,
            } => (3, ptr, format, channels, [width, height, pitch]),
        };
        self.u32(kind)
            .u64(addr)
            .u32(format)
            .u32(channels)
            .u64(w)
            .u64(h)
            .u64(p);
        let t = &o.tex;
        for v in t.address {
            self.u32(v);
        }
        self.u32(t.filter)
            .u32(t.flags)
            .u32(t.max_anisotropy)
            .u32(t.mipmap_filter)
            .u32(t.mipmap_bias)
            .u32(t.min_clamp)
            .u32(t.max_clamp);
        for v in t.border {
            self.u32(v);
        }
        let v = o.view.unwrap_or_default();
        self.u8(u8::from(o.view.is_some())).u32(v.format);
        for e in v.extent {
            self.u64(e);
        }
        for l in v.levels {
            self.u32(l);
        }
        self
    }
}

impl Reader<'_> {
    fn desc(&mut self) -> Result<SavedArrayDesc, DecodeError> {
        Ok(SavedArrayDesc {
            width: self.u64()?,
            height: self.u64()?,
            depth: self.u64()?,
            format: self.u32()?,
            channels: self.u32()?,
            flags: self.u32()?,
        })
    }
    fn object(&mut self) -> Result<SavedObject, DecodeError> {
        let (value, dev, surface) = (self.u64()?, self.u32()?, self.flag()?);
        let (kind, addr, format, channels) = (self.u32()?, self.u64()?, self.u32()?, self.u32()?);
        let [w, h, p] = [self.u64()?, self.u64()?, self.u64()?];
        let bad = || DecodeError::Field("object resource");
        let resource = match kind {
            0 | 1 if format != 0 || channels != 0 || w != 0 || h != 0 || p != 0 => {
                return Err(bad())
            }
            0 => SavedResource::Array(addr),
            1 => SavedResource::Mipmapped(addr),
            2 if h != 0 || p != 0 => return Err(bad()),
            2 => SavedResource::Linear {
                ptr: addr,
                format,
                channels,
                size: w,
            },
            3 => SavedResource::Pitch2D {
                ptr: addr,
                format,
                channels,
                width: w,
                height: h,
                pitch: p,
            },
            _ => return Err(bad()),
        };
        let address = self.u32s::<3>()?;
        let [filter, flags, max_anisotropy, mipmap_filter, mipmap_bias, min_clamp, max_clamp] =
            self.u32s::<7>()?;
        let tex = SavedTexDesc {
            address,
            filter,
            flags,
            max_anisotropy,
            mipmap_filter,
            mipmap_bias,
            min_clamp,
            max_clamp,
            border: self.u32s::<4>()?,
        };
        let present = self.flag()?;
        let view = SavedView {
            format: self.u32()?,
            extent: [self.u64()?, self.u64()?, self.u64()?],
            levels: self.u32s::<4>()?,
        };
        if !present && view != SavedView::default() {
            return Err(DecodeError::Field("object view"));
        }
        Ok(SavedObject {
            value,
            dev,
            surface,
            resource,
            tex,
            view: present.then_some(view),
        })
    }
}

/// Where [`SavedState::encode_into`] puts its records: each is its tag, its body's length and
/// the body (the fields in a [`Writer`], then a tail written as it is: device memory's
/// contents). The first error is kept and the records after it dropped.
struct RecordSink<'o, W: io::Write> {
    out: &'o mut W,
    /// Bytes of records written.
    len: u64,
    failed: Option<io::Error>,
}

/// Writes an allocation's contents into a saved state as they are read from the device
/// ([`SavedState::encode_streaming`]).
pub(crate) type ContentsFill<'f> =
    &'f mut dyn FnMut(&SavedAllocation, &mut dyn io::Write) -> io::Result<()>;

/// Counts what passes through it.
struct Counted<'o> {
    out: &'o mut dyn io::Write,
    n: u64,
}

impl io::Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl<W: io::Write> RecordSink<'_, W> {
    /// A record whose body is `w`'s fields and then `tail` bytes that `fill` writes.
    fn put_filled(
        &mut self,
        tag: u32,
        w: &mut Writer,
        tail: u64,
        fill: &mut dyn FnMut(&mut dyn io::Write) -> io::Result<()>,
    ) {
        let body = w.0.len() as u64 + tail;
        if self.failed.is_none() {
            let wrote = self
                .out
                .write_all(&tag.to_le_bytes())
                .and_then(|()| self.out.write_all(&body.to_le_bytes()))
                .and_then(|()| self.out.write_all(&w.0))
                .and_then(|()| {
                    let mut counted = Counted {
                        out: &mut *self.out,
                        n: 0,
                    };
                    fill(&mut counted)?;
                    if counted.n == tail {
                        Ok(())
                    } else {
                        Err(io::Error::other(format!(
                            "{} bytes of contents written, {tail} expected",
                            counted.n
                        )))
                    }
                });
            if let Err(e) = wrote {
                self.failed = Some(e);
            }
        }
        self.len += 4 + 8 + body;
        w.0.clear();
    }

    fn put(&mut self, tag: u32, w: &mut Writer) {
        self.put_with(tag, w, &[]);
    }

    fn put_with(&mut self, tag: u32, w: &mut Writer, tail: &[u8]) {
        let body = (w.0.len() + tail.len()) as u64;
        if self.failed.is_none() {
            let wrote = self
                .out
                .write_all(&tag.to_le_bytes())
                .and_then(|()| self.out.write_all(&body.to_le_bytes()))
                .and_then(|()| self.out.write_all(&w.0))
                .and_then(|()| self.out.write_all(tail));
            if let Err(e) = wrote {
                self.failed = Some(e);
            }
        }
        self.len += 4 + 8 + body;
        w.0.clear();
    }
}

impl SavedState {
    /// The bytes of the state (see the module documentation).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = io::Cursor::new(Vec::new());
        // Writing into memory fails only where allocating would (and that aborts).
        let _ = self.encode_into(&mut out);
        out.into_inner()
    }

    /// Writes the state's bytes (those of [`encode`](Self::encode)) into `out` as they are
    /// made, record by record, and returns their length: the contents of device memory go
    /// from the capture to `out` in one copy, never assembled with the rest (a saved state of
    /// gigabytes goes straight into its file). The header's length is written last (`out` is
    /// seeked back to it and then to the end).
    pub(crate) fn encode_into(&self, out: &mut (impl io::Write + io::Seek)) -> io::Result<u64> {
        self.encode_streaming(out, None)
    }

    /// [`encode_into`](Self::encode_into), where `fill` writes the contents of each allocation
    /// captured without them (empty contents, a size): exactly its size in bytes, as it reads
    /// them from the device. A `fill` that writes another number of bytes is an error.
    pub(crate) fn encode_streaming(
        &self,
        out: &mut (impl io::Write + io::Seek),
        mut fill: Option<ContentsFill<'_>>,
    ) -> io::Result<u64> {
        let start = out.stream_position()?;
        // Version 3 only for what version 2 cannot say, so that older daemons read the rest.
        let version = if self.allocations.iter().any(|a| !a.refs.is_empty()) {
            VERSION
        } else {
            OLDEST_VERSION
        };
        out.write_all(&MAGIC)?;
        out.write_all(&version.to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        out.write_all(&0u64.to_le_bytes())?;
        let mut rec = RecordSink {
            out: &mut *out,
            len: 0,
            failed: None,
        };
        let mut w = Writer::default();
        w.u64(self.session)
            .u64(self.last_handle)
            .u32(self.devices)
            .u64(self.va_base)
            .u64(self.va_size);
        rec.put(TAG_SESSION, &mut w);
        for c in &self.contexts {
            w.u32(c.dev).opt_u32(c.cache_config).u8(u8::from(c.ranged));
            w.u64(c.limits.len() as u64);
            for &(l, v) in &c.limits {
                w.u32(l).u64(v);
            }
            w.u64(c.peers.len() as u64);
            for &p in &c.peers {
                w.u32(p);
            }
            rec.put(TAG_CONTEXT, &mut w);
        }
        for r in &self.runs {
            w.u32(r.dev)
                .u64(r.va)
                .u64(r.len)
                .u8(r.class.map_or(0xff, |c| c));
            rec.put(TAG_RUN, &mut w);
        }
        for a in &self.allocations {
            w.u32(a.dev).u64(a.ptr).u64(a.size).u64(a.block);
            let tag = if a.refs.is_empty() {
                TAG_ALLOCATION
            } else {
                w.u64(a.refs.len() as u64);
                for r in &a.refs {
                    w.u64(r.offset).u64(r.len).u64(r.hash[0]).u64(r.hash[1]);
                }
                TAG_ALLOCATION_CHUNKS
            };
            let carried = a.carried();
            match fill.as_mut() {
                Some(fill) if a.contents.is_empty() && carried > 0 => {
                    w.u64(carried);
                    rec.put_filled(tag, &mut w, carried, &mut |out| fill(a, out));
                }
                _ => {
                    w.u64(a.contents.len() as u64);
                    rec.put_with(tag, &mut w, &a.contents);
                }
            }
        }
        for m in &self.modules {
            w.u64(m.handle).u32(m.dev).bytes(&m.image);
            rec.put(TAG_MODULE, &mut w);
        }
        for g in &self.globals {
            w.u64(g.module)
                .bytes(g.name.as_bytes())
                .u64(g.ptr)
                .bytes(&g.contents);
            rec.put(TAG_GLOBAL, &mut w);
        }
        for f in &self.functions {
            w.u64(f.handle)
                .u64(f.module)
                .bytes(f.name.as_bytes())
                .opt_u32(f.cache_config);
            w.u64(f.attributes.len() as u64);
            for &(a, v) in &f.attributes {
                w.i32(a).i32(v);
            }
            rec.put(TAG_FUNCTION, &mut w);
        }
        for s in &self.streams {
            w.u64(s.handle).u32(s.dev).u32(s.flags).i32(s.priority);
            w.u64(s.attributes.len() as u64);
            for (id, v) in &s.attributes {
                w.u32(*id);
                w.0.extend_from_slice(v);
            }
            rec.put(TAG_STREAM, &mut w);
        }
        for e in &self.events {
            w.u64(e.handle)
                .u32(e.dev)
                .u32(e.flags)
                .u8(u8::from(e.recorded));
            rec.put(TAG_EVENT, &mut w);
        }
        for p in &self.pools {
            w.u64(p.handle)
                .u32(p.dev)
                .u8(u8::from(p.default))
                .u8(u8::from(p.current))
                .u64(p.max_size)
                .u8(u8::from(p.shareable));
            w.u64(p.settings.len() as u64);
            for &(a, v) in &p.settings {
                w.u32(a).u64(v);
            }
            w.u64(p.access.len() as u64);
            for &(d, f) in &p.access {
                w.u32(d).u32(f);
            }
            rec.put(TAG_POOL, &mut w);
        }
        for a in &self.vmm_allocations {
            w.u64(a.id)
                .u32(a.dev)
                .u64(a.size)
                .u32(a.handle_types)
                .u8(u8::from(a.compressed))
                .u8(u8::from(a.rdma_capable))
                .u32(u32::from(a.usage))
                .u64(a.handle)
                .u64(a.refs)
                .bytes(&a.contents);
            rec.put(TAG_VMM_ALLOCATION, &mut w);
        }
        for r in &self.vmm_reservations {
            w.u64(r.va).u64(r.size);
            rec.put(TAG_VMM_RESERVATION, &mut w);
        }
        for m in &self.vmm_mappings {
            w.u64(m.va).u64(m.size).u64(m.offset).u64(m.allocation);
            w.u64(m.access.len() as u64);
            for &(d, f) in &m.access {
                w.u32(d).u32(f);
            }
            rec.put(TAG_VMM_MAPPING, &mut w);
        }
        for m in &self.host_mappings {
            w.u64(m.guest)
                .u64(m.len)
                .u64(m.local)
                .u64(m.dev_addr)
                .u32(m.dev)
                .u32(m.flags)
                .runs(&m.runs);
            rec.put(TAG_HOST_MAPPING, &mut w);
        }
        for m in &self.managed {
            w.u64(m.guest).u32(m.dev).runs(&m.runs).bytes(&m.contents);
            rec.put(TAG_MANAGED, &mut w);
        }
        for g in &self.graphs {
            graphs::encode_graph(g, &mut w);
            rec.put(graphs::TAG_GRAPH, &mut w);
        }
        for c in &self.conditionals {
            graphs::encode_conditional(c, &mut w);
            rec.put(graphs::TAG_GRAPH_CONDITIONAL, &mut w);
        }
        for e in &self.execs {
            graphs::encode_exec(e, &mut w);
            rec.put(graphs::TAG_GRAPH_EXEC, &mut w);
        }
        for a in &self.arrays {
            w.u64(a.handle).u32(a.dev).desc(&a.desc).bytes(&a.contents);
            rec.put(TAG_ARRAY, &mut w);
        }
        for m in &self.mipmapped {
            w.u64(m.handle).u32(m.dev).desc(&m.desc);
            w.u64(m.levels.len() as u64);
            for l in &m.levels {
                w.bytes(l);
            }
            rec.put(TAG_MIPMAPPED, &mut w);
        }
        for l in &self.levels {
            w.u64(l.handle).u64(l.mipmapped).u32(l.level);
            rec.put(TAG_LEVEL, &mut w);
        }
        for o in &self.objects {
            w.object(o);
            rec.put(TAG_OBJECT, &mut w);
        }
        let (len, failed) = (rec.len, rec.failed);
        if let Some(e) = failed {
            return Err(e);
        }
        out.seek(io::SeekFrom::Start(start + 16))?;
        out.write_all(&len.to_le_bytes())?;
        out.seek(io::SeekFrom::Start(start + HEADER_LEN as u64 + len))?;
        out.flush()?;
        Ok(HEADER_LEN as u64 + len)
    }

    /// The guest-physical runs (address, length) the GPU can write behind the daemon's map of
    /// guest RAM at any time: those of every host mapping but read-only ones (pinned,
    /// registered, managed memory left in guest RAM) and the guest side of managed memory
    /// placed on the device.
    pub(crate) fn gpu_written_runs(&self) -> Vec<(u64, u64)> {
        self.host_mappings
            .iter()
            .filter(|m| u64::from(m.flags) & qcuda_proto::HOST_MAP_READ_ONLY == 0)
            .flat_map(|m| m.runs.iter().copied())
            .chain(self.managed.iter().flat_map(|m| m.runs.iter().copied()))
            .collect()
    }

    /// Decodes bytes from anywhere (a file, another daemon): refuses anything that is not
    /// exactly a state this version writes, never panics.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode_inner(bytes, None)
    }

    /// [`decode`](Self::decode), with the allocations' contents left in `bytes`: each
    /// allocation's contents are empty and the returned slices, one per allocation in order,
    /// are its bytes (a restore writes them to the device from where they lie, a mapped file,
    /// without copying gigabytes into vectors first).
    pub(crate) fn decode_borrowed(bytes: &[u8]) -> Result<(Self, Vec<&[u8]>), DecodeError> {
        let mut contents = Vec::new();
        let s = Self::decode_inner(bytes, Some(&mut contents))?;
        Ok((s, contents))
    }

    fn decode_inner<'b>(
        bytes: &'b [u8],
        mut borrowed: Option<&mut Vec<&'b [u8]>>,
    ) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes, 0);
        if r.take(8).map_err(|_| DecodeError::Magic)? != MAGIC {
            return Err(DecodeError::Magic);
        }
        let version = r.u32()?;
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(DecodeError::Version(version));
        }
        if r.u32()? != 0 {
            return Err(DecodeError::Field("reserved"));
        }
        let len = r.len()?;
        let body = r.take(len)?;
        r.done()?;
        let mut r = Reader::new(body, HEADER_LEN);
        let mut s = SavedState::default();
        let mut session_seen = false;
        while r.at < body.len() {
            let at = HEADER_LEN + r.at;
            let tag = r.u32()?;
            let mut f = Reader::new(r.bytes()?, HEADER_LEN + r.at);
            if (tag == TAG_SESSION) == session_seen {
                // The session record comes first, once.
                return Err(DecodeError::Field("session record"));
            }
            match tag {
                TAG_SESSION => {
                    session_seen = true;
                    s.session = f.u64()?;
                    s.last_handle = f.u64()?;
                    s.devices = f.u32()?;
                    s.va_base = f.u64()?;
                    s.va_size = f.u64()?;
                }
                TAG_CONTEXT => {
                    let dev = f.u32()?;
                    let cache_config = f.opt_u32()?;
                    let ranged = f.flag()?;
                    let n = f.count(12)?;
                    let limits = (0..n)
                        .map(|_| Ok((f.u32()?, f.u64()?)))
                        .collect::<Result<_, DecodeError>>()?;
                    let n = f.count(4)?;
                    let peers = (0..n).map(|_| f.u32()).collect::<Result<_, _>>()?;
                    s.contexts.push(SavedContext {
                        dev,
                        cache_config,
                        limits,
                        peers,
                        ranged,
                    });
                }
                TAG_RUN => {
                    let (dev, va, len) = (f.u32()?, f.u64()?, f.u64()?);
                    let class = match f.u8()? {
                        0xff => None,
                        c => Some(c),
                    };
                    s.runs.push(SavedRun {
                        dev,
                        va,
                        len,
                        class,
                    });
                }
                TAG_ALLOCATION => {
                    let (dev, ptr, size, block) = (f.u32()?, f.u64()?, f.u64()?, f.u64()?);
                    let bytes = f.bytes()?;
                    let contents = match borrowed.as_mut() {
                        Some(b) => {
                            b.push(bytes);
                            Vec::new()
                        }
                        None => bytes.to_vec(),
                    };
                    s.allocations.push(SavedAllocation {
                        dev,
                        ptr,
                        size,
                        block,
                        contents,
                        refs: Vec::new(),
                    });
                }
                TAG_ALLOCATION_CHUNKS if version >= 3 => {
                    let (dev, ptr, size, block) = (f.u32()?, f.u64()?, f.u64()?, f.u64()?);
                    let n = f.count(32)?;
                    let refs = (0..n)
                        .map(|_| {
                            Ok(SavedChunkRef {
                                offset: f.u64()?,
                                len: f.u64()?,
                                hash: [f.u64()?, f.u64()?],
                            })
                        })
                        .collect::<Result<Vec<_>, DecodeError>>()?;
                    if !chunk_refs_ok(size, &refs) {
                        return Err(DecodeError::Field("allocation chunks"));
                    }
                    let mut a = SavedAllocation {
                        dev,
                        ptr,
                        size,
                        block,
                        contents: Vec::new(),
                        refs,
                    };
                    let bytes = f.bytes()?;
                    if bytes.len() as u64 != a.carried() {
                        return Err(DecodeError::Field("allocation chunks"));
                    }
                    match borrowed.as_mut() {
                        Some(b) => b.push(bytes),
                        None => a.contents = bytes.to_vec(),
                    }
                    s.allocations.push(a);
                }
                TAG_MODULE => s.modules.push(SavedModule {
                    handle: f.u64()?,
                    dev: f.u32()?,
                    image: f.bytes()?.to_vec(),
                }),
                TAG_GLOBAL => s.globals.push(SavedGlobal {
                    module: f.u64()?,
                    name: f.name()?,
                    ptr: f.u64()?,
                    contents: f.bytes()?.to_vec(),
                }),
                TAG_FUNCTION => {
                    let (handle, module, name) = (f.u64()?, f.u64()?, f.name()?);
                    let cache_config = f.opt_u32()?;
                    let n = f.count(8)?;
                    let attributes =
                        (0..n)
                            .map(|_| Ok((f.i32()?, f.i32()?)))
                            .collect::<Result<_, DecodeError>>()?;
                    s.functions.push(SavedFunction {
                        handle,
                        module,
                        name,
                        cache_config,
                        attributes,
                    });
                }
                TAG_STREAM => {
                    let (handle, dev, flags, priority) = (f.u64()?, f.u32()?, f.u32()?, f.i32()?);
                    let n = f.count(68)?;
                    let attributes = (0..n)
                        .map(|_| Ok((f.u32()?, f.array::<64>()?)))
                        .collect::<Result<_, DecodeError>>()?;
                    s.streams.push(SavedStream {
                        handle,
                        dev,
                        flags,
                        priority,
                        attributes,
                    });
                }
                TAG_EVENT => s.events.push(SavedEvent {
                    handle: f.u64()?,
                    dev: f.u32()?,
                    flags: f.u32()?,
                    recorded: f.flag()?,
                }),
                TAG_POOL => {
                    let (handle, dev) = (f.u64()?, f.u32()?);
                    let (default, current) = (f.flag()?, f.flag()?);
                    let (max_size, shareable) = (f.u64()?, f.flag()?);
                    let n = f.count(12)?;
                    let settings =
                        (0..n)
                            .map(|_| Ok((f.u32()?, f.u64()?)))
                            .collect::<Result<_, DecodeError>>()?;
                    let n = f.count(8)?;
                    let access = (0..n)
                        .map(|_| Ok((f.u32()?, f.u32()?)))
                        .collect::<Result<_, DecodeError>>()?;
                    s.pools.push(SavedPool {
                        handle,
                        dev,
                        default,
                        current,
                        max_size,
                        shareable,
                        settings,
                        access,
                    });
                }
                TAG_VMM_ALLOCATION => {
                    let (id, dev, size, handle_types) = (f.u64()?, f.u32()?, f.u64()?, f.u32()?);
                    let (compressed, rdma_capable) = (f.flag()?, f.flag()?);
                    let usage = u16::try_from(f.u32()?).map_err(|_| DecodeError::Field("usage"))?;
                    s.vmm_allocations.push(SavedVmmAllocation {
                        id,
                        dev,
                        size,
                        handle_types,
                        compressed,
                        rdma_capable,
                        usage,
                        handle: f.u64()?,
                        refs: f.u64()?,
                        contents: f.bytes()?.to_vec(),
                    });
                }
                TAG_VMM_RESERVATION => s.vmm_reservations.push(SavedVmmReservation {
                    va: f.u64()?,
                    size: f.u64()?,
                }),
                TAG_VMM_MAPPING => {
                    let (va, size, offset, allocation) = (f.u64()?, f.u64()?, f.u64()?, f.u64()?);
                    let n = f.count(8)?;
                    let access = (0..n)
                        .map(|_| Ok((f.u32()?, f.u32()?)))
                        .collect::<Result<_, DecodeError>>()?;
                    s.vmm_mappings.push(SavedVmmMapping {
                        va,
                        size,
                        offset,
                        allocation,
                        access,
                    });
                }
                TAG_HOST_MAPPING => s.host_mappings.push(SavedHostMapping {
                    guest: f.u64()?,
                    len: f.u64()?,
                    local: f.u64()?,
                    dev_addr: f.u64()?,
                    dev: f.u32()?,
                    flags: f.u32()?,
                    runs: f.runs()?,
                }),
                TAG_MANAGED => s.managed.push(SavedManaged {
                    guest: f.u64()?,
                    dev: f.u32()?,
                    runs: f.runs()?,
                    contents: f.bytes()?.to_vec(),
                }),
                graphs::TAG_GRAPH => s.graphs.push(graphs::decode_graph(&mut f)?),
                graphs::TAG_GRAPH_CONDITIONAL => {
                    s.conditionals.push(graphs::decode_conditional(&mut f)?);
                }
                graphs::TAG_GRAPH_EXEC => s.execs.push(graphs::decode_exec(&mut f)?),
                TAG_ARRAY => s.arrays.push(SavedArray {
                    handle: f.u64()?,
                    dev: f.u32()?,
                    desc: f.desc()?,
                    contents: f.bytes()?.to_vec(),
                }),
                TAG_MIPMAPPED => {
                    let (handle, dev, desc) = (f.u64()?, f.u32()?, f.desc()?);
                    let n = f.count(8)?;
                    let levels = (0..n)
                        .map(|_| Ok(f.bytes()?.to_vec()))
                        .collect::<Result<_, DecodeError>>()?;
                    s.mipmapped.push(SavedMipmapped {
                        handle,
                        dev,
                        desc,
                        levels,
                    });
                }
                TAG_LEVEL => s.levels.push(SavedLevel {
                    handle: f.u64()?,
                    mipmapped: f.u64()?,
                    level: f.u32()?,
                }),
                TAG_OBJECT => s.objects.push(f.object()?),
                _ => return Err(DecodeError::Tag(tag, at)),
            }
            f.done()?;
        }
        if !session_seen {
            return Err(DecodeError::Field("session record"));
        }
        graphs::check(&s.graphs, &s.conditionals, &s.execs)?;
        s.check_arrays()?;
        Ok(s)
    }

    /// Checks the arrays, mipmapped arrays, level handles and objects against each other:
    /// counts within a session's limits, handles unique and nonzero, descriptors a session
    /// can create, contents exactly as long as their descriptors say, levels of arrays that
    /// exist and have them, object values nonzero and unique per device (a driver may number each
    /// context's objects on its own), over resources that exist.
    fn check_arrays(&self) -> Result<(), DecodeError> {
        use std::collections::{HashMap, HashSet};
        let field = DecodeError::Field;
        if self.arrays.len() + self.levels.len() > MAX_ARRAYS
            || self.mipmapped.len() > MAX_MIPMAPPED
            || self.objects.len() > MAX_OBJECTS
        {
            return Err(field("too many arrays or objects"));
        }
        let mut handles = HashSet::new();
        let all = self.arrays.iter().map(|a| a.handle);
        let all = all.chain(self.mipmapped.iter().map(|m| m.handle));
        for h in all.chain(self.levels.iter().map(|l| l.handle)) {
            if h == 0 || !handles.insert(h) {
                return Err(field("array handle"));
            }
        }
        let desc = |d: &SavedArrayDesc| {
            d.to_desc()
                .filter(|d| d.flags & !ARRAY_FLAGS == 0 && array_bytes(d).is_some())
                .ok_or(field("array descriptor"))
        };
        for a in &self.arrays {
            if array_bytes(&desc(&a.desc)?) != Some(a.contents.len()) {
                return Err(field("array contents"));
            }
        }
        // Mipmapped array -> its level count.
        let mut mipmapped = HashMap::new();
        for m in &self.mipmapped {
            let d = desc(&m.desc)?;
            let n = u32::try_from(m.levels.len()).map_err(|_| field("mipmap levels"))?;
            if n == 0 || n > max_mip_levels(&d) {
                return Err(field("mipmap levels"));
            }
            for (l, bytes) in (0..n).zip(&m.levels) {
                if array_bytes(&mip_level(&d, l)) != Some(bytes.len()) {
                    return Err(field("mipmap level contents"));
                }
            }
            mipmapped.insert(m.handle, n);
        }
        let mut taken = HashSet::new();
        for l in &self.levels {
            let n = mipmapped.get(&l.mipmapped).ok_or(field("level array"))?;
            if l.level >= *n || !taken.insert((l.mipmapped, l.level)) {
                return Err(field("level array"));
            }
        }
        let arrays: HashSet<u64> = self
            .arrays
            .iter()
            .map(|a| a.handle)
            .chain(self.levels.iter().map(|l| l.handle))
            .collect();
        let mut values = HashSet::new();
        for o in &self.objects {
            if o.value == 0 || !values.insert((o.dev, o.value)) {
                return Err(field("object value"));
            }
            let linear_ok = |format: u32, channels: u32| {
                super::driver::array::format_bytes(format) != 0 && [1, 2, 4].contains(&channels)
            };
            let resource_ok = match o.resource {
                SavedResource::Array(h) => arrays.contains(&h),
                SavedResource::Mipmapped(h) => !o.surface && mipmapped.contains_key(&h),
                SavedResource::Linear {
                    format,
                    channels,
                    size,
                    ..
                } => !o.surface && linear_ok(format, channels) && size != 0,
                SavedResource::Pitch2D {
                    format,
                    channels,
                    width,
                    height,
                    pitch,
                    ..
                } => {
                    !o.surface
                        && linear_ok(format, channels)
                        && width != 0
                        && height != 0
                        && pitch != 0
                }
            };
            let desc_ok = if o.surface {
                o.tex == SavedTexDesc::default() && o.view.is_none()
            } else {
                tex_desc_ok(&o.tex, o.view.as_ref())
            };
            if !resource_ok || !desc_ok {
                return Err(field("object"));
            }
        }
        Ok(())
    }

    /// Bytes of device memory the state holds (allocations, globals, VMM allocations,
    /// managed memory placed on the device, arrays).
    pub(crate) fn device_bytes(&self) -> u64 {
        let a: u64 = self
            .allocations
            .iter()
            .map(|a| a.contents.len() as u64)
            .sum();
        let g: u64 = self.globals.iter().map(|g| g.contents.len() as u64).sum();
        let v: u64 = self
            .vmm_allocations
            .iter()
            .map(|a| a.contents.len() as u64)
            .sum();
        let m: u64 = self.managed.iter().map(|m| m.contents.len() as u64).sum();
        let arrays: u64 = self.arrays.iter().map(|a| a.contents.len() as u64).sum();
        let levels: u64 = self
            .mipmapped
            .iter()
            .flat_map(|m| &m.levels)
            .map(|l| l.len() as u64)
            .sum();
        a + g + v + m + arrays + levels
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A state with one of everything.
    pub(crate) fn sample() -> SavedState {
        SavedState {
            session: 7,
            last_handle: 40,
            devices: 2,
            va_base: 0x6800_0000_0000,
            va_size: 256 << 30,
            contexts: vec![SavedContext {
                dev: 1,
                cache_config: Some(2),
                limits: vec![(0, 4096), (2, 1 << 20)],
                peers: vec![0],
                ranged: true,
            }],
            runs: vec![
                SavedRun {
                    dev: 1,
                    va: 0x6840_0000_0000,
                    len: 2 << 20,
                    class: Some(0),
                },
                SavedRun {
                    dev: 1,
                    va: 0x6840_0020_0000,
                    len: 4 << 20,
                    class: None,
                },
            ],
            allocations: vec![SavedAllocation {
                dev: 1,
                ptr: 0x6840_0000_0000,
                size: 5,
                block: 256,
                contents: b"hello".to_vec(),
                refs: Vec::new(),
            }],
            modules: vec![SavedModule {
                handle: 3,
                dev: 1,
                image: b".version 9.0\n".to_vec(),
            }],
            globals: vec![SavedGlobal {
                module: 3,
                name: CString::new("g").unwrap(),
                ptr: 0x7f00_0000_1000,
                contents: vec![1, 2, 3],
            }],
            functions: vec![SavedFunction {
                handle: 4,
                module: 3,
                name: CString::new("vadd").unwrap(),
                cache_config: None,
                attributes: vec![(8, 65536)],
            }],
            streams: vec![SavedStream {
                handle: 5,
                dev: 1,
                flags: 1,
                priority: -2,
                attributes: vec![(3, [7; 64])],
            }],
            events: vec![SavedEvent {
                handle: 6,
                dev: 1,
                flags: 2,
                recorded: true,
            }],
            pools: vec![
                SavedPool {
                    handle: 9,
                    dev: 1,
                    default: true,
                    current: false,
                    max_size: 0,
                    shareable: false,
                    settings: vec![(4, 1 << 30)],
                    access: Vec::new(),
                },
                SavedPool {
                    handle: 10,
                    dev: 1,
                    default: false,
                    current: true,
                    max_size: 64 << 20,
                    shareable: true,
                    settings: vec![(1, 0), (4, 4096)],
                    access: vec![(0, 3)],
                },
            ],
            vmm_allocations: vec![SavedVmmAllocation {
                id: 1,
                dev: 1,
                size: 64,
                handle_types: 1,
                compressed: false,
                rdma_capable: true,
                usage: 0,
                handle: 11,
                refs: 2,
                contents: vec![9; 64],
            }],
            vmm_reservations: vec![SavedVmmReservation {
                va: 0x6000_0000_0000,
                size: 4 << 20,
            }],
            vmm_mappings: vec![SavedVmmMapping {
                va: 0x6000_0020_0000,
                size: 2 << 20,
                offset: 0,
                allocation: 1,
                access: vec![(1, 3), (0, 1)],
            }],
            host_mappings: vec![
                SavedHostMapping {
                    guest: 0x2000_0000_0000,
                    len: 0x3000,
                    local: 0x2000_0000_0000,
                    dev_addr: 0x2000_0000_0000,
                    dev: 1,
                    flags: 0,
                    runs: vec![(0x10_0000, 0x1000), (0x8_0000, 0x2000)],
                },
                SavedHostMapping {
                    guest: 0x5555_0000_0000,
                    len: 0x1000,
                    local: 0x7f00_1234_0000,
                    dev_addr: 0x7f00_1234_0000,
                    dev: 1,
                    flags: 1,
                    runs: vec![(0x20_0000, 0x1000)],
                },
            ],
            managed: vec![SavedManaged {
                guest: 0x2000_0020_0000,
                dev: 1,
                runs: vec![(0x30_0000, 0x2000)],
                contents: vec![5; 0x20],
            }],
            graphs: sample_graphs(),
            conditionals: vec![SavedConditional {
                handle: 0xc0d0_0000_0000_0001,
                graph: 20,
                default_value: 1,
                flags: 1,
            }],
            execs: vec![SavedExec {
                handle: 30,
                dev: 1,
                flags: 1,
                source: 20,
                graph: 31,
                nodes: vec![(21, 0), (22, 1)],
                disabled: vec![1],
            }],
            arrays: vec![SavedArray {
                handle: 12,
                dev: 1,
                desc: SavedArrayDesc {
                    width: 8,
                    height: 4,
                    depth: 0,
                    format: 0x01,
                    channels: 1,
                    flags: 2,
                },
                contents: (0..32).collect(),
            }],
            mipmapped: vec![SavedMipmapped {
                handle: 13,
                dev: 1,
                desc: SavedArrayDesc {
                    width: 4,
                    height: 4,
                    depth: 0,
                    format: 0x01,
                    channels: 1,
                    flags: 0,
                },
                levels: vec![vec![1; 16], vec![2; 4]],
            }],
            levels: vec![SavedLevel {
                handle: 14,
                mipmapped: 13,
                level: 1,
            }],
            objects: vec![
                SavedObject {
                    value: 3,
                    dev: 1,
                    surface: false,
                    resource: SavedResource::Linear {
                        ptr: 0x6840_0000_0000,
                        format: 0x20,
                        channels: 1,
                        size: 4,
                    },
                    tex: SavedTexDesc {
                        address: [1, 1, 0],
                        filter: 1,
                        mipmap_bias: 0.5f32.to_bits(),
                        border: [1.0f32.to_bits(); 4],
                        ..SavedTexDesc::default()
                    },
                    view: None,
                },
                SavedObject {
                    value: 1,
                    dev: 1,
                    surface: true,
                    resource: SavedResource::Array(12),
                    tex: SavedTexDesc::default(),
                    view: None,
                },
                SavedObject {
                    value: 2,
                    dev: 1,
                    surface: false,
                    resource: SavedResource::Mipmapped(13),
                    tex: SavedTexDesc {
                        mipmap_filter: 1,
                        ..SavedTexDesc::default()
                    },
                    view: Some(SavedView {
                        format: 1,
                        extent: [4, 4, 0],
                        levels: [0, 1, 0, 0],
                    }),
                },
            ],
        }
    }

    fn node(handle: u64, kind: SavedNodeKind, deps: &[u32]) -> SavedNode {
        SavedNode {
            handle,
            kind,
            deps: deps.to_vec(),
        }
    }

    fn plain(ty: u32, params: &[u8]) -> SavedNodeKind {
        SavedNodeKind::Plain {
            ty,
            params: params.to_vec(),
        }
    }

    /// A program's graph with a kernel, an event record, a child graph and a conditional
    /// node, the graphs those two hold, and an executable graph's copy.
    fn sample_graphs() -> Vec<SavedGraph> {
        vec![
            SavedGraph {
                id: 20,
                dev: 1,
                role: GraphRole::Session,
                nodes: vec![
                    node(21, plain(0, &[4; 40]), &[]),
                    node(22, plain(7, &6u64.to_le_bytes()), &[0]),
                    node(23, SavedNodeKind::Child { graph: 24 }, &[0, 1]),
                    node(
                        25,
                        SavedNodeKind::Conditional {
                            handle: 0xc0d0_0000_0000_0001,
                            kind: 1,
                            bodies: vec![26],
                        },
                        &[2],
                    ),
                ],
            },
            SavedGraph {
                id: 24,
                dev: 1,
                role: GraphRole::Held,
                nodes: vec![node(27, plain(5, &[]), &[])],
            },
            SavedGraph {
                id: 26,
                dev: 1,
                role: GraphRole::Held,
                nodes: Vec::new(),
            },
            SavedGraph {
                id: 31,
                dev: 1,
                role: GraphRole::Private,
                nodes: vec![
                    node(0, plain(0, &[4; 40]), &[]),
                    node(0, plain(2, &[1; 8]), &[0]),
                ],
            },
        ]
    }

    /// `f` applied to the sample's graphs, conditionals and executable graphs, encoded and
    /// decoded: what the decoder says.
    fn decode_changed(
        f: impl FnOnce(&mut Vec<SavedGraph>, &mut Vec<SavedConditional>, &mut Vec<SavedExec>),
    ) -> Result<SavedState, DecodeError> {
        let mut s = sample();
        f(&mut s.graphs, &mut s.conditionals, &mut s.execs);
        SavedState::decode(&s.encode())
    }

    #[test]
    fn graphs_that_do_not_fit_together_are_refused() {
        let field = |r: Result<SavedState, DecodeError>| match r {
            Err(DecodeError::Field(what)) => what,
            other => panic!("not refused: {other:?}"),
        };
        // A dependency on a later node (or itself): what a cycle would need.
        assert_eq!(
            field(decode_changed(|g, _, _| g[0].nodes[0].deps = vec![0])),
            "graph node dependencies"
        );
        assert_eq!(
            field(decode_changed(|g, _, _| g[0].nodes[1].deps = vec![0, 0])),
            "graph node dependencies"
        );
        // Two graphs under one id; a node handle twice; a private graph's node with one.
        assert_eq!(field(decode_changed(|g, _, _| g[1].id = 20)), "graph id");
        assert_eq!(
            field(decode_changed(|g, _, _| g[1].nodes[0].handle = 21)),
            "graph node handle"
        );
        assert_eq!(
            field(decode_changed(|g, _, _| g[3].nodes[0].handle = 99)),
            "graph node handle"
        );
        // A child graph node naming a missing graph, a program's graph, or one held already.
        assert_eq!(
            field(decode_changed(
                |g, _, _| g[0].nodes[2].kind = SavedNodeKind::Child { graph: 77 }
            )),
            "a graph a node holds"
        );
        assert_eq!(
            field(decode_changed(
                |g, _, _| g[0].nodes[2].kind = SavedNodeKind::Child { graph: 20 }
            )),
            "a graph a node holds"
        );
        assert_eq!(
            field(decode_changed(
                |g, _, _| g[0].nodes[2].kind = SavedNodeKind::Child { graph: 26 }
            )),
            "a graph held twice"
        );
        // Two held graphs holding each other, held by nothing else.
        assert_eq!(
            field(decode_changed(|g, _, _| {
                g[0].nodes.truncate(2);
                g[1].nodes = vec![node(40, SavedNodeKind::Child { graph: 26 }, &[])];
                g[2].nodes = vec![node(41, SavedNodeKind::Child { graph: 24 }, &[])];
            })),
            "graphs holding each other"
        );
        // A held graph nothing holds.
        assert_eq!(
            field(decode_changed(|g, _, _| g[0].nodes.truncate(3))),
            "a graph's holder"
        );
        // An executable graph whose copy is a program's graph, or shared, or whose node
        // names are out of range; a conditional handle of no graph.
        assert_eq!(
            field(decode_changed(|_, _, e| e[0].graph = 20)),
            "an executable graph's copy"
        );
        assert_eq!(
            field(decode_changed(|_, _, e| {
                let mut other = e[0].clone();
                other.handle = 32;
                e.push(other);
            })),
            "a graph held twice"
        );
        assert_eq!(
            field(decode_changed(|_, _, e| e[0].nodes.push((29, 2)))),
            "an executable graph's nodes"
        );
        assert_eq!(
            field(decode_changed(|_, _, e| e[0].disabled.push(5))),
            "an executable graph's nodes"
        );
        assert_eq!(
            field(decode_changed(|_, c, _| c[0].graph = 31)),
            "conditional handle"
        );
        // A node type no capture writes.
        assert_eq!(
            field(decode_changed(|g, _, _| g[0].nodes[0].kind = plain(10, &[]))),
            "graph node type"
        );
    }

    #[test]
    fn the_guest_ram_a_gpu_writes_is_every_writable_mapping_and_managed_memory() {
        let s = sample();
        // The read-only mapping (flags 1) is left out; the managed memory's guest side is in.
        let want = vec![(0x10_0000, 0x1000), (0x8_0000, 0x2000), (0x30_0000, 0x2000)];
        assert_eq!(s.gpu_written_runs(), want);
        assert_eq!(crate::cuda::gpu_written_guest_ram(&s.encode()), Ok(want));
        assert_eq!(
            crate::cuda::gpu_written_guest_ram(&SavedState::default().encode()),
            Ok(vec![])
        );
        // What is not a state is an error (the caller then marks all of guest RAM), never a
        // panic or a partial list.
        let mut bad = s.encode();
        bad.truncate(bad.len() - 3);
        crate::cuda::gpu_written_guest_ram(&bad).unwrap_err();
        crate::cuda::gpu_written_guest_ram(b"QCUDAGS1").unwrap_err();
    }

    #[test]
    fn a_state_round_trips() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(&bytes[..8], b"QCUDAGS1");
        assert_eq!(SavedState::decode(&bytes), Ok(s.clone()));
        assert_eq!(s.device_bytes(), 8 + 64 + 0x20 + 32 + 16 + 4);
        let empty = SavedState::default();
        assert_eq!(SavedState::decode(&empty.encode()), Ok(empty));
    }

    #[test]
    fn a_state_streamed_as_it_is_encoded_and_decoded_in_place_is_the_same_state() {
        let s = sample();
        let bytes = s.encode();
        // Captured without the allocations' contents, which a fill writes as it encodes.
        let mut deferred = s.clone();
        for a in &mut deferred.allocations {
            a.contents.clear();
        }
        let mut out = io::Cursor::new(Vec::new());
        let mut fill = |a: &SavedAllocation, out: &mut dyn io::Write| {
            let c = s.allocations.iter().find(|b| b.ptr == a.ptr).unwrap();
            // In two pieces, as chunks come from the device.
            let half = c.contents.len() / 2;
            out.write_all(&c.contents[..half])?;
            out.write_all(&c.contents[half..])
        };
        let len = deferred
            .encode_streaming(&mut out, Some(&mut fill))
            .unwrap();
        assert_eq!(out.into_inner(), bytes);
        assert_eq!(len, bytes.len() as u64);
        // A fill that writes a byte short is an error, not a state.
        let mut short = |_: &SavedAllocation, out: &mut dyn io::Write| out.write_all(&[1]);
        deferred
            .encode_streaming(&mut io::Cursor::new(Vec::new()), Some(&mut short))
            .unwrap_err();
        // Decoded in place: the same state, its allocations' bytes left where they lie.
        let (mut got, contents) = SavedState::decode_borrowed(&bytes).unwrap();
        assert_eq!(contents.len(), s.allocations.len());
        for (a, c) in got.allocations.iter_mut().zip(contents) {
            assert!(a.contents.is_empty());
            a.contents = c.to_vec();
        }
        assert_eq!(got, s);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_an_error_or_another_state_never_a_panic() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(SavedState::decode(&bytes[..n]).is_err(), "prefix of {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            SavedState::decode(&longer),
            Err(DecodeError::Length(bytes.len()))
        );
        for i in 0..bytes.len() {
            for x in [0x01, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= x;
                let _ = SavedState::decode(&b);
            }
        }
    }

    /// A state whose second allocation (two chunks and 5 bytes) refers to its first two
    /// chunks and carries the last.
    fn sample_with_refs() -> SavedState {
        use super::super::precopy::CHUNK;
        let mut s = sample();
        s.allocations.push(SavedAllocation {
            dev: 1,
            ptr: 0x6840_0020_0000,
            size: 2 * CHUNK + 5,
            block: 3 * CHUNK,
            contents: b"tail!".to_vec(),
            refs: vec![
                SavedChunkRef {
                    offset: 0,
                    len: CHUNK,
                    hash: [1, 2],
                },
                SavedChunkRef {
                    offset: CHUNK,
                    len: CHUNK,
                    hash: [3, 4],
                },
            ],
        });
        s
    }

    #[test]
    fn a_state_with_pre_copied_chunks_round_trips_as_version_3_and_others_stay_version_2() {
        let s = sample_with_refs();
        let bytes = s.encode();
        assert_eq!(&bytes[8..12], &3u32.to_le_bytes());
        assert_eq!(SavedState::decode(&bytes), Ok(s.clone()));
        let (got, contents) = SavedState::decode_borrowed(&bytes).unwrap();
        assert_eq!(contents[1], b"tail!");
        assert_eq!(got.allocations[1].refs, s.allocations[1].refs);
        assert_eq!(&sample().encode()[8..12], &2u32.to_le_bytes());
        // Streamed: the fill writes only the carried bytes.
        let mut deferred = s.clone();
        deferred.allocations[1].contents.clear();
        let mut fill = |a: &SavedAllocation, out: &mut dyn io::Write| {
            let c = s.allocations.iter().find(|b| b.ptr == a.ptr).unwrap();
            out.write_all(&c.contents)
        };
        let mut out = io::Cursor::new(Vec::new());
        deferred
            .encode_streaming(&mut out, Some(&mut fill))
            .unwrap();
        // The first allocation was not deferred: the fill ran for the second only.
        assert_eq!(out.into_inner(), bytes);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_of_a_state_with_references_is_refused_or_another_state(
    ) {
        let bytes = sample_with_refs().encode();
        for n in 0..bytes.len() {
            assert!(SavedState::decode(&bytes[..n]).is_err(), "prefix of {n}");
        }
        for i in 0..bytes.len() {
            for x in [0x01, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= x;
                if let Ok(s) = SavedState::decode(&b) {
                    for a in s.allocations.iter().filter(|a| !a.refs.is_empty()) {
                        assert!(chunk_refs_ok(a.size, &a.refs));
                        assert_eq!(a.contents.len() as u64, a.carried());
                    }
                }
            }
        }
    }

    #[test]
    fn references_that_do_not_cover_their_allocation_exactly_are_refused() {
        use super::super::precopy::CHUNK;
        let refused = |f: &dyn Fn(&mut SavedAllocation)| {
            let mut s = sample_with_refs();
            f(&mut s.allocations[1]);
            assert_eq!(
                SavedState::decode(&s.encode()),
                Err(DecodeError::Field("allocation chunks"))
            );
        };
        refused(&|a| a.refs[1].offset = CHUNK + 8);
        refused(&|a| a.refs[1].len = 5);
        refused(&|a| a.refs.swap(0, 1));
        refused(&|a| a.refs[1] = a.refs[0]);
        refused(&|a| a.refs[1].offset = 3 * CHUNK);
        refused(&|a| a.contents.push(0));
        refused(&|a| a.contents.clear());
        refused(&|a| {
            a.refs.push(SavedChunkRef {
                offset: 2 * CHUNK,
                len: 5,
                hash: [0; 2],
            });
        });
        // Every chunk referred to: nothing carried.
        let mut s = sample_with_refs();
        let a = &mut s.allocations[1];
        a.refs.push(SavedChunkRef {
            offset: 2 * CHUNK,
            len: 5,
            hash: [5, 6],
        });
        a.contents.clear();
        assert_eq!(SavedState::decode(&s.encode()), Ok(s.clone()));
        // The record is version 3's: in a state that says version 2 it is unknown.
        let mut b = s.encode();
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert!(matches!(
            SavedState::decode(&b),
            Err(DecodeError::Tag(TAG_ALLOCATION_CHUNKS, _))
        ));
        b[8..12].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(SavedState::decode(&b), Err(DecodeError::Version(4)));
    }

    #[test]
    fn hostile_headers_and_records_are_refused() {
        let good = sample().encode();
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(SavedState::decode(&b), Err(DecodeError::Magic));
        let mut b = good.clone();
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(SavedState::decode(&b), Err(DecodeError::Version(1)));
        // A body length past the end, and one that does not fit usize arithmetic.
        let mut b = good.clone();
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            SavedState::decode(&b),
            Err(DecodeError::Length(_))
        ));
        // A record whose count claims more items than its body holds.
        let mut w = Writer::default();
        w.u64(1).u64(0).u32(1).u64(0).u64(0);
        let session = w.0.clone();
        let mut body = Vec::new();
        body.extend_from_slice(&TAG_SESSION.to_le_bytes());
        body.extend_from_slice(&(session.len() as u64).to_le_bytes());
        body.extend_from_slice(&session);
        let mut ctx = Writer::default();
        ctx.u32(0).opt_u32(None).u8(0).u64(u64::MAX / 2);
        body.extend_from_slice(&TAG_CONTEXT.to_le_bytes());
        body.extend_from_slice(&(ctx.0.len() as u64).to_le_bytes());
        body.extend_from_slice(&ctx.0);
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend_from_slice(&body);
        assert!(matches!(
            SavedState::decode(&b),
            Err(DecodeError::Length(_))
        ));
        // An unknown record.
        let mut b = good[..HEADER_LEN].to_vec();
        let mut body = Vec::new();
        body.extend_from_slice(&TAG_SESSION.to_le_bytes());
        body.extend_from_slice(&(session.len() as u64).to_le_bytes());
        body.extend_from_slice(&session);
        body.extend_from_slice(&99u32.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        b[16..24].copy_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend_from_slice(&body);
        assert!(matches!(
            SavedState::decode(&b),
            Err(DecodeError::Tag(99, _))
        ));
    }

    #[test]
    fn hostile_arrays_and_objects_are_refused() {
        let good = sample();
        let refused = |s: &SavedState, why: &str| {
            assert!(
                matches!(SavedState::decode(&s.encode()), Err(DecodeError::Field(_))),
                "{why}"
            );
        };
        let mut b = good.clone();
        b.arrays[0].contents.pop();
        refused(&b, "contents shorter than the descriptor");
        let mut b = good.clone();
        b.arrays[0].desc.height = u64::MAX;
        refused(&b, "an extent past any size");
        let mut b = good.clone();
        b.arrays[0].desc.format = 0x04;
        refused(&b, "an unknown format");
        let mut b = good.clone();
        b.arrays[0].desc.channels = 3;
        refused(&b, "3 channels");
        let mut b = good.clone();
        b.arrays[0].desc.flags |= 0x40;
        refused(&b, "a sparse array");
        let mut b = good.clone();
        b.arrays[0].desc.width = 0;
        b.arrays[0].contents.clear();
        refused(&b, "no width");
        let mut b = good.clone();
        b.mipmapped[0].handle = 12;
        refused(&b, "a handle twice");
        let mut b = good.clone();
        b.levels[0].handle = 0;
        refused(&b, "handle 0");
        let mut b = good.clone();
        b.mipmapped[0].levels.extend([vec![3], vec![3]]);
        refused(&b, "more levels than the extent has");
        let mut b = good.clone();
        b.mipmapped[0].levels[1].push(0);
        refused(&b, "a level of the wrong size");
        let mut b = good.clone();
        b.mipmapped[0].levels.clear();
        refused(&b, "no level");
        let mut b = good.clone();
        b.levels[0].level = 2;
        refused(&b, "a level the array does not have");
        let mut b = good.clone();
        b.levels[0].mipmapped = 12;
        refused(&b, "a level of a plain array");
        let mut b = good.clone();
        b.levels.push(SavedLevel {
            handle: 15,
            ..b.levels[0]
        });
        refused(&b, "one level under two handles");
        let mut b = good.clone();
        b.objects[1].value = 3;
        refused(&b, "an object value twice");
        // The same value on another device is another object.
        b.objects[1].dev = 0;
        assert_eq!(SavedState::decode(&b.encode()), Ok(b.clone()));
        let mut b = good.clone();
        b.objects[0].value = 0;
        refused(&b, "object value 0");
        let mut b = good.clone();
        b.objects[1].resource = SavedResource::Array(13);
        refused(&b, "a surface over a mipmapped array's handle");
        let mut b = good.clone();
        b.objects[1].tex.filter = 1;
        refused(&b, "a surface with a texture descriptor");
        let mut b = good.clone();
        b.objects[2].resource = SavedResource::Mipmapped(99);
        refused(&b, "a texture over no array");
        let mut b = good.clone();
        b.objects[0].tex.address[2] = 4;
        refused(&b, "an unknown address mode");
        let mut b = good.clone();
        b.objects[0].tex.flags = 0x100;
        refused(&b, "unknown texture flags");
        let mut b = good.clone();
        b.objects[2].view = Some(SavedView {
            format: 0x23,
            ..SavedView::default()
        });
        refused(&b, "an unknown view format");
        let mut b = good.clone();
        if let SavedResource::Linear {
            ref mut channels, ..
        } = b.objects[0].resource
        {
            *channels = 3;
        }
        refused(&b, "linear memory of 3 channels");
        // Counts past the session's limits.
        let mut b = good.clone();
        b.objects = (1..=MAX_OBJECTS as u64 + 1)
            .map(|value| SavedObject {
                value,
                ..good.objects[1]
            })
            .collect();
        refused(&b, "too many objects");
        // A view flag that says absent over a view that is there.
        let mut bytes = good.encode();
        let mut o = Writer::default();
        o.object(&good.objects[0]);
        let at = bytes
            .windows(o.0.len())
            .position(|w| w == o.0.as_slice())
            .unwrap();
        let view_at = at + o.0.len() - (1 + 4 + 24 + 16);
        bytes[view_at + 1] = 1;
        assert_eq!(
            SavedState::decode(&bytes),
            Err(DecodeError::Field("object view"))
        );
    }
}

//! Guest buffers and the parsed request that ops execute on.
//!
//! The virtio edge (`chain.rs`) turns a descriptor chain into a [`Request`]: a validated
//! header plus one [`GuestBuffer`] per buffer in the header's table. Everything below the edge
//! (the session threads, the workers and the CUDA executor) sees only these types, never
//! descriptors.
//!
//! A `GuestBuffer` is a list of guest-physical runs, every one of which was checked to lie
//! inside one region of guest RAM when the buffer was built, so later accesses cannot leave
//! guest memory. It holds its own `Arc` of the memory map it was checked against, so a
//! SET_MEM_TABLE that replaces the map while the op runs leaves this request consistent.

use std::sync::Arc;

use qcuda_proto::{Direction, Op, RequestHeader, WireError};
use thiserror::Error;
use vhost_user_backend::bitmap::BitmapMmapRegion;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

/// Guest RAM as the backend maps it. Its bitmap is the dirty log of a live migration
/// (`VHOST_USER_PROTOCOL_F_LOG_SHMFD`): empty until QEMU hands the daemon a log, then every
/// write through this map marks its pages (`vhu_cuda.rs` marks what other writers touched).
pub type GuestRam = GuestMemoryMmap<BitmapMmapRegion>;

/// Errors of guest buffer access.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BufferError {
    /// A run is not inside guest RAM.
    #[error("guest range {addr:#x}+{len:#x} is outside guest memory")]
    OutOfGuestMemory {
        /// Guest-physical start.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// An access past the end of the buffer.
    #[error("access {offset:#x}+{len:#x} past buffer end {size:#x}")]
    OutOfBounds {
        /// Offset into the buffer.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// Buffer size.
        size: usize,
    },
}

/// One contiguous guest-physical run inside a single memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestRun {
    /// Guest-physical address.
    pub addr: GuestAddress,
    /// Length in bytes (non-zero).
    pub len: usize,
}

/// A guest buffer: ordered guest-physical runs, all inside guest RAM.
///
/// # Invariants
/// Every run lies within one region of `mem`, and `len` is the sum of the run lengths.
#[derive(Clone)]
pub struct GuestBuffer {
    mem: Arc<GuestRam>,
    runs: Vec<GuestRun>,
    len: usize,
}

impl std::fmt::Debug for GuestBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestBuffer")
            .field("runs", &self.runs)
            .field("len", &self.len)
            .finish()
    }
}

impl GuestBuffer {
    /// Builds a buffer from guest-physical ranges, splitting ranges at region boundaries and
    /// rejecting any byte outside guest RAM.
    pub fn new(
        mem: Arc<GuestRam>,
        ranges: impl IntoIterator<Item = (GuestAddress, usize)>,
    ) -> Result<Self, BufferError> {
        let mut runs = Vec::new();
        let mut len = 0usize;
        for (addr, rlen) in ranges {
            let oob = BufferError::OutOfGuestMemory {
                addr: addr.0,
                len: rlen as u64,
            };
            if addr.0.checked_add(rlen as u64).is_none() {
                return Err(oob);
            }
            let mut at = addr;
            for slice in mem.get_slices(at, rlen) {
                let slice = slice.map_err(|_| oob.clone_err())?;
                runs.push(GuestRun {
                    addr: at,
                    len: slice.len(),
                });
                at = GuestAddress(at.0 + slice.len() as u64);
            }
            len = len.checked_add(rlen).ok_or(oob)?;
        }
        Ok(Self { mem, runs, len })
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The runs, in order.
    pub fn runs(&self) -> &[GuestRun] {
        &self.runs
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), BufferError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(BufferError::OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// The bytes `[offset, offset + len)` of this buffer as a buffer of their own.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Self, BufferError> {
        self.check(offset, len)?;
        let mut runs = Vec::new();
        let (mut at, end) = (0usize, offset + len);
        for r in &self.runs {
            let (lo, hi) = (at.max(offset), (at + r.len).min(end));
            if lo < hi {
                runs.push(GuestRun {
                    addr: GuestAddress(r.addr.0 + (lo - at) as u64),
                    len: hi - lo,
                });
            }
            at += r.len;
            if at >= end {
                break;
            }
        }
        Ok(Self {
            mem: Arc::clone(&self.mem),
            runs,
            len,
        })
    }

    /// Calls `f(buffer_offset, slice)` for each host slice overlapping `[offset, offset+len)`.
    pub fn for_each_slice<E>(
        &self,
        offset: usize,
        len: usize,
        mut f: impl FnMut(usize, VolatileSlice<'_, BitmapMmapRegion>) -> Result<(), E>,
    ) -> Result<Result<(), E>, BufferError> {
        self.check(offset, len)?;
        let (mut pos, end) = (0usize, offset + len);
        for run in &self.runs {
            let (rs, re) = (pos, pos + run.len);
            pos = re;
            if re <= offset {
                continue;
            }
            if rs >= end {
                break;
            }
            let from = offset.max(rs);
            let to = end.min(re);
            let addr = GuestAddress(run.addr.0 + (from - rs) as u64);
            let slice =
                self.mem
                    .get_slice(addr, to - from)
                    .map_err(|_| BufferError::OutOfGuestMemory {
                        addr: addr.0,
                        len: (to - from) as u64,
                    })?;
            if let Err(e) = f(from, slice) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Copies `dst.len()` bytes from buffer offset `offset` into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), BufferError> {
        let n = dst.len();
        self.for_each_slice(offset, n, |at, s| {
            let i = at - offset;
            s.copy_to(&mut dst[i..i + s.len()]);
            Ok::<(), ()>(())
        })?
        .map_err(|()| BufferError::OutOfBounds {
            offset,
            len: n,
            size: self.len,
        })
    }

    /// Copies `src` into the buffer at offset `offset`.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<(), BufferError> {
        let n = src.len();
        self.for_each_slice(offset, n, |at, s| {
            let i = at - offset;
            s.copy_from(&src[i..i + s.len()]);
            Ok::<(), ()>(())
        })?
        .map_err(|()| BufferError::OutOfBounds {
            offset,
            len: n,
            size: self.len,
        })
    }

    /// The whole buffer as a vector (for small inputs: names, parameter blocks).
    pub fn to_vec(&self) -> Result<Vec<u8>, BufferError> {
        let mut v = vec![0u8; self.len];
        self.read_at(0, &mut v)?;
        Ok(v)
    }

    /// Guest memory this buffer lives in (for writing a run directly).
    pub fn memory(&self) -> &GuestRam {
        &self.mem
    }

    /// The memory map this buffer was checked against (a worker process is given the same).
    pub fn shared_memory(&self) -> &Arc<GuestRam> {
        &self.mem
    }

    /// Writes `src` at guest address `addr` (used by the chain code for the response header).
    pub fn write_guest(mem: &GuestRam, addr: GuestAddress, src: &[u8]) -> Result<(), BufferError> {
        mem.write_slice(src, addr)
            .map_err(|_| BufferError::OutOfGuestMemory {
                addr: addr.0,
                len: src.len() as u64,
            })
    }
}

impl BufferError {
    fn clone_err(&self) -> Self {
        match self {
            Self::OutOfGuestMemory { addr, len } => Self::OutOfGuestMemory {
                addr: *addr,
                len: *len,
            },
            Self::OutOfBounds { offset, len, size } => Self::OutOfBounds {
                offset: *offset,
                len: *len,
                size: *size,
            },
        }
    }
}

/// Why a header and buffers do not make a [`Request`].
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    /// The header's op is unknown, or its buffer table does not have the op's shape.
    #[error("bad request header: {0:?}")]
    Header(WireError),
    /// Not one buffer per entry of the header's table, `In` buffers first.
    #[error(
        "{inputs} input and {outputs} output buffers for a table of {want_in} and {want_out}, \
         inputs first"
    )]
    Shape {
        /// Input buffers given.
        inputs: usize,
        /// Output buffers given.
        outputs: usize,
        /// `In` entries in the header's table.
        want_in: usize,
        /// `Out` entries in the header's table.
        want_out: usize,
    },
    /// A buffer is not as long as its entry in the header's table.
    #[error("buffer {index} is {got} bytes, its table entry says {expected}")]
    Length {
        /// The buffer's index in the table.
        index: usize,
        /// The table entry's length.
        expected: u64,
        /// The buffer's length.
        got: u64,
    },
}

/// A validated request: its header, its op (known, shape-checked) and its buffers, which match
/// the header's buffer table one for one. Only [`Request::new`] makes one, so every `Request`
/// holds that.
#[derive(Debug, Clone)]
pub struct Request {
    header: RequestHeader,
    op: Op,
    inputs: Vec<GuestBuffer>,
    outputs: Vec<GuestBuffer>,
}

impl Request {
    /// A request of `header` with these buffers: the op must be known and the table must have
    /// its shape (`RequestHeader::checked_op`), and `inputs` then `outputs` must be the table's
    /// `In` then `Out` entries, in order, each exactly as long as its entry.
    pub fn new(
        header: RequestHeader,
        inputs: Vec<GuestBuffer>,
        outputs: Vec<GuestBuffer>,
    ) -> Result<Self, RequestError> {
        let op = header.checked_op().map_err(RequestError::Header)?;
        let table = header.buffers();
        let (want_in, want_out) = header.counts();
        let in_first = table
            .iter()
            .enumerate()
            .all(|(i, d)| (d.dir == Direction::In as u32) == (i < want_in));
        if inputs.len() != want_in || outputs.len() != want_out || !in_first {
            return Err(RequestError::Shape {
                inputs: inputs.len(),
                outputs: outputs.len(),
                want_in,
                want_out,
            });
        }
        for (index, (desc, buf)) in table.iter().zip(inputs.iter().chain(&outputs)).enumerate() {
            let got = buf.len() as u64;
            if got != desc.len {
                return Err(RequestError::Length {
                    index,
                    expected: desc.len,
                    got,
                });
            }
        }
        Ok(Self {
            header,
            op,
            inputs,
            outputs,
        })
    }

    /// The decoded header.
    pub fn header(&self) -> &RequestHeader {
        &self.header
    }

    /// The op, checked against the header's buffer table.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The `In` buffers, in table order.
    pub fn inputs(&self) -> &[GuestBuffer] {
        &self.inputs
    }

    /// The `Out` buffers, in table order.
    pub fn outputs(&self) -> &[GuestBuffer] {
        &self.outputs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram() -> Arc<GuestRam> {
        Arc::new(
            GuestRam::from_ranges(&[(GuestAddress(0), 0x10000), (GuestAddress(0x10000), 0x10000)])
                .unwrap(),
        )
    }

    /// `Request::new` holds its invariants: known op, the op's shape, In before Out, one buffer
    /// per table entry, each exactly as long.
    #[test]
    fn requests_are_made_only_with_their_table() {
        let mem = ram();
        let buf = |addr: u64, len: usize| {
            GuestBuffer::new(mem.clone(), [(GuestAddress(addr), len)]).unwrap()
        };
        let mut echo = RequestHeader::new(Op::Echo);
        echo.push_buffer(Direction::In, 16).unwrap();
        echo.push_buffer(Direction::Out, 16).unwrap();
        let r = Request::new(echo, vec![buf(0, 16)], vec![buf(0x100, 16)]).unwrap();
        assert_eq!(r.op(), Op::Echo);
        assert_eq!((r.inputs().len(), r.outputs().len()), (1, 1));
        // One buffer short, one too many, swapped directions, a wrong length.
        assert!(matches!(
            Request::new(echo, vec![buf(0, 16)], vec![]),
            Err(RequestError::Shape { .. })
        ));
        assert!(matches!(
            Request::new(echo, vec![buf(0, 16), buf(0x40, 16)], vec![buf(0x100, 16)]),
            Err(RequestError::Shape { .. })
        ));
        assert!(matches!(
            Request::new(echo, vec![buf(0, 16)], vec![buf(0x100, 15)]),
            Err(RequestError::Length {
                index: 1,
                expected: 16,
                got: 15
            })
        ));
        let mut out_first = RequestHeader::new(Op::Echo);
        out_first.push_buffer(Direction::Out, 16).unwrap();
        out_first.push_buffer(Direction::In, 16).unwrap();
        Request::new(out_first, vec![buf(0, 16)], vec![buf(0x100, 16)]).unwrap_err();
        // An op the header does not name, or a table of another op's shape.
        let mut unknown = RequestHeader::new(Op::Hello);
        unknown.op = 0xfff0;
        assert!(matches!(
            Request::new(unknown, vec![], vec![]),
            Err(RequestError::Header(_))
        ));
        let mut hello_with_buffer = RequestHeader::new(Op::Hello);
        hello_with_buffer.push_buffer(Direction::In, 16).unwrap();
        Request::new(hello_with_buffer, vec![buf(0, 16)], vec![]).unwrap_err();
    }

    #[test]
    fn buffer_spans_regions_and_rejects_outside() {
        let mem = ram();
        let b = GuestBuffer::new(mem.clone(), [(GuestAddress(0xfff0), 0x20)]).unwrap();
        assert_eq!(b.runs().len(), 2);
        b.write_at(0, &[7u8; 0x20]).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![7u8; 0x20]);
        GuestBuffer::new(mem.clone(), [(GuestAddress(0x1fff0), 0x20)]).unwrap_err();
        GuestBuffer::new(mem.clone(), [(GuestAddress(u64::MAX - 4), 0x20)]).unwrap_err();
        b.read_at(0x10, &mut [0u8; 0x11]).unwrap_err();
    }

    #[test]
    fn scattered_runs_read_in_order() {
        let mem = ram();
        mem.write_slice(b"world", GuestAddress(0x100)).unwrap();
        mem.write_slice(b"hello ", GuestAddress(0x15000)).unwrap();
        let b =
            GuestBuffer::new(mem, [(GuestAddress(0x15000), 6), (GuestAddress(0x100), 5)]).unwrap();
        assert_eq!(b.to_vec().unwrap(), b"hello world");
        let mut mid = [0u8; 4];
        b.read_at(4, &mut mid).unwrap();
        assert_eq!(&mid, b"o wo");
        // A slice across the run boundary, one inside a run, an empty one, one too long.
        assert_eq!(b.slice(4, 4).unwrap().to_vec().unwrap(), b"o wo");
        assert_eq!(b.slice(7, 3).unwrap().runs().len(), 1);
        assert_eq!(b.slice(7, 3).unwrap().to_vec().unwrap(), b"orl");
        assert!(b.slice(11, 0).unwrap().is_empty());
        b.slice(5, 7).unwrap_err();
        b.slice(usize::MAX, 2).unwrap_err();
    }
}

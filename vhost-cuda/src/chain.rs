//! The virtio edge of a request: one descriptor chain in, one validated [`Request`] out.
//!
//! A chain is two byte streams, the device-readable part followed by the device-writable part;
//! descriptor boundaries carry no meaning (see `qcuda_proto`). [`parse`] cuts the readable
//! stream into the request header and the `In` buffers, and the writable stream into the `Out`
//! buffers and the response header, checking every length against the header and every
//! guest-physical run against guest RAM (through [`GuestBuffer`]).
//!
//! Writes only ever go to where the chain's writable descriptors point: the outputs are the
//! first bytes of the writable stream, the response its last [`RESPONSE_HEADER_SIZE`] bytes.
//! This is also true for a malformed chain, which still gets an error response when those last
//! bytes exist and lie in guest RAM; otherwise it is completed with used length 0.
//!
//! Nothing here knows about vrings or sessions: the caller (`vhu_cuda.rs`) pops the chain and
//! hands the result to the `SessionTable` or completes it directly.

use std::sync::Arc;

use qcuda_proto::{
    status, Direction, RequestHeader, ResponseHeader, WireError, MAX_CHAIN_SEGMENTS,
    REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE,
};
use thiserror::Error;
use virtio_queue::desc::split::Descriptor;
use vm_memory::GuestAddress;

use crate::guest_buffer::{BufferError, GuestBuffer, GuestRam, Request, RequestError};

/// Why a chain is not a valid request.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChainError {
    /// More descriptors than `MAX_CHAIN_SEGMENTS`.
    #[error("chain has more than {MAX_CHAIN_SEGMENTS} descriptors")]
    TooManyDescriptors,
    /// A device-readable descriptor follows a device-writable one.
    #[error("device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
    /// The writable part is longer than a used-ring length can express.
    #[error("writable part of {0} bytes is longer than 4 GiB")]
    WritableTooLong(u64),
    /// The readable part cannot hold a request header.
    #[error("readable part of {0} bytes is shorter than the request header")]
    ShortHeader(u64),
    /// The request header does not decode, or its op is unknown or has the wrong shape.
    #[error("bad request header: {0:?}")]
    Header(WireError),
    /// The readable part does not have the length the header announces.
    #[error("readable part is {actual} bytes, header announces {expected}")]
    ReadableLength {
        /// Header plus the `In` buffers.
        expected: u64,
        /// What the chain has.
        actual: u64,
    },
    /// The writable part does not have the length the header announces.
    #[error("writable part is {actual} bytes, header announces {expected}")]
    WritableLength {
        /// The `Out` buffers plus the response header.
        expected: u64,
        /// What the chain has.
        actual: u64,
    },
    /// A descriptor points outside guest RAM.
    #[error("{0}")]
    Memory(#[from] BufferError),
    /// The buffers do not match the header (the checks above rule it out).
    #[error("{0}")]
    Request(#[from] RequestError),
}

impl ChainError {
    /// The `cudaError_t` a malformed chain is answered with.
    pub fn status(&self) -> u32 {
        match self {
            Self::Header(WireError::BadVersion) => status::INSUFFICIENT_DRIVER,
            Self::Header(WireError::UnknownOp) => status::NOT_SUPPORTED,
            _ => status::INVALID_VALUE,
        }
    }
}

/// Where a chain's response goes, and the used length to report once it is written.
#[derive(Debug, Clone)]
pub struct Reply {
    response: GuestBuffer,
    used_len: u32,
}

impl Reply {
    /// Writes `resp` as the chain's response header and returns the used length to report:
    /// the whole writable part (outputs and response), or 0 if the write failed.
    pub fn write(&self, resp: &ResponseHeader) -> u32 {
        match self.response.write_at(0, &resp.encode()) {
            Ok(()) => self.used_len,
            Err(_) => 0,
        }
    }

    /// The used length reported after a successful [`Reply::write`].
    pub fn used_len(&self) -> u32 {
        self.used_len
    }
}

/// A chain that is a valid request.
#[derive(Debug)]
pub struct ParsedRequest {
    /// The request, its buffers validated.
    pub request: Request,
    /// Where its response goes.
    pub reply: Reply,
}

/// A chain that is not a valid request.
#[derive(Debug)]
pub struct Rejected {
    /// What is wrong with it.
    pub error: ChainError,
    /// Where the error response goes; `None` if the chain has no usable response area, in which
    /// case it is completed with used length 0.
    pub reply: Option<Reply>,
}

impl Rejected {
    /// Writes the error response, if the chain has room for one, and returns the used length.
    pub fn answer(&self) -> u32 {
        self.reply.as_ref().map_or(0, |r| {
            r.write(&ResponseHeader::with_status(self.error.status()))
        })
    }
}

/// One guest-physical run of a stream, as a descriptor gave it.
#[derive(Debug, Clone, Copy)]
struct Segment {
    addr: u64,
    len: u64,
}

/// Reads a stream of segments front to back, handing out consecutive byte ranges.
struct StreamCursor<'a> {
    segments: &'a [Segment],
    index: usize,
    offset: u64,
}

impl<'a> StreamCursor<'a> {
    fn new(segments: &'a [Segment]) -> Self {
        Self {
            segments,
            index: 0,
            offset: 0,
        }
    }

    /// The guest ranges of the next `len` bytes. The caller has checked that the stream holds
    /// them. A range whose address arithmetic overflows is outside guest RAM.
    fn take(&mut self, mut len: u64) -> Result<Vec<(GuestAddress, usize)>, BufferError> {
        let mut ranges = Vec::new();
        while len > 0 {
            let Some(seg) = self.segments.get(self.index) else {
                break;
            };
            let n = (seg.len - self.offset).min(len);
            let outside = || BufferError::OutOfGuestMemory {
                addr: seg.addr,
                len: seg.len,
            };
            let addr = seg
                .addr
                .checked_add(self.offset)
                .filter(|a| a.checked_add(n).is_some())
                .ok_or_else(outside)?;
            let run_len = usize::try_from(n).map_err(|_| outside())?;
            ranges.push((GuestAddress(addr), run_len));
            self.offset += n;
            len -= n;
            if self.offset == seg.len {
                self.index += 1;
                self.offset = 0;
            }
        }
        Ok(ranges)
    }

    /// Skips `len` bytes (no address is formed, so nothing can fail).
    fn skip(&mut self, mut len: u64) {
        while len > 0 {
            let Some(seg) = self.segments.get(self.index) else {
                break;
            };
            let n = (seg.len - self.offset).min(len);
            self.offset += n;
            len -= n;
            if self.offset == seg.len {
                self.index += 1;
                self.offset = 0;
            }
        }
    }
}

/// The readable and writable streams of a chain.
struct Streams {
    readable: Vec<Segment>,
    writable: Vec<Segment>,
    readable_len: u64,
    writable_len: u64,
    misordered: bool,
}

fn collect(descriptors: impl IntoIterator<Item = Descriptor>) -> Result<Streams, ChainError> {
    let mut s = Streams {
        readable: Vec::new(),
        writable: Vec::new(),
        readable_len: 0,
        writable_len: 0,
        misordered: false,
    };
    let mut seen_writable = false;
    // `take` bounds the walk even if the descriptor source is endless.
    for (count, desc) in descriptors
        .into_iter()
        .take(MAX_CHAIN_SEGMENTS + 1)
        .enumerate()
    {
        if count == MAX_CHAIN_SEGMENTS {
            return Err(ChainError::TooManyDescriptors);
        }
        let seg = Segment {
            addr: desc.addr().0,
            len: u64::from(desc.len()),
        };
        // At most MAX_CHAIN_SEGMENTS lengths below 2^32 each: the sums cannot overflow.
        if desc.is_write_only() {
            seen_writable = true;
            s.writable_len += seg.len;
            if seg.len > 0 {
                s.writable.push(seg);
            }
        } else {
            s.misordered |= seen_writable;
            s.readable_len += seg.len;
            if seg.len > 0 {
                s.readable.push(seg);
            }
        }
    }
    Ok(s)
}

/// The response area: the last `RESPONSE_HEADER_SIZE` bytes of the writable stream, if they
/// exist and lie in guest RAM.
fn reply_area(mem: &Arc<GuestRam>, s: &Streams) -> Result<Reply, ChainError> {
    let resp_len = RESPONSE_HEADER_SIZE as u64;
    if s.writable_len < resp_len {
        return Err(ChainError::WritableLength {
            expected: resp_len,
            actual: s.writable_len,
        });
    }
    let used_len =
        u32::try_from(s.writable_len).map_err(|_| ChainError::WritableTooLong(s.writable_len))?;
    let mut cursor = StreamCursor::new(&s.writable);
    cursor.skip(s.writable_len - resp_len);
    let response = GuestBuffer::new(mem.clone(), cursor.take(resp_len)?)?;
    Ok(Reply { response, used_len })
}

/// Parses a descriptor chain into a request.
///
/// `mem` must be the memory map the descriptors were read from (the chain's own snapshot);
/// every buffer of the result keeps it alive. Never panics and never writes guest memory.
pub fn parse(
    mem: &Arc<GuestRam>,
    descriptors: impl IntoIterator<Item = Descriptor>,
) -> Result<ParsedRequest, Rejected> {
    let streams = collect(descriptors).map_err(|error| Rejected { error, reply: None })?;
    let reply = reply_area(mem, &streams);
    if streams.misordered {
        return Err(Rejected {
            error: ChainError::ReadableAfterWritable,
            reply: reply.ok(),
        });
    }
    // Without a response area the only answer is used length 0.
    let reply = reply.map_err(|error| Rejected { error, reply: None })?;
    match build_request(mem, &streams) {
        Ok(request) => Ok(ParsedRequest { request, reply }),
        Err(error) => Err(Rejected {
            error,
            reply: Some(reply),
        }),
    }
}

fn build_request(mem: &Arc<GuestRam>, s: &Streams) -> Result<Request, ChainError> {
    if s.readable_len < REQUEST_HEADER_SIZE as u64 {
        return Err(ChainError::ShortHeader(s.readable_len));
    }
    let mut readable = StreamCursor::new(&s.readable);
    let header_buf = GuestBuffer::new(mem.clone(), readable.take(REQUEST_HEADER_SIZE as u64)?)?;
    let mut raw = [0u8; REQUEST_HEADER_SIZE];
    header_buf.read_at(0, &mut raw)?;
    let header = RequestHeader::decode(&raw).map_err(ChainError::Header)?;
    header.checked_op().map_err(ChainError::Header)?;

    // Each buffer is at most MAX_BUFFER_LEN (checked by decode), so the totals cannot overflow.
    let (in_total, out_total) = header.totals();
    let expected = REQUEST_HEADER_SIZE as u64 + in_total;
    if s.readable_len != expected {
        return Err(ChainError::ReadableLength {
            expected,
            actual: s.readable_len,
        });
    }
    let expected = out_total + RESPONSE_HEADER_SIZE as u64;
    if s.writable_len != expected {
        return Err(ChainError::WritableLength {
            expected,
            actual: s.writable_len,
        });
    }

    let mut writable = StreamCursor::new(&s.writable);
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    for desc in header.buffers() {
        // decode() admits only In and Out, In first.
        let (cursor, list) = if desc.dir == Direction::In as u32 {
            (&mut readable, &mut inputs)
        } else {
            (&mut writable, &mut outputs)
        };
        list.push(GuestBuffer::new(mem.clone(), cursor.take(desc.len)?)?);
    }
    Ok(Request::new(header, inputs, outputs)?)
}

#[cfg(test)]
mod tests {
    use qcuda_proto::{Op, MAX_BUFFER_LEN};
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::{desc::RawDescriptor, mock::MockSplitQueue};
    use vm_memory::Bytes;

    use super::*;

    const QUEUE: u16 = 16;
    const DATA: u64 = 0x1_0000;

    /// Guest RAM: [0, 128 KiB) as two adjacent regions, then a gap, then [1 MiB, 1 MiB + 64 KiB).
    fn ram() -> Arc<GuestRam> {
        Arc::new(
            GuestRam::from_ranges(&[
                (GuestAddress(0), 0x1_0000),
                (GuestAddress(0x1_0000), 0x1_0000),
                (GuestAddress(0x10_0000), 0x1_0000),
            ])
            .unwrap(),
        )
    }

    fn rd(addr: u64, len: u32) -> RawDescriptor {
        RawDescriptor::from(Descriptor::new(addr, len, 0, 0))
    }

    fn wr(addr: u64, len: u32) -> RawDescriptor {
        let flags = u16::try_from(VRING_DESC_F_WRITE).unwrap();
        RawDescriptor::from(Descriptor::new(addr, len, flags, 0))
    }

    /// Builds the chain in a mock split queue and parses what the device side reads.
    fn run(mem: &Arc<GuestRam>, descs: &[RawDescriptor]) -> Result<ParsedRequest, Rejected> {
        let q = MockSplitQueue::new(&**mem, QUEUE);
        let chain = q.build_desc_chain(descs).unwrap();
        parse(mem, chain)
    }

    fn echo_header(len: u64) -> RequestHeader {
        let mut h = RequestHeader::new(Op::Echo);
        h.session = 7;
        h.push_buffer(Direction::In, len).unwrap();
        h.push_buffer(Direction::Out, len).unwrap();
        h
    }

    fn put_header(mem: &GuestRam, at: u64, h: &RequestHeader) {
        mem.write_slice(&h.encode(), GuestAddress(at)).unwrap();
    }

    fn response_at(mem: &GuestRam, at: u64) -> ResponseHeader {
        let mut b = [0u8; RESPONSE_HEADER_SIZE];
        mem.read_slice(&mut b, GuestAddress(at)).unwrap();
        ResponseHeader::decode(&b).unwrap()
    }

    #[test]
    fn echo_chain_with_arbitrary_descriptor_boundaries() {
        let mem = ram();
        // Header and input share descriptors in odd places; output and response too.
        let mut stream = echo_header(10).encode().to_vec();
        stream.extend_from_slice(b"0123456789");
        mem.write_slice(&stream[..100], GuestAddress(DATA)).unwrap();
        mem.write_slice(&stream[100..], GuestAddress(DATA + 0x1000))
            .unwrap();
        let descs = [
            rd(DATA, 100),
            rd(DATA + 0x1000, 134),
            wr(DATA + 0x2000, 4),
            wr(DATA + 0x3000, 6 + 30),
            wr(DATA + 0x4000, 34),
        ];
        let p = run(&mem, &descs).unwrap();
        assert_eq!(p.request.op(), Op::Echo);
        assert_eq!(p.request.header().session, 7);
        assert_eq!(p.request.inputs()[0].to_vec().unwrap(), b"0123456789");
        assert_eq!(p.request.outputs()[0].len(), 10);
        assert_eq!(p.request.outputs()[0].runs().len(), 2);
        assert_eq!(p.reply.used_len(), 10 + 64);
        assert_eq!(
            p.reply.write(&ResponseHeader::with_status(status::SUCCESS)),
            74
        );
        // The response starts 6 bytes into the second writable descriptor.
        let mut b = [0u8; 64];
        mem.read_slice(&mut b[..30], GuestAddress(DATA + 0x3006))
            .unwrap();
        mem.read_slice(&mut b[30..], GuestAddress(DATA + 0x4000))
            .unwrap();
        assert_eq!(b, ResponseHeader::with_status(0).encode());
    }

    #[test]
    fn buffer_straddling_two_regions_is_split() {
        let mem = ram();
        put_header(&mem, DATA, &echo_header(0x20));
        let descs = [
            rd(DATA, u32::try_from(REQUEST_HEADER_SIZE).unwrap()),
            rd(0xfff0, 0x20),
            wr(0xfff0, 0x20),
            wr(DATA + 0x5000, 64),
        ];
        let p = run(&mem, &descs).unwrap();
        assert_eq!(p.request.inputs()[0].runs().len(), 2);
        assert_eq!(p.request.outputs()[0].runs().len(), 2);
        // The response straddling the end of RAM cannot be written: no reply at all.
        let descs = [
            rd(DATA, u32::try_from(REQUEST_HEADER_SIZE).unwrap() + 0x20),
            wr(0x1_fff0, 0x20 + 64),
        ];
        let r = rejected(&mem, &descs);
        assert!(matches!(r.error, ChainError::Memory(_)), "{:?}", r.error);
        assert!(r.reply.is_none());
    }

    #[test]
    fn hello_chain_without_buffers() {
        let mem = ram();
        let mut h = RequestHeader::new(Op::Hello);
        h.args[0] = 1;
        put_header(&mem, DATA, &h);
        let p = run(&mem, &[rd(DATA, 224), wr(DATA + 0x1000, 64)]).unwrap();
        assert_eq!(p.request.op(), Op::Hello);
        assert!(p.request.inputs().is_empty() && p.request.outputs().is_empty());
        assert_eq!(p.reply.used_len(), 64);
    }

    fn rejected(mem: &Arc<GuestRam>, descs: &[RawDescriptor]) -> Rejected {
        match run(mem, descs) {
            Ok(p) => panic!("accepted a malformed chain: {:?}", p.request.header()),
            Err(r) => r,
        }
    }

    #[test]
    fn malformed_chains_get_an_error_status_in_the_response_area() {
        let mem = ram();
        let resp = DATA + 0x8000;
        let cases: Vec<(&str, Vec<u8>, Vec<RawDescriptor>, u32)> = vec![
            (
                "short header",
                echo_header(0).encode().to_vec(),
                vec![rd(DATA, 100), wr(resp, 64)],
                status::INVALID_VALUE,
            ),
            (
                "readable too long",
                echo_header(4).encode().to_vec(),
                vec![rd(DATA, 224 + 5), wr(resp, 4 + 64)],
                status::INVALID_VALUE,
            ),
            (
                "writable too short",
                echo_header(4).encode().to_vec(),
                vec![rd(DATA, 224 + 4), wr(resp, 3 + 64)],
                status::INVALID_VALUE,
            ),
            (
                "readable after writable",
                echo_header(0).encode().to_vec(),
                vec![rd(DATA, 224), wr(resp, 64), rd(DATA + 0x100, 0)],
                status::INVALID_VALUE,
            ),
            (
                "unknown op",
                {
                    let mut h = RequestHeader::new(Op::Hello);
                    h.op = 0x7777;
                    h.encode().to_vec()
                },
                vec![rd(DATA, 224), wr(resp, 64)],
                status::NOT_SUPPORTED,
            ),
            (
                "bad version",
                {
                    let mut b = RequestHeader::new(Op::Hello).encode();
                    b[4] = 9;
                    b.to_vec()
                },
                vec![rd(DATA, 224), wr(resp, 64)],
                status::INSUFFICIENT_DRIVER,
            ),
            (
                "bad magic",
                {
                    let mut b = RequestHeader::new(Op::Hello).encode();
                    b[0] ^= 1;
                    b.to_vec()
                },
                vec![rd(DATA, 224), wr(resp, 64)],
                status::INVALID_VALUE,
            ),
            (
                "wrong shape",
                {
                    let mut h = RequestHeader::new(Op::Echo);
                    h.push_buffer(Direction::In, 0).unwrap();
                    h.encode().to_vec()
                },
                vec![rd(DATA, 224), wr(resp, 64)],
                status::INVALID_VALUE,
            ),
            (
                "buffer too long",
                echo_header(MAX_BUFFER_LEN + 1).encode().to_vec(),
                vec![rd(DATA, 224), wr(resp, 64)],
                status::INVALID_VALUE,
            ),
            (
                "input outside guest RAM",
                echo_header(16).encode().to_vec(),
                vec![rd(DATA, 224), rd(0x2_0000, 16), wr(resp, 16 + 64)],
                status::INVALID_VALUE,
            ),
            (
                "output outside guest RAM",
                echo_header(16).encode().to_vec(),
                vec![rd(DATA, 224 + 16), wr(0x1_fff8, 16), wr(resp, 64)],
                status::INVALID_VALUE,
            ),
        ];
        for (name, header, descs, want) in cases {
            mem.write_slice(&header, GuestAddress(DATA)).unwrap();
            mem.write_slice(&[0xaa; 64], GuestAddress(resp)).unwrap();
            let r = rejected(&mem, &descs);
            let last = descs
                .iter()
                .map(|d| Descriptor::from(*d))
                .rfind(|d| d.is_write_only())
                .unwrap();
            let resp_at = last.addr().0 + u64::from(last.len()) - 64;
            let used = r.answer();
            assert_ne!(used, 0, "{name}: {:?}", r.error);
            assert_eq!(r.error.status(), want, "{name}: {:?}", r.error);
            assert_eq!(response_at(&mem, resp_at).status, want, "{name}");
        }
    }

    #[test]
    fn chains_without_a_usable_response_area_complete_with_zero() {
        let mem = ram();
        put_header(&mem, DATA, &RequestHeader::new(Op::Hello));
        for descs in [
            vec![rd(DATA, 224)],
            vec![rd(DATA, 224), wr(DATA + 0x1000, 63)],
            // The response would straddle the end of RAM.
            vec![rd(DATA, 224), wr(0x10_ffe0, 64)],
            // Response in the gap between regions.
            vec![rd(DATA, 224), wr(0x8_0000, 64)],
            // Overflowing address.
            vec![rd(DATA, 224), wr(u64::MAX - 10, 64)],
            // Overflowing descriptor whose tail would wrap around to low, valid addresses.
            vec![rd(DATA, 224), wr(u64::MAX - 0x76, 0x5d5)],
        ] {
            let r = rejected(&mem, &descs);
            assert!(r.reply.is_none(), "{:?}", r.error);
            assert_eq!(r.answer(), 0);
        }
    }

    #[test]
    fn too_many_descriptors_is_rejected_without_walking_further() {
        let mem = ram();
        let descs = (0..MAX_CHAIN_SEGMENTS + 5)
            .map(|i| Descriptor::new(DATA + i as u64, 1, 0, 0))
            .chain(std::iter::once(Descriptor::new(
                DATA,
                64,
                u16::try_from(VRING_DESC_F_WRITE).unwrap(),
                0,
            )));
        let r = parse(&mem, descs).unwrap_err();
        assert_eq!(r.error, ChainError::TooManyDescriptors);
        assert!(r.reply.is_none());
        // An endless source terminates too.
        let endless = std::iter::repeat(Descriptor::new(DATA, 1, 0, 0));
        assert_eq!(
            parse(&mem, endless).unwrap_err().error,
            ChainError::TooManyDescriptors
        );
    }

    #[test]
    fn session_close_is_a_valid_request() {
        let mem = ram();
        let mut h = RequestHeader::new(Op::SessionClose);
        h.session = 99;
        put_header(&mem, DATA, &h);
        let p = run(&mem, &[rd(DATA, 224), wr(DATA + 0x1000, 64)]).unwrap();
        assert_eq!(p.request.op(), Op::SessionClose);
        assert_eq!(p.request.header().session, 99);
    }

    #[test]
    fn zero_length_descriptors_are_ignored() {
        let mem = ram();
        put_header(&mem, DATA, &echo_header(3));
        mem.write_slice(b"abc", GuestAddress(DATA + 0x1000))
            .unwrap();
        let descs = [
            rd(0xdead_0000_0000, 0),
            rd(DATA, 224),
            rd(DATA + 0x1000, 3),
            wr(u64::MAX, 0),
            wr(DATA + 0x2000, 67),
        ];
        let p = run(&mem, &descs).unwrap();
        assert_eq!(p.request.inputs()[0].to_vec().unwrap(), b"abc");
    }
}

//! qcuda-proto's decoders: every header and record a peer can send. Whatever decodes must
//! re-encode to something that decodes to the same value, and must satisfy the invariants the
//! rest of the stack relies on (buffer table shape, lengths, In before Out).
#![no_main]

use libfuzzer_sys::fuzz_target;
use qcuda_proto::{
    ioctl::{HostMapCall, IoctlCall},
    Direction, GpuInfo, HostRun, ParamInfo, RequestHeader, ResponseHeader, SessionUsage,
    MAX_BUFFER_LEN, USAGE_KNOWN_FLAGS,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = RequestHeader::decode(data) {
        assert_eq!(RequestHeader::decode(&h.encode()), Ok(h));
        let bufs = h.buffers();
        let (ins, outs) = h.counts();
        assert_eq!(ins + outs, bufs.len());
        // In first, then Out; each at most MAX_BUFFER_LEN.
        assert!(bufs[..ins].iter().all(|b| b.dir == Direction::In as u32));
        assert!(bufs[ins..].iter().all(|b| b.dir == Direction::Out as u32));
        assert!(bufs.iter().all(|b| b.len <= MAX_BUFFER_LEN));
        let (tin, tout) = h.totals();
        assert!(tin <= MAX_BUFFER_LEN * ins as u64 && tout <= MAX_BUFFER_LEN * outs as u64);
        if let Ok(op) = h.checked_op() {
            assert_eq!(op.shape(), (ins, outs));
        }
    }
    if let Ok(r) = ResponseHeader::decode(data) {
        assert_eq!(ResponseHeader::decode(&r.encode()), Ok(r));
        let _ = r.deferred_error();
    }
    if let Ok(c) = IoctlCall::decode(data) {
        // The out fields are not read; everything else must survive a round trip.
        assert_eq!(IoctlCall::decode(&c.encode()), Ok(c));
        let op = c.header().checked_op().expect("a decoded call has a valid op");
        assert!(!op.is_kernel_only());
        let mut h = c.header();
        h.session = 1;
        assert_eq!(RequestHeader::decode(&h.encode()), Ok(h));
    }
    if let Ok(m) = HostMapCall::decode(data) {
        assert_eq!(HostMapCall::decode(&m.encode()), Ok(m));
    }
    if let Ok(g) = GpuInfo::decode(data) {
        assert_eq!(GpuInfo::decode(&g.encode()), Ok(g));
        let _ = g.name_bytes();
    }
    if let Ok(r) = HostRun::decode(data) {
        assert_eq!(HostRun::decode(&r.encode()), Ok(r));
    }
    if let Ok(u) = SessionUsage::decode(data) {
        assert_eq!(SessionUsage::decode(&u.encode()), Ok(u));
        assert_eq!(u.flags & !USAGE_KNOWN_FLAGS, 0);
    }
    if let Ok(p) = ParamInfo::decode(data) {
        assert_eq!(ParamInfo::decode(&p.encode()), Ok(p));
    }
});

//! The ops the backend answers itself, without the CUDA executor: the `Hello` handshake and the
//! `Echo` transport self-test. (`SessionClose` is handled by the session thread,
//! `session/thread.rs`, since it ends the worker.)

use qcuda_proto::{status, Checksum, ResponseHeader, VERSION};

use crate::{cuda::CudaHost, guest_buffer::Request};

/// Bytes `Echo` moves per step: the copy streams through this much host memory, however large
/// the buffers are.
pub const ECHO_CHUNK: usize = 256 * 1024;

/// `Hello`: rets[0] = host wire version, rets[1] = GPU count, rets[2] = driver version,
/// rets[3] = `sessions_open`, the sessions this VM has open (the caller's included).
/// A guest announcing another wire version in args[0] gets `INSUFFICIENT_DRIVER`, still with
/// the host's values so it can say what it talks to.
pub fn hello(host: &CudaHost, req: &Request, sessions_open: usize) -> ResponseHeader {
    let mut resp = ResponseHeader::with_status(status::SUCCESS);
    if req.header().args[0] != u64::from(VERSION) {
        resp.status = status::INSUFFICIENT_DRIVER;
    }
    resp.rets[0] = u64::from(VERSION);
    resp.rets[1] = u64::from(host.gpu_count());
    resp.rets[2] = u64::from(host.driver_version());
    resp.rets[3] = sessions_open as u64;
    resp
}

/// `Echo`: copies in-buffer 0 to out-buffer 0 (equal lengths) and returns the checksum of the
/// bytes read in rets[0].
pub fn echo(req: &Request) -> ResponseHeader {
    let (Some(input), Some(output)) = (req.inputs().first(), req.outputs().first()) else {
        return ResponseHeader::with_status(status::INVALID_VALUE);
    };
    if input.len() != output.len() {
        return ResponseHeader::with_status(status::INVALID_VALUE);
    }
    let mut sum = Checksum::new();
    let mut chunk = vec![0u8; ECHO_CHUNK.min(input.len())];
    let mut at = 0;
    while at < input.len() {
        let n = ECHO_CHUNK.min(input.len() - at);
        let buf = &mut chunk[..n];
        // Both buffers were validated against guest RAM when the chain was parsed, so these
        // only fail on a bug; answer rather than panic.
        if input.read_at(at, buf).is_err() || output.write_at(at, buf).is_err() {
            return ResponseHeader::with_status(status::UNKNOWN);
        }
        sum.update(buf);
        at += n;
    }
    let mut resp = ResponseHeader::with_status(status::SUCCESS);
    resp.rets[0] = sum.finish();
    resp
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use qcuda_proto::{Direction, Op, RequestHeader};
    use vm_memory::GuestAddress;

    use super::*;
    use crate::guest_buffer::{GuestBuffer, GuestRam};

    fn request(op: Op, input: Option<(u64, usize)>, output: Option<(u64, usize)>) -> Request {
        let mem = Arc::new(GuestRam::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap());
        let mut header = RequestHeader::new(op);
        let buf = |(a, l): (u64, usize)| GuestBuffer::new(mem.clone(), [(GuestAddress(a), l)]);
        let inputs: Vec<_> = input.into_iter().map(|r| buf(r).unwrap()).collect();
        let outputs: Vec<_> = output.into_iter().map(|r| buf(r).unwrap()).collect();
        for b in &inputs {
            header.push_buffer(Direction::In, b.len() as u64).unwrap();
        }
        for b in &outputs {
            header.push_buffer(Direction::Out, b.len() as u64).unwrap();
        }
        Request::new(header, inputs, outputs).unwrap()
    }

    #[test]
    fn echo_copies_in_chunks_and_checksums() {
        let len = 3 * ECHO_CHUNK + 17;
        let req = request(Op::Echo, Some((0x10, len)), Some((0x80_0000, len)));
        let data: Vec<u8> = (0..len)
            .map(|i| u8::try_from(i * 31 % 251).unwrap())
            .collect();
        req.inputs()[0].write_at(0, &data).unwrap();
        let resp = echo(&req);
        assert_eq!(resp.status, status::SUCCESS);
        assert_eq!(resp.rets[0], Checksum::of(&data));
        assert_eq!(req.outputs()[0].to_vec().unwrap(), data);
    }

    #[test]
    fn echo_of_nothing_and_of_unequal_lengths() {
        let req = request(Op::Echo, Some((0, 0)), Some((0, 0)));
        assert_eq!(echo(&req).rets[0], Checksum::of(&[]));
        let req = request(Op::Echo, Some((0, 4)), Some((0x100, 5)));
        assert_eq!(echo(&req).status, status::INVALID_VALUE);
    }

    #[test]
    fn hello_reports_version_and_host() {
        let host = CudaHost::probe();
        let hello_of = |version: u64| {
            let mut header = *request(Op::Hello, None, None).header();
            header.args[0] = version;
            Request::new(header, vec![], vec![]).unwrap()
        };
        let resp = hello(&host, &hello_of(u64::from(VERSION)), 3);
        assert_eq!(resp.status, status::SUCCESS);
        assert_eq!(resp.rets[3], 3);
        assert_eq!(resp.rets[0], u64::from(VERSION));
        assert_eq!(resp.rets[1], u64::from(host.gpu_count()));
        assert_eq!(resp.rets[2], u64::from(host.driver_version()));
        assert_eq!(
            hello(&host, &hello_of(99), 1).status,
            status::INSUFFICIENT_DRIVER
        );
    }
}

//! Round-trips every wire type and checks that malformed encodings are rejected.

use qcuda_proto::{ioctl::*, *};

#[test]
fn request_header_roundtrips() {
    let mut h = RequestHeader::new(Op::Echo);
    h.session = 0x1122_3344_5566_7788;
    h.device = 3;
    h.pid = 4242;
    h.flags = FLAG_ASYNC;
    h.args = [1, 2, 3, 4, 5, 6, 7, u64::MAX];
    h.push_buffer(Direction::In, 100).unwrap();
    h.push_buffer(Direction::Out, 100).unwrap();
    let b = h.encode();
    assert_eq!(b.len(), REQUEST_HEADER_SIZE);
    let d = RequestHeader::decode(&b).unwrap();
    assert_eq!(d, h);
    assert_eq!(d.checked_op(), Ok(Op::Echo));
    assert_eq!(d.totals(), (100, 100));
}

#[test]
fn request_header_rejects_malformed() {
    let mut h = RequestHeader::new(Op::Echo);
    h.push_buffer(Direction::In, 8).unwrap();
    h.push_buffer(Direction::Out, 8).unwrap();
    let good = h.encode();
    assert_eq!(
        RequestHeader::decode(&good[..REQUEST_HEADER_SIZE - 1]),
        Err(WireError::Short)
    );
    let mut b = good;
    b[0] ^= 1;
    assert_eq!(RequestHeader::decode(&b), Err(WireError::BadMagic));
    let mut b = good;
    b[4] = 9;
    assert_eq!(RequestHeader::decode(&b), Err(WireError::BadVersion));
    let mut b = good;
    b[7] = 0x80;
    assert_eq!(RequestHeader::decode(&b), Err(WireError::Reserved));
    let mut b = good;
    b[12] = 9;
    assert_eq!(RequestHeader::decode(&b), Err(WireError::TooManyBuffers));
    let mut b = good;
    b[96 + 8] = 7; // bad direction of buffer 0
    assert_eq!(RequestHeader::decode(&b), Err(WireError::BadDirection));
    let mut b = good;
    b[96 + 8] = 2; // Out then In
    b[96 + 16 + 8] = 1;
    assert_eq!(RequestHeader::decode(&b), Err(WireError::BadDirection));
    let mut b = good;
    b[96 + 7] = 0x10; // 2^60 bytes
    assert_eq!(RequestHeader::decode(&b), Err(WireError::BufferTooLong));
    let mut b = good;
    b[96 + 16 * 5] = 1; // unused slot not zero
    assert_eq!(RequestHeader::decode(&b), Err(WireError::Reserved));
    let mut b = good;
    b[30] = 1;
    assert_eq!(RequestHeader::decode(&b).unwrap().pid, 1 << 16);
    // Wrong shape and unknown op decode, but are not valid ops.
    let mut h2 = h;
    h2.op = Op::Malloc as u32;
    assert_eq!(
        RequestHeader::decode(&h2.encode()).unwrap().checked_op(),
        Err(WireError::BadShape)
    );
    h2.op = 0x7777;
    assert_eq!(
        RequestHeader::decode(&h2.encode()).unwrap().checked_op(),
        Err(WireError::UnknownOp)
    );
}

#[test]
fn every_op_roundtrips_and_shapes_fit() {
    for &op in Op::ALL {
        assert_eq!(Op::from_u32(op as u32), Some(op));
        let (i, o) = op.shape();
        assert!(i + o <= MAX_BUFFERS);
        let mut h = RequestHeader::new(op);
        for _ in 0..i {
            h.push_buffer(Direction::In, 1).unwrap();
        }
        for _ in 0..o {
            h.push_buffer(Direction::Out, 1).unwrap();
        }
        assert_eq!(
            RequestHeader::decode(&h.encode()).unwrap().checked_op(),
            Ok(op)
        );
    }
    assert!(Op::SessionClose.is_kernel_only());
    assert!(Op::DriverReset.is_kernel_only());
    assert_eq!(Op::DriverReset as u32, 0x8000_0002);
    assert_eq!(Op::DriverReset.shape(), (0, 0));
    assert!(!Op::Hello.is_kernel_only());
    // Exactly the ops the kernel module sends itself are kernel-only.
    let kernel_only: Vec<Op> = Op::ALL
        .iter()
        .copied()
        .filter(|op| op.is_kernel_only())
        .collect();
    assert_eq!(
        kernel_only,
        [
            Op::SessionClose,
            Op::DriverReset,
            Op::HostMap,
            Op::HostUnmap
        ]
    );
}

#[test]
fn host_map_calls_and_runs_roundtrip() {
    use qcuda_proto::{
        ioctl::{HostMapCall, HOST_MAP_CALL_SIZE, IOCTL_HOST_MAP, IOCTL_HOST_UNMAP},
        HostRun, HOST_MAP_READ_ONLY, HOST_WINDOW_BASE, HOST_WINDOW_LEN,
    };
    assert_eq!(core::mem::size_of::<HostMapCall>(), HOST_MAP_CALL_SIZE);
    // _IOWR('Q', 2 / 3, 40 bytes), as the kernel computes them.
    assert_eq!(IOCTL_HOST_MAP, 0xc028_5102);
    assert_eq!(IOCTL_HOST_UNMAP, 0xc028_5103);
    let c = HostMapCall {
        addr: 0x7f00_1234_5000,
        len: 3 << 20,
        flags: HOST_MAP_READ_ONLY,
        device: 1,
        status: 0,
        dev_addr: 0,
    };
    assert_eq!(HostMapCall::decode(&c.encode()), Ok(c));
    let managed = HostMapCall {
        flags: HOST_MAP_MANAGED,
        ..c
    };
    assert_eq!(HostMapCall::decode(&managed.encode()), Ok(managed));
    let bad = HostMapCall { flags: 4, ..c };
    assert_eq!(HostMapCall::decode(&bad.encode()), Err(WireError::Reserved));
    let r = HostRun {
        gpa: 0x1_2345_6000,
        len: 0x40_0000,
    };
    assert_eq!(HostRun::decode(&r.encode()), Ok(r));
    HostRun::decode(&[0; 15]).unwrap_err();
    // The window is page-aligned and within the 47-bit user address space.
    assert_eq!(HOST_WINDOW_BASE % 4096, 0);
    const { assert!(HOST_WINDOW_BASE + HOST_WINDOW_LEN < 0x7fff_ffff_f000) };
}

#[test]
fn response_roundtrips() {
    let r = ResponseHeader {
        status: status::ILLEGAL_ADDRESS,
        flags: RESP_FLAG_STICKY,
        rets: [9, 8, 7, 6, 5, 4, 3],
    };
    let b = r.encode();
    assert_eq!(ResponseHeader::decode(&b), Ok(r));
    assert_eq!(ResponseHeader::decode(&b[..10]), Err(WireError::Short));
}

#[test]
fn gpu_info_and_param_info_roundtrip() {
    let mut g = GpuInfo {
        total_mem: 80 << 30,
        cc_major: 9,
        cc_minor: 0,
        multiprocessors: 132,
        pci_bus: 0x1b,
        ..GpuInfo::default()
    };
    g.set_name(b"NVIDIA H100 80GB HBM3");
    g.uuid = [7; 16];
    let d = GpuInfo::decode(&g.encode()).unwrap();
    assert_eq!(d, g);
    assert_eq!(d.name_bytes(), b"NVIDIA H100 80GB HBM3");
    let mut long = GpuInfo::default();
    long.set_name(&[b'x'; 1000]);
    assert_eq!(long.name_bytes().len(), GPU_NAME_LEN - 1);
    assert_eq!(GpuInfo::decode(&[0; 10]), Err(WireError::Short));
    let p = ParamInfo {
        offset: 16,
        size: 8,
    };
    assert_eq!(ParamInfo::decode(&p.encode()), Ok(p));
}

#[test]
fn ioctl_call_layout_matches_encoding() {
    assert_eq!(core::mem::size_of::<IoctlCall>(), IOCTL_CALL_SIZE);
    let mut c = IoctlCall::new(Op::Echo);
    c.device = 1;
    c.args[0] = 42;
    c.push(Direction::In, 0x1000, 64).unwrap();
    c.push(Direction::Out, 0x2000, 64).unwrap();
    let b = c.encode();
    // The repr(C) struct's bytes are its encoding on little-endian hosts.
    // SAFETY: IoctlCall is repr(C), has no padding (size checked above) and is fully initialised.
    let raw = unsafe { core::slice::from_raw_parts((&raw const c).cast::<u8>(), IOCTL_CALL_SIZE) };
    assert_eq!(raw, &b[..]);
    let d = IoctlCall::decode(&b).unwrap();
    assert_eq!(d, c);
    let h = d.header();
    assert_eq!(h.checked_op(), Ok(Op::Echo));
    assert_eq!(h.args[0], 42);
    assert_eq!(
        IOCTL_CALL,
        0xc000_5101 | (u32::try_from(IOCTL_CALL_SIZE).unwrap() << 16)
    );
}

#[test]
fn ioctl_call_wait_flags_stay_in_the_guest() {
    for mode in [WaitMode::Poll, WaitMode::Spin, WaitMode::Block] {
        let mut c = IoctlCall::new(Op::StreamSynchronize);
        c.flags |= mode.call_flags();
        let d = IoctlCall::decode(&c.encode()).unwrap();
        assert_eq!(d.wait_mode(), mode);
        // The device sees the request's flags only.
        assert_eq!(d.header().flags, 0);
    }
    // Both at once, a bit beside them, or a wait flag on a call that does not wait: refused.
    let mut c = IoctlCall::new(Op::StreamSynchronize);
    c.flags = CALL_WAIT_SPIN | CALL_WAIT_BLOCK;
    assert_eq!(IoctlCall::decode(&c.encode()), Err(WireError::Reserved));
    c.flags = CALL_WAIT_SPIN | 1 << 18;
    assert_eq!(IoctlCall::decode(&c.encode()), Err(WireError::Reserved));
    c.flags = CALL_WAIT_BLOCK | u32::from(FLAG_ASYNC);
    assert_eq!(IoctlCall::decode(&c.encode()), Err(WireError::Reserved));
}

#[test]
fn ioctl_call_rejects_malformed() {
    let mut c = IoctlCall::new(Op::Echo);
    c.push(Direction::In, 0x1000, 64).unwrap();
    c.push(Direction::Out, 0x2000, 64).unwrap();
    let good = c.encode();
    let mut b = good;
    b[4] = 0x10;
    assert_eq!(IoctlCall::decode(&b), Err(WireError::Reserved));
    let mut b = good;
    b[12] = 200;
    assert_eq!(IoctlCall::decode(&b), Err(WireError::TooManyBuffers));
    let mut b = good;
    b[144 + 16] = 3;
    assert_eq!(IoctlCall::decode(&b), Err(WireError::BadDirection));
    let mut b = good;
    b[144 + 20] = 1;
    assert_eq!(IoctlCall::decode(&b), Err(WireError::Reserved));
    let mut b = good;
    b[144 + 15] = 1;
    assert_eq!(IoctlCall::decode(&b), Err(WireError::BufferTooLong));
    // User space cannot send the kernel module's own ops.
    for op in [Op::SessionClose, Op::DriverReset] {
        let k = IoctlCall::new(op);
        assert_eq!(IoctlCall::decode(&k.encode()), Err(WireError::UnknownOp));
    }
    let mut s = IoctlCall::new(Op::Malloc);
    s.push(Direction::In, 0, 1).unwrap();
    assert_eq!(IoctlCall::decode(&s.encode()), Err(WireError::BadShape));
}

#[test]
fn checksum_is_split_invariant() {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "test data: the low byte of i * 7 + i / 13, truncation intended"
    )]
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    let whole = Checksum::of(&data);
    for split in [0, 1, 3, 7, 8, 9, 4095, 9999, 10_000] {
        let mut c = Checksum::new();
        c.update(&data[..split]);
        c.update(&data[split..]);
        assert_eq!(c.finish(), whole, "split at {split}");
    }
    let mut c = Checksum::new();
    for b in &data {
        c.update(core::slice::from_ref(b));
    }
    assert_eq!(c.finish(), whole);
    assert_ne!(Checksum::of(&data[..9999]), whole);
    assert_ne!(Checksum::of(&[0]), Checksum::of(&[0, 0]));
}

#[test]
fn batch_records_round_trip_and_refuse_what_cannot_be_batched() {
    use qcuda_proto::{BatchRecord, BATCH_RECORD_SIZE, MAX_BATCH_DATA};
    let rec = BatchRecord {
        op: Op::LaunchKernel as u32,
        device: 3,
        in_len: 12,
        args: [1, 2, 3, 4, 5, 6, 7, 8],
    };
    let b = rec.encode();
    assert_eq!(BatchRecord::decode(&b), Ok((Op::LaunchKernel, rec)));
    assert_eq!(rec.footprint(), BATCH_RECORD_SIZE + 16);
    assert_eq!(BatchRecord::decode(&b[..79]), Err(WireError::Short));
    for (op, in_len, want) in [
        (Op::Malloc as u32, 0, WireError::UnknownOp),
        (Op::Batch as u32, 0, WireError::UnknownOp),
        (0xdead, 0, WireError::UnknownOp),
        (Op::Memset as u32, 4, WireError::BadShape),
        (
            Op::MemcpyHtoD as u32,
            MAX_BATCH_DATA + 1,
            WireError::BadShape,
        ),
    ] {
        let r = BatchRecord { op, in_len, ..rec };
        assert_eq!(BatchRecord::decode(&r.encode()), Err(want));
    }
    let mut reserved = b;
    reserved[12] = 1;
    assert_eq!(BatchRecord::decode(&reserved), Err(WireError::Reserved));
}

#[test]
fn copy3d_round_trips_and_refuses_unknown_kinds() {
    let c = Copy3D {
        src: Copy3DSide {
            kind: COPY_DEVICE,
            addr: 0x7f00_0000_1000,
            pitch: 512,
            height: 64,
            x: 8,
            y: 1,
            z: 2,
        },
        dst: Copy3DSide {
            kind: COPY_ARRAY,
            addr: 42,
            ..Default::default()
        },
        width: 100,
        height: 10,
        depth: 3,
    };
    let b = c.encode();
    assert_eq!(Copy3D::decode(&b), Ok(c));
    assert_eq!(c.packed_len(), Some(3000));
    assert_eq!(Copy3D::decode(&b[..COPY3D_SIZE - 1]), Err(WireError::Short));
    let mut bad = b;
    bad[0] = 3;
    assert_eq!(Copy3D::decode(&bad), Err(WireError::Reserved));
    assert_eq!(
        Copy3D {
            width: u64::MAX,
            height: 2,
            depth: 1,
            ..c
        }
        .packed_len(),
        None
    );
}

#[test]
fn session_usage_roundtrips_and_rejects_unknown_bits() {
    let u = SessionUsage {
        session: 0x1122_3344_5566_7788,
        pid: 77,
        flags: USAGE_CALLER | USAGE_GPU,
        memory: 1 << 30,
        peak_memory: 3 << 30,
        kernels: 123_456,
        graph_launches: 9,
        age_ms: 1500,
    };
    let b = u.encode();
    assert_eq!(b.len(), SESSION_USAGE_SIZE);
    assert_eq!(SessionUsage::decode(&b), Ok(u));
    assert_eq!(
        SessionUsage::decode(&b[..SESSION_USAGE_SIZE - 1]),
        Err(WireError::Short)
    );
    let mut bad = b;
    bad[12] = 0x80;
    assert_eq!(SessionUsage::decode(&bad), Err(WireError::Reserved));
    let mut bad = b;
    bad[63] = 1;
    assert_eq!(SessionUsage::decode(&bad), Err(WireError::Reserved));
}

//! Session tests of pitched memory, 3D copies, arrays and texture/surface objects.

use qcuda_proto::{
    status, tex, Copy3D, Copy3DSide, Op, COPY_ARRAY, COPY_DEVICE, COPY_WIRE, TEX_DESC_SIZE,
};

use super::{ok, pattern, req, run, GpuState, Rig};

pub(super) fn device(addr: u64, pitch: u64, height: u64) -> Copy3DSide {
    Copy3DSide {
        kind: COPY_DEVICE,
        addr,
        pitch,
        height,
        ..Default::default()
    }
}

pub(super) fn array(handle: u64) -> Copy3DSide {
    Copy3DSide {
        kind: COPY_ARRAY,
        addr: handle,
        ..Default::default()
    }
}

pub(super) fn wire() -> Copy3DSide {
    Copy3DSide {
        kind: COPY_WIRE,
        ..Default::default()
    }
}

pub(super) fn copy(src: Copy3DSide, dst: Copy3DSide, extent: [u64; 3]) -> Copy3D {
    Copy3D {
        src,
        dst,
        width: extent[0],
        height: extent[1],
        depth: extent[2],
    }
}

pub(super) fn put(rig: &mut Rig, s: &mut GpuState, c: Copy3D, data: &[u8]) -> u32 {
    let d = rig.buf(&c.encode());
    let b = rig.buf_runs(data, &[7, 50]);
    s.execute(&req(Op::Memcpy3DHtoD, 0, &[0], vec![d, b], vec![]))
        .status
}

pub(super) fn get(rig: &mut Rig, s: &mut GpuState, c: Copy3D) -> (u32, Vec<u8>) {
    let d = rig.buf(&c.encode());
    let len = usize::try_from(c.packed_len().unwrap()).unwrap();
    let o = rig.out_runs(len, &[5, 64]);
    let r = s.execute(&req(Op::Memcpy3DDtoH, 0, &[0], vec![d], vec![o.clone()]));
    (r.status, o.to_vec().unwrap())
}

#[test]
fn pitched_memory_copies_and_memsets_stay_in_their_rows() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let r = ok(run(&mut s, Op::MallocPitch, &[100, 6]));
    let (p, pitch) = (r[0], r[1]);
    assert_eq!(pitch, 512);
    // Fill everything with 0x11, then write a 100 x 6 block and read it back.
    assert_eq!(
        run(&mut s, Op::Memset3D, &[p, pitch, 0x11, pitch, 6, 1, 6, 0]).status,
        status::SUCCESS
    );
    let data = pattern(600);
    assert_eq!(
        put(
            &mut rig,
            &mut s,
            copy(wire(), device(p, pitch, 6), [100, 6, 1]),
            &data
        ),
        0
    );
    let (st, back) = get(
        &mut rig,
        &mut s,
        copy(device(p, pitch, 6), wire(), [100, 6, 1]),
    );
    assert_eq!(st, status::SUCCESS);
    assert_eq!(back, data);
    // The padding of each row is untouched.
    let raw = rig.fake.peek(p, 512 * 6).unwrap();
    assert!(raw[100..512].iter().all(|b| *b == 0x11));
    // A 3D view: 2 slices of 3 rows, memset rows 1..3 of each slice to 0x22, 40 bytes from x=0.
    assert_eq!(
        run(&mut s, Op::Memset3D, &[p, pitch, 0x22, 40, 2, 2, 3, 0]).status,
        status::SUCCESS
    );
    let raw = rig.fake.peek(p, 512 * 6).unwrap();
    for row in 0..6 {
        let want = if row % 3 < 2 { 0x22 } else { data[row * 100] };
        assert_eq!(raw[row * 512], want, "row {row}");
    }
    // Offsets: copy 10 bytes at (x 5, y 1, z 1) out.
    let mut side = device(p, pitch, 3);
    (side.x, side.y, side.z) = (5, 1, 1);
    let (st, back) = get(&mut rig, &mut s, copy(side, wire(), [10, 1, 1]));
    assert_eq!(st, status::SUCCESS);
    assert_eq!(back, raw[4 * 512 + 5..4 * 512 + 15]);
    // Width beyond the pitch, rows beyond the allocation, wrong buffer length: refused.
    let bad = [
        copy(device(p, pitch, 6), wire(), [513, 1, 1]),
        copy(device(p, pitch, 6), wire(), [100, 7, 1]),
        copy(device(p, pitch, 6), wire(), [100, 6, 2]),
        copy(device(p, u64::MAX, 6), wire(), [1, 2, 1]),
    ];
    for c in bad {
        assert_eq!(get(&mut rig, &mut s, c).0, status::INVALID_VALUE, "{c:?}");
    }
    assert_eq!(
        run(&mut s, Op::Memset3D, &[p, pitch, 0, 600, 1, 1, 1, 0]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::Memset3D, &[p, pitch, 0, 100, 7, 1, 7, 0]).status,
        status::INVALID_VALUE
    );
    let d = rig.buf(&copy(wire(), device(p, pitch, 6), [100, 6, 1]).encode());
    let short = rig.buf(&[0; 599]);
    assert_eq!(
        s.execute(&req(Op::Memcpy3DHtoD, 0, &[0], vec![d, short], vec![]))
            .status,
        status::INVALID_VALUE
    );
    // A device-to-device copy inside the allocation.
    let d = rig.buf(&copy(device(p, pitch, 6), device(p + 200, pitch, 6), [100, 5, 1]).encode());
    assert_eq!(
        s.execute(&req(Op::Memcpy3D, 0, &[0], vec![d], vec![]))
            .status,
        status::SUCCESS
    );
    // Wire sides are refused in Memcpy3D.
    let d = rig.buf(&copy(wire(), device(p, pitch, 6), [1, 1, 1]).encode());
    assert_eq!(
        s.execute(&req(Op::Memcpy3D, 0, &[0], vec![d], vec![]))
            .status,
        status::INVALID_VALUE
    );
}

#[test]
fn arrays_copy_report_and_free() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    // 8 x 4 float (format 0x20), 1 channel, surface load/store.
    let a = ok(run(&mut s, Op::ArrayCreate, &[8, 4, 0, 0x20, 1, 2, 0]))[0];
    let info = ok(run(&mut s, Op::ArrayInfo, &[a]));
    assert_eq!(info[..6], [8, 4, 0, 0x20, 1, 2]);
    let data = pattern(128);
    assert_eq!(
        put(&mut rig, &mut s, copy(wire(), array(a), [32, 4, 1]), &data),
        0
    );
    let (st, back) = get(&mut rig, &mut s, copy(array(a), wire(), [32, 4, 1]));
    assert_eq!((st, back), (status::SUCCESS, data.clone()));
    // Array to pitched memory and back out.
    let r = ok(run(&mut s, Op::MallocPitch, &[32, 4]));
    let d = rig.buf(&copy(array(a), device(r[0], r[1], 4), [32, 4, 1]).encode());
    ok(s.execute(&req(Op::Memcpy3D, 0, &[0], vec![d], vec![])));
    let (_, back) = get(
        &mut rig,
        &mut s,
        copy(device(r[0], r[1], 4), wire(), [32, 4, 1]),
    );
    assert_eq!(back, data);
    // Out of the array: refused before the driver.
    let mut off = array(a);
    off.x = 4;
    assert_eq!(
        get(&mut rig, &mut s, copy(off, wire(), [32, 1, 1])).0,
        status::INVALID_VALUE
    );
    assert_eq!(
        get(&mut rig, &mut s, copy(array(a), wire(), [32, 5, 1])).0,
        status::INVALID_VALUE
    );
    // Bad formats, channels, flags.
    for args in [
        [8, 4, 0, 0x04, 1, 0, 0],
        [8, 4, 0, 0x20, 3, 0, 0],
        [8, 4, 0, 0x20, 1, 0x100, 0],
    ] {
        assert_eq!(
            run(&mut s, Op::ArrayCreate, &args).status,
            status::INVALID_VALUE
        );
    }
    // Surface objects over it; destroy only our own.
    let surf = ok(run(&mut s, Op::SurfObjectCreate, &[a]))[0];
    assert_eq!(
        run(&mut s, Op::TexObjectDestroy, &[surf]).status,
        status::INVALID_VALUE
    );
    assert_eq!(
        run(&mut s, Op::SurfObjectDestroy, &[surf + 1]).status,
        status::INVALID_VALUE
    );
    ok(run(&mut s, Op::SurfObjectDestroy, &[surf]));
    assert_eq!(
        run(&mut s, Op::SurfObjectDestroy, &[surf]).status,
        status::INVALID_VALUE
    );
    // Freed: every use fails.
    ok(run(&mut s, Op::ArrayDestroy, &[a, 0]));
    assert_eq!(
        run(&mut s, Op::ArrayDestroy, &[a, 0]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    assert_eq!(
        run(&mut s, Op::ArrayInfo, &[a]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    assert_eq!(
        get(&mut rig, &mut s, copy(array(a), wire(), [4, 1, 1])).0,
        status::INVALID_RESOURCE_HANDLE
    );
}

pub(super) fn tex_words(words: &[(usize, u64)]) -> Vec<u8> {
    let mut w = [0u64; tex::WORDS];
    for &(i, v) in words {
        w[i] = v;
    }
    let b: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(b.len(), TEX_DESC_SIZE);
    b
}

#[test]
fn mipmaps_and_texture_objects_are_the_sessions_own() {
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let m = ok(run(&mut s, Op::ArrayCreate, &[16, 16, 0, 0x01, 4, 0, 3]))[0];
    let l1 = ok(run(&mut s, Op::MipmappedArrayLevel, &[m, 1]))[0];
    assert_eq!(ok(run(&mut s, Op::MipmappedArrayLevel, &[m, 1]))[0], l1);
    assert_eq!(ok(run(&mut s, Op::ArrayInfo, &[l1]))[..2], [8, 8]);
    assert_eq!(
        run(&mut s, Op::MipmappedArrayLevel, &[m, 9]).status,
        status::INVALID_VALUE
    );
    // A level is not freed alone; it goes with its mipmapped array.
    assert_eq!(
        run(&mut s, Op::ArrayDestroy, &[l1, 0]).status,
        status::INVALID_VALUE
    );
    let t = rig.buf(&tex_words(&[(tex::RES_TYPE, 1), (tex::RES_HANDLE, m)]));
    let tm = ok(s.execute(&req(Op::TexObjectCreate, 0, &[], vec![t], vec![])))[0];
    ok(run(&mut s, Op::TexObjectDestroy, &[tm]));
    ok(run(&mut s, Op::ArrayDestroy, &[m, 1]));
    assert_eq!(
        run(&mut s, Op::ArrayInfo, &[l1]).status,
        status::INVALID_RESOURCE_HANDLE
    );
    // Linear and pitch-2D textures: ranges checked against the allocation.
    let p = ok(run(&mut s, Op::Malloc, &[1024]))[0];
    let linear = |size| {
        tex_words(&[
            (tex::RES_TYPE, 2),
            (tex::RES_HANDLE, p),
            (tex::RES_FORMAT, 0x20),
            (tex::RES_CHANNELS, 1),
            (tex::RES_WIDTH, size),
        ])
    };
    for (size, want) in [(1024, status::SUCCESS), (1025, status::INVALID_VALUE)] {
        let t = rig.buf(&linear(size));
        assert_eq!(
            s.execute(&req(Op::TexObjectCreate, 0, &[], vec![t], vec![]))
                .status,
            want
        );
    }
    let pitch2d = |w, h, pitch| {
        tex_words(&[
            (tex::RES_TYPE, 3),
            (tex::RES_HANDLE, p),
            (tex::RES_FORMAT, 0x20),
            (tex::RES_CHANNELS, 1),
            (tex::RES_WIDTH, w),
            (tex::RES_HEIGHT, h),
            (tex::RES_PITCH, pitch),
        ])
    };
    for (w, h, pitch, want) in [
        (64, 4, 256, status::SUCCESS),
        (64, 5, 256, status::INVALID_VALUE),
        (65, 1, 256, status::INVALID_VALUE),
    ] {
        let t = rig.buf(&pitch2d(w, h, pitch));
        assert_eq!(
            s.execute(&req(Op::TexObjectCreate, 0, &[], vec![t], vec![]))
                .status,
            want,
            "{w}x{h}"
        );
    }
    // Unknown enum values and flags never reach the driver as enums.
    for extra in [
        (tex::FILTER_MODE, 2u64),
        (tex::ADDRESS_MODE, 9),
        (tex::FLAGS, 0x100),
        (tex::VIEW_PRESENT, 2),
    ] {
        let mut w = linear(16);
        w[extra.0 * 8..extra.0 * 8 + 8].copy_from_slice(&extra.1.to_le_bytes());
        let t = rig.buf(&w);
        assert_eq!(
            s.execute(&req(Op::TexObjectCreate, 0, &[], vec![t], vec![]))
                .status,
            status::INVALID_VALUE,
            "{extra:?}"
        );
    }
    // Objects of no session are refused.
    assert_eq!(
        run(&mut s, Op::TexObjectDestroy, &[12345]).status,
        status::INVALID_VALUE
    );
}

#[test]
fn host_mapped_memory_is_a_device_side_of_3d_copies_within_its_mapping() {
    use qcuda_proto::{HostRun, HOST_WINDOW_BASE};
    use vm_memory::{Bytes, GuestAddress};
    assert!(super::super::reserve_window());
    let mut rig = Rig::new(1);
    let mut s = rig.session();
    let guest = HOST_WINDOW_BASE + 0x7300_0000;
    let table: Vec<u8> = HostRun {
        gpa: 0x30_0000,
        len: 0x1000,
    }
    .encode()
    .to_vec();
    let t = rig.buf(&table);
    let r = s.execute(&req(Op::HostMap, 0, &[guest, 0x1000, 0], vec![t], vec![]));
    assert_eq!((r.status, r.rets[0]), (status::SUCCESS, guest));
    let r = ok(run(&mut s, Op::MallocPitch, &[64, 4]));
    let (p, pitch) = (r[0], r[1]);
    let data = pattern(256);
    assert_eq!(
        put(
            &mut rig,
            &mut s,
            copy(wire(), device(p, pitch, 4), [64, 4, 1]),
            &data
        ),
        0
    );
    // Device rows (pitch 512) into the mapped page with a pitch of 100.
    let d = rig.buf(&copy(device(p, pitch, 4), device(guest, 100, 4), [64, 4, 1]).encode());
    ok(s.execute(&req(Op::Memcpy3D, 0, &[0], vec![d], vec![])));
    for y in 0..4usize {
        let mut row = [0u8; 64];
        rig.mem
            .read_slice(&mut row, GuestAddress(0x30_0000 + y as u64 * 100))
            .unwrap();
        assert_eq!(row[..], data[y * 64..(y + 1) * 64]);
    }
    // A pitch that runs the last row past the mapping is refused.
    let d = rig.buf(&copy(device(p, pitch, 4), device(guest, 1350, 4), [64, 4, 1]).encode());
    assert_eq!(
        s.execute(&req(Op::Memcpy3D, 0, &[0], vec![d], vec![]))
            .status,
        status::INVALID_VALUE
    );
    // Memsets reach it too.
    assert_eq!(
        run(&mut s, Op::Memset3D, &[guest, 100, 0x33, 8, 2, 1, 2, 0]).status,
        status::SUCCESS
    );
    let mut b = [0u8; 1];
    rig.mem
        .read_slice(&mut b, GuestAddress(0x30_0000 + 107))
        .unwrap();
    assert_eq!(b[0], 0x33);
}

/// A 3D copy issued on device 0 whose source is device 1's memory (`cuMemcpy3DPeer`, as
/// cufftXt copies between a plan's GPUs): accepted by unified addressing; memory of no
/// session device is still refused.
#[test]
fn a_3d_copy_may_name_another_devices_memory() {
    let mut rig = Rig::new(2);
    let mut s = rig.session();
    let src = ok(s.execute(&req(Op::Malloc, 1, &[64], vec![], vec![])))[0];
    let dst = ok(run(&mut s, Op::Malloc, &[64]))[0];
    let d = rig.buf(&copy(device(src, 16, 4), device(dst, 16, 4), [16, 4, 1]).encode());
    ok(s.execute(&req(Op::Memcpy3D, 0, &[0], vec![d], vec![])));
    let d = rig.buf(&copy(device(0xdead_0000, 16, 4), device(dst, 16, 4), [16, 4, 1]).encode());
    assert_eq!(
        s.execute(&req(Op::Memcpy3D, 0, &[0], vec![d], vec![]))
            .status,
        status::INVALID_VALUE
    );
}

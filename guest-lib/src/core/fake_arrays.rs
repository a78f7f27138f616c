//! The fake device's arrays, pitched memory, 3D copies and texture/surface objects (see
//! fake_device.rs): arrays are byte vectors, copies move real bytes row by row, objects are
//! numbers from a counter.

#![expect(
    clippy::cast_possible_truncation,
    reason = "test double: sizes and offsets of the arrays a test makes (small), and memset bytes taken from the low byte as CUDA does"
)]

use std::collections::HashMap;

use qcuda_proto::{status, Copy3D, Copy3DSide, Op, COPY_ARRAY, COPY_DEVICE, COPY_WIRE};

use crate::core::fake_device::FakeState;

/// One fake array: width, height, depth, format, channels, flags; bytes.
#[derive(Debug, Clone)]
pub struct FakeArray {
    pub desc: [u64; 6],
    pub bytes: Vec<u8>,
    /// The mipmapped array a level belongs to.
    pub owner: Option<u64>,
}

impl FakeArray {
    fn row_bytes(&self) -> u64 {
        let elem = match self.desc[3] {
            0x01 | 0x08 => 1,
            0x02 | 0x09 | 0x10 => 2,
            _ => 4,
        };
        self.desc[0] * elem * self.desc[4]
    }
}

/// The fake's arrays and objects.
#[derive(Debug, Default)]
pub struct FakeArrays {
    pub arrays: HashMap<u64, FakeArray>,
    /// Mipmapped array -> its level arrays.
    pub mipmapped: HashMap<u64, Vec<u64>>,
    /// Object value -> surface?
    pub objects: HashMap<u64, bool>,
    next_object: u64,
}

fn row<'a>(
    s: &'a mut FakeState,
    side: &Copy3DSide,
    wire: &'a mut [u8],
    ext: [u64; 3],
    y: u64,
    z: u64,
) -> Result<&'a mut [u8], u32> {
    let w = ext[0];
    match side.kind {
        COPY_WIRE => {
            let off = ((z * ext[1] + y) * w) as usize;
            Ok(&mut wire[off..off + w as usize])
        }
        COPY_DEVICE => {
            let addr = side.addr
                + (side.z + z) * side.pitch * side.height
                + (side.y + y) * side.pitch
                + side.x;
            if side.x + w > side.pitch {
                return Err(status::INVALID_VALUE);
            }
            s.device_bytes_checked(addr, w)
        }
        COPY_ARRAY => {
            let a = s
                .arrays
                .arrays
                .get_mut(&side.addr)
                .ok_or(status::INVALID_RESOURCE_HANDLE)?;
            let rowb = a.row_bytes();
            let rows = a.desc[1].max(1);
            if side.x + w > rowb || side.y + y >= rows {
                return Err(status::INVALID_VALUE);
            }
            let off = (((side.z + z) * rows + side.y + y) * rowb + side.x) as usize;
            a.bytes
                .get_mut(off..off + w as usize)
                .ok_or(status::INVALID_VALUE)
        }
        _ => Err(status::INVALID_VALUE),
    }
}

/// Runs one of the array ops.
pub fn run(
    s: &mut FakeState,
    op: Op,
    args: &[u64; 8],
    ins: &[&[u8]],
    outs: &mut [&mut [u8]],
    rets: &mut [u64; 7],
) -> Result<(), u32> {
    match op {
        Op::MallocPitch => {
            let pitch = args[0].next_multiple_of(512);
            rets[0] = s.alloc_for_test(pitch * args[1]);
            rets[1] = pitch;
        }
        Op::Memset3D => {
            let [ptr, pitch, value, w, h, d, rows, _] = *args;
            if w > pitch {
                return Err(status::INVALID_VALUE);
            }
            for z in 0..d {
                for y in 0..h {
                    s.device_bytes_checked(ptr + (z * rows + y) * pitch, w)?
                        .fill(value as u8);
                }
            }
        }
        Op::Memcpy3D | Op::Memcpy3DHtoD | Op::Memcpy3DDtoH => {
            let c = Copy3D::decode(ins[0]).map_err(|_| status::INVALID_VALUE)?;
            let ext = [c.width, c.height, c.depth];
            let mut wire = match op {
                Op::Memcpy3DHtoD => ins[1].to_vec(),
                Op::Memcpy3DDtoH => vec![0; outs[0].len()],
                _ => Vec::new(),
            };
            for z in 0..c.depth {
                for y in 0..c.height {
                    let data = row(s, &c.src, &mut wire, ext, y, z)?.to_vec();
                    row(s, &c.dst, &mut wire, ext, y, z)?.copy_from_slice(&data);
                }
            }
            if op == Op::Memcpy3DDtoH {
                outs[0].copy_from_slice(&wire);
            }
        }
        Op::ArrayCreate => {
            let desc = [args[0], args[1], args[2], args[3], args[4], args[5]];
            let a = FakeArray {
                desc,
                bytes: Vec::new(),
                owner: None,
            };
            let size = a.row_bytes() * desc[1].max(1) * desc[2].max(1);
            let a = FakeArray {
                bytes: vec![0; size as usize],
                ..a
            };
            if args[6] == 0 {
                let h = s.handle_for_test();
                s.arrays.arrays.insert(h, a);
                rets[0] = h;
            } else {
                let m = s.handle_for_test();
                let mut levels = Vec::new();
                let mut l = a;
                for _ in 0..args[6] {
                    let h = s.handle_for_test();
                    l.owner = Some(m);
                    s.arrays.arrays.insert(h, l.clone());
                    levels.push(h);
                    l.desc[0] = (l.desc[0] / 2).max(1);
                    l.desc[1] = if l.desc[1] == 0 {
                        0
                    } else {
                        (l.desc[1] / 2).max(1)
                    };
                }
                s.arrays.mipmapped.insert(m, levels);
                rets[0] = m;
            }
        }
        Op::ArrayDestroy => {
            if args[1] == 1 {
                let levels = s
                    .arrays
                    .mipmapped
                    .remove(&args[0])
                    .ok_or(status::INVALID_RESOURCE_HANDLE)?;
                for l in levels {
                    s.arrays.arrays.remove(&l);
                }
            } else {
                match s.arrays.arrays.get(&args[0]) {
                    Some(a) if a.owner.is_none() => {
                        s.arrays.arrays.remove(&args[0]);
                    }
                    Some(_) => return Err(status::INVALID_VALUE),
                    None => return Err(status::INVALID_RESOURCE_HANDLE),
                }
            }
        }
        Op::MipmappedArrayLevel => {
            let levels = s
                .arrays
                .mipmapped
                .get(&args[0])
                .ok_or(status::INVALID_RESOURCE_HANDLE)?;
            rets[0] = *levels.get(args[1] as usize).ok_or(status::INVALID_VALUE)?;
        }
        Op::ArrayInfo => {
            let a = s
                .arrays
                .arrays
                .get(&args[0])
                .ok_or(status::INVALID_RESOURCE_HANDLE)?;
            rets[..6].copy_from_slice(&a.desc);
        }
        Op::TexObjectCreate | Op::SurfObjectCreate => {
            s.arrays.next_object += 1;
            let obj = 0x7e00_0000 + s.arrays.next_object;
            s.arrays.objects.insert(obj, op == Op::SurfObjectCreate);
            rets[0] = obj;
        }
        Op::TexObjectDestroy | Op::SurfObjectDestroy => {
            let surface = op == Op::SurfObjectDestroy;
            if s.arrays.objects.get(&args[0]) != Some(&surface) {
                return Err(status::INVALID_VALUE);
            }
            s.arrays.objects.remove(&args[0]);
        }
        _ => return Err(status::NOT_SUPPORTED),
    }
    Ok(())
}

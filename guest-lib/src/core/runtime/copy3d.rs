//! 2D and 3D copies (`cudaMemcpy2D*`, `cudaMemcpy3D*`, the array copies): one [`Copy3D`] model
//! for all of them, sides of which are host memory, device memory or a CUDA array.
//!
//! Device memory, host-mapped memory (the driver reaches it at its device address, see
//! memory/host.rs) and arrays stay on the host: such a copy is one `Memcpy3D` request, which
//! an `*Async` call sends fire-and-forget. Pageable host memory cannot be reached by the
//! worker, so its bytes travel in the request, packed (rows of `width` bytes, no padding), cut
//! into pieces of at most `COPY_CHUNK` bytes: whole groups of slices, else whole groups of
//! rows, else parts of one row. The guest packs and unpacks them with the host side's pitch;
//! the worker copies between the packed bytes and the device with the device side's pitch.

use crate::core::conv::usize_of;
use qcuda_proto::{Copy3D, Copy3DSide, Op, COPY_ARRAY, COPY_CHUNK, COPY_DEVICE, COPY_WIRE};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::runtime::memory::Ordering,
    core::runtime::Runtime,
    core::transport::Call,
};

const CHUNK: u64 = COPY_CHUNK;

/// Where one side of a copy lives, as the application named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Host memory (pageable or host-mapped): address, row pitch, rows per slice.
    Host { ptr: usize, pitch: u64, height: u64 },
    /// Device memory: address, row pitch, rows per slice.
    Device { ptr: u64, pitch: u64, height: u64 },
    /// A CUDA array (its wire handle).
    Array(u64),
}

/// One side with the position of the first byte: x in bytes, row, slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Side {
    pub end: End,
    pub pos: [u64; 3],
}

impl Side {
    pub fn new(end: End, pos: [u64; 3]) -> Self {
        Self { end, pos }
    }

    /// The byte offset of position `p` from the start of a pitched host or device region.
    fn offset(pitch: u64, height: u64, p: [u64; 3]) -> Option<u64> {
        p[2].checked_mul(pitch.checked_mul(height)?)?
            .checked_add(p[1].checked_mul(pitch)?)?
            .checked_add(p[0])
    }

    /// The bytes from the region's start to one past the last byte a copy of `extent` touches.
    fn span(pitch: u64, height: u64, pos: [u64; 3], extent: [u64; 3]) -> Option<u64> {
        let last = [
            pos[0].checked_add(extent[0] - 1)?,
            pos[1].checked_add(extent[1] - 1)?,
            pos[2].checked_add(extent[2] - 1)?,
        ];
        Self::offset(pitch, height, last)?.checked_add(1)
    }
}

/// What a side becomes on the wire.
fn wire_side(rt: &Runtime, s: &Side, extent: [u64; 3]) -> CudaResult<Copy3DSide> {
    let [x, y, z] = s.pos;
    Ok(match s.end {
        End::Device { ptr, pitch, height } => Copy3DSide {
            kind: COPY_DEVICE,
            addr: ptr,
            pitch,
            height,
            x,
            y,
            z,
        },
        End::Array(h) => Copy3DSide {
            kind: COPY_ARRAY,
            addr: h,
            x,
            y,
            z,
            ..Default::default()
        },
        End::Host { ptr, pitch, height } => {
            // Host-mapped memory: the driver reaches it at its device address.
            let span = Side::span(pitch, height, s.pos, extent).ok_or(CudaError::INVALID_VALUE)?;
            let span = usize::try_from(span).map_err(|_| CudaError::INVALID_VALUE)?;
            match rt.host_memory.device_range(ptr, span) {
                Some(dev) => Copy3DSide {
                    kind: COPY_DEVICE,
                    addr: dev,
                    pitch,
                    height,
                    x,
                    y,
                    z,
                },
                None => Copy3DSide {
                    kind: COPY_WIRE,
                    ..Default::default()
                },
            }
        }
    })
}

/// Copies `extent` (bytes per row, rows, slices) from `src` to `dst` in stream order.
///
/// # Safety
/// Host sides must be valid for every byte the copy touches (pitch, height, position and
/// extent as given), as CUDA requires of the caller.
pub unsafe fn copy(
    rt: &Runtime,
    src: Side,
    dst: Side,
    extent: [u64; 3],
    order: Ordering,
) -> CudaResult<()> {
    rt.session.check_sticky(order.device)?;
    for s in [&src, &dst] {
        match s.end {
            End::Host { ptr: 0, .. } | End::Device { ptr: 0, .. } | End::Array(0) => {
                return Err(CudaError::INVALID_VALUE)
            }
            End::Host { pitch, .. } | End::Device { pitch, .. }
                if s.pos[0].checked_add(extent[0]).is_none_or(|e| e > pitch) =>
            {
                return Err(CudaError::INVALID_PITCH_VALUE)
            }
            _ => {}
        }
    }
    if extent.contains(&0) {
        return Ok(());
    }
    let (s, d) = (wire_side(rt, &src, extent)?, wire_side(rt, &dst, extent)?);
    match (s.kind == COPY_WIRE, d.kind == COPY_WIRE) {
        (false, false) => {
            let c = Copy3D {
                src: s,
                dst: d,
                width: extent[0],
                height: extent[1],
                depth: extent[2],
            };
            let bytes = c.encode();
            let mut call = Call::new(Op::Memcpy3D, order.device)
                .args(&[order.stream])
                .input(&bytes);
            if order.is_async {
                call = call.fire_and_forget();
            }
            rt.session.submit(call)?;
            synchronised(rt, order)
        }
        // SAFETY: forwarded caller contract.
        (true, true) => unsafe { host_to_host(&src, &dst, extent) },
        (src_wire, _) => {
            for_each_piece(extent, |off, ext| {
                let at = |side: &Side, w: &Copy3DSide| {
                    let mut w = *w;
                    // The host checks the sum; a wrapped one is refused there.
                    w.x = side.pos[0].wrapping_add(off[0]);
                    w.y = side.pos[1].wrapping_add(off[1]);
                    w.z = side.pos[2].wrapping_add(off[2]);
                    w
                };
                let c = Copy3D {
                    src: if src_wire { s } else { at(&src, &s) },
                    dst: if src_wire { at(&dst, &d) } else { d },
                    width: ext[0],
                    height: ext[1],
                    depth: ext[2],
                };
                let desc = c.encode();
                let host = if src_wire { &src } else { &dst };
                let len = usize::try_from(ext[0] * ext[1] * ext[2])
                    .map_err(|_| CudaError::INVALID_VALUE)?;
                if src_wire {
                    // SAFETY: forwarded caller contract (the piece lies inside the copy).
                    let packed = unsafe { pack(host, off, ext, len) };
                    let call = Call::new(Op::Memcpy3DHtoD, order.device)
                        .args(&[order.stream])
                        .input(&desc)
                        .input(&packed);
                    rt.session.submit(call)?;
                } else {
                    let mut packed = vec![0u8; len];
                    let call = Call::new(Op::Memcpy3DDtoH, order.device)
                        .args(&[order.stream])
                        .input(&desc)
                        .output(&mut packed);
                    rt.session.submit(call)?;
                    // SAFETY: forwarded caller contract (the piece lies inside the copy).
                    unsafe { unpack(host, off, ext, &packed) };
                }
                Ok(())
            })?;
            synchronised(rt, order)
        }
    }
}

/// After a blocking copy: the host's turn for `__managed__` variables, as after any
/// synchronisation (memory.rs does the same for 1D copies).
fn synchronised(rt: &Runtime, order: Ordering) -> CudaResult<()> {
    if order.is_async {
        return Ok(());
    }
    crate::core::runtime::managed::after_sync(rt)
}

/// Calls `piece(offset, extent)` for consecutive pieces of at most `CHUNK` packed bytes.
fn for_each_piece(
    extent: [u64; 3],
    mut piece: impl FnMut([u64; 3], [u64; 3]) -> CudaResult<()>,
) -> CudaResult<()> {
    let [w, h, d] = extent;
    let slice = w.saturating_mul(h);
    if slice <= CHUNK {
        let per = (CHUNK / slice).max(1);
        let mut z = 0;
        while z < d {
            let n = per.min(d - z);
            piece([0, 0, z], [w, h, n])?;
            z += n;
        }
    } else if w <= CHUNK {
        let per = CHUNK / w;
        for z in 0..d {
            let mut y = 0;
            while y < h {
                let n = per.min(h - y);
                piece([0, y, z], [w, n, 1])?;
                y += n;
            }
        }
    } else {
        for z in 0..d {
            for y in 0..h {
                let mut x = 0;
                while x < w {
                    let n = CHUNK.min(w - x);
                    piece([x, y, z], [n, 1, 1])?;
                    x += n;
                }
            }
        }
    }
    Ok(())
}

/// The host address of row (`y`, `z`) of a host side, from byte `x` (all relative to its
/// position).
fn host_row(side: &Side, x: u64, y: u64, z: u64) -> usize {
    let End::Host { ptr, pitch, height } = side.end else {
        return 0;
    };
    let [px, py, pz] = side.pos;
    let off = Side::offset(pitch, height, [px + x, py + y, pz + z]).unwrap_or(0);
    ptr + usize_of(off)
}

/// Packs the piece at `off` of extent `ext` (`len` bytes) of host side `side`.
///
/// # Safety
/// The host rows must be readable (the caller contract of [`copy`]).
unsafe fn pack(side: &Side, off: [u64; 3], ext: [u64; 3], len: usize) -> Vec<u8> {
    let w = usize_of(ext[0]);
    let mut packed = Vec::with_capacity(len);
    for z in 0..ext[2] {
        for y in 0..ext[1] {
            let src = host_row(side, off[0], off[1] + y, off[2] + z) as *const u8;
            // SAFETY: the row is readable for `w` bytes (caller contract).
            packed.extend_from_slice(unsafe { std::slice::from_raw_parts(src, w) });
        }
    }
    packed
}

/// Unpacks `packed` (the piece at `off` of extent `ext`) into host side `side`.
///
/// # Safety
/// The host rows must be writable (the caller contract of [`copy`]).
unsafe fn unpack(side: &Side, off: [u64; 3], ext: [u64; 3], packed: &[u8]) {
    let w = usize_of(ext[0]);
    let mut i = 0;
    for z in 0..ext[2] {
        for y in 0..ext[1] {
            let dst = host_row(side, off[0], off[1] + y, off[2] + z) as *mut u8;
            // SAFETY: the row is writable for `w` bytes (caller contract); `packed` holds
            // `ext` packed rows.
            unsafe { std::ptr::copy_nonoverlapping(packed[i..i + w].as_ptr(), dst, w) };
            i += w;
        }
    }
}

/// Host to host: row by row in the guest.
///
/// # Safety
/// Both sides valid for the copy (caller contract of [`copy`]).
unsafe fn host_to_host(src: &Side, dst: &Side, extent: [u64; 3]) -> CudaResult<()> {
    let w = usize_of(extent[0]);
    for z in 0..extent[2] {
        for y in 0..extent[1] {
            let s = host_row(src, 0, y, z) as *const u8;
            let d = host_row(dst, 0, y, z) as *mut u8;
            // SAFETY: both rows valid for `w` bytes (caller contract); `copy` allows overlap.
            unsafe { std::ptr::copy(s, d, w) };
        }
    }
    Ok(())
}

use std::{ffi::c_void, ptr};

use qcuda_proto::{Op, COPY_CHUNK};

use super::*;
use crate::{
    generated::{
        self as cu, cudaArray_t, cudaChannelFormatDesc, cudaExtent, cudaMemcpy3DParms,
        cudaMipmappedArray_t, cudaPitchedPtr, cudaPos, cudaResourceDesc, cudaTextureDesc,
    },
    runtime::{arrays::*, memory::*, texture::*},
};

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + i / 97) as u8).collect()
}

#[test]
fn pitched_2d_copies_each_direction_and_memset() {
    let fake = setup();
    let (w, h) = (100usize, 7usize);
    let host = pattern(w * h);
    let mut d: *mut c_void = ptr::null_mut();
    let mut pitch = 0usize;
    // SAFETY: host buffers sized for the copies.
    unsafe {
        ok(cudaMallocPitch(&raw mut d, &raw mut pitch, w, h));
        assert_eq!(pitch, 512);
        ok(cudaMemset2D(d, pitch, 0x5a, pitch, h));
        // Host rows with a pitch of their own (w + 3).
        let hp = w + 3;
        let mut src = vec![0u8; hp * h];
        for y in 0..h {
            src[y * hp..y * hp + w].copy_from_slice(&host[y * w..(y + 1) * w]);
        }
        ok(cudaMemcpy2D(
            d,
            pitch,
            src.as_ptr().cast(),
            hp,
            w,
            h,
            cu::cudaMemcpyHostToDevice,
        ));
        // Device to device into a second pitched allocation, then back to the host.
        let mut d2: *mut c_void = ptr::null_mut();
        let mut pitch2 = 0usize;
        ok(cudaMallocPitch(&raw mut d2, &raw mut pitch2, w, h));
        ok(cudaMemcpy2D(
            d2,
            pitch2,
            d,
            pitch,
            w,
            h,
            cu::cudaMemcpyDefault,
        ));
        let mut back = vec![0u8; w * h];
        ok(cudaMemcpy2D(
            back.as_mut_ptr().cast(),
            w,
            d2,
            pitch2,
            w,
            h,
            cu::cudaMemcpyDeviceToHost,
        ));
        assert!(back == host);
        // The padding of the first allocation kept the memset value.
        let s = fake.state();
        drop(s);
        let mut row = vec![0u8; pitch];
        ok(cudaMemcpy(
            row.as_mut_ptr().cast(),
            d,
            pitch,
            cu::cudaMemcpyDeviceToHost,
        ));
        assert!(row[w..].iter().all(|b| *b == 0x5a));
        // Host to host with pitches.
        let mut hh = vec![0u8; w * h];
        ok(cudaMemcpy2D(
            hh.as_mut_ptr().cast(),
            w,
            src.as_ptr().cast(),
            hp,
            w,
            h,
            cu::cudaMemcpyHostToHost,
        ));
        assert!(hh == host);
        // Width beyond a pitch.
        assert_err(
            cudaMemcpy2D(
                d,
                pitch,
                src.as_ptr().cast(),
                w - 1,
                w,
                h,
                cu::cudaMemcpyHostToDevice,
            ),
            cu::cudaErrorInvalidPitchValue,
        );
        assert_err(
            cudaMemset2D(d, pitch, 0, pitch + 1, 1),
            cu::cudaErrorInvalidValue,
        );
    }
    // SAFETY: device memory only.
    unsafe {
        ok(cudaMemcpy2DAsync(
            d,
            pitch,
            d,
            pitch,
            w,
            1,
            cu::cudaMemcpyDeviceToDevice,
            ptr::null_mut(),
        ));
        ok(cudaMemset2DAsync(d, pitch, 1, w, 2, ptr::null_mut()));
    }
    let s = fake.state();
    assert!(s
        .log
        .iter()
        .any(|l| l.op == Op::Memcpy3D && !l.fire_and_forget));
    assert!(s
        .log
        .iter()
        .any(|l| l.op == Op::Memcpy3D && l.fire_and_forget));
    assert!(s
        .log
        .iter()
        .any(|l| l.op == Op::Memset3D && l.fire_and_forget));
    assert_eq!(s.log.iter().filter(|l| l.op == Op::Memcpy3DHtoD).count(), 1);
}

#[test]
fn large_pitched_copies_are_cut_into_chunks() {
    let fake = setup();
    // 3 MiB rows: two rows per chunk.
    let (w, h) = (3 << 20, 5usize);
    let host = pattern(w * h);
    let mut d: *mut c_void = ptr::null_mut();
    let mut pitch = 0usize;
    let mut back = vec![0u8; w * h];
    // SAFETY: buffers sized for the copies.
    unsafe {
        ok(cudaMallocPitch(&raw mut d, &raw mut pitch, w, h));
        ok(cudaMemcpy2D(
            d,
            pitch,
            host.as_ptr().cast(),
            w,
            w,
            h,
            cu::cudaMemcpyHostToDevice,
        ));
        ok(cudaMemcpy2D(
            back.as_mut_ptr().cast(),
            w,
            d,
            pitch,
            w,
            h,
            cu::cudaMemcpyDeviceToHost,
        ));
    }
    assert!(back == host);
    let s = fake.state();
    let ins: Vec<u64> = s
        .log
        .iter()
        .filter(|l| l.op == Op::Memcpy3DHtoD)
        .map(|l| l.in_len)
        .collect();
    let desc = qcuda_proto::COPY3D_SIZE as u64;
    assert_eq!(
        ins,
        [desc + 2 * w as u64, desc + 2 * w as u64, desc + w as u64]
    );
    assert!(ins.iter().all(|l| *l - desc <= COPY_CHUNK));
}

#[test]
fn arrays_3d_copies_and_info() {
    let _fake = setup();
    let desc = cudaCreateChannelDesc(32, 0, 0, 0, cu::cudaChannelFormatKindFloat);
    let mut a: cudaArray_t = ptr::null_mut();
    let (w, h, d) = (8usize, 4usize, 3usize);
    let host: Vec<f32> = (0..w * h * d).map(|i| i as f32).collect();
    let mut back = vec![0f32; w * h * d];
    // SAFETY: buffers sized for the copies.
    unsafe {
        ok(cudaMalloc3DArray(
            &raw mut a,
            &raw const desc,
            cudaExtent {
                width: w,
                height: h,
                depth: d,
            },
            cu::cudaArraySurfaceLoadStore,
        ));
        let mut got = cudaChannelFormatDesc::default();
        let mut ext = cudaExtent::default();
        let mut flags = 0u32;
        ok(cudaArrayGetInfo(
            &raw mut got,
            &raw mut ext,
            &raw mut flags,
            a,
        ));
        assert_eq!(
            (got.x, got.y, got.f),
            (32, 0, cu::cudaChannelFormatKindFloat)
        );
        assert_eq!(
            (ext.width, ext.height, ext.depth, flags),
            (w, h, d, cu::cudaArraySurfaceLoadStore)
        );
        let mut p = cudaMemcpy3DParms {
            srcPtr: cudaPitchedPtr {
                ptr: host.as_ptr() as *mut c_void,
                pitch: w * 4,
                xsize: w,
                ysize: h,
            },
            dstArray: a,
            extent: cudaExtent {
                width: w,
                height: h,
                depth: d,
            },
            kind: cu::cudaMemcpyHostToDevice,
            ..Default::default()
        };
        ok(cudaMemcpy3D(&raw const p));
        // Into 3D pitched memory, then out to the host.
        let mut pd = cudaPitchedPtr::default();
        ok(cudaMalloc3D(
            &raw mut pd,
            cudaExtent {
                width: w * 4,
                height: h,
                depth: d,
            },
        ));
        p = cudaMemcpy3DParms {
            srcArray: a,
            dstPtr: pd,
            extent: cudaExtent {
                width: w,
                height: h,
                depth: d,
            },
            kind: cu::cudaMemcpyDeviceToDevice,
            ..Default::default()
        };
        ok(cudaMemcpy3D(&raw const p));
        p = cudaMemcpy3DParms {
            srcPtr: pd,
            dstPtr: cudaPitchedPtr {
                ptr: back.as_mut_ptr().cast(),
                pitch: w * 4,
                xsize: w,
                ysize: h,
            },
            extent: cudaExtent {
                width: w * 4,
                height: h,
                depth: d,
            },
            kind: cu::cudaMemcpyDeviceToHost,
            ..Default::default()
        };
        ok(cudaMemcpy3D(&raw const p));
        assert_eq!(back, host);
        // One element at (2, 1, 2) of the array, positions in elements.
        let mut one = 0f32;
        p = cudaMemcpy3DParms {
            srcArray: a,
            srcPos: cudaPos { x: 2, y: 1, z: 2 },
            dstPtr: cudaPitchedPtr {
                ptr: (&raw mut one).cast(),
                pitch: 4,
                xsize: 1,
                ysize: 1,
            },
            extent: cudaExtent {
                width: 1,
                height: 1,
                depth: 1,
            },
            kind: cu::cudaMemcpyDeviceToHost,
            ..Default::default()
        };
        ok(cudaMemcpy3D(&raw const p));
        assert_eq!(one, host[2 * w * h + w + 2]);
        // Neither or both of array and pointer: invalid.
        p.srcPtr = pd;
        assert_err(cudaMemcpy3D(&raw const p), cu::cudaErrorInvalidValue);
        // 2D array copies and the deprecated linear ones.
        let mut a2: cudaArray_t = ptr::null_mut();
        ok(cudaMallocArray(&raw mut a2, &raw const desc, w, h, 0));
        ok(cudaMemcpy2DToArray(
            a2,
            0,
            0,
            host.as_ptr().cast(),
            w * 4,
            w * 4,
            h,
            cu::cudaMemcpyHostToDevice,
        ));
        let mut row = vec![0f32; w * h];
        ok(cudaMemcpyFromArray(
            row.as_mut_ptr().cast(),
            a2,
            8,
            1,
            (w * h - w) * 4 - 8,
            cu::cudaMemcpyDeviceToHost,
        ));
        assert_eq!(row[..w * h - w - 2], host[w + 2..w * h]);
        let mut a3: cudaArray_t = ptr::null_mut();
        ok(cudaMallocArray(&raw mut a3, &raw const desc, w, h, 0));
        ok(cudaMemcpy2DArrayToArray(
            a3,
            0,
            0,
            a2,
            0,
            0,
            w * 4,
            h,
            cu::cudaMemcpyDeviceToDevice,
        ));
        ok(cudaMemcpy2DFromArray(
            row.as_mut_ptr().cast(),
            w * 4,
            a3,
            0,
            0,
            w * 4,
            h,
            cu::cudaMemcpyDeviceToHost,
        ));
        assert_eq!(row, host[..w * h]);
        ok(cudaFreeArray(a3));
        ok(cudaFreeArray(a2));
        ok(cudaFreeArray(a));
        assert_err(cudaFreeArray(a), cu::cudaErrorInvalidResourceHandle);
        ok(cudaFreeArray(ptr::null_mut()));
        // Three channels is no format.
        let three = cudaCreateChannelDesc(8, 8, 8, 0, cu::cudaChannelFormatKindUnsigned);
        assert_err(
            cudaMallocArray(&raw mut a, &raw const three, 4, 4, 0),
            cu::cudaErrorInvalidChannelDescriptor,
        );
    }
}

#[test]
fn mipmaps_and_objects() {
    let _fake = setup();
    let desc = cudaCreateChannelDesc(8, 8, 8, 8, cu::cudaChannelFormatKindUnsigned);
    let mut m: cudaMipmappedArray_t = ptr::null_mut();
    let mut level: cudaArray_t = ptr::null_mut();
    // SAFETY: out pointers to locals.
    unsafe {
        ok(cudaMallocMipmappedArray(
            &raw mut m,
            &raw const desc,
            cudaExtent {
                width: 16,
                height: 16,
                depth: 0,
            },
            3,
            0,
        ));
        ok(cudaGetMipmappedArrayLevel(&raw mut level, m, 2));
        let mut ext = cudaExtent::default();
        ok(cudaArrayGetInfo(
            ptr::null_mut(),
            &raw mut ext,
            ptr::null_mut(),
            level,
        ));
        assert_eq!((ext.width, ext.height), (4, 4));
        let mut res = cudaResourceDesc {
            resType: cu::cudaResourceTypeMipmappedArray,
            ..Default::default()
        };
        res.res.mipmap.mipmap = m;
        let tex = cudaTextureDesc {
            normalizedCoords: 1,
            filterMode: cu::cudaFilterModeLinear,
            readMode: cu::cudaReadModeNormalizedFloat,
            ..Default::default()
        };
        let mut t = 0u64;
        ok(cudaCreateTextureObject(
            &raw mut t,
            &raw const res,
            &raw const tex,
            ptr::null(),
        ));
        assert_ne!(t, 0);
        let mut back = cudaTextureDesc::default();
        ok(cudaGetTextureObjectTextureDesc(&raw mut back, t));
        assert_eq!(
            (back.normalizedCoords, back.filterMode),
            (1, cu::cudaFilterModeLinear)
        );
        let mut r = cudaResourceDesc::default();
        ok(cudaGetTextureObjectResourceDesc(&raw mut r, t));
        assert_eq!(r.resType, cu::cudaResourceTypeMipmappedArray);
        ok(cudaDestroyTextureObject(t));
        assert_err(cudaDestroyTextureObject(t), cu::cudaErrorInvalidValue);
        assert_err(
            cudaGetTextureObjectTextureDesc(&raw mut back, t),
            cu::cudaErrorInvalidValue,
        );
        // Surface objects need an array resource.
        let mut s = 0u64;
        assert_err(
            cudaCreateSurfaceObject(&raw mut s, &raw const res),
            cu::cudaErrorInvalidValue,
        );
        res.resType = cu::cudaResourceTypeArray;
        res.res.array.array = level;
        ok(cudaCreateSurfaceObject(&raw mut s, &raw const res));
        assert_err(cudaDestroyTextureObject(s), cu::cudaErrorInvalidValue);
        ok(cudaDestroySurfaceObject(s));
        ok(cudaFreeMipmappedArray(m));
    }
}

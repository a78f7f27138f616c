use std::ptr;

use qcuda_proto::Op;

use super::*;
use crate::{
    generated as cu,
    runtime::{errors::cudaGetLastError, memory::cudaMalloc, symbols::*},
};

#[test]
fn symbol_copies_resolve_the_global_once() {
    let fake = setup();
    let addr = fake.add_global("scale", 16);
    let fatbin = register_fatbin();
    let scale = register_var(fatbin, c"scale", 16) as *const std::ffi::c_void;
    let src = [1.0f32, 2.0, 3.0, 4.0];
    let mut back = [0f32; 4];
    // SAFETY: 16-byte buffers.
    unsafe {
        ok(cudaMemcpyToSymbol(
            scale,
            src.as_ptr().cast(),
            16,
            0,
            cu::cudaMemcpyHostToDevice,
        ));
        ok(cudaMemcpyFromSymbol(
            back.as_mut_ptr().cast(),
            scale,
            16,
            0,
            cu::cudaMemcpyDeviceToHost,
        ));
        assert_eq!(back, src);
        ok(cudaMemcpyToSymbol_ptds(
            scale,
            src.as_ptr().cast(),
            4,
            12,
            cu::cudaMemcpyDefault,
        ));
        ok(cudaMemcpyFromSymbolAsync(
            back.as_mut_ptr().cast(),
            scale,
            4,
            12,
            cu::cudaMemcpyDefault,
            ptr::null_mut(),
        ));
        assert_eq!(back[0], 1.0);
        assert_err(
            cudaMemcpyToSymbol(
                scale,
                src.as_ptr().cast(),
                8,
                12,
                cu::cudaMemcpyHostToDevice,
            ),
            cu::cudaErrorInvalidValue,
        );
        assert_err(
            cudaMemcpyToSymbol(scale, src.as_ptr().cast(), 4, 0, cu::cudaMemcpyDeviceToHost),
            cu::cudaErrorInvalidMemcpyDirection,
        );
        let unknown = host_address() as *const std::ffi::c_void;
        assert_err(
            cudaMemcpyToSymbol(
                unknown,
                src.as_ptr().cast(),
                4,
                0,
                cu::cudaMemcpyHostToDevice,
            ),
            cu::cudaErrorInvalidSymbol,
        );
        let (mut p, mut size) = (ptr::null_mut(), 0);
        ok(cudaGetSymbolAddress(&raw mut p, scale));
        ok(cudaGetSymbolSize(&raw mut size, scale));
        assert_eq!((p as u64, size), (addr, 16));

        // Device-to-device into a symbol, with "default" resolved from the allocation table.
        let mut d = ptr::null_mut();
        ok(cudaMalloc(&raw mut d, 16));
        ok(cudaMemcpyToSymbolAsync(
            scale,
            d,
            16,
            0,
            cu::cudaMemcpyDefault,
            ptr::null_mut(),
        ));
        ok(cudaMemcpyFromSymbol(
            back.as_mut_ptr().cast(),
            scale,
            16,
            0,
            cu::cudaMemcpyDefault,
        ));
        assert_eq!(back, [0.0; 4]);
    }
    assert_eq!(
        fake.ops()
            .iter()
            .filter(|o| **o == Op::ModuleGetGlobal)
            .count(),
        1
    );
    assert!(fake.ops().contains(&Op::MemcpyDtoD));
    cudaGetLastError();
}

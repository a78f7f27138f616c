//! Packing kernel arguments into the parameter block the host passes to `cuLaunchKernel`.
//!
//! A launch hands over `void **args`: `args[i]` points at the value of parameter `i`, with no
//! size. The sizes and offsets come from the host (`cuFuncGetParamInfo`, via
//! `ModuleGetFunction`), so packing is a copy of `size[i]` bytes from `args[i]` to `offset[i]`.
//! Bytes between parameters (alignment padding) stay zero.

use core::ffi::c_void;

use qcuda_proto::ParamInfo;

use crate::core::cuda_error::{CudaError, CudaResult};

/// Bytes the block for `params` needs.
pub fn block_len(params: &[ParamInfo]) -> CudaResult<usize> {
    params.iter().try_fold(0usize, |len, p| {
        let end = (p.offset as usize)
            .checked_add(p.size as usize)
            .ok_or(CudaError::UNKNOWN)?;
        Ok(len.max(end))
    })
}

/// Blocks up to this size are built on the stack: nearly every kernel's are (NVIDIA's own
/// limit was 4 KiB before CUDA 12.1; most kernels take a few pointers and sizes).
const INLINE: usize = 256;

/// A packed parameter block: on the stack when small, so a launch allocates nothing.
pub struct ParamBlock {
    len: usize,
    inline: [u8; INLINE],
    heap: Vec<u8>,
}

impl ParamBlock {
    fn zeroed(len: usize) -> Self {
        Self {
            len,
            inline: [0; INLINE],
            heap: if len > INLINE {
                vec![0; len]
            } else {
                Vec::new()
            },
        }
    }

    /// A block holding a copy of `bytes` (a block the caller laid out itself).
    pub fn copy_of(bytes: &[u8]) -> Self {
        let mut block = Self::zeroed(bytes.len());
        block.bytes_mut().copy_from_slice(bytes);
        block
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len > INLINE {
            &mut self.heap
        } else {
            &mut self.inline[..self.len]
        }
    }
}

impl std::ops::Deref for ParamBlock {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.len > INLINE {
            &self.heap
        } else {
            &self.inline[..self.len]
        }
    }
}

impl std::fmt::Debug for ParamBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParamBlock")
            .field("len", &self.len)
            .finish()
    }
}

impl PartialEq<[u8]> for ParamBlock {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

/// The parameter block for a launch with `args`.
///
/// # Safety
/// When `params` is not empty, `args` must point at `params.len()` pointers, the `i`-th valid
/// for reads of `params[i].size` bytes (what nvcc's stubs and the CUDA API guarantee for a
/// kernel with this signature).
pub unsafe fn pack(params: &[ParamInfo], args: *const *const c_void) -> CudaResult<ParamBlock> {
    let mut block = ParamBlock::zeroed(block_len(params)?);
    if params.is_empty() {
        return Ok(block);
    }
    if args.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let bytes = block.bytes_mut();
    for (i, p) in params.iter().enumerate() {
        // SAFETY: `args` has `params.len()` entries (caller contract).
        let src = unsafe { *args.add(i) };
        if src.is_null() {
            return Err(CudaError::INVALID_VALUE);
        }
        let at = p.offset as usize;
        let dst = &mut bytes[at..at + p.size as usize];
        // SAFETY: `src` is readable for `p.size` bytes (caller contract) and cannot overlap our
        // freshly made block.
        unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst.as_mut_ptr(), dst.len()) };
    }
    Ok(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(offset: u32, size: u32) -> ParamInfo {
        ParamInfo { offset, size }
    }

    #[test]
    fn packs_each_value_at_its_offset() {
        // kernel(float *a, char c, double d, struct {int x[3];} s): offsets as nvcc lays them out.
        let a: u64 = 0x7f00_dead_beef;
        let c: u8 = b'q';
        let d: f64 = 2.5;
        let s: [i32; 3] = [1, -2, 3];
        let args: [*const c_void; 4] = [
            (&raw const a).cast(),
            (&raw const c).cast(),
            (&raw const d).cast(),
            (&raw const s).cast(),
        ];
        let params = [p(0, 8), p(8, 1), p(16, 8), p(24, 12)];
        // SAFETY: each args[i] points at a value of params[i].size bytes.
        let block = unsafe { pack(&params, args.as_ptr()) }.unwrap();
        assert_eq!(block.len(), 36);
        assert_eq!(&block[0..8], &a.to_ne_bytes());
        assert_eq!(block[8], b'q');
        assert_eq!(&block[9..16], &[0; 7], "padding stays zero");
        assert_eq!(&block[16..24], &d.to_ne_bytes());
        assert_eq!(&block[24..28], &1i32.to_ne_bytes());
        assert_eq!(&block[32..36], &3i32.to_ne_bytes());
    }

    #[test]
    fn no_params_needs_no_args() {
        // SAFETY: nothing is read for an empty parameter list.
        assert!(unsafe { pack(&[], std::ptr::null()) }.is_ok_and(|b| b.is_empty()));
    }

    #[test]
    fn null_args_are_invalid() {
        let params = [p(0, 4)];
        // SAFETY: a null args array is checked before use.
        let r = unsafe { pack(&params, std::ptr::null()) };
        assert_eq!(r.err(), Some(CudaError::INVALID_VALUE));
        let args: [*const c_void; 1] = [std::ptr::null()];
        // SAFETY: args has one entry; a null entry is checked before use.
        let r = unsafe { pack(&params, args.as_ptr()) };
        assert_eq!(r.err(), Some(CudaError::INVALID_VALUE));
    }

    #[test]
    fn a_large_block_is_packed_as_a_small_one() {
        let big = [7u8; 600];
        let args: [*const c_void; 2] = [(&raw const big).cast(), (&raw const big).cast()];
        let params = [p(0, 600), p(1000, 4)];
        // SAFETY: each args[i] points at 600 readable bytes.
        let block = unsafe { pack(&params, args.as_ptr()) }.unwrap();
        assert_eq!(block.len(), 1004);
        assert!(block[..600].iter().all(|&b| b == 7));
        assert!(block[600..1000].iter().all(|&b| b == 0));
        assert_eq!(&block[1000..], &[7; 4]);
    }

    #[test]
    fn block_len_is_the_furthest_end() {
        assert_eq!(block_len(&[p(16, 8), p(0, 4)]), Ok(24));
        assert_eq!(block_len(&[]), Ok(0));
        assert_eq!(
            block_len(&[p(u32::MAX, u32::MAX)]),
            Ok(u32::MAX as usize * 2)
        );
    }
}

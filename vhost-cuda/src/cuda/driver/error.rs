//! A failed driver call: [`CuError`], the `CUresult` other than CUDA_SUCCESS, and [`check`].

use std::fmt;

use cudarc::driver::sys;

use crate::cuda::status as cu_status;

/// A failed driver call: a `CUresult` code other than CUDA_SUCCESS.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct CuError(pub(crate) u32);

impl CuError {
    /// CUDA_ERROR_INVALID_VALUE.
    pub(crate) const INVALID_VALUE: Self = Self(sys::CUresult::CUDA_ERROR_INVALID_VALUE as u32);
    /// CUDA_ERROR_FUNCTION_NOT_LOADED.
    pub(crate) const FUNCTION_NOT_LOADED: Self =
        Self(sys::CUresult::CUDA_ERROR_FUNCTION_NOT_LOADED as u32);
    /// CUDA_ERROR_NO_DEVICE.
    pub(crate) const NO_DEVICE: Self = Self(sys::CUresult::CUDA_ERROR_NO_DEVICE as u32);
    /// CUDA_ERROR_NOT_SUPPORTED.
    pub(crate) const NOT_SUPPORTED: Self = Self(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED as u32);
    /// CUDA_ERROR_UNKNOWN.
    pub(crate) const UNKNOWN: Self = Self(sys::CUresult::CUDA_ERROR_UNKNOWN as u32);
    /// CUDA_ERROR_NOT_READY.
    pub(crate) const NOT_READY: Self = Self(sys::CUresult::CUDA_ERROR_NOT_READY as u32);

    /// The `cudaError_t` the runtime reports for this code.
    pub(crate) fn status(self) -> u32 {
        cu_status::cuda_status(self.0)
    }
}

impl fmt::Debug for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names come from the table, never from the driver: formatting must not call into a
        // library that may be absent.
        write!(f, "{}", cu_status::driver_name(self.0))
    }
}

/// Result of a driver call.
pub(crate) type CuResult<T> = Result<T, CuError>;

pub(crate) fn check(r: sys::CUresult) -> CuResult<()> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(CuError(e as u32)),
    }
}

#[cfg(test)]
mod tests {
    use qcuda_proto::status;

    use super::*;

    #[test]
    fn errors_format_without_the_driver() {
        assert_eq!(format!("{:?}", CuError(700)), "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(CuError(700).status(), status::ILLEGAL_ADDRESS);
        assert_eq!(CuError(600).status(), status::NOT_READY);
    }
}

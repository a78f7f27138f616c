//! `cuGetProcAddress`: from a base name, a CUDA version and a stream flavour to the entry point
//! of this library that NVIDIA's driver would hand out for them.
//!
//! The table of forms (generated/driver_tables.rs) comes from the CUDA 13.0 headers: every
//! `PFN_<name>_v<version>[_ptds|_ptsz]` that cudaTypedefs.h and its interop siblings declare,
//! with the symbol that form is exported as. The answer for (name, version, flags) is the newest
//! form introduced at or before `version`; with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`
//! the newest per-thread form, where the name has one. As NVIDIA's driver does (it cannot see
//! how its caller was compiled), `CU_GET_PROC_ADDRESS_DEFAULT` resolves like
//! `CU_GET_PROC_ADDRESS_LEGACY_STREAM`. A name the table lacks, or one whose first form is newer
//! than `version`, gives a null pointer and says which in the status
//! (`CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`, `..._VERSION_NOT_SUFFICIENT`): `cuGetProcAddress_v2`
//! returns `CUDA_SUCCESS` then, the CUDA 11 form `CUDA_ERROR_NOT_FOUND`, as NVIDIA's driver 580
//! answers (measured: docs/driver-export-tables.md).

use core::ffi::c_void;

use super::{
    status::{DriverError, DrvResult},
    symbol_table,
};
use crate::generated::{driver_api as d, driver_tables::ENTRY_POINTS};

pub use crate::generated::{EntryPoint, Flavour};

/// Why a lookup found nothing (`CUdriverProcAddressQueryResult`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// No entry point of that name.
    Symbol,
    /// The name exists, but only in forms newer than the version asked for.
    Version,
}

impl Missing {
    /// The `CUdriverProcAddressQueryResult` value.
    pub fn status(self) -> d::CUdriverProcAddressQueryResult {
        match self {
            Self::Symbol => d::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            Self::Version => d::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
        }
    }
}

/// The form of `name` that `version` and `per_thread` select.
pub fn resolve(name: &str, version: i32, per_thread: bool) -> Result<&'static EntryPoint, Missing> {
    let start = ENTRY_POINTS.partition_point(|e| e.name < name);
    let forms = ENTRY_POINTS[start..]
        .iter()
        .take_while(|e| e.name == name)
        .filter(|e| e.version <= version);
    let mut plain = None;
    let mut threaded = None;
    for form in forms {
        match form.flavour {
            Flavour::Plain => plain = Some(form),
            Flavour::Ptds | Flavour::Ptsz => threaded = Some(form),
        }
    }
    match (per_thread.then_some(threaded).flatten(), plain) {
        (Some(form), _) | (None, Some(form)) => Ok(form),
        (None, None) if ENTRY_POINTS.get(start).is_some_and(|e| e.name == name) => {
            Err(Missing::Version)
        }
        (None, None) => Err(Missing::Symbol),
    }
}

/// `cuGetProcAddress(_v2)`: the address for (`name`, `version`, `flags`), or why there is none.
/// `driver_version` is what `cuDriverGetVersion` reports: asking for a newer version is
/// `CUDA_ERROR_INVALID_VALUE`, as NVIDIA's driver answers. Flags 0 and 1 resolve alike (the
/// legacy stream), and so do 2 and 3 (the per-thread forms), as measured on driver 580.
pub fn get(
    name: &str,
    version: i32,
    flags: u64,
    driver_version: u32,
) -> DrvResult<Result<*mut c_void, Missing>> {
    let per_thread = match flags {
        0 | 1 => false,
        2 | 3 => true,
        _ => return Err(DriverError::INVALID_VALUE),
    };
    if i64::from(version) > i64::from(driver_version) {
        return Err(DriverError::INVALID_VALUE);
    }
    Ok(resolve(name, version, per_thread).map(|form| {
        // Every symbol of the table is exported by this library (symbol_table.rs is generated
        // from the same list, and its test checks that).
        symbol_table::address(form.symbol).unwrap_or(std::ptr::null_mut())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symbol(name: &str, version: i32, per_thread: bool) -> Result<&'static str, Missing> {
        resolve(name, version, per_thread).map(|e| e.symbol)
    }

    #[test]
    fn versions_and_flavours_pick_the_driver_forms() {
        assert_eq!(symbol("cuMemAlloc", 13000, false), Ok("cuMemAlloc_v2"));
        assert_eq!(symbol("cuMemAlloc", 3010, false), Ok("cuMemAlloc"));
        assert_eq!(symbol("cuMemAlloc", 1000, false), Err(Missing::Version));
        assert_eq!(symbol("cuNoSuchThing", 13000, false), Err(Missing::Symbol));
        assert_eq!(symbol("", 0, false), Err(Missing::Symbol));
        assert_eq!(symbol("cuCtxCreate", 13000, false), Ok("cuCtxCreate_v4"));
        assert_eq!(symbol("cuCtxCreate", 11040, false), Ok("cuCtxCreate_v3"));
        assert_eq!(
            symbol("cuMemcpyHtoD", 13000, true),
            Ok("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(symbol("cuMemcpyHtoD", 13000, false), Ok("cuMemcpyHtoD_v2"));
        assert_eq!(
            symbol("cuLaunchKernel", 13000, true),
            Ok("cuLaunchKernel_ptsz")
        );
        // No per-thread form: the plain one.
        assert_eq!(symbol("cuMemAlloc", 13000, true), Ok("cuMemAlloc_v2"));
        assert_eq!(
            symbol("cuStreamGetCaptureInfo", 12030, true),
            Ok("cuStreamGetCaptureInfo_v3_ptsz")
        );
        assert_eq!(
            symbol("cuGraphInstantiate", 13000, false),
            Ok("cuGraphInstantiateWithFlags")
        );
        assert_eq!(
            symbol("cuGetProcAddress", 13000, false),
            Ok("cuGetProcAddress_v2")
        );
    }

    #[test]
    fn every_form_has_an_exported_function() {
        for e in ENTRY_POINTS {
            assert!(symbol_table::address(e.symbol).is_some(), "{}", e.symbol);
        }
        assert_eq!(
            get("cuInit", 13000, 4, 13000),
            Err(DriverError::INVALID_VALUE)
        );
        assert_eq!(
            get("cuInit", 13010, 0, 13000),
            Err(DriverError::INVALID_VALUE)
        );
        get("cuInit", 13000, 0, 13000).unwrap().unwrap();
        assert_eq!(get("", 0, 0, 13000), Ok(Err(Missing::Symbol)));
        assert_eq!(
            get("cuMemAlloc_v2", 13000, 0, 13000),
            Ok(Err(Missing::Symbol))
        );
    }
}

//! What the fuzz targets (`fuzz/`, feature `fuzzing`) need from inside the executor: a host
//! over the fake driver, and the host-side module image check. Not built into the binary.

use std::sync::Arc;

use super::{
    driver::fake::FakeDriver,
    host::{CudaHost, Tuning},
    module_image::ModuleImage,
};

/// A host over the fake driver with `gpus` GPUs and tiny staging, so that small buffers take
/// every copy path.
pub fn fake_host(gpus: i32) -> Arc<CudaHost> {
    let tuning = Tuning {
        staging_half: 64,
        direct_min: 100,
        max_registered_ram: 0,
        ..Tuning::default()
    };
    let driver = Arc::new(FakeDriver::new(gpus));
    Arc::new(CudaHost::from_driver(driver, 13000, None, tuning).expect("fake driver host"))
}

/// The host's check of a module image (fatbin, cubin or PTX) from the guest: `Ok(kind name)`
/// or the `cudaError_t` it is refused with.
pub fn check_module_image(bytes: &[u8]) -> Result<&'static str, u32> {
    let image = ModuleImage::from_slice(bytes)?;
    assert!(image.as_bytes().len() >= bytes.len());
    Ok(match image.kind() {
        super::module_image::ImageKind::Fatbin => "fatbin",
        super::module_image::ImageKind::Elf => "elf",
        super::module_image::ImageKind::Ptx => "ptx",
    })
}

//! What the host's NVIDIA driver says about itself outside the CUDA API, for the guest's NVML
//! face: the driver's version text (`nvmlSystemGetDriverVersion`, which cuda-pathfinder's
//! version checks read) and each GPU's PCIe link (`nvmlDeviceGetCurrPcieLinkGeneration` and
//! friends, which XLA's cost model reads). Read once when the daemon starts, before any
//! sandbox: the kernel module's `/sys/module/nvidia/version` and the GPU's PCI device in sysfs.

use std::path::Path;

use super::library::{CudaDriver, NoDriver};

/// The host facts the executor reports.
pub(crate) trait HostFactsDriverApi {
    /// The NVIDIA kernel driver's version, e.g. "580.95.05"; None where unknown.
    fn driver_release(&self) -> Option<String>;
    /// The PCIe link of the GPU at PCI `domain:bus:device`: current generation and width,
    /// maximum generation and width (0 where unknown).
    fn pcie_link(&self, domain: i32, bus: i32, device: i32) -> [u8; 4];
}

/// The PCIe generation of a link speed as sysfs writes it ("16.0 GT/s PCIe"), 0 if unknown.
pub(crate) fn pcie_generation(speed: &str) -> u8 {
    let gts = speed.split_whitespace().next().unwrap_or("");
    match gts {
        "2.5" => 1,
        "5.0" | "5" => 2,
        "8.0" | "8" => 3,
        "16.0" | "16" => 4,
        "32.0" | "32" => 5,
        "64.0" | "64" => 6,
        "128.0" | "128" => 7,
        _ => 0,
    }
}

/// The link of PCI device `dir` (a sysfs device folder).
pub(crate) fn link_of(dir: &Path) -> [u8; 4] {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let width = |f: &str| read(f).trim().parse::<u8>().unwrap_or(0);
    [
        pcie_generation(&read("current_link_speed")),
        width("current_link_width"),
        pcie_generation(&read("max_link_speed")),
        width("max_link_width"),
    ]
}

impl HostFactsDriverApi for CudaDriver {
    fn driver_release(&self) -> Option<String> {
        let v = std::fs::read_to_string("/sys/module/nvidia/version").ok()?;
        let v = v.trim();
        (!v.is_empty() && v.len() < 80).then(|| v.to_string())
    }

    fn pcie_link(&self, domain: i32, bus: i32, device: i32) -> [u8; 4] {
        let dir = format!("/sys/bus/pci/devices/{domain:04x}:{bus:02x}:{device:02x}.0");
        link_of(Path::new(&dir))
    }
}

impl HostFactsDriverApi for NoDriver {
    fn driver_release(&self) -> Option<String> {
        None
    }

    fn pcie_link(&self, _: i32, _: i32, _: i32) -> [u8; 4] {
        [0; 4]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_link_speeds_read_as_generations() {
        assert_eq!(pcie_generation("32.0 GT/s PCIe\n"), 5);
        assert_eq!(pcie_generation("2.5 GT/s PCIe"), 1);
        assert_eq!(pcie_generation("Unknown"), 0);
        let d = std::env::temp_dir().join(format!("qcuda-pcie-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("current_link_speed"), "16.0 GT/s PCIe\n").unwrap();
        std::fs::write(d.join("current_link_width"), "8\n").unwrap();
        std::fs::write(d.join("max_link_speed"), "32.0 GT/s PCIe\n").unwrap();
        std::fs::write(d.join("max_link_width"), "16\n").unwrap();
        assert_eq!(link_of(&d), [4, 8, 5, 16]);
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(link_of(Path::new("/nonexistent")), [0; 4]);
    }
}

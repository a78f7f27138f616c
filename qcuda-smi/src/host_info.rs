// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `qcuda-smi` with no command: the handshake, the host's GPUs this VM may use as the daemon
//! reports them, then what this VM uses of them (`vm_usage.rs`).

use qcuda_proto::{GpuInfo, VERSION};

use crate::device::{driver_version_text, Device};

/// Prints the host's GPUs, or that it has none. Having none is an answer, not an error.
pub fn run(dev: &Device) -> Result<(), String> {
    let hello = dev
        .hello()
        .map_err(|e| format!("hello on {}: {e}", dev.path().display()))?;
    if hello.host_version != u64::from(VERSION) {
        return Err(format!(
            "host speaks qcuda wire version {}, this qcuda-smi speaks {VERSION}",
            hello.host_version
        ));
    }
    let info = dev
        .host_info()
        .map_err(|e| format!("host info on {}: {e}", dev.path().display()))?;
    let driver = if info.driver_version == 0 {
        "none".to_string()
    } else {
        driver_version_text(info.driver_version)
    };
    if info.gpus.is_empty() {
        println!("host has no GPU (driver: {driver})");
    } else {
        println!(
            "qcuda: wire version {}, host CUDA driver {driver}, {} GPU(s)",
            hello.host_version,
            info.gpus.len()
        );
        for (i, g) in info.gpus.iter().enumerate() {
            println!("{}", gpu_line(i, g));
        }
    }
    for line in crate::vm_usage::section(dev)? {
        println!("{line}");
    }
    Ok(())
}

/// One line per GPU, like `nvidia-smi -L` with the figures CUDA programs care about.
pub fn gpu_line(index: usize, g: &GpuInfo) -> String {
    format!(
        "GPU {index}: {}  cc {}.{}  {:.1} GiB  {} SMs  PCI {:04x}:{:02x}:{:02x}.0  UUID {}",
        String::from_utf8_lossy(g.name_bytes()),
        g.cc_major,
        g.cc_minor,
        g.total_mem as f64 / (1u64 << 30) as f64,
        g.multiprocessors,
        g.pci_domain,
        g.pci_bus,
        g.pci_device,
        uuid_text(&g.uuid)
    )
}

/// A UUID as nvidia-smi prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let hex =
        |r: std::ops::Range<usize>| u[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_a_gpu_like_nvidia_smi() {
        let mut g = GpuInfo::default();
        g.set_name(b"NVIDIA H200");
        g.total_mem = 150_109_880_320;
        g.cc_major = 9;
        g.cc_minor = 0;
        g.multiprocessors = 132;
        g.pci_bus = 0;
        g.pci_device = 6;
        g.uuid = [
            0x23, 0x25, 0x12, 0x8a, 0x79, 0xe9, 0xf5, 0x09, 0x41, 0x27, 0xae, 0x9b, 0x00, 0xbf,
            0x06, 0x9b,
        ];
        assert_eq!(
            gpu_line(0, &g),
            "GPU 0: NVIDIA H200  cc 9.0  139.8 GiB  132 SMs  PCI 0000:00:06.0  \
             UUID GPU-2325128a-79e9-f509-4127-ae9b00bf069b"
        );
    }
}

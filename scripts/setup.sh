#!/usr/bin/env bash
# setup.sh: the system packages every qcuda build step shares, on Debian 12 (as root).
# The heavy builds (build-qemu.sh, build-guest.sh) install their own extra dependencies.
set -euo pipefail
# systemd: only its tools (systemd-analyze verify, systemd-socket-activate) for the unit tests;
# it need not run. libvirt without libvirt-daemon-system, which would pull systemd in as init
# (scripts/run-libvirt.sh starts libvirtd itself); libxml2-utils for virt-xml-validate; kmod
# (depmod, modinfo) and dkms for the installed guest (scripts/install-guest.sh, check-dkms.sh);
# mmdebstrap for the trixie build root (scripts/trixie-root.sh: stock kernel, guest package,
# disk image); qemu-utils (qemu-img) and zstd for the disk image and the stock kernel's modules;
# valgrind for the driver face's instruction counts (scripts/driver-face-cost.sh).
# scripts/host-commands.txt says which package gives each command the scripts run, and
# scripts/check-host-commands.py (in test.sh) fails on one that no install step provides.
need=(build-essential pkg-config cpio gzip busybox-static python3 python3-venv python3-pip binutils file procps systemd kmod dkms
    mmdebstrap qemu-utils zstd xz-utils git valgrind
    curl ca-certificates
    libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libxml2-utils)
missing=()
for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# Rust: Debian 12's cargo (1.65) is too old for the workspace (it needs >= 1.85), so a machine
# without one gets rustup's stable toolchain with clippy and rustfmt, in ~/.cargo (the scripts
# that call this one put ~/.cargo/bin on their PATH).
if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    echo "setup: installing Rust (rustup, stable, with clippy and rustfmt) into ~/.cargo"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
        sh -s -- -y -q --profile minimal --default-toolchain stable --component clippy,rustfmt
fi
export PATH="$HOME/.cargo/bin:$PATH"
cargo clippy --version >/dev/null && cargo fmt --version >/dev/null
echo "setup: ok ($(cargo --version))"

# shellcheck shell=bash
# lib.sh: the facts the qcuda build scripts share, in one place. `source` it; guest-kmod/Makefile
# reads it too. (run-vm.sh repeats QCUDA_CACHE's default: it also runs from the release bundle,
# where this file is not.)

# Root of the build caches (QEMU, guest kernel, bindgen, the CUDA toolchain venv).
QCUDA_CACHE=${QCUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qcuda}
# bindgen-cli that builds the guest kernel's Rust bindings (cargo install).
QCUDA_BINDGEN_VERSION=0.73.2
QCUDA_BINDGEN=$QCUDA_CACHE/bindgen-$QCUDA_BINDGEN_VERSION/bin/bindgen
# cargo-fuzz that builds and runs the fuzz targets in fuzz/ (cargo install; scripts/fuzz.sh).
QCUDA_CARGO_FUZZ_VERSION=0.13.2
QCUDA_CARGO_FUZZ=$QCUDA_CACHE/cargo-fuzz-$QCUDA_CARGO_FUZZ_VERSION/bin/cargo-fuzz
# rust-vmm's virtiofsd, the vhost-user daemon behind run-vm.sh --share (scripts/build-virtiofsd.sh
# installs it there with libseccomp and libcap-ng linked in statically).
QCUDA_VIRTIOFSD_VERSION=1.14.0
QCUDA_VIRTIOFSD=$QCUDA_CACHE/virtiofsd-$QCUDA_VIRTIOFSD_VERSION/bin/virtiofsd
# The kernel Makefile sets RUSTC = rustc, which would find rustup's toolchain (no rust-src, and a
# different version than the one the kernel was built with): these go on every make line of the
# guest kernel and of qcuda.ko, configuration steps included.
QCUDA_KMAKE_FLAGS=(ARCH=x86_64 RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
    HOSTRUSTC=/usr/bin/rustc "BINDGEN=$QCUDA_BINDGEN")

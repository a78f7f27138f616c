#!/usr/bin/env bash
# build-payload.sh: builds the guest user space that rides on top of the base initramfs and packs
# it as build/guest/payload.cpio.gz (Linux unpacks concatenated cpio archives in order):
#
#   /usr/lib/qcuda/libcudart.so.13   guest-lib, our CUDA runtime (the runtime API face)
#   /usr/lib/qcuda/libcuda.so.1      guest-lib, our CUDA driver (the driver API face and the core)
#   /usr/lib/qcuda/libnvidia-ml.so.1 guest-lib, our NVML (the devices this VM may use)
#   /usr/lib/qcuda/libcuda.so, libnvidia-ml.so   links to those, as NVIDIA's driver has them
#                                    (Numba opens libcuda.so first: docs/guest-install.md)
#   /usr/lib/qcuda/nvidia/13, /12    NVIDIA's libcudart.so.13 and .so.12 (PyPI wheels), for the
#                                    tests that run NVIDIA's runtime over our driver
#   /usr/bin/qcuda-smi               the guest CLI (host GPUs, transport self-test, stress)
#   /opt/qcuda/tests/*               the CUDA test programs of tests/cuda (nvcc --cudart=shared)
#   /opt/qcuda/libraries/*           the programs of tests/cuda/libraries (cuSPARSE, cuBLAS; run
#                                    in a chroot with the host toolkit's libraries)
#   /opt/qcuda/bench/*               the benchmark qcuda_bench and its start-up helpers (bench/;
#                                    not tests, so not in tests/)
#   /opt/qcuda/bin/*                 the guest-side test scripts of tests/guest and the
#                                    module's transport tests (build/guest/tests)
#
# and build/guest/installed.cpio.gz, the same guest side as scripts/install-guest.sh installs it
# into a distribution (ld.so.conf.d and ld.so.cache, /lib/modules/<release>/extra/qcuda.ko with
# modules.dep, modules-load.d, the DKMS source): appended after the payload, the guest loads
# qcuda.ko at boot and runs CUDA programs without LD_LIBRARY_PATH (guest/init).
#
# Everything is built on this machine (Debian 12); the base initramfs carries its glibc.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/build/guest
cd "$ROOT"
say() { printf '[build-payload] %s\n' "$*" >&2; }

lib=$(guest-lib/build.sh | tail -n 1)
cargo build --release -q -p qcuda-smi
tests_dir=$(scripts/build-cuda-tests.sh | tail -n 1)
# Driver-API, --cudart=static and CUDA 12 programs, and NVIDIA's runtimes (build/cuda-runtimes).
scripts/build-cuda-flavours.sh >/dev/null
bench_dir=$(scripts/build-cuda-tests.sh --src=bench --out=build/bench | tail -n 1)
# Programs over NVIDIA's libraries: headers and link-time libraries from the PyPI wheels; the
# libraries' own dependencies come from the toolkit where they run.
libs=$(scripts/cuda-toolchain.sh --libraries)
libs_dir=$(NVCC_FLAGS="-I$libs/include -L$libs/lib -lcusparse -lcublas -l:libcublasLt.so.13 -Xlinker --allow-shlib-undefined" \
    scripts/build-cuda-tests.sh --src=tests/cuda/libraries --out=build/cuda-libraries | tail -n 1)
# Host-only helpers of the GPU harnesses (not in the guest): travel in the bundle.
scripts/build-cuda-tests.sh --src=tests/host --out=build/host-tools >/dev/null

stage=$(mktemp -d) installed=$(mktemp -d)
trap 'rm -rf "$stage" "$installed"' EXIT
install -D -m 755 "$lib" "$stage/usr/lib/qcuda/libcudart.so.13"
install -D -m 755 "$(dirname "$lib")/libcuda.so.1" "$stage/usr/lib/qcuda/libcuda.so.1"
install -D -m 755 "$(dirname "$lib")/libnvidia-ml.so.1" "$stage/usr/lib/qcuda/libnvidia-ml.so.1"
ln -s libcuda.so.1 "$stage/usr/lib/qcuda/libcuda.so"
ln -s libnvidia-ml.so.1 "$stage/usr/lib/qcuda/libnvidia-ml.so"
install -D -m 755 build/cuda-runtimes/13/libcudart.so.13 "$stage/usr/lib/qcuda/nvidia/13/libcudart.so.13"
install -D -m 755 build/cuda-runtimes/12/libcudart.so.12 "$stage/usr/lib/qcuda/nvidia/12/libcudart.so.12"
install -D -m 755 target/release/qcuda-smi "$stage/usr/bin/qcuda-smi"
mkdir -p "$stage/opt/qcuda/tests" "$stage/opt/qcuda/bin"
find "$tests_dir" -maxdepth 1 -type f -perm -u+x -exec cp {} "$stage/opt/qcuda/tests/" \;
mkdir -p "$stage/opt/qcuda/libraries"
find "$libs_dir" -maxdepth 1 -type f -perm -u+x -exec cp {} "$stage/opt/qcuda/libraries/" \;
mkdir -p "$stage/opt/qcuda/bench"
find "$bench_dir" -maxdepth 1 -type f -perm -u+x -exec cp {} "$stage/opt/qcuda/bench/" \;
find tests/guest -maxdepth 1 -type f -exec install -m 755 {} "$stage/opt/qcuda/bin/" \;
# The module's own transport tests, built by build-guest.sh.
if [[ -d build/guest/tests ]]; then
    find build/guest/tests -maxdepth 1 -type f -perm -u+x -exec install -m 755 {} "$stage/opt/qcuda/bin/" \;
fi
mkdir -p "$OUT"
pack() { # stage dir, archive
    (cd "$1" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -6) >"$2.tmp"
    # Linux finds an archive appended after a compressed one only at a 4-byte aligned offset;
    # run-vm.sh appends plain cpio archives, so pad (zeros are skipped between archives).
    truncate -s %512 "$2.tmp"
    mv "$2.tmp" "$2"
    say "$(basename "$2"): $(du -h "$2" | cut -f1), $(find "$1" -type f | wc -l) files"
}
scripts/install-guest.sh --root "$installed" --lib-dir "$(dirname "$lib")" --module "$OUT/qcuda.ko" \
    --smi target/release/qcuda-smi
pack "$installed" "$OUT/installed.cpio.gz"
pack "$stage" "$OUT/payload.cpio.gz"
echo "$OUT/payload.cpio.gz"

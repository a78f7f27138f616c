#!/usr/bin/env bash
# build-payload.sh: builds the guest user space that rides on top of the base initramfs and packs
# it as build/guest/payload.cpio.gz (Linux unpacks concatenated cpio archives in order):
#
#   /usr/lib/qcuda/libcudart.so.13   guest-lib, our CUDA runtime (the runtime API face)
#   /usr/lib/qcuda/libcuda.so.1      guest-lib, our CUDA driver (the driver API face and the core)
#   /usr/lib/qcuda/nvidia/13, /12    NVIDIA's libcudart.so.13 and .so.12 (PyPI wheels), for the
#                                    tests that run NVIDIA's runtime over our driver
#   /usr/bin/qcuda-smi               the guest CLI (host GPUs, transport self-test, stress)
#   /opt/qcuda/tests/*               the CUDA test programs of tests/cuda (nvcc --cudart=shared)
#   /opt/qcuda/bench/*               the benchmark qcuda_bench and its start-up helpers (bench/;
#                                    not tests, so not in tests/)
#   /opt/qcuda/bin/*                 the guest-side test scripts of tests/guest and the
#                                    module's transport tests (build/guest/tests)
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
# Host-only helpers of the GPU harnesses (not in the guest): travel in the bundle.
scripts/build-cuda-tests.sh --src=tests/host --out=build/host-tools >/dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -D -m 755 "$lib" "$stage/usr/lib/qcuda/libcudart.so.13"
install -D -m 755 "$(dirname "$lib")/libcuda.so.1" "$stage/usr/lib/qcuda/libcuda.so.1"
install -D -m 755 build/cuda-runtimes/13/libcudart.so.13 "$stage/usr/lib/qcuda/nvidia/13/libcudart.so.13"
install -D -m 755 build/cuda-runtimes/12/libcudart.so.12 "$stage/usr/lib/qcuda/nvidia/12/libcudart.so.12"
install -D -m 755 target/release/qcuda-smi "$stage/usr/bin/qcuda-smi"
mkdir -p "$stage/opt/qcuda/tests" "$stage/opt/qcuda/bin"
find "$tests_dir" -maxdepth 1 -type f -perm -u+x -exec cp {} "$stage/opt/qcuda/tests/" \;
mkdir -p "$stage/opt/qcuda/bench"
find "$bench_dir" -maxdepth 1 -type f -perm -u+x -exec cp {} "$stage/opt/qcuda/bench/" \;
find tests/guest -maxdepth 1 -type f -exec install -m 755 {} "$stage/opt/qcuda/bin/" \;
# The module's own transport tests, built by build-guest.sh.
if [[ -d build/guest/tests ]]; then
    find build/guest/tests -maxdepth 1 -type f -perm -u+x -exec install -m 755 {} "$stage/opt/qcuda/bin/" \;
fi
mkdir -p "$OUT"
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -6) \
    >"$OUT/payload.cpio.gz.tmp"
# Linux finds an archive appended after a compressed one only at a 4-byte aligned offset;
# run-vm.sh appends plain cpio archives, so pad (zeros are skipped between archives).
truncate -s %512 "$OUT/payload.cpio.gz.tmp"
mv "$OUT/payload.cpio.gz.tmp" "$OUT/payload.cpio.gz"
say "payload: $(du -h "$OUT/payload.cpio.gz" | cut -f1), $(find "$stage" -type f | wc -l) files"
echo "$OUT/payload.cpio.gz"

#!/usr/bin/env bash
# check-libraries-double.sh: NVIDIA's cuBLAS and cuBLASLt (PyPI nvidia-cublas 13.0.*) over our
# libcudart.so.13 and libcuda.so.1, with no GPU and no VM: the test double of /dev/qcuda
# (tests/device-double, LD_PRELOAD) answers for the host, its kernels doing nothing. It checks
# the driver calls those libraries make as they load their kernels and run GEMMs
# (tests/cuda/libraries/cublas_calls.cu): every library call must succeed, and no driver or
# runtime call beneath them may fail (QCUDA_TRACE_ERRORS=1 prints each that does). A refused
# call there is what PyTorch sees on the GPU as CUBLAS_STATUS_INTERNAL_ERROR.
#   scripts/check-libraries-double.sh [--out DIR]        (DIR defaults to build/libraries-double)
# Exit 0 when every call succeeded, 1 otherwise.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=$root/build/libraries-double
while (($#)); do
    case $1 in
    --out) out=$2; shift 2 ;;
    *) echo "check-libraries-double: unknown argument $1" >&2; exit 2 ;;
    esac
done
export PATH="$HOME/.cargo/bin:$PATH"
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
mkdir -p "$out"

cuda=$(bash "$here/cuda-toolchain.sh")
libs=$(bash "$here/cuda-toolchain.sh" --libraries)
"$root/guest-lib/build.sh" >/dev/null
cargo build -q --release --manifest-path "$root/Cargo.toml" -p qcuda-device-double
src=$root/tests/cuda/libraries/cublas_calls.cu prog=$out/cublas_calls
if [[ ! -x $prog || $src -nt $prog ]]; then
    "$cuda/bin/nvcc" -I"$libs/include" -L"$cuda/lib" -L"$libs/lib" --cudart=shared \
        -gencode 'arch=compute_90,code=[sm_90,compute_90]' -o "$prog" "$src" \
        -l:libcublas.so.13 -l:libcublasLt.so.13
fi
rc=0
QCUDA_TRACE_ERRORS=1 LD_PRELOAD=$target/release/libqcuda_device_double.so \
    LD_LIBRARY_PATH=$target/qcuda:$libs/lib timeout 300 "$prog" >"$out/run.log" 2>&1 || rc=$?
cat "$out/run.log"
failed=$(grep -c '^qcuda-trace: .* failed: ' "$out/run.log" || true)
if ((rc != 0)) || ((failed > 0)) || ! grep -qx 'RESULT ok' "$out/run.log"; then
    echo "check-libraries-double: exit $rc, $failed failed call(s) beneath the libraries"
    exit 1
fi
echo "check-libraries-double: $(grep -c '^CALL ' "$out/run.log") library calls succeeded, no driver call failed"

#!/usr/bin/env bash
# Builds every tests/cuda/*.cu into build/cuda-tests/<name> with nvcc from the cached CUDA 13.0
# PyPI toolchain (scripts/cuda-toolchain.sh), the way an application is built for qcuda:
# --cudart=shared, so the program imports libcudart.so.13, with sm_90 code and compute_90 PTX.
# No GPU is needed. Programs whose binary is newer than their source, the shared headers and
# this script are skipped. Each binary is checked to import libcudart.so.13 dynamically.
#
# Usage: scripts/build-cuda-tests.sh [-f|--force] [--src=DIR --out=DIR] [name...]   (prints the
# output directory; --src/--out build another folder's programs the same way, e.g. the benchmark:
# --src=bench --out=build/bench). Environment: NVCC_FLAGS adds flags; QCUDA_CACHE: toolchain cache.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$repo/tests/cuda
out=$repo/build/cuda-tests
force=0
names=()
for a in "$@"; do
    case $a in
    -f | --force) force=1 ;;
    -h | --help)
        sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    --src=*) src=$(realpath -m "${a#--src=}") ;;
    --out=*) out=$(realpath -m "${a#--out=}") ;;
    -*)
        echo "build-cuda-tests: unknown option $a" >&2
        exit 64
        ;;
    *) names+=("${a%.cu}") ;;
    esac
done
if [ ${#names[@]} -eq 0 ]; then
    for f in "$src"/*.cu; do
        n=${f##*/}
        names+=("${n%.cu}")
    done
fi

root=$("$repo/scripts/cuda-toolchain.sh")
nvcc=$root/bin/nvcc
flags=(-L"$root/lib" --cudart=shared -gencode 'arch=compute_90,code=[sm_90,compute_90]' -O2
    -std=c++17 -Xcompiler -Wall -I"$src")
# shellcheck disable=SC2206 # NVCC_FLAGS is a flag list by design
flags+=(${NVCC_FLAGS:-})
mkdir -p "$out"

# A program is stale if anything it is built from is newer than it.
deps=("$src"/*.cuh "${BASH_SOURCE[0]}")
stale() {
    local bin=$1 cu=$2
    [ $force -eq 1 ] && return 0
    [ -e "$bin" ] || return 0
    local d
    for d in "$cu" "${deps[@]}"; do
        [ -e "$d" ] && [ "$d" -nt "$bin" ] && return 0
    done
    return 1
}

# Never leave a half-written binary where the image packer (build-payload.sh) would ship it.
tmp=
trap '[ -z "$tmp" ] || rm -f "$tmp"' EXIT

built=0 skipped=0
for n in "${names[@]}"; do
    cu=$src/$n.cu
    bin=$out/$n
    [ -f "$cu" ] || {
        echo "build-cuda-tests: no such program $cu" >&2
        exit 1
    }
    if ! stale "$bin" "$cu"; then
        skipped=$((skipped + 1))
        continue
    fi
    echo "build-cuda-tests: nvcc $n" >&2
    # Build to a temporary name so an interrupted build never leaves a fresh-looking binary.
    tmp=$bin.tmp
    "$nvcc" "${flags[@]}" -o "$tmp" "$cu" >&2
    if ! readelf -d "$tmp" | grep -q 'NEEDED.*\[libcudart\.so\.13\]'; then
        echo "build-cuda-tests: $n does not import libcudart.so.13:" >&2
        readelf -d "$tmp" | grep NEEDED >&2
        exit 1
    fi
    mv -f "$tmp" "$bin"
    tmp=
    built=$((built + 1))
done
echo "build-cuda-tests: $built built, $skipped up to date (nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))" >&2
echo "$out"

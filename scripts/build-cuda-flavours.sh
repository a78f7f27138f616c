#!/usr/bin/env bash
# Builds the test programs that do not use our libcudart.so.13 the way tests/cuda/*.cu do, into
# build/cuda-tests (next to those, so the guest runs them all), and gathers NVIDIA's runtimes
# they run with into build/cuda-runtimes:
#
#   driver_api      tests/cuda/driver/driver_api.cpp: the driver API only (libcuda.so.1), its
#                   kernels (driver_api.kernels.cu) compiled apart to a fatbin and to PTX and
#                   embedded as arrays
#   checkpoint_toggle
#                   tests/cuda/driver/checkpoint_toggle.cpp: cuCheckpointProcess* on another
#                   process (cuda-checkpoint's toggle, and the documented state machine)
#   vector_add12    tests/cuda/driver/vector_add12.cpp: a CUDA 12 program, built against CUDA
#                   12.9's runtime headers, run with NVIDIA's libcudart.so.12
#   vector_add_static
#                   tests/cuda/vector_add.cu with --cudart=static: NVIDIA's runtime linked in,
#                   which finds our libcuda.so.1 at run time
#   graphs_static, stream_capture_static, conditional_nodes_static, conditional_capture_static,
#   managed_atomics_static
#                   tests/cuda/{graphs,stream_capture,conditional_nodes,conditional_capture,
#                   managed_atomics}.cu with --cudart=static: graphs built by hand, captured,
#                   updated and cloned, conditional nodes built by hand and by capture, and
#                   managed memory with atomics, all through NVIDIA's runtime over our driver face
#   pointer_attributes_static
#                   tests/cuda/pointer_attributes.cu with --cudart=static: NVIDIA's runtime
#                   answering cudaPointerGetAttributes from our cuPointerGetAttributes, as in
#                   CuPy (which links NVIDIA's runtime statically)
#   build/cuda-runtimes/13/libcudart.so.13, build/cuda-runtimes/12/libcudart.so.12
#                   NVIDIA's runtimes (PyPI wheels), for programs run over our libcuda.so.1
#                   with NVIDIA's runtime instead of ours
#
# Link-time libcuda: a stub generated from guest-lib/gen/driver-exports.txt (every symbol of
# NVIDIA's libcuda.so.1), so a program links only against names the real driver has; at run
# time it gets our libcuda.so.1. Usage: scripts/build-cuda-flavours.sh (prints the output dir).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$repo/tests/cuda
out=$repo/build/cuda-tests
runtimes=$repo/build/cuda-runtimes
root=$("$repo/scripts/cuda-toolchain.sh")
root12=$("$repo/scripts/cuda-toolchain.sh" --cuda12)
nvcc=$root/bin/nvcc
gencode=(-gencode 'arch=compute_90,code=[sm_90,compute_90]')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$runtimes/13" "$runtimes/12"

# The link-time stub of libcuda.so.1.
sed 's/.*/void &(void) {}/' "$repo/guest-lib/gen/driver-exports.txt" >"$work/stub.c"
cc -shared -fPIC -o "$work/libcuda.so" -Wl,-soname,libcuda.so.1 "$work/stub.c"

# embed NAME FILE [nul]: a C array NAME with FILE's bytes (and a NUL for text), 8-aligned.
embed() {
    python3 - "$1" "$2" "${3:-}" <<'PY'
import sys
name, path, nul = sys.argv[1], sys.argv[2], sys.argv[3] == "nul"
data = open(path, "rb").read() + (b"\0" if nul else b"")
body = ",".join(str(b) for b in data)
print(f"alignas(8) static const unsigned char {name}[{len(data)}] = {{{body}}};")
PY
}

# kernels NAME: the fatbin and PTX of tests/cuda/driver/NAME.kernels.cu as NAME.kernels.h.
kernels() {
    local n=$1
    "$nvcc" -fatbin "${gencode[@]}" -o "$work/$n.fatbin" "$src/driver/$n.kernels.cu"
    "$nvcc" -ptx -arch=compute_90 -o "$work/$n.ptx" "$src/driver/$n.kernels.cu"
    {
        embed fatbin_image "$work/$n.fatbin"
        embed ptx_image "$work/$n.ptx" nul
    } >"$work/$n.kernels.h"
}

echo "build-cuda-flavours: driver_api" >&2
kernels driver_api
c++ -O2 -std=c++17 -Wall -I"$root/include" -I"$work" -o "$work/driver_api" \
    "$src/driver/driver_api.cpp" -L"$work" -lcuda
readelf -d "$work/driver_api" | grep -q 'NEEDED.*\[libcuda\.so\.1\]'
! readelf -d "$work/driver_api" | grep -q 'NEEDED.*libcudart'

echo "build-cuda-flavours: checkpoint_toggle" >&2
c++ -O2 -std=c++17 -Wall -I"$root/include" -o "$work/checkpoint_toggle" \
    "$src/driver/checkpoint_toggle.cpp" -L"$work" -lcuda

echo "build-cuda-flavours: vector_add12 (CUDA 12 runtime)" >&2
kernels vector_add12
c++ -O2 -std=c++17 -Wall -I"$root12/include" -I"$root12/../cuda_nvcc/include" -I"$work" -o "$work/vector_add12" \
    "$src/driver/vector_add12.cpp" -L"$root12/lib" -l:libcudart.so.12
readelf -d "$work/vector_add12" | grep -q 'NEEDED.*\[libcudart\.so\.12\]'

echo "build-cuda-flavours: vector_add_static (--cudart=static)" >&2
"$nvcc" -L"$root/lib" --cudart=static "${gencode[@]}" -O2 -std=c++17 -I"$src" \
    -o "$work/vector_add_static" "$src/vector_add.cu"
! readelf -d "$work/vector_add_static" | grep -q 'NEEDED.*libcud'

for n in graphs stream_capture conditional_nodes conditional_capture managed_atomics pointer_attributes; do
    echo "build-cuda-flavours: ${n}_static (--cudart=static)" >&2
    "$nvcc" -L"$root/lib" --cudart=static "${gencode[@]}" -O2 -std=c++17 -I"$src" \
        -o "$work/${n}_static" "$src/$n.cu"
    ! readelf -d "$work/${n}_static" | grep -q 'NEEDED.*libcud'
done

for p in driver_api checkpoint_toggle vector_add12 vector_add_static graphs_static stream_capture_static \
    conditional_nodes_static conditional_capture_static managed_atomics_static pointer_attributes_static; do
    mv -f "$work/$p" "$out/$p"
done
install -m 755 "$root/lib/libcudart.so.13" "$runtimes/13/libcudart.so.13"
install -m 755 "$root12/lib/libcudart.so.12" "$runtimes/12/libcudart.so.12"
echo "$out"

#!/usr/bin/env bash
# Installs the CUDA 13.0 compile-time toolchain from PyPI (nvcc, runtime headers, crt, cccl) into
# a cached virtualenv and prints its root. No GPU is needed to compile.
# nvidia-nvvm is pinned too: an unpinned one pulls a newer cicc whose PTX the 13.0 ptxas rejects.
# Usage: root=$(scripts/cuda-toolchain.sh)   ->  $root/bin/nvcc, $root/include, $root/lib
#   compile: $root/bin/nvcc -L$root/lib --cudart=shared -gencode arch=compute_90,code=[sm_90,compute_90]
#        root12=$(scripts/cuda-toolchain.sh --cuda12)  ->  CUDA 12.9's runtime only: $root12/include
#   and $root12/lib/libcudart.so.12 (PyPI nvidia-cuda-runtime-cu12; the crt headers it includes
#   come from nvidia-cuda-nvcc-cu12, in $root12/../cuda_nvcc/include; no CUDA 12 wheel ships nvcc,
#   so CUDA 12 programs are host code built with the system compiler against these headers).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CACHE=$QCUDA_CACHE
if [ "${1:-}" = --cuda12 ]; then
  PKGS=(nvidia-cuda-runtime-cu12==12.9.* nvidia-cuda-nvcc-cu12==12.9.*)
  key=$(printf '%s\n' "${PKGS[@]}" v1 | sha256sum | cut -c1-12)
  venv=$CACHE/cuda12-venv-$key
  if [ ! -f "$venv/.done" ]; then
    mkdir -p "$CACHE"
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check "${PKGS[@]}" >&2
    touch "$venv/.done"
  fi
  root=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cuda_runtime 2>/dev/null | head -n1)
  [ -f "$root/lib/libcudart.so.12" ] || { echo "cuda-toolchain: libcudart.so.12 not found under $venv" >&2; exit 1; }
  echo "$root"
  exit 0
fi
PKGS=(nvidia-cuda-nvcc==13.0.* nvidia-nvvm==13.0.* nvidia-cuda-runtime==13.0.* nvidia-cuda-crt==13.0.* nvidia-cuda-cccl==13.0.*)
key=$(printf '%s\n' "${PKGS[@]}" v2 | sha256sum | cut -c1-12)
venv=$CACHE/cuda-venv-$key
if [ ! -f "$venv/.done" ]; then
  mkdir -p "$CACHE"
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "${PKGS[@]}" >&2
  touch "$venv/.done"
fi
# The wheels install under site-packages/nvidia/cu13 (bin, include, lib).
root=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 2>/dev/null | head -n1)
[ -x "$root/bin/nvcc" ] || { echo "cuda-toolchain: nvcc not found under $venv" >&2; exit 1; }
# The runtime wheel ships only the soname; the link step (-lcudart) wants the plain name.
[ -e "$root/lib/libcudart.so" ] || ln -s libcudart.so.13 "$root/lib/libcudart.so"
echo "$root"

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
#        libs=$(scripts/cuda-toolchain.sh --libraries)  ->  CUDA 13.0's cuSPARSE and cuBLAS
#   (PyPI nvidia-cusparse 12.6.*, nvidia-cublas 13.0.*): $libs/include and $libs/lib, for
#   building tests/cuda/libraries/*; at run time the programs use the host toolkit's copies.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CACHE=$QCUDA_CACHE
# make_venv VENV [pip install arguments]: the venv once, by one builder at a time (two checkouts
# building at once would otherwise remove each other's half-made venv).
make_venv() {
  local venv=$1
  shift
  [ -f "$venv/.done" ] && return 0
  mkdir -p "$CACHE"
  exec 7>"$venv.lock"
  flock 7
  if [ ! -f "$venv/.done" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" >&2
    touch "$venv/.done"
  fi
  flock -u 7
  exec 7>&-
}
if [ "${1:-}" = --cuda12 ]; then
  PKGS=(nvidia-cuda-runtime-cu12==12.9.* nvidia-cuda-nvcc-cu12==12.9.*)
  key=$(printf '%s\n' "${PKGS[@]}" v1 | sha256sum | cut -c1-12)
  venv=$CACHE/cuda12-venv-$key
  make_venv "$venv" "${PKGS[@]}"
  root=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cuda_runtime 2>/dev/null | head -n1)
  [ -f "$root/lib/libcudart.so.12" ] || { echo "cuda-toolchain: libcudart.so.12 not found under $venv" >&2; exit 1; }
  echo "$root"
  exit 0
fi
if [ "${1:-}" = --libraries ]; then
  # CUDA 13.0 ships cuSPARSE 12.6 and cuBLAS 13.0.
  PKGS=(nvidia-cusparse==12.6.* nvidia-cublas==13.0.*)
  key=$(printf '%s\n' "${PKGS[@]}" v1 | sha256sum | cut -c1-12)
  venv=$CACHE/cuda-libs-venv-$key
  make_venv "$venv" --no-deps "${PKGS[@]}"
  root=$(dirname "$(dirname "$(ls "$venv"/lib/python3*/site-packages/nvidia/*/include/cusparse.h | head -n1)")")
  [ -f "$root/include/cublas_v2.h" ] || { echo "cuda-toolchain: cuSPARSE/cuBLAS headers not found under $venv" >&2; exit 1; }
  # The wheels ship the sonames only; linking with -lcusparse -lcublas wants the plain names.
  for l in cusparse cublas; do
    so=$(cd "$root/lib" && ls lib$l.so.* | head -n1)
    [ -e "$root/lib/lib$l.so" ] || ln -s "$so" "$root/lib/lib$l.so"
  done
  echo "$root"
  exit 0
fi
PKGS=(nvidia-cuda-nvcc==13.0.* nvidia-nvvm==13.0.* nvidia-cuda-runtime==13.0.* nvidia-cuda-crt==13.0.* nvidia-cuda-cccl==13.0.*)
key=$(printf '%s\n' "${PKGS[@]}" v2 | sha256sum | cut -c1-12)
venv=$CACHE/cuda-venv-$key
make_venv "$venv" "${PKGS[@]}"
# The wheels install under site-packages/nvidia/cu13 (bin, include, lib).
root=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 2>/dev/null | head -n1)
[ -x "$root/bin/nvcc" ] || { echo "cuda-toolchain: nvcc not found under $venv" >&2; exit 1; }
# The runtime wheel ships only the soname; the link step (-lcudart) wants the plain name.
[ -e "$root/lib/libcudart.so" ] || ln -s libcudart.so.13 "$root/lib/libcudart.so"
echo "$root"

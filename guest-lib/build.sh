#!/usr/bin/env bash
# Builds guest-lib (release) and links target/qcuda/libcudart.so.13 and libcuda.so.1 (link.sh);
# prints libcudart.so.13's path (libcuda.so.1 is next to it).
#
#   guest-lib/build.sh            -> <target>/qcuda/libcudart.so.13, <target>/qcuda/libcuda.so.1
#
# <target> is $CARGO_TARGET_DIR or the workspace's target/. Applications use it with
# LD_LIBRARY_PATH=<target>/qcuda (or by installing it as /usr/lib/qcuda/libcudart.so.13 in the
# guest). See docs/guest-lib.md.
set -euo pipefail

lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$lib")
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac

cargo build --release --manifest-path "$root/Cargo.toml" -p guest-lib >&2
out=$target/qcuda/libcudart.so.13
"$lib/link.sh" "$target/release/libqcudart.a" "$out"
echo "$out"

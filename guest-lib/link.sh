#!/usr/bin/env bash
# Relinks guest-lib's Rust staticlib into the shared library applications load:
#
#   guest-lib/link.sh <libqcudart.a> <output libcudart.so.13>
#
# rustc's own cdylib output cannot be used: rustc applies a version script of its own, so the
# symbols would not carry the version node libcudart.so.13 that nvcc-built applications bind to
# (name@libcudart.so.13). Here libcudart.map gives every exported function that node and makes
# everything else local; --whole-archive keeps the #[no_mangle] exports, --gc-sections drops the
# parts of std nothing reaches, and --no-undefined-version fails the link if a name in the map
# has no definition. Debug info (from the prebuilt std) is stripped; symbols stay. build.sh and
# the integration tests call this.
set -euo pipefail

lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -eq 2 ] || { echo "usage: $0 <libqcudart.a> <output.so>" >&2; exit 2; }
archive=$1
out=$2
mkdir -p "$(dirname "$out")"

${CC:-cc} -shared -o "$out.tmp" \
    -Wl,-soname,libcudart.so.13 \
    -Wl,--version-script="$lib/libcudart.map" \
    -Wl,--no-undefined-version \
    -Wl,--no-undefined \
    -Wl,--gc-sections \
    -Wl,-z,relro,-z,now \
    -Wl,--build-id \
    -Wl,--strip-debug \
    -Wl,--whole-archive "$archive" -Wl,--no-whole-archive \
    -lgcc_s -lpthread -ldl -lm -lrt -lutil -lc
mv "$out.tmp" "$out"

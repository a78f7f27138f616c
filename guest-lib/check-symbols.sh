#!/usr/bin/env bash
# Checks a built libcudart.so.13 against the version map:
#
#   guest-lib/check-symbols.sh [library]     (default: <target>/qcuda/libcudart.so.13, built
#                                             with build.sh if missing)
#
# - libcudart.map lists exactly the names in gen/exports.txt (NVIDIA's export list);
# - every one of them is a defined FUNC, GLOBAL, at the default version libcudart.so.13
#   (`name@@libcudart.so.13`), which is what nvcc-built applications bind to;
# - nothing else is exported: no Rust or libc-internal symbol leaks (the only other defined
#   dynamic symbol is the version node itself);
# - the soname is libcudart.so.13 and the version definition exists.
# Versions can vanish silently when toolchains change, hence this check on the actual binary.
# tests/exported_symbols.rs runs it on the library of each `cargo test`; scripts/test.sh on the
# release build.
set -euo pipefail

lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$lib_dir")
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
so=${1:-$target/qcuda/libcudart.so.13}
[ -e "$so" ] || so=$("$lib_dir/build.sh" | tail -n 1)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
problem() { echo "check-symbols: $*" >&2; fail=1; }

LC_ALL=C sort -u "$lib_dir/gen/exports.txt" >"$tmp/exports"
sed -n '/global:/,/local:/p' "$lib_dir/libcudart.map" | grep -v -e 'global:' -e 'local:' |
    tr -d ' ;' | grep -v '^$' | LC_ALL=C sort -u >"$tmp/map"
cmp -s "$tmp/exports" "$tmp/map" || problem "libcudart.map does not list exactly gen/exports.txt (rerun gen/export-list.sh)"

# Num: Value Size Type Bind Vis Ndx Name -- defined, non-local entries only.
readelf --dyn-syms -W "$so" |
    awk '$1 ~ /^[0-9]+:$/ && $7 != "UND" && $5 != "LOCAL" { print $4, $5, $7, $8 }' >"$tmp/defined"
awk '$4 == "libcudart.so.13" && $3 == "ABS"' "$tmp/defined" | grep -q . ||
    problem "no version node symbol libcudart.so.13"
awk '!($4 == "libcudart.so.13" && $3 == "ABS")' "$tmp/defined" >"$tmp/functions"
awk '$4 !~ /@@libcudart\.so\.13$/ || $1 != "FUNC" || $2 != "GLOBAL" { print "  " $0 }' \
    "$tmp/functions" >"$tmp/wrong"
if [ -s "$tmp/wrong" ]; then
    problem "exported without being a global function at version libcudart.so.13:"
    cat "$tmp/wrong" >&2
fi
awk '{ sub(/@.*/, "", $4); print $4 }' "$tmp/functions" | LC_ALL=C sort -u >"$tmp/exported"
missing=$(LC_ALL=C comm -23 "$tmp/exports" "$tmp/exported")
extra=$(LC_ALL=C comm -13 "$tmp/exports" "$tmp/exported")
[ -z "$missing" ] || problem "not exported: $(echo $missing)"
[ -z "$extra" ] || problem "exported but not in the map (leaked): $(echo $extra)"

readelf -d "$so" | grep -q 'Library soname: \[libcudart\.so\.13\]' || problem "soname is not libcudart.so.13"
readelf -V "$so" | grep -q 'Name: libcudart\.so\.13' || problem "no version definition libcudart.so.13"

n=$(wc -l <"$tmp/exported")
if [ "$fail" -eq 0 ]; then
    echo "check-symbols: $so exports all $n functions at libcudart.so.13, nothing else"
fi
exit "$fail"

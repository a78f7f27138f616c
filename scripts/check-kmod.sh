#!/usr/bin/env bash
# check-kmod.sh: rustfmt and clippy over qcuda.ko's Rust sources, as cargo fmt and clippy are
# over the workspace. Needs the kernel tree of scripts/build-guest.sh (build/guest/ktree) and
# Debian's rust-web-clippy (clippy-driver of the rustc-web that built the kernel), which
# build-guest.sh installs. Any clippy warning fails the check.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
rustfmt --edition 2021 --check guest-kmod/qcuda_main.rs
echo "check-kmod: rustfmt ok"
kdir=$ROOT/build/guest/ktree
[[ -d $kdir ]] || { echo "check-kmod: $kdir missing: run scripts/build-guest.sh" >&2; exit 1; }
[[ -x /usr/bin/clippy-driver ]] || { echo "check-kmod: /usr/bin/clippy-driver missing (rust-web-clippy)" >&2; exit 1; }
make -s -C guest-kmod KDIR="$kdir" clean
# A clean build under clippy-driver (it also produces the module, identical to rustc's).
out=$(make -C guest-kmod KDIR="$kdir" CLIPPY=1 CLIPPY_DRIVER=/usr/bin/clippy-driver 2>&1) || {
    echo "$out"
    exit 1
}
echo "$out" | grep -E '^(warning|error)' -A8 && { echo "check-kmod: clippy findings above" >&2; exit 1; }
echo "check-kmod: clippy ok ($(/usr/bin/clippy-driver --version))"

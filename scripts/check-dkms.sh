#!/usr/bin/env bash
# check-dkms.sh: the DKMS configuration that scripts/install-guest.sh installs
# (/usr/src/qcuda-<version>, from guest-kmod/dkms.conf) builds qcuda.ko with DKMS itself: against
# the guest kernel's build tree (build/guest/ktree, CONFIG_RUST), a module for that release comes
# out; a tree without CONFIG_RUST is refused before any build. Everything lives in a temporary
# DKMS tree; the machine's own (/var/lib/dkms) is not touched. Needs dkms and kmod
# (scripts/setup.sh) and a built guest (scripts/build-guest.sh, scripts/build-payload.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
say() { printf '[check-dkms] %s\n' "$*"; }
die() { say "FAIL: $*"; exit 1; }
command -v dkms >/dev/null || die "dkms is missing (scripts/setup.sh)"
ktree=$(readlink -f build/guest/ktree)
[[ -f $ktree/.config ]] || die "no guest kernel tree (scripts/build-guest.sh)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
scripts/install-guest.sh --root "$work/root"
version=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$work"/root/usr/src/qcuda-*/dkms.conf)
release=$(modinfo -F vermagic build/guest/qcuda.ko | cut -d' ' -f1)
dkms_args=(-m qcuda -v "$version" --dkmstree "$work/dkms" --sourcetree "$work/root/usr/src")
mkdir -p "$work/dkms"
dkms add "${dkms_args[@]}"

say "dkms build against $ktree ($release)"
dkms build "${dkms_args[@]}" -k "$release" --kernelsourcedir "$ktree" ||
    { cat "$work"/dkms/qcuda/"$version"/*/*/log/make.log 2>/dev/null || true; die "dkms build failed"; }
built=$(find "$work/dkms/qcuda/$version/$release" -name qcuda.ko | head -n 1)
[[ -n $built ]] || die "dkms build left no qcuda.ko"
got=$(modinfo -F vermagic "$built" | cut -d' ' -f1)
[[ $got == "$release" ]] || die "the DKMS module is for $got, not $release"
modinfo -F alias "$built" | grep -qx 'virtio:d00000038v\*' || die "the DKMS module lacks the virtio alias"
say "ok: $built (vermagic $(modinfo -F vermagic "$built"))"

# A kernel without Rust support: DKMS must refuse it (BUILD_EXCLUSIVE_CONFIG), not try a build.
norust=$work/norust
mkdir -p "$norust"
grep -v '^CONFIG_RUST=' "$ktree/.config" >"$norust/.config"
echo '# CONFIG_RUST is not set' >>"$norust/.config"
rc=0
dkms build "${dkms_args[@]}" -k 0.0.0-norust --kernelsourcedir "$norust" >"$work/norust.log" 2>&1 || rc=$?
cat "$work/norust.log"
((rc != 0)) || die "dkms built for a kernel without CONFIG_RUST"
grep -qi 'exclusive' "$work/norust.log" || die "the refusal does not name BUILD_EXCLUSIVE"
[[ ! -e $work/dkms/qcuda/$version/0.0.0-norust/x86_64/module/qcuda.ko ]] || die "a module was built anyway"
say "ok: a kernel tree without CONFIG_RUST is refused (exit $rc)"

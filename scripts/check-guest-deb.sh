#!/usr/bin/env bash
# check-guest-deb.sh: the qcuda-guest package's life cycle, with dpkg, in the trixie build root
# (scripts/trixie-root.sh; the stock kernel's headers and source are in it), seen through an
# overlay so that the root itself is not changed; the Rust build files that
# scripts/build-stock-guest.sh prepared into ~/.cache/qcuda/kbuild are copied (hard links) into
# the overlay's /var/cache/qcuda/kbuild first, as a root where DKMS built before has them:
#
#   dpkg -i   the libraries in ld.so.cache (libcuda.so and libnvidia-ml.so too), the udev rule
#             of /dev/nvidiactl, qcuda-smi on the PATH, modules-load.d, DKMS built
#             qcuda.ko for the stock kernel into /lib/modules/<release>/updates/dkms with the
#             distribution's vermagic (that of its overlay.ko), listed in modules.dep
#   dpkg -r   no module, no DKMS entry, no library left in ld.so.cache, no file of the package
#   dpkg -i   again (a reinstall builds again, from the prepared Rust files: seconds)
#   dpkg -P   purge removes the prepared Rust build files
#   kernel    (--with-second-kernel) a fresh install, then the headers of a second kernel flavour
#             (linux-headers-<version>-cloud-amd64): DKMS's kernel hook builds qcuda.ko for it
#             too; dpkg -r removes both (that flavour's Rust build files are prepared once and
#             kept in ~/.cache/qcuda/kbuild, bound at /var/cache/qcuda/kbuild for this part:
#             the first run takes minutes more)
#
# Needs the package (scripts/build-guest-deb.sh) and the root. Every command runs in a mount
# namespace of its own with an overlayfs over the root (its upper layer in a temporary folder,
# removed at the end).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
# shellcheck source=scripts/trixie-root.sh
source scripts/trixie-root.sh
say() { printf '[check-guest-deb] %s\n' "$*"; }
fails=0
check() { # name, command...
    local name=$1
    shift
    if "$@"; then say "ok: $name"; else say "FAIL: $name"; fails=$((fails + 1)); fi
}
second=0
[[ ${1:-} == --with-second-kernel ]] && second=1

deb=$(scripts/build-guest-deb.sh | tail -n 1)
base=$(trixie_root)
rel=$(stock_release "$base")
work=$(mktemp -d "$QCUDA_CACHE/check-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/upper/tmp" "$work/work" "$work/merged" "$work/upper/var/cache/qcuda/kbuild"
cp "$deb" "$work/upper/tmp/"
# The upper layer's /tmp is the root's /tmp: world-writable and sticky, as apt's unprivileged
# signature check needs it.
chmod 1777 "$work/upper/tmp"
kb=$(kbuild_shared)
if [[ -f $kb/$rel/.complete ]]; then
    cp -al "$kb/$rel" "$work/upper/var/cache/qcuda/kbuild/"
else
    say "no prepared Rust build files for $rel in $kb (scripts/build-stock-guest.sh makes them): DKMS prepares them here (minutes)"
fi
debname=/tmp/$(basename "$deb")
# R CMD...: CMD in the root as the package sees it (the overlay, mounted for this command only).
R() {
    unshare --mount --propagation private -- bash -c "
        mount -t overlay overlay -o 'lowerdir=$base,upperdir=$work/upper,workdir=$work/work' '$work/merged' || exit 125
        if [ -n \"\${QCUDA_CHECK_KBUILD:-}\" ]; then
            mkdir -p '$work/merged/var/cache/qcuda/kbuild' && mount --bind \"\$QCUDA_CHECK_KBUILD\" '$work/merged/var/cache/qcuda/kbuild' || exit 125
        fi
        $(declare -f in_root)
        in_root '$work/merged' \"\$@\"" bash "$@"
}
# DKMS compresses the module as the kernel's own are (Debian: xz).
ko=/lib/modules/$rel/updates/dkms/qcuda.ko.xz

installed_ok() {
    R sh -c "ldconfig -p | grep -q 'libcudart.so.13 (libc6,x86-64) => /usr/lib/qcuda/libcudart.so.13'" &&
        R sh -c "ldconfig -p | grep -q 'libcuda.so.1 (libc6,x86-64) => /usr/lib/qcuda/libcuda.so.1'" &&
        R sh -c "ldconfig -p | grep -q 'libnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/qcuda/libnvidia-ml.so.1'" &&
        R sh -c "ldconfig -p | grep -q 'libcuda.so (libc6,x86-64) => /usr/lib/qcuda/libcuda.so$'" &&
        R sh -c "ldconfig -p | grep -q 'libnvidia-ml.so (libc6,x86-64) => /usr/lib/qcuda/libnvidia-ml.so$'"
}
module_ok() { # release
    # DKMS compresses the module as the kernel's own are where that kernel is installed, and
    # leaves it plain where only its headers are.
    local d=/lib/modules/$1/updates/dkms f ours theirs
    f=$d/qcuda.ko.xz
    R test -f "$f" || f=$d/qcuda.ko
    R test -f "$f" || { say "no qcuda.ko(.xz) in $d"; return 1; }
    ours=$(R modinfo -F vermagic "$f")
    if R test -d "/lib/modules/$1/kernel"; then
        theirs=$(R modinfo -k "$1" -F vermagic overlay)
        say "  $f: vermagic '$ours', the distribution's overlay.ko: '$theirs', signer '$(R modinfo -F signer "$f")'"
        [[ $ours == "$theirs" ]] && R grep -q 'updates/dkms/qcuda.ko' "/lib/modules/$1/modules.dep"
    else
        # Only the kernel's headers are installed (no module of the distribution's to compare
        # with, no modules.dep): the vermagic must name that kernel.
        say "  $f: vermagic '$ours' (only the headers of $1 are installed), signer '$(R modinfo -F signer "$f")'"
        [[ ${ours%% *} == "$1" ]]
    fi
}

say "dpkg -i $(basename "$deb") (kernel $rel)"
R dpkg -i "$debname" >"$work/install.log" 2>&1 || { cat "$work/install.log"; say "FAIL: dpkg -i"; exit 1; }
sed 's/^/    | /' "$work/install.log"
check "dpkg -i: DKMS built qcuda.ko for $rel with the distribution's vermagic" module_ok "$rel"
signed() { [[ $(R modinfo -F signer "$ko") == "DKMS module signing key" ]] && R test -f /var/lib/dkms/mok.pub; }
check "dpkg -i: DKMS signed it with its MOK key (/var/lib/dkms/mok.pub, to enroll for Secure Boot)" signed
check "dpkg -i: the three libraries and the unversioned names in ld.so.cache (/usr/lib/qcuda)" installed_ok
check "dpkg -i: qcuda-smi loader: every driver name gives qcuda's" R qcuda-smi loader
check "dpkg -i: the udev rule links /dev/nvidiactl to qcuda" \
    R grep -q 'KERNEL=="qcuda".*SYMLINK+="nvidiactl"' /usr/lib/udev/rules.d/70-qcuda.rules
check "dpkg -i: qcuda-smi in /usr/bin, modules-load.d names qcuda" \
    R sh -c "test -x /usr/bin/qcuda-smi && grep -qx qcuda /etc/modules-load.d/qcuda.conf"
R dkms status qcuda | sed 's/^/    | /'
dkms_installed() { R dkms status qcuda | grep -q "$rel.*installed"; }
check "dpkg -i: dkms status: qcuda installed for $rel" dkms_installed

R dpkg -r qcuda-guest >"$work/remove.log" 2>&1 || { cat "$work/remove.log"; say "FAIL: dpkg -r"; exit 1; }
sed 's/^/    | /' "$work/remove.log"
check "dpkg -r: the module is gone" R test ! -e "$ko"
check "dpkg -r: modules.dep no longer lists it" R sh -c "! grep -q qcuda /lib/modules/$rel/modules.dep"
no_libs() { ! R ldconfig -p | grep -q /usr/lib/qcuda; }
no_dkms() { [[ -z $(R dkms status qcuda) ]]; }
check "dpkg -r: no library left in ld.so.cache" no_libs
check "dpkg -r: no DKMS entry" no_dkms
check "dpkg -r: no file of the package left (source, libraries, qcuda-smi)" \
    R sh -c "! ls -d /usr/src/qcuda-* /usr/lib/qcuda /usr/bin/qcuda-smi 2>/dev/null | grep -q ."
check "dpkg -r: the prepared Rust build files stay (for a reinstall)" R test -f "/var/cache/qcuda/kbuild/$rel/.complete"

t0=$SECONDS
R dpkg -i "$debname" >"$work/reinstall.log" 2>&1 || { cat "$work/reinstall.log"; say "FAIL: dpkg -i again"; exit 1; }
check "dpkg -i again: qcuda.ko rebuilt from the prepared files ($((SECONDS - t0)) s)" module_ok "$rel"


R dpkg -P qcuda-guest >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; say "FAIL: dpkg -P"; exit 1; }
check "dpkg -P: the prepared Rust build files are removed" R test ! -e /var/cache/qcuda/kbuild
if ((second)); then
    # A fresh install, then a second kernel flavour's headers. Its Rust build files are kept
    # across runs in ~/.cache/qcuda/kbuild, mounted as the root's /var/cache/qcuda/kbuild
    # (dkms-build.sh reprepares what no longer matches its inputs).
    other=${rel%-amd64}-cloud-amd64
    export QCUDA_CHECK_KBUILD=$kb
    R dpkg -i "$debname" >"$work/install2.log" 2>&1 || { cat "$work/install2.log"; say "FAIL: dpkg -i"; exit 1; }
    say "a second kernel: linux-headers-$other (DKMS's header hook builds for it; the first time it prepares that flavour's Rust build files: minutes)"
    # A root fresh from mmdebstrap has no package lists (it cleans them): apt-get update first.
    R sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q linux-headers-$other" >"$work/kernel.log" 2>&1 ||
        { tail -n 40 "$work/kernel.log"; say "FAIL: apt-get install linux-headers-$other"; exit 1; }
    grep -iE 'dkms|qcuda|Signing|Installing' "$work/kernel.log" | sed 's/^/    | /'
    check "a new kernel's headers: DKMS built qcuda.ko for $other (its headers' hook, AUTOINSTALL)" module_ok "$other"
    R dpkg -r qcuda-guest >/dev/null 2>&1
    check "dpkg -r: the module is gone from both kernels" R sh -c "! ls /lib/modules/*/updates/dkms/qcuda.ko* 2>/dev/null | grep -q ."
    unset QCUDA_CHECK_KBUILD
fi

((fails == 0)) && say "all passed" || say "$fails failed"
exit $((fails > 0))

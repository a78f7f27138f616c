#!/usr/bin/env bash
# build-stock-guest.sh: qcuda.ko for Debian's own kernel, and what it takes to boot that kernel as
# the qcuda guest, into build/stock/:
#
#   vmlinuz             the stock kernel, linux-image-<release> from trixie-backports
#   modules.cpio.gz     appended after our initramfs (run-vm.sh --kernel stock): the stock
#                       modules our guest needs (virtio-pci, virtiofs, overlayfs and what they
#                       depend on; the stock kernel has them as modules, decompressed here for
#                       busybox's modprobe), their modules.dep, modules-load.d naming them, and
#                       /lib/modules/qcuda.ko (below) in place of our own kernel's
#   qcuda.ko            guest-kmod/ built against the stock kernel's headers, through the same
#                       step DKMS runs (guest-kmod/dkms-build.sh): its vermagic is checked to
#                       equal that of the distribution's own modules (overlay.ko's)
#   versions.txt        the kernel release and every package version that went in
#
# Everything comes from Debian's packages, in a Debian 13 (trixie) build root made by
# mmdebstrap (the kernel's build tools need trixie's glibc, this machine may be older): the
# kernel image, headers and linux-source of the same version from trixie-backports, and
# trixie's own rustc, rust-src, bindgen and gcc-14, the tools that built that kernel. The
# archive keeps only the newest patch level, so the root takes what is current when it is made,
# and versions.txt says what that was. The root is cached as ~/.cache/qcuda/trixie-root-<hash>,
# keyed by the package list and the code that makes it (delete it to take newer packages); the
# Rust build files that Debian's headers lack are prepared once per kernel release, as DKMS does
# in a guest (docs/guest-install.md says why), into ~/.cache/qcuda/kbuild (bound at the root's
# /var/cache/qcuda/kbuild), which scripts/check-guest-deb.sh and scripts/build-disk-image.sh
# reuse; the .deb files are kept in ~/.cache/qcuda/trixie-debs for the next root and for
# scripts/build-disk-image.sh.
#
#   scripts/build-stock-guest.sh            everything above
#   scripts/build-stock-guest.sh --root     only print the build root's path (made if missing)
#
# Environment: QCUDA_CACHE (default ~/.cache/qcuda), QCUDA_DEBIAN_MIRROR (default
# http://deb.debian.org/debian). As root. See docs/guest-install.md, docs/guest.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
# shellcheck source=scripts/trixie-root.sh
source "$ROOT/scripts/trixie-root.sh"
OUT=$ROOT/build/stock

log() { printf '[build-stock-guest] %s\n' "$*" >&2; }
die() { printf '[build-stock-guest] error: %s\n' "$*" >&2; exit 1; }

# The stock modules the qcuda guest loads at boot: the PCI transport of virtio (the qcuda device
# and virtiofs are both virtio-pci devices), virtiofs for run-vm.sh --share, overlayfs for
# --chroot. modprobe's dependency closure of these goes in.
STOCK_MODULES=(virtio_pci virtiofs overlay)
# A module of the distribution's own package to compare qcuda.ko's vermagic with.
VERMAGIC_REFERENCE=overlay

# Modules, their closure from modules.dep, decompressed: busybox's modprobe reads plain .ko.
stock_modules_cpio() { # build root, release, stage dir
    local r=$1 rel=$2 stage=$3 m dep f
    local mdir=/lib/modules/$rel
    declare -A want=()
    local queue=() load=()
    for m in "${STOCK_MODULES[@]}"; do
        f=$(in_root "$r" modinfo -k "$rel" -F filename "$m") || die "no module $m in $rel"
        # Debian's 7.3 has virtio-pci and virtiofs built in; earlier series had them as modules.
        [[ $f == "(builtin)" ]] || { queue+=("${f#"$mdir"/}") load+=("$m"); }
    done
    while ((${#queue[@]})); do
        m=${queue[0]} queue=("${queue[@]:1}")
        [[ -n ${want[$m]:-} ]] && continue
        want[$m]=1
        dep=$(grep "^$m:" "$r$mdir/modules.dep" | cut -d: -f2-)
        for f in $dep; do queue+=("$f"); done
    done
    rm -rf "$stage"
    mkdir -p "$stage$mdir" "$stage/etc/modules-load.d" "$stage/lib/modules"
    for m in "${!want[@]}"; do
        install -D -m 644 "$r$mdir/$m" "$stage$mdir/$m"
        case $m in
        *.xz) xz -d "$stage$mdir/$m" ;;
        *.zst) zstd -q -d --rm "$stage$mdir/$m" ;;
        *.gz) gzip -d "$stage$mdir/$m" ;;
        esac
    done
    cp "$r$mdir/modules.order" "$r$mdir/modules.builtin" "$r$mdir/modules.builtin.modinfo" "$stage$mdir/"
    sed -i -E 's/\.ko\.(xz|zst|gz)$/.ko/' "$stage$mdir/modules.order"
    depmod -b "$stage" "$rel"
    {
        echo "# qcuda's stock-kernel guest: the virtio transport and file systems it needs"
        printf '%s\n' "${load[@]}"
    } >"$stage/etc/modules-load.d/qcuda-stock.conf"
    install -m 644 "$OUT/qcuda.ko" "$stage/lib/modules/qcuda.ko"
    (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -6 -n) >"$OUT/modules.cpio.gz.tmp"
    # run-vm.sh appends plain cpio archives after this one: pad (see build-guest.sh).
    truncate -s %512 "$OUT/modules.cpio.gz.tmp"
    mv "$OUT/modules.cpio.gz.tmp" "$OUT/modules.cpio.gz"
}

main() {
    local r rel t0=$SECONDS
    (($(id -u) == 0)) || die "run as root (mmdebstrap, chroot)"
    r=$(trixie_root)
    if [[ ${1:-} == --root ]]; then
        echo "$r"
        return
    fi
    rel=$(stock_release "$r")
    log "stock kernel $rel"
    mkdir -p "$OUT"
    # The module, exactly as DKMS builds it in a guest (guest-kmod/dkms-build.sh): the Rust
    # build files are prepared once per release inside the root, then kbuild runs.
    local src=/tmp/qcuda-src
    rm -rf "$r$src"
    mkdir -p "$r$src/guest-kmod" "$r$src/qcuda-proto/src"
    cp -a "$ROOT"/guest-kmod/. "$r$src/guest-kmod/"
    cp "$ROOT/qcuda-proto/src/wire.rs" "$r$src/qcuda-proto/src/"
    local tm=$SECONDS kb
    kb=$(kbuild_shared)
    QCUDA_IN_ROOT_KBUILD=$kb in_root "$r" sh -c "cd $src && guest-kmod/dkms-build.sh $rel /lib/modules/$rel/build" >&2 ||
        die "qcuda.ko did not build against $rel"
    log "qcuda.ko built in $((SECONDS - tm)) s (Rust build files prepared or cached in $kb/$rel)"
    cp "$r$src/guest-kmod/qcuda.ko" "$OUT/qcuda.ko"
    rm -rf "$r$src"

    # Its vermagic must be the distribution's, as its own modules have it.
    local ours theirs
    ours=$(modinfo -F vermagic "$OUT/qcuda.ko")
    theirs=$(in_root "$r" modinfo -k "$rel" -F vermagic "$VERMAGIC_REFERENCE")
    [[ $ours == "$theirs" ]] || die "qcuda.ko's vermagic '$ours' is not the distribution's '$theirs'"
    log "vermagic: $ours (equal to $VERMAGIC_REFERENCE's, a module of the distribution's)"

    cp "$r/boot/vmlinuz-$rel" "$OUT/vmlinuz"
    stock_modules_cpio "$r" "$rel" "$OUT/modules-stage"
    rm -rf "$OUT/modules-stage"
    {
        echo "kernelrelease: $rel"
        echo "vermagic: $ours"
        trixie_root_versions "$r" "$rel"
    } >"$OUT/versions.txt"
    log "done in $((SECONDS - t0)) s:"
    sed 's/^/[build-stock-guest]   /' "$OUT/versions.txt" >&2
    (cd "$OUT" && ls -l vmlinuz modules.cpio.gz qcuda.ko) | sed 's/^/[build-stock-guest]   /' >&2
}

main "$@"; exit

#!/usr/bin/env bash
# build-virtiofsd.sh: installs rust-vmm's virtiofsd (crates.io, `cargo install --locked`), the
# vhost-user file system daemon that scripts/run-vm.sh starts for each `--share`, and copies it to
# build/virtiofsd/bin/virtiofsd (bundle.sh packs it from there).
#
# The build is cached in ~/.cache/qcuda/virtiofsd-<version>/ (lib.sh names the version); a cache
# hit needs no network, no compiler and no root. libseccomp and libcap-ng are linked in
# statically (their crates' LIB*_LINK_TYPE=static), so the binary needs only glibc and libgcc_s
# and runs on a GPU host that lacks both libraries. On a fresh Debian 12 machine, as root, it
# installs the two -dev packages that provide the static archives.
#
# Environment: JOBS (default: nproc, at most 2), QCUDA_CACHE (default ~/.cache/qcuda).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
VERSION=$QCUDA_VIRTIOFSD_VERSION
PREFIX=$QCUDA_CACHE/virtiofsd-$VERSION
BIN=$QCUDA_VIRTIOFSD
OUT=$ROOT/build/virtiofsd/bin
JOBS=${JOBS:-$(($(nproc) < 2 ? $(nproc) : 2))}
LIBDIR=/usr/lib/x86_64-linux-gnu
DEB_PACKAGES=(libseccomp-dev libcap-ng-dev)

log() { printf '[build-virtiofsd] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The cached binary counts only if it is this version and links neither library dynamically.
usable() {
    [[ -x $BIN ]] && "$BIN" --version 2>/dev/null | grep -qxF "virtiofsd $VERSION" &&
        ! readelf -d "$BIN" | grep -Eq 'NEEDED.*(libseccomp|libcap-ng)'
}

install_deps() {
    local p missing=()
    for p in "${DEB_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    [[ $(id -u) -eq 0 ]] || die "missing packages (run as root to install): ${missing[*]}"
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
}

main() {
    mkdir -p "$QCUDA_CACHE"
    exec 9>"$QCUDA_CACHE/virtiofsd-$VERSION.lock"
    flock 9
    if usable; then
        log "cached: $BIN"
    else
        command -v cargo >/dev/null || die "cargo is required (scripts/setup.sh)"
        install_deps
        for f in libseccomp.a libcap-ng.a; do [[ -f $LIBDIR/$f ]] || die "$LIBDIR/$f missing"; done
        log "cargo install virtiofsd $VERSION into $PREFIX (-j$JOBS, ~2 min on 2 cores)"
        local t0=$SECONDS
        rm -rf "$PREFIX"
        LIBSECCOMP_LINK_TYPE=static LIBSECCOMP_LIB_PATH=$LIBDIR \
            LIBCAPNG_LINK_TYPE=static LIBCAPNG_LIB_PATH=$LIBDIR \
            cargo install --locked --quiet -j "$JOBS" virtiofsd --version "$VERSION" --root "$PREFIX"
        usable || die "$BIN is not a usable virtiofsd $VERSION with static libseccomp and libcap-ng"
        log "built in $((SECONDS - t0)) s"
    fi
    flock -u 9
    mkdir -p "$OUT"
    cmp -s "$BIN" "$OUT/virtiofsd" || install -m 755 "$BIN" "$OUT/virtiofsd"
    log "$("$OUT/virtiofsd" --version), needs: $(readelf -d "$OUT/virtiofsd" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd' ')"
    echo "virtiofsd: $OUT/virtiofsd"
}

main "$@"

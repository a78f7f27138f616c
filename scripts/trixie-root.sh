# shellcheck shell=bash
# trixie-root.sh: the Debian 13 (trixie) build root that scripts/build-stock-guest.sh and
# scripts/build-disk-image.sh share. `source` it after scripts/lib.sh; it defines:
#
#   trixie_root                 prints the root's path; makes it with mmdebstrap if missing
#                               (~/.cache/qcuda/trixie-root-<hash>, keyed by the package list
#                               and this file's code)
#   in_root ROOT CMD...         runs CMD chrooted into ROOT with /proc, /sys, /dev mounted (in a
#                               mount namespace of its own, so nothing stays mounted)
#   stock_release ROOT          the release of the stock kernel installed there
#   trixie_root_versions ROOT REL   the versions that went in, one "what: version" a line
#   trixie_mmdebstrap TARGET OPTIONS...   mmdebstrap with the trixie suites and the shared .deb cache
#   kbuild_shared               prints the shared folder of prepared Rust build files (below)
#
# The Rust build files that guest-kmod/dkms-build.sh prepares for a kernel release (minutes of
# make prepare) are kept once for every root and image: ~/.cache/qcuda/kbuild is what a root's
# /var/cache/qcuda/kbuild holds (one folder per release, valid while its .complete stamp
# matches the headers, source, rustc and bindgen it was made from), bind-mounted there
# (in_root with QCUDA_IN_ROOT_KBUILD set) or copied in.

QCUDA_DEBIAN_MIRROR=${QCUDA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
QCUDA_DEBIAN_SECURITY=${QCUDA_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
# .deb files downloaded once, for every root and image made from them.
QCUDA_TRIXIE_DEBS=$QCUDA_CACHE/trixie-debs

# The stock kernel comes from trixie-backports (the series with CONFIG_RUST), everything else
# from trixie: its rustc, rust-src and bindgen are the versions that built that kernel
# (trixie-backports' newer rustc fails on its headers). The "/trixie-backports" suffix makes
# apt take only those packages (and what only that suite has) from there.
TRIXIE_KERNEL_PACKAGES=(linux-image-amd64/trixie-backports linux-headers-amd64/trixie-backports
    linux-source/trixie-backports)
# What the Rust build files and the module build need (the same as the qcuda-guest package's
# Depends, plus the kernel's packages and dkms/dpkg-dev to build and try the package here).
# A root made before one was added here gets it by apt-get on its next use.
TRIXIE_BUILD_PACKAGES=(rustc rust-src bindgen libclang-dev gcc-14 make bc flex bison libelf-dev
    libssl-dev openssl python3 xz-utils zstd kmod cpio dkms dpkg-dev fakeroot)

trixie_mmdebstrap() { # target, more mmdebstrap options (hooks, packages)
    local target=$1 suite mirrors=()
    shift
    # QCUDA_TRIXIE_SUITES: the suites the root's apt knows (default: all four).
    for suite in ${QCUDA_TRIXIE_SUITES:-trixie trixie-updates trixie-security trixie-backports}; do
        case $suite in
        *-security) mirrors+=("deb $QCUDA_DEBIAN_SECURITY $suite main") ;;
        *) mirrors+=("deb $QCUDA_DEBIAN_MIRROR $suite main") ;;
        esac
    done
    mkdir -p "$QCUDA_TRIXIE_DEBS"
    mmdebstrap --variant=apt --mode=root --components=main --format=directory \
        --skip=download/empty --skip=essential/unlink \
        --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
        --setup-hook="sync-in '$QCUDA_TRIXIE_DEBS' /var/cache/apt/archives/" \
        --customize-hook="sync-out /var/cache/apt/archives '$QCUDA_TRIXIE_DEBS'" \
        --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
        "$@" trixie "$target" "${mirrors[@]}"
}

trixie_root_make() { # target directory
    local inc
    inc=$(IFS=,; echo "${TRIXIE_KERNEL_PACKAGES[*]},${TRIXIE_BUILD_PACKAGES[*]}")
    trixie_mmdebstrap "$1" --include="$inc"
}

trixie_root() {
    local key dir
    key=$(declare -f trixie_mmdebstrap trixie_root_make | cat - <(printf '%s\n' \
        "${TRIXIE_KERNEL_PACKAGES[@]}" "$QCUDA_DEBIAN_MIRROR") | sha256sum | cut -c1-16)
    dir=$QCUDA_CACHE/trixie-root-$key
    mkdir -p "$QCUDA_CACHE"
    exec 8>"$dir.lock"
    flock 8
    qcuda_cache_prune trixie-root "$dir"
    if [[ ! -f $dir/.qcuda-complete ]]; then
        rm -rf "$dir"
        printf '[trixie-root] making %s with mmdebstrap (downloads ~700 MiB once)\n' "$dir" >&2
        trixie_root_make "$dir" >"$dir.log" 2>&1 || {
            tail -n 30 "$dir.log" >&2
            printf '[trixie-root] error: mmdebstrap failed (%s)\n' "$dir.log" >&2
            return 1
        }
        touch "$dir/.qcuda-complete"
    fi
    local p missing=()
    for p in "${TRIXIE_BUILD_PACKAGES[@]}"; do
        in_root "$dir" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]})); then
        printf '[trixie-root] adding %s\n' "${missing[*]}" >&2
        in_root "$dir" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${missing[*]}" >>"$dir.log" 2>&1 || {
            tail -n 20 "$dir.log" >&2
            printf '[trixie-root] error: apt-get install %s failed\n' "${missing[*]}" >&2
            return 1
        }
    fi
    flock -u 8
    echo "$dir"
}

in_root() { # root, command...   (QCUDA_IN_ROOT_KBUILD=DIR: DIR bound at /var/cache/qcuda/kbuild)
    local r=$1
    shift
    unshare --mount --propagation private -- sh -c '
        r=$1 kb=$2; shift 2
        mount -t proc proc "$r/proc" && mount --rbind /sys "$r/sys" && mount --rbind /dev "$r/dev" &&
            mount -t tmpfs tmpfs "$r/run" || exit 125
        if [ -n "$kb" ]; then
            mkdir -p "$r/var/cache/qcuda/kbuild" && mount --bind "$kb" "$r/var/cache/qcuda/kbuild" || exit 125
        fi
        exec chroot "$r" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 "$@"' \
        sh "$r" "${QCUDA_IN_ROOT_KBUILD:-}" "$@"
}

kbuild_shared() {
    local d=$QCUDA_CACHE/kbuild
    # Caches from before this folder existed: the second kernel's (check-guest-deb.sh) held
    # both flavours' prepared files (hard links: nothing is copied).
    [[ -d $d || ! -d $QCUDA_CACHE/kbuild-second-kernel ]] || cp -al "$QCUDA_CACHE/kbuild-second-kernel" "$d"
    mkdir -p "$d"
    echo "$d"
}

stock_release() { # root: the newest kernel release with an image and headers
    local r=$1 rel
    rel=$(cd "$r/lib/modules" && for d in *; do [[ -e $d/build/.config && -f $r/boot/vmlinuz-$d ]] && echo "$d"; done |
        sort -V | tail -n 1)
    [[ -n $rel ]] || { printf '[trixie-root] error: no kernel with headers in %s\n' "$r" >&2; return 1; }
    echo "$rel"
}

trixie_root_versions() { # root, release
    local r=$1 rel=$2 p
    for p in "linux-image-$rel" "linux-headers-$rel" linux-source rustc rust-src bindgen gcc-14 dkms libc6; do
        printf '%s: %s\n' "$p" "$(in_root "$r" dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo -)"
    done
    printf 'linux-source package: %s\n' "$(in_root "$r" dpkg-query -W -f='${Depends}' linux-source)"
    printf 'rustc --version: %s\n' "$(in_root "$r" rustc --version)"
    printf 'bindgen --version: %s\n' "$(in_root "$r" bindgen --version 2>&1 | head -n 1)"
    printf 'kernel built by: %s\n' "$(grep -E '^CONFIG_(RUSTC_VERSION_TEXT|CC_VERSION_TEXT)=' "$r/lib/modules/$rel/build/.config" | tr '\n' ' ')"
}

#!/usr/bin/env bash
# Build the patched QEMU that qcuda runs guests with, and point build/qemu at it.
#
# Source: Debian's QEMU 10.0.x orig tarball from bookworm-backports, plus the
# series in qemu-patches/ (vhost-user-cuda, vhost-user-cuda-pci). The result is
# a minimal x86_64-softmmu (KVM, TCG, vhost-user) with the firmware a
# `-M pc`/`-M q35` boot with `-kernel` needs, installed once per input hash
# into ~/.cache/qcuda/qemu-<hash>/. build/qemu is a symlink to that entry.
#
# Works on a fresh Debian 12 machine as root: it installs only the build
# dependencies that are missing and upgrades nothing else on purpose (a -dev
# package may pull its own runtime library to the matching version; apt
# requires that). A cache hit needs no root, no network and no compiler.
#
# Environment:
#   QCUDA_CACHE   cache root (default ${XDG_CACHE_HOME:-~/.cache}/qcuda)
#   JOBS          parallel build jobs (default 2: the work machines have 2 cores)
#   VERBOSE=1     stream the build log instead of writing it to a file only
#
# Output: the last line is `qemu: <path to qemu-system-x86_64>`.

set -euo pipefail

readonly SUITE=bookworm-backports
readonly MIN_MESON=1.5
readonly TARGETS=x86_64-softmmu
# Firmware the pc/q35 machines load, taken from Debian's binary packages of
# the same suite: SeaBIOS and the VGA BIOSes from seabios; the option ROMs
# (-kernel loaders, kvmvapic) from qemu-system-data, which Debian built from
# this same QEMU source. Building the option ROMs here would need a 32-bit
# libgcc (lib32gcc-12-dev and 18 more packages) only for configure's probe.
readonly SEABIOS_FILES=(bios-256k.bin bios.bin vgabios.bin vgabios-stdvga.bin
    vgabios-virtio.bin vgabios-cirrus.bin vgabios-qxl.bin vgabios-vmware.bin)
readonly OPTION_ROMS=(kvmvapic.bin linuxboot_dma.bin linuxboot.bin
    multiboot_dma.bin multiboot.bin pvh.bin)

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_PATH=$REPO_ROOT/scripts/$(basename "${BASH_SOURCE[0]}")
PATCH_DIR=$REPO_ROOT/qemu-patches
CACHE_ROOT=${QCUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qcuda}
SRC_CACHE=$CACHE_ROOT/src
JOBS=${JOBS:-2}
START_TIME=$SECONDS

log() { printf '[build-qemu] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

is_root() { [[ $(id -u) -eq 0 ]]; }

# apt-get with a bounded wait for the dpkg lock: other scripts on the
# machine may be installing at the same moment.
apt_get() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"
}

# --- apt sources -----------------------------------------------------------

# (grep without -q: an early exit would SIGPIPE apt-get and fail the pipe.)
has_index_target() { # <deb|deb-src> <suite>
    apt-get indextargets --no-release-info --format '$(TARGET_OF) $(RELEASE)' \
        | grep -x "$1 $2" >/dev/null
}

has_index_file() { # <Packages|Sources> <suite>
    apt-get indextargets --format '$(IDENTIFIER) $(RELEASE)' \
        | grep -x "$1 $2" >/dev/null
}

# Adds what is missing of: deb + deb-src for bookworm-backports, deb-src for
# bookworm. bookworm-backports is NotAutomatic (priority 100), so adding it
# upgrades nothing unless a package is asked for with -t.
ensure_apt_sources() {
    local file=/etc/apt/sources.list.d/qcuda-qemu.sources stanza=() changed=0
    has_index_target deb "$SUITE" || stanza+=(deb)
    has_index_target deb-src "$SUITE" || stanza+=(deb-src)
    if ((${#stanza[@]})) || ! has_index_target deb-src bookworm; then
        is_root || die "apt sources for $SUITE/deb-src are missing; run as root once"
        log "adding $file (${stanza[*]:-} $SUITE, deb-src bookworm)"
        {
            echo "# Added by qcuda scripts/build-qemu.sh: QEMU source and meson >= $MIN_MESON."
            if ((${#stanza[@]})); then
                printf 'Types: %s\nURIs: http://deb.debian.org/debian\nSuites: %s\n' \
                    "${stanza[*]}" "$SUITE"
                printf 'Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n'
            fi
            if ! has_index_target deb-src bookworm; then
                printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n'
                printf 'Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
            fi
        } >"$file"
        changed=1
    fi
    if ((changed)) || ! has_index_file Sources "$SUITE" || ! has_index_file Packages "$SUITE"; then
        is_root || die "apt lists for $SUITE are missing; run as root once"
        log "apt-get update"
        apt_get update -qq
    fi
}

# --- build dependencies ----------------------------------------------------

is_installed() {
    [[ $(dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

meson_is_new_enough() {
    local v
    v=$(/usr/bin/meson --version 2>/dev/null) || return 1
    [[ $(printf '%s\n%s\n' "$MIN_MESON" "$v" | sort -V | head -n1) == "$MIN_MESON" ]]
}

# Only missing packages are named, so apt never upgrades an installed one.
ensure_build_deps() {
    local stable=(gcc make binutils patch xz-utils pkg-config ninja-build
        python3 python3-venv libglib2.0-dev libpcre2-dev zlib1g-dev)
    local backports=(python3-pycotap) missing=() missing_bpo=() p
    for p in "${stable[@]}"; do is_installed "$p" || missing+=("$p"); done
    for p in "${backports[@]}"; do is_installed "$p" || missing_bpo+=("$p"); done
    meson_is_new_enough || missing_bpo+=(meson)
    if ((${#missing[@]} + ${#missing_bpo[@]} == 0)); then
        log "build dependencies present (meson $(/usr/bin/meson --version))"
        return
    fi
    is_root || die "missing build dependencies: ${missing[*]} ${missing_bpo[*]}; run as root"
    if ((${#missing[@]})); then
        log "apt-get install ${missing[*]}"
        apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    if ((${#missing_bpo[@]})); then
        log "apt-get -t $SUITE install ${missing_bpo[*]}"
        apt_get install -y -qq --no-install-recommends -t "$SUITE" "${missing_bpo[@]}" >/dev/null
    fi
    meson_is_new_enough || die "meson >= $MIN_MESON still missing"
}

# --- sources ----------------------------------------------------------------

# Asks apt's index, without downloading, which file `apt-get <subcommand>
# <package>` would fetch: prints "<file name> <sha256>" of the first file
# whose name matches <regex>. It runs in an empty directory because apt
# leaves out files that already lie in the current one.
resolve_uri() { # <subcommand> <package> <regex>
    mkdir -p "$SRC_CACHE/.resolve"
    (cd "$SRC_CACHE/.resolve" && apt-get "$1" --print-uris "$2" 2>/dev/null) \
        | awk -v re="$3" '!found && $2 ~ re { sub(/^SHA256:/, "", $4); print $2, $4; found = 1 }
                          END { exit !found }'
}

verify_sha256() { # <file> <sha256>
    [[ -f $1 ]] && sha256sum --status -c <<<"$2  $1"
}

# The .dsc and .debian.tar.xz of the backport may 404; the orig tarball is all
# we need, and apt checked it against the signed Sources index.
fetch_qemu_source() {
    if verify_sha256 "$SRC_CACHE/$QEMU_TARBALL" "$QEMU_TARBALL_SHA"; then
        return
    fi
    log "downloading $QEMU_TARBALL (apt-get source --download-only qemu/$SUITE)"
    (cd "$SRC_CACHE" && apt-get source --download-only -qq "qemu/$SUITE" >/dev/null 2>&1) || true
    verify_sha256 "$SRC_CACHE/$QEMU_TARBALL" "$QEMU_TARBALL_SHA" \
        || die "could not download $QEMU_TARBALL (try: apt-get update)"
}

fetch_deb() { # <package/suite> <file> <sha256>
    if verify_sha256 "$SRC_CACHE/$2" "$3"; then
        return
    fi
    log "downloading $2 (apt-get download $1)"
    (cd "$SRC_CACHE" && apt-get download -qq "$1" >/dev/null 2>&1) || true
    verify_sha256 "$SRC_CACHE/$2" "$3" || die "could not download $2"
}

# --- build --------------------------------------------------------------------

# Runs a build step, logging to $LOG; on failure shows the end of the log.
step() { # <description> <command...>
    local desc=$1 t0=$SECONDS
    shift
    log "$desc"
    printf '\n### %s\n' "$desc" >>"$LOG"
    if [[ ${VERBOSE:-0} == 1 ]]; then
        "$@" 2>&1 | tee -a "$LOG" || { log "failed: $desc (log: $LOG)"; exit 1; }
    elif ! "$@" >>"$LOG" 2>&1; then
        tail -n 40 "$LOG" >&2
        die "failed: $desc (full log: $LOG)"
    fi
    log "  done in $((SECONDS - t0)) s"
}

apply_patches() { # <source dir>
    local p
    for p in "${PATCHES[@]}"; do
        echo "applying $(basename "$p")"
        patch -d "$1" -p1 --batch --forward --fuzz=0 --no-backup-if-mismatch <"$p"
    done
}

build_qemu() {
    local work=$CACHE_ROOT/work-$HASH
    rm -rf "$work" "$DEST"
    mkdir -p "$work"

    step "unpacking $QEMU_TARBALL" \
        tar -C "$work" --no-same-owner -xf "$SRC_CACHE/$QEMU_TARBALL"
    local srcdirs=("$work"/qemu-*/)
    [[ -d ${srcdirs[0]} ]] || die "no qemu-* directory in $QEMU_TARBALL"
    local srcdir=${srcdirs[0]%/}
    QEMU_VERSION=$(<"$srcdir/VERSION")

    step "applying ${#PATCHES[@]} patches from qemu-patches/" apply_patches "$srcdir"

    mkdir -p "$work/build"
    # Minimal on purpose: no default features, no tools, no docs, no blobs
    # from the tarball (Debian's +ds tarball has none). QEMU is relocatable,
    # so the prefix only fixes the layout under the cache entry.
    step "configuring QEMU $QEMU_VERSION" \
        env -C "$work/build" "$srcdir/configure" \
        --prefix="$DEST" \
        --target-list="$TARGETS" \
        --without-default-features \
        --enable-kvm --enable-tcg --enable-vhost-user \
        --disable-fdt --disable-tools --disable-docs \
        --disable-install-blobs --disable-download \
        --python=/usr/bin/python3

    # Only the emulator: the default target would also build ~600 test,
    # benchmark and softfloat-test objects that nobody here runs.
    step "building qemu-system-x86_64 with $JOBS jobs" \
        ninja -C "$work/build" -j"$JOBS" qemu-system-x86_64

    # Installed by hand: `make install` would rebuild the default target, and
    # with no UI, tools or blobs it adds nothing the emulator reads. QEMU
    # finds share/qemu relative to its binary, so the tree is relocatable.
    local datadir=$DEST/share/qemu f
    install -D -m 0755 "$work/build/qemu-system-x86_64" "$DEST/bin/qemu-system-x86_64"
    strip --strip-unneeded "$DEST/bin/qemu-system-x86_64"
    mkdir -p "$datadir"
    step "unpacking $SEABIOS_DEB and $QEMU_DATA_DEB" eval \
        'dpkg-deb -x "$SRC_CACHE/$SEABIOS_DEB" "$work/fw" && dpkg-deb -x "$SRC_CACHE/$QEMU_DATA_DEB" "$work/fw"'
    for f in "${SEABIOS_FILES[@]}"; do
        # Debian ships some of them as symlinks; install the file itself.
        install -m 0644 "$(readlink -f "$work/fw/usr/share/seabios/$f")" "$datadir/$f"
    done
    for f in "${OPTION_ROMS[@]}"; do
        install -m 0644 "$work/fw/usr/share/qemu/$f" "$datadir/$f"
    done

    write_build_info "$DEST/qcuda-build-info.txt"
    rm -rf "$work"
}

write_build_info() { # <file>
    {
        echo "qemu_version=$QEMU_VERSION"
        echo "debian_source=qemu $QEMU_DEB_VERSION ($SUITE)"
        echo "tarball=$QEMU_TARBALL sha256=$QEMU_TARBALL_SHA"
        echo "seabios=$SEABIOS_DEB sha256=$SEABIOS_SHA"
        echo "option_roms=$QEMU_DATA_DEB sha256=$QEMU_DATA_SHA"
        echo "needed_libs=$(readelf -d "$DEST/bin/qemu-system-x86_64" \
            | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd' ')"
        echo "patches=$(for p in "${PATCHES[@]}"; do basename "$p"; done | paste -sd' ')"
        echo "input_hash=$HASH"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
        echo "build_seconds=$((SECONDS - START_TIME))"
    } >"$1"
}

# --- main ---------------------------------------------------------------------

main() {
    mkdir -p "$SRC_CACHE"
    mapfile -t PATCHES < <(find "$PATCH_DIR" -maxdepth 1 -name '*.patch' | LC_ALL=C sort)
    ((${#PATCHES[@]})) || die "no patches in $PATCH_DIR"

    ensure_apt_sources

    local tarball seabios qemu_data
    tarball=$(resolve_uri source "qemu/$SUITE" '\.orig\.tar\.') \
        || die "apt knows no qemu source in $SUITE (apt-get update?)"
    seabios=$(resolve_uri download "seabios/$SUITE" '\.deb$') \
        || die "apt knows no seabios package in $SUITE"
    qemu_data=$(resolve_uri download "qemu-system-data/$SUITE" '\.deb$') \
        || die "apt knows no qemu-system-data package in $SUITE"
    read -r QEMU_TARBALL QEMU_TARBALL_SHA <<<"$tarball"
    read -r SEABIOS_DEB SEABIOS_SHA <<<"$seabios"
    read -r QEMU_DATA_DEB QEMU_DATA_SHA <<<"$qemu_data"
    QEMU_DEB_VERSION=$(apt-cache showsrc --only-source qemu 2>/dev/null \
        | awk -v t="$QEMU_TARBALL" '/^Version:/ { v = $2 } !found && $NF == t { print v; found = 1 }')

    # Everything that decides the result: this script, the patches (names and
    # contents), and which source tarball and firmware packages went in.
    HASH=$({
        sha256sum "$SCRIPT_PATH" | cut -d' ' -f1
        for p in "${PATCHES[@]}"; do
            printf '%s %s\n' "$(basename "$p")" "$(sha256sum "$p" | cut -d' ' -f1)"
        done
        echo "$QEMU_TARBALL"
        echo "$SEABIOS_DEB"
        echo "$QEMU_DATA_DEB"
    } | sha256sum | cut -c1-16)
    DEST=$CACHE_ROOT/qemu-$HASH
    LOG=$CACHE_ROOT/qemu-$HASH.log

    # One builder per cache root at a time; a second waits, then hits the cache.
    exec 9>"$CACHE_ROOT/qemu.lock"
    flock 9

    if [[ -f $DEST/.complete ]]; then
        log "cache hit: $DEST"
    else
        log "building QEMU from $QEMU_TARBALL (debian $QEMU_DEB_VERSION), input hash $HASH"
        : >"$LOG"
        ensure_build_deps
        fetch_qemu_source
        fetch_deb "seabios/$SUITE" "$SEABIOS_DEB" "$SEABIOS_SHA"
        fetch_deb "qemu-system-data/$SUITE" "$QEMU_DATA_DEB" "$QEMU_DATA_SHA"
        build_qemu
        touch "$DEST/.complete"
        log "built in $((SECONDS - START_TIME)) s, log: $LOG"
    fi

    mkdir -p "$REPO_ROOT/build"
    rm -rf "$REPO_ROOT/build/qemu"
    ln -s "$DEST" "$REPO_ROOT/build/qemu"

    local bin=$REPO_ROOT/build/qemu/bin/qemu-system-x86_64
    "$bin" --version | sed -n '1s/^/[build-qemu] /p' >&2
    sed 's/^/[build-qemu]   /' "$DEST/qcuda-build-info.txt" >&2
    log "build/qemu -> $DEST"
    echo "qemu: $bin"
}

main "$@"

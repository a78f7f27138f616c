#!/usr/bin/env bash
# Build the patched QEMU that qcuda runs guests with, and copy it to build/qemu/.
#
# Source: Debian's QEMU 10.0.x orig tarball from bookworm-backports, plus the
# series in qemu-patches/ (vhost-user-cuda, vhost-user-cuda-pci). The result is
# a minimal x86_64-softmmu (KVM, TCG, vhost-user) with the firmware a
# `-M pc`/`-M q35` boot with `-kernel` needs, installed once per input hash
# into ~/.cache/qcuda/qemu-<hash>/, then copied to build/qemu/ (a copy, not a
# symlink, so that build/ can be carried to another machine or bundled).
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
# Firmware the pc/q35 machines load, taken from Debian's binary packages
# (downloaded and unpacked, never installed):
#  - seabios: the BIOS and the VGA BIOSes;
#  - qemu-system-data: the option ROMs (-kernel loaders, kvmvapic), which
#    Debian built from this same QEMU source. Building them here would need a
#    32-bit libgcc (lib32gcc-12-dev and 18 more packages) for configure's probe;
#  - ipxe-qemu: the ROMs of the default NICs (e1000 on pc, e1000e on q35) and
#    virtio-net. Without them a command line without `-nic none` fails with
#    'failed to find romfile "efi-e1000.rom"'.
readonly SEABIOS_FILES=(bios-256k.bin bios.bin vgabios.bin vgabios-stdvga.bin
    vgabios-virtio.bin vgabios-cirrus.bin vgabios-qxl.bin vgabios-vmware.bin)
readonly OPTION_ROMS=(kvmvapic.bin linuxboot_dma.bin linuxboot.bin
    multiboot_dma.bin multiboot.bin pvh.bin)
readonly NIC_ROMS=(efi-e1000.rom efi-e1000e.rom efi-virtio.rom)
# ipxe-qemu is not in bookworm-backports.
readonly IPXE_SUITE=bookworm

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT_PATH=$REPO_ROOT/scripts/$(basename "${BASH_SOURCE[0]}")
PATCH_DIR=$REPO_ROOT/qemu-patches
# shellcheck source=scripts/lib.sh
source "$REPO_ROOT/scripts/lib.sh"
CACHE_ROOT=$QCUDA_CACHE
SRC_CACHE=$CACHE_ROOT/src
JOBS=${JOBS:-2}
START_TIME=$SECONDS
APT_UPDATED=0

log() { printf '[build-qemu] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

is_root() { [[ $(id -u) -eq 0 ]]; }

# apt-get with a bounded wait for the dpkg lock: other scripts on the
# machine may be installing at the same moment.
apt_get() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"
}

# --- apt sources -----------------------------------------------------------

# Adds what is missing of: deb + deb-src for bookworm-backports, deb-src for
# bookworm. bookworm-backports is NotAutomatic (priority 100), so adding it
# upgrades nothing unless a package is asked for with -t.
ensure_apt_sources() {
    local file=/etc/apt/sources.list.d/qcuda-qemu.sources stanza=() changed=0
    # What sources.list configures, and which index files are on disk.
    local configured present
    configured=$(apt-get indextargets --no-release-info --format '$(TARGET_OF) $(RELEASE)')
    present=$(apt-get indextargets --format '$(IDENTIFIER) $(RELEASE)')
    has_index_target() { grep -qx "$1 $2" <<<"$configured"; } # <deb|deb-src> <suite>
    has_index_file() { grep -qx "$1 $2" <<<"$present"; }      # <Packages|Sources> <suite>

    has_index_target deb "$SUITE" || stanza+=(deb)
    has_index_target deb-src "$SUITE" || stanza+=(deb-src)
    if ((${#stanza[@]})) || ! has_index_target deb-src bookworm; then
        is_root || die "apt sources for $SUITE/deb-src are missing; run as root once"
        log "adding $file"
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
        APT_UPDATED=1
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

# Asks apt's signed index, without downloading, which files `apt-get
# <subcommand> <package...>` would fetch: prints "<file name> <sha256>" per
# file. It runs in an empty directory because apt leaves out files that
# already lie in the current one.
resolve_uris() { # <subcommand> <package...>
    mkdir -p "$SRC_CACHE/.resolve"
    (cd "$SRC_CACHE/.resolve" && apt-get "$@" --print-uris 2>/dev/null) \
        | awk 'index($0, "\047") == 1 { sub(/^SHA256:/, "", $4); print $2, $4 }' || true
}

# From resolve_uris output, the first file whose name matches <regex>.
pick_file() { # <regex> <resolve_uris output>
    awk -v re="$1" '!found && $1 ~ re { print; found = 1 } END { exit !found }' <<<"$2"
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
# A shell function run as a step executes with `set -e` off (it is an `if`
# condition), so it must return its own errors.
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
        patch -d "$1" -p1 --batch --forward --fuzz=0 --no-backup-if-mismatch <"$p" || return
    done
}

unpack_debs() { # <dir> <deb...>
    local dir=$1 deb
    shift
    for deb in "$@"; do dpkg-deb -x "$deb" "$dir" || return; done
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
    step "unpacking firmware packages" unpack_debs "$work/fw" \
        "$SRC_CACHE/$SEABIOS_DEB" "$SRC_CACHE/$QEMU_DATA_DEB" "$SRC_CACHE/$IPXE_DEB"
    for f in "${SEABIOS_FILES[@]}"; do
        # Debian ships some of them as symlinks; install the file itself.
        install -m 0644 "$(readlink -f "$work/fw/usr/share/seabios/$f")" "$datadir/$f"
    done
    for f in "${OPTION_ROMS[@]}"; do
        install -m 0644 "$work/fw/usr/share/qemu/$f" "$datadir/$f"
    done
    for f in "${NIC_ROMS[@]}"; do
        install -m 0644 "$work/fw/usr/lib/ipxe/qemu/$f" "$datadir/$f"
    done

    write_build_info "$DEST/qcuda-build-info.txt"
    log "removing the build tree $work"
    rm -rf "$work"
}

write_build_info() { # <file>
    {
        echo "qemu_version=$QEMU_VERSION"
        echo "debian_source=qemu $QEMU_DEB_VERSION ($SUITE)"
        echo "tarball=$QEMU_TARBALL sha256=$QEMU_TARBALL_SHA"
        echo "seabios=$SEABIOS_DEB sha256=$SEABIOS_SHA"
        echo "option_roms=$QEMU_DATA_DEB sha256=$QEMU_DATA_SHA"
        echo "nic_roms=$IPXE_DEB sha256=$IPXE_SHA"
        echo "needed_libs=$(readelf -d "$DEST/bin/qemu-system-x86_64" \
            | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd' ')"
        echo "patches=$(for p in "${PATCHES[@]}"; do basename "$p"; done | paste -sd' ')"
        echo "input_hash=$HASH"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
        echo "build_seconds=$((SECONDS - START_TIME))"
    } >"$1"
}

# Copies the cache entry to <dir> unless it already holds this input hash.
# The copy is made beside <dir> and renamed over it, so a reader never sees
# half a tree.
publish() { # <dir>
    local dir=$1
    if [[ -f $dir/.complete ]] && cmp -s "$dir/qcuda-build-info.txt" "$DEST/qcuda-build-info.txt"; then
        return
    fi
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir.new"
    cp -a "$DEST" "$dir.new"
    rm -rf "$dir"
    mv "$dir.new" "$dir"
}

# --- main ---------------------------------------------------------------------

# Sets the inputs (file names and SHA-256 from apt's index), HASH, DEST, LOG.
resolve_inputs() {
    local sources debs f p
    sources=$(resolve_uris source "qemu/$SUITE")
    debs=$(resolve_uris download "seabios/$SUITE" "qemu-system-data/$SUITE" "ipxe-qemu/$IPXE_SUITE")
    f=$(pick_file '\.orig\.tar\.' "$sources") \
        || die "apt knows no qemu source in $SUITE (apt-get update?)"
    read -r QEMU_TARBALL QEMU_TARBALL_SHA <<<"$f"
    f=$(pick_file '^seabios_' "$debs") || die "apt knows no seabios in $SUITE"
    read -r SEABIOS_DEB SEABIOS_SHA <<<"$f"
    f=$(pick_file '^qemu-system-data_' "$debs") || die "apt knows no qemu-system-data in $SUITE"
    read -r QEMU_DATA_DEB QEMU_DATA_SHA <<<"$f"
    f=$(pick_file '^ipxe-qemu_' "$debs") || die "apt knows no ipxe-qemu in $IPXE_SUITE"
    read -r IPXE_DEB IPXE_SHA <<<"$f"
    # The Debian version whose source uses this tarball, for the record.
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
        echo "$IPXE_DEB"
    } | sha256sum | cut -c1-16)
    DEST=$CACHE_ROOT/qemu-$HASH
    LOG=$CACHE_ROOT/qemu-$HASH.log
}

main() {
    mkdir -p "$SRC_CACHE"
    mapfile -t PATCHES < <(find "$PATCH_DIR" -maxdepth 1 -name '*.patch' | LC_ALL=C sort)
    ((${#PATCHES[@]})) || die "no patches in $PATCH_DIR"

    ensure_apt_sources

    resolve_inputs

    # One builder per cache root at a time; a second waits, then hits the cache.
    exec 9>"$CACHE_ROOT/qemu.lock"
    flock 9

    # Before a build, make sure apt's index is current: the archive keeps only
    # the newest backport, so a stale index names files that are gone.
    if [[ ! -f $DEST/.complete ]] && is_root && ((!APT_UPDATED)); then
        log "apt-get update (refreshing the index before a build)"
        apt_get update -qq
        APT_UPDATED=1
        resolve_inputs
    fi

    if [[ -f $DEST/.complete ]]; then
        log "cache hit: $DEST"
    else
        log "building QEMU from $QEMU_TARBALL (debian $QEMU_DEB_VERSION), input hash $HASH"
        : >"$LOG"
        ensure_build_deps
        fetch_qemu_source
        fetch_deb "seabios/$SUITE" "$SEABIOS_DEB" "$SEABIOS_SHA"
        fetch_deb "qemu-system-data/$SUITE" "$QEMU_DATA_DEB" "$QEMU_DATA_SHA"
        fetch_deb "ipxe-qemu/$IPXE_SUITE" "$IPXE_DEB" "$IPXE_SHA"
        build_qemu
        touch "$DEST/.complete"
        log "built in $((SECONDS - START_TIME)) s, log: $LOG"
    fi

    publish "$REPO_ROOT/build/qemu"

    local bin=$REPO_ROOT/build/qemu/bin/qemu-system-x86_64
    "$bin" --version | sed -n '1s/^/[build-qemu] /p' >&2
    sed 's/^/[build-qemu]   /' "$DEST/qcuda-build-info.txt" >&2
    log "build/qemu is a copy of $DEST"
    echo "qemu: $bin"
}

main "$@"

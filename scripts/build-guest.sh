#!/usr/bin/env bash
# build-guest.sh: builds the qcuda guest into build/guest/.
#
#   bzImage             Linux 7.3 (Debian's linux-source-7.3) with CONFIG_RUST, tinyconfig-based
#   qcuda.ko            guest-kmod/, the Rust transport module, built against that kernel
#   initramfs.cpio.gz   busybox + the host's glibc runtime + /lib/modules/qcuda.ko + /init
#   kernel-version.txt  the versions that went in (archive keeps only the newest ones)
#   ktree               symlink to the cached kernel build tree, for out-of-tree module builds
#   tests/              guest/tests built for the guest (not in the initramfs; ship them as payload)
#
# Works as root on a fresh Debian 12 machine: it installs its own toolchain (apt sources it adds
# are pinned at priority 1 so nothing else upgrades). It is idempotent; the kernel tree is cached
# under ~/.cache/qcuda/kernel-<hash>/ keyed by the kernel-building code of this script, the config
# fragment guest/kernel.fragment and the exact toolchain and linux-source versions.
#
# Environment: JOBS (default: nproc, at most 2), QCUDA_CACHE (default ~/.cache/qcuda).
# See docs/guest.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
OUT=$ROOT/build/guest
CACHE=$QCUDA_CACHE
JOBS=${JOBS:-$(($(nproc) < 2 ? $(nproc) : 2))}

KSERIES=7.3
KSRC_PKG=linux-source-$KSERIES
KSRC_TAR=/usr/src/$KSRC_PKG.tar.xz
BACKPORTS_SUITE=trixie-backports
BINDGEN_VERSION=$QCUDA_BINDGEN_VERSION
BINDGEN_ROOT=$CACHE/bindgen-$BINDGEN_VERSION
BINDGEN=$QCUDA_BINDGEN
LLVM_DIR=/usr/lib/llvm-22
export LIBCLANG_PATH=$LLVM_DIR/lib
FRAGMENT=$ROOT/guest/kernel.fragment

# The Rust tools on every make line (lib.sh says why).
KMAKE=(make "${QCUDA_KMAKE_FLAGS[@]}")

APT_PACKAGES=(
    "$KSRC_PKG" rustc-web rust-web-src rust-web-clippy libclang1-22 libclang-common-22-dev
    gcc g++ make bc flex bison libelf-dev libssl-dev xz-utils cpio busybox-static gzip
)

log() { printf '[build-guest] %s\n' "$*" >&2; }
die() { printf '[build-guest] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# Toolchain
# ---------------------------------------------------------------------------------------------

apt_retry() {
    # Other developers may hold the apt/dpkg locks; wait for them instead of failing.
    local i
    for i in 1 2 3 4 5; do
        if apt-get -o DPkg::Lock::Timeout=600 "$@"; then return 0; fi
        log "apt-get $1 failed (try $i), retrying in 10 s"
        sleep 10
    done
    return 1
}

write_if_changed() { # path, content
    if [[ ! -f $1 ]] || [[ $(cat "$1") != "$2" ]]; then
        printf '%s\n' "$2" >"$1"
        return 0
    fi
    return 1
}

setup_apt_sources() {
    local changed=0
    # Priority 1: packages from this suite are installed only when asked for by name and
    # nothing else provides them; nothing already installed is ever upgraded from it.
    write_if_changed /etc/apt/preferences.d/qcuda-$BACKPORTS_SUITE "\
# Added by qcuda scripts/build-guest.sh: only for linux-source-$KSERIES.
Package: *
Pin: release n=$BACKPORTS_SUITE
Pin-Priority: 1" && changed=1
    write_if_changed /etc/apt/sources.list.d/qcuda-$BACKPORTS_SUITE.sources "\
# Added by qcuda scripts/build-guest.sh (pinned in /etc/apt/preferences.d/qcuda-$BACKPORTS_SUITE).
Types: deb
URIs: http://deb.debian.org/debian
Suites: $BACKPORTS_SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" && changed=1
    return $((1 - changed))
}

packages_missing() {
    local p missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$p")
    done
    printf '%s\n' "${missing[@]}"
}

install_toolchain() {
    local missing need_update=0
    if [[ $(id -u) -eq 0 ]]; then
        setup_apt_sources && need_update=1
    fi
    missing=$(packages_missing)
    if [[ -n $missing ]]; then
        [[ $(id -u) -eq 0 ]] || die "missing packages (run as root to install): $missing"
        if [[ $need_update -eq 1 ]] || ! apt-cache show "$KSRC_PKG" >/dev/null 2>&1 ||
            ! apt-cache show libclang1-22 >/dev/null 2>&1; then
            log "apt-get update"
            apt_retry update -qq
        fi
        log "installing: $(echo $missing)"
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt_retry install -y -qq --no-install-recommends $missing
    fi
    [[ -f $KSRC_TAR ]] || die "$KSRC_TAR missing after installing $KSRC_PKG"
    [[ -x /usr/bin/rustc ]] || die "/usr/bin/rustc missing (rustc-web)"
    [[ -d $LIBCLANG_PATH ]] || die "$LIBCLANG_PATH missing (libclang1-22)"

    if [[ ! -x $BINDGEN ]] || ! "$BINDGEN" --version 2>/dev/null | grep -qF "$BINDGEN_VERSION"; then
        # Any cargo will do to build bindgen; Debian's rustc-web comes without one.
        local cargo
        cargo=$(command -v cargo || true)
        if [[ -z $cargo ]]; then
            [[ $(id -u) -eq 0 ]] || die "no cargo to build bindgen-cli"
            DEBIAN_FRONTEND=noninteractive apt_retry install -y -qq --no-install-recommends cargo-web
            cargo=$(command -v cargo || echo /usr/bin/cargo)
        fi
        log "cargo install bindgen-cli $BINDGEN_VERSION into $BINDGEN_ROOT"
        mkdir -p "$CACHE"
        "$cargo" install --locked --quiet -j "$JOBS" bindgen-cli --version "$BINDGEN_VERSION" \
            --root "$BINDGEN_ROOT"
    fi
}

toolchain_versions() {
    cat <<EOF
linux-source: $(dpkg-query -W -f='${Package} ${Version}' "$KSRC_PKG")
rustc: $(/usr/bin/rustc --version) ($(dpkg-query -W -f='${Package} ${Version}' rustc-web))
rust-src: $(dpkg-query -W -f='${Package} ${Version}' rust-web-src)
bindgen: $("$BINDGEN" --version 2>&1 | head -1)
libclang: $(dpkg-query -W -f='${Package} ${Version}' libclang1-22)
gcc: $(gcc --version | head -1)
EOF
}

# ---------------------------------------------------------------------------------------------
# Kernel (cached)
# ---------------------------------------------------------------------------------------------

apply_fragment() { # in the kernel tree
    local line sym val
    while IFS= read -r line; do
        if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
            sym=${BASH_REMATCH[1]} val=${BASH_REMATCH[2]}
            case $val in
                y) scripts/config --file .config --enable "$sym" ;;
                m) scripts/config --file .config --module "$sym" ;;
                \"*) scripts/config --file .config --set-str "$sym" "${val:1:${#val}-2}" ;;
                *) scripts/config --file .config --set-val "$sym" "$val" ;;
            esac
        elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
            scripts/config --file .config --disable "${BASH_REMATCH[1]}"
        fi
    done <"$FRAGMENT"
}

verify_config() { # in the kernel tree: every fragment line must have survived olddefconfig
    local line sym bad=0
    while IFS= read -r line; do
        if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)= ]]; then
            grep -qxF "$line" .config || { log "config: wanted '$line', got '$(grep "^${BASH_REMATCH[1]}=" .config || echo unset)'"; bad=1; }
        elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
            sym=${BASH_REMATCH[1]}
            ! grep -q "^$sym=" .config || { log "config: wanted $sym unset"; bad=1; }
        fi
    done <"$FRAGMENT"
    return $bad
}

configure_kernel() { # in the kernel tree
    "${KMAKE[@]}" -s rustavailable
    "${KMAKE[@]}" -s tinyconfig
    apply_fragment
    "${KMAKE[@]}" -s olddefconfig
    verify_config || die "kernel config does not hold the options of $FRAGMENT"
}

build_kernel() { # kdir
    local kdir=$1
    if [[ ! -f $kdir/Makefile ]]; then
        rm -rf "$kdir"
        mkdir -p "$kdir"
        tar -xf "$KSRC_TAR" -C "$kdir" --strip-components=1
    fi
    cd "$kdir"
    configure_kernel
    # 'all' builds bzImage and the module build infrastructure (Module.symvers, rust/ metadata).
    "${KMAKE[@]}" -j"$JOBS" all
    "${KMAKE[@]}" -s kernelrelease >.qcuda-kernelrelease
    cd - >/dev/null
}

kernel_key() {
    {
        declare -f apply_fragment verify_config configure_kernel build_kernel
        printf '%s\n' "${KMAKE[@]}"
        cat "$FRAGMENT"
        toolchain_versions
    } | sha256sum | cut -c1-16
}

# ---------------------------------------------------------------------------------------------
# Module, initramfs
# ---------------------------------------------------------------------------------------------

build_module() { # kdir
    local kdir=$1 stage=$OUT/kmod-build
    rm -rf "$stage"
    mkdir -p "$stage/guest-kmod" "$stage/qcuda-proto/src"
    # Kbuild writes its objects next to the sources: build a copy that mirrors the repo layout,
    # so that the module's `#[path = "../qcuda-proto/src/wire.rs"]` resolves as in the repo.
    cp -a "$ROOT"/guest-kmod/. "$stage/guest-kmod/"
    cp "$ROOT/qcuda-proto/src/wire.rs" "$stage/qcuda-proto/src/wire.rs"
    "${KMAKE[@]}" -C "$kdir" M="$stage/guest-kmod" -j"$JOBS" modules
    cp "$stage/guest-kmod/qcuda.ko" "$OUT/qcuda.ko"
}

GLIBC_LIBS=(libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1 libpthread.so.0 libdl.so.2
            librt.so.1 libresolv.so.2 libutil.so.1)

initramfs_spec() { # kdir: prints a gen_init_cpio spec on stdout
    local d lib path applet
    for d in /dev /proc /sys /tmp /run /root /etc /bin /sbin /usr /usr/bin /usr/sbin /usr/lib \
        /usr/lib/qcuda /usr/local /usr/local/bin /lib /lib64 /lib/x86_64-linux-gnu /lib/modules \
        /opt /opt/qcuda /mnt; do
        echo "dir $d 755 0 0"
    done
    echo "nod /dev/console 600 0 0 c 5 1"
    echo "nod /dev/null 666 0 0 c 1 3"
    echo "file /init $ROOT/guest/init 755 0 0"
    echo "file /bin/busybox /bin/busybox 755 0 0"
    while read -r applet; do
        [[ $applet == bin/busybox || -z $applet ]] && continue
        # Relative-to-root links: /bin/sh -> /bin/busybox.
        echo "slink /$applet /bin/busybox 777 0 0"
    done < <(/bin/busybox --list-full | sort -u)
    echo "file /lib64/ld-linux-x86-64.so.2 $(readlink -f /lib64/ld-linux-x86-64.so.2) 755 0 0"
    for lib in "${GLIBC_LIBS[@]}"; do
        path=$(readlink -f "/lib/x86_64-linux-gnu/$lib")
        [[ -f $path ]] || die "host library $lib not found"
        echo "file /lib/x86_64-linux-gnu/$lib $path 755 0 0"
    done
    echo "file /lib/modules/qcuda.ko $OUT/qcuda.ko 644 0 0"
    echo "file /etc/passwd $OUT/etc/passwd 644 0 0"
    echo "file /etc/group $OUT/etc/group 644 0 0"
}

build_initramfs() { # kdir
    local kdir=$1 gen=$OUT/gen_init_cpio
    # The kernel's own cpio writer: device nodes without mknod, fixed mtimes.
    gcc -O2 -o "$gen" "$kdir/usr/gen_init_cpio.c"
    mkdir -p "$OUT/etc"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$OUT/etc/passwd"
    printf 'root:x:0:\ntty:x:5:\nnogroup:x:65534:\n' >"$OUT/etc/group"
    initramfs_spec "$kdir" >"$OUT/initramfs.spec"
    "$gen" -t 0 "$OUT/initramfs.spec" | gzip -9 -n >"$OUT/initramfs.cpio.gz.tmp"
    # Pad with zeros to a multiple of 512 bytes. Linux skips zeros between concatenated archives,
    # but takes an *uncompressed* cpio that follows a compressed one only at a 4-byte aligned
    # offset (init/initramfs.c, unpack_to_rootfs); otherwise: "invalid magic at start of
    # compressed archive". Whoever appends a plain cpio after a .gz must pad the same way.
    truncate -s %512 "$OUT/initramfs.cpio.gz.tmp"
    mv "$OUT/initramfs.cpio.gz.tmp" "$OUT/initramfs.cpio.gz"
}

build_tests() {
    # Guest-side tests of the initramfs runtime and of qcuda.ko (guest/tests/); built here so
    # that the same glibc as in the initramfs is used. Payload builders ship them to /opt/qcuda/bin.
    local t out=$OUT/tests
    mkdir -p "$out"
    for t in "$ROOT"/guest/tests/*.c; do
        gcc -O2 -Wall -pthread -o "$out/$(basename "$t" .c)" "$t"
    done
    for t in "$ROOT"/guest/tests/*.cc; do
        g++ -O2 -Wall -pthread -o "$out/$(basename "$t" .cc)" "$t"
    done
    for t in "$ROOT"/guest/tests/*.sh; do
        install -m 755 "$t" "$out/"
    done
}

# ---------------------------------------------------------------------------------------------

main() {
    local t0 kdir key
    t0=$SECONDS
    install_toolchain
    mkdir -p "$OUT" "$CACHE"
    log "toolchain:"
    toolchain_versions | sed 's/^/[build-guest]   /' >&2

    key=$(kernel_key)
    kdir=$CACHE/kernel-$key
    # One builder per cached tree; a second caller waits and then finds it done.
    exec 9>"$CACHE/kernel-$key.lock"
    flock 9
    qcuda_cache_prune kernel "$kdir"
    if [[ -f $kdir/.qcuda-complete ]]; then
        log "kernel: cached $kdir"
    else
        log "kernel: building in $kdir (-j$JOBS; ~10 min on 2 cores)"
        local tk=$SECONDS
        build_kernel "$kdir"
        touch "$kdir/.qcuda-complete"
        log "kernel: built in $((SECONDS - tk)) s"
    fi
    flock -u 9
    ln -sfn "$kdir" "$OUT/ktree"
    cp "$kdir/arch/x86/boot/bzImage" "$OUT/bzImage"
    {
        echo "kernelrelease: $(cat "$kdir/.qcuda-kernelrelease")"
        echo "ktree: $kdir"
        toolchain_versions
    } >"$OUT/kernel-version.txt"

    local tm=$SECONDS
    build_module "$kdir"
    log "module: built in $((SECONDS - tm)) s"
    build_initramfs "$kdir"
    build_tests

    log "done in $((SECONDS - t0)) s:"
    (cd "$OUT" && ls -l bzImage initramfs.cpio.gz qcuda.ko kernel-version.txt ktree) | sed 's/^/[build-guest]   /' >&2
}

main "$@"; exit

#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# dkms-build.sh: builds qcuda.ko for one kernel; DKMS runs it (dkms.conf's MAKE), and so does
# scripts/build-stock-guest.sh, from the source root (the folder holding guest-kmod/ and
# qcuda-proto/):
#
#   guest-kmod/dkms-build.sh RELEASE [KERNEL_BUILD_DIR]     (default /lib/modules/RELEASE/build)
#
# A Rust module is compiled against the Rust metadata of the kernel's own crates (rust/*.rmeta,
# libmacros.so) and the kernel's target file (scripts/target.json). A kernel's build tree has
# them; distribution headers may not (Debian's linux-headers packages ship Module.symvers with
# the Rust symbols but neither of those). Then this script prepares them once per release from
# the same version's source (/usr/src/linux-source-X.Y.tar.xz, Debian's linux-source-X.Y) with
# the kernel's own .config and the rustc that built the kernel, in
# /var/cache/qcuda/kbuild/RELEASE, and builds there: a tree of links to the headers with the
# prepared files added (no file of the headers package is changed). The module must be compiled
# by the very rustc that built the kernel (the metadata format is per compiler version), so a
# different one is refused with the one to install.
#
# Environment: QCUDA_RUSTC (default /usr/bin/rustc), QCUDA_BINDGEN (default /usr/bin/bindgen),
# QCUDA_KERNEL_SOURCE (a source tarball or folder of the kernel's version, for kernels whose
# source is not Debian's linux-source-X.Y), QCUDA_KBUILD_CACHE (default /var/cache/qcuda/kbuild),
# QCUDA_JOBS (default: the CPU count). Signing is DKMS's (it signs the built module where it is
# set up to: docs/guest-install.md).
set -euo pipefail
say() { printf 'qcuda dkms-build: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

rel=${1:?usage: dkms-build.sh RELEASE [KERNEL_BUILD_DIR]}
kdir=${2:-/lib/modules/$rel/build}
rustc=${QCUDA_RUSTC:-/usr/bin/rustc}
bindgen=${QCUDA_BINDGEN:-/usr/bin/bindgen}
cache_root=${QCUDA_KBUILD_CACHE:-/var/cache/qcuda/kbuild}
jobs=${QCUDA_JOBS:-$(nproc)}
src_root=$(pwd)
[[ -d $src_root/guest-kmod && -f $src_root/qcuda-proto/src/wire.rs ]] ||
    die "run from the source root (guest-kmod/ and qcuda-proto/ beside each other), not $src_root"
[[ -f $kdir/.config ]] || die "$kdir has no .config: install the kernel's headers (Debian: linux-headers-$rel)"
grep -qx 'CONFIG_RUST=y' "$kdir/.config" ||
    die "kernel $rel is built without Rust support (CONFIG_RUST): qcuda.ko cannot be built for it"
[[ -x $rustc ]] || die "no rustc at $rustc (Debian: the rustc package of the kernel's suite; or set QCUDA_RUSTC)"
rustdoc=$(dirname "$rustc")/rustdoc

# The rustc that built the kernel, as its configuration recorded it.
want=$(sed -n 's/^CONFIG_RUSTC_VERSION_TEXT="\(.*\)"$/\1/p' "$kdir/.config")
have=$("$rustc" --version)
if [[ -n $want && $have != "$want" ]]; then
    die "kernel $rel was built by '$want', but $rustc is '$have': install that rustc (Debian: \
the suite the kernel was built in, e.g. trixie's rustc for trixie-backports kernels) or point \
QCUDA_RUSTC at it"
fi
kmake=(make RUSTC="$rustc" RUSTDOC="$rustdoc" HOSTRUSTC="$rustc" BINDGEN="$bindgen")

# ---------------------------------------------------------------------------------------------
# The Rust build files, when the headers lack them
# ---------------------------------------------------------------------------------------------

owner_version() { # path: "package version" of the Debian package that owns it, or nothing
    local p
    command -v dpkg-query >/dev/null || return 0
    p=$(dpkg-query -S "$1" 2>/dev/null | head -n 1 | cut -d: -f1) || return 0
    [[ -n $p ]] && printf '%s %s\n' "$p" "$(dpkg-query -W -f='${Version}' "$p")"
}

kernel_source() { # series, headers' package version: prints a tarball or folder
    local series=$1 hver=$2 tar sver
    if [[ -n ${QCUDA_KERNEL_SOURCE:-} ]]; then
        echo "$QCUDA_KERNEL_SOURCE"
        return
    fi
    tar=/usr/src/linux-source-$series.tar.xz
    [[ -f $tar ]] || die "the headers of $rel lack the Rust build files, and $tar is missing to \
prepare them: install linux-source-$series${hver:+ (version $hver, as the headers)}"
    sver=$(owner_version "$tar" | cut -d' ' -f2)
    if [[ -n $hver && -n $sver && $hver != "$sver" ]]; then
        die "linux-source-$series is version $sver, the headers of $rel are $hver: install the same \
version of both (the Rust metadata must match the kernel's)"
    fi
    echo "$tar"
}

link_entries() { # from dir, to dir, names to leave out...: one symlink per entry of FROM
    local from=$1 to=$2 e n skip
    shift 2
    for e in "$from"/* "$from"/.[!.]*; do
        [[ -e $e || -L $e ]] || continue
        n=$(basename "$e")
        skip=0
        for s in "$@"; do [[ $n == "$s" ]] && skip=1; done
        ((skip)) || ln -sfn "$e" "$to/$n"
    done
}

prepare_kbuild() { # prints the prepared build dir
    local real cache stamp series hver src t0=$SECONDS
    real=$(readlink -f "$kdir")
    cache=$cache_root/$rel
    mkdir -p "$cache_root"
    hver=$(owner_version "$real" | cut -d' ' -f2)
    series=$(sed -n 's/^# Linux\/[^ ]* \([0-9]*\.[0-9]*\).* Kernel Configuration$/\1/p' "$kdir/.config" | head -n 1)
    [[ -n $series ]] || die "cannot read the kernel version from $kdir/.config"
    src=$(kernel_source "$series" "$hver")
    # What the prepared files depend on; "layout" counts changes of what this script keeps.
    stamp="headers=$real $hver; source=$src $(owner_version "$src" | cut -d' ' -f2); rustc=$have; bindgen=$("$bindgen" --version 2>&1 | head -n 1); layout=1"
    exec 7>"$cache.lock"
    flock 7
    if [[ -f $cache/.complete && $(cat "$cache/.complete") == "$stamp" ]]; then
        say "Rust build files of $rel: $cache (prepared before)"
        echo "$cache/kdir"
        return
    fi
    [[ -x $bindgen ]] || die "no bindgen at $bindgen (Debian: the bindgen package of the kernel's suite; or set QCUDA_BINDGEN)"
    say "the headers of $rel lack the Rust build files: preparing them from $src in $cache (once per kernel release; minutes)"
    # An interrupted preparation of the same inputs resumes (make prepare is incremental).
    if [[ -f $cache/src/.qcuda-stamp && $(cat "$cache/src/.qcuda-stamp") == "$stamp" ]]; then
        say "resuming in $cache/src"
    else
        rm -rf "$cache"
        mkdir -p "$cache/src"
        if [[ -d $src ]]; then
            cp -a "$src"/. "$cache/src/"
        else
            tar -xf "$src" -C "$cache/src" --strip-components=1
        fi
        cp "$kdir/.config" "$cache/src/.config"
        # Debian's headers name the compiler and the release in .kernelvariables, which
        # Debian's kernel Makefile reads (CC=x86_64-linux-gnu-gcc-14, KERNELRELEASE): the source
        # gets them too.
        [[ ! -f $kdir/.kernelvariables ]] || cp "$kdir/.kernelvariables" "$cache/src/"
        echo "$stamp" >"$cache/src/.qcuda-stamp"
    fi
    rm -rf "$cache/kdir"
    mkdir -p "$cache/kdir/scripts" "$cache/kdir/rust"
    (
        cd "$cache/src"
        "${kmake[@]}" -s olddefconfig
        # The compilers must be the kernel's own: olddefconfig records what it finds. (Other
        # options may follow the build machine, e.g. what its OpenSSL supports; they do not
        # touch the Rust files.)
        local pick='^CONFIG_(RUST|RUSTC_|BINDGEN_|CC_VERSION_TEXT|GCC_VERSION|CC_IS_|LD_VERSION|AS_VERSION|CC_HAS_|RUSTC_HAS)'
        if ! diff -u <(grep -E "$pick" "$kdir/.config" | sort) <(grep -E "$pick" .config | sort) >&2; then
            die "olddefconfig changed the kernel's compiler settings (above): rustc, bindgen or gcc differ from the kernel's"
        fi
        diff <(grep '^CONFIG_' "$kdir/.config" | sort) <(grep '^CONFIG_' .config | sort) | sed -n 's/^[<>] /  other option differs: /p' >&2 || true
        "${kmake[@]}" -s -j"$jobs" prepare
    ) >&2 || die "preparing the Rust build files failed"
    [[ -f $cache/src/scripts/target.json && -f $cache/src/rust/libkernel.rmeta ]] ||
        die "make prepare left no scripts/target.json or rust/libkernel.rmeta"
    # A tree of links to the headers, with the prepared files where the headers lack them.
    link_entries "$real" "$cache/kdir" scripts rust
    link_entries "$(readlink -f "$real/scripts")" "$cache/kdir/scripts" target.json
    [[ ! -d $real/rust ]] || link_entries "$(readlink -f "$real/rust")" "$cache/kdir/rust"
    cp "$cache/src/scripts/target.json" "$cache/kdir/scripts/"
    # A headers Makefile that names its own folder as the output tree (Debian's sets
    # KBUILD_OUTPUT) must name this one instead, or kbuild looks for the Rust files there.
    if grep -qF "$real" "$real/Makefile"; then
        rm "$cache/kdir/Makefile"
        sed "s|$real|$cache/kdir|g" "$real/Makefile" >"$cache/kdir/Makefile"
    fi
    cp "$cache"/src/rust/*.rmeta "$cache"/src/rust/*.so "$cache/kdir/rust/"
    rm -rf "$cache/src"
    echo "$stamp" >"$cache/.complete"
    say "Rust build files of $rel prepared in $((SECONDS - t0)) s"
    echo "$cache/kdir"
}

if [[ -f $kdir/scripts/target.json && -f $kdir/rust/libkernel.rmeta ]]; then
    build=$kdir
else
    build=$(prepare_kbuild)
fi
say "building qcuda.ko for $rel against $build with $have"
"${kmake[@]}" -C "$build" M="$src_root/guest-kmod" -j"$jobs" modules

#!/usr/bin/env bash
# install-guest.sh: installs qcuda's guest side into a guest's root file system, the way a
# distribution package would, so that CUDA programs run without LD_LIBRARY_PATH and qcuda.ko
# loads at boot:
#
#   /usr/lib/qcuda/libcudart.so.13, libcuda.so.1, libnvidia-ml.so.1
#                                                 guest-lib (runtime, driver and NVML faces)
#   /usr/lib/qcuda/libcuda.so, libnvidia-ml.so    links to those, as NVIDIA's driver has them
#   /etc/ld.so.conf.d/qcuda.conf                  registers /usr/lib/qcuda; then ldconfig
#   /usr/lib/udev/rules.d/70-qcuda.rules          /dev/nvidiactl, a link to /dev/qcuda (JAX
#                                                 looks for it before it starts CUDA)
#   /lib/modules/<release>/extra/qcuda.ko         the module built for <release>; then depmod
#   /etc/modules-load.d/qcuda.conf                "qcuda": loaded at boot (systemd-modules-load,
#                                                 or our initramfs's /init)
#   /usr/bin/qcuda-smi                            the guest CLI
#   /usr/src/qcuda-<version>/                     the module's source and dkms.conf: DKMS
#                                                 rebuilds it for other kernels with CONFIG_RUST
#
#   scripts/install-guest.sh [--root DIR] [options]
#
# Options:
#   --root DIR       install into DIR (a guest image being assembled) instead of /: runs
#                    `ldconfig -r DIR` and `depmod -b DIR <release>` there, and leaves DKMS to
#                    the guest (`dkms install qcuda/<version>` in it)
#   --lib-dir DIR    where libcudart.so.13 and libcuda.so.1 are (default: guest-lib/build.sh's
#                    output, <target>/qcuda, built if missing)
#   --module FILE    qcuda.ko (default build/guest/qcuda.ko); its release is read from its
#                    vermagic
#   --smi FILE       qcuda-smi (default <target>/release/qcuda-smi, built if missing)
#   --no-dkms        do not register the DKMS source (with --root: do not install it either)
#   --package        with --root: lay out a package's files only (scripts/build-guest-deb.sh):
#                    no qcuda.ko (DKMS builds it where the package is installed), no ldconfig,
#                    no depmod (its maintainer scripts and triggers do that)
#
# Installing into / (in a guest, as root) also runs ldconfig and depmod, and, where dkms is
# installed, `dkms add` and, when the running kernel is not the one qcuda.ko was built for,
# `dkms install` for the running kernel. docs/guest-install.md says more.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
say() { printf '[install-guest] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

dest=/ lib_dir="" module=build/guest/qcuda.ko smi="" dkms=1 package=0
while (($#)); do
    case $1 in
    --root) dest=$2; shift 2 ;;
    --lib-dir) lib_dir=$2; shift 2 ;;
    --module) module=$2; shift 2 ;;
    --smi) smi=$2; shift 2 ;;
    --no-dkms) dkms=0; shift ;;
    --package) package=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1" ;;
    esac
done
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
target=${CARGO_TARGET_DIR:-$ROOT/target}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[[ -n $version ]] || die "no version in Cargo.toml"

if [[ -z $lib_dir ]]; then
    lib_dir=$target/qcuda
    [[ -f $lib_dir/libcudart.so.13 && -f $lib_dir/libcuda.so.1 && -f $lib_dir/libnvidia-ml.so.1 ]] ||
        guest-lib/build.sh >/dev/null
fi
if [[ -z $smi ]]; then
    smi=$target/release/qcuda-smi
    [[ -x $smi ]] || cargo build --release -q -p qcuda-smi
fi
((package == 0)) || [[ $dest != / ]] || die "--package needs --root"
((package == 0)) || module=""
for f in "$lib_dir/libcudart.so.13" "$lib_dir/libcuda.so.1" "$lib_dir/libnvidia-ml.so.1" ${module:+"$module"} "$smi"; do
    [[ -f $f ]] || die "$f is missing (scripts/build-guest.sh, scripts/build-payload.sh build it)"
done
if [[ -n $module ]]; then
    # The release the module was built for: the first word of its vermagic ("7.3.4 SMP preempt ...").
    release=$(modinfo -F vermagic "$module" | cut -d' ' -f1)
    [[ -n $release ]] || die "$module has no vermagic"
fi

# The libraries: one folder, registered with the dynamic loader. libcudart.so.13 forwards into
# libcuda.so.1 (one core, one session per process), which the loader finds in the same folder.
install -D -m 755 "$lib_dir/libcudart.so.13" "$dest/usr/lib/qcuda/libcudart.so.13"
install -D -m 755 "$lib_dir/libcuda.so.1" "$dest/usr/lib/qcuda/libcuda.so.1"
install -D -m 755 "$lib_dir/libnvidia-ml.so.1" "$dest/usr/lib/qcuda/libnvidia-ml.so.1"
# The unversioned names, as NVIDIA's driver installs them: Numba opens libcuda.so before
# libcuda.so.1, and older Triton links with -lcuda (docs/guest-install.md).
ln -sfn libcuda.so.1 "$dest/usr/lib/qcuda/libcuda.so"
ln -sfn libnvidia-ml.so.1 "$dest/usr/lib/qcuda/libnvidia-ml.so"
install -d "$dest/etc/ld.so.conf.d"
printf '# qcuda: the CUDA runtime and driver that reach the host GPU through /dev/qcuda\n/usr/lib/qcuda\n' \
    >"$dest/etc/ld.so.conf.d/qcuda.conf"
# A distribution has this file already; a bare image being assembled needs Debian's.
((package)) || [[ -f $dest/etc/ld.so.conf ]] || printf 'include /etc/ld.so.conf.d/*.conf\n' >"$dest/etc/ld.so.conf"

# The module: where depmod looks for out-of-tree modules, and named for loading at boot.
[[ -z $module ]] || install -D -m 644 "$module" "$dest/lib/modules/$release/extra/qcuda.ko"
install -d "$dest/etc/modules-load.d"
printf '# qcuda: /dev/qcuda, the transport to the host GPU (virtio device 1af4:1078)\nqcuda\n' \
    >"$dest/etc/modules-load.d/qcuda.conf"

install -D -m 755 "$smi" "$dest/usr/bin/qcuda-smi"
# /dev/nvidiactl: JAX starts its CUDA backend only where one of NVIDIA's device nodes exists.
install -D -m 644 deploy/udev/70-qcuda.rules "$dest/usr/lib/udev/rules.d/70-qcuda.rules"

# DKMS: the module's source in the layout its Makefile expects, with the configuration.
src=$dest/usr/src/qcuda-$version
if ((dkms)); then
    rm -rf "$src"
    install -d "$src/guest-kmod" "$src/qcuda-proto/src" "$src/scripts"
    for f in guest-kmod/Kbuild guest-kmod/Makefile guest-kmod/*.rs guest-kmod/*.c; do
        install -m 644 "$f" "$src/$f"
    done
    install -m 755 guest-kmod/dkms-build.sh "$src/guest-kmod/dkms-build.sh"
    install -m 644 qcuda-proto/src/wire.rs "$src/qcuda-proto/src/wire.rs"
    install -m 644 scripts/lib.sh "$src/scripts/lib.sh"
    sed "s/@VERSION@/$version/" guest-kmod/dkms.conf >"$src/dkms.conf"
fi

if ((package)); then
    say "laid out qcuda $version's package files in $dest"
    exit 0
elif [[ $dest == / ]]; then
    ldconfig
    depmod -a "$release"
    if ((dkms)) && command -v dkms >/dev/null; then
        dkms status -m qcuda -v "$version" | grep -q . || dkms add -m qcuda -v "$version"
        running=$(uname -r)
        if [[ $running != "$release" ]]; then
            say "running kernel $running, qcuda.ko was built for $release: dkms builds it for $running"
            dkms install -m qcuda -v "$version" -k "$running"
        fi
    fi
else
    # Against the image, not this machine: its cache, its modules.dep.
    ldconfig -r "$dest"
    # A kernel's modules_install writes these; an image holding only our module has none, and
    # depmod warns about each (empty ones mean: nothing built in, no other module).
    for f in modules.order modules.builtin modules.builtin.modinfo; do
        [[ -e $dest/lib/modules/$release/$f ]] || : >"$dest/lib/modules/$release/$f"
    done
    depmod -b "$dest" "$release"
fi
say "installed qcuda $version into $dest (kernel $release)"

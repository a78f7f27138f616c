#!/usr/bin/env bash
# build-guest-deb.sh: builds the guest package, build/deb/qcuda-guest_<version>_amd64.deb, with
# dpkg-deb from the files scripts/install-guest.sh lays out (--package) and the maintainer
# scripts of deploy/deb/:
#
#   /usr/lib/qcuda/libcudart.so.13, libcuda.so.1, libnvidia-ml.so.1   guest-lib
#   /usr/lib/qcuda/libcuda.so, libnvidia-ml.so   links to those (as NVIDIA's driver has them)
#   /usr/lib/udev/rules.d/70-qcuda.rules   /dev/nvidiactl, a link to /dev/qcuda (JAX's check)
#   /etc/ld.so.conf.d/qcuda.conf      registers /usr/lib/qcuda (ldconfig runs by libc-bin's trigger)
#   /etc/modules-load.d/qcuda.conf    qcuda.ko loaded at boot
#   /usr/bin/qcuda-smi                the guest CLI
#   /usr/src/qcuda-<version>/         the module's source and dkms.conf: postinst has DKMS build
#                                     it for every installed kernel with Rust support and headers
#                                     (guest-kmod/dkms-build.sh prepares the Rust build files
#                                     that Debian's headers lack); prerm removes it from DKMS
#
# Prints the .deb's path last. Builds guest-lib and qcuda-smi first if they are missing.
# See docs/guest-install.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
say() { printf '[build-guest-deb] %s\n' "$*" >&2; }
OUT=$ROOT/build/deb
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

scripts/install-guest.sh --root "$stage/root" --package
install -d "$stage/root/DEBIAN" "$stage/root/usr/share/doc/qcuda-guest"
install -m 644 deploy/deb/copyright "$stage/root/usr/share/doc/qcuda-guest/copyright"
for f in postinst prerm postrm; do
    sed "s/@VERSION@/$version/" "deploy/deb/$f" >"$stage/root/DEBIAN/$f"
    chmod 755 "$stage/root/DEBIAN/$f"
done
install -m 644 deploy/deb/triggers "$stage/root/DEBIAN/triggers"
(cd "$stage/root" && find etc -type f | sed 's|^|/|' | sort) >"$stage/root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage/root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" deploy/deb/control.in >"$stage/root/DEBIAN/control"
(cd "$stage/root" && find . -path ./DEBIAN -prune -o -type f -print0 | LC_ALL=C sort -z |
    xargs -0 md5sum | sed 's|  \./|  |') >"$stage/root/DEBIAN/md5sums"
mkdir -p "$OUT"
deb=$OUT/qcuda-guest_${version}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$stage/root" "$deb" >&2
say "$(dpkg-deb -f "$deb" Package Version | tr '\n' ' ')($(du -h "$deb" | cut -f1))"
echo "$deb"

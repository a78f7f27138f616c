#!/usr/bin/env bash
# build-disk-image.sh: a small Debian 13 (trixie) guest that boots from its own disk, with qcuda
# installed the way docs/guest-install.md tells a user to, into build/disk/:
#
#   qcuda-trixie.qcow2            the root file system (ext4 on the whole disk, /dev/vda):
#                                 systemd, the stock trixie-backports kernel with its headers
#                                 and linux-source, and qcuda-guest installed from its .deb
#                                 (scripts/build-guest-deb.sh), so DKMS built qcuda.ko in it
#   qcuda-trixie-vmlinuz          the image's kernel and Debian's initrd (initramfs-tools), for
#   qcuda-trixie-initrd.img       QEMU's direct kernel boot (the image has no boot loader)
#   versions.txt                  what went in
#
# The installation is docs/guest-install.md's own block (the one marked
# "qcuda-walkthrough:install"), run as printed in a clean folder that holds only the .deb, inside
# the image as it is assembled (mmdebstrap, from Debian's archive only): so building the image
# is also the test that the walkthrough reaches a built module. scripts/test.sh then boots it
# (run-vm.sh --disk, run-libvirt.sh --disk) and runs the walkthrough's check block and
# tests/guest/check-disk in it.
#
#   scripts/build-disk-image.sh [--keys]
#
# For the test harness the image also has qcuda-vm-command.service: when QEMU passes a command
# through fw_cfg (opt/qcuda/cmd, as run-vm.sh --disk does), it runs it on the serial console,
# prints QCUDA_EXIT=<rc> and powers off; without one the image boots normally. The serial
# console has no login (no root password is set).
#
# Two caches: the installed system as a folder, ~/.cache/qcuda/disk-base-<hash> (about 2.5 GiB),
# keyed by the doc's block and this script's code, made from scratch with the .deb of that
# moment; and the image, ~/.cache/qcuda/disk-<hash>, keyed by that and the current .deb. A newer
# .deb goes onto the folder with `dpkg -i` (an upgrade, as a user's: DKMS rebuilds the module
# from the Rust build files it prepared, in about a minute) through an overlay, so a code change
# costs a minute and an image, not a new system. As root; needs mmdebstrap, mke2fs (e2fsprogs)
# and qemu-img. See docs/guest-install.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
# shellcheck source=scripts/trixie-root.sh
source scripts/trixie-root.sh
OUT=$ROOT/build/disk
NAME=qcuda-trixie
log() { printf '[build-disk-image] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
(($(id -u) == 0)) || die "run as root (mmdebstrap)"

# A block of docs/guest-install.md: the fenced block after the line <!-- qcuda-walkthrough:NAME -->.
doc_block() {
    awk -v tag="<!-- qcuda-walkthrough:$1 -->" '
        $0 == tag { want = 1; next }
        want && /^```/ { if (inblock) exit; inblock = 1; next }
        inblock { print }' docs/guest-install.md
}

deb=$(scripts/build-guest-deb.sh | tail -n 1)
install_block=$(doc_block install)
[[ -n $install_block ]] || die "docs/guest-install.md has no qcuda-walkthrough:install block"

# The harness's command runner (see the header).
runner=$(cat <<'EOF'
#!/bin/sh
# qcuda-vm-command: runs the command QEMU passes through fw_cfg (opt/qcuda/cmd) on the serial
# console, after copying the files passed with it (opt/qcuda/addN to the path in addN.path);
# prints QCUDA_EXIT=<rc> and powers off. Nothing passed: nothing done.
modprobe qemu_fw_cfg 2>/dev/null
d=/sys/firmware/qemu_fw_cfg/by_name/opt/qcuda
[ -r "$d/cmd/raw" ] || exit 0
exec </dev/null >/dev/ttyS0 2>&1
n=0
while [ -r "$d/add$n/raw" ]; do
	p=$(cat "$d/add$n.path/raw")
	mkdir -p "$(dirname "$p")" && cat "$d/add$n/raw" >"$p" && chmod 755 "$p"
	n=$((n + 1))
done
cd /root
sh -c "$(cat "$d/cmd/raw")"
echo "QCUDA_EXIT=$?"
systemctl poweroff --no-block
EOF
)
unit=$(cat <<'EOF'
[Unit]
Description=Run the command QEMU passes through fw_cfg (qcuda test harness)
After=multi-user.target
ConditionVirtualization=vm

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/qcuda-vm-command

[Install]
WantedBy=multi-user.target
EOF
)

basekey=$({
    echo "$install_block" "$runner" "$unit"
    declare -f trixie_mmdebstrap
    sed -n '/^# --- base ---/,/^# --- image ---/p' "$0"
} | sha256sum | cut -c1-16)
base=$QCUDA_CACHE/disk-base-$basekey
# The .deb by its contents (its control files, md5sums of every file included), not its bytes,
# which hold build times.
debsum=$(d=$(mktemp -d) && dpkg-deb -e "$deb" "$d" && cat "$d"/* | sha256sum | cut -c1-16 && rm -rf "$d")
key=$({
    echo "$basekey $debsum"
    sed -n '/^# --- image ---/,$p' "$0"
} | sha256sum | cut -c1-16)
cache=$QCUDA_CACHE/disk-$key
# --keys: print the two cache folders (the installed system, the image) and stop.
[[ ${1:-} != --keys ]] || { echo "$base $cache"; exit 0; }

# --- base ---
make_base() { # base dir: the walkthrough, from scratch, into base/root
    local c=$1 r=$1/root kb
    kb=$(kbuild_shared)
    rm -rf "$c"
    mkdir -p "$c"
    printf '%s\n' "$install_block" >"$c/walkthrough-install.sh"
    # The walkthrough in the new system, as root in the folder that holds only the .deb, with
    # the .deb files of ~/.cache/qcuda/trixie-debs in apt's cache (what it downloads goes back
    # there). The Rust build files prepared for a kernel release are shared with
    # scripts/build-stock-guest.sh (~/.cache/qcuda/kbuild, bound at the image's
    # /var/cache/qcuda/kbuild while the walkthrough runs): DKMS finds them prepared when that
    # release's were (the same headers, source, rustc and bindgen: dkms-build.sh checks its
    # stamp), else prepares them there. The image keeps a copy of its kernels' (a later dpkg -i
    # rebuilds from them).
    cat >"$c/walkthrough-run.sh" <<'EOF'
set -euo pipefail
r=$1 kb=$2
mkdir -p "$r/var/cache/qcuda/kbuild"
unshare --mount --propagation private -- sh -c '
    mount --bind "$2" "$1/var/cache/qcuda/kbuild" &&
    chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive \
        bash -euxo pipefail -c "cd /root/walkthrough && . /root/qcuda-walkthrough-install.sh"' sh "$r" "$kb"
for d in "$r"/lib/modules/*; do
    rel=$(basename "$d")
    if [[ -f $kb/$rel/.complete ]]; then cp -a "$kb/$rel" "$r/var/cache/qcuda/kbuild/"; fi
done
EOF
    printf '%s\n' "$runner" >"$c/qcuda-vm-command"
    printf '%s\n' "$unit" >"$c/qcuda-vm-command.service"
    # A plain trixie system (no backports yet: the walkthrough adds them, as a user does).
    QCUDA_TRIXIE_SUITES="trixie trixie-updates trixie-security" \
        trixie_mmdebstrap "$r" --variant=important --include=systemd-sysv,udev,kmod,initramfs-tools,ca-certificates \
        --customize-hook="mkdir -p \"\$1/root/walkthrough\" && cp '$deb' \"\$1/root/walkthrough/\"" \
        --customize-hook="cp '$c/walkthrough-install.sh' \"\$1/root/qcuda-walkthrough-install.sh\"" \
        --customize-hook="cp -l '$QCUDA_TRIXIE_DEBS'/*.deb \"\$1/var/cache/apt/archives/\" 2>/dev/null || true" \
        --customize-hook="bash '$c/walkthrough-run.sh' \"\$1\" '$kb' </dev/null" \
        --customize-hook="cp -ln \"\$1\"/var/cache/apt/archives/*.deb '$QCUDA_TRIXIE_DEBS/' 2>/dev/null; rm -f \"\$1\"/var/cache/apt/archives/*.deb" \
        --customize-hook="rm -rf \"\$1/root/walkthrough\" \"\$1/root/qcuda-walkthrough-install.sh\"" \
        --customize-hook="install -m 755 '$c/qcuda-vm-command' \"\$1/usr/local/sbin/qcuda-vm-command\"" \
        --customize-hook="install -m 644 '$c/qcuda-vm-command.service' \"\$1/etc/systemd/system/qcuda-vm-command.service\"" \
        --customize-hook='chroot "$1" systemctl enable qcuda-vm-command.service' \
        --customize-hook='chroot "$1" systemctl mask serial-getty@ttyS0.service' \
        --customize-hook='echo qcuda-guest >"$1/etc/hostname"' \
        --customize-hook='printf "/dev/vda / ext4 defaults,errors=remount-ro 0 1\n" >"$1/etc/fstab"' \
        >"$c/mmdebstrap.log" 2>&1 || { tail -n 40 "$c/mmdebstrap.log" >&2; die "mmdebstrap failed ($c/mmdebstrap.log)"; }
    echo "$debsum" >"$c/deb.sha"
    touch "$c/.qcuda-complete"
}

# --- image ---
# In a mount namespace: the base under an overlay, the current .deb installed over it with dpkg
# when it is not the one the base has, the image written from that view.
image_from_base() { # base dir, image dir
    local b=$1 c=$2 m=$2/merged
    mkdir -p "$c/upper/tmp" "$c/work" "$m"
    cp "$deb" "$c/upper/tmp/"
    unshare --mount --propagation private -- bash -euo pipefail -c '
        b=$1 c=$2 m=$2/merged deb=$3 name=$4 same=$5
        mount -t overlay overlay -o "lowerdir=$b/root,upperdir=$c/upper,workdir=$c/work" "$m"
        if [ "$same" != 1 ]; then
            mount -t proc proc "$m/proc" && mount --rbind /dev "$m/dev" && mount --rbind /sys "$m/sys"
            echo "dpkg -i $deb over the base"
            chroot "$m" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root dpkg -i "/tmp/$deb"
            umount -l "$m/proc" "$m/dev" "$m/sys"
        fi
        rm -f "$m/tmp/$deb"
        rel=$(ls "$m/lib/modules" | sort -V | tail -n 1)
        ls "$m/lib/modules/$rel/updates/dkms/qcuda.ko"* >/dev/null || { echo "DKMS left no qcuda.ko for $rel"; exit 1; }
        cp "$m/boot/vmlinuz-$rel" "$c/$name-vmlinuz"
        cp "$m/boot/initrd.img-$rel" "$c/$name-initrd.img"
        {
            echo "kernelrelease: $rel"
            for p in linux-image-$rel linux-headers-$rel linux-source rustc rust-src bindgen dkms qcuda-guest; do
                echo "$p: $(chroot "$m" dpkg-query -W -f="\${Version}" "$p" 2>/dev/null || echo -)"
            done
            echo "dkms status: $(chroot "$m" dkms status qcuda 2>&1 | tr "\n" " ")"
        } >"$c/versions.txt"
        # ext4 straight from the folder (no loop device), a quarter free.
        mib=$(( $(du -sm "$m" | cut -f1) * 5 / 4 + 256 ))
        t0=$SECONDS
        mke2fs -q -t ext4 -L qcuda-root -d "$m" "$c/$name.raw" "${mib}M"
        echo "mke2fs -d: $((SECONDS - t0)) s"
    ' bash "$b" "$c" "$(basename "$deb")" "$NAME" "$([[ $(cat "$b/deb.sha") == "$debsum" ]] && echo 1 || echo 0)"
    # zlib (QEMU reads it without libzstd), clusters compressed in parallel (-m 4 -W): about a
    # minute where one stream took four.
    local t0=$SECONDS
    qemu-img convert -c -m 4 -W -O qcow2 "$c/$NAME.raw" "$c/$NAME.qcow2"
    echo "qemu-img convert -c: $((SECONDS - t0)) s"
    rm -rf "$c/$NAME.raw" "$c/upper" "$c/work" "$m"
    touch "$c/.qcuda-complete"
}

exec 9>"$base.lock"
flock 9
qcuda_cache_prune disk-base "$base"
if [[ ! -f $base/.qcuda-complete ]]; then
    log "building $base: the walkthrough from scratch (mmdebstrap, apt, dpkg, DKMS; ~10 min on 2 busy cores with the Rust build files prepared)"
    t0=$SECONDS
    make_base "$base"
    log "base built in $((SECONDS - t0)) s"
fi
exec 8>"$cache.lock"
flock 8
qcuda_cache_prune disk "$cache"
if [[ -f $cache/.qcuda-complete ]]; then
    log "cached: $cache"
else
    log "building $cache from $base$([[ $(cat "$base/deb.sha") == "$debsum" ]] || echo ' with the current .deb (dpkg -i over it)')"
    t0=$SECONDS
    rm -rf "$cache"
    mkdir -p "$cache"
    image_from_base "$base" "$cache" >"$cache/image.log" 2>&1 || { tail -n 30 "$cache/image.log" >&2; die "the image failed ($cache/image.log)"; }
    log "image built in $((SECONDS - t0)) s ($(grep -E '^(mke2fs|qemu-img)' "$cache/image.log" | tr '\n' ' '))"
fi
flock -u 8
flock -u 9
mkdir -p "$OUT"
for f in "$NAME.qcow2" "$NAME-vmlinuz" "$NAME-initrd.img" versions.txt; do
    rm -f "$OUT/$f"
    ln "$cache/$f" "$OUT/$f" 2>/dev/null || cp "$cache/$f" "$OUT/$f"
done
sed 's/^/[build-disk-image]   /' "$OUT/versions.txt" >&2
(cd "$OUT" && ls -l "$NAME.qcow2" "$NAME-vmlinuz" "$NAME-initrd.img") | sed 's/^/[build-disk-image]   /' >&2
echo "$OUT/$NAME.qcow2"

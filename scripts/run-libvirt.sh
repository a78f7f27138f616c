#!/usr/bin/env bash
# run-libvirt.sh: runs one command in the qcuda guest as a libvirt domain and returns its exit
# code, like run-vm.sh but with libvirt starting QEMU (deploy/libvirt/qcuda-vm.xml).
#
#   scripts/run-libvirt.sh [options] -- 'command in the guest'
#
# As root, on Debian 12 with libvirt-daemon, libvirt-daemon-driver-qemu and libvirt-clients
# (scripts/setup.sh installs them, without libvirt-daemon-system, which would pull systemd).
# What it does, each step skipped where it is already so:
#   - makes the kvm group and the libvirt-qemu user (libvirt runs QEMU as libvirt-qemu:kvm),
#     and gives /dev/kvm to the kvm group where no udev did;
#   - writes /etc/libvirt/qemu.conf if there is none: that user and group, and
#     stdio_handler = "file", because nothing starts virtlogd here;
#   - starts libvirtd (no systemd needed) and stops it again at the end;
#   - starts vhost-cuda on /run/qcuda/NAME.sock, rw for the kvm group (as vhost-cuda@.service
#     makes it), unless --socket names a running daemon's socket;
#   - copies the guest kernel and an initrd (the guest's initramfs, payload and the command, as
#     run-vm.sh builds it) to /var/lib/libvirt/qcuda/NAME, where libvirt may relabel them, and
#     QEMU to /var/lib/libvirt/qcuda/qemu-HASH if libvirt-qemu cannot reach build/qemu;
#   - `virsh define`s the domain from the template with those paths, `virsh start`s it, streams
#     the guest console, waits for it to power off, and undefines it.
#
# Options:
#   --name NAME        domain name (default qcuda-run-PID)
#   --socket PATH      use this vhost-cuda socket instead of starting a daemon
#   --daemon-arg ARG   extra vhost-cuda argument (repeatable)
#   --mem MIB          guest RAM in MiB (default 3072)
#   --payload FILE     an extra .cpio.gz unpacked after the payload (repeatable), e.g.
#                      build/guest/installed.cpio.gz, the installed guest (install-guest.sh)
#   --disk IMAGE       boot a Debian disk image (scripts/build-disk-image.sh) with its own
#                      kernel and initrd instead of qcuda's initramfs: a qcow2 overlay on it
#                      (the image stays unchanged), the command through fw_cfg (<sysinfo
#                      type='fwcfg'>), as run-vm.sh --disk does; --payload does not apply
#   --add SRC:DEST     with --disk: put file SRC at DEST in the guest (fw_cfg; repeatable)
#   --log-dir DIR      keep domain.xml, serial.log, qemu.log (libvirt's), daemon.log here
#   --timeout SECONDS  whole-run limit (default 600); exit 124 when hit
#
# Exit codes: the guest command's; 124 timeout; 125 setup or boot failure (no exit line).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QEMU_DIR=${QCUDA_QEMU_DIR:-$ROOT/build/qemu}
GUEST_DIR=$ROOT/build/guest
DAEMON=${QCUDA_DAEMON:-$ROOT/target/release/vhost-cuda}
TEMPLATE=$ROOT/deploy/libvirt/qcuda-vm.xml
URI=qemu:///system
QEMU_USER=libvirt-qemu QEMU_GROUP=kvm

name=qcuda-run-$$ ext_sock="" daemon_args=() payloads=() mem=3072 log_dir="" timeout=600 cmd="" disk="" adds=()
while (($#)); do
    case $1 in
    --name) name=$2; shift 2 ;;
    --socket) ext_sock=$2; shift 2 ;;
    --daemon-arg) daemon_args+=("$2"); shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --payload) payloads+=("$2"); shift 2 ;;
    --disk) disk=$(readlink -f "$2"); shift 2 ;;
    --add) adds+=("$2"); shift 2 ;;
    --log-dir) log_dir=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; cmd="$*"; break ;;
    *) echo "run-libvirt: unknown argument $1" >&2; exit 125 ;;
    esac
done

say() { printf '[run-libvirt] %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 125; }

[[ -n $cmd ]] || fail "no command (run-libvirt.sh -- 'command')"
for p in "${payloads[@]}"; do [[ -f $p ]] || fail "--payload $p: no such file"; done
[[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || fail "--name: letters, digits, '.', '_' and '-' only"
(($(id -u) == 0)) || fail "run as root (libvirt's system instance)"
for t in virsh libvirtd cpio; do command -v $t >/dev/null || fail "$t is missing (scripts/setup.sh)"; done
if [[ -n $disk ]]; then
    for f in "$disk" "${disk%.qcow2}-vmlinuz" "${disk%.qcow2}-initrd.img"; do
        [[ -f $f ]] || fail "--disk: $f is missing (scripts/build-disk-image.sh)"
    done
    ((${#payloads[@]} == 0)) || fail "--disk does not take --payload"
elif ((${#adds[@]})); then
    fail "--add needs --disk (run-vm.sh --add for the initramfs guest)"
fi
for f in "$QEMU_DIR/bin/qemu-system-x86_64" "$GUEST_DIR/bzImage" "$GUEST_DIR/initramfs.cpio.gz"; do
    [[ -e $f ]] || fail "$f is missing (scripts/build-qemu.sh, scripts/build-guest.sh)"
done
[[ -n $ext_sock ]] || [[ -x $DAEMON ]] || fail "$DAEMON is missing (cargo build --release -p vhost-cuda)"

work=/var/lib/libvirt/qcuda/$name
[[ -n $log_dir ]] || log_dir=$work/logs
libvirtd_pid="" daemon_pid="" defined=0
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if ((defined)); then
        virsh -c "$URI" destroy "$name" >/dev/null 2>&1 || true
        virsh -c "$URI" undefine "$name" >/dev/null 2>&1 || true
    fi
    # libvirt's own log of the QEMU it ran (command line, QEMU's stderr).
    cp "/var/log/libvirt/qemu/$name.log" "$log_dir/qemu.log" 2>/dev/null || true
    rm -f "/var/log/libvirt/qemu/$name.log"
    [[ -z $daemon_pid ]] || kill -TERM "$daemon_pid" 2>/dev/null || true
    [[ -z $libvirtd_pid ]] || kill -TERM "$libvirtd_pid" 2>/dev/null || true
    for pid in $daemon_pid $libvirtd_pid; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM
rm -rf "$work"
mkdir -p "$work/files" "$log_dir"
chmod 755 /var/lib/libvirt /var/lib/libvirt/qcuda "$work" "$work/files"

# --- the user libvirt runs QEMU as, and its configuration ---------------------------------------
getent group "$QEMU_GROUP" >/dev/null || groupadd --system "$QEMU_GROUP"
# Debian's libvirt looks the group libvirt-qemu up at start, whatever qemu.conf says.
getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
id "$QEMU_USER" >/dev/null 2>&1 ||
    useradd --system --gid "$QEMU_GROUP" --home-dir /var/lib/libvirt --no-create-home \
        --shell /usr/sbin/nologin "$QEMU_USER"
# Without udev, /dev/kvm stays root's 0600, where Debian's udev rules make it root:kvm 0660.
# libvirt then finds that QEMU's user cannot use KVM, unlike when it cached the emulator's
# capabilities, and probes the emulator again on every start (40 s under load here).
if [[ -c /dev/kvm ]] && [[ $(stat -c %g /dev/kvm) == 0 ]]; then
    chgrp "$QEMU_GROUP" /dev/kvm && chmod 0660 /dev/kvm
fi
if [[ ! -e /etc/libvirt/qemu.conf ]]; then
    mkdir -p /etc/libvirt
    cat >/etc/libvirt/qemu.conf <<EOF
# Written by qcuda's scripts/run-libvirt.sh (there was none: libvirt-daemon-system is not
# installed). QEMU runs as $QEMU_USER:$QEMU_GROUP; its output goes to files, since no virtlogd
# runs without systemd.
user = "$QEMU_USER"
group = "$QEMU_GROUP"
stdio_handler = "file"
EOF
    say "wrote /etc/libvirt/qemu.conf"
elif ! grep -Eq '^\s*stdio_handler\s*=\s*"file"' /etc/libvirt/qemu.conf && ! pgrep -x virtlogd >/dev/null; then
    say "warning: /etc/libvirt/qemu.conf lacks stdio_handler = \"file\" and no virtlogd runs; the domain may not start"
fi

# --- libvirtd -----------------------------------------------------------------------------------
if ! virsh -c "$URI" uri >/dev/null 2>&1; then
    libvirtd --pid-file="$work/libvirtd.pid" >"$log_dir/libvirtd.log" 2>&1 &
    libvirtd_pid=$!
    for _ in $(seq 100); do virsh -c "$URI" uri >/dev/null 2>&1 && break; sleep 0.1; done
    virsh -c "$URI" uri >/dev/null 2>&1 || { cat "$log_dir/libvirtd.log" >&2; fail "libvirtd did not start"; }
    say "started libvirtd (pid $libvirtd_pid)"
fi

# --- vhost-cuda ---------------------------------------------------------------------------------
if [[ -n $ext_sock ]]; then
    [[ -S $ext_sock ]] || fail "--socket $ext_sock: no such socket"
    sock=$ext_sock
else
    install -d -m 0750 -g "$QEMU_GROUP" /run/qcuda
    sock=/run/qcuda/$name.sock
    RUST_LOG=${RUST_LOG:-info} "$DAEMON" --socket-path "$sock" "${daemon_args[@]}" >"$log_dir/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 100); do
        [[ -S $sock ]] && break
        kill -0 "$daemon_pid" 2>/dev/null || { cat "$log_dir/daemon.log" >&2; fail "vhost-cuda exited"; }
        sleep 0.05
    done
    [[ -S $sock ]] || fail "vhost-cuda did not create $sock"
    chgrp "$QEMU_GROUP" "$sock"
    chmod 0660 "$sock"
fi
runuser -u "$QEMU_USER" -- test -w "$sock" || fail "$sock is not writable for $QEMU_USER (QEMU could not connect)"

# --- the guest's files ------------------------------------------------------------------------------
disk_xml="" fwcfg_xml="" cmdline=""
if [[ -n $disk ]]; then
    # The image's own kernel and initrd; a qcow2 overlay takes the run's writes.
    cp "${disk%.qcow2}-vmlinuz" "$work/files/bzImage"
    cp "${disk%.qcow2}-initrd.img" "$work/files/initrd.cpio.gz"
    qemu-img create -q -f qcow2 -F qcow2 -b "$disk" "$work/files/disk.qcow2"
    chown "$QEMU_USER:$QEMU_GROUP" "$work/files/disk.qcow2"
    printf '%s\n' "$cmd" >"$work/files/cmd"
    fwcfg_xml="<entry name='opt/qcuda/cmd' file='$work/files/cmd'/>"
    n=0
    for spec in "${adds[@]}"; do
        src=${spec%%:*} dest=${spec#*:}
        [[ -f $src ]] || fail "--add $spec: with --disk, files only"
        cp "$src" "$work/files/add$n"
        printf '%s' "$dest" >"$work/files/add$n.path"
        fwcfg_xml+="<entry name='opt/qcuda/add$n' file='$work/files/add$n'/><entry name='opt/qcuda/add$n.path' file='$work/files/add$n.path'/>"
        n=$((n + 1))
    done
    chmod 644 "$work"/files/*
    disk_xml="<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='$work/files/disk.qcow2'/><target dev='vda' bus='virtio'/></disk>"
    cmdline="root=/dev/vda rw console=ttyS0 quiet panic=-1"
    initrd=$work/files/initrd.cpio.gz
else
cp "$GUEST_DIR/bzImage" "$work/files/bzImage"
initrd=$work/files/initrd.cpio.gz
# As run-vm.sh: Linux unpacks concatenated archives, each at a 512-byte aligned offset.
: >"$initrd"
for piece in "$GUEST_DIR/initramfs.cpio.gz" "$GUEST_DIR/payload.cpio.gz" "${payloads[@]}"; do
    [[ -f $piece ]] || continue
    cat "$piece" >>"$initrd"
    truncate -s %512 "$initrd"
done
mkdir -p "$work/extra/qcuda"
printf '#!/bin/sh\n%s\n' "$cmd" >"$work/extra/qcuda/cmd"
chmod 755 "$work/extra/qcuda/cmd"
(cd "$work/extra" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 2>/dev/null) >>"$initrd"
fi
qemu_dir=$QEMU_DIR
if ! runuser -u "$QEMU_USER" -- test -x "$QEMU_DIR/bin/qemu-system-x86_64" ||
    ! runuser -u "$QEMU_USER" -- test -r "$QEMU_DIR/share/qemu/bios-256k.bin"; then
    # A copy kept across runs: libvirt probes a QEMU binary it has not seen (tens of seconds
    # under TCG load) and caches the answer by the binary's path and times.
    qemu_dir=/var/lib/libvirt/qcuda/qemu-$(sha256sum "$QEMU_DIR/bin/qemu-system-x86_64" | cut -c1-12)
    if [[ ! -e $qemu_dir/.complete ]]; then
        rm -rf "$qemu_dir"
        cp -rL "$QEMU_DIR" "$qemu_dir"
        touch "$qemu_dir/.complete"
    fi
fi
serial=$log_dir/serial.log
: >"$serial"
chown "$QEMU_USER:$QEMU_GROUP" "$serial"

# --- the domain ---------------------------------------------------------------------------------
xml=$log_dir/domain.xml
sed -e "s|<name>qcuda-vm0</name>|<name>$name</name>|" \
    -e "s|>3072</|>$mem</|g" \
    -e "s|/opt/qcuda/guest/bzImage|$work/files/bzImage|" \
    -e "s|/var/lib/libvirt/qcuda/qcuda-vm0.initrd|$initrd|" \
    -e "s|/var/log/libvirt/qemu/qcuda-vm0-serial.log|$serial|" \
    -e "s|/run/qcuda/qcuda-vm0.sock|$sock|" \
    -e "s|/opt/qcuda/qemu|$qemu_dir|g" \
    -e "/<qemu:env name='LD_LIBRARY_PATH'/d" \
    "$TEMPLATE" >"$xml"
if [[ -n $disk ]]; then
    sed -i -e "s|<cmdline>.*</cmdline>|<cmdline>$cmdline</cmdline>|" \
        -e "s|^  <devices>|  <devices>\n    $disk_xml|" \
        -e "s|^  <os>|  <sysinfo type='fwcfg'>$fwcfg_xml</sysinfo>\n  <os>|" "$xml"
fi
virsh -c "$URI" define "$xml" >/dev/null || fail "virsh define failed ($xml)"
defined=1
t0=$SECONDS
virsh -c "$URI" start "$name" >/dev/null || {
    cat "/var/log/libvirt/qemu/$name.log" >&2 2>/dev/null || true
    fail "virsh start failed"
}
say "domain $name started"

tail -n +1 -f "$serial" 2>/dev/null | sed -u -e 's/\r$//' -e '/^QCUDA_EXIT=/d' &
tail_pid=$!
deadline=$((SECONDS + timeout))
while [[ $(virsh -c "$URI" domstate "$name" 2>/dev/null) == running ]]; do
    if ((SECONDS >= deadline)); then
        say "timeout after ${timeout}s"
        kill "$tail_pid" 2>/dev/null || true
        exit 124
    fi
    sleep 0.2
done
sleep 0.2
kill "$tail_pid" 2>/dev/null || true
wait "$tail_pid" 2>/dev/null || true
say "domain $name ran for $((SECONDS - t0))s"
rc=$(tr -d '\r' <"$serial" | sed -n 's/^QCUDA_EXIT=\([0-9]\{1,3\}\)$/\1/p' | tail -n 1)
if [[ -z $rc ]]; then
    say "the guest ended without an exit line; libvirt's QEMU log said:"
    sed 's/^/  /' "/var/log/libvirt/qemu/$name.log" >&2 2>/dev/null || true
    exit 125
fi
exit "$rc"

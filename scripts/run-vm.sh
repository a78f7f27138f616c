#!/usr/bin/env bash
# run-vm.sh: start vhost-cuda on a fresh socket, boot the qcuda guest with the patched QEMU
# attached to it, run one command inside the guest, stream its output, and exit with its code.
#
#   scripts/run-vm.sh [options] [--] 'command line run by the guest shell'
#   scripts/run-vm.sh [options]                    # no command: interactive guest shell
#
# Options:
#   --add SRC:DEST     put host file or directory SRC at DEST in the guest (repeatable);
#                      it travels as an extra initramfs archive (see docs/running.md)
#   --payload FILE     an extra .cpio.gz unpacked over the base initramfs (repeatable)
#   --share HOSTDIR:GUESTDIR[:ro]   share host directory HOSTDIR into the guest at GUESTDIR over
#                      virtiofs (one virtiofsd each; repeatable); :ro makes it read-only
#   --chroot GUESTDIR  run the command (or the shell) chrooted into GUESTDIR, a shared host root
#                      (e.g. --share /:/mnt/host:ro --chroot /mnt/host): an in-RAM overlay over
#                      it, with the guest's /proc, /sys, /dev and qcuda's files mounted in front
#   --no-payload       do not add the default payload (guest-lib, qcuda-smi, CUDA tests)
#   --kernel own|stock which kernel boots our initramfs (default own, or $QCUDA_KERNEL): own is
#                      our Linux build (build/guest/bzImage); stock is Debian's kernel with
#                      qcuda.ko built against its headers and the stock modules the guest needs
#                      (scripts/build-stock-guest.sh: build/stock/, in the bundle guest/stock/)
#   --disk IMAGE       boot a Debian disk image (scripts/build-disk-image.sh) instead of our
#                      initramfs: its own kernel and initrd (IMAGE's -vmlinuz and -initrd.img
#                      beside it), systemd, the qcuda-guest package; the command reaches it
#                      through fw_cfg, and --add files too (files only); the image is not
#                      changed (snapshot=on). --payload, --share and --kernel do not apply
#   --no-device        boot without vhost-cuda and the qcuda device
#   --socket PATH      attach to an already running vhost-cuda on PATH instead of starting one
#   --reconnect MS     with --socket: QEMU reconnects to the daemon MS ms after losing it
#   --daemon-arg ARG   extra argument for vhost-cuda (repeatable)
#   --qemu-arg ARG     extra argument for QEMU (repeatable), e.g. a monitor socket
#                      (-monitor unix:PATH,server=on,wait=off) or -incoming for the destination of
#                      a live migration (scripts/test-migration.sh)
#   --virtiofsd-arg ARG  extra argument for every virtiofsd (repeatable)
#   --log-dir DIR      keep logs there: daemon.log, serial.log, virtiofsd-N.log (default: a
#                      temp dir, removed)
#   --mem SIZE         guest RAM (default 3G; memfd, share=on)
#   --smp N            guest CPUs (default 2)
#   --accel auto|tcg|kvm   auto = KVM only if a probe boot with KVM works here, else TCG
#   --timeout SECONDS  whole-run limit (default 900); exit 124 when hit
#
# Works from the repo (build/qemu, build/guest, target/release/vhost-cuda, build/virtiofsd) and
# from an unpacked release bundle (scripts/bundle.sh), which has the same files under its own
# root. QCUDA_VIRTIOFSD_SANDBOX picks virtiofsd's --sandbox (default: chroot as root, else none).
# Exit codes: the guest command's code; 124 timeout; 125 setup or boot failure (no exit line).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $here/guest/bzImage ]]; then # release bundle layout
    ROOT=$here
    QEMU_DIR=$ROOT/qemu
    GUEST_DIR=$ROOT/guest
    STOCK_DIR=$ROOT/guest/stock
    DAEMON=$ROOT/bin/vhost-cuda
    VIRTIOFSD=$ROOT/bin/virtiofsd
    export LD_LIBRARY_PATH_QEMU=$ROOT/qemu/lib
else # repo layout
    ROOT=$(cd "$here/.." && pwd)
    QEMU_DIR=$ROOT/build/qemu
    GUEST_DIR=$ROOT/build/guest
    STOCK_DIR=$ROOT/build/stock
    DAEMON=$ROOT/target/release/vhost-cuda
    VIRTIOFSD=$ROOT/build/virtiofsd/bin/virtiofsd
    LD_LIBRARY_PATH_QEMU=
fi
QEMU=${QCUDA_QEMU:-$QEMU_DIR/bin/qemu-system-x86_64}
DAEMON=${QCUDA_DAEMON:-$DAEMON}
VIRTIOFSD=${QCUDA_VIRTIOFSD:-$VIRTIOFSD}
CACHE=${QCUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qcuda}

adds=() payloads=() daemon_args=() qemu_args=() shares=() virtiofsd_args=() chroot_dir="" log_dir="" mem=3G smp=2 accel=${QCUDA_ACCEL:-auto}
timeout=900 use_device=1 use_payload=1 cmd="" ext_sock="" reconnect="" kernel=${QCUDA_KERNEL:-own} disk=""
while (($#)); do
    case $1 in
    --add) adds+=("$2"); shift 2 ;;
    --payload) payloads+=("$2"); shift 2 ;;
    --share) shares+=("$2"); shift 2 ;;
    --chroot) chroot_dir=$2; shift 2 ;;
    --virtiofsd-arg) virtiofsd_args+=("$2"); shift 2 ;;
    --no-payload) use_payload=0; shift ;;
    --kernel) kernel=$2; shift 2 ;;
    --disk) disk=$2; shift 2 ;;
    --no-device) use_device=0; shift ;;
    --socket) ext_sock=$2; shift 2 ;;
    --reconnect) reconnect=$2; shift 2 ;;
    --daemon-arg) daemon_args+=("$2"); shift 2 ;;
    --qemu-arg) qemu_args+=("$2"); shift 2 ;;
    --log-dir) log_dir=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; cmd="$*"; break ;;
    -*) echo "run-vm: unknown option $1" >&2; exit 125 ;;
    *) cmd="$*"; break ;;
    esac
done

say() { printf '[run-vm] %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 125; }

case $kernel in
own) KERNEL_IMAGE=$GUEST_DIR/bzImage base=("$GUEST_DIR/initramfs.cpio.gz") ;;
# The stock modules and the stock-built qcuda.ko go right after the base initramfs, whose own
# /lib/modules/qcuda.ko they replace (a later archive's file wins).
stock) KERNEL_IMAGE=$STOCK_DIR/vmlinuz base=("$GUEST_DIR/initramfs.cpio.gz" "$STOCK_DIR/modules.cpio.gz")
    [[ -e $KERNEL_IMAGE ]] || fail "$KERNEL_IMAGE is missing (scripts/build-stock-guest.sh)" ;;
*) fail "--kernel must be own or stock" ;;
esac
disk_initrd=""
if [[ -n $disk ]]; then
    # The image's own kernel and initrd, beside it (QEMU's direct kernel boot; no initramfs of ours).
    [[ -f $disk ]] || fail "--disk $disk: no such file"
    KERNEL_IMAGE=${disk%.qcow2}-vmlinuz disk_initrd=${disk%.qcow2}-initrd.img base=()
    [[ -f $KERNEL_IMAGE && -f $disk_initrd ]] || fail "--disk: $KERNEL_IMAGE or $disk_initrd is missing (scripts/build-disk-image.sh writes them)"
    ((${#shares[@]} == 0 && ${#payloads[@]} == 0)) || fail "--disk does not take --share or --payload"
    use_payload=0
fi
for f in "$QEMU" "$KERNEL_IMAGE" "${base[@]}"; do
    [[ -e $f ]] || fail "$f is missing (build with scripts/build-qemu.sh and scripts/build-guest.sh)"
done
((use_device == 0)) || [[ -n $ext_sock ]] || [[ -x $DAEMON ]] || fail "$DAEMON is missing (cargo build --release -p vhost-cuda)"
if ((use_payload)) && [[ -f $GUEST_DIR/payload.cpio.gz ]]; then
    payloads=("$GUEST_DIR/payload.cpio.gz" "${payloads[@]}")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/qcuda-vm.XXXXXX")
[[ -n $log_dir ]] || log_dir=$work
mkdir -p "$log_dir"
qemu_pid="" daemon_pid="" fs_pids=""
stop_pids() { # tenths of a second to wait after TERM, pids...
    local tenths=$1 pid alive
    shift
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq "$tenths"); do
        alive=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # QEMU first, while the daemons still answer its vhost-user teardown, then the daemons
    # (virtiofsd also exits by itself once QEMU is gone); escalate if they linger.
    stop_pids 20 $qemu_pid
    stop_pids 50 $daemon_pid $fs_pids
    wait 2>/dev/null || true
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

# --- initramfs: base + payloads + extra files + the command ---------------------------------
# A GPU host may lack cpio: the bundle carries a static busybox for it. Linux takes concatenated
# archives, compressed or not, so the small ones built here stay uncompressed.
if command -v cpio >/dev/null; then CPIO=(cpio); elif [[ -x $ROOT/bin/busybox ]]; then CPIO=("$ROOT/bin/busybox" cpio); else
    fail "need cpio (or the bundle's bin/busybox)"; fi
cpio_of_dir() { (cd "$1" && find . -mindepth 1 | LC_ALL=C sort | "${CPIO[@]}" -o -H newc -R 0:0 2>/dev/null); }
extra=$work/extra
mkdir -p "$extra"
for spec in "${adds[@]}"; do
    src=${spec%%:*} dest=${spec#*:}
    [[ -e $src && $dest == /* ]] || fail "--add $spec: need an existing SRC and an absolute DEST"
    mkdir -p "$extra$(dirname "$dest")"
    cp -a "$src" "$extra$dest"
done
# --- shared host directories (virtiofs) -------------------------------------------------------
# Each --share gets its own virtiofsd and vhost-user-fs-pci device (tag qcuda-shareN). The guest's
# /init mounts what /qcuda/shares lists ("TAG ro|rw GUESTDIR" a line) before the command runs,
# and chroots the command into what /qcuda/chroot names (guest/init).
share_host=() share_guest=() share_mode=()
for spec in "${shares[@]}"; do
    mode=rw
    case $spec in *:ro) mode=ro spec=${spec%:ro} ;; *:rw) spec=${spec%:rw} ;; esac
    [[ $spec == *:* ]] || fail "--share $spec: want HOSTDIR:GUESTDIR[:ro]"
    src=${spec%:*} dest=${spec##*:}
    [[ $dest == / ]] || dest=${dest%/}
    [[ -d $src ]] || fail "--share: $src is not a directory"
    [[ $dest == /?* && $dest != *$'\n'* ]] || fail "--share: $dest is not an absolute guest path below /"
    share_host+=("$(cd "$src" && pwd -P)") share_guest+=("$dest") share_mode+=("$mode")
done
in_share() { [[ $chroot_dir == "${share_guest[$1]}" || $chroot_dir == "${share_guest[$1]}"/* ]]; }
if [[ -n $chroot_dir ]]; then
    [[ $chroot_dir == / ]] || chroot_dir=${chroot_dir%/}
    found=0
    for i in "${!share_guest[@]}"; do in_share "$i" && found=1; done
    ((found)) || fail "--chroot $chroot_dir: not a --share GUESTDIR or below one"
fi
if ((${#share_host[@]})); then
    mkdir -p "$extra/qcuda"
    for i in "${!share_host[@]}"; do
        printf 'qcuda-share%d %s %s\n' "$i" "${share_mode[$i]}" "${share_guest[$i]}"
    done >"$extra/qcuda/shares"
    [[ -z $chroot_dir ]] || printf '%s\n' "$chroot_dir" >"$extra/qcuda/chroot"
fi
if [[ -n $cmd ]]; then
    mkdir -p "$extra/qcuda"
    printf '#!/bin/sh\n%s\n' "$cmd" >"$extra/qcuda/cmd"
    chmod 755 "$extra/qcuda/cmd"
fi
initrd=$work/initrd.cpio.gz
# Linux finds each appended archive only at an aligned offset: pad after every piece.
: >"$initrd"
for piece in "${base[@]}" "${payloads[@]}"; do
    cat "$piece" >>"$initrd"
    truncate -s %512 "$initrd"
done
[[ -z $(ls -A "$extra") ]] || cpio_of_dir "$extra" >>"$initrd"
# A disk image takes the command and the added files through fw_cfg instead: its
# qcuda-vm-command.service (scripts/build-disk-image.sh) copies opt/qcuda/addN to the path that
# opt/qcuda/addN.path names, runs opt/qcuda/cmd, prints QCUDA_EXIT=<rc> and powers off.
disk_args=()
if [[ -n $disk ]]; then
    [[ -n $cmd ]] || fail "--disk needs a command"
    initrd=$disk_initrd
    n=0
    for spec in "${adds[@]}"; do
        src=${spec%%:*} dest=${spec#*:}
        [[ -f $src ]] || fail "--add $spec: with --disk, files only"
        printf '%s' "$dest" >"$work/add$n.path"
        disk_args+=(-fw_cfg "name=opt/qcuda/add$n,file=$src" -fw_cfg "name=opt/qcuda/add$n.path,file=$work/add$n.path")
        n=$((n + 1))
    done
    printf '%s\n' "$cmd" >"$work/disk-cmd"
    disk_args+=(-fw_cfg "name=opt/qcuda/cmd,file=$work/disk-cmd"
        -drive "file=$disk,if=virtio,format=qcow2,snapshot=on")
fi

# --- accelerator ----------------------------------------------------------------------------
append="console=ttyS0 quiet panic=-1 rdinit=/init"
[[ -z $disk ]] || append="root=/dev/vda rw console=ttyS0 quiet panic=-1"
# debug-threads: QEMU names its threads ("CPU 0/TCG", "CPU 0/KVM"), so that per-thread views of
# the host (top -H, bench-scale.sh's thread-cpu.sh) tell the vCPUs from QEMU's other threads.
qemu_base=(-M pc -smp "$smp" -m "$mem" -display none -monitor none -no-reboot -nic none
    -name qcuda,debug-threads=on -kernel "$KERNEL_IMAGE")
[[ -n $LD_LIBRARY_PATH_QEMU ]] && qemu_env=(env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH_QEMU") || qemu_env=()
datadir=$QEMU_DIR/share/qemu
[[ -d $datadir ]] && qemu_base+=(-L "$datadir")

kvm_works() {
    # kvm-pvm style nested KVM hangs ordinary guests after the firmware, so one real boot decides;
    # the answer is kept per host boot and kernel image.
    [[ -r /dev/kvm && -w /dev/kvm ]] || return 1
    local key
    [[ -z $disk ]] || return 1 # the probe boots our initramfs
    key=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)-$(sha256sum "$KERNEL_IMAGE" | cut -c1-12)
    local memo=$CACHE/kvm-probe-$key
    if [[ ! -f $memo ]]; then
        mkdir -p "$CACHE"
        local probe=$work/probe.cpio.gz out=no
        mkdir -p "$work/probe/qcuda"
        printf '#!/bin/sh\ntrue\n' >"$work/probe/qcuda/cmd"
        chmod 755 "$work/probe/qcuda/cmd"
        cat "${base[@]}" >"$probe" # each piece is padded to 512 bytes by its builder
        cpio_of_dir "$work/probe" >>"$probe"
        if timeout 30 "${qemu_env[@]}" "$QEMU" "${qemu_base[@]}" -append "$append" -cpu max -accel kvm -initrd "$probe" \
            -serial stdio </dev/null 2>/dev/null | tr -d '\r' | grep -q '^QCUDA_EXIT=0'; then
            out=yes
        fi
        echo "$out" >"$memo"
    fi
    [[ $(cat "$memo") == yes ]]
}
case $accel in
auto) if kvm_works; then accel=kvm; else accel=tcg; fi ;;
kvm | tcg) ;;
*) fail "--accel must be auto, tcg or kvm" ;;
esac
# Under TCG the guest's CPU has no ERMS/FSRM: with them its kernel and glibc copy and clear
# memory with `rep movsb`/`rep stosb`, which TCG emulates a byte at a time; without them they use
# wide moves (docs/perf/README.md, "The guest side of the transport").
if [[ $accel == tcg ]]; then
    qemu_base+=(-cpu max,erms=off,fsrm=off -accel tcg,thread=multi)
    # TCG keeps translated code per guest-physical page and drops it when a vCPU (or QEMU's own
    # device emulation) writes the page, but it never sees what a vhost-user daemon writes into
    # guest RAM. virtiofsd fills page-cache pages for files the guest then executes (ld.so,
    # libc): a page that held code before runs its stale translation (measured: 18 of 20 host
    # programs in a --chroot crashed in ld.so). init_on_alloc=1 makes the guest zero every page
    # it allocates, with the vCPU, so TCG drops a reused page's old translations before the
    # daemon fills it.
    ((${#shares[@]} == 0)) || append+=" init_on_alloc=1"
else
    qemu_base+=(-cpu max -accel kvm)
fi
if [[ -n $disk ]]; then say "accelerator: $accel, disk: $disk (its own kernel)"; else say "accelerator: $accel, kernel: $kernel"; fi

# --- daemons ----------------------------------------------------------------------------------
wait_for_socket() { # pid, socket, log, name
    for _ in $(seq 100); do
        [[ -S $2 ]] && return 0
        kill -0 "$1" 2>/dev/null || { cat "$3" >&2; fail "$4 exited"; }
        sleep 0.05
    done
    fail "$4 did not create $2"
}
qemu_dev=()
if ((use_device)) && [[ -n $ext_sock ]]; then
    [[ -S $ext_sock ]] || fail "--socket $ext_sock: no such socket"
    qemu_dev=(-chardev "socket,id=cuda0,path=$ext_sock${reconnect:+,reconnect-ms=$reconnect}"
        -device vhost-user-cuda-pci,chardev=cuda0)
elif ((use_device)); then
    sock=$work/vhost-cuda.sock
    RUST_LOG=${RUST_LOG:-info} "$DAEMON" --socket-path "$sock" "${daemon_args[@]}" \
        >"$log_dir/daemon.log" 2>&1 &
    daemon_pid=$!
    wait_for_socket "$daemon_pid" "$sock" "$log_dir/daemon.log" vhost-cuda
    qemu_dev=(-chardev "socket,id=cuda0,path=$sock" -device vhost-user-cuda-pci,chardev=cuda0)
fi
# One virtiofsd per share. --sandbox chroot needs root (CAP_SYS_CHROOT) but, unlike namespace,
# no CAP_SYS_ADMIN, which containers often lack; without root there is only none. A share that
# --chroot uses does not announce the host's submounts: the guest would automount them, and
# overlayfs does not look into automount points of its lower layer (it would show them empty).
if ((${#share_host[@]})); then
    [[ -x $VIRTIOFSD ]] || fail "$VIRTIOFSD is missing (scripts/build-virtiofsd.sh)"
    if [[ -n ${QCUDA_VIRTIOFSD_SANDBOX:-} ]]; then sandbox=$QCUDA_VIRTIOFSD_SANDBOX
    elif (($(id -u) == 0)); then sandbox=chroot; else sandbox=none; fi
    for i in "${!share_host[@]}"; do
        fs_sock=$work/virtiofsd-$i.sock
        fs_args=(--shared-dir "${share_host[$i]}" --socket-path "$fs_sock" --sandbox "$sandbox"
            --cache auto)
        [[ ${share_mode[$i]} == rw ]] || fs_args+=(--readonly)
        [[ -z $chroot_dir ]] || ! in_share "$i" || fs_args+=(--no-announce-submounts)
        "$VIRTIOFSD" "${fs_args[@]}" "${virtiofsd_args[@]}" >"$log_dir/virtiofsd-$i.log" 2>&1 &
        fs_pids+=" $!"
        wait_for_socket "$!" "$fs_sock" "$log_dir/virtiofsd-$i.log" "virtiofsd (--share ${share_host[$i]})"
        qemu_dev+=(-chardev "socket,id=fs$i,path=$fs_sock"
            -device "vhost-user-fs-pci,chardev=fs$i,tag=qcuda-share$i")
        say "share: ${share_host[$i]} -> ${share_guest[$i]} (${share_mode[$i]}, virtiofsd --sandbox $sandbox)"
    done
fi
# vhost-user daemons map guest RAM: it must be a shared memfd.
if ((${#qemu_dev[@]})); then
    qemu_dev=(-object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa node,memdev=mem "${qemu_dev[@]}")
fi

# --- boot -------------------------------------------------------------------------------------
serial=$log_dir/serial.log
: >"$serial"
if [[ -z $cmd ]]; then
    # Interactive: the console is this terminal.
    "${qemu_env[@]}" "$QEMU" "${qemu_base[@]}" -append "$append" "${qemu_dev[@]}" -initrd "$initrd" "${qemu_args[@]}" -serial mon:stdio <&0 &
    qemu_pid=$!
    wait "$qemu_pid" || true
    exit 0
fi
"${qemu_env[@]}" "$QEMU" "${qemu_base[@]}" -append "$append" "${qemu_dev[@]}" "${disk_args[@]}" -initrd "$initrd" "${qemu_args[@]}" -serial "file:$serial" \
    </dev/null >"$log_dir/qemu.log" 2>&1 &
qemu_pid=$!
# Stream the console while the guest runs.
tail -n +1 -f "$serial" --pid="$qemu_pid" 2>/dev/null | sed -u -e 's/\r$//' -e '/^QCUDA_EXIT=/d' &
tail_pid=$!
deadline=$((SECONDS + timeout))
while kill -0 "$qemu_pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
        say "timeout after ${timeout}s"
        kill -KILL "$qemu_pid" 2>/dev/null || true
        wait "$tail_pid" 2>/dev/null || true
        exit 124
    fi
    sleep 0.2
done
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
qemu_pid=""
wait "$tail_pid" 2>/dev/null || true
rc=$(tr -d '\r' <"$serial" | sed -n 's/^QCUDA_EXIT=\([0-9]\{1,3\}\)$/\1/p' | tail -n 1)
if [[ -z $rc ]]; then
    say "the guest ended without an exit line (qemu exit $qemu_rc); qemu said:"
    sed 's/^/  /' "$log_dir/qemu.log" >&2
    exit 125
fi
exit "$rc"

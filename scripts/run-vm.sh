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
#   --no-payload       do not add the default payload (guest-lib, qcuda-smi, CUDA tests)
#   --no-device        boot without vhost-cuda and the qcuda device
#   --socket PATH      attach to an already running vhost-cuda on PATH instead of starting one
#   --reconnect MS     with --socket: QEMU reconnects to the daemon MS ms after losing it
#   --daemon-arg ARG   extra argument for vhost-cuda (repeatable)
#   --log-dir DIR      keep logs there: daemon.log, serial.log (default: a temp dir, removed)
#   --mem SIZE         guest RAM (default 3G; memfd, share=on)
#   --smp N            guest CPUs (default 2)
#   --accel auto|tcg|kvm   auto = KVM only if a probe boot with KVM works here, else TCG
#   --timeout SECONDS  whole-run limit (default 900); exit 124 when hit
#
# Works from the repo (build/qemu, build/guest, target/release/vhost-cuda) and from an unpacked
# release bundle (scripts/bundle.sh), which has the same files under its own root.
# Exit codes: the guest command's code; 124 timeout; 125 setup or boot failure (no exit line).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $here/guest/bzImage ]]; then # release bundle layout
    ROOT=$here
    QEMU_DIR=$ROOT/qemu
    GUEST_DIR=$ROOT/guest
    DAEMON=$ROOT/bin/vhost-cuda
    export LD_LIBRARY_PATH_QEMU=$ROOT/qemu/lib
else # repo layout
    ROOT=$(cd "$here/.." && pwd)
    QEMU_DIR=$ROOT/build/qemu
    GUEST_DIR=$ROOT/build/guest
    DAEMON=$ROOT/target/release/vhost-cuda
    LD_LIBRARY_PATH_QEMU=
fi
QEMU=${QCUDA_QEMU:-$QEMU_DIR/bin/qemu-system-x86_64}
DAEMON=${QCUDA_DAEMON:-$DAEMON}
CACHE=${QCUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qcuda}

adds=() payloads=() daemon_args=() log_dir="" mem=3G smp=2 accel=${QCUDA_ACCEL:-auto}
timeout=900 use_device=1 use_payload=1 cmd="" ext_sock="" reconnect=""
while (($#)); do
    case $1 in
    --add) adds+=("$2"); shift 2 ;;
    --payload) payloads+=("$2"); shift 2 ;;
    --no-payload) use_payload=0; shift ;;
    --no-device) use_device=0; shift ;;
    --socket) ext_sock=$2; shift 2 ;;
    --reconnect) reconnect=$2; shift 2 ;;
    --daemon-arg) daemon_args+=("$2"); shift 2 ;;
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

for f in "$QEMU" "$GUEST_DIR/bzImage" "$GUEST_DIR/initramfs.cpio.gz"; do
    [[ -e $f ]] || fail "$f is missing (build with scripts/build-qemu.sh and scripts/build-guest.sh)"
done
((use_device == 0)) || [[ -n $ext_sock ]] || [[ -x $DAEMON ]] || fail "$DAEMON is missing (cargo build --release -p vhost-cuda)"
if ((use_payload)) && [[ -f $GUEST_DIR/payload.cpio.gz ]]; then
    payloads=("$GUEST_DIR/payload.cpio.gz" "${payloads[@]}")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/qcuda-vm.XXXXXX")
[[ -n $log_dir ]] || log_dir=$work
mkdir -p "$log_dir"
qemu_pid="" daemon_pid=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # QEMU first (it holds the daemon's connection), then the daemon; escalate if they linger.
    for pid in $qemu_pid $daemon_pid; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
        local alive=0
        for pid in $qemu_pid $daemon_pid; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for pid in $qemu_pid $daemon_pid; do kill -KILL "$pid" 2>/dev/null || true; done
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
if [[ -n $cmd ]]; then
    mkdir -p "$extra/qcuda"
    printf '#!/bin/sh\n%s\n' "$cmd" >"$extra/qcuda/cmd"
    chmod 755 "$extra/qcuda/cmd"
fi
initrd=$work/initrd.cpio.gz
# Linux finds each appended archive only at an aligned offset: pad after every piece.
: >"$initrd"
for piece in "$GUEST_DIR/initramfs.cpio.gz" "${payloads[@]}"; do
    cat "$piece" >>"$initrd"
    truncate -s %512 "$initrd"
done
[[ -z $(ls -A "$extra") ]] || cpio_of_dir "$extra" >>"$initrd"

# --- accelerator ----------------------------------------------------------------------------
qemu_base=(-M pc -smp "$smp" -m "$mem" -display none -monitor none -no-reboot -nic none
    -kernel "$GUEST_DIR/bzImage" -append "console=ttyS0 quiet panic=-1 rdinit=/init")
[[ -n $LD_LIBRARY_PATH_QEMU ]] && qemu_env=(env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH_QEMU") || qemu_env=()
datadir=$QEMU_DIR/share/qemu
[[ -d $datadir ]] && qemu_base+=(-L "$datadir")

kvm_works() {
    # kvm-pvm style nested KVM hangs ordinary guests after the firmware, so one real boot decides;
    # the answer is kept per host boot and kernel image.
    [[ -r /dev/kvm && -w /dev/kvm ]] || return 1
    local key
    key=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)-$(sha256sum "$GUEST_DIR/bzImage" | cut -c1-12)
    local memo=$CACHE/kvm-probe-$key
    if [[ ! -f $memo ]]; then
        mkdir -p "$CACHE"
        local probe=$work/probe.cpio.gz out=no
        mkdir -p "$work/probe/qcuda"
        printf '#!/bin/sh\ntrue\n' >"$work/probe/qcuda/cmd"
        chmod 755 "$work/probe/qcuda/cmd"
        { cat "$GUEST_DIR/initramfs.cpio.gz"; cpio_of_dir "$work/probe"; } >"$probe"
        if timeout 30 "${qemu_env[@]}" "$QEMU" "${qemu_base[@]}" -cpu max -accel kvm -initrd "$probe" \
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
else
    qemu_base+=(-cpu max -accel kvm)
fi
say "accelerator: $accel"

# --- daemon -----------------------------------------------------------------------------------
qemu_dev=()
if ((use_device)) && [[ -n $ext_sock ]]; then
    [[ -S $ext_sock ]] || fail "--socket $ext_sock: no such socket"
    qemu_dev=(-object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa node,memdev=mem
        -chardev "socket,id=cuda0,path=$ext_sock${reconnect:+,reconnect-ms=$reconnect}"
        -device vhost-user-cuda-pci,chardev=cuda0)
elif ((use_device)); then
    sock=$work/vhost-cuda.sock
    RUST_LOG=${RUST_LOG:-info} "$DAEMON" --socket-path "$sock" "${daemon_args[@]}" \
        >"$log_dir/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 100); do
        [[ -S $sock ]] && break
        kill -0 "$daemon_pid" 2>/dev/null || { cat "$log_dir/daemon.log" >&2; fail "vhost-cuda exited"; }
        sleep 0.05
    done
    [[ -S $sock ]] || fail "vhost-cuda did not create $sock"
    qemu_dev=(-object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa node,memdev=mem
        -chardev "socket,id=cuda0,path=$sock" -device vhost-user-cuda-pci,chardev=cuda0)
fi

# --- boot -------------------------------------------------------------------------------------
serial=$log_dir/serial.log
: >"$serial"
if [[ -z $cmd ]]; then
    # Interactive: the console is this terminal.
    "${qemu_env[@]}" "$QEMU" "${qemu_base[@]}" "${qemu_dev[@]}" -initrd "$initrd" -serial mon:stdio &
    qemu_pid=$!
    wait "$qemu_pid" || true
    exit 0
fi
"${qemu_env[@]}" "$QEMU" "${qemu_base[@]}" "${qemu_dev[@]}" -initrd "$initrd" -serial "file:$serial" \
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

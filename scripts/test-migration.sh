#!/usr/bin/env bash
# test-migration.sh: live migration of a VM that uses qcuda, from one QEMU and vhost-cuda to a
# second QEMU (-incoming) with a daemon of its own, on this host, driven through QEMU's monitor
# as an operator would (`migrate_set_capability return-path on` on both sides, `-incoming defer`
# and `migrate_incoming unix:PATH` on the destination, `migrate -d unix:PATH`, `info migrate`). Guests run under TCG with 1 GiB
# of RAM (the torch program's: 16 GiB and 4 CPUs, as scripts/test-torch-pause.sh gives). Three programs:
#
#   --program transport (default; no GPU needed): the guest keeps two sessions open and calls the
#     device from them and from a stream of short programs (tests/guest/check-migrate) while the
#     host migrates three times: to a destination whose daemon refuses the state (--max-sessions
#     1: the source has stopped and saved its sessions, the destination refuses them), to one
#     whose daemon is killed as the migration starts, then for real. The first two must fail
#     with the VM going on at the source; afterwards the guest's transport self-test and data
#     self-test must pass on the destination, and every call made around the migrations must
#     have succeeded.
#   --program checkpoint (a GPU): tests/cuda/checkpoint_linked_list (a linked list in device
#     memory, two streams and events, a module with kernels, a working set of --working-set-mib
#     MiB) runs twice in one guest: uninterrupted, then migrated mid-loop to the destination
#     (whose daemon uses GPU --target-gpu, so with two GPUs the state moves to the other one);
#     the two CHECKSUM lines must be equal. --graph 1 and --managed 1 (the defaults of the
#     program) keep its CUDA graph (captured once, launched every iteration) and its managed
#     buffer (placed on the device at its guest address), which the saved state carries.
#     --journal 1 (the default) has the program copy a value from the device into a pageable
#     and into a pinned host journal every iteration (each entry written once, the pinned one
#     by the GPU's DMA after the call returned), both checked and in the checksum: a guest page
#     the GPU or a worker wrote that the migration's last pass of guest RAM left behind shows.
#     --rewrite 1 rewrites the whole working set every iteration (a training-like loop: every
#     byte changed between any two stops). Both runs print their loop's rate (RATE: iterations,
#     seconds, iterations/s), shown as "iteration rate" uninterrupted and migrated.
#     --live-async 1 keeps a stream-ordered allocation live through the loop, which a saved
#     state cannot hold: the migration must then fail and the
#     program go on at the source, unharmed, with the same checksum.
#     Without a GPU the program prints SKIP and so does this script ("skipped: no GPU").
#   --program precopy-fake (no GPU needed): the pre-copy of device memory through QEMU without
#     a GPU. Both daemons are the test-double build (cargo's feature test-double-driver, in
#     build/test-double-daemon; QCUDA_DAEMON names another) run with QCUDA_TEST_DOUBLE_DRIVER=1,
#     so their workers serve the guest with the fake CUDA driver (device memory in host memory,
#     no kernels). tests/cuda/precopy_memcpy (a working set of --working-set-mib MiB, default
#     256, written and read back with copies only; --rewrite 1 rewrites a 64th of it every
#     iteration) runs twice, uninterrupted and migrated mid-loop, as the checkpoint program does;
#     the checksums must be equal, and the checks of the pre-copy below apply, with more: at
#     least two rounds, the whole working set pre-copied, an unchanged set in at most an eighth
#     of the stop, a rewritten one sent again. A guest that finds no device fails.
#   --program torch (a GPU and PyTorch): tests/torch/train_check.py (a small conv net, cuDNN and
#     cuBLAS, a fixed seed, deterministic algorithms) trains --steps steps twice in one guest on
#     the host's own PyTorch (a read-only virtiofs share of /, chrooted, qcuda's libraries in
#     front, as scripts/test-torch-pause.sh runs it): uninterrupted, then migrated once a
#     quarter of its steps are done (the other three quarters give the migration time to end
#     mid-run). The share moves with the VM: the destination has a virtiofsd of its own on the
#     same directory, and QEMU carries the source virtiofsd's state (the files the guest has
#     looked up and opened, as paths: --migration-mode find-paths) in the stop phase. The two
#     loss curves (every LOSS line and the final PARAMS) must be equal bit for bit. Without a
#     GPU: "skipped: no GPU"; without PyTorch in --python (default $PYTHON, else python3):
#     "skipped: no PyTorch", both before any VM starts.
#
# Prints the migration's figures from `info migrate` (total time, downtime, setup, transferred
# RAM) and the daemons' lines about the sessions' state: each stop phase's bytes, seconds and
# GiB/s (source: save, send; destination: receive, restore), as `vhost-cuda --stats` keeps them. Works from the repo and from an unpacked bundle, like run-vm.sh. Exit 0 when it held.
#
#   scripts/test-migration.sh [--program transport|checkpoint|precopy-fake|torch] [--window S] [--iterations N]
#       [--working-set-mib M] [--rewrite 0|1] [--journal 0|1] [--graph 0|1] [--managed 0|1] [--live-async 0|1] [--target-gpu N]
#       [--steps N] [--python PATH] [--mem SIZE] [--spare-workers N] [--downtime-limit-ms MS]
#       [--max-bandwidth B] [--device-precopy on|off] [--path auto|copy] [--precopy-passes N]
#       [--precopy-round-mib N] [--unpaced-mibps R] [--log-dir DIR]
#
# --spare-workers: both daemons keep N workers started ahead (default 1, as docs/operators.md
#   advises for a migration's destination: the restore takes one, its context made already).
# --downtime-limit-ms, --max-bandwidth: QEMU's migration parameters of the same names, set on
#   the source before `migrate` (default 50 ms and 8G: a local link; QEMU's own are 300 ms and
#   128 MiB/s, with which its last pass of guest RAM alone may take most of 300 ms).
# --device-precopy: the qcuda device's property of that name on every QEMU, source and
#   destinations alike (default on, as QEMU's): on, the back-end's device memory is copied in
#   rounds while the VM runs (QEMU's section vhost-user-cuda-precopy, docs/qemu.md); off, all
#   of it goes in the stop phase, as before the property existed.
# --path copy: the source's daemon offers no same-host handover (--handover-wait-ms 0), so the
#   device memory travels as data, as it does to another host; auto (default): the handover
#   where the destination can claim it. --precopy-passes: the source daemon's passes over device
#   memory while the VM runs (its --precopy-passes; default its own, 2; 0: no pre-copy);
#   --precopy-round-mib: its rounds' most bytes (its --precopy-round-mib; default its own, 64).
#   With the checkpoint or precopy-fake program and a pre-copy, the script prints the rounds,
#   the bytes pre-copied and the stop's bytes of device memory, and fails if the pre-copy ran
#   faster than --max-bandwidth allows (patch 0006 paces each round to it; a tenth of slack)
#   or, with a working set that does not change (--rewrite 0) on the copy path, if the stop
#   still carried most of it (precopy-fake: more than an eighth). --unpaced-mibps R
#   (the "pre-copy rate" over its span of the same pre-copy under a high --max-bandwidth, from
#   another run) also fails unless R is at least one and a half times --max-bandwidth: the
#   limit must have held something back for the rate check to mean anything.
#
# --window: how long the transport program's guest waits to arrive at the destination.
# --steps, --python: the torch program's training steps (default 50) and the host's Python with
#   PyTorch.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -x $here/bin/vhost-cuda ]]; then DAEMON=$here/bin/vhost-cuda; else DAEMON=$here/../target/release/vhost-cuda; fi
program=transport window=900 iterations=10000 working_mib="" rewrite=0 graph=1 managed=1 live_async=0 journal=1 target_gpu="" mem="" log_dir="" spare_workers=1 downtime_limit_ms=50 max_bandwidth=8G
device_precopy=on path=auto precopy_passes="" precopy_round_mib="" unpaced_mibps="" steps=50 python=${PYTHON:-$(command -v python3 || true)}
while (($#)); do
    case $1 in
    --program) program=$2; shift 2 ;;
    --window) window=$2; shift 2 ;;
    --iterations) iterations=$2; shift 2 ;;
    --working-set-mib) working_mib=$2; shift 2 ;;
    --rewrite) rewrite=$2; shift 2 ;;
    --journal) journal=$2; shift 2 ;;
    --graph) graph=$2; shift 2 ;;
    --managed) managed=$2; shift 2 ;;
    --live-async) live_async=$2; shift 2 ;;
    --target-gpu) target_gpu=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --log-dir) log_dir=$2; shift 2 ;;
    --spare-workers) spare_workers=$2; shift 2 ;;
    --downtime-limit-ms) downtime_limit_ms=$2; shift 2 ;;
    --max-bandwidth) max_bandwidth=$2; shift 2 ;;
    --device-precopy) device_precopy=$2; shift 2 ;;
    --path) path=$2; shift 2 ;;
    --precopy-passes) precopy_passes=$2; shift 2 ;;
    --precopy-round-mib) precopy_round_mib=$2; shift 2 ;;
    --unpaced-mibps) unpaced_mibps=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "test-migration.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ $program == transport || $program == checkpoint || $program == precopy-fake || $program == torch ]] ||
    { echo "test-migration.sh: --program transport|checkpoint|precopy-fake|torch" >&2; exit 2; }
# The programs whose device memory a pre-copy moves.
device_program=0
[[ $program == checkpoint || $program == precopy-fake ]] && device_program=1
if [[ $program == precopy-fake ]]; then
    # Only the repository builds the test double; the bundle never carries it.
    DAEMON=$here/../build/test-double-daemon/release/vhost-cuda
    working_mib=${working_mib:-256}
    # What makes the test-double build's daemons and workers take the fake driver.
    export QCUDA_TEST_DOUBLE_DRIVER=1
fi
DAEMON=${QCUDA_DAEMON:-$DAEMON}
working_mib=${working_mib:-0}
[[ $device_precopy == on || $device_precopy == off ]] || { echo "test-migration.sh: --device-precopy on|off" >&2; exit 2; }
[[ $path == auto || $path == copy ]] || { echo "test-migration.sh: --path auto|copy" >&2; exit 2; }
# shellcheck source=scripts/gpu-host.sh
. "$here/gpu-host.sh"
if [[ $program == torch ]]; then
    # Before any VM starts: the guest would only find this out after booting.
    skip_without_gpu_torch "$python"
    if [[ -x $here/bin/vhost-cuda ]]; then train_check=$here/tests/torch/train_check.py; else train_check=$here/../tests/torch/train_check.py; fi
fi
log_dir=${log_dir:-$(mktemp -d)}
mkdir -p "$log_dir"
log_dir=$(cd "$log_dir" && pwd)
say() { printf '[test-migration] %s\n' "$*"; }
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# One daemon per side, each on its own socket and log; its pid in $started.
start_daemon() { # name, extra args...
    local name=$1 sock=$log_dir/$1.sock
    shift
    RUST_LOG=${RUST_LOG:-info} "$DAEMON" --socket-path "$sock" --spare-workers "$spare_workers" "$@" >>"$log_dir/daemon-$name.log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    started=$pid
    for _ in $(seq 200); do
        if grep -q 'waiting for a frontend' "$log_dir/daemon-$name.log" 2>/dev/null && [[ -S $sock ]]; then
            # A daemon without the test double would serve the guest no device at all.
            if [[ $program == precopy-fake ]] && ! grep -q 'the fake CUDA driver (a test double) serves' "$log_dir/daemon-$name.log"; then
                say "vhost-cuda ($name) is not the test-double build ($DAEMON: cargo build --release -p vhost-cuda --features test-double-driver --target-dir build/test-double-daemon)"
                return 1
            fi
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    say "vhost-cuda ($name) did not start:"; tail -n 5 "$log_dir/daemon-$name.log" >&2; return 1
}

# A human monitor command on a QEMU's monitor socket; prints the answer.
hmp() { # socket, command
    python3 - "$1" "$2" <<'EOF'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
for _ in range(100):
    try:
        s.connect(sys.argv[1]); break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("no monitor at " + sys.argv[1])
def until_prompt():
    out = b""
    while not out.endswith(b"(qemu) "):
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")
until_prompt()
s.sendall(sys.argv[2].encode() + b"\n")
answer = until_prompt()
# The monitor echoes the command line first; drop it, the prompt and terminal escapes.
lines = [l for l in answer.replace("\r", "").split("\n") if not l.startswith("(qemu)")]
print("\n".join(l for l in lines[1:] if "\x1b" not in l).strip())
EOF
}

# The guest: one command line for both sides (the destination's guest never runs it: it
# arrives running). Identical options matter: QEMU migrates between identical machines.
vm_opts=(--accel tcg --mem "${mem:-1G}" --timeout 3000)
if [[ $program == transport ]]; then
    guest_cmd="/opt/qcuda/bin/check-migrate $window"
    ready='^MIGRATE ready'
elif [[ $program == checkpoint ]]; then
    prog=/opt/qcuda/tests/checkpoint_linked_list
    guest_cmd="insmod /lib/modules/qcuda.ko; for run in plain migrated; do echo RUN \$run; $prog $iterations 2000 $working_mib $graph $managed $live_async $rewrite $journal; echo EXIT \$?; done"
    ready='^\(CHECKPOINT ready\|SKIP\)'
elif [[ $program == precopy-fake ]]; then
    # Its loop sleeps 20 ms an iteration: a TCG guest that keeps the host's cores busy would
    # slow the daemons' rounds, and the rate limit would then have nothing to hold back.
    prog=/opt/qcuda/tests/precopy_memcpy
    # The program as this tree builds it (scripts/build-cuda-tests.sh), over the payload's.
    precopy_bin=$here/../build/cuda-tests/precopy_memcpy
    [[ -x $precopy_bin ]] || { say "no $precopy_bin (scripts/build-cuda-tests.sh precopy_memcpy)"; exit 1; }
    vm_opts+=(--add "$precopy_bin:$prog")
    guest_cmd="insmod /lib/modules/qcuda.ko; for run in plain migrated; do echo RUN \$run; $prog $iterations 20000 $working_mib $rewrite; echo EXIT \$?; done"
    ready='^\(CHECKPOINT ready\|SKIP\)'
else
    # The steps are slowed so that the migration ends mid-run: on an H200 host a step took
    # about 0.2 s, and the pre-copy of the 16 GiB TCG guest about 16 s.
    run="env LD_LIBRARY_PATH=/usr/lib/qcuda TRAIN_STEPS=$steps TRAIN_STEP_SLEEP=1 $python /opt/qcuda/train_check.py"
    guest_cmd="echo RUN plain; $run; echo EXIT \$?; echo RUN migrated; $run; echo EXIT \$?"
    ready='^\(TRAIN ready\|SKIP\)'
    # Both sides share the same host root: find-paths (virtiofsd's default, named because the
    # migration depends on it) sends the guest's files as paths, which the destination's
    # virtiofsd opens again in the same directory.
    vm_opts=(--accel tcg --mem "${mem:-16G}" --smp 4 --timeout 3000
        --share /:/host:ro --chroot /host --add "$train_check:/opt/qcuda/train_check.py"
        --virtiofsd-arg --migration-mode=find-paths)
fi
# On the bare virtio device, which vhost-user-cuda-pci holds: -global sets it wherever run-vm.sh
# puts the device. Both ends must agree, or the destination meets a section it does not know.
vm_opts+=(--qemu-arg -global --qemu-arg "vhost-user-cuda.device-precopy=$device_precopy")

start_vm() { # name, socket, extra run-vm args...: starts run-vm.sh in the background, its pid in $started
    local name=$1 sock=$2
    shift 2
    "$here/run-vm.sh" "${vm_opts[@]}" --socket "$sock" --log-dir "$log_dir/vm-$name" \
        --qemu-arg -monitor --qemu-arg "unix:$log_dir/monitor-$name.sock,server=on,wait=off" "$@" \
        -- "$guest_cmd" >"$log_dir/guest-$name.log" 2>&1 &
    started=$!
    pids+=("$started")
}
wait_line() { # file, pattern, count, seconds, pid
    local n=0
    until (($(grep -c "$2" "$1" 2>/dev/null || true) >= $3)); do
        n=$((n + 1))
        ((n <= $4 * 10)) || return 1
        kill -0 "$5" 2>/dev/null || return 1
        sleep 0.1
    done
}
# Migrates the source to a destination listening on unix socket $1; prints "completed" or
# "failed" (or the last status after $2 seconds), and keeps `info migrate` in the log.
migrate() { # incoming socket, seconds
    local status="" n=0
    # The return path: the destination reports whether it took the state, so that a refusal
    # fails the migration and the source runs on (without it the source would call it done).
    hmp "$log_dir/monitor-src.sock" "migrate_set_capability return-path on" >>"$log_dir/monitor.log"
    # QEMU's own budget for the last pass of RAM (its default: 300 ms, at 128 MiB/s), as an
    # operator sets it for a local link (docs/operators.md).
    hmp "$log_dir/monitor-src.sock" "migrate_set_parameter downtime-limit $downtime_limit_ms" >>"$log_dir/monitor.log"
    hmp "$log_dir/monitor-src.sock" "migrate_set_parameter max-bandwidth $max_bandwidth" >>"$log_dir/monitor.log"
    hmp "$log_dir/monitor-src.sock" "migrate -d unix:$1" >>"$log_dir/monitor.log"
    while ((n < $2 * 5)); do
        sleep 0.2
        n=$((n + 1))
        # A guest that ends its command mid-migration powers the source off (QEMU removes its
        # monitor's socket): nothing more to ask.
        [[ -S $log_dir/monitor-src.sock ]] || { status="none (the source VM ended)"; break; }
        status=$(hmp "$log_dir/monitor-src.sock" "info migrate" | tee "$log_dir/info-migrate.txt" |
            sed -n 's/^Status: *\([a-z-]*\).*/\1/p; s/^Migration status: *\([a-z-]*\).*/\1/p' | head -n 1)
        [[ $status == completed || $status == failed || $status == cancelled ]] && break
    done
    cat "$log_dir/info-migrate.txt" >>"$log_dir/monitor.log"
    echo "${status:-unknown}"
}
# A destination QEMU (started with -incoming defer) listens on unix socket $1 once its monitor
# is up, with the return path on.
listen_incoming() { # name, socket, pid
    local mon=$log_dir/monitor-$1.sock
    for _ in $(seq 1200); do
        [[ -S $mon ]] && break
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
    done
    [[ -S $mon ]] || return 1
    hmp "$mon" "migrate_set_capability return-path on" >>"$log_dir/monitor.log"
    hmp "$mon" "migrate_incoming unix:$2" >>"$log_dir/monitor.log"
    for _ in $(seq 100); do
        [[ -S $2 ]] && return 0
        sleep 0.1
    done
    return 1
}
src_running() { [[ $(hmp "$log_dir/monitor-src.sock" "info status") == *running* ]]; }

src_args=()
[[ $path == copy ]] && src_args+=(--handover-wait-ms 0)
[[ -z $precopy_passes ]] || src_args+=(--precopy-passes "$precopy_passes")
[[ -z $precopy_round_mib ]] || src_args+=(--precopy-round-mib "$precopy_round_mib")
start_daemon src "${src_args[@]}"
dst_args=()
[[ -z $target_gpu ]] || dst_args=(--gpu "$target_gpu")
start_vm src "$log_dir/src.sock"
src_vm=$started
if ! wait_line "$log_dir/guest-src.log" "$ready" 1 900 "$src_vm"; then
    say "FAILED: the guest never got ready; logs in $log_dir"
    tail -n 20 "$log_dir/guest-src.log"
    exit 1
fi
if grep -q '^SKIP' "$log_dir/guest-src.log"; then
    # The torch program has found a GPU on the host already: a guest without one is a failure.
    if [[ $program == torch || $program == precopy-fake ]]; then
        say "FAILED: the guest found no CUDA device: $(grep -m1 '^SKIP' "$log_dir/guest-src.log")"
        exit 1
    fi
    say "skipped: no GPU"
    exit 0
fi
rc=0

# 1. A destination that refuses the state (the source has stopped the VM and saved its sessions
# by then): the migration fails, the VM and its sessions go on at the source.
if [[ $program == transport ]]; then
    start_daemon refuse --max-sessions 1
    start_vm refuse "$log_dir/refuse.sock" --qemu-arg -incoming --qemu-arg defer
    refuse_vm=$started
    listen_incoming refuse "$log_dir/incoming-refuse.sock" "$refuse_vm" || { say "FAILED: the refusing destination never listened"; exit 1; }
    status=$(migrate "$log_dir/incoming-refuse.sock" 300)
    saved=$(grep -cE 'sessions (saved|quiesced) at the last stop' "$log_dir/daemon-src.log" || true)
    if [[ $status != failed ]]; then
        say "FAILED: a migration to a destination that refuses the state ended '$status', not 'failed'"
        rc=1
    elif ! src_running; then
        say "FAILED: after the refused migration the source VM is not running: $(hmp "$log_dir/monitor-src.sock" "info status")"
        rc=1
    elif ((saved < 1)) || ! grep -q 'state transfer failed' "$log_dir/daemon-refuse.log"; then
        say "FAILED: the refusal did not come from the state (source saves: $saved; the destination's log: $(grep -m1 migration "$log_dir/daemon-refuse.log"))"
        rc=1
    else
        say "ok: the destination refused the state ($(sed -n 's/.*state transfer failed: //p' "$log_dir/daemon-refuse.log" | head -n 1)); the source VM runs on"
    fi
    # A destination whose load failed stays up (paused, its incoming migration failed): end it.
    hmp "$log_dir/monitor-refuse.sock" quit >/dev/null 2>&1 || true
    wait "$refuse_vm" 2>/dev/null || true
fi

# 2. A destination that goes away as the migration starts: the migration fails, the VM goes on.
if [[ $program == transport ]]; then
    start_daemon gone
    gone_daemon=$started
    start_vm gone "$log_dir/gone.sock" --qemu-arg -incoming --qemu-arg defer
    gone_vm=$started
    listen_incoming gone "$log_dir/incoming-gone.sock" "$gone_vm" || { say "FAILED: the first destination never listened"; exit 1; }
    sleep 1
    (sleep 0.3; kill -KILL "$gone_daemon" 2>/dev/null) &
    status=$(migrate "$log_dir/incoming-gone.sock" 300)
    { wait "$gone_daemon"; } 2>/dev/null || true
    if [[ $status != failed ]]; then
        say "FAILED: a migration to a destination whose daemon died ended '$status', not 'failed'"
        rc=1
    elif ! src_running; then
        say "FAILED: after the failed migration the source VM is not running: $(hmp "$log_dir/monitor-src.sock" "info status")"
        rc=1
    else
        say "ok: the migration to a destination whose daemon died failed, and the source VM runs on"
    fi
    hmp "$log_dir/monitor-gone.sock" quit >/dev/null 2>&1 || true
    wait "$gone_vm" 2>/dev/null || true
fi

# 3. The real migration (in the checkpoint program: in the second run, mid-loop; in the torch
# program: in the second run, a quarter of its steps done; the destination is up and listening before
# that run starts its loop).
# The guest of the transport program knows it has arrived by this daemon's memory limit.
[[ $program == transport ]] && dst_args+=(--max-gpu-memory 64G)
start_daemon dst "${dst_args[@]}"
start_vm dst "$log_dir/dst.sock" --qemu-arg -incoming --qemu-arg defer
dst_vm=$started
listen_incoming dst "$log_dir/incoming-dst.sock" "$dst_vm" || { say "FAILED: the destination never listened"; exit 1; }
if ((device_program)); then
    wait_line "$log_dir/guest-src.log" '^CHECKPOINT ready' 2 900 "$src_vm" || { say "FAILED: the second run never got ready"; exit 1; }
    sleep 1
elif [[ $program == torch ]]; then
    wait_line "$log_dir/guest-src.log" '^TRAIN ready' 2 1800 "$src_vm" || { say "FAILED: the second run never started"; exit 1; }
    # The first run's LOSS lines, then a quarter of the second's.
    wait_line "$log_dir/guest-src.log" '^LOSS ' $((steps + steps / 4)) 1800 "$src_vm" ||
        { say "FAILED: the second run stopped before step $((steps / 4))"; exit 1; }
fi
status=$(migrate "$log_dir/incoming-dst.sock" 600)
say "migration: $status"
grep -Ei '^(total time|downtime|setup|transferred ram|throughput|precopy ram|downtime ram|Time \(ms\)|RAM info)' "$log_dir/info-migrate.txt" | sed 's/^/  /' || true
sed -n 's/.*\(migration: sessions \(saved\|quiesced\) at the last stop.*\)/  source: \1/p; s/.*\(GPU state saved for migration.*\)/  source: \1/p; s/.*\(migration: phase done.*\)/  source: \1/p; s/.*\(migration: \(device memory handed over\|no destination on this host\|the handover failed\).*\)/  source: \1/p' "$log_dir/daemon-src.log"
# Which path the stop phase took: the source's daemon says it as it sends the state
# ("migration: state sent ... path=handover" when a destination on this host claimed the device
# memory, "path=copy" when it went as data); a daemon of before the handover logs no path and
# always copies. The downtime above is QEMU's own (`info migrate`), whatever the path.
taken=$(sed -n 's/.*migration: state sent.*path="\{0,1\}\([a-z]*\).*/\1/p' "$log_dir/daemon-src.log" | tail -n 1)
if [[ $taken == handover ]] || grep -q 'phase=.\?handover' "$log_dir/daemon-src.log" 2>/dev/null; then
    taken=handover
else
    taken=copy
fi
say "migration path: $taken"
if [[ $path == copy && $taken != copy ]]; then
    say "FAILED: --path copy, yet the device memory was handed over"
    rc=1
fi
# The pre-copy of device memory while the VM ran: the source's rounds (the last migration's:
# those after the last "dirty logging on").
precopy_lines() { # daemon log
    awk '/dirty logging on/ { n = 0; delete l } /migration: pre-copy round/ { l[++n] = $0 } END { for (i = 1; i <= n; i++) print l[i] }' "$1"
}
rounds=$(precopy_lines "$log_dir/daemon-src.log" | grep -c . || true)
precopied=$(precopy_lines "$log_dir/daemon-src.log" | sed -n 's/.* total_bytes=\([0-9]*\).*/\1/p' | tail -n 1)
precopy_s=$(precopy_lines "$log_dir/daemon-src.log" | sed -n 's/.* secs=\([0-9.]*\).*/\1/p' | awk '{ s += $1 } END { printf "%.3f", s }')
# (awk, not head: under pipefail a head that stops reading early fails the pipe with SIGPIPE.)
first=$(precopy_lines "$log_dir/daemon-src.log" | awk 'NR == 1 { print substr($0, 1, 26) }')
first_s=$(precopy_lines "$log_dir/daemon-src.log" | sed -n 's/.* secs=\([0-9.]*\).*/\1/p' | awk 'NR == 1')
last=$(precopy_lines "$log_dir/daemon-src.log" | awk '{ l = substr($0, 1, 26) } END { print l }')
# The copy path's whole states (mode Full), saved in the stop.
stop_bytes=$(awk '/dirty logging on/ { s = 0 } /GPU state saved for migration.*mode=Full/ && match($0, / bytes=[0-9]+/) { s += substr($0, RSTART + 7, RLENGTH - 7) } END { print s + 0 }' "$log_dir/daemon-src.log")
if ((rounds > 0)); then
    # From the first round's start (its line is logged at its end) to the last round's end.
    span=$(python3 -c 'import sys, datetime as d; f = lambda t: d.datetime.fromisoformat(t.rstrip("Z")); print("%.3f" % ((f(sys.argv[2]) - f(sys.argv[1])).total_seconds() + float(sys.argv[3])))' "$first" "$last" "${first_s:-0}" 2>/dev/null || echo 0)
    say "pre-copy: $rounds round(s), $((${precopied:-0} >> 20)) MiB of device memory while the VM ran, over ${span} s (${precopy_s} s in the rounds themselves); the stop's saved states: $((stop_bytes >> 20)) MiB"
    limit=$(numfmt --from=iec "${max_bandwidth}" 2>/dev/null || echo 0)
    rates=$(python3 -c 'import sys; b, s, r = map(float, sys.argv[1:]); print("%.1f %.1f" % (b / max(s, 1e-3) / 2**20, b / max(r, 1e-3) / 2**20))' "${precopied:-0}" "$span" "$precopy_s")
    say "pre-copy rate: ${rates% *} MiB/s over its span, ${rates#* } MiB/s in the rounds themselves; --max-bandwidth $max_bandwidth ($((limit >> 20)) MiB/s)"
    # Patch 0006 keeps each round to QEMU's max-bandwidth: the bytes cannot have gone faster
    # than it (a tenth of slack for the clocks: the span comes from the daemon's log lines).
    # Over the fake driver it applies to any pre-copy of more than a second at the limit.
    rate_checked=0
    [[ $program == checkpoint ]] && ((${precopied:-0} > (256 << 20))) && rate_checked=1
    [[ $program == precopy-fake ]] && ((${precopied:-0} > limit)) && rate_checked=1
    if ((limit > 0 && rate_checked)); then
        if python3 -c 'import sys; b, s, l = map(float, sys.argv[1:]); sys.exit(0 if b / max(s, 1e-3) > 1.1 * l else 1)' "$precopied" "$span" "$limit"; then
            say "FAILED: the pre-copy moved $precopied bytes in $span s, faster than --max-bandwidth $max_bandwidth"
            rc=1
        fi
    fi
    # --unpaced-mibps: the rate over its span of the same pre-copy without a limit (another
    # run's "pre-copy rate" line): the check above only means something if that is well above
    # the limit, which must then have held the rounds back.
    if [[ -n $unpaced_mibps ]] && ! python3 -c 'import sys; u, l = map(float, sys.argv[1:]); sys.exit(0 if l > 0 and u >= 1.5 * l / 2**20 else 1)' "$unpaced_mibps" "$limit"; then
        say "FAILED: unpaced, the pre-copy went at $unpaced_mibps MiB/s, not well above --max-bandwidth $max_bandwidth: the limit holds nothing back, and the rate check says nothing"
        rc=1
    fi
    # Of a set that does not change, at most half may go in the stop (the fake driver's
    # program: an eighth, the chunks the pre-copy had not reached yet when QEMU stopped).
    unchanged_max=$((working_mib << 19))
    [[ $program == precopy-fake ]] && unchanged_max=$((working_mib << 17))
    if [[ $taken == copy && $rewrite == 0 ]] && ((device_program && working_mib > 0 && stop_bytes > unchanged_max)); then
        say "FAILED: the working set does not change, yet the stop carried $((stop_bytes >> 20)) MiB of its $working_mib MiB"
        rc=1
    fi
    if [[ $program == precopy-fake ]]; then
        # The fake driver's program: at least two rounds while the VM ran; every byte of the
        # working set pre-copied; a set rewritten a 64th an iteration sent again (a 16th of it
        # at least), in a later pass or in the stop.
        if ((rounds < 2)); then
            say "FAILED: $rounds pre-copy round(s) while the VM ran, not at least 2"
            rc=1
        fi
        if ((${precopied:-0} < (working_mib << 20))); then
            say "FAILED: the pre-copy sent $((${precopied:-0} >> 20)) MiB, less than the $working_mib MiB working set"
            rc=1
        fi
        if [[ $rewrite != 0 ]]; then
            again=$((${precopied:-0} + stop_bytes - (working_mib << 20)))
            say "sent again (rewritten since it was first sent): $((again >> 20)) MiB"
            if ((again < (working_mib << 16))); then
                say "FAILED: a 64th of the working set is rewritten every iteration, yet only $((again >> 20)) MiB of it went again (pre-copy $((${precopied:-0} >> 20)) MiB, stop $((stop_bytes >> 20)) MiB)"
                rc=1
            fi
        fi
    fi
elif [[ $device_precopy == on && ${precopy_passes:-2} != 0 && $live_async == 0 ]] && ((device_program)); then
    say "FAILED: no pre-copy round reached the source's daemon"
    rc=1
fi
expect_fail=0
[[ $program == checkpoint && $live_async != 0 ]] && expect_fail=1
if ((expect_fail)); then
    if [[ $status == completed ]]; then
        say "FAILED: a state with a live stream-ordered allocation migrated (a save refuses it)"
        rc=1
    elif ! src_running; then
        say "FAILED: the refused migration left the source VM stopped"
        rc=1
    else
        say "ok: the state with a live stream-ordered allocation was refused and the program goes on at the source"
    fi
    hmp "$log_dir/monitor-dst.sock" quit >/dev/null 2>&1 || true
    wait "$dst_vm" 2>/dev/null || true
    finish_vm=$src_vm finish_log=$log_dir/guest-src.log
else
    if [[ $status != completed ]]; then
        say "FAILED: the migration ended '$status'; logs in $log_dir"
        [[ $status != none* ]] || say "the guest's command ended before the migration did (a longer run: --iterations, --steps)"
        sed 's/^/  /' "$log_dir/info-migrate.txt"
        grep -h 'migration\|refused' "$log_dir"/daemon-*.log | tail -n 10 | sed 's/^/  /'
        exit 1
    fi
    sed -n 's/.*\(migration: sessions restored.*\)/  destination: \1/p; s/.*\(GPU state restored from a migration.*\)/  destination: \1/p; s/.*\(migration: phase done.*\)/  destination: \1/p' "$log_dir/daemon-dst.log"
    # The same phases as each daemon's stats socket reports them (vhost-cuda --stats).
    for side in src dst; do
        "$DAEMON" --stats --socket-path "$log_dir/$side.sock" 2>/dev/null |
            grep -E 'last migration|^    (precopy|quiesce|handover|save|send|receive|restore) ' | sed "s/^ */  stats ($side): /"
    done
    # The source has handed over: it stays paused until told to quit.
    hmp "$log_dir/monitor-src.sock" quit >/dev/null 2>&1 || true
    wait "$src_vm" 2>/dev/null || true
    finish_vm=$dst_vm finish_log=$log_dir/guest-dst.log
fi
vm_rc=0
wait "$finish_vm" || vm_rc=$?
if [[ $program == transport ]]; then
    sed -n 's/^\(MIGRATE .*\)/  guest at the source: \1/p' "$log_dir/guest-src.log"
    sed -n 's/^\(MIGRATE .*\)/  guest at the destination: \1/p' "$finish_log"
    if ((vm_rc != 0)) || ! grep -q '^MIGRATE ok' "$finish_log"; then
        say "FAILED: the guest's checks after the migration failed (exit $vm_rc); logs in $log_dir"
        tail -n 20 "$finish_log"
        exit 1
    fi
    ((rc == 0)) || exit 1
    say "ok: migrated with sessions open; the guest's transport works on the destination"
    exit 0
fi
if [[ $program == torch ]]; then
    # The console as the guest wrote it: the source's, then the destination's. QEMU moves the
    # serial port with the VM, so a line the stop cut in two goes on in the destination's file.
    tr -d '\r' <"$log_dir/vm-src/serial.log" >"$log_dir/console-src.log"
    tr -d '\r' <"$log_dir/vm-dst/serial.log" >"$log_dir/console-dst.log"
    cat "$log_dir/console-src.log" "$log_dir/console-dst.log" >"$log_dir/console.log"
    awk '/^RUN plain/ { f = "plain" } /^RUN migrated/ { f = "migrated" }
        f && /^(LOSS|PARAMS|PASS|FAIL|SKIP|EXIT)/ { print > (dir "/" f ".log") }' dir="$log_dir" "$log_dir/console.log"
    for f in plain migrated; do
        [[ -f $log_dir/$f.log ]] || : >"$log_dir/$f.log"
    done
    curve() { grep -E '^(LOSS|PARAMS) ' "$1" | awk '{ print $1, $2, $3 }'; }
    n_plain=$(grep -c '^LOSS ' "$log_dir/plain.log") n_migrated=$(grep -c '^LOSS ' "$log_dir/migrated.log")
    # The migrated run's steps printed before the stop (a line cut by it counts here).
    at_src=$(awk '/^RUN migrated/ { f = 1 } f && /^LOSS / { n++ } END { print n + 0 }' "$log_dir/console-src.log")
    paste -d' ' <(grep '^LOSS ' "$log_dir/plain.log" | awk '{ print $2, $4 }') \
        <(grep '^LOSS ' "$log_dir/migrated.log" | awk '{ print $4 }') |
        awk -v at="$at_src" 'BEGIN { print "  step uninterrupted migrated" }
            { print "  " $0 } NR == at { print "  -- migrated here --" }'
    grep -hE '^(RUN|PARAMS|PASS|FAIL|EXIT)' "$log_dir/console.log" | sed 's/^/  /'
    say "steps: $n_plain uninterrupted, $n_migrated migrated ($at_src at the source, the rest at the destination)"
    if ((n_plain != steps || n_migrated != steps)); then
        say "FAILED: a run did not finish its $steps steps; logs in $log_dir"
        exit 1
    fi
    if ! grep -q '^PARAMS ' "$log_dir/console-dst.log"; then
        say "FAILED: the migrated run did not end at the destination (it ended before the migration; raise --steps); logs in $log_dir"
        exit 1
    fi
    if ! diff <(curve "$log_dir/plain.log") <(curve "$log_dir/migrated.log") >"$log_dir/curve.diff"; then
        say "FAILED: the migrated run's loss curve differs from the uninterrupted run's:"
        head -n 20 "$log_dir/curve.diff" | sed 's/^/  /'
        exit 1
    fi
    if ((vm_rc != 0)) || (($(grep -c '^PASS ' "$log_dir/console.log") != 2)); then
        say "FAILED (guest exit $vm_rc, $(grep -c '^PASS ' "$log_dir/console.log") of 2 runs passed); logs in $log_dir"
        exit 1
    fi
    say "ok: the loss curve of $steps steps, migrated after $at_src of them, equals the uninterrupted run's bit for bit"
    exit 0
fi
logs=("$log_dir/guest-src.log")
[[ $finish_log == "$log_dir/guest-src.log" ]] || logs+=("$finish_log")
mapfile -t sums < <(cat "${logs[@]}" | grep '^CHECKSUM' | awk '{print $2}' | sort -u)
grep -hE '^(RUN|RATE|CHECKSUM|PASS|FAIL|EXIT)' "${logs[@]}" | sed 's/^/  /'
# The loop's rate: the first RATE line is the uninterrupted run's, the last the migrated one's.
mapfile -t rates < <(cat "${logs[@]}" | awk '$1 == "RATE" { print $4 }')
((${#rates[@]} >= 2)) && say "iteration rate: uninterrupted ${rates[0]}/s, migrated ${rates[-1]}/s (working set $working_mib MiB, rewrite $rewrite)"
n=$(cat "${logs[@]}" | grep -c '^CHECKSUM' || true)
if ((expect_fail == 0)) && ! grep -q '^CHECKSUM' "$finish_log"; then
    say "FAILED: the migrated run printed no checksum at the destination (it ended before the migration, or failed there; raise --iterations); logs in $log_dir"
    exit 1
fi
if ((n != 2)) || ((${#sums[@]} != 1)); then
    say "FAILED: $n of 2 runs printed a checksum, ${#sums[@]} distinct (${sums[*]}); logs in $log_dir"
    exit 1
fi
if ((vm_rc != 0 || rc != 0)); then
    say "FAILED (guest exit $vm_rc); logs in $log_dir"
    exit 1
fi
say "ok: the same checksum ${sums[0]} uninterrupted and across the migration (working set $working_mib MiB)"

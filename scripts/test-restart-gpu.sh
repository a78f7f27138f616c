#!/usr/bin/env bash
# test-restart-gpu.sh: kills vhost-cuda with SIGKILL while a guest program runs on the GPU, ROUNDS
# times, and checks that the program never notices: its result must equal an uninterrupted
# run's. The daemon runs under fd-store.py, which plays systemd's file-descriptor store and
# Restart= (as the vhost-cuda@ unit has them): the workers, which hold the program's CUDA state,
# outlive the killed daemon and the next daemon takes them over; QEMU reconnects (reconnect-ms).
# The program is tests/cuda/checkpoint_linked_list (a linked list in device memory, two streams
# ordered by events, a graph launched every iteration, a managed buffer), run twice in one guest
# boot: uninterrupted, then with the daemon killed mid-loop. Prints each restart's gap: from the
# kill to the new daemon serving the guest's ring again, and the program's longest call.
# Without a GPU the program prints SKIP and so does this script ("skipped: no GPU"). Works from
# the repo and from an unpacked bundle.
#
#   scripts/test-restart-gpu.sh [--iterations N] [--rounds R] [--log-dir DIR]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/gpu-host.sh
. "$here/gpu-host.sh"
DAEMON=$(daemon_binary "$here")
iterations=3000 rounds=3 log_dir=""
while (($#)); do
    case $1 in
    --iterations) iterations=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --log-dir) log_dir=$2; shift 2 ;;
    *) echo "test-restart-gpu.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
log_dir=${log_dir:-$(mktemp -d)}
mkdir -p "$log_dir"
sock=$log_dir/vhost-cuda.sock
store="" vm=""
say() { printf '[test-restart-gpu] %s\n' "$*"; }
cleanup() {
    [[ -z $vm ]] || vm_stop "$vm"
    # The store closes: the workers see their channels end and exit.
    [[ -z $store ]] || { kill -TERM "$store" 2>/dev/null; wait "$store" 2>/dev/null; } || true
}
trap cleanup EXIT
RUST_LOG=${RUST_LOG:-info} python3 "$here/fd-store.py" --dir "$log_dir" --pid-file "$log_dir/daemon.pid" \
    -- "$DAEMON" --socket-path "$sock" >>"$log_dir/daemon.log" 2>&1 &
store=$!
daemon_wait "$log_dir/daemon.log" "$sock" || { say "vhost-cuda did not start"; exit 1; }

prog=/opt/qcuda/tests/checkpoint_linked_list
guest_cmd="insmod /lib/modules/qcuda.ko; for run in plain restarted; do echo RUN \$run; $prog $iterations 2000; echo EXIT \$?; done"
"$here/run-vm.sh" --socket "$sock" --reconnect 100 --timeout 3000 --log-dir "$log_dir/vm" -- "$guest_cmd" \
    >"$log_dir/guest.log" 2>&1 &
vm=$!
wait_line() { # pattern count seconds: until the guest log has COUNT lines matching PATTERN
    local n=0
    until (($(grep -c "$1" "$log_dir/guest.log" 2>/dev/null || true) >= $2)); do
        n=$((n + 1))
        ((n <= $3 * 10)) || return 1
        kill -0 "$vm" 2>/dev/null || return 1
        sleep 0.1
    done
}
rc=0
wait_line '^\(CHECKPOINT ready\|SKIP\)' 1 900 || { say "the first run never got ready"; tail -n 20 "$log_dir/guest.log"; exit 1; }
if grep -q '^SKIP' "$log_dir/guest.log"; then
    say "skipped: no GPU"
    exit 0
fi
wait_line '^CHECKPOINT ready' 2 900 || { say "the second run never got ready"; exit 1; }
say "second run: the daemon killed $rounds times mid-loop"
done_kills=0
for ((r = 1; r <= rounds; r++)); do
    sleep 2
    # Only while the second run still runs.
    if ! kill -0 "$vm" 2>/dev/null || (($(grep -c '^EXIT' "$log_dir/guest.log" || true) >= 2)); then
        say "the second run ended before restart $r (use more --iterations for more restarts)"
        break
    fi
    done_kills=$r
    before=$(grep -c 'request ring of the previous daemon' "$log_dir/daemon.log" || true)
    pid=$(cat "$log_dir/daemon.pid")
    t0=$(date +%s%N)
    kill -KILL "$pid"
    n=0
    until (($(grep -c 'request ring of the previous daemon' "$log_dir/daemon.log" || true) > before)); do
        n=$((n + 1))
        ((n <= 600)) || { say "restart $r: the new daemon never served the ring"; rc=1; break; }
        sleep 0.05
    done
    t1=$(date +%s%N)
    say "restart $r: killed pid $pid; the ring served again $(((t1 - t0) / 1000000)) ms later (RestartSec=1 s included)"
done
((done_kills > 0)) || { say "FAILED: the daemon was never killed mid-run"; rc=1; }
wait "$vm" || rc=$?
vm=""
mapfile -t sums < <(grep '^CHECKSUM' "$log_dir/guest.log" | awk '{print $2}')
grep -E '^(RUN|CHECKSUM|PASS|FAIL|EXIT)' "$log_dir/guest.log" | sed 's/^/  /'
grep -E 'taken over after a daemon restart|taken again|given again|cannot be taken over' "$log_dir/daemon.log" |
    sed 's/^.*Z *//' | sed 's/^/  daemon: /' || true
if ((${#sums[@]} != 2)); then
    say "FAILED: ${#sums[@]} of 2 runs printed a checksum; logs in $log_dir"
    exit 1
fi
if [[ ${sums[0]} != "${sums[1]}" ]]; then
    say "FAILED: checksums differ (${sums[*]}); logs in $log_dir"
    exit 1
fi
if ((rc != 0)) || (($(grep -c '^PASS' "$log_dir/guest.log") != 2)); then
    say "FAILED (exit $rc); logs in $log_dir"
    exit 1
fi
say "ok: the same checksum ${sums[0]} uninterrupted and across $done_kills daemon kills"

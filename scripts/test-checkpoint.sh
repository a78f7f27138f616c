#!/usr/bin/env bash
# test-checkpoint.sh: an operator pauses a guest program's GPU work mid-loop and resumes it; the
# program's result must equal an uninterrupted run's. The program (tests/cuda/
# checkpoint_linked_list) keeps a linked list in device memory (pointers stored in device
# memory), two streams ordered by events, a captured graph launched every iteration and a managed
# buffer. Three guest runs on one daemon: uninterrupted; paused once mid-loop (vhost-cuda --pause
# all, HOLD seconds, --resume all, from the host while the guest runs); paused ROUNDS times.
# Compares the CHECKSUM lines, and prints each pause's and resume's bytes, time and rate from
# the daemon's answers (pause/resume time per GiB). Without a GPU the program prints SKIP and so
# does this script ("skipped: no GPU"). Works from the repo and from an unpacked bundle.
#
#   scripts/test-checkpoint.sh [--iterations N] [--hold S] [--rounds R] [--log-dir DIR]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/gpu-host.sh
. "$here/gpu-host.sh"
DAEMON=$(daemon_binary "$here")
iterations=3000 hold=3 rounds=3 log_dir=""
while (($#)); do
    case $1 in
    --iterations) iterations=$2; shift 2 ;;
    --hold) hold=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --log-dir) log_dir=$2; shift 2 ;;
    *) echo "test-checkpoint.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
log_dir=${log_dir:-$(mktemp -d)}
mkdir -p "$log_dir"
sock=$log_dir/vhost-cuda.sock
daemon="" vm=""
say() { printf '[test-checkpoint] %s\n' "$*"; }
cleanup() {
    [[ -z $vm ]] || vm_stop "$vm"
    [[ -z $daemon ]] || kill -KILL "$daemon" 2>/dev/null || true
}
trap cleanup EXIT
RUST_LOG=${RUST_LOG:-info} "$DAEMON" --socket-path "$sock" >>"$log_dir/daemon.log" 2>&1 &
daemon=$!
daemon_wait "$log_dir/daemon.log" "$sock" || { say "vhost-cuda did not start"; exit 1; }

# One guest boot runs the program three times, each started when the host says so (a file the
# guest polls is not available: the host watches the guest's output instead).
prog=/opt/qcuda/tests/checkpoint_linked_list
guest_cmd="insmod /lib/modules/qcuda.ko; for run in plain once many; do echo RUN \$run; $prog $iterations 2000; echo EXIT \$?; done"
"$here/run-vm.sh" --socket "$sock" --timeout 3000 --log-dir "$log_dir/vm" -- "$guest_cmd" \
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
op() { # pause|resume: the daemon's answer into the log, with its lines shown
    "$DAEMON" "--$1" all --socket-path "$sock" | tee -a "$log_dir/operator.log" | sed 's/^/  /'
}
pause_rounds() { # rounds
    for ((r = 0; r < $1; r++)); do
        sleep 1
        op pause || { say "pause refused"; return 1; }
        sleep "$hold"
        op resume || { say "resume refused"; return 1; }
    done
}
rc=0
wait_line '^\(CHECKPOINT ready\|SKIP\)' 1 900 || { say "the first run never got ready"; tail -n 20 "$log_dir/guest.log"; exit 1; }
if grep -q '^SKIP' "$log_dir/guest.log"; then
    say "skipped: no GPU"
    exit 0
fi
wait_line '^CHECKPOINT ready' 2 900 || { say "the second run never got ready"; exit 1; }
say "second run: one pause of ${hold}s mid-loop"
pause_rounds 1 || rc=1
wait_line '^CHECKPOINT ready' 3 900 || { say "the third run never got ready"; exit 1; }
say "third run: $rounds pauses"
pause_rounds "$rounds" || rc=1
wait "$vm" || rc=$?
vm=""
mapfile -t sums < <(grep '^CHECKSUM' "$log_dir/guest.log" | awk '{print $2}')
grep -E '^(RUN|CHECKSUM|PASS|FAIL|EXIT)' "$log_dir/guest.log" | sed 's/^/  /'
if ((${#sums[@]} != 3)); then
    say "FAILED: ${#sums[@]} of 3 runs printed a checksum; logs in $log_dir"
    exit 1
fi
if [[ ${sums[0]} != "${sums[1]}" || ${sums[0]} != "${sums[2]}" ]]; then
    say "FAILED: checksums differ (${sums[*]}); logs in $log_dir"
    exit 1
fi
if ((rc != 0)) || (($(grep -c '^PASS' "$log_dir/guest.log") != 3)); then
    say "FAILED (exit $rc); logs in $log_dir"
    exit 1
fi
say "rates (bytes, seconds, GiB/s per pause and resume):"
grep -E ': (paused|resumed),' "$log_dir/operator.log" | sed 's/^/  /'
say "ok: the same checksum ${sums[0]} uninterrupted, paused once and paused $rounds times"

#!/usr/bin/env bash
# test-torch-pause.sh: PyTorch training in the guest, paused and resumed by the operator mid-run,
# must give the uninterrupted run's loss curve step for step (issue 31). tests/torch/train_check.py
# (a small conv net: cuDNN and cuBLAS, fixed seed, deterministic algorithms) runs natively once,
# then twice in one guest on a daemon of this script's own: uninterrupted, and paused ROUNDS
# times (vhost-cuda --pause all, HOLD seconds, --resume all, from the host through the stats
# socket, while the guest trains). The guest runs the host's own PyTorch (a read-only share of /,
# chrooted, qcuda's libraries in front), as scripts/run-torch-test.sh does. The two guest curves
# must be equal bit for bit (LOSS lines, and the final PARAMS); the native curve is shown beside
# them (equal too when the guest's libraries pick the same algorithms).
#
#   scripts/test-torch-pause.sh [--steps N] [--rounds R] [--hold S] [--python PATH] [--log-dir DIR]
#
# Without a GPU: "skipped: no GPU"; without PyTorch: "skipped: no PyTorch". Works from the repo
# and from an unpacked bundle.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -x $here/bin/vhost-cuda ]]; then # the bundle
    check=$here/tests/torch/train_check.py
else # the repo
    check=$here/../tests/torch/train_check.py
fi
# shellcheck source=scripts/gpu-host.sh
. "$here/gpu-host.sh"
DAEMON=$(daemon_binary "$here")
steps=50 rounds=2 hold=3 logs="" python=${PYTHON:-$(command -v python3 || true)}
while (($#)); do
    case $1 in
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --hold) hold=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--rounds R] [--hold S] [--python PATH] [--log-dir DIR]" >&2; exit 2 ;;
    esac
done
logs=${logs:-$(mktemp -d)}
mkdir -p "$logs"
say() { printf '[test-torch-pause] %s\n' "$*"; }
skip_without_gpu_torch "$python"

say "native"
TRAIN_STEPS=$steps "$python" "$check" >"$logs/native.log" 2>&1
grep -E '^(PASS|FAIL|SKIP|TORCH)' "$logs/native.log" | sed 's/^/  /'

sock=$logs/vhost-cuda.sock daemon="" vm=""
cleanup() {
    [[ -z $vm ]] || vm_stop "$vm"
    [[ -z $daemon ]] || kill -KILL "$daemon" 2>/dev/null || true
}
trap cleanup EXIT
RUST_LOG=${RUST_LOG:-info} "$DAEMON" --socket-path "$sock" >>"$logs/daemon.log" 2>&1 &
daemon=$!
daemon_wait "$logs/daemon.log" "$sock" || { say "vhost-cuda did not start"; exit 1; }

# One guest boot, two runs; the steps are slowed a little so that pauses land mid-run.
run="env LD_LIBRARY_PATH=/usr/lib/qcuda TRAIN_STEPS=$steps TRAIN_STEP_SLEEP=0.3 $python /opt/qcuda/train_check.py"
say "guest: an uninterrupted run, then one paused $rounds times for ${hold}s"
"$here/run-vm.sh" --socket "$sock" --mem 16G --smp 4 --timeout 3000 --log-dir "$logs/vm" \
    --share /:/host:ro --chroot /host --add "$check:/opt/qcuda/train_check.py" -- \
    "echo RUN plain; $run; echo EXIT \$?; echo RUN paused; $run; echo EXIT \$?" \
    >"$logs/guest-raw.log" 2>&1 &
vm=$!
count() { tr -d '\r' <"$logs/guest-raw.log" 2>/dev/null | grep -c "$1" || true; }
wait_count() { # pattern count seconds
    local n=0
    until (($(count "$1") >= $2)); do
        n=$((n + 1))
        ((n <= $3 * 10)) && kill -0 "$vm" 2>/dev/null || return 1
        sleep 0.1
    done
}
op() { # pause|resume
    "$DAEMON" "--$1" all --socket-path "$sock" | tee -a "$logs/operator.log" | sed 's/^/  /'
}
rc=0
wait_count '^\(TRAIN ready\|SKIP\)' 1 1800 || { say "the first run never started"; tail -n 20 "$logs/guest-raw.log"; exit 1; }
wait_count '^TRAIN ready' 2 2400 || { say "the second run never started"; tail -n 20 "$logs/guest-raw.log"; exit 1; }
# Pauses spread over the run: after steps steps/(R+1), 2*steps/(R+1), ...
for ((r = 1; r <= rounds; r++)); do
    at=$((steps * r / (rounds + 1)))
    # LOSS lines of the first run (steps) plus this run's up to `at`.
    wait_count '^LOSS ' $((steps + at)) 1800 || { say "the second run stopped before step $at"; rc=1; break; }
    say "pause $r after step $at"
    op pause || { say "pause refused"; rc=1; break; }
    sleep "$hold"
    op resume || { say "resume refused"; rc=1; break; }
done
wait "$vm" || rc=1
vm=""
tr -d '\r' <"$logs/guest-raw.log" >"$logs/guest.log"
awk '/^RUN plain/{f="plain"} /^RUN paused/{f="paused"} f && /^(LOSS|PARAMS|PASS|FAIL|EXIT)/{print > (dir "/" f ".log")}' \
    dir="$logs" "$logs/guest.log"
for f in plain paused; do
    [[ -f $logs/$f.log ]] || : >"$logs/$f.log"
done
curve() { grep -E '^(LOSS|PARAMS) ' "$1" | awk '{print $1, $2, $3}'; }
n_plain=$(grep -c '^LOSS ' "$logs/plain.log") n_paused=$(grep -c '^LOSS ' "$logs/paused.log")
say "steps: native $(grep -c '^LOSS ' "$logs/native.log"), guest $n_plain uninterrupted, $n_paused paused"
paste -d' ' <(grep '^LOSS ' "$logs/native.log" | awk '{print $2, $4}') \
    <(grep '^LOSS ' "$logs/plain.log" | awk '{print $4}') \
    <(grep '^LOSS ' "$logs/paused.log" | awk '{print $4}') |
    awk 'BEGIN { print "  step native guest guest-paused" } { print "  " $0 }'
if ((n_plain != steps || n_paused != steps)); then
    say "FAILED: a guest run did not finish its $steps steps; logs in $logs"
    exit 1
fi
if ! diff <(curve "$logs/plain.log") <(curve "$logs/paused.log") >"$logs/curve.diff"; then
    say "FAILED: the paused run's loss curve differs from the uninterrupted run's:"
    head -n 20 "$logs/curve.diff" | sed 's/^/  /'
    exit 1
fi
if diff -q <(curve "$logs/native.log") <(curve "$logs/plain.log") >/dev/null; then
    say "the guest's curve equals the native one bit for bit"
else
    say "note: the guest's curve differs from the native one (other algorithms picked?)"
fi
if ((rc != 0)) || (($(grep -c '^PASS ' "$logs/guest.log") != 2)); then
    say "FAILED (exit $rc); logs in $logs"
    exit 1
fi
say "pause and resume (bytes, seconds, GiB/s):"
grep -E ': (paused|resumed),' "$logs/operator.log" | sed 's/^/  /'
say "ok: the loss curve of $steps steps paused $rounds times equals the uninterrupted run's"

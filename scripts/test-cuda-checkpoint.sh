#!/usr/bin/env bash
# test-cuda-checkpoint.sh: CUDA's process checkpoint (cuCheckpointProcess*, NVIDIA's
# cuda-checkpoint --toggle --pid) on a running program, natively and inside the guest, where the
# guest runs the host's own userland (a read-only share of /, chrooted) so that the host's
# cuda-checkpoint, when it has one, runs over qcuda's libcuda.so.1. tests/guest/check-cuda-checkpoint
# does the work on each side: an uninterrupted run, a run toggled off and on ROUNDS times mid-loop
# (its checksum must be equal), and checkpoint_toggle's walk of the documented state machine.
# The "INFO" lines (what a process without CUDA and another user get) are compared between the
# two sides. Without a GPU: "skipped: no GPU". Works from the repo and from an unpacked bundle.
#
#   scripts/test-cuda-checkpoint.sh [--iterations N] [--rounds R] [--log-dir DIR]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -d $here/native-tests ]]; then # the bundle
    native=$here/native-tests check=$here/tests/guest/check-cuda-checkpoint
else # the repo
    native=$here/../build/cuda-tests check=$here/../tests/guest/check-cuda-checkpoint
fi
iterations=3000 rounds=2 logs=""
while (($#)); do
    case $1 in
    --iterations) iterations=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    *) echo "usage: $0 [--iterations N] [--rounds R] [--log-dir DIR]" >&2; exit 2 ;;
    esac
done
logs=${logs:-$(mktemp -d)}
mkdir -p "$logs"
say() { printf '[test-cuda-checkpoint] %s\n' "$*"; }
# shellcheck source=scripts/gpu-host.sh
. "$here/gpu-host.sh"
if ! gpu_present; then
    echo "skipped: no GPU"
    exit 0
fi

say "native"
PROG=$native/checkpoint_linked_list TOOL=$native/checkpoint_toggle \
    LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    sh "$check" "$iterations" 2000 "$rounds" 2>&1 | tee "$logs/native.log"

say "guest (the host's userland, qcuda's libcuda.so.1 in front)"
"$here/run-vm.sh" --mem 8G --timeout 2400 --log-dir "$logs/vm" \
    --share /:/host:ro --chroot /host -- \
    "env LD_LIBRARY_PATH=/usr/lib/qcuda /opt/qcuda/bin/check-cuda-checkpoint $iterations 2000 $rounds" 2>&1 |
    tr -d '\r' | sed -u -E 's/\x1b\[[0-9;?]*[A-Za-z]//g' | tee "$logs/guest.log" | grep -E '^(CKPT|qcuda)'

rc=0
for side in native guest; do
    last=$(grep '^CKPT ' "$logs/$side.log" | tail -n 1)
    case $last in
    "CKPT ok") say "$side: ok" ;;
    "CKPT SKIP"*) say "$side: ${last#CKPT }" ;;
    # The host's own driver refusing to checkpoint (a GPU host in a VM, a driver without
    # checkpoint support) is that host's limit, not qcuda's: the guest's result stands alone.
    "CKPT FAIL toggle off (round 1)") [[ $side == native ]] && say "native: this host's driver cannot checkpoint ($(grep -m1 -E 'CUDA_ERROR_[A-Z_]+' "$logs/native.log" | grep -oE 'CUDA_ERROR_[A-Z_]+' | head -n 1)): informational" || { say "$side: FAILED (${last}); logs in $logs"; rc=1; } ;;
    *) say "$side: FAILED (${last:-no result}); logs in $logs"; rc=1 ;;
    esac
done
if ! diff <(grep '^CKPT INFO' "$logs/native.log") <(grep '^CKPT INFO' "$logs/guest.log") >"$logs/info.diff"; then
    say "note: the guest's answers differ from the native driver's (native <, guest >):"
    sed 's/^/  /' "$logs/info.diff"
fi
exit $rc

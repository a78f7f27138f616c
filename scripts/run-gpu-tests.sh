#!/usr/bin/env bash
# run-gpu-tests.sh: on a GPU host, from an unpacked bundle (scripts/bundle.sh): runs every CUDA
# test program natively (the host's own libcudart) and inside the qcuda guest (ours, remoted to
# this GPU), checks that a killed guest program leaves no GPU memory behind, and prints a table.
#   ./run-gpu-tests.sh [--only NAME] [--log-dir DIR]
set -uo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
only="" logs=$B/logs
while (($#)); do
    case $1 in
    --only) only=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    *) echo "usage: $0 [--only NAME] [--log-dir DIR]" >&2; exit 2 ;;
    esac
done
mkdir -p "$logs"
passed=0 failed=0 skipped=0
res() { # status name
    printf '%-5s %s\n' "$1" "$2"
    case $1 in ok) passed=$((passed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; *) failed=$((failed + 1)) ;; esac
}
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "skipped: no GPU"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
nvidia-smi -L
cudart=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | head -n1)

echo "== native (host libcudart from $cudart)"
for t in "$B"/native-tests/*; do
    n=$(basename "$t")
    [[ -z $only || $n == "$only" ]] || continue
    s=$(date +%s.%N)
    LD_LIBRARY_PATH=$cudart "$t" >"$logs/native-$n.log" 2>&1
    rc=$?
    e=$(date +%s.%N)
    awk -v n="$n" -v s="$s" -v e="$e" 'BEGIN { printf "%s %.3f\n", n, e - s }' >>"$logs/native-times"
    case $rc in 0) res ok "native/$n" ;; *) res FAIL "native/$n (exit $rc)"; tail -n 5 "$logs/native-$n.log" ;; esac
done

echo "== guest (TCG or KVM, through QEMU, qcuda.ko and vhost-cuda)"
cmd=/opt/qcuda/bin/check-cuda
[[ -z $only ]] || cmd="insmod /lib/modules/qcuda.ko && /opt/qcuda/tests/$only"
"$B/run-vm.sh" --log-dir "$logs/vm" --timeout 1500 -- "$cmd" 2>&1 | tee "$logs/guest.log"
while IFS= read -r l; do
    case $l in
    "CHECK ok "*) res ok "guest/${l#CHECK ok cuda/}" ;;
    "CHECK SKIP "*) res FAIL "guest/${l#CHECK SKIP cuda/} (skipped on a GPU host)" ;;
    "CHECK FAIL "*) res FAIL "guest/${l#CHECK FAIL cuda/}" ;;
    esac
done < <(tr -d '\r' <"$logs/guest.log")
grep -q 'sessions open: 0' "$logs/vm/daemon.log" && res ok "daemon: every session closed" || res FAIL "daemon: sessions left open"

echo "== a guest program killed mid-run leaves no GPU memory behind"
kill_check() {
    "$B/run-vm.sh" --log-dir "$logs/vm-kill" --timeout 600 -- \
        'insmod /lib/modules/qcuda.ko; /opt/qcuda/tests/large_copy & p=$!; sleep 4; kill -9 $p; wait $p; echo KILLED-DONE; sleep 8' \
        >"$logs/kill.log" 2>&1 &
    local vm=$!
    for _ in $(seq 600); do grep -q KILLED-DONE "$logs/kill.log" && break; sleep 0.5; done
    sleep 2
    local pid
    pid=$(pgrep -f "$B/bin/vhost-cuda" | head -n1)
    local used
    used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | awk -F', ' -v p="$pid" '$1 == p {print $2}')
    echo "vhost-cuda pid $pid, GPU memory still held after the kill: ${used:-none}"
    wait $vm
    [[ -n $pid && -z $used ]]
}
kill_check && res ok "killed guest program: no GPU memory left" || res FAIL "killed guest program: GPU memory left"
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))

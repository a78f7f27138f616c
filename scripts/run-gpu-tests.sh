#!/usr/bin/env bash
# run-gpu-tests.sh: on a GPU host, from an unpacked bundle (scripts/bundle.sh): runs every CUDA
# test program natively (the host's own libcudart) and inside the qcuda guest (ours, remoted to
# this GPU), checks that a killed guest program leaves no GPU memory behind, and prints a table.
#   ./run-gpu-tests.sh [--only NAME] [--log-dir DIR] [--samples DIR]
# --samples DIR: also run third-party CUDA programs (e.g. NVIDIA's cuda-samples built with
# nvcc --cudart=shared), natively and in the guest; each must exit 0.
set -uo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
only="" logs=$B/logs samples=""
while (($#)); do
    case $1 in
    --only) only=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    --samples) samples=$(cd "$2" && pwd); shift 2 ;;
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
    LD_LIBRARY_PATH=$cudart:$B/cuda-runtimes/12 "$t" >"$logs/native-$n.log" 2>&1
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

# The guest sees the GPU's own attribute values, except those qcuda reports deliberately
# (guest-lib/src/device_prop.rs: NOT_REMOTED and QCUDA_VALUES; a guest-lib test keeps this list
# equal to them).
QCUDA_OWN_ATTRIBUTES="83 86 88 89 91 96 100 101 102 103 112 114 116 117 118 119 121 124 125 128 142 143 144 146"
if [[ -z $only || $only == device_attributes ]] && [[ -f $logs/native-device_attributes.log ]]; then
    attrs() { grep -E '^(ATTR|PROP) ' | tr -d '\r' | awk -v own=" $QCUDA_OWN_ATTRIBUTES " '!($1 == "ATTR" && index(own, " " $3 " "))'; }
    attrs <"$logs/native-device_attributes.log" >"$logs/attrs-native.txt"
    sed -n '/^--- device_attributes/,/CHECK .* cuda\/device_attributes/p' "$logs/guest.log" | attrs >"$logs/attrs-guest.txt"
    if [[ -s $logs/attrs-native.txt ]] && diff "$logs/attrs-native.txt" "$logs/attrs-guest.txt" >"$logs/attrs.diff"; then
        res ok "guest attributes equal native ($(wc -l <"$logs/attrs-native.txt") values, $(wc -w <<<"$QCUDA_OWN_ATTRIBUTES") qcuda's own)"
    else
        res FAIL "guest attributes differ from native (see attrs.diff)"; head -n 20 "$logs/attrs.diff"
    fi
fi

if [[ -n $samples ]]; then
    echo "== third-party programs from $samples: native, then in the guest"
    for t in "$samples"/*; do
        [[ -x $t ]] || continue # kernel images and data files beside the programs
        n=$(basename "$t")
        if LD_LIBRARY_PATH=$cudart "$t" >"$logs/sample-native-$n.log" 2>&1; then res ok "native/sample/$n"; else
            res FAIL "native/sample/$n"; tail -n 5 "$logs/sample-native-$n.log"; fi
    done
    gcmd='insmod /lib/modules/qcuda.ko; for t in /opt/samples/*; do [ -x "$t" ] || continue; echo "--- $t"; "$t"; echo "SAMPLE-EXIT $(basename $t) $?"; done'
    "$B/run-vm.sh" --log-dir "$logs/vm-samples" --timeout 900 --add "$samples:/opt/samples" -- "$gcmd" 2>&1 |
        tr -d '\r' | tee "$logs/guest-samples.log" | grep -E '^(---|SAMPLE-EXIT|Result|Test|.*PASS|.*FAIL|Device [0-9]|  CUDA)' | head -n 60
    while read -r _ n rc; do
        if [[ $rc == 0 ]]; then res ok "guest/sample/$n"; else res FAIL "guest/sample/$n (exit $rc)"; fi
    done < <(grep '^SAMPLE-EXIT ' "$logs/guest-samples.log")
fi

echo "== a guest program killed mid-run leaves no GPU memory behind"
kill_check() {
    # Device totals (nvidia-smi memory.used, all GPUs), not per-process accounting: on some
    # hosts (the lent H100s) nvidia-smi lists no compute processes at all, so the workers'
    # memory cannot be seen per process. large_copy holds 2 GiB on the device; after its kill
    # the GPU must be back at its level before the VM started, within a small tolerance for
    # the driver's own bookkeeping, and no session worker may be left.
    local tolerance=64 min_rise=1024
    device_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{ s += $1 } END { print s + 0 }'; }
    local base peak after workers
    base=$(device_mem)
    peak=$base
    "$B/run-vm.sh" --log-dir "$logs/vm-kill" --timeout 600 -- \
        'insmod /lib/modules/qcuda.ko; /opt/qcuda/tests/large_copy >/tmp/lc.log 2>&1 & p=$!; n=0; until grep -q "GB/s" /tmp/lc.log || [ $n -ge 600 ]; do sleep 0.2; n=$((n+1)); done; sleep 1; kill -9 $p; wait $p; cat /tmp/lc.log; echo KILLED-DONE; sleep 8' \
        >"$logs/kill.log" 2>&1 &
    local vm=$! used
    for _ in $(seq 1200); do
        grep -q KILLED-DONE "$logs/kill.log" && break
        used=$(device_mem)
        ((used > peak)) && peak=$used
        sleep 0.5
    done
    sleep 3
    after=$(device_mem)
    workers=$(pgrep -fc -- '--session-worker' || true)
    echo "GPU memory used (all GPUs): before the VM ${base} MiB; peak while the program ran ${peak} MiB;" \
        "after its kill ${after} MiB (tolerance ${tolerance} MiB); workers left: ${workers}"
    wait $vm
    ((peak - base >= min_rise && after - base <= tolerance && workers == 0))
}
kill_check && res ok "killed guest program: no GPU memory left" || res FAIL "killed guest program: GPU memory left"
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))

#!/usr/bin/env bash
# run-gpu-tests.sh: on a GPU host, from an unpacked bundle (scripts/bundle.sh): runs every CUDA
# test program natively (the host's own libcudart) and inside the qcuda guest (ours, remoted to
# this GPU), checks that a killed guest program leaves no GPU memory behind, and prints a table.
#   ./run-gpu-tests.sh [--only NAME] [--log-dir DIR] [--samples DIR] [--kernel own|stock] [--libraries]
# --kernel stock: every guest boots Debian's stock kernel with qcuda.ko built against its headers
# (run-vm.sh --kernel stock; the environment's QCUDA_KERNEL does the same).
# --samples DIR: also run third-party CUDA programs (e.g. NVIDIA's cuda-samples built with
# nvcc --cudart=shared), natively and in the guest; each must exit 0.
# --libraries: only the programs of tests/cuda/libraries (cuSPARSE, cuBLAS: the bundle's
# native-libraries/, the guest's /opt/qcuda/libraries), natively with the host toolkit's
# libraries and then in one guest chrooted into the host's root, with
# LD_LIBRARY_PATH=/usr/lib/qcuda:<the toolkit's lib64>: our runtime, NVIDIA's libraries over our
# driver. A program whose teardown fails prints the driver calls of its teardown (ilu_cg).
set -uo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
only="" logs=$B/logs samples="" libraries=0
while (($#)); do
    case $1 in
    --only) only=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    --samples) samples=$(cd "$2" && pwd); shift 2 ;;
    --kernel) export QCUDA_KERNEL=$2; shift 2 ;;
    --libraries) libraries=1; shift ;;
    *) echo "usage: $0 [--only NAME] [--log-dir DIR] [--samples DIR] [--kernel own|stock] [--libraries]" >&2; exit 2 ;;
    esac
done
mkdir -p "$logs"
passed=0 failed=0 skipped=0
res() { # status name
    printf '%-5s %s\n' "$1" "$2"
    case $1 in ok) passed=$((passed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; *) failed=$((failed + 1)) ;; esac
}
# shellcheck source=scripts/gpu-host.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu-host.sh"
if ! gpu_present; then
    echo "skipped: no GPU"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
nvidia-smi -L
cudart=$(host_cudart)

if ((libraries)); then
    libs=$B/native-libraries
    [[ -d $libs ]] || libs=$B/../build/cuda-libraries
    echo "== native library programs (the toolkit's libraries from ${cudart:-the default path})"
    names=()
    for t in "$libs"/*; do
        [[ -x $t ]] || continue
        n=$(basename "$t")
        [[ -z $only || $n == "$only" ]] || continue
        names+=("$n")
        LD_LIBRARY_PATH=$cudart "$t" >"$logs/native-lib-$n.log" 2>&1
        rc=$?
        tail -n 3 "$logs/native-lib-$n.log" | sed 's/^/    /'
        case $rc in 0) res ok "native/libraries/$n" ;; *) res FAIL "native/libraries/$n (exit $rc)" ;; esac
    done
    echo "== the same in a guest chrooted into this host's root (our libcudart and libcuda, the toolkit's libraries)"
    gcmd="for n in ${names[*]}; do echo \"--- \$n\"; LD_LIBRARY_PATH=/usr/lib/qcuda:$cudart /opt/qcuda/libraries/\$n; echo \"LIB-EXIT \$n \$?\"; done"
    "$B/run-vm.sh" --mem 8G --log-dir "$logs/vm-libraries" --timeout 1200 --share /:/host:ro --chroot /host -- "$gcmd" 2>&1 |
        tr -d '\r' | sed -u -E 's/\x1b\[[0-9;?]*[A-Za-z]//g' | tee "$logs/guest-libraries.log" | grep -E '^(---|LIB-EXIT|PASS|FAIL|SKIP|teardown|trace|traced|ilu_cg|qcuda guest)'
    for n in "${names[@]}"; do
        rc=$(sed -n "s/^LIB-EXIT $n //p" "$logs/guest-libraries.log" | tail -n 1)
        case $rc in 0) res ok "guest/libraries/$n" ;; *) res FAIL "guest/libraries/$n (exit ${rc:-none: the guest ended first})" ;; esac
    done
    echo "$passed passed, $failed failed, $skipped skipped"
    ((failed == 0))
    exit
fi

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
# (guest-lib/src/core/devices/device_prop.rs: NOT_REMOTED and QCUDA_VALUES; a guest-lib test keeps
# this list equal to them).
QCUDA_OWN_ATTRIBUTES="83 86 88 89 91 96 100 101 112 114 116 117 118 119 121 124 128 132 141 142 143 144 146"
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
        tr -d '\r' | sed -u -E 's/\x1b\[[0-9;?]*[A-Za-z]//g' | tee "$logs/guest-samples.log" | grep -E '^(---|SAMPLE-EXIT|Result|Test|.*PASS|.*FAIL|Device [0-9]|  CUDA)' | head -n 60
    while read -r _ n rc; do
        if [[ $rc == 0 ]]; then res ok "guest/sample/$n"; else res FAIL "guest/sample/$n (exit $rc)"; fi
    done < <(grep '^SAMPLE-EXIT ' "$logs/guest-samples.log")
fi

echo "== a guest program killed mid-run leaves no GPU memory behind"
# shellcheck source=qcuda-accounting.sh
. "$B/qcuda-accounting.sh"
kill_check() {
    # qcuda's own accounting (the daemon's stats socket and the guest's qcuda-smi), which holds
    # on a GPU that others use too: large_copy --hold allocates 2 GiB and launches kernels until
    # it is killed; while it runs the VM must hold at least that, per the guest and the host
    # alike; after its kill the VM must hold nothing, with no session and no worker left. The
    # device's totals (nvidia-smi memory.used, all GPUs) are a second opinion, compared only
    # when nothing else used the GPU before and after (qa_gpu_others).
    local dir=$logs/kill sock held before after guest_after sessions workers others_before
    local device_before device_peak device_after used ok=1
    mkdir -p "$dir"
    sock=$dir/vm.sock
    rm -f "$sock" "$sock.stats"
    others_before=$(qa_gpu_others)
    device_before=$(qa_device_mib)
    device_peak=$device_before
    RUST_LOG=info "$DAEMON" --socket-path "$sock" >"$dir/daemon.log" 2>&1 &
    local daemon=$!
    for _ in $(seq 100); do [[ -S $sock && -S $sock.stats ]] && break; sleep 0.1; done
    "$B/run-vm.sh" --socket "$sock" --log-dir "$dir/vm" --timeout 600 -- \
        'insmod /lib/modules/qcuda.ko; /opt/qcuda/tests/large_copy --hold 1024 >/tmp/lc.log 2>&1 & p=$!; n=0; until grep -q "progress 100" /tmp/lc.log || ! kill -0 $p || [ $n -ge 900 ]; do sleep 0.2; n=$((n+1)); done; grep HOLDING /tmp/lc.log; echo "GUEST-MEM $(qcuda-smi memory)"; qcuda-smi; echo KILL-NOW; sleep 2; kill -9 $p; wait $p; echo "GUEST-MEM-AFTER $(qcuda-smi memory)"; echo KILLED-DONE; sleep 5' \
        >"$logs/kill.log" 2>&1 &
    local vm=$! peak=0 v
    for _ in $(seq 1800); do
        tr -d '\r' <"$logs/kill.log" | grep -q '^KILLED-DONE' && break
        v=$(qa_vm "$sock" "$sock" qcuda_vm_gpu_memory_bytes)
        ((${v:-0} > peak)) && peak=$v
        used=$(qa_device_mib)
        ((used > device_peak)) && device_peak=$used
        kill -0 $vm 2>/dev/null || break
        sleep 0.5
    done
    sleep 1
    held=$(tr -d '\r' <"$logs/kill.log" | sed -n 's/^HOLDING //p')
    before=$(tr -d '\r' <"$logs/kill.log" | sed -n 's/^GUEST-MEM //p')
    guest_after=$(tr -d '\r' <"$logs/kill.log" | sed -n 's/^GUEST-MEM-AFTER //p')
    after=$(qa_vm "$sock" "$sock" qcuda_vm_gpu_memory_bytes)
    sessions=$(qa_vm "$sock" "$sock" qcuda_vm_sessions)
    workers=$(qa_workers "$sock")
    wait $vm
    kill -TERM $daemon
    wait $daemon
    grep -F ' closed (' "$dir/daemon.log" | tail -n 2 | sed 's/^/  daemon: /'
    echo "qcuda's accounting: large_copy allocated ${held:-?} bytes; the VM held ${before:-?} (guest) and at most $peak (host) while it ran;" \
        "after its kill ${guest_after:-?} (guest), ${after:-?} (host), sessions ${sessions:-?}, workers $workers"
    [[ -n $held && -n $before ]] && ((before >= held && peak >= held)) || ok=0
    [[ $guest_after == 0 && $after == 0 && $sessions == 0 && $workers == 0 ]] || ok=0
    sleep 2
    device_after=$(qa_device_mib)
    if ((others_before == 0 && $(qa_gpu_others) == 0)); then
        echo "second opinion (GPU otherwise idle): device memory before ${device_before} MiB, peak ${device_peak} MiB, after ${device_after} MiB"
        ((device_peak - device_before >= 1024 && device_after - device_before <= 64)) || ok=0
    else
        echo "device totals not compared: the GPU is used by others ($others_before process(es) before)"
    fi
    ((ok))
}
DAEMON=$B/bin/vhost-cuda
[[ -x $DAEMON ]] || DAEMON=$B/../target/release/vhost-cuda
kill_check && res ok "killed guest program: no GPU memory left (qcuda's accounting)" || res FAIL "killed guest program: GPU memory left"

if [[ -z $only ]]; then
    echo "== two VMs on the GPU at once (two-vm-test.sh)"
    "$B/two-vm-test.sh" --log-dir "$logs/two-vm" | tee "$logs/two-vm.log"
    while IFS= read -r l; do
        case $l in
        "ok    "*) res ok "two VMs: ${l#ok    }" ;;
        "FAIL  "*) res FAIL "two VMs: ${l#FAIL  }" ;;
        esac
    done <"$logs/two-vm.log"
fi
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))

#!/usr/bin/env bash
# load-test.sh: several VMs at once, each on its own vhost-cuda, use one GPU host hard; the host
# must end exactly where it began. Two checks, on a GPU host (without one: "skipped: no GPU"):
#
#   load-test.sh kills [--count 1000] [--vms 4] [--parallel 6] [--max-delay-ms 2000]
#       COUNT guest CUDA programs (tests/cuda/mixed_load: pageable, pinned, registered and
#       mapped copies, launches, events, stream-ordered allocation, host functions, graphs), each
#       killed with SIGKILL a random 20..MAX ms after it started or, for 3 in 4, after its first
#       completed operation (qcuda-smi killprog), spread
#       over the VMs. Afterwards: no session in any daemon or guest, no worker process, no page
#       held by qcuda.ko, and no device memory held by any VM by qcuda's own accounting (the
#       daemons' stats); the device's own figure (gpu_meminfo, i.e. cuMemGetInfo) back at its
#       baseline is a second opinion, compared only when nothing else used the GPU.
#   load-test.sh load [--vms 4] [--procs 8] [--threads 8] [--seconds 300]
#       VMS x PROCS guest processes of THREADS threads each run mixed_load for SECONDS; every
#       result is checked. 20 s in, every VM also runs qcuda-smi hostile beside them. The
#       daemons' memory, descriptors, sessions and workers are sampled every 10 s (samples.csv);
#       the daemons' and the workers' private memory must not grow after the first 90 s, and
#       once the programs have ended the daemons must be back at their descriptor count before
#       the load, with no session, no worker, and no device memory held by any VM (the device's
#       own figure at its baseline as a second opinion, where nothing else used the GPU).
#
# Common options: --log-dir DIR (default ./logs-load), --smp N (guest CPUs, default 2).
# Runs from the repo (after scripts/test.sh built everything) or from an unpacked bundle.
# Prints one "ok|FAIL ..." line per check and "N passed, N failed"; exits non-zero on failure.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $here/guest/bzImage ]]; then # release bundle
    RUNVM=$here/run-vm.sh DAEMON=$here/bin/vhost-cuda MEMINFO=$here/host-tools/gpu_meminfo
else
    ROOT=$(cd "$here/.." && pwd)
    RUNVM=$ROOT/scripts/run-vm.sh DAEMON=$ROOT/target/release/vhost-cuda
    MEMINFO=$ROOT/build/host-tools/gpu_meminfo
fi
mode=${1:-}
shift || true
count=1000 vms=4 parallel=6 max_delay=2000 procs=8 threads=8 seconds=300 smp=2 logs=$PWD/logs-load
while (($#)); do
    case $1 in
    --count) count=$2; shift 2 ;;
    --vms) vms=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --max-delay-ms) max_delay=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    *) mode=help; break ;;
    esac
done
[[ $mode == kills || $mode == load ]] || { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
# shellcheck source=scripts/gpu-host.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu-host.sh"
if ! gpu_present; then
    echo "skipped: no GPU"
    exit 0
fi
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
cudart=$(host_cudart)
meminfo() { LD_LIBRARY_PATH=$cudart "$MEMINFO"; }
# shellcheck source=qcuda-accounting.sh
. "$here/qcuda-accounting.sh"
# What the VMs hold by qcuda's accounting (bytes, all VMs), and their workers.
vms_memory() {
    local i s=0
    for ((i = 0; i < vms; i++)); do s=$((s + $(qa_vm "$logs/vm$i/sock" "$logs/vm$i/sock" qcuda_vm_gpu_memory_bytes || echo 0))); done
    echo $s
}
vms_workers() {
    local i s=0
    for ((i = 0; i < vms; i++)); do s=$((s + $(qa_workers "$logs/vm$i/sock"))); done
    echo $s
}
# The device's figure is compared only when nothing but these VMs used the GPU.
device_check() { # what, before MiB, after MiB
    local others
    others=$(qa_gpu_others "${labels[@]}")
    if ((others_before == 0 && others == 0)); then
        (($3 - $2 <= 64)) && res ok "$1: second opinion (GPU otherwise idle): device memory back at its baseline ($2 -> $3 MiB)" ||
            res FAIL "$1: device memory $3 MiB after, $2 MiB before"
    else
        echo "load-test: device totals not compared: the GPU is used by others ($others_before before, $others after)"
    fi
}
passed=0 failed=0
res() { # ok|FAIL text
    printf '%-5s %s\n' "$1" "$2"
    if [[ $1 == ok ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

daemon_pids=()
cleanup() {
    for p in "${daemon_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT
start_daemons() {
    local i
    for ((i = 0; i < vms; i++)); do
        mkdir -p "$logs/vm$i"
        rm -f "$logs/vm$i/sock"
        RUST_LOG=info "$DAEMON" --socket-path "$logs/vm$i/sock" >"$logs/vm$i/daemon.log" 2>&1 &
        daemon_pids+=($!)
    done
    for ((i = 0; i < vms; i++)); do
        for _ in $(seq 100); do [[ -S $logs/vm$i/sock ]] && break; sleep 0.1; done
        [[ -S $logs/vm$i/sock ]] || { echo "load-test: vhost-cuda $i did not start"; cat "$logs/vm$i/daemon.log"; exit 1; }
    done
}
# Worker processes of the daemons (the only processes started with --session-worker).
workers() { pgrep -fc -- '--session-worker' || true; }
# Private memory (RssAnon), not VmRSS: the daemon and the workers map the guest's RAM (a shared
# memfd), and VmRSS grows with every guest page they touch, up to the guest's size, which is no
# leak. (The first load run on the H100 measured VmRSS: daemons 23 -> 62 MiB, workers +85 MiB
# each, over minutes 1 to 5.)
rss_kib() { awk '/^RssAnon:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
vmrss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
sessions() { grep -o 'sessions open: [0-9]*' "$1" | tail -n 1 | grep -o '[0-9]*$' || echo 0; }
workers_rss_kib() {
    local s=0 p
    for p in $(pgrep -f -- '--session-worker'); do s=$((s + $(rss_kib "$p"))); done
    echo $s
}
workers_vmrss_kib() {
    local s=0 p
    for p in $(pgrep -f -- '--session-worker'); do s=$((s + $(vmrss_kib "$p"))); done
    echo $s
}
# time, then per daemon: RssAnon KiB, fds, sessions; then workers, their RssAnon KiB, device MiB,
# and (for reference) the daemons' and workers' VmRSS KiB
sample() {
    local line i
    line=$SECONDS
    for ((i = 0; i < vms; i++)); do
        line+=",$(rss_kib "${daemon_pids[$i]}"),$(fds "${daemon_pids[$i]}"),$(sessions "$logs/vm$i/daemon.log")"
    done
    line+=",$(workers),$(workers_rss_kib),$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{ s += $1 } END { print s + 0 }')"
    local v=0
    for ((i = 0; i < vms; i++)); do v=$((v + $(vmrss_kib "${daemon_pids[$i]}"))); done
    echo "$line,$v,$(workers_vmrss_kib)"
}
csv_header() {
    local h=t_s i
    for ((i = 0; i < vms; i++)); do h+=",vm${i}_daemon_rss_kib,vm${i}_daemon_fds,vm${i}_sessions"; done
    echo "$h,workers,workers_rss_anon_kib,device_used_mib,daemons_vmrss_kib,workers_vmrss_kib"
}
vm_line() { # index, guest command, timeout
    "$RUNVM" --socket "$logs/vm$1/sock" --log-dir "$logs/vm$1/run" --smp "$smp" --timeout "$3" -- "$2" \
        >"$logs/vm$1/guest.log" 2>&1
}

labels=()
for ((i = 0; i < vms; i++)); do labels+=("$logs/vm$i/sock"); done
others_before=$(qa_gpu_others)
base=$(meminfo) || { echo "load-test: gpu_meminfo failed"; exit 1; }
echo "load-test: $mode on $(nvidia-smi -L | head -n 1); device memory in use before: $base MiB"
start_daemons

if [[ $mode == kills ]]; then
    per=$(((count + vms - 1) / vms))
    t0=$SECONDS
    vm_pids=()
    for ((i = 0; i < vms; i++)); do
        n=$per
        ((i == vms - 1)) && n=$((count - per * (vms - 1)))
        cmd="insmod /lib/modules/qcuda.ko && qcuda-smi killprog --count $n --parallel $parallel \
--max-delay-ms $max_delay --seed $((i + 1)) -- /opt/qcuda/tests/mixed_load --threads 4 --forever; \
echo KILLPROG-EXIT \$?; dmesg | grep -E 'WARNING|BUG|Oops' | sed 's/^/DMESG /'"
        vm_line "$i" "$cmd" 1800 &
        vm_pids+=($!)
    done
    for p in "${vm_pids[@]}"; do wait "$p"; done
    took=$((SECONDS - t0))
    sleep 3
    killed=0 working=0 ok_vms=0
    for ((i = 0; i < vms; i++)); do
        g=$logs/vm$i/guest.log
        tr -d '\r' <"$g" | grep -E '^killprog: [0-9]+ killed in|afterwards|FAILED|^DMESG' | sed "s/^/  vm$i: /"
        if tr -d '\r' <"$g" | grep -q '^KILLPROG-EXIT 0$' && ! grep -q '^DMESG' "$g"; then ok_vms=$((ok_vms + 1)); fi
        k=$(tr -d '\r' <"$g" | sed -n 's/^killprog: \([0-9]*\) killed in .*, \([0-9]*\) of them.*/\1 \2/p')
        k=${k:-0 0}
        killed=$((killed + ${k%% *}))
        working=$((working + ${k##* }))
    done
    after=$(meminfo)
    left=$(vms_workers)
    open=0
    for ((i = 0; i < vms; i++)); do open=$((open + $(sessions "$logs/vm$i/daemon.log"))); done
    echo "load-test: $killed guest CUDA programs killed in $took s over $vms VMs ($working after they had done work);" \
        "sessions open in the daemons: $open; workers left: $left; device memory before $base MiB, after $after MiB"
    ((ok_vms == vms)) && res ok "kills: every VM's killprog passed (no session, no held page in the guest, no kernel warning)" ||
        res FAIL "kills: killprog failed in $((vms - ok_vms)) VM(s) (logs in $logs/vm*/guest.log)"
    ((killed == count)) && res ok "kills: $killed programs killed" || res FAIL "kills: $killed of $count programs killed"
    ((open == 0 && left == 0)) && res ok "kills: no session and no worker left on the host" ||
        res FAIL "kills: $open session(s), $left worker(s) left on the host"
    held=$(vms_memory)
    ((held == 0 && $(vms_workers) == 0)) && res ok "kills: no VM holds device memory (qcuda's accounting)" ||
        res FAIL "kills: the VMs still hold $held bytes of device memory (qcuda's accounting)"
    device_check kills "$base" "$after"
else
    csv=$logs/samples.csv
    csv_header >"$csv"
    guest="insmod /lib/modules/qcuda.ko || exit 1; echo LOAD-START; sleep 5; p=1; pids=; \
while [ \$p -le $procs ]; do /opt/qcuda/tests/mixed_load --threads $threads --seconds $seconds --seed \$p \
>/tmp/load\$p.log 2>&1 & pids=\"\$pids \$!\"; p=\$((p + 1)); done; ok=0; bad=0; \
sleep 20; qcuda-smi hostile >/tmp/hostile.log 2>&1 && echo HOSTILE-OK || { echo HOSTILE-FAILED; tail -n 5 /tmp/hostile.log; }; \
for q in \$pids; do wait \$q && ok=\$((ok + 1)) || bad=\$((bad + 1)); done; \
for f in /tmp/load*.log; do grep -h -E '^(mixed_load:|FAIL)' \$f; done; \
echo LOAD-RESULT ok=\$ok failed=\$bad; echo LOAD-DONE; sleep 25; \
dmesg | grep -E 'WARNING|BUG|Oops' | sed 's/^/DMESG /'; echo LOAD-END"
    vm_pids=()
    for ((i = 0; i < vms; i++)); do
        vm_line "$i" "$guest" $((seconds + 900)) &
        vm_pids+=($!)
    done
    # Before the load: every VM booted and its module loaded, no program started yet.
    for _ in $(seq 600); do
        n=0
        for ((i = 0; i < vms; i++)); do grep -q LOAD-START "$logs/vm$i/guest.log" 2>/dev/null && n=$((n + 1)); done
        ((n == vms)) && break
        sleep 0.5
    done
    sleep 2
    fds_before=()
    for ((i = 0; i < vms; i++)); do fds_before+=("$(fds "${daemon_pids[$i]}")"); done
    t0=$SECONDS
    first="" last="" after_line=""
    while :; do
        s=$(sample)
        echo "$s" >>"$csv"
        done_n=0
        for ((i = 0; i < vms; i++)); do grep -q LOAD-DONE "$logs/vm$i/guest.log" && done_n=$((done_n + 1)); done
        if ((done_n == vms)); then
            sleep 5
            after_line=$(sample)
            echo "$after_line" >>"$csv"
            break
        fi
        el=$((SECONDS - t0))
        # Steady state: every process has started, the hostile run (20 s in) is over, and
        # everything has run for a minute and a half.
        ((el >= 90)) && [[ -z $first ]] && first=$s
        ((el >= 90 && el <= seconds)) && last=$s
        running=0
        for p in "${vm_pids[@]}"; do kill -0 "$p" 2>/dev/null && running=1; done
        ((running)) || break
        sleep 10
    done
    for p in "${vm_pids[@]}"; do wait "$p"; done
    after=$(meminfo)
    total_ok=0 total_bad=0 ops=0
    for ((i = 0; i < vms; i++)); do
        g=$logs/vm$i/guest.log
        r=$(tr -d '\r' <"$g" | sed -n 's/^LOAD-RESULT ok=\([0-9]*\) failed=\([0-9]*\)$/\1 \2/p')
        r=${r:-0 $procs}
        total_ok=$((total_ok + ${r%% *})) total_bad=$((total_bad + ${r##* }))
        o=$(tr -d '\r' <"$g" | sed -n 's/^mixed_load: [0-9]* threads, \([0-9]*\) operations.*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
        ops=$((ops + o))
        tr -d '\r' <"$g" | grep -E '^(FAIL|DMESG)' | head -n 5 | sed "s/^/  vm$i: /"
    done
    dmesg_lines=$(cat "$logs"/vm*/guest.log | tr -d '\r' | grep -c '^DMESG')
    hostile_ok=$(cat "$logs"/vm*/guest.log | tr -d '\r' | grep -c '^HOSTILE-OK')
    ((hostile_ok == vms)) && res ok "load: qcuda-smi hostile in every VM 20 s into the load: every hostile call refused" ||
        res FAIL "load: qcuda-smi hostile failed in $((vms - hostile_ok)) VM(s)"
    echo "load-test: $total_ok of $((vms * procs)) processes ($threads threads each) passed, $ops operations checked in ${seconds} s"
    ((total_ok == vms * procs && total_bad == 0 && dmesg_lines == 0)) &&
        res ok "load: $((vms * procs)) processes x $threads threads, every result correct, no guest kernel warning" ||
        res FAIL "load: $total_bad process(es) failed, $dmesg_lines kernel warning line(s)"
    # Growth between the first and the last steady sample.
    if [[ -n $first && -n $last ]]; then
        IFS=, read -r -a a <<<"$first"
        IFS=, read -r -a b <<<"$last"
        echo "load-test: steady state from t=${a[0]} s to t=${b[0]} s:"
        grow_ok=1
        for ((i = 0; i < vms; i++)); do
            r0=${a[$((1 + 3 * i))]} r1=${b[$((1 + 3 * i))]} f0=${a[$((2 + 3 * i))]} f1=${b[$((2 + 3 * i))]}
            s0=${a[$((3 + 3 * i))]} s1=${b[$((3 + 3 * i))]}
            echo "  vm$i daemon: private memory $((r0 / 1024)) -> $((r1 / 1024)) MiB, fds $f0 -> $f1, sessions $s0 -> $s1"
            ((r1 - r0 <= 16384)) || grow_ok=0
        done
        w=$((1 + 3 * vms))
        echo "  workers: ${a[$w]} -> ${b[$w]}, their private memory $((a[w + 1] / 1024)) -> $((b[w + 1] / 1024)) MiB; device memory ${a[$((w + 2))]} -> ${b[$((w + 2))]} MiB"
        echo "  VmRSS (guest RAM pages touched included): daemons $((a[w + 3] / 1024)) -> $((b[w + 3] / 1024)) MiB, workers $((a[w + 4] / 1024)) -> $((b[w + 4] / 1024)) MiB"
        # The workers' memory may move with the mix of operations in flight; a leak grows
        # steadily over five minutes. Allowed: 2 MiB per worker.
        ((b[w + 1] - a[w + 1] <= 2048 * vms * procs)) || grow_ok=0
        ((grow_ok)) && res ok "load: no growth of the daemons' or workers' memory in the steady state" ||
            res FAIL "load: memory grew in the steady state (samples.csv)"
    else
        res FAIL "load: ran too short for a steady-state comparison (--seconds >= 110)"
    fi
    IFS=, read -r -a c <<<"$after_line"
    clean=1
    for ((i = 0; i < vms; i++)); do
        f_after=${c[$((2 + 3 * i))]:-?}
        echo "  vm$i daemon after the load: fds ${fds_before[$i]} before -> $f_after after, sessions ${c[$((3 + 3 * i))]:-?}"
        [[ $f_after == "${fds_before[$i]}" && ${c[$((3 + 3 * i))]:-1} == 0 ]] || clean=0
    done
    left=$(vms_workers)
    ((clean && left == 0)) && res ok "load: afterwards every daemon is at its descriptor count before the load, no session, no worker" ||
        res FAIL "load: afterwards descriptors or sessions differ, or $left worker(s) left"
    held=$(vms_memory)
    ((held == 0 && $(vms_workers) == 0)) && res ok "load: no VM holds device memory afterwards (qcuda's accounting)" ||
        res FAIL "load: the VMs still hold $held bytes of device memory (qcuda's accounting)"
    device_check load "$base" "$after"
    echo "load-test: samples in $csv"
fi
echo "$passed passed, $failed failed"
((failed == 0))

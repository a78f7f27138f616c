#!/usr/bin/env bash
# two-vm-test.sh: two VMs use one GPU at once, on one vhost-cuda serving two sockets (as two
# daemons would: each socket is its own VM, with its own sessions and workers). Checks, from
# qcuda's own accounting (never from the GPU's totals, which the other VM moves):
#
#   - each VM's qcuda-smi lists only its own processes and memory;
#   - the host's per-VM view (vhost-cuda --stats) matches what the guest sees;
#   - the kill check passes in VM A while VM B keeps the GPU busy: a program holding device
#     memory and launching kernels is killed with SIGKILL, and afterwards VM A holds nothing,
#     has no session and no worker, while VM B still holds its memory and runs;
#   - VM B's own programs are killed at the end with the same result, and the daemon closed
#     every session (one log line each, with its totals).
#
# The GPU's device totals are compared only as a second opinion, and only where nothing else
# used the GPU (qa_gpu_others), before and after both VMs.
#
#   two-vm-test.sh [--log-dir DIR] [--busy-seconds N]
# --busy-seconds: the longest VM B keeps the GPU busy once it started (default 300; VM A must be
# done by then: about 30 s on a quiet host). VM B ends sooner, at its next 5 s view, once VM A's
# kill check is done: the host writes "stop" into a directory shared into VM B (virtiofs, ctl/).
# Runs from an unpacked bundle or the repo.
# Prints one "ok|FAIL ..." line per check and "N passed, N failed"; exits non-zero on failure.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $here/guest/bzImage ]]; then # release bundle
    RUNVM=$here/run-vm.sh DAEMON=$here/bin/vhost-cuda
else
    RUNVM=$here/run-vm.sh DAEMON=$(cd "$here/.." && pwd)/target/release/vhost-cuda
fi
# shellcheck source=qcuda-accounting.sh
. "$here/qcuda-accounting.sh"
logs=$PWD/logs-two-vm busy=300
while (($#)); do
    case $1 in
    --log-dir) logs=$2; shift 2 ;;
    --busy-seconds) busy=$2; shift 2 ;;
    *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done
passed=0 failed=0
res() { # ok|FAIL text
    printf '%-5s %s\n' "$1" "$2"
    if [[ $1 == ok ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
# shellcheck source=scripts/gpu-host.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu-host.sh"
if ! gpu_present; then
    echo "skipped: no GPU"
    exit 0
fi
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
sock=$logs/vm.sock A=$logs/vm.sock.0 B=$logs/vm.sock.1
rm -f "$A" "$B" "$sock.stats"
# Non-empty lines of $1.
count() { grep -c . <<<"$1"; }
# Lines a guest printed with a prefix, carriage returns gone.
lines() { tr -d '\r' <"$1" 2>/dev/null | sed -n "s/^$2 //p"; }
wait_line() { # log, line, tries of 0.5 s
    local i
    for ((i = 0; i < $3; i++)); do
        tr -d '\r' <"$1" 2>/dev/null | grep -q "^$2" && return 0
        sleep 0.5
    done
    return 1
}

others_before=$(qa_gpu_others)
device_before=$(qa_device_mib)
RUST_LOG=info "$DAEMON" --socket-path "$sock" --socket-count 2 >"$logs/daemon.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 100); do [[ -S $A && -S $B && -S $sock.stats ]] && break; sleep 0.1; done
[[ -S $A && -S $B ]] || { echo "two-vm-test: vhost-cuda did not start"; cat "$logs/daemon.log"; exit 1; }
echo "two-vm-test: one vhost-cuda, VM A on $A, VM B on $B; GPU used by $others_before other process(es), $device_before MiB before"

# VM B: a program holding 1 GiB and launching kernels nonstop, and a mixed load, until the host
# says stop (at most --busy-seconds); every 5 s its qcuda-smi view; then both killed, and its
# view afterwards.
gb="insmod /lib/modules/qcuda.ko || exit 1; \
/opt/qcuda/tests/large_copy --hold 512 >/tmp/hold.log 2>&1 & h=\$!; \
/opt/qcuda/tests/mixed_load --threads 2 --forever >/tmp/mixed.log 2>&1 & m=\$!; \
echo \"B-PIDS \$h \$m\"; n=0; until grep -q HOLDING /tmp/hold.log || ! kill -0 \$h || [ \$n -ge 900 ]; do sleep 0.2; n=\$((n+1)); done; \
grep HOLDING /tmp/hold.log | sed 's/^/B-/'; echo B-BUSY; t=0; \
while [ \$t -lt $busy ] && [ ! -e /qcuda-ctl/stop ]; do qcuda-smi processes --csv | sed 's/^/B-PROCS /'; echo \"B-MEM \$(qcuda-smi memory)\"; sleep 5; t=\$((t+5)); done; \
qcuda-smi; kill -9 \$h \$m; wait \$h; wait \$m; echo \"B-MEM-AFTER \$(qcuda-smi memory)\"; \
qcuda-smi processes --csv | sed 's/^/B-PROCS-AFTER /'; echo B-DONE; sleep 4"
# VM A: a program holding 2 x 256 MiB, its view and the host's compared, then killed.
ga="insmod /lib/modules/qcuda.ko || exit 1; \
/opt/qcuda/tests/large_copy --hold 256 >/tmp/hold.log 2>&1 & p=\$!; echo \"A-PID \$p\"; \
n=0; until grep -q 'progress 100' /tmp/hold.log || ! kill -0 \$p || [ \$n -ge 900 ]; do sleep 0.2; n=\$((n+1)); done; \
grep HOLDING /tmp/hold.log | sed 's/^/A-/'; \
qcuda-smi processes --csv | sed 's/^/A-PROCS /'; echo \"A-MEM \$(qcuda-smi memory)\"; qcuda-smi; \
echo A-SNAPSHOT; sleep 5; kill -9 \$p; wait \$p; \
echo \"A-MEM-AFTER \$(qcuda-smi memory)\"; qcuda-smi processes --csv | sed 's/^/A-PROCS-AFTER /'; \
echo A-KILLED; sleep 6"

ctl=$logs/ctl
rm -rf "$ctl" && mkdir -p "$ctl"
"$RUNVM" --socket "$B" --log-dir "$logs/vm-b" --timeout $((busy + 600)) --share "$ctl:/qcuda-ctl:ro" -- "$gb" >"$logs/guest-b.log" 2>&1 &
vm_b=$!
if ! wait_line "$logs/guest-b.log" B-BUSY 1200; then
    res FAIL "VM B did not get busy (see $logs/guest-b.log)"
    tail -n 20 "$logs/guest-b.log"
    kill $vm_b 2>/dev/null
    echo "$passed passed, $failed failed"
    exit 1
fi
echo "two-vm-test: VM B busy: $(lines "$logs/guest-b.log" B-HOLDING) bytes held by its large_copy, plus mixed_load"
"$RUNVM" --socket "$A" --log-dir "$logs/vm-a" --timeout 600 -- "$ga" >"$logs/guest-a.log" 2>&1 &
vm_a=$!

# --- VM A holds its memory: its view and the host's.
if wait_line "$logs/guest-a.log" A-SNAPSHOT 1200; then
    sleep 1
    host_a=$(qa_sessions "$sock" "$A")
    host_b=$(qa_sessions "$sock" "$B")
    host_a_mem=$(qa_vm "$sock" "$A" qcuda_vm_gpu_memory_bytes)
    host_b_mem=$(qa_vm "$sock" "$B" qcuda_vm_gpu_memory_bytes)
    "$DAEMON" --stats --socket-path "$sock" | tee "$logs/stats-snapshot.txt"
    a_pid=$(lines "$logs/guest-a.log" A-PID)
    a_held=$(lines "$logs/guest-a.log" A-HOLDING)
    a_mem=$(lines "$logs/guest-a.log" A-MEM)
    # pid,session,memory_bytes,peak_bytes,kernels,graph_launches,name
    a_procs=$(lines "$logs/guest-a.log" A-PROCS | grep -v '^pid,')
    echo "  VM A sees: ${a_procs:-nothing}; VM memory $a_mem"
    echo "  host sees VM A: ${host_a:-nothing}; VM memory $host_a_mem"
    echo "  host sees VM B: $(count "$host_b") session(s); VM memory $host_b_mem"
    IFS=, read -r p s m _ k _ name <<<"$a_procs"
    [[ $(count "$a_procs") == 1 && $p == "$a_pid" && $name == large_copy ]] && ((m >= a_held && k > 0)) &&
        res ok "VM A's qcuda-smi lists only its own process: pid $p large_copy, $m bytes (it allocated $a_held), $k kernels" ||
        res FAIL "VM A's qcuda-smi lists '$a_procs', expected only pid $a_pid large_copy holding $a_held bytes with kernels"
    read -r hs hp _ hm hk <<<"$host_a"
    [[ $(count "$host_a") == 1 && $hs == "$s" && $hp == "$p" && $hm == "$m" && $a_mem == "$host_a_mem" && $host_a_mem == "$m" ]] && ((hk >= k)) &&
        res ok "the host's view of VM A matches VM A's: session $hs, guest pid $hp, $hm bytes, VM total $host_a_mem" ||
        res FAIL "the host's view of VM A ('$host_a', VM $host_a_mem) differs from VM A's ('$a_procs', VM $a_mem)"
    b_sessions=$(awk '{ print $1 }' <<<"$host_b" | sort -u)
    a_sessions=$(lines "$logs/guest-a.log" 'A-PROCS' | grep -v '^pid,' | cut -d, -f2 | sort -u)
    if [[ -n $b_sessions && -z $(comm -12 <(echo "$a_sessions") <(echo "$b_sessions")) ]] && ((host_b_mem > 0)); then
        res ok "VM B's sessions ($(wc -w <<<"$b_sessions"), $host_b_mem bytes) are in neither VM A's view nor the host's view of VM A"
    else
        res FAIL "VM B's sessions ($b_sessions) and VM A's ($a_sessions) overlap, or VM B holds nothing ($host_b_mem)"
    fi
else
    res FAIL "VM A did not reach its snapshot (see $logs/guest-a.log)"
    tail -n 20 "$logs/guest-a.log"
fi

# --- VM A's program killed while VM B keeps the GPU busy.
if wait_line "$logs/guest-a.log" A-KILLED 600; then
    sleep 1
    a_mem=$(qa_vm "$sock" "$A" qcuda_vm_gpu_memory_bytes)
    a_sessions=$(qa_vm "$sock" "$A" qcuda_vm_sessions)
    a_workers=$(qa_workers "$A")
    b_mem=$(qa_vm "$sock" "$B" qcuda_vm_gpu_memory_bytes)
    b_workers=$(qa_workers "$B")
    guest_after=$(lines "$logs/guest-a.log" A-MEM-AFTER)
    guest_procs=$(lines "$logs/guest-a.log" A-PROCS-AFTER | grep -vc '^pid,')
    a_held=$(lines "$logs/guest-a.log" A-HOLDING)
    b_busy=$(tr -d '\r' <"$logs/guest-b.log" | grep -c '^B-DONE')
    echo "  after the kill: VM A holds $a_mem bytes (its qcuda-smi: $guest_after), $a_sessions session(s), $a_workers worker(s);" \
        "VM B holds $b_mem bytes with $b_workers worker(s)"
    grep -F "vm=$A" "$logs/daemon.log" | grep -F ' closed (' | tail -n 2 | sed 's/^/  daemon: /'
    [[ -n $a_held && $a_mem == 0 && $guest_after == 0 && $guest_procs == 0 && $a_sessions == 0 && $a_workers == 0 ]] &&
        res ok "kill check (qcuda's accounting): VM A held ${a_held} bytes, after the kill nothing, no session, no worker" ||
        res FAIL "kill check: VM A's program held '${a_held}' bytes; after its kill VM A holds $a_mem bytes (guest: $guest_after, $guest_procs process(es)), $a_sessions session(s), $a_workers worker(s)"
    ((b_mem > 0 && b_workers >= 2 && b_busy == 0)) &&
        res ok "... while VM B kept the GPU busy ($b_mem bytes, $b_workers workers, still running)" ||
        res FAIL "VM B was not busy during VM A's kill ($b_mem bytes, $b_workers workers; raise --busy-seconds)"
else
    res FAIL "VM A's program was not killed (see $logs/guest-a.log)"
    tail -n 20 "$logs/guest-a.log"
fi
# VM A's checks are done: VM B may stop being busy.
echo stop >"$ctl/stop"
wait $vm_a

# --- VM B: only its own processes, all along; then its own kill.
b_pids=$(lines "$logs/guest-b.log" B-PIDS)
bad=$(lines "$logs/guest-b.log" B-PROCS | grep -v '^pid,' | awk -F, -v pids=" $b_pids " \
    'index(pids, " " $1 " ") == 0 || ($7 != "large_copy" && $7 != "mixed_load")' | head -n 3)
snaps=$(lines "$logs/guest-b.log" B-MEM | grep -c .)
listed=$(lines "$logs/guest-b.log" B-PROCS | grep -vc '^pid,')
((snaps > 0 && listed > 0)) && [[ -z $bad ]] &&
    res ok "VM B's qcuda-smi listed only its own processes ($b_pids) in all $snaps views" ||
    res FAIL "VM B's qcuda-smi listed other processes: ${bad:-none of its own in $snaps view(s)}"
wait $vm_b
b_after=$(lines "$logs/guest-b.log" B-MEM-AFTER)
b_procs=$(lines "$logs/guest-b.log" B-PROCS-AFTER | grep -vc '^pid,')
sleep 1
open=$(qa_vm "$sock" "$B" qcuda_vm_sessions)
left=$(($(qa_workers "$A") + $(qa_workers "$B")))
[[ $b_after == 0 && $b_procs == 0 && $left == 0 ]] &&
    res ok "VM B's programs killed too: it holds nothing, no worker left on the host" ||
    res FAIL "after VM B's kills: it holds $b_after bytes ($b_procs process(es)), $left worker(s) left"
kill -TERM $daemon
wait $daemon
trap - EXIT
opened=$(grep -c ' opened; sessions open: ' "$logs/daemon.log")
closed=$(grep -c ' closed (' "$logs/daemon.log")
((opened > 0 && opened == closed)) && grep -q 'VM GPU memory held: 0 B' "$logs/daemon.log" &&
    res ok "daemon: $opened sessions opened and closed, one log line each with its totals" ||
    res FAIL "daemon: $opened sessions opened, $closed closed (see $logs/daemon.log; open at the end: ${open:-?})"

# --- Second opinion: the device's totals, only where nothing else used the GPU.
others_after=$(qa_gpu_others)
device_after=$(qa_device_mib)
if ((others_before == 0 && others_after == 0)); then
    ((device_after - device_before <= 64)) &&
        res ok "second opinion (GPU otherwise idle): device memory back to $device_after MiB (was $device_before)" ||
        res FAIL "second opinion: device memory $device_after MiB after, $device_before MiB before"
else
    echo "two-vm-test: device totals not compared: the GPU was used by others ($others_before before, $others_after after)"
fi
echo "$passed passed, $failed failed"
((failed == 0))

#!/usr/bin/env bash
# bench-scale.sh: on a GPU host, many busy CUDA processes at once (issue 19): natively against
# the host's libcudart, then in qcuda guests, and the aggregate launch rate and copy bandwidth of
# each side. Every process is `qcuda_bench --sustain KIND` (bench/qcuda_bench.cu): it gets
# ready, creates ready.KIND.NAME in a folder and waits for go.KIND there, which this script
# creates once all of them are ready; then each runs KIND for S seconds and prints its own rate,
# and the rates add up. The guests see the folder through virtiofs (run-vm.sh --share).
#   ./bench-scale.sh [--vms N] [--procs P] [--seconds S] [--kinds launch,h2d,d2h]
#                    [--guest-smp N] [--guest-mem SIZE] [--out DIR] [--daemon-arg ARG]...
#                    [--timeout SECONDS]
# Configurations, each against as many native processes at once as it has guest processes:
#   1vm_8proc   one VM, hence one vhost-cuda, serving 8 busy processes
#   4vm_2proc   4 VMs side by side, each on its own vhost-cuda (run-vm.sh starts one per VM, as
#               qcuda is deployed), 2 processes each
# Both by default; --vms N and/or --procs P run that one configuration instead (the other
# defaults to 4 VMs, 2 processes). Kinds (default all three, one after another):
#   launch      empty kernel launches, back to back, one synchronize at the end; launch/s
#   h2d, d2h    64 MiB cudaMemcpyAsync + cudaStreamSynchronize, cudaMallocHost memory; GB/s
# --seconds: how long each process runs each kind (default 5). --guest-smp: vCPUs per VM
# (default: its processes, at least 2, so both sides have a core per process); --guest-mem:
# RAM per VM (run-vm.sh's default 3G). --daemon-arg goes to every vhost-cuda (repeatable).
# --timeout: the most seconds a guest run takes, and a wait for processes to get ready or end
# (default 1800).
# Writes to DIR (default: bench-scale-out beside this script; build/bench-scale-out in the repo):
#   scale.csv       config,kind,procs,native,guest,unit,ratio: the sums of all processes'
#                   rates; ratio = guest/native (higher is better, 1 = parity)
#   processes.csv   run,kind,tag,exit,value,unit: every process's own exit status and rate
#   native_<T>proc/ each native process's output (KIND.TAG.out, .err)
#   <config>/vmI/   each VM's console (console.log) and run-vm.sh's logs (daemon, QEMU, virtiofsd)
#   <config>/threads.KIND.txt  the host CPU that QEMU (vCPUs and other threads), vhost-cuda, its
#                   session workers and virtiofsd used while the processes ran, per thread name
#                   (thread-cpu.sh), and <config>/vmI/guest.KIND.txt what the guest's CPUs,
#                   interrupts and processes did meanwhile (guest-observe.sh): where a
#                   configuration's time goes
# Works from an unpacked bundle (scripts/bundle.sh) and from the repo. Without a GPU it says
# "skipped: no GPU" and exits 0; it exits 1 if any process failed or printed no row.
set -uo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $B/guest/bzImage ]]; then # bundle layout
    bench=$B/bench/qcuda_bench out=$B/bench-scale-out
else # repo layout: scripts/ beside build/
    bench=$B/../build/bench/qcuda_bench out=$B/../build/bench-scale-out
fi
GUEST_BENCH=/opt/qcuda/bench/qcuda_bench
vms="" procs="" seconds=5 kinds=launch,h2d,d2h smp="" mem_args=() daemon_args=() timeout=1800
usage="usage: $0 [--vms N] [--procs P] [--seconds S] [--kinds launch,h2d,d2h] [--guest-smp N] [--guest-mem SIZE] [--out DIR] [--daemon-arg ARG]... [--timeout SECONDS]"
while (($#)); do
    case $1 in
    --vms) vms=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --kinds) kinds=$2; shift 2 ;;
    --guest-smp) smp=$2; shift 2 ;;
    --guest-mem) mem_args=(--mem "$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --daemon-arg) daemon_args+=(--daemon-arg "$2"); shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
number() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
for v in "$vms" "$procs" "$smp"; do [[ -z $v ]] || number "$v" || { echo "$usage" >&2; exit 2; }; done
if ! number "$timeout" || ! [[ $seconds =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
    ! awk -v s="$seconds" 'BEGIN { exit !(s > 0) }'; then
    echo "$usage" >&2
    exit 2
fi
IFS=, read -r -a kind_list <<<"$kinds"
((${#kind_list[@]})) || { echo "$usage" >&2; exit 2; }
declare -A seen_kind=()
for k in "${kind_list[@]}"; do
    if ! [[ $k == launch || $k == h2d || $k == d2h ]] || [[ -n ${seen_kind[$k]:-} ]]; then
        echo "bench-scale: --kinds: $k is not launch, h2d or d2h, or twice there" >&2
        exit 2
    fi
    seen_kind[$k]=1
done
if [[ -n $vms$procs ]]; then
    configs=("${vms:-4}x${procs:-2}")
else
    configs=(1x8 4x2)
fi

# shellcheck source=scripts/gpu-host.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu-host.sh"
# shellcheck source=scripts/thread-cpu.sh
. "$(dirname "${BASH_SOURCE[0]}")/thread-cpu.sh"
bench_host_start bench-scale "$bench"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qcuda-scale.XXXXXX")
runners=() # what a run started in the background: native process wrappers or run-vm.sh
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local p
    trap - EXIT INT TERM
    # A native wrapper is a subshell: its qcuda_bench is its child. run-vm.sh stops its own
    # QEMU and daemons on TERM.
    for p in "${runners[@]}"; do
        pkill -TERM -P "$p" 2>/dev/null
        kill -TERM "$p" 2>/dev/null
    done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "bench-scale: interrupted"; exit 130' INT TERM

# --- the barrier --------------------------------------------------------------------------------
# A run's processes come in groups, one per runner: group_pid[i] is the process that runs them
# (for a guest, its run-vm.sh; natively this script), group_tags[i] their names. Each process
# creates $sync/ready.KIND.TAG once ready, and its wrapper $sync/exit.KIND.TAG (its exit status)
# once it ended. A group whose runner is gone is not waited for: its processes never come.
sync="" group_pid=() group_tags=()
alive() { kill -0 "$1" 2>/dev/null; }
# How many processes of KIND (of groups still running) have no file named PREFIX.KIND.TAG yet;
# with two prefixes, either will do.
missing() { # kind, prefix...
    local kind=$1 i tag p n=0 found
    shift
    for i in "${!group_pid[@]}"; do
        alive "${group_pid[$i]}" || continue
        for tag in ${group_tags[$i]}; do
            found=0
            for p in "$@"; do [[ -e $sync/$p.$kind.$tag ]] && found=1; done
            ((found)) || n=$((n + 1))
        done
    done
    echo "$n"
}
# Waits until every process of KIND is ready (or has ended already), then creates go.KIND, which
# starts them all; then waits until all have ended. Gives up after --timeout: go.KIND is created
# anyway, so that no process waits for it forever, and the rows that are missing fail the run.
# With a third argument (a folder), also writes threads.KIND.txt there: the host CPU that QEMU,
# vhost-cuda, its workers and virtiofsd used per thread from a tenth to nine tenths of the
# processes' S seconds after go (thread-cpu.sh; inside the run, so that no session's threads have
# ended yet).
barrier() { # run name, kind[, profile folder]
    local t0=$SECONDS n sampler=""
    while n=$(missing "$2" ready exit) && ((n > 0 && SECONDS - t0 < timeout)); do sleep 0.02; done
    : >"$sync/go.$2"
    echo "   $1 $2: go after $((SECONDS - t0)) s$( ((n == 0)) || echo ", $n not ready (timeout)")"
    if [[ -n ${3:-} ]]; then
        (
            sleep "$(awk -v s="$seconds" 'BEGIN { print s / 10 }')"
            thread_cpu_snapshot "$tmp/threads.before"
            a=$(date +%s.%N)
            sleep "$(awk -v s="$seconds" 'BEGIN { print s * 8 / 10 }')"
            b=$(date +%s.%N)
            thread_cpu_snapshot "$tmp/threads.after"
            thread_cpu_report "$tmp/threads.before" "$tmp/threads.after" \
                "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b - a }')" >"$3/threads.$2.txt"
        ) &
        sampler=$!
    fi
    t0=$SECONDS
    while n=$(missing "$2" exit) && ((n > 0 && SECONDS - t0 < timeout)); do sleep 0.2; done
    ((n == 0)) || echo "   $1 $2: $n process(es) still running after ${timeout}s"
    [[ -n $sampler ]] || return 0
    wait "$sampler"
    echo "   $1 $2: host CPU while running, busiest threads ($3/threads.$2.txt):"
    head -n 8 "$3/threads.$2.txt" | sed 's/^/     /'
}
# Adds every process's row to processes.csv: run,kind,tag,exit,value,unit (exit: the status its
# wrapper recorded, or "none"; value: "NA" where it printed no row). Reads "kind tag value unit"
# lines on stdin.
record() { # run name
    local kind tag value unit i rc
    declare -A got=()
    while read -r kind tag value unit; do got[$kind.$tag]="$value,$unit"; done
    for kind in "${kind_list[@]}"; do
        for i in "${!group_tags[@]}"; do
            for tag in ${group_tags[$i]}; do
                rc=$(cat "$sync/exit.$kind.$tag" 2>/dev/null) || rc=none
                echo "$1,$kind,$tag,${rc:-none},${got[$kind.$tag]:-NA,NA}"
            done
        done
    done >>"$out/processes.csv"
}
# The program's rows, picked by their shape (as in bench.sh: the guest console mixes in other
# lines and carriage returns), each after the "--- sustain TAG KIND" line that names its process;
# printed as "kind tag value unit".
rows() {
    tr -d '\r' | awk -F, '
        /^--- sustain / { split($0, w, " "); tag = w[3]; next }
        /^sustain_(launch|h2d|d2h),[0-9]+,(-?[0-9]+(\.[0-9]+)?|NA),(GB\/s|launch\/s)$/ {
            print substr($1, 9), tag, $3, $4
        }'
}

# --- native: T processes at once against the host's libcudart ----------------------------------
native() { # processes
    local run=native_$1proc kind i tag
    local dir=$out/$run
    rm -rf "$dir" && mkdir -p "$dir"
    sync=$(mktemp -d "$tmp/sync.XXXXXX")
    group_pid=($$) group_tags=("$(for ((i = 1; i <= $1; i++)); do printf 'n%d ' "$i"; done)")
    echo "== native: $1 processes at once (host libcudart from ${cudart:-the default library path})"
    for kind in "${kind_list[@]}"; do
        runners=()
        for tag in ${group_tags[0]}; do
            (
                LD_LIBRARY_PATH=$cudart "$bench" --sustain "$kind" --seconds "$seconds" --sync "$sync" \
                    --tag "$tag" >"$dir/$kind.$tag.out" 2>"$dir/$kind.$tag.err"
                echo $? >"$sync/exit.$kind.$tag"
            ) &
            runners+=($!)
        done
        barrier native "$kind"
        # Whatever is still running past the timeout is stopped here (cleanup's way).
        for i in "${runners[@]}"; do alive "$i" && { pkill -TERM -P "$i"; kill -TERM "$i"; }; done 2>/dev/null
        wait "${runners[@]}" 2>/dev/null
        runners=()
    done
    for kind in "${kind_list[@]}"; do
        for tag in ${group_tags[0]}; do
            echo "--- sustain $tag $kind"
            cat "$dir/$kind.$tag.out" 2>/dev/null
        done
    done | rows | record "$run"
}

# --- guests: N VMs at once, P processes each ------------------------------------------------------
# The command each guest runs: per kind, its P processes in the background, each leaving its exit
# status beside its ready file; then their output, each after a line naming it.
guest_cmd() { # vm index, processes
    cat <<EOF
insmod /lib/modules/qcuda.ko || exit 1
failed=0
for k in ${kind_list[*]}; do
    pids= j=1
    while [ \$j -le $2 ]; do
        t=vm$1p\$j
        ($GUEST_BENCH --sustain \$k --seconds $seconds --sync /sync --tag \$t >/tmp/\$k.\$t.out 2>/tmp/\$k.\$t.err
         echo \$? >/sync/exit.\$k.\$t) &
        pids="\$pids \$!" j=\$((j + 1))
    done
    sh /sync/guest-observe.sh \$k $seconds >/tmp/observe.\$k 2>&1 &
    observer=\$!
    wait \$pids
    wait \$observer
    cat /tmp/observe.\$k
    j=1
    while [ \$j -le $2 ]; do
        t=vm$1p\$j
        echo "--- sustain \$t \$k exit \$(cat /sync/exit.\$k.\$t)"
        cat /tmp/\$k.\$t.out /tmp/\$k.\$t.err
        grep -qx 0 /sync/exit.\$k.\$t || failed=\$((failed + 1))
        j=\$((j + 1))
    done
done
exit \$failed
EOF
}
guests() { # vms, processes per VM
    local run=$1vm_$2proc kind i j
    local dir=$out/$run
    rm -rf "$dir" && mkdir -p "$dir"
    sync=$(mktemp -d "$tmp/sync.XXXXXX")
    cp "$B/guest-observe.sh" "$sync/"
    # virtiofsd's --cache=never (after run-vm.sh's --cache auto; the last one counts): the
    # guest's every stat of go.KIND asks the host, so the file shows the moment it is created.
    local vm_args=(--share "$sync:/sync" --virtiofsd-arg --cache=never
        --smp "${smp:-$(($2 > 2 ? $2 : 2))}" "${mem_args[@]}" "${daemon_args[@]}" --timeout "$timeout")
    echo "== guest $run: $1 VM(s) at once, each on its own vhost-cuda, $2 process(es) in each"
    group_pid=() group_tags=() runners=()
    for ((i = 0; i < $1; i++)); do
        mkdir -p "$dir/vm$i"
        "$B/run-vm.sh" --log-dir "$dir/vm$i" "${vm_args[@]}" -- "$(guest_cmd "$i" "$2")" \
            >"$dir/vm$i/console.log" 2>&1 &
        runners+=($!) group_pid+=($!)
        group_tags+=("$(for ((j = 1; j <= $2; j++)); do printf 'vm%dp%d ' "$i" "$j"; done)")
    done
    for kind in "${kind_list[@]}"; do barrier "$run" "$kind" "$dir"; done
    local rc vm_failed=0
    for i in "${!runners[@]}"; do
        wait "${runners[$i]}"
        rc=$?
        ((rc == 0)) && continue
        echo "   $run vm$i: run-vm.sh exited $rc (log: $dir/vm$i/console.log)"
        vm_failed=1
    done
    runners=()
    local accel
    accel=$(sed -n 's/^\[run-vm\] accelerator: \([a-z]*\).*/\1/p' "$dir/vm0/console.log" | head -n 1)
    echo "   $run: accelerator ${accel:-unknown}"
    cat "$dir"/vm*/console.log | rows | record "$run"
    # What the guests' CPUs and processes did meanwhile (guest-observe.sh); vm0's printed here.
    for kind in "${kind_list[@]}"; do
        for ((i = 0; i < $1; i++)); do
            tr -d '\r' <"$dir/vm$i/console.log" | grep "^guestprof $kind " >"$dir/vm$i/guest.$kind.txt"
        done
        echo "   $run $kind: inside vm0 meanwhile ($dir/vm*/guest.$kind.txt):"
        sed "s/^guestprof $kind /     /" "$dir/vm0/guest.$kind.txt"
    done
    return $vm_failed
}

status=0
echo "run,kind,tag,exit,value,unit" >"$out/processes.csv"
declare -A native_done=()
for c in "${configs[@]}"; do
    total=$((${c%x*} * ${c#*x}))
    [[ -n ${native_done[$total]:-} ]] || { native "$total"; native_done[$total]=1; }
    guests "${c%x*}" "${c#*x}" || status=1
done

# A run's rate of a kind is the sum of its processes' rates, and counts only if every one of them
# exited 0 with a row; else it reads NA and the script fails.
awk -F, -v sums="$tmp/sums" '
    NR == 1 { next }
    { key = $1 FS $2; n[key]++ }
    $4 == "0" && $5 != "NA" { sum[key] += $5; ok[key]++; next }
    {
        where = $1 "/" substr($3, 1, index($3, "p") - 1) "/console.log" # vmIpJ: vmI
        if ($1 ~ /^native_/)
            where = $1 "/" $2 "." $3 ".{out,err}"
        printf "bench-scale: %s %s, process %s: exit %s, rate %s (%s)\n", $1, $2, $3, $4, $5, where
    }
    END { for (k in n) printf "%s,%s\n", k, ok[k] == n[k] ? sprintf("%.3f", sum[k]) : "NA" > sums }
' "$out/processes.csv"
sum_of() { # run, kind
    awk -F, -v run="$1" -v kind="$2" '$1 == run && $2 == kind { v = $3 }
        END { print v == "" ? "NA" : v }' "$tmp/sums"
}
{
    echo "config,kind,procs,native,guest,unit,ratio"
    for c in "${configs[@]}"; do
        total=$((${c%x*} * ${c#*x})) config=${c%x*}vm_${c#*x}proc
        for k in "${kind_list[@]}"; do
            nat=$(sum_of "native_${total}proc" "$k") gst=$(sum_of "$config" "$k")
            awk -v OFS=, -v c="$config" -v k="$k" -v t="$total" -v a="$nat" -v b="$gst" 'BEGIN {
                r = (a != "NA" && b != "NA" && a + 0 > 0) ? sprintf("%.3f", b / a) : "NA"
                print c, k, t, a, b, (k == "launch" ? "launch/s" : "GB/s"), r }'
        done
    done
} >"$out/scale.csv"
awk -F, '{ printf "%-12s %-7s %5s %14s %14s %-9s %7s\n", $1, $2, $3, $4, $5, $6, $7 }' "$out/scale.csv"
echo "each the sum of every process's rate over its $seconds s; ratio = guest/native (higher is" \
    "better, 1.000 = parity); files in $out"
tail -n +2 "$out/scale.csv" | grep -q ',NA,\|,NA$' && status=1
exit $status

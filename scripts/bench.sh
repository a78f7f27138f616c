#!/usr/bin/env bash
# bench.sh: on a GPU host, runs qcuda_bench (bench/qcuda_bench.cu) natively against the host's
# libcudart, then qcuda at native CPU speed (bench-frontend.sh: vhost-cuda-frontend-bench, a host
# process that drives a vhost-cuda as QEMU and qcuda.ko do), then qcuda_bench inside the qcuda
# guest against ours, and prints one table of the three with the ratios to native.
#   ./bench.sh [--out DIR] [--max-bytes N[K|M|G]] [--guest-mem SIZE] [--guest-smp N]
#              [--timeout SECONDS] [--daemon-arg ARG]... [--vm-arg ARG]... [--no-frontend]
#              [--frontend-arg ARG]... [--runtime WHICH] [-- BENCH-ARGS...]
# --runtime picks the CUDA runtime of the guest run: "ours" (default: qcuda's libcudart.so.13),
# "nvidia" (NVIDIA's libcudart.so.13, shipped in the guest at /usr/lib/qcuda/nvidia/13, over
# qcuda's libcuda.so.1: the path of frameworks and NVIDIA's libraries), or "both" (a second guest
# run with NVIDIA's: guest-nvidia.csv/.log, vm-nvidia/, and runtimes.csv, a table of the two
# runtimes in the guest), "host" (the guest chrooted into this host's root, as frameworks run:
# the host toolkit's own libcudart.so.13 over qcuda's libcuda.so.1), "ours-chroot" (our runtime
# in that chrooted guest), or a comma-separated list of these (e.g. ours,nvidia,host,ours-chroot:
# one guest run each, one column each in runtimes.csv, with each one's ratio to native and to
# ours). --guest-env NAME=VALUE sets a variable for every guest run (repeatable; e.g.
# QCUDA_DRIVER_TRACE=count, which lists at the program's exit the driver calls each runtime made).
# Writes to DIR (default: bench-out beside this script; build/bench-out in the repo):
#   native.csv, frontend.csv, guest.csv   metric,bytes,value,unit (each program's own rows)
#   bench.csv               metric,bytes,native,guest,unit,ratio; ratio is native/guest for
#                           times (us) and guest/native for everything else (GB/s, launch/s, the
#                           scaling factor x), so higher is better, 1 = parity
#   table.csv               metric,bytes,native,frontend,guest,unit,frontend_ratio,guest_ratio:
#                           the same ratios for the frontend and the guest (the table printed)
#   native.log, frontend.log, guest.log, vm/   progress, the guest console, the daemons' and
#                           QEMU's logs
#   phases.txt              per guest run (one "== RUNTIME: ..." section each), the latency
#                           rows' progress lines with where their calls' time went in qcuda.ko:
#                           waited calls per call, prepare/submit/wait/finish us per waited
#                           call, and the us per call outside the module (bench/module_phases.cuh)
# --no-frontend leaves the frontend run out; --frontend-arg passes an argument to
# bench-frontend.sh (repeatable, e.g. --frontend-arg --vms --frontend-arg 8).
# The guest runs with --quick (a guest under TCG is slow on the CPU side), the host in full.
# --daemon-arg passes an argument to vhost-cuda (repeatable, e.g. --daemon-arg --hop-poll-us=0);
# --vm-arg one to run-vm.sh (repeatable, e.g. --vm-arg --add --vm-arg FILE:/opt/qcuda/bench/FILE
# to run another build of the benchmark in the guest);
# arguments after -- go to qcuda_bench on both sides (e.g. -- --only pageable --min-bytes 64M).
# Works from an unpacked bundle (scripts/bundle.sh) and from the repo. Without a GPU it says
# "skipped: no GPU" and exits 0; it exits 1 if either run fails or prints no rows.
set -uo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $B/guest/bzImage ]]; then # bundle layout
    bench=$B/bench/qcuda_bench out=$B/bench-out
else # repo layout: scripts/ beside build/
    bench=$B/../build/bench/qcuda_bench out=$B/../build/bench-out
fi
max_args=() mem_args=() smp_args=() daemon_args=() vm_args=() bench_args=() timeout=1800
frontend=1 frontend_args=() runtime=ours guest_env=""
while (($#)); do
    case $1 in
    --out) out=$2; shift 2 ;;
    --max-bytes) max_args=(--max-bytes "$2"); shift 2 ;;
    --guest-mem) mem_args=(--mem "$2"); shift 2 ;;
    --guest-smp) smp_args=(--smp "$2"); shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --daemon-arg) daemon_args+=(--daemon-arg "$2"); shift 2 ;;
    --vm-arg) vm_args+=("$2"); shift 2 ;;
    --no-frontend) frontend=0; shift ;;
    --frontend-arg) frontend_args+=("$2"); shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --guest-env) guest_env+="$2 "; shift 2 ;;
    --) shift; bench_args=("$@"); break ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--out DIR] [--max-bytes N] [--guest-mem SIZE] [--guest-smp N] [--timeout SECONDS] [--daemon-arg ARG]... [--vm-arg ARG]... [--no-frontend] [--frontend-arg ARG]... [--runtime ours|nvidia|host|ours-chroot|both|LIST] [--guest-env NAME=VALUE]... [-- BENCH-ARGS...]" >&2; exit 2 ;;
    esac
done
[[ $runtime == both ]] && runtime=ours,nvidia
runtimes=()
for r in ${runtime//,/ }; do
    case $r in
    ours | nvidia | host | ours-chroot) runtimes+=("$r") ;;
    *) echo "bench: --runtime takes ours, nvidia, host, ours-chroot, both or a list of them, not $r" >&2; exit 2 ;;
    esac
done

# shellcheck source=scripts/gpu-host.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu-host.sh"
bench_host_start bench "$bench"

# The program's rows, picked by their shape: the guest console mixes in progress, kernel log
# lines and carriage returns.
csv_rows() {
    echo "metric,bytes,value,unit"
    tr -d '\r' | grep -E '^[a-z0-9_]+,[0-9]+,(-?[0-9]+(\.[0-9]+)?|NA),(GB/s|us|launch/s|x)$'
}
status=0
echo "== native (host libcudart from ${cudart:-the default library path}), full run"
LD_LIBRARY_PATH=$cudart "$bench" "${max_args[@]}" "${bench_args[@]}" >"$out/native.out" 2> >(tee "$out/native.log" >&2)
rc=$?
csv_rows <"$out/native.out" >"$out/native.csv"
((rc == 0)) || { echo "bench: native run exited $rc: $(tail -n 1 "$out/native.out")"; status=1; }

echo "metric,bytes,value,unit" >"$out/frontend.csv"
if ((frontend)); then
    echo "== qcuda at native CPU speed (vhost-cuda-frontend-bench against a vhost-cuda of its own)"
    # Progress and verdicts shown; the rows come in the table below.
    "$B/bench-frontend.sh" --out "$out" "${max_args[@]}" "${daemon_args[@]}" "${frontend_args[@]}" 2>&1 |
        grep --line-buffered -vE '^[a-z0-9_]+,[0-9]+,'
    rc=${PIPESTATUS[0]}
    ((rc == 0)) || { echo "bench: frontend run exited $rc (see $out/frontend.log)"; status=1; }
fi

# One guest run of RUNTIME; its files are guest-RUNTIME.* (the first one's also guest.*).
guest_run() { # runtime
    local what env="" chroot=() suffix=-$1
    case $1 in
    ours) what="qcuda's libcudart.so.13" ;;
    nvidia) what="NVIDIA's libcudart.so.13 (the guest's copy) over qcuda's libcuda.so.1"
        env="LD_LIBRARY_PATH=/usr/lib/qcuda/nvidia/13:/usr/lib/qcuda " ;;
    host) what="chrooted into this host's root: its toolkit's libcudart.so.13 (${cudart:-?}) over qcuda's libcuda.so.1"
        env="LD_LIBRARY_PATH=${cudart:-/usr/local/cuda/lib64}:/usr/lib/qcuda " chroot=(--share /:/host:ro --chroot /host) ;;
    ours-chroot) what="chrooted into this host's root: qcuda's libcudart.so.13"
        env="LD_LIBRARY_PATH=/usr/lib/qcuda " chroot=(--share /:/host:ro --chroot /host) ;;
    esac
    echo "== guest (through QEMU, qcuda.ko and vhost-cuda; $what), --quick run"
    "$B/run-vm.sh" --log-dir "$out/vm$suffix" --timeout "$timeout" "${mem_args[@]}" "${smp_args[@]}" \
        "${daemon_args[@]}" "${vm_args[@]}" "${chroot[@]}" -- \
        "grep -q '^qcuda ' /proc/modules || insmod /lib/modules/qcuda.ko; env $guest_env$env/opt/qcuda/bench/qcuda_bench --quick ${max_args[*]} ${bench_args[*]}" 2>&1 |
        tee "$out/guest$suffix.log"
    local rc=${PIPESTATUS[0]}
    csv_rows <"$out/guest$suffix.log" >"$out/guest$suffix.csv"
    ((rc == 0)) || { echo "bench: guest run ($what) exited $rc: $(tr -d '\r' <"$out/guest$suffix.log" | grep -E '^(FAIL|SKIP)' | tail -n 1)"; status=1; }
    bench_phases "$1" "$what" "$out/guest$suffix.log" >>"$out/phases.txt"
    echo "   qcuda.ko's phases ($1): $(grep -c '| qcuda\.ko: [0-9]' "$out/guest$suffix.log") rows, in phases.txt"
    if [[ $guest_env == *QCUDA_DRIVER_TRACE=count* ]]; then
        tr -d '\r' <"$out/guest$suffix.log" | grep 'qcuda-trace' >"$out/trace$suffix.txt"
        echo "   driver calls ($1): $(wc -l <"$out/trace$suffix.txt") lines in trace$suffix.txt"
    fi
}
rm -f "$out/phases.txt"
for r in "${runtimes[@]}"; do guest_run "$r"; done
cp "$out/guest-${runtimes[0]}.csv" "$out/guest.csv"
cp "$out/guest-${runtimes[0]}.log" "$out/guest.log"

# Rows keyed by metric and size, in the native run's order, then any the guest alone has.
awk -F, -v OFS=, '
    FNR == 1 { next }
    FILENAME == ARGV[1] { key = $1 FS $2; if (!(key in unit)) order[++n] = key; nat[key] = $3; unit[key] = $4; next }
    { key = $1 FS $2; if (!(key in unit)) order[++n] = key; gst[key] = $3; unit[key] = $4 }
    END {
        print "metric,bytes,native,guest,unit,ratio"
        for (i = 1; i <= n; i++) {
            k = order[i]; a = (k in nat) ? nat[k] : "NA"; b = (k in gst) ? gst[k] : "NA"; r = "NA"
            if (a != "NA" && b != "NA" && a + 0 > 0 && b + 0 > 0)
                r = sprintf("%.3f", unit[k] == "us" ? a / b : b / a)
            print k, a, b, unit[k], r
        }
    }' "$out/native.csv" "$out/guest.csv" >"$out/bench.csv"

# The same with the frontend's rows between: native, frontend, guest, and both ratios.
awk -F, -v OFS=, '
    FNR == 1 { f++; next }
    { key = $1 FS $2; if (!(key in unit)) order[++n] = key; val[f, key] = $3; unit[key] = $4 }
    function ratio(a, b, u) {
        if (a == "" || b == "" || a == "NA" || b == "NA" || a + 0 <= 0 || b + 0 <= 0) return "NA"
        return sprintf("%.3f", u == "us" ? a / b : b / a)
    }
    function v(i, k) { return ((i, k) in val) ? val[i, k] : "NA" }
    END {
        print "metric,bytes,native,frontend,guest,unit,frontend_ratio,guest_ratio"
        for (i = 1; i <= n; i++) {
            k = order[i]
            print k, v(1, k), v(2, k), v(3, k), unit[k], ratio(v(1, k), v(2, k), unit[k]), ratio(v(1, k), v(3, k), unit[k])
        }
    }' "$out/native.csv" "$out/frontend.csv" "$out/guest.csv" >"$out/table.csv"

awk -F, '
    function size(b) {
        if (b == 0) return "-"
        if (b % 1073741824 == 0) return b / 1073741824 " GiB"
        if (b % 1048576 == 0) return b / 1048576 " MiB"
        if (b >= 1048576) return sprintf("%.1f MiB", b / 1048576)
        if (b % 1024 == 0) return b / 1024 " KiB"
        return b " B"
    }
    NR == 1 { printf "%-26s %8s %12s %12s %12s %-8s %8s %8s\n", "metric", "size", "native", "frontend", "guest", "unit", "fe/nat", "gst/nat"; next }
    { printf "%-26s %8s %12s %12s %12s %-8s %8s %8s\n", $1, size($2), $3, $4, $5, $6, $7, $8 }' "$out/table.csv"
rows() { tail -n +2 "$1" | grep -vc ',NA,' || true; }
accel=$(sed -n 's/^\[run-vm\] accelerator: \([a-z]*\).*/\1/p' "$out/guest.log" | head -n 1)
echo "native: $(rows "$out/native.csv") rows measured, frontend (native CPU speed):" \
    "$(rows "$out/frontend.csv"), guest (${accel:-unknown accelerator}): $(rows "$out/guest.csv");" \
    "ratio = native/x for us, x/native for the rest (higher is better, 1.000 = parity); files in $out"
(($(rows "$out/native.csv") > 0 && $(rows "$out/guest.csv") > 0)) || status=1
if ((${#runtimes[@]} > 1)); then
    # Native and each runtime: each one's ratio to native and, where ours ran, to ours (higher is
    # better; x/ours > 1: that runtime is faster than ours).
    echo "== native and the guest with each runtime (${runtimes[*]})"
    files=("$out/native.csv")
    for r in "${runtimes[@]}"; do files+=("$out/guest-$r.csv"); done
    awk -F, -v OFS=, -v names="${runtimes[*]}" '
        FNR == 1 { f++; next }
        { key = $1 FS $2; if (!(key in unit)) order[++n] = key; val[f, key] = $3; unit[key] = $4 }
        function ratio(a, b, u) {
            if (a == "" || b == "" || a == "NA" || b == "NA" || a + 0 <= 0 || b + 0 <= 0) return "NA"
            return sprintf("%.3f", u == "us" ? a / b : b / a)
        }
        function v(i, k) { return ((i, k) in val) ? val[i, k] : "NA" }
        END {
            m = split(names, name, " "); ours = 0
            for (j = 1; j <= m; j++) if (name[j] == "ours") ours = j + 1
            line = "metric,bytes,native"
            for (j = 1; j <= m; j++) line = line "," name[j]
            line = line ",unit"
            for (j = 1; j <= m; j++) line = line "," name[j] "_ratio"
            if (ours) for (j = 1; j <= m; j++) if (j + 1 != ours) line = line "," name[j] "_to_ours"
            print line
            for (i = 1; i <= n; i++) {
                k = order[i]; u = unit[k]; line = k "," v(1, k)
                for (j = 1; j <= m; j++) line = line "," v(j + 1, k)
                line = line "," u
                for (j = 1; j <= m; j++) line = line "," ratio(v(1, k), v(j + 1, k), u)
                if (ours) for (j = 1; j <= m; j++) if (j + 1 != ours) line = line "," ratio(v(ours, k), v(j + 1, k), u)
                print line
            }
        }' "${files[@]}" >"$out/runtimes.csv"
    awk -F, '{ line = sprintf("%-24s", $1); for (i = 2; i <= NF; i++) line = line sprintf(" %12s", $i); print line }' "$out/runtimes.csv"
    for r in "${runtimes[@]}"; do (($(rows "$out/guest-$r.csv") > 0)) || status=1; done
fi
exit $status

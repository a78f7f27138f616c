#!/usr/bin/env bash
# bench.sh: on a GPU host, runs qcuda_bench (bench/qcuda_bench.cu) natively against the host's
# libcudart, then inside the qcuda guest against ours, and prints guest/native ratios.
#   ./bench.sh [--out DIR] [--max-bytes N[K|M|G]] [--guest-mem SIZE] [--guest-smp N]
#              [--timeout SECONDS] [--daemon-arg ARG]... [--vm-arg ARG]... [--runtime WHICH]
#              [-- BENCH-ARGS...]
# Writes to DIR (default: bench-out beside this script; build/bench-out in the repo):
#   native.csv, guest.csv   metric,bytes,value,unit (the program's own rows)
#   bench.csv               metric,bytes,native,guest,unit,ratio; ratio is native/guest for
#                           times (us) and guest/native for everything else (GB/s, launch/s, the
#                           scaling factor x), so higher is better, 1 = parity
#   native.log, guest.log, vm/   progress, the guest console, the daemon's and QEMU's logs
# The guest runs with --quick (a guest under TCG is slow on the CPU side), the host in full.
# --daemon-arg passes an argument to vhost-cuda (repeatable, e.g. --daemon-arg --hop-poll-us=0);
# --vm-arg one to run-vm.sh (repeatable, e.g. --vm-arg --add --vm-arg FILE:/opt/qcuda/bench/FILE
# to run another build of the benchmark in the guest);
# arguments after -- go to qcuda_bench on both sides (e.g. -- --only pageable --min-bytes 64M).
# --runtime picks the CUDA runtime the guest run uses: "ours" (default: qcuda's libcudart.so.13),
# "nvidia" (NVIDIA's libcudart.so.13, shipped in the guest at /usr/lib/qcuda/nvidia/13, over
# qcuda's libcuda.so.1: the path of frameworks and NVIDIA's libraries), or "both" (two guest
# runs; the NVIDIA one writes guest-nvidia.csv, guest-nvidia.log, vm-nvidia/ and
# bench-nvidia.csv, and a third table compares the two runtimes in the guest).
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
runtime=ours
while (($#)); do
    case $1 in
    --out) out=$2; shift 2 ;;
    --max-bytes) max_args=(--max-bytes "$2"); shift 2 ;;
    --guest-mem) mem_args=(--mem "$2"); shift 2 ;;
    --guest-smp) smp_args=(--smp "$2"); shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --daemon-arg) daemon_args+=(--daemon-arg "$2"); shift 2 ;;
    --vm-arg) vm_args+=("$2"); shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --) shift; bench_args=("$@"); break ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--out DIR] [--max-bytes N] [--guest-mem SIZE] [--guest-smp N] [--timeout SECONDS] [--daemon-arg ARG]... [--vm-arg ARG]... [--runtime ours|nvidia|both] [-- BENCH-ARGS...]" >&2; exit 2 ;;
    esac
done
case $runtime in
ours | nvidia | both) ;;
*) echo "bench: --runtime is ours, nvidia or both, not $runtime" >&2; exit 2 ;;
esac

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

# One guest run: SUFFIX names its files ("" or "-nvidia"); LIBPATH is put first on the guest
# program's library path ("" keeps ours).
guest_run() { # suffix, libpath, what
    echo "== guest (through QEMU, qcuda.ko and vhost-cuda; $3), --quick run"
    local env=""
    [[ -z $2 ]] || env="LD_LIBRARY_PATH=$2 "
    "$B/run-vm.sh" --log-dir "$out/vm$1" --timeout "$timeout" "${mem_args[@]}" "${smp_args[@]}" \
        "${daemon_args[@]}" "${vm_args[@]}" -- \
        "insmod /lib/modules/qcuda.ko && ${env}/opt/qcuda/bench/qcuda_bench --quick ${max_args[*]} ${bench_args[*]}" 2>&1 |
        tee "$out/guest$1.log"
    local rc=${PIPESTATUS[0]}
    csv_rows <"$out/guest$1.log" >"$out/guest$1.csv"
    ((rc == 0)) || { echo "bench: guest run ($3) exited $rc: $(tr -d '\r' <"$out/guest$1.log" | grep -E '^(FAIL|SKIP)' | tail -n 1)"; status=1; }
}
if [[ $runtime == nvidia ]]; then
    guest_run "" /usr/lib/qcuda/nvidia/13 "NVIDIA's libcudart.so.13 over qcuda's libcuda.so.1"
else
    guest_run "" "" "qcuda's libcudart.so.13"
    if [[ $runtime == both ]]; then
        guest_run -nvidia /usr/lib/qcuda/nvidia/13 "NVIDIA's libcudart.so.13 over qcuda's libcuda.so.1"
    fi
fi

# compare A.csv B.csv OUT.csv NAME-A NAME-B: rows keyed by metric and size, in A's order, then
# any B alone has; ratio as described at the top (B against A); prints the table.
compare() {
    awk -F, -v OFS=, -v na="$4" -v nb="$5" '
        FNR == 1 { next }
        FILENAME == ARGV[1] { key = $1 FS $2; if (!(key in unit)) order[++n] = key; nat[key] = $3; unit[key] = $4; next }
        { key = $1 FS $2; if (!(key in unit)) order[++n] = key; gst[key] = $3; unit[key] = $4 }
        END {
            print "metric,bytes," na "," nb ",unit,ratio"
            for (i = 1; i <= n; i++) {
                k = order[i]; a = (k in nat) ? nat[k] : "NA"; b = (k in gst) ? gst[k] : "NA"; r = "NA"
                if (a != "NA" && b != "NA" && a + 0 > 0 && b + 0 > 0)
                    r = sprintf("%.3f", unit[k] == "us" ? a / b : b / a)
                print k, a, b, unit[k], r
            }
        }' "$1" "$2" >"$3"

    awk -F, -v a="$4" -v b="$5" '
        function size(b) {
            if (b == 0) return "-"
            if (b % 1073741824 == 0) return b / 1073741824 " GiB"
            if (b % 1048576 == 0) return b / 1048576 " MiB"
            if (b >= 1048576) return sprintf("%.1f MiB", b / 1048576)
            if (b % 1024 == 0) return b / 1024 " KiB"
            return b " B"
        }
        NR == 1 { printf "%-20s %8s %14s %14s %-8s %7s\n", "metric", "size", a, b, "unit", "ratio"; next }
        { printf "%-20s %8s %14s %14s %-8s %7s\n", $1, size($2), $3, $4, $5, $6 }' "$3"
}
compare "$out/native.csv" "$out/guest.csv" "$out/bench.csv" native guest
rows() { tail -n +2 "$1" | grep -vc ',NA,' || true; }
accel=$(sed -n 's/^\[run-vm\] accelerator: \([a-z]*\).*/\1/p' "$out/guest.log" | head -n 1)
echo "native: $(rows "$out/native.csv") rows measured, guest (${accel:-unknown accelerator}):" \
    "$(rows "$out/guest.csv"); ratio = native/guest for us, guest/native for the rest (higher" \
    "is better, 1.000 = parity); files in $out"
(($(rows "$out/native.csv") > 0 && $(rows "$out/guest.csv") > 0)) || status=1
if [[ $runtime == both ]]; then
    echo "== native against NVIDIA's runtime over qcuda's driver in the guest"
    compare "$out/native.csv" "$out/guest-nvidia.csv" "$out/bench-nvidia.csv" native guest-nvidia
    echo "== in the guest: qcuda's runtime against NVIDIA's over qcuda's driver (ratio > 1: NVIDIA's is faster)"
    compare "$out/guest.csv" "$out/guest-nvidia.csv" "$out/runtimes.csv" ours nvidia
    (($(rows "$out/guest-nvidia.csv") > 0)) || status=1
fi
exit $status

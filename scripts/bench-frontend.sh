#!/usr/bin/env bash
# bench-frontend.sh: qcuda at native CPU speed. Starts vhost-cuda on sockets of its own and runs
# vhost-cuda-frontend-bench against it: a host process that connects as QEMU does and sends the
# requests qcuda.ko and guest-lib send (docs/perf/frontend.md), then many VMs and sessions at
# once for the daemon's ceiling. scripts/bench.sh runs it between the native and the guest run.
#   ./bench-frontend.sh [--out DIR] [--quick] [--max-bytes N[K|M|G]] [--vms N] [--sessions M]
#                       [--seconds S] [--daemon-arg ARG]... [-- FRONTEND-ARGS...]
# Writes to DIR (default: bench-out beside this script; build/bench-out in the repo):
#   frontend.csv            metric,bytes,value,unit (the benchmark's rows)
#   frontend.log            its progress; frontend-daemon.log, the daemon's log
# --vms N and --sessions M: the ceiling's largest configuration (default 4 and 4; the daemon
# serves N sockets); --seconds S: how long each configuration runs (default 1).
# Works from an unpacked bundle (scripts/bundle.sh) and from the repo, with or without a GPU:
# without one the daemon answers the transport rows (Hello, Echo) and the benchmark prints one
# "skipped: no GPU" line for the rest. Exits 1 if the benchmark fails or crashes, or its Hello
# and Echo rows are missing.
set -uo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -x $B/bin/vhost-cuda ]]; then # bundle layout
    daemon=$B/bin/vhost-cuda frontend=$B/bin/vhost-cuda-frontend-bench out=$B/bench-out
else # repo layout: scripts/ beside target/
    daemon=$B/../target/release/vhost-cuda frontend=$B/../target/release/vhost-cuda-frontend-bench
    out=$B/../build/bench-out
fi
vms=4 sessions=4 seconds=1 fe_args=() daemon_args=()
while (($#)); do
    case $1 in
    --out) out=$2; shift 2 ;;
    --quick) fe_args+=(--quick); shift ;;
    --max-bytes) fe_args+=(--max-bytes "$2"); shift 2 ;;
    --vms) vms=$2; shift 2 ;;
    --sessions) sessions=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --daemon-arg) daemon_args+=("$2"); shift 2 ;;
    --) shift; fe_args+=("$@"); break ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--out DIR] [--quick] [--max-bytes N] [--vms N] [--sessions M] [--seconds S] [--daemon-arg ARG]... [-- FRONTEND-ARGS...]" >&2; exit 2 ;;
    esac
done
for p in "$daemon" "$frontend"; do
    [[ -x $p ]] || { echo "bench-frontend: $p is missing (cargo build --release -p vhost-cuda)" >&2; exit 1; }
done
mkdir -p "$out" && out=$(cd "$out" && pwd)
dir=$(mktemp -d)
sock=$dir/fe.sock
daemon_pid=
cleanup() {
    if [[ -n $daemon_pid ]]; then
        kill -TERM "$daemon_pid" 2>/dev/null
        wait "$daemon_pid" 2>/dev/null
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

"$daemon" --socket-path "$sock" --socket-count "$vms" "${daemon_args[@]}" >"$out/frontend-daemon.log" 2>&1 &
daemon_pid=$!
first=$sock
((vms > 1)) && first=$sock.0
for _ in $(seq 100); do
    [[ -S $first ]] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
done
if [[ ! -S $first ]]; then
    echo "bench-frontend: vhost-cuda did not come up; its log:"
    tail -n 20 "$out/frontend-daemon.log"
    exit 1
fi

"$frontend" --socket "$sock" --socket-count "$vms" --vms "$vms" --sessions "$sessions" \
    --seconds "$seconds" "${fe_args[@]}" >"$out/frontend.out" 2> >(tee "$out/frontend.log" >&2)
rc=$?
cat "$out/frontend.out"
{
    echo "metric,bytes,value,unit"
    grep -E '^[a-z0-9_]+,[0-9]+,(-?[0-9]+(\.[0-9]+)?|NA),(GB/s|us|launch/s|req/s|x)$' "$out/frontend.out"
} >"$out/frontend.csv"
status=0
if ((rc != 0)); then
    echo "bench-frontend: vhost-cuda-frontend-bench exited $rc"
    status=1
fi
for row in hello_us,0 echo_us,0 echo_us,4096; do
    grep -Eq "^${row},[0-9.]+,us$" "$out/frontend.csv" || {
        echo "bench-frontend: the ${row%,*} row (${row#*,} bytes) is missing"
        status=1
    }
done
kill -0 "$daemon_pid" 2>/dev/null || { echo "bench-frontend: vhost-cuda died during the run"; status=1; }
echo "frontend: $(($(wc -l <"$out/frontend.csv") - 1)) rows in $out/frontend.csv"
exit $status

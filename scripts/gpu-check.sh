#!/usr/bin/env bash
# gpu-check.sh: "does qcuda work on this GPU host?" in one command. Runs every GPU suite of the
# bundle side by side, each in a lane of its own (its own log folder, its own time limit), as
# many at once as the host's cores allow, then prints one table (suite, kernel, passed, failed,
# skipped, time, headline figure) and packs every log into one archive.
#
#   ./gpu-check.sh [--quick] [--out DIR] [--cores N] [--only LANE[,LANE...]] [--list]
#                  [--deadline S] [--check-lanes]
#
# --quick     the subset that finishes in under 5 minutes on a 16-core host (the CUDA programs
#             on our kernel with the kill and two-VM checks, CuPy and Numba, a pause, a migration,
#             the sandbox, a hostile guest; PyTorch's lanes take longer in a TCG guest);
#             the full run finishes in under 10 minutes there.
# --out DIR   where the lanes write (default: gpu-check-out beside this script); the archive is
#             DIR/gpu-check-logs.tar.xz, the table DIR/summary.txt and DIR/summary.csv.
# --cores N   the budget the lanes' weights share (default: 4 x nproc). A lane's weight is the
#             host threads its guests may keep busy (TCG runs one host thread per vCPU); they
#             mostly wait on the GPU and on each other, so on an H200 host of 16 cores every
#             lane at once (weights 57) ended in 525 s where a budget of 16 ran them in turn.
# --only      run only these lanes (names from --list).
# --deadline S  end the whole run within S seconds: a lane's limit is cut to the time left, a
#             lane with under 30 s left is not started (its row says so), and the table and the
#             archive are still written (a caller with a hard time limit gets its logs).
# --list      print the lanes (name, kernel, weight, limit, quick, command) and exit.
# --check-lanes  check that every lane's script is present beside this one, and exit
#             (scripts/test.sh runs it on the bundle).
#
# Without a GPU every lane prints "skipped: no GPU" and the script exits 0. It exits 1 when any
# lane failed, ran out of its limit, or printed no result. Each suite stays usable alone: a lane
# is just the suite's own command line.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
quick=0 out=$here/gpu-check-out cores=$((4 * $(nproc))) only="" list=0 check_lanes=0 deadline=0
while (($#)); do
    case $1 in
    --quick) quick=1; shift ;;
    --out) out=$2; shift 2 ;;
    --cores) cores=$2; shift 2 ;;
    --only) only=,$2,; shift 2 ;;
    --list) list=1; shift ;;
    --deadline) deadline=$2; shift 2 ;;
    --check-lanes) check_lanes=1; shift ;;
    *) echo "usage: $0 [--quick] [--out DIR] [--cores N] [--only LANE,...] [--list] [--deadline S] [--check-lanes]" >&2; exit 2 ;;
    esac
done

# The lanes, longest first (the scheduler starts them in this order as cores free up).
# name | kernel | weight | limit (s) | in --quick (q) or not (-) | kind of summary | command
# The command runs in this folder with $L set to the lane's own log folder.
LANES=$(
    cat <<'EOF'
cuda-programs|own|3|540|q|counts|./run-gpu-tests.sh --log-dir "$L"
cuda-programs-stock|stock|3|540|-|counts|./run-gpu-tests.sh --kernel stock --log-dir "$L"
torch|own|4|540|-|torch|./run-torch-test.sh --log-dir "$L"
torch-stock|stock|4|540|-|torch|./run-torch-test.sh --kernel stock --log-dir "$L"
frameworks|own|3|480|q|counts|./run-torch-test.sh --check cupy_check,numba_check --log-dir "$L"
jax|own|3|560|-|counts|./run-torch-test.sh --check jax_check --log-dir "$L"
expandable-segments|own|2|420|-|counts|./run-torch-test.sh --check vmm_check --log-dir "$L"
libraries|own|2|480|-|counts|./run-gpu-tests.sh --libraries --log-dir "$L"
torch-pause|own|4|560|-|pause|./test-torch-pause.sh --log-dir "$L"
migration-torch|own|4|600|-|migration|./test-migration.sh --program torch --log-dir "$L"
trace|own|4|480|-|counts|./test-trace.sh --log-dir "$L"
migration|own|2|420|q|migration|./test-migration.sh --program checkpoint --working-set-mib 1024 --log-dir "$L"
migration-16g|own|2|600|-|migration|./test-migration.sh --program checkpoint --working-set-mib 16384 --log-dir "$L"
migration-4g|own|2|480|-|migration|./test-migration.sh --program checkpoint --working-set-mib 4096 --log-dir "$L"
migration-rewrite|own|2|480|-|migration|./test-migration.sh --program checkpoint --working-set-mib 1024 --rewrite 1 --log-dir "$L"
migration-copy|own|2|480|-|migration|./test-migration.sh --program checkpoint --working-set-mib 4096 --path copy --max-bandwidth 4G --log-dir "$L"
migration-refused|own|2|420|-|migration|./test-migration.sh --program checkpoint --live-async 1 --log-dir "$L"
checkpoint|own|2|420|q|pause|./test-checkpoint.sh --log-dir "$L"
restart|own|2|420|-|restart|./test-restart-gpu.sh --log-dir "$L"
cuda-checkpoint|own|2|420|-|exit|./test-cuda-checkpoint.sh --log-dir "$L"
sandbox|own|2|420|q|counts|./sandbox-gpu-check.sh --out "$L" --budget 360
sandbox-trace|own|2|420|-|counts|./sandbox-gpu-check.sh --trace --out "$L" --budget 360
hostile|own|1|300|q|exit|./run-vm.sh --log-dir "$L/vm" --timeout 280 -- 'insmod /lib/modules/qcuda.ko && for i in 1 2 3; do qcuda-smi hostile || exit 1; done'
bench|own|3|480|-|bench|./bench.sh --runtime ours,ours-chroot,host --no-frontend --out "$L" -- --only latency,pinned
EOF
)

# QCUDA_GPU_CHECK_LANES=FILE replaces the table (scripts/test.sh checks the scheduler, the table
# and the verdicts with lanes of its own).
if [[ -n ${QCUDA_GPU_CHECK_LANES:-} ]]; then
    LANES=$(cat "$QCUDA_GPU_CHECK_LANES") || exit 2
fi

lane_field() { # line, index (1-based)
    local IFS='|'
    # shellcheck disable=SC2206 # splitting on | on purpose
    local f=($1)
    if (($2 == 7)); then
        local IFS='|'
        echo "${f[*]:6}"
    else
        echo "${f[$(($2 - 1))]}"
    fi
}

selected=()
while IFS= read -r l; do
    [[ -n $l ]] || continue
    name=$(lane_field "$l" 1)
    [[ -z $only || $only == *",$name,"* ]] || continue
    ((quick == 0)) || [[ $(lane_field "$l" 5) == q ]] || continue
    selected+=("$l")
done <<<"$LANES"

if ((list)); then
    printf '%-22s %-6s %6s %6s %5s  %s\n' lane kernel weight limit quick command
    for l in "${selected[@]}"; do
        printf '%-22s %-6s %6s %6s %5s  %s\n' "$(lane_field "$l" 1)" "$(lane_field "$l" 2)" \
            "$(lane_field "$l" 3)" "$(lane_field "$l" 4)" "$(lane_field "$l" 5)" "$(lane_field "$l" 7)"
    done
    exit 0
fi

# The script a lane runs: the first word of its command.
lane_script() { # line
    local c
    c=$(lane_field "$1" 7)
    echo "${c%% *}"
}

if ((check_lanes)); then
    bad=0
    for l in "${selected[@]}"; do
        s=$(lane_script "$l")
        if [[ -x $here/${s#./} ]]; then
            echo "ok    $(lane_field "$l" 1): $s"
        else
            echo "FAIL  $(lane_field "$l" 1): $s is missing or not executable in $here"
            bad=1
        fi
    done
    # A check a lane names through --check must travel too.
    for l in "${selected[@]}"; do
        c=$(lane_field "$l" 7)
        [[ $c == *"--check "* ]] || continue
        checks=${c#*--check }
        checks=${checks%% *}
        for n in ${checks//,/ }; do
            if [[ -f $here/tests/torch/$n.py ]]; then echo "ok    $(lane_field "$l" 1): tests/torch/$n.py"; else
                echo "FAIL  $(lane_field "$l" 1): tests/torch/$n.py is missing in $here"; bad=1; fi
        done
    done
    exit $bad
fi

# shellcheck source=scripts/gpu-host.sh
. "$here/gpu-host.sh"
if ! gpu_present; then
    for l in "${selected[@]}"; do
        printf '%-22s skipped: no GPU\n' "$(lane_field "$l" 1)"
    done
    exit 0
fi

mkdir -p "$out" && out=$(cd "$out" && pwd)
rm -rf "${out:?}"/lanes
mkdir -p "$out/lanes"
nvidia-smi -L | tee "$out/gpus.txt"
echo "gpu-check: ${#selected[@]} lanes on a budget of $cores cores$( ((quick)) && echo ' (--quick)')"

declare -A pid_of start_of weight_of rc_of end_of
running=0 used=0
t_start=$(date +%s)
# The host's CPU use and free memory every 5 s (host.txt: seconds, busy %, of nproc, MiB
# available): whether the lanes were held back by cores or by memory.
(
    prev=$(head -n 1 /proc/stat)
    while sleep 5; do
        cur=$(head -n 1 /proc/stat)
        awk -v a="$prev" -v b="$cur" -v t="$(($(date +%s) - t_start))" -v n="$(nproc)" \
            -v m="$(awk '/^MemAvailable/ { print int($2 / 1024) }' /proc/meminfo)" 'BEGIN {
            split(a, x); split(b, y); tot = 0; idle = 0
            for (i = 2; i <= 11; i++) tot += y[i] - x[i]
            idle = (y[5] - x[5]) + (y[6] - x[6])
            printf "%d %.0f %d %d\n", t, tot ? 100 * (tot - idle) / tot : 0, n, m }'
        prev=$cur
    done
) >"$out/host.txt" 2>/dev/null &
sampler=$!
# The time left before the deadline, in seconds (large without one).
left() { if ((deadline > 0)); then echo $((t_start + deadline - $(date +%s))); else echo 999999; fi; }

start_lane() { # line
    local l=$1 name limit dir cmd
    name=$(lane_field "$l" 1)
    limit=$(lane_field "$l" 4)
    cmd=$(lane_field "$l" 7)
    dir=$out/lanes/$name
    mkdir -p "$dir"
    # Within the deadline, with time for the suite's own TERM handling (timeout -k 20).
    local spare=$(($(left) - 25))
    ((limit > spare)) && limit=$spare
    # Each lane is a process group of its own, so that a lane past its limit is stopped whole
    # (its QEMUs, daemons and virtiofsd), through the suites' own TERM handling first.
    (
        cd "$here" || exit 125
        export L=$dir
        # The lane's CPU time (its reaped descendants': QEMU, daemons, native runs) goes into
        # cpu-times.txt, so that lanes can be sized by what they use.
        exec setsid timeout -k 20 "$limit" bash -c "$cmd"'
rc=$?; times >"$L/cpu-times.txt"; exit $rc'
    ) >"$dir/out.log" 2>&1 &
    pid_of[$name]=$!
    start_of[$name]=$(date +%s)
    weight_of[$name]=$(lane_field "$l" 3)
    used=$((used + weight_of[$name]))
    running=$((running + 1))
    printf '[%4ss] start  %s\n' "$(($(date +%s) - t_start))" "$name"
}

reap() { # wait for one lane to end
    local name p
    wait -n 2>/dev/null || true
    for name in "${!pid_of[@]}"; do
        p=${pid_of[$name]}
        [[ -n ${rc_of[$name]:-} ]] && continue
        if ! kill -0 "$p" 2>/dev/null; then
            wait "$p" 2>/dev/null
            rc_of[$name]=$?
            end_of[$name]=$(date +%s)
            used=$((used - weight_of[$name]))
            running=$((running - 1))
            printf '[%4ss] end    %s (exit %s, %ss)\n' "$(($(date +%s) - t_start))" "$name" "${rc_of[$name]}" \
                "$((end_of[$name] - start_of[$name]))"
        fi
    done
}

on_signal() {
    for p in "${pid_of[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; done
    exit 130
}
trap on_signal INT TERM

for l in "${selected[@]}"; do
    w=$(lane_field "$l" 3)
    # A lane waits for cores, but one lane always runs even if it alone exceeds the budget.
    while ((running > 0 && used + w > cores)); do reap; done
    if (($(left) < 55)); then
        name=$(lane_field "$l" 1)
        mkdir -p "$out/lanes/$name"
        echo "not started: under 30 s of the deadline left" >"$out/lanes/$name/out.log"
        rc_of[$name]=125 start_of[$name]=$(date +%s) end_of[$name]=$(date +%s)
        printf '[%4ss] skip   %s (deadline)\n' "$(($(date +%s) - t_start))" "$name"
        continue
    fi
    start_lane "$l"
done
while ((running > 0)); do reap; done
kill "$sampler" 2>/dev/null

# One lane's result: passed failed skipped headline, from its log and exit status.
summarize() { # name kind rc log
    local name=$1 kind=$2 rc=$3 log=$4 p=0 f=0 s=0 head="" counts
    if grep -q '^skipped: ' "$log" && ! grep -qE '^[0-9]+ passed' "$log"; then
        s=1 head=$(grep -m1 '^skipped: ' "$log")
    else
        counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
        if [[ -n $counts ]]; then
            p=$(sed -E 's/^([0-9]+) passed.*/\1/' <<<"$counts")
            f=$(sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$counts")
            [[ $counts == *skipped* ]] && s=$(sed -E 's/.* ([0-9]+) skipped.*/\1/' <<<"$counts")
        fi
        if [[ -z $counts || $kind != counts ]]; then
            # Suites that end in one verdict count as one check (torch: its own counts, kept).
            if [[ -z $counts ]]; then
                if ((rc == 0)); then p=1; else f=1; fi
            fi
        fi
        ((rc == 0)) || ((f > 0)) || f=1
    fi
    case $kind in
    torch) head=$(grep -m1 '^time: ' "$log" | sed 's/^time: //') ;;
    pause)
        head=$(grep -oE '[0-9.]+ GiB/s' "$log" | awk '{ v = $1 + 0; if (n == 0 || v < lo) lo = v; if (v > hi) hi = v; n++ }
            END { if (n) printf "%d pauses/resumes, %.2f-%.2f GiB/s", n, lo, hi }')
        ;;
    migration)
        head=$(grep -iE '^ *downtime:' "$log" | tail -n 1 | sed -E 's/^ *//')
        t=$(grep -iE '^ *total time' "$log" | tail -n 1 | sed -E 's/^ *//')
        head="${head}${t:+, $t}"
        r=$(grep -m1 'iteration rate:' "$log" | sed -E 's/.*iteration rate: ([^(]*).*/\1/; s/ *$//')
        head="${head}${r:+, iterations $r}"
        # handover (a destination on the host claimed the device memory) or copy.
        local path
        path=$(grep -m1 'migration path:' "$log" | sed -E 's/.*migration path: *//')
        head="${head}${path:+, path $path}"
        head=${head#, }
        grep -q "was refused and the program goes on" "$log" && head="refused as it must${head:+; $head}"
        # The torch program: whether the migrated run's loss curve is the uninterrupted one's.
        grep -q "equals the uninterrupted run's bit for bit" "$log" && head="the same loss curve${head:+, $head}"
        grep -q "loss curve differs" "$log" && head="the loss curves differ${head:+; $head}"
        ;;
    restart) head=$(grep -oE 'served again [0-9]+ ms' "$log" | awk '{ print $3 }' | paste -sd/ | sed 's|$| ms to serve again|') ;;
    bench)
        # Each runtime's ratio to native for the headline rows (runtimes.csv names its columns).
        head=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ /_ratio$/) { c[++m] = i; n[m] = $i; sub(/_ratio$/, "", n[m]) }; next }
            $1 == "launch_async_us" || $1 == "launch_sync_us" || ($1 ~ /pinned/ && $2 == 268435456) {
                line = ""; for (j = 1; j <= m; j++) line = line (j > 1 ? "/" : "") $c[j]
                printf "%s%s %s", sep, $1, line; sep = "; " }
            END { if (m) { printf " ("; for (j = 1; j <= m; j++) printf "%s%s", (j > 1 ? "/" : ""), n[j]; printf " vs native)" } }' \
            "$(dirname "$log")/runtimes.csv" 2>/dev/null)
        ;;
    counts) head=$(grep -m1 '^FAIL' "$log" || true) ;;
    exit)
        # A suite that passed may still have printed a native FAIL it judged informational (a
        # host driver that cannot checkpoint): the headline is then its verdict, not that line.
        if ((rc == 0)); then
            head=$(grep -m1 'informational' "$log" | sed -E 's/^\[[^]]*\] *//' || true)
        else
            head=$(grep -m1 '^FAIL' "$log" || true)
        fi
        ;;
    esac
    ((rc == 124 || rc == 137)) && head="ran past its limit${head:+; $head}"
    ((rc == 125)) && head="not started: the deadline was near"
    echo "$p|$f|$s|$head"
}

{
    printf '%-22s %-6s %6s %6s %7s %6s  %s\n' suite kernel passed failed skipped time headline
    echo "suite,kernel,passed,failed,skipped,seconds,exit,headline" >"$out/summary.csv"
    bad=0
    for l in "${selected[@]}"; do
        name=$(lane_field "$l" 1)
        kind=$(lane_field "$l" 6)
        IFS='|' read -r p f s head < <(summarize "$name" "$kind" "${rc_of[$name]}" "$out/lanes/$name/out.log")
        secs=$((end_of[$name] - start_of[$name]))
        ((f == 0)) || bad=1
        printf '%-22s %-6s %6s %6s %7s %5ss  %s\n' "$name" "$(lane_field "$l" 2)" "$p" "$f" "$s" "$secs" "$head"
        printf '%s,%s,%s,%s,%s,%s,%s,"%s"\n' "$name" "$(lane_field "$l" 2)" "$p" "$f" "$s" "$secs" \
            "${rc_of[$name]}" "${head//\"/\'}" >>"$out/summary.csv"
    done
    echo "wall time: $(($(date +%s) - t_start)) s on $cores cores"
    awk '{ b += $2; if ($2 > pb) pb = $2; if (lm == "" || $4 < lm) lm = $4; n++ }
        END { if (n) printf "host: CPU busy %.0f%% on average, %.0f%% at most, of %d cores; least memory available %d MiB\n", b / n, pb, $3, lm }' \
        "$out/host.txt"
} | tee "$out/summary.txt"
bad=$(awk -F, 'NR > 1 && $4 > 0 { b = 1 } END { print b + 0 }' "$out/summary.csv")
tar -C "$out" -cJf "$out/gpu-check-logs.tar.xz" --exclude='*.tar.xz' lanes summary.txt summary.csv gpus.txt host.txt 2>/dev/null
echo "logs: $out/gpu-check-logs.tar.xz"
((bad == 0))

#!/bin/sh
# guest-observe.sh KIND SECONDS [PROGRAM]: run inside a guest by bench-scale.sh (busybox sh), beside
# the PROGRAM processes (default qcuda_bench) that wait for /sync/go.KIND and then run for SECONDS.
# From a tenth to nine tenths of their run it records what the guest's CPUs did (/proc/stat),
# which interrupts they took (/proc/interrupts) and, 16 times, the state and kernel wait point
# (wchan) of every thread of PROGRAM; then prints a summary, each line starting
# "guestprof KIND". Set against the host's view of the vCPU threads (thread-cpu.sh), it tells
# emulated work from vCPUs that wait: a CPU the guest counts as busy while its host thread is not
# running waits inside the emulator.
kind=$1 secs=$2 prog=${3:-qcuda_bench}
tmp=/tmp/guest-observe.$kind
mkdir -p "$tmp"
while [ ! -e "/sync/go.$kind" ]; do sleep 0.05; done
sleep "$(awk -v s="$secs" 'BEGIN { print s / 10 }')"
read -r up_a _ </proc/uptime
cat /proc/stat >"$tmp/stat.a"
cat /proc/interrupts >"$tmp/irq.a"
: >"$tmp/states"
gap=$(awk -v s="$secs" 'BEGIN { print s * 0.8 / 16 }')
n=0
while [ $n -lt 16 ]; do
    for p in $(pidof "$prog"); do
        for t in /proc/"$p"/task/*; do
            read -r st <"$t/stat" || continue
            # "pid (comm) state ...": the names of these threads hold no spaces.
            # shellcheck disable=SC2086 # split into fields on purpose
            set -- $st
            w=
            read -r w <"$t/wchan"
            echo "$3 ${w:-0}" >>"$tmp/states"
        done
    done
    sleep "$gap"
    n=$((n + 1))
done
read -r up_b _ </proc/uptime
cat /proc/stat >"$tmp/stat.b"
cat /proc/interrupts >"$tmp/irq.b"
window=$(awk -v a="$up_a" -v b="$up_b" 'BEGIN { print b - a }')

# CPU time: the "cpu" line's user nice system idle iowait irq softirq steal, as shares.
ncpu=$(grep -c '^cpu[0-9]' "$tmp/stat.a")
grep -h '^cpu ' "$tmp/stat.a" "$tmp/stat.b" | awk -v k="$kind" -v n="$ncpu" '
    NR == 1 { for (i = 2; i <= 9; i++) a[i] = $i; next }
    {
        t = 0
        for (i = 2; i <= 9; i++) { d[i] = $i - a[i]; t += d[i] }
        if (t <= 0) exit
        printf "guestprof %s cpu: %d CPUs, %.2f of them busy: user %.0f%%, system %.0f%%, irq+softirq %.0f%%, idle %.0f%%\n",
            k, n, n * (t - d[5] - d[6]) / t, 100 * (d[2] + d[3]) / t, 100 * d[4] / t,
            100 * (d[7] + d[8]) / t, 100 * (d[5] + d[6]) / t
    }'
# Interrupts per second over the window, the most frequent first.
awk -v w="$window" '
    FNR == 1 { next }
    {
        s = 0
        for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i
        name = $1
        for (; i <= NF; i++) name = name " " $i
        if (NR == FNR) { a[$1] = s; next }
        if (s > a[$1] && w > 0) printf "%d %s\n", (s - a[$1]) / w, name
    }' "$tmp/irq.a" "$tmp/irq.b" | sort -rn | head -n 8 |
    while read -r rate name; do echo "guestprof $kind irq/s: $rate $name"; done
# Threads of PROGRAM: the share of samples in each state and wait point.
total=$(wc -l <"$tmp/states")
sort "$tmp/states" | uniq -c | sort -rn | head -n 8 |
    while read -r c st w; do
        echo "guestprof $kind threads: $((100 * c / (total > 0 ? total : 1)))% $st $w"
    done
rm -rf "$tmp"

# shellcheck shell=bash
# thread-cpu.sh (sourced): where the host's CPU time went during a run, per thread of the
# processes that carry a guest's calls: QEMU (its TCG vCPUs and its other threads), vhost-cuda
# (the daemon's threads and the session workers) and virtiofsd. bench-scale.sh takes two snapshots
# while its processes run and prints the difference.
#
#   thread_cpu_snapshot FILE         one line per thread: tid, role, thread name, CPU ticks
#   thread_cpu_report A B SECONDS    per role and thread name (digits folded to N): cores used
#                                    on average over SECONDS, threads, the busiest thread's share
#
# Roles: qemu, vhost-cuda (the daemon), worker (a session worker: the same binary run with
# --session-worker), virtiofsd. A thread that started or ended between the snapshots is not
# counted, so both must fall inside the run.

# The role of process PID, or nothing when it is not one of ours.
thread_cpu_role() {
    local comm cmd
    comm=$(cat "/proc/$1/comm" 2>/dev/null) || return
    cmd=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null)
    # A worker is started from the daemon's own binary, whatever its name then (a sandboxed one
    # runs from a descriptor).
    if [[ $cmd == *--session-worker* ]]; then
        echo worker
        return
    fi
    case $comm in
    qemu-system-*) echo qemu ;;
    virtiofsd) echo virtiofsd ;;
    vhost-cuda) echo vhost-cuda ;;
    esac
}

thread_cpu_snapshot() { # file
    local p role t stat rest fields
    for p in $( (pgrep 'qemu-system|virtiofsd|vhost-cuda'; pgrep -f -- '--session-worker') | sort -u); do
        role=$(thread_cpu_role "$p")
        [[ -n $role ]] || continue
        for t in "/proc/$p"/task/[0-9]*; do
            stat=$(cat "$t/stat" 2>/dev/null) || continue
            # The name may hold spaces and parentheses ("CPU 0/TCG"): the fields after the last
            # ')' are state (3rd) onwards, so utime and stime (14th, 15th) are the 12th and 13th.
            rest=${stat##*) }
            read -r -a fields <<<"$rest"
            printf '%s\t%s\t%s\t%s\n' "${t##*/}" "$role" "$(cat "$t/comm" 2>/dev/null)" \
                "$((fields[11] + fields[12]))"
        done
    done >"$1"
}

thread_cpu_report() { # before, after, seconds
    awk -F'\t' -v secs="$3" -v hz="$(getconf CLK_TCK)" '
        NR == FNR { before[$1] = $4; next }
        ($1 in before) {
            name = $3
            if (name !~ /^qemu-system/) gsub(/[0-9]+/, "N", name)
            key = $2 "\t" name
            used = ($4 - before[$1]) / hz
            n[key]++; sum[key] += used
            if (used > top[key]) top[key] = used
        }
        END {
            if (secs <= 0) exit
            for (k in n) {
                split(k, w, "\t")
                printf "%7.2f cores  %3d x %-10s %-16s busiest %3.0f%%\n",
                    sum[k] / secs, n[k], w[1], w[2], 100 * top[k] / secs
            }
        }' "$1" "$2" | sort -rn
}

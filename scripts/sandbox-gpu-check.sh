#!/usr/bin/env bash
# sandbox-gpu-check.sh: on a GPU host, from an unpacked bundle (scripts/bundle.sh), measures which
# system calls the session workers make under the real NVIDIA driver and checks that the CUDA
# test programs pass with the workers sandboxed (vhost-cuda --sandbox, docs/SECURITY.md).
#
#   ./sandbox-gpu-check.sh [--strace DIR] [--out DIR] [--programs "a b c"] [--budget SECONDS]
#                          [--trace]
#
# 1. measure: the daemon under strace -f with --sandbox=namespace --worker-seccomp=log (calls
#    outside the list run and the kernel logs them); every system call a worker made after its
#    exec, by name, goes to OUT/syscalls-worker.txt, and those outside the allow-list (from the
#    kernel log, type=1326, and from the trace) to OUT/syscalls-missing.txt.
# 2. enforce: the same programs with --sandbox=namespace (the default: a call outside the list
#    kills the worker).
# 3. none: the same programs with --sandbox=none, for comparison.
# --strace DIR: a directory holding strace and, where the host lacks them, its libraries and
# ld-linux-x86-64.so.2 (run through that loader so that nothing else sees its libraries).
# --trace: every program records its GPU timeline with CUPTI (QCUDA_PROFILE in the guest, the
# daemon with --gpu-trace cupti), so the calls libcupti adds are measured and enforced too
# (the [cupti] section of vhost-cuda/src/sandbox/syscalls-measured.txt).
# Prints one "ok|FAIL <pass>/<program>" line per program and "N passed, N failed".
set -uo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
strace_dir="" out=$B/sandbox-check budget=270 trace=0
# ipc_events and ipc_share: interprocess events (the driver's POSIX shared memory in the VM's
# shared /dev/shm, between workers of distinct pids) and VMM POSIX-descriptor export and import
# between two workers; pointer_attributes: every kind of pointer.
programs="vector_add driver_api matrix_mul streams_events graphs host_functions mapped_memory pinned_async managed_memory stream_ordered_alloc device_printf errors isolation large_copy ipc_events ipc_share pointer_attributes"
while (($#)); do
    case $1 in
    --strace) strace_dir=$(cd "$2" && pwd); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --programs) programs=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --trace) trace=1; shift ;;
    *) echo "usage: $0 [--strace DIR] [--out DIR] [--programs LIST] [--budget SECONDS] [--trace]" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
start=$SECONDS
passed=0 failed=0
profile="" trace_args=()
if ((trace)); then
    profile="export QCUDA_PROFILE=/tmp/profile.json; "
    trace_args=(--gpu-trace cupti)
fi
guest_cmd="insmod /lib/modules/qcuda.ko; export QCUDA_EXPECT_RESET_RECOVERY=1; ${profile}for t in $programs; do [ -x /opt/qcuda/tests/\$t ] || continue; echo \"--- \$t\"; /opt/qcuda/tests/\$t; echo \"PROG-EXIT \$t \$?\"; done"
real=$B/bin/vhost-cuda
run_pass() { # name timeout daemon-args...
    local name=$1 limit=$2
    shift 2
    local args=()
    for a in "$@" "${trace_args[@]}"; do args+=(--daemon-arg "$a"); done
    "$B/run-vm.sh" --log-dir "$out/vm-$name" --timeout "$limit" "${args[@]}" -- "$guest_cmd" >"$out/guest-$name.log" 2>&1
    echo "== $name: run-vm.sh exit $? after $((SECONDS - start)) s"
    local seen=0
    while read -r _ prog rc; do
        seen=$((seen + 1))
        # errors.cu may exit 2 (skip) for checks a host cannot make.
        if [[ $rc == 0 || $rc == 2 ]]; then echo "ok   $name/$prog"; passed=$((passed + 1)); else
            echo "FAIL $name/$prog (exit $rc)"; failed=$((failed + 1)); fi
    done < <(tr -d '\r' <"$out/guest-$name.log" | grep '^PROG-EXIT ')
    ((seen > 0)) || { echo "FAIL $name: no program ran"; failed=$((failed + 1)); }
    grep -E 'worker process [0-9]+ (lost|exited \(signal)|sandbox|seccomp' "$out/vm-$name/daemon.log" | head -n 20
}

dmesg_before=$(dmesg 2>/dev/null | wc -l)
if [[ -n $strace_dir ]]; then
    # The daemon under strace; run-vm.sh starts "$B/bin/vhost-cuda", so a wrapper stands there.
    mv "$real" "$real.real"
    if [[ -x $strace_dir/ld-linux-x86-64.so.2 ]]; then
        st=("$strace_dir/ld-linux-x86-64.so.2" --library-path "$strace_dir" "$strace_dir/strace")
    else
        st=("$strace_dir/strace")
    fi
    printf '#!/bin/sh\nexec %s -f -qq -o %s %s "$@"\n' "${st[*]}" "$out/trace.txt" "$real.real" >"$real"
    chmod +x "$real"
    run_pass measure $((budget * 45 / 100)) --sandbox namespace --worker-seccomp log
    mv "$real.real" "$real"
    # Worker processes: the pids that exec'd with --session-worker, and the processes and threads
    # they cloned (a worker born pid 1 of its PID namespace clones the worker proper, then
    # execs the namespace's init, --pid-namespace-init, which is no worker).
    awk '
        / execve\(/ && /--session-worker/ { w[$1] = 1; next }
        / execve\(/ && ($1 in w) { delete w[$1]; next }
        ($1 in w) {
            line = $0; sub(/^[0-9]+ +/, "", line)
            if (match(line, /^<\.\.\. [a-z0-9_]+ resumed>/)) { name = substr(line, 6); sub(/ .*/, "", name) }
            else if (match(line, /^[a-z0-9_]+\(/)) { name = substr(line, 1, RLENGTH - 1) }
            else next
            calls[name] = 1
            if ((name == "clone" || name == "clone3") && match(line, /= [0-9]+$/)) w[substr(line, RSTART + 2)] = 1
        }
        END { for (c in calls) print c }' "$out/trace.txt" | sort >"$out/syscalls-worker.txt"
    gzip -f "$out/trace.txt"
    echo "worker system calls measured: $(wc -l <"$out/syscalls-worker.txt") (syscalls-worker.txt)"
    allowed=$("$real" --print-worker-syscalls 2>/dev/null | tr '\n' ' ')
    comm -23 "$out/syscalls-worker.txt" <(tr ' ' '\n' <<<"$allowed" | sort -u) >"$out/syscalls-missing.txt"
    dmesg 2>/dev/null | tail -n +"$((dmesg_before + 1))" | grep 'type=1326' >"$out/seccomp-log.txt"
    echo "outside the allow-list (trace): $(tr '\n' ' ' <"$out/syscalls-missing.txt")"
    echo "kernel seccomp log lines: $(wc -l <"$out/seccomp-log.txt")"
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^syscall=/) print $i }' "$out/seccomp-log.txt" | sort | uniq -c
fi
left=$((budget - (SECONDS - start)))
run_pass enforce $((left * 60 / 100)) --sandbox namespace
left=$((budget - (SECONDS - start)))
((left > 30)) && run_pass none "$left" --sandbox none
echo "$passed passed, $failed failed"

# shellcheck shell=bash
# qcuda-accounting.sh: sourced by the GPU checks (run-gpu-tests.sh, two-vm-test.sh,
# load-test.sh). What qcuda itself accounts per VM and per session, read from a daemon's stats
# socket (vhost-cuda --stats, Prometheus text), and its workers by the VM they serve. These hold
# on a GPU that other VMs or programs use too, unlike the device's totals (nvidia-smi
# memory.used, cuMemGetInfo), which the checks keep only as a second opinion where the GPU is
# otherwise idle (qa_gpu_others).
#
# Needs DAEMON (the vhost-cuda binary). A VM is named by its label: the path of its vhost-user
# socket as the daemon serves it (--socket-path P: P; with --socket-count N: P.0 .. P.(N-1)).

# The daemon's report, Prometheus text: $1 = its --socket-path.
qa_prom() { "$DAEMON" --stats --stats-format prometheus --socket-path "$1" 2>/dev/null; }

# One VM figure: $1 = the daemon's --socket-path, $2 = the VM's label, $3 = the metric
# (qcuda_vm_gpu_memory_bytes, qcuda_vm_sessions, qcuda_vm_kernels_total, ...). Prints "" if the
# daemon cannot be asked.
qa_vm() { qa_prom "$1" | grep -F -- "$3{vm=\"$2\"} " | awk '{ print $2 }'; }

# The VM's sessions, one line each: "session guest_pid worker_pid memory_bytes kernels".
qa_sessions() {
    local text
    text=$(qa_prom "$1") || return 0
    join <(grep -F -- "qcuda_session_gpu_memory_bytes{vm=\"$2\"," <<<"$text" |
        sed -n 's/.*,session="\([0-9]*\)",guest_pid="\([0-9]*\)",worker_pid="\([0-9]*\)"} \([0-9]*\)$/\1 \2 \3 \4/p' | sort) \
        <(grep -F -- "qcuda_session_kernels_total{vm=\"$2\"," <<<"$text" |
            sed -n 's/.*,session="\([0-9]*\)",.*} \([0-9]*\)$/\1 \2/p' | sort)
}

# Worker processes serving VM $1 (by their --vm argument).
qa_workers() {
    local n=0 p
    for p in $(pgrep -f -- '--session-worker'); do
        tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "--vm $1 " && n=$((n + 1))
    done
    echo $n
}

# Others using the GPU besides the VMs named (labels): qcuda workers of other VMs, and compute
# processes nvidia-smi lists that are not qcuda workers at all (some hosts list none). 0 means
# the GPU is otherwise idle, so its device totals may be compared.
qa_gpu_others() {
    local n=0 p cmd mine l ours=" "
    for p in $(pgrep -f -- '--session-worker'); do
        ours+="$p "
        cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
        mine=0
        for l in "$@"; do [[ $cmd == *"--vm $l "* ]] && mine=1; done
        ((mine)) || n=$((n + 1))
    done
    for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
        [[ $ours == *" $p "* ]] || n=$((n + 1))
    done
    echo $n
}

# Device memory in use over all GPUs, MiB (the second opinion).
qa_device_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{ s += $1 } END { print s + 0 }'; }

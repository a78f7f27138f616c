# shellcheck shell=bash
# gpu-host.sh: what the scripts that run on a GPU host ask of it, sourced by them from the repo
# (scripts/) or from an unpacked bundle (beside them there; scripts/bundle.sh installs it).

# Whether the host has an NVIDIA GPU (nvidia-smi lists one).
gpu_present() {
    nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# Ends the calling script with one "skipped" line (exit 0) unless the host has a GPU and
# python $1 imports PyTorch: what the PyTorch suites check before they start anything.
skip_without_gpu_torch() { # python
    if ! gpu_present; then
        echo "skipped: no GPU"
        exit 0
    fi
    if [[ -z $1 ]] || ! "$1" -c 'import torch' 2>/dev/null; then
        echo "skipped: no PyTorch in ${1:-python3}"
        exit 0
    fi
}

# The folder of the host's own CUDA runtime (NVIDIA's libcudart), for native runs; empty if the
# toolkit is not in its usual place (the loader's default path is used then).
host_cudart() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [[ -d $d ]] && { echo "$d"; return; }
    done
}

# The start of a benchmark script on a GPU host: without a GPU it says "skipped: no GPU" and
# ends the script (exit 0); else it checks that the benchmark program BENCH exists, creates the
# caller's output folder $out (made absolute), sets the caller's $cudart (host_cudart) and lists
# the GPUs. NAME prefixes the error.
bench_host_start() { # name, bench
    if ! gpu_present; then
        echo "skipped: no GPU"
        exit 0
    fi
    [[ -x $2 ]] || { echo "$1: $2 is missing (scripts/build-payload.sh builds it)" >&2; exit 1; }
    mkdir -p "$out" && out=$(cd "$out" && pwd)
    # shellcheck disable=SC2034 # the caller's variable
    cudart=$(host_cudart)
    nvidia-smi -L
}

# One section of bench.sh's phases.txt: a "== RUNTIME: WHAT" line, then the guest run's
# progress lines (from its console log LOG) that carry qcuda.ko's phases of a latency row
# (bench/module_phases.cuh), or a line saying the run printed none.
bench_phases() { # runtime what log
    echo "== $1: $2"
    tr -d '\r' <"$3" | grep -E '^qcuda_bench: .* \| qcuda\.ko: ' ||
        echo "(no latency row reported qcuda.ko's phases)"
}

# The daemon the test scripts start: $QCUDA_DAEMON if set, else the bundle's bin/vhost-cuda
# beside the script's folder HERE, else the repo's release build.
daemon_binary() { # here
    if [[ -n ${QCUDA_DAEMON:-} ]]; then
        echo "$QCUDA_DAEMON"
    elif [[ -x $1/bin/vhost-cuda ]]; then
        echo "$1/bin/vhost-cuda"
    else
        echo "$1/../target/release/vhost-cuda"
    fi
}

# Waits (10 s at most) until the daemon that logs to LOG serves SOCK: the socket exists and LOG
# has COUNT (default 1) or more "waiting for a frontend" lines. Returns 1 if it never does.
daemon_wait() { # log sock [count]
    local n
    for _ in $(seq 200); do
        n=$(grep -c 'waiting for a frontend' "$1" 2>/dev/null || true)
        ((n >= ${3:-1})) && [[ -S $2 ]] && return 0
        sleep 0.05
    done
    return 1
}

# Stops a run-vm.sh started in the background (PID): TERM first, which has it stop its QEMU
# and daemons; KILL only if it is still there after 15 s (killing run-vm.sh alone would leave
# its QEMU running).
vm_stop() { # pid
    kill -TERM "$1" 2>/dev/null || return 0
    for _ in $(seq 150); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null || true
}

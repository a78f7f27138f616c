# shellcheck shell=bash
# gpu-host.sh: what the scripts that run on a GPU host ask of it, sourced by them from the repo
# (scripts/) or from an unpacked bundle (beside them there; scripts/bundle.sh installs it).

# Whether the host has an NVIDIA GPU (nvidia-smi lists one).
gpu_present() {
    nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# The folder of the host's own CUDA runtime (NVIDIA's libcudart), for native runs; empty if the
# toolkit is not in its usual place (the loader's default path is used then).
host_cudart() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [[ -d $d ]] && { echo "$d"; return; }
    done
}

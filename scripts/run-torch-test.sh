#!/usr/bin/env bash
# run-torch-test.sh: the host's own PyTorch, natively and in the qcuda guest, on the same GPU
# (issue 18). The guest runs the host's installation itself, not a copy: run-vm.sh shares the
# host's root read-only over virtiofs and runs the check chrooted into it, with qcuda's
# libcudart.so.13 and libcuda.so.1 in front, so NVIDIA's runtime and libraries that PyTorch
# brings (cuBLAS, cuBLASLt, cuDNN, cuFFT) run over our driver, CUDA graphs captured and replayed
# (torch.cuda.graph) among them. tests/torch/torch_check.py checks
# each operation against the CPU; this script prints both results and the time ratio.
#   ./run-torch-test.sh [--check NAME[,NAME...]] [--python PATH] [--log-dir DIR] [--kernel own|stock]
#                       [--env NAME=VALUE]...
#                                                          (from the repo or the bundle)
# --check NAME runs tests/torch/NAME.py instead of torch_check.py (a comma-separated list runs
# each natively, then all of them one after another in one guest boot): ddp_check is two-process,
# two-GPU DistributedDataParallel over NCCL (it prints "SKIP ddp_check: needs 2 GPUs" on one);
# vmm_check is PyTorch's expandable segments (the driver's virtual memory management);
# train_check is a small conv net (cuDNN, cuBLAS) printing its loss per step (test-torch-pause.sh
# pauses it mid-run);
# cufft_xt_check is a two-GPU cufftXt plan (peer copies), "SKIP ...: needs 2 GPUs" on one.
# --env sets a variable for both runs (e.g. NCCL_DEBUG=INFO, QCUDA_DRIVER_TRACE=count).
# --kernel stock boots the guest on Debian's stock kernel (run-vm.sh --kernel; QCUDA_KERNEL too).
# Without a GPU it prints "skipped: no GPU" and exits 0; a check whose framework (torch, cupy,
# numba, jax) is not installed is "skipped: NAME: no MODULE".
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $here/tests/torch/torch_check.py ]]; then # the bundle
    checks=$here/tests/torch
else # the repo
    checks=$(cd "$here/.." && pwd)/tests/torch
fi
names=torch_check
python=${PYTHON:-$(command -v python3 || true)} logs=$(mktemp -d)
extra=()
while (($#)); do
    case $1 in
    --check) names=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    --kernel) export QCUDA_KERNEL=$2; shift 2 ;;
    --env) extra+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--check NAME[,NAME...]] [--python PATH] [--log-dir DIR] [--kernel own|stock] [--env NAME=VALUE]..." >&2; exit 2 ;;
    esac
done
names=${names//,/ }
for name in $names; do
    name=${name%.py}
    [[ -f $checks/$name.py ]] || { echo "run-torch-test: no such check $checks/$name.py" >&2; exit 2; }
done
mkdir -p "$logs"
# shellcheck source=scripts/gpu-host.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu-host.sh"
if ! gpu_present; then
    echo "skipped: no GPU"
    exit 0
fi
if [[ -z $python ]] || ! "$python" -c 'import sys' 2>/dev/null; then
    echo "skipped: no Python (${python:-python3})"
    exit 0
fi
# NVLink multicast stays off (the lent hosts' rule), natively and in the guest. JAX takes GPU
# memory as it needs it instead of 75% up front, so that checks and other suites share the GPU.
envs="NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false${extra[*]:+ ${extra[*]}}"

# Native first; a check this host cannot run (ddp_check on one GPU, a framework not installed)
# is skipped, and not run in the guest either.
declare -A native_rc
guest_names=() skipped=0
for name in $names; do
    name=${name%.py}
    # The frameworks a check imports at its top must be installed here (no PyTorch: skipped).
    for m in $(sed -nE 's/^(import|from) (torch|cupy|numba|jax)([ .].*)?$/\2/p' "$checks/$name.py" | sort -u); do
        if ! "$python" -c "import $m" 2>/dev/null; then
            echo "skipped: $name: no $m in $python"
            skipped=$((skipped + 1))
            continue 2
        fi
    done
    echo "== native $name ($python)"
    env $envs "$python" "$checks/$name.py" 2>&1 | tee "$logs/native-$name.log"
    native_rc[$name]=${PIPESTATUS[0]}
    if [[ ${native_rc[$name]} == 2 ]] && grep -q '^SKIP ' "$logs/native-$name.log"; then
        echo "skipped: $name: $(sed -n 's/^SKIP [^:]*: //p' "$logs/native-$name.log" | head -n 1)"
        skipped=$((skipped + 1))
        continue
    fi
    guest_names+=("$name")
done
if ((${#guest_names[@]} == 0)); then
    echo "0 passed, 0 failed, $skipped skipped"
    exit 0
fi

# The guest runs each check in this user's environment as far as CUDA goes (where the toolkit
# is, the loader's path, the frameworks' own switches), as the user's shell in a guest would
# hold it, with qcuda's libraries first on the loader's path: Numba finds libNVVM through
# CUDA_HOME or the loader's path as natively, JAX its ptxas on PATH.
genv=""
for v in $(compgen -e); do
    case $v in
    PATH | CUDA_* | NUMBA_* | XLA_* | JAX_* | CUPY_* | TORCH_* | TRITON_*) genv+="$v=$(printf %q "${!v}") " ;;
    esac
done
genv+="LD_LIBRARY_PATH=$(printf %q "/usr/lib/qcuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")"

# One guest boot runs every check, one after another, each marked in the console.
echo "== guest (the host's Python through a read-only share of /, over qcuda): ${guest_names[*]}"
adds=() gcmd=""
for name in "${guest_names[@]}"; do
    adds+=(--add "$checks/$name.py:/opt/qcuda/$name.py")
    gcmd+="echo \"=== CHECK $name\"; env $genv $envs $python /opt/qcuda/$name.py; echo \"=== EXIT $name \$?\"; "
done
"$here/run-vm.sh" --mem 16G --smp 4 --timeout 1200 --log-dir "$logs/vm" \
    --share /:/host:ro --chroot /host "${adds[@]}" -- "$gcmd" 2>&1 |
    tr -d '\r' | sed -u -E 's/\x1b\[[0-9;?]*[A-Za-z]//g' | tee "$logs/guest.log" | grep -E "^(PASS|FAIL|SKIP|TORCH|=== |qcuda)"
vm_rc=${PIPESTATUS[0]}

passed=0 failed=0
for name in "${guest_names[@]}"; do
    sed -n "/^=== CHECK $name\$/,/^=== EXIT $name /p" "$logs/guest.log" >"$logs/guest-$name.log"
    guest_rc=$(sed -n "s/^=== EXIT $name //p" "$logs/guest.log" | tail -n 1)
    for side in native guest; do
        p=$(grep -c '^PASS ' "$logs/$side-$name.log")
        f=$(grep -c '^FAIL ' "$logs/$side-$name.log")
        echo "$name $side: $p checks passed, $f failed"
        passed=$((passed + p)) failed=$((failed + f))
    done
    tn=$(sed -n 's/^TORCH total \([0-9.]*\) s/\1/p' "$logs/native-$name.log")
    tg=$(sed -n 's/^TORCH total \([0-9.]*\) s/\1/p' "$logs/guest-$name.log")
    if [[ -n $tn && -n $tg ]]; then
        awk -v c="$name" -v n="$tn" -v g="$tg" 'BEGIN { printf "time: %s native %.2f s, guest %.2f s (%.1fx; the guest CPU is emulated under TCG)\n", c, n, g, g / n }'
    fi
    [[ ${native_rc[$name]} == 0 ]] || { echo "$name: native exit ${native_rc[$name]}"; failed=$((failed + 1)); }
    [[ $guest_rc == 0 ]] || { echo "$name: guest exit ${guest_rc:-none (the guest ended first)}"; failed=$((failed + 1)); }
done
[[ $vm_rc == 0 || $failed -gt 0 ]] || { echo "guest: run-vm.sh exit $vm_rc"; failed=$((failed + 1)); }
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))

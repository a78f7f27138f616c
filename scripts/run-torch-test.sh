#!/usr/bin/env bash
# run-torch-test.sh: the host's own PyTorch, natively and in the qcuda guest, on the same GPU
# (issue 18). The guest runs the host's installation itself, not a copy: run-vm.sh shares the
# host's root read-only over virtiofs and runs the check chrooted into it, with qcuda's
# libcudart.so.13 and libcuda.so.1 in front, so NVIDIA's runtime and libraries that PyTorch
# brings (cuBLAS, cuBLASLt, cuDNN, cuFFT) run over our driver, CUDA graphs captured and replayed
# (torch.cuda.graph) among them. tests/torch/torch_check.py checks
# each operation against the CPU; this script prints both results and the time ratio.
#   ./run-torch-test.sh [--check NAME] [--python PATH] [--log-dir DIR] [--kernel own|stock]
#                       [--env NAME=VALUE]...
#                                                          (from the repo or the bundle)
# --check NAME runs tests/torch/NAME.py instead of torch_check.py: ddp_check is two-process,
# two-GPU DistributedDataParallel over NCCL (it prints "SKIP ddp_check: needs 2 GPUs" on one);
# vmm_check is PyTorch's expandable segments (the driver's virtual memory management);
# train_check is a small conv net (cuDNN, cuBLAS) printing its loss per step (test-torch-pause.sh
# pauses it mid-run);
# cufft_xt_check is a two-GPU cufftXt plan (peer copies), "SKIP ...: needs 2 GPUs" on one.
# --env sets a variable for both runs (e.g. NCCL_DEBUG=INFO, QCUDA_DRIVER_TRACE=count).
# --kernel stock boots the guest on Debian's stock kernel (run-vm.sh --kernel; QCUDA_KERNEL too).
# Without a GPU it prints "skipped: no GPU" and exits 0; without PyTorch, "skipped: no PyTorch".
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $here/tests/torch/torch_check.py ]]; then # the bundle
    checks=$here/tests/torch
else # the repo
    checks=$(cd "$here/.." && pwd)/tests/torch
fi
name=torch_check
python=${PYTHON:-$(command -v python3 || true)} logs=$(mktemp -d)
extra=()
while (($#)); do
    case $1 in
    --check) name=${2%.py}; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    --kernel) export QCUDA_KERNEL=$2; shift 2 ;;
    --env) extra+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--check NAME] [--python PATH] [--log-dir DIR] [--kernel own|stock] [--env NAME=VALUE]..." >&2; exit 2 ;;
    esac
done
check=$checks/$name.py
[[ -f $check ]] || { echo "run-torch-test: no such check $check" >&2; exit 2; }
mkdir -p "$logs"
# shellcheck source=scripts/gpu-host.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu-host.sh"
if ! gpu_present; then
    echo "skipped: no GPU"
    exit 0
fi
if [[ -z $python ]] || ! "$python" -c 'import torch' 2>/dev/null; then
    echo "skipped: no PyTorch in ${python:-python3}"
    exit 0
fi
# NVLink multicast stays off (the lent hosts' rule), natively and in the guest.
envs="NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1${extra[*]:+ ${extra[*]}}"

echo "== native ($python)"
env $envs "$python" "$check" 2>&1 | tee "$logs/native.log"
native_rc=${PIPESTATUS[0]}
# A check this host cannot run (ddp_check on one GPU) is skipped, not run in the guest either.
if [[ $native_rc == 2 ]] && grep -q '^SKIP ' "$logs/native.log"; then
    echo "skipped: $(sed -n 's/^SKIP [^:]*: //p' "$logs/native.log" | head -n 1)"
    exit 0
fi

echo "== guest (the host's PyTorch through a read-only share of /, over qcuda)"
"$here/run-vm.sh" --mem 16G --smp 4 --timeout 1200 --log-dir "$logs/vm" \
    --share /:/host:ro --chroot /host --add "$check:/opt/qcuda/$name.py" -- \
    "env $envs LD_LIBRARY_PATH=/usr/lib/qcuda $python /opt/qcuda/$name.py" 2>&1 |
    tr -d '\r' | tee "$logs/guest.log" | grep -E "^(PASS|FAIL|SKIP|TORCH|$name|qcuda)"
guest_rc=${PIPESTATUS[0]} # run-vm.sh exits with the guest command's status

passed=0 failed=0
for side in native guest; do
    p=$(grep -c '^PASS ' "$logs/$side.log")
    f=$(grep -c '^FAIL ' "$logs/$side.log")
    echo "$side: $p checks passed, $f failed"
    passed=$((passed + p)) failed=$((failed + f))
done
tn=$(sed -n 's/^TORCH total \([0-9.]*\) s/\1/p' "$logs/native.log")
tg=$(sed -n 's/^TORCH total \([0-9.]*\) s/\1/p' "$logs/guest.log")
if [[ -n $tn && -n $tg ]]; then
    awk -v n="$tn" -v g="$tg" 'BEGIN { printf "time: native %.2f s, guest %.2f s (%.1fx; the guest CPU is emulated under TCG)\n", n, g, g / n }'
fi
[[ $native_rc == 0 ]] || failed=$((failed + 1))
[[ $guest_rc == 0 ]] || failed=$((failed + 1))
echo "$passed passed, $failed failed"
((failed == 0))

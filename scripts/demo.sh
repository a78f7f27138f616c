#!/usr/bin/env bash
# demo.sh: README's first command. Sets everything up on a fresh Debian 12 machine (system
# packages, patched QEMU, guest kernel + qcuda.ko, vhost-cuda, guest-lib and the CUDA programs;
# heavy builds are cached in ~/.cache/qcuda), then boots a guest and runs an unmodified CUDA
# program in it, computing on this host's GPU through qcuda.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
say() { printf '\n[demo] %s\n' "$*"; }
say "setting up (first run builds QEMU and a guest kernel: ~20 min on 2 cores; later runs: seconds)"
scripts/setup.sh
# setup.sh may have installed Rust into ~/.cargo (a machine without cargo).
export PATH="$HOME/.cargo/bin:$PATH"
scripts/build-qemu.sh
scripts/build-guest.sh
cargo build --release --locked -p vhost-cuda
scripts/build-payload.sh >/dev/null
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    say "host GPU: $(nvidia-smi -L | head -n1)"
else
    say "this host has no GPU: the guest will show that the host offers none, and the CUDA program will say 'no CUDA device'"
fi
say "booting the guest; inside it: insmod qcuda.ko, qcuda-smi, then tests/cuda/vector_add with our libcudart.so.13"
rc=0
scripts/run-vm.sh -- 'insmod /lib/modules/qcuda.ko && qcuda-smi && echo && LD_TRACE_LOADED_OBJECTS=1 /opt/qcuda/tests/vector_add | grep cudart && /opt/qcuda/tests/vector_add' || rc=$?
case $rc in
0) say "done: the CUDA program in the guest computed on the host GPU" ;;
2) say "done: the whole stack ran, and the guest program reported cleanly that the host has no GPU"; rc=0 ;;
*) say "the demo failed (exit $rc)" ;;
esac
exit $rc

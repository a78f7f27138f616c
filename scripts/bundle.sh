#!/usr/bin/env bash
# bundle.sh: packs a relocatable release tarball, dist/qcuda-bundle.tar.xz, unpacking to qcuda/
# (`tar xf`; xz with a 64 MiB window, which stores the benchmark's incompressible 14 MiB helper
# once though the guest payload has it too: 43 MiB with the stock kernel, where gzip took 51
# without it):
#
#   run-vm.sh                 the same runner as scripts/run-vm.sh (it detects this layout)
#   gpu-check.sh              every GPU suite below side by side, one table, one log archive
#                             ("does qcuda work on this GPU host?"; --quick: under 5 minutes)
#   run-gpu-tests.sh          runs the CUDA tests natively and inside the guest, on a GPU host
#   sandbox-gpu-check.sh      measures the workers' system calls under the real driver, and runs
#                             the CUDA tests with the sandbox on and off (docs/SECURITY.md)
#   bench.sh                  runs the benchmark natively, at native CPU speed through qcuda
#                             (bench-frontend.sh) and inside the guest; prints one table
#   bench-frontend.sh         vhost-cuda-frontend-bench against a vhost-cuda of its own
#   bench-scale.sh            many busy processes at once, natively and in 1 or 4 guests: the
#                             aggregate launch rate and copy bandwidth, guest against native
#   test-restart.sh           kills and restarts the daemon under a running guest (recovery)
#   test-restart-gpu.sh       kills the daemon (SIGKILL) mid-loop under a guest program, with
#                             fd-store.py playing systemd's store: the same result as uninterrupted
#   test-migration.sh         live-migrates a VM running a CUDA program to a second QEMU and
#                             daemon (--target-gpu 1: onto the other GPU); the checksums agree
#                             (--program torch: a PyTorch loss curve, equal bit for bit)
#   test-checkpoint.sh        the operator pauses and resumes a guest program mid-loop; its
#                             checksum must equal an uninterrupted run's (pause/resume rates)
#   test-cuda-checkpoint.sh   cuda-checkpoint --toggle (or cuCheckpointProcess* from our tool) on a
#                             running program, natively and in the guest; checksums equal
#   test-trace.sh             a PyTorch training loop's GPU timeline recorded on the host
#                             (qcuda-smi trace): trace JSON, kernels within 10% of native's,
#                             the VM's busy fraction in --stats
#   test-torch-pause.sh       PyTorch training in the guest paused and resumed by the operator
#                             mid-run: the same loss curve step for step
#   load-test.sh              1000 guest CUDA programs killed at random points; 32x8 load test
#   two-vm-test.sh            two VMs on the GPU at once: per-VM views, the kill check beside a
#                             busy VM (run-gpu-tests.sh runs it too)
#   qcuda-accounting.sh       qcuda's per-VM accounting for those checks (sourced by them)
#   run-torch-test.sh         the host's PyTorch natively and in the guest (tests/torch), compared
#   bin/vhost-cuda            the host daemon
#   bin/vhost-cuda-frontend-bench   plays a VM (QEMU and qcuda.ko) from a host process:
#                             qcuda's own cost at native CPU speed (docs/perf/frontend.md)
#   bin/busybox               static busybox (cpio for run-vm.sh where the host has none)
#   bin/virtiofsd             rust-vmm's virtiofsd for run-vm.sh --share (libseccomp and
#                             libcap-ng linked in statically: it needs only glibc and libgcc_s)
#   qemu/bin, qemu/lib, qemu/share/qemu   patched QEMU, its non-glibc libraries, firmware
#   guest/                    bzImage, base initramfs (with qcuda.ko), payload (guest-lib, tests),
#                             installed.cpio.gz (the installed guest: run-vm.sh --payload it)
#   guest/stock/              Debian's stock kernel (vmlinuz, ~14 MiB), its modules the guest
#                             needs with qcuda.ko built against its headers (modules.cpio.gz),
#                             versions.txt: run-vm.sh --kernel stock, run-gpu-tests.sh and
#                             run-torch-test.sh --kernel stock (scripts/build-stock-guest.sh;
#                             left out, with a line saying so, when not built)
#   native-tests/             the CUDA test programs, for native runs against the host's CUDA
#   native-libraries/         the programs over cuSPARSE and cuBLAS (run-gpu-tests.sh --libraries)
#   host-tools/               gpu_meminfo (device memory in use, for the kill and load checks)
#   bench/                    the benchmark qcuda_bench and its start-up helpers, for the native
#                             run (the guest has its own copy)
#   deploy/                   the systemd units and the libvirt domain (docs/operators.md); the
#                             domain's paths are this layout unpacked in /opt (/opt/qcuda)
#
# It runs on any x86-64 Linux with glibc >= 2.34 and nothing else installed. Build everything
# first (scripts/test.sh does; scripts/demo.sh builds all but virtiofsd, which
# scripts/build-virtiofsd.sh builds); this script only packs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
say() { printf '[bundle] %s\n' "$*" >&2; }
for f in build/qemu/bin/qemu-system-x86_64:build-qemu.sh build/guest/bzImage:build-guest.sh \
    build/guest/initramfs.cpio.gz:build-guest.sh build/guest/payload.cpio.gz:build-payload.sh \
    target/release/vhost-cuda:demo.sh target/release/vhost-cuda-frontend-bench:demo.sh build/virtiofsd/bin/virtiofsd:build-virtiofsd.sh; do
    [[ -e ${f%%:*} ]] || { say "missing ${f%%:*}: build it first (scripts/${f#*:})"; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
B=$stage/qcuda
mkdir -p "$B/bin" "$B/qemu/bin" "$B/qemu/lib" "$B/qemu/share" "$B/guest" "$B/native-tests" "$B/bench" "$B/host-tools"
install -m 755 scripts/run-vm.sh "$B/run-vm.sh"
install -m 755 scripts/gpu-check.sh "$B/gpu-check.sh"
install -m 755 scripts/run-gpu-tests.sh "$B/run-gpu-tests.sh"
install -m 755 scripts/sandbox-gpu-check.sh "$B/sandbox-gpu-check.sh"
install -m 755 scripts/bench.sh "$B/bench.sh"
install -m 755 scripts/bench-scale.sh "$B/bench-scale.sh"
install -m 755 scripts/bench-frontend.sh "$B/bench-frontend.sh"
install -m 755 scripts/test-restart.sh "$B/test-restart.sh"
install -m 755 scripts/test-checkpoint.sh "$B/test-checkpoint.sh"
install -m 755 scripts/test-cuda-checkpoint.sh "$B/test-cuda-checkpoint.sh"
install -m 755 scripts/test-torch-pause.sh "$B/test-torch-pause.sh"
install -m 755 scripts/test-trace.sh "$B/test-trace.sh"
install -D -m 755 tests/guest/check-cuda-checkpoint "$B/tests/guest/check-cuda-checkpoint"
install -m 755 scripts/test-restart-gpu.sh "$B/test-restart-gpu.sh"
install -m 755 scripts/fd-store.py "$B/fd-store.py"
install -m 755 scripts/test-migration.sh "$B/test-migration.sh"
install -m 755 scripts/load-test.sh "$B/load-test.sh"
install -m 755 scripts/two-vm-test.sh "$B/two-vm-test.sh"
install -m 644 scripts/qcuda-accounting.sh "$B/qcuda-accounting.sh"
install -m 644 scripts/gpu-host.sh "$B/gpu-host.sh"
install -m 644 scripts/thread-cpu.sh "$B/thread-cpu.sh"
install -m 755 scripts/guest-observe.sh "$B/guest-observe.sh"
install -m 755 scripts/run-torch-test.sh "$B/run-torch-test.sh"
install -D -m 644 tests/torch/torch_check.py "$B/tests/torch/torch_check.py"
install -D -m 644 tests/torch/ddp_check.py "$B/tests/torch/ddp_check.py"
install -D -m 644 tests/torch/vmm_check.py "$B/tests/torch/vmm_check.py"
install -D -m 644 tests/torch/cufft_xt_check.py "$B/tests/torch/cufft_xt_check.py"
install -D -m 644 tests/torch/train_check.py "$B/tests/torch/train_check.py"
install -D -m 644 tests/torch/trace_check.py "$B/tests/torch/trace_check.py"
install -D -m 644 tests/torch/trace_json_check.py "$B/tests/torch/trace_json_check.py"
for f in tests/torch/*_check.py; do install -D -m 644 "$f" "$B/$f"; done
install -m 755 target/release/vhost-cuda "$B/bin/"
strip "$B/bin/vhost-cuda"
install -m 755 target/release/vhost-cuda-frontend-bench "$B/bin/"
strip "$B/bin/vhost-cuda-frontend-bench"
# The GPU host may lack libseccomp and libcap-ng: build-virtiofsd.sh links them in; check it did.
if readelf -d build/virtiofsd/bin/virtiofsd | grep -Eq 'NEEDED.*(libseccomp|libcap-ng)'; then
    say "build/virtiofsd/bin/virtiofsd links libseccomp or libcap-ng dynamically (rerun scripts/build-virtiofsd.sh)"
    exit 1
fi
install -m 755 build/virtiofsd/bin/virtiofsd "$B/bin/virtiofsd"
strip "$B/bin/virtiofsd"
# run-vm.sh packs small initramfs archives; a bare GPU host may have no cpio.
install -m 755 "$(command -v busybox)" "$B/bin/busybox"
qemu=$(readlink -f build/qemu/bin/qemu-system-x86_64)
install -m 755 "$qemu" "$B/qemu/bin/qemu-system-x86_64"
# Every shared library but glibc's own travels with QEMU.
ldd "$qemu" | awk '/=> \// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libresolv.so*) ;;
    *) cp -L "$lib" "$B/qemu/lib/" ;;
    esac
done
cp -rL "$(readlink -f build/qemu/share/qemu)" "$B/qemu/share/qemu"
cp build/guest/bzImage build/guest/initramfs.cpio.gz build/guest/payload.cpio.gz "$B/guest/"
[[ -f build/guest/installed.cpio.gz ]] && cp build/guest/installed.cpio.gz "$B/guest/"
if [[ -f build/stock/vmlinuz && -f build/stock/modules.cpio.gz ]]; then
    mkdir -p "$B/guest/stock"
    cp build/stock/vmlinuz build/stock/modules.cpio.gz build/stock/versions.txt "$B/guest/stock/"
else
    say "no build/stock (scripts/build-stock-guest.sh): the bundle has no stock kernel"
fi
[[ -d build/cuda-tests ]] && find build/cuda-tests -maxdepth 1 -type f -perm -u+x -exec cp {} "$B/native-tests/" \;
[[ -d build/cuda-runtimes ]] && cp -r build/cuda-runtimes "$B/cuda-runtimes"
if [[ -d build/cuda-libraries ]]; then
    mkdir -p "$B/native-libraries"
    find build/cuda-libraries -maxdepth 1 -type f -perm -u+x -exec cp {} "$B/native-libraries/" \;
fi
[[ -d build/host-tools ]] && find build/host-tools -maxdepth 1 -type f -perm -u+x -exec cp {} "$B/host-tools/" \;
[[ -d build/bench ]] && find build/bench -maxdepth 1 -type f -perm -u+x -exec cp {} "$B/bench/" \;
cp -r deploy "$B/deploy"
git rev-parse --short HEAD >"$B/VERSION" 2>/dev/null || echo unknown >"$B/VERSION"
mkdir -p dist
rm -f dist/qcuda-bundle.tar.gz dist/qcuda-stock.tar.gz # the gzip bundles of earlier versions
tar -C "$stage" --sort=name -cf - qcuda | xz -T1 -9 >dist/qcuda-bundle.tar.xz.tmp
mv dist/qcuda-bundle.tar.xz.tmp dist/qcuda-bundle.tar.xz
size=$(stat -c %s dist/qcuda-bundle.tar.xz)
say "dist/qcuda-bundle.tar.xz: $((size / 1024 / 1024)) MiB"
((size < 60 * 1024 * 1024)) || { say "bundle is over 60 MiB"; exit 1; }
echo "$ROOT/dist/qcuda-bundle.tar.xz"

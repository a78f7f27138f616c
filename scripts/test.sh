#!/usr/bin/env bash
# test.sh: the qcuda test suite. README's test command; .ci/run calls exactly this.
#
# 1. setup and static checks: cargo fmt, clippy -D warnings, cargo test (unit, fuzz, protocol),
#    a short seeded run of the cargo-fuzz targets (scripts/fuzz.sh);
#    rustfmt and clippy over qcuda.ko once its kernel tree is built (scripts/check-kmod.sh)
# 2. builds: patched QEMU, guest kernel + qcuda.ko + initramfs, vhost-cuda, virtiofsd, guest
#    payload (heavy builds are cached under ~/.cache/qcuda by a hash of their inputs); the
#    frontend benchmark (qcuda at native CPU speed) against a daemon of its own
# 3. the real stack: QEMU lists the device; a TCG guest sees it, loads qcuda.ko, runs the
#    transport self-test, the concurrency and kill tests, every CUDA test program and the
#    benchmark (qcuda_bench --quick at 4 KiB) against our libcudart.so.13 (on a host without a
#    GPU they must report "no device" cleanly); host directories shared over virtiofs (read-only,
#    writable, and a chroot into the host's root); two VMs on one daemon, each qcuda-smi listing
#    only its own processes and the host's stats the same per VM
# 4. the daemon's bad-input handling, a daemon restart under a running guest, live migration
#    (and the pre-copy of device memory through QEMU over the fake driver, in a daemon built
#    with that test double, which the shipped binary must lack), 1000 guest CUDA programs
#    killed at random points (GPU only), and the relocatable bundle booting from a fresh folder
# 5. operators: the systemd units pass `systemd-analyze verify` and the libvirt domain XML
#    `virt-xml-validate` (with the static checks); a guest served by a daemon that systemd's
#    socket activation started; libvirt boots the domain with our device and a CUDA program
#    in it runs (without a GPU: reports cudaErrorNoDevice cleanly); the installed guest
#    (scripts/install-guest.sh): its DKMS configuration builds qcuda.ko, and under run-vm.sh
#    and libvirt it loads qcuda.ko at boot and runs a CUDA program without LD_LIBRARY_PATH;
#    the by-hand blocks of README.md and docs/running.md run as printed
# 6. stock kernels (docs/guest-install.md): Debian's trixie-backports kernel with qcuda.ko built
#    against its headers (vermagic equal to the distribution's), booted with our initramfs
#    (transport tests, the no-GPU CUDA result, the chroot into the host's root); the
#    qcuda-guest package's dpkg -i / -r / a new kernel's headers (DKMS); a Debian disk image
#    built by running docs/guest-install.md's walkthrough as printed, booted from its own disk
#    under run-vm.sh and libvirt: qcuda.ko built by DKMS and loaded at boot, a CUDA program
#    without LD_LIBRARY_PATH. QCUDA_TEST_STOCK=0 leaves them out (a skip line says so)
#
# Ends with "N passed, N failed, N skipped"; exits non-zero if anything failed.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TERM_COLOR=never
LOGS=$ROOT/build/test-logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
passed=0 failed=0 skipped=0 failures=()

ok() { printf 'ok      %s\n' "$1"; passed=$((passed + 1)); }
bad() { printf 'FAILED  %s\n' "$1"; failed=$((failed + 1)); failures+=("$1"); }
skip() { printf 'skipped: %s\n' "$1"; skipped=$((skipped + 1)); }
# step NAME CMD...: runs CMD with its output in a log; shows the log's tail on failure.
step() {
    local name=$1 log
    shift
    log=$LOGS/$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-60).log
    local t0=$SECONDS
    if "$@" >"$log" 2>&1; then
        ok "$name ($((SECONDS - t0))s)"
        return 0
    fi
    bad "$name ($((SECONDS - t0))s, log: ${log#"$ROOT"/})"
    # A failing Rust test or a panic can sit far above the tail: name it first.
    grep -E '^test .* FAILED$|panicked at|^---- .* stdout ----$|^error(\[|:)' "$log" | head -n 20 | sed 's/^/    ! /'
    tail -n 40 "$log" | sed 's/^/    | /'
    return 1
}
# Free disk and what the builds hold: a full disk fails builds far from their cause.
disk_report() {
    local c=${QCUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qcuda}
    printf '   disk: %s free; cache %s, target %s, fuzz %s, build %s\n' \
        "$(df -h --output=avail "$ROOT" | tail -n 1 | tr -d ' ')" \
        "$(du -sh "$c" 2>/dev/null | cut -f1)" "$(du -sh target 2>/dev/null | cut -f1)" \
        "$(du -sh fuzz/target 2>/dev/null | cut -f1)" "$(du -sh build 2>/dev/null | cut -f1)"
}
finish() {
    echo
    disk_report
    ((failed == 0)) || printf 'failed: %s\n' "${failures[@]}"
    echo "$passed passed, $failed failed, $skipped skipped"
    ((failed == 0))
    exit $?
}

have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

echo "== setup and static checks"
disk_report
step "setup: system packages" scripts/setup.sh || finish
# setup.sh may have installed Rust into ~/.cargo (a machine without cargo).
export PATH="$HOME/.cargo/bin:$PATH"
step "cargo fmt --check" cargo fmt --all -- --check
step "libcuda.so.1: stubs, symbol table and version map match the code (gen/driver-symbols.py)" \
    python3 guest-lib/gen/driver-symbols.py --check
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo test (unit, fuzz, vhost-user protocol)" cargo test --workspace --locked --no-fail-fast
step "cuBLAS and cuBLASLt over our libraries on the device double: every call and the driver calls beneath succeed" \
    scripts/check-libraries-double.sh
awk '/^test result:/ { p += $4; f += $6 } END { printf "   cargo test: %d passed, %d failed\n", p, f }' "$LOGS"/cargo_test*.log
# Coverage-guided fuzzing, short and seeded (scripts/fuzz.sh runs the long ones).
step "fuzz: every cargo-fuzz target, seeded, 7 s each" scripts/fuzz.sh --runs 2000000 --time 7 --seed 1 --scratch &&
    sed 's/^/   /' "$LOGS"/fuzz_*.log | grep '^   fuzz '
# The targets' own entry points (vhost-cuda's feature `fuzzing`) over their seeds and every
# flipped byte of them, as unit tests; the plain `cargo test` above builds without the feature.
# A filter that matches nothing passes: the step wants every seed test to have run.
fuzz_seeds() {
    local out
    out=$(cargo test --release --locked -p vhost-cuda --features fuzzing --lib fuzz_seed 2>&1)
    local rc=$?
    echo "$out"
    ((rc == 0)) || return "$rc"
    echo "$out" | grep -qE '^test result: ok\. ([3-9]|[1-9][0-9]+) passed' ||
        { echo "fewer than 3 fuzz-seed tests ran" >&2; return 1; }
}
step "fuzz targets' seeds and their mutations as unit tests (feature fuzzing)" fuzz_seeds
step "systemd units pass systemd-analyze verify (deploy/systemd)" scripts/check-systemd-units.sh
step "libvirt domain XML passes virt-xml-validate (deploy/libvirt)" virt-xml-validate deploy/libvirt/qcuda-vm.xml domain
step "docs: README and docs/ speak of the product (no words about how it was built)" scripts/check-doc-words.sh
# The same check must fail when a phrase comes back: a copy of the docs with one appended.
doc_words_fail() {
    local d rc
    d=$(mktemp -d)
    cp README.md "$d"/ && cp -r docs "$d"/
    echo 'Measured in this session.' >>"$d"/docs/running.md
    scripts/check-doc-words.sh "$d"
    rc=$?
    rm -rf "$d"
    ((rc == 1))
}
step "docs: the word check fails on a phrase put back" doc_words_fail
step "host commands: every command the scripts run has an install step (scripts/host-commands.txt)" \
    scripts/check-host-commands.py
# The same check must fail when an install step loses a package the scripts need: a copy of the
# scripts whose setup.sh no longer installs mmdebstrap, and one whose script runs a command
# nothing installs.
host_commands_fail() {
    local d rc1 rc2
    d=$(mktemp -d)
    cp -r scripts guest-lib guest-kmod .ci "$d"/ 2>/dev/null
    sed -i '/^need=(/,/)/s/ mmdebstrap\b//' "$d"/scripts/setup.sh
    ! grep -v '^#' "$d"/scripts/setup.sh | grep -qw mmdebstrap || { rm -rf "$d"; return 1; }
    scripts/check-host-commands.py "$d"
    rc1=$?
    cp scripts/setup.sh "$d"/scripts/setup.sh
    echo 'sponge </dev/null >/dev/null' >>"$d"/scripts/bench.sh
    scripts/check-host-commands.py "$d"
    rc2=$?
    rm -rf "$d"
    ((rc1 == 1 && rc2 == 1))
}
step "host commands: the check fails without mmdebstrap in setup.sh, and on a command nothing installs" host_commands_fail
step "gpu-check.sh's scheduler, table, verdicts and archive (test-double lanes and nvidia-smi)" tests/host/check-gpu-check
step "qcuda_bench's qcuda.ko phases from fdinfo, and bench.sh's phases.txt section (samples)" tests/host/check-bench-phases
step "gpu-check.sh without a GPU: one \"skipped: no GPU\" line per lane, exit 0" sh -c \
    'out=$(scripts/gpu-check.sh) && echo "$out" && n=$(echo "$out" | grep -c "skipped: no GPU") && test "$n" -eq "$(scripts/gpu-check.sh --list | tail -n +2 | wc -l)" && test "$n" -gt 5'
gpu_tests() { cargo test --workspace --locked -q --test cuda_gpu --test worker_gpu -- --nocapture; }
if step "vhost-cuda GPU tests (executor, worker isolation)" gpu_tests; then
    if grep -q 'skipped: no GPU' "$LOGS"/vhost-cuda_GPU*.log; then
        passed=$((passed - 1))
        skip "vhost-cuda GPU tests: no GPU on this host"
    fi
fi

echo "== builds"
t_build=$SECONDS
step "build patched QEMU" scripts/build-qemu.sh || finish
step "build guest kernel, qcuda.ko, initramfs" scripts/build-guest.sh || finish
step "qcuda.ko: rustfmt and clippy (CLIPPY=1, warnings fail)" scripts/check-kmod.sh
step "build vhost-cuda (release)" cargo build --release --locked -p vhost-cuda || finish
# qcuda at native CPU speed: vhost-cuda-frontend-bench plays a VM against a daemon of its own
# (docs/perf/frontend.md). It fails if the benchmark crashes or fails, or its Hello and Echo rows
# are missing; without a GPU the GPU rows are left out with one "skipped: no GPU" line.
frontend_bench() {
    local o=$LOGS/frontend-bench
    scripts/bench-frontend.sh --out "$o" --quick --max-bytes 64M --vms 2 --sessions 2 --seconds 0.5 || return 1
    have_gpu || [ "$(grep -c '^skipped: no GPU' "$o/frontend.out")" = 1 ]
}
if step "frontend benchmark: Hello/Echo at native CPU speed through the daemon (vhost-cuda-frontend-bench)" frontend_bench; then
    sed -n 's/^\(hello_us\|echo_us\),\([0-9]*\),\([0-9.]*\),us$/   \1 (\2 B): \3 us/p' "$LOGS/frontend-bench/frontend.csv"
    have_gpu || skip "frontend benchmark GPU rows: no GPU"
fi
step "build virtiofsd (for run-vm.sh --share; cached)" scripts/build-virtiofsd.sh || finish
step "build guest payload (guest-lib, qcuda-smi, CUDA tests)" scripts/build-payload.sh || finish
step "libcudart.so.13 exports match the version map" guest-lib/check-symbols.sh
echo "   builds took $((SECONDS - t_build))s"

echo "== the real stack"
QEMU=build/qemu/bin/qemu-system-x86_64
step "qemu -device help lists vhost-user-cuda-pci" sh -c "$QEMU -device help | grep -q '\"vhost-user-cuda-pci\"'"

# One guest boot per suite; CHECK lines from inside the guest become results here.
guest_suite() { # name, guest command, run-vm.sh options... ($GUEST_WRAP: a command run-vm.sh runs under)
    local name=$1 cmd=$2 dir=$LOGS/vm-$1 rc=0 pre=guest
    shift 2
    [[ $name != stock-* ]] || pre="guest (stock kernel)"
    mkdir -p "$dir"
    local t0=$SECONDS
    # shellcheck disable=SC2086 # GUEST_WRAP is a command line
    ${GUEST_WRAP:-} scripts/run-vm.sh --log-dir "$dir" --timeout 1200 "$@" -- "$cmd" >"$dir/console.log" 2>&1 || rc=$?
    echo "   guest '$name' ran in $((SECONDS - t0))s (exit $rc)"
    local line
    while IFS= read -r line; do
        case $line in
        "CHECK ok "*) ok "$pre: ${line#CHECK ok }" ;;
        "CHECK SKIP "*) skip "$pre: ${line#CHECK SKIP }" ;;
        "CHECK FAIL "*) bad "$pre: ${line#CHECK FAIL }" ;;
        esac
    done <"$dir/console.log"
    grep -q '^CHECK ' "$dir/console.log" || { bad "guest '$name' produced no checks"; tail -n 30 "$dir/console.log" | sed 's/^/    | /'; }
    grep -A40 '^CHECK FAIL' "$dir/console.log" | sed 's/^/    | /' | head -n 80
    return $rc
}
daemon_logged() { grep -q "$2" "$LOGS/vm-$1/daemon.log"; }
# Only this checkout's: a process whose binary or working directory lies in it (another
# checkout's tests may run beside these on the same machine).
no_leftovers() {
    local pid exe cwd left=0
    for pid in $(pgrep -f -- "qcuda-vm\.[A-Za-z0-9]{6}/|--session-worker"); do
        exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
        cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) || continue
        [[ $exe == "$ROOT"/* || $cwd == "$ROOT" || $cwd == "$ROOT"/* ]] || continue
        ps -o pid=,args= -p "$pid"
        left=1
    done
    ((left == 0))
}

t_vm=$SECONDS
guest_suite transport /opt/qcuda/bin/check-transport
step "daemon log: negotiated features" daemon_logged transport 'acked features'
step "daemon log: SET_MEM_TABLE" daemon_logged transport 'SET_MEM_TABLE'
step "daemon log: every session closed" sh -c "grep 'sessions open:' '$LOGS/vm-transport/daemon.log' | tail -n 1 | grep -q 'sessions open: 0'"

# The guest kernel brings up every vCPU run-vm.sh asks for (tinyconfig's NR_CPUS=2 once left
# the others idle, which halved every multi-process figure).
step "guest: run-vm.sh --smp 4 gives the guest 4 CPUs" sh -c \
    'scripts/run-vm.sh --no-device --smp 4 --log-dir "$1" --timeout 300 -- "echo CPUS=\$(grep -c ^processor /proc/cpuinfo)" 2>&1 |
        tr -d "\r" | tee "$1/console.log" | grep -qx "CPUS=4"' _ "$LOGS/vm-smp"

# No GPU: every program must load our library, see cudaErrorNoDevice with count 0, and say so.
cuda_nogpu() { # name (log folder vm-NAME, prefix of the results), run-vm.sh options...
    local name=$1 d=$LOGS/vm-$1 pre
    shift
    [[ $name == cuda ]] && pre="guest" || pre="guest ($name)"
    mkdir -p "$d"
    scripts/run-vm.sh --log-dir "$d" --timeout 900 "$@" -- /opt/qcuda/bin/check-cuda >"$d/console.log" 2>&1
    # One SKIP per program; the kill check behind a host function needs the GPU too and is
    # covered by the skip line below.
    local n nodev total nvrt line
    n=$(grep '^CHECK SKIP cuda/' "$d/console.log" | grep -vc 'behind a host function')
    nodev=$(grep -cE '^SKIP .*no CUDA device \((cudaErrorNoDevice|CUDA_ERROR_NO_DEVICE)\)' "$d/console.log")
    total=$(find build/cuda-tests -maxdepth 1 -type f -perm -u+x | wc -l)
    while IFS= read -r line; do
        case $line in
        "CHECK ok cuda/host-mapped"*) ok "$pre: ${line#CHECK ok }" ;;
        # NVIDIA's libcudart.so.13 over our libcuda.so.1: it must start and see no device.
        "CHECK SKIP nvidia-cudart/"*) ok "$pre: ${line#CHECK SKIP } with NVIDIA's libcudart.so.13: reports no device" ;;
        "CHECK FAIL "*) bad "$pre: ${line#CHECK FAIL }" ;;
        esac
    done <"$d/console.log"
    # NVIDIA's libcudart.so.13 runs some of the same programs again (each its own SKIP line).
    nvrt=$(grep -c '^CHECK SKIP nvidia-cudart/' "$d/console.log")
    if ((total > 0 && n == total && nodev == total + nvrt)); then
        ok "$pre: all $total CUDA programs (runtime, driver API, --cudart=static, CUDA 12) load and report no device"
    else
        bad "$pre: CUDA programs without a GPU ($n of $total skipped, $nodev said cudaErrorNoDevice)"
        grep -E '^(---|CHECK|SKIP|FAIL|PASS)' "$d/console.log" | sed 's/^/    | /' | head -n 40
    fi
}
if have_gpu; then
    guest_suite cuda /opt/qcuda/bin/check-cuda
else
    cuda_nogpu cuda
    skip "CUDA programs computing on the GPU: no GPU (run scripts/bundle.sh and run-gpu-tests.sh on a GPU host)"
fi
# The benchmark at its smallest sizes (issue 10): without a GPU it must load, reach the host and
# skip cleanly (exit 2, "no CUDA device"); a crash, a FAIL or a hang fails.
guest_suite bench "EXPECT_GPU=$(have_gpu && echo 1 || echo 0) /opt/qcuda/bin/check-bench"
# bench-scale.sh (issue 19: many processes, several VMs) must at least parse its options and
# find its way here; on a GPU host it takes minutes and runs from the bundle (docs/perf/README.md).
if have_gpu; then
    skip "bench-scale.sh: a GPU host runs it from the bundle (docs/perf/README.md)"
else
    step "bench-scale.sh without a GPU says \"skipped: no GPU\"" sh -c \
        'out=$(scripts/bench-scale.sh --seconds 1 --out "$1"); rc=$?; echo "$out"; [ $rc = 0 ] && [ "$out" = "skipped: no GPU" ]' \
        _ "$LOGS/bench-scale"
fi
# Host directories shared into the guest over virtiofs (run-vm.sh --share, one virtiofsd each):
# a read-only and a writable share in a guest without the device, then a guest chrooted into a
# read-only share of this host's root (--chroot), with the device.
shares() {
    local d=$LOGS/shares token
    token=qcuda-$RANDOM$RANDOM
    rm -rf "$d" && mkdir -p "$d/ro/sub" "$d/rw" || return 1
    echo "$token" >"$d/ro/hello.txt"
    echo file >"$d/ro/sub/file"
    head -c 4M /dev/urandom >"$d/ro/big.bin"
    guest_suite share-files "TOKEN=$token BIG_SUM=$(sha256sum "$d/ro/big.bin" | cut -d' ' -f1) /opt/qcuda/bin/check-share files" \
        --no-device --share "$d/ro:/mnt/share:ro" --share "$d/rw:/mnt/rw"
    step "share: the guest's file reached the host through the writable share" \
        grep -qx "guest-$token" "$d/rw/dir/from-guest.txt"
    step "share: the read-only share is unchanged on the host" \
        sh -c "[ \"\$(ls -A '$d/ro' | tr '\n' ' ')\" = 'big.bin hello.txt sub ' ]"
    rm -f /etc/qcuda-chroot-probe
    # With a test double of NVIDIA's driver on this host's library path, which only the guest's
    # share sees (tests/host/driver-double: a mount namespace of its own); the daemon, started
    # outside it, keeps this host's real driver, or none.
    local sock=$d/vhost-cuda.sock dpid
    target/release/vhost-cuda --socket-path "$sock" >"$d/daemon.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
    GUEST_WRAP=tests/host/driver-double/run guest_suite share-chroot "FOREIGN_DRIVER=1 EXPECT_GPU=$(have_gpu && echo 1 || echo 0) HOST_OS='$(. /etc/os-release && echo "$PRETTY_NAME")' /opt/qcuda/bin/check-share chroot" \
        --socket "$sock" --share /:/mnt/host:ro --chroot /mnt/host
    kill "$dpid"
    wait "$dpid" 2>/dev/null
    step "share: the chroot's writes stayed in the guest" test ! -e /etc/qcuda-chroot-probe
    step "share: the driver double stayed in its namespace (this host's loader does not see it)" \
        sh -c '! ldconfig -p | grep -q "libcuda.so.999.99" && [ ! -e /usr/lib/x86_64-linux-gnu/libcuda.so.999.99 ]'
    rm -rf "$d"
}
shares
echo "   VM part took $((SECONDS - t_vm))s"
step "no qemu, vhost-cuda or session worker process left behind" no_leftovers

echo "== bad input"
step "daemon: missing socket directory is a clear error" sh -c \
    'out=$(target/release/vhost-cuda --socket-path /nonexistent/dir/s.sock 2>&1); rc=$?; echo "$out"; [ $rc -ne 0 ] && echo "$out" | grep -qi "directory"'
in_use() {
    local d
    d=$(mktemp -d)
    target/release/vhost-cuda --socket-path "$d/s.sock" >"$d/a.log" 2>&1 &
    local pid=$!
    for _ in $(seq 50); do [ -S "$d/s.sock" ] && break; sleep 0.1; done
    local rc=0
    timeout 10 target/release/vhost-cuda --socket-path "$d/s.sock" >"$d/b.log" 2>&1 || rc=$?
    kill "$pid"
    wait "$pid" 2>/dev/null
    cat "$d/b.log"
    rm -rf "$d"
    [ $rc -ne 0 ] && [ $rc -ne 124 ]
}
step "daemon: socket path already in use is a clear error" in_use
qemu_dies() {
    # A QEMU killed right after connecting, then a whole guest run on the same daemon.
    local d rc=0
    d=$(mktemp -d)
    RUST_LOG=info target/release/vhost-cuda --socket-path "$d/s.sock" >"$d/daemon.log" 2>&1 &
    local pid=$!
    for _ in $(seq 50); do [ -S "$d/s.sock" ] && break; sleep 0.1; done
    build/qemu/bin/qemu-system-x86_64 -L build/qemu/share/qemu -M pc -m 256M -nic none -display none \
        -object memory-backend-memfd,id=mem,size=256M,share=on -numa node,memdev=mem \
        -chardev socket,id=c,path="$d/s.sock" -device vhost-user-cuda-pci,chardev=c >/dev/null 2>&1 &
    local q=$!
    sleep 0.3
    kill -KILL $q
    wait $q 2>/dev/null
    scripts/run-vm.sh --socket "$d/s.sock" --timeout 300 -- 'insmod /lib/modules/qcuda.ko && qcuda-smi' || rc=$?
    kill -0 $pid || rc=1
    kill -TERM $pid
    wait $pid 2>/dev/null
    cat "$d/daemon.log"
    grep -q 'frontend disconnected' "$d/daemon.log" || rc=1
    rm -rf "$d"
    return $rc
}
step "daemon: a QEMU killed mid-handshake is logged, the next VM is served" qemu_dies
per_vm_views() {
    # Two VMs on one daemon (--socket-count 2), without a GPU: each VM's qcuda-smi lists only its
    # own processes (here qcuda-smi latency loops, which hold sessions), with the pids qcuda.ko
    # stamped; the host's view (vhost-cuda --stats, the daemon's stats socket) has the same
    # sessions and pids per VM; every session's open and close is one log line.
    local d rc=0 v s
    d=$(mktemp -d)
    DAEMON=target/release/vhost-cuda
    # shellcheck source=qcuda-accounting.sh
    . scripts/qcuda-accounting.sh
    RUST_LOG=info $DAEMON --socket-path "$d/vm.sock" --socket-count 2 >"$d/daemon.log" 2>&1 &
    local pid=$!
    for _ in $(seq 50); do [ -S "$d/vm.sock.1" ] && [ -S "$d/vm.sock.stats" ] && break; sleep 0.1; done
    local vms=()
    for v in A B; do
        local n=1
        [ $v = B ] && n=2
        scripts/run-vm.sh --socket "$d/vm.sock.$([ $v = A ] && echo 0 || echo 1)" --timeout 300 -- \
            "insmod /lib/modules/qcuda.ko || exit 1; ps=; i=0; while [ \$i -lt $n ]; do qcuda-smi latency --count 10000000 >/dev/null & ps=\"\$ps \$!\"; i=\$((i+1)); done; sleep 2; \
echo \"$v-PIDS\$ps\"; qcuda-smi processes --csv | sed 's/^/$v-PROCS /'; qcuda-smi; echo $v-SNAP; sleep 8; kill \$ps; wait; \
echo \"$v-AFTER \$(qcuda-smi processes --csv | grep -vc '^pid,')\"" >"$d/guest-$v.log" 2>&1 &
        vms+=($!)
    done
    for v in A B; do
        local label=$d/vm.sock.0 log=$d/guest-$v.log
        [ $v = B ] && label=$d/vm.sock.1
        for _ in $(seq 600); do tr -d '\r' <"$log" | grep -q "^$v-SNAP" && break; sleep 0.3; done
        local host guest pids
        host=$(qa_sessions "$d/vm.sock" "$label" | awk '{ print $1, $2 }' | sort)
        guest=$(tr -d '\r' <"$log" | sed -n "s/^$v-PROCS //p" | grep -v '^pid,' | awk -F, '{ print $2, $1 }' | sort)
        pids=$(tr -d '\r' <"$log" | sed -n "s/^$v-PIDS //p" | tr ' ' '\n' | sort | tr '\n' ' ')
        echo "VM $v: pids $pids; its qcuda-smi: $(echo $guest); the host: $(echo $host)"
        [ -n "$guest" ] && [ "$guest" = "$host" ] || { echo "VM $v: the host's view differs from the guest's"; rc=1; }
        [ "$(echo "$guest" | awk '{ print $2 }' | sort | tr '\n' ' ')" = "$pids" ] || { echo "VM $v: qcuda-smi lists other processes than its own"; rc=1; }
        [ "$(echo "$guest" | wc -l)" = "$([ $v = A ] && echo 1 || echo 2)" ] || rc=1
    done
    wait "${vms[@]}"
    for v in A B; do
        s=$(tr -d '\r' <"$d/guest-$v.log" | sed -n "s/^$v-AFTER //p")
        [ "$s" = 0 ] || { echo "VM $v: $s process(es) listed after their kill"; rc=1; }
    done
    $DAEMON --stats --socket-path "$d/vm.sock"
    kill -TERM $pid
    wait $pid 2>/dev/null
    grep -E 'session [0-9]+ (opened|closed)' "$d/daemon.log" | grep -v 'guest pid [0-9]' && { echo "a session logged without its guest pid"; rc=1; }
    [ "$(grep -cE 'session [0-9]+ opened' "$d/daemon.log")" = "$(grep -cE 'session [0-9]+ closed' "$d/daemon.log")" ] || rc=1
    grep -E 'session [0-9]+ (opened|closed)' "$d/daemon.log" | tail -n 4
    rm -rf "$d"
    return $rc
}
step "per-VM views: each VM's qcuda-smi lists only its own processes, the host's vhost-cuda --stats the same" per_vm_views
flood_stalled() {
    # Guest sessions flood fire-and-forget calls while the daemon is stopped for 1.5 s: one
    # waits at qcuda.ko's per-session bound, more fill the ring with requests nobody waits for,
    # and the callers must get slots again after.
    local d rc=0
    d=$(mktemp -d)
    target/release/vhost-cuda --socket-path "$d/s.sock" >"$d/daemon.log" 2>&1 &
    local pid=$!
    for _ in $(seq 50); do [ -S "$d/s.sock" ] && break; sleep 0.1; done
    scripts/run-vm.sh --socket "$d/s.sock" --timeout 300 -- \
        'insmod /lib/modules/qcuda.ko && /opt/qcuda/bin/qcuda-transport-test flood' >"$d/vm.log" 2>&1 &
    local vm=$!
    for _ in $(seq 1200); do grep -q FLOOD-START "$d/vm.log" && break; sleep 0.1; done
    sleep 1
    kill -STOP $pid
    sleep 1.5
    kill -CONT $pid
    wait $vm || rc=1
    kill -TERM $pid
    wait $pid 2>/dev/null
    tr -d '\r' <"$d/vm.log" | grep -E '^(ok|FAIL)|passed|FLOOD'
    grep -q 'qcuda-transport-test: [0-9]* passed, 0 failed' "$d/vm.log" || rc=1
    rm -rf "$d"
    return $rc
}
step "guest: a fire-and-forget flood survives a stalled daemon (a session waits at its bound, the ring fills, slots reaped)" flood_stalled
restart() {
    local out
    out=$(scripts/test-restart.sh "$LOGS/restart" 2>&1)
    local rc=$?
    echo "$out"
    echo "$out" | grep -E 'recovered:' | sed 's/^\[test-restart\] /   /' >&3
    return $rc
}
step "daemon restart: QEMU reconnects, nothing hangs, new programs work (no reboot)" restart 3>&1
restart_keep() {
    local out
    out=$(scripts/test-restart.sh --keep "$LOGS/restart-keep" 2>&1)
    local rc=$?
    echo "$out"
    echo "$out" | grep -E 'worker calls ended' | sed 's/^ *RESTART /   /' >&3
    return $rc
}
step "daemon killed (-9) under running programs, workers kept (fd store): the next daemon takes them over, no call fails" restart_keep 3>&1
# Live migration between two QEMUs and two daemons on this host (issue 31): a migration to a
# destination whose daemon dies fails and leaves the source running, then the real one carries
# the open sessions; the guest's calls around both must all succeed, and its transport self-test
# pass on the destination.
migration() {
    local out
    out=$(scripts/test-migration.sh --log-dir "$LOGS/migration" 2>&1)
    local rc=$?
    echo "$out"
    echo "$out" | grep -E '^\[test-migration\] (ok|migration:)|^  (Time|total time|downtime)' | sed 's/^\[test-migration\] /   /' >&3
    return $rc
}
step "live migration: two QEMUs and daemons; a failed one leaves the source running, sessions move" migration 3>&1
# The pre-copy of device memory through QEMU (patch 0006's section vhost-user-cuda-precopy)
# without a GPU: the daemons are a build of their own with the fake CUDA driver, a test double
# (feature test-double-driver, in build/test-double-daemon; QCUDA_TEST_DOUBLE_DRIVER=1 picks
# it), which the shipped binary must not contain. tests/cuda/precopy_memcpy's 256 MiB working
# set is migrated mid-loop twice: rewritten every iteration without a limit (the changed chunks
# go again; its rate is the one unpaced), then unchanged under max-bandwidth 32M (the stop
# carries none of it; the rounds keep to the limit, which must have held them back).
precopy_double_build() {
    cargo build --release --locked -p vhost-cuda --features test-double-driver --target-dir build/test-double-daemon
}
step "build the test-double daemon (vhost-cuda --features test-double-driver, build/test-double-daemon)" precopy_double_build
shipped_lacks_double() {
    grep -q QCUDA_TEST_DOUBLE_DRIVER build/test-double-daemon/release/vhost-cuda &&
        ! grep -q QCUDA_TEST_DOUBLE_DRIVER target/release/vhost-cuda
}
step "the shipped vhost-cuda has no test double (target/release/vhost-cuda lacks QCUDA_TEST_DOUBLE_DRIVER)" shipped_lacks_double
precopy_fake() { # name, test-migration.sh arguments...
    local out name=$1
    shift
    out=$(scripts/test-migration.sh --program precopy-fake --path copy --log-dir "$LOGS/$name" "$@" 2>&1)
    local rc=$?
    echo "$out"
    echo "$out" | grep -E '^\[test-migration\] (ok|FAILED|migration:|pre-copy|sent again|iteration rate)|^  (total time|downtime):' |
        sed 's/^\[test-migration\] /   /' >&3
    echo "$out" | sed -n 's/^\[test-migration\] pre-copy rate: \([0-9.]*\) MiB\/s over its span.*/\1/p' >"$LOGS/$name.mibps"
    return $rc
}
step "pre-copy over the fake driver, a set rewritten every iteration: the changed chunks go again, the same checksum" \
    precopy_fake precopy-rewrite --rewrite 1 --iterations 500 3>&1
precopy_paced() {
    local unpaced
    unpaced=$(cat "$LOGS/precopy-rewrite.mibps" 2>/dev/null)
    [[ -n $unpaced ]] || { echo "no unpaced pre-copy rate from the rewrite step"; return 1; }
    precopy_fake precopy-paced --max-bandwidth 32M --iterations 1500 --unpaced-mibps "$unpaced"
}
step "pre-copy over the fake driver under max-bandwidth 32M, a set unchanged: the stop carries none of it, the rounds keep to the limit" \
    precopy_paced 3>&1
# 1000 guest CUDA programs killed at random points, over 4 VMs (issue 11, point 6); needs the
# GPU. (load-test.sh load, the 5-minute 32 x 8 load test, runs from the bundle: docs/testing.md.)
kills() { scripts/load-test.sh kills --count 1000 --vms 4 --log-dir "$LOGS/kills"; }
if have_gpu; then
    step "1000 guest CUDA programs killed at random points: no session, worker, held page or GPU memory left" kills
else
    skip "1000 guest CUDA programs killed at random points (scripts/load-test.sh kills): no GPU"
fi
# The host's own PyTorch in the guest (issue 18): matrix products, a convolution, an FFT and a
# short training run, each checked against the CPU, natively and in the guest; GPU only.
torch_test() { scripts/run-torch-test.sh --log-dir "$LOGS/torch"; }
if step "PyTorch in the guest (tests/torch): fp32/bf16 matmul, conv, fft, training, vs the CPU" torch_test; then
    if grep -q '^skipped: ' "$LOGS"/PyTorch_in_the_guest*.log; then
        passed=$((passed - 1))
        skip "PyTorch in the guest: $(sed -n 's/^skipped: //p' "$LOGS"/PyTorch_in_the_guest*.log | head -n 1)"
    fi
fi

echo "== operators"
socket_activated() {
    # systemd's own socket activation tool binds the socket and execs the daemon on QEMU's
    # connection with it at fd 3, as vhost-cuda@.socket does; the guest must be served, and
    # the socket must stay after the daemon's exit (it is systemd's).
    local d rc=0 pid
    d=$(mktemp -d)
    systemd-socket-activate -l "$d/vm0.sock" -E RUST_LOG=info target/release/vhost-cuda >"$d/daemon.log" 2>&1 &
    pid=$!
    for _ in $(seq 50); do [ -S "$d/vm0.sock" ] && break; sleep 0.1; done
    scripts/run-vm.sh --socket "$d/vm0.sock" --timeout 300 -- 'insmod /lib/modules/qcuda.ko && qcuda-smi' || rc=$?
    kill -TERM $pid
    wait $pid 2>/dev/null
    cat "$d/daemon.log"
    grep -q "socket $d/vm0.sock from systemd (fd 3)" "$d/daemon.log" || rc=1
    [ -S "$d/vm0.sock" ] || { echo "the socket was removed"; rc=1; }
    rm -rf "$d"
    return $rc
}
step "systemd socket activation: a daemon started on QEMU's connection serves the guest" socket_activated
libvirt_domain() {
    local rc=0 want=2 line='^SKIP vector_add: no CUDA device (cudaErrorNoDevice)'
    if have_gpu; then want=0 line='^PASS vector_add'; fi
    scripts/run-libvirt.sh --log-dir "$LOGS/libvirt" --timeout 300 -- \
        'insmod /lib/modules/qcuda.ko && /opt/qcuda/tests/vector_add' >"$LOGS/libvirt-console.log" 2>&1 || rc=$?
    cat "$LOGS/libvirt-console.log"
    echo "exit $rc (want $want)"
    grep -q 'vhost-user-cuda-pci' "$LOGS/libvirt/qemu.log" || { echo "libvirt's QEMU had no vhost-user-cuda-pci"; return 1; }
    [ "$rc" -eq "$want" ] && tr -d '\r' <"$LOGS/libvirt-console.log" | grep -q "$line"
}
step "libvirt: virsh starts the domain with our device, a CUDA program runs in it" libvirt_domain
# The installed guest (scripts/install-guest.sh, as build-payload.sh lays it out in
# installed.cpio.gz): qcuda.ko loaded at boot from /lib/modules/<release>/extra through
# modules-load.d, the libraries found through ld.so.cache, no LD_LIBRARY_PATH.
step "installed guest: install-guest.sh's DKMS source builds qcuda.ko with dkms (CONFIG_RUST kernels only)" \
    scripts/check-dkms.sh
guest_suite installed "EXPECT_GPU=$(have_gpu && echo 1 || echo 0) /opt/qcuda/bin/check-installed" \
    --payload build/guest/installed.cpio.gz
libvirt_installed() {
    local rc=0
    scripts/run-libvirt.sh --log-dir "$LOGS/libvirt-installed" --timeout 300 --payload build/guest/installed.cpio.gz -- \
        "EXPECT_GPU=$(have_gpu && echo 1 || echo 0) /opt/qcuda/bin/check-installed" >"$LOGS/libvirt-installed-console.log" 2>&1 || rc=$?
    tr -d '\r' <"$LOGS/libvirt-installed-console.log"
    echo "exit $rc"
    [ "$rc" -eq 0 ] && tr -d '\r' <"$LOGS/libvirt-installed-console.log" | grep -q '^CHECK ok installed: vector_add without LD_LIBRARY_PATH' &&
        ! grep -q '^CHECK FAIL' "$LOGS/libvirt-installed-console.log"
}
step "libvirt: the installed guest loads qcuda.ko at boot, a CUDA program runs without LD_LIBRARY_PATH" libvirt_installed
step "docs: README's and running.md's by-hand blocks run as printed" scripts/check-doc-blocks.sh "$LOGS/doc-blocks"

echo "== stock kernels (docs/guest-install.md)"
t_stock=$SECONDS
# A trixie build root (mmdebstrap), the Rust build files of each kernel flavour (prepared once
# per release into ~/.cache/qcuda/kbuild, shared by the root, the package check and the image)
# and a Debian disk image: all cached under ~/.cache/qcuda (docs/testing.md has the cold cost).
stock_tests() {
# Debian's trixie-backports kernel, qcuda.ko built against its headers in a trixie build root
# (the Rust build files prepared once per release, cached), booted with our initramfs.
if step "build the stock guest: Debian's kernel and modules, qcuda.ko against its headers" scripts/build-stock-guest.sh; then
    sed -n 's/^\[build-stock-guest\]   \(kernelrelease\|vermagic\|rustc --version\|linux-image-[^:]*\|bindgen --version\): /   \1: /p' \
        "$LOGS"/build_the_stock_guest*.log
    stock_vermagic() {
        # qcuda.ko's against a module of the distribution's own package, from the build root.
        local r rel ours theirs
        r=$(scripts/build-stock-guest.sh --root) && rel=$(sed -n 's/^kernelrelease: //p' build/stock/versions.txt) || return 1
        ours=$(modinfo -F vermagic build/stock/qcuda.ko)
        theirs=$(modinfo -F vermagic "$(find "$r/lib/modules/$rel/kernel/fs/overlayfs" -name 'overlay.ko*' | head -n 1)")
        echo "qcuda.ko: '$ours'; the distribution's overlay.ko: '$theirs'"
        [[ -n $ours && $ours == "$theirs" ]]
    }
    step "stock kernel: qcuda.ko's vermagic (modinfo) equals the distribution's modules'" stock_vermagic
    guest_suite stock-transport /opt/qcuda/bin/check-transport --kernel stock
    if have_gpu; then guest_suite stock-cuda /opt/qcuda/bin/check-cuda --kernel stock; else cuda_nogpu stock-kernel --kernel stock; fi
    # The GPU scripts' way in (run-gpu-tests.sh, run-torch-test.sh --kernel stock): the host's
    # root over virtiofs, chrooted into, on the stock kernel's own virtiofs and overlayfs.
    guest_suite stock-share-chroot "EXPECT_GPU=$(have_gpu && echo 1 || echo 0) HOST_OS='$(. /etc/os-release && echo "$PRETTY_NAME")' /opt/qcuda/bin/check-share chroot" \
        --kernel stock --share /:/mnt/host:ro --chroot /mnt/host
fi
step "guest package: dpkg -i, -r, -i again, a new kernel's headers (DKMS), dpkg -P, in a trixie root" \
    scripts/check-guest-deb.sh --with-second-kernel && grep -E '^\[check-guest-deb\] (ok|FAIL)' "$LOGS"/guest_package*.log | sed 's/^\[check-guest-deb\]/  /'
if step "Debian disk image: docs/guest-install.md's walkthrough run as printed (apt, dpkg, DKMS)" scripts/build-disk-image.sh; then
    disk=build/disk/qcuda-trixie.qcow2
    walk=$LOGS/walkthrough-check.sh
    awk '$0 == "<!-- qcuda-walkthrough:check -->" { w = 1; next } w && /^```/ { if (b) exit; b = 1; next } b { print }' \
        docs/guest-install.md >"$walk"
    disk_cmd="if sh -ex /root/walkthrough-check; then echo 'CHECK ok disk: docs/guest-install.md walkthrough check block, as printed'; \
else echo 'CHECK FAIL disk: docs/guest-install.md walkthrough check block, as printed'; fi; EXPECT_GPU=$(have_gpu && echo 1 || echo 0) /root/check-disk"
    disk_adds=(--add build/cuda-tests/vector_add:/root/vector_add --add tests/guest/check-disk:/root/check-disk
        --add "$walk:/root/walkthrough-check")
    guest_suite disk "$disk_cmd" --disk "$disk" "${disk_adds[@]}"
    libvirt_disk() {
        local rc=0
        scripts/run-libvirt.sh --log-dir "$LOGS/libvirt-disk" --timeout 900 --disk "$disk" "${disk_adds[@]}" -- "$disk_cmd" \
            >"$LOGS/libvirt-disk-console.log" 2>&1 || rc=$?
        tr -d '\r' <"$LOGS/libvirt-disk-console.log"
        echo "exit $rc"
        [ "$rc" -eq 0 ] && grep -q '^CHECK ok disk: qcuda.ko loaded at boot' "$LOGS/libvirt-disk-console.log" &&
            ! grep -q '^CHECK FAIL' "$LOGS/libvirt-disk-console.log"
    }
    step "libvirt: the Debian disk image boots with our device, qcuda.ko loaded at boot, CUDA without LD_LIBRARY_PATH" libvirt_disk
fi
}
if [[ ${QCUDA_TEST_STOCK:-1} != 0 ]]; then
    stock_tests
    echo "   stock kernels took $((SECONDS - t_stock))s"
else
    skip "stock kernels, the qcuda-guest package and the Debian disk image: left out (QCUDA_TEST_STOCK=0)"
fi

echo "== release bundle"
bundle_boots() {
    local d tarball
    tarball=$(scripts/bundle.sh | tail -n 1) || return 1
    d=$(mktemp -d)
    tar -xf "$tarball" -C "$d"
    echo "bundle: $tarball ($(du -h "$tarball" | cut -f1))"
    # Out of reach: the repo's builds, the host's QEMU, Rust and everything else on PATH.
    # Its own virtiofsd shares the unpacked bundle into the guest, read-only.
    (cd / && env -i PATH=/usr/bin:/bin HOME="$d" TMPDIR="$d" "$d"/qcuda/run-vm.sh --timeout 300 \
        --share "$d/qcuda:/mnt/bundle:ro" -- \
        'insmod /lib/modules/qcuda.ko && qcuda-smi && test -x /mnt/bundle/bin/virtiofsd && echo BUNDLE-OK')
    local rc=$?
    # The stock kernel from the bundle, as run-gpu-tests.sh and run-torch-test.sh --kernel stock
    # boot it: chrooted into the host's root, a CUDA program through our libraries.
    if ((rc == 0)) && [[ ${QCUDA_TEST_STOCK:-1} != 0 ]]; then
        [[ -f $d/qcuda/guest/stock/vmlinuz ]] || { echo "the bundle has no guest/stock"; rc=1; }
        local want='^SKIP vector_add: no CUDA device (cudaErrorNoDevice)'
        have_gpu && want='^PASS vector_add'
        if ((rc == 0)); then
            (cd / && env -i PATH=/usr/bin:/bin HOME="$d" TMPDIR="$d" "$d"/qcuda/run-vm.sh --timeout 600 --kernel stock \
                --share /:/mnt/host:ro --chroot /mnt/host -- 'uname -r && qcuda-smi && { /opt/qcuda/tests/vector_add; echo "exit $?"; }') \
                >"$d/stock.log" 2>&1 || rc=1
            tr -d '\r' <"$d/stock.log" | tee /dev/stderr | grep -q '+deb13-amd64$' || rc=1
            tr -d '\r' <"$d/stock.log" | grep -q "$want" || rc=1
        fi
    fi
    rm -rf "$d"
    return $rc
}
step "bundle unpacked in a fresh folder boots (own kernel: loads qcuda.ko, shares a folder; stock kernel: a CUDA program in the host's root)" bundle_boots
grep -q 'BUNDLE-OK' "$LOGS"/bundle*.log 2>/dev/null || true
bundle_lanes() {
    local d tarball
    tarball=$ROOT/dist/qcuda-bundle.tar.xz
    [[ -f $tarball ]] || return 1
    d=$(mktemp -d)
    tar -xf "$tarball" -C "$d" && "$d"/qcuda/gpu-check.sh --check-lanes
    local rc=$?
    rm -rf "$d"
    return $rc
}
step "bundle: every gpu-check.sh lane's script (and check) is in the bundle" bundle_lanes
finish

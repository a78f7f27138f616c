#!/usr/bin/env bash
# test-restart.sh: kills vhost-cuda while a guest's programs run, starts it again, and checks that
# QEMU reconnects (chardev reconnect-ms), that the requests in flight end instead of hanging, and
# that new programs work, without rebooting the guest (tests/guest/check-restart does the guest
# side). Prints the recovery time: from the new daemon's start to the guest's first answered call.
# Works from the repo and from an unpacked bundle, like run-vm.sh. Exit 0 when it held.
#
# With --keep (QCUDA_RESTART_KEEP=1) the daemon runs under scripts/fd-store.py, which plays
# systemd's file-descriptor store and Restart=: the workers outlive the killed daemon and the
# next one takes them over, so nothing in the guest may fail (a call, or the program in flight,
# which must end as an uninterrupted run does). QCUDA_RESTART_PROGRAM picks that program (a path
# in the guest; default /opt/qcuda/tests/large_copy). Prints the restart gap the guest saw.
# Usage: test-restart.sh [--keep] [LOG_DIR]
set -euo pipefail
keep=${QCUDA_RESTART_KEEP:-0}
if [[ ${1:-} == --keep ]]; then keep=1; shift; fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -x $here/bin/vhost-cuda ]]; then DAEMON=$here/bin/vhost-cuda; else DAEMON=$here/../target/release/vhost-cuda; fi
DAEMON=${QCUDA_DAEMON:-$DAEMON}
log_dir=${1:-$(mktemp -d)}
mkdir -p "$log_dir"
sock=$log_dir/vhost-cuda.sock
daemon=""
say() { printf '[test-restart] %s\n' "$*"; }
cleanup() { [[ -z $daemon ]] || kill -KILL "$daemon" 2>/dev/null || true; }
trap cleanup EXIT
store=""
cleanup_store() { [[ -z $store ]] || { kill -TERM "$store" 2>/dev/null; wait "$store" 2>/dev/null; } || true; }
trap 'cleanup; cleanup_store' EXIT
start_daemon() {
    if [[ $keep == 1 ]]; then
        if [[ -z $store ]]; then
            RUST_LOG=${RUST_LOG:-info} python3 "$here/fd-store.py" --dir "$log_dir" --pid-file "$log_dir/daemon.pid" --restart-sec "${QCUDA_RESTART_SEC:-1}" \
                -- "$DAEMON" --socket-path "$sock" >>"$log_dir/daemon.log" 2>&1 &
            store=$!
        fi
        # The stand-in restarts a killed daemon by itself (Restart=); wait for the new pid.
        for _ in $(seq 200); do
            if [[ -s $log_dir/daemon.pid ]] && [[ $(cat "$log_dir/daemon.pid") != "${daemon:-}" ]] &&
                [[ $(grep -c 'waiting for a frontend' "$log_dir/daemon.log") -gt ${started:-0} ]]; then
                daemon=$(cat "$log_dir/daemon.pid")
                started=$(grep -c 'waiting for a frontend' "$log_dir/daemon.log")
                return 0
            fi
            sleep 0.05
        done
        say "vhost-cuda did not start under the store"; return 1
    fi
    RUST_LOG=${RUST_LOG:-info} "$DAEMON" --socket-path "$sock" >>"$log_dir/daemon.log" 2>&1 &
    daemon=$!
    for _ in $(seq 200); do
        grep -q 'waiting for a frontend' "$log_dir/daemon.log" 2>/dev/null && [[ -S $sock ]] && return 0
        sleep 0.05
    done
    say "vhost-cuda did not start"; return 1
}
wait_for() { # pattern seconds
    local n=0
    until grep -q "$1" "$log_dir/guest.log" 2>/dev/null; do
        n=$((n + 1))
        ((n <= $2 * 10)) || return 1
        kill -0 "$vm" 2>/dev/null || return 1
        sleep 0.1
    done
}
start_daemon
guest_cmd=/opt/qcuda/bin/check-restart
[[ $keep == 1 ]] && guest_cmd="QCUDA_RESTART_KEEP=1 QCUDA_RESTART_PROGRAM=${QCUDA_RESTART_PROGRAM:-/opt/qcuda/tests/large_copy} $guest_cmd"
"$here/run-vm.sh" --socket "$sock" --reconnect 100 --timeout 400 --log-dir "$log_dir/vm" \
    -- "$guest_cmd" >"$log_dir/guest.log" 2>&1 &
vm=$!
if ! wait_for '^RESTART ready' 240; then
    say "the guest never got ready"; tail -n 20 "$log_dir/guest.log"; exit 1
fi
sleep 0.5
say "killing vhost-cuda (pid $daemon) with requests in flight"
t_kill=$(date +%s%N)
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null || true
if [[ $keep != 1 ]]; then sleep 1; fi
t0=$(date +%s%N)
start_daemon
[[ $keep == 1 ]] && say "the store restarted vhost-cuda; it serves $((($(date +%s%N) - t_kill) / 1000000)) ms after the kill (RestartSec=${QCUDA_RESTART_SEC:-1} s)"
say "vhost-cuda started again (pid $daemon)"
if wait_for '^RESTART recovered' 60; then
    t1=$(date +%s%N)
    say "recovered: the guest's first call answered $(((t1 - t0) / 1000000)) ms after the new daemon started"
else
    say "the guest did not recover"
fi
rc=0
wait "$vm" || rc=$?
grep '^RESTART ' "$log_dir/guest.log" | sed 's/^/  /'
if [[ $rc -eq 0 ]] && grep -q '^RESTART ok' "$log_dir/guest.log"; then
    say "ok"
    exit 0
fi
say "FAILED (guest exit $rc); logs in $log_dir"
tail -n 30 "$log_dir/guest.log"
exit 1

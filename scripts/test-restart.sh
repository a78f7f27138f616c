#!/usr/bin/env bash
# test-restart.sh: kills vhost-cuda while a guest's programs run, starts it again, and checks that
# QEMU reconnects (chardev reconnect-ms), that the requests in flight end instead of hanging, and
# that new programs work, without rebooting the guest (tests/guest/check-restart does the guest
# side). Prints the recovery time: from the new daemon's start to the guest's first answered call.
# Works from the repo and from an unpacked bundle, like run-vm.sh. Exit 0 when it held.
set -euo pipefail
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
start_daemon() {
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
"$here/run-vm.sh" --socket "$sock" --reconnect 100 --timeout 400 --log-dir "$log_dir/vm" \
    -- /opt/qcuda/bin/check-restart >"$log_dir/guest.log" 2>&1 &
vm=$!
if ! wait_for '^RESTART ready' 240; then
    say "the guest never got ready"; tail -n 20 "$log_dir/guest.log"; exit 1
fi
sleep 0.5
say "killing vhost-cuda (pid $daemon) with requests in flight"
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null || true
: >"$log_dir/daemon.log.restart"
sleep 1
t0=$(date +%s%N)
start_daemon
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

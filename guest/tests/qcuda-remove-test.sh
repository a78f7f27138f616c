#!/bin/sh
# qcuda-remove-test.sh: device removal and module unload, run in the guest as root with
# vhost-cuda attached and qcuda-transport-test and qcuda-smi on PATH. Prints "N passed, N
# failed".
pass=0 fail=0
check() { # description, command...
	d=$1; shift
	if "$@"; then pass=$((pass + 1)); echo "ok   $d"; else fail=$((fail + 1)); echo "FAIL $d"; fi
}
drv=/sys/bus/virtio/drivers/qcuda
# The host's open sessions of this VM, as a new process sees them (Hello counts its own).
only_own_session() {
	n=$(qcuda-smi sessions) || return 1
	echo "     open sessions seen by a new process: $n"
	[ "$n" = 1 ]
}
# The last probe's DriverReset closed at least one session of the previous driver instance.
stale_sessions_closed() {
	n=$(dmesg | sed -n 's/.*host closed \([0-9]*\) session(s) of an earlier driver instance.*/\1/p' |
		tail -n 1)
	echo "     probe: host closed ${n:-no} session(s) of the earlier instance"
	[ "${n:-0}" -ge 1 ]
}

check "insmod" insmod /lib/modules/qcuda.ko
dev=$(basename "$(ls -d $drv/virtio* | head -n 1)")
check "device $dev bound, /dev/qcuda present" test -c /dev/qcuda

# Unbind while 4 threads have calls in flight: they fail with ENODEV, nothing hangs.
qcuda-transport-test unplug >/tmp/unplug.log 2>&1 &
pid=$!
sleep 2
check "unbind with calls in flight" sh -c "echo $dev > $drv/unbind"
wait $pid
rc=$?
cat /tmp/unplug.log
check "callers saw ENODEV and closed cleanly" test $rc -eq 0
check "/dev/qcuda gone after unbind" test ! -e /dev/qcuda

# Bind again: a fresh probe, working calls.
check "bind again" sh -c "echo $dev > $drv/bind"
check "/dev/qcuda back" test -c /dev/qcuda
# The unbound instance's file could not send SessionClose (the device was gone): the new
# instance's DriverReset had the host close that session, so only the caller's is open.
check "probe had the host close the unbound instance's session" stale_sessions_closed
check "a new process sees exactly 1 open session after rebind" only_own_session
check "calls work after rebind" sh -c "qcuda-transport-test basic >/tmp/basic.log 2>&1"

# rmmod is refused while a file is open, and works once it is closed.
exec 3</dev/qcuda
check "rmmod refused with an open file" sh -c "! rmmod qcuda 2>/dev/null"
exec 3<&-
check "rmmod after close" rmmod qcuda
check "/dev/qcuda gone after rmmod" test ! -e /dev/qcuda
check "insmod again" insmod /lib/modules/qcuda.ko
check "calls work after reload" sh -c "qcuda-transport-test basic >/tmp/basic.log 2>&1"
check "a new process sees exactly 1 open session after reload" only_own_session
check "no kernel warnings" sh -c "! dmesg | grep -qE 'WARNING|BUG|Oops|Call Trace|refcount'"
echo "qcuda-remove-test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]

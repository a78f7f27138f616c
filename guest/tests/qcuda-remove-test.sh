#!/bin/sh
# qcuda-remove-test.sh: device removal and module unload, run in the guest as root with
# vhost-cuda attached and qcuda-transport-test on PATH. Prints "N passed, N failed".
pass=0 fail=0
check() { # description, command...
	d=$1; shift
	if "$@"; then pass=$((pass + 1)); echo "ok   $d"; else fail=$((fail + 1)); echo "FAIL $d"; fi
}
drv=/sys/bus/virtio/drivers/qcuda

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
check "calls work after rebind" sh -c "qcuda-transport-test basic >/tmp/basic.log 2>&1"

# rmmod is refused while a file is open, and works once it is closed.
exec 3</dev/qcuda
check "rmmod refused with an open file" sh -c "! rmmod qcuda 2>/dev/null"
exec 3<&-
check "rmmod after close" rmmod qcuda
check "/dev/qcuda gone after rmmod" test ! -e /dev/qcuda
check "insmod again" insmod /lib/modules/qcuda.ko
check "calls work after reload" sh -c "qcuda-transport-test basic >/tmp/basic.log 2>&1"
check "no kernel warnings" sh -c "! dmesg | grep -qE 'WARNING|BUG|Oops|Call Trace|refcount'"
echo "qcuda-remove-test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]

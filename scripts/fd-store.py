#!/usr/bin/env python3
"""fd-store.py: what systemd does for vhost-cuda across a restart, for tests outside systemd.

Runs the daemon (the command after --) as a service with Restart=always, NotifyAccess=main and
FileDescriptorStoreMax= would: it gives it NOTIFY_SOCKET, keeps the descriptors the daemon
stores there (FDSTORE=1 with FDNAME=, FDSTOREREMOVE=1), drops a stored socket whose peer hung
up (as systemd's FDPOLL does), and when the daemon exits, however it ends, starts it again after
--restart-sec with the stored descriptors at 3, 4, ... (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID).
Writes the running daemon's pid to --pid-file. Ends, closing the store, on SIGTERM or SIGINT.

    scripts/fd-store.py --dir DIR --pid-file FILE -- vhost-cuda --socket-path ...
"""
import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--pid-file", required=True)
parser.add_argument("--restart-sec", type=float, default=1.0)
parser.add_argument("cmd", nargs=argparse.REMAINDER)
args = parser.parse_args()
cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd

notify_path = os.path.join(args.dir, "notify.sock")
try:
    os.unlink(notify_path)
except FileNotFoundError:
    pass
notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
notify.bind(notify_path)
store = []  # (name, fd), in the order stored
stopping = False


def log(msg):
    print(f"[fd-store] {msg}", file=sys.stderr, flush=True)


def on_signal(_sig, _frame):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)


def take_messages():
    while True:
        r, _, _ = select.select([notify], [], [], 0)
        if not r:
            return
        msg, fds, _flags, _addr = socket.recv_fds(notify, 4096, 64)
        fields = dict(line.split("=", 1) for line in msg.decode().splitlines() if "=" in line)
        name = fields.get("FDNAME", "stored")
        if fields.get("FDSTOREREMOVE") == "1":
            for n, fd in [e for e in store if e[0] == name]:
                os.close(fd)
                store.remove((n, fd))
        if fields.get("FDSTORE") == "1":
            store.extend((name, fd) for fd in fds)
        else:
            for fd in fds:
                os.close(fd)


def drop_hung_up():
    for name, fd in list(store):
        p = select.poll()
        p.register(fd, select.POLLHUP | select.POLLERR)
        events = p.poll(0)
        if events and events[0][1] & (select.POLLHUP | select.POLLERR):
            os.close(fd)
            store.remove((name, fd))


def start():
    passed = list(store)
    env = dict(os.environ, NOTIFY_SOCKET=notify_path)
    env.pop("LISTEN_FDS", None)
    env.pop("LISTEN_FDNAMES", None)
    if passed:
        env["LISTEN_FDS"] = str(len(passed))
        env["LISTEN_FDNAMES"] = ":".join(n for n, _ in passed)
    base = 3 + len(passed) + 64

    def place_fds():
        # Copies high first, so that no dup2 below clobbers a descriptor still to be placed.
        high = [os.dup2(fd, base + i) for i, (_, fd) in enumerate(passed)]
        for i, fd in enumerate(high):
            os.dup2(fd, 3 + i)
            os.close(fd)
        # Nothing else of this process (the notify socket, the store itself) goes along.
        os.closerange(3 + len(passed), 1 << 16)

    # LISTEN_PID must be the daemon's own pid: the shell's, which exec keeps.
    wrapped = ["/bin/sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$@"', "sh"] + cmd
    proc = subprocess.Popen(wrapped, env=env, preexec_fn=place_fds, close_fds=False)
    with open(args.pid_file, "w") as f:
        f.write(f"{proc.pid}\n")
    log(f"daemon started (pid {proc.pid}), {len(passed)} stored descriptor(s) passed")
    return proc


proc = start()
while not stopping:
    take_messages()
    drop_hung_up()
    if proc.poll() is not None:
        take_messages()
        log(f"daemon {proc.pid} exited ({proc.returncode}); {len(store)} descriptor(s) kept")
        time.sleep(args.restart_sec)
        if not stopping:
            proc = start()
    time.sleep(0.02)
if proc.poll() is None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
# Stopped for good: the store closes, and idle workers see their channels end.
for _, fd in store:
    os.close(fd)
log("stopped; store closed")

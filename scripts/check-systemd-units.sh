#!/usr/bin/env bash
# check-systemd-units.sh: `systemd-analyze verify` on deploy/systemd's units, any warning fails.
#
# Works without systemd running (containers, CI): the units are checked in a scratch root that
# holds them under /etc/systemd/system, this host's stock units (for the targets they order
# against) and a stand-in for /usr/local/bin/vhost-cuda, whose existence verify checks.
# An instance (vm0) is verified, since a bare template cannot be loaded.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
units=$ROOT/deploy/systemd
command -v systemd-analyze >/dev/null || { echo "check-systemd-units: systemd-analyze is missing (apt-get install systemd)" >&2; exit 1; }

root=$(mktemp -d "${TMPDIR:-/tmp}/qcuda-units.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/etc/systemd/system" "$root/usr/lib/systemd" "$root/usr/local/bin"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp "$units"/*.service "$units"/*.socket "$root/etc/systemd/system/"
printf '#!/bin/sh\nexit 0\n' >"$root/usr/local/bin/vhost-cuda"
chmod 755 "$root/usr/local/bin/vhost-cuda"

rc=0
for unit in vhost-cuda@vm0.service vhost-cuda@vm0.socket; do
    out=$(systemd-analyze verify --man=no --root="$root" "$unit" 2>&1) || rc=1
    # verify exits 0 on settings it ignores ("Unknown key", "Failed to parse ..."): any line
    # it prints is a finding.
    if [[ -n $out ]]; then
        printf '%s\n' "$out" | sed "s|$root||g"
        rc=1
    else
        echo "$unit: verified"
    fi
done
exit $rc

#!/usr/bin/env bash
# check-doc-blocks.sh: runs the by-hand blocks of README.md and docs/running.md as printed.
#
# A block is the ```sh fence right after a `<!-- by-hand: NAME -->` line. For each document, one
# bash runs, from the repository: its `host` block (directory, daemon in the background, initrd),
# running.md's `unattended` block (so that the guest runs a command and powers off instead of
# waiting at its shell), its `qemu` block, then `kill %1`, the documents' way to stop the daemon,
# which must remove its socket. Then its `guest` block runs in a guest (scripts/run-vm.sh), as a
# person would type it. Each guest run must end with the CUDA program's clean line: "PASS
# vector_add" with a GPU, "SKIP vector_add: no CUDA device (cudaErrorNoDevice)" without.
#
# As root (the blocks use /run/qcuda/vm0.sock and /tmp/qcuda-*), after the builds and the
# payload (scripts/test.sh's order). Logs: build/test-logs/doc-blocks/ (or $1).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
logs=${1:-$ROOT/build/test-logs/doc-blocks}
mkdir -p "$logs"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    want='^PASS vector_add'
else
    want='^SKIP vector_add: no CUDA device (cudaErrorNoDevice)'
fi

block() { # file name: the block's text, or failure if the document has none
    awk -v name="$2" '
        $0 == "<!-- by-hand: " name " -->" { f = 1; next }
        f == 1 && /^```sh$/ { f = 2; next }
        f == 1 { exit }
        f == 2 && /^```$/ { exit }
        f == 2 { print; n++ }
        END { exit n ? 0 : 1 }' "$1" || { echo "$1: no by-hand block '$2'" >&2; return 1; }
}

rc=0
for doc in README.md docs/running.md; do
    name=$(basename "$doc" .md)
    script=$logs/$name.sh
    {
        echo 'set -e'
        block "$doc" host
        block docs/running.md unattended
        block "$doc" qemu
        echo 'kill %1'
        echo 'wait'
    } >"$script" || { rc=1; continue; }
    rm -rf /tmp/qcuda-cmd /tmp/qcuda-initrd
    t0=$SECONDS
    # timeout signals the whole process group: QEMU and the daemon too, if they hang.
    timeout -k 10 300 bash "$script" </dev/null >"$logs/$name.log" 2>&1
    run_rc=$?
    out=$(tr -d '\r' <"$logs/$name.log")
    if ((run_rc == 0)) && grep -q "$want" <<<"$out" && grep -q '^QCUDA_EXIT=' <<<"$out" &&
        [[ ! -e /run/qcuda/vm0.sock ]]; then
        echo "ok      $doc: host, unattended, qemu blocks as printed ($((SECONDS - t0))s): $(grep -m1 "$want" <<<"$out")"
    else
        echo "FAILED  $doc: host/unattended/qemu blocks (exit $run_rc; log $logs/$name.log)"
        tail -n 30 "$logs/$name.log" | sed 's/^/    | /'
        [[ -e /run/qcuda/vm0.sock ]] && echo "    | /run/qcuda/vm0.sock was left behind"
        rc=1
    fi

    guest=$(block "$doc" guest) || { rc=1; continue; }
    scripts/run-vm.sh --timeout 300 -- "$guest" >"$logs/$name-guest.log" 2>&1
    out=$(tr -d '\r' <"$logs/$name-guest.log")
    if grep -q "$want" <<<"$out"; then
        echo "ok      $doc: guest block as printed: $(grep -m1 "$want" <<<"$out")"
    else
        echo "FAILED  $doc: guest block (log $logs/$name-guest.log)"
        tail -n 30 "$logs/$name-guest.log" | sed 's/^/    | /'
        rc=1
    fi
done
exit $rc

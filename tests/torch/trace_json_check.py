"""Checks a qcuda trace file (qcuda-smi trace -o, QCUDA_PROFILE) as a trace viewer reads it,
and prints its kernels for scripts/test-trace.sh.

Valid JSON with a traceEvents array; every "X" event has name, pid, tid, ts and dur, numbers in
µs, not negative; on every track (pid, tid) the events start in time order; process and thread
names are given ("M" events); flows ("s"/"f") come in pairs; no kernel lasts 0 µs. Prints
"QJSON ok <events> <kernels>" or "QJSON FAIL <why>", then
"QKERNEL <count>|<total µs>|<median µs>|<shortest µs>|<name>" per kernel name.
"""

import json
import statistics
import sys


def main(path):
    try:
        with open(path) as f:
            t = json.load(f)
    except Exception as e:
        print(f"QJSON FAIL not JSON: {e}")
        return 1
    events = t.get("traceEvents")
    if not isinstance(events, list) or not events:
        print("QJSON FAIL no traceEvents")
        return 1
    last = {}
    named = set()
    flows = {}
    kernels = {}
    for e in events:
        ph = e.get("ph")
        if ph == "M":
            named.add((e.get("pid"), e.get("name")))
            continue
        if ph in ("s", "f"):
            flows.setdefault(e.get("id"), set()).add(ph)
            continue
        if ph != "X":
            print(f"QJSON FAIL phase {ph!r}")
            return 1
        for k in ("name", "pid", "tid", "ts", "dur"):
            if k not in e:
                print(f"QJSON FAIL an X event without {k}: {e}")
                return 1
        if not isinstance(e["ts"], (int, float)) or e["ts"] < 0 or e["dur"] < 0:
            print(f"QJSON FAIL bad times: {e}")
            return 1
        key = (e["pid"], e["tid"])
        if e["ts"] < last.get(key, 0):
            print(f"QJSON FAIL not in time order on track {key}")
            return 1
        last[key] = e["ts"]
        if e.get("cat") == "kernel":
            # No kernel runs in no time: a kernel of 0 µs is a record without the GPU's times.
            if e["dur"] <= 0:
                print(f"QJSON FAIL a kernel of no duration: {e}")
                return 1
            kernels.setdefault(e["name"], []).append(e["dur"])
    if not any(n == "process_name" for _, n in named):
        print("QJSON FAIL no process names")
        return 1
    if any(v != {"s", "f"} for v in flows.values()):
        print("QJSON FAIL an unpaired flow")
        return 1
    meta = t.get("otherData", {}).get("qcuda", {})
    print(f"QJSON ok {len(events)} events, {sum(len(d) for d in kernels.values())} kernels, "
          f"timing {meta.get('timing')}, lost {meta.get('lost_records')}")
    for name, durs in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
        print(f"QKERNEL {len(durs)}|{sum(durs):.3f}|{statistics.median(durs):.3f}|{min(durs):.3f}|{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

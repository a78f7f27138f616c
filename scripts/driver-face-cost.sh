#!/usr/bin/env bash
# driver-face-cost.sh: guest-side instructions per call of the benchmark's small-call rows, with
# our libcudart.so.13 and with NVIDIA's libcudart.so.13 (PyPI nvidia-cuda-runtime 13.0.*, from
# cuda-toolchain.sh) over our libcuda.so.1, counted by callgrind. No GPU or VM: both run over the
# test double of /dev/qcuda (tests/device-double, LD_PRELOAD), whose own instructions (all inside
# its ioctl) are subtracted, as qcuda.ko's and the host's are not the guest process's either.
# Under TCG a guest call's time follows its instructions, so this is the cost the guest pays in
# its own process; the trip to the host (bench.sh, on a GPU) comes on top, the same for both.
#   scripts/driver-face-cost.sh [--calls N] [--out DIR] [--runtime ours|nvidia|both] [--keep]
#                               [--requests]
# Prints one line per row (row names as qcuda_bench's, bench/driver_face_cost.cu):
#   row  ours  nvidia  nvidia/ours        instructions per call
# --requests counts round trips instead, without valgrind: each runtime runs once with the
# double's trace (QCUDA_DOUBLE_TRACE=1), and each row prints its requests (ioctls on /dev/qcuda)
# per call and their kinds (op, flags, buffers), for both runtimes; DIR/<runtime>.requests keeps
# the trace. Exit 1 if a row's requests differ between the runtimes.
# and writes DIR/cost.csv (row,ours,nvidia,ratio); --keep leaves callgrind's dumps in DIR
# (callgrind_annotate --inclusive=yes DIR/<runtime>.out.<k> shows where a row's cost goes).
# DIR defaults to build/driver-face-cost. Exit 1 if a run fails or prints no rows.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
calls=2000 out=$root/build/driver-face-cost runtimes=(ours nvidia) keep=0 requests=0
while (($#)); do
    case $1 in
    --calls) calls=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runtime) [[ $2 == both ]] && runtimes=(ours nvidia) || runtimes=("$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    --requests) requests=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "driver-face-cost: unknown argument $1" >&2; exit 2 ;;
    esac
done
((requests)) || command -v valgrind >/dev/null || { echo "driver-face-cost: needs valgrind (scripts/setup.sh)" >&2; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
mkdir -p "$out"
rm -f "$out"/*.out*

cuda=$(bash "$here/cuda-toolchain.sh")
"$root/guest-lib/build.sh" >/dev/null
cargo build -q --release --manifest-path "$root/Cargo.toml" -p qcuda-device-double
double=$target/release/libqcuda_device_double.so
prog=$out/driver_face_cost
if [[ ! -x $prog || $root/bench/driver_face_cost.cu -nt $prog ]]; then
    "$cuda/bin/nvcc" -L"$cuda/lib" --cudart=shared -gencode 'arch=compute_90,code=[sm_90,compute_90]' \
        -o "$prog" "$root/bench/driver_face_cost.cu"
fi
# NVIDIA's runtime alone in a directory ahead of ours; libcuda.so.1 is ours either way.
mkdir -p "$out/nvidia"
cp "$cuda/lib/libcudart.so.13" "$out/nvidia/"

lib_path() { # runtime
    case $1 in
    ours) echo "$target/qcuda" ;;
    nvidia) echo "$out/nvidia:$target/qcuda" ;;
    *) echo "driver-face-cost: unknown runtime $1" >&2; exit 2 ;;
    esac
}

if ((requests)); then
    for rt in "${runtimes[@]}"; do
        path=$(lib_path "$rt")
        DRIVER_FACE_MARKS=1 QCUDA_DOUBLE_TRACE=1 LD_PRELOAD=$double LD_LIBRARY_PATH=$path \
            "$prog" "$calls" >"$out/$rt.rows" 2>"$out/$rt.requests"
    done
    # Per row: the trace lines between its marks, by kind (addresses, argument values and
    # threads left out), over the calls.
    exec python3 - "$out" "$calls" "${runtimes[@]}" <<'EOF'
import collections, re, sys
out, calls, runtimes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows, kinds = [], {}
for rt in runtimes:
    row = None
    for line in open(f"{out}/{rt}.requests", errors="replace"):
        m = re.match(r"driver-face-cost: (begin|end) (\S+)", line)
        if m:
            row = m.group(2) if m.group(1) == "begin" else None
            if row and row not in rows:
                rows.append(row)
            if row:
                kinds.setdefault(row, {})[rt] = collections.Counter()
        elif row and line.startswith("qcuda-double: "):
            kind = re.sub(r" (device|tid|args)=\S+|@0x[0-9a-f]+", "", line[14:].strip())
            kinds[row][rt][kind] += 1
differ = False
print(f"{'row':22}" + "".join(f"{rt:>10}" for rt in runtimes) + "   requests per call")
for row in rows:
    per = [kinds[row].get(rt, collections.Counter()) for rt in runtimes]
    print(f"{row:22}" + "".join(f"{sum(c.values()) / calls:10.3f}" for c in per))
    for rt, c in zip(runtimes, per):
        for kind, n in sorted(c.items()):
            print(f"    {rt:8} {n / calls:6.3f}  {kind}")
    differ |= len({tuple(sorted(c.items())) for c in per}) > 1
if differ:
    print("driver-face-cost: the runtimes' requests differ", file=sys.stderr)
    sys.exit(1)
EOF
fi

for rt in "${runtimes[@]}"; do
    path=$(lib_path "$rt")
    echo "driver-face-cost: $rt: $calls calls per row under callgrind" >&2
    LD_PRELOAD=$double LD_LIBRARY_PATH=$path valgrind -q --tool=callgrind --collect-atstart=no \
        --callgrind-out-file="$out/$rt.out" "$prog" "$calls" >"$out/$rt.rows"
    [[ -s $out/$rt.rows ]] || { echo "driver-face-cost: $rt printed no rows" >&2; exit 1; }
done

# Per dump: its row (the client request's name), total instructions, and the double's ioctl
# (inclusive) subtracted; per call.
python3 - "$out" "$calls" "${runtimes[@]}" <<'EOF'
import glob, re, subprocess, sys
out, calls, runtimes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cost = {}
for rt in runtimes:
    for f in glob.glob(f"{out}/{rt}.out.*"):
        text = open(f, errors="replace").read()
        m = re.search(r"^desc: Trigger: Client Request: (\S+)", text, re.M)
        total = re.search(r"^summary: (\d+)", text, re.M)
        if not m or not total:
            continue
        ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", f],
                             capture_output=True, text=True, check=True).stdout
        double = 0
        for line in ann.splitlines():
            d = re.match(r"\s*([\d,]+) .*:ioctl \[.*libqcuda_device_double\.so\]", line)
            if d:
                double = int(d.group(1).replace(",", ""))
        cost.setdefault(m.group(1), {})[rt] = (int(total.group(1)) - double) / calls
order = [l.split(",")[0] for l in open(f"{out}/{runtimes[0]}.rows") if "," in l]
with open(f"{out}/cost.csv", "w") as csv:
    csv.write("row," + ",".join(runtimes) + (",ratio" if len(runtimes) == 2 else "") + "\n")
    print(f"{'row':22}" + "".join(f"{rt:>10}" for rt in runtimes) +
          (f"{'nvidia/ours':>13}" if len(runtimes) == 2 else ""))
    for row in order:
        v = [cost.get(row, {}).get(rt) for rt in runtimes]
        if None in v:
            print(f"driver-face-cost: no dump for {row}", file=sys.stderr)
            sys.exit(1)
        ratio = v[1] / v[0] if len(v) == 2 and v[0] else None
        csv.write(f"{row}," + ",".join(f"{x:.0f}" for x in v) +
                  (f",{ratio:.2f}" if ratio else "") + "\n")
        print(f"{row:22}" + "".join(f"{x:10.0f}" for x in v) +
              (f"{ratio:13.2f}" if ratio else ""))
EOF
((keep)) || rm -f "$out"/*.out*

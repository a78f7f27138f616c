#!/usr/bin/env bash
# driver-face-cost.sh: guest-side instructions per call of the benchmark's small-call rows, with
# our libcudart.so.13 and with NVIDIA's libcudart.so.13 (PyPI nvidia-cuda-runtime 13.0.*, from
# cuda-toolchain.sh) over our libcuda.so.1, counted by callgrind. No GPU or VM: both run over the
# test double of /dev/qcuda (tests/device-double, LD_PRELOAD), whose own instructions (all inside
# its ioctl) are subtracted, as qcuda.ko's and the host's are not the guest process's either.
# Under TCG a guest call's time follows its instructions, so this is the cost the guest pays in
# its own process; the trip to the host (bench.sh, on a GPU) comes on top, the same for both.
#   scripts/driver-face-cost.sh [--calls N] [--out DIR] [--runtime ours|nvidia|both] [--keep]
# Prints one line per row (row names as qcuda_bench's, bench/driver_face_cost.cu):
#   row  ours  nvidia  nvidia/ours        instructions per call
# and writes DIR/cost.csv (row,ours,nvidia,ratio); --keep leaves callgrind's dumps in DIR
# (callgrind_annotate --inclusive=yes DIR/<runtime>.out.<k> shows where a row's cost goes).
# DIR defaults to build/driver-face-cost. Exit 1 if a run fails or prints no rows.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
calls=2000 out=$root/build/driver-face-cost runtimes=(ours nvidia) keep=0
while (($#)); do
    case $1 in
    --calls) calls=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runtime) [[ $2 == both ]] && runtimes=(ours nvidia) || runtimes=("$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "driver-face-cost: unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "driver-face-cost: needs valgrind (scripts/setup.sh)" >&2; exit 1; }
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

for rt in "${runtimes[@]}"; do
    case $rt in
    ours) path=$target/qcuda ;;
    nvidia) path=$out/nvidia:$target/qcuda ;;
    *) echo "driver-face-cost: unknown runtime $rt" >&2; exit 2 ;;
    esac
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

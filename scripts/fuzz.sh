#!/usr/bin/env bash
# fuzz.sh: coverage-guided fuzzing (cargo fuzz, libFuzzer + AddressSanitizer) of everything that
# parses guest or peer input: qcuda-proto's decoders, vhost-cuda's chain decoder and dispatcher
# (over the fake CUDA driver), the worker's request decoding and guest-RAM rebuild, and the
# fatbin parsers of guest-lib and the host. Targets: fuzz/fuzz_targets/*.rs; docs/SECURITY.md.
#
#   scripts/fuzz.sh [--runs N] [--time S] [--seed N] [--jobs N] [--scratch] [--save-seeds]
#                   [TARGET...]
#
# Defaults: every target, 10 million executions each, one after another, one worker (the
# machine is shared). --time S bounds each target to S seconds instead (--runs still applies).
# The corpus grows in fuzz/corpus/TARGET (not versioned), seeded from fuzz/seeds/TARGET.tar.gz
# (a minimised corpus of a long run; --scratch: a temporary corpus from the seeds alone, so a
# seeded run repeats); a crash leaves its input in fuzz/artifacts/TARGET and ends the run with a
# non-zero status. --save-seeds replaces the seeds by the minimised corpus. The last line per
# target is "fuzz TARGET: N runs, corpus C files (B bytes), T s".
#
# Only a stable toolchain is needed: RUSTC_BOOTSTRAP=1 lets it take the sanitizer flags.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"
runs=10000000 time_s=0 seed=0 jobs=1 scratch=0 save=0 targets=()
while (($#)); do
    case $1 in
    --runs) runs=$2; shift 2 ;;
    --time) time_s=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --scratch) scratch=1; shift ;;
    --save-seeds) save=1; shift ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
    esac
done
export RUSTC_BOOTSTRAP=1
FUZZ=$QCUDA_CARGO_FUZZ
if [[ ! -x $FUZZ ]] && command -v cargo-fuzz >/dev/null &&
    cargo-fuzz --version | grep -qF " $QCUDA_CARGO_FUZZ_VERSION"; then
    FUZZ=$(command -v cargo-fuzz)
elif [[ ! -x $FUZZ ]]; then
    echo "fuzz.sh: cargo install cargo-fuzz $QCUDA_CARGO_FUZZ_VERSION into ${QCUDA_CARGO_FUZZ%/bin/*}"
    cargo install --locked --quiet cargo-fuzz --version "$QCUDA_CARGO_FUZZ_VERSION" \
        --root "${QCUDA_CARGO_FUZZ%/bin/*}"
fi
cd "$ROOT/fuzz"
((${#targets[@]})) || mapfile -t targets < <("$FUZZ" list)
# Built once, then the binaries run directly: a run never rebuilds from a tree edited meanwhile.
"$FUZZ" build >/dev/null 2>&1 || "$FUZZ" build
bin=$ROOT/fuzz/target/x86_64-unknown-linux-gnu/release
# From here on every target runs and reports, whatever happened to the one before.
set +e
rc=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in "${targets[@]}"; do
    corpus=$ROOT/fuzz/corpus/$t
    ((scratch)) && corpus=$tmp/$t
    mkdir -p "$corpus" "$ROOT/fuzz/artifacts/$t"
    args=(-runs="$runs" -seed="$seed" -print_final_stats=1 -artifact_prefix="$ROOT/fuzz/artifacts/$t/")
    ((time_s > 0)) && args+=(-max_total_time="$time_s")
    ((jobs > 1)) && args+=(-jobs="$jobs" -workers="$jobs")
    dirs=("$corpus")
    if [[ -f $ROOT/fuzz/seeds/$t.tar.gz ]]; then
        mkdir -p "$tmp/seeds-$t"
        tar -xzf "$ROOT/fuzz/seeds/$t.tar.gz" -C "$tmp/seeds-$t"
        dirs+=("$tmp/seeds-$t")
    fi
    t0=$SECONDS log=$ROOT/fuzz/artifacts/$t/last-run.log
    if ! ASAN_OPTIONS=detect_odr_violation=0 "$bin/$t" "${args[@]}" "${dirs[@]}" >"$log" 2>&1; then
        echo "fuzz $t: FAILED (log: ${log#"$ROOT"/}; inputs in fuzz/artifacts/$t/)"
        grep -E 'panicked|ERROR|SUMMARY' "$log" | head -n 5
        rc=1
        continue
    fi
    n=$(awk '/stat::number_of_executed_units/ { s += $2 } END { print s + 0 }' "$log")
    if ((save)); then
        mkdir -p "$tmp/min-$t" "$ROOT/fuzz/seeds"
        ASAN_OPTIONS=detect_odr_violation=0 "$bin/$t" -merge=1 "$tmp/min-$t" "${dirs[@]}" >>"$log" 2>&1 &&
            tar -czf "$ROOT/fuzz/seeds/$t.tar.gz" --sort=name --owner=0 --group=0 --mtime=@0 -C "$tmp/min-$t" . &&
            echo "fuzz $t: seeds saved, $(find "$tmp/min-$t" -type f | wc -l) files"
    fi
    echo "fuzz $t: $n runs, corpus $(find "$corpus" -type f | wc -l) files" \
        "($(du -sb "$corpus" | cut -f1) bytes), $((SECONDS - t0)) s"
done
exit $rc

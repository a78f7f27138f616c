# shellcheck shell=bash
# lib.sh: the facts the qcuda build scripts share, in one place. `source` it; guest-kmod/Makefile
# reads it too. (run-vm.sh repeats QCUDA_CACHE's default: it also runs from the release bundle,
# where this file is not.)

# Root of the build caches (QEMU, guest kernel, bindgen, the CUDA toolchain venv).
QCUDA_CACHE=${QCUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qcuda}
# bindgen-cli that builds the guest kernel's Rust bindings (cargo install).
QCUDA_BINDGEN_VERSION=0.73.2
QCUDA_BINDGEN=$QCUDA_CACHE/bindgen-$QCUDA_BINDGEN_VERSION/bin/bindgen
# cargo-fuzz that builds and runs the fuzz targets in fuzz/ (cargo install; scripts/fuzz.sh).
QCUDA_CARGO_FUZZ_VERSION=0.13.2
QCUDA_CARGO_FUZZ=$QCUDA_CACHE/cargo-fuzz-$QCUDA_CARGO_FUZZ_VERSION/bin/cargo-fuzz
# rust-vmm's virtiofsd, the vhost-user daemon behind run-vm.sh --share (scripts/build-virtiofsd.sh
# installs it there with libseccomp and libcap-ng linked in statically).
QCUDA_VIRTIOFSD_VERSION=1.14.0
QCUDA_VIRTIOFSD=$QCUDA_CACHE/virtiofsd-$QCUDA_VIRTIOFSD_VERSION/bin/virtiofsd
# The kernel Makefile sets RUSTC = rustc, which would find rustup's toolchain (no rust-src, and a
# different version than the one the kernel was built with): these go on every make line of the
# guest kernel and of qcuda.ko, configuration steps included.
QCUDA_KMAKE_FLAGS=(ARCH=x86_64 RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
    HOSTRUSTC=/usr/bin/rustc "BINDGEN=$QCUDA_BINDGEN")

# Keyed cache entries of one kind (PREFIX-<hash>) would pile up as their inputs change (a kernel
# tree is ~2.5 GiB): called before KEEP is built or used, it marks KEEP as used now and removes all but the `keep` most recently used of
# its kind (default 2: a second checkout building other inputs beside this one keeps its own).
# An entry whose lock another builder holds is left alone.
qcuda_cache_prune() { # PREFIX KEEP [keep]
    local prefix=$1 keep_dir=$2 keep=${3:-2} d t n=1
    mkdir -p "$keep_dir" && touch "$keep_dir/.qcuda-used" 2>/dev/null || return 0
    local -a entries=()
    for d in "$QCUDA_CACHE/$prefix"-*/; do
        d=${d%/}
        [[ -d $d && $d != "$keep_dir" ]] || continue
        # Only this kind's keys (disk-<key>, not disk-base-<key>).
        [[ ${d##*/"$prefix"-} != *-* ]] || continue
        t=$(stat -c %Y "$d/.qcuda-used" 2>/dev/null || stat -c %Y "$d")
        entries+=("$t $d")
    done
    ((${#entries[@]})) || return 0
    while IFS= read -r d; do
        d=${d#* }
        n=$((n + 1))
        ((n <= keep)) && continue
        (
            exec 7>"$d.lock"
            flock -n 7 || exit 0
            printf '[cache] removing %s (older inputs than %s)\n' "$d" "${keep_dir##*/}" >&2
            rm -rf "$d" "$d.log" "$d.lock"
        )
    done < <(printf '%s\n' "${entries[@]}" | sort -rn)
}

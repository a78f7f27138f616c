#!/usr/bin/env bash
# Regenerates the CUDA 13.0 ABI types guest-lib uses, from the headers of the PyPI wheels
# (scripts/cuda-toolchain.sh):
#
#   src/generated/cuda_types.rs   bindgen: the enums (but cudaError) as plain consts with
#                                 CUDA's own names, dim3/uint3, cudaDeviceProp, cudaPointerAttributes,
#                                 cudaFuncAttributes, cudaChannelFormatDesc, the handle types, the
#                                 flag macros, and the driver's CUdevice_attribute ids (cuda.h).
#   src/generated/runtime_api.rs  bindgen: the prototype of every export of gen/exports.txt that
#                                 cuda_runtime_api.h declares, the `_ptsz`/`_ptds` ones from a
#                                 second pass with CUDA_API_PER_THREAD_DEFAULT_STREAM, plus the
#                                 types only they use. api/'s macros check every export's
#                                 signature against these at compile time; nothing calls them.
#   ../qcuda-proto/src/cuda_errors/table.rs
#                                 gen/error-table.py: a constant, name and description for every
#                                 cudaError_t, shared by guest-lib (cudaGetErrorName/String) and
#                                 vhost-cuda (driver codes to runtime codes).
#
# All are checked in. bindgen-cli 0.73.2 is used from $QCUDA_CACHE/bindgen-0.73.2 (shared with
# scripts/build-guest.sh) and installed there if missing. libclang: LIBCLANG_PATH if set, else
# /usr/lib/llvm-22/lib when present (bookworm's libclang 14 also works for these C headers).
set -euo pipefail

gen=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lib=$(dirname "$gen")
out=$lib/src/generated
CACHE=${QCUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qcuda}
BINDGEN_VERSION=0.73.2
BINDGEN=$CACHE/bindgen-$BINDGEN_VERSION/bin/bindgen

if [ ! -x "$BINDGEN" ]; then
    echo "bindgen.sh: installing bindgen-cli $BINDGEN_VERSION into $CACHE/bindgen-$BINDGEN_VERSION" >&2
    cargo install --locked --root "$CACHE/bindgen-$BINDGEN_VERSION" bindgen-cli --version "$BINDGEN_VERSION" >&2
fi
if [ -z "${LIBCLANG_PATH:-}" ] && [ -d /usr/lib/llvm-22/lib ]; then
    export LIBCLANG_PATH=/usr/lib/llvm-22/lib
fi

root=$("$lib/../scripts/cuda-toolchain.sh")
inc=$root/include
wheel=$(basename "$(ls -d "$root"/../../nvidia_cuda_runtime-*.dist-info | head -n1)" .dist-info)

# Not cudaError/cudaError_t: the codes are qcuda-proto's (error-table.py, below), shared with
# vhost-cuda; src/generated/mod.rs defines cudaError_t over them.
types=(
    dim3 uint3
    cudaDeviceProp cudaUUID_t
    cudaMemcpyKind cudaMemoryType cudaPointerAttributes
    cudaFuncAttributes cudaFuncAttribute cudaFuncCache cudaSharedMemConfig cudaLimit
    cudaChannelFormatDesc cudaChannelFormatKind
    cudaDeviceAttr CUdevice_attribute
    cudaStreamCaptureStatus cudaStreamCaptureMode
    cudaStream_t cudaEvent_t cudaKernel_t cudaFunction_t
    cudaExtent cudaPitchedPtr cudaPos cudaMemcpy3DParms cudaMemcpy3DPeerParms
    cudaArray_t cudaArray_const_t cudaMipmappedArray_t cudaMipmappedArray_const_t
    cudaResourceDesc cudaResourceType cudaResourceViewDesc cudaResourceViewFormat
    cudaTextureDesc cudaTextureAddressMode cudaTextureFilterMode cudaTextureReadMode
    cudaTextureObject_t cudaSurfaceObject_t
    cudaMemPool_t cudaMemPoolProps cudaMemPoolAttr cudaMemLocation cudaMemLocationType
    cudaMemAccessDesc cudaMemAccessFlags cudaMemAllocationType cudaMemAllocationHandleType
    cudaLaunchConfig_t cudaLaunchAttribute cudaLaunchAttributeID cudaLaunchAttributeValue
    cudaDeviceP2PAttr
    cudaGraph_t cudaGraphNode_t cudaGraphExec_t cudaGraphNodeType cudaGraphEdgeData
    cudaKernelNodeParams cudaMemsetParams cudaHostFn_t cudaHostNodeParams
    cudaGraphInstantiateParams cudaGraphExecUpdateResultInfo cudaGraphExecUpdateResult
    cudaGraphInstantiateResult cudaGraphDebugDotFlags cudaGraphMemAttributeType cudaGraphNodeParams
    cudaMemAllocNodeParams
)
vars=(
    'cudaHostAlloc[A-Za-z]*' 'cudaHostRegister[A-Za-z]*'
    'cudaStreamDefault' 'cudaStreamNonBlocking'
    'cudaEvent(Default|BlockingSync|DisableTiming|Interprocess)'
    'cudaEventRecord(Default|External)' 'cudaEventWait(Default|External)'
    'cudaDevice(Schedule[A-Za-z]*|BlockingSync|MapHost|LmemResizeToMax|SyncMemops|Mask)'
    'CUDART_VERSION'
    'cudaArray(Default|Layered|SurfaceLoadStore|Cubemap|TextureGather|ColorAttachment|SparseTransferable|Sparse|DeferredMapping)'
    'cudaStream(Add|Set)CaptureDependencies'
)
mapfile -t exports <"$gen/exports.txt"
mapfile -t per_thread < <(grep -E '_pt(sz|ds)$' "$gen/exports.txt")
join() { local IFS='|'; echo "$*"; }
# The type names a generated file defines (types, structs, unions, aliases like cudaError_t).
defined() { grep -hoP '^pub (type|struct|union) \K\w+|^pub use self::\w+ as \K\w+' "$@" | sort -u; }

wrapper=$(mktemp --suffix=.h)
ptds_wrapper=$(mktemp --suffix=.h)
trap 'rm -f "$wrapper" "$ptds_wrapper"' EXIT
printf '#include <cuda.h>\n#include <cuda_runtime_api.h>\n' >"$wrapper"
printf '#define CUDA_API_PER_THREAD_DEFAULT_STREAM\n#include <cuda_runtime_api.h>\n' >"$ptds_wrapper"

{
    echo "// Generated by guest-lib/gen/bindgen.sh (bindgen $BINDGEN_VERSION) from the CUDA headers of"
    echo "// $wheel. Do not edit: rerun the script."
    echo
    "$BINDGEN" "$wrapper" \
        --no-prepend-enum-name \
        --default-enum-style consts \
        --allowlist-type "^($(join "${types[@]}"))\$" \
        --allowlist-var "^($(join "${vars[@]}"))\$" \
        --with-derive-default \
        --ctypes-prefix ::core::ffi \
        --rust-edition 2021 \
        --rust-target 1.85 \
        -- -I"$inc" -x c
} >"$out/cuda_types.rs.tmp"
mv "$out/cuda_types.rs.tmp" "$out/cuda_types.rs"

# The prototypes. Types cuda_types.rs already defines are left out and taken from there, so
# that an export and its prototype name the very same types; so is cudaError_t (mod.rs).
prototypes() { # <wrapper> <function regex> <file defining the types to leave out>...
    local header=$1 functions=$2
    shift 2
    mapfile -t known < <(defined "$@"; echo cudaError; echo cudaError_t)
    "$BINDGEN" "$header" \
        --no-prepend-enum-name \
        --default-enum-style consts \
        --allowlist-function "$functions" \
        --blocklist-type "^($(join "${known[@]}"))\$" \
        --no-doc-comments \
        --no-layout-tests \
        --merge-extern-blocks \
        --ctypes-prefix ::core::ffi \
        --rust-edition 2021 \
        --rust-target 1.85 \
        -- -I"$inc" -x c
}
{
    echo "// Generated by guest-lib/gen/bindgen.sh (bindgen $BINDGEN_VERSION) from cuda_runtime_api.h of"
    echo "// $wheel. Do not edit: rerun the script."
    echo
    echo "use super::{cuda_types::*, cudaError_t};"
    echo
    prototypes "$wrapper" "^($(join "${exports[@]}"))\$" "$out/cuda_types.rs"
} >"$out/runtime_api.rs.tmp"
prototypes "$ptds_wrapper" "^($(join "${per_thread[@]}"))\$" "$out/cuda_types.rs" "$out/runtime_api.rs.tmp" \
    | grep -v '^/\* automatically generated' >>"$out/runtime_api.rs.tmp"
mv "$out/runtime_api.rs.tmp" "$out/runtime_api.rs"

errors=$lib/../qcuda-proto/src/cuda_errors/table.rs
python3 "$gen/error-table.py" "$inc/driver_types.h" "$wheel" >"$errors.tmp"
mv "$errors.tmp" "$errors"

# The driver API (libcuda.so.1's face): every type, constant and prototype of cuda.h, in a module
# of its own (generated::driver), so that its types never mix with the runtime's.
{
    echo "// Generated by guest-lib/gen/bindgen.sh (bindgen $BINDGEN_VERSION) from cuda.h of"
    echo "// $wheel. Do not edit: rerun the script."
    echo
    "$BINDGEN" "$inc/cuda.h" \
        --no-prepend-enum-name \
        --default-enum-style consts \
        --allowlist-function '^cu[A-Z].*' \
        --allowlist-type '^(CU|cu).*' \
        --allowlist-var '^CU.*' \
        --no-doc-comments \
        --no-layout-tests \
        --merge-extern-blocks \
        --with-derive-default \
        --ctypes-prefix ::core::ffi \
        --rust-edition 2021 \
        --rust-target 1.85 \
        -- -I"$inc" -x c
} >"$out/driver_api.rs.tmp"
mv "$out/driver_api.rs.tmp" "$out/driver_api.rs"
# Every form of every entry point cuGetProcAddress knows, and libcuda.so.1's export list.
python3 "$gen/driver-entry-points.py" "$inc" "$wheel" "$gen" "$out"

rustfmt --edition 2021 "$out/cuda_types.rs" "$out/runtime_api.rs" "$out/driver_api.rs" \
    "$out/driver_tables.rs" "$errors"
echo "bindgen.sh: wrote $out/{cuda_types,runtime_api,driver_api,driver_tables}.rs," \
    "gen/driver-exports.txt and $errors from $wheel" >&2

// SPDX-License-Identifier: Apache-2.0 OR MIT
// guest-lib smoke test: an ordinary nvcc program (--cudart=shared) run against our
// libcudart.so.13 on a machine without /dev/qcuda. Registration runs before main and must not
// need a device; every call that needs one fails with cudaErrorNoDevice; the error functions,
// version queries and an unsupported call behave as documented in docs/guest-lib.md.
// tests/smoke.rs builds and runs it; it prints "SMOKE OK" and exits 0, or "SMOKE FAIL: ..." and 1.
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

__device__ int counter;
__constant__ float scale[4];

template <typename T> __global__ void axpy(T a, const T *x, T *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] * scale[0] + y[i] + counter;
}

__global__ void empty_kernel() {}

// The hidden launch API as nvcc's stubs call it (declared in crt/host_runtime.h, which only the
// generated stub includes).
extern "C" cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                                  void *stream);

static int failures = 0;

#define EXPECT(call, want)                                                                       \
    do {                                                                                         \
        cudaError_t got_ = (call);                                                               \
        if (got_ != (want)) {                                                                    \
            std::printf("SMOKE FAIL: %s returned %s (%d), expected %s\n", #call,                 \
                        cudaGetErrorName(got_), (int)got_, cudaGetErrorName(want));              \
            failures++;                                                                          \
        }                                                                                        \
    } while (0)

int main()
{
    int version = 0;
    EXPECT(cudaRuntimeGetVersion(&version), cudaSuccess);
    if (version != 13000) {
        std::printf("SMOKE FAIL: runtime version %d\n", version);
        failures++;
    }

    int count = -1;
    EXPECT(cudaGetDeviceCount(&count), cudaErrorNoDevice);
    std::printf("device count: %d\n", count);
    if (count != 0) {
        std::printf("SMOKE FAIL: count %d, expected 0\n", count);
        failures++;
    }
    EXPECT(cudaPeekAtLastError(), cudaErrorNoDevice);
    EXPECT(cudaGetLastError(), cudaErrorNoDevice);
    EXPECT(cudaGetLastError(), cudaSuccess);

    if (std::strcmp(cudaGetErrorName(cudaErrorNoDevice), "cudaErrorNoDevice") != 0 ||
        std::strlen(cudaGetErrorString(cudaErrorNoDevice)) < 10 ||
        std::strcmp(cudaGetErrorName((cudaError_t)12345), "unrecognized error code") != 0) {
        std::printf("SMOKE FAIL: error strings\n");
        failures++;
    }
    std::printf("no device: %s\n", cudaGetErrorString(cudaErrorNoDevice));

    int driver = -1;
    EXPECT(cudaDriverGetVersion(&driver), cudaSuccess);
    if (driver != 0) {
        std::printf("SMOKE FAIL: driver version %d without a device\n", driver);
        failures++;
    }

    float *x = nullptr;
    EXPECT(cudaMalloc(&x, 1024), cudaErrorNoDevice);
    EXPECT(cudaSetDevice(0), cudaErrorNoDevice);
    cudaDeviceProp prop;
    EXPECT(cudaGetDeviceProperties(&prop, 0), cudaErrorNoDevice);
    float s[4] = {1, 2, 3, 4};
    EXPECT(cudaMemcpyToSymbol(scale, s, sizeof s), cudaErrorNoDevice);

    axpy<float><<<4, 256>>>(2.0f, x, x, 1024);
    EXPECT(cudaGetLastError(), cudaErrorNoDevice);
    empty_kernel<<<1, 1>>>();
    EXPECT(cudaGetLastError(), cudaErrorNoDevice);
    EXPECT(cudaLaunchKernel((const void *)empty_kernel, dim3(1), dim3(1), nullptr, 0, 0),
           cudaErrorNoDevice);
    EXPECT(cudaDeviceSynchronize(), cudaErrorNoDevice);

    // By-value structs cross the ABI intact: dim3 pairs in registers, a 20-byte struct returned
    // through memory.
    if (__cudaPushCallConfiguration(dim3(1, 2, 3), dim3(4, 5, 6), 77, (cudaStream_t)0x1234) != 0) {
        std::printf("SMOKE FAIL: __cudaPushCallConfiguration refused\n");
        failures++;
    }
    dim3 g, b;
    size_t smem = 0;
    cudaStream_t st = nullptr;
    EXPECT(__cudaPopCallConfiguration(&g, &b, &smem, &st), cudaSuccess);
    if (g.x != 1 || g.y != 2 || g.z != 3 || b.x != 4 || b.y != 5 || b.z != 6 || smem != 77 ||
        st != (cudaStream_t)0x1234) {
        std::printf("SMOKE FAIL: popped <<<(%u,%u,%u), (%u,%u,%u), %zu, %p>>>\n", g.x, g.y, g.z,
                    b.x, b.y, b.z, smem, (void *)st);
        failures++;
    }
    EXPECT(__cudaPopCallConfiguration(&g, &b, &smem, &st), cudaErrorMissingConfiguration);
    EXPECT(cudaGetLastError(), cudaErrorMissingConfiguration);
    cudaChannelFormatDesc desc = cudaCreateChannelDesc(8, 16, 32, 0, cudaChannelFormatKindFloat);
    if (desc.x != 8 || desc.y != 16 || desc.z != 32 || desc.w != 0 ||
        desc.f != cudaChannelFormatKindFloat) {
        std::printf("SMOKE FAIL: cudaCreateChannelDesc\n");
        failures++;
    }

    // Proves this is qcuda's library: NVIDIA's answers cudaErrorNoDevice or
    // cudaErrorInsufficientDriver here, ours cudaErrorNotSupported (and warns once on stderr).
    EXPECT(cudaDestroyExternalSemaphore(nullptr), cudaErrorNotSupported);
    EXPECT(cudaDestroyExternalSemaphore(nullptr), cudaErrorNotSupported);
    EXPECT(cudaGetLastError(), cudaErrorNotSupported);

    if (failures) {
        std::printf("SMOKE FAIL: %d checks failed\n", failures);
        return 1;
    }
    std::printf("SMOKE OK\n");
    return 0;
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// A copy of more than 1 GiB each way: host pattern -> device, a kernel transforms every word in
// place, device -> host and verify; then a device-to-device copy into a second allocation and
// back, verified again. The size is not a multiple of any chunk size, so the transport's
// splitting of large copies is exercised including its tail. Reports GB/s for each leg.
//
// Usage: large_copy [MiB]   (default: 1024 MiB plus 4100 bytes)
//        large_copy --hold [MiB]   holds both device allocations and launches the kernel again
//                                  and again until killed: it prints "HOLDING <bytes>" (device
//                                  memory it allocated) once, then "progress <kernels>" every
//                                  100 kernels (the kill checks of run-gpu-tests.sh and
//                                  two-vm-test.sh)
#define TEST_NAME "large_copy"
#include "selfcheck.cuh"

#include <cstdint>
#include <cstring>

static uint32_t pattern(size_t i) { return (uint32_t)(i * 2654435761u) ^ 0x5a5aa5a5u; }

// What the kernel makes of word i.
__host__ __device__ static uint32_t transformed(uint32_t x, size_t i)
{
    return ~x + (uint32_t)(i >> 7);
}

__global__ void transform_words(uint32_t *w, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] = transformed(w[i], i);
}

static void report(const char *leg, size_t bytes, double secs)
{
    std::printf("large_copy: %-26s %8.3f s  %7.2f GB/s\n", leg, secs, bytes / secs / 1e9);
    std::fflush(stdout); // progress a watcher can see (run-gpu-tests.sh kills it mid-run)
}

// Returns the index of the first word that is not transformed(pattern(i), i), or n.
static size_t first_mismatch(const uint32_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (w[i] != transformed(pattern(i), i))
            return i;
    return n;
}

int main(int argc, char **argv)
{
    require_device();
    size_t words = ((size_t)1 << 28) + 1025; // 1 GiB + 4100 bytes
    bool hold = argc > 1 && std::strcmp(argv[1], "--hold") == 0;
    int size_arg = hold ? 2 : 1;
    if (argc > size_arg)
        words = (size_t)std::strtoull(argv[size_arg], nullptr, 0) * (1u << 20) / 4 + 1025;
    const size_t bytes = words * sizeof(uint32_t);
    std::printf("large_copy: %zu bytes (%.3f GiB)\n", bytes, bytes / 1073741824.0);

    uint32_t *host = (uint32_t *)std::malloc(bytes);
    if (!host)
        fail("host malloc of %zu bytes failed", bytes);
    for (size_t i = 0; i < words; i++)
        host[i] = pattern(i);

    uint32_t *d1, *d2;
    CHECK(cudaMalloc(&d1, bytes));
    CHECK(cudaMalloc(&d2, bytes));

    double t = now_seconds();
    CHECK(cudaMemcpy(d1, host, bytes, cudaMemcpyHostToDevice));
    report("host to device", bytes, now_seconds() - t);

    transform_words<<<1024, 256>>>(d1, words);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    if (hold) {
        std::printf("HOLDING %zu\n", 2 * bytes);
        std::fflush(stdout);
        for (unsigned long long k = 1;; k++) {
            transform_words<<<1024, 256>>>(d2, words);
            CHECK_LAUNCH();
            if (k % 100 == 0) {
                CHECK(cudaDeviceSynchronize());
                std::printf("progress %llu\n", k);
                std::fflush(stdout);
            }
        }
    }

    std::memset(host, 0, bytes);
    t = now_seconds();
    CHECK(cudaMemcpy(host, d1, bytes, cudaMemcpyDeviceToHost));
    report("device to host", bytes, now_seconds() - t);
    size_t bad = first_mismatch(host, words);
    if (bad != words)
        fail("after HtoD, kernel, DtoH: word %zu (byte %zu) = 0x%08x, expected 0x%08x", bad,
             bad * 4, host[bad], transformed(pattern(bad), bad));

    // Device to device. Clear d2 first so stale contents cannot pass for a copy.
    CHECK(cudaMemset(d2, 0, bytes));
    t = now_seconds();
    CHECK(cudaMemcpy(d2, d1, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaDeviceSynchronize());
    report("device to device", bytes, now_seconds() - t);
    std::memset(host, 0, bytes);
    CHECK(cudaMemcpy(host, d2, bytes, cudaMemcpyDeviceToHost));
    bad = first_mismatch(host, words);
    if (bad != words)
        fail("after DtoD: word %zu (byte %zu) = 0x%08x, expected 0x%08x", bad, bad * 4, host[bad],
             transformed(pattern(bad), bad));

    CHECK(cudaFree(d1));
    CHECK(cudaFree(d2));
    std::free(host);
    return pass();
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// Async copies into and out of pinned memory are stream-ordered and complete exactly when the
// stream or an event says so: a long kernel holds the stream, so a copy queued behind it must
// not have landed while cudaEventQuery says not ready, and must have landed once the event (or
// the stream) completes. Also: a pinned buffer reused across streams, and cudaMemcpyAsync
// returning before the copy is done.
#define TEST_NAME "pinned_async"
#include "selfcheck.cuh"

#include <cstring>

// Spins for about `cycles` clock ticks, then writes `value` everywhere.
__global__ void slow_fill(unsigned int *p, int n, unsigned int value, long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = value;
}

int main()
{
    require_device();
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const long long half_second = (long long)clock_khz * 500;
    const int n = 16 << 20; // 64 MiB
    const size_t bytes = n * sizeof(unsigned int);
    unsigned int *host = nullptr, *dev = nullptr;
    CHECK(cudaMallocHost(&host, bytes));
    CHECK(cudaMalloc(&dev, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t done;
    CHECK(cudaEventCreate(&done));

    // Device -> pinned host, behind a half-second kernel.
    for (int i = 0; i < n; i++)
        host[i] = 0xdeadbeef;
    slow_fill<<<128, 256, 0, s>>>(dev, n, 0x1234u, half_second);
    CHECK_LAUNCH();
    double t0 = now_seconds();
    CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaEventRecord(done, s));
    double queued = now_seconds() - t0;
    cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess)
        fail("the event completed while a half-second kernel was still running");
    if (q != cudaErrorNotReady)
        fail("cudaEventQuery returned %s", cudaGetErrorName(q));
    if (host[0] != 0xdeadbeef || host[n - 1] != 0xdeadbeef)
        fail("the async copy landed before the kernel it is queued behind finished");
    std::printf("cudaMemcpyAsync D2H of 64 MiB returned after %.3f ms, before the copy ran\n",
                queued * 1e3);
    CHECK(cudaEventSynchronize(done));
    for (int i = 0; i < n; i += 4099)
        if (host[i] != 0x1234u)
            fail("after the event, element %d is %#x", i, host[i]);
    if (host[n - 1] != 0x1234u)
        fail("after the event, the last element is %#x", host[n - 1]);

    // Pinned host -> device, then back through another stream ordered by an event.
    for (int i = 0; i < n; i++)
        host[i] = (unsigned int)i * 2654435761u;
    CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaEventRecord(done, s));
    cudaStream_t s2;
    CHECK(cudaStreamCreate(&s2));
    CHECK(cudaStreamWaitEvent(s2, done, 0));
    unsigned int *back = nullptr;
    CHECK(cudaHostAlloc(&back, bytes, cudaHostAllocDefault));
    std::memset(back, 0, bytes);
    CHECK(cudaMemcpyAsync(back, dev, bytes, cudaMemcpyDeviceToHost, s2));
    CHECK(cudaStreamSynchronize(s2));
    if (std::memcmp(back, host, bytes) != 0)
        fail("pinned round trip through two streams differs");
    if (cudaStreamQuery(s) != cudaSuccess || cudaStreamQuery(s2) != cudaSuccess)
        fail("streams not idle after synchronising");

    CHECK(cudaFreeHost(back));
    CHECK(cudaFreeHost(host));
    CHECK(cudaFree(dev));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(s2));
    return pass();
}

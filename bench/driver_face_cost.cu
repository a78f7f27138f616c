// SPDX-License-Identifier: Apache-2.0 OR MIT
// driver_face_cost: the small-call rows of qcuda_bench (same names, same calls), each run N times
// between callgrind client requests, so that `valgrind --tool=callgrind --collect-atstart=no`
// dumps the instructions of exactly those N calls, one dump per row named after the row.
// scripts/driver-face-cost.sh runs it over our libcudart.so.13 and over NVIDIA's (both over our
// libcuda.so.1 and the test double of /dev/qcuda, tests/device-double) and divides.
//
// Outside valgrind the client requests do nothing: the program runs the rows, checks every
// answer and prints "row,calls" lines; a failed call is FAIL (exit 1). With DRIVER_FACE_MARKS=1
// it also writes "driver-face-cost: begin ROW" and "... end ROW" on stderr around each row's
// counted calls, so that the double's trace of requests (QCUDA_DOUBLE_TRACE) splits into rows.
//   driver_face_cost [N]        (default 2000 calls per row)
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>
#include <valgrind/callgrind.h>

__global__ void empty_kernel() {}

#define NEED(x)                                                                                    \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            std::printf("FAIL driver_face_cost: %s: %s\n", #x, cudaGetErrorName(e_));              \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

// Ten warm-up calls (first-use work: lookups, caches), then n counted ones.
template <class Op> void row(const char *name, int n, Op op)
{
    static const bool marks = std::getenv("DRIVER_FACE_MARKS") != nullptr;
    for (int i = 0; i < 10; i++)
        op(i);
    if (marks)
        std::fprintf(stderr, "driver-face-cost: begin %s\n", name);
    CALLGRIND_ZERO_STATS;
    CALLGRIND_TOGGLE_COLLECT;
    for (int i = 0; i < n; i++)
        op(i);
    CALLGRIND_TOGGLE_COLLECT;
    if (marks)
        std::fprintf(stderr, "driver-face-cost: end %s\n", name);
    CALLGRIND_DUMP_STATS_AT(name);
    std::printf("%s,%d\n", name, n);
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? std::atoi(argv[1]) : 2000;
    NEED(cudaFree(nullptr));
    cudaStream_t stream;
    NEED(cudaStreamCreate(&stream));
    cudaEvent_t event;
    NEED(cudaEventCreate(&event));
    void *dev = nullptr;
    NEED(cudaMalloc(&dev, 4));

    // The launch's own cost; the batch it joins goes out as it fills, within the row.
    row("launch_async_us", n, [](int) { empty_kernel<<<1, 1>>>(); });
    NEED(cudaGetLastError());
    NEED(cudaDeviceSynchronize());
    row("launch_sync_us", n, [](int) {
        empty_kernel<<<1, 1>>>();
        NEED(cudaDeviceSynchronize());
    });
    row("stream_sync_idle_us", n, [&](int) { NEED(cudaStreamSynchronize(stream)); });
    row("stream_query_us", n, [&](int) { NEED(cudaStreamQuery(stream)); });
    NEED(cudaEventRecord(event, stream));
    NEED(cudaEventSynchronize(event));
    row("event_query_us", n, [&](int) { NEED(cudaEventQuery(event)); });
    row("get_device_us", n, [](int) {
        int device = -1;
        NEED(cudaGetDevice(&device));
        if (device != 0) {
            std::printf("FAIL driver_face_cost: cudaGetDevice says %d\n", device);
            std::exit(1);
        }
    });
    int want = -1;
    NEED(cudaDeviceGetAttribute(&want, cudaDevAttrMultiProcessorCount, 0));
    row("device_attribute_us", n, [want](int) {
        int value = -1;
        NEED(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0));
        if (value != want) {
            std::printf("FAIL driver_face_cost: attribute %d, then %d\n", want, value);
            std::exit(1);
        }
    });
    row("memcpy4_h2d_us", n, [dev](int i) {
        uint32_t v = 0x1000u + (uint32_t)i;
        NEED(cudaMemcpy(dev, &v, 4, cudaMemcpyHostToDevice));
    });
    row("memcpy4_d2h_us", n, [dev](int) {
        uint32_t got = 0;
        NEED(cudaMemcpy(&got, dev, 4, cudaMemcpyDeviceToHost));
    });
    uint32_t got = 0, last = 0x1000u + (uint32_t)n - 1;
    NEED(cudaMemcpy(&got, dev, 4, cudaMemcpyDeviceToHost));
    if (got != last) {
        std::printf("FAIL driver_face_cost: the device holds 0x%08x, expected 0x%08x\n", got, last);
        return 1;
    }
    row("malloc_free_1m_us", n, [](int) {
        void *p = nullptr;
        NEED(cudaMalloc(&p, 1 << 20));
        NEED(cudaFree(p));
    });
    NEED(cudaFree(dev));
    NEED(cudaEventDestroy(event));
    NEED(cudaStreamDestroy(stream));
    return 0;
}

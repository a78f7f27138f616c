// SPDX-License-Identifier: Apache-2.0 OR MIT
// The common body of qcuda_bench's startup helpers, qcuda_bench_startup (a few bytes of device
// data) and qcuda_bench_startup_10m (a fatbin of about 10 MiB). They differ in nothing else, so
// the difference of their start-up times is what loading the larger module costs.
//
// A helper is one fresh process: it times its first CUDA call (cudaFree(0): natively it makes
// the context; qcuda's guest-lib opens /dev/qcuda and counts the devices there, and the host
// starts the session's worker and context at the first call that needs them), then its first
// cudaMalloc (so both sides have a whole session after it), then one launch of `probe`, which reads a word of the table (wherever the runtime loads the module:
// at registration, at the first call or lazily at the first launch, it is loaded by then), and
// checks that word on the host. It prints one line on stdout:
//   startup <t_main> <t_first_call_done> <t_malloc_done> <t_kernel_done>
//                                     CLOCK_MONOTONIC seconds, exit 0
//   SKIP: no CUDA device (<error>)                        exit 2
//   FAIL <what>                                           exit 1
// qcuda_bench spawns it and takes its own clock at the spawn, so that start-up counts exec, the
// dynamic loader and the fatbin registration too.
#pragma once
#include <cstdint>
#include <cstdio>
#include <ctime>

#include <cuda_runtime.h>

namespace startup {

// Word i of the table: every word differs, and nothing about it compresses.
__host__ __device__ constexpr uint32_t word(uint32_t i)
{
    uint32_t x = i * 0x9E3779B1u;
    x ^= x >> 15;
    x *= 0x85EBCA77u;
    x ^= x >> 13;
    return x;
}

// Words [base, base + N) of the table, computed by the compiler: a __device__ variable with a
// constant initializer, so its bytes are in the fatbin. The front end's constexpr step limit
// caps one chunk (1 Mi words is too many), hence chunks.
template <uint32_t N> struct Chunk {
    uint32_t w[N];
};
template <uint32_t N> constexpr Chunk<N> make_chunk(uint32_t base)
{
    Chunk<N> c{};
    for (uint32_t i = 0; i < N; i++)
        c.w[i] = word(base + i);
    return c;
}

inline double now_seconds()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); // one clock for every process: qcuda_bench compares
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

inline int failed(const char *what, cudaError_t err)
{
    std::printf("FAIL %s returned %s (%d: %s)\n", what, cudaGetErrorName(err), (int)err,
                cudaGetErrorString(err));
    return 1;
}

// The helper's main: `words` is the table's length, launch(i, out) launches probe<<<1, 1>>> to
// store word i of the table at out.
template <class Launch> int run(uint32_t words, Launch launch)
{
    const double t_main = now_seconds();
    cudaError_t err = cudaFree(0);
    const double t_first = now_seconds();
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        std::printf("SKIP: no CUDA device (%s)\n", cudaGetErrorName(err));
        return 2;
    }
    if (err != cudaSuccess)
        return failed("cudaFree(0)", err);
    uint32_t *out = nullptr;
    if ((err = cudaMalloc(&out, sizeof *out)) != cudaSuccess)
        return failed("cudaMalloc", err);
    const double t_malloc = now_seconds();
    const uint32_t i = (uint32_t)((uint64_t)words * 5 / 7); // somewhere inside, not the start
    launch(i, out);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return failed("the probe launch", err);
    if ((err = cudaDeviceSynchronize()) != cudaSuccess)
        return failed("cudaDeviceSynchronize after the probe", err);
    const double t_kernel = now_seconds();
    uint32_t got = 0;
    if ((err = cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return failed("cudaMemcpy of the probe's word", err);
    if (got != word(i)) {
        std::printf("FAIL table word %u of %u reads 0x%08x on the device, expected 0x%08x\n", i,
                    words, got, word(i));
        return 1;
    }
    if ((err = cudaFree(out)) != cudaSuccess)
        return failed("cudaFree", err);
    std::printf("startup %.9f %.9f %.9f %.9f\n", t_main, t_first, t_malloc, t_kernel);
    return 0;
}

} // namespace startup

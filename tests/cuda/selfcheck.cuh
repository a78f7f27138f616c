// SPDX-License-Identifier: Apache-2.0 OR MIT
// The result contract shared by every qcuda test program (docs/testing.md):
//
//   last line  "PASS <name>"              exit 0
//              "FAIL <name>: <reason>"    exit 1
//              "SKIP <name>: <reason>"    exit 2  (no CUDA device or driver)
//
// Lines before the last are informational (sizes, timings). A program includes this header after
// defining TEST_NAME, calls require_device() first and ends with pass().
#pragma once

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#ifndef TEST_NAME
#error "define TEST_NAME before including selfcheck.cuh"
#endif

enum { EXIT_PASS = 0, EXIT_FAIL = 1, EXIT_SKIP = 2 };

// Prints the FAIL line and exits 1. Never returns.
[[noreturn]] __attribute__((format(printf, 1, 2))) static inline void fail(const char *fmt, ...)
{
    std::fflush(stdout);
    std::printf("FAIL %s: ", TEST_NAME);
    va_list ap;
    va_start(ap, fmt);
    std::vprintf(fmt, ap);
    va_end(ap);
    std::printf("\n");
    std::fflush(stdout);
    std::exit(EXIT_FAIL);
}

static inline int pass()
{
    std::printf("PASS %s\n", TEST_NAME);
    std::fflush(stdout);
    return EXIT_PASS;
}

// Checks a runtime call that must succeed; on failure names the call, its error and the line.
#define CHECK(call)                                                                              \
    do {                                                                                         \
        cudaError_t check_err_ = (call);                                                         \
        if (check_err_ != cudaSuccess)                                                           \
            fail("%s returned %s (%d: %s) at %s:%d", #call, cudaGetErrorName(check_err_),        \
                 (int)check_err_, cudaGetErrorString(check_err_), __FILE__, __LINE__);           \
    } while (0)

// Checks that a runtime call returns exactly `want`.
#define EXPECT_ERR(call, want)                                                                   \
    do {                                                                                         \
        cudaError_t expect_got_ = (call);                                                        \
        if (expect_got_ != (want))                                                               \
            fail("%s returned %s (%d), expected %s (%d) at %s:%d", #call,                        \
                 cudaGetErrorName(expect_got_), (int)expect_got_, cudaGetErrorName(want),        \
                 (int)(want), __FILE__, __LINE__);                                               \
    } while (0)

// Checks a launch: a bad configuration shows up in cudaGetLastError right after the launch.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

// Returns the device count, or prints SKIP and exits 2 when there is no usable device.
//
// "No device" means what an application sees on a machine without a GPU: cudaErrorNoDevice or
// a count of 0, or cudaErrorInsufficientDriver (NVIDIA's runtime answers that when no driver is
// installed at all, and qcuda's answers it when the host has no driver). Any other error is a
// failure: a broken transport must not pass as a skipped test.
static inline int require_device()
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
        (err == cudaSuccess && count == 0)) {
        std::printf("SKIP %s: no CUDA device (%s)\n", TEST_NAME,
                    err == cudaSuccess ? "device count 0" : cudaGetErrorName(err));
        std::fflush(stdout);
        std::exit(EXIT_SKIP);
    }
    if (err != cudaSuccess)
        fail("cudaGetDeviceCount returned %s (%d: %s)", cudaGetErrorName(err), (int)err,
             cudaGetErrorString(err));
    // The sticky-free start every test assumes.
    cudaGetLastError();
    return count;
}

// Wall-clock seconds since an arbitrary start, for host-side throughput figures.
static inline double now_seconds()
{
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// A small deterministic generator so every run checks the same data.
struct Lcg {
    unsigned long long state;
    explicit Lcg(unsigned long long seed) : state(seed * 6364136223846793005ULL + 1442695040888963407ULL) {}
    unsigned int next()
    {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return (unsigned int)(state >> 33);
    }
    // Uniform in [-1, 1).
    float unit() { return (float)(next() & 0xffffff) / (float)0x800000 - 1.0f; }
};

// SPDX-License-Identifier: Apache-2.0 OR MIT
// qcuda_bench: the costs that separate a CUDA program in the qcuda guest from the same program on
// the bare host. scripts/bench.sh runs it natively and in the guest, back to back, and divides.
//
// stdout is CSV, "metric,bytes,value,unit", one row per measurement; stderr is progress.
//   h2d_pageable, d2h_pageable   cudaMemcpy from/to malloc'd memory, GB/s (1e9 bytes/s)
//   h2d_pinned, d2h_pinned       cudaMemcpyAsync on a stream + cudaStreamSynchronize, from/to
//                                cudaMallocHost memory, GB/s; 4 KiB .. 1 GiB (--max-bytes)
//   h2d_pinned_stream, d2h_...   8 cudaMemcpyAsync of that size queued on one stream, then one
//                                cudaStreamSynchronize: streaming throughput with copies in
//                                flight, as pipelined programs copy (host clock)
//   h2d_pinned_dma, d2h_...      the same 8 copies timed by CUDA events around them on the GPU,
//                                as NVIDIA's bandwidthTest measures: the copy engine's rate
//   zerocopy_read, _write        a kernel reading/writing cudaHostAllocMapped memory, GB/s
//   launch_sync_us ...           latencies in microseconds (bytes is the size moved, or 0);
//                                the small synchronous calls, cudaMalloc + cudaFree; in the
//                                guest their progress lines (stderr) add qcuda.ko's phases of
//                                the counted calls: "| qcuda.ko: W waited/call, prepare P
//                                submit S wait T finish F us, outside O us/call"
//                                (module_phases.cuh; scripts/bench.sh collects them in
//                                phases.txt)
//   first_call_us,               fresh processes (the helpers qcuda_bench_startup and
//   session_start_us,            qcuda_bench_startup_10m beside this program, see startup.cuh):
//   startup_us, startup_10m_us,  the first CUDA call, it and the first cudaMalloc, spawn to the
//   module_load_10m_us           first kernel done, and what a 10 MiB fatbin adds to that
//                                (bytes: the helper's fatbin)
//   launch_rate_<N>proc          N processes (this program, --child-launches) launching at once:
//                                aggregate empty-kernel launches per second, unit launch/s
//   scaling_<N>proc              that rate over the rate of one process, unit x
//   sustain_launch,              --sustain mode only (scripts/bench-scale.sh starts many such
//   sustain_h2d, sustain_d2h     processes at once, natively and in guests, and adds them up):
//                                one process's empty launches per second, or GB/s of 64 MiB
//                                pinned copies on a stream, kept up for S seconds
//
// Copies are timed with the host clock, the whole call as the application sees it (in the guest
// that includes the trip to the host); the best of several runs after a warm-up counts. The
// warm-up copy of every size is checked against a pattern, so a wrong copy is a FAIL (exit 1),
// never a fast number. A row that cannot be measured (an allocation or call fails) reads NA,
// with the exact error on stderr, and the program goes on. No CUDA device: SKIP, exit 2.
//
// Usage: qcuda_bench [--quick] [--max-bytes N[K|M|G]] [--schedule auto|spin|yield|block]
//   --quick     about a tenth of the repetitions, for a guest under TCG (all rows stay)
//   --schedule  how the program's threads wait for the GPU (cudaSetDeviceFlags; default auto)
//   (qcuda_bench --child-launches N is one process of the launch_rate rows, started by itself)
//        qcuda_bench --sustain launch|h2d|d2h --seconds S --sync DIR --tag NAME
//   one process of a sustained load: ready, it creates DIR/ready.KIND.NAME and waits for
//   DIR/go.KIND; then runs KIND for S seconds and prints its one row (see sustain_main)
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <elf.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "module_phases.cuh"

extern char **environ;

namespace {

constexpr size_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
constexpr size_t kCopySizes[] = {4 * kKiB, 64 * kKiB, kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB, kGiB};
constexpr size_t kZeroCopySizes[] = {64 * kMiB, 256 * kMiB};
constexpr int kBlock = 256;

// How much to repeat: full for the native baseline, a tenth of the calls with --quick. The
// bandwidth rows repeat alike in both modes: the copies cost the guest one call each, and the
// best of fewer runs would favour the side that ran more (a copy's rate varies from run to run
// natively too, by 10 % and more on the lent hosts).
struct Plan {
    double target_s;   // a bandwidth size is repeated until about this much time is spent
    int min_runs;      // ... but at least this often
    int max_runs;      // ... and at most this often
    int launch_sync;   // launch + cudaDeviceSynchronize pairs
    int launch_async;  // launches before one synchronize
    int small_calls;   // idle stream syncs and queries, cudaGetDevice, 4-byte copies
    int malloc_free;   // cudaMalloc + cudaFree pairs
    int startups;      // fresh processes per start-up helper (after one not counted)
    int proc_launches; // launches per process in the launch_rate rows
    int proc_runs;     // runs per process count (the best counts)
    size_t max_bytes;  // the largest buffer to try
};

Plan make_plan(bool quick, size_t max_bytes)
{
    if (quick)
        return {0.3, 5, 1000, 200, 20000, 200, 100, 3, 10000, 1, max_bytes};
    return {0.3, 5, 1000, 2000, 100000, 2000, 1000, 10, 100000, 3, max_bytes};
}

// A row that cannot be measured; `why` goes to stderr and the row reads NA.
struct Unavailable {
    std::string why;
};

[[noreturn]] __attribute__((format(printf, 1, 2))) void unavailable(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw Unavailable{buf};
}

// Throws Unavailable naming the call and its exact error. The error is read off so that a
// non-sticky one does not show up again in the next row.
void need(cudaError_t err, const char *call, int line)
{
    if (err == cudaSuccess)
        return;
    cudaGetLastError();
    unavailable("%s returned %s (%d: %s) at line %d", call, cudaGetErrorName(err), (int)err,
                cudaGetErrorString(err), line);
}
#define NEED(call) need((call), #call, __LINE__)

// A wrong result: prints the FAIL line and exits 1. A benchmark that cannot fail proves nothing.
[[noreturn]] __attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...)
{
    std::fflush(stdout);
    std::printf("FAIL qcuda_bench: ");
    va_list ap;
    va_start(ap, fmt);
    std::vprintf(fmt, ap);
    va_end(ap);
    std::printf("\n");
    std::fflush(stdout);
    std::exit(1);
}

// CLOCK_MONOTONIC: the same clock in every process, so child processes' times compare.
double now_seconds()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

std::string size_label(size_t bytes)
{
    char buf[32];
    if (bytes >= kGiB && bytes % kGiB == 0)
        std::snprintf(buf, sizeof buf, "%zu GiB", bytes / kGiB);
    else if (bytes >= kMiB && bytes % kMiB == 0)
        std::snprintf(buf, sizeof buf, "%zu MiB", bytes / kMiB);
    else if (bytes >= kMiB)
        std::snprintf(buf, sizeof buf, "%.1f MiB", (double)bytes / kMiB);
    else if (bytes >= kKiB && bytes % kKiB == 0)
        std::snprintf(buf, sizeof buf, "%zu KiB", bytes / kKiB);
    else
        std::snprintf(buf, sizeof buf, "%zu B", bytes);
    return buf;
}

// One measured value and how it was obtained, for the progress line.
struct Sample {
    double value;
    std::string how;
};

void print_row(const char *metric, size_t bytes, const char *value, const char *unit)
{
    std::printf("%s,%zu,%s,%s\n", metric, bytes, value, unit);
    std::fflush(stdout); // rows already printed survive a crash later on
}

void print_na(const char *metric, size_t bytes, const char *unit, const std::string &why)
{
    print_row(metric, bytes, "NA", unit);
    std::fprintf(stderr, "qcuda_bench: %-20s %8s  NA: %s\n", metric, size_label(bytes).c_str(),
                 why.c_str());
}

// Runs one measurement and prints its row, NA if it throws Unavailable.
template <class Measure> void measure(const char *metric, size_t bytes, const char *unit, Measure m)
{
    try {
        Sample s = m();
        char value[32];
        std::snprintf(value, sizeof value, "%.3f", s.value);
        print_row(metric, bytes, value, unit);
        std::fprintf(stderr, "qcuda_bench: %-20s %8s  %10s %-4s  %s\n", metric,
                     size_label(bytes).c_str(), value, unit, s.how.c_str());
    } catch (const Unavailable &u) {
        print_na(metric, bytes, unit, u.why);
    }
}

// Calls `timed` (which returns the seconds of one run) until about plan.target_s is spent, within
// [min_runs, max_runs]; returns the best time and how many runs it took.
template <class Timed> double best_seconds(const Plan &plan, Timed timed, int &runs)
{
    double best = timed();
    runs = (int)std::clamp(plan.target_s / std::max(best, 1e-9), (double)plan.min_runs,
                           (double)plan.max_runs);
    for (int i = 1; i < runs; i++)
        best = std::min(best, timed());
    return best;
}

std::string best_of(int runs)
{
    return "best of " + std::to_string(runs);
}

// --- memory that frees itself ----------------------------------------------------------------

using Owned = std::unique_ptr<void, void (*)(void *)>;

Owned device_alloc(size_t n)
{
    void *p = nullptr;
    NEED(cudaMalloc(&p, n));
    return Owned(p, [](void *q) { cudaFree(q); });
}

Owned pageable_alloc(size_t n)
{
    void *p = std::malloc(n);
    if (!p)
        unavailable("malloc(%zu) failed", n);
    return Owned(p, std::free);
}

Owned pinned_alloc(size_t n)
{
    void *p = nullptr;
    NEED(cudaMallocHost(&p, n));
    return Owned(p, [](void *q) { cudaFreeHost(q); });
}

Owned mapped_alloc(size_t n)
{
    void *p = nullptr;
    NEED(cudaHostAlloc(&p, n, cudaHostAllocMapped));
    return Owned(p, [](void *q) { cudaFreeHost(q); });
}

class Stream {
  public:
    Stream() { NEED(cudaStreamCreate(&s_)); }
    ~Stream() { cudaStreamDestroy(s_); }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    cudaStream_t get() const { return s_; }

  private:
    cudaStream_t s_ = nullptr;
};

class Event {
  public:
    Event() { NEED(cudaEventCreate(&e_)); }
    ~Event() { cudaEventDestroy(e_); }
    Event(const Event &) = delete;
    Event &operator=(const Event &) = delete;
    cudaEvent_t get() const { return e_; }

  private:
    cudaEvent_t e_ = nullptr;
};

// Times kernels on the default stream with a pair of events: device time, no launch overhead.
class KernelTimer {
  public:
    KernelTimer()
    {
        NEED(cudaEventCreate(&start_));
        cudaError_t err = cudaEventCreate(&stop_);
        if (err != cudaSuccess)
            cudaEventDestroy(start_);
        NEED(err);
    }
    ~KernelTimer()
    {
        cudaEventDestroy(start_);
        cudaEventDestroy(stop_);
    }
    KernelTimer(const KernelTimer &) = delete;
    KernelTimer &operator=(const KernelTimer &) = delete;

    template <class Launch> double seconds(Launch launch)
    {
        NEED(cudaEventRecord(start_));
        launch();
        NEED(cudaGetLastError());
        NEED(cudaEventRecord(stop_));
        NEED(cudaEventSynchronize(stop_));
        float ms = 0;
        NEED(cudaEventElapsedTime(&ms, start_, stop_));
        return ms / 1e3;
    }

  private:
    cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// --- patterns and the kernels ----------------------------------------------------------------

// Word i of the pattern `seed`. Consecutive words differ (an odd multiplier is a bijection), so a
// shifted or repeated chunk shows; two seeds differ in every word, so stale data shows.
__host__ __device__ inline uint32_t pattern(size_t i, uint32_t seed)
{
    return ((uint32_t)i * 0x9E3779B1u + (uint32_t)(i >> 32)) ^ seed;
}

void fill_host(uint32_t *w, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        w[i] = pattern(i, seed);
}

// The index of the first word that is not pattern(i, seed), or n.
size_t first_mismatch_host(const uint32_t *w, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (w[i] != pattern(i, seed))
            return i;
    return n;
}

__global__ void fill_words(uint32_t *w, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] = pattern(i, seed);
}

// Lowers *first_bad to the index of every word that is not pattern(i, seed).
__global__ void find_mismatch(const uint32_t *w, size_t n, uint32_t seed,
                              unsigned long long *first_bad)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (w[i] != pattern(i, seed))
            atomicMin(first_bad, (unsigned long long)i);
}

// Adds up every 32-bit word of v[0, n) into *sum: one atomic per warp.
__global__ void sum_words(const uint4 *v, size_t n, unsigned long long *sum)
{
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 x = v[i];
        s += (unsigned long long)x.x + x.y + x.z + x.w;
    }
    for (int offset = 16; offset > 0; offset /= 2)
        s += __shfl_down_sync(0xffffffffu, s, offset);
    if (threadIdx.x % 32 == 0)
        atomicAdd(sum, s);
}

// v[i] = words 4i .. 4i+3 of the pattern `seed`.
__global__ void write_words(uint4 *v, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        v[i] = make_uint4(pattern(4 * i, seed), pattern(4 * i + 1, seed), pattern(4 * i + 2, seed),
                          pattern(4 * i + 3, seed));
}

__global__ void empty_kernel() {}

// Checks that device memory holds pattern `seed`; a mismatch is a FAIL naming `what`.
void verify_device(const void *dev, size_t bytes, uint32_t seed, int grid, const char *what)
{
    const size_t n = bytes / 4;
    Owned first_bad = device_alloc(sizeof(unsigned long long));
    auto *bad_d = (unsigned long long *)first_bad.get();
    NEED(cudaMemset(bad_d, 0xff, sizeof *bad_d));
    find_mismatch<<<grid, kBlock>>>((const uint32_t *)dev, n, seed, bad_d);
    NEED(cudaGetLastError());
    unsigned long long bad = 0;
    NEED(cudaMemcpy(&bad, bad_d, sizeof bad, cudaMemcpyDeviceToHost));
    if (bad == ~0ull)
        return;
    uint32_t got = 0;
    NEED(cudaMemcpy(&got, (const uint32_t *)dev + bad, 4, cudaMemcpyDeviceToHost));
    fail("%s %s: device word %llu (byte %llu) is 0x%08x, expected 0x%08x", what,
         size_label(bytes).c_str(), bad, bad * 4, got, pattern(bad, seed));
}

void verify_host(const void *host, size_t bytes, uint32_t seed, const char *what)
{
    const size_t n = bytes / 4;
    const auto *w = (const uint32_t *)host;
    size_t bad = first_mismatch_host(w, n, seed);
    if (bad != n)
        fail("%s %s: host word %zu (byte %zu) is 0x%08x, expected 0x%08x", what,
             size_label(bytes).c_str(), bad, bad * 4, w[bad], pattern(bad, seed));
}

// --- the measurements ------------------------------------------------------------------------

// h2d_<kind> and d2h_<kind> at one size. Pageable: cudaMemcpy; pinned: cudaMemcpyAsync on a
// created stream, then cudaStreamSynchronize. The warm-up copy of each direction is verified.
void copy_rows(const Plan &plan, bool pinned, size_t bytes, int grid)
{
    const char *h2d = pinned ? "h2d_pinned" : "h2d_pageable";
    const char *d2h = pinned ? "d2h_pinned" : "d2h_pageable";
    const uint32_t seed_h2d = 0x5a5a0000u ^ (uint32_t)bytes, seed_d2h = ~seed_h2d;
    Owned host(nullptr, std::free), dev(nullptr, std::free);
    std::unique_ptr<Stream> stream;
    try {
        dev = device_alloc(bytes);
        host = pinned ? pinned_alloc(bytes) : pageable_alloc(bytes);
        if (pinned)
            stream = std::make_unique<Stream>();
    } catch (const Unavailable &u) {
        print_na(h2d, bytes, "GB/s", u.why);
        print_na(d2h, bytes, "GB/s", u.why);
        return;
    }
    void *h = host.get(), *d = dev.get();
    auto copy = [&](void *to, const void *from, cudaMemcpyKind kind) {
        if (!pinned) {
            NEED(cudaMemcpy(to, from, bytes, kind));
            return;
        }
        NEED(cudaMemcpyAsync(to, from, bytes, kind, stream->get()));
        NEED(cudaStreamSynchronize(stream->get()));
    };
    auto timed = [&](void *to, const void *from, cudaMemcpyKind kind) {
        double t = now_seconds();
        copy(to, from, kind);
        return now_seconds() - t;
    };

    measure(h2d, bytes, "GB/s", [&] {
        fill_host((uint32_t *)h, bytes / 4, seed_h2d);
        copy(d, h, cudaMemcpyHostToDevice);
        verify_device(d, bytes, seed_h2d, grid, h2d);
        int runs = 0;
        double best = best_seconds(plan, [&] { return timed(d, h, cudaMemcpyHostToDevice); }, runs);
        return Sample{bytes / best / 1e9, best_of(runs)};
    });
    measure(d2h, bytes, "GB/s", [&] {
        // Every host word still differs from this pattern, so a copy that did not land shows.
        fill_words<<<grid, kBlock>>>((uint32_t *)d, bytes / 4, seed_d2h);
        NEED(cudaGetLastError());
        NEED(cudaDeviceSynchronize());
        copy(h, d, cudaMemcpyDeviceToHost);
        verify_host(h, bytes, seed_d2h, d2h);
        int runs = 0;
        double best = best_seconds(plan, [&] { return timed(h, d, cudaMemcpyDeviceToHost); }, runs);
        return Sample{bytes / best / 1e9, best_of(runs)};
    });
    if (!pinned)
        return;
    // The same buffers, kBatch copies in flight per synchronisation (data checked above).
    constexpr int kBatch = 8;
    auto batch = [&](void *to, const void *from, cudaMemcpyKind kind) {
        double t = now_seconds();
        for (int i = 0; i < kBatch; i++)
            NEED(cudaMemcpyAsync(to, from, bytes, kind, stream->get()));
        NEED(cudaStreamSynchronize(stream->get()));
        return now_seconds() - t;
    };
    measure("h2d_pinned_stream", bytes, "GB/s", [&] {
        batch(d, h, cudaMemcpyHostToDevice);
        int runs = 0;
        double best = best_seconds(plan, [&] { return batch(d, h, cudaMemcpyHostToDevice); }, runs);
        return Sample{kBatch * bytes / best / 1e9, best_of(runs)};
    });
    measure("d2h_pinned_stream", bytes, "GB/s", [&] {
        batch(h, d, cudaMemcpyDeviceToHost);
        int runs = 0;
        double best = best_seconds(plan, [&] { return batch(h, d, cudaMemcpyDeviceToHost); }, runs);
        return Sample{kBatch * bytes / best / 1e9, best_of(runs)};
    });
    // The same, timed on the GPU by events on the legacy stream around the copies.
    std::unique_ptr<KernelTimer> timer;
    try {
        timer = std::make_unique<KernelTimer>();
    } catch (const Unavailable &u) {
        print_na("h2d_pinned_dma", bytes, "GB/s", u.why);
        print_na("d2h_pinned_dma", bytes, "GB/s", u.why);
        return;
    }
    auto events = [&](void *to, const void *from, cudaMemcpyKind kind) {
        return timer->seconds([&] {
            for (int i = 0; i < kBatch; i++)
                NEED(cudaMemcpyAsync(to, from, bytes, kind, 0));
        });
    };
    measure("h2d_pinned_dma", bytes, "GB/s", [&] {
        events(d, h, cudaMemcpyHostToDevice);
        int runs = 0;
        double best = best_seconds(plan, [&] { return events(d, h, cudaMemcpyHostToDevice); }, runs);
        return Sample{kBatch * bytes / best / 1e9, best_of(runs)};
    });
    measure("d2h_pinned_dma", bytes, "GB/s", [&] {
        events(h, d, cudaMemcpyDeviceToHost);
        int runs = 0;
        double best = best_seconds(plan, [&] { return events(h, d, cudaMemcpyDeviceToHost); }, runs);
        return Sample{kBatch * bytes / best / 1e9, best_of(runs)};
    });
}

// zerocopy_read and zerocopy_write at one size: a kernel streams cudaHostAllocMapped memory
// through its device pointer; events time the kernel alone.
void zerocopy_rows(const Plan &plan, size_t bytes, int grid, bool can_map)
{
    const char *rd = "zerocopy_read", *wr = "zerocopy_write";
    const uint32_t seed_rd = 0xc3c30000u ^ (uint32_t)bytes, seed_wr = ~seed_rd;
    Owned host(nullptr, std::free), sum(nullptr, std::free);
    void *mapped = nullptr;
    std::unique_ptr<KernelTimer> timer;
    try {
        if (!can_map)
            unavailable("the device cannot map host memory (cudaDevAttrCanMapHostMemory = 0)");
        host = mapped_alloc(bytes);
        NEED(cudaHostGetDevicePointer(&mapped, host.get(), 0));
        sum = device_alloc(sizeof(unsigned long long));
        timer = std::make_unique<KernelTimer>();
    } catch (const Unavailable &u) {
        print_na(rd, bytes, "GB/s", u.why);
        print_na(wr, bytes, "GB/s", u.why);
        return;
    }
    const size_t vecs = bytes / sizeof(uint4);
    auto *h = (uint32_t *)host.get();
    auto *sum_d = (unsigned long long *)sum.get();

    measure(rd, bytes, "GB/s", [&] {
        fill_host(h, bytes / 4, seed_rd);
        unsigned long long want = 0;
        for (size_t i = 0; i < bytes / 4; i++)
            want += h[i];
        NEED(cudaMemset(sum_d, 0, sizeof *sum_d));
        auto launch = [&] { sum_words<<<grid, kBlock>>>((const uint4 *)mapped, vecs, sum_d); };
        timer->seconds(launch);
        unsigned long long got = 0;
        NEED(cudaMemcpy(&got, sum_d, sizeof got, cudaMemcpyDeviceToHost));
        if (got != want)
            fail("%s %s: the kernel's sum of the mapped words is %llu, expected %llu", rd,
                 size_label(bytes).c_str(), got, want);
        int runs = 0;
        double best = best_seconds(plan, [&] { return timer->seconds(launch); }, runs);
        return Sample{bytes / best / 1e9, best_of(runs)};
    });
    measure(wr, bytes, "GB/s", [&] {
        // The read row left pattern seed_rd there, which differs from seed_wr in every word.
        auto launch = [&] { write_words<<<grid, kBlock>>>((uint4 *)mapped, vecs, seed_wr); };
        timer->seconds(launch);
        verify_host(h, bytes, seed_wr, wr);
        int runs = 0;
        double best = best_seconds(plan, [&] { return timer->seconds(launch); }, runs);
        return Sample{bytes / best / 1e9, best_of(runs)};
    });
}

// Mean microseconds per call of `op` over n calls, after a few warm-up calls. In the guest the
// progress line adds where the counted calls' time went in qcuda.ko (module_phases.cuh), read
// from fdinfo before and after the timed loop, outside it.
template <class Op> Sample mean_us(int n, Op op)
{
    for (int i = 0; i < std::min(n, 10); i++)
        op(i);
    const ModulePhases before = read_module_phases();
    double t = now_seconds();
    for (int i = 0; i < n; i++)
        op(i);
    const double us = (now_seconds() - t) / n * 1e6;
    const ModulePhases after = read_module_phases();
    return Sample{us, "mean of " + std::to_string(n) + module_phases_per_call(before, after, n, us)};
}

void latency_rows(const Plan &plan)
{
    measure("launch_sync_us", 0, "us", [&] {
        Sample s = mean_us(plan.launch_sync, [](int) {
            empty_kernel<<<1, 1>>>();
            NEED(cudaDeviceSynchronize());
        });
        NEED(cudaGetLastError()); // a refused launch stays recorded here
        return s;
    });
    measure("launch_async_us", 0, "us", [&] {
        const int n = plan.launch_async;
        empty_kernel<<<1, 1>>>();
        NEED(cudaDeviceSynchronize());
        const ModulePhases before = read_module_phases();
        double t = now_seconds();
        for (int i = 0; i < n; i++)
            empty_kernel<<<1, 1>>>();
        NEED(cudaGetLastError());
        NEED(cudaDeviceSynchronize());
        const double us = (now_seconds() - t) / n * 1e6;
        const ModulePhases after = read_module_phases();
        return Sample{us, std::to_string(n) + " launches, then one synchronize" +
                              module_phases_per_call(before, after, n, us)};
    });
    measure("stream_sync_idle_us", 0, "us", [&] {
        Stream stream;
        return mean_us(plan.small_calls, [&](int) { NEED(cudaStreamSynchronize(stream.get())); });
    });
    // Queries of work that is done answer cudaSuccess; anything else is a wrong answer.
    measure("stream_query_us", 0, "us", [&] {
        Stream stream;
        NEED(cudaStreamSynchronize(stream.get()));
        return mean_us(plan.small_calls, [&](int) {
            cudaError_t err = cudaStreamQuery(stream.get());
            if (err == cudaErrorNotReady)
                fail("stream_query_us: cudaStreamQuery of an idle stream said cudaErrorNotReady");
            NEED(err);
        });
    });
    measure("event_query_us", 0, "us", [&] {
        Stream stream;
        Event event;
        NEED(cudaEventRecord(event.get(), stream.get()));
        NEED(cudaEventSynchronize(event.get()));
        return mean_us(plan.small_calls, [&](int) {
            cudaError_t err = cudaEventQuery(event.get());
            if (err == cudaErrorNotReady)
                fail("event_query_us: cudaEventQuery of a completed event said cudaErrorNotReady");
            NEED(err);
        });
    });
    // qcuda's guest-lib answers this one itself, without the host: a floor for the others.
    measure("get_device_us", 0, "us", [&] {
        return mean_us(plan.small_calls, [](int) {
            int device = -1;
            NEED(cudaGetDevice(&device));
            if (device != 0)
                fail("get_device_us: cudaGetDevice says %d, expected 0", device);
        });
    });
    // An attribute query: qcuda caches each attribute in the guest after its first query.
    measure("device_attribute_us", 0, "us", [&] {
        int want = -1;
        NEED(cudaDeviceGetAttribute(&want, cudaDevAttrMultiProcessorCount, 0));
        return mean_us(plan.small_calls, [want](int) {
            int value = -1;
            NEED(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0));
            if (value != want)
                fail("device_attribute_us: cudaDeviceGetAttribute says %d, then %d", want, value);
        });
    });
    measure("memcpy4_h2d_us", 4, "us", [&] {
        Owned dev = device_alloc(4);
        Sample s = mean_us(plan.small_calls, [&](int i) {
            uint32_t v = 0x1000u + (uint32_t)i;
            NEED(cudaMemcpy(dev.get(), &v, 4, cudaMemcpyHostToDevice));
        });
        uint32_t got = 0, want = 0x1000u + (uint32_t)plan.small_calls - 1;
        NEED(cudaMemcpy(&got, dev.get(), 4, cudaMemcpyDeviceToHost));
        if (got != want)
            fail("memcpy4_h2d_us: the device holds 0x%08x after the last copy, expected 0x%08x",
                 got, want);
        return s;
    });
    measure("memcpy4_d2h_us", 4, "us", [&] {
        Owned dev = device_alloc(4);
        const uint32_t want = 0xfeedf00du;
        NEED(cudaMemcpy(dev.get(), &want, 4, cudaMemcpyHostToDevice));
        return mean_us(plan.small_calls, [&](int) {
            uint32_t got = 0;
            NEED(cudaMemcpy(&got, dev.get(), 4, cudaMemcpyDeviceToHost));
            if (got != want)
                fail("memcpy4_d2h_us: read 0x%08x, expected 0x%08x", got, want);
        });
    });
    measure("malloc_free_1m_us", kMiB, "us", [&] {
        return mean_us(plan.malloc_free, [](int) {
            void *p = nullptr;
            NEED(cudaMalloc(&p, kMiB));
            NEED(cudaFree(p));
        });
    });
}

// --- fresh processes: start-up, module load, several processes at once --------------------------

// This program's own path, from /proc/self/exe.
std::string self_path()
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0)
        unavailable("readlink(/proc/self/exe) failed: %s", std::strerror(errno));
    buf[n] = '\0';
    return buf;
}

// A file descriptor that closes itself.
class Fd {
  public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    ~Fd() { reset(); }
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    Fd &operator=(Fd &&other) noexcept
    {
        reset();
        std::swap(fd_, other.fd_);
        return *this;
    }
    int get() const { return fd_; }
    void reset()
    {
        if (fd_ >= 0)
            close(fd_);
        fd_ = -1;
    }

  private:
    int fd_;
};

// A new pipe into read_end and write_end, both close-on-exec: a child gets only what
// posix_spawn's dup2 gives it, so no child holds another's pipe open.
void open_pipe(Fd &read_end, Fd &write_end)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        unavailable("pipe2 failed: %s", std::strerror(errno));
    read_end = Fd(fds[0]);
    write_end = Fd(fds[1]);
}

std::string describe_status(int status)
{
    char buf[64];
    if (WIFEXITED(status))
        std::snprintf(buf, sizeof buf, "exit %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        std::snprintf(buf, sizeof buf, "signal %d (%s)", WTERMSIG(status),
                      strsignal(WTERMSIG(status)));
    else
        std::snprintf(buf, sizeof buf, "status 0x%x", status);
    return buf;
}

// A child process whose stdout this object reads line by line. Gone out of scope before it was
// waited for (an error, a timeout), it is killed and reaped: nothing is left behind.
class Child {
  public:
    // Runs argv[0] with argv, stdin from `in` (-1: this process's stdin), stdout into a pipe.
    Child(const std::vector<std::string> &argv, int in) : name_(argv.at(0))
    {
        Fd out_read, out_write;
        open_pipe(out_read, out_write);
        posix_spawn_file_actions_t actions;
        if (posix_spawn_file_actions_init(&actions) != 0)
            unavailable("posix_spawn_file_actions_init failed");
        int err = posix_spawn_file_actions_adddup2(&actions, out_write.get(), 1);
        if (err == 0 && in >= 0)
            err = posix_spawn_file_actions_adddup2(&actions, in, 0);
        std::vector<char *> args;
        for (const std::string &a : argv)
            args.push_back(const_cast<char *>(a.c_str()));
        args.push_back(nullptr);
        if (err == 0)
            err = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        if (err != 0) {
            pid_ = -1;
            unavailable("cannot start %s: %s", name_.c_str(), std::strerror(err));
        }
        out_ = std::move(out_read);
    }
    ~Child()
    {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }
    Child(const Child &) = delete;
    Child &operator=(const Child &) = delete;

    // The next line the child prints, without its newline. A FAIL line is a wrong result: this
    // program FAILs too. End of output or no line by `deadline` (now_seconds()) is Unavailable.
    std::string line(double deadline)
    {
        for (;;) {
            size_t nl = buf_.find('\n');
            if (nl != std::string::npos) {
                std::string l = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                if (l.compare(0, 4, "FAIL") == 0)
                    fail("%s: %s", name_.c_str(), l.c_str());
                return l;
            }
            double left = deadline - now_seconds();
            if (left <= 0)
                unavailable("%s gave no answer in time (killed)", name_.c_str());
            pollfd p = {out_.get(), POLLIN, 0};
            int r = poll(&p, 1, (int)std::min(left * 1e3 + 1, 60e3));
            if (r < 0 && errno != EINTR)
                unavailable("poll failed: %s", std::strerror(errno));
            if (r <= 0)
                continue;
            char chunk[256];
            ssize_t n = read(out_.get(), chunk, sizeof chunk);
            if (n < 0 && errno != EINTR)
                unavailable("reading from %s failed: %s", name_.c_str(), std::strerror(errno));
            if (n == 0) {
                std::string last = buf_.empty() ? "nothing" : "\"" + buf_ + "\"";
                unavailable("%s ended (%s) after printing %s", name_.c_str(),
                            describe_status(wait_status(deadline)).c_str(), last.c_str());
            }
            if (n > 0)
                buf_.append(chunk, (size_t)n);
        }
    }

    // Waits for the child's end; anything but exit 0 is Unavailable.
    void wait(double deadline)
    {
        int status = wait_status(deadline);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            unavailable("%s ended with %s", name_.c_str(), describe_status(status).c_str());
    }

  private:
    int wait_status(double deadline)
    {
        for (;;) {
            int status = 0;
            pid_t r = waitpid(pid_, &status, WNOHANG);
            if (r == pid_) {
                pid_ = -1;
                return status;
            }
            if (r < 0 && errno != EINTR)
                unavailable("waitpid(%s) failed: %s", name_.c_str(), std::strerror(errno));
            if (now_seconds() > deadline)
                unavailable("%s did not end in time (killed)", name_.c_str());
            usleep(1000);
        }
    }

    std::string name_;
    pid_t pid_ = -1;
    Fd out_;
    std::string buf_;
};

// Bytes of the .nv_fatbin section (the device code nvcc embedded) of the ELF file at `path`; 0
// if it cannot be read.
size_t fatbin_bytes(const std::string &path)
{
    Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    auto read_at = [&](void *to, size_t n, uint64_t off) {
        return fd.get() >= 0 && pread(fd.get(), to, n, (off_t)off) == (ssize_t)n;
    };
    Elf64_Ehdr eh;
    Elf64_Shdr names;
    if (!read_at(&eh, sizeof eh, 0) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
        eh.e_shstrndx >= eh.e_shnum ||
        !read_at(&names, sizeof names, eh.e_shoff + (uint64_t)eh.e_shstrndx * sizeof names))
        return 0;
    static const char kWanted[] = ".nv_fatbin"; // compared with its terminating NUL
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh;
        char name[sizeof kWanted];
        if (!read_at(&sh, sizeof sh, eh.e_shoff + (uint64_t)i * sizeof sh))
            return 0;
        if (sh.sh_name + sizeof name <= names.sh_size &&
            read_at(name, sizeof name, names.sh_offset + sh.sh_name) &&
            std::memcmp(name, kWanted, sizeof name) == 0)
            return sh.sh_size;
    }
    return 0;
}

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One run of a start-up helper (startup.cuh) in a fresh process.
struct Startup {
    double first_call; // seconds of its cudaFree(0), the first CUDA call
    double session;    // seconds of that and its first cudaMalloc
    double to_kernel;  // seconds from before the spawn to its first kernel done
};

Startup run_startup(const std::string &path)
{
    const double deadline = now_seconds() + 300;
    const double t_spawn = now_seconds();
    Child child({path}, -1);
    std::string l = child.line(deadline);
    double t_main = 0, t_first = 0, t_malloc = 0, t_kernel = 0;
    if (std::sscanf(l.c_str(), "startup %lf %lf %lf %lf", &t_main, &t_first, &t_malloc,
                    &t_kernel) != 4)
        unavailable("%s said: %s", path.c_str(), l.c_str());
    child.wait(deadline);
    if (!(t_spawn <= t_main && t_main <= t_first && t_first <= t_malloc && t_malloc <= t_kernel))
        unavailable("%s reported times out of order (%.6f %.6f %.6f %.6f, spawned at %.6f)",
                    path.c_str(), t_main, t_first, t_malloc, t_kernel, t_spawn);
    return {t_first - t_main, t_malloc - t_main, t_kernel - t_spawn};
}

// first_call_us, session_start_us, startup_us, startup_10m_us, module_load_10m_us: the helpers
// beside this program, each run plan.startups times (after one run not counted), in turn;
// medians.
void startup_rows(const Plan &plan)
{
    struct Helper {
        std::string path, why;           // why: the reason its rows read NA
        size_t fatbin = 0;               // bytes
        std::vector<double> first_call;  // seconds, one per counted run
        std::vector<double> session;
        std::vector<double> to_kernel;
    } tiny, big;
    try {
        std::string self = self_path(), dir = self.substr(0, self.rfind('/'));
        tiny.path = dir + "/qcuda_bench_startup";
        big.path = dir + "/qcuda_bench_startup_10m";
    } catch (const Unavailable &u) {
        tiny.why = big.why = u.why;
    }
    for (Helper *h : {&tiny, &big}) {
        if (h->why.empty() && access(h->path.c_str(), X_OK) != 0)
            h->why = h->path + " is missing (scripts/build-cuda-tests.sh --src=bench builds it)";
        h->fatbin = fatbin_bytes(h->path);
    }
    for (int run = -1; run < plan.startups; run++) {
        for (Helper *h : {&tiny, &big}) {
            if (!h->why.empty())
                continue;
            try {
                Startup s = run_startup(h->path);
                if (run < 0)
                    continue; // the first run also warms the page cache and the driver
                h->first_call.push_back(s.first_call);
                h->session.push_back(s.session);
                h->to_kernel.push_back(s.to_kernel);
            } catch (const Unavailable &u) {
                h->why = u.why;
            }
        }
    }
    auto need_runs = [](const Helper &h) {
        if (!h.why.empty())
            unavailable("%s", h.why.c_str());
    };
    const std::string how = "median of " + std::to_string(plan.startups) + " fresh processes";
    measure("first_call_us", 0, "us", [&] {
        need_runs(tiny);
        return Sample{median(tiny.first_call) * 1e6, how + ": cudaFree(0) as the first CUDA call"};
    });
    measure("session_start_us", 0, "us", [&] {
        need_runs(tiny);
        return Sample{median(tiny.session) * 1e6, how + ": cudaFree(0), then the first cudaMalloc"};
    });
    measure("startup_us", tiny.fatbin, "us", [&] {
        need_runs(tiny);
        return Sample{median(tiny.to_kernel) * 1e6, how + ": spawn to the first kernel done"};
    });
    measure("startup_10m_us", big.fatbin, "us", [&] {
        need_runs(big);
        return Sample{median(big.to_kernel) * 1e6, how + ", the same with a large fatbin"};
    });
    measure("module_load_10m_us", big.fatbin, "us", [&] {
        need_runs(big);
        need_runs(tiny);
        return Sample{(median(big.to_kernel) - median(tiny.to_kernel)) * 1e6,
                      "startup_10m_us - startup_us (" + size_label(big.fatbin) + " against " +
                          size_label(tiny.fatbin) + " of fatbin)"};
    });
}

// The child side of the launch_rate rows (qcuda_bench --child-launches N): opens its session,
// loads the module with one launch, says "ready", waits until its stdin ends (the parent closes
// the pipe: every child starts at once), launches N empty kernels, synchronizes, and prints
// "done <start> <end>" (CLOCK_MONOTONIC seconds). A failed call: "error ..." and exit 1.
int child_launches(int n)
{
    auto check = [](cudaError_t err, const char *what) {
        if (err == cudaSuccess)
            return;
        std::printf("error: %s returned %s (%d: %s)\n", what, cudaGetErrorName(err), (int)err,
                    cudaGetErrorString(err));
        std::exit(1);
    };
    check(cudaFree(0), "cudaFree(0)");
    empty_kernel<<<1, 1>>>();
    check(cudaGetLastError(), "the warm-up launch");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the warm-up launch");
    std::printf("ready\n");
    std::fflush(stdout);
    char c;
    for (ssize_t r; (r = read(0, &c, 1)) != 0;)
        if (r < 0 && errno != EINTR)
            break;
    const double t0 = now_seconds();
    for (int i = 0; i < n; i++)
        empty_kernel<<<1, 1>>>();
    check(cudaGetLastError(), "a launch");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the launches");
    const double t1 = now_seconds();
    std::printf("done %.9f %.9f\n", t0, t1);
    return 0;
}

// Aggregate launches per second of `procs` processes launching n kernels each at once: procs * n
// over the first child's start to the last child's end.
double launch_rate(const std::string &self, int procs, int n)
{
    const double deadline = now_seconds() + 600;
    Fd go_read, go_write;
    open_pipe(go_read, go_write);
    std::vector<std::unique_ptr<Child>> children;
    for (int i = 0; i < procs; i++)
        children.push_back(std::make_unique<Child>(
            std::vector<std::string>{self, "--child-launches", std::to_string(n)}, go_read.get()));
    for (auto &child : children) {
        std::string l = child->line(deadline);
        if (l != "ready")
            unavailable("a launching process said: %s", l.c_str());
    }
    go_write.reset(); // every child's read of stdin ends now
    double first = 1e300, last = -1e300;
    for (auto &child : children) {
        std::string l = child->line(deadline);
        double t0 = 0, t1 = 0;
        if (std::sscanf(l.c_str(), "done %lf %lf", &t0, &t1) != 2 || !(t0 <= t1))
            unavailable("a launching process said: %s", l.c_str());
        child->wait(deadline);
        first = std::min(first, t0);
        last = std::max(last, t1);
    }
    return procs * (double)n / std::max(last - first, 1e-9);
}

// launch_rate_<N>proc and scaling_<N>proc for 1, 2, 4 and 8 processes.
void scaling_rows(const Plan &plan)
{
    std::string self, why;
    try {
        self = self_path();
    } catch (const Unavailable &u) {
        why = u.why;
    }
    double one = 0;
    for (int procs : {1, 2, 4, 8}) {
        char metric[32];
        std::snprintf(metric, sizeof metric, "launch_rate_%dproc", procs);
        double rate = 0; // stays 0 unless the row is measured
        measure(metric, 0, "launch/s", [&] {
            if (!why.empty())
                unavailable("%s", why.c_str());
            double best = 0;
            for (int run = 0; run < plan.proc_runs; run++)
                best = std::max(best, launch_rate(self, procs, plan.proc_launches));
            rate = best;
            return Sample{rate, std::to_string(procs) + " x " +
                                    std::to_string(plan.proc_launches) +
                                    " launches + a synchronize, " + best_of(plan.proc_runs)};
        });
        if (procs == 1) {
            one = rate;
            continue;
        }
        std::snprintf(metric, sizeof metric, "scaling_%dproc", procs);
        measure(metric, 0, "x", [&] {
            if (one <= 0 || rate <= 0)
                unavailable("no launch rate for 1 or %d processes (see above)", procs);
            return Sample{rate / one, "launch_rate_" + std::to_string(procs) +
                                          "proc / launch_rate_1proc"};
        });
    }
}

// Parses "N", "NK", "NM" or "NG" (binary units); 0 on a malformed number.
size_t parse_bytes(const char *s)
{
    char *end = nullptr;
    unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s)
        return 0;
    switch (*end) {
    case '\0': return v;
    case 'K': case 'k': v *= kKiB; break;
    case 'M': case 'm': v *= kMiB; break;
    case 'G': case 'g': v *= kGiB; break;
    default: return 0;
    }
    return end[1] == '\0' ? v : 0;
}

[[noreturn]] void usage(const char *argv0, int code)
{
    std::fprintf(code ? stderr : stdout,
                 "usage: %s [--quick] [--min-bytes N[K|M|G]] [--max-bytes N[K|M|G]] [--only GROUPS]\n"
                 "          [--schedule auto|spin|yield|block]\n"
                 "  GROUPS: a comma-separated list of latency, startup, scaling, pageable, pinned,\n"
                 "  zerocopy (default: all); the byte bounds limit the copy and zero-copy sizes;\n"
                 "  --schedule: cudaSetDeviceFlags' scheduling flag (how threads wait for the GPU)\n"
                 "   or: %s --sustain launch|h2d|d2h --seconds S --sync DIR --tag NAME\n"
                 "  one process of scripts/bench-scale.sh: creates DIR/ready.KIND.NAME, waits for\n"
                 "  DIR/go.KIND, runs KIND for S seconds, prints its rate\n",
                 argv0, argv0);
    std::exit(code);
}

int device_attribute(cudaDeviceAttr attr, const char *name, int fallback)
{
    int v = 0;
    cudaError_t err = cudaDeviceGetAttribute(&v, attr, 0);
    if (err == cudaSuccess)
        return v;
    cudaGetLastError();
    std::fprintf(stderr, "qcuda_bench: cudaDeviceGetAttribute(%s) returned %s; taking %d\n", name,
                 cudaGetErrorName(err), fallback);
    return fallback;
}

// Whether there is a CUDA device. Without one (or without a driver) it prints the SKIP line and
// says no; any other error is a FAIL: a broken transport must not pass for a host without a GPU.
bool have_device()
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
        (err == cudaSuccess && count == 0)) {
        std::printf("SKIP: no CUDA device (%s)\n",
                    err == cudaSuccess ? "device count 0" : cudaGetErrorName(err));
        return false;
    }
    if (err != cudaSuccess)
        fail("cudaGetDeviceCount returned %s (%d: %s)", cudaGetErrorName(err), (int)err,
             cudaGetErrorString(err));
    return true;
}

// --- sustained load from many processes at once (scripts/bench-scale.sh) ----------------------

// qcuda_bench --sustain KIND --seconds S --sync DIR --tag NAME is one of many processes that load
// the GPU together, natively or spread over several guests. Each gets ready (its session, its
// buffers, one checked operation), says so by creating DIR/ready.KIND.NAME, and waits for
// DIR/go.KIND, which the script creates once every process is ready; then it runs KIND for S
// seconds and prints its own rate, and the script adds the rates up. Files rather than a pipe:
// a guest's processes share nothing with the host but a directory (virtiofs).
constexpr size_t kSustainBytes = 64 * kMiB;
constexpr int kSustainLaunchBatch = 1000; // launches between two looks at the clock
constexpr double kSustainGoWait = 3600;   // seconds; a script that died never says go

struct Sustain {
    std::string kind, dir, tag;
    double seconds = 0;
    bool launch() const { return kind == "launch"; }
    std::string metric() const { return "sustain_" + kind; }
};

// Announces this process ready and returns once DIR/go.KIND exists.
void await_go(const Sustain &a)
{
    const std::string ready = a.dir + "/ready." + a.kind + "." + a.tag;
    Fd fd(open(ready.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0)
        unavailable("cannot create %s: %s", ready.c_str(), std::strerror(errno));
    fd.reset();
    // stat every millisecond: in a guest each is a FUSE lookup, which the share must not cache
    // (bench-scale.sh runs virtiofsd with --cache=never), so the start is late by a millisecond
    // at most.
    const std::string go = a.dir + "/go." + a.kind;
    const double deadline = now_seconds() + kSustainGoWait;
    struct stat st;
    while (stat(go.c_str(), &st) != 0) {
        if (errno != ENOENT)
            unavailable("stat(%s) failed: %s", go.c_str(), std::strerror(errno));
        if (now_seconds() > deadline)
            unavailable("no %s after %.0f s", go.c_str(), kSustainGoWait);
        usleep(1000);
    }
}

// Empty launches, back to back, for a.seconds: no synchronize until the end, so the rate is what
// the launch path sustains with the queue full. Returns the seconds taken, n the launches.
double sustain_launches(const Sustain &a, int grid, long long &n)
{
    // A kernel's writes checked once, so that launches which do not run cannot pass for fast ones.
    {
        const uint32_t seed = 0x1a0c0000u;
        Owned dev = device_alloc(kMiB);
        std::vector<uint32_t> host(kMiB / 4);
        fill_words<<<grid, kBlock>>>((uint32_t *)dev.get(), host.size(), seed);
        NEED(cudaGetLastError());
        NEED(cudaMemcpy(host.data(), dev.get(), kMiB, cudaMemcpyDeviceToHost));
        verify_host(host.data(), kMiB, seed, a.metric().c_str());
    }
    empty_kernel<<<1, 1>>>(); // the warm-up
    NEED(cudaGetLastError());
    NEED(cudaDeviceSynchronize());
    await_go(a);
    const double t0 = now_seconds(), end = t0 + a.seconds;
    n = 0;
    do {
        for (int i = 0; i < kSustainLaunchBatch; i++) {
            empty_kernel<<<1, 1>>>();
            NEED(cudaGetLastError());
        }
        n += kSustainLaunchBatch;
    } while (now_seconds() < end);
    NEED(cudaDeviceSynchronize());
    return now_seconds() - t0;
}

// 64 MiB copies between cudaMallocHost memory and the device, each a cudaMemcpyAsync on a
// created stream and a cudaStreamSynchronize, for a.seconds. Returns the seconds taken, n the
// copies.
double sustain_copies(const Sustain &a, int grid, long long &n)
{
    const bool h2d = a.kind == "h2d";
    const cudaMemcpyKind dir = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    const uint32_t seed = h2d ? 0x2d0d0000u : 0xd20d0000u;
    Owned dev = device_alloc(kSustainBytes);
    Owned host = pinned_alloc(kSustainBytes);
    Stream stream;
    void *to = h2d ? dev.get() : host.get();
    const void *from = h2d ? host.get() : dev.get();
    auto copy = [&] {
        NEED(cudaMemcpyAsync(to, from, kSustainBytes, dir, stream.get()));
        NEED(cudaStreamSynchronize(stream.get()));
    };
    // The warm-up copy is the checked one: the source holds a pattern, the destination does not
    // (fresh memory), so a copy that did not land, or landed wrong, is a FAIL.
    if (h2d) {
        fill_host((uint32_t *)host.get(), kSustainBytes / 4, seed);
        copy();
        verify_device(dev.get(), kSustainBytes, seed, grid, a.metric().c_str());
    } else {
        fill_words<<<grid, kBlock>>>((uint32_t *)dev.get(), kSustainBytes / 4, seed);
        NEED(cudaGetLastError());
        NEED(cudaDeviceSynchronize());
        copy();
        verify_host(host.get(), kSustainBytes, seed, a.metric().c_str());
    }
    await_go(a);
    const double t0 = now_seconds(), end = t0 + a.seconds;
    n = 0;
    do {
        copy();
        n++;
    } while (now_seconds() < end);
    NEED(cudaDeviceSynchronize());
    return now_seconds() - t0;
}

// The --sustain mode: one row, "sustain_KIND,<bytes per operation>,<rate>,<unit>", and the count
// on stderr. Exit 0; 1 after a FAIL or a failed call (then the row reads NA); 2 without a device.
int sustain_main(const Sustain &a)
{
    if (!have_device())
        return 2;
    const std::string metric = a.metric();
    const size_t bytes = a.launch() ? 0 : kSustainBytes;
    const char *unit = a.launch() ? "launch/s" : "GB/s";
    try {
        NEED(cudaFree(0)); // the session, before anything is counted
        const int grid =
            4 * device_attribute(cudaDevAttrMultiProcessorCount, "MultiProcessorCount", 100);
        long long n = 0;
        const double secs = a.launch() ? sustain_launches(a, grid, n) : sustain_copies(a, grid, n);
        char value[32];
        const double rate = a.launch() ? n / secs : n * (double)bytes / secs / 1e9;
        std::snprintf(value, sizeof value, "%.3f", rate);
        print_row(metric.c_str(), bytes, value, unit);
        std::fprintf(stderr, "qcuda_bench: %s %s: %lld %s in %.3f s, %s %s\n", metric.c_str(),
                     a.tag.c_str(), n, a.launch() ? "launches" : "copies of 64 MiB", secs, value,
                     unit);
        return 0;
    } catch (const Unavailable &u) {
        print_na(metric.c_str(), bytes, unit, u.why);
        return 1;
    }
}

// Parses --sustain KIND --seconds S --sync DIR --tag NAME (any order); exits 64 on a bad one.
Sustain parse_sustain(int argc, char **argv)
{
    Sustain a;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : nullptr;
        if (!val)
            usage(argv[0], 64);
        if (!std::strcmp(opt, "--sustain"))
            a.kind = val;
        else if (!std::strcmp(opt, "--seconds")) {
            char *end = nullptr;
            a.seconds = std::strtod(val, &end);
            if (end == val || *end || !std::isfinite(a.seconds))
                a.seconds = 0;
        } else if (!std::strcmp(opt, "--sync"))
            a.dir = val;
        else if (!std::strcmp(opt, "--tag"))
            a.tag = val;
        else
            usage(argv[0], 64);
        i++;
    }
    if ((a.kind != "launch" && a.kind != "h2d" && a.kind != "d2h") || !(a.seconds > 0) ||
        a.dir.empty() || a.tag.empty() || a.tag.find('/') != std::string::npos)
        usage(argv[0], 64);
    return a;
}

} // namespace

int main(int argc, char **argv)
{
    if (argc == 3 && !std::strcmp(argv[1], "--child-launches")) {
        const int n = std::atoi(argv[2]);
        if (n <= 0)
            usage(argv[0], 64);
        return child_launches(n);
    }
    for (int i = 1; i < argc; i++)
        if (!std::strcmp(argv[i], "--sustain"))
            return sustain_main(parse_sustain(argc, argv));
    bool quick = false;
    unsigned schedule = cudaDeviceScheduleAuto;
    size_t max_bytes = kGiB, min_bytes = 1;
    std::string only = "latency,startup,scaling,pageable,pinned,zerocopy";
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--quick"))
            quick = true;
        else if (!std::strcmp(argv[i], "--max-bytes") && i + 1 < argc)
            max_bytes = parse_bytes(argv[++i]);
        else if (!std::strcmp(argv[i], "--min-bytes") && i + 1 < argc)
            min_bytes = parse_bytes(argv[++i]);
        else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!std::strcmp(argv[i], "--schedule") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!std::strcmp(v, "auto"))
                schedule = cudaDeviceScheduleAuto;
            else if (!std::strcmp(v, "spin"))
                schedule = cudaDeviceScheduleSpin;
            else if (!std::strcmp(v, "yield"))
                schedule = cudaDeviceScheduleYield;
            else if (!std::strcmp(v, "block"))
                schedule = cudaDeviceScheduleBlockingSync;
            else
                usage(argv[0], 64);
        }
        else if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help"))
            usage(argv[0], 0);
        else
            usage(argv[0], 64);
        if (max_bytes == 0 || min_bytes == 0)
            usage(argv[0], 64);
    }
    // Whether GROUP is in the --only list (exact items).
    const auto wanted = [&only](const char *group) {
        std::string list = "," + only + ",";
        return list.find("," + std::string(group) + ",") != std::string::npos;
    };
    {
        std::string rest = "," + only + ",";
        for (const char *g : {"latency", "startup", "scaling", "pageable", "pinned", "zerocopy"}) {
            const std::string item = "," + std::string(g) + ",";
            for (size_t at; (at = rest.find(item)) != std::string::npos;)
                rest.erase(at, item.size() - 1);
        }
        if (rest.find_first_not_of(',') != std::string::npos)
            usage(argv[0], 64);
    }
    const Plan plan = make_plan(quick, max_bytes);

    if (!have_device())
        return 2;

    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        cudaGetLastError();
        std::snprintf(prop.name, sizeof prop.name, "(unknown: cudaGetDeviceProperties failed)");
    }
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    const int sms = device_attribute(cudaDevAttrMultiProcessorCount, "MultiProcessorCount", 100);
    const bool can_map =
        device_attribute(cudaDevAttrCanMapHostMemory, "CanMapHostMemory", 0) != 0;
    cudaError_t err;
    // Mapped host memory needs this flag on old drivers; with unified addressing it is implied.
    // The scheduling flag decides how the program's threads wait for the GPU (both sides).
    const unsigned device_flags = (can_map ? cudaDeviceMapHost : 0) | schedule;
    if (device_flags && (err = cudaSetDeviceFlags(device_flags)) != cudaSuccess) {
        cudaGetLastError();
        std::fprintf(stderr, "qcuda_bench: cudaSetDeviceFlags(%#x) returned %s\n", device_flags,
                     cudaGetErrorName(err));
    }
    const int grid = 4 * sms;
    std::fprintf(stderr,
                 "qcuda_bench: %s, %d SMs, driver %d.%d, runtime %d.%d; %s run, up to %s\n",
                 prop.name, sms, driver / 1000, driver % 1000 / 10, runtime / 1000,
                 runtime % 1000 / 10, quick ? "quick" : "full", size_label(max_bytes).c_str());

    std::printf("metric,bytes,value,unit\n");
    double t = now_seconds();
    if (wanted("latency"))
        latency_rows(plan);
    if (wanted("startup"))
        startup_rows(plan);
    if (wanted("scaling"))
        scaling_rows(plan);
    for (bool pinned : {false, true})
        for (size_t bytes : kCopySizes)
            if (bytes >= min_bytes && bytes <= plan.max_bytes && wanted(pinned ? "pinned" : "pageable"))
                copy_rows(plan, pinned, bytes, grid);
    for (size_t bytes : kZeroCopySizes)
        if (bytes >= min_bytes && bytes <= plan.max_bytes && wanted("zerocopy"))
            zerocopy_rows(plan, bytes, grid, can_map);
    std::fprintf(stderr, "qcuda_bench: done in %.1f s\n", now_seconds() - t);
    return 0;
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// Mixed load: several threads, each on its own stream, run a random mix of the operations real
// programs use (pageable, pinned, registered and mapped copies, launches, events, stream-ordered
// allocation, host functions, graphs, memsets, device-to-device copies), and check every result
// exactly. Used three ways:
//
//   mixed_load                          a short run (4 threads x 24 operations): a test program
//   mixed_load --threads 8 --seconds 300  the load test (scripts/load-test.sh, 32 processes)
//   mixed_load --threads 4 --forever      a target for killtest: runs until killed
//
// With --seconds or --forever it prints "progress N" (operations done by all threads) as work
// completes, at most every 50 ms, so a harness can tell that the process is in business.
#define TEST_NAME "mixed_load"
#include "selfcheck.cuh"

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

// y[i] = a * x[i] + b, in integers so that results are exact.
__global__ void axpb(const int *x, int *y, int n, int a, int b)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = a * x[i] + b;
}

__global__ void add_one(int *p, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] += 1;
}

static std::atomic<unsigned long long> g_ops{0};
static std::atomic<bool> g_stop{false};

static void CUDART_CB bump(void *arg)
{
    static_cast<std::atomic<int> *>(arg)->fetch_add(1);
}

static int grid_for(int n) { return n / 256 + 1 < 1024 ? n / 256 + 1 : 1024; }

static void expect_axpb(const int *x, const int *y, int n, int a, int b, const char *what)
{
    for (int i = 0; i < n; i++)
        if (y[i] != a * x[i] + b)
            fail("%s: element %d of %d is %d, expected %d", what, i, n, y[i], a * x[i] + b);
}

static void fill(int *p, int n, Lcg &rng)
{
    for (int i = 0; i < n; i++)
        p[i] = (int)(rng.next() & 0xffff);
}

struct Worker {
    int id;
    Lcg rng;
    cudaStream_t stream;

    // The operations; each checks its own result.
    void pageable(int n)
    {
        std::vector<int> x(n), y(n);
        fill(x.data(), n, rng);
        int *dx, *dy;
        CHECK(cudaMalloc(&dx, n * sizeof(int)));
        CHECK(cudaMalloc(&dy, n * sizeof(int)));
        // On the worker's stream: a pageable cudaMemcpy may return before its DMA is done, and
        // a non-blocking stream does not wait for the legacy stream (natively this raced).
        CHECK(cudaMemcpyAsync(dx, x.data(), n * sizeof(int), cudaMemcpyHostToDevice, stream));
        int a = (int)(rng.next() % 7) + 1, b = id;
        axpb<<<grid_for(n), 256, 0, stream>>>(dx, dy, n, a, b);
        CHECK_LAUNCH();
        CHECK(cudaStreamSynchronize(stream));
        CHECK(cudaMemcpy(y.data(), dy, n * sizeof(int), cudaMemcpyDeviceToHost));
        expect_axpb(x.data(), y.data(), n, a, b, "pageable copy + kernel");
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dy));
    }

    void pinned(int n)
    {
        int *x, *y, *dx, *dy;
        CHECK(cudaMallocHost(&x, n * sizeof(int)));
        CHECK(cudaMallocHost(&y, n * sizeof(int)));
        CHECK(cudaMalloc(&dx, n * sizeof(int)));
        CHECK(cudaMalloc(&dy, n * sizeof(int)));
        fill(x, n, rng);
        int a = 3, b = -id;
        CHECK(cudaMemcpyAsync(dx, x, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        axpb<<<grid_for(n), 256, 0, stream>>>(dx, dy, n, a, b);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(y, dy, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        expect_axpb(x, y, n, a, b, "pinned async copies + kernel");
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dy));
        CHECK(cudaFreeHost(x));
        CHECK(cudaFreeHost(y));
    }

    void registered(int n)
    {
        // Whole pages of their own: another thread's heap block must not share a registered
        // page.
        const size_t bytes = (n * sizeof(int) + 4095) & ~(size_t)4095;
        int *x = static_cast<int *>(std::aligned_alloc(4096, bytes));
        int *y = static_cast<int *>(std::aligned_alloc(4096, bytes));
        if (!x || !y)
            fail("aligned_alloc of %zu bytes", bytes);
        CHECK(cudaHostRegister(x, n * sizeof(int), cudaHostRegisterDefault));
        CHECK(cudaHostRegister(y, n * sizeof(int), cudaHostRegisterDefault));
        fill(x, n, rng);
        int *dx, *dy;
        CHECK(cudaMalloc(&dx, n * sizeof(int)));
        CHECK(cudaMalloc(&dy, n * sizeof(int)));
        CHECK(cudaMemcpyAsync(dx, x, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        axpb<<<grid_for(n), 256, 0, stream>>>(dx, dy, n, 5, 1);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(y, dy, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        expect_axpb(x, y, n, 5, 1, "registered memory copies + kernel");
        CHECK(cudaHostUnregister(x));
        CHECK(cudaHostUnregister(y));
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dy));
        std::free(x);
        std::free(y);
    }

    void mapped(int n)
    {
        int *x, *y, *dx, *dy;
        CHECK(cudaHostAlloc(&x, n * sizeof(int), cudaHostAllocMapped));
        CHECK(cudaHostAlloc(&y, n * sizeof(int), cudaHostAllocMapped));
        CHECK(cudaHostGetDevicePointer(&dx, x, 0));
        CHECK(cudaHostGetDevicePointer(&dy, y, 0));
        fill(x, n, rng);
        std::memset(y, 0, n * sizeof(int));
        axpb<<<grid_for(n), 256, 0, stream>>>(dx, dy, n, 2, 7);
        CHECK_LAUNCH();
        CHECK(cudaStreamSynchronize(stream));
        expect_axpb(x, y, n, 2, 7, "zero-copy kernel on mapped host memory");
        CHECK(cudaFreeHost(x));
        CHECK(cudaFreeHost(y));
    }

    void events(int n)
    {
        int *d;
        CHECK(cudaMalloc(&d, n * sizeof(int)));
        CHECK(cudaMemsetAsync(d, 0, n * sizeof(int), stream));
        cudaEvent_t start, stop;
        CHECK(cudaEventCreate(&start));
        CHECK(cudaEventCreate(&stop));
        const int launches = 16 + (int)(rng.next() % 48);
        CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < launches; i++)
            add_one<<<grid_for(n), 256, 0, stream>>>(d, n);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = -1;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (ms < 0)
            fail("cudaEventElapsedTime gave %f ms", ms);
        int probe[2];
        CHECK(cudaMemcpy(&probe[0], d, sizeof(int), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(&probe[1], d + n - 1, sizeof(int), cudaMemcpyDeviceToHost));
        if (probe[0] != launches || probe[1] != launches)
            fail("%d async launches then an event: first/last element %d/%d", launches,
                 probe[0], probe[1]);
        CHECK(cudaEventDestroy(start));
        CHECK(cudaEventDestroy(stop));
        CHECK(cudaFree(d));
    }

    void stream_ordered(int n)
    {
        int *d;
        std::vector<int> y(n);
        CHECK(cudaMallocAsync(&d, n * sizeof(int), stream));
        CHECK(cudaMemsetAsync(d, 0, n * sizeof(int), stream));
        add_one<<<grid_for(n), 256, 0, stream>>>(d, n);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(y.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
        CHECK(cudaFreeAsync(d, stream));
        CHECK(cudaStreamSynchronize(stream));
        for (int i = 0; i < n; i++)
            if (y[i] != 1)
                fail("stream-ordered allocation: element %d is %d, expected 1", i, y[i]);
    }

    void host_function()
    {
        std::atomic<int> calls{0};
        const int k = 1 + (int)(rng.next() % 4);
        for (int i = 0; i < k; i++)
            CHECK(cudaLaunchHostFunc(stream, bump, &calls));
        CHECK(cudaStreamSynchronize(stream));
        if (calls.load() != k)
            fail("%d host functions enqueued, %d ran by the stream's synchronisation", k,
                 calls.load());
    }

    void graph(int n)
    {
        int *d, *y;
        CHECK(cudaMalloc(&d, n * sizeof(int)));
        CHECK(cudaMallocHost(&y, n * sizeof(int)));
        cudaGraph_t g;
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        CHECK(cudaMemsetAsync(d, 0, n * sizeof(int), stream));
        for (int i = 0; i < 3; i++)
            add_one<<<grid_for(n), 256, 0, stream>>>(d, n);
        CHECK(cudaMemcpyAsync(y, d, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamEndCapture(stream, &g));
        cudaGraphExec_t exec;
        CHECK(cudaGraphInstantiate(&exec, g, 0));
        for (int round = 0; round < 2; round++) {
            std::memset(y, 0xff, n * sizeof(int));
            CHECK(cudaGraphLaunch(exec, stream));
            CHECK(cudaStreamSynchronize(stream));
            for (int i = 0; i < n; i++)
                if (y[i] != 3)
                    fail("graph launch %d: element %d is %d, expected 3", round, i, y[i]);
        }
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(g));
        CHECK(cudaFreeHost(y));
        CHECK(cudaFree(d));
    }

    void memset_and_copies(int n)
    {
        int *a, *b;
        CHECK(cudaMalloc(&a, n * sizeof(int)));
        CHECK(cudaMalloc(&b, n * sizeof(int)));
        const int byte = (int)(rng.next() & 0xff);
        CHECK(cudaMemset(a, byte, n * sizeof(int)));
        CHECK(cudaMemcpy(b, a, n * sizeof(int), cudaMemcpyDeviceToDevice));
        std::vector<unsigned char> y(n * sizeof(int));
        CHECK(cudaMemcpy(y.data(), b, y.size(), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < y.size(); i++)
            if (y[i] != byte)
                fail("memset %#x then a device-to-device copy: byte %zu is %#x", byte, i, y[i]);
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
    }

    void one()
    {
        // Mostly 4 KiB to 1 MiB, sometimes 4 MiB.
        int n = 1024 << (rng.next() % 9);
        if (n > (256 << 10))
            n = 1 << 20;
        switch (rng.next() % 9) {
        case 0: pageable(n); break;
        case 1: pinned(n); break;
        case 2: registered(n); break;
        case 3: mapped(n); break;
        case 4: events(n); break;
        case 5: stream_ordered(n); break;
        case 6: host_function(); break;
        case 7: graph(n); break;
        default: memset_and_copies(n); break;
        }
        g_ops.fetch_add(1);
    }
};

static void run_worker(int id, unsigned long long seed, long ops)
{
    Worker w{id, Lcg(seed * 1000 + id), nullptr};
    CHECK(cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking));
    for (long i = 0; (ops < 0 || i < ops) && !g_stop.load(); i++)
        w.one();
    CHECK(cudaStreamSynchronize(w.stream));
    CHECK(cudaStreamDestroy(w.stream));
}

int main(int argc, char **argv)
{
    int threads = 4;
    long ops = 24;
    double seconds = 0;
    bool forever = false, progress = false;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> const char * {
            if (i + 1 >= argc)
                fail("%s needs a value", a.c_str());
            return argv[++i];
        };
        if (a == "--threads")
            threads = std::atoi(value());
        else if (a == "--ops")
            ops = std::atol(value());
        else if (a == "--seconds")
            seconds = std::atof(value()), progress = true;
        else if (a == "--forever")
            forever = progress = true;
        else if (a == "--seed")
            seed = std::strtoull(value(), nullptr, 0);
        else
            fail("unknown argument %s (--threads N --ops N --seconds S --forever --seed N)",
                 a.c_str());
    }
    if (threads < 1 || threads > 256)
        fail("--threads %d: 1 to 256", threads);
    if (seconds > 0 || forever)
        ops = -1;

    require_device();
    double t0 = now_seconds();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
        pool.emplace_back(run_worker, t, seed, ops);
    unsigned long long shown = 0;
    while (ops < 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        unsigned long long done = g_ops.load();
        if (progress && done != shown) {
            std::printf("progress %llu\n", done);
            std::fflush(stdout);
            shown = done;
        }
        if (!forever && now_seconds() - t0 >= seconds) {
            g_stop.store(true);
            break;
        }
    }
    for (auto &t : pool)
        t.join();
    double took = now_seconds() - t0;
    std::printf("mixed_load: %d threads, %llu operations checked in %.1f s (%.1f per s)\n",
                threads, g_ops.load(), took, g_ops.load() / took);
    return pass();
}

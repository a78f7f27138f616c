// SPDX-License-Identifier: Apache-2.0 OR MIT
// Atomics on managed memory, and managed memory that is device memory while kernels use it.
//
// What CUDA allows depends on the device's attributes, which are printed first: with
// concurrentManagedAccess = 0 (what qcuda reports) the GPU has the managed memory while any
// kernel that may touch it runs, and the CPU after synchronising; with 1 (an H200 natively) the
// CPU may also touch it while kernels run. Checked, every count exact:
//
//   1. counting: 4000 blocks of 256 threads add 1 sixteen times to one counter with
//      system-scope atomicAdd_system and to another with device-scope atomicAdd (16 384 000
//      each); 1000 x 128 threads add 128 times each to one counter;
//   2. arrays: 2000 blocks of 256 threads add into 4096 counters (both scopes, each thread to
//      counter (i * 7) % 4096), against a CPU reference;
//   3. where the memory lives: a kernel streams over 256 MiB of managed memory 8 times after a
//      first kernel touched it; it must run at device-memory speed (at least 400 GB/s: memory
//      left in guest or host RAM and reached over the bus runs below 64 GB/s);
//   4. another stream synchronised while a kernel still adds on the first: the adds of both
//      kernels all count (the memory must not be copied back while work that may touch it runs);
//   5. cudaMemAttachHost memory: the CPU writes it while a kernel adds into other managed
//      memory, and what it wrote is there after synchronising;
//   6. the CPU writes, a kernel adds, the CPU reads after synchronising;
//   7. only where concurrentManagedAccess is 1: the CPU adds atomically to a counter while
//      256 x 256 GPU threads add 16 times each with atomicAdd_system (natively exact on such a
//      device).
#define TEST_NAME "managed_atomics"
#include "selfcheck.cuh"

#include <atomic>
#include <thread>
#include <vector>

__global__ void count(unsigned long long *c, int rounds)
{
    for (int i = 0; i < rounds; i++) {
        atomicAdd_system(&c[0], 1ULL);
        atomicAdd(&c[1], 1ULL);
    }
}

// Heavier contention: every thread adds 1 `rounds` times to one system-scope counter.
__global__ void hammer(unsigned long long *c, int rounds)
{
    for (int i = 0; i < rounds; i++)
        atomicAdd_system(c, 1ULL);
}

// Thread i adds 1 to counter (i * 7) % n of both arrays.
__global__ void spread(unsigned int *sys, unsigned int *dev, int n)
{
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    int k = (int)((i * 7) % n);
    atomicAdd_system(&sys[k], 1u);
    atomicAdd(&dev[k], 1u);
}

// x[i] = x[i] * 3 + 1 over n words, `passes` times (a grid-stride loop).
__global__ void stream(unsigned int *x, size_t n, int passes)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (int p = 0; p < passes; p++)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            x[i] = x[i] * 3 + 1;
}

__device__ unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One thread adds 1 to *c for `ns` nanoseconds and records how many times in *adds.
__global__ void add_for(unsigned long long *c, unsigned long long *adds, unsigned long long ns)
{
    unsigned long long start = now_ns(), n = 0;
    while (now_ns() - start < ns) {
        atomicAdd_system(c, 1ULL);
        n++;
    }
    *adds = n;
}

__global__ void add_to(unsigned long long *c, unsigned long long v)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        c[0] += v;
        c[1] += 2 * v;
    }
}

int main()
{
    require_device();
    int dev = 0;
    CHECK(cudaSetDevice(dev));
    int managed = 0, concurrent = 0, pageable = 0, direct = 0, native_atomics = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev));
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
    CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev));
    CHECK(cudaDeviceGetAttribute(&direct, cudaDevAttrDirectManagedMemAccessFromHost, dev));
    CHECK(cudaDeviceGetAttribute(&native_atomics, cudaDevAttrHostNativeAtomicSupported, dev));
    std::printf("managedMemory %d concurrentManagedAccess %d pageableMemoryAccess %d "
                "directManagedMemAccessFromHost %d hostNativeAtomicSupported %d\n",
                managed, concurrent, pageable, direct, native_atomics);
    if (!managed) {
        std::printf("SKIP %s: the device has no managed memory\n", TEST_NAME);
        return EXIT_SKIP;
    }

    // 1. Counting.
    unsigned long long *c = nullptr;
    CHECK(cudaMallocManaged(&c, 2 * sizeof *c));
    std::printf("a managed allocation at %p\n", (void *)c);
    c[0] = 0;
    c[1] = 0;
    const int blocks = 4000, threads = 256, rounds = 16;
    const unsigned long long want = (unsigned long long)blocks * threads * rounds;
    count<<<blocks, threads>>>(c, rounds);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    std::printf("system-scope %llu, device-scope %llu, expected %llu each\n", c[0], c[1], want);
    if (c[0] != want)
        fail("system-scope atomicAdd on managed memory counted %llu of %llu", c[0], want);
    if (c[1] != want)
        fail("device-scope atomicAdd on managed memory counted %llu of %llu", c[1], want);
    c[0] = 0;
    const unsigned long long want2 = 1000ULL * 128 * 128;
    hammer<<<1000, 128>>>(c, 128);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    std::printf("one counter: %llu, expected %llu\n", c[0], want2);
    if (c[0] != want2)
        fail("contended atomicAdd_system on managed memory counted %llu of %llu", c[0], want2);

    // 2. Arrays.
    const int n = 4096, sblocks = 2000, sthreads = 256;
    unsigned int *sys = nullptr, *devc = nullptr;
    CHECK(cudaMallocManaged(&sys, n * sizeof *sys));
    CHECK(cudaMallocManaged(&devc, n * sizeof *devc));
    for (int i = 0; i < n; i++)
        sys[i] = devc[i] = (unsigned)i;
    spread<<<sblocks, sthreads>>>(sys, devc, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned> ref(n);
    for (int i = 0; i < n; i++)
        ref[i] = (unsigned)i;
    for (unsigned long long i = 0; i < (unsigned long long)sblocks * sthreads; i++)
        ref[(i * 7) % n]++;
    for (int i = 0; i < n; i++) {
        if (sys[i] != ref[i])
            fail("system-scope array counter %d is %u, expected %u", i, sys[i], ref[i]);
        if (devc[i] != ref[i])
            fail("device-scope array counter %d is %u, expected %u", i, devc[i], ref[i]);
    }
    std::printf("4096 array counters of both scopes exact\n");

    // 3. Where the memory lives while kernels use it.
    const size_t words = (256u << 20) / sizeof(unsigned);
    unsigned *big = nullptr;
    CHECK(cudaMallocManaged(&big, words * sizeof *big));
    CHECK(cudaMemset(big, 0, words * sizeof *big));
    stream<<<1024, 256>>>(big, words, 1);
    CHECK_LAUNCH();
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    const int passes = 8;
    // No synchronisation since the first kernel: the memory stays where kernels use it.
    CHECK(cudaEventRecord(t0));
    stream<<<1024, 256>>>(big, words, passes);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(t1));
    CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    double gbs = 2.0 * passes * words * sizeof *big / (ms * 1e6);
    std::printf("a kernel over 256 MiB of managed memory: %.0f GB/s (%.2f ms)\n", gbs, ms);
    CHECK(cudaDeviceSynchronize());
    // 1 + 8 passes of x = 3x + 1 from 0, in 32-bit arithmetic.
    unsigned expect = 0;
    for (int p = 0; p < 1 + passes; p++)
        expect = expect * 3 + 1;
    for (size_t i = 0; i < words; i += words / 64)
        if (big[i] != expect)
            fail("managed word %zu is %u after the kernels, expected %u", i, big[i], expect);
    if (gbs < 400)
        fail("kernels reach managed memory at %.0f GB/s: it is not device memory", gbs);
    CHECK(cudaFree(big));

    // 4. Another stream synchronised while a kernel still adds on the first.
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    unsigned long long *x = nullptr;
    CHECK(cudaMallocManaged(&x, 2 * sizeof *x));
    x[0] = 0;
    x[1] = 0;
    add_for<<<1, 1, 0, a>>>(&x[0], &x[1], 1000ull * 1000 * 1000);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(b));
    hammer<<<100, 128, 0, b>>>(&x[0], 10);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(b));
    hammer<<<100, 128, 0, b>>>(&x[0], 10);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    const unsigned long long others = 2ULL * 100 * 128 * 10;
    std::printf("a kernel's %llu adds and %llu more on another stream: %llu\n", x[1], others,
                x[0]);
    if (x[0] != x[1] + others)
        fail("adds lost across a synchronisation of another stream: %llu, expected %llu", x[0],
             x[1] + others);
    CHECK(cudaFree(x));

    // 5. Memory attached to the host: the CPU's while a kernel runs.
    unsigned char *mine = nullptr;
    CHECK(cudaMallocManaged(&mine, 1 << 16, cudaMemAttachHost));
    c[0] = 0;
    add_for<<<1, 1, 0, a>>>(&c[0], &c[1], 100ull * 1000 * 1000);
    CHECK_LAUNCH();
    for (int i = 0; i < (1 << 16); i++)
        mine[i] = (unsigned char)(i * 13);
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < (1 << 16); i++)
        if (mine[i] != (unsigned char)(i * 13))
            fail("byte %d the CPU wrote to cudaMemAttachHost memory during a kernel is %u", i,
                 mine[i]);
    if (c[0] != c[1])
        fail("the kernel beside it added %llu times, the counter says %llu", c[1], c[0]);
    CHECK(cudaFree(mine));

    // 6. CPU writes, the GPU adds, the CPU reads after synchronising.
    c[0] = 1000;
    c[1] = 2000;
    add_to<<<1, 32>>>(c, 7);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    if (c[0] != 1007 || c[1] != 2014)
        fail("after the CPU's writes and a kernel: %llu and %llu, expected 1007 and 2014", c[0],
             c[1]);

    // 7. The CPU adding while the GPU adds: only where the device allows it.
    if (concurrent) {
        c[0] = 0;
        CHECK(cudaDeviceSynchronize());
        std::atomic<bool> stop{false};
        unsigned long long cpu_adds = 0;
        std::thread cpu([&] {
            while (!stop.load(std::memory_order_relaxed)) {
                __atomic_fetch_add(&c[0], 1ULL, __ATOMIC_SEQ_CST);
                cpu_adds++;
            }
        });
        hammer<<<256, 256>>>(c, 16);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        stop = true;
        cpu.join();
        const unsigned long long gpu_adds = 256ULL * 256 * 16;
        std::printf("the CPU's %llu adds and the GPU's %llu: %llu\n", cpu_adds, gpu_adds, c[0]);
        if (c[0] != gpu_adds + cpu_adds)
            fail("concurrent CPU and GPU atomics on managed memory: %llu, expected %llu", c[0],
                 gpu_adds + cpu_adds);
    } else {
        std::printf("no concurrent managed access: the CPU does not add while kernels run\n");
    }

    CHECK(cudaStreamDestroy(a));
    CHECK(cudaStreamDestroy(b));
    CHECK(cudaEventDestroy(t0));
    CHECK(cudaEventDestroy(t1));
    CHECK(cudaFree(sys));
    CHECK(cudaFree(devc));
    CHECK(cudaFree(c));
    return pass();
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// Atomics on managed memory: 4000 blocks of 256 threads each add 1 sixteen times to one counter
// with system-scope atomicAdd_system and to another with device-scope atomicAdd, both in one
// cudaMallocManaged allocation; after cudaDeviceSynchronize the CPU must read exactly
// 16 384 000 in each. Then the CPU writes the counters, a kernel adds to what it wrote, and the
// CPU reads the sums after synchronising (managed memory is coherent at synchronisation points,
// as CUDA documents for devices without concurrent managed access, and natively also with it).
// The device's managed-memory attributes are printed for the record.
#define TEST_NAME "managed_atomics"
#include "selfcheck.cuh"

__global__ void count(unsigned long long *c, int rounds)
{
    for (int i = 0; i < rounds; i++) {
        atomicAdd_system(&c[0], 1ULL);
        atomicAdd(&c[1], 1ULL);
    }
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
    int managed = 0, concurrent = 0, pageable = 0, direct = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev));
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
    CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev));
    CHECK(cudaDeviceGetAttribute(&direct, cudaDevAttrDirectManagedMemAccessFromHost, dev));
    std::printf("managedMemory %d concurrentManagedAccess %d pageableMemoryAccess %d "
                "directManagedMemAccessFromHost %d\n",
                managed, concurrent, pageable, direct);
    if (!managed) {
        std::printf("SKIP %s: the device has no managed memory\n", TEST_NAME);
        return EXIT_SKIP;
    }

    unsigned long long *c = nullptr;
    CHECK(cudaMallocManaged(&c, 2 * sizeof *c));
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

    // CPU writes, the GPU adds, the CPU reads after synchronising.
    c[0] = 1000;
    c[1] = 2000;
    add_to<<<1, 32>>>(c, 7);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    if (c[0] != 1007 || c[1] != 2014)
        fail("after the CPU's writes and a kernel: %llu and %llu, expected 1007 and 2014", c[0],
             c[1]);
    CHECK(cudaFree(c));
    return pass();
}

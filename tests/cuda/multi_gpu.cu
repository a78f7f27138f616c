// SPDX-License-Identifier: Apache-2.0 OR MIT
// Several GPUs: every device is visible and usable, cudaSetDevice is per thread, peer queries
// and peer access answer as the driver does, and cudaMemcpyPeer(Async) and cudaMemcpy between
// devices move the bytes. On a host with one GPU it checks what one GPU allows (a device is not
// its own peer, peer copies within the device) and says so.
#define TEST_NAME "multi_gpu"
#include "selfcheck.cuh"

#include <thread>
#include <vector>

__global__ void fill(int *p, int n, int base)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = base + i;
}

__global__ void add_one(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += 1;
}

static void check_values(const std::vector<int> &h, int base, int plus, const char *what)
{
    for (size_t i = 0; i < h.size(); i++)
        if (h[i] != base + (int)i + plus)
            fail("%s: element %zu is %d, want %d", what, i, h[i], base + (int)i + plus);
}

int main()
{
    require_device();
    const int n = 1 << 20;
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    std::printf("%d device(s)\n", count);

    // Every device computes on its own, from its own thread (cudaSetDevice is per thread).
    std::vector<std::thread> threads;
    std::vector<int> results(count, -1);
    for (int d = 0; d < count; d++)
        threads.emplace_back([d, n, &results] {
            if (cudaSetDevice(d) != cudaSuccess)
                return;
            int cur = -1;
            cudaGetDevice(&cur);
            int *p = nullptr;
            if (cudaMalloc(&p, n * sizeof(int)) != cudaSuccess)
                return;
            fill<<<(n + 255) / 256, 256>>>(p, n, 1000 * d);
            std::vector<int> h(n);
            cudaMemcpy(h.data(), p, n * sizeof(int), cudaMemcpyDeviceToHost);
            cudaFree(p);
            bool good = cur == d;
            for (int i = 0; i < n && good; i++)
                good = h[i] == 1000 * d + i;
            results[d] = good ? 1 : 0;
        });
    for (auto &t : threads)
        t.join();
    for (int d = 0; d < count; d++)
        if (results[d] != 1)
            fail("device %d did not compute correctly from its own thread", d);

    // A device is not its own peer; a device that does not exist is an error.
    int can = -1;
    CHECK(cudaDeviceCanAccessPeer(&can, 0, 0));
    if (can != 0)
        fail("device 0 says it can access itself as a peer");
    EXPECT_ERR(cudaDeviceCanAccessPeer(&can, 0, count), cudaErrorInvalidDevice);
    CHECK(cudaSetDevice(0));
    EXPECT_ERR(cudaDeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice);
    cudaGetLastError();

    // Peer copies within one device are plain copies.
    int *a = nullptr, *b = nullptr;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    fill<<<(n + 255) / 256, 256>>>(a, n, 7);
    CHECK(cudaMemcpyPeer(b, 0, a, 0, n * sizeof(int)));
    std::vector<int> h(n);
    CHECK(cudaMemcpy(h.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
    check_values(h, 7, 0, "peer copy within device 0");

    if (count < 2) {
        std::printf("one GPU: peer access and copies between devices not exercised\n");
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
        return pass();
    }

    // Two devices: the driver's answers, both ways.
    int can01 = -1, can10 = -1, rank = -1;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    CHECK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, 0, 1));
    std::printf("peer access 0->1 %d, 1->0 %d, performance rank %d\n", can01, can10, rank);

    // cudaMemcpyPeer and cudaMemcpyPeerAsync between the devices, whatever the peer access.
    int *c = nullptr;
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&c, n * sizeof(int)));
    CHECK(cudaMemcpyPeer(c, 1, a, 0, n * sizeof(int)));
    add_one<<<(n + 255) / 256, 256>>>(c, n);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpyPeerAsync(b, 0, c, 1, n * sizeof(int), s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemcpy(h.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
    check_values(h, 7, 1, "device 0 -> 1 -> 0 through peer copies");

    // With unified addressing, cudaMemcpy between the devices works too.
    CHECK(cudaMemcpy(c, a, n * sizeof(int), cudaMemcpyDefault));
    CHECK(cudaMemcpy(h.data(), c, n * sizeof(int), cudaMemcpyDefault));
    check_values(h, 7, 0, "cudaMemcpy between devices");

    if (can01) {
        // Peer access: a kernel on device 0 writes device 1's memory directly.
        CHECK(cudaDeviceEnablePeerAccess(1, 0));
        EXPECT_ERR(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
        cudaGetLastError();
        add_one<<<(n + 255) / 256, 256>>>(c, n);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(h.data(), c, n * sizeof(int), cudaMemcpyDefault));
        check_values(h, 7, 1, "kernel on device 0 through peer access");
        CHECK(cudaDeviceDisablePeerAccess(1));
        EXPECT_ERR(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
        cudaGetLastError();
    }
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(c));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    return pass();
}

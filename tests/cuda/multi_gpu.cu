// SPDX-License-Identifier: Apache-2.0 OR MIT
// Several GPUs: every device visible, cudaDeviceCanAccessPeer both ways agreeing with
// cudaDeviceGetP2PAttribute(AccessSupported), cudaMemcpyPeer and cudaMemcpyPeerAsync between
// devices 0 and 1 (with or without peer access), and where the GPUs can reach each other: peer
// access enabled (twice is an error), a kernel on device 0 reading device 1's memory, access to a
// memory pool of device 0 granted to device 1, peer access disabled (twice is an error). With one
// GPU only the single-device part runs (cudaMemcpyPeer within device 0, an unknown peer device
// refused) and the program says so before passing.
#define TEST_NAME "multi_gpu"
#include "selfcheck.cuh"

#include <vector>

__global__ void iota(int *p, int n, int base)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = base + i;
}

// out[i] = a[i] + b[i], where b may live on a peer device.
__global__ void add(const int *a, const int *b, int *out, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

static void expect_iota(const int *d, int n, int base, int device, const char *what)
{
    std::vector<int> h(n);
    CHECK(cudaSetDevice(device));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        if (h[i] != base + i)
            fail("%s: element %d is %d, expected %d", what, i, h[i], base + i);
}

int main()
{
    int count = require_device();
    for (int d = 0; d < count; d++) {
        cudaDeviceProp p;
        CHECK(cudaGetDeviceProperties(&p, d));
        std::printf("device %d: %s, %02x:%02x\n", d, p.name, p.pciBusID, p.pciDeviceID);
    }
    {
        // What holds with any number of GPUs: a copy "between" device 0 and itself, and a peer
        // that does not exist.
        const int m = 4096;
        int *x = nullptr, *y = nullptr;
        CHECK(cudaSetDevice(0));
        CHECK(cudaMalloc(&x, m * sizeof(int)));
        CHECK(cudaMalloc(&y, m * sizeof(int)));
        iota<<<4, 256>>>(x, m, 42);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyPeer(y, 0, x, 0, m * sizeof(int)));
        expect_iota(y, m, 42, 0, "cudaMemcpyPeer 0->0");
        int can = -1;
        EXPECT_ERR(cudaDeviceCanAccessPeer(&can, 0, count), cudaErrorInvalidDevice);
        EXPECT_ERR(cudaMemcpyPeer(y, 0, x, count, 16), cudaErrorInvalidDevice);
        cudaGetLastError();
        cudaError_t e = cudaDeviceCanAccessPeer(&can, 0, 0);
        std::printf("cudaDeviceCanAccessPeer(0, 0): %s, %d\n", cudaGetErrorName(e), can);
        cudaGetLastError();
        CHECK(cudaFree(x));
        CHECK(cudaFree(y));
    }
    if (count < 2) {
        std::printf("only %d GPU visible: peer access and copies between two devices not tested "
                    "(they need two)\n",
                    count);
        return pass();
    }

    int can01 = -1, can10 = -1, attr01 = -1;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    CHECK(cudaDeviceGetP2PAttribute(&attr01, cudaDevP2PAttrAccessSupported, 0, 1));
    int rank = -1;
    CHECK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, 0, 1));
    std::printf("peer access 0->1 %d, 1->0 %d, access attribute %d, performance rank %d\n", can01,
                can10, attr01, rank);
    if (attr01 != can01)
        fail("cudaDevP2PAttrAccessSupported %d disagrees with cudaDeviceCanAccessPeer %d", attr01,
             can01);

    // Copies between devices work with or without peer access.
    const int n = 1 << 20;
    int *a0 = nullptr, *b1 = nullptr;
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&b1, n * sizeof(int)));
    iota<<<64, 256>>>(b1, n, 1000);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&a0, n * sizeof(int)));
    CHECK(cudaMemcpyPeer(a0, 0, b1, 1, n * sizeof(int)));
    expect_iota(a0, n, 1000, 0, "cudaMemcpyPeer 1->0");

    CHECK(cudaSetDevice(0));
    iota<<<64, 256>>>(a0, n, 7);
    CHECK_LAUNCH();
    cudaStream_t s0;
    CHECK(cudaStreamCreate(&s0));
    CHECK(cudaMemcpyPeerAsync(b1, 1, a0, 0, n * sizeof(int), s0));
    CHECK(cudaStreamSynchronize(s0));
    expect_iota(b1, n, 7, 1, "cudaMemcpyPeerAsync 0->1");
    // With unified addressing a plain device-to-device copy may cross devices too.
    CHECK(cudaSetDevice(1));
    iota<<<64, 256>>>(b1, n, 99);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemcpy(a0, b1, n * sizeof(int), cudaMemcpyDefault));
    expect_iota(a0, n, 99, 0, "cudaMemcpy(Default) 1->0");

    CHECK(cudaSetDevice(0));
    EXPECT_ERR(cudaDeviceEnablePeerAccess(1, 1), cudaErrorInvalidValue);
    cudaGetLastError();
    if (!can01) {
        EXPECT_ERR(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessUnsupported);
        cudaGetLastError();
        std::printf("devices 0 and 1 cannot reach each other: direct access not tested\n");
    } else {
        CHECK(cudaDeviceEnablePeerAccess(1, 0));
        EXPECT_ERR(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
        cudaGetLastError();
        // A kernel on device 0 reads device 1's memory directly.
        CHECK(cudaSetDevice(1));
        iota<<<64, 256>>>(b1, n, 500);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(0));
        iota<<<64, 256>>>(a0, n, 0);
        int *out0 = nullptr;
        CHECK(cudaMalloc(&out0, n * sizeof(int)));
        add<<<64, 256>>>(a0, b1, out0, n);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        std::vector<int> h(n);
        CHECK(cudaMemcpy(h.data(), out0, n * sizeof(int), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++)
            if (h[i] != 2 * i + 500)
                fail("peer read: element %d is %d, expected %d", i, h[i], 2 * i + 500);
        CHECK(cudaFree(out0));

        // Device 1 may use a pool of device 0 once granted access.
        cudaMemPool_t pool0 = nullptr;
        CHECK(cudaDeviceGetDefaultMemPool(&pool0, 0));
        cudaMemLocation loc1 = {};
        loc1.type = cudaMemLocationTypeDevice;
        loc1.id = 1;
        cudaMemAccessFlags before = cudaMemAccessFlagsProtReadWrite;
        CHECK(cudaMemPoolGetAccess(&before, pool0, &loc1));
        cudaMemAccessDesc desc = {};
        desc.location = loc1;
        desc.flags = cudaMemAccessFlagsProtReadWrite;
        CHECK(cudaMemPoolSetAccess(pool0, &desc, 1));
        cudaMemAccessFlags after = cudaMemAccessFlagsProtNone;
        CHECK(cudaMemPoolGetAccess(&after, pool0, &loc1));
        std::printf("device 1's access to device 0's default pool: %d -> %d\n", (int)before,
                    (int)after);
        if (after != cudaMemAccessFlagsProtReadWrite)
            fail("pool access for device 1 reads %d after granting read-write", (int)after);
        desc.flags = cudaMemAccessFlagsProtNone;
        CHECK(cudaMemPoolSetAccess(pool0, &desc, 1));

        CHECK(cudaDeviceDisablePeerAccess(1));
        EXPECT_ERR(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
        cudaGetLastError();
    }

    CHECK(cudaStreamDestroy(s0));
    CHECK(cudaFree(a0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaFree(b1));
    return pass();
}

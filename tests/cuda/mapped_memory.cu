// SPDX-License-Identifier: Apache-2.0 OR MIT
// Host memory the GPU reads and writes directly (zero copy): kernels read and write
// cudaHostAlloc(cudaHostAllocMapped) memory through cudaHostGetDevicePointer, and a registered
// malloc'd buffer (cudaHostRegister); the host sees the results with no copy. Also checks the
// attributes programs look at first, pointer attributes, flags, and the register/unregister
// errors.
#define TEST_NAME "mapped_memory"
#include "selfcheck.cuh"

#include <cstring>
#include <vector>

// out[i] = in[i] * 3 + i, reading and writing host memory.
__global__ void triple_plus_index(const unsigned int *in, unsigned int *out, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = in[i] * 3u + (unsigned int)i;
}

static void run(const unsigned int *in_d, unsigned int *out_d, int n)
{
    triple_plus_index<<<256, 256>>>(in_d, out_d, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
}

static void expect(const unsigned int *in, const unsigned int *out, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (out[i] != in[i] * 3u + (unsigned int)i)
            fail("%s: element %d is %u, expected %u", what, i, out[i], in[i] * 3u + (unsigned int)i);
}

int main()
{
    require_device();
    int can_map = 0, unified = 0;
    CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
    CHECK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("canMapHostMemory %d, unifiedAddressing %d\n", prop.canMapHostMemory, unified);
    if (!can_map || !prop.canMapHostMemory)
        fail("the device says it cannot map host memory");
    CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));

    // 1. cudaHostAlloc(mapped): 24 MiB in, 24 MiB out.
    const int n = 6 << 20;
    const size_t bytes = n * sizeof(unsigned int);
    unsigned int *in = nullptr, *out = nullptr;
    CHECK(cudaHostAlloc(&in, bytes, cudaHostAllocMapped));
    CHECK(cudaHostAlloc(&out, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    unsigned int flags = 0;
    CHECK(cudaHostGetFlags(&flags, out));
    if (!(flags & cudaHostAllocMapped) || !(flags & cudaHostAllocPortable))
        fail("cudaHostGetFlags gave %#x", flags);
    Lcg rng(9);
    for (int i = 0; i < n; i++)
        in[i] = rng.next();
    std::memset(out, 0, bytes);
    unsigned int *in_d = nullptr, *out_d = nullptr;
    CHECK(cudaHostGetDevicePointer((void **)&in_d, in, 0));
    CHECK(cudaHostGetDevicePointer((void **)&out_d, out, 0));
    if (unified && (in_d != in || out_d != out))
        fail("with unified addressing the device pointer of cudaHostAlloc memory is the host "
             "pointer (%p vs %p)", (void *)in_d, (void *)in);
    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, in + 5));
    if (pa.type != cudaMemoryTypeHost || pa.devicePointer != in_d + 5 || pa.hostPointer != in + 5)
        fail("pointer attributes of mapped memory: type %d dev %p host %p", (int)pa.type,
             pa.devicePointer, pa.hostPointer);
    run(in_d, out_d, n);
    expect(in, out, n, "cudaHostAlloc memory");
    std::printf("kernel read and wrote %zu MiB of cudaHostAlloc memory\n", 2 * bytes >> 20);

    // 2. cudaHostRegister of malloc'd memory (not page-aligned on purpose).
    const int m = (3 << 20) + 123;
    std::vector<unsigned int> src(m + 7), dst(m + 7, 0);
    unsigned int *s = src.data() + 3, *d = dst.data() + 5;
    for (int i = 0; i < m; i++)
        s[i] = rng.next();
    CHECK(cudaHostRegister(s, m * sizeof(unsigned int), cudaHostRegisterMapped));
    CHECK(cudaHostRegister(d, m * sizeof(unsigned int), cudaHostRegisterPortable));
    EXPECT_ERR(cudaHostRegister(s + 10, 64, 0), cudaErrorHostMemoryAlreadyRegistered);
    cudaGetLastError(); // a failed call is also the thread's last error
    unsigned int *s_d = nullptr, *d_d = nullptr;
    CHECK(cudaHostGetDevicePointer((void **)&s_d, s, 0));
    CHECK(cudaHostGetDevicePointer((void **)&d_d, d, 0));
    run(s_d, d_d, m);
    expect(s, d, m, "registered malloc memory");
    if (dst[4] != 0 || dst[m + 5] != 0)
        fail("the kernel wrote outside the registered range");
    // Registered memory is an ordinary copy source and destination too.
    unsigned int *dev = nullptr;
    CHECK(cudaMalloc(&dev, m * sizeof(unsigned int)));
    CHECK(cudaMemcpy(dev, s, m * sizeof(unsigned int), cudaMemcpyHostToDevice));
    std::memset(d, 0, m * sizeof(unsigned int));
    CHECK(cudaMemcpy(d, dev, m * sizeof(unsigned int), cudaMemcpyDefault));
    if (std::memcmp(s, d, m * sizeof(unsigned int)) != 0)
        fail("copies through registered memory differ");
    CHECK(cudaHostUnregister(s));
    CHECK(cudaHostUnregister(d));
    EXPECT_ERR(cudaHostUnregister(s), cudaErrorHostMemoryNotRegistered);
    cudaGetLastError();
    std::printf("kernel read and wrote %zu MiB of registered malloc memory\n",
                2 * m * sizeof(unsigned int) >> 20);

    // 3. Freed memory is no longer host memory; the device pointer is gone.
    CHECK(cudaFree(dev));
    CHECK(cudaFreeHost(in));
    CHECK(cudaFreeHost(out));
    void *gone = nullptr;
    EXPECT_ERR(cudaHostGetDevicePointer(&gone, in, 0), cudaErrorInvalidValue);
    cudaGetLastError();
    return pass();
}

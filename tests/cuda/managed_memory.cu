// SPDX-License-Identifier: Apache-2.0 OR MIT
// Managed memory (cudaMallocManaged): one pointer that the program and its kernels share. A
// kernel reads what the host wrote and the host reads what a kernel wrote, with no copies;
// cudaFree releases it; pointer attributes say managed. __managed__ variables: initialised in
// the module, read and written by kernels and by the host in turns.
#define TEST_NAME "managed_memory"
#include "selfcheck.cuh"

__managed__ int counter = 5;
__managed__ float weights[4] = {1.0f, 2.0f, 3.0f, 4.0f};

// counter += step; weights[i] *= factor.
__global__ void touch_managed(int step, float factor)
{
    if (threadIdx.x == 0)
        counter += step;
    if (threadIdx.x < 4)
        weights[threadIdx.x] *= factor;
}

__global__ void scale_add(float *x, int n, float a, float b)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = x[i] * a + b;
}

// Per-block histograms of the low nibble (shared-memory atomics), one row of 16 per block.
__global__ void histogram(const unsigned char *v, int n, unsigned int *rows)
{
    __shared__ unsigned int local[16];
    if (threadIdx.x < 16)
        local[threadIdx.x] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        atomicAdd(&local[v[i] & 15], 1u);
    __syncthreads();
    if (threadIdx.x < 16)
        rows[blockIdx.x * 16 + threadIdx.x] = local[threadIdx.x];
}

int main()
{
    require_device();
    int managed = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0));
    if (!managed)
        fail("the device says it has no managed memory");
    const int n = 1 << 22;
    float *x = nullptr;
    CHECK(cudaMallocManaged(&x, n * sizeof(float)));
    for (int i = 0; i < n; i++)
        x[i] = (float)(i % 1000);
    scale_add<<<256, 256>>>(x, n, 2.0f, 1.0f);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++)
        if (x[i] != (float)(i % 1000) * 2.0f + 1.0f)
            fail("x[%d] = %f after the kernel", i, x[i]);
    // The host changes it again, a second kernel sees the change.
    x[7] = 100.0f;
    scale_add<<<1, 32>>>(x, 8, 1.0f, 0.5f);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    if (x[7] != 100.5f || x[0] != 1.5f)
        fail("second kernel: x[7] = %f, x[0] = %f", x[7], x[0]);

    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, x + 3));
    if (pa.type != cudaMemoryTypeManaged || pa.devicePointer != x + 3 || pa.hostPointer != x + 3)
        fail("pointer attributes: type %d dev %p host %p", (int)pa.type, pa.devicePointer,
             pa.hostPointer);

    // Managed counters written by atomics, managed input written by the host.
    unsigned char *v = nullptr;
    unsigned int *bins = nullptr;
    CHECK(cudaMallocManaged(&v, 1 << 20));
    const int blocks = 64;
    CHECK(cudaMallocManaged(&bins, blocks * 16 * sizeof(unsigned int), cudaMemAttachGlobal));
    for (int i = 0; i < blocks * 16; i++)
        bins[i] = 0xffffffffu;
    for (int i = 0; i < (1 << 20); i++)
        v[i] = (unsigned char)i;
    histogram<<<blocks, 256>>>(v, 1 << 20, bins);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    for (int b = 0; b < 16; b++) {
        unsigned int total = 0;
        for (int k = 0; k < blocks; k++)
            total += bins[k * 16 + b];
        if (total != (1u << 16))
            fail("bin %d holds %u, expected %u", b, total, 1u << 16);
    }
    // Copies to and from managed memory work like any other.
    float *dev = nullptr;
    CHECK(cudaMalloc(&dev, 4 * sizeof(float)));
    CHECK(cudaMemcpy(dev, x, 4 * sizeof(float), cudaMemcpyDefault));
    CHECK(cudaMemcpy(x + 100, dev, 4 * sizeof(float), cudaMemcpyDeviceToHost));
    if (x[100] != x[0] || x[103] != x[3])
        fail("copies through managed memory differ");
    CHECK(cudaFree(dev));
    CHECK(cudaFree(v));
    CHECK(cudaFree(bins));
    CHECK(cudaFree(x));
    // __managed__ variables: the module's initial values, then turns.
    if (counter != 5 || weights[3] != 4.0f)
        fail("__managed__ initial values: counter %d, weights[3] %f", counter, weights[3]);
    touch_managed<<<1, 32>>>(10, 2.0f);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    if (counter != 15 || weights[0] != 2.0f || weights[3] != 8.0f)
        fail("after a kernel: counter %d, weights %f %f", counter, weights[0], weights[3]);
    counter = 100;
    weights[1] = -1.0f;
    touch_managed<<<1, 32>>>(1, 3.0f);
    CHECK_LAUNCH();
    touch_managed<<<1, 32>>>(1, 1.0f);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(0));
    if (counter != 102 || weights[1] != -3.0f || weights[3] != 24.0f)
        fail("host writes then two kernels: counter %d, weights %f %f", counter, weights[1],
             weights[3]);

    // As natively: zero bytes is not an error.
    CHECK(cudaMallocManaged(&x, 0));
    CHECK(cudaFree(x));
    return pass();
}

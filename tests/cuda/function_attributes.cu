// SPDX-License-Identifier: Apache-2.0 OR MIT
// Kernel attributes and occupancy: cudaFuncGetAttributes (registers, shared and local memory,
// versions), cudaFuncSetAttribute opting a kernel in to more than 48 KiB of dynamic shared
// memory and a launch that uses it, cudaOccupancyMaxActiveBlocksPerMultiprocessor[WithFlags],
// and the header's cudaOccupancyMaxPotentialBlockSize built on them.
#define TEST_NAME "function_attributes"
#include "selfcheck.cuh"

#include <vector>

// Sums blocks of `n` ints through dynamic shared memory (sized by the launch).
__global__ void smem_sum(const int *in, int n, long long *out)
{
    extern __shared__ int buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        buf[i] = in[blockIdx.x * n + i];
    __syncthreads();
    if (threadIdx.x == 0) {
        long long s = 0;
        for (int i = 0; i < n; i++)
            s += buf[i];
        out[blockIdx.x] = s;
    }
}

// Uses static shared memory and enough registers to show up in the attributes.
__global__ void heavy(float *x)
{
    __shared__ float tile[1024];
    float acc[8];
    for (int k = 0; k < 8; k++)
        acc[k] = x[threadIdx.x * 8 + k];
    tile[threadIdx.x] = acc[0] * acc[1] + acc[2] * acc[3] + acc[4] * acc[5] + acc[6] * acc[7];
    __syncthreads();
    x[threadIdx.x] = tile[(threadIdx.x + 1) % blockDim.x];
}

int main()
{
    require_device();
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, heavy));
    std::printf("heavy: %d regs, %zu B static shared, %zu B local, max %d threads, ptx %d, "
                "sm %d, max dynamic shared %d\n",
                fa.numRegs, fa.sharedSizeBytes, fa.localSizeBytes, fa.maxThreadsPerBlock,
                fa.ptxVersion, fa.binaryVersion, fa.maxDynamicSharedSizeBytes);
    if (fa.sharedSizeBytes != 1024 * sizeof(float))
        fail("static shared memory is %zu bytes, expected %zu", fa.sharedSizeBytes,
             1024 * sizeof(float));
    if (fa.numRegs <= 0 || fa.maxThreadsPerBlock <= 0 || fa.binaryVersion != 90)
        fail("implausible attributes: %d regs, %d threads, binary %d", fa.numRegs,
             fa.maxThreadsPerBlock, fa.binaryVersion);

    // Occupancy, and the header's block-size search built on the two calls above.
    int blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, heavy, 256, 0));
    int blocks_flags = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        &blocks_flags, heavy, 256, 0, cudaOccupancyDisableCachingOverride));
    int min_grid = 0, best_block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &best_block, heavy, 0, 0));
    std::printf("occupancy: %d blocks of 256 per SM (%d with flags); best block %d, min grid %d\n",
                blocks, blocks_flags, best_block, min_grid);
    if (blocks < 1 || blocks > 8 || blocks_flags != blocks || best_block < 32 ||
        best_block > 1024 || min_grid < 1)
        fail("implausible occupancy figures");

    // More than 48 KiB of dynamic shared memory needs the opt-in, natively and here.
    const int n = 24 * 1024; // 96 KiB of ints per block
    const size_t smem = n * sizeof(int);
    const int nblocks = 8;
    std::vector<int> h(n * nblocks);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = (int)(i % 1000) - 300;
    int *d_in = nullptr;
    long long *d_out = nullptr;
    CHECK(cudaMalloc(&d_in, h.size() * sizeof(int)));
    CHECK(cudaMalloc(&d_out, nblocks * sizeof(long long)));
    CHECK(cudaMemcpy(d_in, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
    smem_sum<<<nblocks, 256, smem>>>(d_in, n, d_out);
    if (cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess)
        fail("a launch with 96 KiB of dynamic shared memory succeeded without the opt-in");
    cudaGetLastError();
    CHECK(cudaFuncSetAttribute(smem_sum, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CHECK(cudaFuncGetAttributes(&fa, smem_sum));
    if (fa.maxDynamicSharedSizeBytes != (int)smem)
        fail("maxDynamicSharedSizeBytes reads %d after setting %zu", fa.maxDynamicSharedSizeBytes,
             smem);
    smem_sum<<<nblocks, 256, smem>>>(d_in, n, d_out);
    CHECK_LAUNCH();
    std::vector<long long> got(nblocks);
    CHECK(cudaMemcpy(got.data(), d_out, got.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    for (int b = 0; b < nblocks; b++) {
        long long want = 0;
        for (int i = 0; i < n; i++)
            want += h[b * n + i];
        if (got[b] != want)
            fail("block %d summed %lld, expected %lld", b, got[b], want);
    }
    EXPECT_ERR(cudaFuncSetAttribute(smem_sum, (cudaFuncAttribute)99, 1), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    return pass();
}

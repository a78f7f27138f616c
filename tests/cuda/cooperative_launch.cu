// SPDX-License-Identifier: Apache-2.0 OR MIT
// Cooperative launch: cudaDevAttrCooperativeLaunch, a grid sized by occupancy so that every block
// is resident, cudaLaunchCooperativeKernel, and a kernel that synchronises the whole grid
// (cooperative_groups::this_grid().sync()) between writing per-block partial sums and block 0
// adding them. A grid too large to be resident is refused (cudaErrorCooperativeLaunchTooLarge).
#define TEST_NAME "cooperative_launch"
#include "selfcheck.cuh"

#include <cooperative_groups.h>
#include <vector>

namespace cg = cooperative_groups;

__global__ void grid_sum(const int *in, int n, long long *partial, long long *total)
{
    cg::grid_group grid = cg::this_grid();
    __shared__ long long s[256];
    long long acc = 0;
    for (long long i = grid.thread_rank(); i < n; i += grid.size())
        acc += in[i];
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s[0];
    grid.sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        long long t = 0;
        for (unsigned b = 0; b < gridDim.x; b++)
            t += partial[b];
        *total = t;
    }
}

int main()
{
    require_device();
    int coop = 0, sms = 0, per_sm = 0;
    CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    if (!coop)
        fail("the device reports no cooperative launch");
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_sum, 256, 0));
    const int blocks = sms * per_sm;
    const int n = 1 << 22;
    std::vector<int> h(n);
    long long want = 0;
    for (int i = 0; i < n; i++) {
        h[i] = (i * 7) % 1001 - 500;
        want += h[i];
    }
    int *d = nullptr;
    long long *partial = nullptr, *total = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMalloc(&partial, blocks * sizeof(long long)));
    CHECK(cudaMalloc(&total, sizeof(long long)));
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    int nn = n;
    void *args[] = {&d, &nn, &partial, &total};
    CHECK(cudaLaunchCooperativeKernel((void *)grid_sum, dim3(blocks), dim3(256), args, 0, 0));
    long long got = 0;
    CHECK(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost));
    std::printf("cooperative grid of %d blocks (%d SMs x %d): sum %lld\n", blocks, sms, per_sm, got);
    if (got != want)
        fail("grid-synchronised sum is %lld, expected %lld", got, want);
    // One block more than can be resident at once.
    cudaError_t e = cudaLaunchCooperativeKernel((void *)grid_sum, dim3(blocks + sms * 64), dim3(256),
                                                args, 0, 0);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    if (e != cudaErrorCooperativeLaunchTooLarge)
        fail("an oversized cooperative grid gave %s", cudaGetErrorName(e));
    cudaGetLastError();
    CHECK(cudaFree(d));
    CHECK(cudaFree(partial));
    CHECK(cudaFree(total));
    return pass();
}

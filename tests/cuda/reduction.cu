// SPDX-License-Identifier: Apache-2.0 OR MIT
// Sum of 16M ints in two passes: many blocks each reduce a grid-stride slice with warp shuffles
// and shared memory into one partial sum, then a single block reduces the partials. Checked
// exactly against the host sum; a second, odd size exercises the tail guards.
#define TEST_NAME "reduction"
#include "selfcheck.cuh"

#include <vector>

constexpr int THREADS = 256;
constexpr int WARP = 32;

__device__ __forceinline__ long long warp_sum(long long v)
{
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

// Each block writes the sum of its grid-stride slice of `in` to out[blockIdx.x].
template <typename In>
__global__ void reduce_sum(const In *in, long long *out, long long n)
{
    __shared__ long long warp_sums[THREADS / WARP];
    long long v = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        v += in[i];
    v = warp_sum(v);
    int lane = threadIdx.x % WARP;
    int warp = threadIdx.x / WARP;
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < THREADS / WARP ? warp_sums[lane] : 0;
        v = warp_sum(v);
        if (lane == 0)
            out[blockIdx.x] = v;
    }
}

static void run_case(long long n, int blocks)
{
    std::vector<int> h(n);
    Lcg rng((unsigned long long)n);
    long long want = 0;
    for (long long i = 0; i < n; i++) {
        // Signed values with a large magnitude, so the sum overflows 32 bits if the kernel ever
        // accumulates in int.
        h[i] = (int)(rng.next() % 2000001u) - 1000000 + (i % 3 == 0 ? 700 : 0);
        want += h[i];
    }

    int *din;
    long long *dpartial, *dtotal;
    CHECK(cudaMalloc(&din, n * sizeof(int)));
    CHECK(cudaMalloc(&dpartial, blocks * sizeof(long long)));
    CHECK(cudaMalloc(&dtotal, sizeof(long long)));
    CHECK(cudaMemcpy(din, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));

    double t0 = now_seconds();
    reduce_sum<int><<<blocks, THREADS>>>(din, dpartial, n);
    CHECK_LAUNCH();
    reduce_sum<long long><<<1, THREADS>>>(dpartial, dtotal, blocks);
    CHECK_LAUNCH();
    long long got = 0;
    CHECK(cudaMemcpy(&got, dtotal, sizeof(got), cudaMemcpyDeviceToHost));
    double secs = now_seconds() - t0;

    // The partials are checked too, so a wrong first pass is told apart from a wrong second one.
    std::vector<long long> partial(blocks);
    CHECK(cudaMemcpy(partial.data(), dpartial, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
    long long partial_sum = 0;
    for (long long p : partial)
        partial_sum += p;
    if (partial_sum != want)
        fail("n = %lld: first pass partials sum to %lld, expected %lld", n, partial_sum, want);
    if (got != want)
        fail("n = %lld: second pass gave %lld, expected %lld", n, got, want);
    std::printf("reduction: n = %lld over %d blocks: sum %lld ok (%.3f ms incl. launches)\n", n,
                blocks, got, secs * 1e3);
    CHECK(cudaFree(din));
    CHECK(cudaFree(dpartial));
    CHECK(cudaFree(dtotal));
}

int main()
{
    require_device();
    run_case(16LL << 20, 1024);
    run_case(1000003, 333);
    return pass();
}

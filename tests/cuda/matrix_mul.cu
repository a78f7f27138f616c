// SPDX-License-Identifier: Apache-2.0 OR MIT
// Tiled shared-memory SGEMM, C = A * B, checked against a double-precision CPU reference with
// a rounding-error bound. Two shapes: a square 512^3 one and a ragged one whose sizes are not
// multiples of the tile, so the edge guards are exercised too.
#define TEST_NAME "matrix_mul"
#include "selfcheck.cuh"

#include <cfloat>
#include <cmath>
#include <vector>

constexpr int TILE = 16;

// Row-major A (m x k), B (k x n), C (m x n). One thread per C element; each block walks the k
// dimension one TILE x TILE tile of A and B at a time through shared memory.
__global__ void sgemm_tiled(const float *a, const float *b, float *c, int m, int n, int k)
{
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < k; t += TILE) {
        int ak = t + threadIdx.x;
        int bk = t + threadIdx.y;
        ta[threadIdx.y][threadIdx.x] = (row < m && ak < k) ? a[row * k + ak] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = (bk < k && col < n) ? b[bk * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE; i++)
            acc += ta[threadIdx.y][i] * tb[i][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n)
        c[row * n + col] = acc;
}

static void run_case(int m, int n, int k, unsigned seed)
{
    std::vector<float> a((size_t)m * k), b((size_t)k * n), c((size_t)m * n, NAN);
    Lcg rng(seed);
    for (float &x : a)
        x = rng.unit();
    for (float &x : b)
        x = rng.unit();

    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, a.size() * sizeof(float)));
    CHECK(cudaMalloc(&db, b.size() * sizeof(float)));
    CHECK(cudaMalloc(&dc, c.size() * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
    // Poison C so that an element the kernel never writes cannot pass by accident.
    CHECK(cudaMemset(dc, 0xff, c.size() * sizeof(float)));

    dim3 block(TILE, TILE);
    dim3 grid((n + TILE - 1) / TILE, (m + TILE - 1) / TILE);
    double t0 = now_seconds();
    sgemm_tiled<<<grid, block>>>(da, db, dc, m, n, k);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    double secs = now_seconds() - t0;
    CHECK(cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost));

    // Float accumulation of k products errs by at most about k * eps * sum|a||b|; a wrong tile
    // index or a missing term is off by O(|a||b|) and far outside this bound.
    double worst = 0.0;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double ref = 0.0, mag = 0.0;
            for (int p = 0; p < k; p++) {
                double prod = (double)a[(size_t)i * k + p] * (double)b[(size_t)p * n + j];
                ref += prod;
                mag += std::fabs(prod);
            }
            double got = c[(size_t)i * n + j];
            double err = std::fabs(got - ref);
            double tol = 2.0 * k * FLT_EPSILON * mag + 1e-6;
            if (!(err <= tol))
                fail("%dx%dx%d: C[%d][%d] = %.9g, reference %.9g (error %.3g > tolerance %.3g)", m,
                     n, k, i, j, got, ref, err, tol);
            if (mag > 0 && err / mag > worst)
                worst = err / mag;
        }
    }
    std::printf("matrix_mul: %dx%dx%d ok, worst relative error %.2e, %.2f GFLOP/s (incl. launch)\n",
                m, n, k, worst, 2.0 * m * n * k / secs / 1e9);
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
}

int main()
{
    require_device();
    run_case(512, 512, 512, 7);
    run_case(333, 257, 100, 8);
    return pass();
}

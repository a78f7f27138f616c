// SPDX-License-Identifier: Apache-2.0 OR MIT
// The classic first CUDA program: c = a + b over 2^20 floats, checked element by element on the
// host. Exercises registration, cudaMalloc, both host copies, one launch and cudaFree.
#define TEST_NAME "vector_add"
#include "selfcheck.cuh"

#include <vector>

__global__ void vector_add(const float *a, const float *b, float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}

int main()
{
    require_device();
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(float);

    std::vector<float> a(n), b(n), c(n, -1.0f);
    Lcg rng(1);
    for (int i = 0; i < n; i++) {
        a[i] = rng.unit() * 1000.0f;
        b[i] = (float)i * 0.25f;
    }

    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));

    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;
    vector_add<<<blocks, threads>>>(da, db, dc, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));

    // One IEEE add per element: the device result must match the host's bit for bit.
    for (int i = 0; i < n; i++) {
        float want = a[i] + b[i];
        if (c[i] != want)
            fail("c[%d] = %.9g, expected %.9g (a = %.9g, b = %.9g)", i, c[i], want, a[i], b[i]);
    }
    std::printf("vector_add: %d elements, %d blocks x %d threads\n", n, blocks, threads);

    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    return pass();
}

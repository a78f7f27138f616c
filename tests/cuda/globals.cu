// SPDX-License-Identifier: Apache-2.0 OR MIT
// __device__ and __constant__ globals: a statically initialised global must arrive with its
// initial value, cudaMemcpyToSymbol (with and without an offset) must land where the kernel
// reads, a kernel's writes to globals must come back through cudaMemcpyFromSymbol, and
// scalar, array and struct symbols must all resolve.
#define TEST_NAME "globals"
#include "selfcheck.cuh"

#include <cstring>

constexpr int N = 256;
constexpr int NCOEF = 16;

struct Params {
    int scale;
    float bias;
    double weight;
};

__device__ int dev_initialised = 42;
__device__ unsigned int dev_counter;
__device__ float dev_values[N];
__constant__ float const_coeffs[NCOEF];
__constant__ int const_offset;
__constant__ Params const_params;

// values[i] = values[i] * coeffs[i % 16] * scale + offset + bias, counting every thread.
__global__ void apply_globals()
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        dev_values[i] = dev_values[i] * const_coeffs[i % NCOEF] * const_params.scale +
                        const_offset + const_params.bias;
        atomicAdd(&dev_counter, 1u);
    }
    if (i == 0)
        dev_initialised += (int)const_params.weight;
}

int main()
{
    require_device();

    int initial = 0;
    CHECK(cudaMemcpyFromSymbol(&initial, dev_initialised, sizeof(initial)));
    if (initial != 42)
        fail("dev_initialised reads %d before any write, expected its initialiser 42", initial);

    float coeffs[NCOEF];
    for (int i = 0; i < NCOEF; i++)
        coeffs[i] = (float)(i + 1);
    // Upload the coefficients in two halves, the second through the offset argument.
    CHECK(cudaMemcpyToSymbol(const_coeffs, coeffs, sizeof(float) * NCOEF / 2));
    CHECK(cudaMemcpyToSymbol(const_coeffs, coeffs + NCOEF / 2, sizeof(float) * NCOEF / 2,
                             sizeof(float) * NCOEF / 2));
    int offset = 1000;
    CHECK(cudaMemcpyToSymbol(const_offset, &offset, sizeof(offset)));
    Params params = {2, 0.5f, 8.0};
    CHECK(cudaMemcpyToSymbol(const_params, &params, sizeof(params)));

    float values[N];
    for (int i = 0; i < N; i++)
        values[i] = (float)i;
    CHECK(cudaMemcpyToSymbol(dev_values, values, sizeof(values)));
    unsigned int zero = 0;
    CHECK(cudaMemcpyToSymbol(dev_counter, &zero, sizeof(zero)));

    // Read back what was written before any kernel ran: the symbols must be distinct storage.
    float coeffs_back[NCOEF];
    CHECK(cudaMemcpyFromSymbol(coeffs_back, const_coeffs, sizeof(coeffs_back)));
    if (std::memcmp(coeffs, coeffs_back, sizeof(coeffs)) != 0)
        fail("const_coeffs read back differs from what was written");

    apply_globals<<<(N + 63) / 64, 64>>>();
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());

    float out[N];
    CHECK(cudaMemcpyFromSymbol(out, dev_values, sizeof(out)));
    for (int i = 0; i < N; i++) {
        float want = values[i] * coeffs[i % NCOEF] * params.scale + offset + params.bias;
        if (out[i] != want)
            fail("dev_values[%d] = %g, expected %g", i, out[i], want);
    }
    unsigned int counter = 0;
    CHECK(cudaMemcpyFromSymbol(&counter, dev_counter, sizeof(counter)));
    if (counter != N)
        fail("dev_counter = %u, expected %d", counter, N);
    int after = 0;
    CHECK(cudaMemcpyFromSymbol(&after, dev_initialised, sizeof(after)));
    if (after != 42 + 8)
        fail("dev_initialised = %d after the kernel, expected 50", after);

    // A read with an offset: the last 4 values alone.
    float tail[4];
    CHECK(cudaMemcpyFromSymbol(tail, dev_values, sizeof(tail), sizeof(float) * (N - 4)));
    if (std::memcmp(tail, out + N - 4, sizeof(tail)) != 0)
        fail("cudaMemcpyFromSymbol with offset %zu returned other values", sizeof(float) * (N - 4));

    std::printf("globals: %d values, counter %u, initialised global %d -> %d\n", N, counter,
                initial, after);
    return pass();
}

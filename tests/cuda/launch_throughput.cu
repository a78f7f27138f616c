// SPDX-License-Identifier: Apache-2.0 OR MIT
// Launch rate: 10,000 launches of an empty kernel, then 1,000 launches of a kernel that folds its
// argument into a device counter (c = 3c + step, not atomic, not commutative). Launches on one
// stream run in order and never overlap, so the counter is right only if every launch ran, once,
// in order, with its own argument. Reports launches per second; passes when the counter is
// right.
#define TEST_NAME "launch_throughput"
#include "selfcheck.cuh"

__global__ void empty_kernel() {}

__global__ void bump(unsigned long long *counter, unsigned long long step)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *counter = *counter * 3 + step;
}

int main()
{
    require_device();
    const int empty_launches = 10000;
    const int counted_launches = 1000;

    // The first launch loads the module; keep it out of the timing.
    empty_kernel<<<1, 1>>>();
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());

    double t0 = now_seconds();
    for (int i = 0; i < empty_launches; i++) {
        empty_kernel<<<1, 32>>>();
        if (i % 1000 == 0)
            CHECK_LAUNCH();
    }
    double issued = now_seconds() - t0;
    CHECK(cudaDeviceSynchronize());
    double done = now_seconds() - t0;
    std::printf("launch_throughput: %d empty launches: %.0f launches/s issued, %.0f launches/s "
                "completed (%.3f s)\n",
                empty_launches, empty_launches / issued, empty_launches / done, done);

    unsigned long long *counter;
    CHECK(cudaMalloc(&counter, sizeof(*counter)));
    CHECK(cudaMemset(counter, 0, sizeof(*counter)));
    unsigned long long want = 0;
    t0 = now_seconds();
    for (int i = 0; i < counted_launches; i++) {
        unsigned long long step = (unsigned long long)i + 1;
        bump<<<1, 32>>>(counter, step);
        want = want * 3 + step;
    }
    CHECK_LAUNCH();
    unsigned long long got = 0;
    CHECK(cudaMemcpy(&got, counter, sizeof(got), cudaMemcpyDeviceToHost));
    done = now_seconds() - t0;
    std::printf("launch_throughput: %d counted launches: %.0f launches/s\n", counted_launches,
                counted_launches / done);
    if (got != want)
        fail("counter = %llu after %d launches, expected %llu", got, counted_launches, want);
    CHECK(cudaFree(counter));
    return pass();
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// qcuda_bench's small start-up helper: the same program as qcuda_bench_startup_10m with a
// 16-word table, so its fatbin is a few KiB. See startup.cuh.
#include "startup.cuh"

namespace {
constexpr uint32_t kWords = 16;
__device__ const startup::Chunk<kWords> table = startup::make_chunk<kWords>(0);
} // namespace

__global__ void probe(uint32_t i, uint32_t *out)
{
    *out = table.w[i];
}

int main()
{
    return startup::run(kWords, [](uint32_t i, uint32_t *out) { probe<<<1, 1>>>(i, out); });
}

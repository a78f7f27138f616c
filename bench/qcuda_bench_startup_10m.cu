// SPDX-License-Identifier: Apache-2.0 OR MIT
// qcuda_bench's large start-up helper: a 4.1 MiB __device__ table of incompressible words, which
// makes a fatbin of about 10 MiB (the table is in the sm_90 cubin and, as text, in the
// compute_90 PTX). Otherwise the same program as qcuda_bench_startup. See startup.cuh.
#include "startup.cuh"

namespace {
constexpr uint32_t kChunk = 132 * 1024; // words per chunk, below the constexpr step limit
constexpr uint32_t kWords = 8 * kChunk;
using Chunk = startup::Chunk<kChunk>;
__device__ const Chunk c0 = startup::make_chunk<kChunk>(0 * kChunk);
__device__ const Chunk c1 = startup::make_chunk<kChunk>(1 * kChunk);
__device__ const Chunk c2 = startup::make_chunk<kChunk>(2 * kChunk);
__device__ const Chunk c3 = startup::make_chunk<kChunk>(3 * kChunk);
__device__ const Chunk c4 = startup::make_chunk<kChunk>(4 * kChunk);
__device__ const Chunk c5 = startup::make_chunk<kChunk>(5 * kChunk);
__device__ const Chunk c6 = startup::make_chunk<kChunk>(6 * kChunk);
__device__ const Chunk c7 = startup::make_chunk<kChunk>(7 * kChunk);
} // namespace

// Every chunk is reachable, so none is dropped from the module.
__global__ void probe(uint32_t i, uint32_t *out)
{
    const Chunk *c;
    switch (i / kChunk) {
    case 0: c = &c0; break;
    case 1: c = &c1; break;
    case 2: c = &c2; break;
    case 3: c = &c3; break;
    case 4: c = &c4; break;
    case 5: c = &c5; break;
    case 6: c = &c6; break;
    default: c = &c7; break;
    }
    *out = c->w[i % kChunk];
}

int main()
{
    return startup::run(kWords, [](uint32_t i, uint32_t *out) { probe<<<1, 1>>>(i, out); });
}

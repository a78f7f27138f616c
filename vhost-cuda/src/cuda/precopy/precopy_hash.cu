// The pre-copy chunk hash (vhost-cuda/src/cuda/precopy.rs holds the Rust reference and says why
// it is built so). Compiled to precopy_hash.ptx, which the worker loads into each context that
// pre-copies; precopy_mixer_check.cu builds the mixers below into a host program, so that a test
// checks CPU and GPU compute the same terms without a GPU. Regenerate the PTX with:
//   root=$(scripts/cuda-toolchain.sh)
//   $root/bin/nvcc -ptx -arch=compute_90 -o precopy_hash.ptx precopy_hash.cu
//
// hash(bytes) = two 64-bit lanes, each a sum mod 2^64 over the 8-byte little-endian words w[i]
// (the last one zero-padded) of mix_l(w[i] ^ i * K_l), plus mix_l(len ^ L_l). Not cryptographic.

typedef unsigned long long u64;

#define QCUDA_K0 0x9e3779b97f4a7c15ULL
#define QCUDA_K1 0xc2b2ae3d27d4eb4fULL
#define QCUDA_L0 0x243f6a8885a308d3ULL
#define QCUDA_L1 0x13198a2e03707344ULL

// Lane 0: splitmix64's finaliser.
__host__ __device__ static inline u64 qcuda_mix0(u64 z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// Lane 1: MurmurHash3's fmix64.
__host__ __device__ static inline u64 qcuda_mix1(u64 z)
{
    z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdULL;
    z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ULL;
    return z ^ (z >> 33);
}

// The terms of word `x` at word index `i`, added to the lanes.
__host__ __device__ static inline void qcuda_add_word(u64 x, u64 i, u64 *h0, u64 *h1)
{
    *h0 += qcuda_mix0(x ^ (i * QCUDA_K0));
    *h1 += qcuda_mix1(x ^ (i * QCUDA_K1));
}

// The terms of the length, added once per range.
__host__ __device__ static inline void qcuda_add_length(u64 len, u64 *h0, u64 *h1)
{
    *h0 += qcuda_mix0(len ^ QCUDA_L0);
    *h1 += qcuda_mix1(len ^ QCUDA_L1);
}

#ifndef QCUDA_PRECOPY_MIXERS_ONLY

// `n` (< 8) bytes at `p`, as the low bytes of a little-endian word.
__device__ static inline u64 qcuda_load_bytes(const unsigned char *p, unsigned int n)
{
    u64 x = 0;
    for (unsigned int b = 0; b < n; b++)
        x |= (u64)p[b] << (8 * b);
    return x;
}

// Adds the hash of each range r < count, ranges[2r] (device address) and ranges[2r + 1]
// (bytes), to out[2r] and out[2r + 1], which the caller zeroes first. Launch with blockDim.x a
// multiple of 32 (at most 1024, y = z = 1): blockIdx.y strides over the ranges and the
// blockIdx.x blocks of a range share its words; each block reduces its sums (warp shuffles,
// then shared memory) and adds them with one atomicAdd per lane. Memory may change while it
// runs (the guest's kernels go on): the sums are then of no particular state, which a caller
// detecting change accepts.
extern "C" __global__ void __launch_bounds__(1024)
qcuda_precopy_hash(const u64 *ranges, unsigned int count, u64 *out)
{
    __shared__ u64 sums[2][32];
    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned int warps = (blockDim.x + 31) >> 5;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (unsigned int r = blockIdx.y; r < count; r += gridDim.y) {
        const u64 base = ranges[2 * r], len = ranges[2 * r + 1];
        const u64 full = len >> 3;
        u64 h0 = 0, h1 = 0;
        u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        if ((base & 7) == 0) {
            const u64 *p = (const u64 *)base;
            // The keys i * K move by stride * K: one add instead of a multiply per word.
            u64 k0 = i * QCUDA_K0, k1 = i * QCUDA_K1;
            const u64 s0 = stride * QCUDA_K0, s1 = stride * QCUDA_K1;
#pragma unroll 4
            for (; i < full; i += stride, k0 += s0, k1 += s1) {
                // Read once: streamed past the caches (evict first).
                const u64 x = __ldcs(p + i);
                h0 += qcuda_mix0(x ^ k0);
                h1 += qcuda_mix1(x ^ k1);
            }
        } else {
            const unsigned char *p = (const unsigned char *)base;
            for (; i < full; i += stride)
                qcuda_add_word(qcuda_load_bytes(p + 8 * i, 8), i, &h0, &h1);
        }
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            if (len & 7)
                qcuda_add_word(qcuda_load_bytes((const unsigned char *)base + 8 * full,
                                                (unsigned int)(len & 7)),
                               full, &h0, &h1);
            qcuda_add_length(len, &h0, &h1);
        }
        for (int o = 16; o > 0; o >>= 1) {
            h0 += __shfl_down_sync(0xffffffffu, h0, o);
            h1 += __shfl_down_sync(0xffffffffu, h1, o);
        }
        if (lane == 0) {
            sums[0][warp] = h0;
            sums[1][warp] = h1;
        }
        __syncthreads();
        if (warp == 0) {
            h0 = lane < warps ? sums[0][lane] : 0;
            h1 = lane < warps ? sums[1][lane] : 0;
            for (int o = 16; o > 0; o >>= 1) {
                h0 += __shfl_down_sync(0xffffffffu, h0, o);
                h1 += __shfl_down_sync(0xffffffffu, h1, o);
            }
            if (lane == 0) {
                atomicAdd(out + 2 * r, h0);
                atomicAdd(out + 2 * r + 1, h1);
            }
        }
        // `sums` is written again for the next range.
        __syncthreads();
    }
}

#endif

// SPDX-License-Identifier: Apache-2.0 OR MIT
// Two streams, each with its own async copy in, kernel and async copy out; one uses pinned host
// memory (cudaMallocHost) and the other pageable memory. Events time each stream and the whole,
// and a cross-stream dependency (cudaStreamWaitEvent) orders a kernel on stream 1 after stream
// 0's result. Checks results, cudaEventElapsedTime > 0 and that queries report completion.
#define TEST_NAME "streams_events"
#include "selfcheck.cuh"

#include <vector>

constexpr int ROUNDS = 500;
constexpr unsigned int MUL = 1664525u, ADD = 1013904223u;

// ROUNDS steps of an LCG on the device, so the kernels take measurable time.
__device__ static unsigned int mix(unsigned int x, unsigned int salt)
{
    for (int r = 0; r < ROUNDS; r++)
        x = x * MUL + ADD + salt;
    return x;
}

// The same on the host in O(1) per element: ROUNDS affine steps compose to one affine map
// x -> a*x + c (mod 2^32), computed once. Keeps the check fast in a TCG guest.
struct Affine {
    unsigned int a, c;
    explicit Affine(unsigned int salt) : a(1), c(0)
    {
        for (int r = 0; r < ROUNDS; r++) {
            a = a * MUL;
            c = c * MUL + ADD + salt;
        }
    }
    unsigned int operator()(unsigned int x) const { return a * x + c; }
};

__global__ void mix_kernel(unsigned int *w, int n, unsigned int salt)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        w[i] = mix(w[i], salt);
}

__global__ void add_kernel(unsigned int *dst, const unsigned int *src, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] += src[i];
}

int main()
{
    require_device();
    const int n = 1 << 21; // per stream
    const size_t bytes = n * sizeof(unsigned int);
    const int threads = 256, blocks = (n + threads - 1) / threads;

    unsigned int *pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, bytes));
    std::vector<unsigned int> pageable(n);
    std::vector<unsigned int> in0(n), in1(n);
    for (int i = 0; i < n; i++) {
        in0[i] = pinned[i] = (unsigned int)i * 7u;
        in1[i] = pageable[i] = (unsigned int)i ^ 0xabcdefu;
    }

    unsigned int *d0, *d1;
    CHECK(cudaMalloc(&d0, bytes));
    CHECK(cudaMalloc(&d1, bytes));
    cudaStream_t s0, s1;
    CHECK(cudaStreamCreate(&s0));
    CHECK(cudaStreamCreate(&s1));
    cudaEvent_t start, stop, begin0, done0, begin1, done1;
    for (cudaEvent_t *e : {&start, &stop, &begin0, &done0, &begin1, &done1})
        CHECK(cudaEventCreate(e));

    CHECK(cudaEventRecord(start, s0));
    CHECK(cudaEventRecord(begin0, s0));
    CHECK(cudaMemcpyAsync(d0, pinned, bytes, cudaMemcpyHostToDevice, s0));
    mix_kernel<<<blocks, threads, 0, s0>>>(d0, n, 1);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(done0, s0));
    CHECK(cudaMemcpyAsync(pinned, d0, bytes, cudaMemcpyDeviceToHost, s0));

    CHECK(cudaEventRecord(begin1, s1));
    CHECK(cudaMemcpyAsync(d1, pageable.data(), bytes, cudaMemcpyHostToDevice, s1));
    mix_kernel<<<blocks, threads, 0, s1>>>(d1, n, 2);
    CHECK_LAUNCH();
    // d1 += d0 needs stream 0's kernel to have finished.
    CHECK(cudaStreamWaitEvent(s1, done0, 0));
    add_kernel<<<blocks, threads, 0, s1>>>(d1, d0, n);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(done1, s1));
    CHECK(cudaMemcpyAsync(pageable.data(), d1, bytes, cudaMemcpyDeviceToHost, s1));
    // `stop` on stream 0 comes after everything on stream 1 too.
    CHECK(cudaStreamWaitEvent(s0, done1, 0));
    CHECK(cudaEventRecord(stop, s0));

    CHECK(cudaStreamSynchronize(s1));
    CHECK(cudaStreamSynchronize(s0));
    CHECK(cudaEventSynchronize(stop));
    for (cudaStream_t s : {s0, s1})
        EXPECT_ERR(cudaStreamQuery(s), cudaSuccess);
    for (cudaEvent_t e : {start, stop, begin0, done0, begin1, done1})
        EXPECT_ERR(cudaEventQuery(e), cudaSuccess);

    const Affine mix1(1), mix2(2);
    for (int i = 0; i < n; i++) {
        unsigned int want0 = mix1(in0[i]);
        unsigned int want1 = mix2(in1[i]) + want0;
        if (pinned[i] != want0)
            fail("stream 0 (pinned): word %d = 0x%08x, expected 0x%08x", i, pinned[i], want0);
        if (pageable[i] != want1)
            fail("stream 1 (pageable, after waiting on stream 0): word %d = 0x%08x, expected "
                 "0x%08x",
                 i, pageable[i], want1);
    }

    float total = 0, t0 = 0, t1 = 0;
    CHECK(cudaEventElapsedTime(&total, start, stop));
    CHECK(cudaEventElapsedTime(&t0, begin0, done0));
    CHECK(cudaEventElapsedTime(&t1, begin1, done1));
    std::printf("streams_events: stream 0 copy+kernel %.3f ms, stream 1 copy+kernels %.3f ms, "
                "total %.3f ms\n",
                t0, t1, total);
    if (!(total > 0.0f) || !(t0 > 0.0f) || !(t1 > 0.0f))
        fail("cudaEventElapsedTime gave a non-positive time: total %g, stream 0 %g, stream 1 %g",
             total, t0, t1);
    if (total < t0)
        fail("the whole (%g ms) is shorter than stream 0's part (%g ms)", total, t0);

    for (cudaEvent_t e : {start, stop, begin0, done0, begin1, done1})
        CHECK(cudaEventDestroy(e));
    CHECK(cudaStreamDestroy(s0));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaFree(d0));
    CHECK(cudaFree(d1));
    CHECK(cudaFreeHost(pinned));
    return pass();
}

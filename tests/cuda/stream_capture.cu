// SPDX-License-Identifier: Apache-2.0 OR MIT
// Stream capture: a fork/join over two streams through events (kernels, a memset and a copy to
// pinned memory), captured in each capture mode; cudaStreamIsCapturing and
// cudaStreamGetCaptureInfo during and after; the captured graph instantiated and launched many
// times against CPU results; the errors CUDA gives for what capture forbids (synchronising a
// capturing stream, which invalidates the capture; cudaMalloc in global mode, and not in relaxed
// mode; capturing the legacy stream) and cudaThreadExchangeStreamCaptureMode; a capture into an
// existing graph after one of its nodes.
#define TEST_NAME "stream_capture"
#include "selfcheck.cuh"

#include <vector>

// x[i] = x[i] * 2 + 1
__global__ void twice_plus_one(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * 2.0f + 1.0f;
}

// y[i] += 3
__global__ void plus_three(float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += 3.0f;
}

// z[i] = x[i] * y[i]
__global__ void product(float *z, const float *x, const float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        z[i] = x[i] * y[i];
}

static const int N = 1 << 15;
static const int BLOCKS = (N + 255) / 256;

struct Buffers {
    float *x, *y, *z, *out;
};

// The work captured: s1 forks to s2; s1 runs x = 2x + 1, s2 clears y and adds 3; s1 joins and
// computes z = x * y, then copies z to pinned memory.
static void issue(const Buffers &b, cudaStream_t s1, cudaStream_t s2, cudaEvent_t fork,
                  cudaEvent_t join)
{
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    twice_plus_one<<<BLOCKS, 256, 0, s1>>>(b.x, N);
    CHECK_LAUNCH();
    CHECK(cudaMemsetAsync(b.y, 0, N * sizeof(float), s2));
    plus_three<<<BLOCKS, 256, 0, s2>>>(b.y, N);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s1, join, 0));
    product<<<BLOCKS, 256, 0, s1>>>(b.z, b.x, b.y, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(b.out, b.z, N * sizeof(float), cudaMemcpyDeviceToHost, s1));
}

static void check_status(cudaStream_t s, cudaStreamCaptureStatus want, const char *what)
{
    cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st));
    if (st != want)
        fail("%s: cudaStreamIsCapturing says %d, expected %d", what, (int)st, (int)want);
}

int main()
{
    require_device();
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    Buffers b;
    CHECK(cudaMalloc(&b.x, N * sizeof(float)));
    CHECK(cudaMalloc(&b.y, N * sizeof(float)));
    CHECK(cudaMalloc(&b.z, N * sizeof(float)));
    CHECK(cudaMallocHost(&b.out, N * sizeof(float)));
    std::vector<float> x0(N);
    for (int i = 0; i < N; i++)
        x0[i] = (float)(i % 97) - 48.0f;

    // The legacy stream cannot be captured.
    EXPECT_ERR(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal),
               cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();

    const cudaStreamCaptureMode modes[] = {cudaStreamCaptureModeGlobal,
                                           cudaStreamCaptureModeThreadLocal,
                                           cudaStreamCaptureModeRelaxed};
    for (cudaStreamCaptureMode mode : modes) {
        check_status(s1, cudaStreamCaptureStatusNone, "before capture");
        CHECK(cudaStreamBeginCapture(s1, mode));
        check_status(s1, cudaStreamCaptureStatusActive, "capturing");
        check_status(s2, cudaStreamCaptureStatusNone, "not joined yet");
        issue(b, s1, s2, fork, join);
        check_status(s2, cudaStreamCaptureStatusActive, "joined through the fork event");

        cudaStreamCaptureStatus st;
        unsigned long long id = 0;
        cudaGraph_t capturing = nullptr;
        const cudaGraphNode_t *deps = nullptr;
        size_t ndeps = 0;
        CHECK(cudaStreamGetCaptureInfo(s1, &st, &id, &capturing, &deps, nullptr, &ndeps));
        if (st != cudaStreamCaptureStatusActive || id == 0 || !capturing || ndeps != 1 || !deps)
            fail("cudaStreamGetCaptureInfo: status %d id %llu graph %p deps %zu", (int)st, id,
                 (void *)capturing, ndeps);
        cudaGraphNodeType last;
        CHECK(cudaGraphNodeGetType(deps[0], &last));
        if (last != cudaGraphNodeTypeMemcpy)
            fail("the capture's last node has type %d, expected a memcpy", (int)last);

        // Global and thread-local modes forbid cudaMalloc in the capturing thread; relaxed
        // does not. A forbidden call invalidates the capture, so it is tried last below.
        cudaGraph_t graph = nullptr;
        float *extra = nullptr;
        if (mode == cudaStreamCaptureModeRelaxed)
            CHECK(cudaMalloc(&extra, 256));
        CHECK(cudaStreamEndCapture(s1, &graph));
        // cudaFree synchronises, which no capture allows: after the capture.
        CHECK(cudaFree(extra));
        if (!graph)
            fail("cudaStreamEndCapture returned no graph");
        check_status(s1, cudaStreamCaptureStatusNone, "after capture");
        check_status(s2, cudaStreamCaptureStatusNone, "after capture (joined stream)");

        size_t count = 0;
        CHECK(cudaGraphGetNodes(graph, nullptr, &count));
        if (count < 5)
            fail("the captured graph has %zu nodes, expected at least 5", count);

        cudaGraphExec_t exec;
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int round = 0; round < 20; round++) {
            // x evolves: each launch applies x = 2x + 1 to the previous result, so reset it, in
            // s1's order (a pageable cudaMemcpy may return before its DMA is done, and s1 does
            // not wait for the legacy stream).
            CHECK(cudaMemcpyAsync(b.x, x0.data(), N * sizeof(float), cudaMemcpyHostToDevice, s1));
            CHECK(cudaGraphLaunch(exec, s1));
            CHECK(cudaStreamSynchronize(s1));
            for (int i = 0; i < N; i++) {
                float want = (x0[i] * 2.0f + 1.0f) * 3.0f;
                if (b.out[i] != want)
                    fail("mode %d round %d: element %d is %f, expected %f", (int)mode, round, i,
                         b.out[i], want);
            }
        }
        // Many launches back to back: x doubles-plus-one each time.
        CHECK(cudaMemcpyAsync(b.x, x0.data(), N * sizeof(float), cudaMemcpyHostToDevice, s1));
        for (int i = 0; i < 5; i++)
            CHECK(cudaGraphLaunch(exec, s1));
        CHECK(cudaStreamSynchronize(s1));
        for (int i = 0; i < N; i++) {
            float v = x0[i];
            for (int k = 0; k < 5; k++)
                v = v * 2.0f + 1.0f;
            if (b.out[i] != v * 3.0f)
                fail("5 launches: element %d is %f, expected %f", i, b.out[i], v * 3.0f);
        }
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
    }

    // Synchronising a capturing stream is forbidden and invalidates the capture.
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    twice_plus_one<<<BLOCKS, 256, 0, s1>>>(b.x, N);
    EXPECT_ERR(cudaStreamSynchronize(s1), cudaErrorStreamCaptureUnsupported);
    check_status(s1, cudaStreamCaptureStatusInvalidated, "after a forbidden synchronisation");
    cudaGraph_t graph = (cudaGraph_t)1;
    EXPECT_ERR(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureInvalidated);
    if (graph != nullptr)
        fail("a failed capture returned a graph");
    check_status(s1, cudaStreamCaptureStatusNone, "after the failed capture");

    // cudaMalloc during a global-mode capture of this thread: forbidden, and the capture fails.
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    float *extra = nullptr;
    EXPECT_ERR(cudaMalloc(&extra, 256), cudaErrorStreamCaptureUnsupported);
    EXPECT_ERR(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureInvalidated);
    // The same in thread-local mode.
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    EXPECT_ERR(cudaMalloc(&extra, 256), cudaErrorStreamCaptureUnsupported);
    EXPECT_ERR(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureInvalidated);

    cudaGetLastError();
    // This thread switched to relaxed mode: cudaMalloc is allowed during a global capture.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (mode != cudaStreamCaptureModeGlobal)
        fail("the thread's initial capture mode is %d, expected global", (int)mode);
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaMalloc(&extra, 256));
    twice_plus_one<<<BLOCKS, 256, 0, s1>>>(b.x, N);
    CHECK_LAUNCH();
    CHECK(cudaStreamEndCapture(s1, &graph));
    CHECK(cudaFree(extra));
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (mode != cudaStreamCaptureModeRelaxed)
        fail("cudaThreadExchangeStreamCaptureMode gave back %d, expected relaxed", (int)mode);
    size_t count = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &count));
    if (count != 1)
        fail("the relaxed capture has %zu nodes, expected 1", count);
    CHECK(cudaGraphDestroy(graph));

    // Capture into an existing graph, after one of its nodes: y = 0, then y += 3 captured.
    cudaGraph_t into;
    CHECK(cudaGraphCreate(&into, 0));
    cudaMemsetParams ms = {};
    ms.dst = b.y;
    ms.elementSize = 4;
    ms.width = N;
    ms.height = 1;
    cudaGraphNode_t clear;
    CHECK(cudaGraphAddMemsetNode(&clear, into, nullptr, 0, &ms));
    CHECK(cudaStreamBeginCaptureToGraph(s1, into, &clear, nullptr, 1, cudaStreamCaptureModeGlobal));
    plus_three<<<BLOCKS, 256, 0, s1>>>(b.y, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(b.out, b.y, N * sizeof(float), cudaMemcpyDeviceToHost, s1));
    cudaGraph_t returned = nullptr;
    CHECK(cudaStreamEndCapture(s1, &returned));
    if (returned != into)
        fail("cudaStreamEndCapture after capturing into a graph returned another graph");
    count = 0;
    CHECK(cudaGraphGetNodes(into, nullptr, &count));
    if (count != 3)
        fail("the graph captured into has %zu nodes, expected 3", count);
    cudaGraphExec_t into_exec;
    CHECK(cudaGraphInstantiate(&into_exec, into, 0));
    for (int i = 0; i < 3; i++)
        CHECK(cudaGraphLaunch(into_exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    for (int i = 0; i < N; i++)
        if (b.out[i] != 3.0f)
            fail("capture into a graph: element %d is %f, expected 3", i, b.out[i]);
    CHECK(cudaGraphExecDestroy(into_exec));
    CHECK(cudaGraphDestroy(into));

    CHECK(cudaFree(b.x));
    CHECK(cudaFree(b.y));
    CHECK(cudaFree(b.z));
    CHECK(cudaFreeHost(b.out));
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    return pass();
}

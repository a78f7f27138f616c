// SPDX-License-Identifier: Apache-2.0 OR MIT
// Host functions (cudaLaunchHostFunc, cudaStreamAddCallback, graph host nodes, host functions
// captured into a graph) run in this process, in stream order: work queued before one has finished when it runs, and work queued after it starts
// only once it has returned. Also: a synchronisation in another thread while a function is
// pending, many functions on several streams (each stream's in order), a callback that hands
// CUDA work to a thread of its own (CUDA forbids calling CUDA inside a callback), the stream
// and status a callback receives, and CUDA's argument errors.
#define TEST_NAME "host_functions"
#include "selfcheck.cuh"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

__global__ void write_value(int *p, int v) { *p = v; }

// Copies what a host function wrote to mapped host memory into device memory.
__global__ void copy_from_host(const volatile int *host_flag, int *out) { *out = *host_flag; }

struct Order {
    std::atomic<int> next{0};
    int seen[3][400];
    std::atomic<int> count[3];
};

struct Step {
    Order *order;
    int stream;
    int index;
};

static void CUDART_CB record_step(void *data)
{
    Step *s = (Step *)data;
    s->order->seen[s->stream][s->order->count[s->stream].fetch_add(1)] = s->index;
}

struct Slow {
    volatile int *flag;
    const int *observed; // pinned copy of the value a kernel wrote before
    int observed_then;
};

static void CUDART_CB slow_then_set(void *data)
{
    Slow *s = (Slow *)data;
    s->observed_then = *s->observed;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    *s->flag = 42;
}

struct CallbackSeen {
    cudaStream_t stream;
    cudaError_t status;
    void *data;
    std::atomic<int> calls{0};
    std::thread worker;
    int *dev;
    int result = 0;
};

static void CUDART_CB count_run(void *data) { ((std::atomic<int> *)data)->fetch_add(1); }

static void CUDART_CB stream_callback(cudaStream_t stream, cudaError_t status, void *data)
{
    CallbackSeen *c = (CallbackSeen *)data;
    c->stream = stream;
    c->status = status;
    c->data = data;
    c->calls++;
    // CUDA work belongs to another thread, started here and joined by main.
    c->worker = std::thread([c] {
        if (cudaMemcpy(&c->result, c->dev, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess)
            c->result = -1;
    });
}

// `--hold`: the kill check of tests/guest/check-cuda. A host function that never returns blocks
// its stream; one thread waits for that stream and another registers host memory, which the
// host serves behind the wait. Prints HOLDING and sleeps until killed. A killed process can
// never run the function, so qcuda.ko must let every thread of it go at once: none may wait
// for the host's answer to the synchronisation or the registration.
static void never_returns(void *)
{
    for (;;)
        std::this_thread::sleep_for(std::chrono::seconds(1));
}

static int hold()
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaLaunchHostFunc(s, never_returns, nullptr));
    std::thread([s] { (void)cudaStreamSynchronize(s); }).detach();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    static char buffer[1 << 20];
    std::thread([] { (void)cudaHostRegister(buffer, sizeof(buffer), cudaHostRegisterDefault); })
        .detach();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::printf("HOLDING\n");
    std::fflush(stdout);
    for (;;)
        std::this_thread::sleep_for(std::chrono::seconds(1));
}

int main(int argc, char **argv)
{
    require_device();
    if (argc > 1 && std::string(argv[1]) == "--hold")
        return hold();
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // 1. Order around one function: before it, a kernel and a copy into pinned memory; it
    //    sleeps and then sets a mapped flag; after it, a kernel reads the flag.
    int *flag_host = nullptr, *flag_dev = nullptr, *observed = nullptr, *dev = nullptr;
    CHECK(cudaHostAlloc(&flag_host, sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&flag_dev, flag_host, 0));
    CHECK(cudaMallocHost(&observed, sizeof(int)));
    CHECK(cudaMalloc(&dev, 2 * sizeof(int)));
    *flag_host = 0;
    *observed = 0;
    Slow slow{flag_host, observed, -1};
    write_value<<<1, 1, 0, s>>>(dev, 7);
    CHECK(cudaMemcpyAsync(observed, dev, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, slow_then_set, &slow));
    copy_from_host<<<1, 1, 0, s>>>(flag_dev, dev + 1);
    int after = 0;
    CHECK(cudaMemcpyAsync(&after, dev + 1, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    if (slow.observed_then != 7)
        fail("the host function ran before earlier work finished (saw %d, want 7)",
             slow.observed_then);
    if (after != 42)
        fail("work queued after the host function started before it returned (read %d)", after);

    // 2. A synchronisation in another thread while a function is still pending on the stream.
    Slow slow2{flag_host, observed, -1};
    *flag_host = 0;
    CHECK(cudaLaunchHostFunc(s, slow_then_set, &slow2));
    std::atomic<int> sync_result{-1};
    std::thread syncer([&] { sync_result = cudaStreamSynchronize(s); });
    syncer.join();
    if (sync_result != cudaSuccess || *flag_host != 42)
        fail("cudaStreamSynchronize in another thread returned %d with the flag at %d",
             (int)sync_result.load(), *flag_host);

    // 3. Many functions on three streams (one of them the legacy stream), interleaved with
    //    kernels: each stream's run in its own order, and all of them run.
    static Order order;
    cudaStream_t streams[3] = {s, nullptr, nullptr};
    CHECK(cudaStreamCreate(&streams[2]));
    std::vector<Step> steps;
    steps.reserve(3 * 400);
    for (int i = 0; i < 400; i++)
        for (int k = 0; k < 3; k++) {
            steps.push_back(Step{&order, k, i});
            if (i % 50 == 0)
                write_value<<<1, 1, 0, streams[k]>>>(dev, i);
            CHECK(cudaLaunchHostFunc(streams[k], record_step, &steps.back()));
        }
    CHECK(cudaDeviceSynchronize());
    for (int k = 0; k < 3; k++) {
        if (order.count[k] != 400)
            fail("stream %d ran %d of 400 host functions", k, order.count[k].load());
        for (int i = 0; i < 400; i++)
            if (order.seen[k][i] != i)
                fail("stream %d ran function %d in place %d", k, order.seen[k][i], i);
    }

    // 4. cudaStreamAddCallback: the stream and status it receives, and CUDA work from a thread
    //    the callback starts.
    CallbackSeen seen;
    seen.dev = dev;
    write_value<<<1, 1, 0, streams[2]>>>(dev, 99);
    CHECK(cudaStreamAddCallback(streams[2], stream_callback, &seen, 0));
    CHECK(cudaStreamSynchronize(streams[2]));
    if (seen.calls != 1 || seen.stream != streams[2] || seen.status != cudaSuccess ||
        seen.data != &seen)
        fail("callback saw calls %d, stream %p (want %p), status %d, data %p (want %p)",
             seen.calls.load(), (void *)seen.stream, (void *)streams[2], (int)seen.status,
             seen.data, (void *)&seen);
    seen.worker.join();
    if (seen.result != 99)
        fail("the callback's thread read %d, want 99", seen.result);

    // 5. A graph host node runs each time the graph does, after the work before it; so does a
    //    host function captured from a stream.
    static std::atomic<int> node_runs{0}, captured_runs{0};
    cudaGraph_t g = nullptr, g2 = nullptr;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t before_node, host_node;
    cudaKernelNodeParams kp = {};
    int seven = 7;
    void *kargs[] = {&dev, &seven};
    kp.func = (void *)write_value;
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(1);
    kp.kernelParams = kargs;
    CHECK(cudaGraphAddKernelNode(&before_node, g, nullptr, 0, &kp));
    cudaHostNodeParams hp = {count_run, &node_runs};
    CHECK(cudaGraphAddHostNode(&host_node, g, &before_node, 1, &hp));
    cudaHostNodeParams back = {};
    CHECK(cudaGraphHostNodeGetParams(host_node, &back));
    if (back.fn != count_run || back.userData != &node_runs)
        fail("cudaGraphHostNodeGetParams gave other parameters back");
    cudaGraphExec_t ge = nullptr;
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 5; i++)
        CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaStreamSynchronize(s));
    if (node_runs != 5)
        fail("the graph's host node ran %d times in 5 launches", node_runs.load());
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    write_value<<<1, 1, 0, s>>>(dev, 9);
    CHECK(cudaLaunchHostFunc(s, count_run, &captured_runs));
    CHECK(cudaStreamEndCapture(s, &g2));
    if (captured_runs != 0)
        fail("a captured host function ran during the capture");
    cudaGraphExec_t ge2 = nullptr;
    CHECK(cudaGraphInstantiate(&ge2, g2, 0));
    for (int i = 0; i < 3; i++)
        CHECK(cudaGraphLaunch(ge2, s));
    CHECK(cudaStreamSynchronize(s));
    if (captured_runs != 3)
        fail("the captured host function ran %d times in 3 launches", captured_runs.load());
    CHECK(cudaGraphExecDestroy(ge2));
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaGraphDestroy(g));

    // 6. Argument errors as CUDA reports them.
    EXPECT_ERR(cudaStreamAddCallback(s, stream_callback, &seen, 1), cudaErrorInvalidValue);
    EXPECT_ERR(cudaLaunchHostFunc(s, nullptr, nullptr), cudaErrorInvalidValue);
    cudaGetLastError();

    CHECK(cudaStreamDestroy(streams[2]));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dev));
    CHECK(cudaFreeHost(observed));
    CHECK(cudaFreeHost(flag_host));
    return pass();
}

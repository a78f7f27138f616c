// SPDX-License-Identifier: Apache-2.0 OR MIT
// Conditional graph nodes built by stream capture, the way NVIDIA's cuda-samples
// (graphConditionalNodes) and the programming guide build them:
//
//   - bodies filled by cudaStreamBeginCaptureToGraph and ended with cudaStreamEndCapture(s, NULL);
//   - conditional nodes added to a graph while it is being captured: the handle made on the graph
//     cudaStreamGetCaptureInfo names, the node added after the capture's dependencies, and the
//     capture moved past it with cudaStreamUpdateCaptureDependencies;
//   - bodies captured during the outer capture (on another stream) and after it (on the same
//     stream or another); a conditional nested in a body built the same way.
//
// if, if/else, do-while (the handle's default value with cudaGraphCondAssignDefault), while,
// switch and a while holding an if; each graph launched several times with new inputs (one after
// cudaGraphUpload) and every result compared with the CPU. Built shared (our runtime) and
// --cudart=static (NVIDIA's runtime over our driver).
#define TEST_NAME "conditional_capture"
#include "selfcheck.cuh"

// The condition of `h` is *v: non-zero or not for if and while, the index for switch.
__global__ void set_cond(cudaGraphConditionalHandle h, const int *v)
{
    cudaGraphSetConditional(h, (unsigned)*v);
}

// acc[0] += v, once per launch.
__global__ void add(int *acc, int v)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        atomicAdd(acc, v);
}

// The samples' do-while body: counts its runs, and ends the loop when the counter reaches 0.
__global__ void count_down(cudaGraphConditionalHandle h, int *counter, int *runs)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        runs[0] += 1;
        if (--counter[0] == 0)
            cudaGraphSetConditional(h, 0);
    }
}

// The samples' captured while loop: before the loop and as its body, decrements a positive
// counter and makes the counter the condition.
__global__ void while_step(cudaGraphConditionalHandle h, int *counter, int *runs)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        if (runs)
            runs[0] += 1;
        if (counter[0] > 0)
            counter[0] -= 1;
        cudaGraphSetConditional(h, (unsigned)counter[0]);
    }
}

// A while body that counts up: counter[0]++, on while counter[0] < *limit.
__global__ void count_up(cudaGraphConditionalHandle h, int *counter, const int *limit)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        counter[0] += 1;
        cudaGraphSetConditional(h, counter[0] < *limit ? 1u : 0u);
    }
}

// An if inside that loop: taken when the counter is odd.
__global__ void set_odd(cudaGraphConditionalHandle h, const int *counter)
{
    cudaGraphSetConditional(h, (unsigned)(counter[0] & 1));
}

struct Dev {
    int *acc, *flag, *counter, *runs, *limit, *tail;
};

static int get(const int *p)
{
    int v;
    CHECK(cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost));
    return v;
}

static void put(int *p, int v)
{
    CHECK(cudaMemcpy(p, &v, sizeof v, cudaMemcpyHostToDevice));    // A copy from pageable memory may return before its DMA lands ("API synchronization
    // behavior"), and the graphs run on a non-blocking stream, which does not wait for the legacy
    // stream: without this wait a launch can read the old value (seen natively on an H200).
    CHECK(cudaDeviceSynchronize());
}

// The graph and dependencies of `s`'s capture (the samples' cudaStreamGetCaptureInfo call).
static cudaGraph_t capture_graph(cudaStream_t s, const cudaGraphNode_t **deps, size_t *n)
{
    cudaStreamCaptureStatus st;
    cudaGraph_t g = nullptr;
    const cudaGraphEdgeData *edges = nullptr;
    CHECK(cudaStreamGetCaptureInfo(s, &st, nullptr, &g, deps, &edges, n));
    if (st != cudaStreamCaptureStatusActive)
        fail("stream capture status is %d, not active", (int)st);
    if (!g)
        fail("cudaStreamGetCaptureInfo gave no graph");
    return g;
}

// Adds a conditional node of `type` with `size` bodies to the graph `s` is capturing, after the
// capture's dependencies, and moves the capture past it; returns its bodies.
static cudaGraph_t *add_conditional_to_capture(cudaStream_t s, cudaGraphConditionalHandle h,
                                               cudaGraphConditionalNodeType type, unsigned size,
                                               cudaGraphNode_t *node)
{
    const cudaGraphNode_t *deps = nullptr;
    size_t n = 0;
    cudaGraph_t g = capture_graph(s, &deps, &n);
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    CHECK(cudaGraphAddNode(node, g, deps, nullptr, n, &p));
    CHECK(cudaStreamUpdateCaptureDependencies(s, node, nullptr, 1, cudaStreamSetCaptureDependencies));
    const cudaGraphNode_t *after = nullptr;
    size_t m = 0;
    capture_graph(s, &after, &m);
    if (m != 1 || after[0] != *node)
        fail("the capture does not depend on the conditional node after the update (%zu deps)", m);
    for (unsigned i = 0; i < size; i++)
        if (!p.conditional.phGraph_out || !p.conditional.phGraph_out[i])
            fail("body %u of a conditional node is NULL", i);
    return p.conditional.phGraph_out;
}

static size_t nodes_of(cudaGraph_t g)
{
    size_t n = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &n));
    return n;
}

static void end_body_capture(cudaStream_t s)
{
    CHECK(cudaStreamEndCapture(s, nullptr));
    cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusNone)
        fail("the stream still captures after cudaStreamEndCapture(s, NULL)");
}

static void launch(cudaGraphExec_t e, cudaStream_t s)
{
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaStreamSynchronize(s));
}

// if: A sets the condition from *flag, the body adds 1, D adds 100 after the node. The body is
// captured after the outer capture ended, on another stream.
static void captured_if(const Dev &d, cudaStream_t s, cudaStream_t body_stream)
{
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const cudaGraphNode_t *deps;
    size_t n;
    cudaGraph_t g = capture_graph(s, &deps, &n);
    if (n != 0)
        fail("if: a new capture has %zu dependencies", n);
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g));
    set_cond<<<1, 1, 0, s>>>(h, d.flag);
    CHECK_LAUNCH();
    cudaGraphNode_t node;
    cudaGraph_t body = add_conditional_to_capture(s, h, cudaGraphCondTypeIf, 1, &node)[0];
    add<<<1, 32, 0, s>>>(d.tail, 100);
    CHECK_LAUNCH();
    cudaGraph_t ended = nullptr;
    CHECK(cudaStreamEndCapture(s, &ended));
    if (ended != g)
        fail("if: the capture ended with another graph than cudaStreamGetCaptureInfo named");
    if (nodes_of(g) != 3)
        fail("if: the graph has %zu nodes, expected 3", nodes_of(g));
    CHECK(cudaStreamBeginCaptureToGraph(body_stream, body, nullptr, nullptr, 0,
                                        cudaStreamCaptureModeGlobal));
    add<<<1, 32, 0, body_stream>>>(d.acc, 1);
    CHECK_LAUNCH();
    end_body_capture(body_stream);
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    put(d.acc, 0);
    put(d.tail, 0);
    const int flags[] = {1, 0, 5, 0, 0, 1, 1};
    int want = 0, launches = 0;
    for (int f : flags) {
        put(d.flag, f);
        launch(e, s);
        launches++;
        want += f ? 1 : 0;
        if (get(d.acc) != want || get(d.tail) != 100 * launches)
            fail("if, condition %d: acc %d tail %d, expected %d and %d", f, get(d.acc), get(d.tail),
                 want, 100 * launches);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

// if/else: both bodies captured on another stream while the outer capture is still under way.
static void captured_if_else(const Dev &d, cudaStream_t s, cudaStream_t body_stream)
{
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    const cudaGraphNode_t *deps;
    size_t n;
    cudaGraph_t g = capture_graph(s, &deps, &n);
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    set_cond<<<1, 1, 0, s>>>(h, d.flag);
    CHECK_LAUNCH();
    cudaGraphNode_t node;
    cudaGraph_t *bodies = add_conditional_to_capture(s, h, cudaGraphCondTypeIf, 2, &node);
    const int values[2] = {10, 1000};
    for (int i = 0; i < 2; i++) {
        CHECK(cudaStreamBeginCaptureToGraph(body_stream, bodies[i], nullptr, nullptr, 0,
                                            cudaStreamCaptureModeRelaxed));
        add<<<1, 32, 0, body_stream>>>(d.acc, values[i]);
        CHECK_LAUNCH();
        end_body_capture(body_stream);
    }
    cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusActive)
        fail("if/else: capturing a body ended the outer capture");
    cudaGraph_t ended = nullptr;
    CHECK(cudaStreamEndCapture(s, &ended));
    if (ended != g)
        fail("if/else: the capture ended with another graph");
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    put(d.acc, 0);
    int want = 0;
    const int flags[] = {0, 1, 0, 0, 3, 1};
    for (int f : flags) {
        put(d.flag, f);
        launch(e, s);
        want += f ? values[0] : values[1];
        if (get(d.acc) != want)
            fail("if/else, condition %d: acc %d, expected %d", f, get(d.acc), want);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

// do-while, as simpleDoWhileGraph: an explicit graph, the handle's default value 1 assigned at
// every launch, the body (two kernels and the counting one) captured into on a stream created
// for it and ended with a null graph pointer.
static void do_while(const Dev &d, cudaStream_t s)
{
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = cudaGraphCondTypeWhile;
    p.conditional.size = 1;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, g, nullptr, nullptr, 0, &p));
    cudaGraph_t body = p.conditional.phGraph_out[0];
    cudaStream_t capture;
    CHECK(cudaStreamCreate(&capture));
    CHECK(cudaStreamBeginCaptureToGraph(capture, body, nullptr, nullptr, 0,
                                        cudaStreamCaptureModeGlobal));
    add<<<1, 32, 0, capture>>>(d.acc, 1);
    add<<<1, 32, 0, capture>>>(d.acc, 1);
    count_down<<<1, 32, 0, capture>>>(h, d.counter, d.runs);
    CHECK_LAUNCH();
    end_body_capture(capture);
    CHECK(cudaStreamDestroy(capture));
    if (nodes_of(body) != 3)
        fail("do-while: the body has %zu nodes, expected 3", nodes_of(body));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    const int counters[] = {10, 1, 4, 37};
    bool uploaded = false;
    for (int c : counters) {
        put(d.counter, c);
        put(d.runs, 0);
        put(d.acc, 0);
        if (!uploaded) {
            CHECK(cudaGraphUpload(e, s));
            uploaded = true;
        }
        launch(e, s);
        if (get(d.runs) != c || get(d.counter) != 0 || get(d.acc) != 2 * c)
            fail("do-while from %d: %d runs, counter %d, acc %d (expected %d, 0, %d)", c,
                 get(d.runs), get(d.counter), get(d.acc), c, 2 * c);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

// while, as capturedWhileGraph: A (while_step) before the loop, the node added during the
// capture, D after it; the body captured after the outer capture ended, on a new stream.
static void captured_while(const Dev &d, cudaStream_t s)
{
    cudaStream_t capture;
    CHECK(cudaStreamCreate(&capture));
    CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
    const cudaGraphNode_t *deps;
    size_t n;
    cudaGraph_t g = capture_graph(capture, &deps, &n);
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g));
    while_step<<<1, 1, 0, capture>>>(h, d.counter, nullptr);
    CHECK_LAUNCH();
    cudaGraphNode_t node;
    cudaGraph_t body = add_conditional_to_capture(capture, h, cudaGraphCondTypeWhile, 1, &node)[0];
    add<<<1, 32, 0, capture>>>(d.tail, 1);
    CHECK_LAUNCH();
    cudaGraph_t ended = nullptr;
    CHECK(cudaStreamEndCapture(capture, &ended));
    if (ended != g)
        fail("while: the capture ended with another graph");
    CHECK(cudaStreamDestroy(capture));
    cudaStream_t body_stream;
    CHECK(cudaStreamCreate(&body_stream));
    CHECK(cudaStreamBeginCaptureToGraph(body_stream, body, nullptr, nullptr, 0,
                                        cudaStreamCaptureModeGlobal));
    while_step<<<1, 1, 0, body_stream>>>(h, d.counter, d.runs);
    CHECK_LAUNCH();
    end_body_capture(body_stream);
    CHECK(cudaStreamDestroy(body_stream));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiateWithFlags(&e, g, 0));
    put(d.tail, 0);
    const int counters[] = {0, 10, 1, 2, 25};
    int launches = 0;
    for (int c : counters) {
        put(d.counter, c);
        put(d.runs, 0);
        launch(e, s);
        launches++;
        int want = c > 1 ? c - 1 : 0;
        if (get(d.runs) != want || get(d.counter) != 0 || get(d.tail) != launches)
            fail("while from %d: %d body runs, counter %d, tail %d (expected %d, 0, %d)", c,
                 get(d.runs), get(d.counter), get(d.tail), want, launches);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

// switch with 4 bodies: built during the capture, its bodies captured after it on the same
// stream; body n adds 3 * (n + 1), a value >= 4 runs none.
static void captured_switch(const Dev &d, cudaStream_t s)
{
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const cudaGraphNode_t *deps;
    size_t n;
    cudaGraph_t g = capture_graph(s, &deps, &n);
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    set_cond<<<1, 1, 0, s>>>(h, d.flag);
    CHECK_LAUNCH();
    cudaGraphNode_t node;
    cudaGraph_t *bodies = add_conditional_to_capture(s, h, cudaGraphCondTypeSwitch, 4, &node);
    cudaGraph_t ended = nullptr;
    CHECK(cudaStreamEndCapture(s, &ended));
    if (ended != g)
        fail("switch: the capture ended with another graph");
    for (int i = 0; i < 4; i++) {
        CHECK(cudaStreamBeginCaptureToGraph(s, bodies[i], nullptr, nullptr, 0,
                                            cudaStreamCaptureModeGlobal));
        add<<<1, 32, 0, s>>>(d.acc, 3 * (i + 1));
        CHECK_LAUNCH();
        end_body_capture(s);
    }
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    put(d.acc, 0);
    int want = 0;
    const int values[] = {0, 1, 2, 3, 4, 9, 3, 0, 2};
    for (int v : values) {
        put(d.flag, v);
        launch(e, s);
        if (v < 4)
            want += 3 * (v + 1);
        if (get(d.acc) != want)
            fail("switch, value %d: acc %d, expected %d", v, get(d.acc), want);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

// A while loop counting to *limit whose body holds an if taken on odd counts: the loop built
// during a capture, its body captured into (the if added to the body while it is captured, its
// handle made on the body graph), then the if's body.
static void nested(const Dev &d, cudaStream_t s, cudaStream_t body_stream)
{
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const cudaGraphNode_t *deps;
    size_t n;
    cudaGraph_t g = capture_graph(s, &deps, &n);
    cudaGraphConditionalHandle loop;
    CHECK(cudaGraphConditionalHandleCreate(&loop, g, 1, cudaGraphCondAssignDefault));
    cudaGraphNode_t loop_node;
    cudaGraph_t loop_body = add_conditional_to_capture(s, loop, cudaGraphCondTypeWhile, 1, &loop_node)[0];
    cudaGraph_t ended = nullptr;
    CHECK(cudaStreamEndCapture(s, &ended));
    if (ended != g)
        fail("nested: the capture ended with another graph");

    CHECK(cudaStreamBeginCaptureToGraph(body_stream, loop_body, nullptr, nullptr, 0,
                                        cudaStreamCaptureModeGlobal));
    count_up<<<1, 1, 0, body_stream>>>(loop, d.counter, d.limit);
    CHECK_LAUNCH();
    const cudaGraphNode_t *inner_deps;
    size_t m;
    cudaGraph_t inner_graph = capture_graph(body_stream, &inner_deps, &m);
    if (inner_graph != loop_body || m != 1)
        fail("nested: the body's capture names another graph or %zu dependencies", m);
    cudaGraphConditionalHandle odd;
    CHECK(cudaGraphConditionalHandleCreate(&odd, loop_body, 0, 0));
    set_odd<<<1, 1, 0, body_stream>>>(odd, d.counter);
    CHECK_LAUNCH();
    cudaGraphNode_t if_node;
    cudaGraph_t if_body = add_conditional_to_capture(body_stream, odd, cudaGraphCondTypeIf, 1, &if_node)[0];
    end_body_capture(body_stream);
    CHECK(cudaStreamBeginCaptureToGraph(body_stream, if_body, nullptr, nullptr, 0,
                                        cudaStreamCaptureModeGlobal));
    add<<<1, 32, 0, body_stream>>>(d.acc, 1);
    CHECK_LAUNCH();
    end_body_capture(body_stream);
    if (nodes_of(loop_body) != 3 || nodes_of(if_body) != 1)
        fail("nested: bodies of %zu and %zu nodes, expected 3 and 1", nodes_of(loop_body),
             nodes_of(if_body));

    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    const int limits[] = {1, 2, 7, 20};
    for (int l : limits) {
        put(d.counter, 0);
        put(d.limit, l);
        put(d.acc, 0);
        launch(e, s);
        if (get(d.counter) != l || get(d.acc) != (l + 1) / 2)
            fail("nested, limit %d: counter %d, odd counts %d (expected %d and %d)", l,
                 get(d.counter), get(d.acc), l, (l + 1) / 2);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

int main()
{
    require_device();
    int driver = 0;
    CHECK(cudaDriverGetVersion(&driver));
    if (driver < 12080) {
        std::printf("SKIP %s: the driver (%d) has no if/else or switch nodes\n", TEST_NAME, driver);
        return EXIT_SKIP;
    }
    Dev d;
    int **fields[] = {&d.acc, &d.flag, &d.counter, &d.runs, &d.limit, &d.tail};
    for (int **f : fields)
        CHECK(cudaMalloc(f, sizeof(int)));
    cudaStream_t s, side;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));

    captured_if(d, s, side);
    std::printf("if built by capture: ok\n");
    captured_if_else(d, s, side);
    std::printf("if/else, bodies captured during the capture: ok\n");
    do_while(d, s);
    std::printf("do-while, body captured with a null graph pointer: ok\n");
    captured_while(d, s);
    std::printf("while built by capture: ok\n");
    captured_switch(d, s);
    std::printf("switch, bodies captured on the same stream: ok\n");
    nested(d, s, side);
    std::printf("while holding an if, both built by capture: ok\n");

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(side));
    for (int **f : fields)
        CHECK(cudaFree(*f));
    return pass();
}

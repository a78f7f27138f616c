// SPDX-License-Identifier: Apache-2.0 OR MIT
// Conditional graph nodes: if, if/else, while and switch, their conditions set from kernels with
// cudaGraphSetConditional (the handle passed as a plain kernel argument) or by the handle's
// default value; bodies filled with kernel and memset nodes or by capture into them
// (cudaStreamBeginCaptureToGraph); each graph launched several times with new inputs and the
// results compared with a CPU reference. Built shared (our runtime) and --cudart=static
// (NVIDIA's runtime over our driver).
#define TEST_NAME "conditional_nodes"
#include "selfcheck.cuh"

#include <vector>

// The condition of `handle` is *flag (non-zero or not) for if/while, the value for switch.
__global__ void set_condition(cudaGraphConditionalHandle handle, const int *flag)
{
    cudaGraphSetConditional(handle, (unsigned)*flag);
}

// acc[0] += v
__global__ void add(int *acc, int v)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        acc[0] += v;
}

// A loop body: counter[0]++, and the loop goes on while counter[0] < *limit.
__global__ void count_step(cudaGraphConditionalHandle handle, int *counter, const int *limit)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        counter[0] += 1;
        cudaGraphSetConditional(handle, counter[0] < *limit ? 1u : 0u);
    }
}

static cudaGraphNode_t add_kernel(cudaGraph_t g, const cudaGraphNode_t *deps, size_t n, void *func,
                                  void **args)
{
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = dim3(1);
    p.blockDim = dim3(32);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, deps, n, &p));
    return node;
}

// Adds a conditional node of `type` with `size` bodies after `dep`; returns its bodies.
static cudaGraph_t *add_conditional(cudaGraph_t g, cudaGraphNode_t dep, cudaGraphConditionalHandle h,
                                    cudaGraphConditionalNodeType type, unsigned size)
{
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, g, dep ? &dep : nullptr, nullptr, dep ? 1 : 0, &p));
    if (!p.conditional.phGraph_out)
        fail("no body graphs came back");
    for (unsigned i = 0; i < size; i++)
        if (!p.conditional.phGraph_out[i])
            fail("body %u of a conditional node is NULL", i);
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(node, &t));
    if (t != cudaGraphNodeTypeConditional)
        fail("the node's type is %d, not conditional", (int)t);
    return p.conditional.phGraph_out;
}

static int read_acc(const int *acc)
{
    int v;
    CHECK(cudaMemcpy(&v, acc, sizeof v, cudaMemcpyDeviceToHost));
    return v;
}

static void put(int *dev, int v)
{
    CHECK(cudaMemcpy(dev, &v, sizeof v, cudaMemcpyHostToDevice));    // A copy from pageable memory may return before its DMA lands ("API synchronization
    // behavior"), and the graphs run on a non-blocking stream, which does not wait for the legacy
    // stream: without this wait a launch can read the old value (seen natively on an H200).
    CHECK(cudaDeviceSynchronize());
}

int main()
{
    require_device();
    int *acc, *flag, *counter, *limit;
    CHECK(cudaMalloc(&acc, sizeof(int)));
    CHECK(cudaMalloc(&flag, sizeof(int)));
    CHECK(cudaMalloc(&counter, sizeof(int)));
    CHECK(cudaMalloc(&limit, sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // if: body adds 1 when *flag != 0; if/else: 10 when it is, 100 when not.
    for (unsigned size = 1; size <= 2; size++) {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        void *set_args[] = {&h, &flag};
        cudaGraphNode_t set = add_kernel(g, nullptr, 0, (void *)set_condition, set_args);
        cudaGraph_t *bodies = add_conditional(g, set, h, cudaGraphCondTypeIf, size);
        int then_v = size == 1 ? 1 : 10, else_v = 100;
        void *then_args[] = {&acc, &then_v};
        add_kernel(bodies[0], nullptr, 0, (void *)add, then_args);
        if (size == 2) {
            void *else_args[] = {&acc, &else_v};
            add_kernel(bodies[1], nullptr, 0, (void *)add, else_args);
        }
        cudaGraphExec_t e;
        CHECK(cudaGraphInstantiate(&e, g, 0));
        int want = 0;
        put(acc, 0);
        const int flags[] = {1, 0, 7, 0, 0, 1};
        for (int f : flags) {
            put(flag, f);
            CHECK(cudaGraphLaunch(e, s));
            CHECK(cudaStreamSynchronize(s));
            want += f ? then_v : (size == 2 ? else_v : 0);
            int got = read_acc(acc);
            if (got != want)
                fail("if (%u bodies), condition %d: acc is %d, expected %d", size, f, got, want);
        }
        CHECK(cudaGraphExecDestroy(e));
        CHECK(cudaGraphDestroy(g));
    }

    // while: the handle's default value (1) starts the loop, the body counts to *limit.
    {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
        cudaGraph_t *bodies = add_conditional(g, nullptr, h, cudaGraphCondTypeWhile, 1);
        void *args[] = {&h, &counter, &limit};
        add_kernel(bodies[0], nullptr, 0, (void *)count_step, args);
        cudaGraphExec_t e;
        CHECK(cudaGraphInstantiate(&e, g, 0));
        const int limits[] = {1, 5, 37};
        for (int l : limits) {
            put(counter, 0);
            put(limit, l);
            CHECK(cudaGraphLaunch(e, s));
            CHECK(cudaStreamSynchronize(s));
            int got = read_acc(counter);
            if (got != l)
                fail("while: the loop ran %d times, expected %d", got, l);
        }
        CHECK(cudaGraphExecDestroy(e));
        CHECK(cudaGraphDestroy(g));
    }

    // switch with 4 bodies: body n adds (n + 1) * 3; body 2 is a memset node and then the add;
    // body 3 is filled by stream capture; a value >= 4 runs none.
    {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        void *set_args[] = {&h, &flag};
        cudaGraphNode_t set = add_kernel(g, nullptr, 0, (void *)set_condition, set_args);
        cudaGraph_t *bodies = add_conditional(g, set, h, cudaGraphCondTypeSwitch, 4);
        int v[4] = {3, 6, 9, 12};
        for (int n = 0; n < 2; n++) {
            void *args[] = {&acc, &v[n]};
            add_kernel(bodies[n], nullptr, 0, (void *)add, args);
        }
        cudaMemsetParams ms = {};
        ms.dst = counter;
        ms.value = 0x55;
        ms.elementSize = 1;
        ms.width = sizeof(int);
        ms.height = 1;
        cudaGraphNode_t m;
        CHECK(cudaGraphAddMemsetNode(&m, bodies[2], nullptr, 0, &ms));
        void *args2[] = {&acc, &v[2]};
        add_kernel(bodies[2], &m, 1, (void *)add, args2);
        CHECK(cudaStreamBeginCaptureToGraph(s, bodies[3], nullptr, nullptr, 0,
                                            cudaStreamCaptureModeRelaxed));
        add<<<1, 32, 0, s>>>(acc, v[3]);
        cudaGraph_t captured;
        CHECK(cudaStreamEndCapture(s, &captured));
        if (captured != bodies[3])
            fail("capture into a body returned another graph");
        size_t in_body = 0;
        CHECK(cudaGraphGetNodes(bodies[3], nullptr, &in_body));
        if (in_body != 1)
            fail("the captured body has %zu nodes, expected 1", in_body);
        cudaGraphExec_t e;
        CHECK(cudaGraphInstantiate(&e, g, 0));
        put(acc, 0);
        put(counter, 0);
        int want = 0;
        const int values[] = {0, 1, 2, 3, 4, 9, 3, 0};
        for (int x : values) {
            put(flag, x);
            CHECK(cudaGraphLaunch(e, s));
            CHECK(cudaStreamSynchronize(s));
            if (x < 4)
                want += v[x];
            int got = read_acc(acc);
            if (got != want)
                fail("switch, value %d: acc is %d, expected %d", x, got, want);
        }
        if (read_acc(counter) != 0x55555555)
            fail("the memset node of body 2 did not run");
        CHECK(cudaGraphExecDestroy(e));
        CHECK(cudaGraphDestroy(g));
    }

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(acc));
    CHECK(cudaFree(flag));
    CHECK(cudaFree(counter));
    CHECK(cudaFree(limit));
    return pass();
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// CUDA graphs built by hand: memcpy (pinned memory), memset, kernel, child graph, event record and
// event wait nodes with their dependencies; the node queries (nodes, roots, edges, types,
// dependencies); instantiate and launch many times, reading new input each time; kernel node
// parameters changed in the executable graph and through cudaGraphExecUpdate; a node disabled;
// a clone; memory allocation and free nodes; a failed update (topology changed); the DOT dump.
// Results are compared with the CPU.
#define TEST_NAME "graphs"
#include "selfcheck.cuh"

#include <cstring>
#include <vector>

// x[i] = x[i] * a + b
__global__ void axpb(float *x, float a, float b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * a + b;
}

// y[i] += x[i]
__global__ void accumulate(float *y, const float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

static const int N = 1 << 16;

__device__ int marker[4];

// marker[i] = marker[i] * 10 + i
__global__ void mark()
{
    int i = threadIdx.x;
    if (i < 4)
        marker[i] = marker[i] * 10 + i;
}

static cudaKernelNodeParams axpb_params(void **args, int n)
{
    cudaKernelNodeParams p = {};
    p.func = (void *)axpb;
    p.gridDim = dim3((n + 255) / 256);
    p.blockDim = dim3(256);
    p.kernelParams = args;
    return p;
}

static void expect(const float *got, const float *in, float a, float b, const char *what)
{
    for (int i = 0; i < N; i++) {
        float want = in[i] * a + b;
        if (got[i] != want)
            fail("%s: element %d is %f, expected %f", what, i, got[i], want);
    }
}

static void fill(float *in, int round)
{
    for (int i = 0; i < N; i++)
        in[i] = (float)((i * 7 + round * 13) % 1000) - 500.0f;
}

int main()
{
    require_device();
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *in, *out, *x, *y;
    CHECK(cudaMallocHost(&in, N * sizeof(float)));
    CHECK(cudaMallocHost(&out, N * sizeof(float)));
    CHECK(cudaMalloc(&x, N * sizeof(float)));
    CHECK(cudaMalloc(&y, N * sizeof(float)));
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));

    // The child graph: y += x.
    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    int n = N;
    void *acc_args[] = {&y, &x, &n};
    cudaKernelNodeParams acc = {};
    acc.func = (void *)accumulate;
    acc.gridDim = dim3((N + 255) / 256);
    acc.blockDim = dim3(256);
    acc.kernelParams = acc_args;
    cudaGraphNode_t acc_node;
    CHECK(cudaGraphAddKernelNode(&acc_node, child, nullptr, 0, &acc));

    // The graph: in -> x; x = x*a + b; y = 0 (in parallel); child; out <- y; record `done`.
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphNode_t copy_in, kernel, memset, child_node, copy_out, record;
    CHECK(cudaGraphAddMemcpyNode1D(&copy_in, graph, nullptr, 0, x, in, N * sizeof(float),
                                   cudaMemcpyHostToDevice));
    float a = 2.0f, b = 1.0f;
    void *args[] = {&x, &a, &b, &n};
    cudaKernelNodeParams kp = axpb_params(args, N);
    CHECK(cudaGraphAddKernelNode(&kernel, graph, &copy_in, 1, &kp));
    cudaMemsetParams ms = {};
    ms.dst = y;
    ms.value = 0;
    ms.elementSize = 4;
    ms.width = N;
    ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&memset, graph, nullptr, 0, &ms));
    cudaGraphNode_t before_child[] = {kernel, memset};
    CHECK(cudaGraphAddChildGraphNode(&child_node, graph, before_child, 2, child));
    cudaMemcpy3DParms cp = {};
    cp.srcPtr = make_cudaPitchedPtr(y, N * sizeof(float), N, 1);
    cp.dstPtr = make_cudaPitchedPtr(out, N * sizeof(float), N, 1);
    cp.extent = make_cudaExtent(N * sizeof(float), 1, 1);
    cp.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaGraphAddMemcpyNode(&copy_out, graph, &child_node, 1, &cp));
    CHECK(cudaGraphAddEventRecordNode(&record, graph, &copy_out, 1, done));

    // Queries.
    size_t count = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &count));
    if (count != 6)
        fail("cudaGraphGetNodes counted %zu nodes, expected 6", count);
    cudaGraphNode_t roots[4];
    count = 4;
    CHECK(cudaGraphGetRootNodes(graph, roots, &count));
    if (count != 2 || !((roots[0] == copy_in && roots[1] == memset) ||
                        (roots[0] == memset && roots[1] == copy_in)))
        fail("root nodes: got %zu, expected the two copies' and memset's", count);
    count = 0;
    CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
    if (count != 5)
        fail("cudaGraphGetEdges counted %zu edges, expected 5", count);
    struct {
        cudaGraphNode_t node;
        cudaGraphNodeType type;
    } types[] = {{copy_in, cudaGraphNodeTypeMemcpy},   {kernel, cudaGraphNodeTypeKernel},
                 {memset, cudaGraphNodeTypeMemset},    {child_node, cudaGraphNodeTypeGraph},
                 {copy_out, cudaGraphNodeTypeMemcpy},  {record, cudaGraphNodeTypeEventRecord}};
    for (auto &t : types) {
        cudaGraphNodeType got;
        CHECK(cudaGraphNodeGetType(t.node, &got));
        if (got != t.type)
            fail("node type %d, expected %d", (int)got, (int)t.type);
    }
    cudaGraphNode_t deps[4];
    count = 4;
    CHECK(cudaGraphNodeGetDependencies(child_node, deps, nullptr, &count));
    if (count != 2)
        fail("the child graph node has %zu dependencies, expected 2", count);
    count = 4;
    CHECK(cudaGraphNodeGetDependentNodes(copy_in, deps, nullptr, &count));
    if (count != 1 || deps[0] != kernel)
        fail("copy_in's dependents: %zu, expected the kernel", count);
    cudaKernelNodeParams back = {};
    CHECK(cudaGraphKernelNodeGetParams(kernel, &back));
    if (!back.func || back.gridDim.x != (unsigned)((N + 255) / 256) || back.blockDim.x != 256 ||
        !back.kernelParams || *(float **)back.kernelParams[0] != x ||
        *(float *)back.kernelParams[1] != 2.0f || *(float *)back.kernelParams[2] != 1.0f ||
        *(int *)back.kernelParams[3] != N)
        fail("cudaGraphKernelNodeGetParams does not give back the kernel node's parameters");
    cudaMemsetParams ms_back = {};
    CHECK(cudaGraphMemsetNodeGetParams(memset, &ms_back));
    if (ms_back.dst != y || ms_back.elementSize != 4 || ms_back.width != (size_t)N ||
        ms_back.value != 0)
        fail("cudaGraphMemsetNodeGetParams does not give back the memset node's parameters");
    cudaMemcpy3DParms cp_back = {};
    CHECK(cudaGraphMemcpyNodeGetParams(copy_out, &cp_back));
    if (cp_back.dstPtr.ptr != out || cp_back.srcPtr.ptr != y ||
        cp_back.extent.width != N * sizeof(float) || cp_back.extent.height != 1)
        fail("cudaGraphMemcpyNodeGetParams does not give back the memcpy node's parameters");
    cudaEvent_t got_event = nullptr;
    CHECK(cudaGraphEventRecordNodeGetEvent(record, &got_event));
    if (got_event != done)
        fail("cudaGraphEventRecordNodeGetEvent returned another event");
    cudaGraph_t embedded;
    CHECK(cudaGraphChildGraphNodeGetGraph(child_node, &embedded));
    count = 0;
    CHECK(cudaGraphGetNodes(embedded, nullptr, &count));
    if (count != 1)
        fail("the child graph node's graph has %zu nodes, expected 1", count);
    // An edge added and removed again.
    cudaGraphNode_t empty;
    CHECK(cudaGraphAddEmptyNode(&empty, graph, nullptr, 0));
    CHECK(cudaGraphAddDependencies(graph, &record, &empty, nullptr, 1));
    count = 4;
    CHECK(cudaGraphNodeGetDependentNodes(record, deps, nullptr, &count));
    if (count != 1 || deps[0] != empty)
        fail("the added edge is missing");
    CHECK(cudaGraphRemoveDependencies(graph, &record, &empty, nullptr, 1));
    count = 4;
    CHECK(cudaGraphNodeGetDependentNodes(record, deps, nullptr, &count));
    if (count != 0)
        fail("the removed edge is still there");
    CHECK(cudaGraphDestroyNode(empty));
    count = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &count));
    if (count != 6)
        fail("after cudaGraphDestroyNode the graph has %zu nodes, expected 6", count);

    // Instantiate and launch, with new input each time.
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphUpload(exec, s));
    unsigned long long exec_flags = 99;
    CHECK(cudaGraphExecGetFlags(exec, &exec_flags));
    if (exec_flags != 0)
        fail("cudaGraphExecGetFlags returned %llu, expected 0", exec_flags);
    std::vector<float> copy(N);
    for (int round = 0; round < 8; round++) {
        fill(in, round);
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        expect(out, in, 2.0f, 1.0f, "launch");
    }
    CHECK(cudaEventQuery(done));
    // Many launches in a row: each reads the same input, the result is the same.
    fill(in, 99);
    for (int i = 0; i < 200; i++)
        CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    expect(out, in, 2.0f, 1.0f, "200 launches");

    // New kernel parameters in the executable graph only.
    float a3 = 3.0f, b3 = -4.0f;
    void *args3[] = {&x, &a3, &b3, &n};
    cudaKernelNodeParams kp3 = axpb_params(args3, N);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, kernel, &kp3));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    expect(out, in, 3.0f, -4.0f, "exec kernel node params");

    // Disabled kernel node: x is the input.
    CHECK(cudaGraphNodeSetEnabled(exec, kernel, 0));
    unsigned enabled = 1;
    CHECK(cudaGraphNodeGetEnabled(exec, kernel, &enabled));
    if (enabled)
        fail("the kernel node still reads enabled");
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    expect(out, in, 1.0f, 0.0f, "disabled kernel node");
    CHECK(cudaGraphNodeSetEnabled(exec, kernel, 1));

    // The graph's own node changed, then the executable graph updated from it.
    float a5 = 0.5f, b5 = 8.0f;
    void *args5[] = {&x, &a5, &b5, &n};
    cudaKernelNodeParams kp5 = axpb_params(args5, N);
    CHECK(cudaGraphKernelNodeSetParams(kernel, &kp5));
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(exec, graph, &info));
    if (info.result != cudaGraphExecUpdateSuccess)
        fail("cudaGraphExecUpdate result %d", (int)info.result);
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    expect(out, in, 0.5f, 8.0f, "updated executable graph");

    // Memset and memcpy nodes changed in the executable graph: y starts at 0x3f800000 (1.0f).
    cudaMemsetParams ms1 = ms;
    ms1.value = 0x3f800000;
    CHECK(cudaGraphExecMemsetNodeSetParams(exec, memset, &ms1));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    expect(out, in, 0.5f, 9.0f, "exec memset node params");

    // A clone runs the same work (with the graph's current parameters).
    cudaGraph_t clone;
    CHECK(cudaGraphClone(&clone, graph));
    cudaGraphNode_t kernel_in_clone;
    CHECK(cudaGraphNodeFindInClone(&kernel_in_clone, kernel, clone));
    cudaGraphNodeType clone_type;
    CHECK(cudaGraphNodeGetType(kernel_in_clone, &clone_type));
    if (kernel_in_clone == kernel || clone_type != cudaGraphNodeTypeKernel)
        fail("cudaGraphNodeFindInClone did not find the kernel node's clone");
    cudaGraphExec_t clone_exec;
    CHECK(cudaGraphInstantiateWithFlags(&clone_exec, clone, 0));
    fill(in, 5);
    CHECK(cudaGraphLaunch(clone_exec, s));
    CHECK(cudaStreamSynchronize(s));
    expect(out, in, 0.5f, 8.0f, "clone");

    // An event wait node: a graph that waits for `done`, then scales x.
    cudaGraph_t waiter;
    CHECK(cudaGraphCreate(&waiter, 0));
    cudaGraphNode_t wait, scale;
    CHECK(cudaGraphAddEventWaitNode(&wait, waiter, nullptr, 0, done));
    float a2 = 2.0f, b0 = 0.0f;
    void *args2[] = {&x, &a2, &b0, &n};
    cudaKernelNodeParams kp2 = axpb_params(args2, N);
    CHECK(cudaGraphAddKernelNode(&scale, waiter, &wait, 1, &kp2));
    cudaGraphExec_t waiter_exec;
    CHECK(cudaGraphInstantiate(&waiter_exec, waiter, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaGraphLaunch(waiter_exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(copy.data(), x, N * sizeof(float), cudaMemcpyDeviceToHost));
    expect(copy.data(), in, 1.0f, 16.0f, "event wait graph");

    // Copies to and from a __device__ variable around a kernel that uses it.
    int *pinned_marks;
    CHECK(cudaMallocHost(&pinned_marks, 8 * sizeof(int)));
    for (int i = 0; i < 4; i++)
        pinned_marks[i] = i + 1;
    cudaGraph_t sym_graph;
    CHECK(cudaGraphCreate(&sym_graph, 0));
    cudaGraphNode_t to_sym, mark_node, from_sym;
    CHECK(cudaGraphAddMemcpyNodeToSymbol(&to_sym, sym_graph, nullptr, 0, marker, pinned_marks,
                                         4 * sizeof(int), 0, cudaMemcpyHostToDevice));
    cudaKernelNodeParams mk = {};
    mk.func = (void *)mark;
    mk.gridDim = dim3(1);
    mk.blockDim = dim3(32);
    mk.kernelParams = nullptr;
    CHECK(cudaGraphAddKernelNode(&mark_node, sym_graph, &to_sym, 1, &mk));
    CHECK(cudaGraphAddMemcpyNodeFromSymbol(&from_sym, sym_graph, &mark_node, 1, pinned_marks + 4,
                                           marker, 4 * sizeof(int), 0, cudaMemcpyDeviceToHost));
    cudaGraphExec_t sym_exec;
    CHECK(cudaGraphInstantiate(&sym_exec, sym_graph, 0));
    CHECK(cudaGraphLaunch(sym_exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 4; i++)
        if (pinned_marks[4 + i] != (i + 1) * 10 + i)
            fail("symbol graph: marker[%d] is %d, expected %d", i, pinned_marks[4 + i],
                 (i + 1) * 10 + i);
    CHECK(cudaGraphExecDestroy(sym_exec));
    CHECK(cudaGraphDestroy(sym_graph));
    CHECK(cudaFreeHost(pinned_marks));

    // Memory nodes: an allocation set, scaled, copied out and freed, all inside the graph.
    cudaGraph_t mem_graph;
    CHECK(cudaGraphCreate(&mem_graph, 0));
    int device = 0;
    CHECK(cudaGetDevice(&device));
    cudaMemAllocNodeParams ap = {};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = device;
    ap.bytesize = N * sizeof(float);
    cudaGraphNode_t alloc_node, fill_node, scale_node, out_node, free_node;
    CHECK(cudaGraphAddMemAllocNode(&alloc_node, mem_graph, nullptr, 0, &ap));
    if (!ap.dptr)
        fail("cudaGraphAddMemAllocNode returned no address");
    float *gm = (float *)ap.dptr;
    cudaMemsetParams fill_ones = {};
    fill_ones.dst = gm;
    fill_ones.value = 0x3f800000; // 1.0f
    fill_ones.elementSize = 4;
    fill_ones.width = N;
    fill_ones.height = 1;
    CHECK(cudaGraphAddMemsetNode(&fill_node, mem_graph, &alloc_node, 1, &fill_ones));
    float a7 = 7.0f, b2 = 2.0f;
    void *args7[] = {&gm, &a7, &b2, &n};
    cudaKernelNodeParams kp7 = axpb_params(args7, N);
    CHECK(cudaGraphAddKernelNode(&scale_node, mem_graph, &fill_node, 1, &kp7));
    CHECK(cudaGraphAddMemcpyNode1D(&out_node, mem_graph, &scale_node, 1, out, gm,
                                   N * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaGraphAddMemFreeNode(&free_node, mem_graph, &out_node, 1, gm));
    cudaGraphNodeType alloc_type;
    CHECK(cudaGraphNodeGetType(alloc_node, &alloc_type));
    if (alloc_type != cudaGraphNodeTypeMemAlloc)
        fail("the allocation node has type %d", (int)alloc_type);
    cudaGraphExec_t mem_exec;
    CHECK(cudaGraphInstantiate(&mem_exec, mem_graph, 0));
    for (int round = 0; round < 3; round++) {
        std::memset(out, 0, N * sizeof(float));
        CHECK(cudaGraphLaunch(mem_exec, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < N; i++)
            if (out[i] != 9.0f)
                fail("memory node graph, round %d: element %d is %f, expected 9", round, i, out[i]);
    }
    unsigned long long used_high = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &used_high));
    if (used_high < N * sizeof(float))
        fail("graph memory used at most %llu bytes, expected at least %zu", used_high,
             N * sizeof(float));
    unsigned long long zero = 0;
    CHECK(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &zero));
    CHECK(cudaGraphExecDestroy(mem_exec));
    CHECK(cudaGraphDestroy(mem_graph));
    CHECK(cudaDeviceGraphMemTrim(device));

    // An update with another topology fails and says so.
    cudaGraph_t other;
    CHECK(cudaGraphCreate(&other, 0));
    cudaGraphNode_t lone;
    CHECK(cudaGraphAddEmptyNode(&lone, other, nullptr, 0));
    EXPECT_ERR(cudaGraphExecUpdate(exec, other, &info), cudaErrorGraphExecUpdateFailure);
    if (info.result == cudaGraphExecUpdateSuccess)
        fail("a failed update reported success");

    // The DOT dump, written by the runtime to a file.
    const char *dot = "graphs_test.dot";
    CHECK(cudaGraphDebugDotPrint(graph, dot, cudaGraphDebugDotFlagsVerbose));
    FILE *f = std::fopen(dot, "r");
    if (!f)
        fail("cudaGraphDebugDotPrint wrote no file");
    char head[64] = {};
    size_t got = std::fread(head, 1, sizeof head - 1, f);
    std::fclose(f);
    std::remove(dot);
    if (got == 0 || !std::strstr(head, "digraph"))
        fail("the DOT file does not start a digraph: \"%s\"", head);

    CHECK(cudaGraphExecDestroy(waiter_exec));
    CHECK(cudaGraphExecDestroy(clone_exec));
    CHECK(cudaGraphExecDestroy(exec));
    for (cudaGraph_t g : {waiter, other, clone, graph, child})
        CHECK(cudaGraphDestroy(g));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFreeHost(in));
    CHECK(cudaFreeHost(out));
    CHECK(cudaStreamDestroy(s));
    return pass();
}

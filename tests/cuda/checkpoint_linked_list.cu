// SPDX-License-Identifier: Apache-2.0 OR MIT
// A program whose state only survives a pause if its device pointers keep their values: a
// linked list built in device memory (each node holds the next node's device address), walked
// and updated by a kernel every iteration; two streams ordered by events; a CUDA graph captured
// once and launched every iteration; a managed buffer the kernels accumulate into. It loops
// ITERATIONS times (argv[1], default 200), sleeping SLEEP_US between iterations (argv[2],
// default 0; scripts/test-checkpoint.sh gives 3000 and 2000 so that an operator can pause it
// mid-loop), and prints
// "CHECKSUM <hex>", which must equal an uninterrupted run's, before its PASS line. Prints
// "CHECKPOINT ready" after the first iteration. argv[3], WORKING_SET_MIB (default 0), adds a
// device buffer of that many MiB, filled with a pattern by the GPU and checked at the end (the
// migration downtime of scripts/test-migration.sh is measured with 1 GiB and 16 GiB); argv[4]
// (default 1) 0 launches the graph's two kernels directly instead of through the graph, and
// argv[5] (default 1) 0 keeps the "managed" buffer in plain device memory (copied in and out).
// argv[6] (default 0) 1 keeps a stream-ordered allocation (cudaMallocAsync) live through the
// loop, which a saved state cannot hold: a migration must then fail and the program go on.
// argv[7], REWRITE (default 0), 1 rewrites the whole working set every iteration with a pattern
// of that iteration (a training-like loop whose memory changes between any two stops); the end
// checks the last iteration's pattern. Prints "RATE <iterations> <seconds> <iterations/s>" (the
// loop's own wall time) before the checksum, so that a migrated run's rate can be set against
// an uninterrupted one's. argv[8], JOURNAL (default 0), 1 copies the walk's accumulator
// every iteration into entry `it` of two journals in host memory, each entry written once: a
// pageable one (cudaMemcpy) and a pinned one (cudaMemcpyAsync into cudaHostAlloc memory, the
// GPU's DMA, landing after the call returns). Both are checked equal and folded into the
// checksum, so a page of either that a migration's last pass of guest RAM left behind shows.
#define TEST_NAME "checkpoint_linked_list"
#include "selfcheck.cuh"

#include <cstdint>
#include <cstring>
#include <chrono>
#include <unistd.h>

struct Node {
    Node *next;
    unsigned long long value;
    // Padding, so nodes span small blocks and whole granules alike.
    unsigned long long pad[6];
};

// Walks the list from `head` and folds every value into `acc[0]`; bumps each value.
__global__ void walk(Node *head, unsigned long long *acc, unsigned long long salt)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    unsigned long long h = acc[0];
    for (Node *n = head; n != nullptr; n = n->next) {
        h = (h ^ n->value) * 0x100000001b3ULL + salt;
        n->value += salt | 1;
    }
    acc[0] = h;
}

// buf[i] = buf[i] * 3 + i (a graph's kernel).
__global__ void mix(unsigned int *buf, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        buf[i] = buf[i] * 3u + (unsigned)i;
}

// working[i] = i * 2654435761 ^ salt (a pattern every word of which a restore must bring back).
__global__ void fill_working(unsigned int *working, size_t words, unsigned int salt)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
         i += (size_t)gridDim.x * blockDim.x)
        working[i] = (unsigned int)(i * 2654435761u) ^ salt;
}

// bad[0] += number of words of `working` that differ from the pattern of `salt`.
__global__ void check_working(const unsigned int *working, size_t words, unsigned int salt,
                              unsigned long long *bad)
{
    unsigned long long n = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
         i += (size_t)gridDim.x * blockDim.x)
        n += working[i] != ((unsigned int)(i * 2654435761u) ^ salt);
    if (n)
        atomicAdd(bad, n);
}

// managed[i % m] += buf[i]
__global__ void fold(const unsigned int *buf, int n, unsigned long long *managed, int m)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        atomicAdd(&managed[i % m], (unsigned long long)buf[i]);
}

int main(int argc, char **argv)
{
    require_device();
    const int iterations = argc > 1 ? atoi(argv[1]) : 200;
    const int sleep_us = argc > 2 ? atoi(argv[2]) : 0;
    const size_t working_mib = argc > 3 ? strtoull(argv[3], nullptr, 10) : 0;
    const bool use_graph = argc > 4 ? atoi(argv[4]) != 0 : true;
    const bool use_managed = argc > 5 ? atoi(argv[5]) != 0 : true;
    const bool live_async = argc > 6 ? atoi(argv[6]) != 0 : false;
    const bool rewrite = argc > 7 ? atoi(argv[7]) != 0 : false;
    const bool use_journal = argc > 8 ? atoi(argv[8]) != 0 : false;
    unsigned int salt = 0;
    const int nodes = 300, N = 1 << 16, M = 64;
    // The working set: a pattern the GPU writes, checked and folded into the checksum at the end.
    const size_t words = working_mib * (1 << 20) / sizeof(unsigned int);
    unsigned int *working = nullptr;
    if (words > 0) {
        CHECK(cudaMalloc(&working, words * sizeof *working));
        fill_working<<<1024, 256>>>(working, words, salt);
        CHECK(cudaDeviceSynchronize());
    }

    // The list: nodes allocated one by one (small ones) and a few large ones, linked in a
    // shuffled order, the links written from the host.
    Node **dev = new Node *[nodes];
    for (int i = 0; i < nodes; i++) {
        size_t sz = (i % 50 == 7) ? (size_t)(3 << 20) : sizeof(Node);
        CHECK(cudaMalloc(&dev[i], sz));
    }
    int *order = new int[nodes];
    for (int i = 0; i < nodes; i++)
        order[i] = (i * 37) % nodes;
    for (int k = 0; k < nodes; k++) {
        Node h = {};
        h.next = k + 1 < nodes ? dev[order[k + 1]] : nullptr;
        h.value = 0x9e3779b97f4a7c15ULL * (unsigned long long)(k + 1);
        CHECK(cudaMemcpy(dev[order[k]], &h, sizeof h, cudaMemcpyHostToDevice));
    }
    Node *head = dev[order[0]];
    unsigned long long *acc;
    CHECK(cudaMalloc(&acc, sizeof *acc));
    CHECK(cudaMemset(acc, 0, sizeof *acc));

    unsigned int *buf;
    CHECK(cudaMalloc(&buf, N * sizeof *buf));
    CHECK(cudaMemset(buf, 1, N * sizeof *buf));
    unsigned long long *managed;
    unsigned long long managed_init[M];
    for (int i = 0; i < M; i++)
        managed_init[i] = (unsigned long long)i;
    if (use_managed) {
        CHECK(cudaMallocManaged(&managed, M * sizeof *managed));
        for (int i = 0; i < M; i++)
            managed[i] = managed_init[i];
    } else {
        CHECK(cudaMalloc(&managed, M * sizeof *managed));
        CHECK(cudaMemcpy(managed, managed_init, sizeof managed_init, cudaMemcpyHostToDevice));
    }

    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithPriority(&b, cudaStreamNonBlocking, -1));
    cudaEvent_t done_a, done_b;
    CHECK(cudaEventCreateWithFlags(&done_a, cudaEventDisableTiming));
    CHECK(cudaEventCreate(&done_b));

    // The graph: mix then fold, captured once on stream b.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(b, cudaStreamCaptureModeGlobal));
    mix<<<N / 256, 256, 0, b>>>(buf, N);
    fold<<<N / 256, 256, 0, b>>>(buf, N, managed, M);
    CHECK(cudaStreamEndCapture(b, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    void *held = nullptr;
    if (live_async) {
        CHECK(cudaMallocAsync(&held, 4096, a));
        CHECK(cudaMemsetAsync(held, 0, 4096, a));
    }

    unsigned long long *journal = nullptr, *pinned_journal = nullptr;
    if (use_journal) {
        journal = static_cast<unsigned long long *>(calloc(iterations, sizeof *journal));
        if (journal == nullptr)
            fail("no memory for the journal");
        CHECK(cudaHostAlloc(&pinned_journal, iterations * sizeof *pinned_journal,
                            cudaHostAllocDefault));
        std::memset(pinned_journal, 0, iterations * sizeof *pinned_journal);
    }

    const auto loop_start = std::chrono::steady_clock::now();
    for (int it = 0; it < iterations; it++) {
        if (rewrite && working != nullptr) {
            salt = 0x9e3779b9u * (unsigned int)(it + 1);
            fill_working<<<1024, 256, 0, a>>>(working, words, salt);
        }
        walk<<<1, 1, 0, a>>>(head, acc, (unsigned long long)it);
        if (use_journal)
            CHECK(cudaMemcpyAsync(&pinned_journal[it], acc, sizeof *acc, cudaMemcpyDeviceToHost,
                                  a));
        CHECK(cudaEventRecord(done_a, a));
        CHECK(cudaStreamWaitEvent(b, done_a, 0));
        if (use_graph) {
            CHECK(cudaGraphLaunch(exec, b));
        } else {
            mix<<<N / 256, 256, 0, b>>>(buf, N);
            fold<<<N / 256, 256, 0, b>>>(buf, N, managed, M);
        }
        CHECK(cudaEventRecord(done_b, b));
        CHECK(cudaStreamWaitEvent(a, done_b, 0));
        CHECK(cudaEventSynchronize(done_b));
        // Stream a had walked (b waited for it), so acc holds this iteration's value.
        if (use_journal)
            CHECK(cudaMemcpy(&journal[it], acc, sizeof *acc, cudaMemcpyDeviceToHost));
        if (it == 0) {
            std::printf("CHECKPOINT ready\n");
            std::fflush(stdout);
        }
        if (sleep_us > 0)
            usleep(sleep_us);
    }
    if (held != nullptr)
        CHECK(cudaFreeAsync(held, a));
    CHECK(cudaDeviceSynchronize());
    const double loop_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    std::printf("RATE %d %.3f %.2f\n", iterations, loop_s, loop_s > 0 ? iterations / loop_s : 0.0);

    unsigned long long h = 0;
    CHECK(cudaMemcpy(&h, acc, sizeof h, cudaMemcpyDeviceToHost));
    unsigned int *host = new unsigned int[N];
    CHECK(cudaMemcpy(host, buf, N * sizeof *host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        h = (h ^ host[i]) * 0x100000001b3ULL;
    unsigned long long managed_end[M];
    if (use_managed)
        std::memcpy(managed_end, managed, sizeof managed_end);
    else
        CHECK(cudaMemcpy(managed_end, managed, sizeof managed_end, cudaMemcpyDeviceToHost));
    for (int i = 0; i < M; i++)
        h = (h ^ managed_end[i]) * 0x100000001b3ULL;
    if (use_journal) {
        for (int it = 0; it < iterations; it++) {
            if (journal[it] != pinned_journal[it] || journal[it] == 0)
                fail("journal entry %d: pageable %016llx, pinned %016llx", it, journal[it],
                     pinned_journal[it]);
            h = (h ^ journal[it]) * 0x100000001b3ULL;
        }
        CHECK(cudaFreeHost(pinned_journal));
        free(journal);
    }
    // The list still walks from its head to its end, every link intact.
    int walked = 0;
    for (Node *n = head; n != nullptr; walked++) {
        Node node;
        CHECK(cudaMemcpy(&node, n, sizeof node, cudaMemcpyDeviceToHost));
        h = (h ^ node.value) * 0x100000001b3ULL;
        n = node.next;
        if (walked > nodes)
            fail("the list has a cycle");
    }
    if (walked != nodes)
        fail("the list has %d nodes, not %d", walked, nodes);
    if (words > 0) {
        unsigned long long *bad;
        CHECK(cudaMalloc(&bad, sizeof *bad));
        CHECK(cudaMemset(bad, 0, sizeof *bad));
        check_working<<<1024, 256>>>(working, words, salt, bad);
        unsigned long long nbad = 0;
        CHECK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
        if (nbad != 0)
            fail("%llu words of the %zu MiB working set changed", nbad, working_mib);
        CHECK(cudaFree(bad));
        CHECK(cudaFree(working));
    }
    std::printf("CHECKSUM %016llx\n", h);

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaEventDestroy(done_a));
    CHECK(cudaEventDestroy(done_b));
    CHECK(cudaStreamDestroy(a));
    CHECK(cudaStreamDestroy(b));
    CHECK(cudaFree(managed));
    CHECK(cudaFree(buf));
    CHECK(cudaFree(acc));
    for (int i = 0; i < nodes; i++)
        CHECK(cudaFree(dev[i]));
    delete[] dev;
    delete[] order;
    delete[] host;
    return pass();
}

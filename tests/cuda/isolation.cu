// SPDX-License-Identifier: Apache-2.0 OR MIT
// A hostile process cannot reach another process's GPU memory, and its own faults stay its own.
// The program forks before any CUDA call: the child (a victim) allocates and fills device memory,
// tells the parent (the attacker) the pointer through a pipe, and waits. The parent then, with
// that foreign pointer: copies from it, copies to it, sets it, frees it, and finally launches a
// kernel that writes through it. None of these may reach the victim's memory, natively
// (separate processes) as in the guest (separate sessions and workers; there the host refuses
// the pointer). Also: a freed pointer and an impossible allocation fail. The victim then checks
// that its memory is intact and that it still computes correctly.
#define TEST_NAME "isolation"
#include "selfcheck.cuh"

#include <sys/wait.h>
#include <unistd.h>

#include <vector>

__global__ void scribble(unsigned int *p, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = 0xbad0bad0u;
}

__global__ void add(const int *a, const int *b, int *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}

static const int N = 1 << 16;

// The victim: returns the exit status.
static int victim(int to_parent, int from_parent)
{
    // Each process's device addresses start at the same place: a first block moves the target
    // past what the attacker allocates for itself, so its pointer is nobody's in the attacker.
    void *spacer = nullptr;
    if (cudaMalloc(&spacer, (size_t)256 << 20) != cudaSuccess)
        return 10;
    unsigned int *p = nullptr;
    if (cudaMalloc(&p, N * sizeof(unsigned int)) != cudaSuccess)
        return 10;
    std::vector<unsigned int> h(N);
    for (int i = 0; i < N; i++)
        h[i] = 0x5a000000u + i;
    if (cudaMemcpy(p, h.data(), N * sizeof(unsigned int), cudaMemcpyHostToDevice) != cudaSuccess)
        return 11;
    if (write(to_parent, &p, sizeof p) != sizeof p)
        return 12;
    char go;
    if (read(from_parent, &go, 1) != 1)
        return 13;
    // The attacker is done: our memory is untouched and we still work.
    std::vector<unsigned int> back(N);
    if (cudaMemcpy(back.data(), p, N * sizeof(unsigned int), cudaMemcpyDeviceToHost) != cudaSuccess)
        return 14;
    for (int i = 0; i < N; i++)
        if (back[i] != h[i]) {
            std::printf("victim: word %d is %#x, want %#x\n", i, back[i], h[i]);
            return 15;
        }
    int *a, *b, *c;
    std::vector<int> ha(N), hb(N), hc(N);
    for (int i = 0; i < N; i++) {
        ha[i] = i;
        hb[i] = 3 * i;
    }
    if (cudaMalloc(&a, N * sizeof(int)) || cudaMalloc(&b, N * sizeof(int)) ||
        cudaMalloc(&c, N * sizeof(int)))
        return 16;
    cudaMemcpy(a, ha.data(), N * sizeof(int), cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), N * sizeof(int), cudaMemcpyHostToDevice);
    add<<<(N + 255) / 256, 256>>>(a, b, c, N);
    if (cudaMemcpy(hc.data(), c, N * sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess)
        return 17;
    for (int i = 0; i < N; i++)
        if (hc[i] != 4 * i)
            return 18;
    return 0;
}

// What a call with the other process's pointer gave. Natively such a pointer is just an
// address of this process (the runtime may even treat it as host memory), so success is not a
// breach by itself; a breach is reaching the victim's data, which the checks here and the
// victim's own check at the end look for.
static void attempt(cudaError_t e, const char *what)
{
    std::printf("%s: %s\n", what, cudaGetErrorName(e));
    cudaGetLastError();
}

int main()
{
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0)
        fail("pipe");
    pid_t child = fork();
    if (child < 0)
        fail("fork");
    if (child == 0)
        _exit(victim(up[1], down[0]));

    require_device();
    unsigned int *foreign = nullptr;
    if (read(up[0], &foreign, sizeof foreign) != sizeof foreign) {
        int st = 0;
        waitpid(child, &st, 0);
        fail("the victim did not start (exit %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    std::printf("victim's pointer: %p\n", (void *)foreign);
    cudaPointerAttributes pa;
    if (cudaPointerGetAttributes(&pa, foreign) == cudaSuccess && pa.type == cudaMemoryTypeDevice)
        fail("the victim's pointer is a device pointer of this process too: nothing to test");
    cudaGetLastError();

    // Our own memory next to it, so that the process has a context and allocations.
    unsigned int *own = nullptr;
    CHECK(cudaMalloc(&own, N * sizeof(unsigned int)));
    std::vector<unsigned int> h(N, 0);
    // Our own mistakes first (what follows may leave this process with a sticky error): a freed
    // pointer and an impossible size.
    unsigned int *freed = nullptr;
    CHECK(cudaMalloc(&freed, 4096));
    CHECK(cudaFree(freed));
    EXPECT_ERR(cudaMemcpy(h.data(), freed, 4096, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    void *huge = nullptr;
    EXPECT_ERR(cudaMalloc(&huge, (size_t)1 << 50), cudaErrorMemoryAllocation);
    cudaGetLastError();

    attempt(cudaMemcpy(h.data(), foreign, 4096, cudaMemcpyDeviceToHost), "copy from");
    for (int i = 0; i < 1024; i++)
        if (h[i] == 0x5a000000u + i)
            fail("a copy from another process's pointer returned its data (word %d = %#x)", i,
                 h[i]);
    attempt(cudaMemcpy(foreign, h.data(), 4096, cudaMemcpyHostToDevice), "copy to");
    attempt(cudaMemcpy(own, foreign, 4096, cudaMemcpyDeviceToDevice), "device copy from");
    if (cudaMemcpy(h.data(), own, 4096, cudaMemcpyDeviceToHost) == cudaSuccess)
        for (int i = 0; i < 1024; i++)
            if (h[i] == 0x5a000000u + i)
                fail("a device copy from another process's pointer got its data");
    cudaGetLastError();
    attempt(cudaMemset(foreign, 0, 4096), "memset");
    attempt(cudaFree(foreign), "free");

    // Last: a kernel that writes through the foreign pointer. It must not reach the victim; in
    // this process it is an illegal address (or, if the address happens to be ours, our own
    // memory, which we then find changed). Either way the victim is checked below.
    scribble<<<64, 256>>>(foreign, N);
    cudaError_t fault = cudaDeviceSynchronize();
    std::printf("kernel through the foreign pointer: %s\n", cudaGetErrorName(fault));

    char go = 1;
    if (write(down[1], &go, 1) != 1)
        fail("pipe to the victim");
    int st = 0;
    waitpid(child, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail("the victim's memory or work was disturbed (exit %d)",
             WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return pass();
}

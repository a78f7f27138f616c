// SPDX-License-Identifier: Apache-2.0 OR MIT
// A program mixing the runtime and the driver API, as CUDA documents the two share contexts:
// after cudaSetDevice(d) (CUDA 12 and later initialise the primary context there),
// cuCtxGetCurrent is d's primary context, the one cuDevicePrimaryCtxRetain hands out, and
// cuCtxGetDevice says d; cudaFree(0) on another thread does the same for device 0; a context
// made with cuCtxCreate is the one the runtime then works in (cudaGetDevice, a kernel and a copy
// run in it), cudaSetDevice replaces it with the primary context, cuCtxPushCurrent/PopCurrent
// stack contexts, and cuCtxDestroy ends it. Profiler control without a profiler attached
// succeeds (cudaProfilerStart/Stop, cuProfilerStart/Stop). The driver functions are taken
// through cudaGetDriverEntryPointByVersion, so the program needs no -lcuda.
#define TEST_NAME "mixed_contexts"
#include "selfcheck.cuh"

#include <cuda.h>
#include <thread>

// cuda_profiler_api.h is not in the CUDA 13.0 runtime wheels the tests are built with;
// libcudart.so.13 exports both.
extern "C" cudaError_t cudaProfilerStart(void);
extern "C" cudaError_t cudaProfilerStop(void);

__global__ void fill(int *p, int v) { p[threadIdx.x] = v; }

// The form of `name` that CUDA `version` has (cuCtxCreate: _v2 at 3.2, _v3 with affinity
// parameters from 11.4), so each pointer has the signature it is called with.
template <typename F> static F entry(const char *name, unsigned version = 12000)
{
    void *f = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !f)
        fail("no driver entry point %s (%d)", name, (int)q);
    return reinterpret_cast<F>(f);
}

#define CU(call)                                                                                 \
    do {                                                                                         \
        CUresult cu_err_ = (call);                                                               \
        if (cu_err_ != CUDA_SUCCESS)                                                             \
            fail("%s returned %d at %s:%d", #call, (int)cu_err_, __FILE__, __LINE__);            \
    } while (0)

int main()
{
    int count = require_device();
    int dev = count > 1 ? 1 : 0;
    auto ctxGetCurrent = entry<CUresult (*)(CUcontext *)>("cuCtxGetCurrent");
    auto ctxGetDevice = entry<CUresult (*)(CUdevice *)>("cuCtxGetDevice");
    auto primaryRetain = entry<CUresult (*)(CUcontext *, CUdevice)>("cuDevicePrimaryCtxRetain");
    auto primaryRelease = entry<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxRelease");
    auto ctxCreate = entry<CUresult (*)(CUcontext *, unsigned, CUdevice)>("cuCtxCreate", 3020);
    auto ctxDestroy = entry<CUresult (*)(CUcontext)>("cuCtxDestroy");
    auto ctxPush = entry<CUresult (*)(CUcontext)>("cuCtxPushCurrent");
    auto ctxPop = entry<CUresult (*)(CUcontext *)>("cuCtxPopCurrent");
    auto profStart = entry<CUresult (*)()>("cuProfilerStart");
    auto profStop = entry<CUresult (*)()>("cuProfilerStop");

    CHECK(cudaSetDevice(dev));
    CUcontext cur = nullptr, primary = nullptr;
    CU(ctxGetCurrent(&cur));
    CUdevice d = -1;
    CU(ctxGetDevice(&d));
    if (d != dev)
        fail("cuCtxGetDevice after cudaSetDevice(%d) says %d", dev, d);
    CU(primaryRetain(&primary, dev));
    if (cur != primary)
        fail("cuCtxGetCurrent %p is not the primary context %p", (void *)cur, (void *)primary);
    CU(primaryRelease(dev));
    std::printf("after cudaSetDevice(%d): current context is device %d's primary context\n", dev,
                dev);

    // cudaFree(0) on a thread of its own initialises device 0's primary context there.
    std::thread([&] {
        CHECK(cudaFree(nullptr));
        CUcontext c = nullptr, p0 = nullptr;
        CU(ctxGetCurrent(&c));
        CU(primaryRetain(&p0, 0));
        CU(primaryRelease(0));
        CUdevice d0 = -1;
        CU(ctxGetDevice(&d0));
        if (c != p0 || d0 != 0)
            fail("after cudaFree(0) on a new thread: context %p (primary %p), device %d",
                 (void *)c, (void *)p0, d0);
    }).join();

    // A created context: the runtime works in it.
    CUcontext created = nullptr;
    CU(ctxCreate(&created, 0, 0));
    CU(ctxGetCurrent(&cur));
    if (cur != created)
        fail("cuCtxCreate did not make its context current");
    int rt_dev = -1;
    CHECK(cudaGetDevice(&rt_dev));
    if (rt_dev != 0)
        fail("cudaGetDevice in a context of device 0 says %d", rt_dev);
    int *p = nullptr;
    CHECK(cudaMalloc(&p, 32 * sizeof(int)));
    fill<<<1, 32>>>(p, 7);
    CHECK_LAUNCH();
    int h[32];
    CHECK(cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 32; i++)
        if (h[i] != 7)
            fail("kernel in the created context: element %d is %d", i, h[i]);
    CHECK(cudaFree(p));

    // Push/pop stack contexts; cudaSetDevice replaces the top with the primary context.
    CU(ctxPush(primary));
    CU(ctxGetCurrent(&cur));
    if (cur != primary)
        fail("cuCtxPushCurrent(primary) did not make it current");
    CUcontext popped = nullptr;
    CU(ctxPop(&popped));
    CU(ctxGetCurrent(&cur));
    if (popped != primary || cur != created)
        fail("cuCtxPopCurrent popped %p, current %p", (void *)popped, (void *)cur);
    CHECK(cudaSetDevice(dev));
    CU(ctxGetCurrent(&cur));
    if (cur != primary)
        fail("cudaSetDevice(%d) did not make the primary context current", dev);
    CU(ctxDestroy(created));

    // No profiler attached: profiler control is a successful no-op.
    CHECK(cudaProfilerStart());
    CHECK(cudaProfilerStop());
    CU(profStart());
    CU(profStop());
    return pass();
}

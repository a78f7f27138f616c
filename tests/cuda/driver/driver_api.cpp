// The CUDA driver API in the guest: a program that uses libcuda.so.1 only (no runtime), the way
// NVIDIA's vectorAddDrv and matrixMulDrv samples do, and checks every result.
//   devices, contexts (created and primary, the stack), modules from a fatbin and from PTX,
//   libraries and CUkernel launches, kernel parameters by pointer array and by packed buffer,
//   globals, 8/16/32-bit memsets, streams, events, async copies, function attributes,
//   occupancy, cuGetProcAddress, error codes for bad names and unsupported calls.
// Prints PASS/FAIL/SKIP like tests/cuda/selfcheck.cuh and exits 0/1/2.
#include <cuda.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "driver_api.kernels.h" // fatbin_image[], ptx_image[] (generated from the .cu)

#define NAME "driver_api"

static void fail(const char *what, CUresult r, int line) {
    const char *s = nullptr;
    cuGetErrorName(r, &s);
    std::printf("FAIL " NAME ": %s -> %s (%d) at line %d\n", what, s ? s : "?", (int)r, line);
    std::exit(1);
}
#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) fail(#call, r_, __LINE__);                                         \
    } while (0)
#define EXPECT(call, want)                                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != (want)) fail(#call " (expected " #want ")", r_, __LINE__);                       \
    } while (0)
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            std::printf("FAIL " NAME ": %s at line %d\n", #cond, __LINE__);                        \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

struct Pair {
    int x;
    double y;
};

static void check_sum(const std::vector<float> &a, const std::vector<float> &b,
                      const std::vector<float> &c, float scale) {
    for (size_t i = 0; i < a.size(); i++)
        if (std::fabs(c[i] - scale * (a[i] + b[i])) > 1e-5f) {
            std::printf("FAIL " NAME ": c[%zu] = %f, want %f\n", i, c[i], scale * (a[i] + b[i]));
            std::exit(1);
        }
}

int main() {
    CUresult r = cuInit(0);
    if (r == CUDA_ERROR_NO_DEVICE) {
        std::printf("SKIP " NAME ": no CUDA device (CUDA_ERROR_NO_DEVICE)\n");
        return 2;
    }
    CK(r);
    int version = 0;
    CK(cuDriverGetVersion(&version));
    REQUIRE(version >= 12000);
    int count = 0;
    CK(cuDeviceGetCount(&count));
    REQUIRE(count > 0);
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    EXPECT(cuDeviceGet(&dev, count), CUDA_ERROR_INVALID_DEVICE);
    CK(cuDeviceGet(&dev, 0));
    char name[256];
    CK(cuDeviceGetName(name, sizeof name, dev));
    size_t total = 0;
    CK(cuDeviceTotalMem(&total, dev));
    int major = 0, minor = 0;
    CK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    CUuuid uuid;
    CK(cuDeviceGetUuid(&uuid, dev));
    std::printf("device 0: %s, %zu MiB, sm_%d%d, driver %d\n", name, total >> 20, major, minor,
                version);

    // A created context is current until popped or destroyed.
    CUcontext ctx = nullptr, cur = nullptr;
    CK(cuCtxCreate(&ctx, nullptr, 0, dev));
    CK(cuCtxGetCurrent(&cur));
    REQUIRE(cur == ctx);
    CUdevice cdev = -1;
    CK(cuCtxGetDevice(&cdev));
    REQUIRE(cdev == dev);
    unsigned long long id = 0;
    CK(cuCtxGetId(ctx, &id));

    // Module from the fatbin: globals, functions, attributes.
    CUmodule mod;
    CK(cuModuleLoadData(&mod, fatbin_image));
    CUfunction vec_add, fill_pair;
    CK(cuModuleGetFunction(&vec_add, mod, "vec_add"));
    CUfunction again;
    CK(cuModuleGetFunction(&again, mod, "vec_add"));
    REQUIRE(again == vec_add);
    EXPECT(cuModuleGetFunction(&again, mod, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    CK(cuModuleGetFunction(&fill_pair, mod, "fill_pair"));
    int max_threads = 0;
    CK(cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, vec_add));
    REQUIRE(max_threads >= 256);
    int blocks = 0;
    CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vec_add, 256, 0));
    REQUIRE(blocks > 0);
    size_t offset = 99, size = 0;
    CK(cuFuncGetParamInfo(vec_add, 3, &offset, &size));
    REQUIRE(offset == 24 && size == 4);
    CUdeviceptr scale;
    size_t scale_bytes = 0;
    CK(cuModuleGetGlobal(&scale, &scale_bytes, mod, "scale"));
    REQUIRE(scale_bytes == sizeof(int));

    const int n = 1 << 16;
    std::vector<float> a(n), b(n), c(n);
    for (int i = 0; i < n; i++) {
        a[i] = float(i);
        b[i] = float(2 * i + 1);
    }
    CUdeviceptr da, db, dc;
    CK(cuMemAlloc(&da, n * sizeof(float)));
    CK(cuMemAlloc(&db, n * sizeof(float)));
    CK(cuMemAlloc(&dc, n * sizeof(float)));
    CUdeviceptr base;
    size_t range = 0;
    CK(cuMemGetAddressRange(&base, &range, db + 100));
    REQUIRE(base == db && range >= n * sizeof(float));
    CK(cuMemcpyHtoD(da, a.data(), n * sizeof(float)));
    CK(cuMemcpyHtoD(db, b.data(), n * sizeof(float)));
    int nn = n;
    void *args[] = {&da, &db, &dc, &nn};
    CK(cuLaunchKernel(vec_add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(c.data(), dc, n * sizeof(float)));
    check_sum(a, b, c, 1.0f);

    // The global changes what the kernel computes; a stream and events order the work.
    int three = 3;
    CK(cuMemcpyHtoD(scale, &three, sizeof three));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent start, stop;
    CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    CK(cuEventRecord(start, s));
    CK(cuMemsetD32Async(dc, 0, n, s));
    CK(cuLaunchKernel(vec_add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, nullptr));
    CK(cuEventRecord(stop, s));
    CK(cuMemcpyDtoHAsync(c.data(), dc, n * sizeof(float), s));
    CK(cuStreamSynchronize(s));
    EXPECT(cuStreamQuery(s), CUDA_SUCCESS);
    float ms = -1;
    CK(cuEventElapsedTime(&ms, start, stop));
    REQUIRE(ms >= 0);
    check_sum(a, b, c, 3.0f);

    // Packed parameters through `extra`, laid out as the kernel's ABI says.
    CUdeviceptr dpairs;
    CK(cuMemAlloc(&dpairs, 32 * sizeof(Pair)));
    struct {
        Pair *out;
        char tag;
        char pad[7];
        Pair p;
        long long k;
    } packed = {(Pair *)dpairs, 5, {}, {10, 0.5}, 100};
    size_t packed_size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &packed_size, CU_LAUNCH_PARAM_END};
    CK(cuLaunchKernel(fill_pair, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, extra));
    Pair pairs[32];
    CK(cuMemcpyDtoH(pairs, dpairs, sizeof pairs));
    for (int i = 0; i < 32; i++) REQUIRE(pairs[i].x == 115 && pairs[i].y == 0.5 * i);

    // 8- and 16-bit memsets.
    CK(cuMemsetD8(dc, 0xab, 3));
    CK(cuMemsetD16(dc + 4, 0x1234, 2));
    unsigned char bytes[8];
    CK(cuMemcpyDtoH(bytes, dc, 8));
    REQUIRE(bytes[0] == 0xab && bytes[2] == 0xab && bytes[4] == 0x34 && bytes[5] == 0x12 &&
            bytes[7] == 0x12);
    EXPECT(cuMemsetD32(dc + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);

    // The same kernels from PTX, which the host's driver compiles.
    CUmodule ptx_mod;
    CK(cuModuleLoadData(&ptx_mod, ptx_image));
    CUfunction ptx_add;
    CK(cuModuleGetFunction(&ptx_add, ptx_mod, "vec_add"));
    CK(cuLaunchKernel(ptx_add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    CK(cuMemcpyDtoH(c.data(), dc, n * sizeof(float)));
    check_sum(a, b, c, 1.0f);
    CK(cuModuleUnload(ptx_mod));
    EXPECT(cuModuleGetFunction(&again, ptx_mod, "vec_add"), CUDA_ERROR_INVALID_HANDLE);

    // A library, launched through its CUkernel.
    CUlibrary lib;
    CK(cuLibraryLoadData(&lib, fatbin_image, nullptr, nullptr, 0, nullptr, nullptr, 0));
    CUkernel kern;
    CK(cuLibraryGetKernel(&kern, lib, "vec_add"));
    CK(cuLaunchKernel((CUfunction)kern, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args,
                      nullptr));
    CK(cuMemcpyDtoH(c.data(), dc, n * sizeof(float)));
    check_sum(a, b, c, 1.0f);
    CK(cuLibraryUnload(lib));

    // Entry points by name and version, and the error for what qcuda does not offer.
    void *fn = nullptr;
    CUdriverProcAddressQueryResult status;
    CK(cuGetProcAddress("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    REQUIRE(fn == (void *)&cuMemAlloc_v2 && status == CU_GET_PROC_ADDRESS_SUCCESS);
    CK(cuGetProcAddress("cuNoSuchFunction", &fn, 13000, 0, &status));
    REQUIRE(fn == nullptr && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    // Interprocess handles: NVIDIA's driver makes one; qcuda (no second guest process can open
    // another's host memory) refuses with CUDA_ERROR_NOT_SUPPORTED, never a fake handle.
    CUipcMemHandle ipc;
    r = cuIpcGetMemHandle(&ipc, da);
    REQUIRE(r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_SUPPORTED);

    CK(cuMemFree(da));
    CK(cuMemFree(db));
    CK(cuMemFree(dc));
    CK(cuMemFree(dpairs));
    CK(cuStreamDestroy(s));
    CK(cuEventDestroy(start));
    CK(cuEventDestroy(stop));
    CK(cuModuleUnload(mod));
    CK(cuCtxDestroy(ctx));
    EXPECT(cuCtxGetId(ctx, &id), CUDA_ERROR_CONTEXT_IS_DESTROYED);

    // The primary context: retained, made current, released.
    CUcontext primary;
    CK(cuDevicePrimaryCtxRetain(&primary, dev));
    CK(cuCtxSetCurrent(primary));
    unsigned flags = 0;
    int active = 0;
    CK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    REQUIRE(active == 1);
    CUdeviceptr p;
    CK(cuMemAlloc(&p, 4096));
    CK(cuMemFree(p));
    CK(cuDevicePrimaryCtxRelease(dev));

    std::printf("PASS " NAME "\n");
    return 0;
}

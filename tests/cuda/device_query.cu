// SPDX-License-Identifier: Apache-2.0 OR MIT
// Lists every device with cudaGetDeviceProperties and checks it against cudaDeviceGetAttribute,
// which is answered by a different path (attribute ids instead of the versioned struct). A
// struct layout mismatch between our runtime and the application shows up here as garbage or
// disagreement. Also checks versions, cudaSetDevice/cudaGetDevice and invalid-device errors.
#define TEST_NAME "device_query"
#include "selfcheck.cuh"

#include <cstring>

struct AttrCheck {
    const char *name;
    cudaDeviceAttr attr;
    long long from_props;
};

static void check_device(int dev)
{
    cudaDeviceProp p;
    std::memset(&p, 0xcc, sizeof(p));
    CHECK(cudaGetDeviceProperties(&p, dev));

    if (strnlen(p.name, sizeof(p.name)) == sizeof(p.name))
        fail("device %d: name is not NUL-terminated", dev);
    if (p.name[0] == '\0')
        fail("device %d: empty name", dev);
    std::printf("device %d: %s\n", dev, p.name);
    std::printf("  compute capability   %d.%d\n", p.major, p.minor);
    std::printf("  global memory        %.1f GiB (%zu bytes)\n", p.totalGlobalMem / 1073741824.0,
                p.totalGlobalMem);
    std::printf("  multiprocessors      %d (max %d threads each)\n", p.multiProcessorCount,
                p.maxThreadsPerMultiProcessor);
    std::printf("  PCI                  %04x:%02x:%02x\n", p.pciDomainID, p.pciBusID,
                p.pciDeviceID);
    std::printf("  L2 cache             %d KiB, bus width %d bits\n", p.l2CacheSize / 1024,
                p.memoryBusWidth);
    std::printf("  shared memory/block  %zu bytes, constant memory %zu bytes\n",
                p.sharedMemPerBlock, p.totalConstMem);
    std::printf("  max block            %d threads, dims %d x %d x %d\n", p.maxThreadsPerBlock,
                p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2]);
    std::printf("  max grid             %d x %d x %d\n", p.maxGridSize[0], p.maxGridSize[1],
                p.maxGridSize[2]);
    std::printf("  uuid                 ");
    for (int i = 0; i < 16; i++)
        std::printf("%02x%s", (unsigned char)p.uuid.bytes[i],
                    i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
    std::printf("\n");

    // Plausibility: values any CUDA 13 device (cc >= 7.5) has.
    if (p.major < 7 || p.major > 20 || p.minor < 0 || p.minor > 9)
        fail("device %d: implausible compute capability %d.%d", dev, p.major, p.minor);
    if (p.totalGlobalMem < ((size_t)1 << 30))
        fail("device %d: implausible global memory %zu", dev, p.totalGlobalMem);
    if (p.warpSize != 32)
        fail("device %d: warpSize %d", dev, p.warpSize);
    if (p.multiProcessorCount <= 0 || p.maxThreadsPerBlock < 512)
        fail("device %d: %d SMs, %d threads per block", dev, p.multiProcessorCount,
             p.maxThreadsPerBlock);

    const AttrCheck checks[] = {
        {"ComputeCapabilityMajor", cudaDevAttrComputeCapabilityMajor, p.major},
        {"ComputeCapabilityMinor", cudaDevAttrComputeCapabilityMinor, p.minor},
        {"MultiProcessorCount", cudaDevAttrMultiProcessorCount, p.multiProcessorCount},
        {"MaxThreadsPerBlock", cudaDevAttrMaxThreadsPerBlock, p.maxThreadsPerBlock},
        {"MaxBlockDimX", cudaDevAttrMaxBlockDimX, p.maxThreadsDim[0]},
        {"MaxBlockDimZ", cudaDevAttrMaxBlockDimZ, p.maxThreadsDim[2]},
        {"MaxGridDimX", cudaDevAttrMaxGridDimX, p.maxGridSize[0]},
        {"MaxGridDimY", cudaDevAttrMaxGridDimY, p.maxGridSize[1]},
        {"WarpSize", cudaDevAttrWarpSize, p.warpSize},
        {"MaxSharedMemoryPerBlock", cudaDevAttrMaxSharedMemoryPerBlock,
         (long long)p.sharedMemPerBlock},
        {"TotalConstantMemory", cudaDevAttrTotalConstantMemory, (long long)p.totalConstMem},
        {"MaxRegistersPerBlock", cudaDevAttrMaxRegistersPerBlock, p.regsPerBlock},
        {"MaxThreadsPerMultiProcessor", cudaDevAttrMaxThreadsPerMultiProcessor,
         p.maxThreadsPerMultiProcessor},
        {"L2CacheSize", cudaDevAttrL2CacheSize, p.l2CacheSize},
        {"GlobalMemoryBusWidth", cudaDevAttrGlobalMemoryBusWidth, p.memoryBusWidth},
        {"PciBusId", cudaDevAttrPciBusId, p.pciBusID},
        {"PciDeviceId", cudaDevAttrPciDeviceId, p.pciDeviceID},
        {"PciDomainId", cudaDevAttrPciDomainId, p.pciDomainID},
        {"ConcurrentKernels", cudaDevAttrConcurrentKernels, p.concurrentKernels},
        {"AsyncEngineCount", cudaDevAttrAsyncEngineCount, p.asyncEngineCount},
        {"UnifiedAddressing", cudaDevAttrUnifiedAddressing, p.unifiedAddressing},
    };
    for (const AttrCheck &c : checks) {
        int v = -12345;
        cudaError_t err = cudaDeviceGetAttribute(&v, c.attr, dev);
        if (err != cudaSuccess)
            fail("device %d: cudaDeviceGetAttribute(%s) returned %s", dev, c.name,
                 cudaGetErrorName(err));
        if ((long long)v != c.from_props)
            fail("device %d: attribute %s = %d but cudaDeviceProp says %lld", dev, c.name, v,
                 c.from_props);
    }
    std::printf("  %zu attributes agree with cudaDeviceProp\n", sizeof(checks) / sizeof(checks[0]));
}

int main()
{
    int count = require_device();
    std::printf("%d CUDA device(s)\n", count);

    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    std::printf("driver API %d.%d, runtime %d.%d\n", driver / 1000, driver % 1000 / 10,
                runtime / 1000, runtime % 1000 / 10);
    if (runtime / 1000 != 13)
        fail("runtime version %d is not CUDA 13", runtime);
    if (driver < runtime)
        fail("driver version %d is older than runtime %d but devices were reported", driver,
             runtime);

    for (int dev = 0; dev < count; dev++) {
        check_device(dev);
        CHECK(cudaSetDevice(dev));
        int cur = -1;
        CHECK(cudaGetDevice(&cur));
        if (cur != dev)
            fail("cudaGetDevice returned %d after cudaSetDevice(%d)", cur, dev);
    }
    CHECK(cudaSetDevice(0));

    // One past the last device is invalid everywhere, and the error is not sticky.
    cudaDeviceProp p;
    EXPECT_ERR(cudaGetDeviceProperties(&p, count), cudaErrorInvalidDevice);
    int v = 0;
    EXPECT_ERR(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, count), cudaErrorInvalidDevice);
    EXPECT_ERR(cudaSetDevice(count), cudaErrorInvalidDevice);
    EXPECT_ERR(cudaGetLastError(), cudaErrorInvalidDevice);
    EXPECT_ERR(cudaGetLastError(), cudaSuccess);
    int cur = -1;
    CHECK(cudaGetDevice(&cur));
    if (cur != 0)
        fail("a failed cudaSetDevice(%d) changed the current device to %d", count, cur);
    return pass();
}

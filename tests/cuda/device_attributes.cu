// SPDX-License-Identifier: Apache-2.0 OR MIT
// Every device attribute and the cudaDeviceProp fields: the two views agree with each other, and
// each value is printed as "ATTR <id> <value>" (or "ATTR <id> error <code>") so that
// run-gpu-tests.sh can compare the guest's values with the native ones, line by line: they must
// be equal except for the attributes qcuda deliberately reports differently
// (guest-lib/src/device_prop.rs, docs/guest-lib.md "Device properties").
#define TEST_NAME "device_attributes"
#include "selfcheck.cuh"

#include <cstring>

int main()
{
    require_device();
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    for (int dev = 0; dev < count; dev++) {
        for (int id = 1; id < (int)cudaDevAttrMax; id++) {
            int v = 0;
            cudaError_t e = cudaDeviceGetAttribute(&v, (cudaDeviceAttr)id, dev);
            if (e == cudaSuccess)
                std::printf("ATTR %d %d %d\n", dev, id, v);
            else
                std::printf("ATTR %d %d error %d\n", dev, id, (int)e);
        }
        cudaGetLastError();
        int v = 0;
        EXPECT_ERR(cudaDeviceGetAttribute(&v, (cudaDeviceAttr)100000, dev), cudaErrorInvalidValue);

        cudaDeviceProp p;
        std::memset(&p, 0, sizeof p);
        CHECK(cudaGetDeviceProperties(&p, dev));
        // The two views of the same facts agree.
        struct {
            const char *name;
            int prop;
            cudaDeviceAttr attr;
        } pairs[] = {
            {"multiProcessorCount", p.multiProcessorCount, cudaDevAttrMultiProcessorCount},
            {"maxThreadsPerBlock", p.maxThreadsPerBlock, cudaDevAttrMaxThreadsPerBlock},
            {"warpSize", p.warpSize, cudaDevAttrWarpSize},
            {"major", p.major, cudaDevAttrComputeCapabilityMajor},
            {"minor", p.minor, cudaDevAttrComputeCapabilityMinor},
            {"sharedMemPerBlockOptin", (int)p.sharedMemPerBlockOptin,
             cudaDevAttrMaxSharedMemoryPerBlockOptin},
            {"l2CacheSize", p.l2CacheSize, cudaDevAttrL2CacheSize},
            {"canMapHostMemory", p.canMapHostMemory, cudaDevAttrCanMapHostMemory},
            {"managedMemory", p.managedMemory, cudaDevAttrManagedMemory},
            {"concurrentManagedAccess", p.concurrentManagedAccess,
             cudaDevAttrConcurrentManagedAccess},
            {"cooperativeLaunch", p.cooperativeLaunch, cudaDevAttrCooperativeLaunch},
            {"pageableMemoryAccess", p.pageableMemoryAccess, cudaDevAttrPageableMemoryAccess},
            {"memoryPoolsSupported", p.memoryPoolsSupported, cudaDevAttrMemoryPoolsSupported},
            {"pciBusID", p.pciBusID, cudaDevAttrPciBusId},
            {"asyncEngineCount", p.asyncEngineCount, cudaDevAttrAsyncEngineCount},
            {"unifiedAddressing", p.unifiedAddressing, cudaDevAttrUnifiedAddressing},
            {"maxBlocksPerMultiProcessor", p.maxBlocksPerMultiProcessor,
             cudaDevAttrMaxBlocksPerMultiprocessor},
        };
        for (auto &pr : pairs) {
            int a = -1;
            CHECK(cudaDeviceGetAttribute(&a, pr.attr, dev));
            if (a != pr.prop)
                fail("device %d: cudaDeviceProp.%s = %d but the attribute reads %d", dev, pr.name,
                     pr.prop, a);
        }
        size_t free_b = 0, total_b = 0;
        CHECK(cudaSetDevice(dev));
        CHECK(cudaMemGetInfo(&free_b, &total_b));
        if (total_b != p.totalGlobalMem)
            fail("device %d: totalGlobalMem %zu but cudaMemGetInfo says %zu", dev,
                 p.totalGlobalMem, total_b);
        std::printf("PROP %d name %s\n", dev, p.name);
        std::printf("PROP %d totalGlobalMem %zu\n", dev, p.totalGlobalMem);
        std::printf("PROP %d sharedMemPerBlock %zu\n", dev, p.sharedMemPerBlock);
        std::printf("PROP %d totalConstMem %zu\n", dev, p.totalConstMem);
        std::printf("PROP %d memPitch %zu\n", dev, p.memPitch);
        std::printf("PROP %d textureAlignment %zu\n", dev, p.textureAlignment);
        std::printf("PROP %d surfaceAlignment %zu\n", dev, p.surfaceAlignment);
        std::printf("PROP %d maxGridSize %d %d %d\n", dev, p.maxGridSize[0], p.maxGridSize[1],
                    p.maxGridSize[2]);
        std::printf("PROP %d maxTexture2D %d %d\n", dev, p.maxTexture2D[0], p.maxTexture2D[1]);
        std::printf("PROP %d maxSurface3D %d %d %d\n", dev, p.maxSurface3D[0], p.maxSurface3D[1],
                    p.maxSurface3D[2]);
        std::printf("PROP %d uuid", dev);
        for (int i = 0; i < 16; i++)
            std::printf(" %02x", (unsigned char)p.uuid.bytes[i]);
        std::printf("\n");
    }
    return pass();
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// Virtual memory management through the driver API (entry points taken with
// cudaGetDriverEntryPointByVersion, as libraries do): the device announces it
// (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), cuMemGetAllocationGranularity,
// cuMemCreate of two granules, cuMemAddressReserve of four, cuMemMap of each granule at
// separate places, cuMemSetAccess, a kernel writing across the two mappings and copies reading
// back through both faces; cuMemGetAccess, cuMemGetAddressRange and cuPointerGetAttribute on the
// mapped range; cuMemRetainAllocationHandle and cuMemGetAllocationPropertiesFromHandle; the same
// allocation mapped twice reads the same bytes; refusals (a misaligned size, a map outside any
// reservation, freeing a reservation that is still mapped); everything unmapped, freed and
// released. Where the GPU offers generic compression, a compressible allocation is made and
// used too.
#define TEST_NAME "vmm"
#include "selfcheck.cuh"

#include <cuda.h>
#include <vector>

__global__ void fill(unsigned *p, size_t n, unsigned base)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = base + (unsigned)i;
}

#define DRIVER_FN(name) static decltype(&::name) p_##name
DRIVER_FN(cuDeviceGetAttribute);
DRIVER_FN(cuMemGetAllocationGranularity);
DRIVER_FN(cuMemCreate);
DRIVER_FN(cuMemRelease);
DRIVER_FN(cuMemAddressReserve);
DRIVER_FN(cuMemAddressFree);
DRIVER_FN(cuMemMap);
DRIVER_FN(cuMemUnmap);
DRIVER_FN(cuMemSetAccess);
DRIVER_FN(cuMemGetAccess);
DRIVER_FN(cuMemRetainAllocationHandle);
DRIVER_FN(cuMemGetAllocationPropertiesFromHandle);
DRIVER_FN(cuMemGetAddressRange);
DRIVER_FN(cuPointerGetAttribute);

template <typename F> static void load(F &fn, const char *name)
{
    cudaDriverEntryPointQueryResult q;
    void *p = nullptr;
    CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !p)
        fail("no driver entry point %s", name);
    fn = reinterpret_cast<F>(p);
}

#define CU(call)                                                                                 \
    do {                                                                                         \
        CUresult cu_err_ = (call);                                                               \
        if (cu_err_ != CUDA_SUCCESS)                                                             \
            fail("%s returned CUresult %d at %s:%d", #call, (int)cu_err_, __FILE__, __LINE__);   \
    } while (0)

#define CU_EXPECT(call, want)                                                                    \
    do {                                                                                         \
        CUresult cu_got_ = (call);                                                               \
        if (cu_got_ != (want))                                                                   \
            fail("%s returned CUresult %d, expected %d at %s:%d", #call, (int)cu_got_, (int)(want), \
                 __FILE__, __LINE__);                                                            \
    } while (0)

static void check_words(CUdeviceptr p, size_t n, unsigned base, const char *what)
{
    std::vector<unsigned> h(n);
    CHECK(cudaMemcpy(h.data(), (void *)p, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        if (h[i] != base + (unsigned)i)
            fail("%s: word %zu is %u, expected %u", what, i, h[i], base + (unsigned)i);
}

// Creates, maps, uses and releases one allocation of `granules` granules with `prop`.
static void use_allocation(const CUmemAllocationProp &prop, size_t g, const char *what)
{
    CUmemGenericAllocationHandle h;
    CU(p_cuMemCreate(&h, 2 * g, &prop, 0));
    CUdeviceptr va;
    CU(p_cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
    // Granule 0 at va + g, granule 1 at va + 2g: contiguous in the reservation.
    CU(p_cuMemMap(va + g, g, 0, h, 0));
    CU(p_cuMemMap(va + 2 * g, g, g, h, 0));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(p_cuMemSetAccess(va + g, 2 * g, &access, 1));
    unsigned long long flags = 0;
    CU(p_cuMemGetAccess(&flags, &prop.location, va + g + 4096));
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        fail("%s: cuMemGetAccess says %llu", what, flags);

    size_t words = 2 * g / sizeof(unsigned);
    fill<<<256, 256>>>((unsigned *)(va + g), words, 7);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    check_words(va + g, words, 7, what);

    CUdeviceptr base = 0;
    size_t size = 0;
    CU(p_cuMemGetAddressRange(&base, &size, va + g + 100));
    if (base < va + g || base + size > va + 3 * g || size == 0)
        fail("%s: cuMemGetAddressRange gave [%llx, +%zu) for a mapping at %llx", what,
             (unsigned long long)base, size, (unsigned long long)(va + g));
    unsigned mem_type = 0;
    CU(p_cuPointerGetAttribute(&mem_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + g + 8));
    if (mem_type != CU_MEMORYTYPE_DEVICE)
        fail("%s: memory type %u", what, mem_type);

    CUmemGenericAllocationHandle again;
    CU(p_cuMemRetainAllocationHandle(&again, (void *)(va + 2 * g + 64)));
    CUmemAllocationProp got = {};
    CU(p_cuMemGetAllocationPropertiesFromHandle(&got, again));
    // The driver may grant less compression than asked for; type and place must match.
    if (got.type != CU_MEM_ALLOCATION_TYPE_PINNED || got.location.id != prop.location.id)
        fail("%s: properties from the handle differ (type %d, device %d)", what, (int)got.type,
             got.location.id);
    std::printf("%s: compression asked %d, granted %d\n", what,
                (int)prop.allocFlags.compressionType, (int)got.allocFlags.compressionType);
    // The retained handle maps the same bytes elsewhere.
    CUdeviceptr va2;
    CU(p_cuMemAddressReserve(&va2, g, 0, 0, 0));
    CU(p_cuMemMap(va2, g, g, again, 0));
    CU(p_cuMemSetAccess(va2, g, &access, 1));
    check_words(va2, g / sizeof(unsigned), 7 + (unsigned)(g / sizeof(unsigned)), what);
    CU(p_cuMemUnmap(va2, g));
    CU(p_cuMemAddressFree(va2, g));
    CU(p_cuMemRelease(again));

    // Still mapped: the reservation cannot go yet.
    if (p_cuMemAddressFree(va, 4 * g) == CUDA_SUCCESS)
        fail("%s: a mapped reservation was freed", what);
    CU(p_cuMemRelease(h)); // the mappings keep the memory
    check_words(va + g, 16, 7, what);
    CU(p_cuMemUnmap(va + g, 2 * g));
    CU(p_cuMemAddressFree(va, 4 * g));
}

int main()
{
    require_device();
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));
    load(p_cuDeviceGetAttribute, "cuDeviceGetAttribute");
    load(p_cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    load(p_cuMemCreate, "cuMemCreate");
    load(p_cuMemRelease, "cuMemRelease");
    load(p_cuMemAddressReserve, "cuMemAddressReserve");
    load(p_cuMemAddressFree, "cuMemAddressFree");
    load(p_cuMemMap, "cuMemMap");
    load(p_cuMemUnmap, "cuMemUnmap");
    load(p_cuMemSetAccess, "cuMemSetAccess");
    load(p_cuMemGetAccess, "cuMemGetAccess");
    load(p_cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle");
    load(p_cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle");
    load(p_cuMemGetAddressRange, "cuMemGetAddressRange");
    load(p_cuPointerGetAttribute, "cuPointerGetAttribute");

    int vmm = 0, compression = 0;
    CU(p_cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    if (!vmm)
        fail("the device does not announce virtual memory management");
    CU(p_cuDeviceGetAttribute(&compression, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0));

    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0, rec = 0;
    CU(p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CU(p_cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    if (g == 0 || rec < g || rec % g)
        fail("granularity %zu, recommended %zu", g, rec);
    std::printf("granularity %zu bytes (recommended %zu), generic compression %d\n", g, rec,
                compression);

    // What the driver refuses.
    CUmemGenericAllocationHandle h;
    CU_EXPECT(p_cuMemCreate(&h, g + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU(p_cuMemCreate(&h, g, &prop, 0));
    CU_EXPECT(p_cuMemMap(0x1000, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CU(p_cuMemRelease(h));

    use_allocation(prop, g, "plain");
    if (compression) {
        CUmemAllocationProp cprop = prop;
        cprop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
        size_t cg = 0;
        CU(p_cuMemGetAllocationGranularity(&cg, &cprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        use_allocation(cprop, cg, "compressible");
    } else {
        std::printf("no generic compression on this GPU: compressible allocations not tried\n");
    }
    return pass();
}

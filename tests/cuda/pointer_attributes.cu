// SPDX-License-Identifier: Apache-2.0 OR MIT
// Pointer attributes of every kind of pointer, through the runtime (cudaPointerGetAttributes)
// and the driver (cuPointerGetAttribute and cuPointerGetAttributes of every
// CU_POINTER_ATTRIBUTE_* of CUDA 13.0, entry points taken with cudaGetDriverEntryPointByVersion
// as libraries do): device memory (cudaMalloc, cuMemAlloc, pitched, an interior pointer, one
// past the end), pinned memory (cudaMallocHost, cudaHostAlloc mapped and portable and
// write-combined, cuMemHostAlloc), registered memory (an interior pointer), managed memory,
// stream-ordered memory (the current pool and a created one), a graph's allocation, VMM
// (mapped, and reserved but unmapped), another device's memory where there are two, and memory
// CUDA never saw: malloc, the stack, a global, NULL. (IPC-imported memory: ipc_events.)
//
// Only what CUDA 13.0's headers and guides document is checked (cudaPointerGetAttributes
// succeeds with cudaMemoryTypeUnregistered for pageable memory; cuPointerGetAttributes succeeds
// for any pointer; the memory types, pointers, contexts, ordinals, ranges and pools the
// documentation names). Every answer is printed as
//     ATTR <kind> <query> <attribute> <value>
// with addresses relative to the pointer asked about (=ptr, ptr+N, base, NULL, other) and
// contexts named (primary0, primary1, NULL, other), so that a native run and a guest run can
// be compared line by line (scripts/run-gpu-tests.sh --only pointer_attributes, both logs).
#define TEST_NAME "pointer_attributes"
#include "selfcheck.cuh"

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#define DRIVER_FN(name) static decltype(&::name) p_##name
DRIVER_FN(cuPointerGetAttribute);
DRIVER_FN(cuPointerGetAttributes);
DRIVER_FN(cuDevicePrimaryCtxRetain);
DRIVER_FN(cuDevicePrimaryCtxRelease);
DRIVER_FN(cuDeviceGetAttribute);
DRIVER_FN(cuMemAlloc);
DRIVER_FN(cuMemFree);
DRIVER_FN(cuMemHostAlloc);
DRIVER_FN(cuMemFreeHost);
DRIVER_FN(cuMemGetAllocationGranularity);
DRIVER_FN(cuMemCreate);
DRIVER_FN(cuMemRelease);
DRIVER_FN(cuMemAddressReserve);
DRIVER_FN(cuMemAddressFree);
DRIVER_FN(cuMemMap);
DRIVER_FN(cuMemUnmap);
DRIVER_FN(cuMemSetAccess);

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

static const char *const ATTR_NAMES[] = {
    "",
    "CONTEXT",
    "MEMORY_TYPE",
    "DEVICE_POINTER",
    "HOST_POINTER",
    "P2P_TOKENS",
    "SYNC_MEMOPS",
    "BUFFER_ID",
    "IS_MANAGED",
    "DEVICE_ORDINAL",
    "IS_LEGACY_CUDA_IPC_CAPABLE",
    "RANGE_START_ADDR",
    "RANGE_SIZE",
    "MAPPED",
    "ALLOWED_HANDLE_TYPES",
    "IS_GPU_DIRECT_RDMA_CAPABLE",
    "ACCESS_FLAGS",
    "MEMPOOL_HANDLE",
    "MAPPING_SIZE",
    "MAPPING_BASE_ADDR",
    "MEMORY_BLOCK_ID",
    "IS_HW_DECOMPRESS_CAPABLE",
};
static const int LAST_ATTR = CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE;

// The attributes cuPointerGetAttributes documents (cuda.h, CUDA 13.0); the others are asked of
// it one at a time and printed only.
static bool plural_documented(int a)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        return false;
    default:
        return true;
    }
}

static CUcontext g_primary[2];
static int g_devices;

// What one pointer is expected to be, where CUDA documents it.
struct Want {
    cudaMemoryType type;
    int device;               // -1: not checked
    const void *dev_ptr;      // runtime devicePointer (checked if dev_ptr_known)
    bool dev_ptr_known;
    const void *host_ptr;     // runtime hostPointer (checked if host_ptr_known)
    bool host_ptr_known;
    CUcontext ctx;            // CONTEXT (checked if ctx_known)
    bool ctx_known;
    uintptr_t range_start;    // RANGE_START_ADDR (0: not checked)
    size_t range_size_min;    // RANGE_SIZE at least this (0: not checked)
    size_t range_size;        // RANGE_SIZE exactly (0: not checked)
    int legacy_ipc;           // IS_LEGACY_CUDA_IPC_CAPABLE (-1: not checked)
    unsigned long long handle_types; // ALLOWED_HANDLE_TYPES bits that must be set
    void *pool;               // MEMPOOL_HANDLE (checked if pool_known)
    bool pool_known;
    unsigned access;          // ACCESS_FLAGS (0: not checked)
    bool no_single_dev_ptr;   // DEVICE_POINTER not checked (another device's memory)
    bool print_only;          // nothing checked (NULL)
};

static Want want_of(cudaMemoryType t)
{
    Want w = {};
    w.type = t;
    w.device = -1;
    w.legacy_ipc = -1;
    return w;
}

// An address relative to the pointer asked about and its allocation's start.
static std::string rel(uintptr_t v, uintptr_t ptr, uintptr_t base)
{
    char b[64];
    if (v == 0)
        return "NULL";
    if (v == ptr)
        return "=ptr";
    if (base && v == base)
        return "base";
    if (v > ptr && v - ptr < (1u << 30)) {
        std::snprintf(b, sizeof(b), "ptr+%#llx", (unsigned long long)(v - ptr));
        return b;
    }
    if (v < ptr && ptr - v < (1u << 30)) {
        std::snprintf(b, sizeof(b), "ptr-%#llx", (unsigned long long)(ptr - v));
        return b;
    }
    return "other";
}

static std::string ctx_name(CUcontext c)
{
    if (!c)
        return "NULL";
    for (int d = 0; d < g_devices && d < 2; d++)
        if (c == g_primary[d])
            return "primary" + std::to_string(d);
    return "other";
}

// The value of attribute `a` in `slot` (16 bytes), printed for comparison.
static std::string show(int a, const unsigned long long *slot, uintptr_t ptr, uintptr_t base)
{
    char b[64];
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        return ctx_name((CUcontext)(uintptr_t)slot[0]);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        return rel((uintptr_t)slot[0], ptr, base);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        return slot[0] ? "nonzero" : "0";
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        return slot[0] ? "a pool" : "NULL";
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
        return slot[0] || slot[1] ? "tokens" : "zero";
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        std::snprintf(b, sizeof(b), "%#llx", slot[0]);
        return b;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        std::snprintf(b, sizeof(b), "%d", (int)(unsigned)slot[0]);
        return b;
    default:
        std::snprintf(b, sizeof(b), "%u", (unsigned)slot[0]);
        return b;
    }
}

static int g_checked;

#define EXPECT(cond, ...)                                                                        \
    do {                                                                                         \
        g_checked++;                                                                             \
        if (!(cond))                                                                             \
            fail(__VA_ARGS__);                                                                   \
    } while (0)

// Queries everything of `p` (inside the allocation starting at `base`, 0 if none) and checks
// what `w` says.
static void check(const char *kind, const void *p, uintptr_t base, const Want &w)
{
    uintptr_t ptr = (uintptr_t)p;
    cudaPointerAttributes ra;
    std::memset(&ra, 0x5a, sizeof(ra));
    cudaError_t re = cudaPointerGetAttributes(&ra, p);
    std::printf("ATTR %s runtime result %d\n", kind, (int)re);
    if (w.print_only && re != cudaSuccess) {
        cudaGetLastError();
        std::memset(&ra, 0, sizeof(ra));
    }
    if (!w.print_only)
        EXPECT(re == cudaSuccess, "%s: cudaPointerGetAttributes returned %s", kind, cudaGetErrorName(re));
    std::printf("ATTR %s runtime type %d\n", kind, (int)ra.type);
    std::printf("ATTR %s runtime device %d\n", kind, ra.device);
    std::printf("ATTR %s runtime devicePointer %s\n", kind, rel((uintptr_t)ra.devicePointer, ptr, base).c_str());
    std::printf("ATTR %s runtime hostPointer %s\n", kind, rel((uintptr_t)ra.hostPointer, ptr, base).c_str());
    // All the documented attributes at once, printed before anything is checked.
    std::vector<CUpointer_attribute> attrs;
    for (int a = 1; a <= LAST_ATTR; a++)
        if (plural_documented(a))
            attrs.push_back((CUpointer_attribute)a);
    std::vector<unsigned long long> slots(2 * attrs.size(), 0);
    std::vector<void *> data(attrs.size());
    for (size_t i = 0; i < attrs.size(); i++)
        data[i] = &slots[2 * i];
    CUresult pe = p_cuPointerGetAttributes((unsigned)attrs.size(), attrs.data(), data.data(), (CUdeviceptr)ptr);
    std::printf("ATTR %s plural result %d\n", kind, (int)pe);
    for (size_t i = 0; i < attrs.size(); i++)
        std::printf("ATTR %s plural %s %s\n", kind, ATTR_NAMES[attrs[i]], show(attrs[i], &slots[2 * i], ptr, base).c_str());
    // The others, one at a time through the same call (P2P tokens aside: they are for the host
    // kernel's nv-p2p interface).
    for (int a = 1; a <= LAST_ATTR; a++) {
        if (plural_documented(a) || a == CU_POINTER_ATTRIBUTE_P2P_TOKENS)
            continue;
        unsigned long long slot[2] = {0, 0};
        void *one = slot;
        CUpointer_attribute attr = (CUpointer_attribute)a;
        CUresult r = p_cuPointerGetAttributes(1, &attr, &one, (CUdeviceptr)ptr);
        if (r == CUDA_SUCCESS)
            std::printf("ATTR %s plural1 %s %s\n", kind, ATTR_NAMES[a], show(a, slot, ptr, base).c_str());
        else
            std::printf("ATTR %s plural1 %s error %d\n", kind, ATTR_NAMES[a], (int)r);
    }
    // One at a time.
    unsigned long long single[LAST_ATTR + 1][2];
    CUresult serr[LAST_ATTR + 1];
    for (int a = 1; a <= LAST_ATTR; a++) {
        single[a][0] = single[a][1] = 0;
        serr[a] = p_cuPointerGetAttribute(single[a], (CUpointer_attribute)a, (CUdeviceptr)ptr);
        if (serr[a] == CUDA_SUCCESS)
            std::printf("ATTR %s single %s %s\n", kind, ATTR_NAMES[a], show(a, single[a], ptr, base).c_str());
        else
            std::printf("ATTR %s single %s error %d\n", kind, ATTR_NAMES[a], (int)serr[a]);
    }
    std::fflush(stdout);
    if (w.print_only)
        return;
    EXPECT(ra.type == w.type, "%s: cudaPointerGetAttributes type %d, expected %d", kind, (int)ra.type, (int)w.type);
    if (w.device >= 0)
        EXPECT(ra.device == w.device, "%s: device %d, expected %d", kind, ra.device, w.device);
    if (w.dev_ptr_known)
        EXPECT(ra.devicePointer == w.dev_ptr, "%s: devicePointer %p, expected %p", kind, ra.devicePointer, w.dev_ptr);
    if (w.host_ptr_known)
        EXPECT(ra.hostPointer == w.host_ptr, "%s: hostPointer %p, expected %p", kind, ra.hostPointer, w.host_ptr);

    // Documented: no error for a pointer that is not a valid CUDA pointer.
    EXPECT(pe == CUDA_SUCCESS, "%s: cuPointerGetAttributes returned %d", kind, (int)pe);
    for (size_t i = 0; i < attrs.size(); i++) {
        int a = attrs[i];
        // Where the single query answers, the plural one answers the same; not SYNC_MEMOPS,
        // whose plural answer the driver gives as 0 where the single one says 1 (driver 580,
        // device memory), nor BUFFER_ID.
        if (serr[a] == CUDA_SUCCESS && a != CU_POINTER_ATTRIBUTE_BUFFER_ID &&
            a != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
            EXPECT(std::memcmp(&slots[2 * i], single[a], 8) == 0,
                   "%s: cuPointerGetAttributes %s %s, cuPointerGetAttribute %s", kind, ATTR_NAMES[a],
                   show(a, &slots[2 * i], ptr, base).c_str(), show(a, single[a], ptr, base).c_str());
    }

    // What the driver documents.
    auto ok = [&](int a) {
        EXPECT(serr[a] == CUDA_SUCCESS, "%s: cuPointerGetAttribute(%s) returned %d", kind, ATTR_NAMES[a], (int)serr[a]);
        return single[a][0];
    };
    switch (w.type) {
    case cudaMemoryTypeUnregistered:
        EXPECT(serr[CU_POINTER_ATTRIBUTE_MEMORY_TYPE] == CUDA_ERROR_INVALID_VALUE,
               "%s: cuPointerGetAttribute(MEMORY_TYPE) of memory CUDA does not know returned %d", kind,
               (int)serr[CU_POINTER_ATTRIBUTE_MEMORY_TYPE]);
        EXPECT(serr[CU_POINTER_ATTRIBUTE_CONTEXT] == CUDA_ERROR_INVALID_VALUE,
               "%s: cuPointerGetAttribute(CONTEXT) returned %d", kind, (int)serr[CU_POINTER_ATTRIBUTE_CONTEXT]);
        EXPECT(serr[CU_POINTER_ATTRIBUTE_IS_MANAGED] == CUDA_ERROR_INVALID_VALUE,
               "%s: cuPointerGetAttribute(IS_MANAGED) returned %d", kind, (int)serr[CU_POINTER_ATTRIBUTE_IS_MANAGED]);
        break;
    case cudaMemoryTypeHost:
        EXPECT(ok(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) == CU_MEMORYTYPE_HOST, "%s: memory type", kind);
        EXPECT(ok(CU_POINTER_ATTRIBUTE_HOST_POINTER) == ptr, "%s: host pointer", kind);
        EXPECT(ok(CU_POINTER_ATTRIBUTE_IS_MANAGED) == 0, "%s: managed", kind);
        break;
    case cudaMemoryTypeDevice:
        EXPECT(ok(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) == CU_MEMORYTYPE_DEVICE, "%s: memory type", kind);
        if (!w.no_single_dev_ptr)
            EXPECT(ok(CU_POINTER_ATTRIBUTE_DEVICE_POINTER) == ptr, "%s: device pointer", kind);
        EXPECT(serr[CU_POINTER_ATTRIBUTE_HOST_POINTER] == CUDA_ERROR_INVALID_VALUE,
               "%s: cuPointerGetAttribute(HOST_POINTER) of device memory returned %d", kind,
               (int)serr[CU_POINTER_ATTRIBUTE_HOST_POINTER]);
        EXPECT(ok(CU_POINTER_ATTRIBUTE_IS_MANAGED) == 0, "%s: managed", kind);
        break;
    case cudaMemoryTypeManaged:
        EXPECT(ok(CU_POINTER_ATTRIBUTE_IS_MANAGED) == 1, "%s: managed", kind);
        EXPECT(ok(CU_POINTER_ATTRIBUTE_DEVICE_POINTER) == ptr, "%s: device pointer", kind);
        EXPECT(ok(CU_POINTER_ATTRIBUTE_HOST_POINTER) == ptr, "%s: host pointer", kind);
        break;
    }
    if (w.type != cudaMemoryTypeUnregistered && w.device >= 0)
        EXPECT((int)ok(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) == w.device, "%s: device ordinal", kind);
    if (w.type == cudaMemoryTypeDevice) {
        // Memory of an allocation API, mapped (documented for these two).
        EXPECT(ok(CU_POINTER_ATTRIBUTE_MAPPED) == 1, "%s: mapped", kind);
        ok(CU_POINTER_ATTRIBUTE_BUFFER_ID);
    }
    if (w.ctx_known)
        EXPECT((CUcontext)(uintptr_t)ok(CU_POINTER_ATTRIBUTE_CONTEXT) == w.ctx, "%s: context %s, expected %s", kind,
               ctx_name((CUcontext)(uintptr_t)single[CU_POINTER_ATTRIBUTE_CONTEXT][0]).c_str(), ctx_name(w.ctx).c_str());
    if (w.range_start)
        EXPECT(ok(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) == w.range_start, "%s: range start", kind);
    if (w.range_size_min)
        EXPECT(ok(CU_POINTER_ATTRIBUTE_RANGE_SIZE) >= w.range_size_min, "%s: range size %llu", kind,
               single[CU_POINTER_ATTRIBUTE_RANGE_SIZE][0]);
    if (w.range_size)
        EXPECT(ok(CU_POINTER_ATTRIBUTE_RANGE_SIZE) == w.range_size, "%s: range size %llu, expected %zu", kind,
               single[CU_POINTER_ATTRIBUTE_RANGE_SIZE][0], w.range_size);
    if (w.legacy_ipc >= 0)
        EXPECT((int)ok(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) == w.legacy_ipc, "%s: legacy IPC", kind);
    if (w.handle_types)
        EXPECT((ok(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES) & w.handle_types) == w.handle_types,
               "%s: allowed handle types %#llx", kind, single[CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES][0]);
    if (w.pool_known)
        EXPECT((void *)(uintptr_t)ok(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) == w.pool, "%s: pool", kind);
    if (w.access)
        EXPECT(ok(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS) == w.access, "%s: access flags", kind);
}

static unsigned long long buffer_id(const void *p)
{
    unsigned long long id = 0;
    CU(p_cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)p));
    return id;
}

static int g_global;

int main()
{
    g_devices = require_device();
    load(p_cuPointerGetAttribute, "cuPointerGetAttribute");
    load(p_cuPointerGetAttributes, "cuPointerGetAttributes");
    load(p_cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    load(p_cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
    load(p_cuDeviceGetAttribute, "cuDeviceGetAttribute");
    load(p_cuMemAlloc, "cuMemAlloc");
    load(p_cuMemFree, "cuMemFree");
    load(p_cuMemHostAlloc, "cuMemHostAlloc");
    load(p_cuMemFreeHost, "cuMemFreeHost");
    load(p_cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    load(p_cuMemCreate, "cuMemCreate");
    load(p_cuMemRelease, "cuMemRelease");
    load(p_cuMemAddressReserve, "cuMemAddressReserve");
    load(p_cuMemAddressFree, "cuMemAddressFree");
    load(p_cuMemMap, "cuMemMap");
    load(p_cuMemUnmap, "cuMemUnmap");
    load(p_cuMemSetAccess, "cuMemSetAccess");
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));
    for (int d = 0; d < g_devices && d < 2; d++)
        CU(p_cuDevicePrimaryCtxRetain(&g_primary[d], d));
    int pageable = 0;
    CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0));
    std::printf("devices %d, pageableMemoryAccess %d\n", g_devices, pageable);

    // Device memory.
    const size_t N = 1000;
    char *d = nullptr;
    CHECK(cudaMalloc(&d, N));
    Want w = want_of(cudaMemoryTypeDevice);
    w.device = 0;
    w.dev_ptr = d;
    w.dev_ptr_known = true;
    w.host_ptr = nullptr;
    w.host_ptr_known = true;
    w.ctx = g_primary[0];
    w.ctx_known = true;
    w.range_start = (uintptr_t)d;
    w.range_size_min = N;
    w.legacy_ipc = 1;
    check("cudaMalloc", d, (uintptr_t)d, w);
    w.dev_ptr = d + N - 1;
    check("cudaMalloc+interior", d + N - 1, (uintptr_t)d, w);
    // One past the end: printed, nothing assumed (the allocation may be rounded up, or
    // another may start there).
    w = want_of(cudaMemoryTypeUnregistered);
    w.print_only = true;
    check("cudaMalloc+end", d + N, (uintptr_t)d, w);
    CUdeviceptr cd = 0;
    CU(p_cuMemAlloc(&cd, 512));
    w = want_of(cudaMemoryTypeDevice);
    w.device = 0;
    w.dev_ptr = (void *)(cd + 8);
    w.dev_ptr_known = true;
    w.ctx = g_primary[0];
    w.ctx_known = true;
    w.range_start = cd;
    w.range_size_min = 512;
    w.legacy_ipc = 1;
    check("cuMemAlloc", (void *)(cd + 8), cd, w);
    EXPECT(buffer_id(d) != buffer_id((void *)cd), "two allocations share a buffer id");
    void *pitched = nullptr;
    size_t pitch = 0;
    CHECK(cudaMallocPitch(&pitched, &pitch, 100, 4));
    w = want_of(cudaMemoryTypeDevice);
    w.device = 0;
    w.dev_ptr = pitched;
    w.dev_ptr_known = true;
    w.ctx = g_primary[0];
    w.ctx_known = true;
    w.range_start = (uintptr_t)pitched;
    w.range_size_min = pitch * 4;
    check("cudaMallocPitch", pitched, (uintptr_t)pitched, w);

    // Pinned memory: the same address for host and device under unified addressing.
    struct { const char *kind; unsigned flags; } pinned[] = {
        {"cudaMallocHost", ~0u},
        {"cudaHostAlloc(Mapped|Portable)", cudaHostAllocMapped | cudaHostAllocPortable},
        {"cudaHostAlloc(WriteCombined)", cudaHostAllocWriteCombined},
    };
    for (auto &k : pinned) {
        void *h = nullptr;
        if (k.flags == ~0u)
            CHECK(cudaMallocHost(&h, 4096));
        else
            CHECK(cudaHostAlloc(&h, 4096, k.flags));
        w = want_of(cudaMemoryTypeHost);
        w.host_ptr = h;
        w.host_ptr_known = true;
        w.ctx = g_primary[0];
        w.ctx_known = true;
        if (k.flags != cudaHostAllocWriteCombined) {
            w.dev_ptr = h;
            w.dev_ptr_known = true;
        }
        check(k.kind, h, (uintptr_t)h, w);
        CHECK(cudaFreeHost(h));
    }
    void *ch = nullptr;
    CU(p_cuMemHostAlloc(&ch, 8192, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    w = want_of(cudaMemoryTypeHost);
    w.host_ptr = (char *)ch + 4096;
    w.host_ptr_known = true;
    w.dev_ptr = (char *)ch + 4096;
    w.dev_ptr_known = true;
    w.ctx = g_primary[0];
    w.ctx_known = true;
    check("cuMemHostAlloc", (char *)ch + 4096, (uintptr_t)ch, w);
    CU(p_cuMemFreeHost(ch));

    // Registered memory, asked about an interior pointer: kernels reach it at the address
    // cudaHostGetDevicePointer names.
    const size_t R = 1 << 20;
    char *reg = (char *)aligned_alloc(4096, R);
    CHECK(cudaHostRegister(reg, R, cudaHostRegisterMapped));
    void *reg_dev = nullptr;
    CHECK(cudaHostGetDevicePointer(&reg_dev, reg, 0));
    w = want_of(cudaMemoryTypeHost);
    w.host_ptr = reg + 100;
    w.host_ptr_known = true;
    w.dev_ptr = (char *)reg_dev + 100;
    w.dev_ptr_known = true;
    w.ctx = g_primary[0];
    w.ctx_known = true;
    check("cudaHostRegister+interior", reg + 100, (uintptr_t)reg, w);
    CHECK(cudaHostUnregister(reg));
    w = want_of(cudaMemoryTypeUnregistered);
    check("unregistered again", reg + 100, 0, w);

    // Managed memory.
    int *m = nullptr;
    CHECK(cudaMallocManaged(&m, 4096));
    w = want_of(cudaMemoryTypeManaged);
    w.device = 0;
    w.dev_ptr = m;
    w.dev_ptr_known = true;
    w.host_ptr = m;
    w.host_ptr_known = true;
    check("cudaMallocManaged", m, (uintptr_t)m, w);
    CHECK(cudaFree(m));

    // Stream-ordered memory: no context owns it (NULL, documented); it names its pool.
    cudaMemPool_t current = nullptr;
    CHECK(cudaDeviceGetMemPool(&current, 0));
    void *a = nullptr;
    CHECK(cudaMallocAsync(&a, 4096, 0));
    CHECK(cudaStreamSynchronize(0));
    w = want_of(cudaMemoryTypeDevice);
    w.device = 0;
    w.dev_ptr = a;
    w.dev_ptr_known = true;
    w.ctx = nullptr;
    w.ctx_known = true;
    w.pool = current;
    w.pool_known = true;
    check("cudaMallocAsync", a, (uintptr_t)a, w);
    CHECK(cudaFreeAsync(a, 0));
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool = nullptr;
    CHECK(cudaMemPoolCreate(&pool, &props));
    CHECK(cudaMallocFromPoolAsync(&a, 4096, pool, 0));
    CHECK(cudaStreamSynchronize(0));
    w.dev_ptr = a;
    w.pool = pool;
    check("cudaMallocFromPoolAsync", a, (uintptr_t)a, w);
    CHECK(cudaFreeAsync(a, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaMemPoolDestroy(pool));

    // A graph's allocation, once the graph has run (its memory is mapped then).
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaMemAllocNodeParams ap = {};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = 1 << 20;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddMemAllocNode(&node, graph, nullptr, 0, &ap));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, 0));
    CHECK(cudaStreamSynchronize(0));
    w = want_of(cudaMemoryTypeDevice);
    w.device = 0;
    w.dev_ptr = (char *)ap.dptr + 64;
    w.dev_ptr_known = true;
    check("graph allocation", (char *)ap.dptr + 64, (uintptr_t)ap.dptr, w);
    CHECK(cudaFreeAsync(ap.dptr, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // VMM: the range is the reservation (documented), shareable as asked.
    int vmm = 0, posix = 0;
    CU(p_cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    CU(p_cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
    if (vmm) {
        CUmemAllocationProp prop = {};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        if (posix)
            prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        size_t g = 0;
        CU(p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CUmemGenericAllocationHandle h;
        CU(p_cuMemCreate(&h, g, &prop, 0));
        CUdeviceptr va = 0;
        CU(p_cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
        CU(p_cuMemMap(va, g, 0, h, 0));
        CUmemAccessDesc acc = {};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(p_cuMemSetAccess(va, g, &acc, 1));
        w = want_of(cudaMemoryTypeDevice);
        w.device = 0;
        w.dev_ptr = (void *)(va + 5);
        w.dev_ptr_known = true;
        w.range_start = va;
        w.range_size = 2 * g;
        w.legacy_ipc = 0;
        w.handle_types = posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
        w.access = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        check("VMM mapping", (void *)(va + 5), va, w);
        // Reserved but not mapped: printed only (CUDA says nothing of it).
        {
            cudaPointerAttributes ra;
            cudaError_t e = cudaPointerGetAttributes(&ra, (void *)(va + g + 1));
            std::printf("ATTR VMM-unmapped runtime result %d type %d\n", (int)e, e == cudaSuccess ? (int)ra.type : -1);
            unsigned mapped = 7;
            CUresult r = p_cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, va + g + 1);
            std::printf("ATTR VMM-unmapped single MAPPED %s %u\n", r == CUDA_SUCCESS ? "ok" : "error", mapped);
        }
        CU(p_cuMemUnmap(va, g));
        CU(p_cuMemAddressFree(va, 2 * g));
        CU(p_cuMemRelease(h));
    } else {
        std::printf("no VMM on this device: not checked\n");
    }

    // Another device's memory: its device and its context.
    if (g_devices >= 2) {
        CHECK(cudaSetDevice(1));
        void *d1 = nullptr;
        CHECK(cudaMalloc(&d1, 256));
        CHECK(cudaSetDevice(0));
        w = want_of(cudaMemoryTypeDevice);
        w.device = 1;
        w.ctx = g_primary[1];
        w.ctx_known = true;
        w.no_single_dev_ptr = true;
        w.range_start = (uintptr_t)d1;
        w.legacy_ipc = 1;
        check("another device's cudaMalloc", d1, (uintptr_t)d1, w);
        CHECK(cudaSetDevice(1));
        CHECK(cudaFree(d1));
        CHECK(cudaSetDevice(0));
    } else {
        std::printf("one device: another device's memory not checked\n");
    }

    // Memory CUDA never saw: success and cudaMemoryTypeUnregistered (CUDA 11.0 on); no device
    // pointer where the device cannot reach pageable memory.
    char *heap = (char *)std::malloc(4096);
    char stack[64];
    const void *never[] = {heap + 10, stack, &g_global, nullptr};
    const char *names[] = {"malloc", "stack", "global", "NULL"};
    for (int i = 0; i < 4; i++) {
        w = want_of(cudaMemoryTypeUnregistered);
        // NULL: printed only (CUDA says nothing of it).
        w.print_only = never[i] == nullptr;
        if (!pageable) {
            w.dev_ptr = nullptr;
            w.dev_ptr_known = true;
        }
        check(names[i], never[i], 0, w);
    }
    std::free(heap);
    std::free(reg);
    CHECK(cudaFree(d));
    CU(p_cuMemFree(cd));
    CHECK(cudaFree(pitched));
    for (int d2 = 0; d2 < g_devices && d2 < 2; d2++)
        CU(p_cuDevicePrimaryCtxRelease(d2));
    std::printf("%d documented answers checked\n", g_checked);
    return pass();
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// Device memory shared by two processes, as CUDA documents it: the parent forks before any CUDA
// call, then (1) exports a cudaMalloc allocation with cudaIpcGetMemHandle and sends the 64-byte
// handle over a Unix socket; the child opens it with cudaIpcOpenMemHandle, checks the parent's
// data (written by a kernel), writes its own half with a kernel, closes it; (2) creates a VMM
// allocation shareable as a POSIX file descriptor (cuMemCreate), exports it with
// cuMemExportToShareableHandle and passes the descriptor with SCM_RIGHTS; the child imports it
// (cuMemImportFromShareableHandle), maps it, checks and writes it, and asks cuPointerGetAttribute
// about it; (3) creates a memory pool shareable as POSIX descriptors, allocates from it
// (cudaMallocFromPoolAsync), passes the pool's descriptor (cudaMemPoolExportToShareableHandle)
// and the allocation's export record (cudaMemPoolExportPointer); the child imports both,
// sets access, checks and writes the allocation and frees it. The parent then sees the child's
// writes in all three; (4) records an interprocess event after a slow kernel that fills a
// fourth buffer and sends the event's handle (cudaIpcGetEventHandle) at once, without waiting:
// the child opens it (cudaIpcOpenEventHandle), makes its stream wait for it
// (cudaStreamWaitEvent) and must then read the kernel's data. Skipped without a device; the VMM and pool parts are skipped (and said
// so) where the device reports no POSIX-descriptor handles for them.
#define TEST_NAME "ipc_share"
#include "selfcheck.cuh"

#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

__global__ void slow_fill(unsigned *p, size_t n, unsigned base, long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = base + (unsigned)i;
}

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
DRIVER_FN(cuMemExportToShareableHandle);
DRIVER_FN(cuMemImportFromShareableHandle);
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

static void load_all()
{
    load(p_cuDeviceGetAttribute, "cuDeviceGetAttribute");
    load(p_cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    load(p_cuMemCreate, "cuMemCreate");
    load(p_cuMemRelease, "cuMemRelease");
    load(p_cuMemAddressReserve, "cuMemAddressReserve");
    load(p_cuMemAddressFree, "cuMemAddressFree");
    load(p_cuMemMap, "cuMemMap");
    load(p_cuMemUnmap, "cuMemUnmap");
    load(p_cuMemSetAccess, "cuMemSetAccess");
    load(p_cuMemExportToShareableHandle, "cuMemExportToShareableHandle");
    load(p_cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    load(p_cuPointerGetAttribute, "cuPointerGetAttribute");
}

#define CU(call)                                                                                 \
    do {                                                                                         \
        CUresult cu_err_ = (call);                                                               \
        if (cu_err_ != CUDA_SUCCESS)                                                             \
            fail("%s returned CUresult %d at %s:%d", #call, (int)cu_err_, __FILE__, __LINE__);   \
    } while (0)

static const size_t WORDS = 1 << 18; // 1 MiB of unsigned
static const size_t EVENT_WORDS = 1 << 16;

static void check_words(const void *p, size_t from, size_t n, unsigned base, const char *what)
{
    std::vector<unsigned> h(n);
    CHECK(cudaMemcpy(h.data(), (const unsigned *)p + from, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        if (h[i] != base + (unsigned)i)
            fail("%s: word %zu is %u, expected %u", what, from + i, h[i], base + (unsigned)i);
}

static void send_all(int s, const void *b, size_t n, int fd = -1)
{
    struct iovec iov = {const_cast<void *>(b), n};
    char ctl[CMSG_SPACE(sizeof(int))] = {};
    struct msghdr m = {};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (fd >= 0) {
        m.msg_control = ctl;
        m.msg_controllen = sizeof(ctl);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    if (sendmsg(s, &m, 0) != (ssize_t)n)
        fail("sendmsg failed");
}

static int recv_all(int s, void *b, size_t n)
{
    struct iovec iov = {b, n};
    char ctl[CMSG_SPACE(sizeof(int))] = {};
    struct msghdr m = {};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    if (recvmsg(s, &m, MSG_WAITALL) != (ssize_t)n)
        fail("recvmsg failed");
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    int fd = -1;
    if (c && c->cmsg_type == SCM_RIGHTS)
        std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

struct VmmInfo {
    int have; // 0: the device offers no POSIX-descriptor handles
    size_t size;
};

struct EventInfo {
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t event;
};

struct PoolInfo {
    int have; // 0: the device's pools offer no POSIX-descriptor handles
    cudaMemPoolPtrExportData record;
};

static void child(int s)
{
    require_device();
    load_all();
    CHECK(cudaSetDevice(0));
    // (1) Legacy IPC.
    cudaIpcMemHandle_t h;
    recv_all(s, &h, sizeof(h));
    void *q = nullptr;
    CHECK(cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess));
    check_words(q, 0, WORDS / 2, 1000, "child, legacy, parent's half");
    fill<<<64, 256>>>((unsigned *)q + WORDS / 2, WORDS / 2, 2000);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaIpcCloseMemHandle(q));
    // (2) VMM with a POSIX descriptor.
    VmmInfo info;
    int fd = recv_all(s, &info, sizeof(info));
    if (info.have) {
        if (fd < 0)
            fail("child: no descriptor came with the VMM handle");
        CUmemGenericAllocationHandle mh;
        CU(p_cuMemImportFromShareableHandle(&mh, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(fd);
        CUdeviceptr va = 0;
        CU(p_cuMemAddressReserve(&va, info.size, 0, 0, 0));
        CU(p_cuMemMap(va, info.size, 0, mh, 0));
        CU(p_cuMemRelease(mh));
        CUmemAccessDesc acc = {};
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = 0;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(p_cuMemSetAccess(va, info.size, &acc, 1));
        unsigned mem_type = 0;
        CU(p_cuPointerGetAttribute(&mem_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 64));
        if (mem_type != CU_MEMORYTYPE_DEVICE)
            fail("child: cuPointerGetAttribute says memory type %u of imported memory", mem_type);
        size_t n = info.size / sizeof(unsigned);
        check_words((void *)va, 0, n / 2, 3000, "child, VMM, parent's half");
        fill<<<64, 256>>>((unsigned *)va + n / 2, n / 2, 4000);
        CHECK(cudaDeviceSynchronize());
        CU(p_cuMemUnmap(va, info.size));
        CU(p_cuMemAddressFree(va, info.size));
    }
    // (3) A shareable pool and one of its allocations.
    PoolInfo pinfo;
    fd = recv_all(s, &pinfo, sizeof(pinfo));
    if (pinfo.have) {
        if (fd < 0)
            fail("child: no descriptor came with the pool");
        cudaMemPool_t pool;
        CHECK(cudaMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)fd,
                                                   cudaMemHandleTypePosixFileDescriptor, 0));
        close(fd);
        cudaMemAccessDesc acc = {};
        acc.location.type = cudaMemLocationTypeDevice;
        acc.location.id = 0;
        acc.flags = cudaMemAccessFlagsProtReadWrite;
        CHECK(cudaMemPoolSetAccess(pool, &acc, 1));
        void *q = nullptr;
        CHECK(cudaMemPoolImportPointer(&q, pool, &pinfo.record));
        check_words(q, 0, WORDS / 2, 5000, "child, pool, parent's half");
        fill<<<64, 256>>>((unsigned *)q + WORDS / 2, WORDS / 2, 6000);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaFree(q));
        CHECK(cudaMemPoolDestroy(pool));
    }
    // (4) An interprocess event orders this process's work after the other's.
    EventInfo einfo;
    recv_all(s, &einfo, sizeof(einfo));
    void *eb = nullptr;
    CHECK(cudaIpcOpenMemHandle(&eb, einfo.mem, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t ev;
    CHECK(cudaIpcOpenEventHandle(&ev, einfo.event));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK(cudaStreamWaitEvent(st, ev, 0));
    std::vector<unsigned> h4(EVENT_WORDS);
    CHECK(cudaMemcpyAsync(h4.data(), eb, EVENT_WORDS * sizeof(unsigned), cudaMemcpyDeviceToHost, st));
    CHECK(cudaStreamSynchronize(st));
    for (size_t i = 0; i < EVENT_WORDS; i++)
        if (h4[i] != 7000 + (unsigned)i)
            fail("child: after waiting for the other process's event, word %zu is %u, expected %u", i,
                 h4[i], 7000 + (unsigned)i);
    CHECK(cudaEventSynchronize(ev));
    CHECK(cudaEventQuery(ev));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(st));
    CHECK(cudaIpcCloseMemHandle(eb));
    char done = 'd';
    send_all(s, &done, 1);
}

int main()
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        fail("socketpair failed");
    // Fork before any CUDA call: a child may not use CUDA its parent initialised.
    pid_t pid = fork();
    if (pid < 0)
        fail("fork failed");
    if (pid == 0) {
        close(sv[0]);
        child(sv[1]);
        std::fflush(stdout);
        _exit(0);
    }
    close(sv[1]);
    int s = sv[0];
    require_device();
    load_all();
    CHECK(cudaSetDevice(0));

    unsigned *p = nullptr;
    CHECK(cudaMalloc(&p, WORDS * sizeof(unsigned)));
    fill<<<64, 256>>>(p, WORDS / 2, 1000);
    CHECK(cudaMemset(p + WORDS / 2, 0, WORDS / 2 * sizeof(unsigned)));
    CHECK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, p));
    send_all(s, &h, sizeof(h));

    int posix = 0;
    CU(p_cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
    VmmInfo info = {posix, 0};
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle mh = 0;
    if (posix) {
        CUmemAllocationProp prop = {};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        size_t g = 0;
        CU(p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        info.size = 2 * g;
        CU(p_cuMemCreate(&mh, info.size, &prop, 0));
        CU(p_cuMemAddressReserve(&va, info.size, 0, 0, 0));
        CU(p_cuMemMap(va, info.size, 0, mh, 0));
        CUmemAccessDesc acc = {};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(p_cuMemSetAccess(va, info.size, &acc, 1));
        size_t n = info.size / sizeof(unsigned);
        fill<<<64, 256>>>((unsigned *)va, n / 2, 3000);
        CHECK(cudaDeviceSynchronize());
        int fd = -1;
        CU(p_cuMemExportToShareableHandle(&fd, mh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        send_all(s, &info, sizeof(info), fd);
        close(fd);
    } else {
        std::printf("no POSIX-descriptor handles on this device: VMM sharing not checked\n");
        send_all(s, &info, sizeof(info));
    }

    int pool_types = 0;
    CHECK(cudaDeviceGetAttribute(&pool_types, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
    PoolInfo pinfo = {};
    pinfo.have = (pool_types & cudaMemHandleTypePosixFileDescriptor) != 0;
    cudaMemPool_t pool = nullptr;
    unsigned *pp = nullptr;
    if (pinfo.have) {
        cudaMemPoolProps props = {};
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        CHECK(cudaMemPoolCreate(&pool, &props));
        CHECK(cudaMallocFromPoolAsync((void **)&pp, WORDS * sizeof(unsigned), pool, 0));
        fill<<<64, 256>>>(pp, WORDS / 2, 5000);
        CHECK(cudaDeviceSynchronize());
        int fd = -1;
        CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
        CHECK(cudaMemPoolExportPointer(&pinfo.record, pp));
        send_all(s, &pinfo, sizeof(pinfo), fd);
        close(fd);
    } else {
        std::printf("no POSIX-descriptor handles for pools on this device: pool sharing not checked\n");
        send_all(s, &pinfo, sizeof(pinfo));
    }

    // (4) The event: recorded after a kernel that takes a while, handle sent at once.
    unsigned *eb = nullptr;
    CHECK(cudaMalloc(&eb, EVENT_WORDS * sizeof(unsigned)));
    CHECK(cudaMemset(eb, 0, EVENT_WORDS * sizeof(unsigned)));
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
    EventInfo einfo;
    CHECK(cudaIpcGetMemHandle(&einfo.mem, eb));
    CHECK(cudaIpcGetEventHandle(&einfo.event, ev));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    // About 200 ms of spinning before the data is written.
    slow_fill<<<32, 256>>>(eb, EVENT_WORDS, 7000, (long long)clock_khz * 200);
    CHECK(cudaEventRecord(ev, 0));
    send_all(s, &einfo, sizeof(einfo));

    char done = 0;
    ssize_t got = read(s, &done, 1);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != 1)
        fail("the importing process failed (status %d)", status);
    // The importer's writes are the exporter's to read.
    check_words(p, WORDS / 2, WORDS / 2, 2000, "parent, legacy, child's half");
    CHECK(cudaFree(p));
    if (posix) {
        size_t n = info.size / sizeof(unsigned);
        check_words((void *)va, n / 2, n / 2, 4000, "parent, VMM, child's half");
        CU(p_cuMemUnmap(va, info.size));
        CU(p_cuMemAddressFree(va, info.size));
        CU(p_cuMemRelease(mh));
    }
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaFree(eb));
    if (pinfo.have) {
        check_words(pp, WORDS / 2, WORDS / 2, 6000, "parent, pool, child's half");
        CHECK(cudaFreeAsync(pp, 0));
        CHECK(cudaStreamSynchronize(0));
        CHECK(cudaMemPoolDestroy(pool));
    }
    return pass();
}

// SPDX-License-Identifier: Apache-2.0 OR MIT
// Interprocess events and memory the way multi-process programs share them (NVIDIA's
// simpleIPC, PyTorch's and NCCL's IPC paths): the parent forks N children before any CUDA call;
// it exports an input and an output cudaMalloc buffer (cudaIpcGetMemHandle), an event created
// cudaEventInterprocess | cudaEventDisableTiming (cudaIpcGetEventHandle), and a VMM allocation
// shareable as a POSIX file descriptor (cuMemExportToShareableHandle), and sends each child the
// handles over a Unix socket, the descriptor with SCM_RIGHTS. Each child opens them
// (cudaIpcOpenMemHandle, cudaIpcOpenEventHandle, cuMemImportFromShareableHandle, then
// reserve, map, access) and asks what the imported pointers are (cudaPointerGetAttributes,
// cuPointerGetAttribute). The parent then starts a kernel that spins for a while before it
// fills the input, records the event right after it, and tells the children to go at once:
// each child orders its own work after the parent's kernel through the event (even children
// with cudaStreamWaitEvent on a stream of their own, odd ones with cudaEventSynchronize), then
// writes its part of the output and of the VMM allocation from the input. A child that did not
// wait reads zeros. The parent checks every part. Skipped without a device; the VMM part is
// skipped (and said so) where the device has no POSIX-descriptor handles.
#define TEST_NAME "ipc_events"
#include "selfcheck.cuh"

#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

static const int CHILDREN = 3;
static const size_t WORDS = 1 << 18; // per child
// Each buffer a whole number of 2 MiB granules: two opened handles never share one.
static const size_t GRANULE = 2 << 20;

__global__ void slow_fill(unsigned *p, size_t n, unsigned base, long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = base + (unsigned)i;
}

// out[i] = in[i] * 3 + k: right only if `in` was filled first.
__global__ void derive(unsigned *out, const unsigned *in, size_t n, unsigned k)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = in[i] * 3 + k;
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

struct Shared {
    cudaIpcMemHandle_t in, out;
    cudaIpcEventHandle_t event;
    int have_vmm;
    size_t vmm_size;
};

// What a child says of an imported pointer, printed for comparison with a native run.
static void describe(int i, const char *what, const void *p, CUdeviceptr base)
{
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, p));
    unsigned mem_type = 0;
    int ordinal = -1;
    CU(p_cuPointerGetAttribute(&mem_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p));
    CU(p_cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)p));
    unsigned long long start = 0, types = 0;
    unsigned legacy = 0;
    CUresult rs = p_cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)(uintptr_t)p);
    CUresult rt = p_cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, (CUdeviceptr)(uintptr_t)p);
    CUresult rl = p_cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                          (CUdeviceptr)(uintptr_t)p);
    std::printf("child %d: %s: type %d device %d devicePointer %s; MEMORY_TYPE %u DEVICE_ORDINAL %d "
                "RANGE_START %s ALLOWED_HANDLE_TYPES %s %#llx IS_LEGACY_CUDA_IPC_CAPABLE %s %u\n",
                i, what, (int)a.type, a.device, a.devicePointer == p ? "=ptr" : "other", mem_type, ordinal,
                rs != CUDA_SUCCESS ? "error" : start == base ? "base" : "other", rt == CUDA_SUCCESS ? "ok" : "error",
                types, rl == CUDA_SUCCESS ? "ok" : "error", legacy);
    // Documented: imported memory is device memory of the device it lives on.
    if (a.type != cudaMemoryTypeDevice || a.devicePointer != p || a.device != 0)
        fail("child %d: %s: cudaPointerGetAttributes type %d device %d", i, what, (int)a.type, a.device);
    if (mem_type != CU_MEMORYTYPE_DEVICE || ordinal != 0)
        fail("child %d: %s: cuPointerGetAttribute memory type %u, ordinal %d", i, what, mem_type, ordinal);
}

static void child(int i, int s)
{
    // A process without a device says nothing: the parent prints the SKIP.
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        _exit(EXIT_SKIP);
    load_all();
    CHECK(cudaSetDevice(0));
    Shared sh;
    int fd = recv_all(s, &sh, sizeof(sh));
    unsigned *in = nullptr, *out = nullptr;
    CHECK(cudaIpcOpenMemHandle((void **)&in, sh.in, cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenMemHandle((void **)&out, sh.out, cudaIpcMemLazyEnablePeerAccess));
    describe(i, "cudaIpcOpenMemHandle", out, (CUdeviceptr)(uintptr_t)out);
    cudaEvent_t ev;
    CHECK(cudaIpcOpenEventHandle(&ev, sh.event));
    CUdeviceptr va = 0;
    if (sh.have_vmm) {
        if (fd < 0)
            fail("child %d: no descriptor came with the VMM allocation", i);
        CUmemGenericAllocationHandle h;
        CU(p_cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(fd);
        CU(p_cuMemAddressReserve(&va, sh.vmm_size, 0, 0, 0));
        CU(p_cuMemMap(va, sh.vmm_size, 0, h, 0));
        CU(p_cuMemRelease(h));
        CUmemAccessDesc acc = {};
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = 0;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(p_cuMemSetAccess(va, sh.vmm_size, &acc, 1));
        describe(i, "cuMemImportFromShareableHandle", (void *)(va + 64), va);
    }
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    char go = 0;
    recv_all(s, &go, 1);
    // The parent recorded the event after its slow kernel, then said go.
    if (i % 2 == 0) {
        CHECK(cudaStreamWaitEvent(st, ev, 0));
    } else {
        CHECK(cudaEventSynchronize(ev));
        CHECK(cudaEventQuery(ev));
    }
    derive<<<64, 256, 0, st>>>(out + i * WORDS, in + i * WORDS, WORDS, 100 + i);
    CHECK_LAUNCH();
    if (va)
        derive<<<64, 256, 0, st>>>((unsigned *)va + i * WORDS, in + i * WORDS, WORDS, 200 + i);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaEventQuery(ev));
    CHECK(cudaStreamDestroy(st));
    CHECK(cudaEventDestroy(ev));
    if (va) {
        CU(p_cuMemUnmap(va, sh.vmm_size));
        CU(p_cuMemAddressFree(va, sh.vmm_size));
    }
    CHECK(cudaIpcCloseMemHandle(in));
    CHECK(cudaIpcCloseMemHandle(out));
    char done = 'd';
    send_all(s, &done, 1);
}

static void check_part(const unsigned *dev, size_t from, unsigned k, const char *what)
{
    std::vector<unsigned> h(WORDS);
    CHECK(cudaMemcpy(h.data(), dev + from, WORDS * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (size_t j = 0; j < WORDS; j++) {
        unsigned want = (1000u + (unsigned)(from + j)) * 3 + k;
        if (h[j] != want)
            fail("%s: word %zu is %u, expected %u (a child did not wait for the event?)", what, from + j, h[j], want);
    }
}

int main()
{
    int socks[CHILDREN];
    pid_t pids[CHILDREN];
    for (int i = 0; i < CHILDREN; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
            fail("socketpair failed");
        std::fflush(stdout);
        // Fork before any CUDA call: a child may not use CUDA its parent initialised.
        pids[i] = fork();
        if (pids[i] < 0)
            fail("fork failed");
        if (pids[i] == 0) {
            for (int j = 0; j < i; j++)
                close(socks[j]);
            close(sv[0]);
            child(i, sv[1]);
            std::fflush(stdout);
            _exit(0);
        }
        close(sv[1]);
        socks[i] = sv[0];
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        for (int i = 0; i < CHILDREN; i++) {
            close(socks[i]);
            waitpid(pids[i], nullptr, 0);
        }
        require_device();
    }
    load_all();
    CHECK(cudaSetDevice(0));

    const size_t total = CHILDREN * WORDS;
    const size_t bytes = (total * sizeof(unsigned) + GRANULE - 1) / GRANULE * GRANULE;
    unsigned *in = nullptr, *out = nullptr;
    CHECK(cudaMalloc(&in, bytes));
    CHECK(cudaMalloc(&out, bytes));
    CHECK(cudaMemset(in, 0, bytes));
    CHECK(cudaMemset(out, 0, bytes));
    CHECK(cudaDeviceSynchronize());
    Shared sh = {};
    CHECK(cudaIpcGetMemHandle(&sh.in, in));
    CHECK(cudaIpcGetMemHandle(&sh.out, out));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
    CHECK(cudaIpcGetEventHandle(&sh.event, ev));

    int posix = 0;
    CU(p_cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle mh = 0;
    int vfd = -1;
    if (posix) {
        CUmemAllocationProp prop = {};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        size_t g = 0;
        CU(p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        sh.vmm_size = (total * sizeof(unsigned) + g - 1) / g * g;
        CU(p_cuMemCreate(&mh, sh.vmm_size, &prop, 0));
        CU(p_cuMemAddressReserve(&va, sh.vmm_size, 0, 0, 0));
        CU(p_cuMemMap(va, sh.vmm_size, 0, mh, 0));
        CUmemAccessDesc acc = {};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(p_cuMemSetAccess(va, sh.vmm_size, &acc, 1));
        CHECK(cudaMemset((void *)va, 0, sh.vmm_size));
        CHECK(cudaDeviceSynchronize());
        CU(p_cuMemExportToShareableHandle(&vfd, mh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        sh.have_vmm = 1;
    } else {
        std::printf("no POSIX-descriptor handles on this device: VMM sharing not checked\n");
    }
    for (int i = 0; i < CHILDREN; i++)
        send_all(socks[i], &sh, sizeof(sh), vfd);
    if (vfd >= 0)
        close(vfd);

    // The slow kernel, the event right after it, and go at once: the children's work must
    // wait for it through the event.
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    // A pause for the children to be waiting on their sockets (not needed for correctness).
    usleep(100 * 1000);
    slow_fill<<<32, 256>>>(in, total, 1000, (long long)clock_khz * 300); // about 300 ms
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(ev, 0));
    for (int i = 0; i < CHILDREN; i++) {
        char go = 'g';
        send_all(socks[i], &go, 1);
    }
    int failed = 0;
    for (int i = 0; i < CHILDREN; i++) {
        char done = 0;
        ssize_t got = read(socks[i], &done, 1);
        int status = 0;
        waitpid(pids[i], &status, 0);
        if (got != 1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            std::printf("child %d failed (status %d)\n", i, status);
            failed++;
        }
    }
    if (failed)
        fail("%d of %d importing processes failed", failed, CHILDREN);
    for (int i = 0; i < CHILDREN; i++) {
        check_part(out, i * WORDS, 100 + i, "output");
        if (va)
            check_part((const unsigned *)va, i * WORDS, 200 + i, "VMM");
    }
    std::printf("%d processes ordered after the exporter's kernel through one interprocess event\n", CHILDREN);
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaFree(in));
    CHECK(cudaFree(out));
    if (va) {
        CU(p_cuMemUnmap(va, sh.vmm_size));
        CU(p_cuMemAddressFree(va, sh.vmm_size));
        CU(p_cuMemRelease(mh));
    }
    return pass();
}

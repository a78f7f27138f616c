// SPDX-License-Identifier: Apache-2.0 OR MIT
// Stream-ordered allocation and memory pools: cudaMallocAsync/cudaFreeAsync in two streams
// ordered by an event, kernels writing and reading that memory, the default pool's attributes
// (release threshold, reuse flags, reserved and used memory, the used-memory high watermark and
// its reset), cudaMemPoolTrimTo, a created pool used through cudaMallocFromPoolAsync and as the
// device's current pool, access queries, and errors.
#define TEST_NAME "stream_ordered_alloc"
#include "selfcheck.cuh"

#include <cstdint>
#include <vector>

__global__ void fill(int *p, int n, int salt)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = i * 3 + salt;
}

// out[i] = in[i] * 2 + 1
__global__ void twice_plus_one(const int *in, int *out, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = in[i] * 2 + 1;
}

static uint64_t attr64(cudaMemPool_t pool, cudaMemPoolAttr attr)
{
    uint64_t v = 0;
    CHECK(cudaMemPoolGetAttribute(pool, attr, &v));
    return v;
}

static int attr_int(cudaMemPool_t pool, cudaMemPoolAttr attr)
{
    int v = -1;
    CHECK(cudaMemPoolGetAttribute(pool, attr, &v));
    return v;
}

// Runs fill + twice_plus_one on `n` ints allocated in stream order on `a`, the second kernel on
// `b` after an event, and checks the result; everything is freed in stream order on `b`.
static void two_stream_round(cudaStream_t a, cudaStream_t b, int n, int salt)
{
    int *x = nullptr, *y = nullptr;
    CHECK(cudaMallocAsync(&x, n * sizeof(int), a));
    CHECK(cudaMallocAsync(&y, n * sizeof(int), a));
    fill<<<64, 256, 0, a>>>(x, n, salt);
    CHECK_LAUNCH();
    cudaEvent_t filled;
    CHECK(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
    CHECK(cudaEventRecord(filled, a));
    CHECK(cudaStreamWaitEvent(b, filled, 0));
    twice_plus_one<<<64, 256, 0, b>>>(x, y, n);
    CHECK_LAUNCH();
    std::vector<int> h(n);
    CHECK(cudaMemcpyAsync(h.data(), y, n * sizeof(int), cudaMemcpyDeviceToHost, b));
    CHECK(cudaFreeAsync(x, b));
    CHECK(cudaFreeAsync(y, b));
    CHECK(cudaStreamSynchronize(b));
    CHECK(cudaEventDestroy(filled));
    for (int i = 0; i < n; i++)
        if (h[i] != (i * 3 + salt) * 2 + 1)
            fail("element %d is %d, expected %d (salt %d)", i, h[i], (i * 3 + salt) * 2 + 1, salt);
}

int main()
{
    require_device();
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    int supported = 0;
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev));
    if (!supported)
        fail("cudaDevAttrMemoryPoolsSupported reads 0");

    cudaMemPool_t def = nullptr, cur = nullptr, again = nullptr;
    CHECK(cudaDeviceGetDefaultMemPool(&def, dev));
    CHECK(cudaDeviceGetMemPool(&cur, dev));
    CHECK(cudaDeviceGetDefaultMemPool(&again, dev));
    if (def == nullptr || cur != def || again != def)
        fail("default pool %p, current %p, asked again %p", (void *)def, (void *)cur,
             (void *)again);

    // Stream-ordered memory in kernels, across two streams, in both orders and repeatedly (the
    // pool reuses what was freed).
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    for (int round = 0; round < 4; round++)
        two_stream_round(round % 2 ? b : a, round % 2 ? a : b, 1 << 20, round * 11);

    // The legacy stream works too, and cudaMemset/cudaMemcpy take the memory.
    int *z = nullptr;
    CHECK(cudaMallocAsync(&z, 4096, 0));
    CHECK(cudaMemsetAsync(z, 0x5a, 4096, 0));
    unsigned char zb[4096];
    CHECK(cudaMemcpy(zb, z, sizeof zb, cudaMemcpyDeviceToHost));
    for (unsigned i = 0; i < sizeof zb; i++)
        if (zb[i] != 0x5a)
            fail("memset of stream-ordered memory: byte %u is %#x", i, zb[i]);
    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, z));
    if (pa.type != cudaMemoryTypeDevice || pa.device != dev)
        fail("stream-ordered memory has pointer type %d on device %d", (int)pa.type, pa.device);
    CHECK(cudaFreeAsync(z, 0));
    CHECK(cudaDeviceSynchronize());

    // Attributes of the default pool: a release threshold that keeps memory after a
    // synchronisation, so reserved memory stays until trimmed.
    if (attr64(def, cudaMemPoolAttrReleaseThreshold) != 0)
        std::printf("note: default release threshold is %llu\n",
                    (unsigned long long)attr64(def, cudaMemPoolAttrReleaseThreshold));
    uint64_t keep_all = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep_all));
    if (attr64(def, cudaMemPoolAttrReleaseThreshold) != UINT64_MAX)
        fail("release threshold did not read back");
    for (cudaMemPoolAttr f : {cudaMemPoolReuseFollowEventDependencies,
                              cudaMemPoolReuseAllowOpportunistic,
                              cudaMemPoolReuseAllowInternalDependencies}) {
        int v = attr_int(def, f);
        if (v != 0 && v != 1)
            fail("reuse flag %d reads %d", (int)f, v);
        int off = 0;
        CHECK(cudaMemPoolSetAttribute(def, f, &off));
        if (attr_int(def, f) != 0)
            fail("reuse flag %d did not turn off", (int)f);
        CHECK(cudaMemPoolSetAttribute(def, f, &v));
        if (attr_int(def, f) != v)
            fail("reuse flag %d did not come back", (int)f);
    }

    const size_t big = 8u << 20, small = 4u << 20;
    void *p1 = nullptr, *p2 = nullptr;
    CHECK(cudaMallocAsync(&p1, big, a));
    CHECK(cudaMallocAsync(&p2, small, a));
    uint64_t used = attr64(def, cudaMemPoolAttrUsedMemCurrent);
    uint64_t used_high = attr64(def, cudaMemPoolAttrUsedMemHigh);
    uint64_t reserved = attr64(def, cudaMemPoolAttrReservedMemCurrent);
    std::printf("two allocations (%zu + %zu B): used %llu, used high %llu, reserved %llu\n", big,
                small, (unsigned long long)used, (unsigned long long)used_high,
                (unsigned long long)reserved);
    if (used < big + small || used_high < used || reserved < used ||
        attr64(def, cudaMemPoolAttrReservedMemHigh) < reserved)
        fail("implausible pool usage after allocating");
    CHECK(cudaFreeAsync(p1, a));
    CHECK(cudaFreeAsync(p2, a));
    CHECK(cudaStreamSynchronize(a));
    used = attr64(def, cudaMemPoolAttrUsedMemCurrent);
    reserved = attr64(def, cudaMemPoolAttrReservedMemCurrent);
    std::printf("after freeing: used %llu, reserved %llu\n", (unsigned long long)used,
                (unsigned long long)reserved);
    if (used != 0)
        fail("%llu bytes still in use after freeing everything", (unsigned long long)used);
    if (reserved < big + small)
        fail("the pool released memory below its threshold (%llu reserved)",
             (unsigned long long)reserved);
    if (attr64(def, cudaMemPoolAttrUsedMemHigh) < big + small)
        fail("used high watermark fell before a reset");

    // The high watermark resets to the current use (0 here), and only to zero.
    uint64_t zero = 0, five = 5;
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &zero));
    if (attr64(def, cudaMemPoolAttrUsedMemHigh) != 0)
        fail("used high watermark reads %llu after a reset with nothing in use",
             (unsigned long long)attr64(def, cudaMemPoolAttrUsedMemHigh));
    EXPECT_ERR(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &five),
               cudaErrorInvalidValue);
    EXPECT_ERR(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &zero),
               cudaErrorInvalidValue);
    EXPECT_ERR(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReservedMemCurrent, &zero),
               cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK(cudaMallocAsync(&p1, small, a));
    used_high = attr64(def, cudaMemPoolAttrUsedMemHigh);
    if (used_high < small || used_high >= big + small)
        fail("used high watermark %llu after one %zu B allocation since the reset",
             (unsigned long long)used_high, small);
    CHECK(cudaFreeAsync(p1, a));
    CHECK(cudaStreamSynchronize(a));

    // Trimming gives back what is not in use.
    uint64_t before = attr64(def, cudaMemPoolAttrReservedMemCurrent);
    CHECK(cudaMemPoolTrimTo(def, 0));
    uint64_t after = attr64(def, cudaMemPoolAttrReservedMemCurrent);
    std::printf("trim: reserved %llu -> %llu\n", (unsigned long long)before,
                (unsigned long long)after);
    if (after >= before)
        fail("cudaMemPoolTrimTo(0) left %llu of %llu reserved bytes", (unsigned long long)after,
             (unsigned long long)before);
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &zero));

    // A pool of our own: explicit allocations, then as the device's current pool.
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool = nullptr;
    CHECK(cudaMemPoolCreate(&pool, &props));
    if (pool == nullptr || pool == def)
        fail("cudaMemPoolCreate gave %p (default %p)", (void *)pool, (void *)def);
    cudaMemLocation here = {};
    here.type = cudaMemLocationTypeDevice;
    here.id = dev;
    cudaMemAccessFlags access = cudaMemAccessFlagsProtNone;
    CHECK(cudaMemPoolGetAccess(&access, pool, &here));
    if (access != cudaMemAccessFlagsProtReadWrite)
        fail("the pool's own device has access %d", (int)access);

    const int n = 1 << 18;
    int *q = nullptr;
    CHECK(cudaMallocFromPoolAsync(&q, n * sizeof(int), pool, a));
    if (attr64(pool, cudaMemPoolAttrUsedMemCurrent) < n * sizeof(int) ||
        attr64(def, cudaMemPoolAttrUsedMemCurrent) != 0)
        fail("cudaMallocFromPoolAsync did not take from the created pool");
    fill<<<32, 256, 0, a>>>(q, n, 7);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSetMemPool(dev, pool));
    CHECK(cudaDeviceGetMemPool(&cur, dev));
    if (cur != pool)
        fail("the current pool is %p after setting %p", (void *)cur, (void *)pool);
    int *r = nullptr;
    CHECK(cudaMallocAsync(&r, n * sizeof(int), a));
    if (attr64(pool, cudaMemPoolAttrUsedMemCurrent) < 2 * n * sizeof(int))
        fail("cudaMallocAsync did not use the device's current pool");
    twice_plus_one<<<32, 256, 0, a>>>(q, r, n);
    CHECK_LAUNCH();
    std::vector<int> h(n);
    CHECK(cudaMemcpyAsync(h.data(), r, n * sizeof(int), cudaMemcpyDeviceToHost, a));
    CHECK(cudaStreamSynchronize(a));
    for (int i = 0; i < n; i++)
        if (h[i] != (i * 3 + 7) * 2 + 1)
            fail("created pool: element %d is %d", i, h[i]);
    // cudaFree takes stream-ordered memory too (once no work uses it).
    CHECK(cudaFree(r));
    CHECK(cudaFreeAsync(q, a));
    CHECK(cudaStreamSynchronize(a));
    // The driver counts memory given back by cudaFree (rather than cudaFreeAsync) as in use
    // until the pool next settles (measured natively on an H100: one allocation's worth), so at
    // most that much may remain.
    if (attr64(pool, cudaMemPoolAttrUsedMemCurrent) > n * sizeof(int))
        fail("created pool still has %llu bytes in use",
             (unsigned long long)attr64(pool, cudaMemPoolAttrUsedMemCurrent));
    CHECK(cudaDeviceSetMemPool(dev, def));
    CHECK(cudaDeviceGetMemPool(&cur, dev));
    if (cur != def)
        fail("the default pool did not become current again");
    CHECK(cudaMemPoolDestroy(pool));

    // Errors.
    EXPECT_ERR(cudaMallocAsync((void **)nullptr, 16, a), cudaErrorInvalidValue);
    uint64_t v = 0;
    EXPECT_ERR(cudaMemPoolGetAttribute(def, (cudaMemPoolAttr)99, &v), cudaErrorInvalidValue);
    cudaGetLastError();

    CHECK(cudaStreamDestroy(a));
    CHECK(cudaStreamDestroy(b));
    return pass();
}

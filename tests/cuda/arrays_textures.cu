// SPDX-License-Identifier: Apache-2.0 OR MIT
// Pitched memory, 2D/3D copies and memsets, CUDA arrays and texture/surface objects:
// cudaMallocPitch and cudaMemcpy2D[Async] in every direction (pageable and pinned host memory),
// cudaMemset2D, cudaMalloc3D/cudaMemset3D/cudaMemcpy3D with positions, 2D and 3D arrays and the
// array copies (2D, deprecated linear, array to array), a texture object over an array with
// normalized coordinates and linear filtering, over pitch-2D and linear memory and over a
// uchar4 array read as normalized floats, a surface write kernel, a layered array, a mipmapped
// array's levels, channel descriptors and the object queries, and the errors for a width
// beyond the pitch, a copy beyond an array and a freed array. Expected values are computed on
// the CPU.
#define TEST_NAME "arrays_textures"
#include "selfcheck.cuh"

#include <cmath>
#include <cstring>
#include <vector>

// cudaMemcpyToArray/FromArray are deprecated but exported, and tested here on purpose.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

__global__ void sample_2d(cudaTextureObject_t t, const float2 *at, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = tex2D<float>(t, at[i].x, at[i].y);
}

__global__ void sample_2d_uchar4(cudaTextureObject_t t, float4 *out, int w, int h)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h)
        out[i] = tex2D<float4>(t, i % w + 0.5f, i / w + 0.5f);
}

__global__ void fetch_1d(cudaTextureObject_t t, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = tex1Dfetch<float>(t, i);
}

__global__ void sample_layered(cudaTextureObject_t t, float *out, int w, int h, int layers)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h * layers) {
        int x = i % w, y = (i / w) % h, l = i / (w * h);
        out[i] = tex2DLayered<float>(t, x + 0.5f, y + 0.5f, l);
    }
}

__global__ void surface_write(cudaSurfaceObject_t s, int w, int h)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h)
        surf2Dwrite(float(x * 100 + y), s, x * (int)sizeof(float), y);
}

static float field(int x, int y) { return x * 0.5f + y * 0.25f + ((x * 7 + y * 3) % 5) * 0.1f; }

static int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// What linear filtering with clamped addressing returns at unnormalized (x, y), the weights in
// exact arithmetic (the hardware rounds them to 1/256, which the caller's tolerance covers).
static double bilinear(const std::vector<float> &img, int w, int h, double x, double y)
{
    double xb = x - 0.5, yb = y - 0.5;
    int i = (int)std::floor(xb), j = (int)std::floor(yb);
    double a = xb - i, b = yb - j;
    auto at = [&](int xi, int yi) { return (double)img[clampi(yi, 0, h - 1) * w + clampi(xi, 0, w - 1)]; };
    return (1 - a) * (1 - b) * at(i, j) + a * (1 - b) * at(i + 1, j) + (1 - a) * b * at(i, j + 1) +
           a * b * at(i + 1, j + 1);
}

static void pitched_2d()
{
    const size_t w = 300, h = 37, hp = 320; // bytes per row, rows, host pitch
    std::vector<unsigned char> host(hp * h, 0xcd), back(w * h, 0), check(hp * h, 0);
    for (size_t y = 0; y < h; y++)
        for (size_t x = 0; x < w; x++)
            host[y * hp + x] = (unsigned char)(x * 3 + y * 7);
    void *d = nullptr, *d2 = nullptr;
    size_t pitch = 0, pitch2 = 0;
    CHECK(cudaMallocPitch(&d, &pitch, w, h));
    CHECK(cudaMallocPitch(&d2, &pitch2, w, h));
    if (pitch < w || pitch2 < w)
        fail("pitch %zu / %zu below the width %zu", pitch, pitch2, w);
    std::printf("cudaMallocPitch(%zu, %zu): pitch %zu\n", w, h, pitch);
    CHECK(cudaMemset2D(d, pitch, 0x7f, pitch, h));
    CHECK(cudaMemcpy2D(d, pitch, host.data(), hp, w, h, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2D(d2, pitch2, d, pitch, w, h, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy2D(back.data(), w, d2, pitch2, w, h, cudaMemcpyDeviceToHost));
    for (size_t y = 0; y < h; y++)
        if (std::memcmp(&back[y * w], &host[y * hp], w) != 0)
            fail("2D round trip differs in row %zu", y);
    // The padding of each row kept the memset value.
    std::vector<unsigned char> rows(pitch * h);
    CHECK(cudaMemcpy(rows.data(), d, pitch * h, cudaMemcpyDeviceToHost));
    for (size_t y = 0; y < h; y++)
        for (size_t x = w; x < pitch; x++)
            if (rows[y * pitch + x] != 0x7f)
                fail("padding byte (%zu, %zu) is %d after a 2D copy", x, y, rows[y * pitch + x]);
    // A memset of a block inside: 16 bytes from x = 8, rows 3..7.
    CHECK(cudaMemset2D((char *)d + 3 * pitch + 8, pitch, 0x11, 16, 5));
    CHECK(cudaMemcpy2D(check.data(), hp, d, pitch, w, h, cudaMemcpyDefault));
    for (size_t y = 0; y < h; y++)
        for (size_t x = 0; x < w; x++) {
            unsigned char want = (y >= 3 && y < 8 && x >= 8 && x < 24) ? 0x11 : host[y * hp + x];
            if (check[y * hp + x] != want)
                fail("after cudaMemset2D byte (%zu, %zu) is %d, expected %d", x, y, check[y * hp + x], want);
        }
    // Async copies from and to pinned memory on a stream, and host to host.
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    unsigned char *pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, hp * h));
    for (size_t i = 0; i < hp * h; i++)
        pinned[i] = (unsigned char)(i * 13);
    CHECK(cudaMemcpy2DAsync(d2, pitch2, pinned, hp, w, h, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemset2DAsync(d, pitch, 0, w, h, s));
    CHECK(cudaMemcpy2DAsync(d, pitch, d2, pitch2, w, h, cudaMemcpyDeviceToDevice, s));
    std::vector<unsigned char> pinned_back(w * h);
    unsigned char *pinned_out = nullptr;
    CHECK(cudaMallocHost(&pinned_out, w * h));
    CHECK(cudaMemcpy2DAsync(pinned_out, w, d, pitch, w, h, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (size_t y = 0; y < h; y++)
        if (std::memcmp(&pinned_out[y * w], &pinned[y * hp], w) != 0)
            fail("async 2D round trip through pinned memory differs in row %zu", y);
    CHECK(cudaMemcpy2D(pinned_back.data(), w, pinned, hp, w, h, cudaMemcpyHostToHost));
    for (size_t y = 0; y < h; y++)
        if (std::memcmp(&pinned_back[y * w], &pinned[y * hp], w) != 0)
            fail("host-to-host 2D copy differs in row %zu", y);
    // A width beyond a pitch.
    cudaError_t e = cudaMemcpy2D(d, pitch, host.data(), 10, 20, 2, cudaMemcpyHostToDevice);
    if (e != cudaErrorInvalidPitchValue && e != cudaErrorInvalidValue)
        fail("cudaMemcpy2D with width > spitch returned %s", cudaGetErrorName(e));
    std::printf("cudaMemcpy2D width > pitch: %s\n", cudaGetErrorName(e));
    e = cudaMemset2D(d, pitch, 0, pitch + 1, 2);
    if (e == cudaSuccess)
        fail("cudaMemset2D with width > pitch succeeded");
    std::printf("cudaMemset2D width > pitch: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFreeHost(pinned_out));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    CHECK(cudaFree(d2));
}

static void pitched_3d()
{
    const int w = 20, h = 6, dd = 5; // floats per row, rows, slices
    std::vector<float> host(w * h * dd), back(w * h * dd);
    for (int i = 0; i < w * h * dd; i++)
        host[i] = (float)i;
    cudaPitchedPtr p;
    CHECK(cudaMalloc3D(&p, make_cudaExtent(w * sizeof(float), h, dd)));
    if (p.pitch < w * sizeof(float) || p.xsize != w * sizeof(float) || p.ysize != (size_t)h)
        fail("cudaMalloc3D gave pitch %zu xsize %zu ysize %zu", p.pitch, p.xsize, p.ysize);
    CHECK(cudaMemset3D(p, 0xff, make_cudaExtent(w * sizeof(float), h, dd)));
    cudaMemcpy3DParms c = {};
    c.srcPtr = make_cudaPitchedPtr(host.data(), w * sizeof(float), w, h);
    c.dstPtr = p;
    c.extent = make_cudaExtent(w * sizeof(float), h, dd);
    c.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&c));
    // Zero floats x 2..4 of rows 2..4 of slices 1..2.
    cudaPitchedPtr q = p;
    q.ptr = (char *)p.ptr + 1 * p.pitch * h + 2 * p.pitch + 2 * sizeof(float);
    CHECK(cudaMemset3D(q, 0, make_cudaExtent(3 * sizeof(float), 3, 2)));
    std::vector<float> model = host;
    for (int z = 1; z < 3; z++)
        for (int y = 2; y < 5; y++)
            for (int x = 2; x < 5; x++)
                model[(z * h + y) * w + x] = 0;
    c = {};
    c.srcPtr = p;
    c.dstPtr = make_cudaPitchedPtr(back.data(), w * sizeof(float), w, h);
    c.extent = make_cudaExtent(w * sizeof(float), h, dd);
    c.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&c));
    for (int i = 0; i < w * h * dd; i++)
        if (back[i] != model[i])
            fail("3D element %d is %g, expected %g", i, back[i], model[i]);
    // A box with positions: 4 floats from x 3, rows 1..2, slices 2..3.
    float box[2][2][4];
    c = {};
    c.srcPtr = p;
    c.srcPos = make_cudaPos(3 * sizeof(float), 1, 2);
    c.dstPtr = make_cudaPitchedPtr(box, 4 * sizeof(float), 4, 2);
    c.extent = make_cudaExtent(4 * sizeof(float), 2, 2);
    c.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&c));
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 2; y++)
            for (int x = 0; x < 4; x++)
                if (box[z][y][x] != model[((z + 2) * h + y + 1) * w + x + 3])
                    fail("3D box element (%d, %d, %d) wrong", x, y, z);
    // Through a 3D array: pitched memory -> array -> host (extent in elements).
    cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
    cudaArray_t a;
    CHECK(cudaMalloc3DArray(&a, &f, make_cudaExtent(w, h, dd)));
    c = {};
    c.srcPtr = p;
    c.dstArray = a;
    c.extent = make_cudaExtent(w, h, dd);
    c.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaMemcpy3D(&c));
    std::fill(back.begin(), back.end(), -1.0f);
    c = {};
    c.srcArray = a;
    c.dstPtr = make_cudaPitchedPtr(back.data(), w * sizeof(float), w, h);
    c.extent = make_cudaExtent(w, h, dd);
    c.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3DAsync(&c, 0));
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < w * h * dd; i++)
        if (back[i] != model[i])
            fail("3D array element %d is %g, expected %g", i, back[i], model[i]);
    CHECK(cudaFreeArray(a));
    CHECK(cudaFree(p.ptr));
}

static void arrays_and_textures()
{
    const int w = 16, h = 8;
    std::vector<float> img(w * h), back(w * h);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            img[y * w + x] = field(x, y);
    cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
    cudaArray_t a, a2;
    CHECK(cudaMallocArray(&a, &f, w, h));
    CHECK(cudaMallocArray(&a2, &f, w, h));
    CHECK(cudaMemcpy2DToArray(a, 0, 0, img.data(), w * sizeof(float), w * sizeof(float), h,
                              cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DArrayToArray(a2, 0, 0, a, 0, 0, w * sizeof(float), h, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy2DFromArray(back.data(), w * sizeof(float), a2, 0, 0, w * sizeof(float), h,
                                cudaMemcpyDeviceToHost));
    if (back != img)
        fail("array round trip differs");
    // The deprecated linear array copies: from (x 3, row 2) on, across row ends.
    std::vector<float> lin(40);
    CHECK(cudaMemcpyFromArray(lin.data(), a, 3 * sizeof(float), 2, lin.size() * sizeof(float),
                              cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < lin.size(); i++)
        if (lin[i] != img[2 * w + 3 + i])
            fail("cudaMemcpyFromArray element %zu is %g, expected %g", i, lin[i], img[2 * w + 3 + i]);
    for (auto &v : lin)
        v = -v;
    CHECK(cudaMemcpyToArray(a2, 5 * sizeof(float), 1, lin.data(), lin.size() * sizeof(float),
                            cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DFromArray(back.data(), w * sizeof(float), a2, 0, 0, w * sizeof(float), h,
                                cudaMemcpyDeviceToHost));
    for (int i = 0; i < w * h; i++) {
        int k = i - (w + 5);
        float want = (k >= 0 && k < (int)lin.size()) ? lin[k] : img[i];
        if (back[i] != want)
            fail("after cudaMemcpyToArray element %d is %g, expected %g", i, back[i], want);
    }

    // Normalized coordinates, linear filtering, clamped addressing.
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = a;
    cudaTextureDesc td = {};
    td.addressMode[0] = cudaAddressModeClamp;
    td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModeLinear;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 1;
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    const int n = w * h;
    std::vector<float2> at(n);
    for (int i = 0; i < n; i++)
        at[i] = make_float2((i % w + 0.3f) / w, (i / w + 0.7f) / h);
    float2 *d_at;
    float *d_out;
    CHECK(cudaMalloc(&d_at, n * sizeof(float2)));
    CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    CHECK(cudaMemcpy(d_at, at.data(), n * sizeof(float2), cudaMemcpyHostToDevice));
    sample_2d<<<(n + 127) / 128, 128>>>(t, d_at, d_out, n);
    CHECK_LAUNCH();
    std::vector<float> got(n);
    CHECK(cudaMemcpy(got.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        double want = bilinear(img, w, h, at[i].x * w, at[i].y * h);
        if (std::fabs(got[i] - want) > 0.02)
            fail("linear sample %d at (%g, %g) is %g, expected %g", i, at[i].x, at[i].y, got[i], want);
    }
    // The object remembers what it was made with.
    cudaTextureDesc td_back;
    cudaResourceDesc res_back;
    CHECK(cudaGetTextureObjectTextureDesc(&td_back, t));
    CHECK(cudaGetTextureObjectResourceDesc(&res_back, t));
    if (td_back.filterMode != cudaFilterModeLinear || !td_back.normalizedCoords ||
        td_back.addressMode[0] != cudaAddressModeClamp || res_back.resType != cudaResourceTypeArray ||
        res_back.res.array.array != a)
        fail("texture object queries do not return the descriptors it was made with");
    CHECK(cudaDestroyTextureObject(t));

    // Pitch-2D memory, point sampling at texel centres.
    float *pm;
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&pm, &pitch, w * sizeof(float), h));
    CHECK(cudaMemcpy2D(pm, pitch, img.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
    res = {};
    res.resType = cudaResourceTypePitch2D;
    res.res.pitch2D.devPtr = pm;
    res.res.pitch2D.desc = f;
    res.res.pitch2D.width = w;
    res.res.pitch2D.height = h;
    res.res.pitch2D.pitchInBytes = pitch;
    td = {};
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    for (int i = 0; i < n; i++)
        at[i] = make_float2(i % w + 0.5f, i / w + 0.5f);
    CHECK(cudaMemcpy(d_at, at.data(), n * sizeof(float2), cudaMemcpyHostToDevice));
    sample_2d<<<(n + 127) / 128, 128>>>(t, d_at, d_out, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(got.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (got != img)
        fail("pitch-2D texture samples differ");
    CHECK(cudaDestroyTextureObject(t));

    // Linear memory, tex1Dfetch.
    res = {};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = pm;
    res.res.linear.desc = f;
    res.res.linear.sizeInBytes = w * sizeof(float);
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    fetch_1d<<<1, w>>>(t, d_out, w);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(got.data(), d_out, w * sizeof(float), cudaMemcpyDeviceToHost));
    for (int x = 0; x < w; x++)
        if (got[x] != img[x])
            fail("tex1Dfetch %d is %g, expected %g", x, got[x], img[x]);
    CHECK(cudaDestroyTextureObject(t));

    // uchar4 read as normalized floats; the channel descriptor round trip.
    cudaChannelFormatDesc u4 = cudaCreateChannelDesc<uchar4>();
    cudaArray_t ua;
    CHECK(cudaMallocArray(&ua, &u4, w, h));
    cudaChannelFormatDesc u4_back;
    CHECK(cudaGetChannelDesc(&u4_back, ua));
    if (u4_back.x != 8 || u4_back.y != 8 || u4_back.z != 8 || u4_back.w != 8 ||
        u4_back.f != cudaChannelFormatKindUnsigned)
        fail("cudaGetChannelDesc of a uchar4 array gave %d %d %d %d kind %d", u4_back.x, u4_back.y,
             u4_back.z, u4_back.w, (int)u4_back.f);
    cudaChannelFormatDesc f2 = cudaCreateChannelDesc<float2>();
    if (f2.x != 32 || f2.y != 32 || f2.z != 0 || f2.w != 0 || f2.f != cudaChannelFormatKindFloat)
        fail("cudaCreateChannelDesc<float2> is wrong");
    std::vector<uchar4> bytes(n);
    for (int i = 0; i < n; i++)
        bytes[i] = make_uchar4((unsigned char)i, (unsigned char)(255 - i), (unsigned char)(i * 3), 128);
    CHECK(cudaMemcpy2DToArray(ua, 0, 0, bytes.data(), w * 4, w * 4, h, cudaMemcpyHostToDevice));
    res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = ua;
    td = {};
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeNormalizedFloat;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    float4 *d_f4;
    CHECK(cudaMalloc(&d_f4, n * sizeof(float4)));
    sample_2d_uchar4<<<(n + 127) / 128, 128>>>(t, d_f4, w, h);
    CHECK_LAUNCH();
    std::vector<float4> f4(n);
    CHECK(cudaMemcpy(f4.data(), d_f4, n * sizeof(float4), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        const unsigned char *b = &bytes[i].x;
        const float *g = &f4[i].x;
        for (int c = 0; c < 4; c++)
            if (std::fabs(g[c] - b[c] / 255.0f) > 1e-6f)
                fail("normalized uchar4 texel %d channel %d is %g, expected %g", i, c, g[c], b[c] / 255.0f);
    }
    CHECK(cudaDestroyTextureObject(t));
    CHECK(cudaFree(d_f4));
    CHECK(cudaFreeArray(ua));

    // Errors: a copy beyond the array; a freed array.
    std::vector<float> tall(w * (h + 1));
    EXPECT_ERR(cudaMemcpy2DToArray(a2, 0, 0, tall.data(), w * sizeof(float), w * sizeof(float), h + 1,
                                   cudaMemcpyHostToDevice),
               cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK(cudaFreeArray(a2));
    cudaChannelFormatDesc gone_desc;
    cudaExtent ext;
    unsigned gone_flags;
    cudaError_t e = cudaArrayGetInfo(&gone_desc, &ext, &gone_flags, a2);
    if (e == cudaSuccess)
        fail("cudaArrayGetInfo of a freed array succeeded");
    std::printf("cudaArrayGetInfo of a freed array: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    CHECK(cudaFree(pm));
    CHECK(cudaFree(d_at));
    CHECK(cudaFree(d_out));
    CHECK(cudaFreeArray(a));
}

static void surfaces_layers_mipmaps()
{
    // A surface write kernel fills an array; read it back.
    const int w = 32, h = 16;
    cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
    cudaArray_t a;
    CHECK(cudaMallocArray(&a, &f, w, h, cudaArraySurfaceLoadStore));
    unsigned flags = 0;
    cudaExtent ext;
    cudaChannelFormatDesc got_desc;
    CHECK(cudaArrayGetInfo(&got_desc, &ext, &flags, a));
    if (got_desc.x != 32 || got_desc.f != cudaChannelFormatKindFloat)
        fail("cudaArrayGetInfo: format %d bits kind %d", got_desc.x, (int)got_desc.f);
    if (!(flags & cudaArraySurfaceLoadStore) || ext.width != (size_t)w || ext.height != (size_t)h)
        fail("cudaArrayGetInfo: flags %u extent %zux%zu", flags, ext.width, ext.height);
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = a;
    cudaSurfaceObject_t s;
    CHECK(cudaCreateSurfaceObject(&s, &res));
    surface_write<<<dim3(1, h), w>>>(s, w, h);
    CHECK_LAUNCH();
    std::vector<float> back(w * h);
    CHECK(cudaMemcpy2DFromArray(back.data(), w * sizeof(float), a, 0, 0, w * sizeof(float), h,
                                cudaMemcpyDeviceToHost));
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            if (back[y * w + x] != float(x * 100 + y))
                fail("surface texel (%d, %d) is %g", x, y, back[y * w + x]);
    cudaResourceDesc res_back;
    CHECK(cudaGetSurfaceObjectResourceDesc(&res_back, s));
    if (res_back.resType != cudaResourceTypeArray || res_back.res.array.array != a)
        fail("cudaGetSurfaceObjectResourceDesc differs");
    CHECK(cudaDestroySurfaceObject(s));
    CHECK(cudaFreeArray(a));

    // A layered array: 3 layers of 8 x 8, each its own values, sampled per layer.
    const int lw = 8, lh = 8, layers = 3, n = lw * lh * layers;
    cudaArray_t la;
    CHECK(cudaMalloc3DArray(&la, &f, make_cudaExtent(lw, lh, layers), cudaArrayLayered));
    std::vector<float> vals(n), got(n);
    for (int i = 0; i < n; i++)
        vals[i] = i * 1.5f - 7;
    cudaMemcpy3DParms c = {};
    c.srcPtr = make_cudaPitchedPtr(vals.data(), lw * sizeof(float), lw, lh);
    c.dstArray = la;
    c.extent = make_cudaExtent(lw, lh, layers);
    c.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&c));
    res.res.array.array = la;
    cudaTextureDesc td = {};
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    float *d_out;
    CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    sample_layered<<<(n + 63) / 64, 64>>>(t, d_out, lw, lh, layers);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(got.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (got != vals)
        fail("layered texture samples differ");
    CHECK(cudaDestroyTextureObject(t));
    CHECK(cudaFree(d_out));
    CHECK(cudaFreeArray(la));

    // A mipmapped array: level sizes, and a copy into and out of level 1.
    cudaMipmappedArray_t m;
    CHECK(cudaMallocMipmappedArray(&m, &f, make_cudaExtent(32, 32, 0), 4));
    for (unsigned l = 0; l < 4; l++) {
        cudaArray_t level;
        CHECK(cudaGetMipmappedArrayLevel(&level, m, l));
        CHECK(cudaArrayGetInfo(&got_desc, &ext, &flags, level));
        if (ext.width != (32u >> l) || ext.height != (32u >> l))
            fail("mipmap level %u is %zux%zu", l, ext.width, ext.height);
    }
    cudaArray_t l1;
    CHECK(cudaGetMipmappedArrayLevel(&l1, m, 1));
    std::vector<float> lv(16 * 16), lb(16 * 16);
    for (int i = 0; i < 256; i++)
        lv[i] = i * 0.25f;
    CHECK(cudaMemcpy2DToArray(l1, 0, 0, lv.data(), 64, 64, 16, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DFromArray(lb.data(), 64, l1, 0, 0, 64, 16, cudaMemcpyDeviceToHost));
    if (lb != lv)
        fail("mipmap level 1 round trip differs");
    CHECK(cudaFreeMipmappedArray(m));
}

int main()
{
    require_device();
    pitched_2d();
    pitched_3d();
    arrays_and_textures();
    surfaces_layers_mipmaps();
    CHECK(cudaDeviceSynchronize());
    return pass();
}

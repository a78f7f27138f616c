// SPDX-License-Identifier: Apache-2.0 OR MIT
// The texture and surface object values a restore relies on. A program holds the driver's own
// values of its texture and surface objects, so a saved state's objects must get the same values
// when a fresh process makes them again (vhost-cuda makes them in ascending order of their old
// values, holding any lower value the driver hands out in a filler object and destroying the
// fillers at the end; docs/ARCHITECTURE.md). This program checks that on the driver it runs on:
// phase 1 makes objects over an array, pitched and linear memory with some destroyed in between
// (so freed values lie below live ones), prints the values and execs itself; phase 2, a fresh
// process with a fresh context, makes the same resources and replays the objects as a restore
// does, requires every old value back, and reads through each object by its old value in a
// kernel. It prints every value either way, so a failure shows the driver's numbering.
#define TEST_NAME "texture_object_values"
#include "selfcheck.cuh"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

constexpr int W = 16, H = 8;

__global__ void read_tex(cudaTextureObject_t t, float *out, int w, int h)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h)
        out[i] = tex2D<float>(t, i % w + 0.5f, i / w + 0.5f);
}

__global__ void fetch_linear(cudaTextureObject_t t, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = tex1Dfetch<float>(t, i);
}

__global__ void read_surf(cudaSurfaceObject_t s, float *out, int w, int h)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h)
        out[i] = surf2Dread<float>(s, (i % w) * sizeof(float), i / w);
}

// The resources every phase makes the same way: an array (surface load/store), pitched memory
// and linear memory, each filled with its own pattern.
struct Resources {
    cudaArray_t array;
    float *pitched;
    size_t pitch;
    float *linear;
    std::vector<float> data;
};

static Resources make_resources()
{
    Resources r{};
    r.data.resize(W * H);
    for (int i = 0; i < W * H; i++)
        r.data[i] = float(i) * 0.5f + 1.0f;
    cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
    CHECK(cudaMallocArray(&r.array, &f, W, H, cudaArraySurfaceLoadStore));
    CHECK(cudaMemcpy2DToArray(r.array, 0, 0, r.data.data(), W * sizeof(float), W * sizeof(float),
                              H, cudaMemcpyHostToDevice));
    CHECK(cudaMallocPitch((void **)&r.pitched, &r.pitch, W * sizeof(float), H));
    CHECK(cudaMemcpy2D(r.pitched, r.pitch, r.data.data(), W * sizeof(float), W * sizeof(float), H,
                       cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&r.linear, W * H * sizeof(float)));
    CHECK(cudaMemcpy(r.linear, r.data.data(), W * H * sizeof(float), cudaMemcpyHostToDevice));
    return r;
}

// Object kinds: 'a' texture over the array, 'p' texture over pitched memory, 'l' texture over
// linear memory, 's' surface over the array.
static unsigned long long make(char kind, const Resources &r)
{
    if (kind == 's') {
        cudaResourceDesc res{};
        res.resType = cudaResourceTypeArray;
        res.res.array.array = r.array;
        cudaSurfaceObject_t s = 0;
        CHECK(cudaCreateSurfaceObject(&s, &res));
        return s;
    }
    cudaResourceDesc res{};
    cudaTextureDesc td{};
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    switch (kind) {
    case 'a':
        res.resType = cudaResourceTypeArray;
        res.res.array.array = r.array;
        break;
    case 'p':
        res.resType = cudaResourceTypePitch2D;
        res.res.pitch2D.devPtr = r.pitched;
        res.res.pitch2D.desc = cudaCreateChannelDesc<float>();
        res.res.pitch2D.width = W;
        res.res.pitch2D.height = H;
        res.res.pitch2D.pitchInBytes = r.pitch;
        break;
    default:
        res.resType = cudaResourceTypeLinear;
        res.res.linear.devPtr = r.linear;
        res.res.linear.desc = cudaCreateChannelDesc<float>();
        res.res.linear.sizeInBytes = W * H * sizeof(float);
        break;
    }
    cudaTextureObject_t t = 0;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    return t;
}

static void destroy(char kind, unsigned long long v)
{
    if (kind == 's')
        CHECK(cudaDestroySurfaceObject(v));
    else
        CHECK(cudaDestroyTextureObject(v));
}

// Reads every element through object `v` of `kind` and compares it with the pattern.
static void check_reads(char kind, unsigned long long v, const Resources &r)
{
    float *out = nullptr;
    CHECK(cudaMalloc(&out, W * H * sizeof(float)));
    CHECK(cudaMemset(out, 0, W * H * sizeof(float)));
    switch (kind) {
    case 's': read_surf<<<1, W * H>>>(v, out, W, H); break;
    case 'l': fetch_linear<<<1, W * H>>>(v, out, W * H); break;
    default: read_tex<<<1, W * H>>>(v, out, W, H); break;
    }
    CHECK_LAUNCH();
    std::vector<float> got(W * H);
    CHECK(cudaMemcpy(got.data(), out, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(out));
    for (int i = 0; i < W * H; i++)
        if (got[i] != r.data[i])
            fail("object %c %#llx reads %g at %d, want %g", kind, v, got[i], i, r.data[i]);
}

int main(int argc, char **argv)
{
    int devices = require_device();
    if (argc < 2 && devices >= 2) {
        // Informational: whether object values are numbered per device (context) or for the
        // whole process. vhost-cuda keeps a session's objects by value alone.
        CHECK(cudaSetDevice(1));
        Resources r1 = make_resources();
        unsigned long long v1 = make('a', r1);
        std::printf("device 1's first texture object: %#llx\n", v1);
        destroy('a', v1);
        CHECK(cudaFreeArray(r1.array));
        CHECK(cudaFree(r1.pitched));
        CHECK(cudaFree(r1.linear));
    }
    CHECK(cudaSetDevice(0));
    Resources r = make_resources();
    if (argc < 2) {
        // Phase 1: a history with frees in between.
        unsigned long long a0 = make('a', r), p0 = make('p', r), s0 = make('s', r);
        unsigned long long a1 = make('a', r), l0 = make('l', r);
        destroy('a', a0);
        destroy('a', a1);
        unsigned long long l1 = make('l', r), a2 = make('a', r);
        std::printf("phase 1: a0=%#llx p0=%#llx s0=%#llx a1=%#llx l0=%#llx (a0, a1 destroyed) "
                    "l1=%#llx a2=%#llx\n",
                    a0, p0, s0, a1, l0, l1, a2);
        const char kinds[] = {'p', 's', 'l', 'l', 'a'};
        unsigned long long live[] = {p0, s0, l0, l1, a2};
        for (int i = 0; i < 5; i++)
            check_reads(kinds[i], live[i], r);
        std::vector<std::string> args{argv[0]};
        for (int i = 0; i < 5; i++) {
            char b[64];
            std::snprintf(b, sizeof b, "%c:%llu", kinds[i], live[i]);
            args.emplace_back(b);
        }
        std::vector<char *> av;
        for (auto &s : args)
            av.push_back(s.data());
        av.push_back(nullptr);
        std::fflush(stdout);
        execv("/proc/self/exe", av.data());
        fail("exec of phase 2: %s", std::strerror(errno));
    }
    // Phase 2: a fresh process makes the objects again in ascending order of their old values.
    struct Want {
        char kind;
        unsigned long long value;
    };
    std::vector<Want> want;
    for (int i = 1; i < argc; i++)
        want.push_back({argv[i][0], std::strtoull(argv[i] + 2, nullptr, 10)});
    std::vector<Want> sorted = want;
    std::sort(sorted.begin(), sorted.end(), [](auto &x, auto &y) { return x.value < y.value; });
    std::vector<Want> fillers;
    for (auto &w : sorted) {
        for (;;) {
            unsigned long long got = make(w.kind, r);
            if (got == w.value)
                break;
            if (got < w.value && fillers.size() < 4096) {
                fillers.push_back({w.kind, got});
                continue;
            }
            fail("object %c wanted %#llx, the driver gave %#llx (%zu filler(s) so far): a restore "
                 "would fail on this driver",
                 w.kind, w.value, got, fillers.size());
        }
    }
    for (auto &f : fillers)
        destroy(f.kind, f.value);
    std::printf("phase 2: every value back (%zu filler(s))\n", fillers.size());
    for (auto &w : want)
        check_reads(w.kind, w.value, r);
    return pass();
}

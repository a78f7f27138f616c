// SPDX-License-Identifier: Apache-2.0 OR MIT
// Templated kernels instantiated for int, float and double, and functor templates passed to a
// kernel by value. Each instantiation is a separately mangled kernel in the fatbin, and the
// functors are by-value struct parameters of different sizes and alignments placed after a
// 1-byte parameter, so this checks symbol lookup and the parameter layout end to end.
#define TEST_NAME "templates"
#include "selfcheck.cuh"

#include <vector>

template <typename T> struct Scale {
    T factor;
    __host__ __device__ T operator()(T x) const { return x * factor; }
};

template <typename T> struct Affine {
    T mul;
    T add;
    __host__ __device__ T operator()(T x) const { return x * mul + add; }
};

// out[i] = f(in[i]) + tag: `tag` (1 byte) sits between pointer-sized parameters and the functor.
template <typename T, typename F>
__global__ void transform(const T *in, T *out, int n, char tag, F f)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = f(in[i]) + (T)tag;
}

// A non-type template parameter: each thread handles ITEMS consecutive elements.
template <typename T, int ITEMS> __global__ void fill_iota(T *out, int n, T start)
{
    int base = (blockIdx.x * blockDim.x + threadIdx.x) * ITEMS;
    for (int j = 0; j < ITEMS; j++)
        if (base + j < n)
            out[base + j] = start + (T)(base + j);
}

template <typename T> static const char *type_name();
template <> const char *type_name<int>() { return "int"; }
template <> const char *type_name<float>() { return "float"; }
template <> const char *type_name<double>() { return "double"; }

template <typename T> static bool same(T a, T b) { return a == b; }

template <typename T, typename F> static void check_transform(const char *what, F f)
{
    const int n = 10007;
    std::vector<T> in(n), out(n);
    for (int i = 0; i < n; i++)
        in[i] = (T)(i % 101) - (T)50;
    T *din, *dout;
    CHECK(cudaMalloc(&din, n * sizeof(T)));
    CHECK(cudaMalloc(&dout, n * sizeof(T)));
    CHECK(cudaMemcpy(din, in.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    const char tag = 3;
    transform<T, F><<<(n + 127) / 128, 128>>>(din, dout, n, tag, f);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), dout, n * sizeof(T), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        // Small integers times small integers: exact in every type, so compare exactly.
        T want = f(in[i]) + (T)tag;
        if (!same(out[i], want))
            fail("transform<%s, %s>: out[%d] = %g, expected %g", type_name<T>(), what, i,
                 (double)out[i], (double)want);
    }
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    std::printf("templates: transform<%s, %s> ok\n", type_name<T>(), what);
}

template <typename T, int ITEMS> static void check_iota()
{
    const int n = 5000;
    std::vector<T> out(n);
    T *d;
    CHECK(cudaMalloc(&d, n * sizeof(T)));
    int threads = 64;
    int blocks = (n + threads * ITEMS - 1) / (threads * ITEMS);
    fill_iota<T, ITEMS><<<blocks, threads>>>(d, n, (T)-7);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        if (!same(out[i], (T)-7 + (T)i))
            fail("fill_iota<%s, %d>: out[%d] = %g, expected %g", type_name<T>(), ITEMS, i,
                 (double)out[i], (double)((T)-7 + (T)i));
    CHECK(cudaFree(d));
    std::printf("templates: fill_iota<%s, %d> ok\n", type_name<T>(), ITEMS);
}

int main()
{
    require_device();
    check_transform<int>("Scale<int>", Scale<int>{3});
    check_transform<float>("Scale<float>", Scale<float>{-2.0f});
    check_transform<double>("Scale<double>", Scale<double>{0.5});
    check_transform<int>("Affine<int>", Affine<int>{-4, 9});
    check_transform<float>("Affine<float>", Affine<float>{1.5f, -0.25f});
    check_transform<double>("Affine<double>", Affine<double>{2.0, 1e6});
    check_iota<int, 1>();
    check_iota<float, 4>();
    check_iota<double, 3>();
    return pass();
}
